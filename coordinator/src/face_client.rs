//! The client side of the face modality (`privmatch face …`) and its library API.
//!
//! Embeddings are read and quantised here ([`crate::face_input`]), additively shared and
//! sealed to the pinned keys of P0 and P1 (the dealer configuration to P2's), and sent to the
//! coordinator's HTTP API ([`crate::face_api`]); the coordinator only relays ciphertext. Each
//! verification or identification is one session with a fresh id; when the parties answer a
//! transient error (template sets differ for a moment, a key claim conflict) the probe is
//! re-sealed for a new session and retried with back-off ([`crate::search::with_retry`]).
//!
//! Library entry points (used by the end-to-end tests): [`configure`], [`pool`], [`refill`],
//! [`enroll_file`], [`delete`], [`verify`], [`identify`], and [`FaceClient`] for repeated calls
//! on quantised embeddings.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::face::dealer::{seal_dealer_config, DealerConfig};
use privmatch_core::face::enroll::{seal_face_enrollment, FaceEnrollRequest};
use privmatch_core::face::probe::seal_face_probe;
use privmatch_core::face::quantize::Quantizer;
use privmatch_core::face::Metric;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::{codes, session_to_hex, to_base64, ErrorBody};
use crate::config::Config;
use crate::face_api::{
    DealerStatus, FaceConfigureBody, FaceDeleteBody, FaceEnrollBody, FaceEnrollResponse,
    FaceIdentifyBody, FaceIdentifyResponse, FacePoolResponse, FaceRefillBody, FaceRefillResponse,
    FaceVerifyBody, FaceVerifyResponse, DEFAULT_REFILL_BATCH, DEFAULT_REFILL_TARGET,
    MAX_REFILL_BATCH,
};
use crate::face_input::{
    read_enroll_file, read_probe_file, EmbeddingOptions, FaceEnrollRecord, FaceProbeRecord,
};
use crate::face_synth::FaceSynthArgs;
use crate::search::{new_session_id, with_retry, RetryPolicy};

/// `privmatch face …`.
#[derive(Subcommand, Clone, Debug)]
pub enum FaceAction {
    /// Configure the dealer (P2): metric, threshold and embedding dimension. The configuration
    /// is sealed here to P2's pinned key: the threshold never passes the coordinator in the
    /// clear. Keys dealt under an earlier configuration are no longer used (refill after this).
    Configure(ConfigureArgs),
    /// Top up the evaluators' single-use key pools to a level (one key per comparison).
    Refill(RefillArgs),
    /// The dealer's configuration and the key pools of P0 and P1 (JSON).
    Pool,
    /// Enrol face templates from NDJSON: {"subject": "...", "embedding": [floats]} per line.
    /// Shares are sealed here, to P0 and P1; each batch is atomic across the parties.
    Enroll(FaceEnrollArgs),
    /// Delete a subject's face template at P0 and P1, atomically.
    Delete {
        /// Subject id.
        #[arg(long)]
        subject: String,
    },
    /// 1:1 verification: does each probe match the subject's enrolled template? Prints
    /// {"probe": i, "subject": "...", "match": true|false} per probe.
    Verify(VerifyArgs),
    /// 1:N identification: which enrolled subjects does each probe match? Prints
    /// {"probe": i, "matches": [...]} per probe.
    Identify(IdentifyArgs),
    /// Write synthetic embeddings (enrolment file and noisy re-captures as probes).
    Synth(FaceSynthArgs),
}

/// Options of `privmatch face configure`.
#[derive(Args, Clone, Debug)]
pub struct ConfigureArgs {
    /// `cosine` (match when ⟨x, y⟩ ≥ T on normalised embeddings) or `euclidean` (match when
    /// ‖x − y‖² ≤ T).
    #[arg(long, value_parser = ["cosine", "euclidean"])]
    pub metric: String,
    /// The threshold T, in the metric's units (cosine: −1..1; squared Euclidean: 0..4·dim).
    #[arg(long, allow_hyphen_values = true)]
    pub threshold: f64,
    /// Embedding dimension (128..=1024).
    #[arg(long)]
    pub dim: usize,
}

/// Options of `privmatch face refill`.
#[derive(Args, Clone, Debug)]
pub struct RefillArgs {
    /// The pool level to reach (keys held by both P0 and P1).
    #[arg(long, default_value_t = DEFAULT_REFILL_TARGET)]
    pub target: i64,
    /// Keys per dealer batch (1..=50,000); each batch is stored atomically at P0 and P1.
    #[arg(long, default_value_t = DEFAULT_REFILL_BATCH)]
    pub batch_size: i32,
}

/// Options of `privmatch face enroll`.
#[derive(Args, Clone, Debug)]
pub struct FaceEnrollArgs {
    /// NDJSON input file.
    #[arg(long)]
    pub input: PathBuf,
    /// L2-normalise each embedding before quantising it (for the cosine metric).
    #[arg(long)]
    pub normalize: bool,
    /// What to do with a subject that is already enrolled: `skip` (re-running an input is
    /// idempotent) or `error` (abort that batch, nothing written).
    #[arg(long, default_value = "skip", value_parser = ["skip", "error"])]
    pub on_duplicate: String,
    /// Records per distributed transaction.
    #[arg(long, default_value_t = 250)]
    pub batch_size: usize,
    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Options of `privmatch face verify`.
#[derive(Args, Clone, Debug)]
pub struct VerifyArgs {
    /// The subject claimed.
    #[arg(long)]
    pub subject: String,
    /// NDJSON probes: {"embedding": [floats]} per line (a "subject" key is ignored).
    #[arg(long)]
    pub input: PathBuf,
    /// L2-normalise each embedding before quantising it.
    #[arg(long)]
    pub normalize: bool,
}

/// Options of `privmatch face identify`.
#[derive(Args, Clone, Debug)]
pub struct IdentifyArgs {
    /// NDJSON probes: {"embedding": [floats]} per line (a "subject" key is ignored).
    #[arg(long)]
    pub input: PathBuf,
    /// L2-normalise each embedding before quantising it.
    #[arg(long)]
    pub normalize: bool,
}

/// Why a call to the coordinator failed.
#[derive(Debug)]
pub enum FaceCallError {
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

impl FaceCallError {
    /// The coordinator's error code, if it answered one.
    pub fn code(&self) -> Option<&str> {
        match self {
            FaceCallError::Api { body, .. } => body.code.as_deref(),
            _ => None,
        }
    }

    /// A new session (freshly sealed probe) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.code(),
            Some(codes::SETS_DIFFER) | Some(codes::KEY_CONFLICT)
        )
    }

    /// The outcome of a write is unknown (in doubt at the parties, or the answer was lost).
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, FaceCallError::Broken(_)) || self.code() == Some(codes::IN_DOUBT)
    }
}

impl std::fmt::Display for FaceCallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaceCallError::Unreachable(e) => write!(
                f,
                "cannot reach the coordinator (is `privmatch cluster up` running?): {e}"
            ),
            FaceCallError::Broken(e) => {
                write!(
                    f,
                    "the connection to the coordinator broke before it answered: {e}"
                )
            }
            FaceCallError::Api { status, body } => write!(f, "{} (HTTP {status})", body.error),
            FaceCallError::Local(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for FaceCallError {}

/// A session of calls to the coordinator's face API, with the pinned keys and a CSPRNG for
/// sharing.
pub struct FaceClient {
    http: reqwest::Client,
    base: String,
    keys: [PartyPublicKey; 3],
    rng: ChaCha20Rng,
    retry: RetryPolicy,
}

/// Totals of an enrolment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaceEnrollTotals {
    /// Newly enrolled.
    pub enrolled: usize,
    /// Already enrolled, skipped.
    pub skipped: usize,
}

/// What a refill did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RefillSummary {
    /// The dealer's configuration generation the keys belong to.
    pub generation: i64,
    /// The level asked for.
    pub target: i64,
    /// The pool level before.
    pub before: i64,
    /// The pool level after.
    pub after: i64,
    /// Batches stored.
    pub batches: u32,
    /// Keys stored at each evaluator.
    pub keys: i64,
}

impl FaceClient {
    /// A client for the coordinator and the pinned keys of `config`.
    pub fn new(config: &Config) -> Result<Self> {
        Ok(FaceClient {
            http: reqwest::Client::new(),
            base: config.coordinator_url(),
            keys: config.pinned_keys()?,
            rng: ChaCha20Rng::from_rng(rand::rngs::OsRng)
                .context("the operating system's random source is unavailable")?,
            retry: RetryPolicy::default(),
        })
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, FaceCallError> {
        send(&self.http, &self.base, path, body).await
    }

    /// Seals the dealer configuration to P2 and sends it; returns the dealer's public state.
    pub async fn configure(
        &mut self,
        metric: Metric,
        threshold: f64,
        dim: usize,
    ) -> Result<DealerStatus> {
        let sealed = seal_dealer_config(
            &DealerConfig {
                metric,
                dim,
                threshold,
            },
            &self.keys[2],
            &mut self.rng,
        )
        .map_err(|e| anyhow!("{e}"))?;
        let body = FaceConfigureBody {
            config: to_base64(&sealed),
        };
        Ok(self.call("/v1/face/configure", Some(&body)).await?)
    }

    /// The dealer's state and the pools of P0 and P1.
    pub async fn pool(&self) -> Result<FacePoolResponse> {
        Ok(self.call::<(), _>("/v1/face/pool", None).await?)
    }

    /// One refill request (at most `max_batches` batches when given).
    pub async fn refill_step(
        &self,
        target: i64,
        batch_size: i32,
        max_batches: Option<u32>,
    ) -> Result<FaceRefillResponse> {
        let body = FaceRefillBody {
            target,
            batch_size,
            max_batches,
        };
        body.validate().map_err(|e| anyhow!(e))?;
        Ok(self.call("/v1/face/refill", Some(&body)).await?)
    }

    /// Refills the pools to `target`, one batch per request, reporting progress on stderr
    /// when `progress`.
    pub async fn refill(
        &self,
        target: i64,
        batch_size: i32,
        progress: bool,
    ) -> Result<RefillSummary> {
        let first = self.refill_step(target, batch_size, Some(1)).await?;
        let before = first.before;
        let missing = (target - before).max(0);
        // Enough requests for the missing keys, with room for concurrent consumption.
        let budget = 2 * (missing / i64::from(batch_size.max(1))) + 4;
        let mut summary = RefillSummary {
            generation: first.dealer.generation,
            target,
            before,
            after: first.after,
            batches: first.batches,
            keys: first.keys,
        };
        let report = |s: &RefillSummary| {
            if progress && s.batches > 0 {
                eprintln!(
                    "refill: pool level {} / {} after {} batch(es), {} keys stored (generation {})",
                    s.after, s.target, s.batches, s.keys, s.generation
                );
            }
        };
        report(&summary);
        let mut last = first;
        let mut requests = 1;
        while !last.reached && last.batches > 0 && requests < budget {
            last = self.refill_step(target, batch_size, Some(1)).await?;
            requests += 1;
            if last.dealer.generation != summary.generation {
                bail!(
                    "the dealer was reconfigured during the refill (generation {} → {}); run the refill again",
                    summary.generation,
                    last.dealer.generation
                );
            }
            summary.after = last.after;
            summary.batches += last.batches;
            summary.keys += last.keys;
            report(&summary);
            for pending in &last.pending_recovery {
                eprintln!("warning: key batch committed; recovery will complete it at {pending}");
            }
        }
        if summary.after < target {
            bail!(
                "the pool level is {} after storing {} keys, below the target {target} (sessions consumed keys meanwhile?); run the refill again",
                summary.after,
                summary.keys
            );
        }
        Ok(summary)
    }

    /// The embedding dimension the dealer is configured for, if it can be asked.
    pub async fn dealer_dim(&self) -> Option<usize> {
        let pool = self.pool().await.ok()?;
        pool.dealer.and_then(|d| usize::try_from(d.dim).ok())
    }

    async fn check_dim(&self, dim: usize, what: &str) -> Result<()> {
        if let Some(configured) = self.dealer_dim().await {
            if configured != dim {
                bail!(
                    "the face dealer is configured for dimension {configured}, but {what} have dimension {dim}"
                );
            }
        }
        Ok(())
    }

    /// Enrols quantised records in batches of `batch_size` (each atomic across the parties).
    /// On an error, the batches before it are enrolled and the message says from which line
    /// to resume.
    pub async fn enroll(
        &mut self,
        records: &[FaceEnrollRecord],
        on_duplicate: &str,
        batch_size: usize,
        progress: bool,
    ) -> Result<FaceEnrollTotals> {
        if batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        if on_duplicate != "skip" && on_duplicate != "error" {
            bail!("--on-duplicate must be skip or error");
        }
        if let Some(first) = records.first() {
            self.check_dim(first.embedding.len(), "the embeddings to enrol")
                .await?;
        }
        let bar = crate::client::progress_bar(records.len(), !progress, "enrolling faces");
        let mut totals = FaceEnrollTotals::default();
        for batch in records.chunks(batch_size) {
            let (first_line, last_line) = (
                batch.first().map_or(0, |r| r.line),
                batch.last().map_or(0, |r| r.line),
            );
            let requests: Vec<FaceEnrollRequest<'_>> = batch
                .iter()
                .map(|r| FaceEnrollRequest {
                    subject: &r.subject,
                    embedding: &r.embedding,
                })
                .collect();
            let ([e0, e1], _) = seal_face_enrollment(&requests, &self.keys, &mut self.rng)
                .map_err(|e| anyhow!("sealing lines {first_line}..={last_line}: {e}"))?;
            let body = FaceEnrollBody {
                on_duplicate: on_duplicate.to_owned(),
                envelopes: [to_base64(&e0), to_base64(&e1)],
            };
            let done = totals.enrolled + totals.skipped;
            let response: FaceEnrollResponse = match self.call("/v1/face/enroll", Some(&body)).await
            {
                Ok(r) => r,
                Err(e) if e.outcome_unknown() => {
                    bar.finish_and_clear();
                    bail!(
                        "batch of lines {first_line}..={last_line} is in doubt ({e}): recovery enrols it at P0 and P1 or at neither; {done} records before it were enrolled; re-run from line {first_line} with --on-duplicate skip to finish"
                    )
                }
                Err(e) => {
                    bar.finish_and_clear();
                    bail!(
                        "batch of lines {first_line}..={last_line} was not enrolled ({e}); nothing of it was written; {done} records before it were enrolled; resume from line {first_line}"
                    )
                }
            };
            if response.results.len() != batch.len() {
                bail!(
                    "the coordinator answered {} results for a batch of {} records",
                    response.results.len(),
                    batch.len()
                );
            }
            for result in &response.results {
                if result.enrolled {
                    totals.enrolled += 1;
                } else {
                    totals.skipped += 1;
                }
            }
            for pending in &response.pending_recovery {
                eprintln!("warning: batch committed; recovery will complete it at {pending}");
            }
            bar.inc(batch.len() as u64);
        }
        bar.finish_and_clear();
        Ok(totals)
    }

    /// Deletes a subject's face template; returns the number deleted (0 or 1).
    pub async fn delete(&self, subject: &str) -> Result<i64> {
        let body = FaceDeleteBody {
            subject: subject.to_owned(),
        };
        let answer: serde_json::Value = self.call("/v1/face/delete", Some(&body)).await?;
        for pending in answer
            .get("pending_recovery")
            .and_then(|p| p.as_array())
            .into_iter()
            .flatten()
        {
            eprintln!(
                "warning: deletion committed; recovery will complete it at {}",
                pending.as_str().unwrap_or_default()
            );
        }
        Ok(answer.get("deleted").and_then(|d| d.as_i64()).unwrap_or(0))
    }

    /// Seals `embedding` as a probe for a fresh session and its target (`Some(subject)`: a
    /// verification; `None`: an identification): (session hex, [P0, P1] base64).
    fn seal_probe(
        &mut self,
        embedding: &[i32],
        target: Option<&str>,
    ) -> Result<(String, [String; 2]), FaceCallError> {
        let session = new_session_id();
        let sealed = seal_face_probe(embedding, session, target, &self.keys, &mut self.rng)
            .map_err(|e| FaceCallError::Local(format!("sealing the probe: {e}")))?;
        Ok((session_to_hex(&session), sealed.map(|p| to_base64(&p))))
    }

    /// 1:1: does the quantised `embedding` match `subject`'s template?
    pub async fn verify_quantized(&mut self, subject: &str, embedding: &[i32]) -> Result<bool> {
        let retry = self.retry;
        let (result, attempts) = with_retry(&retry, FaceCallError::is_retryable, || {
            let sealed = self.seal_probe(embedding, Some(subject));
            let (http, base) = (self.http.clone(), self.base.clone());
            let subject = subject.to_owned();
            async move {
                let (session, probes) = sealed?;
                let body = FaceVerifyBody {
                    subject,
                    session,
                    probes,
                };
                send::<_, FaceVerifyResponse>(&http, &base, "/v1/face/verify", Some(&body)).await
            }
        })
        .await;
        match result {
            Ok(answer) => Ok(answer.matched),
            Err(e) => Err(retry_error(e, attempts)),
        }
    }

    /// 1:N: which enrolled subjects does the quantised `embedding` match (sorted)? Also
    /// returns the number of templates compared.
    pub async fn identify_quantized(&mut self, embedding: &[i32]) -> Result<(Vec<String>, i64)> {
        let retry = self.retry;
        let (result, attempts) = with_retry(&retry, FaceCallError::is_retryable, || {
            let sealed = self.seal_probe(embedding, None);
            let (http, base) = (self.http.clone(), self.base.clone());
            async move {
                let (session, probes) = sealed?;
                let body = FaceIdentifyBody { session, probes };
                send::<_, FaceIdentifyResponse>(&http, &base, "/v1/face/identify", Some(&body))
                    .await
            }
        })
        .await;
        match result {
            Ok(answer) => Ok((answer.matches, answer.comparisons)),
            Err(e) => Err(retry_error(e, attempts)),
        }
    }
}

/// Sends a request (POST with a JSON body, or GET without) and decodes the JSON answer.
async fn send<B: Serialize, T: DeserializeOwned>(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: Option<&B>,
) -> Result<T, FaceCallError> {
    let url = format!("{base}{path}");
    let request = match body {
        Some(body) => http.post(&url).json(body),
        None => http.get(&url),
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() || e.is_builder() => {
            return Err(FaceCallError::Unreachable(e.to_string()))
        }
        Err(e) => return Err(FaceCallError::Broken(e.to_string())),
    };
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| FaceCallError::Broken(e.to_string()))?;
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|e| {
            FaceCallError::Local(format!("unreadable answer from the coordinator: {e}"))
        });
    }
    let body = serde_json::from_slice::<ErrorBody>(&bytes).unwrap_or_else(|_| ErrorBody {
        error: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
        ..ErrorBody::default()
    });
    Err(FaceCallError::Api {
        status: status.as_u16(),
        body,
    })
}

/// The error after retries, saying how many attempts were made when it was transient.
fn retry_error(error: FaceCallError, attempts: u32) -> anyhow::Error {
    if error.is_retryable() {
        anyhow!("{error}; gave up after {attempts} attempts")
    } else {
        anyhow::Error::new(error)
    }
}

fn quantize_all(embeddings: &[Vec<f64>]) -> Result<Vec<Vec<i32>>> {
    let mut out = Vec::with_capacity(embeddings.len());
    for (i, embedding) in embeddings.iter().enumerate() {
        let quantizer =
            Quantizer::new(embedding.len()).map_err(|e| anyhow!("embedding {i}: {e}"))?;
        out.push(
            quantizer
                .quantize(embedding)
                .map_err(|e| anyhow!("embedding {i}: {e}"))?,
        );
    }
    Ok(out)
}

/// Configures the dealer (see [`FaceAction::Configure`]).
pub async fn configure(
    config: &Config,
    metric: Metric,
    threshold: f64,
    dim: usize,
) -> Result<DealerStatus> {
    FaceClient::new(config)?
        .configure(metric, threshold, dim)
        .await
}

/// The dealer's state and the pools of P0 and P1.
pub async fn pool(config: &Config) -> Result<FacePoolResponse> {
    FaceClient::new(config)?.pool().await
}

/// Refills the key pools to `target` in batches of `batch_size`.
pub async fn refill(
    config: &Config,
    target: i64,
    batch_size: i32,
    progress: bool,
) -> Result<RefillSummary> {
    if !(1..=MAX_REFILL_BATCH).contains(&batch_size) {
        bail!("--batch-size must be between 1 and {MAX_REFILL_BATCH}");
    }
    if target < 0 {
        bail!("--target must not be negative");
    }
    FaceClient::new(config)?
        .refill(target, batch_size, progress)
        .await
}

/// Enrols a whole NDJSON file (validated entirely before anything is sent).
pub async fn enroll_file(config: &Config, args: &FaceEnrollArgs) -> Result<FaceEnrollTotals> {
    let records = read_enroll_file(
        &args.input,
        EmbeddingOptions {
            normalize: args.normalize,
        },
    )?;
    FaceClient::new(config)?
        .enroll(
            &records,
            &args.on_duplicate,
            args.batch_size,
            !args.no_progress,
        )
        .await
}

/// Deletes a subject's face template at P0 and P1; returns the number deleted.
pub async fn delete(config: &Config, subject: &str) -> Result<i64> {
    FaceClient::new(config)?.delete(subject).await
}

/// 1:1 verification of each embedding (elements in [−1, 1]; normalise first for cosine) against
/// `subject`: one bit per embedding.
pub async fn verify(config: &Config, subject: &str, embeddings: &[Vec<f64>]) -> Result<Vec<bool>> {
    let quantized = quantize_all(embeddings)?;
    let mut client = FaceClient::new(config)?;
    let mut out = Vec::with_capacity(quantized.len());
    for (i, q) in quantized.iter().enumerate() {
        out.push(
            client
                .verify_quantized(subject, q)
                .await
                .with_context(|| format!("verifying embedding {i}"))?,
        );
    }
    Ok(out)
}

/// 1:N identification of each embedding (elements in [−1, 1]): the matching subjects, sorted,
/// per embedding.
pub async fn identify(config: &Config, embeddings: &[Vec<f64>]) -> Result<Vec<Vec<String>>> {
    let quantized = quantize_all(embeddings)?;
    let mut client = FaceClient::new(config)?;
    let mut out = Vec::with_capacity(quantized.len());
    for (i, q) in quantized.iter().enumerate() {
        out.push(
            client
                .identify_quantized(q)
                .await
                .with_context(|| format!("identifying embedding {i}"))?
                .0,
        );
    }
    Ok(out)
}

/// `{"probe": i, "subject": "...", "match": bool}`.
#[derive(Serialize)]
struct VerifyLine<'a> {
    probe: usize,
    subject: &'a str,
    #[serde(rename = "match")]
    matched: bool,
}

/// `{"probe": i, "matches": [...]}`.
#[derive(Serialize)]
struct IdentifyLine<'a> {
    probe: usize,
    matches: &'a [String],
}

fn json_line<T: Serialize>(line: &T) -> String {
    serde_json::to_string(line).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// One output line of `privmatch face verify`: `{"probe": i, "subject": "...", "match": b}`.
pub fn verify_line(probe: usize, subject: &str, matched: bool) -> String {
    json_line(&VerifyLine {
        probe,
        subject,
        matched,
    })
}

/// One output line of `privmatch face identify`: `{"probe": i, "matches": [...]}`.
pub fn identify_line(probe: usize, matches: &[String]) -> String {
    json_line(&IdentifyLine { probe, matches })
}

/// Writes one line on standard output; false when the reader went away (a closed pipe), so
/// the caller stops instead of spending more keys.
fn emit(line: &str) -> Result<bool> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(anyhow!("cannot write to standard output: {e}")),
    }
}

fn read_probes(path: &std::path::Path, normalize: bool) -> Result<Vec<FaceProbeRecord>> {
    read_probe_file(path, EmbeddingOptions { normalize })
}

/// Runs `privmatch face …`; `config` loads the configuration (not needed by `synth`).
pub async fn run(action: &FaceAction, config: impl FnOnce() -> Result<Config>) -> Result<()> {
    if let FaceAction::Synth(args) = action {
        return crate::face_synth::run(args);
    }
    let config = config()?;
    match action {
        FaceAction::Configure(args) => {
            let metric = Metric::parse(&args.metric).map_err(|e| anyhow!("--metric: {e}"))?;
            let status = configure(&config, metric, args.threshold, args.dim).await?;
            if let Some([p0, p1]) = status.retired_keys {
                eprintln!(
                    "retired the keys of earlier generations (P0: {p0}, P1: {p1}); run `privmatch face refill` before verifying"
                );
            }
            if let Some(warning) = &status.warning {
                eprintln!("warning: {warning}");
            }
            println!(
                "{}",
                serde_json::json!({
                    "metric": status.metric,
                    "dim": status.dim,
                    "generation": status.generation,
                })
            );
        }
        FaceAction::Refill(args) => {
            let summary = refill(&config, args.target, args.batch_size, true).await?;
            println!("{}", serde_json::to_string(&summary)?);
        }
        FaceAction::Pool => {
            println!("{}", serde_json::to_string_pretty(&pool(&config).await?)?);
        }
        FaceAction::Enroll(args) => {
            let started = Instant::now();
            let totals = enroll_file(&config, args).await?;
            let seconds = started.elapsed().as_secs_f64();
            let total = totals.enrolled + totals.skipped;
            println!(
                "enrolled {} face templates, {} already enrolled (skipped), {} lines, in {:.2} s ({:.0} records/s)",
                totals.enrolled,
                totals.skipped,
                total,
                seconds,
                total as f64 / seconds.max(1e-9)
            );
        }
        FaceAction::Delete { subject } => {
            let deleted = delete(&config, subject).await?;
            println!("deleted {deleted} face template(s) of subject {subject:?} at P0 and P1");
        }
        FaceAction::Verify(args) => {
            privmatch_core::wire::envelope::validate_subject(&args.subject)
                .map_err(|e| anyhow!("--subject: {e}"))?;
            let probes = read_probes(&args.input, args.normalize)?;
            let mut client = FaceClient::new(&config)?;
            if let Some(first) = probes.first() {
                client
                    .check_dim(first.embedding.len(), "the probes")
                    .await?;
            }
            let started = Instant::now();
            for probe in &probes {
                let matched = client
                    .verify_quantized(&args.subject, &probe.embedding)
                    .await
                    .with_context(|| format!("verifying the probe of line {}", probe.line))?;
                if !emit(&verify_line(probe.index, &args.subject, matched))? {
                    return Ok(());
                }
            }
            eprintln!(
                "verified {} probe(s) in {:.2} s",
                probes.len(),
                started.elapsed().as_secs_f64()
            );
        }
        FaceAction::Identify(args) => {
            let probes = read_probes(&args.input, args.normalize)?;
            let mut client = FaceClient::new(&config)?;
            if let Some(first) = probes.first() {
                client
                    .check_dim(first.embedding.len(), "the probes")
                    .await?;
            }
            let started = Instant::now();
            for probe in &probes {
                let (matches, _) = client
                    .identify_quantized(&probe.embedding)
                    .await
                    .with_context(|| format!("identifying the probe of line {}", probe.line))?;
                if !emit(&identify_line(probe.index, &matches))? {
                    return Ok(());
                }
            }
            eprintln!(
                "identified {} probe(s) in {:.2} s",
                probes.len(),
                started.elapsed().as_secs_f64()
            );
        }
        FaceAction::Synth(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lines_are_the_documented_json() {
        assert_eq!(
            verify_line(3, "alice", true),
            r#"{"probe":3,"subject":"alice","match":true}"#
        );
        assert_eq!(
            identify_line(0, &["a".to_owned(), "b".to_owned()]),
            r#"{"probe":0,"matches":["a","b"]}"#
        );
        assert_eq!(identify_line(1, &[]), r#"{"probe":1,"matches":[]}"#);
    }

    #[test]
    fn transient_errors_are_retryable_and_in_doubt_writes_unknown() {
        let api = |code: &str| FaceCallError::Api {
            status: 503,
            body: ErrorBody {
                error: "e".into(),
                code: Some(code.into()),
                ..ErrorBody::default()
            },
        };
        assert!(api(codes::SETS_DIFFER).is_retryable());
        assert!(api(codes::KEY_CONFLICT).is_retryable());
        assert!(!api(codes::POOL_EXHAUSTED).is_retryable());
        assert!(api(codes::IN_DOUBT).outcome_unknown());
        assert!(FaceCallError::Broken("x".into()).outcome_unknown());
        assert!(!FaceCallError::Unreachable("x".into()).outcome_unknown());
        let message = retry_error(api(codes::SETS_DIFFER), 7).to_string();
        assert!(message.contains("after 7 attempts"), "{message}");
    }

    #[test]
    fn float_embeddings_are_quantised_with_the_element_named() {
        let mut e = vec![0.0; 128];
        e[0] = 1.0;
        let q = quantize_all(std::slice::from_ref(&e)).expect("valid");
        assert_eq!(q[0][0], 1448);
        e[4] = 2.0;
        let err = quantize_all(&[vec![0.0; 128], e])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("embedding 1") && err.contains("element 4"),
            "{err}"
        );
    }
}
