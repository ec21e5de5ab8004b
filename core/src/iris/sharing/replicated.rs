//! ABY3 replicated secret sharing over a ring Z_2^k ([TACEO24] §3.2).
//!
//! A value x is split into three additive components x = x0 + x1 + x2 (wrapping). **Convention:
//! party i holds `ReplicatedShare { a: x_i, b: x_{i−1} }`** (indices mod 3), i.e.
//!
//! | party | `a`  | `b`  |
//! |-------|------|------|
//! | P0    | x0   | x2   |
//! | P1    | x1   | x0   |
//! | P2    | x2   | x1   |
//!
//! so component x_i is held by P_i (as `a`) and by P_{i+1} (as `b`). This is the convention of
//! [TACEO24] §3.2: an additive share z_i becomes the replicated share (z_i, z_{i−1}) when party i
//! sends z_i to party i + 1. Every component is held by exactly two parties, which lets a
//! reconstruction cross-check it.
//!
//! Addition, subtraction, negation, multiplication by a public constant and addition of a
//! public constant are local (no communication).

use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};

use rand_core::RngCore;

use crate::algebra::ring::RingElement;
use crate::party::PartyIndex;

/// One party's replicated share: party i holds `a = x_i` and `b = x_{i−1}` (see the module
/// documentation for the full table).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct ReplicatedShare<T> {
    /// The component x_i of the holding party i.
    pub a: T,
    /// The component x_{i−1} of the previous party.
    pub b: T,
}

/// Why a replicated reconstruction was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplicatedError {
    /// The two copies of one additive component disagree.
    #[error("replicated sharing: component x{component} is held by {holder_a} and {holder_b} but their copies disagree (corrupted or mixed-up shares)")]
    Inconsistent {
        /// Index i of the component x_i whose copies disagree.
        component: usize,
        /// The party holding x_i as `a` (P_i).
        holder_a: PartyIndex,
        /// The party holding x_i as `b` (P_{i+1}).
        holder_b: PartyIndex,
    },
    /// Both shares of a pair reconstruction come from the same party.
    #[error("replicated sharing: reconstruction from two shares needs two different parties, got {0} twice")]
    SameParty(PartyIndex),
}

impl<T: RingElement> ReplicatedShare<T> {
    /// The share (x_i, x_{i−1}) of party `party` given all three additive components.
    pub fn from_components(components: [T; 3], party: PartyIndex) -> Self {
        Self {
            a: components[party.as_usize()],
            b: components[party.prev().as_usize()],
        }
    }

    /// Adds the public constant `c` to the shared value (local): c is added to component x0,
    /// i.e. to `a` at P0 and to `b` at P1; P2 is unchanged.
    pub fn add_constant(self, c: T, party: PartyIndex) -> Self {
        match party.as_usize() {
            0 => Self {
                a: self.a + c,
                b: self.b,
            },
            1 => Self {
                a: self.a,
                b: self.b + c,
            },
            _ => self,
        }
    }

    /// Multiplies the shared value by the public constant `c` (local, on both components).
    pub fn mul_constant(self, c: T) -> Self {
        Self {
            a: self.a * c,
            b: self.b * c,
        }
    }
}

impl<T: RingElement> Add for ReplicatedShare<T> {
    type Output = Self;

    /// Shares of x + y (local, component-wise).
    fn add(self, rhs: Self) -> Self {
        Self {
            a: self.a + rhs.a,
            b: self.b + rhs.b,
        }
    }
}

impl<T: RingElement> Sub for ReplicatedShare<T> {
    type Output = Self;

    /// Shares of x − y (local, component-wise).
    fn sub(self, rhs: Self) -> Self {
        Self {
            a: self.a - rhs.a,
            b: self.b - rhs.b,
        }
    }
}

impl<T: RingElement> Neg for ReplicatedShare<T> {
    type Output = Self;

    /// Shares of −x (local, component-wise).
    fn neg(self) -> Self {
        Self {
            a: -self.a,
            b: -self.b,
        }
    }
}

impl<T: RingElement> AddAssign for ReplicatedShare<T> {
    /// In-place local addition.
    fn add_assign(&mut self, rhs: Self) {
        *self = *self + rhs;
    }
}

impl<T: RingElement> SubAssign for ReplicatedShare<T> {
    /// In-place local subtraction.
    fn sub_assign(&mut self, rhs: Self) {
        *self = *self - rhs;
    }
}

/// Splits `x` into fresh random components x0, x1 (uniform) and x2 = x − x0 − x1, and returns
/// the replicated shares of P0, P1, P2 in that order.
pub fn share<T: RingElement, R: RngCore + ?Sized>(x: T, rng: &mut R) -> [ReplicatedShare<T>; 3] {
    let x0 = T::random(rng);
    let x1 = T::random(rng);
    let components = [x0, x1, x - x0 - x1];
    PartyIndex::ALL.map(|p| ReplicatedShare::from_components(components, p))
}

/// Reconstructs x from the shares of P0, P1, P2 (in that order), checking that each component
/// held twice agrees: `shares[i].a == shares[i+1].b` for every i.
pub fn reconstruct<T: RingElement>(shares: &[ReplicatedShare<T>; 3]) -> Result<T, ReplicatedError> {
    for p in PartyIndex::ALL {
        let next = p.next();
        if shares[p.as_usize()].a != shares[next.as_usize()].b {
            return Err(ReplicatedError::Inconsistent {
                component: p.as_usize(),
                holder_a: p,
                holder_b: next,
            });
        }
    }
    Ok(shares[0].a + shares[1].a + shares[2].a)
}

/// Reconstructs x from the shares of two different parties `p` and `q`, checking the one
/// component they both hold. Between them two parties always hold all three components.
pub fn reconstruct_pair<T: RingElement>(
    p: PartyIndex,
    share_p: ReplicatedShare<T>,
    q: PartyIndex,
    share_q: ReplicatedShare<T>,
) -> Result<T, ReplicatedError> {
    if p == q {
        return Err(ReplicatedError::SameParty(p));
    }
    // Order the pair as (i, i+1): i holds (x_i, x_{i-1}), i+1 holds (x_{i+1}, x_i).
    let (i, si, sj) = if q == p.next() {
        (p, share_p, share_q)
    } else {
        (q, share_q, share_p)
    };
    if si.a != sj.b {
        return Err(ReplicatedError::Inconsistent {
            component: i.as_usize(),
            holder_a: i,
            holder_b: i.next(),
        });
    }
    Ok(si.a + si.b + sj.a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algebra::ring::{Z16, Z32};
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use std::num::Wrapping;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    fn all_pairs<T: RingElement>(
        shares: &[ReplicatedShare<T>; 3],
    ) -> Vec<Result<T, ReplicatedError>> {
        let mut out = Vec::new();
        for i in 0..3 {
            for j in 0..3 {
                if i != j {
                    out.push(reconstruct_pair(P[i], shares[i], P[j], shares[j]));
                }
            }
        }
        out
    }

    proptest! {
        #[test]
        fn share_reconstruct_z16(x: u16, seed: u64) {
            let shares = share(Wrapping(x), &mut ChaCha20Rng::seed_from_u64(seed));
            prop_assert_eq!(reconstruct(&shares), Ok(Wrapping(x)));
            for r in all_pairs(&shares) {
                prop_assert_eq!(r, Ok(Wrapping(x)));
            }
        }

        #[test]
        fn share_reconstruct_z32(x: u32, seed: u64) {
            let shares = share(Wrapping(x), &mut ChaCha20Rng::seed_from_u64(seed));
            prop_assert_eq!(reconstruct(&shares), Ok(Wrapping(x)));
            for r in all_pairs(&shares) {
                prop_assert_eq!(r, Ok(Wrapping(x)));
            }
        }

        #[test]
        fn convention_is_x_i_and_x_i_minus_1(x: u32, seed: u64) {
            let shares: [ReplicatedShare<Z32>; 3] = share(Wrapping(x), &mut ChaCha20Rng::seed_from_u64(seed));
            for p in P {
                prop_assert_eq!(shares[p.as_usize()].b, shares[p.prev().as_usize()].a);
            }
        }

        #[test]
        fn local_linear_operations(x: u16, y: u16, c: u16, seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let (x, y, c) = (Wrapping(x), Wrapping(y), Wrapping(c));
            let sx: [ReplicatedShare<Z16>; 3] = share(x, &mut rng);
            let sy = share(y, &mut rng);
            let sum = [0, 1, 2].map(|i| sx[i] + sy[i]);
            let diff = [0, 1, 2].map(|i| sx[i] - sy[i]);
            let neg = [0, 1, 2].map(|i| -sx[i]);
            let plus_c = [0, 1, 2].map(|i| sx[i].add_constant(c, P[i]));
            let times_c = [0, 1, 2].map(|i| sx[i].mul_constant(c));
            let mut acc = sx;
            for i in 0..3 {
                acc[i] += sy[i];
                acc[i] -= sx[i];
            }
            prop_assert_eq!(reconstruct(&sum), Ok(x + y));
            prop_assert_eq!(reconstruct(&diff), Ok(x - y));
            prop_assert_eq!(reconstruct(&neg), Ok(-x));
            prop_assert_eq!(reconstruct(&plus_c), Ok(x + c));
            prop_assert_eq!(reconstruct(&times_c), Ok(x * c));
            prop_assert_eq!(reconstruct(&acc), Ok(y));
            for r in all_pairs(&plus_c) {
                prop_assert_eq!(r, Ok(x + c));
            }
        }

        #[test]
        fn tampering_is_detected(x: u32, seed: u64, who in 0usize..3, which_b: bool, delta in 1u32..) {
            let mut shares: [ReplicatedShare<Z32>; 3] = share(Wrapping(x), &mut ChaCha20Rng::seed_from_u64(seed));
            if which_b {
                shares[who].b += Wrapping(delta);
            } else {
                shares[who].a += Wrapping(delta);
            }
            let inconsistent = matches!(reconstruct(&shares), Err(ReplicatedError::Inconsistent { .. }));
            prop_assert!(inconsistent);
        }
    }

    #[test]
    fn pair_checks() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let mut shares: [ReplicatedShare<Z16>; 3] = share(Wrapping(1234), &mut rng);
        assert_eq!(
            reconstruct_pair(P[1], shares[1], P[1], shares[1]),
            Err(ReplicatedError::SameParty(P[1]))
        );
        // Corrupt x1 as held by P2: the pair (P1, P2) disagrees on it, the pair (P0, P2)
        // shares only x2 and reconstructs with the wrong x1 undetected (semi-honest scope).
        shares[2].b += Wrapping(1);
        let err = reconstruct_pair(P[2], shares[2], P[1], shares[1]);
        assert_eq!(
            err,
            Err(ReplicatedError::Inconsistent {
                component: 1,
                holder_a: P[1],
                holder_b: P[2]
            })
        );
        assert_eq!(
            reconstruct_pair(P[0], shares[0], P[2], shares[2]),
            Ok(Wrapping(1235))
        );
        let msg = err.map_err(|e| e.to_string()).unwrap_err();
        assert!(
            msg.contains("x1") && msg.contains("P1") && msg.contains("P2"),
            "{msg}"
        );
        assert_eq!(
            reconstruct(&shares),
            Err(ReplicatedError::Inconsistent {
                component: 1,
                holder_a: P[1],
                holder_b: P[2]
            })
        );
    }

    #[test]
    fn components_are_random() {
        // Sharing 0 repeatedly must not give constant components.
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let a: [ReplicatedShare<Z32>; 3] = share(Wrapping(0), &mut rng);
        let b: [ReplicatedShare<Z32>; 3] = share(Wrapping(0), &mut rng);
        assert_ne!(a, b);
        assert_ne!(a[0].a, Wrapping(0));
    }
}
