//! The iris modality at one party: the share types ([`types`]), enrolment and deletion inside
//! the coordinator's distributed transactions ([`enroll`]) and the SQL functions for the
//! rounds of a search ([`search`]), which the engine worker runs (`crate::engine`). The
//! protocol is that of Bloemen et al., "Large-Scale MPC: Scaling Private Iris Code
//! Uniqueness Checks to Millions of Users" (ePrint 2024/705), in [`privmatch_core::iris`].
//!
//! Imports: the shared modules (`errors`, `datum`, `bundles`, `identity`, `engine::client`
//! and `engine::ipc`) and core; never `crate::face`.

mod enroll;
mod search;
mod types;
