//! # Paillier encryption with g = N + 1 [Pai99], CRT decryption, owner-side CRT encryption
//!
//! Paillier, "Public-Key Cryptosystems Based on Composite Degree Residuosity Classes",
//! EUROCRYPT 1999 (DOI 10.1007/3-540-48910-X_16), in the form [ABMR20] §2.1 uses:
//! N = pq, g = N + 1, Enc(m; r) = (1 + mN) · r^N mod N², Dec by the Chinese remainder theorem
//! (Paillier's §7: work modulo p² and q² with the precomputed h_p, h_q).
//!
//! * **Interoperability.** For the same N, m and r the ciphertext is the same integer as the
//!   `phe` library's (python-paillier, `raw_encrypt`), which also uses g = N + 1; a test in the
//!   suite (`tests/python/phe_interop.py`) checks both directions.
//! * **Constant time where the exponent is secret.** Decryption raises to p − 1 and q − 1 and
//!   owner-side encryption to N mod (p − 1) and p (and likewise for q): these go through
//!   [`montgomery::secure_pow_mod`] (radix-2^52 Montgomery on AVX-512 IFMA where the CPU has
//!   it, GMP's `mpz_powm_sec` elsewhere). Exponentiations whose exponent is public (r^N with
//!   the public N, homomorphic scalar products) use [`montgomery::pow_mod`] (IFMA, or GMP's
//!   `mpz_powm`).
//! * **Keys.** [`SecretKey::generate`] draws p ≡ q ≡ 3 (mod 4) of |N|/2 bits each with the two
//!   top bits set, so N has exactly the requested size and is a Blum integer, which the
//!   Paillier–Blum modulus proof of the enrolment needs.
//! * **Offline work.** r^N does not depend on the message; [`NoncePool`] computes such values
//!   ahead of time (by the key owner with the CRT, about 2 × faster at 3072 bits), so an encryption online is
//!   one multiplication.
//!
//! Plaintexts are integers modulo N; signed values are represented balanced, x < 0 as N + x
//! ([`PublicKey::reduce_signed`], [`SecretKey::decrypt_signed`]).

use rand_core::{CryptoRng, RngCore};
use rug::integer::Order;
use rug::{Complete, Integer};
use zeroize::Zeroize;

use crate::algebra::montgomery;

/// Moduli sizes a key may have. 3072 bits is the default (about 128-bit security); 2048 bits
/// is kept for comparison with [ABMR20] §9, whose message sizes imply a 2048-bit N; 1024 bits
/// only for tests (refused by the protocol parameters).
pub const SUPPORTED_MODULUS_BITS: [u32; 3] = [1024, 2048, 3072];

/// The default modulus size.
pub const DEFAULT_MODULUS_BITS: u32 = 3072;

/// Miller–Rabin rounds on top of GMP's Baillie–PSW test for key generation.
const PRIME_TEST_REPS: u32 = 40;

/// Magic and version of [`SecretKey::to_bytes`].
const SECRET_MAGIC: &[u8; 4] = b"PMSK";
const SECRET_VERSION: u8 = 1;

/// What can go wrong with Paillier keys and ciphertexts (all caused by input, none by a bug).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaillierError {
    /// The modulus is not one of [`SUPPORTED_MODULUS_BITS`] long, or is even.
    #[error("Paillier modulus: {0}")]
    BadModulus(String),
    /// The primes given for a secret key are not distinct primes ≡ 3 (mod 4) of equal size.
    #[error("Paillier secret key: {0}")]
    BadPrimes(String),
    /// A plaintext outside [0, N).
    #[error("Paillier plaintext out of range [0, N)")]
    PlaintextRange,
    /// A nonce r outside Z_N^*.
    #[error("Paillier nonce r is not in Z_N^*")]
    BadNonce,
    /// A ciphertext that is not an element of Z_{N²}^* (zero, too large, or sharing a factor
    /// with N), or of the wrong encoded length.
    #[error("Paillier ciphertext: {0}")]
    BadCiphertext(String),
}

/// A Paillier public key: the modulus N (and N², cached).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    n: Integer,
    n_squared: Integer,
    bits: u32,
}

/// A Paillier ciphertext: an element of Z_{N²}^*. Which key it belongs to is the caller's
/// business; [`PublicKey::ciphertext_from_bytes`] checks it is valid for a given key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ciphertext(Integer);

/// A Paillier secret key: the primes and the CRT constants of decryption and encryption.
/// Zeroised on drop.
pub struct SecretKey {
    public: PublicKey,
    p: Integer,
    q: Integer,
    p_squared: Integer,
    q_squared: Integer,
    /// h_p = (−q)⁻¹ mod p: L_p((N+1)^{p−1} mod p²) = (p − 1)q ≡ −q (mod p), inverted.
    h_p: Integer,
    /// h_q = (−p)⁻¹ mod q.
    h_q: Integer,
    /// p⁻¹ mod q, for recombining m_p and m_q.
    p_inv_q: Integer,
    /// (p²)⁻¹ mod q², for recombining r^N mod p² and mod q².
    p2_inv_q2: Integer,
    /// N mod (p − 1) = q mod (p − 1), and N mod (q − 1): see [`SecretKey::nonce_power`].
    n_mod_p1: Integer,
    n_mod_q1: Integer,
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        // rug's Integer has no Zeroize; overwrite the limbs in place by assigning zero to a
        // value of the same capacity (GMP keeps the allocation).
        for x in [
            &mut self.p,
            &mut self.q,
            &mut self.p_squared,
            &mut self.q_squared,
            &mut self.h_p,
            &mut self.h_q,
            &mut self.p_inv_q,
            &mut self.p2_inv_q2,
            &mut self.n_mod_p1,
            &mut self.n_mod_q1,
        ] {
            wipe(x);
        }
    }
}

/// Overwrites the limbs of `x` with zeros, then sets it to 0.
fn wipe(x: &mut Integer) {
    let limbs = x.significant_digits::<u64>();
    let mut zeros = vec![0u64; limbs];
    x.assign_digits(&zeros, Order::Lsf);
    zeros.zeroize();
    *x = Integer::ZERO;
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKey({}-bit, <redacted>)", self.public.bits)
    }
}

/// A uniformly random integer in [0, bound) (rejection sampling on the bit length of bound).
/// `bound` must be positive.
pub fn random_below<R: RngCore + CryptoRng + ?Sized>(bound: &Integer, rng: &mut R) -> Integer {
    let bits = bound.significant_bits().max(1);
    let bytes = bits.div_ceil(8) as usize;
    let top_mask = match bits % 8 {
        0 => 0xffu8,
        r => (1u8 << r) - 1,
    };
    let mut buf = vec![0u8; bytes];
    loop {
        rng.fill_bytes(&mut buf);
        buf[0] &= top_mask;
        let x = Integer::from_digits(&buf, Order::Msf);
        if &x < bound {
            buf.zeroize();
            return x;
        }
    }
}

/// A uniformly random element of Z_N^* (for a Paillier N, a random element of [1, N) is a unit
/// except with negligible probability; the check costs one gcd).
pub fn random_unit<R: RngCore + CryptoRng + ?Sized>(n: &Integer, rng: &mut R) -> Integer {
    loop {
        let r = random_below(n, rng);
        if r != 0 && r.gcd_ref(n).complete() == 1 {
            return r;
        }
    }
}

/// A uniformly random integer of exactly `bits` bits with the two top bits set and
/// ≡ 3 (mod 4), tested prime.
fn random_blum_prime<R: RngCore + CryptoRng + ?Sized>(bits: u32, rng: &mut R) -> Integer {
    let bytes = bits.div_ceil(8) as usize;
    let mut buf = vec![0u8; bytes];
    loop {
        rng.fill_bytes(&mut buf);
        let mut candidate = Integer::from_digits(&buf, Order::Msf);
        candidate.keep_bits_mut(bits);
        candidate.set_bit(bits - 1, true);
        candidate.set_bit(bits - 2, true);
        candidate.set_bit(0, true);
        candidate.set_bit(1, true);
        if candidate.is_probably_prime(PRIME_TEST_REPS) != rug::integer::IsPrime::No {
            buf.zeroize();
            return candidate;
        }
    }
}

impl PublicKey {
    /// The public key of modulus `n`. Checks only what a public key can show: the size is one
    /// of [`SUPPORTED_MODULUS_BITS`] and N is odd. That N is a product of two large primes is
    /// what the enrolment's key proofs establish.
    pub fn from_modulus(n: Integer) -> Result<Self, PaillierError> {
        let bits = n.significant_bits();
        if !SUPPORTED_MODULUS_BITS.contains(&bits) {
            return Err(PaillierError::BadModulus(format!(
                "N has {bits} bits; supported: {SUPPORTED_MODULUS_BITS:?}"
            )));
        }
        if n.is_even() {
            return Err(PaillierError::BadModulus("N is even".into()));
        }
        let n_squared = n.square_ref().complete();
        Ok(Self { n, n_squared, bits })
    }

    /// The modulus N.
    pub fn n(&self) -> &Integer {
        &self.n
    }

    /// N².
    pub fn n_squared(&self) -> &Integer {
        &self.n_squared
    }

    /// The size of N in bits.
    pub fn modulus_bits(&self) -> u32 {
        self.bits
    }

    /// Bytes of one encoded ciphertext: the byte length of N², fixed for the key.
    pub fn ciphertext_bytes(&self) -> usize {
        (2 * self.bits).div_ceil(8) as usize
    }

    /// Bytes of the encoded modulus.
    pub fn modulus_bytes(&self) -> usize {
        self.bits.div_ceil(8) as usize
    }

    /// The signed integer `x` as a plaintext: x mod N (so −1 is N − 1). Errors if |x| ≥ N/2,
    /// where the balanced representation would be ambiguous.
    pub fn reduce_signed(&self, x: &Integer) -> Result<Integer, PaillierError> {
        let half = (&self.n >> 1u32).complete();
        if x.clone().abs() > half {
            return Err(PaillierError::PlaintextRange);
        }
        Ok(x.modulo_ref(&self.n).complete())
    }

    /// r^N mod N² with the public exponent N (anyone can compute it; the key owner is faster
    /// with [`SecretKey::nonce_power`]).
    pub fn nonce_power(&self, r: &Integer) -> Result<Integer, PaillierError> {
        if *r <= 0 || r >= &self.n || r.gcd_ref(&self.n).complete() != 1 {
            return Err(PaillierError::BadNonce);
        }
        // r is secret but the exponent N is public; only the exponent steers the timing.
        Ok(montgomery::pow_mod(r, &self.n, &self.n_squared))
    }

    /// A fresh random r^N mod N².
    pub fn random_nonce_power<R: RngCore + CryptoRng + ?Sized>(&self, rng: &mut R) -> Integer {
        let r = random_unit(&self.n, rng);
        // r is a unit below N, so nonce_power cannot fail.
        self.nonce_power(&r).unwrap_or_default()
    }

    /// Enc(m; r) = (1 + mN) · r^N mod N², given r^N (from [`Self::nonce_power`] or a pool).
    /// `m` must be in [0, N).
    pub fn encrypt_with_nonce_power(
        &self,
        m: &Integer,
        r_to_n: &Integer,
    ) -> Result<Ciphertext, PaillierError> {
        if *m < 0 || m >= &self.n {
            return Err(PaillierError::PlaintextRange);
        }
        // (1 + N)^m = 1 + mN (mod N²): no exponentiation for the message part.
        let mut c = (m * &self.n).complete();
        c += 1u32;
        c *= r_to_n;
        c %= &self.n_squared;
        Ok(Ciphertext(c))
    }

    /// Enc(m; r) with an explicit nonce r ∈ Z_N^*, the same integer `phe`'s `raw_encrypt`
    /// gives for the same key, m and r.
    pub fn encrypt_with(&self, m: &Integer, r: &Integer) -> Result<Ciphertext, PaillierError> {
        let r_to_n = self.nonce_power(r)?;
        self.encrypt_with_nonce_power(m, &r_to_n)
    }

    /// Enc(m) with fresh randomness.
    pub fn encrypt<R: RngCore + CryptoRng + ?Sized>(
        &self,
        m: &Integer,
        rng: &mut R,
    ) -> Result<Ciphertext, PaillierError> {
        let r_to_n = self.random_nonce_power(rng);
        self.encrypt_with_nonce_power(m, &r_to_n)
    }

    /// ⟦a⟧ · ⟦b⟧ = ⟦a + b⟧.
    pub fn add(&self, a: &Ciphertext, b: &Ciphertext) -> Ciphertext {
        Ciphertext((&a.0 * &b.0).complete() % &self.n_squared)
    }

    /// ⟦a⟧ · (1 + kN) = ⟦a + k⟧ for a plaintext k (signed; reduced modulo N).
    pub fn add_plain(&self, a: &Ciphertext, k: &Integer) -> Ciphertext {
        let k = k.modulo_ref(&self.n).complete();
        let mut g_k = k * &self.n;
        g_k += 1u32;
        Ciphertext((&a.0 * g_k) % &self.n_squared)
    }

    /// ⟦a⟧^k = ⟦k · a⟧ for a public integer k (negative k through the inverse of ⟦a⟧).
    pub fn mul_plain(&self, a: &Ciphertext, k: &Integer) -> Ciphertext {
        // A valid ciphertext is a unit mod N², so pow_mod with a negative exponent (which
        // inverts first) succeeds; an invalid one has been refused when it was decoded.
        Ciphertext(montgomery::pow_mod(&a.0, k, &self.n_squared))
    }

    /// ⟦a⟧⁻¹ = ⟦−a⟧.
    pub fn negate(&self, a: &Ciphertext) -> Ciphertext {
        Ciphertext(
            a.0.invert_ref(&self.n_squared)
                .map(Integer::from)
                .unwrap_or_default(),
        )
    }

    /// ⟦a⟧ · r^N: the same plaintext under fresh randomness, given a fresh r^N.
    pub fn rerandomize(&self, a: &Ciphertext, r_to_n: &Integer) -> Ciphertext {
        Ciphertext((&a.0 * r_to_n).complete() % &self.n_squared)
    }

    /// The big-endian encoding of N, [`Self::modulus_bytes`] long.
    pub fn to_bytes(&self) -> Vec<u8> {
        fixed_be(&self.n, self.modulus_bytes())
    }

    /// The public key from its big-endian encoding (see [`Self::from_modulus`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PaillierError> {
        Self::from_modulus(Integer::from_digits(bytes, Order::Msf))
    }

    /// A ciphertext of this key from its fixed-length big-endian encoding: refused unless it
    /// is exactly [`Self::ciphertext_bytes`] long and an element of Z_{N²}^*.
    pub fn ciphertext_from_bytes(&self, bytes: &[u8]) -> Result<Ciphertext, PaillierError> {
        if bytes.len() != self.ciphertext_bytes() {
            return Err(PaillierError::BadCiphertext(format!(
                "{} bytes, expected {}",
                bytes.len(),
                self.ciphertext_bytes()
            )));
        }
        self.ciphertext_from_integer(Integer::from_digits(bytes, Order::Msf))
    }

    /// A ciphertext of this key from an integer: refused unless 0 < c < N² and gcd(c, N) = 1.
    pub fn ciphertext_from_integer(&self, c: Integer) -> Result<Ciphertext, PaillierError> {
        if c <= 0 || c >= self.n_squared {
            return Err(PaillierError::BadCiphertext("not in [1, N²)".into()));
        }
        if c.gcd_ref(&self.n).complete() != 1 {
            return Err(PaillierError::BadCiphertext("not a unit modulo N".into()));
        }
        Ok(Ciphertext(c))
    }

    /// The fixed-length big-endian encoding of a ciphertext of this key.
    pub fn ciphertext_to_bytes(&self, c: &Ciphertext) -> Vec<u8> {
        fixed_be(&c.0, self.ciphertext_bytes())
    }
}

impl Ciphertext {
    /// The ciphertext as an integer in [1, N²).
    pub fn as_integer(&self) -> &Integer {
        &self.0
    }
}

/// `x` (non-negative, < 256^len) big-endian in exactly `len` bytes.
pub fn fixed_be(x: &Integer, len: usize) -> Vec<u8> {
    let digits = x.to_digits::<u8>(Order::Msf);
    let mut out = vec![0u8; len.saturating_sub(digits.len())];
    out.extend_from_slice(&digits[digits.len().saturating_sub(len)..]);
    out
}

impl SecretKey {
    /// A fresh key with an N of `bits` bits (one of [`SUPPORTED_MODULUS_BITS`]): two distinct
    /// random primes p ≡ q ≡ 3 (mod 4) of bits/2 bits each, top two bits set.
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(
        bits: u32,
        rng: &mut R,
    ) -> Result<Self, PaillierError> {
        if !SUPPORTED_MODULUS_BITS.contains(&bits) {
            return Err(PaillierError::BadModulus(format!(
                "{bits} bits requested; supported: {SUPPORTED_MODULUS_BITS:?}"
            )));
        }
        loop {
            let p = random_blum_prime(bits / 2, rng);
            let q = random_blum_prime(bits / 2, rng);
            if p != q {
                return Self::from_primes(p, q);
            }
        }
    }

    /// The key with primes p and q: distinct, odd, equally long, and with an N of a supported
    /// size. Keys made elsewhere (e.g. by `phe`) need not be Blum integers; such a key works for
    /// Π1 but fails the Paillier–Blum modulus proof of the malicious-device enrolment.
    pub fn from_primes(p: Integer, q: Integer) -> Result<Self, PaillierError> {
        use rug::integer::IsPrime;
        if p == q
            || p.significant_bits() != q.significant_bits()
            || p.is_even()
            || q.is_even()
            || p.is_probably_prime(PRIME_TEST_REPS) == IsPrime::No
            || q.is_probably_prime(PRIME_TEST_REPS) == IsPrime::No
        {
            return Err(PaillierError::BadPrimes(
                "p and q must be distinct odd primes of equal length".into(),
            ));
        }
        let public = PublicKey::from_modulus((&p * &q).complete())?;
        let p_squared = p.square_ref().complete();
        let q_squared = q.square_ref().complete();
        let invert = |x: Integer, m: &Integer| {
            x.invert(m)
                .map_err(|_| PaillierError::BadPrimes("p and q not coprime".into()))
        };
        let h_p = invert((-&q).complete().modulo(&p), &p)?;
        let h_q = invert((-&p).complete().modulo(&q), &q)?;
        let p_inv_q = invert(p.clone(), &q)?;
        let p2_inv_q2 = invert(p_squared.clone(), &q_squared)?;
        let n_mod_p1 = public.n.modulo_ref(&(&p - 1u32).complete()).complete();
        let n_mod_q1 = public.n.modulo_ref(&(&q - 1u32).complete()).complete();
        Ok(Self {
            public,
            p,
            q,
            p_squared,
            q_squared,
            h_p,
            h_q,
            p_inv_q,
            p2_inv_q2,
            n_mod_p1,
            n_mod_q1,
        })
    }

    /// The public key.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// The primes (p, q), for the key proofs of the enrolment and for the key file.
    pub fn primes(&self) -> (&Integer, &Integer) {
        (&self.p, &self.q)
    }

    /// The key's canonical encoding, for the device's key file (secret: the caller keeps it
    /// private; the buffer is wiped when dropped): `"PMSK" ‖ version (1) ‖ prime length (2,
    /// big endian) ‖ p ‖ q`, each prime big endian in exactly that length (|N|/16 bytes).
    pub fn to_bytes(&self) -> zeroize::Zeroizing<Vec<u8>> {
        let len = self.public.modulus_bytes().div_ceil(2);
        let mut out = zeroize::Zeroizing::new(Vec::with_capacity(7 + 2 * len));
        out.extend_from_slice(SECRET_MAGIC);
        out.push(SECRET_VERSION);
        // len ≤ 192 for supported sizes.
        out.extend_from_slice(&(len as u16).to_be_bytes());
        for prime in [&self.p, &self.q] {
            let mut digits = fixed_be(prime, len);
            out.extend_from_slice(&digits);
            digits.zeroize();
        }
        out
    }

    /// Strict decoding of [`Self::to_bytes`]: exact length, no trailing bytes, primes as
    /// [`Self::from_primes`] requires, and a modulus of a supported size. Errors never contain
    /// key material.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PaillierError> {
        let bad = |reason: &str| PaillierError::BadPrimes(format!("key encoding: {reason}"));
        if bytes.len() < 7 || &bytes[..4] != SECRET_MAGIC {
            return Err(bad("not a privmatch Paillier secret key"));
        }
        if bytes[4] != SECRET_VERSION {
            return Err(bad(&format!(
                "version {}, expected {SECRET_VERSION}",
                bytes[4]
            )));
        }
        let len = usize::from(u16::from_be_bytes([bytes[5], bytes[6]]));
        if len == 0 || bytes.len() != 7 + 2 * len {
            return Err(bad("the length does not match the primes' length field"));
        }
        let p = Integer::from_digits(&bytes[7..7 + len], Order::Msf);
        let q = Integer::from_digits(&bytes[7 + len..], Order::Msf);
        let key = Self::from_primes(p, q)?;
        if key.public.modulus_bytes().div_ceil(2) != len {
            return Err(bad("the primes are shorter than their encoding"));
        }
        Ok(key)
    }

    /// Dec(c) ∈ [0, N) by the CRT (Paillier's §7): m_p = L_p(c^{p−1} mod p²) · h_p mod p,
    /// likewise m_q, recombined.
    pub fn decrypt(&self, c: &Ciphertext) -> Integer {
        let m_p = Self::decrypt_half(&c.0, &self.p, &self.p_squared, &self.h_p);
        let m_q = Self::decrypt_half(&c.0, &self.q, &self.q_squared, &self.h_q);
        // m = m_p + p · ((m_q − m_p) p⁻¹ mod q)
        let mut t = m_q - &m_p;
        t *= &self.p_inv_q;
        t = t.modulo(&self.q);
        t * &self.p + m_p
    }

    /// Dec(c) as a signed integer in (−N/2, N/2].
    pub fn decrypt_signed(&self, c: &Ciphertext) -> Integer {
        let m = self.decrypt(c);
        let half = (self.public.n.clone() >> 1u32) + 1u32;
        if m >= half {
            m - &self.public.n
        } else {
            m
        }
    }

    fn decrypt_half(c: &Integer, prime: &Integer, prime_squared: &Integer, h: &Integer) -> Integer {
        let exponent = (prime - 1u32).complete();
        let c_mod = c.modulo_ref(prime_squared).complete();
        // The exponent p − 1 is secret: constant-time exponentiation. c is a unit mod N² (it
        // was checked when decoded), so c mod p² is a unit and the exponent is positive.
        let x =
            montgomery::secure_pow_mod(&c_mod, &exponent, prime.significant_bits(), prime_squared);
        let l = (x - 1u32) / prime;
        (l * h).modulo(prime)
    }

    /// r^N mod N² by the CRT, the owner's fast path. Modulo p²: x ↦ x^p mod p² depends only on
    /// x mod p ((x + kp)^p ≡ x^p), and r^N = (r^q)^p, so r^N ≡ (r^{N mod (p−1)} mod p)^p (mod p²):
    /// one exponentiation modulo p with a |p|-bit exponent and one modulo p² with exponent p,
    /// instead of a 2|p|-bit exponent modulo p². Likewise modulo q², then recombined. The
    /// exponents depend on p and q: constant time.
    pub fn nonce_power(&self, r: &Integer) -> Result<Integer, PaillierError> {
        let n = &self.public.n;
        if *r <= 0 || r >= n || r.gcd_ref(n).complete() != 1 {
            return Err(PaillierError::BadNonce);
        }
        let half = |prime: &Integer, prime_squared: &Integer, reduced: &Integer| {
            let bits = prime.significant_bits();
            let mod_prime = montgomery::secure_pow_mod(r, reduced, bits, prime);
            montgomery::secure_pow_mod(&mod_prime, prime, bits, prime_squared)
        };
        let a = half(&self.p, &self.p_squared, &self.n_mod_p1);
        let b = half(&self.q, &self.q_squared, &self.n_mod_q1);
        // x = a + p² · ((b − a) (p²)⁻¹ mod q²)
        let mut t = b - &a;
        t *= &self.p2_inv_q2;
        t = t.modulo(&self.q_squared);
        Ok(t * &self.p_squared + a)
    }

    /// Enc(m) with fresh randomness, r^N computed by the CRT.
    pub fn encrypt<R: RngCore + CryptoRng + ?Sized>(
        &self,
        m: &Integer,
        rng: &mut R,
    ) -> Result<Ciphertext, PaillierError> {
        let r = random_unit(&self.public.n, rng);
        let r_to_n = self.nonce_power(&r)?;
        self.public.encrypt_with_nonce_power(m, &r_to_n)
    }

    /// Enc(m; r) with an explicit nonce, by the CRT (equal to [`PublicKey::encrypt_with`]).
    pub fn encrypt_with(&self, m: &Integer, r: &Integer) -> Result<Ciphertext, PaillierError> {
        let r_to_n = self.nonce_power(r)?;
        self.public.encrypt_with_nonce_power(m, &r_to_n)
    }
}

/// Precomputed values r^N mod N² for one key, drawn once each: the offline part of Paillier
/// encryption and re-randomisation. Filled by the key owner (CRT) or by anyone (public key).
pub struct NoncePool {
    public: PublicKey,
    ready: Vec<Integer>,
}

impl NoncePool {
    /// An empty pool for `public`.
    pub fn new(public: PublicKey) -> Self {
        Self {
            public,
            ready: Vec::new(),
        }
    }

    /// Adds `count` fresh values computed with the public key.
    pub fn fill_public<R: RngCore + CryptoRng + ?Sized>(&mut self, count: usize, rng: &mut R) {
        for _ in 0..count {
            let v = self.public.random_nonce_power(rng);
            self.ready.push(v);
        }
    }

    /// Adds `count` fresh values computed by the key owner with the CRT. Errors if `secret`
    /// is not the key of this pool.
    pub fn fill_owner<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        secret: &SecretKey,
        count: usize,
        rng: &mut R,
    ) -> Result<(), PaillierError> {
        if secret.public_key() != &self.public {
            return Err(PaillierError::BadModulus(
                "the pool belongs to another key".into(),
            ));
        }
        for _ in 0..count {
            let r = random_unit(&self.public.n, rng);
            self.ready.push(secret.nonce_power(&r)?);
        }
        Ok(())
    }

    /// Values ready.
    pub fn len(&self) -> usize {
        self.ready.len()
    }

    /// Whether no value is ready.
    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// One value, removed from the pool (each is used once); computed on the spot when the
    /// pool is empty.
    pub fn take<R: RngCore + CryptoRng + ?Sized>(&mut self, rng: &mut R) -> Integer {
        match self.ready.pop() {
            Some(v) => v,
            None => self.public.random_nonce_power(rng),
        }
    }

    /// Enc(m) with a pooled r^N.
    pub fn encrypt<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        m: &Integer,
        rng: &mut R,
    ) -> Result<Ciphertext, PaillierError> {
        let r_to_n = self.take(rng);
        self.public.encrypt_with_nonce_power(m, &r_to_n)
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;
    use std::sync::OnceLock;

    /// A 1024-bit key generated once per test process from a fixed seed (fast tests).
    pub(crate) fn small_key() -> &'static SecretKey {
        static KEY: OnceLock<SecretKey> = OnceLock::new();
        KEY.get_or_init(|| {
            let mut rng = ChaCha20Rng::seed_from_u64(0x9a11_1e71);
            SecretKey::generate(1024, &mut rng).expect("keygen")
        })
    }

    /// A 2048-bit key generated once per test process from a fixed seed.
    pub(crate) fn key_2048() -> &'static SecretKey {
        static KEY: OnceLock<SecretKey> = OnceLock::new();
        KEY.get_or_init(|| {
            let mut rng = ChaCha20Rng::seed_from_u64(0x2048);
            SecretKey::generate(2048, &mut rng).expect("keygen")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{key_2048, small_key};
    use super::*;
    use proptest::prelude::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    #[test]
    fn secret_keys_round_trip_strictly_through_their_encoding() {
        for sk in [small_key(), key_2048()] {
            let bytes = sk.to_bytes();
            let back = SecretKey::from_bytes(&bytes).expect("decodes");
            assert_eq!(back.public_key(), sk.public_key());
            assert_eq!(back.primes(), sk.primes());
            for len in 0..bytes.len() {
                assert!(SecretKey::from_bytes(&bytes[..len]).is_err());
            }
            let mut long = bytes.to_vec();
            long.push(0);
            assert!(SecretKey::from_bytes(&long).is_err());
            let mut version = bytes.to_vec();
            version[4] = 2;
            assert!(SecretKey::from_bytes(&version).is_err());
            // A flipped bit in p: not a prime any more, refused without echoing the key.
            let mut flipped = bytes.to_vec();
            flipped[10] ^= 0x10;
            let err = SecretKey::from_bytes(&flipped).expect_err("refused");
            assert!(!err.to_string().contains(&sk.primes().0.to_string()));
            assert!(format!("{back:?}").contains("redacted"));
        }
    }

    #[test]
    fn generated_keys_have_the_requested_size_and_blum_primes() {
        for sk in [small_key(), key_2048()] {
            let (p, q) = sk.primes();
            assert_eq!(p.mod_u(4), 3);
            assert_eq!(q.mod_u(4), 3);
            assert!(
                sk.public_key().modulus_bits() == 1024 || sk.public_key().modulus_bits() == 2048
            );
        }
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        assert!(SecretKey::generate(1000, &mut rng).is_err());
    }

    #[test]
    fn decryption_inverts_encryption_by_both_paths() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        for _ in 0..50 {
            let m = random_below(pk.n(), &mut rng);
            let r = random_unit(pk.n(), &mut rng);
            let c_pub = pk.encrypt_with(&m, &r).unwrap();
            let c_own = sk.encrypt_with(&m, &r).unwrap();
            assert_eq!(c_pub, c_own, "CRT encryption equals public encryption");
            assert_eq!(sk.decrypt(&c_pub), m);
        }
    }

    #[test]
    fn the_textbook_formula_holds() {
        // c = g^m r^N mod N² with g = N + 1, computed naively.
        let sk = small_key();
        let pk = sk.public_key();
        let m = Integer::from(123_456_789u64);
        let r = Integer::from(987_654_321u64);
        let g = (pk.n() + 1u32).complete();
        let naive = (g.pow_mod_ref(&m, pk.n_squared()).unwrap().complete()
            * r.pow_mod_ref(pk.n(), pk.n_squared()).unwrap().complete())
            % pk.n_squared();
        assert_eq!(pk.encrypt_with(&m, &r).unwrap().as_integer(), &naive);
    }

    #[test]
    fn homomorphic_operations_and_signed_plaintexts() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let a = Integer::from(-1234);
        let b = Integer::from(5678);
        let ca = pk
            .encrypt(&pk.reduce_signed(&a).unwrap(), &mut rng)
            .unwrap();
        let cb = pk
            .encrypt(&pk.reduce_signed(&b).unwrap(), &mut rng)
            .unwrap();
        assert_eq!(sk.decrypt_signed(&pk.add(&ca, &cb)), 4444);
        assert_eq!(
            sk.decrypt_signed(&pk.add_plain(&ca, &Integer::from(-10))),
            -1244
        );
        assert_eq!(
            sk.decrypt_signed(&pk.mul_plain(&ca, &Integer::from(-3))),
            3702
        );
        assert_eq!(sk.decrypt_signed(&pk.negate(&cb)), -5678);
        let fresh = pk.random_nonce_power(&mut rng);
        let rr = pk.rerandomize(&ca, &fresh);
        assert_ne!(rr, ca);
        assert_eq!(sk.decrypt_signed(&rr), -1234);
    }

    #[test]
    fn bad_inputs_are_refused() {
        let sk = small_key();
        let pk = sk.public_key();
        assert!(pk.encrypt_with(pk.n(), &Integer::from(2)).is_err());
        assert!(pk
            .encrypt_with(&Integer::from(1), &Integer::from(0))
            .is_err());
        assert!(pk.encrypt_with(&Integer::from(1), sk.primes().0).is_err());
        let len = pk.ciphertext_bytes();
        assert!(pk.ciphertext_from_bytes(&vec![0u8; len]).is_err());
        assert!(pk.ciphertext_from_bytes(&vec![0xffu8; len]).is_err());
        assert!(pk.ciphertext_from_bytes(&vec![1u8; len - 1]).is_err());
        let multiple_of_p = fixed_be(sk.primes().0, len);
        assert!(pk.ciphertext_from_bytes(&multiple_of_p).is_err());
        assert!(PublicKey::from_modulus(Integer::from(1u32) << 1023u32).is_err());
        let too_big = (pk.n() >> 1u32).complete() + 1u32;
        assert!(pk.reduce_signed(&too_big).is_err());
    }

    #[test]
    fn encodings_round_trip() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let c = pk.encrypt(&Integer::from(7), &mut rng).unwrap();
        let bytes = pk.ciphertext_to_bytes(&c);
        assert_eq!(bytes.len(), 256);
        assert_eq!(pk.ciphertext_from_bytes(&bytes).unwrap(), c);
        assert_eq!(&PublicKey::from_bytes(&pk.to_bytes()).unwrap(), pk);
    }

    #[test]
    fn pools_give_fresh_working_nonces() {
        let sk = small_key();
        let pk = sk.public_key().clone();
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let mut pool = NoncePool::new(pk.clone());
        pool.fill_owner(sk, 3, &mut rng).unwrap();
        pool.fill_public(2, &mut rng);
        assert_eq!(pool.len(), 5);
        let mut seen = Vec::new();
        for i in 0..7u32 {
            let c = pool.encrypt(&Integer::from(i), &mut rng).unwrap();
            assert_eq!(sk.decrypt(&c), i);
            assert!(!seen.contains(&c));
            seen.push(c);
        }
        assert!(pool.is_empty());
        let other = key_2048();
        assert!(pool.fill_owner(other, 1, &mut rng).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn addition_is_homomorphic(a in any::<i64>(), b in any::<i64>(), k in any::<i32>()) {
            let sk = small_key();
            let pk = sk.public_key();
            let mut rng = ChaCha20Rng::seed_from_u64(6);
            let ca = pk.encrypt(&pk.reduce_signed(&Integer::from(a)).unwrap(), &mut rng).unwrap();
            let cb = pk.encrypt(&pk.reduce_signed(&Integer::from(b)).unwrap(), &mut rng).unwrap();
            let sum = Integer::from(a) + Integer::from(b);
            prop_assert_eq!(sk.decrypt_signed(&pk.add(&ca, &cb)), sum);
            let prod = Integer::from(a) * Integer::from(k);
            prop_assert_eq!(sk.decrypt_signed(&pk.mul_plain(&ca, &Integer::from(k))), prod);
        }
    }
}
