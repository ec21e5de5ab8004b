//! The Galois ring GR(2^16, 4) = Z_2^16\[x\] / (x^4 − x − 1).
//!
//! [BGK+24] §4.3.2 ("Shamir over Galois rings"): Shamir sharing needs evaluation points whose
//! pairwise differences are invertible, and Z_2^16 has only two such points (only odd numbers
//! are units). Extending Z_2^16 by a degree-4 polynomial that is irreducible modulo 2 gives a
//! local ring whose residue field is GF(16), so up to 16 exceptional points exist — enough for
//! three parties plus the secret at 0.
//!
//! Elements are stored in the monomial basis: `coefs[i]` is the coefficient of x^i, each a
//! wrapping 16-bit integer. Multiplication reduces with x^4 = x + 1 (so x^5 = x^2 + x and
//! x^6 = x^3 + x^2).

use std::num::Wrapping;
use std::ops::{Add, AddAssign, Mul, MulAssign, Neg, Sub, SubAssign};

use rand_core::RngCore;

use crate::party::PartyIndex;

/// An element of GR(2^16, 4) = Z_2^16\[x\] / (x^4 − x − 1) in the monomial basis.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct GaloisRing16 {
    /// `coefs[i]` is the coefficient of x^i, an element of Z_2^16.
    pub coefs: [u16; 4],
}

impl GaloisRing16 {
    /// The additive identity.
    pub const ZERO: Self = Self { coefs: [0; 4] };

    /// The multiplicative identity.
    pub const ONE: Self = Self {
        coefs: [1, 0, 0, 0],
    };

    /// The element x (the class of the indeterminate).
    pub const X: Self = Self {
        coefs: [0, 1, 0, 0],
    };

    /// The element with the given monomial coefficients (`coefs[i]` multiplies x^i).
    pub const fn from_coefs(coefs: [u16; 4]) -> Self {
        Self { coefs }
    }

    /// The element embedding the integer `value` of Z_2^16 (constant polynomial).
    pub const fn from_u16(value: u16) -> Self {
        Self {
            coefs: [value, 0, 0, 0],
        }
    }

    /// A uniformly random element: four independent uniform coefficients from `rng`.
    pub fn random<R: RngCore + ?Sized>(rng: &mut R) -> Self {
        let v = rng.next_u64();
        Self {
            coefs: [
                v as u16,
                (v >> 16) as u16,
                (v >> 32) as u16,
                (v >> 48) as u16,
            ],
        }
    }

    /// The reduction modulo 2 as a 4-bit GF(16) element: bit i is coefficient i mod 2.
    fn residue_mod_2(self) -> u8 {
        let mut r = 0u8;
        for (i, c) in self.coefs.iter().enumerate() {
            r |= ((c & 1) as u8) << i;
        }
        r
    }

    /// Whether the element is a unit (has a multiplicative inverse).
    ///
    /// GR(2^16, 4) is a local ring with maximal ideal (2): an element is a unit exactly when
    /// its reduction modulo 2 is a nonzero element of GF(16) = GF(2)\[x\]/(x^4 + x + 1).
    pub fn is_unit(self) -> bool {
        self.residue_mod_2() != 0
    }

    /// The multiplicative inverse, or `None` when the element is not a unit.
    ///
    /// Inverts the reduction modulo 2 by trying the 16 elements of GF(16), then lifts that
    /// inverse to Z_2^16 coefficients with Newton (Hensel) iterations y ← y·(2 − a·y); each
    /// iteration doubles the number of correct low bits (1 → 2 → 4 → 8 → 16).
    pub fn inverse(self) -> Option<Self> {
        let residue = self.residue_mod_2();
        if residue == 0 {
            return None;
        }
        let inv_mod_2 = (1u8..16).find(|&b| gf16_mul(residue, b) == 1)?;
        let mut y = Self::from_coefs([
            u16::from(inv_mod_2 & 1),
            u16::from((inv_mod_2 >> 1) & 1),
            u16::from((inv_mod_2 >> 2) & 1),
            u16::from((inv_mod_2 >> 3) & 1),
        ]);
        let two = Self::from_u16(2);
        for _ in 0..4 {
            y = y * (two - self * y);
        }
        // Cannot fail for a unit; checked so a logic error can never yield a wrong inverse.
        (self * y == Self::ONE).then_some(y)
    }

    /// The exceptional evaluation point of party `p` for Shamir sharing ([BGK+24] §4.3.2):
    /// P0 → 1, P1 → x, P2 → 1 + x. The secret sits at 0.
    ///
    /// All three points and all their pairwise differences (1 − x, −x, −1) are units, which is
    /// what Lagrange interpolation needs.
    pub fn exceptional_point(p: PartyIndex) -> Self {
        match p.as_usize() {
            0 => Self::from_coefs([1, 0, 0, 0]),
            1 => Self::from_coefs([0, 1, 0, 0]),
            _ => Self::from_coefs([1, 1, 0, 0]),
        }
    }

    /// Multiplication by x, cheaper than a general product: shifts the coefficients up and
    /// folds x^4 = x + 1.
    pub fn mul_by_x(self) -> Self {
        let [c0, c1, c2, c3] = self.coefs;
        Self::from_coefs([c3, c0.wrapping_add(c3), c1, c2])
    }
}

/// Product in GF(16) = GF(2)\[x\]/(x^4 + x + 1) of two 4-bit polynomials (bit i is x^i).
fn gf16_mul(a: u8, b: u8) -> u8 {
    let mut acc: u8 = 0;
    for i in 0..4 {
        if (b >> i) & 1 == 1 {
            acc ^= a << i;
        }
    }
    // Reduce degrees 6, 5, 4 with x^4 = x + 1.
    for d in (4..7).rev() {
        if (acc >> d) & 1 == 1 {
            acc ^= (1 << d) | (0b11 << (d - 4));
        }
    }
    acc & 0x0F
}

/// The coefficient layout that turns the constant term of a Galois-ring product into a plain
/// dot product: for every `a`, `(a * q).coefs[0] == Σ_i a.coefs[i] * layout[i]` (wrapping),
/// where `layout = dot_constant_term_query_layout(q) = [q0, q3, q2, q1]`.
///
/// Why: the constant term of a·q collects a0·q0 from x^0 and a1·q3 + a2·q2 + a3·q1 from x^4
/// (x^4 = x + 1 contributes 1 to the constant term; x^5 and x^6 contribute none).
///
/// This is what lets a party compute its additive share of a Galois-ring dot product
/// Σ_e A_e·(λ·Q_e) ([BGK+24] §4.3.2: query shares pre-multiplied by the party's Lagrange
/// coefficient λ) as a single wrapping u16 dot product between the stored coefficients of
/// A and the re-laid-out coefficients of λ·Q. The layout swaps coefficients 1 and 3 and is
/// therefore an involution: to make the constant term equal Σ a_i·q_i for a plain vector q,
/// pack q as `from_coefs(dot_constant_term_query_layout(from_coefs(q)))`.
pub fn dot_constant_term_query_layout(q: GaloisRing16) -> [u16; 4] {
    let [q0, q1, q2, q3] = q.coefs;
    [q0, q3, q2, q1]
}

/// Flattens elements into their coefficients, element-major: element e occupies
/// positions 4e..4e+4 (the layout of shares in storage and on the wire).
pub fn flatten_coefs(elems: &[GaloisRing16]) -> Vec<u16> {
    let mut out = Vec::with_capacity(elems.len() * 4);
    for e in elems {
        out.extend_from_slice(&e.coefs);
    }
    out
}

/// Inverse of [`flatten_coefs`]: groups coefficients four at a time into elements.
/// Returns `None` when the length is not a multiple of 4.
pub fn unflatten_coefs(coefs: &[u16]) -> Option<Vec<GaloisRing16>> {
    if !coefs.len().is_multiple_of(4) {
        return None;
    }
    Some(
        coefs
            .chunks_exact(4)
            .map(|c| GaloisRing16::from_coefs([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

impl Add for GaloisRing16 {
    type Output = Self;

    /// Coefficient-wise wrapping addition.
    fn add(self, rhs: Self) -> Self {
        let (a, b) = (self.coefs, rhs.coefs);
        Self::from_coefs([
            a[0].wrapping_add(b[0]),
            a[1].wrapping_add(b[1]),
            a[2].wrapping_add(b[2]),
            a[3].wrapping_add(b[3]),
        ])
    }
}

impl Sub for GaloisRing16 {
    type Output = Self;

    /// Coefficient-wise wrapping subtraction.
    fn sub(self, rhs: Self) -> Self {
        let (a, b) = (self.coefs, rhs.coefs);
        Self::from_coefs([
            a[0].wrapping_sub(b[0]),
            a[1].wrapping_sub(b[1]),
            a[2].wrapping_sub(b[2]),
            a[3].wrapping_sub(b[3]),
        ])
    }
}

impl Neg for GaloisRing16 {
    type Output = Self;

    /// Coefficient-wise wrapping negation.
    fn neg(self) -> Self {
        let a = self.coefs;
        Self::from_coefs([
            a[0].wrapping_neg(),
            a[1].wrapping_neg(),
            a[2].wrapping_neg(),
            a[3].wrapping_neg(),
        ])
    }
}

impl Mul for GaloisRing16 {
    type Output = Self;

    /// Polynomial product modulo (x^4 − x − 1) with wrapping coefficients.
    fn mul(self, rhs: Self) -> Self {
        let [a0, a1, a2, a3] = self.coefs.map(Wrapping);
        let [b0, b1, b2, b3] = rhs.coefs.map(Wrapping);
        let c0 = a0 * b0;
        let c1 = a0 * b1 + a1 * b0;
        let c2 = a0 * b2 + a1 * b1 + a2 * b0;
        let c3 = a0 * b3 + a1 * b2 + a2 * b1 + a3 * b0;
        let c4 = a1 * b3 + a2 * b2 + a3 * b1;
        let c5 = a2 * b3 + a3 * b2;
        let c6 = a3 * b3;
        // x^4 = x + 1, x^5 = x^2 + x, x^6 = x^3 + x^2.
        Self::from_coefs([(c0 + c4).0, (c1 + c4 + c5).0, (c2 + c5 + c6).0, (c3 + c6).0])
    }
}

impl AddAssign for GaloisRing16 {
    /// In-place coefficient-wise wrapping addition.
    fn add_assign(&mut self, rhs: Self) {
        *self = *self + rhs;
    }
}

impl SubAssign for GaloisRing16 {
    /// In-place coefficient-wise wrapping subtraction.
    fn sub_assign(&mut self, rhs: Self) {
        *self = *self - rhs;
    }
}

impl MulAssign for GaloisRing16 {
    /// In-place ring multiplication.
    fn mul_assign(&mut self, rhs: Self) {
        *self = *self * rhs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn element() -> impl Strategy<Value = GaloisRing16> {
        any::<[u16; 4]>().prop_map(GaloisRing16::from_coefs)
    }

    /// Plain wrapping dot product of two coefficient vectors.
    fn dot4(a: [u16; 4], b: [u16; 4]) -> u16 {
        a.iter()
            .zip(b.iter())
            .fold(0u16, |acc, (x, y)| acc.wrapping_add(x.wrapping_mul(*y)))
    }

    /// A schoolbook reference: multiply as polynomials over the integers, then reduce
    /// x^k for k ≥ 4 by x^k = x^(k−3) + x^(k−4), one degree at a time.
    fn reference_mul(a: GaloisRing16, b: GaloisRing16) -> GaloisRing16 {
        let mut c = [0u16; 7];
        for i in 0..4 {
            for j in 0..4 {
                c[i + j] = c[i + j].wrapping_add(a.coefs[i].wrapping_mul(b.coefs[j]));
            }
        }
        for k in (4..7).rev() {
            let v = c[k];
            c[k] = 0;
            c[k - 3] = c[k - 3].wrapping_add(v);
            c[k - 4] = c[k - 4].wrapping_add(v);
        }
        GaloisRing16::from_coefs([c[0], c[1], c[2], c[3]])
    }

    proptest! {
        #[test]
        fn commutative_ring_axioms(a in element(), b in element(), c in element()) {
            prop_assert_eq!(a + b, b + a);
            prop_assert_eq!((a + b) + c, a + (b + c));
            prop_assert_eq!(a + GaloisRing16::ZERO, a);
            prop_assert_eq!(a + (-a), GaloisRing16::ZERO);
            prop_assert_eq!(a - b, a + (-b));
            prop_assert_eq!(a * b, b * a);
            prop_assert_eq!((a * b) * c, a * (b * c));
            prop_assert_eq!(a * GaloisRing16::ONE, a);
            prop_assert_eq!(a * GaloisRing16::ZERO, GaloisRing16::ZERO);
        }

        #[test]
        fn distributivity(a in element(), b in element(), c in element()) {
            prop_assert_eq!(a * (b + c), a * b + a * c);
            prop_assert_eq!((a - b) * c, a * c - b * c);
        }

        #[test]
        fn mul_matches_schoolbook_reference(a in element(), b in element()) {
            prop_assert_eq!(a * b, reference_mul(a, b));
        }

        #[test]
        fn mul_by_x_matches_general_mul(a in element()) {
            prop_assert_eq!(a.mul_by_x(), a * GaloisRing16::X);
        }

        #[test]
        fn inverse_of_units(a in element()) {
            match a.inverse() {
                Some(inv) => {
                    prop_assert!(a.is_unit());
                    prop_assert_eq!(a * inv, GaloisRing16::ONE);
                    prop_assert_eq!(inv * a, GaloisRing16::ONE);
                }
                None => prop_assert!(!a.is_unit()),
            }
        }

        #[test]
        fn forced_units_invert(a in element(), bit in 0usize..4) {
            // Setting one coefficient odd and clearing the others' low bit makes a·mod 2 = x^bit ≠ 0.
            let mut coefs = a.coefs.map(|c| c & !1);
            coefs[bit] |= 1;
            let u = GaloisRing16::from_coefs(coefs);
            prop_assert!(u.is_unit());
            let inv = u.inverse();
            prop_assert_eq!(inv.map(|i| i * u), Some(GaloisRing16::ONE));
        }

        #[test]
        fn non_units_have_no_inverse(a in element()) {
            let even = GaloisRing16::from_coefs(a.coefs.map(|c| c & !1));
            prop_assert!(!even.is_unit());
            prop_assert_eq!(even.inverse(), None);
        }

        #[test]
        fn query_layout_gives_constant_term(a in element(), q in element()) {
            let layout = dot_constant_term_query_layout(q);
            prop_assert_eq!((a * q).coefs[0], dot4(a.coefs, layout));
        }

        #[test]
        fn query_layout_packs_plain_dot_products(a in element(), q in any::<[u16; 4]>()) {
            // Packing a plain vector q with the (involutive) layout makes the constant term of
            // the product the plain dot product Σ a_i q_i.
            let packed = GaloisRing16::from_coefs(
                dot_constant_term_query_layout(GaloisRing16::from_coefs(q)),
            );
            prop_assert_eq!((a * packed).coefs[0], dot4(a.coefs, q));
        }

        #[test]
        fn flatten_round_trip(v in proptest::collection::vec(element(), 0..20)) {
            prop_assert_eq!(unflatten_coefs(&flatten_coefs(&v)), Some(v));
        }
    }

    #[test]
    fn unflatten_rejects_ragged_lengths() {
        assert_eq!(unflatten_coefs(&[1, 2, 3]), None);
        assert_eq!(unflatten_coefs(&[]), Some(vec![]));
    }

    #[test]
    fn x_to_the_fourth_is_x_plus_one() {
        let x = GaloisRing16::X;
        assert_eq!(x * x * x * x, GaloisRing16::from_coefs([1, 1, 0, 0]));
        // x^15 = 1 in GF(16) since x is primitive for x^4 + x + 1; the lift is not 1 in general,
        // but it is 1 modulo 2.
        let mut p = GaloisRing16::ONE;
        for _ in 0..15 {
            p *= x;
        }
        assert_eq!(p.coefs.map(|c| c & 1), [1, 0, 0, 0]);
    }

    #[test]
    fn gf16_has_inverses_for_all_nonzero() {
        for a in 1u8..16 {
            assert_eq!(
                (1u8..16).filter(|&b| gf16_mul(a, b) == 1).count(),
                1,
                "GF(16) element {a:#06b} must have exactly one inverse"
            );
        }
    }

    #[test]
    fn exceptional_points_have_unit_differences() {
        for p in PartyIndex::ALL {
            let ap = GaloisRing16::exceptional_point(p);
            assert!(ap.is_unit(), "point of {p} must be a unit");
            for q in PartyIndex::ALL {
                if p != q {
                    let d = ap - GaloisRing16::exceptional_point(q);
                    assert!(
                        d.is_unit(),
                        "difference of points {p} and {q} must be a unit"
                    );
                    assert!(d.inverse().is_some());
                }
            }
        }
        assert_eq!(
            GaloisRing16::exceptional_point(PartyIndex::ALL[2]),
            GaloisRing16::from_coefs([1, 1, 0, 0])
        );
    }

    #[test]
    fn two_is_not_a_unit() {
        assert!(!GaloisRing16::from_u16(2).is_unit());
        assert_eq!(GaloisRing16::from_u16(2).inverse(), None);
        assert_eq!(GaloisRing16::ZERO.inverse(), None);
        assert_eq!(GaloisRing16::ONE.inverse(), Some(GaloisRing16::ONE));
    }
}
