//! # privmatch — the PostgreSQL extension of one party
//!
//! A thin pgrx layer over `privmatch-core`: it gives a party its identity (index and X25519
//! key, generated here and never exported), the share types (`iris_code_share`,
//! `iris_mask_share`: hand-laid varlenas, see [`privmatch_core::wire::storage`]), the table of enrolled
//! templates, and the SQL functions the coordinator calls to enrol and delete records inside
//! its two-phase-commit transactions. Every rule about bytes lives in `core/`; this crate only
//! moves bytes between Postgres and core, and turns core's errors into SQLSTATEs.

mod engine;
mod enroll;
mod errors;
mod face;
mod identity;
mod share_types;

use pgrx::prelude::*;

::pgrx::pg_module_magic!();

/// Library initialisation: defines the GUCs and, when loaded through
/// `shared_preload_libraries`, registers the party engine worker.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    engine::worker::register();
}

// The hand-written schema (types, tables, casts) runs before any generated function.
pgrx::extension_sql_file!(
    "../../sql/privmatch.sql",
    name = "privmatch_schema",
    bootstrap
);

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    /// Per-test setup (none).
    pub fn setup(_options: Vec<&str>) {}
    /// Extra postgresql.conf settings for tests.
    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
