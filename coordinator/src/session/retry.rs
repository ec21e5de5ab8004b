//! Retrying a session after a transient failure: a back-off schedule, and the loop that runs
//! fresh attempts on it. Every attempt must use a fresh session id (and so freshly sealed
//! probes): the parties refuse an id they have seen.

use std::future::Future;
use std::time::Duration;

/// The back-off schedule of retries after a transient failure: `first_delay`, doubling,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_stops_at_the_total() {
        let delays = RetryPolicy::default().delays();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 3700]);
        assert_eq!(delays.iter().sum::<Duration>(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_only_what_is_retryable_and_counts_attempts() {
        let policy = RetryPolicy {
            first_delay: Duration::from_millis(10),
            total: Duration::from_millis(30),
        };
        // Each case: the answers of successive attempts; the result and attempts expected.
        type Answer = Result<u32, &'static str>;
        let cases: [(&[Answer], Answer, u32); 3] = [
            (&[Err("transient"); 4], Err("transient"), 3),
            (&[Err("transient"), Ok(2)], Ok(2), 2),
            (&[Err("fatal"), Ok(2)], Err("fatal"), 1),
        ];
        for (answers, expected, expected_attempts) in cases {
            let mut answers = answers.iter().copied();
            let (result, attempts) = with_retry(
                &policy,
                |e: &&str| *e == "transient",
                || std::future::ready(answers.next().unwrap_or(Err("none left"))),
            )
            .await;
            assert_eq!((result, attempts), (expected, expected_attempts));
        }
    }
}
