//! Connections from the coordinator to the three parties: a small pool per party that drops
//! connections a party restart has broken and retires connections older than
//! [`MAX_CONNECTION_AGE`], and errors that say which party failed and why.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use privmatch_core::party::PartyIndex;
use tokio::sync::Mutex;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, NoTls, Row};

use crate::config::{CoordinatorConfig, PartyConfig};

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

/// Why a connection to a party could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The party's TLS settings (its CA file) are unusable.
    #[error("TLS settings of P{party}: {message}")]
    Tls {
        /// Which party.
        party: u8,
        /// What is wrong.
        message: String,
    },
    /// PostgreSQL refused or could not be reached.
    #[error(transparent)]
    Pg(#[from] tokio_postgres::Error),
}

/// Opens a connection to `config`'s party and drives it on the current runtime: TLS verified
/// against the party's CA and host name when the configuration names a CA (`ca_cert`), plain
/// otherwise.
pub async fn open(config: &PartyConfig) -> Result<Client, ConnectError> {
    let connection_string = config.connection_string();
    match &config.ca_cert {
        Some(ca) => {
            // The CA is also recorded for this host's cancel requests (crate::tls::CancelTls).
            let tls = crate::tls::party_connector_for(&config.host, ca).map_err(|e| {
                ConnectError::Tls {
                    party: config.index,
                    message: format!("{e:#}"),
                }
            })?;
            let (client, connection) = tokio_postgres::connect(&connection_string, tls).await?;
            tokio::spawn(async move {
                // Ends when the connection closes; errors surface on the next query.
                let _ = connection.await;
            });
            Ok(client)
        }
        None => {
            let (client, connection) = tokio_postgres::connect(&connection_string, NoTls).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok(client)
        }
    }
}

impl PartyError {
    /// Wraps a connection failure at `party`.
    pub fn from_connect(party: PartyIndex, err: &ConnectError) -> Self {
        match err {
            ConnectError::Pg(e) => Self::from_pg(party, e),
            ConnectError::Tls { message, .. } => PartyError {
                party,
                sqlstate: None,
                message: format!("TLS settings: {message}"),
            },
        }
    }

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

/// How long a pooled connection to a party is reused. Each backend has a secret cancel key
/// for its whole life, which lets whoever holds it cancel the backend's queries; a pool that
/// kept its connections for as long as the coordinator runs would keep every key valid that
/// long. A connection this old is closed when it comes back to the pool or is found idle there
/// (never while a call runs on it), so the key dies with its backend; a new connection costs
/// one TLS handshake and login.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(10 * 60);

/// A connection lent by a party's pool: a [`Client`] (through `Deref`) and when it was opened,
/// for [`MAX_CONNECTION_AGE`]. Give it back with [`Party::give_back`] (or drop it: that closes
/// it).
pub struct PooledClient {
    client: Client,
    opened: Instant,
}

impl PooledClient {
    /// The connection.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// How long ago it was opened.
    pub fn age(&self) -> Duration {
        self.opened.elapsed()
    }
}

impl Deref for PooledClient {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl DerefMut for PooledClient {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

/// A connection pool for one party.
pub struct Party {
    /// Which party.
    pub index: PartyIndex,
    config: PartyConfig,
    max_age: Duration,
    idle: Mutex<Vec<PooledClient>>,
}

impl Party {
    /// Takes an idle connection (dropping those closed or older than the pool's maximum age)
    /// or opens a new one.
    pub async fn connect(&self) -> Result<PooledClient, PartyError> {
        while let Some(client) = self.idle.lock().await.pop() {
            if !client.is_closed() && client.age() < self.max_age {
                return Ok(client);
            }
        }
        let opened = Instant::now();
        let client = open(&self.config)
            .await
            .map_err(|e| PartyError::from_connect(self.index, &e))?;
        Ok(PooledClient { client, opened })
    }

    /// Runs one statement on a pooled connection, given back afterwards (dropped after an
    /// error): its rows, or this party's error.
    pub async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, PartyError> {
        let client = self.connect().await?;
        let rows = client
            .query(sql, params)
            .await
            .map_err(|e| PartyError::from_pg(self.index, &e))?;
        self.give_back(client).await;
        Ok(rows)
    }

    /// [`Party::query`] of a statement that answers exactly one row.
    pub async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, PartyError> {
        let mut rows = self.query(sql, params).await?;
        match (rows.pop(), rows.is_empty()) {
            (Some(row), true) => Ok(row),
            _ => Err(PartyError {
                party: self.index,
                sqlstate: None,
                message: "query returned an unexpected number of rows".into(),
            }),
        }
    }

    /// Returns a healthy connection (outside any transaction) to the pool; one that is closed,
    /// older than the pool's maximum age or beyond the 8 idle ones kept is closed instead.
    pub async fn give_back(&self, client: PooledClient) {
        if !client.is_closed() && client.age() < self.max_age {
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
    pub fn new(config: &CoordinatorConfig) -> Self {
        Self::from_configs([
            config.parties[0].clone(),
            config.parties[1].clone(),
            config.parties[2].clone(),
        ])
    }

    /// Pools for three parties given in index order, logging in as each entry says.
    pub fn from_configs(configs: [PartyConfig; 3]) -> Self {
        Self::with_max_age(configs, MAX_CONNECTION_AGE)
    }

    /// [`Parties::from_configs`] with connections retired after `max_age` instead of
    /// [`MAX_CONNECTION_AGE`] (tests).
    pub fn with_max_age(configs: [PartyConfig; 3], max_age: Duration) -> Self {
        let [c0, c1, c2] = configs;
        let make = |i: usize, config: PartyConfig| {
            Arc::new(Party {
                index: PartyIndex::ALL[i],
                config,
                max_age,
                idle: Mutex::new(Vec::new()),
            })
        };
        Parties {
            parties: [make(0, c0), make(1, c1), make(2, c2)],
        }
    }

    /// All three, in index order.
    pub fn all(&self) -> &[Arc<Party>; 3] {
        &self.parties
    }

    /// One pooled connection to each of the first `N` parties (P0, P1, … in order). If any
    /// cannot be had, the others go back to their pools and the first error is returned.
    pub async fn connect_first<const N: usize>(&self) -> Result<[PooledClient; N], PartyError> {
        let connected = join_all(self.parties[..N].iter().map(|p| p.connect())).await;
        let mut clients = Vec::with_capacity(N);
        let mut error = None;
        for (party, result) in self.parties.iter().zip(connected) {
            match result {
                Ok(client) => clients.push((party, client)),
                Err(e) => error = error.or(Some(e)),
            }
        }
        if let Some(err) = error {
            // Each connection goes back to its own party's pool: with P1 unreachable, P2's
            // connection filed by position under P1 would serve the next transaction as P1's
            // (found under load with P1 killed: that transaction began twice at P2 and
            // waited on itself).
            for (party, client) in clients {
                party.give_back(client).await;
            }
            return Err(err);
        }
        let clients: Vec<PooledClient> = clients.into_iter().map(|(_, client)| client).collect();
        clients.try_into().map_err(|_| PartyError {
            party: PartyIndex::ALL[0],
            sqlstate: None,
            message: format!("internal error: expected {N} connections"),
        })
    }

    /// Gives connections back to the pools of the first parties (`clients[i]` to party i).
    pub async fn give_back_all(&self, clients: impl IntoIterator<Item = PooledClient>) {
        for (party, client) in self.parties.iter().zip(clients) {
            party.give_back(client).await;
        }
    }
}

/// Column `index` of a row `party` answered, NULL as None; a column of another type is that
/// party's error.
pub fn column<'r, T: FromSql<'r>>(
    party: PartyIndex,
    row: &'r Row,
    index: usize,
) -> Result<Option<T>, PartyError> {
    row.try_get::<_, Option<T>>(index)
        .map_err(|e| PartyError::from_pg(party, &e))
}
