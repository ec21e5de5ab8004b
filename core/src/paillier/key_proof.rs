//! # Well-formedness of the device's Paillier key: Π^mod and Π^fac of [CGGMP21]
//!
//! In the enrolment of Π2/Π3 ([ABMR20] §6.1, §8.1: Agrawal, Badrinarayanan, Mukherjee, Rindal,
//! "Game-Set-MATCH: Using Mobile Devices for Seamless External-Facing Biometric Matching",
//! CCS 2020, ePrint 2020/1363) the device D proves that its Paillier public key was correctly
//! generated. [ABMR20] uses the proof of Hazay, Mikkelsen, Rabin, Toft; we use instead the two
//! proofs of Canetti, Gennaro, Goldfeder, Makriyannis, Peled, "UC Non-Interactive, Proactive,
//! Threshold ECDSA with Identifiable Aborts", CCS 2020, ePrint 2021/060 [CGGMP21]:
//!
//! * **Π^mod**, the Paillier–Blum modulus proof: gcd(N, φ(N)) = 1 (every y has an N-th root z)
//!   and N is a product of two primes ≡ 3 (mod 4) as far as fourth roots can show (every y has
//!   a fourth root of ±w^b·y, for w of Jacobi symbol −1). [`MOD_PROOF_ROUNDS`] challenges, each
//!   failing with probability at least 1/2 for a bad N: soundness error 2^−128.
//! * **Π^fac**, the no-small-factor proof: both factors are at least √N / 2^{ℓ+ε+1}
//!   ([`FAC_CHALLENGE_BITS`] = ℓ, [`FAC_SLACK_BITS`] = ε; 2^1150 at |N| = 3072), with
//!   commitments in ring-Pedersen parameters (N̂, s, t) of the *verifier*
//!   ([`RingPedersenParams`]): SP generates them once (safe primes, t a random square, s = t^λ)
//!   and publishes them to devices. As SP made them it needs no proof about them; D trusts
//!   them as [ABMR20] trusts the semi-honest SP (against a malicious SP, D would need SP's
//!   Π^prm proof that s ∈ ⟨t⟩, or Π^fac could leak D's factors).
//!
//! Both are made non-interactive by Fiat–Shamir with SHA-256, the session id bound into the
//! hash of each. Verification and the challenge derivation are those of the `paillier-zk`
//! crate (0.4); the **provers are ours**: `paillier-zk`'s provers raise to exponents derived
//! from p and q (N⁻¹ mod φ(N), the square-root exponent, s^p) with GMP's variable-time
//! `mpz_powm`, while every exponent derived from the factors or from the prover's masks is
//! raised here with `mpz_powm_sec` ([`Integer::secure_pow_mod`]) and padded to a fixed size.
//! The proofs are the same objects (`paillier-zk`'s types), so either side can be swapped.
//! Working modulo p and q, our Π^mod prover is also about 4 × faster (at |N| = 3072 and 128
//! rounds, 3.9 s with `paillier-zk`'s prover, under 1 s for both proofs here).
//!
//! [`KeyProof::verify`] also checks what is cheap and says "malformed key" clearly: N has a
//! supported size, is odd, and has no prime factor below 2^16 (one gcd with the product of
//! those primes).

use std::sync::OnceLock;

use paillier_zk::no_small_factor;
use paillier_zk::paillier_blum_modulus;
use paillier_zk::paillier_blum_modulus::ProofPoint;
use rand_core::{CryptoRng, RngCore};
use rug::integer::Order;
use rug::{Complete, Integer};
use sha2::Sha256;

use super::cipher::{fixed_be, random_below, PublicKey, SecretKey, SUPPORTED_MODULUS_BITS};
use super::proofs::{wipe_integer, ProofError};
use crate::algebra::montgomery::{pow_mod, secure_pow_mod};

/// Π^mod challenges (m of [CGGMP21]): soundness error 2^−m.
pub const MOD_PROOF_ROUNDS: usize = 128;

/// ℓ of Π^fac: the challenge e is drawn from ±2^ℓ.
pub const FAC_CHALLENGE_BITS: usize = 128;

/// ε of Π^fac: the masks exceed the masked values by 2^ε. ε = 2ℓ because v = r + eσ̂
/// must hide eσ̂ with |eσ̂| ≈ 2^{2ℓ}·N·N̂ behind r of ±2^{ℓ+ε}·N·N̂ (statistical distance
/// 2^{ℓ−ε} = 2^−128).
pub const FAC_SLACK_BITS: usize = 256;

/// Sizes of N̂ that [`RingPedersenParams`] accepts: 2048 bits is the default; 1024 only for
/// tests (like the 1024-bit Paillier keys).
pub const RING_PEDERSEN_BITS: [u32; 3] = [1024, 2048, 3072];

/// The default size of N̂.
pub const DEFAULT_RING_PEDERSEN_BITS: u32 = 2048;

/// Trial division bound of [`KeyProof::verify`]: N must have no prime factor below it.
pub const SMALL_FACTOR_BOUND: u32 = 1 << 16;

/// Version byte of the [`KeyProof`] encoding.
const KEY_PROOF_VERSION: u8 = 1;

/// Domain tags of the two Fiat–Shamir hashes (`paillier-zk`'s shared state).
const MOD_TAG: &str = "privmatch/paillier/key-proof/CGGMP21-mod/v1";
const FAC_TAG: &str = "privmatch/paillier/key-proof/CGGMP21-fac/v1";

const MOD_PROOF: &str = "Π^mod (Paillier–Blum modulus, [CGGMP21])";
const FAC_PROOF: &str = "Π^fac (no small factor, [CGGMP21])";
const KEY_PROOF: &str = "key proof";
const RING_PEDERSEN: &str = "ring-Pedersen parameters";

/// Longest magnitude of a signed Π^fac value in the encoding (v has about
/// ℓ + ε + |N| + |N̂| bits, 832 bytes at 3072 + 3072).
const MAX_SIGNED_BYTES: usize = 1024;

// ---------------------------------------------------------------------------------------------
// Ring-Pedersen parameters of the verifier.
// ---------------------------------------------------------------------------------------------

/// The verifier's ring-Pedersen parameters for Π^fac ([CGGMP21]): N̂ = p̂q̂ with safe primes
/// p̂, q̂, t = τ² mod N̂ for a random τ, s = t^λ mod N̂ for a random λ < φ(N̂). SP generates them
/// once ([`Self::generate`]; the factors and λ are discarded) and publishes them
/// ([`Self::to_bytes`]); every device's Π^fac commits in them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingPedersenParams {
    n_hat: Integer,
    s: Integer,
    t: Integer,
}

impl RingPedersenParams {
    /// Fresh parameters with an N̂ of `bits` bits (one of [`RING_PEDERSEN_BITS`]). Safe-prime
    /// generation dominates: seconds at 1024 bits, a minute or more at 2048.
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(
        bits: u32,
        mut rng: &mut R,
    ) -> Result<Self, ProofError> {
        if !RING_PEDERSEN_BITS.contains(&bits) {
            return Err(ProofError::InvalidInput(format!(
                "ring-Pedersen modulus of {bits} bits; supported: {RING_PEDERSEN_BITS:?}"
            )));
        }
        let safe_prime = |rng: &mut &mut R| {
            paillier_zk::fast_paillier::utils::generate_safe_prime(rng, bits / 2)
        };
        loop {
            let mut p = safe_prime(&mut rng);
            // Safe primes of bits/2 bits give N̂ of bits − 1 or bits bits: keep p a few times.
            for _ in 0..4 {
                let mut q = safe_prime(&mut rng);
                let n_hat = (&p * &q).complete();
                if p == q || n_hat.significant_bits() != bits {
                    wipe_integer(&mut q);
                    continue;
                }
                let mut phi = (&p - 1u32).complete() * (&q - 1u32).complete();
                wipe_integer(&mut p);
                wipe_integer(&mut q);
                let mut tau = super::cipher::random_unit(&n_hat, rng);
                let t = tau.square_ref().complete() % &n_hat;
                let mut lambda = random_below(&phi, rng);
                wipe_integer(&mut phi);
                // s = t^λ for a random λ < φ(N̂): s ∈ ⟨t⟩, the discrete log λ is discarded.
                let s = secure_pow_mod(
                    &t,
                    &(&lambda + 1u32).complete(),
                    n_hat.significant_bits(),
                    &n_hat,
                );
                wipe_integer(&mut tau);
                wipe_integer(&mut lambda);
                let params = Self { n_hat, s, t };
                if params.check().is_ok() {
                    return Ok(params);
                }
                // t or s = 1 (negligible): start over.
                break;
            }
            wipe_integer(&mut p);
        }
    }

    /// N̂.
    pub fn n_hat(&self) -> &Integer {
        &self.n_hat
    }

    /// s.
    pub fn s(&self) -> &Integer {
        &self.s
    }

    /// t.
    pub fn t(&self) -> &Integer {
        &self.t
    }

    /// Byte length of N̂ (and of s and t in the encoding).
    pub fn modulus_bytes(&self) -> usize {
        self.n_hat.significant_bits().div_ceil(8) as usize
    }

    /// The encoding: N̂ ‖ s ‖ t, each big-endian in the byte length of N̂.
    pub fn to_bytes(&self) -> Vec<u8> {
        let len = self.modulus_bytes();
        let mut out = fixed_be(&self.n_hat, len);
        out.extend(fixed_be(&self.s, len));
        out.extend(fixed_be(&self.t, len));
        out
    }

    /// Decodes [`Self::to_bytes`]: three equal parts, N̂ odd of a supported size with its top
    /// byte non-zero, s and t units modulo N̂ other than 1.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ProofError> {
        let decode = |field: &str, reason: String| ProofError::Decode {
            message: RING_PEDERSEN,
            field: field.into(),
            reason,
        };
        let len = bytes.len() / 3;
        if !bytes.len().is_multiple_of(3)
            || !RING_PEDERSEN_BITS.iter().any(|b| (b / 8) as usize == len)
        {
            return Err(decode(
                "length",
                format!("{} bytes is not 3 × a supported modulus size", bytes.len()),
            ));
        }
        let part = |i: usize| Integer::from_digits(&bytes[i * len..(i + 1) * len], Order::Msf);
        let params = Self {
            n_hat: part(0),
            s: part(1),
            t: part(2),
        };
        params
            .check()
            .map_err(|(field, reason)| decode(field, reason))?;
        Ok(params)
    }

    fn check(&self) -> Result<(), (&'static str, String)> {
        let bits = self.n_hat.significant_bits();
        if !RING_PEDERSEN_BITS.contains(&bits) || self.n_hat.is_even() {
            return Err((
                "n_hat",
                format!("not an odd modulus of {RING_PEDERSEN_BITS:?} bits"),
            ));
        }
        for (field, x) in [("s", &self.s), ("t", &self.t)] {
            if *x <= 1 || x >= &self.n_hat || x.gcd_ref(&self.n_hat).complete() != 1 {
                return Err((field, "not a unit other than 1 modulo N̂".into()));
            }
        }
        Ok(())
    }

    /// `paillier-zk`'s view of the parameters (no precomputation: SP verifies without the
    /// factors of N̂, which it does not keep).
    fn aux(&self) -> no_small_factor::Aux {
        no_small_factor::Aux {
            s: self.s.clone(),
            t: self.t.clone(),
            rsa_modulo: self.n_hat.clone(),
            multiexp: None,
            crt: None,
        }
    }
}

impl serde::Serialize for RingPedersenParams {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> serde::Deserialize<'de> for RingPedersenParams {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserializer.deserialize_bytes(BytesVisitor)?;
        Self::from_bytes(&bytes).map_err(serde::de::Error::custom)
    }
}

/// Accepts a byte string, or a sequence of bytes (formats without a byte type, e.g. JSON).
struct BytesVisitor;

impl<'de> serde::de::Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(b) = seq.next_element::<u8>()? {
            out.push(b);
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Constant-time exponentiation helpers.
// ---------------------------------------------------------------------------------------------

/// Π^mod's verification ([CGGMP21] Fig. 16): N is odd and not prime, gcd(N, w) = 1, and for
/// each of paillier-zk's own Fiat–Shamir challenges y_i: z_i^N ≡ y_i and
/// x_i^4 ≡ (−1)^{a_i}·w^{b_i}·y_i (mod N). These are the checks of paillier-zk's
/// `interactive::verify`, in the same order, with the 128 N-th powers computed by
/// [`crate::algebra::montgomery::pow_mod`] (about 3× faster than GMP's where the CPU has AVX-512
/// IFMA); a proof verifies here exactly when it verifies there (tested both ways).
fn verify_mod_proof(
    n: &Integer,
    commitment: &paillier_blum_modulus::Commitment,
    proof: &paillier_blum_modulus::Proof<MOD_PROOF_ROUNDS>,
    session: &[u8],
) -> Result<(), &'static str> {
    if n.is_probably_prime(25) != rug::integer::IsPrime::No {
        return Err("the modulus is prime");
    }
    if n.is_even() {
        return Err("the modulus is even");
    }
    let w = &commitment.w;
    if n.gcd_ref(w).complete() != 1 {
        return Err("w shares a factor with N");
    }
    let data = paillier_blum_modulus::Data { n: n.clone() };
    let challenge = paillier_blum_modulus::non_interactive::challenge::<MOD_PROOF_ROUNDS, Sha256>(
        &shared_state(MOD_TAG, session),
        &data,
        commitment,
    );
    for (point, y) in proof.points.iter().zip(challenge.ys.iter()) {
        if pow_mod(&point.z, n, n) != *y {
            return Err("a point's z is not an N-th root of its challenge");
        }
        let mut target = if point.a {
            (n - y).complete()
        } else {
            y.clone()
        };
        if point.b {
            target = (target * w).modulo(n);
        }
        let mut fourth = point.x.square_ref().complete().modulo(n);
        fourth.square_mut();
        if fourth.modulo(n) != target {
            return Err("a point's x is not a fourth root of ±w^b·y");
        }
    }
    Ok(())
}

/// base^exp mod `prime` for a secret exponent, in constant time: `mpz_powm_sec` with the
/// exponent exp + 2(prime − 1), which gives the same result for every base (units by Fermat,
/// 0 as 0) and whose size no longer depends on exp (for primes of a whole number of 64-bit
/// limbs with the top bit set, it always has one limb more than the prime).
fn ct_pow_prime(base: &Integer, exp: &Integer, prime: &Integer) -> Integer {
    let mut e = (prime - 1u32).complete();
    e <<= 1u32;
    e += exp;
    let result = secure_pow_mod(base, &e, prime.significant_bits() + 2, prime);
    wipe_integer(&mut e);
    result
}

/// Signed secret exponents in [−bound, bound] raised in constant time modulo an odd modulus
/// of unknown order: base^x = base^{x + S} · base^{−S} with S = 2^k + bound, 2^k > 2·bound, so
/// that x + S always has exactly k + 1 bits; base^{−S} is public and computed once.
struct SignedPow<'a> {
    base: &'a Integer,
    modulus: &'a Integer,
    shift: Integer,
    correction: Integer,
}

impl<'a> SignedPow<'a> {
    fn new(base: &'a Integer, bound: &Integer, modulus: &'a Integer) -> Result<Self, ProofError> {
        let k = bound.significant_bits() + 2;
        let shift = (Integer::from(1) << k) + bound;
        let correction = base
            .pow_mod_ref(&(-&shift).complete(), modulus)
            .map(Integer::from)
            .ok_or_else(|| ProofError::InvalidInput("base not invertible modulo N̂".into()))?;
        Ok(Self {
            base,
            modulus,
            shift,
            correction,
        })
    }

    fn pow(&self, x: &Integer) -> Integer {
        let mut e = (x + &self.shift).complete();
        let mut r = secure_pow_mod(self.base, &e, self.shift.significant_bits(), self.modulus);
        wipe_integer(&mut e);
        r *= &self.correction;
        r %= self.modulus;
        r
    }
}

/// A uniformly random integer in [−bound, bound].
fn random_signed<R: RngCore + CryptoRng + ?Sized>(bound: &Integer, rng: &mut R) -> Integer {
    let width = (bound * 2u32).complete() + 1u32;
    random_below(&width, rng) - bound
}

/// The product of all primes below [`SMALL_FACTOR_BOUND`] (computed once, about 94 000 bits).
fn small_primes_product() -> &'static Integer {
    static PRODUCT: OnceLock<Integer> = OnceLock::new();
    PRODUCT.get_or_init(|| {
        let bound = SMALL_FACTOR_BOUND as usize;
        let mut composite = vec![false; bound];
        let mut product = Integer::from(1);
        for i in 2..bound {
            if !composite[i] {
                product *= i as u32;
                for j in (i * i..bound).step_by(i) {
                    composite[j] = true;
                }
            }
        }
        product
    })
}

/// The checks a public key can show by itself: a supported size, odd, no prime factor below
/// [`SMALL_FACTOR_BOUND`].
fn check_modulus(n: &Integer) -> Result<(), ProofError> {
    let bits = n.significant_bits();
    if !SUPPORTED_MODULUS_BITS.contains(&bits) {
        return Err(ProofError::MalformedKey(format!(
            "N has {bits} bits; supported: {SUPPORTED_MODULUS_BITS:?}"
        )));
    }
    if n.is_even() {
        return Err(ProofError::MalformedKey("N is even".into()));
    }
    if n.gcd_ref(small_primes_product()).complete() != 1 {
        return Err(ProofError::MalformedKey(format!(
            "N has a prime factor below {SMALL_FACTOR_BOUND}"
        )));
    }
    Ok(())
}

fn fac_security() -> no_small_factor::SecurityParams {
    no_small_factor::SecurityParams {
        l: FAC_CHALLENGE_BITS,
        epsilon: FAC_SLACK_BITS,
        q: Integer::from(1) << FAC_CHALLENGE_BITS as u32,
    }
}

// ---------------------------------------------------------------------------------------------
// The key proof.
// ---------------------------------------------------------------------------------------------

/// D's proof that its Paillier key is well formed ([ABMR20] §8.1 Π_epk, instantiated with
/// Π^mod and Π^fac of [CGGMP21]), bound to a session id. Encoded canonically by
/// [`Self::to_bytes`] (also the serde form).
#[derive(Clone, Debug)]
pub struct KeyProof {
    /// Byte length of N (the width of every Π^mod value in the encoding).
    modulus_bytes: usize,
    /// Byte length of N̂ (the width of Π^fac's commitments in the encoding).
    aux_bytes: usize,
    mod_commitment: paillier_blum_modulus::Commitment,
    mod_proof: paillier_blum_modulus::Proof<MOD_PROOF_ROUNDS>,
    fac_commitment: no_small_factor::Commitment,
    fac_proof: no_small_factor::Proof,
}

impl PartialEq for KeyProof {
    fn eq(&self, other: &Self) -> bool {
        self.to_bytes() == other.to_bytes()
    }
}

impl Eq for KeyProof {}

/// The proof point of Π^mod for challenge y, or why there is none (a bad key): z = y^{N⁻¹ mod
/// φ(N)}, x the principal fourth root of y' = (−1)^a w^b y, all by the CRT in constant time.
struct ModProver<'a> {
    p: &'a Integer,
    q: &'a Integer,
    n: &'a Integer,
    w: &'a Integer,
    /// (w | p), and (w | q) = −(w | p) since the Jacobi symbol (w | N) is −1.
    w_mod_p_is_residue: bool,
    /// N⁻¹ mod (p − 1) and mod (q − 1).
    d_p: Integer,
    d_q: Integer,
    /// ((p + 1)/4)² mod (p − 1), likewise for q: a^{that} is the principal fourth root of a
    /// quadratic residue a modulo a prime ≡ 3 (mod 4).
    e4_p: Integer,
    e4_q: Integer,
    /// (p − 1)/2: Euler's criterion.
    half_p: Integer,
    p_inv_q: Integer,
}

impl Drop for ModProver<'_> {
    fn drop(&mut self) {
        for x in [
            &mut self.d_p,
            &mut self.d_q,
            &mut self.e4_p,
            &mut self.e4_q,
            &mut self.half_p,
            &mut self.p_inv_q,
        ] {
            wipe_integer(x);
        }
    }
}

impl<'a> ModProver<'a> {
    fn new(p: &'a Integer, q: &'a Integer, n: &'a Integer, w: &'a Integer) -> Result<Self, String> {
        // The inversions run once per proof; like the key's own CRT constants they use GMP's
        // variable-time gcd.
        let inverse = |x: &Integer, m: &Integer| {
            x.invert_ref(m)
                .map(Integer::from)
                .ok_or_else(|| "gcd(N, φ(N)) ≠ 1".to_string())
        };
        let quarter_sq = |prime: &Integer| {
            let k = (prime + 1u32).complete() >> 2u32;
            k.square().modulo(&(prime - 1u32).complete())
        };
        let d_p = inverse(n, &(p - 1u32).complete())?;
        let d_q = inverse(n, &(q - 1u32).complete())?;
        let p_inv_q = inverse(p, q)?;
        let half_p = (p - 1u32).complete() >> 1u32;
        let w_legendre = ct_pow_prime(w, &half_p, p);
        if w_legendre != 1 && w_legendre != (p - 1u32).complete() {
            return Err("w is not a unit modulo p".into());
        }
        Ok(Self {
            p,
            q,
            n,
            w,
            w_mod_p_is_residue: w_legendre == 1,
            d_p,
            d_q,
            e4_p: quarter_sq(p),
            e4_q: quarter_sq(q),
            half_p,
            p_inv_q,
        })
    }

    fn crt(&self, mut x_p: Integer, mut x_q: Integer) -> Integer {
        let mut t = (&x_q - &x_p).complete();
        t *= &self.p_inv_q;
        t = t.modulo(self.q);
        t *= self.p;
        t += &x_p;
        wipe_integer(&mut x_p);
        wipe_integer(&mut x_q);
        t
    }

    fn point(&self, y: &Integer) -> Result<ProofPoint, String> {
        let jacobi_n = y.jacobi(self.n);
        if jacobi_n == 0 {
            return Err("challenge not a unit modulo N".into());
        }
        let legendre_p = ct_pow_prime(y, &self.half_p, self.p);
        let y_p_is_residue = legendre_p == 1;
        if !y_p_is_residue && legendre_p != (self.p - 1u32).complete() {
            return Err("p is not a prime ≡ 3 (mod 4)".into());
        }
        // (y | q) = (y | N)·(y | p), from the public Jacobi symbol.
        let y_q_is_residue = y_p_is_residue == (jacobi_n == 1);
        // Multiplying by w flips exactly one of the two symbols' agreement; multiplying by −1
        // flips both (−1 is a non-residue modulo primes ≡ 3 mod 4).
        let b = y_p_is_residue != y_q_is_residue;
        let p_residue_after_w = if b {
            y_p_is_residue == self.w_mod_p_is_residue
        } else {
            y_p_is_residue
        };
        let a = !p_residue_after_w;
        let mut y_prime = y.clone();
        if a {
            y_prime = self.n - y_prime;
        }
        if b {
            y_prime *= self.w;
            y_prime %= self.n;
        }
        let x = self.crt(
            ct_pow_prime(&y_prime, &self.e4_p, self.p),
            ct_pow_prime(&y_prime, &self.e4_q, self.q),
        );
        // A cheap self-check (two squarings): with bad factors the exponent arithmetic above
        // gives no fourth root, and the prover says so instead of sending a failing proof.
        if x.clone().square().modulo(self.n).square().modulo(self.n) != y_prime {
            return Err("no fourth root: the key is not a Paillier–Blum modulus".into());
        }
        let z = self.crt(
            ct_pow_prime(y, &self.d_p, self.p),
            ct_pow_prime(y, &self.d_q, self.q),
        );
        Ok(ProofPoint { x, a, b, z })
    }
}

/// The shared state of a proof's Fiat–Shamir hash in `paillier-zk`: its domain tag and the
/// session id.
fn shared_state<'a>(tag: &'static str, session: &'a [u8]) -> (&'static str, &'a [u8]) {
    (tag, session)
}

/// Π^mod prover with the factors p, q of n.
fn prove_mod<R: RngCore + CryptoRng + ?Sized>(
    p: &Integer,
    q: &Integer,
    n: &Integer,
    session: &[u8],
    rng: &mut R,
) -> Result<
    (
        paillier_blum_modulus::Commitment,
        paillier_blum_modulus::Proof<MOD_PROOF_ROUNDS>,
    ),
    ProofError,
> {
    let w = loop {
        let w = random_below(n, rng);
        if w.jacobi(n) == -1 {
            break w;
        }
    };
    let data = paillier_blum_modulus::Data { n: n.clone() };
    let commitment = paillier_blum_modulus::Commitment { w };
    let challenge = paillier_blum_modulus::non_interactive::challenge::<MOD_PROOF_ROUNDS, Sha256>(
        &shared_state(MOD_TAG, session),
        &data,
        &commitment,
    );
    let prover = ModProver::new(p, q, n, &commitment.w).map_err(ProofError::InvalidInput)?;
    let points = challenge
        .ys
        .iter()
        .map(|y| prover.point(y))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ProofError::InvalidInput)?;
    drop(prover);
    let points: [ProofPoint; MOD_PROOF_ROUNDS] = points
        .try_into()
        .map_err(|_| ProofError::InvalidInput("wrong number of Π^mod points".into()))?;
    Ok((commitment, paillier_blum_modulus::Proof { points }))
}

/// Π^fac prover with the factors p, q of n, committing in `aux`.
fn prove_fac<R: RngCore + CryptoRng + ?Sized>(
    p: &Integer,
    q: &Integer,
    n: &Integer,
    session: &[u8],
    aux: &RingPedersenParams,
    rng: &mut R,
) -> Result<(no_small_factor::Commitment, no_small_factor::Proof), ProofError> {
    let security = fac_security();
    let n_hat = &aux.n_hat;
    let n_root = n.sqrt_ref().complete();
    let l = FAC_CHALLENGE_BITS as u32;
    let le = (FAC_CHALLENGE_BITS + FAC_SLACK_BITS) as u32;
    // The sampling ranges of [CGGMP21] Π^fac.
    let bound_alpha = (&n_root << le).complete();
    let bound_mu = (n_hat << l).complete();
    let n_n_hat = (n * n_hat).complete();
    let bound_sigma = (&n_n_hat << l).complete();
    let bound_r = (&n_n_hat << le).complete();
    let bound_x = (n_hat << le).complete();
    let bound_factor = Integer::from(1) << (n.significant_bits() + 1);

    let mut alpha = random_signed(&bound_alpha, rng);
    let mut beta = random_signed(&bound_alpha, rng);
    let mut mu = random_signed(&bound_mu, rng);
    let mut nu = random_signed(&bound_mu, rng);
    let sigma = random_signed(&bound_sigma, rng);
    let mut r = random_signed(&bound_r, rng);
    let mut x = random_signed(&bound_x, rng);
    let mut y = random_signed(&bound_x, rng);

    let mul = |a: Integer, b: Integer| (a * b) % n_hat;
    let s_factor = SignedPow::new(&aux.s, &bound_factor, n_hat)?;
    let s_alpha = SignedPow::new(&aux.s, &bound_alpha, n_hat)?;
    let t_mu = SignedPow::new(&aux.t, &bound_mu, n_hat)?;
    let t_x = SignedPow::new(&aux.t, &bound_x, n_hat)?;
    let t_r = SignedPow::new(&aux.t, &bound_r, n_hat)?;
    let big_p = mul(s_factor.pow(p), t_mu.pow(&mu));
    let big_q = mul(s_factor.pow(q), t_mu.pow(&nu));
    let big_a = mul(s_alpha.pow(&alpha), t_x.pow(&x));
    let big_b = mul(s_alpha.pow(&beta), t_x.pow(&y));
    let q_alpha = SignedPow::new(&big_q, &bound_alpha, n_hat)?;
    let big_t = mul(q_alpha.pow(&alpha), t_r.pow(&r));
    let commitment = no_small_factor::Commitment {
        p: big_p,
        q: big_q,
        a: big_a,
        b: big_b,
        t: big_t,
        sigma,
    };
    let data = no_small_factor::Data { n, n_root: &n_root };
    let e = no_small_factor::non_interactive::challenge::<Sha256>(
        &shared_state(FAC_TAG, session),
        &aux.aux(),
        data,
        &commitment,
        &security,
    );
    let mut sigma_hat = &commitment.sigma - (&nu * p).complete();
    let proof = no_small_factor::Proof {
        z1: &alpha + (&e * p).complete(),
        z2: &beta + (&e * q).complete(),
        w1: &x + (&e * &mu).complete(),
        w2: &y + (&e * &nu).complete(),
        v: &r + (&e * &sigma_hat).complete(),
    };
    for secret in [
        &mut alpha,
        &mut beta,
        &mut mu,
        &mut nu,
        &mut r,
        &mut x,
        &mut y,
        &mut sigma_hat,
    ] {
        wipe_integer(secret);
    }
    Ok((commitment, proof))
}

/// Appends a signed integer: sign byte (0 non-negative, 1 negative), u16 length, minimal
/// big-endian magnitude (zero: sign 0, length 0).
fn put_signed(out: &mut Vec<u8>, x: &Integer) {
    let magnitude = x.as_abs().to_digits::<u8>(Order::Msf);
    out.push(u8::from(*x < 0));
    out.extend((magnitude.len() as u16).to_be_bytes());
    out.extend(magnitude);
}

/// Reads [`KeyProof`] fields off its encoding.
struct KeyProofReader<'a> {
    bytes: &'a [u8],
}

impl<'a> KeyProofReader<'a> {
    fn error(field: &str, reason: impl Into<String>) -> ProofError {
        ProofError::Decode {
            message: KEY_PROOF,
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn take(&mut self, len: usize, field: &str) -> Result<&'a [u8], ProofError> {
        if self.bytes.len() < len {
            return Err(Self::error(field, "truncated"));
        }
        let (head, tail) = self.bytes.split_at(len);
        self.bytes = tail;
        Ok(head)
    }

    fn u16(&mut self, field: &str) -> Result<usize, ProofError> {
        let b = self.take(2, field)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn unsigned(&mut self, len: usize, field: &str) -> Result<Integer, ProofError> {
        Ok(Integer::from_digits(self.take(len, field)?, Order::Msf))
    }

    fn signed(&mut self, field: &str) -> Result<Integer, ProofError> {
        let sign = self.take(1, field)?[0];
        let len = self.u16(field)?;
        if len > MAX_SIGNED_BYTES {
            return Err(Self::error(
                field,
                format!("{len} bytes, at most {MAX_SIGNED_BYTES}"),
            ));
        }
        let magnitude = self.take(len, field)?;
        match (sign, magnitude.first()) {
            (0 | 1, Some(0)) => Err(Self::error(field, "leading zero byte")),
            (1, None) => Err(Self::error(field, "negative zero")),
            (0 | 1, _) => {
                let x = Integer::from_digits(magnitude, Order::Msf);
                Ok(if sign == 1 { -x } else { x })
            }
            _ => Err(Self::error(field, format!("sign byte {sign}"))),
        }
    }
}

impl KeyProof {
    /// D's proof for its key `sk`, bound to `session`, with Π^fac committing in SP's
    /// published `verifier_aux`.
    pub fn prove<R: RngCore + CryptoRng + ?Sized>(
        sk: &SecretKey,
        session: &[u8],
        verifier_aux: &RingPedersenParams,
        rng: &mut R,
    ) -> Result<Self, ProofError> {
        let (p, q) = sk.primes();
        Self::prove_with_factors(p, q, sk.public_key().n(), session, verifier_aux, rng)
    }

    /// The provers run on given factors (also on bad ones, to test that the verifier refuses
    /// what they make).
    fn prove_with_factors<R: RngCore + CryptoRng + ?Sized>(
        p: &Integer,
        q: &Integer,
        n: &Integer,
        session: &[u8],
        verifier_aux: &RingPedersenParams,
        rng: &mut R,
    ) -> Result<Self, ProofError> {
        let (mod_commitment, mod_proof) = prove_mod(p, q, n, session, rng)?;
        let (fac_commitment, fac_proof) = prove_fac(p, q, n, session, verifier_aux, rng)?;
        Ok(Self {
            modulus_bytes: n.significant_bits().div_ceil(8) as usize,
            aux_bytes: verifier_aux.modulus_bytes(),
            mod_commitment,
            mod_proof,
            fac_commitment,
            fac_proof,
        })
    }

    /// SP's check that `pk` is well formed: the size, parity and trial-division checks, then
    /// Π^mod and Π^fac (in `verifier_aux`) for `session`.
    pub fn verify(
        &self,
        pk: &PublicKey,
        session: &[u8],
        verifier_aux: &RingPedersenParams,
    ) -> Result<(), ProofError> {
        let n = pk.n();
        check_modulus(n)?;
        let reject = |proof: &'static str, check: String| ProofError::Rejected { proof, check };
        if self.modulus_bytes != pk.modulus_bytes()
            || self.aux_bytes != verifier_aux.modulus_bytes()
        {
            return Err(reject(
                KEY_PROOF,
                "encoded for another key size or other ring-Pedersen parameters".into(),
            ));
        }
        let because = |e: &dyn std::error::Error| match e.source() {
            Some(reason) => format!("{e}: {reason}"),
            None => e.to_string(),
        };

        // Π^mod: canonical values, w of Jacobi symbol −1, then paillier-zk's verifier.
        let w = &self.mod_commitment.w;
        if *w <= 0 || w >= n || w.jacobi(n) != -1 {
            return Err(reject(
                MOD_PROOF,
                "w is not in Z_N with Jacobi symbol −1".into(),
            ));
        }
        for (i, point) in self.mod_proof.points.iter().enumerate() {
            if point.x < 0 || &point.x >= n || point.z < 0 || &point.z >= n {
                return Err(reject(MOD_PROOF, format!("point {i} is not in [0, N)")));
            }
        }
        verify_mod_proof(n, &self.mod_commitment, &self.mod_proof, session)
            .map_err(|check| reject(MOD_PROOF, check.into()))?;

        // Π^fac: commitments are units modulo N̂, then paillier-zk's verifier.
        let n_hat = verifier_aux.n_hat();
        let c = &self.fac_commitment;
        for (field, x) in [
            ("P", &c.p),
            ("Q", &c.q),
            ("A", &c.a),
            ("B", &c.b),
            ("T", &c.t),
        ] {
            if *x <= 0 || x >= n_hat || x.gcd_ref(n_hat).complete() != 1 {
                return Err(reject(FAC_PROOF, format!("{field} is not a unit modulo N̂")));
            }
        }
        let n_root = n.sqrt_ref().complete();
        let data = no_small_factor::Data { n, n_root: &n_root };
        let security = fac_security();
        let aux = verifier_aux.aux();
        let e = no_small_factor::non_interactive::challenge::<Sha256>(
            &shared_state(FAC_TAG, session),
            &aux,
            data,
            c,
            &security,
        );
        no_small_factor::interactive::verify(&aux, data, c, &security, &e, &self.fac_proof)
            .map_err(|e| reject(FAC_PROOF, because(&e)))?;
        Ok(())
    }

    /// The canonical encoding: version (1) ‖ L = |N| bytes (u16) ‖ K = |N̂| bytes (u16) ‖
    /// Π^mod: w (L) then 128 × (x (L) ‖ z (L) ‖ a + 2b (1)) ‖ Π^fac: P, Q, A, B, T (K each)
    /// then σ, z1, z2, w1, w2, v signed (sign byte, u16 length, minimal magnitude).
    pub fn to_bytes(&self) -> Vec<u8> {
        let (l, k) = (self.modulus_bytes, self.aux_bytes);
        let c = &self.fac_commitment;
        let mut out = vec![KEY_PROOF_VERSION];
        out.extend((l as u16).to_be_bytes());
        out.extend((k as u16).to_be_bytes());
        out.extend(fixed_be(&self.mod_commitment.w, l));
        for point in &self.mod_proof.points {
            out.extend(fixed_be(&point.x, l));
            out.extend(fixed_be(&point.z, l));
            out.push(u8::from(point.a) | (u8::from(point.b) << 1));
        }
        for x in [&c.p, &c.q, &c.a, &c.b, &c.t] {
            out.extend(fixed_be(x, k));
        }
        let f = &self.fac_proof;
        for x in [&c.sigma, &f.z1, &f.z2, &f.w1, &f.w2, &f.v] {
            put_signed(&mut out, x);
        }
        out
    }

    /// Decodes [`Self::to_bytes`] strictly: the version, the exact structure, flag bytes below
    /// 4, minimal signed magnitudes, no trailing bytes. Ranges against N and N̂ are checked by
    /// [`Self::verify`], which knows them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ProofError> {
        let mut r = KeyProofReader { bytes };
        let version = r.take(1, "version")?[0];
        if version != KEY_PROOF_VERSION {
            return Err(KeyProofReader::error("version", format!("{version}")));
        }
        let l = r.u16("modulus length")?;
        if !SUPPORTED_MODULUS_BITS.iter().any(|b| (b / 8) as usize == l) {
            return Err(KeyProofReader::error(
                "modulus length",
                format!("{l} bytes is not a supported key size"),
            ));
        }
        let k = r.u16("ring-Pedersen length")?;
        if !RING_PEDERSEN_BITS.iter().any(|b| (b / 8) as usize == k) {
            return Err(KeyProofReader::error(
                "ring-Pedersen length",
                format!("{k} bytes is not a supported size"),
            ));
        }
        let w = r.unsigned(l, "mod.w")?;
        let mut points = Vec::with_capacity(MOD_PROOF_ROUNDS);
        for i in 0..MOD_PROOF_ROUNDS {
            let x = r.unsigned(l, &format!("mod.x[{i}]"))?;
            let z = r.unsigned(l, &format!("mod.z[{i}]"))?;
            let flags = r.take(1, &format!("mod.flags[{i}]"))?[0];
            if flags > 3 {
                return Err(KeyProofReader::error(
                    &format!("mod.flags[{i}]"),
                    format!("{flags} is not a + 2b"),
                ));
            }
            points.push(ProofPoint {
                x,
                a: flags & 1 == 1,
                b: flags & 2 == 2,
                z,
            });
        }
        let points: [ProofPoint; MOD_PROOF_ROUNDS] = points
            .try_into()
            .map_err(|_| KeyProofReader::error("mod", "wrong number of points"))?;
        let mut fixed = [const { Integer::ZERO }; 5];
        for (slot, field) in fixed.iter_mut().zip(["P", "Q", "A", "B", "T"]) {
            *slot = r.unsigned(k, &format!("fac.{field}"))?;
        }
        let mut signed = [const { Integer::ZERO }; 6];
        for (slot, field) in signed
            .iter_mut()
            .zip(["sigma", "z1", "z2", "w1", "w2", "v"])
        {
            *slot = r.signed(&format!("fac.{field}"))?;
        }
        if !r.bytes.is_empty() {
            return Err(KeyProofReader::error(
                "end",
                format!("{} trailing bytes", r.bytes.len()),
            ));
        }
        let [p, q, a, b, t] = fixed;
        let [sigma, z1, z2, w1, w2, v] = signed;
        Ok(Self {
            modulus_bytes: l,
            aux_bytes: k,
            mod_commitment: paillier_blum_modulus::Commitment { w },
            mod_proof: paillier_blum_modulus::Proof { points },
            fac_commitment: no_small_factor::Commitment {
                p,
                q,
                a,
                b,
                t,
                sigma,
            },
            fac_proof: no_small_factor::Proof { z1, z2, w1, w2, v },
        })
    }
}

impl serde::Serialize for KeyProof {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> serde::Deserialize<'de> for KeyProof {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserializer.deserialize_bytes(BytesVisitor)?;
        Self::from_bytes(&bytes).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::{key_2048, small_key};
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;
    use rug::integer::IsPrime;

    /// 1024-bit ring-Pedersen parameters generated once per test process from a fixed seed.
    fn test_aux() -> &'static RingPedersenParams {
        static AUX: OnceLock<RingPedersenParams> = OnceLock::new();
        AUX.get_or_init(|| {
            let mut rng = ChaCha20Rng::seed_from_u64(0xa0c5);
            RingPedersenParams::generate(1024, &mut rng).expect("ring-Pedersen parameters")
        })
    }

    /// A random prime of `bits` bits (top two bits set) ≡ `residue` (mod 4).
    fn prime(bits: u32, residue: u32, rng: &mut ChaCha20Rng) -> Integer {
        loop {
            let mut x = random_below(&(Integer::from(1) << bits), rng);
            x.set_bit(bits - 1, true);
            x.set_bit(bits - 2, true);
            x.set_bit(0, true);
            x.set_bit(1, residue == 3);
            if x.is_probably_prime(30) != IsPrime::No {
                return x;
            }
        }
    }

    /// What a cheating prover makes for factors that are not a valid key: the honest
    /// computation where it works, junk points where it does not.
    fn forge(p: &Integer, q: &Integer, n: &Integer, session: &[u8]) -> KeyProof {
        let mut rng = ChaCha20Rng::seed_from_u64(99);
        let aux = test_aux();
        let w = loop {
            let w = random_below(n, &mut rng);
            if w.jacobi(n) == -1 {
                break w;
            }
        };
        let data = paillier_blum_modulus::Data { n: n.clone() };
        let commitment = paillier_blum_modulus::Commitment { w };
        let challenge = paillier_blum_modulus::non_interactive::challenge::<MOD_PROOF_ROUNDS, Sha256>(
            &shared_state(MOD_TAG, session),
            &data,
            &commitment,
        );
        let prover = ModProver::new(p, q, n, &commitment.w).ok();
        let points: Vec<ProofPoint> = challenge
            .ys
            .iter()
            .map(|y| {
                prover
                    .as_ref()
                    .and_then(|pr| pr.point(y).ok())
                    .unwrap_or(ProofPoint {
                        x: y.clone(),
                        a: false,
                        b: false,
                        z: y.clone(),
                    })
            })
            .collect();
        drop(prover);
        let (fac_commitment, fac_proof) = prove_fac(p, q, n, session, aux, &mut rng).unwrap();
        KeyProof {
            modulus_bytes: n.significant_bits().div_ceil(8) as usize,
            aux_bytes: aux.modulus_bytes(),
            mod_commitment: commitment,
            mod_proof: paillier_blum_modulus::Proof {
                points: points.try_into().unwrap(),
            },
            fac_commitment,
            fac_proof,
        }
    }

    #[test]
    fn honest_key_proof_verifies_and_round_trips() {
        let sk = small_key();
        let pk = sk.public_key();
        let aux = test_aux();
        let mut rng = ChaCha20Rng::seed_from_u64(20);
        let proof = KeyProof::prove(sk, b"enrol-1", aux, &mut rng).unwrap();
        proof.verify(pk, b"enrol-1", aux).unwrap();

        let bytes = proof.to_bytes();
        let decoded = KeyProof::from_bytes(&bytes).unwrap();
        assert_eq!(decoded, proof);
        decoded.verify(pk, b"enrol-1", aux).unwrap();
        // serde: from a byte string and from a sequence of bytes.
        use serde::de::value::{BytesDeserializer, Error, SeqDeserializer};
        use serde::Deserialize;
        let from_bytes = KeyProof::deserialize(BytesDeserializer::<Error>::new(&bytes)).unwrap();
        assert_eq!(from_bytes, proof);
        let seq = SeqDeserializer::<_, Error>::new(bytes.iter().copied());
        assert_eq!(KeyProof::deserialize(seq).unwrap(), proof);
        let aux_bytes = aux.to_bytes();
        assert_eq!(&RingPedersenParams::from_bytes(&aux_bytes).unwrap(), aux);
        let aux_de =
            RingPedersenParams::deserialize(BytesDeserializer::<Error>::new(&aux_bytes)).unwrap();
        assert_eq!(&aux_de, aux);
    }

    #[test]
    fn key_proof_is_bound_to_key_and_session() {
        let sk = small_key();
        let aux = test_aux();
        let mut rng = ChaCha20Rng::seed_from_u64(21);
        let proof = KeyProof::prove(sk, b"session-a", aux, &mut rng).unwrap();
        let err = proof
            .verify(sk.public_key(), b"session-b", aux)
            .unwrap_err();
        assert!(
            matches!(&err, ProofError::Rejected { proof, .. } if *proof == MOD_PROOF),
            "{err}"
        );
        // The same proof for another N.
        let mut rng2 = ChaCha20Rng::seed_from_u64(22);
        let other = SecretKey::generate(1024, &mut rng2).unwrap();
        let err = proof
            .verify(other.public_key(), b"session-a", aux)
            .unwrap_err();
        assert!(matches!(err, ProofError::Rejected { .. }), "{err}");
        // Only Π^fac replaced by one for another session: its own hash refuses it.
        let other_session = KeyProof::prove(sk, b"session-b", aux, &mut rng).unwrap();
        let mut mixed = proof.clone();
        mixed.fac_commitment = other_session.fac_commitment.clone();
        mixed.fac_proof = other_session.fac_proof.clone();
        let err = mixed
            .verify(sk.public_key(), b"session-a", aux)
            .unwrap_err();
        assert!(
            matches!(&err, ProofError::Rejected { proof, .. } if *proof == FAC_PROOF),
            "{err}"
        );
        // Other ring-Pedersen parameters than the ones proven in.
        let mut rng3 = ChaCha20Rng::seed_from_u64(23);
        let other_aux = RingPedersenParams::generate(1024, &mut rng3).unwrap();
        let err = proof
            .verify(sk.public_key(), b"session-a", &other_aux)
            .unwrap_err();
        assert!(
            matches!(&err, ProofError::Rejected { proof, .. } if *proof == FAC_PROOF),
            "{err}"
        );
    }

    #[test]
    fn three_prime_modulus_is_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(24);
        let (p1, p2, p3, n) = loop {
            let p1 = prime(342, 3, &mut rng);
            let p2 = prime(341, 3, &mut rng);
            let p3 = prime(341, 3, &mut rng);
            let n = (&p1 * &p2).complete() * &p3;
            if n.significant_bits() == 1024 {
                break (p1, p2, p3, n);
            }
        };
        let pk = PublicKey::from_modulus(n.clone()).unwrap();
        let aux = test_aux();
        let q = (&p2 * &p3).complete();
        // Our prover notices it cannot prove…
        let mut rng = ChaCha20Rng::seed_from_u64(25);
        assert!(KeyProof::prove_with_factors(&p1, &q, &n, b"s", aux, &mut rng).is_err());
        // …and what a cheater sends is refused by Π^mod.
        let err = forge(&p1, &q, &n, b"s").verify(&pk, b"s", aux).unwrap_err();
        assert!(
            matches!(&err, ProofError::Rejected { proof, .. } if *proof == MOD_PROOF),
            "{err}"
        );
    }

    /// Our Π^mod verifier and paillier-zk's agree on an honest proof and on every kind of
    /// tampering with it.
    #[test]
    fn mod_verifier_agrees_with_paillier_zk() {
        let mut rng = ChaCha20Rng::seed_from_u64(31);
        let sk = small_key();
        let n = sk.public_key().n().clone();
        let proof = KeyProof::prove(sk, b"s", test_aux(), &mut rng).unwrap();
        let theirs = |c: &paillier_blum_modulus::Commitment,
                      p: &paillier_blum_modulus::Proof<MOD_PROOF_ROUNDS>,
                      session: &[u8]| {
            paillier_blum_modulus::non_interactive::verify::<MOD_PROOF_ROUNDS, Sha256>(
                &shared_state(MOD_TAG, session),
                &paillier_blum_modulus::Data { n: n.clone() },
                c,
                p,
            )
            .is_ok()
        };
        let (c, p) = (&proof.mod_commitment, &proof.mod_proof);
        assert!(verify_mod_proof(&n, c, p, b"s").is_ok());
        assert!(theirs(c, p, b"s"));
        assert!(verify_mod_proof(&n, c, p, b"other session").is_err());
        assert!(!theirs(c, p, b"other session"));
        type ModProof = paillier_blum_modulus::Proof<MOD_PROOF_ROUNDS>;
        let tampered: [fn(&mut ModProof); 4] = [
            |p| p.points[3].z += 1u32,
            |p| p.points[7].x += 1u32,
            |p| p.points[0].a = !p.points[0].a,
            |p| p.points[127].b = !p.points[127].b,
        ];
        for (i, tamper) in tampered.iter().enumerate() {
            let mut forged = p.clone();
            tamper(&mut forged);
            assert!(
                verify_mod_proof(&n, c, &forged, b"s").is_err(),
                "tampering {i}"
            );
            assert!(!theirs(c, &forged, b"s"), "tampering {i}");
        }
        let mut other_w = c.clone();
        other_w.w += 2u32;
        assert!(verify_mod_proof(&n, &other_w, p, b"s").is_err());
        assert!(!theirs(&other_w, p, b"s"));
        let prime_n = prime(1024, 3, &mut rng);
        assert_eq!(
            verify_mod_proof(&prime_n, c, p, b"s"),
            Err("the modulus is prime")
        );
    }

    #[test]
    fn prime_congruent_to_1_mod_4_is_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(26);
        let (p, q, n) = loop {
            let p = prime(512, 1, &mut rng);
            let q = prime(512, 3, &mut rng);
            let n = (&p * &q).complete();
            if n.significant_bits() == 1024 {
                break (p, q, n);
            }
        };
        assert_eq!(p.mod_u(4), 1);
        let pk = PublicKey::from_modulus(n.clone()).unwrap();
        let err = forge(&p, &q, &n, b"s")
            .verify(&pk, b"s", test_aux())
            .unwrap_err();
        assert!(
            matches!(&err, ProofError::Rejected { proof, .. } if *proof == MOD_PROOF),
            "{err}"
        );
        // paillier-zk's own prover cannot do better.
        let data = paillier_blum_modulus::Data { n: n.clone() };
        let pdata = paillier_blum_modulus::PrivateData { p, q };
        let mut rng = ChaCha20Rng::seed_from_u64(27);
        if let Ok((mod_commitment, mod_proof)) =
            paillier_blum_modulus::non_interactive::prove::<MOD_PROOF_ROUNDS, Sha256>(
                &shared_state(MOD_TAG, b"s"),
                &data,
                &pdata,
                &mut rng,
            )
        {
            let mut forged = forge(&pdata.p, &pdata.q, &n, b"s");
            forged.mod_commitment = mod_commitment;
            forged.mod_proof = mod_proof;
            assert!(forged.verify(&pk, b"s", test_aux()).is_err());
        }
    }

    #[test]
    fn small_factors_and_bad_sizes_are_malformed_keys() {
        let mut rng = ChaCha20Rng::seed_from_u64(28);
        let proof = KeyProof::prove(small_key(), b"s", test_aux(), &mut rng).unwrap();
        let n = loop {
            let big = prime(1008, 3, &mut rng);
            let n = big * 65_521u32; // the largest prime below 2^16
            if n.significant_bits() == 1024 {
                break n;
            }
        };
        let pk = PublicKey::from_modulus(n).unwrap();
        let err = proof.verify(&pk, b"s", test_aux()).unwrap_err();
        assert!(
            matches!(&err, ProofError::MalformedKey(m) if m.contains("prime factor below")),
            "{err}"
        );
        assert!(err.to_string().starts_with("malformed key"));
        assert!(check_modulus(&(Integer::from(1) << 1023u32)).is_err());
        assert!(check_modulus(&((Integer::from(1) << 1000u32) + 1u32)).is_err());
    }

    #[test]
    fn paillier_zk_prover_output_verifies_here() {
        // Interoperability both ways: our verifier (paillier-zk's checks) accepts proofs made
        // by paillier-zk's provers for an honest key.
        let sk = small_key();
        let pk = sk.public_key();
        let aux = test_aux();
        let (p, q) = sk.primes();
        let mut rng = ChaCha20Rng::seed_from_u64(29);
        let data = paillier_blum_modulus::Data { n: pk.n().clone() };
        let pdata = paillier_blum_modulus::PrivateData {
            p: p.clone(),
            q: q.clone(),
        };
        let (mod_commitment, mod_proof) = paillier_blum_modulus::non_interactive::prove::<
            MOD_PROOF_ROUNDS,
            Sha256,
        >(
            &shared_state(MOD_TAG, b"x"), &data, &pdata, &mut rng
        )
        .unwrap();
        let n_root = pk.n().sqrt_ref().complete();
        let fac_data = no_small_factor::Data {
            n: pk.n(),
            n_root: &n_root,
        };
        let fac_pdata = no_small_factor::PrivateData { p, q };
        let security = fac_security();
        let (fac_commitment, pcomm) = no_small_factor::interactive::commit(
            &aux.aux(),
            fac_data,
            fac_pdata,
            &security,
            &mut rng,
        )
        .unwrap();
        let e = no_small_factor::non_interactive::challenge::<Sha256>(
            &shared_state(FAC_TAG, b"x"),
            &aux.aux(),
            fac_data,
            &fac_commitment,
            &security,
        );
        let fac_proof =
            no_small_factor::interactive::prove(fac_pdata, &fac_commitment, &pcomm, &e).unwrap();
        let theirs = KeyProof {
            modulus_bytes: pk.modulus_bytes(),
            aux_bytes: aux.modulus_bytes(),
            mod_commitment,
            mod_proof,
            fac_commitment,
            fac_proof,
        };
        theirs.verify(pk, b"x", aux).unwrap();
        // And ours gives the same fourth roots and N-th roots for the same challenge.
        let ours = prove_mod(p, q, pk.n(), b"x", &mut rng).unwrap();
        let prover = ModProver::new(p, q, pk.n(), &theirs.mod_commitment.w).unwrap();
        let challenge = paillier_blum_modulus::non_interactive::challenge::<MOD_PROOF_ROUNDS, Sha256>(
            &shared_state(MOD_TAG, b"x"),
            &data,
            &theirs.mod_commitment,
        );
        for (y, their_point) in challenge.ys.iter().zip(&theirs.mod_proof.points) {
            let point = prover.point(y).unwrap();
            assert_eq!(point.z, their_point.z);
            assert_eq!((point.a, point.b), (their_point.a, their_point.b));
            // Both take the principal fourth root (the one that is a quadratic residue).
            assert_eq!(point.x, their_point.x);
        }
        assert_eq!(ours.1.points.len(), MOD_PROOF_ROUNDS);
    }

    #[test]
    fn key_proof_decoding_is_strict() {
        let mut rng = ChaCha20Rng::seed_from_u64(30);
        let proof = KeyProof::prove(small_key(), b"s", test_aux(), &mut rng).unwrap();
        let bytes = proof.to_bytes();
        let field_of = |b: &[u8]| match KeyProof::from_bytes(b) {
            Err(ProofError::Decode { field, .. }) => field,
            other => panic!("expected a decode error, got {other:?}"),
        };
        let mut bad = bytes.clone();
        bad[0] = 2;
        assert_eq!(field_of(&bad), "version");
        let mut bad = bytes.clone();
        bad[1..3].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(field_of(&bad), "modulus length");
        let mut bad = bytes.clone();
        let flags_at = 5 + 128 + 2 * 128;
        bad[flags_at] = 7;
        assert_eq!(field_of(&bad), "mod.flags[0]");
        assert_eq!(field_of(&bytes[..bytes.len() - 1]), "fac.v");
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(field_of(&long), "end");
        assert!(KeyProof::from_bytes(&[]).is_err());
        // A negative zero and a leading zero byte in the signed part.
        let mut signed = Vec::new();
        put_signed(&mut signed, &Integer::from(-5));
        assert_eq!(signed, [1, 0, 1, 5]);
        let tail_v = {
            let mut t = Vec::new();
            put_signed(&mut t, &proof.fac_proof.v);
            t
        };
        let prefix = &bytes[..bytes.len() - tail_v.len()];
        let mut bad = prefix.to_vec();
        bad.extend([1, 0, 0]);
        assert_eq!(field_of(&bad), "fac.v");
        let mut bad = prefix.to_vec();
        bad.extend([0, 0, 2, 0, 5]);
        assert_eq!(field_of(&bad), "fac.v");
        // Ring-Pedersen parameters.
        let aux = test_aux().to_bytes();
        assert!(RingPedersenParams::from_bytes(&aux[1..]).is_err());
        let mut bad = aux.clone();
        let len = aux.len() / 3;
        bad[2 * len..].fill(0);
        bad[3 * len - 1] = 1;
        assert!(matches!(
            RingPedersenParams::from_bytes(&bad),
            Err(ProofError::Decode { field, .. }) if field == "t"
        ));
        assert!(RingPedersenParams::generate(1000, &mut rng).is_err());
    }

    #[test]
    fn honest_key_proof_verifies_at_2048_bits() {
        let sk = key_2048();
        let mut rng = ChaCha20Rng::seed_from_u64(31);
        let proof = KeyProof::prove(sk, b"2048", test_aux(), &mut rng).unwrap();
        proof.verify(sk.public_key(), b"2048", test_aux()).unwrap();
        assert_eq!(KeyProof::from_bytes(&proof.to_bytes()).unwrap(), proof);
    }
}
