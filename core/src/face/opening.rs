//! The one opening of enrolled templates between the evaluators (docs/protocols/face.md
//! §6 step 1; [`super::masked`]): evaluator b sends Y_b = y_b + δy_b for a list of
//! templates, once, on the pairwise channel P_b → P_{1−b}; both then hold Δy = Y_0 + Y_1.
//!
//! Message `PMFY`, version 1: sender party, dimension l (u16), count (u32), then per template
//! its bundle id (16) and Y_b (l little-endian u32). Channel session id: SHA-256("privmatch
//! face template opening v1" ‖ [`super::masked::template_digest`] of the ids)[0..16], so a
//! message answers exactly the list both evaluators were asked to open. Opening the same list
//! twice sends the same values (δy_b is derived from the bundle id), so a replayed message
//! tells nothing new.

use rand_core::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

use super::encoding::{evaluator, EmbeddingShare, Reader, VERSION};
use super::masked::{masked_template_share, template_digest, BUNDLE_ID_LEN};
use super::FaceError;
use crate::crypto::seal::PairwiseSecrets;
use crate::party::PartyIndex;
use crate::wire::session::SESSION_ID_LEN;

const OPENING_MAGIC: &[u8; 4] = b"PMFY";

fn opening_channel(ids: &[[u8; BUNDLE_ID_LEN]]) -> [u8; SESSION_ID_LEN] {
    let digest = Sha256::new()
        .chain_update(b"privmatch face template opening v1")
        .chain_update(template_digest(ids))
        .finalize();
    let mut out = [0u8; SESSION_ID_LEN];
    out.copy_from_slice(&digest[..SESSION_ID_LEN]);
    out
}

/// The channel session id of the evaluators' messages in face session `session` over the
/// template list with digest `list_digest` (§6 steps 3–4: X_b, then z_b): SHA-256("privmatch
/// face masked session v1" ‖ session ‖ digest)[0..16].
pub fn session_channel(
    session: &[u8; SESSION_ID_LEN],
    list_digest: &[u8; 32],
) -> [u8; SESSION_ID_LEN] {
    let digest = Sha256::new()
        .chain_update(b"privmatch face masked session v1")
        .chain_update(session)
        .chain_update(list_digest)
        .finalize();
    let mut out = [0u8; SESSION_ID_LEN];
    out.copy_from_slice(&digest[..SESSION_ID_LEN]);
    out
}

/// Evaluator `me`'s half of the opening of the templates `ids` (in order): Y_b = y_b + δy_b
/// from its shares and its mask seeds (from P2), sealed for the other evaluator with
/// `to_peer`, the pairwise secrets of the two evaluators.
pub fn seal_opening<R: RngCore + CryptoRng>(
    me: PartyIndex,
    to_peer: &PairwiseSecrets,
    ids: &[[u8; BUNDLE_ID_LEN]],
    shares: &[EmbeddingShare],
    seeds: &[[u8; 16]],
    rng: &mut R,
) -> Result<Vec<u8>, FaceError> {
    let party = evaluator(me)? as u8;
    if shares.len() != ids.len() || seeds.len() != ids.len() {
        return Err(FaceError::Malformed(
            "template opening: one share and one seed per template",
        ));
    }
    let dim = shares.first().map_or(0, |s| s.elements.len());
    let count = u32::try_from(ids.len())
        .map_err(|_| FaceError::Malformed("template opening: too many templates"))?;
    let mut plain = Vec::with_capacity(12 + ids.len() * (BUNDLE_ID_LEN + 4 * dim));
    plain.extend_from_slice(OPENING_MAGIC);
    plain.push(VERSION);
    plain.push(party);
    plain.extend_from_slice(&(dim as u16).to_le_bytes());
    plain.extend_from_slice(&count.to_le_bytes());
    for ((id, share), seed) in ids.iter().zip(shares).zip(seeds) {
        if share.elements.len() != dim {
            return Err(FaceError::WrongDimension {
                expected: dim,
                got: share.elements.len(),
            });
        }
        plain.extend_from_slice(id);
        let mut masked = masked_template_share(share, seed);
        for w in &masked {
            plain.extend_from_slice(&w.to_le_bytes());
        }
        masked.zeroize();
    }
    let sealed = to_peer.channel(opening_channel(ids)).seal(0, &plain, rng);
    plain.zeroize();
    Ok(sealed)
}

/// Evaluator `me` opens the other evaluator's half of the opening of `ids` (sealed with
/// [`seal_opening`]) and returns Y_{1−b}, `ids.len()` rows of `dim` words, flattened.
/// Refuses a message for another list or dimension, or not sealed by the other evaluator.
pub fn open_opening(
    me: PartyIndex,
    from_peer: &PairwiseSecrets,
    ids: &[[u8; BUNDLE_ID_LEN]],
    dim: usize,
    sealed: &[u8],
) -> Result<Vec<u32>, FaceError> {
    let mine = evaluator(me)? as u8;
    let mut plain = from_peer.channel(opening_channel(ids)).open(0, sealed)?;
    let result = parse_opening(1 - mine, ids, dim, &plain);
    plain.zeroize();
    result
}

fn parse_opening(
    sender: u8,
    ids: &[[u8; BUNDLE_ID_LEN]],
    dim: usize,
    plain: &[u8],
) -> Result<Vec<u32>, FaceError> {
    let mut r = Reader::new(plain);
    r.magic(OPENING_MAGIC)?;
    let party = r.u8()?;
    if party != sender {
        return Err(FaceError::PartyMismatch {
            inside: party,
            me: sender,
        });
    }
    let got = usize::from(u16::from_le_bytes(r.array::<2>()?));
    if got != dim && !ids.is_empty() {
        return Err(FaceError::WrongDimension { expected: dim, got });
    }
    if r.u32()? as usize != ids.len() {
        return Err(FaceError::Malformed("template opening: wrong count"));
    }
    let mut words = Vec::with_capacity(ids.len() * dim);
    for id in ids {
        if &r.array::<BUNDLE_ID_LEN>()? != id {
            return Err(FaceError::Malformed("template opening: another template"));
        }
        for _ in 0..dim {
            words.push(u32::from_le_bytes(r.array::<4>()?));
        }
    }
    r.finish()?;
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::seal::PartySecretKey;
    use crate::face::masked::{expand_template_mask, TemplateMaskMaster};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn share(rng: &mut ChaCha20Rng, dim: usize) -> EmbeddingShare {
        EmbeddingShare {
            elements: (0..dim).map(|_| rng.next_u32()).collect(),
            norm: rng.next_u32(),
        }
    }

    #[test]
    fn both_halves_open_to_the_masked_template_and_nothing_else_opens() {
        let mut rng = ChaCha20Rng::seed_from_u64(41);
        let keys = [0, 1, 2].map(|_| PartySecretKey::generate(&mut rng));
        let [p0, p1, _] = PartyIndex::ALL;
        let s01 = PairwiseSecrets::derive(p0, &keys[0], p1, &keys[1].public_key()).unwrap();
        let s10 = PairwiseSecrets::derive(p1, &keys[1], p0, &keys[0].public_key()).unwrap();
        let master = TemplateMaskMaster::generate(&mut rng);
        let dim = 128;
        let ids: Vec<[u8; 16]> = (0..3u8).map(|i| [i; 16]).collect();
        let y: Vec<[EmbeddingShare; 2]> = ids
            .iter()
            .map(|_| [share(&mut rng, dim), share(&mut rng, dim)])
            .collect();
        let seeds: Vec<[[u8; 16]; 2]> = ids.iter().map(|id| master.template_seeds(id)).collect();
        let half = |b: usize| -> (Vec<EmbeddingShare>, Vec<[u8; 16]>) {
            (
                y.iter().map(|t| t[b].clone()).collect(),
                seeds.iter().map(|s| s[b]).collect(),
            )
        };
        let (y0, sd0) = half(0);
        let (y1, sd1) = half(1);
        let m0 = seal_opening(p0, &s01, &ids, &y0, &sd0, &mut rng).unwrap();
        let m1 = seal_opening(p1, &s10, &ids, &y1, &sd1, &mut rng).unwrap();
        let at1 = open_opening(p1, &s10, &ids, dim, &m0).unwrap();
        let at0 = open_opening(p0, &s01, &ids, dim, &m1).unwrap();
        // Y_0 + Y_1 = y + δy_0 + δy_1 at both.
        for (j, t) in y.iter().enumerate() {
            let mut d0 = vec![0u32; dim];
            let mut d1 = vec![0u32; dim];
            expand_template_mask(&seeds[j][0], &mut d0);
            expand_template_mask(&seeds[j][1], &mut d1);
            for i in 0..dim {
                let opened = t[0].elements[i]
                    .wrapping_add(t[1].elements[i])
                    .wrapping_add(d0[i])
                    .wrapping_add(d1[i]);
                let mine0 = t[0].elements[i].wrapping_add(d0[i]);
                let mine1 = t[1].elements[i].wrapping_add(d1[i]);
                assert_eq!(mine0.wrapping_add(at0[j * dim + i]), opened);
                assert_eq!(mine1.wrapping_add(at1[j * dim + i]), opened);
            }
        }
        // Another list, another dimension, the wrong receiver, a flipped byte: refused.
        assert!(open_opening(p1, &s10, &ids[..2], dim, &m0).is_err());
        assert!(open_opening(p1, &s10, &ids, dim + 1, &m0).is_err());
        assert!(open_opening(p0, &s01, &ids, dim, &m0).is_err());
        let mut bad = m0.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(open_opening(p1, &s10, &ids, dim, &bad).is_err());
        // P2 is no evaluator.
        let s20 = PairwiseSecrets::derive(PartyIndex::ALL[2], &keys[2], p0, &keys[0].public_key())
            .unwrap();
        assert!(seal_opening(PartyIndex::ALL[2], &s20, &ids, &y0, &sd0, &mut rng).is_err());
    }
}
