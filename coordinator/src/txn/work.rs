//! What a modality supplies to a distributed transaction ([`Work`]): its SQL at each party,
//! the table each party locks, and optionally its own phase one; the context phase one runs
//! in ([`Txn`]); and why a transaction did not commit ([`TxnError`]).

use std::convert::Infallible;
use std::fmt::Debug;
use std::future::Future;

use privmatch_core::party::PartyIndex;
use tokio_postgres::Client;

use crate::parties::{Parties, PartyError};

/// How a transaction locks a table before its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// ROW EXCLUSIVE: writers do not block each other (enrolment, deletion).
    RowExclusive,
    /// SHARE ROW EXCLUSIVE, which keeps every other writer out until the transaction ends;
    /// waits at most 30 s per party (then SQLSTATE 55P03).
    ShareRowExclusive,
}

/// A table lock a transaction takes at a party before its work, through the party's
/// `privmatch.txn_lock_templates` (the coordinator's role has no privilege on the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableLock {
    /// The template table, in schema `privmatch` (a name ending in `_templates`).
    pub table: &'static str,
    /// How it is locked.
    pub mode: LockMode,
}

impl TableLock {
    /// The SQL that takes the lock (the table name is a constant of the code, never input).
    pub fn sql(&self) -> String {
        let exclusive = self.mode == LockMode::ShareRowExclusive;
        format!(
            "SELECT privmatch.txn_lock_templates('{}', {exclusive})",
            self.table
        )
    }
}

/// What phase one decided, before anything is prepared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision<T> {
    /// Prepare and commit; the result the parties agreed on.
    Commit(T),
    /// Roll back everywhere and report this (successful) result.
    Abandon(T),
}

/// Why a distributed transaction did not commit, or committed only partly so far. `E` is
/// what a modality's own phase one may fail with besides the parties ([`Work::Error`]).
#[derive(Debug, thiserror::Error)]
pub enum TxnError<E = Infallible> {
    /// A party failed before the decision: rolled back everywhere, nothing written.
    #[error("aborted, nothing written at any party: {0}")]
    Aborted(PartyError),
    /// The parties returned different results: rolled back everywhere.
    #[error("aborted, nothing written at any party: the parties disagree ({0})")]
    Disagreement(String),
    /// The work's own phase one failed (e.g. the search of enroll-if-unique): rolled back
    /// everywhere.
    #[error("aborted, nothing written at any party: {0}")]
    Work(E),
    /// P0's commit failed in a way that leaves the outcome to recovery.
    #[error("outcome unknown until recovery runs: {0}")]
    InDoubt(PartyError),
}

/// The work of one distributed transaction, as a modality defines it.
pub trait Work: Sync {
    /// What a party's work returned; the parties that worked must agree on it.
    type Output: PartialEq + Debug + Send;
    /// What the work's own phase one may fail with besides the parties (`Infallible` when it
    /// has none).
    type Error: Send;

    /// The table locked at `party` before the work (None: none). Locks are taken party by
    /// party in index order.
    fn lock(&self, party: PartyIndex) -> Option<TableLock>;

    /// Runs the work at `party` on the transaction's connection: what it returned, or None
    /// when the party takes part with its marker row only (its result is not compared).
    fn run_at<'a>(
        &'a self,
        party: PartyIndex,
        client: &'a Client,
    ) -> impl Future<Output = Result<Option<Self::Output>, PartyError>> + Send + 'a;

    /// Phase one, after BEGIN, the marker rows and the locks: by default the work at every
    /// party ([`Txn::run_each`]), committed. A modality overrides it to check or search across
    /// the transaction's connections first, or to decide not to write.
    fn phase_one<'a>(
        &'a self,
        txn: &'a Txn<'a>,
    ) -> impl Future<Output = Result<Decision<Self::Output>, TxnError<Self::Error>>> + Send + 'a
    {
        async move { txn.run_each(self).await.map(Decision::Commit) }
    }
}

/// Phase one's view of a transaction: one connection per party, inside the transaction.
pub struct Txn<'a> {
    clients: [&'a Client; 3],
    parties: &'a Parties,
}

impl<'a> Txn<'a> {
    /// The context of a transaction on `clients` (indexed by party).
    pub fn new(clients: [&'a Client; 3], parties: &'a Parties) -> Self {
        Txn { clients, parties }
    }

    /// The transaction's connections, indexed by party.
    pub fn clients(&self) -> [&'a Client; 3] {
        self.clients
    }

    /// The parties' pools (for calls that must not run inside the transaction, such as the
    /// best-effort abort of a failed search).
    pub fn parties(&self) -> &'a Parties {
        self.parties
    }

    /// Runs `call` at P0, then at P1 and P2 in parallel, and returns what the parties that
    /// answered Some agree on (at least one must).
    ///
    /// **Lock order.** P0 first is what makes overlapping transactions deadlock-free: every
    /// party holds the same records, so two transactions that touch a common row conflict at
    /// P0 first, and the second waits there (taking its rows in (subject, eye) order, as the
    /// parties' enrolment functions do, so neither can hold a row the other waits for) until
    /// the first commits or rolls back; no transaction ever waits at P1 or P2 for one that
    /// waits on it elsewhere. Parallel at all three, each party could let a different one
    /// through first: a cycle across servers that no server's deadlock detector sees.
    pub async fn agreed<T, E, F, Fut>(&self, mut call: F) -> Result<T, TxnError<E>>
    where
        T: PartialEq + Debug,
        F: FnMut(PartyIndex, &'a Client) -> Fut,
        Fut: Future<Output = Result<Option<T>, PartyError>>,
    {
        let [p0, p1, p2] = PartyIndex::ALL;
        let first = call(p0, self.clients[0]).await.map_err(TxnError::Aborted)?;
        let (second, third) = futures::join!(call(p1, self.clients[1]), call(p2, self.clients[2]));
        let answers = vec![
            first,
            second.map_err(TxnError::Aborted)?,
            third.map_err(TxnError::Aborted)?,
        ];
        agreed_among_workers(answers)
    }

    /// Runs `work` at the three parties in parallel; the result the working parties agree on.
    pub async fn run_each<W: Work + ?Sized, E>(&self, work: &W) -> Result<W::Output, TxnError<E>> {
        self.agreed(|party, client| work.run_at(party, client))
            .await
    }
}

/// The answer the parties that did work agree on (parties that answered None are not
/// compared); at least one party must have worked.
pub fn agreed_among_workers<T: PartialEq + Debug, E>(
    answers: Vec<Option<T>>,
) -> Result<T, TxnError<E>> {
    let mut worked: Vec<T> = answers.into_iter().flatten().collect();
    if worked.is_empty() || worked.windows(2).any(|w| w[0] != w[1]) {
        return Err(TxnError::Disagreement(
            format!("{worked:?}").chars().take(300).collect(),
        ));
    }
    Ok(worked.swap_remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_working_parties_must_agree() {
        let stored = || Some((7i64, 100i32));
        let agreed: Result<_, TxnError> = agreed_among_workers(vec![stored(), stored(), None]);
        assert_eq!(agreed.ok(), stored());
        let other = Some((8, 100));
        let differ: Result<_, TxnError> = agreed_among_workers(vec![stored(), other, None]);
        assert!(matches!(differ, Err(TxnError::Disagreement(_))));
        let none: Result<(i64, i32), TxnError> = agreed_among_workers(vec![None, None, None]);
        assert!(none.is_err());
    }

    #[test]
    fn locks_are_written_as_sql() {
        let write = TableLock {
            table: "t_templates",
            mode: LockMode::RowExclusive,
        };
        assert_eq!(
            write.sql(),
            "SELECT privmatch.txn_lock_templates('t_templates', false)"
        );
        let exclusive = TableLock {
            mode: LockMode::ShareRowExclusive,
            ..write
        };
        assert_eq!(
            exclusive.sql(),
            "SELECT privmatch.txn_lock_templates('t_templates', true)"
        );
    }
}
