//! The coordinator's face endpoints (shapes in [`privmatch_api::face`]): the dealer's
//! configuration and state ([`crate::face::admin`]), enrolment and deletion (two-phase commit at P0
//! and P1, P2 with its marker row only, [`crate::face::work`]), verification and
//! identification (the round driver of [`crate::face::driver`]).
//! The coordinator relays sealed envelopes, probes and outputs: it never sees a share, a key,
//! the threshold, a comparison bit, nor (since 0.12.0) a subject of a verification or
//! identification — a verification's subject is sealed in the probe, an identification's
//! compared subjects are listed inside the sealed outputs (docs/protocols/face.md §14).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::routing::{get, post};
use axum::Json;

use crate::face::admin::{configure_dealer, dealer_state};
use crate::face::driver::{
    run_face_session, FaceErrorKind, FaceOutcome, FaceSessionError, Stocked,
};
use crate::face::stock::{FaceStock, StockStatus};
use crate::face::work::{Delete, Enroll};
use crate::parties::PartyError;
use crate::server::auth::Scope;
use crate::server::error::{
    bad_request, parse_json, party_error, party_failure_code, protocol_error, ApiError,
};
use crate::server::scoped::ScopedRoutes;
use crate::server::state::{AppState, SharedState};
use crate::txn::fault::altered_face_output;
use crate::txn::work::TxnError;
use privmatch_api::face::{
    DealerStatus, FaceConfigureBody, FaceDealerResponse, FaceDeleteBody, FaceDeleteResponse,
    FaceEnrollBody, FaceEnrollResponse, FaceIdentifyBody, FaceIdentifyResponse, FaceRequest,
    FaceVerifyBody, FaceVerifyResponse,
};
use privmatch_api::wire::{from_base64, to_base64};
use privmatch_api::ErrorCode;

/// The face routes and the API scope each needs, merged into the coordinator's API. They
/// share the dealing made ahead of time for the next identification ([`FaceStock`]).
pub fn routes() -> ScopedRoutes<SharedState> {
    let stock = Arc::new(FaceStock::default());
    ScopedRoutes::new()
        .route("/v1/face/configure", Scope::Admin, post(configure))
        .route("/v1/face/dealer", Scope::Admin, get(dealer))
        .route("/v1/face/enroll", Scope::Enroll, post(enroll))
        .route("/v1/face/delete", Scope::Delete, post(delete))
        .route("/v1/face/verify", Scope::Search, post(verify))
        .route("/v1/face/identify", Scope::Search, post(identify))
        .route("/v1/face/stock", Scope::Admin, get(stock_status))
        .map_router(|router| router.layer(Extension(stock)))
}

fn with_hint(message: String, hint: &str, marker: &str) -> String {
    if message.contains(marker) {
        message
    } else {
        format!("{message} — {hint}")
    }
}

/// Maps a party's face error to an answer, by SQLSTATE (see [`FaceErrorKind`]).
pub fn face_party_error(err: &PartyError, message: String) -> ApiError {
    let kind = FaceErrorKind::from_sqlstate(err.sqlstate.as_deref());
    let (code, message) = match kind {
        FaceErrorKind::UnknownSubject => (ErrorCode::UnknownSubject, message),
        FaceErrorKind::BadArgument => (ErrorCode::RejectedByParty, message),
        FaceErrorKind::SetsDiffer => (
            ErrorCode::TemplateSetsDiffer,
            with_hint(
                message,
                "P0 and P1 hold different face template sets for a moment (an enrolment or deletion is being committed or awaits recovery): retry with a new session",
                "retry",
            ),
        ),
        FaceErrorKind::KeyConflict => (
            ErrorCode::KeyClaimConflict,
            with_hint(
                message,
                "the session id or the stocked dealing was claimed by another session: retry with a new session",
                "retry",
            ),
        ),
        FaceErrorKind::Refused | FaceErrorKind::SessionNotFound => {
            (ErrorCode::ProtocolError, message)
        }
        // 55000 also reports a session's state (a round out of order, a template deleted
        // during the session, retired keys, an uncommitted opening): no configure hint there.
        FaceErrorKind::NotConfigured if !is_session_state(&message) => (
            ErrorCode::NotConfigured,
            with_hint(
                message,
                "run `privmatch face configure`",
                "face configure",
            ),
        ),
        FaceErrorKind::NotConfigured => (ErrorCode::WrongStep, message),
        FaceErrorKind::Other => (party_failure_code(err), message),
    };
    party_error(code, message, err)
}

impl From<FaceSessionError> for ApiError {
    fn from(err: FaceSessionError) -> Self {
        let message = err.to_string();
        match &err {
            FaceSessionError::Invalid(_) => bad_request(message),
            FaceSessionError::Party(party) => face_party_error(party, message),
            FaceSessionError::Timeout(party) => party_error(ErrorCode::Timeout, message, party),
            FaceSessionError::Protocol(_) => protocol_error(message),
        }
    }
}

/// A distributed transaction's failure: face SQLSTATEs get their own codes, the rest is
/// mapped as for iris.
fn face_txn_error(err: TxnError) -> ApiError {
    match &err {
        TxnError::Aborted(party)
            if FaceErrorKind::from_sqlstate(party.sqlstate.as_deref()) != FaceErrorKind::Other
                && !party
                    .sqlstate
                    .as_deref()
                    .is_some_and(|s| s.starts_with("22") || s == "23505") =>
        {
            face_party_error(party, err.to_string())
        }
        _ => ApiError::from(err),
    }
}

async fn configure(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<DealerStatus>, ApiError> {
    let request: FaceConfigureBody = parse_json(&body)?;
    let sealed = from_base64(&request.config, "config").map_err(bad_request)?;
    if sealed.is_empty() {
        return Err(bad_request("config is empty"));
    }
    let status = configure_dealer(&state.parties, &sealed)
        .await
        .map_err(|e| face_party_error(&e, format!("configuring the dealer: {e}")))?;
    tracing::info!(
        metric = status.metric,
        dim = status.dim,
        generation = status.generation,
        "face dealer configured"
    );
    Ok(Json(status))
}

async fn dealer(State(state): State<SharedState>) -> Json<FaceDealerResponse> {
    Json(dealer_state(&state.parties).await)
}

async fn enroll(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<FaceEnrollResponse>, ApiError> {
    let request: FaceEnrollBody = parse_json(&body)?;
    let work = Enroll {
        envelopes: request.decode().map_err(bad_request)?,
        on_duplicate: request.on_duplicate,
    };
    let outcome = state.txns.run(&work).await.map_err(face_txn_error)?;
    Ok(Json(FaceEnrollResponse {
        pending_recovery: outcome.pending_recovery(),
        results: outcome.result,
    }))
}

async fn delete(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<FaceDeleteResponse>, ApiError> {
    let request: FaceDeleteBody = parse_json(&body)?;
    privmatch_core::wire::envelope::validate_subject(&request.subject)
        .map_err(|e| bad_request(format!("subject: {e}")))?;
    let work = Delete {
        subject: request.subject,
    };
    let outcome = state.txns.run(&work).await.map_err(face_txn_error)?;
    Ok(Json(FaceDeleteResponse {
        pending_recovery: outcome.pending_recovery(),
        deleted: outcome.result,
        subject: work.subject,
    }))
}

/// Runs the session of a verification or identification (`what`, for the log), after
/// claiming its session id.
async fn compare(
    state: &AppState,
    stocked: Option<Stocked>,
    plan: FaceRequest,
    what: &str,
) -> Result<FaceOutcome, ApiError> {
    state.claim_sessions(&[plan.session]).await?;
    let outcome =
        run_face_session(&state.parties, stocked, &plan, state.options.search_timeout).await?;
    tracing::info!(
        comparisons = outcome.stats.comparisons,
        seconds = outcome.stats.micros as f64 / 1e6,
        "face {what}"
    );
    Ok(outcome)
}

async fn verify(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<FaceVerifyResponse>, ApiError> {
    let request: FaceVerifyBody = parse_json(&body)?;
    let plan = request.plan().map_err(bad_request)?;
    let outcome = compare(&state, None, plan, "verification").await?;
    Ok(Json(FaceVerifyResponse {
        comparisons: outcome.stats.comparisons,
        outputs: relayed_outputs(&outcome.outputs),
    }))
}

/// 1:N identification. It uses the dealing made ahead of time for the last compared list
/// when there is one, and afterwards starts the next such dealing in the background
/// ([`FaceStock`]), so P2's dealing is off the path of the next identification.
async fn identify(
    State(state): State<SharedState>,
    Extension(stock): Extension<Arc<FaceStock>>,
    body: Bytes,
) -> Result<Json<FaceIdentifyResponse>, ApiError> {
    let request: FaceIdentifyBody = parse_json(&body)?;
    let plan = request.plan().map_err(bad_request)?;
    let stocked = stock.take(state.options.search_timeout).await;
    let outcome = compare(&state, stocked, plan, "identification").await?;
    let stats = outcome.stats;
    let outputs = if stats.comparisons == 0 {
        Vec::new()
    } else {
        relayed_outputs(&outcome.outputs)
    };
    stock.spawn_refill(
        Arc::clone(&state.parties),
        outcome.ids,
        state.options.search_timeout,
    );
    Ok(Json(FaceIdentifyResponse {
        comparisons: stats.comparisons,
        outputs,
        bytes_sent: stats.bytes_sent,
        key_bytes: stats.key_bytes,
        stocked: stats.stocked,
    }))
}

/// P0's and P1's sealed outputs as relayed to the client (base64), unread: the coordinator
/// holds no key that opens them. The end-to-end tests model a coordinator that alters one in
/// transit ([`altered_face_output`], test builds only): the client must refuse it, naming
/// the party.
fn relayed_outputs(outputs: &[Vec<u8>; 2]) -> Vec<String> {
    let altered = altered_face_output();
    outputs
        .iter()
        .enumerate()
        .map(|(b, sealed)| {
            let mut sealed = sealed.clone();
            if altered == Some(b) {
                if let Some(last) = sealed.last_mut() {
                    *last ^= 1;
                }
            }
            to_base64(&sealed)
        })
        .collect()
}

/// The dealing made ahead of time for the next identification: waits until a running refill
/// ends (at most the call timeout), then answers whether one is ready, for how many templates,
/// and how long the last refill took.
async fn stock_status(
    State(state): State<SharedState>,
    Extension(stock): Extension<Arc<FaceStock>>,
) -> Json<StockStatus> {
    Json(stock.settled(state.options.search_timeout).await)
}

/// Whether a 55000 message reports a session's state rather than a missing configuration.
fn is_session_state(message: &str) -> bool {
    [
        "out of order",
        "deleted during the session",
        "no longer available",
        "opened in this transaction",
    ]
    .iter()
    .any(|phrase| message.contains(phrase))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use privmatch_core::party::PartyIndex;

    fn err(sqlstate: &str, message: &str) -> PartyError {
        PartyError {
            party: PartyIndex::ALL[0],
            sqlstate: Some(sqlstate.into()),
            message: message.into(),
        }
    }

    #[test]
    fn face_sqlstates_map_to_statuses_and_codes() {
        let cases = [
            ("P0002", StatusCode::NOT_FOUND, ErrorCode::UnknownSubject),
            (
                "22023",
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::RejectedByParty,
            ),
            (
                "40001",
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::TemplateSetsDiffer,
            ),
            (
                "23505",
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::KeyClaimConflict,
            ),
            ("08P01", StatusCode::BAD_GATEWAY, ErrorCode::ProtocolError),
            ("42704", StatusCode::BAD_GATEWAY, ErrorCode::ProtocolError),
            (
                "55000",
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::NotConfigured,
            ),
            ("XX000", StatusCode::BAD_GATEWAY, ErrorCode::PartyError),
        ];
        for (sqlstate, status, code) in cases {
            let api = ApiError::from(FaceSessionError::Party(err(sqlstate, "m")));
            assert_eq!(api.status, status, "{sqlstate}");
            assert_eq!(api.body.kind(), Some(code), "{sqlstate}");
            assert_eq!(api.body.sqlstate.as_deref(), Some(sqlstate));
            assert_eq!(api.body.party, Some(0));
        }
        let api = ApiError::from(FaceSessionError::Party(err(
            "55000",
            "round 2 is out of order: face session 00 has completed round 2",
        )));
        assert_eq!(api.status, StatusCode::CONFLICT);
        assert!(
            !api.body.error.contains("face configure"),
            "{}",
            api.body.error
        );
        let api = ApiError::from(FaceSessionError::Party(err("55000", "not configured")));
        assert!(
            api.body.error.contains("privmatch face configure"),
            "{}",
            api.body.error
        );
        // The party's own hint is not repeated.
        let api = ApiError::from(FaceSessionError::Party(err(
            "55000",
            "not configured (hint: run `privmatch face configure`)",
        )));
        assert_eq!(api.body.error.matches("face configure").count(), 1);
    }

    #[test]
    fn transaction_failures_keep_their_content_errors() {
        let api = face_txn_error(TxnError::Aborted(err("23505", "duplicate subject")));
        assert_eq!(api.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(api.body.kind(), Some(ErrorCode::RejectedByParty));
        let api = face_txn_error(TxnError::Aborted(err("55000", "not initialised")));
        assert_eq!(api.body.kind(), Some(ErrorCode::NotConfigured));
    }
}
