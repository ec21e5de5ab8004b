//! The party's keys as the engine reads them at the start of a session, whatever the
//! modality: its own (from the key file, through `crate::identity`) and its pinned peers'. Read
//! on the worker's main thread, in the transaction of the request (SPI).
//!
//! Imports: [`super::ipc`] (errors), [`crate::identity`]; no modality.

use privmatch_core::crypto::seal::PartyKeys;

use super::ipc::{EngineError, ErrorKind};
use crate::identity::{read_identity, read_peers};

fn spi_error(e: pgrx::spi::Error) -> EngineError {
    EngineError::internal(format!("reading the party's keys: {e}"))
}

/// The keys of this party and its pinned peers, read in the current transaction.
pub fn read_keys() -> Result<PartyKeys, EngineError> {
    let Some(stored) = read_identity().map_err(spi_error)? else {
        return Err(EngineError::new(
            ErrorKind::NotReady,
            "this privmatch party has no identity yet: run SELECT privmatch.init_party(<index>)",
        ));
    };
    let identity = stored
        .decode()
        .map_err(|e| EngineError::internal(e.to_string()))?;
    Ok(PartyKeys {
        me: identity.index,
        secret: identity.secret,
        peers: read_peers().map_err(spi_error)?,
    })
}
