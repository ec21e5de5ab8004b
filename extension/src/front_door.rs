//! The SQL front door, shared by the modalities: an application connected to a party runs
//! `SELECT privmatch.iris_identify(sealed)` (and the other front-door functions of
//! `iris/front_door.rs` and `face/front_door.rs`); the function hands the sealed input
//! (`privmatch_core::wire::sealed_input`, made on the client by `privmatch iris|face seal`) to
//! the coordinator's HTTPS API unchanged, waits for the protocol to run, and returns its answer
//! as SQL values. The party never sees a template: the input's shares are sealed to each
//! party's own key and are opened, as for any request, inside the protocol functions.
//!
//! Like dblink, the protocol's distributed transactions commit independently of the caller's
//! transaction: an enrolment that returned is at every party even if the caller rolls back,
//! and one whose call was cancelled may still complete. A sealed enrolment is single use: called
//! again, it fails with 23505 ("already consumed") exactly when the first call committed, so
//! that is how a caller whose call was cancelled, timed out or broke (40003) learns the
//! outcome. Waiting honours query cancellation and `statement_timeout` (57014) within 50 ms;
//! the request itself goes on at the coordinator.
//!
//! Configuration (postgresql.conf, superuser only): `privmatch.coordinator_url` (empty: the
//! front door is off), `privmatch.coordinator_ca_file` (the CA that issued the coordinator's
//! TLS certificate) and `privmatch.coordinator_credential_file` (the API credential, scopes
//! enroll and search; mode 0600, read by the server only, never by the caller). Relative
//! paths are under the data directory.
//!
//! Errors name the coordinator and carry SQLSTATEs an application can act on: 08001 cannot
//! reach it (nothing happened), 40003 the outcome is unknown, 40001 retry with a freshly
//! sealed input, 22023 the input was refused, 28000 the credential was refused.
//!
//! Imports: core's `wire::sealed_input`, [`crate::errors`], [`crate::signals`], [`crate::keyfile`]
//! (no modality).

use std::ffi::CString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use privmatch_api::error::is_sqlstate;
use privmatch_api::{ErrorBody, ErrorCode};
use privmatch_core::wire::sealed_input::{SealedInput, SealedKind};
use serde::de::DeserializeOwned;

use crate::errors::raise;
use crate::signals::without_signals;

/// `privmatch.coordinator_url`: where the front door sends requests (e.g.
/// `https://coordinator:8443`); empty turns it off.
pub static COORDINATOR_URL: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `privmatch.coordinator_ca_file`: the CA certificate (PEM) the coordinator's is checked with.
pub static COORDINATOR_CA_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
/// `privmatch.coordinator_credential_file`: the front door's API credential.
pub static COORDINATOR_CREDENTIAL_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);

/// How often the wait looks at cancellation and `statement_timeout`.
const TICK: Duration = Duration::from_millis(50);
/// How long connecting may take before the coordinator counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest answer read (an identification's matches).
const MAX_ANSWER_BYTES: u64 = 64 << 20;
/// A backstop for a request whose caller went away: the coordinator's own limits end every
/// protocol run long before this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

/// Defines the front door's GUCs (called from `_PG_init`).
pub fn register_gucs() {
    GucRegistry::define_string_guc(
        c"privmatch.coordinator_url",
        c"The coordinator the SQL front door sends requests to (https://host:port); empty: off.",
        c"The privmatch front-door functions (iris_enroll, iris_identify, face_verify, ...) ask this coordinator to run the protocol.",
        &COORDINATOR_URL,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"privmatch.coordinator_ca_file",
        c"The CA certificate (PEM) the coordinator's TLS certificate is checked against.",
        c"Relative paths are under the data directory.",
        &COORDINATOR_CA_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"privmatch.coordinator_credential_file",
        c"The file holding the SQL front door's API credential at the coordinator (mode 0600).",
        c"Relative paths are under the data directory.",
        &COORDINATOR_CREDENTIAL_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
}

fn setting(guc: &GucSetting<Option<CString>>) -> Option<String> {
    guc.get()
        .map(|s| s.to_string_lossy().trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn data_path(value: &str) -> PathBuf {
    // SAFETY: DataDir is set by the postmaster before any backend runs and is a NUL-terminated
    // string that lives as long as the process.
    let data_dir = unsafe { std::ffi::CStr::from_ptr(pg_sys::DataDir) }
        .to_string_lossy()
        .into_owned();
    crate::keyfile::resolve(value, Path::new(&data_dir))
}

fn not_configured(what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the privmatch SQL front door is not configured: {what} is not set"),
        Some("set privmatch.coordinator_url, privmatch.coordinator_ca_file and privmatch.coordinator_credential_file in postgresql.conf (docs/front-door.md) and reload"),
    )
}

/// Where and how to reach the coordinator, read from the configuration for one call.
struct Endpoint {
    url: String,
    ca_pem: Vec<u8>,
    token: String,
}

fn read_config_file(guc: &str, path: &Path, secret: bool) -> Vec<u8> {
    let fail = |detail: String| -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_CONFIG_FILE_ERROR,
            format!("{guc} {}: {detail}", path.display()),
            None,
        )
    };
    let file = std::fs::File::open(path).unwrap_or_else(|e| fail(e.to_string()));
    if secret {
        use std::os::unix::fs::MetadataExt;
        let mode = file.metadata().map(|m| m.mode() & 0o777).unwrap_or(0o777);
        if mode & 0o077 != 0 {
            fail(format!(
                "mode {mode:04o}: other users may read or write it (it must be 0600 or 0400)"
            ));
        }
    }
    let mut bytes = Vec::new();
    file.take(1 << 20)
        .read_to_end(&mut bytes)
        .unwrap_or_else(|e| fail(e.to_string()));
    bytes
}

fn endpoint() -> Endpoint {
    let url =
        setting(&COORDINATOR_URL).unwrap_or_else(|| not_configured("privmatch.coordinator_url"));
    if !url.starts_with("https://") {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("privmatch.coordinator_url must be an https:// URL, not {url:?}"),
            None,
        );
    }
    let ca = setting(&COORDINATOR_CA_FILE)
        .unwrap_or_else(|| not_configured("privmatch.coordinator_ca_file"));
    let credential = setting(&COORDINATOR_CREDENTIAL_FILE)
        .unwrap_or_else(|| not_configured("privmatch.coordinator_credential_file"));
    let ca_pem = read_config_file("privmatch.coordinator_ca_file", &data_path(&ca), false);
    let token = read_config_file(
        "privmatch.coordinator_credential_file",
        &data_path(&credential),
        true,
    );
    let token = String::from_utf8(token)
        .map(|t| t.trim().to_owned())
        .ok()
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_CONFIG_FILE_ERROR,
                "privmatch.coordinator_credential_file does not hold an API credential (one line of printable characters)",
                None,
            )
        });
    Endpoint {
        url: url.trim_end_matches('/').to_owned(),
        ca_pem,
        token,
    }
}

/// Parses the text the caller passed as `argument` of `function` and checks that it was
/// sealed for that function: 22P02 when it is not a sealed input, 22023 for another kind.
pub fn parse_sealed(text: &str, expected: SealedKind, argument: &str) -> SealedInput {
    let function = expected.sql_function();
    let input = SealedInput::parse(text).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
            format!("privmatch.{function}: argument {argument} is not a valid sealed input: {e}"),
            Some(&format!("write it with `{}`", expected.sealed_by())),
        )
    });
    if input.kind != expected {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "privmatch.{function}: argument {argument} was sealed for privmatch.{}, not for privmatch.{function}",
                input.kind.sql_function()
            ),
            Some(&format!("write it with `{}`", expected.sealed_by())),
        );
    }
    input
}

/// How a request failed before an HTTP answer came back.
enum Failure {
    /// Nothing reached the coordinator (connect, DNS or TLS handshake failed).
    Unreachable(String),
    /// The connection broke after the request may have been sent.
    Broken(String),
}

fn agent(endpoint: &Endpoint) -> Result<ureq::Agent, Failure> {
    let mut roots = Vec::new();
    for item in ureq::tls::parse_pem(&endpoint.ca_pem) {
        if let Ok(ureq::tls::PemItem::Certificate(cert)) = item {
            roots.push(cert);
        }
    }
    if roots.is_empty() {
        return Err(Failure::Unreachable(
            "privmatch.coordinator_ca_file holds no PEM certificate".into(),
        ));
    }
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(roots)))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .proxy(None)
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_global(Some(REQUEST_TIMEOUT))
        .build()
        .into())
}

fn classify(error: ureq::Error) -> Failure {
    use ureq::Error;
    let before_sending = matches!(
        &error,
        Error::HostNotFound
            | Error::ConnectionFailed
            | Error::BadUri(_)
            | Error::Tls(_)
            | Error::Rustls(_)
            | Error::Pem(_)
            | Error::TlsRequired
            | Error::ConnectProxyFailed(_)
    ) || matches!(&error, Error::Io(e) if matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::HostUnreachable
            | std::io::ErrorKind::NetworkUnreachable
            | std::io::ErrorKind::AddrNotAvailable
    )) || matches!(&error, Error::Timeout(t) if matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve));
    if before_sending {
        Failure::Unreachable(error.to_string())
    } else {
        Failure::Broken(error.to_string())
    }
}

/// Resolves the host of `url` (`https://host[:port]/…`): a name that does not resolve (a
/// stopped container's name, a typo) means nothing can have been sent.
fn resolve(url: &str) -> Result<(), Failure> {
    use std::net::ToSocketAddrs;
    let authority = url
        .strip_prefix("https://")
        .unwrap_or(url)
        .split('/')
        .next()
        .unwrap_or_default();
    let with_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:443")
    } else {
        authority.to_owned()
    };
    match with_port.to_socket_addrs().map(|mut a| a.next().is_some()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Failure::Unreachable(format!("{authority} has no address"))),
        Err(e) => Err(Failure::Unreachable(format!(
            "cannot resolve {authority}: {e}"
        ))),
    }
}

/// Posts `input`'s body to its endpoint; the HTTP status and answer body.
fn post(endpoint: &Endpoint, input: &SealedInput) -> Result<(u16, Vec<u8>), Failure> {
    resolve(&endpoint.url)?;
    let agent = agent(endpoint)?;
    let content_type = if input.kind.is_json() {
        "application/json"
    } else {
        "application/octet-stream"
    };
    let url = format!("{}{}", endpoint.url, input.kind.api_path());
    let mut response = agent
        .post(&url)
        .header("authorization", &format!("Bearer {}", endpoint.token))
        .header("content-type", content_type)
        .send(&input.body[..])
        .map_err(classify)?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER_BYTES)
        .read_to_vec()
        .map_err(|e| Failure::Broken(e.to_string()))?;
    Ok((status, body))
}

/// Runs `post` on a helper thread (which receives none of Postgres's signals) and waits for
/// it, checking for cancellation and `statement_timeout` every tick.
fn post_waiting(endpoint: Endpoint, input: SealedInput) -> Result<(u16, Vec<u8>), Failure> {
    let (tx, rx) = mpsc::channel();
    let started = without_signals(|| {
        std::thread::Builder::new()
            .name("privmatch-front-door".into())
            .spawn(move || {
                let _ = tx.send(post(&endpoint, &input));
            })
    });
    if let Err(e) = started {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_RESOURCES,
            format!("privmatch: cannot start the front door's request thread: {e}"),
            None,
        );
    }
    loop {
        match rx.recv_timeout(TICK) {
            Ok(result) => return result,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                pgrx::check_for_interrupts!();
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Failure::Broken(
                    "the request thread ended without an answer".into(),
                ))
            }
        }
    }
}

/// The SQLSTATE of a five-character code, if it is one.
fn sqlstate(code: &str) -> Option<PgSqlErrorCode> {
    if !is_sqlstate(code) {
        return None;
    }
    let bytes = code.as_bytes();
    // MAKE_SQLSTATE: six bits per character, the first character lowest.
    let packed = bytes.iter().enumerate().fold(0i32, |acc, (i, b)| {
        acc | ((i32::from(*b - b'0') & 0x3F) << (6 * i))
    });
    Some(PgSqlErrorCode::from(packed))
}

/// Sends `input` (already checked by [`parse_sealed`]) to the coordinator and returns its
/// answer, read as the API's type `T` (`privmatch_api`), or raises an error naming the
/// coordinator: for an error answer the SQLSTATE and hint of the API's one table
/// ([`ErrorBody::sqlstate_for`], [`ErrorCode::what_to_do`]). `writes`: whether the request
/// changes data (its outcome is then unknown when the connection breaks).
pub fn call<T: DeserializeOwned>(input: SealedInput, writes: bool) -> T {
    let endpoint = endpoint();
    let url = endpoint.url.clone();
    let function = input.kind.sql_function();
    let (status, body) = match post_waiting(endpoint, input) {
        Ok(answer) => answer,
        Err(Failure::Unreachable(e)) => raise(
            PgSqlErrorCode::ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
            format!("privmatch.{function}: cannot reach the coordinator at {url}: {e}"),
            Some("nothing was done; check that the coordinator is running and privmatch.coordinator_url"),
        ),
        Err(Failure::Broken(e)) if writes => raise(
            PgSqlErrorCode::ERRCODE_T_R_STATEMENT_COMPLETION_UNKNOWN,
            format!("privmatch.{function}: the connection to the coordinator at {url} broke before it answered: {e}"),
            Some("the outcome is unknown; calling again with the same sealed input fails with 23505 (already consumed) if it committed"),
        ),
        Err(Failure::Broken(e)) => raise(
            PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
            format!("privmatch.{function}: the connection to the coordinator at {url} broke before it answered: {e}"),
            None,
        ),
    };
    if (200..300).contains(&status) {
        return serde_json::from_slice(&body).unwrap_or_else(|e| {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                format!(
                    "privmatch.{function}: the coordinator at {url} answered something that is not the API's {}: {e}",
                    std::any::type_name::<T>().rsplit("::").next().unwrap_or_default()
                ),
                None,
            )
        });
    }
    let error: ErrorBody = serde_json::from_slice(&body).unwrap_or_default();
    let message = if error.error.is_empty() {
        format!("HTTP {status}")
    } else {
        error.error.clone()
    };
    let code = sqlstate(error.sqlstate_for(status)).unwrap_or(PgSqlErrorCode::ERRCODE_SYSTEM_ERROR);
    raise(
        code,
        format!("privmatch.{function}: the coordinator at {url} refused: {message}"),
        error.kind().and_then(ErrorCode::what_to_do),
    )
}

/// Raises: the coordinator's answer lacks `what` (or it has the wrong type).
pub fn malformed(function: &str, what: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
        format!("privmatch.{function}: the coordinator's answer lacks {what:?}"),
        None,
    )
}

/// Whether an enrolment answer enrolled its one record (`first`: its first result's
/// `enrolled`); tells the caller (NOTICE) when the coordinator's recovery still has to finish
/// the committed write at some parties (`pending_recovery`): the write is decided, so the
/// call succeeded.
pub fn enrolled(first: Option<bool>, pending_recovery: &[String], function: &str) -> bool {
    if !pending_recovery.is_empty() {
        pgrx::notice!(
            "privmatch.{function}: committed; the coordinator's recovery will complete it at {}",
            pending_recovery.join(", ")
        );
    }
    first.unwrap_or_else(|| malformed(function, "results[0].enrolled"))
}

#[cfg(test)]
mod tests {
    use super::sqlstate;
    use pgrx::prelude::PgSqlErrorCode;

    #[test]
    fn sqlstates_pack_as_postgres_does() {
        assert_eq!(
            sqlstate("22023"),
            Some(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE)
        );
        assert_eq!(
            sqlstate("57014"),
            Some(PgSqlErrorCode::ERRCODE_QUERY_CANCELED)
        );
        assert_eq!(
            sqlstate("XX000"),
            Some(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR)
        );
        assert_eq!(sqlstate("2202"), None);
        assert_eq!(sqlstate("2202e"), None);
    }
}
