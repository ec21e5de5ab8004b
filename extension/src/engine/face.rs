//! The face 1:N service the engine hosts at the evaluators P0 and P1: the opened dealer-masked
//! templates ([`MaskedTemplateSet`]: Δy = y + δy and this party's mask seed, never y; Funshade,
//! Ibarrondo, Chabanne, Önen, PETS 2023, ePrint 2022/1688, with the template masked once —
//! docs/protocols/face.md §13), kept in step with `privmatch.face_masked_templates` and
//! `privmatch.face_templates`, and the running face sessions between their rounds.
//!
//! A session (docs/protocols/face.md §13.2 step 2): `open` fixes the probe share and the
//! ordered list of compared templates, and may claim a dealing stocked ahead of time for that
//! list (docs/protocols/face.md §13.7); `keys` opens the dealer's key half for this session
//! and list (P2's chunks; none when a stocked dealing was claimed) and answers
//! X_b = x_b + δx_b sealed for the other evaluator; round 2
//! opens X_{1−b} and answers z_b for every compared template (the evaluation of the whole 1:N
//! on the engine's threads); round 3 opens z_{1−b} and answers the output shares o_b sealed
//! to the client's reply key (core's `face::reply`; the coordinator relays them unread), which
//! ends the session. A 1:1 verification (docs/protocols/face.md §13.10) answers its round-2
//! message X_b ‖ Y'_b from the open (masks derived from what this party shares with P2 for the
//! session, so P2 deals meanwhile), and its keys step and round 2 come in one request
//! (`KEYED_ROUND`). Sessions live in memory only, for at most `privmatch.search_timeout`
//! between requests; single use of a session id is the table `face_sessions`' job, single use
//! of a stocked dealing the table `face_stock_used`'s (the backend records the claim in the
//! open's transaction). Stocked dealings live in memory only: an engine restart loses them
//! (they are dealt again), never a claim.
//!
//! Consistency: before every open the worker runs [`FaceService::refresh`] on its main
//! thread: it drops templates whose rows are gone (deleted enrolments) and loads the opened
//! ones it lacks — unless the set version (`privmatch.face_set_version`, bumped by triggers in
//! every transaction that changes the template tables; docs/protocols/face.md §13.8) is the
//! one its last complete pass saw. A running session keeps the bundle ids it compares; if the set changed
//! since its open, round 2 finds them again by id, and fails if one was deleted.
//!
//! Messages between the backend and this service travel as [`Call`]s of [`Modality::Face`]
//! and [`Response::Reply`] payloads; their layouts are the `encode_*`/`decode_*` pairs below.
//! Imports: [`super::ipc`], core's `face`, and the shared `crate::errors::read` (saved plans);
//! no module of `crate::face`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use pgrx::prelude::*;
use privmatch_core::crypto::seal::PartyKeys;
use privmatch_core::crypto::seal::{Channel, PairwiseSecrets, PartyPublicKey};
use privmatch_core::face::encoding::{evaluator, EmbeddingShare};
use privmatch_core::face::funshade::{bytes_to_words, words_to_bytes};
use privmatch_core::face::mask_dealer::open_identification_key_chunks;
use privmatch_core::face::masked::{
    distance_round_selected, probe_round, sign_round, template_digest, verification_distance,
    verification_message, IdentificationKeys, KeysFor, MaskedTemplateSet, VerificationSeeds,
    BUNDLE_ID_LEN, VERIFICATION_LIST_DIGEST,
};
use privmatch_core::face::opening::session_channel;
use privmatch_core::face::reply::{subjects_digest, ReplySealer};
use privmatch_core::party::PartyIndex;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use zeroize::Zeroize;

use super::ipc::{Call, EngineError, ErrorKind, Modality, Request, Response};

/// Face sessions one party keeps at once (each holds its keys, 683 bytes per comparison).
pub const MAX_FACE_SESSIONS: usize = 64;
/// Stocked dealings one evaluator keeps at most (the oldest is dropped first).
pub const MAX_STOCKED: usize = 4;
/// Sealed bytes of stocked dealings one evaluator keeps at most (1 GiB: one dealing at
/// N = 1,000,000 is about 683 MB); the oldest are dropped first, the newest always kept.
pub const MAX_STOCK_BYTES: usize = 1 << 30;
/// Rows loaded per SPI query.
const LOAD_CHUNK: usize = 1024;
/// Lists of at most this many templates (verifications) refresh only themselves before an
/// open; longer ones and identifications refresh the whole set.
const TARGETED_REFRESH: usize = 64;

/// A bundle id.
pub type BundleId = [u8; BUNDLE_ID_LEN];

/// The operations of the face service ([`Modality::Face`]).
pub mod op {
    /// Open a session: fix the probe share and the compared list.
    pub const OPEN: u8 = 1;
    /// The dealer's key chunks; answers the sealed masked probe vector.
    pub const KEYS: u8 = 2;
    /// Round 2 (peer's masked probe vector) or 3 (peer's distance shares).
    pub const ROUND: u8 = 3;
    /// A dealing made ahead of time: P2's key chunks under a stock id, kept for a later open.
    pub const STOCK: u8 = 4;
    /// A verification's keys and round 2 in one request (its masked vectors went out with the
    /// opens, so nothing needs to leave between the two).
    pub const KEYED_ROUND: u8 = 5;
    /// End a session: its keys and probe are dropped (answered on the worker's main thread).
    pub const ABORT: u8 = 6;
}

/// The engine request of face operation `op`.
fn face_request<'a>(op: u8, head: Vec<u8>, payload: Cow<'a, [u8]>) -> Request<'a> {
    Request::Call(Call {
        modality: Modality::Face,
        op,
        head,
        payload,
    })
}

/// The engine response carrying a face step's answer (the face replies have no head).
fn face_reply(payload: Vec<u8>) -> Response {
    Response::Reply {
        head: Vec::new(),
        payload,
    }
}

/// The request that aborts face session `session` at this party's engine.
pub fn encode_abort(session: &[u8; 16]) -> Request<'static> {
    face_request(op::ABORT, session.to_vec(), Cow::Borrowed(&[][..]))
}

/// The answer to an abort: whether the session was running (one byte).
pub fn aborted_reply(aborted: bool) -> Response {
    face_reply(vec![u8::from(aborted)])
}

/// Reads an abort's session id (the engine side).
pub fn decode_abort(head: &[u8]) -> Result<[u8; 16], EngineError> {
    let mut c = Cursor(head);
    let session = c.array()?;
    c.end()?;
    Ok(session)
}

// ---------------------------------------------------------------------------------------------
// Messages between a backend and the service.
// ---------------------------------------------------------------------------------------------

fn malformed() -> EngineError {
    EngineError::internal("malformed face request")
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EngineError> {
        if self.0.len() < n {
            return Err(malformed());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, EngineError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], EngineError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn ids(&mut self) -> Result<Vec<BundleId>, EngineError> {
        let n = self.u32()? as usize;
        (0..n).map(|_| self.array()).collect()
    }
    fn end(&self) -> Result<(), EngineError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(malformed())
        }
    }
}

fn put_ids(out: &mut Vec<u8>, ids: &[BundleId]) {
    out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        out.extend_from_slice(id);
    }
}

/// What a backend asks to open a session with.
pub struct OpenRequest {
    /// Face session id.
    pub session: [u8; 16],
    /// This party's share of the probe.
    pub probe: EmbeddingShare,
    /// The reply key from the sealed probe: the outputs are sealed to it.
    pub reply_key: PartyPublicKey,
    /// The compared templates in order; `None`: every held template, in the held order.
    pub wanted: Option<Vec<BundleId>>,
    /// A stocked dealing to claim for the session if it was dealt for the compared list.
    pub stock: Option<[u8; 16]>,
    /// The digest of a list the caller knows already: when the compared list has it, the
    /// answer omits the ids.
    pub known: Option<[u8; 32]>,
    /// A 1:1 verification (its keys are dealt as [`KeysFor::Verification`], its output lists
    /// no subject); else an identification.
    pub verification: bool,
    /// The digest of the compared-subject list the client knows (from its sealed probe): an
    /// identification over a list with that digest seals the digest only, not the list.
    pub known_subjects: Option<[u8; 32]>,
}

/// The request of an open.
pub fn encode_open(req: &OpenRequest) -> Request<'static> {
    let mut head = Vec::with_capacity(32 + 4 * req.probe.elements.len());
    head.extend_from_slice(&req.session);
    head.extend_from_slice(req.reply_key.as_bytes());
    head.extend_from_slice(&req.probe.norm.to_le_bytes());
    head.extend_from_slice(&words_to_bytes(&req.probe.elements));
    let mut list = Vec::new();
    if let Some(ids) = &req.wanted {
        list.push(1);
        put_ids(&mut list, ids);
    } else {
        list.push(0);
    }
    for optional in [
        req.stock.as_ref().map(|s| &s[..]),
        req.known.as_ref().map(|k| &k[..]),
        req.known_subjects.as_ref().map(|k| &k[..]),
    ] {
        match optional {
            Some(bytes) => {
                list.push(1);
                list.extend_from_slice(bytes);
            }
            None => list.push(0),
        }
    }
    list.push(u8::from(req.verification));
    face_request(op::OPEN, head, list.into())
}

fn decode_open(head: &[u8], payload: &[u8]) -> Result<OpenRequest, EngineError> {
    let mut c = Cursor(head);
    let session = c.array()?;
    let reply_key = PartyPublicKey::from_bytes(c.array()?);
    let norm = c.u32()?;
    let elements = bytes_to_words(c.0).map_err(|_| malformed())?;
    let mut p = Cursor(payload);
    let wanted = match p.take(1)?[0] {
        0 => None,
        _ => Some(p.ids()?),
    };
    let stock = match p.take(1)?[0] {
        0 => None,
        _ => Some(p.array()?),
    };
    let known = match p.take(1)?[0] {
        0 => None,
        _ => Some(p.array()?),
    };
    let known_subjects = match p.take(1)?[0] {
        0 => None,
        _ => Some(p.array()?),
    };
    let verification = p.take(1)?[0] != 0;
    p.end()?;
    Ok(OpenRequest {
        session,
        probe: EmbeddingShare { elements, norm },
        reply_key,
        wanted,
        stock,
        known,
        verification,
        known_subjects,
    })
}

/// What an open answers: the number of comparisons, the compared list and its digest (never
/// the subjects: they reach the client only inside the sealed output).
pub struct Opened {
    /// Templates compared.
    pub comparisons: u32,
    /// Bundle ids compared, in order (empty when the caller knew the list: [`OpenRequest::known`]).
    pub ids: Vec<BundleId>,
    /// [`template_digest`] of `ids`.
    pub digest: [u8; 32],
    /// Whether the session claimed the stocked dealing it was asked to (it has its keys).
    pub claimed: bool,
    /// A verification's masked probe vector X_b, sealed for the other evaluator (round 2's
    /// message, sent from the open: docs/protocols/face.md §13.10); empty for an
    /// identification, whose X_b follows from the dealt keys.
    pub masked_probe: Vec<u8>,
}

fn encode_opened(opened: &Opened) -> Vec<u8> {
    let mut out = Vec::with_capacity(45 + opened.ids.len() * 16 + opened.masked_probe.len());
    out.extend_from_slice(&opened.digest);
    out.push(u8::from(opened.claimed));
    out.extend_from_slice(&opened.comparisons.to_le_bytes());
    put_ids(&mut out, &opened.ids);
    out.extend_from_slice(&(opened.masked_probe.len() as u32).to_le_bytes());
    out.extend_from_slice(&opened.masked_probe);
    out
}

/// Parses the answer of an open.
pub fn decode_opened(body: &[u8]) -> Result<Opened, EngineError> {
    let mut c = Cursor(body);
    let digest = c.array()?;
    let claimed = c.take(1)?[0] != 0;
    let comparisons = c.u32()?;
    let ids = c.ids()?;
    if !ids.is_empty() && ids.len() != comparisons as usize {
        return Err(malformed());
    }
    let len = c.u32()? as usize;
    let masked_probe = c.take(len)?.to_vec();
    c.end()?;
    Ok(Opened {
        comparisons,
        ids,
        digest,
        claimed,
        masked_probe,
    })
}

/// The request carrying P2's sealed key chunks of session `session` (none: the session uses
/// the stocked dealing its open claimed).
pub fn encode_keys<'a>(session: &[u8; 16], chunks: &[&[u8]]) -> Request<'a> {
    encode_chunks(op::KEYS, session, chunks)
}

/// The request stocking P2's sealed key chunks dealt under stock id `stock`.
pub fn encode_stock<'a>(stock: &[u8; 16], chunks: &[&[u8]]) -> Request<'a> {
    encode_chunks(op::STOCK, stock, chunks)
}

fn encode_chunks<'a>(op: u8, session: &[u8; 16], chunks: &[&[u8]]) -> Request<'a> {
    let (head, payload) = chunk_parts(session, chunks, 0);
    face_request(op, head, payload.into())
}

/// Head (session id, chunk count, chunk lengths) and payload (the chunks, with room for
/// `extra` bytes more) of a request carrying key chunks.
fn chunk_parts(session: &[u8; 16], chunks: &[&[u8]], extra: usize) -> (Vec<u8>, Vec<u8>) {
    let mut head = session.to_vec();
    head.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    let mut payload = Vec::with_capacity(chunks.iter().map(|c| c.len()).sum::<usize>() + extra);
    for chunk in chunks {
        head.extend_from_slice(&(chunk.len() as u64).to_le_bytes());
        payload.extend_from_slice(chunk);
    }
    (head, payload)
}

fn decode_keys<'a>(
    head: &[u8],
    payload: &'a [u8],
) -> Result<([u8; 16], Vec<&'a [u8]>), EngineError> {
    let (session, chunks, rest) = decode_chunks(head, payload)?;
    Cursor(rest).end()?;
    Ok((session, chunks))
}

/// A decoded request with key chunks: the session (or stock) id, the chunks, and what the
/// payload holds after them.
type Chunked<'a> = ([u8; 16], Vec<&'a [u8]>, &'a [u8]);

/// The session id and chunks of [`encode_chunks`], and what the payload holds after them.
fn decode_chunks<'a>(head: &[u8], payload: &'a [u8]) -> Result<Chunked<'a>, EngineError> {
    let mut c = Cursor(head);
    let session = c.array()?;
    let n = c.u32()? as usize;
    let mut p = Cursor(payload);
    let mut chunks = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let len = u64::from_le_bytes(c.array()?);
        chunks.push(p.take(usize::try_from(len).map_err(|_| malformed())?)?);
    }
    c.end()?;
    Ok((session, chunks, p.0))
}

/// The request of a verification's keys step and round 2 at once: P2's key chunks, then the
/// other evaluator's message of the open (`message`).
pub fn encode_keyed_round<'a>(session: &[u8; 16], chunks: &[&[u8]], message: &[u8]) -> Request<'a> {
    let (head, mut payload) = chunk_parts(session, chunks, message.len());
    payload.extend_from_slice(message);
    face_request(op::KEYED_ROUND, head, payload.into())
}

/// The request of round 2 or 3 of session `session` with the other evaluator's message.
pub fn encode_round<'a>(session: &[u8; 16], round: u8, message: &'a [u8]) -> Request<'a> {
    let mut head = session.to_vec();
    head.push(round);
    face_request(op::ROUND, head, message.into())
}

// ---------------------------------------------------------------------------------------------
// The held templates.
// ---------------------------------------------------------------------------------------------

/// The opened templates of this evaluator and their subjects.
struct Store {
    set: MaskedTemplateSet,
    subjects: HashMap<BundleId, String>,
    /// Bumped on every change, so a session knows whether its positions still hold.
    generation: u64,
    /// The template and subjects digests of the whole held set, in held order, computed by
    /// the first identification after a change ([`Store::changed`] forgets them): an
    /// identification over 10,000 templates need not hash 10,000 subject names each time.
    whole_digests: OnceLock<([u8; 32], [u8; 32])>,
}

impl Store {
    /// Records a change of the held set.
    fn changed(&mut self) {
        self.generation += 1;
        self.whole_digests = OnceLock::new();
    }

    fn subject_of(&self, id: &BundleId) -> &str {
        self.subjects.get(id).map_or("", String::as_str)
    }

    /// The template digest and subjects digest of `ids` (in order).
    fn digests_of(&self, ids: &[BundleId]) -> ([u8; 32], [u8; 32]) {
        (
            template_digest(ids),
            subjects_digest(ids.iter().map(|id| self.subject_of(id))),
        )
    }
}

fn spi_error(e: pgrx::spi::Error) -> EngineError {
    EngineError::internal(format!("reading the face template tables: {e}"))
}

/// The first column of the first row of the read-only `query`, through its saved plan: the
/// worker runs the same few statements on every open, so they are parsed and planned once
/// (`crate::plans`), not on every verification.
fn first_value<T: pgrx::datum::FromDatum + pgrx::datum::IntoDatum>(
    query: &str,
) -> Result<Option<T>, EngineError> {
    Spi::connect(|client| {
        let rows = crate::errors::read(client, query, &[]).map_err(spi_error)?;
        match rows.into_iter().next() {
            Some(row) => row.get::<T>(1).map_err(spi_error),
            None => Ok(None),
        }
    })
}

fn masked_table_exists() -> Result<bool, EngineError> {
    first_value::<bool>("SELECT to_regclass('privmatch.face_masked_templates') IS NOT NULL")
        .map(|v| v.unwrap_or(false))
}

/// The set version (docs/protocols/face.md §13.8): the epoch and every counter, as this
/// transaction's snapshot sees them; `None` before the extension's catalog has the table (an
/// update pending).
fn set_version() -> Result<Option<SetVersion>, EngineError> {
    let exists =
        first_value::<bool>("SELECT to_regclass('privmatch.face_set_version') IS NOT NULL")?
            .unwrap_or(false);
    if !exists {
        return Ok(None);
    }
    first_value::<String>(
        "SELECT string_agg(epoch::text || ':' || version, ',' ORDER BY shard) \
           FROM privmatch.face_set_version",
    )
    .map(|v| v.map(SetVersion))
}

/// The opened templates whose enrolment is still there: all of them, or those of `only`.
fn opened_ids(only: Option<&[BundleId]>) -> Result<Vec<BundleId>, EngineError> {
    const ALL: &str = "SELECT m.bundle_id FROM privmatch.face_masked_templates m \
                         JOIN privmatch.face_templates t USING (bundle_id)";
    let listed = format!("{ALL} WHERE m.bundle_id = ANY($1)");
    Spi::connect(|client| {
        let rows = match only {
            None => crate::errors::read(client, ALL, &[]),
            Some(ids) => {
                let keys: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
                crate::errors::read(client, &listed, &[keys.into()])
            }
        }
        .map_err(spi_error)?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            let id: Vec<u8> = row.get(1).map_err(spi_error)?.unwrap_or_default();
            ids.push(id.try_into().map_err(|_| malformed_row("bundle id"))?);
        }
        Ok(ids)
    })
}

fn not_updated() -> EngineError {
    EngineError::new(
        ErrorKind::NotReady,
        "this party's privmatch extension predates dealer-masked face templates: run ALTER EXTENSION privmatch UPDATE",
    )
}

fn malformed_row(what: &str) -> EngineError {
    EngineError::internal(format!(
        "privmatch.face_masked_templates holds a malformed {what}"
    ))
}

/// One opened template as stored.
struct LoadedRow {
    id: BundleId,
    subject: String,
    opened: Vec<u32>,
    seed: [u8; 16],
    norm: u32,
}

fn load_rows(ids: &[BundleId]) -> Result<Vec<LoadedRow>, EngineError> {
    let keys: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
    Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT m.bundle_id, t.subject, m.masked, m.seed, t.norm_share \
                   FROM privmatch.face_masked_templates m \
                   JOIN privmatch.face_templates t USING (bundle_id) \
                  WHERE m.bundle_id = ANY($1)",
                None,
                &[keys.into()],
            )
            .map_err(spi_error)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let id: Vec<u8> = row.get(1).map_err(spi_error)?.unwrap_or_default();
            let subject: String = row.get(2).map_err(spi_error)?.unwrap_or_default();
            let masked: Vec<u8> = row.get(3).map_err(spi_error)?.unwrap_or_default();
            let seed: Vec<u8> = row.get(4).map_err(spi_error)?.unwrap_or_default();
            let norm: i32 = row.get(5).map_err(spi_error)?.unwrap_or_default();
            out.push(LoadedRow {
                id: id.try_into().map_err(|_| malformed_row("bundle id"))?,
                subject,
                opened: bytes_to_words(&masked).map_err(|_| malformed_row("template"))?,
                seed: seed.try_into().map_err(|_| malformed_row("seed"))?,
                norm: norm as u32,
            });
        }
        Ok(out)
    })
}

/// Loads the opened templates `missing` into the held set (created for evaluator `b` at the
/// first template), logging progress on large loads (a restart with many templates).
fn load_into(
    guard: &mut std::sync::RwLockWriteGuard<'_, Option<Store>>,
    b: usize,
    missing: &[BundleId],
) -> Result<(), EngineError> {
    if missing.is_empty() {
        return Ok(());
    }
    let verbose = missing.len() >= 10_000;
    if verbose {
        pgrx::log!(
            "privmatch engine: loading {} opened face templates",
            missing.len()
        );
    }
    let started = Instant::now();
    for chunk in missing.chunks(LOAD_CHUNK) {
        for row in load_rows(chunk)? {
            if guard.is_none() {
                let set = MaskedTemplateSet::new(b, row.opened.len())
                    .map_err(|e| EngineError::internal(e.to_string()))?;
                **guard = Some(Store {
                    set,
                    subjects: HashMap::new(),
                    generation: 0,
                    whole_digests: OnceLock::new(),
                });
            }
            let Some(store) = guard.as_mut() else {
                continue;
            };
            store
                .set
                .push_opened(row.id, &row.opened, &row.seed, row.norm)
                .map_err(|e| EngineError::internal(format!("face template: {e}")))?;
            store.subjects.insert(row.id, row.subject);
            store.changed();
        }
    }
    if verbose {
        pgrx::log!(
            "privmatch engine: {} opened face templates in memory, loaded in {:.1} s",
            guard.as_ref().map_or(0, |s| s.set.len()),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sessions.
// ---------------------------------------------------------------------------------------------

/// One running face session at this evaluator.
struct Session {
    me: PartyIndex,
    probe: EmbeddingShare,
    ids: Vec<BundleId>,
    digest: [u8; 32],
    /// Positions of `ids` in the set, valid while the store's generation is `generation`.
    positions: Vec<usize>,
    generation: u64,
    channel: Channel,
    from_dealer: PairwiseSecrets,
    /// Seals the round-3 output to the client's reply key.
    reply: ReplySealer,
    /// [`subjects_digest`] of the compared subjects, sealed with the output.
    subjects_digest: [u8; 32],
    /// An identification's compared subjects, listed inside the sealed output (the client
    /// learns them from there only); `None` for a verification.
    listed: Option<Vec<String>>,
    /// What the dealer's key half must have been dealt for.
    keys_for: KeysFor,
    /// Set at the open when a stocked dealing was claimed, else by the keys step.
    keys: Option<IdentificationKeys>,
    /// A verification's mask seeds, derived at the open: its message went out from there,
    /// and the dealt keys must be for these seeds.
    verification: Option<VerificationSeeds>,
    /// The round-2 vector this evaluator sent: X_b (an identification), or X_b ‖ Y'_b (a
    /// verification, core's `verification_message`).
    own_x: Vec<u32>,
    own_z: Vec<u32>,
    /// Last completed step: 0 opened, 1 keys, 2 distance.
    step: u8,
    touched: Instant,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.probe.elements.zeroize();
        self.own_x.zeroize();
        self.own_z.zeroize();
    }
}

/// One dealing made ahead of time (docs/protocols/face.md §13.7), waiting for the open that
/// claims it.
struct Stocked {
    id: [u8; 16],
    keys: IdentificationKeys,
    /// Sealed bytes it arrived in (what [`MAX_STOCK_BYTES`] counts).
    bytes: usize,
}

/// A version of the evaluator's template set: `privmatch.face_set_version`'s epoch and
/// counters, as text.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SetVersion(String);

/// The face service of the engine (module docs). Cloning shares it.
#[derive(Clone)]
pub struct FaceService {
    store: Arc<RwLock<Option<Store>>>,
    /// The set version the last complete refresh saw (read before its pass over the set):
    /// while the tables show it still, nothing changed and the held set is current.
    refreshed_at: Arc<Mutex<Option<SetVersion>>>,
    sessions: Arc<Mutex<HashMap<[u8; 16], Session>>>,
    /// Stocked dealings, oldest first.
    stock: Arc<Mutex<Vec<Stocked>>>,
    threads: usize,
    timeout: Duration,
}

fn unknown(session: &[u8; 16], why: &str) -> EngineError {
    EngineError::new(
        ErrorKind::UnknownSession,
        format!("face session {} {why}", hex::encode(session)),
    )
}

/// This party's pairwise secrets with `peer` (derived once per process).
fn channel_secrets(keys: &PartyKeys, peer: PartyIndex) -> Result<PairwiseSecrets, EngineError> {
    let pinned = keys.peers[peer.as_usize()].ok_or_else(|| {
        EngineError::new(
            ErrorKind::NotReady,
            format!("{peer} is not pinned at this party"),
        )
    })?;
    crate::identity::CHANNELS
        .derive(keys.me, &keys.secret, peer, &pinned)
        .map_err(|e| EngineError::internal(e.to_string()))
}

/// The words of the peer's verification message `plain` (its list digest, then X ‖ Y'), when
/// the peer compared the same template as this evaluator (`digest`); else 40001, as when the
/// evaluators' lists differ at an identification's open.
fn peer_verification_words<'a>(
    plain: &'a [u8],
    digest: &[u8; 32],
) -> Result<&'a [u8], EngineError> {
    let (list, words) = plain
        .split_at_checked(32)
        .ok_or_else(|| refused("the peer's masked probe", "it is too short"))?;
    if list != digest {
        return Err(EngineError::new(
            ErrorKind::Retry,
            "the evaluators compared different face templates (an enrolment or deletion is in flight); retry with a new session",
        ));
    }
    Ok(words)
}

fn refused(what: &str, err: impl std::fmt::Display) -> EngineError {
    EngineError::new(ErrorKind::Protocol, format!("{what} was refused: {err}"))
}

impl FaceService {
    /// No templates loaded yet; evaluations run on `threads` threads; sessions expire after
    /// `timeout` without a request.
    pub fn new(threads: usize, timeout: Duration) -> Self {
        FaceService {
            store: Arc::new(RwLock::new(None)),
            refreshed_at: Arc::new(Mutex::new(None)),
            sessions: Arc::new(Mutex::new(HashMap::new())),
            stock: Arc::new(Mutex::new(Vec::new())),
            threads: threads.max(1),
            timeout,
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 16], Session>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Running sessions.
    pub fn active(&self) -> usize {
        self.sessions().len()
    }

    fn stock(&self) -> std::sync::MutexGuard<'_, Vec<Stocked>> {
        self.stock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps P2's dealing `chunks` under stock id `stock` (opened and checked now: a half
    /// not sealed by P2 for this stock id and this party is refused), dropping the oldest
    /// stocked dealings beyond [`MAX_STOCKED`] or [`MAX_STOCK_BYTES`]. Answers how many are
    /// held, as 4 bytes little-endian. Whether the id was claimed before is the backend's
    /// check (`face_stock_used`); a replayed id is refused here while it is held.
    fn keep_stock(
        &self,
        keys: &PartyKeys,
        stock: [u8; 16],
        chunks: &[&[u8]],
    ) -> Result<Response, EngineError> {
        let me = keys.me;
        let from_dealer = channel_secrets(keys, PartyIndex::ALL[2])?;
        let dealt = open_identification_key_chunks(me, &from_dealer, KeysFor::Stock(stock), chunks)
            .map_err(|e| refused("the dealer's stocked key half", e))?;
        let bytes = chunks.iter().map(|c| c.len()).sum();
        let mut held = self.stock();
        if held.iter().any(|s| s.id == stock) {
            return Err(EngineError::new(
                ErrorKind::BadParameter,
                format!("stocked dealing {} is already held", hex::encode(stock)),
            ));
        }
        held.push(Stocked {
            id: stock,
            keys: dealt,
            bytes,
        });
        while held.len() > MAX_STOCKED
            || (held.len() > 1 && held.iter().map(|s| s.bytes).sum::<usize>() > MAX_STOCK_BYTES)
        {
            held.remove(0);
        }
        Ok(face_reply((held.len() as u32).to_le_bytes().to_vec()))
    }

    /// Takes stocked dealing `stock` out of the stock if it was dealt for the list with
    /// `digest` and `count` templates. An identification over the whole set (`whole`) also
    /// drops the dealings for other lists: the set moved on, they can never be claimed.
    fn claim_stock(
        &self,
        stock: &[u8; 16],
        digest: &[u8; 32],
        count: usize,
        whole: bool,
    ) -> Option<IdentificationKeys> {
        let mut held = self.stock();
        let fits = |s: &Stocked| s.keys.digest() == digest && s.keys.len() == count;
        if whole {
            held.retain(|s| fits(s));
        }
        let at = held.iter().position(|s| &s.id == stock && fits(s))?;
        Some(held.remove(at).keys)
    }

    /// Drops session `session`; whether it was running.
    pub fn abort(&self, session: &[u8; 16]) -> bool {
        self.sessions().remove(session).is_some()
    }

    /// Drops sessions idle for longer than the timeout.
    pub fn expire(&self, now: Instant) {
        let timeout = self.timeout;
        self.sessions()
            .retain(|_, s| now.saturating_duration_since(s.touched) < timeout);
    }

    /// Before an open (its request's `head` and `payload`): brings the held templates up to
    /// date — all of them for an identification without a given list, only the listed ones
    /// for a short list (a verification: one query by primary key instead of a pass over every
    /// opened template). Runs inside the caller's transaction, on the worker's main thread.
    pub fn refresh_for_open(
        &self,
        me: PartyIndex,
        head: &[u8],
        payload: &[u8],
    ) -> Result<(), EngineError> {
        match decode_open(head, payload)?.wanted {
            Some(wanted) if wanted.len() <= TARGETED_REFRESH => self.refresh_listed(me, &wanted),
            _ => self.refresh(me),
        }
    }

    /// Brings the templates `wanted` up to date: loads those opened and enrolled but not held,
    /// drops those held but no longer there.
    fn refresh_listed(&self, me: PartyIndex, wanted: &[BundleId]) -> Result<(), EngineError> {
        let b = evaluator(me).map_err(|e| EngineError::new(ErrorKind::NotReady, e.to_string()))?;
        if !masked_table_exists()? {
            return Err(not_updated());
        }
        let present: HashSet<BundleId> = opened_ids(Some(wanted))?.into_iter().collect();
        let mut guard = self.store.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = guard.as_mut() {
            let gone: HashSet<BundleId> = wanted
                .iter()
                .filter(|id| !present.contains(*id) && store.set.contains(id))
                .copied()
                .collect();
            if !gone.is_empty() {
                store.set.retain(|id| !gone.contains(id));
                store.subjects.retain(|id, _| !gone.contains(id));
                store.changed();
            }
        }
        let missing: Vec<BundleId> = present
            .into_iter()
            .filter(|id| guard.as_ref().is_none_or(|s| !s.set.contains(id)))
            .collect();
        load_into(&mut guard, b, &missing)
    }

    /// Brings the held templates up to date with the tables (module docs), and refuses
    /// (Retry, 40001) while an enrolled template is not opened yet: an identification compares
    /// every enrolled template, so the coordinator opens the pending ones and asks again
    /// (instead of asking whether any is pending before every identification). When the set
    /// version is the one the last complete refresh saw, nothing changed since and nothing is
    /// read (docs/protocols/face.md §13.8). Runs inside the caller's transaction, on the
    /// worker's main thread. `me` must be P0 or P1.
    pub fn refresh(&self, me: PartyIndex) -> Result<(), EngineError> {
        let version = set_version()?;
        let mut refreshed_at = self
            .refreshed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if version.is_some() && *refreshed_at == version {
            return Ok(());
        }
        // Read before the pass: a change committed during it moves the version again, so
        // the next open passes over the set once more.
        self.refresh_all(me)?;
        *refreshed_at = version;
        Ok(())
    }

    /// The pass of [`FaceService::refresh`] over every opened template.
    fn refresh_all(&self, me: PartyIndex) -> Result<(), EngineError> {
        let b = evaluator(me).map_err(|e| EngineError::new(ErrorKind::NotReady, e.to_string()))?;
        if !masked_table_exists()? {
            return Err(not_updated());
        }
        let ids = opened_ids(None)?;
        // Opened rows are deleted with their enrolment, so the opened ones are a subset of
        // the enrolled ones: equal counts mean nothing is pending.
        let enrolled = Spi::get_one::<i64>("SELECT count(*) FROM privmatch.face_templates")
            .map_err(spi_error)?
            .unwrap_or(0);
        if usize::try_from(enrolled).unwrap_or(usize::MAX) > ids.len() {
            return Err(EngineError::new(
                ErrorKind::Retry,
                format!(
                    "{} enrolled face template(s) are not opened at this party yet",
                    enrolled as usize - ids.len()
                ),
            ));
        }
        let current: HashSet<BundleId> = ids.iter().copied().collect();
        {
            let guard = self.store.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(store) = guard.as_ref() {
                if store.set.len() == current.len()
                    && ids.iter().all(|id| store.set.contains(id))
                    && store.set.is_sorted_by_id()
                {
                    return Ok(());
                }
            }
        }
        let mut guard = self.store.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = guard.as_mut() {
            let dropped = store.set.retain(|id| current.contains(id));
            if dropped > 0 {
                store.subjects.retain(|id, _| current.contains(id));
                store.changed();
            }
        }
        let missing: Vec<BundleId> = match guard.as_ref() {
            Some(store) => ids
                .iter()
                .filter(|id| !store.set.contains(id))
                .copied()
                .collect(),
            None => ids,
        };
        load_into(&mut guard, b, &missing)?;
        // One order at both evaluators, whatever order each loaded its templates in (the
        // tables' row order differs between parties): an identification over the whole set
        // then compares the same list at P0 and P1.
        if let Some(store) = guard.as_mut() {
            if store.set.sort_by_id() {
                store.changed();
            }
        }
        Ok(())
    }

    /// Runs one face request (on a request thread; calls nothing of Postgres).
    pub fn handle(
        &self,
        keys: Option<&PartyKeys>,
        op: u8,
        head: &[u8],
        payload: &[u8],
        now: Instant,
    ) -> Result<Response, EngineError> {
        self.expire(now);
        match op {
            op::OPEN => {
                let keys = keys.ok_or_else(|| EngineError::internal("an open without keys"))?;
                self.open(keys, decode_open(head, payload)?, now)
            }
            op::KEYS => {
                let (session, chunks) = decode_keys(head, payload)?;
                self.keys(session, &chunks, now)
            }
            op::STOCK => {
                let keys = keys.ok_or_else(|| EngineError::internal("a stock without keys"))?;
                let (stock, chunks) = decode_keys(head, payload)?;
                self.keep_stock(keys, stock, &chunks)
            }
            op::ROUND => {
                let mut c = Cursor(head);
                let session = c.array()?;
                let round = c.take(1)?[0];
                c.end()?;
                self.round(session, round, payload, now)
            }
            op::KEYED_ROUND => {
                let (session, chunks, message) = decode_chunks(head, payload)?;
                self.keyed_round(session, &chunks, message, now)
            }
            _ => Err(malformed()),
        }
    }

    fn open(
        &self,
        keys: &PartyKeys,
        req: OpenRequest,
        now: Instant,
    ) -> Result<Response, EngineError> {
        let b =
            evaluator(keys.me).map_err(|e| EngineError::new(ErrorKind::NotReady, e.to_string()))?;
        let whole = req.wanted.is_none();
        let to_peer = channel_secrets(keys, PartyIndex::ALL[1 - b])?;
        let from_dealer = channel_secrets(keys, PartyIndex::ALL[2])?;
        let guard = self.store.read().unwrap_or_else(PoisonError::into_inner);
        let not_opened = || {
            EngineError::new(
                ErrorKind::Retry,
                "a compared face template is not opened at this party yet (an enrolment is being committed or opened)",
            )
        };
        let reply = ReplySealer::new(keys.me, &keys.secret, &req.reply_key, &req.session)
            .map_err(|e| EngineError::new(ErrorKind::NotReady, e.to_string()))?;
        let (ids, positions, subjects_listed, generation, digest, named) = match guard.as_ref() {
            None if req.wanted.as_ref().is_some_and(|w| !w.is_empty()) => return Err(not_opened()),
            None => (
                Vec::new(),
                Vec::new(),
                (!req.verification).then(Vec::new),
                0,
                template_digest(std::iter::empty()),
                subjects_digest(std::iter::empty()),
            ),
            Some(store) => {
                if store.set.dim() != req.probe.elements.len() {
                    return Err(EngineError::new(
                        ErrorKind::BadParameter,
                        format!(
                            "the probe has dimension {}, the enrolled face templates {}",
                            req.probe.elements.len(),
                            store.set.dim()
                        ),
                    ));
                }
                let (ids, positions) = match req.wanted {
                    Some(ids) => {
                        let mut positions = Vec::with_capacity(ids.len());
                        for id in &ids {
                            let Some(t) = store.set.position(id) else {
                                return Err(not_opened());
                            };
                            positions.push(t);
                        }
                        (ids, positions)
                    }
                    None => (store.set.ids().to_vec(), (0..store.set.len()).collect()),
                };
                // The subjects go inside the sealed output only: an identification lists
                // them there, a verification seals only their digest (the client knows its
                // claimed subject); nothing the coordinator receives names them.
                let (digest, named) = if whole {
                    *store.whole_digests.get_or_init(|| store.digests_of(&ids))
                } else {
                    store.digests_of(&ids)
                };
                // Not listed when the client's probe says it knows this very list.
                let subjects_listed = (!req.verification && req.known_subjects != Some(named))
                    .then(|| {
                        ids.iter()
                            .map(|id| store.subject_of(id).to_owned())
                            .collect()
                    });
                (
                    ids,
                    positions,
                    subjects_listed,
                    store.generation,
                    digest,
                    named,
                )
            }
        };
        // A verification masks its probe and re-masks its template share here, with seeds it
        // shares with P2 for this session (docs/protocols/face.md §13.10): P2 deals meanwhile,
        // knowing neither, and round 2 needs no keys step before it.
        let verification = (req.verification && !ids.is_empty())
            .then(|| VerificationSeeds::derive(&from_dealer, &req.session));
        let own_x = match (&verification, guard.as_ref()) {
            (Some(seeds), Some(store)) => {
                let [position] = positions[..] else {
                    return Err(EngineError::new(
                        ErrorKind::BadParameter,
                        format!(
                            "a face verification compares one template, this party found {}",
                            positions.len()
                        ),
                    ));
                };
                verification_message(&store.set, position, &req.probe, seeds)
                    .map_err(|e| refused("the verified template", e))?
            }
            _ => Vec::new(),
        };
        drop(guard);
        let listed = req.known != Some(digest);
        let stocked = req
            .stock
            .and_then(|stock| self.claim_stock(&stock, &digest, ids.len(), whole));
        let claimed = stocked.is_some();
        // A verification's channel names no list (its keys name none: P2 does not learn the
        // template); its message carries this evaluator's list digest instead, so evaluators
        // that found different templates learn it at round 2 (40001) rather than a refusal.
        let channel_list = match verification {
            Some(_) => &VERIFICATION_LIST_DIGEST,
            None => &digest,
        };
        let mut channel = to_peer.channel(session_channel(&req.session, channel_list));
        let masked_probe = if verification.is_some() {
            let mut plain = digest.to_vec();
            plain.extend_from_slice(&words_to_bytes(&own_x));
            let sealed = channel.seal(1, &plain, &mut ChaCha20Rng::from_entropy());
            plain.zeroize();
            sealed
        } else {
            Vec::new()
        };
        let session = Session {
            me: keys.me,
            probe: req.probe,
            channel,
            from_dealer,
            reply,
            subjects_digest: named,
            listed: subjects_listed,
            keys_for: if req.verification {
                KeysFor::Verification(req.session)
            } else {
                KeysFor::Session(req.session)
            },
            ids,
            digest,
            positions,
            generation,
            keys: stocked,
            verification,
            own_x,
            own_z: Vec::new(),
            step: 0,
            touched: now,
        };
        let opened = Opened {
            comparisons: session.ids.len() as u32,
            ids: if listed {
                session.ids.clone()
            } else {
                Vec::new()
            },
            digest,
            claimed,
            masked_probe,
        };
        let mut sessions = self.sessions();
        if sessions.contains_key(&req.session) {
            return Err(EngineError::new(
                ErrorKind::BadParameter,
                format!(
                    "face session {} is already running: session ids are single-use",
                    hex::encode(req.session)
                ),
            ));
        }
        if sessions.len() >= MAX_FACE_SESSIONS {
            return Err(EngineError::new(
                ErrorKind::Busy,
                format!("{MAX_FACE_SESSIONS} face sessions are running, the most one party keeps; retry"),
            ));
        }
        sessions.insert(req.session, session);
        Ok(face_reply(encode_opened(&opened)))
    }

    /// Takes session `session` out of the table for a step (so its work runs without the
    /// lock), checking that `step` is its next one.
    fn take(&self, session: &[u8; 16], step: u8) -> Result<Session, EngineError> {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(session) else {
            return Err(unknown(
                session,
                "is not running at this party's engine (never opened here, aborted, finished, expired or lost in an engine restart)",
            ));
        };
        if s.step + 1 != step {
            return Err(EngineError::new(
                ErrorKind::NotReady,
                format!(
                    "face session {}: step {step} is out of order (step {} is done)",
                    hex::encode(session),
                    s.step
                ),
            ));
        }
        sessions
            .remove(session)
            .ok_or_else(|| unknown(session, "vanished"))
    }

    fn put_back(&self, session: [u8; 16], mut s: Session, step: u8, now: Instant) {
        s.step = step;
        s.touched = now;
        self.sessions().insert(session, s);
    }

    fn keys(
        &self,
        session: [u8; 16],
        chunks: &[&[u8]],
        now: Instant,
    ) -> Result<Response, EngineError> {
        let mut s = self.take(&session, 1)?;
        // No chunks: the stocked dealing the open claimed. Chunks: keys dealt for this
        // session, which replace a claimed stock (then burnt unused, as its claim is recorded).
        let dealt = match (chunks.is_empty(), s.keys.take()) {
            (true, Some(stocked)) => stocked,
            (true, None) => {
                return Err(EngineError::new(
                    ErrorKind::BadParameter,
                    format!(
                        "face session {} claimed no stocked dealing: give it P2's key chunks",
                        hex::encode(session)
                    ),
                ))
            }
            (false, _) => open_identification_key_chunks(s.me, &s.from_dealer, s.keys_for, chunks)
                .map_err(|e| refused("the dealer's key half", e))?,
        };
        let list = match s.verification {
            Some(_) => &VERIFICATION_LIST_DIGEST,
            None => &s.digest,
        };
        if dealt.len() != s.ids.len() || dealt.digest() != list {
            return Err(refused(
                "the dealer's key half",
                "it was dealt for another template list",
            ));
        }
        if let Some(seeds) = &s.verification {
            // A verification: its message went out with the open; nothing more for the peer.
            if !dealt.masks_probe_with(&seeds.probe) {
                return Err(refused(
                    "the dealer's key half",
                    "it was dealt for another probe mask",
                ));
            }
            s.keys = Some(dealt);
            self.put_back(session, s, 1, now);
            return Ok(face_reply(Vec::new()));
        }
        let x = probe_round(&dealt, &s.probe).map_err(|e| refused("the dealer's key half", e))?;
        let mut rng = ChaCha20Rng::from_entropy();
        let sealed = s.channel.seal(1, &words_to_bytes(&x), &mut rng);
        s.keys = Some(dealt);
        s.own_x = x;
        self.put_back(session, s, 1, now);
        Ok(face_reply(sealed))
    }

    /// A verification's keys step and round 2 in one request: its masked vectors went out
    /// with the opens, so the keys step answers nothing and round 2 follows at once. An
    /// identification's keys step answers its masked probe, which must reach the peer before
    /// round 2: refused (22023; the keys are taken, the coordinator aborts the session).
    fn keyed_round(
        &self,
        session: [u8; 16],
        chunks: &[&[u8]],
        message: &[u8],
        now: Instant,
    ) -> Result<Response, EngineError> {
        match self.keys(session, chunks, now)? {
            Response::Reply { payload, .. } if payload.is_empty() => {
                self.distance(session, message, now)
            }
            _ => Err(EngineError::new(
                ErrorKind::BadParameter,
                format!(
                    "face session {} is an identification: its keys step and round 2 are separate calls (face_masked_keys, then face_masked_round)",
                    hex::encode(session)
                ),
            )),
        }
    }

    fn round(
        &self,
        session: [u8; 16],
        round: u8,
        message: &[u8],
        now: Instant,
    ) -> Result<Response, EngineError> {
        match round {
            2 => self.distance(session, message, now),
            3 => self.sign(session, message),
            _ => Err(EngineError::new(
                ErrorKind::BadParameter,
                format!("face rounds at the engine are 2 and 3, not {round}"),
            )),
        }
    }

    fn distance(
        &self,
        session: [u8; 16],
        message: &[u8],
        now: Instant,
    ) -> Result<Response, EngineError> {
        let mut s = self.take(&session, 2)?;
        let result = (|| {
            let mut plain = s
                .channel
                .open(1, message)
                .map_err(|e| refused("the peer's masked probe", e))?;
            let words = match s.verification {
                Some(_) => peer_verification_words(&plain, &s.digest)?,
                None => &plain[..],
            };
            let peer = bytes_to_words(words).map_err(|e| refused("the peer's masked probe", e));
            plain.zeroize();
            let peer = peer?;
            let keys = s
                .keys
                .as_ref()
                .ok_or_else(|| EngineError::internal("no keys"))?;
            let guard = self.store.read().unwrap_or_else(PoisonError::into_inner);
            let store = guard
                .as_ref()
                .filter(|_| !s.ids.is_empty())
                .ok_or_else(|| EngineError::internal("no face templates held"))?;
            if store.generation != s.generation {
                let mut positions = Vec::with_capacity(s.ids.len());
                for id in &s.ids {
                    positions.push(store.set.position(id).ok_or_else(|| {
                        EngineError::new(
                            ErrorKind::NotReady,
                            "a compared face template was deleted during the session; start a new one",
                        )
                    })?);
                }
                s.positions = positions;
                s.generation = store.generation;
            }
            match (&s.verification, &s.positions[..]) {
                (Some(seeds), &[position]) => verification_distance(
                    keys, &store.set, position, &s.probe, seeds, &s.own_x, &peer,
                )
                .map(|z| vec![z]),
                _ => distance_round_selected(
                    keys,
                    &store.set,
                    &s.positions,
                    &s.probe,
                    &s.own_x,
                    &peer,
                    self.threads,
                ),
            }
            .map_err(|e| refused("the peer's masked probe", e))
        })();
        let z = result?;
        let mut rng = ChaCha20Rng::from_entropy();
        let sealed = s.channel.seal(2, &words_to_bytes(&z), &mut rng);
        s.own_z = z;
        self.put_back(session, s, 2, now);
        Ok(face_reply(sealed))
    }

    fn sign(&self, session: [u8; 16], message: &[u8]) -> Result<Response, EngineError> {
        let mut s = self.take(&session, 3)?;
        let plain = s
            .channel
            .open(2, message)
            .map_err(|e| refused("the peer's distance shares", e))?;
        let peer = bytes_to_words(&plain).map_err(|e| refused("the peer's distance shares", e))?;
        let keys = s
            .keys
            .as_ref()
            .ok_or_else(|| EngineError::internal("no keys"))?;
        let mut o = sign_round(keys, &s.own_z, &peer, self.threads)
            .map_err(|e| refused("the peer's distance shares", e))?;
        // Sealed to the client's reply key: the coordinator relays it and cannot add the two.
        let mut rng = ChaCha20Rng::from_entropy();
        let listed: Option<Vec<&str>> = s
            .listed
            .as_ref()
            .map(|l| l.iter().map(String::as_str).collect());
        let sealed = s.reply.seal(
            &s.digest,
            &s.subjects_digest,
            &o,
            listed.as_deref(),
            &mut rng,
        );
        o.zeroize();
        // The session ends here: it was taken out of the table and is dropped.
        Ok(face_reply(sealed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verification_message_of_another_template_list_asks_for_a_retry() {
        // The peer's message carries its list digest: the same list gives the words, another
        // list (an enrolment or deletion in flight) 40001, a message too short a refusal.
        let digest = [7u8; 32];
        let mut plain = digest.to_vec();
        plain.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(
            peer_verification_words(&plain, &digest).unwrap(),
            &[1, 2, 3, 4]
        );
        let other = peer_verification_words(&plain, &[8u8; 32]).unwrap_err();
        assert_eq!(other.kind, ErrorKind::Retry, "{}", other.message);
        let short = peer_verification_words(&plain[..31], &digest).unwrap_err();
        assert_eq!(short.kind, ErrorKind::Protocol, "{}", short.message);
    }

    #[test]
    fn face_requests_round_trip() {
        let req = OpenRequest {
            session: [7; 16],
            probe: EmbeddingShare {
                elements: vec![1, 2, 3, u32::MAX],
                norm: 9,
            },
            reply_key: PartyPublicKey::from_bytes([5; 32]),
            wanted: Some(vec![[1; 16], [2; 16]]),
            stock: Some([8; 16]),
            known: Some([9; 32]),
            verification: true,
            known_subjects: Some([6; 32]),
        };
        let Request::Call(Call {
            op, head, payload, ..
        }) = encode_open(&req)
        else {
            panic!("not a face request");
        };
        assert_eq!(op, op::OPEN);
        let back = decode_open(&head, &payload).unwrap();
        assert_eq!(back.session, req.session);
        assert_eq!(back.probe.elements, req.probe.elements);
        assert_eq!(back.probe.norm, 9);
        assert_eq!(back.reply_key, req.reply_key);
        assert_eq!(back.wanted, req.wanted);
        assert_eq!(back.stock, req.stock);
        assert_eq!(back.known, req.known);
        assert_eq!(back.known_subjects, req.known_subjects);
        assert!(back.verification);
        assert!(decode_open(&head, &payload[..payload.len() - 1]).is_err());
        let unstocked = OpenRequest {
            wanted: None,
            stock: None,
            known: None,
            verification: false,
            known_subjects: None,
            ..req
        };
        let Request::Call(Call { head, payload, .. }) = encode_open(&unstocked) else {
            panic!("not a face request");
        };
        let back = decode_open(&head, &payload).unwrap();
        assert_eq!((back.wanted, back.stock, back.known), (None, None, None));
        assert_eq!(back.known_subjects, None);
        assert!(!back.verification);

        let opened = Opened {
            comparisons: 1,
            ids: vec![[3; 16]],
            digest: [4; 32],
            claimed: true,
            masked_probe: vec![9; 70],
        };
        let mut cut = encode_opened(&opened);
        let back = decode_opened(&cut).unwrap();
        assert_eq!(
            (back.comparisons, back.ids, back.digest, back.claimed),
            (1, opened.ids, opened.digest, true)
        );
        assert_eq!(back.masked_probe, opened.masked_probe);
        cut.pop();
        assert!(decode_opened(&cut).is_err());
        // A known list: the count without the ids.
        let unlisted = Opened {
            comparisons: 5,
            ids: Vec::new(),
            digest: [4; 32],
            claimed: false,
            masked_probe: Vec::new(),
        };
        let back = decode_opened(&encode_opened(&unlisted)).unwrap();
        assert_eq!((back.comparisons, back.ids.len()), (5, 0));
        // Ids that do not match the count are malformed.
        let wrong = Opened {
            comparisons: 2,
            ids: vec![[3; 16]],
            digest: [4; 32],
            claimed: false,
            masked_probe: Vec::new(),
        };
        assert!(decode_opened(&encode_opened(&wrong)).is_err());

        let chunks: [&[u8]; 2] = [b"abc", b"de"];
        let Request::Call(Call { head, payload, .. }) = encode_keys(&[5; 16], &chunks) else {
            panic!("not a face request");
        };
        let (session, got) = decode_keys(&head, &payload).unwrap();
        assert_eq!(session, [5; 16]);
        assert_eq!(got, chunks.to_vec());
        let Request::Call(Call {
            op, head, payload, ..
        }) = encode_stock(&[6; 16], &[])
        else {
            panic!("not a face request");
        };
        assert_eq!(op, op::STOCK);
        let (stock, got) = decode_keys(&head, &payload).unwrap();
        assert_eq!((stock, got.len()), ([6; 16], 0));
        let Request::Call(Call {
            modality, op, head, ..
        }) = encode_abort(&[7; 16])
        else {
            panic!("not a face request");
        };
        assert_eq!((modality, op), (Modality::Face, op::ABORT));
        assert_eq!(decode_abort(&head).unwrap(), [7; 16]);
        assert!(decode_abort(&head[1..]).is_err());
    }
}
