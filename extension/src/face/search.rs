//! Face comparison sessions at P0 and P1: open (claim keys, fix the inputs), three rounds,
//! abort. Protocol steps: [`privmatch_core::face`]; the coordinator drives them:
//!
//! 1. `face_session_open` at P0 (claims fresh keys), then at P1 with P0's claims and template
//!    set digest (claims the same keys). Both commit before any key-derived value leaves.
//! 2. `face_session_round(s, 1)` at both → sealed masked inputs for the peer.
//! 3. `face_session_round(s, 2, peer's round-1 message)` → sealed distance share.
//! 4. `face_session_round(s, 3, peer's round-2 message)` → this party's output shares sealed
//!    to the reply key of the client's probe (core's `face::reply`, as on the dealer-masked
//!    path: docs/protocols/face.md §13.9); the client opens P0's and P1's and adds them.
//!
//! Rounds run strictly in order, each once; a refused message fails the call (SQLSTATE
//! 08P01) and the coordinator aborts the session. A session's keys are never released:
//! finished or aborted, they stay claimed. Table `privmatch.face_sessions`: `sql/face.sql`.

use std::collections::HashMap;

use pgrx::pg_sys;
use pgrx::prelude::*;
use privmatch_core::crypto::seal::Channel;
use privmatch_core::face::encoding::{evaluator, EmbeddingShare};
use privmatch_core::face::enroll::template_set_digest;
use privmatch_core::face::funshade::{
    bytes_to_words, distance_shares, masked_inputs, open_masked, sign_shares, words_to_bytes,
    KeySlice, COMPARISON_KEY_LEN,
};
use privmatch_core::face::probe::{
    channel_session, open_face_probe, OpenedProbe, FACE_PROBE_PURPOSE,
};
use privmatch_core::face::reply::{subjects_digest, ReplySealer};
use privmatch_core::face::{FaceError, Metric};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::{decode_share, ShareKind};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::enroll::enrolled_dim;
use super::pool::{
    claim_fresh, claim_given, decode_claims, encode_claims, pool_parameters, read_keys, Claim,
};
use super::raise_face;
use crate::budget::{self, BudgetKind};
use crate::clients;
use crate::errors::{
    get_one, modify, parse_session_id, raise, raise_share_layout, run, select, Row,
};
use crate::identity::{load_identity, pinned_peer, Identity};

const OPEN: &str = "face_session_open";
const ROUND: &str = "face_session_round";

/// Raises a probe that cannot be opened (22P03, as for iris) or has the wrong shape (22023).
fn raise_probe(err: FaceError) -> ! {
    raise_probe_from(OPEN, err)
}

/// [`raise_probe`] from `function`.
pub(super) fn raise_probe_from(function: &str, err: FaceError) -> ! {
    let code = match err {
        FaceError::WrongDimension { .. } | FaceError::UnsupportedDimension(_) => {
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
        }
        _ => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
    };
    raise(
        code,
        format!("{function}: the probe cannot be opened: {err}"),
        None,
    )
}

/// One compared template: its id here, subject and enrolment bundle id.
struct Compared {
    id: i64,
    subject: String,
    bundle_id: [u8; 16],
}

/// The templates a session compares, in comparison order.
fn compared_templates(subject: Option<&str>) -> Vec<Compared> {
    let compared = |row: &Row<'_, '_>| Compared {
        id: row.get::<i64>(1).unwrap_or_default(),
        subject: row.get::<String>(2).unwrap_or_default(),
        bundle_id: row
            .get::<Vec<u8>>(3)
            .and_then(|b| b.try_into().ok())
            .unwrap_or_default(),
    };
    match subject {
        Some(s) => select(
            OPEN,
            "SELECT id, subject, bundle_id FROM privmatch.face_templates WHERE subject = $1",
            &[s.into()],
            compared,
        ),
        None => select(
            OPEN,
            "SELECT id, subject, bundle_id FROM privmatch.face_templates \
             ORDER BY subject COLLATE \"C\"",
            &[],
            compared,
        ),
    }
}

/// The digest of a compared set (subjects and bundle ids, in order).
fn set_digest(templates: &[Compared]) -> [u8; 32] {
    let pairs: Vec<(&str, [u8; 16])> = templates
        .iter()
        .map(|t| (t.subject.as_str(), t.bundle_id))
        .collect();
    template_set_digest(&pairs)
}

/// Largest round-1 message an identification may need (8·l bytes per comparison); beyond it
/// a session is refused before any key is claimed.
const MAX_ROUND_MESSAGE: usize = 512 << 20;

/// The template set an identification would compare here: its size and digest (the same
/// digest `face_session_open` returns). The coordinator compares P0's and P1's before
/// opening an identification, so that a transient difference (an enrolment being committed)
/// costs no keys.
#[pg_extern(stable, parallel_safe)]
fn face_template_set() -> TableIterator<'static, (name!(templates, i64), name!(digest, Vec<u8>))> {
    let templates = compared_templates(None);
    TableIterator::once((templates.len() as i64, set_digest(&templates).to_vec()))
}

/// The first checks of a face session's open at an evaluator, shared by both kinds of
/// session: the session id parses and was never used here (23505), this party is P0 or P1
/// (55000), its sealed `probe` opens for this session (22P03 / 22023; a probe of format
/// version 1 or 2 is refused: 22P03) — and, when the caller names a `subject` (the retired
/// key-pool path's argument), was sealed for that subject (22P03) — and the party's query
/// budget allows one more verification of the subject sealed in the probe, or
/// identification (53400). Returns the session id and the opened probe: its share, the reply
/// key the outputs are sealed to and its target (the verified subject, read here, after
/// opening: the coordinator never sees it). The one place an evaluator opens a client's
/// sealed probe at a session's open (core's `open_face_probe`).
pub(super) fn fresh_session_probe(
    function: &str,
    session: &[u8],
    subject: Option<&str>,
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
    if subject.is_some() && subject != opened.target.as_deref() {
        raise_probe_from(function, FaceError::WrongTarget);
    }
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

/// Opens face comparison session `session` at this party (P0 or P1) with its sealed `probe`:
/// verification against the template of the subject sealed in the probe (probe format 3),
/// or identification against every enrolled template for an identification probe (in
/// subject order, byte-wise). `subject`, when given, must be the one sealed in the probe
/// (22P03 otherwise); it is not needed. Without `claims` this party
/// claims fresh keys from its pool (P0); with `claims` (P0's, passed on by the coordinator)
/// it claims exactly those keys, after checking that its template set digest equals
/// `expect_digest`. Returns the number of comparisons, the claims, `subjects` (always empty
/// since 0.12.0: the compared subjects reach the client inside the sealed output only) and
/// the set digest. Errors: 53000 pool exhausted, P0002 unknown subject, 22023 dimension
/// mismatch, 22P03 probe cannot be opened, 40001 template sets differ, 23P01 keys already
/// used, 23505 session id already used.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn face_session_open(
    session: &[u8],
    probe: &[u8],
    subject: default!(Option<&str>, "NULL"),
    claims: default!(Option<&[u8]>, "NULL"),
    expect_digest: default!(Option<&[u8]>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(comparisons, i32),
        name!(claims, Vec<u8>),
        name!(subjects, Vec<String>),
        name!(digest, Vec<u8>),
    ),
> {
    let (_, opened) = fresh_session_probe(OPEN, session, subject, probe);
    // The session keeps the sealed probe the party opens again in later rounds: the client's
    // signature around it was checked above and is not kept.
    let probe =
        privmatch_core::crypto::client_auth::unwrap(probe).map_or(probe, |(_, inner)| inner);
    let subject = opened.target.as_deref();
    let share = opened.share;
    let dim = share.elements.len();
    let Some((metric, key_dim, generation)) = pool_parameters(OPEN) else {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            format!("{OPEN}: the face key pool is empty"),
            Some("run privmatch face configure (once) and privmatch face refill"),
        );
    };
    if key_dim != dim {
        raise_probe(FaceError::WrongDimension {
            expected: key_dim,
            got: dim,
        });
    }
    if let Some(enrolled) = enrolled_dim(OPEN) {
        if enrolled != dim {
            raise_probe(FaceError::WrongDimension {
                expected: enrolled,
                got: dim,
            });
        }
    }
    let templates = compared_templates(subject);
    if subject.is_some() && templates.is_empty() {
        // Not named: the message reaches the coordinator, which must not learn the subject.
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("{OPEN}: the verified subject has no enrolled face template"),
            None,
        );
    }
    if templates.len().saturating_mul(8 * dim) > MAX_ROUND_MESSAGE {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "{OPEN}: an identification over {} templates of dimension {dim} exceeds this version's limit of {} comparisons per session",
                templates.len(),
                MAX_ROUND_MESSAGE / (8 * dim)
            ),
            None,
        );
    }
    let subjects: Vec<String> = templates.iter().map(|t| t.subject.clone()).collect();
    let digest = set_digest(&templates);
    if let Some(expected) = expect_digest {
        if expected != digest {
            raise(
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                format!(
                    "{OPEN}: this party compares {} templates whose set differs from the other evaluator's",
                    subjects.len()
                ),
                Some("an enrolment or deletion is in flight: retry with a new session"),
            );
        }
    }
    let chosen: Vec<Claim> = if templates.is_empty() {
        Vec::new()
    } else {
        match claims {
            None => claim_fresh(OPEN, session, templates.len(), generation),
            Some(bytes) => {
                let given = decode_claims(OPEN, bytes);
                let total: i64 = given.iter().map(|c| i64::from(c.count)).sum();
                if total != templates.len() as i64 {
                    raise(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        format!(
                            "{OPEN}: claims cover {total} keys, the session compares {}",
                            templates.len()
                        ),
                        None,
                    );
                }
                claim_given(OPEN, session, &given, generation);
                given
            }
        }
    };
    let claim_bytes = encode_claims(&chosen);
    let ids: Vec<i64> = templates.iter().map(|t| t.id).collect();
    let finished = ids.is_empty();
    run(
        OPEN,
        "INSERT INTO privmatch.face_sessions \
         (session, metric, dim, template_ids, set_digest, claims, probe, round, finished_at, target) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $9 THEN now() END, $10)",
        &[
            session.into(),
            metric.as_str().into(),
            (dim as i32).into(),
            ids.into(),
            digest.to_vec().into(),
            claim_bytes.clone().into(),
            (if finished { None } else { Some(probe) }).into(),
            (if finished { 3 } else { 0 }).into(),
            finished.into(),
            subject.into(),
        ],
    );
    TableIterator::once((
        subjects.len() as i32,
        claim_bytes,
        Vec::new(),
        digest.to_vec(),
    ))
}

/// A session's state, locked for the round.
struct SessionRow {
    metric: Metric,
    dim: usize,
    template_ids: Vec<i64>,
    digest: Vec<u8>,
    claims: Vec<u8>,
    probe: Vec<u8>,
    target: Option<String>,
    round: i32,
    z_share: Option<Vec<u8>>,
}

fn lock_session(session: &[u8]) -> SessionRow {
    let row = modify(
        ROUND,
        "SELECT metric, dim, template_ids, set_digest, claims, probe, round, z_share, \
                aborted, finished_at IS NOT NULL, xmin::text, target \
           FROM privmatch.face_sessions WHERE session = $1 FOR UPDATE",
        &[session.into()],
        |row| {
            (
                row.get::<String>(1).unwrap_or_default(),
                row.get::<i32>(2).unwrap_or_default(),
                row.get::<Vec<i64>>(3).unwrap_or_default(),
                row.get::<Vec<u8>>(4).unwrap_or_default(),
                row.get::<Vec<u8>>(5).unwrap_or_default(),
                row.get::<Vec<u8>>(6).unwrap_or_default(),
                row.get::<i32>(7).unwrap_or_default(),
                row.get::<Vec<u8>>(8),
                row.get::<bool>(9).unwrap_or_default(),
                row.get::<bool>(10).unwrap_or_default(),
                row.get::<String>(11).unwrap_or_default(),
                row.get::<String>(12),
            )
        },
    )
    .into_iter()
    .next();
    let not_running = |why: &str| -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("{ROUND}: face session {} {why}", hex::encode(session)),
            None,
        )
    };
    let Some((metric, dim, ids, digest, claims, probe, round, z, aborted, finished, xmin, target)) =
        row
    else {
        not_running("is not running at this party");
    };
    // The session (and its key claim) must have been committed by an earlier transaction:
    // were it opened in this one, a rollback after this round would return its keys to the
    // pool after key-derived values had left the party.
    let created_here = xmin
        .parse::<u32>()
        .map(|xid| {
            // SAFETY: called on the backend's main thread inside a transaction (this SQL
            // function's); the function only compares `xid` with this transaction's ids.
            unsafe { pg_sys::TransactionIdIsCurrentTransactionId(pg_sys::TransactionId::from(xid)) }
        })
        .unwrap_or(true);
    if created_here {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{ROUND}: face session {} was opened in this transaction: commit face_session_open before running rounds",
                hex::encode(session)
            ),
            Some("the keys of a session are bound to it only once its opening is committed"),
        );
    }
    if aborted {
        not_running("was aborted");
    }
    if finished {
        not_running("has finished");
    }
    SessionRow {
        metric: Metric::parse(&metric).unwrap_or_else(|e| raise_face(ROUND, e)),
        dim: dim as usize,
        template_ids: ids,
        digest,
        claims,
        probe,
        target,
        round,
        z_share: z,
    }
}

/// The session's templates, in comparison order; a template deleted since the session
/// opened fails the round.
fn load_templates(ids: &[i64], dim: usize) -> Vec<EmbeddingShare> {
    let mut by_id: HashMap<i64, (Vec<u8>, i32)> = select(
        ROUND,
        "SELECT id, privmatch.face_share_send(template), norm_share \
           FROM privmatch.face_templates WHERE id = ANY($1)",
        &[ids.to_vec().into()],
        |row| {
            let id = row.get::<i64>(1).unwrap_or_default();
            let bytes = row.get::<Vec<u8>>(2).unwrap_or_default();
            let norm = row.get::<i32>(3).unwrap_or_default();
            (id, (bytes, norm))
        },
    )
    .into_iter()
    .collect();
    ids.iter()
        .map(|id| {
            let Some((bytes, norm)) = by_id.remove(id) else {
                raise(
                    PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("{ROUND}: a compared template was deleted during the session"),
                    Some("start a new session"),
                );
            };
            let view = decode_share(ShareKind::FaceTemplate, &bytes)
                .unwrap_or_else(|e| raise_share_layout(e));
            let elements = view.words();
            if elements.len() != dim {
                raise_face(
                    ROUND,
                    FaceError::WrongDimension {
                        expected: dim,
                        got: elements.len(),
                    },
                );
            }
            EmbeddingShare {
                elements,
                norm: norm as u32,
            }
        })
        .collect()
}

/// The subjects of a session's templates, in comparison order; a template deleted since the
/// session opened fails the round.
fn compared_subjects(ids: &[i64]) -> Vec<String> {
    let subjects = select(
        ROUND,
        "SELECT t.subject FROM unnest($1::bigint[]) WITH ORDINALITY AS c(id, n) \
           JOIN privmatch.face_templates t ON t.id = c.id ORDER BY c.n",
        &[ids.to_vec().into()],
        |row| row.get::<String>(1).unwrap_or_default(),
    );
    if subjects.len() != ids.len() {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{ROUND}: a compared template was deleted during the session"),
            Some("start a new session"),
        );
    }
    subjects
}

fn channel(me: &Identity, session: &[u8; 16], row: &SessionRow) -> Channel {
    let peer = PartyIndex::ALL[1 - evaluator(me.index).unwrap_or_else(|e| raise_face(ROUND, e))];
    let peer_key = pinned_peer(ROUND, peer);
    let secrets = crate::identity::CHANNELS
        .derive(me.index, &me.secret, peer, &peer_key)
        .unwrap_or_else(|e| raise_face(ROUND, FaceError::Seal(e)));
    secrets.channel(channel_session(
        session,
        &row.claims,
        &row.digest,
        row.metric,
        row.dim,
    ))
}

fn refused(round: i32, err: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
        format!("{ROUND}: round {round}: the peer's message was refused: {err}"),
        Some("the coordinator aborts the session; start a new one"),
    )
}

fn save_round(session: &[u8], round: i32, z_share: Option<Vec<u8>>) {
    run(
        ROUND,
        "UPDATE privmatch.face_sessions SET round = $2, z_share = $3, \
                probe = CASE WHEN $2 = 3 THEN NULL ELSE probe END, \
                finished_at = CASE WHEN $2 = 3 THEN now() END \
          WHERE session = $1",
        &[session.into(), round.into(), z_share.into()],
    );
}

/// Runs round `round` (1, 2 or 3) of face session `session` at this party. Round 1 takes no
/// inbound message and returns the sealed masked inputs for the other evaluator; round 2
/// takes the other's round-1 message and returns the sealed distance shares; round 3 takes
/// the other's round-2 message and returns this party's output shares (4 bytes per
/// comparison, in the order of the subjects `face_session_open` returned) sealed to the
/// reply key of the client's probe (core's `face::reply`: only the client opens them), and
/// ends the session. Errors: 42704 session not running (unknown, aborted,
/// finished), 55000 round out of order, 08P01 refused message, 22023 bad arguments.
#[pg_extern(volatile, parallel_unsafe)]
fn face_session_round(
    session: &[u8],
    round: i32,
    inbound: default!(Option<&[u8]>, "NULL"),
) -> Vec<u8> {
    let id = parse_session_id(ROUND, "session", session);
    if !(1..=3).contains(&round) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{ROUND}: round must be 1, 2 or 3, got {round}"),
            None,
        );
    }
    if (round == 1) != inbound.is_none() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{ROUND}: round {round} {}",
                if round == 1 {
                    "takes no inbound message"
                } else {
                    "needs the other evaluator's message"
                }
            ),
            None,
        );
    }
    let me = load_identity();
    let b = evaluator(me.index).unwrap_or_else(|e| raise_face(ROUND, e));
    let row = lock_session(session);
    if row.round != round - 1 {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{ROUND}: round {round} is out of order: face session {} has completed round {}",
                hex::encode(id),
                row.round
            ),
            None,
        );
    }
    let keys_bytes = read_keys(
        ROUND,
        &decode_claims(ROUND, &row.claims),
        COMPARISON_KEY_LEN,
    );
    let keys = KeySlice::new(&keys_bytes).unwrap_or_else(|e| raise_face(ROUND, e));
    let mut channel = channel(&me, &id, &row);
    let mut rng = ChaCha20Rng::from_entropy();
    let output = match round {
        1 => {
            let probe = open_face_probe(me.index, &me.secret, &id, &row.probe)
                .unwrap_or_else(|e| raise_face(ROUND, e))
                .share;
            let templates = load_templates(&row.template_ids, row.dim);
            let refs: Vec<&EmbeddingShare> = templates.iter().collect();
            let words =
                masked_inputs(&keys, &probe, &refs).unwrap_or_else(|e| raise_face(ROUND, e));
            save_round(session, 1, None);
            channel.seal(1, &words_to_bytes(&words), &mut rng)
        }
        2 => {
            let message = inbound.unwrap_or_default();
            let plain = channel
                .open(1, message)
                .unwrap_or_else(|e| refused(round, e));
            let peer = bytes_to_words(&plain).unwrap_or_else(|e| refused(round, e));
            let probe = open_face_probe(me.index, &me.secret, &id, &row.probe)
                .unwrap_or_else(|e| raise_face(ROUND, e))
                .share;
            let templates = load_templates(&row.template_ids, row.dim);
            let refs: Vec<&EmbeddingShare> = templates.iter().collect();
            let z = distance_shares(b, row.metric, &keys, &probe, &refs, &peer)
                .unwrap_or_else(|e| refused(round, e));
            let z_bytes = words_to_bytes(&z);
            save_round(session, 2, Some(z_bytes.clone()));
            channel.seal(2, &z_bytes, &mut rng)
        }
        _ => {
            let message = inbound.unwrap_or_default();
            let plain = channel
                .open(2, message)
                .unwrap_or_else(|e| refused(round, e));
            let peer = bytes_to_words(&plain).unwrap_or_else(|e| refused(round, e));
            let own = bytes_to_words(row.z_share.as_deref().unwrap_or_default())
                .unwrap_or_else(|e| raise_face(ROUND, e));
            let z = open_masked(&own, &peer).unwrap_or_else(|e| refused(round, e));
            let o = sign_shares(b, &keys, &z).unwrap_or_else(|e| raise_face(ROUND, e));
            // Sealed to the client's reply key (inside its sealed probe, kept until now), bound
            // to the compared subjects: the coordinator relays it and cannot add the two.
            let reply_key = open_face_probe(me.index, &me.secret, &id, &row.probe)
                .unwrap_or_else(|e| raise_face(ROUND, e))
                .reply_key;
            let sealer = ReplySealer::new(me.index, &me.secret, &reply_key, &id)
                .unwrap_or_else(|e| raise_face(ROUND, e));
            let digest: [u8; 32] = row.digest.as_slice().try_into().unwrap_or([0; 32]);
            let subjects = compared_subjects(&row.template_ids);
            let named = subjects_digest(subjects.iter().map(String::as_str));
            // An identification lists its subjects inside the sealed output; a verification
            // seals their digest only (the client knows the subject it claimed).
            let listed: Option<Vec<&str>> = row
                .target
                .is_none()
                .then(|| subjects.iter().map(String::as_str).collect());
            save_round(session, 3, None);
            sealer.seal(&digest, &named, &o, listed.as_deref(), &mut rng)
        }
    };
    pg_sys::check_for_interrupts!();
    output
}

/// Aborts face session `session` at this party: no further round runs; its keys stay
/// claimed (burnt), and a dealer-masked session's secrets are dropped from the engine.
/// Returns whether a running session was aborted.
#[pg_extern(volatile, parallel_unsafe)]
fn face_session_abort(session: &[u8]) -> bool {
    let id = parse_session_id("face_session_abort", "session", session);
    // Best effort: an engine that is down holds no session.
    let _ = crate::engine::client::try_call(&crate::engine::ipc::Request::Abort { session: id });
    get_one::<bool>(
        "face_session_abort",
        "WITH s AS (UPDATE privmatch.face_sessions SET aborted = true, finished_at = now(), \
                 probe = NULL, z_share = NULL \
          WHERE session = $1 AND finished_at IS NULL RETURNING 1) SELECT count(*) > 0 FROM s",
        &[session.into()],
    )
    .unwrap_or(false)
}
