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

use pgrx::prelude::*;
use privmatch_core::crypto::party_sign::PartySigningKey;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::eyes::{combine_matches, combine_uniqueness};
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::sealed_input::{SealedInput, SealedKind};

use crate::errors::raise;
use privmatch_api::iris::eyes::EyePolicy;
use privmatch_api::iris::{EnrollResponse, SealedSearch, SearchResponse};

use crate::front_door::{call, enrolled, malformed, parse_sealed};
use crate::identity::{load_identity, pinned_peer};

/// One eye of a sealed search as the client sealed it: the eye and its session.
struct SentEye {
    eye: Eye,
    session: [u8; 16],
}

/// What the client sealed: the parameters, the two-eye policy (`and`?) and the eyes, and the
/// body this party forwards to the coordinator (without the parameters, which the probes
/// carry sealed).
struct Sent {
    params: SearchParams,
    and: bool,
    eyes: Vec<SentEye>,
    forward: SealedInput,
}

/// Reads the search of a sealed input (the API's `SealedSearch`, as the client wrote it,
/// read and checked by the API's own `plan`): 22023 when it is not one.
fn sent_search(function: &str, input: &SealedInput) -> Sent {
    let bad = |what: &str| -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("privmatch.{function}: the sealed search {what}"),
            None,
        )
    };
    let sealed: SealedSearch = serde_json::from_slice(&input.body)
        .unwrap_or_else(|e| bad(&format!("is not a search body: {e}")));
    let (params, plan) = sealed
        .plan()
        .unwrap_or_else(|e| bad(&format!("is refused: {e}")));
    let expected_mode = if input.kind == SealedKind::IrisUniqueness {
        SearchMode::Uniqueness
    } else {
        SearchMode::Identify
    };
    if params.mode() != expected_mode {
        bad(&format!(
            "was sealed for {} but given to privmatch.{function}",
            params.mode().as_str()
        ));
    }
    let forward = SealedInput {
        kind: input.kind,
        body: serde_json::to_vec(&sealed.search)
            .unwrap_or_else(|e| bad(&format!("cannot be written again: {e}"))),
    };
    let eyes = plan
        .iter()
        .map(|(eye, request)| SentEye {
            eye: *eye,
            session: request.session,
        })
        .collect();
    Sent {
        params,
        and: sealed.search.policy == EyePolicy::And,
        eyes,
        forward,
    }
}

/// The per-eye results of `answer`: each eye's three sealed outputs opened with this party's
/// key (module docs). Raises 28000 naming the party whose output does not open or verify.
fn verified_results(
    function: &str,
    sent: &Sent,
    answer: &SearchResponse,
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
    let mut out = Vec::with_capacity(sent.eyes.len());
    for eye in &sent.eyes {
        let outputs = answer
            .eyes
            .iter()
            .find(|r| r.eye == eye.eye.as_str())
            .and_then(|r| r.sealed_outputs.as_ref())
            .unwrap_or_else(|| malformed(function, "eyes[].sealed_outputs"));
        let sealed = privmatch_api::wire::from_base64_each(outputs, "sealed_outputs")
            .unwrap_or_else(|_| malformed(function, "eyes[].sealed_outputs"));
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
    let answer: SearchResponse = call(sent.forward.clone(), false);
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
            IrisResult::Unique(_) | IrisResult::MatchesEarlierRequest => None,
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
    let answer: EnrollResponse = call(input, true);
    let first = answer.results.first().map(|r| r.enrolled);
    enrolled(first, &answer.pending_recovery, function)
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
