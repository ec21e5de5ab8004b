//! The iris work of distributed transactions ([`crate::txn::work::Work`]): enrolment of
//! sealed bundles, deletion, and enroll-if-unique, which searches across the transaction's
//! connections before it writes.

use std::convert::Infallible;
use std::time::Duration;

use privmatch_core::iris::binding::envelope_hashes;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::party::PartyIndex;
use tokio_postgres::Client;

use crate::iris::driver::{run_search_on, SearchError};
use crate::parties::PartyError;
use crate::txn::work::{Decision, LockMode, TableLock, Txn, TxnError, Work};
use privmatch_api::iris::EnrollResult;
use privmatch_api::iris::SearchRequest;

/// The table iris enrolments and deletions write.
pub const TEMPLATES: &str = "iris_templates";

/// Opens and stores sealed iris enrolment bundles at every party.
#[derive(Clone, Debug)]
pub struct Enroll {
    /// Per party, the sealed bundles addressed to it, in record order.
    pub bundles: [Vec<Vec<u8>>; 3],
    /// `"skip"` or `"error"`.
    pub on_duplicate: String,
}

/// Per envelope position, h0 ‖ h1 ‖ h2 of the three parties' envelopes (core's
/// `iris::binding`): every party gets all three and checks its own, and the three store the
/// same enrolment id, so a share replaced at one party later shows in its set digest.
pub fn envelope_hashes_of(bundles: &[Vec<Vec<u8>>; 3]) -> Vec<Vec<u8>> {
    (0..bundles[0].len())
        .map(|j| {
            let at = |p: usize| bundles[p].get(j).map_or(&[][..], Vec::as_slice);
            envelope_hashes([at(0), at(1), at(2)]).to_vec()
        })
        .collect()
}

/// Opens and stores `bundles` at one party with the envelope hashes of their batches:
/// per record subject, eye, whether newly enrolled.
async fn enroll_at(
    party: PartyIndex,
    client: &Client,
    bundles: &[Vec<u8>],
    hashes: &[Vec<u8>],
    on_duplicate: &str,
) -> Result<Vec<EnrollResult>, PartyError> {
    let refs: Vec<&[u8]> = bundles.iter().map(Vec::as_slice).collect();
    let hashes: Vec<&[u8]> = hashes.iter().map(Vec::as_slice).collect();
    let rows = client
        .query(
            "SELECT subject, eye, enrolled FROM privmatch.iris_enroll_sealed($1, $2, $3)",
            &[&refs, &hashes, &on_duplicate],
        )
        .await
        .map_err(|e| PartyError::from_pg(party, &e))?;
    Ok(rows
        .iter()
        .map(|r| EnrollResult {
            subject: r.get(0),
            eye: r.get(1),
            enrolled: r.get(2),
        })
        .collect())
}

fn write_lock() -> Option<TableLock> {
    Some(TableLock {
        table: TEMPLATES,
        mode: LockMode::RowExclusive,
    })
}

impl Work for Enroll {
    type Output = Vec<EnrollResult>;
    type Error = Infallible;

    fn lock(&self, _party: PartyIndex) -> Option<TableLock> {
        write_lock()
    }

    async fn run_at(
        &self,
        party: PartyIndex,
        client: &Client,
    ) -> Result<Option<Self::Output>, PartyError> {
        let bundles = &self.bundles[party.as_usize()];
        let hashes = envelope_hashes_of(&self.bundles);
        enroll_at(party, client, bundles, &hashes, &self.on_duplicate)
            .await
            .map(Some)
    }
}

/// Deletes a subject's iris templates at every party.
#[derive(Clone, Debug)]
pub struct Delete {
    /// The subject.
    pub subject: String,
    /// One eye, or both.
    pub eye: Option<String>,
}

impl Work for Delete {
    type Output = i64;
    type Error = Infallible;

    fn lock(&self, _party: PartyIndex) -> Option<TableLock> {
        write_lock()
    }

    async fn run_at(&self, party: PartyIndex, client: &Client) -> Result<Option<i64>, PartyError> {
        let row = client
            .query_one(
                "SELECT privmatch.iris_delete($1, $2)",
                &[&self.subject, &self.eye],
            )
            .await
            .map_err(|e| PartyError::from_pg(party, &e))?;
        Ok(Some(row.get(0)))
    }
}

/// Deletes one entry (subject and eye) at every party whatever each holds of it: the repair of
/// `privmatch iris audit --quarantine` for an entry whose copies diverge (deleted at one party
/// only, or stored there under another enrolment). Unlike [`Delete`], the parties' counts are
/// not compared (a party that lost the entry deletes nothing), but it is one distributed
/// transaction: the entry is gone at all three or at none, and the subject must re-enrol.
#[derive(Clone, Debug)]
pub struct Quarantine {
    /// The subject.
    pub subject: String,
    /// The eye.
    pub eye: Eye,
}

impl Work for Quarantine {
    type Output = ();
    type Error = Infallible;

    fn lock(&self, _party: PartyIndex) -> Option<TableLock> {
        write_lock()
    }

    async fn run_at(&self, party: PartyIndex, client: &Client) -> Result<Option<()>, PartyError> {
        client
            .query_one(
                "SELECT privmatch.iris_delete($1, $2)",
                &[&self.subject, &self.eye.as_str()],
            )
            .await
            .map_err(|e| PartyError::from_pg(party, &e))?;
        Ok(Some(()))
    }
}

/// Enroll one record only if no enrolled template matches it (`privmatch iris enroll
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

/// What enroll-if-unique did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfUnique {
    /// Enrolled: the record's result at every party, and each party's output of the
    /// uniqueness search, signed and sealed to the client (who checks that it says unique).
    Enrolled {
        /// The record's result at every party.
        rows: Vec<EnrollResult>,
        /// Party i's sealed output of the uniqueness search (empty in a party's own answer).
        sealed_outputs: [Vec<u8>; 3],
    },
    /// The subject+eye is already enrolled; rolled back, nothing written.
    AlreadyEnrolled,
    /// The template matches an enrolled one; rolled back, nothing written.
    NotUnique {
        /// Party i's sealed output of the uniqueness search, which the client opens to check
        /// the claim.
        sealed_outputs: [Vec<u8>; 3],
    },
}

impl EnrollIfUnique {
    /// Whether the subject+eye is enrolled (the three parties must agree).
    async fn is_enrolled(&self, txn: &Txn<'_>) -> Result<bool, TxnError<SearchError>> {
        txn.agreed(|party, client| async move {
            let row = client
                .query_one(
                    "SELECT privmatch.iris_enrolled($1, $2)",
                    &[&self.subject, &self.eye.as_str()],
                )
                .await
                .map_err(|e| PartyError::from_pg(party, &e))?;
            Ok(Some(row.get::<_, bool>(0)))
        })
        .await
    }
}

impl Work for EnrollIfUnique {
    type Output = IfUnique;
    type Error = SearchError;

    /// SHARE ROW EXCLUSIVE: no other writer until the transaction ends.
    fn lock(&self, _party: PartyIndex) -> Option<TableLock> {
        Some(TableLock {
            table: TEMPLATES,
            mode: LockMode::ShareRowExclusive,
        })
    }

    /// The enrolment of the record's envelope, refusing a duplicate.
    async fn run_at(
        &self,
        party: PartyIndex,
        client: &Client,
    ) -> Result<Option<IfUnique>, PartyError> {
        let envelope = std::slice::from_ref(&self.envelopes[party.as_usize()]);
        let hashes =
            [
                envelope_hashes([&self.envelopes[0], &self.envelopes[1], &self.envelopes[2]])
                    .to_vec(),
            ];
        let rows = enroll_at(party, client, envelope, &hashes, "error").await?;
        Ok(Some(IfUnique::Enrolled {
            rows,
            sealed_outputs: Default::default(),
        }))
    }

    /// Duplicate check, uniqueness search, enrolment.
    async fn phase_one(&self, txn: &Txn<'_>) -> Result<Decision<IfUnique>, TxnError<SearchError>> {
        if self.is_enrolled(txn).await? {
            return Ok(Decision::Abandon(IfUnique::AlreadyEnrolled));
        }
        let outcome = run_search_on(txn.clients(), txn.parties(), &self.search, self.timeout)
            .await
            .map_err(TxnError::Work)?;
        // The one result the coordinator learns: the client sealed this probe allowing the
        // parties to disclose its uniqueness bit, since whether the record is enrolled shows
        // it anyway (docs/protocols/iris.md §13.2).
        match outcome.disclosed_unique {
            Some(true) => {}
            Some(false) => {
                return Ok(Decision::Abandon(IfUnique::NotUnique {
                    sealed_outputs: outcome.sealed_outputs,
                }))
            }
            None => {
                return Err(TxnError::Disagreement(
                    "the uniqueness search disclosed no bit: its probe was not sealed for enroll-if-unique".into(),
                ))
            }
        }
        let result = txn.run_each(self).await?;
        let rows = vec![EnrollResult {
            subject: self.subject.clone(),
            eye: self.eye.as_str().to_owned(),
            enrolled: true,
        }];
        let expected = IfUnique::Enrolled {
            rows: rows.clone(),
            sealed_outputs: Default::default(),
        };
        if result != expected {
            return Err(TxnError::Disagreement(format!(
                "the envelopes do not hold exactly the announced record {:?} ({} eye)",
                self.subject,
                self.eye.as_str()
            )));
        }
        Ok(Decision::Commit(IfUnique::Enrolled {
            rows,
            sealed_outputs: outcome.sealed_outputs,
        }))
    }
}
