//! The per-party share encoding of an iris template (docs/protocols/iris.md; [BGK+24] §4.1.1 masked
//! bitvectors, §4.2 Shamir over Galois rings, §5 shared masks).
//!
//! **Code.** Each of the 12,800 code bits becomes v = mask − 2·(code ∧ mask) ∈ {0, 1, −1} in
//! Z_2^16 (0 = masked out, 1 = bit 0, −1 = bit 1; [BGK+24] §4.1.1). For two encoded codes the
//! plain dot product Σ v_a·v_b = popcount(ma ∧ mb) − 2·popcount((ca ⊕ cb) ∧ ma ∧ mb). The values
//! are packed four to a [`GaloisRing16`] element: element `e = row*200 + col`, coefficient
//! `j = 2*wavelet + real_imag` — exactly the 4 bits with indices 4e..4e+3. A column rotation
//! therefore moves whole elements (rotate each row of 200 elements), which is what lets parties
//! rotate shares locally.
//!
//! **Mask.** The mask is duplicated along the last axis (real bit = imaginary bit), so only the
//! real halves are shared: 6,400 values (mask bit ∈ {0, 1}) packed as 1,600 elements with
//! element `e = (row/2)*200 + col` and coefficient `j = 2*(row%2) + wavelet` (two rows × two
//! wavelets at one column; again a column rotation moves whole elements). The plain dot product
//! of two encoded masks over these 6,400 values is **half** of popcount(ma ∧ mb) over the full
//! 12,800 bits.
//!
//! **Shares.** Each element is shared with degree-1 Shamir over GR(2^16, 4) ([`crate::iris::sharing::shamir`]);
//! a party's share is stored as flat coefficient vectors, element-major (element e at positions
//! 4e..4e+4): 12,800 u16 for the code (25.6 KB) and 6,400 u16 for the mask (12.8 KB).

use std::fmt;

use rand_core::RngCore;

use super::template::{bit_index, IrisBits, IrisTemplate, IRIS_COLS, IRIS_ROWS, IRIS_WAVELETS};
use crate::algebra::galois::{flatten_coefs, GaloisRing16};
use crate::iris::sharing::shamir::{self, ShamirError};
use crate::party::PartyIndex;

/// Galois-ring elements in an encoded code (16 rows × 200 columns).
pub const CODE_SHARE_ELEMENTS: usize = IRIS_ROWS * IRIS_COLS;
/// Z_2^16 coefficients in an encoded code (one per code bit).
pub const CODE_SHARE_COEFS: usize = 4 * CODE_SHARE_ELEMENTS;
/// Galois-ring elements in an encoded mask (8 row pairs × 200 columns).
pub const MASK_SHARE_ELEMENTS: usize = IRIS_ROWS / 2 * IRIS_COLS;
/// Z_2^16 coefficients in an encoded mask (the real half of the mask bits).
pub const MASK_SHARE_COEFS: usize = 4 * MASK_SHARE_ELEMENTS;

/// The encoding of a code bit that is 1 under the mask: −1 in Z_2^16.
const MINUS_ONE: u16 = u16::MAX;

/// Why a template could not be encoded, decoded, shared or reconstructed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodingError {
    /// The mask's real and imaginary bits differ somewhere, so it cannot be shared as its
    /// real half.
    #[error("iris mask is not duplicated along the last axis: the real and imaginary mask bits differ at row {row}, column {col}, wavelet {wavelet}; only masks whose real and imaginary bits agree (as Open-IRIS produces) can be shared")]
    MaskNotDuplicated {
        /// Row of the first mismatch.
        row: usize,
        /// Column of the first mismatch.
        col: usize,
        /// Wavelet of the first mismatch.
        wavelet: usize,
    },
    /// A vector had the wrong length.
    #[error("{what}: expected {expected} values, got {got}")]
    WrongLength {
        /// What the vector is (e.g. "code share of P1").
        what: String,
        /// The required length.
        expected: usize,
        /// The supplied length.
        got: usize,
    },
    /// A decoded code value is not in {0, 1, −1}.
    #[error("decoded iris code value {value:#06x} at element {element}, coefficient {coef} is not an encoded bit (expected 0, 1 or 0xffff = −1)")]
    InvalidCodeValue {
        /// Element index.
        element: usize,
        /// Coefficient within the element.
        coef: usize,
        /// The offending value.
        value: u16,
    },
    /// A decoded mask value is not in {0, 1}.
    #[error("decoded iris mask value {value:#06x} at element {element}, coefficient {coef} is not a bit (expected 0 or 1)")]
    InvalidMaskValue {
        /// Element index.
        element: usize,
        /// Coefficient within the element.
        coef: usize,
        /// The offending value.
        value: u16,
    },
    /// A decoded code value is nonzero where the mask is 0.
    #[error("decoded iris code is nonzero ({value:#06x}) at bit {bit} where the mask is 0")]
    CodeOutsideMask {
        /// Bit index of the template.
        bit: usize,
        /// The offending value.
        value: u16,
    },
    /// A decoded code value is 0 where the mask is 1.
    #[error(
        "decoded iris code is 0 at bit {bit} where the mask is 1 (a valid bit encodes as 1 or −1)"
    )]
    CodeZeroInsideMask {
        /// Bit index of the template.
        bit: usize,
    },
    /// The Shamir layer refused the shares (too few, duplicate parties, inconsistent).
    #[error(transparent)]
    Shamir(#[from] ShamirError),
}

/// Checks a vector length, naming the vector in the error.
fn check_len(
    what: impl FnOnce() -> String,
    expected: usize,
    got: usize,
) -> Result<(), EncodingError> {
    if expected == got {
        Ok(())
    } else {
        Err(EncodingError::WrongLength {
            what: what(),
            expected,
            got,
        })
    }
}

/// Encodes the code as 3,200 Galois-ring elements of values mask − 2·(code ∧ mask) (module
/// docs: element `row*200 + col`, coefficient `2*wavelet + real_imag`).
pub fn encode_code(t: &IrisTemplate) -> Vec<GaloisRing16> {
    let mut out = Vec::with_capacity(CODE_SHARE_ELEMENTS);
    for e in 0..CODE_SHARE_ELEMENTS {
        let mut coefs = [0u16; 4];
        for (j, c) in coefs.iter_mut().enumerate() {
            let i = 4 * e + j;
            *c = match (t.mask.get(i), t.code.get(i)) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => MINUS_ONE,
            };
        }
        out.push(GaloisRing16::from_coefs(coefs));
    }
    out
}

/// Encodes the real half of the mask as 1,600 Galois-ring elements of bits (module docs:
/// element `(row/2)*200 + col`, coefficient `2*(row%2) + wavelet`). Fails when the mask is
/// not duplicated along the last axis, naming the first position where it is not.
pub fn encode_mask(t: &IrisTemplate) -> Result<Vec<GaloisRing16>, EncodingError> {
    if let Some((row, col, wavelet)) = t.mask.first_real_imag_mismatch() {
        return Err(EncodingError::MaskNotDuplicated { row, col, wavelet });
    }
    let mut out = Vec::with_capacity(MASK_SHARE_ELEMENTS);
    for row_pair in 0..IRIS_ROWS / 2 {
        for col in 0..IRIS_COLS {
            let mut coefs = [0u16; 4];
            for (j, c) in coefs.iter_mut().enumerate() {
                let row = 2 * row_pair + j / IRIS_WAVELETS;
                let wavelet = j % IRIS_WAVELETS;
                *c = u16::from(t.mask.get(bit_index(row, col, wavelet, 0)));
            }
            out.push(GaloisRing16::from_coefs(coefs));
        }
    }
    Ok(out)
}

/// Inverts [`encode_code`] and [`encode_mask`]: rebuilds the template from encoded (or
/// reconstructed) elements. Code bits outside the mask come back as 0 (the encoding does not
/// carry them; compare with [`IrisTemplate::with_masked_code`]). Values outside {0, 1, −1}
/// (code) or {0, 1} (mask), and code values that contradict the mask, are errors.
pub fn decode(
    code_elems: &[GaloisRing16],
    mask_elems: &[GaloisRing16],
) -> Result<IrisTemplate, EncodingError> {
    check_len(
        || "encoded iris code elements".into(),
        CODE_SHARE_ELEMENTS,
        code_elems.len(),
    )?;
    check_len(
        || "encoded iris mask elements".into(),
        MASK_SHARE_ELEMENTS,
        mask_elems.len(),
    )?;
    let mut mask = IrisBits::zeros();
    for (e, elem) in mask_elems.iter().enumerate() {
        let (row_pair, col) = (e / IRIS_COLS, e % IRIS_COLS);
        for (j, &value) in elem.coefs.iter().enumerate() {
            let bit = match value {
                0 => false,
                1 => true,
                _ => {
                    return Err(EncodingError::InvalidMaskValue {
                        element: e,
                        coef: j,
                        value,
                    })
                }
            };
            let row = 2 * row_pair + j / IRIS_WAVELETS;
            let wavelet = j % IRIS_WAVELETS;
            mask.set(bit_index(row, col, wavelet, 0), bit);
            mask.set(bit_index(row, col, wavelet, 1), bit);
        }
    }
    let mut code = IrisBits::zeros();
    for (e, elem) in code_elems.iter().enumerate() {
        for (j, &value) in elem.coefs.iter().enumerate() {
            let i = 4 * e + j;
            let valid = mask.get(i);
            match (value, valid) {
                (0, false) => {}
                (1, true) => {}
                (MINUS_ONE, true) => code.set(i, true),
                (0, true) => return Err(EncodingError::CodeZeroInsideMask { bit: i }),
                (1 | MINUS_ONE, false) => {
                    return Err(EncodingError::CodeOutsideMask { bit: i, value })
                }
                _ => {
                    return Err(EncodingError::InvalidCodeValue {
                        element: e,
                        coef: j,
                        value,
                    })
                }
            }
        }
    }
    Ok(IrisTemplate::new(code, mask))
}

/// Rotates rows of 200 elements by `k` columns (element at column c moves to (c + k) mod 200),
/// the same direction as [`IrisBits::rotate`]. `rows` is the expected number of rows.
fn rotate_rows<T: Copy>(
    elems: &[T],
    rows: usize,
    k: i32,
    what: &str,
) -> Result<Vec<T>, EncodingError> {
    check_len(|| what.to_string(), rows * IRIS_COLS, elems.len())?;
    let shift = k.rem_euclid(IRIS_COLS as i32) as usize;
    let mut out = elems.to_vec();
    for row in out.chunks_exact_mut(IRIS_COLS) {
        row.rotate_right(shift);
    }
    Ok(out)
}

/// Rotates an encoded (or shared) code by `k` columns: rotating the template by k
/// ([`IrisTemplate::rotate`]) and encoding equals encoding and rotating each row of 200
/// elements. Works on shares too (rotation is a permutation, so it is local).
pub fn rotate_code_elements(
    elems: &[GaloisRing16],
    k: i32,
) -> Result<Vec<GaloisRing16>, EncodingError> {
    rotate_rows(elems, IRIS_ROWS, k, "encoded iris code elements")
}

/// Rotates an encoded (or shared) mask by `k` columns (8 rows of 200 elements, each holding
/// two template rows), matching [`IrisTemplate::rotate`].
pub fn rotate_mask_elements(
    elems: &[GaloisRing16],
    k: i32,
) -> Result<Vec<GaloisRing16>, EncodingError> {
    rotate_rows(elems, IRIS_ROWS / 2, k, "encoded iris mask elements")
}

/// One party's Shamir share of an iris template, as flat Z_2^16 coefficient vectors,
/// element-major (element e at 4e..4e+4; module docs for the element layout).
#[derive(Clone, PartialEq, Eq)]
pub struct IrisShare {
    /// The party holding this share (its Shamir evaluation point).
    pub party: PartyIndex,
    /// 12,800 coefficients: the share of the 3,200 encoded code elements.
    pub code: Vec<u16>,
    /// 6,400 coefficients: the share of the 1,600 encoded mask elements.
    pub mask: Vec<u16>,
}

impl fmt::Debug for IrisShare {
    /// Prints the party and the vector lengths (not the 19,200 share values).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IrisShare")
            .field("party", &self.party)
            .field("code_len", &self.code.len())
            .field("mask_len", &self.mask.len())
            .finish()
    }
}

impl IrisShare {
    /// Checks the vector lengths (12,800 code and 6,400 mask coefficients).
    pub fn validate(&self) -> Result<(), EncodingError> {
        check_len(
            || format!("iris code share of {}", self.party),
            CODE_SHARE_COEFS,
            self.code.len(),
        )?;
        check_len(
            || format!("iris mask share of {}", self.party),
            MASK_SHARE_COEFS,
            self.mask.len(),
        )
    }

    /// The share of the template rotated by `k` columns, computed locally: each row of
    /// 200 elements (800 coefficients) is rotated by k elements (4k coefficients).
    pub fn rotate(&self, k: i32) -> Result<IrisShare, EncodingError> {
        self.validate()?;
        let shift = 4 * k.rem_euclid(IRIS_COLS as i32) as usize;
        let rotate = |v: &[u16]| {
            let mut out = v.to_vec();
            for row in out.chunks_exact_mut(4 * IRIS_COLS) {
                row.rotate_right(shift);
            }
            out
        };
        Ok(IrisShare {
            party: self.party,
            code: rotate(&self.code),
            mask: rotate(&self.mask),
        })
    }

    fn elements(&self) -> Result<(Vec<GaloisRing16>, Vec<GaloisRing16>), EncodingError> {
        self.validate()?;
        let group = |v: &[u16]| {
            v.chunks_exact(4)
                .map(|c| GaloisRing16::from_coefs([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>()
        };
        Ok((group(&self.code), group(&self.mask)))
    }
}

/// Encodes the template and shares every code and mask element with degree-1 Shamir over
/// GR(2^16, 4) ([BGK+24] §4.3.2, §5); returns the shares of P0, P1, P2 in that order. Fails if
/// the mask is not duplicated along the last axis.
pub fn share_template<R: RngCore + ?Sized>(
    t: &IrisTemplate,
    rng: &mut R,
) -> Result<[IrisShare; 3], EncodingError> {
    let mask = encode_mask(t)?;
    let code = encode_code(t);
    let code_shares = shamir::share_slice(&code, rng);
    let mask_shares = shamir::share_slice(&mask, rng);
    Ok(PartyIndex::ALL.map(|p| IrisShare {
        party: p,
        code: flatten_coefs(&code_shares[p.as_usize()]),
        mask: flatten_coefs(&mask_shares[p.as_usize()]),
    }))
}

/// Reconstructs the template from the shares of any 2 or 3 distinct parties (with 3, every
/// element is also checked for consistency). The result has code bits outside the mask
/// cleared ([`IrisTemplate::with_masked_code`]).
pub fn reconstruct_template(shares: &[IrisShare]) -> Result<IrisTemplate, EncodingError> {
    let mut parts = Vec::with_capacity(shares.len());
    for s in shares {
        parts.push((s.party, s.elements()?));
    }
    let code: Vec<(PartyIndex, &[GaloisRing16])> =
        parts.iter().map(|(p, (c, _))| (*p, c.as_slice())).collect();
    let mask: Vec<(PartyIndex, &[GaloisRing16])> =
        parts.iter().map(|(p, (_, m))| (*p, m.as_slice())).collect();
    let code = shamir::reconstruct_slice(&code)?;
    let mask = shamir::reconstruct_slice(&mask)?;
    decode(&code, &mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algebra::galois::dot_constant_term_query_layout;
    use crate::iris::template::{masked_code_distance_counts, IRIS_CODE_BITS, MAX_ROTATION};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    /// A random template whose mask is duplicated along the last axis (~20% masked out).
    fn random_template(rng: &mut ChaCha20Rng) -> IrisTemplate {
        let mut code = IrisBits::zeros();
        let mut mask = IrisBits::zeros();
        for m in 0..IRIS_CODE_BITS / 2 {
            let valid = rng.gen_bool(0.8);
            mask.set(2 * m, valid);
            mask.set(2 * m + 1, valid);
            code.set(2 * m, rng.gen());
            code.set(2 * m + 1, rng.gen());
        }
        IrisTemplate::new(code, mask)
    }

    fn plain_dot(a: &[GaloisRing16], b: &[GaloisRing16]) -> u16 {
        let mut acc = 0u16;
        for (x, y) in a.iter().zip(b) {
            for j in 0..4 {
                acc = acc.wrapping_add(x.coefs[j].wrapping_mul(y.coefs[j]));
            }
        }
        acc
    }

    #[test]
    fn encode_decode_round_trip() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        for _ in 0..4 {
            let t = random_template(&mut rng);
            let code = encode_code(&t);
            let mask = encode_mask(&t).expect("duplicated mask");
            assert_eq!(code.len(), CODE_SHARE_ELEMENTS);
            assert_eq!(mask.len(), MASK_SHARE_ELEMENTS);
            assert_eq!(decode(&code, &mask), Ok(t.with_masked_code()));
        }
    }

    #[test]
    fn element_layout() {
        // Code bit (row 3, col 7, wavelet 1, imag) → element 3*200+7, coefficient 3.
        let mut t = IrisTemplate::new(IrisBits::zeros(), IrisBits::ones());
        t.code.set(bit_index(3, 7, 1, 1), true);
        let code = encode_code(&t);
        assert_eq!(code[3 * 200 + 7].coefs, [1, 1, 1, MINUS_ONE]);
        assert_eq!(code[3 * 200 + 8].coefs, [1, 1, 1, 1]);
        // Mask (row 5, col 9, wavelet 0) cleared in both parts → element (5/2)*200+9,
        // coefficient 2*(5%2)+0 = 2.
        t.mask.set(bit_index(5, 9, 0, 0), false);
        t.mask.set(bit_index(5, 9, 0, 1), false);
        let mask = encode_mask(&t).expect("duplicated");
        assert_eq!(mask[2 * 200 + 9].coefs, [1, 1, 0, 1]);
        assert_eq!(encode_code(&t)[5 * 200 + 9].coefs, [0, 0, 1, 1]);
    }

    #[test]
    fn undup_mask_is_rejected_by_name() {
        let mut t = IrisTemplate::new(IrisBits::zeros(), IrisBits::ones());
        t.mask.set(bit_index(4, 100, 1, 0), false);
        let err = encode_mask(&t).expect_err("not duplicated");
        assert_eq!(
            err,
            EncodingError::MaskNotDuplicated {
                row: 4,
                col: 100,
                wavelet: 1
            }
        );
        assert!(err
            .to_string()
            .contains("not duplicated along the last axis"));
        let mut rng = ChaCha20Rng::seed_from_u64(0);
        assert!(share_template(&t, &mut rng).is_err());
    }

    #[test]
    fn decode_rejects_invalid_values() {
        let t = IrisTemplate::new(IrisBits::zeros(), IrisBits::ones());
        let code = encode_code(&t);
        let mask = encode_mask(&t).expect("dup");

        let mut bad = code.clone();
        bad[10].coefs[2] = 2;
        assert_eq!(
            decode(&bad, &mask),
            Err(EncodingError::InvalidCodeValue {
                element: 10,
                coef: 2,
                value: 2
            })
        );
        let mut bad = code.clone();
        bad[10].coefs[2] = 0;
        assert_eq!(
            decode(&bad, &mask),
            Err(EncodingError::CodeZeroInsideMask { bit: 42 })
        );
        let mut bad_mask = mask.clone();
        bad_mask[0].coefs[0] = 0; // row 0, col 0, wavelet 0 masked out → bits 0, 1
        assert_eq!(
            decode(&code, &bad_mask),
            Err(EncodingError::CodeOutsideMask { bit: 0, value: 1 })
        );
        bad_mask[0].coefs[0] = 7;
        assert_eq!(
            decode(&code, &bad_mask),
            Err(EncodingError::InvalidMaskValue {
                element: 0,
                coef: 0,
                value: 7
            })
        );
        let err = decode(&code[1..], &mask).expect_err("short");
        assert_eq!(
            err.to_string(),
            "encoded iris code elements: expected 3200 values, got 3199"
        );
    }

    #[test]
    fn share_round_trip_from_every_pair_and_all_three() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        for _ in 0..3 {
            let t = random_template(&mut rng);
            let shares = share_template(&t, &mut rng).expect("share");
            for (p, s) in shares.iter().enumerate() {
                assert_eq!(s.party, P[p]);
                assert_eq!(s.code.len(), CODE_SHARE_COEFS);
                assert_eq!(s.mask.len(), MASK_SHARE_COEFS);
            }
            let expected = t.with_masked_code();
            for (i, j) in [(0, 1), (0, 2), (1, 2), (2, 0)] {
                let pair = [shares[i].clone(), shares[j].clone()];
                assert_eq!(reconstruct_template(&pair), Ok(expected), "pair {i},{j}");
            }
            assert_eq!(reconstruct_template(&shares), Ok(expected));
        }
    }

    #[test]
    fn reconstruct_rejects_bad_share_sets() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let t = random_template(&mut rng);
        let shares = share_template(&t, &mut rng).expect("share");
        assert_eq!(
            reconstruct_template(&shares[..1]),
            Err(EncodingError::Shamir(ShamirError::TooFewShares { got: 1 }))
        );
        let dup = [shares[1].clone(), shares[1].clone()];
        assert_eq!(
            reconstruct_template(&dup),
            Err(EncodingError::Shamir(ShamirError::DuplicateParty(P[1])))
        );
        let mut short = shares.clone();
        short[2].mask.pop();
        let err = reconstruct_template(&short).expect_err("short mask");
        assert_eq!(
            err.to_string(),
            "iris mask share of P2: expected 6400 values, got 6399"
        );
        let mut tampered = shares.clone();
        tampered[0].code[123] ^= 0x10;
        assert_eq!(
            reconstruct_template(&tampered),
            Err(EncodingError::Shamir(ShamirError::Inconsistent {
                index: 30
            }))
        );
        // A share from the wrong party (claiming P0 while holding P1's values) reconstructs to
        // garbage that the decoder rejects rather than returning a wrong template.
        let mut mislabelled = [shares[1].clone(), shares[2].clone()];
        mislabelled[0].party = P[0];
        assert!(reconstruct_template(&mislabelled).is_err());
    }

    #[test]
    fn rotating_template_equals_rotating_elements_and_shares() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let t = random_template(&mut rng);
        let code = encode_code(&t);
        let mask = encode_mask(&t).expect("dup");
        let shares = share_template(&t, &mut rng).expect("share");
        for k in [-MAX_ROTATION, -7, -1, 0, 1, 2, 13, MAX_ROTATION, 199, 401] {
            let r = t.rotate(k);
            assert_eq!(
                rotate_code_elements(&code, k),
                Ok(encode_code(&r)),
                "code k={k}"
            );
            assert_eq!(
                rotate_mask_elements(&mask, k),
                encode_mask(&r),
                "mask k={k}"
            );
            let rotated: Vec<IrisShare> = shares
                .iter()
                .map(|s| s.rotate(k).expect("valid share"))
                .collect();
            assert_eq!(
                reconstruct_template(&rotated[1..]),
                Ok(r.with_masked_code()),
                "shares k={k}"
            );
        }
        assert!(rotate_code_elements(&mask, 1).is_err());
        assert!(rotate_mask_elements(&code, 1).is_err());
    }

    #[test]
    fn plain_dot_products_give_distance_counts() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        for _ in 0..4 {
            let a = random_template(&mut rng);
            let b = random_template(&mut rng);
            let (hamming, common) = masked_code_distance_counts(&a, &b);
            let code_dot = plain_dot(&encode_code(&a), &encode_code(&b));
            assert_eq!(
                i32::from(code_dot as i16),
                common as i32 - 2 * hamming as i32
            );
            let mask_dot = plain_dot(
                &encode_mask(&a).expect("dup"),
                &encode_mask(&b).expect("dup"),
            );
            assert_eq!(u32::from(mask_dot) * 2, common);
        }
    }

    #[test]
    fn shared_dot_product_via_query_layout() {
        // The seed-001 §4.2 flow in miniature: each party multiplies its query share by its
        // 3-party Lagrange coefficient, re-lays it out with the constant-term layout, and takes
        // a plain u16 dot product with its database share; the three results are additive
        // shares of the plain code dot product (the query is packed with the involutive
        // layout so the constant term is the plain coefficient-wise dot product).
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        let query = random_template(&mut rng);
        let enrolled = random_template(&mut rng);
        let (hamming, common) = masked_code_distance_counts(&query, &enrolled);
        let packed_query: Vec<GaloisRing16> = encode_code(&query)
            .into_iter()
            .map(|q| GaloisRing16::from_coefs(dot_constant_term_query_layout(q)))
            .collect();
        let q_shares = shamir::share_slice(&packed_query, &mut rng);
        let db_shares = share_template(&enrolled, &mut rng).expect("share");
        let mut total = 0u16;
        for p in P {
            let lambda = shamir::lagrange_coefficient_at_zero(p, &P).expect("valid set");
            let mut acc = 0u16;
            let db = db_shares[p.as_usize()].code.chunks_exact(4);
            for (q, d) in q_shares[p.as_usize()].iter().zip(db) {
                let layout = dot_constant_term_query_layout(*q * lambda);
                for (x, y) in d.iter().zip(layout.iter()) {
                    acc = acc.wrapping_add(x.wrapping_mul(*y));
                }
            }
            total = total.wrapping_add(acc);
        }
        assert_eq!(i32::from(total as i16), common as i32 - 2 * hamming as i32);
    }
}
