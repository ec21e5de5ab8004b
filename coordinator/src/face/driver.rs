//! The face comparison on the round-driver skeleton ([`crate::session::driver`]): one
//! verification (1:1) or identification (1:N) session across the two evaluators P0 and P1
//! over dealer-masked templates (Funshade: Ibarrondo, Chabanne, Önen, PETS 2023, ePrint
//! 2022/1688, with each template masked once: docs/protocols/face.md §5), relaying their
//! sealed messages. The output shares come back sealed to the requesting client's reply key
//! (core's `face::reply`, docs/protocols/face.md §13): the coordinator relays them to the
//! client unread and learns no comparison bit. P2 deals each session's keys.
//!
//! Protocol, as the parties expose it (schema `privmatch`):
//!
//! 0. Templates enrolled since the last session are opened once ([`open_pending`]) when an
//!    open is refused because one is not opened yet (40001, nothing recorded; the open is
//!    then asked again with the same probe):
//!    `face_masked_pending` at P0 and P1, `face_dealer_template_seeds` at P2 per evaluator,
//!    `face_masked_prepare` and `face_masked_accept` at P0 and P1 (each gets the other's Y_b).
//! 1. `face_masked_open(session, probe)` at P0: P0 opens its sealed probe share and fixes the
//!    compared templates in its engine: every opened one for an identification (it answers
//!    the number of comparisons, their bundle ids and digest), or, for a verification, the
//!    template of the subject sealed inside the probe (probe format 3 and later): then it answers only
//!    the count and its round-2 message sealed for P1 (`masked_probe`). No answer names a
//!    subject.
//! 2. An identification: `face_masked_open(session, probe, P0's ids)` at P1: P1 compares
//!    exactly P0's list or refuses (SQLSTATE 40001: the evaluators differ for a moment;
//!    retry). A verification opens at P0 and P1 at once, each finding the template itself,
//!    while P2 deals (step 3).
//!    An identification for which a dealing was made ahead of time ([`crate::face::stock`],
//!    docs/protocols/face.md §11) opens at P0 and P1 at once with
//!    `face_masked_open_stocked(session, probe, stock)`; when both claim the stocked dealing,
//!    step 3 is skipped and step 4 takes no chunks.
//! 3. `face_dealer_identify(session, ids)` at P2 (identification) or
//!    `face_dealer_verify(session)` (verification: dealt from the session id alone, at the
//!    same time as the opens): each evaluator's key half, in chunks. Neither the coordinator
//!    nor P2 learns which template a verification compares (docs/protocols/face.md §7).
//! 4. `face_masked_keys(session, chunks)` at P0 and P1: the sealed masked probe vectors. A
//!    verification's evaluators answered theirs at the open (probe and template masked with
//!    seeds each shares with P2 for the session, docs/protocols/face.md §7), so its keys
//!    step and round 2 are one call, `face_masked_keyed_round(session, chunks, peer's
//!    message)`.
//! 5. Rounds 2 and 3, `face_masked_round(session, round, inbound)` at P0 and P1 in parallel:
//!    round 2 takes the peer's masked probe vector and answers the sealed distance shares;
//!    round 3 takes the peer's distance shares and answers this party's output shares sealed
//!    to the client's reply key.
//! 6. The coordinator hands both sealed outputs to the client, which opens them and adds
//!    them (`face::reply::open_face_result`, Funshade's `res`): o_0 + o_1 ∈ {0, 1} per
//!    comparison.
//!
//! With zero comparisons (nothing enrolled) there is nothing to seal: no outputs. On any error or timeout
//! the session is aborted at P0 and P1 (best effort): the session id is burnt, its secrets
//! dropped from the engines. The session id is bound into the sealed probes, so a retry
//! needs freshly sealed probes: [`FaceErrorKind::is_retryable`] tells the caller when.

use std::time::Duration;

use privmatch_core::face::masked::template_digest;
use privmatch_core::face::reply::sealed_output_len;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SessionId;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};

use crate::parties::{column, Parties, PartyError};
use crate::session::driver::{
    call_with_timeout, relay, run_pooled, Rounds, Session, Step, Traffic,
};
use privmatch_api::face::FaceRequest;

/// The two evaluators.
const EVALUATORS: [PartyIndex; 2] = [PartyIndex::ALL[0], PartyIndex::ALL[1]];

/// Figures of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceStats {
    /// Comparisons evaluated (= keys consumed per evaluator).
    pub comparisons: i64,
    /// Bytes each evaluator emitted over the rounds (P0, P1): its sealed masked probe
    /// vector, its sealed distance shares and its sealed output.
    pub bytes_sent: [u64; 2],
    /// Bytes of the key half P2 dealt each evaluator for the session (sealed chunks; 0 when
    /// the session used a dealing stocked ahead of time).
    pub key_bytes: [u64; 2],
    /// Whether the session used a dealing stocked ahead of time (no dealing on its path).
    #[serde(default)]
    pub stocked: bool,
    /// Wall time from the first open to the sealed outputs, in microseconds.
    pub micros: u64,
}

/// A finished session: P0's and P1's outputs sealed to the client (the coordinator cannot
/// open them; an identification's list its compared subjects inside), and for an
/// identification the compared templates' bundle ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaceOutcome {
    /// An identification's compared templates' bundle ids (16 bytes each, in comparison
    /// order); empty for a verification (the coordinator never learns its template).
    pub ids: Vec<u8>,
    /// P0's and P1's sealed outputs (core's `face::reply`); empty with no comparison.
    pub outputs: [Vec<u8>; 2],
    /// Figures.
    pub stats: FaceStats,
}

/// What a party's error means for the face modality (from its SQLSTATE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaceErrorKind {
    /// P0002: the subject is not enrolled.
    UnknownSubject,
    /// 22023 (and class 22): a bad argument, e.g. a probe of the wrong dimension.
    BadArgument,
    /// 40001: P0 and P1 compare different template sets (retry with a new session).
    SetsDiffer,
    /// 23505: the session id or the stocked dealing was claimed already (retry with a new
    /// session).
    KeyConflict,
    /// 08P01: a round message was refused (tampered, replayed or misrouted).
    Refused,
    /// 42704: the party does not know the session.
    SessionNotFound,
    /// 55000: the dealer is not configured or the party not initialised.
    NotConfigured,
    /// Anything else (including an unreachable party).
    Other,
}

impl FaceErrorKind {
    /// The kind of a SQLSTATE.
    pub fn from_sqlstate(sqlstate: Option<&str>) -> Self {
        match sqlstate {
            Some("P0002") => FaceErrorKind::UnknownSubject,
            Some("40001") => FaceErrorKind::SetsDiffer,
            Some("23505") => FaceErrorKind::KeyConflict,
            Some("08P01") => FaceErrorKind::Refused,
            Some("42704") => FaceErrorKind::SessionNotFound,
            Some("55000") => FaceErrorKind::NotConfigured,
            Some(s) if s.starts_with("22") => FaceErrorKind::BadArgument,
            _ => FaceErrorKind::Other,
        }
    }

    /// True when a new session (freshly sealed probes) may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, FaceErrorKind::SetsDiffer | FaceErrorKind::KeyConflict)
    }
}

/// Why a face session failed. The session was aborted at P0 and P1 (best effort).
#[derive(Debug, thiserror::Error)]
pub enum FaceSessionError {
    /// The request is malformed (nothing was sent to the parties).
    #[error("invalid face request: {0}")]
    Invalid(String),
    /// A party failed or could not be reached.
    #[error("face session failed at {0}")]
    Party(PartyError),
    /// A party did not answer within the per-call timeout (its call was cancelled).
    #[error("face session timed out at {0}")]
    Timeout(PartyError),
    /// The parties broke the protocol (disagree on the compared set, malformed outputs).
    #[error("face protocol error: {0}")]
    Protocol(String),
}

impl FaceSessionError {
    /// What a party's error means ([`FaceErrorKind::Other`] for everything else).
    pub fn kind(&self) -> FaceErrorKind {
        match self {
            FaceSessionError::Party(e) => FaceErrorKind::from_sqlstate(e.sqlstate.as_deref()),
            _ => FaceErrorKind::Other,
        }
    }
}

/// What an evaluator answered to `face_masked_open` (or `face_masked_open_stocked`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReply {
    /// Number of comparisons (templates compared).
    pub comparisons: i32,
    /// An identification's compared templates' bundle ids, 16 bytes each, in comparison
    /// order (P1 must compare exactly P0's); empty for a verification.
    pub ids: Vec<u8>,
    /// Digest of the compared list (an identification's; empty for a verification).
    pub digest: Vec<u8>,
    /// A verification's round-2 message (the evaluator's masked probe and template shares)
    /// sealed for the other evaluator, sent from the open.
    pub masked_probe: Option<Vec<u8>>,
}

/// Checks an evaluator's open (`party` names it): an identification lists one bundle id per
/// comparison and no masked probe; a verification compares one template and answers a sealed
/// message for the other evaluator, and nothing else.
pub fn check_open(party: &str, reply: &OpenReply, verification: bool) -> Result<(), String> {
    if reply.comparisons < 0 {
        return Err(format!("{party} opened {} comparisons", reply.comparisons));
    }
    if verification {
        if reply.comparisons != 1
            || !reply.ids.is_empty()
            || reply.masked_probe.as_ref().is_none_or(Vec::is_empty)
        {
            return Err(format!(
                "{party} opened a verification with {} comparisons and no sealed message for the other evaluator",
                reply.comparisons
            ));
        }
        return Ok(());
    }
    if reply.masked_probe.is_some() {
        return Err(format!(
            "{party} answered an identification's open with a masked probe"
        ));
    }
    if reply.ids.len() != 16 * reply.comparisons as usize {
        return Err(format!(
            "{party} opened {} comparisons but listed {} bytes of bundle ids",
            reply.comparisons,
            reply.ids.len()
        ));
    }
    Ok(())
}

/// Checks P0's open of an identification (see [`check_open`]).
pub fn check_first_open(reply: &OpenReply) -> Result<(), String> {
    check_open("P0", reply, false)
}

/// Checks that P1 opened the same identification as P0 (same comparisons, list and digest).
pub fn check_second_open(p0: &OpenReply, p1: &OpenReply) -> Result<(), String> {
    if p1.comparisons != p0.comparisons {
        return Err(format!(
            "P0 opened {} comparisons, P1 {}",
            p0.comparisons, p1.comparisons
        ));
    }
    if p1.ids != p0.ids {
        return Err("P0 and P1 compare different templates".into());
    }
    if !p1.digest.is_empty() && p1.digest != p0.digest {
        return Err("P0 and P1 report different session digests".into());
    }
    Ok(())
}

/// Checks the opens of P0 and P1 made at once (each found its templates itself). A
/// verification: each answered one comparison and a sealed message (the evaluators compare
/// their templates' digests at round 2).
/// An identification: the same list, or 40001 (an enrolment or deletion is in flight: retry
/// with a new session).
fn check_parallel_opens(
    p0: &OpenReply,
    p1: &OpenReply,
    verification: bool,
) -> Result<(), FaceSessionError> {
    check_open("P0", p0, verification).map_err(FaceSessionError::Protocol)?;
    check_open("P1", p1, verification).map_err(FaceSessionError::Protocol)?;
    if verification {
        return Ok(());
    }
    if p1.ids != p0.ids {
        return Err(FaceSessionError::Party(PartyError {
            party: EVALUATORS[1],
            sqlstate: Some("40001".into()),
            message: "P0 and P1 compare different face template sets (an enrolment or deletion is in flight): retry with a new session".into(),
        }));
    }
    check_second_open(p0, p1).map_err(FaceSessionError::Protocol)
}

/// Checks the shape of the two sealed outputs of round 3 (what the coordinator can check
/// without opening them): present and of one length, which for a verification depends on
/// the comparison count only, and for an identification also on the subjects listed inside
/// (so it is at least that: exactly that when the client's probe named the list it knows).
pub fn check_sealed_outputs(
    comparisons: usize,
    verification: bool,
    o0: &[u8],
    o1: &[u8],
) -> Result<(), String> {
    let expected = sealed_output_len(comparisons);
    for (party, output) in [("P0", o0), ("P1", o1)] {
        let fits = if verification {
            output.len() == expected
        } else {
            output.len() >= expected
        };
        if !fits {
            return Err(format!(
                "{party} returned a sealed output of {} bytes for {comparisons} comparisons (expected {}{expected})",
                output.len(),
                if verification { "" } else { "at least " }
            ));
        }
    }
    if o0.len() != o1.len() {
        return Err(format!(
            "P0 and P1 returned sealed outputs of different lengths ({} and {} bytes)",
            o0.len(),
            o1.len()
        ));
    }
    Ok(())
}

crate::session_error!(FaceSessionError);

// P2's dealings are called in the select list, not in FROM: a set-returning function in FROM
// has PostgreSQL collect all its rows in a tuplestore first, which spills to a temporary file
// beyond `work_mem` (4 MB by default) — every dealing of a large set was written to disk and
// read back (and sorted again for an ORDER BY) before its first byte left P2. In the select
// list each row goes out as it is made; the rows arrive in chunk order, which
// [`dealt_halves`] checks.
/// P2's dealing for one face session (the session id and the list).
pub const DEAL_SESSION_SQL: &str = "SELECT privmatch.face_dealer_identify($1, $2)";
/// P2's dealing ahead of time under a stock id ([`crate::face::stock`]).
pub const DEAL_STOCK_SQL: &str = "SELECT privmatch.face_dealer_stock($1, $2)";
/// P2's dealing for a verification, from its session id.
pub const DEAL_VERIFY_SQL: &str = "SELECT privmatch.face_dealer_verify($1)";

/// One row of a dealing (chunk, envelope for P0, envelope for P1) as the composite value the
/// select-list call answers, in PostgreSQL's binary record format: a count of fields, then
/// per field its type oid, its length (−1: NULL) and its bytes.
struct DealtRow {
    chunk: i32,
    envelopes: [Vec<u8>; 2],
}

impl<'a> tokio_postgres::types::FromSql<'a> for DealtRow {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let mut rest = raw;
        let mut take = |n: usize| -> Result<&'a [u8], String> {
            if rest.len() < n {
                return Err("a dealt row ends early".to_owned());
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        let word = |b: &[u8]| i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let fields = word(take(4)?);
        if fields != 3 {
            return Err(format!("a dealt row has {fields} fields, not 3").into());
        }
        let mut field = |want: Type| -> Result<&'a [u8], String> {
            let oid = u32::from_be_bytes(take(4)?.try_into().map_err(|_| "short oid")?);
            if oid != want.oid() {
                return Err(format!(
                    "a dealt row's field has type oid {oid}, not {want}"
                ));
            }
            let len = word(take(4)?);
            let len = usize::try_from(len).map_err(|_| "a dealt row's field is NULL")?;
            take(len)
        };
        let chunk = field(Type::INT4)?;
        let chunk = word(chunk.get(..4).ok_or("short chunk number")?);
        let p0 = field(Type::BYTEA)?.to_vec();
        let p1 = field(Type::BYTEA)?.to_vec();
        if !rest.is_empty() {
            return Err("a dealt row has bytes after its fields".into());
        }
        Ok(DealtRow {
            chunk,
            envelopes: [p0, p1],
        })
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::RECORD
    }
}

/// P2's dealing `sql` ([`DEAL_SESSION_SQL`] or [`DEAL_STOCK_SQL`]) under `id` for the
/// templates `ids` (16 bytes each): each evaluator's sealed key half, in chunks.
pub async fn deal_at(
    dealer: &Client,
    sql: &str,
    id: &[u8; 16],
    ids: &[u8],
    timeout: Duration,
) -> Result<[Vec<Vec<u8>>; 2], FaceSessionError> {
    let p2 = PartyIndex::ALL[2];
    let id: &[u8] = id;
    let ids: Vec<&[u8]> = ids.chunks(16).collect();
    let what = if sql == DEAL_STOCK_SQL {
        "face_dealer_stock"
    } else {
        "face_dealer_identify"
    };
    let rows = call_with_timeout::<_, FaceSessionError>(
        p2,
        dealer,
        what,
        timeout,
        dealer.query_typed(sql, &[(&id, Type::BYTEA), (&ids, Type::BYTEA_ARRAY)]),
    )
    .await?;
    dealt_halves(what, rows)
}

/// The key halves in P2's answer `rows` (of the call `what`), per evaluator in chunk order
/// (the rows must come numbered 0, 1, …: a missing or repeated chunk would fail at the
/// evaluators, this says so sooner).
fn dealt_halves(what: &str, rows: Vec<Row>) -> Result<[Vec<Vec<u8>>; 2], FaceSessionError> {
    let p2 = PartyIndex::ALL[2];
    let mut halves = [Vec::new(), Vec::new()];
    for (k, row) in rows.iter().enumerate() {
        let dealt: DealtRow = column(p2, row, 0)
            .map_err(FaceSessionError::Party)?
            .ok_or_else(|| FaceSessionError::Protocol(format!("P2 dealt a NULL row ({what})")))?;
        if usize::try_from(dealt.chunk).ok() != Some(k) {
            return Err(FaceSessionError::Protocol(format!(
                "P2 dealt chunk {} where chunk {k} was due ({what})",
                dealt.chunk
            )));
        }
        for (half, envelope) in halves.iter_mut().zip(dealt.envelopes) {
            half.push(envelope);
        }
    }
    if halves[0].is_empty() {
        return Err(FaceSessionError::Protocol(format!(
            "P2 dealt no key chunk ({what})"
        )));
    }
    Ok(halves)
}

/// P2's dealing for verification `session`, from the session id alone (P2 learns neither
/// the subject nor the template): each evaluator's key half, in chunks.
pub async fn deal_verification(
    dealer: &Client,
    session: &[u8; 16],
    timeout: Duration,
) -> Result<[Vec<Vec<u8>>; 2], FaceSessionError> {
    let p2 = PartyIndex::ALL[2];
    let session: &[u8] = session;
    let rows = call_with_timeout::<_, FaceSessionError>(
        p2,
        dealer,
        "face_dealer_verify",
        timeout,
        dealer.query_typed(DEAL_VERIFY_SQL, &[(&session, Type::BYTEA)]),
    )
    .await?;
    dealt_halves("face_dealer_verify", rows)
}

/// A dealing both evaluators hold, ready for the next identification over `ids`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stocked {
    /// The stock id it was dealt under.
    pub id: [u8; 16],
    /// The bundle ids it was dealt for (16 bytes each, in comparison order).
    pub ids: Vec<u8>,
    /// [`template_digest`] of `ids`: the evaluators answer an open over this list without
    /// listing it again.
    pub list_digest: [u8; 32],
    /// P2's configuration generation when it was dealt.
    pub generation: i64,
}

impl Stocked {
    /// The dealing under stock id `id` for the list `ids` (16 bytes each).
    pub fn new(id: [u8; 16], ids: Vec<u8>, generation: i64) -> Self {
        let list_digest = template_digest(ids.chunks_exact(16).filter_map(|c| c.try_into().ok()));
        Stocked {
            id,
            ids,
            list_digest,
            generation,
        }
    }

    /// `reply` with the list filled in from this dealing's when the evaluator left it out
    /// because it compares exactly this list (same digest).
    fn fill_in(&self, mut reply: OpenReply) -> OpenReply {
        if reply.comparisons > 0 && reply.ids.is_empty() && reply.digest == self.list_digest {
            reply.ids = self.ids.clone();
        }
        reply
    }
}

/// P2's configuration generation (`face_dealer_status`; an unconfigured dealer is 55000).
pub async fn dealer_generation(
    dealer: &tokio_postgres::Client,
    timeout: Duration,
) -> Result<i64, FaceSessionError> {
    let p2 = PartyIndex::ALL[2];
    let rows = call_with_timeout::<_, FaceSessionError>(
        p2,
        dealer,
        "face_dealer_status",
        timeout,
        dealer.query_typed("SELECT generation FROM privmatch.face_dealer_status()", &[]),
    )
    .await?;
    match rows.first() {
        Some(row) => Ok(column::<i64>(p2, row, 0)
            .map_err(FaceSessionError::Party)?
            .unwrap_or(0)),
        None => Err(FaceSessionError::Party(PartyError {
            party: p2,
            sqlstate: Some("55000".into()),
            message: "the face dealer P2 is not configured".into(),
        })),
    }
}

/// Templates opened per batch of the one-time opening (≈ 20 MB per message at l = 512).
const OPENING_BATCH: i32 = 10_000;

/// The parameters of one statement.
type Args<'a, const K: usize> = [&'a (dyn tokio_postgres::types::ToSql + Sync); K];

/// The one value `sql` answers at `party` (the name of the function it calls names the
/// call in errors), within `timeout`.
async fn value<T: for<'r> tokio_postgres::types::FromSql<'r>>(
    party: PartyIndex,
    client: &Client,
    timeout: Duration,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Option<T>, FaceSessionError> {
    let what = sql.trim_start_matches("SELECT privmatch.");
    let what = what.split('(').next().unwrap_or(what);
    let row = call_with_timeout::<_, FaceSessionError>(
        party,
        client,
        what,
        timeout,
        client.query_one(sql, params),
    )
    .await?;
    column(party, &row, 0).map_err(FaceSessionError::Party)
}

/// Opens, once, the enrolled templates P0 or P1 has not opened yet (docs/protocols/face.md
/// §6 step 1): P2's sealed mask seeds for each evaluator, each evaluator's Y_b for the
/// other, each evaluator stores Δy. In batches; cheap when nothing is pending (one query per
/// evaluator). Returns how many templates were opened.
async fn open_pending(clients: [&Client; 3], timeout: Duration) -> Result<usize, FaceSessionError> {
    let [c0, c1, c2] = clients;
    let [p0, p1, p2] = PartyIndex::ALL;
    let mut opened = 0usize;
    // A batch that stored nothing: fine once (another session opened it meanwhile), an error
    // when the evaluators list it as pending again (nothing would ever change).
    let mut stored_none: Option<Vec<Vec<u8>>> = None;
    loop {
        let pending = "SELECT privmatch.face_masked_pending($1)";
        let (a, b) = futures::join!(
            value::<Vec<Vec<u8>>>(p0, c0, timeout, pending, &[&OPENING_BATCH]),
            value::<Vec<Vec<u8>>>(p1, c1, timeout, pending, &[&OPENING_BATCH])
        );
        let mut ids = a?.unwrap_or_default();
        ids.extend(b?.unwrap_or_default());
        ids.sort();
        ids.dedup();
        ids.truncate(OPENING_BATCH as usize);
        if ids.is_empty() {
            return Ok(opened);
        }
        if stored_none.as_ref() == Some(&ids) {
            return Err(FaceSessionError::Protocol(format!(
                "opening {} pending face templates stored none at either evaluator",
                ids.len()
            )));
        }
        let seeds_sql = "SELECT privmatch.face_dealer_template_seeds($1, $2)";
        let s0 = value::<Vec<u8>>(p2, c2, timeout, seeds_sql, &[&0i32, &ids]).await?;
        let s1 = value::<Vec<u8>>(p2, c2, timeout, seeds_sql, &[&1i32, &ids]).await?;
        let (s0, s1) = (s0.unwrap_or_default(), s1.unwrap_or_default());
        let prepare = "SELECT privmatch.face_masked_prepare($1, $2)";
        let (args0, args1): (Args<'_, 2>, Args<'_, 2>) = ([&ids, &s0], [&ids, &s1]);
        let (y0, y1) = futures::join!(
            value::<Vec<u8>>(p0, c0, timeout, prepare, &args0),
            value::<Vec<u8>>(p1, c1, timeout, prepare, &args1)
        );
        let (y0, y1) = (y0?.unwrap_or_default(), y1?.unwrap_or_default());
        let accept = "SELECT privmatch.face_masked_accept($1, $2, $3)";
        let (args0, args1): (Args<'_, 3>, Args<'_, 3>) = ([&ids, &s0, &y1], [&ids, &s1, &y0]);
        let (n0, n1) = futures::join!(
            value::<i64>(p0, c0, timeout, accept, &args0),
            value::<i64>(p1, c1, timeout, accept, &args1)
        );
        let (n0, n1) = (n0?.unwrap_or(0), n1?.unwrap_or(0));
        if n0 == 0 && n1 == 0 {
            stored_none = Some(ids);
            continue;
        }
        stored_none = None;
        opened += ids.len();
    }
}

/// One face session as the round driver runs it (dealer-masked templates, docs/protocols/
/// face.md §6): P0 and P1 evaluate, P2 deals the session's keys.
struct FaceSession<'a> {
    request: &'a FaceRequest,
    parties: &'a Parties,
    /// A dealing both evaluators were given ahead of time, for an identification.
    stocked: Option<Stocked>,
    timeout: Duration,
}

impl FaceSession<'_> {
    /// `face_masked_open` at `party`; P1 of an identification gets P0's list of compared
    /// templates (`first`).
    async fn open_at(
        &self,
        party: PartyIndex,
        client: &Client,
        first: Option<&OpenReply>,
    ) -> Result<OpenReply, FaceSessionError> {
        let request = self.request;
        let session: &[u8] = &request.session;
        let probe: &[u8] = &request.probes[party.as_usize()];
        let expect: Option<&[u8]> = first.map(|r| r.ids.as_slice());
        let sql = "SELECT comparisons, bundle_ids, digest, masked_probe \
                   FROM privmatch.face_masked_open($1, $2, $3)";
        let row = call_with_timeout::<_, FaceSessionError>(
            party,
            client,
            "face_masked_open",
            self.timeout,
            client.query_typed_one(
                sql,
                &[
                    (&session, Type::BYTEA),
                    (&probe, Type::BYTEA),
                    (&expect, Type::BYTEA),
                ],
            ),
        )
        .await?;
        let reply = || {
            Ok(OpenReply {
                comparisons: column(party, &row, 0)?.unwrap_or(-1),
                ids: column(party, &row, 1)?.unwrap_or_default(),
                digest: column(party, &row, 2)?.unwrap_or_default(),
                masked_probe: column(party, &row, 3)?,
            })
        };
        reply().map_err(FaceSessionError::Party)
    }

    /// The session's key halves from P2 (`face_dealer_identify`) for the templates `ids`
    /// (16 bytes each), per evaluator in chunks.
    async fn deal(
        &self,
        dealer: &Client,
        ids: &[u8],
    ) -> Result<[Vec<Vec<u8>>; 2], FaceSessionError> {
        deal_at(
            dealer,
            DEAL_SESSION_SQL,
            &self.request.session,
            ids,
            self.timeout,
        )
        .await
    }

    /// `face_masked_open_stocked` at `party`: an identification's open that claims the
    /// dealing stocked under `stock` if it fits the compared list. Also answers whether it did.
    async fn open_stocked_at(
        &self,
        party: PartyIndex,
        client: &Client,
        stocked: &Stocked,
    ) -> Result<(OpenReply, bool), FaceSessionError> {
        let session: &[u8] = &self.request.session;
        let probe: &[u8] = &self.request.probes[party.as_usize()];
        let stock: &[u8] = &stocked.id;
        let known: &[u8] = &stocked.list_digest;
        let row = call_with_timeout::<_, FaceSessionError>(
            party,
            client,
            "face_masked_open_stocked",
            self.timeout,
            client.query_typed_one(
                "SELECT comparisons, bundle_ids, digest, claimed \
                   FROM privmatch.face_masked_open_stocked($1, $2, $3, $4)",
                &[
                    (&session, Type::BYTEA),
                    (&probe, Type::BYTEA),
                    (&stock, Type::BYTEA),
                    (&known, Type::BYTEA),
                ],
            ),
        )
        .await?;
        let reply = || {
            Ok((
                stocked.fill_in(OpenReply {
                    comparisons: column(party, &row, 0)?.unwrap_or(-1),
                    ids: column(party, &row, 1)?.unwrap_or_default(),
                    digest: column(party, &row, 2)?.unwrap_or_default(),
                    masked_probe: None,
                }),
                column::<bool>(party, &row, 3)?.unwrap_or(false),
            ))
        };
        reply().map_err(FaceSessionError::Party)
    }

    /// An identification's opens with a stocked dealing: at P0 and P1 at once (each lists
    /// every opened template; the coordinator compares the lists), then the keys: none to
    /// deal when both claimed the stock, else P2 deals for the session. Returns P0's open,
    /// the halves to hand out (empty: the stocked dealing) and whether the stock was used.
    async fn stocked_opened_and_dealt(
        &self,
        stock: &Stocked,
        three: [&Client; 3],
    ) -> Result<(OpenReply, [Vec<Vec<u8>>; 2], bool), FaceSessionError> {
        let [c0, c1, dealer] = three;
        let [p0, p1] = EVALUATORS;
        let (a, b, generation) = futures::join!(
            self.open_stocked_at(p0, c0, stock),
            self.open_stocked_at(p1, c1, stock),
            dealer_generation(dealer, self.timeout)
        );
        // Refused while templates are not opened yet (40001 before anything is recorded): open
        // them and ask again.
        let pending = |r: &Result<(OpenReply, bool), FaceSessionError>| matches!(r, Err(e) if e.kind() == FaceErrorKind::SetsDiffer);
        let (a, b) = if pending(&a) || pending(&b) {
            open_pending(three, self.timeout).await?;
            let a = if pending(&a) {
                self.open_stocked_at(p0, c0, stock).await
            } else {
                a
            };
            let b = if pending(&b) {
                self.open_stocked_at(p1, c1, stock).await
            } else {
                b
            };
            (a, b)
        } else {
            (a, b)
        };
        let ((first, claimed0), (second, claimed1)) = (a?, b?);
        // Dealt under another configuration of P2 (a new threshold or metric): not used.
        let current = generation? == stock.generation;
        check_parallel_opens(&first, &second, false)?;
        if first.comparisons > 0 && claimed0 && claimed1 && current {
            return Ok((first, [Vec::new(), Vec::new()], true));
        }
        // The stock did not fit (the set moved on, an engine restarted, P2 was reconfigured):
        // whichever evaluator claimed it burnt it; the session is dealt for as usual.
        let halves = if first.comparisons > 0 {
            self.deal(dealer, &first.ids).await?
        } else {
            [Vec::new(), Vec::new()]
        };
        Ok((first, halves, false))
    }

    /// `face_masked_keys` at `party`: its key half in, its sealed masked probe vector out.
    async fn keys_at(
        &self,
        party: PartyIndex,
        client: &Client,
        chunks: &[Vec<u8>],
    ) -> Result<Vec<u8>, FaceSessionError> {
        let session: &[u8] = &self.request.session;
        let row = call_with_timeout::<_, FaceSessionError>(
            party,
            client,
            "face_masked_keys",
            self.timeout,
            client.query_typed_one(
                "SELECT privmatch.face_masked_keys($1, $2)",
                &[(&session, Type::BYTEA), (&chunks, Type::BYTEA_ARRAY)],
            ),
        )
        .await?;
        let reply: Option<Vec<u8>> = column(party, &row, 0).map_err(FaceSessionError::Party)?;
        reply.ok_or_else(|| {
            FaceSessionError::Protocol(format!("{party} answered its keys with NULL"))
        })
    }

    /// An open's outcome at `party`; when it failed because a template is not opened yet there
    /// (40001, refused before the party recorded the session), opens the pending templates
    /// and tries the same open once more: the client's probes are sealed for this session id
    /// (the SQL front door cannot seal new ones).
    async fn opened_or_retry(
        &self,
        party: PartyIndex,
        first: Option<&OpenReply>,
        opened: Result<OpenReply, FaceSessionError>,
        clients: [&Client; 3],
    ) -> Result<OpenReply, FaceSessionError> {
        match opened {
            Err(e) if e.kind() == FaceErrorKind::SetsDiffer => {
                open_pending(clients, self.timeout).await?;
                self.open_at(party, clients[party.as_usize()], first).await
            }
            other => other,
        }
    }

    /// A verification's opens at P0 and P1 and its dealing at P2, all at once: each evaluator
    /// reads the subject from its sealed probe and looks its template up, and P2 deals from
    /// the session id alone (docs/protocols/face.md §7), so the coordinator learns that a
    /// verification happened, not of whom, and P2 not which template. The opens commit before
    /// they answer (the session id and the client's nonce are durable before any later step).
    async fn verification_opened_and_dealt(
        &self,
        three: [&Client; 3],
        dealer: &Client,
    ) -> Result<([OpenReply; 2], Result<[Vec<Vec<u8>>; 2], FaceSessionError>), FaceSessionError>
    {
        let [c0, c1, _] = three;
        let [p0, p1] = EVALUATORS;
        let (first, second, dealt) = futures::join!(
            self.open_at(p0, c0, None),
            self.open_at(p1, c1, None),
            deal_verification(dealer, &self.request.session, self.timeout)
        );
        let first = self.opened_or_retry(p0, None, first, three).await?;
        let second = self.opened_or_retry(p1, None, second, three).await?;
        check_parallel_opens(&first, &second, true)?;
        Ok(([first, second], dealt))
    }

    /// A verification's keys step and rounds 2 and 3: the evaluators' messages went out with
    /// the opens (`masked_probes`, indexed by sender), so each evaluator gets its key half and
    /// the other's message in one call (`face_masked_keyed_round`: one statement and one
    /// engine request), then round 3 is relayed as usual.
    async fn keys_with_rounds(
        &self,
        clients: [&Client; 2],
        halves: [&[Vec<u8>]; 2],
        masked_probes: [Vec<u8>; 2],
        traffic: &mut Traffic<2>,
    ) -> Result<[Vec<u8>; 2], FaceSessionError> {
        let [p0, p1] = EVALUATORS;
        traffic.count(&masked_probes);
        let [to0, to1] = self.route(masked_probes);
        let (z0, z1) = futures::join!(
            self.keyed_round_at(p0, clients[0], halves[0], &to0),
            self.keyed_round_at(p1, clients[1], halves[1], &to1)
        );
        traffic.rounds += 1;
        relay(self, clients, 3..4, Some([z0?, z1?]), traffic).await
    }

    /// `face_masked_keyed_round` at `party`: its key half and the other evaluator's message in,
    /// its sealed distance shares out.
    async fn keyed_round_at(
        &self,
        party: PartyIndex,
        client: &Client,
        chunks: &[Vec<u8>],
        inbound: &[u8],
    ) -> Result<Vec<u8>, FaceSessionError> {
        let session: &[u8] = &self.request.session;
        let row = call_with_timeout::<_, FaceSessionError>(
            party,
            client,
            "face_masked_keyed_round",
            self.timeout,
            client.query_typed_one(
                "SELECT privmatch.face_masked_keyed_round($1, $2, $3)",
                &[
                    (&session, Type::BYTEA),
                    (&chunks, Type::BYTEA_ARRAY),
                    (&inbound, Type::BYTEA),
                ],
            ),
        )
        .await?;
        self.reply(party, 2, &row)
    }
}

impl Session<2> for FaceSession<'_> {
    type Output = FaceOutcome;
    type Error = FaceSessionError;
    const ABORT_SQL: &'static str = "SELECT privmatch.face_session_abort($1)";

    fn id(&self) -> &SessionId {
        &self.request.session
    }

    /// Opening of pending templates, open at P0, open at P1, keys from P2, rounds 1–3; the
    /// sealed outputs are the client's to open.
    async fn drive(&self, clients: [&Client; 2]) -> Result<FaceOutcome, FaceSessionError> {
        let [c0, c1] = clients;
        let [p0, p1] = EVALUATORS;
        let dealer = self.parties.all()[2]
            .connect()
            .await
            .map_err(FaceSessionError::Party)?;
        let t0 = std::time::Instant::now();
        let verification = self.request.verification;
        let three = [c0, c1, &dealer];
        // An identification compares every enrolled template: open the new ones first, then
        // P0 fixes the list, and P1 opens with it while P2 deals for it. A verification opens
        // at P0 and P1 at once (each looks its subject's template up) and the lists are
        // compared; a template not opened yet (40001) is opened and the open tried again.
        let mut stocked = false;
        // A verification's X_0 and X_1, sealed for the peers at the opens.
        let mut masked_probes: [Option<Vec<u8>>; 2] = [None, None];
        let (first, dealt) = if let (false, Some(stock)) = (verification, &self.stocked) {
            let (first, halves, used) = self.stocked_opened_and_dealt(stock, three).await?;
            if first.comparisons == 0 {
                self.parties.all()[2].give_back(dealer).await;
                return Ok(FaceOutcome::default());
            }
            stocked = used;
            (first, Ok(halves))
        } else if !verification {
            let first = self.open_at(p0, c0, None).await;
            let first = self.opened_or_retry(p0, None, first, three).await?;
            check_first_open(&first).map_err(FaceSessionError::Protocol)?;
            if first.comparisons == 0 {
                // Nothing enrolled: nothing to evaluate.
                self.parties.all()[2].give_back(dealer).await;
                return Ok(FaceOutcome::default());
            }
            let (second, dealt) = futures::join!(
                self.open_at(p1, c1, Some(&first)),
                self.deal(&dealer, &first.ids)
            );
            let second = self
                .opened_or_retry(p1, Some(&first), second, three)
                .await?;
            check_second_open(&first, &second).map_err(FaceSessionError::Protocol)?;
            (first, dealt)
        } else {
            let ([first, second], dealt) =
                self.verification_opened_and_dealt(three, &dealer).await?;
            masked_probes = [first.masked_probe.clone(), second.masked_probe];
            (first, dealt)
        };
        let t_open0 = t0.elapsed();
        let mut stats = FaceStats {
            comparisons: i64::from(first.comparisons),
            stocked,
            ..FaceStats::default()
        };
        let [k0, k1] = dealt?;
        let sealed_len = |half: &[Vec<u8>]| half.iter().map(|c| c.len() as u64).sum::<u64>();
        stats.key_bytes = [sealed_len(&k0), sealed_len(&k1)];
        self.parties.all()[2].give_back(dealer).await;
        let mut traffic = Traffic::new();
        let outputs = if let [Some(x0), Some(x1)] = masked_probes {
            self.keys_with_rounds(clients, [&k0, &k1], [x0, x1], &mut traffic)
                .await?
        } else {
            let (x0, x1) = futures::join!(self.keys_at(p0, c0, &k0), self.keys_at(p1, c1, &k1));
            relay(self, clients, 2..4, Some([x0?, x1?]), &mut traffic).await?
        };
        tracing::debug!(
            opened_and_dealt_ms = t_open0.as_secs_f64() * 1e3,
            rounds_ms = t0.elapsed().as_secs_f64() * 1e3,
            "face session steps (cumulative)"
        );
        // The sealed outputs go to the client, not to the other evaluator.
        traffic.count(&outputs);
        stats.bytes_sent = traffic.bytes_sent;
        let [o0, o1] = &outputs;
        check_sealed_outputs(first.comparisons as usize, verification, o0, o1)
            .map_err(FaceSessionError::Protocol)?;
        Ok(FaceOutcome {
            ids: first.ids,
            outputs,
            stats,
        })
    }
}

impl Rounds<2> for FaceSession<'_> {
    type Reply = Vec<u8>;
    type Last = [Vec<u8>; 2];

    /// Round 2 takes the peer's masked probe vector and answers the sealed distance shares;
    /// round 3 takes the peer's distance shares and answers the output shares sealed to the
    /// client.
    const ROUND_SQL: &'static str = "SELECT privmatch.face_masked_round($1, $2, $3)";
    const ROUND_FUNCTION: &'static str = "face_masked_round";

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn reply(&self, party: PartyIndex, round: i32, row: &Row) -> Result<Vec<u8>, FaceSessionError> {
        column(party, row, 0)
            .map_err(FaceSessionError::Party)?
            .ok_or_else(|| {
                FaceSessionError::Protocol(format!("{party} answered round {round} with NULL"))
            })
    }

    fn step(
        &self,
        round: i32,
        replies: [Vec<u8>; 2],
    ) -> Result<Step<2, [Vec<u8>; 2]>, FaceSessionError> {
        Ok(if round < 3 {
            Step::Relay(replies)
        } else {
            Step::Finished(replies)
        })
    }

    /// Each evaluator receives the other's message.
    fn route(&self, outbound: [Vec<u8>; 2]) -> [Vec<u8>; 2] {
        let [m0, m1] = outbound;
        [m1, m0]
    }
}

/// Checks a request before anything is sent.
fn validate(request: &FaceRequest) -> Result<(), FaceSessionError> {
    if request.probes.iter().any(Vec::is_empty) {
        return Err(FaceSessionError::Invalid("empty sealed probe".into()));
    }
    Ok(())
}

/// Runs one face session on pooled connections to P0 and P1, an identification with the
/// dealing `stocked` ahead of time when there is one ([`crate::face::stock`]). On failure the
/// session is aborted at both (its claimed keys are burnt, never reused); connections go
/// back to the pools only after a success.
pub async fn run_face_session(
    parties: &Parties,
    stocked: Option<Stocked>,
    request: &FaceRequest,
    timeout: Duration,
) -> Result<FaceOutcome, FaceSessionError> {
    validate(request)?;
    let session = FaceSession {
        request,
        parties,
        stocked,
        timeout,
    };
    let (mut outcome, elapsed) = run_pooled(parties, &session).await?;
    outcome.stats.micros = elapsed.as_micros() as u64;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::types::FromSql;

    /// A composite (int4, bytea, bytea) in PostgreSQL's binary record format.
    fn record(fields: &[(Type, Option<&[u8]>)]) -> Vec<u8> {
        let mut out = (fields.len() as i32).to_be_bytes().to_vec();
        for (ty, value) in fields {
            out.extend_from_slice(&ty.oid().to_be_bytes());
            match value {
                Some(v) => {
                    out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    out.extend_from_slice(v);
                }
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        out
    }

    #[test]
    fn dealt_rows_decode_from_the_binary_record_and_refuse_anything_else() {
        let chunk = 7i32.to_be_bytes();
        let good = record(&[
            (Type::INT4, Some(&chunk)),
            (Type::BYTEA, Some(b"to P0")),
            (Type::BYTEA, Some(b"")),
        ]);
        let row = DealtRow::from_sql(&Type::RECORD, &good).expect("a dealt row");
        assert_eq!(row.chunk, 7);
        assert_eq!(row.envelopes, [b"to P0".to_vec(), Vec::new()]);
        let bad = [
            record(&[(Type::INT4, Some(&chunk)), (Type::BYTEA, Some(b"x"))]),
            record(&[
                (Type::INT4, Some(&chunk)),
                (Type::TEXT, Some(b"x")),
                (Type::BYTEA, Some(b"y")),
            ]),
            record(&[
                (Type::INT4, Some(&chunk)),
                (Type::BYTEA, None),
                (Type::BYTEA, Some(b"y")),
            ]),
            good[..good.len() - 1].to_vec(),
            [good.as_slice(), b"!"].concat(),
            Vec::new(),
        ];
        for (i, raw) in bad.iter().enumerate() {
            assert!(DealtRow::from_sql(&Type::RECORD, raw).is_err(), "case {i}");
        }
        assert!(DealtRow::accepts(&Type::RECORD) && !DealtRow::accepts(&Type::BYTEA));
    }

    fn open(n: i32, digest: u8) -> OpenReply {
        OpenReply {
            comparisons: n,
            ids: (0..n.max(0) as u8).flat_map(|i| [i; 16]).collect(),
            digest: vec![digest; 32],
            masked_probe: None,
        }
    }

    #[test]
    fn sqlstates_map_to_kinds() {
        let kind = |s: &str| FaceErrorKind::from_sqlstate(Some(s));
        assert_eq!(kind("P0002"), FaceErrorKind::UnknownSubject);
        assert_eq!(kind("22023"), FaceErrorKind::BadArgument);
        assert_eq!(kind("22P02"), FaceErrorKind::BadArgument);
        assert_eq!(kind("40001"), FaceErrorKind::SetsDiffer);
        assert_eq!(kind("23P01"), FaceErrorKind::Other);
        assert_eq!(kind("23505"), FaceErrorKind::KeyConflict);
        assert_eq!(kind("08P01"), FaceErrorKind::Refused);
        assert_eq!(kind("42704"), FaceErrorKind::SessionNotFound);
        assert_eq!(kind("55000"), FaceErrorKind::NotConfigured);
        assert_eq!(kind("XX000"), FaceErrorKind::Other);
        assert_eq!(FaceErrorKind::from_sqlstate(None), FaceErrorKind::Other);
        assert!(kind("40001").is_retryable() && kind("23505").is_retryable());
        assert!(!kind("53000").is_retryable() && !kind("08P01").is_retryable());
        let err = FaceSessionError::Party(PartyError {
            party: PartyIndex::ALL[1],
            sqlstate: Some("40001".into()),
            message: String::new(),
        });
        assert_eq!(err.kind(), FaceErrorKind::SetsDiffer);
        assert_eq!(
            FaceSessionError::Protocol("x".into()).kind(),
            FaceErrorKind::Other
        );
    }

    #[test]
    fn opens_are_checked() {
        assert!(check_first_open(&open(2, 1)).is_ok());
        assert!(check_first_open(&open(0, 1)).is_ok());
        let mut unlisted = open(1, 1);
        unlisted.ids.clear();
        assert!(check_first_open(&unlisted).is_err());
        // A verification answers one comparison and a sealed message, and no id; an
        // identification no masked probe.
        let verification = OpenReply {
            comparisons: 1,
            masked_probe: Some(vec![2; 64]),
            ..OpenReply::default()
        };
        assert!(check_open("P1", &verification, true).is_ok());
        let mut unmasked = verification.clone();
        unmasked.masked_probe = None;
        assert!(check_open("P1", &unmasked, true).is_err());
        let mut masked = open(1, 1);
        masked.masked_probe = Some(vec![2; 64]);
        assert!(check_open("P0", &masked, false).is_err());
        assert!(check_open("P1", &open(1, 1), true).is_err());
        let mut listed = verification.clone();
        listed.ids = vec![0; 16];
        assert!(check_open("P1", &listed, true).is_err());
        let mut two = verification.clone();
        two.comparisons = 2;
        assert!(check_open("P1", &two, true).is_err());
        assert!(check_parallel_opens(&verification, &verification, true).is_ok());

        let p0 = open(2, 1);
        assert!(check_second_open(&p0, &open(2, 1)).is_ok());
        assert!(check_second_open(&p0, &open(1, 1)).is_err());
        assert!(check_second_open(&p0, &open(2, 2)).is_err());
        let mut reordered = open(2, 1);
        reordered.ids.reverse();
        assert!(check_second_open(&p0, &reordered).is_err());
    }

    #[test]
    fn sealed_outputs_are_checked_for_their_length_only() {
        let ok = vec![0u8; sealed_output_len(1)];
        assert_eq!(check_sealed_outputs(1, true, &ok, &ok), Ok(()));
        let err = check_sealed_outputs(1, true, &ok, &ok[..20])
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("P1 returned a sealed output of 20 bytes"),
            "{err}"
        );
        // An identification's lists its subjects inside: longer, and the same at both.
        let listed = vec![0u8; sealed_output_len(3) + 30];
        assert_eq!(check_sealed_outputs(3, false, &listed, &listed), Ok(()));
        assert!(check_sealed_outputs(3, false, &listed, &listed[..listed.len() - 1]).is_err());
        assert!(check_sealed_outputs(3, false, &listed[..sealed_output_len(3)], &listed).is_err());
        // Against a list the client knows: the shares only, as long as a verification's.
        let known = &listed[..sealed_output_len(3)];
        assert_eq!(check_sealed_outputs(3, false, known, known), Ok(()));
        assert!(check_sealed_outputs(3, false, &known[1..], &known[1..]).is_err());
        // The length of 4-byte shares in the clear (the old answer) is refused.
        let clear = vec![0u8; 12];
        assert!(check_sealed_outputs(3, false, &clear, &listed).is_err());
    }
}
