//! The relay of matching sessions between a terminal, a user's device and the service
//! provider (packed Paillier, Game-Set-MATCH [ABMR20]: Π1 Fig. 3, Π2 §6.1, Π3 Fig. 5).
//!
//! Unlike the iris and face sessions (`crate::session::driver`: every computing party called
//! in parallel, round after round), one party computes here, the service provider (SP), and
//! the other participant is outside the deployment: the device, which answers when it polls.
//! So a session is a small state machine the coordinator keeps in memory, moved on by calls:
//!
//! 1. the terminal opens it (`verify`): the SP computes Round 2 from the terminal's sealed
//!    input, and the relay queues it in the device's mailbox ([`Relay::open`]);
//! 2. the device takes it (`mailbox`, a long poll, [`Relay::wait_messages`]) and posts Round 3
//!    (`reply`); Π1: Round 3 is the bit, the session ends; Π2: the SP checks X and the session
//!    ends with Round 4 handed back to the device; Π3: the SP answers Round 4, the device
//!    posts Round 5, the SP checks the labels and the session ends;
//! 3. the terminal waits for the outcome (`outcome`, a long poll, [`Relay::wait_outcome`]).
//!
//! The relay holds no secret and learns no outcome: Round 2 is encrypted under the device's
//! key, the terminal's inputs and secrets stay at the SP (sealed to it, then in its own session
//! table), Round 4 is sealed to the device's reply key and the verdict to the terminal's
//! (core's `paillier::sealed`); the relay keeps the sealed verdict until the terminal takes
//! it. Round 2 waits in the mailbox until the device takes
//! it, once. Sessions expire [`SESSION_TTL`] after they open (a device that never answers);
//! an ended session's outcome is kept [`OUTCOME_TTL`] for the terminal, then forgotten.
//! Session ids are claimed at the coordinator (`AppState::claim_sessions`): never reused.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use privmatch_core::paillier::params::Protocol;
use privmatch_core::wire::session::SessionId;
use tokio::sync::Notify;

use privmatch_api::paillier::SessionState;

/// How long a session may take from the terminal's request to its end.
pub const SESSION_TTL: Duration = Duration::from_secs(120);
/// How long an ended session's outcome is kept for the terminal.
pub const OUTCOME_TTL: Duration = Duration::from_secs(60);
/// The most sessions the relay holds at once (more: refused, retry later).
pub const MAX_SESSIONS: usize = 10_000;
/// The most Round 2 messages waiting in one device's mailbox.
pub const MAX_QUEUED: usize = 64;

/// Where a session stands.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Stage {
    /// Round 2 waits in the device's mailbox.
    Queued(Vec<u8>),
    /// The device's message of this round is due.
    Awaiting(u8),
    /// The device's message of this round is at the SP.
    Relaying(u8),
    /// Over.
    Finished {
        state: SessionState,
        error: Option<String>,
        verdict: Option<Vec<u8>>,
    },
}

#[derive(Debug)]
struct Session {
    device: String,
    protocol: Protocol,
    stage: Stage,
    deadline: Instant,
}

#[derive(Debug, Default)]
struct Table {
    sessions: BTreeMap<SessionId, Session>,
    mailboxes: BTreeMap<String, VecDeque<SessionId>>,
}

impl Table {
    /// Ends the sessions past their deadline (expired) and forgets ended ones past theirs.
    fn sweep(&mut self, now: Instant) {
        self.sessions.retain(|_, s| {
            if s.deadline > now {
                return true;
            }
            match s.stage {
                Stage::Finished { .. } => false,
                _ => {
                    s.stage = Stage::Finished {
                        state: SessionState::Expired,
                        error: Some(format!(
                            "the device did not complete the session within {} s",
                            SESSION_TTL.as_secs()
                        )),
                        verdict: None,
                    };
                    s.deadline = now + OUTCOME_TTL;
                    true
                }
            }
        });
        let sessions = &self.sessions;
        self.mailboxes.retain(|_, queue| {
            queue.retain(|id| {
                sessions
                    .get(id)
                    .is_some_and(|s| matches!(s.stage, Stage::Queued(_)))
            });
            !queue.is_empty()
        });
    }
}

/// Why the relay refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// No such session (never opened, or forgotten).
    #[error("no matching session {0} (never opened, or expired and forgotten)")]
    Unknown(String),
    /// The session belongs to another device.
    #[error("session {0} is not addressed to this device")]
    OtherDevice(String),
    /// The call does not belong to the session's current step.
    #[error("session {session}: {reason}")]
    WrongStep {
        /// The session.
        session: String,
        /// What the session expects instead.
        reason: String,
    },
    /// Too many sessions, or a full mailbox.
    #[error("{0}")]
    Full(String),
}

/// A Round 2 message taken from a mailbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The session.
    pub session: SessionId,
    /// Its protocol.
    pub protocol: Protocol,
    /// Round 2 for the device.
    pub message: Vec<u8>,
}

/// What the terminal may know of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The device.
    pub device: String,
    /// The protocol.
    pub protocol: Protocol,
    /// Where it stands.
    pub state: SessionState,
    /// Why it failed.
    pub error: Option<String>,
    /// The verdict sealed to the terminal (core's `sealed::TerminalVerdict`): the relay passes
    /// it on and can neither read nor make one.
    pub verdict: Option<Vec<u8>>,
}

/// The sessions in flight and the devices' mailboxes (module docs).
#[derive(Debug, Default)]
pub struct Relay {
    table: Mutex<Table>,
    changed: Notify,
}

impl Relay {
    /// An empty relay.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table, swept. A poisoned lock (a panic elsewhere while holding it) is taken as it
    /// is: every change leaves the table consistent.
    fn table(&self) -> MutexGuard<'_, Table> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        table.sweep(Instant::now());
        table
    }

    /// Opens a session: Round 2 queued for `device`.
    pub fn open(
        &self,
        device: &str,
        protocol: Protocol,
        session: SessionId,
        round2: Vec<u8>,
    ) -> Result<(), RelayError> {
        {
            let mut table = self.table();
            if table.sessions.len() >= MAX_SESSIONS {
                return Err(RelayError::Full(format!(
                    "the coordinator relays {MAX_SESSIONS} sessions already: retry shortly"
                )));
            }
            let queued = table.mailboxes.get(device).map_or(0, VecDeque::len);
            if queued >= MAX_QUEUED {
                return Err(RelayError::Full(format!(
                    "{MAX_QUEUED} sessions already wait for device {device:?}: is it answering?"
                )));
            }
            if table.sessions.contains_key(&session) {
                return Err(RelayError::WrongStep {
                    session: hex::encode(session),
                    reason: "the session is open already".into(),
                });
            }
            table.sessions.insert(
                session,
                Session {
                    device: device.to_owned(),
                    protocol,
                    stage: Stage::Queued(round2),
                    deadline: Instant::now() + SESSION_TTL,
                },
            );
            table
                .mailboxes
                .entry(device.to_owned())
                .or_default()
                .push_back(session);
        }
        self.changed.notify_waiters();
        Ok(())
    }

    /// Takes up to `max` Round 2 messages from `device`'s mailbox (each given once).
    pub fn take(&self, device: &str, max: usize) -> Vec<Delivery> {
        let mut table = self.table();
        let Table {
            sessions,
            mailboxes,
        } = &mut *table;
        let Some(queue) = mailboxes.get_mut(device) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while out.len() < max {
            let Some(id) = queue.pop_front() else { break };
            let Some(session) = sessions.get_mut(&id) else {
                continue;
            };
            if let Stage::Queued(message) =
                std::mem::replace(&mut session.stage, Stage::Awaiting(3))
            {
                out.push(Delivery {
                    session: id,
                    protocol: session.protocol,
                    message,
                });
            }
        }
        if queue.is_empty() {
            mailboxes.remove(device);
        }
        out
    }

    /// Waits up to `wait` for messages in `device`'s mailbox, then takes them ([`Self::take`]);
    /// empty when none came.
    pub async fn wait_messages(&self, device: &str, max: usize, wait: Duration) -> Vec<Delivery> {
        self.wait_for(wait, || {
            let got = self.take(device, max);
            (!got.is_empty()).then_some(got)
        })
        .await
        .unwrap_or_default()
    }

    /// The device's message of `round` arrived: the session must be `device`'s and expect
    /// it; it is then being relayed (a second message for the same round is refused).
    pub fn claim(
        &self,
        session: &SessionId,
        device: &str,
        round: u8,
    ) -> Result<Protocol, RelayError> {
        let name = hex::encode(session);
        let mut table = self.table();
        let s = table
            .sessions
            .get_mut(session)
            .ok_or_else(|| RelayError::Unknown(name.clone()))?;
        if s.device != device {
            return Err(RelayError::OtherDevice(name));
        }
        match &s.stage {
            Stage::Awaiting(due) if *due == round => {
                s.stage = Stage::Relaying(round);
                Ok(s.protocol)
            }
            stage => Err(RelayError::WrongStep {
                session: name,
                reason: match stage {
                    Stage::Queued(_) => "the device has not taken Round 2 yet".into(),
                    Stage::Awaiting(due) => format!("Round {due} is due, not Round {round}"),
                    Stage::Relaying(r) => format!("Round {r} is being relayed already"),
                    Stage::Finished { state, .. } => format!("the session is over ({state:?})"),
                },
            }),
        }
    }

    /// The SP answered the device's message: Round `next` of the device is due now.
    pub fn expect(&self, session: &SessionId, next: u8) {
        if let Some(s) = self.table().sessions.get_mut(session) {
            if matches!(s.stage, Stage::Relaying(_)) {
                s.stage = Stage::Awaiting(next);
            }
        }
    }

    /// Ends a session with `state` (and why, when it failed); its outcome is kept
    /// [`OUTCOME_TTL`]. A session that ended already keeps its first outcome.
    pub fn finish(&self, session: &SessionId, state: SessionState, error: Option<String>) {
        self.end(session, state, error, None);
    }

    /// Ends a session with the verdict sealed to the terminal (the relay cannot read it; the
    /// terminal checks the signature inside); otherwise as [`Self::finish`].
    pub fn finish_signed(&self, session: &SessionId, state: SessionState, verdict: Vec<u8>) {
        self.end(session, state, None, Some(verdict));
    }

    fn end(
        &self,
        session: &SessionId,
        state: SessionState,
        error: Option<String>,
        verdict: Option<Vec<u8>>,
    ) {
        {
            let mut table = self.table();
            if let Some(s) = table.sessions.get_mut(session) {
                if !matches!(s.stage, Stage::Finished { .. }) {
                    s.stage = Stage::Finished {
                        state,
                        error,
                        verdict,
                    };
                    s.deadline = Instant::now() + OUTCOME_TTL;
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Where `session` stands, if the relay knows it.
    pub fn status(&self, session: &SessionId) -> Option<Status> {
        let table = self.table();
        let s = table.sessions.get(session)?;
        let (state, error, verdict) = match &s.stage {
            Stage::Finished {
                state,
                error,
                verdict,
            } => (*state, error.clone(), verdict.clone()),
            _ => (SessionState::Waiting, None, None),
        };
        Some(Status {
            device: s.device.clone(),
            protocol: s.protocol,
            state,
            error,
            verdict,
        })
    }

    /// Waits up to `wait` for `session` to end; its status then (None: unknown).
    pub async fn wait_outcome(&self, session: &SessionId, wait: Duration) -> Option<Status> {
        self.wait_for(wait, || match self.status(session) {
            None => Some(None),
            Some(status) if status.state.is_final() => Some(Some(status)),
            Some(_) => None,
        })
        .await
        .unwrap_or_else(|| self.status(session))
    }

    /// Calls `check` until it gives a value or `wait` ran out; woken by every change.
    async fn wait_for<T>(&self, wait: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change between the check and the wait wakes it.
            notified.as_mut().enable();
            if let Some(value) = check() {
                return Some(value);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return check();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_session_moves_through_its_steps_once() {
        let relay = Relay::new();
        let id = [1u8; 16];
        relay
            .open("phone-1", Protocol::Pi3, id, b"round 2".to_vec())
            .expect("open");
        assert!(relay.open("phone-1", Protocol::Pi3, id, vec![]).is_err());
        // Round 3 before the device took Round 2: refused.
        assert!(matches!(
            relay.claim(&id, "phone-1", 3),
            Err(RelayError::WrongStep { .. })
        ));
        assert!(relay.take("phone-2", 8).is_empty());
        let got = relay.take("phone-1", 8);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message, b"round 2");
        assert!(relay.take("phone-1", 8).is_empty(), "given once");
        assert_eq!(
            relay.claim(&id, "phone-2", 3),
            Err(RelayError::OtherDevice(hex::encode(id)))
        );
        assert_eq!(relay.claim(&id, "phone-1", 3), Ok(Protocol::Pi3));
        // The same round twice: refused while the first is relayed.
        assert!(relay.claim(&id, "phone-1", 3).is_err());
        relay.expect(&id, 5);
        assert!(relay.claim(&id, "phone-1", 3).is_err());
        assert_eq!(
            relay.status(&id).map(|s| s.state),
            Some(SessionState::Waiting)
        );
        assert_eq!(relay.claim(&id, "phone-1", 5), Ok(Protocol::Pi3));
        relay.finish_signed(&id, SessionState::Match, vec![5; 64]);
        relay.finish(&id, SessionState::Failed, Some("late".into()));
        let status = relay.status(&id).expect("kept");
        assert_eq!(
            (status.state, status.error, status.verdict),
            (SessionState::Match, None, Some(vec![5; 64])),
            "the first outcome stays, with the SP's signature"
        );
        assert!(relay.claim(&id, "phone-1", 5).is_err());
        assert!(matches!(
            relay.claim(&[9u8; 16], "phone-1", 3),
            Err(RelayError::Unknown(_))
        ));
    }

    #[test]
    fn sessions_expire_and_mailboxes_are_bounded() {
        let relay = Relay::new();
        for i in 0..MAX_QUEUED {
            relay
                .open("busy", Protocol::Pi1, [i as u8; 16], vec![1])
                .expect("open");
        }
        assert!(matches!(
            relay.open("busy", Protocol::Pi1, [0xff; 16], vec![1]),
            Err(RelayError::Full(_))
        ));
        let mut table = relay.table();
        let later = Instant::now() + SESSION_TTL + Duration::from_secs(1);
        table.sweep(later);
        assert!(
            table.mailboxes.is_empty(),
            "expired sessions leave the mailbox"
        );
        assert!(table.sessions.values().all(|s| matches!(
            s.stage,
            Stage::Finished {
                state: SessionState::Expired,
                ..
            }
        )));
        table.sweep(later + OUTCOME_TTL + Duration::from_secs(1));
        assert!(table.sessions.is_empty(), "and are forgotten later");
    }

    #[tokio::test]
    async fn long_polls_wake_on_changes_and_time_out() {
        let relay = Arc::new(Relay::new());
        let id = [3u8; 16];
        let waiter = {
            let relay = relay.clone();
            tokio::spawn(async move {
                relay
                    .wait_messages("phone-1", 4, Duration::from_secs(10))
                    .await
            })
        };
        tokio::task::yield_now().await;
        relay
            .open("phone-1", Protocol::Pi1, id, b"r2".to_vec())
            .expect("open");
        let got = waiter.await.expect("joined");
        assert_eq!(got.len(), 1);
        let outcome = {
            let relay = relay.clone();
            tokio::spawn(async move { relay.wait_outcome(&id, Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        relay.finish(&id, SessionState::NoMatch, None);
        let status = outcome.await.expect("joined").expect("known");
        assert_eq!(status.state, SessionState::NoMatch);
        let none = relay
            .wait_messages("phone-1", 4, Duration::from_millis(20))
            .await;
        assert!(none.is_empty());
        assert!(relay
            .wait_outcome(&[7u8; 16], Duration::from_millis(20))
            .await
            .is_none());
    }
}
