//! The iris search round driver: runs one search session (one probe, one eye) across the three
//! parties by calling their SQL functions and relaying the sealed round messages.
//!
//! Protocol, as the parties expose it (schema `privmatch`):
//!
//! 1. `iris_search_start(session, probe, mode, max_rotation, threshold)` at the three parties
//!    in parallel, each with its own sealed probe. Each answers the number of templates it
//!    searches, a digest of the set of (subject, eye) keys, and its first outbound message.
//!    The three must search the same set; if they do not (an enrolment or deletion is being
//!    committed, or awaits recovery) the session is aborted and the caller retries with a
//!    fresh session id ([`with_retry`], [`retry_on_set_mismatch`]).
//! 2. Round k = 0, 1, 2, …: `iris_search_round(session, k, message)` at the three parties in
//!    parallel. Party i receives what party i−1 sent ([`route`]) and answers its next message
//!    (to party i+1) or `finished` with the result. All three finish in the same round and
//!    must report the same result ([`classify_round`]).
//! 3. On any error or timeout: `iris_search_abort(session)` at all three (best effort) and a
//!    [`SearchError`] naming the party (and SQLSTATE).
//!
//! The session id is bound into the sealed probes, so every attempt needs fresh sealed probes
//! and a fresh id; whoever seals (the client) draws the id ([`new_session_id`]).
//!
//! [`run_search`] uses pooled connections; [`run_search_on`] runs on connections the caller
//! supplies (e.g. inside a distributed transaction, for enrol-if-unique). Both count rounds
//! and the bytes each party emitted, for the benchmark.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::future::join_all;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::template::MAX_ROTATION;
use privmatch_core::mpc::compare::Threshold;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SESSION_ID_LEN;
use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use crate::parties::{all_answers, call_with_timeout, Parties, PartyError, TimedCallError};

/// A search session id (16 random bytes, fresh for every attempt).
pub type SessionId = [u8; SESSION_ID_LEN];

/// The default match threshold (fractional Hamming distance ratio).
pub const DEFAULT_THRESHOLD: f64 = 0.345;

/// The default per-call timeout of the party functions.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// More rounds than any search needs (uniqueness over 2^64 comparisons needs 81): a party
/// that never finishes is a protocol error, not an endless loop.
const MAX_ROUNDS: i32 = 256;

/// Length of the template-set digest a party reports at start.
const SET_DIGEST_LEN: usize = 32;

/// How long the best-effort abort waits for each party.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a search reveals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    /// Which enrolled subjects (of the probe's eye) match.
    #[default]
    Identify,
    /// Only whether any enrolled template matches.
    Uniqueness,
}

impl SearchMode {
    /// The name the parties' SQL functions take.
    pub fn as_str(self) -> &'static str {
        match self {
            SearchMode::Identify => "identify",
            SearchMode::Uniqueness => "uniqueness",
        }
    }
}

/// The parameters of one search, the same at the three parties.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchParams {
    /// Identification or uniqueness.
    pub mode: SearchMode,
    /// Rotations −max..=max columns (0..=15; 15 is the deployed 31 rotations).
    pub max_rotation: i32,
    /// Match when the fractional Hamming distance is below this ratio.
    pub threshold: f64,
}

impl SearchParams {
    /// Checks the ranges: max_rotation 0..=15, threshold in (0, 0.5) with at most four decimals.
    pub fn validate(&self) -> Result<(), String> {
        if !(0..=MAX_ROTATION).contains(&self.max_rotation) {
            return Err(format!(
                "max_rotation must be between 0 and {MAX_ROTATION}, got {}",
                self.max_rotation
            ));
        }
        if !(self.threshold > 0.0 && self.threshold < 0.5) {
            return Err(format!(
                "threshold must be a ratio strictly between 0 and 0.5, got {}",
                self.threshold
            ));
        }
        Threshold::from_ratio(self.threshold)
            .map(|_| ())
            .map_err(|_| format!("threshold {} has more than four decimals", self.threshold))
    }

    /// The threshold as the exact fraction numerator / 10,000 (validated parameters only).
    pub fn threshold_ten_thousandths(&self) -> Option<i64> {
        Threshold::from_ratio(self.threshold)
            .ok()
            .map(|t| t.numerator())
    }
}

/// One search session: its id, the three sealed probes (indexed by party) and the parameters.
#[derive(Clone, Debug)]
pub struct SearchRequest {
    /// The session id the probes were sealed for.
    pub session: SessionId,
    /// The sealed probe of each party.
    pub probes: [Vec<u8>; 3],
    /// Mode, rotations, threshold.
    pub params: SearchParams,
}

/// The result the three parties agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchResult {
    /// The matching subjects of the probe's eye, sorted.
    Identify(Vec<String>),
    /// True when no enrolled template matched.
    Unique(bool),
}

/// Figures of one search, for reports and the benchmark.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchStats {
    /// Templates searched (the same at every party).
    pub entries: i64,
    /// Round calls made per party (= messages each party emitted).
    pub rounds: u32,
    /// Bytes of the messages each party emitted, by party.
    pub bytes_sent: [u64; 3],
    /// Wall time from start to the last round, in microseconds.
    pub micros: u64,
}

impl SearchStats {
    /// Wall time in seconds.
    pub fn seconds(&self) -> f64 {
        self.micros as f64 / 1e6
    }
}

/// A finished search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchOutcome {
    /// What the parties answered.
    pub result: SearchResult,
    /// Rounds, bytes, time.
    pub stats: SearchStats,
}

/// The parties started a search over different template sets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the parties hold different template sets (entries P0 = {}, P1 = {}, P2 = {}{}){}: an enrolment or deletion is being committed or awaits recovery; try again shortly (`privmatch recover` finishes transactions left in doubt)",
    entries[0], entries[1], entries[2],
    if *same_entries_other_keys { ", with different keys" } else { "" },
    if *attempts > 1 { format!(" in {attempts} attempts") } else { String::new() }
)]
pub struct SetMismatch {
    /// Entries each party reported.
    pub entries: [i64; 3],
    /// The counts agree but the key digests do not.
    pub same_entries_other_keys: bool,
    /// Attempts made (1 until a retry loop gives up).
    pub attempts: u32,
}

/// Why a search failed. The session was aborted at the three parties (best effort).
#[derive(Debug, thiserror::Error)]
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
}

/// A fresh random session id from the operating system.
pub fn new_session_id() -> SessionId {
    let mut id = [0u8; SESSION_ID_LEN];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut id);
    id
}

/// What a party answered to `iris_search_start`.
#[derive(Clone, Debug)]
struct StartReply {
    entries: i64,
    set_digest: Vec<u8>,
    message: Vec<u8>,
}

/// What a party answered to `iris_search_round`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundReply {
    /// The next message (to party i+1), unless finished.
    pub message: Option<Vec<u8>>,
    /// True in the last round.
    pub finished: bool,
    /// The uniqueness result, when finished in uniqueness mode.
    pub is_unique: Option<bool>,
    /// The matching subjects, when finished in identify mode.
    pub subjects: Option<Vec<String>>,
}

/// What a round means for the driver.
#[derive(Debug, PartialEq, Eq)]
pub enum RoundStep {
    /// Relay these messages (indexed by sender) and run the next round.
    Continue([Vec<u8>; 3]),
    /// The search is over.
    Finished(SearchResult),
}

/// Routes the messages of a round (indexed by sender): party i receives party i−1's.
pub fn route(outbound: [Vec<u8>; 3]) -> [Vec<u8>; 3] {
    let [m0, m1, m2] = outbound;
    [m2, m0, m1]
}

/// Checks that the three parties search the same template set.
fn check_same_set(starts: &[StartReply; 3]) -> Result<(), SearchError> {
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
    Err(SearchError::SetsDiffer(SetMismatch {
        entries,
        same_entries_other_keys: same_entries,
        attempts: 1,
    }))
}

/// Interprets the three answers of round `round`.
pub fn classify_round(
    mode: SearchMode,
    round: i32,
    replies: [RoundReply; 3],
) -> Result<RoundStep, SearchError> {
    let finished: Vec<PartyIndex> = PartyIndex::ALL
        .iter()
        .zip(&replies)
        .filter(|(_, r)| r.finished)
        .map(|(&p, _)| p)
        .collect();
    match finished.len() {
        0 => continue_round(round, replies),
        3 => finish_round(mode, round, replies).map(RoundStep::Finished),
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

fn continue_round(round: i32, replies: [RoundReply; 3]) -> Result<RoundStep, SearchError> {
    let [r0, r1, r2] = replies;
    let take = |party: usize, reply: RoundReply| {
        reply.message.ok_or_else(|| {
            SearchError::Protocol(format!(
                "{} sent no message in round {round} and did not finish",
                PartyIndex::ALL[party]
            ))
        })
    };
    Ok(RoundStep::Continue([
        take(0, r0)?,
        take(1, r1)?,
        take(2, r2)?,
    ]))
}

fn finish_round(
    mode: SearchMode,
    round: i32,
    replies: [RoundReply; 3],
) -> Result<SearchResult, SearchError> {
    let missing = |party: PartyIndex, what: &str| {
        SearchError::Protocol(format!("{party} finished in round {round} without {what}"))
    };
    let mut results = Vec::with_capacity(3);
    for (&party, reply) in PartyIndex::ALL.iter().zip(replies) {
        results.push(match mode {
            SearchMode::Identify => {
                let mut subjects = reply
                    .subjects
                    .ok_or_else(|| missing(party, "the matching subjects"))?;
                subjects.sort();
                SearchResult::Identify(subjects)
            }
            SearchMode::Uniqueness => SearchResult::Unique(
                reply
                    .is_unique
                    .ok_or_else(|| missing(party, "the uniqueness result"))?,
            ),
        });
    }
    if results.windows(2).any(|w| w[0] != w[1]) {
        return Err(SearchError::Protocol(
            "the parties report different results".into(),
        ));
    }
    Ok(results.swap_remove(0))
}

impl From<TimedCallError> for SearchError {
    fn from(err: TimedCallError) -> Self {
        match err {
            TimedCallError::Failed(e) => SearchError::Party(e),
            TimedCallError::TimedOut(e) => SearchError::Timeout(e),
        }
    }
}

/// The answers of a parallel step, or its most telling error ([`all_answers`]).
fn first_error<T>(results: Vec<Result<T, SearchError>>) -> Result<[T; 3], SearchError> {
    all_answers(
        results,
        |e| matches!(e, SearchError::Timeout(_)),
        || SearchError::Protocol("expected three answers".into()),
    )
}

async fn start_at(
    party: PartyIndex,
    client: &Client,
    request: &SearchRequest,
    timeout: Duration,
) -> Result<StartReply, SearchError> {
    let session: &[u8] = &request.session;
    let probe: &[u8] = &request.probes[party.as_usize()];
    let params = &request.params;
    let mode = params.mode.as_str();
    let sql =
        "SELECT entries, set_digest, message FROM privmatch.iris_search_start($1, $2, $3, $4, $5)";
    let row = call_with_timeout(
        party,
        client,
        "iris_search_start",
        timeout,
        client.query_one(
            sql,
            &[
                &session,
                &probe,
                &mode,
                &params.max_rotation,
                &params.threshold,
            ],
        ),
    )
    .await?;
    let field = |e: tokio_postgres::Error| SearchError::Party(PartyError::from_pg(party, &e));
    Ok(StartReply {
        entries: row
            .try_get::<_, Option<i64>>(0)
            .map_err(field)?
            .unwrap_or(-1),
        set_digest: row
            .try_get::<_, Option<Vec<u8>>>(1)
            .map_err(field)?
            .unwrap_or_default(),
        message: row
            .try_get::<_, Option<Vec<u8>>>(2)
            .map_err(field)?
            .ok_or_else(|| {
                SearchError::Protocol(format!("{party} started without a first message"))
            })?,
    })
}

async fn round_at(
    party: PartyIndex,
    client: &Client,
    session: &SessionId,
    round: i32,
    inbound: &[u8],
    timeout: Duration,
) -> Result<RoundReply, SearchError> {
    let session: &[u8] = session;
    let sql =
        "SELECT message, finished, is_unique, subjects FROM privmatch.iris_search_round($1, $2, $3)";
    let what = format!("iris_search_round (round {round})");
    let row = call_with_timeout(
        party,
        client,
        &what,
        timeout,
        client.query_one(sql, &[&session, &round, &inbound]),
    )
    .await?;
    let field = |e: tokio_postgres::Error| SearchError::Party(PartyError::from_pg(party, &e));
    Ok(RoundReply {
        message: row.try_get(0).map_err(field)?,
        finished: row
            .try_get::<_, Option<bool>>(1)
            .map_err(field)?
            .unwrap_or(false),
        is_unique: row.try_get(2).map_err(field)?,
        subjects: row.try_get(3).map_err(field)?,
    })
}

/// Calls `iris_search_abort` at the three parties on pooled connections (the search session
/// lives in the party's engine, not in a transaction), ignoring every error.
pub async fn abort_everywhere(parties: &Parties, session: &SessionId) {
    join_all(parties.all().iter().map(|party| async move {
        let attempt = async {
            let client = party.connect().await.ok()?;
            let id: &[u8] = session;
            client
                .query_one("SELECT privmatch.iris_search_abort($1)", &[&id])
                .await
                .ok()?;
            party.give_back(client).await;
            Some(())
        };
        if tokio::time::timeout(ABORT_TIMEOUT, attempt)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            tracing::debug!(party = %party.index, "best-effort abort of a search session failed");
        }
    }))
    .await;
}

/// The rounds of one search on three connections, without the abort on failure.
async fn drive(
    clients: [&Client; 3],
    request: &SearchRequest,
    timeout: Duration,
    stats: &mut SearchStats,
) -> Result<SearchResult, SearchError> {
    let starts = join_all(
        PartyIndex::ALL
            .iter()
            .zip(clients)
            .map(|(&p, c)| start_at(p, c, request, timeout)),
    )
    .await;
    let starts = first_error(starts)?;
    check_same_set(&starts)?;
    stats.entries = starts[0].entries;
    let [s0, s1, s2] = starts;
    let mut outbound = [s0.message, s1.message, s2.message];
    for round in 0..MAX_ROUNDS {
        for (sent, message) in stats.bytes_sent.iter_mut().zip(&outbound) {
            *sent += message.len() as u64;
        }
        let inbound = route(outbound);
        let replies = join_all(
            PartyIndex::ALL
                .iter()
                .zip(clients)
                .zip(&inbound)
                .map(|((&p, c), m)| round_at(p, c, &request.session, round, m, timeout)),
        )
        .await;
        stats.rounds += 1;
        match classify_round(request.params.mode, round, first_error(replies)?)? {
            RoundStep::Continue(next) => outbound = next,
            RoundStep::Finished(result) => return Ok(result),
        }
    }
    Err(SearchError::Protocol(format!(
        "the parties did not finish within {MAX_ROUNDS} rounds"
    )))
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
    request.params.validate().map_err(SearchError::Invalid)?;
    let started = Instant::now();
    let mut stats = SearchStats::default();
    match drive(clients, request, timeout, &mut stats).await {
        Ok(result) => {
            stats.micros = started.elapsed().as_micros() as u64;
            Ok(SearchOutcome { result, stats })
        }
        Err(err) => {
            abort_everywhere(parties, &request.session).await;
            Err(err)
        }
    }
}

/// One connection to each party from the pools (returned to the pools on failure).
pub async fn connect_all(parties: &Parties) -> Result<[Client; 3], PartyError> {
    let connected = join_all(parties.all().iter().map(|p| p.connect())).await;
    let mut clients = Vec::with_capacity(3);
    let mut error = None;
    for result in connected {
        match result {
            Ok(client) => clients.push(client),
            Err(e) => error = error.or(Some(e)),
        }
    }
    if let Some(err) = error {
        for (party, client) in parties.all().iter().zip(clients) {
            party.give_back(client).await;
        }
        return Err(err);
    }
    clients.try_into().map_err(|_| PartyError {
        party: PartyIndex::ALL[0],
        sqlstate: None,
        message: "internal error: expected three connections".into(),
    })
}

/// Runs one search session on pooled connections. Connections go back to the pools only
/// after a successful search (after a failure one may still be busy or broken).
pub async fn run_search(
    parties: &Parties,
    request: &SearchRequest,
    timeout: Duration,
) -> Result<SearchOutcome, SearchError> {
    request.params.validate().map_err(SearchError::Invalid)?;
    let clients = connect_all(parties).await.map_err(SearchError::Party)?;
    let [c0, c1, c2] = &clients;
    let outcome = run_search_on([c0, c1, c2], parties, request, timeout).await;
    if outcome.is_ok() {
        for (party, client) in parties.all().iter().zip(clients) {
            party.give_back(client).await;
        }
    }
    outcome
}

/// The back-off schedule of retries after a template-set mismatch: `first_delay`, doubling,
/// until `total` has been waited in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first wait.
    pub first_delay: Duration,
    /// The total waiting time before giving up.
    pub total: Duration,
}

impl Default for RetryPolicy {
    /// 100 ms, doubling, 10 s in all.
    fn default() -> Self {
        RetryPolicy {
            first_delay: Duration::from_millis(100),
            total: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The waits before the 2nd, 3rd, … attempt; the last one is shortened to end at `total`.
    pub fn delays(&self) -> Vec<Duration> {
        let mut delays = Vec::new();
        let mut waited = Duration::ZERO;
        let mut next = self.first_delay;
        while waited < self.total && !next.is_zero() {
            let delay = next.min(self.total - waited);
            delays.push(delay);
            waited += delay;
            next = next.saturating_mul(2);
        }
        delays
    }
}

/// Runs `attempt` until it succeeds, fails with an error `retryable` refuses, or the back-off
/// schedule is used up. Every attempt must use fresh session ids (and so freshly sealed
/// probes). Returns the last result and the number of attempts.
pub async fn with_retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    retryable: impl Fn(&E) -> bool,
    mut attempt: F,
) -> (Result<T, E>, u32)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut delays = policy.delays().into_iter();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let result = attempt().await;
        match (&result, delays.next()) {
            (Err(e), Some(delay)) if retryable(e) => {
                tracing::info!(
                    attempts,
                    delay_ms = delay.as_millis() as u64,
                    "the parties hold different template sets; retrying with a new session"
                );
                tokio::time::sleep(delay).await;
            }
            _ => return (result, attempts),
        }
    }
}

/// [`with_retry`] for searches: retries while the parties hold different template sets and
/// reports the number of attempts in the final mismatch error.
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

/// How the results of the two eyes of one probe combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum EyePolicy {
    /// Identify: a subject matched on either eye. Uniqueness: unique only if both eyes are.
    #[default]
    Or,
    /// Identify: only subjects matched on both eyes. Uniqueness: not supported.
    And,
}

impl EyePolicy {
    /// `"or"` or `"and"`.
    pub fn as_str(self) -> &'static str {
        match self {
            EyePolicy::Or => "or",
            EyePolicy::And => "and",
        }
    }
}

/// One matching enrolled template.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Match {
    /// Subject id.
    pub subject: String,
    /// `"left"` or `"right"`.
    pub eye: String,
}

/// Combines per-eye identification results into the sorted list of matches (by subject, then
/// eye). With one eye the policy does not matter; with two, `or` is the union and `and` keeps
/// only subjects matched on both eyes (listed with both).
pub fn combine_matches(per_eye: &[(Eye, Vec<String>)], policy: EyePolicy) -> Vec<Match> {
    let matched_on_all = |subject: &String| per_eye.iter().all(|(_, list)| list.contains(subject));
    let mut out: Vec<Match> = per_eye
        .iter()
        .flat_map(|(eye, subjects)| {
            subjects
                .iter()
                .filter(|s| policy == EyePolicy::Or || matched_on_all(s))
                .map(move |s| Match {
                    subject: s.clone(),
                    eye: eye.as_str().to_owned(),
                })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Combines per-eye uniqueness results: with policy `or` (a match on either eye makes the
/// probe not unique) the probe is unique iff every eye is. Policy `and` over two eyes is
/// refused: it needs per-subject matching inside the MPC, which the uniqueness output (one
/// bit per eye) cannot give.
pub fn combine_uniqueness(per_eye: &[(Eye, bool)], policy: EyePolicy) -> Result<bool, String> {
    if policy == EyePolicy::And && per_eye.len() > 1 {
        return Err(UNIQUENESS_AND_UNSUPPORTED.into());
    }
    Ok(per_eye.iter().all(|(_, unique)| *unique))
}

/// Why uniqueness with policy `and` over both eyes is refused.
pub const UNIQUENESS_AND_UNSUPPORTED: &str = "uniqueness with eye policy \"and\" over both eyes is not supported: it needs per-subject matching inside the MPC (the uniqueness search reveals one bit per eye); use policy \"or\" (unique only if neither eye matches) or identify mode";

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

    fn finished_identify(subjects: &[&str]) -> RoundReply {
        RoundReply {
            finished: true,
            subjects: Some(subjects.iter().map(|s| (*s).to_owned()).collect()),
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
            SearchMode::Identify,
            0,
            [
                reply(Some(b"a"), false),
                reply(Some(b"b"), false),
                reply(Some(b"c"), false),
            ],
        );
        assert!(matches!(step, Ok(RoundStep::Continue(m)) if m[2] == b"c"));
        let missing = classify_round(
            SearchMode::Identify,
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
            SearchMode::Identify,
            21,
            [
                finished_identify(&[]),
                reply(Some(b"b"), false),
                finished_identify(&[]),
            ],
        );
        assert!(matches!(partial, Err(SearchError::Protocol(m)) if m.contains("P0 and P2")));
    }

    #[test]
    fn finished_results_must_agree() {
        let done = classify_round(
            SearchMode::Identify,
            21,
            [
                finished_identify(&["b", "a"]),
                finished_identify(&["a", "b"]),
                finished_identify(&["a", "b"]),
            ],
        );
        assert_eq!(
            done.ok(),
            Some(RoundStep::Finished(SearchResult::Identify(vec![
                "a".into(),
                "b".into()
            ])))
        );
        let differ = classify_round(
            SearchMode::Identify,
            21,
            [
                finished_identify(&["a"]),
                finished_identify(&["a", "b"]),
                finished_identify(&["a"]),
            ],
        );
        assert!(matches!(differ, Err(SearchError::Protocol(_))));
        let unique = |u: Option<bool>| RoundReply {
            finished: true,
            is_unique: u,
            ..RoundReply::default()
        };
        let ok = classify_round(
            SearchMode::Uniqueness,
            38,
            [
                unique(Some(false)),
                unique(Some(false)),
                unique(Some(false)),
            ],
        );
        assert_eq!(
            ok.ok(),
            Some(RoundStep::Finished(SearchResult::Unique(false)))
        );
        let split = classify_round(
            SearchMode::Uniqueness,
            38,
            [unique(Some(true)), unique(Some(false)), unique(Some(true))],
        );
        assert!(matches!(split, Err(SearchError::Protocol(_))));
        let null = classify_round(
            SearchMode::Uniqueness,
            38,
            [unique(Some(true)), unique(None), unique(Some(true))],
        );
        assert!(matches!(null, Err(SearchError::Protocol(m)) if m.contains("P1")));
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

    #[test]
    fn parameters_are_range_checked() {
        let ok = SearchParams {
            mode: SearchMode::Identify,
            max_rotation: 15,
            threshold: DEFAULT_THRESHOLD,
        };
        assert!(ok.validate().is_ok());
        assert_eq!(ok.threshold_ten_thousandths(), Some(3450));
        for (max_rotation, threshold) in
            [(16, 0.345), (-1, 0.345), (0, 0.5), (0, 0.0), (0, 0.34501)]
        {
            let bad = SearchParams {
                max_rotation,
                threshold,
                ..ok
            };
            assert!(bad.validate().is_err(), "{max_rotation} {threshold}");
        }
        assert!(SearchParams {
            threshold: f64::NAN,
            ..ok
        }
        .validate()
        .is_err());
    }

    #[test]
    fn backoff_doubles_and_stops_at_the_total() {
        let delays = RetryPolicy::default().delays();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 3700]);
        assert_eq!(delays.iter().sum::<Duration>(), Duration::from_secs(10));
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

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn eye_policies_combine_matches() {
        let per_eye = [
            (Eye::Left, names(&["bob", "alice"])),
            (Eye::Right, names(&["carol", "bob"])),
        ];
        let or: Vec<(String, String)> = combine_matches(&per_eye, EyePolicy::Or)
            .into_iter()
            .map(|m| (m.subject, m.eye))
            .collect();
        assert_eq!(
            or,
            vec![
                ("alice".into(), "left".into()),
                ("bob".into(), "left".into()),
                ("bob".into(), "right".into()),
                ("carol".into(), "right".into()),
            ]
        );
        let and: Vec<(String, String)> = combine_matches(&per_eye, EyePolicy::And)
            .into_iter()
            .map(|m| (m.subject, m.eye))
            .collect();
        assert_eq!(
            and,
            vec![
                ("bob".into(), "left".into()),
                ("bob".into(), "right".into())
            ]
        );
        let single = [(Eye::Right, names(&["x"]))];
        assert_eq!(combine_matches(&single, EyePolicy::And).len(), 1);
    }

    #[test]
    fn eye_policies_combine_uniqueness() {
        let both = [(Eye::Left, true), (Eye::Right, false)];
        assert_eq!(combine_uniqueness(&both, EyePolicy::Or), Ok(false));
        assert_eq!(
            combine_uniqueness(&[(Eye::Left, true), (Eye::Right, true)], EyePolicy::Or),
            Ok(true)
        );
        assert!(combine_uniqueness(&both, EyePolicy::And).is_err());
        assert_eq!(
            combine_uniqueness(&[(Eye::Left, true)], EyePolicy::And),
            Ok(true)
        );
    }
}
