//! The iris work of distributed transactions ([`crate::txn::work::Work`]): enrolment of
//! sealed bundles, deletion, and enroll-if-unique, which searches across the transaction's
//! connections before it writes.

use std::convert::Infallible;
use std::time::Duration;

use privmatch_core::iris::binding::envelope_hashes;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::party::PartyIndex;
use tokio_postgres::Client;

use crate::iris::batch::{run_enrolment_batch_on, IrisBatchKey};
use crate::iris::driver::{run_search_on, SearchError};
use crate::parties::PartyError;
use crate::txn::work::{Decision, LockMode, TableLock, Txn, TxnError, Work};
use privmatch_api::iris::EnrollResult;
use privmatch_api::iris::SearchRequest;
use privmatch_core::iris::params::SearchMode;
use privmatch_core::iris::template::MAX_ROTATION;

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

/// Each member's outcome of an [`EnrollIfUniqueBatch`], in batch order: what enroll-if-unique
/// did with it, or why its request failed alone (a party refused its probe or envelope).
#[derive(Clone, Debug)]
pub struct MemberOutcomes(pub Vec<Result<IfUnique, SearchError>>);

/// Outcomes are compared by what they say (the two-phase driver compares parties' answers;
/// a batch's outcome is decided by the coordinator once, so this only serves the trait).
impl PartialEq for MemberOutcomes {
    fn eq(&self, other: &Self) -> bool {
        format!("{self:?}") == format!("{other:?}")
    }
}

/// Enrol-if-unique requests of one eye run as one batch in one distributed transaction
/// (docs/protocols/iris.md §13.4): the template table's lock is taken once for the batch,
/// requests whose subject+eye is enrolled are answered "duplicate", the others' uniqueness
/// probes run as one enrolment batch (each compared with the enrolled set **and** with the
/// records of the batch's earlier requests, inside the MPC), and every unique record is
/// enrolled at the three parties in the same transaction: all or none.
#[derive(Clone, Debug)]
pub struct EnrollIfUniqueBatch {
    /// The requests, in batch order (all of `eye`).
    pub members: Vec<EnrollIfUnique>,
    /// Their eye.
    pub eye: Eye,
    /// Per-call timeout of the search rounds.
    pub timeout: Duration,
}

impl EnrollIfUniqueBatch {
    /// Per member, whether its subject+eye is enrolled (the three parties must agree).
    async fn enrolled(&self, txn: &Txn<'_>) -> Result<Vec<bool>, TxnError<SearchError>> {
        let subjects: Vec<&str> = self.members.iter().map(|m| m.subject.as_str()).collect();
        txn.agreed(|party, client| {
            let subjects = &subjects;
            async move {
                let rows = client
                    .query(
                        "SELECT privmatch.iris_enrolled(s, $2) FROM unnest($1::text[]) \
                         WITH ORDINALITY AS u(s, k) ORDER BY k",
                        &[subjects, &self.eye.as_str()],
                    )
                    .await
                    .map_err(|e| PartyError::from_pg(party, &e))?;
                Ok(Some(rows.iter().map(|r| r.get::<_, bool>(0)).collect()))
            }
        })
        .await
    }
}

impl Work for EnrollIfUniqueBatch {
    type Output = MemberOutcomes;
    type Error = SearchError;

    /// SHARE ROW EXCLUSIVE, as for one request: no other writer until the batch commits.
    fn lock(&self, _party: PartyIndex) -> Option<TableLock> {
        Some(TableLock {
            table: TEMPLATES,
            mode: LockMode::ShareRowExclusive,
        })
    }

    /// Not used: phase one does the work (the enrolment of the unique records is an
    /// [`Enroll`] of theirs).
    async fn run_at(
        &self,
        _party: PartyIndex,
        _client: &Client,
    ) -> Result<Option<MemberOutcomes>, PartyError> {
        Ok(None)
    }

    /// Duplicate checks, one enrolment batch, the enrolment of the unique records.
    async fn phase_one(
        &self,
        txn: &Txn<'_>,
    ) -> Result<Decision<MemberOutcomes>, TxnError<SearchError>> {
        let enrolled = self.enrolled(txn).await?;
        if enrolled.len() != self.members.len() {
            return Err(TxnError::Disagreement(format!(
                "the parties answered {} duplicate checks for {} requests",
                enrolled.len(),
                self.members.len()
            )));
        }
        let mut outcomes: Vec<Option<Result<IfUnique, SearchError>>> = enrolled
            .iter()
            .map(|&e| e.then_some(Ok(IfUnique::AlreadyEnrolled)))
            .collect();
        let searched: Vec<usize> = (0..self.members.len()).filter(|&k| !enrolled[k]).collect();
        let mut winners: Vec<usize> = Vec::new();
        if !searched.is_empty() {
            let probes: Vec<SearchRequest> = searched
                .iter()
                .map(|&k| self.members[k].search.clone())
                .collect();
            let envelopes: Vec<[Vec<u8>; 3]> = searched
                .iter()
                .map(|&k| self.members[k].envelopes.clone())
                .collect();
            let key = IrisBatchKey {
                eye: self.eye,
                mode: SearchMode::Uniqueness,
                max_rotation: MAX_ROTATION,
            };
            let results = run_enrolment_batch_on(
                txn.clients(),
                txn.parties(),
                key,
                &probes,
                &envelopes,
                self.timeout,
            )
            .await
            .map_err(TxnError::Work)?;
            for (&k, result) in searched.iter().zip(results) {
                outcomes[k] = Some(match result {
                    Err(e) => Err(e),
                    // The one result the coordinator learns, as for one request.
                    Ok(o) => match o.disclosed_unique {
                        Some(true) => {
                            winners.push(k);
                            Ok(IfUnique::Enrolled {
                                rows: Vec::new(),
                                sealed_outputs: o.sealed_outputs,
                            })
                        }
                        Some(false) => Ok(IfUnique::NotUnique {
                            sealed_outputs: o.sealed_outputs,
                        }),
                        None => Err(SearchError::Protocol(
                            "the uniqueness search disclosed no bit: its probe was not sealed for enroll-if-unique".into(),
                        )),
                    },
                });
            }
        }
        // Two unique requests of one subject+eye (two people under one id: their templates
        // differ): the earlier is enrolled, the later is a duplicate of it.
        let mut taken = std::collections::HashSet::new();
        winners.retain(|&k| {
            let first = taken.insert(self.members[k].subject.as_str());
            if !first {
                outcomes[k] = Some(Ok(IfUnique::AlreadyEnrolled));
            }
            first
        });
        if winners.is_empty() {
            return Ok(Decision::Abandon(settled(outcomes)));
        }
        let enrol = Enroll {
            bundles: std::array::from_fn(|p| {
                winners
                    .iter()
                    .map(|&k| self.members[k].envelopes[p].clone())
                    .collect()
            }),
            on_duplicate: "error".into(),
        };
        let rows = txn.run_each(&enrol).await?;
        let expected: Vec<EnrollResult> = winners
            .iter()
            .map(|&k| EnrollResult {
                subject: self.members[k].subject.clone(),
                eye: self.eye.as_str().to_owned(),
                enrolled: true,
            })
            .collect();
        if rows != expected {
            return Err(TxnError::Disagreement(
                "the envelopes of the unique requests do not hold exactly the announced records"
                    .into(),
            ));
        }
        for (&k, row) in winners.iter().zip(rows) {
            if let Some(Ok(IfUnique::Enrolled { rows, .. })) = outcomes[k].as_mut() {
                rows.push(row);
            }
        }
        Ok(Decision::Commit(settled(outcomes)))
    }
}

/// The members' outcomes once every one is settled (a member left unsettled would be a bug:
/// it gets an error, never a silent success).
fn settled(filled: Vec<Option<Result<IfUnique, SearchError>>>) -> MemberOutcomes {
    MemberOutcomes(
        filled
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| Err(SearchError::Protocol("a request was not settled".into())))
            })
            .collect(),
    )
}
