//! The iris scan rewritten as int8 matrix products, and a CPU emulation of it.
//!
//! **The scan.** Party p's local step of [BGK+24] §4.3.2 is, for every enrolled share row `a`
//! and every prepared query rotation `q`, the wrapping dot product `Σ a[j]·q[j] mod 2^16` over
//! 12,800 code (and 6,400 mask) u16 coefficients (`privmatch_core::iris::dot`). Tensor cores
//! multiply int8 matrices with int32 accumulation; this module maps one onto the other.
//!
//! **Balanced limbs.** Every u16 `x` is written `x ≡ lo + 256·hi (mod 2^16)` with `lo`, `hi`
//! signed bytes in [−128, 127] ([`split`]). Then, mod 2^16,
//!
//! ```text
//! Σ a·q ≡ Σ a_lo·q_lo + 256·(Σ a_lo·q_hi + Σ a_hi·q_lo)        (the 65536·a_hi·q_hi term vanishes)
//! ```
//!
//! Because both limbs are signed, the int8 products are the limbs' true products: no
//! correction sums (as unsigned limbs offset by 128 would need) are computed or stored.
//!
//! **Two GEMM columns per rotation.** A database row is stored as the 2K bytes `[a_lo | a_hi]`
//! (K = 12,800 for codes, 6,400 for masks). Each rotation r contributes two query columns of
//! length 2K: `low(r) = [q_lo ; 0]` and `cross(r) = [q_hi ; q_lo]`, so one int8 GEMM gives per
//! row and rotation `P_low = Σ a_lo·q_lo` and `P_cross = Σ a_lo·q_hi + Σ a_hi·q_lo`, and the
//! combine step outputs `(P_low + 256·P_cross) mod 2^16`. The zero half of `low(r)` costs
//! tensor-core work, not memory traffic: at R ≤ 64 rotations the product reads each database
//! byte once and is bound by memory bandwidth, not arithmetic. The columns are padded to a
//! multiple of [`COLUMN_ALIGN`] (zero columns) so the int8 GEMM's leading dimensions suit the
//! tensor-core kernels.
//!
//! **No overflow.** `|P_cross| ≤ 2·K·128·128` = 419,430,400 for codes ([`worst_case_accumulator`]),
//! below 2^31 − 1, so the int32 accumulators are exact, and the wrap to 16 bits happens only in
//! the combine step. Tests check the worst case (all limbs −128) explicitly.
//!
//! [BGK+24]: Bloemen, Kales, Sippl, Walch, "Large-Scale MPC: Scaling Private Iris Code
//! Uniqueness Checks to Millions of Users", ePrint 2024/705.

use privmatch_core::iris::dot::{DotShares, ShareMatrix};
use privmatch_core::iris::encoding::{CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use privmatch_core::iris::query::PreparedQuery;

/// Query columns are padded (with zero columns) to a multiple of this.
pub const COLUMN_ALIGN: usize = 8;

/// The balanced limbs `(lo, hi)` of `x`: `x ≡ lo + 256·hi (mod 2^16)`, both in [−128, 127].
pub fn split(x: u16) -> (i8, i8) {
    let lo = x as u8 as i8;
    // x − lo is a multiple of 256 modulo 2^16; its high byte is hi.
    let rest = x.wrapping_sub(lo as i16 as u16);
    (lo, (rest >> 8) as u8 as i8)
}

/// Which of the two share matrices of a row a GEMM runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// 12,800 code coefficients per row.
    Code,
    /// 6,400 mask coefficients per row.
    Mask,
}

impl Half {
    /// Coefficients per row, K.
    pub fn coefs(self) -> usize {
        match self {
            Half::Code => CODE_SHARE_COEFS,
            Half::Mask => MASK_SHARE_COEFS,
        }
    }

    /// Bytes of one row in limb form, 2K.
    pub fn limb_row_bytes(self) -> usize {
        2 * self.coefs()
    }

    /// The half's u16 coefficients of all rows of `db`.
    pub fn of<'a>(self, db: &ShareMatrix<'a>) -> &'a [u16] {
        match self {
            Half::Code => db.codes(),
            Half::Mask => db.masks(),
        }
    }

    /// The half's coefficients of every rotation of `query`, rotation by rotation.
    pub fn rotations(self, query: &PreparedQuery) -> Vec<&[u16]> {
        query
            .rotations
            .iter()
            .map(|r| match self {
                Half::Code => r.code.as_slice(),
                Half::Mask => r.mask.as_slice(),
            })
            .collect()
    }
}

/// Writes the limb form `[lo(K) | hi(K)]` of the row `row` (K u16) into `out` (2K bytes).
pub fn split_row(row: &[u16], out: &mut [i8]) {
    let k = row.len();
    let (lo, hi) = out.split_at_mut(k);
    for ((x, l), h) in row.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
        (*l, *h) = split(*x);
    }
}

/// The number of GEMM columns for `rotations` rotations: two per rotation, padded.
pub fn padded_columns(rotations: usize) -> usize {
    (2 * rotations).div_ceil(COLUMN_ALIGN).max(1) * COLUMN_ALIGN
}

/// The query matrix of one half, column-major (`padded_columns(R)` columns of 2K bytes):
/// columns `2r` = `[q_lo ; 0]` and `2r + 1` = `[q_hi ; q_lo]` for rotation r, then zero columns.
pub fn query_matrix(rotations: &[&[u16]], k: usize) -> Vec<i8> {
    let cols = padded_columns(rotations.len());
    let mut m = vec![0i8; cols * 2 * k];
    for (r, q) in rotations.iter().enumerate() {
        let (low, cross) = m[2 * r * 2 * k..(2 * r + 2) * 2 * k].split_at_mut(2 * k);
        for (j, &x) in q.iter().take(k).enumerate() {
            let (lo, hi) = split(x);
            low[j] = lo;
            cross[j] = hi;
            cross[k + j] = lo;
        }
    }
    m
}

/// The share of one (row, rotation) from its two accumulators: `(P_low + 256·P_cross) mod 2^16`.
/// The CUDA combine kernel computes exactly this (`kernels.rs`).
pub fn combine(low: i32, cross: i32) -> u16 {
    (low as u32).wrapping_add((cross as u32).wrapping_shl(8)) as u16
}

/// The largest |accumulator| an int8 GEMM over 2K limbs can produce: 2K products of at most
/// 128·128. Must stay below `i32::MAX` for the GEMM to be exact.
pub const fn worst_case_accumulator(k: usize) -> u64 {
    2 * k as u64 * 128 * 128
}

/// The int32 product of a limb row and a query column, as the tensor cores compute it.
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .fold(0i32, |acc, (&x, &y)| acc + i32::from(x) * i32::from(y))
}

/// The whole GPU computation emulated on the CPU, step for step: limb split of the rows and of
/// the query, the int8 GEMM with int32 accumulation, the combine. Slow (no SIMD); for tests
/// that pin the arithmetic the device runs to the CPU kernel's results.
pub fn emulate_scan(db: &ShareMatrix<'_>, query: &PreparedQuery) -> DotShares {
    let r = query.num_rotations();
    let n = db.len();
    let mut out = [vec![0u16; n * r], vec![0u16; n * r]];
    for (half, dst) in [Half::Code, Half::Mask].into_iter().zip(out.iter_mut()) {
        let k = half.coefs();
        let q = query_matrix(&half.rotations(query), k);
        let mut limbs = vec![0i8; 2 * k];
        for (e, row) in half.of(db).chunks_exact(k).enumerate() {
            split_row(row, &mut limbs);
            for rot in 0..r {
                let low = dot_i8(&limbs, &q[2 * rot * 2 * k..(2 * rot + 1) * 2 * k]);
                let cross = dot_i8(&limbs, &q[(2 * rot + 1) * 2 * k..(2 * rot + 2) * 2 * k]);
                dst[e * r + rot] = combine(low, cross);
            }
        }
    }
    let [code, mask] = out;
    DotShares {
        num_rotations: r,
        num_entries: n,
        code,
        mask,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmatch_core::iris::dot::{scan, DotKernel};
    use privmatch_core::iris::encoding::share_template;
    use privmatch_core::iris::query::share_query_template;
    use privmatch_core::iris::synth::random_template;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn limbs_recombine_to_every_u16() {
        for x in 0..=u16::MAX {
            let (lo, hi) = split(x);
            let back = (lo as i16 as u16).wrapping_add((hi as i16 as u16).wrapping_shl(8));
            assert_eq!(back, x, "{x}");
        }
        assert_eq!(split(0x0080), (-128, 1));
        assert_eq!(split(0xffff), (-1, 0));
        assert_eq!(split(0x8000), (0, -128));
    }

    #[test]
    fn the_worst_case_accumulator_fits_in_i32_and_is_reached_exactly() {
        for half in [Half::Code, Half::Mask] {
            let k = half.coefs();
            assert!(worst_case_accumulator(k) < i32::MAX as u64, "{half:?}");
            // All limbs −128: the cross column (two −128 blocks) against a row of −128s.
            let row = vec![-128i8; 2 * k];
            let col = vec![-128i8; 2 * k];
            assert_eq!(dot_i8(&row, &col) as u64, worst_case_accumulator(k));
        }
        // The u16 value whose limbs are (−128, −128): 0x7f80.
        assert_eq!(split(0x7f80), (-128, -128));
    }

    #[test]
    fn combine_wraps_like_u16_arithmetic() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        for _ in 0..10_000 {
            let (a, b): (i32, i32) = (rng.gen(), rng.gen());
            let want = (a as u16).wrapping_add((b as u16).wrapping_mul(256));
            assert_eq!(combine(a, b), want);
        }
    }

    fn random_db(rows: usize, rng: &mut ChaCha20Rng) -> (Vec<u16>, Vec<u16>) {
        let (mut codes, mut masks) = (Vec::new(), Vec::new());
        for i in 0..rows {
            if i % 3 == 2 {
                // Extreme rows: every coefficient at a limb boundary.
                let v = [0x7f80u16, 0x8080, 0xffff, 0x0080][i % 4];
                codes.extend(std::iter::repeat_n(v, CODE_SHARE_COEFS));
                masks.extend(std::iter::repeat_n(v, MASK_SHARE_COEFS));
            } else {
                let s = share_template(&random_template(rng), rng).expect("share")[i % 3].clone();
                codes.extend_from_slice(&s.code);
                masks.extend_from_slice(&s.mask);
            }
        }
        (codes, masks)
    }

    #[test]
    fn emulated_gemm_equals_the_cpu_kernel_for_1_31_and_201_rotations() {
        let mut rng = ChaCha20Rng::seed_from_u64(13);
        let (codes, masks) = random_db(7, &mut rng);
        let db = ShareMatrix::new(&codes, &masks).expect("matrix");
        let probe = random_template(&mut rng);
        for (max, party) in [(0, 0), (15, 1), (100, 2)] {
            let share = share_query_template(&probe, &mut rng).expect("query")[party].clone();
            let query = PreparedQuery::prepare(&share, max).expect("prepare");
            let want = scan(DotKernel::detect(), &db, &query).expect("scan");
            assert_eq!(emulate_scan(&db, &query), want, "{} rotations", 2 * max + 1);
        }
    }

    #[test]
    fn query_matrix_has_the_documented_columns() {
        let q: Vec<u16> = vec![0x0180, 0xfffe];
        let m = query_matrix(&[&q], 2);
        assert_eq!(m.len(), COLUMN_ALIGN * 4);
        let (lo0, hi0) = split(0x0180);
        let (lo1, hi1) = split(0xfffe);
        assert_eq!(&m[0..4], &[lo0, lo1, 0, 0]);
        assert_eq!(&m[4..8], &[hi0, hi1, lo0, lo1]);
        assert!(m[8..].iter().all(|&v| v == 0));
        assert_eq!(padded_columns(31), 64);
        assert_eq!(padded_columns(1), 8);
        assert_eq!(padded_columns(201), 408);
    }
}
