//! Session ids: the 16 random bytes the coordinator picks for one search or comparison
//! session, and to which every sealed probe and every pairwise round message is bound.

use rand_core::{CryptoRng, RngCore};

/// Length of a session id, in bytes.
pub const SESSION_ID_LEN: usize = 16;

/// A session id as chosen by the coordinator (random; single-use at every party).
pub type SessionId = [u8; SESSION_ID_LEN];

/// A fresh random session id.
pub fn new_session_id<R: RngCore + CryptoRng>(rng: &mut R) -> SessionId {
    let mut id = [0u8; SESSION_ID_LEN];
    rng.fill_bytes(&mut id);
    id
}
