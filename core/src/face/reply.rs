//! Sealed output shares: each evaluator's output of a face session (the round-3 shares o_b of
//! Funshade's `res` step, Ibarrondo, Chabanne, Önen, "Funshade", PETS 2023, ePrint 2022/1688,
//! Alg. 1) sealed to the client that asked, so that the coordinator relays ciphertext only and
//! learns no comparison bit (docs/protocols/face.md §13).
//!
//! The client puts a **reply key** (an X25519 public key R whose secret r only it holds) into
//! its sealed probe ([`crate::face::probe`], since version 2; version 4 today), so the
//! coordinator can neither read nor swap it. Evaluator P_b, with static key pair (s_b, S_b),
//! seals its output under
//!
//! ```text
//! k_b = HKDF-SHA256(ikm = X25519(s_b, R), salt = none,
//!                   info = LABEL ‖ session (16) ‖ b (1) ‖ S_b (32) ‖ R (32))
//! ```
//!
//! with XChaCha20-Poly1305 (random 24-byte nonce; the key derivation and the AEAD are
//! [`crate::crypto::reply`]'s, shared with the iris outputs). The client computes the same key as
//! X25519(r, S_b) with S_b from its own pinned configuration, never from the coordinator.
//! Only P_b and the holder of r can compute k_b, so the coordinator can neither read, alter nor
//! forge a sealed output, and a reply that opens is authenticated as P_b's for this session.
//! (For the SQL front door the reply key is the called party's own static key, so that party
//! opens the replies with its key file.)
//!
//! Layout (little-endian):
//!
//! ```text
//! "PMFR" | version 2 | party (1) | nonce (24) | AEAD(k_b, nonce, aad = header ‖ session,
//!     plaintext = comparisons (u32) | list digest (32) | subjects digest (32) | o_b (4·N)
//!                 | listed (u8) | if listed: per subject, length (u16) ‖ UTF-8)
//! ```
//!
//! The list digest is the digest of the compared template list the party evaluated (both
//! evaluators must agree); the subjects digest ([`subjects_digest`]) binds the shares to the
//! subjects in comparison order. Since version 2 (extension 0.12.0) no subject travels beside
//! the sealed outputs: a 1:N identification **lists** the compared subjects inside the sealed
//! plaintext (the client learns them only from what it opens, and checks that P0 and P1 list
//! the same ones), and a 1:1 verification lists none — the client checks the digest against
//! the subject it claimed, which the evaluators read from the sealed probe, so a verification's
//! output has one length whatever the subject (docs/protocols/face.md §14). Version 1
//! (subjects relayed in the clear by the coordinator) is refused.
//!
//! An identification whose probe carries the digest of a compared-subject list the client
//! already knows ([`crate::face::probe::seal_face_probe_knowing`], from an earlier
//! identification's outputs) is answered without the listing (flag 0) when the list compared
//! now has that digest: the client reads the subjects from its own copy
//! ([`open_face_identification`], [`KnownSubjects`]), bound to the shares by the subjects
//! digest each evaluator seals. When the list changed, the evaluators list it again.

use rand_core::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

use super::encoding::evaluator;
use super::funshade::reconstruct;
use super::FaceError;
use crate::crypto::reply::{self, ReplyError, ReplyFormat, ReplyOpener};
use crate::crypto::seal::{PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;
use crate::wire::session::SESSION_ID_LEN;

/// Length of a reply key (an X25519 public key).
pub const REPLY_KEY_LEN: usize = reply::REPLY_KEY_LEN;

/// The face sealed-output format ([`crate::crypto::reply`], which derives the key and seals):
/// magic `PMFR`, version 2 (module docs), the HKDF label of 0.11.0.
const FORMAT: ReplyFormat = ReplyFormat {
    magic: b"PMFR",
    version: 2,
    label: b"privmatch face sealed output v1",
};
#[cfg(test)]
const HEADER_LEN: usize = reply::HEADER_LEN;

/// Length of a sealed output of `comparisons` comparisons that lists no subject (a
/// verification): it depends on the count only (header, nonce, count, two digests, 4 bytes
/// per comparison, the listing flag, AEAD tag). An identification's is longer by its listing.
pub const fn sealed_output_len(comparisons: usize) -> usize {
    FORMAT.sealed_len(4 + 32 + 32 + 4 * comparisons + 1)
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
    /// The compared subjects in comparison order, listed inside the sealed output by an
    /// identification; `None` for a verification (the client knows its claimed subject).
    pub subjects: Option<Vec<String>>,
}

/// What the client opened from P0's and P1's sealed outputs: one bit per compared subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaceResult {
    /// The compared subjects, in comparison order (a verification: the claimed subject).
    pub subjects: Vec<String>,
    /// One bit per subject: whether the probe matches its template.
    pub bits: Vec<bool>,
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

/// The sealing of one evaluator's output to one reply key in one session, with its key
/// derived once (at the session's open, when the party's secret is at hand).
pub struct ReplySealer {
    inner: reply::ReplySealer,
}

impl std::fmt::Debug for ReplySealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplySealer({}, <redacted>)", self.inner.party())
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
        Ok(ReplySealer {
            inner: reply::ReplySealer::new(FORMAT, me, secret, reply_key, session),
        })
    }

    /// Seals the output `shares` of the compared list (`list_digest`, `subjects_digest`),
    /// listing the compared subjects inside (`listed`: an identification's, in comparison
    /// order; `None` for a verification).
    pub fn seal<R: RngCore + CryptoRng>(
        &self,
        list_digest: &[u8; 32],
        subjects_digest: &[u8; 32],
        shares: &[u32],
        listed: Option<&[&str]>,
        rng: &mut R,
    ) -> Vec<u8> {
        let mut plain = Vec::with_capacity(69 + 4 * shares.len());
        plain.extend_from_slice(&(shares.len() as u32).to_le_bytes());
        plain.extend_from_slice(list_digest);
        plain.extend_from_slice(subjects_digest);
        for w in shares {
            plain.extend_from_slice(&w.to_le_bytes());
        }
        put_listed(&mut plain, listed);
        let sealed = self.inner.seal(&plain, rng);
        plain.zeroize();
        sealed
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
    evaluator(party)?;
    open_with(
        &ReplyOpener::new(FORMAT, party, party_key, reply_secret, session),
        sealed,
    )
}

/// [`open_face_reply`] with the key derived already.
fn open_with(opener: &ReplyOpener, sealed: &[u8]) -> Result<FaceReply, FaceError> {
    let party = opener.party();
    let b = party.as_u8();
    let refused = |why: &'static str| FaceError::SealedOutput { party: b, why };
    let plain = opener.open(sealed).map_err(|e| match e {
        ReplyError::NotThisKind => refused("it is not a sealed face output"),
        other => refused(other.why()),
    })?;
    let malformed = || refused("it opened but is malformed");
    if plain.len() < 68 {
        return Err(malformed());
    }
    let count = u32::from_le_bytes([plain[0], plain[1], plain[2], plain[3]]) as usize;
    let end = count
        .checked_mul(4)
        .and_then(|n| n.checked_add(68))
        .ok_or_else(malformed)?;
    let body = plain.get(68..end).ok_or_else(malformed)?;
    let subjects = take_listed(&plain[end..], count).ok_or_else(malformed)?;
    let mut list_digest = [0u8; 32];
    list_digest.copy_from_slice(&plain[4..36]);
    let mut subjects_digest = [0u8; 32];
    subjects_digest.copy_from_slice(&plain[36..68]);
    Ok(FaceReply {
        party,
        list_digest,
        subjects_digest,
        shares: body
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
        subjects,
    })
}

/// Appends the listing of the compared subjects: a flag, then each as length (u16) ‖ UTF-8.
fn put_listed(plain: &mut Vec<u8>, listed: Option<&[&str]>) {
    match listed {
        None => plain.push(0),
        Some(subjects) => {
            plain.push(1);
            for s in subjects {
                // Subject ids are at most 256 bytes (`validate_subject`); longer ones are cut
                // at the u16 limit, which the client's digest check then refuses.
                let bytes = &s.as_bytes()[..s.len().min(usize::from(u16::MAX))];
                plain.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
                plain.extend_from_slice(bytes);
            }
        }
    }
}

/// Parses the listing after the shares: `count` subjects, or none (`Some(None)`); `None` when
/// malformed.
fn take_listed(rest: &[u8], count: usize) -> Option<Option<Vec<String>>> {
    let (&flag, mut rest) = rest.split_first()?;
    match flag {
        0 if rest.is_empty() => Some(None),
        1 => {
            let mut subjects = Vec::with_capacity(count.min(rest.len() / 2));
            for _ in 0..count {
                let len = usize::from(u16::from_le_bytes([*rest.first()?, *rest.get(1)?]));
                let text = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
                subjects.push(text.to_owned());
                rest = &rest[2 + len..];
            }
            rest.is_empty().then_some(Some(subjects))
        }
        _ => None,
    }
}

/// The compared-subject list of an earlier identification, as a client keeps it (module
/// docs): what it seals the digest of into its next identification probe
/// ([`crate::face::probe::seal_face_probe_knowing`]) so the evaluators need not list it again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownSubjects {
    /// The subjects in comparison order, as both evaluators listed them.
    pub subjects: Vec<String>,
    /// Their [`subjects_digest`]; `None` before the first identification.
    pub digest: Option<[u8; 32]>,
}

/// Client side: opens both evaluators' sealed outputs of `session` (`sealed[b]` from P_b,
/// whose pinned keys are `party_keys[b]`), checks that they evaluated the same list and
/// compared the same subjects — for a verification (`claimed`: the subject the client sealed
/// in its probe) that subject, for an identification (`None`) the subjects both list inside
/// their outputs — and adds the shares: one bit per comparison (Funshade's `res`). Errors name
/// the party whose output is refused; an output computed for another subject than `claimed`
/// (a probe sealed for another subject) is [`FaceError::WrongTarget`].
pub fn open_face_result(
    party_keys: [&PartyPublicKey; 2],
    reply_secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    sealed: [&[u8]; 2],
    claimed: Option<&str>,
) -> Result<FaceResult, FaceError> {
    FaceOpeners::new(party_keys, reply_secret, session).result(sealed, claimed)
}

/// Client side, an identification whose probe carried `known`'s digest
/// ([`crate::face::probe::seal_face_probe_knowing`]): opens and checks both sealed outputs as
/// [`open_face_result`] does and answers one bit per subject of `known.subjects`, which it
/// replaces by the list the evaluators sealed when they listed one (the compared list changed,
/// or the client knew none). An output that lists nothing is accepted only when its
/// subjects digest is `known`'s.
pub fn open_face_identification(
    party_keys: [&PartyPublicKey; 2],
    reply_secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    sealed: [&[u8]; 2],
    known: &mut KnownSubjects,
) -> Result<Vec<bool>, FaceError> {
    FaceOpeners::new(party_keys, reply_secret, session).identification(sealed, known)
}

/// Client side: the openers of P0's and P1's sealed outputs of one session, with their keys
/// derived once ([`ReplyOpener`]).
#[derive(Debug)]
pub struct FaceOpeners([ReplyOpener; 2]);

impl FaceOpeners {
    /// The openers of `session`'s outputs of P0 and P1 (pinned keys `party_keys`) to the reply
    /// key whose secret is `reply_secret`.
    pub fn new(
        party_keys: [&PartyPublicKey; 2],
        reply_secret: &PartySecretKey,
        session: &[u8; SESSION_ID_LEN],
    ) -> Self {
        FaceOpeners(std::array::from_fn(|b| {
            ReplyOpener::new(
                FORMAT,
                PartyIndex::ALL[b],
                party_keys[b],
                reply_secret,
                session,
            )
        }))
    }

    /// [`open_face_result`] with these openers.
    pub fn result(
        &self,
        sealed: [&[u8]; 2],
        claimed: Option<&str>,
    ) -> Result<FaceResult, FaceError> {
        let [r0, r1] = self.open_both(sealed)?;
        let Some(subject) = claimed else {
            let mut known = KnownSubjects::default();
            let bits = identification_bits(r0, r1, &mut known)?;
            return Ok(FaceResult {
                subjects: known.subjects,
                bits,
            });
        };
        let expected = subjects_digest([subject]);
        for r in [&r0, &r1] {
            let b = r.party.as_u8();
            if r.subjects.is_some() || r.shares.len() != 1 {
                return Err(refused(b, "it is not the output of a verification"));
            }
            if r.subjects_digest != expected {
                return Err(FaceError::WrongTarget);
            }
        }
        let bits = reconstruct(&r0.shares, &r1.shares)?;
        Ok(FaceResult {
            subjects: vec![subject.to_owned()],
            bits,
        })
    }

    /// [`open_face_identification`] with these openers.
    pub fn identification(
        &self,
        sealed: [&[u8]; 2],
        known: &mut KnownSubjects,
    ) -> Result<Vec<bool>, FaceError> {
        let [r0, r1] = self.open_both(sealed)?;
        identification_bits(r0, r1, known)
    }

    /// Opens P0's and P1's sealed outputs and checks that they evaluated the same list.
    fn open_both(&self, sealed: [&[u8]; 2]) -> Result<[FaceReply; 2], FaceError> {
        let (r0, r1) = (
            open_with(&self.0[0], sealed[0])?,
            open_with(&self.0[1], sealed[1])?,
        );
        if r0.list_digest != r1.list_digest {
            return Err(refused(1, "P0 and P1 evaluated different template lists"));
        }
        Ok([r0, r1])
    }
}

fn refused(b: u8, why: &'static str) -> FaceError {
    FaceError::SealedOutput { party: b, why }
}

/// An identification's bits from P0's and P1's opened outputs: each lists the compared
/// subjects (checked against its digest; `known` becomes that list) or lists none (its digest
/// must then be `known`'s); both must name the same subjects.
fn identification_bits(
    r0: FaceReply,
    r1: FaceReply,
    known: &mut KnownSubjects,
) -> Result<Vec<bool>, FaceError> {
    for r in [&r0, &r1] {
        let b = r.party.as_u8();
        match &r.subjects {
            Some(listed) => {
                if listed.len() != r.shares.len()
                    || subjects_digest(listed.iter().map(String::as_str)) != r.subjects_digest
                {
                    return Err(refused(b, "its listed subjects do not fit its digest"));
                }
            }
            None if known.digest == Some(r.subjects_digest)
                && known.subjects.len() == r.shares.len() => {}
            None if known.digest.is_some() => {
                return Err(refused(
                    b,
                    "it lists no compared subjects and its digest is not that of the list this client knows",
                ))
            }
            None => {
                return Err(refused(
                    b,
                    "it lists no compared subjects (not an identification)",
                ))
            }
        }
    }
    if r0.subjects_digest != r1.subjects_digest {
        return Err(refused(1, "P0 and P1 compared different subjects"));
    }
    let bits = reconstruct(&r0.shares, &r1.shares)?;
    if let Some(listed) = r0.subjects.or(r1.subjects) {
        known.subjects = listed;
        known.digest = Some(r0.subjects_digest);
    }
    Ok(bits)
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
    fn an_identification_against_a_known_list_carries_only_its_digest() {
        let (mut rng, secrets, publics) = seeded_keys(8);
        let client = PartySecretKey::generate(&mut rng);
        let session = [6u8; 16];
        let subjects = ["alice", "bob"];
        let digest = subjects_digest(subjects);
        let list = [4u8; 32];
        let (o0, o1) = ([1u32, 9], [0u32, 9u32.wrapping_neg()]);
        let [s0, s1] = sealers(&secrets, &client.public_key(), &session);
        let keys = [&publics[0], &publics[1]];
        // First identification: listed; the client keeps the list and its digest.
        let mut known = KnownSubjects::default();
        let m0 = s0.seal(&list, &digest, &o0, Some(&subjects), &mut rng);
        let m1 = s1.seal(&list, &digest, &o1, Some(&subjects), &mut rng);
        let bits = open_face_identification(keys, &client, &session, [&m0, &m1], &mut known);
        assert_eq!(bits.unwrap(), vec![true, false]);
        assert_eq!(known.subjects, ["alice", "bob"]);
        assert_eq!(known.digest, Some(digest));
        // Next: unlisted, shorter by the listing; the bits map onto the known list.
        let u0 = s0.seal(&list, &digest, &o1, None, &mut rng);
        let u1 = s1.seal(&list, &digest, &o0, None, &mut rng);
        assert_eq!(u0.len(), sealed_output_len(2));
        let bits = open_face_identification(keys, &client, &session, [&u0, &u1], &mut known);
        assert_eq!(bits.unwrap(), vec![true, false]);
        // Unlisted under another digest than the known one, or without a known list:
        // refused, naming the party; nothing learnt.
        let other = subjects_digest(["alice", "mallory"]);
        let w1 = s1.seal(&list, &other, &o1, None, &mut rng);
        let err =
            open_face_identification(keys, &client, &session, [&u0, &w1], &mut known).unwrap_err();
        assert!(
            matches!(err, FaceError::SealedOutput { party: 1, .. }),
            "{err}"
        );
        assert_eq!(known.digest, Some(digest));
        assert!(open_face_result(keys, &client, &session, [&u0, &u1], None).is_err());
        // One lists, the other does not, for the same digest: accepted (both bound to it).
        let v1 = s1.seal(&list, &digest, &o1, None, &mut rng);
        let bits = open_face_identification(keys, &client, &session, [&m0, &v1], &mut known);
        assert_eq!(bits.unwrap(), vec![true, false]);
        // The list changed: listed again, and the client's copy replaced.
        let now = ["alice", "bob", "carol"];
        let d = subjects_digest(now);
        let n0 = s0.seal(&list, &d, &[1, 0, 0], Some(&now), &mut rng);
        let n1 = s1.seal(&list, &d, &[0, 0, 1], Some(&now), &mut rng);
        let bits = open_face_identification(keys, &client, &session, [&n0, &n1], &mut known);
        assert_eq!(bits.unwrap(), vec![true, false, true]);
        assert_eq!((known.subjects.len(), known.digest), (3, Some(d)));
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
        let m0 = s0.seal(&list, &digest, &o0, Some(&subjects), &mut rng);
        let m1 = s1.seal(&list, &digest, &o1, Some(&subjects), &mut rng);
        assert_eq!(
            m0.len(),
            sealed_output_len(3) + subjects.iter().map(|s| 2 + s.len()).sum::<usize>()
        );
        // Ciphertext: neither the shares nor the subjects are in it.
        assert!(!m0.windows(4).any(|w| w == 77u32.to_le_bytes()));
        assert!(!m0.windows(5).any(|w| w == b"alice"));
        let keys = [&publics[0], &publics[1]];
        let result = open_face_result(keys, &client, &session, [&m0, &m1], None).unwrap();
        assert_eq!(result.bits, vec![true, false, true]);
        assert_eq!(result.subjects, ["alice", "bob", "carol"]);
        let reply = open_face_reply(PartyIndex::ALL[1], &publics[1], &client, &session, &m1);
        assert_eq!(reply.unwrap().shares, o1.to_vec());

        // Altered anywhere (header, nonce, ciphertext, tag): refused, naming the party.
        for at in [0, 5, 7, HEADER_LEN + 1, m1.len() - 1] {
            let mut bad = m1.clone();
            bad[at] ^= 1;
            let err = open_face_result(keys, &client, &session, [&m0, &bad], None).unwrap_err();
            assert!(
                matches!(err, FaceError::SealedOutput { party: 1, .. }),
                "{at}: {err}"
            );
            assert!(err.to_string().contains("P1"), "{err}");
        }
        // Truncated, swapped between the parties, or empty: refused.
        assert!(open_face_result(keys, &client, &session, [&m0, &m1[..40]], None).is_err());
        assert!(matches!(
            open_face_result(keys, &client, &session, [&m1, &m0], None),
            Err(FaceError::SealedOutput { party: 0, .. })
        ));
        assert!(open_face_result(keys, &client, &session, [&[], &m1], None).is_err());
        // Another session, another reply key, another party key: refused.
        assert!(open_face_result(keys, &client, &[4u8; 16], [&m0, &m1], None).is_err());
        let other = PartySecretKey::generate(&mut rng);
        assert!(open_face_result(keys, &other, &session, [&m0, &m1], None).is_err());
        let swapped = [&publics[1], &publics[0]];
        assert!(open_face_result(swapped, &client, &session, [&m0, &m1], None).is_err());
        // The evaluators listed other subjects, or in another order: refused naming P1.
        let reordered = ["bob", "alice", "carol"];
        let m1_reordered = s1.seal(
            &list,
            &subjects_digest(reordered),
            &o1,
            Some(&reordered),
            &mut rng,
        );
        assert!(matches!(
            open_face_result(keys, &client, &session, [&m0, &m1_reordered], None),
            Err(FaceError::SealedOutput { party: 1, .. })
        ));
        // A listing that does not fit the digest sealed with it: refused.
        let m1_bad = s1.seal(&list, &digest, &o1, Some(&reordered), &mut rng);
        assert!(open_face_result(keys, &client, &session, [&m0, &m1_bad], None).is_err());
        // An identification's outputs are not a verification's, nor the other way round.
        assert!(open_face_result(keys, &client, &session, [&m0, &m1], Some("alice")).is_err());
        // The parties evaluated different lists: refused.
        let m1_other = s1.seal(&[8u8; 32], &digest, &o1, Some(&subjects), &mut rng);
        assert!(open_face_result(keys, &client, &session, [&m0, &m1_other], None).is_err());
    }

    #[test]
    fn verification_outputs_name_no_subject_and_check_the_claimed_one() {
        let (mut rng, secrets, publics) = seeded_keys(9);
        let client = PartySecretKey::generate(&mut rng);
        let session = [2u8; 16];
        let digest = subjects_digest(["alice"]);
        let [s0, s1] = sealers(&secrets, &client.public_key(), &session);
        let m0 = s0.seal(&[1; 32], &digest, &[3], None, &mut rng);
        let m1 = s1.seal(&[1; 32], &digest, &[u32::MAX - 1], None, &mut rng);
        // One length whatever the subject.
        assert_eq!(m0.len(), sealed_output_len(1));
        let keys = [&publics[0], &publics[1]];
        let result = open_face_result(keys, &client, &session, [&m0, &m1], Some("alice")).unwrap();
        assert_eq!(
            (result.subjects, result.bits),
            (vec!["alice".into()], vec![true])
        );
        // The client claimed another subject than the probe was sealed for: WrongTarget.
        assert_eq!(
            open_face_result(keys, &client, &session, [&m0, &m1], Some("bob")),
            Err(FaceError::WrongTarget)
        );
        // A verification's outputs are no identification's.
        assert!(open_face_result(keys, &client, &session, [&m0, &m1], None).is_err());
    }

    #[test]
    fn a_forger_without_the_party_secret_cannot_make_an_output_that_opens() {
        let (mut rng, secrets, publics) = seeded_keys(8);
        let client = PartySecretKey::generate(&mut rng);
        let session = [1u8; 16];
        let digest = subjects_digest(["alice"]);
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
        .seal(&[0; 32], &digest, &[1], None, &mut rng);
        let genuine = ReplySealer::new(
            PartyIndex::ALL[0],
            &secrets[0],
            &client.public_key(),
            &session,
        )
        .unwrap()
        .seal(&[0; 32], &digest, &[0], None, &mut rng);
        let keys = [&publics[0], &publics[1]];
        assert!(matches!(
            open_face_result(keys, &client, &session, [&genuine, &forged], Some("alice")),
            Err(FaceError::SealedOutput { party: 1, .. })
        ));
        // The front door: the reply key is the called party's own static key (P2 here).
        let sealed = std::array::from_fn::<_, 2, _>(|b| {
            ReplySealer::new(PartyIndex::ALL[b], &secrets[b], &publics[2], &session)
                .unwrap()
                .seal(&[0; 32], &digest, &[b as u32], None, &mut rng)
        });
        let result = open_face_result(
            keys,
            &secrets[2],
            &session,
            [&sealed[0], &sealed[1]],
            Some("alice"),
        )
        .unwrap();
        assert_eq!(result.bits, vec![true]);
        // P2 is no evaluator: it cannot seal an output.
        assert!(ReplySealer::new(PartyIndex::ALL[2], &secrets[2], &publics[2], &session).is_err());
    }
}
