//! # Distributed comparison function (BCG+21 Fig. 1)
//!
//! Gen^<_n(α, β) → (k_0, k_1) and Eval^<_n(b, k_b, x) → V_b with
//! V_0 + V_1 = β if x < α else 0 (mod 2^32), for n-bit unsigned x and α (bits MSB first,
//! 1 ≤ n ≤ 32). The PRG and the key layout are described in [`crate::crypto::fss`].
//!
//! Evaluation walks the path of x: per level one MMO block for the taken child's seed and
//! control bit, one for its value word, i.e. 2 AES blocks. [`eval_batch`] evaluates many keys
//! in lockstep so that every level has 16 independent AES blocks in flight.

use rand_core::{CryptoRng, RngCore};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::aes::{backend, Backend, PortablePrp, Prp, C_LEFT, C_RIGHT, C_VALUE};
use super::{check_party, domain_mask, FssError};

/// The largest supported input bit length n.
pub const MAX_BITS: u32 = 32;

/// First byte of an encoded DCF key: format DCF, version 1.
pub const DCF_KEY_TAG: u8 = 0x01;

/// Length in bytes of an encoded DCF key with n-bit inputs: 2 header bytes, the 16-byte root
/// seed, n correction words of 20 bytes and the 4-byte CW^(n+1).
pub const fn dcf_key_len(n: u32) -> usize {
    22 + 20 * n as usize
}

/// Length of an encoded DCF key for n = 32 (the production size): 662 bytes.
pub const DCF_KEY_LEN: usize = dcf_key_len(MAX_BITS);

/// Keys per block of the batch layout ([`DcfKeyBatch`]): correction words of 4 consecutive
/// keys are interleaved level by level.
pub const GROUP: usize = 4;

/// Seeds are 126-bit: the two low bits of a block are cleared (they carry t^L / t^R).
pub(crate) const SEED_MASK: u128 = !3;

/// One party's DCF key (BCG+21 Fig. 1, Gen^< step 18: k_b = s_b^(0) ‖ CW^(1) ‖ … ‖ CW^(n+1)).
/// Zeroised on drop. `Debug` prints only n.
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop)]
pub struct DcfKey {
    n: u32,
    /// s_b^(0), two low bits zero.
    s0: u128,
    /// s_CW of level i, with t_CW^L in bit 0 and t_CW^R in bit 1 (levels ≥ n are zero).
    cw_seed: [u128; MAX_BITS as usize],
    /// V_CW of level i.
    cw_value: [u32; MAX_BITS as usize],
    /// CW^(n+1).
    cw_last: u32,
}

impl std::fmt::Debug for DcfKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcfKey")
            .field("n", &self.n)
            .finish_non_exhaustive()
    }
}

/// Little cursor over an encoded key; every read is bounds-checked into an error.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader {
            bytes,
            pos: 0,
            what,
        }
    }

    pub(crate) fn take<const N: usize>(&mut self) -> Result<[u8; N], FssError> {
        let end = self.pos.saturating_add(N);
        let slice = self.bytes.get(self.pos..end).ok_or(FssError::BadLength {
            what: self.what,
            expected: end,
            got: self.bytes.len(),
        })?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn skip(mut self, count: usize) -> Result<Self, FssError> {
        let end = self.pos.saturating_add(count);
        if end > self.bytes.len() {
            return Err(FssError::BadLength {
                what: self.what,
                expected: end,
                got: self.bytes.len(),
            });
        }
        self.pos = end;
        Ok(self)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FssError> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FssError> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    pub(crate) fn u128(&mut self) -> Result<u128, FssError> {
        Ok(u128::from_le_bytes(self.take()?))
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.pos..).unwrap_or(&[])
    }
}

impl DcfKey {
    fn empty(n: u32) -> Self {
        DcfKey {
            n,
            s0: 0,
            cw_seed: [0; MAX_BITS as usize],
            cw_value: [0; MAX_BITS as usize],
            cw_last: 0,
        }
    }

    /// The input bit length n.
    pub fn n(&self) -> u32 {
        self.n
    }

    /// Length of [`DcfKey::encode`]'s output, [`dcf_key_len`]`(n)`.
    pub fn encoded_len(&self) -> usize {
        dcf_key_len(self.n)
    }

    /// The key in the documented byte layout (see [`crate::crypto::fss`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the encoded key to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.push(DCF_KEY_TAG);
        out.push(self.n as u8);
        out.extend_from_slice(&self.s0.to_le_bytes());
        for i in 0..self.n as usize {
            out.extend_from_slice(&self.cw_seed[i].to_le_bytes());
            out.extend_from_slice(&self.cw_value[i].to_le_bytes());
        }
        out.extend_from_slice(&self.cw_last.to_le_bytes());
    }

    /// Checks an encoded key (tag, n ∈ 1..=32, exact length, canonical root seed) and
    /// returns its n and a reader positioned at the root seed.
    fn check_encoded(bytes: &[u8]) -> Result<(u32, Reader<'_>), FssError> {
        const WHAT: &str = "DCF key";
        let mut r = Reader::new(bytes, WHAT);
        let tag = r.u8()?;
        if tag != DCF_KEY_TAG {
            return Err(FssError::UnknownFormat { what: WHAT, tag });
        }
        let n = u32::from(r.u8()?);
        domain_mask(n)?;
        if bytes.len() != dcf_key_len(n) {
            return Err(FssError::BadLength {
                what: WHAT,
                expected: dcf_key_len(n),
                got: bytes.len(),
            });
        }
        let seed = Reader::new(bytes, WHAT).skip(2)?.u128()?;
        if seed & !SEED_MASK != 0 {
            return Err(FssError::NonCanonical(
                "DCF root seed has its low two bits set",
            ));
        }
        Ok((n, r))
    }

    /// The n of an encoded key, after all of [`DcfKey::decode`]'s checks.
    pub(crate) fn encoded_n(bytes: &[u8]) -> Result<u32, FssError> {
        Ok(Self::check_encoded(bytes)?.0)
    }

    /// Parses an encoded key, checking tag, n ∈ 1..=32, the exact length and that the root
    /// seed is canonical (low two bits zero). Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, FssError> {
        let (n, mut r) = Self::check_encoded(bytes)?;
        let mut key = DcfKey::empty(n);
        key.s0 = r.u128()?;
        for i in 0..n as usize {
            key.cw_seed[i] = r.u128()?;
            key.cw_value[i] = r.u32()?;
        }
        key.cw_last = r.u32()?;
        Ok(key)
    }

    /// The evaluation lanes of this key on the given inputs (all lanes use this key).
    pub(crate) fn lanes<const L: usize>(&self, x: [u32; L]) -> Lanes<'_, L> {
        Lanes {
            n: self.n,
            cw_seed: &self.cw_seed,
            cw_value: &self.cw_value,
            stride: 1,
            offset: [0; L],
            s0: [self.s0; L],
            last: [self.cw_last; L],
            x,
        }
    }
}

/// All ones if `bit` is 1, zero if 0.
#[inline(always)]
fn mask128(bit: u32) -> u128 {
    u128::from(bit).wrapping_neg()
}

/// x if party = 0, −x if party = 1 (BCG+21's (−1)^b factor, applied once at the end since
/// the sum is linear).
#[inline(always)]
pub(crate) fn negate_if(x: u32, party: u32) -> u32 {
    let m = party.wrapping_neg();
    (x ^ m).wrapping_sub(m)
}

/// Convert: {0,1}^λ → Z_2^32 of the leaf seed, bits 32..63 (the low two bits are always zero).
#[inline(always)]
fn convert(seed: u128) -> u32 {
    (seed >> 32) as u32
}

/// Gen^<_n(1^λ, α, β, Z_2^32) of BCG+21 Fig. 1: a pair of keys for
/// `f(x) = β if x < α else 0` on n-bit inputs. Uses the detected AES backend.
///
/// `rng` must be a cryptographically secure generator; it supplies the two root seeds (32
/// bytes per call), so a fast userspace CSPRNG seeded from the OS (e.g. `ChaCha20Rng`) is
/// the right choice for dealers generating many keys.
///
/// Errors: n not in 1..=32, or α ≥ 2^n.
pub fn gen<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    n: u32,
    alpha: u32,
    beta: u32,
) -> Result<(DcfKey, DcfKey), FssError> {
    gen_with(backend(), rng, n, alpha, beta)
}

/// [`gen`] on a chosen AES backend (for tests and benchmarks; keys are identical on every
/// backend for the same RNG output).
pub fn gen_with<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    n: u32,
    alpha: u32,
    beta: u32,
) -> Result<(DcfKey, DcfKey), FssError> {
    let backend = backend.checked()?;
    let mask = domain_mask(n)?;
    if alpha & !mask != 0 {
        return Err(FssError::OutOfDomain {
            what: "alpha",
            value: alpha,
            n,
        });
    }
    Ok(gen_unchecked(backend, rng, n, alpha, beta))
}

/// Gen^< for many (α, β) pairs at once: `out[k]` is a key pair for `f_{α_k, β_k}`. Keys are
/// generated four at a time in lockstep, so the AES pipeline sees 24 independent blocks per
/// level instead of 6; a dealer producing many keys should prefer this to [`gen`].
///
/// Errors: n not in 1..=32, or some α ≥ 2^n (nothing is generated then).
pub fn gen_batch<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    n: u32,
    alpha_beta: &[(u32, u32)],
) -> Result<Vec<(DcfKey, DcfKey)>, FssError> {
    gen_batch_with(backend(), rng, n, alpha_beta)
}

/// [`gen_batch`] on a chosen AES backend.
pub fn gen_batch_with<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    n: u32,
    alpha_beta: &[(u32, u32)],
) -> Result<Vec<(DcfKey, DcfKey)>, FssError> {
    let backend = backend.checked()?;
    let mask = domain_mask(n)?;
    if let Some(&(alpha, _)) = alpha_beta.iter().find(|(a, _)| a & !mask != 0) {
        return Err(FssError::OutOfDomain {
            what: "alpha",
            value: alpha,
            n,
        });
    }
    Ok(gen_batch_unchecked(backend, rng, n, alpha_beta))
}

/// Keys generated in lockstep by [`gen_batch`].
const GEN_LANES: usize = 4;

/// [`gen_batch_with`] without parameter checks: `backend` available, 1 ≤ n ≤ 32, α < 2^n.
pub(crate) fn gen_batch_unchecked<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    n: u32,
    alpha_beta: &[(u32, u32)],
) -> Vec<(DcfKey, DcfKey)> {
    let mut out = Vec::with_capacity(alpha_beta.len());
    gen_batch_each(backend, rng, n, alpha_beta, |_, _, k0, k1| {
        out.push((k0, k1))
    });
    out
}

/// Generates the key pair of every `alpha_beta[k]`, in order, handing each to
/// `sink(rng, k, key_0, key_1)` (so callers build their own containers without an
/// intermediate one). Same preconditions as [`gen_batch_unchecked`].
pub(crate) fn gen_batch_each<R, F>(
    backend: Backend,
    rng: &mut R,
    n: u32,
    alpha_beta: &[(u32, u32)],
    mut sink: F,
) where
    R: RngCore + CryptoRng + ?Sized,
    F: FnMut(&mut R, usize, DcfKey, DcfKey),
{
    let mut k = 0;
    let mut chunks = alpha_beta.chunks_exact(GEN_LANES);
    for chunk in &mut chunks {
        let alpha: [u32; GEN_LANES] = std::array::from_fn(|j| chunk[j].0);
        let beta: [u32; GEN_LANES] = std::array::from_fn(|j| chunk[j].1);
        for (k0, k1) in gen_lanes(backend, rng, n, &alpha, &beta) {
            sink(rng, k, k0, k1);
            k += 1;
        }
    }
    for &(alpha, beta) in chunks.remainder() {
        let [(k0, k1)] = gen_lanes(backend, rng, n, &[alpha], &[beta]);
        sink(rng, k, k0, k1);
        k += 1;
    }
}

/// [`gen_with`] without parameter checks: `backend` must be available, 1 ≤ n ≤ 32 and
/// α < 2^n.
pub(crate) fn gen_unchecked<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    n: u32,
    alpha: u32,
    beta: u32,
) -> (DcfKey, DcfKey) {
    let [pair] = gen_lanes(backend, rng, n, &[alpha], &[beta]);
    pair
}

/// K key pairs in lockstep on the given (available) backend.
fn gen_lanes<R: RngCore + CryptoRng + ?Sized, const K: usize>(
    backend: Backend,
    rng: &mut R,
    n: u32,
    alpha: &[u32; K],
    beta: &[u32; K],
) -> [(DcfKey, DcfKey); K] {
    match backend {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: callers pass Vaes only when it is available.
        Backend::Vaes => unsafe { gen_vaes(rng, n, alpha, beta) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: callers pass AesNi only when it is available.
        Backend::AesNi => unsafe { gen_ni(rng, n, alpha, beta) },
        _ => gen_keys(&PortablePrp::get(), rng, n, alpha, beta),
    }
}

/// The AES-NI Gen^< (BCG+21 Fig. 1): the same steps as [`gen_keys`] with seeds in vector
/// registers and, as in the evaluation engine, the tweaks and the MMO feed-forward folded into
/// the first and last round keys.
///
/// # Safety
/// AES-NI must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes")]
unsafe fn gen_ni<R: RngCore + CryptoRng + ?Sized, const K: usize>(
    rng: &mut R,
    n: u32,
    alpha: &[u32; K],
    beta: &[u32; K],
) -> [(DcfKey, DcfKey); K] {
    use super::aes::{ni, FIXED_ROUND_KEYS};
    use std::arch::x86_64::*;

    let rk = ni::round_keys(&FIXED_ROUND_KEYS);
    let [k0, k10] = [FIXED_ROUND_KEYS[0], FIXED_ROUND_KEYS[10]];
    // Blocks 0, 1, 2 of a party: tweaks c_L, c_R, c_V.
    let first = [C_LEFT ^ k0, C_RIGHT ^ k0, C_VALUE ^ k0].map(ni::to_m);
    let last = [C_LEFT ^ k10, C_RIGHT ^ k10, C_VALUE ^ k10].map(ni::to_m);
    let seed_mask = ni::to_m(SEED_MASK);

    let mut keys: [(DcfKey, DcfKey); K] =
        std::array::from_fn(|_| (DcfKey::empty(n), DcfKey::empty(n)));
    // Step 2: random root seeds; step 4: t_0^(0) = 0, t_1^(0) = 1.
    let mut s = [[_mm_setzero_si128(); 2]; K];
    for (sj, (key0, key1)) in s.iter_mut().zip(keys.iter_mut()) {
        let mut root = [0u8; 16];
        for (b, key) in [key0, key1].into_iter().enumerate() {
            rng.fill_bytes(&mut root);
            key.s0 = u128::from_le_bytes(root) & SEED_MASK;
            sj[b] = ni::to_m(key.s0);
        }
        root.zeroize();
    }
    let mut t = [[0u64, 1u64]; K];
    // Step 3: V_α = 0.
    let mut v_alpha = [0u32; K];
    for i in 0..n as usize {
        // Step 6: G(s_b^(i−1)) for b = 0, 1 of every key: 6·K independent blocks.
        let mut y = [[_mm_setzero_si128(); 6]; K];
        for (yj, sj) in y.iter_mut().zip(s.iter()) {
            for (c, yc) in yj.iter_mut().enumerate() {
                *yc = _mm_xor_si128(sj[c / 3], first[c % 3]);
            }
        }
        for k in &rk[1..10] {
            for yj in y.iter_mut() {
                for yc in yj.iter_mut() {
                    *yc = _mm_aesenc_si128(*yc, *k);
                }
            }
        }
        for (yj, sj) in y.iter_mut().zip(s.iter()) {
            for (c, yc) in yj.iter_mut().enumerate() {
                *yc = _mm_aesenclast_si128(*yc, _mm_xor_si128(sj[c / 3], last[c % 3]));
            }
        }
        for j in 0..K {
            let [left0, right0, val0, left1, right1, val1] = y[j];
            // Step 1: α_i, MSB first.
            let a = u64::from((alpha[j] >> (n - 1 - i as u32)) & 1);
            let am = _mm_set1_epi64x(a.wrapping_neg() as i64);
            // Step 7: Keep = R if α_i = 1 else L; Lose is the other child.
            let am_lr0 = _mm_and_si128(am, _mm_xor_si128(left0, right0));
            let am_lr1 = _mm_and_si128(am, _mm_xor_si128(left1, right1));
            let keep0 = _mm_xor_si128(left0, am_lr0);
            let keep1 = _mm_xor_si128(left1, am_lr1);
            // Step 8: s_CW = s_0^Lose ⊕ s_1^Lose.
            let lose = _mm_xor_si128(_mm_xor_si128(right0, am_lr0), _mm_xor_si128(right1, am_lr1));
            let s_cw = _mm_and_si128(lose, seed_mask);
            // Step 12: t_CW^L = t_0^L ⊕ t_1^L ⊕ α_i ⊕ 1, t_CW^R = t_0^R ⊕ t_1^R ⊕ α_i.
            let word0 = |x: __m128i| _mm_cvtsi128_si64(x) as u64;
            let t_cw_left = ((word0(left0) ^ word0(left1)) & 1) ^ a ^ 1;
            let t_cw_right = (((word0(right0) ^ word0(right1)) >> 1) & 1) ^ a;
            // Step 13: the t bits ride in s_CW's two free low bits.
            let t_bits = t_cw_left | (t_cw_right << 1);
            // v^L is word 0 of the value block, v^R word 1. Lose = L exactly when α_i = 1.
            let v0 = _mm_cvtsi128_si64(val0) as u64;
            let v1 = _mm_cvtsi128_si64(val1) as u64;
            let (lose_shift, keep_shift) = (32 * (1 - a), 32 * a);
            let t1 = t[j][1] as u32;
            let aw = a as u32;
            // Steps 9–10: V_CW = (−1)^{t_1} [v_1^Lose − v_0^Lose − V_α + 1{Lose = L}·β].
            let v_cw = negate_if(
                ((v1 >> lose_shift) as u32)
                    .wrapping_sub((v0 >> lose_shift) as u32)
                    .wrapping_sub(v_alpha[j])
                    .wrapping_add(beta[j] & aw.wrapping_neg()),
                t1,
            );
            // Step 11: V_α ← V_α − v_1^Keep + v_0^Keep + (−1)^{t_1}·V_CW.
            v_alpha[j] = v_alpha[j]
                .wrapping_sub((v1 >> keep_shift) as u32)
                .wrapping_add((v0 >> keep_shift) as u32)
                .wrapping_add(negate_if(v_cw, t1));
            let packed = ni::from_m(s_cw) | u128::from(t_bits);
            let (key0, key1) = &mut keys[j];
            key0.cw_seed[i] = packed;
            key1.cw_seed[i] = packed;
            key0.cw_value[i] = v_cw;
            key1.cw_value[i] = v_cw;
            // Steps 14–15, exactly as Eval: τ = Keep ⊕ t·packed, s = τ without the low bits,
            // t = bit α_i of τ. The seed does not wait for the t bits' scalar round trip.
            for (b, keep) in [keep0, keep1].into_iter().enumerate() {
                let t_b = t[j][b].wrapping_neg();
                let t_mask = _mm_set1_epi64x(t_b as i64);
                s[j][b] =
                    _mm_and_si128(_mm_xor_si128(keep, _mm_and_si128(s_cw, t_mask)), seed_mask);
                t[j][b] = ((word0(keep) ^ (t_bits & t_b)) >> a) & 1;
            }
        }
    }
    for j in 0..K {
        // Step 17: CW^(n+1) = (−1)^{t_1^(n)} [Convert(s_1^(n)) − Convert(s_0^(n)) − V_α].
        let conv = |x: __m128i| ((_mm_cvtsi128_si64(x) as u64) >> 32) as u32;
        let last = negate_if(
            conv(s[j][1])
                .wrapping_sub(conv(s[j][0]))
                .wrapping_sub(v_alpha[j]),
            t[j][1] as u32,
        );
        keys[j].0.cw_last = last;
        keys[j].1.cw_last = last;
        s[j] = [_mm_setzero_si128(); 2];
    }
    std::hint::black_box(&s);
    v_alpha.zeroize();
    keys
}

/// The VAES Gen^< (BCG+21 Fig. 1): as [`gen_ni`], with the two parties' seeds side by side
/// in one 256-bit register (party 0 low, party 1 high), so each AES instruction and each
/// Keep/Lose/τ step serves both parties.
///
/// # Safety
/// AES-NI, VAES and AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes,vaes,avx2")]
unsafe fn gen_vaes<R: RngCore + CryptoRng + ?Sized, const K: usize>(
    rng: &mut R,
    n: u32,
    alpha: &[u32; K],
    beta: &[u32; K],
) -> [(DcfKey, DcfKey); K] {
    use super::aes::{ni, vaes, FIXED_ROUND_KEYS};
    use std::arch::x86_64::*;

    // SAFETY: AVX2 is available (this function's contract).
    let rk = unsafe { vaes::round_keys(&FIXED_ROUND_KEYS) };
    let [k0, k10] = [FIXED_ROUND_KEYS[0], FIXED_ROUND_KEYS[10]];
    let both = |x: u128| _mm256_broadcastsi128_si256(ni::to_m(x));
    // Registers 0, 1, 2 of a key: tweaks c_L, c_R, c_V (for both parties).
    let first = [both(C_LEFT ^ k0), both(C_RIGHT ^ k0), both(C_VALUE ^ k0)];
    let last = [both(C_LEFT ^ k10), both(C_RIGHT ^ k10), both(C_VALUE ^ k10)];
    let seed_mask = both(SEED_MASK);
    let low = |x: __m256i| _mm256_castsi256_si128(x);
    let high = |x: __m256i| _mm256_extracti128_si256::<1>(x);
    let word0 = |x: __m128i| _mm_cvtsi128_si64(x) as u64;

    let mut keys: [(DcfKey, DcfKey); K] =
        std::array::from_fn(|_| (DcfKey::empty(n), DcfKey::empty(n)));
    // Step 2: random root seeds; step 4: t_0^(0) = 0, t_1^(0) = 1.
    let mut s = [_mm256_setzero_si256(); K];
    for (sj, (key0, key1)) in s.iter_mut().zip(keys.iter_mut()) {
        let mut root = [0u8; 16];
        for key in [&mut *key0, &mut *key1] {
            rng.fill_bytes(&mut root);
            key.s0 = u128::from_le_bytes(root) & SEED_MASK;
        }
        root.zeroize();
        *sj = _mm256_set_m128i(ni::to_m(key1.s0), ni::to_m(key0.s0));
    }
    let mut t = [[0u64, 1u64]; K];
    // Step 3: V_α = 0.
    let mut v_alpha = [0u32; K];
    for i in 0..n as usize {
        // Step 6: G(s_b^(i−1)) for b = 0, 1 of every key: 3·K registers, 6·K blocks.
        let mut y = [[_mm256_setzero_si256(); 3]; K];
        for (yj, sj) in y.iter_mut().zip(s.iter()) {
            for (yc, f) in yj.iter_mut().zip(first.iter()) {
                *yc = _mm256_xor_si256(*sj, *f);
            }
        }
        for k in &rk[1..10] {
            for yj in y.iter_mut() {
                for yc in yj.iter_mut() {
                    *yc = _mm256_aesenc_epi128(*yc, *k);
                }
            }
        }
        for (yj, sj) in y.iter_mut().zip(s.iter()) {
            for (yc, l) in yj.iter_mut().zip(last.iter()) {
                *yc = _mm256_aesenclast_epi128(*yc, _mm256_xor_si256(*sj, *l));
            }
        }
        for j in 0..K {
            let [left, right, val] = y[j];
            // Step 1: α_i, MSB first.
            let a = u64::from((alpha[j] >> (n - 1 - i as u32)) & 1);
            let am = _mm256_set1_epi64x(a.wrapping_neg() as i64);
            // Step 7: Keep = R if α_i = 1 else L (both parties at once); Lose the other.
            let am_lr = _mm256_and_si256(am, _mm256_xor_si256(left, right));
            let keep = _mm256_xor_si256(left, am_lr);
            let lose = _mm256_xor_si256(right, am_lr);
            // Step 8: s_CW = s_0^Lose ⊕ s_1^Lose, in both halves.
            let lose_swapped = _mm256_permute2x128_si256::<0x01>(lose, lose);
            let s_cw = _mm256_and_si256(_mm256_xor_si256(lose, lose_swapped), seed_mask);
            // Step 12: t_CW^L = t_0^L ⊕ t_1^L ⊕ α_i ⊕ 1, t_CW^R = t_0^R ⊕ t_1^R ⊕ α_i.
            let t_cw_left = ((word0(low(left)) ^ word0(high(left))) & 1) ^ a ^ 1;
            let t_cw_right = (((word0(low(right)) ^ word0(high(right))) >> 1) & 1) ^ a;
            // Step 13: the t bits ride in s_CW's two free low bits.
            let t_bits = t_cw_left | (t_cw_right << 1);
            // v^L is word 0 of the value block, v^R word 1. Lose = L exactly when α_i = 1.
            let v0 = word0(low(val));
            let v1 = word0(high(val));
            let (lose_shift, keep_shift) = (32 * (1 - a), 32 * a);
            let t1 = t[j][1] as u32;
            let aw = a as u32;
            // Steps 9–10: V_CW = (−1)^{t_1} [v_1^Lose − v_0^Lose − V_α + 1{Lose = L}·β].
            let v_cw = negate_if(
                ((v1 >> lose_shift) as u32)
                    .wrapping_sub((v0 >> lose_shift) as u32)
                    .wrapping_sub(v_alpha[j])
                    .wrapping_add(beta[j] & aw.wrapping_neg()),
                t1,
            );
            // Step 11: V_α ← V_α − v_1^Keep + v_0^Keep + (−1)^{t_1}·V_CW.
            v_alpha[j] = v_alpha[j]
                .wrapping_sub((v1 >> keep_shift) as u32)
                .wrapping_add((v0 >> keep_shift) as u32)
                .wrapping_add(negate_if(v_cw, t1));
            let packed = ni::from_m(low(s_cw)) | u128::from(t_bits);
            let (key0, key1) = &mut keys[j];
            key0.cw_seed[i] = packed;
            key1.cw_seed[i] = packed;
            key0.cw_value[i] = v_cw;
            key1.cw_value[i] = v_cw;
            // Steps 14–15, exactly as Eval: τ_b = Keep_b ⊕ t_b·packed, s_b = τ_b without the
            // low bits, t_b = bit α_i of τ_b. The seed half does not involve the t bits, so
            // it does not wait for their trip through general-purpose registers.
            let t_mask = _mm256_set_epi64x(
                t[j][1].wrapping_neg() as i64,
                t[j][1].wrapping_neg() as i64,
                t[j][0].wrapping_neg() as i64,
                t[j][0].wrapping_neg() as i64,
            );
            s[j] = _mm256_and_si256(
                _mm256_xor_si256(keep, _mm256_and_si256(s_cw, t_mask)),
                seed_mask,
            );
            let tau_low = |keep_word: u64, t_b: u64| keep_word ^ (t_bits & t_b.wrapping_neg());
            t[j] = [
                (tau_low(word0(low(keep)), t[j][0]) >> a) & 1,
                (tau_low(word0(high(keep)), t[j][1]) >> a) & 1,
            ];
        }
    }
    for j in 0..K {
        // Step 17: CW^(n+1) = (−1)^{t_1^(n)} [Convert(s_1^(n)) − Convert(s_0^(n)) − V_α].
        let conv0 = (word0(low(s[j])) >> 32) as u32;
        let conv1 = (word0(high(s[j])) >> 32) as u32;
        let last = negate_if(
            conv1.wrapping_sub(conv0).wrapping_sub(v_alpha[j]),
            t[j][1] as u32,
        );
        keys[j].0.cw_last = last;
        keys[j].1.cw_last = last;
        s[j] = _mm256_setzero_si256();
    }
    std::hint::black_box(&s);
    v_alpha.zeroize();
    keys
}

/// The body of Gen^< (BCG+21 Fig. 1) for K independent keys in lockstep, generic over the
/// AES backend. Branch-free in α, β and the seeds: the dealer's secrets do not steer control
/// flow or memory addresses.
#[inline(always)]
fn gen_keys<P: Prp, R: RngCore + CryptoRng + ?Sized, const K: usize>(
    prp: &P,
    rng: &mut R,
    n: u32,
    alpha: &[u32; K],
    beta: &[u32; K],
) -> [(DcfKey, DcfKey); K] {
    let mut keys: [(DcfKey, DcfKey); K] =
        std::array::from_fn(|_| (DcfKey::empty(n), DcfKey::empty(n)));
    // Step 2: random root seeds; step 4: t_0^(0) = 0, t_1^(0) = 1.
    let mut s = [[0u128; 2]; K];
    for (sj, (k0, k1)) in s.iter_mut().zip(keys.iter_mut()) {
        let mut root = [0u8; 16];
        for sb in sj.iter_mut() {
            rng.fill_bytes(&mut root);
            *sb = u128::from_le_bytes(root) & SEED_MASK;
        }
        root.zeroize();
        k0.s0 = sj[0];
        k1.s0 = sj[1];
    }
    let mut t = [[0u32, 1u32]; K];
    // Step 3: V_α = 0.
    let mut v_alpha = [0u32; K];
    for i in 0..n as usize {
        // Step 6: s^L‖v^L‖t^L‖s^R‖v^R‖t^R ← G(s_b^(i−1)) for b = 0, 1, every key.
        let mut blk = [[0u128; 6]; K];
        for (b, sj) in blk.iter_mut().zip(s.iter()) {
            *b = [
                sj[0] ^ C_LEFT,
                sj[0] ^ C_RIGHT,
                sj[0] ^ C_VALUE,
                sj[1] ^ C_LEFT,
                sj[1] ^ C_RIGHT,
                sj[1] ^ C_VALUE,
            ];
        }
        prp.mmo(&mut blk);
        for j in 0..K {
            let [left0, right0, val0, left1, right1, val1] = blk[j];
            // Step 1: α_i, MSB first.
            let a = (alpha[j] >> (n - 1 - i as u32)) & 1;
            let am = mask128(a);
            // Step 7: Keep = R if α_i = 1 else L; Lose is the other child.
            let keep0 = left0 ^ (am & (left0 ^ right0));
            let keep1 = left1 ^ (am & (left1 ^ right1));
            let lose0 = left0 ^ right0 ^ keep0;
            let lose1 = left1 ^ right1 ^ keep1;
            // Step 8: s_CW = s_0^Lose ⊕ s_1^Lose.
            let s_cw = (lose0 ^ lose1) & SEED_MASK;
            // Step 12: t_CW^L = t_0^L ⊕ t_1^L ⊕ α_i ⊕ 1, t_CW^R = t_0^R ⊕ t_1^R ⊕ α_i
            // (t^L is bit 0 of the left block, t^R bit 1 of the right block).
            let t_cw_left = ((left0 ^ left1) as u32 & 1) ^ a ^ 1;
            let t_cw_right = (((right0 ^ right1) >> 1) as u32 & 1) ^ a;
            // Step 13: CW^(i) = s_CW ‖ V_CW ‖ t_CW^L ‖ t_CW^R, the t bits in s_CW's free bits.
            let packed = s_cw | u128::from(t_cw_left) | (u128::from(t_cw_right) << 1);
            // v^L is word 0 of the value block, v^R word 1. Lose = L exactly when α_i = 1.
            let word = |v: u128, w: u32| (v >> (32 * w)) as u32;
            let (lose_w, keep_w) = (1 - a, a);
            let t1 = t[j][1];
            // Steps 9–10: V_CW = (−1)^{t_1} [v_1^Lose − v_0^Lose − V_α + 1{Lose = L}·β].
            let v_cw = negate_if(
                word(val1, lose_w)
                    .wrapping_sub(word(val0, lose_w))
                    .wrapping_sub(v_alpha[j])
                    .wrapping_add(beta[j] & a.wrapping_neg()),
                t1,
            );
            // Step 11: V_α ← V_α − v_1^Keep + v_0^Keep + (−1)^{t_1}·V_CW.
            v_alpha[j] = v_alpha[j]
                .wrapping_sub(word(val1, keep_w))
                .wrapping_add(word(val0, keep_w))
                .wrapping_add(negate_if(v_cw, t1));
            let (k0, k1) = &mut keys[j];
            k0.cw_seed[i] = packed;
            k1.cw_seed[i] = packed;
            k0.cw_value[i] = v_cw;
            k1.cw_value[i] = v_cw;
            // Steps 14–15: s_b ← s_b^Keep ⊕ t_b·s_CW, t_b ← t_b^Keep ⊕ t_b·t_CW^Keep, computed
            // exactly as Eval does (τ = out ⊕ t·packed, next t = bit α_i of τ).
            for (b, keep) in [keep0, keep1].into_iter().enumerate() {
                let tau = keep ^ (packed & mask128(t[j][b]));
                s[j][b] = tau & SEED_MASK;
                t[j][b] = (tau >> a) as u32 & 1;
            }
        }
        blk.zeroize();
    }
    for j in 0..K {
        // Step 17: CW^(n+1) = (−1)^{t_1^(n)} [Convert(s_1^(n)) − Convert(s_0^(n)) − V_α].
        let last = negate_if(
            convert(s[j][1])
                .wrapping_sub(convert(s[j][0]))
                .wrapping_sub(v_alpha[j]),
            t[j][1],
        );
        keys[j].0.cw_last = last;
        keys[j].1.cw_last = last;
    }
    s.zeroize();
    v_alpha.zeroize();
    keys
}

/// L evaluation paths through DCF trees, walked in lockstep (lane l evaluates the key whose
/// correction words start at `offset[l]`, with stride `stride` between levels, on `x[l]`).
pub(crate) struct Lanes<'a, const L: usize> {
    pub(crate) n: u32,
    pub(crate) cw_seed: &'a [u128],
    pub(crate) cw_value: &'a [u32],
    pub(crate) stride: usize,
    pub(crate) offset: [usize; L],
    pub(crate) s0: [u128; L],
    pub(crate) last: [u32; L],
    /// Inputs, already reduced to n bits.
    pub(crate) x: [u32; L],
}

/// Eval^<(b, k_b, x) of BCG+21 Fig. 1 on every lane, on the given (available) backend.
#[inline]
pub(crate) fn eval_lanes<const L: usize>(
    backend: Backend,
    lanes: &Lanes<'_, L>,
    party: u32,
) -> [u32; L] {
    match backend {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: callers pass Vaes only when it is available.
        Backend::Vaes => unsafe { ni_engine::eval_lanes_vaes(lanes, party) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: callers pass AesNi only when it is available.
        Backend::AesNi => unsafe { ni_engine::eval_lanes_ni(lanes, party) },
        _ => eval_lanes_generic(&PortablePrp::get(), lanes, party),
    }
}

/// Portable Eval^< (BCG+21 Fig. 1), all lanes per level in one AES call.
fn eval_lanes_generic<P: Prp, const L: usize>(
    prp: &P,
    lanes: &Lanes<'_, L>,
    party: u32,
) -> [u32; L] {
    // Eval step 2: V = 0, t^(0) = b.
    let mut s = lanes.s0;
    let mut t = [party; L];
    let mut acc = [0u32; L];
    let n = lanes.n as usize;
    for i in 0..n {
        let shift = (n - 1 - i) as u32;
        let bits: [u32; L] = std::array::from_fn(|l| (lanes.x[l] >> shift) & 1);
        // Step 5, taken branch only: H_{c_L or c_R}(s) and H_{c_V}(s).
        let mut blk: [[u128; 2]; L] = std::array::from_fn(|l| {
            let tweak = C_LEFT ^ (mask128(bits[l]) & (C_LEFT ^ C_RIGHT));
            [s[l] ^ tweak, s[l] ^ C_VALUE]
        });
        prp.mmo(&mut blk);
        for l in 0..L {
            let [a, v] = blk[l];
            let idx = lanes.offset[l] + i * lanes.stride;
            // Steps 5–6: τ = G(s) ⊕ t·(s_CW‖t_CW^L‖t_CW^R) on the taken child.
            let tau = a ^ (lanes.cw_seed[idx] & mask128(t[l]));
            // Steps 7–8: V += v^{x_i} + t·V_CW (the (−1)^b is applied at the end).
            acc[l] = acc[l]
                .wrapping_add((v >> (32 * bits[l])) as u32)
                .wrapping_add(lanes.cw_value[idx] & t[l].wrapping_neg());
            s[l] = tau & SEED_MASK;
            t[l] = (tau >> bits[l]) as u32 & 1;
        }
    }
    // Step 10: V += Convert(s^(n)) + t^(n)·CW^(n+1); times (−1)^b.
    std::array::from_fn(|l| {
        negate_if(
            acc[l]
                .wrapping_add(convert(s[l]))
                .wrapping_add(lanes.last[l] & t[l].wrapping_neg()),
            party,
        )
    })
}

/// The AES-NI / VAES Eval^< engine: the same steps as [`eval_lanes_generic`] with seeds kept
/// in vector registers. One body, instantiated per AES flavour inside a function that
/// enables the matching CPU features.
///
/// The vector units run the AES rounds, so everything else is arranged to cost them as little
/// as possible: the tweak and the first round key are one table entry indexed by the public
/// bit x_i (`in ⊕ rk0 = s ⊕ (c ⊕ rk0)`), and the MMO feed-forward rides in the last round key
/// (`aesenclast(y, rk10 ⊕ in) = π(in) ⊕ in`, since the last round ends by XORing its key).
/// The control bit t and the running sum V live in general-purpose registers, which are
/// otherwise idle.
#[cfg(target_arch = "x86_64")]
// The engine walks several parallel per-lane arrays of compile-time length; plain index loops
// read like the per-lane steps of BCG+21 and unroll completely (values stay in registers).
#[allow(clippy::needless_range_loop)]
mod ni_engine {
    use std::arch::x86_64::*;

    use super::{negate_if, Lanes, SEED_MASK};
    use crate::crypto::fss::aes::{ni, vaes, C_LEFT, C_RIGHT, C_VALUE, FIXED_ROUND_KEYS};

    /// How one level's PRG calls are computed: for every lane, H_{c_{x_i}}(s) (seed block)
    /// and the low 64 bits of H_{c_V}(s) (v^L, v^R).
    trait Flavor {
        type Tables;
        /// # Safety
        /// The flavour's CPU features must be available.
        unsafe fn tables() -> Self::Tables;
        /// # Safety
        /// The flavour's CPU features must be available.
        unsafe fn level<const L: usize>(
            tables: &Self::Tables,
            s: &[__m128i; L],
            bits: &[usize; L],
            seed_out: &mut [__m128i; L],
            value_out: &mut [u64; L],
        );
    }

    /// Round keys 1..=9 and the per-bit tables of the folded first and last round keys.
    struct NiTables {
        rk: ni::RoundKeys,
        /// c_{L or R} ⊕ rk0, c_{L or R} ⊕ rk10 by x_i.
        first: [__m128i; 2],
        last: [__m128i; 2],
        value_first: __m128i,
        value_last: __m128i,
    }

    /// 128-bit AES-NI: one block per instruction.
    struct Ni;

    impl Flavor for Ni {
        type Tables = NiTables;

        #[inline(always)]
        unsafe fn tables() -> NiTables {
            let [k0, k10] = [FIXED_ROUND_KEYS[0], FIXED_ROUND_KEYS[10]];
            NiTables {
                rk: ni::round_keys(&FIXED_ROUND_KEYS),
                first: [ni::to_m(C_LEFT ^ k0), ni::to_m(C_RIGHT ^ k0)],
                last: [ni::to_m(C_LEFT ^ k10), ni::to_m(C_RIGHT ^ k10)],
                value_first: ni::to_m(C_VALUE ^ k0),
                value_last: ni::to_m(C_VALUE ^ k10),
            }
        }

        #[inline(always)]
        unsafe fn level<const L: usize>(
            tb: &NiTables,
            s: &[__m128i; L],
            bits: &[usize; L],
            seed_out: &mut [__m128i; L],
            value_out: &mut [u64; L],
        ) {
            // SAFETY: the CPU features these intrinsics need are the enclosing function's contract (checked by the runtime dispatch before any call).
            unsafe {
                let mut a = [_mm_setzero_si128(); L];
                let mut v = [_mm_setzero_si128(); L];
                for l in 0..L {
                    a[l] = _mm_xor_si128(s[l], tb.first[bits[l]]);
                    v[l] = _mm_xor_si128(s[l], tb.value_first);
                }
                for k in &tb.rk[1..10] {
                    for l in 0..L {
                        a[l] = _mm_aesenc_si128(a[l], *k);
                        v[l] = _mm_aesenc_si128(v[l], *k);
                    }
                }
                for l in 0..L {
                    seed_out[l] = _mm_aesenclast_si128(a[l], _mm_xor_si128(s[l], tb.last[bits[l]]));
                    let value = _mm_aesenclast_si128(v[l], _mm_xor_si128(s[l], tb.value_last));
                    value_out[l] = _mm_cvtsi128_si64(value) as u64;
                }
            }
        }
    }

    /// Round keys 1..=9 broadcast, and the per-bit tables of the folded first and last round
    /// keys for the register pair (seed block | value block).
    struct VaesTables {
        rk: vaes::RoundKeys,
        first: [__m256i; 2],
        last: [__m256i; 2],
    }

    /// 256-bit VAES: a lane's seed block and value block share one register.
    struct Vaes;

    impl Flavor for Vaes {
        type Tables = VaesTables;

        #[inline(always)]
        unsafe fn tables() -> VaesTables {
            let [k0, k10] = [FIXED_ROUND_KEYS[0], FIXED_ROUND_KEYS[10]];
            // SAFETY: the CPU features these intrinsics need are the enclosing function's contract (checked by the runtime dispatch before any call).
            let pair = |c: u128, k: u128| unsafe {
                _mm256_set_m128i(ni::to_m(C_VALUE ^ k), ni::to_m(c ^ k))
            };
            VaesTables {
                // SAFETY: the CPU features these intrinsics need are the enclosing function's contract (checked by the runtime dispatch before any call).
                rk: unsafe { vaes::round_keys(&FIXED_ROUND_KEYS) },
                first: [pair(C_LEFT, k0), pair(C_RIGHT, k0)],
                last: [pair(C_LEFT, k10), pair(C_RIGHT, k10)],
            }
        }

        #[inline(always)]
        unsafe fn level<const L: usize>(
            tb: &VaesTables,
            s: &[__m128i; L],
            bits: &[usize; L],
            seed_out: &mut [__m128i; L],
            value_out: &mut [u64; L],
        ) {
            // SAFETY: the CPU features these intrinsics need are the enclosing function's contract (checked by the runtime dispatch before any call).
            unsafe {
                let mut y = [_mm256_setzero_si256(); L];
                for l in 0..L {
                    y[l] = _mm256_xor_si256(_mm256_broadcastsi128_si256(s[l]), tb.first[bits[l]]);
                }
                for k in &tb.rk[1..10] {
                    for l in 0..L {
                        y[l] = _mm256_aesenc_epi128(y[l], *k);
                    }
                }
                for l in 0..L {
                    let key = _mm256_xor_si256(_mm256_broadcastsi128_si256(s[l]), tb.last[bits[l]]);
                    let out = _mm256_aesenclast_epi128(y[l], key);
                    seed_out[l] = _mm256_castsi256_si128(out);
                    value_out[l] = _mm_cvtsi128_si64(_mm256_extracti128_si256::<1>(out)) as u64;
                }
            }
        }
    }

    /// # Safety
    /// AES-NI must be available.
    #[target_feature(enable = "aes")]
    pub(super) unsafe fn eval_lanes_ni<const L: usize>(
        lanes: &Lanes<'_, L>,
        party: u32,
    ) -> [u32; L] {
        // SAFETY: the CPU features these intrinsics need are the enclosing function's contract (checked by the runtime dispatch before any call).
        unsafe { body::<Ni, L>(lanes, party) }
    }

    /// # Safety
    /// AES-NI, VAES and AVX2 must be available.
    #[target_feature(enable = "aes,vaes,avx2")]
    pub(super) unsafe fn eval_lanes_vaes<const L: usize>(
        lanes: &Lanes<'_, L>,
        party: u32,
    ) -> [u32; L] {
        // SAFETY: the CPU features these intrinsics need are the enclosing function's contract (checked by the runtime dispatch before any call).
        unsafe { body::<Vaes, L>(lanes, party) }
    }

    /// # Safety
    /// F's CPU features must be available; only called from the wrappers above, into which
    /// it is inlined so that the intrinsics compile with those features.
    #[inline(always)]
    unsafe fn body<F: Flavor, const L: usize>(lanes: &Lanes<'_, L>, party: u32) -> [u32; L] {
        // SAFETY: the CPU features these intrinsics need are the enclosing function's contract (checked by the runtime dispatch before any call).
        unsafe {
            let tables = F::tables();
            let seed_mask = ni::to_m(SEED_MASK);
            let mut s = [_mm_setzero_si128(); L];
            for l in 0..L {
                s[l] = ni::to_m(lanes.s0[l]);
            }
            // Eval step 2: V = 0, t^(0) = b.
            let mut t = [u64::from(party); L];
            let mut acc = [0u32; L];
            let n = lanes.n as usize;
            for i in 0..n {
                let shift = n - 1 - i;
                let mut bits = [0usize; L];
                for l in 0..L {
                    bits[l] = (lanes.x[l] as usize >> shift) & 1;
                }
                // Step 5, taken branch only.
                let mut seed_out = [_mm_setzero_si128(); L];
                let mut value_out = [0u64; L];
                F::level(&tables, &s, &bits, &mut seed_out, &mut value_out);
                for l in 0..L {
                    let idx = lanes.offset[l] + i * lanes.stride;
                    let cw = ni::to_m(lanes.cw_seed[idx]);
                    // Steps 5–6: τ = H(s) ⊕ t·(s_CW‖t_CW^L‖t_CW^R).
                    let t_mask = _mm_set1_epi64x(t[l].wrapping_neg() as i64);
                    let tau = _mm_xor_si128(seed_out[l], _mm_and_si128(cw, t_mask));
                    s[l] = _mm_and_si128(tau, seed_mask);
                    // Steps 7–8: V += v^{x_i} + t·V_CW (v^L is word 0, v^R word 1).
                    let word = (value_out[l] >> (32 * bits[l])) as u32;
                    let corr = lanes.cw_value[idx] & (t[l] as u32).wrapping_neg();
                    acc[l] = acc[l].wrapping_add(word).wrapping_add(corr);
                    t[l] = ((_mm_cvtsi128_si64(tau) as u64) >> bits[l]) & 1;
                }
            }
            // Step 10: V += Convert(s^(n)) + t^(n)·CW^(n+1); times (−1)^b.
            let mut out = [0u32; L];
            for l in 0..L {
                let conv = ((_mm_cvtsi128_si64(s[l]) as u64) >> 32) as u32;
                let total = acc[l]
                    .wrapping_add(conv)
                    .wrapping_add(lanes.last[l] & (t[l] as u32).wrapping_neg());
                out[l] = negate_if(total, party);
            }
            out
        }
    }
}

/// Eval^<_n(b, k_b, x) of BCG+21 Fig. 1 for one key: party b's additive share of
/// `β if x < α else 0`. Only the low n bits of x are used (x is taken mod 2^n).
/// Errors: party not 0 or 1.
pub fn eval(party: u8, key: &DcfKey, x: u32) -> Result<u32, FssError> {
    eval_with(backend(), party, key, x)
}

/// [`eval`] on a chosen AES backend.
pub fn eval_with(backend: Backend, party: u8, key: &DcfKey, x: u32) -> Result<u32, FssError> {
    let backend = backend.checked()?;
    let party = check_party(party)?;
    let mask = domain_mask(key.n)?;
    let [y] = eval_lanes(backend, &key.lanes([x & mask]), party);
    Ok(y)
}

/// Many DCF keys of one bit length n, laid out for batch evaluation (see [`crate::crypto::fss`],
/// "Batches"): blocks of [`GROUP`] keys whose correction words are interleaved level by
/// level, padded with all-zero keys to a whole block. Zeroised on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct DcfKeyBatch {
    n: u32,
    len: usize,
    s0: Vec<u128>,
    cw_seed: Vec<u128>,
    cw_value: Vec<u32>,
    cw_last: Vec<u32>,
}

impl std::fmt::Debug for DcfKeyBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcfKeyBatch")
            .field("n", &self.n)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl DcfKeyBatch {
    /// An empty batch of n-bit keys. Errors: n not in 1..=32.
    pub fn new(n: u32) -> Result<Self, FssError> {
        Self::with_capacity(n, 0)
    }

    /// An empty batch with room for `capacity` keys.
    pub fn with_capacity(n: u32, capacity: usize) -> Result<Self, FssError> {
        domain_mask(n)?;
        let padded = capacity.div_ceil(GROUP) * GROUP;
        Ok(DcfKeyBatch {
            n,
            len: 0,
            s0: Vec::with_capacity(padded),
            cw_seed: Vec::with_capacity(padded * n as usize),
            cw_value: Vec::with_capacity(padded * n as usize),
            cw_last: Vec::with_capacity(padded),
        })
    }

    /// The batch of `keys` (n taken from the first key; an empty batch has n = 32).
    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a DcfKey>) -> Result<Self, FssError> {
        let mut keys = keys.into_iter().peekable();
        let n = keys.peek().map_or(MAX_BITS, |k| k.n);
        let mut batch = Self::with_capacity(n, keys.size_hint().0)?;
        for key in keys {
            batch.push(key)?;
        }
        Ok(batch)
    }

    /// Decodes encoded keys ([`DcfKey::encode`]) into a batch (n taken from the first key;
    /// an empty batch has n = 32). Errors on the first malformed key or on mixed n.
    pub fn decode_many<'a>(encoded: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, FssError> {
        let mut batch: Option<Self> = None;
        let encoded = encoded.into_iter();
        let hint = encoded.size_hint().0;
        for bytes in encoded {
            match &mut batch {
                Some(b) => b.push_encoded(bytes)?,
                None => {
                    let mut b = Self::with_capacity(DcfKey::encoded_n(bytes)?, hint)?;
                    b.push_encoded(bytes)?;
                    batch = Some(b);
                }
            }
        }
        match batch {
            Some(b) => Ok(b),
            None => Self::new(MAX_BITS),
        }
    }

    /// Decodes a concatenation of encoded n-bit keys (stride [`dcf_key_len`]`(n)`).
    /// Errors: a length that is not a whole number of keys, or a malformed key.
    pub fn decode_concatenated(bytes: &[u8], n: u32) -> Result<Self, FssError> {
        domain_mask(n)?;
        let stride = dcf_key_len(n);
        if !bytes.len().is_multiple_of(stride) {
            return Err(FssError::BadLength {
                what: "concatenated DCF keys",
                expected: bytes.len() / stride * stride,
                got: bytes.len(),
            });
        }
        let mut batch = Self::with_capacity(n, bytes.len() / stride)?;
        for chunk in bytes.chunks_exact(stride) {
            batch.push_encoded(chunk)?;
        }
        Ok(batch)
    }

    /// Appends one encoded key ([`DcfKey::encode`]), decoding it straight into the batch
    /// layout with all of [`DcfKey::decode`]'s checks. Errors (malformed key, other n)
    /// leave the batch unchanged.
    pub fn push_encoded(&mut self, bytes: &[u8]) -> Result<(), FssError> {
        let (n, mut r) = DcfKey::check_encoded(bytes)?;
        if n != self.n {
            return Err(FssError::MixedBitLength {
                expected: self.n,
                got: n,
            });
        }
        let k = self.open_slot();
        self.s0[k] = r.u128()?;
        let base = self.offset(k);
        for i in 0..n as usize {
            self.cw_seed[base + i * GROUP] = r.u128()?;
            self.cw_value[base + i * GROUP] = r.u32()?;
        }
        self.cw_last[k] = r.u32()?;
        // Only now does the key count: a failed read above (impossible after the length
        // check) would leave an unused slot, not a half-written key.
        self.len += 1;
        Ok(())
    }

    /// Index of the next key's slot, opening a new block of GROUP all-zero keys if needed.
    fn open_slot(&mut self) -> usize {
        if self.len.is_multiple_of(GROUP) && self.s0.len() == self.len {
            let n = self.n as usize;
            self.s0.resize(self.s0.len() + GROUP, 0);
            self.cw_last.resize(self.cw_last.len() + GROUP, 0);
            self.cw_seed.resize(self.cw_seed.len() + GROUP * n, 0);
            self.cw_value.resize(self.cw_value.len() + GROUP * n, 0);
        }
        self.len
    }

    /// Appends one key. Errors: its n differs from the batch's.
    pub fn push(&mut self, key: &DcfKey) -> Result<(), FssError> {
        if key.n != self.n {
            return Err(FssError::MixedBitLength {
                expected: self.n,
                got: key.n,
            });
        }
        let n = self.n as usize;
        let k = self.open_slot();
        self.s0[k] = key.s0;
        self.cw_last[k] = key.cw_last;
        let base = self.offset(k);
        for i in 0..n {
            self.cw_seed[base + i * GROUP] = key.cw_seed[i];
            self.cw_value[base + i * GROUP] = key.cw_value[i];
        }
        self.len += 1;
        Ok(())
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The input bit length n of every key.
    pub fn n(&self) -> u32 {
        self.n
    }

    /// Index of key k's level-0 correction word (level i is at `+ i·GROUP`).
    fn offset(&self, k: usize) -> usize {
        (k / GROUP) * GROUP * self.n as usize + k % GROUP
    }

    /// Evaluation lanes for keys `keys[l]` (all < len) on inputs `x[l]` (already reduced).
    pub(crate) fn lanes<const L: usize>(&self, keys: [usize; L], x: [u32; L]) -> Lanes<'_, L> {
        Lanes {
            n: self.n,
            cw_seed: &self.cw_seed,
            cw_value: &self.cw_value,
            stride: GROUP,
            offset: std::array::from_fn(|l| self.offset(keys[l])),
            s0: std::array::from_fn(|l| self.s0[keys[l]]),
            last: std::array::from_fn(|l| self.cw_last[keys[l]]),
            x,
        }
    }
}

/// Checks the slice lengths of a batch evaluation.
pub(crate) fn check_lengths(keys: usize, inputs: usize, outputs: usize) -> Result<(), FssError> {
    if keys == inputs && keys == outputs {
        Ok(())
    } else {
        Err(FssError::LengthMismatch {
            keys,
            inputs,
            outputs,
        })
    }
}

/// Batch Eval^< (BCG+21 Fig. 1): `out[k] = Eval^<(party, key k, xs[k])` for every key of the
/// batch, 8 keys walked through their trees in lockstep (16 AES blocks per level). Only the
/// low n bits of each x are used.
/// Errors: party not 0 or 1; `xs` or `out` not of the batch's length.
pub fn eval_batch(
    party: u8,
    keys: &DcfKeyBatch,
    xs: &[u32],
    out: &mut [u32],
) -> Result<(), FssError> {
    eval_batch_with(backend(), party, keys, xs, out)
}

/// [`eval_batch`] on a chosen AES backend.
pub fn eval_batch_with(
    backend: Backend,
    party: u8,
    keys: &DcfKeyBatch,
    xs: &[u32],
    out: &mut [u32],
) -> Result<(), FssError> {
    const CHUNK: usize = 2 * GROUP;
    let backend = backend.checked()?;
    let party = check_party(party)?;
    check_lengths(keys.len(), xs.len(), out.len())?;
    let mask = domain_mask(keys.n)?;
    for (c, (xs, out)) in xs.chunks(CHUNK).zip(out.chunks_mut(CHUNK)).enumerate() {
        let base = c * CHUNK;
        // A short last chunk repeats its last key in the spare lanes (results discarded).
        let last = xs.len() - 1;
        let idx: [usize; CHUNK] = std::array::from_fn(|l| base + l.min(last));
        let x: [u32; CHUNK] = std::array::from_fn(|l| xs[l.min(last)] & mask);
        let y = eval_lanes(backend, &keys.lanes(idx, x), party);
        out.copy_from_slice(&y[..out.len()]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    use rand_chacha::ChaCha20Rng;
    use sha2::{Digest, Sha256};

    fn backends() -> Vec<Backend> {
        Backend::ALL
            .into_iter()
            .filter(|b| b.is_available())
            .collect()
    }

    fn reconstruct(k0: &DcfKey, k1: &DcfKey, x: u32) -> u32 {
        eval(0, k0, x)
            .unwrap()
            .wrapping_add(eval(1, k1, x).unwrap())
    }

    #[test]
    fn exhaustive_n8() {
        let mut rng = ChaCha20Rng::seed_from_u64(10);
        for beta in [1u32, 0xdead_beef, u32::MAX, 0x8000_0000] {
            for alpha in 0..256u32 {
                let (k0, k1) = gen(&mut rng, 8, alpha, beta).unwrap();
                for x in 0..256u32 {
                    let want = if x < alpha { beta } else { 0 };
                    assert_eq!(reconstruct(&k0, &k1, x), want, "α={alpha} β={beta} x={x}");
                }
            }
        }
    }

    #[test]
    fn exhaustive_small_n_portable_backend() {
        // Every n from 1 to 6, every α and x, on the portable backend too.
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        for backend in backends() {
            for n in 1..=6u32 {
                for alpha in 0..(1u32 << n) {
                    let (k0, k1) = gen_with(backend, &mut rng, n, alpha, 7).unwrap();
                    for x in 0..(1u32 << n) {
                        let y = eval_with(backend, 0, &k0, x)
                            .unwrap()
                            .wrapping_add(eval_with(backend, 1, &k1, x).unwrap());
                        assert_eq!(y, if x < alpha { 7 } else { 0 }, "n={n} α={alpha} x={x}");
                    }
                }
            }
        }
    }

    #[test]
    fn backends_generate_and_evaluate_identically() {
        let outputs: Vec<(Vec<u8>, Vec<u32>)> = backends()
            .into_iter()
            .map(|backend| {
                let mut rng = ChaCha20Rng::seed_from_u64(12);
                let mut encoded = Vec::new();
                let mut shares = Vec::new();
                for j in 0..20u32 {
                    let alpha = j.wrapping_mul(0x9e37_79b9);
                    let (k0, k1) = gen_with(backend, &mut rng, 32, alpha, j + 1).unwrap();
                    k0.encode_into(&mut encoded);
                    k1.encode_into(&mut encoded);
                    for x in [alpha, alpha.wrapping_sub(1), alpha ^ 0x10000, !alpha] {
                        shares.push(eval_with(backend, 0, &k0, x).unwrap());
                        shares.push(eval_with(backend, 1, &k1, x).unwrap());
                    }
                }
                (encoded, shares)
            })
            .collect();
        for o in &outputs[1..] {
            assert_eq!(o, &outputs[0]);
        }
    }

    #[test]
    fn batch_generation_is_correct() {
        let mut rng = ChaCha20Rng::seed_from_u64(20);
        for backend in backends() {
            for (n, count) in [(32u32, 9usize), (8, 4), (5, 7), (1, 2)] {
                let mask = domain_mask(n).unwrap();
                let params: Vec<(u32, u32)> = (0..count)
                    .map(|_| (rng.next_u32() & mask, rng.next_u32()))
                    .collect();
                let pairs = gen_batch_with(backend, &mut rng, n, &params).unwrap();
                assert_eq!(pairs.len(), count);
                for ((k0, k1), &(alpha, beta)) in pairs.iter().zip(&params) {
                    let xs: Vec<u32> = if n <= 8 {
                        (0..=mask).collect()
                    } else {
                        vec![0, alpha, alpha.wrapping_sub(1), alpha.wrapping_add(1), mask]
                    };
                    for x in xs {
                        let want = if x < alpha { beta } else { 0 };
                        assert_eq!(reconstruct(k0, k1, x), want, "{backend:?} n={n}");
                    }
                }
            }
        }
        assert!(matches!(
            gen_batch(&mut rng, 8, &[(1, 1), (256, 1)]),
            Err(FssError::OutOfDomain { .. })
        ));
        assert!(gen_batch(&mut rng, 8, &[]).unwrap().is_empty());
    }

    #[test]
    fn keys_are_pinned() {
        // Changing the PRG, Gen or the layout changes these bytes: keys dealt by one version
        // must evaluate under the next, so such a change needs a new format tag.
        let mut rng = ChaCha20Rng::seed_from_u64(13);
        let (k0, k1) = gen(&mut rng, 32, 0x1234_5678, 0xcafe_f00d).unwrap();
        let mut h = Sha256::new();
        h.update(k0.encode());
        h.update(k1.encode());
        assert_eq!(
            hex::encode(h.finalize()),
            "7ba28c762235b53193118018117c382aa3f9a436a79a3b0af550f5f9e3680085"
        );
    }

    #[test]
    fn party_shares_sum_for_alpha_edges() {
        let mut rng = ChaCha20Rng::seed_from_u64(14);
        for alpha in [0u32, 1, 0x7fff_ffff, 0x8000_0000, u32::MAX] {
            let (k0, k1) = gen(&mut rng, 32, alpha, 5).unwrap();
            for x in [
                0u32,
                1,
                alpha.wrapping_sub(1),
                alpha,
                alpha.wrapping_add(1),
                u32::MAX,
            ] {
                let want = if x < alpha { 5 } else { 0 };
                assert_eq!(reconstruct(&k0, &k1, x), want, "α={alpha} x={x}");
            }
        }
    }

    #[test]
    fn inputs_are_reduced_mod_2_to_the_n() {
        let mut rng = ChaCha20Rng::seed_from_u64(15);
        let (k0, k1) = gen(&mut rng, 8, 100, 3).unwrap();
        assert_eq!(reconstruct(&k0, &k1, 99 + 256 * 7), 3);
        assert_eq!(reconstruct(&k0, &k1, 100 + 256 * 7), 0);
    }

    #[test]
    fn batch_equals_single() {
        let mut rng = ChaCha20Rng::seed_from_u64(16);
        for n in [32u32, 8, 1] {
            for count in [1usize, 3, 4, 5, 8, 9, 37] {
                let pairs: Vec<(DcfKey, DcfKey)> = (0..count)
                    .map(|_| {
                        let alpha = rng.next_u32() & domain_mask(n).unwrap();
                        let beta = rng.next_u32();
                        gen(&mut rng, n, alpha, beta).unwrap()
                    })
                    .collect();
                let xs: Vec<u32> = (0..count).map(|_| rng.next_u32()).collect();
                for party in 0..2u8 {
                    let keys: Vec<&DcfKey> = pairs
                        .iter()
                        .map(|(a, b)| if party == 0 { a } else { b })
                        .collect();
                    let single: Vec<u32> = keys
                        .iter()
                        .zip(&xs)
                        .map(|(k, &x)| eval(party, k, x).unwrap())
                        .collect();
                    let batch = DcfKeyBatch::from_keys(keys.iter().copied()).unwrap();
                    assert_eq!(batch.len(), count);
                    let encoded: Vec<Vec<u8>> = keys.iter().map(|k| k.encode()).collect();
                    let decoded =
                        DcfKeyBatch::decode_many(encoded.iter().map(Vec::as_slice)).unwrap();
                    let concat = DcfKeyBatch::decode_concatenated(&encoded.concat(), n).unwrap();
                    for b in [&batch, &decoded, &concat] {
                        for backend in backends() {
                            let mut out = vec![0u32; count];
                            eval_batch_with(backend, party, b, &xs, &mut out).unwrap();
                            assert_eq!(out, single, "n={n} count={count} {backend:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut rng = ChaCha20Rng::seed_from_u64(17);
        assert_eq!(DCF_KEY_LEN, 662);
        for n in [1u32, 8, 31, 32] {
            let (k0, k1) = gen(&mut rng, n, 1, 9).unwrap();
            for k in [&k0, &k1] {
                let bytes = k.encode();
                assert_eq!(bytes.len(), dcf_key_len(n));
                assert_eq!(bytes.len(), k.encoded_len());
                assert_eq!(bytes[0], DCF_KEY_TAG);
                let back = DcfKey::decode(&bytes).unwrap();
                assert_eq!(&back, k);
                assert_eq!(back.n(), n);
            }
        }
    }

    #[test]
    fn malformed_keys_are_errors() {
        let mut rng = ChaCha20Rng::seed_from_u64(18);
        let (k0, _) = gen(&mut rng, 32, 77, 1).unwrap();
        let bytes = k0.encode();
        // Every truncation, and a trailing byte.
        for len in 0..bytes.len() {
            assert!(DcfKey::decode(&bytes[..len]).is_err(), "len {len}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            DcfKey::decode(&long),
            Err(FssError::BadLength { .. })
        ));
        // Wrong tag, n out of range, n that disagrees with the length.
        let mut bad = bytes.clone();
        bad[0] = 0x02;
        assert!(matches!(
            DcfKey::decode(&bad),
            Err(FssError::UnknownFormat { tag: 0x02, .. })
        ));
        for n in [0u8, 33, 255] {
            let mut bad = bytes.clone();
            bad[1] = n;
            assert_eq!(
                DcfKey::decode(&bad),
                Err(FssError::BadBitLength(u32::from(n)))
            );
        }
        let mut bad = bytes.clone();
        bad[1] = 31;
        assert!(matches!(
            DcfKey::decode(&bad),
            Err(FssError::BadLength { .. })
        ));
        // Non-canonical root seed.
        let mut bad = bytes.clone();
        bad[2] |= 1;
        assert!(matches!(
            DcfKey::decode(&bad),
            Err(FssError::NonCanonical(_))
        ));
        // Concatenations that are not whole keys.
        assert!(DcfKeyBatch::decode_concatenated(&bytes[..100], 32).is_err());
        assert!(DcfKeyBatch::decode_concatenated(&bytes, 0).is_err());
    }

    #[test]
    fn api_misuse_is_an_error() {
        let mut rng = ChaCha20Rng::seed_from_u64(19);
        let (k0, _) = gen(&mut rng, 8, 3, 1).unwrap();
        assert_eq!(eval(2, &k0, 0), Err(FssError::BadParty(2)));
        assert!(matches!(
            gen(&mut rng, 8, 256, 1),
            Err(FssError::OutOfDomain { .. })
        ));
        assert_eq!(
            gen(&mut rng, 0, 0, 1).map(|_| ()),
            Err(FssError::BadBitLength(0))
        );
        assert_eq!(
            gen(&mut rng, 33, 0, 1).map(|_| ()),
            Err(FssError::BadBitLength(33))
        );
        let mut batch = DcfKeyBatch::new(32).unwrap();
        assert!(matches!(
            batch.push(&k0),
            Err(FssError::MixedBitLength { .. })
        ));
        let batch = DcfKeyBatch::from_keys([&k0, &k0]).unwrap();
        let mut out = [0u32; 2];
        assert!(matches!(
            eval_batch(0, &batch, &[1, 2, 3], &mut out),
            Err(FssError::LengthMismatch { .. })
        ));
        assert_eq!(
            eval_batch(7, &batch, &[1, 2], &mut out),
            Err(FssError::BadParty(7))
        );
        let empty = DcfKeyBatch::decode_many(std::iter::empty()).unwrap();
        assert!(empty.is_empty());
        eval_batch(0, &empty, &[], &mut []).unwrap();
        assert!(!format!("{k0:?}").contains("s0"));
    }

    proptest! {
        #[test]
        fn prop_n32_correct(alpha in any::<u32>(), beta in any::<u32>(), x in any::<u32>(),
                            seed in any::<u64>(), near in 0u32..4) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let (k0, k1) = gen(&mut rng, 32, alpha, beta).unwrap();
            // Random x, and x right at the boundary.
            let x = match near {
                0 => x,
                1 => alpha,
                2 => alpha.wrapping_sub(1),
                _ => alpha.wrapping_add(1),
            };
            let want = if x < alpha { beta } else { 0 };
            prop_assert_eq!(reconstruct(&k0, &k1, x), want);
        }
    }
}
