//! The face modality at one party (Funshade, ePrint 2022/1688; protocol in [`privmatch_core::face`]).
//!
//! * The share type `face_share` ([`types`]).
//! * P0 and P1 store shares of face templates ([`enroll`]), keep the single-use key material
//!   P2 deals ([`pool`]) and evaluate comparisons in sessions ([`search`]).
//! * P2 is the dealer ([`dealer`]): it holds the metric and the secret threshold and makes
//!   key batches sealed to P0 and P1.
//! * The application's SQL front door ([`front_door`]): enrol, verify, identify.
//!
//! Single use of key material is a property of the database, not of the caller: a session's
//! keys are claimed (and the claim committed) before anything derived from them leaves the
//! party, every claim is a row of `privmatch.face_key_claims` whose exclusion constraint
//! forbids overlapping claims, and a session's inputs are fixed when it opens, so re-running
//! a round after a crash recomputes the same values instead of evaluating new ones.
//!
//! Imports: the shared modules (`errors`, `datum`, `bundles`, `identity`, `front_door`) and core; never
//! `crate::iris` or `crate::engine`. Tables: `sql/face.sql`.

mod dealer;
mod enroll;
mod front_door;
mod masked;
mod opening;
mod pool;
mod search;
mod types;

use pgrx::prelude::*;
use privmatch_core::crypto::seal::SealError;
use privmatch_core::face::FaceError;

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
        FaceError::EvaluatorsDisagree => PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
        _ => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    }
}

/// Raises a face error from `function`; never returns.
fn raise_face(function: &str, err: FaceError) -> ! {
    raise(face_error_code(&err), format!("{function}: {err}"), None)
}
