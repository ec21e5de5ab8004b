//! Cryptography that is not secret sharing: sealing ([`seal`]: client→party sealed boxes,
//! party↔party AEAD channels, pairwise PRF seeds), operator-signed commands ([`sign`]:
//! changes of a party's security state relayed by the coordinator), a party's own signing key
//! derived from its key file ([`party_sign`]: what it signs its outputs with), outputs sealed to
//! the requesting client's reply key ([`reply`]), secrets kept sealed in a
//! party's own tables ([`at_rest`]) and function secret
//! sharing ([`fss`]: fixed-key AES PRG, DCF, interval containment). Two-party garbled
//! circuits for protocol Π3 of [ABMR20]: boolean circuits and their gadgets ([`circuit`]),
//! half-gates garbling with free-XOR over the fixed-key AES ([`garble`]) and the two-message
//! endemic OT of Masny–Rindal for the evaluator's input labels ([`ot`]). No modality lives
//! here.
//!
//! [ABMR20]: https://eprint.iacr.org/2020/1363

pub mod at_rest;
pub mod circuit;
pub mod client_auth;
pub mod fss;
pub mod garble;
pub mod ot;
pub mod party_sign;
pub mod reply;
pub mod seal;
pub mod sign;
