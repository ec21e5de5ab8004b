//! The JSON bodies of the coordinator's search API, shared by the server (`server.rs`) and the
//! CLI client (`client.rs`). Binary fields travel as standard padded base64 (sealed probes and
//! enrolment envelopes) or lower-case hex (16-byte session ids).
//!
//! `POST /v1/iris/search` — [`SearchBody`] → [`SearchResponse`]:
//!
//! ```json
//! {"mode": "identify", "max_rotation": 15, "threshold": 0.345, "policy": "or",
//!  "eyes": [{"eye": "left", "session": "<32 hex>", "probes": ["<b64 P0>", "<b64 P1>", "<b64 P2>"]}]}
//! ```
//!
//! answers `{"mode", "policy", "matches": [{"subject", "eye"}…]}` (identify) or
//! `{"mode", "policy", "unique": bool}` (uniqueness), plus `"eyes"`: per eye the figures of its
//! search (entries, rounds, bytes sent per party, seconds; no per-eye result, so the policy
//! decides what the caller learns).
//!
//! `POST /v1/iris/enroll-if-unique` — [`EnrollIfUniqueBody`] → [`EnrollIfUniqueResponse`]:
//! one record, `{"subject", "eye", "session", "probes": [3 × b64], "envelopes": [3 × b64],
//! "threshold"}`; answers `{"subject", "eye", "outcome": "enrolled"|"duplicate",
//! "pending_recovery": […]}`, or HTTP 409 with `"code": "not_unique"`.
//!
//! Errors: [`ErrorBody`], `{"error": message, "code": …, "party": n, "sqlstate": "…"}`.

use base64::Engine as _;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::wire::session::SESSION_ID_LEN;
use serde::{Deserialize, Serialize};

use crate::search::{
    combine_uniqueness, EyePolicy, SearchMode, SearchParams, SearchRequest, SearchStats, SessionId,
    DEFAULT_THRESHOLD,
};

/// Error codes of [`ErrorBody::code`].
pub mod codes {
    /// The request is malformed or out of range.
    pub const BAD_REQUEST: &str = "bad_request";
    /// A party rejected the request's content (SQLSTATE class 22/23).
    pub const REJECTED: &str = "rejected_by_party";
    /// A party failed.
    pub const PARTY_ERROR: &str = "party_error";
    /// A party is unreachable or not ready.
    pub const PARTY_UNAVAILABLE: &str = "party_unavailable";
    /// A party did not answer in time.
    pub const TIMEOUT: &str = "timeout";
    /// The parties hold different template sets (transient: retry with a new session).
    pub const SETS_DIFFER: &str = "template_sets_differ";
    /// The parties broke the protocol or disagree.
    pub const PROTOCOL: &str = "protocol_error";
    /// Enrol-if-unique: the probe matches an enrolled template.
    pub const NOT_UNIQUE: &str = "not_unique";
    /// A distributed transaction's outcome is left to recovery.
    pub const IN_DOUBT: &str = "in_doubt";
    /// Face: a key pool is exhausted (run `privmatch face refill`).
    pub const POOL_EXHAUSTED: &str = "key_pool_exhausted";
    /// Face: the subject is not enrolled.
    pub const UNKNOWN_SUBJECT: &str = "unknown_subject";
    /// Face: a key claim conflicted with another session's (transient: retry with a new
    /// session).
    pub const KEY_CONFLICT: &str = "key_claim_conflict";
    /// Face: the dealer is not configured, or a party is not initialised.
    pub const NOT_CONFIGURED: &str = "not_configured";
}

/// An error answer.
#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct ErrorBody {
    /// What went wrong, for people.
    pub error: String,
    /// What went wrong, for programs (see [`codes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The party at fault, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub party: Option<u8>,
    /// The party's SQLSTATE, if it reported one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlstate: Option<String>,
    /// With `template_sets_differ`: the entries each party reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<[i64; 3]>,
}

/// Standard padded base64.
pub fn to_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(crate) fn from_base64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("{what} is not standard base64: {e}"))
}

/// A session id as 32 lower-case hex digits.
pub fn session_to_hex(session: &SessionId) -> String {
    hex::encode(session)
}

pub(crate) fn session_from_hex(text: &str, what: &str) -> Result<SessionId, String> {
    let bytes = hex::decode(text).map_err(|e| format!("{what}: not hex: {e}"))?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        format!(
            "{what}: a session id has {SESSION_ID_LEN} bytes, got {}",
            b.len()
        )
    })
}

fn decode_three(texts: &[String; 3], what: &str) -> Result<[Vec<u8>; 3], String> {
    let mut out: [Vec<u8>; 3] = Default::default();
    for (i, (slot, text)) in out.iter_mut().zip(texts).enumerate() {
        *slot = from_base64(text, &format!("{what}[{i}] (for P{i})"))?;
        if slot.is_empty() {
            return Err(format!("{what}[{i}] (for P{i}) is empty"));
        }
    }
    Ok(out)
}

fn default_max_rotation() -> i32 {
    privmatch_core::iris::template::MAX_ROTATION
}

fn default_threshold() -> f64 {
    DEFAULT_THRESHOLD
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

/// The body of `POST /v1/iris/search`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SearchBody {
    /// `identify` (default) or `uniqueness`.
    #[serde(default)]
    pub mode: SearchMode,
    /// 0..=15 (default 15).
    #[serde(default = "default_max_rotation")]
    pub max_rotation: i32,
    /// Match threshold ratio (default 0.345).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// How two eyes combine (default `or`).
    #[serde(default)]
    pub policy: EyePolicy,
    /// One or two eyes, distinct.
    pub eyes: Vec<EyeProbeBody>,
}

impl SearchBody {
    /// The parameters common to every eye.
    pub fn params(&self) -> SearchParams {
        SearchParams {
            mode: self.mode,
            max_rotation: self.max_rotation,
            threshold: self.threshold,
        }
    }

    /// Checks the request and decodes it into one search per eye.
    pub fn plan(&self) -> Result<Vec<(Eye, SearchRequest)>, String> {
        let params = self.params();
        params.validate()?;
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
            let probes = decode_three(&body.probes, &format!("{what}.probes"))?;
            plan.push((
                eye,
                SearchRequest {
                    session,
                    probes,
                    params,
                },
            ));
        }
        if self.mode == SearchMode::Uniqueness {
            let eyes: Vec<(Eye, bool)> = plan.iter().map(|(e, _)| (*e, true)).collect();
            combine_uniqueness(&eyes, self.policy)?;
        }
        Ok(plan)
    }
}

/// The figures of one eye's search.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EyeReport {
    /// `"left"` or `"right"`.
    pub eye: String,
    /// Rounds, bytes, time.
    #[serde(flatten)]
    pub stats: SearchStats,
}

/// The answer to `POST /v1/iris/search`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SearchResponse {
    /// The mode searched.
    pub mode: SearchMode,
    /// The eye policy applied.
    pub policy: EyePolicy,
    /// Identify: the matches after the policy, sorted by subject then eye.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<crate::search::Match>>,
    /// Uniqueness: whether no enrolled template matched (after the policy).
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
    /// Match threshold ratio (default 0.345). Rotations are always ±15.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
}

/// An enrol-if-unique request, decoded.
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

impl EnrollIfUniqueBody {
    /// Checks and decodes the request.
    pub fn plan(&self) -> Result<EnrollIfUniquePlan, String> {
        privmatch_core::wire::envelope::validate_subject(&self.subject)
            .map_err(|e| format!("subject: {e}"))?;
        let eye = Eye::parse(&self.eye).map_err(|e| format!("eye: {e}"))?;
        let params = SearchParams {
            mode: SearchMode::Uniqueness,
            max_rotation: default_max_rotation(),
            threshold: self.threshold,
        };
        params.validate()?;
        Ok(EnrollIfUniquePlan {
            subject: self.subject.clone(),
            eye,
            envelopes: decode_three(&self.envelopes, "envelopes")?,
            search: SearchRequest {
                session: session_from_hex(&self.session, "session")?,
                probes: decode_three(&self.probes, "probes")?,
                params,
            },
        })
    }
}

/// What enrol-if-unique did with the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnrollIfUniqueOutcome {
    /// Enrolled at the three parties.
    Enrolled,
    /// The subject+eye was already enrolled; nothing written.
    Duplicate,
    /// The template matches an enrolled one; nothing written (HTTP 409).
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
    /// Parties whose commit recovery still has to complete (the record is decided).
    #[serde(default)]
    pub pending_recovery: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eye(name: &str, session: u8) -> EyeProbeBody {
        EyeProbeBody {
            eye: name.into(),
            session: hex::encode([session; 16]),
            probes: [to_base64(b"p0"), to_base64(b"p1"), to_base64(b"p2")],
        }
    }

    fn body(mode: SearchMode, policy: EyePolicy, eyes: Vec<EyeProbeBody>) -> SearchBody {
        SearchBody {
            mode,
            max_rotation: 15,
            threshold: 0.345,
            policy,
            eyes,
        }
    }

    #[test]
    fn search_bodies_decode_with_defaults() {
        let json = format!(
            "{{\"eyes\": [{{\"eye\": \"right\", \"session\": \"{}\", \"probes\": [\"cDA=\", \"cDE=\", \"cDI=\"]}}]}}",
            hex::encode([3u8; 16])
        );
        let parsed: SearchBody = serde_json::from_str(&json).expect("parses");
        assert_eq!(parsed.mode, SearchMode::Identify);
        assert_eq!(parsed.policy, EyePolicy::Or);
        assert_eq!(parsed.max_rotation, 15);
        let plan = parsed.plan().expect("valid");
        assert_eq!(plan[0].0, Eye::Right);
        assert_eq!(plan[0].1.probes[2], b"p2");
        assert_eq!(plan[0].1.session, [3u8; 16]);
    }

    #[test]
    fn bad_search_bodies_are_refused_with_the_field() {
        let cases: Vec<(SearchBody, &str)> = vec![
            (
                body(SearchMode::Identify, EyePolicy::Or, vec![]),
                "one or two eyes",
            ),
            (
                body(
                    SearchMode::Identify,
                    EyePolicy::Or,
                    vec![eye("left", 1), eye("left", 2)],
                ),
                "each eye appears once",
            ),
            (
                body(
                    SearchMode::Identify,
                    EyePolicy::Or,
                    vec![eye("left", 1), eye("right", 1)],
                ),
                "own session id",
            ),
            (
                body(
                    SearchMode::Uniqueness,
                    EyePolicy::And,
                    vec![eye("left", 1), eye("right", 2)],
                ),
                "not supported",
            ),
            (
                body(SearchMode::Identify, EyePolicy::Or, vec![eye("middle", 1)]),
                "eyes[0].eye",
            ),
        ];
        for (b, expected) in cases {
            let err = b.plan().err().unwrap_or_default();
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
        }
        let mut short = eye("left", 1);
        short.session = "abcd".into();
        let err = body(SearchMode::Identify, EyePolicy::Or, vec![short])
            .plan()
            .err()
            .unwrap_or_default();
        assert!(err.contains("eyes[0].session"), "{err}");
        let mut bad = eye("left", 1);
        bad.probes[1] = "***".into();
        let err = body(SearchMode::Identify, EyePolicy::Or, vec![bad])
            .plan()
            .err()
            .unwrap_or_default();
        assert!(err.contains("eyes[0].probes[1]"), "{err}");
        let mut far = body(SearchMode::Identify, EyePolicy::Or, vec![eye("left", 1)]);
        far.max_rotation = 20;
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
            threshold: 0.345,
        };
        let plan = b.plan().expect("valid");
        assert_eq!(plan.search.params.mode, SearchMode::Uniqueness);
        assert_eq!(plan.search.params.max_rotation, 15);
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
}
