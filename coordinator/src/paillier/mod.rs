//! Device-held face templates at the coordinator and in the CLI: packed Paillier
//! (Game-Set-MATCH: Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363).
//! The template stays encrypted under the user's device key; one party, the service provider
//! (SP), stores its signed packed encryption and computes the terminal's rounds; the device
//! and the terminal are outside the deployment and reach it only through the coordinator,
//! which relays protocol messages and learns the outcome it is given.
//!
//! The same files as every modality where the job is the same (the JSON bodies are
//! `privmatch_api::paillier`):
//! [`driver`] (the relay of matching sessions: mailboxes, long polls,
//! expiry), [`routes`] (its HTTP handlers), [`client`] (the device's and the terminal's calls),
//! [`cli`] (`privmatch device …`, `privmatch terminal …`), [`input`] (the one embedding they
//! read, quantised for the parameters). Modality-specific: [`sp`] (the calls to the SP's SQL
//! functions) and [`device`] (the device's key file and its enrolment record on disk). No
//! `work.rs`: every write is one SQL call at the SP, atomic there. Synthetic embeddings come
//! from `privmatch face synth` (the same input format).
//!
//! Imports shared layers only, never another modality.

pub mod cli;
pub mod client;
pub mod device;
pub mod driver;
pub mod input;
pub mod routes;
pub mod sp;
