//! `privmatch party pin`: a party's operator pins a peer's key through the coordinator, as a
//! command signed with the operator's key (core's `crypto::sign`, action `peer-pin`). The
//! coordinator relays it to the party, which checks the signature and the counter; the
//! coordinator can neither forge nor replay a pin. (An operator with a database login may
//! instead call `privmatch.pin_peer` directly.)

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::crypto::sign::{PeerPin, PEER_PIN_ACTION};
use privmatch_core::party::PartyIndex;

use crate::cli::http::Coordinator;
use crate::cli::operator_key::{self, fresh_counter};
use crate::config::Config;
use crate::wire::{to_base64, PinBody, PinResponse};

/// `privmatch party …`.
#[derive(Subcommand)]
pub enum PartyAction {
    /// Pin a peer's public key at a party, signed by that party's operator.
    Pin(PinArgs),
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
    let config = config()?;
    match action {
        PartyAction::Pin(args) => {
            let answer = pin(&config, home, args).await?;
            println!(
                "P{} pinned P{}'s key (fingerprint {})",
                answer.party, args.peer, answer.fingerprint
            );
        }
    }
    Ok(())
}
