//! Varlena datums and the I/O functions of the share types, shared by the modalities: each
//! share type (`iris_code_share`, `iris_mask_share`, `face_share`) is a hand-laid varlena
//! whose payload is the layout of [`privmatch_core::wire::storage`], told apart by its
//! [`ShareKind`]. A modality instantiates the functions below for its kinds with
//! [`share_type_functions!`] (`iris/types.rs`, `face/types.rs`); the SQL that declares the
//! types is in `sql/iris.sql` and `sql/face.sql`.
//!
//! They are plain version-1 C functions (not `#[pg_extern]`) because a base type's I/O
//! functions take and return raw `cstring`, `internal` and the type itself. Every entry point
//! re-validates: text input, binary `recv` (and so `COPY … (FORMAT binary)`), and the length
//! coercion that applies a column's typmod.
//!
//! Imports: [`crate::errors`] and core's `wire` layer (no modality).

use std::ffi::{c_char, CStr};

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::{pg_getarg_datum_raw, pg_sys};
use privmatch_core::wire::storage::{
    check_typmod, decode_share, format_share_text, parse_share_text, validate_typmod, ShareKind,
    ShareLayoutError,
};

use crate::errors::{raise, raise_share_layout};

/// Defines a version-1 C-callable function `$name` (and its `pg_finfo_` record) whose body runs
/// under pgrx's guard, so Rust panics and `ereport`s become ordinary Postgres errors. The body
/// may call the `unsafe` functions of this module with `$fcinfo`: the function must be
/// declared in SQL with the argument types those functions expect.
macro_rules! v1_function {
    ($finfo:ident, $name:ident, |$fcinfo:ident| $body:expr) => {
        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static ::pgrx::pg_sys::Pg_finfo_record {
            const V1_API: ::pgrx::pg_sys::Pg_finfo_record =
                ::pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1_API
        }

        #[unsafe(no_mangle)]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $name(
            $fcinfo: ::pgrx::pg_sys::FunctionCallInfo,
        ) -> ::pgrx::pg_sys::Datum {
            // SAFETY: the guard runs at the top of this `extern "C-unwind"` function, so no
            // frame with a pending destructor lies between it and Postgres. `$fcinfo` is the
            // call info Postgres passes to a V1 function; the SQL declaration of `$name`
            // (sql/iris.sql, sql/face.sql) gives it the arguments the body reads.
            unsafe { ::pgrx::pg_sys::submodules::panic::pgrx_extern_c_guard(|| $body) }
        }
    };
}
pub(crate) use v1_function;

/// Defines the seven I/O functions of the share type of `$kind` under the given symbol names
/// (each with its `pg_finfo_` record), in the order input, output, receive, send, typmod
/// input, typmod output and length coercion.
macro_rules! share_type_functions {
    ($kind:expr, $in_f:ident, $in:ident, $out_f:ident, $out:ident, $recv_f:ident, $recv:ident,
     $send_f:ident, $send:ident, $tin_f:ident, $tin:ident, $tout_f:ident, $tout:ident,
     $apply_f:ident, $apply:ident) => {
        $crate::datum::v1_function!($in_f, $in, |fcinfo| $crate::datum::share_in($kind, fcinfo));
        $crate::datum::v1_function!($out_f, $out, |fcinfo| $crate::datum::share_out(
            $kind, fcinfo
        ));
        $crate::datum::v1_function!($recv_f, $recv, |fcinfo| $crate::datum::share_recv(
            $kind, fcinfo
        ));
        $crate::datum::v1_function!($send_f, $send, |fcinfo| $crate::datum::share_send(
            $kind, fcinfo
        ));
        $crate::datum::v1_function!($tin_f, $tin, |fcinfo| $crate::datum::share_typmod_in(
            $kind, fcinfo
        ));
        $crate::datum::v1_function!($tout_f, $tout, |fcinfo| {
            $crate::datum::share_typmod_out(fcinfo)
        });
        $crate::datum::v1_function!($apply_f, $apply, |fcinfo| {
            $crate::datum::share_apply_typmod($kind, fcinfo)
        });
    };
}
pub(crate) use share_type_functions;

/// Copies `payload` into a freshly palloc'd varlena (in the current memory context).
pub fn payload_to_varlena(payload: &[u8]) -> *mut pg_sys::varlena {
    let total = pg_sys::VARHDRSZ + payload.len();
    // SAFETY: palloc returns a buffer of `total` bytes, aligned for any type, or raises for a
    // request above MaxAllocSize (1 GB - 1), so `total` fits the 30-bit length of a 4-byte
    // varlena header. The header is set before the payload is copied into the
    // `payload.len()` bytes behind it; the source slice and the fresh buffer cannot overlap.
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

/// `payload` as a datum of the share type `oid` (a fresh varlena), for an SPI argument.
pub fn share_datum(payload: &[u8], oid: pg_sys::Oid) -> DatumWithOid<'static> {
    // SAFETY: the datum is a valid varlena of the share type `oid` (the caller encoded
    // `payload` for it), palloc'd in the current memory context, which outlives the SPI call
    // it is passed to.
    unsafe { DatumWithOid::new(pg_sys::Datum::from(payload_to_varlena(payload)), oid) }
}

/// The oid of the type `name` (schema-qualified), or 42704 when it is missing.
pub fn type_oid(name: &str) -> pg_sys::Oid {
    Spi::get_one_with_args::<pg_sys::Oid>("SELECT to_regtype($1)::oid", &[name.into()])
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!("type {name} is missing: is the privmatch extension installed correctly?"),
                None,
            )
        })
}

/// The payload bytes of a (possibly toasted) varlena datum, detoasted into the current memory
/// context.
///
/// # Safety
/// `datum` must be a non-null varlena datum.
pub unsafe fn varlena_payload<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    // SAFETY: `datum` is a non-null varlena (the caller's contract); `pg_detoast_datum`
    // returns it or a palloc'd plain copy, whose bytes live as long as the current memory
    // context, i.e. the function call the slice is used in.
    unsafe {
        let detoasted = pg_sys::pg_detoast_datum(datum.cast_mut_ptr::<pg_sys::varlena>());
        pgrx::varlena_to_byte_slice(detoasted)
    }
}

/// `text` as a palloc'd, NUL-terminated C string datum.
pub fn cstring_datum(text: &str) -> pg_sys::Datum {
    // SAFETY: palloc returns `text.len() + 1` writable bytes (or raises): the text is copied
    // into the first `text.len()` and the NUL written into the last one.
    unsafe {
        let ptr = pg_sys::palloc(text.len() + 1) as *mut u8;
        std::ptr::copy_nonoverlapping(text.as_ptr(), ptr, text.len());
        *ptr.add(text.len()) = 0;
        pg_sys::Datum::from(ptr)
    }
}

/// A checked copy of `payload` as a datum of `kind`, with the typmod applied.
fn validated(kind: ShareKind, payload: &[u8], typmod: i32) -> pg_sys::Datum {
    let view = decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
    check_typmod(&view, typmod).unwrap_or_else(|e| raise_share_layout(e));
    pg_sys::Datum::from(payload_to_varlena(payload))
}

/// `input(cstring, oid, int4)`: parses the text form and applies the typmod.
///
/// # Safety
/// `fcinfo` is the call info of a function declared `(cstring, oid, integer)`, called STRICT.
pub unsafe fn share_in(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: argument 0 is a non-null cstring and argument 2 an int4 (the declaration above,
    // STRICT); the C string stays valid for the call.
    let (text, typmod) = unsafe {
        let text = CStr::from_ptr(pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<c_char>());
        (text, pg_getarg_datum_raw(fcinfo, 2).value() as i32)
    };
    let text = text.to_str().unwrap_or_else(|_| {
        raise_share_layout(ShareLayoutError::Syntax {
            type_name: kind.type_name(),
            reason: "input is not valid UTF-8".into(),
        })
    });
    let payload = parse_share_text(kind, text).unwrap_or_else(|e| raise_share_layout(e));
    validated(kind, &payload, typmod)
}

/// `output(type) → cstring`.
///
/// # Safety
/// `fcinfo` is the call info of a function declared `(<the share type of kind>)`, STRICT.
pub unsafe fn share_out(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: argument 0 is a non-null varlena of the share type (declaration, STRICT).
    let payload = unsafe { varlena_payload(pg_getarg_datum_raw(fcinfo, 0)) };
    let view = decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
    cstring_datum(&format_share_text(&view))
}

/// `receive(internal, oid, int4)`: the binary form is the payload itself, re-validated.
///
/// # Safety
/// `fcinfo` is the call info of a function declared `(internal, oid, integer)`, STRICT,
/// called by Postgres with a `StringInfo` as the `internal` argument.
pub unsafe fn share_recv(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: argument 0 is the message buffer Postgres passes to a receive function (a valid
    // StringInfo with `cursor <= len`), argument 2 an int4; the bytes from the cursor to the
    // end belong to this value and stay valid for the call.
    let (buf, payload, typmod) = unsafe {
        let buf = pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<pg_sys::StringInfoData>();
        let remaining = ((*buf).len - (*buf).cursor) as usize;
        let start = (*buf).data.add((*buf).cursor as usize) as *const u8;
        let payload = std::slice::from_raw_parts(start, remaining);
        (buf, payload, pg_getarg_datum_raw(fcinfo, 2).value() as i32)
    };
    let datum = validated(kind, payload, typmod);
    // SAFETY: `buf` is the valid StringInfo above; the whole remainder was consumed.
    unsafe { (*buf).cursor = (*buf).len };
    datum
}

/// `send(type) → bytea`.
///
/// # Safety
/// `fcinfo` is the call info of a function declared `(<the share type of kind>)`, STRICT.
pub unsafe fn share_send(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: argument 0 is a non-null varlena of the share type (declaration, STRICT).
    let payload = unsafe { varlena_payload(pg_getarg_datum_raw(fcinfo, 0)) };
    decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
    pg_sys::Datum::from(payload_to_varlena(payload))
}

/// `typmod_in(cstring[]) → int4`: one positive length, a multiple of 4.
///
/// # Safety
/// `fcinfo` is the call info of a function declared `(cstring[])`, STRICT.
pub unsafe fn share_typmod_in(kind: ShareKind, fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    let mut count = 0;
    // SAFETY: argument 0 is a non-null cstring[] (declaration, STRICT);
    // `ArrayGetIntegerTypmods` checks its element type and returns `count` palloc'd int4s.
    let values = unsafe {
        let array = pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<pg_sys::ArrayType>();
        pg_sys::ArrayGetIntegerTypmods(array, &mut count)
    };
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
    // SAFETY: `values` holds `count` = 1 element.
    let length = unsafe { *values };
    let length = validate_typmod(kind, i64::from(length)).unwrap_or_else(|e| raise_share_layout(e));
    pg_sys::Datum::from(length as i32)
}

/// `typmod_out(int4) → cstring`.
///
/// # Safety
/// `fcinfo` is the call info of a function declared `(integer)`, STRICT.
pub unsafe fn share_typmod_out(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: argument 0 is an int4 (declaration, STRICT).
    let typmod = unsafe { pg_getarg_datum_raw(fcinfo, 0) }.value() as i32;
    if typmod < 0 {
        cstring_datum("")
    } else {
        cstring_datum(&format!("({typmod})"))
    }
}

/// `apply_typmod(type, int4, bool) → type`: the length coercion run when a value is stored into
/// a column declared with a length.
///
/// # Safety
/// `fcinfo` is the call info of a function declared `(<the share type of kind>, integer,
/// boolean)`, STRICT.
pub unsafe fn share_apply_typmod(
    kind: ShareKind,
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: argument 0 is a non-null varlena of the share type, argument 1 an int4
    // (declaration, STRICT).
    let (datum, typmod, payload) = unsafe {
        let datum = pg_getarg_datum_raw(fcinfo, 0);
        (
            datum,
            pg_getarg_datum_raw(fcinfo, 1).value() as i32,
            varlena_payload(datum),
        )
    };
    let view = decode_share(kind, payload).unwrap_or_else(|e| raise_share_layout(e));
    check_typmod(&view, typmod).unwrap_or_else(|e| raise_share_layout(e));
    datum
}
