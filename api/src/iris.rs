//! The JSON bodies of the coordinator's iris endpoints, shared by the server
//! (`privmatch_coordinator::iris::routes`) and the client (`privmatch_coordinator::iris::client`). Binary fields travel as
//! standard padded base64 (sealed probes and enrolment envelopes) or lower-case hex (16-byte
//! session ids), see [`crate::wire`].
//!
//! `POST /v1/iris/enroll?on_duplicate=skip|error` — framed sealed bundles
//! (`privmatch_core::wire::envelope::encode_enroll_batch`) → [`EnrollResponse`].
//!
//! `POST /v1/iris/delete` — [`DeleteBody`] `{"subject", "eye": "left"|"right"|null}` →
//! [`DeleteResponse`] `{"deleted": n, "pending_recovery": […]}`.
//!
//! `POST /v1/iris/search` — [`SearchBody`] → [`SearchResponse`]:
//!
//! ```json
//! {"policy": "or",
//!  "eyes": [{"eye": "left", "session": "<32 hex>", "probes": ["<b64 P0>", "<b64 P1>", "<b64 P2>"]}]}
//! ```
//!
//! The search's parameters (mode, rotations, threshold; `privmatch_core::iris::params`) travel
//! sealed inside the probes only: the coordinator neither sees nor relays them, and each party
//! takes them from its own probe. The client keeps them ([`SearchParamsBody`]) to check the
//! outputs.
//!
//! answers `{"policy", "eyes": [...]}`: per eye the figures of its search (entries, rounds,
//! bytes sent per party, seconds) and `"sealed_outputs"`: the three parties' outputs, each
//! signed and sealed to the reply key inside the client's probes (base64; core's
//! `iris::output`). The coordinator cannot read them: it answers no `mode`, no `matches` and
//! no `unique`. The client opens and verifies them and applies the two-eye policy (the
//! coordinator's `iris::client::open_response`), which fills in `mode` and `matches`
//! (identify) or `unique` (uniqueness) of the answer it reports.
//!
//! `GET /v1/iris/search` answers the parties' threshold policy (the coordinator's
//! `iris::policy`).
//!
//! A search sealed for a party's SQL front door (`privmatch iris seal`) is a [`SealedSearch`]:
//! the parameters beside the body, in one JSON object, `{"mode", "max_rotation", "threshold",
//! "policy", "eyes"}`; the front door keeps the parameters and forwards the [`SearchBody`].
//!
//! `POST /v1/iris/enroll-if-unique` — [`EnrollIfUniqueBody`] → [`EnrollIfUniqueResponse`]:
//! one record, `{"subject", "eye", "session", "probes": [3 × b64], "envelopes": [3 × b64]}`
//! (the probes sealed, with the uniqueness search's parameters, with the disclosure of the
//! uniqueness bit to the coordinator, which must know whether to enrol); answers `{"subject", "eye", "outcome":
//! "enrolled"|"duplicate"|"not_unique", "sealed_outputs": [3 × b64] | null, "pending_recovery":
//! […]}`. `sealed_outputs` are the three parties' outputs of the uniqueness search, signed and
//! sealed to the reply key inside the client's probe (absent only for `duplicate`, decided
//! before the search): the client opens them and refuses an outcome they contradict.
//!
//! Errors: [`crate::error::ErrorBody`].
//!
//! The bodies decode (`plan`) into the requests the round driver runs ([`SearchRequest`]),
//! so the client and the server share one reading of every field.

use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::policy::DEFAULT_TAU;
use privmatch_core::iris::template::MAX_ROTATION;
use privmatch_core::wire::session::SessionId;
use serde::{Deserialize, Serialize};

pub mod eyes;

use self::eyes::{combine_uniqueness, EyePolicy, Match};
use crate::wire::{from_base64_each, session_from_hex};

fn default_max_rotation() -> i32 {
    MAX_ROTATION
}

fn default_threshold() -> f64 {
    DEFAULT_TAU
}

/// The parameters of a search as the CLI and a [`SealedSearch`] give them, checked by
/// `privmatch_core::iris::params` (the parties check them again, from their probes).
pub fn search_params(
    mode: SearchMode,
    max_rotation: i32,
    threshold: f64,
) -> Result<SearchParams, String> {
    SearchParams::new(mode, max_rotation, threshold).map_err(|e| e.to_string())
}

/// One search session: its id and the three sealed probes (indexed by party), which carry
/// the parameters.
#[derive(Clone, Debug)]
pub struct SearchRequest {
    /// The session id the probes were sealed for.
    pub session: SessionId,
    /// The sealed probe of each party.
    pub probes: [Vec<u8>; 3],
}

/// Figures of one search, for reports and the benchmark.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchStats {
    /// Templates searched (the same at every party).
    pub entries: i64,
    /// Round calls made per party (= messages each party emitted).
    pub rounds: u32,
    /// Bytes of the messages each party emitted, by party.
    pub bytes_sent: [u64; 3],
    /// Wall time from start to the last round, in microseconds.
    pub micros: u64,
    /// Searches in the batch this one ran in (1: alone; 0 from a coordinator before 0.15.0).
    /// The rounds and bytes above are the batch's.
    #[serde(default)]
    pub batch: u32,
}

impl SearchStats {
    /// Wall time in seconds.
    pub fn seconds(&self) -> f64 {
        self.micros as f64 / 1e6
    }
}

/// One record's result in an enrolment answer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EnrollResult {
    /// Subject id.
    pub subject: String,
    /// Eye.
    pub eye: String,
    /// False when it was already enrolled and skipped.
    pub enrolled: bool,
}

/// The answer to an enrolment batch.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct EnrollResponse {
    /// Per record, in request order.
    pub results: Vec<EnrollResult>,
    /// Parties whose commit recovery still has to complete (the batch is decided).
    pub pending_recovery: Vec<String>,
}

/// The body of `POST /v1/iris/delete`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct DeleteBody {
    /// Subject id.
    pub subject: String,
    /// Only this eye (`"left"` or `"right"`; null: both).
    pub eye: Option<String>,
}

/// The answer to `POST /v1/iris/delete`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct DeleteResponse {
    /// Records deleted at every party.
    pub deleted: i64,
    /// Parties whose commit recovery still has to complete (the deletion is decided).
    #[serde(default)]
    pub pending_recovery: Vec<String>,
}

/// One eye of a search request: its session and the three sealed probes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EyeProbeBody {
    /// `"left"` or `"right"`: labels the matches (the parties take the eye from the probe).
    pub eye: String,
    /// The session id the probes were sealed for (hex).
    pub session: String,
    /// The sealed probe of P0, P1, P2 (base64).
    pub probes: [String; 3],
}

/// The parameters of a search, as the client keeps them beside a [`SearchBody`] (never sent
/// to the coordinator: the probes carry them, sealed).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct SearchParamsBody {
    /// `identify` (default) or `uniqueness`.
    #[serde(default)]
    pub mode: SearchMode,
    /// 0..=15 (default 15).
    #[serde(default = "default_max_rotation")]
    pub max_rotation: i32,
    /// Match threshold ratio in (0, 0.5] (default 0.345).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
}

impl SearchParamsBody {
    /// The JSON form of `params`.
    pub fn of(params: SearchParams) -> Self {
        SearchParamsBody {
            mode: params.mode(),
            max_rotation: params.max_rotation(),
            threshold: params.threshold_ratio(),
        }
    }

    /// The parameters, checked.
    pub fn params(&self) -> Result<SearchParams, String> {
        search_params(self.mode, self.max_rotation, self.threshold)
    }
}

/// The body of `POST /v1/iris/search`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SearchBody {
    /// How two eyes combine (default `or`); applied by the client.
    #[serde(default)]
    pub policy: EyePolicy,
    /// One or two eyes, distinct.
    pub eyes: Vec<EyeProbeBody>,
    /// The mode and rotation range the probes were sealed with, declared so that the
    /// coordinator may run this search in a batch with others that declare the same
    /// (docs/protocols/iris.md §13.3; the threshold is the parties' policy). They are what the
    /// coordinator could tell from a search's rounds and message sizes anyway; each party
    /// refuses a probe sealed with other ones. Absent: the search runs alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchDeclaration>,
    /// Refused when present: clients of 0.14.0 and before sent the search's parameters here,
    /// in the clear to the coordinator (they travel sealed in the probes only).
    #[serde(flatten)]
    pub legacy: LegacyParams,
}

/// What a search declares to be batched with others ([`SearchBody::batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchDeclaration {
    /// `identify` or `uniqueness`.
    pub mode: SearchMode,
    /// 0..=15.
    pub max_rotation: i32,
}

impl BatchDeclaration {
    /// The declaration of a search sealed with `params`.
    pub fn of(params: SearchParams) -> Self {
        BatchDeclaration {
            mode: params.mode(),
            max_rotation: params.max_rotation(),
        }
    }

    /// Checks the rotation range (0..=15).
    pub fn check(&self) -> Result<(), String> {
        if (0..=15).contains(&self.max_rotation) {
            Ok(())
        } else {
            Err(format!(
                "batch.max_rotation must be in 0..=15, got {}",
                self.max_rotation
            ))
        }
    }
}

/// The parameter fields an older client put beside the probes (`mode`, `max_rotation`,
/// `threshold`): read only to refuse the request before anything runs, naming them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LegacyParams {
    /// `mode` of a 0.14.0 search body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<serde_json::Value>,
    /// `max_rotation` of a 0.14.0 search body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rotation: Option<serde_json::Value>,
    /// `threshold` of a 0.14.0 search or enroll-if-unique body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<serde_json::Value>,
}

impl LegacyParams {
    /// True when no parameter field was sent.
    pub fn is_empty(&self) -> bool {
        self.mode.is_none() && self.max_rotation.is_none() && self.threshold.is_none()
    }

    /// Refuses a request that names a parameter, with what to do.
    pub fn refuse(&self) -> Result<(), String> {
        let named: Vec<&str> = [
            ("mode", self.mode.is_some()),
            ("max_rotation", self.max_rotation.is_some()),
            ("threshold", self.threshold.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, sent)| sent.then_some(name))
        .collect();
        if named.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} must not be sent: the search's parameters travel sealed inside the probes only, so the coordinator never sees them; seal the search again with a privmatch CLI (or front door) of this release",
            named.join(", ")
        ))
    }
}

/// A search sealed for a party's SQL front door: the parameters the client sealed into the
/// probes (which the front door needs to check the outputs, and keeps) beside the body it
/// forwards to the coordinator. One flat JSON object.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SealedSearch {
    /// Mode, rotations, threshold.
    #[serde(flatten)]
    pub params: SearchParamsBody,
    /// What the front door forwards.
    #[serde(flatten)]
    pub search: SearchBody,
}

impl SealedSearch {
    /// Checks the parameters and the body together (the two-eye policy must suit the mode)
    /// and decodes them.
    pub fn plan(&self) -> Result<(SearchParams, Vec<(Eye, SearchRequest)>), String> {
        let params = self.params.params()?;
        let plan = self.search.plan()?;
        check_policy(params.mode(), self.search.policy, plan.len())?;
        Ok((params, plan))
    }
}

/// Whether the two-eye `policy` can combine `eyes` results of a search in `mode` (uniqueness
/// over two eyes takes `or` only).
pub fn check_policy(mode: SearchMode, policy: EyePolicy, eyes: usize) -> Result<(), String> {
    if mode == SearchMode::Uniqueness {
        let unique: Vec<(Eye, bool)> = [Eye::Left, Eye::Right]
            .into_iter()
            .take(eyes)
            .map(|e| (e, true))
            .collect();
        combine_uniqueness(&unique, policy)?;
    }
    Ok(())
}

impl SearchBody {
    /// Checks the request and decodes it into one search per eye.
    pub fn plan(&self) -> Result<Vec<(Eye, SearchRequest)>, String> {
        self.legacy.refuse()?;
        if let Some(batch) = &self.batch {
            batch.check()?;
        }
        if self.eyes.is_empty() || self.eyes.len() > 2 {
            return Err(format!(
                "a search has one or two eyes, got {}",
                self.eyes.len()
            ));
        }
        let mut plan: Vec<(Eye, SearchRequest)> = Vec::with_capacity(2);
        for (i, body) in self.eyes.iter().enumerate() {
            let what = format!("eyes[{i}]");
            let eye = Eye::parse(&body.eye).map_err(|e| format!("{what}.eye: {e}"))?;
            let session = session_from_hex(&body.session, &format!("{what}.session"))?;
            if plan.iter().any(|(e, r)| *e == eye || r.session == session) {
                return Err(format!(
                    "{what}: each eye appears once and has its own session id"
                ));
            }
            let probes = from_base64_each(&body.probes, &format!("{what}.probes"))?;
            plan.push((eye, SearchRequest { session, probes }));
        }
        Ok(plan)
    }
}

/// The figures of one eye's search, and the parties' sealed outputs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EyeReport {
    /// `"left"` or `"right"`.
    pub eye: String,
    /// Rounds, bytes, time.
    #[serde(flatten)]
    pub stats: SearchStats,
    /// P0's, P1's and P2's outputs, signed and sealed to the client's reply key (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_outputs: Option<[String; 3]>,
}

/// The answer to `POST /v1/iris/search`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SearchResponse {
    /// The mode searched. Never sent by the coordinator (the probes carry it, sealed): filled
    /// in by the client once it opened the outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SearchMode>,
    /// The eye policy applied.
    pub policy: EyePolicy,
    /// Identify: the matches after the policy, sorted by subject then eye. Never sent by the
    /// coordinator (it cannot read the outputs): filled in by the client once it opened them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<Match>>,
    /// Uniqueness: whether no enrolled template matched (after the policy). Filled in by the
    /// client, like `matches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<bool>,
    /// Per eye: the figures of its search.
    pub eyes: Vec<EyeReport>,
}

/// The body of `POST /v1/iris/enroll-if-unique`: one record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EnrollIfUniqueBody {
    /// The record's subject (as sealed inside the envelopes; checked against the parties'
    /// answer).
    pub subject: String,
    /// The record's eye.
    pub eye: String,
    /// The session id the probes were sealed for (hex).
    pub session: String,
    /// The record's template sealed as a search probe for P0, P1, P2 (base64).
    pub probes: [String; 3],
    /// The record's enrolment envelopes for P0, P1, P2 (base64), one record each.
    pub envelopes: [String; 3],
    /// Refused when present (a 0.14.0 client's `threshold`, see [`SearchBody::legacy`]).
    #[serde(flatten)]
    pub legacy: LegacyParams,
}

/// An enroll-if-unique request, decoded.
pub struct EnrollIfUniquePlan {
    /// Subject id.
    pub subject: String,
    /// Eye.
    pub eye: Eye,
    /// The three enrolment envelopes.
    pub envelopes: [Vec<u8>; 3],
    /// The uniqueness search.
    pub search: SearchRequest,
}

/// The parameters of the uniqueness search of enroll-if-unique: ±15 rotations, `threshold`.
pub fn if_unique_params(threshold: f64) -> Result<SearchParams, String> {
    search_params(SearchMode::Uniqueness, MAX_ROTATION, threshold)
}

impl EnrollIfUniqueBody {
    /// Checks and decodes the request.
    pub fn plan(&self) -> Result<EnrollIfUniquePlan, String> {
        self.legacy.refuse()?;
        privmatch_core::wire::envelope::validate_subject(&self.subject)
            .map_err(|e| format!("subject: {e}"))?;
        let eye = Eye::parse(&self.eye).map_err(|e| format!("eye: {e}"))?;
        Ok(EnrollIfUniquePlan {
            subject: self.subject.clone(),
            eye,
            envelopes: from_base64_each(&self.envelopes, "envelopes")?,
            search: SearchRequest {
                session: session_from_hex(&self.session, "session")?,
                probes: from_base64_each(&self.probes, "probes")?,
            },
        })
    }
}

/// What enroll-if-unique did with the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnrollIfUniqueOutcome {
    /// Enrolled at the three parties.
    Enrolled,
    /// The subject+eye was already enrolled; nothing written.
    Duplicate,
    /// The template matches an enrolled one; nothing written.
    NotUnique,
}

/// The answer to `POST /v1/iris/enroll-if-unique`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EnrollIfUniqueResponse {
    /// Subject id.
    pub subject: String,
    /// Eye.
    pub eye: String,
    /// What happened.
    pub outcome: EnrollIfUniqueOutcome,
    /// The three parties' outputs of the uniqueness search (base64), signed and sealed to the
    /// reply key in the client's probe: the client checks `outcome` against them. None only
    /// for `duplicate` (decided before any search).
    #[serde(default)]
    pub sealed_outputs: Option<[String; 3]>,
    /// Parties whose commit recovery still has to complete (the record is decided).
    #[serde(default)]
    pub pending_recovery: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::to_base64;

    fn eye(name: &str, session: u8) -> EyeProbeBody {
        EyeProbeBody {
            eye: name.into(),
            session: hex::encode([session; 16]),
            probes: [to_base64(b"p0"), to_base64(b"p1"), to_base64(b"p2")],
        }
    }

    fn body(policy: EyePolicy, eyes: Vec<EyeProbeBody>) -> SearchBody {
        SearchBody {
            policy,
            eyes,
            ..SearchBody::default()
        }
    }

    fn sealed(mode: SearchMode, policy: EyePolicy, eyes: Vec<EyeProbeBody>) -> SealedSearch {
        SealedSearch {
            params: SearchParamsBody {
                mode,
                max_rotation: 15,
                threshold: 0.345,
            },
            search: body(policy, eyes),
        }
    }

    #[test]
    fn search_bodies_decode_with_defaults() {
        let json = format!(
            "{{\"eyes\": [{{\"eye\": \"right\", \"session\": \"{}\", \"probes\": [\"cDA=\", \"cDE=\", \"cDI=\"]}}]}}",
            hex::encode([3u8; 16])
        );
        let parsed: SearchBody = serde_json::from_str(&json).expect("parses");
        assert_eq!(parsed.policy, EyePolicy::Or);
        let plan = parsed.plan().expect("valid");
        assert_eq!(plan[0].0, Eye::Right);
        assert_eq!(plan[0].1.probes[2], b"p2");
        assert_eq!(plan[0].1.session, [3u8; 16]);
        // The same JSON as a front door's sealed search: the parameters' defaults.
        let front: SealedSearch = serde_json::from_str(&json).expect("parses");
        let (params, _) = front.plan().expect("valid");
        assert_eq!(params.mode(), SearchMode::Identify);
        assert_eq!(params.max_rotation(), 15);
        assert_eq!(params.threshold_ratio(), DEFAULT_TAU);
    }

    #[test]
    fn the_body_sent_to_the_coordinator_names_no_search_parameter() {
        let front = sealed(SearchMode::Uniqueness, EyePolicy::Or, vec![eye("left", 1)]);
        let flat = serde_json::to_value(&front).expect("json");
        for key in ["mode", "max_rotation", "threshold", "policy", "eyes"] {
            assert!(
                flat.get(key).is_some(),
                "the sealed search lacks {key}: {flat}"
            );
        }
        let sent = serde_json::to_value(&front.search).expect("json");
        for key in ["mode", "max_rotation", "threshold"] {
            assert!(sent.get(key).is_none(), "the body names {key}: {sent}");
        }
        let answer = SearchResponse {
            mode: None,
            policy: EyePolicy::Or,
            matches: None,
            unique: None,
            eyes: Vec::new(),
        };
        let answer = serde_json::to_value(&answer).expect("json");
        assert!(answer.get("mode").is_none(), "{answer}");
    }

    #[test]
    fn bodies_of_older_clients_naming_a_parameter_are_refused_before_anything_runs() {
        let session = hex::encode([4u8; 16]);
        let eyes = format!(
            "\"eyes\": [{{\"eye\": \"left\", \"session\": \"{session}\", \"probes\": [\"cDA=\", \"cDE=\", \"cDI=\"]}}]"
        );
        let old = format!(
            "{{\"mode\": \"identify\", \"max_rotation\": 15, \"threshold\": 0.345, \"policy\": \"or\", {eyes}}}"
        );
        let parsed: SearchBody = serde_json::from_str(&old).expect("parses");
        let err = parsed.plan().err().unwrap_or_default();
        assert!(
            err.contains("mode, max_rotation, threshold must not be sent"),
            "{err}"
        );
        // The same JSON is a front door's sealed search: there the parameters are its own.
        let sealed: SealedSearch = serde_json::from_str(&old).expect("parses");
        assert!(sealed.search.legacy.is_empty());
        let (params, plan) = sealed.plan().expect("valid");
        assert_eq!(params.max_rotation(), 15);
        assert_eq!(plan.len(), 1);
        let forwarded = serde_json::to_value(&sealed.search).expect("json");
        assert!(forwarded.get("threshold").is_none(), "{forwarded}");
        let if_unique = format!(
            "{{\"subject\": \"a\", \"eye\": \"left\", \"session\": \"{session}\", \"probes\": [\"YQ==\", \"Yg==\", \"Yw==\"], \"envelopes\": [\"eA==\", \"eQ==\", \"eg==\"], \"threshold\": 0.345}}"
        );
        let parsed: EnrollIfUniqueBody = serde_json::from_str(&if_unique).expect("parses");
        let err = parsed.plan().err().unwrap_or_default();
        assert!(err.contains("threshold must not be sent"), "{err}");
    }

    #[test]
    fn bad_search_bodies_are_refused_with_the_field() {
        let cases: Vec<(SearchBody, &str)> = vec![
            (body(EyePolicy::Or, vec![]), "one or two eyes"),
            (
                body(EyePolicy::Or, vec![eye("left", 1), eye("left", 2)]),
                "each eye appears once",
            ),
            (
                body(EyePolicy::Or, vec![eye("left", 1), eye("right", 1)]),
                "own session id",
            ),
            (body(EyePolicy::Or, vec![eye("middle", 1)]), "eyes[0].eye"),
        ];
        for (b, expected) in cases {
            let err = b.plan().err().unwrap_or_default();
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        }
        let mut short = eye("left", 1);
        short.session = "abcd".into();
        let err = body(EyePolicy::Or, vec![short])
            .plan()
            .err()
            .unwrap_or_default();
        assert!(err.contains("eyes[0].session"), "{err}");
        let mut bad = eye("left", 1);
        bad.probes[1] = "***".into();
        let err = body(EyePolicy::Or, vec![bad])
            .plan()
            .err()
            .unwrap_or_default();
        assert!(err.contains("eyes[0].probes[1]"), "{err}");
        let both = vec![eye("left", 1), eye("right", 2)];
        let err = sealed(SearchMode::Uniqueness, EyePolicy::And, both)
            .plan()
            .err()
            .unwrap_or_default();
        assert!(err.contains("not supported"), "{err}");
        let mut far = sealed(SearchMode::Identify, EyePolicy::Or, vec![eye("left", 1)]);
        far.params.max_rotation = 20;
        assert!(far.plan().is_err());
    }

    #[test]
    fn enroll_if_unique_bodies_decode() {
        let b = EnrollIfUniqueBody {
            subject: "alice".into(),
            eye: "left".into(),
            session: hex::encode([9u8; 16]),
            probes: [to_base64(b"a"), to_base64(b"b"), to_base64(b"c")],
            envelopes: [to_base64(b"x"), to_base64(b"y"), to_base64(b"z")],
            legacy: LegacyParams::default(),
        };
        let plan = b.plan().expect("valid");
        assert_eq!(plan.search.session, [9u8; 16]);
        assert_eq!(plan.envelopes[1], b"y");
        let mut bad = b.clone();
        bad.subject = String::new();
        assert!(bad.plan().is_err());
        let mut bad = b;
        bad.envelopes[0] = String::new();
        assert!(bad
            .plan()
            .err()
            .unwrap_or_default()
            .contains("envelopes[0]"));
    }

    #[test]
    fn the_threshold_boundary_is_half_inclusive_in_the_api() {
        let with = |threshold: f64| {
            let mut b = sealed(SearchMode::Identify, EyePolicy::Or, vec![eye("left", 1)]);
            b.params.threshold = threshold;
            b.plan().map(|(params, _)| params.threshold_ratio())
        };
        assert_eq!(with(0.5), Ok(0.5));
        for refused in [0.5001, 0.0, -0.1, 0.34512, f64::NAN] {
            let err = with(refused).err().unwrap_or_default();
            assert!(err.contains("threshold"), "{refused}: {err}");
        }
        let if_unique = |threshold: f64| if_unique_params(threshold).map(|p| p.threshold_ratio());
        assert_eq!(if_unique(0.5), Ok(0.5));
        assert!(if_unique(0.5001).is_err());
        assert!(if_unique(0.0).is_err());
        assert_eq!(
            if_unique_params(0.3).map(|p| (p.mode(), p.max_rotation())),
            Ok((SearchMode::Uniqueness, MAX_ROTATION))
        );
    }
}
