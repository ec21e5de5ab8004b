//! The face service the engine hosts at the evaluators P0 and P1: core's [`FaceService`]
//! (the opened dealer-masked templates and the running sessions; docs/protocols/face.md §5),
//! its templates read from `privmatch.face_masked_templates` and `privmatch.face_templates`
//! through [`TableSource`]. The worker ([`super::worker`]) refreshes it on its main thread
//! (SPI, inside the open's transaction) and runs the steps on request threads.
//!
//! Single use of a session id is the table `face_sessions`' job, single use of a stocked
//! dealing the table `face_stock_used`'s (the backend records the claim in the open's
//! transaction); the service keeps sessions and stocked dealings in memory only.
//!
//! Files: this one (the tables as core's `TemplateSource`, and the dispatch of a face call to
//! the service) and [`messages`] (what a backend and the service exchange, as calls of the
//! face modality in the modality-neutral frame).
//!
//! Imports: [`super::ipc`], the shared `crate::errors::read` (saved plans) and core's `face`;
//! no module of `crate::face`.

pub mod messages;

use std::time::Instant;

use pgrx::prelude::*;
use privmatch_core::crypto::seal::PartyKeys;
use privmatch_core::face::funshade::bytes_to_words;
use privmatch_core::face::service::{
    BundleId, FaceService, LoadProgress, OpenedTemplate, Refusal, ServiceError, TemplateSource,
};
use privmatch_core::party::PartyIndex;

use self::messages::{
    decode_chunks, decode_keys, decode_open, decode_round, encode_opened, face_reply,
    malformed_request, op,
};
use super::ipc::{EngineError, ErrorKind, Response};

/// The engine's error for a refused face call (the same kinds, one for one).
fn engine_error(err: ServiceError) -> EngineError {
    let kind = match err.kind {
        Refusal::BadParameter => ErrorKind::BadParameter,
        Refusal::UnknownSession => ErrorKind::UnknownSession,
        Refusal::NotReady => ErrorKind::NotReady,
        Refusal::Retry => ErrorKind::Retry,
        Refusal::Busy => ErrorKind::Busy,
        Refusal::Protocol => ErrorKind::Protocol,
        Refusal::Internal => ErrorKind::Internal,
    };
    EngineError::new(kind, err.message)
}

/// The party's face template tables, read through SPI in the caller's transaction.
pub struct TableSource;

fn spi_error(e: pgrx::spi::Error) -> ServiceError {
    ServiceError::internal(format!("reading the face template tables: {e}"))
}

fn malformed_row(what: &str) -> ServiceError {
    ServiceError::internal(format!(
        "privmatch.face_masked_templates holds a malformed {what}"
    ))
}

/// The first column of the first row of the read-only `query`, through its saved plan: the
/// worker runs the same few statements on every open, so they are parsed and planned once
/// (`crate::plans`), not on every verification.
fn first_value<T: pgrx::datum::FromDatum + pgrx::datum::IntoDatum>(
    query: &str,
) -> Result<Option<T>, ServiceError> {
    Spi::connect(|client| {
        let rows = crate::errors::read(client, query, &[]).map_err(spi_error)?;
        match rows.into_iter().next() {
            Some(row) => row.get::<T>(1).map_err(spi_error),
            None => Ok(None),
        }
    })
}

fn bundle_id(bytes: Vec<u8>) -> Result<BundleId, ServiceError> {
    bytes.try_into().map_err(|_| malformed_row("bundle id"))
}

impl TemplateSource for TableSource {
    fn has_masked_templates(&self) -> Result<bool, ServiceError> {
        first_value::<bool>("SELECT to_regclass('privmatch.face_masked_templates') IS NOT NULL")
            .map(|v| v.unwrap_or(false))
    }

    /// The epoch and every counter of `privmatch.face_set_version`, as this transaction's
    /// snapshot sees them.
    fn set_version(&self) -> Result<Option<String>, ServiceError> {
        let exists =
            first_value::<bool>("SELECT to_regclass('privmatch.face_set_version') IS NOT NULL")?
                .unwrap_or(false);
        if !exists {
            return Ok(None);
        }
        first_value::<String>(
            "SELECT string_agg(epoch::text || ':' || version, ',' ORDER BY shard) \
               FROM privmatch.face_set_version",
        )
    }

    fn opened_ids(&self, only: Option<&[BundleId]>) -> Result<Vec<BundleId>, ServiceError> {
        const ALL: &str = "SELECT m.bundle_id FROM privmatch.face_masked_templates m \
                             JOIN privmatch.face_templates t USING (bundle_id)";
        let listed = format!("{ALL} WHERE m.bundle_id = ANY($1)");
        Spi::connect(|client| {
            let rows = match only {
                None => crate::errors::read(client, ALL, &[]),
                Some(ids) => {
                    let keys: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
                    crate::errors::read(client, &listed, &[keys.into()])
                }
            }
            .map_err(spi_error)?;
            let mut ids = Vec::with_capacity(rows.len());
            for row in rows {
                ids.push(bundle_id(
                    row.get(1).map_err(spi_error)?.unwrap_or_default(),
                )?);
            }
            Ok(ids)
        })
    }

    fn enrolled_count(&self) -> Result<u64, ServiceError> {
        let count = Spi::get_one::<i64>("SELECT count(*) FROM privmatch.face_templates")
            .map_err(spi_error)?
            .unwrap_or(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }

    fn load(&self, ids: &[BundleId]) -> Result<Vec<OpenedTemplate>, ServiceError> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
        Spi::connect(|client| {
            let rows = client
                .select(
                    "SELECT m.bundle_id, t.subject, m.masked, m.seed, t.norm_share \
                       FROM privmatch.face_masked_templates m \
                       JOIN privmatch.face_templates t USING (bundle_id) \
                      WHERE m.bundle_id = ANY($1)",
                    None,
                    &[keys.into()],
                )
                .map_err(spi_error)?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                let id: Vec<u8> = row.get(1).map_err(spi_error)?.unwrap_or_default();
                let subject: String = row.get(2).map_err(spi_error)?.unwrap_or_default();
                let masked: Vec<u8> = row.get(3).map_err(spi_error)?.unwrap_or_default();
                let seed: Vec<u8> = row.get(4).map_err(spi_error)?.unwrap_or_default();
                let norm: i32 = row.get(5).map_err(spi_error)?.unwrap_or_default();
                out.push(OpenedTemplate {
                    id: bundle_id(id)?,
                    subject,
                    opened: bytes_to_words(&masked).map_err(|_| malformed_row("template"))?,
                    seed: seed.try_into().map_err(|_| malformed_row("seed"))?,
                    // The norm share is a Z_2^32 word kept in an int4 column.
                    norm: norm as u32,
                });
            }
            Ok(out)
        })
    }

    fn progress(&self, progress: LoadProgress) {
        match progress {
            LoadProgress::Loading { count } => {
                pgrx::log!("privmatch engine: loading {count} opened face templates")
            }
            LoadProgress::Loaded { held, seconds } => pgrx::log!(
                "privmatch engine: {held} opened face templates in memory, loaded in {seconds:.1} s"
            ),
        }
    }
}

/// Before an open (its request's `head` and `payload`): brings the held templates up to date
/// from the tables — only the listed ones for a short list, else all. Runs inside the
/// caller's transaction, on the worker's main thread.
pub fn refresh_for_open(
    face: &FaceService,
    me: PartyIndex,
    head: &[u8],
    payload: &[u8],
) -> Result<(), EngineError> {
    let req = decode_open(head, payload).map_err(malformed_request)?;
    face.refresh_for_open(me, req.wanted.as_deref(), &TableSource)
        .map_err(engine_error)
}

/// Runs one face call (on a request thread; calls nothing of Postgres): decodes it, runs the
/// service's step and encodes its answer.
pub fn handle(
    face: &FaceService,
    keys: Option<&PartyKeys>,
    call_op: u8,
    head: &[u8],
    payload: &[u8],
    now: Instant,
) -> Result<Response, EngineError> {
    face.expire(now);
    let answer = match call_op {
        op::OPEN => {
            let keys = keys.ok_or_else(|| EngineError::internal("an open without keys"))?;
            let req = decode_open(head, payload).map_err(malformed_request)?;
            face.open(keys, req, now)
                .map(|opened| encode_opened(&opened))
        }
        op::KEYS => {
            let (session, chunks) = decode_keys(head, payload).map_err(malformed_request)?;
            face.keys(session, &chunks, now)
        }
        op::STOCK => {
            let keys = keys.ok_or_else(|| EngineError::internal("a stock without keys"))?;
            let (stock, chunks) = decode_keys(head, payload).map_err(malformed_request)?;
            face.keep_stock(keys, stock, &chunks)
                .map(|held| (held as u32).to_le_bytes().to_vec())
        }
        op::ROUND => {
            let (session, round) = decode_round(head).map_err(malformed_request)?;
            face.round(session, round, payload, now)
        }
        op::KEYED_ROUND => {
            let (session, chunks, message) =
                decode_chunks(head, payload).map_err(malformed_request)?;
            face.keyed_round(session, &chunks, message, now)
        }
        _ => return Err(EngineError::internal("malformed face request")),
    };
    answer.map(face_reply).map_err(engine_error)
}
