//! # The device's memory of the sessions it answered (issue 34 item 10)
//!
//! In [ABMR20] (Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint
//! 2020/1363) the terminal talks to the device once per session. In privmatch a Round 2 signed
//! by the service provider (`signed_round2.rs`) crosses the untrusted coordinator, which could
//! hand the same signed Round 2 to the device again until it expires; the device would answer
//! again (in Π3 with fresh oblivious-transfer choices, so a second evaluation of the same
//! garbled inputs). So a device answers each session id at most once: it remembers every
//! session whose Round 2 it accepted until that Round 2 can no longer be accepted (its signed
//! expiry plus the clock skew the device allows), and refuses a session it remembers.
//!
//! The text form ([`AnsweredSessions::to_text`]), which the device CLI keeps beside its key so
//! the memory survives a restart: a header line, then one line per session, `session-hex
//! forget-after` (Unix seconds), sorted by session id.

use std::collections::BTreeMap;

use super::messages::MatchError;
use super::signed_round2::{VerifiedRound2, CLOCK_SKEW_SECS};

/// The most sessions remembered at once. A device whose memory is full of sessions that have
/// not expired refuses new ones rather than forget one it might be asked again.
pub const MAX_ANSWERED: usize = 100_000;
const HEADER: &str = "privmatch-paillier-answered-sessions-v1";

/// The sessions a device answered, each until its Round 2 expires.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnsweredSessions {
    sessions: BTreeMap<[u8; 16], i64>,
}

impl AnsweredSessions {
    /// An empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many sessions are remembered.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Forgets the sessions whose Round 2 cannot be accepted any more at `now` (Unix seconds).
    pub fn prune(&mut self, now: i64) {
        self.sessions.retain(|_, forget_after| *forget_after >= now);
    }

    /// The device's check before it answers `round2` (already verified against the pinned SP
    /// key) at `now`: refused ([`MatchError::Unsigned`], "answered already") if its session was
    /// answered before, or if the memory is full; otherwise the session is remembered until
    /// its expiry plus [`CLOCK_SKEW_SECS`]. The caller persists the memory before it sends
    /// anything.
    pub fn admit(&mut self, round2: &VerifiedRound2, now: i64) -> Result<(), MatchError> {
        self.prune(now);
        let session = *round2.session();
        if self.sessions.contains_key(&session) {
            return Err(MatchError::Unsigned(format!(
                "session {} was answered already (a replayed Round 2)",
                hex::encode(session)
            )));
        }
        if self.sessions.len() >= MAX_ANSWERED {
            return Err(MatchError::Unsigned(format!(
                "the device remembers {MAX_ANSWERED} unexpired sessions already"
            )));
        }
        let forget_after = round2.fields().expires_at.saturating_add(CLOCK_SKEW_SECS);
        self.sessions.insert(session, forget_after);
        Ok(())
    }

    /// The text form (module documentation).
    pub fn to_text(&self) -> String {
        let mut out = String::with_capacity(HEADER.len() + 1 + 45 * self.sessions.len());
        out.push_str(HEADER);
        out.push('\n');
        for (session, forget_after) in &self.sessions {
            out.push_str(&hex::encode(session));
            out.push(' ');
            out.push_str(&forget_after.to_string());
            out.push('\n');
        }
        out
    }

    /// Strict decoding of [`Self::to_text`], naming the line that does not decode.
    pub fn from_text(text: &str) -> Result<Self, String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Err(format!("the first line is not {HEADER:?}"));
        }
        let mut sessions = BTreeMap::new();
        for (i, line) in lines.enumerate() {
            let bad = || format!("line {}: not \"<32 hex digits> <unix seconds>\"", i + 2);
            let (id, when) = line.split_once(' ').ok_or_else(bad)?;
            let bytes = hex::decode(id).map_err(|_| bad())?;
            let session: [u8; 16] = bytes.as_slice().try_into().map_err(|_| bad())?;
            let forget_after: i64 = when.parse().map_err(|_| bad())?;
            if sessions.insert(session, forget_after).is_some() || sessions.len() > MAX_ANSWERED {
                return Err(format!("line {}: a repeated session or too many", i + 2));
            }
        }
        Ok(Self { sessions })
    }
}

#[cfg(test)]
mod tests {
    use super::super::params::Protocol;
    use super::super::signed_round2::SignedRound2;
    use super::*;
    use ed25519_dalek::SigningKey;

    fn verified(session: [u8; 16], expires_at: i64) -> VerifiedRound2 {
        let sp = SigningKey::from_bytes(&[1u8; 32]);
        let bytes = SignedRound2 {
            protocol: Protocol::Pi1,
            session,
            device_id: "phone-1".into(),
            threshold: 5,
            expires_at,
            reply_key: [7u8; 32],
            payload: vec![1, 2],
        }
        .sign(&sp)
        .unwrap();
        SignedRound2::open(
            &bytes,
            &sp.verifying_key(),
            "phone-1",
            Protocol::Pi1,
            &session,
            expires_at - 10,
        )
        .unwrap()
    }

    #[test]
    fn a_session_is_answered_once_until_it_expires() {
        let mut memory = AnsweredSessions::new();
        let r = verified([1u8; 16], 1_000);
        assert!(memory.admit(&r, 990).is_ok());
        let again = memory.admit(&r, 995).unwrap_err();
        assert!(again.to_string().contains("answered already"), "{again}");
        assert!(memory.admit(&verified([2u8; 16], 1_000), 995).is_ok());
        // Kept across a restart: the text form round-trips, and refuses a changed line.
        let text = memory.to_text();
        let restored = AnsweredSessions::from_text(&text).unwrap();
        assert_eq!(restored, memory);
        let mut restored = restored;
        assert!(restored.admit(&r, 996).is_err());
        assert!(AnsweredSessions::from_text(&text.replace(' ', "x")).is_err());
        assert!(AnsweredSessions::from_text("junk\n").is_err());
        // Forgotten once the Round 2 could no longer be accepted anyway.
        restored.prune(1_000 + CLOCK_SKEW_SECS + 1);
        assert!(restored.is_empty());
    }
}
