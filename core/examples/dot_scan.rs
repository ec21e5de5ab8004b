//! Benchmark of one party's local iris scan (the dot-product kernel), not of the whole
//! protocol: `cargo run --release -p privmatch-core --example dot_scan -- [N] [REPS]`
//! (every time is the median of REPS runs, default 1).
//!
//! Prints, for N random enrolled shares and one probe, (a) without rotations and (b) with 31
//! rotations, for every dot-product kernel this CPU supports ([`DotKernel::available`]:
//! portable, AVX2, AVX-512 VNNI): the wall time on one thread and on all threads, comparisons
//! per second, and the
//! ratio to the memory-bandwidth floor (share bytes scanned ÷ a single-thread read bandwidth
//! measured in the same run); the time of a plaintext matcher (open-iris semantics, u64
//! popcounts) over the same N; and, with rotations, the engine's CPU backend (`CpuScan`, on a
//! rayon pool) against scoped threads started per scan (this example's own split), interleaved.
//! Last, a small scan (1 % of the rows, no rotation) alone and while a large one (every row, 31
//! rotations) runs on another thread: on pools leased per call the small one shares the cores;
//! on one pool shared by all calls it would wait for the large one to finish.

use std::time::Instant;

use privmatch_core::iris::aligned::AlignedU16s;
use privmatch_core::iris::dot::{scan_range, DotKernel, ShareMatrix, SHARE_BYTES_PER_ENTRY};
use privmatch_core::iris::encoding::{CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use privmatch_core::iris::query::{share_query_template, PreparedQuery};
use privmatch_core::iris::scan::{CpuScan, Interrupt, ScanBackend};
use privmatch_core::iris::synth::random_template;
use privmatch_core::iris::template::{fractional_hamming_distance, min_fhd_over_rotations};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// `n` random coefficients in cache-line aligned storage, as the engine's store keeps rows.
fn random_u16s(n: usize, rng: &mut ChaCha20Rng) -> AlignedU16s {
    let mut out = AlignedU16s::zeroed(n);
    let mut bytes = [0u8; 8192];
    for chunk in out.chunks_mut(bytes.len() / 2) {
        rng.fill_bytes(&mut bytes);
        for (v, p) in chunk.iter_mut().zip(bytes.chunks_exact(2)) {
            *v = u16::from_le_bytes([p[0], p[1]]);
        }
    }
    out
}

/// Single-thread read bandwidth over `data` (bytes per second), best of three.
fn read_bandwidth(data: &[u16]) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        // 32 independent lanes: the compiler vectorises the XOR fold, so this is bound by
        // memory, not by the loop.
        let mut acc = [0u16; 32];
        for chunk in data.chunks_exact(32) {
            for (a, v) in acc.iter_mut().zip(chunk) {
                *a ^= *v;
            }
        }
        std::hint::black_box(acc);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (2 * data.len()) as f64 / best
}

/// Median wall time of `reps` scans of `db` with `kernel` on `threads` threads.
fn median_scan(
    kernel: DotKernel,
    db: &ShareMatrix<'_>,
    query: &PreparedQuery,
    threads: usize,
    reps: usize,
) -> f64 {
    let mut times: Vec<f64> = (0..reps.max(1))
        .map(|_| timed_scan(kernel, db, query, threads))
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Wall time of one scan of `db` with `kernel` on `threads` threads (entry ranges).
fn timed_scan(
    kernel: DotKernel,
    db: &ShareMatrix<'_>,
    query: &PreparedQuery,
    threads: usize,
) -> f64 {
    let n = db.len();
    let r = query.num_rotations();
    let mut code = vec![0u16; n * r];
    let mut mask = vec![0u16; n * r];
    let per = n.div_ceil(threads);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for (t, (code_chunk, mask_chunk)) in code
            .chunks_mut(per * r)
            .zip(mask.chunks_mut(per * r))
            .enumerate()
        {
            let range = t * per..(t * per + code_chunk.len() / r);
            scope.spawn(move || {
                if let Err(e) = scan_range(kernel, db, query, range, code_chunk, mask_chunk) {
                    eprintln!("scan failed: {e}");
                }
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    std::hint::black_box((&code, &mask));
    seconds
}

/// Median wall times of `reps` scans by `CpuScan` (the rayon pool) and by [`timed_scan`]
/// (scoped threads), alternating so that both see the same machine.
fn pool_against_scoped(
    kernel: DotKernel,
    db: &ShareMatrix<'_>,
    query: &PreparedQuery,
    threads: usize,
    reps: usize,
) -> (f64, f64) {
    let cpu = CpuScan::new(kernel, threads);
    let (mut pool, mut scoped) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        if let Err(e) = cpu.scan(db, query, Interrupt::never()) {
            eprintln!("scan failed: {e}");
        }
        pool.push(start.elapsed().as_secs_f64());
        scoped.push(timed_scan(kernel, db, query, threads));
    }
    for times in [&mut pool, &mut scoped] {
        times.sort_by(f64::total_cmp);
    }
    (pool[pool.len() / 2], scoped[scoped.len() / 2])
}

/// Median wall time of `reps` small scans of `small` with `CpuScan` on `threads` threads:
/// alone, and started while a large scan of `large` (from another thread) is running.
fn small_beside_large(
    small: &ShareMatrix<'_>,
    large: &ShareMatrix<'_>,
    small_query: &PreparedQuery,
    large_query: &PreparedQuery,
    threads: usize,
    reps: usize,
) -> (f64, f64, f64) {
    let cpu = CpuScan::new(DotKernel::detect(), threads);
    let timed = |db: &ShareMatrix<'_>, query: &PreparedQuery| {
        let start = Instant::now();
        if let Err(e) = cpu.scan(db, query, Interrupt::never()) {
            eprintln!("scan failed: {e}");
        }
        start.elapsed().as_secs_f64()
    };
    let (mut alone, mut beside, mut large_times) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        alone.push(timed(small, small_query));
        std::thread::scope(|scope| {
            let running = scope.spawn(|| timed(large, large_query));
            // Let the large scan take its pool threads first.
            std::thread::sleep(std::time::Duration::from_millis(20));
            beside.push(timed(small, small_query));
            large_times.push(running.join().unwrap_or(f64::NAN));
        });
    }
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    (median(alone), median(beside), median(large_times))
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let reps: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let mut rng = ChaCha20Rng::seed_from_u64(2026);
    eprintln!(
        "generating {n} random share rows ({:.2} GB)…",
        (n * SHARE_BYTES_PER_ENTRY) as f64 / 1e9
    );
    let codes = random_u16s(n * CODE_SHARE_COEFS, &mut rng);
    let masks = random_u16s(n * MASK_SHARE_COEFS, &mut rng);
    let db = match ShareMatrix::new(&codes, &masks) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let probe = random_template(&mut rng);
    let shares = match share_query_template(&probe, &mut rng) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let bandwidth = read_bandwidth(&codes);
    let scanned = (n * SHARE_BYTES_PER_ENTRY) as f64;
    let floor = scanned / bandwidth;
    println!(
        "dot_scan: N = {n}, kernels {:?} (detected: {}), {threads} threads; read bandwidth (1 thread) {:.1} GB/s, floor for one pass over the shares {:.3} s",
        DotKernel::available()
            .iter()
            .map(DotKernel::name)
            .collect::<Vec<_>>(),
        DotKernel::detect().name(),
        bandwidth / 1e9,
        floor
    );
    let plain: Vec<_> = (0..n.min(20_000))
        .map(|_| random_template(&mut rng))
        .collect();
    for (label, max_rotation) in [("(a) no rotation", 0), ("(b) 31 rotations", 15)] {
        let query = match PreparedQuery::prepare(&shares[0], max_rotation) {
            Ok(q) => q,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let comparisons = (n * query.num_rotations()) as f64;
        let start = Instant::now();
        let mut acc = 0.0;
        for t in &plain {
            acc += if max_rotation == 0 {
                fractional_hamming_distance(&probe, t).unwrap_or(1.0)
            } else {
                min_fhd_over_rotations(&probe, t, max_rotation).unwrap_or(1.0)
            };
        }
        std::hint::black_box(acc);
        let plain_seconds = start.elapsed().as_secs_f64() * n as f64 / plain.len() as f64;
        println!(
            "  {label}: plaintext matcher (1 thread, extrapolated from {} templates) {plain_seconds:.3} s",
            plain.len()
        );
        for kernel in DotKernel::available() {
            let one = median_scan(kernel, &db, &query, 1, reps);
            let all = median_scan(kernel, &db, &query, threads, reps);
            println!(
                "    {:<11} 1 thread {one:.3} s ({:.2} M comparisons/s, {:.1} x the bandwidth floor); {threads} threads {all:.3} s ({:.2} M comparisons/s)",
                kernel.name(),
                comparisons / one / 1e6,
                one / floor,
                comparisons / all / 1e6,
            );
        }
        if max_rotation > 0 {
            let kernel = DotKernel::detect();
            let (pool, scoped) = pool_against_scoped(kernel, &db, &query, threads, reps);
            println!(
                "    CpuScan ({}, {threads} threads) on its rayon pool {pool:.3} s; scoped threads started per scan {scoped:.3} s; ratio pool/scoped {:.3}",
                kernel.name(),
                pool / scoped
            );
        }
    }
    let small_rows = (n / 100).max(1);
    let small = match ShareMatrix::new(
        &codes[..small_rows * CODE_SHARE_COEFS],
        &masks[..small_rows * MASK_SHARE_COEFS],
    ) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let queries = [0, 15].map(|r| PreparedQuery::prepare(&shares[0], r));
    let [Ok(no_rotation), Ok(rotations)] = queries else {
        eprintln!("cannot prepare the queries");
        std::process::exit(1);
    };
    let (alone, beside, large) =
        small_beside_large(&small, &db, &no_rotation, &rotations, threads, reps);
    println!(
        "  overlap: a scan of {small_rows} rows (no rotation, CpuScan, {threads} threads) alone {alone:.4} s; started 20 ms into a scan of {n} rows x 31 rotations ({large:.3} s) {beside:.4} s ({:.1} x alone)",
        beside / alone
    );
}
