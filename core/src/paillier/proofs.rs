//! # Enrolment proofs of [ABMR20] §8: plaintext knowledge (Fig. 9) and L2 norm (Fig. 10)
//!
//! Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile Devices for
//! Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363. In the enrolment of
//! Π2 and Π3 (§6.1, Fig. 4) a possibly malicious device D sends the service provider SP one
//! Paillier ciphertext per template coordinate under D's own key, and proves
//!
//! 1. that the key is well formed ([`super::key_proof`]),
//! 2. that it knows the plaintexts and nonces of all ciphertexts (§8.2, Fig. 9, batched
//!    [CDN01]): [`PlaintextKnowledgeProof`], non-interactive by Fiat–Shamir,
//! 3. that the template has the public squared norm y over the integers (§8.3, Fig. 10):
//!    [`L2Verifier`] (SP's private coins and first message [`L2Challenge`]) and
//!    [`L2Response`] (D's answer), interactive because SP's coins must stay secret.
//!
//! Templates of different norms are handled with slack coordinates: D appends four integers
//! s_1..s_4 with Σu_i² + Σs_j² = ζ² ([`norm_slack`], Lagrange's four-square theorem,
//! [`four_squares`]), encrypts them as coordinates ℓ+1..ℓ+4, and both proofs cover all ℓ + 4
//! ciphertexts with y = ζ². Since squares are non-negative this proves ‖u‖² ≤ ζ², and since
//! every x_i² ≤ y, that every coordinate is small. The slack ciphertexts are not used for
//! matching.
//!
//! [CDN01] Cramer, Damgård, Nielsen, "Multiparty Computation from Threshold Homomorphic
//! Encryption", EUROCRYPT 2001.
//!
//! Signed coordinates x are encrypted as x mod N (balanced representation, as everywhere in
//! [`super::cipher`]). All messages have fixed-length encodings determined by the key and the
//! number of coordinates; decoding is strict and errors name the message and field.
//!
//! **Cost.** The verifier's first L2 message needs one fresh N-th power per ciphertext (see
//! [`L2Verifier`] for why it cannot be avoided) and a multi-exponentiation with |N|-bit
//! exponents; these dominate the enrolment. The `_parallel` variants split the independent
//! exponentiations over a rayon pool of the asked size ([`crate::parallel`]; results do not
//! depend on the thread count: all randomness is drawn on the caller's thread first).

use rand_core::{CryptoRng, RngCore};
use rayon::prelude::*;
use rug::integer::{IsPrime, Order};
use rug::{Complete, Integer};
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

use super::cipher::{
    fixed_be, random_below, random_unit, Ciphertext, NoncePool, PaillierError, PublicKey, SecretKey,
};
use crate::algebra::montgomery::{GmpModulus, ModularProducts, Montgomery52};
use crate::parallel::{on_threads, worth_a_pool};

/// λ: bits of each Fiat–Shamir challenge e_i of the plaintext-knowledge proof, and the
/// statistical security target of the enrolment proofs.
pub const CHALLENGE_BITS: u32 = 128;

/// Bits of the MAC key α of the L2 proof ([ABMR20] Fig. 10: α ← Z_{2^{2λ}}).
pub const MAC_KEY_BITS: u32 = 2 * CHALLENGE_BITS;

/// Bits of the verifier's fresh prime N̂ of the L2 proof (see [`L2Verifier`] for the choice).
pub const L2_PRIME_BITS: u32 = 144;

/// Bytes of N̂ and of ẑ in the encodings.
pub const L2_PRIME_BYTES: usize = L2_PRIME_BITS.div_ceil(8) as usize;

/// Slack coordinates appended to a template so that its squared norm is exactly ζ²
/// (Lagrange: four squares suffice for every non-negative integer).
pub const SLACK_COORDINATES: usize = 4;

/// Most ciphertexts one proof may cover (a bound on work an input can cause).
pub const MAX_COORDINATES: usize = 1 << 16;

/// Domain tag of the Fiat–Shamir hash of the plaintext-knowledge proof.
const POK_TAG: &[u8] = b"privmatch/paillier/ABMR20/fig9-plaintext-knowledge/v1";

/// Miller–Rabin rounds (on top of GMP's Baillie–PSW) for the verifier's prime N̂.
const L2_PRIME_TEST_REPS: u32 = 30;

/// What can go wrong while proving or verifying (all caused by input, none by a bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The public key cannot be accepted: unsupported size, even, or a small prime factor.
    #[error("malformed key: {0}")]
    MalformedKey(String),
    /// An encoded message could not be decoded.
    #[error("{message}: field `{field}`: {reason}")]
    Decode {
        /// Which message.
        message: &'static str,
        /// Which field of it (with an index where the field repeats).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A proof did not verify.
    #[error("{proof} refused: {check}")]
    Rejected {
        /// Which proof.
        proof: &'static str,
        /// Which check failed.
        check: String,
    },
    /// Inconsistent inputs to a prover or verifier (lengths, ranges, norm bound).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A Paillier operation refused its input.
    #[error(transparent)]
    Paillier(#[from] PaillierError),
}

const POK_PROOF: &str = "plaintext-knowledge proof ([ABMR20] Fig. 9)";
const L2_PROOF: &str = "L2-norm proof ([ABMR20] Fig. 10)";

// ---------------------------------------------------------------------------------------------
// Helpers: wiping, threads, multi-exponentiation, transcripts, decoding.
// ---------------------------------------------------------------------------------------------

/// Overwrites the limbs of a secret integer with zeros, then sets it to 0 (GMP keeps the
/// allocation, so the old value does not stay behind in freed memory).
pub(crate) fn wipe_integer(x: &mut Integer) {
    let limbs = x.significant_digits::<u64>();
    let mut zeros = vec![0u64; limbs];
    x.assign_digits(&zeros, Order::Lsf);
    zeros.zeroize();
    *x = Integer::ZERO;
}

/// `f` applied to every item on the pool of `threads` threads ([`crate::parallel::on_threads`];
/// 0 or 1 thread, or one item: on the caller's thread). Order is preserved.
fn par_map<T: Sync, U: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> U + Sync) -> Vec<U> {
    if !worth_a_pool(items.len(), 1, threads) {
        return items.iter().map(f).collect();
    }
    // Each item is heavy (an exponentiation or a multi-exponentiation): rayon splits them
    // as the threads steal, with no minimum piece (a minimum of ⌈n/threads⌉ would keep an
    // odd count from splitting at all).
    let mapped = on_threads(threads, || items.par_iter().map(&f).collect());
    // A worker can only panic through a bug; re-raise it on the caller's thread.
    mapped.unwrap_or_else(|payload| std::panic::resume_unwind(payload))
}

/// Window width of the bucket method minimising ⌈bits/c⌉ · (n + 2^{c+1}) multiplications.
fn window_bits(count: usize, bits: u32) -> u32 {
    (1..=16u32)
        .min_by_key(|&c| u64::from(bits.div_ceil(c)) * (count as u64 + (1u64 << (c + 1))))
        .unwrap_or(4)
}

/// The `width`-bit digit of the little-endian limbs `limbs` at bit `position`.
fn digit(limbs: &[u64], position: u32, width: u32) -> usize {
    let index = (position / 64) as usize;
    let offset = position % 64;
    let low = limbs.get(index).copied().unwrap_or(0) >> offset;
    let high = if offset + width > 64 && offset != 0 {
        limbs.get(index + 1).copied().unwrap_or(0) << (64 - offset)
    } else {
        0
    };
    ((low | high) & ((1u64 << width) - 1)) as usize
}

/// Π bases_i^{exponents_i} mod `modulus` for non-negative exponents, by Pippenger's bucket
/// method (Pippenger, "On the evaluation of powers and monomials", SIAM J. Comput. 1980): one
/// shared chain of squarings, and per window of c exponent bits one multiplication per base
/// plus 2^{c+1} to combine the buckets. At 260 bases this is about 4.5 × fewer
/// multiplications than separate exponentiations. The sequence of operations depends only on
/// the exponents (public in every use here), not on the bases. The products are Montgomery
/// products on AVX-512 IFMA where the CPU has it, GMP's otherwise ([`crate::algebra::montgomery`]).
pub(crate) fn multi_exp(bases: &[&Integer], exponents: &[Integer], modulus: &Integer) -> Integer {
    match Montgomery52::for_this_cpu(modulus) {
        Some(ctx) => multi_exp_in(&ctx, bases, exponents),
        None => multi_exp_in(&GmpModulus(modulus), bases, exponents),
    }
}

/// [`multi_exp`] with the products of `arith`.
fn multi_exp_in<A: ModularProducts>(
    arith: &A,
    bases: &[&Integer],
    exponents: &[Integer],
) -> Integer {
    let count = bases.len().min(exponents.len());
    let bits = exponents[..count]
        .iter()
        .map(|e| e.significant_bits())
        .max()
        .unwrap_or(0);
    let mut acc = arith.one();
    if bits == 0 {
        return arith.lower(&acc);
    }
    let lifted: Vec<A::Element> = bases[..count].iter().map(|b| arith.lift(b)).collect();
    let c = window_bits(count, bits);
    let windows = bits.div_ceil(c);
    let limbs: Vec<Vec<u64>> = exponents[..count]
        .iter()
        .map(|e| e.to_digits::<u64>(Order::Lsf))
        .collect();
    let mut buckets: Vec<Option<A::Element>> = (0..(1usize << c) - 1).map(|_| None).collect();
    for window in (0..windows).rev() {
        if window + 1 != windows {
            for _ in 0..c {
                arith.square_assign(&mut acc);
            }
        }
        for (base, exp_limbs) in lifted.iter().zip(&limbs) {
            let d = digit(exp_limbs, window * c, c);
            if d == 0 {
                continue;
            }
            match &mut buckets[d - 1] {
                slot @ None => *slot = Some(base.clone()),
                Some(x) => arith.mul_assign(x, base),
            }
        }
        // Σ_d d·B_d as Π_k (Π_{d ≥ k} B_d): a running product from the top bucket down.
        let mut running: Option<A::Element> = None;
        let mut total: Option<A::Element> = None;
        for slot in buckets.iter_mut().rev() {
            if let Some(b) = slot.take() {
                running = Some(match running {
                    None => b,
                    Some(mut r) => {
                        arith.mul_assign(&mut r, &b);
                        r
                    }
                });
            }
            if let Some(r) = &running {
                total = Some(match total {
                    None => r.clone(),
                    Some(mut t) => {
                        arith.mul_assign(&mut t, r);
                        t
                    }
                });
            }
        }
        if let Some(t) = total {
            arith.mul_assign(&mut acc, &t);
        }
    }
    arith.lower(&acc)
}

/// [`multi_exp`] with the bases split into one piece per thread, the pieces run by [`par_map`]
/// on `threads` threads and the partial products multiplied at the end.
fn multi_exp_parallel(
    bases: &[&Integer],
    exponents: &[Integer],
    modulus: &Integer,
    threads: usize,
) -> Integer {
    let count = bases.len().min(exponents.len());
    // One range per thread, fewer when there are fewer bases; the pool is the one of the
    // setting (`threads`), not one per count.
    let ranges_wanted = threads.clamp(1, count.max(1));
    if ranges_wanted == 1 {
        return multi_exp(bases, exponents, modulus);
    }
    let chunk = count.div_ceil(ranges_wanted);
    let ranges: Vec<(usize, usize)> = (0..count)
        .step_by(chunk)
        .map(|start| (start, (start + chunk).min(count)))
        .collect();
    let parts = par_map(&ranges, threads, |&(start, end)| {
        multi_exp(&bases[start..end], &exponents[start..end], modulus)
    });
    parts.into_iter().fold(Integer::from(1), |mut acc, part| {
        acc *= part;
        acc %= modulus;
        acc
    })
}

/// A SHA-256 transcript for Fiat–Shamir: every item is framed by its label and length, so the
/// hashed string determines the sequence of items.
struct Transcript(Sha256);

impl Transcript {
    fn new(tag: &[u8]) -> Self {
        let mut t = Self(Sha256::new());
        t.append(b"tag", tag);
        t
    }

    fn append(&mut self, label: &[u8], data: &[u8]) {
        self.0.update((label.len() as u64).to_be_bytes());
        self.0.update(label);
        self.0.update((data.len() as u64).to_be_bytes());
        self.0.update(data);
    }

    /// `count` integers of [`CHALLENGE_BITS`] bits each: SHA-256(seed ‖ i), truncated.
    fn challenges(self, count: usize) -> Vec<Integer> {
        let seed = self.0.finalize();
        (0..count as u64)
            .map(|i| {
                let mut h = Sha256::new();
                h.update(seed);
                h.update(i.to_be_bytes());
                let block = h.finalize();
                Integer::from_digits(&block[..(CHALLENGE_BITS / 8) as usize], Order::Msf)
            })
            .collect()
    }
}

/// Reads fixed-length fields off an encoded message.
struct Reader<'a> {
    message: &'static str,
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Refuses `bytes` unless it is exactly `expected` long.
    fn new(message: &'static str, bytes: &'a [u8], expected: usize) -> Result<Self, ProofError> {
        if bytes.len() != expected {
            return Err(ProofError::Decode {
                message,
                field: "length".into(),
                reason: format!("{} bytes, expected {expected}", bytes.len()),
            });
        }
        Ok(Self { message, bytes })
    }

    fn take(&mut self, len: usize) -> &'a [u8] {
        // The total length was checked in `new`, and callers take exactly that much.
        let (head, tail) = self.bytes.split_at(len.min(self.bytes.len()));
        self.bytes = tail;
        head
    }

    fn ciphertext(&mut self, pk: &PublicKey, field: String) -> Result<Ciphertext, ProofError> {
        let bytes = self.take(pk.ciphertext_bytes());
        pk.ciphertext_from_bytes(bytes)
            .map_err(|e| ProofError::Decode {
                message: self.message,
                field,
                reason: e.to_string(),
            })
    }

    /// An integer in [0, bound) encoded in exactly `len` bytes.
    fn below(&mut self, len: usize, bound: &Integer, field: &str) -> Result<Integer, ProofError> {
        let x = Integer::from_digits(self.take(len), Order::Msf);
        if &x >= bound {
            return Err(ProofError::Decode {
                message: self.message,
                field: field.into(),
                reason: "out of range".into(),
            });
        }
        Ok(x)
    }
}

/// A uniformly random prime of exactly `bits` bits.
fn random_prime<R: RngCore + CryptoRng + ?Sized>(bits: u32, rng: &mut R) -> Integer {
    let mut buf = vec![0u8; bits.div_ceil(8) as usize];
    loop {
        rng.fill_bytes(&mut buf);
        let mut x = Integer::from_digits(&buf, Order::Msf);
        x.keep_bits_mut(bits);
        x.set_bit(bits - 1, true);
        x.set_bit(0, true);
        if x.is_probably_prime(L2_PRIME_TEST_REPS) != IsPrime::No {
            return x;
        }
    }
}

fn check_count(count: usize) -> Result<(), ProofError> {
    if count == 0 || count > MAX_COORDINATES {
        return Err(ProofError::InvalidInput(format!(
            "{count} ciphertexts; a proof covers 1..={MAX_COORDINATES}"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Template encryption keeping the nonces.
// ---------------------------------------------------------------------------------------------

/// D's encryption of its template coordinates (signed, encrypted as x mod N) under its own
/// key, keeping each nonce r_i: the plaintext-knowledge proof needs r_i itself, not only r_i^N.
/// r_i^N is computed by the CRT ([`SecretKey::nonce_power`]). The nonces are secret (with the
/// ciphertexts they reveal the template): drop them after proving.
pub fn encrypt_template_with_nonces<R: RngCore + CryptoRng + ?Sized>(
    sk: &SecretKey,
    values: &[i64],
    rng: &mut R,
) -> Result<(Vec<Ciphertext>, Vec<Integer>), ProofError> {
    encrypt_template_with_nonces_parallel(sk, values, 1, rng)
}

/// [`encrypt_template_with_nonces`] with the exponentiations spread over `threads` threads
/// (the same output for the same `rng` whatever the thread count).
pub fn encrypt_template_with_nonces_parallel<R: RngCore + CryptoRng + ?Sized>(
    sk: &SecretKey,
    values: &[i64],
    threads: usize,
    rng: &mut R,
) -> Result<(Vec<Ciphertext>, Vec<Integer>), ProofError> {
    let pk = sk.public_key();
    check_count(values.len())?;
    let plaintexts = values
        .iter()
        .map(|&v| pk.reduce_signed(&Integer::from(v)))
        .collect::<Result<Vec<_>, _>>()?;
    let nonces: Vec<Integer> = values.iter().map(|_| random_unit(pk.n(), rng)).collect();
    let jobs: Vec<(&Integer, &Integer)> = plaintexts.iter().zip(&nonces).collect();
    let ciphertexts = par_map(&jobs, threads, |(m, r)| sk.encrypt_with(m, r))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok((ciphertexts, nonces))
}

// ---------------------------------------------------------------------------------------------
// [ABMR20] Fig. 9: batched proof of plaintext knowledge.
// ---------------------------------------------------------------------------------------------

/// Batched proof of knowledge of plaintexts and nonces, [ABMR20] §8.2 and Fig. 9
/// (generalising [CDN01]), non-interactive by Fiat–Shamir: for ciphertexts c_1..c_n under
/// D's key, D knows (x_i, r_i) with c_i = Enc(x_i; r_i) = (1 + N)^{x_i} r_i^N mod N².
///
/// * Fig. 9 step 1: P draws s ← Z_N, u ← Z_N^* and commits a = ⟦s; u⟧.
/// * Step 2 (here a hash): e_1..e_n are SHA-256 of (domain tag, session id, N, n, all c_i, a),
///   each [`CHALLENGE_BITS`] bits.
/// * Step 3: P answers w = s + Σ e_i x_i mod N and z = u · Π r_i^{e_i} mod N.
/// * Step 4: V accepts iff Enc(w; z) = a · Π c_i^{e_i} (mod N²), with w ∈ [0, N) and
///   z ∈ Z_N^* (canonical answers: no second encoding of the same proof verifies).
///
/// **The g^t factor.** Fig. 9 has z = u · g^t · Π r_i^{e_i} mod N² with tN + w = s + Σe_ix_i.
/// With g = N + 1, g^{tN} = (1 + N)^{tN} ≡ 1 (mod N²), so Enc(w; z) = g^w z^N does not depend
/// on the factor g^t, nor on z beyond z mod N ((z + kN)^N ≡ z^N mod N²). Sending z mod N is
/// the same proof in half the bytes and without malleable encodings.
///
/// **Challenges of 128 bits instead of Z_N^*.** The extractor of Appendix F.1 rewinds with
/// e_i replaced by e_i + 1 and reads x_i = w_i − w_0, r_i = z_i / z_0. In general, two
/// accepting answers to challenge vectors that differ only in coordinate i, by
/// δ = e_i − e'_i ≠ 0, give g^{w−w'} (z/z')^N = c_i^δ; if gcd(δ, N) = 1, with aδ + bN = 1,
/// c_i = g^{a(w−w')} ((z/z')^a c_i^b)^N, a witness. Here 0 < |δ| < 2^128, while every prime
/// factor of N exceeds 2^128 (the key proof: trial division and Π^fac, factors ≥ √N / 2^257),
/// so δ is always invertible modulo N. Each coordinate's challenge has 2^128 values, so the
/// knowledge error is 2^−128 per hash query, the same as the target; challenges from Z_N would
/// add nothing but make V's Π c_i^{e_i} modulo N² (the dominant cost of verification) about
/// |N|/128 = 24 times longer. Honest-verifier zero knowledge is unchanged (the simulator of
/// F.1 draws w, z uniformly and sets a = Enc(w; z) / Π c_i^{e_i}).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlaintextKnowledgeProof {
    /// a = ⟦s; u⟧ (Fig. 9 step 1).
    commitment: Ciphertext,
    /// w = s + Σ e_i x_i mod N.
    w: Integer,
    /// z = u · Π r_i^{e_i} mod N.
    z: Integer,
}

/// The Fiat–Shamir challenges e_1..e_n of Fig. 9 step 2.
fn pok_challenges(
    pk: &PublicKey,
    session: &[u8],
    ciphertexts: &[Ciphertext],
    commitment: &Ciphertext,
) -> Vec<Integer> {
    let mut t = Transcript::new(POK_TAG);
    t.append(b"session", session);
    t.append(b"N", &pk.to_bytes());
    t.append(b"n", &(ciphertexts.len() as u64).to_be_bytes());
    for c in ciphertexts {
        t.append(b"c", &pk.ciphertext_to_bytes(c));
    }
    t.append(b"commitment", &pk.ciphertext_to_bytes(commitment));
    t.challenges(ciphertexts.len())
}

impl PlaintextKnowledgeProof {
    /// D's proof (Fig. 9, P's steps) for `ciphertexts` = Enc(values_i; nonces_i) under `sk`'s
    /// key, bound to `session`. A wrong witness gives a proof that does not verify.
    pub fn prove<R: RngCore + CryptoRng + ?Sized>(
        sk: &SecretKey,
        session: &[u8],
        ciphertexts: &[Ciphertext],
        values: &[i64],
        nonces: &[Integer],
        rng: &mut R,
    ) -> Result<Self, ProofError> {
        let pk = sk.public_key();
        check_count(ciphertexts.len())?;
        if values.len() != ciphertexts.len() || nonces.len() != ciphertexts.len() {
            return Err(ProofError::InvalidInput(format!(
                "{} ciphertexts, {} values, {} nonces",
                ciphertexts.len(),
                values.len(),
                nonces.len()
            )));
        }
        for r in nonces {
            if *r <= 0 || r >= pk.n() {
                return Err(PaillierError::BadNonce.into());
            }
        }
        let mut s = random_below(pk.n(), rng);
        let mut u = random_unit(pk.n(), rng);
        let commitment = sk.encrypt_with(&s, &u)?;
        let e = pok_challenges(pk, session, ciphertexts, &commitment);
        // w = s + Σ e_i x_i mod N, x_i the plaintexts in [0, N).
        let mut w = s.clone();
        for (e_i, v) in e.iter().zip(values) {
            let x = pk.reduce_signed(&Integer::from(*v))?;
            w += e_i * x;
        }
        w %= pk.n();
        // z = u · Π r_i^{e_i} mod N (secret bases, public exponents).
        let bases: Vec<&Integer> = nonces.iter().collect();
        let mut z = multi_exp(&bases, &e, pk.n());
        z *= &u;
        z %= pk.n();
        wipe_integer(&mut s);
        wipe_integer(&mut u);
        Ok(Self { commitment, w, z })
    }

    /// SP's check (Fig. 9 step 4) of the proof for `ciphertexts` under `pk` and `session`.
    pub fn verify(
        &self,
        pk: &PublicKey,
        session: &[u8],
        ciphertexts: &[Ciphertext],
    ) -> Result<(), ProofError> {
        check_count(ciphertexts.len())?;
        let reject = |check: &str| ProofError::Rejected {
            proof: POK_PROOF,
            check: check.into(),
        };
        if self.w < 0 || &self.w >= pk.n() {
            return Err(reject("w is not in [0, N)"));
        }
        // Enc(w; z) refuses z outside Z_N^*.
        let lhs = pk
            .encrypt_with(&self.w, &self.z)
            .map_err(|_| reject("z is not in Z_N^*"))?;
        let e = pok_challenges(pk, session, ciphertexts, &self.commitment);
        let bases: Vec<&Integer> = ciphertexts.iter().map(Ciphertext::as_integer).collect();
        let mut rhs = multi_exp(&bases, &e, pk.n_squared());
        rhs *= self.commitment.as_integer();
        rhs %= pk.n_squared();
        if lhs.as_integer() != &rhs {
            return Err(reject("Enc(w; z) ≠ a · Π c_i^{e_i} (mod N²)"));
        }
        Ok(())
    }

    /// Bytes of the encoding under `pk`: a ciphertext and two elements of Z_N.
    pub fn encoded_len(pk: &PublicKey) -> usize {
        pk.ciphertext_bytes() + 2 * pk.modulus_bytes()
    }

    /// The encoding: a (fixed-length ciphertext) ‖ w ‖ z (each |N| bytes, big-endian).
    pub fn to_bytes(&self, pk: &PublicKey) -> Vec<u8> {
        let mut out = pk.ciphertext_to_bytes(&self.commitment);
        out.extend(fixed_be(&self.w, pk.modulus_bytes()));
        out.extend(fixed_be(&self.z, pk.modulus_bytes()));
        out
    }

    /// Decodes [`Self::to_bytes`]: exact length, a valid ciphertext, w and z below N.
    pub fn from_bytes(pk: &PublicKey, bytes: &[u8]) -> Result<Self, ProofError> {
        let mut r = Reader::new(POK_PROOF, bytes, Self::encoded_len(pk))?;
        let commitment = r.ciphertext(pk, "commitment".into())?;
        let w = r.below(pk.modulus_bytes(), pk.n(), "w")?;
        let z = r.below(pk.modulus_bytes(), pk.n(), "z")?;
        Ok(Self { commitment, w, z })
    }
}

// ---------------------------------------------------------------------------------------------
// [ABMR20] Fig. 10: L2 norm.
// ---------------------------------------------------------------------------------------------

/// SP's state in the L2-norm proof of [ABMR20] §8.3 and Fig. 10: its private coins α, β, β̂,
/// the prime N̂ and the claimed value y = Σ x_i² (public). Made by [`Self::challenge`], used
/// once by [`Self::check`]; the coins are wiped on drop.
///
/// **Protocol.** V draws N̂, α ← [0, 2^{2λ}), ρ_i, β, β̂ ← Z_N and sends ⟦w_i⟧ = α⟦x_i⟧ + ⟦ρ_i⟧,
/// ⟦v⟧ = Σ(−2αρ_i⟦x_i⟧ − ρ_i²) + ⟦β⟧, ⟦v̂⟧ = Σ c_i⟦x_i⟧ + d + ⟦β̂⟧ with c_i = −2αρ_i mod N̂,
/// d = −Σρ_i² mod N̂, and N̂ ([`L2Challenge`]); P decrypts and answers z = v + Σw_i² mod N,
/// ẑ = v̂ + Σw_i² mod N̂ ([`L2Response`]); V accepts iff z = yα² + β (mod N) and
/// ẑ ≡ yα² + β̂ (mod N̂).
///
/// **Correctness for signed coordinates.** A coordinate X_i with |X_i| < 2^{m−1} is encrypted
/// as X_i mod N, and P decrypts residues in [0, N). The mod-N check needs nothing more. The
/// mod-N̂ check needs P's residues to be the integers of F.2 eq. (2): (i) w_i = αX_i + ρ_i must
/// lie in [0, N): for X_i < 0 it wraps iff ρ_i < |αX_i|, for X_i > 0 iff ρ_i ≥ N − αX_i; ρ_i
/// is uniform in Z_N, so the probability is |αX_i| / N < 2^{2λ+m−|N|} per coordinate
/// (2^{−2800} at |N| = 3072, m = 16); (ii) v̂ = ΣX_ic_i + d + β̂ must lie in [0, N): the
/// offset ΣX_ic_i + d has absolute value below n·N̂·2^{m−1} + N̂, so it wraps with probability
/// below 2n·N̂·2^{m−1}/N, again negligible. Then ẑ = Σ(αX_i + ρ_i)² + ΣX_ic_i + d + β̂ ≡
/// α²ΣX_i² + β̂ (mod N̂), as in F.2 eqs. (1)–(4).
///
/// **Fresh randomness in every ciphertext.** P holds the factorisation, so from any ciphertext
/// and its plaintext it can compute the nonce (the N-th root of c·(1+N)^{−m}). α⟦x_i⟧ alone
/// carries the nonce r_i^α, and a P that chose p − 1 smooth computes α from r_i^α by
/// Pohlig–Hellman, after which the MAC is void. So each ⟦w_i⟧, ⟦v⟧, ⟦v̂⟧ is multiplied by a
/// fresh s^N with s uniform in Z_N^* (Fig. 10's ⟦ρ_i⟧ = Plr.Enc(pk, ρ_i) is such a fresh
/// encryption). Cheaper sources of N-th residues are not safe here: P may take discrete
/// logarithms, and powers of one fixed residue hide nothing in the quotient of Z_N^* by the
/// cyclic group they span (P can choose p − 1 and q − 1 with a large common smooth factor),
/// while products of a few fixed residues leave α behind a hidden-subset-sum problem. So
/// these n + 2 exponentiations with the |N|-bit exponent N are V's main cost.
///
/// **Soundness modulo N.** With fresh nonces P's view (w_i, v, v̂ and their nonces) is
/// uniform and independent of α, β, β̂ (ρ_i, β, β̂ are uniform modulo N). P can compute the
/// honest γ = v + Σw_i² = α²Σx_i² + β, so answering yα² + β for y − Σx_i² = δ ≢ 0 (mod N)
/// means guessing α²δ mod N: at most 4 (2 if δ shares a factor with N) of the 2^256 values
/// of α do, all below both factors of N.
///
/// **N̂: a fresh random [`L2_PRIME_BITS`]-bit prime** instead of Fig. 10's "uniform prime
/// N̂ < N". If both checks pass, Σx_i² = y + tN (F.2) for an integer t fixed by the ciphertexts,
/// and also Σx_i² ≡ y (mod N̂); t ≠ 0 then requires N̂ | t. N̂ is drawn after the ciphertexts
/// (and the plaintext-knowledge proof) are fixed, and |t| < n·N/4, so t has at most
/// (|N| + log₂ n)/(k − 1) prime factors of k bits among about 2^{k−1}/(k ln 2) k-bit primes:
/// at k = 144, |N| = 3072, n ≤ 2^10 this is below 2^{−131} (at k = 128 it would be 2^{−115},
/// short of the 2^{−128} target, hence 144). A prime of |N| bits would give nothing more and
/// make the mod-N̂ arithmetic and ẑ as long as N. α is 2λ = 256 bits, far above k, so α mod N̂
/// and α² mod N̂ stay unpredictable (guessing α²·(y − Σx_i²) mod N̂ succeeds with
/// probability about 2/N̂).
pub struct L2Verifier {
    modulus: Integer,
    count: usize,
    y: Integer,
    n_hat: Integer,
    alpha: Integer,
    beta: Integer,
    beta_hat: Integer,
}

impl Drop for L2Verifier {
    fn drop(&mut self) {
        wipe_integer(&mut self.alpha);
        wipe_integer(&mut self.beta);
        wipe_integer(&mut self.beta_hat);
    }
}

impl std::fmt::Debug for L2Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "L2Verifier({} ciphertexts, y = {}, <coins redacted>)",
            self.count, self.y
        )
    }
}

/// V → P in Fig. 10: ⟦w_1⟧..⟦w_n⟧, ⟦v⟧, ⟦v̂⟧ and N̂.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct L2Challenge {
    w: Vec<Ciphertext>,
    v: Ciphertext,
    v_hat: Ciphertext,
    n_hat: Integer,
}

/// P → V in Fig. 10: z ∈ Z_N and ẑ ∈ Z_N̂.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct L2Response {
    z: Integer,
    z_hat: Integer,
}

impl L2Verifier {
    /// SP's first message of Fig. 10 for the ciphertexts `ciphertexts` and the claimed public
    /// value y = Σ x_i², with its state. Call it only after the ciphertexts are fixed (received
    /// and their plaintext-knowledge proof verified): N̂ must be drawn after them.
    pub fn challenge<R: RngCore + CryptoRng + ?Sized>(
        pk: &PublicKey,
        ciphertexts: &[Ciphertext],
        y: &Integer,
        rng: &mut R,
    ) -> Result<(Self, L2Challenge), ProofError> {
        Self::challenge_parallel(pk, ciphertexts, y, 1, rng)
    }

    /// [`Self::challenge`] with the exponentiations spread over `threads` threads.
    pub fn challenge_parallel<R: RngCore + CryptoRng + ?Sized>(
        pk: &PublicKey,
        ciphertexts: &[Ciphertext],
        y: &Integer,
        threads: usize,
        rng: &mut R,
    ) -> Result<(Self, L2Challenge), ProofError> {
        Self::challenge_inner(pk, ciphertexts, y, None, threads, rng)
    }

    /// [`Self::challenge_parallel`] taking the fresh N-th powers from `pool`, a [`NoncePool`]
    /// of D's key filled ahead of time (computed on the spot where it runs short). The n + 2
    /// powers are V's main cost and depend on N only, so SP can fill the pool as soon as it
    /// has D's public key, while D encrypts its template; the challenge then costs only the
    /// multi-exponentiations. `pool` must belong to `pk` (a pool of another key gives a
    /// challenge that the honest prover cannot answer).
    pub fn challenge_with_pool<R: RngCore + CryptoRng + ?Sized>(
        pk: &PublicKey,
        ciphertexts: &[Ciphertext],
        y: &Integer,
        pool: &mut NoncePool,
        threads: usize,
        rng: &mut R,
    ) -> Result<(Self, L2Challenge), ProofError> {
        Self::challenge_inner(pk, ciphertexts, y, Some(pool), threads, rng)
    }

    fn challenge_inner<R: RngCore + CryptoRng + ?Sized>(
        pk: &PublicKey,
        ciphertexts: &[Ciphertext],
        y: &Integer,
        pool: Option<&mut NoncePool>,
        threads: usize,
        rng: &mut R,
    ) -> Result<(Self, L2Challenge), ProofError> {
        let n = pk.n();
        let count = ciphertexts.len();
        let (verifier, mut rho) = Self::draw_coins(pk, count, y, rng)?;
        let Self {
            n_hat,
            alpha,
            beta,
            beta_hat,
            ..
        } = &verifier;
        // s^N for every ciphertext sent: the dominant cost, independent per item; from the
        // pool as far as it goes.
        let mut fresh_powers: Vec<Integer> = match pool {
            Some(pool) => (0..pool.len().min(count + 2))
                .map(|_| pool.take(rng))
                .collect(),
            None => Vec::new(),
        };
        let mut fresh: Vec<Integer> = (fresh_powers.len()..count + 2)
            .map(|_| random_unit(n, rng))
            .collect();
        for power in par_map(&fresh, threads, |s| pk.nonce_power(s)) {
            fresh_powers.push(power?);
        }

        // ⟦w_i⟧ = ⟦x_i⟧^α · (1 + ρ_i N) · s_i^N.
        let jobs: Vec<(&Ciphertext, (&Integer, &Integer))> = ciphertexts
            .iter()
            .zip(rho.iter().zip(&fresh_powers[..count]))
            .collect();
        let w = par_map(&jobs, threads, |(c, (rho_i, s_n))| {
            let scaled = pk.mul_plain(c, alpha);
            pk.rerandomize(&pk.add_plain(&scaled, rho_i), s_n)
        });

        // Exponents −2αρ_i mod N (for v) and c_i = −2αρ_i mod N̂ (for v̂).
        let mut exps_n = Vec::with_capacity(count);
        let mut exps_hat = Vec::with_capacity(count);
        let mut rho_sq_sum = Integer::new();
        for rho_i in &rho {
            let mut t = (alpha * rho_i).complete();
            t <<= 1u32;
            t = -t;
            exps_hat.push(t.modulo_ref(n_hat).complete());
            exps_n.push(t.modulo(n));
            rho_sq_sum += rho_i.square_ref().complete();
        }
        let bases: Vec<&Integer> = ciphertexts.iter().map(Ciphertext::as_integer).collect();

        // ⟦v⟧ = Π ⟦x_i⟧^{−2αρ_i} · (1 + (β − Σρ_i²) N) · s^N.
        let v_core = multi_exp_parallel(&bases, &exps_n, pk.n_squared(), threads);
        let v_plain = (beta - &rho_sq_sum).complete();
        let v = pk.rerandomize(
            &pk.add_plain(&pk.ciphertext_from_integer(v_core)?, &v_plain),
            &fresh_powers[count],
        );

        // ⟦v̂⟧ = Π ⟦x_i⟧^{c_i} · (1 + (d + β̂) N) · s'^N with d = −Σρ_i² mod N̂.
        let v_hat_core = multi_exp_parallel(&bases, &exps_hat, pk.n_squared(), threads);
        let d = (-&rho_sq_sum).complete().modulo(n_hat);
        let v_hat_plain = (d + beta_hat).modulo(n);
        let v_hat = pk.rerandomize(
            &pk.add_plain(&pk.ciphertext_from_integer(v_hat_core)?, &v_hat_plain),
            &fresh_powers[count + 1],
        );

        for x in rho
            .iter_mut()
            .chain(fresh.iter_mut())
            .chain(fresh_powers.iter_mut())
            .chain(exps_n.iter_mut())
            .chain(exps_hat.iter_mut())
        {
            wipe_integer(x);
        }
        wipe_integer(&mut rho_sq_sum);

        let n_hat = n_hat.clone();
        Ok((verifier, L2Challenge { w, v, v_hat, n_hat }))
    }

    /// V's coins of Fig. 10 — N̂, α, ρ_1..ρ_n, β, β̂, drawn from `rng` in this order before
    /// anything else — as the verifier and the ρ_i (which only the challenge needs).
    fn draw_coins<R: RngCore + CryptoRng + ?Sized>(
        pk: &PublicKey,
        count: usize,
        y: &Integer,
        rng: &mut R,
    ) -> Result<(Self, Vec<Integer>), ProofError> {
        check_count(count)?;
        if *y < 0 || y >= pk.n() {
            return Err(ProofError::InvalidInput(
                "the claimed squared norm y must be in [0, N)".into(),
            ));
        }
        let n = pk.n();
        let n_hat = random_prime(L2_PRIME_BITS, rng);
        let alpha = random_below(&(Integer::from(1) << MAC_KEY_BITS), rng);
        let rho: Vec<Integer> = (0..count).map(|_| random_below(n, rng)).collect();
        let beta = random_below(n, rng);
        let beta_hat = random_below(n, rng);
        let verifier = Self {
            modulus: n.clone(),
            count,
            y: y.clone(),
            n_hat,
            alpha,
            beta,
            beta_hat,
        };
        Ok((verifier, rho))
    }

    /// The verifier of a challenge that [`Self::challenge`] (or its variants) drew from a
    /// generator in the same state as `rng`, for `count` ciphertexts under `pk` and the same
    /// y: V's coins are drawn first, so replaying them rebuilds the verifier without the
    /// challenge's exponentiations (n + 2 fresh N-th powers and two multi-exponentiations).
    /// This lets a service keep only the generator's seed between the two messages of
    /// Fig. 10.
    pub fn redraw<R: RngCore + CryptoRng + ?Sized>(
        pk: &PublicKey,
        count: usize,
        y: &Integer,
        rng: &mut R,
    ) -> Result<Self, ProofError> {
        let (verifier, mut rho) = Self::draw_coins(pk, count, y, rng)?;
        rho.iter_mut().for_each(wipe_integer);
        Ok(verifier)
    }

    /// The number of ciphertexts the proof covers.
    pub fn count(&self) -> usize {
        self.count
    }

    /// V's decision (Fig. 10, last step): z = yα² + β (mod N) and ẑ ≡ yα² + β̂ (mod N̂), with
    /// z ∈ [0, N) and ẑ ∈ [0, N̂). Consumes the state: one answer per challenge, so that a
    /// prover cannot learn about α from repeated attempts.
    pub fn check(self, response: &L2Response) -> Result<(), ProofError> {
        let reject = |check: &str| ProofError::Rejected {
            proof: L2_PROOF,
            check: check.into(),
        };
        if response.z < 0 || response.z >= self.modulus {
            return Err(reject("z is not in [0, N)"));
        }
        if response.z_hat < 0 || response.z_hat >= self.n_hat {
            return Err(reject("ẑ is not in [0, N̂)"));
        }
        let mut y_alpha2 = self.alpha.square_ref().complete();
        y_alpha2 *= &self.y;
        let expected = (&y_alpha2 + &self.beta).complete().modulo(&self.modulus);
        let expected_hat = (&y_alpha2 + &self.beta_hat).complete().modulo(&self.n_hat);
        wipe_integer(&mut y_alpha2);
        if response.z != expected {
            return Err(reject("z ≠ yα² + β (mod N): the norm is not y modulo N"));
        }
        if response.z_hat != expected_hat {
            return Err(reject(
                "ẑ ≠ yα² + β̂ (mod N̂): the norm is not y over the integers",
            ));
        }
        Ok(())
    }
}

impl L2Challenge {
    /// The prime N̂.
    pub fn n_hat(&self) -> &Integer {
        &self.n_hat
    }

    /// The number of coordinates (⟦w_i⟧) in the challenge.
    pub fn count(&self) -> usize {
        self.w.len()
    }

    /// Bytes of the encoding for `count` coordinates under `pk`.
    pub fn encoded_len(pk: &PublicKey, count: usize) -> usize {
        (count + 2) * pk.ciphertext_bytes() + L2_PRIME_BYTES
    }

    /// The encoding: ⟦w_1⟧ ‖ … ‖ ⟦w_n⟧ ‖ ⟦v⟧ ‖ ⟦v̂⟧ ‖ N̂ (fixed-length ciphertexts,
    /// [`L2_PRIME_BYTES`] for N̂).
    pub fn to_bytes(&self, pk: &PublicKey) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(pk, self.w.len()));
        for c in self.w.iter().chain([&self.v, &self.v_hat]) {
            out.extend(pk.ciphertext_to_bytes(c));
        }
        out.extend(fixed_be(&self.n_hat, L2_PRIME_BYTES));
        out
    }

    /// Decodes [`Self::to_bytes`] for `count` coordinates (P knows how many it sent): exact
    /// length, valid ciphertexts, N̂ an odd number of exactly [`L2_PRIME_BITS`] bits.
    pub fn from_bytes(pk: &PublicKey, count: usize, bytes: &[u8]) -> Result<Self, ProofError> {
        check_count(count)?;
        const MESSAGE: &str = "L2 challenge ([ABMR20] Fig. 10, V → P)";
        let mut r = Reader::new(MESSAGE, bytes, Self::encoded_len(pk, count))?;
        let w = (0..count)
            .map(|i| r.ciphertext(pk, format!("w[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let v = r.ciphertext(pk, "v".into())?;
        let v_hat = r.ciphertext(pk, "v_hat".into())?;
        let n_hat = Integer::from_digits(r.take(L2_PRIME_BYTES), Order::Msf);
        let challenge = Self { w, v, v_hat, n_hat };
        challenge
            .check_n_hat()
            .map_err(|reason| ProofError::Decode {
                message: MESSAGE,
                field: "n_hat".into(),
                reason,
            })?;
        Ok(challenge)
    }

    fn check_n_hat(&self) -> Result<(), String> {
        if self.n_hat.significant_bits() != L2_PRIME_BITS || self.n_hat.is_even() {
            return Err(format!("not an odd {L2_PRIME_BITS}-bit number"));
        }
        if self.n_hat.is_probably_prime(L2_PRIME_TEST_REPS) == IsPrime::No {
            return Err("not a prime".into());
        }
        Ok(())
    }
}

impl L2Response {
    /// D's answer (Fig. 10, P's step): decrypts ⟦w_i⟧, ⟦v⟧, ⟦v̂⟧ and returns
    /// z = v + Σw_i² mod N, ẑ = v̂ + Σw_i² mod N̂ (w_i as integers in [0, N)).
    pub fn respond(sk: &SecretKey, challenge: &L2Challenge) -> Result<Self, ProofError> {
        Self::respond_parallel(sk, challenge, 1)
    }

    /// [`Self::respond`] with the decryptions spread over `threads` threads.
    pub fn respond_parallel(
        sk: &SecretKey,
        challenge: &L2Challenge,
        threads: usize,
    ) -> Result<Self, ProofError> {
        check_count(challenge.w.len())?;
        challenge
            .check_n_hat()
            .map_err(|reason| ProofError::InvalidInput(format!("N̂ {reason}")))?;
        let pk = sk.public_key();
        let all: Vec<&Ciphertext> = challenge
            .w
            .iter()
            .chain([&challenge.v, &challenge.v_hat])
            .collect();
        let plain = par_map(&all, threads, |c| sk.decrypt(c));
        let count = challenge.w.len();
        let mut sum_sq = Integer::new();
        for w_i in &plain[..count] {
            sum_sq += w_i.square_ref().complete();
        }
        let z = (&plain[count] + &sum_sq).complete().modulo(pk.n());
        let z_hat = (&plain[count + 1] + &sum_sq)
            .complete()
            .modulo(&challenge.n_hat);
        Ok(Self { z, z_hat })
    }

    /// Bytes of the encoding under `pk`.
    pub fn encoded_len(pk: &PublicKey) -> usize {
        pk.modulus_bytes() + L2_PRIME_BYTES
    }

    /// The encoding: z (|N| bytes) ‖ ẑ ([`L2_PRIME_BYTES`]), big-endian.
    pub fn to_bytes(&self, pk: &PublicKey) -> Vec<u8> {
        let mut out = fixed_be(&self.z, pk.modulus_bytes());
        out.extend(fixed_be(&self.z_hat, L2_PRIME_BYTES));
        out
    }

    /// Decodes [`Self::to_bytes`]: exact length, z < N, ẑ < 2^[`L2_PRIME_BITS`] (ẑ < N̂ is
    /// checked by [`L2Verifier::check`], which knows N̂).
    pub fn from_bytes(pk: &PublicKey, bytes: &[u8]) -> Result<Self, ProofError> {
        const MESSAGE: &str = "L2 response ([ABMR20] Fig. 10, P → V)";
        let mut r = Reader::new(MESSAGE, bytes, Self::encoded_len(pk))?;
        let z = r.below(pk.modulus_bytes(), pk.n(), "z")?;
        let z_hat = r.below(
            L2_PRIME_BYTES,
            &(Integer::from(1) << L2_PRIME_BITS),
            "z_hat",
        )?;
        Ok(Self { z, z_hat })
    }
}

// ---------------------------------------------------------------------------------------------
// Slack coordinates: four squares.
// ---------------------------------------------------------------------------------------------

/// The four slack coordinates D appends to `values` so that Σ values_i² + Σ s_j² = ζ²
/// (`bound_squared` = ζ², the public norm bound): the L2 proof over all ℓ + 4 ciphertexts with
/// y = ζ² then shows ‖values‖² ≤ ζ². Errors if ‖values‖² > ζ².
pub fn norm_slack<R: RngCore + ?Sized>(
    values: &[i64],
    bound_squared: u64,
    rng: &mut R,
) -> Result<[i64; SLACK_COORDINATES], ProofError> {
    let mut sum: u128 = 0;
    for &v in values {
        let sq = u128::from(v.unsigned_abs()).pow(2);
        sum = sum
            .checked_add(sq)
            .ok_or_else(|| ProofError::InvalidInput("template norm overflows".into()))?;
    }
    let bound = u128::from(bound_squared);
    if sum > bound {
        return Err(ProofError::InvalidInput(format!(
            "template squared norm {sum} exceeds the bound ζ² = {bound_squared}"
        )));
    }
    // sum ≤ bound_squared < 2^64, so the difference fits; each root is below 2^32.
    let rest = (bound - sum) as u64;
    Ok(four_squares(rest, rng).map(|r| r as i64))
}

/// `values` followed by their [`norm_slack`] coordinates: the ℓ + 4 integers D encrypts.
pub fn template_with_slack<R: RngCore + ?Sized>(
    values: &[i64],
    bound_squared: u64,
    rng: &mut R,
) -> Result<Vec<i64>, ProofError> {
    let slack = norm_slack(values, bound_squared, rng)?;
    let mut out = values.to_vec();
    out.extend(slack);
    Ok(out)
}

/// Four integers a, b, c, d ≥ 0 with a² + b² + c² + d² = n (Lagrange's four-square theorem),
/// by the randomized algorithm of Rabin and Shallit ("Randomized algorithms in number theory",
/// Comm. Pure Appl. Math. 1986): remove factors of 4 (n = 4^k m, then scale the roots by 2^k);
/// draw a, b ≤ √(m/2) with parities that make m − a² − b² ≡ 1 (mod 4) until it is a prime p
/// (or 1); split p = c² + d² with a square root of −1 modulo p and the Euclidean algorithm
/// (Hermite–Serret / Cornacchia). About ln(n)/2 draws are expected, each a deterministic
/// Miller–Rabin test; small m (< 2^16) are searched exhaustively.
pub fn four_squares<R: RngCore + ?Sized>(n: u64, rng: &mut R) -> [u64; 4] {
    if n == 0 {
        return [0; 4];
    }
    let shift = n.trailing_zeros() / 2;
    let m = n >> (2 * shift);
    four_squares_not_multiple_of_4(m, rng).map(|r| r << shift)
}

/// Below this, [`four_squares`] searches exhaustively (the random draws need room).
const FOUR_SQUARES_SEARCH_BELOW: u64 = 1 << 16;

/// Random draws before [`four_squares`] falls back to the exhaustive search (never reached in
/// practice: the expected number is about 22 at 2^64).
const FOUR_SQUARES_MAX_DRAWS: u32 = 1 << 20;

fn four_squares_not_multiple_of_4<R: RngCore + ?Sized>(m: u64, rng: &mut R) -> [u64; 4] {
    if m < FOUR_SQUARES_SEARCH_BELOW {
        return four_squares_search(m);
    }
    let limit = (m / 2).isqrt();
    // Parities of (a, b) making a² + b² ≡ m − 1 (mod 4).
    let (parity_a, parity_b) = match m % 4 {
        1 => (0, 0),
        2 => (1, 0),
        _ => (1, 1),
    };
    let draw = |rng: &mut R, parity: u64| loop {
        let x = rng.next_u64() % (limit + 1);
        if x % 2 == parity {
            return x;
        }
    };
    for _ in 0..FOUR_SQUARES_MAX_DRAWS {
        let a = draw(rng, parity_a);
        let b = draw(rng, parity_b);
        // a², b² ≤ m/2, so the difference is non-negative.
        let p = m - a * a - b * b;
        if p == 1 {
            return [a, b, 1, 0];
        }
        if is_prime_u64(p) {
            if let Some((c, d)) = two_squares_prime(p) {
                return [a, b, c, d];
            }
        }
    }
    four_squares_search(m)
}

/// Exhaustive search for a ≥ b ≥ c ≥ d with a² + b² + c² + d² = m, largest a first.
fn four_squares_search(m: u64) -> [u64; 4] {
    for a in (0..=m.isqrt()).rev() {
        let ra = m - a * a;
        for b in (0..=ra.isqrt().min(a)).rev() {
            let rb = ra - b * b;
            for c in (0..=rb.isqrt().min(b)).rev() {
                let rc = rb - c * c;
                let d = rc.isqrt();
                if d * d == rc && d <= c {
                    return [a, b, c, d];
                }
            }
        }
    }
    // Unreachable by Lagrange's theorem; every m has a sorted representation.
    [0; 4]
}

fn mul_mod_u64(a: u64, b: u64, m: u64) -> u64 {
    ((u128::from(a) * u128::from(b)) % u128::from(m)) as u64
}

fn pow_mod_u64(mut base: u64, mut exp: u64, m: u64) -> u64 {
    let mut acc = 1 % m;
    base %= m;
    while exp > 0 {
        if exp & 1 == 1 {
            acc = mul_mod_u64(acc, base, m);
        }
        base = mul_mod_u64(base, base, m);
        exp >>= 1;
    }
    acc
}

/// Deterministic Miller–Rabin for 64-bit integers: the first twelve primes as bases are
/// enough below 3.3 · 10^24.
fn is_prime_u64(n: u64) -> bool {
    const BASES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];
    if n < 2 {
        return false;
    }
    for p in BASES {
        if n.is_multiple_of(p) {
            return n == p;
        }
    }
    let s = (n - 1).trailing_zeros();
    let d = (n - 1) >> s;
    'bases: for a in BASES {
        let mut x = pow_mod_u64(a, d, n);
        if x == 1 || x == n - 1 {
            continue;
        }
        for _ in 1..s {
            x = mul_mod_u64(x, x, n);
            if x == n - 1 {
                continue 'bases;
            }
        }
        return false;
    }
    true
}

/// c, d with c² + d² = p for a prime p ≡ 1 (mod 4) (or p = 2): t² ≡ −1 (mod p) from a
/// quadratic non-residue, then the Euclidean algorithm on (p, t) stopped at the first
/// remainder below √p (Hermite–Serret; Cornacchia's algorithm for x² + y² = p).
fn two_squares_prime(p: u64) -> Option<(u64, u64)> {
    if p == 2 {
        return Some((1, 1));
    }
    if p % 4 != 1 {
        return None;
    }
    let quarter = (p - 1) / 4;
    // Half of all residues are non-residues; the least one is small.
    let t = (2..p.min(1 << 16)).find_map(|c| {
        let t = pow_mod_u64(c, quarter, p);
        (mul_mod_u64(t, t, p) == p - 1).then_some(t)
    })?;
    let (mut a, mut b) = (p, t);
    while u128::from(b) * u128::from(b) > u128::from(p) {
        (a, b) = (b, a % b);
    }
    let rest = p - b * b;
    let d = rest.isqrt();
    (d * d == rest).then_some((b, d))
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::{key_2048, small_key};
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    /// A template of `len` signed m-bit coordinates (|u_i| < 2^(m−1)).
    fn template(len: usize, m: u32, rng: &mut ChaCha20Rng) -> Vec<i64> {
        let half = 1i64 << (m - 1);
        (0..len)
            .map(|_| (rng.next_u64() % (2 * half as u64 - 1)) as i64 - (half - 1))
            .collect()
    }

    fn squared_norm(values: &[i64]) -> u64 {
        values.iter().map(|v| (v * v) as u64).sum()
    }

    #[test]
    fn multi_exp_matches_separate_exponentiations() {
        let mut rng = ChaCha20Rng::seed_from_u64(10);
        let sk = small_key();
        let m = sk.public_key().n_squared();
        for (count, bits) in [(1usize, 1u32), (3, 7), (17, 128), (40, 1024), (5, 3000)] {
            let bases: Vec<Integer> = (0..count).map(|_| random_below(m, &mut rng)).collect();
            let exps: Vec<Integer> = (0..count)
                .map(|i| {
                    if i == 1 {
                        Integer::ZERO
                    } else {
                        random_below(&(Integer::from(1) << bits), &mut rng)
                    }
                })
                .collect();
            let refs: Vec<&Integer> = bases.iter().collect();
            let mut naive = Integer::from(1);
            for (b, e) in bases.iter().zip(&exps) {
                naive *= b.pow_mod_ref(e, m).unwrap().complete();
                naive %= m;
            }
            assert_eq!(multi_exp(&refs, &exps, m), naive, "{count} × {bits} bits");
            assert_eq!(multi_exp_parallel(&refs, &exps, m, 3), naive);
        }
        assert_eq!(multi_exp(&[], &[], m), 1);
    }

    #[test]
    fn honest_plaintext_knowledge_proof_verifies_and_round_trips() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let values = template(20, 16, &mut rng);
        let (cts, nonces) = encrypt_template_with_nonces(sk, &values, &mut rng).unwrap();
        for (c, v) in cts.iter().zip(&values) {
            assert_eq!(sk.decrypt_signed(c), *v);
        }
        let proof =
            PlaintextKnowledgeProof::prove(sk, b"session-1", &cts, &values, &nonces, &mut rng)
                .unwrap();
        proof.verify(pk, b"session-1", &cts).unwrap();
        let bytes = proof.to_bytes(pk);
        assert_eq!(bytes.len(), PlaintextKnowledgeProof::encoded_len(pk));
        let decoded = PlaintextKnowledgeProof::from_bytes(pk, &bytes).unwrap();
        assert_eq!(decoded, proof);
        decoded.verify(pk, b"session-1", &cts).unwrap();
    }

    #[test]
    fn plaintext_knowledge_proof_refuses_tampering() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(12);
        let values = template(8, 16, &mut rng);
        let (cts, nonces) = encrypt_template_with_nonces(sk, &values, &mut rng).unwrap();
        let proof =
            PlaintextKnowledgeProof::prove(sk, b"s", &cts, &values, &nonces, &mut rng).unwrap();
        let is_rejected = |r: Result<(), ProofError>| matches!(r, Err(ProofError::Rejected { proof, .. }) if proof == POK_PROOF);

        // A wrong response w.
        let mut bad = proof.clone();
        bad.w = (&bad.w + 1u32).complete() % pk.n();
        assert!(is_rejected(bad.verify(pk, b"s", &cts)));
        // A wrong response z.
        let mut bad = proof.clone();
        bad.z = (&bad.z * 2u32).complete() % pk.n();
        assert!(is_rejected(bad.verify(pk, b"s", &cts)));
        // A tampered ciphertext (another plaintext).
        let mut tampered = cts.clone();
        tampered[3] = pk.add_plain(&tampered[3], &Integer::from(1));
        assert!(is_rejected(proof.verify(pk, b"s", &tampered)));
        // A reordered statement.
        let mut swapped = cts.clone();
        swapped.swap(0, 1);
        assert!(is_rejected(proof.verify(pk, b"s", &swapped)));
        // Another session.
        let err = proof.verify(pk, b"t", &cts).unwrap_err();
        assert!(err.to_string().contains("Fig. 9"), "{err}");
        assert!(is_rejected(Err(err)));
        // A proof made with a wrong witness.
        let mut wrong = values.clone();
        wrong[2] += 1;
        let bad =
            PlaintextKnowledgeProof::prove(sk, b"s", &cts, &wrong, &nonces, &mut rng).unwrap();
        assert!(is_rejected(bad.verify(pk, b"s", &cts)));
        // Non-canonical z (z + N) does not decode; w = N is refused.
        let mut bytes = proof.to_bytes(pk);
        let len = bytes.len();
        bytes[len - pk.modulus_bytes()..].copy_from_slice(&fixed_be(pk.n(), pk.modulus_bytes()));
        let err = PlaintextKnowledgeProof::from_bytes(pk, &bytes).unwrap_err();
        assert!(
            matches!(&err, ProofError::Decode { field, .. } if field == "z"),
            "{err}"
        );
        assert!(PlaintextKnowledgeProof::from_bytes(pk, &bytes[1..]).is_err());
        let mut bad = proof.clone();
        bad.w = pk.n().clone();
        assert!(is_rejected(bad.verify(pk, b"s", &cts)));
        // Length mismatches between statement and witness.
        assert!(matches!(
            PlaintextKnowledgeProof::prove(sk, b"s", &cts, &values[1..], &nonces, &mut rng),
            Err(ProofError::InvalidInput(_))
        ));
    }

    /// Runs Fig. 10 between an honest prover and the verifier with claimed norm `y`.
    fn run_l2(sk: &SecretKey, cts: &[Ciphertext], y: u64, seed: u64) -> Result<(), ProofError> {
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let (verifier, challenge) = L2Verifier::challenge(pk, cts, &Integer::from(y), &mut rng)?;
        // Through the encodings, as over the wire.
        let challenge = L2Challenge::from_bytes(pk, cts.len(), &challenge.to_bytes(pk)).unwrap();
        let response = L2Response::respond(sk, &challenge)?;
        let response = L2Response::from_bytes(pk, &response.to_bytes(pk)).unwrap();
        verifier.check(&response)
    }

    #[test]
    fn l2_proof_accepts_the_true_norm_only() {
        let sk = small_key();
        let mut rng = ChaCha20Rng::seed_from_u64(13);
        let values = template(16, 16, &mut rng);
        let (cts, _) = encrypt_template_with_nonces(sk, &values, &mut rng).unwrap();
        let y = squared_norm(&values);
        run_l2(sk, &cts, y, 1).unwrap();
        for wrong in [y - 1, y + 1] {
            let err = run_l2(sk, &cts, wrong, 2).unwrap_err();
            assert!(
                matches!(&err, ProofError::Rejected { proof, .. } if *proof == L2_PROOF),
                "{err}"
            );
        }
    }

    #[test]
    fn a_redrawn_verifier_decides_like_the_original() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(21);
        let values = template(16, 16, &mut rng);
        let (cts, _) = encrypt_template_with_nonces(sk, &values, &mut rng).unwrap();
        let y = Integer::from(squared_norm(&values));
        let seed = [7u8; 32];
        let (_, challenge) =
            L2Verifier::challenge(pk, &cts, &y, &mut ChaCha20Rng::from_seed(seed)).unwrap();
        let response = L2Response::respond(sk, &challenge).unwrap();
        let redraw =
            || L2Verifier::redraw(pk, cts.len(), &y, &mut ChaCha20Rng::from_seed(seed)).unwrap();
        let is_rejected = |r: Result<(), ProofError>| matches!(r, Err(ProofError::Rejected { proof, .. }) if proof == L2_PROOF);
        redraw().check(&response).unwrap();
        let mut wrong = response.clone();
        wrong.z += 1;
        assert!(is_rejected(redraw().check(&wrong)));
        // Another seed is another α: the honest answer to this challenge is refused.
        let other =
            L2Verifier::redraw(pk, cts.len(), &y, &mut ChaCha20Rng::from_seed([8u8; 32])).unwrap();
        assert!(is_rejected(other.check(&response)));
    }

    #[test]
    fn l2_proof_refuses_a_norm_that_only_holds_modulo_n() {
        // x_1 = x with x² ≡ y (mod N) but x² ≠ y over the integers: the mod-N check passes,
        // the mod-N̂ check must fail.
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(14);
        let x = Integer::from(1) << 600u32;
        let y_int = x.square_ref().complete() % pk.n();
        let c = pk.encrypt(&x, &mut rng).unwrap();
        let (verifier, challenge) =
            L2Verifier::challenge(pk, std::slice::from_ref(&c), &y_int, &mut rng).unwrap();
        let response = L2Response::respond(sk, &challenge).unwrap();
        let err = verifier.check(&response).unwrap_err();
        assert!(err.to_string().contains("over the integers"), "{err}");
        // And the true integer norm is refused as y: it is not below N.
        assert!(matches!(
            L2Verifier::challenge(pk, &[c], &x.square(), &mut rng),
            Err(ProofError::InvalidInput(_))
        ));
    }

    #[test]
    fn l2_messages_decode_strictly() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(15);
        let values = template(3, 16, &mut rng);
        let (cts, _) = encrypt_template_with_nonces(sk, &values, &mut rng).unwrap();
        let (verifier, challenge) =
            L2Verifier::challenge(pk, &cts, &Integer::from(squared_norm(&values)), &mut rng)
                .unwrap();
        assert!(challenge.n_hat().is_probably_prime(30) != IsPrime::No);
        assert_eq!(challenge.n_hat().significant_bits(), L2_PRIME_BITS);
        let bytes = challenge.to_bytes(pk);
        assert_eq!(bytes.len(), L2Challenge::encoded_len(pk, 3));
        assert!(L2Challenge::from_bytes(pk, 2, &bytes).is_err());
        let mut bad = bytes.clone();
        let ct = pk.ciphertext_bytes();
        bad[ct..2 * ct].fill(0);
        let err = L2Challenge::from_bytes(pk, 3, &bad).unwrap_err();
        assert!(
            matches!(&err, ProofError::Decode { field, .. } if field == "w[1]"),
            "{err}"
        );
        let mut bad = bytes.clone();
        let len = bad.len();
        bad[len - 1] ^= 1; // an even N̂
        let err = L2Challenge::from_bytes(pk, 3, &bad).unwrap_err();
        assert!(
            matches!(&err, ProofError::Decode { field, .. } if field == "n_hat"),
            "{err}"
        );

        let response = L2Response::respond(sk, &challenge).unwrap();
        let rb = response.to_bytes(pk);
        assert_eq!(rb.len(), L2Response::encoded_len(pk));
        assert!(L2Response::from_bytes(pk, &rb[1..]).is_err());
        // ẑ ≥ N̂ is refused by the check.
        let mut bad = response.clone();
        bad.z_hat += challenge.n_hat();
        let err = verifier.check(&bad).unwrap_err();
        assert!(err.to_string().contains("ẑ is not in"), "{err}");
    }

    #[test]
    fn slack_coordinates_make_the_norm_exact() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(16);
        let values = template(12, 16, &mut rng);
        let bound = squared_norm(&values) + 123_457;
        let full = template_with_slack(&values, bound, &mut rng).unwrap();
        assert_eq!(full.len(), values.len() + SLACK_COORDINATES);
        assert_eq!(squared_norm(&full), bound);
        let (cts, nonces) = encrypt_template_with_nonces(sk, &full, &mut rng).unwrap();
        PlaintextKnowledgeProof::prove(sk, b"e", &cts, &full, &nonces, &mut rng)
            .unwrap()
            .verify(pk, b"e", &cts)
            .unwrap();
        run_l2(sk, &cts, bound, 3).unwrap();
        assert!(run_l2(sk, &cts, bound + 1, 4).is_err());
        // A template above the bound has no slack.
        assert!(matches!(
            norm_slack(&values, squared_norm(&values) - 1, &mut rng),
            Err(ProofError::InvalidInput(_))
        ));
    }

    #[test]
    fn honest_proofs_verify_at_2048_bits() {
        let sk = key_2048();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(17);
        let values = template(8, 16, &mut rng);
        let full = template_with_slack(&values, squared_norm(&values) + 99, &mut rng).unwrap();
        let (cts, nonces) = encrypt_template_with_nonces_parallel(sk, &full, 2, &mut rng).unwrap();
        let proof =
            PlaintextKnowledgeProof::prove(sk, b"2048", &cts, &full, &nonces, &mut rng).unwrap();
        proof.verify(pk, b"2048", &cts).unwrap();
        assert!(proof.verify(pk, b"2047", &cts).is_err());
        let y = Integer::from(squared_norm(&full));
        let (verifier, challenge) =
            L2Verifier::challenge_parallel(pk, &cts, &y, 2, &mut rng).unwrap();
        let response = L2Response::respond_parallel(sk, &challenge, 2).unwrap();
        verifier.check(&response).unwrap();
    }

    #[test]
    fn l2_challenge_from_a_pool_verifies() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(20);
        let values = template(6, 16, &mut rng);
        let (cts, _) = encrypt_template_with_nonces(sk, &values, &mut rng).unwrap();
        let y = Integer::from(squared_norm(&values));
        // A full pool, and one that runs short (the rest is computed on the spot).
        for fill in [8usize, 3] {
            let mut pool = NoncePool::new(pk.clone());
            pool.fill_public(fill, &mut rng);
            let (verifier, challenge) =
                L2Verifier::challenge_with_pool(pk, &cts, &y, &mut pool, 2, &mut rng).unwrap();
            assert!(pool.is_empty());
            verifier
                .check(&L2Response::respond(sk, &challenge).unwrap())
                .unwrap();
        }
    }

    #[test]
    fn parallel_variants_give_the_same_messages() {
        let sk = small_key();
        let pk = sk.public_key();
        let values: Vec<i64> = (0..9).map(|i| i * 7 - 30).collect();
        let run = |threads: usize| {
            let mut rng = ChaCha20Rng::seed_from_u64(18);
            let (cts, nonces) =
                encrypt_template_with_nonces_parallel(sk, &values, threads, &mut rng).unwrap();
            let y = Integer::from(squared_norm(&values));
            let (_, challenge) =
                L2Verifier::challenge_parallel(pk, &cts, &y, threads, &mut rng).unwrap();
            let response = L2Response::respond_parallel(sk, &challenge, threads).unwrap();
            (cts, nonces, challenge, response)
        };
        assert_eq!(run(1), run(3));
    }

    #[test]
    fn four_squares_of_small_and_special_values() {
        let mut rng = ChaCha20Rng::seed_from_u64(19);
        let check = |n: u64, r: [u64; 4]| {
            let sum: u128 = r.iter().map(|&x| u128::from(x) * u128::from(x)).sum();
            assert_eq!(sum, u128::from(n), "{n} = {r:?}");
        };
        for n in 0..(1u64 << 13) {
            check(n, four_squares(n, &mut rng));
        }
        let mut special = vec![u64::MAX, u64::MAX - 1, (1 << 32) - 1, 1 << 63, 3 << 62];
        for k in 0..32 {
            special.push(1u64 << (2 * k)); // powers of 4
            special.push((1u64 << (2 * k)).saturating_mul(7)); // 7·4^k: needs four squares
            special.push((1u64 << (2 * k)).saturating_mul(15));
        }
        special.extend([FOUR_SQUARES_SEARCH_BELOW - 1, FOUR_SQUARES_SEARCH_BELOW]);
        special.extend([FOUR_SQUARES_SEARCH_BELOW + 1, FOUR_SQUARES_SEARCH_BELOW + 3]);
        for n in special {
            check(n, four_squares(n, &mut rng));
        }
        for _ in 0..20_000 {
            let n = rng.next_u64() >> (rng.next_u32() % 64);
            check(n, four_squares(n, &mut rng));
        }
    }

    #[test]
    fn number_theory_helpers() {
        let primes: Vec<u64> = (0..200).filter(|&n| is_prime_u64(n)).collect();
        assert_eq!(&primes[..10], &[2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert_eq!(primes.len(), 46);
        // Strong pseudoprimes to several small bases, and a large prime.
        for composite in [
            3_215_031_751u64,
            2_152_302_898_747,
            3_825_123_056_546_413_051,
        ] {
            assert!(!is_prime_u64(composite));
        }
        assert!(is_prime_u64(18_446_744_073_709_551_557)); // largest 64-bit prime
        for p in [5u64, 13, 17, 29, 1_000_000_009, 18_446_744_073_709_551_557] {
            if p % 4 == 1 {
                let (c, d) = two_squares_prime(p).unwrap();
                assert_eq!(u128::from(c).pow(2) + u128::from(d).pow(2), u128::from(p));
            }
        }
        assert_eq!(two_squares_prime(7), None);
    }
}
