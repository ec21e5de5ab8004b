//! The face modality at one party (Funshade, seed 000; protocol in [`privmatch_core::face`]).
//!
//! * P0 and P1 store shares of face templates ([`enroll`]), keep the single-use key material
//!   P2 deals ([`pool`]) and evaluate comparisons in sessions ([`session`]).
//! * P2 is the dealer ([`dealer`]): it holds the metric and the secret threshold and makes
//!   key batches sealed to P0 and P1.
//!
//! Single use of key material is a property of the database, not of the caller: a session's
//! keys are claimed (and the claim committed) before anything derived from them leaves the
//! party, every claim is a row of `privmatch.face_key_claims` whose exclusion constraint
//! forbids overlapping claims, and a session's inputs are fixed when it opens, so re-running
//! a round after a crash recomputes the same values instead of evaluating new ones.

mod dealer;
mod enroll;
mod pool;
mod session;

use pgrx::prelude::*;
use privmatch_core::crypto::seal::{PartyPublicKey, SealError};
use privmatch_core::face::FaceError;
use privmatch_core::party::PartyIndex;

use crate::errors::raise;

/// The SQLSTATE of a face error.
fn face_error_code(err: &FaceError) -> PgSqlErrorCode {
    match err {
        FaceError::Seal(SealError::Tampered(_))
        | FaceError::Seal(SealError::Misrouted(_))
        | FaceError::Seal(SealError::OutOfSequence { .. }) => {
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION
        }
        FaceError::Malformed(_) | FaceError::Seal(SealError::Malformed(_)) => {
            PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION
        }
        FaceError::NotAnEvaluator(_) => PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        _ => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    }
}

/// Raises a face error from `function`; never returns.
fn raise_face(function: &str, err: FaceError) -> ! {
    raise(face_error_code(&err), format!("{function}: {err}"), None)
}

/// Raises an SPI failure from `function` as an internal error; never returns.
fn raise_spi(function: &str, err: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("{function}: {err}"),
        None,
    )
}

/// Column `ordinal` of an SPI row, raising SPI failures from `function`.
fn column<T: pgrx::datum::FromDatum + pgrx::datum::IntoDatum>(
    function: &str,
    row: &pgrx::spi::SpiHeapTupleData<'_>,
    ordinal: usize,
) -> Option<T> {
    row.get::<T>(ordinal)
        .unwrap_or_else(|e| raise_spi(function, e))
}

/// The pinned public key of `peer`, or a 55000 error naming what to do.
fn pinned_peer(function: &str, peer: PartyIndex) -> PartyPublicKey {
    let key = Spi::get_one_with_args::<Vec<u8>>(
        "SELECT (SELECT public_key FROM privmatch.peers WHERE party_index = $1)",
        &[i32::from(peer.as_u8()).into()],
    )
    .unwrap_or_else(|e| raise_spi(function, e));
    let key: Option<[u8; 32]> = key.and_then(|k| k.try_into().ok());
    match key {
        Some(key) => PartyPublicKey::from_bytes(key),
        None => raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{function}: the public key of {peer} is not pinned"),
            Some("pin it with SELECT privmatch.pin_peer(<index>, '<hex key>')"),
        ),
    }
}

/// Parses a 16-byte session id.
fn session_id(function: &str, bytes: &[u8]) -> [u8; 16] {
    bytes.try_into().unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: session must be 16 bytes, got {}", bytes.len()),
            None,
        )
    })
}
