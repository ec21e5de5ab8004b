//! The iris threshold policy at one party (core's `iris::policy`): the match threshold every
//! search must use, stored in `privmatch.iris_policy` (`sql/iris.sql`; no row = the install
//! default τ = 0.345) and changed only by an operator-signed command (`iris_set_policy`,
//! action `iris-policy`, checked by [`crate::operator::accept_command`]). `iris_search_start`
//! hands it to the engine, which refuses a probe sealed with any other threshold (core's
//! `iris::probe::check_probe`), whoever calls, so a caller cannot bisect a distance by
//! searching at thresholds of its choice.

use pgrx::prelude::*;
use privmatch_core::iris::policy::{IrisPolicy, IRIS_POLICY_ACTION};

use crate::errors::{get_one, raise, run};
use crate::operator::accept_command;

/// This party's policy, read in the caller's transaction.
pub fn current_policy(function: &str) -> IrisPolicy {
    let stored = get_one::<i32>(
        function,
        "SELECT (SELECT threshold_num FROM privmatch.iris_policy)",
        &[],
    );
    match stored {
        None => IrisPolicy::default_policy(),
        Some(numerator) => u32::try_from(numerator)
            .ok()
            .and_then(|n| IrisPolicy::from_numerator(n).ok())
            .unwrap_or_else(|| {
                raise(
                    PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                    format!("{function}: privmatch.iris_policy holds an invalid threshold"),
                    None,
                )
            }),
    }
}

/// The iris match threshold every search at this party must use (τ, a ratio in (0, 0.5]).
#[pg_extern(stable, parallel_safe)]
fn iris_policy() -> f64 {
    current_policy("iris_policy").ratio()
}

/// Sets this party's iris threshold policy from `command`: an operator command (core's
/// `crypto::sign`, action `iris-policy`) signed by this party's operator key, whose payload is
/// core's `IrisPolicy`, relayed by the coordinator or any tool. A command not signed by the
/// operator, for another party or action, or replayed is refused (28000, nothing changed); a
/// malformed payload or a threshold outside (0, 0.5] is 22023. Returns the new threshold.
#[pg_extern(volatile)]
fn iris_set_policy(command: &[u8]) -> f64 {
    const F: &str = "iris_set_policy";
    let payload = accept_command(F, IRIS_POLICY_ACTION, command);
    let policy = IrisPolicy::decode(&payload).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: {e}"),
            None,
        )
    });
    let numerator = i32::try_from(policy.numerator()).unwrap_or(i32::MAX);
    run(
        F,
        "INSERT INTO privmatch.iris_policy (threshold_num) VALUES ($1) \
         ON CONFLICT (singleton) DO UPDATE SET threshold_num = EXCLUDED.threshold_num, set_at = now()",
        &[numerator.into()],
    );
    policy.ratio()
}
