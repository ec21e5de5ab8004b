//! One party's iris search service: the table of running searches between the rounds the
//! coordinator drives (docs/architecture.md, "session state lives inside the party").
//!
//! A search is `start` (open the sealed probe, scan the [`IrisStore`], first message), then
//! one `round` per protocol round (open the message of party i−1 from the pairwise channel,
//! step the [`IrisMatchSession`], seal the next message to party i+1), until the output.
//! Messages between parties travel through the coordinator sealed with the pairwise
//! [`Channel`]s of [`crate::crypto::seal`]: the coordinator sees lengths, never shares, and cannot
//! forge, replay or reorder a message.
//!
//! **Binding.** The channel and PRF session id of a search is
//! SHA-256(`privmatch iris search v1` ‖ session id ‖ mode ‖ rotation ‖ threshold ‖ eye ‖
//! digest of the searched set)[..16]. Parties given different parameters, or searching
//! different sets, cannot authenticate each other's first message: the search aborts instead
//! of computing something else. A session id is accepted once ([`SearchService::start`]
//! refuses a replayed id while it is remembered).
//!
//! **Failure.** Any refused message aborts the search: its state is dropped, later calls for
//! it fail with [`SearchError::UnknownSession`]. Idle searches expire after the configured
//! timeout ([`SearchService::expire`]). Errors name sessions, rounds and shapes, never values.
//!
//! **Concurrency.** Every method takes `&self`: the table of running searches sits behind a
//! mutex held only to look a search up, take it out or put it back, never while a probe is
//! opened, the store scanned or a round computed. An engine may therefore run the starts
//! and rounds of different searches on as many threads as the CPU has room for; the rounds
//! of one search stay sequential: a round takes its search out of the table, so a second
//! call for the same search meanwhile is refused as unknown (the round in progress goes on),
//! and an abort meanwhile finds nothing to drop (the search then ends at its next refused
//! message or at the idle timeout).
//!
//! **Empty eye.** With no enrolled template of the probe's eye, the three parties skip the
//! protocol in the same way: `start` returns an empty message and round 0 ends the search
//! (no match; unique).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::OsRng;
use sha2::{Digest, Sha256};

use crate::crypto::party_sign::PartySigningKey;
use crate::crypto::reply::ReplySealer;
use crate::crypto::seal::{Channel, PairwiseSecrets, PartyKeys, PartyPublicKey, SealError};
use crate::iris::binding::{enrolment_id, ENVELOPE_HASHES_LEN};
use crate::iris::dot::{DotShares, ShareMatrix};
use crate::iris::encoding::{IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use crate::iris::enroll::{open_iris_enrollment, BundleError, Eye};
use crate::iris::matcher::{IrisMatchSession, MatchConfig, MatchError, MatchOutput};
use crate::iris::mpc::binary::{MpcContext, Step};
use crate::iris::output::{output_sealer, seal_output, IrisOutput, IrisResult};
use crate::iris::params::{ParamError, SearchMode, SearchParams};
use crate::iris::policy::IrisPolicy;
use crate::iris::probe::{check_probe, open_iris_probe, Disclosure, ProbeRefusal};
use crate::iris::query::PreparedQuery;
use crate::iris::scan::{Interrupt, ScanBackend};
use crate::iris::store::{CanonicalOrder, IrisStore, StoreError};
use crate::party::PartyIndex;
use crate::wire::session::{SessionId, SESSION_ID_LEN};

/// How many finished session ids are remembered to refuse replays.
const REMEMBERED_SESSIONS: usize = 4096;

/// Searches one party runs at once (each holds its dot-product shares, 4 bytes per entry
/// and rotation, until it ends or expires); more are refused with
/// [`SearchError::TooManySearches`].
pub const MAX_ACTIVE_SEARCHES: usize = 64;

/// Probes one batch may hold (module docs, "Batches").
pub const MAX_BATCH_PROBES: usize = 64;

/// Working memory a search holds per comparison (entry × probe × rotation) at its peak, in
/// bytes, rounded up: the dot-product shares (4 bytes) and the comparison circuit's state.
/// Measured: 116 bytes (the engine's peak resident memory over its resident set at rest, one
/// search over 100,000 templates × 31 rotations, privmatch 0.16.0).
pub const WORK_BYTES_PER_COMPARISON: usize = 128;

/// Comparisons (entries × probes × rotations) one batch may hold: about 2 GiB of working
/// memory at [`WORK_BYTES_PER_COMPARISON`]. (Before 0.16.0's memory budget it was 2^28,
/// 32 GiB: a batch of 8 over 100,000 templates × 31 rotations had three parties on one
/// 24 GiB host killed by the kernel.)
pub const MAX_BATCH_COMPARISONS: usize = 1 << 24;

/// The default budget of working memory for all running searches of one party, in MiB
/// (`privmatch.search_work_mem`): one batch of [`MAX_BATCH_COMPARISONS`].
pub const DEFAULT_WORK_MEM_MIB: usize = (MAX_BATCH_COMPARISONS * WORK_BYTES_PER_COMPARISON) >> 20;

/// How long a start waits for working memory held by other searches before it is refused
/// ([`SearchError::NoWorkMemory`]).
pub const WORK_MEM_WAIT: Duration = Duration::from_secs(30);

/// Why a search call was refused. Never contains share values, distances or keys.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// A parameter is out of range.
    #[error("iris search: {0}")]
    BadParameter(#[from] ParamError),
    /// The session id is not running here (never started, finished, aborted or expired).
    #[error("iris search session {0} is not running at this party (finished, aborted, expired or never started)")]
    UnknownSession(String),
    /// The session id was used before.
    #[error("iris search session {0} was already used: session ids are single-use")]
    ReplayedSession(String),
    /// As many searches as allowed are running at this party.
    #[error("iris search: {0} searches are running at this party, the most it runs at once; retry when one ends")]
    TooManySearches(usize),
    /// The running searches hold the party's working memory for searches
    /// (`privmatch.search_work_mem`) and did not release enough of it in time.
    #[error("iris search: the searches running at this party hold its working memory ({budget_mib} MiB, privmatch.search_work_mem) and released too little of it within {waited_secs} s; retry when they end")]
    NoWorkMemory {
        /// The budget, in MiB.
        budget_mib: usize,
        /// How long the start waited.
        waited_secs: u64,
    },
    /// The sealed probe could not be opened or decoded.
    #[error("iris search probe: {0}")]
    Probe(#[from] BundleError),
    /// The probe opened, but may not run this search: other parameters than the client
    /// sealed, or too old.
    #[error("iris search probe refused: {0}")]
    ProbeRefused(#[from] ProbeRefusal),
    /// A peer's key is not pinned.
    #[error("no public key is pinned for {0}: run privmatch.pin_peer first")]
    PeerNotPinned(PartyIndex),
    /// A round arrived out of order.
    #[error("iris search session {session}: expected round {expected}, got round {got}")]
    WrongRound {
        /// The session.
        session: String,
        /// The round the session waits for.
        expected: u32,
        /// The round of the call.
        got: u32,
    },
    /// The peer's message could not be authenticated (tampered, replayed, misrouted, or the
    /// parties disagree on the parameters or the searched set).
    #[error("iris search session {session}, round {round}: message from {from} refused: {source}")]
    Channel {
        /// The session.
        session: String,
        /// The round.
        round: u32,
        /// The sender.
        from: PartyIndex,
        /// Why.
        source: SealError,
    },
    /// The protocol refused a message or an input.
    #[error("iris search session {session}: {source}")]
    Protocol {
        /// The session.
        session: String,
        /// Why.
        source: MatchError,
    },
    /// The store could not be scanned.
    #[error("iris search: {0}")]
    Store(#[from] StoreError),
    /// An enrolment batch whose enrolments are not one per probe, or not a uniqueness batch.
    #[error("iris enrolment batch: {0}")]
    EnrolmentBatch(&'static str),
    /// A batch without a probe or with more than [`MAX_BATCH_PROBES`].
    #[error("iris search batch of {0} probes: a batch holds 1 to {MAX_BATCH_PROBES} probes")]
    BatchSize(usize),
    /// A batch whose comparisons exceed [`MAX_BATCH_COMPARISONS`] (the coordinator recognises
    /// "send smaller batches" and runs the batch again in halves: keep the words).
    #[error("iris search batch of {probes} probes over {entries} templates: more than {MAX_BATCH_COMPARISONS} comparisons at once; send smaller batches")]
    BatchTooLarge {
        /// Probes in the batch.
        probes: usize,
        /// Templates of the batch's eye.
        entries: usize,
    },
}

/// What `start` returns to the coordinator.
#[derive(Clone, PartialEq, Eq)]
pub struct StartReply {
    /// Entries searched (templates of the probe's eye).
    pub entries: usize,
    /// Digest of the searched set ([`CanonicalOrder::digest`]).
    pub digest: [u8; 32],
    /// The first message, for party i+1 (sealed).
    pub message: Vec<u8>,
}

impl fmt::Debug for StartReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "StartReply {{ entries: {}, digest: {}, message: {} bytes }}",
            self.entries,
            hex::encode(self.digest),
            self.message.len()
        )
    }
}

/// What `round` returns to the coordinator.
#[derive(Clone, PartialEq, Eq)]
pub enum RoundReply {
    /// The next message, for party i+1 (sealed).
    Continue(Vec<u8>),
    /// Identification output: the matching subjects of the probe's eye, sorted.
    Identified(Vec<String>),
    /// Uniqueness output: `true` if the probe matched nobody.
    Unique(bool),
    /// Enrolment batch output: not unique, because the probe matched no enrolled template
    /// but the record of an earlier request of its batch.
    MatchesEarlierRequest,
}

impl fmt::Debug for RoundReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RoundReply::Continue(m) => write!(f, "Continue({} bytes)", m.len()),
            RoundReply::Identified(s) => write!(f, "Identified({s:?})"),
            RoundReply::Unique(u) => write!(f, "Unique({u})"),
            RoundReply::MatchesEarlierRequest => write!(f, "MatchesEarlierRequest"),
        }
    }
}

/// A party's output of a finished search as the coordinator relays it: signed and sealed to
/// the client's reply key ([`crate::iris::output`]), and the uniqueness bit in the clear only
/// when the client's probe allowed it ([`Disclosure::discloses_bit`]).
#[derive(Clone, PartialEq, Eq)]
pub struct SealedOutput {
    /// The signed output, sealed to the reply key.
    pub sealed: Vec<u8>,
    /// The uniqueness bit, when disclosed.
    pub disclosed_unique: Option<bool>,
}

impl fmt::Debug for SealedOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SealedOutput {{ sealed: {} bytes, disclosed_unique: {:?} }}",
            self.sealed.len(),
            self.disclosed_unique
        )
    }
}

/// What `round` returns to the coordinator ([`SearchService::round_sealed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SealedRound {
    /// The next message, for party i+1 (sealed).
    Continue(Vec<u8>),
    /// The output.
    Finished(SealedOutput),
}

enum State {
    Running(Box<IrisMatchSession>),
    /// No entry of the probe's eye: round 0 ends the search.
    Empty(SearchMode),
}

/// A batch of searches as the coordinator starts it (module docs, "Batches"): searches with
/// the same declared parameters and eye, each with its own client-drawn session id and
/// sealed probe.
pub struct BatchStart<'a> {
    /// The batch's id, drawn by the coordinator; the batch's rounds name it.
    pub batch: SessionId,
    /// The search parameters every probe must have been sealed with.
    pub params: SearchParams,
    /// The eye every probe must be.
    pub eye: Eye,
    /// Each search's session id and this party's sealed probe, in batch order.
    pub probes: &'a [(SessionId, &'a [u8])],
    /// Empty for a batch of searches; for a batch of enrol-if-unique requests, each
    /// request's enrolment in batch order (one per probe): each probe is also compared with
    /// the requests before it ([`crate::iris::matcher`], "In-batch uniqueness").
    pub enrolments: &'a [BatchEnrolment<'a>],
}

/// One enrol-if-unique request of a batch: the record whose uniqueness its probe asks.
#[derive(Clone, Copy, Debug)]
pub struct BatchEnrolment<'a> {
    /// This party's sealed enrolment envelope of the record (one template of the batch's
    /// eye), as this party opens it (inside the client's signature, if signed).
    pub envelope: &'a [u8],
    /// h0 ‖ h1 ‖ h2 of the record's three envelopes as relayed ([`crate::iris::binding`]),
    /// which the caller has checked against its own
    /// ([`crate::iris::binding::check_envelope_hashes`]): bound into
    /// the batch's session, so the three parties compare the probes with the same requests
    /// or fail to authenticate each other's first message.
    pub hashes: &'a [u8],
}

/// What a batch start returns to the coordinator.
pub struct BatchStartReply {
    /// Entries searched, digest and first message, as for a single search.
    pub start: StartReply,
    /// Per probe in batch order: `None` if accepted, or why this party refused it (its
    /// caller gets the refusal instead of an output; the batch runs on): a
    /// [`SearchError::Probe`] or [`SearchError::ProbeRefused`].
    pub refused: Vec<Option<SearchError>>,
}

impl fmt::Debug for BatchStartReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BatchStartReply {{ start: {:?}, refused: {:?} }}",
            self.start, self.refused
        )
    }
}

/// What a batch round returns to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchRound {
    /// The next message, for party i+1 (sealed).
    Continue(Vec<u8>),
    /// Per probe in batch order: its output signed and sealed to its own client, or the
    /// refusal of its probe at start.
    Finished(Vec<Result<SealedOutput, String>>),
}

/// One probe's outcome at the end of a search: this party's own view, and what it relays.
struct ProbeOutcome {
    view: RoundReply,
    relayed: Result<SealedOutput, String>,
}

/// The outcome of one round inside the service.
enum Stepped {
    Continue(Vec<u8>),
    Finished(Vec<ProbeOutcome>),
}

/// One probe of a running search or batch, as this party holds it for the output.
enum ProbeSlot {
    /// The probe opened and may run: where its output is sealed to and what it allows to be
    /// disclosed besides.
    Accepted {
        /// The probe's own session id (named in its signed output).
        session: SessionId,
        /// Where its output is sealed to (the reply key inside the client's probe).
        reply: ReplySealer,
        /// What the client allows to be disclosed besides.
        disclosure: Disclosure,
    },
    /// The probe did not open or may not run here; its place in the batch computed a zero
    /// share, and its caller gets this refusal instead of an output.
    Refused(String),
}

struct ActiveSearch {
    me: PartyIndex,
    /// What the party signs its output with (derived from its key at start).
    signer: Arc<PartySigningKey>,
    /// The batch's probes in batch order (one for a single search).
    probes: Vec<ProbeSlot>,
    /// The parameters and eye of the search, for the signed outputs.
    params: SearchParams,
    eye: Eye,
    state: State,
    to_next: Channel,
    from_prev: Channel,
    order: Arc<CanonicalOrder>,
    /// The round whose message the next call must carry.
    next_round: u32,
    last_used: Instant,
    /// Its working memory, released with it.
    _work: WorkReservation,
}

/// What a start has settled before the scan: the table key, the bound session, the
/// parameters, the eye and the searched set.
struct Launch {
    id: SessionId,
    bound: SessionId,
    params: SearchParams,
    eye: Eye,
    order: Arc<CanonicalOrder>,
    /// The search's working memory, reserved before its scan.
    work: WorkReservation,
}

impl ActiveSearch {
    /// Each probe's view and what is relayed for it: its output signed ([`crate::iris::output`]:
    /// its own session id, parameters, eye, set digest, entries and result) and sealed to its
    /// own client, with the uniqueness bit in the clear only if its probe allows it; or its
    /// refusal at start.
    fn finish(&self, outputs: Vec<MatchOutput>) -> Vec<ProbeOutcome> {
        outputs
            .into_iter()
            .zip(&self.probes)
            .map(|(output, slot)| {
                let view = match output {
                    MatchOutput::Identify(entries) => RoundReply::Identified(
                        entries
                            .into_iter()
                            .filter_map(|e| self.order.subjects.get(e).cloned())
                            .collect(),
                    ),
                    MatchOutput::Unique(u) => RoundReply::Unique(u),
                    MatchOutput::MatchesEarlierRequest => RoundReply::MatchesEarlierRequest,
                    MatchOutput::Withheld => RoundReply::Identified(Vec::new()),
                };
                let relayed = match slot {
                    ProbeSlot::Refused(why) => Err(why.clone()),
                    ProbeSlot::Accepted {
                        session,
                        reply,
                        disclosure,
                    } => Ok(self.seal(&view, *session, reply, *disclosure)),
                };
                ProbeOutcome { view, relayed }
            })
            .collect()
    }

    /// One probe's output, signed and sealed to its client.
    fn seal(
        &self,
        view: &RoundReply,
        session: SessionId,
        reply: &ReplySealer,
        disclosure: Disclosure,
    ) -> SealedOutput {
        let result = match view {
            RoundReply::Unique(u) => IrisResult::Unique(*u),
            RoundReply::MatchesEarlierRequest => IrisResult::MatchesEarlierRequest,
            RoundReply::Identified(s) => IrisResult::Identified(s.clone()),
            RoundReply::Continue(_) => IrisResult::Identified(Vec::new()),
        };
        // The coordinator learns the bit only: not which of the two a non-unique probe matched.
        let disclosed_unique = match &result {
            _ if !disclosure.discloses_bit() => None,
            IrisResult::Unique(u) => Some(*u),
            IrisResult::MatchesEarlierRequest => Some(false),
            IrisResult::Identified(_) => None,
        };
        let output = IrisOutput {
            party: self.me,
            session,
            params: self.params,
            eye: self.eye,
            set_digest: self.order.digest,
            entries: self.order.subjects.len() as u64,
            result,
        };
        SealedOutput {
            sealed: seal_output(reply, &output, &self.signer, &mut OsRng),
            disclosed_unique,
        }
    }
}

/// The running searches of one party (module docs).
pub struct SearchService {
    table: Mutex<SessionTable>,
    backend: Arc<dyn ScanBackend>,
    timeout: Duration,
    work: Arc<WorkMemory>,
}

/// The working memory of one party's running searches, counted in comparisons: a start
/// reserves its comparisons (entries × probes × rotations) before it scans and holds them
/// until its search ends, is aborted or expires. One search may always run alone, whatever
/// its size (a search over a large set must not be refused on an idle party); beside others
/// it waits until the total fits the budget. A bound on memory, where the number of searches
/// ([`MAX_ACTIVE_SEARCHES`]) is none.
struct WorkMemory {
    /// The budget, in comparisons.
    budget: usize,
    reserved: AtomicUsize,
    /// Wakes waiting starts when a reservation is released.
    released: (Mutex<()>, Condvar),
}

/// Comparisons reserved by one search; released when dropped (with the search).
struct WorkReservation {
    work: Arc<WorkMemory>,
    comparisons: usize,
}

impl Drop for WorkReservation {
    fn drop(&mut self) {
        self.work
            .reserved
            .fetch_sub(self.comparisons, AtomicOrdering::AcqRel);
        let (lock, wake) = &self.work.released;
        let _guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        wake.notify_all();
    }
}

impl WorkMemory {
    fn new(budget_mib: usize) -> Self {
        WorkMemory {
            budget: (budget_mib << 20) / WORK_BYTES_PER_COMPARISON,
            reserved: AtomicUsize::new(0),
            released: (Mutex::new(()), Condvar::new()),
        }
    }

    /// Reserves `comparisons` now if they fit beside the reserved ones (or nothing is
    /// reserved).
    fn try_reserve(self: &Arc<Self>, comparisons: usize) -> Option<WorkReservation> {
        self.reserved
            .fetch_update(AtomicOrdering::AcqRel, AtomicOrdering::Acquire, |held| {
                let total = held.saturating_add(comparisons);
                (held == 0 || total <= self.budget).then_some(total)
            })
            .ok()
            .map(|_| WorkReservation {
                work: Arc::clone(self),
                comparisons,
            })
    }

    /// Reserves `comparisons`, waiting up to `wait` for running searches to release theirs
    /// (and stopping once `interrupt` is raised).
    fn reserve(
        self: &Arc<Self>,
        comparisons: usize,
        wait: Duration,
        interrupt: &Interrupt,
    ) -> Result<WorkReservation, SearchError> {
        let deadline = Instant::now() + wait;
        let (lock, wake) = &self.released;
        let mut guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = self.try_reserve(comparisons) {
                return Ok(r);
            }
            let now = Instant::now();
            if now >= deadline || interrupt.is_raised() {
                return Err(SearchError::NoWorkMemory {
                    budget_mib: (self.budget * WORK_BYTES_PER_COMPARISON) >> 20,
                    waited_secs: wait.as_secs(),
                });
            }
            // Bounded waits: a release between the check and the wait, or an interrupt, is
            // seen within 50 ms.
            let step = (deadline - now).min(Duration::from_millis(50));
            guard = wake
                .wait_timeout(guard, step)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The searches between calls, and the session ids already used.
#[derive(Default)]
struct SessionTable {
    sessions: HashMap<SessionId, ActiveSearch>,
    /// Starts admitted and still computing (counted against [`MAX_ACTIVE_SEARCHES`]).
    starting: usize,
    /// Searches taken out of `sessions` while one of their rounds is computed.
    in_round: usize,
    used: HashSet<SessionId>,
    used_order: VecDeque<SessionId>,
}

impl SessionTable {
    fn remember(&mut self, id: SessionId) -> Result<(), SearchError> {
        if !self.used.insert(id) {
            return Err(SearchError::ReplayedSession(session_hex(&id)));
        }
        self.used_order.push_back(id);
        if self.used_order.len() > REMEMBERED_SESSIONS {
            if let Some(old) = self.used_order.pop_front() {
                self.used.remove(&old);
            }
        }
        Ok(())
    }

    fn active(&self) -> usize {
        self.sessions.len() + self.starting + self.in_round
    }
}

/// Which counter of the [`SessionTable`] a running call holds.
#[derive(Clone, Copy)]
enum Busy {
    Starting,
    InRound,
}

/// Holds one unit of a [`SessionTable`] counter while a start or a round computes outside
/// the lock; gives it back when dropped (also on an error or a panic).
struct BusyGuard<'a> {
    service: &'a SearchService,
    which: Busy,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let mut table = self.service.table();
        match self.which {
            Busy::Starting => table.starting -= 1,
            Busy::InRound => table.in_round -= 1,
        }
    }
}

fn session_hex(id: &SessionId) -> String {
    hex::encode(id)
}

/// The channel and PRF session id of a search (module docs, "Binding").
fn bound_session(id: &SessionId, params: &SearchParams, eye: Eye, digest: &[u8; 32]) -> SessionId {
    let mut h = Sha256::new();
    h.update(b"privmatch iris search v1");
    h.update(id);
    bind_search(h, params, eye, digest)
}

/// Ends a binding hash with the search's parameters, eye and set digest.
fn bind_search(mut h: Sha256, params: &SearchParams, eye: Eye, digest: &[u8; 32]) -> SessionId {
    h.update([params.mode().to_byte(), eye.to_byte()]);
    h.update(params.max_rotation().to_le_bytes());
    h.update(params.threshold().numerator().to_le_bytes());
    h.update(digest);
    let full = h.finalize();
    let mut out = [0u8; SESSION_ID_LEN];
    out.copy_from_slice(&full[..SESSION_ID_LEN]);
    out
}

/// The channel and PRF session id of a batch (module docs, "Batches"): as
/// [`bound_session`], over the batch id and every probe's session id in batch order.
fn bound_batch(batch: &BatchStart<'_>, digest: &[u8; 32]) -> SessionId {
    let mut h = Sha256::new();
    h.update(b"privmatch iris batch v1");
    h.update(batch.batch);
    h.update((batch.probes.len() as u64).to_le_bytes());
    for (id, _) in batch.probes {
        h.update(id);
    }
    // An enrolment batch binds its requests' envelope hashes too (a search batch is
    // bound exactly as before: the domain is unchanged for it).
    if !batch.enrolments.is_empty() {
        h.update(b"enrolments");
        for enrolment in batch.enrolments {
            h.update(enrolment.hashes);
        }
    }
    bind_search(h, &batch.params, batch.eye, digest)
}

/// Opens one enrol-if-unique request's envelope at party `me`: its own share of the one
/// record inside, of the batch's eye.
fn open_batch_enrolment(
    keys: &PartyKeys,
    eye: Eye,
    enrolment: &BatchEnrolment<'_>,
) -> Result<IrisShare, SearchError> {
    let mut bundles = open_iris_enrollment(keys.me, &keys.secret, enrolment.envelope)?;
    match (bundles.pop(), bundles.is_empty()) {
        (Some(bundle), true) if bundle.eye == eye => Ok(bundle.share),
        _ => Err(SearchError::EnrolmentBatch(
            "an envelope does not hold exactly one record of the batch's eye",
        )),
    }
}

/// Checks that an enroll-if-unique request's admitted probe (`slot`) names the record it came
/// with: the enrolment id of `enrolment`'s relayed hashes (the caller checked this party's
/// slot of them against its envelope).
fn check_probe_names(slot: &ProbeSlot, enrolment: &BatchEnrolment<'_>) -> Result<(), SearchError> {
    let named = match slot {
        ProbeSlot::Accepted { disclosure, .. } => disclosure.record(),
        ProbeSlot::Refused(_) => None,
    };
    let hashes: Option<&[u8; ENVELOPE_HASHES_LEN]> = enrolment.hashes.try_into().ok();
    match (named, hashes) {
        (Some(named), Some(hashes)) if named == enrolment_id(hashes) => Ok(()),
        _ => Err(ProbeRefusal::NotItsRecord.into()),
    }
}

/// The zero share that stands in for a refused probe of a batch, so the three parties keep
/// one layout (its results go to nobody).
fn zero_share(me: PartyIndex) -> IrisShare {
    IrisShare {
        party: me,
        code: vec![0; CODE_SHARE_COEFS],
        mask: vec![0; MASK_SHARE_COEFS],
    }
}

impl SearchService {
    /// An empty service scanning with `backend` (the engine worker chooses it: CPU kernels,
    /// or a GPU crate's backend); idle searches expire after `timeout`.
    pub fn new(backend: Arc<dyn ScanBackend>, timeout: Duration) -> Self {
        SearchService {
            table: Mutex::new(SessionTable::default()),
            backend,
            timeout,
            work: Arc::new(WorkMemory::new(DEFAULT_WORK_MEM_MIB)),
        }
    }

    /// The same service with a budget of `mib` MiB of working memory for its running
    /// searches (module docs of [`WorkMemory`]; at least one search always runs).
    pub fn with_work_mem_mib(mut self, mib: usize) -> Self {
        self.work = Arc::new(WorkMemory::new(mib));
        self
    }

    /// Comparisons the running searches hold of the working-memory budget, and the budget.
    pub fn work_memory(&self) -> (usize, usize) {
        (
            self.work.reserved.load(AtomicOrdering::Acquire),
            self.work.budget,
        )
    }

    /// The scan backend in use.
    pub fn backend(&self) -> &dyn ScanBackend {
        &*self.backend
    }

    /// Number of running searches (including those in a start or a round right now).
    pub fn active(&self) -> usize {
        self.table().active()
    }

    /// The table; a panic of another call while it held the lock leaves the table itself
    /// consistent (every change under the lock is one insert, remove or counter step), so
    /// the lock's poison is ignored.
    fn table(&self) -> MutexGuard<'_, SessionTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn busy(&self, which: Busy) -> BusyGuard<'_> {
        BusyGuard {
            service: self,
            which,
        }
    }

    /// Admits a start: refused while [`MAX_ACTIVE_SEARCHES`] run (before `id` is
    /// remembered, so that refusal leaves nothing behind) or for a used `id`; the guard
    /// counts it as starting until dropped.
    fn admit(&self, id: SessionId) -> Result<BusyGuard<'_>, SearchError> {
        let mut table = self.table();
        if table.active() >= MAX_ACTIVE_SEARCHES {
            return Err(SearchError::TooManySearches(MAX_ACTIVE_SEARCHES));
        }
        table.remember(id)?;
        table.starting += 1;
        Ok(self.busy(Busy::Starting))
    }

    /// Starts search `id` ([BGK+24] Algorithm 3 steps 1–3 at this party): opens the sealed
    /// probe, takes the search parameters sealed with it (they travel nowhere else), checks
    /// that its threshold is this party's `policy` and that it is fresh at `unix_now` (seconds
    /// since the Unix epoch), scans the store's entries of the probe's eye
    /// in canonical order (stopping with an error once `interrupt` is raised) and returns the
    /// first message. The store must have been brought up
    /// to date by the caller.
    // Each argument is a distinct input of the protocol step; bundling them would only rename.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &self,
        store: &IrisStore,
        keys: &PartyKeys,
        id: SessionId,
        sealed_probe: &[u8],
        policy: IrisPolicy,
        now: Instant,
        unix_now: u64,
        interrupt: &Interrupt,
    ) -> Result<StartReply, SearchError> {
        let _starting = self.admit(id)?;
        let me = keys.me;
        let probe = open_iris_probe(me, &keys.secret, &id, sealed_probe)?;
        check_probe(&probe, &policy, unix_now)?;
        let comparisons = store
            .len_of(probe.eye)
            .saturating_mul(2 * probe.params.max_rotation().max(0) as usize + 1);
        let work = self.work.reserve(comparisons, WORK_MEM_WAIT, interrupt)?;
        let order = store.canonical(probe.eye);
        let bound = bound_session(&id, &probe.params, probe.eye, &order.digest);
        let slot = ProbeSlot::Accepted {
            session: id,
            reply: output_sealer(me, &keys.secret, &probe.reply.key, &id),
            disclosure: probe.reply.disclosure,
        };
        let search = Launch {
            id,
            bound,
            params: probe.params,
            eye: probe.eye,
            order,
            work,
        };
        self.launch(
            store,
            keys,
            search,
            vec![probe.share],
            vec![slot],
            Vec::new(),
            now,
            interrupt,
        )
    }

    /// Starts a batch of searches (module docs, "Batches"; [BGK+24] Algorithm 3 steps 1–3
    /// for every probe at once): opens and checks each probe as [`SearchService::start`]
    /// does, and also that it was sealed with the batch's declared parameters and eye and
    /// that its session id is unused; a probe that fails any check is refused alone (a zero
    /// share takes its place, so the batch keeps its layout at the three parties) and the
    /// others run. Scans the store once for all probes and returns the first message. Fails
    /// as a whole only for the batch itself: no probe or more than [`MAX_BATCH_PROBES`], a
    /// used batch id, more comparisons than [`MAX_BATCH_COMPARISONS`], or a failed scan.
    // As for `start`.
    #[allow(clippy::too_many_arguments)]
    pub fn start_batch(
        &self,
        store: &IrisStore,
        keys: &PartyKeys,
        batch: &BatchStart<'_>,
        policy: IrisPolicy,
        now: Instant,
        unix_now: u64,
        interrupt: &Interrupt,
    ) -> Result<BatchStartReply, SearchError> {
        let count = batch.probes.len();
        if count == 0 || count > MAX_BATCH_PROBES {
            return Err(SearchError::BatchSize(count));
        }
        let enrolling = !batch.enrolments.is_empty();
        if enrolling
            && (batch.enrolments.len() != count || batch.params.mode() != SearchMode::Uniqueness)
        {
            return Err(SearchError::EnrolmentBatch(
                "one enrolment per probe, in a uniqueness batch",
            ));
        }
        let entries = store.len_of(batch.eye) + if enrolling { count } else { 0 };
        let comparisons = entries
            .saturating_mul(count)
            .saturating_mul(2 * batch.params.max_rotation().max(0) as usize + 1);
        if comparisons > MAX_BATCH_COMPARISONS {
            return Err(SearchError::BatchTooLarge {
                probes: count,
                entries,
            });
        }
        let work = self.work.reserve(comparisons, WORK_MEM_WAIT, interrupt)?;
        let _starting = self.admit(batch.batch)?;
        let me = keys.me;
        let mut shares = Vec::with_capacity(count);
        let mut slots = Vec::with_capacity(count);
        let mut refused = Vec::with_capacity(count);
        let mut rows = Vec::with_capacity(batch.enrolments.len());
        for (k, (id, sealed)) in batch.probes.iter().enumerate() {
            // A request's record takes part in the later probes' comparisons only together
            // with its own probe, admitted here and naming it: otherwise its row is a zero
            // share (docs/protocols/iris.md §13.4). Refused at all three parties alike (a
            // replayed request, a record with another request's probe), the row is zero at
            // each: a public zero, which matches nothing, so a coordinator cannot compare a
            // probe with records of its choice. Refused at some parties only, the row is
            // noise and the later probes' answers are void: the coordinator sees the
            // refusal and has their callers retry (`privmatch iris enroll --if-unique` does).
            let accepted = match batch.enrolments.get(k) {
                None => self.accept_probe(keys, batch, id, sealed, &policy, unix_now),
                Some(enrolment) => {
                    let admitted =
                        open_batch_enrolment(keys, batch.eye, enrolment).and_then(|row| {
                            let (share, slot) =
                                self.accept_probe(keys, batch, id, sealed, &policy, unix_now)?;
                            check_probe_names(&slot, enrolment)?;
                            Ok((row, share, slot))
                        });
                    match admitted {
                        Ok((row, share, slot)) => {
                            rows.push(row);
                            Ok((share, slot))
                        }
                        Err(why) => {
                            rows.push(zero_share(me));
                            Err(why)
                        }
                    }
                }
            };
            match accepted {
                Ok((share, slot)) => {
                    shares.push(share);
                    slots.push(slot);
                    refused.push(None);
                }
                Err(why) => {
                    shares.push(zero_share(me));
                    slots.push(ProbeSlot::Refused(why.to_string()));
                    refused.push(Some(why));
                }
            }
        }
        let order = store.canonical(batch.eye);
        let search = Launch {
            id: batch.batch,
            bound: bound_batch(batch, &order.digest),
            params: batch.params,
            eye: batch.eye,
            order,
            work,
        };
        let start = self.launch(store, keys, search, shares, slots, rows, now, interrupt)?;
        Ok(BatchStartReply { start, refused })
    }

    /// Opens and checks one probe of a batch; why it may not run, if it may not.
    fn accept_probe(
        &self,
        keys: &PartyKeys,
        batch: &BatchStart<'_>,
        id: &SessionId,
        sealed: &[u8],
        policy: &IrisPolicy,
        unix_now: u64,
    ) -> Result<(IrisShare, ProbeSlot), SearchError> {
        let me = keys.me;
        let probe = open_iris_probe(me, &keys.secret, id, sealed)?;
        check_probe(&probe, policy, unix_now)?;
        if probe.params != batch.params || probe.eye != batch.eye {
            return Err(ProbeRefusal::NotTheBatch.into());
        }
        if self.table().remember(*id).is_err() {
            return Err(ProbeRefusal::Replayed.into());
        }
        let slot = ProbeSlot::Accepted {
            session: *id,
            reply: output_sealer(me, &keys.secret, &probe.reply.key, id),
            disclosure: probe.reply.disclosure,
        };
        Ok((probe.share, slot))
    }

    /// The common part of a start: the pairwise channels of the bound session, the scan of
    /// the store with every probe's rotations as one block, the first message, and the
    /// search put in the table under its id.
    // As for `start`.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        store: &IrisStore,
        keys: &PartyKeys,
        search: Launch,
        shares: Vec<IrisShare>,
        probes: Vec<ProbeSlot>,
        rows: Vec<IrisShare>,
        now: Instant,
        interrupt: &Interrupt,
    ) -> Result<StartReply, SearchError> {
        let Launch {
            id,
            bound,
            params,
            eye,
            order,
            work,
        } = search;
        let me = keys.me;
        let peer_key =
            |p: PartyIndex| keys.peers[p.as_usize()].ok_or(SearchError::PeerNotPinned(p));
        let (next_key, prev_key) = (peer_key(me.next())?, peer_key(me.prev())?);
        let pairwise = |p: PartyIndex, key: &PartyPublicKey| {
            PairwiseSecrets::derive(me, &keys.secret, p, key).map_err(|source| {
                SearchError::Channel {
                    session: session_hex(&id),
                    round: 0,
                    from: p,
                    source,
                }
            })
        };
        let with_next = pairwise(me.next(), &next_key)?;
        let with_prev = pairwise(me.prev(), &prev_key)?;
        let mut to_next = with_next.channel(bound);
        let from_prev = with_prev.channel(bound);
        let protocol = |source: MatchError| SearchError::Protocol {
            session: session_hex(&id),
            source,
        };
        let (state, payload) = if order.subjects.is_empty() && rows.is_empty() {
            (State::Empty(params.mode()), Vec::new())
        } else {
            let query = PreparedQuery::batch(&shares, params.max_rotation())
                .map_err(|e| protocol(e.into()))?;
            let mut dots = store.scan(eye, &order, &*self.backend, &query, interrupt)?;
            if !rows.is_empty() {
                dots = self.append_rows(dots, &rows, &query, interrupt)?;
            }
            let ctx = MpcContext::new(me, bound, with_next.prf(), with_prev.prf());
            let config = MatchConfig {
                max_rotation: params.max_rotation(),
                threshold: params.threshold(),
                mode: params.mode(),
                entitled: PartyIndex::ALL.to_vec(),
            };
            let started = if rows.is_empty() {
                IrisMatchSession::start_batch_with_dots(&ctx, &config, dots, shares.len())
            } else {
                IrisMatchSession::start_enrolment_batch_with_dots(&ctx, &config, dots, shares.len())
            };
            match started.map_err(protocol)? {
                Step::Send(session, out) => (State::Running(Box::new(session)), out.payload),
                Step::Done(_) => {
                    return Err(protocol(MatchError::InvalidInput(
                        "the search ended before its first round",
                    )))
                }
            }
        };
        let message = to_next.seal(0, &payload, &mut OsRng);
        let entries = order.subjects.len();
        let digest = order.digest;
        self.table().sessions.insert(
            id,
            ActiveSearch {
                me,
                signer: Arc::new(PartySigningKey::derive(&keys.secret)),
                probes,
                params,
                eye,
                state,
                to_next,
                from_prev,
                order,
                next_round: 0,
                last_used: now,
                _work: work,
            },
        );
        Ok(StartReply {
            entries,
            digest,
            message,
        })
    }

    /// The dot products of `dots` followed by those of an enrolment batch's own requests
    /// (`rows`, in batch order) with the same query block: entries N..N + B of the batch.
    fn append_rows(
        &self,
        mut dots: DotShares,
        rows: &[IrisShare],
        query: &PreparedQuery,
        interrupt: &Interrupt,
    ) -> Result<DotShares, SearchError> {
        let codes: Vec<u16> = rows.iter().flat_map(|r| r.code.iter().copied()).collect();
        let masks: Vec<u16> = rows.iter().flat_map(|r| r.mask.iter().copied()).collect();
        let matrix = ShareMatrix::new(&codes, &masks).map_err(StoreError::Dot)?;
        let own = self
            .backend
            .scan(&matrix, query, interrupt)
            .map_err(StoreError::Dot)?;
        dots.num_entries += rows.len();
        dots.code.extend_from_slice(&own.code);
        dots.mask.extend_from_slice(&own.mask);
        Ok(dots)
    }

    /// Runs round `round` of search `id` with the sealed message of party i−1. Any failure
    /// aborts the search. Returns this party's own view of the output (for tests and
    /// benchmarks; what leaves the party is [`SearchService::round_sealed`]'s). For a batch,
    /// the view of its first probe.
    pub fn round(
        &self,
        id: SessionId,
        round: u32,
        message: &[u8],
        now: Instant,
    ) -> Result<RoundReply, SearchError> {
        match self.step(id, round, message, now)? {
            Stepped::Continue(m) => Ok(RoundReply::Continue(m)),
            Stepped::Finished(mut outcomes) => Ok(outcomes.swap_remove(0).view),
        }
    }

    /// [`SearchService::round`] with every probe's view of a batch (batch order).
    pub fn round_views(
        &self,
        id: SessionId,
        round: u32,
        message: &[u8],
        now: Instant,
    ) -> Result<Vec<RoundReply>, SearchError> {
        match self.step(id, round, message, now)? {
            Stepped::Continue(m) => Ok(vec![RoundReply::Continue(m)]),
            Stepped::Finished(outcomes) => Ok(outcomes.into_iter().map(|o| o.view).collect()),
        }
    }

    /// [`SearchService::round`] as the coordinator receives it: the next message, or this
    /// party's output signed ([`crate::iris::output`]: session, parameters, eye, set digest,
    /// entries and result) and sealed to the client's reply key, with the uniqueness bit in
    /// the clear only if the client's probe allows it.
    pub fn round_sealed(
        &self,
        id: SessionId,
        round: u32,
        message: &[u8],
        now: Instant,
    ) -> Result<SealedRound, SearchError> {
        let not_single = || SearchError::Protocol {
            session: session_hex(&id),
            source: MatchError::InvalidInput(
                "a batch's outputs are relayed by round_batch, not as one search's",
            ),
        };
        match self.round_batch(id, round, message, now)? {
            BatchRound::Continue(m) => Ok(SealedRound::Continue(m)),
            BatchRound::Finished(mut outputs) if outputs.len() == 1 => outputs
                .swap_remove(0)
                .map(SealedRound::Finished)
                .map_err(|_| not_single()),
            BatchRound::Finished(_) => Err(not_single()),
        }
    }

    /// A round of a batch as the coordinator receives it (module docs, "Batches"): the next
    /// message, or per probe its output signed and sealed to its own client (as
    /// [`SearchService::round_sealed`]) or its refusal at start.
    pub fn round_batch(
        &self,
        id: SessionId,
        round: u32,
        message: &[u8],
        now: Instant,
    ) -> Result<BatchRound, SearchError> {
        Ok(match self.step(id, round, message, now)? {
            Stepped::Continue(m) => BatchRound::Continue(m),
            Stepped::Finished(outcomes) => {
                BatchRound::Finished(outcomes.into_iter().map(|o| o.relayed).collect())
            }
        })
    }

    /// One round: the next message, or each probe's view and what is relayed for it.
    fn step(
        &self,
        id: SessionId,
        round: u32,
        message: &[u8],
        now: Instant,
    ) -> Result<Stepped, SearchError> {
        let (mut active, _in_round) = {
            let mut table = self.table();
            let Some(active) = table.sessions.remove(&id) else {
                return Err(SearchError::UnknownSession(session_hex(&id)));
            };
            table.in_round += 1;
            (active, self.busy(Busy::InRound))
        };
        let session = session_hex(&id);
        if round != active.next_round {
            return Err(SearchError::WrongRound {
                session,
                expected: active.next_round,
                got: round,
            });
        }
        let from = active.me.prev();
        let payload =
            active
                .from_prev
                .open(round, message)
                .map_err(|source| SearchError::Channel {
                    session: session.clone(),
                    round,
                    from,
                    source,
                })?;
        let protocol = |source: MatchError| SearchError::Protocol {
            session: session.clone(),
            source,
        };
        let state = std::mem::replace(&mut active.state, State::Empty(active.params.mode()));
        let step = match state {
            State::Empty(mode) => {
                if !payload.is_empty() {
                    return Err(protocol(MatchError::InvalidInput(
                        "a search over no entries carries no message",
                    )));
                }
                let none = match mode {
                    SearchMode::Identify => MatchOutput::Identify(Vec::new()),
                    SearchMode::Uniqueness => MatchOutput::Unique(true),
                };
                let outputs = vec![none; active.probes.len()];
                return Ok(Stepped::Finished(active.finish(outputs)));
            }
            State::Running(s) => s.receive(from, &payload).map_err(protocol)?,
        };
        match step {
            Step::Send(next, out) => {
                let sealed_message = active.to_next.seal(round + 1, &out.payload, &mut OsRng);
                active.state = State::Running(Box::new(next));
                active.next_round = round + 1;
                active.last_used = now;
                self.table().sessions.insert(id, active);
                Ok(Stepped::Continue(sealed_message))
            }
            Step::Done(outputs) => {
                if outputs.len() != active.probes.len() {
                    return Err(protocol(MatchError::InvalidInput(
                        "the batch's outputs do not match its probes",
                    )));
                }
                Ok(Stepped::Finished(active.finish(outputs)))
            }
        }
    }

    /// Drops search `id`; returns whether it was running.
    pub fn abort(&self, id: &SessionId) -> bool {
        self.table().sessions.remove(id).is_some()
    }

    /// Drops searches idle for longer than the timeout; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let timeout = self.timeout;
        let mut table = self.table();
        let before = table.sessions.len();
        table
            .sessions
            .retain(|_, s| now.saturating_duration_since(s.last_used) <= timeout);
        before - table.sessions.len()
    }
}

#[cfg(test)]
mod tests;
