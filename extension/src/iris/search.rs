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

use pgrx::datum::Array;
use pgrx::prelude::*;
use privmatch_core::iris::binding::check_envelope_hashes;
use privmatch_core::iris::enroll::{Eye, IRIS_ENROLL_PURPOSE};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{IRIS_PROBE_PURPOSE, PROBE_LIFETIME_SECS};
use privmatch_core::iris::service::{SearchError, MAX_BATCH_PROBES};
use privmatch_core::party::PartyIndex;

use crate::budget::BudgetKind;
use crate::clients;
use crate::engine::client::{call_reply, release_round_buffers, sqlstate_of};
use crate::engine::iris::messages::{IrisCall, IrisReply};
use crate::errors::{
    get_one, in_subtransaction, log_session, parse_session_id, raise, run, CaughtRefusal,
};
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

/// Starts a batch of searches at this party (docs/protocols/iris.md, "Batches"): searches
/// the coordinator grouped because their callers declared the same `mode`, `max_rotation`
/// and `eye` (the threshold is this party's policy, `iris_policy()`), each with its own client-drawn session id (`session_ids[k]`) and
/// sealed probe (`probes[k]`). Every probe is admitted as `iris_search_start` admits one
/// (client signature and budget, its session id recorded as used), each in a subtransaction
/// of its own, and then opened and checked by the engine, which also refuses a probe sealed
/// with other parameters or another eye than declared: **a refused probe is refused alone**
/// (`refused_sqlstate[k]`, `refused[k]`; NULL where accepted) and the batch runs on without
/// it (a zero share holds its place). The engine scans the templates of `eye` once for all
/// probes. Returns the number searched, the set digest and the first message, as
/// `iris_search_start`. Refused as a whole (22023) for malformed arguments, no probe or more
/// than 64, arrays of different lengths, or a batch too large for the engine; a spent party
/// budget (53400) too.
// The row type must be spelled out inline for pgrx's SQL generation.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn iris_batch_start(
    batch_id: &[u8],
    mode: &str,
    max_rotation: i32,
    eye: &str,
    session_ids: Array<'_, &[u8]>,
    probes: Array<'_, &[u8]>,
) -> TableIterator<
    'static,
    (
        name!(entries, i64),
        name!(set_digest, Vec<u8>),
        name!(message, Vec<u8>),
        name!(refused_sqlstate, Vec<Option<String>>),
        name!(refused, Vec<Option<String>>),
    ),
> {
    const F: &str = "iris_batch_start";
    let mode = SearchMode::parse(mode).unwrap_or_else(|e| bad_argument(format!("{F}: {e}")));
    start_batch(
        F,
        BatchArguments {
            batch_id,
            mode,
            max_rotation,
            eye,
            session_ids: session_ids.iter().collect(),
            probes: probes.iter().collect(),
            enrolments: None,
        },
    )
}

/// Starts a batch of enrol-if-unique requests at this party (docs/protocols/iris.md,
/// "In-batch uniqueness"), inside the coordinator's distributed transaction, which holds the
/// template table's lock: as `iris_batch_start` in uniqueness mode, and request k also
/// brings its record's sealed enrolment envelope (`envelopes[k]`, one record of `eye`) and
/// envelope hashes (`envelope_hashes[k]`, h0 ‖ h1 ‖ h2 as for `iris_enroll_sealed`). Each
/// envelope is admitted as `iris_enroll_sealed` admits one (client signature, this party's
/// slot of the hashes) in request k's subtransaction, so a bad envelope refuses its request
/// alone. The engine compares probe k with the enrolled templates **and with the records of
/// requests 0..k−1** inside the MPC (the earlier request wins): of two requests of one person
/// in a batch at most the earlier is unique. A record takes part only with its own probe,
/// admitted here and naming the record's enrolment id; a request refused here, for its probe
/// or its envelope, leaves a zero row (refused at every party, a row that matches nothing).
/// Nothing is enrolled here: the coordinator enrols the unique ones (`iris_enroll_sealed`) in
/// the same transaction.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn iris_batch_enroll_start(
    batch_id: &[u8],
    max_rotation: i32,
    eye: &str,
    session_ids: Array<'_, &[u8]>,
    probes: Array<'_, &[u8]>,
    envelopes: Array<'_, &[u8]>,
    envelope_hashes: Array<'_, &[u8]>,
) -> TableIterator<
    'static,
    (
        name!(entries, i64),
        name!(set_digest, Vec<u8>),
        name!(message, Vec<u8>),
        name!(refused_sqlstate, Vec<Option<String>>),
        name!(refused, Vec<Option<String>>),
    ),
> {
    const F: &str = "iris_batch_enroll_start";
    let envelopes: Vec<Option<&[u8]>> = envelopes.iter().collect();
    let hashes: Vec<Option<&[u8]>> = envelope_hashes.iter().collect();
    if envelopes.len() != probes.len() || hashes.len() != probes.len() {
        bad_argument(format!(
            "{F}: {} envelopes and {} envelope_hashes for {} probes: one of each per probe",
            envelopes.len(),
            hashes.len(),
            probes.len()
        ));
    }
    start_batch(
        F,
        BatchArguments {
            batch_id,
            mode: SearchMode::Uniqueness,
            max_rotation,
            eye,
            session_ids: session_ids.iter().collect(),
            probes: probes.iter().collect(),
            enrolments: Some((envelopes, hashes)),
        },
    )
}

/// Raises 22023 with `message`.
fn bad_argument(message: String) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        message,
        None,
    )
}

/// A `bytea[]` argument, element by element (NULL elements as None).
type SqlBytes<'a> = Vec<Option<&'a [u8]>>;

/// The arguments of a batch start, as the SQL functions took them.
struct BatchArguments<'a> {
    batch_id: &'a [u8],
    mode: SearchMode,
    max_rotation: i32,
    eye: &'a str,
    session_ids: Vec<Option<&'a [u8]>>,
    probes: Vec<Option<&'a [u8]>>,
    /// For an enrolment batch: per probe, the relayed envelope and its hashes.
    enrolments: Option<(SqlBytes<'a>, SqlBytes<'a>)>,
}

/// What one request of a batch brings to the engine once admitted: its session id, its
/// probe inside the client's signature, and for an enrolment batch its envelope (inside the
/// signature) and hashes.
type Admission = ([u8; 16], Vec<u8>, Option<(Vec<u8>, Vec<u8>)>);

/// Admits request `k` of an enrolment batch's envelope: client signature (single use by its
/// bundle ids, no budget) and this party's slot of its hashes.
fn admit_envelope(f: &str, k: usize, me: PartyIndex, envelope: &[u8], hashes: &[u8]) -> Vec<u8> {
    let argument = format!("envelopes #{k}");
    let inner = clients::admit_single_use(f, &argument, IRIS_ENROLL_PURPOSE, me, envelope).inner;
    if let Err(e) = check_envelope_hashes(me, envelope, hashes) {
        bad_argument(format!("{f}: envelope_hashes #{k}: {e}"));
    }
    inner.to_vec()
}

/// The common body of `iris_batch_start` and `iris_batch_enroll_start`.
#[allow(clippy::type_complexity)]
fn start_batch(
    f: &str,
    args: BatchArguments<'_>,
) -> TableIterator<
    'static,
    (
        name!(entries, i64),
        name!(set_digest, Vec<u8>),
        name!(message, Vec<u8>),
        name!(refused_sqlstate, Vec<Option<String>>),
        name!(refused, Vec<Option<String>>),
    ),
> {
    let batch = parse_session_id(f, "batch_id", args.batch_id);
    let policy = current_policy(f);
    let params = SearchParams::new(args.mode, args.max_rotation, policy.ratio())
        .unwrap_or_else(|e| bad_argument(format!("{f}: {e}")));
    let eye =
        Eye::parse(args.eye).unwrap_or_else(|e| bad_argument(format!("{f}: argument eye: {e}")));
    let (session_ids, probes) = (args.session_ids, args.probes);
    if session_ids.len() != probes.len() {
        bad_argument(format!(
            "{f}: {} session ids for {} probes: one session id per probe",
            session_ids.len(),
            probes.len()
        ));
    }
    if probes.is_empty() || probes.len() > MAX_BATCH_PROBES {
        bad_argument(SearchError::BatchSize(probes.len()).to_string());
    }
    let me = load_identity().index;
    let mut admitted: Vec<Admission> = Vec::with_capacity(probes.len());
    let mut refused: Vec<Option<CaughtRefusal>> = Vec::with_capacity(probes.len());
    for (k, (id, probe)) in session_ids.iter().zip(&probes).enumerate() {
        let id = parse_session_id(f, "session_ids", id.unwrap_or_default());
        let probe = probe.unwrap_or_default();
        // An enrolment's record takes part in the later probes' comparisons (entry N + k)
        // only with its own probe admitted here and naming it (the engine checks the name):
        // a refusal of either refuses the request and makes its row a zero share
        // (docs/protocols/iris.md §13.4). Its hashes are always the relayed ones: the batch
        // binds them at every party.
        let (record, record_refused) = match args.enrolments.as_ref() {
            None => (None, None),
            Some((envelopes, hashes)) => {
                let hashes = hashes[k].unwrap_or_default();
                let envelope = envelopes[k].unwrap_or_default();
                match in_subtransaction(|| admit_envelope(f, k, me, envelope, hashes)) {
                    Ok(inner) => (Some((inner, hashes.to_vec())), None),
                    // An empty envelope stands in: the engine refuses it too and puts a zero
                    // share in its row.
                    Err(why) => (Some((Vec::new(), hashes.to_vec())), Some(why)),
                }
            }
        };
        let inner = in_subtransaction(|| {
            let a = clients::admit(
                f,
                "probes",
                IRIS_PROBE_PURPOSE,
                me,
                probe,
                Some(BudgetKind::IrisSearch),
            );
            record_session(&id);
            a.inner.to_vec()
        });
        match (inner, record_refused) {
            (Ok(inner), None) => {
                // The search's own id, tied to its batch's: one search is followed from the
                // client's log through the batch's lines.
                log_session(f, &id, &format!("in batch {} at {k}", hex::encode(batch)));
                admitted.push((id, inner, record));
                refused.push(None);
            }
            (Err(why), _) | (Ok(_), Some(why)) => {
                log_session(f, &id, &format!("refused in batch at {k}"));
                admitted.push((id, Vec::new(), record));
                refused.push(Some(why));
            }
        }
    }
    log_session(f, &batch, &format!("started with {} probes", probes.len()));
    let mut enrolments = Vec::new();
    let probes = admitted
        .into_iter()
        .map(|(id, probe, enrolment)| {
            enrolments.extend(enrolment);
            (id, probe)
        })
        .collect();
    let request = IrisCall::BatchStart {
        batch,
        params,
        eye,
        probes,
        enrolments,
        policy,
    };
    match call_iris(f, request) {
        IrisReply::BatchStarted {
            entries,
            digest,
            message,
            refused: engine_refused,
        } => {
            // What the SQL layer refused stays the reason (the engine then refuses its empty
            // probe too).
            let (states, messages) = refused
                .into_iter()
                .zip(engine_refused)
                .map(|(sql, engine)| match (sql, engine) {
                    (Some(r), _) => (Some(r.sqlstate), Some(r.message)),
                    (None, Some(e)) => (Some(sqlstate_of(e.kind)), Some(e.message)),
                    (None, None) => (None, None),
                })
                .unzip();
            TableIterator::once((entries as i64, digest.to_vec(), message, states, messages))
        }
        other => unexpected(f, &other),
    }
}

/// Runs round `round` of batch `batch_id` with the message party i−1 returned: the next
/// message with `finished = false`, or with `finished = true` every probe's output in batch
/// order, signed and sealed to its own client as `iris_search_round` seals one
/// (`sealed_outputs[k]`; NULL for a probe refused at start), and its uniqueness bit where its
/// probe allowed it (`disclosed_unique[k]`). Any refused message aborts the batch.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn iris_batch_round(
    batch_id: &[u8],
    round: i32,
    message: &[u8],
) -> TableIterator<
    'static,
    (
        name!(message, Option<Vec<u8>>),
        name!(finished, bool),
        name!(sealed_outputs, Option<Vec<Option<Vec<u8>>>>),
        name!(disclosed_unique, Option<Vec<Option<bool>>>),
    ),
> {
    const F: &str = "iris_batch_round";
    let round = u32::try_from(round).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: round must be ≥ 0, got {round}"),
            None,
        )
    });
    let batch = parse_session_id(F, "batch_id", batch_id);
    let request = IrisCall::BatchRound {
        batch,
        round,
        message: std::borrow::Cow::Borrowed(message),
    };
    match call_iris(F, request) {
        IrisReply::Continue(m) => TableIterator::once((Some(m), false, None, None)),
        IrisReply::BatchFinished(outputs) => {
            release_round_buffers();
            log_session(F, &batch, "finished");
            let (sealed, disclosed): (Vec<_>, Vec<_>) = outputs
                .into_iter()
                .map(|o| match o {
                    Ok((sealed, disclosed)) => (Some(sealed), disclosed),
                    Err(_) => (None, None),
                })
                .unzip();
            TableIterator::once((None, true, Some(sealed), Some(disclosed)))
        }
        other => unexpected(F, &other),
    }
}
