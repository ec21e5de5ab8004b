//! Cryptography that is not secret sharing: sealing ([`seal`]: client→party sealed boxes,
//! party↔party AEAD channels, pairwise PRF seeds), operator-signed commands ([`sign`]:
//! changes of a party's security state relayed by the coordinator) and function secret
//! sharing ([`fss`]: fixed-key AES PRG, DCF, interval containment). Boolean circuits for the
//! two-party garbled circuits of protocol Π3 of [ABMR20] ([`circuit`]). No modality lives
//! here.

pub mod circuit;
pub mod fss;
pub mod seal;
pub mod sign;
