//! What a distributed (two-phase) transaction needs at a party, as functions the coordinator's
//! role may call instead of table privileges: the transaction's marker row ([`txn_begin`]),
//! the commit decision recovery reads at P0 ([`txn_committed`]), the abort decision recovery
//! writes there ([`txn_fence`]), and the table lock taken before a modality's work
//! ([`txn_lock_templates`]). The rule they serve is in core's
//! `twophase` module; the coordinator's side in `coordinator/src/txn/`.
//!
//! Imports: [`crate::errors`] only (no modality).

use pgrx::prelude::*;
use privmatch_core::twophase::gid_instance;

use crate::errors::{get_one, raise, run};

fn checked_gid<'a>(function: &str, gid: &'a str) -> &'a str {
    if gid.len() > 200 || gid_instance(gid).is_none() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{function}: gid is not a privmatch transaction id (privmatch:<instance>:<n>)"),
            None,
        );
    }
    gid
}

/// Writes the marker row of distributed transaction `gid` inside the caller's transaction.
/// At P0, the row committing is the commit decision recovery follows.
#[pg_extern(volatile)]
fn txn_begin(gid: &str) {
    let gid = checked_gid("txn_begin", gid);
    run(
        "txn_begin",
        "INSERT INTO privmatch.distributed_transactions (gid) VALUES ($1)",
        &[gid.into()],
    );
}

/// Whether distributed transaction `gid` committed here (its marker row is visible): what
/// recovery asks P0 before it finishes the transaction at P1 and P2.
#[pg_extern(stable)]
fn txn_committed(gid: &str) -> bool {
    let gid = checked_gid("txn_committed", gid);
    get_one::<bool>(
        "txn_committed",
        "SELECT EXISTS (SELECT 1 FROM privmatch.distributed_transactions \
                         WHERE gid = $1 AND NOT aborted)",
        &[gid.into()],
    )
    .unwrap_or(false)
}

/// Recovery at P0, for a transaction prepared elsewhere but neither prepared nor committed
/// here: decides it aborted by writing a fence row for `gid`, unless a coordinator still holds
/// it open here. Returns true when the transaction is aborted (fenced now or before), false
/// when it committed meanwhile. If the coordinator that runs it still holds its marker row
/// (uncommitted), the fence waits at most a second and fails with 55P03: the transaction is
/// alive, and recovery must leave it alone. Once the fence is committed no coordinator can
/// commit the transaction at P0 (its marker would collide with the fence), so rolling it back
/// at P1 and P2 cannot race with a late commit.
#[pg_extern(volatile)]
fn txn_fence(gid: &str) -> bool {
    const F: &str = "txn_fence";
    let gid = checked_gid(F, gid);
    run(F, "SET LOCAL lock_timeout = '1s'", &[]);
    run(
        F,
        "INSERT INTO privmatch.distributed_transactions (gid, aborted) VALUES ($1, true) \
         ON CONFLICT (gid) DO NOTHING",
        &[gid.into()],
    );
    get_one::<bool>(
        F,
        "SELECT aborted FROM privmatch.distributed_transactions WHERE gid = $1",
        &[gid.into()],
    )
    .unwrap_or(true)
}

/// Locks a privmatch template table (a table of schema `privmatch` whose name ends in
/// `_templates`) for the rest of the caller's transaction: `exclusive` takes SHARE ROW
/// EXCLUSIVE (no other writer until the end; waits at most 30 s, then 55P03), otherwise ROW
/// EXCLUSIVE (writers do not block each other).
#[pg_extern(volatile)]
fn txn_lock_templates(table: &str, exclusive: bool) {
    const F: &str = "txn_lock_templates";
    let is_template_table = table.ends_with("_templates")
        && table.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        && get_one::<bool>(
            F,
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = 'privmatch' AND c.relname = $1 AND c.relkind = 'r')",
            &[table.into()],
        )
        .unwrap_or(false);
    if !is_template_table {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{F}: \"{table}\" is not a privmatch template table"),
            None,
        );
    }
    if exclusive {
        // Reverted when this function returns (its SET clause opens a GUC level): it bounds
        // only the wait below.
        run(F, "SET LOCAL lock_timeout = '30s'", &[]);
        run(
            F,
            &format!("LOCK TABLE privmatch.{table} IN SHARE ROW EXCLUSIVE MODE"),
            &[],
        );
    } else {
        run(
            F,
            &format!("LOCK TABLE privmatch.{table} IN ROW EXCLUSIVE MODE"),
            &[],
        );
    }
}
