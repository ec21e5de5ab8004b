//! What a user's device keeps on disk (packed Paillier, Game-Set-MATCH [ABMR20]): its
//! Paillier secret key, in its own key file, and the signed record the service provider
//! returned at enrolment (σ of §6.1 with the packed encrypted template), which the device
//! presents as Round 1 in the paper and here needs for the layout of its messages.
//!
//! * **Key file**: one line, `privmatch-paillier-device-key-v1 <hex>` (core's
//!   `SecretKey::to_bytes`), mode 0600 from creation, never overwritten; a file other users
//!   may read is refused. The key never leaves the device: nothing prints or logs it.
//! * **Record file**: `<key file>.<device id>.record` unless named, one line
//!   `privmatch-paillier-record-v1 <hex>` (the record's canonical bytes), mode 0600. It is
//!   public in the paper's sense (ciphertexts under the device's key, signed), and checked
//!   against the pinned service provider key whenever it is read.
//! * **Answered sessions** (0.12.0): `<key file>.<device id>.answered`, mode 0600, written
//!   atomically: the sessions whose Round 2 the device accepted, each until that Round 2
//!   expires (core's `paillier::replay`), so a signed Round 2 replayed by the coordinator is
//!   refused even after the device restarts. Written before the device sends its answer.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use ed25519_dalek::VerifyingKey;
use privmatch_core::paillier::cipher::{PublicKey, SecretKey};
use privmatch_core::paillier::messages::MatchError;
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::replay::AnsweredSessions;
use privmatch_core::paillier::signed_round2::VerifiedRound2;
use sha2::{Digest, Sha256};

use crate::files::{create_tagged, read_tagged, write_private, write_tagged};

const KEY_MAGIC: &str = "privmatch-paillier-device-key-v1";
const RECORD_MAGIC: &str = "privmatch-paillier-record-v1";

/// The fingerprint of a device's public key: the first 16 bytes of SHA-256 of N, hex.
pub fn fingerprint(public: &PublicKey) -> String {
    hex::encode(&Sha256::digest(public.to_bytes())[..16])
}

/// Generates a key with an N of `bits` bits (2048 or 3072) and writes it to `path` (0600),
/// refusing to overwrite; returns its public key.
pub fn generate(path: &Path, bits: u32) -> Result<PublicKey> {
    if !matches!(bits, 2048 | 3072) {
        bail!("--bits: 2048 or 3072, not {bits}");
    }
    if path.exists() {
        bail!(
            "{} exists: a device key file is never overwritten",
            path.display()
        );
    }
    let mut rng = crate::cli::keys::sharing_rng()?;
    let secret = SecretKey::generate(bits, &mut rng).map_err(|e| anyhow::anyhow!("{e}"))?;
    create_tagged(path, KEY_MAGIC, &secret.to_bytes())?;
    Ok(secret.public_key().clone())
}

/// Reads the device key at `path`.
pub fn load_key(path: &Path) -> Result<SecretKey> {
    let bytes = read_tagged(path, KEY_MAGIC, "Paillier device key", "pass --key")?;
    SecretKey::from_bytes(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Where the record of `device` enrolled with the key at `key` lives by default.
pub fn record_path(key: &Path, device: &str) -> PathBuf {
    let name = key
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    key.with_file_name(format!("{name}.{device}.record"))
}

/// Where the answered sessions of `device` enrolled with the key at `key` are kept.
pub fn answered_path(key: &Path, device: &str) -> PathBuf {
    let name = key
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    key.with_file_name(format!("{name}.{device}.answered"))
}

/// The sessions a device answered (core's `AnsweredSessions`), kept in a file when it has one.
#[derive(Debug, Default)]
pub struct Answered {
    memory: AnsweredSessions,
    path: Option<PathBuf>,
}

impl Answered {
    /// A memory that lives as long as the process (the library's devices that keep no file).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// The memory kept at `path` (empty if the file does not exist yet).
    pub fn load(path: &Path) -> Result<Self> {
        let memory = match std::fs::read_to_string(path) {
            Ok(text) => AnsweredSessions::from_text(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => AnsweredSessions::new(),
            Err(e) => bail!("{}: {e}", path.display()),
        };
        Ok(Self {
            memory,
            path: Some(path.to_owned()),
        })
    }

    /// The device's check before it answers `round2` at `now`: refused if the session was
    /// answered already (a replayed Round 2); otherwise remembered, and the file written
    /// before anything is sent.
    pub fn admit(&mut self, round2: &VerifiedRound2, now: i64) -> Result<(), MatchError> {
        self.memory.admit(round2, now)?;
        if let Some(path) = &self.path {
            write_private(path, &self.memory.to_text()).map_err(|e| {
                MatchError::Unsigned(format!(
                    "the answered sessions could not be kept in {}: {e:#}",
                    path.display()
                ))
            })?;
        }
        Ok(())
    }

    /// How many sessions are remembered.
    pub fn len(&self) -> usize {
        self.memory.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }
}

/// Writes a signed record to `path` (0600, atomically).
pub fn save_record(path: &Path, signed: &SignedTemplate) -> Result<()> {
    let bytes = signed.to_bytes().map_err(|e| anyhow::anyhow!("{e}"))?;
    write_tagged(path, RECORD_MAGIC, &bytes)
}

/// Reads the record at `path` and checks it: `device`'s, for `secret`'s public key, signed by
/// the pinned service provider key and not expired at `now`.
pub fn load_record(
    path: &Path,
    device: &str,
    secret: &SecretKey,
    service: &VerifyingKey,
    now: i64,
) -> Result<SignedTemplate> {
    let bytes = read_tagged(
        path,
        RECORD_MAGIC,
        "enrolment record",
        "enrol the device with `privmatch device enroll`, or pass --record",
    )?;
    let signed = SignedTemplate::from_bytes(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    signed
        .verify(service, now)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if signed.record.device_id != device {
        bail!(
            "{} is the record of device {:?}, not {device:?}",
            path.display(),
            signed.record.device_id
        );
    }
    if &signed.record.public_key != secret.public_key() {
        bail!(
            "{} was enrolled with another key than the one given",
            path.display()
        );
    }
    Ok(signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_created_once_privately_and_load_back() {
        let dir = std::env::temp_dir().join(format!("pm-device-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("phone.key");
        let public = generate(&path, 2048).expect("generate");
        let loaded = load_key(&path).expect("load");
        assert_eq!(loaded.public_key(), &public);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = format!("{:#}", generate(&path, 2048).expect_err("exists"));
        assert!(again.contains("never overwritten"), "{again}");
        assert!(generate(&dir.join("other.key"), 1024).is_err());
        assert_eq!(fingerprint(&public).len(), 32);
        assert_eq!(
            record_path(&path, "phone-1"),
            dir.join("phone.key.phone-1.record")
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
