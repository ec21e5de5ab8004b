//! Error answers of the coordinator's HTTP API: [`ApiError`] (a status and the JSON
//! [`ErrorBody`]), the helpers handlers build them with, and the mapping of the failures every
//! modality shares (a party's error, a distributed transaction's) to codes. Each code's HTTP
//! status is `privmatch_api`'s table ([`ErrorCode::http_status`]): a handler picks the code,
//! never the status.

use std::convert::Infallible;
use std::fmt::Display;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::parties::PartyError;
use crate::txn::work::TxnError;
use privmatch_api::error::party_failure;
use privmatch_api::{ErrorBody, ErrorCode};

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

/// An error answer with a code (which gives the status) and a message.
pub fn error_with(code: ErrorCode, message: String) -> ApiError {
    ApiError {
        status: status_of(code),
        body: ErrorBody::new(code, message),
    }
}

/// The HTTP status of `code` (the API's table).
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// An error answer naming the party at fault and its SQLSTATE.
pub fn party_error(code: ErrorCode, message: String, err: &PartyError) -> ApiError {
    let mut api = error_with(code, message);
    api.body.party = Some(err.party.as_u8());
    api.body.sqlstate = err.sqlstate.clone();
    api
}

/// A 400 answer.
pub fn bad_request(message: impl Into<String>) -> ApiError {
    error_with(ErrorCode::BadRequest, message.into())
}

/// A 502 answer: the parties broke the protocol.
pub fn protocol_error(message: String) -> ApiError {
    error_with(ErrorCode::ProtocolError, message)
}

/// Parses a JSON request body (400 when it is not the expected shape).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid JSON body: {e}")))
}

/// The code of a party's failure during a session, by its SQLSTATE (the API's
/// [`party_failure`]).
pub fn party_failure_code(err: &PartyError) -> ErrorCode {
    party_failure(err.sqlstate.as_deref())
}

/// An answer for a party's failure, classified by [`party_failure_code`].
pub fn party_failure_error(message: String, err: &PartyError) -> ApiError {
    party_error(party_failure_code(err), message, err)
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
            // Classified as a search's party failure: an unreachable party is
            // `party_unavailable` (503, the front door's 08006), not a generic failure.
            TxnError::Aborted(party) => party_failure_error(message, &party),
            TxnError::Disagreement(_) => protocol_error(message),
            TxnError::Work(work) => {
                let mut api: ApiError = work.into();
                api.body.error = message;
                api
            }
            TxnError::InDoubt(party) => party_error(ErrorCode::InDoubt, message, &party),
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
        let status = |sqlstate| party_failure_error(String::new(), &err(sqlstate)).status;
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
        assert_eq!(api.body.kind(), Some(ErrorCode::InDoubt));
        let api = ApiError::from(TxnError::<Infallible>::Disagreement("x".into()));
        assert_eq!(api.status, StatusCode::BAD_GATEWAY);
    }
}
