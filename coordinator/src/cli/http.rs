//! The one HTTP client of the coordinator's API ([`Coordinator`]) and its one error type
//! ([`CallError`]): what the CLI, the benchmarks and the library entry points call the
//! coordinator with, whatever the modality.

use std::fmt;
use std::time::Duration;

use anyhow::anyhow;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::Config;
use crate::session::retry::{with_retry, RetryPolicy};
use privmatch_api::{ErrorBody, ErrorCode};

/// Why a call to the coordinator failed.
#[derive(Debug)]
pub enum CallError {
    /// The coordinator could not be reached: nothing happened.
    Unreachable(String),
    /// The connection broke after the request was sent: the outcome is unknown.
    Broken(String),
    /// The coordinator answered an error.
    Api {
        /// HTTP status.
        status: u16,
        /// The error body.
        body: ErrorBody,
    },
    /// Preparing the request or reading the answer failed here.
    Local(String),
}

impl CallError {
    /// The coordinator's error code, if it answered one this build knows.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            CallError::Api { body, .. } => body.kind(),
            _ => None,
        }
    }

    /// A transient failure: a new session (freshly sealed probes) may succeed.
    pub fn is_transient(&self) -> bool {
        self.code().is_some_and(ErrorCode::is_transient)
    }

    /// The outcome of a write is unknown (in doubt at the parties, or the answer was lost).
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, CallError::Broken(_)) || self.code() == Some(ErrorCode::InDoubt)
    }

    /// The error after `attempts` attempts, saying how many were made when it was transient.
    pub fn after_attempts(self, attempts: u32) -> anyhow::Error {
        match self {
            CallError::Api { status, body } if body.is_transient() => anyhow!(
                "{} (HTTP {status}; gave up after {attempts} attempts)",
                body.error
            ),
            other => anyhow::Error::new(other),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Unreachable(e) => write!(
                f,
                "cannot reach the coordinator (is `privmatch cluster up` running?): {e}"
            ),
            CallError::Broken(e) => write!(
                f,
                "the connection to the coordinator broke before it answered: {e}"
            ),
            CallError::Api { status, body } => write!(f, "{} (HTTP {status})", body.error),
            CallError::Local(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for CallError {}

/// A client of the coordinator's HTTP API.
#[derive(Clone)]
pub struct Coordinator {
    http: reqwest::Client,
    base: String,
    retry: RetryPolicy,
}

impl Coordinator {
    /// A client of the coordinator of `config`, retrying transient failures on the default
    /// back-off schedule.
    ///
    /// Every call carries the configuration's API credential (`api_token`) as a bearer token.
    pub fn new(config: &Config) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &config.api_token {
            // A token with bytes a header cannot carry is sent as none: the coordinator then
            // answers 401, which names the problem.
            if let Ok(mut value) =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            {
                value.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, value);
            }
        }
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .tls_built_in_root_certs(false);
        // The CA was checked when the configuration was loaded (`Config::check_transport`);
        // one that cannot be read now is left out, and the TLS handshake then fails naming
        // the unknown issuer.
        if let Some(ca) = config
            .ca_cert
            .as_deref()
            .and_then(|p| std::fs::read(p).ok())
        {
            if let Ok(cert) = reqwest::Certificate::from_pem(&ca) {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().unwrap_or_else(|_| reqwest::Client::new());
        Coordinator {
            http,
            base: config.coordinator_url(),
            retry: RetryPolicy::default(),
        }
    }

    /// POSTs a JSON body and decodes the JSON answer.
    pub async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CallError> {
        self.send(self.http.post(self.url(path)).json(body)).await
    }

    /// POSTs raw bytes (`application/octet-stream`) and decodes the JSON answer.
    pub async fn post_bytes<T: DeserializeOwned>(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<T, CallError> {
        let request = self
            .http
            .post(self.url(path))
            .header("content-type", "application/octet-stream")
            .body(body);
        self.send(request).await
    }

    /// GETs and decodes the JSON answer.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CallError> {
        self.send(self.http.get(self.url(path))).await
    }

    /// Whether the coordinator answers `GET /v1/health` within `timeout`.
    pub async fn is_healthy(&self, timeout: Duration) -> bool {
        let request = self.http.get(self.url("/v1/health")).timeout(timeout);
        request
            .send()
            .await
            .is_ok_and(|response| response.status().is_success())
    }

    /// POSTs a body built afresh for every attempt (a fresh session id, freshly sealed
    /// probes) and retries transient failures on the back-off schedule: the last result and
    /// the number of attempts.
    pub async fn post_retrying<B, T>(
        &self,
        path: &str,
        mut body: impl FnMut() -> Result<B, CallError>,
    ) -> (Result<T, CallError>, u32)
    where
        B: Serialize,
        T: DeserializeOwned,
    {
        with_retry(&self.retry, CallError::is_transient, || {
            let body = body();
            async move { self.post(path, &body?).await }
        })
        .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, CallError> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_connect() || e.is_builder() => {
                return Err(CallError::Unreachable(e.to_string()))
            }
            Err(e) => return Err(CallError::Broken(e.to_string())),
        };
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Broken(e.to_string()))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                CallError::Local(format!("unreadable answer from the coordinator: {e}"))
            });
        }
        let body = serde_json::from_slice::<ErrorBody>(&bytes).unwrap_or_else(|_| ErrorBody {
            error: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
            ..ErrorBody::default()
        });
        Err(CallError::Api {
            status: status.as_u16(),
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: ErrorCode) -> CallError {
        CallError::Api {
            status: 503,
            body: ErrorBody::new(code, "e".into()),
        }
    }

    #[test]
    fn transient_errors_are_retried_and_in_doubt_writes_unknown() {
        assert!(api(ErrorCode::TemplateSetsDiffer).is_transient());
        assert!(api(ErrorCode::KeyClaimConflict).is_transient());
        assert!(!api(ErrorCode::NotConfigured).is_transient());
        assert!(api(ErrorCode::InDoubt).outcome_unknown());
        assert!(CallError::Broken("x".into()).outcome_unknown());
        assert!(!CallError::Unreachable("x".into()).outcome_unknown());
        let message = api(ErrorCode::TemplateSetsDiffer)
            .after_attempts(7)
            .to_string();
        assert_eq!(message, "e (HTTP 503; gave up after 7 attempts)");
        let message = api(ErrorCode::NotConfigured).after_attempts(1).to_string();
        assert_eq!(message, "e (HTTP 503)");
        let message = CallError::Unreachable("refused".into()).to_string();
        assert!(message.contains("privmatch cluster up") && message.ends_with("refused"));
    }
}
