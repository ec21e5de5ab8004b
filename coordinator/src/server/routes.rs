//! The one place that composes the coordinator's HTTP API from the modalities' routes (each
//! modality's `routes.rs`) and the modality-neutral ones ([`crate::server::common`]).

use axum::extract::DefaultBodyLimit;
use axum::Router;

use crate::server::common;
use crate::server::state::SharedState;

/// Largest accepted request body (a batch of sealed bundles).
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// The whole API, for the coordinator's state.
pub fn app(state: SharedState) -> Router {
    Router::new()
        .merge(common::routes(crate::iris::routes::RECORDS_SQL))
        .merge(crate::iris::routes::routes())
        .merge(crate::face::routes::routes())
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
