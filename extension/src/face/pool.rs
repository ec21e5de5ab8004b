//! The single-use key pool of P0 and P1: storing the dealer's sealed batches, the pool level,
//! and claiming keys for a session.
//!
//! Keys are addressed as (batch, index). A claim is a committed row of
//! `privmatch.face_key_claims` naming a range of one batch and the session it belongs to; the
//! table's exclusion constraint forbids two overlapping claims, so no key can be handed to
//! two sessions whatever happens above it (concurrent sessions, a replayed batch, a crash).
//! P0 chooses the ranges (the lowest unclaimed keys of the newest generation, with the batch
//! rows locked so concurrent sessions take disjoint ranges); P1 claims exactly P0's ranges.
//! Claims are never deleted; a replayed batch is refused by its number.

use pgrx::prelude::*;
use privmatch_core::face::dealer::open_key_batch;
use privmatch_core::face::encoding::evaluator;
use privmatch_core::face::{FaceError, Metric};
use privmatch_core::party::PartyIndex;

use super::raise_face;
use crate::errors::{get_one, modify, raise, raise_spi, run, select};
use crate::identity::{load_identity, pinned_peer};

/// A claimed range of keys: `count` keys of `batch` from index `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Claim {
    /// The batch number.
    pub batch: i64,
    /// Index of the first key claimed in the batch.
    pub first: i32,
    /// Number of keys claimed.
    pub count: i32,
}

/// Bytes of one encoded claim: batch (u64), first (u32), count (u32), little-endian.
const CLAIM_LEN: usize = 16;

/// Encodes claims for the coordinator to pass from P0 to P1 (opaque to it).
pub(super) fn encode_claims(claims: &[Claim]) -> Vec<u8> {
    let mut out = Vec::with_capacity(claims.len() * CLAIM_LEN);
    for c in claims {
        out.extend_from_slice(&(c.batch as u64).to_le_bytes());
        out.extend_from_slice(&(c.first as u32).to_le_bytes());
        out.extend_from_slice(&(c.count as u32).to_le_bytes());
    }
    out
}

/// Decodes claims; refuses malformed bytes and out-of-range fields.
pub(super) fn decode_claims(function: &str, bytes: &[u8]) -> Vec<Claim> {
    let bad = || -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: claims are malformed"),
            None,
        )
    };
    if !bytes.len().is_multiple_of(CLAIM_LEN) {
        bad();
    }
    bytes
        .chunks_exact(CLAIM_LEN)
        .map(|c| {
            let word = |i: usize| u32::from_le_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
            let batch = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            let (first, count) = (word(8), word(12));
            if batch == 0 || batch >= 1 << 39 || first >= 1 << 24 || count == 0 || count >= 1 << 24
            {
                bad();
            }
            Claim {
                batch: batch as i64,
                first: first as i32,
                count: count as i32,
            }
        })
        .collect()
}

/// Stores one half of a key batch dealt by P2 (sealed to this party). Refuses a batch that
/// is not sealed to this party, tampered, of an unsupported layout, or already stored (a
/// replay: 23505). When the batch belongs to a newer dealer generation, the keys of older
/// generations are retired (never claimed again). Returns the batch number and key count.
#[pg_extern(volatile)]
fn face_keys_store(
    envelope: &[u8],
) -> TableIterator<'static, (name!(batch, i64), name!(keys, i32))> {
    const F: &str = "face_keys_store";
    let me = load_identity();
    evaluator(me.index).unwrap_or_else(|e| raise_face(F, e));
    let dealer = PartyIndex::ALL[2];
    let pair = crate::identity::CHANNELS
        .derive(me.index, &me.secret, dealer, &pinned_peer(F, dealer))
        .unwrap_or_else(|e| raise_face(F, e.into()));
    let (header, keys) =
        open_key_batch(me.index, &pair, envelope).unwrap_or_else(|e| raise_face(F, e));
    if header.batch == 0 || header.batch >= 1 << 39 || header.count >= 1 << 24 {
        raise_face(
            F,
            FaceError::Malformed("key batch: number or count out of range"),
        );
    }
    let batch = header.batch as i64;
    Spi::connect_mut(|client| {
        let inserted = client
            .update(
                "INSERT INTO privmatch.face_key_batches \
                 (batch, generation, metric, dim, key_count, key_len, keys) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (batch) DO NOTHING RETURNING 1",
                None,
                &[
                    batch.into(),
                    (header.generation as i64).into(),
                    header.metric.as_str().into(),
                    (header.dim as i32).into(),
                    (header.count as i32).into(),
                    (header.key_len as i32).into(),
                    keys.into(),
                ],
            )
            .unwrap_or_else(|e| raise_spi(F, e))
            .len();
        if inserted == 0 {
            raise(
                PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                format!("{F}: key batch {batch} was already stored: refusing a replayed batch"),
                None,
            );
        }
        // Retire older generations (a new metric, dimension or threshold), and drop the key
        // bytes of batches no open session can still need.
        client
            .update(
                "UPDATE privmatch.face_key_batches SET next_key = key_count \
                 WHERE generation < $1 AND next_key < key_count",
                None,
                &[(header.generation as i64).into()],
            )
            .unwrap_or_else(|e| raise_spi(F, e));
        client
            .update(
                "UPDATE privmatch.face_key_batches b SET keys = ''::bytea \
                 WHERE next_key = key_count AND length(keys) > 0 AND NOT EXISTS ( \
                   SELECT 1 FROM privmatch.face_key_claims c \
                     JOIN privmatch.face_sessions s ON s.session = c.session \
                    WHERE c.batch = b.batch AND s.finished_at IS NULL)",
                None,
                &[],
            )
            .unwrap_or_else(|e| raise_spi(F, e));
    });
    TableIterator::once((batch, header.count as i32))
}

/// Retires every key dealt under a dealer generation older than `generation` (after the
/// dealer was reconfigured: another metric, dimension or threshold), so that no comparison
/// runs under the old configuration. Retired keys are never claimed. Returns how many keys
/// were retired.
#[pg_extern(volatile)]
fn face_keys_retire_before(generation: i64) -> i64 {
    const F: &str = "face_keys_retire_before";
    evaluator(load_identity().index).unwrap_or_else(|e| raise_face(F, e));
    get_one::<i64>(
        F,
        "WITH old AS (SELECT batch, key_count - next_key AS n FROM privmatch.face_key_batches \
                       WHERE generation < $1 AND next_key < key_count FOR UPDATE), \
              r AS (UPDATE privmatch.face_key_batches b SET next_key = b.key_count \
                      FROM old WHERE b.batch = old.batch RETURNING old.n) \
         SELECT coalesce(sum(n), 0)::bigint FROM r",
        &[generation.into()],
    )
    .unwrap_or(0)
}

/// The key pool at this party: per metric, dimension and dealer generation, the keys still
/// available and the batches holding them. Empty when the pool is empty.
#[pg_extern(stable)]
fn face_pool_status() -> TableIterator<
    'static,
    (
        name!(metric, String),
        name!(dim, i32),
        name!(generation, i64),
        name!(available, i64),
        name!(batches, i64),
    ),
> {
    let rows = select(
        "face_pool_status",
        "SELECT metric, dim, generation, available, batches FROM privmatch.face_key_pool \
         WHERE available > 0 ORDER BY generation DESC",
        &[],
        |row| {
            (
                row.get::<String>(1).unwrap_or_default(),
                row.get::<i32>(2).unwrap_or_default(),
                row.get::<i64>(3).unwrap_or_default(),
                row.get::<i64>(4).unwrap_or_default(),
                row.get::<i64>(5).unwrap_or_default(),
            )
        },
    );
    TableIterator::new(rows)
}

/// The metric and dimension of the newest generation in the pool, if any.
pub(super) fn pool_parameters(function: &str) -> Option<(Metric, usize, i64)> {
    let row = Spi::get_three::<String, i32, i64>(
        "SELECT metric, dim, generation FROM privmatch.face_key_batches \
         ORDER BY generation DESC LIMIT 1",
    );
    match row {
        Ok((Some(metric), Some(dim), Some(generation))) => Some((
            Metric::parse(&metric).unwrap_or_else(|e| raise_face(function, e)),
            dim as usize,
            generation,
        )),
        Ok(_) => None,
        Err(pgrx::spi::SpiError::InvalidPosition) => None,
        Err(e) => raise_spi(function, e),
    }
}

fn record_claim(function: &str, claim: &Claim, session: &[u8]) {
    let overlapping = get_one::<bool>(
        function,
        "SELECT EXISTS (SELECT 1 FROM privmatch.face_key_claims \
          WHERE int8range(batch * 16777216 + first_key, batch * 16777216 + first_key + key_count) \
             && int8range($1 * 16777216 + $2, $1 * 16777216 + $2 + $3))",
        &[claim.batch.into(), claim.first.into(), claim.count.into()],
    )
    .unwrap_or(true);
    if overlapping {
        raise(
            PgSqlErrorCode::ERRCODE_EXCLUSION_VIOLATION,
            format!(
                "{function}: keys {}..{} of batch {} were already used: refusing to reuse key material",
                claim.first,
                claim.first + claim.count,
                claim.batch
            ),
            None,
        );
    }
    // The exclusion constraint is the backstop for a concurrent claim between the check
    // above and this insert.
    run(
        function,
        "INSERT INTO privmatch.face_key_claims (batch, first_key, key_count, session) \
         VALUES ($1, $2, $3, $4)",
        &[
            claim.batch.into(),
            claim.first.into(),
            claim.count.into(),
            session.to_vec().into(),
        ],
    );
}

/// P0: claims the `needed` lowest unclaimed keys of the newest generation for `session`,
/// locking the batch rows so concurrent sessions take disjoint keys. An exhausted pool is a
/// 53000 error and changes nothing.
pub(super) fn claim_fresh(
    function: &str,
    session: &[u8],
    needed: usize,
    generation: i64,
) -> Vec<Claim> {
    let batches = modify(
        function,
        "SELECT batch, next_key, key_count FROM privmatch.face_key_batches \
         WHERE generation = $1 AND next_key < key_count ORDER BY batch FOR UPDATE",
        &[generation.into()],
        |row| {
            (
                row.get::<i64>(1).unwrap_or_default(),
                row.get::<i32>(2).unwrap_or_default(),
                row.get::<i32>(3).unwrap_or_default(),
            )
        },
    );
    let available: i64 = batches
        .iter()
        .map(|(_, next, count)| i64::from(count - next))
        .sum();
    if available < needed as i64 {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            format!(
                "{function}: the face key pool is exhausted: this comparison needs {needed} keys, {available} are left"
            ),
            Some("run privmatch face refill (the dealer P2 makes new single-use keys)"),
        );
    }
    let mut claims = Vec::new();
    let mut left = needed as i32;
    for (batch, next, count) in batches {
        if left == 0 {
            break;
        }
        let take = left.min(count - next);
        let claim = Claim {
            batch,
            first: next,
            count: take,
        };
        record_claim(function, &claim, session);
        advance(function, &claim);
        claims.push(claim);
        left -= take;
    }
    claims
}

/// Moves a batch's `next_key` past a claim.
fn advance(function: &str, claim: &Claim) {
    run(
        function,
        "UPDATE privmatch.face_key_batches SET next_key = greatest(next_key, $2) WHERE batch = $1",
        &[claim.batch.into(), (claim.first + claim.count).into()],
    );
}

/// P1: claims exactly the ranges P0 chose. Refuses ranges that are unknown here, belong to
/// another generation, or were already used.
pub(super) fn claim_given(function: &str, session: &[u8], claims: &[Claim], generation: i64) {
    for claim in claims {
        let row = modify(
            function,
            "SELECT generation, key_count FROM privmatch.face_key_batches \
             WHERE batch = $1 FOR UPDATE",
            &[claim.batch.into()],
            |row| (row.get::<i64>(1), row.get::<i32>(2)),
        )
        .into_iter()
        .next();
        let (batch_generation, key_count) = match row {
            Some((Some(g), Some(k))) => (g, k),
            _ => raise(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "{function}: key batch {} is not in this party's pool (P0 and P1 pools differ)",
                    claim.batch
                ),
                Some("run privmatch face refill; the coordinator stores every batch at both parties atomically"),
            ),
        };
        if batch_generation != generation {
            raise(
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                format!(
                    "{function}: key batch {} belongs to dealer generation {batch_generation}, this party's pool is at {generation}",
                    claim.batch
                ),
                Some("the dealer was reconfigured or a refill is in flight: retry with a new session"),
            );
        }
        if claim.first + claim.count > key_count {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "{function}: claim of keys {}..{} of batch {} does not fit this party's pool",
                    claim.first,
                    claim.first + claim.count,
                    claim.batch
                ),
                None,
            );
        }
        record_claim(function, claim, session);
        advance(function, claim);
    }
}

/// Reads the key bytes of a session's claims, in claim order.
pub(super) fn read_keys(function: &str, claims: &[Claim], key_len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for claim in claims {
        let bytes = get_one::<Vec<u8>>(
            function,
            "SELECT (SELECT substring(keys FROM $2 FOR $3) FROM privmatch.face_key_batches WHERE batch = $1)",
            &[
                claim.batch.into(),
                // Batches hold at most 50,000 keys of under 1 KB: offsets fit an int4.
                (claim.first * key_len as i32 + 1).into(),
                (claim.count * key_len as i32).into(),
            ],
        )
        .unwrap_or_default();
        if bytes.len() != claim.count as usize * key_len {
            raise(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "{function}: the key material of batch {} is no longer available (retired by a newer dealer configuration)",
                    claim.batch
                ),
                Some("start a new session"),
            );
        }
        out.extend_from_slice(&bytes);
    }
    out
}
