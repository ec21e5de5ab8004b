//! `privmatch party pin`: a party's operator pins a peer's key through the coordinator, as a
//! command signed with the operator's key (core's `crypto::sign`, action `peer-pin`). The
//! coordinator relays it to the party, which checks the signature and the counter; the
//! coordinator can neither forge nor replay a pin. (An operator with a database login may
//! instead call `privmatch.pin_peer` directly.)
//!
//! `privmatch party identity-export`: the operator's signed identity bundle for clients
//! ([`crate::identity`]), read from the party itself (its key, its operator key) and printed
//! with the fingerprint the operator gives out over a second channel.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::crypto::sign::{PeerPin, PEER_PIN_ACTION};
use privmatch_core::party::PartyIndex;

use crate::cli::http::Coordinator;
use crate::cli::operator_key::{self, fresh_counter};
use crate::config::{Config, OperatorConfig};
use crate::identity::{ca_digest, IdentityBundle, PartyIdentity};
use privmatch_api::wire::{to_base64, PinBody, PinResponse};

/// `privmatch party …`.
#[derive(Subcommand)]
pub enum PartyAction {
    /// Pin a peer's public key at a party, signed by that party's operator.
    Pin(PinArgs),
    /// As a party's operator: export the party's identity bundle for clients (its key, its
    /// TLS CA, the operator's key; signed by the operator's key) and print its fingerprint,
    /// which clients must get from you over a second channel. Connects to the party directly
    /// with the operator configuration, never through the coordinator.
    IdentityExport(ExportArgs),
}

/// Options of `privmatch party identity-export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The operator configuration (`privmatch operator init` or `cluster up` wrote it).
    #[arg(long)]
    pub operator_config: PathBuf,
    /// The party's TLS CA certificate (PEM; default: the configuration's `ca_cert`).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Write the bundle here and print the fingerprint; without it the bundle goes to standard
    /// output and the fingerprint to standard error.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// As the operator of `operator`'s party: reads the party's identity from the party itself,
/// checks it against the operator configuration (the key pinned there, the operator key the
/// party accepts commands from) and signs it with the operator's key; the bundle carries the
/// CA certificate `tls_ca`. Returns the bundle and what it vouches for.
pub async fn export_identity(
    operator: &OperatorConfig,
    tls_ca: &Path,
) -> Result<(IdentityBundle, PartyIdentity)> {
    let index = operator.party.index;
    let pem = std::fs::read_to_string(tls_ca)
        .with_context(|| format!("cannot read P{index}'s CA certificate {}", tls_ca.display()))?;
    let tls_ca_sha256 = ca_digest(&pem)
        .with_context(|| format!("P{index}'s CA certificate {}", tls_ca.display()))?;
    let signing = operator_key::load(&operator.signing_key)?;
    let client = crate::parties::open(&operator.party)
        .await
        .with_context(|| format!("connecting to P{index} as its operator"))?;
    let row = client
        .query_one(
            "SELECT party_index, public_key, signing_key FROM privmatch.party_info()",
            &[],
        )
        .await
        .with_context(|| format!("reading P{index}'s identity"))?;
    let (reported, key, signing_key): (i32, String, Option<String>) =
        (row.get(0), row.get(1), row.get(2));
    let signing_key = signing_key
        .and_then(|k| hex::decode(k).ok())
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .and_then(|b| ed25519_dalek::VerifyingKey::from_bytes(&b).ok())
        .with_context(|| {
            format!("P{index} shows no signing key: can its server read its key file?")
        })?;
    if reported != i32::from(index) {
        bail!("the database of the operator configuration is party P{reported}, not P{index}");
    }
    if !operator.party.public_key.is_empty() && operator.party.public_key != key {
        bail!(
            "P{index} reports key {key}, but the operator configuration pins {}: refusing to export",
            operator.party.public_key
        );
    }
    let accepted: Option<Vec<u8>> = client
        .query_one(
            "SELECT (SELECT public_key FROM privmatch.operator_key)",
            &[],
        )
        .await
        .with_context(|| format!("reading P{index}'s operator key"))?
        .get(0);
    let operator_key = signing.verifying_key();
    if accepted.as_deref() != Some(operator_key.to_bytes().as_slice()) {
        bail!(
            "P{index} does not accept commands from the operator key {}: set it first (privmatch operator init)",
            operator.signing_key.display()
        );
    }
    let identity = PartyIdentity {
        party: index,
        public_key: PartyPublicKey::from_hex(&key)
            .map_err(|e| anyhow::anyhow!("P{index}'s public key: {e}"))?,
        signing_key,
        operator_key: ed25519_dalek::VerifyingKey::from_bytes(&operator_key.to_bytes())
            .ok()
            .context("the operator's public key")?,
        tls_ca_sha256,
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut bundle = identity.sign(&signing, created)?;
    bundle.tls_ca_pem = Some(pem);
    // What a client will check, checked here first.
    bundle.verify()?;
    Ok((bundle, identity))
}

/// Writes `bundle` as a file (JSON; public, mode 0644).
pub fn save_bundle(bundle: &IdentityBundle, path: &Path) -> Result<()> {
    let text = serde_json::to_string_pretty(bundle)?;
    crate::files::write_atomic(path, &format!("{text}\n"), 0o644)
}

/// Options of `privmatch party pin`.
#[derive(Args)]
pub struct PinArgs {
    /// The party that pins (0, 1 or 2): its operator signs.
    #[arg(long)]
    pub party: u8,
    /// The peer whose key is pinned (0, 1 or 2, not --party).
    #[arg(long)]
    pub peer: u8,
    /// The peer's X25519 public key (64 hex digits), as its operator published it; compare
    /// its fingerprint out of band first.
    #[arg(long)]
    pub key: String,
    /// Replace a different key pinned before (a key rotation).
    #[arg(long)]
    pub replace: bool,
    /// The pinning party's operator signing key (default:
    /// HOME/operators/p<party>.signing.key, written by `privmatch cluster up`).
    #[arg(long, env = "PRIVMATCH_OPERATOR_KEY")]
    pub operator_key: Option<PathBuf>,
}

fn party_index(flag: &str, value: u8) -> Result<PartyIndex> {
    PartyIndex::new(i64::from(value)).with_context(|| format!("{flag} must be 0, 1 or 2"))
}

/// Signs the pin of `args` with the operator key and relays it through the coordinator.
pub async fn pin(config: &Config, home: &Path, args: &PinArgs) -> Result<PinResponse> {
    let party = party_index("--party", args.party)?;
    let peer = party_index("--peer", args.peer)?;
    let key = PartyPublicKey::from_hex(&args.key).context("--key")?;
    let key_path = args.operator_key.clone().unwrap_or_else(|| {
        home.join("operators")
            .join(format!("p{}.signing.key", args.party))
    });
    let operator = operator_key::load(&key_path)?;
    let payload = PeerPin {
        peer,
        key: *key.as_bytes(),
        replace: args.replace,
    }
    .encode();
    let command = operator.sign(party, fresh_counter(), PEER_PIN_ACTION, &payload);
    let body = PinBody {
        party: args.party,
        command: to_base64(&command),
    };
    Ok(Coordinator::new(config)
        .post("/v1/party/pin", &body)
        .await?)
}

/// Runs `privmatch party …`.
pub async fn run(
    action: &PartyAction,
    home: &Path,
    config: impl FnOnce() -> Result<Config>,
) -> Result<()> {
    match action {
        PartyAction::Pin(args) => {
            let answer = pin(&config()?, home, args).await?;
            println!(
                "P{} pinned P{}'s key (fingerprint {})",
                answer.party, args.peer, answer.fingerprint
            );
        }
        PartyAction::IdentityExport(args) => {
            let operator = OperatorConfig::load(&args.operator_config)?;
            let tls_ca = args
                .tls_ca
                .clone()
                .or_else(|| operator.party.ca_cert.clone())
                .context("pass --tls-ca: the operator configuration names no CA certificate")?;
            let (bundle, identity) = export_identity(&operator, &tls_ca).await?;
            let line = format!(
                "P{} identity fingerprint {} (give it to clients over a second channel)",
                identity.party,
                identity.fingerprint_hex()
            );
            match &args.out {
                Some(out) => {
                    save_bundle(&bundle, out)?;
                    println!("{line}");
                }
                None => {
                    println!("{}", serde_json::to_string_pretty(&bundle)?);
                    eprintln!("{line}");
                }
            }
        }
    }
    Ok(())
}
