//! The engine's socket: the Unix socket it listens on in the data directory (mode 0600, the
//! server's user only) and the wait for the next connection, a signal or postmaster death.
//!
//! Imports: [`super::ipc`] (the socket's name); no modality.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;

use pgrx::prelude::*;

use super::ipc::SOCKET_NAME;

/// Listens on [`SOCKET_NAME`] (a stale file from an earlier run is replaced), non-blocking;
/// `None` with a WARNING when that fails.
pub fn bind_socket() -> Option<UnixListener> {
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
pub enum Wake {
    /// A connection is waiting.
    Readable,
    /// The latch was set (a signal).
    Latch,
    /// A whole second passed without either.
    Timeout,
}

/// Waits up to a second for a connection, a signal or postmaster death (which exits).
pub fn wait_for_work(fd: i32) -> Wake {
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
