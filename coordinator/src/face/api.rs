//! The JSON shapes of the coordinator's face endpoints (Funshade: Ibarrondo, Chabanne, Önen,
//! PETS 2023, ePrint 2022/1688), shared by the server ([`crate::face::routes`]) and the
//! client ([`crate::face::client`]). Binary values (sealed envelopes and probes) are standard
//! padded base64; session ids are 32 hex digits.
//!
//! | method, path | body | answer |
//! |---|---|---|
//! | `POST /v1/face/configure` | [`FaceConfigureBody`]: `{"config": b64}` (sealed to P2) | [`DealerStatus`] `{"metric", "dim", "generation", "retired_keys": [P0, P1]}` |
//! | `GET /v1/face/pool` | — | [`FacePoolResponse`]: dealer state, per evaluator its pools, the level |
//! | `POST /v1/face/refill` | [`FaceRefillBody`] `{"target", "batch_size", "max_batches"}` | [`FaceRefillResponse`] levels before/after |
//! | `POST /v1/face/enroll` | [`FaceEnrollBody`] `{"on_duplicate", "envelopes": [P0, P1]}` | [`FaceEnrollResponse`] per record `{"subject", "enrolled"}` |
//! | `POST /v1/face/delete` | [`FaceDeleteBody`] `{"subject"}` | [`FaceDeleteResponse`] `{"deleted": n, "pending_recovery": […], "subject"}` |
//! | `POST /v1/face/verify` | [`FaceVerifyBody`] `{"session", "probes": [P0, P1]}` | [`FaceVerifyResponse`] `{"comparisons", "outputs": [P0, P1]}` |
//! | `POST /v1/face/identify` | [`FaceIdentifyBody`] `{"session", "probes": [P0, P1]}` | [`FaceIdentifyResponse`] `{"comparisons", "outputs": [P0, P1], "bytes_sent", "key_bytes", "stocked"}` |
//! | `GET /v1/face/stock` | — | [`crate::face::stock::StockStatus`] `{"ready", "comparisons", "refilling", "last_refill_ms", "last_key_bytes"}`, once no refill runs (docs/protocols/face.md §13.7) |
//!
//! The requests and answers of verify and identify name no subject and carry no result
//! (docs/protocols/face.md §13.10): a verification's subject is sealed inside the probes
//! (probe format 3; a body that still names a `subject` is refused), and `outputs` are P0's
//! and P1's output shares sealed to the reply key inside the client's probe (core's
//! `face::reply`, docs/protocols/face.md §13.9), which only the client (or the party whose
//! front door was called) opens — an identification's compared subjects are listed inside
//! them.
//!
//! Configuring starts a new dealer generation; the coordinator then retires the keys of
//! earlier generations at P0 and P1, so no comparison runs under the old threshold (the pool
//! is empty until the next refill).
//!
//! The *pool level* is the number of unused keys of the dealer's current configuration
//! generation that both evaluators hold: the minimum of P0's and P1's (one comparison uses one
//! key at each).
//!
//! Errors are [`crate::wire::ErrorBody`] with the face codes of [`crate::wire::codes`]:
//! `key_pool_exhausted` (503: run `privmatch face refill`), `unknown_subject` (404),
//! `template_sets_differ` and `key_claim_conflict` (503, transient: reseal the probe for a new
//! session and retry), `not_configured` (503: run `privmatch face configure`),
//! `rejected_by_party` (422, e.g. a probe of the wrong dimension), `protocol_error` (502).

use privmatch_core::wire::session::SessionId;
use serde::{Deserialize, Serialize};

use crate::wire::{check_on_duplicate, default_on_duplicate, from_base64_each, session_from_hex};

/// Default `target` of a refill.
pub const DEFAULT_REFILL_TARGET: i64 = 10_000;
/// Default keys per dealer batch.
pub const DEFAULT_REFILL_BATCH: i32 = 10_000;
/// Most keys P2 makes per `face_dealer_generate` call.
pub const MAX_REFILL_BATCH: i32 = 50_000;

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
    /// The next key batch number (status only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_batch: Option<i64>,
    /// Configure only: keys of earlier generations retired at P0 and P1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_keys: Option<[i64; 2]>,
    /// Configure only: why the keys of earlier generations could not be retired now (they
    /// are retired when the first batch of the new generation is stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// One row of an evaluator's `face_pool_status()`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRow {
    /// Metric of the keys.
    pub metric: String,
    /// Dimension of the keys.
    pub dim: i32,
    /// Dealer generation the keys were made under.
    pub generation: i64,
    /// Unused keys.
    pub available: i64,
    /// Batches with unused keys.
    pub batches: i64,
}

/// One evaluator's key pools.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartyPool {
    /// 0 or 1.
    pub party: u8,
    /// Its pools, per (metric, dim, generation); empty when it holds no key.
    pub pools: Vec<PoolRow>,
    /// Unused keys of the dealer's current generation (None when unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    /// Why the party could not be asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer to `GET /v1/face/pool`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FacePoolResponse {
    /// The dealer's configuration (None: not configured or unreachable).
    pub dealer: Option<DealerStatus>,
    /// Why the dealer's state is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dealer_error: Option<String>,
    /// P0's and P1's pools.
    pub parties: Vec<PartyPool>,
    /// The pool level: keys of the current generation both evaluators hold (None when it
    /// cannot be computed).
    pub level: Option<i64>,
}

/// The unused keys of one generation in one evaluator's pools.
pub fn available_for(rows: &[PoolRow], generation: i64) -> i64 {
    rows.iter()
        .filter(|r| r.generation == generation)
        .map(|r| r.available.max(0))
        .sum()
}

/// The per-evaluator keys of one generation, and the level (their minimum).
pub fn pool_level(pools: [&[PoolRow]; 2], generation: i64) -> ([i64; 2], i64) {
    let available = pools.map(|rows| available_for(rows, generation));
    (available, available[0].min(available[1]))
}

fn default_target() -> i64 {
    DEFAULT_REFILL_TARGET
}

fn default_batch() -> i32 {
    DEFAULT_REFILL_BATCH
}

/// The body of `POST /v1/face/refill`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaceRefillBody {
    /// The pool level to reach (default 10,000).
    #[serde(default = "default_target")]
    pub target: i64,
    /// Keys per dealer batch, 1..=50,000 (default 10,000).
    #[serde(default = "default_batch")]
    pub batch_size: i32,
    /// Stop after this many batches even below the target (the CLI asks one at a time to
    /// report progress); default: until the target is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batches: Option<u32>,
}

impl FaceRefillBody {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), String> {
        if self.target < 0 {
            return Err(format!("target must not be negative, got {}", self.target));
        }
        if !(1..=MAX_REFILL_BATCH).contains(&self.batch_size) {
            return Err(format!(
                "batch_size must be between 1 and {MAX_REFILL_BATCH}, got {}",
                self.batch_size
            ));
        }
        if self.max_batches == Some(0) {
            return Err("max_batches must be at least 1".into());
        }
        Ok(())
    }
}

/// The answer to `POST /v1/face/refill`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceRefillResponse {
    /// The dealer configuration the keys were made under.
    pub dealer: DealerStatus,
    /// The level asked for.
    pub target: i64,
    /// The pool level before.
    pub before: i64,
    /// The pool level after.
    pub after: i64,
    /// Batches dealt and stored.
    pub batches: u32,
    /// Keys stored at each evaluator.
    pub keys: i64,
    /// Whether the level reached the target.
    pub reached: bool,
    /// Parties whose commit recovery still has to complete (the batches are decided).
    #[serde(default)]
    pub pending_recovery: Vec<String>,
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

    fn row(generation: i64, available: i64) -> PoolRow {
        PoolRow {
            metric: "cosine".into(),
            dim: 512,
            generation,
            available,
            batches: 1,
        }
    }

    #[test]
    fn the_level_counts_the_current_generation_at_both_evaluators() {
        let p0 = [row(1, 500), row(2, 30), row(2, 20)];
        let p1 = [row(2, 40), row(1, 7)];
        assert_eq!(pool_level([&p0, &p1], 2), ([50, 40], 40));
        assert_eq!(pool_level([&p0, &p1], 3), ([0, 0], 0));
        assert_eq!(pool_level([&[], &p1], 1), ([0, 7], 0));
    }

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
    fn refill_bodies_have_defaults_and_ranges() {
        let body: FaceRefillBody = serde_json::from_str("{}").expect("parses");
        assert_eq!(body.target, 10_000);
        assert_eq!(body.batch_size, 10_000);
        assert!(body.validate().is_ok());
        for bad in [
            FaceRefillBody {
                target: -1,
                ..body.clone()
            },
            FaceRefillBody {
                batch_size: 0,
                ..body.clone()
            },
            FaceRefillBody {
                batch_size: 50_001,
                ..body.clone()
            },
            FaceRefillBody {
                max_batches: Some(0),
                ..body.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
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
