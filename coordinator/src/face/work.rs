//! The face work of distributed transactions ([`crate::txn::work::Work`]): enrolment and
//! deletion of templates. The work runs at the two
//! evaluators P0 and P1; P2 (the dealer), which holds no face share, takes part with its
//! marker row only, so that the decision rule and recovery stay those of every transaction.
//! Only P0's and P1's results must agree.

use std::convert::Infallible;

use privmatch_core::party::PartyIndex;
use tokio_postgres::Client;

use crate::parties::{column, PartyError};
use crate::txn::work::{LockMode, TableLock, Work};
use privmatch_api::face::FaceEnrollResult;

/// The table face enrolments and deletions write.
pub const TEMPLATES: &str = "face_templates";

/// What `party` gets of per-evaluator values: P0's or P1's, None for P2.
fn of_evaluator<T>(per_evaluator: &[T; 2], party: PartyIndex) -> Option<&T> {
    per_evaluator.get(party.as_usize())
}

/// ROW EXCLUSIVE on the face templates at the evaluators.
fn write_lock(party: PartyIndex) -> Option<TableLock> {
    (party.as_usize() < 2).then_some(TableLock {
        table: TEMPLATES,
        mode: LockMode::RowExclusive,
    })
}

/// Opens and stores sealed face enrolment envelopes at P0 and P1.
#[derive(Clone, Debug)]
pub struct Enroll {
    /// The envelope sealed to P0 and the one sealed to P1 (one batch each).
    pub envelopes: [Vec<u8>; 2],
    /// `"skip"` or `"error"`.
    pub on_duplicate: String,
}

impl Work for Enroll {
    type Output = Vec<FaceEnrollResult>;
    type Error = Infallible;

    fn lock(&self, party: PartyIndex) -> Option<TableLock> {
        write_lock(party)
    }

    async fn run_at(
        &self,
        party: PartyIndex,
        client: &Client,
    ) -> Result<Option<Self::Output>, PartyError> {
        let Some(envelope) = of_evaluator(&self.envelopes, party) else {
            return Ok(None);
        };
        let refs: Vec<&[u8]> = vec![envelope.as_slice()];
        let rows = client
            .query(
                "SELECT subject, enrolled FROM privmatch.face_enroll_sealed($1, $2)",
                &[&refs, &self.on_duplicate],
            )
            .await
            .map_err(|e| PartyError::from_pg(party, &e))?;
        let mut records = Vec::with_capacity(rows.len());
        for row in &rows {
            records.push(FaceEnrollResult {
                subject: column(party, row, 0)?.unwrap_or_default(),
                enrolled: column(party, row, 1)?.unwrap_or(false),
            });
        }
        Ok(Some(records))
    }
}

/// Deletes a subject's face template at P0 and P1.
#[derive(Clone, Debug)]
pub struct Delete {
    /// The subject.
    pub subject: String,
}

impl Work for Delete {
    type Output = i64;
    type Error = Infallible;

    fn lock(&self, party: PartyIndex) -> Option<TableLock> {
        write_lock(party)
    }

    async fn run_at(&self, party: PartyIndex, client: &Client) -> Result<Option<i64>, PartyError> {
        if party.as_usize() >= 2 {
            return Ok(None);
        }
        let row = client
            .query_one("SELECT privmatch.face_delete($1)", &[&self.subject])
            .await
            .map_err(|e| PartyError::from_pg(party, &e))?;
        Ok(Some(column(party, &row, 0)?.unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn face_work_locks_the_face_table_at_the_evaluators_only() {
        let [p0, p1, p2] = PartyIndex::ALL;
        let enroll = Enroll {
            envelopes: [vec![1], vec![2]],
            on_duplicate: "skip".into(),
        };
        for party in [p0, p1] {
            assert_eq!(enroll.lock(party).map(|l| l.table), Some(TEMPLATES));
            let delete = Delete {
                subject: "a".into(),
            };
            assert_eq!(
                delete.lock(party).map(|l| l.mode),
                Some(LockMode::RowExclusive)
            );
        }
        assert_eq!(enroll.lock(p2), None);
        assert_eq!(of_evaluator(&[1, 2], p1), Some(&2));
        assert_eq!(of_evaluator(&[1, 2], p2), None);
    }
}
