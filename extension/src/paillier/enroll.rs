//! Enrolment Π_en of Game-Set-MATCH [ABMR20] (§6.1 "Overview", §8; Fig. 3 enrolment for Π1)
//! at the service provider, as two calls the coordinator relays between the device and the SP,
//! and the records' lifecycle (fetch, list, delete). Tables `privmatch.paillier_pending` and
//! `privmatch.paillier_devices`: `sql/paillier.sql`.
//!
//! The SP's state between the two calls (`ServiceEnrolment::to_bytes`: the request's
//! ciphertexts and the seed of the norm challenge, as secret as α) is a row of
//! `paillier_pending`, readable by no role; it lives [`PENDING_TTL`] and is removed by the
//! finishing call or swept by the next `paillier_enroll_begin`.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use privmatch_core::paillier::device_signature::{self, Statement};
use privmatch_core::paillier::enroll::{request_header, EnrolError, ServiceEnrolment};
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::record::{check_device_id, SignedTemplate};

use super::service::{configured_params, load_service, signing_key};
use super::{raise_enrol, require_sp};
use crate::datum::{share_datum, type_oid};
use crate::errors::{get_one, modify, raise, run, select};
use crate::operator::accept_command;

/// How long a begun enrolment waits for its second call (SQL interval).
const PENDING_TTL: &str = "10 minutes";

/// Longest caller session id accepted (bytes).
const MAX_SESSION: usize = 256;

fn check_id(function: &str, device_id: &str) {
    if let Err(e) = check_device_id(device_id) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: device_id: {e}"),
            None,
        );
    }
}

fn enrolled(function: &str, device_id: &str) -> bool {
    get_one::<bool>(
        function,
        "SELECT EXISTS (SELECT 1 FROM privmatch.paillier_devices WHERE device_id = $1)",
        &[device_id.into()],
    )
    .unwrap_or(false)
}

fn already_enrolled(function: &str, device_id: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
        format!("{function}: device {device_id:?} is already enrolled"),
        Some("to enrol it again the device deletes it first with its signature (privmatch.paillier_delete), or its SP's operator with a signed command (privmatch.paillier_delete_signed)"),
    )
}

/// The SP's first step of Π_en ([ABMR20] §6.1, §8): decodes the device's request strictly
/// against the parameters configured for its protocol, verifies the key proof (Π^mod, Π^fac
/// in the SP's ring-Pedersen parameters) and the plaintext-knowledge proof (Fig. 9), keeps
/// the state and returns the norm challenge (Fig. 10); NULL for Π1 (no proofs, Fig. 3).
/// `session` (1 to 256 bytes) is the caller's session id both proofs are bound to. Refuses a
/// device already enrolled (23505) and, changing nothing, any malformed or refused request.
/// A second begin for the same device replaces its pending enrolment.
#[pg_extern(volatile)]
fn paillier_enroll_begin(device_id: &str, request: &[u8], session: &[u8]) -> Option<Vec<u8>> {
    const F: &str = "paillier_enroll_begin";
    require_sp(F);
    check_id(F, device_id);
    if session.is_empty() || session.len() > MAX_SESSION {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{F}: session must be 1 to {MAX_SESSION} bytes, got {}",
                session.len()
            ),
            None,
        );
    }
    let (named, params) = request_header(request).unwrap_or_else(|e| raise_enrol(F, e));
    if named != device_id {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: the request is for device {named:?}, not {device_id:?}"),
            None,
        );
    }
    let (expected, _) = configured_params(F, params.protocol());
    let service = load_service(F);
    run(
        F,
        &format!(
            "DELETE FROM privmatch.paillier_pending WHERE created_at < now() - interval '{PENDING_TTL}'"
        ),
        &[],
    );
    if enrolled(F, device_id) {
        already_enrolled(F, device_id);
    }
    // The challenge's exponentiations run on the core's pool, whose threads start with every
    // signal blocked (`signals::spawn_pool_thread`): PostgreSQL's handlers stay on this thread.
    let threads = super::threads();
    let (state, challenge) = ServiceEnrolment::receive_parallel(
        request,
        &expected,
        &service.ring_pedersen,
        session,
        threads,
        &mut rand::rngs::OsRng,
    )
    .unwrap_or_else(|e| raise_enrol(F, e));
    let state = zeroize::Zeroizing::new(state.to_bytes().unwrap_or_else(|e| raise_enrol(F, e)));
    run(
        F,
        "INSERT INTO privmatch.paillier_pending (device_id, state) VALUES ($1, $2) \
         ON CONFLICT (device_id) DO UPDATE SET state = EXCLUDED.state, created_at = now()",
        &[device_id.into(), state.to_vec().into()],
    );
    challenge
}

/// The SP's last step of Π_en ([ABMR20] §6.1, §8, Fig. 10 last step): checks the device's
/// norm `response` (NULL for Π1), packs the first ℓ ciphertexts (§6.1, D.1 step 2), signs the
/// record (σ) with the SP's key, valid for the configured days, stores it and removes the
/// pending state, in one transaction. Returns the signed record (what the device keeps and
/// verifies). Refuses an unknown or expired pending enrolment (P0002) and a device enrolled
/// meanwhile (23505), storing nothing.
///
/// The norm challenge is single use: a device must not get a second answer checked against
/// the same hidden MAC key α (each refusal tells it something about α). So a response the
/// SP refuses (malformed, or the proof fails) is not an ERROR — that would roll back the
/// removal of the pending state — but **NULL**, with a WARNING (SQLSTATE 08P01) giving the
/// reason: the pending enrolment is gone, nothing is stored, and the device must begin again
/// with a fresh challenge.
#[pg_extern(volatile)]
fn paillier_enroll_finish(device_id: &str, response: Option<&[u8]>) -> Option<Vec<u8>> {
    const F: &str = "paillier_enroll_finish";
    require_sp(F);
    check_id(F, device_id);
    let state = modify(
        F,
        &format!(
            "DELETE FROM privmatch.paillier_pending WHERE device_id = $1 \
             AND created_at >= now() - interval '{PENDING_TTL}' RETURNING state"
        ),
        &[device_id.into()],
        |row| zeroize::Zeroizing::new(row.get::<Vec<u8>>(1).unwrap_or_default()),
    );
    let Some(state) = state.into_iter().next() else {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!(
                "{F}: no pending enrolment for device {device_id:?} (never begun, finished, or older than {PENDING_TTL})"
            ),
            Some("begin again with privmatch.paillier_enroll_begin()"),
        )
    };
    if enrolled(F, device_id) {
        already_enrolled(F, device_id);
    }
    let sp = ServiceEnrolment::from_bytes(&state).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{F}: the pending enrolment of {device_id:?}: {e}"),
            None,
        )
    });
    let service = load_service(F);
    let key = signing_key(F, &service);
    let protocol = sp_protocol(&sp);
    let (_, days) = configured_params(F, protocol);
    let expires_at = get_one::<i64>(
        F,
        "SELECT extract(epoch FROM now() + make_interval(days => $1))::bigint",
        &[days.into()],
    )
    .unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("{F}: no time"),
            None,
        )
    });
    let signed = match sp.finish(response, &key, expires_at) {
        Ok(signed) => signed,
        // A local failure after the checks (packing, signing) says nothing about α: raise it.
        Err(e @ EnrolError::Internal(_)) => raise_enrol(F, e),
        Err(e) => {
            refused(F, device_id, &e);
            return None;
        }
    };
    let bytes = signed.to_bytes().unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("{F}: {e}"),
            None,
        )
    });
    let inserted = modify(
        F,
        "INSERT INTO privmatch.paillier_devices (device_id, protocol, record, expires_at) \
         VALUES ($1, $2, $3, to_timestamp($4)) ON CONFLICT (device_id) DO NOTHING RETURNING 1",
        &[
            device_id.into(),
            i16::from(protocol.code()).into(),
            share_datum(&bytes, type_oid("privmatch.paillier_template")),
            (expires_at as f64).into(),
        ],
        |_| (),
    );
    if inserted.is_empty() {
        already_enrolled(F, device_id);
    }
    Some(bytes)
}

/// Reports a refused norm answer as a WARNING (08P01) naming the device and the reason; the
/// caller returns NULL so that the removal of the pending state commits.
fn refused(function: &str, device_id: &str, err: &EnrolError) {
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
        format!("{function}: the answer of device {device_id:?} is refused: {err}"),
        "privmatch",
    )
    .set_hint(
        "the enrolment is void (its challenge is single use) and nothing was stored; \
         begin again with privmatch.paillier_enroll_begin()",
    )
    .report(PgLogLevel::WARNING);
}

/// The protocol of a pending enrolment (its parameters).
fn sp_protocol(sp: &ServiceEnrolment) -> Protocol {
    sp.params().protocol()
}

/// The device's side of a deletion: the device signs core's `Statement::delete` (its id and
/// SHA-256 of the record the SP stores) with its enrolled Paillier key (RSA-FDH, core's
/// `device_signature`); the coordinator, which relays it, cannot make one, and a captured one
/// deletes nothing enrolled later.
fn check_delete_signature(function: &str, device_id: &str, signature: &[u8]) {
    let bytes = stored_record(function, device_id);
    let signed = SignedTemplate::from_bytes(&bytes).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{function}: the record of {device_id:?}: {e}"),
            None,
        )
    });
    let statement = Statement::delete(device_id, &bytes);
    if let Err(e) = device_signature::verify(&signed.record.public_key, &statement, signature) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            format!("{function}: device {device_id:?} did not sign this deletion: {e}"),
            Some(
                "the device signs its deletion with its key (privmatch device delete); for a \
                 lost device its SP's operator signs a paillier-delete command \
                 (privmatch.paillier_delete_signed)",
            ),
        );
    }
}

/// Removes `device_id`'s record, pending enrolment and running sessions: true when a record
/// was removed.
fn remove_device(function: &str, device_id: &str) -> bool {
    for table in ["paillier_pending", "paillier_sessions"] {
        run(
            function,
            &format!("DELETE FROM privmatch.{table} WHERE device_id = $1"),
            &[device_id.into()],
        );
    }
    !modify(
        function,
        "DELETE FROM privmatch.paillier_devices WHERE device_id = $1 RETURNING 1",
        &[device_id.into()],
        |_| (),
    )
    .is_empty()
}

/// Deletes the record of `device_id` (and any pending enrolment and running Π2/Π3 session of
/// it) at the device's request: `signature` is the device's signature of the deletion of the
/// record the SP stores (core's `Statement::delete`, made with the Paillier key in that record),
/// refused with 28000 otherwise (nothing removed). An unknown device: P0002. Since a device id
/// can be enrolled again only once its record is gone, this also guards re-enrolment: neither
/// the coordinator nor anyone without the device's key can free a device's id for an
/// impostor's template (issue 34 item 10). For a lost device: [`paillier_delete_signed`].
/// After this, terminals can no longer be served its template by this SP (records already
/// handed out remain valid under σ until they expire, [ABMR20] §6.1).
#[pg_extern(volatile)]
fn paillier_delete(device_id: &str, signature: &[u8]) -> bool {
    const F: &str = "paillier_delete";
    require_sp(F);
    check_id(F, device_id);
    check_delete_signature(F, device_id, signature);
    remove_device(F, device_id)
}

/// The operator command action that deletes a device (payload: the device id, UTF-8).
pub const DELETE_ACTION: &str = "paillier-delete";

/// Deletes a device whose key is lost, on its SP operator's signed command (core's
/// `crypto::sign`, action `paillier-delete`, payload the device id): relayed by the
/// coordinator or any tool, which can neither forge nor replay it (28000, nothing removed;
/// 55000 when the operator has set no key). Returns whether a record was removed.
#[pg_extern(volatile)]
fn paillier_delete_signed(command: &[u8]) -> bool {
    const F: &str = "paillier_delete_signed";
    require_sp(F);
    let payload = accept_command(F, DELETE_ACTION, command);
    let device_id = std::str::from_utf8(&payload).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: the command's device id is not UTF-8"),
            None,
        )
    });
    check_id(F, device_id);
    remove_device(F, device_id)
}

/// The stored signed record of `device_id` or P0002 from `function`.
pub(super) fn stored_record(function: &str, device_id: &str) -> Vec<u8> {
    get_one::<Vec<u8>>(
        function,
        "SELECT (SELECT privmatch.paillier_template_send(record) \
         FROM privmatch.paillier_devices WHERE device_id = $1)",
        &[device_id.into()],
    )
    .unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("{function}: device {device_id:?} is not enrolled"),
            None,
        )
    })
}

/// The signed template record of `device_id` (σ of [ABMR20] §6.1, with the packed
/// ciphertexts and the public key): what the device presents in Round 1 and the terminal
/// verifies. P0002 when the device is not enrolled.
#[pg_extern(stable)]
fn paillier_device(device_id: &str) -> Vec<u8> {
    const F: &str = "paillier_device";
    require_sp(F);
    check_id(F, device_id);
    let bytes = stored_record(F, device_id);
    // Decoded once more so a corrupted row is reported here, not by a device.
    if let Err(e) = SignedTemplate::from_bytes(&bytes) {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{F}: the record of {device_id:?}: {e}"),
            None,
        );
    }
    bytes
}

/// The enrolled devices ([ABMR20] §6.1 records): id, protocol, expiry and enrolment time.
#[pg_extern(stable)]
fn paillier_devices() -> TableIterator<
    'static,
    (
        name!(device_id, String),
        name!(protocol, String),
        name!(expires_at, Option<TimestampWithTimeZone>),
        name!(enrolled_at, Option<TimestampWithTimeZone>),
    ),
> {
    const F: &str = "paillier_devices";
    require_sp(F);
    let rows = select(
        F,
        "SELECT device_id, protocol, expires_at, enrolled_at FROM privmatch.paillier_devices \
         ORDER BY device_id",
        &[],
        |row| {
            let name = row
                .get::<i16>(2)
                .and_then(|c| u8::try_from(c).ok())
                .and_then(|c| Protocol::from_code(c).ok())
                .map_or("?", Protocol::name);
            (
                row.get::<String>(1).unwrap_or_default(),
                name.to_owned(),
                row.get::<TimestampWithTimeZone>(3),
                row.get::<TimestampWithTimeZone>(4),
            )
        },
    );
    TableIterator::new(rows)
}
