//! `privmatch device …` and `privmatch terminal …`: the two outside participants of
//! device-held face matching (packed Paillier, Game-Set-MATCH [ABMR20]). Parsing and printing;
//! the calls are [`crate::paillier::client`]'s.
//!
//! * `device keygen` writes the device's Paillier key (its own file, 0600, never overwritten,
//!   never printed); `device pin-service` pins the service provider in the client
//!   configuration; `device enroll` runs Π_en through the coordinator and keeps the signed
//!   record beside the key; `device respond` answers the sessions terminals open for the
//!   device (only Round 2 messages the pinned service provider signed); `device list` lists
//!   the records at the service provider, `device delete` deletes the device's own (signed
//!   with its key).
//! * `terminal verify` quantises a live capture, seals it with the threshold of the service
//!   provider's policy to the service provider, opens a session and waits for its outcome. Exit status: 0 match, 2 no match,
//!   3 refused (the service provider caught the device cheating, Π2/Π3), 1 any error
//!   (including a session that failed or expired).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use privmatch_core::paillier::quantize::Quantizer;
use serde::Serialize;

use crate::cli::http::CallError;
use crate::cli::keys::sharing_rng;
use crate::cli::ndjson::{emit, json_line};
use crate::config::{Config, ServicePin};
use crate::paillier::client::{serve, unix_now, Device, PaillierClient, Responder};
use crate::paillier::device::{
    answered_path, fingerprint, generate, load_key, load_record, record_path, save_record, Answered,
};
use crate::paillier::input::{quantize, read_embedding};
use privmatch_api::paillier::{parse_protocol, SessionState, DEFAULT_WAIT_MS, MAX_MESSAGES};
use privmatch_core::paillier::device_signature::DeviceSigner;

/// Failed polls in a row (a second apart) `device respond` rides out: a coordinator restart.
const MAX_POLL_FAILURES: u32 = 30;

/// Exit status of `terminal verify` when the capture does not match.
pub const EXIT_NO_MATCH: i32 = 2;
/// The action of the SP operator's signed deletion of a lost device (`paillier_delete_signed`).
pub const DELETE_ACTION: &str = "paillier-delete";

/// Exit status of `terminal verify` when the service provider refused the device's answer.
pub const EXIT_REFUSED: i32 = 3;

/// `privmatch device …`.
#[derive(Subcommand, Clone, Debug)]
pub enum DeviceAction {
    /// Generate the device's Paillier key into its own file (mode 0600; never overwritten;
    /// the key is never printed).
    Keygen {
        /// The key file to create.
        #[arg(long)]
        out: PathBuf,
        /// |N| in bits: 3072 or 2048 (the service provider's parameters decide which).
        #[arg(long, default_value_t = 3072)]
        bits: u32,
    },
    /// Pin the service provider in the client configuration: its party and the signing key
    /// its operator's `paillier_init_service()` returned (records are checked against it).
    PinService {
        /// The service provider's party index.
        #[arg(long)]
        party: u8,
        /// The public half of its signing key (64 hex digits).
        #[arg(long)]
        signing_key: String,
    },
    /// Enrol the device's face template (Π_en through the coordinator): one embedding,
    /// {"embedding": [floats]}, quantised here; the signed record is kept beside the key.
    Enroll(EnrollArgs),
    /// Answer the matching sessions terminals open for the device (long polls the
    /// coordinator); one NDJSON line per session.
    Respond(RespondArgs),
    /// The devices enrolled at the service provider (JSON).
    List,
    /// Delete the device's record at the service provider: signed with the device's key
    /// (`--key`), or, for a lost device, with the SP operator's key (`--operator-key`: a
    /// signed `paillier-delete` command the SP checks; the coordinator relays it).
    Delete {
        /// The device's key file (`privmatch device keygen`).
        #[arg(
            long,
            required_unless_present = "operator_key",
            conflicts_with = "operator_key"
        )]
        key: Option<PathBuf>,
        /// The SP operator's signing key file (`HOME/operators/p<SP>.signing.key` in a local
        /// cluster), for a device whose key is lost.
        #[arg(long)]
        operator_key: Option<PathBuf>,
        /// The device id.
        #[arg(long)]
        device: String,
    },
}

/// Options of `privmatch device enroll`.
#[derive(Args, Clone, Debug)]
pub struct EnrollArgs {
    /// The device's key file (`privmatch device keygen`).
    #[arg(long)]
    pub key: PathBuf,
    /// The device id (1 to 64 of A-Z a-z 0-9 . _ : -).
    #[arg(long)]
    pub device: String,
    /// pi1 (semi-honest), pi2 (malicious device; the terminal learns the score) or pi3
    /// (malicious device, no leakage).
    #[arg(long, value_parser = privmatch_core::paillier::params::Protocol::NAMES)]
    pub protocol: String,
    /// NDJSON with one face embedding (the `privmatch face` input format).
    #[arg(long)]
    pub input: PathBuf,
    /// Where to keep the signed record (default: KEY.DEVICE.record).
    #[arg(long)]
    pub record: Option<PathBuf>,
}

/// Options of `privmatch device respond`.
#[derive(Args, Clone, Debug)]
pub struct RespondArgs {
    /// The device's key file.
    #[arg(long)]
    pub key: PathBuf,
    /// The device id.
    #[arg(long)]
    pub device: String,
    /// The enrolment record (default: KEY.DEVICE.record).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Answer one session, then exit.
    #[arg(long, conflicts_with = "count")]
    pub once: bool,
    /// Answer this many sessions, then exit (default: until interrupted).
    #[arg(long)]
    pub count: Option<u64>,
}

/// `privmatch terminal …`.
#[derive(Subcommand, Clone, Debug)]
pub enum TerminalAction {
    /// Match a live capture against a device's enrolled template: prints the outcome; exit
    /// status 0 match, 2 no match, 3 refused (cheating device), 1 error.
    Verify(VerifyArgs),
}

/// Options of `privmatch terminal verify`.
#[derive(Args, Clone, Debug)]
pub struct VerifyArgs {
    /// The device to match against.
    #[arg(long)]
    pub device: String,
    /// NDJSON with one face embedding, the live capture.
    #[arg(long)]
    pub input: PathBuf,
    /// The device's protocol: pi1, pi2 or pi3.
    #[arg(long, value_parser = privmatch_core::paillier::params::Protocol::NAMES)]
    pub protocol: String,
    /// The cosine similarity the capture must reach (−1..1). The service provider's policy
    /// fixes the threshold: by default the terminal uses the policy's (relayed with the
    /// record); a value given here must quantise to it, or the SP refuses the session.
    #[arg(long, allow_hyphen_values = true)]
    pub threshold: Option<f64>,
    /// How long to wait for the device, in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One line of `device respond`.
#[derive(Serialize)]
struct ServedLine<'a> {
    device: &'a str,
    session: &'a str,
    protocol: &'a str,
    outcome: SessionState,
}

/// The outcome `terminal verify` prints.
#[derive(Serialize)]
struct VerdictLine<'a> {
    device: &'a str,
    protocol: &'a str,
    session: &'a str,
    outcome: SessionState,
    #[serde(rename = "match")]
    matched: bool,
}

/// Runs `privmatch device …`; `config_path` is the client configuration (`pin-service` writes
/// it), `config` loads it.
pub async fn run_device(
    action: &DeviceAction,
    config_path: &Path,
    config: impl FnOnce() -> Result<Config>,
) -> Result<()> {
    match action {
        DeviceAction::Keygen { out, bits } => {
            let public = generate(out, *bits)?;
            println!(
                "{}",
                serde_json::json!({
                    "key": out.display().to_string(),
                    "bits": public.modulus_bits(),
                    "fingerprint": fingerprint(&public),
                })
            );
            Ok(())
        }
        DeviceAction::PinService { party, signing_key } => {
            let mut config = config()?;
            let pin = ServicePin {
                party: *party,
                signing_key: signing_key.to_ascii_lowercase(),
            };
            pin.check()?;
            config.paillier_service = Some(pin);
            config.save(config_path)?;
            eprintln!(
                "pinned the Paillier service provider P{party} in {}",
                config_path.display()
            );
            Ok(())
        }
        DeviceAction::Enroll(args) => enroll(&config()?, args).await,
        DeviceAction::Respond(args) => respond(&config()?, args).await,
        DeviceAction::List => {
            let client = PaillierClient::new(&config()?)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&client.devices().await?)?
            );
            Ok(())
        }
        DeviceAction::Delete {
            key: None,
            operator_key: Some(operator_key),
            device,
        } => {
            let client = PaillierClient::new(&config()?)?;
            let operator = crate::cli::operator_key::load(operator_key)?;
            let sp = privmatch_core::party::PartyIndex::ALL
                .get(usize::from(client.service_party()))
                .copied()
                .context("the pinned service provider's party index")?;
            let command = operator.sign(
                sp,
                crate::cli::operator_key::fresh_counter(),
                DELETE_ACTION,
                device.as_bytes(),
            );
            let deleted = client.delete_by_operator(device, &command).await?;
            println!(
                "{}",
                serde_json::json!({"device": device, "deleted": deleted, "by": "operator"})
            );
            Ok(())
        }
        DeviceAction::Delete {
            key: None,
            operator_key: None,
            ..
        }
        | DeviceAction::Delete {
            key: Some(_),
            operator_key: Some(_),
            ..
        } => bail!("device delete: give exactly one of --key and --operator-key"),
        DeviceAction::Delete {
            key: Some(key),
            device,
            ..
        } => {
            let client = PaillierClient::new(&config()?)?;
            let secret = load_key(key)?;
            let signer = DeviceSigner::new(&secret).ok_or_else(|| {
                anyhow!("the device key has no signing exponent (not a Paillier key)")
            })?;
            let deleted = client.delete(device, &signer).await?;
            println!(
                "{}",
                serde_json::json!({"device": device, "deleted": deleted})
            );
            Ok(())
        }
    }
}

async fn enroll(config: &Config, args: &EnrollArgs) -> Result<()> {
    let protocol = parse_protocol(&args.protocol).map_err(|e| anyhow!("--protocol: {e}"))?;
    let secret = load_key(&args.key)?;
    let embedding = read_embedding(&args.input)?;
    let mut client = PaillierClient::new(config)?;
    let (params, aux) = client.enrolment_params(protocol).await?;
    if params.modulus_bits() != secret.public_key().modulus_bits() {
        bail!(
            "the service provider enrols {} devices with {}-bit keys; {} holds a {}-bit key (privmatch device keygen --bits {})",
            args.protocol,
            params.modulus_bits(),
            args.key.display(),
            secret.public_key().modulus_bits(),
            params.modulus_bits()
        );
    }
    let u = quantize(&args.input, &embedding, &params)?;
    let signed = client
        .enroll(&secret, &args.device, &params, &aux, &u)
        .await
        .with_context(|| format!("enrolling device {:?}", args.device))?;
    let path = args
        .record
        .clone()
        .unwrap_or_else(|| record_path(&args.key, &args.device));
    save_record(&path, &signed)?;
    println!(
        "{}",
        serde_json::json!({
            "device": args.device,
            "protocol": args.protocol,
            "expires_at": signed.record.expires_at,
            "record": path.display().to_string(),
        })
    );
    Ok(())
}

async fn respond(config: &Config, args: &RespondArgs) -> Result<()> {
    let limit = if args.once { Some(1) } else { args.count };
    let secret = load_key(&args.key)?;
    let client = PaillierClient::new(config)?;
    let path = args
        .record
        .clone()
        .unwrap_or_else(|| record_path(&args.key, &args.device));
    let signed = load_record(
        &path,
        &args.device,
        &secret,
        client.service_key(),
        unix_now(),
    )?;
    let signer = DeviceSigner::new(&secret)
        .ok_or_else(|| anyhow!("the device key has no signing exponent (not a Paillier key)"))?;
    let device = Device {
        id: &args.device,
        signer: &signer,
    };
    let responder = Responder::new(secret, &signed)?;
    // The sessions this device answered, kept beside its key: a replayed Round 2 is refused
    // even after a restart.
    let mut answered = Answered::load(&answered_path(&args.key, &args.device))?;
    let mut rng = sharing_rng()?;
    let (mut served, mut failed, mut unreachable) = (0u64, 0u64, 0u32);
    while limit.is_none_or(|l| served < l) {
        let room = limit.map_or(MAX_MESSAGES, |l| {
            usize::try_from(l - served).map_or(MAX_MESSAGES, |r| r.min(MAX_MESSAGES))
        });
        let messages = match client
            .mailbox(&args.device, &signer, DEFAULT_WAIT_MS, room)
            .await
        {
            Ok(messages) => {
                unreachable = 0;
                messages
            }
            // A busy or restarting coordinator: wait and poll again, for a while.
            Err(e)
                if (e.is_transient()
                    || matches!(e, CallError::Broken(_) | CallError::Unreachable(_)))
                    && unreachable < MAX_POLL_FAILURES =>
            {
                unreachable += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        for message in &messages {
            served += 1;
            match serve(
                &client,
                &device,
                &responder,
                message,
                &mut answered,
                &mut rng,
            )
            .await
            {
                Ok(done) => {
                    let line = json_line(&ServedLine {
                        device: &args.device,
                        session: &done.session,
                        protocol: done.protocol.name(),
                        outcome: done.state,
                    });
                    if !emit(&line)? {
                        return Ok(());
                    }
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {e:#}");
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {served} sessions failed");
    }
    Ok(())
}

/// Runs `privmatch terminal …`; returns the exit status (0 match, [`EXIT_NO_MATCH`],
/// [`EXIT_REFUSED`]); errors (exit 1) include a session that failed or expired.
pub async fn run_terminal(
    action: &TerminalAction,
    config: impl FnOnce() -> Result<Config>,
) -> Result<i32> {
    let TerminalAction::Verify(args) = action;
    let protocol = parse_protocol(&args.protocol).map_err(|e| anyhow!("--protocol: {e}"))?;
    let probe = read_embedding(&args.input)?;
    let mut client = PaillierClient::new(&config()?)?;
    let (signed, _, policy) = client.record_and_policy(&args.device).await?;
    let params = &signed.record.params;
    if params.protocol() != protocol {
        bail!(
            "device {:?} is enrolled for {}, not {}",
            args.device,
            params.protocol().name(),
            args.protocol
        );
    }
    let w = quantize(&args.input, &probe, params)?;
    let threshold = match (args.threshold, policy) {
        (Some(cosine), _) => Quantizer::new(params)?
            .quantize_threshold(cosine)
            .map_err(|e| anyhow!("--threshold: {e}"))?,
        (None, Some(theta)) => theta,
        (None, None) => bail!(
            "the service provider has no threshold policy for {}: its operator sets one \
             (privmatch.paillier_set_policy)",
            args.protocol
        ),
    };
    let session = client.open(&args.device, protocol, w, threshold).await?;
    let view = client
        .verified_outcome(
            &session,
            &args.device,
            protocol,
            &signed.record.public_key,
            Duration::from_secs(args.timeout),
        )
        .await?;
    let code = match view.state {
        SessionState::Match => 0,
        SessionState::NoMatch => EXIT_NO_MATCH,
        SessionState::Refused => EXIT_REFUSED,
        SessionState::Waiting | SessionState::Done => bail!(
            "session {}: device {:?} did not answer within {} s",
            view.session,
            args.device,
            args.timeout
        ),
        SessionState::Failed | SessionState::Expired => bail!(
            "session {} {}: {}",
            view.session,
            if view.state == SessionState::Failed {
                "failed"
            } else {
                "expired"
            },
            view.error.as_deref().unwrap_or("no reason given")
        ),
    };
    if args.json {
        println!(
            "{}",
            json_line(&VerdictLine {
                device: &args.device,
                protocol: &args.protocol,
                session: &view.session,
                outcome: view.state,
                matched: view.state == SessionState::Match,
            })
        );
    } else {
        println!(
            "{}",
            match view.state {
                SessionState::Match => "match",
                SessionState::NoMatch => "no match",
                _ => "refused: the device's answer was inconsistent (a cheating device)",
            }
        );
    }
    Ok(code)
}
