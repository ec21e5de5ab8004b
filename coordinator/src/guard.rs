//! One coordinator per deployment. Recovery rolls back prepared transactions that no live
//! coordinator of *this* process is running, so two coordinators would abort each other's
//! in-flight batches (safely — recovery decides at P0 first — but uselessly). A coordinator
//! therefore holds a session-level advisory lock at P0 for as long as it runs; a second one
//! refuses to start. If P0 restarts, the lock is re-taken on the next recovery tick.
//!
//! The lock is taken by `privmatch.coordinator_lock()`, which only the coordinator's role may
//! execute; no other login at the party may take advisory locks at all (`sql/roles.sql`), so
//! an application login cannot hold the lock and keep the coordinator from starting.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio_postgres::Client;

use crate::config::PartyConfig;

/// What trying to take the lock found.
pub enum LockAttempt {
    /// Taken: the lock lives as long as this connection.
    Held(Client),
    /// Another session (another coordinator) holds it.
    HeldByOther,
    /// P0 could not be reached.
    Unreachable(String),
}

/// One attempt to take the coordinator lock at P0.
pub async fn try_lock(p0: &PartyConfig) -> LockAttempt {
    let client = match crate::parties::open(p0).await {
        Ok(client) => client,
        Err(e) => return LockAttempt::Unreachable(e.to_string()),
    };
    match client
        .query_one("SELECT privmatch.coordinator_lock()", &[])
        .await
    {
        Ok(row) if row.get::<_, bool>(0) => LockAttempt::Held(client),
        Ok(_) => LockAttempt::HeldByOther,
        Err(e) => LockAttempt::Unreachable(e.to_string()),
    }
}

/// Takes the lock, retrying while P0 is unreachable or the lock is held, for up to `wait`.
pub async fn acquire(p0: &PartyConfig, wait: Duration) -> Result<Client> {
    let deadline = Instant::now() + wait;
    loop {
        let problem = match try_lock(p0).await {
            LockAttempt::Held(client) => return Ok(client),
            LockAttempt::HeldByOther => {
                "another coordinator is running for these parties (it holds the coordinator lock at P0)".to_owned()
            }
            LockAttempt::Unreachable(e) => format!("P0 is unreachable: {e}"),
        };
        if Instant::now() >= deadline {
            bail!("cannot start the coordinator: {problem}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
