//! The one place that composes the coordinator's HTTP API from the modalities' routes (each
//! modality's `routes.rs`) and the modality-neutral ones ([`crate::server::common`]).

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::{middleware, Router};

use crate::server::auth::{self, ApiKeys, Guard};
use crate::server::common;
use crate::server::scoped::ScopedRoutes;
use crate::server::state::SharedState;

/// The whole API, for the coordinator's state, behind a guard for `keys` with the given
/// limits (credentials, the scopes the routes declare, limits, the audit line: [`auth`]).
pub fn app(
    state: SharedState,
    keys: ApiKeys,
    max_body_bytes: usize,
    max_in_flight: usize,
) -> Router {
    let (router, scopes) = every_part(crate::paillier::routes::routes(state.clone())).into_parts();
    let guard: Arc<Guard> = Guard::new(keys, scopes, max_body_bytes, max_in_flight);
    router
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(guard, auth::guard))
        .with_state(state)
}

/// Every part of the API, with `paillier` (the only part that carries a state of its own, so
/// the tests can give it without one).
fn every_part(paillier: ScopedRoutes<SharedState>) -> ScopedRoutes<SharedState> {
    ScopedRoutes::new()
        .merge(common::routes(crate::iris::routes::RECORDS_SQL))
        .merge(crate::iris::routes::routes())
        .merge(crate::face::routes::routes())
        .merge(paillier)
        .merge(crate::cli::client_auth::routes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::auth::{Needs, Scope};

    #[test]
    fn every_route_of_the_api_needs_the_scope_its_modality_declares() {
        let paillier = crate::paillier::routes::scoped().map_router(|_| Router::new());
        let (_, scopes) = every_part(paillier).into_parts();
        let admin = Needs::Scope(Scope::Admin);
        let enroll = Needs::Scope(Scope::Enroll);
        let search = Needs::Scope(Scope::Search);
        let delete = Needs::Scope(Scope::Delete);
        let device = Needs::Scope(Scope::Device);
        let table = [
            ("/v1/health", Needs::Nothing),
            ("/v1/status", admin),
            ("/v1/recover", admin),
            ("/v1/party/pin", admin),
            ("/v1/clients/configure", admin),
            ("/v1/iris/enroll", enroll),
            ("/v1/iris/enroll-if-unique", enroll),
            ("/v1/iris/search", search),
            ("/v1/iris/delete", delete),
            ("/v1/iris/configure", admin),
            ("/v1/iris/audit", admin),
            ("/v1/face/configure", admin),
            ("/v1/face/dealer", admin),
            ("/v1/face/stock", admin),
            ("/v1/face/enroll", enroll),
            ("/v1/face/delete", delete),
            ("/v1/face/verify", search),
            ("/v1/face/identify", search),
            ("/v1/paillier/enroll-params", enroll),
            ("/v1/paillier/enroll-begin", enroll),
            ("/v1/paillier/enroll-finish", enroll),
            ("/v1/paillier/device", search),
            ("/v1/paillier/devices", admin),
            ("/v1/paillier/delete", delete),
            ("/v1/paillier/verify", search),
            ("/v1/paillier/outcome", search),
            ("/v1/paillier/mailbox", device),
            ("/v1/paillier/reply", device),
        ];
        for (path, expected) in table {
            assert_eq!(scopes.needs(path), expected, "{path}");
        }
        // Nothing else is served: every declared path is in the table above.
        let listed: Vec<&str> = table.iter().map(|(path, _)| *path).collect();
        for path in scopes.paths() {
            assert!(listed.contains(&path), "{path} is not in the table");
        }
        for path in [
            "/v1/iris/drop",
            "/v2/iris/search",
            "/v1/iris/search/x",
            "/",
            "/v1/IRIS/search",
        ] {
            assert_eq!(scopes.needs(path), Needs::Refused, "{path}");
        }
    }
}
