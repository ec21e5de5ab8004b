//! Funshade's steps for one batch of comparisons ([BM25] §2; Ibarrondo et al. 2022/1688
//! Alg. 1): the dealer's `setup` ([`deal_batch`]), the evaluators' `share`
//! ([`masked_inputs`]), `eval_dist` ([`distance_shares`]), `eval_sign` ([`sign_shares`]) and
//! the verifier's `res` ([`reconstruct`]). The protocol and its algebra are described in
//! [`crate::face`]; all arithmetic wraps in Z_2^32.
//!
//! One evaluator's key for one comparison, [`COMPARISON_KEY_LEN`] bytes, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 16 | mask seed s_b: expands to δx_b ‖ δy_b (2·l words, [`expand_u32`]) |
//! | 16 | 4 | c_b, share of ⟨δx, δy⟩ |
//! | 20 | 4 | r_b, share of r_in ∓ θ (the threshold hides here) |
//! | 24 | [`IC_KEY_LEN`] | the sign gate key ([`crate::crypto::fss::ic`]) |
//!
//! The key does not grow with l: Funshade's C reference sends δx_b, δy_b and δxy_b in full
//! (12·l + 732 bytes per comparison per party); here they are expanded from a 16-byte seed
//! by a PRG, and only the scalar ⟨δx, δy⟩ that the algebra needs is dealt.

use rand_core::{CryptoRng, RngCore};

use super::encoding::EmbeddingShare;
use super::quantize::Quantizer;
use super::{FaceError, Metric};
use crate::crypto::fss::aes::expand_u32;
use crate::crypto::fss::ic::{self, IcKeyBatch, IC_KEY_LEN};

/// Bytes of one evaluator's key for one comparison.
pub const COMPARISON_KEY_LEN: usize = 24 + IC_KEY_LEN;

/// What the dealer needs to make keys: metric, dimension and the quantised threshold.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DealerParams {
    metric: Metric,
    dim: usize,
    threshold: i64,
}

impl std::fmt::Debug for DealerParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DealerParams {{ metric: {}, dim: {}, threshold: <secret> }}",
            self.metric, self.dim
        )
    }
}

impl DealerParams {
    /// The parameters for `metric` and dimension `dim` with the threshold `threshold`
    /// (unquantised), quantised as θ_q = round(θ · M²). The dealer's sealed configuration
    /// converts with `DealerParams::new` (`dealer.rs`).
    pub fn quantise(metric: Metric, dim: usize, threshold: f64) -> Result<Self, FaceError> {
        let quantizer = Quantizer::new(dim)?;
        Ok(DealerParams {
            metric,
            dim,
            threshold: quantizer.quantize_threshold(metric, threshold)?,
        })
    }

    /// Parameters with an already quantised threshold (tests of other modules).
    #[cfg(test)]
    pub(crate) fn for_tests(metric: Metric, dim: usize, threshold: i64) -> Self {
        DealerParams {
            metric,
            dim,
            threshold,
        }
    }

    /// The metric.
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// The dimension.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The offset r_0 + r_1 must carry besides r_in: −θ for cosine (v = ⟨x, y⟩ − θ), +θ for
    /// Euclidean (v = θ − ‖x − y‖²).
    pub(crate) fn threshold_offset(&self) -> u32 {
        let theta = self.threshold as u32;
        match self.metric {
            Metric::Cosine => theta.wrapping_neg(),
            Metric::Euclidean => theta,
        }
    }
}

/// ⟨a, b⟩ in Z_2^32.
fn dot_wrapping(a: &[u32], b: &[u32]) -> u32 {
    a.iter()
        .zip(b)
        .fold(0u32, |acc, (&x, &y)| acc.wrapping_add(x.wrapping_mul(y)))
}

/// Dealer (Funshade `setup`): makes `count` comparison keys. Returns the two evaluators'
/// halves, each `count × COMPARISON_KEY_LEN` bytes.
pub fn deal_batch<R: RngCore + CryptoRng>(
    params: &DealerParams,
    count: usize,
    rng: &mut R,
) -> [Vec<u8>; 2] {
    let l = params.dim;
    let mut halves = [
        Vec::with_capacity(count * COMPARISON_KEY_LEN),
        Vec::with_capacity(count * COMPARISON_KEY_LEN),
    ];
    let mut masks = [vec![0u32; 2 * l], vec![0u32; 2 * l]];
    let mut delta_x = vec![0u32; l];
    let mut delta_y = vec![0u32; l];
    let offset = params.threshold_offset();
    for _ in 0..count {
        let mut seeds = [[0u8; 16]; 2];
        for (seed, mask) in seeds.iter_mut().zip(masks.iter_mut()) {
            rng.fill_bytes(seed);
            expand_u32(seed, mask);
        }
        for i in 0..l {
            delta_x[i] = masks[0][i].wrapping_add(masks[1][i]);
            delta_y[i] = masks[0][l + i].wrapping_add(masks[1][l + i]);
        }
        let c = dot_wrapping(&delta_x, &delta_y);
        let c0 = rng.next_u32();
        let r_in = rng.next_u32();
        let r0 = rng.next_u32();
        let (ic0, ic1) = ic::gen_sign_gate(rng, r_in);
        let shares = [
            (c0, r0, ic0),
            (
                c.wrapping_sub(c0),
                r_in.wrapping_add(offset).wrapping_sub(r0),
                ic1,
            ),
        ];
        for (b, (c_b, r_b, ic_b)) in shares.iter().enumerate() {
            let out = &mut halves[b];
            out.extend_from_slice(&seeds[b]);
            out.extend_from_slice(&c_b.to_le_bytes());
            out.extend_from_slice(&r_b.to_le_bytes());
            ic_b.encode_into(out);
        }
    }
    halves
}

/// A borrowed run of one evaluator's encoded comparison keys.
#[derive(Clone, Copy)]
pub struct KeySlice<'a> {
    bytes: &'a [u8],
}

impl<'a> KeySlice<'a> {
    /// Wraps `bytes`, which must hold whole keys.
    pub fn new(bytes: &'a [u8]) -> Result<Self, FaceError> {
        if bytes.is_empty() || !bytes.len().is_multiple_of(COMPARISON_KEY_LEN) {
            return Err(FaceError::Malformed(
                "key material is not a whole number of comparison keys",
            ));
        }
        Ok(KeySlice { bytes })
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.bytes.len() / COMPARISON_KEY_LEN
    }

    /// Never true for a constructed slice.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn key(&self, k: usize) -> &'a [u8] {
        &self.bytes[k * COMPARISON_KEY_LEN..(k + 1) * COMPARISON_KEY_LEN]
    }

    fn seed(&self, k: usize) -> [u8; 16] {
        let mut seed = [0u8; 16];
        seed.copy_from_slice(&self.key(k)[..16]);
        seed
    }

    fn word(&self, k: usize, offset: usize) -> u32 {
        let key = self.key(k);
        u32::from_le_bytes([
            key[offset],
            key[offset + 1],
            key[offset + 2],
            key[offset + 3],
        ])
    }
}

fn check_shapes(
    keys: &KeySlice<'_>,
    probe: &EmbeddingShare,
    templates: &[&EmbeddingShare],
) -> Result<usize, FaceError> {
    let l = probe.elements.len();
    if templates.len() != keys.len() {
        return Err(FaceError::Malformed(
            "one key per compared template is required",
        ));
    }
    for t in templates {
        if t.elements.len() != l {
            return Err(FaceError::WrongDimension {
                expected: l,
                got: t.elements.len(),
            });
        }
    }
    Ok(l)
}

/// Evaluator b, round 1 (Funshade `share` on secret-shared inputs): for each comparison k,
/// x_b + δx_b,k followed by y_k,b + δy_b,k. Returns keys.len() · 2·l words.
pub fn masked_inputs(
    keys: &KeySlice<'_>,
    probe: &EmbeddingShare,
    templates: &[&EmbeddingShare],
) -> Result<Vec<u32>, FaceError> {
    let l = check_shapes(keys, probe, templates)?;
    let mut out = vec![0u32; keys.len() * 2 * l];
    for (k, (chunk, template)) in out.chunks_exact_mut(2 * l).zip(templates).enumerate() {
        expand_u32(&keys.seed(k), chunk);
        let (mx, my) = chunk.split_at_mut(l);
        for (m, x) in mx.iter_mut().zip(&probe.elements) {
            *m = m.wrapping_add(*x);
        }
        for (m, y) in my.iter_mut().zip(&template.elements) {
            *m = m.wrapping_add(*y);
        }
    }
    Ok(out)
}

/// Evaluator b, round 2 (Funshade `eval_dist`): from its own inputs and the peer's round-1
/// words, the share z_b = d_b + r_b (cosine) or 2·d_b − ‖x‖²_b − ‖y‖²_b + r_b (Euclidean) of
/// z = v + r_in, where d_b = b·⟨Δx, Δy⟩ − ⟨Δx, δy_b⟩ − ⟨Δy, δx_b⟩ + c_b.
pub fn distance_shares(
    b: usize,
    metric: Metric,
    keys: &KeySlice<'_>,
    probe: &EmbeddingShare,
    templates: &[&EmbeddingShare],
    peer_masked: &[u32],
) -> Result<Vec<u32>, FaceError> {
    let l = check_shapes(keys, probe, templates)?;
    if peer_masked.len() != keys.len() * 2 * l {
        return Err(FaceError::Malformed(
            "peer's masked inputs have the wrong length",
        ));
    }
    let lead = u32::from(b == 1);
    let mut masks = vec![0u32; 2 * l];
    let mut out = Vec::with_capacity(keys.len());
    for (k, (peer, template)) in peer_masked.chunks_exact(2 * l).zip(templates).enumerate() {
        expand_u32(&keys.seed(k), &mut masks);
        let (dx, dy) = masks.split_at(l);
        let (px, py) = peer.split_at(l);
        let mut acc = 0u32;
        for i in 0..l {
            let big_x = probe.elements[i].wrapping_add(dx[i]).wrapping_add(px[i]);
            let big_y = template.elements[i].wrapping_add(dy[i]).wrapping_add(py[i]);
            // b·Δx·Δy − Δx·δy_b − Δy·δx_b, as Δx·(b·Δy − δy_b) − Δy·δx_b.
            let term = big_x
                .wrapping_mul(lead.wrapping_mul(big_y).wrapping_sub(dy[i]))
                .wrapping_sub(big_y.wrapping_mul(dx[i]));
            acc = acc.wrapping_add(term);
        }
        let d = acc.wrapping_add(keys.word(k, 16));
        let r = keys.word(k, 20);
        let z = match metric {
            Metric::Cosine => d.wrapping_add(r),
            Metric::Euclidean => d
                .wrapping_mul(2)
                .wrapping_sub(probe.norm)
                .wrapping_sub(template.norm)
                .wrapping_add(r),
        };
        out.push(z);
    }
    Ok(out)
}

/// Both evaluators: z = z_0 + z_1, the masked comparison input.
pub fn open_masked(own: &[u32], peer: &[u32]) -> Result<Vec<u32>, FaceError> {
    if own.len() != peer.len() {
        return Err(FaceError::Malformed(
            "peer's distance shares have the wrong length",
        ));
    }
    Ok(own
        .iter()
        .zip(peer)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect())
}

/// Decodes the sign-gate keys of a run of comparison keys, laid out for batch evaluation.
pub fn sign_gate_keys(keys: &KeySlice<'_>) -> Result<IcKeyBatch, FaceError> {
    Ok(IcKeyBatch::decode_many(
        (0..keys.len()).map(|k| &keys.key(k)[24..]),
    )?)
}

/// Evaluator b, round 3 (Funshade `eval_sign`): o_b = Eval^IC(b, key_b, z) for every
/// comparison; o_0 + o_1 = 1 exactly when v ≥ 0.
pub fn sign_shares(b: usize, keys: &KeySlice<'_>, z: &[u32]) -> Result<Vec<u32>, FaceError> {
    if z.len() != keys.len() {
        return Err(FaceError::Malformed("one masked value per key is required"));
    }
    let batch = sign_gate_keys(keys)?;
    let mut out = vec![0u32; z.len()];
    ic::eval_batch(b as u8, &batch, z, &mut out)?;
    Ok(out)
}

/// Verifier (Funshade `res`): adds the two evaluators' output shares; each sum must be 0 or
/// 1.
pub fn reconstruct(o0: &[u32], o1: &[u32]) -> Result<Vec<bool>, FaceError> {
    if o0.len() != o1.len() {
        return Err(FaceError::Malformed(
            "the evaluators returned different numbers of results",
        ));
    }
    o0.iter()
        .zip(o1)
        .enumerate()
        .map(|(k, (a, b))| match a.wrapping_add(*b) {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FaceError::NotABit(k)),
        })
        .collect()
}

/// Little-endian bytes of words (round messages).
pub fn words_to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Words from little-endian bytes; refuses a length that is not a multiple of 4.
pub fn bytes_to_words(bytes: &[u8]) -> Result<Vec<u32>, FaceError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(FaceError::Malformed("length is not a multiple of 4"));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect())
}

/// Runs the whole protocol in process (dealer, both evaluators, verifier) — the reference
/// the tests and the benchmark check the distributed run against.
pub fn evaluate_in_process<R: RngCore + CryptoRng>(
    params: &DealerParams,
    probe: &[EmbeddingShare; 2],
    templates: &[[EmbeddingShare; 2]],
    rng: &mut R,
) -> Result<Vec<bool>, FaceError> {
    let halves = deal_batch(params, templates.len(), rng);
    let keys = [KeySlice::new(&halves[0])?, KeySlice::new(&halves[1])?];
    let side = |b: usize| -> Vec<&EmbeddingShare> { templates.iter().map(|t| &t[b]).collect() };
    let (t0, t1) = (side(0), side(1));
    let m0 = masked_inputs(&keys[0], &probe[0], &t0)?;
    let m1 = masked_inputs(&keys[1], &probe[1], &t1)?;
    let z0 = distance_shares(0, params.metric, &keys[0], &probe[0], &t0, &m1)?;
    let z1 = distance_shares(1, params.metric, &keys[1], &probe[1], &t1, &m0)?;
    let z = open_masked(&z0, &z1)?;
    let o0 = sign_shares(0, &keys[0], &z)?;
    let o1 = sign_shares(1, &keys[1], &z)?;
    reconstruct(&o0, &o1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::dot;
    use crate::face::encoding::share_embedding;
    use crate::face::quantize::{plaintext_match, squared_distance};
    use proptest::prelude::{any, prop, proptest, ProptestConfig};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use rand_core::RngCore;

    fn random_embedding(rng: &mut ChaCha20Rng, dim: usize, m: i32) -> Vec<i32> {
        (0..dim)
            .map(|_| (rng.next_u32() % (2 * m as u32 + 1)) as i32 - m)
            .collect()
    }

    /// Runs probe × templates through the protocol with an exact quantised threshold and
    /// compares with the plaintext reference.
    fn check(
        metric: Metric,
        dim: usize,
        threshold: i64,
        probe: &[i32],
        templates: &[Vec<i32>],
        rng: &mut ChaCha20Rng,
    ) {
        let params = DealerParams {
            metric,
            dim,
            threshold,
        };
        let probe_shares = share_embedding(probe, rng);
        let template_shares: Vec<[EmbeddingShare; 2]> =
            templates.iter().map(|t| share_embedding(t, rng)).collect();
        let got = evaluate_in_process(&params, &probe_shares, &template_shares, rng).unwrap();
        for (t, &bit) in templates.iter().zip(&got) {
            assert_eq!(bit, plaintext_match(metric, probe, t, threshold));
        }
    }

    #[test]
    fn thresholds_at_and_around_the_exact_value_decide_correctly() {
        let mut rng = ChaCha20Rng::seed_from_u64(10);
        let dim = 128;
        let m = Quantizer::new(dim).unwrap().magnitude() as i32;
        let x = random_embedding(&mut rng, dim, m);
        let ys: Vec<Vec<i32>> = (0..4).map(|_| random_embedding(&mut rng, dim, m)).collect();
        for y in &ys {
            let d = dot(&x, y);
            let e = squared_distance(&x, y);
            for delta in [-1, 0, 1] {
                check(
                    Metric::Cosine,
                    dim,
                    d + delta,
                    &x,
                    std::slice::from_ref(y),
                    &mut rng,
                );
                check(
                    Metric::Euclidean,
                    dim,
                    e + delta,
                    &x,
                    std::slice::from_ref(y),
                    &mut rng,
                );
            }
        }
    }

    #[test]
    fn extreme_embeddings_do_not_overflow() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        for dim in [128, 1024] {
            let q = Quantizer::new(dim).unwrap();
            let m = q.magnitude() as i32;
            let plus = vec![m; dim];
            let minus = vec![-m; dim];
            let templates = vec![plus.clone(), minus.clone()];
            for theta in [-1.0, 0.0, 1.0] {
                let t = q.quantize_threshold(Metric::Cosine, theta).unwrap();
                check(Metric::Cosine, dim, t, &plus, &templates, &mut rng);
            }
            for theta in [0.0, 1.0, 4.0 * dim as f64] {
                let t = q.quantize_threshold(Metric::Euclidean, theta).unwrap();
                check(Metric::Euclidean, dim, t, &plus, &templates, &mut rng);
            }
        }
    }

    #[test]
    fn tampered_outputs_are_detected() {
        assert_eq!(reconstruct(&[5], &[u32::MAX - 3]).unwrap(), vec![true]);
        assert_eq!(reconstruct(&[7], &[2]), Err(FaceError::NotABit(0)));
        assert!(reconstruct(&[1, 2], &[3]).is_err());
        assert!(KeySlice::new(&[0u8; COMPARISON_KEY_LEN + 1]).is_err());
        assert!(bytes_to_words(&[1, 2, 3]).is_err());
    }

    #[test]
    fn one_party_alone_sees_only_masked_values() {
        // Round-1 words of one party for the same input under two fresh keys differ
        // everywhere they could (the masks are fresh), so a key is never reused silently.
        let mut rng = ChaCha20Rng::seed_from_u64(12);
        let params = DealerParams {
            metric: Metric::Cosine,
            dim: 128,
            threshold: 0,
        };
        let x = random_embedding(&mut rng, 128, 100);
        let shares = share_embedding(&x, &mut rng);
        let a = deal_batch(&params, 1, &mut rng);
        let b = deal_batch(&params, 1, &mut rng);
        let ma = masked_inputs(&KeySlice::new(&a[0]).unwrap(), &shares[0], &[&shares[1]]).unwrap();
        let mb = masked_inputs(&KeySlice::new(&b[0]).unwrap(), &shares[0], &[&shares[1]]).unwrap();
        let same = ma.iter().zip(&mb).filter(|(p, q)| p == q).count();
        assert!(same < 3, "{same} equal words");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn reconstructed_bits_equal_the_plaintext_comparison(
            seed in any::<u64>(),
            dim in prop::sample::select(vec![128usize, 200, 512, 1024]),
            euclidean in any::<bool>(),
            near in any::<bool>(),
        ) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let metric = if euclidean { Metric::Euclidean } else { Metric::Cosine };
            let (x, ys, threshold) =
                crate::face::encoding::test_support::property_case(&mut rng, dim, metric, near);
            check(metric, dim, threshold, &x, &ys, &mut rng);
        }
    }
}
