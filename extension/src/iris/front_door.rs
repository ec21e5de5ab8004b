//! The iris functions of the SQL front door (`crate::front_door` explains it): enrolment,
//! identification and uniqueness with sealed inputs written by `privmatch iris seal`. The
//! application role `privmatch_application` may call these and nothing else of the iris
//! modality.
//!
//! Searches are opened here, not at the coordinator ([`verified_search`]): the sealed input
//! was made by `privmatch iris seal --front-door <this party>`, whose probes carry this
//! party's static public key as the reply key, so each party seals its signed output to this
//! party (core's `iris::output`) and the coordinator relays three ciphertexts per eye. This
//! party opens them with its key file and the pinned keys of its peers, checks that each is
//! for the session, parameters and eye the client sealed, checks its own signature (its
//! signing key is derived from its key file), checks that the three agree, and computes the
//! rows with the two-eye policy the client sealed (core's `iris::eyes`). An output that does
//! not open or verify (altered, swapped, or sealed for another party's front door) is refused
//! with 28000, naming the party.
//!
//! Imports: `crate::front_door`, `crate::identity` and core's `wire::sealed_input`,
//! `iris::output`, `iris::eyes`, `crypto::party_sign`; never `crate::face`.

use base64::Engine as _;
use pgrx::prelude::*;
use privmatch_core::crypto::party_sign::PartySigningKey;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::eyes::{combine_matches, combine_uniqueness};
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::sealed_input::{SealedInput, SealedKind};

use crate::errors::raise;
use crate::front_door::{call, enrolled, field, malformed, parse_sealed};
use crate::identity::{load_identity, pinned_peer};

/// One eye of a sealed search as the client sealed it: the eye and its session.
struct SentEye {
    eye: Eye,
    session: [u8; 16],
}

/// What the client sealed: the parameters, the two-eye policy (`and`?) and the eyes.
struct Sent {
    params: SearchParams,
    and: bool,
    eyes: Vec<SentEye>,
}

/// Reads the search body of a sealed input (the client's JSON, `coordinator/src/iris/api.rs`
/// `SearchBody`): 22023 when it is not one.
fn sent_search(function: &str, input: &SealedInput) -> Sent {
    let bad = |what: &str| -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("privmatch.{function}: the sealed search {what}"),
            None,
        )
    };
    let body: serde_json::Value =
        serde_json::from_slice(&input.body).unwrap_or_else(|_| bad("is not JSON"));
    let mode = body
        .get("mode")
        .and_then(|m| m.as_str())
        .unwrap_or("identify");
    let mode = SearchMode::parse(mode).unwrap_or_else(|_| bad("has an unknown mode"));
    let max_rotation = body
        .get("max_rotation")
        .and_then(|v| v.as_i64())
        .and_then(|v| i32::try_from(v).ok())
        .unwrap_or(15);
    let threshold = body
        .get("threshold")
        .and_then(|v| v.as_f64())
        .unwrap_or(privmatch_core::iris::policy::DEFAULT_TAU);
    let params = SearchParams::new(mode, max_rotation, threshold)
        .unwrap_or_else(|e| bad(&format!("has bad parameters: {e}")));
    let and = body.get("policy").and_then(|p| p.as_str()) == Some("and");
    let eyes = body
        .get("eyes")
        .and_then(|e| e.as_array())
        .unwrap_or_else(|| bad("has no eyes"))
        .iter()
        .map(|e| {
            let eye = e
                .get("eye")
                .and_then(|v| v.as_str())
                .and_then(|v| Eye::parse(v).ok())
                .unwrap_or_else(|| bad("has an eye that is not left or right"));
            let session: [u8; 16] = e
                .get("session")
                .and_then(|v| v.as_str())
                .and_then(|v| hex::decode(v).ok())
                .and_then(|v| v.try_into().ok())
                .unwrap_or_else(|| bad("has a malformed session id"));
            SentEye { eye, session }
        })
        .collect();
    Sent { params, and, eyes }
}

/// The per-eye results of `answer`: each eye's three sealed outputs opened with this party's
/// key (module docs). Raises 28000 naming the party whose output does not open or verify.
fn verified_results(
    function: &str,
    sent: &Sent,
    answer: &serde_json::Value,
) -> Vec<(Eye, IrisResult)> {
    let me = load_identity();
    let party_keys = PartyIndex::ALL.map(|p| {
        if p == me.index {
            me.secret.public_key()
        } else {
            pinned_peer(&format!("privmatch.{function}"), p)
        }
    });
    let mut signing = [None, None, None];
    signing[me.index.as_usize()] = Some(PartySigningKey::derive(&me.secret).verifying_key());
    let reports = field(answer, "eyes", function)
        .as_array()
        .unwrap_or_else(|| malformed(function, "eyes"));
    let mut out = Vec::with_capacity(sent.eyes.len());
    for eye in &sent.eyes {
        let outputs = reports
            .iter()
            .find(|r| r.get("eye").and_then(|e| e.as_str()) == Some(eye.eye.as_str()))
            .and_then(|r| r.get("sealed_outputs"))
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 3)
            .unwrap_or_else(|| malformed(function, "eyes[].sealed_outputs"));
        let sealed: [Vec<u8>; 3] = std::array::from_fn(|i| {
            outputs[i]
                .as_str()
                .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                .unwrap_or_else(|| malformed(function, "eyes[].sealed_outputs"))
        });
        let expected = ExpectedSearch {
            session: eye.session,
            params: sent.params,
            eye: eye.eye,
        };
        let opened = open_outputs(
            &expected,
            &party_keys,
            &signing,
            &me.secret,
            [&sealed[0], &sealed[1], &sealed[2]],
        )
        .unwrap_or_else(|e| {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
                format!("privmatch.{function}: {e}"),
                Some("the coordinator relayed an output this party cannot open or verify (or the input was sealed for another party's front door: privmatch iris seal --front-door); nothing is returned"),
            )
        });
        out.push((eye.eye, opened.result));
    }
    out
}

/// Runs a sealed search through the coordinator and returns its per-eye results, verified
/// (module docs), with the parameters the client sealed.
fn verified_search(function: &str, input: SealedInput) -> (Sent, Vec<(Eye, IrisResult)>) {
    let sent = sent_search(function, &input);
    let answer = call(input, false);
    let results = verified_results(function, &sent, &answer);
    (sent, results)
}

/// The rows of an identification from verified per-eye results under the two-eye policy
/// the client sealed (core's `iris::eyes`, the combination the CLI applies too): `or` every
/// match, `and` only subjects matched on every eye (listed with each), sorted.
fn combine(per_eye: &[(Eye, IrisResult)], and: bool) -> Vec<(String, String)> {
    let lists: Vec<(Eye, Vec<String>)> = per_eye
        .iter()
        .filter_map(|(eye, r)| match r {
            IrisResult::Identified(s) => Some((*eye, s.clone())),
            IrisResult::Unique(_) => None,
        })
        .collect();
    combine_matches(&lists, and)
        .into_iter()
        .map(|(subject, eye)| (subject, eye.as_str().to_owned()))
        .collect()
}

/// Enrols one iris template at the three parties (one distributed transaction, committed
/// independently of the caller's). True when enrolled, false when this subject and eye were
/// already enrolled (nothing written). `sealed`: `privmatch iris seal --for enroll`.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_enroll(sealed: &str) -> bool {
    let function = "iris_enroll";
    let input = parse_sealed(sealed, SealedKind::IrisEnroll, "sealed");
    enrolled(&call(input, true), function)
}

/// The enrolled templates a probe matches: one row per (subject, eye), sorted, after the
/// sealed two-eye policy. `sealed`: `privmatch iris seal --for identify`.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_identify(
    sealed: &str,
) -> TableIterator<'static, (name!(subject, String), name!(eye, String))> {
    let function = "iris_identify";
    let input = parse_sealed(sealed, SealedKind::IrisIdentify, "sealed");
    // The rows come from the per-eye outputs this party opened; the coordinator sees none.
    let (sent, results) = verified_search(function, input);
    TableIterator::new(combine(&results, sent.and))
}

/// Whether a probe matches no enrolled template (`privmatch iris seal --for uniqueness`).
#[pg_extern(volatile, parallel_unsafe)]
fn iris_is_unique(sealed: &str) -> bool {
    let function = "iris_is_unique";
    let input = parse_sealed(sealed, SealedKind::IrisUniqueness, "sealed");
    // Unique only if every eye is (policy `or`; `and` over two eyes is refused when sealed).
    let (sent, results) = verified_search(function, input);
    let per_eye: Vec<(Eye, bool)> = results
        .iter()
        .map(|(eye, r)| (*eye, matches!(r, IrisResult::Unique(true))))
        .collect();
    combine_uniqueness(&per_eye, sent.and).unwrap_or_else(|why| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("privmatch.{function}: {why}"),
            None,
        )
    })
}
