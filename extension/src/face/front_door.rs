//! The face functions of the SQL front door (`crate::front_door` explains it): enrolment,
//! 1:1 verification and 1:N identification with sealed inputs written by
//! `privmatch face seal`. The application role `privmatch_application` may call these and
//! nothing else of the face modality.
//!
//! Imports: `crate::front_door` and core's `wire::sealed_input`; never `crate::iris`.

use pgrx::prelude::*;
use privmatch_core::wire::sealed_input::SealedKind;

use crate::front_door::{call, enrolled, field, malformed, parse_sealed};

/// Enrols one face template at P0 and P1 (one distributed transaction, committed
/// independently of the caller's). True when enrolled, false when the subject already has
/// one (nothing written). `sealed`: `privmatch face seal --for enroll`.
#[pg_extern(volatile, parallel_unsafe)]
fn face_enroll(sealed: &str) -> bool {
    let function = "face_enroll";
    let input = parse_sealed(sealed, SealedKind::FaceEnroll, "sealed");
    enrolled(&call(input, true), function)
}

/// 1:1: whether the probe matches `subject`'s enrolled template. The probe was sealed for
/// that subject (`privmatch face seal --for verify`); another subject is refused (22023).
#[pg_extern(volatile, parallel_unsafe)]
fn face_verify(subject: &str, sealed: &str) -> bool {
    let function = "face_verify";
    let input = parse_sealed(sealed, SealedKind::FaceVerify, "sealed");
    let claimed = serde_json::from_slice::<serde_json::Value>(&input.body)
        .ok()
        .and_then(|b| b.get("subject").and_then(|s| s.as_str()).map(str::to_owned));
    if claimed.as_deref() != Some(subject) {
        crate::errors::raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("privmatch.face_verify: argument sealed was not sealed for the subject given as argument subject ({subject:?})"),
            Some("seal the probe for this subject: `privmatch face seal --for verify` takes the subject from each input line"),
        );
    }
    let answer = call(input, false);
    field(&answer, "match", function)
        .as_bool()
        .unwrap_or_else(|| malformed(function, "match"))
}

/// 1:N: the enrolled subjects the probe matches, sorted (`privmatch face seal --for
/// identify`).
#[pg_extern(volatile, parallel_unsafe)]
fn face_identify(sealed: &str) -> TableIterator<'static, (name!(subject, String),)> {
    let function = "face_identify";
    let input = parse_sealed(sealed, SealedKind::FaceIdentify, "sealed");
    let answer = call(input, false);
    let rows: Vec<(String,)> = field(&answer, "matches", function)
        .as_array()
        .unwrap_or_else(|| malformed(function, "matches"))
        .iter()
        .map(|s| {
            (s.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| malformed(function, "matches[]")),)
        })
        .collect();
    TableIterator::new(rows)
}
