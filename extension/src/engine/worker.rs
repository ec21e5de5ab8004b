//! The party engine: one background worker per party (registered when privmatch is in
//! `shared_preload_libraries`) that owns the in-memory share matrix ([`IrisStore`]), the
//! running searches ([`SearchService`]) and the scan threads (design brief §3). Backends hand
//! it work over a Unix socket in the data directory ([`super::client`]).
//!
//! Threads: the worker's main thread is the only one that calls Postgres (SPI to read the
//! template table and the party's keys); the scan threads run pure Rust on borrowed slices.
//! Requests are served one at a time, so a search's state is never touched concurrently.
//!
//! Consistency: before every search start the worker reads the ids the table holds (a fresh
//! transaction, so every enrolment committed before the search started is seen) and loads
//! missing rows / drops deleted ones. After a restart it rebuilds everything from the table.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::encoding::IrisShare;
use privmatch_core::iris::enroll::{BundleError, Eye};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::scan::CpuScan;
use privmatch_core::iris::service::{PartyKeys, RoundReply, SearchError, SearchService};
use privmatch_core::iris::store::{IrisStore, StoredTemplate};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::{decode_share, ShareKind};

use super::ipc::{read_frame, write_frame, EngineStatus, ErrorKind, Request, Response};

/// The engine's socket, relative to the data directory (every server process runs there).
pub const SOCKET_NAME: &str = "privmatch_engine.sock";

/// `privmatch.database`: the database whose templates the engine serves (read when the
/// engine starts; the GUCs are SIGHUP-level because a library loaded by CREATE EXTENSION
/// may not define postmaster-level ones).
pub static ENGINE_DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"privmatch"));
/// `privmatch.engine_threads`: scan threads (0 = one per CPU).
pub static ENGINE_THREADS: GucSetting<i32> = GucSetting::<i32>::new(0);
/// `privmatch.search_timeout`: seconds after which an idle search is dropped.
pub static SEARCH_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(120);

/// Rows loaded per SPI query.
const LOAD_CHUNK: usize = 256;

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

/// An engine-side failure: the class the backend maps to a SQLSTATE, and a message without
/// secrets.
type EngineError = (ErrorKind, String);

fn internal(message: impl Into<String>) -> EngineError {
    (ErrorKind::Internal, message.into())
}

fn search_error(err: SearchError) -> EngineError {
    let kind = match &err {
        SearchError::BadParameter(_) => ErrorKind::BadParameter,
        SearchError::UnknownSession(_) | SearchError::ReplayedSession(_) => {
            ErrorKind::UnknownSession
        }
        SearchError::Probe(_) => ErrorKind::Probe,
        SearchError::PeerNotPinned(_) => ErrorKind::NotReady,
        SearchError::WrongRound { .. }
        | SearchError::Channel { .. }
        | SearchError::Protocol { .. } => ErrorKind::Protocol,
        SearchError::Store(_) => ErrorKind::Internal,
    };
    (kind, err.to_string())
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
    // SAFETY: the standard background-worker transaction sequence, on the main thread.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = PgTryBuilder::new(AssertUnwindSafe(body))
        .catch_others(|e| Err(internal(caught_message(&e))))
        .execute();
    // SAFETY: as above; abort also unwinds the snapshot stack.
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

fn spi_error(e: pgrx::spi::Error) -> EngineError {
    internal(format!("reading the template table: {e}"))
}

/// The keys of this party and its pinned peers, read in the current transaction.
fn read_keys() -> Result<PartyKeys, EngineError> {
    let not_ready = |m: &str| (ErrorKind::NotReady, m.to_owned());
    let (index, secret) = Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT party_index, secret_key FROM privmatch.party_identity",
                None,
                &[],
            )
            .map_err(spi_error)?;
        let Some(row) = rows.into_iter().next() else {
            return Err(not_ready(
                "this privmatch party has no identity yet: run SELECT privmatch.init_party(<index>)",
            ));
        };
        let index: i32 = row.get(1).map_err(spi_error)?.unwrap_or(-1);
        let secret: Vec<u8> = row.get(2).map_err(spi_error)?.unwrap_or_default();
        Ok((index, secret))
    })?;
    let me = PartyIndex::new(i64::from(index)).map_err(|e| internal(e.to_string()))?;
    let secret: [u8; 32] = secret
        .try_into()
        .map_err(|_| internal("privmatch.party_identity holds a secret key of the wrong length"))?;
    let mut peers: [Option<PartyPublicKey>; 3] = [None; 3];
    Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT party_index, public_key FROM privmatch.peers",
                None,
                &[],
            )
            .map_err(spi_error)?;
        for row in rows {
            let index: i32 = row.get(1).map_err(spi_error)?.unwrap_or(-1);
            let key: Vec<u8> = row.get(2).map_err(spi_error)?.unwrap_or_default();
            if let (Ok(p), Ok(key)) = (PartyIndex::new(i64::from(index)), <[u8; 32]>::try_from(key))
            {
                peers[p.as_usize()] = Some(PartyPublicKey::from_bytes(key));
            }
        }
        Ok::<_, EngineError>(())
    })?;
    Ok(PartyKeys {
        me,
        secret: PartySecretKey::from_bytes(secret),
        peers,
    })
}

fn extension_created() -> Result<bool, EngineError> {
    Spi::get_one::<bool>("SELECT to_regclass('privmatch.iris_templates') IS NOT NULL")
        .map_err(spi_error)
        .map(|v| v.unwrap_or(false))
}

fn committed_ids() -> Result<Vec<i64>, EngineError> {
    Spi::connect(|client| {
        let rows = client
            .select("SELECT id FROM privmatch.iris_templates", None, &[])
            .map_err(spi_error)?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            if let Some(id) = row.get::<i64>(1).map_err(spi_error)? {
                ids.push(id);
            }
        }
        Ok(ids)
    })
}

fn decode_row(
    me: PartyIndex,
    id: i64,
    subject: String,
    eye: &str,
    code: &[u8],
    mask: &[u8],
) -> Result<StoredTemplate, EngineError> {
    let bad = |what: String| internal(format!("template {id}: {what}"));
    let eye = Eye::parse(eye).map_err(|e: BundleError| bad(e.to_string()))?;
    let code = decode_share(ShareKind::IrisCode, code).map_err(|e| bad(e.to_string()))?;
    let mask = decode_share(ShareKind::IrisMask, mask).map_err(|e| bad(e.to_string()))?;
    if code.party != me || mask.party != me {
        return Err(bad(format!(
            "holds a share of {}, this is {me}",
            code.party
        )));
    }
    Ok(StoredTemplate {
        id,
        subject,
        eye,
        share: IrisShare {
            party: me,
            code: code.coefs(),
            mask: mask.coefs(),
        },
    })
}

fn load_rows(me: PartyIndex, ids: &[i64]) -> Result<Vec<StoredTemplate>, EngineError> {
    Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT id, subject, eye::text, privmatch.iris_code_share_send(code_share), \
                 privmatch.iris_mask_share_send(mask_share) \
                 FROM privmatch.iris_templates WHERE id = ANY($1)",
                None,
                &[ids.to_vec().into()],
            )
            .map_err(spi_error)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let id: i64 = row.get(1).map_err(spi_error)?.unwrap_or_default();
            let subject: String = row.get(2).map_err(spi_error)?.unwrap_or_default();
            let eye: String = row.get(3).map_err(spi_error)?.unwrap_or_default();
            let code: Vec<u8> = row.get(4).map_err(spi_error)?.unwrap_or_default();
            let mask: Vec<u8> = row.get(5).map_err(spi_error)?.unwrap_or_default();
            out.push(decode_row(me, id, subject, &eye, &code, &mask)?);
        }
        Ok(out)
    })
}

/// How many of `ids` each eye has (to size the matrices once before a bulk load).
fn missing_per_eye(ids: &[i64]) -> Result<Vec<(Eye, usize)>, EngineError> {
    Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT eye::text, count(*) FROM privmatch.iris_templates WHERE id = ANY($1) GROUP BY eye",
                None,
                &[ids.to_vec().into()],
            )
            .map_err(spi_error)?;
        let mut out = Vec::new();
        for row in rows {
            let eye: String = row.get(1).map_err(spi_error)?.unwrap_or_default();
            let count: i64 = row.get(2).map_err(spi_error)?.unwrap_or(0);
            if let Ok(eye) = Eye::parse(&eye) {
                out.push((eye, usize::try_from(count).unwrap_or(0)));
            }
        }
        Ok(out)
    })
}

/// The worker's state.
struct Engine {
    store: Option<IrisStore>,
    service: SearchService,
    state: String,
}

impl Engine {
    fn new() -> Self {
        let threads = match ENGINE_THREADS.get() {
            n if n > 0 => n as usize,
            _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let timeout = Duration::from_secs(SEARCH_TIMEOUT.get().max(1) as u64);
        Engine {
            store: None,
            service: SearchService::new(Arc::new(CpuScan::detect(threads)), timeout),
            state: "starting".into(),
        }
    }

    /// Brings the store up to date with the table (module docs) and returns the keys.
    fn refresh(&mut self) -> Result<PartyKeys, EngineError> {
        let result = in_transaction(|| {
            if !extension_created()? {
                return Err((
                    ErrorKind::NotReady,
                    "CREATE EXTENSION privmatch has not run in the engine's database (privmatch.database)".into(),
                ));
            }
            let keys = read_keys()?;
            let store = self.store.get_or_insert_with(|| IrisStore::new(keys.me));
            if store.party() != keys.me {
                return Err(internal("the party index changed under the running engine"));
            }
            sync_store(store, &committed_ids()?)?;
            Ok(keys)
        });
        self.state = match &result {
            Ok(_) => "ready".into(),
            Err((_, m)) => format!("not ready: {m}"),
        };
        result
    }

    fn handle(&mut self, request: Request<'_>) -> Response {
        let now = Instant::now();
        let result = match request {
            Request::Start {
                session,
                probe,
                mode,
                max_rotation,
                threshold,
            } => SearchMode::parse(&mode)
                .and_then(|mode| SearchParams::new(mode, max_rotation, threshold))
                .map_err(|e| search_error(SearchError::BadParameter(e)))
                .and_then(|params| {
                    let keys = self.refresh()?;
                    let store = self.store.as_mut().ok_or_else(|| internal("no store"))?;
                    self.service
                        .start(store, &keys, session, &probe, params, now)
                        .map_err(search_error)
                })
                .map(|r| Response::Started {
                    entries: r.entries as u64,
                    digest: r.digest,
                    message: r.message,
                }),
            Request::Round {
                session,
                round,
                message,
            } => self
                .service
                .round(session, round, &message, now)
                .map_err(search_error)
                .map(|reply| match reply {
                    RoundReply::Continue(m) => Response::Continue(m),
                    RoundReply::Identified(s) => Response::Identified(s),
                    RoundReply::Unique(u) => Response::Unique(u),
                }),
            Request::Abort { session } => Ok(Response::Aborted(self.service.abort(&session))),
            Request::Status => Ok(Response::Status(self.status())),
        };
        result.unwrap_or_else(|(kind, message)| Response::Error(kind, message))
    }

    fn status(&self) -> EngineStatus {
        EngineStatus {
            state: self.state.clone(),
            templates: self.store.as_ref().map_or(0, |s| s.len() as u64),
            share_bytes: self.store.as_ref().map_or(0, |s| s.share_bytes() as u64),
            resident_bytes: resident_bytes(),
            sessions: self.service.active() as u32,
            kernel: self.service.backend().name(),
            threads: self.service.backend().parallelism() as u32,
        }
    }
}

/// Applies the difference between the store and the table's ids, logging progress on large
/// loads (a restart with many templates).
fn sync_store(store: &mut IrisStore, ids: &[i64]) -> Result<(), EngineError> {
    let plan = store.plan_sync(ids);
    for id in &plan.stale {
        store.remove(*id);
    }
    let total = plan.missing.len();
    let verbose = total >= 10_000;
    if verbose {
        pgrx::log!("privmatch engine: loading {total} iris templates");
    }
    let started = Instant::now();
    if total > LOAD_CHUNK {
        for (eye, count) in missing_per_eye(&plan.missing)? {
            store.reserve(eye, count);
        }
    }
    let mut loaded = 0usize;
    for chunk in plan.missing.chunks(LOAD_CHUNK) {
        for row in load_rows(store.party(), chunk)? {
            store.insert(row).map_err(|e| internal(e.to_string()))?;
        }
        loaded += chunk.len();
        if verbose && (loaded / LOAD_CHUNK).is_multiple_of(40) {
            pgrx::log!("privmatch engine: loaded {loaded}/{total} iris templates");
        }
    }
    if verbose {
        pgrx::log!(
            "privmatch engine: {} iris templates in memory ({} MB of shares), loaded in {:.1} s",
            store.len(),
            store.share_bytes() / 1_000_000,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Resident set size of this process (from /proc; 0 where unavailable).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Reads one request from `stream`, answers it. I/O failures (a backend that gave up) are
/// logged without content and otherwise ignored.
fn serve(engine: &mut Engine, stream: UnixStream) {
    let mut stream = stream;
    let setup = stream
        .set_nonblocking(false)
        .and_then(|_| stream.set_read_timeout(Some(Duration::from_secs(30))))
        .and_then(|_| stream.set_write_timeout(Some(Duration::from_secs(120))));
    let request = setup
        .and_then(|_| read_frame(&mut stream))
        .and_then(Request::decode);
    let response = match request {
        Ok(request) => engine.handle(request),
        Err(e) => {
            pgrx::log!("privmatch engine: unreadable request: {e}");
            return;
        }
    };
    let (head, payload) = response.encode_parts();
    if let Err(e) = write_frame(&mut stream, &head, payload) {
        pgrx::log!("privmatch engine: could not answer a backend (it gave up?): {e}");
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

/// Keeps the per-round buffers of a search (up to tens of MB each) in the heap for reuse
/// instead of mapping fresh zeroed pages every round: measured at N = 100,000 with 31
/// rotations, page faults took about a fifth of the parties' CPU. glibc caps the mmap
/// threshold at 32 MB, below the largest round messages, so the engine does not use mmap
/// for allocations at all and keeps freed memory (the share matrix is sized once per bulk
/// load, so it is not copied by growth in practice).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts glibc's allocator parameters; called before any thread
    // of this process is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Returns the heap kept for the rounds of searches to the operating system (after a second
/// without requests and no running search), so an idle engine holds little beyond its shares.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; no other thread is running.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The engine worker's entry point.
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn privmatch_engine_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    tune_allocator();
    let database = ENGINE_DATABASE
        .get()
        .and_then(|d| d.into_string().ok())
        .unwrap_or_else(|| "privmatch".into());
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    let Some(listener) = bind_socket() else {
        return;
    };
    let mut engine = Engine::new();
    pgrx::log!(
        "privmatch engine: serving database {database} with the {} kernel on {} threads",
        engine.service.backend().name(),
        engine.service.backend().parallelism()
    );
    if let Err((_, message)) = engine.refresh() {
        pgrx::log!("privmatch engine: not loaded yet: {message}");
    }
    let mut idle_trimmed = true;
    while !BackgroundWorker::sigterm_received() {
        let readable = wait_for_work(listener.as_raw_fd());
        engine.service.expire(Instant::now());
        if !readable {
            if !idle_trimmed && engine.service.active() == 0 {
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
}
