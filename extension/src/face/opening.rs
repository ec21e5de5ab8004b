//! The one opening of enrolled face templates at the evaluators P0 and P1 (docs/protocols/
//! face.md §6 step 1; core's `face::opening`), driven by the coordinator for the templates
//! a party has not opened yet:
//!
//! 1. `face_masked_pending()` at P0 and P1: enrolled templates not opened here.
//! 2. `face_dealer_template_seeds(b, ids)` at P2 (sealed mask seeds, [`super::dealer`]).
//! 3. `face_masked_prepare(ids, seeds)` at P_b: Y_b = y_b + δy_b sealed for the other evaluator.
//! 4. `face_masked_accept(ids, seeds, peer)` at P_b: Δy = Y_0 + Y_1 stored in
//!    `privmatch.face_masked_templates` with this party's seed; the engine loads it before
//!    the next face session.
//!
//! Every step may be repeated: the seeds and hence Y_b are the same each time (derived from
//! P2's master key and the bundle id), and an opened template is stored once.

use std::collections::HashMap;

use pgrx::prelude::*;
use privmatch_core::crypto::seal::PairwiseSecrets;
use privmatch_core::face::encoding::{evaluator, EmbeddingShare};
use privmatch_core::face::funshade::words_to_bytes;
use privmatch_core::face::mask_dealer::open_template_seeds;
use privmatch_core::face::masked::{masked_template_share, BUNDLE_ID_LEN};
use privmatch_core::face::opening::{open_opening, seal_opening};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::{decode_share, ShareKind};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use zeroize::Zeroize;

use super::dealer::parse_bundle_ids;
use super::raise_face;
use crate::errors::{modify, raise, raise_share_layout, select};
use crate::identity::{load_identity, pinned_peer, Identity};

/// This evaluator's identity and its index b (55000 at P2).
fn evaluator_identity(function: &str) -> (Identity, usize) {
    let me = load_identity();
    let b = evaluator(me.index).unwrap_or_else(|e| raise_face(function, e));
    (me, b)
}

fn pair_with(function: &str, me: &Identity, other: PartyIndex) -> PairwiseSecrets {
    let key = pinned_peer(function, other);
    crate::identity::CHANNELS
        .derive(me.index, &me.secret, other, &key)
        .unwrap_or_else(|e| raise_face(function, e.into()))
}

/// This party's shares of the templates `ids`, in order (40001 if one is not enrolled here:
/// an enrolment or deletion is in flight).
fn shares_of(function: &str, ids: &[[u8; BUNDLE_ID_LEN]]) -> Vec<EmbeddingShare> {
    let keys: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
    let mut by_id: HashMap<Vec<u8>, (Vec<u8>, i32)> = select(
        function,
        "SELECT bundle_id, privmatch.face_share_send(template), norm_share \
           FROM privmatch.face_templates WHERE bundle_id = ANY($1)",
        &[keys.into()],
        |row| {
            (
                row.get::<Vec<u8>>(1).unwrap_or_default(),
                (
                    row.get::<Vec<u8>>(2).unwrap_or_default(),
                    row.get::<i32>(3).unwrap_or_default(),
                ),
            )
        },
    )
    .into_iter()
    .collect();
    ids.iter()
        .map(|id| {
            let Some((bytes, norm)) = by_id.remove(id.as_slice()) else {
                raise(
                    PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                    format!(
                        "{function}: face template {} is not enrolled at this party",
                        hex::encode(id)
                    ),
                    Some("an enrolment or deletion is in flight: retry"),
                );
            };
            let view = decode_share(ShareKind::FaceTemplate, &bytes)
                .unwrap_or_else(|e| raise_share_layout(e));
            EmbeddingShare {
                elements: view.words(),
                norm: norm as u32,
            }
        })
        .collect()
}

/// The mask seeds P2 sealed for this evaluator and the list `ids` (08P01 if refused).
fn seeds_for(
    function: &str,
    me: &Identity,
    ids: &[[u8; BUNDLE_ID_LEN]],
    sealed: &[u8],
) -> Vec<[u8; 16]> {
    let from_dealer = pair_with(function, me, PartyIndex::ALL[2]);
    open_template_seeds(me.index, &from_dealer, ids, sealed).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("{function}: the dealer's seeds were refused: {e}"),
            None,
        )
    })
}

/// The bundle ids of enrolled face templates this evaluator has not opened yet, at most
/// `max_count`, in byte order. Empty once every enrolled template is opened.
#[pg_extern(stable)]
fn face_masked_pending(max_count: default!(i32, 10000)) -> Vec<Vec<u8>> {
    const F: &str = "face_masked_pending";
    evaluator_identity(F);
    if max_count < 1 {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: max_count must be at least 1, got {max_count}"),
            None,
        );
    }
    select(
        F,
        "SELECT t.bundle_id FROM privmatch.face_templates t \
          WHERE NOT EXISTS (SELECT 1 FROM privmatch.face_masked_templates m \
                             WHERE m.bundle_id = t.bundle_id) \
          ORDER BY t.bundle_id LIMIT $1",
        &[max_count.into()],
        |row| row.get::<Vec<u8>>(1).unwrap_or_default(),
    )
}

/// Step 3 of the opening: this evaluator's Y_b = y_b + δy_b of the templates `bundle_ids`
/// (in order), from its shares and the mask seeds P2 sealed for it (`seeds`, from
/// `face_dealer_template_seeds`), sealed for the other evaluator (4·l bytes per template).
/// Errors: 08P01 seeds refused, 40001 a template not enrolled here, 22023/22004 bad ids.
#[pg_extern(volatile)]
fn face_masked_prepare(bundle_ids: Array<'_, &[u8]>, seeds: &[u8]) -> Vec<u8> {
    const F: &str = "face_masked_prepare";
    let ids = parse_bundle_ids(F, bundle_ids);
    let (me, b) = evaluator_identity(F);
    let mut mask_seeds = seeds_for(F, &me, &ids, seeds);
    let shares = shares_of(F, &ids);
    let to_peer = pair_with(F, &me, PartyIndex::ALL[1 - b]);
    let mut rng = ChaCha20Rng::from_entropy();
    let sealed = seal_opening(me.index, &to_peer, &ids, &shares, &mask_seeds, &mut rng)
        .unwrap_or_else(|e| raise_face(F, e));
    mask_seeds.zeroize();
    sealed
}

/// Step 4 of the opening: opens the other evaluator's Y_{1−b} of `bundle_ids` (`peer`, its
/// `face_masked_prepare`), adds this party's own Y_b and stores Δy = y + δy with this
/// party's mask seed in `privmatch.face_masked_templates`. Returns how many templates were
/// newly stored (an opened one is kept as it is). Errors: 08P01 seeds or peer message
/// refused, 40001 a template not enrolled here.
#[pg_extern(volatile)]
fn face_masked_accept(bundle_ids: Array<'_, &[u8]>, seeds: &[u8], peer: &[u8]) -> i64 {
    const F: &str = "face_masked_accept";
    let ids = parse_bundle_ids(F, bundle_ids);
    let (me, b) = evaluator_identity(F);
    let mut mask_seeds = seeds_for(F, &me, &ids, seeds);
    let shares = shares_of(F, &ids);
    let dim = shares.first().map_or(0, |s| s.elements.len());
    let from_peer = pair_with(F, &me, PartyIndex::ALL[1 - b]);
    let theirs = open_opening(me.index, &from_peer, &ids, dim, peer).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("{F}: the other evaluator's message was refused: {e}"),
            None,
        )
    });
    let mut opened_rows = Vec::with_capacity(ids.len());
    for (j, (share, seed)) in shares.iter().zip(&mask_seeds).enumerate() {
        let mut own = masked_template_share(share, seed);
        for (o, t) in own.iter_mut().zip(&theirs[j * dim..(j + 1) * dim]) {
            *o = o.wrapping_add(*t);
        }
        opened_rows.push(words_to_bytes(&own));
        own.zeroize();
    }
    let id_bytes: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
    let seed_bytes: Vec<Vec<u8>> = mask_seeds.iter().map(|s| s.to_vec()).collect();
    mask_seeds.zeroize();
    let inserted = modify(
        F,
        "WITH new AS (INSERT INTO privmatch.face_masked_templates (bundle_id, masked, seed) \
                      SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bytea[]) \
                      ON CONFLICT (bundle_id) DO NOTHING RETURNING 1) \
         SELECT count(*) FROM new",
        &[id_bytes.into(), opened_rows.into(), seed_bytes.into()],
        |row| row.get::<i64>(1).unwrap_or_default(),
    );
    inserted.into_iter().next().unwrap_or(0)
}
