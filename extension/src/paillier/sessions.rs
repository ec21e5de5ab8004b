//! Π2 and Π3 of Game-Set-MATCH [ABMR20] (§6.1; §7, Fig. 5) at the service provider, for the
//! terminal T: the SP runs T's Round 2 on the stored record, as for Π1 ([`super::matching`]),
//! and also T's later rounds, because T's secrets of the session (Π2: a, b and the threshold;
//! Π3: a, b, pad, the OT session id and the threshold, then the two labels of each output
//! wire) must outlive the call: they are kept between the calls in
//! `privmatch.paillier_sessions` as core's `Pi2Terminal::suspend` / `Pi3Terminal::suspend`
//! bytes, under the 16-byte session id of T's sealed input.
//!
//! The table is readable by no role, not dumped, UNLOGGED (the secrets are in no WAL record and
//! no replica; a crash drops the running sessions, whose terminals start again); a session
//! lives [`SESSION_TTL`] from its Round 2 and is swept by the next Round 2. T's last round
//! consumes the session whatever the device sent, once the message decodes: a refused X or
//! output label must not allow a second try (it would be another guess at a). A message that
//! does not decode (22P03) changes nothing: it reveals nothing and guesses nothing.
//!
//! What leaves the SP (0.12.0, issue 34 item 10): the messages for the device (ciphertexts
//! under its key; Round 4 sealed to the device's reply key inside the SP's signed envelope,
//! core's `SignedRound4`) and T's decision sealed to the terminal's reply key with the SP's
//! signature inside (core's `sealed::TerminalVerdict`). The coordinator, which relays them,
//! learns no decision, no validity bit and no output decoding. ⟨u, w⟩, which T learns in Π2,
//! never leaves the SP. Every device message (Round 3, Π3's Round 5) must carry the device's
//! signature for this session and round under the key of its record (28000 otherwise, the
//! session unchanged): the relay cannot splice a device's message into another session.
//!
//! The stored state is the terminal's reply key in front of core's suspended state: `"PMSR" |
//! version 1 | reply key (32) | state`.

use pgrx::prelude::*;
use privmatch_core::paillier::cipher::PublicKey;
use privmatch_core::paillier::device_signature::{self, Statement};
use privmatch_core::paillier::messages::MatchError;
use privmatch_core::paillier::params::{Params, Protocol};
use privmatch_core::paillier::pi2::{Pi2Round1, Pi2Terminal};
use privmatch_core::paillier::pi3::Pi3Terminal;
use privmatch_core::paillier::record::verify_round1_signature;
use privmatch_core::paillier::sealed::{
    self, DeviceOutcome, DeviceReply, Outcome, Purpose, TerminalVerdict,
};
use privmatch_core::paillier::signed_round2::{round3_digest, SignedRound4};
use privmatch_core::paillier::terminal::TerminalInput;
use privmatch_core::paillier::verdict::Verdict;
use zeroize::Zeroizing;

use super::input::{checked_record, open_input, stored_template, CheckedRecord};
use super::matching::sign_round2;
use super::policy::admit_round2;
use super::service::{load_service, signing_key};
use super::{raise_match, require_sp};
use crate::errors::{get_one, log_session, modify, parse_session_id, raise, run};

/// How long a session waits for the terminal's last round, from its Round 2 (SQL interval).
const SESSION_TTL: &str = "10 minutes";

/// Stage of a session whose terminal has sent Round 2 (awaits the device's Round 3).
const AFTER_ROUND2: i16 = 2;
/// Stage of a Π3 session whose terminal has sent Round 4 (awaits the device's Round 5).
const AFTER_ROUND4: i16 = 4;

/// What T's Round 2 returns: the message for the device and T's suspended state.
type Round2 = Result<(Vec<u8>, Zeroizing<Vec<u8>>), MatchError>;

/// The stored state's prefix: the terminal's reply key in front of core's suspended state.
const STATE_MAGIC: &[u8; 4] = b"PMSR";
const STATE_VERSION: u8 = 1;

/// The stored form of a session: the terminal's reply key, then `state`.
fn wrap_state(reply_key: &[u8; 32], state: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(37 + state.len()));
    out.extend_from_slice(STATE_MAGIC);
    out.push(STATE_VERSION);
    out.extend_from_slice(reply_key);
    out.extend_from_slice(state);
    out
}

/// [`wrap_state`] undone: (reply key, core's state); None for anything else (a state stored
/// by an earlier version).
fn unwrap_state(stored: &[u8]) -> Option<([u8; 32], &[u8])> {
    if stored.len() < 37 || &stored[..4] != STATE_MAGIC || stored[4] != STATE_VERSION {
        return None;
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(&stored[5..37]);
    Some((key, &stored[37..]))
}

/// T's Round 2 of Π2 or Π3 at the SP: the sealed input opened and checked (it names
/// `protocol` and `device_id`; 08P01, 22023), the record's σ and expiry checked, the session
/// opened by `paillier_session_open` in an earlier transaction with the policy's threshold
/// (`policy.rs`), the session id unused here (23505), then `respond(params, input, Round 1,
/// verify)` computes the message; its state is stored under the input's session id, and the
/// message is returned inside the SP's signed envelope (core's `SignedRound2`).
fn round2_with_session(
    function: &str,
    device_id: &str,
    terminal_input: &[u8],
    protocol: Protocol,
    respond: impl FnOnce(Params, TerminalInput, &[u8], &dyn Fn(&[u8], &[u8]) -> bool) -> Round2,
) -> Vec<u8> {
    let me = require_sp(function);
    let input = open_input(function, &me, terminal_input, protocol);
    run(
        function,
        &format!(
            "DELETE FROM privmatch.paillier_sessions WHERE created_at < now() - interval '{SESSION_TTL}'"
        ),
        &[],
    );
    let session = input.session;
    let in_use = || {
        raise(
            PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
            format!(
                "{function}: the session id {} is already in use",
                hex::encode(session)
            ),
            Some("the terminal draws a fresh random session id for every session"),
        )
    };
    if get_one::<bool>(
        function,
        "SELECT EXISTS (SELECT 1 FROM privmatch.paillier_sessions WHERE session = $1)",
        &[session.to_vec().into()],
    )
    .unwrap_or(false)
    {
        in_use();
    }
    let CheckedRecord { signed, key, now } = checked_record(function, device_id, &input);
    let threshold = admit_round2(function, device_id, &input);
    let params = signed.record.params.clone();
    // Round 1 as the device would present it (Fig. 5 Round 1): the SP's own record.
    let round1 = Pi2Round1 {
        public_key: signed.record.public_key.clone(),
        template: signed.record.packed.clone(),
        signature: signed.round1_signature(),
    }
    .to_bytes(&params);
    let verify = |message: &[u8], sigma: &[u8]| {
        verify_round1_signature(&key, now, message, sigma).is_ok_and(|id| id == device_id)
    };
    let (message, state) = respond(params, input.clone(), &round1, &verify)
        .unwrap_or_else(|e| raise_match(function, e));
    let state = wrap_state(&input.reply_key, &state);
    let stored = modify(
        function,
        "INSERT INTO privmatch.paillier_sessions (session, device_id, protocol, stage, state) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session) DO NOTHING RETURNING 1",
        &[
            session.to_vec().into(),
            device_id.into(),
            i16::from(protocol.code()).into(),
            AFTER_ROUND2.into(),
            state.as_slice().into(),
        ],
        |_| (),
    );
    if stored.is_empty() {
        in_use();
    }
    sign_round2(function, &input, threshold, now, message)
}

/// A running session of `protocol` at `stage`, locked for this transaction: its id, device id,
/// the parameters of the device's record and the suspended state. P0002 from `function` if there is none (never
/// begun, finished, expired, deleted with its device, or of another protocol or stage).
fn open_session(function: &str, session: &[u8], protocol: Protocol, stage: i16) -> OpenSession {
    let id = parse_session_id(function, "session", session);
    log_session(function, &id, "resumed");
    let rows = modify(
        function,
        &format!(
            "SELECT device_id, state FROM privmatch.paillier_sessions \
             WHERE session = $1 AND protocol = $2 AND stage = $3 \
             AND created_at >= now() - interval '{SESSION_TTL}' FOR UPDATE"
        ),
        &[
            id.to_vec().into(),
            i16::from(protocol.code()).into(),
            stage.into(),
        ],
        |row| {
            (
                row.get::<String>(1).unwrap_or_default(),
                Zeroizing::new(row.get::<Vec<u8>>(2).unwrap_or_default()),
            )
        },
    );
    let Some((device_id, state)) = rows.into_iter().next() else {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!(
                "{function}: no {} session {} awaiting this round (never begun, finished, \
                 refused, or older than {SESSION_TTL})",
                protocol.name(),
                hex::encode(id)
            ),
            Some("the terminal starts a new session with a fresh session id"),
        )
    };
    let record = stored_template(function, &device_id).record;
    let Some((reply_key, core_state)) = unwrap_state(&state) else {
        corrupted_state(
            function,
            MatchError::State("a state stored by an earlier version (no reply key)".into()),
        )
    };
    let core_state = Zeroizing::new(core_state.to_vec());
    OpenSession {
        id,
        device_id,
        params: record.params,
        device_key: record.public_key,
        reply_key,
        state: core_state,
    }
}

/// A session [`open_session`] found.
struct OpenSession {
    id: [u8; 16],
    device_id: String,
    params: Params,
    /// The Paillier key of the device's record: it signs the device's messages.
    device_key: PublicKey,
    /// The terminal's reply key (from its sealed input).
    reply_key: [u8; 32],
    state: Zeroizing<Vec<u8>>,
}

impl OpenSession {
    /// Requires the device's signature of its `message` of `round` in this session
    /// (`Statement::reply_message`, the statement the device signs for the coordinator too)
    /// under the key of its record: 28000 from `function` otherwise, nothing changed. So a
    /// message spliced from another session or written by the relay is refused before it is
    /// used (issue 34 item 10, Round 3–5 bound to session, device and round).
    fn require_device_signature(
        &self,
        function: &str,
        round: u8,
        message: &[u8],
        signature: &[u8],
    ) {
        let statement = Statement::reply_message(&self.device_id, &self.id, round, message);
        if device_signature::verify(&self.device_key, &statement, signature).is_err() {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
                format!(
                    "{function}: the Round {round} given is not signed by device {:?} for session {}                      (another session's message, or not the device's)",
                    self.device_id,
                    hex::encode(self.id)
                ),
                Some("the device signs each message with its enrolled key; nothing was changed"),
            );
        }
    }

    /// The SP's Round 4 for the device: `payload` sealed to the device's `reply_key`, in the
    /// SP's signed envelope bound to this session, the device and the device's `round3`.
    fn round4_for_device(
        &self,
        function: &str,
        protocol: Protocol,
        round3: &[u8],
        reply_key: &[u8; 32],
        payload: &[u8],
    ) -> Vec<u8> {
        let sealed = sealed::seal(
            reply_key,
            Purpose::DeviceRound4,
            &self.id,
            payload,
            &mut rand::rngs::OsRng,
        )
        .unwrap_or_else(|e| raise_match(function, e));
        let key = signing_key(function, &load_service(function));
        SignedRound4 {
            protocol,
            session: self.id,
            device_id: self.device_id.clone(),
            round3_digest: round3_digest(round3),
            payload: sealed,
        }
        .sign(&key)
        .unwrap_or_else(|e| raise_match(function, e))
    }

    /// The decision for the terminal: the outcome with the SP's signature of it, sealed to
    /// the terminal's reply key (core's `TerminalVerdict`).
    fn sealed_verdict(
        &self,
        function: &str,
        protocol: Protocol,
        matched: bool,
        valid: bool,
    ) -> Vec<u8> {
        TerminalVerdict {
            protocol,
            session: self.id,
            outcome: Outcome::of(matched, valid),
            signature: self.sign_verdict(function, protocol, matched, valid),
        }
        .seal(&self.reply_key, &mut rand::rngs::OsRng)
        .unwrap_or_else(|e| raise_match(function, e))
    }

    /// The SP's Ed25519 signature of the session's decision ([`Verdict`]), which the terminal
    /// checks against its pinned key: the coordinator relays it and cannot change it.
    fn sign_verdict(
        &self,
        function: &str,
        protocol: Protocol,
        matched: bool,
        valid: bool,
    ) -> Vec<u8> {
        let key = signing_key(function, &load_service(function));
        Verdict {
            protocol,
            session: self.id,
            device_id: &self.device_id,
            matched,
            valid,
        }
        .sign(&key)
        .to_vec()
    }
}

/// Removes a session (its terminal's last round).
fn consume_session(function: &str, session: &[u8]) {
    run(
        function,
        "DELETE FROM privmatch.paillier_sessions WHERE session = $1",
        &[session.to_vec().into()],
    );
}

/// A stored state that does not resume (XX001 from `function`).
fn corrupted_state(function: &str, e: MatchError) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("{function}: the stored session state: {e}"),
        None,
    )
}

/// A device message refused by Π3's garbling or OT layer is a message that does not decode
/// (22P03), like a wire error; everything else as [`raise_match`].
fn raise_pi3(function: &str, e: MatchError) -> ! {
    match e {
        MatchError::Garbled(_) => raise(
            PgSqlErrorCode::ERRCODE_INVALID_BINARY_REPRESENTATION,
            format!("{function}: {e}"),
            None,
        ),
        other => raise_match(function, other),
    }
}

/// Π2 Round 2 ([ABMR20] §6.1 Round 2) at the SP for the terminal: opens the terminal's sealed
/// input (which must be for Π2: 22023), checks that it names `device_id`, the stored record's
/// σ and expiry, draws the terminal's secrets a (a κ-bit prime) and b, and returns
/// ⟦Mask(a·z + Encode2(b) + ρ)⟧ (`Pi2Round2`) for the device. The terminal's state is kept
/// under the input's session id for [`paillier_pi2_round4`]; a session id already in use is
/// refused (23505).
#[pg_extern(volatile)]
fn paillier_pi2_round2(device_id: &str, terminal_input: &[u8]) -> Vec<u8> {
    const F: &str = "paillier_pi2_round2";
    round2_with_session(
        F,
        device_id,
        terminal_input,
        Protocol::Pi2,
        |params, input, round1, verify| {
            let TerminalInput { w, threshold, .. } = input;
            let mut terminal = Pi2Terminal::new(params, w, threshold)?;
            let message = terminal.round2(round1, verify, &mut rand::rngs::OsRng)?;
            Ok((message, terminal.suspend()?))
        },
    )
}

/// Π2 Round 4 ([ABMR20] §6.1 Round 4) at the SP for the terminal. `round3` is what the
/// device posted (core's `DeviceReply`: its reply key and `Pi2Round3`), `signature` the
/// device's signature of it for this session and Round 3 (28000 otherwise, the session
/// unchanged). X is checked against the session's a and b (a | (X − b), |IP′| ≤ ζ²), then T
/// decides [IP′ ≥ threshold] (⊥ for a device that cheated). One row: `message` the Round 4 for
/// the device — the outcome (match, no match or refused) sealed to the device's reply key, in
/// the SP's envelope signed over the session, device and SHA-256 of `round3` (core's
/// `SignedRound4`), present whatever the outcome so that the relay cannot tell one from
/// another; `verdict` the outcome with the SP's Ed25519 signature of (Π2, session, device,
/// matched, valid) sealed to the terminal's reply key (core's `TerminalVerdict`). The
/// coordinator learns neither. The session is consumed either way, so a refused X cannot be
/// retried. A Round 3 that does not decode: 22P03, the session unchanged. No such session
/// (unknown, finished, expired): P0002. IP′ stays at the SP.
#[pg_extern(volatile)]
fn paillier_pi2_round4(
    session: &[u8],
    round3: &[u8],
    signature: &[u8],
) -> TableIterator<'static, (name!(message, Vec<u8>), name!(verdict, Vec<u8>))> {
    const F: &str = "paillier_pi2_round4";
    require_sp(F);
    let open = open_session(F, session, Protocol::Pi2, AFTER_ROUND2);
    open.require_device_signature(F, 3, round3, signature);
    let reply = DeviceReply::from_bytes(round3).unwrap_or_else(|e| raise_match(F, e));
    let mut terminal = Pi2Terminal::resume(open.params.clone(), &open.state)
        .unwrap_or_else(|e| corrupted_state(F, e));
    let (matched, valid) = match terminal.round4(&reply.message) {
        Ok((_, outcome)) => (outcome.matched, true),
        Err(MatchError::Cheating(_)) => (false, false),
        Err(e) => raise_match(F, e),
    };
    let for_device = DeviceOutcome(Outcome::of(matched, valid)).to_bytes();
    let message = open.round4_for_device(F, Protocol::Pi2, round3, &reply.reply_key, &for_device);
    let verdict = open.sealed_verdict(F, Protocol::Pi2, matched, valid);
    consume_session(F, session);
    TableIterator::once((message, verdict))
}

/// Π3 Round 2 ([ABMR20] Fig. 5 Round 2) at the SP for the terminal: opens the terminal's
/// sealed input (which must be for Π3: 22023), checks that it names `device_id`, the stored
/// record's σ and expiry, draws a, b and pad, and returns ⟦X̃⟧, ⟦Ỹ⟧ and the threshold
/// (`Pi3Round2`) for the device. The terminal's state is kept under the input's session id for
/// [`paillier_pi3_round4`]; a session id already in use is refused (23505).
#[pg_extern(volatile)]
fn paillier_pi3_round2(device_id: &str, terminal_input: &[u8]) -> Vec<u8> {
    const F: &str = "paillier_pi3_round2";
    round2_with_session(
        F,
        device_id,
        terminal_input,
        Protocol::Pi3,
        |params, input, round1, verify| {
            let TerminalInput { w, threshold, .. } = input;
            let mut terminal = Pi3Terminal::new(params, w, threshold)?;
            let message = terminal.round2(round1, verify, &mut rand::rngs::OsRng)?;
            Ok((message, terminal.suspend()?))
        },
    )
}

/// Π3 Round 4 ([ABMR20] Fig. 5 Round 4) at the SP for the terminal. `round3` is what the
/// device posted (core's `DeviceReply`: its reply key and the OT request `Pi3Round3`),
/// `signature` the device's signature of it for this session and Round 3 (28000 otherwise, the
/// session unchanged). Garbles the circuit of Fig. 6 and returns, in the SP's envelope signed
/// over the session, device and SHA-256 of `round3` (core's `SignedRound4`), the circuit with
/// the labels of pad, a, b, the OT answer and the output decoding (`Pi3Round4`) sealed to the
/// device's reply key: the relay, which also carries the output labels of Round 5, never sees
/// the decoding. The session then keeps only the two labels of each output wire, for
/// [`paillier_pi3_finish`]; this round cannot be repeated (a second call: P0002). A Round 3
/// that does not decode or whose OT request is not valid: 22P03, the session unchanged.
#[pg_extern(volatile)]
fn paillier_pi3_round4(session: &[u8], round3: &[u8], signature: &[u8]) -> Vec<u8> {
    const F: &str = "paillier_pi3_round4";
    require_sp(F);
    let open = open_session(F, session, Protocol::Pi3, AFTER_ROUND2);
    open.require_device_signature(F, 3, round3, signature);
    let reply = DeviceReply::from_bytes(round3).unwrap_or_else(|e| raise_match(F, e));
    let mut terminal = Pi3Terminal::resume(open.params.clone(), &open.state)
        .unwrap_or_else(|e| corrupted_state(F, e));
    let round4 = terminal
        .round4(&reply.message, &mut rand::rngs::OsRng)
        .unwrap_or_else(|e| raise_pi3(F, e));
    let message = open.round4_for_device(F, Protocol::Pi3, round3, &reply.reply_key, &round4);
    let state = terminal.suspend().unwrap_or_else(|e| raise_match(F, e));
    let state = wrap_state(&open.reply_key, &state);
    run(
        F,
        "UPDATE privmatch.paillier_sessions SET stage = $2, state = $3 WHERE session = $1",
        &[
            session.to_vec().into(),
            AFTER_ROUND4.into(),
            state.as_slice().into(),
        ],
    );
    message
}

/// Π3 output ([ABMR20] Fig. 5 "Output Computation") at the SP for the terminal: `round5` the
/// device's output labels (`Pi3Round5`), `signature` the device's signature of them for this
/// session and Round 5 (28000 otherwise, the session unchanged). The labels are decoded with
/// the session's output-wire labels: T's decision, or ⊥ when a label is not one of the two
/// made for its wire or the circuit's validity bit is 0 (a cheating device). Returns the
/// outcome with the SP's signature of (Π3, session, device, matched, valid) sealed to the
/// terminal's reply key (core's `TerminalVerdict`); the coordinator learns nothing of it. The
/// session is consumed either way. A Round 5 that does not decode: 22P03, the session
/// unchanged. No such session (unknown, finished, expired, or before Round 4): P0002.
#[pg_extern(volatile)]
fn paillier_pi3_finish(session: &[u8], round5: &[u8], signature: &[u8]) -> Vec<u8> {
    const F: &str = "paillier_pi3_finish";
    require_sp(F);
    let open = open_session(F, session, Protocol::Pi3, AFTER_ROUND4);
    open.require_device_signature(F, 5, round5, signature);
    let mut terminal = Pi3Terminal::resume(open.params.clone(), &open.state)
        .unwrap_or_else(|e| corrupted_state(F, e));
    let (matched, valid) = match terminal.finish(round5) {
        Ok(matched) => (matched, true),
        Err(MatchError::Cheating(_)) => (false, false),
        Err(e) => raise_pi3(F, e),
    };
    let verdict = open.sealed_verdict(F, Protocol::Pi3, matched, valid);
    consume_session(F, session);
    verdict
}
