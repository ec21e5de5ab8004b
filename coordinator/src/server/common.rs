//! The endpoints every deployment has, whatever its modalities: `GET /v1/health`,
//! `GET /v1/status` (per party: reachable, enrolled records, key fingerprint, prepared
//! transactions), `POST /v1/recover` and `POST /v1/party/pin` (relays a peer pin signed by a
//! party's operator: the coordinator cannot forge or replay one, the party checks).

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use axum::Json;
use serde_json::json;

use crate::parties::{Party, PartyError};
use crate::server::auth::Scope;
use crate::server::error::{bad_request, parse_json, party_failure_error, ApiError};
use crate::server::scoped::ScopedRoutes;
use crate::server::state::SharedState;
use privmatch_api::wire::{from_base64, PartyStatus, PinBody, PinResponse};

/// The modality-neutral routes. `records_sql` is the SQL expression counting a party's
/// enrolled records for `/v1/status` (the composition point supplies it).
pub fn routes(records_sql: &'static str) -> ScopedRoutes<SharedState> {
    ScopedRoutes::new()
        .open("/v1/health", get(health))
        .route(
            "/v1/status",
            Scope::Admin,
            get(move |state: State<SharedState>| status(state, records_sql)),
        )
        .route("/v1/recover", Scope::Admin, post(recover))
        .route("/v1/party/pin", Scope::Admin, post(pin))
}

/// Relays a signed peer pin to the party it is addressed to.
async fn pin(State(state): State<SharedState>, body: Bytes) -> Result<Json<PinResponse>, ApiError> {
    let request: PinBody = parse_json(&body)?;
    let command = from_base64(&request.command, "command").map_err(bad_request)?;
    let party = state
        .parties
        .all()
        .get(usize::from(request.party))
        .ok_or_else(|| bad_request(format!("party must be 0, 1 or 2, not {}", request.party)))?;
    let row = party
        .query_one("SELECT privmatch.pin_peer_signed($1)", &[&command])
        .await
        .map_err(|e| party_failure_error(format!("pinning a peer key: {e}"), &e))?;
    let fingerprint: String = row.get(0);
    tracing::info!(party = request.party, %fingerprint, "peer pin relayed and accepted");
    Ok(Json(PinResponse {
        party: request.party,
        fingerprint,
    }))
}

async fn health(State(state): State<SharedState>) -> Json<serde_json::Value> {
    Json(json!({ "status": "ok", "instance": state.instance }))
}

/// Records, fingerprint and prepared transactions at one party.
async fn party_status(party: &Party, records_sql: &str) -> Result<(i64, String, i64), PartyError> {
    let sql = format!(
        "SELECT ({records_sql}), \
                (SELECT fingerprint FROM privmatch.party_info()), \
                (SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'privmatch:%')"
    );
    let row = party.query_one(&sql, &[]).await?;
    Ok((row.get(0), row.get(1), row.get(2)))
}

async fn status(State(state): State<SharedState>, records_sql: &str) -> Json<Vec<PartyStatus>> {
    let mut out = Vec::new();
    for party in state.parties.all() {
        let index = party.index.as_u8();
        out.push(match party_status(party, records_sql).await {
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

async fn recover(State(state): State<SharedState>) -> Json<serde_json::Value> {
    Json(json!(state.txns.recover().await))
}
