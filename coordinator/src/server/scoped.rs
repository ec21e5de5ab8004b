//! Routes that declare what they need: each modality's `routes.rs` builds its part of the API
//! with [`ScopedRoutes`], naming for every path the API scope a credential must carry (or that
//! it is open), so adding a route touches that modality's file only. The guard
//! ([`crate::server::auth::guard`]) looks the request's path up in the merged
//! [`RouteScopes`]; a path nobody declared is refused (fail closed).

use axum::routing::MethodRouter;
use axum::Router;

use crate::server::auth::{Needs, RouteScopes, Scope};

/// A part of the API: its router and what each of its paths needs.
pub struct ScopedRoutes<S> {
    router: Router<S>,
    scopes: RouteScopes,
}

impl<S: Clone + Send + Sync + 'static> Default for ScopedRoutes<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Clone + Send + Sync + 'static> ScopedRoutes<S> {
    /// No route.
    pub fn new() -> Self {
        ScopedRoutes {
            router: Router::new(),
            scopes: RouteScopes::default(),
        }
    }

    /// `path`, served by `handler` (every method it routes), for credentials with `scope`.
    pub fn route(self, path: &'static str, scope: Scope, handler: MethodRouter<S>) -> Self {
        self.declare(path, Needs::Scope(scope), handler)
    }

    /// `path`, served by `handler`, open to anyone (it must reveal nothing).
    pub fn open(self, path: &'static str, handler: MethodRouter<S>) -> Self {
        self.declare(path, Needs::Nothing, handler)
    }

    fn declare(mut self, path: &'static str, needs: Needs, handler: MethodRouter<S>) -> Self {
        self.scopes.declare(path, needs);
        self.router = self.router.route(path, handler);
        self
    }

    /// The same routes with `f` applied to the router (a layer, the state), the scopes kept.
    pub fn map_router<T>(self, f: impl FnOnce(Router<S>) -> Router<T>) -> ScopedRoutes<T> {
        ScopedRoutes {
            router: f(self.router),
            scopes: self.scopes,
        }
    }

    /// These routes and `other`'s.
    pub fn merge(mut self, other: ScopedRoutes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.scopes.extend(other.scopes);
        self
    }

    /// The router and the scopes.
    pub fn into_parts(self) -> (Router<S>, RouteScopes) {
        (self.router, self.scopes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    #[test]
    fn undeclared_paths_are_refused_and_declared_ones_need_their_scope() {
        let routes: ScopedRoutes<()> = ScopedRoutes::new()
            .open("/v1/health", get(|| async { "ok" }))
            .route("/v1/x/search", Scope::Search, get(|| async { "x" }));
        let (_, scopes) = routes
            .merge(ScopedRoutes::new().route("/v1/y/delete", Scope::Delete, get(|| async { "y" })))
            .into_parts();
        assert_eq!(scopes.needs("/v1/health"), Needs::Nothing);
        assert_eq!(scopes.needs("/v1/x/search"), Needs::Scope(Scope::Search));
        assert_eq!(scopes.needs("/v1/y/delete"), Needs::Scope(Scope::Delete));
        for path in ["/v1/x/delete", "/v1/x/search/", "/", "/v1/X/search"] {
            assert_eq!(scopes.needs(path), Needs::Refused, "{path}");
        }
        assert_eq!(
            scopes.paths(),
            vec!["/v1/health", "/v1/x/search", "/v1/y/delete"]
        );
    }
}
