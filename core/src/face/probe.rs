//! Face probes: one evaluator's share of a live embedding, sealed to P0 or P1 for one session
//! (purpose [`FACE_PROBE_PURPOSE`]) together with its target, and the id the P0–P1 channel of
//! a session runs under.
//!
//! Layout: `PMFP`, version 2, party, session id (16), reply key (32), target length (u16) and
//! target (the subject of a 1:1 verification, UTF-8; empty for a 1:N identification), then the
//! [`EmbeddingShare`]. The target is sealed with the probe, so a probe given for a
//! verification cannot be run as an identification (which would reveal who the person is) or
//! against another subject. The reply key (an X25519 public key whose secret only the
//! requesting client holds) is where the evaluators seal their outputs
//! ([`crate::face::reply`]); inside the sealed plaintext, the coordinator cannot swap it.
//! Version 1 (no reply key) is refused ([`FaceError::UnsupportedProbeVersion`]).

use rand_core::{CryptoRng, RngCore};

use super::encoding::{evaluator, share_embedding, EmbeddingShare, Reader};
use super::quantize::check_dim;
use super::{FaceError, Metric};
use crate::crypto::seal::{open_sealed_box, seal_to_party, PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;
use crate::wire::envelope::validate_subject;
use crate::wire::session::SESSION_ID_LEN;

/// Sealing purpose of face search probes.
pub const FACE_PROBE_PURPOSE: &str = "face-probe";

const PROBE_MAGIC: &[u8; 4] = b"PMFP";
/// Probe layout version: 2 carries the reply key.
const PROBE_VERSION: u8 = 2;

/// What an evaluator opens from its sealed probe.
#[derive(Debug, PartialEq, Eq)]
pub struct OpenedProbe {
    /// This evaluator's share of the probe.
    pub share: EmbeddingShare,
    /// The key the evaluator seals its output to ([`crate::face::reply`]).
    pub reply_key: PartyPublicKey,
}

/// Client side: shares a quantised probe and seals the two shares to P0 and P1 for search
/// session `session` (so a coordinator cannot replay it into another session) and its
/// target: `Some(subject)` for a 1:1 verification, `None` for a 1:N identification. The
/// evaluators seal their outputs to `reply_key` (a fresh key of the client per request, or
/// the static key of the party whose SQL front door will be called).
pub fn seal_face_probe<R: RngCore + CryptoRng>(
    embedding: &[i32],
    session: [u8; SESSION_ID_LEN],
    target: Option<&str>,
    reply_key: &PartyPublicKey,
    party_keys: &[PartyPublicKey; 3],
    rng: &mut R,
) -> Result<[Vec<u8>; 2], FaceError> {
    check_dim(embedding.len())?;
    if let Some(subject) = target {
        validate_subject(subject)?;
    }
    let target = target.unwrap_or_default().as_bytes();
    let shares = share_embedding(embedding, rng);
    Ok(std::array::from_fn(|p| {
        let mut plain = Vec::with_capacity(56 + target.len() + shares[p].encoded_len());
        plain.extend_from_slice(PROBE_MAGIC);
        plain.push(PROBE_VERSION);
        plain.push(p as u8);
        plain.extend_from_slice(&session);
        plain.extend_from_slice(reply_key.as_bytes());
        plain.extend_from_slice(&(target.len() as u16).to_le_bytes());
        plain.extend_from_slice(target);
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

/// Party side: opens a sealed probe as evaluator `me` for session `session` and checks that
/// it was sealed for `target` (the verified subject, or `None` for an identification);
/// returns its share and the reply key. A version-1 probe is refused
/// ([`FaceError::UnsupportedProbeVersion`]).
pub fn open_face_probe(
    me: PartyIndex,
    secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    target: Option<&str>,
    sealed: &[u8],
) -> Result<OpenedProbe, FaceError> {
    let mine = evaluator(me)? as u8;
    let plain = open_sealed_box(me, secret, FACE_PROBE_PURPOSE, sealed)?;
    let mut r = Reader::new(&plain);
    if r.take(4)? != PROBE_MAGIC {
        return Err(FaceError::Malformed("not a face probe"));
    }
    match r.u8()? {
        PROBE_VERSION => {}
        other => return Err(FaceError::UnsupportedProbeVersion(other)),
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
    let len = usize::from(r.u16()?);
    if r.take(len)? != target.unwrap_or_default().as_bytes() {
        return Err(FaceError::WrongTarget);
    }
    Ok(OpenedProbe {
        share: EmbeddingShare::decode(r.rest())?,
        reply_key,
    })
}

/// The id the P0–P1 channel of a session runs under: the session id bound to its key
/// claims, template set, metric and dimension, so two parties that disagree on any of them
/// cannot authenticate each other's first message.
pub fn channel_session(
    session: &[u8; SESSION_ID_LEN],
    claims: &[u8],
    set_digest: &[u8],
    metric: Metric,
    dim: usize,
) -> [u8; SESSION_ID_LEN] {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(b"privmatch face channel v1");
    hash.update(session);
    hash.update((claims.len() as u32).to_le_bytes());
    hash.update(claims);
    hash.update((set_digest.len() as u32).to_le_bytes());
    hash.update(set_digest);
    hash.update([metric.to_byte()]);
    hash.update((dim as u32).to_le_bytes());
    let digest = hash.finalize();
    let mut out = [0u8; SESSION_ID_LEN];
    out.copy_from_slice(&digest[..SESSION_ID_LEN]);
    out
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
        let open = |p: usize, s: &[u8; 16], t: Option<&str>, m: &[u8]| {
            open_face_probe(PartyIndex::ALL[p], &secrets[p], s, t, m)
        };
        let s0 = open(0, &session, Some("alice"), &sealed[0]).unwrap();
        let s1 = open(1, &session, Some("alice"), &sealed[1]).unwrap();
        assert_eq!(reconstruct_embedding(&s0.share, &s1.share).0, q);
        // Both evaluators read the client's reply key from inside the sealed probe.
        assert_eq!((s0.reply_key, s1.reply_key), (reply, reply));
        assert_eq!(
            open(0, &[6u8; 16], Some("alice"), &sealed[0]),
            Err(FaceError::WrongSession)
        );
        // A verification probe cannot be run as an identification or against someone else.
        assert_eq!(
            open(0, &session, None, &sealed[0]),
            Err(FaceError::WrongTarget)
        );
        assert_eq!(
            open(0, &session, Some("bob"), &sealed[0]),
            Err(FaceError::WrongTarget)
        );
        assert!(open(1, &session, Some("alice"), &sealed[0]).is_err());
        assert!(seal_face_probe(&q[..100], session, None, &reply, &publics, &mut rng).is_err());
        let identify = seal_face_probe(&q, session, None, &reply, &publics, &mut rng).unwrap();
        assert!(open(0, &session, None, &identify[0]).is_ok());
        assert_eq!(
            open(0, &session, Some("alice"), &identify[0]),
            Err(FaceError::WrongTarget)
        );
    }

    #[test]
    fn version_1_probes_without_a_reply_key_are_refused_clearly() {
        let (mut rng, secrets, publics) = seeded_keys(4);
        let q = embedding(&mut rng, 128);
        let session = [9u8; 16];
        let shares = share_embedding(&q, &mut rng);
        // The layout of 0.10.0: version 1, no reply key.
        let mut plain = Vec::new();
        plain.extend_from_slice(PROBE_MAGIC);
        plain.push(1);
        plain.push(0);
        plain.extend_from_slice(&session);
        plain.extend_from_slice(&0u16.to_le_bytes());
        shares[0].encode_into(&mut plain);
        let sealed = seal_to_party(
            PartyIndex::ALL[0],
            &publics[0],
            FACE_PROBE_PURPOSE,
            &plain,
            &mut rng,
        );
        let err =
            open_face_probe(PartyIndex::ALL[0], &secrets[0], &session, None, &sealed).unwrap_err();
        assert_eq!(err, FaceError::UnsupportedProbeVersion(1));
        assert!(err.to_string().contains("reply key"), "{err}");
    }
}
