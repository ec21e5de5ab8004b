//! The coordinator's HTTP service. Handlers only parse requests, call the round driver or the
//! transaction manager and shape answers; the coordinator sees sealed envelopes and probes,
//! subject-independent framing and the final results, never a share.
//!
//! | method, path | body | answer |
//! |---|---|---|
//! | `GET /v1/health` | — | `{"status": "ok", "instance": …}` |
//! | `GET /v1/status` | — | per party: reachable, enrolled records, key fingerprint ([`privmatch_api::wire::PartyStatus`]) |
//! | `POST /v1/recover` | — | what recovery committed / rolled back |
//! | `POST /v1/iris/enroll?on_duplicate=skip\|error` | framed sealed bundles | per record: subject, eye, enrolled |
//! | `POST /v1/iris/delete` | `{"subject": …, "eye": "left"\|"right"\|null}` | `{"deleted": n}` |
//! | `POST /v1/iris/search` | JSON, sealed probes per eye | matches or uniqueness, per-eye figures |
//! | `POST /v1/iris/enroll-if-unique` | JSON, one record | `enrolled` / `duplicate` / `not_unique`, with the parties' sealed outputs of the uniqueness search |
//! | `POST /v1/face/configure`, `GET /v1/face/dealer`, `GET /v1/face/stock` | JSON | the dealer and the dealing made ahead of time for 1:N |
//! | `POST /v1/face/enroll`, `/v1/face/delete`, `/v1/face/verify`, `/v1/face/identify` | JSON | face templates and matching |
//! | `/v1/paillier/enroll-params`, `enroll-begin`, `enroll-finish`, `device`, `devices`, `delete` | JSON | device-held face templates at the service provider |
//! | `POST /v1/paillier/verify`, `outcome`, `mailbox`, `reply` | JSON | matching sessions relayed between terminal, device and service provider (long polls) |
//!
//! The shapes of each modality's endpoints are documented in the API crate (`privmatch_api::iris`,
//! `privmatch_api::face`, `privmatch_api::paillier`); error codes in `privmatch_api::error` (one
//! table: code, HTTP status, the front door's SQLSTATE) and [`error`]. The coordinator never reuses
//! a session id it has seen (it keeps the last 65,536), on top of the parties' own checks.
//!
//! Every call passes [`auth::guard`] first: an API credential with the endpoint's scope (401,
//! 403), the body and concurrency limits (413, 429), one audit line.
//!
//! * [`auth`]: credentials, scopes, limits, audit. [`state`]: what handlers share. [`error`]: error answers. [`common`]: the
//!   modality-neutral endpoints. [`routes`]: the composition of the API.

pub mod auth;
pub mod common;
pub mod error;
pub mod routes;
pub mod scoped;
pub mod state;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::config::CoordinatorConfig;
use crate::guard;
use crate::parties::Parties;
use crate::server::auth::ApiKeys;
use crate::server::state::{AppState, ServeOptions};
use crate::txn::fault::Fault;
use crate::txn::twophase::TwoPhase;

fn random_instance_id() -> String {
    let mut bytes = [0u8; 8];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
    hex::encode(bytes)
}

/// Runs the coordinator until interrupted: recovers in-doubt transactions at start-up and
/// every few seconds, and serves the HTTP API on `config.listen`.
pub async fn serve(config: CoordinatorConfig, options: ServeOptions) -> anyhow::Result<()> {
    let mut lock = Some(guard::acquire(&config.parties[0], Duration::from_secs(30)).await?);
    let parties = Arc::new(Parties::new(&config));
    let instance = random_instance_id();
    let txns = TwoPhase::new(parties.clone(), instance.clone(), Fault::from_env());
    let state = Arc::new(AppState::new(parties, txns, instance, options));
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
    let keys = match &config.api_keys {
        Some(path) => ApiKeys::load(path)?,
        None => anyhow::bail!(
            "the coordinator serves only callers with API credentials: set api_keys in its configuration (privmatch cluster up writes api-keys.toml)"
        ),
    };
    let app = routes::app(state, keys, options.max_body_bytes, options.max_in_flight);
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => serve_tls(listener, app, cert, key).await,
        _ => {
            let addr = listener.local_addr()?;
            if !addr.ip().is_loopback() {
                anyhow::bail!(
                    "the coordinator serves plain HTTP on loopback only: set tls_cert and tls_key to listen on {addr}"
                );
            }
            tracing::warn!(%addr, "coordinator listening without TLS (loopback only)");
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await?;
            Ok(())
        }
    }
}

/// Serves `app` over TLS (rustls) on `listener` until interrupted.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<()> {
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(
        crate::tls::server_config(cert, key)?,
    ));
    let listener = listener.into_std()?;
    let addr = listener.local_addr()?;
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stopper.graceful_shutdown(Some(Duration::from_secs(30)));
    });
    tracing::info!(%addr, "coordinator listening (TLS)");
    // TCP_NODELAY: an answer written as two TLS records would otherwise wait for the client's
    // delayed acknowledgement of the first (40 ms on Linux): measured through the SQL front
    // door, a fifth of face verifications took 40 ms more than the rest.
    let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(tls)
        .acceptor(axum_server::accept::NoDelayAcceptor::new());
    axum_server::from_tcp(listener)
        .acceptor(acceptor)
        .handle(handle)
        .serve(app.into_make_service())
        .await?;
    Ok(())
}
