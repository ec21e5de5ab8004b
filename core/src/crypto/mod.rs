//! Cryptography that is not secret sharing: sealing ([`seal`]: client→party sealed boxes,
//! party↔party AEAD channels, pairwise PRF seeds), operator-signed commands ([`sign`]:
//! changes of a party's security state relayed by the coordinator) and function secret
//! sharing ([`fss`]: fixed-key AES PRG, DCF, interval containment). No modality lives here.

pub mod fss;
pub mod seal;
pub mod sign;
