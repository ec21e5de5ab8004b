//! The iris search on the round-driver skeleton ([`crate::session::driver`]): one search
//! session (one probe, one eye) across the three parties, in the ring of Bloemen et al.,
//! "Large-Scale MPC: Scaling Private Iris Code Uniqueness Checks to Millions of Users"
//! (ePrint 2024/705).
//!
//! Protocol, as the parties expose it (schema `privmatch`):
//!
//! 1. `iris_search_start(session, probe)` at the three parties in parallel, each with its own
//!    sealed probe, which carries the search's mode, rotation range and threshold (they travel
//!    nowhere else: each party refuses a threshold other than its policy). Each answers the number of templates it
//!    searches, a digest of the set of (subject, eye) keys, and its first outbound message.
//!    The three must search the same set; if they do not (an enrolment or deletion is being
//!    committed, or awaits recovery) the session is aborted and the caller retries with a
//!    fresh session id ([`retry_on_set_mismatch`]).
//! 2. Round k = 0, 1, 2, …: `iris_search_round(session, k, message)` at the three parties in
//!    parallel. Party i receives what party i−1 sent ([`route`]) and answers its next message
//!    (to party i+1) or `finished` with its output, signed and **sealed to the client's reply
//!    key** (core's `iris::output`): the coordinator relays the three sealed outputs to the
//!    client, which opens, verifies and combines them; it learns no subject and no bit. All
//!    three finish in the same round ([`classify_round`]). Only the uniqueness search of
//!    enroll-if-unique, whose probe the client sealed with that disclosure, also answers the
//!    bit in the clear (`disclosed_unique`): the coordinator must know whether to enrol.
//! 3. On any error or timeout: `iris_search_abort(session)` at all three (best effort) and a
//!    [`SearchError`] naming the party (and SQLSTATE).
//!
//! The session id is bound into the sealed probes, so every attempt needs fresh sealed probes
//! and a fresh id; whoever seals (the client) draws it.
//!
//! [`run_search`] uses pooled connections; [`run_search_on`] runs on connections the caller
//! supplies (e.g. inside a distributed transaction, for enroll-if-unique). Both count rounds
//! and the bytes each party emitted, for the benchmark.

use std::future::Future;
use std::time::Duration;

use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SessionId;
use tokio_postgres::{Client, Row};

use crate::parties::{column, Parties, PartyError};
use crate::session::driver::{
    at_each, call_with_timeout, relay_ring, run_on, run_pooled, RingReply, RingRounds, Rounds,
    Session, Step, Traffic,
};
use crate::session::retry::{with_retry, RetryPolicy};
use privmatch_api::iris::{SearchRequest, SearchStats};

/// More rounds than any search needs (uniqueness over 2^64 comparisons needs 81): a party
/// that never finishes is a protocol error, not an endless loop.
pub(crate) const MAX_ROUNDS: i32 = 256;

/// Length of the template-set digest a party reports at start.
const SET_DIGEST_LEN: usize = 32;

/// A finished search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchOutcome {
    /// Rounds, bytes, time.
    pub stats: SearchStats,
    /// The set digest the three parties searched (they agreed on it).
    pub set_digest: Vec<u8>,
    /// Each party's output, signed and sealed to the client's reply key (core's
    /// `iris::output`), indexed by party; the coordinator relays them unread.
    pub sealed_outputs: [Vec<u8>; 3],
    /// The uniqueness bit, when the client's probe disclosed it (enroll-if-unique); the three
    /// parties agreed on it.
    pub disclosed_unique: Option<bool>,
}

/// What the three parties answered in their last round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedResult {
    /// Party i's sealed output.
    pub sealed_outputs: [Vec<u8>; 3],
    /// The disclosed uniqueness bit, if any.
    pub disclosed_unique: Option<bool>,
}

/// The parties started a search over different template sets. The set digest commits to each
/// entry's subject and enrolment id (core's `iris::binding`), so this is also what a share
/// deleted, replaced or re-enrolled at one party looks like: the party whose digest differs
/// from the other two is named.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the parties hold different template sets (entries P0 = {}, P1 = {}, P2 = {}{}){}{}: an enrolment or deletion is being committed or awaits recovery (`privmatch recover` finishes transactions left in doubt); if it persists, an entry was deleted or replaced at {} outside a distributed transaction: `privmatch iris audit` names it and `privmatch iris audit --quarantine` removes it at every party",
    entries[0], entries[1], entries[2],
    if *same_entries_other_keys { ", with different keys" } else { "" },
    match diverging {
        Some(p) => format!("; {p}'s set diverges from the other two"),
        None => String::new(),
    },
    if *attempts > 1 { format!(" in {attempts} attempts") } else { String::new() },
    match diverging { Some(p) => p.to_string(), None => "a party".to_owned() }
)]
pub struct SetMismatch {
    /// Entries each party reported.
    pub entries: [i64; 3],
    /// The counts agree but the key digests do not.
    pub same_entries_other_keys: bool,
    /// The party whose set digest differs from the other two (None: all three differ).
    pub diverging: Option<PartyIndex>,
    /// Attempts made (1 until a retry loop gives up).
    pub attempts: u32,
}

/// The party whose value differs from the other two equal ones, if exactly one does.
pub fn odd_one_out<T: PartialEq>(values: [&T; 3]) -> Option<PartyIndex> {
    let [a, b, c] = values;
    match (a == b, a == c, b == c) {
        (true, false, false) => Some(PartyIndex::ALL[2]),
        (false, true, false) => Some(PartyIndex::ALL[1]),
        (false, false, true) => Some(PartyIndex::ALL[0]),
        _ => None,
    }
}

/// Why a search failed. The session was aborted at the three parties (best effort).
#[derive(Clone, Debug, thiserror::Error)]
pub enum SearchError {
    /// The request is malformed or out of range (nothing was sent to the parties).
    #[error("invalid search request: {0}")]
    Invalid(String),
    /// A party failed or could not be reached.
    #[error("search failed at {0}")]
    Party(PartyError),
    /// A party did not answer within the per-call timeout (its call was cancelled).
    #[error("search timed out at {0}")]
    Timeout(PartyError),
    /// The parties hold different template sets.
    #[error(transparent)]
    SetsDiffer(SetMismatch),
    /// The parties broke the protocol (finished in different rounds, disagree on the result).
    #[error("search protocol error: {0}")]
    Protocol(String),
    /// Enroll-if-unique: a request ahead of this one in its batch was refused at some
    /// parties only, so this request's comparison with its record is void (nothing was
    /// enrolled for it; a new session runs in another batch).
    #[error("a request ahead of this one in its enrolment batch was refused at {0} only, so the comparison with its record is void and nothing was enrolled; seal the request again and retry")]
    BatchVoid(String),
    /// As many searches as the coordinator queues for a batch are waiting (retry shortly).
    #[error("too many searches are waiting for a batch at the coordinator; retry shortly")]
    Busy,
}

crate::session_error!(SearchError);

/// What a party answered to `iris_search_start` (or, with its refusals, to
/// `iris_batch_start`).
#[derive(Clone, Debug)]
pub(crate) struct StartReply {
    /// Templates searched.
    pub(crate) entries: i64,
    /// Digest of the searched set.
    pub(crate) set_digest: Vec<u8>,
    /// The first message, for party i+1.
    pub(crate) message: Vec<u8>,
}

/// What a party answered to `iris_search_round`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundReply {
    /// The next message (to party i+1), unless finished.
    pub message: Option<Vec<u8>>,
    /// True in the last round.
    pub finished: bool,
    /// The party's output, signed and sealed to the client's reply key, when finished.
    pub sealed_output: Option<Vec<u8>>,
    /// The uniqueness bit, when finished and the client's probe disclosed it.
    pub disclosed_unique: Option<bool>,
}

/// Routes the messages of a round (indexed by sender): party i receives party i−1's.
pub fn route(outbound: [Vec<u8>; 3]) -> [Vec<u8>; 3] {
    let [m0, m1, m2] = outbound;
    [m2, m0, m1]
}

/// Checks that the three parties search the same template set.
pub(crate) fn check_same_set(starts: &[StartReply; 3]) -> Result<(), SearchError> {
    for (party, start) in PartyIndex::ALL.iter().zip(starts) {
        if start.set_digest.len() != SET_DIGEST_LEN {
            return Err(SearchError::Protocol(format!(
                "{party} answered a template-set digest of {} bytes, expected {SET_DIGEST_LEN}",
                start.set_digest.len()
            )));
        }
    }
    let entries = [starts[0].entries, starts[1].entries, starts[2].entries];
    let same_entries = entries.iter().all(|&e| e == entries[0]);
    let same_digest = starts.iter().all(|s| s.set_digest == starts[0].set_digest);
    if same_entries && same_digest {
        return Ok(());
    }
    let keys = |s: &StartReply| (s.entries, s.set_digest.clone());
    let [k0, k1, k2] = [keys(&starts[0]), keys(&starts[1]), keys(&starts[2])];
    Err(SearchError::SetsDiffer(SetMismatch {
        entries,
        same_entries_other_keys: same_entries,
        diverging: odd_one_out([&k0, &k1, &k2]),
        attempts: 1,
    }))
}

/// Interprets the three answers of round `round`: the messages to relay, or the outputs.
pub fn classify_round(
    round: i32,
    replies: [RoundReply; 3],
) -> Result<Step<3, SealedResult>, SearchError> {
    let finished: Vec<PartyIndex> = PartyIndex::ALL
        .iter()
        .zip(&replies)
        .filter(|(_, r)| r.finished)
        .map(|(&p, _)| p)
        .collect();
    match finished.len() {
        0 => continue_round(round, replies),
        3 => finish_round(round, replies).map(Step::Finished),
        _ => Err(SearchError::Protocol(format!(
            "only {} finished in round {round}",
            finished
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" and ")
        ))),
    }
}

fn continue_round(
    round: i32,
    replies: [RoundReply; 3],
) -> Result<Step<3, SealedResult>, SearchError> {
    let [r0, r1, r2] = replies;
    let take = |party: usize, reply: RoundReply| {
        reply.message.ok_or_else(|| {
            SearchError::Protocol(format!(
                "{} sent no message in round {round} and did not finish",
                PartyIndex::ALL[party]
            ))
        })
    };
    Ok(Step::Relay([take(0, r0)?, take(1, r1)?, take(2, r2)?]))
}

fn finish_round(round: i32, replies: [RoundReply; 3]) -> Result<SealedResult, SearchError> {
    let mut sealed_outputs: [Vec<u8>; 3] = Default::default();
    let mut disclosed = Vec::with_capacity(3);
    for ((&party, reply), sealed) in PartyIndex::ALL.iter().zip(replies).zip(&mut sealed_outputs) {
        *sealed = reply.sealed_output.ok_or_else(|| {
            SearchError::Protocol(format!(
                "{party} finished in round {round} without its sealed output"
            ))
        })?;
        disclosed.push(reply.disclosed_unique);
    }
    if disclosed.windows(2).any(|w| w[0] != w[1]) {
        return Err(SearchError::Protocol(
            "the parties disclose different uniqueness bits".into(),
        ));
    }
    Ok(SealedResult {
        sealed_outputs,
        disclosed_unique: disclosed[0],
    })
}

/// One search as the round driver runs it.
struct Search<'a> {
    request: &'a SearchRequest,
    timeout: Duration,
}

impl Search<'_> {
    async fn start_at(
        &self,
        party: PartyIndex,
        client: &Client,
    ) -> Result<StartReply, SearchError> {
        let session: &[u8] = &self.request.session;
        let probe: &[u8] = &self.request.probes[party.as_usize()];
        let sql = "SELECT (r).entries, (r).set_digest, (r).message \
                   FROM (SELECT privmatch.iris_search_start($1, $2) AS r OFFSET 0) AS s";
        let row = call_with_timeout::<_, SearchError>(
            party,
            client,
            "iris_search_start",
            self.timeout,
            client.query_one(sql, &[&session, &probe]),
        )
        .await?;
        let columns = || {
            Ok((
                column(party, &row, 0)?.unwrap_or(-1),
                column(party, &row, 1)?.unwrap_or_default(),
                column::<Vec<u8>>(party, &row, 2)?,
            ))
        };
        let (entries, set_digest, message) = columns().map_err(SearchError::Party)?;
        Ok(StartReply {
            entries,
            set_digest,
            message: message.ok_or_else(|| {
                SearchError::Protocol(format!("{party} started without a first message"))
            })?,
        })
    }
}

impl Session<3> for Search<'_> {
    type Output = (SealedResult, SearchStats, Vec<u8>);
    type Error = SearchError;
    const ABORT_SQL: &'static str = "SELECT privmatch.iris_search_abort($1)";

    fn id(&self) -> &SessionId {
        &self.request.session
    }

    async fn drive(&self, clients: [&Client; 3]) -> Result<Self::Output, SearchError> {
        let started = std::time::Instant::now();
        let starts = at_each(clients, |party, client| self.start_at(party, client)).await?;
        // With the per-round lines of the relay: where a search's time goes (times only).
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            "iris_search_start at the three parties"
        );
        check_same_set(&starts)?;
        let entries = starts[0].entries;
        let set_digest = starts[0].set_digest.clone();
        let first = starts.map(|s| s.message);
        let mut traffic = Traffic::new();
        let result = relay_ring(self, clients, 0..MAX_ROUNDS, first, &mut traffic).await?;
        let stats = SearchStats {
            entries,
            rounds: traffic.rounds,
            bytes_sent: traffic.bytes_sent,
            micros: 0,
            batch: 1,
        };
        Ok((result, stats, set_digest))
    }
}

impl Rounds<3> for Search<'_> {
    type Reply = RoundReply;
    type Last = SealedResult;

    /// Called in the select list, not in `FROM`: a set-returning function in `FROM` is a
    /// function scan, which copies its rows into a tuplestore that spills to a temporary
    /// file beyond `work_mem` (4 MB by default), and round messages are tens of MB. Measured
    /// at N = 100,000 with 31 rotations: about half of the searching backends' CPU went to
    /// writing and reading back those files. `OFFSET 0` keeps the call in the subquery, so
    /// it runs once per round rather than once per selected column.
    const ROUND_SQL: &'static str =
        "SELECT (r).message, (r).finished, (r).sealed_output, (r).disclosed_unique \
         FROM (SELECT privmatch.iris_search_round($1, $2, $3) AS r OFFSET 0) AS s";
    const ROUND_FUNCTION: &'static str = "iris_search_round";

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn reply(&self, party: PartyIndex, _round: i32, row: &Row) -> Result<RoundReply, SearchError> {
        let reply = || {
            Ok(RoundReply {
                message: column(party, row, 0)?,
                finished: column(party, row, 1)?.unwrap_or(false),
                sealed_output: column(party, row, 2)?,
                disclosed_unique: column(party, row, 3)?,
            })
        };
        reply().map_err(SearchError::Party)
    }

    fn step(
        &self,
        round: i32,
        replies: [RoundReply; 3],
    ) -> Result<Step<3, SealedResult>, SearchError> {
        classify_round(round, replies)
    }

    fn route(&self, outbound: [Vec<u8>; 3]) -> [Vec<u8>; 3] {
        route(outbound)
    }
}

impl RingRounds<3> for Search<'_> {
    fn ring_reply(
        &self,
        party: PartyIndex,
        round: i32,
        reply: RoundReply,
    ) -> Result<RingReply<RoundReply>, SearchError> {
        if reply.finished {
            return Ok(RingReply::Finished(reply));
        }
        reply.message.map(RingReply::Relay).ok_or_else(|| {
            SearchError::Protocol(format!(
                "{party} sent no message in round {round} and did not finish"
            ))
        })
    }
}

/// Runs one search session on connections the caller supplies (indexed by party; they may be
/// inside a transaction). On failure the session is aborted at the three parties through the
/// pools of `parties`; the caller decides what to do with its connections.
pub async fn run_search_on(
    clients: [&Client; 3],
    parties: &Parties,
    request: &SearchRequest,
    timeout: Duration,
) -> Result<SearchOutcome, SearchError> {
    let search = Search { request, timeout };
    let ((result, stats, digest), elapsed) = run_on(clients, parties, &search).await?;
    Ok(outcome(result, stats, digest, elapsed))
}

/// Runs one search session on pooled connections. Connections go back to the pools only
/// after a successful search (after a failure one may still be busy or broken).
pub async fn run_search(
    parties: &Parties,
    request: &SearchRequest,
    timeout: Duration,
) -> Result<SearchOutcome, SearchError> {
    let search = Search { request, timeout };
    let ((result, stats, digest), elapsed) = run_pooled(parties, &search).await?;
    Ok(outcome(result, stats, digest, elapsed))
}

fn outcome(
    sealed: SealedResult,
    stats: SearchStats,
    set_digest: Vec<u8>,
    elapsed: Duration,
) -> SearchOutcome {
    SearchOutcome {
        stats: SearchStats {
            micros: elapsed.as_micros() as u64,
            ..stats
        },
        set_digest,
        sealed_outputs: sealed.sealed_outputs,
        disclosed_unique: sealed.disclosed_unique,
    }
}

/// Retries `attempt` on `policy` while the parties hold different template sets, and reports
/// the number of attempts in the final mismatch error. Every attempt must use fresh session
/// ids (and so freshly sealed probes).
pub async fn retry_on_set_mismatch<T, F, Fut>(
    policy: &RetryPolicy,
    attempt: F,
) -> Result<T, SearchError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SearchError>>,
{
    let (result, attempts) =
        with_retry(policy, |e| matches!(e, SearchError::SetsDiffer(_)), attempt).await;
    result.map_err(|e| match e {
        SearchError::SetsDiffer(mismatch) => SearchError::SetsDiffer(SetMismatch {
            attempts,
            ..mismatch
        }),
        other => other,
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    fn reply(message: Option<&[u8]>, finished: bool) -> RoundReply {
        RoundReply {
            message: message.map(<[u8]>::to_vec),
            finished,
            ..RoundReply::default()
        }
    }

    fn finished(sealed: u8, disclosed: Option<bool>) -> RoundReply {
        RoundReply {
            finished: true,
            sealed_output: Some(vec![sealed; 1100]),
            disclosed_unique: disclosed,
            ..RoundReply::default()
        }
    }

    #[test]
    fn party_i_receives_the_message_of_party_i_minus_1() {
        let inbound = route([b"from0".to_vec(), b"from1".to_vec(), b"from2".to_vec()]);
        assert_eq!(inbound[0], b"from2");
        assert_eq!(inbound[1], b"from0");
        assert_eq!(inbound[2], b"from1");
    }

    #[test]
    fn rounds_continue_finish_or_fail() {
        let step = classify_round(
            0,
            [
                reply(Some(b"a"), false),
                reply(Some(b"b"), false),
                reply(Some(b"c"), false),
            ],
        );
        assert!(matches!(step, Ok(Step::Relay(m)) if m[2] == b"c"));
        let missing = classify_round(
            4,
            [
                reply(Some(b"a"), false),
                reply(None, false),
                reply(Some(b"c"), false),
            ],
        );
        assert!(
            matches!(missing, Err(SearchError::Protocol(m)) if m.contains("P1") && m.contains("round 4"))
        );
        let partial = classify_round(
            21,
            [
                finished(0, None),
                reply(Some(b"b"), false),
                finished(2, None),
            ],
        );
        assert!(matches!(partial, Err(SearchError::Protocol(m)) if m.contains("P0 and P2")));
    }

    #[test]
    fn finished_rounds_relay_the_sealed_outputs_unread() {
        let done = classify_round(
            21,
            [finished(0, None), finished(1, None), finished(2, None)],
        );
        assert_eq!(
            done.ok(),
            Some(Step::Finished(SealedResult {
                sealed_outputs: [vec![0; 1100], vec![1; 1100], vec![2; 1100]],
                disclosed_unique: None,
            }))
        );
        let unsealed = classify_round(
            38,
            [
                finished(0, None),
                RoundReply {
                    sealed_output: None,
                    ..finished(1, None)
                },
                finished(2, None),
            ],
        );
        assert!(
            matches!(unsealed, Err(SearchError::Protocol(m)) if m.contains("P1") && m.contains("sealed output"))
        );
        // enroll-if-unique: the disclosed bits must agree.
        let disclosed = classify_round(
            38,
            [
                finished(0, Some(false)),
                finished(1, Some(false)),
                finished(2, Some(false)),
            ],
        );
        assert!(matches!(
            disclosed,
            Ok(Step::Finished(SealedResult {
                disclosed_unique: Some(false),
                ..
            }))
        ));
        let split = classify_round(
            38,
            [
                finished(0, Some(true)),
                finished(1, Some(false)),
                finished(2, Some(true)),
            ],
        );
        assert!(matches!(split, Err(SearchError::Protocol(_))));
        let half = classify_round(
            38,
            [
                finished(0, Some(true)),
                finished(1, None),
                finished(2, Some(true)),
            ],
        );
        assert!(matches!(half, Err(SearchError::Protocol(_))));
    }

    fn start(entries: i64, digest: u8) -> StartReply {
        StartReply {
            entries,
            set_digest: vec![digest; SET_DIGEST_LEN],
            message: Vec::new(),
        }
    }

    #[test]
    fn template_sets_must_agree() {
        assert!(check_same_set(&[start(5, 1), start(5, 1), start(5, 1)]).is_ok());
        let err = check_same_set(&[start(5, 1), start(4, 1), start(5, 1)]);
        assert!(matches!(
            err,
            Err(SearchError::SetsDiffer(SetMismatch {
                entries: [5, 4, 5],
                same_entries_other_keys: false,
                ..
            }))
        ));
        let err = check_same_set(&[start(5, 1), start(5, 2), start(5, 1)]);
        assert!(matches!(
            err,
            Err(SearchError::SetsDiffer(SetMismatch {
                same_entries_other_keys: true,
                diverging: Some(p),
                ..
            })) if p == PartyIndex::ALL[1]
        ));
        let message = check_same_set(&[start(5, 1), start(5, 1), start(4, 3)])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            message.contains("P2's set diverges") && message.contains("privmatch iris audit"),
            "{message}"
        );
        assert!(matches!(
            check_same_set(&[start(5, 1), start(5, 2), start(5, 3)]),
            Err(SearchError::SetsDiffer(SetMismatch {
                diverging: None,
                ..
            }))
        ));
        let mut short = start(5, 1);
        short.set_digest.pop();
        assert!(matches!(
            check_same_set(&[start(5, 1), short, start(5, 1)]),
            Err(SearchError::Protocol(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_only_set_mismatches_and_counts_attempts() {
        let policy = RetryPolicy {
            first_delay: Duration::from_millis(10),
            total: Duration::from_millis(30),
        };
        let mismatch = || {
            SearchError::SetsDiffer(SetMismatch {
                entries: [1, 2, 1],
                same_entries_other_keys: false,
                diverging: Some(PartyIndex::ALL[1]),
                attempts: 1,
            })
        };
        let mut calls = 0;
        let result: Result<(), _> = retry_on_set_mismatch(&policy, || {
            calls += 1;
            let e = mismatch();
            async move { Err(e) }
        })
        .await;
        assert_eq!(calls, 3);
        let message = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("in 3 attempts"), "{message}");
        assert!(message.contains("different template sets"));
        let mut calls = 0;
        let result = retry_on_set_mismatch(&policy, || {
            calls += 1;
            let outcome = if calls < 2 {
                Err(mismatch())
            } else {
                Ok(calls)
            };
            async move { outcome }
        })
        .await;
        assert_eq!(result.ok(), Some(2));
        let mut calls = 0;
        let result: Result<(), _> = retry_on_set_mismatch(&policy, || {
            calls += 1;
            async { Err(SearchError::Protocol("x".into())) }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 1);
    }
}
