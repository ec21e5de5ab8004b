//! Iris codes: the plaintext template, its interchange format, the fractional Hamming
//! distance, the per-party share encoding, and synthetic template generation.

pub mod dot;
pub mod encoding;
pub mod matcher;
pub mod probe;
pub mod query;
pub mod service;
pub mod store;
pub mod synth;
pub mod template;
