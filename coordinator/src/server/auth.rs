//! Who may call the coordinator's API, and how much at once: API credentials with scopes
//! ([`ApiKeys`], [`Scope`]), the request guard every route passes ([`guard`]: 401 without a
//! valid credential, 403 without the scope, 413 for a body over the limit, 429 when the
//! coordinator is at its concurrency limit) and one audit line per call (who, what, when,
//! the answer; never a credential or a body).
//!
//! A credential is `pm_<key id>_<64 hex digits>`; the coordinator keeps only the SHA-256 of
//! its secret part, in the keys file (`api-keys.toml`, mode 0600, written by `privmatch
//! cluster up` or an operator), so reading that file gives no credential.
//!
//! Each route declares the scope it needs where it is defined, in its modality's
//! `routes.rs` ([`crate::server::scoped::ScopedRoutes`]); the guard looks the request's path up
//! in the merged table ([`crate::server::scoped::RouteScopes`]). `/v1/health` is open (it
//! reveals nothing); a path nobody declared is refused before anything else (fail closed).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::server::error::error_with;
use privmatch_api::ErrorCode;

/// What a credential may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Enrol templates.
    Enroll,
    /// Search, verify, identify.
    Search,
    /// Delete templates.
    Delete,
    /// Configure the dealer, status, recovery.
    Admin,
    /// Take part in matching sessions as a user's device (packed Paillier): fetch the
    /// messages addressed to it, post its replies.
    Device,
}

impl Scope {
    /// All scopes.
    pub const ALL: [Scope; 5] = [
        Scope::Enroll,
        Scope::Search,
        Scope::Delete,
        Scope::Admin,
        Scope::Device,
    ];

    /// The scope's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Enroll => "enroll",
            Scope::Search => "search",
            Scope::Delete => "delete",
            Scope::Admin => "admin",
            Scope::Device => "device",
        }
    }

    /// The scope named `name`; an error that lists the names otherwise.
    pub fn parse(name: &str) -> Result<Scope> {
        Scope::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .with_context(|| {
                format!("unknown scope {name:?}: enroll, search, delete, admin or device")
            })
    }
}

/// What a request needs (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Nothing: open to anyone.
    Nothing,
    /// A credential with this scope.
    Scope(Scope),
    /// Nothing grants it: refused.
    Refused,
}

/// What each declared path needs.
#[derive(Clone, Debug, Default)]
pub struct RouteScopes(BTreeMap<&'static str, Needs>);

impl RouteScopes {
    /// What a request to `path` needs: [`Needs::Refused`] for a path nobody declared.
    pub fn needs(&self, path: &str) -> Needs {
        self.0.get(path).copied().unwrap_or(Needs::Refused)
    }

    /// The declared paths, sorted.
    pub fn paths(&self) -> Vec<&'static str> {
        self.0.keys().copied().collect()
    }

    pub(crate) fn declare(&mut self, path: &'static str, needs: Needs) {
        // A path declared twice would be a programming error axum also refuses (it panics
        // on an overlapping route), so the first declaration is the only one.
        self.0.entry(path).or_insert(needs);
    }

    /// These scopes and `other`'s.
    pub fn extend(&mut self, other: RouteScopes) {
        for (path, needs) in other.0 {
            self.declare(path, needs);
        }
    }
}

/// One accepted credential, as the keys file holds it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ApiKeyEntry {
    /// The key's name (shown in the audit log).
    pub id: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// SHA-256 of the secret part (hex).
    pub sha256: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct KeysFile {
    #[serde(default, rename = "key")]
    keys: Vec<ApiKeyEntry>,
}

/// The credentials the coordinator accepts.
#[derive(Clone, Debug, Default)]
pub struct ApiKeys {
    keys: Vec<ApiKeyEntry>,
}

fn digest_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Equality that takes the same time wherever the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

impl ApiKeys {
    /// Reads a keys file, refusing one that other users may write.
    pub fn load(path: &Path) -> Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let mode = std::fs::metadata(path)
            .with_context(|| format!("cannot read the API keys file {}", path.display()))?
            .mode();
        if mode & 0o022 != 0 {
            bail!(
                "the API keys file {} has mode {:04o}: others may write it (chmod 600)",
                path.display(),
                mode & 0o777
            );
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let file: KeysFile = toml::from_str(&text)
            .with_context(|| format!("invalid API keys file {}", path.display()))?;
        for key in &file.keys {
            if !valid_id(&key.id) || key.sha256.len() != 64 || hex::decode(&key.sha256).is_err() {
                bail!(
                    "{}: key {:?} needs an id of letters, digits, '-' or '.' and a 64-hex-digit sha256",
                    path.display(),
                    key.id
                );
            }
        }
        Ok(ApiKeys { keys: file.keys })
    }

    /// A fresh credential `id` with `scopes`: the token to give its holder, and the entry the
    /// coordinator keeps.
    pub fn generate(id: &str, scopes: &[Scope]) -> Result<(String, ApiKeyEntry)> {
        if !valid_id(id) {
            bail!("an API key id is 1-64 letters, digits, '-' or '.', not {id:?}");
        }
        let mut secret = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut secret);
        let secret = hex::encode(secret);
        let entry = ApiKeyEntry {
            id: id.to_owned(),
            scopes: scopes.to_vec(),
            sha256: digest_hex(&secret),
        };
        Ok((format!("pm_{id}_{secret}"), entry))
    }

    /// Writes `entries` as a keys file (0600).
    pub fn save(entries: &[ApiKeyEntry], path: &Path) -> Result<()> {
        crate::config::save_toml(
            &KeysFile {
                keys: entries.to_vec(),
            },
            path,
        )
    }

    /// The credentials, as the keys file holds them (digests, never tokens).
    pub fn entries(&self) -> &[ApiKeyEntry] {
        &self.keys
    }

    /// Whether `token` is one of these credentials.
    pub fn accepts(&self, token: &str) -> bool {
        self.find(token).is_some()
    }

    /// The entry a bearer token belongs to.
    fn find(&self, token: &str) -> Option<&ApiKeyEntry> {
        let rest = token.strip_prefix("pm_")?;
        let (id, secret) = rest.rsplit_once('_')?;
        let digest = digest_hex(secret);
        self.keys
            .iter()
            .find(|k| k.id == id && constant_time_eq(k.sha256.as_bytes(), digest.as_bytes()))
    }
}

/// What the guard enforces.
pub struct Guard {
    /// The accepted credentials.
    pub keys: ApiKeys,
    /// What each path of the API needs, as its routes declare it.
    pub scopes: RouteScopes,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// Requests served at once; more are refused with 429.
    pub in_flight: Semaphore,
}

impl Guard {
    /// A guard for `keys` over the routes' `scopes`, with the given limits.
    pub fn new(
        keys: ApiKeys,
        scopes: RouteScopes,
        max_body_bytes: usize,
        max_in_flight: usize,
    ) -> Arc<Self> {
        Arc::new(Guard {
            keys,
            scopes,
            max_body_bytes,
            in_flight: Semaphore::new(max_in_flight.max(1)),
        })
    }
}

fn refusal(code: ErrorCode, message: &str) -> Response {
    let mut response = error_with(code, message.to_owned()).into_response();
    if code == ErrorCode::Unauthenticated {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if code == ErrorCode::TooBusy {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// Checks a request (module docs) and writes its audit line; only a request that passes
/// reaches a handler.
pub async fn guard(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let (who, response) = check_and_run(&guard, request, next).await;
    tracing::info!(
        target: "privmatch::audit",
        key = who.as_deref().unwrap_or("-"),
        %method,
        path = %path,
        status = response.status().as_u16(),
        ms = started.elapsed().as_millis() as u64,
        "api call"
    );
    response
}

/// The API credential a request was authenticated with (its id), for the handlers that count
/// per caller (the Paillier service provider's per-terminal session budget).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential(pub String);

async fn check_and_run(
    guard: &Guard,
    mut request: Request,
    next: Next,
) -> (Option<String>, Response) {
    let needed = guard.scopes.needs(request.uri().path());
    let scope = match needed {
        Needs::Nothing => return (None, next.run(request).await),
        Needs::Refused => {
            return (
                None,
                refusal(ErrorCode::UnknownEndpoint, "no such endpoint"),
            )
        }
        Needs::Scope(scope) => scope,
    };
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(key) = token.and_then(|t| guard.keys.find(t)) else {
        let message = "an API credential is required (Authorization: Bearer pm_…)";
        return (None, refusal(ErrorCode::Unauthenticated, message));
    };
    let who = Some(key.id.clone());
    if !key.scopes.contains(&scope) {
        let message = format!(
            "the API key {:?} lacks the {} scope",
            key.id,
            scope.as_str()
        );
        return (who, refusal(ErrorCode::Forbidden, &message));
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > guard.max_body_bytes as u64) {
        return (who, too_large(guard.max_body_bytes));
    }
    let Ok(_permit) = guard.in_flight.try_acquire() else {
        let message = "the coordinator is serving as many requests as it may; retry shortly";
        return (who, refusal(ErrorCode::TooBusy, message));
    };
    request.extensions_mut().insert(Credential(key.id.clone()));
    let response = next.run(request).await;
    // A body sent without a length (chunked) is cut by the body limit layer, which answers
    // 413 in plain text: give it the API's JSON shape.
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE
        && response.headers().get(header::CONTENT_TYPE)
            != Some(&HeaderValue::from_static("application/json"))
    {
        return (who, too_large(guard.max_body_bytes));
    }
    (who, response)
}

/// The 413 refusal of a body over `limit` bytes.
fn too_large(limit: usize) -> Response {
    let message =
        format!("the request body is larger than the limit of {limit} bytes: send smaller batches");
    refusal(ErrorCode::TooLarge, &message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_token_matches_and_the_file_keeps_no_token() {
        let (token, entry) = ApiKeys::generate("cli", &Scope::ALL).expect("generate");
        assert!(!entry
            .sha256
            .contains(token.rsplit('_').next().expect("secret")));
        let keys = ApiKeys {
            keys: vec![entry.clone()],
        };
        assert_eq!(keys.find(&token).map(|k| k.id.as_str()), Some("cli"));
        let mut wrong = token.clone();
        wrong.pop();
        wrong.push('0');
        if wrong == token {
            wrong.pop();
            wrong.push('1');
        }
        assert!(keys.find(&wrong).is_none());
        assert!(keys.find("pm_other_00").is_none());
        assert!(keys.find("Bearer").is_none());
        let dir = std::env::temp_dir().join(format!("pm-api-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("api-keys.toml");
        ApiKeys::save(&[entry], &path).expect("save");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(!text.contains(&token));
        assert!(ApiKeys::load(&path).expect("load").find(&token).is_some());
        assert!(ApiKeys::generate("bad id", &[Scope::Admin]).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
