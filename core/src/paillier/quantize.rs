//! # Face embeddings quantised for the packed Paillier protocols ([ABMR20])
//!
//! Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint 2020/1363.
//! The protocols compare the inner product ⟨u, w⟩ of two integer vectors with a threshold;
//! the templates are face embeddings, so both the device's u and the terminal's w are L2-
//! normalised and rounded to integers, q_i = round(x_i · M), with the element checks,
//! normalisation and rounding of the shared layer [`crate::embedding`] (the Funshade modality
//! uses the same, under its own M). ⟨u, w⟩ ≈ M²·cos(u, w), and a similarity threshold T in
//! [−1, 1] becomes θ = round(T · M²).
//!
//! **The choice of M** comes from the layout ([`Params`]): every element must be an m-bit
//! two's-complement value, and the enrolment of Π2/Π3 proves ‖u‖² ≤ ζ² ([ABMR20] §8.3; the
//! terminal's w must obey it too: the slot widths rely on it). Rounding can raise the norm:
//! for a unit vector x (‖x‖₂ = 1) and q_i = round(M·x_i), |q_i| ≤ M·|x_i| + 1/2, so
//!
//! ```text
//! ‖q‖² ≤ Σ (M·|x_i| + 1/2)² = M²·‖x‖₂² + M·‖x‖₁ + ℓ/4 ≤ M² + M·√ℓ + ℓ/4     (‖x‖₁ ≤ √ℓ·‖x‖₂)
//! ```
//!
//! M is the largest integer with |M| ≤ 2^(m−1) − 1 (so every element fits m bits) and
//! 4·a + ⌈a / 2^18⌉ + ℓ ≤ 4·ζ², a = M² + M·s, s = ⌈√ℓ⌉ ([`magnitude_for`]): the bound above,
//! times four, with a relative margin of 2^−20 on a for the floating-point normalisation
//! (‖x‖₂² is 1 within about (ℓ + 4)·2^−53 ≤ 2^−40 for ℓ ≤ 4096, and M·x_i is exact within
//! 2^−53 relative). So **every** normalised embedding quantises within the proved bound; the
//! quantiser still checks ‖q‖² ≤ ζ² and |θ| ≤ M² ≤ ζ², so a violation would be an error here
//! and never a refused proof at the service provider. The property tests try random and
//! adversarial unit vectors (all |x_i| equal, which maximises ‖x‖₁, with M·x_i just below a
//! rounding boundary).

use rug::Integer;

use super::params::Params;
use crate::embedding::{self, dot, squared_norm, EmbeddingError};

/// Why an embedding or threshold cannot be quantised under the parameters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantizeError {
    /// The embedding is refused by the shared checks (not finite, out of range, zero, wrong
    /// dimension).
    #[error(transparent)]
    Embedding(#[from] EmbeddingError),
    /// ζ² is too small for the dimension: no M ≥ 1 keeps every rounded unit vector within it.
    #[error("the parameters' norm bound ζ² = {norm_bound} is too small for ℓ = {dim}: no quantisation magnitude M ≥ 1 keeps every rounded unit vector within it")]
    NoMagnitude {
        /// ℓ.
        dim: usize,
        /// ζ².
        norm_bound: Integer,
    },
    /// A similarity threshold outside [−1, 1] (or not finite).
    #[error("threshold {0}: a cosine similarity threshold lies in [-1, 1]")]
    BadThreshold(f64),
    /// The rounded embedding exceeds ζ² (excluded by the choice of M; checked anyway).
    #[error("the quantised embedding's squared norm exceeds the parameters' bound ζ²")]
    NormExceeded,
}

/// The quantisation of one parameter set: unit vectors of dimension ℓ, q = round(x · M).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quantizer {
    dim: usize,
    magnitude: u32,
    norm_bound: Integer,
}

/// ⌈√n⌉.
fn ceil_sqrt(n: u128) -> u128 {
    let mut s = (n as f64).sqrt() as u128;
    while s.saturating_mul(s) > n {
        s -= 1;
    }
    while s.saturating_mul(s) < n {
        s += 1;
    }
    s
}

/// Whether M keeps every rounded unit vector of dimension `dim` within `bound4` = 4·ζ²
/// (module docs: 4·a + ⌈a/2^18⌉ + ℓ ≤ 4·ζ², a = M² + M·⌈√ℓ⌉).
fn fits(magnitude: u128, dim: u128, sqrt_dim: u128, bound4: &Integer) -> bool {
    let a = magnitude
        .saturating_mul(magnitude)
        .saturating_add(magnitude.saturating_mul(sqrt_dim));
    let need = a
        .saturating_mul(4)
        .saturating_add(a.div_ceil(1 << 18))
        .saturating_add(dim);
    *bound4 >= need
}

/// The largest M for ℓ = `dim`, m = `value_bits` and ζ² = `norm_bound` (module docs), or
/// None when not even M = 1 fits.
pub fn magnitude_for(dim: usize, value_bits: u32, norm_bound: &Integer) -> Option<u32> {
    // m ≤ 24 for valid parameters: 2^(m−1) − 1 < 2^23.
    let widest = (1u32 << value_bits.clamp(2, 24).saturating_sub(1)).saturating_sub(1);
    let dim = dim as u128;
    let sqrt_dim = ceil_sqrt(dim);
    let bound4 = Integer::from(norm_bound * 4u32);
    if !fits(1, dim, sqrt_dim, &bound4) {
        return None;
    }
    // fits() is monotonic in M: binary search for the largest in [1, widest].
    let (mut low, mut high) = (1u32, widest.max(1));
    while low < high {
        let mid = low + (high - low).div_ceil(2);
        if fits(u128::from(mid), dim, sqrt_dim, &bound4) {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    Some(low)
}

impl Quantizer {
    /// The quantiser of `params` (ℓ, m, ζ²): M from [`magnitude_for`].
    pub fn new(params: &Params) -> Result<Self, QuantizeError> {
        let magnitude = magnitude_for(params.dim(), params.value_bits(), params.norm_bound())
            .ok_or_else(|| QuantizeError::NoMagnitude {
                dim: params.dim(),
                norm_bound: params.norm_bound().clone(),
            })?;
        Ok(Self {
            dim: params.dim(),
            magnitude,
            norm_bound: params.norm_bound().clone(),
        })
    }

    /// ℓ.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// M: the scale factor and the largest |q_i|.
    pub fn magnitude(&self) -> u32 {
        self.magnitude
    }

    /// Normalises a float embedding of dimension ℓ and rounds it: the template u of a device
    /// or the measurement w of a terminal, within ‖q‖² ≤ ζ² and m-bit elements (module docs).
    /// Refuses a wrong dimension, NaN/Inf and the zero vector.
    pub fn quantize(&self, embedding: &[f64]) -> Result<Vec<i32>, QuantizeError> {
        embedding::check_dimension(embedding, self.dim)?;
        let unit = embedding::normalize(embedding)?;
        let q = embedding::quantize(&unit, self.magnitude)?;
        if self.norm_bound < squared_norm(&q) {
            return Err(QuantizeError::NormExceeded);
        }
        Ok(q)
    }

    /// A cosine similarity threshold T ∈ [−1, 1] in the units of the quantised inner product:
    /// θ = round(T · M²), so |θ| ≤ M² ≤ ζ² (what the protocols accept).
    pub fn quantize_threshold(&self, similarity: f64) -> Result<i64, QuantizeError> {
        if !similarity.is_finite() || !(-1.0..=1.0).contains(&similarity) {
            return Err(QuantizeError::BadThreshold(similarity));
        }
        let m2 = f64::from(self.magnitude) * f64::from(self.magnitude);
        // |T·M²| ≤ M² < 2^46: exact in i64.
        Ok((similarity * m2).round() as i64)
    }
}

/// The plaintext reference the protocols must agree with ([ABMR20] §3, Fig. 1: the match
/// bit is [⟨u, w⟩ ≥ T]) on quantised templates.
pub fn plaintext_match(u: &[i32], w: &[i32], threshold: i64) -> bool {
    dot(u, w) >= threshold
}

#[cfg(test)]
mod tests {
    use super::super::params::{Protocol, DEFAULT_STAT_BITS};
    use super::*;
    use proptest::prelude::{prop, prop_assert, proptest, ProptestConfig};

    fn params(dim: usize, m: u32, norm: Integer) -> Params {
        Params::new(Protocol::Pi2, dim, m, 2048, DEFAULT_STAT_BITS, norm).expect("params")
    }

    fn check_bound(q: &Quantizer, m: u32, embedding: &[f64]) {
        let u = q.quantize(embedding).expect("quantises");
        assert!(q.norm_bound >= squared_norm(&u));
        let limit = 1i64 << (m - 1);
        assert!(u
            .iter()
            .all(|&x| -limit <= i64::from(x) && i64::from(x) < limit));
    }

    #[test]
    fn the_magnitude_is_the_largest_that_fits() {
        for (dim, m, norm) in [
            (128usize, 16u32, Integer::from(1u64 << 30)),
            (128, 12, Integer::from(1u64 << 20)),
            (512, 24, Integer::from(1u64 << 40)),
            (4096, 8, Integer::from(50_000)),
            (7, 4, Integer::from(60)),
        ] {
            let p = params(dim, m, norm.clone());
            let big_m = Quantizer::new(&p).expect("some M").magnitude();
            let (d, s) = (dim as u128, ceil_sqrt(dim as u128));
            let bound4 = Integer::from(&norm * 4u32);
            assert!(fits(u128::from(big_m), d, s, &bound4));
            let widest = (1u32 << (m - 1)) - 1;
            assert!(big_m == widest || !fits(u128::from(big_m) + 1, d, s, &bound4));
            assert!(Integer::from(big_m) * big_m <= norm);
        }
        // The widest bound ℓ·2^(2(m−1)) leaves the element width as the only limit.
        let p = params(128, 16, Params::max_norm_bound(128, 16));
        assert_eq!(Quantizer::new(&p).expect("M").magnitude(), (1 << 15) - 1);
        // ζ² below what one rounded unit vector can reach: refused, naming ζ² and ℓ.
        let tiny = params(4096, 8, Integer::from(1000));
        let err = Quantizer::new(&tiny).expect_err("no M");
        assert!(err.to_string().contains("ℓ = 4096"), "{err}");
        assert_eq!(ceil_sqrt(0), 0);
        assert_eq!(ceil_sqrt(16), 4);
        assert_eq!(ceil_sqrt(17), 5);
    }

    #[test]
    fn adversarial_unit_vectors_stay_within_the_bound() {
        for (dim, m, norm) in [
            (128usize, 16u32, Integer::from(1u64 << 30)),
            (256, 10, Integer::from(300_000)),
            (1000, 12, Integer::from(5_000_000)),
            (4096, 8, Integer::from(60_000)),
        ] {
            let q = Quantizer::new(&params(dim, m, norm)).expect("M");
            // After normalisation only directions matter. k equal entries (signs alternating)
            // maximise ‖x‖₁ on their support, and as k runs over 1..=ℓ the rounding of M/√k
            // sweeps the fractional parts, including those just above 1/2 (rounded up).
            let mut worst = 0i64;
            for k in 1..=dim {
                let x: Vec<f64> = (0..dim)
                    .map(|i| match (i < k, i % 2) {
                        (false, _) => 0.0,
                        (true, 0) => 1.0,
                        (true, _) => -1.0,
                    })
                    .collect();
                check_bound(&q, m, &x);
                worst = worst.max(squared_norm(&q.quantize(&x).expect("q")));
            }
            // The sweep does exceed M² (rounding raises the norm), within ζ².
            assert!(worst > i64::from(q.magnitude()).pow(2), "{dim}: {worst}");
            // One large coordinate and the rest just above a rounding boundary.
            let big_m = f64::from(q.magnitude());
            let mut spike = vec![0.5001 / big_m; dim];
            spike[0] = 1.0;
            check_bound(&q, m, &spike);
        }
        // Why the margin: the naive M (the largest with M² ≤ ζ²) breaks the bound. ℓ = 1000,
        // ζ² = 5·10^6: M = 2236, and all |x_i| = 1/√1000 round 70.7 up to 71: 1000·71² > ζ².
        let norm = Integer::from(5_000_000);
        let naive = norm.clone().sqrt().to_u32().expect("small");
        let flat = embedding::normalize(&[1.0; 1000]).expect("unit");
        let over = embedding::quantize(&flat, naive).expect("q");
        assert!(norm < squared_norm(&over));
        let q = Quantizer::new(&params(1000, 16, norm)).expect("M");
        assert!(q.magnitude() < naive);
        check_bound(&q, 16, &flat);
    }

    #[test]
    fn bad_inputs_and_thresholds_are_refused() {
        let q = Quantizer::new(&params(8, 8, Integer::from(10_000))).expect("M");
        assert_eq!(
            q.quantize(&[0.5; 7]),
            Err(QuantizeError::Embedding(EmbeddingError::WrongDimension {
                expected: 8,
                got: 7
            }))
        );
        assert_eq!(
            q.quantize(&[0.0; 8]),
            Err(QuantizeError::Embedding(EmbeddingError::ZeroVector))
        );
        let mut nan = [0.5; 8];
        nan[3] = f64::NAN;
        assert_eq!(
            q.quantize(&nan),
            Err(QuantizeError::Embedding(EmbeddingError::NotFinite {
                index: 3
            }))
        );
        for bad in [1.01, -1.5, f64::NAN, f64::INFINITY] {
            assert!(q.quantize_threshold(bad).is_err(), "{bad}");
        }
        let m2 = i64::from(q.magnitude()).pow(2);
        assert_eq!(q.quantize_threshold(1.0), Ok(m2));
        assert_eq!(q.quantize_threshold(-1.0), Ok(-m2));
        // Unnormalised input is normalised: a vector and its multiple quantise alike.
        let x = [3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let y: Vec<f64> = x.iter().map(|v| v * 1e6).collect();
        assert_eq!(q.quantize(&x), q.quantize(&y));
        let u = q.quantize(&x).expect("u");
        assert!(plaintext_match(
            &u,
            &u,
            q.quantize_threshold(0.99).expect("θ")
        ));
        assert!(!plaintext_match(&u, &u, m2 + 1));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Every normalised embedding quantises within ‖q‖² ≤ ζ² and m-bit elements, for
        /// parameters whose ζ² is just large enough for some M.
        #[test]
        fn every_unit_vector_quantises_within_the_proved_norm(
            raw in prop::collection::vec(-1.0f64..1.0, 1..600),
            m in 4u32..=20,
            extra in 0u64..5_000,
            scale in 0u32..6,
        ) {
            let dim = raw.len();
            // ζ² from a small M upwards, so the binding constraint varies.
            let base = (dim as u64 + 2 * (dim as f64).sqrt().ceil() as u64 + 4) << scale;
            let norm = Integer::from(base + extra).min(Params::max_norm_bound(dim, m));
            let Ok(p) = Params::new(Protocol::Pi3, dim, m, 2048, DEFAULT_STAT_BITS, norm) else {
                return Ok(());
            };
            let q = Quantizer::new(&p).expect("an M exists for ζ² ≥ (1 + √ℓ/2)²");
            match q.quantize(&raw) {
                Ok(u) => {
                    prop_assert!(*p.norm_bound() >= squared_norm(&u));
                    let limit = 1i64 << (m - 1);
                    prop_assert!(u.iter().all(|&x| -limit <= i64::from(x) && i64::from(x) < limit));
                }
                Err(e) => prop_assert!(e == QuantizeError::Embedding(EmbeddingError::ZeroVector)),
            }
        }
    }
}
