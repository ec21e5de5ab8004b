//! The engine's request threads, whatever the modality: each start or round of a session runs
//! on a thread of its own, which computes, answers the backend and ends, so concurrent
//! sessions use the CPU side by side instead of queueing behind one request
//! ([`RequestThreads`]); a hang-up watcher lets long work stop when its backend gives up
//! ([`watched`]). Request threads run pure Rust with Postgres's signals blocked; what they have
//! to log goes to the worker's main thread through a channel.
//!
//! Imports: [`super::ipc`], [`crate::signals`]; no modality.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use super::ipc::{write_frame, EngineError, ErrorKind, Response};
use crate::signals::without_signals;

/// Writes `response` to the backend at the other end of `stream`.
pub fn answer(stream: &mut UnixStream, response: &Response, log: &Sender<String>) {
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

/// The request threads: how many run now, the most that may run at once, and the channel
/// their log lines go to.
pub struct RequestThreads {
    in_flight: Arc<AtomicUsize>,
    max: usize,
    log: Sender<String>,
}

impl RequestThreads {
    /// At most `max` threads at once, logging to `log`.
    pub fn new(max: usize, log: Sender<String>) -> Self {
        RequestThreads {
            in_flight: Arc::new(AtomicUsize::new(0)),
            max,
            log,
        }
    }

    /// Request threads running now.
    pub fn running(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Runs `job` on a request thread of its own, which answers the backend on `stream` with
    /// the job's response (none: the backend hung up, nobody reads an answer). A panic in the
    /// job (a bug) is answered as an internal error and logged; the engine keeps serving.
    /// With the most threads running, the request is refused as busy (53400).
    pub fn spawn(
        &self,
        mut stream: UnixStream,
        job: impl FnOnce(&UnixStream) -> Option<Response> + Send + 'static,
    ) {
        let log = self.log.clone();
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            let busy = EngineError::new(
                ErrorKind::Busy,
                format!(
                    "the engine is running {} requests, the most it runs at once; retry",
                    self.max
                ),
            );
            return answer(&mut stream, &Response::Error(busy), &log);
        }
        let counted = InFlight(Arc::clone(&self.in_flight));
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
            let _ = self.log.send(format!(
                "privmatch engine: cannot start a request thread: {e}"
            ));
        }
    }
}

/// Computes `work` while a watcher thread calls `on_hangup` if the backend at the other end of
/// `stream` hangs up (its query was cancelled or timed out, so it closed the socket): the work
/// can stop early (an iris scan raises its interrupt). The watcher only polls and is woken
/// through a socket pair the moment the answer is ready, so a normal request never waits for
/// it.
pub fn watched(
    stream: &UnixStream,
    on_hangup: &(dyn Fn() + Sync),
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
            .spawn_scoped(scope, || watch_hangup(stream, &woken, on_hangup));
        let response = work().unwrap_or_else(Response::Error);
        // Closing our end wakes the watcher (its poll sees the hang-up) and it returns.
        drop(wake);
        response
    })
}

/// Calls `on_hangup` when `stream`'s peer hangs up; returns without calling it when `woken`'s
/// peer does (the request was answered).
fn watch_hangup(stream: &UnixStream, woken: &UnixStream, on_hangup: &(dyn Fn() + Sync)) {
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
            on_hangup();
            return;
        }
        if fds[0].revents != 0 {
            // Unexpected bytes after the request: stop watching the backend (a negative
            // descriptor is ignored by poll) rather than spin on it.
            fds[0].fd = -1;
        }
    }
}
