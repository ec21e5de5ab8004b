//! The iris functions of the SQL front door (`crate::front_door` explains it): enrolment,
//! identification and uniqueness with sealed inputs written by `privmatch iris seal`. The
//! application role `privmatch_application` may call these and nothing else of the iris
//! modality.
//!
//! Imports: `crate::front_door` and core's `wire::sealed_input`; never `crate::face`.

use pgrx::prelude::*;
use privmatch_core::wire::sealed_input::SealedKind;

use crate::front_door::{call, enrolled, field, malformed, parse_sealed};

/// Enrols one iris template at the three parties (one distributed transaction, committed
/// independently of the caller's). True when enrolled, false when this subject and eye were
/// already enrolled (nothing written). `sealed`: `privmatch iris seal --for enroll`.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_enroll(sealed: &str) -> bool {
    let function = "iris_enroll";
    let input = parse_sealed(sealed, SealedKind::IrisEnroll, "sealed");
    enrolled(&call(input, true), function)
}

/// The enrolled templates a probe matches: one row per (subject, eye), sorted, after the
/// sealed two-eye policy. `sealed`: `privmatch iris seal --for identify`.
#[pg_extern(volatile, parallel_unsafe)]
fn iris_identify(
    sealed: &str,
) -> TableIterator<'static, (name!(subject, String), name!(eye, String))> {
    let function = "iris_identify";
    let input = parse_sealed(sealed, SealedKind::IrisIdentify, "sealed");
    let answer = call(input, false);
    let matches = field(&answer, "matches", function)
        .as_array()
        .unwrap_or_else(|| malformed(function, "matches"));
    let rows: Vec<(String, String)> = matches
        .iter()
        .map(|m| {
            let text = |key: &str| {
                m.get(key)
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
                    .unwrap_or_else(|| malformed(function, key))
            };
            (text("subject"), text("eye"))
        })
        .collect();
    TableIterator::new(rows)
}

/// Whether a probe matches no enrolled template (`privmatch iris seal --for uniqueness`).
#[pg_extern(volatile, parallel_unsafe)]
fn iris_is_unique(sealed: &str) -> bool {
    let function = "iris_is_unique";
    let input = parse_sealed(sealed, SealedKind::IrisUniqueness, "sealed");
    let answer = call(input, false);
    field(&answer, "unique", function)
        .as_bool()
        .unwrap_or_else(|| malformed(function, "unique"))
}
