//! Quantisation of float face embeddings into Z_2^32, with the overflow bound of Funshade [ICO23]
//! §4.1, and the plaintext reference the protocol must agree with.
//!
//! An embedding of dimension l (128..=1024) whose elements lie in [−1, 1] (L2-normalised
//! embeddings always do) is quantised element-wise to `q_i = round(x_i · M)`, so |q_i| ≤ M.
//! M is the largest integer with **l · M² < 2^28** — [BM25] §4.1's bound
//! `m < 2^((n − log2 l)/2)` (strict `<`, the paper's correction of the C code's `≤`) with a
//! budget of n = 28 bits rather than 32, because of two bits the comparison needs on top of
//! the metric itself:
//!
//! * squared Euclidean distance multiplies the bound by 4: (q_x − q_y)_i² ≤ (2M)², so
//!   ‖q_x − q_y‖² ≤ 4·l·M² < 2^30 (one M serves both metrics, so templates do not depend on
//!   the metric the dealer configures);
//! * the sign gate decides `v ≥ 0` for v = metric − θ (or θ − metric) read as a signed
//!   32-bit value, so |v| must stay below 2^31: with |metric| < 2^30 and a threshold in the
//!   metric's range, |v| < 2^31 holds with room to spare.
//!
//! Intermediate values wrap in Z_2^32 (the protocol is linear there); only v must not.
//! Elements outside [−1, 1], NaN and infinities are refused: such an input could overflow.
//! The element checks, normalisation, rounding and the inner product are the shared layer
//! [`crate::embedding`]'s (the packed-Paillier modality quantises with them too, under its
//! own M); what is Funshade's here is the choice of M, the threshold and the metrics.
//!
//! | l | M | l·M² |
//! |---|---|---|
//! | 128 | 1,448 | 268,378,112 |
//! | 512 | 724 | 268,378,112 |
//! | 1024 | 511 | 267,387,904 (1024 · 512² = 2^28 is excluded by the strict bound) |

use super::{FaceError, Metric};
use crate::embedding::{self, dot};

/// Smallest supported embedding dimension.
pub const MIN_DIM: usize = 128;
/// Largest supported embedding dimension.
pub const MAX_DIM: usize = 1024;
/// Bit budget of the metric value (see the module docs): l · M² < 2^METRIC_BITS.
pub const METRIC_BITS: u32 = 28;

/// Checks that `dim` is a supported embedding dimension.
pub fn check_dim(dim: usize) -> Result<(), FaceError> {
    if (MIN_DIM..=MAX_DIM).contains(&dim) {
        Ok(())
    } else {
        Err(FaceError::UnsupportedDimension(dim))
    }
}

/// The quantisation of one deployment dimension: q = round(x · M).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantizer {
    dim: usize,
    magnitude: u32,
}

impl Quantizer {
    /// The quantiser for embeddings of dimension `dim` (128..=1024).
    pub fn new(dim: usize) -> Result<Self, FaceError> {
        check_dim(dim)?;
        Ok(Quantizer {
            dim,
            magnitude: max_magnitude(dim),
        })
    }

    /// The embedding dimension l.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// M: the largest |q_i|, and the scale factor.
    pub fn magnitude(&self) -> u32 {
        self.magnitude
    }

    /// Quantises an embedding whose elements lie in [−1, 1] ([`embedding::quantize`] with this
    /// dimension's M). Refuses a wrong dimension, NaN/Inf, and elements outside [−1, 1] (they
    /// could overflow the comparison).
    pub fn quantize(&self, embedding: &[f64]) -> Result<Vec<i32>, FaceError> {
        if embedding.len() != self.dim {
            return Err(FaceError::WrongDimension {
                expected: self.dim,
                got: embedding.len(),
            });
        }
        Ok(embedding::quantize(embedding, self.magnitude)?)
    }

    /// Quantises a threshold given in the metric's float units (a cosine similarity, or a
    /// squared Euclidean distance between embeddings with elements in [−1, 1]) to the units of
    /// quantised values: θ_q = round(θ · M²). Refuses a threshold outside the metric's range.
    pub fn quantize_threshold(&self, metric: Metric, threshold: f64) -> Result<i64, FaceError> {
        let range = match metric {
            Metric::Cosine => -1.0..=1.0,
            Metric::Euclidean => 0.0..=4.0 * self.dim as f64,
        };
        if !threshold.is_finite() || !range.contains(&threshold) {
            return Err(FaceError::BadThreshold {
                metric,
                value: threshold,
            });
        }
        let m2 = f64::from(self.magnitude) * f64::from(self.magnitude);
        Ok((threshold * m2).round() as i64)
    }
}

/// M for dimension `dim`: the largest integer with dim · M² < 2^28.
pub fn max_magnitude(dim: usize) -> u32 {
    let budget = 1u64 << METRIC_BITS;
    let dim = dim.max(1) as u64;
    // Start from the float estimate and correct it, so rounding cannot break the strict bound.
    let mut m = ((budget as f64 / dim as f64).sqrt()) as u64;
    while m > 0 && dim * m * m >= budget {
        m -= 1;
    }
    while dim * (m + 1) * (m + 1) < budget {
        m += 1;
    }
    m as u32
}

/// Squared Euclidean distance of two quantised embeddings (exact: < 2^30; the arithmetic is
/// explicitly wrapping beyond that).
pub fn squared_distance(x: &[i32], y: &[i32]) -> i64 {
    x.iter().zip(y).fold(0i64, |acc, (&a, &b)| {
        let d = i64::from(a).wrapping_sub(i64::from(b));
        acc.wrapping_add(d.wrapping_mul(d))
    })
}

/// The plaintext reference: does probe `x` match template `y` under `metric` with quantised
/// threshold `threshold`? Cosine: x·y ≥ θ. Euclidean: ‖x − y‖² ≤ θ.
pub fn plaintext_match(metric: Metric, x: &[i32], y: &[i32], threshold: i64) -> bool {
    match metric {
        Metric::Cosine => dot(x, y) >= threshold,
        Metric::Euclidean => squared_distance(x, y) <= threshold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedding::{normalize, EmbeddingError};

    #[test]
    fn magnitude_is_the_largest_satisfying_the_strict_bound() {
        for dim in [MIN_DIM, 129, 256, 500, 512, 1000, MAX_DIM] {
            let m = u64::from(max_magnitude(dim));
            let d = dim as u64;
            assert!(d * m * m < 1 << METRIC_BITS, "dim {dim}");
            assert!(d * (m + 1) * (m + 1) >= 1 << METRIC_BITS, "dim {dim}");
        }
        assert_eq!(max_magnitude(128), 1448);
        assert_eq!(max_magnitude(512), 724);
        // 1024 · 512² = 2^28 exactly: the strict bound excludes it.
        assert_eq!(max_magnitude(1024), 511);
    }

    #[test]
    fn extreme_inputs_stay_inside_the_sign_gate_range() {
        for dim in [MIN_DIM, 512, MAX_DIM] {
            let q = Quantizer::new(dim).unwrap();
            let ones = q.quantize(&vec![1.0; dim]).unwrap();
            let minus = q.quantize(&vec![-1.0; dim]).unwrap();
            let worst_dist = squared_distance(&ones, &minus);
            let worst_theta = q
                .quantize_threshold(Metric::Euclidean, 4.0 * dim as f64)
                .unwrap();
            assert!(worst_dist < 1 << 30);
            assert!(worst_theta.abs() < 1 << 31);
            assert!((worst_theta - worst_dist).abs() < 1 << 31);
            let worst_dot = dot(&ones, &ones);
            let low_theta = q.quantize_threshold(Metric::Cosine, -1.0).unwrap();
            assert!((worst_dot - low_theta).abs() < 1 << 31);
        }
    }

    #[test]
    fn bad_inputs_are_refused_with_the_element_named() {
        let q = Quantizer::new(128).unwrap();
        assert_eq!(
            q.quantize(&[0.0; 127]),
            Err(FaceError::WrongDimension {
                expected: 128,
                got: 127
            })
        );
        let mut e = vec![0.0; 128];
        let not_finite = Err(FaceError::Embedding(EmbeddingError::NotFinite { index: 5 }));
        e[5] = f64::NAN;
        assert_eq!(q.quantize(&e), not_finite);
        e[5] = f64::INFINITY;
        assert_eq!(q.quantize(&e), not_finite);
        e[5] = 1.0001;
        assert!(matches!(
            q.quantize(&e),
            Err(FaceError::Embedding(EmbeddingError::OutOfRange {
                index: 5,
                ..
            }))
        ));
        assert_eq!(normalize(&[0.0; 4]), Err(EmbeddingError::ZeroVector));
        assert!(Quantizer::new(127).is_err());
        assert!(Quantizer::new(1025).is_err());
        assert!(q.quantize_threshold(Metric::Cosine, 1.5).is_err());
        assert!(q.quantize_threshold(Metric::Euclidean, -0.1).is_err());
        assert!(q.quantize_threshold(Metric::Cosine, f64::NAN).is_err());
    }

    #[test]
    fn normalised_embeddings_quantise_to_the_expected_scale() {
        let q = Quantizer::new(128).unwrap();
        let mut e = vec![0.0; 128];
        e[0] = 3.0;
        e[1] = 4.0;
        let n = normalize(&e).unwrap();
        let v = q.quantize(&n).unwrap();
        assert_eq!(v[0], (0.6f64 * 1448.0).round() as i32);
        assert_eq!(v[1], (0.8f64 * 1448.0).round() as i32);
        assert!(plaintext_match(
            Metric::Cosine,
            &v,
            &v,
            q.quantize_threshold(Metric::Cosine, 0.99).unwrap()
        ));
        assert!(plaintext_match(Metric::Euclidean, &v, &v, 0));
    }
}
