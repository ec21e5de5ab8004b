//! # privmatch — the PostgreSQL extension of one party
//!
//! A thin pgrx layer over `privmatch-core`, laid out by modality, then by layer:
//!
//! * shared: [`identity`] (the party's index and X25519 key, generated here and never
//!   exported; the pinned peer keys), [`errors`] (SQLSTATEs, SPI helpers), [`datum`] (the
//!   varlena share types' I/O functions), [`bundles`] (what enrolment of every modality
//!   shares), the [`engine`] background worker with its socket protocol, and the SQL
//!   [`front_door`] (the coordinator's HTTPS client behind each modality's front-door
//!   functions), query [`budget`]s, and secrets sealed [`at_rest`] in the party's tables;
//! * [`iris`]: share types, enrolment and deletion, the SQL functions of a search's rounds;
//! * [`face`]: share type, enrolment and deletion, the opening of templates under the
//!   dealer's masks, comparison sessions, the dealer;
//! * [`paillier`]: the service provider of device-held Paillier templates (Game-Set-MATCH):
//!   the record type, its keys and parameters, enrolment, records, the terminal's Round 2.
//!
//! Every rule about bytes lives in `core/`; this crate only moves bytes between Postgres and
//! core, and turns core's errors into SQLSTATEs. The schema is hand-written in `sql/`, one
//! file per modality after the common one; the modalities never import each other.

mod at_rest;
mod budget;
mod bundles;
mod clients;
mod datum;
mod engine;
mod errors;
mod face;
mod front_door;
mod identity;
mod iris;
mod keyfile;
mod operator;
mod paillier;
mod plans;
mod signals;
mod txn;

use pgrx::prelude::*;

::pgrx::pg_module_magic!();

/// Library initialisation: defines the GUCs and, when loaded through
/// `shared_preload_libraries`, registers the party engine worker.
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // The core reads no environment: `PRIVMATCH_IFMA=off` in the server's environment turns
    // the IFMA exponentiations off here (Paillier at the service provider).
    use privmatch_core::algebra::montgomery::{ifma_switch_says_off, switch_ifma_off, IFMA_SWITCH};
    if std::env::var(IFMA_SWITCH).is_ok_and(|v| ifma_switch_says_off(&v)) {
        switch_ifma_off();
    }
    // Pool threads must never take PostgreSQL's signals: the core starts them through us.
    privmatch_core::parallel::set_spawner(signals::spawn_pool_thread);
    identity::register_gucs();
    front_door::register_gucs();
    paillier::register_gucs();
    engine::worker::register();
}

// The hand-written schema runs before any generated function: what every modality uses
// (identity, peers, consumed bundles, distributed transactions) first, then each modality's
// types and tables.
pgrx::extension_sql_file!("../../sql/common.sql", name = "privmatch_common", bootstrap);
pgrx::extension_sql_file!(
    "../../sql/clients.sql",
    name = "privmatch_clients",
    requires = ["privmatch_common"]
);
pgrx::extension_sql_file!(
    "../../sql/iris.sql",
    name = "privmatch_iris",
    requires = ["privmatch_common"]
);
pgrx::extension_sql_file!(
    "../../sql/face.sql",
    name = "privmatch_face",
    requires = ["privmatch_common"]
);
pgrx::extension_sql_file!(
    "../../sql/paillier.sql",
    name = "privmatch_paillier",
    requires = ["privmatch_common"]
);

// Who may call what, after every function exists: roles, SECURITY DEFINER, grants, and the
// tables pg_dump saves.
pgrx::extension_sql_file!("../../sql/roles.sql", name = "privmatch_roles", finalize);

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
