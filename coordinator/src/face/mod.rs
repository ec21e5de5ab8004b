//! The face modality at the coordinator and in the CLI: Funshade (Ibarrondo, Chabanne, Önen,
//! "Funshade: Function Secret Sharing for Two-Party Secure Thresholded Distance Evaluation",
//! PETS 2023, ePrint 2022/1688). P0 and P1 hold each quantised embedding as additive shares
//! and evaluate; P2 is the dealer of single-use keys; the coordinator relays sealed envelopes,
//! probes and round messages and learns one bit per comparison, never a share, a key or the
//! threshold.
//!
//! The same files as every modality (the JSON bodies are `privmatch_api::face`, shared with
//! the SQL front door):
//! [`driver`] (the comparison rounds on the shared skeleton), [`work`] (its distributed
//! transactions), [`routes`] (its HTTP handlers), [`client`] (its calls to the coordinator),
//! [`cli`] (its subcommands), [`seal`] (sealed inputs for the SQL front door), [`input`] (NDJSON parsing and quantisation) and [`synth`]
//! (synthetic embeddings: `privmatch face synth` writes the input format [`input`] reads, for
//! demos, tests and benchmarks). Modality-specific: [`admin`] (the dealer's configuration,
//! the key pools and their refill) and [`stock`] (dealings for 1:N made ahead of time).
//!
//! Imports shared layers only, never another modality.

pub mod admin;
pub mod cli;
pub mod client;
pub mod driver;
pub mod input;
pub mod routes;
pub mod seal;
pub mod stock;
pub mod synth;
pub mod work;
