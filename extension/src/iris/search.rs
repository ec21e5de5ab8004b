//! SQL functions of one party for the rounds of an iris search (Bloemen et al., ePrint
//! 2024/705, as driven by the coordinator). Each call is forwarded to the engine worker
//! (`crate::engine`), which keeps the search's state between calls; these functions only
//! validate arguments and convert types. The search parameters are checked here, once, and
//! travel to the engine as [`SearchParams`].
//!
//! A search: `iris_search_start` at the three parties (same session id, parameters, each
//! with its own sealed probe) → `(entries, set_digest, message)`; then round k = 0, 1, … at
//! every party with the message party i−1 returned → the next message for party i+1, until
//! `finished`. `iris_search_abort` ends a search early.

use pgrx::prelude::*;
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::PROBE_LIFETIME_SECS;
use privmatch_core::iris::service::SearchError;

use crate::budget::{self, BudgetKind};
use crate::engine::client::{call, release_round_buffers};
use crate::engine::ipc::{Request, Response};
use crate::errors::{get_one, parse_session_id, raise, run};
use crate::iris::policy::check_threshold;

/// The search parameters of `iris_search_start`: 22023 with core's message (`iris search:
/// …`) when one is out of range.
fn search_params(mode: &str, max_rotation: i32, threshold: f64) -> SearchParams {
    SearchMode::parse(mode)
        .and_then(|mode| SearchParams::new(mode, max_rotation, threshold))
        .unwrap_or_else(|e| {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                SearchError::BadParameter(e).to_string(),
                None,
            )
        })
}

/// Records `session` as used at this party, durably (in the caller's transaction, so a start
/// that fails records nothing), and prunes records older than twice a probe's lifetime.
/// Raises 42704, as the engine does for a session id it remembers, when it was used before.
fn record_session(session: &[u8; 16]) {
    const F: &str = "iris_search_start";
    let keep_secs = (2 * PROBE_LIFETIME_SECS) as f64;
    run(
        F,
        "DELETE FROM privmatch.iris_used_sessions WHERE used_at < now() - make_interval(secs => $1)",
        &[keep_secs.into()],
    );
    let fresh = get_one::<bool>(
        F,
        "WITH i AS (INSERT INTO privmatch.iris_used_sessions (session) VALUES ($1) \
                    ON CONFLICT DO NOTHING RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM i)",
        &[session.to_vec().into()],
    )
    .unwrap_or(false);
    if !fresh {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            SearchError::ReplayedSession(hex::encode(session)).to_string(),
            None,
        );
    }
}

fn unexpected(function: &str, response: &Response) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("{function}: unexpected engine reply {response:?}"),
        None,
    )
}

/// Starts search `session_id` at this party with its sealed `probe`: brings the engine up to
/// date with the template table, scans the templates of the probe's eye and returns the
/// number searched, the digest of the searched set and the first message (for party i+1).
/// `mode` is `identify` or `uniqueness`, `max_rotation` 0..=15, `threshold` the fractional
/// Hamming distance ratio below which a comparison matches: it must be this party's policy
/// (`iris_policy()`), anything else is refused with 22023.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_search_start(
    session_id: &[u8],
    probe: &[u8],
    mode: default!(&str, "'identify'"),
    max_rotation: default!(i32, 15),
    threshold: default!(f64, 0.345),
) -> TableIterator<
    'static,
    (
        name!(entries, i64),
        name!(set_digest, Vec<u8>),
        name!(message, Vec<u8>),
    ),
> {
    const F: &str = "iris_search_start";
    let session = parse_session_id(F, "session_id", session_id);
    let params = search_params(mode, max_rotation, threshold);
    // The threshold is deployment policy (attack: a caller bisecting a distance with searches
    // at thresholds of its choice); checked here, whoever calls, before anything is opened.
    check_threshold(F, "threshold", params.threshold());
    // The per-party query budget is charged here, after the arguments are checked and before
    // the probe is opened (a search past it is refused with 53400, whoever calls).
    budget::charge(F, BudgetKind::IrisSearch, "");
    record_session(&session);
    let request = Request::Start {
        session,
        probe: probe.to_vec(),
        params,
    };
    match call(&request) {
        Response::Started {
            entries,
            digest,
            message,
        } => TableIterator::once((entries as i64, digest.to_vec(), message)),
        other => unexpected("iris_search_start", &other),
    }
}

/// Runs round `round` of search `session_id` with the message party i−1 returned. Returns
/// the next message (for party i+1) with `finished = false`, or the output with
/// `finished = true`: `subjects` (identification: the matching subjects of the probe's eye,
/// sorted) or `is_unique` (uniqueness), and `signature`, this party's Ed25519 signature over
/// the output bound to the session, parameters, eye and set digest (core's `iris::output`;
/// the key is derived from the party key file, its public half is `party_info()`'s
/// `signing_key`). Any refused message aborts the search.
// The row type must be spelled out inline for pgrx's SQL generation.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn iris_search_round(
    session_id: &[u8],
    round: i32,
    message: &[u8],
) -> TableIterator<
    'static,
    (
        name!(message, Option<Vec<u8>>),
        name!(finished, bool),
        name!(is_unique, Option<bool>),
        name!(subjects, Option<Vec<String>>),
        name!(signature, Option<Vec<u8>>),
    ),
> {
    let round = u32::try_from(round).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("iris_search_round: round must be ≥ 0, got {round}"),
            None,
        )
    });
    let request = Request::Round {
        session: parse_session_id("iris_search_round", "session_id", session_id),
        round,
        message: std::borrow::Cow::Borrowed(message),
    };
    let row = match call(&request) {
        Response::Continue(m) => (Some(m), false, None, None, None),
        Response::Identified(subjects, signature) => {
            (None, true, None, Some(subjects), Some(signature.to_vec()))
        }
        Response::Unique(u, signature) => (None, true, Some(u), None, Some(signature.to_vec())),
        other => unexpected("iris_search_round", &other),
    };
    if row.1 {
        release_round_buffers();
    }
    TableIterator::once(row)
}

/// Ends search `session_id` at this party; returns whether it was running.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_search_abort(session_id: &[u8]) -> bool {
    let request = Request::Abort {
        session: parse_session_id("iris_search_abort", "session_id", session_id),
    };
    let response = call(&request);
    release_round_buffers();
    match response {
        Response::Aborted(a) => a,
        other => unexpected("iris_search_abort", &other),
    }
}
