//! Files the CLI and the coordinator write: configurations, credentials, keys and
//! certificates are written atomically (a temporary file beside the target, synced, renamed)
//! and with the permissions they need, so a reader never sees half of one and a secret is
//! never readable by others, even for a moment.

use std::path::Path;

use anyhow::{Context, Result};

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
