//! Saved SPI plans: the statements the extension's SQL functions run (always the same text with
//! typed arguments) are parsed, analysed and planned once per backend and kept, as PL/pgSQL
//! keeps its statements' plans. Without them every call re-parsed and re-planned each of its
//! statements: in a 1:1 face verification that was the largest CPU item of the parties'
//! backends after the kernel (docs/benchmarks/log.md, "Face verification latency").
//!
//! PostgreSQL's plan cache revalidates a saved plan after DDL on what it uses (an extension
//! upgrade, for instance) and after a change of `search_path`; the extension's statements name
//! their schema. Only plain `SELECT`/`INSERT`/`UPDATE`/`DELETE`/`WITH` statements are kept, at
//! most [`MAX_PLANS`] per backend (statements built at run time beyond that run unsaved).
//!
//! Imports: pgrx only.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::PgOid;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult};

/// Saved plans per backend at most.
pub const MAX_PLANS: usize = 256;

#[derive(PartialEq, Eq, Hash)]
struct PlanKey {
    query: String,
    types: Vec<u32>,
    mutating: bool,
}

thread_local! {
    // A backend runs SQL functions on one thread; plans are shared by `Rc` so that a statement
    // that re-enters the extension (a trigger) can look plans up while one runs.
    static PLANS: RefCell<HashMap<PlanKey, Rc<OwnedPreparedStatement>>> =
        RefCell::new(HashMap::new());
}

/// Whether `query` is a statement worth keeping a plan for.
fn keepable(query: &str) -> bool {
    let head = query
        .trim_start()
        .split(|c: char| c.is_whitespace() || c == '(')
        .next()
        .unwrap_or_default();
    ["select", "insert", "update", "delete", "with"]
        .iter()
        .any(|keyword| head.eq_ignore_ascii_case(keyword))
}

/// The saved plan of `query` for the types of `args` (`mutating`: the statement writes or
/// locks rows), prepared on first use; `None` when the statement is not kept (see the module).
pub fn saved_plan(
    client: &SpiClient<'_>,
    query: &str,
    args: &[DatumWithOid<'_>],
    mutating: bool,
) -> SpiResult<Option<Rc<OwnedPreparedStatement>>> {
    if !keepable(query) {
        return Ok(None);
    }
    let key = PlanKey {
        query: query.to_owned(),
        types: args.iter().map(|a| a.oid().to_u32()).collect(),
        mutating,
    };
    if let Some(plan) = PLANS.with(|plans| plans.borrow().get(&key).cloned()) {
        return Ok(Some(plan));
    }
    if PLANS.with(|plans| plans.borrow().len()) >= MAX_PLANS {
        return Ok(None);
    }
    let types: Vec<PgOid> = args.iter().map(|a| PgOid::from(a.oid())).collect();
    let prepared = if mutating {
        client.prepare_mut(query, &types)?
    } else {
        client.prepare(query, &types)?
    };
    let plan = Rc::new(prepared.keep());
    PLANS.with(|plans| plans.borrow_mut().insert(key, Rc::clone(&plan)));
    Ok(Some(plan))
}

#[cfg(test)]
mod tests {
    use super::keepable;

    #[test]
    fn only_plain_statements_are_kept() {
        for query in [
            "SELECT 1",
            "  select x FROM t",
            "INSERT INTO t VALUES ($1)",
            "update t SET x = 1",
            "DELETE FROM t",
            "WITH a AS (SELECT 1) SELECT * FROM a",
            "SELECT(1)",
        ] {
            assert!(keepable(query), "{query}");
        }
        for query in ["LOCK TABLE t", "SET LOCAL x = 1", "NOTIFY c", "", "   "] {
            assert!(!keepable(query), "{query:?}");
        }
    }
}
