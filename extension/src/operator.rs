//! The party operator's key and the commands it signs ([`set_operator_key`],
//! [`accept_command`]): how a change of this party's security state can travel through the
//! untrusted coordinator. The operator sets its public key directly in its own database (the
//! coordinator's role cannot call [`set_operator_key`]); a relayed command is accepted only if
//! that key signed it, for this party and this action, with a counter above every one accepted
//! before (core's `crypto::sign`). Table: `privmatch.operator_key` (`sql/common.sql`).
//!
//! Imports: [`crate::errors`] and [`crate::identity`] only (no modality).

use pgrx::prelude::*;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::crypto::sign::{
    verify_command, CommandError, OperatorVerifyingKey, PeerPin, PEER_PIN_ACTION,
};

use crate::errors::{get_one, modify, raise, run};
use crate::identity::{load_identity, pin_peer_key};

fn raise_command(function: &str, err: CommandError) -> ! {
    let code = match err {
        CommandError::Malformed(_) | CommandError::BadKey => {
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
        }
        CommandError::WrongParty { .. }
        | CommandError::WrongAction { .. }
        | CommandError::BadSignature
        | CommandError::Replayed { .. }
        | CommandError::Expired { .. }
        | CommandError::TooLongLived { .. } => {
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION
        }
    };
    raise(code, format!("{function}: {err}"), None)
}

/// Sets the public half of this party operator's Ed25519 key (64 hex digits). Replacing a
/// different key needs `replace => true`; the counter of accepted commands is kept, so a
/// command signed before the change can never be replayed after it. Returns the key (hex).
/// The party's operator's function (`sql/roles.sql`).
#[pg_extern(volatile)]
fn set_operator_key(public_key: &str, replace: default!(bool, false)) -> String {
    const F: &str = "set_operator_key";
    let key = OperatorVerifyingKey::from_hex(public_key).unwrap_or_else(|e| raise_command(F, e));
    let existing = get_one::<Vec<u8>>(
        F,
        "SELECT (SELECT public_key FROM privmatch.operator_key)",
        &[],
    );
    if let Some(old) = existing {
        if old.as_slice() != key.to_bytes().as_slice() && !replace {
            raise(
                PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                format!("{F}: a different operator key is already set"),
                Some("pass replace => true to rotate the operator key deliberately"),
            );
        }
    }
    run(
        F,
        "INSERT INTO privmatch.operator_key (public_key) VALUES ($1) \
         ON CONFLICT (singleton) DO UPDATE SET public_key = EXCLUDED.public_key, set_at = now()",
        &[key.to_bytes().to_vec().into()],
    );
    key.to_hex()
}

/// Pins a peer's key as this party's operator signed it (`command`: an operator command of
/// action `peer-pin` whose payload is core's `PeerPin`), relayed by the coordinator or any
/// tool: the relay can neither forge a pin (its own key in place of a peer's would open the
/// pairwise channels to it) nor replay an old one (28000, nothing changed). The same checks
/// as `pin_peer` follow. Returns the pinned key's fingerprint.
#[pg_extern(volatile)]
fn pin_peer_signed(command: &[u8]) -> String {
    const F: &str = "pin_peer_signed";
    let payload = accept_command(F, PEER_PIN_ACTION, command);
    let pin = PeerPin::decode(&payload).unwrap_or_else(|e| raise_command(F, e));
    pin_peer_key(
        F,
        pin.peer,
        &PartyPublicKey::from_bytes(pin.key),
        pin.replace,
    )
}

/// The party's clock, in microseconds since the Unix epoch (a command's expiry is checked
/// against it).
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Checks the operator command `command` that `function` received for `action`, records its
/// counter (in the caller's transaction, under a row lock, so two concurrent commands cannot
/// both pass with the same counter) and returns its payload. Raises 28000 for a command that
/// is not this operator's, not for this party or action, replayed or expired; 55000 when the operator
/// has set no key.
pub fn accept_command(function: &str, action: &str, command: &[u8]) -> Vec<u8> {
    let me = load_identity();
    let stored = modify(
        function,
        "SELECT public_key, last_counter FROM privmatch.operator_key FOR UPDATE",
        &[],
        |row| (row.get::<Vec<u8>>(1), row.get::<i64>(2)),
    );
    let Some((Some(key), Some(last))) = stored.into_iter().next() else {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{function}: this party's operator has set no operator key"),
            Some(
                "the operator runs SELECT privmatch.set_operator_key('<hex>') on its own database",
            ),
        )
    };
    let key = OperatorVerifyingKey::from_bytes(&key).unwrap_or_else(|e| raise_command(function, e));
    let last = u64::try_from(last).unwrap_or(0);
    let verified = verify_command(command, me.index, action, &key, last, now_micros())
        .unwrap_or_else(|e| raise_command(function, e));
    let counter = i64::try_from(verified.counter).unwrap_or_else(|_| {
        raise_command(function, CommandError::Malformed("counter above 2^63 - 1"))
    });
    run(
        function,
        "UPDATE privmatch.operator_key SET last_counter = $1",
        &[counter.into()],
    );
    verified.payload
}
