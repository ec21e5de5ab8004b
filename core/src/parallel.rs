//! Splitting work across scoped threads (shared by the modalities' batched evaluations).

use std::ops::Range;

/// Entry ranges 0..n in at most `parts` contiguous pieces of about equal size, one per
/// thread, in order.
pub fn split_ranges(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let step = n.div_ceil(parts);
    (0..parts)
        .map(|p| (p * step).min(n)..((p + 1) * step).min(n))
        .filter(|r| !r.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_ranges_cover_every_row_once_in_order() {
        for n in [0usize, 1, 5, 64, 101] {
            for parts in [1usize, 2, 3, 8, 200] {
                let ranges = split_ranges(n, parts);
                let covered: Vec<usize> = ranges.iter().cloned().flatten().collect();
                assert_eq!(covered, (0..n).collect::<Vec<_>>(), "n={n} parts={parts}");
                assert!(ranges.len() <= parts.max(1));
            }
        }
    }
}
