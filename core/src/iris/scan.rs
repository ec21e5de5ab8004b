//! The scan seam: the party-local step of an iris search that multiplies every enrolled share
//! row with every rotation of the prepared query ([BGK+24] §4.3.2 "local
//! dot products"). It is the only step whose cost grows with the database, so it is the one
//! a party may hand to other hardware: the search service takes any [`ScanBackend`], the
//! engine worker picks one, and a GPU backend is a crate of its own implementing the trait,
//! with no edit to the protocol code.
//!
//! Contract of every backend: the output is bit-identical to [`crate::iris::dot::scan`]
//! (wrapping Z_2^16 dot products, entry-major `rows × R`, in the row order of the matrix).
//! The MPC steps after the scan depend only on these values, so backends are
//! interchangeable within one search and across parties.

use std::ops::Range;

use crate::iris::dot::{scan_range, DotError, DotKernel, DotShares, ShareMatrix};
use crate::iris::query::PreparedQuery;

/// Something that computes a search's local dot-product shares (module docs).
pub trait ScanBackend: Send + Sync {
    /// A short name for status output and benchmarks (e.g. `avx512-vnni`).
    fn name(&self) -> String;

    /// How many scans run in parallel inside one call (threads, or streams of a device).
    fn parallelism(&self) -> usize;

    /// The dot-product shares of every row of `db` with every rotation of `query`,
    /// entry-major (`db.len() × R`) in row order.
    fn scan(&self, db: &ShareMatrix<'_>, query: &PreparedQuery) -> Result<DotShares, DotError>;
}

/// The CPU backend: the best SIMD kernel of [`DotKernel`] on `threads` scoped threads, the
/// rows split into contiguous ranges of about equal size.
#[derive(Clone, Copy, Debug)]
pub struct CpuScan {
    kernel: DotKernel,
    threads: usize,
}

impl CpuScan {
    /// A CPU backend with `kernel` on `threads` threads (at least one).
    pub fn new(kernel: DotKernel, threads: usize) -> Self {
        CpuScan {
            kernel,
            threads: threads.max(1),
        }
    }

    /// The best kernel this CPU supports, on `threads` threads.
    pub fn detect(threads: usize) -> Self {
        Self::new(DotKernel::detect(), threads)
    }

    /// The kernel in use.
    pub fn kernel(&self) -> DotKernel {
        self.kernel
    }
}

impl ScanBackend for CpuScan {
    fn name(&self) -> String {
        self.kernel.name().to_owned()
    }

    fn parallelism(&self) -> usize {
        self.threads
    }

    fn scan(&self, db: &ShareMatrix<'_>, query: &PreparedQuery) -> Result<DotShares, DotError> {
        let r = query.num_rotations();
        let n = db.len();
        let mut code = vec![0u16; n * r];
        let mut mask = vec![0u16; n * r];
        scan_parallel(self.kernel, db, query, self.threads, &mut code, &mut mask)?;
        Ok(DotShares {
            num_rotations: r,
            num_entries: n,
            code,
            mask,
        })
    }
}

/// Entry ranges of about equal size, one per thread.
fn split_ranges(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, n.max(1));
    let step = n.div_ceil(parts);
    (0..parts)
        .map(|p| (p * step).min(n)..((p + 1) * step).min(n))
        .filter(|r| !r.is_empty())
        .collect()
}

/// [`scan_range`] over all rows of `db`, the rows split across `threads` scoped threads.
fn scan_parallel(
    kernel: DotKernel,
    db: &ShareMatrix<'_>,
    query: &PreparedQuery,
    threads: usize,
    code: &mut [u16],
    mask: &mut [u16],
) -> Result<(), DotError> {
    let r = query.num_rotations();
    let ranges = split_ranges(db.len(), threads);
    if ranges.len() <= 1 {
        return scan_range(kernel, db, query, 0..db.len(), code, mask);
    }
    std::thread::scope(|scope| {
        let mut code_rest = code;
        let mut mask_rest = mask;
        let mut handles = Vec::with_capacity(ranges.len());
        for range in ranges {
            let (c, c_tail) = std::mem::take(&mut code_rest).split_at_mut(range.len() * r);
            let (m, m_tail) = std::mem::take(&mut mask_rest).split_at_mut(range.len() * r);
            code_rest = c_tail;
            mask_rest = m_tail;
            handles.push(scope.spawn(move || scan_range(kernel, db, query, range, c, m)));
        }
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or(Err(DotError::WorkerPanicked)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::dot::scan;
    use crate::iris::encoding::share_template;
    use crate::iris::query::share_query_template;
    use crate::iris::synth::random_template;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

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

    #[test]
    fn cpu_backend_on_many_threads_equals_the_single_thread_scan() {
        let mut rng = ChaCha20Rng::seed_from_u64(41);
        let (mut codes, mut masks) = (Vec::new(), Vec::new());
        for _ in 0..37 {
            let share =
                share_template(&random_template(&mut rng), &mut rng).expect("share")[1].clone();
            codes.extend_from_slice(&share.code);
            masks.extend_from_slice(&share.mask);
        }
        let db = ShareMatrix::new(&codes, &masks).expect("matrix");
        let probe = random_template(&mut rng);
        let [_, share, _] = share_query_template(&probe, &mut rng).expect("query");
        let query = PreparedQuery::prepare(&share, 3).expect("prepare");
        for kernel in DotKernel::available() {
            let reference = scan(kernel, &db, &query).expect("scan");
            for threads in [1, 2, 5] {
                let got = CpuScan::new(kernel, threads)
                    .scan(&db, &query)
                    .expect("scan");
                assert_eq!(got, reference, "{} on {threads} threads", kernel.name());
            }
        }
    }

    #[test]
    fn pipeline_query_dot_reshare_matches_plaintext() {
        // [BGK+24] §4.3.2 end to end: prepare the probe at each party, scan, reshare the code
        // and mask dot products, reconstruct the replicated shares, compare with plaintext.
        use crate::algebra::ring::Z16;
        use crate::iris::synth::near_duplicate;
        use crate::iris::template::{masked_code_distance_counts, MAX_ROTATION};
        use crate::mpc::reshare::reshare_context;
        use crate::mpc::reshare::test_support::run;
        use crate::party::PartyIndex;
        use crate::sharing::replicated::reconstruct;
        use std::num::Wrapping;
        const P: [PartyIndex; 3] = PartyIndex::ALL;

        let mut rng = ChaCha20Rng::seed_from_u64(77);
        let query = random_template(&mut rng);
        let templates = [
            random_template(&mut rng),
            near_duplicate(&query, 0.1, 5, &mut rng),
            near_duplicate(&query, 0.3, -12, &mut rng),
        ];
        let mut mats: [(Vec<u16>, Vec<u16>); 3] = Default::default();
        for t in &templates {
            let shares = share_template(t, &mut rng).expect("share");
            for (m, s) in mats.iter_mut().zip(&shares) {
                m.0.extend_from_slice(&s.code);
                m.1.extend_from_slice(&s.mask);
            }
        }
        let q_shares = share_query_template(&query, &mut rng).expect("share query");
        let mut code_in: [Vec<Z16>; 3] = Default::default();
        let mut mask_in: [Vec<Z16>; 3] = Default::default();
        for p in P {
            let i = p.as_usize();
            let q = PreparedQuery::prepare(&q_shares[i], MAX_ROTATION).expect("prepare");
            let db = ShareMatrix::new(&mats[i].0, &mats[i].1).expect("matrix");
            let res = scan(DotKernel::detect(), &db, &q).expect("scan");
            code_in[i] = res.code.iter().map(|&v| Wrapping(v)).collect();
            mask_in[i] = res.mask.iter().map(|&v| Wrapping(v)).collect();
        }
        let (_, code_out) = run(&code_in, 1, &reshare_context(b"s1", 1, "code"));
        let (_, mask_out) = run(&mask_in, 1, &reshare_context(b"s1", 1, "mask"));
        let r_count = 2 * MAX_ROTATION as usize + 1;
        let mut disagreements = 0;
        for (e, t) in templates.iter().enumerate() {
            for (r, k) in (-MAX_ROTATION..=MAX_ROTATION).enumerate() {
                let i = e * r_count + r;
                let code = reconstruct(&[code_out[0][i], code_out[1][i], code_out[2][i]]);
                let mask = reconstruct(&[mask_out[0][i], mask_out[1][i], mask_out[2][i]]);
                let (hd, common) = masked_code_distance_counts(&query.rotate(k), t);
                let want_code = Wrapping((common as i32 - 2 * hd as i32) as u16);
                if (code, mask) != (Ok(want_code), Ok(Wrapping((common / 2) as u16))) {
                    disagreements += 1;
                }
            }
        }
        assert_eq!(disagreements, 0);
    }
}
