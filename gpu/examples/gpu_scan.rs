//! `gpu_scan`: the iris scan on a GPU against the ceilings of the same device measured in the
//! same run, and against the CPU scan of the same host.
//!
//! ```text
//! cargo run --release -p privmatch-gpu --example gpu_scan -- [--n 1000000,2000000] [--reps 5] [--no-cpu]
//! ```
//!
//! Per N and rotation count R: the first scan (it uploads the shares), the GEMMs + combines
//! alone (device events, median of `--reps`), the bytes of limbs read per kernel second against
//! the measured device-to-device copy bandwidth, the int8 rate against a large cuBLAS int8 GEMM,
//! and the end-to-end scan with the copy back into host memory (median), in comparisons per
//! second (N·R per scan), beside the CPU scan of the same rows on every host thread.
//! R = 63 and 127 show what more query columns cost: whether stacking several searches into
//! one GEMM would pay.

use std::time::Instant;

use privmatch_core::iris::dot::ShareMatrix;
use privmatch_core::iris::encoding::{CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use privmatch_core::iris::query::{share_query_template, PreparedQuery};
use privmatch_core::iris::scan::{CpuScan, Interrupt, ScanBackend};
use privmatch_core::iris::synth::random_template;
use privmatch_gpu::ceilings::{copy_bandwidth, int8_gemm_rate, median};
use privmatch_gpu::iris::device::LIMB_BYTES_PER_ROW;
use privmatch_gpu::iris::limbs::padded_columns;
use privmatch_gpu::iris::scan::{GpuConfig, GpuScan};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

struct Args {
    sizes: Vec<usize>,
    reps: usize,
    cpu: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        sizes: vec![1_000_000],
        reps: 5,
        cpu: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => {
                let v = it.next().ok_or("--n needs a value")?;
                args.sizes = v
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|e| format!("--n {s:?}: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--reps" => {
                let v = it.next().ok_or("--reps needs a value")?;
                args.reps = v.parse().map_err(|e| format!("--reps {v:?}: {e}"))?;
            }
            "--no-cpu" => args.cpu = false,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

/// Fills `out` with uniform u16 on all host threads (shares are uniform).
fn fill_random(out: &mut [u16], seed: u64) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = out.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (t, part) in out.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut x = seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                for v in part {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *v = (x >> 40) as u16;
                }
            });
        }
    });
}

fn cpu_features() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let wanted = ["avx2", "avx512f", "avx512bw", "avx512_vnni", "vaes", "aes"];
    let have: Vec<&str> = wanted.into_iter().filter(|f| flags.contains(f)).collect();
    format!(
        "{model}, {} threads, {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        have.join(" ")
    )
}

fn query(max_rotation: i32) -> PreparedQuery {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let probe = random_template(&mut rng);
    let share = share_query_template(&probe, &mut rng).expect("query")[0].clone();
    PreparedQuery::prepare(&share, max_rotation).expect("prepare")
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu_scan: {e}");
            std::process::exit(2);
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = CpuScan::detect(threads);
    let log = std::sync::Arc::new(|line: &str| eprintln!("{line}"));
    let gpu = match GpuScan::open(&GpuConfig::default(), cpu, log) {
        Ok(g) => g,
        Err(e) => {
            println!("SKIP: {e}");
            return;
        }
    };
    let info = gpu.devices()[0].clone();
    println!(
        "device: {} (sm_{}{}), {:.1} GiB; host: {}; CPU kernel: {}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.total_memory as f64 / (1u64 << 30) as f64,
        cpu_features(),
        cpu.name()
    );
    let bandwidth = copy_bandwidth(info.ordinal, 4 << 30, 10).expect("copy bandwidth");
    let gemm_rate = int8_gemm_rate(info.ordinal, (8192, 8192, 8192), 10).expect("int8 GEMM");
    println!(
        "ceilings: device-to-device copy {:.0} GB/s (4 GiB, bytes read + written); cuBLAS int8 GEMM 8192³ {:.0} TOPS",
        bandwidth / 1e9,
        gemm_rate / 1e12
    );
    let mut rows_out = Vec::new();
    for &n in &args.sizes {
        let started = Instant::now();
        let mut codes = vec![0u16; n * CODE_SHARE_COEFS];
        let mut masks = vec![0u16; n * MASK_SHARE_COEFS];
        fill_random(&mut codes, 1);
        fill_random(&mut masks, 2);
        let journal = privmatch_core::iris::journal::RowJournal::new();
        let db = ShareMatrix::new(&codes, &masks)
            .expect("matrix")
            .tracked_by(&journal);
        eprintln!(
            "N = {n}: {:.1} GB of shares generated in {:.1} s",
            (n * LIMB_BYTES_PER_ROW) as f64 / 1e9,
            started.elapsed().as_secs_f64()
        );
        for max_rotation in [0, 15, 31, 63] {
            let q = query(max_rotation);
            let r = q.num_rotations();
            let t0 = Instant::now();
            let first = gpu.scan_gpu(&db, &q, Interrupt::never());
            let first_s = t0.elapsed().as_secs_f64();
            if let Err(e) = first {
                println!("N = {n}, R = {r}: GPU scan failed: {e}");
                continue;
            }
            let mut e2e = Vec::new();
            for _ in 0..args.reps {
                let t = Instant::now();
                let out = gpu.scan_gpu(&db, &q, Interrupt::never()).expect("scan");
                e2e.push(t.elapsed().as_secs_f32() * 1e3);
                std::hint::black_box(out);
            }
            let kernels = gpu
                .time_kernels(&db, &q, args.reps)
                .map(|t| median(&t))
                .map_err(|e| eprintln!("kernel timing failed: {e}"))
                .ok();
            let cpu_ms = (args.cpu && (r == 1 || r == 31)).then(|| {
                let t = Instant::now();
                std::hint::black_box(cpu.scan(&db, &q, Interrupt::never()).expect("cpu scan"));
                t.elapsed().as_secs_f32() * 1e3
            });
            let e2e_ms = median(&e2e);
            let bytes = (n * LIMB_BYTES_PER_ROW) as f64;
            let ops = 2.0
                * padded_columns(r) as f64
                * n as f64
                * (2 * (CODE_SHARE_COEFS + MASK_SHARE_COEFS)) as f64;
            let line = format!(
                "| {n} | {r} | {first_s:.2} | {} | {} | {} | {e2e_ms:.1} | {:.2} G | {} |",
                kernels.map_or("-".into(), |k| format!("{k:.2}")),
                kernels.map_or("-".into(), |k| format!(
                    "{:.0} GB/s ({:.0} %)",
                    bytes / (f64::from(k) * 1e-3) / 1e9,
                    100.0 * bytes / (f64::from(k) * 1e-3) / bandwidth
                )),
                kernels.map_or("-".into(), |k| format!(
                    "{:.0} TOPS ({:.0} %)",
                    ops / (f64::from(k) * 1e-3) / 1e12,
                    100.0 * ops / (f64::from(k) * 1e-3) / gemm_rate
                )),
                (n * r) as f64 / (f64::from(e2e_ms) * 1e-3) / 1e9,
                cpu_ms.map_or("-".into(), |c| format!("{c:.0} ms ({:.0}×)", c / e2e_ms)),
            );
            eprintln!("{line}");
            rows_out.push(line);
        }
    }
    println!("| N | R | first scan (upload) s | kernels ms | limb bytes / kernel time (of copy bw) | int8 rate (of GEMM) | end-to-end ms | comparisons/s | CPU scan, {threads} threads (GPU speed-up) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for l in rows_out {
        println!("{l}");
    }
}
