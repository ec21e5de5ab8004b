//! SQL functions of one party for the rounds of an iris search (Bloemen et al., ePrint
//! 2024/705, as driven by the coordinator). Each call is forwarded to the engine worker
//! (`crate::engine`), which keeps the search's state between calls; these functions only
//! validate arguments and convert types. The search parameters (mode, rotation range,
//! threshold) travel only sealed in the client's probe; the engine opens it and refuses a
//! threshold other than this party's policy (`iris_policy()`), which this function reads and
//! hands to it.
//!
//! A search: `iris_search_start` at the three parties (same session id, each with its own
//! sealed probe) → `(entries, set_digest, message)`; then round k = 0, 1, … at
//! every party with the message party i−1 returned → the next message for party i+1, until
//! `finished`, with this party's output signed and sealed to the client's reply key
//! (`sealed_output`; core's `iris::output`). `iris_search_abort` ends a search early.
//!
//! The search is charged to this party's `iris-search` budget by the engine worker, in a
//! transaction of its own committed before the start is answered (`crate::engine::iris`,
//! `charge_search`): rolling back the caller's transaction does not undo it.

use pgrx::prelude::*;
use privmatch_core::iris::probe::{IRIS_PROBE_PURPOSE, PROBE_LIFETIME_SECS};
use privmatch_core::iris::service::SearchError;

use crate::budget::BudgetKind;
use crate::clients;
use crate::engine::client::{call_reply, release_round_buffers};
use crate::engine::iris::messages::{IrisCall, IrisReply};
use crate::errors::{get_one, log_session, parse_session_id, raise, run};
use crate::identity::load_identity;
use crate::iris::policy::current_policy;

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

/// Sends `call` to the engine's iris service and reads its reply; raises on an engine error
/// or a reply that does not decode.
fn call_iris(function: &str, call: IrisCall<'_>) -> IrisReply {
    let (head, payload) = call_reply(function, &call.into_request());
    IrisReply::from_reply(&head, payload).unwrap_or_else(|e| unexpected(function, &e))
}

fn unexpected(function: &str, what: &dyn std::fmt::Debug) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("{function}: unexpected engine reply {what:?}"),
        None,
    )
}

/// Starts search `session_id` at this party with its sealed `probe`: brings the engine up to
/// date with the template table, scans the templates of the probe's eye and returns the
/// number searched, the digest of the searched set and the first message (for party i+1).
/// The search's mode, rotation range and threshold are those sealed in the probe; a threshold
/// other than this party's policy (`iris_policy()`) is refused with 22023, as is a stale
/// probe.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_search_start(
    session_id: &[u8],
    probe: &[u8],
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
    // The threshold is deployment policy (attack: a caller bisecting a distance with searches
    // at thresholds of its choice): the engine refuses a probe sealed with another one.
    let policy = current_policy(F);
    // The per-party query budget is charged by the engine, after the arguments are checked
    // and before the probe is opened, in a transaction of its own that it commits first (a
    // search past it is refused with 53400, whoever calls; a rollback here keeps the charge).
    // A registered client's signature, nonce and expiry are checked before the engine opens
    // anything, and the client's own budget is charged (the party-wide one is the engine's).
    let admitted = clients::admit(
        F,
        "probe",
        IRIS_PROBE_PURPOSE,
        load_identity().index,
        probe,
        Some(BudgetKind::IrisSearch),
    );
    record_session(&session);
    log_session(F, &session, "started");
    let request = IrisCall::Start {
        session,
        probe: admitted.inner.to_vec(),
        policy,
    };
    match call_iris("iris_search_start", request) {
        IrisReply::Started {
            entries,
            digest,
            message,
        } => TableIterator::once((entries as i64, digest.to_vec(), message)),
        other => unexpected("iris_search_start", &other),
    }
}

/// Runs round `round` of search `session_id` with the message party i−1 returned. Returns
/// the next message (for party i+1) with `finished = false`, or the output with
/// `finished = true`: `sealed_output`, this party's output (the matching subjects of the
/// probe's eye, or the uniqueness bit, bound to the session, parameters, eye and set digest)
/// signed with its Ed25519 key (derived from the party key file; the public half is
/// `party_info()`'s `signing_key`) and sealed to the reply key inside the client's probe
/// (core's `iris::output`): the caller relays it to the client and cannot read it.
/// `disclosed_unique` is the uniqueness bit in the clear, only when the client's probe allowed
/// it (enroll-if-unique, whose coordinator must know whether to enrol); NULL otherwise. Any
/// refused message aborts the search.
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
        name!(sealed_output, Option<Vec<u8>>),
        name!(disclosed_unique, Option<bool>),
    ),
> {
    let round = u32::try_from(round).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("iris_search_round: round must be ≥ 0, got {round}"),
            None,
        )
    });
    let session = parse_session_id("iris_search_round", "session_id", session_id);
    let request = IrisCall::Round {
        session,
        round,
        message: std::borrow::Cow::Borrowed(message),
    };
    let row = match call_iris("iris_search_round", request) {
        IrisReply::Continue(m) => (Some(m), false, None, None),
        IrisReply::Finished {
            sealed,
            disclosed_unique,
        } => (None, true, Some(sealed), disclosed_unique),
        other => unexpected("iris_search_round", &other),
    };
    if row.1 {
        release_round_buffers();
        log_session("iris_search_round", &session, "finished");
    }
    TableIterator::once(row)
}

/// Ends search `session_id` at this party; returns whether it was running.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_search_abort(session_id: &[u8]) -> bool {
    let request = IrisCall::Abort {
        session: parse_session_id("iris_search_abort", "session_id", session_id),
    };
    let response = call_iris("iris_search_abort", request);
    release_round_buffers();
    match response {
        IrisReply::Aborted(a) => a,
        other => unexpected("iris_search_abort", &other),
    }
}
