//! The party-local dot-product kernel of the iris matcher ([BGK+24] §4.3.2: "the dot product is
//! computed locally as a plain u16 dot product"; [BGK+24] §5: codes and masks both shared).
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
//! are then reshared into replicated shares ([`crate::iris::mpc::reshare`]).
//!
//! **Arithmetic.** Wrapping u16 multiply-add, exact modulo 2^16 in any order, so the SIMD and
//! portable kernels agree bit for bit. **Dispatch** at run time ([`DotKernel::detect`]):
//! AVX-512 VNNI (`_mm512_dpwssd_epi32`, 32 u16 per step) when the CPU has AVX-512F/BW/VNNI,
//! else AVX2 (`_mm256_mullo_epi16` + `_mm256_add_epi16`, 16 lanes), otherwise a portable
//! chunked loop the compiler auto-vectorises.
//!
//! **Tiling.** The SIMD scans are register-tiled: a micro-kernel ([`DotKernel::tile`])
//! computes a block of M database rows × N rotations with M·N accumulators in registers, so
//! each step loads M + N vectors for M·N multiply-accumulates (AVX-512: 6 × 4, 10 loads per
//! 24 VPDPWSSD; AVX2: 3 × 3) instead of 5 loads per 4. Rows not filling a block go one at a
//! time; the last < N rotations go in one narrower tile. The row length is cut into cache
//! blocks ([`DotKernel::block_elems`]): for one block of rows, every rotation group passes
//! over the same slice of the rows while it is in L1/L2, the partial sums wait in a small
//! accumulator buffer, and each row is read from memory once whatever R is (at R = 1 the scan
//! is bandwidth-bound). With AVX-512 and nine rotations or more, rotations k and k + 8 share
//! products (three instead of four per pair of taps, `dot/paired.rs`). Figures: BENCHMARKS.md,
//! `examples/dot_scan.rs`.
//!
//! No threads here: the caller owns the pool and calls [`scan_range`] on sub-ranges.
//! Rounds: none (local).

use std::ops::Range;

use super::aligned::AlignedU16s;
use super::encoding::{EncodingError, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use super::journal::RowJournal;
use super::query::PreparedQuery;

#[cfg(target_arch = "x86_64")]
mod paired;
#[cfg(target_arch = "x86_64")]
use paired::PairedSide;
/// Rotation pairs exist only for the AVX-512 kernel (x86-64).
#[cfg(not(target_arch = "x86_64"))]
#[derive(Debug)]
enum PairedSide {}

/// Bytes of shares one entry contributes to a scan (code 25,600 + mask 12,800; docs/protocols/iris.md), for
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
    /// The scan was stopped through its [`crate::iris::scan::Interrupt`] (the caller gave up).
    #[error("iris scan: interrupted (the caller cancelled the search)")]
    Interrupted,
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
/// [BGK+24] §4.3.2). The AVX2 and AVX-512 kernels can only be obtained on a CPU that has the
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
        let mut out = [0u16];
        let mut acc = [Slot::ZERO];
        dot_block(*self, [a], &[b], &mut out, &mut acc);
        out[0]
    }

    /// Four dot products of `a` with `b0..b3` in one pass over `a` (over the common length).
    #[cfg(test)]
    fn dot4(&self, a: &[u16], b: [&[u16]; 4]) -> [u16; 4] {
        let mut out = [0u16; 4];
        let mut acc = [Slot::ZERO; 4];
        dot_block(*self, [a], &b, &mut out, &mut acc);
        out
    }

    /// u16 elements one step of this kernel's inner loop consumes (a slice's elements past
    /// the last whole step are added by a scalar tail).
    fn step(&self) -> usize {
        match self.kind {
            Kind::Portable => 32,
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => 16,
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => 32,
        }
    }

    /// Adds `rows[m] · cols[n]` over the whole steps of the common length to the accumulator
    /// `acc[n * M + m]` (the register tile: each step loads M + N vectors for M·N
    /// multiply-accumulates). `acc` must hold at least M·N slots (else this panics).
    fn tile<const M: usize, const N: usize>(
        &self,
        rows: [&[u16]; M],
        cols: [&[u16]; N],
        acc: &mut [Slot],
    ) {
        let acc = &mut acc[..M * N];
        match self.kind {
            Kind::Portable => unreachable!("the portable kernel is not tiled"),
            // SAFETY: a `Kind::Avx2` kernel is only constructed by `DotKernel::avx2` after
            // `is_x86_feature_detected!("avx2")` returned true, so the CPU supports AVX2.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => unsafe { avx2::tile(rows, cols, acc) },
            // SAFETY: a `Kind::Avx512` kernel is only constructed by `DotKernel::avx512` after
            // AVX-512F, AVX-512BW and AVX-512 VNNI were all detected.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => unsafe { avx512::tile(rows, cols, acc) },
        }
    }

    /// Elements per cache block of [`dot_block_tiled`]: the block's slices of the rows and of
    /// the rotations are re-read by every rotation group while still in L1/L2 (measured; a
    /// multiple of every step).
    fn block_elems(&self) -> usize {
        match self.kind {
            Kind::Portable => usize::MAX,
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => 1024,
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => 2048,
        }
    }

    /// The wrapping sum mod 2^16 of the lanes this kernel accumulates in `s`: 32 u16 lanes
    /// (portable), 16 u16 lanes in the low 32 bytes (AVX2), or the low halves of 16 i32 lanes
    /// (AVX-512; the high halves only hold carries, which vanish mod 2^16).
    fn hsum(&self, s: &Slot) -> u16 {
        let lanes = s.lanes();
        let sum = |it: &mut dyn Iterator<Item = u16>| it.fold(0u16, u16::wrapping_add);
        match self.kind {
            Kind::Portable => sum(&mut lanes.into_iter()),
            #[cfg(target_arch = "x86_64")]
            Kind::Avx2 => sum(&mut lanes.into_iter().take(16)),
            // SAFETY: a `Kind::Avx512` kernel exists only on a CPU with AVX-512F.
            #[cfg(target_arch = "x86_64")]
            Kind::Avx512 => unsafe { avx512::hsum(s) },
        }
    }
}

/// One SIMD accumulator in memory (a zmm register's worth; AVX2 uses the low 32 bytes),
/// 64-byte aligned so that loading and storing it never splits a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Slot([u8; 64]);

impl Slot {
    /// All lanes zero.
    const ZERO: Slot = Slot([0; 64]);

    /// The slot as 32 native-endian u16 lanes.
    fn lanes(&self) -> [u16; 32] {
        std::array::from_fn(|i| u16::from_ne_bytes([self.0[2 * i], self.0[2 * i + 1]]))
    }
}

/// Portable kernel: 16 independent u16 lanes (auto-vectorised), folded at the end; over the
/// common length of `a` and `b`.
fn dot_portable(a: &[u16], b: &[u16]) -> u16 {
    let mut lanes = [0u16; 16];
    let mut ca = a.chunks_exact(16);
    let mut cb = b.chunks_exact(16);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..16 {
            lanes[i] = lanes[i].wrapping_add(x[i].wrapping_mul(y[i]));
        }
    }
    let acc = lanes.iter().fold(0u16, |s, &v| s.wrapping_add(v));
    let full = a.len().min(b.len()) / 16 * 16;
    tail_dot(acc, a, b, full)
}

/// `acc` plus the wrapping dot product of `a[from..]` and `b[from..]` (the scalar tail the
/// vector loops leave, over the common length).
fn tail_dot(acc: u16, a: &[u16], b: &[u16], from: usize) -> u16 {
    let (a, b) = (a.get(from..).unwrap_or(&[]), b.get(from..).unwrap_or(&[]));
    a.iter()
        .zip(b)
        .fold(acc, |s, (x, y)| s.wrapping_add(x.wrapping_mul(*y)))
}

/// The common length of the inputs of a tile (0 for an empty tile).
fn common_len(rows: &[&[u16]], cols: &[&[u16]]) -> usize {
    rows.iter().chain(cols).map(|s| s.len()).min().unwrap_or(0)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi16, _mm256_loadu_si256, _mm256_mullo_epi16, _mm256_setzero_si256,
        _mm256_storeu_si256,
    };

    use super::{common_len, Slot};

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

    /// Loads the M × N accumulators of a tile from `acc` (`acc[n * M + m]`, low 32 bytes).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn load_acc<const M: usize, const N: usize>(acc: &[Slot]) -> [[__m256i; N]; M] {
        let mut regs = [[_mm256_setzero_si256(); N]; M];
        for (m, row) in regs.iter_mut().enumerate() {
            for (n, r) in row.iter_mut().enumerate() {
                let s = &acc[n * M + m];
                // SAFETY: a slot is 64 readable bytes; `loadu` reads 32 of them.
                *r = unsafe { _mm256_loadu_si256(s.0.as_ptr().cast::<__m256i>()) };
            }
        }
        regs
    }

    /// Stores the M × N accumulators of a tile back into `acc` (inverse of `load_acc`).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn store_acc<const M: usize, const N: usize>(regs: &[[__m256i; N]; M], acc: &mut [Slot]) {
        for (m, row) in regs.iter().enumerate() {
            for (n, &r) in row.iter().enumerate() {
                let s = &mut acc[n * M + m];
                // SAFETY: a slot is 64 writable bytes; `storeu` writes 32 of them.
                unsafe { _mm256_storeu_si256(s.0.as_mut_ptr().cast::<__m256i>(), r) };
            }
        }
    }

    /// Adds `rows[m] · cols[n]` over the whole 16-element steps of the common length into
    /// `acc[n * M + m]` (16 u16 lanes, `mullo` + `add`, wrapping), the M·N accumulators held
    /// in registers.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn tile<const M: usize, const N: usize>(
        rows: [&[u16]; M],
        cols: [&[u16]; N],
        acc: &mut [Slot],
    ) {
        let len = common_len(&rows, &cols);
        let full = len - len % 16;
        let mut regs = load_acc::<M, N>(acc);
        let mut i = 0;
        while i < full {
            let mut b = [_mm256_setzero_si256(); N];
            for (v, c) in b.iter_mut().zip(cols) {
                // SAFETY: i + 16 <= full <= len <= every input length.
                *v = unsafe { load(c, i) };
            }
            for (a_row, r) in regs.iter_mut().zip(rows) {
                // SAFETY: as above.
                let x = unsafe { load(r, i) };
                for (a, &y) in a_row.iter_mut().zip(&b) {
                    *a = _mm256_add_epi16(*a, _mm256_mullo_epi16(x, y));
                }
            }
            i += 16;
        }
        store_acc(&regs, acc);
    }
}

/// AVX-512 kernel. VPDPWSSD (`_mm512_dpwssd_epi32`, non-saturating) multiplies 32 signed i16
/// pairs and adds adjacent products into 16 i32 lanes, wrapping. A u16 and its i16
/// reinterpretation are congruent mod 2^16, so the low 16 bits of the lane sum are exactly the
/// wrapping u16 dot product.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::{
        __m512i, _mm512_load_si512, _mm512_loadu_si512, _mm512_reduce_add_epi32,
        _mm512_setzero_si512, _mm512_store_si512,
    };

    use super::{common_len, Slot};

    /// `acc + Σ pairs a·b` (VPDPWSSD), as that one instruction: written as an intrinsic, LLVM's
    /// machine combiner splits long chains of it into VPMADDWD + VPADDD (twice the
    /// instructions), which made an unrolled scan slower, not faster.
    ///
    /// # Safety
    /// The CPU must support AVX-512F and AVX-512 VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    #[inline]
    pub(super) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        let mut acc = acc;
        // SAFETY: register operands only; the caller guarantees the CPU has AVX-512 VNNI.
        unsafe {
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, {b}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(zmm_reg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }

    /// The sum of the 16 i32 lanes of `s` modulo 2^16, which is the wrapping sum of their low
    /// halves (the high halves only hold carries), in one vector reduction: the scalar fold
    /// over 32 u16 lanes was 2 % of a whole search's CPU.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn hsum(s: &Slot) -> u16 {
        // SAFETY: a slot is 64 readable bytes, 64-byte aligned (`repr(align(64))`).
        let v = unsafe { _mm512_load_si512(s.0.as_ptr().cast::<__m512i>()) };
        // Truncation is the point: the result is the sum modulo 2^16.
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

    /// Loads the M × N accumulators of a tile from `acc` (`acc[n * M + m]`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load_acc<const M: usize, const N: usize>(acc: &[Slot]) -> [[__m512i; N]; M] {
        let mut regs = [[_mm512_setzero_si512(); N]; M];
        for (m, row) in regs.iter_mut().enumerate() {
            for (n, r) in row.iter_mut().enumerate() {
                let s = &acc[n * M + m];
                // SAFETY: a slot is 64 readable bytes, 64-byte aligned (`repr(align(64))`).
                *r = unsafe { _mm512_load_si512(s.0.as_ptr().cast::<__m512i>()) };
            }
        }
        regs
    }

    /// Stores the M × N accumulators of a tile back into `acc` (inverse of `load_acc`).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn store_acc<const M: usize, const N: usize>(regs: &[[__m512i; N]; M], acc: &mut [Slot]) {
        for (m, row) in regs.iter().enumerate() {
            for (n, &r) in row.iter().enumerate() {
                let s = &mut acc[n * M + m];
                // SAFETY: a slot is 64 writable bytes, 64-byte aligned (`repr(align(64))`).
                unsafe { _mm512_store_si512(s.0.as_mut_ptr().cast::<__m512i>(), r) };
            }
        }
    }

    /// Adds `rows[m] · cols[n]` over the whole 32-element steps of the common length into
    /// `acc[n * M + m]` (16 i32 lanes, VPDPWSSD), the M·N accumulators held in registers
    /// (32 zmm registers).
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile<const M: usize, const N: usize>(
        rows: [&[u16]; M],
        cols: [&[u16]; N],
        acc: &mut [Slot],
    ) {
        let len = common_len(&rows, &cols);
        let full = len - len % 32;
        let mut regs = load_acc::<M, N>(acc);
        let mut i = 0;
        while i < full {
            let mut b = [_mm512_setzero_si512(); N];
            for (v, c) in b.iter_mut().zip(cols) {
                // SAFETY: i + 32 <= full <= len <= every input length.
                *v = unsafe { load(c, i) };
            }
            for (a_row, r) in regs.iter_mut().zip(rows) {
                // SAFETY: as above.
                let x = unsafe { load(r, i) };
                for (a, &y) in a_row.iter_mut().zip(&b) {
                    // SAFETY: the caller guarantees AVX-512 VNNI.
                    *a = unsafe { dpwssd(*a, x, y) };
                }
            }
            i += 32;
        }
        store_acc(&regs, acc);
    }
}
/// A borrowed, validated matrix of one party's enrolled shares ([BGK+24] §4.3.2/§5 database side): N code rows of 12,800 u16 and
/// N mask rows of 6,400 u16, row-major (entry e's code at `codes[e*12800..(e+1)*12800]`).
///
/// A matrix that lives across scans (the engine's store) carries its [`RowJournal`], so that a
/// backend keeping its own copy of the rows (a GPU's memory) can bring that copy up to date by
/// copying only the rows changed since its last scan ([`ShareMatrix::journal`]).
#[derive(Clone, Copy, Debug)]
pub struct ShareMatrix<'a> {
    codes: &'a [u16],
    masks: &'a [u16],
    len: usize,
    journal: Option<&'a RowJournal>,
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
            journal: None,
        })
    }

    /// The same matrix, declared to be the current state of the rows `journal` tracks.
    pub fn tracked_by(self, journal: &'a RowJournal) -> Self {
        Self {
            journal: Some(journal),
            ..self
        }
    }

    /// The journal of the rows' changes, when the matrix lives across scans; `None` for a
    /// one-off matrix (a backend with its own copy must then copy every row).
    pub fn journal(&self) -> Option<&'a RowJournal> {
        self.journal
    }

    /// All code coefficients, row-major (N × 12,800).
    pub fn codes(&self) -> &'a [u16] {
        self.codes
    }

    /// All mask coefficients, row-major (N × 6,400).
    pub fn masks(&self) -> &'a [u16] {
        self.masks
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

/// The 3-of-3 additive shares produced by a scan ([BGK+24] §4.3.2), entry-major (module docs): the share of entry e at
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

/// Scans the entries `entries` of `db` against every rotation of `query` ([BGK+24] §4.3.2 local
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
    let panel = RotationPanel::new(query)?;
    scan_range_with(kernel, db, &panel, entries, out_code, out_mask)
}

/// A query's rotations as the scan reads them: the code sides one after the other, then the
/// mask sides, each starting a cache line ([`AlignedU16s`]). Built once per scan (1.2 MB for
/// 31 rotations) and shared by the scan's threads.
#[derive(Debug)]
pub struct RotationPanel {
    code: AlignedU16s,
    mask: AlignedU16s,
    count: usize,
    /// The code and mask rotations in pairs for the AVX-512 scan (`dot/paired.rs`), where
    /// they pair (nine rotations or more).
    paired: [Option<PairedSide>; 2],
}

impl RotationPanel {
    /// Lays out the rotations of `query`; fails as [`PreparedQuery::validate`] does.
    pub fn new(query: &PreparedQuery) -> Result<Self, DotError> {
        query.validate()?;
        let count = query.rotations.len();
        let mut code = AlignedU16s::new();
        let mut mask = AlignedU16s::new();
        code.reserve_exact(count * CODE_SHARE_COEFS);
        mask.reserve_exact(count * MASK_SHARE_COEFS);
        for r in &query.rotations {
            code.extend_from_slice(&r.code);
            mask.extend_from_slice(&r.mask);
        }
        let paired = [(&code, CODE_SHARE_COEFS), (&mask, MASK_SHARE_COEFS)].map(|(side, len)| {
            let rots: Vec<&[u16]> = side.chunks_exact(len).collect();
            pair_rotations(&rots, len)
        });
        Ok(RotationPanel {
            code,
            mask,
            count,
            paired,
        })
    }

    /// The number of rotations.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True for a query without rotations.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// [`scan_range`] with the query's rotations already laid out ([`RotationPanel`]).
pub fn scan_range_with(
    kernel: DotKernel,
    db: &ShareMatrix<'_>,
    panel: &RotationPanel,
    entries: Range<usize>,
    out_code: &mut [u16],
    out_mask: &mut [u16],
) -> Result<(), DotError> {
    if entries.start > entries.end || entries.end > db.len {
        return Err(DotError::RangeOutOfBounds {
            start: entries.start,
            end: entries.end,
            len: db.len,
        });
    }
    let r_count = panel.len();
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
    let code_rots: Vec<&[u16]> = panel.code.chunks_exact(CODE_SHARE_COEFS).collect();
    let mask_rots: Vec<&[u16]> = panel.mask.chunks_exact(MASK_SHARE_COEFS).collect();
    let [paired_code, paired_mask] = &panel.paired;
    scan_side(
        kernel,
        codes,
        CODE_SHARE_COEFS,
        &code_rots,
        paired_code.as_ref(),
        out_code,
    );
    scan_side(
        kernel,
        masks,
        MASK_SHARE_COEFS,
        &mask_rots,
        paired_mask.as_ref(),
        out_mask,
    );
    Ok(())
}

/// The rotations of one side in pairs for the AVX-512 scan, where they pair; `None` on a CPU
/// without the AVX-512 kernel (no other kernel reads the pairs).
#[cfg(target_arch = "x86_64")]
fn pair_rotations(rots: &[&[u16]], row_len: usize) -> Option<PairedSide> {
    DotKernel::avx512()?;
    PairedSide::new(rots, row_len)
}

/// No rotation pairs off x86-64.
#[cfg(not(target_arch = "x86_64"))]
fn pair_rotations(_rots: &[&[u16]], _row_len: usize) -> Option<PairedSide> {
    None
}

/// Dot products of consecutive database rows (`rows`, each `row_len` long) with one side
/// (code or mask) of every rotation (`rots`), entry-major into `out` (rows × R), with the
/// kernel's register tile (measured best on Zen 4, N = 20,000, R = 31): 6 rows × 4 rotations
/// (24 of the 32 zmm registers accumulate) for AVX-512, 3 × 3 (9 of the 16 ymm registers)
/// for AVX2. With AVX-512 and rotations that pair (`paired`), the pairs share products
/// (`dot/paired.rs`).
fn scan_side(
    kernel: DotKernel,
    rows: &[u16],
    row_len: usize,
    rots: &[&[u16]],
    paired: Option<&PairedSide>,
    out: &mut [u16],
) {
    if rots.is_empty() || row_len == 0 {
        return;
    }
    match kernel.kind {
        Kind::Portable => scan_tiled::<4, 4>(kernel, rows, row_len, rots, out),
        #[cfg(target_arch = "x86_64")]
        Kind::Avx2 => scan_tiled::<3, 3>(kernel, rows, row_len, rots, out),
        #[cfg(target_arch = "x86_64")]
        Kind::Avx512 => match paired {
            Some(side) => paired::scan_side(kernel, rows, row_len, rots, side, out),
            None => scan_tiled::<6, 4>(kernel, rows, row_len, rots, out),
        },
    }
}

/// [`scan_side`] with blocks of `MR` rows and tiles of `NR` rotations: every block is
/// scanned against all rotations ([`dot_block`]); the last < `MR` rows go one at a time.
fn scan_tiled<const MR: usize, const NR: usize>(
    kernel: DotKernel,
    rows: &[u16],
    row_len: usize,
    rots: &[&[u16]],
    out: &mut [u16],
) {
    let r_count = rots.len();
    let mut acc = vec![Slot::ZERO; MR * r_count];
    let mut blocks = rows.chunks_exact(MR * row_len);
    let mut outs = out.chunks_exact_mut(MR * r_count);
    for (block, o) in (&mut blocks).zip(&mut outs) {
        let rows: [&[u16]; MR] = std::array::from_fn(|m| &block[m * row_len..][..row_len]);
        dot_block_tiled::<MR, NR>(kernel, rows, rots, o, &mut acc);
    }
    let rest = blocks.remainder().chunks_exact(row_len);
    for (row, o) in rest.zip(outs.into_remainder().chunks_exact_mut(r_count)) {
        dot_block_tiled::<1, NR>(kernel, [row], rots, o, &mut acc);
    }
}

/// Every dot product `rows[m] · cols[r]` (over the common length), entry-major into `out`
/// (`out[m * R + r]`, M × R slots), with tiles of up to 4 columns; `acc` is scratch of at
/// least M × R slots.
fn dot_block<const M: usize>(
    kernel: DotKernel,
    rows: [&[u16]; M],
    cols: &[&[u16]],
    out: &mut [u16],
    acc: &mut [Slot],
) {
    dot_block_tiled::<M, 4>(kernel, rows, cols, out, acc);
}

/// [`dot_block`] with tiles of `NR` columns. The common length is cut into cache blocks of
/// [`DotKernel::block_elems`] elements; within a block every column group passes over the M
/// rows' slices, adding into the accumulators `acc[r * M + m]`, which are reduced once at the
/// end (so each row is streamed from memory once, whatever R).
fn dot_block_tiled<const M: usize, const NR: usize>(
    kernel: DotKernel,
    rows: [&[u16]; M],
    cols: &[&[u16]],
    out: &mut [u16],
    acc: &mut [Slot],
) {
    let r_count = cols.len();
    if r_count == 0 {
        return;
    }
    if kernel.kind == Kind::Portable {
        return dot_block_portable(rows, cols, out);
    }
    let acc = &mut acc[..M * r_count];
    acc.fill(Slot::ZERO);
    let len = common_len(&rows, cols);
    let full = len - len % kernel.step();
    let kc = kernel.block_elems();
    let mut k0 = 0;
    while k0 < full {
        let k = k0..(k0 + kc).min(full);
        cache_block::<M, NR>(kernel, rows.map(|r| &r[k.clone()]), cols, k.clone(), acc);
        k0 = k.end;
    }
    for (r, c) in cols.iter().enumerate() {
        for (m, row) in rows.iter().enumerate() {
            let sum = kernel.hsum(&acc[r * M + m]);
            out[m * r_count + r] = tail_dot(sum, row, c, full);
        }
    }
}

/// [`dot_block`] for the portable kernel: one [`dot_portable`] per pair (simple, not tiled).
fn dot_block_portable<const M: usize>(rows: [&[u16]; M], cols: &[&[u16]], out: &mut [u16]) {
    for (row, o) in rows.iter().zip(out.chunks_exact_mut(cols.len())) {
        for (c, v) in cols.iter().zip(o) {
            *v = dot_portable(row, c);
        }
    }
}

/// One cache block: the M row slices `rows` against the elements `k` of every column, `NR`
/// columns per tile and the last < `NR` in tiles of up to 4 ([`tail_tile`]).
fn cache_block<const M: usize, const NR: usize>(
    kernel: DotKernel,
    rows: [&[u16]; M],
    cols: &[&[u16]],
    k: Range<usize>,
    acc: &mut [Slot],
) {
    let mut groups = cols.chunks_exact(NR);
    let mut accs = acc.chunks_exact_mut(NR * M);
    for (g, a) in (&mut groups).zip(&mut accs) {
        let g: [&[u16]; NR] = std::array::from_fn(|n| &g[n][k.clone()]);
        kernel.tile(rows, g, a);
    }
    let rest = groups.remainder().chunks(4);
    for (g, a) in rest.zip(accs.into_remainder().chunks_mut(4 * M)) {
        tail_tile(kernel, rows, g, k.clone(), a);
    }
}

/// The M row slices `rows` against the elements `k` of 1 to 4 columns `g`, in one tile.
fn tail_tile<const M: usize>(
    kernel: DotKernel,
    rows: [&[u16]; M],
    g: &[&[u16]],
    k: Range<usize>,
    acc: &mut [Slot],
) {
    match *g {
        [a] => kernel.tile(rows, [&a[k]], acc),
        [a, b] => kernel.tile(rows, [&a[k.clone()], &b[k]], acc),
        [a, b, c] => kernel.tile(rows, [a, b, c].map(|x| &x[k.clone()]), acc),
        [a, b, c, d] => kernel.tile(rows, [a, b, c, d].map(|x| &x[k.clone()]), acc),
        _ => unreachable!("cache_block passes 1 to 4 columns"),
    }
}

/// Scans the whole matrix on the calling thread ([BGK+24] §4.3.2 local dot products) ([`scan_range`] over all entries): the
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
    use crate::iris::query::{plain_dot_u16, share_query_template, PreparedRotation};
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

    /// A prepared query of `r_count` rotations with random coefficients (mixed extremes).
    fn random_query(r_count: usize, rng: &mut ChaCha20Rng) -> PreparedQuery {
        PreparedQuery {
            party: PartyIndex::ALL[0],
            rotations: (0..r_count)
                .map(|r| PreparedRotation {
                    rotation: r as i32,
                    code: inputs(CODE_SHARE_COEFS, 3, rng),
                    mask: inputs(MASK_SHARE_COEFS, 3, rng),
                })
                .collect(),
        }
    }

    /// The tiling remainders: 1..=13 rows (not a multiple of any row block) from unaligned
    /// start entries × R in {1, 3, 5, 31} (not multiples of any rotation tile), against a
    /// naive reference, for every kernel; and single dot products whose length is not a
    /// whole number of cache blocks or of vector steps.
    #[test]
    fn tiling_remainders_match_naive_reference() {
        report_missing_avx512("tiling_remainders_match_naive_reference");
        let mut rng = ChaCha20Rng::seed_from_u64(46);
        let n = 14;
        let codes = inputs(n * CODE_SHARE_COEFS, 3, &mut rng);
        let masks = inputs(n * MASK_SHARE_COEFS, 3, &mut rng);
        let db = ShareMatrix::new(&codes, &masks).expect("matrix");
        let row = |m: &[u16], len: usize, e: usize| m[e * len..(e + 1) * len].to_vec();
        for r_count in [1, 3, 5, 31] {
            let query = random_query(r_count, &mut rng);
            for rows in 1..=13 {
                let entries = n - rows..n;
                let (mut want_c, mut want_m) = (Vec::new(), Vec::new());
                for e in entries.clone() {
                    for rot in &query.rotations {
                        let c = row(&codes, CODE_SHARE_COEFS, e);
                        want_c.push(plain_dot_u16(&c, &rot.code));
                        let m = row(&masks, MASK_SHARE_COEFS, e);
                        want_m.push(plain_dot_u16(&m, &rot.mask));
                    }
                }
                for kernel in kernels() {
                    let (mut c, mut m) = (vec![0; rows * r_count], vec![0; rows * r_count]);
                    scan_range(kernel, &db, &query, entries.clone(), &mut c, &mut m).expect("scan");
                    let ctx = format!("kernel {} rows {rows} R {r_count}", kernel.name());
                    assert_eq!(c, want_c, "{ctx} code");
                    assert_eq!(m, want_m, "{ctx} mask");
                }
            }
        }
        for len in [2047, 2048, 2049, 4111, MASK_SHARE_COEFS + 31] {
            let a = inputs(len, 3, &mut rng);
            let bs: Vec<Vec<u16>> = (0..4).map(|_| inputs(len, 3, &mut rng)).collect();
            let b = [&bs[0][..], &bs[1][..], &bs[2][..], &bs[3][..]];
            let want = b.map(|x| plain_dot_u16(&a, x));
            for k in kernels() {
                assert_eq!(k.dot4(&a, b), want, "kernel {} len {len}", k.name());
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
