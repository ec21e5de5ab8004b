//! # Two-message oblivious transfer secure against a malicious receiver
//!
//! The evaluator of a garbled circuit (the device in Π3 of [ABMR20]) obtains the labels of its
//! input bits by 1-out-of-2 OT from the garbler (the terminal). This is the two-message
//! "endemic" OT of Masny and Rindal, "Endemic Oblivious Transfer", CCS 2019 (ePrint
//! 2019/706; the construction of OT from a key agreement whose messages are uniform in a
//! group, random-oracle model), instantiated with Diffie–Hellman over the prime-order Ristretto255 group
//! (`curve25519-dalek`), generator G:
//!
//! ```text
//! Receiver (choice c_i, OT i = 0..n):            Sender (pairs (L0_i, L1_i)):
//!   a_i ← Z_ℓ,  m_{c} = a_i·G
//!   r_{1−c} ← uniform group element
//!   r_{c}   = m_{c} − H_i(r_{1−c})
//!                  ── (r_0, r_1)_i for all i ──▶
//!                                                  b ← Z_ℓ, B = b·G (one for the batch)
//!                                                  m_0 = r_0 + H_i(r_1),  m_1 = r_1 + H_i(r_0)
//!                                                  k_j = KDF_i(j, b·m_j),  e_j = L_j ⊕ k_j
//!                  ◀── B, (e_0, e_1)_i for all i ──
//!   k_c = KDF_i(c, a_i·B),  L_c = e_c ⊕ k_c
//! ```
//!
//! (r_0, r_1) is a pair of uniform, independent group elements whatever c is, so the sender
//! learns nothing (perfectly). A malicious receiver picks (r_0, r_1) freely, but m_0 and m_1
//! are then fixed through the random oracle H onto the group, and it cannot know the discrete
//! logarithms of both (that would solve CDH with a programmed H), so at most one k_j is
//! computable: "endemic" security against a malicious receiver in the paper's terms, which is
//! what a garbled-circuit evaluator needs.
//!
//! ## Hashes and domain separation
//!
//! * H_i(r) = `RistrettoPoint::from_hash(SHA-512(DOMAIN_H ‖ len(sid) ‖ sid ‖ i ‖ enc(r)))`
//!   (Elligator-based hash to the group): a random oracle onto the group, keyed by the session
//!   id and the OT index, so a receiver cannot reuse one (r_0, r_1) across indices or
//!   sessions.
//! * KDF_i(j, P) = first 16 bytes of SHA-512(DOMAIN_KDF ‖ len(sid) ‖ sid ‖ i ‖ j ‖ enc(B) ‖
//!   enc(r_0) ‖ enc(r_1) ‖ enc(P)): binds the key to the session, the index, the side j and
//!   the whole transcript of OT i. The sender's B is shared by the batch (as in the paper's
//!   batched variant); the index in every hash keeps the OTs independent.
//!
//! `len` is a `u64` (LE), `i` a `u64` (LE), `j` one byte, `enc` the canonical 32-byte
//! Ristretto encoding. Every point received is decoded with the canonical-encoding check
//! (`CompressedRistretto::decompress`), and an invalid one is an error naming its index; the
//! sender never panics on the receiver's bytes.
//!
//! [ABMR20]: https://eprint.iacr.org/2020/1363

use curve25519_dalek::constants::RISTRETTO_BASEPOINT_TABLE;
use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoBasepointTable, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::Identity;
use rand_core::{CryptoRng, RngCore};
use sha2::{Digest, Sha512};
use thiserror::Error;
use zeroize::Zeroize;

use super::garble::Label;

/// Largest number of OTs in one batch (bounds what a message may make the other side
/// allocate and compute).
pub const MAX_OTS: usize = 1 << 16;

/// Domain label of the hash onto the group H.
const DOMAIN_H: &[u8] = b"privmatch ot mr19 hash-to-group v1";
/// Domain label of the key derivation.
const DOMAIN_KDF: &[u8] = b"privmatch ot mr19 key v1";

/// Bytes of one encoded point.
const POINT: usize = 32;

/// What can go wrong in the OT.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum OtError {
    /// The two sides disagree on the number of OTs.
    #[error("expected {expected} OTs, the message has {got}")]
    Count {
        /// OTs this side has (pairs or choices).
        expected: usize,
        /// OTs in the message.
        got: usize,
    },
    /// A point of the receiver's message is not a valid Ristretto encoding.
    #[error("OT {index}: r_{which} is not a valid Ristretto point")]
    InvalidPoint {
        /// The OT index.
        index: usize,
        /// 0 or 1: which of (r_0, r_1).
        which: u8,
    },
    /// The sender's B is not a valid Ristretto encoding, or is the identity.
    #[error("the sender's point B is invalid or the identity")]
    InvalidSenderPoint,
    /// A message has a length that does not parse.
    #[error("{what}: {len} bytes is not a valid length")]
    Length {
        /// Which message.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// More than [`MAX_OTS`] OTs.
    #[error("{0} OTs in one batch, at most {MAX_OTS} allowed")]
    TooMany(usize),
}

/// The receiver's message: (r_0, r_1) per OT, as canonical 32-byte encodings (validated by
/// the sender in [`OtSender::respond`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiverMessage {
    pairs: Vec<[[u8; POINT]; 2]>,
}

impl ReceiverMessage {
    /// Number of OTs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether the message has no OT.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Canonical bytes: r_0 ‖ r_1 of OT 0, then of OT 1, … (64 bytes per OT).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.pairs.iter().flatten().flatten().copied().collect()
    }

    /// Parses a message of 64 bytes per OT, at most [`MAX_OTS`] OTs. The points are checked
    /// by [`OtSender::respond`].
    pub fn from_bytes(bytes: &[u8]) -> Result<ReceiverMessage, OtError> {
        if !bytes.len().is_multiple_of(2 * POINT) {
            return Err(OtError::Length {
                what: "receiver message",
                len: bytes.len(),
            });
        }
        let n = bytes.len() / (2 * POINT);
        if n > MAX_OTS {
            return Err(OtError::TooMany(n));
        }
        let pairs = bytes
            .chunks_exact(2 * POINT)
            .map(|c| {
                let mut r0 = [0u8; POINT];
                let mut r1 = [0u8; POINT];
                r0.copy_from_slice(&c[..POINT]);
                r1.copy_from_slice(&c[POINT..]);
                [r0, r1]
            })
            .collect();
        Ok(ReceiverMessage { pairs })
    }
}

/// The sender's message: B and the two encrypted labels of every OT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SenderMessage {
    b: [u8; POINT],
    ciphertexts: Vec<[u128; 2]>,
}

impl SenderMessage {
    /// Number of OTs.
    pub fn len(&self) -> usize {
        self.ciphertexts.len()
    }

    /// Whether the message has no OT.
    pub fn is_empty(&self) -> bool {
        self.ciphertexts.is_empty()
    }

    /// Canonical bytes: enc(B) (32), then e_0 ‖ e_1 of every OT (16 + 16, little-endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(POINT + 32 * self.ciphertexts.len());
        out.extend_from_slice(&self.b);
        for [e0, e1] in &self.ciphertexts {
            out.extend_from_slice(&e0.to_le_bytes());
            out.extend_from_slice(&e1.to_le_bytes());
        }
        out
    }

    /// Parses 32 + 32·n bytes, n ≤ [`MAX_OTS`]. B is checked by [`OtReceiver::finish`].
    pub fn from_bytes(bytes: &[u8]) -> Result<SenderMessage, OtError> {
        let bad = OtError::Length {
            what: "sender message",
            len: bytes.len(),
        };
        if bytes.len() < POINT || !(bytes.len() - POINT).is_multiple_of(32) {
            return Err(bad);
        }
        let n = (bytes.len() - POINT) / 32;
        if n > MAX_OTS {
            return Err(OtError::TooMany(n));
        }
        let mut b = [0u8; POINT];
        b.copy_from_slice(&bytes[..POINT]);
        let block = |s: &[u8]| {
            let mut x = [0u8; 16];
            x.copy_from_slice(s);
            u128::from_le_bytes(x)
        };
        let ciphertexts = bytes[POINT..]
            .chunks_exact(32)
            .map(|c| [block(&c[..16]), block(&c[16..])])
            .collect();
        Ok(SenderMessage { b, ciphertexts })
    }
}

/// H_i(r): the random oracle onto the group, keyed by session and index.
fn hash_to_group(session: &[u8], index: usize, r: &[u8; POINT]) -> RistrettoPoint {
    let h = Sha512::new()
        .chain_update(DOMAIN_H)
        .chain_update((session.len() as u64).to_le_bytes())
        .chain_update(session)
        .chain_update((index as u64).to_le_bytes())
        .chain_update(r);
    RistrettoPoint::from_hash(h)
}

/// KDF_i(j, P): the one-time pad of label j of OT i.
fn kdf(
    session: &[u8],
    index: usize,
    j: u8,
    b: &[u8; POINT],
    pair: &[[u8; POINT]; 2],
    shared: &RistrettoPoint,
) -> u128 {
    let mut shared_enc = shared.compress().to_bytes();
    let digest = Sha512::new()
        .chain_update(DOMAIN_KDF)
        .chain_update((session.len() as u64).to_le_bytes())
        .chain_update(session)
        .chain_update((index as u64).to_le_bytes())
        .chain_update([j])
        .chain_update(b)
        .chain_update(pair[0])
        .chain_update(pair[1])
        .chain_update(shared_enc)
        .finalize();
    shared_enc.zeroize();
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    let k = u128::from_le_bytes(key);
    key.zeroize();
    k
}

/// Swaps `x` and `y` when `swap` is set, without branching on it (the choice bit is the
/// receiver's secret).
fn cswap(swap: bool, x: &mut [u8; POINT], y: &mut [u8; POINT]) {
    let m = 0u8.wrapping_sub(u8::from(swap));
    for (a, b) in x.iter_mut().zip(y.iter_mut()) {
        let t = (*a ^ *b) & m;
        *a ^= t;
        *b ^= t;
    }
}

/// The receiver's state between its message and the sender's: the session id, the choice
/// bits, the secret exponents a_i and its own message (for the KDF). Zeroized on drop.
pub struct OtReceiver {
    session: Vec<u8>,
    choices: Vec<bool>,
    secrets: Vec<Scalar>,
    request: Vec<[[u8; POINT]; 2]>,
}

impl Drop for OtReceiver {
    fn drop(&mut self) {
        self.choices.zeroize();
        self.secrets.zeroize();
    }
}

impl std::fmt::Debug for OtReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OtReceiver({} OTs)", self.choices.len())
    }
}

impl OtReceiver {
    /// The receiver's first (and only) message for the choice bits `choices` in session
    /// `session` (Masny–Rindal, receiver step): per OT, m_c = a·G, r_{1−c} uniform, r_c =
    /// m_c − H_i(r_{1−c}). The session id must be the one the sender uses (the protocol's
    /// session binding); a different one makes every label come out wrong.
    pub fn new<R: RngCore + CryptoRng>(
        session: &[u8],
        choices: &[bool],
        rng: &mut R,
    ) -> (OtReceiver, ReceiverMessage) {
        let mut secrets = Vec::with_capacity(choices.len());
        let mut pairs = Vec::with_capacity(choices.len());
        for (index, &c) in choices.iter().enumerate() {
            let a = Scalar::random(rng);
            let m = RISTRETTO_BASEPOINT_TABLE * &a;
            // r_{1−c}: a uniformly random group element (Elligator of 64 random bytes).
            let other = RistrettoPoint::random(rng).compress().to_bytes();
            let mine = (m - hash_to_group(session, index, &other))
                .compress()
                .to_bytes();
            // (r_0, r_1) = (mine, other) for c = 0, (other, mine) for c = 1.
            let (mut r0, mut r1) = (mine, other);
            cswap(c, &mut r0, &mut r1);
            pairs.push([r0, r1]);
            secrets.push(a);
        }
        let receiver = OtReceiver {
            session: session.to_vec(),
            choices: choices.to_vec(),
            secrets,
            request: pairs.clone(),
        };
        (receiver, ReceiverMessage { pairs })
    }

    /// Number of OTs.
    pub fn len(&self) -> usize {
        self.choices.len()
    }

    /// Whether there is no OT.
    pub fn is_empty(&self) -> bool {
        self.choices.is_empty()
    }

    /// The chosen labels from the sender's message (Masny–Rindal, receiver output): k_c =
    /// KDF_i(c, a_i·B), L_c = e_c ⊕ k_c. Fails if the count differs or B is not a valid
    /// non-identity point.
    pub fn finish(self, reply: &SenderMessage) -> Result<Vec<Label>, OtError> {
        if reply.len() != self.choices.len() {
            return Err(OtError::Count {
                expected: self.choices.len(),
                got: reply.len(),
            });
        }
        let b = CompressedRistretto(reply.b)
            .decompress()
            .filter(|p| *p != RistrettoPoint::identity())
            .ok_or(OtError::InvalidSenderPoint)?;
        // One table for B makes the n multiplications by B fixed-base ones.
        let table = RistrettoBasepointTable::create(&b);
        let mut out = Vec::with_capacity(self.choices.len());
        for (index, ((&c, a), pair)) in self
            .choices
            .iter()
            .zip(&self.secrets)
            .zip(&self.request)
            .enumerate()
        {
            let mut shared = &table * a;
            let k = kdf(&self.session, index, u8::from(c), &reply.b, pair, &shared);
            shared.zeroize();
            let [e0, e1] = reply.ciphertexts[index];
            // e_c without branching on c.
            let m = 0u128.wrapping_sub(u128::from(c));
            let e = (e0 & !m) | (e1 & m);
            out.push(Label::from_u128(e ^ k));
        }
        Ok(out)
    }
}

/// The sender side: stateless, one call.
#[derive(Clone, Copy, Debug, Default)]
pub struct OtSender;

impl OtSender {
    /// The sender's message for the receiver's `request` in session `session`, transferring
    /// label pair i in OT i (Masny–Rindal, sender step): B = b·G for a fresh b, m_0 = r_0 +
    /// H_i(r_1), m_1 = r_1 + H_i(r_0), e_j = L_j ⊕ KDF_i(j, b·m_j). Fails (never panics) if
    /// the counts differ, there are more than [`MAX_OTS`] OTs, or a point is invalid (naming
    /// the OT).
    pub fn respond<R: RngCore + CryptoRng>(
        session: &[u8],
        request: &ReceiverMessage,
        pairs: &[(Label, Label)],
        rng: &mut R,
    ) -> Result<SenderMessage, OtError> {
        if request.len() != pairs.len() {
            return Err(OtError::Count {
                expected: pairs.len(),
                got: request.len(),
            });
        }
        if pairs.len() > MAX_OTS {
            return Err(OtError::TooMany(pairs.len()));
        }
        // Decode every point before any secret work, so a bad message costs little.
        let mut points = Vec::with_capacity(request.len());
        for (index, pair) in request.pairs.iter().enumerate() {
            let mut decoded = [RistrettoPoint::identity(); 2];
            for (which, enc) in pair.iter().enumerate() {
                decoded[which] =
                    CompressedRistretto(*enc)
                        .decompress()
                        .ok_or(OtError::InvalidPoint {
                            index,
                            which: which as u8,
                        })?;
            }
            points.push(decoded);
        }
        let mut b = Scalar::random(rng);
        let b_enc = (RISTRETTO_BASEPOINT_TABLE * &b).compress().to_bytes();
        let mut ciphertexts = Vec::with_capacity(pairs.len());
        for (index, ((enc, [r0, r1]), (l0, l1))) in
            request.pairs.iter().zip(&points).zip(pairs).enumerate()
        {
            let m0 = r0 + hash_to_group(session, index, &enc[1]);
            let m1 = r1 + hash_to_group(session, index, &enc[0]);
            let mut s0 = m0 * b;
            let mut s1 = m1 * b;
            let k0 = kdf(session, index, 0, &b_enc, enc, &s0);
            let k1 = kdf(session, index, 1, &b_enc, enc, &s1);
            s0.zeroize();
            s1.zeroize();
            ciphertexts.push([l0.as_u128() ^ k0, l1.as_u128() ^ k1]);
        }
        b.zeroize();
        Ok(SenderMessage {
            b: b_enc,
            ciphertexts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    fn random_pairs(rng: &mut ChaCha20Rng, n: usize) -> Vec<(Label, Label)> {
        (0..n)
            .map(|_| (Label::from_u128(rng.gen()), Label::from_u128(rng.gen())))
            .collect()
    }

    fn run(
        session_r: &[u8],
        session_s: &[u8],
        choices: &[bool],
        pairs: &[(Label, Label)],
        seed: u64,
    ) -> Vec<Label> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let (receiver, request) = OtReceiver::new(session_r, choices, &mut rng);
        let request = ReceiverMessage::from_bytes(&request.to_bytes()).unwrap();
        let reply = OtSender::respond(session_s, &request, pairs, &mut rng).unwrap();
        let reply = SenderMessage::from_bytes(&reply.to_bytes()).unwrap();
        receiver.finish(&reply).unwrap()
    }

    #[test]
    fn every_choice_pattern_gets_the_chosen_label() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x6f74_0001);
        for n in 1..=5usize {
            for pattern in 0u32..1 << n {
                let choices: Vec<bool> = (0..n).map(|i| pattern >> i & 1 == 1).collect();
                let pairs = random_pairs(&mut rng, n);
                let got = run(b"sid", b"sid", &choices, &pairs, rng.gen());
                for ((l, (l0, l1)), &c) in got.iter().zip(&pairs).zip(&choices) {
                    assert_eq!(l, if c { l1 } else { l0 });
                }
            }
        }
        // A large random batch.
        let choices: Vec<bool> = (0..300).map(|_| rng.gen()).collect();
        let pairs = random_pairs(&mut rng, 300);
        let got = run(b"session 7", b"session 7", &choices, &pairs, 9);
        for ((l, (l0, l1)), &c) in got.iter().zip(&pairs).zip(&choices) {
            assert_eq!(l, if c { l1 } else { l0 });
        }
    }

    #[test]
    fn the_other_label_stays_hidden() {
        // The receiver's key for 1 − c (computed the only way it can, from a_i and B) does not
        // open e_{1−c}; neither does a flipped choice after the fact.
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let choices: Vec<bool> = (0..64).map(|_| rng.gen()).collect();
        let pairs = random_pairs(&mut rng, 64);
        let (receiver, request) = OtReceiver::new(b"s", &choices, &mut rng);
        let reply = OtSender::respond(b"s", &request, &pairs, &mut rng).unwrap();
        let b = CompressedRistretto(reply.b).decompress().unwrap();
        for (i, &c) in choices.iter().enumerate() {
            let shared = b * receiver.secrets[i];
            let other = u8::from(!c);
            let k = kdf(b"s", i, other, &reply.b, &receiver.request[i], &shared);
            let e = reply.ciphertexts[i][usize::from(other)];
            let (l0, l1) = pairs[i];
            let hidden = if c { l0 } else { l1 };
            assert_ne!(e ^ k, hidden.as_u128());
            // The chosen one does open.
            let k = kdf(
                b"s",
                i,
                u8::from(c),
                &reply.b,
                &receiver.request[i],
                &shared,
            );
            let shown = if c { l1 } else { l0 };
            assert_eq!(reply.ciphertexts[i][usize::from(c)] ^ k, shown.as_u128());
        }
    }

    #[test]
    fn a_receiver_knowing_both_discrete_logs_of_r_gets_neither_label() {
        // A cheating receiver that sends r_0 = x_0·G and r_1 = x_1·G (knowing x_0, x_1) cannot
        // use them: the keys are b·(r_j + H_i(r_{1−j})) and it does not know log H_i(·).
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let pairs = random_pairs(&mut rng, 8);
        let xs: Vec<[Scalar; 2]> = (0..8)
            .map(|_| [Scalar::random(&mut rng), Scalar::random(&mut rng)])
            .collect();
        let request = ReceiverMessage {
            pairs: xs
                .iter()
                .map(|[x0, x1]| {
                    [
                        (RISTRETTO_BASEPOINT_TABLE * x0).compress().to_bytes(),
                        (RISTRETTO_BASEPOINT_TABLE * x1).compress().to_bytes(),
                    ]
                })
                .collect(),
        };
        let reply = OtSender::respond(b"s", &request, &pairs, &mut rng).unwrap();
        let b = CompressedRistretto(reply.b).decompress().unwrap();
        for (i, [x0, x1]) in xs.iter().enumerate() {
            for (j, x) in [x0, x1].into_iter().enumerate() {
                let k = kdf(b"s", i, j as u8, &reply.b, &request.pairs[i], &(b * x));
                let want = if j == 0 { pairs[i].0 } else { pairs[i].1 };
                assert_ne!(reply.ciphertexts[i][j] ^ k, want.as_u128());
            }
        }
    }

    #[test]
    fn another_session_gives_garbage() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let choices: Vec<bool> = (0..32).map(|_| rng.gen()).collect();
        let pairs = random_pairs(&mut rng, 32);
        let got = run(b"session A", b"session B", &choices, &pairs, 5);
        for (l, (l0, l1)) in got.iter().zip(&pairs) {
            assert!(l != l0 && l != l1);
        }
        // Length-prefixed session ids: "ab" ‖ "c" is not "a" ‖ "bc".
        let got = run(b"ab", b"a", &choices, &pairs, 6);
        assert!(got
            .iter()
            .zip(&pairs)
            .all(|(l, (l0, l1))| l != l0 && l != l1));
    }

    #[test]
    fn invalid_messages_are_errors() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let choices = [true, false, true, true];
        let pairs = random_pairs(&mut rng, 4);
        let (receiver, request) = OtReceiver::new(b"s", &choices, &mut rng);
        // A non-canonical / off-curve encoding at OT 2, r_1.
        let mut bytes = request.to_bytes();
        bytes[2 * 64 + 32..3 * 64].copy_from_slice(&[0xff; 32]);
        let bad = ReceiverMessage::from_bytes(&bytes).unwrap();
        assert_eq!(
            OtSender::respond(b"s", &bad, &pairs, &mut rng),
            Err(OtError::InvalidPoint { index: 2, which: 1 })
        );
        // Random bytes: most 32-byte strings are not Ristretto encodings.
        let mut rejected = 0;
        for _ in 0..50 {
            let mut bytes = request.to_bytes();
            rng.fill(&mut bytes[..32]);
            let bad = ReceiverMessage::from_bytes(&bytes).unwrap();
            match OtSender::respond(b"s", &bad, &pairs, &mut rng) {
                Err(OtError::InvalidPoint { index: 0, which: 0 }) => rejected += 1,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert!(rejected > 40, "{rejected}");
        // Counts and lengths.
        assert_eq!(
            OtSender::respond(b"s", &request, &pairs[..3], &mut rng),
            Err(OtError::Count {
                expected: 3,
                got: 4
            })
        );
        assert!(matches!(
            ReceiverMessage::from_bytes(&bytes[..63]),
            Err(OtError::Length { .. })
        ));
        assert!(matches!(
            ReceiverMessage::from_bytes(&vec![0u8; 64 * (MAX_OTS + 1)]),
            Err(OtError::TooMany(_))
        ));
        assert!(ReceiverMessage::from_bytes(&[]).unwrap().is_empty());
        let reply = OtSender::respond(b"s", &request, &pairs, &mut rng).unwrap();
        let rb = reply.to_bytes();
        assert_eq!(rb.len(), 32 + 4 * 32);
        assert!(SenderMessage::from_bytes(&rb[..31]).is_err());
        assert!(SenderMessage::from_bytes(&rb[..rb.len() - 1]).is_err());
        let short = SenderMessage::from_bytes(&rb[..rb.len() - 32]).unwrap();
        let (r2, _) = OtReceiver::new(b"s", &choices, &mut rng);
        assert_eq!(
            r2.finish(&short),
            Err(OtError::Count {
                expected: 4,
                got: 3
            })
        );
        // An invalid or identity B.
        for b in [[0xffu8; 32], [0u8; 32]] {
            let mut bad = rb.clone();
            bad[..32].copy_from_slice(&b);
            let (r3, _) = OtReceiver::new(b"s", &choices, &mut rng);
            assert_eq!(
                r3.finish(&SenderMessage::from_bytes(&bad).unwrap()),
                Err(OtError::InvalidSenderPoint)
            );
        }
        assert_eq!(receiver.finish(&reply).unwrap().len(), 4);
    }

    #[test]
    fn the_receiver_message_hides_the_choices() {
        // Both points are fresh uniform group elements for either choice; check at least that
        // they are distinct, valid and differ between runs with the same choices.
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        let (_, m1) = OtReceiver::new(b"s", &[false, true], &mut rng);
        let (_, m2) = OtReceiver::new(b"s", &[false, true], &mut rng);
        assert_ne!(m1, m2);
        for pair in m1.pairs.iter().chain(&m2.pairs) {
            assert_ne!(pair[0], pair[1]);
            assert!(pair
                .iter()
                .all(|p| CompressedRistretto(*p).decompress().is_some()));
        }
    }

    #[test]
    fn cswap_swaps_only_when_asked() {
        let (mut x, mut y) = ([1u8; 32], [2u8; 32]);
        cswap(false, &mut x, &mut y);
        assert_eq!((x[0], y[0]), (1, 2));
        cswap(true, &mut x, &mut y);
        assert_eq!((x, y), ([2u8; 32], [1u8; 32]));
    }
}
