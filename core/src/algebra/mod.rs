//! The algebra every protocol computes in: wrapping integer rings Z_2^k ([`ring`]) and the
//! Galois ring GR(2^16, 4) = Z_2^16[x]/(x^4 − x − 1) with its exceptional set ([`galois`]).
//! Imports nothing else of the crate.

pub mod galois;
pub mod ring;
