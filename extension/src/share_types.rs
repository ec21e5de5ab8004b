//! The share types `iris_code_share` and `iris_mask_share`: hand-laid varlenas whose payload is
//! the layout of [`privmatch_core::wire::storage`]. These are plain version-1 C functions (not
//! `#[pg_extern]`) because a base type's I/O functions take and return raw `cstring`,
//! `internal` and the type itself; the SQL that declares them is in `sql/privmatch.sql`.
//!
//! Every entry point re-validates: text input, binary `recv` (and so `COPY … (FORMAT binary)`),
//! and the length coercion that applies a column's typmod.

use std::ffi::{c_char, CStr};

use pgrx::pg_sys;
use pgrx::prelude::*;
use privmatch_core::wire::storage::{
    check_typmod, decode_share, format_share_text, parse_share_text, validate_typmod, ShareKind,
    ShareLayoutError,
};

use crate::errors::{raise, raise_share_layout};

/// Defines a version-1 C-callable function `$name` (and its `pg_finfo_` record) whose body runs
/// under pgrx's guard, so Rust panics and `ereport`s become ordinary Postgres errors.
macro_rules! v1_function {
    ($finfo:ident, $name:ident, |$fcinfo:ident| $body:block) => {
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1_API
        }

        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $name($fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
            unsafe { pg_sys::submodules::panic::pgrx_extern_c_guard(|| $body) }
        }
    };
}

/// Copies `payload` into a freshly palloc'd varlena.
pub fn payload_to_varlena(payload: &[u8]) -> *mut pg_sys::varlena {
    let total = pg_sys::VARHDRSZ + payload.len();
    unsafe {
        let ptr = pg_sys::palloc(total) as *mut pg_sys::varlena;
        pgrx::set_varsize_4b(ptr, total as i32);
        std::ptr::copy_nonoverlapping(
            payload.as_ptr(),
            pgrx::vardata_4b(ptr) as *mut u8,
            payload.len(),
        );
        ptr
    }
}

/// The payload bytes of a (possibly toasted) varlena datum, detoasted into the current memory
/// context.
///
/// # Safety
/// `datum` must be a non-null varlena datum.
pub unsafe fn varlena_payload<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    unsafe {
        let detoasted = pg_sys::pg_detoast_datum(datum.cast_mut_ptr::<pg_sys::varlena>());
        pgrx::varlena_to_byte_slice(detoasted)
    }
}

fn cstring_datum(text: &str) -> pg_sys::Datum {
    unsafe {
        let ptr = pg_sys::palloc(text.len() + 1) as *mut u8;
        std::ptr::copy_nonoverlapping(text.as_ptr(), ptr, text.len());
        *ptr.add(text.len()) = 0;
        pg_sys::Datum::from(ptr)
    }
}

fn validated(kind: ShareKind, payload: &[u8], typmod: i32) -> pg_sys::Datum {
    let view = decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
    check_typmod(&view, typmod).unwrap_or_else(|e| raise_share_layout(e));
    pg_sys::Datum::from(payload_to_varlena(payload))
}

/// `input(cstring, oid, int4)`: parses the text form and applies the typmod.
unsafe fn share_in(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let text_ptr = pgrx::pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<c_char>();
        let typmod = pgrx::pg_getarg_datum_raw(fcinfo, 2).value() as i32;
        let text = CStr::from_ptr(text_ptr).to_str().unwrap_or_else(|_| {
            raise_share_layout(ShareLayoutError::Syntax {
                type_name: kind.type_name(),
                reason: "input is not valid UTF-8".into(),
            })
        });
        let payload = parse_share_text(kind, text).unwrap_or_else(|e| raise_share_layout(e));
        validated(kind, &payload, typmod)
    }
}

/// `output(type) → cstring`.
unsafe fn share_out(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let payload = varlena_payload(pgrx::pg_getarg_datum_raw(fcinfo, 0));
        let view = decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
        cstring_datum(&format_share_text(&view))
    }
}

/// `receive(internal, oid, int4)`: the binary form is the payload itself, re-validated.
unsafe fn share_recv(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let buf = pgrx::pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<pg_sys::StringInfoData>();
        let typmod = pgrx::pg_getarg_datum_raw(fcinfo, 2).value() as i32;
        let remaining = ((*buf).len - (*buf).cursor) as usize;
        let start = (*buf).data.add((*buf).cursor as usize) as *const u8;
        let payload = std::slice::from_raw_parts(start, remaining);
        let datum = validated(kind, payload, typmod);
        (*buf).cursor = (*buf).len;
        datum
    }
}

/// `send(type) → bytea`.
unsafe fn share_send(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let payload = varlena_payload(pgrx::pg_getarg_datum_raw(fcinfo, 0));
        decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
        pg_sys::Datum::from(payload_to_varlena(payload))
    }
}

/// `typmod_in(cstring[]) → int4`: one positive length, a multiple of 4.
unsafe fn share_typmod_in(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let array = pgrx::pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<pg_sys::ArrayType>();
        let mut count = 0;
        let values = pg_sys::ArrayGetIntegerTypmods(array, &mut count);
        if count != 1 {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "invalid type modifier for type {}: expected one length",
                    kind.type_name()
                ),
                None,
            );
        }
        let length =
            validate_typmod(kind, i64::from(*values)).unwrap_or_else(|e| raise_share_layout(e));
        pg_sys::Datum::from(length as i32)
    }
}

/// `typmod_out(int4) → cstring`.
unsafe fn share_typmod_out(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let typmod = pgrx::pg_getarg_datum_raw(fcinfo, 0).value() as i32;
        if typmod < 0 {
            cstring_datum("")
        } else {
            cstring_datum(&format!("({typmod})"))
        }
    }
}

/// `apply_typmod(type, int4, bool) → type`: the length coercion run when a value is stored into
/// a column declared with a length.
unsafe fn share_apply_typmod(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    unsafe {
        let datum = pgrx::pg_getarg_datum_raw(fcinfo, 0);
        let typmod = pgrx::pg_getarg_datum_raw(fcinfo, 1).value() as i32;
        let payload = varlena_payload(datum);
        let view = decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
        check_typmod(&view, typmod).unwrap_or_else(|e| raise_share_layout(e));
        datum
    }
}

macro_rules! share_type_functions {
    ($kind:expr, $in_f:ident, $in:ident, $out_f:ident, $out:ident, $recv_f:ident, $recv:ident,
     $send_f:ident, $send:ident, $tin_f:ident, $tin:ident, $tout_f:ident, $tout:ident,
     $apply_f:ident, $apply:ident) => {
        v1_function!($in_f, $in, |fcinfo| { share_in($kind, fcinfo) });
        v1_function!($out_f, $out, |fcinfo| { share_out($kind, fcinfo) });
        v1_function!($recv_f, $recv, |fcinfo| { share_recv($kind, fcinfo) });
        v1_function!($send_f, $send, |fcinfo| { share_send($kind, fcinfo) });
        v1_function!($tin_f, $tin, |fcinfo| { share_typmod_in($kind, fcinfo) });
        v1_function!($tout_f, $tout, |fcinfo| { share_typmod_out(fcinfo) });
        v1_function!($apply_f, $apply, |fcinfo| {
            share_apply_typmod($kind, fcinfo)
        });
    };
}

share_type_functions!(
    ShareKind::IrisCode,
    pg_finfo_iris_code_share_in,
    iris_code_share_in,
    pg_finfo_iris_code_share_out,
    iris_code_share_out,
    pg_finfo_iris_code_share_recv,
    iris_code_share_recv,
    pg_finfo_iris_code_share_send,
    iris_code_share_send,
    pg_finfo_iris_code_share_typmod_in,
    iris_code_share_typmod_in,
    pg_finfo_iris_code_share_typmod_out,
    iris_code_share_typmod_out,
    pg_finfo_iris_code_share_apply_typmod,
    iris_code_share_apply_typmod
);

share_type_functions!(
    ShareKind::IrisMask,
    pg_finfo_iris_mask_share_in,
    iris_mask_share_in,
    pg_finfo_iris_mask_share_out,
    iris_mask_share_out,
    pg_finfo_iris_mask_share_recv,
    iris_mask_share_recv,
    pg_finfo_iris_mask_share_send,
    iris_mask_share_send,
    pg_finfo_iris_mask_share_typmod_in,
    iris_mask_share_typmod_in,
    pg_finfo_iris_mask_share_typmod_out,
    iris_mask_share_typmod_out,
    pg_finfo_iris_mask_share_apply_typmod,
    iris_mask_share_apply_typmod
);

share_type_functions!(
    ShareKind::FaceTemplate,
    pg_finfo_face_share_in,
    face_share_in,
    pg_finfo_face_share_out,
    face_share_out,
    pg_finfo_face_share_recv,
    face_share_recv,
    pg_finfo_face_share_send,
    face_share_send,
    pg_finfo_face_share_typmod_in,
    face_share_typmod_in,
    pg_finfo_face_share_typmod_out,
    face_share_typmod_out,
    pg_finfo_face_share_apply_typmod,
    face_share_apply_typmod
);

// `face_share_dim(face_share) → int4`: the embedding dimension of a face share.
v1_function!(pg_finfo_face_share_dim, face_share_dim, |fcinfo| {
    let payload = varlena_payload(pgrx::pg_getarg_datum_raw(fcinfo, 0));
    let view =
        decode_share(ShareKind::FaceTemplate, payload).unwrap_or_else(|e| raise_share_layout(e));
    pg_sys::Datum::from(view.len() as i32)
});
