//! The power-of-two rings Z_2^16 and Z_2^32 that every privmatch protocol computes in.
//!
//! Both are represented by [`std::num::Wrapping`] over the matching unsigned integer, so every
//! `+`, `-`, `*` and unary `-` is arithmetic modulo 2^k by construction: there is no overflow to
//! check and no way to accidentally use saturating or panicking integer arithmetic.
//!
//! Z_2^16 is the ring of the iris dot products ([BGK+24] §4.1: 12,800 terms in {−1, 0, 1} fit in
//! 16 bits); Z_2^32 is the ring the mask dot product is lifted to before the comparison, and the
//! ring of the Funshade gates (Funshade [ICO23]).

use std::fmt::Debug;
use std::num::Wrapping;
use std::ops::{Add, AddAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use rand_core::RngCore;

/// The ring Z_2^16 (wrapping 16-bit arithmetic).
pub type Z16 = Wrapping<u16>;

/// The ring Z_2^32 (wrapping 32-bit arithmetic).
pub type Z32 = Wrapping<u32>;

/// An element of a ring Z_2^k with wrapping arithmetic.
///
/// Implemented for [`Z16`] and [`Z32`]. Generic protocol code (replicated sharing, the
/// comparison circuit) is written against this trait so it runs over either ring.
pub trait RingElement:
    Copy
    + Eq
    + Debug
    + Default
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
{
    /// The bit width k of the ring Z_2^k.
    ///
    /// On the concrete aliases write `<Z16 as RingElement>::BITS`: std has an unstable inherent
    /// `Wrapping::<u16>::BITS` whose name collides (generic `T::BITS` is unaffected).
    const BITS: u32;

    /// The additive identity 0.
    fn zero() -> Self;

    /// The multiplicative identity 1.
    fn one() -> Self;

    /// A uniformly random ring element drawn from `rng`.
    fn random<R: RngCore + ?Sized>(rng: &mut R) -> Self;

    /// Reduces `value` modulo 2^k (keeps its low `BITS` bits).
    fn from_u64(value: u64) -> Self;

    /// The canonical representative in 0..2^k, widened to `u64`.
    fn to_u64(self) -> u64;
}

impl RingElement for Z16 {
    const BITS: u32 = 16;

    fn zero() -> Self {
        Wrapping(0)
    }

    fn one() -> Self {
        Wrapping(1)
    }

    fn random<R: RngCore + ?Sized>(rng: &mut R) -> Self {
        // Truncation keeps the low 16 bits, which are uniform.
        Wrapping(rng.next_u32() as u16)
    }

    fn from_u64(value: u64) -> Self {
        Wrapping(value as u16)
    }

    fn to_u64(self) -> u64 {
        u64::from(self.0)
    }
}

impl RingElement for Z32 {
    const BITS: u32 = 32;

    fn zero() -> Self {
        Wrapping(0)
    }

    fn one() -> Self {
        Wrapping(1)
    }

    fn random<R: RngCore + ?Sized>(rng: &mut R) -> Self {
        Wrapping(rng.next_u32())
    }

    fn from_u64(value: u64) -> Self {
        Wrapping(value as u32)
    }

    fn to_u64(self) -> u64 {
        u64::from(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    /// Checks the commutative ring axioms on one triple of elements.
    fn check_axioms<T: RingElement>(a: T, b: T, c: T) {
        assert_eq!(a + b, b + a, "addition commutes");
        assert_eq!((a + b) + c, a + (b + c), "addition associates");
        assert_eq!(a + T::zero(), a, "0 is the additive identity");
        assert_eq!(a + (-a), T::zero(), "-a is the additive inverse");
        assert_eq!(a - b, a + (-b), "subtraction is adding the inverse");
        assert_eq!(a * b, b * a, "multiplication commutes");
        assert_eq!((a * b) * c, a * (b * c), "multiplication associates");
        assert_eq!(a * T::one(), a, "1 is the multiplicative identity");
        assert_eq!(a * (b + c), a * b + a * c, "distributivity");
        let mut d = a;
        d += b;
        d -= c;
        d *= b;
        assert_eq!(d, (a + b - c) * b, "compound assignment agrees");
    }

    proptest! {
        #[test]
        fn z16_ring_axioms(a: u16, b: u16, c: u16) {
            check_axioms(Wrapping(a), Wrapping(b), Wrapping(c));
        }

        #[test]
        fn z32_ring_axioms(a: u32, b: u32, c: u32) {
            check_axioms(Wrapping(a), Wrapping(b), Wrapping(c));
        }

        #[test]
        fn z16_reduces_modulo_2_16(v: u64) {
            prop_assert_eq!(Z16::from_u64(v).to_u64(), v % (1 << 16));
        }

        #[test]
        fn z32_reduces_modulo_2_32(v: u64) {
            prop_assert_eq!(Z32::from_u64(v).to_u64(), v % (1 << 32));
        }
    }

    #[test]
    fn wrapping_at_the_boundary() {
        assert_eq!(Z16::from_u64(0xFFFF) + Z16::one(), Z16::zero());
        assert_eq!(-Z32::one(), Wrapping(u32::MAX));
        assert_eq!(<Z16 as RingElement>::BITS, 16);
        assert_eq!(<Z32 as RingElement>::BITS, 32);
    }

    #[test]
    fn random_elements_use_the_whole_range() {
        // With 4,000 draws every one of the 16 top-nibble buckets of a uniform Z16 gets
        // ~250 hits; a generator stuck in part of the range (e.g. only 8 bits) fails this.
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let mut top = [0u32; 16];
        let mut low = [0u32; 16];
        for _ in 0..4000 {
            let v = Z16::random(&mut rng).0;
            top[usize::from(v >> 12)] += 1;
            low[usize::from(v & 15)] += 1;
        }
        for count in top.iter().chain(low.iter()) {
            assert!(
                (150..350).contains(count),
                "bucket count {count} out of range"
            );
        }
        let mut top32 = [0u32; 16];
        for _ in 0..4000 {
            top32[(Z32::random(&mut rng).0 >> 28) as usize] += 1;
        }
        for count in top32 {
            assert!(
                (150..350).contains(&count),
                "bucket count {count} out of range"
            );
        }
    }
}
