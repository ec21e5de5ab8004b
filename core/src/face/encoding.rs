//! The evaluators' additive sharing of a quantised embedding over Z_2^32 (P0 holds a uniformly
//! random vector, P1 the difference, both with a share of the squared norm) and its byte
//! layout: dimension (u16), norm share (u32), l element shares (u32), little-endian. Also the
//! bounds-checked reader every face decoder uses, so a truncated or misrouted message is an
//! error, never a panic.

use rand_core::{CryptoRng, RngCore};

use super::quantize::check_dim;
use super::FaceError;
use crate::party::PartyIndex;

/// Layout version of every face message (bundles, probes, configuration, key batches).
pub(super) const VERSION: u8 = 1;

/// One evaluator's additive share of a quantised embedding and of its squared norm.
#[derive(Clone, PartialEq, Eq)]
pub struct EmbeddingShare {
    /// Share of each element q_i (as u32 in Z_2^32).
    pub elements: Vec<u32>,
    /// Share of ‖q‖².
    pub norm: u32,
}

impl std::fmt::Debug for EmbeddingShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "EmbeddingShare {{ dim: {}, <redacted> }}",
            self.elements.len()
        )
    }
}

impl EmbeddingShare {
    pub(super) fn encoded_len(&self) -> usize {
        2 + 4 + 4 * self.elements.len()
    }

    pub(super) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.elements.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.norm.to_le_bytes());
        out.extend(self.elements.iter().flat_map(|w| w.to_le_bytes()));
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Self, FaceError> {
        let mut r = Reader::new(bytes);
        let dim = usize::from(r.u16()?);
        check_dim(dim)?;
        let norm = r.u32()?;
        let elements = r.words(dim)?;
        r.finish()?;
        Ok(EmbeddingShare { elements, norm })
    }
}

/// Splits a quantised embedding into the two evaluators' additive shares (P0's uniformly
/// random, P1's the difference), with shares of its squared norm.
pub fn share_embedding<R: RngCore + CryptoRng>(q: &[i32], rng: &mut R) -> [EmbeddingShare; 2] {
    let norm = q.iter().fold(0u32, |acc, &v| {
        acc.wrapping_add((v as u32).wrapping_mul(v as u32))
    });
    let first: Vec<u32> = q.iter().map(|_| rng.next_u32()).collect();
    let second = q
        .iter()
        .zip(&first)
        .map(|(&v, &s)| (v as u32).wrapping_sub(s))
        .collect();
    let norm_first = rng.next_u32();
    [
        EmbeddingShare {
            elements: first,
            norm: norm_first,
        },
        EmbeddingShare {
            elements: second,
            norm: norm.wrapping_sub(norm_first),
        },
    ]
}

/// Adds two shares back together (tests and the plaintext reference only).
pub fn reconstruct_embedding(a: &EmbeddingShare, b: &EmbeddingShare) -> (Vec<i32>, u32) {
    let q = a
        .elements
        .iter()
        .zip(&b.elements)
        .map(|(x, y)| x.wrapping_add(*y) as i32)
        .collect();
    (q, a.norm.wrapping_add(b.norm))
}

/// The evaluator index of a party: P0 → 0, P1 → 1; P2 holds no face shares.
pub fn evaluator(party: PartyIndex) -> Result<usize, FaceError> {
    match party.as_usize() {
        i @ (0 | 1) => Ok(i),
        other => Err(FaceError::NotAnEvaluator(other as u8)),
    }
}

/// A bounds-checked little-endian reader.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], FaceError> {
        if self.bytes.len() < n {
            return Err(FaceError::Malformed("truncated"));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], FaceError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(super) fn u8(&mut self) -> Result<u8, FaceError> {
        Ok(self.array::<1>()?[0])
    }

    pub(super) fn u16(&mut self) -> Result<u16, FaceError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(super) fn u32(&mut self) -> Result<u32, FaceError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(super) fn words(&mut self, n: usize) -> Result<Vec<u32>, FaceError> {
        Ok(self
            .take(4 * n)?
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect())
    }

    pub(super) fn magic(&mut self, magic: &[u8; 4]) -> Result<(), FaceError> {
        if self.take(4)? != magic || self.u8()? != VERSION {
            return Err(FaceError::Malformed("bad magic or unsupported version"));
        }
        Ok(())
    }

    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    pub(super) fn finish(&self) -> Result<(), FaceError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(FaceError::Malformed("trailing bytes"))
        }
    }
}

/// Fixtures shared by the face modules' tests.
#[cfg(test)]
pub(crate) mod test_support {
    use crate::crypto::seal::{PartyPublicKey, PartySecretKey};
    use crate::face::quantize::Quantizer;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use rand_core::RngCore;

    /// Three fresh party key pairs.
    pub(crate) fn keys(rng: &mut ChaCha20Rng) -> ([PartySecretKey; 3], [PartyPublicKey; 3]) {
        let secrets: [PartySecretKey; 3] = std::array::from_fn(|_| PartySecretKey::generate(rng));
        let publics = std::array::from_fn(|i| secrets[i].public_key());
        (secrets, publics)
    }

    /// A generator seeded with `seed` and three party key pairs drawn from it.
    pub(crate) fn seeded_keys(
        seed: u64,
    ) -> (ChaCha20Rng, [PartySecretKey; 3], [PartyPublicKey; 3]) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let (secrets, publics) = keys(&mut rng);
        (rng, secrets, publics)
    }

    /// The pairwise secrets of party `a` with party `b`.
    pub(crate) fn pairwise(
        secrets: &[PartySecretKey; 3],
        publics: &[PartyPublicKey; 3],
        a: usize,
        b: usize,
    ) -> crate::crypto::seal::PairwiseSecrets {
        use crate::party::PartyIndex;
        crate::crypto::seal::PairwiseSecrets::derive(
            PartyIndex::ALL[a],
            &secrets[a],
            PartyIndex::ALL[b],
            &publics[b],
        )
        .unwrap()
    }

    /// A random quantised embedding of dimension `dim` within the quantiser's range.
    pub(crate) fn embedding(rng: &mut ChaCha20Rng, dim: usize) -> Vec<i32> {
        let q = Quantizer::new(dim).unwrap();
        let m = q.magnitude() as i32;
        (0..dim)
            .map(|_| (rng.next_u32() % (2 * m as u32 + 1)) as i32 - m)
            .collect()
    }

    /// One case of the face property tests: a probe, six templates and a quantised
    /// threshold (`near`: within ±1 of the metric between the probe and the first template).
    pub(crate) fn property_case(
        rng: &mut ChaCha20Rng,
        dim: usize,
        metric: crate::face::Metric,
        near: bool,
    ) -> (Vec<i32>, Vec<Vec<i32>>, i64) {
        let x = embedding(rng, dim);
        let ys: Vec<Vec<i32>> = (0..6).map(|_| embedding(rng, dim)).collect();
        let threshold = test_threshold(rng, metric, &x, &ys[0], near);
        (x, ys, threshold)
    }

    /// A quantised threshold for the property tests: `near` puts it within ±1 of the
    /// metric's value between `x` and `y`, otherwise anywhere in the metric's range.
    fn test_threshold(
        rng: &mut ChaCha20Rng,
        metric: crate::face::Metric,
        x: &[i32],
        y: &[i32],
        near: bool,
    ) -> i64 {
        use crate::embedding::dot;
        use crate::face::quantize::squared_distance;
        use crate::face::Metric;
        if near {
            let v = match metric {
                Metric::Cosine => dot(x, y),
                Metric::Euclidean => squared_distance(x, y),
            };
            v + i64::from(rng.next_u32() % 3) - 1
        } else {
            match metric {
                Metric::Cosine => i64::from(rng.next_u32() % (1 << 28)) - (1 << 27),
                Metric::Euclidean => i64::from(rng.next_u32() % (1 << 29)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::face::encoding::test_support::embedding;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn shares_add_up_to_the_embedding_and_its_norm() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let q = embedding(&mut rng, 128);
        let [a, b] = share_embedding(&q, &mut rng);
        let (back, norm) = reconstruct_embedding(&a, &b);
        assert_eq!(back, q);
        assert_eq!(i64::from(norm), crate::embedding::dot(&q, &q));
    }
}
