//! The party engine (docs/architecture.md): a background worker ([`worker`]) that hosts the
//! modality services keeping state in memory — core's iris search service ([`iris`]: the
//! share matrix and the running searches) and core's face service ([`face`]: the opened
//! templates, the sessions and the stocked dealings), each with the tables it loads from and
//! its messages — the modality-neutral local socket
//! protocol to it ([`ipc`]: frames carry a modality and an operation), the party's keys as a
//! session reads them ([`keys`]), the backend side of the socket and `engine_status()`
//! ([`client`]), and the heap tuning both sides share ([`heap`]).
//!
//! Dependencies: `worker` (the dispatch: the one file that names every modality) → `iris`,
//! `face`, `keys`, `ipc`, `heap`; `client`, `keys` → `ipc`; `iris`, `face` → `ipc`, `keys`.
//! `iris/` and `face/` are their modality's files, with the same names (`mod.rs`: the
//! service's loading and dispatch; `messages.rs`: its calls), and the layout checker holds
//! them to it: neither names the other; the SQL functions of each modality (`crate::iris::search`,
//! `crate::face::masked`) call their service through [`client`] with that file's messages.

pub mod client;
pub mod face;
mod heap;
pub mod ipc;
pub mod iris;
mod keys;
mod requests;
mod socket;
pub mod worker;
