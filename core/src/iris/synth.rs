//! Synthetic iris templates for tests and benchmarks.
//!
//! Real iris codes are close to uniformly random bits, so a random template is a fair stand-in
//! for an unrelated enrolled iris (fractional Hamming distance ≈ 0.5 to anything else), and a
//! rotated template with a fraction of its bits flipped stands in for a second capture of the
//! same eye.

use rand::Rng;
use rand_core::RngCore;

use super::template::{IrisBits, IrisTemplate, IRIS_CODE_BITS, IRIS_CODE_WORDS};

/// Fraction of (row, column, wavelet) positions that [`random_template`] masks out.
pub const MASK_CLEAR_RATE: f64 = 0.1;

/// A random template: uniformly random code bits, and a mask that is all ones except that each
/// (row, column, wavelet) position is masked out independently with probability
/// [`MASK_CLEAR_RATE`] (10%). The real and imaginary mask bits of a position are always
/// cleared together, so the mask stays duplicated along the last axis, as Open-IRIS masks are
/// and as the share encoding requires.
pub fn random_template<R: RngCore + ?Sized>(rng: &mut R) -> IrisTemplate {
    let mut words = [0u64; IRIS_CODE_WORDS];
    for w in words.iter_mut() {
        *w = rng.next_u64();
    }
    let code = IrisBits::from_words(words);
    let mut mask = IrisBits::ones();
    for pair in 0..IRIS_CODE_BITS / 2 {
        if rng.gen_bool(MASK_CLEAR_RATE) {
            mask.set(2 * pair, false);
            mask.set(2 * pair + 1, false);
        }
    }
    IrisTemplate::new(code, mask)
}

/// A simulated second capture of the same eye: `t` rotated by `rotation` columns (code and
/// mask, [`IrisTemplate::rotate`]), then every code bit flipped independently with probability
/// `flip_rate`. The mask is only rotated. `flip_rate` is clamped to \[0, 1\] (NaN counts as 0).
///
/// Matching the result against `t` gives a minimum fractional Hamming distance ≈ `flip_rate`,
/// attained at rotation −`rotation` of the result.
pub fn near_duplicate<R: RngCore + ?Sized>(
    t: &IrisTemplate,
    flip_rate: f64,
    rotation: i32,
    rng: &mut R,
) -> IrisTemplate {
    let p = if flip_rate.is_nan() {
        0.0
    } else {
        flip_rate.clamp(0.0, 1.0)
    };
    let mut out = t.rotate(rotation);
    for i in 0..IRIS_CODE_BITS {
        // gen::<f64>() is in [0, 1): p = 0 never flips, p = 1 always does.
        if rng.gen::<f64>() < p {
            let bit = out.code.get(i);
            out.code.set(i, !bit);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::template::{fractional_hamming_distance, min_fhd_with_rotation, MAX_ROTATION};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn random_masks_are_duplicated_and_about_ten_percent_cleared() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        for _ in 0..5 {
            let t = random_template(&mut rng);
            assert!(t.is_mask_duplicated_along_last_axis());
            let cleared =
                (IRIS_CODE_BITS as u32 - t.mask.popcount()) as f64 / IRIS_CODE_BITS as f64;
            // 6,400 independent positions: standard deviation of the rate ≈ 0.0037.
            assert!((cleared - 0.1).abs() < 0.015, "cleared fraction {cleared}");
            let ones = t.code.popcount() as f64 / IRIS_CODE_BITS as f64;
            assert!((ones - 0.5).abs() < 0.02, "code ones fraction {ones}");
        }
    }

    #[test]
    fn unrelated_templates_are_far_apart() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let a = random_template(&mut rng);
        let b = random_template(&mut rng);
        let d = fractional_hamming_distance(&a, &b).expect("masks overlap");
        assert!((d - 0.5).abs() < 0.03, "fhd {d}");
        let (m, _) = min_fhd_with_rotation(&a, &b, MAX_ROTATION).expect("masks overlap");
        assert!(m > 0.4, "min fhd {m}");
    }

    #[test]
    fn near_duplicate_matches_at_the_opposite_rotation() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let t = random_template(&mut rng);
        let q = near_duplicate(&t, 0.1, 3, &mut rng);
        assert_eq!(q.mask, t.mask.rotate(3));
        let (m, k) = min_fhd_with_rotation(&q, &t, MAX_ROTATION).expect("masks overlap");
        assert!(m < 0.2, "min fhd {m}");
        assert!(
            (m - 0.1).abs() < 0.015,
            "min fhd {m} should be close to the flip rate"
        );
        assert_eq!(k, -3);
        // Unrotated, the near duplicate looks unrelated.
        let d = fractional_hamming_distance(&q, &t).expect("masks overlap");
        assert!(d > 0.4, "unrotated fhd {d}");
    }

    #[test]
    fn flip_rate_extremes_and_clamping() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let t = random_template(&mut rng);
        assert_eq!(near_duplicate(&t, 0.0, 0, &mut rng), t);
        assert_eq!(near_duplicate(&t, f64::NAN, -2, &mut rng), t.rotate(-2));
        let flipped = near_duplicate(&t, 1.0, 0, &mut rng);
        assert_eq!(flipped.code, !t.code);
        assert_eq!(near_duplicate(&t, 7.5, 0, &mut rng).code, !t.code);
        assert_eq!(near_duplicate(&t, -1.0, 5, &mut rng), t.rotate(5));
    }
}
