//! The terminal's Round 2 computed at the service provider (Game-Set-MATCH [ABMR20]: the SP
//! and the terminal T may collude, both semi-honest, so the SP does T's homomorphic work on
//! the record it stores). T seals its live capture w, its threshold and a session id to the
//! SP's party key (`privmatch_core::paillier::terminal`); the coordinator relays the box and
//! learns neither. The SP opens it, checks it names the device and protocol of the stored
//! record, checks its own σ and the expiry, and returns Round 2 for the device, signed with its
//! Ed25519 key over (protocol, session, device, policy threshold, expiry, hash of the message)
//! so that the device answers no Round 2 the relay wrote or changed (issue 34 item 10).
//!
//! Here: the SP's signature on every protocol's Round 2 ([`sign_round2`]) and Π1 (Fig. 3
//! Round 2), where T keeps no secret. What every Round 2 shares before (the input opened, the
//! record checked) is in [`super::input`]; Π2 and Π3, whose terminal keeps secrets until its
//! later rounds, are in [`super::sessions`].

use pgrx::prelude::*;
use privmatch_core::paillier::params::Protocol;
use privmatch_core::paillier::pi1::{Pi1Round1, Pi1Terminal};
use privmatch_core::paillier::signed_round2::SignedRound2;
use privmatch_core::paillier::terminal::TerminalInput;

use super::input::{checked_record, open_input, CheckedRecord};
use super::policy::{admit_round2, ROUND2_TTL_SECS};
use super::service::{load_service, signing_key};
use super::{raise_match, require_sp};
use crate::errors::log_session;

/// The SP's signature on a Round 2 it computed ([`SignedRound2`]: protocol, the terminal's
/// session id, the device, the policy `threshold`, an expiry [`ROUND2_TTL_SECS`] from `now`,
/// the terminal's reply key from its sealed input, SHA-256 of `payload`): the envelope the device checks against its pinned key before it
/// decrypts anything.
pub(super) fn sign_round2(
    function: &str,
    input: &TerminalInput,
    threshold: i64,
    now: i64,
    payload: Vec<u8>,
) -> Vec<u8> {
    let key = signing_key(function, &load_service(function));
    log_session(function, &input.session, "round 2 answered");
    SignedRound2 {
        protocol: input.protocol,
        session: input.session,
        device_id: input.device_id.clone(),
        threshold,
        expires_at: now.saturating_add(ROUND2_TTL_SECS),
        reply_key: input.reply_key,
        payload,
    }
    .sign(&key)
    .unwrap_or_else(|e| raise_match(function, e))
}

/// Π1 Round 2 ([ABMR20] §5, Fig. 3 Round 2) at the SP for the terminal: opens the terminal's
/// sealed input (w, threshold; 08P01 if it was not sealed to this party or was tampered with),
/// requires the session to have been opened by `paillier_session_open` in an earlier
/// transaction (budgets charged, threshold the policy's; see `policy.rs`), takes the stored
/// record of `device_id` as Round 1, and returns ⟦Mask(z + ρ)⟧ with the threshold
/// (`Pi1Round2`) inside the SP's signed envelope (core's `SignedRound2`), for the device to
/// check and decrypt (Round 3: the device learns ⟨u, w⟩ and sends the match bit). Nothing but
/// the session's Round 2 mark is stored.
#[pg_extern(volatile)]
fn paillier_pi1_round2(device_id: &str, terminal_input: &[u8]) -> Vec<u8> {
    const F: &str = "paillier_pi1_round2";
    let me = require_sp(F);
    let input = open_input(F, &me, terminal_input, Protocol::Pi1);
    let CheckedRecord { signed, now, .. } = checked_record(F, device_id, &input);
    let threshold = admit_round2(F, device_id, &input);
    let params = signed.record.params.clone();
    let round1 = Pi1Round1 {
        public_key: signed.record.public_key.clone(),
        template: signed.record.packed.clone(),
    }
    .to_bytes(&params);
    let mut terminal =
        Pi1Terminal::new(params, input.w.clone(), threshold).unwrap_or_else(|e| raise_match(F, e));
    let payload = terminal
        .round2(&round1, &mut rand::rngs::OsRng)
        .unwrap_or_else(|e| raise_match(F, e));
    sign_round2(F, &input, threshold, now, payload)
}
