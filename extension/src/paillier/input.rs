//! What every Round 2 of Game-Set-MATCH [ABMR20] (Agrawal, Badrinarayanan, Mukherjee, Rindal,
//! CCS 2020, ePrint 2020/1363; Fig. 3, §6.1, Fig. 5) at the service provider starts with: the
//! terminal's input sealed to the SP, opened ([`open_input`]), and the stored record of the
//! device it names, checked now ([`checked_record`]). Used by the session's opening
//! ([`super::policy`]) and by the Round 2 functions ([`super::matching`], [`super::sessions`]).

use ed25519_dalek::VerifyingKey;
use pgrx::prelude::*;
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::terminal::TerminalInput;

use super::enroll::stored_record;
use super::service::{load_service, protocol_name};
use crate::errors::{get_one, raise};
use crate::identity::Identity;

/// A device's stored record, checked now: what Round 2 runs on.
pub(super) struct CheckedRecord {
    /// The signed record.
    pub signed: SignedTemplate,
    /// The SP's verifying key (σ verified under it).
    pub key: VerifyingKey,
    /// The time of the check (Unix seconds, the transaction's).
    pub now: i64,
}

/// Opens the terminal's sealed input as party `me` (08P01 from `function` if it was not sealed
/// to this party or was tampered with), for whichever protocol it names.
pub(super) fn open_input_any(
    function: &str,
    me: &Identity,
    terminal_input: &[u8],
) -> TerminalInput {
    TerminalInput::open(me.index, &me.secret, terminal_input).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("{function}: terminal_input: {e}"),
            None,
        )
    })
}

/// [`open_input_any`], then requires the input to be for `protocol` (22023 otherwise).
pub(super) fn open_input(
    function: &str,
    me: &Identity,
    terminal_input: &[u8],
    protocol: Protocol,
) -> TerminalInput {
    let input = open_input_any(function, me, terminal_input);
    if input.protocol != protocol {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{function}: the terminal input is for {}, this function runs {}",
                protocol_name(input.protocol),
                protocol_name(protocol)
            ),
            None,
        );
    }
    input
}

/// The stored record of the device `input` names, its signature and expiry checked now
/// ([ABMR20] Fig. 5 Round 2 step (1), done by the SP on its own record).
pub(super) fn checked_record(
    function: &str,
    device_id: &str,
    input: &TerminalInput,
) -> CheckedRecord {
    if input.device_id != device_id {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{function}: the terminal input is for device {:?}, not {device_id:?}",
                input.device_id
            ),
            None,
        );
    }
    let signed = stored_template(function, device_id);
    let protocol = signed.record.params.protocol();
    if protocol != input.protocol {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{function}: device {device_id:?} is enrolled for {}, the terminal asks for {}",
                protocol_name(protocol),
                protocol_name(input.protocol)
            ),
            None,
        );
    }
    let service = load_service(function);
    let key = VerifyingKey::from_bytes(&service.verifying).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{function}: the stored signing key is not an Ed25519 key"),
            None,
        )
    });
    let now = get_one::<i64>(function, "SELECT extract(epoch FROM now())::bigint", &[])
        .unwrap_or_default();
    if let Err(e) = signed.verify(&key, now) {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{function}: {e}"),
            Some("the device enrols again"),
        );
    }
    CheckedRecord { signed, key, now }
}

/// The stored record of `device_id`, decoded (P0002 if it is not enrolled, XX001 if the row
/// does not decode).
pub(super) fn stored_template(function: &str, device_id: &str) -> SignedTemplate {
    let bytes = stored_record(function, device_id);
    SignedTemplate::from_bytes(&bytes).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{function}: the record of {device_id:?}: {e}"),
            None,
        )
    })
}
