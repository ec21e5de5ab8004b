//! The iris search service the engine hosts: the in-memory share matrix ([`IrisStore`]), kept
//! in step with `privmatch.iris_templates`, and the running searches ([`SearchService`], the
//! protocol of Bloemen et al., "Large-Scale MPC: Scaling Private Iris Code Uniqueness Checks
//! to Millions of Users", ePrint 2024/705). The worker ([`super::worker`]) refreshes it on its
//! main thread (SPI) and runs starts and rounds on request threads, concurrently.
//!
//! Consistency: before every search start the worker runs [`IrisSearch::refresh`] in a fresh
//! transaction: it reads the ids the table holds (so every enrolment committed before the
//! search started is seen) and loads missing rows / drops deleted ones. After a restart it
//! rebuilds everything from the table.
//!
//! Concurrency: the store sits behind a read-write lock. Scans hold it shared, so searches
//! run side by side; a refresh that finds the table unchanged takes it shared too, and one
//! that must load or drop rows takes it exclusively, waiting for the running scans to end
//! (enrolments and searches interleave; searches of an unchanged set never wait for each
//! other).
//!
//! Files: this one (the service), [`messages`] (what a backend and the service exchange, as
//! calls of the iris modality in the modality-neutral frame) and [`backend`] (the choice of
//! the scan backend: the CPU, or the GPUs of `privmatch.gpu`).
//!
//! Imports: [`super::ipc`], [`crate::identity`], [`crate::budget`] and core's `iris`; this is where the engine
//! depends on the iris modality (of core, not `crate::iris`).

pub mod backend;
pub mod messages;

use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;
use privmatch_core::crypto::seal::PartyKeys;
use privmatch_core::iris::binding::EnrolmentId;
use privmatch_core::iris::encoding::IrisShare;
use privmatch_core::iris::enroll::{BundleError, Eye};
use privmatch_core::iris::params::SearchParams;
use privmatch_core::iris::policy::IrisPolicy;
use privmatch_core::iris::probe::ProbeRefusal;
use privmatch_core::iris::scan::{Interrupt, ScanBackend};
use privmatch_core::iris::service::{
    BatchEnrolment, BatchRound, BatchStart, SealedRound, SearchError, SearchService,
};
use privmatch_core::iris::store::{IrisStore, StoredTemplate};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::{decode_share, ShareKind};

use self::messages::IrisReply;
use super::ipc::{EngineError, ErrorKind, Response};
use super::keys::read_keys;
use crate::budget::BudgetKind;

/// Rows loaded per SPI query.
const LOAD_CHUNK: usize = 256;

/// The engine's error for a refused search call.
fn search_error(err: SearchError) -> EngineError {
    let kind = match &err {
        // A probe called with other parameters than sealed, or too old: the call's
        // parameters are wrong for this probe.
        // A probe replayed inside a batch, as a replayed session id.
        SearchError::ProbeRefused(ProbeRefusal::Replayed) => ErrorKind::UnknownSession,
        SearchError::BadParameter(_) | SearchError::ProbeRefused(_) => ErrorKind::BadParameter,
        SearchError::UnknownSession(_) | SearchError::ReplayedSession(_) => {
            ErrorKind::UnknownSession
        }
        SearchError::Probe(e) if e.is_for_another_party() => ErrorKind::OtherParty,
        SearchError::Probe(_) => ErrorKind::Probe,
        SearchError::PeerNotPinned(_) => ErrorKind::NotReady,
        SearchError::WrongRound { .. }
        | SearchError::Channel { .. }
        | SearchError::Protocol { .. } => ErrorKind::Protocol,
        SearchError::TooManySearches(_) | SearchError::NoWorkMemory { .. } => ErrorKind::Busy,
        SearchError::BatchSize(_)
        | SearchError::BatchTooLarge { .. }
        | SearchError::EnrolmentBatch(_) => ErrorKind::BadParameter,
        // Also a scan stopped because its backend hung up (nobody reads that answer).
        SearchError::Store(_) => ErrorKind::Internal,
    };
    EngineError::new(kind, err.to_string())
}

/// Seconds since the Unix epoch: the wall clock bounds a probe's age (its sealing time is
/// inside it); a clock before 1970 reads as 0 and refuses every probe rather than accepting
/// stale ones.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn spi_error(e: pgrx::spi::Error) -> EngineError {
    EngineError::internal(format!("reading the template table: {e}"))
}

/// Charges `count` iris searches (a batch's probes) as [`charge_search`] does, in the same
/// transaction: a budget that cannot pay for all of them refuses the batch and, the
/// transaction rolling back, charges none.
pub(super) fn charge_searches(count: usize) -> Result<(), EngineError> {
    for _ in 0..count {
        charge_search()?;
    }
    Ok(())
}

/// Charges one iris search to this party's `iris-search` budget (`crate::budget`) in the
/// current transaction, which is the engine's own: the worker commits it before the start is
/// answered, so a caller that runs start and rounds in one transaction and rolls it back keeps
/// the answer but not an uncharged search (docs/trust-model.md §5). A spent budget is refused
/// with 53400 ([`ErrorKind::Busy`]), before the probe is opened.
pub(super) fn charge_search() -> Result<(), EngineError> {
    PgTryBuilder::new(|| {
        crate::budget::charge("iris_search_start", BudgetKind::IrisSearch, "");
        Ok(())
    })
    .catch_when(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        |caught| {
            let message = match &caught {
                CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => {
                    r.message().to_owned()
                }
                CaughtError::RustPanic { ereport, .. } => ereport.message().to_owned(),
            };
            Err(EngineError::new(ErrorKind::Busy, message))
        },
    )
    .execute()
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

/// One row of the template table as loaded: the template and its enrolment id.
fn decode_row(
    me: PartyIndex,
    id: i64,
    subject: String,
    eye: &str,
    code: &[u8],
    mask: &[u8],
    enrolment: &[u8],
) -> Result<(StoredTemplate, EnrolmentId), EngineError> {
    let bad = |what: String| EngineError::internal(format!("template {id}: {what}"));
    let eye = Eye::parse(eye).map_err(|e: BundleError| bad(e.to_string()))?;
    let code = decode_share(ShareKind::IrisCode, code).map_err(|e| bad(e.to_string()))?;
    let mask = decode_share(ShareKind::IrisMask, mask).map_err(|e| bad(e.to_string()))?;
    let enrolment: EnrolmentId = enrolment
        .try_into()
        .map_err(|_| bad(format!("enrolment id of {} bytes", enrolment.len())))?;
    if code.party != me || mask.party != me {
        return Err(bad(format!(
            "holds a share of {}, this is {me}",
            code.party
        )));
    }
    Ok((
        StoredTemplate {
            id,
            subject,
            eye,
            share: IrisShare {
                party: me,
                code: code.coefs(),
                mask: mask.coefs(),
            },
        },
        enrolment,
    ))
}

fn load_rows(
    me: PartyIndex,
    ids: &[i64],
) -> Result<Vec<(StoredTemplate, EnrolmentId)>, EngineError> {
    Spi::connect(|client| {
        let rows = client
            .select(
                "SELECT id, subject, eye::text, privmatch.iris_code_share_send(code_share), \
                 privmatch.iris_mask_share_send(mask_share), enrolment_id \
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
            let enrolment: Vec<u8> = row.get(6).map_err(spi_error)?.unwrap_or_default();
            out.push(decode_row(me, id, subject, &eye, &code, &mask, &enrolment)?);
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
        for (row, enrolment) in load_rows(store.party(), chunk)? {
            store
                .insert_enrolled(row, enrolment)
                .map_err(|e| EngineError::internal(e.to_string()))?;
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

/// The iris search service of the engine (module docs). Cloning shares it: the worker's
/// main thread refreshes it, request threads start and step searches through their clones.
#[derive(Clone)]
pub struct IrisSearch {
    store: Arc<RwLock<Option<IrisStore>>>,
    /// The running searches (the worker aborts and expires them, and reports their count and
    /// scan backend, directly).
    pub service: Arc<SearchService>,
}

impl IrisSearch {
    /// No templates loaded yet; searches scan with `backend`, are dropped after `timeout`
    /// without a request, and hold at most `work_mem_mib` MiB of working memory together
    /// (core's `SearchService::with_work_mem_mib`).
    pub fn new(backend: Arc<dyn ScanBackend>, timeout: Duration, work_mem_mib: usize) -> Self {
        IrisSearch {
            store: Arc::new(RwLock::new(None)),
            service: Arc::new(SearchService::new(backend, timeout).with_work_mem_mib(work_mem_mib)),
        }
    }

    // A panic while the lock was held (a bug) leaves the store as the last completed insert
    // or remove left it, and the next refresh repairs any difference with the table, so the
    // lock's poison is ignored.
    fn read_store(&self) -> RwLockReadGuard<'_, Option<IrisStore>> {
        self.store.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_store(&self) -> RwLockWriteGuard<'_, Option<IrisStore>> {
        self.store.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Brings the store up to date with the table (module docs) and returns the keys. Runs
    /// inside the caller's transaction, on the worker's main thread.
    pub fn refresh(&self) -> Result<PartyKeys, EngineError> {
        if !extension_created()? {
            return Err(EngineError::new(
                ErrorKind::NotReady,
                "CREATE EXTENSION privmatch has not run in the engine's database (privmatch.database)",
            ));
        }
        let keys = read_keys()?;
        let ids = committed_ids()?;
        let changed_party =
            || EngineError::internal("the party index changed under the running engine");
        if let Some(store) = self.read_store().as_ref() {
            if store.party() != keys.me {
                return Err(changed_party());
            }
            if store.plan_sync(&ids).is_empty() {
                return Ok(keys);
            }
        }
        let mut guard = self.write_store();
        let store = guard.get_or_insert_with(|| IrisStore::new(keys.me));
        if store.party() != keys.me {
            return Err(changed_party());
        }
        sync_store(store, &ids)?;
        Ok(keys)
    }

    /// Starts search `session` with `keys` (from [`IrisSearch::refresh`]); its scan stops
    /// early once `interrupt` is raised. Calls nothing of Postgres (runs on a request thread).
    pub fn start(
        &self,
        keys: &PartyKeys,
        session: [u8; 16],
        probe: &[u8],
        policy: IrisPolicy,
        now: Instant,
        interrupt: &Interrupt,
    ) -> Result<Response, EngineError> {
        let guard = self.read_store();
        let store = guard
            .as_ref()
            .ok_or_else(|| EngineError::internal("no store"))?;
        self.service
            .start(
                store,
                keys,
                session,
                probe,
                policy,
                now,
                unix_now(),
                interrupt,
            )
            .map_err(search_error)
            .map(|r| {
                IrisReply::Started {
                    entries: r.entries as u64,
                    digest: r.digest,
                    message: r.message,
                }
                .into_response()
            })
    }

    /// Starts a batch of searches (core's `SearchService::start_batch`) with `keys` (from
    /// [`IrisSearch::refresh`]); as [`IrisSearch::start`] otherwise.
    // The batch's fields as the call carried them.
    #[allow(clippy::too_many_arguments)]
    pub fn start_batch(
        &self,
        keys: &PartyKeys,
        batch: [u8; 16],
        params: SearchParams,
        eye: Eye,
        probes: &[([u8; 16], Vec<u8>)],
        enrolments: &[(Vec<u8>, Vec<u8>)],
        policy: IrisPolicy,
        now: Instant,
        interrupt: &Interrupt,
    ) -> Result<Response, EngineError> {
        let guard = self.read_store();
        let store = guard
            .as_ref()
            .ok_or_else(|| EngineError::internal("no store"))?;
        let probes: Vec<([u8; 16], &[u8])> =
            probes.iter().map(|(id, p)| (*id, p.as_slice())).collect();
        let enrolments: Vec<BatchEnrolment<'_>> = enrolments
            .iter()
            .map(|(envelope, hashes)| BatchEnrolment { envelope, hashes })
            .collect();
        let start = BatchStart {
            batch,
            params,
            eye,
            probes: &probes,
            enrolments: &enrolments,
        };
        self.service
            .start_batch(store, keys, &start, policy, now, unix_now(), interrupt)
            .map_err(search_error)
            .map(|r| {
                IrisReply::BatchStarted {
                    entries: r.start.entries as u64,
                    digest: r.start.digest,
                    message: r.start.message,
                    refused: r.refused.into_iter().map(|e| e.map(search_error)).collect(),
                }
                .into_response()
            })
    }

    /// Runs round `round` of batch `batch` with the message of party i−1; at the end, every
    /// probe's sealed output or refusal. Calls nothing of Postgres (runs on a request thread).
    pub fn round_batch(
        &self,
        batch: [u8; 16],
        round: u32,
        message: &[u8],
        now: Instant,
    ) -> Result<Response, EngineError> {
        self.service
            .round_batch(batch, round, message, now)
            .map_err(search_error)
            .map(|reply| match reply {
                BatchRound::Continue(m) => IrisReply::Continue(m),
                BatchRound::Finished(outputs) => IrisReply::BatchFinished(
                    outputs
                        .into_iter()
                        .map(|o| o.map(|o| (o.sealed, o.disclosed_unique)))
                        .collect(),
                ),
            })
            .map(IrisReply::into_response)
    }

    /// Runs round `round` of search `session` with the message of party i−1. Calls nothing
    /// of Postgres (runs on a request thread).
    pub fn round(
        &self,
        session: [u8; 16],
        round: u32,
        message: &[u8],
        now: Instant,
    ) -> Result<Response, EngineError> {
        self.service
            .round_sealed(session, round, message, now)
            .map_err(search_error)
            .map(|reply| match reply {
                SealedRound::Continue(m) => IrisReply::Continue(m),
                SealedRound::Finished(output) => IrisReply::Finished {
                    sealed: output.sealed,
                    disclosed_unique: output.disclosed_unique,
                },
            })
            .map(IrisReply::into_response)
    }

    /// Templates in memory.
    pub fn templates(&self) -> usize {
        self.read_store().as_ref().map_or(0, |s| s.len())
    }

    /// Bytes of shares in memory.
    pub fn share_bytes(&self) -> usize {
        self.read_store().as_ref().map_or(0, |s| s.share_bytes())
    }
}
