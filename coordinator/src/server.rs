//! The coordinator's HTTP API. Handlers only parse requests, call the transaction manager and
//! shape responses; the coordinator sees sealed bundles, subject-independent framing and the
//! final results, never a share.
//!
//! | method, path | body | answer |
//! |---|---|---|
//! | `GET /v1/health` | — | `{"status": "ok", "instance": …}` |
//! | `GET /v1/status` | — | per party: reachable, enrolled records, key fingerprint |
//! | `POST /v1/iris/enroll?on_duplicate=skip\|error` | framed sealed bundles (`privmatch_core::bundle::encode_enrol_batch`) | per record: subject, eye, enrolled |
//! | `POST /v1/iris/delete` | `{"subject": …, "eye": "left"\|"right"\|null}` | `{"deleted": n}` |
//! | `POST /v1/recover` | — | what recovery committed / rolled back |

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use privmatch_core::bundle::decode_enrol_batch;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::config::Config;
use crate::guard;
use crate::parties::{Parties, PartyError};
use crate::twophase::{Fault, PartyWork, TwoPhase, TxnError, WorkResult};

/// Largest accepted request body (a batch of sealed bundles).
pub const MAX_BODY_BYTES: usize = 256 << 20;

struct AppState {
    parties: Arc<Parties>,
    txns: TwoPhase,
    instance: String,
}

/// An error answer: JSON `{"error": …, "party": …, "sqlstate": …}`.
pub struct ApiError {
    status: StatusCode,
    body: serde_json::Value,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

fn party_error_body(message: String, err: &PartyError) -> serde_json::Value {
    json!({ "error": message, "party": err.party.as_u8(), "sqlstate": err.sqlstate })
}

impl From<TxnError> for ApiError {
    fn from(err: TxnError) -> Self {
        let message = err.to_string();
        match &err {
            TxnError::Aborted(party) => ApiError {
                status: if party.is_client_error() {
                    StatusCode::UNPROCESSABLE_ENTITY
                } else {
                    StatusCode::BAD_GATEWAY
                },
                body: party_error_body(message, party),
            },
            TxnError::Disagreement(_) => ApiError {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                body: json!({ "error": message }),
            },
            TxnError::InDoubt(party) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                body: party_error_body(message, party),
            },
        }
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        body: json!({ "error": message.into() }),
    }
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
struct EnrolParams {
    #[serde(default = "default_on_duplicate")]
    on_duplicate: String,
}

fn default_on_duplicate() -> String {
    "skip".into()
}

/// One record's result in an enrolment answer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EnrolResult {
    /// Subject id.
    pub subject: String,
    /// Eye.
    pub eye: String,
    /// False when it was already enrolled and skipped.
    pub enrolled: bool,
}

/// The answer to an enrolment batch.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct EnrolResponse {
    /// Per record, in request order.
    pub results: Vec<EnrolResult>,
    /// Parties whose commit recovery still has to complete (the batch is decided).
    pub pending_recovery: Vec<String>,
}

async fn enroll(
    State(state): State<Arc<AppState>>,
    Query(params): Query<EnrolParams>,
    body: Bytes,
) -> Result<Json<EnrolResponse>, ApiError> {
    if params.on_duplicate != "skip" && params.on_duplicate != "error" {
        return Err(bad_request("on_duplicate must be \"skip\" or \"error\""));
    }
    let [p0, p1, p2] = decode_enrol_batch(&body).map_err(|e| bad_request(e.to_string()))?;
    if p0.is_empty() {
        return Err(bad_request("empty enrolment batch"));
    }
    let work = |bundles| PartyWork::IrisEnrol {
        bundles,
        on_duplicate: params.on_duplicate.clone(),
    };
    let (result, pending) = state.txns.run([work(p0), work(p1), work(p2)]).await?;
    let WorkResult::Enrolled(rows) = result else {
        return Err(bad_request("unexpected result kind"));
    };
    Ok(Json(EnrolResponse {
        results: rows
            .into_iter()
            .map(|(subject, eye, enrolled)| EnrolResult {
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
    privmatch_core::bundle::validate_subject(&request.subject)
        .map_err(|e| bad_request(e.to_string()))?;
    if let Some(eye) = &request.eye {
        privmatch_core::bundle::Eye::parse(eye).map_err(|e| bad_request(e.to_string()))?;
    }
    let work = || PartyWork::IrisDelete {
        subject: request.subject.clone(),
        eye: request.eye.clone(),
    };
    let (result, pending) = state.txns.run([work(), work(), work()]).await?;
    let deleted = match result {
        WorkResult::Deleted(n) => n,
        WorkResult::Enrolled(_) => 0,
    };
    Ok(Json(json!({
        "deleted": deleted,
        "pending_recovery": pending.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })))
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
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let mut lock = Some(guard::acquire(&config.parties[0], Duration::from_secs(30)).await?);
    let parties = Arc::new(Parties::new(&config));
    let instance = random_instance_id();
    let state = Arc::new(AppState {
        txns: TwoPhase::new(parties.clone(), instance.clone(), Fault::from_env()),
        parties,
        instance,
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
        .route("/v1/recover", post(recover))
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
