//! The dealer (P2): its configuration (metric, dimension, secret threshold) and the
//! generation of key batches sealed to P0 and P1 (Funshade `setup`, offline phase).

use pgrx::prelude::*;
use privmatch_core::crypto::seal::PairwiseSecrets;
use privmatch_core::face::dealer::{
    open_dealer_config, seal_key_batch, DealerConfig, KeyBatchHeader, DEALER_CONFIG_ACTION,
};
use privmatch_core::face::funshade::{deal_batch, DealerParams, COMPARISON_KEY_LEN};
use privmatch_core::face::Metric;
use privmatch_core::party::PartyIndex;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::raise_face;
use crate::errors::{get_one, modify, raise};
use crate::identity::{load_identity, pinned_peer, Identity};
use crate::operator::accept_command;

/// Most keys one `face_dealer_generate` call makes (a batch of 50,000 is ~36 MB per party).
const MAX_BATCH: i32 = 50_000;

fn dealer_identity(function: &str) -> Identity {
    let me = load_identity();
    if me.index != PartyIndex::ALL[2] {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function}: this party is {}; only P2 deals face keys",
                me.index
            ),
            None,
        );
    }
    me
}

/// Stores the dealer configuration sealed to this party (P2) by the operator's CLI: metric,
/// dimension and the secret threshold, which never leaves P2 in any form but the keys it
/// deals. `command` is an operator command (core's `crypto::sign`, action
/// [`DEALER_CONFIG_ACTION`]) signed by P2's operator key and carrying the sealed
/// configuration: the coordinator relays it but can neither forge one (a threshold of its
/// choosing would make every face match) nor replay an old one. Starts a new key generation: P0 and P1 retire keys of older generations when the
/// first batch of the new one arrives. Returns the metric, dimension and generation.
#[pg_extern(volatile)]
fn face_dealer_configure(
    command: &[u8],
) -> TableIterator<
    'static,
    (
        name!(metric, String),
        name!(dim, i32),
        name!(generation, i64),
    ),
> {
    const F: &str = "face_dealer_configure";
    let me = dealer_identity(F);
    let config = accept_command(F, DEALER_CONFIG_ACTION, command);
    let opened =
        open_dealer_config(me.index, &me.secret, &config).unwrap_or_else(|e| raise_face(F, e));
    let generation = get_one::<i64>(
        F,
        "INSERT INTO privmatch.face_dealer (metric, dim, threshold, generation) \
         VALUES ($1, $2, $3, 1) \
         ON CONFLICT (singleton) DO UPDATE SET metric = EXCLUDED.metric, dim = EXCLUDED.dim, \
             threshold = EXCLUDED.threshold, generation = privmatch.face_dealer.generation + 1, \
             configured_at = now() \
         RETURNING generation",
        &[
            opened.metric.as_str().into(),
            (opened.dim as i32).into(),
            opened.threshold.into(),
        ],
    )
    .unwrap_or_default();
    TableIterator::once((
        opened.metric.as_str().to_owned(),
        opened.dim as i32,
        generation,
    ))
}

/// The dealer's public state: metric, dimension, generation and next batch number (never the
/// threshold). No rows when unconfigured.
#[pg_extern(stable)]
fn face_dealer_status() -> TableIterator<
    'static,
    (
        name!(metric, String),
        name!(dim, i32),
        name!(generation, i64),
        name!(next_batch, i64),
    ),
> {
    let row = Spi::get_three::<String, i32, i64>(
        "SELECT metric, dim, generation FROM privmatch.face_dealer",
    );
    let next = Spi::get_one::<i64>("SELECT next_batch FROM privmatch.face_dealer");
    match (row, next) {
        (Ok((Some(metric), Some(dim), Some(generation))), Ok(Some(next))) => {
            TableIterator::once((metric, dim, generation, next))
        }
        _ => TableIterator::new(Vec::new()),
    }
}

/// Deals `count` comparison keys (1..=50,000) as one new batch: returns its number, the
/// generation, metric and dimension, and the two halves sealed to P0 and P1. The batch
/// number is taken from the dealer's counter in this transaction, so no two batches share
/// one.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile)]
fn face_dealer_generate(
    count: i32,
) -> TableIterator<
    'static,
    (
        name!(batch, i64),
        name!(generation, i64),
        name!(metric, String),
        name!(dim, i32),
        name!(keys, i32),
        name!(envelope_p0, Vec<u8>),
        name!(envelope_p1, Vec<u8>),
    ),
> {
    const F: &str = "face_dealer_generate";
    if !(1..=MAX_BATCH).contains(&count) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: count must be 1..={MAX_BATCH}, got {count}"),
            None,
        );
    }
    let me = dealer_identity(F);
    let row = modify(
        F,
        "UPDATE privmatch.face_dealer SET next_batch = next_batch + 1 \
         RETURNING next_batch - 1, generation, metric, dim, threshold",
        &[],
        |row| {
            (
                row.get::<i64>(1).unwrap_or_default(),
                row.get::<i64>(2).unwrap_or_default(),
                row.get::<String>(3).unwrap_or_default(),
                row.get::<i32>(4).unwrap_or_default(),
                row.get::<f64>(5).unwrap_or_default(),
            )
        },
    )
    .into_iter()
    .next();
    let Some((batch, generation, metric, dim, threshold)) = row else {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{F}: the dealer is not configured"),
            Some("run privmatch face configure --metric cosine|euclidean --threshold T --dim L"),
        );
    };
    let metric = Metric::parse(&metric).unwrap_or_else(|e| raise_face(F, e));
    let config = DealerConfig {
        metric,
        dim: dim as usize,
        threshold,
    };
    let params = DealerParams::new(&config).unwrap_or_else(|e| raise_face(F, e));
    let mut rng = ChaCha20Rng::from_entropy();
    let halves = deal_batch(&params, count as usize, &mut rng);
    let envelopes: Vec<Vec<u8>> = halves
        .iter()
        .enumerate()
        .map(|(b, keys)| {
            let header = KeyBatchHeader {
                party: b as u8,
                batch: batch as u64,
                generation: generation as u64,
                metric,
                dim: dim as usize,
                count: count as usize,
                key_len: COMPARISON_KEY_LEN,
            };
            let evaluator = PartyIndex::ALL[b];
            let peer = pinned_peer(F, evaluator);
            let pair = PairwiseSecrets::derive(me.index, &me.secret, evaluator, &peer)
                .unwrap_or_else(|e| raise_face(F, e.into()));
            seal_key_batch(&header, keys, &pair, &mut rng)
        })
        .collect();
    let [p0, p1]: [Vec<u8>; 2] = envelopes
        .try_into()
        .unwrap_or_else(|_| unreachable!("two evaluators"));
    TableIterator::once((
        batch,
        generation,
        metric.as_str().to_owned(),
        dim,
        count,
        p0,
        p1,
    ))
}
