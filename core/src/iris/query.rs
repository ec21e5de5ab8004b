//! Query preparation at one party ([BGK+24] §4.3.2 "Optimized 3-party Shamir over Galois rings",
//! §5 shared masks; docs/protocols/iris.md).
//!
//! **What it computes.** For a probe shared with degree-1 Shamir over GR(2^16, 4) and a
//! database entry shared the same way, party p turns its probe share into vectors
//! `code_k`, `mask_k` (one pair per rotation k) such that the plain wrapping u16 dot product
//! `Σ_j db.code[j] · code_k[j]` over the party's flat stored coefficients is p's **3-of-3
//! additive share** of the integer code dot product Σ v_db·v_query(k)
//! (= popcount(m_db ∧ m_q) − 2·popcount((c_db ⊕ c_q) ∧ m_db ∧ m_q), the query rotated by k),
//! and likewise for the mask (= half the common mask popcount, see
//! [`crate::iris::encoding`]). No communication: the 3-of-3 additive shares are re-randomised
//! and reshared into replicated shares by [`crate::iris::mpc::reshare`] (one round).
//!
//! **Why it works.** The product of two degree-1 Shamir sharings is a degree-2 sharing of the
//! Galois-ring product, and multiplying party p's product share by its Lagrange coefficient
//! λ_p for the set {P0, P1, P2} ([`shamir::lagrange_coefficient_at_zero`]) makes the three
//! results add up to the product ([BGK+24] §4.3.2). λ_p is folded into the query once, before
//! the database scan. The constant term of a ring product A·Q is a plain dot product of A's
//! monomial coefficients with the re-laid-out coefficients
//! [`dot_constant_term_query_layout`]`(Q)` = (q0, q3, q2, q1) (see [`crate::algebra::galois`]).
//!
//! **Probe packing (client side).** The database stores monomial coefficients equal to the
//! encoded bits, so the constant term of A·Q equals the plain coefficient-wise dot product of
//! the encodings only if the probe element Q is *packed* with the same (involutive) layout
//! before sharing: Q = from_coefs(layout(v)). A probe must therefore be shared with
//! [`share_query_template`], not with [`crate::iris::encoding::share_template`] (which is the
//! enrolment encoding): the layout is a Z_2^16-linear map but not a ring map, so it cannot be
//! applied to shares after the fact. (iris-mpc achieves the same with a pair of dual bases.)
//!
//! **Rotations.** The query is rotated, the enrolled template stays fixed, in the direction
//! of [`IrisTemplate::rotate`] — the convention of
//! [`crate::iris::template::min_fhd_with_rotation`], so the minimum over the prepared
//! rotations equals [`crate::iris::template::min_fhd_over_rotations`]. A column shift moves
//! whole ring elements, so rotating shares is a local permutation ([`IrisShare::rotate`]).
//!
//! **Layout.** [`PreparedQuery::rotations`] lists k = −max..=max in increasing order (index
//! r ↔ k = r − max; 31 entries for the deployed max = 15, one entry k = 0 for "no rotation").
//! Each [`PreparedRotation`] holds 12,800 code and 6,400 mask u16 coefficients, element-major
//! (element e at 4e..4e+4), aligned with the stored database share layout.
//!
//! Rounds: none (local).

use std::fmt;

use rand_core::RngCore;

use super::encoding::{
    encode_code, encode_mask, EncodingError, IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS,
};
use super::template::{IrisTemplate, IRIS_COLS};
use crate::algebra::galois::{dot_constant_term_query_layout, flatten_coefs, GaloisRing16};
use crate::iris::sharing::shamir::{self, ShamirError};
use crate::party::PartyIndex;

/// Largest rotation accepted by [`PreparedQuery::prepare`]: 100 columns each way already
/// covers all 200 rotations.
pub const MAX_PREPARED_ROTATION: i32 = IRIS_COLS as i32 / 2;

/// Why a query could not be prepared or shared ([BGK+24] §4.3.2 query preparation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// The probe share has the wrong shape, or the template cannot be encoded.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
    /// The Lagrange coefficient could not be computed (internal error).
    #[error(transparent)]
    Shamir(#[from] ShamirError),
    /// The requested maximum rotation is negative or above [`MAX_PREPARED_ROTATION`].
    #[error("iris query: maximum rotation {0} is out of range 0..=100 columns")]
    RotationOutOfRange(i32),
    /// A batch without a probe.
    #[error("iris query: a batch needs at least one probe")]
    EmptyBatch,
    /// The probe shares of a batch belong to different parties.
    #[error("iris query: the probe shares of a batch belong to different parties")]
    MixedParties,
}

/// Encodes a probe template and shares it for matching (client side of [BGK+24] §4.3.2/§5):
/// every code and mask element is encoded as in [`crate::iris::encoding`], packed with the
/// involutive layout [`dot_constant_term_query_layout`] (so that the constant term of a ring
/// product with a stored element is the plain coefficient-wise dot product), and shared with
/// degree-1 Shamir. Returns the shares of P0, P1, P2 (same flat element-major layout as
/// enrolment shares). Fails if the mask is not duplicated along the last axis.
pub fn share_query_template<R: RngCore + ?Sized>(
    t: &IrisTemplate,
    rng: &mut R,
) -> Result<[IrisShare; 3], EncodingError> {
    let pack = |elems: Vec<GaloisRing16>| -> Vec<GaloisRing16> {
        elems
            .into_iter()
            .map(|e| GaloisRing16::from_coefs(dot_constant_term_query_layout(e)))
            .collect()
    };
    let mask = pack(encode_mask(t)?);
    let code = pack(encode_code(t));
    let code_shares = shamir::share_slice(&code, rng);
    let mask_shares = shamir::share_slice(&mask, rng);
    Ok(PartyIndex::ALL.map(|p| IrisShare {
        party: p,
        code: flatten_coefs(&code_shares[p.as_usize()]),
        mask: flatten_coefs(&mask_shares[p.as_usize()]),
    }))
}

/// One rotation of a prepared query ([BGK+24] §4.3.2): coefficient vectors whose plain wrapping
/// dot product with a stored share of the same party is that party's additive share of the
/// code (resp. mask) dot product with the query rotated by `rotation` columns.
#[derive(Clone, PartialEq, Eq)]
pub struct PreparedRotation {
    /// The column rotation k applied to the query ([`IrisTemplate::rotate`] direction).
    pub rotation: i32,
    /// 12,800 coefficients aligned with a stored code share.
    pub code: Vec<u16>,
    /// 6,400 coefficients aligned with a stored mask share.
    pub mask: Vec<u16>,
}

impl fmt::Debug for PreparedRotation {
    /// Prints the rotation and the vector lengths, never the share values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedRotation")
            .field("rotation", &self.rotation)
            .field("code_len", &self.code.len())
            .field("mask_len", &self.mask.len())
            .finish()
    }
}

/// A query prepared at one party for the database scan ([BGK+24] §4.3.2): Lagrange
/// pre-multiplied, re-laid out for the constant-term dot product, one entry per rotation
/// (module docs for the layout).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PreparedQuery {
    /// The party that prepared (and alone can use) this query.
    pub party: PartyIndex,
    /// Rotations k = −max..=max in increasing order.
    pub rotations: Vec<PreparedRotation>,
}

impl PreparedQuery {
    /// Prepares party `probe.party`'s probe share (shared with [`share_query_template`]) for
    /// rotations k = −max_rotation..=max_rotation (`max_rotation` = 15 gives the deployed 31
    /// rotations, 0 gives "no rotation"). Steps ([BGK+24] §4.3.2): multiply every element by
    /// λ_p, re-lay it out with [`dot_constant_term_query_layout`], then rotate the rows
    /// locally for each k. Fails on a malformed share or `max_rotation` outside 0..=100.
    pub fn prepare(probe: &IrisShare, max_rotation: i32) -> Result<Self, QueryError> {
        if !(0..=MAX_PREPARED_ROTATION).contains(&max_rotation) {
            return Err(QueryError::RotationOutOfRange(max_rotation));
        }
        probe.validate()?;
        let lambda = shamir::lagrange_coefficient_at_zero(probe.party, &PartyIndex::ALL)?;
        let premultiply = |coefs: &[u16]| -> Vec<u16> {
            let mut out = Vec::with_capacity(coefs.len());
            for c in coefs.chunks_exact(4) {
                let e = GaloisRing16::from_coefs([c[0], c[1], c[2], c[3]]) * lambda;
                out.extend_from_slice(&dot_constant_term_query_layout(e));
            }
            out
        };
        // Element-wise operations commute with the element permutation of a rotation, so the
        // pre-multiplied, re-laid-out share is computed once and rotated per k.
        let base = IrisShare {
            party: probe.party,
            code: premultiply(&probe.code),
            mask: premultiply(&probe.mask),
        };
        let mut rotations = Vec::with_capacity(2 * max_rotation as usize + 1);
        for k in -max_rotation..=max_rotation {
            let rotated = base.rotate(k)?;
            rotations.push(PreparedRotation {
                rotation: k,
                code: rotated.code,
                mask: rotated.mask,
            });
        }
        Ok(PreparedQuery {
            party: probe.party,
            rotations,
        })
    }

    /// Prepares a batch of probe shares of one party as one query block (module docs of
    /// [`crate::iris::matcher`], "Batches"): probe b's rotations at b·R..(b+1)·R, so one scan
    /// of the stored shares serves every probe of the batch (each row is read once per batch
    /// instead of once per probe). Fails as [`PreparedQuery::prepare`] does, on an empty batch
    /// or on probes of different parties.
    pub fn batch(probes: &[IrisShare], max_rotation: i32) -> Result<Self, QueryError> {
        let Some(first) = probes.first() else {
            return Err(QueryError::EmptyBatch);
        };
        let mut rotations =
            Vec::with_capacity(probes.len() * (2 * max_rotation.max(0) as usize + 1));
        for probe in probes {
            if probe.party != first.party {
                return Err(QueryError::MixedParties);
            }
            rotations.extend(Self::prepare(probe, max_rotation)?.rotations);
        }
        Ok(PreparedQuery {
            party: first.party,
            rotations,
        })
    }

    /// Number of prepared rotations (31 for the deployed ±15, 1 without rotation).
    pub fn num_rotations(&self) -> usize {
        self.rotations.len()
    }

    /// Checks that every rotation has 12,800 code and 6,400 mask coefficients (the fields are
    /// public, so a query built by hand is re-checked before a scan).
    pub fn validate(&self) -> Result<(), EncodingError> {
        for r in &self.rotations {
            let check = |what: &str, expected: usize, got: usize| {
                if expected == got {
                    Ok(())
                } else {
                    Err(EncodingError::WrongLength {
                        what: format!(
                            "prepared iris query {what} of {} at rotation {}",
                            self.party, r.rotation
                        ),
                        expected,
                        got,
                    })
                }
            };
            check("code", CODE_SHARE_COEFS, r.code.len())?;
            check("mask", MASK_SHARE_COEFS, r.mask.len())?;
        }
        Ok(())
    }
}

/// Plain wrapping u16 dot product ([BGK+24] §4.3.2 local dot product, scalar reference) `Σ_j a[j]·b[j]` over the common length (the reference the
/// SIMD kernels in [`crate::iris::dot`] are checked against).
pub fn plain_dot_u16(a: &[u16], b: &[u16]) -> u16 {
    a.iter()
        .zip(b)
        .fold(0u16, |acc, (x, y)| acc.wrapping_add(x.wrapping_mul(*y)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::encoding::share_template;
    use crate::iris::synth::{near_duplicate, random_template};
    use crate::iris::template::{
        masked_code_distance_counts, min_fhd_over_rotations, MAX_ROTATION, NUM_ROTATIONS,
    };
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    /// The three parties' summed dot products for one stored template and one rotation index.
    fn shared_counts(db: &[IrisShare; 3], q: &[PreparedQuery; 3], r: usize) -> (u16, u16) {
        let mut code = 0u16;
        let mut mask = 0u16;
        for p in 0..3 {
            let rot = &q[p].rotations[r];
            code = code.wrapping_add(plain_dot_u16(&db[p].code, &rot.code));
            mask = mask.wrapping_add(plain_dot_u16(&db[p].mask, &rot.mask));
        }
        (code, mask)
    }

    fn prepare_all(shares: &[IrisShare; 3], max: i32) -> [PreparedQuery; 3] {
        let prepared: Vec<PreparedQuery> = shares
            .iter()
            .map(|s| PreparedQuery::prepare(s, max).expect("valid share"))
            .collect();
        [
            prepared[0].clone(),
            prepared[1].clone(),
            prepared[2].clone(),
        ]
    }

    /// The plaintext (code, mask) dot products of the query rotated by k against `enrolled`.
    fn plain_counts(query: &IrisTemplate, enrolled: &IrisTemplate, k: i32) -> (u16, u16) {
        let (hamming, common) = masked_code_distance_counts(&query.rotate(k), enrolled);
        let code = (common as i32 - 2 * hamming as i32) as u16;
        (code, (common / 2) as u16)
    }

    #[test]
    fn additive_shares_match_plaintext_for_all_rotations() {
        let mut rng = ChaCha20Rng::seed_from_u64(31);
        let query = random_template(&mut rng);
        let mut enrolled = vec![random_template(&mut rng), random_template(&mut rng)];
        for (flip, rot) in [(0.0, 0), (0.05, 3), (0.2, -7), (0.3, 15), (0.1, -15)] {
            // near_duplicate(t, rot) matches t at rotation −rot of the result, so enrol the
            // duplicate and query with the original: it matches at k = +rot of the query.
            enrolled.push(near_duplicate(&query, flip, rot, &mut rng));
        }
        let q_shares = share_query_template(&query, &mut rng).expect("share query");
        let prepared = prepare_all(&q_shares, MAX_ROTATION);
        assert_eq!(prepared[0].num_rotations(), NUM_ROTATIONS);
        let mut disagreements = 0;
        for t in &enrolled {
            let db = share_template(t, &mut rng).expect("share enrolled");
            let mut best: Option<f64> = None;
            for (r, k) in (-MAX_ROTATION..=MAX_ROTATION).enumerate() {
                assert_eq!(prepared[1].rotations[r].rotation, k);
                let shared = shared_counts(&db, &prepared, r);
                if shared != plain_counts(&query, t, k) {
                    disagreements += 1;
                }
                let (code, mask) = shared;
                let common = 2.0 * f64::from(mask);
                if common > 0.0 {
                    // hd = (common − code)/2, code read as a signed 16-bit value.
                    let fhd = (common - f64::from(code as i16)) / 2.0 / common;
                    best = Some(best.map_or(fhd, |b| b.min(fhd)));
                }
            }
            let reference = min_fhd_over_rotations(&query, t, MAX_ROTATION).expect("overlap");
            let got = best.expect("overlap");
            assert!((got - reference).abs() < 1e-12, "{got} vs {reference}");
        }
        assert_eq!(disagreements, 0);
    }

    #[test]
    fn near_duplicates_match_at_the_expected_rotation() {
        let mut rng = ChaCha20Rng::seed_from_u64(32);
        let original = random_template(&mut rng);
        let enrolled = near_duplicate(&original, 0.0, 4, &mut rng);
        let q_shares = share_query_template(&original, &mut rng).expect("share query");
        let prepared = prepare_all(&q_shares, MAX_ROTATION);
        let db = share_template(&enrolled, &mut rng).expect("share");
        // Exact duplicate rotated by 4: at k = 4 the Hamming distance is 0, so code = common.
        let r = (4 + MAX_ROTATION) as usize;
        let (code, mask) = shared_counts(&db, &prepared, r);
        assert_eq!(u32::from(code), 2 * u32::from(mask));
        assert_eq!(u32::from(code), enrolled.mask.popcount());
    }

    #[test]
    fn no_rotation_is_only_k_zero() {
        let mut rng = ChaCha20Rng::seed_from_u64(33);
        let query = random_template(&mut rng);
        let t = random_template(&mut rng);
        let q_shares = share_query_template(&query, &mut rng).expect("share query");
        let prepared = prepare_all(&q_shares, 0);
        assert_eq!(prepared[2].num_rotations(), 1);
        assert_eq!(prepared[2].rotations[0].rotation, 0);
        let db = share_template(&t, &mut rng).expect("share");
        assert_eq!(
            shared_counts(&db, &prepared, 0),
            plain_counts(&query, &t, 0)
        );
        assert!(prepared.iter().all(|p| p.validate().is_ok()));
    }

    #[test]
    fn rejects_bad_inputs() {
        let mut rng = ChaCha20Rng::seed_from_u64(34);
        let query = random_template(&mut rng);
        let shares = share_query_template(&query, &mut rng).expect("share query");
        assert_eq!(
            PreparedQuery::prepare(&shares[0], -1),
            Err(QueryError::RotationOutOfRange(-1))
        );
        assert_eq!(
            PreparedQuery::prepare(&shares[0], 101),
            Err(QueryError::RotationOutOfRange(101))
        );
        let mut short = shares[1].clone();
        short.code.pop();
        let err = PreparedQuery::prepare(&short, 15).expect_err("short code");
        assert_eq!(
            err.to_string(),
            "iris code share of P1: expected 12800 values, got 12799"
        );
        let mut prepared = PreparedQuery::prepare(&shares[2], 1).expect("valid");
        prepared.rotations[2].mask.push(0);
        let err = prepared.validate().expect_err("long mask");
        assert!(err.to_string().contains("rotation 1"), "{err}");
        // Debug output never contains share values.
        let text = format!("{prepared:?}");
        assert!(
            text.contains("code_len: 12800") && text.len() < 600,
            "{text}"
        );
    }

    #[test]
    fn enrollment_encoding_is_not_a_valid_probe() {
        // Documents why probes need share_query_template: the enrolment encoding (unpacked)
        // does not yield the plain dot product.
        let mut rng = ChaCha20Rng::seed_from_u64(35);
        let query = random_template(&mut rng);
        let t = random_template(&mut rng);
        let unpacked = share_template(&query, &mut rng).expect("share");
        let prepared = prepare_all(&unpacked, 0);
        let db = share_template(&t, &mut rng).expect("share");
        assert_ne!(
            shared_counts(&db, &prepared, 0),
            plain_counts(&query, &t, 0)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]
        #[test]
        fn additive_shares_at_random_rotation(seed: u64, k in -20i32..=20) {
            // Additive-share property for random templates at a random rotation; the
            // templates and shares derive from the drawn seed.
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let query = random_template(&mut rng);
            let t = random_template(&mut rng);
            let max = k.abs();
            let q_shares = share_query_template(&query, &mut rng).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut prepared = Vec::new();
            for s in &q_shares {
                prepared.push(PreparedQuery::prepare(s, max).map_err(|e| TestCaseError::fail(e.to_string()))?);
            }
            let prepared = [prepared[0].clone(), prepared[1].clone(), prepared[2].clone()];
            let db = share_template(&t, &mut rng).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let r = (k + max) as usize;
            prop_assert_eq!(prepared[0].rotations[r].rotation, k);
            prop_assert_eq!(shared_counts(&db, &prepared, r), plain_counts(&query, &t, k));
        }
    }
}
