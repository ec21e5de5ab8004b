//! # Device-held face templates with packed Paillier [ABMR20]
//!
//! Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile Devices for
//! Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363. The template stays
//! encrypted under the user's own device key; a service provider (a privmatch party) stores
//! the signed encrypted template; a terminal matches a live capture against it.
//!
//! | module | owns |
//! |---|---|
//! | [`cipher`] | Paillier with g = N + 1 [Pai99]: keys, CRT decryption and encryption, r^N pools |
//! | [`key_proof`] | enrolment: the device key is well formed (Π^mod, Π^fac of [CGGMP21]), SP's ring-Pedersen parameters |
//! | [`proofs`] | enrolment: batched plaintext knowledge (Fig. 9), L2 norm (Fig. 10), four-square slack coordinates |
//!
//! See `docs/protocols/paillier.md` for the roles, what each learns and the deviations from
//! the paper.

pub mod cipher;
pub mod key_proof;
pub mod proofs;
