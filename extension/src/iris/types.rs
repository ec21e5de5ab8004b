//! The iris share types `iris_code_share` and `iris_mask_share`: hand-laid varlenas whose
//! payload is the layout of [`privmatch_core::wire::storage`] (kinds `IrisCode` and
//! `IrisMask`), with the I/O functions of [`crate::datum`]. Declared in `sql/iris.sql`.

use privmatch_core::wire::storage::ShareKind;

use crate::datum::share_type_functions;

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
