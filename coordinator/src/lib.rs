//! The privmatch coordinator service and command-line client, as a library: the `privmatch`
//! binary (`main.rs`) is a thin argument parser over these modules, and the end-to-end tests
//! reuse the configuration and synthesis code from here.
//!
//! Shared layers (each imports no modality):
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the configuration file: the parties, their pinned keys, the coordinator's address |
//! | [`files`] | atomic writes of configurations, credentials, keys and certificates, with their modes |
//! | [`parties`] | connection pools to the three parties, their errors |
//! | [`guard`] | one coordinator per deployment (an advisory lock at P0) |
//! | [`identity`] | party identity bundles: signed by each party's operator, pinned by clients after a fingerprint check |
//! | [`tls`] | TLS of the API and of the links to the parties, a local CA for `cluster up` |
//! | [`session`] | the round-driver skeleton every modality's sessions run on, retries |
//! | [`txn`] | two-phase commit over a modality's [`txn::work::Work`], recovery |
//! | [`server`] | the HTTP service: state, errors, the one composition of the modalities' routes |
//! | [`cli`] | the one HTTP client, sealing keys, batch accounting, progress bars, NDJSON output, sealed inputs for the SQL front door |
//!
//! The API's bodies, error codes and text forms are `privmatch_api`'s (the `api/` crate,
//! shared with the SQL front door).
//!
//! Modalities, each with the same files (`driver`, `work`, `routes`, `client`, `cli`,
//! `seal`, `input`, `synth`, where the job is the same), importing shared layers only, never
//! each other: [`iris`], [`face`], [`paillier`] (device-held face templates).
//!
//! Developer tooling, apart from the service: [`dev`] (local clusters, benchmarks).

pub mod cli;
pub mod config;
pub mod dev;
pub mod face;
pub mod files;
pub mod guard;
pub mod identity;
pub mod iris;
pub mod paillier;
pub mod parties;
pub mod server;
pub mod session;
pub mod tls;
pub mod txn;
