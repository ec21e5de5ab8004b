//! The coordinator's face administration: the dealer's configuration (P2), the evaluators' key
//! pools (P0, P1) and their refill.
//!
//! A refill reads the pool level (the keys of the dealer's current generation that both P0
//! and P1 hold: the minimum of the two), then repeatedly asks P2 for a batch
//! (`face_dealer_generate`, autocommitted at P2: a batch that is never stored is simply never
//! used) and stores its two sealed halves at P0 and P1 in one distributed transaction (P2
//! takes part with its marker row only), until the level reaches the target. Either both
//! evaluators hold a batch or neither does, so a key can never be claimed at one evaluator
//! without its twin at the other.

use futures::future::join_all;
use privmatch_core::party::PartyIndex;
use tokio_postgres::Row;

use crate::face::api::{
    available_for, pool_level, DealerStatus, FacePoolResponse, FaceRefillBody, FaceRefillResponse,
    PartyPool, PoolRow,
};
use crate::face::work::{KeysStored, StoreKeys};
use crate::parties::{column, Parties, PartyError};
use crate::txn::twophase::TwoPhase;
use crate::txn::work::TxnError;

/// Why a refill stopped.
#[derive(Debug, thiserror::Error)]
pub enum RefillError {
    /// P2 has no configuration yet.
    #[error("the face dealer (P2) is not configured: run `privmatch face configure` first")]
    NotConfigured,
    /// A party failed outside a transaction (reading levels, generating keys).
    #[error("{0}")]
    Party(PartyError),
    /// Storing a batch failed (nothing of that batch was stored at either evaluator).
    #[error("storing a key batch: {0}")]
    Txn(TxnError),
    /// The parties answered something inconsistent.
    #[error("face refill: {0}")]
    Protocol(String),
}

/// The dealer's public state from a row (metric, dim, generation[, next_batch]).
fn dealer_of(party: PartyIndex, row: &Row) -> Result<DealerStatus, PartyError> {
    Ok(DealerStatus {
        metric: column(party, row, 0)?.unwrap_or_default(),
        dim: column(party, row, 1)?.unwrap_or(0),
        generation: column(party, row, 2)?.unwrap_or(0),
        next_batch: if row.len() > 3 {
            column(party, row, 3)?
        } else {
            None
        },
        retired_keys: None,
        warning: None,
    })
}

/// Sends the sealed dealer configuration to P2; returns its new public state.
pub async fn configure_dealer(
    parties: &Parties,
    sealed: &[u8],
) -> Result<DealerStatus, PartyError> {
    let p2 = &parties.all()[2];
    let row = p2
        .query_one(
            "SELECT metric, dim, generation FROM privmatch.face_dealer_configure($1)",
            &[&sealed],
        )
        .await?;
    dealer_of(p2.index, &row)
}

/// Retires, at P0 and P1, every key dealt under a dealer generation older than `generation`
/// (`face_keys_retire_before`), so that no comparison runs under an earlier configuration;
/// returns how many keys each retired. (The evaluators also retire them when the first batch
/// of the new generation is stored.)
pub async fn retire_older_keys(parties: &Parties, generation: i64) -> Result<[i64; 2], PartyError> {
    let answers = join_all(parties.all()[..2].iter().map(|p| async move {
        let row = p
            .query_one(
                "SELECT privmatch.face_keys_retire_before($1)",
                &[&generation],
            )
            .await?;
        Ok::<i64, PartyError>(column(p.index, &row, 0)?.unwrap_or(0))
    }))
    .await;
    let mut out = [0i64; 2];
    for (slot, answer) in out.iter_mut().zip(answers) {
        *slot = answer?;
    }
    Ok(out)
}

/// P2's public state; None when the dealer is not configured (no row, or SQLSTATE 55000).
pub async fn dealer_status(parties: &Parties) -> Result<Option<DealerStatus>, PartyError> {
    let p2 = &parties.all()[2];
    let rows = match p2
        .query(
            "SELECT metric, dim, generation, next_batch FROM privmatch.face_dealer_status()",
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        Err(err) if err.sqlstate.as_deref() == Some("55000") => return Ok(None),
        Err(err) => return Err(err),
    };
    rows.first().map(|row| dealer_of(p2.index, row)).transpose()
}

/// One evaluator's `face_pool_status()` rows.
pub async fn pool_rows(parties: &Parties, party: usize) -> Result<Vec<PoolRow>, PartyError> {
    let p = &parties.all()[party];
    let rows = p
        .query(
            "SELECT metric, dim, generation, available, batches FROM privmatch.face_pool_status()",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(PoolRow {
                metric: column(p.index, row, 0)?.unwrap_or_default(),
                dim: column(p.index, row, 1)?.unwrap_or(0),
                generation: column(p.index, row, 2)?.unwrap_or(0),
                available: column(p.index, row, 3)?.unwrap_or(0),
                batches: column(p.index, row, 4)?.unwrap_or(0),
            })
        })
        .collect()
}

/// P0's and P1's pools, or the first error.
async fn both_pools(parties: &Parties) -> Result<[Vec<PoolRow>; 2], PartyError> {
    let (a, b) = futures::join!(pool_rows(parties, 0), pool_rows(parties, 1));
    Ok([a?, b?])
}

/// The state of the dealer and of both pools, for `GET /v1/face/pool` (errors are reported
/// inside the answer, per party).
pub async fn pool_status(parties: &Parties) -> FacePoolResponse {
    let (dealer, pools) = futures::join!(
        dealer_status(parties),
        join_all([0, 1].map(|p| pool_rows(parties, p)))
    );
    let (dealer, dealer_error) = match dealer {
        Ok(d) => (d, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let generation = dealer.as_ref().map(|d| d.generation);
    let mut parties_out = Vec::with_capacity(2);
    let mut rows: Vec<Option<Vec<PoolRow>>> = Vec::with_capacity(2);
    for (party, answer) in pools.into_iter().enumerate() {
        match answer {
            Ok(pools) => {
                let available = generation.map(|g| available_for(&pools, g));
                parties_out.push(PartyPool {
                    party: party as u8,
                    pools: pools.clone(),
                    available,
                    error: None,
                });
                rows.push(Some(pools));
            }
            Err(e) => {
                parties_out.push(PartyPool {
                    party: party as u8,
                    pools: Vec::new(),
                    available: None,
                    error: Some(e.to_string()),
                });
                rows.push(None);
            }
        }
    }
    let level = match (generation, rows.first(), rows.get(1)) {
        (Some(g), Some(Some(a)), Some(Some(b))) => Some(pool_level([a, b], g).1),
        _ => None,
    };
    FacePoolResponse {
        dealer,
        dealer_error,
        parties: parties_out,
        level,
    }
}

/// What P2 answered to `face_dealer_generate`.
struct GeneratedBatch {
    batch: i64,
    generation: i64,
    keys: i32,
    envelopes: [Vec<u8>; 2],
}

async fn generate(parties: &Parties, count: i32) -> Result<GeneratedBatch, PartyError> {
    let p2 = &parties.all()[2];
    let row = p2
        .query_one(
            "SELECT batch, generation, keys, envelope_p0, envelope_p1 \
             FROM privmatch.face_dealer_generate($1)",
            &[&count],
        )
        .await?;
    let at = |index| column::<Vec<u8>>(p2.index, &row, index);
    Ok(GeneratedBatch {
        batch: column(p2.index, &row, 0)?.unwrap_or(-1),
        generation: column(p2.index, &row, 1)?.unwrap_or(-1),
        keys: column(p2.index, &row, 2)?.unwrap_or(-1),
        envelopes: [at(3)?.unwrap_or_default(), at(4)?.unwrap_or_default()],
    })
}

/// How many keys the next batch gets: `batch_size`, but no more than the level still lacks.
pub fn next_batch_size(target: i64, level: i64, batch_size: i32) -> Option<i32> {
    let missing = target.saturating_sub(level);
    if missing <= 0 {
        return None;
    }
    Some(i64::from(batch_size).min(missing) as i32)
}

/// Refills the pools towards `body.target` (see the module docs).
pub async fn refill(
    parties: &Parties,
    txns: &TwoPhase,
    body: &FaceRefillBody,
) -> Result<FaceRefillResponse, RefillError> {
    body.validate().map_err(RefillError::Protocol)?;
    let dealer = dealer_status(parties)
        .await
        .map_err(RefillError::Party)?
        .ok_or(RefillError::NotConfigured)?;
    let pools = both_pools(parties).await.map_err(RefillError::Party)?;
    let (_, before) = pool_level([&pools[0], &pools[1]], dealer.generation);
    let mut level = before;
    let mut batches = 0u32;
    let mut keys = 0i64;
    let mut pending_recovery = Vec::new();
    while let Some(count) = next_batch_size(body.target, level, body.batch_size) {
        if body.max_batches.is_some_and(|m| batches >= m) {
            break;
        }
        let generated = generate(parties, count).await.map_err(RefillError::Party)?;
        if generated.generation != dealer.generation {
            return Err(RefillError::Protocol(format!(
                "the dealer was reconfigured during the refill (generation {} → {}); run the refill again",
                dealer.generation, generated.generation
            )));
        }
        if generated.keys != count || generated.envelopes.iter().any(Vec::is_empty) {
            return Err(RefillError::Protocol(format!(
                "P2 answered batch {} with {} keys for {count} asked",
                generated.batch, generated.keys
            )));
        }
        let work = StoreKeys {
            envelopes: generated.envelopes,
        };
        let stored = txns.run(&work).await.map_err(RefillError::Txn)?;
        let expected = KeysStored {
            batch: generated.batch,
            keys: count,
        };
        if stored.result != expected {
            return Err(RefillError::Protocol(format!(
                "the evaluators stored {:?}, expected {expected:?}",
                stored.result
            )));
        }
        pending_recovery.extend(stored.pending_recovery());
        batches += 1;
        keys += i64::from(count);
        level += i64::from(count);
    }
    // Re-read: sessions may have consumed keys meanwhile.
    let pools = both_pools(parties).await.map_err(RefillError::Party)?;
    let (_, after) = pool_level([&pools[0], &pools[1]], dealer.generation);
    Ok(FaceRefillResponse {
        target: body.target,
        before,
        after,
        batches,
        keys,
        reached: after >= body.target,
        dealer,
        pending_recovery,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_never_overshoot_the_target() {
        assert_eq!(next_batch_size(10_000, 0, 4_000), Some(4_000));
        assert_eq!(next_batch_size(10_000, 8_000, 4_000), Some(2_000));
        assert_eq!(next_batch_size(10_000, 10_000, 4_000), None);
        assert_eq!(next_batch_size(10_000, 12_000, 4_000), None);
        assert_eq!(next_batch_size(0, 0, 1), None);
        assert_eq!(next_batch_size(i64::MAX, i64::MIN, 50_000), Some(50_000));
    }
}
