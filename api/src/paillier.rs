//! The JSON shapes of the coordinator's endpoints for device-held face templates (packed
//! Paillier, Game-Set-MATCH: Agrawal, Badrinarayanan, Mukherjee, Rindal, CCS 2020, ePrint
//! 2020/1363), shared by the server (`privmatch_coordinator::paillier::routes`) and the client
//! (`privmatch_coordinator::paillier::client`). Binary values (protocol messages, records, sealed inputs)
//! are standard padded base64; session ids are 32 hex digits; protocols are `pi1`, `pi2`,
//! `pi3`.
//!
//! | method, path | scope | body | answer |
//! |---|---|---|---|
//! | `GET /v1/paillier/enroll-params` | enroll | — | [`ServiceInfo`]: the SP's party, signing key, ring-Pedersen parameters, parameter sets |
//! | `POST /v1/paillier/enroll-begin` | enroll | [`EnrollBeginBody`] `{"device", "session", "request"}` | [`EnrollBeginResponse`] `{"challenge": b64 \| null}` |
//! | `POST /v1/paillier/enroll-finish` | enroll | [`EnrollFinishBody`] `{"device", "response": b64 \| null}` | [`RecordResponse`] `{"device", "record"}` |
//! | `POST /v1/paillier/device` | search | [`DeviceBody`] `{"device"}` | [`RecordResponse`] `{"device", "record", "threshold"}` |
//! | `GET /v1/paillier/devices` | admin | — | [`DevicesResponse`] |
//! | `POST /v1/paillier/delete` | delete | [`DeleteBody`] `{"device", "signature"}` or `{"device", "command"}` | [`DeleteResponse`] `{"device", "deleted"}` |
//! | `POST /v1/paillier/verify` | search | [`VerifyBody`] `{"device", "protocol", "session", "terminal_input"}` | [`SessionView`] (state `waiting`) |
//! | `POST /v1/paillier/outcome` | search | [`WaitBody`] `{"session", "wait_ms"}` | [`SessionView`] |
//! | `POST /v1/paillier/mailbox` | device | [`MailboxBody`] `{"device", "wait_ms", "max", "time_ms", "signature"}` | [`MailboxResponse`] `{"messages": [DeviceMessage]}` |
//! | `POST /v1/paillier/reply` | device | [`ReplyBody`] `{"device", "session", "round", "message" \| "error", "signature"}` | [`ReplyResponse`] `{"session", "next", "closed"}` |
//!
//! A session's `state` ([`SessionState`]) as the coordinator reports it: `waiting` (for the
//! device), `done` (over: the outcome is in `verdict`, sealed to the terminal's reply key, so
//! the coordinator does not know it), `failed` (with `error`), `expired`. `match`, `no_match`
//! and `refused` are what the terminal reads in the verdict (and the device learns); a
//! coordinator that reports one of them in the clear is not believed. Errors are [`crate::error::ErrorBody`] with the
//! codes of [`crate::error::ErrorCode`]: `unknown_device` (404), `unknown_session` (404),
//! `wrong_step` (409), `not_configured` (503: no service provider, or it enrols no device
//! under the protocol), `rejected_by_party` (422: a malformed message, a refused proof or
//! a tampered input), `bad_request` (400).

use privmatch_core::paillier::device_signature::Statement;
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::record::check_device_id;
use privmatch_core::wire::session::SessionId;
use serde::{Deserialize, Serialize};

use crate::wire::{from_base64, session_from_hex};

/// The longest a long poll (mailbox, outcome) waits, in milliseconds.
pub const MAX_WAIT_MS: u64 = 30_000;
/// The default wait of a long poll, in milliseconds.
pub const DEFAULT_WAIT_MS: u64 = 25_000;
/// The most messages one mailbox answer carries.
pub const MAX_MESSAGES: usize = 16;

/// The protocol named `pi1`, `pi2` or `pi3`.
pub fn parse_protocol(name: &str) -> Result<Protocol, String> {
    Protocol::from_name(name).ok_or_else(|| {
        let [a, b, c] = Protocol::NAMES;
        format!(
            "protocol {:?}: {a}, {b} or {c}",
            name.chars().take(16).collect::<String>()
        )
    })
}

/// Checks a device id (1 to 64 of `A-Z a-z 0-9 . _ : -`), naming the field.
pub fn check_device(device: &str) -> Result<(), String> {
    check_device_id(device).map_err(|e| format!("device: {e}"))
}

/// Decodes a non-empty base64 field.
fn bytes_of(text: &str, what: &str) -> Result<Vec<u8>, String> {
    let bytes = from_base64(text, what)?;
    if bytes.is_empty() {
        return Err(format!("{what} is empty"));
    }
    Ok(bytes)
}

/// One parameter set the service provider enrols under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamSet {
    /// `pi1`, `pi2` or `pi3`.
    pub protocol: String,
    /// The canonical parameters (`Params::to_bytes`), base64.
    pub params: String,
    /// How long new records stay valid.
    pub valid_days: i32,
}

/// The answer to `GET /v1/paillier/enroll-params`: what a device needs to enrol. The device
/// checks the signing key against its pinned one, never trusts this copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    /// The service provider's party index.
    pub party: u8,
    /// The public half of its signing key (hex).
    pub signing_key: String,
    /// Its ring-Pedersen parameters for the device key proof (base64).
    pub ring_pedersen: String,
    /// The parameter sets, one per protocol.
    pub parameters: Vec<ParamSet>,
}

/// The body of `POST /v1/paillier/enroll-begin`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EnrollBeginBody {
    /// The device id.
    pub device: String,
    /// The enrolment session the device's proofs are bound to (hex, 16 bytes).
    pub session: String,
    /// The enrolment request (`DeviceEnrolment::start`), base64.
    pub request: String,
}

impl EnrollBeginBody {
    /// Checks and decodes: (session, request).
    pub fn decode(&self) -> Result<(SessionId, Vec<u8>), String> {
        check_device(&self.device)?;
        Ok((
            session_from_hex(&self.session, "session")?,
            bytes_of(&self.request, "request")?,
        ))
    }
}

/// The answer to `POST /v1/paillier/enroll-begin`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollBeginResponse {
    /// The norm challenge (Π2, Π3; base64), or null (Π1).
    pub challenge: Option<String>,
}

/// The body of `POST /v1/paillier/enroll-finish`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EnrollFinishBody {
    /// The device id.
    pub device: String,
    /// The answer to the norm challenge (base64), or null (Π1).
    pub response: Option<String>,
}

impl EnrollFinishBody {
    /// Checks and decodes the response.
    pub fn decode(&self) -> Result<Option<Vec<u8>>, String> {
        check_device(&self.device)?;
        self.response
            .as_deref()
            .map(|r| bytes_of(r, "response"))
            .transpose()
    }
}

/// A device's signed record (`SignedTemplate` bytes, base64).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordResponse {
    /// The device id.
    pub device: String,
    /// The record with the service provider's signature, base64.
    pub record: String,
    /// `POST /v1/paillier/device` only: the threshold of the service provider's policy for
    /// the record's protocol (`paillier_policies()`), which a terminal's input must carry (the
    /// SP refuses any other and signs the one it applies into Round 2); absent when no policy
    /// is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<i64>,
}

/// A body naming one device: `POST /v1/paillier/device`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceBody {
    /// The device id.
    pub device: String,
}

/// One enrolled device in `GET /v1/paillier/devices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceEntry {
    /// The device id.
    pub device: String,
    /// `pi1`, `pi2` or `pi3`.
    pub protocol: String,
    /// When its record expires (RFC 3339).
    pub expires_at: String,
    /// When it enrolled (RFC 3339).
    pub enrolled_at: String,
}

/// The answer to `GET /v1/paillier/devices`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesResponse {
    /// The enrolled devices, by id.
    pub devices: Vec<DeviceEntry>,
}

/// The body of `POST /v1/paillier/delete`: the device asks for its record's deletion with
/// its signature, or (a lost device) the SP's operator with a signed command.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeleteBody {
    /// The device id.
    pub device: String,
    /// The device's signature (core's `paillier::device_signature`, `Statement::delete` of the
    /// device id and its stored record) with its enrolled Paillier key, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// The SP operator's signed command (core's `crypto::sign`, action `paillier-delete`,
    /// payload the device id), base64: for a device whose key is lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// Who authorises a deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteAuthority {
    /// The device's signature.
    Device(Vec<u8>),
    /// The SP operator's signed command.
    Operator(Vec<u8>),
}

impl DeleteBody {
    /// Checks and decodes the authorisation: exactly one of `signature` and `command`.
    pub fn authority(&self) -> Result<DeleteAuthority, String> {
        check_device(&self.device)?;
        match (&self.signature, &self.command) {
            (Some(s), None) => Ok(DeleteAuthority::Device(bytes_of(s, "signature")?)),
            (None, Some(c)) => Ok(DeleteAuthority::Operator(bytes_of(c, "command")?)),
            _ => Err(
                "a deletion carries either the device's \"signature\" or the operator's signed \"command\""
                    .into(),
            ),
        }
    }
}

/// The answer to `POST /v1/paillier/delete`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteResponse {
    /// The device id.
    pub device: String,
    /// Whether a record (or a pending enrolment) was removed.
    pub deleted: bool,
}

/// The body of `POST /v1/paillier/verify`: a terminal opens a matching session.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VerifyBody {
    /// The enrolled device to match against.
    pub device: String,
    /// `pi1`, `pi2` or `pi3` (the device's enrolled protocol).
    pub protocol: String,
    /// The session id sealed inside the terminal input (hex).
    pub session: String,
    /// `TerminalInput` sealed to the service provider, base64.
    pub terminal_input: String,
}

/// A decoded [`VerifyBody`].
#[derive(Clone, Debug)]
pub struct VerifyRequest {
    /// The device.
    pub device: String,
    /// The protocol.
    pub protocol: Protocol,
    /// The session id.
    pub session: SessionId,
    /// The sealed terminal input.
    pub terminal_input: Vec<u8>,
}

impl VerifyBody {
    /// Checks and decodes the request.
    pub fn decode(&self) -> Result<VerifyRequest, String> {
        check_device(&self.device)?;
        Ok(VerifyRequest {
            device: self.device.clone(),
            protocol: parse_protocol(&self.protocol)?,
            session: session_from_hex(&self.session, "session")?,
            terminal_input: bytes_of(&self.terminal_input, "terminal_input")?,
        })
    }
}

fn default_wait() -> u64 {
    DEFAULT_WAIT_MS
}

/// The body of `POST /v1/paillier/outcome`: a terminal waits for its session's outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaitBody {
    /// The session id (hex).
    pub session: String,
    /// How long to wait for the outcome, in ms (at most [`MAX_WAIT_MS`]; 0: answer at once).
    #[serde(default = "default_wait")]
    pub wait_ms: u64,
}

/// Where a matching session stands, as the terminal sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// The device has not answered yet.
    Waiting,
    /// The capture matches the device's template.
    Match,
    /// It does not.
    NoMatch,
    /// The service provider refused the device's answer (Π2, Π3: a cheating device).
    Refused,
    /// The session failed (see `error`).
    Failed,
    /// Nobody finished it in time.
    Expired,
    /// Over, as the coordinator sees it: the outcome is sealed to the terminal (`verdict`).
    Done,
}

impl SessionState {
    /// `match` or `no_match` for a match bit.
    pub fn of_bit(matched: bool) -> Self {
        if matched {
            SessionState::Match
        } else {
            SessionState::NoMatch
        }
    }

    /// Whether the session is over.
    pub fn is_final(self) -> bool {
        self != SessionState::Waiting
    }
}

/// A matching session as the coordinator knows it: nothing but its parties and its outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionView {
    /// The session id (hex).
    pub session: String,
    /// The device.
    pub device: String,
    /// `pi1`, `pi2` or `pi3`.
    pub protocol: String,
    /// Where it stands.
    pub state: SessionState,
    /// Why it failed (`failed`, `expired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `done`: the outcome sealed to the terminal's reply key (core's
    /// `paillier::sealed::TerminalVerdict`, base64) with, inside, the service provider's
    /// Ed25519 signature of the decision (Π2, Π3; core's `paillier::verdict`) or the device's
    /// signature of its Round 3 bit (Π1; core's `paillier::device_signature`), which the
    /// terminal checks before it believes `match`, `no_match` or `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
}

/// The body of `POST /v1/paillier/mailbox`: a device waits for sessions addressed to it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MailboxBody {
    /// The device id.
    pub device: String,
    /// How long to wait for a message, in ms (at most [`MAX_WAIT_MS`]).
    #[serde(default = "default_wait")]
    pub wait_ms: u64,
    /// The most messages to take (1 to [`MAX_MESSAGES`], default the latter): a device that
    /// will serve only so many sessions takes no more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<usize>,
    /// When the device made the poll, Unix time in ms (accepted within
    /// [`MAX_CLOCK_SKEW_MS`] of the coordinator's clock).
    pub time_ms: i64,
    /// The device's signature of the poll (core's `paillier::device_signature`,
    /// `Statement::mailbox(device, time_ms)`) with its enrolled Paillier key, base64.
    pub signature: String,
}

/// How far a mailbox poll's `time_ms` may be from the coordinator's clock.
pub const MAX_CLOCK_SKEW_MS: i64 = 300_000;

/// Unix time in milliseconds: what a device stamps its mailbox polls with, and what the
/// coordinator compares the stamp to.
pub fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One protocol message for a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMessage {
    /// The session id (hex).
    pub session: String,
    /// `pi1`, `pi2` or `pi3`.
    pub protocol: String,
    /// The round of [ABMR20] the message is (2, or 4).
    pub round: u8,
    /// The message, base64.
    pub message: String,
}

/// The answer to `POST /v1/paillier/mailbox`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxResponse {
    /// Round 2 of each new session for the device (empty when the wait ran out), each given
    /// once.
    pub messages: Vec<DeviceMessage>,
}

/// The body of `POST /v1/paillier/reply`: the device's message of a round, or why it gives up.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplyBody {
    /// The device id.
    pub device: String,
    /// The session id (hex).
    pub session: String,
    /// The round of [ABMR20] the message is (3, or 5 in Π3).
    pub round: u8,
    /// The message, base64 (absent with `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why the device abandons the session (its message is then absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The device's signature of the reply (core's `paillier::device_signature`:
    /// `Statement::reply_message` or `reply_abandon` for this device, session and round)
    /// with its enrolled Paillier key, base64. For Π1 Round 3 it reaches the terminal as the
    /// session's `verdict`.
    pub signature: String,
}

/// What a device posts: its message, or the reason it gives up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The round's message.
    Message(Vec<u8>),
    /// The device abandons the session.
    Abandon(String),
}

/// The longest reason a device may give for abandoning a session.
pub const MAX_REASON: usize = 300;

impl ReplyBody {
    /// Checks and decodes: (session, round, reply, signature).
    pub fn decode(&self) -> Result<(SessionId, u8, Reply, Vec<u8>), String> {
        check_device(&self.device)?;
        let session = session_from_hex(&self.session, "session")?;
        let reply = match (&self.message, &self.error) {
            (Some(m), None) => Reply::Message(bytes_of(m, "message")?),
            (None, Some(e)) if e.chars().count() <= MAX_REASON => Reply::Abandon(e.clone()),
            (None, Some(_)) => return Err(format!("a reason has at most {MAX_REASON} characters")),
            _ => return Err("a reply carries either \"message\" or \"error\"".into()),
        };
        let signature = bytes_of(&self.signature, "signature")?;
        Ok((session, self.round, reply, signature))
    }
}

impl Reply {
    /// What the device signs for this reply of `round` in `session`.
    pub fn statement(&self, device: &str, session: &SessionId, round: u8) -> Statement {
        match self {
            Reply::Message(m) => Statement::reply_message(device, session, round, m),
            Reply::Abandon(reason) => Statement::reply_abandon(device, session, round, reason),
        }
    }
}

impl MailboxBody {
    /// Checks and decodes the signature.
    pub fn signature_bytes(&self) -> Result<Vec<u8>, String> {
        check_device(&self.device)?;
        bytes_of(&self.signature, "signature")
    }
}

/// The answer to `POST /v1/paillier/reply`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyResponse {
    /// The session id (hex).
    pub session: String,
    /// The next message for the device, if the protocol has one (Π2 Round 4, Π3 Round 4).
    pub next: Option<DeviceMessage>,
    /// Whether the session is over (nothing more is expected from the device).
    pub closed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::to_base64;

    #[test]
    fn bodies_decode_and_refuse_with_the_field_named() {
        let verify = VerifyBody {
            device: "phone-1".into(),
            protocol: "pi2".into(),
            session: hex::encode([5u8; 16]),
            terminal_input: to_base64(b"box"),
        };
        let request = verify.decode().expect("valid");
        assert_eq!(request.protocol, Protocol::Pi2);
        assert_eq!(request.session, [5u8; 16]);
        let mut bad = verify.clone();
        bad.protocol = "pi4".into();
        assert!(bad
            .decode()
            .err()
            .unwrap_or_default()
            .contains("pi1, pi2 or pi3"));
        let mut bad = verify.clone();
        bad.device = "has space".into();
        assert!(bad.decode().err().unwrap_or_default().starts_with("device"));
        let mut bad = verify;
        bad.terminal_input = String::new();
        assert!(bad
            .decode()
            .err()
            .unwrap_or_default()
            .contains("terminal_input is empty"));

        let reply = ReplyBody {
            device: "phone-1".into(),
            session: hex::encode([1u8; 16]),
            round: 3,
            message: Some(to_base64(b"x")),
            error: None,
            signature: to_base64(b"sig"),
        };
        assert_eq!(
            reply.decode().expect("valid").2,
            Reply::Message(b"x".to_vec())
        );
        let both = ReplyBody {
            error: Some("no".into()),
            ..reply.clone()
        };
        assert!(both.decode().is_err());
        let neither = ReplyBody {
            message: None,
            ..reply.clone()
        };
        assert!(neither.decode().is_err());
        let long = ReplyBody {
            message: None,
            error: Some("e".repeat(1000)),
            ..reply.clone()
        };
        assert!(long
            .decode()
            .err()
            .unwrap_or_default()
            .contains("at most 300 characters"));
        let unsigned = ReplyBody {
            signature: String::new(),
            ..reply.clone()
        };
        assert!(unsigned
            .decode()
            .err()
            .unwrap_or_default()
            .contains("signature"));
        let wait: WaitBody =
            serde_json::from_str(&format!("{{\"session\": \"{}\"}}", hex::encode([0u8; 16])))
                .expect("parses");
        assert_eq!(wait.wait_ms, DEFAULT_WAIT_MS);
    }

    #[test]
    fn states_and_protocols_have_their_documented_names() {
        for p in [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3] {
            assert_eq!(parse_protocol(p.name()), Ok(p));
        }
        assert_eq!(
            serde_json::to_string(&SessionState::NoMatch)
                .ok()
                .as_deref(),
            Some("\"no_match\"")
        );
        assert!(!SessionState::Waiting.is_final());
        assert!(SessionState::Refused.is_final());
    }
}
