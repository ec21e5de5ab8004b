//! # The device's signatures with its own Paillier key (RSA-FDH with exponent N)
//!
//! In [ABMR20] (Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint
//! 2020/1363) the device D talks to the terminal directly. In privmatch every message goes
//! through the coordinator, which is not trusted, and a device reaches it with an API
//! credential of scope `device`, which says "a device" but not which. So that only D can take
//! D's Round 2 messages or answer for D, and so that the terminal can check Π1's bit (Fig. 3
//! Round 3, the only output D reports by itself) came from D, D signs what it posts with the
//! Paillier key the service provider signed into its record: no new key to enrol, carry or
//! revoke, and everyone who checks already holds the record.
//!
//! **Scheme.** Full-domain-hash RSA [BR96] with the public exponent e = N. Paillier requires
//! gcd(N, φ(N)) = 1 ([Pai99] §3), so x ↦ x^N mod N is a permutation of Z_N* and D, knowing p
//! and q, inverts it: σ = H(m)^{N⁻¹ mod λ} computed by the CRT (σ_p = H^{N⁻¹ mod (p−1)} mod p,
//! likewise mod q; constant-time exponentiations). Anyone checks σ^N ≡ H(m) (mod N). H maps
//! (N, domain, message) to [0, N) by SHA-512 in counter mode over |N| + 128 bits, reduced
//! modulo N (statistically 2^−128 from uniform). D checks each signature (modulo p and q)
//! before it lets it go (a faulty CRT half would reveal a factor [BDL97]).
//!
//! **Why this does not weaken the encryption.** An N-th root oracle modulo N decrypts Paillier
//! ciphertexts (the root of c mod N is the nonce r, and c / r^N = 1 + mN), so the signer must
//! never root a value an adversary chose. Here D only roots hash outputs: in the random-oracle
//! model a signature is simulated without the key (draw σ, program H(m) = σ^N mod N, the usual
//! FDH simulation, exact because x ↦ x^N is a permutation), so signatures reveal nothing that
//! helps decrypt, and forging one means computing an N-th root modulo N of a random point,
//! which is exactly inverting the Paillier nonce map: a forger decrypts Paillier (one-wayness
//! under the DCR assumption of [Pai99]) with the usual FDH loss in the number of hash queries.
//! The domains below are distinct from every other hash of the project.
//!
//! **What is signed** (every field length-prefixed or fixed; device ids ≤ 128 bytes):
//!
//! ```text
//! mailbox: "mailbox" | len(device id) (u16) | device id | unix time in ms (i64, BE)
//! reply:   "reply"   | len(device id) (u16) | device id | session id (16) | round (1)
//!                    | kind (1: 0 message, 1 abandon) | SHA-256(message bytes or reason)
//! ```
//!
//! [BR96] Bellare, Rogaway, "The Exact Security of Digital Signatures — How to Sign with RSA
//! and Rabin", EUROCRYPT 1996. [BDL97] Boneh, DeMillo, Lipton, "On the Importance of Checking
//! Cryptographic Protocols for Faults", EUROCRYPT 1997. [Pai99] Paillier, "Public-Key
//! Cryptosystems Based on Composite Degree Residuosity Classes", EUROCRYPT 1999.

use rug::integer::Order;
use rug::{Complete, Integer};
use sha2::{Digest, Sha256, Sha512};

use super::cipher::{fixed_be, PublicKey, SecretKey};
use crate::algebra::montgomery::{pow_mod, secure_pow_mod};

/// Domain separation of every hash this module makes.
const HASH_DOMAIN: &[u8] = b"privmatch/paillier/device-signature/v1";

/// Extra bits hashed beyond |N| before the reduction modulo N.
const HASH_SLACK_BITS: u32 = 128;

/// Why a device signature is not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceSignatureError {
    /// The signature is not |N| bytes long.
    #[error("the device signature has {got} bytes, expected {expected} (|N| / 8)")]
    Length {
        /// Bytes received.
        got: usize,
        /// Bytes of N.
        expected: usize,
    },
    /// It is not a signature of this statement under the device's key.
    #[error("the device signature does not verify under the device's enrolled key")]
    Forged,
    /// Signing failed its own check (a fault): nothing was released.
    #[error("the device's signature failed its own check (a computation fault)")]
    Fault,
}

/// What a device signs: the statement's kind and its canonical bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    domain: &'static [u8],
    bytes: Vec<u8>,
}

fn push_device(out: &mut Vec<u8>, device_id: &str) {
    // Device ids are at most 128 bytes (checked where they enter), so the length fits u16.
    let len = u16::try_from(device_id.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(device_id.as_bytes());
}

impl Statement {
    /// A mailbox poll by `device_id` at `unix_ms` (the coordinator accepts it only near its
    /// own clock, so a poll cannot be replayed much later).
    pub fn mailbox(device_id: &str, unix_ms: i64) -> Self {
        let mut bytes = Vec::with_capacity(device_id.len() + 10);
        push_device(&mut bytes, device_id);
        bytes.extend_from_slice(&unix_ms.to_be_bytes());
        Self {
            domain: b"mailbox",
            bytes,
        }
    }

    /// The device's message `message` of `round` in `session` (e.g. Π1 Round 3).
    pub fn reply_message(device_id: &str, session: &[u8; 16], round: u8, message: &[u8]) -> Self {
        Self::reply(device_id, session, round, 0, message)
    }

    /// The device giving `session` up at `round`, for `reason`.
    pub fn reply_abandon(device_id: &str, session: &[u8; 16], round: u8, reason: &str) -> Self {
        Self::reply(device_id, session, round, 1, reason.as_bytes())
    }

    /// The device's request that the service provider delete its enrolment record `record`
    /// (the signed record's bytes, as the SP stores them): bound to that very record, so a
    /// signature captured once deletes nothing the device enrols later (issue 34 item 10).
    pub fn delete(device_id: &str, record: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(device_id.len() + 34);
        push_device(&mut bytes, device_id);
        bytes.extend_from_slice(&Sha256::digest(record));
        Self {
            domain: b"delete",
            bytes,
        }
    }

    fn reply(device_id: &str, session: &[u8; 16], round: u8, kind: u8, content: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(device_id.len() + 52);
        push_device(&mut bytes, device_id);
        bytes.extend_from_slice(session);
        bytes.push(round);
        bytes.push(kind);
        bytes.extend_from_slice(&Sha256::digest(content));
        Self {
            domain: b"reply",
            bytes,
        }
    }

    /// H(N, domain, bytes) ∈ [0, N) (module documentation).
    fn hash(&self, pk: &PublicKey) -> Integer {
        let n = pk.n();
        let n_bytes = fixed_be(n, pk.modulus_bytes());
        let wanted = (pk.modulus_bits() + HASH_SLACK_BITS).div_ceil(8) as usize;
        let mut stream = Vec::with_capacity(wanted + 64);
        let mut counter = 0u32;
        while stream.len() < wanted {
            let mut h = Sha512::new();
            for part in [HASH_DOMAIN, &n_bytes, self.domain, &self.bytes] {
                h.update((part.len() as u64).to_be_bytes());
                h.update(part);
            }
            h.update(counter.to_be_bytes());
            stream.extend_from_slice(&h.finalize());
            counter += 1;
        }
        stream.truncate(wanted);
        Integer::from_digits(&stream, Order::Msf).modulo(n)
    }
}

/// The device's signing key: its Paillier primes with the CRT exponents N⁻¹ mod (p − 1) and
/// N⁻¹ mod (q − 1) (secret; wiped when dropped).
pub struct DeviceSigner {
    public: PublicKey,
    p: Integer,
    q: Integer,
    d_p: Integer,
    d_q: Integer,
    p_inv_q: Integer,
    /// N mod (p − 1) and N mod (q − 1), for the signer's own check.
    e_p: Integer,
    e_q: Integer,
}

impl std::fmt::Debug for DeviceSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSigner({}-bit, <secret>)",
            self.public.modulus_bits()
        )
    }
}

impl Drop for DeviceSigner {
    fn drop(&mut self) {
        for x in [
            &mut self.p,
            &mut self.q,
            &mut self.d_p,
            &mut self.d_q,
            &mut self.p_inv_q,
            &mut self.e_p,
            &mut self.e_q,
        ] {
            super::proofs::wipe_integer(x);
        }
    }
}

impl DeviceSigner {
    /// The signer of `secret`'s key. A valid Paillier key has gcd(N, φ(N)) = 1, so the
    /// inverses exist; `None` for a key without them (never one [`SecretKey`] accepts).
    pub fn new(secret: &SecretKey) -> Option<Self> {
        let (p, q) = secret.primes();
        let n = secret.public_key().n();
        let (p_1, q_1) = ((p - 1u32).complete(), (q - 1u32).complete());
        let d_p = n.invert_ref(&p_1).map(Integer::from)?;
        let d_q = n.invert_ref(&q_1).map(Integer::from)?;
        let p_inv_q = p.invert_ref(q).map(Integer::from)?;
        Some(Self {
            public: secret.public_key().clone(),
            p: p.clone(),
            q: q.clone(),
            d_p,
            d_q,
            p_inv_q,
            e_p: n.modulo_ref(&p_1).complete(),
            e_q: n.modulo_ref(&q_1).complete(),
        })
    }

    /// The key signatures verify under.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// σ = H(statement)^{1/N} mod N, |N| bytes big endian, checked before it is returned.
    pub fn sign(&self, statement: &Statement) -> Result<Vec<u8>, DeviceSignatureError> {
        let h = statement.hash(&self.public);
        let bits = self.p.significant_bits();
        let mut root_p = secure_pow_mod(&h, &self.d_p, bits, &self.p);
        let mut root_q = secure_pow_mod(&h, &self.d_q, bits, &self.q);
        // σ = σ_p + p · ((σ_q − σ_p) p⁻¹ mod q)
        let mut t = (&root_q - &root_p).complete();
        t *= &self.p_inv_q;
        t = t.modulo(&self.q);
        let sigma = t * &self.p + &root_p;
        super::proofs::wipe_integer(&mut root_p);
        super::proofs::wipe_integer(&mut root_q);
        if !self.holds(&sigma, &h) {
            return Err(DeviceSignatureError::Fault);
        }
        Ok(fixed_be(&sigma, self.public.modulus_bytes()))
    }

    /// σ^N ≡ h (mod N), checked modulo p and q with the exponents reduced by Fermat
    /// (N mod (p − 1) > 0, since q is a prime other than p): a quarter of the public check's
    /// cost, and it catches a faulty CRT half just as well.
    fn holds(&self, sigma: &Integer, h: &Integer) -> bool {
        [(&self.p, &self.e_p), (&self.q, &self.e_q)]
            .into_iter()
            .all(|(prime, exponent)| {
                let power = secure_pow_mod(sigma, exponent, prime.significant_bits(), prime);
                power == h.modulo_ref(prime).complete()
            })
    }
}

/// Checks `signature` of `statement` under the device key `pk`: exactly |N| bytes, a value in
/// [1, N), and σ^N ≡ H(statement) (mod N).
pub fn verify(
    pk: &PublicKey,
    statement: &Statement,
    signature: &[u8],
) -> Result<(), DeviceSignatureError> {
    let expected = pk.modulus_bytes();
    if signature.len() != expected {
        return Err(DeviceSignatureError::Length {
            got: signature.len(),
            expected,
        });
    }
    let sigma = Integer::from_digits(signature, Order::Msf);
    if sigma == 0 || &sigma >= pk.n() {
        return Err(DeviceSignatureError::Forged);
    }
    if pow_mod(&sigma, pk.n(), pk.n()) != statement.hash(pk) {
        return Err(DeviceSignatureError::Forged);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn key(seed: u64) -> SecretKey {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        SecretKey::generate(2048, &mut rng).expect("key")
    }

    #[test]
    fn signatures_verify_under_their_key_and_statement_only() {
        let sk = key(1);
        let other = key(2);
        let signer = DeviceSigner::new(&sk).expect("signer");
        let session = [7u8; 16];
        let statements = [
            Statement::mailbox("phone-1", 1_700_000_000_000),
            Statement::reply_message("phone-1", &session, 3, &[1, 0, 1]),
            Statement::reply_abandon("phone-1", &session, 3, "no"),
        ];
        for s in &statements {
            let sig = signer.sign(s).expect("sign");
            assert_eq!(sig.len(), sk.public_key().modulus_bytes());
            verify(sk.public_key(), s, &sig).expect("verifies");
            assert_eq!(
                verify(other.public_key(), s, &sig),
                Err(DeviceSignatureError::Forged),
                "another device's key"
            );
            for t in statements.iter().filter(|t| *t != s) {
                assert_eq!(
                    verify(sk.public_key(), t, &sig),
                    Err(DeviceSignatureError::Forged)
                );
            }
        }
        // Every field is bound.
        let sig = signer
            .sign(&Statement::reply_message(
                "phone-1",
                &session,
                3,
                &[1, 0, 1],
            ))
            .expect("sign");
        let changed = [
            Statement::reply_message("phone-2", &session, 3, &[1, 0, 1]),
            Statement::reply_message("phone-1", &[8u8; 16], 3, &[1, 0, 1]),
            Statement::reply_message("phone-1", &session, 5, &[1, 0, 1]),
            Statement::reply_message("phone-1", &session, 3, &[1, 0, 0]),
            Statement::mailbox("phone-1", 1),
        ];
        for s in &changed {
            assert_eq!(
                verify(sk.public_key(), s, &sig),
                Err(DeviceSignatureError::Forged)
            );
        }
    }

    #[test]
    fn malformed_signatures_are_refused() {
        let sk = key(3);
        let pk = sk.public_key();
        let signer = DeviceSigner::new(&sk).expect("signer");
        let s = Statement::mailbox("d", 5);
        let sig = signer.sign(&s).expect("sign");
        assert!(matches!(
            verify(pk, &s, &sig[1..]),
            Err(DeviceSignatureError::Length { .. })
        ));
        let mut flipped = sig.clone();
        flipped[40] ^= 1;
        assert_eq!(verify(pk, &s, &flipped), Err(DeviceSignatureError::Forged));
        let zero = vec![0u8; sig.len()];
        assert_eq!(verify(pk, &s, &zero), Err(DeviceSignatureError::Forged));
        // σ + N (as bytes, if it fits) and N itself are not canonical.
        let n_bytes = fixed_be(pk.n(), pk.modulus_bytes());
        assert_eq!(verify(pk, &s, &n_bytes), Err(DeviceSignatureError::Forged));
        // H(m)^{1/N} is unique: the signature is deterministic.
        assert_eq!(signer.sign(&s).expect("again"), sig);
    }

    #[test]
    fn the_signers_own_check_catches_a_faulty_half() {
        let sk = key(5);
        let signer = DeviceSigner::new(&sk).expect("signer");
        let s = Statement::mailbox("d", 9);
        let h = s.hash(sk.public_key());
        let good = Integer::from_digits(&signer.sign(&s).expect("sign"), Order::Msf);
        assert!(signer.holds(&good, &h));
        // A fault in one CRT half: right modulo q, wrong modulo p.
        let faulty = (&good + &signer.q).complete() % sk.public_key().n();
        assert!(!signer.holds(&faulty, &h));
        assert!(verify(
            sk.public_key(),
            &s,
            &fixed_be(&faulty, sk.public_key().modulus_bytes())
        )
        .is_err());
    }

    #[test]
    fn the_hash_is_spread_over_z_n() {
        let sk = key(4);
        let pk = sk.public_key();
        let top_half = pk.n().clone() >> 1u32;
        let high = (0..64)
            .filter(|i| Statement::mailbox("d", *i).hash(pk) > top_half)
            .count();
        assert!((16..=48).contains(&high), "{high} of 64 above N/2");
    }
}
