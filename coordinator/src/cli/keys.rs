//! What the client shares and seals with: the parties' keys pinned in the configuration
//! (never keys the coordinator reports) and a CSPRNG seeded from the operating system; and
//! `privmatch client pin|pins`, the only way a key gets into the configuration: from the
//! identity bundle a party's operator exported, after comparing the fingerprint the operator
//! gave out of band ([`crate::identity`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::party::PartyIndex;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use crate::cli::client_key::{wrap_for_party, ClientCredential};
use crate::config::Config;
use crate::identity::IdentityBundle;

/// Actions of `privmatch client`.
#[derive(Subcommand, Clone, Debug)]
pub enum ClientAction {
    /// Pin a party's key from the identity bundle its operator exported (`privmatch party
    /// identity-export`), after checking the bundle's signature and the fingerprint the
    /// operator gave you over a second channel (a call, a signed mail, paper). Writes the
    /// client configuration (`--config`), which must exist (`privmatch coordinator credential
    /// --client-config` makes one without party keys).
    Pin {
        /// The bundle file (JSON).
        #[arg(long)]
        bundle: PathBuf,
        /// The bundle's fingerprint as the party's operator told you (32 hex digits).
        #[arg(long)]
        fingerprint: String,
        /// Replace another identity pinned for the same party (a key rotation its operator
        /// announced).
        #[arg(long)]
        replace: bool,
    },
    /// List the pinned party identities and their fingerprints.
    Pins,
}

/// Runs `privmatch client …` on the client configuration at `config_path`.
pub fn run(action: &ClientAction, config_path: &Path) -> Result<()> {
    match action {
        ClientAction::Pin {
            bundle,
            fingerprint,
            replace,
        } => {
            let bundle = IdentityBundle::load(bundle)?;
            let mut config = Config::load(config_path)?;
            let identity = config.pin_identity(&bundle, fingerprint, *replace)?;
            // The CA path as written (relative to the configuration's directory, so the pair
            // can still be moved together), not as `load` resolved it.
            let written: Config = toml::from_str(&std::fs::read_to_string(config_path)?)
                .with_context(|| format!("invalid {}", config_path.display()))?;
            config.ca_cert = written.ca_cert;
            config.save(config_path)?;
            println!(
                "pinned P{}: key {} (identity fingerprint {}) in {}",
                identity.party,
                identity.public_key.to_hex(),
                identity.fingerprint_hex(),
                config_path.display()
            );
        }
        ClientAction::Pins => {
            let config = Config::load(config_path)?;
            for index in 0..3u8 {
                match config
                    .party_identities
                    .iter()
                    .find(|p| p.bundle.party == index)
                {
                    Some(pinned) => println!(
                        "P{index}: key {} identity fingerprint {}",
                        pinned.bundle.public_key, pinned.fingerprint
                    ),
                    None => println!("P{index}: not pinned"),
                }
            }
        }
    }
    Ok(())
}

/// A ChaCha20 CSPRNG seeded from the operating system: drawing every share coefficient from
/// the OS directly would cost a system call per draw.
pub fn sharing_rng() -> Result<ChaCha20Rng> {
    ChaCha20Rng::from_rng(rand::rngs::OsRng)
        .context("the operating system's random source is unavailable")
}

/// The pinned keys and the CSPRNG of one client.
pub struct Sealer {
    /// The three parties' pinned public keys, in index order.
    pub keys: [PartyPublicKey; 3],
    /// The CSPRNG shares are drawn from.
    pub rng: ChaCha20Rng,
    /// The registered client that signs the sealed probes, when the configuration (or the
    /// environment) names one.
    pub client: Option<ClientCredential>,
}

impl Sealer {
    /// The pinned keys of `config`, a fresh CSPRNG and the client credential of `config`
    /// (`client_id`, `client_key`) or of the environment (`PRIVMATCH_CLIENT_ID`,
    /// `PRIVMATCH_CLIENT_KEY`, which take precedence).
    pub fn new(config: &Config) -> Result<Self> {
        Ok(Sealer {
            keys: config.pinned_keys()?,
            rng: sharing_rng()?,
            client: client_credential(config)?,
        })
    }

    /// `sealed` (an input sealed to `party` for `purpose`) signed by the client, when there is
    /// one; unchanged otherwise.
    pub fn sign_for(&self, party: PartyIndex, purpose: &str, sealed: Vec<u8>) -> Vec<u8> {
        wrap_for_party(self.client.as_ref(), party, purpose, sealed)
    }

    /// The first `N` parties' sealed inputs (`sealed[p]` sealed to party `p` for `purpose`:
    /// an enrolment's envelopes, three for iris, two for faces) each signed for its party
    /// ([`Sealer::sign_for`]).
    pub fn sign_each<const N: usize>(&self, purpose: &str, sealed: [Vec<u8>; N]) -> [Vec<u8>; N] {
        sign_each(self.client.as_ref(), purpose, sealed)
    }
}

/// [`Sealer::sign_each`] with the credential `client` (unchanged without one), for sealing
/// threads that hold the credential without a whole [`Sealer`].
pub fn sign_each<const N: usize>(
    client: Option<&ClientCredential>,
    purpose: &str,
    sealed: [Vec<u8>; N],
) -> [Vec<u8>; N] {
    const { assert!(N <= 3, "privmatch has three parties") };
    let mut party = PartyIndex::ALL.into_iter();
    sealed.map(|blob| match party.next() {
        Some(p) => wrap_for_party(client, p, purpose, blob),
        None => blob,
    })
}

/// The client credential the environment or `config` names (both halves from one place):
/// `PRIVMATCH_CLIENT_ID` and `PRIVMATCH_CLIENT_KEY`, or the configuration's `client_id` and
/// `client_key`; `None` when neither names one.
pub fn client_credential(config: &Config) -> Result<Option<ClientCredential>> {
    let env_id = std::env::var("PRIVMATCH_CLIENT_ID").ok();
    let env_key = std::env::var_os("PRIVMATCH_CLIENT_KEY").map(PathBuf::from);
    let (id, key) = match (env_id, env_key) {
        (Some(id), Some(key)) => (Some(id), Some(key)),
        (None, None) => (config.client_id.clone(), config.client_key.clone()),
        _ => bail!("set both PRIVMATCH_CLIENT_ID and PRIVMATCH_CLIENT_KEY, or neither"),
    };
    match (id, key) {
        (Some(id), Some(key)) => ClientCredential::load(&key, &id)
            .map(Some)
            .with_context(|| format!("the client credential {id:?} ({})", key.display())),
        (None, None) => Ok(None),
        _ => bail!("the configuration must name both client_id and client_key, or neither"),
    }
}

/// The time a probe is sealed at (seconds since the Unix epoch): parties refuse probes older
/// than `privmatch_core::iris::probe::PROBE_LIFETIME_SECS`.
pub fn sealing_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use privmatch_core::crypto::client_auth::{unwrap, ClientId, ClientSigningKey};
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn each_envelope_is_signed_for_its_own_party_or_left_alone() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        let key = ClientSigningKey::generate(&mut rng);
        let public = key.verifying_key();
        let id = ClientId::new("kiosk").expect("id");
        let credential = ClientCredential::new(id.clone(), key);
        let sealed = [b"p0".to_vec(), b"p1".to_vec(), b"p2".to_vec()];
        let signed = sign_each(Some(&credential), "iris-enrol", sealed.clone());
        for (p, blob) in signed.iter().enumerate() {
            let (auth, inner) = unwrap(blob).expect("parses");
            let auth = auth.expect("signed");
            assert_eq!(inner, sealed[p].as_slice());
            assert_eq!(auth.client, id);
            let now = auth.expires_at - 1;
            auth.verify(&public, PartyIndex::ALL[p], "iris-enrol", inner, now)
                .expect("valid for its own party and purpose");
            let other = PartyIndex::ALL[(p + 1) % 3];
            assert!(auth
                .verify(&public, other, "iris-enrol", inner, now)
                .is_err());
        }
        // Two evaluators (faces): the first two parties.
        let [e0, e1] = sign_each(
            Some(&credential),
            "face-enrol",
            [b"a".to_vec(), b"b".to_vec()],
        );
        for (p, blob) in [e0, e1].iter().enumerate() {
            let (auth, _) = unwrap(blob).expect("parses");
            assert_eq!(auth.expect("signed").party, PartyIndex::ALL[p]);
        }
        // No credential: unchanged.
        assert_eq!(sign_each(None, "iris-enrol", sealed.clone()), sealed);
    }
}
