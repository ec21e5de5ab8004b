//! Developer tooling, apart from the service: a local cluster of three parties and a
//! coordinator on one machine ([`cluster`], `privmatch cluster up|down|status`) and the
//! benchmarks ([`mod@bench`], `privmatch bench enroll|iris|face`). It exercises every modality,
//! so it may name them all.

pub mod bench;
pub mod cluster;
