//! The iris modality at the coordinator and in the CLI: three parties hold each template as
//! shares and search them together, in the ring of Bloemen et al., "Large-Scale MPC: Scaling
//! Private Iris Code Uniqueness Checks to Millions of Users" (ePrint 2024/705); the
//! coordinator relays sealed probes and round messages and learns only the result.
//!
//! The same files as every modality (the JSON bodies are `privmatch_api::iris`, shared with
//! the SQL front door):
//! [`driver`] (the search rounds on the shared skeleton), [`batch`] (searches run in
//! batches on it), [`work`] (its distributed
//! transactions), [`routes`] (its HTTP handlers), [`client`] (its calls to the coordinator),
//! [`cli`] (its subcommands), [`seal`] (sealed inputs for the SQL front door), [`input`] (NDJSON parsing) and [`synth`] (synthetic templates:
//! `privmatch iris synth` writes the input format [`input`] reads, for demos, tests and
//! benchmarks). Modality-specific: [`policy`] (the
//! operator-signed threshold policy the parties enforce), [`audit`] (entries whose copies
//! diverge between the parties, and their quarantine).
//!
//! Imports shared layers only, never another modality.

pub mod audit;
pub mod batch;
pub mod cli;
pub mod client;
pub mod driver;
pub mod input;
pub mod policy;
pub mod routes;
pub mod seal;
pub mod synth;
pub mod work;
