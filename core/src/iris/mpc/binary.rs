//! Bit-sliced replicated binary sharing and the round engine of the binary circuits ([TACEO24]
//! §2 and §5: ABY3 boolean sharing, AND gate, binary adders; [BGK+24] §5: MSB extraction of
//! the deployed iris matcher).
//!
//! **Share layout.** A vector of n shared bits is stored bit-sliced: word w, bit j holds
//! element 64·w + j (comparison number 64·w + j). The n bits are XOR-shared as
//! x = x0 ⊕ x1 ⊕ x2 and replicated with the convention of [`crate::iris::sharing::replicated`]: party i holds
//! `a = x_i` and `b = x_{i−1}`. Bits past n in the last word are always zero in both
//! components. A w-bit number per element is a `Vec<BitSliced>` of w bit planes, least
//! significant plane first.
//!
//! **Local operations.** XOR (component-wise), NOT and XOR with a public constant (the
//! constant goes into component x0: P0 flips `a`, P1 flips `b`, P2 nothing), AND with a public
//! constant.
//!
//! **AND gate (1 round).** Party i computes
//! z_i = a_i·b_i ⊕ a_i·b_{i−1} ⊕ a_{i−1}·b_i ⊕ r_i, where (r_0, r_1, r_2) is an XOR-sharing of
//! zero from the pairwise PRFs ([`crate::crypto::seal::PairwisePrf`]; r_i = F(k_{i,i+1}) ⊕ F(k_{i−1,i})),
//! and sends z_i to party i+1; its new share is (z_i, z_{i−1}). The same round shape multiplies
//! replicated Z_2^32 shares (with + and · instead of ⊕ and ∧, used by bit injection in
//! [`super::lift`]). The PRF context is session id ‖ gate-batch label ‖ round number, so the
//! randomness needs no extra round.
//!
//! **Round engine.** A multi-round protocol is a [`Program`]: between rounds it computes locally
//! and asks for one batch of gates ([`Gates`]); a [`Session`] evaluates the batch. **In every
//! round, party i sends exactly one message to party i+1 and receives exactly one from party
//! i−1** (the ABY3 resharing direction). Payloads are the concatenated z words of the batch,
//! little-endian (u64 for AND, u32 for Z_2^32 products); a payload of the wrong length or from
//! the wrong sender is an error.
//!
//! **Rounds.** [`AndProgram`]: 1. [`AdderProgram`] (Kogge–Stone parallel-prefix adder of two
//! w-bit operands, sum mod 2^w): 1 (generate bits) + ⌈log2(w−1)⌉ (prefix levels) for w ≥ 2,
//! 0 for w ≤ 1 — 6 rounds for w = 32. [`A2bProgram`] (arithmetic Z_2^w → binary): 1
//! (carry-save layer of the three components) + the adder — 7 rounds for w = 32.
//! [`CarryProgram`] (only the carry into one bit of x0 + x1 + x2, used by the MSB extraction
//! and the lift): 1 + 1 + ⌈log2(t−1)⌉ for the carry into bit t — 7 rounds for t = 31.

use std::num::Wrapping;

use crate::algebra::ring::Z32;
use crate::crypto::seal::PairwisePrf;
use crate::iris::sharing::replicated::ReplicatedShare;
use crate::party::PartyIndex;

/// Bits per word of a bit-sliced vector.
pub const WORD_BITS: usize = 64;

/// Why a binary-domain MPC step was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpcError {
    /// A round message came from a party other than the one that sends in this round.
    #[error("mpc round {round}: message from {got}, but in this round only {expected} sends to this party")]
    WrongSender {
        /// The round number.
        round: u32,
        /// The party that must send (the previous party in the ring).
        expected: PartyIndex,
        /// The party the message claims to come from.
        got: PartyIndex,
    },
    /// A round message has the wrong length.
    #[error("mpc round {round}: message of {got} bytes, expected {expected}")]
    WrongLength {
        /// The round number.
        round: u32,
        /// The expected payload length in bytes.
        expected: usize,
        /// The received payload length in bytes.
        got: usize,
    },
    /// Two operands that must have the same shape do not.
    #[error("mpc: {what}: operands have lengths {left} and {right}")]
    LengthMismatch {
        /// Which operation.
        what: &'static str,
        /// Length of the left operand.
        left: usize,
        /// Length of the right operand.
        right: usize,
    },
    /// An input is malformed (wrong number of words, unsupported width…).
    #[error("mpc: invalid input: {0}")]
    InvalidInput(&'static str),
    /// A message arrived after the protocol finished, or the parties are out of step.
    #[error("mpc: protocol out of step: {0}")]
    OutOfStep(&'static str),
    /// The copies of one component of a binary sharing disagree.
    #[error("mpc: binary sharing: the two copies of component x{0} disagree")]
    Inconsistent(usize),
}

/// Number of words that hold `len` bits.
pub fn words_for(len: usize) -> usize {
    len.div_ceil(WORD_BITS)
}

/// The mask of the valid bits of the last word of a `len`-bit vector (all ones if `len` is a
/// multiple of 64).
fn last_word_mask(len: usize) -> u64 {
    match len % WORD_BITS {
        0 => u64::MAX,
        r => (1u64 << r) - 1,
    }
}

/// Clears the bits past `len` in `words`.
fn clear_padding(words: &mut [u64], len: usize) {
    if let Some(last) = words.last_mut() {
        *last &= last_word_mask(len);
    }
}

/// Packs booleans into bit-sliced words (bit j of word w = element 64·w + j).
pub fn pack_bits(bits: &[bool]) -> Vec<u64> {
    let mut words = vec![0u64; words_for(bits.len())];
    for (i, &bit) in bits.iter().enumerate() {
        words[i / WORD_BITS] |= u64::from(bit) << (i % WORD_BITS);
    }
    words
}

/// Unpacks the first `len` bits of bit-sliced words (missing words read as zero).
pub fn unpack_bits(words: &[u64], len: usize) -> Vec<bool> {
    (0..len)
        .map(|i| {
            words
                .get(i / WORD_BITS)
                .is_some_and(|w| (w >> (i % WORD_BITS)) & 1 == 1)
        })
        .collect()
}

/// Transposes `values` into `width` bit planes (plane k, bit i = bit k of `values[i]`).
/// Runs the AVX2 transposition where the CPU has it (the bit decompositions of a search at
/// N = 100,000 with 31 rotations transpose tens of millions of values), else the portable one.
pub fn bit_planes(values: &[u32], width: usize) -> Vec<Vec<u64>> {
    let width = width.min(32);
    let mut planes = vec![vec![0u64; words_for(values.len())]; width];
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        unsafe { transpose_avx2::bit_planes_into(values, &mut planes) };
        return planes;
    }
    bit_planes_portable(values, &mut planes);
    planes
}

/// The portable transposition: each output word is built in a register from 64 values.
fn bit_planes_portable(values: &[u32], planes: &mut [Vec<u64>]) {
    for (w, chunk) in values.chunks(WORD_BITS).enumerate() {
        for (k, plane) in planes.iter_mut().enumerate() {
            plane[w] = chunk
                .iter()
                .enumerate()
                .fold(0u64, |word, (j, &v)| word | (u64::from((v >> k) & 1) << j));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod transpose_avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_castsi256_ps, _mm256_loadu_si256, _mm256_movemask_ps, _mm256_set1_epi32,
        _mm256_sllv_epi32,
    };

    use super::{bit_planes_portable, WORD_BITS};

    /// Writes the planes of `values` (see [`super::bit_planes`]); the last partial chunk of
    /// fewer than 64 values goes through the portable code.
    ///
    /// # Safety
    /// The CPU must support AVX2; every plane must hold `values.len().div_ceil(64)` words.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bit_planes_into(values: &[u32], planes: &mut [Vec<u64>]) {
        let full = values.len() / WORD_BITS;
        for w in 0..full {
            let chunk = &values[w * WORD_BITS..(w + 1) * WORD_BITS];
            // SAFETY: the chunk holds 64 u32 = 8 × 32 bytes; loadu needs no alignment.
            let v: [__m256i; 8] = std::array::from_fn(|q| unsafe {
                _mm256_loadu_si256(chunk.as_ptr().add(8 * q).cast::<__m256i>())
            });
            for (k, plane) in planes.iter_mut().enumerate() {
                // Move bit k of every lane to the sign bit, then collect the 8 sign bits.
                let shift = _mm256_set1_epi32(31 - k as i32);
                let word = v.iter().enumerate().fold(0u64, |word, (q, &x)| {
                    let moved = _mm256_sllv_epi32(x, shift);
                    let bits = _mm256_movemask_ps(_mm256_castsi256_ps(moved)) as u32 as u64;
                    word | (bits << (8 * q))
                });
                plane[w] = word;
            }
        }
        let rest = &values[full * WORD_BITS..];
        if !rest.is_empty() {
            let mut tail: Vec<Vec<u64>> = vec![vec![0u64; 1]; planes.len()];
            bit_planes_portable(rest, &mut tail);
            for (plane, t) in planes.iter_mut().zip(tail) {
                plane[full] = t[0];
            }
        }
    }
}

/// The inverse of [`bit_planes`]: element i = Σ_k 2^k · (bit i of plane k), for `len`
/// elements (at most 32 planes are used).
pub fn from_bit_planes(planes: &[Vec<u64>], len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| {
            planes
                .iter()
                .take(32)
                .enumerate()
                .fold(0u32, |acc, (k, p)| {
                    let bit = p
                        .get(i / WORD_BITS)
                        .map_or(0, |w| ((w >> (i % WORD_BITS)) & 1) as u32);
                    acc | (bit << k)
                })
        })
        .collect()
}

/// One party's replicated share of a vector of `len` bits, bit-sliced (module docs: party i
/// holds `a = x_i`, `b = x_{i−1}`; [TACEO24] §3.2 boolean sharing). Its `Debug` output shows the
/// length only, never the share words.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct BitSliced {
    len: usize,
    a: Vec<u64>,
    b: Vec<u64>,
}

impl std::fmt::Debug for BitSliced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BitSliced({} bits, <redacted>)", self.len)
    }
}

impl BitSliced {
    /// The share of `len` zero bits (all components zero; local, no randomness).
    pub fn zeros(len: usize) -> Self {
        let n = words_for(len);
        Self {
            len,
            a: vec![0; n],
            b: vec![0; n],
        }
    }

    /// A share from its two components; both must have exactly `words_for(len)` words. Bits
    /// past `len` are cleared.
    pub fn from_words(len: usize, mut a: Vec<u64>, mut b: Vec<u64>) -> Result<Self, MpcError> {
        let n = words_for(len);
        if a.len() != n || b.len() != n {
            return Err(MpcError::InvalidInput(
                "bit-sliced share components must have ceil(len/64) words",
            ));
        }
        clear_padding(&mut a, len);
        clear_padding(&mut b, len);
        Ok(Self { len, a, b })
    }

    /// The share held by `party` of a vector whose only non-zero component is x_`component`
    /// = `words` (a value known to the two holders of that component; [MR18] trivial
    /// sharing used by arithmetic-to-binary conversion). Fails unless `words` has
    /// `words_for(len)` words.
    pub fn from_component(
        component: PartyIndex,
        words: &[u64],
        len: usize,
        party: PartyIndex,
    ) -> Result<Self, MpcError> {
        let mut share = Self::zeros(len);
        if words.len() != share.a.len() {
            return Err(MpcError::InvalidInput(
                "component words must have ceil(len/64) words",
            ));
        }
        if component == party {
            share.a.copy_from_slice(words);
        } else if component == party.prev() {
            share.b.copy_from_slice(words);
        }
        clear_padding(&mut share.a, len);
        clear_padding(&mut share.b, len);
        Ok(share)
    }

    /// Number of shared bits.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the vector has no bits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The component x_i of the holding party i.
    pub fn a(&self) -> &[u64] {
        &self.a
    }

    /// The component x_{i−1} of the previous party.
    pub fn b(&self) -> &[u64] {
        &self.b
    }

    fn check_same_len(&self, other: &Self, what: &'static str) -> Result<(), MpcError> {
        if self.len != other.len {
            return Err(MpcError::LengthMismatch {
                what,
                left: self.len,
                right: other.len,
            });
        }
        Ok(())
    }

    /// Shares of x ⊕ y (local, component-wise). Fails if the lengths differ.
    pub fn xor(&self, other: &Self) -> Result<Self, MpcError> {
        self.check_same_len(other, "xor")?;
        Ok(self.xor_same(other))
    }

    /// XOR of two shares known to have the same length.
    pub(crate) fn xor_same(&self, other: &Self) -> Self {
        Self {
            len: self.len,
            a: self.a.iter().zip(&other.a).map(|(x, y)| x ^ y).collect(),
            b: self.b.iter().zip(&other.b).map(|(x, y)| x ^ y).collect(),
        }
    }

    /// Shares of x ⊕ c for public bits `c` (local): c goes into component x0, so P0 flips its
    /// `a`, P1 its `b`, P2 nothing. Fails unless `c` has `words_for(len)` words.
    pub fn xor_public(&self, c: &[u64], party: PartyIndex) -> Result<Self, MpcError> {
        if c.len() != self.a.len() {
            return Err(MpcError::InvalidInput(
                "public constant must have ceil(len/64) words",
            ));
        }
        let mut out = self.clone();
        let target = match party.as_usize() {
            0 => Some(&mut out.a),
            1 => Some(&mut out.b),
            _ => None,
        };
        if let Some(words) = target {
            for (w, k) in words.iter_mut().zip(c) {
                *w ^= k;
            }
            clear_padding(words, self.len);
        }
        Ok(out)
    }

    /// Shares of ¬x (local; XOR with all ones, see [`BitSliced::xor_public`]).
    pub fn not(&self, party: PartyIndex) -> Self {
        let mut out = self.clone();
        let target = match party.as_usize() {
            0 => Some(&mut out.a),
            1 => Some(&mut out.b),
            _ => None,
        };
        if let Some(words) = target {
            for w in words.iter_mut() {
                *w = !*w;
            }
            clear_padding(words, self.len);
        }
        out
    }

    /// Shares of x ∧ c for public bits `c` (local, component-wise). Fails unless `c` has
    /// `words_for(len)` words.
    pub fn and_public(&self, c: &[u64]) -> Result<Self, MpcError> {
        if c.len() != self.a.len() {
            return Err(MpcError::InvalidInput(
                "public constant must have ceil(len/64) words",
            ));
        }
        Ok(Self {
            len: self.len,
            a: self.a.iter().zip(c).map(|(x, k)| x & k).collect(),
            b: self.b.iter().zip(c).map(|(x, k)| x & k).collect(),
        })
    }

    /// The bits `start .. start + len` as a new share (local). Fails if the range is out of
    /// bounds.
    pub fn slice(&self, start: usize, len: usize) -> Result<Self, MpcError> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => return Err(MpcError::InvalidInput("bit range out of bounds")),
        }
        let extract = |src: &[u64]| -> Vec<u64> {
            let (q, r) = (start / WORD_BITS, start % WORD_BITS);
            let mut out: Vec<u64> = (0..words_for(len))
                .map(|w| {
                    let lo = src.get(q + w).copied().unwrap_or(0);
                    if r == 0 {
                        lo
                    } else {
                        let hi = src.get(q + w + 1).copied().unwrap_or(0);
                        (lo >> r) | (hi << (WORD_BITS - r))
                    }
                })
                .collect();
            clear_padding(&mut out, len);
            out
        };
        Ok(Self {
            len,
            a: extract(&self.a),
            b: extract(&self.b),
        })
    }

    /// The concatenation of `self` followed by `other` (local).
    pub fn concat(&self, other: &Self) -> Self {
        let len = self.len + other.len;
        let append = |x: &[u64], y: &[u64]| -> Vec<u64> {
            let mut out = x.to_vec();
            out.resize(words_for(len), 0);
            let shift = self.len % WORD_BITS;
            let base = self.len / WORD_BITS;
            for (w, &word) in y.iter().enumerate() {
                if shift == 0 {
                    out[base + w] |= word;
                } else {
                    out[base + w] |= word << shift;
                    if let Some(next) = out.get_mut(base + w + 1) {
                        *next |= word >> (WORD_BITS - shift);
                    }
                }
            }
            out
        };
        Self {
            len,
            a: append(&self.a, &other.a),
            b: append(&self.b, &other.b),
        }
    }
}

/// Splits public bits (`len` bits, bit-sliced in `words`) into fresh random XOR components and
/// returns the shares of P0, P1, P2 (tests, dealers).
pub fn share_bits<R: rand_core::RngCore + ?Sized>(
    words: &[u64],
    len: usize,
    rng: &mut R,
) -> Result<[BitSliced; 3], MpcError> {
    let n = words_for(len);
    if words.len() != n {
        return Err(MpcError::InvalidInput("bits must have ceil(len/64) words"));
    }
    let mut x0: Vec<u64> = (0..n).map(|_| rng.next_u64()).collect();
    let mut x1: Vec<u64> = (0..n).map(|_| rng.next_u64()).collect();
    let mut x2: Vec<u64> = (0..n).map(|w| words[w] ^ x0[w] ^ x1[w]).collect();
    for x in [&mut x0, &mut x1, &mut x2] {
        clear_padding(x, len);
    }
    let comps = [x0, x1, x2];
    Ok(PartyIndex::ALL.map(|p| BitSliced {
        len,
        a: comps[p.as_usize()].clone(),
        b: comps[p.prev().as_usize()].clone(),
    }))
}

/// Reconstructs the bits from the shares of P0, P1, P2, checking that each component held
/// twice agrees.
pub fn reconstruct_bits(shares: &[BitSliced; 3]) -> Result<Vec<u64>, MpcError> {
    for p in PartyIndex::ALL {
        let (i, j) = (p.as_usize(), p.next().as_usize());
        if shares[i].len != shares[j].len {
            return Err(MpcError::LengthMismatch {
                what: "reconstruct",
                left: shares[i].len,
                right: shares[j].len,
            });
        }
        if shares[i].a != shares[j].b {
            return Err(MpcError::Inconsistent(i));
        }
    }
    Ok((0..shares[0].a.len())
        .map(|w| shares[0].a[w] ^ shares[1].a[w] ^ shares[2].a[w])
        .collect())
}

/// The message of one party in the opening of a bit-sliced share ([TACEO24] §3.2 reveal): party
/// i sends its `b` = x_{i−1} to party i+1, which is exactly the component i+1 lacks. Returns
/// `None` if party i+1 is not in `entitled` (nothing is sent to parties that must not learn
/// the value). The payload is the words of `b`, little-endian.
pub fn open_message(
    party: PartyIndex,
    share: &BitSliced,
    entitled: &[PartyIndex],
) -> Option<Outgoing> {
    let to = party.next();
    entitled.contains(&to).then(|| Outgoing {
        to,
        payload: encode_u64(&share.b),
    })
}

/// Completes an opening at party `party`: `payload` must come from party i−1 and hold
/// `words_for(len)` words; returns the opened bits x0 ⊕ x1 ⊕ x2 (bit-sliced).
pub fn open_receive(
    party: PartyIndex,
    share: &BitSliced,
    from: PartyIndex,
    payload: &[u8],
) -> Result<Vec<u64>, MpcError> {
    if from != party.prev() {
        return Err(MpcError::WrongSender {
            round: 0,
            expected: party.prev(),
            got: from,
        });
    }
    let missing = decode_u64(payload, share.a.len(), 0)?;
    let mut out: Vec<u64> = (0..share.a.len())
        .map(|w| share.a[w] ^ share.b[w] ^ missing[w])
        .collect();
    clear_padding(&mut out, share.len);
    Ok(out)
}

/// One party's context for the binary protocols: who it is, the session id and the pairwise
/// PRFs it shares with its neighbours (for the zero-sharings of the AND and multiplication
/// gates, [TACEO24] §3.2).
#[derive(Clone, Debug)]
pub struct MpcContext {
    party: PartyIndex,
    session: [u8; 16],
    with_next: PairwisePrf,
    with_prev: PairwisePrf,
}

impl MpcContext {
    /// The context of `party` in session `session`; `with_next` is the PRF shared with party
    /// i+1, `with_prev` the one shared with party i−1. The session id must be fresh for every
    /// session (it separates the zero-sharings of different sessions).
    pub fn new(
        party: PartyIndex,
        session: [u8; 16],
        with_next: PairwisePrf,
        with_prev: PairwisePrf,
    ) -> Self {
        Self {
            party,
            session,
            with_next,
            with_prev,
        }
    }

    /// The party this context belongs to.
    pub fn party(&self) -> PartyIndex {
        self.party
    }

    /// The session id.
    pub fn session(&self) -> &[u8; 16] {
        &self.session
    }

    /// The PRF shared with party i+1.
    pub fn with_next(&self) -> &PairwisePrf {
        &self.with_next
    }

    /// The PRF shared with party i−1.
    pub fn with_prev(&self) -> &PairwisePrf {
        &self.with_prev
    }

    /// The PRF context of one gate batch: domain ‖ session ‖ label length ‖ label ‖ round ‖
    /// gate kind.
    fn prf_context(&self, label: &[u8], round: u32, kind: u8) -> Vec<u8> {
        let mut ctx = Vec::with_capacity(40 + label.len());
        ctx.extend_from_slice(b"privmatch mpc v1");
        ctx.extend_from_slice(&self.session);
        ctx.extend_from_slice(&(label.len() as u64).to_le_bytes());
        ctx.extend_from_slice(label);
        ctx.extend_from_slice(&round.to_le_bytes());
        ctx.push(kind);
        ctx
    }

    /// This party's share r_i = F(k_{i,i+1}) ⊕ F(k_{i−1,i}) of an XOR-sharing of zero.
    fn zero_share_words(&self, label: &[u8], round: u32, out: &mut [u64]) {
        let ctx = self.prf_context(label, round, b'B');
        self.with_next.fill_words(&ctx, out);
        self.with_prev.xor_words(&ctx, out);
    }

    /// This party's share of an additive sharing of zero over Z_2^32.
    fn zero_share_u32(&self, label: &[u8], round: u32, out: &mut [u32]) {
        let ctx = self.prf_context(label, round, b'A');
        crate::crypto::seal::zero_share_u32(&self.with_next, &self.with_prev, &ctx, out);
    }
}

/// A message to send: `payload` goes to party `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The receiving party (always the next party i+1 in the round protocols).
    pub to: PartyIndex,
    /// The encoded round message.
    pub payload: Vec<u8>,
}

/// The result of starting or advancing a protocol: either the state plus the message to send
/// in the next round, or the final output.
#[derive(Debug)]
pub enum Step<S, O> {
    /// Send `Outgoing`, then feed the next received message to the state.
    Send(S, Outgoing),
    /// The protocol finished with this party's output.
    Done(O),
}

/// A replicated Z_2^32 vector (one share per element).
pub type ArithVec = Vec<ReplicatedShare<Z32>>;

/// One round's batch of gates: pairs of operands to multiply. All pairs are evaluated in the
/// same round and sent in one message.
#[derive(Clone, Debug)]
pub enum Gates {
    /// Bitwise AND of each pair of equal-length bit-sliced shares.
    And(Vec<(BitSliced, BitSliced)>),
    /// Element-wise product of each pair of equal-length replicated Z_2^32 vectors.
    Mul(Vec<(ArithVec, ArithVec)>),
}

/// The outputs of one round's gates, in the order of the [`Gates`] batch.
#[derive(Clone, Debug)]
pub enum Products {
    /// Before the first round.
    Start,
    /// Results of a [`Gates::And`] batch.
    And(Vec<BitSliced>),
    /// Results of a [`Gates::Mul`] batch.
    Mul(Vec<ArithVec>),
}

/// What a [`Program`] wants next.
#[derive(Clone, Debug)]
pub enum ProgramStep<O> {
    /// Evaluate these gates in the next round.
    Gates(Gates),
    /// The program is finished.
    Done(O),
}

/// A multi-round protocol written as local computation between batched gate rounds ([TACEO24]
/// §5: every layer of a boolean circuit is one round of batched ANDs).
pub trait Program {
    /// This party's output.
    type Output;

    /// Called with [`Products::Start`] first, then with the products of each requested batch;
    /// returns the next batch or the output.
    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError>;
}

enum Pending {
    And { lens: Vec<usize>, z: Vec<u64> },
    Mul { lens: Vec<usize>, z: Vec<u32> },
}

/// One party's running instance of a [`Program`]: evaluates each requested gate batch in one
/// round (send to party i+1, receive from party i−1).
pub struct Session<P: Program> {
    ctx: MpcContext,
    label: Vec<u8>,
    program: P,
    round: u32,
    pending: Pending,
}

impl<P: Program> std::fmt::Debug for Session<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Session({}, round {})", self.ctx.party, self.round)
    }
}

fn encode_u64(words: &[u64]) -> Vec<u8> {
    // Fixed-size chunks of a sized buffer: the loop compiles to a straight copy on
    // little-endian machines (pushing 8 bytes at a time does not).
    let mut out = vec![0u8; words.len() * 8];
    for (bytes, w) in out.chunks_exact_mut(8).zip(words) {
        bytes.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Refuses a payload of another length than `expected` bytes.
fn check_length(payload: &[u8], expected: usize, round: u32) -> Result<(), MpcError> {
    if payload.len() == expected {
        Ok(())
    } else {
        Err(MpcError::WrongLength {
            round,
            expected,
            got: payload.len(),
        })
    }
}

/// Decodes exactly `count` little-endian `N`-byte values, or reports the wrong length.
fn decode_le<T, const N: usize>(
    payload: &[u8],
    count: usize,
    round: u32,
    from_le: fn([u8; N]) -> T,
) -> Result<Vec<T>, MpcError> {
    check_length(payload, count * N, round)?;
    Ok(payload
        .chunks_exact(N)
        .map(|c| {
            let mut b = [0u8; N];
            b.copy_from_slice(c);
            from_le(b)
        })
        .collect())
}

fn decode_u64(payload: &[u8], words: usize, round: u32) -> Result<Vec<u64>, MpcError> {
    decode_le(payload, words, round, u64::from_le_bytes)
}

fn decode_u32(payload: &[u8], count: usize, round: u32) -> Result<Vec<u32>, MpcError> {
    decode_le(payload, count, round, u32::from_le_bytes)
}

impl<P: Program> Session<P> {
    /// Starts `program` for the party of `ctx`. `label` names this gate batch sequence and
    /// must be unique within the session (it separates the zero-sharings of sub-protocols).
    /// Returns the first round's message, or the output at once if the program needs no round.
    pub fn start(
        ctx: &MpcContext,
        label: &[u8],
        mut program: P,
    ) -> Result<Step<Self, P::Output>, MpcError> {
        match program.next(ctx.party, Products::Start)? {
            ProgramStep::Done(out) => Ok(Step::Done(out)),
            ProgramStep::Gates(gates) => {
                let mut session = Self {
                    ctx: ctx.clone(),
                    label: label.to_vec(),
                    program,
                    round: 0,
                    pending: Pending::And {
                        lens: Vec::new(),
                        z: Vec::new(),
                    },
                };
                let out = session.send(gates)?;
                Ok(Step::Send(session, out))
            }
        }
    }

    /// The number of the round whose message this state waits for (0-based).
    pub fn round(&self) -> u32 {
        self.round
    }

    /// Feeds the message received from `from` in the current round; returns the next round's
    /// message or the output. Fails on a wrong sender or a wrong length.
    pub fn receive(
        mut self,
        from: PartyIndex,
        payload: &[u8],
    ) -> Result<Step<Self, P::Output>, MpcError> {
        let party = self.ctx.party;
        if from != party.prev() {
            return Err(MpcError::WrongSender {
                round: self.round,
                expected: party.prev(),
                got: from,
            });
        }
        let pending = std::mem::replace(
            &mut self.pending,
            Pending::And {
                lens: Vec::new(),
                z: Vec::new(),
            },
        );
        let products = match pending {
            Pending::And { lens, mut z } => {
                check_length(payload, z.len() * 8, self.round)?;
                // The batches' own words move out of `z` (split from the back: the first
                // batch stays where it is); the peer's are decoded once, batch by batch.
                let mut out = Vec::with_capacity(lens.len());
                for &len in lens.iter().rev() {
                    let n = words_for(len);
                    let off = z.len() - n;
                    let theirs = decode_u64(&payload[off * 8..(off + n) * 8], n, self.round)?;
                    out.push(BitSliced {
                        len,
                        a: z.split_off(off),
                        b: theirs,
                    });
                }
                out.reverse();
                Products::And(out)
            }
            Pending::Mul { lens, z } => {
                let theirs = decode_u32(payload, z.len(), self.round)?;
                let mut out = Vec::with_capacity(lens.len());
                let mut off = 0;
                for &len in &lens {
                    out.push(
                        (off..off + len)
                            .map(|k| ReplicatedShare {
                                a: Wrapping(z[k]),
                                b: Wrapping(theirs[k]),
                            })
                            .collect(),
                    );
                    off += len;
                }
                Products::Mul(out)
            }
        };
        self.round = self.round.wrapping_add(1);
        match self.program.next(party, products)? {
            ProgramStep::Done(out) => Ok(Step::Done(out)),
            ProgramStep::Gates(gates) => {
                let out = self.send(gates)?;
                Ok(Step::Send(self, out))
            }
        }
    }

    /// Computes this party's z_i for a batch (local cross terms plus zero share) and encodes
    /// the message to party i+1.
    fn send(&mut self, gates: Gates) -> Result<Outgoing, MpcError> {
        let payload = match gates {
            Gates::And(pairs) => {
                let mut lens = Vec::with_capacity(pairs.len());
                let total: usize = pairs.iter().map(|(x, _)| x.a.len()).sum();
                let mut z = vec![0u64; total];
                self.ctx.zero_share_words(&self.label, self.round, &mut z);
                let mut off = 0;
                for (x, y) in &pairs {
                    x.check_same_len(y, "and")?;
                    let n = x.a.len();
                    for w in 0..n {
                        z[off + w] ^= (x.a[w] & y.a[w]) ^ (x.a[w] & y.b[w]) ^ (x.b[w] & y.a[w]);
                    }
                    clear_padding(&mut z[off..off + n], x.len);
                    off += n;
                    lens.push(x.len);
                }
                let payload = encode_u64(&z);
                self.pending = Pending::And { lens, z };
                payload
            }
            Gates::Mul(pairs) => {
                let mut lens = Vec::with_capacity(pairs.len());
                let total: usize = pairs.iter().map(|(x, _)| x.len()).sum();
                let mut z = vec![0u32; total];
                self.ctx.zero_share_u32(&self.label, self.round, &mut z);
                let mut off = 0;
                for (x, y) in &pairs {
                    if x.len() != y.len() {
                        return Err(MpcError::LengthMismatch {
                            what: "mul",
                            left: x.len(),
                            right: y.len(),
                        });
                    }
                    for (k, (s, t)) in x.iter().zip(y).enumerate() {
                        let local = s.a * t.a + s.a * t.b + s.b * t.a;
                        z[off + k] = z[off + k].wrapping_add(local.0);
                    }
                    off += x.len();
                    lens.push(x.len());
                }
                let payload: Vec<u8> = z.iter().flat_map(|v| v.to_le_bytes()).collect();
                self.pending = Pending::Mul { lens, z };
                payload
            }
        };
        Ok(Outgoing {
            to: self.ctx.party.next(),
            payload,
        })
    }
}

/// One round of batched AND gates: x_k ∧ y_k for every pair ([TACEO24] §3.2 AND gate).
#[derive(Clone, Debug)]
pub struct AndProgram {
    pairs: Option<Vec<(BitSliced, BitSliced)>>,
}

impl AndProgram {
    /// The program computing x_k ∧ y_k for each k; fails if a pair's lengths differ or the
    /// lists have different lengths.
    pub fn new(x: Vec<BitSliced>, y: Vec<BitSliced>) -> Result<Self, MpcError> {
        if x.len() != y.len() {
            return Err(MpcError::LengthMismatch {
                what: "and operand lists",
                left: x.len(),
                right: y.len(),
            });
        }
        for (s, t) in x.iter().zip(&y) {
            s.check_same_len(t, "and")?;
        }
        Ok(Self {
            pairs: Some(x.into_iter().zip(y).collect()),
        })
    }
}

impl Program for AndProgram {
    type Output = Vec<BitSliced>;

    fn next(
        &mut self,
        _party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        match (products, self.pairs.take()) {
            (Products::Start, Some(pairs)) => Ok(ProgramStep::Gates(Gates::And(pairs))),
            (Products::And(out), None) => Ok(ProgramStep::Done(out)),
            _ => Err(MpcError::OutOfStep("AND gate")),
        }
    }
}

/// Checks that a list of bit planes is non-ragged and returns the common length.
fn planes_len(planes: &[BitSliced]) -> Result<usize, MpcError> {
    let len = planes.first().map_or(0, |p| p.len);
    for p in planes {
        if p.len != len {
            return Err(MpcError::LengthMismatch {
                what: "bit planes",
                left: len,
                right: p.len,
            });
        }
    }
    Ok(len)
}

/// Kogge–Stone parallel-prefix adder of two w-bit bit-sliced operands ([TACEO24] §2.2 binary
/// adder): returns the w planes of (x + y) mod 2^w. Rounds: 1 (g_k = x_k ∧ y_k) +
/// ⌈log2(w−1)⌉ (prefix levels, G_i ← G_i ⊕ P_i∧G_{i−d}, P_i ← P_i∧P_{i−d}) for w ≥ 2;
/// none for w ≤ 1.
#[derive(Clone, Debug)]
pub struct AdderProgram {
    width: usize,
    x: Vec<BitSliced>,
    y: Vec<BitSliced>,
    p: Vec<BitSliced>,
    g: Vec<BitSliced>,
    pp: Vec<BitSliced>,
    dist: usize,
    phase: u8,
}

impl AdderProgram {
    /// The adder of `x` and `y` (w planes each, least significant first, all of one length).
    pub fn new(x: Vec<BitSliced>, y: Vec<BitSliced>) -> Result<Self, MpcError> {
        if x.len() != y.len() {
            return Err(MpcError::LengthMismatch {
                what: "adder widths",
                left: x.len(),
                right: y.len(),
            });
        }
        let (lx, ly) = (planes_len(&x)?, planes_len(&y)?);
        if lx != ly {
            return Err(MpcError::LengthMismatch {
                what: "adder operands",
                left: lx,
                right: ly,
            });
        }
        let p = x.iter().zip(&y).map(|(s, t)| s.xor_same(t)).collect();
        Ok(Self {
            width: x.len(),
            x,
            y,
            p,
            g: Vec::new(),
            pp: Vec::new(),
            dist: 1,
            phase: 0,
        })
    }

    /// The sum planes s_i = p_i ⊕ c_i with c_0 = 0 and c_i = G[i−1].
    fn finish(&self) -> Vec<BitSliced> {
        (0..self.width)
            .map(|i| {
                if i == 0 {
                    self.p[0].clone()
                } else {
                    self.p[i].xor_same(&self.g[i - 1])
                }
            })
            .collect()
    }

    /// The gates of the prefix level at distance `dist`: G-updates for i in dist..=w−2, then
    /// P-updates for i in 2·dist..=w−2 (only spans that do not reach bit 0 need their P).
    fn level_gates(&self) -> Gates {
        let top = self.width - 2;
        let mut pairs = Vec::new();
        for i in self.dist..=top {
            pairs.push((self.pp[i].clone(), self.g[i - self.dist].clone()));
        }
        for i in (2 * self.dist)..=top {
            pairs.push((self.pp[i].clone(), self.pp[i - self.dist].clone()));
        }
        Gates::And(pairs)
    }
}

impl Program for AdderProgram {
    type Output = Vec<BitSliced>;

    fn next(
        &mut self,
        _party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        match (self.phase, products) {
            (0, Products::Start) => {
                if self.width <= 1 {
                    self.phase = 2;
                    return Ok(ProgramStep::Done(self.p.clone()));
                }
                self.phase = 1;
                let pairs = self
                    .x
                    .iter()
                    .zip(&self.y)
                    .take(self.width - 1)
                    .map(|(s, t)| (s.clone(), t.clone()))
                    .collect();
                Ok(ProgramStep::Gates(Gates::And(pairs)))
            }
            (1, Products::And(out)) => {
                let top = self.width - 2;
                if self.g.is_empty() {
                    // Generate round: g_i = x_i ∧ y_i for i ≤ w−2.
                    self.g = out;
                    self.pp = self.p[..=top].to_vec();
                } else {
                    let d = self.dist;
                    // The products were computed from the previous level's values, so the
                    // updates can be applied in place.
                    let mut it = out.into_iter();
                    for g in self.g.iter_mut().take(top + 1).skip(d) {
                        let t = it.next().ok_or(MpcError::OutOfStep("adder level"))?;
                        *g = g.xor_same(&t);
                    }
                    for p in self.pp.iter_mut().take(top + 1).skip(2 * d) {
                        *p = it.next().ok_or(MpcError::OutOfStep("adder level"))?;
                    }
                    self.dist *= 2;
                }
                if self.dist > top {
                    self.phase = 2;
                    return Ok(ProgramStep::Done(self.finish()));
                }
                Ok(ProgramStep::Gates(self.level_gates()))
            }
            _ => Err(MpcError::OutOfStep("adder")),
        }
    }
}

/// The three trivially binary-shared components of replicated Z_2^w values, as bit planes:
/// returns, per component j, the w planes of this party's share of x_j ([MR18]: x_j is
/// known to P_j and P_{j+1}).
pub(crate) fn component_planes(
    values: &[ReplicatedShare<Z32>],
    width: usize,
    party: PartyIndex,
) -> [Vec<BitSliced>; 3] {
    let len = values.len();
    let a_planes = bit_planes(&values.iter().map(|s| s.a.0).collect::<Vec<_>>(), width);
    let b_planes = bit_planes(&values.iter().map(|s| s.b.0).collect::<Vec<_>>(), width);
    PartyIndex::ALL.map(|component| {
        (0..width)
            .map(|k| {
                let mut share = BitSliced::zeros(len);
                if component == party {
                    share.a.clone_from(&a_planes[k]);
                } else if component == party.prev() {
                    share.b.clone_from(&b_planes[k]);
                }
                share
            })
            .collect()
    })
}

/// The carry-save layer gates: maj(x0, x1, x2) = ((x0 ⊕ x2) ∧ (x1 ⊕ x2)) ⊕ x2, one AND per
/// plane for the lowest `carries` planes. Returns the gates and all planes s = x0 ⊕ x1 ⊕ x2.
fn csa_layer(
    comps: &[Vec<BitSliced>; 3],
    carries: usize,
) -> (Vec<(BitSliced, BitSliced)>, Vec<BitSliced>) {
    let [x0, x1, x2] = comps;
    let mut gates = Vec::with_capacity(carries);
    let mut sum = Vec::with_capacity(x0.len());
    for k in 0..x0.len() {
        if k < carries {
            gates.push((x0[k].xor_same(&x2[k]), x1[k].xor_same(&x2[k])));
        }
        sum.push(x0[k].xor_same(&x1[k]).xor_same(&x2[k]));
    }
    (gates, sum)
}

/// Arithmetic-to-binary conversion of replicated Z_2^w values, w ≤ 32 ([MR18]): the
/// three components are trivially binary-shared, summed by a carry-save layer (1 round) into
/// s + 2c, then added by the [`AdderProgram`] (1 + ⌈log2(w−1)⌉ rounds): 7 rounds for w = 32.
/// Output: the w bit planes of x mod 2^w.
#[derive(Debug)]
pub struct A2bProgram {
    width: usize,
    comps: Option<[Vec<BitSliced>; 3]>,
    sum: Vec<BitSliced>,
    x2: Vec<BitSliced>,
    adder: Option<AdderProgram>,
}

impl A2bProgram {
    /// The conversion of `values` (this party's replicated shares) to `width`-bit binary
    /// shares; fails unless 1 ≤ width ≤ 32. Bits of the components above `width` are ignored.
    pub fn new(
        values: &[ReplicatedShare<Z32>],
        width: usize,
        party: PartyIndex,
    ) -> Result<Self, MpcError> {
        if !(1..=32).contains(&width) {
            return Err(MpcError::InvalidInput("a2b width must be 1..=32"));
        }
        Ok(Self {
            width,
            comps: Some(component_planes(values, width, party)),
            sum: Vec::new(),
            x2: Vec::new(),
            adder: None,
        })
    }
}

impl Program for A2bProgram {
    type Output = Vec<BitSliced>;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        if let Some(adder) = self.adder.as_mut() {
            return adder.next(party, products);
        }
        match (products, self.comps.take()) {
            (Products::Start, Some(comps)) => {
                // Carry c_{w−1} would land in bit w: not needed.
                let (gates, sum) = csa_layer(&comps, self.width - 1);
                self.sum = sum;
                let [_, _, x2] = comps;
                self.x2 = x2;
                Ok(ProgramStep::Gates(Gates::And(gates)))
            }
            (Products::And(maj), None) => {
                // Carries c_k = maj_k; the second operand is 2c mod 2^w.
                let len = self.sum.first().map_or(0, BitSliced::len);
                let mut shifted = vec![BitSliced::zeros(len)];
                for k in 0..self.width - 1 {
                    let m = maj.get(k).ok_or(MpcError::OutOfStep("a2b"))?;
                    shifted.push(m.xor_same(&self.x2[k]));
                }
                let mut adder = AdderProgram::new(std::mem::take(&mut self.sum), shifted)?;
                let step = adder.next(party, Products::Start)?;
                self.adder = Some(adder);
                Ok(step)
            }
            _ => Err(MpcError::OutOfStep("a2b")),
        }
    }
}

/// A node of the carry tree: the group generate G and, unless the group starts at the lowest
/// position, the group propagate P.
#[derive(Clone, Debug)]
struct Node {
    g: BitSliced,
    p: Option<BitSliced>,
}

/// Carry into bit `top` of x + y for two binary-shared operands given as bit planes
/// ([TACEO24] §2.2): the generate bits g_k = x_k ∧ y_k of positions `first..top` (1 round)
/// reduced by a binary tree of (G, P) ∘ (G', P') = (G ⊕ P∧G', P∧P') in
/// ⌈log2(top − first)⌉ rounds. The caller guarantees that no carry arises below `first`
/// (e.g. y is zero there). Output: the carry into bit `top`.
#[derive(Debug)]
pub struct OperandCarryProgram {
    x: Vec<BitSliced>,
    y: Vec<BitSliced>,
    /// p_k = x_k ⊕ y_k for positions first+1..top (the lowest group needs none).
    p: Vec<BitSliced>,
    first: usize,
    top: usize,
    len: usize,
    nodes: Vec<Node>,
    phase: u8,
}

impl OperandCarryProgram {
    /// The carry into bit `top` of `x + y` (planes least significant first, at least `top`
    /// of each, all of one length), generating from position `first` on.
    pub fn new(
        x: Vec<BitSliced>,
        y: Vec<BitSliced>,
        first: usize,
        top: usize,
    ) -> Result<Self, MpcError> {
        if x.len() < top || y.len() < top || first > top {
            return Err(MpcError::InvalidInput(
                "operand carry: need first <= top <= planes of each operand",
            ));
        }
        let len = planes_len(&x)?;
        if planes_len(&y)? != len {
            return Err(MpcError::LengthMismatch {
                what: "carry operands",
                left: len,
                right: planes_len(&y)?,
            });
        }
        Ok(Self {
            x,
            y,
            p: Vec::new(),
            first,
            top,
            len,
            nodes: Vec::new(),
            phase: 0,
        })
    }

    /// The AND gates of one tree level, over pairs (lo, hi) of adjacent nodes. The planes that
    /// are gate inputs only (lo's g and p, hi's p) move into the gates, emptied where they
    /// stand; the next level reads hi's g and whether lo had a p, which stay. p_hi, an input of
    /// two gates, is copied once.
    fn tree_gates(&mut self) -> Result<Gates, MpcError> {
        let mut pairs = Vec::new();
        for chunk in self.nodes.chunks_exact_mut(2) {
            let [lo, hi] = chunk else {
                unreachable!("chunks_exact_mut(2) yields pairs")
            };
            let p_hi = hi.p.take().ok_or(MpcError::OutOfStep("carry tree"))?;
            let g_lo = std::mem::take(&mut lo.g);
            match lo.p.as_mut() {
                Some(p_lo) => {
                    pairs.push((p_hi.clone(), g_lo));
                    pairs.push((p_hi, std::mem::take(p_lo)));
                }
                None => pairs.push((p_hi, g_lo)),
            }
        }
        Ok(Gates::And(pairs))
    }

    fn tree_step(&mut self) -> Result<ProgramStep<BitSliced>, MpcError> {
        if self.nodes.len() <= 1 {
            self.phase = 9;
            let carry = self
                .nodes
                .pop()
                .map_or_else(|| BitSliced::zeros(self.len), |n| n.g);
            return Ok(ProgramStep::Done(carry));
        }
        Ok(ProgramStep::Gates(self.tree_gates()?))
    }
}

impl Program for OperandCarryProgram {
    type Output = BitSliced;

    fn next(
        &mut self,
        _party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<BitSliced>, MpcError> {
        match (self.phase, products) {
            (0, Products::Start) => {
                if self.first >= self.top {
                    self.phase = 9;
                    return Ok(ProgramStep::Done(BitSliced::zeros(self.len)));
                }
                // The operands are needed once more, for p: compute it, then move them.
                self.p = (self.first + 1..self.top)
                    .map(|k| self.x[k].xor_same(&self.y[k]))
                    .collect();
                let (x, y) = (std::mem::take(&mut self.x), std::mem::take(&mut self.y));
                let pairs = x
                    .into_iter()
                    .zip(y)
                    .take(self.top)
                    .skip(self.first)
                    .collect();
                self.phase = 1;
                Ok(ProgramStep::Gates(Gates::And(pairs)))
            }
            (1, Products::And(g)) if g.len() == self.top - self.first => {
                let mut p = std::mem::take(&mut self.p).into_iter();
                self.nodes = g
                    .into_iter()
                    .enumerate()
                    .map(|(i, g)| Node {
                        g,
                        p: if i > 0 { p.next() } else { None },
                    })
                    .collect();
                self.phase = 2;
                self.tree_step()
            }
            (2, Products::And(out)) => {
                let mut it = out.into_iter();
                let mut next = Vec::with_capacity(self.nodes.len().div_ceil(2));
                for chunk in self.nodes.chunks(2) {
                    if let [lo, hi] = chunk {
                        let pg = it.next().ok_or(MpcError::OutOfStep("carry tree"))?;
                        let p = if lo.p.is_some() {
                            Some(it.next().ok_or(MpcError::OutOfStep("carry tree"))?)
                        } else {
                            None
                        };
                        next.push(Node {
                            g: hi.g.xor_same(&pg),
                            p,
                        });
                    } else {
                        next.push(chunk[0].clone());
                    }
                }
                self.nodes = next;
                self.tree_step()
            }
            _ => Err(MpcError::OutOfStep("carry")),
        }
    }
}

/// Two AND-gate programs run side by side in the same rounds: each round's message carries
/// the first program's gates, then the second's. One that finishes first keeps its output
/// until the other is done. Rounds: the larger of the two. Programs that ask for arithmetic
/// products ([`Gates::Mul`]) are refused.
pub struct BothProgram<A: Program, B: Program> {
    first: Side<A>,
    second: Side<B>,
    /// Gates of the first program in the batch in flight.
    split: usize,
}

enum Side<P: Program> {
    Running(P),
    Finished(Option<P::Output>),
}

impl<P: Program> Side<P> {
    /// Advances this side with its products (if it is running); its next AND gates, if any.
    fn advance(
        &mut self,
        party: PartyIndex,
        products: Option<Products>,
    ) -> Result<Vec<(BitSliced, BitSliced)>, MpcError> {
        let Side::Running(program) = self else {
            return Ok(Vec::new());
        };
        let products = products.ok_or(MpcError::OutOfStep("both programs"))?;
        match program.next(party, products)? {
            ProgramStep::Gates(Gates::And(pairs)) => Ok(pairs),
            ProgramStep::Gates(Gates::Mul(_)) => Err(MpcError::InvalidInput(
                "programs run side by side must use AND gates only",
            )),
            ProgramStep::Done(out) => {
                *self = Side::Finished(Some(out));
                Ok(Vec::new())
            }
        }
    }

    fn running(&self) -> bool {
        matches!(self, Side::Running(_))
    }

    fn take(&mut self) -> Option<P::Output> {
        match self {
            Side::Finished(out) => out.take(),
            Side::Running(_) => None,
        }
    }
}

impl<A: Program, B: Program> std::fmt::Debug for BothProgram<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BothProgram(running: {}, {}; <redacted>)",
            self.first.running(),
            self.second.running()
        )
    }
}

impl<A: Program, B: Program> BothProgram<A, B> {
    /// `first` and `second` side by side.
    pub fn new(first: A, second: B) -> Self {
        Self {
            first: Side::Running(first),
            second: Side::Running(second),
            split: 0,
        }
    }
}

impl<A: Program, B: Program> Program for BothProgram<A, B> {
    type Output = (A::Output, B::Output);

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        let (for_first, for_second) = match products {
            Products::Start => (Some(Products::Start), Some(Products::Start)),
            Products::And(mut out) if out.len() >= self.split => {
                let rest = out.split_off(self.split);
                (
                    self.first.running().then_some(Products::And(out)),
                    self.second.running().then_some(Products::And(rest)),
                )
            }
            _ => return Err(MpcError::OutOfStep("both programs")),
        };
        let mut gates = self.first.advance(party, for_first)?;
        self.split = gates.len();
        gates.extend(self.second.advance(party, for_second)?);
        if !gates.is_empty() {
            return Ok(ProgramStep::Gates(Gates::And(gates)));
        }
        if self.first.running() || self.second.running() {
            // A running program asked for an empty round: not a shape this combinator keeps.
            return Err(MpcError::OutOfStep("both programs"));
        }
        match (self.first.take(), self.second.take()) {
            (Some(a), Some(b)) => Ok(ProgramStep::Done((a, b))),
            _ => Err(MpcError::OutOfStep("both programs")),
        }
    }
}

/// Carry into bit t of x = x0 + x1 + x2 (replicated Z_2^w values), [BGK+24] §5 / [TACEO24] §2.2
/// MSB extraction: a carry-save layer (1 round) gives x = s + 2c; the carry into bit t of
/// s + 2c is found by [`OperandCarryProgram`] from position 1 (position 0 never generates
/// since bit 0 of 2c is 0) in 1 + ⌈log2(t−1)⌉ rounds. Output: (s planes, c planes, carry into
/// bit t). 7 rounds for t = 31.
#[derive(Debug)]
pub struct CarryProgram {
    top: usize,
    comps: Option<[Vec<BitSliced>; 3]>,
    x2: Vec<BitSliced>,
    s: Vec<BitSliced>,
    c: Vec<BitSliced>,
    tree: Option<OperandCarryProgram>,
}

/// The output of [`CarryProgram`]: sum and carry planes of the carry-save layer and the carry
/// into the requested bit.
#[derive(Clone, Debug)]
pub struct CarryOutput {
    /// Planes of s = x0 ⊕ x1 ⊕ x2 (w planes).
    pub s: Vec<BitSliced>,
    /// Planes c_0 .. c_{t−1} of c = maj(x0, x1, x2) (t planes); x = s + 2c.
    pub c: Vec<BitSliced>,
    /// The carry into bit t of s + 2c.
    pub carry: BitSliced,
}

impl CarryProgram {
    /// The carry into bit `top` of the sum of the three components of `values`, read as
    /// `width`-bit numbers (1 ≤ top ≤ width ≤ 32; `top == width` gives the carry out).
    pub fn new(
        values: &[ReplicatedShare<Z32>],
        width: usize,
        top: usize,
        party: PartyIndex,
    ) -> Result<Self, MpcError> {
        if !(1..=32).contains(&width) || !(1..=width).contains(&top) {
            return Err(MpcError::InvalidInput(
                "carry: need 1 <= top <= width <= 32",
            ));
        }
        Ok(Self {
            top,
            comps: Some(component_planes(values, width, party)),
            x2: Vec::new(),
            s: Vec::new(),
            c: Vec::new(),
            tree: None,
        })
    }

    fn output(&mut self, carry: BitSliced) -> ProgramStep<CarryOutput> {
        ProgramStep::Done(CarryOutput {
            s: std::mem::take(&mut self.s),
            c: std::mem::take(&mut self.c),
            carry,
        })
    }

    fn tree_next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<CarryOutput>, MpcError> {
        let tree = self.tree.as_mut().ok_or(MpcError::OutOfStep("carry"))?;
        match tree.next(party, products)? {
            ProgramStep::Gates(g) => Ok(ProgramStep::Gates(g)),
            ProgramStep::Done(carry) => {
                self.tree = None;
                Ok(self.output(carry))
            }
        }
    }
}

impl Program for CarryProgram {
    type Output = CarryOutput;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        if self.tree.is_some() {
            return self.tree_next(party, products);
        }
        match (products, self.comps.take()) {
            (Products::Start, Some(comps)) => {
                // Only c_0 .. c_{top−1} reach bits ≤ top of s + 2c.
                let (gates, s) = csa_layer(&comps, self.top);
                self.s = s;
                let [_, _, x2] = comps;
                self.x2 = x2;
                Ok(ProgramStep::Gates(Gates::And(gates)))
            }
            (Products::And(maj), None) if maj.len() == self.top && self.s.len() >= self.top => {
                self.c = maj
                    .iter()
                    .zip(&self.x2)
                    .map(|(m, x2)| m.xor_same(x2))
                    .collect();
                // Operands s and 2c: (2c)_k = c_{k−1}; (2c)_0 = 0 is never read (first = 1).
                let len = self.s.first().map_or(0, BitSliced::len);
                let mut shifted = Vec::with_capacity(self.top);
                shifted.push(BitSliced::zeros(len));
                shifted.extend(self.c[..self.top - 1].iter().cloned());
                let x = self.s[..self.top].to_vec();
                self.tree = Some(OperandCarryProgram::new(
                    x,
                    shifted,
                    1.min(self.top),
                    self.top,
                )?);
                self.tree_next(party, Products::Start)
            }
            _ => Err(MpcError::OutOfStep("carry")),
        }
    }
}

/// An in-process 3-party driver for tests and benchmarks: runs the three parties' sessions and
/// routes every message to its recipient.
pub mod testing {
    use super::*;

    /// Statistics of one driven run.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RunStats {
        /// Number of communication rounds.
        pub rounds: u32,
        /// Bytes sent by each party (all rounds).
        pub bytes_sent: [usize; 3],
    }

    /// The contexts of P0, P1, P2 for one session, with pairwise PRFs derived from `seed`
    /// (k_{01}, k_{12}, k_{20}).
    pub fn contexts(seed: u8, session: [u8; 16]) -> [MpcContext; 3] {
        let prf = |i: u8| PairwisePrf::from_seed([seed.wrapping_mul(3).wrapping_add(i); 32]);
        // prfs[i] is shared by P_i and P_{i+1}.
        let prfs = [prf(0), prf(1), prf(2)];
        PartyIndex::ALL.map(|p| {
            MpcContext::new(
                p,
                session,
                prfs[p.as_usize()].clone(),
                prfs[p.prev().as_usize()].clone(),
            )
        })
    }

    /// Starts the three programs and runs them to completion, delivering each party's message
    /// to its recipient every round.
    pub fn run<P: Program>(
        ctxs: &[MpcContext; 3],
        label: &[u8],
        programs: [P; 3],
    ) -> Result<([P::Output; 3], RunStats), MpcError> {
        run_with_transcript(ctxs, label, programs).map(|(out, stats, _)| (out, stats))
    }

    /// Every round's messages, indexed by sender.
    pub type Transcript = Vec<[Vec<u8>; 3]>;

    /// As [`run`], also returning every round's messages (indexed by sender), for tests of
    /// what each party sees.
    pub fn run_with_transcript<P: Program>(
        ctxs: &[MpcContext; 3],
        label: &[u8],
        programs: [P; 3],
    ) -> Result<([P::Output; 3], RunStats, Transcript), MpcError> {
        let mut transcript = Vec::new();
        let [p0, p1, p2] = programs;
        let mut steps = [
            Session::start(&ctxs[0], label, p0)?,
            Session::start(&ctxs[1], label, p1)?,
            Session::start(&ctxs[2], label, p2)?,
        ];
        let mut stats = RunStats::default();
        loop {
            match steps {
                [Step::Done(a), Step::Done(b), Step::Done(c)] => {
                    return Ok(([a, b, c], stats, transcript))
                }
                [Step::Send(s0, m0), Step::Send(s1, m1), Step::Send(s2, m2)] => {
                    stats.rounds += 1;
                    let msgs = [m0, m1, m2];
                    for (i, m) in msgs.iter().enumerate() {
                        stats.bytes_sent[i] += m.payload.len();
                    }
                    // Each party i receives the message addressed to it.
                    let find = |to: usize| -> Result<(PartyIndex, &[u8]), MpcError> {
                        msgs.iter()
                            .enumerate()
                            .find(|(_, m)| m.to.as_usize() == to)
                            .map(|(i, m)| (PartyIndex::ALL[i], m.payload.as_slice()))
                            .ok_or(MpcError::OutOfStep("no message for a party"))
                    };
                    transcript.push([0, 1, 2].map(|i| msgs[i].payload.clone()));
                    let (f0, d0) = find(0)?;
                    let (f1, d1) = find(1)?;
                    let (f2, d2) = find(2)?;
                    steps = [
                        s0.receive(f0, d0)?,
                        s1.receive(f1, d1)?,
                        s2.receive(f2, d2)?,
                    ];
                }
                _ => return Err(MpcError::OutOfStep("parties finished in different rounds")),
            }
        }
    }

    /// Replicated Z_2^32 shares of `values` for the three parties (fresh random components).
    pub fn share_u32<R: rand_core::RngCore + ?Sized>(
        values: &[u32],
        rng: &mut R,
    ) -> [Vec<ReplicatedShare<Z32>>; 3] {
        let mut out: [Vec<ReplicatedShare<Z32>>; 3] = Default::default();
        for &v in values {
            let s = crate::iris::sharing::replicated::share(Wrapping(v), rng);
            for i in 0..3 {
                out[i].push(s[i]);
            }
        }
        out
    }

    /// Reconstructs the planes of a bit-sliced number from the three parties' planes.
    pub fn reconstruct_planes(
        planes: &[Vec<BitSliced>; 3],
        len: usize,
    ) -> Result<Vec<u32>, MpcError> {
        let mut opened = Vec::new();
        for k in 0..planes[0].len() {
            let get = |i: usize| -> Result<BitSliced, MpcError> {
                planes[i]
                    .get(k)
                    .cloned()
                    .ok_or(MpcError::InvalidInput("ragged planes"))
            };
            opened.push(reconstruct_bits(&[get(0)?, get(1)?, get(2)?])?);
        }
        Ok(from_bit_planes(&opened, len))
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    fn random_bits(rng: &mut ChaCha20Rng, len: usize) -> Vec<u64> {
        let mut w: Vec<u64> = (0..words_for(len)).map(|_| rng.gen()).collect();
        clear_padding(&mut w, len);
        w
    }

    #[test]
    fn pack_unpack_and_planes_round_trip() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let bits: Vec<bool> = (0..200).map(|_| rng.gen()).collect();
        assert_eq!(unpack_bits(&pack_bits(&bits), 200), bits);
        let vals: Vec<u32> = (0..130).map(|_| rng.gen()).collect();
        assert_eq!(from_bit_planes(&bit_planes(&vals, 32), 130), vals);
    }

    #[test]
    fn dispatched_transposition_equals_the_portable_one() {
        let mut rng = ChaCha20Rng::seed_from_u64(77);
        for len in (0..200).chain([1000, 4097]) {
            let vals: Vec<u32> = (0..len)
                .map(|_| rand_core::RngCore::next_u32(&mut rng))
                .collect();
            for width in [1, 2, 16, 31, 32] {
                let mut portable = vec![vec![0u64; words_for(len)]; width];
                bit_planes_portable(&vals, &mut portable);
                assert_eq!(
                    bit_planes(&vals, width),
                    portable,
                    "len {len}, width {width}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn local_ops_match_plaintext(len in 0usize..300, seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let x = random_bits(&mut rng, len);
            let y = random_bits(&mut rng, len);
            let c = random_bits(&mut rng, len);
            let sx = share_bits(&x, len, &mut rng).unwrap();
            let sy = share_bits(&y, len, &mut rng).unwrap();
            let xor: [BitSliced; 3] = [0, 1, 2].map(|i| sx[i].xor(&sy[i]).unwrap());
            let not = [0, 1, 2].map(|i| sx[i].not(P[i]));
            let xc = [0, 1, 2].map(|i| sx[i].xor_public(&c, P[i]).unwrap());
            let ac = [0, 1, 2].map(|i| sx[i].and_public(&c).unwrap());
            let mut notx: Vec<u64> = x.iter().map(|w| !w).collect();
            clear_padding(&mut notx, len);
            prop_assert_eq!(reconstruct_bits(&xor).unwrap(), x.iter().zip(&y).map(|(a, b)| a ^ b).collect::<Vec<_>>());
            prop_assert_eq!(reconstruct_bits(&not).unwrap(), notx);
            prop_assert_eq!(reconstruct_bits(&xc).unwrap(), x.iter().zip(&c).map(|(a, b)| a ^ b).collect::<Vec<_>>());
            prop_assert_eq!(reconstruct_bits(&ac).unwrap(), x.iter().zip(&c).map(|(a, b)| a & b).collect::<Vec<_>>());
        }

        #[test]
        fn slice_and_concat(len in 1usize..300, seed: u64, cut in 0usize..300) {
            let cut = cut % (len + 1);
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let x = random_bits(&mut rng, len);
            let sx = share_bits(&x, len, &mut rng).unwrap();
            let lo = [0, 1, 2].map(|i| sx[i].slice(0, cut).unwrap());
            let hi = [0, 1, 2].map(|i| sx[i].slice(cut, len - cut).unwrap());
            let bits = unpack_bits(&x, len);
            prop_assert_eq!(unpack_bits(&reconstruct_bits(&lo).unwrap(), cut), bits[..cut].to_vec());
            prop_assert_eq!(unpack_bits(&reconstruct_bits(&hi).unwrap(), len - cut), bits[cut..].to_vec());
            let joined = [0, 1, 2].map(|i| lo[i].concat(&hi[i]));
            prop_assert_eq!(&joined, &sx);
        }

        #[test]
        fn and_gate_matches_plaintext(len in 0usize..500, seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let x = random_bits(&mut rng, len);
            let y = random_bits(&mut rng, len);
            let sx = share_bits(&x, len, &mut rng).unwrap();
            let sy = share_bits(&y, len, &mut rng).unwrap();
            let ctxs = contexts(seed as u8, [7; 16]);
            let progs = [0, 1, 2].map(|i| AndProgram::new(vec![sx[i].clone(), sy[i].clone()], vec![sy[i].clone(), sy[i].clone()]).unwrap());
            let (out, stats) = run(&ctxs, b"and", progs).unwrap();
            prop_assert_eq!(stats.rounds, 1);
            let and = [0, 1, 2].map(|i| out[i][0].clone());
            let yy = [0, 1, 2].map(|i| out[i][1].clone());
            prop_assert_eq!(reconstruct_bits(&and).unwrap(), x.iter().zip(&y).map(|(a, b)| a & b).collect::<Vec<_>>());
            prop_assert_eq!(reconstruct_bits(&yy).unwrap(), y);
        }

        #[test]
        fn two_adders_side_by_side_match_plaintext(w1 in 2usize..=32, w2 in 2usize..=32, n in 0usize..100, seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let mask = |w: usize| if w == 32 { u32::MAX } else { (1u32 << w) - 1 };
            let values = |w: usize, rng: &mut ChaCha20Rng| -> Vec<u32> { (0..n).map(|_| rng.gen::<u32>() & mask(w)).collect() };
            let share_planes = |vals: &[u32], w: usize, rng: &mut ChaCha20Rng| -> [Vec<BitSliced>; 3] {
                let mut out: [Vec<BitSliced>; 3] = Default::default();
                for plane in bit_planes(vals, w) {
                    let s = share_bits(&plane, n, rng).unwrap();
                    for i in 0..3 { out[i].push(s[i].clone()); }
                }
                out
            };
            let (x1, y1, x2, y2) = (values(w1, &mut rng), values(w1, &mut rng), values(w2, &mut rng), values(w2, &mut rng));
            let (sx1, sy1) = (share_planes(&x1, w1, &mut rng), share_planes(&y1, w1, &mut rng));
            let (sx2, sy2) = (share_planes(&x2, w2, &mut rng), share_planes(&y2, w2, &mut rng));
            let progs = [0, 1, 2].map(|i| BothProgram::new(
                AdderProgram::new(sx1[i].clone(), sy1[i].clone()).unwrap(),
                AdderProgram::new(sx2[i].clone(), sy2[i].clone()).unwrap(),
            ));
            let (out, stats) = run(&contexts(5, [2; 16]), b"both", progs).unwrap();
            let rounds = |w: usize| 1 + (w - 1).next_power_of_two().trailing_zeros();
            prop_assert_eq!(stats.rounds, rounds(w1).max(rounds(w2)));
            let [o0, o1, o2] = out;
            let first = reconstruct_planes(&[o0.0, o1.0, o2.0], n).unwrap();
            let second = reconstruct_planes(&[o0.1, o1.1, o2.1], n).unwrap();
            prop_assert_eq!(first, x1.iter().zip(&y1).map(|(a, b)| a.wrapping_add(*b) & mask(w1)).collect::<Vec<_>>());
            prop_assert_eq!(second, x2.iter().zip(&y2).map(|(a, b)| a.wrapping_add(*b) & mask(w2)).collect::<Vec<_>>());
        }

        #[test]
        fn operand_carry_matches_plaintext(top in 1usize..=32, first_raw in 0usize..32, n in 0usize..100, seed: u64) {
            let first = first_raw.min(top);
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let low = |v: u32| if first == 0 { v } else { v & !((1u32 << first) - 1) };
            let xs: Vec<u32> = (0..n).map(|_| rng.gen::<u32>()).collect();
            // y is zero below `first`, as the program requires.
            let ys: Vec<u32> = (0..n).map(|_| low(rng.gen::<u32>())).collect();
            let share_planes = |vals: &[u32], rng: &mut ChaCha20Rng| -> [Vec<BitSliced>; 3] {
                let mut out: [Vec<BitSliced>; 3] = Default::default();
                for plane in bit_planes(vals, 32) {
                    let s = share_bits(&plane, n, rng).unwrap();
                    for i in 0..3 { out[i].push(s[i].clone()); }
                }
                out
            };
            let (sx, sy) = (share_planes(&xs, &mut rng), share_planes(&ys, &mut rng));
            let progs = [0, 1, 2].map(|i| OperandCarryProgram::new(sx[i].clone(), sy[i].clone(), first, top).unwrap());
            let (out, stats) = run(&contexts(6, [3; 16]), b"carry2", progs).unwrap();
            let nodes = top - first;
            let want_rounds = if nodes == 0 { 0 } else { 1 + (nodes as u32).next_power_of_two().trailing_zeros() };
            prop_assert_eq!(stats.rounds, want_rounds);
            let got = unpack_bits(&reconstruct_bits(&out).unwrap(), n);
            for k in 0..n {
                let m = if top == 32 { u64::MAX } else { (1u64 << top) - 1 };
                let sum = (u64::from(xs[k]) & m) + (u64::from(ys[k]) & m);
                prop_assert_eq!(got[k], (sum >> top) & 1 == 1, "x {} y {} top {}", xs[k], ys[k], top);
            }
        }

        #[test]
        fn adder_matches_plaintext(width in 0usize..=32, n in 0usize..150, seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let mask = if width == 32 { u32::MAX } else { (1u32 << width) - 1 };
            let xs: Vec<u32> = (0..n).map(|_| rng.gen::<u32>() & mask).collect();
            let ys: Vec<u32> = (0..n).map(|_| rng.gen::<u32>() & mask).collect();
            let share_planes = |vals: &[u32], rng: &mut ChaCha20Rng| -> [Vec<BitSliced>; 3] {
                let mut out: [Vec<BitSliced>; 3] = Default::default();
                for plane in bit_planes(vals, width) {
                    let s = share_bits(&plane, n, rng).unwrap();
                    for i in 0..3 { out[i].push(s[i].clone()); }
                }
                out
            };
            let sx = share_planes(&xs, &mut rng);
            let sy = share_planes(&ys, &mut rng);
            let progs = [0, 1, 2].map(|i| AdderProgram::new(sx[i].clone(), sy[i].clone()).unwrap());
            let (out, stats) = run(&contexts(3, [1; 16]), b"add", progs).unwrap();
            let expected_rounds = if width <= 1 { 0 } else { 1 + (width - 1).next_power_of_two().trailing_zeros() };
            prop_assert_eq!(stats.rounds, expected_rounds);
            let sum = reconstruct_planes(&out, n).unwrap();
            let want: Vec<u32> = xs.iter().zip(&ys).map(|(a, b)| a.wrapping_add(*b) & mask).collect();
            prop_assert_eq!(sum, want);
        }

        #[test]
        fn a2b_matches_plaintext(width in 1usize..=32, n in 0usize..150, seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let vals: Vec<u32> = (0..n).map(|_| rng.gen()).collect();
            let shares = share_u32(&vals, &mut rng);
            let progs = [0, 1, 2].map(|i| A2bProgram::new(&shares[i], width, P[i]).unwrap());
            let (out, stats) = run(&contexts(4, [2; 16]), b"a2b", progs).unwrap();
            let mask = if width == 32 { u32::MAX } else { (1u32 << width) - 1 };
            let expected_rounds = 1 + if width <= 1 { 0 } else { 1 + (width - 1).next_power_of_two().trailing_zeros() };
            prop_assert_eq!(stats.rounds, expected_rounds);
            prop_assert_eq!(reconstruct_planes(&out, n).unwrap(), vals.iter().map(|v| v & mask).collect::<Vec<_>>());
        }

        #[test]
        fn carry_matches_plaintext(width in 1usize..=32, top in 1usize..=32, n in 0usize..150, seed: u64) {
            let top = top.min(width);
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let vals: Vec<u32> = (0..n).map(|_| rng.gen()).collect();
            let shares = share_u32(&vals, &mut rng);
            let progs = [0, 1, 2].map(|i| CarryProgram::new(&shares[i], width, top, P[i]).unwrap());
            let (out, _) = run(&contexts(5, [3; 16]), b"carry", progs).unwrap();
            let carry = reconstruct_bits(&[0, 1, 2].map(|i| out[i].carry.clone())).unwrap();
            let wmask = if width == 32 { u64::from(u32::MAX) } else { (1u64 << width) - 1 };
            let want: Vec<bool> = (0..n).map(|k| {
                // s + 2c with s, c the carry-save words; carry into bit `top`.
                let comp: Vec<u64> = (0..3).map(|j| u64::from(shares[j][k].a.0) & wmask).collect();
                let s = comp[0] ^ comp[1] ^ comp[2];
                let c = (comp[0] & comp[1]) | (comp[0] & comp[2]) | (comp[1] & comp[2]);
                let tmask = (1u64 << top) - 1;
                let low = (s & tmask) + ((c << 1) & tmask);
                (low >> top) & 1 == 1
            }).collect();
            prop_assert_eq!(unpack_bits(&carry, n), want);
        }
    }

    #[test]
    fn open_to_entitled_parties() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let x = random_bits(&mut rng, 100);
        let sx = share_bits(&x, 100, &mut rng).unwrap();
        let msgs = [0, 1, 2].map(|i| open_message(P[i], &sx[i], &[P[1]]));
        assert!(msgs[1].is_none() && msgs[2].is_none());
        let m = msgs[0].clone().unwrap();
        assert_eq!(m.to, P[1]);
        assert_eq!(open_receive(P[1], &sx[1], P[0], &m.payload).unwrap(), x);
        assert!(matches!(
            open_receive(P[1], &sx[1], P[2], &m.payload),
            Err(MpcError::WrongSender { .. })
        ));
        assert!(matches!(
            open_receive(P[1], &sx[1], P[0], &m.payload[1..]),
            Err(MpcError::WrongLength { .. })
        ));
        let all = [0, 1, 2].map(|i| open_message(P[i], &sx[i], &P).unwrap());
        for i in 0..3 {
            let from = P[i].prev();
            let got = open_receive(P[i], &sx[i], from, &all[from.as_usize()].payload).unwrap();
            assert_eq!(got, x);
        }
    }

    #[test]
    fn wrong_sender_or_length_is_rejected() {
        let ctxs = contexts(9, [4; 16]);
        let s = BitSliced::zeros(70);
        let start = Session::start(
            &ctxs[1],
            b"x",
            AndProgram::new(vec![s.clone()], vec![s]).unwrap(),
        )
        .unwrap();
        let Step::Send(state, out) = start else {
            panic!("expected a message")
        };
        assert_eq!(out.to, P[2]);
        assert_eq!(out.payload.len(), 16);
        assert!(matches!(
            state.receive(P[2], &[0; 16]),
            Err(MpcError::WrongSender { .. })
        ));
        let s = BitSliced::zeros(70);
        let Step::Send(state, _) = Session::start(
            &ctxs[1],
            b"x",
            AndProgram::new(vec![s.clone()], vec![s]).unwrap(),
        )
        .unwrap() else {
            panic!()
        };
        assert!(matches!(
            state.receive(P[0], &[0; 15]),
            Err(MpcError::WrongLength { .. })
        ));
        assert!(AndProgram::new(vec![BitSliced::zeros(3)], vec![BitSliced::zeros(4)]).is_err());
        assert!(BitSliced::from_words(65, vec![0], vec![0]).is_err());
    }

    #[test]
    fn and_messages_do_not_depend_on_the_inputs() {
        // Same session, different secrets: P0's message is uniformly masked by the zero share;
        // a zero input and a one input give messages that differ only through the mask, so
        // check that the message for all-zero inputs is not itself zero (masking happens).
        let ctxs = contexts(2, [5; 16]);
        let z = BitSliced::zeros(256);
        let Step::Send(_, out) = Session::start(
            &ctxs[0],
            b"m",
            AndProgram::new(vec![z.clone()], vec![z]).unwrap(),
        )
        .unwrap() else {
            panic!()
        };
        assert!(out.payload.iter().any(|&b| b != 0));
    }
}
