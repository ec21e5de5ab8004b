//! The face functions of the SQL front door (`crate::front_door` explains it): enrolment,
//! 1:1 verification and 1:N identification with sealed inputs written by
//! `privmatch face seal`. The application role `privmatch_application` may call these and
//! nothing else of the face modality.
//!
//! The probes of `face_verify` and `face_identify` were sealed (`privmatch face seal
//! --front-door <this party>`) with this party's static public key as their reply key, so P0
//! and P1 seal their output shares to this party: the coordinator relays them unread, and this
//! function opens them with the party's key file and P0's and P1's keys pinned here (never
//! the coordinator's word; docs/protocols/face.md §13). An output the coordinator altered
//! or forged is refused (28000) naming the party. Since 0.12.0 the coordinator is told no
//! subject (docs/protocols/face.md §14): a verification's subject is sealed inside the probe
//! (so the sealed input's body names none), and an identification's compared subjects come
//! from inside the sealed outputs.
//!
//! Imports: `crate::front_door`, `crate::identity` and core's `face::reply` and
//! `wire::sealed_input`; never `crate::iris`.

use pgrx::prelude::*;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::face::reply::{open_face_result, FaceResult};
use privmatch_core::face::FaceError;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::sealed_input::{SealedInput, SealedKind};

use crate::errors::raise;
use privmatch_api::face::{
    FaceEnrollResponse, FaceIdentifyBody, FaceIdentifyResponse, FaceVerifyBody, FaceVerifyResponse,
};

use crate::front_door::{call, enrolled, malformed, parse_sealed};
use crate::identity::{load_identity, pinned_peer};

/// The session id a sealed probe input was sealed for (its body's `session`, hex), or 22023.
fn sealed_session(function: &str, input: &SealedInput) -> [u8; 16] {
    let session = match input.kind {
        SealedKind::FaceVerify => serde_json::from_slice::<FaceVerifyBody>(&input.body)
            .ok()
            .map(|b| b.session),
        _ => serde_json::from_slice::<FaceIdentifyBody>(&input.body)
            .ok()
            .map(|b| b.session),
    };
    session
        .and_then(|h| privmatch_api::wire::session_from_hex(&h, "session").ok())
        .unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("privmatch.{function}: argument sealed has no valid session id"),
                Some("write it with `privmatch face seal`"),
            )
        })
}

/// Opens P0's and P1's sealed outputs in the coordinator's `answer` for `session` and adds
/// them: one bit per compared subject — for a verification, of the `claimed` subject, which
/// the outputs must have been computed for (22023 otherwise: the probe was sealed for another
/// subject); for an identification (`None`), of the subjects both list inside their outputs. A
/// sealed output that does not open (altered or forged by the coordinator, or sealed to another
/// party's key) is refused with 28000 naming the party.
fn open_outputs(
    function: &str,
    outputs: &[String],
    session: &[u8; 16],
    claimed: Option<&str>,
) -> FaceResult {
    let me = load_identity();
    if outputs.len() != 2 {
        malformed(function, "outputs");
    }
    let outputs: Vec<Vec<u8>> = outputs
        .iter()
        .map(|o| {
            privmatch_api::wire::from_base64(o, "outputs[]")
                .unwrap_or_else(|_| malformed(function, "outputs[]"))
        })
        .collect();
    // P0's and P1's keys as this party holds them: its own, or the pinned peer's.
    let key = |b: usize| -> PartyPublicKey {
        let party = PartyIndex::ALL[b];
        if party == me.index {
            me.secret.public_key()
        } else {
            pinned_peer(function, party)
        }
    };
    let keys = [key(0), key(1)];
    open_face_result(
        [&keys[0], &keys[1]],
        &me.secret,
        session,
        [&outputs[0], &outputs[1]],
        claimed,
    )
    .unwrap_or_else(|e| {
        if e == FaceError::WrongTarget {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("privmatch.{function}: argument sealed was not sealed for the subject given as argument subject"),
                Some("seal the probe for this subject: `privmatch face seal --for verify` takes the subject from each input line"),
            );
        }
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            format!("privmatch.{function}: {e}"),
            Some(&format!(
                "the coordinator changed the result, or the input was not sealed with `privmatch face seal --front-door {}` for this party",
                me.index.as_u8()
            )),
        )
    })
}

/// Enrols one face template at P0 and P1 (one distributed transaction, committed
/// independently of the caller's). True when enrolled, false when the subject already has
/// one (nothing written). `sealed`: `privmatch face seal --for enroll`.
#[pg_extern(volatile, parallel_unsafe)]
fn face_enroll(sealed: &str) -> bool {
    let function = "face_enroll";
    let input = parse_sealed(sealed, SealedKind::FaceEnroll, "sealed");
    let answer: FaceEnrollResponse = call(input, true);
    let first = answer.results.first().map(|r| r.enrolled);
    enrolled(first, &answer.pending_recovery, function)
}

/// 1:1: whether the probe matches `subject`'s enrolled template. The probe was sealed for
/// that subject (`privmatch face seal --for verify`), inside the probe: the coordinator is
/// not told it. Another subject than the probe's is refused (22023) once P0's and P1's sealed
/// outputs are opened here (they bind the subject the evaluators read from the probe).
#[pg_extern(volatile, parallel_unsafe)]
fn face_verify(subject: &str, sealed: &str) -> bool {
    let function = "face_verify";
    if let Err(e) = privmatch_core::wire::envelope::validate_subject(subject) {
        crate::errors::raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("privmatch.face_verify: argument subject is invalid: {e}"),
            None,
        );
    }
    let input = parse_sealed(sealed, SealedKind::FaceVerify, "sealed");
    let session = sealed_session(function, &input);
    let answer: FaceVerifyResponse = call(input, false);
    // A verification compares the claimed subject's template: the one bit is the answer.
    open_outputs(function, &answer.outputs, &session, Some(subject))
        .bits
        .first()
        .copied()
        .unwrap_or_else(|| malformed(function, "outputs"))
}

/// 1:N: the enrolled subjects the probe matches, sorted (`privmatch face seal --for
/// identify`).
#[pg_extern(volatile, parallel_unsafe)]
fn face_identify(sealed: &str) -> TableIterator<'static, (name!(subject, String),)> {
    let function = "face_identify";
    let input = parse_sealed(sealed, SealedKind::FaceIdentify, "sealed");
    let session = sealed_session(function, &input);
    let answer: FaceIdentifyResponse = call(input, false);
    let comparisons = answer.comparisons;
    // Nothing enrolled: nothing compared, no outputs. Otherwise the compared subjects come
    // from inside the sealed outputs, never from the coordinator.
    let result = if comparisons == 0 {
        FaceResult {
            subjects: Vec::new(),
            bits: Vec::new(),
        }
    } else {
        open_outputs(function, &answer.outputs, &session, None)
    };
    if result.subjects.len() as i64 != comparisons {
        malformed(function, "comparisons");
    }
    let mut rows: Vec<(String,)> = result
        .subjects
        .into_iter()
        .zip(result.bits)
        .filter(|(_, m)| *m)
        .map(|(s, _)| (s,))
        .collect();
    rows.sort();
    TableIterator::new(rows)
}
