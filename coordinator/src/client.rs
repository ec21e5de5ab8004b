//! The client side of the CLI: shares and seals templates to the pinned party keys, sends
//! sealed batches to the coordinator, and reports results.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::iris::enroll::{seal_iris_enrollment_batch, EnrollRequest};
use privmatch_core::wire::envelope::encode_enroll_batch;
use rand::SeedableRng;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::input::{for_each_record, validate_file, EnrollRecord};
use crate::server::EnrollResponse;

/// Options of `privmatch iris enroll`.
#[derive(Args, Clone, Debug)]
pub struct EnrollArgs {
    /// NDJSON input file.
    #[arg(long)]
    pub input: PathBuf,
    /// Records per distributed transaction.
    #[arg(long, default_value_t = 250)]
    pub batch_size: usize,
    /// What to do with a subject+eye that is already enrolled: `skip` (re-running an input is
    /// idempotent) or `error` (abort that batch, nothing written).
    #[arg(long, default_value = "skip", value_parser = ["skip", "error"])]
    pub on_duplicate: String,
    /// Batches in flight at once (each is its own atomic transaction).
    #[arg(long, default_value_t = 2)]
    pub parallel: usize,
    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Enrol each record only if its template matches no enrolled one (uniqueness search with
    /// ±15 rotations inside the record's own distributed transaction, with the template table
    /// locked against concurrent enrolments). One record per transaction: --batch-size and
    /// --parallel do not apply.
    #[arg(long)]
    pub if_unique: bool,
    /// With --if-unique: the match threshold (fractional Hamming distance ratio).
    #[arg(long, default_value_t = crate::search::DEFAULT_THRESHOLD, requires = "if_unique")]
    pub threshold: f64,
}

/// Totals of an enrolment run.
#[derive(Debug, Default, Clone, Copy)]
pub struct EnrollTotals {
    /// Newly enrolled.
    pub enrolled: usize,
    /// Already present, skipped.
    pub skipped: usize,
}

/// A batch the coordinator may have committed: the connection broke after the request was
/// sent, or the coordinator answered that the outcome is in doubt. Recovery settles it (at all
/// three parties or at none); the client cannot tell which.
#[derive(Debug)]
struct OutcomeUnknown(String);

impl std::fmt::Display for OutcomeUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutcomeUnknown {}

/// Sends one framed batch; returns the coordinator's answer or its error message
/// ([`OutcomeUnknown`] when the batch may have been committed).
async fn post_batch(http: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<EnrollResponse> {
    let response = match http
        .post(url)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
    {
        Ok(response) => response,
        Err(e) if e.is_connect() => {
            return Err(anyhow::Error::new(e)
                .context("cannot reach the coordinator (is `privmatch cluster up` running?)"))
        }
        Err(e) => {
            return Err(OutcomeUnknown(format!(
                "the connection to the coordinator broke before it answered: {e}"
            ))
            .into())
        }
    };
    let status = response.status();
    if status.is_success() {
        return response
            .json()
            .await
            .context("unreadable answer from the coordinator");
    }
    let text = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        .unwrap_or(text);
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        return Err(OutcomeUnknown(message).into());
    }
    bail!("{message}")
}

struct SealedBatch {
    first_line: usize,
    last_line: usize,
    records: usize,
    body: Vec<u8>,
}

/// Shares and seals one batch: one envelope per party, framed for the coordinator.
fn seal_batch(
    pending: &[EnrollRecord],
    keys: &[PartyPublicKey; 3],
    rng: &mut rand_chacha::ChaCha20Rng,
) -> Result<SealedBatch> {
    let requests: Vec<EnrollRequest<'_>> = pending
        .iter()
        .map(|r| EnrollRequest {
            template: &r.template,
            subject: &r.subject,
            eye: r.eye,
        })
        .collect();
    let first_line = pending.first().map_or(0, |r| r.line);
    let last_line = pending.last().map_or(0, |r| r.line);
    let (envelopes, _) = seal_iris_enrollment_batch(&requests, keys, rng)
        .with_context(|| format!("sealing lines {first_line}..={last_line}"))?;
    Ok(SealedBatch {
        first_line,
        last_line,
        records: pending.len(),
        body: encode_enroll_batch(&[envelopes]),
    })
}

/// Reads, shares and seals the file on a blocking thread, one batch at a time.
fn spawn_sealer(
    input: PathBuf,
    keys: [PartyPublicKey; 3],
    batch_size: usize,
    tx: mpsc::Sender<Result<SealedBatch>>,
) {
    std::thread::spawn(move || {
        // A ChaCha20 CSPRNG seeded from the OS: drawing every share coefficient from the OS
        // directly would cost a system call per draw.
        let mut rng = rand_chacha::ChaCha20Rng::from_rng(rand::rngs::OsRng)
            .expect("the operating system's random source is available");
        let mut pending: Vec<EnrollRecord> = Vec::with_capacity(batch_size);
        let send = |pending: &mut Vec<EnrollRecord>, rng: &mut rand_chacha::ChaCha20Rng| {
            let batch = seal_batch(pending, &keys, rng)?;
            pending.clear();
            if tx.blocking_send(Ok(batch)).is_err() {
                bail!("the sender stopped");
            }
            Ok(())
        };
        let outcome = for_each_record(&input, |record| {
            pending.push(record);
            if pending.len() == batch_size {
                send(&mut pending, &mut rng)?;
            }
            Ok(())
        })
        .and_then(|()| {
            if pending.is_empty() {
                Ok(())
            } else {
                send(&mut pending, &mut rng)
            }
        });
        if let Err(e) = outcome {
            let _ = tx.blocking_send(Err(e));
        }
    });
}

/// A progress bar over `total` records labelled `what` (hidden when asked, e.g. in tests).
pub(crate) fn progress_bar(total: usize, hidden: bool, what: &str) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{spinner}} {what} [{{bar:40}}] {{pos}}/{{len}} records ({{per_sec}}, eta {{eta}})"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Enrols a whole file. Validates every line first (nothing is sent if any line is bad),
/// then seals and sends batches; each batch is atomic across the parties. On an error, the
/// batches before it are enrolled and the message says from which line to resume (re-running
/// with the default `--on-duplicate skip` is safe).
pub async fn enroll_file(config: &Config, args: &EnrollArgs) -> Result<(EnrollTotals, usize)> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let total = validate_file(&args.input)?;
    let keys = config.pinned_keys()?;
    let http = reqwest::Client::new();
    let url = format!(
        "{}/v1/iris/enroll?on_duplicate={}",
        config.coordinator_url(),
        args.on_duplicate
    );
    let (tx, mut rx) = mpsc::channel(2);
    spawn_sealer(args.input.clone(), keys, args.batch_size, tx);
    let bar = progress_bar(total, args.no_progress, "enrolling");
    let mut totals = EnrollTotals::default();
    // Keep a few batches in flight while the next ones are sealed; answers are accounted in
    // order, so an error reports exactly which lines are enrolled.
    let mut in_flight: VecDeque<(SealedBatch, tokio::task::JoinHandle<Result<EnrollResponse>>)> =
        VecDeque::new();
    while let Some(next) = rx.recv().await {
        let mut batch = next?;
        let body = std::mem::take(&mut batch.body);
        let (http, url) = (http.clone(), url.clone());
        let handle = tokio::spawn(async move { post_batch(&http, &url, body).await });
        in_flight.push_back((batch, handle));
        if in_flight.len() >= args.parallel.max(1) {
            if let Some((batch, handle)) = in_flight.pop_front() {
                let answer = handle.await.context("sender task failed")?;
                account(&batch, answer, &mut totals, &bar)?;
            }
        }
    }
    while let Some((batch, handle)) = in_flight.pop_front() {
        let answer = handle.await.context("sender task failed")?;
        account(&batch, answer, &mut totals, &bar)?;
    }
    bar.finish_and_clear();
    Ok((totals, total))
}

fn account(
    batch: &SealedBatch,
    answer: Result<EnrollResponse>,
    totals: &mut EnrollTotals,
    bar: &ProgressBar,
) -> Result<()> {
    let done = totals.enrolled + totals.skipped;
    let response = match answer {
        Ok(response) => response,
        Err(err) if err.downcast_ref::<OutcomeUnknown>().is_some() => bail!(
            "batch of lines {}..={} is in doubt ({err:#}): recovery enrols it at all three parties or at none; {done} records before it were enrolled; re-run from line {} with --on-duplicate skip to finish",
            batch.first_line,
            batch.last_line,
            batch.first_line
        ),
        Err(err) => {
            return Err(err.context(format!(
                "batch of lines {}..={} was not enrolled (nothing of it was written; {done} records before it were enrolled; resume from line {})",
                batch.first_line, batch.last_line, batch.first_line
            )))
        }
    };
    if response.results.len() != batch.records {
        bail!(
            "the coordinator answered {} results for a batch of {} records",
            response.results.len(),
            batch.records
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
    bar.inc(batch.records as u64);
    Ok(())
}

/// `privmatch iris enroll`.
pub async fn enroll(config: &Config, args: &EnrollArgs) -> Result<()> {
    if args.if_unique {
        return crate::search_client::enroll_if_unique(config, args).await;
    }
    let started = Instant::now();
    let (totals, total) = enroll_file(config, args).await?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "enrolled {} records, {} already enrolled (skipped), {} lines, in {:.2} s ({:.0} records/s)",
        totals.enrolled,
        totals.skipped,
        total,
        seconds,
        total as f64 / seconds.max(1e-9)
    );
    Ok(())
}

async fn post_json(
    config: &Config,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value> {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", config.coordinator_url()))
        .json(&body)
        .send()
        .await
        .context("cannot reach the coordinator (is `privmatch cluster up` running?)")?;
    let ok = response.status().is_success();
    let value: serde_json::Value = response
        .json()
        .await
        .context("unreadable answer from the coordinator")?;
    if !ok {
        bail!(
            "{}",
            value
                .get("error")
                .and_then(|e| e.as_str())
                .unwrap_or("coordinator error")
        );
    }
    Ok(value)
}

/// `privmatch iris delete`.
pub async fn delete(config: &Config, subject: &str, eye: Option<&str>) -> Result<()> {
    let answer = post_json(
        config,
        "/v1/iris/delete",
        serde_json::json!({ "subject": subject, "eye": eye }),
    )
    .await?;
    println!(
        "deleted {} record(s) of subject {subject:?} at all three parties",
        answer.get("deleted").and_then(|d| d.as_i64()).unwrap_or(0)
    );
    Ok(())
}

/// `privmatch recover`.
pub async fn recover(config: &Config) -> Result<()> {
    let answer = post_json(config, "/v1/recover", serde_json::json!({})).await?;
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}
