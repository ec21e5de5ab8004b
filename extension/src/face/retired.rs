//! The C symbols of the face key pool's SQL functions, retired in 0.13.0
//! (`migrations/privmatch--0.12.0--0.13.0.sql` drops the functions). PostgreSQL resolves a C
//! function's symbol when the function is created, so the install scripts of 0.1.0–0.12.0 —
//! which an operator runs under this library on the way to `ALTER EXTENSION privmatch UPDATE`
//! (and `tests/tests/upgrade.rs` does) — still need them. Each one only refuses, naming the
//! function: nothing of the pool exists any more.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::datum::v1_function;
use crate::errors::raise;

/// Refuses a call of the retired pool function `function` (0A000).
fn retired(function: &str) -> pg_sys::Datum {
    raise(
        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
        format!("{function}: the face key pool was retired in privmatch 0.13.0"),
        Some("run `ALTER EXTENSION privmatch UPDATE`; every face session runs over dealer-masked templates (docs/protocols/face.md §5)"),
    )
}

v1_function!(
    pg_finfo_face_dealer_generate_wrapper,
    face_dealer_generate_wrapper,
    |_fcinfo| { retired("face_dealer_generate") }
);
v1_function!(
    pg_finfo_face_keys_store_wrapper,
    face_keys_store_wrapper,
    |_fcinfo| { retired("face_keys_store") }
);
v1_function!(
    pg_finfo_face_keys_retire_before_wrapper,
    face_keys_retire_before_wrapper,
    |_fcinfo| retired("face_keys_retire_before")
);
v1_function!(
    pg_finfo_face_pool_status_wrapper,
    face_pool_status_wrapper,
    |_fcinfo| { retired("face_pool_status") }
);
v1_function!(
    pg_finfo_face_session_open_wrapper,
    face_session_open_wrapper,
    |_fcinfo| { retired("face_session_open") }
);
v1_function!(
    pg_finfo_face_session_round_wrapper,
    face_session_round_wrapper,
    |_fcinfo| { retired("face_session_round") }
);
v1_function!(
    pg_finfo_face_template_set_wrapper,
    face_template_set_wrapper,
    |_fcinfo| { retired("face_template_set") }
);
