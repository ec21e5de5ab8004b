//! Rotation pairs that share multiplications: the AVX-512 scan of [`super`] for queries with
//! nine or more rotations, with three multiply-accumulates where the plain scan does four.
//!
//! **Why it is possible.** A rotation by k columns moves whole ring elements
//! ([`crate::iris::encoding`]: element `row·200 + col`, coefficients 4e..4e+4), and one 32-lane
//! vector of a stored row holds 8 consecutive columns. Rotating right by k gives
//! Q_k\[c\] = Q_0\[c − k\], so rotation k + 8 at column c + 8 holds what rotation k holds at
//! column c: Q_{k+8}\[c+8\] = Q_k\[c\]. For a stored row A, two taps one vector apart (columns
//! c and c + 8) and the two rotations k and k + 8, with b0 = Q_{k+8}\[c\],
//! b1 = Q_k\[c\] = Q_{k+8}\[c+8\] and b2 = Q_k\[c+8\]:
//!
//! ```text
//! y_{k+8} gets A[c]·b0 + A[c+8]·b1 = M1 + M2      M1 = A[c]·(b0 − b1)
//! y_k     gets A[c]·b1 + A[c+8]·b2 = M2 + M3      M2 = (A[c] + A[c+8])·b1
//!                                                  M3 = A[c+8]·(b2 − b1)
//! ```
//!
//! This is Winograd's minimal filtering algorithm F(2,2) (S. Winograd, "Arithmetic Complexity
//! of Computations", SIAM 1980, doi:10.1137/1.9781611970364; [Win80] in docs/references.md;
//! used for convolutions by Lavin and Gray, "Fast Algorithms for Convolutional Neural
//! Networks", CVPR 2016, arXiv:1509.09308) in its division-free form, so it is exact in
//! Z_2^16: the products and sums are the wrapping u16 arithmetic of the plain scan, in another
//! order.
//!
//! **Layout.** An iris row of a stored share is a segment of 800 u16 (200 columns × 4) = 25
//! vectors: vectors (2i, 2i + 1) for i < 12 are tap pairs (3 products per rotation pair), the
//! last vector is added plainly (2 products: into M1 for k + 8, into M3 for k). Per rotation
//! pair and segment the panel holds 12 × (b0 − b1, b1, b2 − b1) and then (Q_{k+8}, Q_k) of the
//! last vector: 1,216 u16 instead of the 1,600 of two rotations. Rotation r pairs with r + 8
//! while both are free (31 rotations: 15 pairs and rotation k = 8 alone, scanned plainly):
//! 595 products per segment and row instead of 775, 23 % fewer.
//!
//! The pairing is checked, not assumed: a pair whose rotations do not satisfy the identity
//! above (a query that is not a set of rotations of one probe) is scanned plainly.

use std::arch::x86_64::{
    __m512i, _mm512_add_epi16, _mm512_load_si512, _mm512_loadu_si512, _mm512_setzero_si512,
    _mm512_store_si512,
};

use super::avx512::dpwssd;
use super::{cache_block, DotKernel, Slot};
use crate::iris::aligned::AlignedU16s;
use crate::iris::template::IRIS_COLS;

/// Lanes of one vector (u16).
const LANES: usize = 32;
/// u16 of one iris row of a stored share (200 columns × 4 coefficients).
const SEGMENT: usize = 4 * IRIS_COLS;
/// Tap pairs per segment (the 25th vector is added plainly).
const TAP_PAIRS: usize = SEGMENT / LANES / 2;
/// Offset of the unpaired last vector in a segment.
const LAST_VECTOR: usize = 2 * TAP_PAIRS * LANES;
/// Panel u16 per rotation pair and segment.
const PANEL_SEGMENT: usize = TAP_PAIRS * 3 * LANES + 2 * LANES;
/// Rotation indices between the two rotations of a pair (columns in one vector).
const PAIR_DISTANCE: usize = LANES / 4;
/// Segments per cache block: the block's rows and the pairs' panels are re-read from L1/L2 by
/// every pair group.
const BLOCK_SEGMENTS: usize = 2;
/// Rows per register tile and rotation pairs per tile: 3·M·P = 24 accumulators of the 32 zmm
/// registers. Measured (`examples/dot_scan`, N = 100,000, 31 rotations, one thread, 2 vCPU
/// Xeon with AVX-512 VNNI): 4 × 2 0.92–0.97 s, 6 × 1 0.98 s, 3 × 2 1.0 s, 8 × 1 1.07 s, 2 × 4
/// 1.28 s; a cache block of 1 or 4 segments instead of 2: 1.06 / 1.16 s.
const TILE_ROWS: usize = 4;
/// Rotation pairs per register tile (see [`TILE_ROWS`]).
const TILE_PAIRS: usize = 2;

/// One side (code or mask) of a query's rotations, paired for [`scan_side`].
#[derive(Debug)]
pub(super) struct PairedSide {
    /// (r, r + 8): rotation indices of the lower and upper rotation of each pair.
    pairs: Vec<(usize, usize)>,
    /// Rotation indices scanned plainly.
    singles: Vec<usize>,
    /// Per pair, `segments × PANEL_SEGMENT` u16.
    panel: AlignedU16s,
    segments: usize,
}

impl PairedSide {
    /// Pairs the rotations `rots` (each `row_len` long, in increasing k) where the identity of
    /// the module docs holds; `None` when the rows are not whole segments or nothing pairs.
    pub(super) fn new(rots: &[&[u16]], row_len: usize) -> Option<Self> {
        if row_len == 0
            || !row_len.is_multiple_of(SEGMENT)
            || rots.iter().any(|r| r.len() != row_len)
        {
            return None;
        }
        let segments = row_len / SEGMENT;
        let mut taken = vec![false; rots.len()];
        let mut pairs = Vec::new();
        for lo in 0..rots.len() {
            let hi = lo + PAIR_DISTANCE;
            if taken[lo] || hi >= rots.len() || taken[hi] || !pairable(rots[lo], rots[hi]) {
                continue;
            }
            taken[lo] = true;
            taken[hi] = true;
            pairs.push((lo, hi));
        }
        if pairs.is_empty() {
            return None;
        }
        let singles = (0..rots.len()).filter(|&r| !taken[r]).collect();
        let mut panel = AlignedU16s::new();
        panel.reserve_exact(pairs.len() * segments * PANEL_SEGMENT);
        for &(lo, hi) in &pairs {
            for s in 0..segments {
                push_segment(
                    &mut panel,
                    &rots[lo][s * SEGMENT..][..SEGMENT],
                    &rots[hi][s * SEGMENT..][..SEGMENT],
                );
            }
        }
        Some(PairedSide {
            pairs,
            singles,
            panel,
            segments,
        })
    }

    /// The panel of pair `p`.
    fn pair_panel(&self, p: usize) -> &[u16] {
        let len = self.segments * PANEL_SEGMENT;
        &self.panel[p * len..][..len]
    }
}

/// True when rotation `hi` holds at every tap pair's second vector what rotation `lo` holds at
/// its first (Q_{k+8}\[c+8\] = Q_k\[c\]).
fn pairable(lo: &[u16], hi: &[u16]) -> bool {
    lo.chunks_exact(SEGMENT)
        .zip(hi.chunks_exact(SEGMENT))
        .all(|(l, h)| {
            (0..TAP_PAIRS).all(|i| h[(2 * i + 1) * LANES..][..LANES] == l[2 * i * LANES..][..LANES])
        })
}

/// Appends one segment of a pair's panel: per tap pair (b0 − b1, b1, b2 − b1), then the last
/// vector of the upper and of the lower rotation.
fn push_segment(panel: &mut AlignedU16s, lo: &[u16], hi: &[u16]) {
    let mut buf = [0u16; PANEL_SEGMENT];
    for i in 0..TAP_PAIRS {
        let b0 = &hi[2 * i * LANES..][..LANES];
        let b1 = &lo[2 * i * LANES..][..LANES];
        let b2 = &lo[(2 * i + 1) * LANES..][..LANES];
        let out = &mut buf[3 * i * LANES..][..3 * LANES];
        for j in 0..LANES {
            out[j] = b0[j].wrapping_sub(b1[j]);
            out[LANES + j] = b1[j];
            out[2 * LANES + j] = b2[j].wrapping_sub(b1[j]);
        }
    }
    let last = &mut buf[TAP_PAIRS * 3 * LANES..];
    last[..LANES].copy_from_slice(&hi[LAST_VECTOR..][..LANES]);
    last[LANES..].copy_from_slice(&lo[LAST_VECTOR..][..LANES]);
    panel.extend_from_slice(&buf);
}

/// Dot products of consecutive rows (`rows`, each `row_len` long) with every rotation `rots`,
/// entry-major into `out` (rows × R), the pairs of `side` by the F(2,2) tile and its singles by
/// the plain tile of `kernel` (which must be the AVX-512 kernel).
pub(super) fn scan_side(
    kernel: DotKernel,
    rows: &[u16],
    row_len: usize,
    rots: &[&[u16]],
    side: &PairedSide,
    out: &mut [u16],
) {
    let r_count = rots.len();
    let mut acc = vec![Slot::ZERO; TILE_ROWS * (3 * side.pairs.len() + side.singles.len())];
    let singles: Vec<&[u16]> = side.singles.iter().map(|&r| rots[r]).collect();
    let mut blocks = rows.chunks_exact(TILE_ROWS * row_len);
    let mut outs = out.chunks_exact_mut(TILE_ROWS * r_count);
    for (block, o) in (&mut blocks).zip(&mut outs) {
        let rows: [&[u16]; TILE_ROWS] = std::array::from_fn(|m| &block[m * row_len..][..row_len]);
        scan_block(kernel, rows, &singles, side, o, &mut acc);
    }
    let rest = blocks.remainder().chunks_exact(row_len);
    for (row, o) in rest.zip(outs.into_remainder().chunks_exact_mut(r_count)) {
        scan_block(kernel, [row], &singles, side, o, &mut acc);
    }
}

/// The M rows `rows` against every rotation (the pairs of `side`, and `singles`, the
/// rotations of `side.singles`), entry-major into `out` (M × R); `acc` is scratch of at least
/// M·(3·pairs + singles) slots.
fn scan_block<const M: usize>(
    kernel: DotKernel,
    rows: [&[u16]; M],
    singles: &[&[u16]],
    side: &PairedSide,
    out: &mut [u16],
    acc: &mut [Slot],
) {
    let (pair_acc, single_acc) = acc.split_at_mut(3 * M * side.pairs.len());
    let single_acc = &mut single_acc[..M * side.singles.len()];
    pair_acc.fill(Slot::ZERO);
    single_acc.fill(Slot::ZERO);
    let mut s0 = 0;
    while s0 < side.segments {
        let s1 = (s0 + BLOCK_SEGMENTS).min(side.segments);
        let elems = s0 * SEGMENT..s1 * SEGMENT;
        let row_slices = rows.map(|r| &r[elems.clone()]);
        let panel = |p: usize| &side.pair_panel(p)[s0 * PANEL_SEGMENT..s1 * PANEL_SEGMENT];
        let mut groups = pair_acc.chunks_exact_mut(3 * M * TILE_PAIRS);
        let mut p = 0;
        for a in &mut groups {
            let panels: [&[u16]; TILE_PAIRS] = std::array::from_fn(|i| panel(p + i));
            // SAFETY: `PairedSide` is only used with the AVX-512 kernel (`super::scan_side`),
            // which exists only on a CPU with AVX-512F/BW/VNNI.
            unsafe { tile(row_slices, panels, a) };
            p += TILE_PAIRS;
        }
        for a in groups.into_remainder().chunks_exact_mut(3 * M) {
            // SAFETY: as above.
            unsafe { tile(row_slices, [panel(p)], a) };
            p += 1;
        }
        if !singles.is_empty() {
            cache_block::<M, 4>(kernel, row_slices, singles, elems, single_acc);
        }
        s0 = s1;
    }
    let r_count = side.pairs.len() * 2 + side.singles.len();
    let sum = |a: &Slot, b: &Slot| kernel.hsum(a).wrapping_add(kernel.hsum(b));
    for (p, &(lo, hi)) in side.pairs.iter().enumerate() {
        for m in 0..M {
            let a = &pair_acc[(p * M + m) * 3..][..3];
            out[m * r_count + hi] = sum(&a[0], &a[1]);
            out[m * r_count + lo] = sum(&a[1], &a[2]);
        }
    }
    for (j, &r) in side.singles.iter().enumerate() {
        for m in 0..M {
            out[m * r_count + r] = kernel.hsum(&single_acc[j * M + m]);
        }
    }
}

/// Adds, over the whole segments the inputs share, the three F(2,2) sums M1, M2, M3 of row
/// `rows[m]` against pair panel `panels[p]` into `acc[(p·M + m)·3 + j]` (16 i32 lanes,
/// VPDPWSSD), with the 3·M·P accumulators in registers.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const M: usize, const P: usize>(
    rows: [&[u16]; M],
    panels: [&[u16]; P],
    acc: &mut [Slot],
) {
    let segments = rows
        .iter()
        .map(|r| r.len() / SEGMENT)
        .chain(panels.iter().map(|p| p.len() / PANEL_SEGMENT))
        .min()
        .unwrap_or(0);
    let acc = &mut acc[..3 * M * P];
    let mut regs = [[[_mm512_setzero_si512(); 3]; P]; M];
    for (m, row) in regs.iter_mut().enumerate() {
        for (p, sums) in row.iter_mut().enumerate() {
            for (j, r) in sums.iter_mut().enumerate() {
                let s = &acc[(p * M + m) * 3 + j];
                // SAFETY: a slot is 64 readable bytes, 64-byte aligned (`repr(align(64))`).
                *r = unsafe { _mm512_load_si512(s.0.as_ptr().cast::<__m512i>()) };
            }
        }
    }
    for s in 0..segments {
        let (rb, pb) = (s * SEGMENT, s * PANEL_SEGMENT);
        for i in 0..TAP_PAIRS {
            let mut q = [[_mm512_setzero_si512(); 3]; P];
            for (qp, panel) in q.iter_mut().zip(panels) {
                for (j, v) in qp.iter_mut().enumerate() {
                    // SAFETY: pb + 96·i + 32·j + 32 ≤ (s + 1)·PANEL_SEGMENT ≤ panel.len().
                    *v = unsafe { load(panel, pb + (3 * i + j) * LANES) };
                }
            }
            for (r, row) in regs.iter_mut().zip(rows) {
                // SAFETY: rb + 64·i + 64 ≤ (s + 1)·SEGMENT ≤ row.len().
                let (x0, x1) = unsafe {
                    (
                        load(row, rb + 2 * i * LANES),
                        load(row, rb + (2 * i + 1) * LANES),
                    )
                };
                let both = _mm512_add_epi16(x0, x1);
                for (sums, qp) in r.iter_mut().zip(&q) {
                    // SAFETY: the caller guarantees AVX-512 VNNI.
                    unsafe {
                        sums[0] = dpwssd(sums[0], x0, qp[0]);
                        sums[1] = dpwssd(sums[1], both, qp[1]);
                        sums[2] = dpwssd(sums[2], x1, qp[2]);
                    }
                }
            }
        }
        let last: [[__m512i; 2]; P] = std::array::from_fn(|p| {
            // SAFETY: the two last vectors end at (s + 1)·PANEL_SEGMENT ≤ panels[p].len().
            unsafe {
                [
                    load(panels[p], pb + 3 * TAP_PAIRS * LANES),
                    load(panels[p], pb + (3 * TAP_PAIRS + 1) * LANES),
                ]
            }
        });
        for (r, row) in regs.iter_mut().zip(rows) {
            // SAFETY: rb + LAST_VECTOR + 32 = (s + 1)·SEGMENT ≤ row.len().
            let x = unsafe { load(row, rb + LAST_VECTOR) };
            for (sums, l) in r.iter_mut().zip(&last) {
                // SAFETY: the caller guarantees AVX-512 VNNI.
                unsafe {
                    sums[0] = dpwssd(sums[0], x, l[0]);
                    sums[2] = dpwssd(sums[2], x, l[1]);
                }
            }
        }
    }
    for (m, row) in regs.iter().enumerate() {
        for (p, sums) in row.iter().enumerate() {
            for (j, &r) in sums.iter().enumerate() {
                let s = &mut acc[(p * M + m) * 3 + j];
                // SAFETY: a slot is 64 writable bytes, 64-byte aligned (`repr(align(64))`).
                unsafe { _mm512_store_si512(s.0.as_mut_ptr().cast::<__m512i>(), r) };
            }
        }
    }
}

/// Loads 32 u16 starting at element `i` of `s`.
///
/// # Safety
/// The CPU must support AVX-512F and `i + 32 <= s.len()`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load(s: &[u16], i: usize) -> __m512i {
    debug_assert!(i + LANES <= s.len());
    // SAFETY: the caller guarantees 64 bytes from index i are in bounds; `loadu` has no
    // alignment requirement.
    unsafe { _mm512_loadu_si512(s.as_ptr().add(i).cast::<__m512i>()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::dot::{scan, ShareMatrix};
    use crate::iris::encoding::{IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
    use crate::iris::query::PreparedQuery;
    use crate::party::PartyIndex;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    /// Random coefficients, a quarter of them the wrapping extremes.
    fn values(n: usize, rng: &mut ChaCha20Rng) -> Vec<u16> {
        const EXTREMES: [u16; 4] = [0x7FFF, 0x8000, 0x8001, 0xFFFF];
        (0..n)
            .map(|_| match rng.gen_range(0..8) {
                i @ 0..=1 => EXTREMES[i],
                _ => rng.gen(),
            })
            .collect()
    }

    /// A prepared query from a random probe share: its rotations are true rotations.
    fn rotated_query(max_rotation: i32, rng: &mut ChaCha20Rng) -> PreparedQuery {
        let probe = IrisShare {
            party: PartyIndex::ALL[1],
            code: values(CODE_SHARE_COEFS, rng),
            mask: values(MASK_SHARE_COEFS, rng),
        };
        PreparedQuery::prepare(&probe, max_rotation).expect("prepare")
    }

    fn sides(query: &PreparedQuery) -> [Option<PairedSide>; 2] {
        let code: Vec<&[u16]> = query.rotations.iter().map(|r| &r.code[..]).collect();
        let mask: Vec<&[u16]> = query.rotations.iter().map(|r| &r.mask[..]).collect();
        [
            PairedSide::new(&code, CODE_SHARE_COEFS),
            PairedSide::new(&mask, MASK_SHARE_COEFS),
        ]
    }

    #[test]
    fn thirty_one_rotations_make_fifteen_pairs_and_one_single() {
        let mut rng = ChaCha20Rng::seed_from_u64(81);
        let [code, mask] = sides(&rotated_query(15, &mut rng));
        for side in [code.expect("code pairs"), mask.expect("mask pairs")] {
            let want: Vec<(usize, usize)> = (0..8).chain(16..23).map(|lo| (lo, lo + 8)).collect();
            assert_eq!(side.pairs, want);
            assert_eq!(side.singles, vec![23]);
        }
        // Fewer than nine rotations do not pair; nine make one pair.
        assert!(sides(&rotated_query(3, &mut rng))
            .iter()
            .all(Option::is_none));
        let [code, _] = sides(&rotated_query(4, &mut rng));
        let code = code.expect("one pair");
        assert_eq!(code.pairs, vec![(0, 8)]);
        assert_eq!(code.singles, (1..8).collect::<Vec<_>>());
    }

    #[test]
    fn rotations_that_are_not_rotations_of_each_other_do_not_pair() {
        let mut rng = ChaCha20Rng::seed_from_u64(82);
        let mut query = rotated_query(15, &mut rng);
        // Rotation k = −3 (index 12) changed in the second vector of one tap pair: its pair
        // with index 4 breaks (the identity is checked there), the pair (12, 20) does not
        // look at that vector of index 12.
        query.rotations[12].code[5 * SEGMENT + 3 * LANES] ^= 1;
        let [code, mask] = sides(&query);
        let code = code.expect("other pairs");
        assert!(!code.pairs.contains(&(4, 12)));
        assert!(code.singles.contains(&4));
        assert_eq!(mask.expect("mask pairs").pairs.len(), 15);
        // Independent random rotations do not pair at all.
        let random: Vec<Vec<u16>> = (0..31)
            .map(|_| values(MASK_SHARE_COEFS, &mut rng))
            .collect();
        let random: Vec<&[u16]> = random.iter().map(|r| &r[..]).collect();
        assert!(PairedSide::new(&random, MASK_SHARE_COEFS).is_none());
        // Rows that are not whole iris rows do not pair.
        let short: Vec<&[u16]> = random.iter().map(|r| &r[..SEGMENT - 32]).collect();
        assert!(PairedSide::new(&short, SEGMENT - 32).is_none());
    }

    #[test]
    fn the_paired_scan_equals_the_portable_scan() {
        let Some(kernel) = DotKernel::avx512() else {
            eprintln!(
                "the_paired_scan_equals_the_portable_scan: SKIP, this CPU lacks \
                 AVX-512F/BW/VNNI (the pairing itself is checked by the other tests)"
            );
            return;
        };
        let mut rng = ChaCha20Rng::seed_from_u64(83);
        // 7 rows: two tiles of three and one row alone.
        let n = 7;
        let codes = values(n * CODE_SHARE_COEFS, &mut rng);
        let masks = values(n * MASK_SHARE_COEFS, &mut rng);
        let db = ShareMatrix::new(&codes, &masks).expect("matrix");
        for max_rotation in [4, 8, 15, 20] {
            let mut query = rotated_query(max_rotation, &mut rng);
            let want = scan(DotKernel::portable(), &db, &query).expect("portable");
            let got = scan(kernel, &db, &query).expect("paired");
            assert!(got == want, "±{max_rotation} columns");
            // With one pair broken (index 1 changed in the first vector of a tap pair, which
            // pair (1, 9) needs equal to the second of index 9) the results still agree.
            query.rotations[1].code[2 * LANES] ^= 0x8000;
            let [code, _] = sides(&query);
            assert!(code.is_some_and(|c| !c.pairs.contains(&(1, 9))));
            let want = scan(DotKernel::portable(), &db, &query).expect("portable");
            let got = scan(kernel, &db, &query).expect("paired");
            assert!(got == want, "±{max_rotation} columns, one pair broken");
        }
    }
}
