//! Connections from the coordinator to the three parties: a small pool per party that drops
//! connections a party restart has broken, and errors that say which party failed and why.

use std::sync::Arc;

use privmatch_core::party::PartyIndex;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

use crate::config::{Config, PartyConfig};

/// A failure at one party, as reported to the user.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{party}: {message}{}", sqlstate.as_ref().map(|s| format!(" [SQLSTATE {s}]")).unwrap_or_default())]
pub struct PartyError {
    /// Which party.
    pub party: PartyIndex,
    /// SQLSTATE when the party reported an error (None: it could not be reached).
    pub sqlstate: Option<String>,
    /// What went wrong.
    pub message: String,
}

/// Why a party call made under a deadline ([`call_with_timeout`]) failed.
#[derive(Debug)]
pub enum TimedCallError {
    /// The party answered with an error, or could not be reached.
    Failed(PartyError),
    /// No answer in time; the query was cancelled at the party.
    TimedOut(PartyError),
}

/// Runs one call at `party` with a deadline; on timeout the query is cancelled at the party
/// (so it does not keep working on an abandoned round). `what` names the call in errors.
pub async fn call_with_timeout<T>(
    party: PartyIndex,
    client: &Client,
    what: &str,
    timeout: std::time::Duration,
    call: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, TimedCallError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(TimedCallError::Failed(PartyError::from_pg(party, &e))),
        Err(_) => {
            let token = client.cancel_token();
            tokio::spawn(async move {
                let _ = token.cancel_query(NoTls).await;
            });
            Err(TimedCallError::TimedOut(PartyError {
                party,
                sqlstate: None,
                message: format!("no answer to {what} within {} s", timeout.as_secs_f64()),
            }))
        }
    }
}

/// The answers of a step run at `N` parties in parallel, or its most telling error: the first
/// party's own error, preferred over a timeout (which may only be its consequence).
/// `wrong_count` is the error when there are not exactly `N` answers.
pub fn all_answers<T, E, const N: usize>(
    results: Vec<Result<T, E>>,
    is_timeout: impl Fn(&E) -> bool,
    wrong_count: impl FnOnce() -> E,
) -> Result<[T; N], E> {
    let mut values = Vec::with_capacity(N);
    let mut error: Option<E> = None;
    for result in results {
        match result {
            Ok(value) => values.push(value),
            Err(e) => {
                let replace = error
                    .as_ref()
                    .is_none_or(|kept| is_timeout(kept) && !is_timeout(&e));
                if replace {
                    error = Some(e);
                }
            }
        }
    }
    if let Some(e) = error {
        return Err(e);
    }
    values.try_into().map_err(|_| wrong_count())
}

impl PartyError {
    /// Wraps a tokio-postgres error from `party`.
    pub fn from_pg(party: PartyIndex, err: &tokio_postgres::Error) -> Self {
        match err.as_db_error() {
            Some(db) => {
                let mut message = db.message().to_owned();
                if let Some(hint) = db.hint() {
                    message.push_str(&format!(" (hint: {hint})"));
                }
                PartyError {
                    party,
                    sqlstate: Some(db.code().code().to_owned()),
                    message,
                }
            }
            None => PartyError {
                party,
                sqlstate: None,
                message: format!("unreachable or connection lost: {err}"),
            },
        }
    }

    /// True when the party rejected the request's content (class 22 data exception or 23
    /// integrity violation), as opposed to being unavailable.
    pub fn is_client_error(&self) -> bool {
        self.sqlstate
            .as_deref()
            .is_some_and(|s| s.starts_with("22") || s.starts_with("23"))
    }
}

/// A connection pool for one party.
pub struct Party {
    /// Which party.
    pub index: PartyIndex,
    config: PartyConfig,
    idle: Mutex<Vec<Client>>,
}

impl Party {
    /// Takes an idle connection or opens a new one.
    pub async fn connect(&self) -> Result<Client, PartyError> {
        while let Some(client) = self.idle.lock().await.pop() {
            if !client.is_closed() {
                return Ok(client);
            }
        }
        let (client, connection) = tokio_postgres::connect(&self.config.connection_string(), NoTls)
            .await
            .map_err(|e| PartyError::from_pg(self.index, &e))?;
        tokio::spawn(async move {
            // Ends when the connection closes; errors surface on the next query.
            let _ = connection.await;
        });
        Ok(client)
    }

    /// Returns a healthy connection (outside any transaction) to the pool.
    pub async fn give_back(&self, client: Client) {
        if !client.is_closed() {
            let mut idle = self.idle.lock().await;
            if idle.len() < 8 {
                idle.push(client);
            }
        }
    }
}

/// The three parties.
pub struct Parties {
    parties: [Arc<Party>; 3],
}

impl Parties {
    /// Pools for the parties of `config` (no connection is opened yet).
    pub fn new(config: &Config) -> Self {
        let make = |i: usize| {
            Arc::new(Party {
                index: PartyIndex::ALL[i],
                config: config.parties[i].clone(),
                idle: Mutex::new(Vec::new()),
            })
        };
        Parties {
            parties: [make(0), make(1), make(2)],
        }
    }

    /// All three, in index order.
    pub fn all(&self) -> &[Arc<Party>; 3] {
        &self.parties
    }
}

#[cfg(test)]
mod answer_tests {
    use super::all_answers;

    #[test]
    fn a_partys_own_error_beats_a_timeout_and_counts_are_checked() {
        let timeout = |e: &&str| e.starts_with("timeout");
        let got: Result<[u8; 3], &str> = all_answers(
            vec![Err("timeout P0"), Ok(1), Err("P2 refused")],
            timeout,
            || "count",
        );
        assert_eq!(got, Err("P2 refused"));
        let got: Result<[u8; 2], &str> =
            all_answers(vec![Err("P0 refused"), Err("P1 refused")], timeout, || {
                "count"
            });
        assert_eq!(got, Err("P0 refused"));
        let got: Result<[u8; 2], &str> = all_answers(vec![Ok(1), Ok(2)], timeout, || "count");
        assert_eq!(got, Ok([1, 2]));
        let got: Result<[u8; 3], &str> = all_answers(vec![Ok(1), Ok(2)], timeout, || "count");
        assert_eq!(got, Err("count"));
    }
}
