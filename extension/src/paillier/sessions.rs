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
//! What leaves the SP: the messages for the device (ciphertexts under its key, the garbled
//! circuit and OT answer) and, to the coordinator, T's decision and whether the device's
//! answer was valid. ⟨u, w⟩, which T learns in Π2, never leaves the SP.

use pgrx::prelude::*;
use privmatch_core::paillier::malicious::{Pi2Round1, Pi2Terminal};
use privmatch_core::paillier::messages::MatchError;
use privmatch_core::paillier::no_leakage::Pi3Terminal;
use privmatch_core::paillier::params::{Params, Protocol};
use privmatch_core::paillier::record::verify_round1_signature;
use privmatch_core::paillier::terminal::TerminalInput;
use privmatch_core::paillier::verdict::Verdict;
use zeroize::Zeroizing;

use super::input::{checked_record, open_input, stored_template, CheckedRecord};
use super::matching::sign_round2;
use super::policy::admit_round2;
use super::service::{load_service, protocol_name, signing_key};
use super::{raise_match, require_sp};
use crate::errors::{get_one, modify, parse_session_id, raise, run};

/// How long a session waits for the terminal's last round, from its Round 2 (SQL interval).
const SESSION_TTL: &str = "10 minutes";

/// Stage of a session whose terminal has sent Round 2 (awaits the device's Round 3).
const AFTER_ROUND2: i16 = 2;
/// Stage of a Π3 session whose terminal has sent Round 4 (awaits the device's Round 5).
const AFTER_ROUND4: i16 = 4;

/// What T's Round 2 returns: the message for the device and T's suspended state.
type Round2 = Result<(Vec<u8>, Zeroizing<Vec<u8>>), MatchError>;

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
                protocol_name(protocol),
                hex::encode(id)
            ),
            Some("the terminal starts a new session with a fresh session id"),
        )
    };
    let params = stored_template(function, &device_id).record.params;
    OpenSession {
        id,
        device_id,
        params,
        state,
    }
}

/// A session [`open_session`] found.
struct OpenSession {
    id: [u8; 16],
    device_id: String,
    params: Params,
    state: Zeroizing<Vec<u8>>,
}

impl OpenSession {
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

/// Π2 Round 4 ([ABMR20] §6.1 Round 4) at the SP for the terminal: the device's X
/// (`Pi2Round3`) checked against the session's a and b (a | (X − b), |IP′| ≤ ζ²), then T's
/// decision [IP′ ≥ threshold]. One row: `message` the encoded bit for the device (`Pi2Round4`),
/// `matched` the decision, `valid` true; for a device that cheated (T outputs ⊥) `valid` is
/// false, `matched` false and `message` NULL (there is no bit to send; the coordinator tells the
/// device it was refused); `verdict` the SP's Ed25519 signature of (Π2, session, device,
/// matched, valid) (core's `Verdict`), which the terminal checks with its pinned key. The session is consumed either way, so a refused X cannot be
/// retried. A Round 3 that does not decode: 22P03, the session unchanged. No such session
/// (unknown, finished, expired): P0002. IP′ stays at the SP.
// The named columns must stay in the signature: pgrx generates the SQL from them.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile)]
fn paillier_pi2_round4(
    session: &[u8],
    round3: &[u8],
) -> TableIterator<
    'static,
    (
        name!(message, Option<Vec<u8>>),
        name!(matched, bool),
        name!(valid, bool),
        name!(verdict, Vec<u8>),
    ),
> {
    const F: &str = "paillier_pi2_round4";
    require_sp(F);
    let open = open_session(F, session, Protocol::Pi2, AFTER_ROUND2);
    let mut terminal = Pi2Terminal::resume(open.params.clone(), &open.state)
        .unwrap_or_else(|e| corrupted_state(F, e));
    let (message, matched, valid) = match terminal.round4(round3) {
        Ok((message, outcome)) => (Some(message), outcome.matched, true),
        Err(MatchError::Cheating(_)) => (None, false, false),
        Err(e) => raise_match(F, e),
    };
    let verdict = open.sign_verdict(F, Protocol::Pi2, matched, valid);
    consume_session(F, session);
    TableIterator::once((message, matched, valid, verdict))
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

/// Π3 Round 4 ([ABMR20] Fig. 5 Round 4) at the SP for the terminal: for the device's OT
/// request (`Pi3Round3`), garbles the circuit of Fig. 6 and returns it with the labels of pad,
/// a, b, the OT answer carrying the labels of X and Y, and the output decoding (`Pi3Round4`).
/// The session then keeps only the two labels of each output wire, for
/// [`paillier_pi3_finish`]; this round cannot be repeated (a second call: P0002). A Round 3
/// that does not decode or whose OT request is not valid: 22P03, the session unchanged.
#[pg_extern(volatile)]
fn paillier_pi3_round4(session: &[u8], round3: &[u8]) -> Vec<u8> {
    const F: &str = "paillier_pi3_round4";
    require_sp(F);
    let open = open_session(F, session, Protocol::Pi3, AFTER_ROUND2);
    let mut terminal =
        Pi3Terminal::resume(open.params, &open.state).unwrap_or_else(|e| corrupted_state(F, e));
    let message = terminal
        .round4(round3, &mut rand::rngs::OsRng)
        .unwrap_or_else(|e| raise_pi3(F, e));
    let state = terminal.suspend().unwrap_or_else(|e| raise_match(F, e));
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

/// Π3 output ([ABMR20] Fig. 5 "Output Computation") at the SP for the terminal: decodes the
/// device's output labels (`Pi3Round5`) with the session's output-wire labels. One row:
/// `matched` T's decision and `valid` true, or `valid` false (and `matched` false) when a label
/// is not one of the two made for its wire or the circuit's validity bit is 0 (a cheating
/// device); `verdict` the SP's signature of (Π3, session, device, matched, valid). The session is consumed either way. A Round 5 that does not decode: 22P03, the
/// session unchanged. No such session (unknown, finished, expired, or before Round 4): P0002.
#[pg_extern(volatile)]
fn paillier_pi3_finish(
    session: &[u8],
    round5: &[u8],
) -> TableIterator<
    'static,
    (
        name!(matched, bool),
        name!(valid, bool),
        name!(verdict, Vec<u8>),
    ),
> {
    const F: &str = "paillier_pi3_finish";
    require_sp(F);
    let open = open_session(F, session, Protocol::Pi3, AFTER_ROUND4);
    let mut terminal = Pi3Terminal::resume(open.params.clone(), &open.state)
        .unwrap_or_else(|e| corrupted_state(F, e));
    let (matched, valid) = match terminal.finish(round5) {
        Ok(matched) => (matched, true),
        Err(MatchError::Cheating(_)) => (false, false),
        Err(e) => raise_pi3(F, e),
    };
    let verdict = open.sign_verdict(F, Protocol::Pi3, matched, valid);
    consume_session(F, session);
    TableIterator::once((matched, valid, verdict))
}
