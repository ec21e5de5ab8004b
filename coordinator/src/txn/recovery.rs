//! Recovery: finishes the privmatch transactions a crash left prepared at any party, by the
//! rule of `privmatch_core::twophase` (the decision record at P0). Modality-neutral: it knows
//! transactions by gid only.

use std::collections::BTreeSet;

use privmatch_core::party::PartyIndex;
use privmatch_core::twophase::{gid_instance, resolve, DecisionRecord, Resolution};
use serde::Serialize;
use tokio_postgres::Client;

use crate::parties::PartyError;
use crate::txn::twophase::{finish_prepared, TwoPhase};

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

async fn decision_record(p0: &Client, gid: &str) -> Result<DecisionRecord, tokio_postgres::Error> {
    let row = p0
        .query_one(
            "SELECT privmatch.txn_committed($1), \
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

/// Writes the abort fence of `gid` at P0 (`privmatch.txn_fence`): true when the transaction
/// is aborted, false when it committed meanwhile; an error (55P03) while its coordinator still
/// holds it open at P0.
async fn fence(p0: &Client, gid: &str) -> Result<bool, tokio_postgres::Error> {
    Ok(p0
        .query_one("SELECT privmatch.txn_fence($1)", &[&gid])
        .await?
        .get(0))
}

impl TwoPhase {
    /// Finds every privmatch transaction left prepared at any party (except this process's
    /// in-flight ones) and finishes it by the rule of `privmatch_core::twophase`, in gid order.
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
        let gids: BTreeSet<String> = in_doubt
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
            // Neither prepared nor committed at P0: its coordinator may still hold it open
            // there (stalled before P0's PREPARE). The fence decides it aborted only if not,
            // so a late PREPARE and COMMIT at P0 cannot follow a rollback at P1 and P2.
            let record = if record == DecisionRecord::Absent {
                match fence(p0, &gid).await {
                    Ok(true) => DecisionRecord::Absent,
                    Ok(false) => DecisionRecord::Committed,
                    Err(e) => {
                        report.errors.push(format!(
                            "{gid}: still open at P0, left to its coordinator ({}; will retry)",
                            PartyError::from_pg(PartyIndex::ALL[0], &e)
                        ));
                        continue;
                    }
                }
            } else {
                record
            };
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
