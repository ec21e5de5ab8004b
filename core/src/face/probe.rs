//! Face probes: one evaluator's share of a live embedding, sealed to P0 or P1 for one session
//! (purpose [`FACE_PROBE_PURPOSE`]) together with what it is for, and the id the P0–P1 channel
//! of a session runs under.
//!
//! Layout (version 4): `PMFP`, version 4, party, session id (16), reply key (32), kind (1 =
//! 1:1 verification, 2 = 1:N identification), subject length (u16), the subject (UTF-8)
//! zero-padded to [`MAX_SUBJECT_LEN`] bytes (empty for an identification), the known-subjects
//! flag (1) and digest (32, zero when the flag is 0), then the [`EmbeddingShare`]. Version 3
//! (extension 0.12.0 before the known-subjects digest) is the same without flag and digest
//! and is still opened, as knowing no list. The verified subject travels **inside** the sealed plaintext
//! and every probe of a dimension has the same length, so the coordinator that relays a
//! verification learns neither the subject nor its length (docs/protocols/face.md §14); the
//! evaluators read it after opening and look the template up themselves. The kind is sealed
//! with the probe, so a probe given for a verification cannot be run as an identification
//! (which would reveal who the person is). The reply key (an X25519 public key whose secret
//! only the requesting client holds) is where the evaluators seal their outputs
//! ([`crate::face::reply`]); inside the sealed plaintext, the coordinator cannot swap it.
//! Versions 1 (no reply key) and 2 (the subject beside the probe, in the clear at the
//! coordinator) are refused ([`FaceError::UnsupportedProbeVersion`]).
//!
//! The **known-subjects digest** is an identification's: the [`crate::face::reply::subjects_digest`]
//! of the compared-subject list the client opened from an earlier identification. When the
//! list compared now has that digest, the evaluators seal only the digest, not the list, into
//! their outputs ([`crate::face::reply`]): an identification over N templates then carries
//! 4·N bytes of shares to the client instead of shares and N subject names, while the client
//! still learns the subjects only from the parties (its list was theirs, and the digest it
//! opens binds the shares to it). It is sealed with the probe, so the coordinator can neither
//! read nor set it.

use rand_core::{CryptoRng, RngCore};

use super::encoding::{evaluator, share_embedding, EmbeddingShare, Reader};
use super::quantize::check_dim;
use super::FaceError;
use crate::crypto::seal::{open_sealed_box, seal_to_party, PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;
use crate::wire::envelope::{validate_subject, MAX_SUBJECT_LEN};
use crate::wire::session::SESSION_ID_LEN;

/// Sealing purpose of face search probes.
pub const FACE_PROBE_PURPOSE: &str = "face-probe";

const PROBE_MAGIC: &[u8; 4] = b"PMFP";
/// Probe layout version: 4 carries the reply key, the verified subject (padded) and the
/// known-subjects digest.
const PROBE_VERSION: u8 = 4;
/// The previous layout (no known-subjects digest), still opened.
const PROBE_VERSION_3: u8 = 3;
const KIND_VERIFY: u8 = 1;
const KIND_IDENTIFY: u8 = 2;

/// What an evaluator opens from its sealed probe.
#[derive(Debug, PartialEq, Eq)]
pub struct OpenedProbe {
    /// This evaluator's share of the probe.
    pub share: EmbeddingShare,
    /// The key the evaluator seals its output to ([`crate::face::reply`]).
    pub reply_key: PartyPublicKey,
    /// The verified subject of a 1:1 verification; `None` for a 1:N identification.
    pub target: Option<String>,
    /// The digest of the compared-subject list the client knows already (an
    /// identification's; `None` when it knows none): the outputs need not list it again.
    pub known_subjects: Option<[u8; 32]>,
}

/// Client side: shares a quantised probe and seals the two shares to P0 and P1 for search
/// session `session` (so a coordinator cannot replay it into another session) and its
/// target: `Some(subject)` for a 1:1 verification (the subject is sealed inside, padded, and
/// sent nowhere else), `None` for a 1:N identification. The evaluators seal their outputs to
/// `reply_key` (a fresh key of the client per request, or the static key of the party whose
/// SQL front door will be called).
pub fn seal_face_probe<R: RngCore + CryptoRng>(
    embedding: &[i32],
    session: [u8; SESSION_ID_LEN],
    target: Option<&str>,
    reply_key: &PartyPublicKey,
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<[Vec<u8>; 2], FaceError> {
    seal_face_probe_knowing(embedding, session, target, None, reply_key, party_keys, rng)
}

/// [`seal_face_probe`] for a client that knows the compared-subject list of an earlier
/// identification: `known_subjects` is its [`crate::face::reply::subjects_digest`] (module
/// docs). Ignored by the evaluators for a verification.
pub fn seal_face_probe_knowing<R: RngCore + CryptoRng>(
    embedding: &[i32],
    session: [u8; SESSION_ID_LEN],
    target: Option<&str>,
    known_subjects: Option<&[u8; 32]>,
    reply_key: &PartyPublicKey,
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<[Vec<u8>; 2], FaceError> {
    check_dim(embedding.len())?;
    if let Some(subject) = target {
        validate_subject(subject)?;
    }
    let kind = if target.is_some() {
        KIND_VERIFY
    } else {
        KIND_IDENTIFY
    };
    let subject = target.unwrap_or_default().as_bytes();
    let mut padded = [0u8; MAX_SUBJECT_LEN];
    padded[..subject.len()].copy_from_slice(subject);
    let shares = share_embedding(embedding, rng);
    Ok(std::array::from_fn(|p| {
        let mut plain = Vec::with_capacity(93 + MAX_SUBJECT_LEN + shares[p].encoded_len());
        plain.extend_from_slice(PROBE_MAGIC);
        plain.push(PROBE_VERSION);
        plain.push(p as u8);
        plain.extend_from_slice(&session);
        plain.extend_from_slice(reply_key.as_bytes());
        plain.push(kind);
        plain.extend_from_slice(&(subject.len() as u16).to_le_bytes());
        plain.extend_from_slice(&padded);
        plain.push(u8::from(known_subjects.is_some()));
        plain.extend_from_slice(known_subjects.unwrap_or(&[0u8; 32]));
        shares[p].encode_into(&mut plain);
        seal_to_party(
            PartyIndex::ALL[p],
            &party_keys[p],
            FACE_PROBE_PURPOSE,
            &plain,
            rng,
        )
    }))
}

/// Party side: opens a sealed probe as evaluator `me` for session `session`; returns its
/// share, the reply key and the target sealed with it (the verified subject, or `None` for an
/// identification). Probes of format version 1 or 2 are refused
/// ([`FaceError::UnsupportedProbeVersion`]). This is the one place an evaluator opens a
/// client's sealed probe.
pub fn open_face_probe(
    me: PartyIndex,
    secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    sealed: &[u8],
) -> Result<OpenedProbe, FaceError> {
    let mine = evaluator(me)? as u8;
    let plain = open_sealed_box(me, secret, FACE_PROBE_PURPOSE, sealed)?;
    let mut r = Reader::new(&plain);
    if r.take(4)? != PROBE_MAGIC {
        return Err(FaceError::Malformed("not a face probe"));
    }
    let version = r.u8()?;
    if version != PROBE_VERSION && version != PROBE_VERSION_3 {
        return Err(FaceError::UnsupportedProbeVersion(version));
    }
    let party = r.u8()?;
    if party != mine {
        return Err(FaceError::PartyMismatch {
            inside: party,
            me: mine,
        });
    }
    if &r.array::<SESSION_ID_LEN>()? != session {
        return Err(FaceError::WrongSession);
    }
    let reply_key = PartyPublicKey::from_bytes(r.array()?);
    let kind = r.u8()?;
    let len = usize::from(r.u16()?);
    let padded = r.take(MAX_SUBJECT_LEN)?;
    if len > MAX_SUBJECT_LEN || padded[len..].iter().any(|&b| b != 0) {
        return Err(FaceError::Malformed("face probe subject padding"));
    }
    let target = match kind {
        KIND_VERIFY => {
            let subject = std::str::from_utf8(&padded[..len])
                .map_err(|_| FaceError::Malformed("face probe subject is not UTF-8"))?;
            validate_subject(subject)?;
            Some(subject.to_owned())
        }
        KIND_IDENTIFY if len == 0 => None,
        _ => return Err(FaceError::Malformed("face probe kind")),
    };
    let known_subjects = if version == PROBE_VERSION {
        let flag = r.u8()?;
        let digest = r.array::<32>()?;
        match flag {
            0 if digest == [0u8; 32] => None,
            1 => Some(digest),
            _ => return Err(FaceError::Malformed("face probe known-subjects digest")),
        }
    } else {
        None
    };
    Ok(OpenedProbe {
        share: EmbeddingShare::decode(r.rest())?,
        reply_key,
        target,
        known_subjects,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::seal::PartySecretKey;
    use crate::face::encoding::reconstruct_embedding;
    use crate::face::encoding::test_support::{embedding, seeded_keys};

    #[test]
    fn probes_are_bound_to_their_session_party_and_target() {
        let (mut rng, secrets, publics) = seeded_keys(3);
        let q = embedding(&mut rng, 128);
        let session = [5u8; 16];
        let reply = PartySecretKey::generate(&mut rng).public_key();
        let sealed =
            seal_face_probe(&q, session, Some("alice"), &reply, &publics, &mut rng).unwrap();
        let open = |p: usize, s: &[u8; 16], m: &[u8]| {
            open_face_probe(PartyIndex::ALL[p], &secrets[p], s, m)
        };
        let s0 = open(0, &session, &sealed[0]).unwrap();
        let s1 = open(1, &session, &sealed[1]).unwrap();
        assert_eq!(reconstruct_embedding(&s0.share, &s1.share).0, q);
        // Both evaluators read the client's reply key and the verified subject from inside
        // the sealed probe.
        assert_eq!((s0.reply_key, s1.reply_key), (reply, reply));
        assert_eq!(s0.target.as_deref(), Some("alice"));
        assert_eq!(s1.target.as_deref(), Some("alice"));
        assert_eq!(
            open(0, &[6u8; 16], &sealed[0]),
            Err(FaceError::WrongSession)
        );
        assert!(open(1, &session, &sealed[0]).is_err());
        assert!(seal_face_probe(&q[..100], session, None, &reply, &publics, &mut rng).is_err());
        let identify = seal_face_probe(&q, session, None, &reply, &publics, &mut rng).unwrap();
        assert_eq!(open(0, &session, &identify[0]).unwrap().target, None);
        // The subject is not in the sealed bytes, and neither its length: every probe of a
        // dimension is as long as every other, verification or identification.
        let long = "x".repeat(MAX_SUBJECT_LEN);
        let other = seal_face_probe(&q, session, Some(&long), &reply, &publics, &mut rng).unwrap();
        for p in 0..2 {
            assert_eq!(sealed[p].len(), identify[p].len());
            assert_eq!(sealed[p].len(), other[p].len());
            assert!(!sealed[p].windows(5).any(|w| w == b"alice"));
        }
        assert_eq!(open(1, &session, &other[1]).unwrap().target, Some(long));
        assert!(seal_face_probe(&q, session, Some(""), &reply, &publics, &mut rng).is_err());
    }

    /// A probe plaintext of version `version` for P0 (versions 1 and 2: the layouts of 0.10.0
    /// and 0.11.0), sealed.
    fn old_probe(version: u8, session: [u8; 16], publics: &[PartyPublicKey; 3]) -> Vec<u8> {
        let (mut rng, _, _) = seeded_keys(5);
        let q = embedding(&mut rng, 128);
        let shares = share_embedding(&q, &mut rng);
        let mut plain = Vec::new();
        plain.extend_from_slice(PROBE_MAGIC);
        plain.push(version);
        plain.push(0);
        plain.extend_from_slice(&session);
        if version == 2 {
            plain.extend_from_slice(&[7u8; 32]);
        }
        plain.extend_from_slice(&5u16.to_le_bytes());
        plain.extend_from_slice(b"alice");
        shares[0].encode_into(&mut plain);
        seal_to_party(
            PartyIndex::ALL[0],
            &publics[0],
            FACE_PROBE_PURPOSE,
            &plain,
            &mut rng,
        )
    }

    #[test]
    fn the_known_subjects_digest_is_sealed_with_an_identification_probe() {
        let (mut rng, secrets, publics) = seeded_keys(6);
        let q = embedding(&mut rng, 128);
        let session = [3u8; 16];
        let reply = PartySecretKey::generate(&mut rng).public_key();
        let known = [0xabu8; 32];
        let sealed =
            seal_face_probe_knowing(&q, session, None, Some(&known), &reply, &publics, &mut rng)
                .unwrap();
        let plain = seal_face_probe(&q, session, None, &reply, &publics, &mut rng).unwrap();
        for p in 0..2 {
            let opened =
                open_face_probe(PartyIndex::ALL[p], &secrets[p], &session, &sealed[p]).unwrap();
            assert_eq!(opened.known_subjects, Some(known));
            assert_eq!(opened.target, None);
            let none =
                open_face_probe(PartyIndex::ALL[p], &secrets[p], &session, &plain[p]).unwrap();
            assert_eq!(none.known_subjects, None);
            // Knowing a list or not does not show in the length.
            assert_eq!(sealed[p].len(), plain[p].len());
            assert!(!sealed[p].windows(32).any(|w| w == known));
        }
    }

    #[test]
    fn a_version_3_probe_opens_as_knowing_no_list() {
        let (mut rng, secrets, publics) = seeded_keys(7);
        let q = embedding(&mut rng, 128);
        let shares = share_embedding(&q, &mut rng);
        let session = [8u8; 16];
        let reply = PartySecretKey::generate(&mut rng).public_key();
        let mut plain = Vec::new();
        plain.extend_from_slice(PROBE_MAGIC);
        plain.push(PROBE_VERSION_3);
        plain.push(0);
        plain.extend_from_slice(&session);
        plain.extend_from_slice(reply.as_bytes());
        plain.push(KIND_IDENTIFY);
        plain.extend_from_slice(&0u16.to_le_bytes());
        plain.extend_from_slice(&[0u8; MAX_SUBJECT_LEN]);
        shares[0].encode_into(&mut plain);
        let sealed = seal_to_party(
            PartyIndex::ALL[0],
            &publics[0],
            FACE_PROBE_PURPOSE,
            &plain,
            &mut rng,
        );
        let opened = open_face_probe(PartyIndex::ALL[0], &secrets[0], &session, &sealed).unwrap();
        assert_eq!(opened.known_subjects, None);
        assert_eq!(opened.target, None);
        assert_eq!(opened.share, shares[0]);
    }

    #[test]
    fn version_1_and_2_probes_are_refused_clearly() {
        let (_, secrets, publics) = seeded_keys(4);
        let session = [9u8; 16];
        for version in [1u8, 2] {
            let sealed = old_probe(version, session, &publics);
            let err =
                open_face_probe(PartyIndex::ALL[0], &secrets[0], &session, &sealed).unwrap_err();
            assert_eq!(err, FaceError::UnsupportedProbeVersion(version));
            let text = err.to_string();
            assert!(
                text.contains("reply key") && text.contains("verified subject"),
                "{text}"
            );
        }
    }
}
