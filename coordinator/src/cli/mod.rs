//! The client side of the `privmatch` CLI, shared by the modalities: the one HTTP client of
//! the coordinator's API and its error type ([`http`]), the pinned keys and the CSPRNG that
//! templates and probes are shared and sealed with ([`keys`]), the accounting of enrolment
//! batches ([`batch`]), progress bars ([`progress`]), NDJSON input and output ([`ndjson`]), an
//! operator's signing key ([`operator_key`]), the operator's own commands at its party
//! ([`operator`]), the configuration of a deployment's coordinator ([`deploy`]) and the modality-neutral `privmatch recover`
//! ([`recover`]), the sealed inputs of the SQL front door ([`sealed`]) and registered clients'
//! keys, signed inputs and the operators' commands that manage them ([`client_auth`]). The modalities'
//! subcommands are in
//! their `cli.rs`; the command tree in `main.rs`.

pub mod batch;
pub mod client_auth;
pub mod client_key;
pub mod deploy;
pub mod embedding;
pub mod http;
pub mod keys;
pub mod ndjson;
pub mod operator;
pub mod operator_key;
pub mod party;
pub mod progress;
pub mod recover;
pub mod sealed;
