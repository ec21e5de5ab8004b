//! Turning core's errors into Postgres errors with the right SQLSTATE. Messages come from
//! core's `Display` impls, which never include share values or keys.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use privmatch_core::crypto::seal::SealError;
use privmatch_core::iris::enroll::BundleError;
use privmatch_core::wire::envelope::EnvelopeError;
use privmatch_core::wire::storage::ShareLayoutError;

/// Raises an ERROR with `code` and `message` (and an optional hint); never returns.
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>, hint: Option<&str>) -> ! {
    let mut report = ErrorReport::new(code, message.into(), "privmatch");
    if let Some(hint) = hint {
        report = report.set_hint(hint.to_owned());
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("an ERROR report does not return")
}

/// The SQLSTATE for a rejected share value.
pub fn share_layout_code(err: &ShareLayoutError) -> PgSqlErrorCode {
    match err {
        ShareLayoutError::Syntax { .. } => PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
        ShareLayoutError::Binary { .. } => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
        ShareLayoutError::LengthMismatch { .. } => PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
        ShareLayoutError::BadTypmod { .. } => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
    }
}

/// Raises a rejected share value.
pub fn raise_share_layout(err: ShareLayoutError) -> ! {
    raise(share_layout_code(&err), err.to_string(), None)
}

/// Raises an envelope that could not be opened or decoded, naming its position in the call.
pub fn raise_bundle(position: usize, err: BundleError) -> ! {
    let code = match &err {
        BundleError::Seal(SealError::WrongRecipient { .. })
        | BundleError::Seal(SealError::WrongKey { .. })
        | BundleError::PartyMismatch { .. } => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        BundleError::Envelope(EnvelopeError::BadSubject(_)) | BundleError::BadEye(_) => {
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
        }
        _ => PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
    };
    let hint = match &err {
        BundleError::Seal(SealError::WrongRecipient { .. }) => {
            Some("the coordinator routed a bundle to the wrong party; nothing was enrolled")
        }
        BundleError::Seal(SealError::WrongKey { .. }) => {
            Some("the client sealed to a key that is not this party's: check the pinned party keys")
        }
        _ => None,
    };
    raise(code, format!("envelope #{position}: {err}"), hint)
}
