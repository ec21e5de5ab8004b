//! The transaction manager: runs a modality's [`Work`] as one atomic transaction across the
//! three parties (see the [`crate::txn`] module docs for the steps).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::join_all;
use privmatch_core::party::PartyIndex;
use privmatch_core::twophase::{make_gid, Resolution};
use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::parties::{Parties, PartyError, PooledClient};
use crate::txn::fault::Fault;
use crate::txn::work::{Decision, Txn, TxnError, Work};

/// A finished transaction: what the parties agreed on, and the parties whose commit recovery
/// must still complete (the decision is already durable at P0; empty for abandoned work).
#[derive(Debug)]
pub struct Outcome<T> {
    /// The result the working parties agreed on.
    pub result: T,
    /// Parties whose `COMMIT PREPARED` failed; recovery completes them.
    pub pending: Vec<PartyError>,
}

impl<T> Outcome<T> {
    /// The parties recovery must still complete, as the HTTP API reports them.
    pub fn pending_recovery(&self) -> Vec<String> {
        self.pending.iter().map(ToString::to_string).collect()
    }
}

/// Runs distributed transactions and recovers in-doubt ones ([`crate::txn::recovery`]).
pub struct TwoPhase {
    pub(super) parties: Arc<Parties>,
    instance: String,
    sequence: AtomicU64,
    pub(super) in_flight: Mutex<HashSet<String>>,
    fault: Fault,
}

/// How many times a transaction that lost a conflict is run again ([`TwoPhase::run`]).
pub const RETRIES: u64 = 5;

/// A conflict the transaction lost as a whole (deadlock victim, serialisation failure): it
/// may simply run again.
fn is_retryable(err: &PartyError) -> bool {
    matches!(err.sqlstate.as_deref(), Some("40P01" | "40001"))
}

/// BEGIN and the transaction's marker row at one party.
async fn begin_at(party: PartyIndex, client: &Client, gid: &str) -> Result<(), PartyError> {
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(party, &e);
    client.batch_execute("BEGIN").await.map_err(pg)?;
    client
        .query_one("SELECT privmatch.txn_begin($1)", &[&gid])
        .await
        .map_err(pg)?;
    Ok(())
}

async fn rollback_open(clients: &[PooledClient; 3]) {
    join_all(clients.iter().map(|c| c.batch_execute("ROLLBACK"))).await;
}

/// `COMMIT PREPARED` or `ROLLBACK PREPARED` of `gid` on `client`.
pub(super) async fn finish_prepared(
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

    /// Runs `work` as one atomic distributed transaction. Work whose phase one decides not to
    /// write ([`Decision::Abandon`]) is rolled back everywhere and its result returned as a
    /// success, with nothing pending.
    ///
    /// A transaction a party aborted as a deadlock victim or a serialisation failure (40P01,
    /// 40001) before anything was prepared is run again, up to [`RETRIES`] times with a short
    /// random pause: nothing of it was written anywhere, and its sealed inputs were not
    /// consumed (their consumption rolled back with it).
    pub async fn run<W: Work>(&self, work: &W) -> Result<Outcome<W::Output>, TxnError<W::Error>> {
        let mut attempt = 0;
        loop {
            let gid = make_gid(&self.instance, self.sequence.fetch_add(1, Ordering::SeqCst));
            self.in_flight.lock().await.insert(gid.clone());
            let outcome = self.run_gid(&gid, work).await;
            self.in_flight.lock().await.remove(&gid);
            match outcome {
                Err(TxnError::Aborted(e)) if attempt < RETRIES && is_retryable(&e) => {
                    attempt += 1;
                    tracing::info!(%gid, attempt, error = %e, "transaction lost a conflict; running it again");
                    let pause = rand::Rng::gen_range(&mut rand::thread_rng(), 10..100 * attempt);
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                other => return other,
            }
        }
    }

    async fn run_gid<W: Work>(
        &self,
        gid: &str,
        work: &W,
    ) -> Result<Outcome<W::Output>, TxnError<W::Error>> {
        let clients = self
            .parties
            .connect_first::<3>()
            .await
            .map_err(TxnError::Aborted)?;
        match self.phase_one(gid, &clients, work).await {
            Ok(Decision::Commit(result)) => self.prepare_and_commit(gid, clients, result).await,
            Ok(Decision::Abandon(result)) => {
                rollback_open(&clients).await;
                self.parties.give_back_all(clients).await;
                Ok(Outcome {
                    result,
                    pending: Vec::new(),
                })
            }
            Err(err) => {
                // Nothing is prepared yet: a plain rollback ends it everywhere (where the
                // connection broke, the transaction died with it).
                rollback_open(&clients).await;
                // After the work's own failure (e.g. a search) a cancelled call may still be
                // in flight: such connections are not reused.
                if !matches!(err, TxnError::Work(_)) {
                    self.parties.give_back_all(clients).await;
                }
                Err(err)
            }
        }
    }

    /// BEGIN, marker, locks (party by party, in index order, so that transactions cannot
    /// deadlock across parties) and the work's phase one; nothing prepared yet.
    async fn phase_one<W: Work>(
        &self,
        gid: &str,
        clients: &[PooledClient; 3],
        work: &W,
    ) -> Result<Decision<W::Output>, TxnError<W::Error>> {
        let began = join_all(
            PartyIndex::ALL
                .iter()
                .zip(clients)
                .map(|(&p, c)| begin_at(p, c, gid)),
        )
        .await;
        began
            .into_iter()
            .collect::<Result<Vec<()>, PartyError>>()
            .map_err(TxnError::Aborted)?;
        for (&party, client) in PartyIndex::ALL.iter().zip(clients) {
            if let Some(lock) = work.lock(party) {
                client
                    .batch_execute(&lock.sql())
                    .await
                    .map_err(|e| TxnError::Aborted(PartyError::from_pg(party, &e)))?;
            }
        }
        let txn = Txn::new(clients.each_ref().map(|c| c.client()), &self.parties);
        work.phase_one(&txn).await
    }

    /// PREPARE everywhere, then the decision at P0 first, then the others.
    async fn prepare_and_commit<T, E>(
        &self,
        gid: &str,
        clients: [PooledClient; 3],
        result: T,
    ) -> Result<Outcome<T>, TxnError<E>> {
        let prepare = &format!("PREPARE TRANSACTION '{gid}'");
        let prepare_at = |i: usize| {
            let (party, client) = (PartyIndex::ALL[i], &clients[i]);
            async move {
                client
                    .batch_execute(prepare)
                    .await
                    .map_err(|e| PartyError::from_pg(party, &e))
            }
        };
        let prepared = if self.fault.delays_p0_prepare() {
            let rest = join_all([1, 2].map(prepare_at)).await;
            self.fault.before_p0_prepare().await;
            let mut all = vec![prepare_at(0).await];
            all.extend(rest);
            all
        } else {
            join_all([0, 1, 2].map(prepare_at)).await
        };
        if let Some(err) = prepared.iter().find_map(|r| r.as_ref().err().cloned()) {
            // Roll back wherever it did prepare; where PREPARE failed, end the transaction.
            join_all(prepared.iter().zip(&clients).map(|(r, c)| async move {
                match r {
                    Ok(()) => finish_prepared(c, gid, Resolution::Rollback).await,
                    Err(_) => c.batch_execute("ROLLBACK").await,
                }
            }))
            .await;
            self.parties.give_back_all(clients).await;
            return Err(TxnError::Aborted(err));
        }
        self.fault.after_prepare().await;
        // The decision: commit at P0 first.
        if let Err(e) = finish_prepared(&clients[0], gid, Resolution::Commit).await {
            let err = PartyError::from_pg(PartyIndex::ALL[0], &e);
            return Err(TxnError::InDoubt(err));
        }
        self.fault.after_decision(gid);
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
        self.parties.give_back_all(clients).await;
        Ok(Outcome { result, pending })
    }
}
