//! # privmatch-core
//!
//! The pure-Rust heart of privmatch: the algebra (wrapping rings, the Galois ring
//! GR(2^16, 4)), the secret-sharing schemes (degree-1 Shamir over the Galois ring,
//! replicated ABY3 sharing), the plaintext iris template with its interchange format and
//! its per-party share encoding, and the sealing layer (client→party sealed boxes,
//! party↔party AEAD channels, pairwise PRF seeds). Nothing here touches Postgres, the
//! network or the file system: every protocol is a function or a message-driven state
//! machine that callers (the extension, the coordinator, the CLI) feed with bytes.

pub mod bundle;
pub mod face;
pub mod fss;
pub mod galois;
pub mod iris;
pub mod mpc;
pub mod party;
pub mod replicated;
pub mod ring;
pub mod seal;
pub mod shamir;
pub mod storage;
pub mod twophase;
