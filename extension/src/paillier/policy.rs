//! The service provider's session policy (issue 34 item 10), for every protocol of
//! Game-Set-MATCH [ABMR20] (Agrawal, Badrinarayanan, Mukherjee, Rindal, CCS 2020, ePrint
//! 2020/1363):
//!
//! * **The threshold is policy, not per session.** [ABMR20] treats the threshold as a fixed
//!   public parameter; a terminal that chose it per session could bisect a score (7 Π3
//!   sessions narrowed one to [0.609, 0.625)). The SP's operator sets one threshold per protocol
//!   ([`paillier_set_policy`]); a terminal input with another threshold is refused (22023), and
//!   the SP signs the threshold it applied into Round 2 (core's `signed_round2`).
//! * **Budgets.** Sessions per device per hour and per terminal per hour, counted at the SP in
//!   a logged table (they survive restarts and a crash), refused past the limit with 53400
//!   (configuration_limit_exceeded, as the parties' other query budgets).
//! * **Sessions are opened in their own transaction.** [`paillier_session_open`] checks the
//!   input, the policy and the budgets and records the session id (refusing one in use, 23505);
//!   it commits before any Round 2 exists, and the Round 2 functions refuse a session not opened
//!   in an earlier, committed transaction — so a caller cannot roll the charge back and keep
//!   the Round 2. Each session gets one Round 2 (a second: 23505).
//!
//! Tables: `privmatch.paillier_policy`, `privmatch.paillier_session_log`,
//! `privmatch.paillier_budget_use` (`sql/paillier.sql`).

use pgrx::prelude::*;
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::terminal::TerminalInput;

use super::input::{checked_record, open_input_any};
use super::require_sp;
use super::service::configured_params;
use crate::errors::{get_one, log_session, modify, raise, run, select};

/// How long a signed Round 2 may be answered, seconds (the SP's session lifetime).
pub(super) const ROUND2_TTL_SECS: i64 = 600;

/// How long the session log keeps an opened session (SQL interval): longer than any budget
/// window and any session's life.
const LOG_RETENTION: &str = "1 day";

/// One protocol's policy.
#[derive(Clone, Copy, Debug)]
pub(super) struct Policy {
    /// The threshold every session of the protocol compares with.
    pub threshold: i64,
    /// Sessions one device may be matched in per hour.
    pub device_per_hour: i32,
    /// Sessions one terminal may open per hour.
    pub terminal_per_hour: i32,
}

fn parse_protocol(function: &str, name: &str) -> Protocol {
    Protocol::from_name(name).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            {
                let [a, b, c] = Protocol::NAMES;
                format!("{function}: protocol {name:?}: '{a}', '{b}' or '{c}'")
            },
            None,
        )
    })
}

/// Sets the policy of `protocol` ('pi1', 'pi2', 'pi3'): the `threshold` on ⟨u, w⟩ every
/// session compares with (|θ| ≤ ζ² of the protocol's configured parameters, which must be
/// set first: 55000), and the sessions allowed per device and per terminal per hour (0 refuses
/// every session). The party's operator's function (`sql/roles.sql`); the coordinator cannot
/// call it. Returns the protocol's name.
#[pg_extern(volatile)]
fn paillier_set_policy(
    protocol: &str,
    threshold: i64,
    device_sessions_per_hour: default!(i32, 60),
    terminal_sessions_per_hour: default!(i32, 600),
) -> String {
    const F: &str = "paillier_set_policy";
    require_sp(F);
    let p = parse_protocol(F, protocol);
    let (params, _) = configured_params(F, p);
    if i128::from(threshold).unsigned_abs() > params.norm_bound().to_u128().unwrap_or(u128::MAX) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{F}: threshold {threshold} is outside [−ζ², ζ²] = ±{} of the {protocol} parameters",
                params.norm_bound()
            ),
            None,
        );
    }
    for (name, value) in [
        ("device_sessions_per_hour", device_sessions_per_hour),
        ("terminal_sessions_per_hour", terminal_sessions_per_hour),
    ] {
        if value < 0 {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{F}: {name} must be 0 or more, got {value}"),
                None,
            );
        }
    }
    run(
        F,
        "INSERT INTO privmatch.paillier_policy \
           (protocol, threshold, device_sessions_per_hour, terminal_sessions_per_hour) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (protocol) DO UPDATE SET \
           threshold = EXCLUDED.threshold, \
           device_sessions_per_hour = EXCLUDED.device_sessions_per_hour, \
           terminal_sessions_per_hour = EXCLUDED.terminal_sessions_per_hour, set_at = now()",
        &[
            i16::from(p.code()).into(),
            threshold.into(),
            device_sessions_per_hour.into(),
            terminal_sessions_per_hour.into(),
        ],
    );
    p.name().to_owned()
}

/// The policies in force: per protocol, the threshold and the sessions allowed per device and
/// per terminal per hour.
#[pg_extern(stable)]
fn paillier_policies() -> TableIterator<
    'static,
    (
        name!(protocol, String),
        name!(threshold, i64),
        name!(device_sessions_per_hour, i32),
        name!(terminal_sessions_per_hour, i32),
    ),
> {
    const F: &str = "paillier_policies";
    let rows = select(
        F,
        "SELECT protocol, threshold, device_sessions_per_hour, terminal_sessions_per_hour \
           FROM privmatch.paillier_policy ORDER BY protocol",
        &[],
        |row| {
            let name = row
                .get::<i16>(1)
                .and_then(|c| u8::try_from(c).ok())
                .and_then(|c| Protocol::from_code(c).ok())
                .map_or("?", Protocol::name);
            (
                name.to_owned(),
                row.get::<i64>(2).unwrap_or_default(),
                row.get::<i32>(3).unwrap_or_default(),
                row.get::<i32>(4).unwrap_or_default(),
            )
        },
    );
    TableIterator::new(rows)
}

/// The policy of `protocol`, or 55000 from `function` when the operator has set none.
pub(super) fn policy_for(function: &str, protocol: Protocol) -> Policy {
    let rows = select(
        function,
        "SELECT threshold, device_sessions_per_hour, terminal_sessions_per_hour \
           FROM privmatch.paillier_policy WHERE protocol = $1",
        &[i16::from(protocol.code()).into()],
        |row| Policy {
            threshold: row.get::<i64>(1).unwrap_or_default(),
            device_per_hour: row.get::<i32>(2).unwrap_or_default(),
            terminal_per_hour: row.get::<i32>(3).unwrap_or_default(),
        },
    );
    rows.into_iter().next().unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("{function}: no session policy for {}", protocol.name()),
            Some("the SP's operator sets it with privmatch.paillier_set_policy()"),
        )
    })
}

/// Refuses (22023) a terminal input whose threshold is not the policy's.
pub(super) fn require_policy_threshold(function: &str, input: &TerminalInput, policy: &Policy) {
    if input.threshold != policy.threshold {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "{function}: the terminal asks for threshold {}, the {} policy is {}: a terminal \
                 cannot choose the threshold",
                input.threshold,
                input.protocol.name(),
                policy.threshold
            ),
            Some("the terminal uses the threshold of the service provider's policy"),
        );
    }
}

/// Charges one session to the hour's budget of `kind` ('device' or 'terminal') for `key`, in
/// the caller's transaction; 53400 past `allowed`.
fn charge(function: &str, kind: &str, key: &str, allowed: i32) {
    let used = get_one::<i32>(
        function,
        "INSERT INTO privmatch.paillier_budget_use AS u (kind, key, hour, used) \
         VALUES ($1, $2, date_trunc('hour', now()), 1) \
         ON CONFLICT (kind, key, hour) DO UPDATE SET used = u.used + 1 RETURNING used",
        &[kind.into(), key.into()],
    )
    .unwrap_or(i32::MAX);
    if used > allowed {
        raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "{function}: session budget exhausted: {allowed} sessions per {kind} per hour, \
                 {kind} {key:?} has had them"
            ),
            Some("wait for the next hour, or the SP's operator raises it with privmatch.paillier_set_policy()"),
        );
    }
    if used == 1 {
        // The first session of an hour sweeps earlier hours of this kind.
        run(
            function,
            "DELETE FROM privmatch.paillier_budget_use WHERE kind = $1 \
              AND hour < date_trunc('hour', now())",
            &[kind.into()],
        );
    }
}

/// Opens a matching session for the terminal input `terminal_input` (sealed to this party) on
/// `device_id`: the input admitted as a registered client's signed input (purpose
/// `paillier-terminal-input`, its nonce recorded; 28000 for a bad, replayed or — under the
/// client-auth policy `required` — missing signature), opened (08P01 if not sealed to this
/// party or tampered with), for this
/// device (22023) and the device's enrolled protocol (22023), the record's σ and expiry
/// checked (55000), the threshold the policy's (22023), one session charged to the device's
/// and the terminal's hourly budgets (53400), and the session id recorded (23505 if in use).
/// Returns the session id. Must commit before `paillier_piN_round2` computes the session's
/// Round 2 (which refuses a session opened in its own transaction), so the charge cannot be
/// rolled back. The terminal is named by the coordinator's `terminal` argument only for
/// budgeting: per-terminal budgets bound what one terminal name may open; the per-device budget
/// bounds every terminal together.
#[pg_extern(volatile)]
fn paillier_session_open(device_id: &str, terminal_input: &[u8], terminal: &str) -> Vec<u8> {
    const F: &str = "paillier_session_open";
    let me = require_sp(F);
    if terminal.is_empty() || terminal.len() > 128 {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: terminal must be 1 to 128 bytes"),
            None,
        );
    }
    let input = open_input_any(F, &me, terminal_input);
    checked_record(F, device_id, &input);
    let policy = policy_for(F, input.protocol);
    require_policy_threshold(F, &input, &policy);
    run(
        F,
        &format!(
            "DELETE FROM privmatch.paillier_session_log WHERE opened_at < now() - interval '{LOG_RETENTION}'"
        ),
        &[],
    );
    let stored = modify(
        F,
        "INSERT INTO privmatch.paillier_session_log \
           (session, device_id, protocol, terminal, opened_xact) \
         VALUES ($1, $2, $3, $4, txid_current()) ON CONFLICT (session) DO NOTHING RETURNING 1",
        &[
            input.session.to_vec().into(),
            device_id.into(),
            i16::from(input.protocol.code()).into(),
            terminal.into(),
        ],
        |_| (),
    );
    if stored.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            format!(
                "{F}: the session id {} is already in use",
                hex::encode(input.session)
            ),
            Some("the terminal draws a fresh random session id for every session"),
        );
    }
    charge(F, "device", device_id, policy.device_per_hour);
    charge(F, "terminal", terminal, policy.terminal_per_hour);
    log_session(F, &input.session, "opened");
    input.session.to_vec()
}

/// The Round 2 functions' admission of `input` for `device_id`: the session was opened by
/// [`paillier_session_open`] for this device and protocol in an earlier, committed transaction
/// (55000 otherwise: P0002 if never opened), it has had no Round 2 yet (23505), and the
/// threshold is still the policy's (22023). Marks the Round 2 as given, in the caller's
/// transaction. Returns the policy threshold to sign.
pub(super) fn admit_round2(function: &str, device_id: &str, input: &TerminalInput) -> i64 {
    let rows = modify(
        function,
        "SELECT device_id, protocol, opened_xact = txid_current(), round2_at IS NOT NULL \
           FROM privmatch.paillier_session_log WHERE session = $1 FOR UPDATE",
        &[input.session.to_vec().into()],
        |row| {
            (
                row.get::<String>(1).unwrap_or_default(),
                row.get::<i16>(2).unwrap_or_default(),
                row.get::<bool>(3).unwrap_or(true),
                row.get::<bool>(4).unwrap_or(true),
            )
        },
    );
    let session = hex::encode(input.session);
    let Some((device, protocol, same_xact, given)) = rows.into_iter().next() else {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("{function}: session {session} was never opened"),
            Some("open it with privmatch.paillier_session_open() first, in its own transaction"),
        )
    };
    if device != device_id || protocol != i16::from(input.protocol.code()) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: session {session} was opened for another device or protocol"),
            None,
        );
    }
    if same_xact {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "{function}: session {session} was opened in this transaction: its budget \
                 charge must commit before its Round 2 exists"
            ),
            Some("call privmatch.paillier_session_open() in a transaction of its own first"),
        );
    }
    if given {
        raise(
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            format!("{function}: session {session} already has its Round 2"),
            Some("the terminal opens a new session with a fresh session id"),
        );
    }
    let policy = policy_for(function, input.protocol);
    require_policy_threshold(function, input, &policy);
    run(
        function,
        "UPDATE privmatch.paillier_session_log SET round2_at = now() WHERE session = $1",
        &[input.session.to_vec().into()],
    );
    policy.threshold
}
