//! The one place that composes the coordinator's HTTP API from the modalities' routes (each
//! modality's `routes.rs`) and the modality-neutral ones ([`crate::server::common`]).

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::{middleware, Router};

use crate::server::auth::{self, Guard};
use crate::server::common;
use crate::server::state::SharedState;

/// The whole API, for the coordinator's state, behind `guard` (credentials, scopes, limits,
/// the audit line: [`auth`]).
pub fn app(state: SharedState, guard: Arc<Guard>) -> Router {
    let limit = guard.max_body_bytes;
    Router::new()
        .merge(common::routes(crate::iris::routes::RECORDS_SQL))
        .merge(crate::iris::routes::routes())
        .merge(crate::face::routes::routes())
        .merge(crate::paillier::routes::routes(state.clone()))
        .merge(crate::cli::client_auth::routes())
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(guard, auth::guard))
        .with_state(state)
}
