//! The backend side of the engine socket: sends one request, waits for the answer while
//! honouring query cancellation and `statement_timeout`, and turns engine errors into
//! Postgres errors with SQLSTATEs. Also the SQL function `engine_status()`.
//!
//! Imports: [`super::ipc`], [`super::heap`] and [`crate::errors`] (no modality).

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use pgrx::prelude::*;

use super::heap::{keep_freed_memory, release_free_memory_above};
use super::ipc::{
    read_frame, write_frame, EngineStatus, ErrorKind, Request, Response, SOCKET_NAME,
};
use crate::errors::raise;

/// How long a call waits for the engine's socket to appear (the worker starts with the
/// server and restarts two seconds after a crash).
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// Poll interval while waiting (interrupts are checked in between).
const TICK_MS: i32 = 100;

fn not_running(err: &io::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the privmatch engine is not running ({err})"),
        Some("add privmatch to shared_preload_libraries and restart the server; after a crash the engine restarts within seconds"),
    )
}

/// Connects to the engine, waiting up to `wait` for it to come up.
fn connect(wait: Duration) -> Result<UnixStream, io::Error> {
    let deadline = Instant::now() + wait;
    loop {
        match UnixStream::connect(SOCKET_NAME) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => {
                pgrx::check_for_interrupts!();
                std::thread::sleep(Duration::from_millis(TICK_MS as u64));
            }
        }
    }
}

/// Blocks until `stream` is readable, checking for cancellation every tick.
fn wait_readable(stream: &UnixStream) {
    let mut fds = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: polling one valid descriptor owned by `stream`.
        let rc = unsafe { libc::poll(&mut fds, 1, TICK_MS) };
        if rc > 0 {
            return;
        }
        // A signal (the statement-timeout alarm, a cancel request) interrupts the poll: look
        // at the interrupts now rather than treat it as readable and block in the read until
        // the engine answers. Other errors are left to the read, which reports them.
        if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
        pgrx::check_for_interrupts!();
    }
}

fn exchange(stream: &mut UnixStream, request: &Request) -> io::Result<Response> {
    let (head, payload) = request.encode_parts();
    write_frame(stream, &head, payload)?;
    wait_readable(stream);
    Response::decode(read_frame(stream)?)
}

/// True when privmatch is in `shared_preload_libraries`, i.e. an engine worker exists (it may
/// still be starting).
fn engine_configured() -> bool {
    Spi::get_one::<String>("SELECT current_setting('shared_preload_libraries')")
        .ok()
        .flatten()
        .is_some_and(|s| {
            s.split(',')
                .any(|l| l.trim().trim_matches('"') == "privmatch")
        })
}

/// Keeps this backend's large buffers (round messages of tens of MB: the protocol message it
/// receives, the bytea it returns) in its heap from one round to the next instead of mapping
/// fresh zeroed pages for each: measured at N = 100,000 with 31 rotations, page faults were
/// about two thirds of a searching backend's CPU. Set once per backend; when a search ends,
/// what is free beyond [`KEPT_ROUND_BUFFERS`] is handed back ([`release_round_buffers`]).
fn keep_round_buffers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: a backend starts no thread but the core's pool threads (if it ran parallel
    // work: P2's dealing, the SP's enrolment challenge), which are idle between calls and
    // allocate nothing while this backend runs its statement; mallopt takes the arena lock.
    ONCE.call_once(|| unsafe { keep_freed_memory() });
}

/// The freed heap a backend keeps after a search for the next one's rounds. Handing it back
/// after every search made each search fault its round buffers in again (measured at
/// N = 100,000 with 31 rotations: ≈ 127 MB per backend and search, 48 % of the search's page
/// faults); a backend that relayed a larger search than this hands everything back.
const KEPT_ROUND_BUFFERS: usize = 256 << 20;

/// Returns the heap the rounds of a search used to the operating system beyond
/// [`KEPT_ROUND_BUFFERS`] (called when a search ends at this backend: output, abort or error).
pub fn release_round_buffers() {
    release_free_memory_above(KEPT_ROUND_BUFFERS);
}

/// Sends `request` to the engine and returns its answer; raises on engine errors (after
/// releasing the round buffers: an error ends the search).
pub fn call(request: &Request) -> Response {
    keep_round_buffers();
    // The configuration is only consulted when the engine is not reachable at once (never
    // on the path of a running search's rounds).
    let mut stream = connect(Duration::ZERO)
        .or_else(|e| {
            if engine_configured() {
                connect(CONNECT_WAIT)
            } else {
                Err(e)
            }
        })
        .unwrap_or_else(|e| not_running(&e));
    let response = exchange(&mut stream, request).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            format!("the privmatch engine did not answer ({e}); it may have restarted, and running searches are lost"),
            None,
        )
    });
    if let Response::Error(err) = response {
        release_round_buffers();
        raise(sqlstate(err.kind), err.message, hint(err.kind));
    }
    response
}

/// Sends a modality's call and returns the head and payload of its reply; raises on engine
/// errors (as [`call`]) and, naming `function`, on any other kind of answer.
pub fn call_reply(function: &str, request: &Request) -> (Vec<u8>, Vec<u8>) {
    match call(request) {
        Response::Reply { head, payload } => (head, payload),
        _ => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("{function}: the engine answered with another kind of reply"),
            None,
        ),
    }
}

/// Like [`call`] but returns `None` instead of raising when the engine is not reachable.
pub fn try_call(request: &Request) -> Option<Response> {
    let mut stream = connect(Duration::ZERO).ok()?;
    exchange(&mut stream, request).ok()
}

/// The SQLSTATE of an engine refusal of class `kind`, as its five characters.
pub fn sqlstate_of(kind: ErrorKind) -> String {
    crate::errors::sqlstate_text(sqlstate(kind))
}

fn sqlstate(kind: ErrorKind) -> PgSqlErrorCode {
    match kind {
        ErrorKind::BadParameter => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        ErrorKind::UnknownSession => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        ErrorKind::Protocol => PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
        ErrorKind::NotReady => PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        ErrorKind::Internal => PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        ErrorKind::Probe => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
        ErrorKind::Busy => PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        ErrorKind::Retry => PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        ErrorKind::OtherParty => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    }
}

fn hint(kind: ErrorKind) -> Option<&'static str> {
    match kind {
        ErrorKind::Protocol => Some("the search was aborted at this party; start a new one"),
        ErrorKind::OtherParty => Some(crate::errors::OTHER_PARTY_HINT),
        ErrorKind::UnknownSession => {
            Some("searches are in memory: an engine restart, an abort or the idle timeout (privmatch.search_timeout) ends them")
        }
        _ => None,
    }
}

/// The engine's state: `ready` (or why not), templates in memory, bytes of shares, resident
/// memory of the engine process, running searches, the scan backend (`kernel`: the GPUs or the
/// CPU kernel, and in parentheses why the CPU scans when `privmatch.gpu` allowed or required a
/// GPU), its parallelism (`threads`: CPU threads, or GPUs) and, of the resident memory, the
/// pages of PostgreSQL's shared buffers mapped into the engine (`resident_shared_bytes`: the
/// server's memory, touched when the engine reads the tables; not the engine's own). Reports `not running` instead
/// of failing when the engine is down.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn engine_status() -> TableIterator<
    'static,
    (
        name!(state, String),
        name!(templates, i64),
        name!(share_bytes, i64),
        name!(resident_bytes, i64),
        name!(sessions, i32),
        name!(kernel, String),
        name!(threads, i32),
        name!(resident_shared_bytes, i64),
    ),
> {
    let status = match try_call(&Request::Status) {
        Some(Response::Status(s)) => s,
        _ => EngineStatus {
            state: "not running (is privmatch in shared_preload_libraries?)".into(),
            ..Default::default()
        },
    };
    TableIterator::once((
        status.state,
        status.templates as i64,
        status.share_bytes as i64,
        status.resident_bytes as i64,
        status.sessions as i32,
        status.kernel,
        status.threads as i32,
        status.resident_shared_bytes as i64,
    ))
}
