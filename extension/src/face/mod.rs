//! The face modality at one party (Funshade, ePrint 2022/1688; protocol in [`privmatch_core::face`]).
//!
//! * The share type `face_share` ([`types`]).
//! * P0 and P1 store shares of face templates ([`enroll`]), open them under the dealer's
//!   template masks ([`opening`]) and evaluate comparisons in sessions over those
//!   dealer-masked templates ([`masked`]; the checks every session's open shares and its
//!   abort: [`search`]).
//! * P2 is the dealer ([`dealer`]): it holds the metric, the secret threshold and the
//!   template-mask master key, and deals each session's single-use keys sealed to P0 and P1.
//! * The application's SQL front door ([`front_door`]): enrol, verify, identify.
//! * The C symbols of the key pool's functions retired in 0.13.0, which only refuse
//!   ([`retired`]; older install scripts still name them).
//!
//! Single use of key material is a property of the database, not of the caller: a session's
//! row in `privmatch.face_sessions` is committed before anything derived from its keys leaves
//! the party, its id is never used again (the primary key), and a stocked dealing is claimed by
//! one session ever (`privmatch.face_stock_used`). The key pool of versions before 0.13.0
//! (keys dealt in batches ahead of time, claimed per comparison) is retired.
//!
//! Imports: the shared modules (`errors`, `datum`, `bundles`, `identity`, `front_door`) and core; never
//! `crate::iris` or `crate::engine`. Tables: `sql/face.sql`.

mod dealer;
mod enroll;
mod front_door;
mod masked;
mod opening;
mod retired;
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
        _ => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    }
}

/// Raises a face error from `function`; never returns.
fn raise_face(function: &str, err: FaceError) -> ! {
    raise(face_error_code(&err), format!("{function}: {err}"), None)
}
