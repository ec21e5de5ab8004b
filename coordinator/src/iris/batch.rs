//! Iris searches in batches (docs/protocols/iris.md §13.3): searches whose clients declared the
//! same mode, rotation range and eye run as one protocol session at the three parties
//! (`iris_batch_start`, `iris_batch_round`), on the round-driver skeleton of
//! [`crate::session::driver`], grouped by the generic [`crate::session::batcher`].
//!
//! A batch is one session of Bloemen et al., "Large-Scale MPC: Scaling Private Iris Code
//! Uniqueness Checks to Millions of Users" (ePrint 2024/705) with B probes: each party scans
//! its templates once with the probes' rotations as one block, and every round carries the
//! comparisons of all B probes, so the rounds' network delays and the scan's memory traffic
//! are paid once per batch instead of once per search. The batch id is drawn here; each
//! search keeps its own session id (bound into its sealed probes) and gets back only its own
//! outputs, sealed by each party to its own client. A probe a party refuses at start is
//! refused alone: its caller gets that party's error, the others their results.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use privmatch_core::iris::binding::envelope_hashes;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::params::SearchMode;
use privmatch_core::iris::service::{MAX_BATCH_COMPARISONS, MAX_BATCH_PROBES};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SessionId;
use rand::RngCore;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use crate::iris::driver::{
    check_same_set, route, SearchError, SearchOutcome, StartReply, MAX_ROUNDS,
};
use crate::parties::{column, Parties, PartyError};
use crate::session::batcher::{BatchPolicy, BatchRunner, Batcher};
use crate::session::driver::{
    at_each, call_with_timeout, relay_ring, run_on, run_pooled, RingReply, RingRounds, Rounds,
    Session, Step, Traffic,
};
use privmatch_api::iris::{SearchRequest, SearchStats};

/// What the searches of one batch share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IrisBatchKey {
    /// The eye of every probe.
    pub eye: Eye,
    /// Identification or uniqueness.
    pub mode: SearchMode,
    /// The rotation range, 0..=15.
    pub max_rotation: i32,
}

impl IrisBatchKey {
    /// Rotations per probe (2·max_rotation + 1).
    fn rotations(&self) -> usize {
        2 * self.max_rotation.max(0) as usize + 1
    }
}

/// What a party answered to `iris_batch_start`: as to a search start, with each probe's
/// refusal (SQLSTATE and message) where it refused one.
struct BatchStartReply {
    start: StartReply,
    refused: Vec<Option<(String, String)>>,
}

/// What a party answered to a batch round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchRoundReply {
    /// The next message (to party i+1), unless finished.
    pub message: Option<Vec<u8>>,
    /// True in the last round.
    pub finished: bool,
    /// Per probe, its output sealed to its client (None: refused at start), when finished.
    pub sealed_outputs: Option<Vec<Option<Vec<u8>>>>,
    /// Per probe, the disclosed uniqueness bit, when finished.
    pub disclosed_unique: Option<Vec<Option<bool>>>,
}

/// One batch as the round driver runs it.
struct Batch<'a> {
    id: SessionId,
    key: IrisBatchKey,
    members: &'a [SearchRequest],
    /// Empty for a batch of searches; for a batch of enrol-if-unique requests, each
    /// member's three sealed enrolment envelopes (docs/protocols/iris.md §13.4).
    enrolments: &'a [[Vec<u8>; 3]],
    /// h0 ‖ h1 ‖ h2 of each member's envelopes, hashed once for the three parties' starts.
    enrolment_hashes: Vec<Vec<u8>>,
    timeout: Duration,
}

/// The three parties' last answers of a batch.
struct BatchLast {
    sealed: [Vec<Option<Vec<u8>>>; 3],
    disclosed: [Vec<Option<bool>>; 3],
}

/// What a batch yields: per member its sealed outputs and disclosed bit, or a party's
/// refusal of its probe; and the batch's figures.
type BatchOutput = (Vec<Result<SearchOutcome, SearchError>>, SearchStats);

impl Batch<'_> {
    async fn start_at(
        &self,
        party: PartyIndex,
        client: &Client,
    ) -> Result<BatchStartReply, SearchError> {
        let id: &[u8] = &self.id;
        let sessions: Vec<&[u8]> = self.members.iter().map(|m| &m.session[..]).collect();
        let probes: Vec<&[u8]> = self
            .members
            .iter()
            .map(|m| m.probes[party.as_usize()].as_slice())
            .collect();
        let mode = self.key.mode.as_str();
        let eye = self.key.eye.as_str();
        let envelopes: Vec<&[u8]> = self
            .enrolments
            .iter()
            .map(|e| e[party.as_usize()].as_slice())
            .collect();
        let (function, sql, params): (_, _, Vec<&(dyn ToSql + Sync)>) =
            if self.enrolments.is_empty() {
                (
                    "iris_batch_start",
                    "SELECT (r).entries, (r).set_digest, (r).message, (r).refused_sqlstate, \
                     (r).refused \
                     FROM (SELECT privmatch.iris_batch_start($1, $2, $3, $4, $5, $6) AS r \
                           OFFSET 0) AS s",
                    vec![&id, &mode, &self.key.max_rotation, &eye, &sessions, &probes],
                )
            } else {
                (
                    "iris_batch_enroll_start",
                    "SELECT (r).entries, (r).set_digest, (r).message, (r).refused_sqlstate, \
                     (r).refused \
                     FROM (SELECT privmatch.iris_batch_enroll_start($1, $2, $3, $4, $5, $6, $7) \
                           AS r OFFSET 0) AS s",
                    vec![
                        &id,
                        &self.key.max_rotation,
                        &eye,
                        &sessions,
                        &probes,
                        &envelopes,
                        &self.enrolment_hashes,
                    ],
                )
            };
        let row = call_with_timeout::<_, SearchError>(
            party,
            client,
            function,
            self.timeout,
            client.query_one(sql, &params),
        )
        .await?;
        let columns = || {
            Ok((
                column(party, &row, 0)?.unwrap_or(-1),
                column(party, &row, 1)?.unwrap_or_default(),
                column::<Vec<u8>>(party, &row, 2)?,
                column::<Vec<Option<String>>>(party, &row, 3)?.unwrap_or_default(),
                column::<Vec<Option<String>>>(party, &row, 4)?.unwrap_or_default(),
            ))
        };
        let (entries, set_digest, message, states, messages) =
            columns().map_err(SearchError::Party)?;
        if states.len() != self.members.len() || messages.len() != self.members.len() {
            return Err(SearchError::Protocol(format!(
                "{party} answered {} refusals for a batch of {}",
                states.len(),
                self.members.len()
            )));
        }
        let refused = states
            .into_iter()
            .zip(messages)
            .map(|(state, message)| state.map(|s| (s, message.unwrap_or_default())))
            .collect();
        Ok(BatchStartReply {
            start: StartReply {
                entries,
                set_digest,
                message: message.ok_or_else(|| {
                    SearchError::Protocol(format!("{party} started without a first message"))
                })?,
            },
            refused,
        })
    }

    /// In an enrolment batch, the first request refused at some parties but not at all three,
    /// and the parties that refused it: its record's row is a zero share at those parties and
    /// its share at the others, so the later probes' comparisons with it are noise
    /// (docs/protocols/iris.md §13.4) and their answers void. A request refused at all three
    /// is a zero row everywhere, which matches nothing: it voids nothing.
    fn split_refusal(
        &self,
        refused: &[Vec<Option<(String, String)>>; 3],
    ) -> Option<(usize, String)> {
        if self.enrolments.is_empty() {
            return None;
        }
        first_split_refusal(refused, self.members.len())
    }

    /// Each member's outcome from the three parties' refusals and last answers.
    fn outcomes(
        &self,
        refused: &[Vec<Option<(String, String)>>; 3],
        last: BatchLast,
        stats: &SearchStats,
        set_digest: &[u8],
    ) -> Result<Vec<Result<SearchOutcome, SearchError>>, SearchError> {
        let n = self.members.len();
        for party in PartyIndex::ALL {
            let i = party.as_usize();
            if last.sealed[i].len() != n || last.disclosed[i].len() != n {
                return Err(SearchError::Protocol(format!(
                    "{party} finished a batch of {n} with {} outputs",
                    last.sealed[i].len()
                )));
            }
        }
        let void_after = self.split_refusal(refused);
        Ok((0..n)
            .map(|k| {
                if let Some((party, (sqlstate, message))) = PartyIndex::ALL
                    .iter()
                    .find_map(|&p| refused[p.as_usize()][k].clone().map(|r| (p, r)))
                {
                    return Err(SearchError::Party(PartyError {
                        party,
                        sqlstate: Some(sqlstate),
                        message,
                    }));
                }
                if let Some((at, parties)) = &void_after {
                    if k > *at {
                        return Err(SearchError::BatchVoid(parties.clone()));
                    }
                }
                let mut sealed_outputs: [Vec<u8>; 3] = Default::default();
                for (party, out) in PartyIndex::ALL.iter().zip(&mut sealed_outputs) {
                    *out = last.sealed[party.as_usize()][k].clone().ok_or_else(|| {
                        SearchError::Protocol(format!(
                            "{party} finished without the sealed output of an accepted probe"
                        ))
                    })?;
                }
                let disclosed = [0, 1, 2].map(|i| last.disclosed[i][k]);
                if disclosed.iter().any(|d| *d != disclosed[0]) {
                    return Err(SearchError::Protocol(
                        "the parties disclose different uniqueness bits".into(),
                    ));
                }
                Ok(SearchOutcome {
                    stats: stats.clone(),
                    set_digest: set_digest.to_vec(),
                    sealed_outputs,
                    disclosed_unique: disclosed[0],
                })
            })
            .collect())
    }
}

impl Session<3> for Batch<'_> {
    type Output = BatchOutput;
    type Error = SearchError;
    const ABORT_SQL: &'static str = "SELECT privmatch.iris_search_abort($1)";

    fn id(&self) -> &SessionId {
        &self.id
    }

    async fn drive(&self, clients: [&Client; 3]) -> Result<BatchOutput, SearchError> {
        let starts = at_each(clients, |party, client| self.start_at(party, client)).await?;
        let [s0, s1, s2] = starts;
        let refused = [s0.refused, s1.refused, s2.refused];
        let starts = [s0.start, s1.start, s2.start];
        check_same_set(&starts)?;
        let entries = starts[0].entries;
        let set_digest = starts[0].set_digest.clone();
        let first = starts.map(|s| s.message);
        let mut traffic = Traffic::new();
        let last = relay_ring(self, clients, 0..MAX_ROUNDS, first, &mut traffic).await?;
        let stats = SearchStats {
            entries,
            rounds: traffic.rounds,
            bytes_sent: traffic.bytes_sent,
            micros: 0,
            batch: self.members.len() as u32,
        };
        let outcomes = self.outcomes(&refused, last, &stats, &set_digest)?;
        Ok((outcomes, stats))
    }
}

impl Rounds<3> for Batch<'_> {
    type Reply = BatchRoundReply;
    type Last = BatchLast;

    /// In the select list for the reason given at the single search's `ROUND_SQL`.
    const ROUND_SQL: &'static str =
        "SELECT (r).message, (r).finished, (r).sealed_outputs, (r).disclosed_unique \
         FROM (SELECT privmatch.iris_batch_round($1, $2, $3) AS r OFFSET 0) AS s";
    const ROUND_FUNCTION: &'static str = "iris_batch_round";

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn reply(
        &self,
        party: PartyIndex,
        _round: i32,
        row: &Row,
    ) -> Result<BatchRoundReply, SearchError> {
        let reply = || {
            Ok(BatchRoundReply {
                message: column(party, row, 0)?,
                finished: column(party, row, 1)?.unwrap_or(false),
                sealed_outputs: column(party, row, 2)?,
                disclosed_unique: column(party, row, 3)?,
            })
        };
        reply().map_err(SearchError::Party)
    }

    fn step(
        &self,
        round: i32,
        replies: [BatchRoundReply; 3],
    ) -> Result<Step<3, BatchLast>, SearchError> {
        if replies.iter().all(|r| r.finished) {
            let [r0, r1, r2] = replies;
            let take =
                |party: usize, r: BatchRoundReply| match (r.sealed_outputs, r.disclosed_unique) {
                    (Some(s), Some(d)) => Ok((s, d)),
                    _ => Err(SearchError::Protocol(format!(
                        "{} finished round {round} without its outputs",
                        PartyIndex::ALL[party]
                    ))),
                };
            let (s0, d0) = take(0, r0)?;
            let (s1, d1) = take(1, r1)?;
            let (s2, d2) = take(2, r2)?;
            return Ok(Step::Finished(BatchLast {
                sealed: [s0, s1, s2],
                disclosed: [d0, d1, d2],
            }));
        }
        if replies.iter().any(|r| r.finished) {
            return Err(SearchError::Protocol(format!(
                "the parties did not all finish in round {round}"
            )));
        }
        let [r0, r1, r2] = replies;
        let take = |party: usize, r: BatchRoundReply| {
            r.message.ok_or_else(|| {
                SearchError::Protocol(format!(
                    "{} sent no message in round {round} and did not finish",
                    PartyIndex::ALL[party]
                ))
            })
        };
        Ok(Step::Relay([take(0, r0)?, take(1, r1)?, take(2, r2)?]))
    }

    fn route(&self, outbound: [Vec<u8>; 3]) -> [Vec<u8>; 3] {
        route(outbound)
    }
}

impl RingRounds<3> for Batch<'_> {
    fn ring_reply(
        &self,
        party: PartyIndex,
        round: i32,
        reply: BatchRoundReply,
    ) -> Result<RingReply<BatchRoundReply>, SearchError> {
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

/// Runs `members` as one batch on pooled connections; one result per member, in order. A
/// failure of the batch itself (a party unreachable, different template sets, a broken
/// round) is every member's error; a party's refusal of one probe is that member's alone.
pub async fn run_batch(
    parties: &Parties,
    key: IrisBatchKey,
    members: &[SearchRequest],
    timeout: Duration,
) -> Vec<Result<SearchOutcome, SearchError>> {
    let mut id = SessionId::default();
    rand::rngs::OsRng.fill_bytes(&mut id);
    let batch = Batch {
        id,
        key,
        members,
        enrolments: &[],
        enrolment_hashes: Vec::new(),
        timeout,
    };
    // Each search's own id beside its batch's: one search is followed from the client's log
    // to the batch's lines (which carry the batch id).
    for (k, m) in members.iter().enumerate() {
        tracing::info!(
            session = %hex::encode(m.session),
            batch = %hex::encode(id),
            at = k,
            "iris search in batch"
        );
    }
    match run_pooled(parties, &batch).await {
        Ok(((outcomes, stats), elapsed)) => {
            tracing::info!(
                eye = key.eye.as_str(),
                mode = key.mode.as_str(),
                probes = members.len(),
                entries = stats.entries,
                rounds = stats.rounds,
                ms = elapsed.as_secs_f64() * 1e3,
                "iris batch"
            );
            outcomes
                .into_iter()
                .map(|o| {
                    o.map(|mut o| {
                        o.stats.micros = elapsed.as_micros() as u64;
                        o
                    })
                })
                .collect()
        }
        Err(e) => members.iter().map(|_| Err(e.clone())).collect(),
    }
}

/// Runs a batch of enrol-if-unique requests (docs/protocols/iris.md §13.4) on the
/// connections of a distributed transaction that holds the template table's lock: member k's
/// uniqueness probe is compared with the enrolled templates and with the records of members
/// 0..k−1 (`enrolments`, each member's three envelopes). One result per member; a failure
/// of the batch itself is the error.
pub async fn run_enrolment_batch_on(
    clients: [&Client; 3],
    parties: &Parties,
    key: IrisBatchKey,
    members: &[SearchRequest],
    enrolments: &[[Vec<u8>; 3]],
    timeout: Duration,
) -> Result<Vec<Result<SearchOutcome, SearchError>>, SearchError> {
    let mut id = SessionId::default();
    rand::rngs::OsRng.fill_bytes(&mut id);
    let batch = Batch {
        id,
        key,
        members,
        enrolments,
        enrolment_hashes: enrolments
            .iter()
            .map(|e| envelope_hashes([&e[0], &e[1], &e[2]]).to_vec())
            .collect(),
        timeout,
    };
    for (k, m) in members.iter().enumerate() {
        tracing::info!(
            session = %hex::encode(m.session),
            batch = %hex::encode(id),
            at = k,
            "iris enroll-if-unique in batch"
        );
    }
    let ((outcomes, stats), elapsed) = run_on(clients, parties, &batch).await?;
    tracing::info!(
        eye = key.eye.as_str(),
        requests = members.len(),
        entries = stats.entries,
        rounds = stats.rounds,
        ms = elapsed.as_secs_f64() * 1e3,
        "iris enrolment batch"
    );
    Ok(outcomes)
}

/// Of `n` requests, the first refused at some parties but not at all three, and those
/// parties ("P0 and P2").
fn first_split_refusal(
    refused: &[Vec<Option<(String, String)>>; 3],
    n: usize,
) -> Option<(usize, String)> {
    (0..n).find_map(|k| {
        let at: Vec<String> = PartyIndex::ALL
            .iter()
            .filter(|p| refused[p.as_usize()].get(k).is_some_and(Option::is_some))
            .map(|p| p.to_string())
            .collect();
        (!at.is_empty() && at.len() < 3).then(|| (k, at.join(" and ")))
    })
}

/// Whether a party refused the batch as holding more comparisons than it takes at once
/// (core's `SearchError::BatchTooLarge`, whose message ends so).
fn too_large(result: &Result<SearchOutcome, SearchError>) -> bool {
    matches!(result, Err(SearchError::Party(p)) if p.message.contains("send smaller batches"))
}

/// The iris batches of a coordinator ([`BatchRunner`] of [`crate::session::batcher`]):
/// the parties' pools, the per-call timeout and the last template count seen per eye (a
/// batch holds at most [`MAX_BATCH_COMPARISONS`] comparisons at a party).
pub struct IrisBatches {
    parties: Arc<Parties>,
    timeout: Duration,
    entries: Mutex<HashMap<Eye, i64>>,
}

impl IrisBatches {
    /// Batches on `parties` with the per-call `timeout`, started on `policy`.
    pub fn start(parties: Arc<Parties>, timeout: Duration, policy: BatchPolicy) -> Batcher<Self> {
        Batcher::start(
            IrisBatches {
                parties,
                timeout,
                entries: Mutex::new(HashMap::new()),
            },
            policy,
        )
    }
}

impl IrisBatches {
    /// The templates the last batch of `key`'s eye compared with (0 before the first).
    fn entries_of(&self, key: &IrisBatchKey) -> i64 {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key.eye)
            .copied()
            .unwrap_or(0)
    }
}

/// The most probes a batch of `rotations` rotations over `entries` templates may hold at a
/// party, within `policy_max` and the party's limits.
pub fn probes_for(entries: i64, rotations: usize, policy_max: usize) -> usize {
    let per_probe = (entries.max(1) as usize).saturating_mul(rotations.max(1));
    let most = policy_max.clamp(1, MAX_BATCH_PROBES);
    (MAX_BATCH_COMPARISONS / per_probe).clamp(1, most)
}

/// Comparisons per probe from which a batch's pass over the template shares, not its rounds,
/// is what batching saves: 100,000 templates at one rotation (or 3,226 at 31). Below it,
/// batches in flight overlap their rounds' round trips (the 10 ms link runs of
/// BENCHMARKS.md); from it, [`LARGE_SET_IN_FLIGHT`] batch runs at a time, so that the
/// requests arriving meanwhile gather into one larger batch (one pass for all of them)
/// instead of several small ones that each read every share.
pub const LARGE_SET_COMPARISONS: usize = 100_000;

/// Batches of one key in flight over a large set ([`LARGE_SET_COMPARISONS`]). Measured at
/// 100,000 templates without rotations, 16 clients through the front door on 2 vCPUs
/// (BENCHMARKS.md): 1 in flight 4.9 TPS in batches of 8.0, 2 in flight 3.3 TPS (3.6), 8 in
/// flight 2.5 TPS (1.9), against 1.3 TPS for one client.
pub const LARGE_SET_IN_FLIGHT: usize = 1;

/// The batches of `rotations` rotations over `entries` templates that may run at once, within
/// `policy_in_flight` ([`LARGE_SET_COMPARISONS`]).
pub fn in_flight_for(entries: i64, rotations: usize, policy_in_flight: usize) -> usize {
    let per_probe = (entries.max(0) as usize).saturating_mul(rotations.max(1));
    if per_probe >= LARGE_SET_COMPARISONS {
        policy_in_flight.clamp(1, LARGE_SET_IN_FLIGHT)
    } else {
        policy_in_flight.max(1)
    }
}

impl BatchRunner for IrisBatches {
    type Key = IrisBatchKey;
    type Item = SearchRequest;
    type Output = SearchOutcome;
    type Error = SearchError;

    /// Runs the batch; one the parties refuse as too large for their template set (this
    /// coordinator had not seen it yet: its first batches after a start) runs again in halves,
    /// in order (nothing of it was consumed: a party refuses it before admitting any probe).
    async fn run(
        &self,
        key: IrisBatchKey,
        items: Vec<SearchRequest>,
    ) -> Vec<Result<SearchOutcome, SearchError>> {
        let mut out = Vec::with_capacity(items.len());
        let mut chunks = VecDeque::from([items]);
        while let Some(chunk) = chunks.pop_front() {
            let results = run_batch(&self.parties, key, &chunk, self.timeout).await;
            if chunk.len() > 1 && results.iter().all(too_large) {
                let mut front = chunk;
                let back = front.split_off(front.len() / 2);
                chunks.push_front(back);
                chunks.push_front(front);
                continue;
            }
            if let Some(Ok(o)) = results.iter().find(|r| r.is_ok()) {
                self.entries
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key.eye, o.stats.entries);
            }
            out.extend(results);
        }
        out
    }

    fn max_items(&self, key: &IrisBatchKey, policy_max: usize) -> usize {
        probes_for(self.entries_of(key), key.rotations(), policy_max)
    }

    fn in_flight(&self, key: &IrisBatchKey, policy_in_flight: usize) -> usize {
        in_flight_for(self.entries_of(key), key.rotations(), policy_in_flight)
    }

    fn busy(&self) -> SearchError {
        SearchError::Busy
    }

    fn lost(&self) -> SearchError {
        SearchError::Protocol("the search's batch ended without its answer".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_refused_at_some_parties_only_voids_the_later_ones() {
        let no = || None;
        let yes = || Some(("22023".to_owned(), "refused".to_owned()));
        let refusals = |rows: [[bool; 4]; 3]| {
            rows.map(|r| r.iter().map(|&x| if x { yes() } else { no() }).collect())
        };
        // Refused at all three (request 1): a zero row everywhere, nothing void.
        let everywhere = refusals([[false, true, false, false]; 3]);
        assert_eq!(first_split_refusal(&everywhere, 4), None);
        // Request 2 refused at P0 and P2 only: the requests after it are void.
        let split = refusals([
            [false, true, true, false],
            [false, true, false, false],
            [false, true, true, true],
        ]);
        assert_eq!(
            first_split_refusal(&split, 4),
            Some((2, "P0 and P2".into()))
        );
        assert_eq!(first_split_refusal(&refusals([[false; 4]; 3]), 4), None);
    }

    #[test]
    fn a_partys_refusal_of_a_batch_too_large_is_recognised() {
        let refusal = privmatch_core::iris::service::SearchError::BatchTooLarge {
            probes: 32,
            entries: 1_000_000,
        };
        let party = |message: String| {
            Err(SearchError::Party(PartyError {
                party: PartyIndex::ALL[1],
                sqlstate: Some("22023".into()),
                message,
            }))
        };
        assert!(too_large(&party(refusal.to_string())));
        assert!(!too_large(&party("iris search: something else".into())));
        assert!(!too_large(&Err(SearchError::Busy)));
    }

    #[test]
    fn batches_stay_within_the_partys_comparison_limit() {
        assert_eq!(probes_for(1_000, 31, 32), 32);
        assert_eq!(probes_for(100_000, 1, 64), 64);
        // 100,000 × 31 rotations: 5 probes make 15.5 M comparisons, 6 would pass 2^24
        // (about 2 GiB of working memory at a party).
        assert_eq!(probes_for(100_000, 31, 64), 5);
        assert_eq!(probes_for(1_000_000, 31, 32), 1);
        assert_eq!(probes_for(100_000_000, 31, 32), 1);
        assert_eq!(probes_for(0, 1, 500), MAX_BATCH_PROBES);
        // Batches in flight: the policy's below a large set, one from it.
        assert_eq!(in_flight_for(0, 31, 8), 8);
        assert_eq!(in_flight_for(1_000, 31, 8), 8);
        assert_eq!(in_flight_for(99_999, 1, 8), 8);
        assert_eq!(in_flight_for(100_000, 1, 8), 1);
        assert_eq!(in_flight_for(10_000, 31, 8), 1);
        assert_eq!(in_flight_for(100_000, 31, 1), 1);
        assert_eq!(in_flight_for(1_000, 1, 0), 1);
    }
}
