//! The coordinator's HTTP API. Handlers only parse requests, call the transaction manager and
//! shape responses; the coordinator sees sealed bundles, subject-independent framing and the
//! final results, never a share.
//!
//! | method, path | body | answer |
//! |---|---|---|
//! | `GET /v1/health` | — | `{"status": "ok", "instance": …}` |
//! | `GET /v1/status` | — | per party: reachable, enrolled records, key fingerprint |
//! | `POST /v1/iris/enroll?on_duplicate=skip\|error` | framed sealed bundles (`privmatch_core::iris::enroll::encode_enrol_batch`) | per record: subject, eye, enrolled |
//! | `POST /v1/iris/delete` | `{"subject": …, "eye": "left"\|"right"\|null}` | `{"deleted": n}` |
//! | `POST /v1/iris/search` | JSON, sealed probes per eye ([`crate::api::SearchBody`]) | matches or uniqueness, per-eye figures |
//! | `POST /v1/iris/enroll-if-unique` | JSON, one record ([`crate::api::EnrollIfUniqueBody`]) | `enrolled` / `duplicate`, or 409 `not_unique` |
//! | `POST /v1/recover` | — | what recovery committed / rolled back |
//! | `POST /v1/face/configure`, `GET /v1/face/pool`, `POST /v1/face/refill` | JSON ([`crate::face_api`]) | the dealer and the key pools |
//! | `POST /v1/face/enroll`, `/v1/face/delete`, `/v1/face/verify`, `/v1/face/identify` | JSON ([`crate::face_api`]) | face templates and matching |
//!
//! The JSON shapes of the search endpoints are documented in [`crate::api`], those of the face
//! endpoints in [`crate::face_api`] (handlers in [`crate::face_server`]). Errors are
//! `{"error": …, "code": …, "party": n, "sqlstate": …}` with status 400 (bad request), 409 (not
//! unique), 422 (a party rejected the content), 502 (a party failed or the parties disagree),
//! 503 (a party is unavailable, the parties hold different template sets — retry with a new
//! session — or a transaction's outcome is left to recovery) or 504 (a party timed out).
//!
//! The coordinator never reuses a search session id it has seen (it keeps the last 65,536),
//! on top of the parties' own checks.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::future::join_all;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::wire::envelope::decode_enroll_batch;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::{
    codes, EnrollIfUniqueBody, EnrollIfUniqueOutcome, EnrollIfUniqueResponse, ErrorBody, EyeReport,
    SearchBody, SearchResponse,
};
use crate::config::Config;
use crate::guard;
use crate::parties::{Parties, PartyError};
use crate::search::{
    combine_matches, combine_uniqueness, run_search, SearchError, SearchOutcome, SearchResult,
    SessionId, DEFAULT_CALL_TIMEOUT,
};
use crate::twophase::{EnrollIfUnique, Fault, PartyWork, TwoPhase, TxnError, TxnWork, WorkResult};

/// Largest accepted request body (a batch of sealed bundles).
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// How many search session ids the coordinator remembers to refuse their reuse.
const RECENT_SESSIONS: usize = 65_536;

/// Options of `privmatch coordinator serve`.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Per-call timeout of the parties' search functions.
    pub search_timeout: Duration,
}

impl Default for ServeOptions {
    /// A 60 s search call timeout.
    fn default() -> Self {
        ServeOptions {
            search_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }
}

/// The most recent search session ids, to refuse a reused one.
pub struct RecentSessions {
    seen: HashSet<SessionId>,
    order: VecDeque<SessionId>,
    capacity: usize,
}

impl RecentSessions {
    /// Remembers up to `capacity` ids.
    pub fn new(capacity: usize) -> Self {
        RecentSessions {
            seen: HashSet::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Records `ids`; false (and nothing recorded) if any of them was seen before.
    pub fn claim(&mut self, ids: &[SessionId]) -> bool {
        if ids.iter().any(|id| self.seen.contains(id)) {
            return false;
        }
        for id in ids {
            if self.order.len() == self.capacity {
                if let Some(oldest) = self.order.pop_front() {
                    self.seen.remove(&oldest);
                }
            }
            self.seen.insert(*id);
            self.order.push_back(*id);
        }
        true
    }
}

pub(crate) struct AppState {
    pub(crate) parties: Arc<Parties>,
    pub(crate) txns: TwoPhase,
    instance: String,
    pub(crate) options: ServeOptions,
    sessions: tokio::sync::Mutex<RecentSessions>,
}

impl AppState {
    pub(crate) async fn claim_sessions(&self, ids: &[SessionId]) -> Result<(), ApiError> {
        if self.sessions.lock().await.claim(ids) {
            Ok(())
        } else {
            Err(bad_request(
                "a search session id was used before: seal the probes for a fresh session id",
            ))
        }
    }
}

/// An error answer: JSON [`ErrorBody`].
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) body: ErrorBody,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

pub(crate) fn error_with(status: StatusCode, code: &str, message: String) -> ApiError {
    ApiError {
        status,
        body: ErrorBody {
            error: message,
            code: Some(code.to_owned()),
            ..ErrorBody::default()
        },
    }
}

pub(crate) fn party_error(
    status: StatusCode,
    code: &str,
    message: String,
    err: &PartyError,
) -> ApiError {
    let mut api = error_with(status, code, message);
    api.body.party = Some(err.party.as_u8());
    api.body.sqlstate = err.sqlstate.clone();
    api
}

/// Status and code of a party's failure during a search: unreachable or not ready → 503,
/// cancelled by a timeout → 504, rejected content → 422, anything else → 502.
pub(crate) fn search_party_status(err: &PartyError) -> (StatusCode, &'static str) {
    let sqlstate = err.sqlstate.as_deref().unwrap_or("");
    let class = sqlstate.get(..2).unwrap_or("");
    match (sqlstate, class) {
        ("", _) => (StatusCode::SERVICE_UNAVAILABLE, codes::PARTY_UNAVAILABLE),
        ("57014", _) => (StatusCode::GATEWAY_TIMEOUT, codes::TIMEOUT),
        (_, "22" | "23") => (StatusCode::UNPROCESSABLE_ENTITY, codes::REJECTED),
        (_, "08" | "53" | "55" | "57") => {
            (StatusCode::SERVICE_UNAVAILABLE, codes::PARTY_UNAVAILABLE)
        }
        _ => (StatusCode::BAD_GATEWAY, codes::PARTY_ERROR),
    }
}

impl From<SearchError> for ApiError {
    fn from(err: SearchError) -> Self {
        let message = err.to_string();
        match &err {
            SearchError::Invalid(_) => bad_request(message),
            SearchError::Party(party) => {
                let (status, code) = search_party_status(party);
                party_error(status, code, message, party)
            }
            SearchError::Timeout(party) => {
                party_error(StatusCode::GATEWAY_TIMEOUT, codes::TIMEOUT, message, party)
            }
            SearchError::SetsDiffer(mismatch) => {
                let mut api =
                    error_with(StatusCode::SERVICE_UNAVAILABLE, codes::SETS_DIFFER, message);
                api.body.entries = Some(mismatch.entries);
                api
            }
            SearchError::Protocol(_) => {
                error_with(StatusCode::BAD_GATEWAY, codes::PROTOCOL, message)
            }
        }
    }
}

impl From<TxnError> for ApiError {
    fn from(err: TxnError) -> Self {
        let message = err.to_string();
        match err {
            TxnError::Aborted(party) => {
                let (status, code) = if party.is_client_error() {
                    (StatusCode::UNPROCESSABLE_ENTITY, codes::REJECTED)
                } else {
                    (StatusCode::BAD_GATEWAY, codes::PARTY_ERROR)
                };
                party_error(status, code, message, &party)
            }
            TxnError::Disagreement(_) => {
                error_with(StatusCode::INTERNAL_SERVER_ERROR, codes::PROTOCOL, message)
            }
            TxnError::Search(search) => {
                let mut api = ApiError::from(search);
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

pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
    error_with(StatusCode::BAD_REQUEST, codes::BAD_REQUEST, message.into())
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid JSON body: {e}")))
}

async fn health(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({ "status": "ok", "instance": state.instance }))
}

/// One party's line in `/v1/status`.
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

async fn status(State(state): State<Arc<AppState>>) -> Json<Vec<PartyStatus>> {
    let mut out = Vec::new();
    for party in state.parties.all() {
        let index = party.index.as_u8();
        let answer = async {
            let client = party.connect().await?;
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM privmatch.iris_templates), \
                            (SELECT fingerprint FROM privmatch.party_info()), \
                            (SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'privmatch:%')",
                    &[],
                )
                .await
                .map_err(|e| PartyError::from_pg(party.index, &e))?;
            party.give_back(client).await;
            Ok::<_, PartyError>((
                row.get::<_, i64>(0),
                row.get::<_, String>(1),
                row.get::<_, i64>(2),
            ))
        }
        .await;
        out.push(match answer {
            Ok((records, fingerprint, prepared)) => PartyStatus {
                party: index,
                reachable: true,
                iris_records: Some(records),
                fingerprint: Some(fingerprint),
                prepared_transactions: Some(prepared),
                error: None,
            },
            Err(e) => PartyStatus {
                party: index,
                reachable: false,
                iris_records: None,
                fingerprint: None,
                prepared_transactions: None,
                error: Some(e.to_string()),
            },
        });
    }
    Json(out)
}

#[derive(Deserialize)]
struct EnrollParams {
    #[serde(default = "default_on_duplicate")]
    on_duplicate: String,
}

fn default_on_duplicate() -> String {
    "skip".into()
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

async fn enroll(
    State(state): State<Arc<AppState>>,
    Query(params): Query<EnrollParams>,
    body: Bytes,
) -> Result<Json<EnrollResponse>, ApiError> {
    if params.on_duplicate != "skip" && params.on_duplicate != "error" {
        return Err(bad_request("on_duplicate must be \"skip\" or \"error\""));
    }
    let [p0, p1, p2] = decode_enroll_batch(&body).map_err(|e| bad_request(e.to_string()))?;
    if p0.is_empty() {
        return Err(bad_request("empty enrolment batch"));
    }
    let work = |bundles| PartyWork::IrisEnroll {
        bundles,
        on_duplicate: params.on_duplicate.clone(),
    };
    let (result, pending) = state.txns.run([work(p0), work(p1), work(p2)]).await?;
    let WorkResult::Enrolled(rows) = result else {
        return Err(bad_request("unexpected result kind"));
    };
    Ok(Json(EnrollResponse {
        results: rows
            .into_iter()
            .map(|(subject, eye, enrolled)| EnrollResult {
                subject,
                eye,
                enrolled,
            })
            .collect(),
        pending_recovery: pending.iter().map(ToString::to_string).collect(),
    }))
}

#[derive(Deserialize)]
struct DeleteRequest {
    subject: String,
    eye: Option<String>,
}

async fn delete(
    State(state): State<Arc<AppState>>,
    Json(request): Json<DeleteRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    privmatch_core::wire::envelope::validate_subject(&request.subject)
        .map_err(|e| bad_request(e.to_string()))?;
    if let Some(eye) = &request.eye {
        privmatch_core::iris::enroll::Eye::parse(eye).map_err(|e| bad_request(e.to_string()))?;
    }
    let work = || PartyWork::IrisDelete {
        subject: request.subject.clone(),
        eye: request.eye.clone(),
    };
    let (result, pending) = state.txns.run([work(), work(), work()]).await?;
    let deleted = match result {
        WorkResult::Deleted(n) => n,
        _ => 0,
    };
    Ok(Json(json!({
        "deleted": deleted,
        "pending_recovery": pending.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })))
}

/// Shapes the answer of a search from the per-eye outcomes.
fn search_response(
    request: &SearchBody,
    per_eye: Vec<(Eye, SearchOutcome)>,
) -> Result<SearchResponse, ApiError> {
    let mut matched = Vec::new();
    let mut unique = Vec::new();
    for (eye, outcome) in &per_eye {
        match &outcome.result {
            SearchResult::Identify(subjects) => matched.push((*eye, subjects.clone())),
            SearchResult::Unique(u) => unique.push((*eye, *u)),
        }
    }
    let unique = if unique.is_empty() {
        None
    } else {
        Some(combine_uniqueness(&unique, request.policy).map_err(bad_request)?)
    };
    Ok(SearchResponse {
        mode: request.mode,
        policy: request.policy,
        matches: (!matched.is_empty()).then(|| combine_matches(&matched, request.policy)),
        unique,
        eyes: per_eye
            .into_iter()
            .map(|(eye, outcome)| EyeReport {
                eye: eye.as_str().to_owned(),
                stats: outcome.stats,
            })
            .collect(),
    })
}

async fn search(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Json<SearchResponse>, ApiError> {
    let request: SearchBody = parse_json(&body)?;
    let plan = request.plan().map_err(bad_request)?;
    let ids: Vec<SessionId> = plan.iter().map(|(_, r)| r.session).collect();
    state.claim_sessions(&ids).await?;
    let timeout = state.options.search_timeout;
    let outcomes = join_all(
        plan.iter()
            .map(|(_, r)| run_search(&state.parties, r, timeout)),
    )
    .await;
    let mut per_eye = Vec::with_capacity(plan.len());
    for ((eye, _), outcome) in plan.iter().zip(outcomes) {
        let outcome = outcome?;
        tracing::info!(
            eye = eye.as_str(),
            mode = request.mode.as_str(),
            entries = outcome.stats.entries,
            rounds = outcome.stats.rounds,
            seconds = outcome.stats.seconds(),
            "iris search"
        );
        per_eye.push((*eye, outcome));
    }
    Ok(Json(search_response(&request, per_eye)?))
}

async fn enroll_if_unique(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Json<EnrollIfUniqueResponse>, ApiError> {
    let request: EnrollIfUniqueBody = parse_json(&body)?;
    let plan = request.plan().map_err(bad_request)?;
    state.claim_sessions(&[plan.search.session]).await?;
    let work = TxnWork::IrisEnrollIfUnique(Box::new(EnrollIfUnique {
        subject: plan.subject.clone(),
        eye: plan.eye,
        envelopes: plan.envelopes,
        search: plan.search,
        timeout: state.options.search_timeout,
    }));
    let (result, pending) = state.txns.run_work(work).await?;
    let outcome = match result {
        WorkResult::Enrolled(_) => EnrollIfUniqueOutcome::Enrolled,
        WorkResult::AlreadyEnrolled => EnrollIfUniqueOutcome::Duplicate,
        WorkResult::NotUnique => {
            return Err(error_with(
                StatusCode::CONFLICT,
                codes::NOT_UNIQUE,
                "not enrolled: matches an enrolled template".into(),
            ))
        }
        WorkResult::Deleted(_) | WorkResult::FaceEnrolled(_) | WorkResult::KeysStored { .. } => {
            return Err(error_with(
                StatusCode::INTERNAL_SERVER_ERROR,
                codes::PROTOCOL,
                "unexpected result kind".into(),
            ))
        }
    };
    Ok(Json(EnrollIfUniqueResponse {
        subject: plan.subject,
        eye: plan.eye.as_str().to_owned(),
        outcome,
        pending_recovery: pending.iter().map(ToString::to_string).collect(),
    }))
}

async fn recover(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!(state.txns.recover().await))
}

fn random_instance_id() -> String {
    let mut bytes = [0u8; 8];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
    hex::encode(bytes)
}

/// Runs the coordinator until interrupted: recovers in-doubt transactions at start-up and
/// every few seconds, and serves the HTTP API on `config.coordinator_addr`.
pub async fn serve(config: Config, options: ServeOptions) -> anyhow::Result<()> {
    let mut lock = Some(guard::acquire(&config.parties[0], Duration::from_secs(30)).await?);
    let parties = Arc::new(Parties::new(&config));
    let instance = random_instance_id();
    let state = Arc::new(AppState {
        txns: TwoPhase::new(parties.clone(), instance.clone(), Fault::from_env()),
        parties,
        instance,
        options,
        sessions: tokio::sync::Mutex::new(RecentSessions::new(RECENT_SESSIONS)),
    });
    let startup = state.txns.recover().await;
    tracing::info!(?startup, "start-up recovery");
    let background = state.clone();
    let p0 = config.parties[0].clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            if lock.as_ref().is_none_or(|client| client.is_closed()) {
                // P0 restarted and took the lock with it: take it again before recovering.
                match guard::try_lock(&p0).await {
                    guard::LockAttempt::Held(client) => lock = Some(client),
                    guard::LockAttempt::HeldByOther => {
                        tracing::error!(
                            "another coordinator took the coordinator lock at P0; stopping"
                        );
                        std::process::exit(1);
                    }
                    guard::LockAttempt::Unreachable(_) => {
                        lock = None;
                        continue;
                    }
                }
            }
            let report = background.txns.recover().await;
            if !report.committed.is_empty() || !report.rolled_back.is_empty() {
                tracing::info!(?report, "recovered in-doubt transactions");
            }
        }
    });
    let app = Router::new()
        .route("/v1/health", get(health))
        .route("/v1/status", get(status))
        .route("/v1/iris/enroll", post(enroll))
        .route("/v1/iris/delete", post(delete))
        .route("/v1/iris/search", post(search))
        .route("/v1/iris/enroll-if-unique", post(enroll_if_unique))
        .route("/v1/recover", post(recover))
        .merge(crate::face_server::routes())
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(&config.coordinator_addr).await?;
    tracing::info!(addr = %config.coordinator_addr, "coordinator listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_session_ids_are_refused() {
        let mut recent = RecentSessions::new(2);
        assert!(recent.claim(&[[1; 16], [2; 16]]));
        assert!(!recent.claim(&[[3; 16], [1; 16]]));
        assert!(recent.claim(&[[3; 16]]));
        // Capacity 2: id 1 is forgotten, 2 and 3 are remembered.
        assert!(!recent.claim(&[[2; 16]]));
        assert!(recent.claim(&[[1; 16]]));
    }

    #[test]
    fn party_failures_map_to_statuses() {
        let err = |sqlstate: Option<&str>| PartyError {
            party: privmatch_core::party::PartyIndex::ALL[1],
            sqlstate: sqlstate.map(str::to_owned),
            message: String::new(),
        };
        assert_eq!(
            search_party_status(&err(None)).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            search_party_status(&err(Some("57014"))).0,
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            search_party_status(&err(Some("22023"))).0,
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            search_party_status(&err(Some("55000"))).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            search_party_status(&err(Some("XX000"))).0,
            StatusCode::BAD_GATEWAY
        );
        let api = ApiError::from(SearchError::Timeout(err(None)));
        assert_eq!(api.status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(api.body.party, Some(1));
    }
}
