//! A party's identity: its index and long-term X25519 key, generated inside this database by
//! [`init_party`], and the pinned public keys of its peers ([`pin_peer`], [`pinned_peer`]).
//! The secret key is stored in `privmatch.party_identity` (no privileges for PUBLIC) and no
//! function returns it; only its public half and fingerprint leave the party. Tables:
//! `sql/common.sql`.
//!
//! Imports: [`crate::errors`] only (no modality).

use pgrx::prelude::*;
use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::party::PartyIndex;

use crate::errors::{get_one, raise, raise_internal};

/// This party's index and secret key, as loaded for one call.
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
        Some("run SELECT privmatch.init_party(<index>) once on this database"),
    )
}

/// The row of `privmatch.party_identity`, as stored.
pub struct StoredIdentity {
    /// `party_index`.
    pub index: i32,
    /// `public_key` (32 bytes unless corrupted).
    pub public: Vec<u8>,
    /// `secret_key` (32 bytes unless corrupted).
    pub secret: Vec<u8>,
}

impl StoredIdentity {
    /// The identity this row holds, or what is corrupted about it.
    pub fn decode(self) -> Result<Identity, String> {
        let index = PartyIndex::new(i64::from(self.index)).map_err(|e| e.to_string())?;
        let secret: [u8; 32] = self
            .secret
            .try_into()
            .map_err(|_| "privmatch.party_identity holds a secret key of the wrong length")?;
        Ok(Identity {
            index,
            secret: PartySecretKey::from_bytes(secret),
        })
    }
}

/// Reads this party's identity row, if `init_party` has run (in the current transaction; for
/// callers that cannot raise, such as the engine worker).
pub fn read_identity() -> Result<Option<StoredIdentity>, pgrx::spi::Error> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT party_index, public_key, secret_key FROM privmatch.party_identity",
            None,
            &[],
        )?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        Ok(Some(StoredIdentity {
            index: row.get(1)?.unwrap_or(-1),
            public: row.get(2)?.unwrap_or_default(),
            secret: row.get(3)?.unwrap_or_default(),
        }))
    })
}

/// Reads the pinned public keys of the peers, by party index (`None`: not pinned, or not a
/// well-formed key; `pin_peer` never pins this party itself).
pub fn read_peers() -> Result<[Option<PartyPublicKey>; 3], pgrx::spi::Error> {
    let mut peers: [Option<PartyPublicKey>; 3] = [None; 3];
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT party_index, public_key FROM privmatch.peers",
            None,
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
        .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, e, None))
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

/// Gives this database its party identity: index `party_index` (0, 1 or 2) and a fresh X25519
/// key pair generated here from the operating system's CSPRNG. Returns the public key (hex).
/// Running it again with the same index returns the existing key; with another index it fails.
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
        ..
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
    let secret = PartySecretKey::generate(&mut rand::rngs::OsRng);
    let public = secret.public_key();
    Spi::run_with_args(
        "INSERT INTO privmatch.party_identity (party_index, public_key, secret_key) VALUES ($1, $2, $3)",
        &[
            i32::from(index.as_u8()).into(),
            public.as_bytes().to_vec().into(),
            secret.to_bytes().to_vec().into(),
        ],
    )
    .unwrap_or_else(|e| raise_internal(e));
    public.to_hex()
}

/// This party's index, public key (hex) and key fingerprint: what operators compare out of
/// band and pin in configuration.
#[pg_extern(stable)]
fn party_info() -> TableIterator<
    'static,
    (
        name!(party_index, i32),
        name!(public_key, String),
        name!(fingerprint, String),
    ),
> {
    let Some(StoredIdentity { index, public, .. }) = stored_identity() else {
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
    TableIterator::once((index, key.to_hex(), key.fingerprint_hex()))
}

/// Pins the public key of peer party `party_index`. Re-pinning a different key requires
/// `replace => true` (a key rotation is a deliberate act, never a side effect).
#[pg_extern(volatile)]
fn pin_peer(party_index: i32, public_key: &str, replace: default!(bool, false)) -> String {
    let me = load_identity();
    let peer = PartyIndex::new(i64::from(party_index)).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("pin_peer: {e}"),
            None,
        )
    });
    if peer == me.index {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("pin_peer: {peer} is this party itself"),
            None,
        );
    }
    let key = PartyPublicKey::from_hex(public_key).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("pin_peer: {e}"),
            None,
        )
    });
    let existing: Option<Vec<u8>> = Spi::get_one_with_args(
        "SELECT (SELECT public_key FROM privmatch.peers WHERE party_index = $1)",
        &[party_index.into()],
    )
    .unwrap_or_else(|e| raise_internal(e));
    if let Some(old) = existing {
        if old.as_slice() != key.as_bytes() && !replace {
            raise(
                PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                format!("a different key is already pinned for {peer}"),
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
