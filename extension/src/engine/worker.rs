//! The party engine worker: one background worker per party (registered when privmatch is in
//! `shared_preload_libraries`) that hosts the modality services holding state in memory —
//! today the iris search service ([`super::iris`]: the share matrix and the running searches)
//! — and the scan threads (docs/architecture.md). Backends hand it work over a Unix socket in the
//! data directory ([`super::client`], protocol [`super::ipc`]).
//!
//! The worker chooses the scan backend ([`scan_backend`], GUC `privmatch.scan_backend`): the
//! one place where another implementation of [`ScanBackend`] (a GPU crate) plugs in.
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
//! Imports: [`super::ipc`], [`super::iris`], [`super::heap`], [`crate::signals`] and core's `iris` (the scan
//! backends, the service's keys); no module of `crate::iris` or `crate::face`.

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

use super::heap::{keep_freed_memory, release_free_memory};
use super::ipc::{
    read_frame, write_frame, EngineError, EngineStatus, ErrorKind, Request, Response, SOCKET_NAME,
};
use super::iris::IrisSearch;
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
/// `privmatch.scan_backend`: what computes the local dot products of a search (read when the
/// engine starts).
pub static SCAN_BACKEND: GucSetting<ScanBackendChoice> =
    GucSetting::<ScanBackendChoice>::new(ScanBackendChoice::Auto);

/// The values of `privmatch.scan_backend`. A GPU backend (a crate implementing
/// [`ScanBackend`]) becomes another value here and another arm of [`scan_backend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PostgresGucEnum)]
pub enum ScanBackendChoice {
    /// The best backend this machine has: today the CPU's best SIMD kernel.
    #[name = c"auto"]
    Auto,
    /// The CPU backend with the best SIMD kernel of this CPU.
    #[name = c"cpu"]
    Cpu,
}

/// The scan backend the engine runs searches with, on `threads` scan threads: the choice of
/// `privmatch.scan_backend`.
pub fn scan_backend(choice: ScanBackendChoice, threads: usize) -> Arc<dyn ScanBackend> {
    match choice {
        ScanBackendChoice::Auto | ScanBackendChoice::Cpu => Arc::new(CpuScan::detect(threads)),
    }
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
        c"privmatch.scan_backend",
        c"What computes the local dot products of an iris search (auto, cpu).",
        c"auto: the best backend of this machine (today the CPU's best SIMD kernel). Read when the engine starts.",
        &SCAN_BACKEND,
        GucContext::Sighup,
        GucFlags::default(),
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
        Engine {
            iris: IrisSearch::new(scan_backend(SCAN_BACKEND.get(), threads), timeout),
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

    /// Whether nothing runs: no search between rounds and no request thread.
    fn idle(&self) -> bool {
        self.iris.service.active() == 0 && self.in_flight.load(Ordering::Acquire) == 0
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
            sessions: self.iris.service.active() as u32,
            kernel: self.iris.service.backend().name(),
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
            params,
        } => {
            let keys = match engine.refresh() {
                Ok(keys) => keys,
                Err(e) => return answer(&mut stream, &Response::Error(e), &engine.log_tx),
            };
            let iris = engine.iris.clone();
            spawn_request(engine, stream, move |stream| {
                let interrupt = Interrupt::default();
                let response = watched(stream, &interrupt, || {
                    iris.start(&keys, session, &probe, params, now, &interrupt)
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
        Request::Abort { session } => {
            let aborted = engine.iris.service.abort(&session);
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

/// Waits up to a second for a connection, a signal or postmaster death (which exits).
fn wait_for_work(fd: i32) -> bool {
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
    rc & pg_sys::WL_SOCKET_READABLE as i32 != 0
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
        "privmatch engine: serving database {database} with the {} kernel on {} threads",
        engine.iris.service.backend().name(),
        engine.iris.service.backend().parallelism()
    );
    if let Err(e) = engine.refresh() {
        pgrx::log!("privmatch engine: not loaded yet: {}", e.message);
    }
    let mut idle_trimmed = true;
    while !BackgroundWorker::sigterm_received() {
        let readable = wait_for_work(listener.as_raw_fd());
        engine.iris.service.expire(Instant::now());
        engine.drain_log();
        if !readable {
            if !idle_trimmed && engine.idle() {
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
