//! The party-local dot-product kernel of the iris matcher (seed 001 §4.2: "the dot product is
//! computed locally as a plain u16 dot product"; seed 001 §5: codes and masks both shared).
//!
//! **Input.** One party's enrolled shares as a contiguous row-major matrix ([`ShareMatrix`]):
//! N rows of 12,800 u16 code coefficients and N rows of 6,400 u16 mask coefficients, each row
//! in the stored element-major layout ([`crate::iris::encoding`]); and the same party's
//! [`PreparedQuery`] (R rotations).
//!
//! **Output layout: entry-major.** [`DotShares`] holds, for every entry e and rotation index r
//! (k = r − max), the party's 3-of-3 additive share of the code dot product at
//! `code[e * R + r]` and of the mask dot product at `mask[e * R + r]`. Entry-major keeps the
//! output of an entry range contiguous, so a caller splitting the scan across threads by entry
//! ranges hands each thread a disjoint `chunks_mut` of the output ([`scan_range`]); it also
//! keeps an entry's rotations together for the later OR over rotations. These additive shares
//! are then reshared into replicated shares ([`crate::mpc::reshare`]).
//!
//! **Arithmetic.** Wrapping u16 multiply-add, exact modulo 2^16 in any order, so the SIMD and
//! portable kernels agree bit for bit. **Dispatch** at run time ([`DotKernel::detect`]):
//! AVX-512 VNNI (`_mm512_dpwssd_epi32`, 32 u16 per step) when the CPU has AVX-512F/BW/VNNI,
//! else AVX2 (`_mm256_mullo_epi16` + `_mm256_add_epi16`, 16 lanes), otherwise a portable
//! chunked loop the compiler auto-vectorises. The scan takes database rows four at a
//! time and computes four dot products per pass over a query rotation, so each rotation is
//! read once per four entries while those rows stay in cache (figures: BENCHMARKS.md,
//! `examples/dot_scan.rs`).
//!
//! No threads here: the caller owns the pool and calls [`scan_range`] on sub-ranges.
//! Rounds: none (local).

use std::ops::Range;

use super::encoding::{EncodingError, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use super::query::{PreparedQuery, PreparedRotation};

/// Bytes of shares one entry contributes to a scan (code 25,600 + mask 12,800; DESIGN §5), for
/// the benchmark's bandwidth figure.
pub const SHARE_BYTES_PER_ENTRY: usize = 2 * (CODE_SHARE_COEFS + MASK_SHARE_COEFS);

/// Why a scan was refused. Messages carry shapes only, never share values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DotError {
    /// A matrix length is not a whole number of rows.
    #[error(
        "iris share matrix: {what} has {len} coefficients, not a multiple of the row length {row}"
    )]
    RaggedMatrix {
        /// "code" or "mask".
        what: &'static str,
        /// Total number of coefficients supplied.
        len: usize,
        /// The row length.
        row: usize,
    },
    /// The code and mask matrices have different numbers of rows.
    #[error("iris share matrix: {codes} code rows but {masks} mask rows")]
    RowCountMismatch {
        /// Rows of the code matrix.
        codes: usize,
        /// Rows of the mask matrix.
        masks: usize,
    },
    /// A scan thread panicked (a bug; the search is refused rather than answered wrongly).
    #[error("iris scan: a worker thread panicked")]
    WorkerPanicked,
    /// The entry range does not lie within the matrix.
    #[error("iris scan: entry range {start}..{end} is outside the {len} entries")]
    RangeOutOfBounds {
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// Number of entries in the matrix.
        len: usize,
    },
    /// An output slice has the wrong length.
    #[error("iris scan: {what} output has {got} slots, expected {expected} (entries × rotations)")]
    OutputLength {
        /// "code" or "mask".
        what: &'static str,
        /// Required length.
        expected: usize,
        /// Supplied length.
        got: usize,
    },
    /// The prepared query is malformed.
    #[error(transparent)]
    Query(#[from] EncodingError),
}

/// Which implementation a [`DotKernel`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// A wrapping-u16 dot-product implementation chosen at run time (the local dot product of
/// seed 001 §4.2). The AVX2 and AVX-512 kernels can only be obtained on a CPU that has the
/// features they use ([`DotKernel::avx2`] and [`DotKernel::avx512`] check), which is what
/// makes calling them safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DotKernel {
    kind: Kind,
}

impl Default for DotKernel {
    /// The best kernel for this CPU ([`DotKernel::detect`]).
    fn default() -> Self {
        Self::detect()
    }
}

impl DotKernel {
    /// The fastest kernel this CPU supports: AVX-512 VNNI, else AVX2, else portable.
    pub fn detect() -> Self {
        Self::avx512()
            .or_else(Self::avx2)
            .unwrap_or_else(Self::portable)
    }

    /// The portable kernel (any CPU).
    pub fn portable() -> Self {
        Self {
            kind: Kind::Portable,
        }
    }

    /// The AVX2 kernel, or `None` when the CPU (or the target architecture) lacks AVX2.
    pub fn avx2() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                return Some(Self { kind: Kind::Avx2 });
            }
        }
        None
    }

    /// The AVX-512 kernel (VPDPWSSD), or `None` when the CPU (or the target architecture)
    /// lacks AVX-512F, AVX-512BW or AVX-512 VNNI.
    pub fn avx512() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vnni")
            {
                return Some(Self { kind: Kind::Avx512 });
            }
        }
        None
    }

    /// Every kernel this CPU supports, slowest first (portable, then AVX2, then AVX-512),
    /// for tests and benchmarks.
    pub fn available() -> Vec<Self> {
        let mut k = vec![Self::portable()];
        k.extend(Self::avx2());
        k.extend(Self::avx512());
        k
    }

    /// A short name for logs and benchmark output ("avx512-vnni", "avx2", "portable").
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => "avx512-vnni",
        }
    }

    /// Wrapping dot product Σ a\[j\]·b\[j\] mod 2^16 over the common length of `a` and `b`.
    pub fn dot(&self, a: &[u16], b: &[u16]) -> u16 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        match self.kind {
            Kind::Portable => dot_portable(a, b),
            // SAFETY: a `Kind::Avx2` kernel is only constructed by `DotKernel::avx2` after
            // `is_x86_feature_detected!("avx2")` returned true, so the CPU supports AVX2.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => unsafe { avx2::dot(a, b) },
            // SAFETY: a `Kind::Avx512` kernel is only constructed by `DotKernel::avx512` after
            // AVX-512F, AVX-512BW and AVX-512 VNNI were all detected.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => unsafe { avx512::dot(a, b) },
        }
    }

    /// Four dot products of `a` with `b0..b3` in one pass over `a` (all over the length of
    /// `a`; every `b` must be at least as long, which callers check).
    fn dot4(&self, a: &[u16], b: [&[u16]; 4]) -> [u16; 4] {
        let n = b.iter().fold(a.len(), |n, x| n.min(x.len()));
        let a = &a[..n];
        let b = b.map(|x| &x[..n]);
        match self.kind {
            Kind::Portable => b.map(|x| dot_portable(a, x)),
            // SAFETY: as in `dot`: only constructed after AVX2 was detected.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => unsafe { avx2::dot4(a, b) },
            // SAFETY: as in `dot`: only constructed after AVX-512F/BW/VNNI were detected.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => unsafe { avx512::dot4(a, b) },
        }
    }
}

/// Portable kernel: 16 independent u16 lanes (auto-vectorised), folded at the end.
fn dot_portable(a: &[u16], b: &[u16]) -> u16 {
    let mut lanes = [0u16; 16];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..16 {
            lanes[i] = lanes[i].wrapping_add(x[i].wrapping_mul(y[i]));
        }
    }
    let mut acc = lanes.iter().fold(0u16, |s, &v| s.wrapping_add(v));
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        acc = acc.wrapping_add(x.wrapping_mul(*y));
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi16, _mm256_loadu_si256, _mm256_mullo_epi16, _mm256_setzero_si256,
        _mm256_storeu_si256,
    };

    /// Wrapping sum of the 16 u16 lanes of `v`.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn hsum(v: __m256i) -> u16 {
        let mut lanes = [0u16; 16];
        // SAFETY: `lanes` is 32 writable bytes; the store is unaligned-tolerant.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast::<__m256i>(), v) };
        lanes.iter().fold(0u16, |s, &x| s.wrapping_add(x))
    }

    /// Loads 16 u16 starting at element `i` of `s`.
    ///
    /// # Safety
    /// The CPU must support AVX2 and `i + 16 <= s.len()`.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn load(s: &[u16], i: usize) -> __m256i {
        // SAFETY: the caller guarantees 16 elements (32 bytes) from index i are in bounds;
        // `loadu` has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr().add(i).cast::<__m256i>()) }
    }

    /// Wrapping dot product over `a.len()` (requires `b.len() >= a.len()`; the safe caller
    /// passes equal lengths).
    ///
    /// # Safety
    /// The CPU must support AVX2, and `b.len() >= a.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot(a: &[u16], b: &[u16]) -> u16 {
        let n = a.len();
        let full = n - n % 16;
        let mut acc = _mm256_setzero_si256();
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= n <= both lengths.
            let (x, y) = unsafe { (load(a, i), load(b, i)) };
            acc = _mm256_add_epi16(acc, _mm256_mullo_epi16(x, y));
            i += 16;
        }
        // SAFETY: AVX2 is available (caller contract).
        let mut s = unsafe { hsum(acc) };
        for j in full..n {
            s = s.wrapping_add(a[j].wrapping_mul(b[j]));
        }
        s
    }

    /// Four wrapping dot products of `a` with `b[0..4]`, reading `a` once.
    ///
    /// # Safety
    /// The CPU must support AVX2, and every `b[k].len() >= a.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn dot4(a: &[u16], b: [&[u16]; 4]) -> [u16; 4] {
        let n = a.len();
        let full = n - n % 16;
        let mut acc = [_mm256_setzero_si256(); 4];
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full <= n <= every length.
            let x = unsafe { load(a, i) };
            for k in 0..4 {
                // SAFETY: as above.
                let y = unsafe { load(b[k], i) };
                acc[k] = _mm256_add_epi16(acc[k], _mm256_mullo_epi16(x, y));
            }
            i += 16;
        }
        let mut out = [0u16; 4];
        for k in 0..4 {
            // SAFETY: AVX2 is available (caller contract).
            let mut s = unsafe { hsum(acc[k]) };
            for j in full..n {
                s = s.wrapping_add(a[j].wrapping_mul(b[k][j]));
            }
            out[k] = s;
        }
        out
    }
}

/// AVX-512 kernel. VPDPWSSD (`_mm512_dpwssd_epi32`, non-saturating) multiplies 32 signed i16
/// pairs and adds adjacent products into 16 i32 lanes, wrapping. A u16 and its i16
/// reinterpretation are congruent mod 2^16, so the low 16 bits of the lane sum are exactly the
/// wrapping u16 dot product.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::{
        __m512i, _mm512_dpwssd_epi32, _mm512_loadu_si512, _mm512_reduce_add_epi32,
        _mm512_setzero_si512,
    };

    /// Wrapping sum of the 16 i32 lanes of `v`, truncated to u16.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn hsum(v: __m512i) -> u16 {
        // Truncation is the point: only the sum mod 2^16 is wanted.
        _mm512_reduce_add_epi32(v) as u16
    }

    /// Loads 32 u16 starting at element `i` of `s`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and `i + 32 <= s.len()`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load(s: &[u16], i: usize) -> __m512i {
        // SAFETY: the caller guarantees 32 elements (64 bytes) from index i are in bounds;
        // `loadu` has no alignment requirement.
        unsafe { _mm512_loadu_si512(s.as_ptr().add(i).cast::<__m512i>()) }
    }

    /// Wrapping dot product over `a.len()` (requires `b.len() >= a.len()`; the safe caller
    /// passes equal lengths).
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI, and `b.len() >= a.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn dot(a: &[u16], b: &[u16]) -> u16 {
        let n = a.len();
        let full = n - n % 32;
        let mut acc = _mm512_setzero_si512();
        let mut i = 0;
        while i < full {
            // SAFETY: i + 32 <= full <= n <= both lengths.
            let (x, y) = unsafe { (load(a, i), load(b, i)) };
            acc = _mm512_dpwssd_epi32(acc, x, y);
            i += 32;
        }
        // SAFETY: AVX-512F is available (caller contract).
        let mut s = unsafe { hsum(acc) };
        for j in full..n {
            s = s.wrapping_add(a[j].wrapping_mul(b[j]));
        }
        s
    }

    /// Four wrapping dot products of `a` with `b[0..4]`, reading `a` once.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI, and every
    /// `b[k].len() >= a.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn dot4(a: &[u16], b: [&[u16]; 4]) -> [u16; 4] {
        let n = a.len();
        let full = n - n % 32;
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut i = 0;
        while i < full {
            // SAFETY: i + 32 <= full <= n <= every length.
            let x = unsafe { load(a, i) };
            for k in 0..4 {
                // SAFETY: as above.
                let y = unsafe { load(b[k], i) };
                acc[k] = _mm512_dpwssd_epi32(acc[k], x, y);
            }
            i += 32;
        }
        let mut out = [0u16; 4];
        for k in 0..4 {
            // SAFETY: AVX-512F is available (caller contract).
            let mut s = unsafe { hsum(acc[k]) };
            for j in full..n {
                s = s.wrapping_add(a[j].wrapping_mul(b[k][j]));
            }
            out[k] = s;
        }
        out
    }
}

/// A borrowed, validated matrix of one party's enrolled shares (seed 001 §4.2/§5 database side): N code rows of 12,800 u16 and
/// N mask rows of 6,400 u16, row-major (entry e's code at `codes[e*12800..(e+1)*12800]`).
#[derive(Clone, Copy, Debug)]
pub struct ShareMatrix<'a> {
    codes: &'a [u16],
    masks: &'a [u16],
    len: usize,
}

impl<'a> ShareMatrix<'a> {
    /// Checks that both matrices consist of whole rows and have the same number of rows.
    pub fn new(codes: &'a [u16], masks: &'a [u16]) -> Result<Self, DotError> {
        for (what, v, row) in [
            ("code", codes, CODE_SHARE_COEFS),
            ("mask", masks, MASK_SHARE_COEFS),
        ] {
            if !v.len().is_multiple_of(row) {
                return Err(DotError::RaggedMatrix {
                    what,
                    len: v.len(),
                    row,
                });
            }
        }
        let (nc, nm) = (
            codes.len() / CODE_SHARE_COEFS,
            masks.len() / MASK_SHARE_COEFS,
        );
        if nc != nm {
            return Err(DotError::RowCountMismatch {
                codes: nc,
                masks: nm,
            });
        }
        Ok(Self {
            codes,
            masks,
            len: nc,
        })
    }

    /// Number of entries N.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the matrix has no entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The 3-of-3 additive shares produced by a scan (seed 001 §4.2), entry-major (module docs): the share of entry e at
/// rotation index r is `code[e * num_rotations + r]` / `mask[e * num_rotations + r]`.
#[derive(Clone, PartialEq, Eq)]
pub struct DotShares {
    /// R, the number of query rotations.
    pub num_rotations: usize,
    /// N, the number of database entries scanned.
    pub num_entries: usize,
    /// N × R additive shares of the code dot products.
    pub code: Vec<u16>,
    /// N × R additive shares of the mask dot products (half the common mask popcount).
    pub mask: Vec<u16>,
}

impl std::fmt::Debug for DotShares {
    /// Prints the shape only, never share values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DotShares")
            .field("num_rotations", &self.num_rotations)
            .field("num_entries", &self.num_entries)
            .finish()
    }
}

impl DotShares {
    /// The (code, mask) shares of `entry` at rotation index `rotation`, if in range.
    pub fn get(&self, entry: usize, rotation: usize) -> Option<(u16, u16)> {
        if entry >= self.num_entries || rotation >= self.num_rotations {
            return None;
        }
        let i = entry * self.num_rotations + rotation;
        Some((*self.code.get(i)?, *self.mask.get(i)?))
    }
}

/// Scans the entries `entries` of `db` against every rotation of `query` (seed 001 §4.2 local
/// dot products), writing entry-major results: the share of entry `entries.start + i` at
/// rotation index r goes to `out_code[i * R + r]` / `out_mask[i * R + r]`, so both outputs must
/// hold `entries.len() × R` slots. This is the unit a thread pool runs per entry range.
pub fn scan_range(
    kernel: DotKernel,
    db: &ShareMatrix<'_>,
    query: &PreparedQuery,
    entries: Range<usize>,
    out_code: &mut [u16],
    out_mask: &mut [u16],
) -> Result<(), DotError> {
    query.validate()?;
    if entries.start > entries.end || entries.end > db.len {
        return Err(DotError::RangeOutOfBounds {
            start: entries.start,
            end: entries.end,
            len: db.len,
        });
    }
    let r_count = query.rotations.len();
    let expected = entries.len().saturating_mul(r_count);
    for (what, got) in [("code", out_code.len()), ("mask", out_mask.len())] {
        if got != expected {
            return Err(DotError::OutputLength {
                what,
                expected,
                got,
            });
        }
    }
    if r_count == 0 {
        return Ok(());
    }
    let codes = &db.codes[entries.start * CODE_SHARE_COEFS..entries.end * CODE_SHARE_COEFS];
    let masks = &db.masks[entries.start * MASK_SHARE_COEFS..entries.end * MASK_SHARE_COEFS];
    scan_side(kernel, codes, CODE_SHARE_COEFS, query, out_code, |r| {
        &r.code
    });
    scan_side(kernel, masks, MASK_SHARE_COEFS, query, out_mask, |r| {
        &r.mask
    });
    Ok(())
}

/// Dot products of consecutive database rows (`rows`, each `row_len` long) with one side
/// (code or mask) of every rotation, entry-major into `out` (rows × R). Rows are taken four
/// at a time so each query rotation is read once per four entries while the four rows stay
/// in cache; the last < 4 rows go through [`scan_row`].
fn scan_side(
    kernel: DotKernel,
    rows: &[u16],
    row_len: usize,
    query: &PreparedQuery,
    out: &mut [u16],
    side: impl Fn(&PreparedRotation) -> &Vec<u16>,
) {
    let r_count = query.rotations.len();
    let mut blocks = rows.chunks_exact(4 * row_len);
    let mut out_blocks = out.chunks_exact_mut(4 * r_count);
    for (block, ob) in (&mut blocks).zip(&mut out_blocks) {
        let (b01, b23) = block.split_at(2 * row_len);
        let (b0, b1) = b01.split_at(row_len);
        let (b2, b3) = b23.split_at(row_len);
        for (r, rot) in query.rotations.iter().enumerate() {
            let d = kernel.dot4(side(rot), [b0, b1, b2, b3]);
            for (o, v) in ob.iter_mut().skip(r).step_by(r_count).zip(d) {
                *o = v;
            }
        }
    }
    let rest = blocks.remainder().chunks_exact(row_len);
    for (row, o) in rest.zip(out_blocks.into_remainder().chunks_exact_mut(r_count)) {
        scan_row(kernel, row, query, o, &side);
    }
}

/// Dot products of one database row with one side (code or mask) of every rotation, four
/// rotations per pass.
fn scan_row(
    kernel: DotKernel,
    row: &[u16],
    query: &PreparedQuery,
    out: &mut [u16],
    side: impl Fn(&PreparedRotation) -> &Vec<u16>,
) {
    let mut rots = query.rotations.chunks_exact(4);
    let mut outs = out.chunks_exact_mut(4);
    for (group, o) in (&mut rots).zip(&mut outs) {
        let b = [
            side(&group[0]).as_slice(),
            side(&group[1]).as_slice(),
            side(&group[2]).as_slice(),
            side(&group[3]).as_slice(),
        ];
        o.copy_from_slice(&kernel.dot4(row, b));
    }
    for (rot, o) in rots.remainder().iter().zip(outs.into_remainder()) {
        *o = kernel.dot(row, side(rot));
    }
}

/// Scans the whole matrix on the calling thread (seed 001 §4.2 local dot products) ([`scan_range`] over all entries): the
/// function the benchmark and single-threaded callers use.
pub fn scan(
    kernel: DotKernel,
    db: &ShareMatrix<'_>,
    query: &PreparedQuery,
) -> Result<DotShares, DotError> {
    let r_count = query.rotations.len();
    let total = db.len.saturating_mul(r_count);
    let mut code = vec![0u16; total];
    let mut mask = vec![0u16; total];
    scan_range(kernel, db, query, 0..db.len, &mut code, &mut mask)?;
    Ok(DotShares {
        num_rotations: r_count,
        num_entries: db.len,
        code,
        mask,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::encoding::{share_template, IrisShare};
    use crate::iris::query::{plain_dot_u16, share_query_template};
    use crate::iris::synth::{near_duplicate, random_template};
    use crate::iris::template::{masked_code_distance_counts, IrisTemplate, MAX_ROTATION};
    use crate::party::PartyIndex;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    fn kernels() -> Vec<DotKernel> {
        DotKernel::available()
    }

    /// Says on stderr when this CPU cannot run the AVX-512 kernel, so a passing test does not
    /// pass for covering it.
    fn report_missing_avx512(test: &str) {
        if DotKernel::avx512().is_none() {
            let names: Vec<_> = kernels().iter().map(DotKernel::name).collect();
            eprintln!(
                "{test}: this CPU lacks AVX-512F/BW/VNNI: checked NOTHING for the avx512-vnni \
                 kernel; checked {names:?} only"
            );
        }
    }

    /// `n` u16 drawn from `pattern`: 0 uniform, 1 all 0xFFFF, 2 all 0x8000, 3 a mix of
    /// extreme values and uniform ones.
    fn inputs(n: usize, pattern: usize, rng: &mut ChaCha20Rng) -> Vec<u16> {
        const EXTREMES: [u16; 6] = [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF];
        (0..n)
            .map(|_| match pattern {
                0 => rng.gen(),
                1 => 0xFFFF,
                2 => 0x8000,
                _ => match rng.gen_range(0..8) {
                    i @ 0..=5 => EXTREMES[i],
                    _ => rng.gen(),
                },
            })
            .collect()
    }

    #[test]
    fn every_kernel_matches_portable_including_extremes() {
        report_missing_avx512("every_kernel_matches_portable_including_extremes");
        let mut rng = ChaCha20Rng::seed_from_u64(44);
        let lens = (0..200).chain([MASK_SHARE_COEFS, CODE_SHARE_COEFS]);
        let portable = DotKernel::portable();
        for len in lens {
            for pattern in 0..4 {
                let a = inputs(len, pattern, &mut rng);
                let bs: Vec<Vec<u16>> = (0..4)
                    .map(|k| inputs(len, (pattern + k) % 4, &mut rng))
                    .collect();
                let b = [&bs[0][..], &bs[1][..], &bs[2][..], &bs[3][..]];
                let want = b.map(|x| plain_dot_u16(&a, x));
                assert_eq!(portable.dot4(&a, b), want, "portable len {len}");
                for k in kernels() {
                    let ctx = format!("kernel {} len {len} pattern {pattern}", k.name());
                    assert_eq!(k.dot4(&a, b), want, "{ctx} dot4");
                    for (x, w) in b.iter().zip(want) {
                        assert_eq!(k.dot(&a, x), w, "{ctx} dot");
                    }
                }
            }
        }
    }

    #[test]
    fn scan_agrees_across_kernels() {
        report_missing_avx512("scan_agrees_across_kernels");
        let mut rng = ChaCha20Rng::seed_from_u64(45);
        // 9 rows: two blocks of four plus one row through `scan_row`.
        let n = 9;
        let codes = inputs(n * CODE_SHARE_COEFS, 3, &mut rng);
        let masks = inputs(n * MASK_SHARE_COEFS, 3, &mut rng);
        let db = ShareMatrix::new(&codes, &masks).expect("matrix");
        // 1, 6 (four + remainder) and 31 rotations.
        for r_count in [1, 6, 31] {
            let query = PreparedQuery {
                party: PartyIndex::ALL[0],
                rotations: (0..r_count)
                    .map(|r| PreparedRotation {
                        rotation: r,
                        code: inputs(CODE_SHARE_COEFS, 3, &mut rng),
                        mask: inputs(MASK_SHARE_COEFS, 3, &mut rng),
                    })
                    .collect(),
            };
            let want = scan(DotKernel::portable(), &db, &query).expect("scan");
            let e = 5;
            let r = r_count as usize;
            let c = &codes[e * CODE_SHARE_COEFS..(e + 1) * CODE_SHARE_COEFS];
            let code_rot = &query.rotations[r - 1].code;
            assert_eq!(
                want.get(e, r - 1).map(|x| x.0),
                Some(plain_dot_u16(c, code_rot))
            );
            for kernel in kernels() {
                let got = scan(kernel, &db, &query).expect("scan");
                assert!(
                    got == want,
                    "kernel {} scan, {r_count} rotations",
                    kernel.name()
                );
                let (mut code, mut mask) = (vec![0u16; n * r], vec![0u16; n * r]);
                let (c1, c2) = code.split_at_mut(5 * r);
                let (m1, m2) = mask.split_at_mut(5 * r);
                scan_range(kernel, &db, &query, 0..5, c1, m1).expect("first");
                scan_range(kernel, &db, &query, 5..n, c2, m2).expect("second");
                assert_eq!(code, want.code, "kernel {} scan_range code", kernel.name());
                assert_eq!(mask, want.mask, "kernel {} scan_range mask", kernel.name());
            }
        }
    }

    proptest! {
        #[test]
        fn kernels_agree_with_reference(seed: u64, len in 0usize..200, extra in 0usize..3) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let a: Vec<u16> = (0..len).map(|_| rng.gen()).collect();
            let bs: Vec<Vec<u16>> = (0..4).map(|_| (0..len + extra).map(|_| rng.gen()).collect()).collect();
            let expected: Vec<u16> = bs.iter().map(|b| plain_dot_u16(&a, b)).collect();
            for k in kernels() {
                for (b, e) in bs.iter().zip(&expected) {
                    prop_assert_eq!(k.dot(&a, b), *e, "kernel {}", k.name());
                    prop_assert_eq!(k.dot(b, &a), *e, "kernel {} swapped", k.name());
                }
                let four = k.dot4(&a, [&bs[0], &bs[1], &bs[2], &bs[3]]);
                prop_assert_eq!(four.to_vec(), expected.clone(), "kernel {} dot4", k.name());
            }
        }
    }

    #[test]
    fn extreme_values_wrap() {
        let a = vec![u16::MAX; 37];
        let b = vec![u16::MAX; 37];
        for k in kernels() {
            assert_eq!(k.dot(&a, &b), 37, "{}", k.name());
        }
        assert_eq!(Some(&DotKernel::detect()), kernels().last());
        assert!(["avx512-vnni", "avx2", "portable"].contains(&DotKernel::detect().name()));
    }

    /// Shares `templates` for every party and stacks each party's shares into matrices.
    fn matrices(templates: &[IrisTemplate], rng: &mut ChaCha20Rng) -> [(Vec<u16>, Vec<u16>); 3] {
        let mut out: [(Vec<u16>, Vec<u16>); 3] = Default::default();
        for t in templates {
            let shares: [IrisShare; 3] = share_template(t, rng).expect("share");
            for (p, s) in shares.iter().enumerate() {
                out[p].0.extend_from_slice(&s.code);
                out[p].1.extend_from_slice(&s.mask);
            }
        }
        out
    }

    #[test]
    fn scan_matches_plaintext_end_to_end() {
        let mut rng = ChaCha20Rng::seed_from_u64(41);
        let query = random_template(&mut rng);
        let mut templates = vec![random_template(&mut rng), random_template(&mut rng)];
        for (flip, rot) in [(0.0, 2), (0.1, -9), (0.34, 15), (0.2, -15)] {
            templates.push(near_duplicate(&query, flip, rot, &mut rng));
        }
        let mats = matrices(&templates, &mut rng);
        let q_shares = share_query_template(&query, &mut rng).expect("share query");
        for kernel in kernels() {
            for max in [0, MAX_ROTATION] {
                let mut results = Vec::new();
                for p in PartyIndex::ALL {
                    let i = p.as_usize();
                    let q = PreparedQuery::prepare(&q_shares[i], max).expect("prepare");
                    let db = ShareMatrix::new(&mats[i].0, &mats[i].1).expect("matrix");
                    assert_eq!(db.len(), templates.len());
                    results.push(scan(kernel, &db, &q).expect("scan"));
                }
                let mut disagreements = 0;
                for (e, t) in templates.iter().enumerate() {
                    for (r, k) in (-max..=max).enumerate() {
                        let mut code = 0u16;
                        let mut mask = 0u16;
                        for res in &results {
                            let (c, m) = res.get(e, r).expect("in range");
                            code = code.wrapping_add(c);
                            mask = mask.wrapping_add(m);
                        }
                        let (hd, common) = masked_code_distance_counts(&query.rotate(k), t);
                        let want_code = (common as i32 - 2 * hd as i32) as u16;
                        if (code, mask) != (want_code, (common / 2) as u16) {
                            disagreements += 1;
                        }
                    }
                }
                assert_eq!(disagreements, 0, "kernel {} max {max}", kernel.name());
            }
        }
    }

    #[test]
    fn ranges_compose_into_the_full_scan() {
        let mut rng = ChaCha20Rng::seed_from_u64(42);
        let templates: Vec<IrisTemplate> = (0..7).map(|_| random_template(&mut rng)).collect();
        let mats = matrices(&templates, &mut rng);
        let q_shares = share_query_template(&templates[3], &mut rng).expect("share");
        let q = PreparedQuery::prepare(&q_shares[1], 2).expect("prepare");
        let db = ShareMatrix::new(&mats[1].0, &mats[1].1).expect("matrix");
        let full = scan(DotKernel::detect(), &db, &q).expect("scan");
        let r = q.num_rotations();
        let mut code = vec![0u16; 7 * r];
        let mut mask = vec![0u16; 7 * r];
        // Split as a thread pool would: disjoint output chunks per entry range.
        let (c1, c2) = code.split_at_mut(3 * r);
        let (m1, m2) = mask.split_at_mut(3 * r);
        scan_range(DotKernel::portable(), &db, &q, 0..3, c1, m1).expect("first");
        scan_range(DotKernel::detect(), &db, &q, 3..7, c2, m2).expect("second");
        assert_eq!(code, full.code);
        assert_eq!(mask, full.mask);
        assert_eq!(full.get(7, 0), None);
        assert_eq!(full.get(0, r), None);
        assert_eq!(
            format!("{full:?}"),
            "DotShares { num_rotations: 5, num_entries: 7 }"
        );
    }

    #[test]
    fn shape_errors() {
        let codes = vec![0u16; 2 * CODE_SHARE_COEFS];
        let masks = vec![0u16; 2 * MASK_SHARE_COEFS];
        assert!(matches!(
            ShareMatrix::new(&codes[1..], &masks),
            Err(DotError::RaggedMatrix { what: "code", .. })
        ));
        assert_eq!(
            ShareMatrix::new(&codes, &masks[MASK_SHARE_COEFS..]).map(|m| m.len()),
            Err(DotError::RowCountMismatch { codes: 2, masks: 1 })
        );
        let db = ShareMatrix::new(&codes, &masks).expect("valid");
        assert!(!db.is_empty());
        let mut rng = ChaCha20Rng::seed_from_u64(43);
        let t = random_template(&mut rng);
        let q_shares = share_query_template(&t, &mut rng).expect("share");
        let q = PreparedQuery::prepare(&q_shares[0], 1).expect("prepare");
        let mut out = vec![0u16; 3];
        let mut out2 = vec![0u16; 3];
        let k = DotKernel::detect();
        assert_eq!(
            scan_range(k, &db, &q, 1..3, &mut out, &mut out2),
            Err(DotError::RangeOutOfBounds {
                start: 1,
                end: 3,
                len: 2
            })
        );
        let mut short = vec![0u16; 2];
        assert_eq!(
            scan_range(k, &db, &q, 1..2, &mut out, &mut short),
            Err(DotError::OutputLength {
                what: "mask",
                expected: 3,
                got: 2
            })
        );
        let mut bad = q.clone();
        bad.rotations[0].code.pop();
        assert!(matches!(
            scan(k, &db, &bad),
            Err(DotError::Query(EncodingError::WrongLength { .. }))
        ));
        let empty = ShareMatrix::new(&[], &[]).expect("empty");
        assert!(empty.is_empty());
        assert_eq!(scan(k, &empty, &q).map(|s| s.code.len()), Ok(0));
    }
}
