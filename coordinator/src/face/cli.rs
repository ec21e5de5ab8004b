//! `privmatch face …`: configure the dealer and show its state, enroll, delete, verify,
//! identify, seal, synth. Parsing and printing; the calls to the coordinator are
//! [`crate::face::client`]'s. Verify and identify print one NDJSON line per probe.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use privmatch_core::face::Metric;
use serde::Serialize;

use crate::cli::ndjson::{emit, json_line};
use crate::cli::operator_key;
use crate::config::Config;
use crate::face::client::{configure, dealer, delete, enroll_file, FaceClient};
use crate::face::input::{read_probe_file, EmbeddingOptions};
use crate::face::synth::FaceSynthArgs;

/// `privmatch face …`.
#[derive(Subcommand, Clone, Debug)]
pub enum FaceAction {
    /// Configure the dealer (P2): metric, threshold and embedding dimension. The configuration
    /// is sealed here to P2's pinned key: the threshold never passes the coordinator in the
    /// clear. Every later session's keys are dealt under the new configuration.
    Configure(ConfigureArgs),
    /// The dealer's public configuration: metric, dimension, generation (JSON; never the
    /// threshold).
    Dealer,
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
    /// Quantise, share and seal enrolments or probes for the SQL front door
    /// (privmatch.face_enroll, face_verify, face_identify) without sending them:
    /// `<subject>\t<sealed>` per record.
    Seal(crate::face::seal::FaceSealArgs),
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
    /// P2's operator signing key, which P2 requires on every dealer configuration (default:
    /// HOME/operators/p2.signing.key, written by `privmatch cluster up`).
    #[arg(long, env = "PRIVMATCH_OPERATOR_KEY")]
    pub operator_key: Option<PathBuf>,
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

/// Runs `privmatch face …`; `config` loads the configuration (not needed by `synth`); `home`
/// is the privmatch home directory (where a local cluster keeps its operators' keys).
pub async fn run(
    action: &FaceAction,
    home: &Path,
    config: impl FnOnce() -> Result<Config>,
) -> Result<()> {
    if let FaceAction::Synth(args) = action {
        return crate::face::synth::run(args);
    }
    let config = config()?;
    match action {
        FaceAction::Configure(args) => {
            let metric = Metric::parse(&args.metric).map_err(|e| anyhow!("--metric: {e}"))?;
            let key_path = args
                .operator_key
                .clone()
                .unwrap_or_else(|| home.join("operators").join("p2.signing.key"));
            let operator = operator_key::load(&key_path)?;
            let status = configure(&config, metric, args.threshold, args.dim, &operator).await?;
            println!(
                "{}",
                serde_json::json!({
                    "metric": status.metric,
                    "dim": status.dim,
                    "generation": status.generation,
                })
            );
        }
        FaceAction::Dealer => {
            println!("{}", serde_json::to_string_pretty(&dealer(&config).await?)?);
        }
        FaceAction::Enroll(args) => {
            let started = Instant::now();
            let options = EmbeddingOptions {
                normalize: args.normalize,
            };
            let totals = enroll_file(
                &config,
                &args.input,
                options,
                &args.on_duplicate,
                args.batch_size,
                !args.no_progress,
            )
            .await?;
            let seconds = started.elapsed().as_secs_f64();
            let total = totals.done();
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
            compare(&config, Some(&args.subject), &args.input, args.normalize).await?;
        }
        FaceAction::Identify(args) => {
            compare(&config, None, &args.input, args.normalize).await?;
        }
        FaceAction::Seal(args) => crate::face::seal::run(&config, args)?,
        FaceAction::Synth(_) => {}
    }
    Ok(())
}

/// `privmatch face verify` (against `subject`) or `identify` (None): one NDJSON line per
/// probe of `input`, in order; stops early when the reader went away (no more keys are spent).
async fn compare(
    config: &Config,
    subject: Option<&str>,
    input: &Path,
    normalize: bool,
) -> Result<()> {
    if let Some(subject) = subject {
        privmatch_core::wire::envelope::validate_subject(subject)
            .map_err(|e| anyhow!("--subject: {e}"))?;
    }
    let probes = read_probe_file(input, EmbeddingOptions { normalize })?;
    let mut client = FaceClient::new(config)?;
    if let Some(first) = probes.first() {
        client
            .check_dim(first.embedding.len(), "the probes")
            .await?;
    }
    let [doing, done] = match subject {
        Some(_) => ["verifying", "verified"],
        None => ["identifying", "identified"],
    };
    let started = Instant::now();
    for probe in &probes {
        let line = match subject {
            Some(subject) => client
                .verify_quantized(subject, &probe.embedding)
                .await
                .map(|matched| verify_line(probe.index, subject, matched)),
            None => client
                .identify_quantized(&probe.embedding)
                .await
                .map(|(matches, _)| identify_line(probe.index, &matches)),
        };
        let line = line.with_context(|| format!("{doing} the probe of line {}", probe.line))?;
        if !emit(&line)? {
            return Ok(());
        }
    }
    eprintln!(
        "{done} {} probe(s) in {:.2} s",
        probes.len(),
        started.elapsed().as_secs_f64()
    );
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
}
