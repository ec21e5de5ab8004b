//! The coordinator's endpoints for device-held face templates (packed Paillier,
//! Game-Set-MATCH [ABMR20]; shapes in [`privmatch_api::paillier`]): enrolment, fetch, listing and
//! deletion at the service provider ([`crate::paillier::sp`]), and the relay of matching
//! sessions between a terminal, a device and the service provider
//! ([`crate::paillier::driver`]). The coordinator relays protocol messages (encrypted under
//! the device's key, or sealed to the service provider) and learns the outcome it is given;
//! it stores no secret, and sessions expire.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Json};
use privmatch_core::paillier::cipher::PublicKey;
use privmatch_core::paillier::device_signature::{self, DeviceSignatureError, Statement};
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SessionId;

use crate::paillier::driver::{Relay, RelayError, Status};
use crate::paillier::sp::{DeviceKeys, ServiceProvider, SpError};
use crate::parties::PartyError;
use crate::server::auth::Credential;
use crate::server::auth::Scope;
use crate::server::error::{
    bad_request, error_with, parse_json, party_error, party_failure_code, protocol_error, ApiError,
};
use crate::server::scoped::ScopedRoutes;
use crate::server::state::SharedState;
use privmatch_api::paillier::{
    check_device, unix_now_ms, DeleteAuthority, DeleteBody, DeleteResponse, DeviceBody,
    DeviceMessage, DevicesResponse, EnrollBeginBody, EnrollBeginResponse, EnrollFinishBody,
    MailboxBody, MailboxResponse, RecordResponse, Reply, ReplyBody, ReplyResponse, ServiceInfo,
    SessionState, SessionView, VerifyBody, WaitBody, MAX_CLOCK_SKEW_MS, MAX_MESSAGES, MAX_WAIT_MS,
};
use privmatch_api::wire::{session_from_hex, session_to_hex, to_base64};
use privmatch_api::ErrorCode;

/// What the Paillier handlers share: the coordinator's state, the service provider's calls
/// and the relay of sessions.
#[derive(Clone)]
pub struct PaillierState {
    app: SharedState,
    sp: Arc<ServiceProvider>,
    relay: Arc<Relay>,
    keys: Arc<DeviceKeys>,
}

/// The Paillier routes and the API scope each needs, merged into the coordinator's API (they
/// carry their own state).
pub fn routes(app: SharedState) -> ScopedRoutes<SharedState> {
    let state = PaillierState {
        sp: Arc::new(ServiceProvider::new(
            app.parties.clone(),
            app.options.search_timeout,
        )),
        relay: Arc::new(Relay::new()),
        keys: Arc::new(DeviceKeys::default()),
        app,
    };
    scoped().map_router(|router| router.with_state(state))
}

/// The Paillier routes before their state: a terminal's session needs the search scope, a
/// device's messages in it the device scope.
pub(crate) fn scoped() -> ScopedRoutes<PaillierState> {
    ScopedRoutes::new()
        .route(
            "/v1/paillier/enroll-params",
            Scope::Enroll,
            get(enroll_params),
        )
        .route(
            "/v1/paillier/enroll-begin",
            Scope::Enroll,
            post(enroll_begin),
        )
        .route(
            "/v1/paillier/enroll-finish",
            Scope::Enroll,
            post(enroll_finish),
        )
        .route("/v1/paillier/device", Scope::Search, post(device))
        .route("/v1/paillier/devices", Scope::Admin, get(devices))
        .route("/v1/paillier/delete", Scope::Delete, post(delete))
        .route("/v1/paillier/verify", Scope::Search, post(verify))
        .route("/v1/paillier/outcome", Scope::Search, post(outcome))
        .route("/v1/paillier/mailbox", Scope::Device, post(mailbox))
        .route("/v1/paillier/reply", Scope::Device, post(reply))
}

impl From<SpError> for ApiError {
    fn from(err: SpError) -> Self {
        let message = err.to_string();
        match &err {
            SpError::NoServiceProvider => error_with(ErrorCode::NotConfigured, message),
            SpError::Timeout(party, _) => party_error(
                ErrorCode::Timeout,
                message,
                &PartyError {
                    party: PartyIndex::ALL[usize::from(*party)],
                    sqlstate: None,
                    message: String::new(),
                },
            ),
            SpError::Malformed(..) => protocol_error(message),
            SpError::Refused(_) => error_with(ErrorCode::RejectedByParty, message),
            SpError::Party(party) => {
                let code = match party.sqlstate.as_deref() {
                    Some("P0002") => ErrorCode::UnknownDevice,
                    Some("55000") => ErrorCode::NotConfigured,
                    // A device's message the SP refuses (a wire error or a refused proof).
                    Some("08P01") => ErrorCode::RejectedByParty,
                    _ => party_failure_code(party),
                };
                party_error(code, message, party)
            }
        }
    }
}

impl From<RelayError> for ApiError {
    fn from(err: RelayError) -> Self {
        let message = err.to_string();
        match err {
            RelayError::Unknown(_) => error_with(ErrorCode::UnknownSession, message),
            RelayError::OtherDevice(_) | RelayError::WrongStep { .. } => {
                error_with(ErrorCode::WrongStep, message)
            }
            RelayError::Full(_) => error_with(ErrorCode::TooBusy, message),
        }
    }
}

fn wait_of(wait_ms: u64) -> Duration {
    Duration::from_millis(wait_ms.min(MAX_WAIT_MS))
}

fn view(session: &SessionId, status: Status) -> SessionView {
    SessionView {
        session: session_to_hex(session),
        device: status.device,
        protocol: status.protocol.name().to_owned(),
        state: status.state,
        error: status.error,
        verdict: status.verdict.as_deref().map(to_base64),
    }
}

async fn enroll_params(State(s): State<PaillierState>) -> Result<Json<ServiceInfo>, ApiError> {
    Ok(Json(s.sp.info().await?))
}

async fn enroll_begin(
    State(s): State<PaillierState>,
    body: Bytes,
) -> Result<Json<EnrollBeginResponse>, ApiError> {
    let request: EnrollBeginBody = parse_json(&body)?;
    let (session, bytes) = request.decode().map_err(bad_request)?;
    let challenge = s.sp.enroll_begin(&request.device, &bytes, &session).await?;
    Ok(Json(EnrollBeginResponse {
        challenge: challenge.as_deref().map(to_base64),
    }))
}

async fn enroll_finish(
    State(s): State<PaillierState>,
    body: Bytes,
) -> Result<Json<RecordResponse>, ApiError> {
    let request: EnrollFinishBody = parse_json(&body)?;
    let response = request.decode().map_err(bad_request)?;
    let record =
        s.sp.enroll_finish(&request.device, response.as_deref())
            .await?;
    tracing::info!("paillier device enrolled");
    Ok(Json(RecordResponse {
        device: request.device,
        record: to_base64(&record),
        threshold: None,
    }))
}

async fn device(
    State(s): State<PaillierState>,
    body: Bytes,
) -> Result<Json<RecordResponse>, ApiError> {
    let request: DeviceBody = parse_json(&body)?;
    check_device(&request.device).map_err(bad_request)?;
    let record = s.sp.record(&request.device).await?;
    // The policy threshold of the record's protocol, for the terminal (the SP checks it).
    let threshold = match SignedTemplate::from_bytes(&record) {
        Ok(signed) => {
            s.sp.policy_threshold(signed.record.params.protocol())
                .await?
        }
        Err(_) => None,
    };
    Ok(Json(RecordResponse {
        device: request.device,
        record: to_base64(&record),
        threshold,
    }))
}

async fn devices(State(s): State<PaillierState>) -> Result<Json<DevicesResponse>, ApiError> {
    Ok(Json(DevicesResponse {
        devices: s.sp.devices().await?,
    }))
}

async fn delete(
    State(s): State<PaillierState>,
    body: Bytes,
) -> Result<Json<DeleteResponse>, ApiError> {
    let request: DeleteBody = parse_json(&body)?;
    let deleted = match request.authority().map_err(bad_request)? {
        DeleteAuthority::Device(signature) => s.sp.delete(&request.device, &signature).await?,
        // A lost device: the SP's operator signed the command (the SP checks it names this
        // device; the coordinator can neither forge nor replay one).
        DeleteAuthority::Operator(command) => s.sp.delete_signed(&command).await?,
    };
    Ok(Json(DeleteResponse {
        device: request.device,
        deleted,
    }))
}

/// The terminal opens a session: Round 2 at the SP (the session opened there first, charged
/// to the device's and to this credential's budgets), queued for the device.
async fn verify(
    State(s): State<PaillierState>,
    credential: Option<Extension<Credential>>,
    body: Bytes,
) -> Result<Json<SessionView>, ApiError> {
    let request: VerifyBody = parse_json(&body)?;
    let plan = request.decode().map_err(bad_request)?;
    // The terminal is the API credential that called (its budget at the SP); a server run
    // without credentials (tests, local development) is one terminal.
    let terminal = credential.map_or_else(|| "anonymous".to_owned(), |c| c.0 .0.clone());
    s.app.claim_sessions(&[plan.session]).await?;
    let round2 =
        s.sp.round2(plan.protocol, &plan.device, &plan.terminal_input, &terminal)
            .await?;
    s.relay
        .open(&plan.device, plan.protocol, plan.session, round2)?;
    // The session id the terminal sealed its input to, as the SP's and the clients' lines
    // carry it: one session is found in every log by it (never a value).
    tracing::info!(
        session = %session_to_hex(&plan.session),
        protocol = plan.protocol.name(),
        "paillier session opened"
    );
    let status = s
        .relay
        .status(&plan.session)
        .ok_or_else(|| RelayError::Unknown(session_to_hex(&plan.session)))?;
    Ok(Json(view(&plan.session, status)))
}

/// The terminal waits for its session's outcome.
async fn outcome(
    State(s): State<PaillierState>,
    body: Bytes,
) -> Result<Json<SessionView>, ApiError> {
    let request: WaitBody = parse_json(&body)?;
    let session = session_from_hex(&request.session, "session").map_err(bad_request)?;
    let status = s
        .relay
        .wait_outcome(&session, wait_of(request.wait_ms))
        .await
        .ok_or_else(|| RelayError::Unknown(request.session.clone()))?;
    Ok(Json(view(&session, status)))
}

/// The device waits for the Round 2 messages addressed to it.
async fn mailbox(
    State(s): State<PaillierState>,
    body: Bytes,
) -> Result<Json<MailboxResponse>, ApiError> {
    let request: MailboxBody = parse_json(&body)?;
    let signature = request.signature_bytes().map_err(bad_request)?;
    let skew = unix_now_ms().abs_diff(request.time_ms);
    if skew > MAX_CLOCK_SKEW_MS.unsigned_abs() {
        return Err(signature_refused(format!(
            "the poll's time_ms is {} s from the coordinator's clock (at most {} s): check the \
             device's clock",
            skew / 1000,
            MAX_CLOCK_SKEW_MS / 1000
        )));
    }
    let statement = Statement::mailbox(&request.device, request.time_ms);
    check_signature(&s, &request.device, &statement, &signature).await?;
    let max = request.max.unwrap_or(MAX_MESSAGES);
    if !(1..=MAX_MESSAGES).contains(&max) {
        return Err(bad_request(format!("max must be 1 to {MAX_MESSAGES}")));
    }
    let taken = s
        .relay
        .wait_messages(&request.device, max, wait_of(request.wait_ms))
        .await;
    Ok(Json(MailboxResponse {
        messages: taken
            .into_iter()
            .map(|d| DeviceMessage {
                session: session_to_hex(&d.session),
                protocol: d.protocol.name().to_owned(),
                round: 2,
                message: to_base64(&d.message),
            })
            .collect(),
    }))
}

/// The device posts its message of a round (or gives up): the SP's next step, the session's
/// end or its next message for the device.
async fn reply(
    State(s): State<PaillierState>,
    body: Bytes,
) -> Result<Json<ReplyResponse>, ApiError> {
    let request: ReplyBody = parse_json(&body)?;
    let (session, round, answer, signature) = request.decode().map_err(bad_request)?;
    let statement = answer.statement(&request.device, &session, round);
    check_signature(&s, &request.device, &statement, &signature).await?;
    let protocol = s.relay.claim(&session, &request.device, round)?;
    let message = match answer {
        Reply::Message(message) => message,
        Reply::Abandon(reason) => {
            s.relay.finish(
                &session,
                SessionState::Failed,
                Some(format!("the device abandoned the session: {reason}")),
            );
            return Ok(Json(ReplyResponse {
                session: session_to_hex(&session),
                next: None,
                closed: true,
            }));
        }
    };
    tracing::info!(
        session = %session_to_hex(&session),
        round,
        "paillier device reply relayed"
    );
    match relay_reply(&s, protocol, &session, round, &message, signature).await {
        Ok(answer) => {
            if answer.closed {
                tracing::info!(session = %session_to_hex(&session), "paillier session finished");
            }
            Ok(Json(answer))
        }
        Err(err) => {
            // Any failure ends the session: the SP's state of it is single-use.
            s.relay
                .finish(&session, SessionState::Failed, Some(err.body.error.clone()));
            Err(err)
        }
    }
}

fn signature_refused(message: String) -> ApiError {
    error_with(ErrorCode::DeviceSignature, message)
}

/// Checks that `device` signed `statement` with its enrolled key: under the cached key, else
/// (none cached, or it fails: the device may have enrolled again) under the key the SP's
/// record has now. An unknown device is 404, a bad signature 403.
async fn check_signature(
    s: &PaillierState,
    device: &str,
    statement: &Statement,
    signature: &[u8],
) -> Result<(), ApiError> {
    if let Some(key) = s.keys.get(device) {
        if verify_off_runtime(&key, statement, signature).await.is_ok() {
            return Ok(());
        }
    }
    let key = s.sp.device_key(device).await?;
    let checked = verify_off_runtime(&key, statement, signature).await;
    s.keys.put(device, key);
    checked.map_err(|e| signature_refused(format!("device {device:?}: {e}")))
}

/// [`device_signature::verify`] on a blocking thread: one exponentiation by N modulo N
/// (5–10 ms) would otherwise hold up the other requests of this runtime thread.
async fn verify_off_runtime(
    key: &PublicKey,
    statement: &Statement,
    signature: &[u8],
) -> Result<(), DeviceSignatureError> {
    let (key, statement, signature) = (key.clone(), statement.clone(), signature.to_vec());
    tokio::task::spawn_blocking(move || device_signature::verify(&key, &statement, &signature))
        .await
        .unwrap_or(Err(DeviceSignatureError::Forged))
}

/// The largest sealed Π1 verdict a device may post (a 4096-bit device signature and the
/// seal's overhead fit well within).
const MAX_SEALED_VERDICT: usize = 4096;

async fn relay_reply(
    s: &PaillierState,
    protocol: Protocol,
    session: &SessionId,
    round: u8,
    message: &[u8],
    signature: Vec<u8>,
) -> Result<ReplyResponse, ApiError> {
    let closed = |next: Option<DeviceMessage>| ReplyResponse {
        session: session_to_hex(session),
        next,
        closed: true,
    };
    let for_device = |round: u8, message: &[u8]| DeviceMessage {
        session: session_to_hex(session),
        protocol: protocol.name().to_owned(),
        round,
        message: to_base64(message),
    };
    match (protocol, round) {
        // Π1 Round 3 ([ABMR20] Fig. 3): the device's bit with its signature of it, sealed to
        // the terminal's reply key (core's `sealed::TerminalVerdict`): the relay passes it on
        // as the session's verdict without learning the bit.
        (Protocol::Pi1, 3) => {
            if message.len() > MAX_SEALED_VERDICT {
                return Err(bad_request(format!(
                    "Π1 Round 3: {} bytes, at most {MAX_SEALED_VERDICT}",
                    message.len()
                )));
            }
            s.relay
                .finish_signed(session, SessionState::Done, message.to_vec());
            Ok(closed(None))
        }
        // Π2 Round 4 (§6.1): the SP checks X (and the device's signature of it); Round 4 goes
        // back to the device sealed to it, the verdict waits for the terminal sealed to it.
        (Protocol::Pi2, 3) => {
            let (round4, verdict) = s.sp.pi2_round4(session, message, &signature).await?;
            s.relay.finish_signed(session, SessionState::Done, verdict);
            Ok(closed(Some(for_device(4, &round4))))
        }
        // Π3 Round 4 (Fig. 5): the garbled circuit for the device (sealed to it); Round 5 is
        // due.
        (Protocol::Pi3, 3) => {
            let round4 = s.sp.pi3_round4(session, message, &signature).await?;
            s.relay.expect(session, 5);
            Ok(ReplyResponse {
                session: session_to_hex(session),
                next: Some(for_device(4, &round4)),
                closed: false,
            })
        }
        // Π3's output (Fig. 5 Round 5): the SP checks the output labels.
        (Protocol::Pi3, 5) => {
            let verdict = s.sp.pi3_finish(session, message, &signature).await?;
            s.relay.finish_signed(session, SessionState::Done, verdict);
            Ok(closed(None))
        }
        (protocol, round) => Err(error_with(
            ErrorCode::WrongStep,
            format!("{} has no Round {round} from the device", protocol.name()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn service_provider_failures_map_to_statuses_and_codes() {
        let party = |sqlstate: &str| {
            SpError::Party(PartyError {
                party: PartyIndex::ALL[0],
                sqlstate: Some(sqlstate.into()),
                message: "m".into(),
            })
        };
        let cases = [
            ("P0002", StatusCode::NOT_FOUND, ErrorCode::UnknownDevice),
            (
                "55000",
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::NotConfigured,
            ),
            (
                "08P01",
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::RejectedByParty,
            ),
            (
                "22P03",
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::RejectedByParty,
            ),
            (
                "23505",
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::RejectedByParty,
            ),
            (
                "53400",
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::BudgetExhausted,
            ),
            ("XX000", StatusCode::BAD_GATEWAY, ErrorCode::PartyError),
        ];
        for (sqlstate, status, code) in cases {
            let api = ApiError::from(party(sqlstate));
            assert_eq!(api.status, status, "{sqlstate}");
            assert_eq!(api.body.kind(), Some(code), "{sqlstate}");
            assert_eq!(api.body.party, Some(0));
        }
        let api = ApiError::from(SpError::Refused(0));
        assert_eq!(api.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(api.body.kind(), Some(ErrorCode::RejectedByParty));
        assert!(api.body.error.contains("begin again"));
        let api = ApiError::from(SpError::NoServiceProvider);
        assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(api.body.error.contains("paillier_init_service"));
        let api = ApiError::from(SpError::Timeout(1, Duration::from_secs(2)));
        assert_eq!(
            (api.status, api.body.party),
            (StatusCode::GATEWAY_TIMEOUT, Some(1))
        );
        let api = ApiError::from(RelayError::Unknown("00".into()));
        assert_eq!(api.body.kind(), Some(ErrorCode::UnknownSession));
        let api = ApiError::from(RelayError::Full("x".into()));
        assert_eq!(api.status, StatusCode::TOO_MANY_REQUESTS);
    }
}
