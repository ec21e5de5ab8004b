//! privmatch-api: the coordinator's HTTP API as types — the request and answer bodies of every
//! modality, the error codes with the one table that maps them to HTTP statuses and SQLSTATEs,
//! and the text forms of binary values. The server and the CLI (`privmatch-coordinator`) and
//! the SQL front door (the `privmatch` extension) all read and write these types, so a field
//! or a code is defined once. No async runtime and no I/O: serde and core's types only.

pub mod error;
pub mod face;
pub mod iris;
pub mod paillier;
pub mod wire;

pub use error::{ErrorBody, ErrorCode};
