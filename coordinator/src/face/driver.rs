//! The face comparison on the round-driver skeleton ([`crate::session::driver`]): one
//! verification (1:1) or identification (1:N) session across the two evaluators P0 and P1
//! (Funshade: Ibarrondo, Chabanne, Önen, PETS 2023, ePrint 2022/1688), relaying their sealed
//! messages and — as the verifier — adding their output shares into one bit per comparison.
//! P2 (the dealer) takes no part online.
//!
//! Protocol, as the parties expose it (schema `privmatch`):
//!
//! 1. `face_session_open(session, probe, subject, NULL, NULL)` at P0: P0 opens its sealed
//!    probe share, fixes the compared templates (one subject, or every enrolled one in subject
//!    order), claims fresh single-use keys from its pool and commits the claim. It answers the
//!    number of comparisons, the claim, the compared subjects and a digest of the session.
//! 2. `face_session_open(session, probe, subject, claims, digest)` at P1: P1 claims exactly
//!    P0's keys and checks that it compares the same templates (else SQLSTATE 40001: the
//!    template sets differ for a moment, and the client retries with a new session).
//! 3. Rounds 1–3, `face_session_round(session, round, inbound)` at P0 and P1 in parallel:
//!    round 1 (no inbound) answers the masked inputs; round 2 takes the peer's round-1
//!    message and answers the masked distance share; round 3 takes the peer's round-2 message
//!    and answers this party's output shares in clear (4 bytes per comparison, little-endian).
//! 4. The verifier reconstructs (`funshade::reconstruct`): o_0 + o_1 ∈ {0, 1} per comparison.
//!
//! An identification first compares cheap fingerprints of P0's and P1's template sets, so that
//! a transient difference is answered (SQLSTATE 40001, retry) before P0 claims — and burns —
//! one key per enrolled template; P1's digest check at open stays the authoritative one.
//!
//! With zero comparisons (nothing enrolled) there is nothing to evaluate: the answer is no
//! match. On any error or timeout the session is aborted at P0 and P1 (best effort); its
//! claimed keys are burnt, never reused. The session id is bound into the sealed probes, so
//! a retry needs freshly sealed probes: [`FaceErrorKind::is_retryable`] tells the caller when.

use std::time::Duration;

use privmatch_core::face::funshade::{bytes_to_words, reconstruct};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::SessionId;
use serde::{Deserialize, Serialize};
use tokio_postgres::{Client, Row};

use crate::face::api::FaceRequest;
use crate::parties::{column, Parties, PartyError};
use crate::session::driver::{
    call_with_timeout, relay, run_pooled, Rounds, Session, Step, Traffic,
};

/// The two evaluators.
const EVALUATORS: [PartyIndex; 2] = [PartyIndex::ALL[0], PartyIndex::ALL[1]];

/// Figures of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceStats {
    /// Comparisons evaluated (= keys consumed per evaluator).
    pub comparisons: i64,
    /// Bytes each evaluator emitted over the three rounds (P0, P1).
    pub bytes_sent: [u64; 2],
    /// Wall time from the first open to the reconstruction, in microseconds.
    pub micros: u64,
}

/// A finished session: the compared subjects, in the order of P0's open, and their bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaceOutcome {
    /// The compared subjects.
    pub subjects: Vec<String>,
    /// Per compared subject: whether it matched.
    pub matches: Vec<bool>,
    /// Figures.
    pub stats: FaceStats,
}

impl FaceOutcome {
    /// The subjects that matched, in comparison order.
    pub fn matched(&self) -> Vec<String> {
        self.subjects
            .iter()
            .zip(&self.matches)
            .filter(|(_, m)| **m)
            .map(|(s, _)| s.clone())
            .collect()
    }
}

/// What a party's error means for the face modality (from its SQLSTATE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaceErrorKind {
    /// 53000: the party's key pool is exhausted (run `privmatch face refill`).
    PoolExhausted,
    /// P0002: the subject is not enrolled.
    UnknownSubject,
    /// 22023 (and class 22): a bad argument, e.g. a probe of the wrong dimension.
    BadArgument,
    /// 40001: P0 and P1 compare different template sets (retry with a new session).
    SetsDiffer,
    /// 23P01 / 23505: a key claim conflicts with another (retry with a new session).
    KeyConflict,
    /// 08P01: a round message was refused (tampered, replayed or misrouted).
    Refused,
    /// 42704: the party does not know the session.
    SessionNotFound,
    /// 55000: the dealer is not configured or the party not initialised.
    NotConfigured,
    /// Anything else (including an unreachable party).
    Other,
}

impl FaceErrorKind {
    /// The kind of a SQLSTATE.
    pub fn from_sqlstate(sqlstate: Option<&str>) -> Self {
        match sqlstate {
            Some("53000") => FaceErrorKind::PoolExhausted,
            Some("P0002") => FaceErrorKind::UnknownSubject,
            Some("40001") => FaceErrorKind::SetsDiffer,
            Some("23P01" | "23505") => FaceErrorKind::KeyConflict,
            Some("08P01") => FaceErrorKind::Refused,
            Some("42704") => FaceErrorKind::SessionNotFound,
            Some("55000") => FaceErrorKind::NotConfigured,
            Some(s) if s.starts_with("22") => FaceErrorKind::BadArgument,
            _ => FaceErrorKind::Other,
        }
    }

    /// True when a new session (freshly sealed probes) may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, FaceErrorKind::SetsDiffer | FaceErrorKind::KeyConflict)
    }
}

/// Why a face session failed. The session was aborted at P0 and P1 (best effort).
#[derive(Debug, thiserror::Error)]
pub enum FaceSessionError {
    /// The request is malformed (nothing was sent to the parties).
    #[error("invalid face request: {0}")]
    Invalid(String),
    /// A party failed or could not be reached.
    #[error("face session failed at {0}")]
    Party(PartyError),
    /// A party did not answer within the per-call timeout (its call was cancelled).
    #[error("face session timed out at {0}")]
    Timeout(PartyError),
    /// The parties broke the protocol (disagree on the compared set, malformed outputs).
    #[error("face protocol error: {0}")]
    Protocol(String),
}

impl FaceSessionError {
    /// What a party's error means ([`FaceErrorKind::Other`] for everything else).
    pub fn kind(&self) -> FaceErrorKind {
        match self {
            FaceSessionError::Party(e) => FaceErrorKind::from_sqlstate(e.sqlstate.as_deref()),
            _ => FaceErrorKind::Other,
        }
    }
}

/// What a party answered to `face_session_open`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReply {
    /// Number of comparisons (templates compared).
    pub comparisons: i32,
    /// The key claim (P1 must claim exactly P0's).
    pub claims: Vec<u8>,
    /// The compared subjects, in comparison order.
    pub subjects: Vec<String>,
    /// Digest of the session (compared templates, claim, parameters).
    pub digest: Vec<u8>,
}

/// Checks P0's open: the count matches the subjects, and a verification compares exactly the
/// requested subject.
pub fn check_first_open(reply: &OpenReply, subject: Option<&str>) -> Result<(), String> {
    if reply.comparisons < 0 || reply.subjects.len() != reply.comparisons as usize {
        return Err(format!(
            "P0 opened {} comparisons but listed {} subjects",
            reply.comparisons,
            reply.subjects.len()
        ));
    }
    if let Some(subject) = subject {
        if reply.comparisons > 1 || reply.subjects.iter().any(|s| s != subject) {
            return Err(format!(
                "P0 opened a verification of {subject:?} comparing {:?}",
                reply.subjects.iter().take(3).collect::<Vec<_>>()
            ));
        }
    }
    if reply.comparisons > 0 && reply.claims.is_empty() {
        return Err("P0 opened comparisons without a key claim".into());
    }
    Ok(())
}

/// Checks that P1 opened the same session as P0 (same comparisons, subjects and digest).
pub fn check_second_open(p0: &OpenReply, p1: &OpenReply) -> Result<(), String> {
    if p1.comparisons != p0.comparisons {
        return Err(format!(
            "P0 opened {} comparisons, P1 {}",
            p0.comparisons, p1.comparisons
        ));
    }
    if !p1.subjects.is_empty() && p1.subjects != p0.subjects {
        return Err("P0 and P1 compare different subjects".into());
    }
    if !p1.digest.is_empty() && p1.digest != p0.digest {
        return Err("P0 and P1 report different session digests".into());
    }
    Ok(())
}

/// The verifier's step: the two parties' round-3 outputs (4 bytes per comparison each) into
/// one bit per comparison.
pub fn combine_outputs(comparisons: usize, o0: &[u8], o1: &[u8]) -> Result<Vec<bool>, String> {
    for (party, output) in [("P0", o0), ("P1", o1)] {
        if output.len() != 4 * comparisons {
            return Err(format!(
                "{party} returned {} output bytes for {comparisons} comparisons (expected {})",
                output.len(),
                4 * comparisons
            ));
        }
    }
    let words = |b: &[u8]| bytes_to_words(b).map_err(|e| e.to_string());
    reconstruct(&words(o0)?, &words(o1)?).map_err(|e| e.to_string())
}

crate::session_error!(FaceSessionError);

/// A party's face template set as an identification would compare it: (count, digest).
async fn set_fingerprint(client: &Client) -> Option<(i64, Vec<u8>)> {
    let row = client
        .query_one(
            "SELECT templates, digest FROM privmatch.face_template_set()",
            &[],
        )
        .await
        .ok()?;
    Some((row.try_get(0).ok()?, row.try_get(1).ok()?))
}

/// Before an identification claims keys at P0 (one per enrolled template), checks that P0
/// and P1 hold the same template set, so that the common transient mismatch (an enrolment or
/// deletion being committed, or awaiting recovery) costs no keys: P1's digest check at open
/// would refuse the session only after P0 has claimed — and burnt — them. Best effort: if a
/// fingerprint cannot be read, the authoritative check at P1's open decides.
async fn precheck_sets(clients: [&Client; 2]) -> Result<(), FaceSessionError> {
    let (a, b) = futures::join!(set_fingerprint(clients[0]), set_fingerprint(clients[1]));
    match (a, b) {
        (Some(a), Some(b)) if a != b => Err(FaceSessionError::Party(PartyError {
            party: EVALUATORS[1],
            sqlstate: Some("40001".into()),
            message: format!(
                "P0 holds {} face templates and P1 {}{}: an enrolment or deletion is being committed or awaits recovery; retry with a new session (no key was used)",
                a.0,
                b.0,
                if a.0 == b.0 { " with other subjects" } else { "" }
            ),
        })),
        _ => Ok(()),
    }
}

/// One face session as the round driver runs it.
struct FaceSession<'a> {
    request: &'a FaceRequest,
    timeout: Duration,
}

impl FaceSession<'_> {
    /// `face_session_open` at `party`; P1 gets P0's claim and digest (`first`).
    async fn open_at(
        &self,
        party: PartyIndex,
        client: &Client,
        first: Option<&OpenReply>,
    ) -> Result<OpenReply, FaceSessionError> {
        let request = self.request;
        let session: &[u8] = &request.session;
        let probe: &[u8] = &request.probes[party.as_usize()];
        let subject: Option<&str> = request.subject.as_deref();
        let claims: Option<&[u8]> = first.map(|r| r.claims.as_slice());
        let digest: Option<&[u8]> = first.map(|r| r.digest.as_slice());
        let sql = "SELECT comparisons, claims, subjects, digest \
                   FROM privmatch.face_session_open($1, $2, $3, $4, $5)";
        let row = call_with_timeout::<_, FaceSessionError>(
            party,
            client,
            "face_session_open",
            self.timeout,
            client.query_one(sql, &[&session, &probe, &subject, &claims, &digest]),
        )
        .await?;
        let reply = || {
            Ok(OpenReply {
                comparisons: column(party, &row, 0)?.unwrap_or(-1),
                claims: column(party, &row, 1)?.unwrap_or_default(),
                subjects: column(party, &row, 2)?.unwrap_or_default(),
                digest: column(party, &row, 3)?.unwrap_or_default(),
            })
        };
        reply().map_err(FaceSessionError::Party)
    }
}

impl Session<2> for FaceSession<'_> {
    type Output = FaceOutcome;
    type Error = FaceSessionError;
    const ABORT_SQL: &'static str = "SELECT privmatch.face_session_abort($1)";

    fn id(&self) -> &SessionId {
        &self.request.session
    }

    /// Open at P0, open at P1, rounds 1–3, reconstruction.
    async fn drive(&self, clients: [&Client; 2]) -> Result<FaceOutcome, FaceSessionError> {
        let [c0, c1] = clients;
        let [p0, p1] = EVALUATORS;
        let subject = self.request.subject.as_deref();
        if subject.is_none() {
            precheck_sets(clients).await?;
        }
        let first = self.open_at(p0, c0, None).await?;
        check_first_open(&first, subject).map_err(FaceSessionError::Protocol)?;
        let mut stats = FaceStats {
            comparisons: i64::from(first.comparisons),
            ..FaceStats::default()
        };
        if first.comparisons == 0 {
            // Nothing enrolled (identify): no keys were claimed, nothing to evaluate.
            return Ok(FaceOutcome {
                subjects: Vec::new(),
                matches: Vec::new(),
                stats,
            });
        }
        let second = self.open_at(p1, c1, Some(&first)).await?;
        check_second_open(&first, &second).map_err(FaceSessionError::Protocol)?;
        let mut traffic = Traffic::new();
        let outputs = relay(self, clients, 1..4, None, &mut traffic).await?;
        // The output shares go to the verifier (here), not to the other evaluator.
        traffic.count(&outputs);
        stats.bytes_sent = traffic.bytes_sent;
        let [o0, o1] = &outputs;
        let matches = combine_outputs(first.comparisons as usize, o0, o1)
            .map_err(FaceSessionError::Protocol)?;
        Ok(FaceOutcome {
            subjects: first.subjects,
            matches,
            stats,
        })
    }
}

impl Rounds<2> for FaceSession<'_> {
    type Reply = Vec<u8>;
    type Last = [Vec<u8>; 2];

    /// Round 1 (no inbound) answers the masked inputs; round 2 the masked distance share;
    /// round 3 the output shares.
    const ROUND_SQL: &'static str = "SELECT privmatch.face_session_round($1, $2, $3)";
    const ROUND_FUNCTION: &'static str = "face_session_round";

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn reply(&self, party: PartyIndex, round: i32, row: &Row) -> Result<Vec<u8>, FaceSessionError> {
        column(party, row, 0)
            .map_err(FaceSessionError::Party)?
            .ok_or_else(|| {
                FaceSessionError::Protocol(format!("{party} answered round {round} with NULL"))
            })
    }

    fn step(
        &self,
        round: i32,
        replies: [Vec<u8>; 2],
    ) -> Result<Step<2, [Vec<u8>; 2]>, FaceSessionError> {
        Ok(if round < 3 {
            Step::Relay(replies)
        } else {
            Step::Finished(replies)
        })
    }

    /// Each evaluator receives the other's message.
    fn route(&self, outbound: [Vec<u8>; 2]) -> [Vec<u8>; 2] {
        let [m0, m1] = outbound;
        [m1, m0]
    }
}

/// Checks a request before anything is sent.
fn validate(request: &FaceRequest) -> Result<(), FaceSessionError> {
    if let Some(subject) = &request.subject {
        privmatch_core::wire::envelope::validate_subject(subject)
            .map_err(|e| FaceSessionError::Invalid(format!("subject: {e}")))?;
    }
    if request.probes.iter().any(Vec::is_empty) {
        return Err(FaceSessionError::Invalid("empty sealed probe".into()));
    }
    Ok(())
}

/// Runs one face session on pooled connections to P0 and P1. On failure the session is
/// aborted at both (its claimed keys are burnt, never reused); connections go back to the
/// pools only after a success.
pub async fn run_face_session(
    parties: &Parties,
    request: &FaceRequest,
    timeout: Duration,
) -> Result<FaceOutcome, FaceSessionError> {
    validate(request)?;
    let session = FaceSession { request, timeout };
    let (mut outcome, elapsed) = run_pooled(parties, &session).await?;
    outcome.stats.micros = elapsed.as_micros() as u64;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(n: i32, subjects: &[&str], digest: u8) -> OpenReply {
        OpenReply {
            comparisons: n,
            claims: vec![1, 2, 3],
            subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
            digest: vec![digest; 32],
        }
    }

    #[test]
    fn sqlstates_map_to_kinds() {
        let kind = |s: &str| FaceErrorKind::from_sqlstate(Some(s));
        assert_eq!(kind("53000"), FaceErrorKind::PoolExhausted);
        assert_eq!(kind("P0002"), FaceErrorKind::UnknownSubject);
        assert_eq!(kind("22023"), FaceErrorKind::BadArgument);
        assert_eq!(kind("22P02"), FaceErrorKind::BadArgument);
        assert_eq!(kind("40001"), FaceErrorKind::SetsDiffer);
        assert_eq!(kind("23P01"), FaceErrorKind::KeyConflict);
        assert_eq!(kind("23505"), FaceErrorKind::KeyConflict);
        assert_eq!(kind("08P01"), FaceErrorKind::Refused);
        assert_eq!(kind("42704"), FaceErrorKind::SessionNotFound);
        assert_eq!(kind("55000"), FaceErrorKind::NotConfigured);
        assert_eq!(kind("XX000"), FaceErrorKind::Other);
        assert_eq!(FaceErrorKind::from_sqlstate(None), FaceErrorKind::Other);
        assert!(kind("40001").is_retryable() && kind("23P01").is_retryable());
        assert!(!kind("53000").is_retryable() && !kind("08P01").is_retryable());
        let err = FaceSessionError::Party(PartyError {
            party: PartyIndex::ALL[1],
            sqlstate: Some("40001".into()),
            message: String::new(),
        });
        assert_eq!(err.kind(), FaceErrorKind::SetsDiffer);
        assert_eq!(
            FaceSessionError::Protocol("x".into()).kind(),
            FaceErrorKind::Other
        );
    }

    #[test]
    fn opens_are_checked() {
        assert!(check_first_open(&open(2, &["a", "b"], 1), None).is_ok());
        assert!(check_first_open(&open(2, &["a"], 1), None).is_err());
        assert!(check_first_open(&open(1, &["a"], 1), Some("a")).is_ok());
        assert!(check_first_open(&open(1, &["b"], 1), Some("a")).is_err());
        assert!(check_first_open(&open(2, &["a", "a"], 1), Some("a")).is_err());
        assert!(check_first_open(&open(0, &[], 1), None).is_ok());
        let mut unclaimed = open(1, &["a"], 1);
        unclaimed.claims.clear();
        assert!(check_first_open(&unclaimed, None).is_err());

        let p0 = open(2, &["a", "b"], 1);
        assert!(check_second_open(&p0, &open(2, &["a", "b"], 1)).is_ok());
        assert!(check_second_open(&p0, &open(1, &["a"], 1)).is_err());
        assert!(check_second_open(&p0, &open(2, &["a", "c"], 1)).is_err());
        assert!(check_second_open(&p0, &open(2, &["a", "b"], 2)).is_err());
    }

    fn le(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn outputs_combine_into_bits() {
        let o0 = le(&[5, 7, u32::MAX]);
        let o1 = le(&[u32::MAX - 4, 4_294_967_290, 2]);
        assert_eq!(combine_outputs(3, &o0, &o1), Ok(vec![false, true, true]));
        // A sum that is not a bit, wrong lengths.
        assert!(combine_outputs(1, &le(&[3]), &le(&[3])).is_err());
        let err = combine_outputs(2, &le(&[1, 2]), &le(&[1]))
            .err()
            .unwrap_or_default();
        assert!(err.contains("P1 returned 4 output bytes"), "{err}");
        assert!(combine_outputs(0, &[], &[]).is_ok_and(|b| b.is_empty()));
    }

    #[test]
    fn matched_lists_the_subjects_whose_bit_is_set() {
        let outcome = FaceOutcome {
            subjects: vec!["a".into(), "b".into(), "c".into()],
            matches: vec![true, false, true],
            stats: FaceStats::default(),
        };
        assert_eq!(outcome.matched(), vec!["a".to_owned(), "c".to_owned()]);
    }
}
