//! Face probes: one evaluator's share of a live embedding, sealed to P0 or P1 for one session
//! (purpose [`FACE_PROBE_PURPOSE`]) together with its target, and the id the P0–P1 channel of
//! a session runs under.
//!
//! Layout: `PMFP`, version 1, party, session id (16), target length (u16) and target (the
//! subject of a 1:1 verification, UTF-8; empty for a 1:N identification), then the
//! [`EmbeddingShare`]. The target is sealed with the probe, so a probe given for a
//! verification cannot be run as an identification (which would reveal who the person is) or
//! against another subject.

use rand_core::{CryptoRng, RngCore};

use super::encoding::{evaluator, share_embedding, EmbeddingShare, Reader, VERSION};
use super::quantize::check_dim;
use super::{FaceError, Metric};
use crate::crypto::seal::{open_sealed_box, seal_to_party, PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;
use crate::wire::envelope::validate_subject;
use crate::wire::session::SESSION_ID_LEN;

/// Sealing purpose of face search probes.
pub const FACE_PROBE_PURPOSE: &str = "face-probe";

const PROBE_MAGIC: &[u8; 4] = b"PMFP";

/// Client side: shares a quantised probe and seals the two shares to P0 and P1 for search
/// session `session` (so a coordinator cannot replay it into another session) and its
/// target: `Some(subject)` for a 1:1 verification, `None` for a 1:N identification.
pub fn seal_face_probe<R: RngCore + CryptoRng>(
    embedding: &[i32],
    session: [u8; SESSION_ID_LEN],
    target: Option<&str>,
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
        let mut plain = Vec::with_capacity(24 + target.len() + shares[p].encoded_len());
        plain.extend_from_slice(PROBE_MAGIC);
        plain.push(VERSION);
        plain.push(p as u8);
        plain.extend_from_slice(&session);
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
/// it was sealed for `target` (the verified subject, or `None` for an identification).
pub fn open_face_probe(
    me: PartyIndex,
    secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    target: Option<&str>,
    sealed: &[u8],
) -> Result<EmbeddingShare, FaceError> {
    let mine = evaluator(me)? as u8;
    let plain = open_sealed_box(me, secret, FACE_PROBE_PURPOSE, sealed)?;
    let mut r = Reader::new(&plain);
    r.magic(PROBE_MAGIC)?;
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
    let len = usize::from(r.u16()?);
    if r.take(len)? != target.unwrap_or_default().as_bytes() {
        return Err(FaceError::WrongTarget);
    }
    EmbeddingShare::decode(r.rest())
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
    use crate::face::encoding::reconstruct_embedding;
    use crate::face::encoding::test_support::{embedding, seeded_keys};

    #[test]
    fn probes_are_bound_to_their_session_party_and_target() {
        let (mut rng, secrets, publics) = seeded_keys(3);
        let q = embedding(&mut rng, 128);
        let session = [5u8; 16];
        let sealed = seal_face_probe(&q, session, Some("alice"), &publics, &mut rng).unwrap();
        let open = |p: usize, s: &[u8; 16], t: Option<&str>, m: &[u8]| {
            open_face_probe(PartyIndex::ALL[p], &secrets[p], s, t, m)
        };
        let s0 = open(0, &session, Some("alice"), &sealed[0]).unwrap();
        let s1 = open(1, &session, Some("alice"), &sealed[1]).unwrap();
        assert_eq!(reconstruct_embedding(&s0, &s1).0, q);
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
        assert!(seal_face_probe(&q[..100], session, None, &publics, &mut rng).is_err());
        let identify = seal_face_probe(&q, session, None, &publics, &mut rng).unwrap();
        assert!(open(0, &session, None, &identify[0]).is_ok());
        assert_eq!(
            open(0, &session, Some("alice"), &identify[0]),
            Err(FaceError::WrongTarget)
        );
    }
}
