//! Dealings made ahead of time for 1:N identification (docs/protocols/face.md §11).
//!
//! An identification over dealer-masked templates needs one dealing from P2 for the ordered
//! list of compared templates: a fresh probe mask and one sign-gate key per template, 683
//! bytes per comparison per evaluator. None of it depends on the probe, so it can be made
//! before the probe arrives. After each identification the coordinator asks P2 for a dealing
//! of the list it just compared under a fresh random **stock id** (`face_dealer_stock`) and
//! hands each evaluator its half (`face_masked_stock`), which the evaluator's engine keeps in
//! memory. The next identification asks P0 and P1 to open with that stock id
//! (`face_masked_open_stocked`); each claims the dealing only if it was dealt for exactly the
//! list it compares, and records the claim durably (one session per stock id, ever). If
//! either did not claim it (the set changed, an engine restarted), the session is dealt for
//! on its path as before. A dealing carries the dealer's configuration (metric, threshold)
//! of the moment it was made: the stock remembers P2's configuration generation, read before
//! the dealing, and an identification uses it only while P2 still reports that generation
//! (read while P0 and P1 open), so a reconfigured threshold applies to the next
//! identification, as it does without the stock. An identification that finds a refill
//! running waits for it (never longer than dealing on its own path would take: the refill is
//! the same dealing, already under way).
//!
//! What the coordinator learns is what it learned before: the list (it relays it in every
//! open) and random stock ids. It cannot make a stocked dealing equal a session's (P2 derives
//! and seals the two kinds under different labels), hand one dealing to two sessions (the
//! evaluators' `face_stock_used` primary key) or give the evaluators halves of different
//! dealings (each half names its list; a stock id deals one list).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use privmatch_core::party::PartyIndex;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;

use crate::face::driver::{deal_at, dealer_generation, FaceSessionError, Stocked, DEAL_STOCK_SQL};
use crate::parties::{column, Parties};
use crate::session::driver::call_with_timeout;

/// The stock's state as `GET /v1/face/stock` reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StockStatus {
    /// Whether a dealing is ready for the next identification.
    pub ready: bool,
    /// Templates the ready dealing covers (0 when none is ready).
    pub comparisons: i64,
    /// Whether a refill is running now.
    pub refilling: bool,
    /// Wall time of the last finished refill (P2's dealing and both deliveries), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refill_ms: Option<f64>,
    /// Of it, P2's `face_dealer_stock` (dealing, sealing, answering the rows), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_deal_ms: Option<f64>,
    /// Sealed bytes of the last stocked dealing per evaluator (P0, P1): the preprocessing an
    /// identification over its list consumes.
    #[serde(default)]
    pub last_key_bytes: [u64; 2],
    /// Why the last refill failed, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Default)]
struct State {
    ready: Option<Stocked>,
    refilling: bool,
    last_refill_ms: Option<f64>,
    last_deal_ms: Option<f64>,
    last_key_bytes: [u64; 2],
    last_error: Option<String>,
}

/// The coordinator's stock of one pre-made dealing (module docs). Shared by the face routes.
#[derive(Default)]
pub struct FaceStock {
    state: Mutex<State>,
    changed: tokio::sync::Notify,
}

impl FaceStock {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the ready dealing for an identification (so two sessions never ask for one),
    /// after waiting for a running refill (at most `limit`).
    pub async fn take(&self, limit: Duration) -> Option<Stocked> {
        self.settled(limit).await;
        self.state().ready.take()
    }

    /// The current state.
    pub fn status(&self) -> StockStatus {
        let state = self.state();
        StockStatus {
            ready: state.ready.is_some(),
            comparisons: state
                .ready
                .as_ref()
                .map_or(0, |s| (s.ids.len() / 16) as i64),
            refilling: state.refilling,
            last_refill_ms: state.last_refill_ms,
            last_deal_ms: state.last_deal_ms,
            last_key_bytes: state.last_key_bytes,
            last_error: state.last_error.clone(),
        }
    }

    /// Waits until no refill runs (at most `limit`), then answers the state.
    pub async fn settled(&self, limit: Duration) -> StockStatus {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the check, so a refill ending in between still wakes us.
            let notified = self.changed.notified();
            if !self.state().refilling {
                return self.status();
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.status();
            }
        }
    }

    /// Starts a refill for the list `ids` (bundle ids, 16 bytes each) in the background unless
    /// one runs already.
    pub fn spawn_refill(self: &Arc<Self>, parties: Arc<Parties>, ids: Vec<u8>, timeout: Duration) {
        {
            let mut state = self.state();
            if state.refilling || ids.is_empty() {
                return;
            }
            state.refilling = true;
        }
        let stock = Arc::clone(self);
        tokio::spawn(async move {
            let started = Instant::now();
            let result = refill(&parties, &ids, timeout).await;
            let mut state = stock.state();
            state.refilling = false;
            state.last_refill_ms = Some(started.elapsed().as_secs_f64() * 1e3);
            match result {
                Ok(Refilled {
                    id,
                    generation,
                    key_bytes,
                    deal_ms,
                }) => {
                    state.ready = Some(Stocked::new(id, ids, generation));
                    state.last_deal_ms = Some(deal_ms);
                    state.last_key_bytes = key_bytes;
                    state.last_error = None;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "face stock refill failed; identifications deal on their path");
                    state.last_error = Some(e.to_string());
                }
            }
            drop(state);
            stock.changed.notify_waiters();
        });
    }
}

/// What one refill made.
struct Refilled {
    /// The stock id.
    id: [u8; 16],
    /// P2's configuration generation, read before it dealt.
    generation: i64,
    /// Sealed bytes each evaluator received.
    key_bytes: [u64; 2],
    /// Wall time of P2's dealing call (ms); the rest of the refill is the delivery.
    deal_ms: f64,
}

/// One refill: P2 deals for `ids` under a fresh stock id, P0 and P1 keep their halves.
async fn refill(
    parties: &Parties,
    ids: &[u8],
    timeout: Duration,
) -> Result<Refilled, FaceSessionError> {
    let mut id = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut id);
    let [e0, e1, e2] = parties.all();
    let dealer = e2.connect().await.map_err(FaceSessionError::Party)?;
    let dealing = Instant::now();
    let dealt = async {
        let generation = dealer_generation(&dealer, timeout).await?;
        let halves = deal_at(&dealer, DEAL_STOCK_SQL, &id, ids, timeout).await?;
        Ok::<_, FaceSessionError>((generation, halves))
    }
    .await;
    let deal_ms = dealing.elapsed().as_secs_f64() * 1e3;
    e2.give_back(dealer).await;
    let (generation, [k0, k1]) = dealt?;
    let sealed_len = |half: &[Vec<u8>]| half.iter().map(|c| c.len() as u64).sum::<u64>();
    let key_bytes = [sealed_len(&k0), sealed_len(&k1)];
    let (c0, c1) = futures::join!(e0.connect(), e1.connect());
    let (c0, c1) = (
        c0.map_err(FaceSessionError::Party)?,
        c1.map_err(FaceSessionError::Party)?,
    );
    let [p0, p1] = [PartyIndex::ALL[0], PartyIndex::ALL[1]];
    let (a, b) = futures::join!(
        keep(p0, &c0, &id, &k0, timeout),
        keep(p1, &c1, &id, &k1, timeout)
    );
    e0.give_back(c0).await;
    e1.give_back(c1).await;
    a?;
    b?;
    Ok(Refilled {
        id,
        generation,
        key_bytes,
        deal_ms,
    })
}

/// `face_masked_stock` at `party`: its half of the dealing under stock id `id`.
async fn keep(
    party: PartyIndex,
    client: &tokio_postgres::Client,
    id: &[u8; 16],
    chunks: &[Vec<u8>],
    timeout: Duration,
) -> Result<Option<i32>, FaceSessionError> {
    let stock: &[u8] = id;
    let row = call_with_timeout::<_, FaceSessionError>(
        party,
        client,
        "face_masked_stock",
        timeout,
        client.query_typed_one(
            "SELECT privmatch.face_masked_stock($1, $2)",
            &[(&stock, Type::BYTEA), (&chunks, Type::BYTEA_ARRAY)],
        ),
    )
    .await?;
    column::<i32>(party, &row, 0).map_err(FaceSessionError::Party)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stocked_dealing_is_taken_once() {
        let stock = FaceStock::default();
        assert_eq!(stock.take(Duration::from_secs(1)).await, None);
        assert_eq!(stock.status(), StockStatus::default());
        stock.state().ready = Some(Stocked::new([1; 16], vec![2; 48], 1));
        let status = stock.status();
        assert!(status.ready && !status.refilling);
        assert_eq!(status.comparisons, 3);
        let limit = Duration::from_secs(1);
        assert_eq!(stock.take(limit).await.map(|s| s.id), Some([1; 16]));
        assert_eq!(
            stock.take(limit).await,
            None,
            "a dealing serves one identification"
        );
    }

    #[tokio::test]
    async fn settled_answers_at_once_without_a_refill_and_waits_for_one() {
        let stock = Arc::new(FaceStock::default());
        assert!(!stock.settled(Duration::from_secs(5)).await.refilling);
        stock.state().refilling = true;
        let waiting = {
            let stock = Arc::clone(&stock);
            tokio::spawn(async move { stock.settled(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        {
            let mut state = stock.state();
            state.refilling = false;
            state.ready = Some(Stocked::new([3; 16], vec![4; 16], 2));
        }
        stock.changed.notify_waiters();
        let status = waiting.await.unwrap_or_default();
        assert!(status.ready && !status.refilling);
        // A refill that never ends: the wait gives up at its limit.
        stock.state().refilling = true;
        assert!(stock.settled(Duration::from_millis(10)).await.refilling);
    }
}
