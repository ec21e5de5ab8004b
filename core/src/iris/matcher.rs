//! The 3-party iris matching protocol of one search ([BGK+24] Algorithm 3, the deployed variant
//! with codes **and** masks secret-shared): one party's message-driven state machine,
//! [`IrisMatchSession`], composed of the sub-protocols of [`crate::iris::query`],
//! [`crate::iris::dot`] and [`crate::mpc`]. Nothing here does I/O: the caller moves each
//! outgoing payload to its recipient and feeds the received payloads back.
//!
//! **Inputs at party i.** Its [`ShareMatrix`] of the N enrolled shares (entry e's code and
//! mask rows), its [`IrisShare`] of the probe ([`crate::iris::query::share_query_template`]),
//! the [`MatchConfig`] (maximum rotation 15 or 0, [`Threshold`], [`SearchMode`], the parties
//! entitled to the opened output) and its [`MpcContext`] (the pairwise PRFs it shares with
//! parties i+1 and i−1 and the 16-byte session id, the same material as an
//! [`MpcContext`]).
//!
//! **Steps and share layout** (R = 2·max_rotation + 1 rotations, comparison k = e·R + r for
//! entry e and rotation index r, rotation r − max_rotation; "entry-major" everywhere):
//!
//! 1. *Query preparation* ([BGK+24] §4.3.2; local): [`PreparedQuery::prepare`] multiplies the
//!    probe share by the Lagrange coefficient λ_i, re-lays it out for the constant-term dot
//!    product and rotates it R times.
//! 2. *Local dot products* ([BGK+24] §4.3.2; local): [`scan`] with [`DotKernel::detect`] gives
//!    3-of-3 additive Z_2^16 shares of the code dot product c_k and of the (half-size) mask dot
//!    product m_k of every comparison ([`DotShares`], entry-major `e·R + r`).
//! 3. *Reshare* ([BGK+24] §4.3.2 last step, [TACEO24] §3.2; **1 round**): both vectors are
//!    re-randomised with PRF zero sharings and reshared into replicated Z_2^16 shares
//!    ([`ReshareState`]); one message carries code ‖ mask (2 + 2 bytes per comparison).
//! 4. *Lift and compare* ([BGK+24] §5; **14 rounds** for τ = 0.345, [`lift_compare_rounds`]):
//!    [`LiftCompareProgram`] extracts MSB(A·m − B·c) with A = 2Q − 4P, B = Q for τ = P/Q,
//!    Q = 10,000, from the zero-extended 16-bit components: the wrap counts of c + 2^15 and m
//!    (the lift of [BGK+24], 6 rounds, side by side with the low half of the sum) enter the
//!    binary sum as public multiples of shared bits instead of being injected into Z_2^32.
//!    Output: a bit-sliced replicated XOR share of match_k = (fhd_k < τ), **exact** for every
//!    τ with at most four decimals (τ = 0.345: hd·200 < 69·common, fhd = τ exactly is no
//!    match; derivation in [`crate::iris::mpc::compare`]), bit k = comparison k.
//! 5. *OR reduction* ([TACEO24] §2.3 OR tree, a ∨ b = ¬(¬a ∧ ¬b); **⌈log2 R⌉ rounds** for
//!    [`SearchMode::Identify`], **⌈log2(R·N)⌉ rounds** for [`SearchMode::Uniqueness`]).
//!    Identify transposes the entry-major bits locally into R rotation planes of N bits (plane
//!    r, bit e) and ANDs whole planes pairwise ([`PlaneOrProgram`]), so every round carries
//!    dense words (N/8 bytes per AND); the result is one N-bit plane, bit e = entry e matched
//!    at some rotation. Identify with R = 1 needs no round. Uniqueness reduces all R·N bits to
//!    one with [`OrTreeProgram`].
//! 6. *Open* ([TACEO24] §3.2 reveal; **1 round**): party i sends its component x_{i−1} to party
//!    i+1 if i+1 is entitled, an empty payload otherwise (so the schedule does not depend on
//!    who is entitled beyond that). The entitled parties learn the N per-entry bits
//!    (Identify) or the one OR bit (Uniqueness) and nothing else: no distance, no rotation.
//!
//! **Rounds.** 1 + 14 + ⌈log2 R⌉ + 1 = **21** for Identify with R = 31 and **16** with R = 1
//! (τ = 0.345), for every N; 1 + 14 + ⌈log2(31·N)⌉ + 1 for Uniqueness (e.g. 38 for
//! N = 100,000). [`expected_rounds`] computes it. The number of rounds of Identify does not
//! depend on N: every round batches all comparisons into one message. **In every round party
//! i sends exactly one message, to party i+1, and receives exactly one, from party i−1** (all
//! the sub-protocols have this shape).
//!
//! **Batches.** B probes of the same parameters and eye run as one session: the query block
//! holds the B·R rotations ([`PreparedQuery::batch`], probe b's at b·R..(b+1)·R), so the scan
//! reads each template share once per batch and comparison k = e·B·R + b·R + r. Reshare and
//! lift/compare carry all B·N·R comparisons in the same 15 rounds; Identify transposes into R
//! planes of B·N bits (⌈log2 R⌉ rounds), Uniqueness reduces B groups of N·R bits side by side
//! (⌈log2(R·N)⌉ rounds). A batch has exactly the rounds of one search, and each probe's
//! output is what it would be alone.
//!
//! **In-batch uniqueness** (iris-mpc's intra-batch matching, [BGK+24] §6 deployment notes):
//! a batch of enrol-if-unique requests appends the requests' own enrolment shares as B more
//! entries (N + B in all, in batch order), and probe b has two OR groups: the enrolled
//! entries, and requests 0..b − 1 ([`IrisMatchSession::start_enrolment_batch_with_dots`]); the
//! later requests' bits are left out. The two opened bits say whether it matched the enrolled
//! set, only an earlier request ([`MatchOutput::MatchesEarlierRequest`]), or nothing. Two
//! requests of one person in one batch: the later is not unique whatever the earlier's own
//! outcome, so at most one of them is enrolled. Rounds: those of a uniqueness search over
//! max(N, B − 1) entries.
//!
//! **Communication** (measured by the in-process driver of the tests, N = 1,000, R = 31):
//! 1,136,412 bytes sent per party in 21 rounds, ≈ 36.7 bytes per party per comparison:
//! reshare 4, lift and compare ≈ 32.5 (the wrap bits of c and m, the 32-bit sum with its
//! corrections), OR tree ≈ 0.12, the opening N/8 bytes in all, plus a 4-byte header per
//! round. All three parties send the same amounts. (Before the wrap counts were folded into
//! the sum: 1,988,736 bytes in 22 rounds, 64.2 per comparison.)
//!
//! **Wire format.** Every payload is `round: u32 LE ‖ body`, where `round` counts this
//! session's rounds from 0 and `body` is the sub-protocol's payload (the reshare values, the
//! [`crate::iris::mpc::binary::Session`] gate words, the opened words). The round header is public
//! (the schedule is fixed) and makes a replayed or reordered message an error even where two
//! rounds have the same body length. The sealed channel ([`crate::crypto::seal::Channel`])
//! authenticates sender and session.
//!
//! **PRF contexts.** The reshare zero sharings use
//! [`reshare_context`]`(session, 0, "iris code" / "iris mask")`, the gate rounds the labels
//! `iris match compare` and `iris match or` of [`MpcContext`]; all are separated by the
//! session id, which must be fresh per search.

use std::fmt;

use crate::algebra::ring::Z16;
use crate::iris::dot::{scan, DotError, DotKernel, DotShares, ShareMatrix};
use crate::iris::encoding::IrisShare;
use crate::iris::mpc::binary::{
    open_message, open_receive, unpack_bits, words_for, BitSliced, Gates, MpcContext, MpcError,
    Outgoing, Products, Program, ProgramStep, Session, Step, WORD_BITS,
};
use crate::iris::mpc::compare::{lift_compare_rounds, LiftCompareProgram, Threshold};
use crate::iris::mpc::or_tree::OrTreeProgram;
use crate::iris::mpc::reshare::{reshare_context, ReshareError, ReshareState};
use crate::iris::params::SearchMode;
use crate::iris::policy::IrisPolicy;
use crate::iris::query::{PreparedQuery, QueryError};
use crate::party::PartyIndex;

/// Bytes of the round header in front of every payload (module docs).
pub const HEADER_BYTES: usize = 4;

const LABEL_COMPARE: &[u8] = b"iris match compare";
const LABEL_OR: &[u8] = b"iris match or";

/// A party's output of one search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatchOutput {
    /// [`SearchMode::Identify`]: the indices (rows of the share matrix) of the matching
    /// entries, increasing.
    Identify(Vec<usize>),
    /// [`SearchMode::Uniqueness`]: `true` if the probe matched no entry.
    Unique(bool),
    /// In an enrolment batch (module docs, "In-batch uniqueness"): not unique, because the
    /// probe matched no enrolled entry but the record of an earlier request of its batch.
    /// (A probe that matches an enrolled entry is `Unique(false)`, whatever else it matches.)
    MatchesEarlierRequest,
    /// This party is not entitled to the output and learned nothing.
    Withheld,
}

/// Why a search step was refused. Messages carry shapes and round numbers only, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    /// The probe could not be prepared.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The local scan failed.
    #[error(transparent)]
    Dot(#[from] DotError),
    /// The resharing round refused the message.
    #[error(transparent)]
    Reshare(#[from] ReshareError),
    /// A binary-domain round refused the message.
    #[error(transparent)]
    Mpc(#[from] MpcError),
    /// The message came from another party than the previous one in the ring.
    #[error("iris match at {me}: expected the message from {expected}, got one from {got}")]
    WrongSender {
        /// The receiving party.
        me: PartyIndex,
        /// The previous party, the only one that sends to `me`.
        expected: PartyIndex,
        /// The claimed sender.
        got: PartyIndex,
    },
    /// The message belongs to another round (replayed, reordered or from another schedule).
    #[error("iris match at {me}: expected the message of round {expected}, got round {got}")]
    WrongRound {
        /// The receiving party.
        me: PartyIndex,
        /// The round this party waits for.
        expected: u32,
        /// The round named in the header.
        got: u32,
    },
    /// The message has the wrong length for its round.
    #[error("iris match at {me}, round {round}: message of {got} bytes, expected {expected}")]
    WrongLength {
        /// The receiving party.
        me: PartyIndex,
        /// The round.
        round: u32,
        /// Expected payload length (header included).
        expected: usize,
        /// Received payload length.
        got: usize,
    },
    /// The inputs are inconsistent (wrong party, wrong shapes).
    #[error("iris match: invalid input: {0}")]
    InvalidInput(&'static str),
}

/// The parameters of one search, identical at the three parties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchConfig {
    /// Rotations −max..=max columns (15 deployed, 0 for none).
    pub max_rotation: i32,
    /// The comparison constants.
    pub threshold: Threshold,
    /// Identification or uniqueness.
    pub mode: SearchMode,
    /// The parties that receive the opened output.
    pub entitled: Vec<PartyIndex>,
}

impl MatchConfig {
    /// The deployed defaults: ±15 rotations, τ = 0.345, output to all three parties.
    pub fn new(mode: SearchMode) -> Self {
        Self {
            max_rotation: crate::iris::template::MAX_ROTATION,
            threshold: IrisPolicy::default_policy().threshold(),
            mode,
            entitled: PartyIndex::ALL.to_vec(),
        }
    }

    /// Number of rotations R = 2·max_rotation + 1 (0 for a negative maximum).
    pub fn num_rotations(&self) -> usize {
        if self.max_rotation < 0 {
            0
        } else {
            2 * self.max_rotation as usize + 1
        }
    }
}

/// ⌈log2 L⌉ (0 for L ≤ 1): the rounds of an OR tree over L bits.
fn ceil_log2(l: usize) -> u32 {
    if l <= 1 {
        0
    } else {
        (l - 1).ilog2() + 1
    }
}

/// The number of rounds of a search over `num_entries` entries with `max_rotation` and
/// `threshold` (module docs): reshare 1 + lift/compare ([`lift_compare_rounds`], 14 for the
/// default τ) + OR tree + open 1.
pub fn expected_rounds(
    mode: SearchMode,
    num_entries: usize,
    max_rotation: i32,
    threshold: &Threshold,
) -> u32 {
    let r = 2 * max_rotation.max(0) as usize + 1;
    let or = match mode {
        SearchMode::Identify => ceil_log2(r),
        SearchMode::Uniqueness => ceil_log2(r.saturating_mul(num_entries)),
    };
    1 + lift_compare_rounds(threshold) + or + 1
}

/// Everything but the phase.
struct Core {
    party: PartyIndex,
    ctx: MpcContext,
    mode: SearchMode,
    threshold: Threshold,
    entitled: Vec<PartyIndex>,
    num_entries: usize,
    num_rotations: usize,
    /// Probes in the batch (B ≥ 1; module docs, "Batches").
    num_probes: usize,
    /// The last `batch_rows` entries are the batch's own enrolment requests (module docs,
    /// "In-batch uniqueness"); 0 for a search batch.
    batch_rows: usize,
    /// Messages sent so far; the state waits for the message of round `sent − 1`.
    sent: u32,
    bytes_sent: usize,
}

enum Phase {
    Reshare {
        code: ReshareState<Z16>,
        mask: ReshareState<Z16>,
    },
    Compare(Box<Session<LiftCompareProgram>>),
    OrPlanes(Session<PlaneOrProgram>),
    Or(Session<OrTreeProgram>),
    Open(BitSliced),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Phase::Reshare { .. } => "reshare",
            Phase::Compare(_) => "lift/compare",
            Phase::OrPlanes(_) | Phase::Or(_) => "or-tree",
            Phase::Open(_) => "open",
        }
    }
}

/// One party's state in a running search (module docs); between rounds it waits for the
/// message of party i−1.
pub struct IrisMatchSession {
    core: Core,
    phase: Phase,
}

impl fmt::Debug for IrisMatchSession {
    /// Prints the party, round and phase, never shares.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IrisMatchSession")
            .field("party", &self.core.party)
            .field("round", &self.round())
            .field("phase", &self.phase.name())
            .field("entries", &self.core.num_entries)
            .finish()
    }
}

impl Core {
    /// Frames `out` with the round header and returns the new state.
    fn emit(
        mut self,
        phase: Phase,
        out: Outgoing,
    ) -> Result<Step<IrisMatchSession, Vec<MatchOutput>>, MatchError> {
        if out.to != self.party.next() {
            return Err(MatchError::Mpc(MpcError::OutOfStep(
                "sub-protocol addressed a party other than the next one",
            )));
        }
        let mut payload = Vec::with_capacity(HEADER_BYTES + out.payload.len());
        payload.extend_from_slice(&self.sent.to_le_bytes());
        payload.extend_from_slice(&out.payload);
        self.sent += 1;
        self.bytes_sent += payload.len();
        Ok(Step::Send(
            IrisMatchSession { core: self, phase },
            Outgoing {
                to: out.to,
                payload,
            },
        ))
    }

    fn after_compare(
        self,
        step: Step<Session<LiftCompareProgram>, BitSliced>,
    ) -> Result<Step<IrisMatchSession, Vec<MatchOutput>>, MatchError> {
        match step {
            Step::Send(s, out) => self.emit(Phase::Compare(Box::new(s)), out),
            Step::Done(bits) => self.enter_or(bits),
        }
    }

    fn enter_or(
        self,
        bits: BitSliced,
    ) -> Result<Step<IrisMatchSession, Vec<MatchOutput>>, MatchError> {
        let (n, b, r) = (self.num_entries, self.num_probes, self.num_rotations);
        match self.mode {
            SearchMode::Identify => {
                let planes = rotation_planes(&bits, n, b, r)?;
                let program = PlaneOrProgram::new(planes, b * n, self.party);
                match Session::start(&self.ctx, LABEL_OR, program)? {
                    Step::Send(s, out) => self.emit(Phase::OrPlanes(s), out),
                    Step::Done(bits) => self.enter_open(bits),
                }
            }
            SearchMode::Uniqueness => {
                let groups = probe_groups(&bits, n, b, r, self.batch_rows)?;
                let program = OrTreeProgram::new(groups, self.party);
                match Session::start(&self.ctx, LABEL_OR, program)? {
                    Step::Send(s, out) => self.emit(Phase::Or(s), out),
                    Step::Done(bits) => self.enter_open(bits),
                }
            }
        }
    }

    /// Each probe's output from the opened bits: B·N entry bits (Identify, probe b's at
    /// b·N..(b+1)·N), B OR bits (Uniqueness), or in an enrolment batch 2·B OR bits (probe
    /// b's: the enrolled entries' at 2b, the earlier requests' at 2b + 1).
    fn outputs(&self, opened: &[bool]) -> Vec<MatchOutput> {
        let n = self.num_entries;
        if self.batch_rows > 0 {
            let bit = |k: usize| opened.get(k).copied().unwrap_or(false);
            return (0..self.num_probes)
                .map(|q| match (bit(2 * q), bit(2 * q + 1)) {
                    (true, _) => MatchOutput::Unique(false),
                    (false, true) => MatchOutput::MatchesEarlierRequest,
                    (false, false) => MatchOutput::Unique(true),
                })
                .collect();
        }
        (0..self.num_probes)
            .map(|q| match self.mode {
                SearchMode::Identify => MatchOutput::Identify(
                    opened
                        .iter()
                        .skip(q * n)
                        .take(n)
                        .enumerate()
                        .filter(|(_, &m)| m)
                        .map(|(e, _)| e)
                        .collect(),
                ),
                SearchMode::Uniqueness => {
                    MatchOutput::Unique(!opened.get(q).copied().unwrap_or(false))
                }
            })
            .collect()
    }

    /// Sends this party's missing-component message to party i+1 if it is entitled, an empty
    /// body otherwise.
    fn enter_open(
        self,
        bits: BitSliced,
    ) -> Result<Step<IrisMatchSession, Vec<MatchOutput>>, MatchError> {
        let out = open_message(self.party, &bits, &self.entitled).unwrap_or(Outgoing {
            to: self.party.next(),
            payload: Vec::new(),
        });
        self.emit(Phase::Open(bits), out)
    }
}

/// Transposes entry-major bits (bit k = e·B·R + b·R + r for entry e, probe b, rotation r)
/// into R rotation planes of B·N bits (plane r, bit b·N + e); local, both components.
fn rotation_planes(
    bits: &BitSliced,
    n: usize,
    b: usize,
    r: usize,
) -> Result<Vec<BitSliced>, MpcError> {
    if Some(bits.len()) != n.checked_mul(b).and_then(|nb| nb.checked_mul(r)) {
        return Err(MpcError::InvalidInput(
            "match bits do not hold entries × probes × rotations",
        ));
    }
    let w = words_for(b * n);
    let mut pa = vec![vec![0u64; w]; r];
    let mut pb = vec![vec![0u64; w]; r];
    let bit = |words: &[u64], k: usize| (words[k / WORD_BITS] >> (k % WORD_BITS)) & 1;
    for e in 0..n {
        for q in 0..b {
            let target = q * n + e;
            let (word, shift) = (target / WORD_BITS, target % WORD_BITS);
            for j in 0..r {
                let k = (e * b + q) * r + j;
                pa[j][word] |= bit(bits.a(), k) << shift;
                pb[j][word] |= bit(bits.b(), k) << shift;
            }
        }
    }
    pa.into_iter()
        .zip(pb)
        .map(|(a, b_words)| BitSliced::from_words(b * n, a, b_words))
        .collect()
}

/// Gathers entry-major bits (bit k = e·B·R + b·R + r) into B groups, one per probe, each of
/// its N·R bits (order within a group does not matter to an OR); local. A batch of one is
/// the input itself. With `batch_rows` > 0 the last `batch_rows` entries are the batch's own
/// enrolment requests (module docs, "In-batch uniqueness"): probe q gets two groups, its bits
/// of the enrolled entries (below N − batch_rows) and of the requests before it (entries
/// N − batch_rows .. N − batch_rows + q), so its output says which of the two it matched.
/// The sum of the groups' lengths is what one group over both would have: the same AND gates.
fn probe_groups(
    bits: &BitSliced,
    n: usize,
    b: usize,
    r: usize,
    batch_rows: usize,
) -> Result<Vec<BitSliced>, MpcError> {
    let per_probe = n.checked_mul(r);
    if per_probe.and_then(|pp| pp.checked_mul(b)) != Some(bits.len()) {
        return Err(MpcError::InvalidInput(
            "match bits do not hold entries × probes × rotations",
        ));
    }
    if batch_rows > n || (batch_rows > 0 && batch_rows != b) {
        return Err(MpcError::InvalidInput(
            "the batch's own requests are not one entry per probe",
        ));
    }
    if b == 1 && batch_rows == 0 {
        return Ok(vec![bits.clone()]);
    }
    if batch_rows == 0 {
        return (0..b).map(|q| probe_group(bits, b, r, q, 0..n)).collect();
    }
    let enrolled = n - batch_rows;
    (0..b)
        .flat_map(|q| {
            [
                probe_group(bits, b, r, q, 0..enrolled),
                probe_group(bits, b, r, q, enrolled..enrolled + q),
            ]
        })
        .collect()
}

/// Probe q's bits of the entries `entries` (each entry's R rotations), as one group.
fn probe_group(
    bits: &BitSliced,
    b: usize,
    r: usize,
    q: usize,
    entries: std::ops::Range<usize>,
) -> Result<BitSliced, MpcError> {
    let len = entries.len() * r;
    let w = words_for(len);
    let bit = |words: &[u64], k: usize| (words[k / WORD_BITS] >> (k % WORD_BITS)) & 1;
    let mut ga = vec![0u64; w];
    let mut gb = vec![0u64; w];
    for (t0, e) in entries.enumerate() {
        for j in 0..r {
            let k = (e * b + q) * r + j;
            let t = t0 * r + j;
            ga[t / WORD_BITS] |= bit(bits.a(), k) << (t % WORD_BITS);
            gb[t / WORD_BITS] |= bit(bits.b(), k) << (t % WORD_BITS);
        }
    }
    BitSliced::from_words(len, ga, gb)
}

/// OR of R equal-length bit planes ([TACEO24] §2.3 OR tree, plane-wise): a ∨ b = ¬(¬a ∧ ¬b),
/// each level ANDs the lower half of the planes with the upper half (an odd last plane waits),
/// all in one round: ⌈log2 R⌉ rounds of dense N-bit words. Output: the OR plane (bit e = entry
/// e matched at some rotation).
#[derive(Debug)]
pub struct PlaneOrProgram {
    planes: Vec<BitSliced>,
    odd: Option<BitSliced>,
    len: usize,
}

impl PlaneOrProgram {
    /// The OR of this party's shares of `planes`, each of `len` bits.
    pub fn new(planes: Vec<BitSliced>, len: usize, party: PartyIndex) -> Self {
        Self {
            planes: planes.iter().map(|p| p.not(party)).collect(),
            odd: None,
            len,
        }
    }
}

impl Program for PlaneOrProgram {
    type Output = BitSliced;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<BitSliced>, MpcError> {
        match products {
            Products::Start => {}
            Products::And(out) => {
                self.planes = out;
                self.planes.extend(self.odd.take());
            }
            Products::Mul(_) => return Err(MpcError::OutOfStep("plane or-tree")),
        }
        if self.planes.len() <= 1 {
            // No plane: the empty OR is 0 (¬ of the empty AND, all ones).
            let and = match self.planes.pop() {
                Some(p) => p,
                None => BitSliced::zeros(self.len).not(party),
            };
            return Ok(ProgramStep::Done(and.not(party)));
        }
        if self.planes.len() % 2 == 1 {
            self.odd = self.planes.pop();
        }
        let h = self.planes.len() / 2;
        let upper = self.planes.split_off(h);
        let pairs = std::mem::take(&mut self.planes)
            .into_iter()
            .zip(upper)
            .collect();
        Ok(ProgramStep::Gates(Gates::And(pairs)))
    }
}

impl IrisMatchSession {
    /// Starts a search at the party of `keys`: prepares `probe`, scans `db` with
    /// [`DotKernel::detect`] and returns the first (reshare) message. Fails if the probe
    /// belongs to another party, on a malformed probe or an invalid configuration.
    pub fn start(
        keys: &MpcContext,
        config: &MatchConfig,
        db: &ShareMatrix<'_>,
        probe: &IrisShare,
    ) -> Result<Step<Self, Vec<MatchOutput>>, MatchError> {
        Self::start_batch(keys, config, db, std::slice::from_ref(probe))
    }

    /// Starts a batch of searches (module docs, "Batches"): prepares every probe, scans `db`
    /// once with the probes' rotations as one block ([`PreparedQuery::batch`]) and returns the
    /// first message. The output has one [`MatchOutput`] per probe, in batch order.
    pub fn start_batch(
        keys: &MpcContext,
        config: &MatchConfig,
        db: &ShareMatrix<'_>,
        probes: &[IrisShare],
    ) -> Result<Step<Self, Vec<MatchOutput>>, MatchError> {
        if probes.iter().any(|p| p.party != keys.party()) {
            return Err(MatchError::InvalidInput(
                "the probe share belongs to another party",
            ));
        }
        let query = PreparedQuery::batch(probes, config.max_rotation)?;
        let dots = scan(DotKernel::detect(), db, &query)?;
        Self::start_batch_with_dots(keys, config, dots, probes.len())
    }

    /// As [`IrisMatchSession::start`] from dot products computed by the caller (e.g. with
    /// [`crate::iris::dot::scan_range`] on a thread pool, with the query prepared for
    /// `config.max_rotation`): `dots` must hold all R rotations of every entry, entry-major.
    pub fn start_with_dots(
        keys: &MpcContext,
        config: &MatchConfig,
        dots: DotShares,
    ) -> Result<Step<Self, Vec<MatchOutput>>, MatchError> {
        Self::start_batch_with_dots(keys, config, dots, 1)
    }

    /// As [`IrisMatchSession::start_batch`] from dot products computed by the caller with a
    /// [`PreparedQuery::batch`] of `num_probes` probes: `dots` must hold B·R values per entry,
    /// entry-major, probe-major within an entry (value e·B·R + b·R + r).
    pub fn start_batch_with_dots(
        keys: &MpcContext,
        config: &MatchConfig,
        dots: DotShares,
        num_probes: usize,
    ) -> Result<Step<Self, Vec<MatchOutput>>, MatchError> {
        Self::start_rows(keys, config, dots, num_probes, 0)
    }

    /// As [`IrisMatchSession::start_batch_with_dots`] for a batch of enrol-if-unique requests
    /// (module docs, "In-batch uniqueness"; uniqueness mode only): the last `num_probes`
    /// entries of `dots` are the requests' own enrolment shares in batch order, and probe b is
    /// compared with the enrolled entries and with requests 0..b only, so of two requests of
    /// one person in a batch at most the earlier can be unique.
    pub fn start_enrolment_batch_with_dots(
        keys: &MpcContext,
        config: &MatchConfig,
        dots: DotShares,
        num_probes: usize,
    ) -> Result<Step<Self, Vec<MatchOutput>>, MatchError> {
        if config.mode != SearchMode::Uniqueness || dots.num_entries < num_probes {
            return Err(MatchError::InvalidInput(
                "an enrolment batch is a uniqueness search over its own requests too",
            ));
        }
        Self::start_rows(keys, config, dots, num_probes, num_probes)
    }

    fn start_rows(
        keys: &MpcContext,
        config: &MatchConfig,
        dots: DotShares,
        num_probes: usize,
        batch_rows: usize,
    ) -> Result<Step<Self, Vec<MatchOutput>>, MatchError> {
        let r = config.num_rotations();
        if r == 0 || num_probes == 0 || Some(dots.num_rotations) != num_probes.checked_mul(r) {
            return Err(MatchError::InvalidInput(
                "dot products do not hold probes × (2·max_rotation + 1) rotations",
            ));
        }
        let total = dots.num_entries.checked_mul(dots.num_rotations);
        if total != Some(dots.code.len()) || total != Some(dots.mask.len()) {
            return Err(MatchError::InvalidInput(
                "dot products do not hold entries × probes × rotations values",
            ));
        }
        let party = keys.party();
        let wrap = |v: Vec<u16>| -> Vec<Z16> { v.into_iter().map(std::num::Wrapping).collect() };
        let (code, out_code) = ReshareState::start(
            party,
            wrap(dots.code),
            keys.with_next(),
            keys.with_prev(),
            &reshare_context(keys.session(), 0, "iris code"),
        );
        let (mask, out_mask) = ReshareState::start(
            party,
            wrap(dots.mask),
            keys.with_next(),
            keys.with_prev(),
            &reshare_context(keys.session(), 0, "iris mask"),
        );
        let core = Core {
            party,
            ctx: keys.clone(),
            mode: config.mode,
            threshold: config.threshold,
            entitled: config.entitled.clone(),
            num_entries: dots.num_entries,
            num_rotations: r,
            num_probes,
            batch_rows,
            sent: 0,
            bytes_sent: 0,
        };
        let mut payload = out_code.payload;
        payload.extend_from_slice(&out_mask.payload);
        core.emit(
            Phase::Reshare { code, mask },
            Outgoing {
                to: out_code.to,
                payload,
            },
        )
    }

    /// Probes in this session's batch.
    pub fn num_probes(&self) -> usize {
        self.core.num_probes
    }

    /// The party of this session.
    pub fn party(&self) -> PartyIndex {
        self.core.party
    }

    /// The round whose message this state waits for (0-based).
    pub fn round(&self) -> u32 {
        self.core.sent.saturating_sub(1)
    }

    /// Messages sent so far (= rounds started).
    pub fn rounds_sent(&self) -> u32 {
        self.core.sent
    }

    /// Payload bytes sent so far (headers included).
    pub fn bytes_sent(&self) -> usize {
        self.core.bytes_sent
    }

    /// Feeds the message of the current round received from `from`; returns the next message
    /// or this party's output. Fails on a message from another party than i−1, of another
    /// round (replay) or of the wrong length; the session is consumed either way (abort).
    pub fn receive(
        self,
        from: PartyIndex,
        payload: &[u8],
    ) -> Result<Step<Self, Vec<MatchOutput>>, MatchError> {
        let Self { core, phase } = self;
        let me = core.party;
        if from != me.prev() {
            return Err(MatchError::WrongSender {
                me,
                expected: me.prev(),
                got: from,
            });
        }
        let round = core.sent.saturating_sub(1);
        let Some((header, body)) = payload.split_first_chunk::<HEADER_BYTES>() else {
            return Err(MatchError::WrongLength {
                me,
                round,
                expected: HEADER_BYTES,
                got: payload.len(),
            });
        };
        let got = u32::from_le_bytes(*header);
        if got != round {
            return Err(MatchError::WrongRound {
                me,
                expected: round,
                got,
            });
        }
        match phase {
            Phase::Reshare { code, mask } => {
                let n = code.expected_payload_len();
                let expected = n + mask.expected_payload_len();
                if body.len() != expected {
                    return Err(MatchError::WrongLength {
                        me,
                        round,
                        expected: HEADER_BYTES + expected,
                        got: payload.len(),
                    });
                }
                let code = code.receive(from, &body[..n])?;
                let mask = mask.receive(from, &body[n..])?;
                let program = LiftCompareProgram::new(&core.threshold, &code, &mask, me)?;
                let step = Session::start(&core.ctx, LABEL_COMPARE, program)?;
                core.after_compare(step)
            }
            Phase::Compare(s) => {
                let step = (*s).receive(from, body)?;
                core.after_compare(step)
            }
            Phase::OrPlanes(s) => match s.receive(from, body)? {
                Step::Send(s, out) => core.emit(Phase::OrPlanes(s), out),
                Step::Done(bits) => core.enter_open(bits),
            },
            Phase::Or(s) => match s.receive(from, body)? {
                Step::Send(s, out) => core.emit(Phase::Or(s), out),
                Step::Done(bits) => core.enter_open(bits),
            },
            Phase::Open(bits) => {
                if !core.entitled.contains(&me) {
                    if !body.is_empty() {
                        return Err(MatchError::WrongLength {
                            me,
                            round,
                            expected: HEADER_BYTES,
                            got: payload.len(),
                        });
                    }
                    return Ok(Step::Done(vec![MatchOutput::Withheld; core.num_probes]));
                }
                let words = open_receive(me, &bits, from, body)?;
                let opened = unpack_bits(&words, bits.len());
                Ok(Step::Done(core.outputs(&opened)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::seal::PairwisePrf;
    use crate::iris::encoding::share_template;
    use crate::iris::query::share_query_template;
    use crate::iris::synth::{near_duplicate, random_template};
    use crate::iris::template::{
        masked_code_distance_counts, min_fhd_over_rotations, IrisTemplate, IRIS_CODE_BITS,
    };
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;
    /// The deployed τ = 0.345 = 69/200, compared exactly (compare.rs module docs).
    const TAU: f64 = 0.345;

    fn keys(seed: u8, session: [u8; 16]) -> [MpcContext; 3] {
        let prf = |i: u8| PairwisePrf::from_seed([seed.wrapping_mul(3).wrapping_add(i); 32]);
        let prfs = [prf(0), prf(1), prf(2)];
        P.map(|p| {
            MpcContext::new(
                p,
                session,
                prfs[p.as_usize()].clone(),
                prfs[p.prev().as_usize()].clone(),
            )
        })
    }

    /// Each party's owned enrolled share matrix (codes, masks).
    type Db = [(Vec<u16>, Vec<u16>); 3];

    fn share_db(templates: &[IrisTemplate], rng: &mut ChaCha20Rng) -> Db {
        let mut db: Db = Default::default();
        for t in templates {
            let shares = share_template(t, rng).expect("share");
            for (m, s) in db.iter_mut().zip(&shares) {
                m.0.extend_from_slice(&s.code);
                m.1.extend_from_slice(&s.mask);
            }
        }
        db
    }

    /// Every round's three messages (indexed by sender).
    type Trace = Vec<[Outgoing; 3]>;

    /// Routes messages between three started sessions until all finish.
    /// Drives a single search: [`drive_batch`] with its one output per party.
    fn drive(
        steps: [Step<IrisMatchSession, Vec<MatchOutput>>; 3],
    ) -> Result<([MatchOutput; 3], Trace), MatchError> {
        let (outs, trace) = drive_batch(steps)?;
        Ok((
            outs.map(|mut v| {
                assert_eq!(v.len(), 1, "one output per probe");
                v.swap_remove(0)
            }),
            trace,
        ))
    }

    fn drive_batch(
        mut steps: [Step<IrisMatchSession, Vec<MatchOutput>>; 3],
    ) -> Result<([Vec<MatchOutput>; 3], Trace), MatchError> {
        let mut trace = Vec::new();
        loop {
            match steps {
                [Step::Done(a), Step::Done(b), Step::Done(c)] => return Ok(([a, b, c], trace)),
                [Step::Send(s0, m0), Step::Send(s1, m1), Step::Send(s2, m2)] => {
                    let msgs = [m0, m1, m2];
                    for (p, m) in P.iter().zip(&msgs) {
                        assert_eq!(m.to, p.next(), "every message goes to the next party");
                    }
                    let recv = |s: IrisMatchSession| {
                        let from = s.party().prev();
                        s.receive(from, &msgs[from.as_usize()].payload)
                    };
                    steps = [recv(s0)?, recv(s1)?, recv(s2)?];
                    trace.push(msgs);
                }
                _ => panic!("parties finished in different rounds"),
            }
        }
    }

    fn start_all(
        db: &Db,
        probe: &IrisTemplate,
        config: &MatchConfig,
        key_seed: u8,
        rng: &mut ChaCha20Rng,
    ) -> [Step<IrisMatchSession, Vec<MatchOutput>>; 3] {
        let q = share_query_template(probe, rng).expect("share probe");
        let ks = keys(key_seed, [key_seed; 16]);
        P.map(|p| {
            let i = p.as_usize();
            let m = ShareMatrix::new(&db[i].0, &db[i].1).expect("matrix");
            IrisMatchSession::start(&ks[i], config, &m, &q[i]).expect("start")
        })
    }

    fn run(
        db: &Db,
        probe: &IrisTemplate,
        config: &MatchConfig,
        key_seed: u8,
        rng: &mut ChaCha20Rng,
    ) -> ([MatchOutput; 3], Trace) {
        drive(start_all(db, probe, config, key_seed, rng)).expect("run")
    }

    /// Plaintext reference with exact integers: some rotation has hd/common < 69/200, i.e.
    /// 200·hd < 69·common; checked against min_fhd_over_rotations(…) < 0.345 (the f64
    /// quotient hd/common equals the f64 0.345 exactly when hd/common = 69/200, and is
    /// otherwise more than 1/(200·12,800) away from it, so the two agree).
    fn plain_match(probe: &IrisTemplate, t: &IrisTemplate, max_rotation: i32) -> bool {
        let by_counts = (-max_rotation..=max_rotation).any(|k| {
            let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
            common > 0 && 200 * u64::from(hd) < 69 * u64::from(common)
        });
        let by_fhd = min_fhd_over_rotations(probe, t, max_rotation).is_some_and(|d| d < TAU);
        assert_eq!(by_counts, by_fhd, "integer and f64 references agree");
        by_counts
    }

    fn config(mode: SearchMode, max_rotation: i32) -> MatchConfig {
        MatchConfig {
            max_rotation,
            threshold: Threshold::from_ratio(TAU).expect("tau"),
            ..MatchConfig::new(mode)
        }
    }

    fn identify(outputs: &[MatchOutput; 3]) -> Vec<usize> {
        assert_eq!(outputs[0], outputs[1]);
        assert_eq!(outputs[1], outputs[2]);
        match &outputs[0] {
            MatchOutput::Identify(v) => v.clone(),
            other => panic!("unexpected output {other:?}"),
        }
    }

    /// A mixed database: near-duplicates of the probe at rotations within ±15 and flip rates
    /// 0.05–0.3, near-duplicates of other templates, unrelated templates.
    fn mixed_db(probe: &IrisTemplate, n: usize, rng: &mut ChaCha20Rng) -> Vec<IrisTemplate> {
        (0..n)
            .map(|e| match e % 4 {
                0 => {
                    let rate = rng.gen_range(0.05..0.3);
                    let rot = rng.gen_range(-15..=15);
                    near_duplicate(probe, rate, rot, rng)
                }
                1 => {
                    let other = random_template(rng);
                    near_duplicate(&other, 0.1, rng.gen_range(-15..=15), rng)
                }
                _ => random_template(rng),
            })
            .collect()
    }

    #[test]
    fn identification_matches_plaintext_reference() {
        let mut rng = ChaCha20Rng::seed_from_u64(301);
        let probe = random_template(&mut rng);
        let templates = mixed_db(&probe, 240, &mut rng);
        let db = share_db(&templates, &mut rng);
        for max_rotation in [15, 0] {
            let cfg = config(SearchMode::Identify, max_rotation);
            let (out, trace) = run(&db, &probe, &cfg, 11, &mut rng);
            let got = identify(&out);
            let want: Vec<usize> = templates
                .iter()
                .enumerate()
                .filter(|(_, t)| plain_match(&probe, t, max_rotation))
                .map(|(e, _)| e)
                .collect();
            assert_eq!(got, want, "max_rotation {max_rotation}");
            assert_eq!(
                trace.len() as u32,
                expected_rounds(
                    SearchMode::Identify,
                    templates.len(),
                    max_rotation,
                    &IrisPolicy::default_policy().threshold()
                )
            );
            // The data set exercises both outcomes.
            assert!(!want.is_empty() && want.len() < templates.len());
        }
        assert_eq!(
            expected_rounds(
                SearchMode::Identify,
                240,
                15,
                &IrisPolicy::default_policy().threshold()
            ),
            21
        );
        assert_eq!(
            expected_rounds(
                SearchMode::Identify,
                240,
                0,
                &IrisPolicy::default_policy().threshold()
            ),
            16
        );
    }

    /// Runs one batch of `probes` over `templates` at the three parties; returns each party's
    /// outputs (one per probe) and the number of rounds.
    fn run_batch(
        templates: &[IrisTemplate],
        probes: &[IrisTemplate],
        config: &MatchConfig,
        rng: &mut ChaCha20Rng,
    ) -> ([Vec<MatchOutput>; 3], usize) {
        let db = share_db(templates, rng);
        let shares: Vec<[IrisShare; 3]> = probes
            .iter()
            .map(|p| share_query_template(p, rng).expect("share probe"))
            .collect();
        let ks = keys(9, [9; 16]);
        let starts = P.map(|p| {
            let i = p.as_usize();
            let m = ShareMatrix::new(&db[i].0, &db[i].1).expect("matrix");
            let mine: Vec<IrisShare> = shares.iter().map(|s| s[i].clone()).collect();
            IrisMatchSession::start_batch(&ks[i], config, &m, &mine).expect("start")
        });
        let (outs, trace) = drive_batch(starts).expect("run");
        (outs, trace.len())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]

        /// A batch gives every probe what the plaintext matcher gives it, in its own place,
        /// in as many rounds as a single search; probes are near-duplicates with flip rates
        /// around τ, so some land just below and some just above it.
        #[test]
        fn batches_match_the_plaintext_reference(
            seed in any::<u64>(),
            batch in 1usize..=5,
            entries in 1usize..=9,
            max_rotation in 0i32..=2,
            uniqueness in any::<bool>(),
        ) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let templates: Vec<IrisTemplate> =
                (0..entries).map(|_| random_template(&mut rng)).collect();
            let probes: Vec<IrisTemplate> = (0..batch)
                .map(|_| {
                    let t = &templates[rng.gen_range(0..entries)];
                    let rate = rng.gen_range(0.30..0.39);
                    near_duplicate(t, rate, rng.gen_range(-max_rotation..=max_rotation), &mut rng)
                })
                .collect();
            let mode = if uniqueness { SearchMode::Uniqueness } else { SearchMode::Identify };
            let cfg = config(mode, max_rotation);
            let (outs, rounds) = run_batch(&templates, &probes, &cfg, &mut rng);
            prop_assert_eq!(
                rounds as u32,
                expected_rounds(mode, entries, max_rotation, &cfg.threshold)
            );
            for out in &outs {
                prop_assert_eq!(out, &outs[0]);
                prop_assert_eq!(out.len(), batch);
            }
            for (probe, got) in probes.iter().zip(&outs[0]) {
                let want: Vec<usize> = templates
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| plain_match(probe, t, max_rotation))
                    .map(|(e, _)| e)
                    .collect();
                let expected = match mode {
                    SearchMode::Identify => MatchOutput::Identify(want),
                    SearchMode::Uniqueness => MatchOutput::Unique(want.is_empty()),
                };
                prop_assert_eq!(got, &expected);
            }
        }
    }

    /// Runs one enrolment batch (module docs, "In-batch uniqueness") of `requests` over
    /// `templates`: each request is both a probe and, as entry N + k, a row.
    fn run_enrolment_batch(
        templates: &[IrisTemplate],
        requests: &[IrisTemplate],
        config: &MatchConfig,
        rng: &mut ChaCha20Rng,
    ) -> ([Vec<MatchOutput>; 3], usize) {
        let rows: Vec<IrisTemplate> = templates.iter().chain(requests).copied().collect();
        let db = share_db(&rows, rng);
        let shares: Vec<[IrisShare; 3]> = requests
            .iter()
            .map(|p| share_query_template(p, rng).expect("share probe"))
            .collect();
        let ks = keys(9, [9; 16]);
        let starts = P.map(|p| {
            let i = p.as_usize();
            let m = ShareMatrix::new(&db[i].0, &db[i].1).expect("matrix");
            let mine: Vec<IrisShare> = shares.iter().map(|s| s[i].clone()).collect();
            let query = PreparedQuery::batch(&mine, config.max_rotation).expect("query");
            let dots = scan(DotKernel::detect(), &m, &query).expect("scan");
            IrisMatchSession::start_enrolment_batch_with_dots(&ks[i], config, dots, mine.len())
                .expect("start")
        });
        let (outs, trace) = drive_batch(starts).expect("run");
        (outs, trace.len())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10))]

        /// An enrolment batch answers request b "unique" exactly when the plaintext matcher
        /// finds no enrolled template and no earlier request of the batch within τ; requests
        /// are near-duplicates (flip rates around τ) of enrolled templates or of earlier
        /// requests, so all outcomes occur.
        #[test]
        fn enrolment_batches_match_the_plaintext_reference(
            seed in any::<u64>(),
            batch in 1usize..=5,
            entries in 0usize..=6,
            max_rotation in 0i32..=2,
        ) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let templates: Vec<IrisTemplate> =
                (0..entries).map(|_| random_template(&mut rng)).collect();
            let mut requests: Vec<IrisTemplate> = Vec::new();
            for _ in 0..batch {
                let pool = templates.len() + requests.len();
                let request = if pool == 0 || rng.gen_bool(0.25) {
                    random_template(&mut rng)
                } else {
                    let k = rng.gen_range(0..pool);
                    let base = templates.get(k).unwrap_or_else(|| &requests[k - templates.len()]);
                    let rate = rng.gen_range(0.30..0.39);
                    near_duplicate(base, rate, rng.gen_range(-max_rotation..=max_rotation), &mut rng)
                };
                requests.push(request);
            }
            let cfg = config(SearchMode::Uniqueness, max_rotation);
            let (outs, rounds) = run_enrolment_batch(&templates, &requests, &cfg, &mut rng);
            prop_assert_eq!(
                rounds as u32,
                expected_rounds(SearchMode::Uniqueness, entries.max(batch - 1), max_rotation, &cfg.threshold)
            );
            for out in &outs {
                prop_assert_eq!(out, &outs[0]);
            }
            for (b, got) in outs[0].iter().enumerate() {
                let in_set = templates.iter().any(|t| plain_match(&requests[b], t, max_rotation));
                let earlier = requests[..b].iter().any(|t| plain_match(&requests[b], t, max_rotation));
                let want = match (in_set, earlier) {
                    (true, _) => MatchOutput::Unique(false),
                    (false, true) => MatchOutput::MatchesEarlierRequest,
                    (false, false) => MatchOutput::Unique(true),
                };
                prop_assert_eq!(got, &want, "request {}", b);
            }
        }
    }

    #[test]
    fn a_probes_answer_does_not_depend_on_the_rest_of_its_batch() {
        let mut rng = ChaCha20Rng::seed_from_u64(305);
        let templates: Vec<IrisTemplate> = (0..6).map(|_| random_template(&mut rng)).collect();
        let probe = near_duplicate(&templates[2], 0.2, 1, &mut rng);
        let cfg = config(SearchMode::Identify, 1);
        let alone = run_batch(&templates, std::slice::from_ref(&probe), &cfg, &mut rng).0;
        assert_eq!(alone[0], vec![MatchOutput::Identify(vec![2])]);
        for others in [
            vec![templates[0]],
            vec![
                near_duplicate(&templates[4], 0.1, 0, &mut rng),
                templates[2],
            ],
        ] {
            let mut batch = others.clone();
            batch.insert(1.min(others.len()), probe);
            let outs = run_batch(&templates, &batch, &cfg, &mut rng).0;
            assert_eq!(outs[0][1.min(others.len())], alone[0][0]);
        }
    }

    /// A copy of `probe` with the same mask and exactly `h` code bits flipped inside the
    /// mask, then rotated by `rotation`.
    fn flipped(
        probe: &IrisTemplate,
        h: usize,
        rotation: i32,
        rng: &mut ChaCha20Rng,
    ) -> IrisTemplate {
        let mut t = *probe;
        let mut inside: Vec<usize> = (0..IRIS_CODE_BITS).filter(|&i| t.mask.get(i)).collect();
        for k in 0..h {
            let j = rng.gen_range(k..inside.len());
            inside.swap(k, j);
            let i = inside[k];
            let bit = t.code.get(i);
            t.code.set(i, !bit);
        }
        t.rotate(rotation)
    }

    #[test]
    fn cases_near_the_threshold_match_plaintext() {
        let mut rng = ChaCha20Rng::seed_from_u64(302);
        let mut probe = random_template(&mut rng);
        // Mask out duplicated (real, imaginary) pairs until common is a multiple of 200, so
        // that h* below is fhd = 0.345 exactly (69·common/200), which must not match.
        let mut pair = 0;
        while probe.mask.popcount() % 200 != 0 {
            if probe.mask.get(2 * pair) {
                probe.mask.set(2 * pair, false);
                probe.mask.set(2 * pair + 1, false);
            }
            pair += 1;
        }
        let common = probe.mask.popcount() as i64;
        assert_eq!(common % 200, 0);
        // Smallest h with 200·h ≥ 69·common: h* − 1 matches, h* (fhd = τ exactly) does not.
        let h_star = (69 * common + 199) / 200;
        assert_eq!(200 * h_star, 69 * common);
        let band = (common as f64 * 0.005) as i64;
        let mut templates = Vec::new();
        let mut fhds = Vec::new();
        for d in [
            -band,
            -band / 2,
            -7,
            -3,
            -2,
            -1,
            0,
            1,
            2,
            3,
            7,
            band / 2,
            band,
        ] {
            for rotation in [0, 9, -15] {
                let h = (h_star + d) as usize;
                let t = flipped(&probe, h, rotation, &mut rng);
                fhds.push(min_fhd_over_rotations(&probe, &t, 15).expect("overlap"));
                templates.push(t);
            }
        }
        assert!(fhds.iter().all(|d| (d - TAU).abs() <= 0.0051), "{fhds:?}");
        // d = 0 (templates 18..21): fhd is τ exactly.
        assert!(
            fhds[18..21].iter().all(|d| (d - TAU).abs() < 1e-15),
            "{fhds:?}"
        );
        let db = share_db(&templates, &mut rng);
        let cfg = config(SearchMode::Identify, 15);
        let (out, _) = run(&db, &probe, &cfg, 12, &mut rng);
        let got = identify(&out);
        let want: Vec<usize> = templates
            .iter()
            .enumerate()
            .filter(|(_, t)| plain_match(&probe, t, 15))
            .map(|(e, _)| e)
            .collect();
        assert_eq!(got, want);
        // Exactly the templates with d < 0 match (fhd = (h* + d)/common); d = 0 is fhd = τ.
        assert_eq!(want.len(), 6 * 3);
        assert_eq!(want, (0..6 * 3).collect::<Vec<_>>());
        assert_eq!(cfg.threshold, IrisPolicy::default_policy().threshold());
    }

    #[test]
    fn uniqueness_is_the_or_of_all_matches() {
        let mut rng = ChaCha20Rng::seed_from_u64(303);
        let probe = random_template(&mut rng);
        let mut templates: Vec<IrisTemplate> = (0..50).map(|_| random_template(&mut rng)).collect();
        let cfg = config(SearchMode::Uniqueness, 15);
        let db = share_db(&templates, &mut rng);
        let (out, trace) = run(&db, &probe, &cfg, 13, &mut rng);
        assert!(templates.iter().all(|t| !plain_match(&probe, t, 15)));
        assert_eq!(out, [0; 3].map(|_| MatchOutput::Unique(true)));
        assert_eq!(
            trace.len() as u32,
            expected_rounds(
                SearchMode::Uniqueness,
                50,
                15,
                &IrisPolicy::default_policy().threshold()
            )
        );
        assert_eq!(trace.len(), 1 + 14 + 11 + 1);
        // One near-duplicate at rotation 7, flip rate 0.25.
        templates[37] = near_duplicate(&probe, 0.25, 7, &mut rng);
        assert!(plain_match(&probe, &templates[37], 15));
        let db = share_db(&templates, &mut rng);
        let (out, _) = run(&db, &probe, &cfg, 13, &mut rng);
        assert_eq!(out, [0; 3].map(|_| MatchOutput::Unique(false)));
    }

    #[test]
    fn only_entitled_parties_learn_the_output() {
        let mut rng = ChaCha20Rng::seed_from_u64(304);
        let probe = random_template(&mut rng);
        let templates = mixed_db(&probe, 12, &mut rng);
        let db = share_db(&templates, &mut rng);
        let cfg = MatchConfig {
            entitled: vec![P[0]],
            ..config(SearchMode::Identify, 15)
        };
        let (out, trace) = run(&db, &probe, &cfg, 14, &mut rng);
        let want: Vec<usize> = (0..12)
            .filter(|&e| plain_match(&probe, &templates[e], 15))
            .collect();
        assert_eq!(out[0], MatchOutput::Identify(want));
        assert_eq!(out[1], MatchOutput::Withheld);
        assert_eq!(out[2], MatchOutput::Withheld);
        let last = trace.last().expect("rounds");
        // P2 → P0 carries the missing component; P0 → P1 and P1 → P2 are empty.
        assert_eq!(last[0].payload.len(), HEADER_BYTES);
        assert_eq!(last[1].payload.len(), HEADER_BYTES);
        assert!(last[2].payload.len() > HEADER_BYTES);
    }

    /// (round, sender, length) of every message.
    fn schedule(trace: &Trace) -> Vec<(usize, usize, usize)> {
        trace
            .iter()
            .enumerate()
            .flat_map(|(r, msgs)| {
                msgs.iter()
                    .enumerate()
                    .map(move |(i, m)| (r, i, m.payload.len()))
            })
            .collect()
    }

    #[test]
    fn messages_are_independent_of_the_secret_inputs() {
        messages_are_independent_of_the_secret_inputs_in(SearchMode::Identify);
        messages_are_independent_of_the_secret_inputs_in(SearchMode::Uniqueness);
    }

    fn messages_are_independent_of_the_secret_inputs_in(mode: SearchMode) {
        let n = 64;
        let cfg = config(mode, 15);
        // Run A: a database with many matches; run B: a different probe, no match at all.
        let mut rng = ChaCha20Rng::seed_from_u64(305);
        let probe_a = random_template(&mut rng);
        let templates_a = mixed_db(&probe_a, n, &mut rng);
        let db_a = share_db(&templates_a, &mut rng);
        let (out_a, trace_a) = run(&db_a, &probe_a, &cfg, 15, &mut rng);
        let probe_b = random_template(&mut rng);
        let templates_b: Vec<IrisTemplate> = (0..n).map(|_| random_template(&mut rng)).collect();
        let db_b = share_db(&templates_b, &mut rng);
        let (out_b, trace_b) = run(&db_b, &probe_b, &cfg, 15, &mut rng);
        match mode {
            SearchMode::Identify => {
                assert!(!identify(&out_a).is_empty());
                assert!(identify(&out_b).is_empty());
            }
            SearchMode::Uniqueness => {
                assert_eq!(out_a[0], MatchOutput::Unique(false));
                assert_eq!(out_b[0], MatchOutput::Unique(true));
            }
        }
        assert_eq!(schedule(&trace_a), schedule(&trace_b));
        for trace in [&trace_a, &trace_b] {
            for p in 0..3 {
                let mut ones = 0u64;
                let mut bits = 0u64;
                for (r, msgs) in trace.iter().enumerate() {
                    let body = &msgs[p].payload[HEADER_BYTES..];
                    let o: u64 = body.iter().map(|b| u64::from(b.count_ones())).sum();
                    let b = 8 * body.len() as u64;
                    // Every sizeable message on its own looks balanced.
                    if b >= 8 * 4096 {
                        let f = o as f64 / b as f64;
                        assert!((0.47..0.53).contains(&f), "party {p} round {r}: {f}");
                    }
                    ones += o;
                    bits += b;
                }
                let f = ones as f64 / bits as f64;
                assert!((0.49..0.51).contains(&f), "party {p}: {f}");
            }
        }
        // The reshare message does not contain the plain dot products (which the test can
        // compute): for a near-duplicate of the probe at rotation 0 the code dot product is
        // common − 2·hd.
        let c_values: Vec<u16> = (0..n)
            .map(|e| {
                let (hd, common) = masked_code_distance_counts(&probe_a, &templates_a[e]);
                (common as i32 - 2 * hd as i32) as u16
            })
            .collect();
        let r = cfg.num_rotations();
        let mut hits = 0;
        for msgs in &trace_a[..1] {
            for m in msgs {
                let body = &m.payload[HEADER_BYTES..];
                for (e, &c) in c_values.iter().enumerate() {
                    let k = e * r + 15;
                    let v = u16::from_le_bytes([body[2 * k], body[2 * k + 1]]);
                    hits += usize::from(v == c);
                }
            }
        }
        assert!(
            hits <= 1,
            "{hits} plain code dot products in the reshare messages"
        );
    }

    #[test]
    fn rejects_wrong_sender_length_and_replay() {
        let mut rng = ChaCha20Rng::seed_from_u64(306);
        let probe = random_template(&mut rng);
        let templates = mixed_db(&probe, 8, &mut rng);
        let db = share_db(&templates, &mut rng);
        let cfg = config(SearchMode::Identify, 15);
        let fresh = |rng: &mut ChaCha20Rng| {
            start_all(&db, &probe, &cfg, 16, rng).map(|s| match s {
                Step::Send(s, m) => (s, m),
                Step::Done(_) => panic!("no first round"),
            })
        };
        let [(s0, _), (s1, _), (s2, m2)] = fresh(&mut rng);
        // Wrong sender: P1 only receives from P0.
        let err = s1.receive(P[2], &m2.payload).expect_err("wrong sender");
        assert!(matches!(err, MatchError::WrongSender { .. }), "{err}");
        // Wrong length: truncated body, and a payload without header.
        let short = &m2.payload[..m2.payload.len() - 1];
        let err = s0.receive(P[2], short).expect_err("short");
        assert!(matches!(err, MatchError::WrongLength { .. }), "{err}");
        let err = s2.receive(P[1], &[0, 0]).expect_err("no header");
        assert!(matches!(err, MatchError::WrongLength { .. }), "{err}");
        assert!(!err.to_string().is_empty());
        // Replay: deliver rounds 0..=k normally, then feed round k's message again; the
        // second receive is refused, in the reshare, compare, OR and open phases alike.
        let total = expected_rounds(
            SearchMode::Identify,
            8,
            15,
            &IrisPolicy::default_policy().threshold(),
        ) as usize;
        let recv = |s: IrisMatchSession, msgs: &[Outgoing; 3]| {
            let from = s.party().prev();
            s.receive(from, &msgs[from.as_usize()].payload)
        };
        for replay_at in [0usize, 1, 7, 15, 16, 18, total - 2] {
            let [(a0, b0), (a1, b1), (a2, b2)] = fresh(&mut rng);
            let mut states = [a0, a1, a2];
            let mut msgs = [b0, b1, b2];
            for round in 0..=replay_at {
                let [x0, x1, x2] = states;
                let steps = [x0, x1, x2].map(|x| recv(x, &msgs).expect("valid round"));
                let [Step::Send(x0, n0), Step::Send(x1, n1), Step::Send(x2, n2)] = steps else {
                    panic!("finished early")
                };
                if round == replay_at {
                    let err = x0.receive(P[2], &msgs[2].payload).expect_err("replay");
                    assert!(matches!(err, MatchError::WrongRound { .. }), "{err}");
                    // A message from the future (round + 2) is refused too.
                    let mut future = n2.payload.clone();
                    future[..HEADER_BYTES].copy_from_slice(&(round as u32 + 2).to_le_bytes());
                    let err = x1.receive(P[0], &future).expect_err("future");
                    assert!(matches!(err, MatchError::WrongRound { .. }), "{err}");
                    // The right message of the next round, one byte short, is refused.
                    let short = &n1.payload[..n1.payload.len() - 1];
                    let err = x2.receive(P[1], short).expect_err("short");
                    assert!(
                        matches!(
                            err,
                            MatchError::WrongLength { .. }
                                | MatchError::Mpc(MpcError::WrongLength { .. })
                        ),
                        "{err}"
                    );
                    let _ = n0;
                    break;
                }
                states = [x0, x1, x2];
                msgs = [n0, n1, n2];
            }
        }
    }

    /// Rounds and bytes of a search over `n` unrelated templates (the figures of the report).
    fn measure(n: usize, mode: SearchMode, max_rotation: i32) -> (u32, [usize; 3], Vec<usize>) {
        let mut rng = ChaCha20Rng::seed_from_u64(307);
        let probe = random_template(&mut rng);
        let templates: Vec<IrisTemplate> = (0..n).map(|_| random_template(&mut rng)).collect();
        let db = share_db(&templates, &mut rng);
        let cfg = config(mode, max_rotation);
        let (out, trace) = run(&db, &probe, &cfg, 17, &mut rng);
        match mode {
            SearchMode::Identify => assert!(identify(&out).is_empty()),
            SearchMode::Uniqueness => {
                assert_eq!(out, [0; 3].map(|_| MatchOutput::Unique(true)))
            }
        }
        let mut bytes = [0usize; 3];
        for msgs in &trace {
            for (b, m) in bytes.iter_mut().zip(msgs) {
                *b += m.payload.len();
            }
        }
        let lens = trace.iter().map(|m| m[0].payload.len()).collect();
        (trace.len() as u32, bytes, lens)
    }

    #[test]
    fn rounds_do_not_depend_on_the_database_size() {
        for n in [0usize, 1, 63, 1000] {
            let (rounds, bytes, lens) = measure(n, SearchMode::Identify, 15);
            assert_eq!(rounds, 21, "N = {n}");
            assert_eq!(
                rounds,
                expected_rounds(
                    SearchMode::Identify,
                    n,
                    15,
                    &IrisPolicy::default_policy().threshold()
                )
            );
            if n == 1000 {
                let per = bytes.map(|b| b as f64 / (31 * n) as f64);
                println!(
                    "N = 1000, 31 rotations: {rounds} rounds, bytes sent per party {bytes:?}, \
                     per comparison {per:.2?}; per round (P0): {lens:?}"
                );
                assert_eq!(bytes[0], 1_136_412, "update the module docs");
                // All parties send the same amount.
                assert!(bytes.iter().all(|&b| b == bytes[0]));
            }
        }
        let (rounds, ..) = measure(100, SearchMode::Identify, 0);
        assert_eq!(rounds, 16);
        let (rounds, bytes, _) = measure(100, SearchMode::Uniqueness, 15);
        assert_eq!(rounds, 1 + 14 + 12 + 1);
        println!("N = 100 uniqueness: {rounds} rounds, bytes {bytes:?}");
        assert_eq!(
            expected_rounds(
                SearchMode::Uniqueness,
                100_000,
                15,
                &IrisPolicy::default_policy().threshold()
            ),
            38
        );
    }

    #[test]
    fn session_counts_its_rounds_and_bytes() {
        let mut rng = ChaCha20Rng::seed_from_u64(308);
        let probe = random_template(&mut rng);
        let templates = mixed_db(&probe, 5, &mut rng);
        let db = share_db(&templates, &mut rng);
        let cfg = config(SearchMode::Identify, 15);
        let [s0, ..] = start_all(&db, &probe, &cfg, 18, &mut rng);
        let Step::Send(s0, m0) = s0 else {
            panic!("no first round")
        };
        assert_eq!(s0.rounds_sent(), 1);
        assert_eq!(s0.round(), 0);
        assert_eq!(s0.bytes_sent(), m0.payload.len());
        assert_eq!(m0.payload.len(), HEADER_BYTES + 4 * 5 * 31);
        let text = format!("{s0:?}");
        assert!(text.contains("reshare") && text.contains("P0") || text.contains("PartyIndex(0)"));
        // Inputs of another party or the wrong shape are refused.
        let ks = keys(18, [18; 16]);
        let q = share_query_template(&probe, &mut rng).expect("share");
        let m = ShareMatrix::new(&db[0].0, &db[0].1).expect("matrix");
        assert!(matches!(
            IrisMatchSession::start(&ks[0], &cfg, &m, &q[1]),
            Err(MatchError::InvalidInput(_))
        ));
        let bad = MatchConfig {
            max_rotation: 101,
            ..cfg.clone()
        };
        assert!(matches!(
            IrisMatchSession::start(&ks[0], &bad, &m, &q[0]),
            Err(MatchError::Query(_))
        ));
        let dots = DotShares {
            num_rotations: 31,
            num_entries: 2,
            code: vec![0; 62],
            mask: vec![0; 61],
        };
        assert!(matches!(
            IrisMatchSession::start_with_dots(&ks[0], &cfg, dots),
            Err(MatchError::InvalidInput(_))
        ));
    }
}
