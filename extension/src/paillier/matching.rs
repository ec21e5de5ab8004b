//! The terminal's Round 2 computed at the service provider (Game-Set-MATCH [ABMR20]: the SP
//! and the terminal T may collude, both semi-honest, so the SP does T's homomorphic work on
//! the record it stores). T seals its live capture w, its threshold and a session id to the
//! SP's party key (`privmatch_core::paillier::terminal`); the coordinator relays the box and
//! learns neither. The SP opens it, checks it names the device and protocol of the stored
//! record, checks its own σ and the expiry, and returns Round 2 for the device.
//!
//! Here: what every protocol's Round 2 shares ([`open_input`], [`checked_record`]) and Π1
//! (Fig. 3 Round 2), where T keeps no secret. Π2 and Π3, whose terminal keeps secrets until
//! its later rounds, are in [`super::sessions`].

use ed25519_dalek::VerifyingKey;
use pgrx::prelude::*;
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::semi_honest::{Pi1Round1, Pi1Terminal};
use privmatch_core::paillier::terminal::TerminalInput;

use super::enroll::stored_record;
use super::service::{load_service, protocol_name};
use super::{raise_match, require_sp};
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
/// to this party or was tampered with) and requires it to be for `protocol` (22023 otherwise).
pub(super) fn open_input(
    function: &str,
    me: &Identity,
    terminal_input: &[u8],
    protocol: Protocol,
) -> TerminalInput {
    let input = TerminalInput::open(me.index, &me.secret, terminal_input).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("{function}: terminal_input: {e}"),
            None,
        )
    });
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

/// Π1 Round 2 ([ABMR20] §5, Fig. 3 Round 2) at the SP for the terminal: opens the terminal's
/// sealed input (w, threshold; 08P01 if it was not sealed to this party or was tampered with),
/// takes the stored record of `device_id` as Round 1, and returns ⟦Mask(z + ρ)⟧ with the
/// threshold (`Pi1Round2`), for the device to decrypt (Round 3: the device learns ⟨u, w⟩ and
/// sends the match bit). Nothing is stored.
#[pg_extern(volatile)]
fn paillier_pi1_round2(device_id: &str, terminal_input: &[u8]) -> Vec<u8> {
    const F: &str = "paillier_pi1_round2";
    let me = require_sp(F);
    let input = open_input(F, &me, terminal_input, Protocol::Pi1);
    let CheckedRecord { signed, .. } = checked_record(F, device_id, &input);
    let params = signed.record.params.clone();
    let round1 = Pi1Round1 {
        public_key: signed.record.public_key.clone(),
        template: signed.record.packed.clone(),
    }
    .to_bytes(&params);
    let TerminalInput { w, threshold, .. } = input;
    let mut terminal = Pi1Terminal::new(params, w, threshold).unwrap_or_else(|e| raise_match(F, e));
    terminal
        .round2(&round1, &mut rand::rngs::OsRng)
        .unwrap_or_else(|e| raise_match(F, e))
}
