//! Face comparison sessions at P0 and P1, what every session shares: the checks of its open
//! ([`fresh_session_probe`]: single-use session id, client admission, the sealed probe, the
//! query budget) and its abort (`face_session_abort`). The protocol's steps (open, keys,
//! rounds over dealer-masked templates) are in [`super::masked`]; docs/protocols/face.md.
//! Table `privmatch.face_sessions`: `sql/face.sql`.

use pgrx::prelude::*;
use privmatch_core::face::encoding::evaluator;
use privmatch_core::face::probe::{open_face_probe, OpenedProbe, FACE_PROBE_PURPOSE};
use privmatch_core::face::FaceError;

use super::raise_face;
use crate::budget::{self, BudgetKind};
use crate::clients;
use crate::errors::{get_one, parse_session_id, raise, OTHER_PARTY_HINT};
use crate::identity::load_identity;

/// Raises a probe that `function` cannot open (22P03, as for iris), that has the wrong
/// shape (22023) or that was sealed for another party or to keys that are not this party's
/// (22023 with a hint, as at enrolment).
pub(super) fn raise_probe_from(function: &str, err: FaceError) -> ! {
    let (code, hint) = match err {
        FaceError::WrongDimension { .. } | FaceError::UnsupportedDimension(_) => {
            (PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, None)
        }
        ref e if e.is_for_another_party() => (
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            Some(OTHER_PARTY_HINT),
        ),
        _ => (PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION, None),
    };
    raise(
        code,
        format!("{function}: the probe cannot be opened: {err}"),
        hint,
    )
}

/// The first checks of a face session's open at an evaluator, shared by every open
/// (verification, identification, stocked identification): the session id parses and was
/// never used here (23505), this party is P0 or P1 (55000), its sealed `probe` opens for this
/// session (22P03 / 22023; a probe of format version 1 or 2 is refused: 22P03) and the
/// party's query budget allows one more verification of the subject sealed in the probe, or
/// identification (53400). Returns the session id and the opened probe: its share, the reply
/// key the outputs are sealed to and its target (the verified subject, read here, after
/// opening: the coordinator never sees it). The one place an evaluator opens a client's
/// sealed probe at a session's open (core's `open_face_probe`).
pub(super) fn fresh_session_probe(
    function: &str,
    session: &[u8],
    probe: &[u8],
) -> ([u8; 16], OpenedProbe) {
    let id = parse_session_id(function, "session", session);
    let me = load_identity();
    evaluator(me.index).unwrap_or_else(|e| raise_face(function, e));
    let used = get_one::<bool>(
        function,
        "SELECT EXISTS (SELECT 1 FROM privmatch.face_sessions WHERE session = $1)",
        &[session.into()],
    )
    .unwrap_or(true);
    if used {
        raise(
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            format!(
                "{function}: session {} was already used: session ids are single-use",
                hex::encode(id)
            ),
            None,
        );
    }
    // A registered client's signature, nonce and expiry are checked before anything is
    // opened; its budget is charged once the probe says what it is.
    let admitted = clients::admit(function, "probe", FACE_PROBE_PURPOSE, me.index, probe, None);
    let opened = open_face_probe(me.index, &me.secret, &id, admitted.inner)
        .unwrap_or_else(|e| raise_probe_from(function, e));
    // Charged with the session's open, which commits before any later step may run.
    let kind = match opened.target.as_deref() {
        Some(s) => {
            budget::charge(function, BudgetKind::FaceVerify, s);
            BudgetKind::FaceVerify
        }
        None => {
            budget::charge(function, BudgetKind::FaceIdentify, "");
            BudgetKind::FaceIdentify
        }
    };
    admitted.charge(function, kind);
    (id, opened)
}

/// Aborts face session `session` at this party: no further step runs and the session's
/// secrets (its keys, its probe) are dropped from the engine.
/// Returns whether a running session was aborted.
#[pg_extern(volatile, parallel_unsafe)]
fn face_session_abort(session: &[u8]) -> bool {
    let id = parse_session_id("face_session_abort", "session", session);
    // Best effort: an engine that is down holds no session.
    let _ = crate::engine::client::try_call(&crate::engine::face::messages::encode_abort(&id));
    get_one::<bool>(
        "face_session_abort",
        "WITH s AS (UPDATE privmatch.face_sessions SET aborted = true, finished_at = now() \
          WHERE session = $1 AND finished_at IS NULL RETURNING 1) SELECT count(*) > 0 FROM s",
        &[session.into()],
    )
    .unwrap_or(false)
}
