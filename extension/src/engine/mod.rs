//! The party engine (docs/architecture.md): a background worker ([`worker`]) that hosts the
//! modality services keeping state in memory — today the iris search service ([`iris`]: the
//! share matrix and the running searches) — the local socket protocol to it ([`ipc`]), the
//! backend side of that socket and `engine_status()` ([`client`]), and the heap tuning both
//! sides share ([`heap`]).
//!
//! Dependencies: `worker` → `iris`, `ipc`, `heap`; `client` → `ipc`, `heap`; `iris` → `ipc`,
//! `crate::identity`. The engine imports core's `iris` (the service it hosts) but no module of
//! `crate::iris` or `crate::face`; the SQL round functions of the iris modality
//! (`crate::iris::search`) call it through [`client`] and [`ipc`].

pub mod client;
pub mod face;
mod heap;
pub mod ipc;
mod iris;
pub mod worker;
