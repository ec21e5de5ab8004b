//! The party engine worker: one background worker per party (registered when privmatch is in
//! `shared_preload_libraries`) that hosts the modality services holding state in memory — the
//! iris search service ([`super::iris`]) and the face session service ([`super::face`])
//! (docs/architecture.md). Backends hand it work over a Unix socket in the data directory
//! ([`super::socket`]; the backend side is [`super::client`], the frames [`super::ipc`]).
//!
//! This file is the engine's dispatch: registration and GUCs, the main loop, and [`serve`],
//! which hands each request to its modality's service — the one file of the engine that names
//! every modality. The jobs around it have files of their own: the scan backend's choice
//! ([`super::iris::backend`]), the request threads and the hang-up watcher
//! ([`super::requests`]), the socket ([`super::socket`]), the party's keys ([`super::keys`]),
//! memory figures and heap tuning ([`super::heap`]).
//!
//! Threads: the worker's main thread is the only one that calls Postgres (SPI to read the
//! template tables and the party's keys). It accepts each backend's connection, reads the
//! request, brings the modality's state up to date where the step needs it, and hands starts
//! and rounds to a request thread; status and abort requests are answered on the main thread
//! (microseconds).

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use privmatch_core::crypto::seal::PartyKeys;
use privmatch_core::face::service::FaceService;
use privmatch_core::iris::scan::{CpuScan, Interrupt};
use privmatch_core::iris::service::MAX_ACTIVE_SEARCHES;

use super::face::messages::{aborted_reply, decode_abort, malformed_request, op as face_op};
use super::heap::{keep_freed_memory, release_free_memory, resident_bytes, resident_shared_bytes};
use super::ipc::{
    read_frame, Call, EngineError, EngineStatus, ErrorKind, Modality, Request, Response,
    SOCKET_NAME,
};
use super::iris::backend::{
    open_gpu, register_gpu_gucs, scan_backend, GpuSettings, Loudness, ScanChoice,
};
use super::iris::messages::{IrisCall, IrisReply};
use super::iris::{charge_searches, IrisSearch};
use super::keys::read_keys;
use super::requests::{answer, watched, RequestThreads};
use super::socket::{bind_socket, wait_for_work, Wake};

/// `privmatch.database`: the database whose templates the engine serves (read when the
/// engine starts; the GUCs are SIGHUP-level because a library loaded by CREATE EXTENSION
/// may not define postmaster-level ones).
pub static ENGINE_DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"privmatch"));
/// `privmatch.engine_threads`: scan threads (0 = one per CPU).
pub static ENGINE_THREADS: GucSetting<i32> = GucSetting::<i32>::new(0);
/// `privmatch.search_work_mem`: MiB of working memory the running iris searches hold
/// together (a start waits for it, then 53400; one search always runs).
pub static SEARCH_WORK_MEM: GucSetting<i32> =
    GucSetting::<i32>::new(privmatch_core::iris::service::DEFAULT_WORK_MEM_MIB as i32);
/// `privmatch.search_timeout`: seconds after which an idle search is dropped.
pub static SEARCH_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(120);
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
    register_gpu_gucs();
    GucRegistry::define_int_guc(
        c"privmatch.search_work_mem",
        c"Working memory the privmatch engine's running iris searches hold together.",
        c"About 128 bytes per comparison (template x probe x rotation). A search start waits up to 30 s for searches to release theirs, then fails with 53400; a search alone always runs. Read when the engine starts.",
        &SEARCH_WORK_MEM,
        64,
        i32::MAX,
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
    /// The request threads.
    requests: RequestThreads,
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
            iris: IrisSearch::new(
                Arc::clone(&scan.backend),
                timeout,
                usize::try_from(SEARCH_WORK_MEM.get()).unwrap_or(64),
            ),
            face: FaceService::new(threads, timeout, &crate::identity::CHANNELS),
            scan,
            state: "starting".into(),
            requests: RequestThreads::new(MAX_REQUEST_THREADS, log_tx.clone()),
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
        self.refresh_for_batch(1)
    }

    /// [`Engine::refresh_for_start`] for a batch of `probes` searches, each charged.
    fn refresh_for_batch(&mut self, probes: usize) -> Result<PartyKeys, EngineError> {
        let iris = &self.iris;
        let result = in_transaction(|| {
            let keys = iris.refresh()?;
            charge_searches(probes)?;
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
        self.iris.service.active() == 0 && self.face.active() == 0 && self.requests.running() == 0
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
        Request::Status => answer(
            &mut stream,
            &Response::Status(engine.status()),
            &engine.log_tx,
        ),
        // The dispatch: each modality's calls go to its service.
        Request::Call(call) => match call.modality {
            Modality::Iris => match IrisCall::from_call(call) {
                Ok(call) => serve_iris(engine, stream, call, now),
                Err(e) => pgrx::log!("privmatch engine: unreadable iris request: {e}"),
            },
            Modality::Face => serve_face(engine, stream, call, now),
        },
    }
}

/// Serves an iris call: a start (after bringing the store up to date and charging the
/// search) and a round on a request thread, an abort here.
fn serve_iris(engine: &mut Engine, mut stream: UnixStream, call: IrisCall<'static>, now: Instant) {
    match call {
        IrisCall::Start {
            session,
            probe,
            policy,
        } => {
            let keys = match engine.refresh_for_start() {
                Ok(keys) => keys,
                Err(e) => return answer(&mut stream, &Response::Error(e), &engine.log_tx),
            };
            let iris = engine.iris.clone();
            engine.requests.spawn(stream, move |stream| {
                let interrupt = Interrupt::default();
                let response = watched(stream, &|| interrupt.raise(), || {
                    iris.start(&keys, session, &probe, policy, now, &interrupt)
                });
                (!interrupt.is_raised()).then_some(response)
            });
        }
        IrisCall::Round {
            session,
            round,
            message,
        } => {
            let iris = engine.iris.clone();
            engine.requests.spawn(stream, move |_| {
                Some(
                    iris.round(session, round, &message, now)
                        .unwrap_or_else(Response::Error),
                )
            });
        }
        IrisCall::BatchStart {
            batch,
            params,
            eye,
            probes,
            enrolments,
            policy,
        } => {
            let keys = match engine.refresh_for_batch(probes.len()) {
                Ok(keys) => keys,
                Err(e) => return answer(&mut stream, &Response::Error(e), &engine.log_tx),
            };
            let iris = engine.iris.clone();
            engine.requests.spawn(stream, move |stream| {
                let interrupt = Interrupt::default();
                let response = watched(stream, &|| interrupt.raise(), || {
                    iris.start_batch(
                        &keys,
                        batch,
                        params,
                        eye,
                        &probes,
                        &enrolments,
                        policy,
                        now,
                        &interrupt,
                    )
                });
                (!interrupt.is_raised()).then_some(response)
            });
        }
        IrisCall::BatchRound {
            batch,
            round,
            message,
        } => {
            let iris = engine.iris.clone();
            engine.requests.spawn(stream, move |_| {
                Some(
                    iris.round_batch(batch, round, &message, now)
                        .unwrap_or_else(Response::Error),
                )
            });
        }
        IrisCall::Abort { session } => {
            let aborted = engine.iris.service.abort(&session);
            answer(
                &mut stream,
                &IrisReply::Aborted(aborted).into_response(),
                &engine.log_tx,
            );
        }
    }
}

/// Serves a face step: an open brings the held face templates up to date first (SPI, this
/// thread); a stocked dealing needs the party's keys to open; an abort is answered here; the
/// other steps touch only the engine's memory and run on a request thread.
fn serve_face(engine: &mut Engine, mut stream: UnixStream, call: Call<'static>, now: Instant) {
    let Call {
        op, head, payload, ..
    } = call;
    if op == face_op::ABORT {
        let response = match decode_abort(&head) {
            Ok(session) => aborted_reply(engine.face.abort(&session)),
            Err(e) => Response::Error(malformed_request(e)),
        };
        return answer(&mut stream, &response, &engine.log_tx);
    }
    let keys = if op == face_op::OPEN {
        let face = engine.face.clone();
        in_transaction(|| {
            let keys = read_keys()?;
            super::face::refresh_for_open(&face, keys.me, &head, &payload)?;
            Ok(Some(keys))
        })
    } else if op == face_op::STOCK {
        in_transaction(|| read_keys().map(Some))
    } else {
        Ok(None)
    };
    let keys = match keys {
        Ok(keys) => keys,
        Err(e) => return answer(&mut stream, &Response::Error(e), &engine.log_tx),
    };
    let face = engine.face.clone();
    engine.requests.spawn(stream, move |_| {
        Some(
            super::face::handle(&face, keys.as_ref(), op, &head, &payload, now)
                .unwrap_or_else(Response::Error),
        )
    });
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
    // SAFETY: no thread of this process has been started yet (the core's pools are built on
    // first use, by the first scan or face round).
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
