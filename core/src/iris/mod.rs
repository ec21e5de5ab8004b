//! Iris codes matched with 3-party MPC (Bloemen et al., "Large-Scale MPC: Scaling Private Iris
//! Code Uniqueness Checks to Millions of Users", ePrint 2024/705, deployed variant): the
//! plaintext template and its interchange format, the per-party share encoding, enrolment
//! bundles and probes, the scan seam and its CPU kernels, the matcher state machine and one
//! party's store and search service; the secret sharing it builds on ([`sharing`]: Shamir over
//! the Galois ring, replicated ABY3 sharing) and its 3-party sub-protocols ([`mpc`]: reshare,
//! binary circuits, lift, compare, OR tree), used by no other modality.

pub mod aligned;
pub mod binding;
pub mod dot;
pub mod encoding;
pub mod enroll;
pub mod eyes;
pub mod journal;
pub mod matcher;
pub mod mpc;
pub mod output;
pub mod params;
pub mod policy;
pub mod probe;
pub mod query;
pub mod scan;
pub mod service;
pub mod sharing;
pub mod store;
pub mod synth;
pub mod template;
