//! `privmatch iris audit [--quarantine]`: which enrolled entries' copies diverge between the
//! parties, and their repair.
//!
//! Every party lists its entries with their enrolment ids (`iris_audit()`, core's
//! `iris::binding`); an entry whose three copies do not carry the same id was deleted at one
//! party only, or stored there under another enrolment (a share the coordinator's role
//! replaced). The party that differs from the other two (the majority) is named; the search
//! fails with the same name ([`crate::iris::driver::SetMismatch`]) until the entry is repaired.
//! With `--quarantine` the coordinator deletes each diverging entry at all three parties in
//! one distributed transaction ([`Quarantine`]): the subject must enrol again. (A share
//! cannot be rebuilt without its owner's template; deleting everywhere is the repair.)
//!
//! `POST /v1/iris/audit` [`AuditBody`] → [`AuditResponse`] (scope admin).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use clap::Args;
use futures::future::join_all;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::party::PartyIndex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cli::http::Coordinator;
use crate::config::Config;
use crate::iris::driver::odd_one_out;
use crate::iris::work::Quarantine;
use crate::parties::{column, PartyError};
use crate::server::error::{bad_request, error_with, parse_json, party_failure_error, ApiError};
use crate::server::state::SharedState;

/// The body of `POST /v1/iris/audit`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditBody {
    /// Delete every diverging entry at all three parties (one distributed transaction each).
    #[serde(default)]
    pub quarantine: bool,
}

/// One entry whose copies diverge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DivergingEntry {
    /// Subject id.
    pub subject: String,
    /// `"left"` or `"right"`.
    pub eye: String,
    /// Each party's enrolment id of it (hex), null where the party does not hold it.
    pub enrolment: [Option<String>; 3],
    /// The parties whose copy differs from the majority's (all three when no two agree).
    pub diverging: Vec<u8>,
}

/// The answer to `POST /v1/iris/audit`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AuditResponse {
    /// Entries held by at least one party.
    pub entries: usize,
    /// Entries whose three copies carry the same enrolment id.
    pub agreeing: usize,
    /// Per party, SHA-256 over its sorted (eye, subject, enrolment id) list (hex): equal
    /// digests, equal sets.
    pub digests: [String; 3],
    /// The entries whose copies diverge, sorted by eye and subject.
    pub diverging: Vec<DivergingEntry>,
    /// With `quarantine`: the diverging entries deleted at all three parties.
    #[serde(default)]
    pub quarantined: usize,
}

/// One party's list: (eye, subject) → enrolment id.
type PartyList = BTreeMap<(String, String), Vec<u8>>;

/// Compares the three parties' lists (pure: the server's and the tests' logic).
pub fn compare(lists: &[PartyList; 3]) -> AuditResponse {
    let keys: BTreeSet<&(String, String)> = lists.iter().flat_map(|l| l.keys()).collect();
    let mut diverging = Vec::new();
    for key in &keys {
        let ids = [lists[0].get(*key), lists[1].get(*key), lists[2].get(*key)];
        if ids[0].is_some() && ids[0] == ids[1] && ids[1] == ids[2] {
            continue;
        }
        let parties: Vec<u8> = match odd_one_out([&ids[0], &ids[1], &ids[2]]) {
            Some(p) => vec![p.as_u8()],
            None => vec![0, 1, 2],
        };
        diverging.push(DivergingEntry {
            subject: key.1.clone(),
            eye: key.0.clone(),
            enrolment: ids.map(|id| id.map(hex::encode)),
            diverging: parties,
        });
    }
    let digest = |list: &PartyList| {
        let mut h = Sha256::new();
        h.update(b"privmatch iris audit v1");
        for ((eye, subject), id) in list {
            h.update((eye.len() as u64).to_le_bytes());
            h.update(eye.as_bytes());
            h.update((subject.len() as u64).to_le_bytes());
            h.update(subject.as_bytes());
            h.update(id);
        }
        hex::encode(h.finalize())
    };
    AuditResponse {
        entries: keys.len(),
        agreeing: keys.len() - diverging.len(),
        digests: [digest(&lists[0]), digest(&lists[1]), digest(&lists[2])],
        diverging,
        quarantined: 0,
    }
}

fn party_failure(what: &str, e: &PartyError) -> ApiError {
    party_failure_error(format!("{what}: {e}"), e)
}

/// `POST /v1/iris/audit`.
pub async fn audit(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<AuditResponse>, ApiError> {
    let request: AuditBody = if body.is_empty() {
        AuditBody::default()
    } else {
        parse_json(&body)?
    };
    let answers = join_all(state.parties.all().iter().map(|p| async move {
        let rows = p
            .query(
                "SELECT subject, eye, enrolment_id FROM privmatch.iris_audit()",
                &[],
            )
            .await?;
        let mut list = PartyList::new();
        for row in &rows {
            let subject: String = column(p.index, row, 0)?.unwrap_or_default();
            let eye: String = column(p.index, row, 1)?.unwrap_or_default();
            let id: Vec<u8> = column(p.index, row, 2)?.unwrap_or_default();
            list.insert((eye, subject), id);
        }
        let prepared: i64 = column(
            p.index,
            &p.query_one(
                "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'privmatch:%'",
                &[],
            )
            .await?,
            0,
        )?
        .unwrap_or(0);
        Ok::<_, PartyError>((list, prepared))
    }))
    .await;
    let mut lists: [PartyList; 3] = Default::default();
    let mut prepared = 0;
    for (slot, answer) in lists.iter_mut().zip(answers) {
        let (list, n) = answer.map_err(|e| party_failure("reading the iris entries", &e))?;
        *slot = list;
        prepared += n;
    }
    let mut report = compare(&lists);
    tracing::info!(
        entries = report.entries,
        diverging = report.diverging.len(),
        "iris audit"
    );
    if request.quarantine && !report.diverging.is_empty() {
        // An entry in a transaction that is committed at some parties and not yet at others
        // diverges for a moment: never quarantine while one is prepared.
        if prepared > 0 {
            return Err(error_with(
                privmatch_api::ErrorCode::InDoubt,
                format!("{prepared} distributed transaction(s) are prepared at the parties: run `privmatch recover` first, then audit again; nothing was quarantined"),
            ));
        }
        for entry in &report.diverging {
            let eye = Eye::parse(&entry.eye).map_err(|e| bad_request(e.to_string()))?;
            let work = Quarantine {
                subject: entry.subject.clone(),
                eye,
            };
            state.txns.run(&work).await?;
            tracing::warn!(
                subject = %entry.subject,
                eye = %entry.eye,
                diverging = ?entry.diverging,
                "iris entry quarantined: deleted at every party"
            );
            report.quarantined += 1;
        }
    }
    Ok(Json(report))
}

/// Options of `privmatch iris audit`.
#[derive(Args, Clone, Debug)]
pub struct AuditArgs {
    /// Delete every diverging entry at all three parties (each in one distributed
    /// transaction); its subject must enrol again.
    #[arg(long)]
    pub quarantine: bool,
    /// Print the answer as one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn party_list(parties: &[u8]) -> String {
    parties
        .iter()
        .map(|p| PartyIndex::ALL[usize::from(*p).min(2)].to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `privmatch iris audit`: fails (after printing) when entries diverge and were not
/// quarantined.
pub async fn run(config: &Config, args: &AuditArgs) -> Result<()> {
    let body = AuditBody {
        quarantine: args.quarantine,
    };
    let report: AuditResponse = Coordinator::new(config)
        .post("/v1/iris/audit", &body)
        .await?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for (i, d) in report.digests.iter().enumerate() {
            println!("P{i}: set digest {d}");
        }
        for e in &report.diverging {
            let ids: Vec<String> = e
                .enrolment
                .iter()
                .enumerate()
                .map(|(i, id)| match id {
                    Some(id) => format!("P{i} {}", &id[..16.min(id.len())]),
                    None => format!("P{i} missing"),
                })
                .collect();
            println!(
                "diverging: {:?} ({} eye) at {} [{}]",
                e.subject,
                e.eye,
                party_list(&e.diverging),
                ids.join(", ")
            );
        }
        println!(
            "{} entries, {} agree at all three parties, {} diverge{}",
            report.entries,
            report.agreeing,
            report.diverging.len(),
            if args.quarantine {
                format!(
                    ", {} quarantined (deleted at every party)",
                    report.quarantined
                )
            } else {
                String::new()
            }
        );
    }
    if !report.diverging.is_empty() && report.quarantined < report.diverging.len() {
        bail!(
            "{} iris entries diverge between the parties: `privmatch iris audit --quarantine` deletes them at every party",
            report.diverging.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[(&str, &str, u8)]) -> PartyList {
        entries
            .iter()
            .map(|(s, e, id)| (((*e).to_owned(), (*s).to_owned()), vec![*id; 32]))
            .collect()
    }

    #[test]
    fn the_party_whose_copy_differs_from_the_majority_is_named() {
        let honest = list(&[
            ("alice", "left", 1),
            ("bob", "left", 2),
            ("victim", "left", 3),
        ]);
        let replaced = list(&[
            ("alice", "left", 1),
            ("bob", "left", 2),
            ("victim", "left", 9),
        ]);
        let deleted = list(&[("alice", "left", 1), ("bob", "left", 2)]);
        let same = compare(&[honest.clone(), honest.clone(), honest.clone()]);
        assert!(same.diverging.is_empty());
        assert_eq!(same.agreeing, 3);
        assert!(same.digests.iter().all(|d| d == &same.digests[0]));
        let swap = compare(&[honest.clone(), honest.clone(), replaced]);
        assert_eq!(swap.diverging.len(), 1);
        assert_eq!(swap.diverging[0].subject, "victim");
        assert_eq!(swap.diverging[0].diverging, vec![2]);
        assert_ne!(swap.digests[2], swap.digests[0]);
        let gone = compare(&[honest.clone(), deleted, honest.clone()]);
        assert_eq!(gone.diverging[0].diverging, vec![1]);
        assert_eq!(gone.diverging[0].enrolment[1], None);
        // Enrolled at one party only: the other two agree that it is absent.
        let extra = list(&[
            ("alice", "left", 1),
            ("bob", "left", 2),
            ("victim", "left", 3),
            ("x", "right", 4),
        ]);
        let one = compare(&[honest.clone(), honest, extra]);
        assert_eq!(one.diverging[0].subject, "x");
        assert_eq!(one.diverging[0].diverging, vec![2]);
        assert_eq!(one.entries, 4);
    }
}
