//! What every handler of the coordinator shares: the parties' pools, the transaction manager,
//! the serve options, and the recent session ids (a reused one is refused).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use privmatch_core::wire::session::SessionId;

use crate::parties::Parties;
use crate::server::error::{bad_request, ApiError};
use crate::session::batcher::BatchPolicy;
use crate::txn::twophase::TwoPhase;

/// The default per-call timeout of the parties' session functions.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How many session ids the coordinator remembers to refuse their reuse.
pub const RECENT_SESSIONS: usize = 65_536;

/// The default largest request body: a batch of 250 sealed iris enrolments is ~29 MB.
pub const MAX_BODY_BYTES: usize = 64 << 20;
/// The default number of API requests served at once.
pub const MAX_IN_FLIGHT: usize = 32;

/// Options of `privmatch coordinator serve`.
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// Per-call timeout of the parties' session functions (searches, face rounds).
    pub search_timeout: Duration,
    /// Largest request body, in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// API requests served at once (more: 429).
    pub max_in_flight: usize,
    /// How searches are batched (`crate::session::batcher`; iris searches).
    pub iris_batches: BatchPolicy,
}

impl Default for ServeOptions {
    /// A 60 s call timeout, [`MAX_BODY_BYTES`], [`MAX_IN_FLIGHT`], the default batches.
    fn default() -> Self {
        ServeOptions {
            search_timeout: DEFAULT_CALL_TIMEOUT,
            max_body_bytes: MAX_BODY_BYTES,
            max_in_flight: MAX_IN_FLIGHT,
            iris_batches: BatchPolicy::default(),
        }
    }
}

/// The most recent session ids, to refuse a reused one.
pub struct RecentSessions {
    seen: HashSet<SessionId>,
    order: VecDeque<SessionId>,
    capacity: usize,
}

impl RecentSessions {
    /// Remembers up to `capacity` ids.
    pub fn new(capacity: usize) -> Self {
        RecentSessions {
            seen: HashSet::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Records `ids`; false (and nothing recorded) if any of them was seen before.
    pub fn claim(&mut self, ids: &[SessionId]) -> bool {
        if ids.iter().any(|id| self.seen.contains(id)) {
            return false;
        }
        for id in ids {
            if self.order.len() == self.capacity {
                if let Some(oldest) = self.order.pop_front() {
                    self.seen.remove(&oldest);
                }
            }
            self.seen.insert(*id);
            self.order.push_back(*id);
        }
        true
    }
}

/// The state every handler shares.
pub struct AppState {
    /// The parties' connection pools.
    pub parties: Arc<Parties>,
    /// The distributed transaction manager.
    pub txns: TwoPhase,
    /// This process's random instance id (in gids and `/v1/health`).
    pub instance: String,
    /// The serve options.
    pub options: ServeOptions,
    sessions: tokio::sync::Mutex<RecentSessions>,
}

impl AppState {
    /// The state of a coordinator process.
    pub fn new(
        parties: Arc<Parties>,
        txns: TwoPhase,
        instance: String,
        options: ServeOptions,
    ) -> Self {
        AppState {
            parties,
            txns,
            instance,
            options,
            sessions: tokio::sync::Mutex::new(RecentSessions::new(RECENT_SESSIONS)),
        }
    }

    /// Claims session ids for a request; refuses (400) an id seen before.
    pub async fn claim_sessions(&self, ids: &[SessionId]) -> Result<(), ApiError> {
        if self.sessions.lock().await.claim(ids) {
            Ok(())
        } else {
            Err(bad_request(
                "a search session id was used before: seal the probes for a fresh session id",
            ))
        }
    }
}

/// The state as handlers receive it.
pub type SharedState = Arc<AppState>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_session_ids_are_refused() {
        let mut recent = RecentSessions::new(2);
        assert!(recent.claim(&[[1; 16], [2; 16]]));
        assert!(!recent.claim(&[[3; 16], [1; 16]]));
        assert!(recent.claim(&[[3; 16]]));
        // Capacity 2: id 1 is forgotten, 2 and 3 are remembered.
        assert!(!recent.claim(&[[2; 16]]));
        assert!(recent.claim(&[[1; 16]]));
    }
}
