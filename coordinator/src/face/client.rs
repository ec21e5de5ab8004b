//! The client side of the face modality and its library API: embeddings (read and quantised
//! by [`crate::face::input`]) are additively shared and sealed here to the pinned keys of P0
//! and P1 (the dealer configuration to P2's), and sent to the coordinator's HTTP API
//! ([`privmatch_api::face`]); the coordinator only relays ciphertext. Each probe carries a fresh
//! reply key (an X25519 key pair drawn per request); P0 and P1 seal their output shares to
//! it, and the client opens them with its secret and the parties' keys pinned in its own
//! configuration (core's `face::reply`, docs/protocols/face.md §13), so the coordinator
//! learns no result and an output it altered is refused, naming the party. No request names a
//! subject (docs/protocols/face.md §14): a verification's claimed subject is sealed inside
//! the probe, and an identification's compared subjects are read from inside the opened
//! outputs. Each verification or
//! identification is one session with a fresh id; when the parties answer a transient error
//! (template sets differ for a moment, a session id or stocked dealing claimed already) the probe is re-sealed for a new
//! session and retried with back-off.
//!
//! Library entry points: [`configure`], [`dealer`], [`enroll_file`], [`delete`],
//! [`verify`], [`identify`], and [`FaceClient`] for repeated calls on quantised embeddings
//! (the benchmark's).

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use privmatch_core::crypto::seal::PartySecretKey;
use privmatch_core::crypto::sign::OperatorSigningKey;
use privmatch_core::face::dealer::{seal_dealer_config, DealerConfig, DEALER_CONFIG_ACTION};
use privmatch_core::face::enroll::{seal_face_enrollment, FaceEnrollRequest, FACE_ENROLL_PURPOSE};
use privmatch_core::face::probe::{seal_face_probe_knowing, FACE_PROBE_PURPOSE};
use privmatch_core::face::quantize::Quantizer;
use privmatch_core::face::reply::{FaceOpeners, FaceResult, KnownSubjects};
use privmatch_core::face::Metric;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::{new_session_id, SessionId};
use serde::de::DeserializeOwned;

use crate::cli::batch::{account, BatchAnswer, BatchLines, EnrollTotals};
use crate::cli::http::{CallError, Coordinator};
use crate::cli::keys::Sealer;
use crate::cli::operator_key::fresh_counter;
use crate::cli::progress::progress_bar;
use crate::config::Config;
use crate::face::input::{read_enroll_file, EmbeddingOptions, FaceEnrollRecord};
use privmatch_api::face::{
    DealerStatus, FaceConfigureBody, FaceDealerResponse, FaceDeleteBody, FaceDeleteResponse,
    FaceEnrollBody, FaceEnrollResponse, FaceIdentifyBody, FaceIdentifyResponse, FaceVerifyBody,
    FaceVerifyResponse,
};
use privmatch_api::wire::{from_base64_each, session_to_hex, to_base64};

/// Where recovery finishes a face batch left in doubt.
const RECOVERY_SCOPE: &str = "at P0 and P1 or at neither";

/// A session of calls to the coordinator's face API, with the pinned keys and a CSPRNG for
/// sharing.
pub struct FaceClient {
    coordinator: Coordinator,
    sealer: Sealer,
    /// The compared-subject list of this client's last identification: its digest goes into
    /// the next identification probe, so the evaluators need not list it again while the
    /// enrolled set stays the same (core's `face::reply` docs).
    known: KnownSubjects,
}

/// What a 1:N identification answered, once the client opened the sealed outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaceIdentified {
    /// The matching subjects, sorted.
    pub matches: Vec<String>,
    /// Templates compared (every enrolled one).
    pub comparisons: i64,
    /// Bytes each evaluator (P0, P1) sent online in the session.
    pub bytes_sent: [u64; 2],
    /// Bytes of the key half the dealer sent each evaluator for the session.
    pub key_bytes: [u64; 2],
    /// Whether the identification used a dealing made ahead of time.
    pub stocked: bool,
}

/// Opens P0's and P1's sealed outputs (`outputs`, base64, as the coordinator relayed them)
/// with the openers of the request's session and reply key (derived from the parties' keys
/// pinned in the client's own configuration) and adds them: one bit per compared subject —
/// the `claimed` subject of a verification, or the subjects both evaluators list inside their
/// outputs (`None`: an identification). An output that does not open (altered or forged in
/// transit) or does not fit is refused, naming the party.
pub fn open_outputs(
    openers: &FaceOpeners,
    outputs: &[String],
    claimed: Option<&str>,
) -> Result<FaceResult> {
    let [o0, o1] = relayed_pair(outputs)?;
    openers
        .result([&o0, &o1], claimed)
        .map_err(changed_in_transit)
}

/// Opens P0's and P1's sealed outputs of an identification (`outputs`, base64, as the
/// coordinator relayed them) against the subject list the client knows (`known`, replaced
/// when the evaluators list a new one): one bit per subject. An output the coordinator
/// altered is refused, naming the party.
fn open_identification(
    openers: &FaceOpeners,
    outputs: &[String],
    known: &mut KnownSubjects,
) -> Result<Vec<bool>> {
    let [o0, o1] = relayed_pair(outputs)?;
    openers
        .identification([&o0, &o1], known)
        .map_err(changed_in_transit)
}

/// P0's and P1's sealed outputs, decoded from the base64 the coordinator relayed.
fn relayed_pair(outputs: &[String]) -> Result<[Vec<u8>; 2]> {
    let outputs: [String; 2] = outputs.to_vec().try_into().map_err(|o: Vec<String>| {
        anyhow!(
            "the coordinator relayed {} sealed outputs, not P0's and P1's",
            o.len()
        )
    })?;
    from_base64_each(&outputs, "outputs").map_err(|e| anyhow!("{e}"))
}

fn changed_in_transit(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("{e}: the result was changed in transit (by the coordinator?) and is refused")
}

impl FaceClient {
    /// A client for the coordinator and the pinned keys of `config`.
    pub fn new(config: &Config) -> Result<Self> {
        Ok(FaceClient {
            coordinator: Coordinator::new(config),
            sealer: Sealer::new(config)?,
            known: KnownSubjects::default(),
        })
    }

    /// Seals the dealer configuration to P2 and sends it; returns the dealer's public state.
    pub async fn configure(
        &mut self,
        metric: Metric,
        threshold: f64,
        dim: usize,
        operator: &OperatorSigningKey,
    ) -> Result<DealerStatus> {
        let sealed = seal_dealer_config(
            &DealerConfig {
                metric,
                dim,
                threshold,
            },
            &self.sealer.keys[2],
            &mut self.sealer.rng,
        )
        .map_err(|e| anyhow!("{e}"))?;
        // Signed by P2's operator: P2 refuses a configuration its operator did not sign, or
        // one replayed, whoever relays it.
        let command = operator.sign(
            PartyIndex::ALL[2],
            fresh_counter(),
            DEALER_CONFIG_ACTION,
            &sealed,
        );
        let body = FaceConfigureBody {
            config: to_base64(&command),
        };
        Ok(self.coordinator.post("/v1/face/configure", &body).await?)
    }

    /// The dealer's state (`GET /v1/face/dealer`).
    pub async fn dealer(&self) -> Result<FaceDealerResponse> {
        Ok(self.coordinator.get("/v1/face/dealer").await?)
    }

    /// The dealing made ahead of time for the next identification, once no refill runs
    /// (`GET /v1/face/stock`).
    pub async fn stock(&self) -> Result<crate::face::stock::StockStatus> {
        Ok(self.coordinator.get("/v1/face/stock").await?)
    }

    /// The embedding dimension the dealer is configured for, if it can be asked.
    pub async fn dealer_dim(&self) -> Option<usize> {
        let state = self.dealer().await.ok()?;
        state.dealer.and_then(|d| usize::try_from(d.dim).ok())
    }

    /// Refuses embeddings (`what`) of another dimension than the dealer's, when it can be
    /// asked.
    pub async fn check_dim(&self, dim: usize, what: &str) -> Result<()> {
        if let Some(configured) = self.dealer_dim().await {
            if configured != dim {
                bail!(
                    "the face dealer is configured for dimension {configured}, but {what} have dimension {dim}"
                );
            }
        }
        Ok(())
    }

    /// Enrolls quantised records in batches of `batch_size` (each atomic across the parties).
    /// On an error, the batches before it are enrolled and the message says from which line
    /// to resume.
    pub async fn enroll(
        &mut self,
        records: &[FaceEnrollRecord],
        on_duplicate: &str,
        batch_size: usize,
        progress: bool,
    ) -> Result<EnrollTotals> {
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
        let bar = progress_bar(records.len(), !progress, "enrolling faces");
        let mut totals = EnrollTotals::default();
        for batch in records.chunks(batch_size) {
            let lines = BatchLines::of(batch.iter().map(|r| r.line));
            let requests: Vec<FaceEnrollRequest<'_>> = batch
                .iter()
                .map(|r| FaceEnrollRequest {
                    subject: &r.subject,
                    embedding: &r.embedding,
                })
                .collect();
            let (sealed, _) =
                seal_face_enrollment(&requests, &self.sealer.keys, &mut self.sealer.rng)
                    .map_err(|e| anyhow!("sealing lines {}..={}: {e}", lines.first, lines.last))?;
            // Each evaluator's envelope signed for it by the configured client, if any.
            let [e0, e1] = self.sealer.sign_each(FACE_ENROLL_PURPOSE, sealed);
            let body = FaceEnrollBody {
                on_duplicate: on_duplicate.to_owned(),
                envelopes: [to_base64(&e0), to_base64(&e1)],
            };
            let answer = self
                .coordinator
                .post::<_, FaceEnrollResponse>("/v1/face/enroll", &body)
                .await
                .map(|response| BatchAnswer {
                    enrolled: response.results.iter().map(|r| r.enrolled).collect(),
                    pending_recovery: response.pending_recovery,
                });
            account(&mut totals, &lines, answer, RECOVERY_SCOPE, &bar)?;
        }
        bar.finish_and_clear();
        Ok(totals)
    }

    /// Deletes a subject's face template; returns the number deleted (0 or 1).
    pub async fn delete(&self, subject: &str) -> Result<i64> {
        let body = FaceDeleteBody {
            subject: subject.to_owned(),
        };
        let answer: FaceDeleteResponse = self.coordinator.post("/v1/face/delete", &body).await?;
        for pending in &answer.pending_recovery {
            eprintln!("warning: deletion committed; recovery will complete it at {pending}");
        }
        Ok(answer.deleted)
    }

    /// POSTs a probe body, sealed afresh for every attempt with a fresh session id and a fresh
    /// reply key (`body` gets the session id and the sealed probes of P0 and P1), retrying
    /// transient failures. Returns the answer with the openers of the sealed outputs of the
    /// attempt it answers (the last one).
    async fn post_probe<B: serde::Serialize, T: DeserializeOwned>(
        &mut self,
        path: &str,
        embedding: &[i32],
        target: Option<&str>,
        body: impl Fn(String, [String; 2]) -> B,
    ) -> Result<(T, FaceOpeners)> {
        let sealer = &mut self.sealer;
        // An identification tells the evaluators which subject list it knows already.
        let known = target.is_none().then_some(self.known.digest).flatten();
        let mut last: Option<(SessionId, PartySecretKey)> = None;
        let seal = || {
            let session = new_session_id(&mut rand::rngs::OsRng);
            // The id this session's lines carry in the coordinator's and the parties' logs.
            tracing::debug!(session = %hex::encode(session), "sealed a face probe");
            let reply = PartySecretKey::generate(&mut rand::rngs::OsRng);
            let sealed = seal_face_probe_knowing(
                embedding,
                session,
                target,
                known.as_ref(),
                &reply.public_key(),
                &sealer.keys,
                &mut sealer.rng,
            )
            .map_err(|e| CallError::Local(format!("sealing the probe: {e}")))?;
            last = Some((session, reply));
            let [p0, p1] = sealed;
            let signed = [
                sealer.sign_for(PartyIndex::ALL[0], FACE_PROBE_PURPOSE, p0),
                sealer.sign_for(PartyIndex::ALL[1], FACE_PROBE_PURPOSE, p1),
            ];
            Ok(body(
                session_to_hex(&session),
                signed.map(|p| to_base64(&p)),
            ))
        };
        let (result, attempts) = self.coordinator.post_retrying(path, seal).await;
        let answer = result.map_err(|e| e.after_attempts(attempts))?;
        let (session, reply) = last.ok_or_else(|| anyhow!("no probe was sealed"))?;
        let keys = &self.sealer.keys;
        Ok((
            answer,
            FaceOpeners::new([&keys[0], &keys[1]], &reply, &session),
        ))
    }

    /// 1:1: does the quantised `embedding` match `subject`'s template? Opens P0's and P1's
    /// sealed outputs; one the coordinator altered is refused, naming the party.
    pub async fn verify_quantized(&mut self, subject: &str, embedding: &[i32]) -> Result<bool> {
        // The subject is sealed inside the probe only: the body names none.
        let body = |session, probes| FaceVerifyBody {
            session,
            probes,
            subject: None,
        };
        // The parties' errors name no subject (the coordinator relays them): the client,
        // which knows it, names it here.
        let (answer, openers): (FaceVerifyResponse, _) = self
            .post_probe("/v1/face/verify", embedding, Some(subject), body)
            .await
            .with_context(|| format!("verifying subject {subject:?}"))?;
        let result = open_outputs(&openers, &answer.outputs, Some(subject))?;
        Ok(result.bits.first().copied().unwrap_or(false))
    }

    /// 1:N: which enrolled subjects does the quantised `embedding` match (sorted)? Also
    /// returns the number of templates compared.
    pub async fn identify_quantized(&mut self, embedding: &[i32]) -> Result<(Vec<String>, i64)> {
        let answer = self.identify_answer(embedding).await?;
        Ok((answer.matches, answer.comparisons))
    }

    /// 1:N as [`FaceClient::identify_quantized`], with the session's byte counts. Opens P0's
    /// and P1's sealed outputs; one the coordinator altered is refused, naming the party.
    pub async fn identify_answer(&mut self, embedding: &[i32]) -> Result<FaceIdentified> {
        let body = |session, probes| FaceIdentifyBody { session, probes };
        let (answer, openers): (FaceIdentifyResponse, _) = self
            .post_probe("/v1/face/identify", embedding, None, body)
            .await?;
        // Nothing enrolled: nothing compared, nothing sealed. Otherwise the compared subjects
        // come from inside the opened outputs (listed now, or in an earlier identification
        // whose list the parties sealed the digest of again), never from the coordinator.
        let (subjects, bits): (&[String], Vec<bool>) = if answer.comparisons == 0 {
            (&[], Vec::new())
        } else {
            let bits = open_identification(&openers, &answer.outputs, &mut self.known)?;
            (&self.known.subjects, bits)
        };
        if subjects.len() as i64 != answer.comparisons {
            bail!(
                "P0 and P1 sealed {} compared subjects, the coordinator reported {} comparisons",
                subjects.len(),
                answer.comparisons
            );
        }
        let mut matches: Vec<String> = subjects
            .iter()
            .zip(bits)
            .filter(|(_, m)| *m)
            .map(|(s, _)| s.clone())
            .collect();
        matches.sort();
        Ok(FaceIdentified {
            matches,
            comparisons: answer.comparisons,
            bytes_sent: answer.bytes_sent,
            key_bytes: answer.key_bytes,
            stocked: answer.stocked,
        })
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
/// Configures the dealer (`privmatch face configure`), signed by P2's operator key.
pub async fn configure(
    config: &Config,
    metric: Metric,
    threshold: f64,
    dim: usize,
    operator: &OperatorSigningKey,
) -> Result<DealerStatus> {
    FaceClient::new(config)?
        .configure(metric, threshold, dim, operator)
        .await
}

/// The dealer's state.
pub async fn dealer(config: &Config) -> Result<FaceDealerResponse> {
    FaceClient::new(config)?.dealer().await
}

/// Enrolls a whole NDJSON file (validated entirely before anything is sent).
pub async fn enroll_file(
    config: &Config,
    input: &Path,
    options: EmbeddingOptions,
    on_duplicate: &str,
    batch_size: usize,
    progress: bool,
) -> Result<EnrollTotals> {
    let records = read_enroll_file(input, options)?;
    FaceClient::new(config)?
        .enroll(&records, on_duplicate, batch_size, progress)
        .await
}

/// Deletes a subject's face template at P0 and P1; returns the number deleted.
pub async fn delete(config: &Config, subject: &str) -> Result<i64> {
    FaceClient::new(config)?.delete(subject).await
}

/// 1:1 verification of each embedding (elements in [−1, 1]; normalise first for cosine) against
/// `subject`: one bit per embedding.
pub async fn verify(config: &Config, subject: &str, embeddings: &[Vec<f64>]) -> Result<Vec<bool>> {
    each_embedding(config, embeddings, "verifying", async |client, q| {
        client.verify_quantized(subject, q).await
    })
    .await
}

/// 1:N identification of each embedding (elements in [−1, 1]): the matching subjects, sorted,
/// per embedding.
pub async fn identify(config: &Config, embeddings: &[Vec<f64>]) -> Result<Vec<Vec<String>>> {
    each_embedding(config, embeddings, "identifying", async |client, q| {
        Ok(client.identify_quantized(q).await?.0)
    })
    .await
}

/// Quantises every embedding, then runs `call` on each in order (`doing` names it in errors).
async fn each_embedding<T>(
    config: &Config,
    embeddings: &[Vec<f64>],
    doing: &str,
    mut call: impl AsyncFnMut(&mut FaceClient, &[i32]) -> Result<T>,
) -> Result<Vec<T>> {
    let quantized = quantize_all(embeddings)?;
    let mut client = FaceClient::new(config)?;
    let mut out = Vec::with_capacity(quantized.len());
    for (i, q) in quantized.iter().enumerate() {
        out.push(
            call(&mut client, q)
                .await
                .with_context(|| format!("{doing} embedding {i}"))?,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
