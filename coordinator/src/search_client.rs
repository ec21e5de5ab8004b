//! The client side of iris search and enrol-if-unique (`privmatch iris search`, `privmatch
//! iris enroll --if-unique`): probes are shared and sealed here, to the pinned party keys, for
//! a fresh session id per attempt; the coordinator only relays them (HTTP API, shapes in
//! [`crate::api`]). When the parties hold different template sets for a moment (an enrolment
//! is being committed) the request is re-sealed for a new session and retried with back-off
//! ([`crate::search::with_retry`]).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::iris::enroll::{seal_iris_enrollment, Eye};
use privmatch_core::iris::probe::seal_iris_probe;
use privmatch_core::iris::template::IrisTemplate;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::api::{
    codes, session_to_hex, to_base64, EnrollIfUniqueBody, EnrollIfUniqueOutcome,
    EnrollIfUniqueResponse, ErrorBody, EyeProbeBody, SearchBody, SearchResponse,
};
use crate::client::EnrollArgs;
use crate::config::Config;
use crate::input::{for_each_record, read_probe_file, validate_file, EnrollRecord, ProbeRecord};
use crate::search::{
    new_session_id, with_retry, EyePolicy, Match, RetryPolicy, SearchMode, SearchParams, SessionId,
    UNIQUENESS_AND_UNSUPPORTED,
};

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
    /// Rotations tried: −N..=N columns (0..=15).
    #[arg(long, default_value_t = 15)]
    pub max_rotation: i32,
    /// Match threshold: fractional Hamming distance ratio in (0, 0.5), at most four decimals.
    #[arg(long, default_value_t = 0.345)]
    pub threshold: f64,
}

impl SearchArgs {
    fn policy(&self) -> EyePolicy {
        if self.policy == "and" {
            EyePolicy::And
        } else {
            EyePolicy::Or
        }
    }

    fn params(&self) -> SearchParams {
        SearchParams {
            mode: if self.uniqueness {
                SearchMode::Uniqueness
            } else {
                SearchMode::Identify
            },
            max_rotation: self.max_rotation,
            threshold: self.threshold,
        }
    }
}

/// Why a call to the coordinator failed.
#[derive(Debug)]
enum CallError {
    /// The coordinator could not be reached: nothing happened.
    Unreachable(String),
    /// The connection broke after the request was sent: the outcome is unknown.
    Broken(String),
    /// The coordinator answered an error.
    Api { status: u16, body: ErrorBody },
    /// Preparing the request failed here.
    Local(anyhow::Error),
}

impl CallError {
    fn code(&self) -> Option<&str> {
        match self {
            CallError::Api { body, .. } => body.code.as_deref(),
            _ => None,
        }
    }

    fn is_sets_differ(&self) -> bool {
        self.code() == Some(codes::SETS_DIFFER)
    }

    /// The outcome of a write is unknown (in doubt at the parties, or the answer was lost).
    fn outcome_unknown(&self) -> bool {
        matches!(self, CallError::Broken(_)) || self.code() == Some(codes::IN_DOUBT)
    }

    fn into_anyhow(self, attempts: u32) -> anyhow::Error {
        match self {
            CallError::Unreachable(e) => {
                anyhow!("cannot reach the coordinator (is `privmatch cluster up` running?): {e}")
            }
            CallError::Broken(e) => {
                anyhow!("the connection to the coordinator broke before it answered: {e}")
            }
            CallError::Api { status, body } if body.code.as_deref() == Some(codes::SETS_DIFFER) => {
                anyhow!(
                    "{} (HTTP {status}; gave up after {attempts} attempts)",
                    body.error
                )
            }
            CallError::Api { status, body } => anyhow!("{} (HTTP {status})", body.error),
            CallError::Local(e) => e,
        }
    }
}

/// POSTs a JSON body and decodes the JSON answer.
async fn post_json<B: Serialize, T: DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    body: &B,
) -> Result<T, CallError> {
    let response = match http.post(url).json(body).send().await {
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
        return serde_json::from_slice(&bytes)
            .map_err(|e| CallError::Local(anyhow!("unreadable answer from the coordinator: {e}")));
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

/// A CSPRNG for sharing, seeded from the operating system.
fn sharing_rng() -> Result<ChaCha20Rng> {
    ChaCha20Rng::from_rng(rand::rngs::OsRng)
        .context("the operating system's random source is unavailable")
}

/// Shares `template` as a probe and seals it to the three parties for a fresh session.
fn seal_probe(
    template: &IrisTemplate,
    eye: Eye,
    keys: &[PartyPublicKey; 3],
    rng: &mut ChaCha20Rng,
) -> Result<(SessionId, [String; 3])> {
    let session = new_session_id();
    let sealed = seal_iris_probe(template, eye, session, keys, rng)
        .with_context(|| format!("sealing the {} eye probe", eye.as_str()))?;
    Ok((session, sealed.map(|p| to_base64(&p))))
}

/// The request for one probe, sealed for fresh sessions.
fn search_body(
    probe: &ProbeRecord,
    args: &SearchArgs,
    keys: &[PartyPublicKey; 3],
    rng: &mut ChaCha20Rng,
) -> Result<SearchBody> {
    let mut eyes = Vec::with_capacity(probe.eyes.len());
    for (eye, template) in &probe.eyes {
        let (session, probes) = seal_probe(template, *eye, keys, rng)?;
        eyes.push(EyeProbeBody {
            eye: eye.as_str().to_owned(),
            session: session_to_hex(&session),
            probes,
        });
    }
    let params = args.params();
    Ok(SearchBody {
        mode: params.mode,
        max_rotation: params.max_rotation,
        threshold: params.threshold,
        policy: args.policy(),
        eyes,
    })
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

fn json_line<T: Serialize>(line: &T) -> String {
    serde_json::to_string(line).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// One output line for a probe: JSON (`--json`) or for people.
pub fn format_probe_result(line: usize, response: &SearchResponse, json: bool) -> String {
    let index = line.saturating_sub(1);
    let empty = Vec::new();
    let matches: &Vec<Match> = response.matches.as_ref().unwrap_or(&empty);
    match (response.mode, json) {
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

/// Refuses uniqueness with policy `and` when a probe has both eyes, before anything is sent.
fn check_policy(probes: &[ProbeRecord], args: &SearchArgs) -> Result<()> {
    if args.uniqueness && args.policy() == EyePolicy::And {
        if let Some(probe) = probes.iter().find(|p| p.eyes.len() > 1) {
            bail!("line {}: {UNIQUENESS_AND_UNSUPPORTED}", probe.line);
        }
    }
    Ok(())
}

/// Searches one probe, re-sealing and retrying while the parties' template sets differ.
async fn search_probe(
    http: &reqwest::Client,
    url: &str,
    probe: &ProbeRecord,
    args: &SearchArgs,
    keys: &[PartyPublicKey; 3],
    rng: &mut ChaCha20Rng,
) -> Result<SearchResponse> {
    let (result, attempts) = with_retry(&RetryPolicy::default(), CallError::is_sets_differ, || {
        let body = search_body(probe, args, keys, rng);
        async move {
            let body = body.map_err(CallError::Local)?;
            post_json::<_, SearchResponse>(http, url, &body).await
        }
    })
    .await;
    result.map_err(|e| e.into_anyhow(attempts))
}

/// `privmatch iris search`: validates the whole probe file, then searches probe by probe (one
/// session per eye) and prints one line per probe, in input order.
pub async fn search(config: &Config, args: &SearchArgs) -> Result<()> {
    args.params().validate().map_err(|e| anyhow!(e))?;
    let probes = read_probe_file(&args.input)?;
    check_policy(&probes, args)?;
    let keys = config.pinned_keys()?;
    let mut rng = sharing_rng()?;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/iris/search", config.coordinator_url());
    let started = Instant::now();
    for probe in &probes {
        let response = search_probe(&http, &url, probe, args, &keys, &mut rng)
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

/// Totals of an enrol-if-unique run.
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

/// Enrols one record if unique: the bundles are sealed once; the probe is re-sealed for a
/// fresh session on every attempt.
async fn enroll_one_if_unique(
    http: &reqwest::Client,
    url: &str,
    record: &EnrollRecord,
    threshold: f64,
    keys: &[PartyPublicKey; 3],
    rng: &mut ChaCha20Rng,
) -> Result<EnrollIfUniqueOutcome, (CallError, u32)> {
    let (envelopes, _) =
        seal_iris_enrollment(&record.template, &record.subject, record.eye, keys, rng)
            .map_err(|e| (CallError::Local(anyhow!("sealing the enrolment: {e}")), 0))?;
    let envelopes = envelopes.map(|e| to_base64(&e));
    let (result, attempts) = with_retry(&RetryPolicy::default(), CallError::is_sets_differ, || {
        let probe = seal_probe(&record.template, record.eye, keys, rng);
        let body = probe.map(|(session, probes)| EnrollIfUniqueBody {
            subject: record.subject.clone(),
            eye: record.eye.as_str().to_owned(),
            session: session_to_hex(&session),
            probes,
            envelopes: envelopes.clone(),
            threshold,
        });
        async move {
            let body = body.map_err(CallError::Local)?;
            post_json::<_, EnrollIfUniqueResponse>(http, url, &body).await
        }
    })
    .await;
    match result {
        Ok(response) => {
            for pending in &response.pending_recovery {
                eprintln!(
                    "warning: line {} committed; recovery will complete it at {pending}",
                    record.line
                );
            }
            Ok(response.outcome)
        }
        Err(e) if e.code() == Some(codes::NOT_UNIQUE) => Ok(EnrollIfUniqueOutcome::NotUnique),
        Err(e) => Err((e, attempts)),
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
    error: CallError,
    attempts: u32,
    done: &IfUniqueTotals,
) -> anyhow::Error {
    let finished = done.enrolled + done.duplicates + done.refused;
    let unknown = error.outcome_unknown();
    let cause = error.into_anyhow(attempts);
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
/// own distributed transaction at the coordinator) enrols it only if its template matches no
/// enrolled one (uniqueness search, ±15 rotations). Refused records are listed on standard
/// output without naming what they matched; the run ends with a summary line.
pub async fn enroll_if_unique(config: &Config, args: &EnrollArgs) -> Result<()> {
    SearchParams {
        mode: SearchMode::Uniqueness,
        max_rotation: privmatch_core::iris::template::MAX_ROTATION,
        threshold: args.threshold,
    }
    .validate()
    .map_err(|e| anyhow!(e))?;
    let total = validate_file(&args.input)?;
    let keys = config.pinned_keys()?;
    let mut rng = sharing_rng()?;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/iris/enroll-if-unique", config.coordinator_url());
    let (tx, mut rx) = mpsc::channel(16);
    spawn_reader(args.input.clone(), tx);
    let bar = crate::client::progress_bar(total, args.no_progress, "enrolling if unique");
    let started = Instant::now();
    let mut totals = IfUniqueTotals::default();
    while let Some(record) = rx.recv().await {
        let record = record?;
        let outcome = enroll_one_if_unique(&http, &url, &record, args.threshold, &keys, &mut rng)
            .await
            .map_err(|(e, attempts)| record_failure(&record, e, attempts, &totals))?;
        if outcome == EnrollIfUniqueOutcome::NotUnique {
            bar.suspend(|| {
                println!(
                    "line {}: {:?} ({} eye): not enrolled: matches an enrolled template",
                    record.line,
                    record.subject,
                    record.eye.as_str()
                )
            });
        }
        totals.count(outcome);
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
    use crate::search::SearchStats;

    fn response(
        mode: SearchMode,
        matches: Option<Vec<Match>>,
        unique: Option<bool>,
    ) -> SearchResponse {
        SearchResponse {
            mode,
            policy: EyePolicy::Or,
            matches,
            unique,
            eyes: vec![crate::api::EyeReport {
                eye: "left".into(),
                stats: SearchStats::default(),
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
            threshold: 0.345,
        };
        let err = check_policy(&probes, &args(true, "and"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("line 4") && err.contains("not supported"),
            "{err}"
        );
        assert!(check_policy(&probes, &args(true, "or")).is_ok());
        assert!(check_policy(&probes, &args(false, "and")).is_ok());
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
}
