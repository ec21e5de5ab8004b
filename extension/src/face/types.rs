//! The face share type `face_share`: a hand-laid varlena whose payload is the layout of
//! [`privmatch_core::wire::storage`] (kind `FaceTemplate`), with the I/O functions of
//! [`crate::datum`], and `face_share_dim`. Declared in `sql/face.sql`.

use pgrx::pg_sys;
use privmatch_core::wire::storage::{decode_share, ShareKind};

use crate::datum::{share_type_functions, v1_function, varlena_payload};
use crate::errors::raise_share_layout;

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
    // `face_share_dim` is declared `(privmatch.face_share)`, STRICT: argument 0 is a
    // non-null varlena.
    let payload = varlena_payload(pgrx::pg_getarg_datum_raw(fcinfo, 0));
    let view =
        decode_share(ShareKind::FaceTemplate, payload).unwrap_or_else(|e| raise_share_layout(e));
    pg_sys::Datum::from(view.len() as i32)
});
