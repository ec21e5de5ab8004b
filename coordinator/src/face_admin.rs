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

use crate::face_api::{
    available_for, pool_level, DealerStatus, FacePoolResponse, FaceRefillBody, FaceRefillResponse,
    PartyPool, PoolRow,
};
use crate::parties::{Parties, PartyError};
use crate::twophase::{PartyWork, TwoPhase, TxnError, WorkResult};

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

/// Sends the sealed dealer configuration to P2; returns its new public state.
pub async fn configure_dealer(
    parties: &Parties,
    sealed: &[u8],
) -> Result<DealerStatus, PartyError> {
    let p2 = &parties.all()[2];
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(p2.index, &e);
    let client = p2.connect().await?;
    let row = client
        .query_one(
            "SELECT metric, dim, generation FROM privmatch.face_dealer_configure($1)",
            &[&sealed],
        )
        .await
        .map_err(pg)?;
    let status = DealerStatus {
        metric: row
            .try_get::<_, Option<String>>(0)
            .map_err(pg)?
            .unwrap_or_default(),
        dim: row.try_get::<_, Option<i32>>(1).map_err(pg)?.unwrap_or(0),
        generation: row.try_get::<_, Option<i64>>(2).map_err(pg)?.unwrap_or(0),
        next_batch: None,
        retired_keys: None,
        warning: None,
    };
    p2.give_back(client).await;
    Ok(status)
}

/// Retires, at P0 and P1, every key dealt under a dealer generation older than `generation`
/// (`face_keys_retire_before`), so that no comparison runs under an earlier configuration;
/// returns how many keys each retired. (The evaluators also retire them when the first batch
/// of the new generation is stored.)
pub async fn retire_older_keys(parties: &Parties, generation: i64) -> Result<[i64; 2], PartyError> {
    let answers = join_all(parties.all()[..2].iter().map(|p| async move {
        let pg = |e: tokio_postgres::Error| PartyError::from_pg(p.index, &e);
        let client = p.connect().await?;
        let row = client
            .query_one(
                "SELECT privmatch.face_keys_retire_before($1)",
                &[&generation],
            )
            .await
            .map_err(pg)?;
        let retired: Option<i64> = row.try_get(0).map_err(pg)?;
        p.give_back(client).await;
        Ok::<i64, PartyError>(retired.unwrap_or(0))
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
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(p2.index, &e);
    let client = p2.connect().await?;
    let rows = match client
        .query(
            "SELECT metric, dim, generation, next_batch FROM privmatch.face_dealer_status()",
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            let err = pg(e);
            if err.sqlstate.as_deref() == Some("55000") {
                p2.give_back(client).await;
                return Ok(None);
            }
            return Err(err);
        }
    };
    let status = match rows.first() {
        None => None,
        Some(row) => Some(DealerStatus {
            metric: row
                .try_get::<_, Option<String>>(0)
                .map_err(pg)?
                .unwrap_or_default(),
            dim: row.try_get::<_, Option<i32>>(1).map_err(pg)?.unwrap_or(0),
            generation: row.try_get::<_, Option<i64>>(2).map_err(pg)?.unwrap_or(0),
            next_batch: row.try_get::<_, Option<i64>>(3).map_err(pg)?,
            retired_keys: None,
            warning: None,
        }),
    };
    p2.give_back(client).await;
    Ok(status)
}

/// One evaluator's `face_pool_status()` rows.
pub async fn pool_rows(parties: &Parties, party: usize) -> Result<Vec<PoolRow>, PartyError> {
    let p = &parties.all()[party];
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(p.index, &e);
    let client = p.connect().await?;
    let rows = client
        .query(
            "SELECT metric, dim, generation, available, batches FROM privmatch.face_pool_status()",
            &[],
        )
        .await
        .map_err(pg)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        out.push(PoolRow {
            metric: row
                .try_get::<_, Option<String>>(0)
                .map_err(pg)?
                .unwrap_or_default(),
            dim: row.try_get::<_, Option<i32>>(1).map_err(pg)?.unwrap_or(0),
            generation: row.try_get::<_, Option<i64>>(2).map_err(pg)?.unwrap_or(0),
            available: row.try_get::<_, Option<i64>>(3).map_err(pg)?.unwrap_or(0),
            batches: row.try_get::<_, Option<i64>>(4).map_err(pg)?.unwrap_or(0),
        });
    }
    p.give_back(client).await;
    Ok(out)
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
    let pg = |e: tokio_postgres::Error| PartyError::from_pg(p2.index, &e);
    let client = p2.connect().await?;
    let row = client
        .query_one(
            "SELECT batch, generation, keys, envelope_p0, envelope_p1 \
             FROM privmatch.face_dealer_generate($1)",
            &[&count],
        )
        .await
        .map_err(pg)?;
    let batch = GeneratedBatch {
        batch: row.try_get::<_, Option<i64>>(0).map_err(pg)?.unwrap_or(-1),
        generation: row.try_get::<_, Option<i64>>(1).map_err(pg)?.unwrap_or(-1),
        keys: row.try_get::<_, Option<i32>>(2).map_err(pg)?.unwrap_or(-1),
        envelopes: [
            row.try_get::<_, Option<Vec<u8>>>(3)
                .map_err(pg)?
                .unwrap_or_default(),
            row.try_get::<_, Option<Vec<u8>>>(4)
                .map_err(pg)?
                .unwrap_or_default(),
        ],
    };
    p2.give_back(client).await;
    Ok(batch)
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
        let [e0, e1] = generated.envelopes;
        let work = [
            PartyWork::FaceKeys { envelope: e0 },
            PartyWork::FaceKeys { envelope: e1 },
            PartyWork::MarkerOnly,
        ];
        let (result, pending) = txns.run(work).await.map_err(RefillError::Txn)?;
        let expected = WorkResult::KeysStored {
            batch: generated.batch,
            keys: count,
        };
        if result != expected {
            return Err(RefillError::Protocol(format!(
                "the evaluators stored {result:?}, expected {expected:?}"
            )));
        }
        pending_recovery.extend(pending.iter().map(ToString::to_string));
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
