//! A party's identity: its index and long-term X25519 key, generated inside this party by
//! [`init_party`], and the pinned public keys of its peers ([`pin_peer`], [`pinned_peer`]).
//! The table `privmatch.party_identity` holds the index and the **public** key; the secret key
//! is in the party's key file ([`crate::keyfile`], GUC `privmatch.key_file`), so it is in no
//! table, no WAL record, no dump and no replica. No function returns it; only its public half
//! and fingerprint leave the party. Tables: `sql/common.sql`; who may call what:
//! `sql/roles.sql` (`init_party` and `pin_peer` belong to the party's operator).
//!
//! Imports: [`crate::errors`] and [`crate::keyfile`] only (no modality).

use std::cell::RefCell;
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use privmatch_core::crypto::party_sign::PartySigningKey;
use privmatch_core::crypto::seal::{PairwiseCache, PartyPublicKey, PartySecretKey};
use privmatch_core::party::PartyIndex;

use crate::errors::{get_one, raise, raise_internal};
use crate::keyfile::{self, KeyFileError};

/// This process's channel secrets with its peers ([`PairwiseCache`]): derived once, not for
/// every session (backends and the engine worker each have their own).
pub static CHANNELS: PairwiseCache = PairwiseCache::new();

/// `privmatch.key_file`: the party's key file; a relative path is under the data directory.
/// Settable only in the server's configuration (SIGHUP), never by a session.
pub static KEY_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"privmatch_party.key"));

/// Defines the identity GUCs (called from `_PG_init`).
pub fn register_gucs() {
    GucRegistry::define_string_guc(
        c"privmatch.key_file",
        c"The privmatch party's key file (its long-term secret key).",
        c"Relative paths are under the data directory. Keep it outside the data directory when physical backups of it are taken.",
        &KEY_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
}

/// The key file's path, as configured now.
pub fn key_file_path() -> PathBuf {
    let setting = KEY_FILE
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "privmatch_party.key".to_owned());
    // SAFETY: DataDir is set by the postmaster before any backend or worker runs and is a
    // NUL-terminated string that lives as long as the process.
    let data_dir = unsafe { std::ffi::CStr::from_ptr(pg_sys::DataDir) }
        .to_string_lossy()
        .into_owned();
    keyfile::resolve(&setting, std::path::Path::new(&data_dir))
}

/// This party's index and secret key, as loaded for one call.
#[derive(Clone)]
pub struct Identity {
    /// Which party this database is.
    pub index: PartyIndex,
    /// Its long-term secret key.
    pub secret: PartySecretKey,
}

fn not_initialised() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "this privmatch party has no identity yet",
        Some("its operator runs SELECT privmatch.init_party(<index>) once on this database"),
    )
}

/// The row of `privmatch.party_identity`, as stored.
pub struct StoredIdentity {
    /// `party_index`.
    pub index: i32,
    /// `public_key` (32 bytes unless corrupted).
    pub public: Vec<u8>,
}

/// Why the stored identity cannot be used.
#[derive(Debug)]
pub enum IdentityError {
    /// The row is corrupted.
    Corrupted(String),
    /// The key file is missing, unreadable or malformed.
    KeyFile(KeyFileError),
    /// The key file holds another party's key.
    Mismatch(PathBuf),
}

impl std::fmt::Display for IdentityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdentityError::Corrupted(e) => f.write_str(e),
            IdentityError::KeyFile(e) => e.fmt(f),
            IdentityError::Mismatch(path) => write!(
                f,
                "the party key file {} does not hold the secret key of this party's public key",
                path.display()
            ),
        }
    }
}

impl IdentityError {
    /// The SQLSTATE it is raised with.
    pub fn code(&self) -> PgSqlErrorCode {
        match self {
            IdentityError::Corrupted(_)
            | IdentityError::Mismatch(_)
            | IdentityError::KeyFile(KeyFileError::Malformed(_)) => {
                PgSqlErrorCode::ERRCODE_DATA_CORRUPTED
            }
            IdentityError::KeyFile(KeyFileError::Missing(_)) => {
                PgSqlErrorCode::ERRCODE_UNDEFINED_FILE
            }
            IdentityError::KeyFile(KeyFileError::Permissions(..)) => {
                PgSqlErrorCode::ERRCODE_CONFIG_FILE_ERROR
            }
            IdentityError::KeyFile(KeyFileError::Exists(_)) => {
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            IdentityError::KeyFile(KeyFileError::Io(..)) => PgSqlErrorCode::ERRCODE_IO_ERROR,
        }
    }
}

/// What an identity was decoded from: the identity row, the key file's path and the file as
/// `stat` saw it (device, inode, size, mode, modification and change times), so that a key file
/// replaced, rewritten or re-permissioned since is read and checked again.
#[derive(PartialEq, Eq)]
struct DecodedFrom {
    index: i32,
    public: Vec<u8>,
    path: PathBuf,
    file: Option<[i64; 6]>,
}

thread_local! {
    // The identity this process decoded last: reading the key file and deriving its public key
    // (an X25519 scalar multiplication) once per backend instead of in every call on a
    // session's path (docs/benchmarks/log.md, issue 34's face verification).
    static DECODED: RefCell<Option<(DecodedFrom, Identity)>> = const { RefCell::new(None) };
}

/// The key file at `path` as `stat` sees it (None when it cannot be read: then it is read,
/// and the error reported, every time).
fn key_file_stamp(path: &std::path::Path) -> Option<[i64; 6]> {
    let m = std::fs::metadata(path).ok()?;
    let wide = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Some([
        wide(m.dev()),
        wide(m.ino()),
        wide(m.size()),
        i64::from(m.mode()),
        m.mtime()
            .wrapping_mul(1_000_000_000)
            .wrapping_add(m.mtime_nsec()),
        m.ctime()
            .wrapping_mul(1_000_000_000)
            .wrapping_add(m.ctime_nsec()),
    ])
}

impl StoredIdentity {
    /// The identity this row and the key file hold, or what is wrong with them (a missing or
    /// unreadable key file, or one that does not belong to this party's public key). The key
    /// file is read and checked once per process while the row and the file stay as they were.
    pub fn decode(self) -> Result<Identity, IdentityError> {
        let path = key_file_path();
        let from = DecodedFrom {
            file: key_file_stamp(&path),
            index: self.index,
            public: self.public,
            path,
        };
        let cached = DECODED.with(|d| {
            d.borrow()
                .as_ref()
                .filter(|(seen, _)| from.file.is_some() && *seen == from)
                .map(|(_, identity)| identity.clone())
        });
        if let Some(identity) = cached {
            return Ok(identity);
        }
        let index = PartyIndex::new(i64::from(from.index))
            .map_err(|e| IdentityError::Corrupted(e.to_string()))?;
        let secret = keyfile::read(&from.path).map_err(IdentityError::KeyFile)?;
        if secret.public_key().as_bytes().as_slice() != from.public.as_slice() {
            return Err(IdentityError::Mismatch(from.path));
        }
        let identity = Identity { index, secret };
        DECODED.with(|d| *d.borrow_mut() = Some((from, identity.clone())));
        Ok(identity)
    }
}

/// Reads this party's identity row, if `init_party` has run (in the current transaction; for
/// callers that cannot raise, such as the engine worker).
pub fn read_identity() -> Result<Option<StoredIdentity>, pgrx::spi::Error> {
    Spi::connect(|client| {
        let rows = crate::errors::read(
            client,
            "SELECT party_index, public_key FROM privmatch.party_identity",
            &[],
        )?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        Ok(Some(StoredIdentity {
            index: row.get(1)?.unwrap_or(-1),
            public: row.get(2)?.unwrap_or_default(),
        }))
    })
}

/// Reads the pinned public keys of the peers, by party index (`None`: not pinned, or not a
/// well-formed key; `pin_peer` never pins this party itself).
pub fn read_peers() -> Result<[Option<PartyPublicKey>; 3], pgrx::spi::Error> {
    let mut peers: [Option<PartyPublicKey>; 3] = [None; 3];
    Spi::connect(|client| {
        let rows = crate::errors::read(
            client,
            "SELECT party_index, public_key FROM privmatch.peers",
            &[],
        )?;
        for row in rows {
            let index: i32 = row.get(1)?.unwrap_or(-1);
            let key: Vec<u8> = row.get(2)?.unwrap_or_default();
            if let (Ok(p), Ok(key)) = (PartyIndex::new(i64::from(index)), <[u8; 32]>::try_from(key))
            {
                peers[p.as_usize()] = Some(PartyPublicKey::from_bytes(key));
            }
        }
        Ok::<(), pgrx::spi::Error>(())
    })?;
    Ok(peers)
}

fn stored_identity() -> Option<StoredIdentity> {
    read_identity().unwrap_or_else(|e| raise_internal(e))
}

/// Loads this party's identity, or raises 55000 if `init_party` was never run.
pub fn load_identity() -> Identity {
    let Some(stored) = stored_identity() else {
        not_initialised()
    };
    stored
        .decode()
        .unwrap_or_else(|e| raise(e.code(), e.to_string(), None))
}

/// The pinned public key of `peer`, or a 55000 error from `function` naming what to do.
pub fn pinned_peer(function: &str, peer: PartyIndex) -> PartyPublicKey {
    let key = get_one::<Vec<u8>>(
        function,
        "SELECT (SELECT public_key FROM privmatch.peers WHERE party_index = $1)",
        &[i32::from(peer.as_u8()).into()],
    );
    let key: Option<[u8; 32]> = key.and_then(|k| k.try_into().ok());
    match key {
        Some(key) => PartyPublicKey::from_bytes(key),
        None => raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{function}: the public key of {peer} is not pinned"),
            Some("pin it with SELECT privmatch.pin_peer(<index>, '<hex key>')"),
        ),
    }
}

/// Gives this database its party identity: index `party_index` (0, 1 or 2) and its X25519
/// key pair. The secret key goes to the key file (`privmatch.key_file`), never to a table: a
/// fresh one (with a fresh Ed25519 service-provider signing seed beside it) from the operating
/// system's CSPRNG, or the one already in the key file (a party
/// restored from a dump, its key file copied by its operator). Returns the public key (hex).
/// Running it again with the same index returns the existing key; with another index it
/// fails. The party's operator's function (`sql/roles.sql`).
#[pg_extern(volatile)]
fn init_party(party_index: i32) -> String {
    let index = PartyIndex::new(i64::from(party_index)).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("init_party: {e}"),
            None,
        )
    });
    if let Some(StoredIdentity {
        index: existing,
        public,
    }) = stored_identity()
    {
        if existing != party_index {
            raise(
                PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "this database is already initialised as party P{existing}, not P{party_index}"
                ),
                Some("a party's identity cannot change; use a fresh database for another party"),
            );
        }
        return hex::encode(public);
    }
    let path = key_file_path();
    let secret = match keyfile::read(&path) {
        Ok(secret) => secret,
        Err(KeyFileError::Missing(_)) => {
            let secret = PartySecretKey::generate(&mut rand::rngs::OsRng);
            // A new party's file also gets the Ed25519 seed it signs Paillier templates with
            // if it is the service provider (Game-Set-MATCH §6.1 σ; see keyfile.rs).
            let mut seed = zeroize::Zeroizing::new([0u8; 32]);
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, seed.as_mut_slice());
            keyfile::create_with(&path, &secret, Some(&seed)).unwrap_or_else(|e| {
                let e = IdentityError::KeyFile(e);
                raise(e.code(), format!("init_party: {e}"), None)
            });
            secret
        }
        Err(e) => {
            let e = IdentityError::KeyFile(e);
            raise(e.code(), format!("init_party: {e}"), None)
        }
    };
    let public = secret.public_key();
    Spi::run_with_args(
        "INSERT INTO privmatch.party_identity (party_index, public_key) VALUES ($1, $2)",
        &[
            i32::from(index.as_u8()).into(),
            public.as_bytes().to_vec().into(),
        ],
    )
    .unwrap_or_else(|e| raise_internal(e));
    public.to_hex()
}

/// This party's index, public key (hex), key fingerprint and signing key (the public half of
/// the Ed25519 key derived from the key file that signs the party's outputs, core's
/// `crypto::party_sign`; NULL when the key file cannot be read): what operators compare out
/// of band and clients pin.
#[pg_extern(stable)]
fn party_info() -> TableIterator<
    'static,
    (
        name!(party_index, i32),
        name!(public_key, String),
        name!(fingerprint, String),
        name!(signing_key, Option<String>),
    ),
> {
    let signing_key = read_identity()
        .ok()
        .flatten()
        .and_then(|stored| stored.decode().ok())
        .map(|identity| {
            PartySigningKey::derive(&identity.secret)
                .verifying_key()
                .to_hex()
        });
    let Some(StoredIdentity { index, public }) = stored_identity() else {
        not_initialised()
    };
    let key: [u8; 32] = public.try_into().unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            "privmatch.party_identity holds a public key of the wrong length",
            None,
        )
    });
    let key = PartyPublicKey::from_bytes(key);
    TableIterator::once((index, key.to_hex(), key.fingerprint_hex(), signing_key))
}

/// Pins the public key of peer party `party_index`. Re-pinning a different key requires
/// `replace => true` (a key rotation is a deliberate act, never a side effect). The party's
/// operator's function (`sql/roles.sql`): the coordinator cannot call it, so it cannot swap a
/// peer's key for its own and read the pairwise channels. (A pin relayed by the coordinator
/// goes through `pin_peer_signed`, signed by this party's operator.)
#[pg_extern(volatile)]
fn pin_peer(party_index: i32, public_key: &str, replace: default!(bool, false)) -> String {
    const F: &str = "pin_peer";
    let peer = PartyIndex::new(i64::from(party_index)).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: {e}"),
            None,
        )
    });
    let key = PartyPublicKey::from_hex(public_key).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: {e}"),
            None,
        )
    });
    pin_peer_key(F, peer, &key, replace)
}

/// Pins `key` for `peer` at this party (the work of `pin_peer` and `pin_peer_signed`, after
/// their checks of who asks): refuses this party itself (22023) and, unless `replace`, a
/// different key already pinned (23505). Returns the key's fingerprint.
pub fn pin_peer_key(
    function: &str,
    peer: PartyIndex,
    key: &PartyPublicKey,
    replace: bool,
) -> String {
    let me = load_identity();
    if peer == me.index {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: {peer} is this party itself"),
            None,
        );
    }
    let party_index = i32::from(peer.as_u8());
    let existing: Option<Vec<u8>> = Spi::get_one_with_args(
        "SELECT (SELECT public_key FROM privmatch.peers WHERE party_index = $1)",
        &[party_index.into()],
    )
    .unwrap_or_else(|e| raise_internal(e));
    if let Some(old) = existing {
        if old.as_slice() != key.as_bytes() && !replace {
            raise(
                PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                format!("{function}: a different key is already pinned for {peer}"),
                Some("pass replace => true to rotate the pinned key deliberately"),
            );
        }
    }
    Spi::run_with_args(
        "INSERT INTO privmatch.peers (party_index, public_key) VALUES ($1, $2) \
         ON CONFLICT (party_index) DO UPDATE SET public_key = EXCLUDED.public_key, pinned_at = now()",
        &[party_index.into(), key.as_bytes().to_vec().into()],
    )
    .unwrap_or_else(|e| raise_internal(e));
    key.fingerprint_hex()
}

/// Upgrade from 0.1.0 only (`migrations/privmatch--0.1.0--0.2.0.sql` creates, calls and drops
/// it; a fresh install does not have it): moves the party's secret key from the 0.1.0 column
/// `party_identity.secret_key` into the key file, which must not exist yet or must hold the
/// same key. Returns the key file's path, or NULL when the party had no identity yet. The
/// upgrade drops the column afterwards; the old key remains in WAL written before the
/// upgrade and in older backups, so operators rotate the key after upgrading
/// (docs/trust-model.md).
#[pg_extern(sql = false, volatile)]
fn migrate_party_key_to_file() -> Option<String> {
    const F: &str = "migrate_party_key_to_file";
    let stored = get_one::<Vec<u8>>(F, "SELECT secret_key FROM privmatch.party_identity", &[])?;
    let bytes: [u8; 32] = stored.try_into().unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{F}: the stored secret key has the wrong length"),
            None,
        )
    });
    let secret = PartySecretKey::from_bytes(bytes);
    let path = key_file_path();
    match keyfile::read(&path) {
        Ok(existing) if existing.to_bytes() == secret.to_bytes() => {}
        Ok(_) => raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{F}: the key file {} holds another key than this party's",
                path.display()
            ),
            Some("move it aside: the upgrade writes the party's own key there"),
        ),
        Err(KeyFileError::Missing(_)) => keyfile::create(&path, &secret).unwrap_or_else(|e| {
            let e = IdentityError::KeyFile(e);
            raise(e.code(), format!("{F}: {e}"), None)
        }),
        Err(e) => {
            let e = IdentityError::KeyFile(e);
            raise(e.code(), format!("{F}: {e}"), None)
        }
    }
    Some(path.display().to_string())
}
