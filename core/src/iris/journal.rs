//! The change journal of a share matrix that lives across scans (the engine's store, one per
//! eye): which physical rows changed since a given revision. A scan backend that keeps its own
//! copy of the rows — a GPU holding a party's shares in device memory — asks the journal which
//! rows to copy again before a scan, instead of copying every row every time.
//!
//! The journal records row *positions*, not contents: the host matrix stays the one source of
//! truth, and a backend copies a recorded row from it as it is at scan time. The length of the
//! matrix is read from the matrix itself, so rows dropped off the end need no entry.
//!
//! A journal has an identity ([`RowJournal::id`], unique in the process), so a copy made from
//! one matrix is never taken for a copy of another (a store rebuilt after a restart gets new
//! journals). Entries older than [`JOURNAL_CAPACITY`] changes are forgotten; a backend that far
//! behind copies everything ([`RowJournal::rows_changed_since`] answers `None`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// Changes a journal remembers; a copy older than this many changes is rebuilt whole.
pub const JOURNAL_CAPACITY: usize = 1 << 16;

/// Source of journal identities (0 is never handed out).
static NEXT_JOURNAL_ID: AtomicU64 = AtomicU64::new(1);

/// Which rows of one matrix changed, by revision (module docs).
#[derive(Debug)]
pub struct RowJournal {
    id: u64,
    revision: u64,
    /// (revision the change made, physical row), oldest first.
    entries: VecDeque<(u64, usize)>,
    /// Revisions up to this one are no longer listed.
    forgotten_up_to: u64,
}

impl Default for RowJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl RowJournal {
    /// A journal of a new matrix, at revision 0, with a fresh identity.
    pub fn new() -> Self {
        RowJournal {
            id: NEXT_JOURNAL_ID.fetch_add(1, Ordering::Relaxed),
            revision: 0,
            entries: VecDeque::new(),
            forgotten_up_to: 0,
        }
    }

    /// The identity of the matrix this journal tracks (unique in the process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The current revision: the number of changes recorded so far.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Records that the contents of physical row `row` changed (written by an append, or
    /// overwritten by the row moved into a deleted row's place).
    pub fn record(&mut self, row: usize) {
        self.revision += 1;
        self.entries.push_back((self.revision, row));
        while self.entries.len() > JOURNAL_CAPACITY {
            if let Some((rev, _)) = self.entries.pop_front() {
                self.forgotten_up_to = rev;
            }
        }
    }

    /// The rows changed after `revision` (sorted, without repeats), or `None` when the journal
    /// no longer remembers that far back, or `revision` is not one of this journal's: the
    /// caller must then copy every row.
    pub fn rows_changed_since(&self, revision: u64) -> Option<Vec<usize>> {
        if revision < self.forgotten_up_to || revision > self.revision {
            return None;
        }
        let start = self.entries.partition_point(|&(rev, _)| rev <= revision);
        let mut rows: Vec<usize> = self.entries.range(start..).map(|&(_, row)| row).collect();
        rows.sort_unstable();
        rows.dedup();
        Some(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_rows_changed_after_a_revision() {
        let mut j = RowJournal::new();
        assert_eq!(j.rows_changed_since(0), Some(vec![]));
        for row in [0, 1, 2, 1] {
            j.record(row);
        }
        assert_eq!(j.revision(), 4);
        assert_eq!(j.rows_changed_since(0), Some(vec![0, 1, 2]));
        assert_eq!(j.rows_changed_since(2), Some(vec![1, 2]));
        assert_eq!(j.rows_changed_since(4), Some(vec![]));
        assert_eq!(j.rows_changed_since(5), None, "a revision from the future");
    }

    #[test]
    fn forgets_old_changes_and_says_so() {
        let mut j = RowJournal::new();
        for row in 0..JOURNAL_CAPACITY + 10 {
            j.record(row);
        }
        assert_eq!(j.rows_changed_since(3), None);
        let recent = j.rows_changed_since(j.revision() - 2).expect("remembered");
        assert_eq!(recent, vec![JOURNAL_CAPACITY + 8, JOURNAL_CAPACITY + 9]);
    }

    #[test]
    fn identities_differ() {
        assert_ne!(RowJournal::new().id(), RowJournal::new().id());
    }
}
