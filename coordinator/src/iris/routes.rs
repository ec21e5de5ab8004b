//! The coordinator's iris endpoints (shapes in [`privmatch_api::iris`]): enrolment and deletion
//! (two-phase commit at the three parties, [`crate::iris::work`]), search (the round driver of
//! [`crate::iris::driver`], one session per eye) and enroll-if-unique.

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::routing::post;
use axum::Json;
use futures::future::join_all;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::wire::envelope::decode_enroll_batch;
use privmatch_core::wire::session::SessionId;
use serde::Deserialize;

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use axum::Extension;

use crate::iris::batch::{IrisBatchKey, IrisBatches};
use crate::iris::driver::{run_search, SearchError, SearchOutcome};
use crate::iris::work::{Delete, Enroll, EnrollIfUnique, EnrollIfUniqueBatch, IfUnique};
use crate::server::auth::Scope;
use crate::server::error::{
    bad_request, error_with, parse_json, party_error, party_failure_error, protocol_error, ApiError,
};
use crate::server::scoped::ScopedRoutes;
use crate::server::state::SharedState;
use crate::session::batcher::{BatchPolicy, BatchRunner, Batcher};
use privmatch_api::iris::{
    DeleteBody, DeleteResponse, EnrollIfUniqueBody, EnrollIfUniqueOutcome, EnrollIfUniqueResponse,
    EnrollResponse, EyeReport, SearchBody, SearchResponse,
};
use privmatch_api::wire::{check_on_duplicate, default_on_duplicate, to_base64};
use privmatch_api::ErrorCode;
use privmatch_core::iris::service::MAX_BATCH_PROBES;

/// The SQL expression counting a party's enrolled iris records (for `GET /v1/status`).
pub const RECORDS_SQL: &str = "SELECT privmatch.iris_records()";

/// The iris batches of this coordinator, started by the first batched search (the batching
/// task needs the parties' pools and the serve options, which the state holds).
type Batches = Arc<OnceLock<Batcher<IrisBatches>>>;

/// The enroll-if-unique batches of this coordinator (docs/protocols/iris.md §13.4), started
/// by the first request when batching is on.
type EnrolBatches = Arc<OnceLock<Batcher<IrisEnrolBatches>>>;

/// Enrol-if-unique requests of one eye, batched: each batch is one distributed transaction
/// ([`EnrollIfUniqueBatch`]) with one lock, one enrolment batch and one commit.
pub struct IrisEnrolBatches {
    state: SharedState,
}

/// One request's answer: what was done, and the parties recovery must still complete.
type EnrolAnswer = (IfUnique, Vec<String>);

impl BatchRunner for IrisEnrolBatches {
    type Key = Eye;
    type Item = EnrollIfUnique;
    type Output = EnrolAnswer;
    type Error = ApiError;

    /// Runs the batch as one transaction; a batch the parties refuse as too large for their
    /// template set (nothing of it was written or consumed: the refusal aborts the
    /// transaction) runs again in halves, in order.
    async fn run(
        &self,
        eye: Eye,
        items: Vec<EnrollIfUnique>,
    ) -> Vec<Result<EnrolAnswer, ApiError>> {
        let mut out = Vec::with_capacity(items.len());
        let mut chunks = VecDeque::from([items]);
        while let Some(chunk) = chunks.pop_front() {
            let count = chunk.len();
            let work = EnrollIfUniqueBatch {
                members: chunk,
                eye,
                timeout: self.state.options.search_timeout,
            };
            match self.state.txns.run(&work).await {
                Ok(outcome) => {
                    let pending = outcome.pending_recovery();
                    out.extend(
                        outcome
                            .result
                            .0
                            .into_iter()
                            .map(|r| r.map(|o| (o, pending.clone())).map_err(ApiError::from)),
                    );
                }
                Err(e) => {
                    let api = ApiError::from(e);
                    if count > 1 && api.body.error.contains("send smaller batches") {
                        let mut front = work.members;
                        let back = front.split_off(count / 2);
                        chunks.push_front(back);
                        chunks.push_front(front);
                        continue;
                    }
                    out.extend((0..count).map(|_| {
                        Err(ApiError {
                            status: api.status,
                            body: api.body.clone(),
                        })
                    }));
                }
            }
        }
        out
    }

    /// The policy's batch size (a batch too large for the parties' set is split, above).
    fn max_items(&self, _eye: &Eye, policy_max: usize) -> usize {
        policy_max.clamp(1, MAX_BATCH_PROBES)
    }

    fn busy(&self) -> ApiError {
        ApiError::from(SearchError::Busy)
    }

    fn lost(&self) -> ApiError {
        protocol_error("the request's batch ended without its answer".into())
    }
}

/// The iris routes and the API scope each needs, merged into the coordinator's API.
pub fn routes() -> ScopedRoutes<SharedState> {
    let batches: Batches = Arc::new(OnceLock::new());
    let enrol_batches: EnrolBatches = Arc::new(OnceLock::new());
    ScopedRoutes::new()
        .route("/v1/iris/enroll", Scope::Enroll, post(enroll))
        .route("/v1/iris/delete", Scope::Delete, post(delete))
        .route(
            "/v1/iris/search",
            Scope::Search,
            post(search).get(crate::iris::policy::get_policy),
        )
        .route(
            "/v1/iris/configure",
            Scope::Admin,
            post(crate::iris::policy::configure),
        )
        .route(
            "/v1/iris/audit",
            Scope::Admin,
            post(crate::iris::audit::audit),
        )
        .route(
            "/v1/iris/enroll-if-unique",
            Scope::Enroll,
            post(enroll_if_unique),
        )
        .map_router(|router| {
            router
                .layer(Extension(batches))
                .layer(Extension(enrol_batches))
        })
}

impl From<SearchError> for ApiError {
    fn from(err: SearchError) -> Self {
        let message = err.to_string();
        match &err {
            SearchError::Invalid(_) => bad_request(message),
            SearchError::Party(party) => party_failure_error(message, party),
            SearchError::Timeout(party) => party_error(ErrorCode::Timeout, message, party),
            SearchError::SetsDiffer(mismatch) => {
                let mut api = error_with(ErrorCode::TemplateSetsDiffer, message);
                api.body.entries = Some(mismatch.entries);
                api.body.party = mismatch.diverging.map(|p| p.as_u8());
                api
            }
            SearchError::Protocol(_) => protocol_error(message),
            SearchError::Busy => error_with(ErrorCode::TooBusy, message),
            SearchError::BatchVoid(_) => error_with(ErrorCode::EnrolmentBatchVoid, message),
        }
    }
}

#[derive(Deserialize)]
struct EnrollParams {
    #[serde(default = "default_on_duplicate")]
    on_duplicate: String,
}

async fn enroll(
    State(state): State<SharedState>,
    Query(params): Query<EnrollParams>,
    body: Bytes,
) -> Result<Json<EnrollResponse>, ApiError> {
    check_on_duplicate(&params.on_duplicate).map_err(bad_request)?;
    let bundles = decode_enroll_batch(&body).map_err(|e| bad_request(e.to_string()))?;
    if bundles[0].is_empty() {
        return Err(bad_request("empty enrolment batch"));
    }
    let work = Enroll {
        bundles,
        on_duplicate: params.on_duplicate,
    };
    let outcome = state.txns.run(&work).await?;
    Ok(Json(EnrollResponse {
        pending_recovery: outcome.pending_recovery(),
        results: outcome.result,
    }))
}

async fn delete(
    State(state): State<SharedState>,
    request: Result<Json<DeleteBody>, JsonRejection>,
) -> Result<Json<DeleteResponse>, ApiError> {
    // A malformed body is a 400 in the API's JSON error shape, like every other bad request.
    let Json(request) = request.map_err(|e| {
        bad_request(format!(
            "invalid delete request (expected {{\"subject\": …, \"eye\": \"left\"|\"right\"|null}}): {}",
            e.body_text()
        ))
    })?;
    privmatch_core::wire::envelope::validate_subject(&request.subject)
        .map_err(|e| bad_request(e.to_string()))?;
    if let Some(eye) = &request.eye {
        Eye::parse(eye).map_err(|e| bad_request(e.to_string()))?;
    }
    let work = Delete {
        subject: request.subject,
        eye: request.eye,
    };
    let outcome = state.txns.run(&work).await?;
    Ok(Json(DeleteResponse {
        pending_recovery: outcome.pending_recovery(),
        deleted: outcome.result,
    }))
}

/// Shapes the answer of a search from the per-eye outcomes: figures and sealed outputs only
/// (the coordinator cannot read a result; the client opens them and applies the policy).
fn search_response(request: &SearchBody, per_eye: Vec<(Eye, SearchOutcome)>) -> SearchResponse {
    SearchResponse {
        // The mode, like every parameter, is sealed in the probes: the coordinator does not
        // know it (the client fills it in).
        mode: None,
        policy: request.policy,
        matches: None,
        unique: None,
        eyes: per_eye
            .into_iter()
            .map(|(eye, outcome)| EyeReport {
                eye: eye.as_str().to_owned(),
                sealed_outputs: Some(outcome.sealed_outputs.map(|o| to_base64(&o))),
                stats: outcome.stats,
            })
            .collect(),
    }
}

async fn search(
    State(state): State<SharedState>,
    Extension(batches): Extension<Batches>,
    body: Bytes,
) -> Result<Json<SearchResponse>, ApiError> {
    let request: SearchBody = parse_json(&body)?;
    let plan = request.plan().map_err(bad_request)?;
    let ids: Vec<SessionId> = plan.iter().map(|(_, r)| r.session).collect();
    state.claim_sessions(&ids).await?;
    let timeout = state.options.search_timeout;
    // Declared searches run in batches with others of the same eye, mode and rotation range;
    // undeclared ones (clients before 0.15.0) alone.
    let outcomes = join_all(plan.iter().map(|(eye, r)| async {
        match request.batch {
            Some(declared) => {
                let key = IrisBatchKey {
                    eye: *eye,
                    mode: declared.mode,
                    max_rotation: declared.max_rotation,
                };
                let batcher = batches.get_or_init(|| {
                    IrisBatches::start(state.parties.clone(), timeout, state.options.iris_batches)
                });
                batcher.submit(key, r.clone()).await
            }
            None => run_search(&state.parties, r, timeout).await,
        }
    }))
    .await;
    let mut per_eye = Vec::with_capacity(plan.len());
    for ((eye, _), outcome) in plan.iter().zip(outcomes) {
        let outcome = outcome?;
        tracing::info!(
            eye = eye.as_str(),
            entries = outcome.stats.entries,
            rounds = outcome.stats.rounds,
            batch = outcome.stats.batch,
            seconds = outcome.stats.seconds(),
            "iris search"
        );
        per_eye.push((*eye, outcome));
    }
    Ok(Json(search_response(&request, per_eye)))
}

async fn enroll_if_unique(
    State(state): State<SharedState>,
    Extension(batches): Extension<EnrolBatches>,
    body: Bytes,
) -> Result<Json<EnrollIfUniqueResponse>, ApiError> {
    let request: EnrollIfUniqueBody = parse_json(&body)?;
    let plan = request.plan().map_err(bad_request)?;
    state.claim_sessions(&[plan.search.session]).await?;
    let work = EnrollIfUnique {
        subject: plan.subject.clone(),
        eye: plan.eye,
        envelopes: plan.envelopes,
        search: plan.search,
        timeout: state.options.search_timeout,
    };
    // Every enroll-if-unique probe is sealed for uniqueness with ±15 rotations, so requests
    // of one eye always batch together (docs/protocols/iris.md §13.4); `--batch-max 1` runs
    // each alone, in a transaction of its own.
    let (result, pending_recovery) = if state.options.iris_batches.max_items > 1 {
        // One batch at a time: batches of one eye take the same table lock, so a second
        // would only wait for it; requests that arrive meanwhile join the next batch, where
        // they are compared with each other inside the MPC.
        let policy = BatchPolicy {
            in_flight: 1,
            ..state.options.iris_batches
        };
        let batcher = batches.get_or_init(|| {
            Batcher::start(
                IrisEnrolBatches {
                    state: state.clone(),
                },
                policy,
            )
        });
        batcher.submit(plan.eye, work).await?
    } else {
        let outcome = state.txns.run(&work).await?;
        let pending = outcome.pending_recovery();
        (outcome.result, pending)
    };
    let (outcome, sealed_outputs) = match result {
        IfUnique::Enrolled { sealed_outputs, .. } => {
            (EnrollIfUniqueOutcome::Enrolled, Some(sealed_outputs))
        }
        IfUnique::AlreadyEnrolled => (EnrollIfUniqueOutcome::Duplicate, None),
        IfUnique::NotUnique { sealed_outputs } => {
            (EnrollIfUniqueOutcome::NotUnique, Some(sealed_outputs))
        }
    };
    Ok(Json(EnrollIfUniqueResponse {
        subject: plan.subject,
        eye: plan.eye.as_str().to_owned(),
        outcome,
        sealed_outputs: sealed_outputs.map(|s| s.map(|o| to_base64(&o))),
        pending_recovery,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parties::PartyError;
    use axum::http::StatusCode;

    #[test]
    fn search_failures_map_to_statuses() {
        let err = PartyError {
            party: privmatch_core::party::PartyIndex::ALL[1],
            sqlstate: None,
            message: String::new(),
        };
        let api = ApiError::from(SearchError::Timeout(err.clone()));
        assert_eq!(api.status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(api.body.party, Some(1));
        let api = ApiError::from(SearchError::Party(err));
        assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.body.kind(), Some(ErrorCode::PartyUnavailable));
    }
}
