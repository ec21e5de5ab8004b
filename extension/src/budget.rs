//! Query budgets (issue 34 item 4; docs/trust-model.md §4): how many searches and
//! verifications this party answers per hour. A budget is charged in the transaction that
//! opens the search or verification, before any work on shares: a request past its budget is
//! refused with 53400 (configuration_limit_exceeded), whoever calls the party function. The
//! protocols make the open durable before anything derived from it leaves the party (the
//! later steps refuse a session opened in their own transaction), so a caller cannot roll a
//! charge back and keep the answer. Tables: `privmatch.query_budget_policy` and
//! `privmatch.query_budget_use` (`sql/common.sql`). Budgets per registered client, charged on
//! top of these for inputs a client signed, are `crate::clients`'.
//!
//! Imports: [`crate::errors`] only (no modality).

use pgrx::prelude::*;

use crate::errors::{get_one, raise, run, select};

/// What a budget counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetKind {
    /// Iris identifications and uniqueness checks started at this party (party-wide).
    IrisSearch,
    /// Face 1:N identifications opened at this evaluator (party-wide).
    FaceIdentify,
    /// Face 1:1 verifications opened at this evaluator, per verified subject.
    FaceVerify,
}

impl BudgetKind {
    /// Every kind.
    pub const ALL: [BudgetKind; 3] = [
        BudgetKind::IrisSearch,
        BudgetKind::FaceIdentify,
        BudgetKind::FaceVerify,
    ];

    /// The kind named `name` (as [`BudgetKind::name`] spells it), if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind's name in `privmatch.query_budget_policy`.
    pub fn name(self) -> &'static str {
        match self {
            BudgetKind::IrisSearch => "iris-search",
            BudgetKind::FaceIdentify => "face-identify",
            BudgetKind::FaceVerify => "face-verify",
        }
    }
}

/// Charges one request of `kind` (for `key`: the subject of a verification, "" otherwise) to
/// this hour's budget, in the caller's transaction; raises 53400 when the budget is spent.
pub fn charge(function: &str, kind: BudgetKind, key: &str) {
    let used = get_one::<i32>(
        function,
        "INSERT INTO privmatch.query_budget_use AS u (kind, key, hour, used) \
         VALUES ($1, $2, date_trunc('hour', now()), 1) \
         ON CONFLICT (kind, key, hour) DO UPDATE SET used = u.used + 1 \
         RETURNING used",
        &[kind.name().into(), key.into()],
    )
    .unwrap_or(i32::MAX);
    let allowed = get_one::<i32>(
        function,
        "SELECT per_hour FROM privmatch.query_budget_policy WHERE kind = $1",
        &[kind.name().into()],
    )
    .unwrap_or(0);
    if used > allowed {
        raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "{function}: query budget exhausted: this party answers {allowed} {} per hour{}",
                kind.name(),
                // The subject of a verification is not named: the message reaches the
                // coordinator, which must not learn whom a verification was for.
                if key.is_empty() { "" } else { " per subject" }
            ),
            Some("wait for the next hour, or the party's operator raises the budget with privmatch.set_query_budget"),
        );
    }
    if used == 1 {
        // The first request of an hour sweeps what earlier hours used.
        run(
            function,
            "DELETE FROM privmatch.query_budget_use \
              WHERE kind = $1 AND hour < date_trunc('hour', now())",
            &[kind.name().into()],
        );
    }
}

/// Sets this party's budget of `kind` ('iris-search', 'face-identify' or 'face-verify') to
/// `per_hour` requests per hour (0 refuses every request). The operator's function
/// (`sql/roles.sql`). Returns the budget set.
#[pg_extern(volatile)]
fn set_query_budget(kind: &str, per_hour: i32) -> i32 {
    const F: &str = "set_query_budget";
    if BudgetKind::parse(kind).is_none() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: unknown budget kind {kind:?}"),
            Some("one of 'iris-search', 'face-identify', 'face-verify'"),
        );
    }
    if per_hour < 0 {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: per_hour must be 0 or more, got {per_hour}"),
            None,
        );
    }
    run(
        F,
        "UPDATE privmatch.query_budget_policy SET per_hour = $2, set_at = now() WHERE kind = $1",
        &[kind.into(), per_hour.into()],
    );
    per_hour
}

/// This party's budgets: per kind, the requests allowed per hour and the most any one key
/// (a subject, or the party as a whole) used this hour.
#[pg_extern(stable)]
fn query_budgets() -> TableIterator<
    'static,
    (
        name!(kind, String),
        name!(per_hour, i32),
        name!(most_used_this_hour, i32),
    ),
> {
    const F: &str = "query_budgets";
    let rows = select(
        F,
        "SELECT p.kind, p.per_hour, coalesce(max(u.used), 0)::int4 \
           FROM privmatch.query_budget_policy p \
           LEFT JOIN privmatch.query_budget_use u \
             ON u.kind = p.kind AND u.hour = date_trunc('hour', now()) \
          GROUP BY p.kind, p.per_hour ORDER BY p.kind",
        &[],
        |row| {
            (
                row.get::<String>(1).unwrap_or_default(),
                row.get::<i32>(2).unwrap_or_default(),
                row.get::<i32>(3).unwrap_or_default(),
            )
        },
    );
    TableIterator::new(rows)
}
