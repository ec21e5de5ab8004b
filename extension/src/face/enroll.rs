//! Enrolment and deletion of face templates at P0 and P1, called by the coordinator inside a
//! distributed transaction (prepared at every party, then committed), as for iris. Table
//! `privmatch.face_templates`: `sql/face.sql`.

use std::collections::HashSet;

use pgrx::pg_sys;
use pgrx::prelude::*;
use privmatch_core::face::encoding::evaluator;
use privmatch_core::face::enroll::{open_face_enrollment, FACE_ENROLL_PURPOSE};
use privmatch_core::face::FaceError;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::encode_face_share;

use super::raise_face;
use crate::bundles::{check_envelope_count, replayed, OnDuplicate, ReplayGuard, DUPLICATE_HINT};
use crate::clients;
use crate::datum::{share_datum, type_oid};
use crate::errors::{raise, raise_spi};
use crate::identity::load_identity;

const ENROLL: &str = "face_enroll_sealed";
/// Templates written per INSERT statement (4 parameters each, far below PostgreSQL's 65,535).
const ROWS_PER_INSERT: usize = 1024;

/// The dimension of the templates already enrolled here, if any.
pub(super) fn enrolled_dim(function: &str) -> Option<usize> {
    Spi::get_one::<i32>(
        "SELECT (SELECT privmatch.face_share_dim(template) FROM privmatch.face_templates LIMIT 1)",
    )
    .unwrap_or_else(|e| raise_spi(function, e))
    .map(|d| d as usize)
}

/// Opens each sealed face enrolment envelope with this party's key and stores the shares
/// inside. Each envelope is first admitted as a sealed input (`clients::admit_single_use`,
/// purpose `face-enrol`): a registered client's signature, party, purpose and expiry are
/// checked (28000 for a bad or expired one), and an unsigned envelope is refused (28000) when
/// this party's client-auth policy is `required`; no nonce is recorded and no budget charged
/// (a replayed envelope is refused by its consumed bundle ids, 23505, as before).
/// Refuses (and so aborts the caller's transaction) an envelope not sealed to this
/// party, tampered or malformed, a replayed bundle, and a template whose dimension differs
/// from the templates already enrolled. An enrolled subject is skipped (`enrolled = false`)
/// or, with `on_duplicate => 'error'`, aborts. One row per record, in order.
#[pg_extern(volatile)]
fn face_enroll_sealed(
    envelopes: Array<'_, &[u8]>,
    on_duplicate: default!(&str, "'skip'"),
) -> TableIterator<'static, (name!(subject, String), name!(enrolled, bool))> {
    let on_duplicate = OnDuplicate::parse(ENROLL, on_duplicate);
    check_envelope_count(ENROLL, envelopes.len());
    let me = load_identity();
    evaluator(me.index).unwrap_or_else(|e| raise_face(ENROLL, e));
    let share_oid = type_oid("privmatch.face_share");
    let mut dim = enrolled_dim(ENROLL);
    let mut bundles = Vec::new();
    for (position, sealed) in envelopes.iter().enumerate() {
        let Some(sealed) = sealed else {
            raise(
                PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!("{ENROLL}: envelope #{position} is NULL"),
                None,
            );
        };
        let argument = format!("envelopes #{position}");
        let admitted =
            clients::admit_single_use(ENROLL, &argument, FACE_ENROLL_PURPOSE, me.index, sealed);
        let opened = open_face_enrollment(me.index, &me.secret, admitted.inner)
            .unwrap_or_else(|e| raise_face(&format!("{ENROLL}: envelope #{position}"), e));
        bundles.extend(opened);
    }
    for (record, bundle) in bundles.iter().enumerate() {
        let got = bundle.share.elements.len();
        match dim {
            Some(expected) if expected != got => raise_face(
                &format!("{ENROLL}: record #{record} (subject {:?})", bundle.subject),
                FaceError::WrongDimension { expected, got },
            ),
            _ => dim = Some(got),
        }
    }
    // Written in subject order, so overlapping enrolments take their row locks in the same
    // order and wait for each other instead of deadlocking (as iris enrolment does).
    let mut order: Vec<usize> = (0..bundles.len()).collect();
    order.sort_by(|&a, &b| bundles[a].subject.cmp(&bundles[b].subject));
    let mut inserted_at = vec![false; bundles.len()];
    Spi::connect_mut(|client| {
        let guard = ReplayGuard::prepare(client).unwrap_or_else(|e| raise_spi(ENROLL, e));
        for &record in &order {
            let bundle = &bundles[record];
            let fresh = guard
                .consume(client, &bundle.bundle_id)
                .unwrap_or_else(|e| raise_spi(ENROLL, e));
            if !fresh {
                raise(
                    PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                    format!("{ENROLL}: {}", replayed(record, &bundle.bundle_id)),
                    None,
                );
            }
        }
        // Many rows per statement: the set version's trigger fires once per statement
        // (docs/protocols/face.md §12), and one statement is cheaper than many anyway.
        for chunk in order.chunks(ROWS_PER_INSERT) {
            let mut sql = String::from(
                "INSERT INTO privmatch.face_templates (subject, template, norm_share, bundle_id) VALUES ",
            );
            let mut args = Vec::with_capacity(4 * chunk.len());
            for (k, &record) in chunk.iter().enumerate() {
                let bundle = &bundles[record];
                let at = 4 * k;
                let sep = if k == 0 { "" } else { ", " };
                sql.push_str(&format!(
                    "{sep}(${}, ${}, ${}, ${})",
                    at + 1,
                    at + 2,
                    at + 3,
                    at + 4
                ));
                args.push(bundle.subject.clone().into());
                args.push(share_datum(
                    &encode_face_share(
                        PartyIndex::ALL[usize::from(bundle.party)],
                        &bundle.share.elements,
                    ),
                    share_oid,
                ));
                args.push((bundle.share.norm as i32).into());
                args.push(bundle.bundle_id.to_vec().into());
            }
            sql.push_str(" ON CONFLICT (subject) DO NOTHING RETURNING subject");
            let mut inserted: HashSet<String> = client
                .update(&sql, None, &args)
                .unwrap_or_else(|e| raise_spi(ENROLL, e))
                .filter_map(|row| row.get::<String>(1).ok().flatten())
                .collect();
            // A subject twice in one call: its first record (in call order) is the one stored.
            for &record in chunk {
                inserted_at[record] = inserted.remove(&bundles[record].subject);
            }
            pg_sys::check_for_interrupts!();
        }
        if on_duplicate == OnDuplicate::Error {
            if let Some(&record) = order.iter().find(|&&r| !inserted_at[r]) {
                raise(
                    PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                    format!(
                        "{ENROLL}: subject {:?} is already enrolled",
                        bundles[record].subject
                    ),
                    Some(DUPLICATE_HINT),
                );
            }
        }
    });
    let results: Vec<(String, bool)> = bundles
        .into_iter()
        .zip(inserted_at)
        .map(|(bundle, inserted)| (bundle.subject, inserted))
        .collect();
    TableIterator::new(results)
}

/// Deletes the face template of `subject`. Returns how many records were removed (0 or 1).
#[pg_extern(volatile)]
fn face_delete(subject: &str) -> i64 {
    Spi::connect_mut(|client| {
        client
            .update(
                "WITH gone AS (DELETE FROM privmatch.face_templates WHERE subject = $1 \
                               RETURNING bundle_id), \
                      opened AS (DELETE FROM privmatch.face_masked_templates m USING gone \
                                  WHERE m.bundle_id = gone.bundle_id) \
                 SELECT 1 FROM gone",
                None,
                &[subject.into()],
            )
            .map(|table| table.len() as i64)
            .unwrap_or_else(|e| raise_spi("face_delete", e))
    })
}
