//! Error answers of the coordinator's HTTP API: [`ApiError`] (a status and the JSON
//! [`ErrorBody`]), the helpers handlers build them with, and the mapping of the failures every
//! modality shares (a party's error, a distributed transaction's) to statuses and codes.
//!
//! Statuses: 400 (bad request), 403 (a party refused an operator command), 409 (not unique),
//! 422 (a party rejected the content), 502 (a
//! party failed or the parties disagree), 503 (a party is unavailable, the parties hold
//! different template sets — retry with a new session — or a transaction's outcome is left to
//! recovery), 504 (a party timed out).

use std::convert::Infallible;
use std::fmt::Display;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::parties::PartyError;
use crate::txn::work::TxnError;
use crate::wire::{codes, ErrorBody};

/// An error answer: JSON [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The JSON body.
    pub body: ErrorBody,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// An error answer with a status, a code and a message.
pub fn error_with(status: StatusCode, code: &str, message: String) -> ApiError {
    ApiError {
        status,
        body: ErrorBody {
            error: message,
            code: Some(code.to_owned()),
            ..ErrorBody::default()
        },
    }
}

/// An error answer naming the party at fault and its SQLSTATE.
pub fn party_error(status: StatusCode, code: &str, message: String, err: &PartyError) -> ApiError {
    let mut api = error_with(status, code, message);
    api.body.party = Some(err.party.as_u8());
    api.body.sqlstate = err.sqlstate.clone();
    api
}

/// A 400 answer.
pub fn bad_request(message: impl Into<String>) -> ApiError {
    error_with(StatusCode::BAD_REQUEST, codes::BAD_REQUEST, message.into())
}

/// A 502 answer: the parties broke the protocol.
pub fn protocol_error(message: String) -> ApiError {
    error_with(StatusCode::BAD_GATEWAY, codes::PROTOCOL, message)
}

/// Parses a JSON request body (400 when it is not the expected shape).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid JSON body: {e}")))
}

/// Status and code of a party's failure during a session: unreachable or not ready → 503,
/// cancelled by a timeout → 504, rejected content → 422, anything else → 502.
pub fn party_failure_status(err: &PartyError) -> (StatusCode, &'static str) {
    let sqlstate = err.sqlstate.as_deref().unwrap_or("");
    let class = sqlstate.get(..2).unwrap_or("");
    match (sqlstate, class) {
        ("", _) => (StatusCode::SERVICE_UNAVAILABLE, codes::PARTY_UNAVAILABLE),
        ("57014", _) => (StatusCode::GATEWAY_TIMEOUT, codes::TIMEOUT),
        (_, "22" | "23") => (StatusCode::UNPROCESSABLE_ENTITY, codes::REJECTED),
        // A party refused an operator command (not its operator's, replayed).
        (_, "28") => (StatusCode::FORBIDDEN, codes::FORBIDDEN),
        (_, "08" | "53" | "55" | "57") => {
            (StatusCode::SERVICE_UNAVAILABLE, codes::PARTY_UNAVAILABLE)
        }
        _ => (StatusCode::BAD_GATEWAY, codes::PARTY_ERROR),
    }
}

impl From<Infallible> for ApiError {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

/// A transaction's failure; the work's own failure is answered as the modality maps it, with
/// the transaction's message.
impl<E: Display + Into<ApiError>> From<TxnError<E>> for ApiError {
    fn from(err: TxnError<E>) -> Self {
        let message = err.to_string();
        match err {
            TxnError::Aborted(party) => {
                // Classified as a search's party failure: an unreachable party is
                // `party_unavailable` (503, the front door's 08006), not a generic failure.
                let (status, code) = party_failure_status(&party);
                party_error(status, code, message, &party)
            }
            TxnError::Disagreement(_) => {
                error_with(StatusCode::INTERNAL_SERVER_ERROR, codes::PROTOCOL, message)
            }
            TxnError::Work(work) => {
                let mut api: ApiError = work.into();
                api.body.error = message;
                api
            }
            TxnError::InDoubt(party) => party_error(
                StatusCode::SERVICE_UNAVAILABLE,
                codes::IN_DOUBT,
                message,
                &party,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(sqlstate: Option<&str>) -> PartyError {
        PartyError {
            party: privmatch_core::party::PartyIndex::ALL[1],
            sqlstate: sqlstate.map(str::to_owned),
            message: String::new(),
        }
    }

    #[test]
    fn party_failures_map_to_statuses() {
        let status = |sqlstate| party_failure_status(&err(sqlstate)).0;
        assert_eq!(status(None), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status(Some("57014")), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(status(Some("22023")), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(status(Some("55000")), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(status(Some("XX000")), StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn transaction_failures_map_to_statuses() {
        let api = ApiError::from(TxnError::<Infallible>::Aborted(err(Some("23505"))));
        assert_eq!(api.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(api.body.party, Some(1));
        let api = ApiError::from(TxnError::<Infallible>::InDoubt(err(None)));
        assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.body.code.as_deref(), Some(codes::IN_DOUBT));
        let api = ApiError::from(TxnError::<Infallible>::Disagreement("x".into()));
        assert_eq!(api.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
}
