//! Distributed transactions across the three parties (two-phase commit with
//! `PREPARE TRANSACTION` / `COMMIT PREPARED`) and the recovery of transactions a crash left in
//! doubt. The commit rule and gid format live in `privmatch_core::twophase`; this module does
//! the I/O.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use privmatch_core::party::PartyIndex;
use privmatch_core::twophase::{gid_instance, make_gid, resolve, DecisionRecord, Resolution};
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::parties::{Parties, PartyError};

/// Faults the end-to-end tests inject (environment variable `PRIVMATCH_FAULT`); never set in
/// production. `crash-after-prepare` and `crash-after-decision` abort the process at that
/// point; `pause-after-prepare=FILE` creates FILE once all parties are prepared and waits until
/// it is removed.
#[derive(Clone, Debug, Default)]
pub enum Fault {
    /// No fault.
    #[default]
    None,
    /// Abort once every party has prepared.
    CrashAfterPrepare,
    /// Abort once P0 has committed (the decision), before the others.
    CrashAfterDecision,
    /// Pause once every party has prepared.
    PauseAfterPrepare(PathBuf),
}

impl Fault {
    /// Reads `PRIVMATCH_FAULT`.
    pub fn from_env() -> Self {
        match std::env::var("PRIVMATCH_FAULT").ok().as_deref() {
            Some("crash-after-prepare") => Fault::CrashAfterPrepare,
            Some("crash-after-decision") => Fault::CrashAfterDecision,
            Some(other) => match other.strip_prefix("pause-after-prepare=") {
                Some(path) => Fault::PauseAfterPrepare(PathBuf::from(path)),
                None => Fault::None,
            },
            None => Fault::None,
        }
    }
}

/// The work a distributed transaction does at one party, between BEGIN and PREPARE.
#[derive(Clone, Debug)]
pub enum PartyWork {
    /// Open and store sealed iris enrolment bundles (this party's bundles, in record order).
    IrisEnrol {
        /// Sealed bundles addressed to this party.
        bundles: Vec<Vec<u8>>,
        /// `"skip"` or `"error"`.
        on_duplicate: String,
    },
    /// Delete a subject's iris templates.
    IrisDelete {
        /// The subject.
        subject: String,
        /// One eye, or both.
        eye: Option<String>,
    },
}

/// What the work returned at one party. The three parties must agree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum WorkResult {
    /// Per record: subject, eye, whether it was newly enrolled.
    Enrolled(Vec<(String, String, bool)>),
    /// Number of records deleted.
    Deleted(i64),
}

/// Why a distributed transaction did not commit, or committed only partly so far.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// A party failed before the decision: rolled back everywhere, nothing written.
    #[error("aborted, nothing written at any party: {0}")]
    Aborted(PartyError),
    /// The parties returned different results: rolled back everywhere.
    #[error("aborted, nothing written at any party: the parties disagree ({0})")]
    Disagreement(String),
    /// P0's commit failed in a way that leaves the outcome to recovery.
    #[error("outcome unknown until recovery runs: {0}")]
    InDoubt(PartyError),
}

/// Runs distributed transactions and recovers in-doubt ones.
pub struct TwoPhase {
    parties: Arc<Parties>,
    instance: String,
    sequence: AtomicU64,
    in_flight: Mutex<HashSet<String>>,
    fault: Fault,
}

/// What one recovery pass did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecoveryReport {
    /// Transactions committed at the parties where they were still prepared.
    pub committed: Vec<String>,
    /// Transactions rolled back.
    pub rolled_back: Vec<String>,
    /// Problems (e.g. a party still unreachable); recovery will retry.
    pub errors: Vec<String>,
}

async fn execute_work(
    party: PartyIndex,
    client: &Client,
    work: &PartyWork,
) -> Result<WorkResult, PartyError> {
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(party, &e);
    match work {
        PartyWork::IrisEnrol {
            bundles,
            on_duplicate,
        } => {
            let refs: Vec<&[u8]> = bundles.iter().map(Vec::as_slice).collect();
            let rows = client
                .query(
                    "SELECT subject, eye, enrolled FROM privmatch.iris_enroll_sealed($1, $2)",
                    &[&refs, on_duplicate],
                )
                .await
                .map_err(pg)?;
            Ok(WorkResult::Enrolled(
                rows.iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect(),
            ))
        }
        PartyWork::IrisDelete { subject, eye } => {
            let row = client
                .query_one("SELECT privmatch.iris_delete($1, $2)", &[subject, eye])
                .await
                .map_err(pg)?;
            Ok(WorkResult::Deleted(row.get(0)))
        }
    }
}

/// Phase one at one party: BEGIN, marker, work, PREPARE. On failure the local transaction is
/// rolled back (or dies with the connection).
async fn prepare_at(
    party: PartyIndex,
    client: &Client,
    gid: &str,
    work: &PartyWork,
) -> Result<WorkResult, PartyError> {
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(party, &e);
    client.batch_execute("BEGIN").await.map_err(pg)?;
    let outcome = async {
        client
            .execute(
                "INSERT INTO privmatch.distributed_transactions (gid) VALUES ($1)",
                &[&gid],
            )
            .await
            .map_err(pg)?;
        let result = execute_work(party, client, work).await?;
        Ok::<_, PartyError>(result)
    }
    .await;
    match outcome {
        Ok(result) => {
            client
                .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
                .await
                .map_err(pg)?;
            Ok(result)
        }
        Err(err) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(err)
        }
    }
}

async fn finish_prepared(
    client: &Client,
    gid: &str,
    resolution: Resolution,
) -> Result<(), tokio_postgres::Error> {
    let verb = match resolution {
        Resolution::Commit => "COMMIT",
        Resolution::Rollback => "ROLLBACK",
    };
    client
        .batch_execute(&format!("{verb} PREPARED '{gid}'"))
        .await
}

impl TwoPhase {
    /// A transaction manager for `parties`; `instance` is a fresh random id of this process.
    pub fn new(parties: Arc<Parties>, instance: String, fault: Fault) -> Self {
        TwoPhase {
            parties,
            instance,
            sequence: AtomicU64::new(0),
            in_flight: Mutex::new(HashSet::new()),
            fault,
        }
    }

    /// Runs `work` (one entry per party) as one atomic distributed transaction. On success the
    /// result is what all three parties agreed on; `pending` lists parties whose commit must
    /// still be completed by recovery (the decision is already durable at P0).
    pub async fn run(
        &self,
        work: [PartyWork; 3],
    ) -> Result<(WorkResult, Vec<PartyError>), TxnError> {
        let gid = make_gid(&self.instance, self.sequence.fetch_add(1, Ordering::SeqCst));
        self.in_flight.lock().await.insert(gid.clone());
        let outcome = self.run_gid(&gid, work).await;
        self.in_flight.lock().await.remove(&gid);
        outcome
    }

    async fn run_gid(
        &self,
        gid: &str,
        work: [PartyWork; 3],
    ) -> Result<(WorkResult, Vec<PartyError>), TxnError> {
        let clients = join_all(self.parties.all().iter().map(|p| p.connect())).await;
        let mut connected = Vec::new();
        let mut first_error = None;
        for client in clients {
            match client {
                Ok(c) => connected.push(c),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        if let Some(err) = first_error {
            return Err(TxnError::Aborted(err));
        }
        let prepared = join_all(
            PartyIndex::ALL
                .iter()
                .zip(connected.iter())
                .zip(work.iter())
                .map(|((&p, c), w)| prepare_at(p, c, gid, w)),
        )
        .await;
        let failure = prepared.iter().find_map(|r| r.as_ref().err().cloned());
        let results: Vec<WorkResult> = prepared
            .iter()
            .filter_map(|r| r.as_ref().ok().cloned())
            .collect();
        let disagreement = results.windows(2).any(|w| w[0] != w[1]);
        if failure.is_some() || disagreement {
            // Roll back wherever it did prepare; elsewhere it was already rolled back.
            join_all(
                prepared
                    .iter()
                    .zip(connected.iter())
                    .filter(|(r, _)| r.is_ok())
                    .map(|(_, c)| finish_prepared(c, gid, Resolution::Rollback)),
            )
            .await;
            self.return_clients(connected).await;
            return Err(match failure {
                Some(err) => TxnError::Aborted(err),
                None => TxnError::Disagreement(format!("{results:?}").chars().take(300).collect()),
            });
        }
        self.inject_after_prepare().await;
        // The decision: commit at P0 first.
        if let Err(e) = finish_prepared(&connected[0], gid, Resolution::Commit).await {
            let err = PartyError::from_pg(PartyIndex::ALL[0], &e);
            return Err(TxnError::InDoubt(err));
        }
        if matches!(self.fault, Fault::CrashAfterDecision) {
            eprintln!("privmatch: injected fault crash-after-decision ({gid})");
            std::process::abort();
        }
        let rest = join_all(
            connected[1..]
                .iter()
                .map(|c| finish_prepared(c, gid, Resolution::Commit)),
        )
        .await;
        let pending: Vec<PartyError> = rest
            .iter()
            .zip(&PartyIndex::ALL[1..])
            .filter_map(|(r, &p)| r.as_ref().err().map(|e| PartyError::from_pg(p, e)))
            .collect();
        self.return_clients(connected).await;
        Ok((
            results.into_iter().next().unwrap_or(WorkResult::Deleted(0)),
            pending,
        ))
    }

    async fn inject_after_prepare(&self) {
        match &self.fault {
            Fault::CrashAfterPrepare => {
                eprintln!("privmatch: injected fault crash-after-prepare");
                std::process::abort();
            }
            Fault::PauseAfterPrepare(path) => {
                let _ = std::fs::write(path, b"prepared\n");
                for _ in 0..1200 {
                    if !path.exists() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            _ => {}
        }
    }

    async fn return_clients(&self, clients: Vec<Client>) {
        for (party, client) in self.parties.all().iter().zip(clients) {
            party.give_back(client).await;
        }
    }

    /// Finds every privmatch transaction left prepared at any party (except this process's
    /// in-flight ones) and finishes it by the rule of `privmatch_core::twophase`.
    pub async fn recover(&self) -> RecoveryReport {
        let mut report = RecoveryReport::default();
        let mut clients = Vec::new();
        for party in self.parties.all() {
            match party.connect().await {
                Ok(c) => clients.push(Some(c)),
                Err(e) => {
                    report.errors.push(e.to_string());
                    clients.push(None);
                }
            }
        }
        let mut in_doubt: Vec<(usize, String)> = Vec::new();
        for (i, client) in clients.iter().enumerate() {
            let Some(client) = client else { continue };
            match client
                .query(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'privmatch:%'",
                    &[],
                )
                .await
            {
                Ok(rows) => in_doubt.extend(rows.iter().map(|r| (i, r.get::<_, String>(0)))),
                Err(e) => report.errors.push(PartyError::from_pg(PartyIndex::ALL[i], &e).to_string()),
            }
        }
        let in_flight = self.in_flight.lock().await.clone();
        let gids: HashSet<String> = in_doubt
            .iter()
            .map(|(_, g)| g.clone())
            .filter(|g| !in_flight.contains(g) && gid_instance(g).is_some())
            .collect();
        for gid in gids {
            let Some(p0) = clients[0].as_ref() else {
                report
                    .errors
                    .push(format!("{gid}: P0 is unreachable, cannot decide yet"));
                continue;
            };
            let record = match decision_record(p0, &gid).await {
                Ok(r) => r,
                Err(e) => {
                    report
                        .errors
                        .push(PartyError::from_pg(PartyIndex::ALL[0], &e).to_string());
                    continue;
                }
            };
            // No decision yet: make the abort decision at P0 first. Once P0's prepared
            // transaction is rolled back, no coordinator can commit it any more, so rolling back
            // the others cannot race with a commit (e.g. by another coordinator instance).
            let record = if record == DecisionRecord::StillPrepared {
                match finish_prepared(p0, &gid, Resolution::Rollback).await {
                    Ok(()) => DecisionRecord::Absent,
                    Err(e) => {
                        report.errors.push(format!(
                            "{gid}: {} (will retry)",
                            PartyError::from_pg(PartyIndex::ALL[0], &e)
                        ));
                        continue;
                    }
                }
            } else {
                record
            };
            let resolution = resolve(record);
            let mut complete = true;
            for (i, _) in in_doubt.iter().filter(|(i, g)| g == &gid && *i != 0) {
                if let Some(client) = clients[*i].as_ref() {
                    if let Err(e) = finish_prepared(client, &gid, resolution).await {
                        complete = false;
                        report
                            .errors
                            .push(PartyError::from_pg(PartyIndex::ALL[*i], &e).to_string());
                    }
                }
            }
            if complete {
                match resolution {
                    Resolution::Commit => report.committed.push(gid),
                    Resolution::Rollback => report.rolled_back.push(gid),
                }
            }
        }
        for (party, client) in self.parties.all().iter().zip(clients) {
            if let Some(client) = client {
                party.give_back(client).await;
            }
        }
        report
    }
}

async fn decision_record(p0: &Client, gid: &str) -> Result<DecisionRecord, tokio_postgres::Error> {
    let row = p0
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM privmatch.distributed_transactions WHERE gid = $1), \
                    EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = $1 AND database = current_database())",
            &[&gid],
        )
        .await?;
    Ok(match (row.get::<_, bool>(0), row.get::<_, bool>(1)) {
        (true, _) => DecisionRecord::Committed,
        (false, true) => DecisionRecord::StillPrepared,
        (false, false) => DecisionRecord::Absent,
    })
}
