//! Distributed transactions across the three parties (two-phase commit with
//! `PREPARE TRANSACTION` / `COMMIT PREPARED`) and the recovery of transactions a crash left in
//! doubt. The commit rule and gid format live in `privmatch_core::twophase`; this module does
//! the I/O.
//!
//! A transaction: BEGIN and a marker row at every party; the template-table lock, taken party
//! by party in index order (so that transactions cannot deadlock across parties); the work
//! ([`TxnWork`]: independent per-party work, or enrol-if-unique, which searches across the
//! three transaction connections and only then enrols); PREPARE everywhere; the decision (COMMIT PREPARED) at P0
//! first, then at the others. Work may also decide not to write (a duplicate or non-unique
//! record): then it is rolled back everywhere before anything is prepared.
//!
//! Face transactions (enrolment, deletion, key refill) do work at P0 and P1 only; P2 takes
//! part with its marker row alone ([`PartyWork::MarkerOnly`]), so that the decision rule and
//! recovery stay those of every other transaction. Only the parties that did work must agree
//! on the result; face writes lock `privmatch.face_templates` instead of the iris table, and
//! storing keys locks no template table.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::party::PartyIndex;
use privmatch_core::twophase::{gid_instance, make_gid, resolve, DecisionRecord, Resolution};
use serde::Serialize;
use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::parties::{Parties, PartyError};
use crate::search::{connect_all, run_search_on, SearchError, SearchRequest, SearchResult};

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
    IrisEnroll {
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
    /// Open and store sealed face enrolment envelopes (P0 and P1 only: the envelopes this
    /// party's shares are sealed in, usually one).
    FaceEnroll {
        /// Sealed envelopes addressed to this party.
        envelopes: Vec<Vec<u8>>,
        /// `"skip"` or `"error"`.
        on_duplicate: String,
    },
    /// Delete a subject's face template (P0 and P1 only).
    FaceDelete {
        /// The subject.
        subject: String,
    },
    /// Store this party's sealed half of one dealer key batch (P0 and P1 only).
    FaceKeys {
        /// The sealed half, as P2's `face_dealer_generate` returned it.
        envelope: Vec<u8>,
    },
    /// No work: only the transaction's marker row (P2 in face transactions, which holds no
    /// face shares). Its result is not compared with the others'.
    MarkerOnly,
}

impl PartyWork {
    /// The template table this work writes, which the transaction locks (ROW EXCLUSIVE) at
    /// every party doing such work, in party order; None when it writes no template.
    pub fn template_table(&self) -> Option<&'static str> {
        match self {
            PartyWork::IrisEnroll { .. } | PartyWork::IrisDelete { .. } => {
                Some("privmatch.iris_templates")
            }
            PartyWork::FaceEnroll { .. } | PartyWork::FaceDelete { .. } => {
                Some("privmatch.face_templates")
            }
            PartyWork::FaceKeys { .. } | PartyWork::MarkerOnly => None,
        }
    }
}

/// Enrol one record only if no enrolled template matches it (`privmatch iris enroll
/// --if-unique`). Inside the distributed transaction, at every party: lock the template table
/// against concurrent enrolments, check that the subject+eye is not enrolled yet, run a
/// uniqueness search through the transaction's connections, and only then open and store the
/// sealed bundles.
#[derive(Clone, Debug)]
pub struct EnrollIfUnique {
    /// The record's subject, as the client announced it (checked against the parties' answer).
    pub subject: String,
    /// The record's eye.
    pub eye: Eye,
    /// The record's sealed enrolment envelopes, indexed by party (one record each).
    pub envelopes: [Vec<u8>; 3],
    /// The uniqueness search of the record's template.
    pub search: SearchRequest,
    /// Per-call timeout of the search rounds.
    pub timeout: Duration,
}

/// The work of one distributed transaction.
#[derive(Clone, Debug)]
pub enum TxnWork {
    /// Independent work at each party (indexed by party); the results must agree.
    PerParty([PartyWork; 3]),
    /// Enrol one record if it is unique.
    IrisEnrollIfUnique(Box<EnrollIfUnique>),
}

/// What the work returned at one party. The three parties must agree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum WorkResult {
    /// Per record: subject, eye, whether it was newly enrolled.
    Enrolled(Vec<(String, String, bool)>),
    /// Number of records deleted.
    Deleted(i64),
    /// Face enrolment, per record: subject, whether it was newly enrolled.
    FaceEnrolled(Vec<(String, bool)>),
    /// A key batch half stored: the dealer's batch number and its number of keys.
    KeysStored {
        /// The dealer's batch number.
        batch: i64,
        /// Keys in the batch.
        keys: i32,
    },
    /// Enrol-if-unique: the subject+eye is already enrolled; rolled back, nothing written.
    AlreadyEnrolled,
    /// Enrol-if-unique: the template matches an enrolled one; rolled back, nothing written.
    NotUnique,
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
    /// The search inside the transaction failed: rolled back everywhere.
    #[error("aborted, nothing written at any party: {0}")]
    Search(SearchError),
    /// P0's commit failed in a way that leaves the outcome to recovery.
    #[error("outcome unknown until recovery runs: {0}")]
    InDoubt(PartyError),
}

/// What phase one decided, before anything is prepared.
enum PhaseOne {
    /// Prepare and commit; the result the parties agreed on.
    Commit(WorkResult),
    /// Roll back everywhere and report this (successful) result.
    Abandon(WorkResult),
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

/// Runs one party's work; None for [`PartyWork::MarkerOnly`] (nothing to compare).
async fn execute_work(
    party: PartyIndex,
    client: &Client,
    work: &PartyWork,
) -> Result<Option<WorkResult>, PartyError> {
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(party, &e);
    let result = match work {
        PartyWork::IrisEnroll {
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
            WorkResult::Enrolled(
                rows.iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect(),
            )
        }
        PartyWork::IrisDelete { subject, eye } => {
            let row = client
                .query_one("SELECT privmatch.iris_delete($1, $2)", &[subject, eye])
                .await
                .map_err(pg)?;
            WorkResult::Deleted(row.get(0))
        }
        PartyWork::FaceEnroll {
            envelopes,
            on_duplicate,
        } => {
            let refs: Vec<&[u8]> = envelopes.iter().map(Vec::as_slice).collect();
            let rows = client
                .query(
                    "SELECT subject, enrolled FROM privmatch.face_enroll_sealed($1, $2)",
                    &[&refs, on_duplicate],
                )
                .await
                .map_err(pg)?;
            let mut records = Vec::with_capacity(rows.len());
            for row in &rows {
                let subject: Option<String> = row.try_get(0).map_err(pg)?;
                let enrolled: Option<bool> = row.try_get(1).map_err(pg)?;
                records.push((subject.unwrap_or_default(), enrolled.unwrap_or(false)));
            }
            WorkResult::FaceEnrolled(records)
        }
        PartyWork::FaceDelete { subject } => {
            let row = client
                .query_one("SELECT privmatch.face_delete($1)", &[subject])
                .await
                .map_err(pg)?;
            let deleted: Option<i64> = row.try_get(0).map_err(pg)?;
            WorkResult::Deleted(deleted.unwrap_or(0))
        }
        PartyWork::FaceKeys { envelope } => {
            let row = client
                .query_one(
                    "SELECT batch, keys FROM privmatch.face_keys_store($1)",
                    &[&envelope.as_slice()],
                )
                .await
                .map_err(pg)?;
            let batch: Option<i64> = row.try_get(0).map_err(pg)?;
            let keys: Option<i32> = row.try_get(1).map_err(pg)?;
            WorkResult::KeysStored {
                batch: batch.unwrap_or(-1),
                keys: keys.unwrap_or(-1),
            }
        }
        PartyWork::MarkerOnly => return Ok(None),
    };
    Ok(Some(result))
}

/// The three answers of a parallel step, or the first party error.
fn all_ok<T>(results: Vec<Result<T, PartyError>>) -> Result<Vec<T>, TxnError> {
    results
        .into_iter()
        .collect::<Result<Vec<T>, PartyError>>()
        .map_err(TxnError::Aborted)
}

/// The answer the three parties agree on.
fn agreed<T: PartialEq + std::fmt::Debug>(mut answers: Vec<T>) -> Result<T, TxnError> {
    if answers.len() != 3 || answers.windows(2).any(|w| w[0] != w[1]) {
        return Err(TxnError::Disagreement(
            format!("{answers:?}").chars().take(300).collect(),
        ));
    }
    Ok(answers.swap_remove(0))
}

/// The answer the parties that did work agree on (parties with [`PartyWork::MarkerOnly`]
/// answered None and are not compared); at least one party must have worked.
fn agreed_among_workers<T: PartialEq + std::fmt::Debug>(
    answers: Vec<Option<T>>,
) -> Result<T, TxnError> {
    let mut worked: Vec<T> = answers.into_iter().flatten().collect();
    if worked.is_empty() || worked.windows(2).any(|w| w[0] != w[1]) {
        return Err(TxnError::Disagreement(
            format!("{worked:?}").chars().take(300).collect(),
        ));
    }
    Ok(worked.swap_remove(0))
}

/// BEGIN and the transaction's marker row at one party.
async fn begin_at(party: PartyIndex, client: &Client, gid: &str) -> Result<(), PartyError> {
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(party, &e);
    client.batch_execute("BEGIN").await.map_err(pg)?;
    client
        .execute(
            "INSERT INTO privmatch.distributed_transactions (gid) VALUES ($1)",
            &[&gid],
        )
        .await
        .map_err(pg)?;
    Ok(())
}

/// How a transaction locks the template table, before its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TableLock {
    /// Enrolment and deletion: ROW EXCLUSIVE (writers do not block each other).
    Write,
    /// Enrol-if-unique: SHARE ROW EXCLUSIVE, which keeps every other writer out until the
    /// transaction ends; waits at most 30 s per party (then SQLSTATE 55P03).
    Exclusive,
}

/// Takes the template-table lock party by party, always in index order. Every distributed
/// transaction that writes templates does so, so none can hold a lock at a later party while
/// waiting at an earlier one: enrol-if-unique (which blocks writers) and writers cannot
/// deadlock across parties.
async fn lock_templates(clients: &[Client; 3], lock: TableLock) -> Result<(), TxnError> {
    let table = "privmatch.iris_templates";
    lock_table_at(clients, [Some(table); 3], lock).await
}

/// Takes the lock on `tables[p]` at every party p that has one, in index order.
async fn lock_table_at(
    clients: &[Client; 3],
    tables: [Option<&str>; 3],
    lock: TableLock,
) -> Result<(), TxnError> {
    for ((&party, client), table) in PartyIndex::ALL.iter().zip(clients).zip(tables) {
        let Some(table) = table else { continue };
        let sql = match lock {
            TableLock::Write => format!("LOCK TABLE {table} IN ROW EXCLUSIVE MODE"),
            TableLock::Exclusive => format!(
                "SET LOCAL lock_timeout = '30s'; LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"
            ),
        };
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| TxnError::Aborted(PartyError::from_pg(party, &e)))?;
    }
    Ok(())
}

/// Whether the subject+eye is enrolled (the three parties must agree).
async fn is_enrolled(clients: &[Client; 3], subject: &str, eye: Eye) -> Result<bool, TxnError> {
    let answers = join_all(
        PartyIndex::ALL
            .iter()
            .zip(clients)
            .map(|(&p, c)| async move {
                let row = c
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM privmatch.iris_templates \
                 WHERE subject = $1 AND eye = $2::text::privmatch.eye)",
                        &[&subject, &eye.as_str()],
                    )
                    .await
                    .map_err(|e| PartyError::from_pg(p, &e))?;
                Ok(row.get::<_, bool>(0))
            }),
    )
    .await;
    agreed(all_ok(answers)?)
}

/// Runs independent work at each party.
async fn per_party(clients: &[Client; 3], work: &[PartyWork; 3]) -> Result<WorkResult, TxnError> {
    let results = join_all(
        PartyIndex::ALL
            .iter()
            .zip(clients)
            .zip(work)
            .map(|((&p, c), w)| execute_work(p, c, w)),
    )
    .await;
    agreed_among_workers(all_ok(results)?)
}

fn as_array(clients: &[Client; 3]) -> [&Client; 3] {
    let [c0, c1, c2] = clients;
    [c0, c1, c2]
}

/// Converts the pooled connections into an array (all three connected).
fn three(clients: Vec<Client>) -> Result<[Client; 3], TxnError> {
    clients
        .try_into()
        .map_err(|_| TxnError::Disagreement("expected three connections".into()))
}

async fn rollback_open(clients: &[Client; 3]) {
    join_all(clients.iter().map(|c| c.batch_execute("ROLLBACK"))).await;
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
        self.run_work(TxnWork::PerParty(work)).await
    }

    /// Runs `work` as one atomic distributed transaction (see [`TwoPhase::run`]). Work that
    /// decides not to write (enrol-if-unique of a duplicate or non-unique record) is rolled
    /// back everywhere and its result returned as a success, with nothing pending.
    pub async fn run_work(&self, work: TxnWork) -> Result<(WorkResult, Vec<PartyError>), TxnError> {
        let gid = make_gid(&self.instance, self.sequence.fetch_add(1, Ordering::SeqCst));
        self.in_flight.lock().await.insert(gid.clone());
        let outcome = self.run_gid(&gid, &work).await;
        self.in_flight.lock().await.remove(&gid);
        outcome
    }

    async fn run_gid(
        &self,
        gid: &str,
        work: &TxnWork,
    ) -> Result<(WorkResult, Vec<PartyError>), TxnError> {
        let clients = connect_all(&self.parties)
            .await
            .map_err(TxnError::Aborted)?;
        let clients = three(clients.into())?;
        match self.phase_one(gid, &clients, work).await {
            Ok(PhaseOne::Commit(result)) => self.prepare_and_commit(gid, clients, result).await,
            Ok(PhaseOne::Abandon(result)) => {
                rollback_open(&clients).await;
                self.return_clients(clients.into()).await;
                Ok((result, Vec::new()))
            }
            Err(err) => {
                // Nothing is prepared yet: a plain rollback ends it everywhere (where the
                // connection broke, the transaction died with it).
                rollback_open(&clients).await;
                // After a failed search a cancelled call may still be in flight: such
                // connections are not reused.
                if !matches!(err, TxnError::Search(_)) {
                    self.return_clients(clients.into()).await;
                }
                Err(err)
            }
        }
    }

    /// BEGIN, marker and the work at every party, nothing prepared yet.
    async fn phase_one(
        &self,
        gid: &str,
        clients: &[Client; 3],
        work: &TxnWork,
    ) -> Result<PhaseOne, TxnError> {
        all_ok(
            join_all(
                PartyIndex::ALL
                    .iter()
                    .zip(clients)
                    .map(|(&p, c)| begin_at(p, c, gid)),
            )
            .await,
        )?;
        match work {
            TxnWork::PerParty(work) => {
                let tables = [0, 1, 2].map(|p| work[p].template_table());
                lock_table_at(clients, tables, TableLock::Write).await?;
                per_party(clients, work).await.map(PhaseOne::Commit)
            }
            TxnWork::IrisEnrollIfUnique(record) => self.enroll_if_unique(clients, record).await,
        }
    }

    /// Lock, duplicate check, uniqueness search, enrolment (see [`EnrollIfUnique`]).
    async fn enroll_if_unique(
        &self,
        clients: &[Client; 3],
        record: &EnrollIfUnique,
    ) -> Result<PhaseOne, TxnError> {
        lock_templates(clients, TableLock::Exclusive).await?;
        if is_enrolled(clients, &record.subject, record.eye).await? {
            return Ok(PhaseOne::Abandon(WorkResult::AlreadyEnrolled));
        }
        let outcome = run_search_on(
            as_array(clients),
            &self.parties,
            &record.search,
            record.timeout,
        )
        .await
        .map_err(TxnError::Search)?;
        match outcome.result {
            SearchResult::Unique(true) => {}
            SearchResult::Unique(false) => return Ok(PhaseOne::Abandon(WorkResult::NotUnique)),
            SearchResult::Identify(_) => {
                return Err(TxnError::Disagreement(
                    "the uniqueness search answered an identification".into(),
                ))
            }
        }
        let work = |p: usize| PartyWork::IrisEnroll {
            bundles: vec![record.envelopes[p].clone()],
            on_duplicate: "error".into(),
        };
        let result = per_party(clients, &[work(0), work(1), work(2)]).await?;
        let expected = WorkResult::Enrolled(vec![(
            record.subject.clone(),
            record.eye.as_str().to_owned(),
            true,
        )]);
        if result != expected {
            return Err(TxnError::Disagreement(format!(
                "the envelopes do not hold exactly the announced record {:?} ({} eye)",
                record.subject,
                record.eye.as_str()
            )));
        }
        Ok(PhaseOne::Commit(result))
    }

    /// PREPARE everywhere, then the decision at P0 first, then the others.
    async fn prepare_and_commit(
        &self,
        gid: &str,
        clients: [Client; 3],
        result: WorkResult,
    ) -> Result<(WorkResult, Vec<PartyError>), TxnError> {
        let prepare = &format!("PREPARE TRANSACTION '{gid}'");
        let prepared = join_all(
            PartyIndex::ALL
                .iter()
                .zip(&clients)
                .map(|(&p, c)| async move {
                    c.batch_execute(prepare)
                        .await
                        .map_err(|e| PartyError::from_pg(p, &e))
                }),
        )
        .await;
        if let Some(err) = prepared.iter().find_map(|r| r.as_ref().err().cloned()) {
            // Roll back wherever it did prepare; where PREPARE failed, end the transaction.
            join_all(prepared.iter().zip(&clients).map(|(r, c)| async move {
                match r {
                    Ok(()) => finish_prepared(c, gid, Resolution::Rollback).await,
                    Err(_) => c.batch_execute("ROLLBACK").await,
                }
            }))
            .await;
            self.return_clients(clients.into()).await;
            return Err(TxnError::Aborted(err));
        }
        self.inject_after_prepare().await;
        // The decision: commit at P0 first.
        if let Err(e) = finish_prepared(&clients[0], gid, Resolution::Commit).await {
            let err = PartyError::from_pg(PartyIndex::ALL[0], &e);
            return Err(TxnError::InDoubt(err));
        }
        if matches!(self.fault, Fault::CrashAfterDecision) {
            eprintln!("privmatch: injected fault crash-after-decision ({gid})");
            std::process::abort();
        }
        let rest = join_all(
            clients[1..]
                .iter()
                .map(|c| finish_prepared(c, gid, Resolution::Commit)),
        )
        .await;
        let pending: Vec<PartyError> = rest
            .iter()
            .zip(&PartyIndex::ALL[1..])
            .filter_map(|(r, &p)| r.as_ref().err().map(|e| PartyError::from_pg(p, e)))
            .collect();
        self.return_clients(clients.into()).await;
        Ok((result, pending))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_working_parties_must_agree() {
        let stored = || {
            Some(WorkResult::KeysStored {
                batch: 7,
                keys: 100,
            })
        };
        assert_eq!(
            agreed_among_workers(vec![stored(), stored(), None]).ok(),
            stored()
        );
        let other = Some(WorkResult::KeysStored {
            batch: 8,
            keys: 100,
        });
        assert!(matches!(
            agreed_among_workers(vec![stored(), other, None]),
            Err(TxnError::Disagreement(_))
        ));
        assert!(agreed_among_workers::<WorkResult>(vec![None, None, None]).is_err());
    }

    #[test]
    fn face_work_locks_the_face_table_and_keys_lock_none() {
        let enroll = PartyWork::FaceEnroll {
            envelopes: vec![vec![1]],
            on_duplicate: "skip".into(),
        };
        assert_eq!(enroll.template_table(), Some("privmatch.face_templates"));
        let delete = PartyWork::FaceDelete {
            subject: "a".into(),
        };
        assert_eq!(delete.template_table(), Some("privmatch.face_templates"));
        assert_eq!(
            PartyWork::FaceKeys { envelope: vec![] }.template_table(),
            None
        );
        assert_eq!(PartyWork::MarkerOnly.template_table(), None);
        let iris = PartyWork::IrisDelete {
            subject: "a".into(),
            eye: None,
        };
        assert_eq!(iris.template_table(), Some("privmatch.iris_templates"));
    }
}
