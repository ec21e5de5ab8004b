//! `u16` storage aligned to 64-byte cache lines, for the rows and query rotations the scan
//! kernels read ([`crate::iris::dot`]).
//!
//! Why: a 64-byte vector load from an address that is not a multiple of 64 touches two cache
//! lines. `Vec<u16>` gives 2-byte alignment (16 in practice, from malloc), so every AVX-512 load
//! of the scan was split. Measured with `examples/dot_scan` (N = 100,000, 31 rotations, one
//! thread, AVX-512 VNNI Xeon): 0.80 s with the rows and rotations where malloc put them,
//! 0.68 s aligned. Code rows (12,800 coefficients) and mask rows (6,400) are whole lines, so
//! every row of an aligned matrix starts on a line.

use std::ops::{Deref, DerefMut};

/// Coefficients per cache line.
const LINE_U16S: usize = 32;

/// One cache line of coefficients.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u16; LINE_U16S]);

const ZERO_LINE: Line = Line([0; LINE_U16S]);

/// A growable `u16` buffer whose first element starts a 64-byte cache line. Behaves as a
/// `[u16]` through `Deref`; grows like a `Vec` (amortised, or exactly with
/// [`AlignedU16s::reserve_exact`]).
#[derive(Clone, Default)]
pub struct AlignedU16s {
    lines: Vec<Line>,
    len: usize,
}

impl std::fmt::Debug for AlignedU16s {
    /// Prints the length only (the buffer holds shares).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedU16s(len {})", self.len)
    }
}

impl AlignedU16s {
    /// An empty buffer.
    pub const fn new() -> Self {
        AlignedU16s {
            lines: Vec::new(),
            len: 0,
        }
    }

    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        AlignedU16s {
            lines: vec![ZERO_LINE; len.div_ceil(LINE_U16S)],
            len,
        }
    }

    /// Coefficients the buffer holds without reallocating.
    pub fn capacity(&self) -> usize {
        self.lines.capacity() * LINE_U16S
    }

    /// Makes room for at least `additional` more coefficients, exactly that much if it must
    /// grow (for large matrices that are sized once).
    pub fn reserve_exact(&mut self, additional: usize) {
        let lines = (self.len + additional).div_ceil(LINE_U16S);
        self.lines
            .reserve_exact(lines.saturating_sub(self.lines.len()));
    }

    /// Appends `values`.
    pub fn extend_from_slice(&mut self, values: &[u16]) {
        let start = self.len;
        self.resize(start + values.len());
        self[start..].copy_from_slice(values);
    }

    /// Shortens the buffer to `len` coefficients (no effect if it is not longer).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len {
            self.resize(len);
        }
    }

    /// Sets the length to `len`, new coefficients zero. Keeps the invariant that the lines hold
    /// zeros past `len`, so a line shared with a shorter length never shows stale values.
    fn resize(&mut self, len: usize) {
        self.lines.resize(len.div_ceil(LINE_U16S), ZERO_LINE);
        self.whole_lines_mut()[len..].fill(0);
        self.len = len;
    }

    /// Every coefficient of the allocated lines, including those past `len`.
    fn whole_lines_mut(&mut self) -> &mut [u16] {
        let n = self.lines.len() * LINE_U16S;
        // SAFETY: `Line` is `repr(C)` over `[u16; 32]` with no padding (64 bytes, align 64), so
        // the lines are `n` initialised, contiguous u16s; the slice borrows `self` mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u16>(), n) }
    }
}

impl Deref for AlignedU16s {
    type Target = [u16];

    fn deref(&self) -> &[u16] {
        // SAFETY: `Line` is `repr(C)` over `[u16; 32]` with no padding (64 bytes, align 64), so
        // the lines are `lines.len() * 32` initialised, contiguous u16s; `len` never exceeds that.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u16>(), self.len) }
    }
}

impl DerefMut for AlignedU16s {
    fn deref_mut(&mut self) -> &mut [u16] {
        // SAFETY: as in `deref`, and the slice borrows `self` mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u16>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_vec_and_stays_aligned() {
        let mut a = AlignedU16s::new();
        let mut v: Vec<u16> = Vec::new();
        for step in 0..200u16 {
            let chunk: Vec<u16> = (0..(step % 70)).map(|i| i.wrapping_mul(step)).collect();
            a.extend_from_slice(&chunk);
            v.extend_from_slice(&chunk);
            if step % 7 == 0 {
                let keep = v.len() * 2 / 3;
                a.truncate(keep);
                v.truncate(keep);
            }
            if step % 11 == 0 {
                a.reserve_exact(1000);
                assert!(a.capacity() >= a.len() + 1000);
            }
            assert_eq!(&a[..], &v[..]);
            assert_eq!(a.as_ptr() as usize % 64, 0);
        }
        let len = a.len();
        a.copy_within(0..10, len - 10);
        v.copy_within(0..10, len - 10);
        assert_eq!(&a[..], &v[..]);
        assert_eq!(&AlignedU16s::zeroed(33)[..], &[0u16; 33][..]);
    }
}
