//! # Float embeddings as integers: the quantisation the face modalities share
//!
//! Face-recognition models output float vectors; the matching protocols compute on integers.
//! This layer holds what every modality does the same way:
//!
//! * strict element checks: NaN and infinities are refused, and so is any element outside
//!   [−1, 1] (an L2-normalised embedding always lies inside; a larger element could overflow
//!   the integer bounds a modality sizes its protocol for), each error naming the element;
//! * L2 normalisation ([`normalize`]), refusing the zero vector;
//! * element-wise rounding q_i = round(x_i · M) for a magnitude M ([`quantize`]), so that
//!   |q_i| ≤ M;
//! * the integer inner product ([`dot`]), the plaintext reference of the protocols.
//!
//! The choice of M, and the bound it must keep, belongs to each modality: Funshade's
//! overflow bound of the secure comparison (`face::quantize`, [ICO23] with the bound of
//! [BM25] §4.1), the packed-Paillier norm bound ζ² its enrolment proof enforces
//! (`paillier::quantize`, [ABMR20] §8.3). Nothing here is secret-dependent beyond the values
//! themselves, and errors name positions, never values other than the out-of-range element
//! reported to its owner.

/// The largest magnitude M accepted: round(x · M) with |x| ≤ 1 then fits an `i32`.
pub const MAX_MAGNITUDE: u32 = 1 << 30;

/// Why an embedding cannot be quantised. Names the element; the one value it carries is an
/// out-of-range input element, reported to its owner.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmbeddingError {
    /// An element is NaN or infinite.
    #[error("embedding element {index} is not a finite number")]
    NotFinite {
        /// Position of the element.
        index: usize,
    },
    /// An element lies outside [−1, 1]: quantising it could break the integer bounds.
    #[error("embedding element {index} is {value}, outside [-1, 1]: quantising it could overflow the integer bounds of the secure comparison (normalise the embedding)")]
    OutOfRange {
        /// Position of the element.
        index: usize,
        /// Its value.
        value: f64,
    },
    /// The zero vector cannot be normalised.
    #[error("the embedding is the zero vector and cannot be normalised")]
    ZeroVector,
    /// The embedding has another dimension than the deployment's.
    #[error("wrong embedding dimension: expected {expected}, got {got}")]
    WrongDimension {
        /// The dimension required.
        expected: usize,
        /// The dimension found.
        got: usize,
    },
    /// A magnitude M outside 1..=[`MAX_MAGNITUDE`] (a modality's derivation gave none).
    #[error("quantisation magnitude {0}: it must be 1 to 2^30")]
    BadMagnitude(u32),
}

/// Checks that every element is finite (NaN and infinities are refused, naming the first).
pub fn check_finite(embedding: &[f64]) -> Result<(), EmbeddingError> {
    match embedding.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(EmbeddingError::NotFinite { index }),
        None => Ok(()),
    }
}

/// Checks that `embedding` has `expected` elements.
pub fn check_dimension(embedding: &[f64], expected: usize) -> Result<(), EmbeddingError> {
    if embedding.len() == expected {
        Ok(())
    } else {
        Err(EmbeddingError::WrongDimension {
            expected,
            got: embedding.len(),
        })
    }
}

/// L2-normalises an embedding. Refuses NaN/Inf and the zero vector. Every element of the
/// result lies in [−1, 1] (clamped against rounding), and its squared norm is 1 within a
/// relative error of about (len + 4)·2^−53.
pub fn normalize(embedding: &[f64]) -> Result<Vec<f64>, EmbeddingError> {
    check_finite(embedding)?;
    let norm = embedding.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return Err(EmbeddingError::ZeroVector);
    }
    Ok(embedding
        .iter()
        .map(|x| (x / norm).clamp(-1.0, 1.0))
        .collect())
}

/// Quantises an embedding whose elements lie in [−1, 1]: q_i = round(x_i · M) (half away from
/// zero), so |q_i| ≤ M. Refuses NaN/Inf, elements outside [−1, 1] and a magnitude outside
/// 1..=[`MAX_MAGNITUDE`]; the dimension is the caller's to check.
pub fn quantize(embedding: &[f64], magnitude: u32) -> Result<Vec<i32>, EmbeddingError> {
    if magnitude == 0 || magnitude > MAX_MAGNITUDE {
        return Err(EmbeddingError::BadMagnitude(magnitude));
    }
    let scale = f64::from(magnitude);
    embedding
        .iter()
        .enumerate()
        .map(|(index, &x)| {
            if !x.is_finite() {
                return Err(EmbeddingError::NotFinite { index });
            }
            if !(-1.0..=1.0).contains(&x) {
                return Err(EmbeddingError::OutOfRange { index, value: x });
            }
            // |x| ≤ 1 and M ≤ 2^30 is exact in f64, so |x·M| ≤ M (rounding is monotonic)
            // and the cast is exact.
            Ok((x * scale).round() as i32)
        })
        .collect()
}

/// The inner product ⟨x, y⟩ of two integer vectors (of equal length; extra elements of the
/// longer one are ignored). Exact whenever Σ|x_i·y_i| < 2^63, which every pair of quantised
/// embeddings meets (Funshade: < 2^28; packed Paillier: ≤ ζ² ≤ 2^58); the arithmetic is
/// explicitly wrapping beyond that.
pub fn dot(x: &[i32], y: &[i32]) -> i64 {
    x.iter().zip(y).fold(0i64, |acc, (&a, &b)| {
        acc.wrapping_add(i64::from(a).wrapping_mul(i64::from(b)))
    })
}

/// The squared L2 norm ‖x‖² of an integer vector (exact under the bound of [`dot`]).
pub fn squared_norm(x: &[i32]) -> i64 {
    dot(x, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop, proptest, ProptestConfig};

    #[test]
    fn bad_inputs_are_refused_with_the_element_named() {
        assert_eq!(
            check_finite(&[0.0, f64::NAN]),
            Err(EmbeddingError::NotFinite { index: 1 })
        );
        assert_eq!(
            check_finite(&[f64::NEG_INFINITY]),
            Err(EmbeddingError::NotFinite { index: 0 })
        );
        assert_eq!(
            quantize(&[0.5, 1.0001], 100),
            Err(EmbeddingError::OutOfRange {
                index: 1,
                value: 1.0001
            })
        );
        assert_eq!(
            quantize(&[0.5, f64::INFINITY], 100),
            Err(EmbeddingError::NotFinite { index: 1 })
        );
        assert_eq!(quantize(&[0.5], 0), Err(EmbeddingError::BadMagnitude(0)));
        assert_eq!(
            quantize(&[0.5], MAX_MAGNITUDE + 1),
            Err(EmbeddingError::BadMagnitude(MAX_MAGNITUDE + 1))
        );
        assert_eq!(normalize(&[0.0; 4]), Err(EmbeddingError::ZeroVector));
        assert_eq!(
            normalize(&[1.0, f64::NAN]),
            Err(EmbeddingError::NotFinite { index: 1 })
        );
        assert_eq!(
            check_dimension(&[0.0; 3], 4),
            Err(EmbeddingError::WrongDimension {
                expected: 4,
                got: 3
            })
        );
        assert!(EmbeddingError::OutOfRange {
            index: 5,
            value: 1.5
        }
        .to_string()
        .contains("element 5 is 1.5, outside [-1, 1]"));
    }

    #[test]
    fn rounding_is_half_away_from_zero_and_bounded_by_the_magnitude() {
        assert_eq!(
            quantize(&[0.5, -0.5, 0.25, -1.0, 1.0], 3).ok(),
            Some(vec![2, -2, 1, -3, 3])
        );
        assert_eq!(
            quantize(&[1.0, -1.0], MAX_MAGNITUDE).ok(),
            Some(vec![1 << 30, -(1 << 30)])
        );
        assert_eq!(dot(&[1, -2, 3], &[4, 5, -6]), 4 - 10 - 18);
        assert_eq!(squared_norm(&[3, 4]), 25);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Normalised vectors lie in [−1, 1], have unit norm, and quantise within ±M.
        #[test]
        fn normalised_vectors_quantise_within_the_magnitude(
            raw in prop::collection::vec(-1e6f64..1e6, 1..300),
            magnitude in 1u32..=MAX_MAGNITUDE,
        ) {
            if let Ok(unit) = normalize(&raw) {
                let norm: f64 = unit.iter().map(|x| x * x).sum();
                assert!((norm - 1.0).abs() < 1e-9, "{norm}");
                let q = quantize(&unit, magnitude).expect("in range");
                let m = i64::from(magnitude);
                for (&qi, &xi) in q.iter().zip(&unit) {
                    assert!(i64::from(qi).abs() <= m);
                    // round(x·M) is within 1/2 of x·M.
                    assert!((f64::from(qi) - xi * f64::from(magnitude)).abs() <= 0.5 + 1e-6);
                }
            }
        }

        /// The integer inner product is symmetric and bilinear in each argument.
        #[test]
        fn dot_is_exact_on_small_values(
            x in prop::collection::vec(-(1i32 << 20)..(1 << 20), 0..64),
            y in prop::collection::vec(-(1i32 << 20)..(1 << 20), 0..64),
        ) {
            let n = x.len().min(y.len());
            let exact: i128 = x[..n].iter().zip(&y[..n]).map(|(&a, &b)| i128::from(a) * i128::from(b)).sum();
            assert_eq!(i128::from(dot(&x, &y)), exact);
            assert_eq!(dot(&x, &y), dot(&y, &x));
        }
    }
}
