//! The GPU scan on a real GPU, checked bit for bit against the CPU scan. Without a usable GPU
//! (CI, a laptop) every test prints `SKIP: <reason>` and passes: the arithmetic itself is
//! pinned to the CPU kernel by the emulation tests in `src/iris/limbs.rs`, which run anywhere.
//!
//! Sizes: tests named `small_*` use a few thousand rows (the set run under compute-sanitizer);
//! `large_*` use 100,000 rows (3.8 GB of shares).

use std::sync::{Arc, Mutex};

use privmatch_core::iris::dot::ShareMatrix;
use privmatch_core::iris::encoding::{IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::query::{share_query_template, PreparedQuery};
use privmatch_core::iris::scan::{CpuScan, Interrupt, ScanBackend};
use privmatch_core::iris::store::{IrisStore, StoredTemplate};
use privmatch_core::iris::synth::random_template;
use privmatch_core::party::PartyIndex;
use privmatch_gpu::iris::scan::{GpuConfig, GpuScan, LogSink};
use privmatch_gpu::GpuError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// A fast generator of share-like u16 rows (uniform; the shares of a real store are too).
struct Rows(u64);

impl Rows {
    fn fill(&mut self, out: &mut [u16]) {
        for v in out {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            *v = (self.0 >> 40) as u16;
        }
    }

    fn matrix(&mut self, n: usize) -> (Vec<u16>, Vec<u16>) {
        let mut codes = vec![0u16; n * CODE_SHARE_COEFS];
        let mut masks = vec![0u16; n * MASK_SHARE_COEFS];
        self.fill(&mut codes);
        self.fill(&mut masks);
        (codes, masks)
    }

    fn share(&mut self) -> IrisShare {
        let (code, mask) = self.matrix(1);
        IrisShare {
            party: PartyIndex::ALL[0],
            code,
            mask,
        }
    }
}

fn cpu() -> CpuScan {
    CpuScan::detect(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Log lines the backend wrote.
fn log_sink() -> (LogSink, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let log: LogSink = Arc::new(move |line: &str| {
        sink.lock().expect("log lock").push(line.to_owned());
    });
    (log, lines)
}

/// The GPU backend, or `None` after printing why the test is skipped.
fn gpu(config: GpuConfig) -> Option<GpuScan> {
    match GpuScan::open(&config, cpu(), log_sink().0) {
        Ok(g) => {
            eprintln!("using {}", g.name());
            Some(g)
        }
        Err(GpuError::Unavailable(reason)) => {
            eprintln!("SKIP: no usable GPU ({reason})");
            None
        }
        Err(other) => panic!("opening the GPU failed other than 'unavailable': {other}"),
    }
}

fn query(max_rotation: i32, seed: u64) -> PreparedQuery {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let probe = random_template(&mut rng);
    let share = share_query_template(&probe, &mut rng).expect("query")[0].clone();
    PreparedQuery::prepare(&share, max_rotation).expect("prepare")
}

fn check_matrix(gpu: &GpuScan, n: usize, max_rotation: i32, seed: u64) {
    let (codes, masks) = Rows(seed | 1).matrix(n);
    let db = ShareMatrix::new(&codes, &masks).expect("matrix");
    let q = query(max_rotation, seed);
    let want = cpu().scan(&db, &q, Interrupt::never()).expect("cpu scan");
    let got = gpu
        .scan_gpu(&db, &q, Interrupt::never())
        .unwrap_or_else(|e| panic!("GPU scan of {n} rows failed: {e}"));
    assert_eq!(got.num_entries, n);
    let first_bad =
        (0..want.code.len()).find(|&i| got.code[i] != want.code[i] || got.mask[i] != want.mask[i]);
    assert_eq!(
        first_bad,
        None,
        "N = {n}, {} rotations: first differing slot",
        q.num_rotations()
    );
    eprintln!("N = {n}, {} rotations: bit-exact", q.num_rotations());
}

#[test]
fn small_bit_exact_with_1_and_31_rotations() {
    let Some(gpu) = gpu(GpuConfig::default()) else {
        return;
    };
    for (max, seed) in [(0, 11), (15, 12)] {
        check_matrix(&gpu, 3_001, max, seed);
    }
}

#[test]
fn large_bit_exact_with_1_and_31_rotations() {
    let Some(gpu) = gpu(GpuConfig::default()) else {
        return;
    };
    for (max, seed) in [(0, 21), (15, 22)] {
        check_matrix(&gpu, 100_000, max, seed);
    }
}

/// A store of `n` random rows of one eye, ids 1..=n.
fn store(n: usize, rows: &mut Rows) -> IrisStore {
    let mut store = IrisStore::new(PartyIndex::ALL[0]);
    for id in 1..=n as i64 {
        store
            .insert(StoredTemplate {
                id,
                subject: format!("subject-{id:07}"),
                eye: Eye::Left,
                share: rows.share(),
            })
            .expect("insert");
    }
    store
}

fn assert_store_scans_equal(store: &IrisStore, gpu: &GpuScan, q: &PreparedQuery, when: &str) {
    let order = store.canonical(Eye::Left);
    let want = store
        .scan(Eye::Left, &order, &cpu(), q, Interrupt::never())
        .expect("cpu scan");
    let got = store
        .scan(Eye::Left, &order, gpu, q, Interrupt::never())
        .expect("gpu scan");
    assert!(
        gpu.fallback_reason().is_none(),
        "{when}: the GPU fell back: {:?}",
        gpu.fallback_reason()
    );
    assert_eq!(got, want, "{when}");
    eprintln!("{when}: {} rows bit-exact", store.len());
}

fn check_store_follows_changes(config: GpuConfig, n: usize) {
    let Some(gpu) = gpu(config) else {
        return;
    };
    let mut rows = Rows(0x5eed);
    let mut rng = ChaCha20Rng::seed_from_u64(99);
    let mut store = store(n, &mut rows);
    let q = query(15, 5);
    assert_store_scans_equal(&store, &gpu, &q, "after the first load");
    let resident = gpu.resident_bytes();
    // Appends beyond the copy's capacity (it grows), then deletes (swap-removes move rows).
    for id in n as i64 + 1..=n as i64 + n as i64 / 3 {
        store
            .insert(StoredTemplate {
                id,
                subject: format!("subject-{id:07}"),
                eye: Eye::Left,
                share: rows.share(),
            })
            .expect("insert");
    }
    assert_store_scans_equal(&store, &gpu, &q, "after appends");
    for _ in 0..n / 4 {
        let id = rng.gen_range(1..=store.len() as i64 + n as i64 / 3);
        store.remove(id);
    }
    assert_store_scans_equal(&store, &gpu, &q, "after deletes");
    assert_store_scans_equal(&store, &gpu, &query(0, 6), "one rotation, unchanged store");
    eprintln!(
        "resident bytes per device: {resident:?} after the first load, {:?} now",
        gpu.resident_bytes()
    );
}

#[test]
fn small_follows_appends_and_deletes_of_the_store() {
    check_store_follows_changes(GpuConfig::default(), 3_001);
}

#[test]
fn small_two_shards_on_one_device_equal_the_cpu() {
    check_store_follows_changes(
        GpuConfig {
            devices: vec![0, 0],
            memory_budget: None,
        },
        2_003,
    );
}

#[test]
fn large_follows_appends_and_deletes_of_the_store() {
    check_store_follows_changes(GpuConfig::default(), 100_000);
}

#[test]
fn small_a_budget_too_small_falls_back_to_the_cpu_with_a_log_line() {
    let (log, lines) = log_sink();
    let config = GpuConfig {
        devices: vec![],
        memory_budget: Some(1 << 20),
    };
    let gpu = match GpuScan::open(&config, cpu(), log) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("SKIP: no usable GPU ({e})");
            return;
        }
    };
    let (codes, masks) = Rows(7).matrix(64);
    let db = ShareMatrix::new(&codes, &masks).expect("matrix");
    let q = query(15, 7);
    assert!(matches!(
        gpu.scan_gpu(&db, &q, Interrupt::never()),
        Err(GpuError::Capacity { .. })
    ));
    let want = cpu().scan(&db, &q, Interrupt::never()).expect("cpu");
    assert_eq!(
        gpu.scan(&db, &q, Interrupt::never()).expect("fallback"),
        want
    );
    assert!(gpu.fallback_reason().is_some());
    assert!(gpu.name().contains("using the CPU"), "{}", gpu.name());
    let lines = lines.lock().expect("log lock");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("falling back"), "{lines:?}");
}

#[test]
fn small_an_interrupted_scan_stops_and_is_not_a_failure() {
    let Some(gpu) = gpu(GpuConfig::default()) else {
        return;
    };
    let (codes, masks) = Rows(9).matrix(1_000);
    let db = ShareMatrix::new(&codes, &masks).expect("matrix");
    let raised = Interrupt::default();
    raised.raise();
    assert!(matches!(
        gpu.scan(&db, &query(15, 9), &raised),
        Err(privmatch_core::iris::dot::DotError::Interrupted)
    ));
    assert!(gpu.fallback_reason().is_none());
}
