//! The client side of device-held face templates (packed Paillier, Game-Set-MATCH: Agrawal,
//! Badrinarayanan, Mukherjee, Rindal, CCS 2020, ePrint 2020/1363 [ABMR20]) and its library
//! API: the device's enrolment Π_en ([`PaillierClient::enroll`]) and its side of matching
//! sessions ([`Responder`], [`serve`]), and the terminal's session ([`PaillierClient::open`],
//! [`PaillierClient::outcome`]), over the coordinator's HTTP API ([`crate::paillier::api`]).
//!
//! Trust: the coordinator only relays. What the client relies on comes from its own
//! configuration ([`ServicePin`]): the service provider's party (the terminal seals its input
//! to that party's pinned X25519 key) and its signing key (every record, at enrolment and
//! before a terminal uses one, is checked against it). The device's key stays in its key
//! file; what it posts are protocol messages and, when it gives up, a fixed reason without
//! any decrypted value.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use ed25519_dalek::VerifyingKey;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::paillier::cipher::{PublicKey, SecretKey};
use privmatch_core::paillier::device_signature::{self, DeviceSigner, Statement};
use privmatch_core::paillier::enroll::DeviceEnrolment;
use privmatch_core::paillier::key_proof::RingPedersenParams;
use privmatch_core::paillier::malicious::Pi2Device;
use privmatch_core::paillier::no_leakage::Pi3Device;
use privmatch_core::paillier::params::{Params, Protocol};
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::semi_honest::{Pi1Device, Pi1Round3};
use privmatch_core::paillier::signed_round2::SignedRound2;
use privmatch_core::paillier::terminal::TerminalInput;
use privmatch_core::paillier::verdict::Verdict;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::session::{new_session_id, SessionId};
use rand_chacha::ChaCha20Rng;

use crate::cli::http::{CallError, Coordinator};
use crate::cli::keys::sharing_rng;
use crate::config::{Config, ServicePin};
use crate::paillier::api::{
    parse_protocol, protocol_name, unix_now_ms, DeleteBody, DeleteResponse, DeviceBody,
    DeviceMessage, DevicesResponse, EnrollBeginBody, EnrollBeginResponse, EnrollFinishBody,
    MailboxBody, MailboxResponse, RecordResponse, Reply, ReplyBody, ReplyResponse, ServiceInfo,
    SessionState, SessionView, VerifyBody, WaitBody, DEFAULT_WAIT_MS,
};
use crate::wire::{from_base64, session_from_hex, session_to_hex, to_base64};

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
}

impl PaillierClient {
    /// A client for the coordinator of `config`; refused unless it pins the service provider.
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
        let name = protocol_name(protocol);
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
        let (state, request) =
            DeviceEnrolment::start(secret, params, device, u, aux, &session, &mut self.rng)?;
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
    /// `w` and `threshold` sealed to the pinned service provider with a fresh session id.
    pub async fn open(
        &mut self,
        device: &str,
        protocol: Protocol,
        w: Vec<i32>,
        threshold: i64,
    ) -> Result<SessionId> {
        let session = new_session_id(&mut self.rng);
        let input = TerminalInput {
            protocol,
            session,
            device_id: device.to_owned(),
            threshold,
            w,
        };
        let party = PartyIndex::ALL[usize::from(self.pin.party)];
        let sealed = input.seal(party, &self.seal_key, &mut self.rng)?;
        self.open_sealed(device, protocol, &session, &sealed)
            .await?;
        Ok(session)
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
                    protocol: protocol_name(protocol).to_owned(),
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
    /// believed only as far as it is signed: for Π2 and Π3 a final `match`, `no_match` or
    /// `refused` must carry the SP's signature of exactly that decision for this session and
    /// device (core's `paillier::verdict`), checked with the pinned key; for Π1 (where the
    /// device reports the bit, [ABMR20] Fig. 3 Round 3) the device's signature of its Round 3
    /// with `device_key`, the key in the record the terminal checked against the pinned SP
    /// key (core's `paillier::device_signature`). Otherwise it is an error, whatever the
    /// coordinator reports.
    pub async fn verified_outcome(
        &self,
        session: &SessionId,
        device: &str,
        protocol: Protocol,
        device_key: &PublicKey,
        timeout: Duration,
    ) -> Result<SessionView> {
        let view = self.outcome(session, timeout).await?;
        self.check_verdict(session, device, protocol, device_key, &view)?;
        Ok(view)
    }

    /// The check of [`Self::verified_outcome`] on a view the coordinator returned.
    pub fn check_verdict(
        &self,
        session: &SessionId,
        device: &str,
        protocol: Protocol,
        device_key: &PublicKey,
        view: &SessionView,
    ) -> Result<()> {
        let (matched, valid) = match view.state {
            SessionState::Match => (true, true),
            SessionState::NoMatch => (false, true),
            SessionState::Refused => (false, false),
            _ => return Ok(()),
        };
        let signer = if protocol == Protocol::Pi1 {
            "device's signed Round 3"
        } else {
            "service provider's signed verdict"
        };
        let signature = view.verdict.as_deref().with_context(|| {
            format!(
                "session {}: the coordinator reports {:?} without the {signer}: not trusted",
                session_to_hex(session),
                view.state
            )
        })?;
        let signature = decode(signature, "verdict")?;
        if protocol == Protocol::Pi1 {
            if !valid {
                bail!(
                    "session {}: the coordinator reports a Π1 session refused; Π1 has no refusal: not trusted",
                    session_to_hex(session)
                );
            }
            let round3 = Pi1Round3 { matched }.to_bytes();
            let statement = Statement::reply_message(device, session, 3, &round3);
            device_signature::verify(device_key, &statement, &signature).with_context(|| {
                format!(
                    "session {}: the coordinator reports {:?}, which device {device:?} did not sign: not trusted",
                    session_to_hex(session),
                    view.state
                )
            })?;
            return Ok(());
        }
        Verdict {
            protocol,
            session: *session,
            device_id: device,
            matched,
            valid,
        }
        .verify(&self.service_key, &signature)
        .with_context(|| format!("session {}", session_to_hex(session)))?;
        Ok(())
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
                    signature: to_base64(&signature),
                },
            )
            .await?;
        Ok(answer.deleted)
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
/// and session, and decrypt into the honest range (Π2, Π3); otherwise the device gives the
/// session up with a fixed reason and answers nothing.
pub async fn serve(
    client: &PaillierClient,
    device: &Device<'_>,
    responder: &Responder,
    message: &DeviceMessage,
    rng: &mut ChaCha20Rng,
) -> Result<Served> {
    let session = message.session.as_str();
    let protocol = parse_protocol(&message.protocol).map_err(anyhow::Error::msg)?;
    if protocol != responder.protocol() || message.round != 2 {
        let err = anyhow!(
            "a {} Round {} message for a {} device",
            message.protocol,
            message.round,
            protocol_name(responder.protocol())
        );
        return give_up(client, device, session, 3, err).await;
    }
    let envelope = decode(&message.message, "message")?;
    // Nothing is decrypted unless the pinned service provider signed this Round 2 for this
    // device, its protocol and this session (core's `signed_round2`): a Round 2 the relay wrote
    // or changed gets no answer, so no verdict.
    let id = session_from_hex(session, "session").map_err(anyhow::Error::msg)?;
    let round2 = match SignedRound2::open(
        &envelope,
        client.service_key(),
        device.id,
        responder.protocol(),
        &id,
        unix_now(),
    ) {
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
            // The device's own output is the bit it sends (its inner product stays here).
            let matched = outcome.matched;
            client
                .reply(device.id, device.signer, session, 3, Reply::Message(round3))
                .await?;
            Ok(served(SessionState::of_bit(matched)))
        }
        Responder::Pi2(d) => {
            let mut s = d.session();
            let round3 = match s.round3_signed(&round2) {
                Ok(m) => m,
                Err(e) => return give_up(client, device, session, 3, e).await,
            };
            let answer = client
                .reply(device.id, device.signer, session, 3, Reply::Message(round3))
                .await?;
            let Some(next) = answer.next else {
                return Ok(served(SessionState::Refused));
            };
            let matched = s.finish(&decode(&next.message, "Round 4")?)?;
            Ok(served(SessionState::of_bit(matched)))
        }
        Responder::Pi3(d) => {
            let mut s = d.session();
            let round3 = match s.round3_signed(&round2, rng) {
                Ok(m) => m,
                Err(e) => return give_up(client, device, session, 3, e).await,
            };
            let answer = client
                .reply(device.id, device.signer, session, 3, Reply::Message(round3))
                .await?;
            let Some(next) = answer.next.filter(|n| n.round == 4) else {
                bail!("session {session}: the coordinator sent no Round 4");
            };
            let (round5, matched) = match s.round5(&decode(&next.message, "Round 4")?) {
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
