//! Face sessions over dealer-masked templates at P0 and P1 (docs/protocols/face.md §6
//! step 2; core's `face::masked`). The templates and the session's secrets live in the party
//! engine ([`crate::engine::face`]); these functions keep the single-use session ids in
//! `privmatch.face_sessions` (`masked = true`) and pass the messages through. The coordinator
//! drives them:
//!
//! 1. `face_masked_open(session, probe)` at P0: fixes the probe share and the compared
//!    templates and answers them. An identification (every opened template) answers their
//!    bundle ids and digest, then opens at P1 with P0's bundle ids (`expect_ids`), which P1
//!    must hold (else 40001). A verification (probe format 3: the verified subject is sealed
//!    inside the probe, and read only here, after opening) opens at P0 and P1 at once; each
//!    looks the subject's template up itself and answers no id, no digest and no subject, only
//!    `masked_probe`: X_b ‖ Y'_b (its probe share and its share of the template, each masked
//!    with a seed this party shares with P2 for the session; core's `verification_message`),
//!    sealed for the peer with its list digest, so the coordinator learns that a verification
//!    happened and nothing of whom (docs/protocols/face.md §14). Both commit before any
//!    round.
//! 2. `face_dealer_identify(session, ids)` at P2 (an identification), or
//!    `face_dealer_verify(session)` (a verification, dealt from the session id alone, at the
//!    same time as the opens): the two key halves, in chunks.
//! 3. `face_masked_keys(session, chunks)` at P0 and P1: X_b = x_b + δx_b sealed for the peer.
//!    A verification's message went out with its open, so its keys step and round 2 are one
//!    call, `face_masked_keyed_round(session, chunks, peer's message)`.
//! 4. `face_masked_round(session, 2, peer's X)`: the distance shares z_b sealed for the peer.
//! 5. `face_masked_round(session, 3, peer's z)`: this party's output shares (4 bytes per
//!    comparison) sealed to the reply key of the client's probe (core's `face::reply`,
//!    docs/protocols/face.md §13): the coordinator relays them to the client unread; the
//!    session ends.
//!
//! An identification may instead use a dealing made ahead of time (docs/protocols/face.md
//! §11): `face_dealer_stock(stock, ids)` at P2 and `face_masked_stock(stock, chunks)` at P0
//! and P1 keep it in the engines; `face_masked_open_stocked(session, probe, stock)` at P0 and
//! P1 (at once) opens the session and claims it when it was dealt for the compared list,
//! recording the claim in `privmatch.face_stock_used` (one session per stock id, ever); step 2
//! is skipped and step 3 gets no chunks.
//!
//! Aborts: `face_session_abort` (both kinds of session).

use pgrx::pg_sys;
use pgrx::prelude::*;
use privmatch_core::face::masked::BUNDLE_ID_LEN;
use privmatch_core::face::service::{OpenRequest, Opened};
use privmatch_core::face::FaceError;

use super::enroll::enrolled_dim;
use super::search::{fresh_session_probe, raise_probe_from};
use crate::engine::client::call_reply;
use crate::engine::face::messages::{
    decode_opened, encode_keyed_round, encode_keys, encode_open, encode_round, encode_stock,
    malformed_request,
};
use crate::engine::ipc::Request;
use crate::errors::{get_one, log_session, parse_session_id, raise, run, select};

const OPEN: &str = "face_masked_open";
const OPEN_STOCKED: &str = "face_masked_open_stocked";
const STOCK: &str = "face_masked_stock";
const KEYS: &str = "face_masked_keys";
const ROUND: &str = "face_masked_round";
const KEYED_ROUND: &str = "face_masked_keyed_round";

/// The bundle ids in `bytes` (16 each), or 22023 naming the argument.
fn parse_id_list(function: &str, argument: &str, bytes: &[u8]) -> Vec<[u8; BUNDLE_ID_LEN]> {
    if !bytes.len().is_multiple_of(BUNDLE_ID_LEN) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{function}: {argument} must be a multiple of {BUNDLE_ID_LEN} bytes (bundle ids), got {}",
                bytes.len()
            ),
            None,
        );
    }
    bytes
        .chunks_exact(BUNDLE_ID_LEN)
        .map(|c| {
            let mut id = [0u8; BUNDLE_ID_LEN];
            id.copy_from_slice(c);
            id
        })
        .collect()
}

/// The payload of the engine's answer to a face step (face replies carry no head).
fn engine_bytes(function: &str, request: &Request) -> Vec<u8> {
    call_reply(function, request).1
}

/// Opens masked face session `session` at this evaluator with its sealed `probe` (format 3):
/// a verification of the subject sealed inside it, or an identification against every
/// opened template. An identification answers the number of comparisons, the compared
/// bundle ids (concatenated) and the list's digest; at P1, `expect_ids` is P0's list (16
/// bytes per id, as P0's open answered it): P1 compares exactly that list or refuses
/// (40001). A verification (no `expect_ids`: 22023) answers the count (1), no ids, an empty
/// digest — nothing that names or identifies the subject — and `masked_probe`: this
/// evaluator's round-2 message X_b ‖ Y'_b sealed for the other evaluator (its probe share
/// and its share of the template, masked with seeds derived from what this party shares with
/// P2 for the session, docs/protocols/face.md §7). An identification answers it NULL.
/// Errors:
/// 23505 session id used, P0002 the verified subject is not enrolled (not named), 22023
/// dimension, 22P03 probe cannot be opened (also a probe of format 1 or 2), 40001 a compared
/// template is not opened here yet or the evaluators' lists differ for a moment.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn face_masked_open(
    session: &[u8],
    probe: &[u8],
    expect_ids: default!(Option<&[u8]>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(comparisons, i32),
        name!(bundle_ids, Vec<u8>),
        name!(digest, Vec<u8>),
        name!(masked_probe, Option<Vec<u8>>),
    ),
> {
    let expected = expect_ids.map(|b| parse_id_list(OPEN, "expect_ids", b));
    let (opened, verification) = open_session(OPEN, session, probe, expected, None, None);
    if verification {
        return TableIterator::once((
            opened.comparisons as i32,
            Vec::new(),
            Vec::new(),
            Some(opened.masked_probe),
        ));
    }
    TableIterator::once((
        opened.comparisons as i32,
        opened.ids.concat(),
        opened.digest.to_vec(),
        None,
    ))
}

/// Opens masked identification session `session` at this evaluator with its sealed `probe`
/// against every opened template, as `face_masked_open` with no subject, and claims the
/// dealing stocked under `stock` (docs/protocols/face.md §11) if this party holds it and it
/// was dealt for exactly the compared list. The claim is a row of
/// `privmatch.face_stock_used` committed with the session (a stock id serves one session,
/// ever: 23505 otherwise). Returns as `face_masked_open`, and `claimed`: whether the session
/// has its keys (then `face_masked_keys` takes no chunks); if not, the coordinator deals for
/// the session as usual. P0 and P1 may be called at once; the coordinator compares their
/// lists and claims. STRICT, like the overload with `known_list`.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn face_masked_open_stocked(
    session: &[u8],
    probe: &[u8],
    stock: &[u8],
) -> TableIterator<
    'static,
    (
        name!(comparisons, i32),
        name!(bundle_ids, Vec<u8>),
        name!(digest, Vec<u8>),
        name!(claimed, bool),
    ),
> {
    TableIterator::once(open_stocked(session, probe, stock, None))
}

/// `face_masked_open_stocked` with `known_list` (an overload, STRICT): the digest of the list
/// the caller knows already (the one the stock was dealt for; docs/protocols/face.md §12).
/// When the compared list has it, `bundle_ids` is answered empty (nothing of O(N) crosses on
/// the identification's path); another list is answered in full. Errors as the
/// three-argument form, and 22023 when `known_list` is not 32 bytes.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe, name = "face_masked_open_stocked")]
fn face_masked_open_stocked_known(
    session: &[u8],
    probe: &[u8],
    stock: &[u8],
    known_list: &[u8],
) -> TableIterator<
    'static,
    (
        name!(comparisons, i32),
        name!(bundle_ids, Vec<u8>),
        name!(digest, Vec<u8>),
        name!(claimed, bool),
    ),
> {
    let known = <[u8; 32]>::try_from(known_list).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{OPEN_STOCKED}: known_list must be a 32-byte list digest, got {} bytes",
                known_list.len()
            ),
            None,
        )
    });
    TableIterator::once(open_stocked(session, probe, stock, Some(known)))
}

/// One row of `face_masked_open_stocked`: comparisons, bundle ids, digest, claimed.
type OpenedStocked = (i32, Vec<u8>, Vec<u8>, bool);

/// The body of both `face_masked_open_stocked` forms.
fn open_stocked(
    session: &[u8],
    probe: &[u8],
    stock: &[u8],
    known: Option<[u8; 32]>,
) -> OpenedStocked {
    let stock = parse_session_id(OPEN_STOCKED, "stock", stock);
    let (opened, _) = open_session(OPEN_STOCKED, session, probe, None, Some(stock), known);
    if opened.claimed {
        run(
            OPEN_STOCKED,
            "INSERT INTO privmatch.face_stock_used (stock, session) VALUES ($1, $2)",
            &[stock.to_vec().into(), session.into()],
        );
    }
    (
        opened.comparisons as i32,
        opened.ids.concat(),
        opened.digest.to_vec(),
        opened.claimed,
    )
}

/// Keeps P2's dealing sealed under stock id `stock` (`chunks`: this party's envelopes of
/// `face_dealer_stock`, in chunk order) in this evaluator's engine for a later
/// `face_masked_open_stocked` (docs/protocols/face.md §11). The engine keeps at most a few
/// (the oldest are dropped) and loses them in a restart: they are a cache, the claims are
/// durable. Returns how many stocked dealings the engine holds. Errors: 23505 the stock id was
/// claimed already, 08P01 the half was refused (not sealed by P2 for this stock id and party),
/// 22023 bad arguments.
#[pg_extern(volatile, parallel_unsafe)]
fn face_masked_stock(stock: &[u8], chunks: Array<'_, &[u8]>) -> i32 {
    let id = parse_session_id(STOCK, "stock", stock);
    let chunks = parse_chunks(STOCK, chunks.iter());
    let used = get_one::<bool>(
        STOCK,
        "SELECT EXISTS (SELECT 1 FROM privmatch.face_stock_used WHERE stock = $1)",
        &[stock.into()],
    )
    .unwrap_or(false);
    if used {
        raise(
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            format!(
                "{STOCK}: stocked dealing {} was claimed by a session already: stock ids are single-use",
                hex::encode(id)
            ),
            None,
        );
    }
    let held = engine_bytes(STOCK, &encode_stock(&id, &chunks));
    held.try_into()
        .map(|b: [u8; 4]| u32::from_le_bytes(b) as i32)
        .unwrap_or_else(|_| {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("{STOCK}: the engine answered a malformed count"),
                None,
            )
        })
}

/// The chunks of a dealing, each non-NULL, at least one (22023/22004 naming the argument).
fn parse_chunks<'d>(
    function: &str,
    chunks: impl Iterator<Item = Option<&'d [u8]>>,
) -> Vec<&'d [u8]> {
    let chunks: Vec<&[u8]> = chunks
        .enumerate()
        .map(|(i, c)| {
            c.unwrap_or_else(|| {
                raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("{function}: chunks[{}] is NULL", i + 1),
                    None,
                )
            })
        })
        .collect();
    if chunks.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: chunks is empty"),
            None,
        );
    }
    chunks
}

/// The open of a masked session (`face_masked_open`, `face_masked_open_stocked`): checks the
/// probe, fixes the compared list in the engine (claiming `stock` there if it fits), records
/// the single-use session id, and answers what the engine opened and whether the probe is a
/// verification's (its subject was sealed in it: the coordinator never names it).
fn open_session(
    function: &str,
    session: &[u8],
    probe: &[u8],
    expected: Option<Vec<[u8; BUNDLE_ID_LEN]>>,
    stock: Option<[u8; 16]>,
    known: Option<[u8; 32]>,
) -> (Opened, bool) {
    let (id, opened) = fresh_session_probe(function, session, probe);
    let (share, reply_key, subject, known_subjects) = (
        opened.share,
        opened.reply_key,
        opened.target,
        opened.known_subjects,
    );
    let subject = subject.as_deref();
    if subject.is_some() && (expected.is_some() || stock.is_some()) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: the probe was sealed for a verification, which takes no expect_ids and no stocked dealing"),
            Some("a verification opens at P0 and P1 with face_masked_open(session, probe) each; P2 deals with face_dealer_verify"),
        );
    }
    let dim = share.elements.len();
    if let Some(enrolled) = enrolled_dim(function) {
        if enrolled != dim {
            raise_probe_from(
                function,
                FaceError::WrongDimension {
                    expected: enrolled,
                    got: dim,
                },
            );
        }
    }
    let wanted = match subject {
        Some(s) => {
            let ids: Vec<[u8; BUNDLE_ID_LEN]> = select(
                function,
                "SELECT bundle_id FROM privmatch.face_templates WHERE subject = $1",
                &[s.into()],
                |row| row.get::<Vec<u8>>(1).unwrap_or_default(),
            )
            .into_iter()
            .filter_map(|b| b.try_into().ok())
            .collect();
            if ids.is_empty() {
                // The subject is not named: this message reaches the coordinator.
                raise(
                    PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
                    format!("{function}: the verified subject has no enrolled face template"),
                    None,
                );
            }
            Some(ids)
        }
        None => expected,
    };
    let request = encode_open(&OpenRequest {
        session: id,
        probe: share,
        reply_key,
        wanted,
        stock,
        known,
        verification: subject.is_some(),
        known_subjects,
    });
    let opened = decode_opened(&engine_bytes(function, &request)).unwrap_or_else(|e| {
        let e = malformed_request(e);
        raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, e.message, None)
    });
    log_session(function, &id, "opened");
    let finished = opened.comparisons == 0;
    run(
        function,
        "INSERT INTO privmatch.face_sessions \
         (session, dim, set_digest, round, finished_at, target, masked) \
         VALUES ($1, $2, $3, $4, CASE WHEN $5 THEN now() END, $6, true)",
        &[
            session.into(),
            (dim as i32).into(),
            opened.digest.to_vec().into(),
            (if finished { 3 } else { 0 }).into(),
            finished.into(),
            subject.into(),
        ],
    );
    (opened, subject.is_some())
}

/// Checks masked session `session` before one of its steps (1 keys, 2 and 3 rounds): it must have
/// been opened (and committed) in an earlier transaction and be running. The order of the
/// steps is the engine's to enforce (it holds the session and runs each step once); the row
/// is only read, so steps 1 and 2 write nothing here (no WAL flush on their path).
fn check_masked(function: &str, session: &[u8]) {
    let row = select(
        function,
        "SELECT aborted, finished_at IS NOT NULL, masked, xmin::text \
           FROM privmatch.face_sessions WHERE session = $1",
        &[session.into()],
        |row| {
            (
                row.get::<bool>(1).unwrap_or_default(),
                row.get::<bool>(2).unwrap_or_default(),
                row.get::<bool>(3).unwrap_or_default(),
                row.get::<String>(4).unwrap_or_default(),
            )
        },
    )
    .into_iter()
    .next();
    let not_running = |why: &str| -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("{function}: face session {} {why}", hex::encode(session)),
            None,
        )
    };
    let Some((aborted, finished, masked, xmin)) = row else {
        not_running("is not running at this party");
    };
    if !masked {
        not_running("is a session of the face key pool retired in 0.13.0");
    }
    // Committed by an earlier transaction: were it opened in this one, a rollback after this
    // step would free the session id after values derived from its keys had left the party.
    let created_here = xmin
        .parse::<u32>()
        .map(|xid| {
            // SAFETY: called on the backend's main thread inside this function's transaction;
            // it only compares `xid` with this transaction's ids.
            unsafe { pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xid)) }
        })
        .unwrap_or(true);
    if created_here {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function}: face session {} was opened in this transaction: commit face_masked_open first",
                hex::encode(session)
            ),
            None,
        );
    }
    if aborted {
        not_running("was aborted");
    }
    if finished {
        not_running("has finished");
    }
}

/// Records that masked session `session` finished. Its id was made durable at the open; this
/// mark is bookkeeping, so the commit does not wait for the WAL flush.
fn save_finished(function: &str, session: &[u8]) {
    run(function, "SET LOCAL synchronous_commit TO off", &[]);
    run(
        function,
        "UPDATE privmatch.face_sessions SET round = 3, finished_at = now() WHERE session = $1",
        &[session.into()],
    );
}

/// Gives masked session `session` its key half from the dealer P2 (`chunks`: this party's
/// envelopes of `face_dealer_identify`, in chunk order; an empty array: the stocked dealing
/// `face_masked_open_stocked` claimed) and returns the sealed masked probe vector X_b for the
/// other evaluator — an empty bytea for a verification, whose X_b went out with its open
/// (the keys must be dealt for the probe mask it used, else 08P01). Errors: 42704 not running, 55000 out of order, 08P01
/// the half was refused (another session or list, not sealed by P2).
#[pg_extern(volatile, parallel_unsafe)]
fn face_masked_keys(session: &[u8], chunks: Array<'_, &[u8]>) -> Vec<u8> {
    let id = parse_session_id(KEYS, "session", session);
    // No chunks: the stocked dealing the open claimed (the engine refuses when none was).
    let chunks = if chunks.is_empty() {
        Vec::new()
    } else {
        parse_chunks(KEYS, chunks.iter())
    };
    check_masked(KEYS, session);
    engine_bytes(KEYS, &encode_keys(&id, &chunks))
}

/// A verification's keys step and round 2 in one call (docs/protocols/face.md §7): gives
/// masked session `session` its key half from P2 (`chunks`, this party's envelopes of
/// `face_dealer_verify`, in chunk order) and runs round 2 with the other evaluator's message
/// of the open (`inbound`); returns the sealed distance shares, as `face_masked_round(session,
/// 2, inbound)` would. Its masked vectors went out with the open, so nothing needs to leave
/// between the two steps: one statement and one engine request instead of two. Errors as
/// `face_masked_keys` and `face_masked_round`, and 22023 for an identification (its keys step
/// answers the masked probe the peer needs first) or no chunks.
#[pg_extern(volatile, parallel_unsafe)]
fn face_masked_keyed_round(session: &[u8], chunks: Array<'_, &[u8]>, inbound: &[u8]) -> Vec<u8> {
    let id = parse_session_id(KEYED_ROUND, "session", session);
    if chunks.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{KEYED_ROUND}: chunks is empty: a verification's keys come from face_dealer_verify"),
            None,
        );
    }
    let chunks = parse_chunks(KEYED_ROUND, chunks.iter());
    check_masked(KEYED_ROUND, session);
    let reply = engine_bytes(KEYED_ROUND, &encode_keyed_round(&id, &chunks, inbound));
    pg_sys::check_for_interrupts!();
    reply
}

/// Runs round 2 (the other evaluator's masked probe vector → this party's sealed distance
/// shares) or 3 (the other's distance shares → this party's output shares, 4 bytes per
/// comparison, sealed to the reply key of the client's probe: only the client opens them;
/// the session ends) of masked session `session`. Errors: 42704 not running,
/// 55000 out of order, 08P01 refused message, 22023 bad arguments.
#[pg_extern(volatile, parallel_unsafe)]
fn face_masked_round(session: &[u8], round: i32, inbound: &[u8]) -> Vec<u8> {
    let id = parse_session_id(ROUND, "session", session);
    if !(2..=3).contains(&round) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{ROUND}: round must be 2 or 3, got {round} (face_masked_keys is step 1)"),
            None,
        );
    }
    check_masked(ROUND, session);
    let reply = engine_bytes(ROUND, &encode_round(&id, round as u8, inbound));
    if round == 3 {
        save_finished(ROUND, session);
        log_session(ROUND, &id, "finished");
    }
    pg_sys::check_for_interrupts!();
    reply
}
