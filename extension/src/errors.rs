//! Errors and SPI plumbing shared by every SQL function of the extension: raising an ERROR with
//! a SQLSTATE, the SQLSTATE of a rejected share value, SPI failures, reading SPI rows, and the
//! 16-byte session ids of both modalities. Messages come from core's `Display` impls, which
//! never include share values or keys.
//!
//! Imports: pgrx, core's `wire` layer and [`crate::plans`] only (no modality).

use std::fmt::Display;

use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::{SpiHeapTupleData, SpiTupleTable};
use privmatch_core::wire::storage::ShareLayoutError;

use crate::plans::saved_plan;

/// The hint of an input sealed for another party or to keys that are not this party's
/// (SQLSTATE 22023 at every entry point; an input that does not open is 22P03).
pub const OTHER_PARTY_HINT: &str =
    "the client sealed to a key that is not this party's: check the pinned party keys";

/// Raises an ERROR with `code` and `message` (and an optional hint); never returns.
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>, hint: Option<&str>) -> ! {
    let mut report = ErrorReport::new(code, message.into(), "privmatch");
    if let Some(hint) = hint {
        report = report.set_hint(hint.to_owned());
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// Raises `err` as an internal error (XX000) with its text as the message; never returns.
pub fn raise_internal(err: impl Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        err.to_string(),
        None,
    )
}

/// Raises an SPI failure from `function` as an internal error (XX000); never returns.
pub fn raise_spi(function: &str, err: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("{function}: {err}"),
        None,
    )
}

/// The SQLSTATE for a rejected share value.
pub fn share_layout_code(err: &ShareLayoutError) -> PgSqlErrorCode {
    match err {
        ShareLayoutError::Syntax { .. } => PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
        ShareLayoutError::Binary { .. } => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
        ShareLayoutError::LengthMismatch { .. } => PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
        ShareLayoutError::BadTypmod { .. } => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    }
}

/// Raises a rejected share value.
pub fn raise_share_layout(err: ShareLayoutError) -> ! {
    raise(share_layout_code(&err), err.to_string(), None)
}

/// Logs `event` of session `session` from `function` at DEBUG1 (seen where the operator sets
/// `log_min_messages = debug1`): the same hex session id the client sealed its inputs to and
/// the coordinator's lines carry, so one search is found in every log by it. Never a value.
pub fn log_session(function: &str, session: &[u8; 16], event: &str) {
    pgrx::debug1!(
        "privmatch: session {} {event} ({function})",
        hex::encode(session)
    );
}

/// Parses the 16-byte session id passed to `function` as its argument `argument` (22023
/// otherwise, naming both).
pub fn parse_session_id(function: &str, argument: &str, bytes: &[u8]) -> [u8; 16] {
    bytes.try_into().unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{function}: {argument} must be 16 bytes, got {}",
                bytes.len()
            ),
            None,
        )
    })
}

/// One row of an SPI result, read on behalf of `function`: a column that cannot be read is
/// raised as an SPI failure of that function.
pub struct Row<'r, 'conn> {
    function: &'r str,
    tuple: &'r SpiHeapTupleData<'conn>,
}

impl Row<'_, '_> {
    /// Column `ordinal` (from 1); `None` for SQL NULL.
    pub fn get<T: FromDatum + IntoDatum>(&self, ordinal: usize) -> Option<T> {
        self.tuple
            .get::<T>(ordinal)
            .unwrap_or_else(|e| raise_spi(self.function, e))
    }
}

/// Maps every row of an SPI result with `each`, in order; SPI failures are raised from
/// `function`.
fn rows<T>(
    function: &str,
    table: pgrx::spi::SpiResult<SpiTupleTable<'_>>,
    mut each: impl FnMut(&Row<'_, '_>) -> T,
) -> Vec<T> {
    let table = table.unwrap_or_else(|e| raise_spi(function, e));
    table
        .into_iter()
        .map(|tuple| {
            each(&Row {
                function,
                tuple: &tuple,
            })
        })
        .collect()
}

/// Runs the read-only `query` with `args` and maps every row with `each`, in the order of the
/// result; SPI failures are raised from `function`.
pub fn select<T>(
    function: &str,
    query: &str,
    args: &[DatumWithOid<'_>],
    each: impl FnMut(&Row<'_, '_>) -> T,
) -> Vec<T> {
    Spi::connect(|client| rows(function, read(client, query, args), each))
}

/// Runs the read-only `query` through its saved plan where there is one ([`saved_plan`]).
pub(crate) fn read<'conn>(
    client: &pgrx::spi::SpiClient<'conn>,
    query: &str,
    args: &[DatumWithOid<'_>],
) -> pgrx::spi::SpiResult<SpiTupleTable<'conn>> {
    match saved_plan(client, query, args, false)? {
        Some(plan) => client.select(&*plan, None, args),
        None => client.select(query, None, args),
    }
}

/// Like [`select`], for a `query` that writes or locks rows (`UPDATE … RETURNING`,
/// `SELECT … FOR UPDATE`).
pub fn modify<T>(
    function: &str,
    query: &str,
    args: &[DatumWithOid<'_>],
    each: impl FnMut(&Row<'_, '_>) -> T,
) -> Vec<T> {
    Spi::connect_mut(|client| rows(function, update(client, query, None, args), each))
}

/// Runs the writing `query` through its saved plan where there is one ([`saved_plan`]).
fn update<'conn>(
    client: &mut pgrx::spi::SpiClient<'conn>,
    query: &str,
    limit: Option<i64>,
    args: &[DatumWithOid<'_>],
) -> pgrx::spi::SpiResult<SpiTupleTable<'conn>> {
    match saved_plan(client, query, args, true)? {
        Some(plan) => client.update(&*plan, limit, args),
        None => client.update(query, limit, args),
    }
}

/// The first column of the first row of `query` (`None`: no row, or NULL); SPI failures are
/// raised from `function`.
pub fn get_one<T: FromDatum + IntoDatum>(
    function: &str,
    query: &str,
    args: &[DatumWithOid<'_>],
) -> Option<T> {
    Spi::connect_mut(|client| update(client, query, Some(1), args)?.first().get_one())
        .unwrap_or_else(|e| raise_spi(function, e))
}

/// Runs `query` for its effect; SPI failures are raised from `function`.
pub fn run(function: &str, query: &str, args: &[DatumWithOid<'_>]) {
    Spi::connect_mut(|client| update(client, query, None, args).map(|_| ()))
        .unwrap_or_else(|e| raise_spi(function, e))
}

/// A SQLSTATE as its five characters (PostgreSQL packs them six bits each, first character
/// lowest).
pub fn sqlstate_text(code: PgSqlErrorCode) -> String {
    let packed = code as i32;
    (0..5)
        .map(|i| char::from(b'0'.wrapping_add(((packed >> (6 * i)) & 0x3F) as u8)))
        .collect()
}

/// An ERROR caught by [`in_subtransaction`]: its SQLSTATE and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaughtRefusal {
    /// The five-character SQLSTATE.
    pub sqlstate: String,
    /// The message (never a secret: every message of the extension is written so).
    pub message: String,
}

/// Runs `body` in a subtransaction of its own, as PL/pgSQL's `EXCEPTION` clause does: an
/// ERROR inside rolls back what `body` wrote and comes back as a [`CaughtRefusal`], and the
/// caller's transaction goes on (a batch refuses one input and keeps the others).
pub fn in_subtransaction<R>(body: impl FnOnce() -> R) -> Result<R, CaughtRefusal> {
    // SAFETY: the sequence of PL/pgSQL's exception block (pl_exec.c): remember the memory
    // context and resource owner, begin an internal subtransaction and switch back to the
    // caller's context; below, release or roll back the subtransaction and restore both.
    let (context, owner) = unsafe {
        let saved = (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner);
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(saved.0);
        saved
    };
    let result = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| Ok(body())))
        .catch_others(|caught| {
            let report = match &caught {
                pg_sys::panic::CaughtError::PostgresError(r)
                | pg_sys::panic::CaughtError::ErrorReport(r) => r,
                pg_sys::panic::CaughtError::RustPanic { ereport, .. } => ereport,
            };
            Err(CaughtRefusal {
                sqlstate: sqlstate_text(report.sql_error_code()),
                message: report.message().to_owned(),
            })
        })
        .execute();
    // SAFETY: ends the subtransaction begun above, on the same backend; pgrx has copied and
    // flushed the error state of a caught ERROR before the handler ran.
    unsafe {
        if result.is_ok() {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    }
    result
}
