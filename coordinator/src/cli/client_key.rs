//! A registered client's signing key and the inputs it signs (core's `crypto::client_auth`):
//! the key file `privmatch client keygen` writes, and [`ClientCredential::wrap_for_party`],
//! with which the commands that seal probes (`cli/keys.rs`, `Sealer`) sign each sealed blob
//! for its party and purpose. The operators' commands that register clients are in
//! `cli/client_auth.rs`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use privmatch_core::crypto::client_auth::{ClientId, ClientSigningKey, ClientVerifyingKey};
use privmatch_core::party::PartyIndex;
use zeroize::Zeroizing;

use crate::files::{create_tagged, read_tagged, write_atomic};

const KEY_MAGIC: &str = "privmatch-client-key-v1";

/// Reads a client's signing key file (`privmatch-client-key-v1 <64 hex digits>`, 0600; a file
/// others may read is refused).
pub fn load_key(path: &Path) -> Result<ClientSigningKey> {
    let bytes = read_tagged(path, KEY_MAGIC, "client signing key", "pass --client-key")?;
    let seed: Zeroizing<[u8; 32]> =
        Zeroizing::new(bytes.as_slice().try_into().ok().with_context(|| {
            format!("{} is not a privmatch client signing key", path.display())
        })?);
    Ok(ClientSigningKey::from_bytes(&seed))
}

/// The file beside a key file `path` that holds its public key (`F.pub`).
pub fn public_key_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".pub");
    PathBuf::from(name)
}

/// Creates a fresh client key at `path` (0600; an existing file is never overwritten) and its
/// public key at `path.pub` (0644); returns the public key.
pub fn create_key(path: &Path) -> Result<ClientVerifyingKey> {
    let key = ClientSigningKey::generate(&mut rand::rngs::OsRng);
    create_tagged(path, KEY_MAGIC, key.to_bytes().as_slice())?;
    let public = key.verifying_key();
    write_atomic(
        &public_key_path(path),
        &format!("{}\n", public.to_hex()),
        0o644,
    )?;
    Ok(public)
}

/// A public key given as 64 hex digits or as a file holding them (`privmatch client keygen`'s
/// `F.pub`).
pub fn parse_public_key(text: &str) -> Result<ClientVerifyingKey> {
    if let Ok(key) = ClientVerifyingKey::from_hex(text) {
        return Ok(key);
    }
    let path = Path::new(text);
    let contents = std::fs::read_to_string(path).with_context(|| {
        format!("--public-key {text:?} is neither 64 hex digits nor a readable file")
    })?;
    ClientVerifyingKey::from_hex(&contents).with_context(|| {
        format!(
            "{} does not hold a client public key (64 hex digits)",
            path.display()
        )
    })
}

/// A registered client's identity as a sealing command holds it: its id and signing key.
#[derive(Debug)]
pub struct ClientCredential {
    id: ClientId,
    key: ClientSigningKey,
}

impl ClientCredential {
    /// The client `id` with the signing key in the file `key`.
    pub fn load(key: &Path, id: &str) -> Result<Self> {
        let id = ClientId::new(id).context("--client-id")?;
        Ok(ClientCredential {
            id,
            key: load_key(key)?,
        })
    }

    /// A credential from a key already in memory.
    pub fn new(id: ClientId, key: ClientSigningKey) -> Self {
        ClientCredential { id, key }
    }

    /// The client's id.
    pub fn id(&self) -> &ClientId {
        &self.id
    }

    /// Signs `sealed`, a blob sealed to party `party` for `purpose` (the sealing purpose
    /// label, e.g. core's `IRIS_PROBE_PURPOSE`), as this client's input to that party: a fresh
    /// nonce, valid for five minutes from now (core's `client_auth` module docs). The party
    /// checks it with `privmatch.client_auth_check` or inside the protocol function.
    pub fn wrap_for_party(&self, party: PartyIndex, purpose: &str, sealed: &[u8]) -> Vec<u8> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.key.wrap(
            &self.id,
            party,
            purpose,
            sealed,
            now,
            &mut rand::rngs::OsRng,
        )
    }
}

/// Signs `sealed` for `party` and `purpose` with `credential` ([`ClientCredential::wrap_for_party`]),
/// or returns it unchanged without one (an unsigned input, which a party accepts only under
/// the policy `optional`).
pub fn wrap_for_party(
    credential: Option<&ClientCredential>,
    party: PartyIndex,
    purpose: &str,
    sealed: Vec<u8>,
) -> Vec<u8> {
    match credential {
        Some(c) => c.wrap_for_party(party, purpose, &sealed),
        None => sealed,
    }
}
