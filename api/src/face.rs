//! The JSON shapes of the coordinator's face endpoints (Funshade: Ibarrondo, Chabanne, Önen,
//! PETS 2023, ePrint 2022/1688), shared by the server (`privmatch_coordinator::face::routes`) and the
//! client (`privmatch_coordinator::face::client`). Binary values (sealed envelopes and probes) are standard
//! padded base64; session ids are 32 hex digits.
//!
//! | method, path | body | answer |
//! |---|---|---|
//! | `POST /v1/face/configure` | [`FaceConfigureBody`]: `{"config": b64}` (sealed to P2, signed by P2's operator) | [`DealerStatus`] `{"metric", "dim", "generation"}` |
//! | `GET /v1/face/dealer` | — | [`FaceDealerResponse`] `{"dealer": {"metric", "dim", "generation"} or null, "dealer_error"}` |
//! | `POST /v1/face/enroll` | [`FaceEnrollBody`] `{"on_duplicate", "envelopes": [P0, P1]}` | [`FaceEnrollResponse`] per record `{"subject", "enrolled"}` |
//! | `POST /v1/face/delete` | [`FaceDeleteBody`] `{"subject"}` | [`FaceDeleteResponse`] `{"deleted": n, "pending_recovery": […], "subject"}` |
//! | `POST /v1/face/verify` | [`FaceVerifyBody`] `{"session", "probes": [P0, P1]}` | [`FaceVerifyResponse`] `{"comparisons", "outputs": [P0, P1]}` |
//! | `POST /v1/face/identify` | [`FaceIdentifyBody`] `{"session", "probes": [P0, P1]}` | [`FaceIdentifyResponse`] `{"comparisons", "outputs": [P0, P1], "bytes_sent", "key_bytes", "stocked"}` |
//! | `GET /v1/face/stock` | — | `StockStatus` (the coordinator's `face::stock`) `{"ready", "comparisons", "refilling", "last_refill_ms", "last_key_bytes"}`, once no refill runs (docs/protocols/face.md §11) |
//!
//! The requests and answers of verify and identify name no subject and carry no result
//! (docs/protocols/face.md §14): a verification's subject is sealed inside the probes
//! (probe format 3 and later; a body that still names a `subject` is refused), and `outputs` are P0's
//! and P1's output shares sealed to the reply key inside the client's probe (core's
//! `face::reply`, docs/protocols/face.md §13), which only the client (or the party whose
//! front door was called) opens — an identification's compared subjects are listed inside
//! them.
//!
//! Configuring starts a new dealer generation: P2 deals every later session's keys under the
//! new threshold (a dealing stocked under an earlier generation is not used).
//!
//! Errors are [`crate::error::ErrorBody`] with the face codes of [`crate::error::ErrorCode`]:
//! `unknown_subject` (404), `template_sets_differ` and `key_claim_conflict` (503, transient:
//! reseal the probe for a new session and retry), `not_configured` (503: run `privmatch face configure`),
//! `rejected_by_party` (422, e.g. a probe of the wrong dimension), `protocol_error` (502).

use privmatch_core::wire::session::SessionId;
use serde::{Deserialize, Serialize};

use crate::wire::{check_on_duplicate, default_on_duplicate, from_base64_each, session_from_hex};

/// The body of `POST /v1/face/configure`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceConfigureBody {
    /// The dealer configuration sealed to P2 (`seal_dealer_config`), base64: the coordinator
    /// never sees the threshold.
    pub config: String,
}

/// The dealer's public state (never its threshold).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DealerStatus {
    /// `cosine` or `euclidean`.
    pub metric: String,
    /// Embedding dimension.
    pub dim: i32,
    /// Configuration generation (each configuration gets a new one).
    pub generation: i64,
}

/// The answer to `GET /v1/face/dealer`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceDealerResponse {
    /// The dealer's configuration (None: not configured or unreachable).
    pub dealer: Option<DealerStatus>,
    /// Why the dealer's state is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dealer_error: Option<String>,
}

/// The body of `POST /v1/face/enroll`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceEnrollBody {
    /// `skip` (default: an enrolled subject is left as it is) or `error`.
    #[serde(default = "default_on_duplicate")]
    pub on_duplicate: String,
    /// The sealed enrolment envelopes for P0 and P1 (`seal_face_enrolment`), base64.
    pub envelopes: [String; 2],
}

impl FaceEnrollBody {
    /// Checks and decodes the envelopes.
    pub fn decode(&self) -> Result<[Vec<u8>; 2], String> {
        check_on_duplicate(&self.on_duplicate)?;
        from_base64_each(&self.envelopes, "envelopes")
    }
}

/// One record's result in a face enrolment answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceEnrollResult {
    /// Subject id.
    pub subject: String,
    /// False when it was already enrolled and skipped.
    pub enrolled: bool,
}

/// The answer to `POST /v1/face/enroll`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceEnrollResponse {
    /// Per record, in request order.
    pub results: Vec<FaceEnrollResult>,
    /// Parties whose commit recovery still has to complete (the batch is decided).
    #[serde(default)]
    pub pending_recovery: Vec<String>,
}

/// The body of `POST /v1/face/delete`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceDeleteBody {
    /// Subject id.
    pub subject: String,
}

/// The answer to `POST /v1/face/delete` (fields in the order the JSON has always had).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceDeleteResponse {
    /// Templates deleted at P0 and P1 (0 or 1).
    pub deleted: i64,
    /// Parties whose commit recovery still has to complete (the deletion is decided).
    #[serde(default)]
    pub pending_recovery: Vec<String>,
    /// Subject id.
    pub subject: String,
}

/// One face session: its id, the sealed probe of P0 and P1, and what it compares.
#[derive(Clone, Debug)]
pub struct FaceRequest {
    /// The session id the probes were sealed for.
    pub session: SessionId,
    /// The sealed probe of P0 and of P1.
    pub probes: [Vec<u8>; 2],
    /// A 1:1 verification (the subject is sealed inside the probes, unknown here), or a 1:N
    /// identification over every enrolled template.
    pub verification: bool,
}

/// The body of `POST /v1/face/verify`: no subject (it is sealed inside the probes).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceVerifyBody {
    /// The session id the probes were sealed for (hex).
    pub session: String,
    /// The sealed probe for P0 and P1 (`seal_face_probe`, with the claimed subject sealed
    /// inside), base64.
    pub probes: [String; 2],
    /// Refused when present: clients before 0.12.0 sent the claimed subject here, in the
    /// clear to the coordinator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<serde_json::Value>,
}

impl FaceVerifyBody {
    /// Checks and decodes the request.
    pub fn plan(&self) -> Result<FaceRequest, String> {
        if self.subject.is_some() {
            return Err("subject must not be sent: since 0.12.0 the claimed subject is sealed inside the probes (face probe format 3), so the coordinator never learns it; seal the probe again with privmatch 0.12 or later".into());
        }
        Ok(FaceRequest {
            session: session_from_hex(&self.session, "session")?,
            probes: from_base64_each(&self.probes, "probes")?,
            verification: true,
        })
    }
}

/// The answer to `POST /v1/face/verify`: no result and no subject, only the sealed outputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceVerifyResponse {
    /// Templates compared (the subject's: 1).
    #[serde(default)]
    pub comparisons: i64,
    /// P0's and P1's output shares sealed to the client's reply key, base64.
    pub outputs: Vec<String>,
}

/// The body of `POST /v1/face/identify`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceIdentifyBody {
    /// The session id the probes were sealed for (hex).
    pub session: String,
    /// The sealed probe for P0 and P1, base64.
    pub probes: [String; 2],
}

impl FaceIdentifyBody {
    /// Checks and decodes the request.
    pub fn plan(&self) -> Result<FaceRequest, String> {
        Ok(FaceRequest {
            session: session_from_hex(&self.session, "session")?,
            probes: from_base64_each(&self.probes, "probes")?,
            verification: false,
        })
    }
}

/// The answer to `POST /v1/face/identify`: no result and no subject, only the sealed
/// outputs (which list the compared subjects inside).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceIdentifyResponse {
    /// Templates compared (every enrolled one).
    #[serde(default)]
    pub comparisons: i64,
    /// P0's and P1's output shares sealed to the client's reply key, base64 (empty when
    /// nothing was compared).
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Bytes each evaluator (P0, P1) sent online in the session.
    #[serde(default)]
    pub bytes_sent: [u64; 2],
    /// Bytes of the key half the dealer sent each evaluator for the session (0 when it used
    /// a dealing made ahead of time).
    #[serde(default)]
    pub key_bytes: [u64; 2],
    /// Whether the identification used a dealing made ahead of time (`GET /v1/face/stock`).
    #[serde(default)]
    pub stocked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::to_base64;

    #[test]
    fn bodies_decode_and_refuse_with_the_field() {
        let verify = FaceVerifyBody {
            session: hex::encode([4u8; 16]),
            probes: [to_base64(b"p0"), to_base64(b"p1")],
            subject: None,
        };
        let request = verify.plan().expect("valid");
        assert!(request.verification);
        // The body names no subject; a client that still sends one is refused.
        assert!(!serde_json::to_string(&verify)
            .unwrap_or_default()
            .contains("subject"));
        assert_eq!(request.probes[1], b"p1");
        let mut bad = verify.clone();
        bad.probes[1] = "***".into();
        assert!(bad
            .plan()
            .err()
            .unwrap_or_default()
            .contains("probes[1] (for P1)"));
        let mut bad = verify.clone();
        bad.subject = Some("alice".into());
        assert!(bad
            .plan()
            .err()
            .unwrap_or_default()
            .contains("subject must not be sent"));
        let mut bad = verify;
        bad.session = "00".into();
        assert!(bad.plan().err().unwrap_or_default().contains("session"));

        let json = format!(
            "{{\"session\": \"{}\", \"probes\": [\"cDA=\", \"cDE=\"]}}",
            hex::encode([1u8; 16])
        );
        let identify: FaceIdentifyBody = serde_json::from_str(&json).expect("parses");
        assert!(!identify.plan().expect("valid").verification);

        let enroll: FaceEnrollBody =
            serde_json::from_str("{\"envelopes\": [\"cDA=\", \"cDE=\"]}").expect("parses");
        assert_eq!(enroll.on_duplicate, "skip");
        assert!(enroll.decode().is_ok());
        let mut bad = enroll;
        bad.on_duplicate = "replace".into();
        assert!(bad.decode().is_err());
        bad.on_duplicate = "error".into();
        bad.envelopes[0] = String::new();
        assert!(bad
            .decode()
            .err()
            .unwrap_or_default()
            .contains("envelopes[0]"));
    }

    #[test]
    fn dealer_answers_have_no_threshold_and_a_null_dealer_when_unconfigured() {
        let unconfigured = FaceDealerResponse {
            dealer: None,
            dealer_error: None,
        };
        assert_eq!(
            serde_json::to_string(&unconfigured).ok().as_deref(),
            Some(r#"{"dealer":null}"#)
        );
        let configured = DealerStatus {
            metric: "cosine".into(),
            dim: 512,
            generation: 3,
        };
        assert_eq!(
            serde_json::to_string(&configured).ok().as_deref(),
            Some(r#"{"metric":"cosine","dim":512,"generation":3}"#)
        );
    }

    #[test]
    fn verify_answers_carry_sealed_outputs_and_no_match_key() {
        let answer = FaceVerifyResponse {
            comparisons: 1,
            outputs: vec!["cDA=".into(), "cDE=".into()],
        };
        assert_eq!(
            serde_json::to_string(&answer).ok().as_deref(),
            Some(r#"{"comparisons":1,"outputs":["cDA=","cDE="]}"#)
        );
    }
}
