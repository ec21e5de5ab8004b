//! The client side of the iris modality: templates and probes are shared and sealed here, to
//! the pinned party keys, and sent to the coordinator's HTTP API (shapes in
//! [`privmatch_api::iris`]); the coordinator only relays ciphertext.
//!
//! * [`enroll_file`]: bulk enrolment, sealed batch by batch on a blocking thread while
//!   earlier batches are in flight; each batch is one distributed transaction.
//! * [`IrisClient`]: searches and enroll-if-unique, one session per eye with a fresh id per
//!   attempt. When the parties hold different template sets for a moment (an enrolment is
//!   being committed) the request is re-sealed for a new session and retried with back-off.
//!   Every search request carries a fresh reply key inside its sealed probes; the parties seal
//!   their signed outputs to it, and the client opens, verifies and combines them
//!   ([`open_response`]): the coordinator relays ciphertext and learns no result.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use privmatch_core::crypto::party_sign::PartyVerifyingKey;
use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::binding::{enrolment_id, envelope_hashes};
use privmatch_core::iris::enroll::{
    seal_iris_enrollment, seal_iris_enrollment_batch_on, EnrollRequest, Eye, IRIS_ENROLL_PURPOSE,
};
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{
    seal_iris_probe_to, Disclosure, ProbeContext, ReplyTo, IRIS_PROBE_PURPOSE,
};
use privmatch_core::iris::template::IrisTemplate;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::envelope::encode_enroll_batch;
use privmatch_core::wire::session::new_session_id;
use rand_chacha::ChaCha20Rng;
use tokio::sync::mpsc;

use crate::cli::batch::{account, BatchAnswer, BatchLines, EnrollTotals};
use crate::cli::client_key::ClientCredential;
use crate::cli::http::{CallError, Coordinator};
use crate::cli::keys::{sealing_time, sharing_rng, sign_each, Sealer};
use crate::cli::progress::progress_bar;
use crate::config::Config;
use crate::iris::input::{for_each_record, validate_file, EnrollRecord, ProbeRecord};
use privmatch_api::iris::eyes::{combine_matches, combine_uniqueness, EyePolicy};
use privmatch_api::iris::{
    check_policy, BatchDeclaration, DeleteBody, DeleteResponse, EnrollIfUniqueBody,
    EnrollIfUniqueOutcome, EnrollIfUniqueResponse, EnrollResponse, EyeProbeBody, LegacyParams,
    SearchBody, SearchResponse,
};
use privmatch_api::wire::{from_base64_each, session_from_hex, session_to_hex, to_base64};

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

/// Threads the client shares a batch of enrolments on: every core of the machine (the sharing
/// is the client's CPU work; the sealing and the sending stay on one thread each). Asked once
/// per process: on Linux the answer reads the cgroup's files, and a batch comes every 250
/// records.
fn sealing_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Shares and seals one batch: one envelope per party, each signed for its party by the
/// client `client` when there is one (purpose `iris-enrol`), framed for the coordinator.
fn seal_batch(
    pending: &[EnrollRecord],
    keys: &[PartyPublicKey; 3],
    client: Option<&ClientCredential>,
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
    let (envelopes, _) = seal_iris_enrollment_batch_on(&requests, keys, sealing_threads(), rng)
        .with_context(|| format!("sealing lines {}..={}", lines.first, lines.last))?;
    let envelopes = sign_each(client, IRIS_ENROLL_PURPOSE, envelopes);
    Ok(SealedBatch {
        lines,
        body: encode_enroll_batch(&[envelopes]),
    })
}

/// Reads, shares, seals (and signs, with `client`) the file on a blocking thread, one batch at
/// a time.
fn spawn_sealer(
    input: PathBuf,
    keys: [PartyPublicKey; 3],
    client: Option<ClientCredential>,
    batch_size: usize,
    tx: mpsc::Sender<Result<SealedBatch>>,
) {
    std::thread::spawn(move || {
        // A panic here (a bug) must reach the sender as an error: a sealer that just stopped
        // would look like the end of the file, and the enrolment would end "done" short.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            seal_file(&input, &keys, client.as_ref(), batch_size, &tx)
        }))
        .unwrap_or_else(|_| {
            Err(anyhow::anyhow!(
                "sealing failed (a bug: the sealer panicked); the batches answered before this error are enrolled"
            ))
        });
        if let Err(e) = outcome {
            let _ = tx.blocking_send(Err(e));
        }
    });
}

/// Reads, shares and seals `input` batch by batch, sending each batch on `tx`.
fn seal_file(
    input: &Path,
    keys: &[PartyPublicKey; 3],
    client: Option<&ClientCredential>,
    batch_size: usize,
    tx: &mpsc::Sender<Result<SealedBatch>>,
) -> Result<()> {
    let mut rng = sharing_rng()?;
    let mut pending: Vec<EnrollRecord> = Vec::with_capacity(batch_size);
    let send = |pending: &mut Vec<EnrollRecord>, rng: &mut ChaCha20Rng| {
        let batch = seal_batch(pending, keys, client, rng)?;
        pending.clear();
        if tx.blocking_send(Ok(batch)).is_err() {
            bail!("the sender stopped");
        }
        Ok(())
    };
    for_each_record(input, |record| {
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
    let Sealer { keys, client, .. } = Sealer::new(config)?;
    let coordinator = Coordinator::new(config);
    let path = format!("/v1/iris/enroll?on_duplicate={}", options.on_duplicate);
    let (tx, mut rx) = mpsc::channel(2);
    spawn_sealer(input.to_path_buf(), keys, client, options.batch_size, tx);
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
    /// The parties' pinned signing keys (`party_signing_keys`), where pinned.
    signing_keys: [Option<PartyVerifyingKey>; 3],
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

/// Opens a search answer (core's `iris::output`): for every eye the client sent (`body`: its
/// own session ids and eyes; `params`: what it sealed into the probes), the three sealed
/// outputs the coordinator relayed are
/// opened with the request's reply key `reply` and the parties' pinned keys `party_keys`,
/// each checked to be for that session, parameters and eye, signed (with `signing_keys`,
/// where pinned; the sealing alone already authenticates each party) and the three in
/// agreement; the two-eye policy then gives `matches` or `unique`, which are set in `response`
/// with the mode (anything the coordinator put there is replaced). Refuses, naming the party,
/// an output that does not open or verify.
pub fn open_response(
    params: SearchParams,
    body: &SearchBody,
    response: &mut SearchResponse,
    party_keys: &[PartyPublicKey; 3],
    signing_keys: &[Option<PartyVerifyingKey>; 3],
    reply: &PartySecretKey,
) -> Result<(), String> {
    check_policy(params.mode(), body.policy, body.eyes.len())?;
    let mut matched: Vec<(Eye, Vec<String>)> = Vec::new();
    let mut unique: Vec<(Eye, bool)> = Vec::new();
    for sent in &body.eyes {
        let eye = Eye::parse(&sent.eye).map_err(|e| e.to_string())?;
        let sealed = response
            .eyes
            .iter()
            .find(|r| r.eye == sent.eye)
            .and_then(|r| r.sealed_outputs.as_ref())
            .ok_or_else(|| {
                format!(
                    "the coordinator's answer for the {} eye carries no sealed outputs: refusing it",
                    eye.as_str()
                )
            })?;
        let sealed = from_base64_each(
            sealed,
            &format!("the {} eye's sealed_outputs", eye.as_str()),
        )?;
        let expected = ExpectedSearch {
            session: session_from_hex(&sent.session, "session")?,
            params,
            eye,
        };
        let opened = open_outputs(
            &expected,
            party_keys,
            signing_keys,
            reply,
            [&sealed[0], &sealed[1], &sealed[2]],
        )
        .map_err(|e| e.to_string())?;
        match opened.result {
            IrisResult::Identified(subjects) => matched.push((eye, subjects)),
            IrisResult::Unique(u) => unique.push((eye, u)),
            // A search is never in an enrolment batch: no earlier request to match.
            IrisResult::MatchesEarlierRequest => {
                return Err("a search answered with an enrolment batch's result".into())
            }
        }
    }
    response.mode = Some(params.mode());
    match params.mode() {
        SearchMode::Identify => {
            response.matches = Some(combine_matches(&matched, body.policy));
            response.unique = None;
        }
        SearchMode::Uniqueness => {
            response.unique = Some(combine_uniqueness(&unique, body.policy)?);
            response.matches = None;
        }
    }
    Ok(())
}

/// Why enroll-if-unique gave no outcome for a record.
#[derive(Debug)]
pub enum IfUniqueFailure {
    /// The call failed (after this many attempts).
    Call(CallError, u32),
    /// The coordinator answered, but its answer contradicts (or lacks) the parties' signed
    /// outputs of the uniqueness search: refused. What it did with the record is not known
    /// from that answer.
    Refused(String),
}

/// What one enroll-if-unique call did, as the parties' signed outputs confirm it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfUniqueAnswer {
    /// Enrolled, not unique, or a duplicate subject+eye.
    pub outcome: EnrollIfUniqueOutcome,
    /// Not unique because the record matched no enrolled template but an earlier request of
    /// its batch (the same person sent at the same time; docs/protocols/iris.md §13.4).
    pub matched_earlier_request: bool,
}

/// Checks an enroll-if-unique answer (core's `iris::output`, as [`open_response`] does for a
/// search): the three parties' outputs of the uniqueness search are opened with the attempt's
/// reply key `reply`, each checked to be for `expected` (session, parameters, eye), signed
/// (with `signing_keys`, where pinned) and in agreement, and the bit they give must be the one
/// the reported outcome implies: `enrolled` needs unique, `not_unique` needs not unique. A
/// `duplicate` (the subject+eye already enrolled) is decided before any search and carries no
/// outputs. Refuses, naming what disagrees, an answer the coordinator changed. Returns the
/// parties' result (`None` for a duplicate): for a record not unique, whether it matched an
/// enrolled template or only an earlier request of its batch.
pub fn check_if_unique_answer(
    response: &EnrollIfUniqueResponse,
    expected: &ExpectedSearch,
    party_keys: &[PartyPublicKey; 3],
    signing_keys: &[Option<PartyVerifyingKey>; 3],
    reply: &PartySecretKey,
) -> Result<Option<IrisResult>, String> {
    let reported = match response.outcome {
        EnrollIfUniqueOutcome::Duplicate => return Ok(None),
        EnrollIfUniqueOutcome::Enrolled => "enrolled",
        EnrollIfUniqueOutcome::NotUnique => "not unique",
    };
    let sealed = response.sealed_outputs.as_ref().ok_or_else(|| {
        format!(
            "the coordinator reported {reported}, but its answer carries no sealed outputs of the uniqueness search: refusing it"
        )
    })?;
    let sealed = from_base64_each(sealed, "sealed_outputs")?;
    let opened = open_outputs(
        expected,
        party_keys,
        signing_keys,
        reply,
        [&sealed[0], &sealed[1], &sealed[2]],
    )
    .map_err(|e| e.to_string())?;
    let Some(unique) = opened.result.is_unique() else {
        return Err("the parties' outputs of the uniqueness search are not a uniqueness result: refusing the answer".into());
    };
    if unique != (response.outcome == EnrollIfUniqueOutcome::Enrolled) {
        return Err(format!(
            "the coordinator reported {reported}, but the parties' signed outputs of its uniqueness search say the template is {}: refusing its answer",
            if unique { "unique" } else { "not unique" }
        ));
    }
    Ok(Some(opened.result))
}

/// Shares `template` as a probe and seals it to the three parties for a fresh session, with
/// the search parameters and the time: the parties refuse to run it with other parameters.
fn seal_probe(
    sealer: &mut Sealer,
    template: &IrisTemplate,
    eye: Eye,
    params: SearchParams,
    reply: &ReplyTo,
) -> Result<(String, [String; 3]), CallError> {
    let context = ProbeContext {
        session: new_session_id(&mut rand::rngs::OsRng),
        eye,
        params,
        sealed_at: sealing_time(),
    };
    let session = context.session;
    let sealed = seal_iris_probe_to(template, &context, reply, &sealer.keys, &mut sealer.rng)
        .map_err(|e| CallError::Local(format!("sealing the {} eye probe: {e}", eye.as_str())))?;
    let mut parties = PartyIndex::ALL.iter();
    let signed = sealed.map(|p| match parties.next() {
        Some(&party) => to_base64(&sealer.sign_for(party, IRIS_PROBE_PURPOSE, p)),
        None => to_base64(&p),
    });
    let session = session_to_hex(&session);
    // The id this search's lines carry in the coordinator's and the parties' logs too.
    tracing::debug!(session = %session, eye = eye.as_str(), "sealed an iris probe");
    Ok((session, signed))
}

/// The body of a search for `probe`: each eye shared and sealed, with `params`, for a fresh
/// session, with `reply_key` (a fresh key of the client, or the static key of the party whose
/// SQL front door will be called) as the key the parties seal their outputs to. The
/// parameters travel sealed in the probes; the body declares the mode and rotation range
/// beside them so the coordinator may batch the search with others (what the rounds would
/// tell it anyway; the parties refuse a probe sealed with other ones).
pub fn search_body(
    sealer: &mut Sealer,
    probe: &ProbeRecord,
    params: SearchParams,
    policy: EyePolicy,
    reply_key: &PartyPublicKey,
) -> Result<SearchBody, CallError> {
    let reply = ReplyTo {
        key: *reply_key,
        disclosure: Disclosure::SealedOnly,
    };
    let mut eyes = Vec::with_capacity(probe.eyes.len());
    for (eye, template) in &probe.eyes {
        let (session, probes) = seal_probe(sealer, template, *eye, params, &reply)?;
        eyes.push(EyeProbeBody {
            eye: eye.as_str().to_owned(),
            session,
            probes,
        });
    }
    Ok(SearchBody {
        policy,
        eyes,
        batch: Some(BatchDeclaration::of(params)),
        legacy: LegacyParams::default(),
    })
}

/// The framed body of `POST /v1/iris/enroll` for `records`: one envelope per party, signed by
/// `sealer`'s client when it has one.
pub fn enroll_body(records: &[EnrollRecord], sealer: &mut Sealer) -> Result<Vec<u8>> {
    Ok(seal_batch(
        records,
        &sealer.keys,
        sealer.client.as_ref(),
        &mut sealer.rng,
    )?
    .body)
}

impl IrisClient {
    /// A client for the coordinator and the pinned keys of `config`.
    pub fn new(config: &Config) -> Result<Self> {
        Ok(IrisClient {
            coordinator: Coordinator::new(config),
            sealer: Sealer::new(config)?,
            signing_keys: pinned_signing_keys(config)?.map_or([None, None, None], |k| k.map(Some)),
        })
    }

    /// The iris threshold policy the three parties hold (asked through the coordinator; the
    /// parties refuse a probe sealed with any other threshold).
    pub async fn policy(&self) -> Result<f64> {
        Ok(crate::iris::policy::fetch_policy(&self.coordinator).await?)
    }

    /// Searches one probe (one session per eye, one fresh reply key per attempt), re-sealing
    /// and retrying while the parties' template sets differ, and opens the answer
    /// ([`open_response`]): its `matches` or `unique` are what the parties' sealed outputs give.
    pub async fn search(
        &mut self,
        probe: &ProbeRecord,
        params: SearchParams,
        policy: EyePolicy,
    ) -> Result<SearchResponse> {
        let sealer = &mut self.sealer;
        // The body and reply key of the attempt that answered: its session ids are what the
        // parties signed, its reply key what they sealed to.
        let mut sent: Option<(SearchBody, PartySecretKey)> = None;
        let body = || {
            let reply = PartySecretKey::generate(&mut rand::rngs::OsRng);
            let body = search_body(sealer, probe, params, policy, &reply.public_key())?;
            sent = Some((body.clone(), reply));
            Ok(body)
        };
        let (result, attempts) = self
            .coordinator
            .post_retrying::<_, SearchResponse>("/v1/iris/search", body)
            .await;
        let mut response = result.map_err(|e| e.after_attempts(attempts))?;
        let (body, reply) = sent.ok_or_else(|| anyhow!("no search was sent"))?;
        open_response(
            params,
            &body,
            &mut response,
            &self.sealer.keys,
            &self.signing_keys,
            &reply,
        )
        .map_err(|e| anyhow!(e))?;
        Ok(response)
    }

    /// Enrolls one record if unique (`params`: the uniqueness search's): the bundles are
    /// sealed once; the probe is re-sealed for a fresh session (with a fresh reply key), and
    /// the envelopes signed afresh (new nonces, a new expiry), on every attempt. The answer's
    /// outcome is checked against the parties' signed outputs of the uniqueness search
    /// ([`check_if_unique_answer`]).
    pub async fn enroll_if_unique(
        &mut self,
        record: &EnrollRecord,
        params: SearchParams,
    ) -> Result<IfUniqueAnswer, IfUniqueFailure> {
        let sealer = &mut self.sealer;
        let (envelopes, _) = seal_iris_enrollment(
            &record.template,
            &record.subject,
            record.eye,
            &sealer.keys,
            &mut sealer.rng,
        )
        .map_err(|e| {
            IfUniqueFailure::Call(CallError::Local(format!("sealing the enrolment: {e}")), 0)
        })?;
        // The coordinator must learn whether the record is unique (it enrols it or not, and
        // that shows): the probe allows the parties to disclose that one bit to it. Their
        // signed outputs are sealed to the attempt's reply key, which the client keeps to
        // check the outcome the coordinator reports.
        let mut sent: Option<(String, PartySecretKey)> = None;
        // The probe names the record it asks to enrol (the enrolment id of the envelopes as
        // signed for this attempt): in a batch, the parties compare the later requests with
        // this record only together with this probe (docs/protocols/iris.md §13.4).
        let body = || {
            let signed = sealer.sign_each(IRIS_ENROLL_PURPOSE, envelopes.clone());
            let record_id = enrolment_id(&envelope_hashes([&signed[0], &signed[1], &signed[2]]));
            let reply_secret = PartySecretKey::generate(&mut rand::rngs::OsRng);
            let reply = ReplyTo {
                key: reply_secret.public_key(),
                disclosure: Disclosure::UniqueBitForRecord(record_id),
            };
            let (session, probes) =
                seal_probe(sealer, &record.template, record.eye, params, &reply)?;
            sent = Some((session.clone(), reply_secret));
            Ok(EnrollIfUniqueBody {
                subject: record.subject.clone(),
                eye: record.eye.as_str().to_owned(),
                session,
                probes,
                envelopes: signed.map(|e| to_base64(&e)),
                legacy: LegacyParams::default(),
            })
        };
        let (result, attempts) = self
            .coordinator
            .post_retrying::<_, EnrollIfUniqueResponse>("/v1/iris/enroll-if-unique", body)
            .await;
        let response = result.map_err(|e| IfUniqueFailure::Call(e, attempts))?;
        for pending in &response.pending_recovery {
            eprintln!(
                "warning: line {} committed; recovery will complete it at {pending}",
                record.line
            );
        }
        let (session, reply) =
            sent.ok_or_else(|| IfUniqueFailure::Refused("no request was sent".into()))?;
        let expected = ExpectedSearch {
            session: session_from_hex(&session, "session").map_err(IfUniqueFailure::Refused)?,
            params,
            eye: record.eye,
        };
        let result = check_if_unique_answer(
            &response,
            &expected,
            &self.sealer.keys,
            &self.signing_keys,
            &reply,
        )
        .map_err(IfUniqueFailure::Refused)?;
        Ok(IfUniqueAnswer {
            outcome: response.outcome,
            matched_earlier_request: result == Some(IrisResult::MatchesEarlierRequest),
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use privmatch_core::crypto::party_sign::PartySigningKey;
    use privmatch_core::iris::output::{output_sealer, seal_output, IrisOutput};
    use rand::SeedableRng;

    /// Three parties' outputs of one uniqueness search saying `unique`, sealed to `reply`.
    fn sealed_answer(
        secrets: &[PartySecretKey],
        reply: &PartySecretKey,
        expected: &ExpectedSearch,
        unique: bool,
        rng: &mut ChaCha20Rng,
    ) -> [String; 3] {
        std::array::from_fn(|i| {
            let party = PartyIndex::ALL[i];
            let output = IrisOutput {
                party,
                session: expected.session,
                params: expected.params,
                eye: expected.eye,
                set_digest: [7; 32],
                entries: 20,
                result: IrisResult::Unique(unique),
            };
            let sealer = output_sealer(party, &secrets[i], &reply.public_key(), &expected.session);
            let signer = PartySigningKey::derive(&secrets[i]);
            to_base64(&seal_output(&sealer, &output, &signer, rng))
        })
    }

    #[test]
    fn an_if_unique_outcome_must_be_what_the_parties_signed() {
        let mut rng = ChaCha20Rng::seed_from_u64(34);
        let secrets: Vec<PartySecretKey> =
            (0..3).map(|_| PartySecretKey::generate(&mut rng)).collect();
        let publics: [PartyPublicKey; 3] = std::array::from_fn(|i| secrets[i].public_key());
        let signing: [Option<PartyVerifyingKey>; 3] =
            std::array::from_fn(|i| Some(PartySigningKey::derive(&secrets[i]).verifying_key()));
        let reply = PartySecretKey::generate(&mut rng);
        let expected = ExpectedSearch {
            session: [3; 16],
            params: SearchParams::new(
                SearchMode::Uniqueness,
                privmatch_core::iris::template::MAX_ROTATION,
                privmatch_core::iris::policy::DEFAULT_TAU,
            )
            .expect("params"),
            eye: Eye::Left,
        };
        let answer = |outcome, sealed_outputs| EnrollIfUniqueResponse {
            subject: "s".into(),
            eye: "left".into(),
            outcome,
            sealed_outputs,
            pending_recovery: Vec::new(),
        };
        let check = |response: &EnrollIfUniqueResponse| {
            check_if_unique_answer(response, &expected, &publics, &signing, &reply)
        };
        let unique = sealed_answer(&secrets, &reply, &expected, true, &mut rng);
        let matched = sealed_answer(&secrets, &reply, &expected, false, &mut rng);
        use EnrollIfUniqueOutcome::{Duplicate, Enrolled, NotUnique};
        assert_eq!(
            check(&answer(Enrolled, Some(unique.clone()))),
            Ok(Some(IrisResult::Unique(true)))
        );
        assert_eq!(
            check(&answer(NotUnique, Some(matched.clone()))),
            Ok(Some(IrisResult::Unique(false)))
        );
        assert_eq!(check(&answer(Duplicate, None)), Ok(None));
        let flipped = check(&answer(Enrolled, Some(matched))).expect_err("flipped");
        assert!(flipped.contains("reported enrolled"), "{flipped}");
        assert!(
            flipped.contains("say the template is not unique"),
            "{flipped}"
        );
        let flipped = check(&answer(NotUnique, Some(unique.clone()))).expect_err("flipped");
        assert!(flipped.contains("say the template is unique"), "{flipped}");
        let dropped = check(&answer(Enrolled, None)).expect_err("dropped");
        assert!(dropped.contains("carries no sealed outputs"), "{dropped}");
        // Another reply key (an output of another request) does not open.
        let other = PartySecretKey::generate(&mut rng);
        let refused = check_if_unique_answer(
            &answer(Enrolled, Some(unique)),
            &expected,
            &publics,
            &signing,
            &other,
        )
        .expect_err("another reply key");
        assert!(refused.contains("P0"), "{refused}");
    }
}
