//! The endpoints every deployment has, whatever its modalities: `GET /v1/health`,
//! `GET /v1/status` (per party: reachable, enrolled records, key fingerprint, prepared
//! transactions) and `POST /v1/recover`.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::parties::{Party, PartyError};
use crate::server::state::SharedState;
use crate::wire::PartyStatus;

/// The modality-neutral routes. `records_sql` is the SQL expression counting a party's
/// enrolled records for `/v1/status` (the composition point supplies it).
pub fn routes(records_sql: &'static str) -> Router<SharedState> {
    Router::new()
        .route("/v1/health", get(health))
        .route(
            "/v1/status",
            get(move |state: State<SharedState>| status(state, records_sql)),
        )
        .route("/v1/recover", post(recover))
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
