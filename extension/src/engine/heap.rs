//! glibc heap tuning for the large per-round buffers of iris searches (round messages of tens
//! of MB), shared by the engine worker and the backends that call it: keep freed memory in
//! the heap for the next round instead of mapping fresh zeroed pages every time, and hand it
//! back when no search needs it (the engine: after an idle second; a backend: what is free
//! beyond what the next search's rounds use). A no-op outside Linux with glibc. And the
//! process's memory as `engine_status()` reports it ([`resident_bytes`],
//! [`resident_shared_bytes`]).
//!
//! Imports: none of this crate.

/// Makes the allocator serve every request from the heap (no `mmap`: glibc caps its mmap
/// threshold at 32 MB, below the largest round messages) and never trim it, so a buffer freed
/// after one round is reused by the next.
///
/// # Safety
/// No other thread of this process may be running (glibc's `mallopt` is not thread-safe).
pub unsafe fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts glibc's allocator parameters of this process; the caller
    // guarantees that no other thread is allocating meanwhile.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Returns the free pages of the heap to the operating system when more than `keep` bytes
/// are free, and keeps them otherwise (a backend's round buffers for its next search).
pub fn release_free_memory_above(keep: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters (under the arena locks).
        let free = unsafe { libc::mallinfo2() }.fordblks;
        if free > keep {
            release_free_memory();
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = keep;
}

/// Returns the free pages of the heap to the operating system (after a search, or when the
/// engine is idle).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe (it locks each arena) and only releases pages that
    // hold no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Resident set size of this process (from /proc; 0 where unavailable).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Of the resident set, the pages of shared memory (`RssShmem` in /proc; 0 where
/// unavailable): PostgreSQL's shared buffers the engine touched.
pub fn resident_shared_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("RssShmem:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}
