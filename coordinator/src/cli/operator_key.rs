//! A party operator's Ed25519 signing key file (core's `crypto::sign`): created by
//! `privmatch cluster up` for each local operator, read by the commands that sign changes of
//! a party's security state (`privmatch face configure`). One line,
//! `privmatch-operator-key-v1 <64 hex digits>`, mode 0600; a file others may read is refused.

use std::path::Path;

use anyhow::{Context, Result};
use privmatch_core::crypto::sign::OperatorSigningKey;
use zeroize::Zeroizing;

use crate::files::{create_tagged, read_tagged};

const MAGIC: &str = "privmatch-operator-key-v1";

/// Reads the signing key at `path`.
pub fn load(path: &Path) -> Result<OperatorSigningKey> {
    let bytes = read_tagged(path, MAGIC, "operator signing key", "pass --operator-key")?;
    let seed: Zeroizing<[u8; 32]> =
        Zeroizing::new(bytes.as_slice().try_into().ok().with_context(|| {
            format!("{} is not a privmatch operator signing key", path.display())
        })?);
    Ok(OperatorSigningKey::from_bytes(&seed))
}

/// Creates a fresh signing key at `path` (0600) unless one exists; returns the key there.
pub fn create_if_missing(path: &Path) -> Result<OperatorSigningKey> {
    if path.exists() {
        return load(path);
    }
    let key = OperatorSigningKey::generate(&mut rand::rngs::OsRng);
    create_tagged(path, MAGIC, key.to_bytes().as_slice())?;
    Ok(key)
}

/// A counter for a new command: the time in microseconds, so that commands from any client
/// of the same operator increase without shared state.
pub fn fresh_counter() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn created_keys_load_back_and_readable_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("pm-operator-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("p2.signing.key");
        let key = create_if_missing(&path).expect("create");
        let again = create_if_missing(&path).expect("load existing");
        assert_eq!(key.verifying_key(), again.verifying_key());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert!(load(&path).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
