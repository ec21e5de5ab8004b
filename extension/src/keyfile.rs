//! The party's key file: where its long-term X25519 secret key lives, outside every SQL table
//! (so outside the WAL, `pg_dump` output and streaming replicas), and, when this party is the
//! service provider of the packed Paillier modality, its Ed25519 signing key (σ of
//! Game-Set-MATCH [ABMR20] §6.1, signed over every enrolled template).
//!
//! The file holds the line `privmatch-party-key-v1 <64 hex digits>` and, optionally, a second
//! line `privmatch-sp-signing-key-v1 <64 hex digits>` (the Ed25519 seed). It is created by
//! `init_party` with mode 0600 (never overwritten; both lines for a new party), and a key file
//! of an older party gets its signing line from `paillier_init_service` ([`add_signing_key`]:
//! a new file written beside it and renamed over it, so a crash leaves the old file or the
//! new one, never half of one). It is read by the party's own server
//! processes, which refuse a file that other users may read or write. Its path is the GUC
//! `privmatch.key_file`: relative paths are taken from the data directory. Operators who take
//! physical backups of the data directory keep the file outside it (`privmatch cluster up`
//! puts it beside the data directory) and back it up separately, as a secret.
//!
//! Pure file handling: no Postgres call, so it is unit-tested on its own.
//!
//! Imports: core's `crypto::seal` only.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use privmatch_core::crypto::seal::PartySecretKey;
use zeroize::Zeroizing;

/// The first word of the file: names the format, so another file is never mistaken for a key.
const MAGIC: &str = "privmatch-party-key-v1";

/// The first word of the optional signing-key line.
const SIGNING_MAGIC: &str = "privmatch-sp-signing-key-v1";

/// Everything the key file holds.
pub struct KeyFileContents {
    /// The party's long-term X25519 secret key.
    pub party: PartySecretKey,
    /// The service provider's Ed25519 signing key seed (Game-Set-MATCH [ABMR20] §6.1 σ), if
    /// the file has one.
    pub sp_signing: Option<Zeroizing<[u8; 32]>>,
}

/// Why the key file cannot be used. Messages name the path, never the key.
#[derive(Debug)]
pub enum KeyFileError {
    /// There is no file at the path.
    Missing(PathBuf),
    /// The file exists but may be read or written by other users (mode shown in octal).
    Permissions(PathBuf, u32),
    /// The file is not a privmatch party key.
    Malformed(PathBuf),
    /// `init_party` found a file already there (it never overwrites a key).
    Exists(PathBuf),
    /// Reading or writing failed.
    Io(PathBuf, std::io::Error),
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFileError::Missing(p) => write!(f, "the party key file {} does not exist", p.display()),
            KeyFileError::Permissions(p, mode) => write!(
                f,
                "the party key file {} has mode {mode:04o}: other users may read or write it (it must be 0600 or 0400)",
                p.display()
            ),
            KeyFileError::Malformed(p) => {
                write!(f, "{} is not a privmatch party key file", p.display())
            }
            KeyFileError::Exists(p) => write!(f, "the party key file {} already exists", p.display()),
            KeyFileError::Io(p, e) => write!(f, "the party key file {}: {e}", p.display()),
        }
    }
}

/// The key file's path: `setting` (the GUC) as is when absolute, else under `data_dir`.
pub fn resolve(setting: &str, data_dir: &Path) -> PathBuf {
    let path = Path::new(setting);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        data_dir.join(path)
    }
}

/// Reads the secret key at `path`, refusing a file other users may read or write.
pub fn read(path: &Path) -> Result<PartySecretKey, KeyFileError> {
    read_contents(path).map(|c| c.party)
}

/// Reads every key at `path`, refusing a file other users may read or write.
pub fn read_contents(path: &Path) -> Result<KeyFileContents, KeyFileError> {
    let io = |e: std::io::Error| KeyFileError::Io(path.to_path_buf(), e);
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(KeyFileError::Missing(path.to_path_buf()))
        }
        Err(e) => return Err(io(e)),
    };
    let mode = file.metadata().map_err(io)?.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Permissions(path.to_path_buf(), mode));
    }
    let mut text = Zeroizing::new(String::new());
    // A key file is ~180 bytes; reading at most 512 keeps a wrong path from filling memory.
    Read::by_ref(&mut file)
        .take(512)
        .read_to_string(&mut text)
        .map_err(|_| KeyFileError::Malformed(path.to_path_buf()))?;
    parse(&text).ok_or_else(|| KeyFileError::Malformed(path.to_path_buf()))
}

fn parse_line(line: &str, magic: &str) -> Option<Zeroizing<[u8; 32]>> {
    let mut words = line.split_whitespace();
    if words.next()? != magic {
        return None;
    }
    let hex_key = words.next()?;
    if words.next().is_some() {
        return None;
    }
    let mut bytes = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(hex_key, bytes.as_mut_slice()).ok()?;
    Some(bytes)
}

fn parse(text: &str) -> Option<KeyFileContents> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let party = parse_line(lines.next()?, MAGIC)?;
    let sp_signing = match lines.next() {
        Some(line) => Some(parse_line(line, SIGNING_MAGIC)?),
        None => None,
    };
    if lines.next().is_some() {
        return None;
    }
    Some(KeyFileContents {
        party: PartySecretKey::from_bytes(*party),
        sp_signing,
    })
}

fn contents_text(secret: &PartySecretKey, sp_signing: Option<&[u8; 32]>) -> Zeroizing<String> {
    let bytes = Zeroizing::new(secret.to_bytes());
    let mut line = Zeroizing::new(format!("{MAGIC} {}\n", hex::encode(bytes.as_slice())));
    if let Some(seed) = sp_signing {
        line.push_str(&format!("{SIGNING_MAGIC} {}\n", hex::encode(seed)));
    }
    line
}

fn sync_dir(path: &Path) -> Result<(), KeyFileError> {
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| KeyFileError::Io(path.to_path_buf(), e))?;
    }
    Ok(())
}

/// Writes `secret` to a new file at `path` with mode 0600 and makes it durable (the file and
/// its directory are synced before the identity row that depends on it commits). Never
/// overwrites: an existing file is [`KeyFileError::Exists`].
pub fn create(path: &Path, secret: &PartySecretKey) -> Result<(), KeyFileError> {
    create_with(path, secret, None)
}

/// [`create`] with the service provider's Ed25519 signing seed as a second line.
pub fn create_with(
    path: &Path,
    secret: &PartySecretKey,
    sp_signing: Option<&[u8; 32]>,
) -> Result<(), KeyFileError> {
    let io = |e: std::io::Error| KeyFileError::Io(path.to_path_buf(), e);
    let mut file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(KeyFileError::Exists(path.to_path_buf()))
        }
        Err(e) => return Err(io(e)),
    };
    let line = contents_text(secret, sp_signing);
    file.write_all(line.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    sync_dir(path)
}

/// Adds the service provider's Ed25519 signing seed to the existing key file at `path`
/// (which must not have one: [`KeyFileError::Exists`]): the whole file is written anew beside
/// it (`<path>.new`, mode 0600, synced) and renamed over it, then the directory is synced.
pub fn add_signing_key(path: &Path, seed: &[u8; 32]) -> Result<(), KeyFileError> {
    let io = |e: std::io::Error| KeyFileError::Io(path.to_path_buf(), e);
    let current = read_contents(path)?;
    if current.sp_signing.is_some() {
        return Err(KeyFileError::Exists(path.to_path_buf()));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    // A leftover of an interrupted earlier call holds no key that is in use: start over.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    let text = contents_text(&current.party, Some(seed));
    file.write_all(text.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    sync_dir(path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rand::SeedableRng;

    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pm-keyfile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn create_then_read_round_trips_and_never_overwrites() {
        let dir = temp_dir("round");
        let path = dir.join("party.key");
        let secret = PartySecretKey::generate(&mut rand_chacha::ChaCha20Rng::seed_from_u64(7));
        create(&path, &secret).expect("create");
        let mode = std::fs::metadata(&path).expect("metadata").mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(read(&path).expect("read").to_bytes(), secret.to_bytes());
        let other = PartySecretKey::generate(&mut rand_chacha::ChaCha20Rng::seed_from_u64(8));
        assert!(matches!(
            create(&path, &other),
            Err(KeyFileError::Exists(_))
        ));
        assert_eq!(read(&path).expect("read").to_bytes(), secret.to_bytes());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn refuses_missing_readable_by_others_and_malformed_files() {
        let dir = temp_dir("refuse");
        let path = dir.join("party.key");
        assert!(matches!(read(&path), Err(KeyFileError::Missing(_))));
        let secret = PartySecretKey::generate(&mut rand_chacha::ChaCha20Rng::seed_from_u64(9));
        create(&path, &secret).expect("create");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = read(&path).expect_err("world-readable");
        assert!(matches!(err, KeyFileError::Permissions(_, 0o644)));
        assert!(!err.to_string().contains(&hex::encode(secret.to_bytes())));
        for bad in [
            "",
            "privmatch-party-key-v1",
            "other 00",
            "privmatch-party-key-v1 zz",
        ] {
            std::fs::write(&path, bad).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            assert!(
                matches!(read(&path), Err(KeyFileError::Malformed(_))),
                "{bad:?}"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_signing_key_is_added_once_and_read_back() {
        let dir = temp_dir("signing");
        let path = dir.join("party.key");
        let secret = PartySecretKey::generate(&mut rand_chacha::ChaCha20Rng::seed_from_u64(10));
        create(&path, &secret).expect("create");
        assert!(read_contents(&path).expect("read").sp_signing.is_none());
        add_signing_key(&path, &[5u8; 32]).expect("add");
        let back = read_contents(&path).expect("read");
        assert_eq!(back.party.to_bytes(), secret.to_bytes());
        assert_eq!(back.sp_signing.as_deref(), Some(&[5u8; 32]));
        let mode = std::fs::metadata(&path).expect("metadata").mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(
            add_signing_key(&path, &[6u8; 32]),
            Err(KeyFileError::Exists(_))
        ));
        assert_eq!(read(&path).expect("read").to_bytes(), secret.to_bytes());
        let other = dir.join("both.key");
        create_with(&other, &secret, Some(&[7u8; 32])).expect("create both");
        assert_eq!(
            read_contents(&other).expect("read").sp_signing.as_deref(),
            Some(&[7u8; 32])
        );
        std::fs::write(&other, format!("{MAGIC} {}\nother 00\n", "00".repeat(32))).expect("write");
        assert!(matches!(read(&other), Err(KeyFileError::Malformed(_))));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn relative_paths_are_under_the_data_directory() {
        let data = Path::new("/srv/pg/data");
        assert_eq!(resolve("k.key", data), data.join("k.key"));
        assert_eq!(
            resolve("/etc/pm/k.key", data),
            PathBuf::from("/etc/pm/k.key")
        );
    }
}
