//! Batches of sessions: requests of one kind that arrive while others of that kind run are
//! held briefly and run together as one session (one scan of the parties' templates, one set
//! of rounds for all of them), as iris-mpc answers batches of queries. Generic over
//! [`BatchRunner`], which a modality implements: what a batch's key is (the requests it may
//! group), how many requests one batch may hold, and how a batch runs.
//!
//! **When a batch leaves** ([`BatchPolicy`]). Per key, at most `in_flight` batches run at
//! once. A request that finds no batch of its key running leaves at once, alone: an idle
//! system adds no wait to a search. Otherwise it joins the queue of its key, which leaves as
//! one batch when it holds `max_items` requests, or `window` after its oldest request
//! arrived, whichever comes first, as soon as fewer than `in_flight` batches of its key run.
//! So under load a batch fills while the previous one computes, and its requests wait at
//! most for one batch plus the window. A queue holds at most `max_queued` requests; more are
//! refused at once with the runner's [`BatchRunner::busy`] error (the API's 429).
//!
//! **What a caller gets.** Its own result only: the runner answers each request of a batch
//! separately ([`BatchRunner::run`] returns one result per request, in batch order). A
//! request whose caller has gone (its HTTP request was dropped while queued) is left out of
//! the batch it would have joined.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Runs batches of one modality's requests (module docs).
pub trait BatchRunner: Send + Sync + 'static {
    /// What requests must share to run in one batch (e.g. the eye and search parameters).
    type Key: Clone + Eq + Hash + Debug + Send + Sync + 'static;
    /// One request.
    type Item: Send + 'static;
    /// One request's answer.
    type Output: Send + 'static;
    /// Why a request (or its whole batch) failed.
    type Error: Send + 'static;

    /// Runs `items` as one batch; one result per item, in the same order.
    fn run(
        &self,
        key: Self::Key,
        items: Vec<Self::Item>,
    ) -> impl Future<Output = Vec<Result<Self::Output, Self::Error>>> + Send;

    /// The most requests a batch of `key` may hold now (at least 1), at most `policy_max`
    /// (the runner may lower it, e.g. for a large template set).
    fn max_items(&self, key: &Self::Key, policy_max: usize) -> usize;

    /// The most batches of `key` that may run at once now (at least 1), at most
    /// `policy_in_flight`. Several in flight overlap one batch's rounds with another's
    /// (latency-bound: small sets, delayed links); fewer make each batch larger where one
    /// pass over a large set is the cost a batch shares. By default the policy's.
    fn in_flight(&self, _key: &Self::Key, policy_in_flight: usize) -> usize {
        policy_in_flight
    }

    /// The error of a request refused because its queue is full.
    fn busy(&self) -> Self::Error;

    /// The error of a request whose batch ended without answering it (a bug or a panic).
    fn lost(&self) -> Self::Error;
}

/// When batches leave (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Most requests in one batch (1 = no batching).
    pub max_items: usize,
    /// Longest a queued request waits for others to join, once a batch of its key runs.
    pub window: Duration,
    /// Batches of one key running at once.
    pub in_flight: usize,
    /// Requests queued per key at most; more are refused.
    pub max_queued: usize,
}

impl Default for BatchPolicy {
    /// 32 requests, 5 ms, eight batches in flight, 256 queued (chosen from the load runs in
    /// BENCHMARKS.md, "Batched searches").
    fn default() -> Self {
        BatchPolicy {
            max_items: 32,
            window: Duration::from_millis(5),
            in_flight: 8,
            max_queued: 256,
        }
    }
}

/// A request waiting for its batch.
struct Job<R: BatchRunner> {
    key: R::Key,
    item: R::Item,
    reply: oneshot::Sender<Result<R::Output, R::Error>>,
    arrived: Instant,
}

/// One key's queue and the batches of it running.
struct Queue<R: BatchRunner> {
    jobs: VecDeque<Job<R>>,
    running: usize,
}

impl<R: BatchRunner> Queue<R> {
    fn new() -> Self {
        Queue {
            jobs: VecDeque::new(),
            running: 0,
        }
    }

    /// The jobs of the next batch, if one may leave at `now` (module docs), at most `max`
    /// of them while fewer than `in_flight` batches run.
    fn ready(
        &mut self,
        now: Instant,
        policy: &BatchPolicy,
        max: usize,
        in_flight: usize,
    ) -> Option<Vec<Job<R>>> {
        // Callers that went away while queued are dropped first.
        self.jobs.retain(|j| !j.reply.is_closed());
        let oldest = self.jobs.front()?.arrived;
        if self.running >= in_flight.max(1) {
            return None;
        }
        let leaves = self.running == 0 || self.jobs.len() >= max || now >= oldest + policy.window;
        if !leaves {
            return None;
        }
        let n = self.jobs.len().min(max.max(1));
        Some(self.jobs.drain(..n).collect())
    }

    /// When the oldest queued request's window ends, if it waits for one (and may leave then:
    /// fewer than `in_flight` batches run).
    fn deadline(&self, policy: &BatchPolicy, in_flight: usize) -> Option<Instant> {
        if self.running >= in_flight.max(1) {
            return None;
        }
        self.jobs.front().map(|j| j.arrived + policy.window)
    }
}

/// Submits requests to batches (module docs). Cloning shares it.
pub struct Batcher<R: BatchRunner> {
    runner: Arc<R>,
    jobs: mpsc::UnboundedSender<Job<R>>,
}

impl<R: BatchRunner> Clone for Batcher<R> {
    fn clone(&self) -> Self {
        Batcher {
            runner: self.runner.clone(),
            jobs: self.jobs.clone(),
        }
    }
}

impl<R: BatchRunner> Batcher<R> {
    /// Starts the task that forms and runs the batches of `runner` on `policy` (inside a tokio
    /// runtime); it ends when the last clone of the batcher is dropped.
    pub fn start(runner: R, policy: BatchPolicy) -> Self {
        let runner = Arc::new(runner);
        let (jobs, inbox) = mpsc::unbounded_channel();
        tokio::spawn(form_batches(runner.clone(), policy, inbox));
        Batcher { runner, jobs }
    }

    /// Runs `item` in a batch of `key` and returns its own result.
    pub async fn submit(&self, key: R::Key, item: R::Item) -> Result<R::Output, R::Error> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            key,
            item,
            reply,
            arrived: Instant::now(),
        };
        if self.jobs.send(job).is_err() {
            return Err(self.runner.lost());
        }
        answer.await.unwrap_or_else(|_| Err(self.runner.lost()))
    }
}

/// The batches of `key` that may run at once: the runner's choice within the policy's.
fn in_flight_of<R: BatchRunner>(runner: &R, key: &R::Key, policy: &BatchPolicy) -> usize {
    runner
        .in_flight(key, policy.in_flight.max(1))
        .clamp(1, policy.in_flight.max(1))
}

/// The batching task: queues requests by key, sends batches off as the policy allows and
/// counts the running ones down as they end.
async fn form_batches<R: BatchRunner>(
    runner: Arc<R>,
    policy: BatchPolicy,
    mut inbox: mpsc::UnboundedReceiver<Job<R>>,
) {
    let mut queues: HashMap<R::Key, Queue<R>> = HashMap::new();
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<R::Key>();
    let mut open = true;
    loop {
        let now = Instant::now();
        // Keys are independent: the order they are looked at in changes nothing.
        #[allow(clippy::iter_over_hash_type)]
        for (key, queue) in queues.iter_mut() {
            let max = runner.max_items(key, policy.max_items.max(1)).max(1);
            let in_flight = in_flight_of(&*runner, key, &policy);
            while let Some(batch) = queue.ready(now, &policy, max, in_flight) {
                queue.running += 1;
                tokio::spawn(run_batch(
                    runner.clone(),
                    key.clone(),
                    batch,
                    ended_tx.clone(),
                ));
            }
        }
        queues.retain(|_, q| q.running > 0 || !q.jobs.is_empty());
        if !open && queues.is_empty() {
            return;
        }
        let deadline = queues
            .iter()
            .filter_map(|(key, q)| q.deadline(&policy, in_flight_of(&*runner, key, &policy)))
            .min();
        tokio::select! {
            job = inbox.recv(), if open => match job {
                Some(job) => {
                    let queue = queues.entry(job.key.clone()).or_insert_with(Queue::new);
                    if queue.jobs.len() >= policy.max_queued.max(1) {
                        let _ = job.reply.send(Err(runner.busy()));
                    } else {
                        queue.jobs.push_back(job);
                    }
                }
                None => open = false,
            },
            Some(key) = ended.recv() => {
                if let Some(queue) = queues.get_mut(&key) {
                    queue.running = queue.running.saturating_sub(1);
                }
            }
            _ = sleep_until_some(deadline) => {}
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs one batch and answers each of its requests; reports the key when done (also when
/// the run panicked: the requests then get the runner's `lost` error).
async fn run_batch<R: BatchRunner>(
    runner: Arc<R>,
    key: R::Key,
    jobs: Vec<Job<R>>,
    ended: mpsc::UnboundedSender<R::Key>,
) {
    let (items, replies): (Vec<R::Item>, Vec<_>) =
        jobs.into_iter().map(|j| (j.item, j.reply)).unzip();
    let run = {
        let runner = runner.clone();
        let key = key.clone();
        tokio::spawn(async move { runner.run(key, items).await })
    };
    let results = run.await.unwrap_or_default();
    let mut results = results.into_iter();
    for reply in replies {
        let result = results.next().unwrap_or_else(|| Err(runner.lost()));
        let _ = reply.send(result);
    }
    let _ = ended.send(key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Doubles numbers; records the batches it ran; each batch takes `work`.
    struct Doubler {
        batches: Seen,
        work: Duration,
    }

    impl BatchRunner for Doubler {
        type Key = &'static str;
        type Item = u32;
        type Output = u32;
        type Error = &'static str;

        async fn run(&self, _key: &'static str, items: Vec<u32>) -> Vec<Result<u32, &'static str>> {
            self.batches.lock().unwrap().push(items.clone());
            tokio::time::sleep(self.work).await;
            items
                .into_iter()
                .map(|i| if i == 13 { Err("thirteen") } else { Ok(2 * i) })
                .collect()
        }

        fn max_items(&self, _key: &&'static str, policy_max: usize) -> usize {
            policy_max
        }

        /// The key "narrow" runs one batch at a time; "wide" asks for more than the policy.
        fn in_flight(&self, key: &&'static str, policy_in_flight: usize) -> usize {
            match *key {
                "narrow" => 1,
                "wide" => policy_in_flight * 4,
                _ => policy_in_flight,
            }
        }

        fn busy(&self) -> &'static str {
            "busy"
        }

        fn lost(&self) -> &'static str {
            "lost"
        }
    }

    /// The batches a [`Doubler`] ran, as it records them.
    type Seen = Arc<Mutex<Vec<Vec<u32>>>>;

    fn batcher(policy: BatchPolicy) -> (Batcher<Doubler>, Seen) {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let runner = Doubler {
            batches: batches.clone(),
            work: Duration::from_millis(100),
        };
        (Batcher::start(runner, policy), batches)
    }

    fn policy(max_items: usize, in_flight: usize) -> BatchPolicy {
        BatchPolicy {
            max_items,
            window: Duration::from_millis(5),
            in_flight,
            max_queued: 8,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_leaves_at_once_and_others_join_while_it_runs() {
        let (b, batches) = batcher(policy(4, 1));
        let started = Instant::now();
        assert_eq!(b.submit("k", 1).await, Ok(2));
        // Alone on an idle batcher: no window, just the run.
        assert_eq!(started.elapsed(), Duration::from_millis(100));
        let calls: Vec<_> = (10..16)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.submit("k", i).await })
            })
            .collect();
        let mut answers = Vec::new();
        for c in calls {
            answers.push(c.await.unwrap());
        }
        assert_eq!(
            answers,
            vec![Ok(20), Ok(22), Ok(24), Err("thirteen"), Ok(28), Ok(30)]
        );
        // The first leaves alone; the others queue behind it and leave as batches of at most 4.
        let seen = batches.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![vec![1], vec![10], vec![11, 12, 13, 14], vec![15]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_batch_leaves_after_the_window_while_one_runs() {
        let (b, batches) = batcher(policy(8, 2));
        let first = {
            let b = b.clone();
            tokio::spawn(async move { b.submit("k", 1).await })
        };
        tokio::task::yield_now().await;
        let started = Instant::now();
        let second = {
            let b = b.clone();
            tokio::spawn(async move { b.submit("k", 2).await })
        };
        assert_eq!(second.await.unwrap(), Ok(4));
        // It waited the 5 ms window (a second batch may run), then its own run.
        assert_eq!(started.elapsed(), Duration::from_millis(105));
        assert_eq!(first.await.unwrap(), Ok(2));
        // Another key is not held behind it.
        assert_eq!(b.submit("other", 3).await, Ok(6));
        assert_eq!(batches.lock().unwrap().len(), 3);
    }

    /// Submits 1 alone, then `rest` one every 10 ms (twice the window) while it runs (each
    /// batch takes 100 ms); returns when all are answered.
    async fn one_then_more(b: &Batcher<Doubler>, key: &'static str, rest: std::ops::Range<u32>) {
        let first = {
            let b = b.clone();
            tokio::spawn(async move { b.submit(key, 1).await })
        };
        let mut more = Vec::new();
        for i in rest {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let b = b.clone();
            more.push(tokio::spawn(async move { b.submit(key, i).await }));
        }
        for m in more {
            assert!(m.await.unwrap().is_ok());
        }
        assert_eq!(first.await.unwrap(), Ok(2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_runner_may_run_fewer_batches_at_once_than_the_policy_never_more() {
        // Policy: 4 in flight. "k" uses them: each newcomer leaves alone after the window.
        let (b, batches) = batcher(policy(8, 4));
        one_then_more(&b, "k", 20..23).await;
        assert_eq!(
            batches.lock().unwrap().clone(),
            vec![vec![1], vec![20], vec![21], vec![22]]
        );
        // "narrow": one at a time, so the newcomers wait for the first and leave together.
        let (b, batches) = batcher(policy(8, 4));
        one_then_more(&b, "narrow", 20..23).await;
        assert_eq!(
            batches.lock().unwrap().clone(),
            vec![vec![1], vec![20, 21, 22]]
        );
        // "wide" asks for 16 and is held to the policy's 4: the fourth and fifth newcomers
        // wait for the first batch to end and leave together.
        let (b, batches) = batcher(policy(8, 4));
        one_then_more(&b, "wide", 20..25).await;
        assert_eq!(
            batches.lock().unwrap().clone(),
            vec![vec![1], vec![20], vec![21], vec![22], vec![23, 24]]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let (b, _) = batcher(policy(2, 1));
        let running = {
            let b = b.clone();
            tokio::spawn(async move { b.submit("k", 1).await })
        };
        tokio::task::yield_now().await;
        let queued: Vec<_> = (0..8)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.submit("k", 100 + i).await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert_eq!(b.submit("k", 9).await, Err("busy"));
        for q in queued {
            assert!(q.await.unwrap().is_ok());
        }
        assert_eq!(running.await.unwrap(), Ok(2));
    }
}
