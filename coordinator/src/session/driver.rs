//! The round-driver skeleton every modality's sessions run on.
//!
//! A session is a few SQL calls per party: an opening, then rounds in which each party takes
//! the message routed to it and answers its next one, until the parties report a result. The
//! coordinator only relays sealed messages. What differs between modalities — which parties
//! take part, the SQL of each call, who receives whose message, what the answers mean — a
//! modality supplies through two traits:
//!
//! * [`Session`]: the whole session on one connection per party ([`Session::drive`]) and the
//!   SQL that aborts it at a party. [`run_pooled`] runs it on pooled connections,
//!   [`run_on`] on connections the caller supplies (e.g. inside a distributed transaction);
//!   both time it and, on failure, abort it at every party it involves (best effort, on fresh
//!   pooled connections), so that no party keeps working on an abandoned session.
//! * [`Rounds`]: the SQL of one round at a party, what a party's answer says, the routing of
//!   a round's messages and what a round's answers mean; [`relay`] runs the rounds, in parallel at the parties, relaying the
//!   messages and counting them.
//!
//! Every call at a party runs under a deadline ([`call_with_timeout`]): on timeout the query
//! is cancelled at the party, with a cancel request sent over TLS as the connection was. A
//! parallel step ([`at_each`]) fails with its most telling error: a party's own error rather
//! than a timeout, which may only be its consequence.
//!
//! The iris search (three parties in a ring, Bloemen et al., "Large-Scale MPC: Scaling
//! Private Iris Code Uniqueness Checks to Millions of Users", ePrint 2024/705) and the face
//! comparison (two evaluators exchanging masked values, Funshade: Ibarrondo, Chabanne, Önen,
//! PETS 2023, ePrint 2022/1688) both run on it.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::join_all;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SessionId;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Row};
use tracing::Instrument;

use crate::parties::{Parties, PartyError};

/// How long the best-effort abort waits for each party.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The errors of a modality's sessions, as the skeleton makes and ranks them.
pub trait SessionError: Sized {
    /// A party failed: it answered an error, or could not be reached.
    fn party(err: PartyError) -> Self;
    /// A party did not answer within the per-call timeout (its call was cancelled).
    fn timeout(err: PartyError) -> Self;
    /// The parties broke the protocol.
    fn protocol(message: String) -> Self;
    /// True for [`SessionError::timeout`] errors.
    fn is_timeout(&self) -> bool;
}

/// Implements [`SessionError`] for a modality's error enum that has the variants
/// `Party(PartyError)`, `Timeout(PartyError)` and `Protocol(String)`.
#[macro_export]
macro_rules! session_error {
    ($error:ident) => {
        impl $crate::session::driver::SessionError for $error {
            fn party(err: $crate::parties::PartyError) -> Self {
                $error::Party(err)
            }

            fn timeout(err: $crate::parties::PartyError) -> Self {
                $error::Timeout(err)
            }

            fn protocol(message: String) -> Self {
                $error::Protocol(message)
            }

            fn is_timeout(&self) -> bool {
                matches!(self, $error::Timeout(_))
            }
        }
    };
}

/// Runs one call at `party` with a deadline; on timeout the query is cancelled at the party
/// (so it does not keep working on an abandoned round). `what` names the call in errors.
///
/// The cancel request goes over TLS verified against the party's pinned CA whenever the
/// connection uses TLS ([`crate::tls::CancelTls`]): it carries the backend's secret cancel key,
/// which PostgreSQL would accept in the clear too (a cancel request meets no `pg_hba.conf`
/// line), and which must not cross the network readable.
pub async fn call_with_timeout<T, E: SessionError>(
    party: PartyIndex,
    client: &Client,
    what: &str,
    timeout: Duration,
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, E> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(E::party(PartyError::from_pg(party, &e))),
        Err(_) => {
            let token = client.cancel_token();
            tokio::spawn(async move {
                if let Err(e) = token.cancel_query(crate::tls::CancelTls).await {
                    // The party goes on with the abandoned call until it ends by itself; the
                    // connection is not reused (run_pooled, TwoPhase).
                    tracing::warn!(%party, error = %e, "cancel request not delivered");
                }
            });
            Err(E::timeout(PartyError {
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

/// Runs `call` at each of the first `N` parties in parallel (party i on `clients[i]`): their
/// answers in party order, or the most telling error ([`all_answers`]).
pub async fn at_each<'a, const N: usize, T, E, F, Fut>(
    clients: [&'a Client; N],
    mut call: F,
) -> Result<[T; N], E>
where
    E: SessionError,
    F: FnMut(PartyIndex, &'a Client) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let calls = PartyIndex::ALL
        .iter()
        .zip(clients)
        .map(|(&party, client)| call(party, client));
    all_answers(join_all(calls).await, E::is_timeout, || {
        E::protocol(format!("expected {N} answers"))
    })
}

/// One session of a modality, between the first `N` parties.
pub trait Session<const N: usize>: Sync {
    /// What the session yields.
    type Output: Send;
    /// Why it failed.
    type Error: SessionError + Send;
    /// The SQL that aborts the session at a party (`$1`: the session id); its answer is
    /// ignored.
    const ABORT_SQL: &'static str;

    /// The session id (bound into the sealed probes).
    fn id(&self) -> &SessionId;

    /// Runs the whole session on one connection per party (`clients[i]` to party i), without
    /// the abort on failure (the driver does it).
    fn drive<'a>(
        &'a self,
        clients: [&'a Client; N],
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send + 'a;
}

/// Runs `session` on pooled connections; its output and how long it took (from the first
/// call, connections made). The connections go back to the pools only after a success (after
/// a failure one may still be busy with a cancelled call, or broken).
pub async fn run_pooled<const N: usize, S: Session<N>>(
    parties: &Parties,
    session: &S,
) -> Result<(S::Output, Duration), S::Error> {
    let clients = parties
        .connect_first::<N>()
        .await
        .map_err(S::Error::party)?;
    let outcome = run_on(clients.each_ref().map(|c| c.client()), parties, session).await;
    if outcome.is_ok() {
        parties.give_back_all(clients).await;
    }
    outcome
}

/// Runs `session` on connections the caller supplies (`clients[i]` to party i; they may be
/// inside a transaction); its output and how long it took. On failure the session is aborted
/// at its parties through the pools of `parties`; the caller decides what to do with its
/// connections.
pub async fn run_on<const N: usize, S: Session<N>>(
    clients: [&Client; N],
    parties: &Parties,
    session: &S,
) -> Result<(S::Output, Duration), S::Error> {
    // Every line logged while the session runs carries its id, the one the client sealed its
    // inputs to and the parties log (at DEBUG1): one search is found by it in all five logs.
    let span = tracing::info_span!("session", id = %hex::encode(session.id()));
    async {
        let started = Instant::now();
        match session.drive(clients).await {
            Ok(output) => {
                let elapsed = started.elapsed();
                tracing::info!(ms = elapsed.as_secs_f64() * 1e3, "session finished");
                Ok((output, elapsed))
            }
            Err(err) => {
                tracing::warn!("session failed; aborting it at the parties");
                abort_everywhere::<N>(parties, S::ABORT_SQL, session.id()).await;
                Err(err)
            }
        }
    }
    .instrument(span)
    .await
}

/// Runs `abort_sql` for `session` at the first `N` parties on fresh pooled connections,
/// ignoring every error (the session lives in the party's engine, not in a transaction).
pub async fn abort_everywhere<const N: usize>(
    parties: &Parties,
    abort_sql: &str,
    session: &SessionId,
) {
    join_all(parties.all()[..N].iter().map(|party| async move {
        let attempt = async {
            let client = party.connect().await.ok()?;
            let id: &[u8] = session;
            client.query_one(abort_sql, &[&id]).await.ok()?;
            party.give_back(client).await;
            Some(())
        };
        if tokio::time::timeout(ABORT_TIMEOUT, attempt)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            tracing::debug!(party = %party.index, abort_sql, "best-effort abort of a session failed");
        }
    }))
    .await;
}

/// What a round's answers mean for the driver.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<const N: usize, T> {
    /// Relay these messages (indexed by sender) and run the next round.
    Relay([Vec<u8>; N]),
    /// The rounds are over.
    Finished(T),
}

/// The rounds of a modality's session, between the first `N` parties.
pub trait Rounds<const N: usize>: Session<N> {
    /// A party's answer to one round.
    type Reply: Send;
    /// What the last round yields.
    type Last;

    /// The SQL of one round at a party: `$1` the session id (`bytea`), `$2` the round number
    /// (`integer`), `$3` the message routed to the party (`bytea`; NULL in a first round that
    /// has none). Sent with these types in one round trip (no separate prepare).
    const ROUND_SQL: &'static str;
    /// The party function `ROUND_SQL` calls (names the call in errors).
    const ROUND_FUNCTION: &'static str;

    /// The per-call timeout.
    fn timeout(&self) -> Duration;

    /// What `party`'s answer row to round `round` says.
    fn reply(&self, party: PartyIndex, round: i32, row: &Row) -> Result<Self::Reply, Self::Error>;

    /// What the answers of round `round` mean: the messages to relay (indexed by sender), or
    /// the output.
    fn step(
        &self,
        round: i32,
        replies: [Self::Reply; N],
    ) -> Result<Step<N, Self::Last>, Self::Error>;

    /// Routes a round's messages, indexed by sender, to their receivers (indexed by receiver).
    fn route(&self, outbound: [Vec<u8>; N]) -> [Vec<u8>; N];
}

/// Calls round `round` of `rounds` at `party`, with the message routed to it.
async fn round_at<const N: usize, R: Rounds<N>>(
    rounds: &R,
    party: PartyIndex,
    client: &Client,
    round: i32,
    inbound: Option<&[u8]>,
) -> Result<R::Reply, R::Error> {
    let session: &[u8] = rounds.id();
    let what = format!("{} (round {round})", R::ROUND_FUNCTION);
    let row = call_with_timeout::<_, R::Error>(
        party,
        client,
        &what,
        rounds.timeout(),
        client.query_typed_one(
            R::ROUND_SQL,
            &[
                (&session, Type::BYTEA),
                (&round, Type::INT4),
                (&inbound, Type::BYTEA),
            ],
        ),
    )
    .await?;
    rounds.reply(party, round, &row)
}

/// What a session's rounds cost, for reports and benchmarks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Traffic<const N: usize> {
    /// Round calls made per party.
    pub rounds: u32,
    /// Bytes of the messages relayed from each party (indexed by sender).
    pub bytes_sent: [u64; N],
}

impl<const N: usize> Traffic<N> {
    /// Nothing sent yet.
    pub fn new() -> Self {
        Traffic {
            rounds: 0,
            bytes_sent: [0; N],
        }
    }

    /// Counts messages indexed by sender.
    pub fn count(&mut self, messages: &[Vec<u8>; N]) {
        for (sent, message) in self.bytes_sent.iter_mut().zip(messages) {
            *sent += message.len() as u64;
        }
    }
}

impl<const N: usize> Default for Traffic<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs rounds `numbers` of `rounds` at the parties in parallel: before each round the
/// messages of the previous one (`first` before the first round, if any) are counted in
/// `traffic` and routed; the round's answers decide whether to go on. A session that has not
/// finished after the last round number is a protocol error.
pub async fn relay<const N: usize, R: Rounds<N>>(
    rounds: &R,
    clients: [&Client; N],
    numbers: Range<i32>,
    first: Option<[Vec<u8>; N]>,
    traffic: &mut Traffic<N>,
) -> Result<R::Last, R::Error> {
    let mut outbound = first;
    for round in numbers.clone() {
        let inbound = outbound.take().map(|messages| {
            traffic.count(&messages);
            rounds.route(messages)
        });
        let inbound_bytes: usize = inbound.iter().flatten().map(Vec::len).sum();
        let started = Instant::now();
        let replies = at_each(clients, |party, client| {
            let message = inbound.as_ref().map(|m| m[party.as_usize()].as_slice());
            round_at(rounds, party, client, round, message)
        })
        .await?;
        // Where a session's time goes, round by round (sizes and times only).
        tracing::debug!(
            function = R::ROUND_FUNCTION,
            round,
            inbound_bytes,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "round"
        );
        traffic.rounds += 1;
        match rounds.step(round, replies)? {
            Step::Relay(next) => outbound = Some(next),
            Step::Finished(output) => return Ok(output),
        }
    }
    Err(R::Error::protocol(format!(
        "the parties did not finish within {} rounds",
        numbers.len()
    )))
}

/// What one party's answer to a round of a ring session is ([`RingRounds`]).
#[derive(Debug, PartialEq, Eq)]
pub enum RingReply<T> {
    /// Its message for the next party (i+1): the session goes on.
    Relay(Vec<u8>),
    /// Its last answer: the session is over at this party.
    Finished(T),
}

/// Rounds that form a ring: in every round party i sends one message, to party i+1, and its
/// answer to round k depends only on its own state and party i−1's message of round k−1.
/// [`relay_ring`] can then run every party's next round as soon as that message is in,
/// instead of waiting for all answers of a round.
pub trait RingRounds<const N: usize>: Rounds<N> {
    /// What `party`'s answer to round `round` is: a message to relay or its last answer.
    fn ring_reply(
        &self,
        party: PartyIndex,
        round: i32,
        reply: Self::Reply,
    ) -> Result<RingReply<Self::Reply>, Self::Error>;
}

/// How one party's chain of rounds in [`relay_ring`] ended.
enum ChainEnd<T, E> {
    /// It finished in this round with this answer.
    Finished(i32, T),
    /// Its own call failed.
    Failed(E),
    /// Its predecessor stopped sending before this round (a consequence of another error, or
    /// of the predecessor finishing early).
    Starved(i32),
}

/// [`relay`] for ring sessions, pipelined: each party runs its rounds on its own connection
/// and is given party i−1's message of a round as soon as that party answered it, so no party
/// waits for the slowest of a round before its next one (parties sharing cores overlap their
/// rounds, and the coordinator relays one party's message while others still compute). The
/// messages, their order and their routing are those of [`relay`]; `first` holds the
/// messages of the opening (indexed by sender). All parties must finish in the same round;
/// their last answers then go through [`Rounds::step`]. Errors rank as in [`at_each`]: a
/// party's own error before a timeout, and both before a party left without input.
pub async fn relay_ring<const N: usize, R: RingRounds<N>>(
    rounds: &R,
    clients: [&Client; N],
    numbers: Range<i32>,
    first: [Vec<u8>; N],
    traffic: &mut Traffic<N>,
) -> Result<R::Last, R::Error> {
    let call = |party: PartyIndex, round: i32, inbound: Vec<u8>| async move {
        let client = clients[party.as_usize()];
        round_at(rounds, party, client, round, Some(&inbound)).await
    };
    relay_ring_with(rounds, &call, numbers, first, traffic).await
}

/// [`relay_ring`] with the round call given: `call(party, round, inbound)` runs one round at
/// a party (tests give one that needs no database).
async fn relay_ring_with<const N: usize, R, F, Fut>(
    rounds: &R,
    call: &F,
    numbers: Range<i32>,
    first: [Vec<u8>; N],
    traffic: &mut Traffic<N>,
) -> Result<R::Last, R::Error>
where
    R: RingRounds<N>,
    F: Fn(PartyIndex, i32, Vec<u8>) -> Fut,
    Fut: Future<Output = Result<R::Reply, R::Error>>,
{
    traffic.count(&first);
    // Channel j is party j's inbox: party i reads channel i and sends on channel i+1.
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..N)
        .map(|_| tokio::sync::mpsc::unbounded_channel::<Vec<u8>>())
        .unzip();
    for (i, opening) in first.into_iter().enumerate() {
        // Party i's opening message is party i+1's input to the first round.
        let _ = senders[(i + 1) % N].send(opening);
    }
    let sent: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
    let calls = AtomicU32::new(0);
    let chains: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(i, inbox)| {
            let chain = Chain {
                party: PartyIndex::ALL[i],
                inbox,
                outbox: senders[(i + 1) % N].clone(),
                sent: &sent[i],
                calls: &calls,
            };
            chain.run(rounds, call, numbers.clone())
        })
        .collect();
    // The chains now hold the only senders: a chain that ends drops its own, so its successor
    // sees the end instead of waiting for a message that will not come.
    drop(senders);
    let ends = join_all(chains).await;
    traffic.rounds += calls.load(Ordering::Relaxed);
    for (total, party_sent) in traffic.bytes_sent.iter_mut().zip(&sent) {
        *total += party_sent.load(Ordering::Relaxed);
    }
    finish_ring(rounds, ends, numbers.end)
}

/// One party's rounds in [`relay_ring`].
struct Chain<'a> {
    party: PartyIndex,
    /// Party i−1's messages.
    inbox: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    /// To party i+1.
    outbox: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    /// Bytes this party sent.
    sent: &'a AtomicU64,
    /// Round calls made by the party that made most.
    calls: &'a AtomicU32,
}

impl Chain<'_> {
    /// Runs rounds `numbers` at this party, each as soon as its input is in.
    async fn run<const N: usize, R, F, Fut>(
        mut self,
        rounds: &R,
        call: &F,
        numbers: Range<i32>,
    ) -> ChainEnd<R::Reply, R::Error>
    where
        R: RingRounds<N>,
        F: Fn(PartyIndex, i32, Vec<u8>) -> Fut,
        Fut: Future<Output = Result<R::Reply, R::Error>>,
    {
        let party = self.party;
        for round in numbers.clone() {
            let Some(inbound) = self.inbox.recv().await else {
                return ChainEnd::Starved(round);
            };
            let started = Instant::now();
            let inbound_bytes = inbound.len();
            let reply = match call(party, round, inbound).await {
                Ok(reply) => reply,
                Err(e) => return ChainEnd::Failed(e),
            };
            self.calls
                .fetch_max((round - numbers.start + 1) as u32, Ordering::Relaxed);
            // Where a session's time goes, round by round and party by party (sizes and
            // times only).
            tracing::debug!(
                function = R::ROUND_FUNCTION,
                %party,
                round,
                inbound_bytes,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "round"
            );
            match rounds.ring_reply(party, round, reply) {
                Ok(RingReply::Relay(message)) => {
                    self.sent.fetch_add(message.len() as u64, Ordering::Relaxed);
                    // A successor that already stopped does not take it; its end says why.
                    let _ = self.outbox.send(message);
                }
                Ok(RingReply::Finished(last)) => return ChainEnd::Finished(round, last),
                Err(e) => return ChainEnd::Failed(e),
            }
        }
        ChainEnd::Starved(numbers.end)
    }
}

/// The first error that is not a timeout, else the first (the ranking of [`all_answers`]).
fn most_telling<E: SessionError>(errors: Vec<E>) -> Option<E> {
    let mut kept: Option<E> = None;
    for e in errors {
        if kept
            .as_ref()
            .is_none_or(|k| k.is_timeout() && !e.is_timeout())
        {
            kept = Some(e);
        }
    }
    kept
}

/// The output of a ring session from how each party's chain ended, or its most telling error.
fn finish_ring<const N: usize, R: RingRounds<N>>(
    rounds: &R,
    ends: Vec<ChainEnd<R::Reply, R::Error>>,
    limit: i32,
) -> Result<R::Last, R::Error> {
    let mut last = Vec::with_capacity(N);
    let mut own: Vec<R::Error> = Vec::new();
    let mut starved = None;
    for (party, end) in PartyIndex::ALL.iter().zip(ends) {
        match end {
            ChainEnd::Finished(round, reply) => last.push((round, reply)),
            ChainEnd::Failed(e) => own.push(e),
            ChainEnd::Starved(round) => starved = starved.or(Some((*party, round))),
        }
    }
    if let Some(e) = most_telling(own) {
        return Err(e);
    }
    if let Some((party, round)) = starved {
        return Err(R::Error::protocol(if round >= limit {
            format!("the parties did not finish within {limit} rounds")
        } else {
            format!(
                "{party} got no message for round {round}: its predecessor finished or stopped before it (finished: {})",
                last.len()
            )
        }));
    }
    let round = last.first().map_or(0, |(r, _)| *r);
    if last.iter().any(|(r, _)| *r != round) {
        let rounds_seen: Vec<String> = last.iter().map(|(r, _)| r.to_string()).collect();
        return Err(R::Error::protocol(format!(
            "the parties finished in different rounds ({})",
            rounds_seen.join(", ")
        )));
    }
    let replies: [R::Reply; N] = last
        .into_iter()
        .map(|(_, reply)| reply)
        .collect::<Vec<_>>()
        .try_into()
        .map_err(|_| R::Error::protocol(format!("expected {N} last answers")))?;
    match rounds.step(round, replies)? {
        Step::Finished(output) => Ok(output),
        Step::Relay(_) => Err(R::Error::protocol(format!(
            "round {round}: the parties finished, yet their answers ask for another round"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A ring session without a database: party i's answer to round k is "Pi:k", its last
    /// answer in round `finish_at[i]` ([`run_fake`] makes the calls).
    struct FakeRing {
        id: SessionId,
        finish_at: [i32; 3],
    }

    #[derive(Debug)]
    enum FakeError {
        Party(PartyError),
        Timeout(PartyError),
        Protocol(String),
    }
    crate::session_error!(FakeError);

    impl Session<3> for FakeRing {
        type Output = ();
        type Error = FakeError;
        const ABORT_SQL: &'static str = "";

        fn id(&self) -> &SessionId {
            &self.id
        }

        #[allow(clippy::manual_async_fn)]
        fn drive<'a>(
            &'a self,
            _clients: [&'a Client; 3],
        ) -> impl Future<Output = Result<(), FakeError>> + Send + 'a {
            async { Ok(()) }
        }
    }

    impl Rounds<3> for FakeRing {
        type Reply = (String, bool);
        type Last = Vec<String>;
        const ROUND_SQL: &'static str = "";
        const ROUND_FUNCTION: &'static str = "fake_round";

        fn timeout(&self) -> Duration {
            Duration::from_secs(1)
        }

        fn reply(&self, _: PartyIndex, _: i32, _: &Row) -> Result<(String, bool), FakeError> {
            unreachable!("the fake call makes its replies itself")
        }

        fn step(
            &self,
            _round: i32,
            replies: [(String, bool); 3],
        ) -> Result<Step<3, Vec<String>>, FakeError> {
            Ok(Step::Finished(replies.into_iter().map(|r| r.0).collect()))
        }

        fn route(&self, outbound: [Vec<u8>; 3]) -> [Vec<u8>; 3] {
            let [m0, m1, m2] = outbound;
            [m2, m0, m1]
        }
    }

    impl RingRounds<3> for FakeRing {
        fn ring_reply(
            &self,
            _: PartyIndex,
            _: i32,
            reply: (String, bool),
        ) -> Result<RingReply<(String, bool)>, FakeError> {
            Ok(if reply.1 {
                RingReply::Finished(reply)
            } else {
                RingReply::Relay(reply.0.into_bytes())
            })
        }
    }

    fn party_error(party: PartyIndex, message: &str) -> PartyError {
        PartyError {
            party,
            sqlstate: Some("XX000".into()),
            message: message.into(),
        }
    }

    /// Runs the fake ring for `rounds` rounds; `fail(party, round)` may make a call fail.
    async fn run_fake(
        finish_at: [i32; 3],
        rounds: i32,
        fail: impl Fn(PartyIndex, i32) -> Option<FakeError>,
    ) -> (Result<Vec<String>, FakeError>, Traffic<3>) {
        let ring = FakeRing {
            id: [7; 16],
            finish_at,
        };
        let call = |party: PartyIndex, round: i32, inbound: Vec<u8>| {
            let failure = fail(party, round);
            let finish = ring.finish_at[party.as_usize()];
            async move {
                // Each party gets exactly its predecessor's message of the round before.
                let prev = party.prev();
                let expected = if round == 0 {
                    format!("open {prev}")
                } else {
                    format!("{prev}:{}", round - 1)
                };
                assert_eq!(String::from_utf8(inbound).unwrap(), expected);
                if let Some(e) = failure {
                    return Err(e);
                }
                Ok((format!("{party}:{round}"), round == finish))
            }
        };
        let first = PartyIndex::ALL.map(|p| format!("open {p}").into_bytes());
        let mut traffic = Traffic::new();
        let out = relay_ring_with(&ring, &call, 0..rounds, first, &mut traffic).await;
        (out, traffic)
    }

    #[tokio::test]
    async fn the_ring_relays_each_message_to_the_next_party_and_finishes_together() {
        let (out, traffic) = run_fake([3, 3, 3], 10, |_, _| None).await;
        assert_eq!(out.unwrap(), vec!["P0:3", "P1:3", "P2:3"]);
        assert_eq!(traffic.rounds, 4);
        // "open Pi" (7 bytes) and rounds 0–2 (4 bytes each) relayed from every party.
        assert_eq!(traffic.bytes_sent, [7 + 12; 3]);
    }

    #[tokio::test]
    async fn a_failing_party_is_reported_and_nobody_waits_for_it() {
        let p = PartyIndex::ALL;
        let (out, _) = run_fake([5; 3], 10, |party, round| {
            (party == p[1] && round == 2).then(|| FakeError::Party(party_error(party, "refused")))
        })
        .await;
        match out {
            Err(FakeError::Party(e)) => {
                assert_eq!((e.party, e.message.as_str()), (p[1], "refused"))
            }
            other => panic!("expected P1's own error, got {other:?}"),
        }
        // A timeout is only reported when no party failed by itself.
        let (out, _) = run_fake([5; 3], 10, |party, round| match (party.as_usize(), round) {
            (0, 2) => Some(FakeError::Timeout(party_error(party, "no answer"))),
            (2, 2) => Some(FakeError::Party(party_error(party, "tampered message"))),
            _ => None,
        })
        .await;
        assert!(
            matches!(&out, Err(FakeError::Party(e)) if e.party == p[2]),
            "{out:?}"
        );
        let (out, _) = run_fake([5; 3], 10, |party, round| {
            (party == p[0] && round == 1).then(|| FakeError::Timeout(party_error(party, "slow")))
        })
        .await;
        assert!(
            matches!(&out, Err(FakeError::Timeout(e)) if e.party == p[0]),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn parties_that_do_not_finish_together_or_at_all_fail_the_session() {
        let (out, _) = run_fake([3, 3, 1], 10, |_, _| None).await;
        match out {
            Err(FakeError::Protocol(m)) => {
                assert!(m.contains("P0 got no message for round 2"), "{m}")
            }
            other => panic!("expected a protocol error, got {other:?}"),
        }
        let (out, traffic) = run_fake([99; 3], 4, |_, _| None).await;
        match out {
            Err(FakeError::Protocol(m)) => {
                assert!(m.contains("did not finish within 4 rounds"), "{m}")
            }
            other => panic!("expected a protocol error, got {other:?}"),
        }
        assert_eq!(traffic.rounds, 4);
    }

    #[test]
    fn traffic_counts_bytes_by_sender() {
        let mut traffic = Traffic::<2>::new();
        traffic.count(&[vec![0; 3], vec![0; 5]]);
        traffic.count(&[vec![0; 1], Vec::new()]);
        assert_eq!(traffic.bytes_sent, [4, 5]);
        assert_eq!(traffic.rounds, 0);
    }
}
