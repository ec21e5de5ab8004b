//! `privmatch iris …`: enroll (in batches, or one record at a time `--if-unique`), search,
//! delete, synth. Parsing and printing; the calls to the coordinator are
//! [`crate::iris::client`]'s.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::cli::ndjson::json_line;
use crate::cli::progress::progress_bar;
use crate::config::Config;
use crate::iris::client::{enroll_file, BatchOptions, IfUniqueFailure, IrisClient};
use crate::iris::input::{
    for_each_record, read_probe_file, validate_file, EnrollRecord, ProbeRecord,
};
use crate::iris::synth::SynthArgs;
use privmatch_api::iris::eyes::{EyePolicy, Match};
use privmatch_api::iris::{
    check_policy, if_unique_params, search_params, EnrollIfUniqueOutcome, SearchResponse,
};

/// `privmatch iris …`.
#[derive(Subcommand, Clone, Debug)]
pub enum IrisAction {
    /// Enrol templates from an NDJSON file: one
    /// {"subject": "...", "eye": "left"|"right", "iris_codes": "<b64>", "mask_codes": "<b64>"}
    /// per line. Shares are sealed here, per party.
    Enroll(EnrollArgs),
    /// Search probes from an NDJSON file: per line one eye {"eye": "left"|"right",
    /// "iris_codes": "<b64>", "mask_codes": "<b64>"} or both eyes {"left": {...}, "right":
    /// {...}}. Probes are sealed here, per party and search session.
    Search(SearchArgs),
    /// Delete a subject's templates at all three parties, atomically.
    Delete {
        /// Subject id.
        #[arg(long)]
        subject: String,
        /// Only this eye (default: both).
        #[arg(long)]
        eye: Option<String>,
    },
    /// Share and seal enrolments or probes for the SQL front door (privmatch.iris_enroll,
    /// iris_identify, iris_is_unique) without sending them: `<subject>\t<sealed>` per record.
    Seal(crate::iris::seal::SealArgs),
    /// Write synthetic templates as enrolment NDJSON.
    Synth(SynthArgs),
    /// The iris match threshold: deployment policy held by each party, changed only by a
    /// command its operator signs.
    #[command(subcommand)]
    Policy(crate::iris::policy::PolicyAction),
    /// List the enrolled entries whose copies diverge between the parties (deleted at one
    /// party only, or stored there under another enrolment), naming the party that differs
    /// from the other two; with --quarantine delete them at all three parties.
    Audit(crate::iris::audit::AuditArgs),
}

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
}

/// Options of `privmatch iris search`.
#[derive(Args, Clone, Debug)]
pub struct SearchArgs {
    /// NDJSON probe file: per line one eye {"eye": "left"|"right", "iris_codes": "<b64>",
    /// "mask_codes": "<b64>"} (eye defaults to left) or both eyes {"left": {...}, "right": {...}}.
    #[arg(long)]
    pub input: PathBuf,
    /// Only ask whether each probe matches any enrolled template (one bit per eye) instead of
    /// which subjects it matches.
    #[arg(long)]
    pub uniqueness: bool,
    /// Print exactly one JSON object per probe on standard output.
    #[arg(long)]
    pub json: bool,
    /// How the two eyes of a probe combine: `or` (identify: union of the matches; uniqueness:
    /// unique only if neither eye matches) or `and` (identify: only subjects matched on both
    /// eyes; not supported with --uniqueness).
    #[arg(long, default_value = "or", value_parser = ["or", "and"])]
    pub policy: String,
    /// Rotations tried: −N..=N columns (0..=15). (The match threshold is no option: it is the
    /// deployment's policy, which every party enforces; see `privmatch iris policy`.)
    #[arg(long, default_value_t = 15)]
    pub max_rotation: i32,
}

impl SearchArgs {
    fn policy(&self) -> EyePolicy {
        if self.policy == "and" {
            EyePolicy::And
        } else {
            EyePolicy::Or
        }
    }

    /// The search mode the flags ask for.
    pub fn mode(&self) -> SearchMode {
        if self.uniqueness {
            SearchMode::Uniqueness
        } else {
            SearchMode::Identify
        }
    }

    /// The search parameters the flags give at the parties' policy `threshold`, checked.
    pub fn params(&self, threshold: f64) -> Result<SearchParams> {
        search_params(self.mode(), self.max_rotation, threshold).map_err(|e| anyhow!(e))
    }
}

/// Runs `privmatch iris …`; `config` loads the configuration (not needed by `synth`).
pub async fn run(action: &IrisAction, config: impl FnOnce() -> Result<Config>) -> Result<()> {
    match action {
        IrisAction::Enroll(args) if args.if_unique => enroll_if_unique(&config()?, args).await,
        IrisAction::Enroll(args) => enroll(&config()?, args).await,
        IrisAction::Search(args) => search(&config()?, args).await,
        IrisAction::Delete { subject, eye } => {
            let answer = IrisClient::new(&config()?)?
                .delete(subject, eye.as_deref())
                .await?;
            println!(
                "deleted {} record(s) of subject {subject:?} at all three parties",
                answer.deleted
            );
            Ok(())
        }
        IrisAction::Seal(args) => crate::iris::seal::run(&config()?, args),
        IrisAction::Synth(args) => crate::iris::synth::run(args),
        IrisAction::Policy(action) => crate::iris::policy::run(&config()?, action).await,
        IrisAction::Audit(args) => crate::iris::audit::run(&config()?, args).await,
    }
}

/// `privmatch iris enroll` (in batches).
async fn enroll(config: &Config, args: &EnrollArgs) -> Result<()> {
    let started = Instant::now();
    let options = BatchOptions {
        batch_size: args.batch_size,
        on_duplicate: args.on_duplicate.clone(),
        parallel: args.parallel,
        progress: !args.no_progress,
    };
    let (totals, total) = enroll_file(config, &args.input, &options).await?;
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

/// `--json` output of an identification: `{"probe": i, "matches": [{"subject", "eye"}…]}`.
#[derive(Serialize)]
struct IdentifyLine<'a> {
    probe: usize,
    matches: &'a [Match],
}

/// `--json` output of a uniqueness search: `{"probe": i, "unique": bool}`.
#[derive(Serialize)]
struct UniquenessLine {
    probe: usize,
    unique: bool,
}

/// One output line for a probe: JSON (`--json`) or for people.
pub fn format_probe_result(line: usize, response: &SearchResponse, json: bool) -> String {
    let index = line.saturating_sub(1);
    let empty = Vec::new();
    let matches: &Vec<Match> = response.matches.as_ref().unwrap_or(&empty);
    // The client set the mode when it opened the outputs; an answer it did not open has
    // none, and reads as what it carries.
    let mode = response.mode.unwrap_or(if response.unique.is_some() {
        SearchMode::Uniqueness
    } else {
        SearchMode::Identify
    });
    match (mode, json) {
        (SearchMode::Identify, true) => json_line(&IdentifyLine {
            probe: index,
            matches,
        }),
        (SearchMode::Uniqueness, true) => json_line(&UniquenessLine {
            probe: index,
            unique: response.unique.unwrap_or(false),
        }),
        (SearchMode::Identify, false) if matches.is_empty() => {
            format!("probe {index} (line {line}): no match")
        }
        (SearchMode::Identify, false) => format!(
            "probe {index} (line {line}): {} match{}: {}",
            matches.len(),
            if matches.len() == 1 { "" } else { "es" },
            matches
                .iter()
                .map(|m| format!("{} ({})", m.subject, m.eye))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (SearchMode::Uniqueness, false) => match response.unique {
            Some(true) => format!("probe {index} (line {line}): unique"),
            _ => format!("probe {index} (line {line}): not unique (matches an enrolled template)"),
        },
    }
}

/// Checks every probe's eyes against the mode and two-eye policy (the API's
/// [`check_policy`]: uniqueness with `and` over both eyes is refused) before anything is sent.
fn check_probe_policies(probes: &[ProbeRecord], args: &SearchArgs) -> Result<()> {
    for probe in probes {
        check_policy(args.mode(), args.policy(), probe.eyes.len())
            .map_err(|e| anyhow!("line {}: {e}", probe.line))?;
    }
    Ok(())
}

/// `privmatch iris search`: validates the whole probe file, then searches probe by probe (one
/// session per eye) and prints one line per probe, in input order.
async fn search(config: &Config, args: &SearchArgs) -> Result<()> {
    let probes = read_probe_file(&args.input)?;
    check_probe_policies(&probes, args)?;
    let mut client = IrisClient::new(config)?;
    let params = args.params(client.policy().await?)?;
    let started = Instant::now();
    for probe in &probes {
        let response = client
            .search(probe, params, args.policy())
            .await
            .with_context(|| format!("searching the probe of line {}", probe.line))?;
        println!("{}", format_probe_result(probe.line, &response, args.json));
    }
    eprintln!(
        "searched {} probe(s) in {:.2} s",
        probes.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Totals of an enroll-if-unique run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IfUniqueTotals {
    /// Newly enrolled.
    pub enrolled: usize,
    /// Subject+eye already enrolled, skipped.
    pub duplicates: usize,
    /// Refused: the template matches an enrolled one.
    pub refused: usize,
}

impl IfUniqueTotals {
    fn count(&mut self, outcome: EnrollIfUniqueOutcome) {
        match outcome {
            EnrollIfUniqueOutcome::Enrolled => self.enrolled += 1,
            EnrollIfUniqueOutcome::Duplicate => self.duplicates += 1,
            EnrollIfUniqueOutcome::NotUnique => self.refused += 1,
        }
    }

    /// The summary line.
    pub fn summary(&self) -> String {
        format!(
            "enrolled {}, skipped (duplicates) {}, refused (not unique) {}",
            self.enrolled, self.duplicates, self.refused
        )
    }
}

/// Reads the (validated) file on a blocking thread, record by record.
fn spawn_reader(input: PathBuf, tx: mpsc::Sender<Result<EnrollRecord>>) {
    std::thread::spawn(move || {
        let outcome = for_each_record(&input, |record| {
            if tx.blocking_send(Ok(record)).is_err() {
                bail!("the sender stopped");
            }
            Ok(())
        });
        if let Err(e) = outcome {
            let _ = tx.blocking_send(Err(e));
        }
    });
}

/// The error of a record that failed: what is known about it, and where to resume.
fn record_failure(
    record: &EnrollRecord,
    failure: IfUniqueFailure,
    done: &IfUniqueTotals,
) -> anyhow::Error {
    let finished = done.enrolled + done.duplicates + done.refused;
    let (error, attempts) = match failure {
        IfUniqueFailure::Call(error, attempts) => (error, attempts),
        IfUniqueFailure::Refused(why) => {
            return anyhow!(
                "line {} ({:?}, {} eye): {why}; {finished} records before it are done; whether it is enrolled is not known from this answer (`privmatch iris search` of its template tells)",
                record.line, record.subject, record.eye.as_str()
            )
        }
    };
    let unknown = error.outcome_unknown();
    let cause = error.after_attempts(attempts);
    if unknown {
        anyhow!(
            "line {} ({:?}, {} eye) is in doubt ({cause:#}): recovery enrols it at all three parties or at none; {finished} records before it are done; re-run from line {} (enrolled records are skipped as duplicates)",
            record.line, record.subject, record.eye.as_str(), record.line
        )
    } else {
        anyhow!(
            "line {} ({:?}, {} eye) was not enrolled ({cause:#}); {finished} records before it are done; resume from line {}",
            record.line, record.subject, record.eye.as_str(), record.line
        )
    }
}

/// `privmatch iris enroll --if-unique`: validates the whole file, then per record (each its
/// own distributed transaction at the coordinator) enrolls it only if its template matches no
/// enrolled one (uniqueness search, ±15 rotations). Refused records are listed on standard
/// output without naming what they matched; the run ends with a summary line.
async fn enroll_if_unique(config: &Config, args: &EnrollArgs) -> Result<()> {
    let total = validate_file(&args.input)?;
    let mut client = IrisClient::new(config)?;
    let params = if_unique_params(client.policy().await?).map_err(|e| anyhow!(e))?;
    let (tx, mut rx) = mpsc::channel(16);
    spawn_reader(args.input.clone(), tx);
    let bar = progress_bar(total, args.no_progress, "enrolling if unique");
    let started = Instant::now();
    let mut totals = IfUniqueTotals::default();
    while let Some(record) = rx.recv().await {
        let record = record?;
        let answer = client
            .enroll_if_unique(&record, params)
            .await
            .map_err(|failure| record_failure(&record, failure, &totals))?;
        if answer.outcome == EnrollIfUniqueOutcome::NotUnique {
            let why = if answer.matched_earlier_request {
                "matches no enrolled template but an earlier request sent at the same time (the same person twice in one batch)"
            } else {
                "matches an enrolled template"
            };
            bar.suspend(|| {
                println!(
                    "line {}: {:?} ({} eye): not enrolled: {why}",
                    record.line,
                    record.subject,
                    record.eye.as_str()
                )
            });
        }
        totals.count(answer.outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!(
        "{} ({total} lines in {:.2} s)",
        totals.summary(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmatch_api::iris::EyeReport;
    use privmatch_api::iris::SearchStats;
    use privmatch_core::iris::enroll::Eye;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn response(
        mode: SearchMode,
        matches: Option<Vec<Match>>,
        unique: Option<bool>,
    ) -> SearchResponse {
        SearchResponse {
            mode: Some(mode),
            policy: EyePolicy::Or,
            matches,
            unique,
            eyes: vec![EyeReport {
                eye: "left".into(),
                stats: SearchStats::default(),
                sealed_outputs: None,
            }],
        }
    }

    fn m(subject: &str, eye: &str) -> Match {
        Match {
            subject: subject.into(),
            eye: eye.into(),
        }
    }

    #[test]
    fn probe_results_as_json_lines() {
        let r = response(
            SearchMode::Identify,
            Some(vec![m("alice", "left"), m("bob", "right")]),
            None,
        );
        assert_eq!(
            format_probe_result(3, &r, true),
            r#"{"probe":2,"matches":[{"subject":"alice","eye":"left"},{"subject":"bob","eye":"right"}]}"#
        );
        let r = response(SearchMode::Uniqueness, None, Some(false));
        assert_eq!(
            format_probe_result(1, &r, true),
            r#"{"probe":0,"unique":false}"#
        );
        let r = response(SearchMode::Identify, Some(vec![]), None);
        assert_eq!(
            format_probe_result(1, &r, true),
            r#"{"probe":0,"matches":[]}"#
        );
    }

    #[test]
    fn probe_results_for_people() {
        let r = response(SearchMode::Identify, Some(vec![m("alice", "left")]), None);
        assert_eq!(
            format_probe_result(1, &r, false),
            "probe 0 (line 1): 1 match: alice (left)"
        );
        let r = response(SearchMode::Identify, Some(vec![]), None);
        assert_eq!(
            format_probe_result(2, &r, false),
            "probe 1 (line 2): no match"
        );
        let r = response(SearchMode::Uniqueness, None, Some(true));
        assert_eq!(
            format_probe_result(1, &r, false),
            "probe 0 (line 1): unique"
        );
    }

    #[test]
    fn uniqueness_and_over_two_eyes_is_refused_before_searching() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let t = privmatch_core::iris::synth::random_template(&mut rng);
        let probes = vec![
            ProbeRecord {
                line: 1,
                eyes: vec![(Eye::Left, t)],
            },
            ProbeRecord {
                line: 4,
                eyes: vec![(Eye::Left, t), (Eye::Right, t)],
            },
        ];
        let args = |uniqueness: bool, policy: &str| SearchArgs {
            input: PathBuf::new(),
            uniqueness,
            json: false,
            policy: policy.into(),
            max_rotation: 15,
        };
        let err = check_probe_policies(&probes, &args(true, "and"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("line 4") && err.contains("not supported"),
            "{err}"
        );
        assert!(check_probe_policies(&probes, &args(true, "or")).is_ok());
        assert!(check_probe_policies(&probes, &args(false, "and")).is_ok());
    }

    #[test]
    fn summary_counts_each_outcome() {
        let mut totals = IfUniqueTotals::default();
        for outcome in [
            EnrollIfUniqueOutcome::Enrolled,
            EnrollIfUniqueOutcome::NotUnique,
            EnrollIfUniqueOutcome::Enrolled,
            EnrollIfUniqueOutcome::Duplicate,
        ] {
            totals.count(outcome);
        }
        assert_eq!(
            totals.summary(),
            "enrolled 2, skipped (duplicates) 1, refused (not unique) 1"
        );
    }

    #[test]
    fn the_policy_threshold_is_checked_like_any_parameter() {
        let args = SearchArgs {
            input: PathBuf::new(),
            uniqueness: false,
            json: false,
            policy: "or".into(),
            max_rotation: 15,
        };
        let half = args.params(0.5).expect("0.5 is accepted");
        assert_eq!(half.threshold_ratio(), 0.5);
        for refused in [0.5001, 0.0] {
            let err = args.params(refused).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains("threshold")),
                "{refused}: {err:?}"
            );
        }
        let mut far = args.clone();
        far.max_rotation = 16;
        assert!(far.params(0.345).is_err());
        // `iris enroll --if-unique` at the policy's threshold.
        assert!(if_unique_params(0.5).is_ok());
        assert!(if_unique_params(0.5001).is_err());
        assert!(if_unique_params(0.0).is_err());
    }
}
