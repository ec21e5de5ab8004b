//! The iris modality at one party: the share types ([`types`]), enrolment and deletion inside
//! the coordinator's distributed transactions ([`enroll`]) and the SQL functions for the
//! rounds of a search ([`search`]) under the party's threshold policy ([`policy`]), which the engine worker runs (`crate::engine`), and the
//! application's SQL front door ([`front_door`]). The
//! protocol is that of Bloemen et al., "Large-Scale MPC: Scaling Private Iris Code
//! Uniqueness Checks to Millions of Users" (ePrint 2024/705), in [`privmatch_core::iris`].
//!
//! Imports: the shared modules (`errors`, `datum`, `bundles`, `identity`, `engine::client`,
//! `engine::ipc`, `front_door`) and core; never `crate::face`.

mod enroll;
mod front_door;
mod policy;
mod search;
mod types;
