//! # privmatch-core
//!
//! The pure-Rust heart of privmatch. Nothing here touches Postgres, the network or the file
//! system: every protocol is a function or a message-driven state machine that callers (the
//! extension, the coordinator, the CLI) feed with bytes.
//!
//! Shared layers, bottom up (each imports only the layers above it in this list):
//!
//! | module | owns |
//! |---|---|
//! | [`party`] | the three party indices |
//! | [`algebra`] | wrapping rings Z_2^k, the Galois ring GR(2^16, 4) |
//! | [`sharing`] | Shamir over the Galois ring, replicated (ABY3) sharing |
//! | [`crypto`] | sealing and pairwise channels, function secret sharing |
//! | [`wire`] | envelopes, session ids, the share storage layout |
//! | [`mpc`] | the 3-party sub-protocols (reshare, binary circuits, lift, compare, OR tree) |
//! | [`twophase`] | naming and recovery rule of the parties' two-phase commit |
//!
//! Modalities, each importing shared layers only, never another modality (both rules, and
//! the absence of import circles between files, are checked by `tools/layout`):
//!
//! | module | owns |
//! |---|---|
//! | [`iris`] | 3-party iris matching: templates, shares, enrolment bundles, probes, scan, matcher, search service |
//! | [`face`] | Funshade face matching: quantisation, bundles, probes, key batches, evaluation steps |

pub mod algebra;
pub mod crypto;
pub mod face;
pub mod iris;
pub mod mpc;
pub mod party;
pub mod sharing;
pub mod twophase;
pub mod wire;
