//! Files the CLI and the coordinator write: configurations, credentials, keys and
//! certificates are written atomically (a temporary file beside the target, synced, renamed)
//! and with the permissions they need, so a reader never sees half of one and a secret is
//! never readable by others, even for a moment.

use std::path::Path;

use anyhow::{bail, Context, Result};
use zeroize::Zeroizing;

/// Writes `text` to `path` atomically (a temporary file beside it, synced, then renamed), with
/// permissions `mode`: a reader sees the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, text: &str, mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!("{name}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Writes a secret (a credential, a configuration holding one) atomically, mode 0600.
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    write_atomic(path, text, 0o600)
}

/// Reads a one-line secret key file, `<magic> <hex digits>`, refusing one that other users may
/// read (mode 0600 expected): the decoded bytes, wiped when dropped. `what` names the file in
/// errors and `hint` says how to point at another one when it cannot be read. Errors never
/// contain the key.
pub fn read_tagged(path: &Path, magic: &str, what: &str, hint: &str) -> Result<Zeroizing<Vec<u8>>> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path)
        .with_context(|| format!("cannot read the {what} {} ({hint})", path.display()))?;
    if metadata.mode() & 0o077 != 0 {
        bail!(
            "the {what} {} has mode {:04o}: other users may read it (chmod 600)",
            path.display(),
            metadata.mode() & 0o777
        );
    }
    let text = Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?,
    );
    let mut words = text.split_whitespace();
    let (Some(found), Some(digits), None) = (words.next(), words.next(), words.next()) else {
        bail!("{} is not a privmatch {what}", path.display());
    };
    if found != magic {
        bail!("{} is not a privmatch {what}", path.display());
    }
    let bytes = Zeroizing::new(
        hex::decode(digits)
            .ok()
            .with_context(|| format!("{} is not a privmatch {what}", path.display()))?,
    );
    Ok(bytes)
}

/// Creates a one-line tagged file `<magic> <hex digits of secret>` at `path` (its directory
/// too), mode 0600 from the start; refuses to overwrite an existing file (a key file).
pub fn create_tagged(path: &Path, magic: &str, secret: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let line = Zeroizing::new(format!("{magic} {}\n", hex::encode(secret)));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            if path.exists() {
                format!("{} exists: a key file is never overwritten", path.display())
            } else {
                format!("cannot write {}", path.display())
            }
        })?;
    file.write_all(line.as_bytes())?;
    file.sync_all()?;
    Ok(())
}

/// Writes a one-line tagged file `<magic> <hex digits of bytes>` at `path` atomically, mode
/// 0600, replacing an earlier one (a device's enrolment record).
pub fn write_tagged(path: &Path, magic: &str, bytes: &[u8]) -> Result<()> {
    write_private(path, &format!("{magic} {}\n", hex::encode(bytes)))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn tagged_files_round_trip_keys_are_never_overwritten_and_must_be_private() {
        let dir = std::env::temp_dir().join(format!("pm-key-line-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub").join("a.key");
        create_tagged(&path, "test-key-v1", &[1, 2, 0xfe]).expect("create");
        let back = read_tagged(&path, "test-key-v1", "test key", "pass --key").expect("read");
        assert_eq!(back.as_slice(), &[1, 2, 0xfe]);
        let again = create_tagged(&path, "test-key-v1", &[9]).expect_err("exists");
        assert!(format!("{again:#}").contains("never overwritten"));
        assert!(read_tagged(&path, "other-v1", "test key", "").is_err());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let open = read_tagged(&path, "test-key-v1", "test key", "").expect_err("readable");
        assert!(format!("{open:#}").contains("chmod 600"));
        let missing =
            read_tagged(&dir.join("none"), "m", "test key", "pass --key").expect_err("missing");
        assert!(format!("{missing:#}").contains("pass --key"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
