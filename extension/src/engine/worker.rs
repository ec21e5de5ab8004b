//! The party engine worker: one background worker per party (registered when privmatch is in
//! `shared_preload_libraries`) that hosts the modality services holding state in memory —
//! today the iris search service ([`super::iris`]: the share matrix and the running searches)
//! — and the scan threads (docs/architecture.md). Backends hand it work over a Unix socket in the
//! data directory ([`super::client`], protocol [`super::ipc`]).
//!
//! The worker chooses the scan backend ([`scan_backend`], GUCs `privmatch.gpu`,
//! `privmatch.gpu_devices`, `privmatch.gpu_memory`): the CPU scan, or the GPU scan of
//! `privmatch-gpu` with the CPU scan as its fallback. CUDA is loaded only here, in the worker
//! after it started (never in the postmaster, whose children would inherit a context they
//! cannot use), on a thread with Postgres's signals blocked.
//!
//! Threads: the worker's main thread is the only one that calls Postgres (SPI to read the
//! template table and the party's keys). It accepts each backend's connection, reads the
//! request, brings the store up to date before a search start, and hands starts and rounds to
//! a request thread of their own, which computes, answers the backend and ends; so concurrent
//! searches use the CPU side by side instead of queueing behind one request. Request threads
//! and the scan threads they start run pure Rust, with Postgres's signals blocked; what they
//! have to log goes to the main thread through a channel. Status and abort requests are
//! answered on the main thread (microseconds).
//!
//! Imports: [`super::ipc`], [`super::iris`], [`super::heap`], [`crate::signals`], core's `iris`
//! (the scan backends, the service's keys) and `privmatch-gpu` (the GPU scan); no module of
//! `crate::iris` or `crate::face`.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use privmatch_core::iris::scan::{CpuScan, Interrupt, ScanBackend};
use privmatch_core::iris::service::{PartyKeys, MAX_ACTIVE_SEARCHES};
use privmatch_gpu::iris::scan::{GpuConfig, GpuScan, LogSink};
use privmatch_gpu::GpuError;

use super::face::FaceService;
use super::heap::{keep_freed_memory, release_free_memory};
use super::ipc::{
    read_frame, write_frame, EngineError, EngineStatus, ErrorKind, Request, Response, SOCKET_NAME,
};
use super::iris::{charge_search, read_keys, IrisSearch};
use crate::signals::without_signals;

/// `privmatch.database`: the database whose templates the engine serves (read when the
/// engine starts; the GUCs are SIGHUP-level because a library loaded by CREATE EXTENSION
/// may not define postmaster-level ones).
pub static ENGINE_DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"privmatch"));
/// `privmatch.engine_threads`: scan threads (0 = one per CPU).
pub static ENGINE_THREADS: GucSetting<i32> = GucSetting::<i32>::new(0);
/// `privmatch.search_timeout`: seconds after which an idle search is dropped.
pub static SEARCH_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(120);
/// `privmatch.gpu`: whether the engine scans on GPUs (read when the engine starts).
pub static GPU: GucSetting<GpuMode> = GucSetting::<GpuMode>::new(GpuMode::Auto);
/// `privmatch.gpu_devices`: the CUDA ordinals to scan on, comma-separated (empty: every
/// device; read when the engine starts).
pub static GPU_DEVICES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `privmatch.gpu_memory`: MB of share limbs each GPU may hold (0: 90 % of its free memory;
/// read when the engine starts).
pub static GPU_MEMORY: GucSetting<i32> = GucSetting::<i32>::new(0);

/// The largest `privmatch.gpu_memory` (1 TiB per device, in MB): far above any device, and
/// small enough that the byte count cannot overflow.
const GPU_MEMORY_MAX_MB: i32 = 1 << 20;

/// The values of `privmatch.gpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PostgresGucEnum)]
pub enum GpuMode {
    /// Scan on the CPU; CUDA is never loaded.
    #[name = c"off"]
    Off,
    /// Scan on the GPUs where they can be opened, else on the CPU (one LOG line says why).
    #[name = c"auto"]
    Auto,
    /// The GPUs are required: if they cannot be opened the engine still starts, with a
    /// WARNING, scans on the CPU and says so in `engine_status()`.
    #[name = c"on"]
    On,
}

/// The GPU settings as the engine read them when it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSettings {
    /// `privmatch.gpu`.
    pub mode: GpuMode,
    /// `privmatch.gpu_devices`, as written.
    pub devices: String,
    /// `privmatch.gpu_memory`, MB per device (0: automatic).
    pub memory_mb: i32,
}

impl GpuSettings {
    /// The current values of the GUCs.
    fn current() -> Self {
        GpuSettings {
            mode: GPU.get(),
            devices: GPU_DEVICES
                .get()
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_default(),
            memory_mb: GPU_MEMORY.get(),
        }
    }

    /// The device configuration these settings ask for, or why they are invalid (a message
    /// naming the GUC).
    pub fn config(&self) -> Result<GpuConfig, String> {
        let memory_budget = match usize::try_from(self.memory_mb) {
            Ok(0) => None,
            Ok(mb) => Some(
                mb.checked_mul(1 << 20)
                    .ok_or_else(|| format!("privmatch.gpu_memory: {mb} MB is too large"))?,
            ),
            Err(_) => {
                return Err(format!(
                    "privmatch.gpu_memory: {} MB is negative",
                    self.memory_mb
                ))
            }
        };
        Ok(GpuConfig {
            devices: parse_gpu_devices(&self.devices)?,
            memory_budget,
        })
    }
}

/// Parses `privmatch.gpu_devices`: empty (or blanks) for every device, else CUDA ordinals
/// separated by commas, each listed once (blanks around them are allowed). Anything else is
/// an error naming the GUC: a typo must not silently pick other devices.
pub fn parse_gpu_devices(text: &str) -> Result<Vec<usize>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let invalid = || {
        format!(
            "privmatch.gpu_devices = '{}' is not a list of CUDA device numbers separated by commas (e.g. '0,1'; empty: every device)",
            text.escape_default()
        )
    };
    let mut devices = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        // `usize::from_str` accepts a leading '+': digits only, so '+1' is refused too.
        if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        let ordinal: usize = item.parse().map_err(|_| invalid())?;
        if devices.contains(&ordinal) {
            return Err(format!(
                "privmatch.gpu_devices: device {ordinal} is listed twice"
            ));
        }
        devices.push(ordinal);
    }
    Ok(devices)
}

/// How loud a line about the choice of backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loudness {
    /// LOG: expected on a machine without a GPU.
    Log,
    /// WARNING: the GPU was asked for, or the settings are wrong.
    Warning,
}

/// The scan backend the engine runs searches with, and what `engine_status()` says about it.
pub struct ScanChoice {
    /// What the searches scan with.
    pub backend: Arc<dyn ScanBackend>,
    /// The GPU backend when it is the one in use (it may still fall back to the CPU later).
    gpu: Option<Arc<GpuScan>>,
    /// The CPU backend (alone, or the GPU's fallback).
    cpu: CpuScan,
    /// Why the CPU scans although `privmatch.gpu` allowed (auto) or required (on) a GPU.
    not_gpu: Option<String>,
    /// A line for the server log about the choice (the caller logs it on the main thread).
    pub notice: Option<(Loudness, String)>,
}

impl ScanChoice {
    /// The backend as `engine_status()` shows it (column `kernel`): its name, and why the
    /// CPU scans when a GPU was allowed, required or failed.
    pub fn describe(&self) -> String {
        if let Some(gpu) = &self.gpu {
            return match gpu.fallback_reason() {
                None => gpu.name(),
                Some(reason) => format!(
                    "{} (the GPU failed; scanning on the CPU: {reason})",
                    self.cpu.name()
                ),
            };
        }
        match &self.not_gpu {
            None => self.cpu.name(),
            Some(reason) => format!("{} ({reason})", self.cpu.name()),
        }
    }
}

/// The one function choosing the scan backend (docs/architecture.md §5): the CPU scan `cpu`
/// for `privmatch.gpu = off`, else the GPUs `open` opens with the configured devices and
/// memory, with `cpu` as their fallback; when they cannot be opened, `cpu` and the reason.
/// `open` is only called for `auto` and `on` with valid settings (it loads CUDA).
pub fn scan_backend(
    settings: &GpuSettings,
    cpu: CpuScan,
    open: impl FnOnce(&GpuConfig, CpuScan) -> Result<GpuScan, GpuError>,
) -> ScanChoice {
    let on_cpu = |not_gpu: Option<String>, notice: Option<(Loudness, String)>| ScanChoice {
        backend: Arc::new(cpu),
        gpu: None,
        cpu,
        not_gpu,
        notice,
    };
    if settings.mode == GpuMode::Off {
        return on_cpu(None, None);
    }
    let opened = settings
        .config()
        .map_err(|invalid| (Loudness::Warning, invalid))
        .and_then(|config| {
            open(&config, cpu).map_err(|e| {
                let reason = match e {
                    GpuError::Unavailable(reason) => reason,
                    other => other.to_string(),
                };
                let loudness = match settings.mode {
                    GpuMode::On => Loudness::Warning,
                    GpuMode::Auto | GpuMode::Off => Loudness::Log,
                };
                (loudness, reason)
            })
        });
    match opened {
        Ok(gpu) => {
            let gpu = Arc::new(gpu);
            ScanChoice {
                backend: Arc::clone(&gpu) as Arc<dyn ScanBackend>,
                gpu: Some(gpu),
                cpu,
                not_gpu: None,
                notice: None,
            }
        }
        Err((loudness, reason)) => {
            let (status, line) = match settings.mode {
                GpuMode::On => (
                    format!("privmatch.gpu = on, but no GPU is in use: {reason}"),
                    format!("privmatch engine: privmatch.gpu = on, but the GPU scan cannot be used ({reason}); scanning on the CPU"),
                ),
                GpuMode::Auto | GpuMode::Off => (
                    format!("GPU unavailable: {reason}"),
                    format!("privmatch engine: GPU scan unavailable ({reason}); scanning on the CPU"),
                ),
            };
            on_cpu(Some(status), Some((loudness, line)))
        }
    }
}

/// Opens the GPUs of `config` on a thread started with every signal blocked, and waits for
/// it: CUDA starts threads of its own inside the process, and they inherit the mask of the
/// thread that loads it, so Postgres's signal handlers stay on the main thread. The backend
/// logs through `log` (to the main thread's channel: only that thread calls Postgres).
fn open_gpu(config: &GpuConfig, cpu: CpuScan, log: Sender<String>) -> Result<GpuScan, GpuError> {
    let config = config.clone();
    let sink: LogSink = Arc::new(move |line: &str| {
        let _ = log.send(line.to_owned());
    });
    let opener = without_signals(|| {
        std::thread::Builder::new()
            .name("privmatch-gpu-open".into())
            .spawn(move || GpuScan::open(&config, cpu, sink))
    })
    .map_err(|e| GpuError::Unavailable(format!("cannot start a thread to open the GPU: {e}")))?;
    opener.join().unwrap_or_else(|_| {
        Err(GpuError::Unavailable(
            "opening the GPU panicked (a bug; see the server log)".into(),
        ))
    })
}

/// Defines the GUCs and, at server start, registers the engine worker.
pub fn register() {
    GucRegistry::define_string_guc(
        c"privmatch.database",
        c"Database whose iris templates the privmatch engine serves.",
        c"The engine worker connects to this database at server start.",
        &ENGINE_DATABASE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"privmatch.engine_threads",
        c"Threads the privmatch engine scans with (0: one per CPU).",
        c"",
        &ENGINE_THREADS,
        0,
        1024,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"privmatch.gpu",
        c"Whether the privmatch engine scans on GPUs (off, auto, on).",
        c"auto: the GPUs if they can be opened, else the CPU; on: GPUs required (the engine warns and scans on the CPU when they cannot be opened). Read when the engine starts.",
        &GPU,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"privmatch.gpu_devices",
        c"CUDA devices the privmatch engine scans on, e.g. '0,1' (empty: every device).",
        c"Read when the engine starts.",
        &GPU_DEVICES,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"privmatch.gpu_memory",
        c"Memory each GPU may hold shares in (0: 90% of its free memory).",
        c"Read when the engine starts.",
        &GPU_MEMORY,
        0,
        GPU_MEMORY_MAX_MB,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"privmatch.search_timeout",
        c"Seconds after which an idle iris search is dropped by the engine.",
        c"",
        &SEARCH_TIMEOUT,
        1,
        86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    // SAFETY: reading a flag the postmaster sets while loading preload libraries.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        BackgroundWorkerBuilder::new("privmatch engine")
            .set_type("privmatch engine")
            .set_library("privmatch")
            .set_function("privmatch_engine_main")
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            .set_restart_time(Some(Duration::from_secs(2)))
            .load();
    }
}

fn caught_message(err: &CaughtError) -> String {
    match err {
        CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r.message().to_owned(),
        CaughtError::RustPanic { ereport, .. } => ereport.message().to_owned(),
    }
}

/// Runs `body` in its own transaction; a Postgres error inside is caught, the transaction
/// rolled back and the error returned (the worker keeps serving).
fn in_transaction<R>(body: impl FnOnce() -> Result<R, EngineError>) -> Result<R, EngineError> {
    // SAFETY: the standard background-worker transaction sequence, on the worker's main
    // thread, outside any transaction (every call of this function ends the one it starts).
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = PgTryBuilder::new(AssertUnwindSafe(body))
        .catch_others(|e| Err(EngineError::internal(caught_message(&e))))
        .execute();
    // SAFETY: closes the transaction started above, on the same thread: commit pops the
    // snapshot pushed above; abort also unwinds the snapshot stack.
    unsafe {
        if result.is_ok() {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        } else {
            pg_sys::AbortCurrentTransaction();
        }
    }
    result
}

/// Request threads running at once at most: each running search has at most one request
/// in flight (the coordinator steps a search's rounds one after the other), so this leaves
/// room for every search the service admits plus stragglers of aborted ones.
const MAX_REQUEST_THREADS: usize = 2 * MAX_ACTIVE_SEARCHES;

/// The worker's state.
struct Engine {
    iris: IrisSearch,
    face: FaceService,
    /// The scan backend of the searches and what status says about it.
    scan: ScanChoice,
    state: String,
    /// Request threads running now.
    in_flight: Arc<AtomicUsize>,
    /// Lines the request threads want logged (only the main thread may call Postgres).
    log_tx: Sender<String>,
    log_rx: Receiver<String>,
}

impl Engine {
    fn new() -> Self {
        let threads = match ENGINE_THREADS.get() {
            n if n > 0 => n as usize,
            _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let timeout = Duration::from_secs(SEARCH_TIMEOUT.get().max(1) as u64);
        let (log_tx, log_rx) = channel();
        let gpu_log = log_tx.clone();
        let scan = scan_backend(
            &GpuSettings::current(),
            CpuScan::detect(threads),
            |config, cpu| open_gpu(config, cpu, gpu_log),
        );
        match &scan.notice {
            Some((Loudness::Log, line)) => pgrx::log!("{line}"),
            Some((Loudness::Warning, line)) => pgrx::warning!("{line}"),
            None => {}
        }
        Engine {
            iris: IrisSearch::new(Arc::clone(&scan.backend), timeout),
            face: FaceService::new(threads, timeout),
            scan,
            state: "starting".into(),
            in_flight: Arc::new(AtomicUsize::new(0)),
            log_tx,
            log_rx,
        }
    }

    /// Brings the services up to date with the tables, in a transaction of its own, and
    /// returns the keys; records whether the engine is ready.
    fn refresh(&mut self) -> Result<PartyKeys, EngineError> {
        let result = in_transaction(|| self.iris.refresh());
        self.state = match &result {
            Ok(_) => "ready".into(),
            Err(e) => format!("not ready: {}", e.message),
        };
        result
    }

    /// [`Engine::refresh`] before an iris search start, charging the search to this party's
    /// budget in the same transaction of the engine's own, committed before the start is
    /// answered (`super::iris::charge_search`): whatever the caller's transaction does
    /// afterwards, the charge stays. A spent budget does not make the engine "not ready".
    fn refresh_for_start(&mut self) -> Result<PartyKeys, EngineError> {
        let iris = &self.iris;
        let result = in_transaction(|| {
            let keys = iris.refresh()?;
            charge_search()?;
            Ok(keys)
        });
        match &result {
            Ok(_) => self.state = "ready".into(),
            Err(e) if e.kind != ErrorKind::Busy => self.state = format!("not ready: {}", e.message),
            Err(_) => {}
        }
        result
    }

    /// Whether nothing runs: no search between rounds and no request thread.
    fn idle(&self) -> bool {
        self.iris.service.active() == 0
            && self.face.active() == 0
            && self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Logs what the request threads sent.
    fn drain_log(&self) {
        while let Ok(line) = self.log_rx.try_recv() {
            pgrx::log!("{line}");
        }
    }

    fn status(&self) -> EngineStatus {
        EngineStatus {
            state: self.state.clone(),
            templates: self.iris.templates() as u64,
            share_bytes: self.iris.share_bytes() as u64,
            resident_bytes: resident_bytes(),
            resident_shared_bytes: resident_shared_bytes(),
            sessions: self.iris.service.active() as u32,
            kernel: self.scan.describe(),
            threads: self.iris.service.backend().parallelism() as u32,
        }
    }
}

/// Resident set size of this process (from /proc; 0 where unavailable).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Of the resident set, the pages of shared memory (`RssShmem` in /proc; 0 where
/// unavailable): PostgreSQL's shared buffers the engine touched.
fn resident_shared_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("RssShmem:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Reads one request from `stream` and answers it: status and abort here, a start (after
/// bringing the store up to date) and a round on a request thread. I/O failures (a backend
/// that gave up) are logged without content and otherwise ignored.
fn serve(engine: &mut Engine, stream: UnixStream) {
    let mut stream = stream;
    let setup = stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(Some(Duration::from_secs(30))))
        .and_then(|_| stream.set_write_timeout(Some(Duration::from_secs(120))));
    let request = setup
        .and_then(|_| read_frame(&mut stream))
        .and_then(Request::decode);
    let request = match request {
        Ok(request) => request,
        Err(e) => {
            pgrx::log!("privmatch engine: unreadable request: {e}");
            return;
        }
    };
    let now = Instant::now();
    match request {
        Request::Start {
            session,
            probe,
            policy,
        } => {
            let keys = match engine.refresh_for_start() {
                Ok(keys) => keys,
                Err(e) => return answer(&mut stream, &Response::Error(e), &engine.log_tx),
            };
            let iris = engine.iris.clone();
            spawn_request(engine, stream, move |stream| {
                let interrupt = Interrupt::default();
                let response = watched(stream, &interrupt, || {
                    iris.start(&keys, session, &probe, policy, now, &interrupt)
                });
                (!interrupt.is_raised()).then_some(response)
            });
        }
        Request::Round {
            session,
            round,
            message,
        } => {
            let iris = engine.iris.clone();
            spawn_request(engine, stream, move |_| {
                Some(
                    iris.round(session, round, &message, now)
                        .unwrap_or_else(Response::Error),
                )
            });
        }
        Request::Face { op, head, payload } => {
            // An open brings the held face templates up to date first (SPI, this thread);
            // a stocked dealing needs the party's keys to open; the other steps touch only
            // the engine's memory.
            let keys = if op == super::face::op::OPEN {
                let face = engine.face.clone();
                in_transaction(|| {
                    let keys = read_keys()?;
                    face.refresh_for_open(keys.me, &head, &payload)?;
                    Ok(Some(keys))
                })
            } else if op == super::face::op::STOCK {
                in_transaction(|| read_keys().map(Some))
            } else {
                Ok(None)
            };
            let keys = match keys {
                Ok(keys) => keys,
                Err(e) => return answer(&mut stream, &Response::Error(e), &engine.log_tx),
            };
            let face = engine.face.clone();
            spawn_request(engine, stream, move |_| {
                Some(
                    face.handle(keys.as_ref(), op, &head, &payload, now)
                        .unwrap_or_else(Response::Error),
                )
            });
        }
        Request::Abort { session } => {
            let aborted = engine.iris.service.abort(&session) | engine.face.abort(&session);
            answer(&mut stream, &Response::Aborted(aborted), &engine.log_tx);
        }
        Request::Status => answer(
            &mut stream,
            &Response::Status(engine.status()),
            &engine.log_tx,
        ),
    }
}

/// Writes `response` to the backend at the other end of `stream`.
fn answer(stream: &mut UnixStream, response: &Response, log: &Sender<String>) {
    let (head, payload) = response.encode_parts();
    if let Err(e) = write_frame(stream, &head, payload) {
        let _ = log.send(format!(
            "privmatch engine: could not answer a backend (it gave up?): {e}"
        ));
    }
}

/// Counts a request thread while it runs (also when it panics).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs `job` on a request thread of its own, which answers the backend on `stream` with the
/// job's response (none: the backend hung up, nobody reads an answer). A panic in the job (a
/// bug) is answered as an internal error and logged; the engine keeps serving. With
/// [`MAX_REQUEST_THREADS`] running, the request is refused as busy.
fn spawn_request(
    engine: &Engine,
    mut stream: UnixStream,
    job: impl FnOnce(&UnixStream) -> Option<Response> + Send + 'static,
) {
    let log = engine.log_tx.clone();
    if engine.in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_REQUEST_THREADS {
        engine.in_flight.fetch_sub(1, Ordering::AcqRel);
        let busy = EngineError::new(
            ErrorKind::Busy,
            format!("the engine is running {MAX_REQUEST_THREADS} requests, the most it runs at once; retry"),
        );
        return answer(&mut stream, &Response::Error(busy), &log);
    }
    let counted = InFlight(Arc::clone(&engine.in_flight));
    let spawned = without_signals(|| {
        std::thread::Builder::new()
            .name("privmatch-request".into())
            .spawn(move || {
                let _counted = counted;
                let response = match catch_unwind(AssertUnwindSafe(|| job(&stream))) {
                    Ok(Some(response)) => response,
                    Ok(None) => {
                        let _ = log.send(
                            "privmatch engine: a backend hung up during its request; its scan was stopped".into(),
                        );
                        return;
                    }
                    Err(_) => {
                        let _ = log.send("privmatch engine: a request failed with a panic (a bug); the engine keeps serving".into());
                        Response::Error(EngineError::internal(
                            "the engine failed on this request (a bug; see the server log)",
                        ))
                    }
                };
                answer(&mut stream, &response, &log);
            })
    });
    if let Err(e) = spawned {
        // The job, the stream and the count went with the closure: the backend reads an
        // end of stream and reports the engine as unavailable.
        pgrx::log!("privmatch engine: cannot start a request thread: {e}");
    }
}

/// Computes `work` while a watcher thread raises `interrupt` if the backend at the other end
/// of `stream` hangs up (its query was cancelled or timed out, so it closed the socket). The
/// watcher only polls and is woken through a socket pair the moment the answer is ready, so a
/// normal request never waits for it.
fn watched(
    stream: &UnixStream,
    interrupt: &Interrupt,
    work: impl FnOnce() -> Result<Response, EngineError>,
) -> Response {
    let Ok((wake, woken)) = UnixStream::pair() else {
        return work().unwrap_or_else(Response::Error);
    };
    std::thread::scope(|scope| {
        // Started from a request thread, whose signals are blocked already: the watcher
        // inherits that mask.
        let _watcher = std::thread::Builder::new()
            .name("privmatch-hangup".into())
            .spawn_scoped(scope, || watch_hangup(stream, &woken, interrupt));
        let response = work().unwrap_or_else(Response::Error);
        // Closing our end wakes the watcher (its poll sees the hang-up) and it returns.
        drop(wake);
        response
    })
}

/// Raises `interrupt` when `stream`'s peer hangs up; returns without raising it when `woken`'s
/// peer does (the request was answered).
fn watch_hangup(stream: &UnixStream, woken: &UnixStream, interrupt: &Interrupt) {
    let hangup = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR;
    let mut fds = [
        libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        },
        libc::pollfd {
            fd: woken.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: polls two descriptors that `stream` and `woken` keep open for the whole
        // scope of the watcher.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & hangup != 0 {
            interrupt.raise();
            return;
        }
        if fds[0].revents != 0 {
            // Unexpected bytes after the request: stop watching the backend (a negative
            // descriptor is ignored by poll) rather than spin on it.
            fds[0].fd = -1;
        }
    }
}

fn bind_socket() -> Option<UnixListener> {
    let _ = std::fs::remove_file(SOCKET_NAME);
    let listener = match UnixListener::bind(SOCKET_NAME) {
        Ok(l) => l,
        Err(e) => {
            pgrx::warning!("privmatch engine: cannot listen on {SOCKET_NAME}: {e}");
            return None;
        }
    };
    let private = std::fs::set_permissions(SOCKET_NAME, std::fs::Permissions::from_mode(0o600));
    if let Err(e) = private.and_then(|_| listener.set_nonblocking(true)) {
        pgrx::warning!("privmatch engine: cannot set up {SOCKET_NAME}: {e}");
        return None;
    }
    Some(listener)
}

/// What ended a wait for work.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// A connection is waiting.
    Readable,
    /// The latch was set (a signal).
    Latch,
    /// A whole second passed without either.
    Timeout,
}

/// Waits up to a second for a connection, a signal or postmaster death (which exits).
fn wait_for_work(fd: i32) -> Wake {
    let events = pg_sys::WL_LATCH_SET
        | pg_sys::WL_SOCKET_READABLE
        | pg_sys::WL_TIMEOUT
        | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: waiting on this process's own latch and a socket it owns, on the main thread.
    let rc = unsafe {
        let rc = pg_sys::WaitLatchOrSocket(
            pg_sys::MyLatch,
            events as i32,
            fd,
            1000,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
        rc
    };
    if rc & pg_sys::WL_SOCKET_READABLE as i32 != 0 {
        Wake::Readable
    } else if rc & pg_sys::WL_TIMEOUT as i32 != 0 {
        Wake::Timeout
    } else {
        Wake::Latch
    }
}

/// The engine worker's entry point.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn privmatch_engine_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // Keeps the per-round buffers of a search (up to tens of MB each) in the heap for reuse
    // instead of mapping fresh zeroed pages every round: measured at N = 100,000 with 31
    // rotations, page faults took about a fifth of the parties' CPU (the share matrix is
    // sized once per bulk load, so it is not copied by growth in practice). The heap is
    // handed back after a second without requests and no running search.
    // SAFETY: no thread of this process has been started yet (scan threads are scoped to
    // each scan).
    unsafe { keep_freed_memory() };
    let database = ENGINE_DATABASE
        .get()
        .and_then(|d| d.into_string().ok())
        .unwrap_or_else(|| "privmatch".into());
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    let Some(listener) = bind_socket() else {
        // Exit code 1: the postmaster starts the engine again (restart time 2 s), so a socket
        // that could not be bound now (a stale file, a transient error) is tried again.
        exit_for_restart();
    };
    let mut engine = Engine::new();
    pgrx::log!(
        "privmatch engine: serving database {database}; scan: {}, {} in parallel",
        engine.iris.service.backend().name(),
        engine.iris.service.backend().parallelism()
    );
    if let Err(e) = engine.refresh() {
        pgrx::log!("privmatch engine: not loaded yet: {}", e.message);
    }
    let mut idle_trimmed = true;
    while !BackgroundWorker::sigterm_received() {
        let wake = wait_for_work(listener.as_raw_fd());
        engine.iris.service.expire(Instant::now());
        engine.face.expire(Instant::now());
        engine.drain_log();
        if wake != Wake::Readable {
            // Only after a whole second without a request: a latch wake-up (a signal) between
            // two searches would otherwise hand back the heap the next search's rounds need.
            if wake == Wake::Timeout && !idle_trimmed && engine.idle() {
                release_free_memory();
                idle_trimmed = true;
            }
            continue;
        }
        while let Ok((stream, _)) = listener.accept() {
            serve(&mut engine, stream);
            idle_trimmed = false;
        }
    }
    let _ = std::fs::remove_file(SOCKET_NAME);
    // Asked to stop: at server shutdown nothing is restarted whatever the exit code; when
    // only this worker was terminated (DROP DATABASE … WITH (FORCE), pg_terminate_backend)
    // exit code 1 makes the postmaster start it again, where 0 would end it for good.
    exit_for_restart();
}

/// Exits so that the postmaster restarts the engine after its restart time.
fn exit_for_restart() -> ! {
    // SAFETY: proc_exit runs the process's exit callbacks and never returns; nothing of ours
    // is borrowed across it.
    unsafe { pg_sys::proc_exit(1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(mode: GpuMode, devices: &str, memory_mb: i32) -> GpuSettings {
        GpuSettings {
            mode,
            devices: devices.into(),
            memory_mb,
        }
    }

    fn unavailable(_: &GpuConfig, _: CpuScan) -> Result<GpuScan, GpuError> {
        Err(GpuError::Unavailable("no device here".into()))
    }

    #[test]
    fn gpu_devices_parse_strictly() {
        assert_eq!(parse_gpu_devices(""), Ok(vec![]));
        assert_eq!(parse_gpu_devices("  "), Ok(vec![]));
        assert_eq!(parse_gpu_devices("0"), Ok(vec![0]));
        assert_eq!(parse_gpu_devices("2, 0 ,1"), Ok(vec![2, 0, 1]));
        for bad in [
            "0,",
            ",0",
            "0,,1",
            "a",
            "-1",
            "+1",
            "0;1",
            "0 1",
            "1.0",
            "gpu0",
            "99999999999999999999999",
        ] {
            let err = parse_gpu_devices(bad).expect_err(bad);
            assert!(err.starts_with("privmatch.gpu_devices"), "{bad}: {err}");
        }
        let twice = parse_gpu_devices("1,0,1").expect_err("repeat");
        assert!(twice.contains("device 1 is listed twice"), "{twice}");
    }

    #[test]
    fn gpu_memory_is_megabytes_per_device_and_zero_is_automatic() {
        let config = settings(GpuMode::Auto, "", 0).config().expect("valid");
        assert_eq!(config.memory_budget, None);
        assert!(config.devices.is_empty());
        let config = settings(GpuMode::Auto, "1", 2048).config().expect("valid");
        assert_eq!(config.memory_budget, Some(2048 << 20));
        assert_eq!(config.devices, vec![1]);
        let err = settings(GpuMode::Auto, "", -1)
            .config()
            .expect_err("negative");
        assert!(err.starts_with("privmatch.gpu_memory"), "{err}");
    }

    #[test]
    fn off_never_loads_cuda_and_scans_on_the_cpu() {
        let cpu = CpuScan::detect(2);
        let choice = scan_backend(&settings(GpuMode::Off, "junk", 0), cpu, |_, _| {
            panic!("privmatch.gpu = off must not open a GPU")
        });
        assert_eq!(choice.describe(), cpu.name());
        assert_eq!(choice.backend.name(), cpu.name());
        assert_eq!(choice.backend.parallelism(), 2);
        assert!(choice.notice.is_none());
    }

    /// Asserts that `choice` scans on `cpu`, that its status reads `status` after the CPU
    /// kernel's name, and that it logs one line of `loudness` containing `line`.
    fn assert_on_cpu(
        choice: &ScanChoice,
        cpu: CpuScan,
        status: &str,
        loudness: Loudness,
        line: &str,
    ) {
        assert_eq!(choice.backend.name(), cpu.name());
        assert_eq!(choice.describe(), format!("{} ({status})", cpu.name()));
        let (logged_as, logged) = choice.notice.as_ref().expect("a notice");
        assert_eq!(*logged_as, loudness, "{logged}");
        assert!(logged.contains(line), "{logged}");
    }

    /// Without a GPU both scan on the CPU and say why in engine_status(); `auto` logs one
    /// LOG line (expected on such a machine), `on` a WARNING (the GPU was required).
    #[test]
    fn without_a_gpu_auto_and_on_scan_on_the_cpu_and_say_why() {
        let cpu = CpuScan::detect(2);
        for (mode, status, loudness, line) in [
            (
                GpuMode::Auto,
                "GPU unavailable: no device here",
                Loudness::Log,
                "privmatch engine: GPU scan unavailable (no device here); scanning on the CPU",
            ),
            (
                GpuMode::On,
                "privmatch.gpu = on, but no GPU is in use: no device here",
                Loudness::Warning,
                "privmatch engine: privmatch.gpu = on, but the GPU scan cannot be used (no device here); scanning on the CPU",
            ),
        ] {
            let choice = scan_backend(&settings(mode, "", 0), cpu, unavailable);
            assert_on_cpu(&choice, cpu, status, loudness, line);
        }
    }

    #[test]
    fn invalid_settings_never_open_a_gpu_and_warn_naming_the_guc() {
        let cpu = CpuScan::detect(1);
        let invalid = parse_gpu_devices("0,x").expect_err("invalid");
        for (mode, status) in [
            (GpuMode::Auto, format!("GPU unavailable: {invalid}")),
            (
                GpuMode::On,
                format!("privmatch.gpu = on, but no GPU is in use: {invalid}"),
            ),
        ] {
            let choice = scan_backend(&settings(mode, "0,x", 0), cpu, |_, _| {
                panic!("invalid settings must not open a GPU")
            });
            assert_on_cpu(
                &choice,
                cpu,
                &status,
                Loudness::Warning,
                "privmatch.gpu_devices",
            );
        }
    }

    #[test]
    fn other_gpu_errors_are_reported_with_their_step() {
        let cpu = CpuScan::detect(1);
        let choice = scan_backend(&settings(GpuMode::Auto, "", 0), cpu, |_, _| {
            Err(GpuError::Nvrtc("bad arch".into()))
        });
        assert!(
            choice
                .describe()
                .contains("NVRTC could not compile the scan kernels: bad arch"),
            "{}",
            choice.describe()
        );
    }

    /// The real thing: on a machine without a GPU `auto` answers on the CPU with a reason;
    /// with one, the GPU backend's description.
    #[test]
    fn auto_with_the_real_probe_never_panics() {
        let cpu = CpuScan::detect(1);
        let (tx, _rx) = channel();
        let choice = scan_backend(&settings(GpuMode::Auto, "", 0), cpu, |config, cpu| {
            open_gpu(config, cpu, tx)
        });
        let described = choice.describe();
        eprintln!("engine scan backend (privmatch.gpu = auto): {described}");
        assert!(
            described.starts_with("gpu: ")
                || described.starts_with(&format!("{} (GPU unavailable: ", cpu.name())),
            "{described}"
        );
    }
}
