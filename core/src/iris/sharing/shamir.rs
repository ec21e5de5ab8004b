//! Degree-1 Shamir secret sharing over the Galois ring GR(2^16, 4) for three parties
//! ([BGK+24] §4.3.2, "Shamir over Galois rings" / "Optimized 3-party Shamir over Galois Rings").
//!
//! A secret s is hidden in the constant term of f(X) = s + r·X with r uniform; party p holds
//! f(α_p) where α_p = [`GaloisRing16::exceptional_point`] (1, x, 1 + x). Any two parties
//! reconstruct s by Lagrange interpolation at 0; one share alone is uniform (α_p is a unit, so
//! r·α_p is uniform) and reveals nothing.
//!
//! The product of two degree-1 sharings is a degree-2 sharing; multiplying each party's
//! product share by its Lagrange coefficient for the full set {P0, P1, P2} turns it into a
//! 3-of-3 additive sharing of the product. The iris dot product ([BGK+24] §4.3.2) folds that
//! coefficient into the query share once, before scanning the database.

use rand_core::RngCore;

use crate::algebra::galois::GaloisRing16;
use crate::party::{PartyIndex, NUM_PARTIES};

/// Why a Shamir operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShamirError {
    /// The same party was listed twice.
    #[error("Shamir: party {0} appears more than once; shares must come from distinct parties")]
    DuplicateParty(PartyIndex),
    /// A Lagrange coefficient was asked for a party that is not in the interpolation set.
    #[error("Shamir: party {party} is not in the interpolation set, so it has no Lagrange coefficient there")]
    PartyNotInSet {
        /// The party whose coefficient was requested.
        party: PartyIndex,
    },
    /// Fewer than two distinct parties supplied shares of a degree-1 sharing.
    #[error("Shamir: reconstructing a degree-1 sharing needs shares from at least 2 distinct parties, got {got}")]
    TooFewShares {
        /// How many shares were supplied.
        got: usize,
    },
    /// Three shares were supplied and they do not lie on one degree-1 polynomial.
    #[error("Shamir: the 3 shares of element {index} are inconsistent (not on one degree-1 polynomial): a share was corrupted or mixed up")]
    Inconsistent {
        /// Index of the first inconsistent element (0 for a single secret).
        index: usize,
    },
    /// The share vectors of different parties have different lengths.
    #[error("Shamir: party {party} supplied {got} shared elements, but party {first_party} supplied {expected}")]
    LengthMismatch {
        /// The party whose vector length disagrees.
        party: PartyIndex,
        /// The party whose length is taken as reference.
        first_party: PartyIndex,
        /// The reference length.
        expected: usize,
        /// The disagreeing length.
        got: usize,
    },
    /// An evaluation-point difference was not invertible. Cannot happen with the fixed
    /// exceptional points; reported instead of panicking should they ever be changed.
    #[error("Shamir: evaluation points of {0} and {1} do not differ by a unit (internal error)")]
    NonUnitDifference(PartyIndex, PartyIndex),
}

/// Shares `secret` with a fresh random degree-1 polynomial f(X) = secret + r·X: element p of
/// the result is f(α_p), the share for party p ([BGK+24] §4.3.2).
pub fn share<R: RngCore + ?Sized>(secret: GaloisRing16, rng: &mut R) -> [GaloisRing16; 3] {
    let r = GaloisRing16::random(rng);
    share_with_coefficient(secret, r)
}

/// The three evaluations f(α_p) of f(X) = secret + r·X, using α = 1, x, 1 + x.
fn share_with_coefficient(secret: GaloisRing16, r: GaloisRing16) -> [GaloisRing16; 3] {
    let rx = r.mul_by_x();
    [secret + r, secret + rx, secret + r + rx]
}

/// Shares every element of `secrets` independently (fresh polynomial per element);
/// result\[p\]\[e\] is party p's share of `secrets[e]`.
pub fn share_slice<R: RngCore + ?Sized>(
    secrets: &[GaloisRing16],
    rng: &mut R,
) -> [Vec<GaloisRing16>; 3] {
    let mut out: [Vec<GaloisRing16>; 3] =
        std::array::from_fn(|_| Vec::with_capacity(secrets.len()));
    for &s in secrets {
        let [a, b, c] = share(s, rng);
        out[0].push(a);
        out[1].push(b);
        out[2].push(c);
    }
    out
}

/// Checks that `set` lists distinct parties.
fn check_distinct(set: &[PartyIndex]) -> Result<(), ShamirError> {
    for (i, p) in set.iter().enumerate() {
        if set[..i].contains(p) {
            return Err(ShamirError::DuplicateParty(*p));
        }
    }
    Ok(())
}

/// The Lagrange coefficient of party `me` for interpolating at 0 from the parties in `set`:
/// λ_me = Π_{j ∈ set, j ≠ me} α_j / (α_j − α_me).
///
/// With a set of 2 parties this reconstructs degree-1 sharings; with all 3 parties it
/// reconstructs degree-2 sharings, i.e. it turns a party's share of a product of two degree-1
/// sharings into its 3-of-3 additive share ([BGK+24] §4.3.2). `set` must contain `me` and list
/// distinct parties.
pub fn lagrange_coefficient_at_zero(
    me: PartyIndex,
    set: &[PartyIndex],
) -> Result<GaloisRing16, ShamirError> {
    check_distinct(set)?;
    if !set.contains(&me) {
        return Err(ShamirError::PartyNotInSet { party: me });
    }
    let alpha_me = GaloisRing16::exceptional_point(me);
    let mut lambda = GaloisRing16::ONE;
    for &j in set.iter().filter(|&&j| j != me) {
        let alpha_j = GaloisRing16::exceptional_point(j);
        let inv = (alpha_j - alpha_me)
            .inverse()
            .ok_or(ShamirError::NonUnitDifference(j, me))?;
        lambda = lambda * alpha_j * inv;
    }
    Ok(lambda)
}

/// Validated interpolation plan for a list of parties: the Lagrange coefficients of the first
/// two parties, and, when a third party is present, the coefficients of the pair
/// (first, third) used to check that the third share lies on the same line.
struct Plan {
    primary: [(usize, GaloisRing16); 2],
    check: Option<[(usize, GaloisRing16); 2]>,
}

impl Plan {
    fn new(parties: &[PartyIndex]) -> Result<Self, ShamirError> {
        check_distinct(parties)?;
        if parties.len() < 2 {
            return Err(ShamirError::TooFewShares { got: parties.len() });
        }
        let pair = |i: usize, j: usize| -> Result<[(usize, GaloisRing16); 2], ShamirError> {
            let set = [parties[i], parties[j]];
            Ok([
                (i, lagrange_coefficient_at_zero(parties[i], &set)?),
                (j, lagrange_coefficient_at_zero(parties[j], &set)?),
            ])
        };
        let primary = pair(0, 1)?;
        // At most NUM_PARTIES distinct parties exist, so a third is the last one.
        let check = if parties.len() == NUM_PARTIES {
            Some(pair(0, 2)?)
        } else {
            None
        };
        Ok(Plan { primary, check })
    }

    fn interpolate(
        pair: &[(usize, GaloisRing16); 2],
        values: impl Fn(usize) -> GaloisRing16,
    ) -> GaloisRing16 {
        values(pair[0].0) * pair[0].1 + values(pair[1].0) * pair[1].1
    }
}

/// Reconstructs the secret of a degree-1 sharing from the shares of any 2 or 3 distinct
/// parties. With all 3 shares it also checks they lie on one degree-1 polynomial and refuses
/// inconsistent (tampered) shares.
pub fn reconstruct(shares: &[(PartyIndex, GaloisRing16)]) -> Result<GaloisRing16, ShamirError> {
    let parties: Vec<PartyIndex> = shares.iter().map(|s| s.0).collect();
    let plan = Plan::new(&parties)?;
    let value = |i: usize| shares[i].1;
    let secret = Plan::interpolate(&plan.primary, value);
    if let Some(check) = &plan.check {
        if Plan::interpolate(check, value) != secret {
            return Err(ShamirError::Inconsistent { index: 0 });
        }
    }
    Ok(secret)
}

/// Reconstructs a vector of degree-1 sharings element by element from the share vectors of
/// any 2 or 3 distinct parties (all of the same length). With 3 parties every element is
/// checked for consistency, as in [`reconstruct`].
pub fn reconstruct_slice(
    shares: &[(PartyIndex, &[GaloisRing16])],
) -> Result<Vec<GaloisRing16>, ShamirError> {
    let parties: Vec<PartyIndex> = shares.iter().map(|s| s.0).collect();
    let plan = Plan::new(&parties)?;
    let (first_party, first) = shares[0];
    for &(party, v) in &shares[1..] {
        if v.len() != first.len() {
            return Err(ShamirError::LengthMismatch {
                party,
                first_party,
                expected: first.len(),
                got: v.len(),
            });
        }
    }
    let mut out = Vec::with_capacity(first.len());
    for e in 0..first.len() {
        let value = |i: usize| shares[i].1[e];
        let secret = Plan::interpolate(&plan.primary, value);
        if let Some(check) = &plan.check {
            if Plan::interpolate(check, value) != secret {
                return Err(ShamirError::Inconsistent { index: e });
            }
        }
        out.push(secret);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn element() -> impl Strategy<Value = GaloisRing16> {
        any::<[u16; 4]>().prop_map(GaloisRing16::from_coefs)
    }

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    proptest! {
        #[test]
        fn any_two_parties_reconstruct(secret in element(), seed: u64, i in 0usize..3, j in 0usize..3) {
            prop_assume!(i != j);
            let shares = share(secret, &mut ChaCha20Rng::seed_from_u64(seed));
            prop_assert_eq!(reconstruct(&[(P[i], shares[i]), (P[j], shares[j])]), Ok(secret));
        }

        #[test]
        fn all_three_parties_reconstruct(secret in element(), seed: u64) {
            let shares = share(secret, &mut ChaCha20Rng::seed_from_u64(seed));
            let all = [(P[2], shares[2]), (P[0], shares[0]), (P[1], shares[1])];
            prop_assert_eq!(reconstruct(&all), Ok(secret));
        }

        #[test]
        fn tampered_third_share_is_detected(secret in element(), seed: u64, delta in element(), who in 0usize..3) {
            prop_assume!(delta != GaloisRing16::ZERO);
            let mut shares = share(secret, &mut ChaCha20Rng::seed_from_u64(seed));
            shares[who] += delta;
            let all = [(P[0], shares[0]), (P[1], shares[1]), (P[2], shares[2])];
            prop_assert_eq!(reconstruct(&all), Err(ShamirError::Inconsistent { index: 0 }));
        }

        #[test]
        fn products_become_additive_shares(s in element(), t in element(), seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let a = share(s, &mut rng);
            let b = share(t, &mut rng);
            let mut sum = GaloisRing16::ZERO;
            for p in P {
                let lambda = lagrange_coefficient_at_zero(p, &P).map_err(|e| TestCaseError::fail(e.to_string()))?;
                sum += a[p.as_usize()] * b[p.as_usize()] * lambda;
            }
            prop_assert_eq!(sum, s * t);
        }

        #[test]
        fn slices_round_trip(secrets in proptest::collection::vec(element(), 0..40), seed: u64, i in 0usize..3, j in 0usize..3) {
            prop_assume!(i != j);
            let shares = share_slice(&secrets, &mut ChaCha20Rng::seed_from_u64(seed));
            let pair = [(P[i], shares[i].as_slice()), (P[j], shares[j].as_slice())];
            prop_assert_eq!(reconstruct_slice(&pair), Ok(secrets.clone()));
            let all = [(P[0], shares[0].as_slice()), (P[1], shares[1].as_slice()), (P[2], shares[2].as_slice())];
            prop_assert_eq!(reconstruct_slice(&all), Ok(secrets));
        }
    }

    proptest! {
        #[test]
        fn shares_are_evaluations_at_the_exceptional_points(s in element(), r in element()) {
            let shares = share_with_coefficient(s, r);
            for p in P {
                prop_assert_eq!(shares[p.as_usize()], s + r * GaloisRing16::exceptional_point(p));
            }
        }
    }

    #[test]
    fn lagrange_coefficients_sum_to_one() {
        // Interpolating the constant polynomial 1 must give 1, for every valid set.
        let sets: [&[PartyIndex]; 4] = [&[P[0], P[1]], &[P[0], P[2]], &[P[1], P[2]], &P];
        for set in sets {
            let mut sum = GaloisRing16::ZERO;
            for &p in set {
                sum += lagrange_coefficient_at_zero(p, set).expect("valid set");
            }
            assert_eq!(sum, GaloisRing16::ONE, "set {set:?}");
        }
    }

    #[test]
    fn lagrange_rejects_bad_sets() {
        assert_eq!(
            lagrange_coefficient_at_zero(P[0], &[P[1], P[2]]),
            Err(ShamirError::PartyNotInSet { party: P[0] })
        );
        assert_eq!(
            lagrange_coefficient_at_zero(P[0], &[P[0], P[1], P[1]]),
            Err(ShamirError::DuplicateParty(P[1]))
        );
        assert_eq!(
            lagrange_coefficient_at_zero(P[0], &[]),
            Err(ShamirError::PartyNotInSet { party: P[0] })
        );
    }

    #[test]
    fn reconstruct_rejects_bad_inputs() {
        let s = GaloisRing16::from_coefs([1, 2, 3, 4]);
        let shares = share(s, &mut ChaCha20Rng::seed_from_u64(1));
        assert_eq!(
            reconstruct(&[(P[0], shares[0])]),
            Err(ShamirError::TooFewShares { got: 1 })
        );
        assert_eq!(reconstruct(&[]), Err(ShamirError::TooFewShares { got: 0 }));
        assert_eq!(
            reconstruct(&[(P[1], shares[1]), (P[1], shares[1])]),
            Err(ShamirError::DuplicateParty(P[1]))
        );
        let short = &shares[..1];
        let err = reconstruct_slice(&[(P[0], &shares[..]), (P[1], short)]);
        assert_eq!(
            err,
            Err(ShamirError::LengthMismatch {
                party: P[1],
                first_party: P[0],
                expected: 3,
                got: 1
            })
        );
        let msg = ShamirError::TooFewShares { got: 1 }.to_string();
        assert!(msg.contains("at least 2 distinct parties"), "{msg}");
    }

    #[test]
    fn slice_inconsistency_names_the_element() {
        let secrets = vec![GaloisRing16::from_u16(5); 10];
        let mut shares = share_slice(&secrets, &mut ChaCha20Rng::seed_from_u64(3));
        shares[1][7].coefs[2] ^= 1;
        let all = [
            (P[0], shares[0].as_slice()),
            (P[1], shares[1].as_slice()),
            (P[2], shares[2].as_slice()),
        ];
        assert_eq!(
            reconstruct_slice(&all),
            Err(ShamirError::Inconsistent { index: 7 })
        );
        // The two untouched parties still reconstruct.
        let pair = [(P[0], shares[0].as_slice()), (P[2], shares[2].as_slice())];
        assert_eq!(reconstruct_slice(&pair), Ok(secrets));
    }

    #[test]
    fn single_share_is_secret_plus_uniform_mask() {
        // Same randomness, different secrets: every party's share moves by exactly the
        // secret, so the share is secret + r·α_p with r·α_p independent of the secret.
        let s = GaloisRing16::from_coefs([0xBEEF, 1, 0xFFFF, 42]);
        let zero_shares = share(GaloisRing16::ZERO, &mut ChaCha20Rng::seed_from_u64(11));
        let s_shares = share(s, &mut ChaCha20Rng::seed_from_u64(11));
        for p in 0..3 {
            assert_eq!(s_shares[p] - zero_shares[p], s);
            assert_ne!(zero_shares[p], GaloisRing16::ZERO);
        }

        // r·α_p must be uniform: with α_p a unit every coefficient, in particular its low and
        // high nibbles, is uniform. A non-unit point (e.g. 2) would leave low bits constant and
        // fail this. 16,000 draws → 1,000 expected per bucket.
        let mut rng = ChaCha20Rng::seed_from_u64(12);
        let mut low = [[[0u32; 16]; 4]; 3];
        let mut high = [[[0u32; 16]; 4]; 3];
        for _ in 0..16_000 {
            let shares = share(s, &mut rng);
            for p in 0..3 {
                for c in 0..4 {
                    let v = shares[p].coefs[c];
                    low[p][c][usize::from(v & 15)] += 1;
                    high[p][c][usize::from(v >> 12)] += 1;
                }
            }
        }
        for buckets in low.iter().chain(high.iter()).flatten() {
            for &count in buckets {
                assert!(
                    (800..1200).contains(&count),
                    "share nibble bucket count {count} is far from the uniform 1000"
                );
            }
        }
    }
}
