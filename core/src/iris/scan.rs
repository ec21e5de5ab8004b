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
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use crate::iris::dot::{
    scan_range_with, DotError, DotKernel, DotShares, RotationPanel, ShareMatrix,
};
use crate::iris::query::PreparedQuery;
use crate::parallel::{on_threads, piece_len, worth_a_pool};

/// A request to stop a scan early, raised from another thread: the engine raises it when the
/// backend that asked for the search hangs up (its query was cancelled or timed out), so a
/// long scan does not hold the engine after nobody waits for it. A backend checks it between
/// chunks of [`INTERRUPT_CHUNK_ROWS`] rows and then fails with [`DotError::Interrupted`].
#[derive(Debug, Default)]
pub struct Interrupt(AtomicBool);

impl Interrupt {
    /// An interrupt nobody raises.
    pub fn never() -> &'static Interrupt {
        static NEVER: Interrupt = Interrupt(AtomicBool::new(false));
        &NEVER
    }

    /// Asks the scan to stop.
    pub fn raise(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the scan was asked to stop.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// [`DotError::Interrupted`] when raised.
    pub fn check(&self) -> Result<(), DotError> {
        if self.is_raised() {
            Err(DotError::Interrupted)
        } else {
            Ok(())
        }
    }
}

/// Rows a CPU scan thread computes between two looks at the [`Interrupt`] (about 10 ms of one
/// thread's work with 31 rotations).
pub const INTERRUPT_CHUNK_ROWS: usize = 512;

/// Something that computes a search's local dot-product shares (module docs).
pub trait ScanBackend: Send + Sync {
    /// A short name for status output and benchmarks (e.g. `avx512-vnni`).
    fn name(&self) -> String;

    /// How many scans run in parallel inside one call (threads, or streams of a device).
    fn parallelism(&self) -> usize;

    /// The dot-product shares of every row of `db` with every rotation of `query`,
    /// entry-major (`db.len() × R`) in row order; [`DotError::Interrupted`] soon after
    /// `interrupt` is raised.
    fn scan(
        &self,
        db: &ShareMatrix<'_>,
        query: &PreparedQuery,
        interrupt: &Interrupt,
    ) -> Result<DotShares, DotError>;
}

/// The CPU backend: the best SIMD kernel of [`DotKernel`] on a rayon pool of `threads` threads
/// ([`crate::parallel`]), the rows split into contiguous pieces of about equal size.
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

    fn scan(
        &self,
        db: &ShareMatrix<'_>,
        query: &PreparedQuery,
        interrupt: &Interrupt,
    ) -> Result<DotShares, DotError> {
        let r = query.num_rotations();
        let n = db.len();
        let mut code = vec![0u16; n * r];
        let mut mask = vec![0u16; n * r];
        let job = Job {
            kernel: self.kernel,
            db,
            panel: &RotationPanel::new(query)?,
            interrupt,
        };
        scan_parallel(&job, self.threads, &mut code, &mut mask)?;
        Ok(DotShares {
            num_rotations: r,
            num_entries: n,
            code,
            mask,
        })
    }
}

/// What every scan thread reads.
struct Job<'a> {
    kernel: DotKernel,
    db: &'a ShareMatrix<'a>,
    panel: &'a RotationPanel,
    interrupt: &'a Interrupt,
}

impl Job<'_> {
    /// [`scan_range_with`] over `range` in chunks of [`INTERRUPT_CHUNK_ROWS`], looking at the
    /// interrupt before each.
    fn scan_range(
        &self,
        range: Range<usize>,
        code: &mut [u16],
        mask: &mut [u16],
    ) -> Result<(), DotError> {
        let r = self.panel.len();
        let chunks = code
            .chunks_mut(INTERRUPT_CHUNK_ROWS * r.max(1))
            .zip(mask.chunks_mut(INTERRUPT_CHUNK_ROWS * r.max(1)));
        let mut start = range.start;
        for (c, m) in chunks {
            self.interrupt.check()?;
            let end = (start + INTERRUPT_CHUNK_ROWS).min(range.end);
            scan_range_with(self.kernel, self.db, self.panel, start..end, c, m)?;
            start = end;
        }
        // An empty range (or no rotation) has no chunk: still one call, for its checks.
        if start == range.start {
            scan_range_with(self.kernel, self.db, self.panel, range, code, mask)?;
        }
        Ok(())
    }
}

/// [`Job::scan_range`] over all rows, the rows split into about one piece per thread and the
/// pieces run on the pool of `threads` threads ([`crate::parallel::on_threads`]).
fn scan_parallel(
    job: &Job<'_>,
    threads: usize,
    code: &mut [u16],
    mask: &mut [u16],
) -> Result<(), DotError> {
    let (rows, r) = (job.db.len(), job.panel.len());
    if !worth_a_pool(rows, 1, threads) || r == 0 {
        return job.scan_range(0..rows, code, mask);
    }
    let piece = piece_len(rows, threads);
    on_threads(threads, || {
        code.par_chunks_mut(piece * r)
            .zip(mask.par_chunks_mut(piece * r))
            .enumerate()
            .try_for_each(|(i, (c, m))| {
                let start = i * piece;
                job.scan_range(start..(start + piece).min(rows), c, m)
            })
    })
    .unwrap_or(Err(DotError::WorkerPanicked))
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
                    .scan(&db, &query, Interrupt::never())
                    .expect("scan");
                assert_eq!(got, reference, "{} on {threads} threads", kernel.name());
            }
        }
    }

    #[test]
    fn a_chunked_scan_equals_the_reference_and_stops_when_interrupted() {
        let mut rng = ChaCha20Rng::seed_from_u64(43);
        let rows = 2 * INTERRUPT_CHUNK_ROWS + 77;
        let share = share_template(&random_template(&mut rng), &mut rng).expect("share")[0].clone();
        let (mut codes, mut masks) = (Vec::new(), Vec::new());
        for i in 0..rows {
            // Rows differ (a rotated copy per row) so a chunk written at the wrong offset shows.
            let k = i % share.code.len();
            codes.extend(share.code[k..].iter().chain(&share.code[..k]));
            masks.extend(
                share.mask[k % share.mask.len()..]
                    .iter()
                    .chain(&share.mask[..k % share.mask.len()]),
            );
        }
        let db = ShareMatrix::new(&codes, &masks).expect("matrix");
        let probe = random_template(&mut rng);
        let [share, _, _] = share_query_template(&probe, &mut rng).expect("query");
        let query = PreparedQuery::prepare(&share, 0).expect("prepare");
        let kernel = DotKernel::detect();
        let reference = scan(kernel, &db, &query).expect("scan");
        for threads in [1, 2] {
            let got = CpuScan::new(kernel, threads)
                .scan(&db, &query, Interrupt::never())
                .expect("scan");
            assert_eq!(got, reference, "{threads} threads");
        }
        let raised = Interrupt::default();
        raised.raise();
        assert!(matches!(
            CpuScan::new(kernel, 2).scan(&db, &query, &raised),
            Err(DotError::Interrupted)
        ));
    }

    #[test]
    fn pipeline_query_dot_reshare_matches_plaintext() {
        // [BGK+24] §4.3.2 end to end: prepare the probe at each party, scan, reshare the code
        // and mask dot products, reconstruct the replicated shares, compare with plaintext.
        use crate::algebra::ring::Z16;
        use crate::iris::mpc::reshare::reshare_context;
        use crate::iris::mpc::reshare::test_support::run;
        use crate::iris::sharing::replicated::reconstruct;
        use crate::iris::synth::near_duplicate;
        use crate::iris::template::{masked_code_distance_counts, MAX_ROTATION};
        use crate::party::PartyIndex;
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
