//! Sessions: one search or comparison across the parties, as the coordinator drives it and
//! the client retries it, whatever the modality.
//!
//! A session has a fresh random id (`privmatch_core::wire::session`), bound into every sealed
//! probe and every round message, and single-use at every party: whoever seals the probes
//! (the client) draws it, and a retry needs a new id and freshly sealed probes.
//!
//! * [`retry`]: the back-off schedule on which the client retries a session after a transient
//!   failure (the parties hold different template sets for a moment, a key claim conflicted).
//! * [`batcher`]: requests of one kind that arrive while others run, grouped into batches
//!   that run as one session (generic over what a modality's batch is and how it runs).
//! * [`driver`]: the one round-driver skeleton of every modality: per-party calls under a
//!   deadline, in parallel, with the most telling error; the relay of round messages along the
//!   modality's routing; pooled connections; the abort of a failed session at every party it
//!   touched. A modality supplies its SQL calls, its routing and what its answers mean.

pub mod batcher;
pub mod driver;
pub mod retry;
