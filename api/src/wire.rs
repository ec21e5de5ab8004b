//! What travels between a client and the coordinator whatever the modality: the encodings of
//! binary values in JSON (standard padded base64 for sealed envelopes and probes, lower-case
//! hex for 16-byte session ids) and the shapes of the modality-neutral endpoints
//! (`GET /v1/status`, `POST /v1/party/pin`). Errors are [`crate::error`]'s; the modalities'
//! own bodies are in their modules.

use base64::Engine as _;
use privmatch_core::wire::session::{SessionId, SESSION_ID_LEN};
use serde::{Deserialize, Serialize};

/// Standard padded base64.
pub fn to_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes standard padded base64; `what` names the field in the error.
pub fn from_base64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("{what} is not standard base64: {e}"))
}

/// Decodes one non-empty base64 value per party (`texts[i]` for party i); errors name the
/// field and the party, e.g. `probes[1] (for P1)`.
pub fn from_base64_each<const N: usize>(
    texts: &[String; N],
    what: &str,
) -> Result<[Vec<u8>; N], String> {
    let mut out: [Vec<u8>; N] = std::array::from_fn(|_| Vec::new());
    for (i, (slot, text)) in out.iter_mut().zip(texts).enumerate() {
        *slot = from_base64(text, &format!("{what}[{i}] (for P{i})"))?;
        if slot.is_empty() {
            return Err(format!("{what}[{i}] (for P{i}) is empty"));
        }
    }
    Ok(out)
}

/// A session id as 32 lower-case hex digits.
pub fn session_to_hex(session: &SessionId) -> String {
    hex::encode(session)
}

/// Parses a session id written as hex; `what` names the field in the error.
pub fn session_from_hex(text: &str, what: &str) -> Result<SessionId, String> {
    let bytes = hex::decode(text).map_err(|e| format!("{what}: not hex: {e}"))?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        format!(
            "{what}: a session id has {SESSION_ID_LEN} bytes, got {}",
            b.len()
        )
    })
}

/// Checks an `on_duplicate` value: `skip` (leave an enrolled record as it is) or `error`
/// (abort the batch, nothing written).
pub fn check_on_duplicate(value: &str) -> Result<(), String> {
    if value == "skip" || value == "error" {
        Ok(())
    } else {
        Err("on_duplicate must be \"skip\" or \"error\"".into())
    }
}

/// The default `on_duplicate`: `skip`.
pub fn default_on_duplicate() -> String {
    "skip".into()
}

/// One party's line in `GET /v1/status`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct PartyStatus {
    /// Party index.
    pub party: u8,
    /// Whether the coordinator could query it.
    pub reachable: bool,
    /// Enrolled iris records.
    pub iris_records: Option<i64>,
    /// The party's key fingerprint, as it reports it (compare with the pinned one).
    pub fingerprint: Option<String>,
    /// Transactions prepared there and not yet finished.
    pub prepared_transactions: Option<i64>,
    /// The error, when unreachable.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_per_party_decode_with_the_field_named() {
        let texts = [to_base64(b"a"), to_base64(b"b")];
        assert_eq!(
            from_base64_each(&texts, "probes"),
            Ok([b"a".to_vec(), b"b".to_vec()])
        );
        let err = from_base64_each(&[to_base64(b"a"), "***".into()], "probes")
            .err()
            .unwrap_or_default();
        assert!(err.contains("probes[1] (for P1)"), "{err}");
        let err = from_base64_each(&[String::new()], "envelopes")
            .err()
            .unwrap_or_default();
        assert!(err.contains("envelopes[0] (for P0) is empty"), "{err}");
    }

    #[test]
    fn session_ids_are_sixteen_bytes_of_hex() {
        let id = [7u8; SESSION_ID_LEN];
        assert_eq!(session_from_hex(&session_to_hex(&id), "s"), Ok(id));
        assert!(session_from_hex("abcd", "s")
            .err()
            .unwrap_or_default()
            .contains("16 bytes"));
        assert!(session_from_hex("zz", "s").is_err());
        assert!(check_on_duplicate("skip").is_ok() && check_on_duplicate("error").is_ok());
        assert!(check_on_duplicate("replace").is_err());
    }
}

/// The body of `POST /v1/party/pin`: a peer pin signed by the operator of party `party`
/// (core's `crypto::sign` command of action `peer-pin`, base64), relayed to that party.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PinBody {
    /// The party the command is addressed to (0, 1 or 2).
    pub party: u8,
    /// The signed command (base64).
    pub command: String,
}

/// The answer to `POST /v1/party/pin`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PinResponse {
    /// The party that pinned the key.
    pub party: u8,
    /// The fingerprint of the key now pinned there.
    pub fingerprint: String,
}
