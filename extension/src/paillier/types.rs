//! The type `paillier_template`: a hand-laid varlena whose payload is the service provider's
//! signed template record of Game-Set-MATCH [ABMR20] §6.1 (σ over the device id, parameters,
//! public key, packed ciphertexts and expiry), encoded and validated by
//! [`privmatch_core::paillier::record::SignedTemplate`]. Text form: the payload in lowercase
//! hex. Every entry point (text input, binary receive, so `COPY … (FORMAT binary)` too)
//! decodes the record strictly; the signature itself is checked where it is used. Declared in
//! `sql/paillier.sql`.

use std::ffi::{c_char, CStr};

use pgrx::prelude::*;
use pgrx::{pg_getarg_datum_raw, pg_sys};
use privmatch_core::paillier::record::SignedTemplate;

use crate::datum::{cstring_datum, payload_to_varlena, v1_function, varlena_payload};
use crate::errors::raise;

/// The SQL name of the type, in every error about its values.
const TYPE_NAME: &str = "paillier_template";

/// A varlena of `payload`, refused (`code`, naming the type) unless it is a well-formed
/// signed template record.
fn validated(payload: &[u8], code: PgSqlErrorCode, what: &str) -> pg_sys::Datum {
    if let Err(e) = SignedTemplate::from_bytes(payload) {
        raise(code, format!("{what} for type {TYPE_NAME}: {e}"), None);
    }
    pg_sys::Datum::from(payload_to_varlena(payload))
}

// `paillier_template_in(cstring, oid, int4)`: hex text of the record.
v1_function!(
    pg_finfo_paillier_template_in,
    paillier_template_in,
    |fcinfo| {
        // SAFETY: declared `(cstring, oid, integer)` STRICT: argument 0 is a non-null C string,
        // valid for the call.
        let text = CStr::from_ptr(pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<c_char>());
        let syntax = PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION;
        let text = text.to_str().unwrap_or_else(|_| {
            raise(
                syntax,
                format!("invalid input syntax for type {TYPE_NAME}: not UTF-8"),
                None,
            )
        });
        let bytes = hex::decode(text.trim()).unwrap_or_else(|e| {
            raise(
                syntax,
                format!("invalid input syntax for type {TYPE_NAME}: not hex ({e})"),
                None,
            )
        });
        validated(&bytes, syntax, "invalid input syntax")
    }
);

// `paillier_template_out(paillier_template) → cstring`.
v1_function!(
    pg_finfo_paillier_template_out,
    paillier_template_out,
    |fcinfo| {
        // SAFETY: declared `(privmatch.paillier_template)` STRICT: a non-null varlena.
        let payload = varlena_payload(pg_getarg_datum_raw(fcinfo, 0));
        cstring_datum(&hex::encode(payload))
    }
);

// `paillier_template_recv(internal, oid, int4)`: the binary form is the record itself.
v1_function!(
    pg_finfo_paillier_template_recv,
    paillier_template_recv,
    |fcinfo| {
        // SAFETY: argument 0 is the StringInfo Postgres passes to a receive function (cursor ≤
        // len); the bytes from the cursor to the end belong to this value.
        let buf = pg_getarg_datum_raw(fcinfo, 0).cast_mut_ptr::<pg_sys::StringInfoData>();
        let remaining = ((*buf).len - (*buf).cursor) as usize;
        let start = (*buf).data.add((*buf).cursor as usize) as *const u8;
        let payload = std::slice::from_raw_parts(start, remaining);
        let datum = validated(
            payload,
            PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
            "invalid binary representation",
        );
        // SAFETY: `buf` is the valid StringInfo above; the whole remainder was consumed.
        (*buf).cursor = (*buf).len;
        datum
    }
);

// `paillier_template_send(paillier_template) → bytea`.
v1_function!(
    pg_finfo_paillier_template_send,
    paillier_template_send,
    |fcinfo| {
        // SAFETY: declared `(privmatch.paillier_template)` STRICT: a non-null varlena.
        let payload = varlena_payload(pg_getarg_datum_raw(fcinfo, 0));
        pg_sys::Datum::from(payload_to_varlena(payload))
    }
);
