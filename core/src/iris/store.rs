//! The party engine's in-memory copy of the enrolled iris shares (docs/architecture.md, "party
//! engine"): one contiguous share matrix per eye, derived from the party's template table,
//! which stays the source of truth.
//!
//! **Consistency.** The owner (the engine worker) brings the store up to date before every
//! search: it reads the ids the table holds in a fresh snapshot, asks [`IrisStore::plan_sync`]
//! which ids are missing and which are stale, removes the stale ones and inserts the missing
//! rows. A search therefore reflects every enrolment committed before it started, and a
//! deleted record is never matched again.
//!
//! **Order.** Rows sit in arrival order (appends are cheap, a removal moves the last row into
//! the hole), which differs between parties. The protocol needs the same entry order at the
//! three parties, so every search uses the *canonical order*: rows sorted by subject (the
//! table is unique on (subject, eye), so within an eye the subject is a key). The scan runs
//! in physical order on a thread pool and its results are permuted into canonical order.
//! [`CanonicalOrder::digest`] commits to the canonical key list and each entry's enrolment id
//! ([`crate::iris::binding`]), so the three parties search the same set of the same
//! enrolments or their messages do not authenticate (the digest is in the session binding).
//!
//! **Memory.** Each eye holds `12,800 + 6,400` u16 coefficients per row in two flat vectors;
//! growth reserves an eighth of the current size at a time, so capacity stays within
//! 1.125 × the shares held.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use sha2::{Digest, Sha256};

use crate::iris::aligned::AlignedU16s;
use crate::iris::binding::{legacy_enrolment_id, EnrolmentId};
use crate::iris::dot::{DotError, DotShares, ShareMatrix};
use crate::iris::encoding::{IrisShare, CODE_SHARE_COEFS, MASK_SHARE_COEFS};
use crate::iris::enroll::Eye;
use crate::iris::journal::RowJournal;
use crate::iris::query::PreparedQuery;
use crate::iris::scan::{Interrupt, ScanBackend};
use crate::party::PartyIndex;

/// Bytes of shares one enrolled template occupies at one party (code + mask, u16 each).
pub const SHARE_BYTES_PER_TEMPLATE: usize = 2 * (CODE_SHARE_COEFS + MASK_SHARE_COEFS);

/// One row of the party's template table, as the engine loads it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredTemplate {
    /// The table's primary key (party-local).
    pub id: i64,
    /// The subject id (the same at every party).
    pub subject: String,
    /// Which eye.
    pub eye: Eye,
    /// This party's share.
    pub share: IrisShare,
}

impl std::fmt::Debug for StoredTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "StoredTemplate {{ id: {}, subject: {:?}, eye: {}, share: <redacted> }}",
            self.id,
            self.subject,
            self.eye.as_str()
        )
    }
}

/// Why a row was refused by the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The row's share belongs to another party.
    #[error("template {id}: the share belongs to {inside}, this is {me}")]
    WrongParty {
        /// Row id.
        id: i64,
        /// The party inside the share.
        inside: PartyIndex,
        /// This party.
        me: PartyIndex,
    },
    /// The share has the wrong number of coefficients.
    #[error("template {id}: share has {code} code and {mask} mask coefficients, expected {CODE_SHARE_COEFS} and {MASK_SHARE_COEFS}")]
    BadShape {
        /// Row id.
        id: i64,
        /// Code coefficients found.
        code: usize,
        /// Mask coefficients found.
        mask: usize,
    },
    /// The id is already loaded.
    #[error("template {0} is already loaded")]
    DuplicateId(i64),
    /// Another loaded row of the same eye has this subject (a stale row was not removed).
    #[error("subject {subject:?} ({eye}) is already loaded under another id")]
    DuplicateSubject {
        /// The subject.
        subject: String,
        /// The eye.
        eye: &'static str,
    },
    /// The scan failed.
    #[error(transparent)]
    Dot(#[from] DotError),
}

/// What [`IrisStore::plan_sync`] found: the ids to load and the ids to drop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncPlan {
    /// Ids the table holds and the store does not (increasing).
    pub missing: Vec<i64>,
    /// Ids the store holds and the table no longer does (increasing).
    pub stale: Vec<i64>,
}

impl SyncPlan {
    /// True when the store already matches the table.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.stale.is_empty()
    }
}

/// The canonical entry order of one eye at one moment (module docs): what a search runs on.
#[derive(Debug)]
pub struct CanonicalOrder {
    /// Canonical position → physical row.
    rows: Vec<usize>,
    /// Subjects in canonical (sorted) order.
    pub subjects: Vec<String>,
    /// SHA-256 over the eye and, in canonical order, each entry's subject and enrolment id.
    pub digest: [u8; 32],
}

/// The rows of one eye.
#[derive(Default)]
struct EyeMatrix {
    /// Code rows, each starting a cache line (the scan's vector loads are never split).
    codes: AlignedU16s,
    /// Mask rows, likewise.
    masks: AlignedU16s,
    ids: Vec<i64>,
    subjects: Vec<String>,
    /// Each row's enrolment id ([`crate::iris::binding`]), committed to by the set digest.
    enrolments: Vec<EnrolmentId>,
    /// The subjects held, for the duplicate check.
    subject_set: HashSet<String>,
    /// The cached canonical order (behind a mutex so that concurrent searches, which hold
    /// the store shared, can fill it).
    order: Mutex<Option<Arc<CanonicalOrder>>>,
    /// Which physical rows changed, for backends that keep their own copy of the rows.
    journal: RowJournal,
}

impl EyeMatrix {
    fn len(&self) -> usize {
        self.ids.len()
    }

    /// Reserves room for `additional` more rows, at least an eighth of the current size.
    fn reserve(&mut self, additional: usize) {
        let rows = additional.max(self.len() / 8);
        let grow = |v: &mut AlignedU16s, per_row: usize| {
            if v.capacity() - v.len() < additional * per_row {
                v.reserve_exact(rows * per_row);
            }
        };
        grow(&mut self.codes, CODE_SHARE_COEFS);
        grow(&mut self.masks, MASK_SHARE_COEFS);
    }

    fn push(&mut self, t: StoredTemplate, enrolment: EnrolmentId) {
        self.reserve(1);
        self.codes.extend_from_slice(&t.share.code);
        self.masks.extend_from_slice(&t.share.mask);
        self.journal.record(self.ids.len());
        self.ids.push(t.id);
        self.enrolments.push(enrolment);
        self.subject_set.insert(t.subject.clone());
        self.subjects.push(t.subject);
        self.forget_order();
    }

    /// Removes physical row `row` by moving the last row into it; returns the id that moved
    /// (if any) so the caller can fix its index.
    fn swap_remove(&mut self, row: usize) -> Option<i64> {
        let last = self.len() - 1;
        if row != last {
            self.codes.copy_within(
                last * CODE_SHARE_COEFS..(last + 1) * CODE_SHARE_COEFS,
                row * CODE_SHARE_COEFS,
            );
            self.masks.copy_within(
                last * MASK_SHARE_COEFS..(last + 1) * MASK_SHARE_COEFS,
                row * MASK_SHARE_COEFS,
            );
        }
        self.journal.record(row);
        self.codes.truncate(last * CODE_SHARE_COEFS);
        self.masks.truncate(last * MASK_SHARE_COEFS);
        self.ids.swap_remove(row);
        self.enrolments.swap_remove(row);
        let subject = self.subjects.swap_remove(row);
        self.subject_set.remove(&subject);
        self.forget_order();
        (row != last).then(|| self.ids[row])
    }

    /// Drops the cached order after a change of the rows.
    fn forget_order(&mut self) {
        *self.order.get_mut().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn canonical(&self, eye: Eye) -> Arc<CanonicalOrder> {
        // Held while the order is computed, so concurrent searches of one eye compute it once.
        let mut cached = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(order) = cached.as_ref() {
            return Arc::clone(order);
        }
        let mut rows: Vec<usize> = (0..self.len()).collect();
        rows.sort_unstable_by(|&a, &b| self.subjects[a].cmp(&self.subjects[b]));
        let subjects: Vec<String> = rows.iter().map(|&r| self.subjects[r].clone()).collect();
        // v2: each entry's enrolment id is committed to with its subject, so a share
        // replaced or re-enrolled at one party changes that party's digest (binding.rs).
        let mut hash = Sha256::new();
        hash.update(b"privmatch iris set v2");
        hash.update([eye.to_byte()]);
        hash.update((subjects.len() as u64).to_le_bytes());
        for (s, &r) in subjects.iter().zip(&rows) {
            hash.update((s.len() as u64).to_le_bytes());
            hash.update(s.as_bytes());
            hash.update(self.enrolments[r]);
        }
        let order = Arc::new(CanonicalOrder {
            rows,
            subjects,
            digest: hash.finalize().into(),
        });
        *cached = Some(Arc::clone(&order));
        order
    }

    fn matrix(&self) -> Result<ShareMatrix<'_>, DotError> {
        Ok(ShareMatrix::new(&self.codes, &self.masks)?.tracked_by(&self.journal))
    }
}

/// The enrolled shares of one party, per eye (module docs).
pub struct IrisStore {
    me: PartyIndex,
    eyes: [EyeMatrix; 2],
    /// id → (eye, physical row).
    index: HashMap<i64, (Eye, usize)>,
}

fn eye_slot(eye: Eye) -> usize {
    match eye {
        Eye::Left => 0,
        Eye::Right => 1,
    }
}

impl IrisStore {
    /// An empty store of party `me`.
    pub fn new(me: PartyIndex) -> Self {
        IrisStore {
            me,
            eyes: Default::default(),
            index: HashMap::new(),
        }
    }

    /// The party whose shares this store holds.
    pub fn party(&self) -> PartyIndex {
        self.me
    }

    /// Number of templates held (both eyes).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when nothing is loaded.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Number of templates of one eye.
    pub fn len_of(&self, eye: Eye) -> usize {
        self.eyes[eye_slot(eye)].len()
    }

    /// Bytes of shares held (both eyes, excluding spare capacity).
    pub fn share_bytes(&self) -> usize {
        self.len() * SHARE_BYTES_PER_TEMPLATE
    }

    /// Bytes allocated for shares (including spare capacity).
    pub fn allocated_bytes(&self) -> usize {
        self.eyes
            .iter()
            .map(|e| 2 * (e.codes.capacity() + e.masks.capacity()))
            .sum()
    }

    /// Compares the ids the table holds (`committed`, any order, no duplicates) with the
    /// loaded ones.
    pub fn plan_sync(&self, committed: &[i64]) -> SyncPlan {
        let mut table: Vec<i64> = committed.to_vec();
        table.sort_unstable();
        let mut missing: Vec<i64> = table
            .iter()
            .copied()
            .filter(|id| !self.index.contains_key(id))
            .collect();
        missing.dedup();
        let mut stale: Vec<i64> = self
            .index
            .keys()
            .copied()
            .filter(|id| table.binary_search(id).is_err())
            .collect();
        stale.sort_unstable();
        SyncPlan { missing, stale }
    }

    /// Reserves room for `additional` rows of `eye` (before a bulk load).
    pub fn reserve(&mut self, eye: Eye, additional: usize) {
        self.eyes[eye_slot(eye)].reserve(additional);
    }

    /// Adds one row stored before enrolments were bound: its enrolment id is the legacy one
    /// ([`legacy_enrolment_id`]). See [`IrisStore::insert_enrolled`].
    pub fn insert(&mut self, t: StoredTemplate) -> Result<(), StoreError> {
        let enrolment = legacy_enrolment_id(&t.subject, t.eye);
        self.insert_enrolled(t, enrolment)
    }

    /// Adds one row with its enrolment id. Refuses another party's share, a wrong shape, a
    /// known id, or a subject the eye already holds under another id.
    pub fn insert_enrolled(
        &mut self,
        t: StoredTemplate,
        enrolment: EnrolmentId,
    ) -> Result<(), StoreError> {
        if t.share.party != self.me {
            return Err(StoreError::WrongParty {
                id: t.id,
                inside: t.share.party,
                me: self.me,
            });
        }
        if t.share.code.len() != CODE_SHARE_COEFS || t.share.mask.len() != MASK_SHARE_COEFS {
            return Err(StoreError::BadShape {
                id: t.id,
                code: t.share.code.len(),
                mask: t.share.mask.len(),
            });
        }
        if self.index.contains_key(&t.id) {
            return Err(StoreError::DuplicateId(t.id));
        }
        let matrix = &mut self.eyes[eye_slot(t.eye)];
        if matrix.subject_set.contains(&t.subject) {
            return Err(StoreError::DuplicateSubject {
                subject: t.subject,
                eye: t.eye.as_str(),
            });
        }
        self.index.insert(t.id, (t.eye, matrix.len()));
        matrix.push(t, enrolment);
        Ok(())
    }

    /// Removes the row with `id`; returns whether it was loaded.
    pub fn remove(&mut self, id: i64) -> bool {
        let Some((eye, row)) = self.index.remove(&id) else {
            return false;
        };
        if let Some(moved) = self.eyes[eye_slot(eye)].swap_remove(row) {
            self.index.insert(moved, (eye, row));
        }
        true
    }

    /// The canonical order of `eye` (cached until the eye changes).
    pub fn canonical(&self, eye: Eye) -> Arc<CanonicalOrder> {
        self.eyes[eye_slot(eye)].canonical(eye)
    }

    /// Scans every row of `eye` against every rotation of `query` with `backend` (the local
    /// dot products of [BGK+24] §4.3.2) and returns the dot-product shares in the canonical
    /// order `order` (entry-major, `order.subjects.len() × R`).
    pub fn scan(
        &self,
        eye: Eye,
        order: &CanonicalOrder,
        backend: &dyn ScanBackend,
        query: &PreparedQuery,
        interrupt: &Interrupt,
    ) -> Result<DotShares, StoreError> {
        let matrix = &self.eyes[eye_slot(eye)];
        let n = matrix.len();
        if order.rows.len() != n {
            return Err(StoreError::Dot(DotError::RangeOutOfBounds {
                start: 0,
                end: order.rows.len(),
                len: n,
            }));
        }
        let db = matrix.matrix()?;
        let r = query.num_rotations();
        let dots = backend.scan(&db, query, interrupt)?;
        Ok(DotShares {
            num_rotations: r,
            num_entries: n,
            code: permute_entries(&dots.code, &order.rows, r),
            mask: permute_entries(&dots.mask, &order.rows, r),
        })
    }
}

/// Reorders entry-major values (R per entry) so that canonical entry j takes physical entry
/// `rows[j]`.
fn permute_entries(values: &[u16], rows: &[usize], r: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(rows.len() * r);
    for &row in rows {
        out.extend_from_slice(&values[row * r..(row + 1) * r]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::dot::{scan, DotKernel};
    use crate::iris::encoding::share_template;
    use crate::iris::query::share_query_template;
    use crate::iris::scan::CpuScan;
    use crate::iris::synth::random_template;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn row(id: i64, subject: &str, eye: Eye, share: IrisShare) -> StoredTemplate {
        StoredTemplate {
            id,
            subject: subject.into(),
            eye,
            share,
        }
    }

    fn party0_store(n: usize, rng: &mut ChaCha20Rng) -> IrisStore {
        let mut store = IrisStore::new(PartyIndex::ALL[0]);
        for i in 0..n {
            let [s0, _, _] = share_template(&random_template(rng), rng).unwrap();
            let eye = if i % 3 == 0 { Eye::Right } else { Eye::Left };
            store
                .insert(row(i as i64 + 1, &format!("s{:03}", (i * 7) % n), eye, s0))
                .unwrap();
        }
        store
    }

    #[test]
    fn plan_sync_finds_missing_and_stale_ids() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let store = party0_store(5, &mut rng);
        let plan = store.plan_sync(&[9, 2, 3, 7, 5]);
        assert_eq!(plan.missing, vec![7, 9]);
        assert_eq!(plan.stale, vec![1, 4]);
        assert!(store.plan_sync(&[5, 4, 3, 2, 1]).is_empty());
    }

    #[test]
    fn the_journal_lists_the_rows_a_change_touched() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let mut store = party0_store(6, &mut rng);
        // party0_store puts ids 2, 3, 5, 6 in the left eye (rows 0..4).
        let left = &store.eyes[eye_slot(Eye::Left)];
        let before = left.journal.revision();
        let id = left.journal.id();
        assert_eq!(
            left.matrix().unwrap().journal().map(RowJournal::id),
            Some(id)
        );
        // Removing the first left row moves the last one into its place: row 0 changed.
        assert!(store.remove(2));
        let left = &store.eyes[eye_slot(Eye::Left)];
        assert_eq!(left.journal.rows_changed_since(before), Some(vec![0]));
        let [s0, _, _] = share_template(&random_template(&mut rng), &mut rng).unwrap();
        store.insert(row(40, "new", Eye::Left, s0)).unwrap();
        let left = &store.eyes[eye_slot(Eye::Left)];
        assert_eq!(left.journal.rows_changed_since(before), Some(vec![0, 3]));
        assert_eq!(left.journal.id(), id);
    }

    #[test]
    fn remove_keeps_index_and_rows_consistent() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let mut store = party0_store(12, &mut rng);
        let before = store.canonical(Eye::Left);
        assert!(store.remove(2));
        assert!(!store.remove(2));
        assert!(store.remove(5));
        assert_eq!(store.len(), 10);
        let after = store.canonical(Eye::Left);
        assert_eq!(after.subjects.len(), before.subjects.len() - 2);
        assert_ne!(after.digest, before.digest);
        let sorted: std::collections::BTreeMap<_, _> = store.index.iter().collect();
        for (&id, &(eye, r)) in sorted {
            assert_eq!(store.eyes[eye_slot(eye)].ids[r], id);
        }
        assert_eq!(store.share_bytes(), 10 * SHARE_BYTES_PER_TEMPLATE);
    }

    #[test]
    fn the_digest_commits_to_each_entrys_enrolment() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let shares: Vec<IrisShare> = (0..3)
            .map(|_| share_template(&random_template(&mut rng), &mut rng).unwrap()[0].clone())
            .collect();
        let build = |victim_enrolment: EnrolmentId| {
            let mut store = IrisStore::new(PartyIndex::ALL[0]);
            for (i, share) in shares.iter().enumerate() {
                let subject = ["alice", "bob", "victim"][i];
                let enrolment = if subject == "victim" {
                    victim_enrolment
                } else {
                    [i as u8; 32]
                };
                store
                    .insert_enrolled(
                        row(i as i64 + 1, subject, Eye::Left, share.clone()),
                        enrolment,
                    )
                    .unwrap();
            }
            store
        };
        let honest = build([7; 32]).canonical(Eye::Left).digest;
        assert_eq!(build([7; 32]).canonical(Eye::Left).digest, honest);
        // The same subjects and shares, the victim re-enrolled under another enrolment: another
        // digest, so the party's messages would not authenticate at its peers.
        assert_ne!(build([8; 32]).canonical(Eye::Left).digest, honest);
        // Legacy rows (no enrolment id stored) get the id every party derives alike.
        let mut legacy = IrisStore::new(PartyIndex::ALL[0]);
        legacy
            .insert(row(1, "victim", Eye::Left, shares[0].clone()))
            .unwrap();
        let mut explicit = IrisStore::new(PartyIndex::ALL[0]);
        explicit
            .insert_enrolled(
                row(9, "victim", Eye::Left, shares[1].clone()),
                legacy_enrolment_id("victim", Eye::Left),
            )
            .unwrap();
        assert_eq!(
            legacy.canonical(Eye::Left).digest,
            explicit.canonical(Eye::Left).digest
        );
    }

    #[test]
    fn refuses_foreign_share_duplicate_id_and_subject() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let mut store = party0_store(3, &mut rng);
        let [s0, s1, _] = share_template(&random_template(&mut rng), &mut rng).unwrap();
        assert!(matches!(
            store.insert(row(50, "x", Eye::Left, s1)),
            Err(StoreError::WrongParty { .. })
        ));
        assert!(matches!(
            store.insert(row(1, "x", Eye::Left, s0.clone())),
            Err(StoreError::DuplicateId(1))
        ));
        let taken = store.eyes[0].subjects[0].clone();
        assert!(matches!(
            store.insert(row(51, &taken, Eye::Left, s0)),
            Err(StoreError::DuplicateSubject { .. })
        ));
    }

    #[test]
    fn parallel_scan_in_canonical_order_equals_single_thread_scan_of_sorted_rows() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let mut store = party0_store(23, &mut rng);
        store.remove(4);
        let [p0, _, _] = share_query_template(&random_template(&mut rng), &mut rng).unwrap();
        let query = PreparedQuery::prepare(&p0, 2).unwrap();
        let order = store.canonical(Eye::Left);
        let kernel = DotKernel::detect();
        let got = store
            .scan(
                Eye::Left,
                &order,
                &CpuScan::new(kernel, 3),
                &query,
                Interrupt::never(),
            )
            .unwrap();
        // Reference: the rows copied in canonical order, scanned on one thread.
        let eye = &store.eyes[0];
        let mut codes = Vec::new();
        let mut masks = Vec::new();
        for &r in &order.rows {
            codes.extend_from_slice(&eye.codes[r * CODE_SHARE_COEFS..(r + 1) * CODE_SHARE_COEFS]);
            masks.extend_from_slice(&eye.masks[r * MASK_SHARE_COEFS..(r + 1) * MASK_SHARE_COEFS]);
        }
        let reference = scan(kernel, &ShareMatrix::new(&codes, &masks).unwrap(), &query).unwrap();
        assert_eq!(got.code, reference.code);
        assert_eq!(got.mask, reference.mask);
        assert!(order.subjects.windows(2).all(|w| w[0] < w[1]));
    }
}
