//! Data-parallel work on rayon pools (shared by the modalities' batched evaluations: the CPU
//! scan, the face dealer and evaluators, the Paillier proofs).
//!
//! The number of threads is a setting of the caller (the engine's `privmatch.engine_threads`,
//! the CLI's `--threads`), not the machine's core count, so each call names it: [`on_threads`]
//! runs its work on a pool of exactly that many threads, leased for the call. Pools are built
//! on first use and kept for the life of the process; a pool serves one call at a time, so
//! callers that overlap (two scans of the engine's request threads) get a pool each and share
//! the cores as the operating system schedules them, as scoped threads did — on one shared
//! pool a small face identification would wait behind the whole of a large iris scan (rayon
//! takes queued calls only when the running one has no piece left to steal). Up to four pools
//! per thread count are kept; calls overlapping beyond them get a pool of their own, ended
//! when they finish. Work run there uses rayon's parallel iterators, which split it by work
//! stealing.
//!
//! A host process may need to start its threads in its own way — a PostgreSQL backend must
//! start them with every signal blocked, so that its signal handlers keep running on the main
//! thread — hence [`set_spawner`], called once at load, before any pool exists.

use std::any::Any;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use rayon::{ThreadBuilder, ThreadPool, ThreadPoolBuilder};

/// Starts one pool thread (it must call [`ThreadBuilder::run`]).
pub type Spawner = fn(ThreadBuilder) -> io::Result<()>;

/// The spawner set by the host process, if any; [`spawn_thread`] otherwise.
static SPAWNER: OnceLock<Spawner> = OnceLock::new();

/// One pool kept for the process, and whether a call holds it now.
struct Slot {
    threads: usize,
    pool: ThreadPool,
    leased: AtomicBool,
}

/// The pools built so far. Leaked on purpose: they live as long as the process, and a
/// `&'static` lets a lease use one without holding the lock.
static POOLS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

/// The payload of a panic raised by the work (as `std::thread::JoinHandle::join` gives it).
pub type Panic = Box<dyn Any + Send + 'static>;

/// Sets how pool threads are started in this process. Takes effect for pools built afterwards;
/// returns false (and changes nothing) when a spawner was already set.
pub fn set_spawner(spawner: Spawner) -> bool {
    SPAWNER.set(spawner).is_ok()
}

/// The default spawner: a plain named `std::thread`.
pub fn spawn_thread(thread: ThreadBuilder) -> io::Result<()> {
    let name = format!("privmatch-pool-{}", thread.index());
    std::thread::Builder::new()
        .name(name)
        .spawn(move || thread.run())
        .map(|_| ())
}

/// Pools of one size kept for the process; calls that overlap beyond them get a pool of their
/// own, ended when they finish (an engine serves up to 128 requests at once: keeping a pool
/// for each would keep thousands of idle threads).
const KEPT_POOLS_PER_SIZE: usize = 4;

/// A pool of `threads` threads held by one call until dropped: a kept one (released for the
/// next call) or the call's own (ended).
enum Lease {
    Kept(&'static Slot),
    Own(ThreadPool),
}

impl Lease {
    fn pool(&self) -> &ThreadPool {
        match self {
            Lease::Kept(slot) => &slot.pool,
            Lease::Own(pool) => pool,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Lease::Kept(slot) = self {
            slot.leased.store(false, Ordering::Release);
        }
    }
}

/// A new pool of `threads` threads, started by the host's spawner.
fn build(threads: usize) -> Result<ThreadPool, rayon::ThreadPoolBuildError> {
    let spawner = SPAWNER.get().copied().unwrap_or(spawn_thread);
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .spawn_handler(spawner)
        .build()
}

/// Leases a free kept pool of `threads` threads; builds a kept one while fewer than
/// [`KEPT_POOLS_PER_SIZE`] exist, else a pool of the call's own.
fn lease(threads: usize) -> Result<Lease, rayon::ThreadPoolBuildError> {
    {
        // A poisoned lock only means another thread panicked while pushing; the list is intact.
        let mut pools = POOLS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let free = pools.iter().find(|slot| {
            slot.threads == threads
                && slot
                    .leased
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        });
        if let Some(slot) = free {
            return Ok(Lease::Kept(slot));
        }
        if pools.iter().filter(|slot| slot.threads == threads).count() < KEPT_POOLS_PER_SIZE {
            let slot: &'static Slot = Box::leak(Box::new(Slot {
                threads,
                pool: build(threads)?,
                leased: AtomicBool::new(true),
            }));
            pools.push(slot);
            return Ok(Lease::Kept(slot));
        }
    }
    // Built outside the lock: other calls need not wait for these threads to start.
    Ok(Lease::Own(build(threads)?))
}

/// Runs `work` with its parallel iterators on a pool of `threads` threads (0 counts as 1; with
/// one, the work still runs on the pool's thread while the caller waits: outside a pool rayon
/// would use its global pool, sized by the machine, not the setting). A panic inside the work
/// comes back as `Err` with its payload instead of unwinding through the caller, as does a
/// pool that cannot be built (the process may start no more threads).
///
/// Called from work already on a pool, the work runs there (nested parallel iterators split
/// over the pool in use) rather than leasing a second pool.
pub fn on_threads<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> Result<R, Panic> {
    if rayon::current_thread_index().is_some() {
        return catch_unwind(AssertUnwindSafe(work));
    }
    let lease = lease(threads.max(1))
        .map_err(|e| -> Panic { Box::new(format!("cannot start {threads} pool threads: {e}")) })?;
    catch_unwind(AssertUnwindSafe(|| lease.pool().install(work)))
}

/// Whether `len` items are worth handing to a pool of `threads` threads: at least two pieces
/// of at least `min_piece` items each. Below that the caller runs them itself, on its own
/// thread, without rayon: a hop to a pool thread (and its wake-up) costs more than the work,
/// which shows in the tail latency of a 1:1 face verification.
pub fn worth_a_pool(len: usize, min_piece: usize, threads: usize) -> bool {
    threads > 1 && len >= 2 * min_piece.max(1)
}

/// The length of the pieces when `len` items are split for `threads` threads: about one piece
/// per thread (at least 1), for `par_chunks` (at most `threads` chunks). Not a
/// `with_min_len`: rayon splits a range at its middle, so a minimum of ⌈len/threads⌉ would
/// keep an odd count of items from splitting at all.
pub fn piece_len(len: usize, threads: usize) -> usize {
    len.div_ceil(threads.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn work_runs_on_the_pool_of_the_asked_size() {
        for threads in [0usize, 1, 2, 3] {
            let seen = on_threads(threads, rayon::current_num_threads).expect("no panic");
            assert_eq!(seen, threads.max(1));
        }
    }

    #[test]
    fn parallel_results_equal_the_sequential_ones_in_order() {
        let items: Vec<u64> = (0..10_000).collect();
        let expected: Vec<u64> = items.iter().map(|x| x.wrapping_mul(*x)).collect();
        for threads in [0usize, 1, 2, 5] {
            let got = on_threads(threads, || {
                items
                    .par_iter()
                    .map(|x| x.wrapping_mul(*x))
                    .collect::<Vec<u64>>()
            })
            .expect("no panic");
            assert_eq!(got, expected, "{threads} threads");
        }
    }

    #[test]
    fn a_panic_in_the_work_comes_back_as_an_error() {
        for threads in [1usize, 2] {
            let result = on_threads(threads, || {
                (0..100u32).into_par_iter().for_each(|i| {
                    if i == 57 {
                        panic!("worker {i} failed");
                    }
                })
            });
            assert!(result.is_err(), "{threads} threads");
        }
        // The pool survives a panic and takes more work.
        assert_eq!(on_threads(2, || 7).expect("no panic"), 7);
    }

    #[test]
    fn an_odd_count_of_heavy_items_uses_every_thread() {
        // Three items: without a minimum piece rayon splits them, and another thread takes
        // work (each item waits long enough for it to steal). The pool is this call's alone.
        let used = on_threads(7, || {
            (0..3u32)
                .into_par_iter()
                .map(|_| {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    rayon::current_thread_index()
                })
                .collect::<std::collections::BTreeSet<_>>()
        })
        .expect("no panic");
        assert!(used.len() >= 2, "{used:?}");
    }

    #[test]
    fn overlapping_calls_each_get_a_pool_of_their_own() {
        // Each call waits, on its one pool thread, until both have started: on one shared
        // pool of one thread the second would wait for the first, which never ends.
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let wait_for_the_other = |both: std::sync::Arc<std::sync::Barrier>| {
            move || {
                on_threads(1, || {
                    both.wait();
                    rayon::current_thread_index()
                })
            }
        };
        let other = std::thread::spawn(wait_for_the_other(both.clone()));
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(wait_for_the_other(both)());
        });
        let mine = finished
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the second call ran beside the first")
            .expect("no panic");
        let theirs = other.join().expect("joined").expect("no panic");
        assert_eq!((mine, theirs), (Some(0), Some(0)));
    }

    #[test]
    fn calls_one_after_another_reuse_a_kept_pool_even_after_a_panic() {
        // A size no other test asks for. A lease left held (by the panicking call, say) would
        // make the next call build a second kept pool.
        assert!(on_threads(13, || 1).is_ok());
        assert!(on_threads::<()>(13, || panic!("a failed call")).is_err());
        assert!(on_threads(13, || 3).is_ok());
        let kept = POOLS
            .lock()
            .map(|pools| pools.iter().filter(|slot| slot.threads == 13).count())
            .unwrap_or(0);
        assert_eq!(kept, 1, "one kept pool of 13 threads");
    }

    #[test]
    fn calls_overlapping_beyond_the_kept_pools_get_their_own() {
        // Six calls of a size no other test asks for, all held at once on a barrier: four kept
        // pools and two of their own; afterwards four remain.
        let all = std::sync::Arc::new(std::sync::Barrier::new(6));
        let calls: Vec<_> = (0..6)
            .map(|_| {
                let all = all.clone();
                std::thread::spawn(move || on_threads(17, || all.wait()).is_ok())
            })
            .collect();
        assert!(calls.into_iter().all(|c| c.join().unwrap_or(false)));
        let kept = POOLS
            .lock()
            .map(|pools| pools.iter().filter(|slot| slot.threads == 17).count())
            .unwrap_or(0);
        assert_eq!(kept, KEPT_POOLS_PER_SIZE);
    }

    #[test]
    fn a_call_from_inside_a_pool_runs_on_that_pool() {
        let sizes = on_threads(3, || on_threads(1, rayon::current_num_threads))
            .expect("no panic")
            .expect("no panic");
        assert_eq!(sizes, 3);
    }

    #[test]
    fn small_work_and_one_thread_stay_on_the_caller() {
        assert!(!worth_a_pool(1_000_000, 1, 1));
        assert!(!worth_a_pool(1, 1, 8));
        assert!(!worth_a_pool(127, 64, 2));
        assert!(worth_a_pool(128, 64, 2));
        assert!(worth_a_pool(2, 0, 2));
    }

    #[test]
    fn pieces_cover_the_items_in_about_one_piece_per_thread() {
        assert_eq!(piece_len(0, 4), 1);
        assert_eq!(piece_len(10, 0), 10);
        assert_eq!(piece_len(10, 3), 4);
        assert_eq!(piece_len(3, 8), 1);
    }
}
