//! The iris threshold policy (core's `iris::policy`): each party holds the match threshold
//! every search must use and refuses any other (22023), so neither a client nor the
//! coordinator can pick a threshold per search (a dozen searches at chosen thresholds would
//! bracket a distance). Operators change it with a command signed by their operator key
//! (action `iris-policy`), which the coordinator relays but cannot forge or replay.
//!
//! * `GET /v1/iris/search` → [`PolicyResponse`]: the threshold each party holds (scope
//!   search: clients seal probes with it). The coordinator's answer is only a hint; the
//!   parties check the threshold sealed with a probe against their own policy.
//! * `POST /v1/iris/configure` [`ConfigureBody`] `{"party", "command": "<b64>"}` →
//!   [`ConfigureResponse`] (scope admin): relays one operator's signed policy command.
//! * `privmatch iris policy show|set`: the client side.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use clap::Subcommand;
use futures::future::join_all;
use privmatch_core::iris::policy::{IrisPolicy, IRIS_POLICY_ACTION};
use privmatch_core::party::PartyIndex;
use serde::{Deserialize, Serialize};

use crate::cli::http::{CallError, Coordinator};
use crate::cli::operator_key::{self, fresh_counter};
use crate::config::Config;
use crate::parties::column;
use crate::server::error::{bad_request, parse_json, party_failure_error, ApiError};
use crate::server::state::SharedState;
use privmatch_api::wire::{from_base64, to_base64};

/// The answer to `GET /v1/iris/search`: the threshold policy of each party, by index.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PolicyResponse {
    /// τ at P0, P1, P2.
    pub parties: [f64; 3],
}

impl PolicyResponse {
    /// The threshold all three parties hold, or an error naming the party that differs.
    pub fn agreed(&self) -> Result<f64, String> {
        let [a, b, c] = self.parties;
        if a == b && b == c {
            return Ok(a);
        }
        let odd = if a == b {
            Some(2)
        } else if a == c {
            Some(1)
        } else if b == c {
            Some(0)
        } else {
            None
        };
        Err(match odd {
            Some(p) => format!(
                "the parties' iris threshold policies differ: P{p} holds {}, the other two {}; a policy change is half done (`privmatch iris policy set` at P{p})",
                self.parties[p],
                self.parties[(p + 1) % 3]
            ),
            None => format!(
                "the parties' iris threshold policies differ: P0 {a}, P1 {b}, P2 {c} (`privmatch iris policy set`)"
            ),
        })
    }
}

/// The body of `POST /v1/iris/configure`: an iris policy command signed by the operator of
/// party `party` (base64 of core's operator command).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigureBody {
    /// The party whose operator signed (0, 1 or 2).
    pub party: u8,
    /// The signed command (base64).
    pub command: String,
}

/// The answer to `POST /v1/iris/configure`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigureResponse {
    /// The party.
    pub party: u8,
    /// Its threshold now.
    pub threshold: f64,
}

/// `GET /v1/iris/search`: each party's threshold policy.
pub async fn get_policy(
    State(state): State<SharedState>,
) -> Result<Json<PolicyResponse>, ApiError> {
    let answers = join_all(state.parties.all().iter().map(|p| async move {
        let row = p.query_one("SELECT privmatch.iris_policy()", &[]).await?;
        column::<f64>(p.index, &row, 0).map(|v| v.unwrap_or(f64::NAN))
    }))
    .await;
    let mut parties = [0.0; 3];
    for (slot, answer) in parties.iter_mut().zip(answers) {
        *slot =
            answer.map_err(|e| party_failure_error(format!("reading the iris policy: {e}"), &e))?;
    }
    Ok(Json(PolicyResponse { parties }))
}

/// `POST /v1/iris/configure`: relays a signed policy command to its party.
pub async fn configure(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<ConfigureResponse>, ApiError> {
    let request: ConfigureBody = parse_json(&body)?;
    let command = from_base64(&request.command, "command").map_err(bad_request)?;
    let party = state
        .parties
        .all()
        .get(usize::from(request.party))
        .ok_or_else(|| bad_request(format!("party must be 0, 1 or 2, not {}", request.party)))?;
    let row = party
        .query_one("SELECT privmatch.iris_set_policy($1)", &[&command])
        .await
        .map_err(|e| party_failure_error(format!("setting the iris policy: {e}"), &e))?;
    let threshold: f64 = row.get(0);
    tracing::info!(
        party = request.party,
        threshold,
        "iris policy relayed and accepted"
    );
    Ok(Json(ConfigureResponse {
        party: request.party,
        threshold,
    }))
}

/// The threshold the three parties hold (asked through the coordinator: a wrong answer only
/// makes the parties refuse the search).
pub async fn fetch_policy(coordinator: &Coordinator) -> Result<f64, CallError> {
    let answer: PolicyResponse = coordinator.get("/v1/iris/search").await?;
    answer.agreed().map_err(CallError::Local)
}

/// `privmatch iris policy …`.
#[derive(Subcommand, Clone, Debug)]
pub enum PolicyAction {
    /// Show the iris match threshold each party holds.
    Show,
    /// Set one party's iris match threshold, signed by that party's operator key (run it for
    /// each of the three parties; searches fail while they differ).
    Set {
        /// The party (0, 1 or 2) whose operator signs.
        #[arg(long)]
        party: u8,
        /// The threshold: a fractional Hamming distance ratio in (0, 0.5], at most four
        /// decimals.
        #[arg(long)]
        threshold: f64,
        /// The party's operator signing key file (as `privmatch cluster up` writes it in
        /// HOME/operators/p<party>.signing.key).
        #[arg(long, env = "PRIVMATCH_OPERATOR_KEY")]
        operator_key: PathBuf,
    },
}

/// Runs `privmatch iris policy …`.
pub async fn run(config: &Config, action: &PolicyAction) -> Result<()> {
    let coordinator = Coordinator::new(config);
    match action {
        PolicyAction::Show => {
            let answer: PolicyResponse = coordinator.get("/v1/iris/search").await?;
            for (i, t) in answer.parties.iter().enumerate() {
                println!("P{i}: iris threshold {t}");
            }
            if let Err(e) = answer.agreed() {
                bail!(e);
            }
        }
        PolicyAction::Set {
            party,
            threshold,
            operator_key,
        } => {
            let index = PartyIndex::new(i64::from(*party)).context("--party must be 0, 1 or 2")?;
            let policy = IrisPolicy::from_ratio(*threshold).context("--threshold")?;
            let operator = operator_key::load(operator_key)?;
            let command =
                operator.sign(index, fresh_counter(), IRIS_POLICY_ACTION, &policy.encode());
            let body = ConfigureBody {
                party: *party,
                command: to_base64(&command),
            };
            let answer: ConfigureResponse = coordinator.post("/v1/iris/configure", &body).await?;
            println!(
                "P{}: iris threshold policy set to {}",
                answer.party, answer.threshold
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_that_differs_names_the_party() {
        let agreed = PolicyResponse {
            parties: [0.345; 3],
        };
        assert_eq!(agreed.agreed(), Ok(0.345));
        let half = PolicyResponse {
            parties: [0.3, 0.345, 0.3],
        };
        let err = half.agreed().err().unwrap_or_default();
        assert!(err.contains("P1 holds 0.345"), "{err}");
        let all = PolicyResponse {
            parties: [0.3, 0.345, 0.2],
        };
        assert!(all.agreed().is_err());
    }
}
