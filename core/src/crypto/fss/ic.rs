//! # Interval-containment gate (BCG+21 §4, Fig. 3)
//!
//! Gen^IC_{n,p,q}(r_in, r_out) → (k_0, k_1) and Eval^IC(b, k_b, x) → y_b with
//!
//! ```text
//! y_0 + y_1 = 1{p ≤ x − r_in ≤ q} + r_out   (mod 2^32)
//! ```
//!
//! where x is the public masked input (x = x_real + r_in mod 2^n) and the interval is over
//! n-bit values. A key is one DCF key for f_{γ,1}, γ = r_in − 1 mod 2^n, plus one share z_b
//! of the correction term; evaluation runs the DCF twice, at x + 2^n − 1 − p and at
//! x + 2^n − 1 − q'.
//!
//! **The correction term.** BCG+21 write z = r_out + 1{α^(p) > α^(q)} − 1{α^(p) > p} +
//! 1{α^(q') > q + 1} + 1{α^(q) = N − 1}. The third comparison must be against q' = q + 1
//! reduced mod N: with q = N − 1 the unreduced N would make the output wrong for every
//! r_in ≠ 0 (exhaustive tests for n = 4 and n = 8 cover this). With that reading the gate is
//! exact over the integers for every p, q < 2^n, and for p > q it computes membership of the
//! *cyclic* interval {p, p + 1, …, q} mod 2^n (i.e. x ≥ p or x ≤ q); see
//! [`IcParams::contains`].
//!
//! **The sign gate** of Funshade is p = 0, q = 2^31 − 1, n = 32, r_out = 0
//! ([`gen_sign_gate`]): y_0 + y_1 = 1 exactly when (x − r_in) as `i32` ≥ 0.

use rand_core::{CryptoRng, RngCore};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::aes::{backend, Backend};
use super::dcf::{self, dcf_key_len, eval_lanes, DcfKey, DcfKeyBatch, Reader, MAX_BITS};
use super::{check_party, domain_mask, FssError};

/// First byte of an encoded IC key: format IC gate, version 1.
pub const IC_KEY_TAG: u8 = 0x02;

/// Length in bytes of an encoded IC key with n-bit inputs: tag, p, q, z_b (13 bytes) and the
/// DCF key.
pub const fn ic_key_len(n: u32) -> usize {
    13 + dcf_key_len(n)
}

/// Length of an encoded IC key for n = 32 (sign gate): 675 bytes.
pub const IC_KEY_LEN: usize = ic_key_len(MAX_BITS);

/// The public parameters n, p, q of an IC gate: the interval [p, q] of n-bit values (cyclic
/// when p > q).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IcParams {
    n: u32,
    p: u32,
    q: u32,
}

impl IcParams {
    /// Funshade's sign gate: n = 32, [0, 2^31 − 1], i.e. "non-negative as an i32".
    pub const SIGN_GATE: IcParams = IcParams {
        n: 32,
        p: 0,
        q: (1 << 31) - 1,
    };

    /// Parameters for the interval [p, q] on n-bit values. Errors: n not in 1..=32, or p or
    /// q ≥ 2^n.
    pub fn new(n: u32, p: u32, q: u32) -> Result<Self, FssError> {
        let mask = domain_mask(n)?;
        for (what, value) in [("p", p), ("q", q)] {
            if value & !mask != 0 {
                return Err(FssError::OutOfDomain { what, value, n });
            }
        }
        Ok(IcParams { n, p, q })
    }

    /// The input bit length n.
    pub fn n(&self) -> u32 {
        self.n
    }

    /// The interval start p.
    pub fn p(&self) -> u32 {
        self.p
    }

    /// The interval end q (inclusive).
    pub fn q(&self) -> u32 {
        self.q
    }

    /// The function the gate shares, in the clear: whether the unmasked n-bit value
    /// `x_real` (taken mod 2^n) lies in [p, q], cyclically when p > q.
    pub fn contains(&self, x_real: u32) -> bool {
        let x = x_real & (u32::MAX >> (32 - self.n));
        if self.p <= self.q {
            self.p <= x && x <= self.q
        } else {
            x >= self.p || x <= self.q
        }
    }
}

/// One party's IC-gate key (BCG+21 Fig. 3, Gen^IC step 5: k_b = k_b^(N−1) ‖ z_b), carrying
/// the public p and q so that it evaluates on its own. Zeroised on drop; `Debug` prints only
/// the public parameters.
#[derive(Clone, PartialEq, Eq, Zeroize)]
pub struct IcKey {
    p: u32,
    q: u32,
    z: u32,
    dcf: DcfKey,
}

impl Drop for IcKey {
    fn drop(&mut self) {
        // The DCF key zeroises itself when dropped right after; p and q are public.
        self.z.zeroize();
    }
}

impl ZeroizeOnDrop for IcKey {}

impl std::fmt::Debug for IcKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcKey")
            .field("n", &self.dcf.n())
            .field("p", &self.p)
            .field("q", &self.q)
            .finish_non_exhaustive()
    }
}

impl IcKey {
    /// The gate's public parameters.
    pub fn params(&self) -> IcParams {
        IcParams {
            n: self.dcf.n(),
            p: self.p,
            q: self.q,
        }
    }

    /// Length of [`IcKey::encode`]'s output, [`ic_key_len`]`(n)`.
    pub fn encoded_len(&self) -> usize {
        ic_key_len(self.dcf.n())
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
        out.push(IC_KEY_TAG);
        out.extend_from_slice(&self.p.to_le_bytes());
        out.extend_from_slice(&self.q.to_le_bytes());
        out.extend_from_slice(&self.z.to_le_bytes());
        self.dcf.encode_into(out);
    }

    /// Checks an encoded key's header and its DCF part (every check of [`DcfKey::decode`]),
    /// and that p, q < 2^n; returns (n, p, q, z_b, the DCF part).
    fn check_encoded(bytes: &[u8]) -> Result<(u32, u32, u32, u32, &[u8]), FssError> {
        const WHAT: &str = "IC key";
        let mut r = Reader::new(bytes, WHAT);
        let tag = r.u8()?;
        if tag != IC_KEY_TAG {
            return Err(FssError::UnknownFormat { what: WHAT, tag });
        }
        let p = r.u32()?;
        let q = r.u32()?;
        let z = r.u32()?;
        let dcf = r.rest();
        let n = DcfKey::encoded_n(dcf).map_err(|e| match e {
            // Report lengths of the whole IC key, not of its DCF part.
            FssError::BadLength { expected, got, .. } => FssError::BadLength {
                what: WHAT,
                expected: expected + 13,
                got: got + 13,
            },
            other => other,
        })?;
        IcParams::new(n, p, q)?;
        Ok((n, p, q, z, dcf))
    }

    /// Parses an encoded key: tag, p, q, z_b, then the DCF key (all its checks), and p, q
    /// < 2^n. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, FssError> {
        let (_, p, q, z, dcf) = Self::check_encoded(bytes)?;
        Ok(IcKey {
            p,
            q,
            z,
            dcf: DcfKey::decode(dcf)?,
        })
    }
}

/// Gen^IC_{n,p,q}(1^λ, r_in, r_out) of BCG+21 Fig. 3: keys whose shares sum to
/// 1{p ≤ x − r_in ≤ q} + r_out on masked inputs x. Uses the detected AES backend.
/// `rng` must be cryptographically secure (see [`dcf::gen`]).
///
/// Errors: r_in ≥ 2^n.
pub fn gen<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    params: &IcParams,
    r_in: u32,
    r_out: u32,
) -> Result<(IcKey, IcKey), FssError> {
    gen_with(backend(), rng, params, r_in, r_out)
}

/// [`gen`] on a chosen AES backend.
pub fn gen_with<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    params: &IcParams,
    r_in: u32,
    r_out: u32,
) -> Result<(IcKey, IcKey), FssError> {
    let backend = backend.checked()?;
    let mask = domain_mask(params.n)?;
    if r_in & !mask != 0 {
        return Err(FssError::OutOfDomain {
            what: "r_in",
            value: r_in,
            n: params.n,
        });
    }
    Ok(gen_unchecked(backend, rng, params, r_in, r_out))
}

/// Funshade's sign gate: Gen^IC_{32,0,2^31−1}(r_in, 0), so that the shares sum to 1 exactly
/// when (x − r_in) mod 2^32 < 2^31, i.e. the unmasked value is non-negative as an `i32`.
pub fn gen_sign_gate<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, r_in: u32) -> (IcKey, IcKey) {
    gen_unchecked(backend(), rng, &IcParams::SIGN_GATE, r_in, 0)
}

/// Gen^IC for many masks at once: `out[k]` is a key pair for (r_in, r_out) = `masks[k]`,
/// all with the same public interval. The DCF keys are generated in lockstep (see
/// [`dcf::gen_batch`]); a dealer producing many gates should prefer this to [`gen`].
///
/// Errors: some r_in ≥ 2^n (nothing is generated then).
pub fn gen_batch<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    params: &IcParams,
    masks: &[(u32, u32)],
) -> Result<Vec<(IcKey, IcKey)>, FssError> {
    gen_batch_with(backend(), rng, params, masks)
}

/// [`gen_batch`] on a chosen AES backend.
pub fn gen_batch_with<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    params: &IcParams,
    masks: &[(u32, u32)],
) -> Result<Vec<(IcKey, IcKey)>, FssError> {
    let backend = backend.checked()?;
    let mask = domain_mask(params.n)?;
    if let Some(&(r_in, _)) = masks.iter().find(|(r, _)| r & !mask != 0) {
        return Err(FssError::OutOfDomain {
            what: "r_in",
            value: r_in,
            n: params.n,
        });
    }
    Ok(gen_batch_unchecked(backend, rng, params, masks))
}

/// Sign gates ([`gen_sign_gate`]) for many input masks r_in at once, generated in lockstep.
pub fn gen_sign_gates<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    r_ins: &[u32],
) -> Vec<(IcKey, IcKey)> {
    let masks: Vec<(u32, u32)> = r_ins.iter().map(|&r| (r, 0)).collect();
    gen_batch_unchecked(backend(), rng, &IcParams::SIGN_GATE, &masks)
}

/// The body of Gen^IC; `backend` available, `params` valid, r_in < 2^n.
fn gen_unchecked<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    params: &IcParams,
    r_in: u32,
    r_out: u32,
) -> (IcKey, IcKey) {
    // Step 1: DCF keys for f_{γ,1} with γ = (N − 1 + r_in) mod N.
    let (d0, d1) = dcf::gen_unchecked(backend, rng, params.n, gamma(params, r_in), 1);
    finish(rng, params, r_in, r_out, d0, d1)
}

/// [`gen_batch_with`] without checks.
fn gen_batch_unchecked<R: RngCore + CryptoRng + ?Sized>(
    backend: Backend,
    rng: &mut R,
    params: &IcParams,
    masks: &[(u32, u32)],
) -> Vec<(IcKey, IcKey)> {
    let dcf_params: Vec<(u32, u32)> = masks.iter().map(|&(r, _)| (gamma(params, r), 1)).collect();
    let mut out = Vec::with_capacity(masks.len());
    dcf::gen_batch_each(backend, rng, params.n, &dcf_params, |rng, k, d0, d1| {
        let (r_in, r_out) = masks[k];
        out.push(finish(rng, params, r_in, r_out, d0, d1));
    });
    out
}

/// Gen^IC step 1's DCF threshold γ = (N − 1 + r_in) mod N.
fn gamma(params: &IcParams, r_in: u32) -> u32 {
    r_in.wrapping_sub(1) & (u32::MAX >> (32 - params.n))
}

/// Gen^IC steps 2–5 around a DCF key pair for f_{γ,1}.
fn finish<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    params: &IcParams,
    r_in: u32,
    r_out: u32,
    d0: DcfKey,
    d1: DcfKey,
) -> (IcKey, IcKey) {
    let IcParams { n, p, q } = *params;
    let mask = u32::MAX >> (32 - n);
    // Step 2: q' = q + 1, α^(p) = p + r_in, α^(q) = q + r_in, α^(q') = q + 1 + r_in (mod N).
    let q1 = q.wrapping_add(1) & mask;
    let a_p = p.wrapping_add(r_in) & mask;
    let a_q = q.wrapping_add(r_in) & mask;
    let a_q1 = q1.wrapping_add(r_in) & mask;
    // Step 3: z = r_out + 1{α^(p) > α^(q)} − 1{α^(p) > p} + 1{α^(q') > q'} + 1{α^(q) = N − 1},
    // with q' reduced mod N (see the module docs).
    let z = r_out
        .wrapping_add(u32::from(a_p > a_q))
        .wrapping_sub(u32::from(a_p > p))
        .wrapping_add(u32::from(a_q1 > q1))
        .wrapping_add(u32::from(a_q == mask));
    // Step 4: z_0 + z_1 = z with z_0 uniform.
    let z0 = rng.next_u32();
    let z1 = z.wrapping_sub(z0);
    (
        IcKey {
            p,
            q,
            z: z0,
            dcf: d0,
        },
        IcKey {
            p,
            q,
            z: z1,
            dcf: d1,
        },
    )
}

/// Eval^IC steps 2–3: the two DCF inputs x^(p) = x + N − 1 − p and x^(q') = x + N − 1 − q'
/// (mod N), for x already reduced mod N.
#[inline(always)]
fn dcf_inputs(x: u32, p: u32, q: u32, mask: u32) -> (u32, u32) {
    let q1 = q.wrapping_add(1) & mask;
    let base = x.wrapping_sub(1);
    (base.wrapping_sub(p) & mask, base.wrapping_sub(q1) & mask)
}

/// Eval^IC step 4: y_b = b·(1{x > p} − 1{x > q'}) − s^(p) + s^(q') + z_b, with
/// q' = q + 1 mod N.
#[inline(always)]
fn combine(party: u32, x: u32, p: u32, q1: u32, s_p: u32, s_q: u32, z: u32) -> u32 {
    let public = u32::from(x > p).wrapping_sub(u32::from(x > q1));
    (public & party.wrapping_neg())
        .wrapping_sub(s_p)
        .wrapping_add(s_q)
        .wrapping_add(z)
}

/// Eval^IC(b, k_b, x) of BCG+21 Fig. 3 for one key: party b's share of
/// 1{p ≤ x − r_in ≤ q} + r_out. Only the low n bits of x are used.
/// Errors: party not 0 or 1.
pub fn eval(party: u8, key: &IcKey, x: u32) -> Result<u32, FssError> {
    eval_with(backend(), party, key, x)
}

/// [`eval`] on a chosen AES backend.
pub fn eval_with(backend: Backend, party: u8, key: &IcKey, x: u32) -> Result<u32, FssError> {
    let backend = backend.checked()?;
    let party = check_party(party)?;
    let mask = domain_mask(key.dcf.n())?;
    let x = x & mask;
    let (x_p, x_q) = dcf_inputs(x, key.p, key.q, mask);
    let [s_p, s_q] = eval_lanes(backend, &key.dcf.lanes([x_p, x_q]), party);
    let q1 = key.q.wrapping_add(1) & mask;
    Ok(combine(party, x, key.p, q1, s_p, s_q, key.z))
}

/// Many IC keys of one bit length n, laid out for batch evaluation: a [`DcfKeyBatch`] plus
/// per-key p, q, z_b arrays. Zeroised on drop.
#[derive(Clone, Zeroize)]
pub struct IcKeyBatch {
    dcf: DcfKeyBatch,
    p: Vec<u32>,
    q: Vec<u32>,
    z: Vec<u32>,
}

impl Drop for IcKeyBatch {
    fn drop(&mut self) {
        // The DCF batch zeroises itself when dropped right after; p and q are public.
        self.z.zeroize();
    }
}

impl ZeroizeOnDrop for IcKeyBatch {}

impl std::fmt::Debug for IcKeyBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcKeyBatch")
            .field("n", &self.dcf.n())
            .field("len", &self.dcf.len())
            .finish_non_exhaustive()
    }
}

impl IcKeyBatch {
    /// An empty batch of n-bit keys. Errors: n not in 1..=32.
    pub fn new(n: u32) -> Result<Self, FssError> {
        Self::with_capacity(n, 0)
    }

    /// An empty batch with room for `capacity` keys.
    pub fn with_capacity(n: u32, capacity: usize) -> Result<Self, FssError> {
        Ok(IcKeyBatch {
            dcf: DcfKeyBatch::with_capacity(n, capacity)?,
            p: Vec::with_capacity(capacity),
            q: Vec::with_capacity(capacity),
            z: Vec::with_capacity(capacity),
        })
    }

    /// The batch of `keys` (n taken from the first key; an empty batch has n = 32).
    pub fn from_keys<'a>(keys: impl IntoIterator<Item = &'a IcKey>) -> Result<Self, FssError> {
        let mut keys = keys.into_iter().peekable();
        let n = keys.peek().map_or(MAX_BITS, |k| k.dcf.n());
        let mut batch = Self::with_capacity(n, keys.size_hint().0)?;
        for key in keys {
            batch.push(key)?;
        }
        Ok(batch)
    }

    /// Decodes encoded keys ([`IcKey::encode`]), e.g. slices of a key store, into a batch
    /// (n taken from the first key; an empty batch has n = 32). Errors on the first
    /// malformed key or on mixed n.
    pub fn decode_many<'a>(encoded: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, FssError> {
        let mut batch: Option<Self> = None;
        let encoded = encoded.into_iter();
        let hint = encoded.size_hint().0;
        for bytes in encoded {
            match &mut batch {
                Some(b) => b.push_encoded(bytes)?,
                None => {
                    let (n, ..) = IcKey::check_encoded(bytes)?;
                    let mut b = Self::with_capacity(n, hint)?;
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

    /// Decodes a concatenation of encoded n-bit keys (stride [`ic_key_len`]`(n)`, e.g.
    /// [`IC_KEY_LEN`] for sign gates). Errors: a length that is not a whole number of keys,
    /// or a malformed key.
    pub fn decode_concatenated(bytes: &[u8], n: u32) -> Result<Self, FssError> {
        domain_mask(n)?;
        let stride = ic_key_len(n);
        if !bytes.len().is_multiple_of(stride) {
            return Err(FssError::BadLength {
                what: "concatenated IC keys",
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

    /// Appends one encoded key ([`IcKey::encode`]), decoding it straight into the batch
    /// layout with all of [`IcKey::decode`]'s checks. Errors (malformed key, other n)
    /// leave the batch unchanged.
    pub fn push_encoded(&mut self, bytes: &[u8]) -> Result<(), FssError> {
        let (_, p, q, z, dcf) = IcKey::check_encoded(bytes)?;
        self.dcf.push_encoded(dcf)?;
        self.p.push(p);
        self.q.push(q);
        self.z.push(z);
        Ok(())
    }

    /// Appends one key. Errors: its n differs from the batch's.
    pub fn push(&mut self, key: &IcKey) -> Result<(), FssError> {
        self.dcf.push(&key.dcf)?;
        self.p.push(key.p);
        self.q.push(key.q);
        self.z.push(key.z);
        Ok(())
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.dcf.len()
    }

    /// Whether the batch holds no key.
    pub fn is_empty(&self) -> bool {
        self.dcf.is_empty()
    }

    /// The input bit length n of every key.
    pub fn n(&self) -> u32 {
        self.dcf.n()
    }
}

/// Keys per step of [`eval_batch`]: each contributes two DCF paths, so 2·CHUNK lanes.
const CHUNK: usize = 4;

/// Batch Eval^IC (BCG+21 Fig. 3): `out[k] = Eval^IC(party, key k, xs[k])` for every key.
/// Four keys at a time are walked through their trees in lockstep, each at its two DCF
/// inputs, i.e. 8 DCF paths and 16 AES blocks per level. Only the low n bits of each x are
/// used.
/// Errors: party not 0 or 1; `xs` or `out` not of the batch's length.
pub fn eval_batch(
    party: u8,
    keys: &IcKeyBatch,
    xs: &[u32],
    out: &mut [u32],
) -> Result<(), FssError> {
    eval_batch_with(backend(), party, keys, xs, out)
}

/// [`eval_batch`] on a chosen AES backend.
pub fn eval_batch_with(
    backend: Backend,
    party: u8,
    keys: &IcKeyBatch,
    xs: &[u32],
    out: &mut [u32],
) -> Result<(), FssError> {
    let backend = backend.checked()?;
    let party = check_party(party)?;
    dcf::check_lengths(keys.len(), xs.len(), out.len())?;
    let mask = domain_mask(keys.n())?;
    for (c, (xs, out)) in xs.chunks(CHUNK).zip(out.chunks_mut(CHUNK)).enumerate() {
        let base = c * CHUNK;
        // A short last chunk repeats its last key in the spare lanes (results discarded).
        let last = xs.len() - 1;
        let key = |l: usize| base + l.min(last);
        let x: [u32; CHUNK] = std::array::from_fn(|l| xs[l.min(last)] & mask);
        let inputs: [(u32, u32); CHUNK] =
            std::array::from_fn(|l| dcf_inputs(x[l], keys.p[key(l)], keys.q[key(l)], mask));
        // Lanes 0..CHUNK: x^(p) of the chunk's keys; lanes CHUNK..: x^(q') of the same keys.
        let idx: [usize; 2 * CHUNK] = std::array::from_fn(|l| key(l % CHUNK));
        let dx: [u32; 2 * CHUNK] = std::array::from_fn(|l| {
            let (x_p, x_q) = inputs[l % CHUNK];
            if l < CHUNK {
                x_p
            } else {
                x_q
            }
        });
        let s = eval_lanes(backend, &keys.dcf.lanes(idx, dx), party);
        for (l, o) in out.iter_mut().enumerate() {
            let k = key(l);
            let q1 = keys.q[k].wrapping_add(1) & mask;
            *o = combine(party, x[l], keys.p[k], q1, s[l], s[l + CHUNK], keys.z[k]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand_chacha::rand_core::{RngCore, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    fn backends() -> Vec<Backend> {
        Backend::ALL
            .into_iter()
            .filter(|b| b.is_available())
            .collect()
    }

    fn reconstruct(k0: &IcKey, k1: &IcKey, x: u32) -> u32 {
        eval(0, k0, x)
            .unwrap()
            .wrapping_add(eval(1, k1, x).unwrap())
    }

    /// All x for one (p, q, r_in, r_out) on n bits.
    fn check_all_x(rng: &mut ChaCha20Rng, n: u32, p: u32, q: u32, r_in: u32, r_out: u32) {
        let params = IcParams::new(n, p, q).unwrap();
        let (k0, k1) = gen(rng, &params, r_in, r_out).unwrap();
        let size = 1u32 << n;
        for x_real in 0..size {
            let x = (x_real + r_in) % size;
            let want = u32::from(params.contains(x_real)).wrapping_add(r_out);
            assert_eq!(
                reconstruct(&k0, &k1, x),
                want,
                "n={n} p={p} q={q} r_in={r_in} r_out={r_out} x_real={x_real}"
            );
        }
    }

    #[test]
    fn exhaustive_n4_every_interval_and_mask() {
        // Every p, q (including p > q: cyclic intervals, and the full ring p = q + 1), every
        // r_in, every x.
        let mut rng = ChaCha20Rng::seed_from_u64(20);
        for p in 0..16 {
            for q in 0..16 {
                for r_in in 0..16 {
                    let r_out = rng.next_u32();
                    check_all_x(&mut rng, 4, p, q, r_in, r_out);
                }
            }
        }
    }

    #[test]
    fn exhaustive_n8_edge_intervals_every_mask() {
        let mut rng = ChaCha20Rng::seed_from_u64(21);
        let intervals = [
            (0u32, 255u32), // everything: q = N − 1 exercises q' = 0
            (0, 127),       // the 8-bit sign gate
            (128, 255),     // negative values
            (0, 0),
            (255, 255),
            (17, 17),
            (3, 200),
            (200, 10), // wraps around
            (255, 0),  // wraps around, two values
            (10, 9),   // cyclic full ring
            (1, 254),
        ];
        for (p, q) in intervals {
            for r_in in 0..256 {
                check_all_x(&mut rng, 8, p, q, r_in, 0);
            }
        }
    }

    #[test]
    fn exhaustive_n8_random_intervals_and_outputs() {
        let mut rng = ChaCha20Rng::seed_from_u64(22);
        for _ in 0..64 {
            let p = rng.next_u32() % 256;
            let q = rng.next_u32() % 256;
            let r_in = rng.next_u32() % 256;
            let r_out = rng.next_u32();
            check_all_x(&mut rng, 8, p, q, r_in, r_out);
        }
    }

    fn sign(x_real: u32) -> u32 {
        u32::from((x_real as i32) >= 0)
    }

    #[test]
    fn sign_gate_edges() {
        let mut rng = ChaCha20Rng::seed_from_u64(23);
        for r_in in [0u32, 1, 0x7fff_ffff, 0x8000_0000, u32::MAX, 0x1234_5678] {
            let (k0, k1) = gen_sign_gate(&mut rng, r_in);
            assert_eq!(k0.params(), IcParams::SIGN_GATE);
            for x_real in [0u32, u32::MAX, 0x7fff_ffff, 0x8000_0000, 1, 0x8000_0001] {
                let x = x_real.wrapping_add(r_in);
                assert_eq!(
                    reconstruct(&k0, &k1, x),
                    sign(x_real),
                    "r_in={r_in} v={x_real}"
                );
            }
        }
    }

    #[test]
    fn batch_equals_single() {
        let mut rng = ChaCha20Rng::seed_from_u64(24);
        for (n, count) in [(32u32, 1usize), (32, 4), (32, 7), (32, 41), (8, 13), (1, 5)] {
            let mask = u32::MAX >> (32 - n);
            let pairs: Vec<(IcKey, IcKey)> = (0..count)
                .map(|_| {
                    let params =
                        IcParams::new(n, rng.next_u32() & mask, rng.next_u32() & mask).unwrap();
                    let r_in = rng.next_u32() & mask;
                    let r_out = rng.next_u32();
                    gen(&mut rng, &params, r_in, r_out).unwrap()
                })
                .collect();
            let xs: Vec<u32> = (0..count).map(|_| rng.next_u32()).collect();
            for party in 0..2u8 {
                let keys: Vec<&IcKey> = pairs
                    .iter()
                    .map(|(a, b)| if party == 0 { a } else { b })
                    .collect();
                let single: Vec<u32> = keys
                    .iter()
                    .zip(&xs)
                    .map(|(k, &x)| eval(party, k, x).unwrap())
                    .collect();
                let encoded: Vec<Vec<u8>> = keys.iter().map(|k| k.encode()).collect();
                let batches = [
                    IcKeyBatch::from_keys(keys.iter().copied()).unwrap(),
                    IcKeyBatch::decode_many(encoded.iter().map(Vec::as_slice)).unwrap(),
                    IcKeyBatch::decode_concatenated(&encoded.concat(), n).unwrap(),
                ];
                for batch in &batches {
                    assert_eq!(batch.len(), count);
                    assert_eq!(batch.n(), n);
                    for backend in backends() {
                        let mut out = vec![0u32; count];
                        eval_batch_with(backend, party, batch, &xs, &mut out).unwrap();
                        assert_eq!(out, single, "n={n} count={count} {backend:?}");
                        let one: Vec<u32> = keys
                            .iter()
                            .zip(&xs)
                            .map(|(k, &x)| eval_with(backend, party, k, x).unwrap())
                            .collect();
                        assert_eq!(one, single);
                    }
                }
            }
        }
    }

    #[test]
    fn batch_generation_is_correct() {
        let mut rng = ChaCha20Rng::seed_from_u64(28);
        for backend in backends() {
            for count in [0usize, 1, 3, 4, 5, 9] {
                let r_ins: Vec<u32> = (0..count).map(|_| rng.next_u32()).collect();
                let gates = if backend == super::backend() {
                    gen_sign_gates(&mut rng, &r_ins)
                } else {
                    let masks: Vec<(u32, u32)> = r_ins.iter().map(|&r| (r, 0)).collect();
                    gen_batch_with(backend, &mut rng, &IcParams::SIGN_GATE, &masks).unwrap()
                };
                assert_eq!(gates.len(), count);
                for ((k0, k1), &r_in) in gates.iter().zip(&r_ins) {
                    for v in [0u32, u32::MAX, 0x7fff_ffff, 0x8000_0000, rng.next_u32()] {
                        let x = v.wrapping_add(r_in);
                        assert_eq!(reconstruct(k0, k1, x), sign(v), "{backend:?}");
                    }
                }
            }
            // Small n, every x, wrap-around interval and a non-zero r_out.
            let params = IcParams::new(6, 50, 3).unwrap();
            let masks: Vec<(u32, u32)> = (0..7).map(|j| (j * 9, 100 + j)).collect();
            let gates = gen_batch_with(backend, &mut rng, &params, &masks).unwrap();
            for ((k0, k1), &(r_in, r_out)) in gates.iter().zip(&masks) {
                for v in 0..64u32 {
                    let want = u32::from(params.contains(v)) + r_out;
                    assert_eq!(reconstruct(k0, k1, (v + r_in) % 64), want);
                }
            }
        }
        let params = IcParams::new(6, 0, 3).unwrap();
        assert!(matches!(
            gen_batch(&mut rng, &params, &[(1, 0), (64, 0)]),
            Err(FssError::OutOfDomain { what: "r_in", .. })
        ));
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut rng = ChaCha20Rng::seed_from_u64(25);
        assert_eq!(IC_KEY_LEN, 675);
        let (k0, k1) = gen_sign_gate(&mut rng, 42);
        for k in [&k0, &k1] {
            let bytes = k.encode();
            assert_eq!(bytes.len(), IC_KEY_LEN);
            assert_eq!(bytes[0], IC_KEY_TAG);
            assert_eq!(&IcKey::decode(&bytes).unwrap(), k);
        }
        let params = IcParams::new(8, 200, 10).unwrap();
        let (k0, _) = gen(&mut rng, &params, 5, 0).unwrap();
        let bytes = k0.encode();
        assert_eq!(bytes.len(), ic_key_len(8));
        let back = IcKey::decode(&bytes).unwrap();
        assert_eq!(back.params(), params);
        assert_eq!(back, k0);
    }

    #[test]
    fn malformed_keys_are_errors() {
        let mut rng = ChaCha20Rng::seed_from_u64(26);
        let (k0, _) = gen_sign_gate(&mut rng, 7);
        let bytes = k0.encode();
        for len in 0..bytes.len() {
            assert!(IcKey::decode(&bytes[..len]).is_err(), "len {len}");
        }
        let mut long = bytes.clone();
        long.push(1);
        assert_eq!(
            IcKey::decode(&long),
            Err(FssError::BadLength {
                what: "IC key",
                expected: IC_KEY_LEN,
                got: IC_KEY_LEN + 1
            })
        );
        let mut bad = bytes.clone();
        bad[0] = dcf::DCF_KEY_TAG;
        assert!(matches!(
            IcKey::decode(&bad),
            Err(FssError::UnknownFormat { .. })
        ));
        // A DCF key is not an IC key and vice versa.
        assert!(IcKey::decode(&bytes[13..]).is_err());
        assert!(DcfKey::decode(&bytes).is_err());
        // p or q outside an n = 8 domain.
        let params = IcParams::new(8, 1, 2).unwrap();
        let (k8, _) = gen(&mut rng, &params, 5, 0).unwrap();
        let mut bad = k8.encode();
        bad[1] = 0;
        bad[2] = 1; // p = 256
        assert!(matches!(
            IcKey::decode(&bad),
            Err(FssError::OutOfDomain { what: "p", .. })
        ));
        // Batches: mixed n, partial concatenations.
        let batch = IcKeyBatch::decode_many([bytes.as_slice(), k8.encode().as_slice()]);
        assert!(matches!(batch, Err(FssError::MixedBitLength { .. })));
        assert!(IcKeyBatch::decode_concatenated(&bytes[..IC_KEY_LEN - 1], 32).is_err());
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes[..IC_KEY_LEN - 1]);
        assert!(IcKeyBatch::decode_concatenated(&two, 32).is_err());
    }

    #[test]
    fn failed_push_leaves_the_batch_unchanged() {
        let mut rng = ChaCha20Rng::seed_from_u64(29);
        let gates = gen_sign_gates(&mut rng, &[5, 6, 7, 8, 9]);
        let mut batch = IcKeyBatch::new(32).unwrap();
        for (k0, _) in &gates[..3] {
            batch.push_encoded(&k0.encode()).unwrap();
        }
        let good = gates[3].0.encode();
        let mut bad_seed = good.clone();
        bad_seed[13 + 2] |= 2;
        let params8 = IcParams::new(8, 0, 1).unwrap();
        let (other_n, _) = gen(&mut rng, &params8, 3, 0).unwrap();
        for bad in [
            &good[..good.len() - 1],
            &bad_seed[..],
            &other_n.encode()[..],
        ] {
            assert!(batch.push_encoded(bad).is_err());
            assert_eq!(batch.len(), 3);
        }
        batch.push_encoded(&good).unwrap();
        batch.push(&gates[4].0).unwrap();
        let batch1 = IcKeyBatch::from_keys(gates.iter().map(|(_, k1)| k1)).unwrap();
        let xs: Vec<u32> = (0..5u32)
            .map(|k| (k + 5).wrapping_add(k * 0x3000_0000))
            .collect();
        let (mut out0, mut out1) = ([0u32; 5], [0u32; 5]);
        eval_batch(0, &batch, &xs, &mut out0).unwrap();
        eval_batch(1, &batch1, &xs, &mut out1).unwrap();
        for k in 0..5 {
            let v = xs[k].wrapping_sub(k as u32 + 5);
            assert_eq!(out0[k].wrapping_add(out1[k]), sign(v), "key {k}");
        }
    }

    #[test]
    fn api_misuse_is_an_error() {
        let mut rng = ChaCha20Rng::seed_from_u64(27);
        assert!(IcParams::new(8, 256, 0).is_err());
        assert!(IcParams::new(8, 0, 256).is_err());
        assert!(IcParams::new(0, 0, 0).is_err());
        let params = IcParams::new(8, 0, 9).unwrap();
        assert!(matches!(
            gen(&mut rng, &params, 256, 0),
            Err(FssError::OutOfDomain { what: "r_in", .. })
        ));
        let (k0, _) = gen_sign_gate(&mut rng, 1);
        assert_eq!(eval(2, &k0, 0), Err(FssError::BadParty(2)));
        let batch = IcKeyBatch::from_keys([&k0]).unwrap();
        assert!(matches!(
            eval_batch(0, &batch, &[1], &mut []),
            Err(FssError::LengthMismatch { .. })
        ));
        let empty = IcKeyBatch::decode_many(std::iter::empty()).unwrap();
        assert!(empty.is_empty());
        eval_batch(1, &empty, &[], &mut []).unwrap();
        let shown = format!("{k0:?}");
        assert!(shown.contains("p: 0") && !shown.contains("z:"));
    }

    proptest! {
        #[test]
        fn prop_sign_gate(r_in in any::<u32>(), v in any::<u32>(), pick in 0u32..6,
                          seed in any::<u64>()) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let (k0, k1) = gen_sign_gate(&mut rng, r_in);
            // x − r_in at 0, −1, 2^31 − 1, 2^31 and elsewhere.
            let v = match pick {
                0 => 0,
                1 => u32::MAX,
                2 => 0x7fff_ffff,
                3 => 0x8000_0000,
                _ => v,
            };
            let x = v.wrapping_add(r_in);
            prop_assert_eq!(reconstruct(&k0, &k1, x), sign(v));
        }

        #[test]
        fn prop_n32_interval(p in any::<u32>(), q in any::<u32>(), r_in in any::<u32>(),
                             r_out in any::<u32>(), v in any::<u32>(), pick in 0u32..6,
                             seed in any::<u64>()) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let params = IcParams::new(32, p, q).unwrap();
            let (k0, k1) = gen(&mut rng, &params, r_in, r_out).unwrap();
            // The interval's edges and random values.
            let v = match pick {
                0 => p,
                1 => p.wrapping_sub(1),
                2 => q,
                3 => q.wrapping_add(1),
                _ => v,
            };
            let x = v.wrapping_add(r_in);
            let want = u32::from(params.contains(v)).wrapping_add(r_out);
            prop_assert_eq!(reconstruct(&k0, &k1, x), want);
        }
    }
}
