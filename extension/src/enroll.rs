//! Enrolment and deletion of iris templates at one party. The coordinator calls these inside a
//! distributed transaction (one per batch, prepared at all three parties, then committed), so
//! a batch is enrolled everywhere or nowhere; any error here aborts the batch at every party.

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::prelude::*;
use privmatch_core::iris::enroll::{open_iris_enrollment, IrisEnrollBundle};
use privmatch_core::wire::storage::{encode_share, ShareKind};

use crate::errors::{raise, raise_bundle};
use crate::identity::load_identity;
use crate::share_types::payload_to_varlena;

/// What to do when a subject+eye is already enrolled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnDuplicate {
    /// Leave the existing record, report `enrolled = false` (makes re-running an input idempotent).
    Skip,
    /// Abort the whole batch with 23505.
    Error,
}

fn parse_on_duplicate(text: &str) -> OnDuplicate {
    match text {
        "skip" => OnDuplicate::Skip,
        "error" => OnDuplicate::Error,
        other => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("iris_enroll_sealed: on_duplicate must be 'skip' or 'error', not {other:?}"),
            None,
        ),
    }
}

pub(crate) fn type_oid(name: &str) -> pg_sys::Oid {
    Spi::get_one_with_args::<pg_sys::Oid>("SELECT to_regtype($1)::oid", &[name.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!("type {name} is missing: is the privmatch extension installed correctly?"),
                None,
            )
        })
}

fn share_datum(
    kind: ShareKind,
    bundle: &IrisEnrollBundle,
    coefs: &[u16],
    oid: pg_sys::Oid,
) -> DatumWithOid<'static> {
    let payload = encode_share(kind, bundle.share.party, coefs);
    // SAFETY: the datum is a valid varlena of type `oid`, palloc'd in the current context.
    unsafe { DatumWithOid::new(pg_sys::Datum::from(payload_to_varlena(&payload)), oid) }
}

/// Opens each sealed enrolment envelope with this party's key and stores the shares of the
/// bundles inside. Refuses (and so aborts the caller's transaction) any envelope that is not
/// sealed to this party, fails authentication or is malformed, and any bundle that was already
/// consumed (replay). A subject+eye that is already enrolled is skipped (`enrolled = false`)
/// or, with `on_duplicate => 'error'`, aborts. Returns one row per record, in order.
#[pg_extern(volatile)]
fn iris_enroll_sealed(
    envelopes: Array<'_, &[u8]>,
    on_duplicate: default!(&str, "'skip'"),
) -> TableIterator<
    'static,
    (
        name!(subject, String),
        name!(eye, String),
        name!(enrolled, bool),
    ),
> {
    let on_duplicate = parse_on_duplicate(on_duplicate);
    let me = load_identity();
    let code_oid = type_oid("privmatch.iris_code_share");
    let mask_oid = type_oid("privmatch.iris_mask_share");
    let envelopes: Vec<Option<&[u8]>> = envelopes.iter().collect();
    let mut results = Vec::new();
    Spi::connect_mut(|client| {
        let consume = client
            .prepare_mut(
                "INSERT INTO privmatch.consumed_bundles (bundle_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1",
                &[PgOid::from(pg_sys::BYTEAOID)],
            )
            .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, e.to_string(), None));
        let insert = client
            .prepare_mut(
                "INSERT INTO privmatch.iris_templates (subject, eye, code_share, mask_share) \
                 VALUES ($1, $2::text::privmatch.eye, $3, $4) ON CONFLICT (subject, eye) DO NOTHING RETURNING id",
                &[
                    PgOid::from(pg_sys::TEXTOID),
                    PgOid::from(pg_sys::TEXTOID),
                    PgOid::from(code_oid),
                    PgOid::from(mask_oid),
                ],
            )
            .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, e.to_string(), None));
        let mut record = 0usize;
        for (position, sealed) in envelopes.iter().enumerate() {
            let Some(sealed) = sealed else {
                raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("envelope #{position} is NULL"),
                    None,
                );
            };
            let bundles = open_iris_enrollment(me.index, &me.secret, sealed)
                .unwrap_or_else(|e| raise_bundle(position, e));
            for bundle in bundles {
                let fresh = client
                    .update(&consume, None, &[bundle.bundle_id.to_vec().into()])
                    .unwrap_or_else(|e| {
                        raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, e.to_string(), None)
                    })
                    .len();
                if fresh == 0 {
                    raise(
                        PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                        format!(
                            "record #{record} (bundle id {}) was already consumed: refusing a replayed enrolment bundle",
                            hex::encode(bundle.bundle_id)
                        ),
                        None,
                    );
                }
                let inserted = client
                    .update(
                        &insert,
                        None,
                        &[
                            bundle.subject.clone().into(),
                            bundle.eye.as_str().into(),
                            share_datum(ShareKind::IrisCode, &bundle, &bundle.share.code, code_oid),
                            share_datum(ShareKind::IrisMask, &bundle, &bundle.share.mask, mask_oid),
                        ],
                    )
                    .unwrap_or_else(|e| {
                        raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, e.to_string(), None)
                    })
                    .len()
                    == 1;
                if !inserted && on_duplicate == OnDuplicate::Error {
                    raise(
                        PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                        format!(
                            "subject {:?} ({} eye) is already enrolled",
                            bundle.subject,
                            bundle.eye.as_str()
                        ),
                        Some("delete it first, or enrol with on_duplicate => 'skip'"),
                    );
                }
                results.push((bundle.subject, bundle.eye.as_str().to_owned(), inserted));
                record += 1;
                pg_sys::check_for_interrupts!();
            }
        }
    });
    TableIterator::new(results)
}

/// Deletes the templates of `subject` (one eye, or both when `eye` is NULL). Returns how many
/// records were removed.
#[pg_extern(volatile)]
fn iris_delete(subject: &str, eye: default!(Option<&str>, "NULL")) -> i64 {
    if let Some(eye) = eye {
        if eye != "left" && eye != "right" {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("iris_delete: eye must be 'left', 'right' or NULL, not {eye:?}"),
                None,
            );
        }
    }
    Spi::connect_mut(|client| {
        client
            .update(
                "DELETE FROM privmatch.iris_templates WHERE subject = $1 AND ($2::text IS NULL OR eye = $2::text::privmatch.eye)",
                None,
                &[subject.into(), eye.into()],
            )
            .map(|table| table.len() as i64)
            .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, e.to_string(), None))
    })
}
