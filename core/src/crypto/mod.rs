//! Cryptography that is not secret sharing: sealing ([`seal`]: client→party sealed boxes,
//! party↔party AEAD channels, pairwise PRF seeds), operator-signed commands ([`sign`]:
//! changes of a party's security state relayed by the coordinator), a party's own signing key
//! derived from its key file ([`party_sign`]: what it signs its outputs with), outputs sealed to
//! the requesting client's reply key ([`reply`]), secrets kept sealed in a
//! party's own tables ([`at_rest`]) and function secret
//! sharing ([`fss`]: fixed-key AES PRG, DCF, interval containment; its AES engines also
//! expand the channels' pads and drive Paillier's garbling, so it stays shared). Π3's
//! garbled circuits and OT live with the modality that uses them (`crate::paillier`). No
//! modality lives here.

pub mod at_rest;
pub mod client_auth;
pub mod fss;
pub mod party_sign;
pub mod reply;
pub mod seal;
pub mod sign;
