//! The iris functions of the SQL front door (`crate::front_door` explains it): enrolment,
//! identification and uniqueness with sealed inputs written by `privmatch iris seal`. The
//! application role `privmatch_application` may call these and nothing else of the iris
//! modality.
//!
//! Searches are verified before they are answered ([`verified_search`]): each eye's result
//! must carry this party's signature over it (core's `iris::output`: session, parameters, eye,
//! set digest, result; the key is derived from this party's key file, so nothing needs to be
//! pinned), and the rows returned are computed from the signed per-eye results, never taken
//! from the coordinator's combination. A result the coordinator changed is refused (28000),
//! naming this party.
//!
//! Imports: `crate::front_door`, `crate::identity` and core's `wire::sealed_input`,
//! `iris::output`, `crypto::party_sign`; never `crate::face`.

use pgrx::prelude::*;
use privmatch_core::crypto::party_sign::PartySigningKey;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::output::{verify_outputs, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::wire::sealed_input::{SealedInput, SealedKind};

use crate::errors::raise;
use crate::front_door::{call, enrolled, field, malformed, parse_sealed};
use crate::identity::load_identity;

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
        .unwrap_or(privmatch_core::mpc::compare::DEFAULT_TAU);
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

/// The per-eye results of `answer`, each verified against this party's signature with the
/// session, parameters and eye the client sealed (module docs). Raises 28000 naming this party
/// when a result is not what it signed.
fn verified_results(
    function: &str,
    sent: &Sent,
    answer: &serde_json::Value,
) -> Vec<(Eye, IrisResult)> {
    let me = load_identity();
    let mut keys = [None, None, None];
    keys[me.index.as_usize()] = Some(PartySigningKey::derive(&me.secret).verifying_key());
    let reports = field(answer, "eyes", function)
        .as_array()
        .unwrap_or_else(|| malformed(function, "eyes"));
    let mut out = Vec::with_capacity(sent.eyes.len());
    for eye in &sent.eyes {
        let output = reports
            .iter()
            .find(|r| r.get("eye").and_then(|e| e.as_str()) == Some(eye.eye.as_str()))
            .and_then(|r| r.get("output"))
            .unwrap_or_else(|| malformed(function, "eyes[].output"));
        let text = |key: &str| output.get(key).and_then(|v| v.as_str()).unwrap_or_default();
        let digest: [u8; 32] = hex::decode(text("set_digest"))
            .ok()
            .and_then(|d| d.try_into().ok())
            .unwrap_or_else(|| malformed(function, "eyes[].output.set_digest"));
        let entries = output
            .get("entries")
            .and_then(|v| v.as_u64())
            .unwrap_or_else(|| malformed(function, "eyes[].output.entries"));
        let signatures: [Vec<u8>; 3] = std::array::from_fn(|i| {
            output
                .get("signatures")
                .and_then(|s| s.get(i))
                .and_then(|s| s.as_str())
                .and_then(|s| hex::decode(s).ok())
                .unwrap_or_default()
        });
        let result = match sent.params.mode() {
            SearchMode::Identify => IrisResult::Identified(
                output
                    .get("subjects")
                    .and_then(|s| s.as_array())
                    .unwrap_or_else(|| malformed(function, "eyes[].output.subjects"))
                    .iter()
                    .map(|s| {
                        s.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| malformed(function, "eyes[].output.subjects"))
                    })
                    .collect(),
            ),
            SearchMode::Uniqueness => IrisResult::Unique(
                output
                    .get("unique")
                    .and_then(|u| u.as_bool())
                    .unwrap_or_else(|| malformed(function, "eyes[].output.unique")),
            ),
        };
        if let Err(e) = verify_outputs(
            &keys,
            eye.session,
            sent.params,
            eye.eye,
            digest,
            entries,
            &result,
            &signatures,
        ) {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
                format!("privmatch.{function}: {e}"),
                Some("the coordinator relayed a result this party did not compute; nothing is returned"),
            );
        }
        out.push((eye.eye, result));
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
/// (`coordinator/src/iris/eyes.rs`, `combine_matches`): `or` every match, `and` only subjects
/// matched on every eye (listed with each), sorted.
fn combine(per_eye: &[(Eye, IrisResult)], and: bool) -> Vec<(String, String)> {
    let lists: Vec<(Eye, &[String])> = per_eye
        .iter()
        .filter_map(|(eye, r)| match r {
            IrisResult::Identified(s) => Some((*eye, s.as_slice())),
            IrisResult::Unique(_) => None,
        })
        .collect();
    let mut rows: Vec<(String, String)> = lists
        .iter()
        .flat_map(|(eye, subjects)| {
            subjects
                .iter()
                .filter(|s| !and || lists.iter().all(|(_, l)| l.contains(s)))
                .map(move |s| (s.clone(), eye.as_str().to_owned()))
        })
        .collect();
    rows.sort();
    rows.dedup();
    rows
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
    // The rows come from the per-eye results this party signed, not from the coordinator's
    // combined list.
    let (sent, results) = verified_search(function, input);
    TableIterator::new(combine(&results, sent.and))
}

/// Whether a probe matches no enrolled template (`privmatch iris seal --for uniqueness`).
#[pg_extern(volatile, parallel_unsafe)]
fn iris_is_unique(sealed: &str) -> bool {
    let function = "iris_is_unique";
    let input = parse_sealed(sealed, SealedKind::IrisUniqueness, "sealed");
    // Unique only if every eye is (policy `or`; `and` over two eyes is refused when sealed).
    let (_, results) = verified_search(function, input);
    results
        .iter()
        .all(|(_, r)| matches!(r, IrisResult::Unique(true)))
}
