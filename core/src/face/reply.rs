//! Sealed output shares: each evaluator's output of a face session (the round-3 shares o_b of
//! Funshade's `res` step, Ibarrondo, Chabanne, Önen, "Funshade", PETS 2023, ePrint 2022/1688,
//! Alg. 1) sealed to the client that asked, so that the coordinator relays ciphertext only and
//! learns no comparison bit (docs/protocols/face.md §13.9).
//!
//! The client puts a **reply key** (an X25519 public key R whose secret r only it holds) into
//! its sealed probe ([`crate::face::probe`], version 2), so the coordinator can neither read nor
//! swap it. Evaluator P_b, with static key pair (s_b, S_b), seals its output under
//!
//! ```text
//! k_b = HKDF-SHA256(ikm = X25519(s_b, R), salt = none,
//!                   info = LABEL ‖ session (16) ‖ b (1) ‖ S_b (32) ‖ R (32))
//! ```
//!
//! with XChaCha20-Poly1305 (random 24-byte nonce). The client computes the same key as
//! X25519(r, S_b) with S_b from its own pinned configuration, never from the coordinator.
//! Only P_b and the holder of r can compute k_b, so the coordinator can neither read, alter nor
//! forge a sealed output, and a reply that opens is authenticated as P_b's for this session.
//! (For the SQL front door the reply key is the called party's own static key, so that party
//! opens the replies with its key file.)
//!
//! Layout (little-endian):
//!
//! ```text
//! "PMFR" | version 1 | party (1) | nonce (24) | AEAD(k_b, nonce, aad = header ‖ session,
//!     plaintext = comparisons (u32) | list digest (32) | subjects digest (32) | o_b (4·N))
//! ```
//!
//! The list digest is the digest of the compared template list the party evaluated (both
//! evaluators must agree); the subjects digest ([`subjects_digest`]) binds the shares to the
//! subjects in comparison order, so a coordinator that reorders or renames the subjects it
//! relays beside the sealed outputs is caught by the client.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use hkdf::Hkdf;
use rand_core::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::Zeroize;

use super::encoding::evaluator;
use super::funshade::reconstruct;
use super::FaceError;
use crate::crypto::seal::{PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;
use crate::wire::session::SESSION_ID_LEN;

/// Length of a reply key (an X25519 public key).
pub const REPLY_KEY_LEN: usize = 32;

const REPLY_MAGIC: &[u8; 4] = b"PMFR";
const REPLY_VERSION: u8 = 1;
const NONCE_LEN: usize = 24;
const HEADER_LEN: usize = 4 + 1 + 1 + NONCE_LEN;
const LABEL: &[u8] = b"privmatch face sealed output v1";

/// Length of a sealed output of `comparisons` comparisons: it depends on the count only
/// (header, nonce, count, two digests, 4 bytes per comparison, AEAD tag).
pub const fn sealed_output_len(comparisons: usize) -> usize {
    HEADER_LEN + 4 + 32 + 32 + 4 * comparisons + 16
}

/// What one evaluator computed in a face session, as it seals it to the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaceReply {
    /// The evaluator that computed it (P0 or P1).
    pub party: PartyIndex,
    /// Digest of the compared template list the evaluator evaluated.
    pub list_digest: [u8; 32],
    /// [`subjects_digest`] of the compared subjects, in comparison order.
    pub subjects_digest: [u8; 32],
    /// The evaluator's output shares o_b, one per comparison.
    pub shares: Vec<u32>,
}

/// The digest that binds a sealed output to the compared subjects, in comparison order:
/// SHA-256 over a label and each subject as length (u32) ‖ UTF-8 bytes.
pub fn subjects_digest<'a>(subjects: impl IntoIterator<Item = &'a str>) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"privmatch face compared subjects v1");
    for s in subjects {
        hash.update((s.len() as u32).to_le_bytes());
        hash.update(s.as_bytes());
    }
    hash.finalize().into()
}

/// The AEAD key of party `party`'s output in `session`: HKDF-SHA256 over the X25519 secret
/// the party and the reply key's holder share (module docs).
fn reply_cipher(
    shared: &[u8; 32],
    session: &[u8; SESSION_ID_LEN],
    party: PartyIndex,
    party_key: &PartyPublicKey,
    reply_key: &PartyPublicKey,
) -> XChaCha20Poly1305 {
    let hk = Hkdf::<Sha256>::new(None, shared);
    let mut info = Vec::with_capacity(LABEL.len() + SESSION_ID_LEN + 1 + 64);
    info.extend_from_slice(LABEL);
    info.extend_from_slice(session);
    info.push(party.as_u8());
    info.extend_from_slice(party_key.as_bytes());
    info.extend_from_slice(reply_key.as_bytes());
    let mut key = [0u8; 32];
    // 32 bytes is always a valid HKDF-SHA256 output length.
    hk.expand(&info, &mut key)
        .expect("HKDF-SHA256 can expand 32 bytes");
    let cipher = XChaCha20Poly1305::new(&key.into());
    key.zeroize();
    cipher
}

fn x25519(secret: &PartySecretKey, public: &PartyPublicKey) -> [u8; 32] {
    let mut bytes = secret.to_bytes();
    let shared = StaticSecret::from(bytes)
        .diffie_hellman(&PublicKey::from(*public.as_bytes()))
        .to_bytes();
    bytes.zeroize();
    shared
}

fn aad(header: &[u8], session: &[u8; SESSION_ID_LEN]) -> Vec<u8> {
    [header, session.as_slice()].concat()
}

/// The sealing of one evaluator's output to one reply key in one session, with its key
/// derived once (at the session's open, when the party's secret is at hand).
pub struct ReplySealer {
    party: PartyIndex,
    session: [u8; SESSION_ID_LEN],
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for ReplySealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplySealer({}, <redacted>)", self.party)
    }
}

impl ReplySealer {
    /// Evaluator `me` (P0 or P1, holding `secret`) prepares to seal its output of `session`
    /// to `reply_key` (from the client's sealed probe).
    pub fn new(
        me: PartyIndex,
        secret: &PartySecretKey,
        reply_key: &PartyPublicKey,
        session: &[u8; SESSION_ID_LEN],
    ) -> Result<Self, FaceError> {
        evaluator(me)?;
        let mut shared = x25519(secret, reply_key);
        let cipher = reply_cipher(&shared, session, me, &secret.public_key(), reply_key);
        shared.zeroize();
        Ok(ReplySealer {
            party: me,
            session: *session,
            cipher,
        })
    }

    /// Seals the output `shares` of the compared list (`list_digest`, `subjects_digest`).
    pub fn seal<R: RngCore + CryptoRng>(
        &self,
        list_digest: &[u8; 32],
        subjects_digest: &[u8; 32],
        shares: &[u32],
        rng: &mut R,
    ) -> Vec<u8> {
        let mut header = Vec::with_capacity(HEADER_LEN + 84 + 4 * shares.len());
        header.extend_from_slice(REPLY_MAGIC);
        header.push(REPLY_VERSION);
        header.push(self.party.as_u8());
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        header.extend_from_slice(&nonce);
        let mut plain = Vec::with_capacity(68 + 4 * shares.len());
        plain.extend_from_slice(&(shares.len() as u32).to_le_bytes());
        plain.extend_from_slice(list_digest);
        plain.extend_from_slice(subjects_digest);
        for w in shares {
            plain.extend_from_slice(&w.to_le_bytes());
        }
        let ciphertext = self
            .cipher
            .encrypt(
                &nonce.into(),
                Payload {
                    msg: &plain,
                    aad: &aad(&header, &self.session),
                },
            )
            .expect("XChaCha20-Poly1305 encryption of an in-memory buffer cannot fail");
        plain.zeroize();
        header.extend_from_slice(&ciphertext);
        header
    }
}

/// Client side: opens evaluator `party`'s sealed output of `session` with the reply key's
/// secret `reply_secret` and the party's pinned public key `party_key`. Refused
/// ([`FaceError::SealedOutput`], naming the party) when it was altered, forged, or sealed for
/// another session, party or reply key.
pub fn open_face_reply(
    party: PartyIndex,
    party_key: &PartyPublicKey,
    reply_secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    sealed: &[u8],
) -> Result<FaceReply, FaceError> {
    let b = evaluator(party)? as u8;
    let refused = |why: &'static str| FaceError::SealedOutput { party: b, why };
    if sealed.len() < HEADER_LEN || &sealed[..4] != REPLY_MAGIC || sealed[4] != REPLY_VERSION {
        return Err(refused("it is not a sealed face output"));
    }
    if sealed[5] != b {
        return Err(refused("it was sealed by another party"));
    }
    let (header, ciphertext) = sealed.split_at(HEADER_LEN);
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&header[6..]);
    let mut shared = x25519(reply_secret, party_key);
    let cipher = reply_cipher(
        &shared,
        session,
        party,
        party_key,
        &reply_secret.public_key(),
    );
    shared.zeroize();
    let plain = cipher
        .decrypt(
            &nonce.into(),
            Payload {
                msg: ciphertext,
                aad: &aad(header, session),
            },
        )
        .map_err(|_| {
            refused("it does not open: altered in transit, or not sealed by this party for this session and reply key")
        })?;
    let malformed = || refused("it opened but is malformed");
    if plain.len() < 68 {
        return Err(malformed());
    }
    let count = u32::from_le_bytes([plain[0], plain[1], plain[2], plain[3]]) as usize;
    let body = &plain[68..];
    if body.len() != count.checked_mul(4).ok_or_else(malformed)? {
        return Err(malformed());
    }
    let mut list_digest = [0u8; 32];
    list_digest.copy_from_slice(&plain[4..36]);
    let mut subjects = [0u8; 32];
    subjects.copy_from_slice(&plain[36..68]);
    Ok(FaceReply {
        party,
        list_digest,
        subjects_digest: subjects,
        shares: body
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
    })
}

/// Client side: opens both evaluators' sealed outputs of `session` (`sealed[b]` from P_b,
/// whose pinned keys are `party_keys[b]`), checks that they evaluated the same list, for the
/// `subjects` the client was told in comparison order, and adds the shares: one bit per
/// comparison (Funshade's `res`). Errors name the party whose output is refused.
pub fn open_face_result(
    party_keys: [&PartyPublicKey; 2],
    reply_secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    sealed: [&[u8]; 2],
    subjects: &[&str],
) -> Result<Vec<bool>, FaceError> {
    let r0 = open_face_reply(
        PartyIndex::ALL[0],
        party_keys[0],
        reply_secret,
        session,
        sealed[0],
    )?;
    let r1 = open_face_reply(
        PartyIndex::ALL[1],
        party_keys[1],
        reply_secret,
        session,
        sealed[1],
    )?;
    let expected = subjects_digest(subjects.iter().copied());
    for r in [&r0, &r1] {
        let b = r.party.as_u8();
        if r.shares.len() != subjects.len() || r.subjects_digest != expected {
            return Err(FaceError::SealedOutput {
                party: b,
                why: "it was computed for other subjects than the coordinator relayed",
            });
        }
    }
    if r0.list_digest != r1.list_digest {
        return Err(FaceError::SealedOutput {
            party: 1,
            why: "P0 and P1 evaluated different template lists",
        });
    }
    reconstruct(&r0.shares, &r1.shares)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::face::encoding::test_support::seeded_keys;

    fn sealers(
        secrets: &[PartySecretKey],
        reply: &PartyPublicKey,
        session: &[u8; 16],
    ) -> [ReplySealer; 2] {
        std::array::from_fn(|b| {
            ReplySealer::new(PartyIndex::ALL[b], &secrets[b], reply, session).unwrap()
        })
    }

    #[test]
    fn sealed_outputs_open_for_the_client_only_and_add_up() {
        let (mut rng, secrets, publics) = seeded_keys(7);
        let client = PartySecretKey::generate(&mut rng);
        let session = [3u8; 16];
        let subjects = ["alice", "bob", "carol"];
        let digest = subjects_digest(subjects);
        let list = [9u8; 32];
        // o_0 + o_1 = 1, 0, 1.
        let o0 = [5u32, 77, u32::MAX];
        let o1 = [u32::MAX - 3, 77u32.wrapping_neg(), 2];
        let [s0, s1] = sealers(&secrets, &client.public_key(), &session);
        let m0 = s0.seal(&list, &digest, &o0, &mut rng);
        let m1 = s1.seal(&list, &digest, &o1, &mut rng);
        assert_eq!(m0.len(), sealed_output_len(3));
        // Ciphertext: the shares are not in it.
        assert!(!m0.windows(4).any(|w| w == 77u32.to_le_bytes()));
        let keys = [&publics[0], &publics[1]];
        let bits = open_face_result(keys, &client, &session, [&m0, &m1], &subjects).unwrap();
        assert_eq!(bits, vec![true, false, true]);
        let reply = open_face_reply(PartyIndex::ALL[1], &publics[1], &client, &session, &m1);
        assert_eq!(reply.unwrap().shares, o1.to_vec());

        // Altered anywhere (header, nonce, ciphertext, tag): refused, naming the party.
        for at in [0, 5, 7, HEADER_LEN + 1, m1.len() - 1] {
            let mut bad = m1.clone();
            bad[at] ^= 1;
            let err =
                open_face_result(keys, &client, &session, [&m0, &bad], &subjects).unwrap_err();
            assert!(
                matches!(err, FaceError::SealedOutput { party: 1, .. }),
                "{at}: {err}"
            );
            assert!(err.to_string().contains("P1"), "{err}");
        }
        // Truncated, swapped between the parties, or empty: refused.
        assert!(open_face_result(keys, &client, &session, [&m0, &m1[..40]], &subjects).is_err());
        assert!(matches!(
            open_face_result(keys, &client, &session, [&m1, &m0], &subjects),
            Err(FaceError::SealedOutput { party: 0, .. })
        ));
        assert!(open_face_result(keys, &client, &session, [&[], &m1], &subjects).is_err());
        // Another session, another reply key, another party key: refused.
        assert!(open_face_result(keys, &client, &[4u8; 16], [&m0, &m1], &subjects).is_err());
        let other = PartySecretKey::generate(&mut rng);
        assert!(open_face_result(keys, &other, &session, [&m0, &m1], &subjects).is_err());
        let swapped = [&publics[1], &publics[0]];
        assert!(open_face_result(swapped, &client, &session, [&m0, &m1], &subjects).is_err());
        // Other subjects, or reordered ones, than the parties compared: refused.
        let reordered = ["bob", "alice", "carol"];
        assert!(matches!(
            open_face_result(keys, &client, &session, [&m0, &m1], &reordered),
            Err(FaceError::SealedOutput { party: 0, .. })
        ));
        assert!(open_face_result(keys, &client, &session, [&m0, &m1], &subjects[..2]).is_err());
        // The parties evaluated different lists: refused.
        let m1_other = s1.seal(&[8u8; 32], &digest, &o1, &mut rng);
        assert!(open_face_result(keys, &client, &session, [&m0, &m1_other], &subjects).is_err());
    }

    #[test]
    fn a_forger_without_the_party_secret_cannot_make_an_output_that_opens() {
        let (mut rng, secrets, publics) = seeded_keys(8);
        let client = PartySecretKey::generate(&mut rng);
        let session = [1u8; 16];
        let subjects = ["alice"];
        let digest = subjects_digest(subjects);
        // The coordinator knows every public key but no secret: sealing with its own key in
        // P1's place does not open as P1's.
        let coordinator = PartySecretKey::generate(&mut rng);
        let forged = ReplySealer::new(
            PartyIndex::ALL[1],
            &coordinator,
            &client.public_key(),
            &session,
        )
        .unwrap()
        .seal(&[0; 32], &digest, &[1], &mut rng);
        let genuine = ReplySealer::new(
            PartyIndex::ALL[0],
            &secrets[0],
            &client.public_key(),
            &session,
        )
        .unwrap()
        .seal(&[0; 32], &digest, &[0], &mut rng);
        let keys = [&publics[0], &publics[1]];
        assert!(matches!(
            open_face_result(keys, &client, &session, [&genuine, &forged], &subjects),
            Err(FaceError::SealedOutput { party: 1, .. })
        ));
        // The front door: the reply key is the called party's own static key (P2 here).
        let sealed = std::array::from_fn::<_, 2, _>(|b| {
            ReplySealer::new(PartyIndex::ALL[b], &secrets[b], &publics[2], &session)
                .unwrap()
                .seal(&[0; 32], &digest, &[b as u32], &mut rng)
        });
        let bits = open_face_result(
            keys,
            &secrets[2],
            &session,
            [&sealed[0], &sealed[1]],
            &subjects,
        )
        .unwrap();
        assert_eq!(bits, vec![true]);
        // P2 is no evaluator: it cannot seal an output.
        assert!(ReplySealer::new(PartyIndex::ALL[2], &secrets[2], &publics[2], &session).is_err());
    }
}
