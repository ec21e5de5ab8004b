//! The client side of the iris modality: templates and probes are shared and sealed here, to
//! the pinned party keys, and sent to the coordinator's HTTP API (shapes in
//! [`crate::iris::api`]); the coordinator only relays ciphertext.
//!
//! * [`enroll_file`]: bulk enrolment, sealed batch by batch on a blocking thread while
//!   earlier batches are in flight; each batch is one distributed transaction.
//! * [`IrisClient`]: searches and enroll-if-unique, one session per eye with a fresh id per
//!   attempt. When the parties hold different template sets for a moment (an enrolment is
//!   being committed) the request is re-sealed for a new session and retried with back-off.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use privmatch_core::crypto::party_sign::PartyVerifyingKey;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::iris::enroll::{
    seal_iris_enrollment, seal_iris_enrollment_batch, EnrollRequest, Eye,
};
use privmatch_core::iris::output::{verify_outputs, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{seal_iris_probe, ProbeContext};
use privmatch_core::iris::template::IrisTemplate;
use privmatch_core::wire::envelope::encode_enroll_batch;
use privmatch_core::wire::session::new_session_id;
use rand_chacha::ChaCha20Rng;
use tokio::sync::mpsc;

use crate::cli::batch::{account, BatchAnswer, BatchLines, EnrollTotals};
use crate::cli::http::{CallError, Coordinator};
use crate::cli::keys::{sealing_time, sharing_rng, Sealer};
use crate::cli::progress::progress_bar;
use crate::config::Config;
use crate::iris::api::{
    DeleteBody, DeleteResponse, EnrollIfUniqueBody, EnrollIfUniqueOutcome, EnrollIfUniqueResponse,
    EnrollResponse, EyeProbeBody, SearchBody, SearchResponse,
};
use crate::iris::eyes::{combine_matches, combine_uniqueness, EyePolicy};
use crate::iris::input::{for_each_record, validate_file, EnrollRecord, ProbeRecord};
use crate::wire::{codes, session_from_hex, session_to_hex, to_base64};

/// Whether the warning that outputs are not verified was printed (once per process).
static WARNED_UNVERIFIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Where recovery finishes an iris batch left in doubt.
const RECOVERY_SCOPE: &str = "at all three parties or at none";

/// How a file is enrolled in batches.
#[derive(Clone, Debug)]
pub struct BatchOptions {
    /// Records per distributed transaction.
    pub batch_size: usize,
    /// `skip` or `error` (see `privmatch iris enroll --on-duplicate`).
    pub on_duplicate: String,
    /// Batches in flight at once.
    pub parallel: usize,
    /// Draw a progress bar.
    pub progress: bool,
}

struct SealedBatch {
    lines: BatchLines,
    body: Vec<u8>,
}

/// Shares and seals one batch: one envelope per party, framed for the coordinator.
fn seal_batch(
    pending: &[EnrollRecord],
    keys: &[PartyPublicKey; 3],
    rng: &mut ChaCha20Rng,
) -> Result<SealedBatch> {
    let requests: Vec<EnrollRequest<'_>> = pending
        .iter()
        .map(|r| EnrollRequest {
            template: &r.template,
            subject: &r.subject,
            eye: r.eye,
        })
        .collect();
    let lines = BatchLines::of(pending.iter().map(|r| r.line));
    let (envelopes, _) = seal_iris_enrollment_batch(&requests, keys, rng)
        .with_context(|| format!("sealing lines {}..={}", lines.first, lines.last))?;
    Ok(SealedBatch {
        lines,
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
        let outcome = sharing_rng().and_then(|mut rng| {
            let mut pending: Vec<EnrollRecord> = Vec::with_capacity(batch_size);
            let send = |pending: &mut Vec<EnrollRecord>, rng: &mut ChaCha20Rng| {
                let batch = seal_batch(pending, &keys, rng)?;
                pending.clear();
                if tx.blocking_send(Ok(batch)).is_err() {
                    bail!("the sender stopped");
                }
                Ok(())
            };
            for_each_record(&input, |record| {
                pending.push(record);
                if pending.len() == batch_size {
                    send(&mut pending, &mut rng)?;
                }
                Ok(())
            })?;
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

/// Enrolls a whole file: validates every line first (nothing is sent if any line is bad),
/// then seals and sends batches; each batch is atomic across the parties. On an error, the
/// batches before it are enrolled and the message says from which line to resume (re-running
/// with the default `--on-duplicate skip` is safe). Returns the totals and the number of
/// records.
pub async fn enroll_file(
    config: &Config,
    input: &Path,
    options: &BatchOptions,
) -> Result<(EnrollTotals, usize)> {
    if options.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let total = validate_file(input)?;
    let keys = config.pinned_keys()?;
    let coordinator = Coordinator::new(config);
    let path = format!("/v1/iris/enroll?on_duplicate={}", options.on_duplicate);
    let (tx, mut rx) = mpsc::channel(2);
    spawn_sealer(input.to_path_buf(), keys, options.batch_size, tx);
    let bar = progress_bar(total, !options.progress, "enrolling");
    let mut totals = EnrollTotals::default();
    type Answer = Result<EnrollResponse, CallError>;
    // Keep a few batches in flight while the next ones are sealed; answers are accounted in
    // order, so an error reports exactly which lines are enrolled.
    let mut in_flight: VecDeque<(BatchLines, tokio::task::JoinHandle<Answer>)> = VecDeque::new();
    let settle = |lines: BatchLines, answer: Answer, totals: &mut EnrollTotals| {
        let answer = answer.map(|response| BatchAnswer {
            enrolled: response.results.iter().map(|r| r.enrolled).collect(),
            pending_recovery: response.pending_recovery,
        });
        account(totals, &lines, answer, RECOVERY_SCOPE, &bar)
    };
    while let Some(next) = rx.recv().await {
        let batch = next?;
        let (coordinator, path) = (coordinator.clone(), path.clone());
        let handle = tokio::spawn(async move { coordinator.post_bytes(&path, batch.body).await });
        in_flight.push_back((batch.lines, handle));
        if in_flight.len() >= options.parallel.max(1) {
            if let Some((lines, handle)) = in_flight.pop_front() {
                let answer = handle.await.context("sender task failed")?;
                settle(lines, answer, &mut totals)?;
            }
        }
    }
    while let Some((lines, handle)) = in_flight.pop_front() {
        let answer = handle.await.context("sender task failed")?;
        settle(lines, answer, &mut totals)?;
    }
    bar.finish_and_clear();
    Ok((totals, total))
}

/// A client of the coordinator's iris API, with the pinned keys and a CSPRNG for sharing.
pub struct IrisClient {
    coordinator: Coordinator,
    sealer: Sealer,
    /// The parties' pinned signing keys (`party_signing_keys`), when pinned.
    signing_keys: Option<[PartyVerifyingKey; 3]>,
}

/// The parties' signing keys pinned in `config` (`party_signing_keys`): None when none is
/// pinned; an error naming the party when one is malformed or not all three are.
pub fn pinned_signing_keys(config: &Config) -> Result<Option<[PartyVerifyingKey; 3]>> {
    let keys = &config.party_signing_keys;
    if keys.is_empty() {
        return Ok(None);
    }
    if keys.len() != 3 {
        bail!(
            "party_signing_keys must pin exactly 3 keys, found {}",
            keys.len()
        );
    }
    let key = |i: usize| {
        PartyVerifyingKey::from_hex(&keys[i])
            .with_context(|| format!("party_signing_keys: the key pinned for P{i}"))
    };
    Ok(Some([key(0)?, key(1)?, key(2)?]))
}

/// Checks a search answer against what the client sent (`body`: its own session ids,
/// parameters and eyes): every eye's result must be what each party signed (core's
/// `iris::output`, verified with the pinned `keys`), and the combined `matches` / `unique` the
/// coordinator answered must be what the signed per-eye results give under the eye policy.
/// Refuses, naming the party, a result the coordinator changed.
pub fn verify_response(
    body: &SearchBody,
    response: &SearchResponse,
    keys: &[PartyVerifyingKey; 3],
) -> Result<(), String> {
    let params = body.params()?;
    let keys = keys.map(Some);
    let mut matched: Vec<(Eye, Vec<String>)> = Vec::new();
    let mut unique: Vec<(Eye, bool)> = Vec::new();
    for sent in &body.eyes {
        let eye = Eye::parse(&sent.eye).map_err(|e| e.to_string())?;
        let refuse = |why: &str| {
            format!(
                "the coordinator's answer for the {} eye {why}: refusing it",
                eye.as_str()
            )
        };
        let output = response
            .eyes
            .iter()
            .find(|r| r.eye == sent.eye)
            .and_then(|r| r.output.as_ref())
            .ok_or_else(|| refuse("carries no signed output"))?;
        let session = session_from_hex(&sent.session, "session")?;
        if output.session != sent.session {
            return Err(refuse("is for another session"));
        }
        let digest: [u8; 32] = hex::decode(&output.set_digest)
            .ok()
            .and_then(|d| d.try_into().ok())
            .ok_or_else(|| refuse("has a malformed set digest"))?;
        let signatures: [Vec<u8>; 3] = {
            let decoded: Vec<Vec<u8>> = output
                .signatures
                .iter()
                .map(|s| hex::decode(s).unwrap_or_default())
                .collect();
            [decoded[0].clone(), decoded[1].clone(), decoded[2].clone()]
        };
        let result = match (params.mode(), &output.subjects, output.unique) {
            (SearchMode::Identify, Some(subjects), None) => {
                IrisResult::Identified(subjects.clone())
            }
            (SearchMode::Uniqueness, None, Some(u)) => IrisResult::Unique(u),
            _ => return Err(refuse("is not a result of the mode it asked for")),
        };
        let entries = u64::try_from(output.entries).map_err(|_| refuse("has a negative count"))?;
        verify_outputs(
            &keys,
            session,
            params,
            eye,
            digest,
            entries,
            &result,
            &signatures,
        )
        .map_err(|e| e.to_string())?;
        match result {
            IrisResult::Identified(subjects) => matched.push((eye, subjects)),
            IrisResult::Unique(u) => unique.push((eye, u)),
        }
    }
    let combined_ok = match params.mode() {
        SearchMode::Identify => {
            response.matches.as_ref() == Some(&combine_matches(&matched, body.policy))
        }
        SearchMode::Uniqueness => {
            response.unique == Some(combine_uniqueness(&unique, body.policy)?)
        }
    };
    if !combined_ok {
        return Err(
            "the coordinator's combined answer is not what the parties' signed per-eye results give: the coordinator changed it; refusing it"
                .into(),
        );
    }
    Ok(())
}

/// Shares `template` as a probe and seals it to the three parties for a fresh session, with
/// the search parameters and the time: the parties refuse to run it with other parameters.
fn seal_probe(
    sealer: &mut Sealer,
    template: &IrisTemplate,
    eye: Eye,
    params: SearchParams,
) -> Result<(String, [String; 3]), CallError> {
    let context = ProbeContext {
        session: new_session_id(&mut rand::rngs::OsRng),
        eye,
        params,
        sealed_at: sealing_time(),
    };
    let session = context.session;
    let sealed = seal_iris_probe(template, &context, &sealer.keys, &mut sealer.rng)
        .map_err(|e| CallError::Local(format!("sealing the {} eye probe: {e}", eye.as_str())))?;
    Ok((session_to_hex(&session), sealed.map(|p| to_base64(&p))))
}

/// The body of a search for `probe`: each eye shared and sealed for a fresh session.
pub fn search_body(
    sealer: &mut Sealer,
    probe: &ProbeRecord,
    params: SearchParams,
    policy: EyePolicy,
) -> Result<SearchBody, CallError> {
    let mut eyes = Vec::with_capacity(probe.eyes.len());
    for (eye, template) in &probe.eyes {
        let (session, probes) = seal_probe(sealer, template, *eye, params)?;
        eyes.push(EyeProbeBody {
            eye: eye.as_str().to_owned(),
            session,
            probes,
        });
    }
    Ok(SearchBody {
        mode: params.mode(),
        max_rotation: params.max_rotation(),
        threshold: params.threshold_ratio(),
        policy,
        eyes,
    })
}

/// The framed body of `POST /v1/iris/enroll` for `records`: one envelope per party.
pub fn enroll_body(
    records: &[EnrollRecord],
    keys: &[PartyPublicKey; 3],
    rng: &mut ChaCha20Rng,
) -> Result<Vec<u8>> {
    Ok(seal_batch(records, keys, rng)?.body)
}

impl IrisClient {
    /// A client for the coordinator and the pinned keys of `config`.
    pub fn new(config: &Config) -> Result<Self> {
        Ok(IrisClient {
            coordinator: Coordinator::new(config),
            sealer: Sealer::new(config)?,
            signing_keys: pinned_signing_keys(config)?,
        })
    }

    /// The iris threshold policy the three parties hold (asked through the coordinator; the
    /// parties refuse a probe sealed with any other threshold).
    pub async fn policy(&self) -> Result<f64> {
        Ok(crate::iris::policy::fetch_policy(&self.coordinator).await?)
    }

    /// Searches one probe (one session per eye), re-sealing and retrying while the parties'
    /// template sets differ.
    pub async fn search(
        &mut self,
        probe: &ProbeRecord,
        params: SearchParams,
        policy: EyePolicy,
    ) -> Result<SearchResponse> {
        let sealer = &mut self.sealer;
        // The body of the attempt that answered: its session ids are what the parties signed.
        let mut sent: Option<SearchBody> = None;
        let body = || {
            let body = search_body(sealer, probe, params, policy)?;
            sent = Some(body.clone());
            Ok(body)
        };
        let (result, attempts) = self
            .coordinator
            .post_retrying::<_, SearchResponse>("/v1/iris/search", body)
            .await;
        let response = result.map_err(|e| e.after_attempts(attempts))?;
        match (&self.signing_keys, &sent) {
            (Some(keys), Some(body)) => {
                verify_response(body, &response, keys).map_err(|e| anyhow!(e))?
            }
            (None, _) => {
                if !WARNED_UNVERIFIED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!("warning: the parties' signed search outputs are not verified: no party_signing_keys are pinned in the configuration");
                }
            }
            (Some(_), None) => bail!("no search was sent"),
        }
        Ok(response)
    }

    /// Enrolls one record if unique (`params`: the uniqueness search's): the bundles are
    /// sealed once; the probe is re-sealed for a fresh session on every attempt. On failure,
    /// the error and the attempts made.
    pub async fn enroll_if_unique(
        &mut self,
        record: &EnrollRecord,
        params: SearchParams,
    ) -> Result<EnrollIfUniqueOutcome, (CallError, u32)> {
        let sealer = &mut self.sealer;
        let (envelopes, _) = seal_iris_enrollment(
            &record.template,
            &record.subject,
            record.eye,
            &sealer.keys,
            &mut sealer.rng,
        )
        .map_err(|e| (CallError::Local(format!("sealing the enrolment: {e}")), 0))?;
        let envelopes = envelopes.map(|e| to_base64(&e));
        let body = || {
            let (session, probes) = seal_probe(sealer, &record.template, record.eye, params)?;
            Ok(EnrollIfUniqueBody {
                subject: record.subject.clone(),
                eye: record.eye.as_str().to_owned(),
                session,
                probes,
                envelopes: envelopes.clone(),
                threshold: params.threshold_ratio(),
            })
        };
        let (result, attempts) = self
            .coordinator
            .post_retrying::<_, EnrollIfUniqueResponse>("/v1/iris/enroll-if-unique", body)
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

    /// Deletes a subject's templates (one eye, or both) at the three parties, atomically.
    pub async fn delete(&self, subject: &str, eye: Option<&str>) -> Result<DeleteResponse> {
        let body = DeleteBody {
            subject: subject.to_owned(),
            eye: eye.map(str::to_owned),
        };
        Ok(self.coordinator.post("/v1/iris/delete", &body).await?)
    }
}
