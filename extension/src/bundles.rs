//! What the enrolment functions of both modalities share about sealed enrolment bundles: the
//! `on_duplicate` option and the replay guard over `privmatch.consumed_bundles` (every bundle
//! is opened once, whichever modality it belongs to; table in `sql/common.sql`).
//!
//! Imports: [`crate::errors`] only (no modality).

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::{PreparedStatement, SpiClient};

use crate::errors::raise;

/// Envelopes one enrolment call takes (the coordinator sends 250 per batch): a call with more
/// is refused with 54000 before any is opened, so one call cannot hold a backend's memory and
/// a party's locks for an unbounded time.
pub const MAX_ENVELOPES_PER_CALL: usize = 10_000;

/// Refuses (54000 program_limit_exceeded) a call of `function` with more than
/// [`MAX_ENVELOPES_PER_CALL`] envelopes.
pub fn check_envelope_count(function: &str, count: usize) {
    if count > MAX_ENVELOPES_PER_CALL {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "{function}: {count} envelopes in one call, more than the limit of {MAX_ENVELOPES_PER_CALL}"
            ),
            Some("send the envelopes in several calls"),
        );
    }
}

/// The hint of an "already enrolled" error.
pub const DUPLICATE_HINT: &str = "delete it first, or enrol with on_duplicate => 'skip'";

/// What to do when a record's subject is already enrolled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDuplicate {
    /// Leave the existing record, report `enrolled = false` (makes re-running an input
    /// idempotent).
    Skip,
    /// Abort the whole batch with 23505.
    Error,
}

impl OnDuplicate {
    /// Parses the `on_duplicate` argument of `function` (22023 unless `skip` or `error`).
    pub fn parse(function: &str, text: &str) -> Self {
        match text {
            "skip" => OnDuplicate::Skip,
            "error" => OnDuplicate::Error,
            other => raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{function}: on_duplicate must be 'skip' or 'error', not {other:?}"),
                None,
            ),
        }
    }
}

/// The statement that records a bundle as consumed, prepared once per call.
pub struct ReplayGuard<'conn>(PreparedStatement<'conn>);

impl<'conn> ReplayGuard<'conn> {
    /// Prepares the guard's statement on `client`.
    pub fn prepare(client: &SpiClient<'conn>) -> Result<Self, pgrx::spi::Error> {
        client
            .prepare_mut(
                "INSERT INTO privmatch.consumed_bundles (bundle_id) VALUES ($1) \
                 ON CONFLICT DO NOTHING RETURNING 1",
                &[PgOid::from(pg_sys::BYTEAOID)],
            )
            .map(ReplayGuard)
    }

    /// Records `bundle_id` as consumed in the caller's transaction; `false` when it already
    /// was (a replayed bundle, to be refused).
    pub fn consume(
        &self,
        client: &mut SpiClient<'conn>,
        bundle_id: &[u8; 16],
    ) -> Result<bool, pgrx::spi::Error> {
        let rows = client.update(&self.0, None, &[bundle_id.to_vec().into()])?;
        Ok(rows.len() == 1)
    }
}

/// The message refusing record `record` whose bundle `bundle_id` was already consumed.
pub fn replayed(record: usize, bundle_id: &[u8; 16]) -> String {
    format!(
        "record #{record} (bundle id {}) was already consumed: refusing a replayed enrolment bundle",
        hex::encode(bundle_id)
    )
}
