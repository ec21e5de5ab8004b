//! What every Round 2 of Game-Set-MATCH [ABMR20] (Agrawal, Badrinarayanan, Mukherjee, Rindal,
//! CCS 2020, ePrint 2020/1363; Fig. 3, §6.1, Fig. 5) at the service provider starts with: the
//! terminal's input sealed to the SP, admitted as a registered client's signed input and opened
//! ([`open_input_any`] when the session is opened, [`open_input`] in Round 2), and the stored
//! record of the device it names, checked now ([`checked_record`]). Used by the session's
//! opening ([`super::policy`]) and by the Round 2 functions ([`super::matching`],
//! [`super::sessions`]).
//!
//! A terminal input is a sealed input like an iris or face probe (issue 34 item 4;
//! docs/trust-model.md §5): the terminal signs it for the SP's party and the purpose
//! [`TERMINAL_INPUT_PURPOSE`] with its registered client key (core's `crypto::client_auth`),
//! and the SP admits it through [`crate::clients`] before it opens the box inside, so under
//! the client-auth policy `required` the coordinator cannot open sessions (nor spend the
//! per-device and per-terminal session budgets) with inputs it sealed itself. The same bytes
//! arrive twice, at `paillier_session_open` and at the session's Round 2 function: the first
//! admission records the signature's nonce (a terminal input is single use), the second checks
//! the signature again without recording it (the session itself is single use there: one
//! Round 2 per session, `policy::admit_round2`).

use ed25519_dalek::VerifyingKey;
use pgrx::prelude::*;
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::terminal::{TerminalInput, TERMINAL_INPUT_PURPOSE};

use super::enroll::stored_record;
use super::service::load_service;
use crate::clients;
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

/// The name of the SQL argument a terminal input arrives as (in refusals).
const ARGUMENT: &str = "terminal_input";

/// Admits the terminal's input as a sealed input signed by a registered client
/// ([`clients::admit`], purpose [`TERMINAL_INPUT_PURPOSE`], no per-client budget: the SP's
/// per-device and per-terminal session budgets apply; 28000 for a signature that does not
/// check, a replayed one, or an unsigned input under the policy `required`; 22023 for a
/// malformed one), recording its nonce, then opens it as party `me` (08P01 from `function` if
/// it was not sealed to this party or was tampered with), for whichever protocol it names.
/// What `paillier_session_open` starts with.
pub(super) fn open_input_any(
    function: &str,
    me: &Identity,
    terminal_input: &[u8],
) -> TerminalInput {
    let admitted = clients::admit(
        function,
        ARGUMENT,
        TERMINAL_INPUT_PURPOSE,
        me.index,
        terminal_input,
        None,
    );
    open_inner(function, me, admitted.inner)
}

/// Opens the sealed box `inner` (a terminal input without its client signature) as party `me`
/// (08P01 from `function` if it was not sealed to this party or was tampered with).
fn open_inner(function: &str, me: &Identity, inner: &[u8]) -> TerminalInput {
    TerminalInput::open(me.index, &me.secret, inner).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("{function}: terminal_input: {e}"),
            None,
        )
    })
}

/// The Round 2 functions' opening of the terminal input their session was opened with: the
/// client signature checked again as [`open_input_any`] checks it (registered, unrevoked
/// client, signed for this party and [`TERMINAL_INPUT_PURPOSE`], unexpired; an unsigned input
/// refused under the policy `required`; 28000), but its nonce not recorded a second time — the
/// session was opened with these bytes, which recorded it, and the session allows one Round 2
/// (`policy::admit_round2`, 23505). `clients::admit_single_use` is the admission that checks
/// without recording.
/// Then the input is opened (08P01) and must be for `protocol` (22023 otherwise).
pub(super) fn open_input(
    function: &str,
    me: &Identity,
    terminal_input: &[u8],
    protocol: Protocol,
) -> TerminalInput {
    let admitted = clients::admit_single_use(
        function,
        ARGUMENT,
        TERMINAL_INPUT_PURPOSE,
        me.index,
        terminal_input,
    );
    let input = open_inner(function, me, admitted.inner);
    if input.protocol != protocol {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{function}: the terminal input is for {}, this function runs {}",
                input.protocol.name(),
                protocol.name()
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
                protocol.name(),
                input.protocol.name()
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
