//! Enrolment and deletion of iris templates at one party. The coordinator calls these inside a
//! distributed transaction (one per batch, prepared at all three parties, then committed), so
//! a batch is enrolled everywhere or nowhere; any error here aborts the batch at every party.
//! Table `privmatch.iris_templates`: `sql/iris.sql`.

use pgrx::pg_sys;
use pgrx::prelude::*;
use privmatch_core::crypto::seal::SealError;
use privmatch_core::iris::binding::check_envelope_hashes;
use privmatch_core::iris::enroll::{open_iris_enrollment, BundleError, IRIS_ENROLL_PURPOSE};
use privmatch_core::wire::envelope::EnvelopeError;
use privmatch_core::wire::storage::{encode_share, ShareKind};

use crate::bundles::{check_envelope_count, replayed, OnDuplicate, ReplayGuard, DUPLICATE_HINT};
use crate::clients;
use crate::datum::{share_datum, type_oid};
use crate::errors::{get_one, raise, raise_internal, select, OTHER_PARTY_HINT};
use crate::identity::load_identity;

const ENROLL: &str = "iris_enroll_sealed";

/// Raises an envelope that could not be opened or decoded, naming its position in the call.
fn raise_bundle(position: usize, err: BundleError) -> ! {
    let code = match &err {
        e if e.is_for_another_party() => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        BundleError::Envelope(EnvelopeError::BadSubject(_)) | BundleError::BadEye(_) => {
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
        }
        _ => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
    };
    let hint = match &err {
        BundleError::Seal(SealError::WrongRecipient { .. }) => {
            Some("the coordinator routed a bundle to the wrong party; nothing was enrolled")
        }
        e if e.is_for_another_party() => Some(OTHER_PARTY_HINT),
        _ => None,
    };
    raise(code, format!("envelope #{position}: {err}"), hint)
}

/// Opens each sealed enrolment envelope with this party's key and stores the shares of the
/// bundles inside. Each envelope is first admitted as a sealed input
/// (`clients::admit_single_use`, purpose `iris-enrol`): a registered client's signature,
/// party, purpose and expiry are checked (28000 for a bad or expired one), and an unsigned
/// envelope is refused (28000) when this party's client-auth policy is `required`; no nonce
/// is recorded and no budget charged (a replayed envelope is refused by its consumed bundle
/// ids, 23505, as before; an enrolment is no query). `envelope_hashes[j]` is h0 ‖ h1 ‖ h2, the hashes of the three parties'
/// envelopes of `envelopes[j]`'s batch (core's `iris::binding`), each over the envelope as
/// relayed — with its client signature, if signed, so the enrolment id also commits to who
/// signed it: this party's own envelope must
/// hash to its slot (22023 otherwise), and every record stores the enrolment id the three
/// parties derive from them alike, which the set digest of every search commits to. Refuses
/// (and so aborts the caller's transaction) any envelope that is not sealed to this party,
/// fails authentication or is malformed, and any bundle that was already consumed (replay).
/// A subject+eye that is already enrolled is skipped (`enrolled = false`) or, with
/// `on_duplicate => 'error'`, aborts. Returns one row per record, in order.
#[pg_extern(volatile)]
fn iris_enroll_sealed(
    envelopes: Array<'_, &[u8]>,
    envelope_hashes: Array<'_, &[u8]>,
    on_duplicate: default!(&str, "'skip'"),
) -> TableIterator<
    'static,
    (
        name!(subject, String),
        name!(eye, String),
        name!(enrolled, bool),
    ),
> {
    let on_duplicate = OnDuplicate::parse(ENROLL, on_duplicate);
    check_envelope_count(ENROLL, envelopes.len());
    let me = load_identity();
    let code_oid = type_oid("privmatch.iris_code_share");
    let mask_oid = type_oid("privmatch.iris_mask_share");
    let envelopes: Vec<Option<&[u8]>> = envelopes.iter().collect();
    let envelope_hashes: Vec<Option<&[u8]>> = envelope_hashes.iter().collect();
    if envelope_hashes.len() != envelopes.len() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{ENROLL}: {} envelope_hashes for {} envelopes (one h0 ‖ h1 ‖ h2 per envelope)",
                envelope_hashes.len(),
                envelopes.len()
            ),
            None,
        );
    }
    // Every envelope is admitted (client, signature, party, purpose, expiry, policy) before
    // anything is opened.
    let admitted: Vec<&[u8]> = envelopes
        .iter()
        .enumerate()
        .map(|(position, sealed)| {
            let Some(sealed) = sealed else {
                raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("envelope #{position} is NULL"),
                    None,
                );
            };
            let argument = format!("envelopes #{position}");
            clients::admit_single_use(ENROLL, &argument, IRIS_ENROLL_PURPOSE, me.index, sealed)
                .inner
        })
        .collect();
    let mut results = Vec::new();
    Spi::connect_mut(|client| {
        let guard = ReplayGuard::prepare(client).unwrap_or_else(|e| raise_internal(e));
        let insert = client
            .prepare_mut(
                "INSERT INTO privmatch.iris_templates (subject, eye, code_share, mask_share, enrolment_id) \
                 VALUES ($1, $2::text::privmatch.eye, $3, $4, $5) ON CONFLICT (subject, eye) DO NOTHING RETURNING id",
                &[
                    PgOid::from(pg_sys::TEXTOID),
                    PgOid::from(pg_sys::TEXTOID),
                    PgOid::from(code_oid),
                    PgOid::from(mask_oid),
                    PgOid::from(pg_sys::BYTEAOID),
                ],
            )
            .unwrap_or_else(|e| raise_internal(e));
        // Open everything first, then write in (subject, eye) order: every enrolment takes
        // its row locks in the same order, so overlapping enrolments wait for each other
        // instead of deadlocking (docs/architecture.md, "Lock order").
        let mut opened = Vec::new();
        for (position, sealed) in envelopes.iter().enumerate() {
            let Some(sealed) = sealed else {
                raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("envelope #{position} is NULL"),
                    None,
                );
            };
            let bundles = open_iris_enrollment(me.index, &me.secret, admitted[position])
                .unwrap_or_else(|e| raise_bundle(position, e));
            let hashes = envelope_hashes[position].unwrap_or_else(|| {
                raise(
                    PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                    format!("envelope_hashes #{position} is NULL"),
                    None,
                )
            });
            // A coordinator that stores an envelope of its own at this party only must give
            // it other hashes than the other parties got, so the record's enrolment id here
            // differs from theirs (core's iris::binding). The hash covers the envelope as
            // relayed (signature included): what the coordinator hashed for all three.
            let enrolment = check_envelope_hashes(me.index, sealed, hashes).unwrap_or_else(|e| {
                raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    format!("envelope #{position}: {e}"),
                    Some("the coordinator relayed envelope hashes that do not match the envelope; nothing was enrolled"),
                )
            });
            opened.extend(bundles.into_iter().map(|b| (b, enrolment)));
        }
        let mut order: Vec<usize> = (0..opened.len()).collect();
        order.sort_by(|&a, &b| {
            (opened[a].0.subject.as_str(), opened[a].0.eye.as_str())
                .cmp(&(opened[b].0.subject.as_str(), opened[b].0.eye.as_str()))
        });
        let mut inserted_at = vec![false; opened.len()];
        for record in order {
            let (bundle, enrolment) = &opened[record];
            let party = bundle.share.party;
            let fresh = guard
                .consume(client, &bundle.bundle_id)
                .unwrap_or_else(|e| raise_internal(e));
            if !fresh {
                raise(
                    PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                    replayed(record, &bundle.bundle_id),
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
                        share_datum(
                            &encode_share(ShareKind::IrisCode, party, &bundle.share.code),
                            code_oid,
                        ),
                        share_datum(
                            &encode_share(ShareKind::IrisMask, party, &bundle.share.mask),
                            mask_oid,
                        ),
                        enrolment.to_vec().into(),
                    ],
                )
                .unwrap_or_else(|e| raise_internal(e))
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
                    Some(DUPLICATE_HINT),
                );
            }
            inserted_at[record] = inserted;
            pg_sys::check_for_interrupts!();
        }
        results = opened
            .into_iter()
            .zip(inserted_at)
            .map(|((bundle, _), inserted)| {
                (bundle.subject, bundle.eye.as_str().to_owned(), inserted)
            })
            .collect();
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
            .unwrap_or_else(|e| raise_internal(e))
    })
}

/// How many iris records (subject and eye) this party holds: what `privmatch cluster status`
/// and the coordinator's status show.
#[pg_extern(stable)]
fn iris_records() -> i64 {
    get_one::<i64>(
        "iris_records",
        "SELECT count(*) FROM privmatch.iris_templates",
        &[],
    )
    .unwrap_or(0)
}

/// Whether `subject`'s `eye` ('left' or 'right') is enrolled here: what enroll-if-unique
/// asks every party before it searches.
#[pg_extern(stable)]
fn iris_enrolled(subject: &str, eye: &str) -> bool {
    if eye != "left" && eye != "right" {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("iris_enrolled: eye must be 'left' or 'right', not {eye:?}"),
            None,
        );
    }
    get_one::<bool>(
        "iris_enrolled",
        "SELECT EXISTS (SELECT 1 FROM privmatch.iris_templates \
         WHERE subject = $1 AND eye = $2::text::privmatch.eye)",
        &[subject.into(), eye.into()],
    )
    .unwrap_or(false)
}

/// Every iris record this party holds with its enrolment id (core's `iris::binding`), sorted
/// by eye and subject: what `privmatch iris audit` compares across the three parties to name
/// the entries whose copies diverge (deleted at one party only, or stored there under another
/// enrolment). Enrolment ids are hashes of sealed envelopes: no share, nothing secret.
#[pg_extern(stable)]
fn iris_audit() -> TableIterator<
    'static,
    (
        name!(subject, String),
        name!(eye, String),
        name!(enrolment_id, Vec<u8>),
    ),
> {
    let rows = select(
        "iris_audit",
        "SELECT subject, eye::text, enrolment_id FROM privmatch.iris_templates ORDER BY eye, subject",
        &[],
        |row| {
            (
                row.get::<String>(1).unwrap_or_default(),
                row.get::<String>(2).unwrap_or_default(),
                row.get::<Vec<u8>>(3).unwrap_or_default(),
            )
        },
    );
    TableIterator::new(rows)
}
