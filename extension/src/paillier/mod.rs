//! The packed Paillier modality at the service provider (Game-Set-MATCH: Agrawal,
//! Badrinarayanan, Mukherjee, Rindal, CCS 2020, ePrint 2020/1363 [ABMR20]; protocol in
//! [`privmatch_core::paillier`], design in `docs/protocols/paillier.md`).
//!
//! One party's PostgreSQL is the service provider SP (GUC `privmatch.paillier_sp_party`,
//! default P0); the functions refuse to run at the other parties.
//!
//! * The type `paillier_template` ([`types`]): the signed template record σ of §6.1.
//! * The SP's keys and parameters ([`service`]): its Ed25519 signing key (in the party's key
//!   file), its ring-Pedersen parameters for the device key proof (§8.1), the parameter sets
//!   it enrols under.
//! * Enrolment Π_en (§6.1, §8), deletion (signed by the device, or by the operator for a lost
//!   device) and fetching of records ([`enroll`]).
//! * The session policy ([`policy`]): one threshold per protocol, per-device and per-terminal
//!   session budgets, sessions opened in their own transaction.
//! * The terminal's input opened and the record checked, as every Round 2 starts ([`input`]).
//! * The terminal's Round 2 computed at the SP on the stored record and signed by the SP
//!   ([`matching`]; Π1 there,
//!   Π2 and Π3 in [`sessions`] with the terminal's later rounds, its secrets kept between the
//!   calls).
//!
//! Imports: the shared modules (`errors`, `datum`, `identity`, `keyfile`, `operator`) and core; never
//! `crate::iris`, `crate::face` or `crate::engine`. Tables: `sql/paillier.sql`.

mod enroll;
mod input;
mod matching;
mod policy;
mod service;
mod sessions;
mod types;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use privmatch_core::paillier::enroll::EnrolError;
use privmatch_core::paillier::messages::MatchError;
use privmatch_core::party::PartyIndex;

use crate::errors::raise;
use crate::identity::{load_identity, Identity};

/// `privmatch.paillier_sp_party`: which party is the Paillier service provider (0, 1 or 2).
pub static SP_PARTY: GucSetting<i32> = GucSetting::<i32>::new(0);

/// `privmatch.paillier_threads`: threads for the SP's enrolment challenge (0 = one per CPU).
pub static THREADS: GucSetting<i32> = GucSetting::<i32>::new(0);

/// Most threads one call uses, whatever the setting says.
const MAX_THREADS: usize = 64;

/// The threads the SP's heavy steps use: the setting, or one per CPU for 0.
fn threads() -> usize {
    match usize::try_from(THREADS.get()) {
        Ok(0) | Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        Ok(n) => n,
    }
    .clamp(1, MAX_THREADS)
}

/// Defines the modality's GUCs (called from `_PG_init`).
pub fn register_gucs() {
    GucRegistry::define_int_guc(
        c"privmatch.paillier_threads",
        c"Threads the Paillier service provider uses for an enrolment's norm challenge (0 = one per CPU).",
        c"The challenge's fresh N-th powers are most of the service provider's enrolment work; they are independent and split over this many threads.",
        &THREADS,
        0,
        MAX_THREADS as i32,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_int_guc(
        c"privmatch.paillier_sp_party",
        c"Which privmatch party is the service provider of device-held Paillier templates.",
        c"Only that party stores device records and runs the Paillier functions.",
        &SP_PARTY,
        0,
        2,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
}

/// This party's identity, or 55000 from `function` if it is not the service provider.
fn require_sp(function: &str) -> Identity {
    let me = load_identity();
    let sp = SP_PARTY.get();
    if i32::from(me.index.as_u8()) != sp {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function}: this party is {}; the Paillier service provider is P{sp}",
                me.index
            ),
            Some("set privmatch.paillier_sp_party in the configuration of the parties"),
        );
    }
    me
}

/// The party index of the service provider as configured.
fn sp_index() -> PartyIndex {
    PartyIndex::ALL[SP_PARTY.get().clamp(0, 2) as usize]
}

/// The SQLSTATE of a refused enrolment ([ABMR20] Π_en).
fn enrol_error_code(err: &EnrolError) -> PgSqlErrorCode {
    match err {
        EnrolError::Malformed { .. } => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
        EnrolError::Params(_) | EnrolError::DeviceId(_) | EnrolError::Template(_) => {
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
        }
        EnrolError::KeyProof(_)
        | EnrolError::PlaintextKnowledge(_)
        | EnrolError::Norm(_)
        | EnrolError::Record(_) => PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
        EnrolError::Internal(_) => PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
    }
}

/// Raises a refused enrolment from `function`; never returns.
fn raise_enrol(function: &str, err: EnrolError) -> ! {
    raise(enrol_error_code(&err), format!("{function}: {err}"), None)
}

/// The SQLSTATE of a refused matching step ([ABMR20] Π1, Π2, Π3).
fn match_error_code(err: &MatchError) -> PgSqlErrorCode {
    match err {
        MatchError::Wire { .. } => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
        MatchError::State(_) => PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        MatchError::Signature | MatchError::Cheating(_) | MatchError::Garbled(_) => {
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION
        }
        _ => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    }
}

/// Raises a refused matching step from `function`; never returns.
fn raise_match(function: &str, err: MatchError) -> ! {
    raise(match_error_code(&err), format!("{function}: {err}"), None)
}
