//! The algebra every protocol computes in: wrapping integer rings Z_2^k ([`ring`]), the
//! Galois ring GR(2^16, 4) = Z_2^16[x]/(x^4 − x − 1) with its exceptional set ([`galois`]),
//! and modular exponentiation of big integers on AVX-512 IFMA ([`montgomery`]).
//! Imports nothing else of the crate.

pub mod galois;
pub mod montgomery;
pub mod ring;
