//! One evaluator's face service (P0 or P1): the opened dealer-masked templates
//! ([`MaskedTemplateSet`]: Δy = y + δy and this party's mask seed, never y; Funshade,
//! Ibarrondo, Chabanne, Önen, PETS 2023, ePrint 2022/1688, with the template masked once —
//! docs/protocols/face.md §5), kept in step with the party's tables through a
//! [`TemplateSource`], and the running face sessions between their rounds. The face
//! counterpart of `crate::iris::service`, tested without PostgreSQL (`service/tests.rs`).
//!
//! A session (docs/protocols/face.md §6 step 2): [`FaceService::open`] fixes the probe share and the
//! ordered list of compared templates, and may claim a dealing stocked ahead of time for that
//! list (docs/protocols/face.md §11); [`FaceService::keys`] opens the dealer's key half for
//! this session and list (P2's chunks; none when a stocked dealing was claimed) and answers
//! X_b = x_b + δx_b sealed for the other evaluator; round 2 opens X_{1−b} and answers z_b for
//! every compared template (the evaluation of the whole 1:N on the service's threads); round
//! 3 opens z_{1−b} and answers the output shares o_b sealed to the client's reply key
//! ([`crate::face::reply`]; the coordinator relays them unread), which ends the session. A 1:1
//! verification (docs/protocols/face.md §7) answers its round-2 message X_b ‖ Y'_b from the
//! open (masks derived from what this party shares with P2 for the session, so P2 deals
//! meanwhile), and its keys step and round 2 come in one call ([`FaceService::keyed_round`]).
//!
//! Sessions live in memory only, for at most the configured timeout between calls. Single use
//! of a session id and of a stocked dealing is the caller's job (the extension records both
//! in the open's transaction); this service refuses an id while it is running or held.
//! Stocked dealings live in memory only: a restart loses them (they are dealt again), never a
//! claim.
//!
//! **Consistency.** Before every open the caller runs [`FaceService::refresh`] (or
//! [`FaceService::refresh_for_open`]) against its [`TemplateSource`]: templates whose rows are
//! gone (deleted enrolments) are dropped and the opened ones missing are loaded — unless the
//! set version (docs/protocols/face.md §12) is the one the last complete pass saw. A running
//! session keeps the bundle ids it compares; if the set changed since its open, round 2 finds
//! them again by id, and fails if one was deleted.
//!
//! **Concurrency.** Every method takes `&self`: the session table and the stock sit behind
//! mutexes held only to look up, take out or put back; the template set behind a read-write
//! lock, held shared by evaluations. The steps of one session are sequential: a step takes
//! its session out of the table, so a second call for it meanwhile is refused as unknown.
//!
//! Errors ([`ServiceError`]) name sessions, steps and shapes, never values.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use zeroize::Zeroize;

use crate::crypto::seal::{Channel, PairwiseCache, PairwiseSecrets, PartyKeys, PartyPublicKey};
use crate::face::encoding::{evaluator, EmbeddingShare};
use crate::face::funshade::{bytes_to_words, words_to_bytes};
use crate::face::mask_dealer::open_identification_key_chunks;
use crate::face::masked::{
    distance_round_selected, probe_round, sign_round, template_digest, verification_distance,
    verification_message, IdentificationKeys, KeysFor, MaskedTemplateSet, VerificationSeeds,
    BUNDLE_ID_LEN, VERIFICATION_LIST_DIGEST,
};
use crate::face::opening::session_channel;
use crate::face::reply::{subjects_digest, ReplySealer};
use crate::party::PartyIndex;

#[cfg(test)]
mod tests;

/// Face sessions one party keeps at once (each holds its keys, 683 bytes per comparison).
pub const MAX_FACE_SESSIONS: usize = 64;
/// Stocked dealings one evaluator keeps at most (the oldest is dropped first).
pub const MAX_STOCKED: usize = 4;
/// Sealed bytes of stocked dealings one evaluator keeps at most (1 GiB: one dealing at
/// N = 1,000,000 is about 683 MB); the oldest are dropped first, the newest always kept.
pub const MAX_STOCK_BYTES: usize = 1 << 30;
/// Lists of at most this many templates (verifications) refresh only themselves before an
/// open; longer ones and identifications refresh the whole set.
pub const TARGETED_REFRESH: usize = 64;
/// Templates asked of the [`TemplateSource`] per load.
const LOAD_CHUNK: usize = 1024;
/// Loads of at least this many templates report their progress.
const REPORTED_LOAD: usize = 10_000;

/// A bundle id: the enrolment a template belongs to.
pub type BundleId = [u8; BUNDLE_ID_LEN];

/// What kind of refusal a [`ServiceError`] is: what the caller should do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The call's arguments do not fit (a dimension, a step's input, a repeated id).
    BadParameter,
    /// The session is not running here (never opened, aborted, finished, expired).
    UnknownSession,
    /// This party cannot serve the call now (a peer not pinned, a step out of order, a
    /// catalog that predates dealer-masked templates, a template deleted meanwhile).
    NotReady,
    /// A transient conflict (an enrolment in flight): a new session may succeed (40001).
    Retry,
    /// As many sessions as allowed are running.
    Busy,
    /// A message of the protocol was refused (not sealed by whom it should be, another
    /// session's or list's keys, a malformed vector).
    Protocol,
    /// A fault of this party (its tables hold something malformed).
    Internal,
}

/// Why a face service call was refused. Never contains shares, distances or keys.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    /// What kind of refusal.
    pub kind: Refusal,
    /// What went wrong, for the operator and the caller.
    pub message: String,
}

impl ServiceError {
    /// A refusal of `kind`.
    pub fn new(kind: Refusal, message: impl Into<String>) -> Self {
        ServiceError {
            kind,
            message: message.into(),
        }
    }

    /// A fault of this party.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Refusal::Internal, message)
    }
}

/// One opened template as the party's tables hold it.
pub struct OpenedTemplate {
    /// Its bundle id.
    pub id: BundleId,
    /// The enrolled subject (listed only inside a sealed identification output).
    pub subject: String,
    /// Δy = y + δy, as words.
    pub opened: Vec<u32>,
    /// This party's mask seed of the template.
    pub seed: [u8; 16],
    /// This party's share of the template's squared norm.
    pub norm: u32,
}

/// How a long load is going, for the operator's log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadProgress {
    /// Loading `count` templates (a restart with many templates).
    Loading {
        /// Templates to load.
        count: usize,
    },
    /// Done: `held` templates in memory, after `seconds`.
    Loaded {
        /// Templates held now.
        held: usize,
        /// How long the load took.
        seconds: f64,
    },
}

/// Where an evaluator's templates come from (the party's tables, or memory in tests). Every
/// read sees one snapshot of the tables per refresh (the caller's transaction).
pub trait TemplateSource {
    /// Whether the tables of dealer-masked templates exist (else the party's catalog predates
    /// them).
    fn has_masked_templates(&self) -> Result<bool, ServiceError>;
    /// The set version (docs/protocols/face.md §12) as text, moved by every change of the
    /// template tables; `None` where the catalog has none (an update pending).
    fn set_version(&self) -> Result<Option<String>, ServiceError>;
    /// The opened templates whose enrolment is still there: all of them, or those of `only`.
    fn opened_ids(&self, only: Option<&[BundleId]>) -> Result<Vec<BundleId>, ServiceError>;
    /// How many face templates are enrolled (opened or not).
    fn enrolled_count(&self) -> Result<u64, ServiceError>;
    /// The opened templates `ids` (those still there; in any order).
    fn load(&self, ids: &[BundleId]) -> Result<Vec<OpenedTemplate>, ServiceError>;
    /// Hears about a long load (nothing by default).
    fn progress(&self, _progress: LoadProgress) {}
}

/// What a caller asks to open a session with.
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
    /// message, sent from the open: docs/protocols/face.md §7); empty for an
    /// identification, whose X_b follows from the dealt keys.
    pub masked_probe: Vec<u8>,
}

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

    /// Keeps only the templates for which `keep` holds (one pass over the set), recording a
    /// change when any was dropped.
    fn keep_only(&mut self, keep: impl Fn(&BundleId) -> bool) {
        if self.set.retain(&keep) > 0 {
            self.subjects.retain(|id, _| keep(id));
            self.changed();
        }
    }
}

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
    /// verification, [`verification_message`]).
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

/// One dealing made ahead of time (docs/protocols/face.md §11), waiting for the open that
/// claims it.
struct Stocked {
    id: [u8; 16],
    keys: IdentificationKeys,
    /// Sealed bytes it arrived in (what [`MAX_STOCK_BYTES`] counts).
    bytes: usize,
}

/// The held templates and the running sessions of one evaluator (module docs). Cloning
/// shares it.
#[derive(Clone)]
pub struct FaceService {
    store: Arc<RwLock<Option<Store>>>,
    /// The set version the last complete refresh saw (read before its pass over the set):
    /// while the tables show it still, nothing changed and the held set is current.
    refreshed_at: Arc<Mutex<Option<String>>>,
    sessions: Arc<Mutex<HashMap<[u8; 16], Session>>>,
    /// Stocked dealings, oldest first.
    stock: Arc<Mutex<Vec<Stocked>>>,
    /// Where the pairwise secrets with the other parties are derived and kept.
    channels: &'static PairwiseCache,
    threads: usize,
    timeout: Duration,
}

fn unknown(session: &[u8; 16], why: &str) -> ServiceError {
    ServiceError::new(
        Refusal::UnknownSession,
        format!("face session {} {why}", hex::encode(session)),
    )
}

fn refused(what: &str, err: impl std::fmt::Display) -> ServiceError {
    ServiceError::new(Refusal::Protocol, format!("{what} was refused: {err}"))
}

fn not_updated() -> ServiceError {
    ServiceError::new(
        Refusal::NotReady,
        "this party's privmatch extension predates dealer-masked face templates: run ALTER EXTENSION privmatch UPDATE",
    )
}

fn not_opened() -> ServiceError {
    ServiceError::new(
        Refusal::Retry,
        "a compared face template is not opened at this party yet (an enrolment is being committed or opened)",
    )
}

/// Evaluator index b of `me` (P0 or P1).
fn evaluator_of(me: PartyIndex) -> Result<usize, ServiceError> {
    evaluator(me).map_err(|e| ServiceError::new(Refusal::NotReady, e.to_string()))
}

/// The words of the peer's verification message `plain` (its list digest, then X ‖ Y'), when
/// the peer compared the same template as this evaluator (`digest`); else 40001, as when the
/// evaluators' lists differ at an identification's open.
fn peer_verification_words<'a>(
    plain: &'a [u8],
    digest: &[u8; 32],
) -> Result<&'a [u8], ServiceError> {
    let (list, words) = plain
        .split_at_checked(32)
        .ok_or_else(|| refused("the peer's masked probe", "it is too short"))?;
    if list != digest {
        return Err(ServiceError::new(
            Refusal::Retry,
            "the evaluators compared different face templates (an enrolment or deletion is in flight); retry with a new session",
        ));
    }
    Ok(words)
}

/// Loads the opened templates `missing` from `source` into the held set (created for
/// evaluator `b` at the first template), reporting progress on large loads.
fn load_into(
    guard: &mut RwLockWriteGuard<'_, Option<Store>>,
    b: usize,
    missing: &[BundleId],
    source: &dyn TemplateSource,
) -> Result<(), ServiceError> {
    if missing.is_empty() {
        return Ok(());
    }
    let reported = missing.len() >= REPORTED_LOAD;
    if reported {
        source.progress(LoadProgress::Loading {
            count: missing.len(),
        });
    }
    let started = Instant::now();
    for chunk in missing.chunks(LOAD_CHUNK) {
        for row in source.load(chunk)? {
            let store = match &mut **guard {
                Some(store) => store,
                empty => empty.insert(Store {
                    set: MaskedTemplateSet::new(b, row.opened.len())
                        .map_err(|e| ServiceError::internal(e.to_string()))?,
                    subjects: HashMap::new(),
                    generation: 0,
                    whole_digests: OnceLock::new(),
                }),
            };
            store
                .set
                .push_opened(row.id, &row.opened, &row.seed, row.norm)
                .map_err(|e| ServiceError::internal(format!("face template: {e}")))?;
            store.subjects.insert(row.id, row.subject);
            store.changed();
        }
    }
    if reported {
        source.progress(LoadProgress::Loaded {
            held: guard.as_ref().map_or(0, |s| s.set.len()),
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    Ok(())
}

/// What an open found in the held set for its list.
struct Compared {
    ids: Vec<BundleId>,
    positions: Vec<usize>,
    listed: Option<Vec<String>>,
    generation: u64,
    digest: [u8; 32],
    subjects_digest: [u8; 32],
    /// A verification's message X_b ‖ Y'_b (empty for an identification).
    own_x: Vec<u32>,
}

impl FaceService {
    /// No templates loaded yet; evaluations run on `threads` threads; sessions expire after
    /// `timeout` without a call; pairwise secrets are derived and kept in `channels`.
    pub fn new(threads: usize, timeout: Duration, channels: &'static PairwiseCache) -> Self {
        FaceService {
            store: Arc::new(RwLock::new(None)),
            refreshed_at: Arc::new(Mutex::new(None)),
            sessions: Arc::new(Mutex::new(HashMap::new())),
            stock: Arc::new(Mutex::new(Vec::new())),
            channels,
            threads: threads.max(1),
            timeout,
        }
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<[u8; 16], Session>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stock(&self) -> MutexGuard<'_, Vec<Stocked>> {
        self.stock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_store(&self) -> RwLockWriteGuard<'_, Option<Store>> {
        self.store.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Running sessions.
    pub fn active(&self) -> usize {
        self.sessions().len()
    }

    /// Templates held.
    pub fn templates(&self) -> usize {
        let guard = self.store.read().unwrap_or_else(PoisonError::into_inner);
        guard.as_ref().map_or(0, |s| s.set.len())
    }

    /// This party's pairwise secrets with `peer`.
    fn channel_secrets(
        &self,
        keys: &PartyKeys,
        peer: PartyIndex,
    ) -> Result<PairwiseSecrets, ServiceError> {
        let pinned = keys.peers[peer.as_usize()].ok_or_else(|| {
            ServiceError::new(
                Refusal::NotReady,
                format!("{peer} is not pinned at this party"),
            )
        })?;
        self.channels
            .derive(keys.me, &keys.secret, peer, &pinned)
            .map_err(|e| ServiceError::internal(e.to_string()))
    }

    /// Keeps P2's dealing `chunks` under stock id `stock` (opened and checked now: a half not
    /// sealed by P2 for this stock id and this party is refused), dropping the oldest stocked
    /// dealings beyond [`MAX_STOCKED`] or [`MAX_STOCK_BYTES`]. Answers how many are held.
    /// Whether the id was claimed before is the caller's check; a replayed id is refused here
    /// while it is held.
    pub fn keep_stock(
        &self,
        keys: &PartyKeys,
        stock: [u8; 16],
        chunks: &[&[u8]],
    ) -> Result<usize, ServiceError> {
        let from_dealer = self.channel_secrets(keys, PartyIndex::ALL[2])?;
        let dealt =
            open_identification_key_chunks(keys.me, &from_dealer, KeysFor::Stock(stock), chunks)
                .map_err(|e| refused("the dealer's stocked key half", e))?;
        let bytes = chunks.iter().map(|c| c.len()).sum();
        let mut held = self.stock();
        if held.iter().any(|s| s.id == stock) {
            return Err(ServiceError::new(
                Refusal::BadParameter,
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
        Ok(held.len())
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

    /// Before an open of the list `wanted`: brings the held templates up to date — all of them
    /// for an identification without a given list, only the listed ones for a short list (a
    /// verification: one look-up by id instead of a pass over every opened template).
    pub fn refresh_for_open(
        &self,
        me: PartyIndex,
        wanted: Option<&[BundleId]>,
        source: &dyn TemplateSource,
    ) -> Result<(), ServiceError> {
        match wanted {
            Some(wanted) if wanted.len() <= TARGETED_REFRESH => {
                self.refresh_listed(me, wanted, source)
            }
            _ => self.refresh(me, source),
        }
    }

    /// Brings the templates `wanted` up to date: loads those opened and enrolled but not held,
    /// drops those held but no longer there.
    fn refresh_listed(
        &self,
        me: PartyIndex,
        wanted: &[BundleId],
        source: &dyn TemplateSource,
    ) -> Result<(), ServiceError> {
        let b = evaluator_of(me)?;
        if !source.has_masked_templates()? {
            return Err(not_updated());
        }
        let present: HashSet<BundleId> = source.opened_ids(Some(wanted))?.into_iter().collect();
        let mut guard = self.write_store();
        if let Some(store) = guard.as_mut() {
            let gone: HashSet<BundleId> = wanted
                .iter()
                .filter(|id| !present.contains(*id) && store.set.contains(id))
                .copied()
                .collect();
            if !gone.is_empty() {
                store.keep_only(|id| !gone.contains(id));
            }
        }
        let missing: Vec<BundleId> = present
            .into_iter()
            .filter(|id| guard.as_ref().is_none_or(|s| !s.set.contains(id)))
            .collect();
        load_into(&mut guard, b, &missing, source)
    }

    /// Brings the held templates up to date with the source (module docs), and refuses
    /// ([`Refusal::Retry`]) while an enrolled template is not opened yet: an identification
    /// compares every enrolled template, so the coordinator opens the pending ones and asks
    /// again. When the set version is the one the last complete refresh saw, nothing changed
    /// since and nothing more is read (docs/protocols/face.md §12). `me` must be P0 or P1.
    pub fn refresh(&self, me: PartyIndex, source: &dyn TemplateSource) -> Result<(), ServiceError> {
        let version = source.set_version()?;
        let mut refreshed_at = self
            .refreshed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if version.is_some() && *refreshed_at == version {
            return Ok(());
        }
        // Read before the pass: a change committed during it moves the version again, so
        // the next open passes over the set once more.
        self.refresh_all(me, source)?;
        *refreshed_at = version;
        Ok(())
    }

    /// The pass of [`FaceService::refresh`] over every opened template.
    fn refresh_all(&self, me: PartyIndex, source: &dyn TemplateSource) -> Result<(), ServiceError> {
        let b = evaluator_of(me)?;
        if !source.has_masked_templates()? {
            return Err(not_updated());
        }
        let ids = source.opened_ids(None)?;
        // Opened rows are deleted with their enrolment, so the opened ones are a subset of
        // the enrolled ones: equal counts mean nothing is pending.
        let enrolled = source.enrolled_count()?;
        let pending = usize::try_from(enrolled)
            .unwrap_or(usize::MAX)
            .saturating_sub(ids.len());
        if pending > 0 {
            return Err(ServiceError::new(
                Refusal::Retry,
                format!("{pending} enrolled face template(s) are not opened at this party yet"),
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
        let mut guard = self.write_store();
        if let Some(store) = guard.as_mut() {
            store.keep_only(|id| current.contains(id));
        }
        let missing: Vec<BundleId> = match guard.as_ref() {
            Some(store) => ids
                .iter()
                .filter(|id| !store.set.contains(id))
                .copied()
                .collect(),
            None => ids,
        };
        load_into(&mut guard, b, &missing, source)?;
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

    /// Opens a session (step 0): fixes the probe share and the compared list, claims the
    /// stocked dealing asked for when it fits, and for a verification computes its round-2
    /// message X_b ‖ Y'_b (sealed for the other evaluator in the answer).
    pub fn open(
        &self,
        keys: &PartyKeys,
        req: OpenRequest,
        now: Instant,
    ) -> Result<Opened, ServiceError> {
        let b = evaluator_of(keys.me)?;
        let to_peer = self.channel_secrets(keys, PartyIndex::ALL[1 - b])?;
        let from_dealer = self.channel_secrets(keys, PartyIndex::ALL[2])?;
        let reply = ReplySealer::new(keys.me, &keys.secret, &req.reply_key, &req.session)
            .map_err(|e| ServiceError::new(Refusal::NotReady, e.to_string()))?;
        // A verification masks its probe and re-masks its template share here, with seeds it
        // shares with P2 for this session (docs/protocols/face.md §7): P2 deals meanwhile,
        // knowing neither, and round 2 needs no keys step before it.
        let seeds = req
            .verification
            .then(|| VerificationSeeds::derive(&from_dealer, &req.session));
        let compared = self.compared(&req, seeds.as_ref())?;
        let verification = seeds.filter(|_| !compared.ids.is_empty());
        let listed = req.known != Some(compared.digest);
        let whole = req.wanted.is_none();
        let stocked = req.stock.and_then(|stock| {
            self.claim_stock(&stock, &compared.digest, compared.ids.len(), whole)
        });
        let claimed = stocked.is_some();
        // A verification's channel names no list (its keys name none: P2 does not learn the
        // template); its message carries this evaluator's list digest instead, so evaluators
        // that found different templates learn it at round 2 (40001) rather than a refusal.
        let channel_list = match verification {
            Some(_) => &VERIFICATION_LIST_DIGEST,
            None => &compared.digest,
        };
        let mut channel = to_peer.channel(session_channel(&req.session, channel_list));
        let masked_probe = if verification.is_some() {
            let mut plain = compared.digest.to_vec();
            plain.extend_from_slice(&words_to_bytes(&compared.own_x));
            let sealed = channel.seal(1, &plain, &mut ChaCha20Rng::from_entropy());
            plain.zeroize();
            sealed
        } else {
            Vec::new()
        };
        let opened = Opened {
            comparisons: compared.ids.len() as u32,
            ids: if listed {
                compared.ids.clone()
            } else {
                Vec::new()
            },
            digest: compared.digest,
            claimed,
            masked_probe,
        };
        let session = Session {
            me: keys.me,
            probe: req.probe,
            channel,
            from_dealer,
            reply,
            subjects_digest: compared.subjects_digest,
            listed: compared.listed,
            keys_for: if req.verification {
                KeysFor::Verification(req.session)
            } else {
                KeysFor::Session(req.session)
            },
            ids: compared.ids,
            digest: compared.digest,
            positions: compared.positions,
            generation: compared.generation,
            keys: stocked,
            verification,
            own_x: compared.own_x,
            own_z: Vec::new(),
            step: 0,
            touched: now,
        };
        self.insert(req.session, session)?;
        Ok(opened)
    }

    /// The list an open compares, found in the held set, with its digests and (a
    /// verification with `seeds`) its round-2 message.
    fn compared(
        &self,
        req: &OpenRequest,
        seeds: Option<&VerificationSeeds>,
    ) -> Result<Compared, ServiceError> {
        let guard = self.store.read().unwrap_or_else(PoisonError::into_inner);
        let Some(store) = guard.as_ref() else {
            if req.wanted.as_ref().is_some_and(|w| !w.is_empty()) {
                return Err(not_opened());
            }
            return Ok(Compared {
                ids: Vec::new(),
                positions: Vec::new(),
                listed: (!req.verification).then(Vec::new),
                generation: 0,
                digest: template_digest(std::iter::empty()),
                subjects_digest: subjects_digest(std::iter::empty()),
                own_x: Vec::new(),
            });
        };
        if store.set.dim() != req.probe.elements.len() {
            return Err(ServiceError::new(
                Refusal::BadParameter,
                format!(
                    "the probe has dimension {}, the enrolled face templates {}",
                    req.probe.elements.len(),
                    store.set.dim()
                ),
            ));
        }
        let (ids, positions) = match &req.wanted {
            Some(ids) => {
                let positions = ids
                    .iter()
                    .map(|id| store.set.position(id).ok_or_else(not_opened))
                    .collect::<Result<Vec<_>, _>>()?;
                (ids.clone(), positions)
            }
            None => (store.set.ids().to_vec(), (0..store.set.len()).collect()),
        };
        // The subjects go inside the sealed output only: an identification lists them there,
        // a verification seals only their digest (the client knows its claimed subject);
        // nothing the coordinator receives names them.
        let (digest, named) = if req.wanted.is_none() {
            *store.whole_digests.get_or_init(|| store.digests_of(&ids))
        } else {
            store.digests_of(&ids)
        };
        // Not listed when the client's probe says it knows this very list.
        let listed = (!req.verification && req.known_subjects != Some(named)).then(|| {
            ids.iter()
                .map(|id| store.subject_of(id).to_owned())
                .collect()
        });
        let own_x = match seeds.filter(|_| !ids.is_empty()) {
            Some(seeds) => {
                let [position] = positions[..] else {
                    return Err(ServiceError::new(
                        Refusal::BadParameter,
                        format!(
                            "a face verification compares one template, this party found {}",
                            positions.len()
                        ),
                    ));
                };
                verification_message(&store.set, position, &req.probe, seeds)
                    .map_err(|e| refused("the verified template", e))?
            }
            None => Vec::new(),
        };
        Ok(Compared {
            ids,
            positions,
            listed,
            generation: store.generation,
            digest,
            subjects_digest: named,
            own_x,
        })
    }

    /// Adds an opened session to the table, unless its id is running or the table is full.
    fn insert(&self, id: [u8; 16], session: Session) -> Result<(), ServiceError> {
        let mut sessions = self.sessions();
        if sessions.contains_key(&id) {
            return Err(ServiceError::new(
                Refusal::BadParameter,
                format!(
                    "face session {} is already running: session ids are single-use",
                    hex::encode(id)
                ),
            ));
        }
        if sessions.len() >= MAX_FACE_SESSIONS {
            return Err(ServiceError::new(
                Refusal::Busy,
                format!("{MAX_FACE_SESSIONS} face sessions are running, the most one party keeps; retry"),
            ));
        }
        sessions.insert(id, session);
        Ok(())
    }

    /// Takes session `session` out of the table for a step (so its work runs without the
    /// lock), checking that `step` is its next one.
    fn take(&self, session: &[u8; 16], step: u8) -> Result<Session, ServiceError> {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(session) else {
            return Err(unknown(
                session,
                "is not running at this party's engine (never opened here, aborted, finished, expired or lost in an engine restart)",
            ));
        };
        if s.step + 1 != step {
            return Err(ServiceError::new(
                Refusal::NotReady,
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

    /// The keys step (step 1): opens P2's key half dealt for this session and list (`chunks`;
    /// none: the stocked dealing the open claimed) and answers X_b sealed for the other
    /// evaluator — nothing for a verification, whose message went out with the open.
    pub fn keys(
        &self,
        session: [u8; 16],
        chunks: &[&[u8]],
        now: Instant,
    ) -> Result<Vec<u8>, ServiceError> {
        let mut s = self.take(&session, 1)?;
        // No chunks: the stocked dealing the open claimed. Chunks: keys dealt for this
        // session, which replace a claimed stock (then burnt unused, as its claim is recorded).
        let dealt = match (chunks.is_empty(), s.keys.take()) {
            (true, Some(stocked)) => stocked,
            (true, None) => {
                return Err(ServiceError::new(
                    Refusal::BadParameter,
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
            if !dealt.masks_probe_with(&seeds.probe) {
                return Err(refused(
                    "the dealer's key half",
                    "it was dealt for another probe mask",
                ));
            }
            s.keys = Some(dealt);
            self.put_back(session, s, 1, now);
            return Ok(Vec::new());
        }
        let x = probe_round(&dealt, &s.probe).map_err(|e| refused("the dealer's key half", e))?;
        let sealed = s
            .channel
            .seal(1, &words_to_bytes(&x), &mut ChaCha20Rng::from_entropy());
        s.keys = Some(dealt);
        s.own_x = x;
        self.put_back(session, s, 1, now);
        Ok(sealed)
    }

    /// A verification's keys step and round 2 in one call: its masked vectors went out with
    /// the opens, so the keys step answers nothing and round 2 follows at once. An
    /// identification's keys step answers its masked probe, which must reach the peer before
    /// round 2: refused (the keys are taken, the caller aborts the session).
    pub fn keyed_round(
        &self,
        session: [u8; 16],
        chunks: &[&[u8]],
        message: &[u8],
        now: Instant,
    ) -> Result<Vec<u8>, ServiceError> {
        if !self.keys(session, chunks, now)?.is_empty() {
            return Err(ServiceError::new(
                Refusal::BadParameter,
                format!(
                    "face session {} is an identification: its keys step and round 2 are separate calls (face_masked_keys, then face_masked_round)",
                    hex::encode(session)
                ),
            ));
        }
        self.distance(session, message, now)
    }

    /// Round 2 (the peer's masked probe: answers z_b sealed for the peer) or round 3 (the
    /// peer's distance shares: answers the output shares sealed to the client, and ends the
    /// session).
    pub fn round(
        &self,
        session: [u8; 16],
        round: u8,
        message: &[u8],
        now: Instant,
    ) -> Result<Vec<u8>, ServiceError> {
        match round {
            2 => self.distance(session, message, now),
            3 => self.sign(session, message),
            _ => Err(ServiceError::new(
                Refusal::BadParameter,
                format!("face rounds at the engine are 2 and 3, not {round}"),
            )),
        }
    }

    /// Round 2 (Funshade's `eval_dist`, docs/protocols/face.md §6 step 4).
    fn distance(
        &self,
        session: [u8; 16],
        message: &[u8],
        now: Instant,
    ) -> Result<Vec<u8>, ServiceError> {
        let mut s = self.take(&session, 2)?;
        let mut plain = s
            .channel
            .open(1, message)
            .map_err(|e| refused("the peer's masked probe", e))?;
        let peer = match s.verification {
            Some(_) => peer_verification_words(&plain, &s.digest),
            None => Ok(&plain[..]),
        }
        .and_then(|words| bytes_to_words(words).map_err(|e| refused("the peer's masked probe", e)));
        plain.zeroize();
        let z = self.distance_shares(&mut s, &peer?)?;
        let sealed = s
            .channel
            .seal(2, &words_to_bytes(&z), &mut ChaCha20Rng::from_entropy());
        s.own_z = z;
        self.put_back(session, s, 2, now);
        Ok(sealed)
    }

    /// z_b of every compared template, given the peer's round-2 vector `peer`; finds the
    /// session's templates again if the held set changed since the open.
    fn distance_shares(&self, s: &mut Session, peer: &[u32]) -> Result<Vec<u32>, ServiceError> {
        let keys = s
            .keys
            .as_ref()
            .ok_or_else(|| ServiceError::internal("no keys"))?;
        let guard = self.store.read().unwrap_or_else(PoisonError::into_inner);
        let store = guard
            .as_ref()
            .filter(|_| !s.ids.is_empty())
            .ok_or_else(|| ServiceError::internal("no face templates held"))?;
        if store.generation != s.generation {
            s.positions = s
                .ids
                .iter()
                .map(|id| {
                    store.set.position(id).ok_or_else(|| {
                        ServiceError::new(
                            Refusal::NotReady,
                            "a compared face template was deleted during the session; start a new one",
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            s.generation = store.generation;
        }
        match (&s.verification, &s.positions[..]) {
            (Some(seeds), &[position]) => {
                verification_distance(keys, &store.set, position, &s.probe, seeds, &s.own_x, peer)
                    .map(|z| vec![z])
            }
            _ => distance_round_selected(
                keys,
                &store.set,
                &s.positions,
                &s.probe,
                &s.own_x,
                peer,
                self.threads,
            ),
        }
        .map_err(|e| refused("the peer's masked probe", e))
    }

    /// Round 3 (Funshade's `eval_sign`, docs/protocols/face.md §6 step 5): the output shares
    /// sealed to the client's reply key; the session ends.
    fn sign(&self, session: [u8; 16], message: &[u8]) -> Result<Vec<u8>, ServiceError> {
        let mut s = self.take(&session, 3)?;
        let plain = s
            .channel
            .open(2, message)
            .map_err(|e| refused("the peer's distance shares", e))?;
        let peer = bytes_to_words(&plain).map_err(|e| refused("the peer's distance shares", e))?;
        let keys = s
            .keys
            .as_ref()
            .ok_or_else(|| ServiceError::internal("no keys"))?;
        let mut o = sign_round(keys, &s.own_z, &peer, self.threads)
            .map_err(|e| refused("the peer's distance shares", e))?;
        // Sealed to the client's reply key: the coordinator relays it and cannot add the two.
        let listed: Option<Vec<&str>> = s
            .listed
            .as_ref()
            .map(|l| l.iter().map(String::as_str).collect());
        let sealed = s.reply.seal(
            &s.digest,
            &s.subjects_digest,
            &o,
            listed.as_deref(),
            &mut ChaCha20Rng::from_entropy(),
        );
        o.zeroize();
        // The session ends here: it was taken out of the table and is dropped.
        Ok(sealed)
    }
}
