//! Threads that never run Postgres's signal handlers: a backend or the engine worker may start
//! helper threads (a hang-up watcher, the front door's request), and a signal delivered to
//! one of them would run a handler that expects the main thread. Plain libc, no Postgres call.
//! The core's rayon pools (the scan, dealing, proofs) start their threads through
//! [`spawn_pool_thread`], set as the core's spawner at load.

/// Runs `start` (which starts a thread) with every signal blocked, so that the new thread
/// inherits a mask that keeps Postgres's signal handlers on the main thread.
pub fn without_signals<T>(start: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data; sigfillset initialises it; pthread_sigmask changes only
    // the calling thread's mask and is restored right after.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let result = start();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        result
    }
}

/// Starts one thread of a core rayon pool with every signal blocked (the spawner the
/// extension sets with `privmatch_core::parallel::set_spawner`).
pub fn spawn_pool_thread(thread: rayon::ThreadBuilder) -> std::io::Result<()> {
    without_signals(|| privmatch_core::parallel::spawn_thread(thread))
}
