//! Iris codes matched with 3-party MPC (Bloemen et al., "Large-Scale MPC: Scaling Private Iris
//! Code Uniqueness Checks to Millions of Users", ePrint 2024/705, deployed variant): the
//! plaintext template and its interchange format, the per-party share encoding, enrolment
//! bundles and probes, the scan seam and its CPU kernels, the matcher state machine and one
//! party's store and search service.

pub mod aligned;
pub mod binding;
pub mod dot;
pub mod encoding;
pub mod enroll;
pub mod eyes;
pub mod journal;
pub mod matcher;
pub mod output;
pub mod params;
pub mod policy;
pub mod probe;
pub mod query;
pub mod scan;
pub mod service;
pub mod store;
pub mod synth;
pub mod template;
