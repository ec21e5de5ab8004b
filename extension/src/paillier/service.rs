//! The service provider's keys and parameters (Game-Set-MATCH [ABMR20] §6.1, §8.1):
//!
//! * its Ed25519 signing key, which signs every enrolled template (σ of §6.1): the seed lives
//!   in the party's key file ([`crate::keyfile`]), never in a table; `init_party` writes one
//!   for a new party, [`paillier_init_service`] adds one to an older party's key file;
//! * its ring-Pedersen parameters (N̂, s, t) in which every device's key proof Π^fac commits
//!   (§8.1, [CGGMP21]), generated once by [`paillier_init_service`] (the factors are
//!   discarded), public, in `privmatch.paillier_service`;
//! * the parameter sets it enrols under, one per protocol, in `privmatch.paillier_params`.

use ed25519_dalek::SigningKey;
use pgrx::prelude::*;
use privmatch_core::paillier::key_proof::{RingPedersenParams, DEFAULT_RING_PEDERSEN_BITS};
use privmatch_core::paillier::params::{Params, Protocol};

use super::require_sp;
use crate::errors::{get_one, raise, run, select};
use crate::identity::{key_file_path, IdentityError};
use crate::keyfile;

/// What `privmatch.paillier_service` holds: the signing key's public half and the ring-Pedersen
/// parameters.
pub(super) struct Service {
    /// The Ed25519 public key (32 bytes).
    pub verifying: [u8; 32],
    /// The ring-Pedersen parameters devices prove their key in.
    pub ring_pedersen: RingPedersenParams,
}

fn not_initialised(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{function}: the Paillier service provider is not initialised"),
        Some("its operator runs SELECT privmatch.paillier_init_service() once"),
    )
}

fn corrupted(function: &str, what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("{function}: privmatch.paillier_service holds {what}"),
        None,
    )
}

/// The stored service row, or 55000 from `function` if `paillier_init_service` never ran.
pub(super) fn load_service(function: &str) -> Service {
    let rows = select(
        function,
        "SELECT signing_public, ring_pedersen FROM privmatch.paillier_service",
        &[],
        |row| {
            (
                row.get::<Vec<u8>>(1).unwrap_or_default(),
                row.get::<Vec<u8>>(2).unwrap_or_default(),
            )
        },
    );
    let Some((public, rp)) = rows.into_iter().next() else {
        not_initialised(function)
    };
    let verifying: [u8; 32] = public
        .try_into()
        .unwrap_or_else(|_| corrupted(function, "a signing key of the wrong length"));
    let ring_pedersen = RingPedersenParams::from_bytes(&rp)
        .unwrap_or_else(|_| corrupted(function, "malformed ring-Pedersen parameters"));
    Service {
        verifying,
        ring_pedersen,
    }
}

/// The signing key from the key file, checked against the stored public half (55000 when
/// the file has none, XX001 when it is another key).
pub(super) fn signing_key(function: &str, service: &Service) -> SigningKey {
    let path = key_file_path();
    let contents = keyfile::read_contents(&path).unwrap_or_else(|e| {
        let e = IdentityError::KeyFile(e);
        raise(e.code(), format!("{function}: {e}"), None)
    });
    let Some(seed) = contents.sp_signing else {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function}: the party key file {} holds no service-provider signing key",
                path.display()
            ),
            Some("its operator runs SELECT privmatch.paillier_init_service()"),
        )
    };
    let key = SigningKey::from_bytes(&seed);
    if key.verifying_key().to_bytes() != service.verifying {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!(
                "{function}: the party key file {} holds another signing key than the service's",
                path.display()
            ),
            None,
        );
    }
    key
}

/// Makes this party the Paillier service provider of [ABMR20]: adds an Ed25519 signing seed to
/// the key file if it has none (a party initialised before 0.4.0), generates the ring-Pedersen
/// parameters of the device key proof (§8.1; `ring_pedersen_bits` 2048 by default, 3072, or
/// 1024 for tests only; generating two safe primes takes seconds to minutes) and stores their
/// public parts. Idempotent: a second call returns the existing key. Returns the signing key's
/// public half (hex). The party's operator's function (`sql/roles.sql`).
#[pg_extern(volatile)]
fn paillier_init_service(ring_pedersen_bits: default!(i32, 2048)) -> String {
    const F: &str = "paillier_init_service";
    require_sp(F);
    if let Some(public) = get_one::<Vec<u8>>(
        F,
        "SELECT (SELECT signing_public FROM privmatch.paillier_service)",
        &[],
    ) {
        return hex::encode(public);
    }
    let bits = u32::try_from(ring_pedersen_bits).unwrap_or(0);
    let path = key_file_path();
    let contents = keyfile::read_contents(&path).unwrap_or_else(|e| {
        let e = IdentityError::KeyFile(e);
        raise(e.code(), format!("{F}: {e}"), None)
    });
    let seed = match contents.sp_signing {
        Some(seed) => seed,
        None => {
            let mut seed = zeroize::Zeroizing::new([0u8; 32]);
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, seed.as_mut_slice());
            keyfile::add_signing_key(&path, &seed).unwrap_or_else(|e| {
                let e = IdentityError::KeyFile(e);
                raise(e.code(), format!("{F}: {e}"), None)
            });
            seed
        }
    };
    let public = SigningKey::from_bytes(&seed).verifying_key().to_bytes();
    let rp = RingPedersenParams::generate(bits, &mut rand::rngs::OsRng).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: ring_pedersen_bits: {e} (default {DEFAULT_RING_PEDERSEN_BITS})"),
            None,
        )
    });
    run(
        F,
        "INSERT INTO privmatch.paillier_service (signing_public, ring_pedersen) VALUES ($1, $2)",
        &[public.to_vec().into(), rp.to_bytes().into()],
    );
    hex::encode(public)
}

/// The service provider's public material a device and a terminal need ([ABMR20] §6.1, §8.1):
/// its party index, the Ed25519 key that verifies σ, and the ring-Pedersen parameters of the
/// key proof. Empty before `paillier_init_service`.
#[pg_extern(stable)]
fn paillier_service_info() -> TableIterator<
    'static,
    (
        name!(party_index, i32),
        name!(signing_key, Vec<u8>),
        name!(ring_pedersen, Vec<u8>),
    ),
> {
    let sp = i32::from(super::sp_index().as_u8());
    let rows = select(
        "paillier_service_info",
        "SELECT signing_public, ring_pedersen FROM privmatch.paillier_service",
        &[],
        |row| {
            (
                sp,
                row.get::<Vec<u8>>(1).unwrap_or_default(),
                row.get::<Vec<u8>>(2).unwrap_or_default(),
            )
        },
    );
    TableIterator::new(rows)
}

/// Sets the parameters ([ABMR20] Fig. 1: ℓ, m, ζ², |N|, λ, protocol; the canonical encoding of
/// `Params::to_bytes`) the SP enrols devices under for their protocol, replacing that
/// protocol's earlier set (records enrolled under it stay valid until they expire), and the
/// validity of new records in days (1 to 3650). Returns the protocol's name. The party's
/// operator's function.
#[pg_extern(volatile)]
fn paillier_set_params(params: &[u8], valid_days: default!(i32, 365)) -> String {
    const F: &str = "paillier_set_params";
    require_sp(F);
    let parsed = Params::from_bytes(params).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
            format!("{F}: params: {e}"),
            None,
        )
    });
    if !(1..=3650).contains(&valid_days) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: valid_days must be 1 to 3650, got {valid_days}"),
            None,
        );
    }
    run(
        F,
        "INSERT INTO privmatch.paillier_params (protocol, params, valid_days) VALUES ($1, $2, $3) \
         ON CONFLICT (protocol) DO UPDATE SET params = EXCLUDED.params, \
         valid_days = EXCLUDED.valid_days, set_at = now()",
        &[
            i16::from(parsed.protocol().code()).into(),
            parsed.to_bytes().into(),
            valid_days.into(),
        ],
    );
    parsed.protocol().name().to_owned()
}

/// The parameter sets the SP enrols under (one per protocol; what a device enrols with).
#[pg_extern(stable)]
fn paillier_parameters() -> TableIterator<
    'static,
    (
        name!(protocol, String),
        name!(params, Vec<u8>),
        name!(valid_days, i32),
    ),
> {
    let rows = select(
        "paillier_parameters",
        "SELECT protocol, params, valid_days FROM privmatch.paillier_params ORDER BY protocol",
        &[],
        |row| {
            let code = row.get::<i16>(1).unwrap_or_default();
            let name = u8::try_from(code)
                .ok()
                .and_then(|c| Protocol::from_code(c).ok())
                .map_or("?", Protocol::name);
            (
                name.to_owned(),
                row.get::<Vec<u8>>(2).unwrap_or_default(),
                row.get::<i32>(3).unwrap_or_default(),
            )
        },
    );
    TableIterator::new(rows)
}

/// The configured parameters of `protocol`, or 55000 from `function`.
pub(super) fn configured_params(function: &str, protocol: Protocol) -> (Params, i32) {
    let rows = select(
        function,
        "SELECT params, valid_days FROM privmatch.paillier_params WHERE protocol = $1",
        &[i16::from(protocol.code()).into()],
        |row| {
            (
                row.get::<Vec<u8>>(1).unwrap_or_default(),
                row.get::<i32>(2).unwrap_or_default(),
            )
        },
    );
    let Some((bytes, days)) = rows.into_iter().next() else {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function}: the service provider enrols no device under {}",
                protocol.name()
            ),
            Some("its operator sets the parameters with privmatch.paillier_set_params()"),
        )
    };
    let params = Params::from_bytes(&bytes).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
            format!("{function}: privmatch.paillier_params: {e}"),
            None,
        )
    });
    (params, days)
}
