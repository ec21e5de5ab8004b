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
//! | [`params`] | the agreed parameters (ℓ, m, \|N\|, λ, ζ², protocol), their canonical bytes, the derived slot layout (3-AP-free positions) |
//! | [`encoding`] | the packing of [ABMR20] §4 (signed slots, norm-derived width), Mask and ρ, the homomorphic inner product by multi-exponentiation |
//! | [`precomputed`] | the terminal's offline tables per device (Round 1 is reusable): Round 2's inner product without the Horner squarings |
//! | [`messages`] | the wire format (strict decoding), the template signing bytes, the session error type |
//! | [`pi1`] | Π1 (§5, Fig. 3): enrolment, the device and terminal state machines, their messages |
//! | [`pi2`] | Π2 (§6): element encryption and SP packing at enrolment, the four-round state machines (the terminal's state between its rounds encodable: `suspend`/`resume`), the multiplier/addend and X check that Π3 reuses |
//! | [`pi3`] | Π3 (§7, Fig. 5, 6): the five-round state machines with the garbled comparison and OT (the terminal's state after Round 2 and Round 4 encodable) |
//! | [`circuit`] | Π3's boolean circuits and their gadgets (the comparison the terminal garbles) |
//! | [`garble`] | half-gates garbling with free-XOR over the fixed-key AES of `crate::crypto::fss` |
//! | [`ot`] | the two-message endemic OT of Masny–Rindal for the evaluator's input labels |
//! | [`record`] | the service provider's signed template record (σ of §6.1) |
//! | [`key_proof`] | enrolment: the device key is well formed (Π^mod, Π^fac of [CGGMP21]), SP's ring-Pedersen parameters |
//! | [`proofs`] | enrolment: batched plaintext knowledge (Fig. 9), L2 norm (Fig. 10), four-square slack coordinates |
//! | [`enroll`] | enrolment Π_en (§6.1, §8; Fig. 3 for Π1): the device's and the service provider's state machines, their messages, the SP state encoding |
//! | [`terminal`] | the terminal's w and threshold, sealed to the service provider for Round 2 |
//! | [`device_signature`] | the device's signatures with its Paillier key (RSA-FDH, e = N): mailbox polls and replies through the coordinator, Π1's bit for the terminal |
//! | [`signed_round2`] | the service provider's Ed25519 signature on every Round 2 (session, device, protocol, policy threshold, expiry, payload hash), which the device checks against its pinned key before it decrypts |
//! | [`verdict`] | the service provider's signed decision of a Π2/Π3 session, which the terminal checks (the coordinator relays it) |
//! | [`sealed`] | reply keys: the terminal's verdict and the device's Round 4 sealed to the one that must learn them, so the coordinator relays no bit in the clear; the device's Round 3 with its reply key |
//! | [`replay`] | the device's memory of the sessions it answered (each at most once) |
//! | [`quantize`] | float face embeddings → templates u and measurements w: M from the layout (m-bit elements, ‖u‖² ≤ ζ² for every unit vector), the threshold, the plaintext reference |
//!
//! See `docs/protocols/paillier.md` for the roles, what each learns and the deviations from
//! the paper.

pub mod cipher;
pub mod circuit;
pub mod device_signature;
pub mod encoding;
pub mod enroll;
pub mod garble;
pub mod key_proof;
pub mod messages;
pub mod ot;
pub mod params;
pub mod pi1;
pub mod pi2;
pub mod pi3;
pub mod precomputed;
pub mod proofs;
pub mod quantize;
pub mod record;
pub mod replay;
pub mod sealed;
pub mod signed_round2;
pub mod terminal;
pub mod verdict;
