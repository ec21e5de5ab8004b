//! Secret-sharing schemes over [`crate::algebra`]: degree-1 Shamir sharing over the Galois
//! ring ([`shamir`], the form iris templates are stored in) and replicated 2-of-3 (ABY3)
//! sharing ([`replicated`], the form the MPC sub-protocols compute on).

pub mod replicated;
pub mod shamir;
