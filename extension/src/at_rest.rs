//! Secrets kept sealed in this party's own tables (core's `crypto::at_rest`): the one SQL
//! function that seals a value under the party's at-rest key, for upgrade scripts that turn a
//! secret stored in the clear by an earlier version into its sealed form. No role may execute
//! it (`sql/roles.sql`); it runs as the extension's owner inside `ALTER EXTENSION … UPDATE`.
//!
//! Imports: [`crate::identity`] and [`crate::errors`] only (no modality).

use pgrx::prelude::*;
use privmatch_core::crypto::at_rest::AtRestKey;

use crate::errors::raise;
use crate::identity::load_identity;

/// The purposes a value may be sealed for (the columns that hold sealed secrets).
const PURPOSES: [&str; 2] = ["face-dealer-threshold", "face-template-master"];

/// Seals `plaintext` under this party's at-rest key for `purpose` (one of the sealed columns'
/// purposes); raises 22023 for another purpose and 55000 when the party is not initialised.
#[pg_extern(volatile, strict)]
fn at_rest_seal(purpose: &str, plaintext: &[u8]) -> Vec<u8> {
    if !PURPOSES.contains(&purpose) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("at_rest_seal: unknown purpose {purpose:?}"),
            None,
        );
    }
    let me = load_identity();
    AtRestKey::derive(&me.secret, me.index, purpose).seal(&mut rand::rngs::OsRng, plaintext)
}
