//! The client side of device-held face templates (packed Paillier, Game-Set-MATCH: Agrawal,
//! Badrinarayanan, Mukherjee, Rindal, CCS 2020, ePrint 2020/1363 [ABMR20]) and its library
//! API: the device's enrolment Π_en ([`PaillierClient::enroll`]) and its side of matching
//! sessions ([`Responder`], [`serve`]), and the terminal's session ([`PaillierClient::open`],
//! [`PaillierClient::outcome`]), over the coordinator's HTTP API ([`privmatch_api::paillier`]).
//!
//! Trust: the coordinator only relays. What the client relies on comes from its own
//! configuration ([`ServicePin`]): the service provider's party (the terminal seals its input
//! to that party's pinned X25519 key) and its signing key (every record, at enrolment and
//! before a terminal uses one, is checked against it). The terminal signs its sealed input for
//! the SP's party with the registered client credential of its configuration (issue 34 item 4;
//! [`PaillierClient::seal_input`]). The device's key stays in its key
//! file; what it posts are protocol messages and, when it gives up, a fixed reason without
//! any decrypted value.
//!
//! Nothing the coordinator relays carries an outcome in the clear (0.12.0, issue 34 item 10):
//! the terminal puts a fresh reply key in its sealed input and opens the verdict sealed to it
//! (core's `sealed::TerminalVerdict`, believed only with the SP's or, in Π1, the device's
//! signature inside); the device sends a fresh reply key with its Round 3 and opens the Round 4
//! sealed to it, in the SP's envelope signed for this session, device and Round 3 (core's
//! `SignedRound4`). A device answers each session once ([`Answered`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ed25519_dalek::VerifyingKey;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::paillier::cipher::{PublicKey, SecretKey};
use privmatch_core::paillier::device_signature::{DeviceSigner, Statement};
use privmatch_core::paillier::enroll::DeviceEnrolment;
use privmatch_core::paillier::key_proof::RingPedersenParams;
use privmatch_core::paillier::params::{Params, Protocol};
use privmatch_core::paillier::pi1::Pi1Device;
use privmatch_core::paillier::pi2::Pi2Device;
use privmatch_core::paillier::pi3::Pi3Device;
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::sealed::{
    DeviceOutcome, DeviceReply, Outcome, Purpose, ReplySecret, TerminalVerdict,
};
use privmatch_core::paillier::signed_round2::{SignedRound2, SignedRound4};
use privmatch_core::paillier::terminal::{TerminalInput, TERMINAL_INPUT_PURPOSE};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::{new_session_id, SessionId};
use rand_chacha::ChaCha20Rng;

use crate::cli::client_key::{wrap_for_party, ClientCredential};
use crate::cli::http::{CallError, Coordinator};
use crate::cli::keys::{client_credential, sharing_rng};
use crate::config::{Config, ServicePin};
use crate::paillier::device::Answered;
use privmatch_api::paillier::{
    parse_protocol, unix_now_ms, DeleteBody, DeleteResponse, DeviceBody, DeviceMessage,
    DevicesResponse, EnrollBeginBody, EnrollBeginResponse, EnrollFinishBody, MailboxBody,
    MailboxResponse, RecordResponse, Reply, ReplyBody, ReplyResponse, ServiceInfo, SessionState,
    SessionView, VerifyBody, WaitBody, DEFAULT_WAIT_MS,
};
use privmatch_api::wire::{from_base64, session_from_hex, session_to_hex, to_base64};

/// The time now, in Unix seconds (record expiry).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn decode(text: &str, what: &str) -> Result<Vec<u8>> {
    from_base64(text, what).map_err(anyhow::Error::msg)
}

/// A client of the coordinator's Paillier endpoints, with the pinned service provider.
pub struct PaillierClient {
    coordinator: Coordinator,
    pin: ServicePin,
    service_key: VerifyingKey,
    seal_key: PartyPublicKey,
    rng: ChaCha20Rng,
    /// The registered client that signs the terminal's sealed inputs, when the configuration
    /// (or the environment) names one.
    client: Option<ClientCredential>,
    /// The reply keys of the sessions this terminal opened, by session id (one per session,
    /// taken when its verdict is opened).
    replies: Mutex<HashMap<SessionId, ReplySecret>>,
}

/// The most reply keys a terminal keeps for sessions whose verdict it has not opened yet.
const MAX_OPEN_SESSIONS: usize = 10_000;

impl PaillierClient {
    /// A client for the coordinator of `config`, with the client credential of `config`
    /// (`client_id`, `client_key`) or of the environment (`PRIVMATCH_CLIENT_ID`,
    /// `PRIVMATCH_CLIENT_KEY`) that signs the terminal's inputs; refused unless it pins the
    /// service provider, or when the credential it names does not load.
    pub fn new(config: &Config) -> Result<Self> {
        let pin = config.paillier_service.clone().context(
            "no Paillier service provider is pinned in the configuration: run `privmatch device pin-service --party <P> --signing-key <hex>` with the key its operator's paillier_init_service() returned",
        )?;
        let service_key = pin.verifying_key()?;
        let seal_key = config.pinned_keys()?[usize::from(pin.party)];
        Ok(PaillierClient {
            coordinator: Coordinator::new(config),
            pin,
            service_key,
            seal_key,
            rng: sharing_rng()?,
            client: client_credential(config)?,
            replies: Mutex::new(HashMap::new()),
        })
    }

    /// The pinned key that verifies the service provider's records.
    pub fn service_key(&self) -> &VerifyingKey {
        &self.service_key
    }

    /// The service provider's public material and parameter sets, as the coordinator relays
    /// them; refused unless they name the pinned party and key.
    pub async fn service_info(&self) -> Result<ServiceInfo> {
        let info: ServiceInfo = self.coordinator.get("/v1/paillier/enroll-params").await?;
        if info.party != self.pin.party
            || !info.signing_key.eq_ignore_ascii_case(&self.pin.signing_key)
        {
            bail!(
                "the coordinator reports service provider P{} with signing key {}, but P{} with {} is pinned: refusing to enrol",
                info.party,
                info.signing_key,
                self.pin.party,
                self.pin.signing_key
            );
        }
        Ok(info)
    }

    /// The parameters the service provider enrols `protocol`'s devices under.
    pub async fn enrolment_params(
        &self,
        protocol: Protocol,
    ) -> Result<(Params, RingPedersenParams)> {
        let info = self.service_info().await?;
        let name = protocol.name();
        let set = info
            .parameters
            .iter()
            .find(|s| s.protocol == name)
            .with_context(|| format!("the service provider enrols no device under {name}"))?;
        let params = Params::from_bytes(&decode(&set.params, "params")?)?;
        let aux = RingPedersenParams::from_bytes(&decode(&info.ring_pedersen, "ring_pedersen")?)
            .map_err(|e| anyhow!("the service provider's ring-Pedersen parameters: {e}"))?;
        Ok((params, aux))
    }

    /// Π_en ([ABMR20] §6.1, §8; Fig. 3 for Π1) of the quantised template `u` under `params`
    /// and the ring-Pedersen parameters `aux`: request, norm challenge and answer (Π2, Π3),
    /// then the signed record, verified against the pinned key (σ, device, parameters, key,
    /// and that the packing decrypts to u).
    pub async fn enroll(
        &mut self,
        secret: &SecretKey,
        device: &str,
        params: &Params,
        aux: &RingPedersenParams,
        u: &[i32],
    ) -> Result<SignedTemplate> {
        let session = new_session_id(&mut self.rng);
        // The device encrypts its ℓ + 4 coordinates and answers the norm challenge on every
        // core it has (most of its enrolment time).
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (state, request) = DeviceEnrolment::start_parallel(
            secret,
            params,
            device,
            u,
            aux,
            &session,
            threads,
            &mut self.rng,
        )?;
        let begin: EnrollBeginResponse = self
            .coordinator
            .post(
                "/v1/paillier/enroll-begin",
                &EnrollBeginBody {
                    device: device.to_owned(),
                    session: session_to_hex(&session),
                    request: to_base64(&request),
                },
            )
            .await?;
        let response = match &begin.challenge {
            Some(challenge) => Some(state.respond(&decode(challenge, "challenge")?)?),
            None => None,
        };
        let finish: RecordResponse = self
            .coordinator
            .post(
                "/v1/paillier/enroll-finish",
                &EnrollFinishBody {
                    device: device.to_owned(),
                    response: response.as_deref().map(to_base64),
                },
            )
            .await?;
        let record = decode(&finish.record, "record")?;
        Ok(state.finish(&record, &self.service_key, unix_now())?)
    }

    /// The record of `device` the service provider stores, checked against the pinned key
    /// (signature, expiry, device id): what a terminal takes the layout from.
    pub async fn record(&self, device: &str) -> Result<SignedTemplate> {
        Ok(self.record_and_policy(device).await?.0)
    }

    /// [`Self::record`], with the record's bytes and the threshold of the service provider's
    /// policy for its protocol as the coordinator relays it (None when no policy is set). The
    /// threshold needs no trust: the SP refuses an input with any other and signs the one it
    /// applies.
    pub async fn record_and_policy(
        &self,
        device: &str,
    ) -> Result<(SignedTemplate, Vec<u8>, Option<i64>)> {
        let answer: RecordResponse = self
            .coordinator
            .post(
                "/v1/paillier/device",
                &DeviceBody {
                    device: device.to_owned(),
                },
            )
            .await?;
        let bytes = decode(&answer.record, "record")?;
        let signed = SignedTemplate::from_bytes(&bytes)?;
        signed
            .verify(&self.service_key, unix_now())
            .with_context(|| format!("the record of device {device:?}"))?;
        if signed.record.device_id != device {
            bail!(
                "the coordinator answered the record of device {:?} for {device:?}",
                signed.record.device_id
            );
        }
        Ok((signed, bytes, answer.threshold))
    }

    /// Opens a matching session as the terminal ([ABMR20] Round 2 at the service provider):
    /// `w`, `threshold` and a fresh reply key sealed to the pinned service provider with a
    /// fresh session id, signed by the configured client ([`Self::seal_input`]). The reply
    /// key's secret stays in this client until the verdict is opened ([`Self::check_verdict`]).
    pub async fn open(
        &mut self,
        device: &str,
        protocol: Protocol,
        w: Vec<i32>,
        threshold: i64,
    ) -> Result<SessionId> {
        let (session, sealed) = self.seal_input(device, protocol, w, threshold)?;
        self.open_sealed(device, protocol, &session, &sealed)
            .await?;
        Ok(session)
    }

    /// The terminal's input of [`Self::open`] sealed to the pinned service provider, with a
    /// fresh session id and reply key (kept here for [`Self::check_verdict`]), and signed for
    /// the service provider's party and the purpose `paillier-terminal-input` by the
    /// configured client (core's `client_auth`: a fresh nonce, five minutes' validity; unsigned
    /// without a credential, which the SP accepts only under the client-auth policy
    /// `optional`): (session id, sealed input), for [`Self::open_sealed`].
    pub fn seal_input(
        &mut self,
        device: &str,
        protocol: Protocol,
        w: Vec<i32>,
        threshold: i64,
    ) -> Result<(SessionId, Vec<u8>)> {
        let session = new_session_id(&mut self.rng);
        let reply = ReplySecret::generate(&mut self.rng);
        let input = TerminalInput {
            protocol,
            session,
            device_id: device.to_owned(),
            threshold,
            reply_key: reply.public_key(),
            w,
        };
        {
            let mut replies = self.replies.lock().unwrap_or_else(|e| e.into_inner());
            if replies.len() >= MAX_OPEN_SESSIONS {
                replies.clear();
            }
            replies.insert(session, reply);
        }
        let party = PartyIndex::ALL[usize::from(self.pin.party)];
        let sealed = input.seal(party, &self.seal_key, &mut self.rng)?;
        let signed = wrap_for_party(self.client.as_ref(), party, TERMINAL_INPUT_PURPOSE, sealed);
        tracing::debug!(session = %session_to_hex(&session), "sealed a paillier terminal input");
        Ok((session, signed))
    }

    /// Opens a session with an input sealed elsewhere (`sealed`, for `session`).
    pub async fn open_sealed(
        &self,
        device: &str,
        protocol: Protocol,
        session: &SessionId,
        sealed: &[u8],
    ) -> Result<SessionView, CallError> {
        self.coordinator
            .post(
                "/v1/paillier/verify",
                &VerifyBody {
                    device: device.to_owned(),
                    protocol: protocol.name().to_owned(),
                    session: session_to_hex(session),
                    terminal_input: to_base64(sealed),
                },
            )
            .await
    }

    /// Waits up to `timeout` for `session` to end; its last state (`waiting` when the time ran
    /// out).
    pub async fn outcome(&self, session: &SessionId, timeout: Duration) -> Result<SessionView> {
        let started = Instant::now();
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            let wait_ms = (left.as_millis() as u64).min(DEFAULT_WAIT_MS);
            let view: SessionView = self
                .coordinator
                .post(
                    "/v1/paillier/outcome",
                    &WaitBody {
                        session: session_to_hex(session),
                        wait_ms,
                    },
                )
                .await?;
            if view.state.is_final() || started.elapsed() >= timeout {
                return Ok(view);
            }
        }
    }

    /// [`Self::outcome`] for a session this terminal opened for `device` under `protocol`,
    /// with the outcome opened and believed only as far as it is signed
    /// ([`Self::check_verdict`]): the view's `state` is then `match`, `no_match` or `refused`
    /// as the verdict says, or the coordinator's `waiting`, `failed` or `expired`.
    pub async fn verified_outcome(
        &self,
        session: &SessionId,
        device: &str,
        protocol: Protocol,
        device_key: &PublicKey,
        timeout: Duration,
    ) -> Result<SessionView> {
        let mut view = self.outcome(session, timeout).await?;
        view.state = self.check_verdict(session, device, protocol, device_key, &view)?;
        Ok(view)
    }

    /// The terminal's reading of a view the coordinator returned: a session that is `done`
    /// carries the verdict sealed to this session's reply key (core's `TerminalVerdict`),
    /// which is opened and believed only with its signature — for Π2 and Π3 the pinned SP
    /// key's over exactly that decision for this session and device (core's
    /// `paillier::verdict`), for Π1 the device's over its Round 3 bit with `device_key`, the
    /// key in the record the terminal checked against the pinned SP key ([ABMR20] Fig. 3
    /// Round 3). An outcome the coordinator states in the clear, a verdict missing, changed,
    /// moved from another session or device, or one this client has no reply key for is an
    /// error ("not trusted"). Other states are returned as they are.
    pub fn check_verdict(
        &self,
        session: &SessionId,
        device: &str,
        protocol: Protocol,
        device_key: &PublicKey,
        view: &SessionView,
    ) -> Result<SessionState> {
        let name = session_to_hex(session);
        match view.state {
            SessionState::Done => {}
            SessionState::Match | SessionState::NoMatch | SessionState::Refused => bail!(
                "session {name}: the coordinator reports {:?} in the clear; outcomes come only \
                 sealed to the terminal: not trusted",
                view.state
            ),
            other => return Ok(other),
        }
        let sealed = view.verdict.as_deref().with_context(|| {
            format!("session {name}: the coordinator reports it done without the sealed verdict: not trusted")
        })?;
        let sealed = decode(sealed, "verdict")?;
        let replies = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        let reply = replies.get(session).with_context(|| {
            format!("session {name}: this terminal did not open it (no reply key): not trusted")
        })?;
        let outcome = TerminalVerdict::open_and_check(
            reply,
            &sealed,
            session,
            protocol,
            device,
            &self.service_key,
            device_key,
        )
        .map_err(|e| anyhow!("session {name}: {e}: not trusted"))?;
        Ok(match outcome {
            Outcome::Match => SessionState::Match,
            Outcome::NoMatch => SessionState::NoMatch,
            Outcome::Refused => SessionState::Refused,
        })
    }

    /// Forgets the reply key of `session` (after its verdict was read).
    pub fn close(&self, session: &SessionId) {
        self.replies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
    }

    /// Round 2 of the sessions waiting for `device` (waits up to `wait_ms`; at most `max`),
    /// the poll signed with the device's key.
    pub async fn mailbox(
        &self,
        device: &str,
        signer: &DeviceSigner,
        wait_ms: u64,
        max: usize,
    ) -> Result<Vec<DeviceMessage>, CallError> {
        let time_ms = unix_now_ms();
        let signature = signer
            .sign(&Statement::mailbox(device, time_ms))
            .map_err(|e| CallError::Local(e.to_string()))?;
        let answer: MailboxResponse = self
            .coordinator
            .post(
                "/v1/paillier/mailbox",
                &MailboxBody {
                    device: device.to_owned(),
                    wait_ms,
                    max: Some(max),
                    time_ms,
                    signature: to_base64(&signature),
                },
            )
            .await?;
        Ok(answer.messages)
    }

    /// Posts the device's message of `round` (or gives the session up), signed with the
    /// device's key.
    pub async fn reply(
        &self,
        device: &str,
        signer: &DeviceSigner,
        session: &str,
        round: u8,
        reply: Reply,
    ) -> Result<ReplyResponse, CallError> {
        let id = session_from_hex(session, "session").map_err(CallError::Local)?;
        tracing::debug!(session = %session, round, "the device answers");
        let signature = signer
            .sign(&reply.statement(device, &id, round))
            .map_err(|e| CallError::Local(e.to_string()))?;
        let (message, error) = match reply {
            Reply::Message(m) => (Some(to_base64(&m)), None),
            Reply::Abandon(reason) => (None, Some(reason)),
        };
        self.coordinator
            .post(
                "/v1/paillier/reply",
                &ReplyBody {
                    device: device.to_owned(),
                    session: session.to_owned(),
                    round,
                    message,
                    error,
                    signature: to_base64(&signature),
                },
            )
            .await
    }

    /// Deletes `device`'s record at the service provider, as the device: the stored record is
    /// fetched and checked (σ under the pinned key, enrolled with `signer`'s key), and the
    /// deletion of exactly that record is signed with the device's key (core's
    /// `Statement::delete`), which the SP requires.
    pub async fn delete(&self, device: &str, signer: &DeviceSigner) -> Result<bool> {
        let (signed, bytes, _) = self.record_and_policy(device).await?;
        if &signed.record.public_key != signer.public_key() {
            bail!("device {device:?} is enrolled under another key than the one given");
        }
        let signature = signer.sign(&Statement::delete(device, &bytes))?;
        let answer: DeleteResponse = self
            .coordinator
            .post(
                "/v1/paillier/delete",
                &DeleteBody {
                    device: device.to_owned(),
                    signature: Some(to_base64(&signature)),
                    command: None,
                },
            )
            .await?;
        Ok(answer.deleted)
    }

    /// Deletes the record of a lost device at the service provider with its operator's
    /// signed command (core's `crypto::sign`, action `paillier-delete`, payload the device id),
    /// which the SP checks (`paillier_delete_signed`); the coordinator relays it and can neither
    /// forge nor replay it.
    pub async fn delete_by_operator(&self, device: &str, command: &[u8]) -> Result<bool> {
        let answer: DeleteResponse = self
            .coordinator
            .post(
                "/v1/paillier/delete",
                &DeleteBody {
                    device: device.to_owned(),
                    signature: None,
                    command: Some(to_base64(command)),
                },
            )
            .await?;
        Ok(answer.deleted)
    }

    /// The service provider's party index, as pinned.
    pub fn service_party(&self) -> u8 {
        self.pin.party
    }

    /// The enrolled devices.
    pub async fn devices(&self) -> Result<DevicesResponse> {
        Ok(self.coordinator.get("/v1/paillier/devices").await?)
    }
}

/// A device ready to answer matching sessions: its key and its enrolled record, for the
/// record's protocol.
#[derive(Debug)]
pub enum Responder {
    /// Π1 ([ABMR20] §5, Fig. 3).
    Pi1(Pi1Device),
    /// Π2 (§6).
    Pi2(Pi2Device),
    /// Π3 (§7, Fig. 5).
    Pi3(Pi3Device),
}

impl Responder {
    /// The device of `signed` (its own record, already checked) with its key.
    pub fn new(secret: SecretKey, signed: &SignedTemplate) -> Result<Self> {
        let record = &signed.record;
        let params = record.params.clone();
        let packed = record.packed.clone();
        Ok(match params.protocol() {
            Protocol::Pi1 => Responder::Pi1(Pi1Device::from_encrypted(params, secret, packed)?),
            Protocol::Pi2 => Responder::Pi2(Pi2Device::new(
                params,
                secret,
                packed,
                signed.round1_signature(),
            )?),
            Protocol::Pi3 => Responder::Pi3(Pi3Device::new(
                params,
                secret,
                packed,
                signed.round1_signature(),
            )?),
        })
    }

    /// The protocol it answers.
    pub fn protocol(&self) -> Protocol {
        match self {
            Responder::Pi1(_) => Protocol::Pi1,
            Responder::Pi2(_) => Protocol::Pi2,
            Responder::Pi3(_) => Protocol::Pi3,
        }
    }
}

/// One session a device answered, and what it learnt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// The session id (hex).
    pub session: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// `match`, `no_match`, or `refused` (the service provider refused the device's answer).
    pub state: SessionState,
}

/// A local refusal of a message: the session is given up at the coordinator with a reason
/// that carries no decrypted value, and the error (with its detail) is returned.
async fn give_up<T>(
    client: &PaillierClient,
    device: &Device<'_>,
    session: &str,
    round: u8,
    err: impl Into<anyhow::Error>,
) -> Result<T> {
    let reason = format!("the device refused Round {} of the session", round - 1);
    // Best effort: the session expires anyway if this does not arrive.
    let _ = client
        .reply(
            device.id,
            device.signer,
            session,
            round,
            Reply::Abandon(reason),
        )
        .await;
    Err(err
        .into()
        .context(format!("session {session}: Round {}", round - 1)))
}

/// A device as it talks to the coordinator: its id and the key that signs its polls and
/// replies.
#[derive(Clone, Copy, Debug)]
pub struct Device<'a> {
    /// The device id.
    pub id: &'a str,
    /// Its signing key (its Paillier key).
    pub signer: &'a DeviceSigner,
}

/// Answers one session whose Round 2 is `message` ([ABMR20]: Π1 Round 3; Π2 Rounds 3 and the
/// bit of Round 4; Π3 Rounds 3 and 5), posting the device's signed messages through `client`.
/// The Round 2 must carry the pinned service provider's signature for this device, protocol
/// and session, must not be one the device answered before (`answered`: a replayed Round 2),
/// and must decrypt into the honest range (Π2, Π3); otherwise the device gives the session up
/// with a fixed reason and answers nothing. Π1's Round 3 (the bit with the device's signature
/// of it) is sealed to the terminal's reply key the SP signed into Round 2; Π2's and Π3's
/// Round 3 carry a fresh reply key of the device, and Round 4 is accepted only in the SP's
/// envelope signed for this session, device and Round 3, sealed to that key.
pub async fn serve(
    client: &PaillierClient,
    device: &Device<'_>,
    responder: &Responder,
    message: &DeviceMessage,
    answered: &mut Answered,
    rng: &mut ChaCha20Rng,
) -> Result<Served> {
    let session = message.session.as_str();
    let protocol = parse_protocol(&message.protocol).map_err(anyhow::Error::msg)?;
    if protocol != responder.protocol() || message.round != 2 {
        let err = anyhow!(
            "a {} Round {} message for a {} device",
            message.protocol,
            message.round,
            responder.protocol().name()
        );
        return give_up(client, device, session, 3, err).await;
    }
    let envelope = decode(&message.message, "message")?;
    // Nothing is decrypted unless the pinned service provider signed this Round 2 for this
    // device, its protocol and this session (core's `signed_round2`): a Round 2 the relay wrote
    // or changed gets no answer, so no verdict. A session answered before is refused too.
    let id = session_from_hex(session, "session").map_err(anyhow::Error::msg)?;
    let now = unix_now();
    let round2 = match SignedRound2::open(
        &envelope,
        client.service_key(),
        device.id,
        responder.protocol(),
        &id,
        now,
    )
    .and_then(|verified| answered.admit(&verified, now).map(|()| verified))
    {
        Ok(verified) => verified,
        Err(e) => return give_up(client, device, session, 3, e).await,
    };
    let served = |state| Served {
        session: session.to_owned(),
        protocol,
        state,
    };
    match responder {
        Responder::Pi1(d) => {
            let (round3, outcome) = match d.round3_signed(&round2) {
                Ok(out) => out,
                Err(e) => return give_up(client, device, session, 3, e).await,
            };
            // The device's own output is the bit (its inner product stays here); the terminal
            // gets the bit with the device's signature of it, sealed to its reply key.
            let matched = outcome.matched;
            let signature = device
                .signer
                .sign(&Statement::reply_message(device.id, &id, 3, &round3))?;
            let sealed = TerminalVerdict {
                protocol,
                session: id,
                outcome: if matched {
                    Outcome::Match
                } else {
                    Outcome::NoMatch
                },
                signature,
            }
            .seal(round2.reply_key(), rng)?;
            client
                .reply(device.id, device.signer, session, 3, Reply::Message(sealed))
                .await?;
            Ok(served(SessionState::of_bit(matched)))
        }
        Responder::Pi2(d) => {
            let mut s = d.session();
            let round3 = match s.round3_signed(&round2) {
                Ok(m) => m,
                Err(e) => return give_up(client, device, session, 3, e).await,
            };
            let reply = ReplySecret::generate(rng);
            let posted = DeviceReply {
                reply_key: reply.public_key(),
                message: round3,
            }
            .to_bytes();
            let answer = client
                .reply(
                    device.id,
                    device.signer,
                    session,
                    3,
                    Reply::Message(posted.clone()),
                )
                .await?;
            let Some(next) = answer.next.filter(|n| n.round == 4) else {
                bail!("session {session}: the coordinator sent no Round 4");
            };
            let sealed = SignedRound4::open(
                &decode(&next.message, "Round 4")?,
                client.service_key(),
                device.id,
                Protocol::Pi2,
                &id,
                &posted,
            )
            .with_context(|| format!("session {session}"))?;
            let outcome =
                DeviceOutcome::from_bytes(&reply.open(Purpose::DeviceRound4, &id, &sealed)?)?;
            Ok(served(match outcome.0 {
                Outcome::Match => SessionState::Match,
                Outcome::NoMatch => SessionState::NoMatch,
                Outcome::Refused => SessionState::Refused,
            }))
        }
        Responder::Pi3(d) => {
            let mut s = d.session();
            let round3 = match s.round3_signed(&round2, rng) {
                Ok(m) => m,
                Err(e) => return give_up(client, device, session, 3, e).await,
            };
            let reply = ReplySecret::generate(rng);
            let posted = DeviceReply {
                reply_key: reply.public_key(),
                message: round3,
            }
            .to_bytes();
            let answer = client
                .reply(
                    device.id,
                    device.signer,
                    session,
                    3,
                    Reply::Message(posted.clone()),
                )
                .await?;
            let Some(next) = answer.next.filter(|n| n.round == 4) else {
                bail!("session {session}: the coordinator sent no Round 4");
            };
            let round4 = SignedRound4::open(
                &decode(&next.message, "Round 4")?,
                client.service_key(),
                device.id,
                Protocol::Pi3,
                &id,
                &posted,
            )
            .and_then(|sealed| reply.open(Purpose::DeviceRound4, &id, &sealed));
            let round4 = match round4 {
                Ok(r) => r,
                Err(e) => return give_up(client, device, session, 5, e).await,
            };
            let (round5, matched) = match s.round5(&round4) {
                Ok(out) => out,
                Err(e) => return give_up(client, device, session, 5, e).await,
            };
            client
                .reply(device.id, device.signer, session, 5, Reply::Message(round5))
                .await?;
            Ok(served(SessionState::of_bit(matched)))
        }
    }
}
