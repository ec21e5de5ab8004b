//! The configuration files, split by who holds them (docs/trust-model.md):
//!
//! * [`Config`] (`privmatch.toml`), **the client's**: the coordinator's URL, the CA that
//!   signed its certificate, the client's API credential and the three pinned party keys,
//!   each with the identity bundle its operator signed ([`crate::identity`]; pinned by
//!   `privmatch client pin` after a fingerprint check). No database password. The client
//!   seals to the keys pinned here, never to keys the coordinator reports, and refuses a key
//!   that no verified bundle backs.
//! * [`CoordinatorConfig`] (`coordinator.toml`), **the coordinator's**: where it listens, its
//!   TLS key and certificate, the digests of the API credentials it accepts, and per party the
//!   endpoint and the credentials of its own login role (member of `privmatch_coordinator`:
//!   the protocol functions and nothing else).
//! * [`OperatorConfig`] (`operators/p<i>.toml`), **each party's operator's**: the endpoint and
//!   credentials of the operator's role at that one party, and the operator's signing key.
//!
//! `privmatch cluster up` writes all of them for a local cluster (each 0600); in a real
//! deployment each organisation writes its own, after comparing key fingerprints out of band.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use privmatch_core::crypto::seal::PartyPublicKey;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::identity::{IdentityBundle, PartyIdentity, PinnedIdentity};

/// Name of the client's configuration file inside the privmatch home directory.
pub const CONFIG_FILE: &str = "privmatch.toml";
/// Name of the coordinator's configuration file inside the privmatch home directory.
pub const COORDINATOR_CONFIG_FILE: &str = "coordinator.toml";

/// The operator configuration of party `index` inside the privmatch home directory.
pub fn operator_config_file(home: &Path, index: u8) -> PathBuf {
    home.join("operators").join(format!("p{index}.toml"))
}

/// One party's PostgreSQL endpoint and the role a holder of this file logs in as.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartyConfig {
    /// 0, 1 or 2.
    pub index: u8,
    /// Host of the party's PostgreSQL server.
    pub host: String,
    /// Port of the party's PostgreSQL server.
    pub port: u16,
    /// Database holding the extension.
    pub dbname: String,
    /// Role to connect as.
    pub user: String,
    /// Password of that role.
    pub password: String,
    /// The party's pinned X25519 public key (hex).
    pub public_key: String,
    /// The CA certificate (PEM) the party's server certificate must chain to: with it, the
    /// connection is TLS, verified against this CA and `host`; without it, plain (loopback
    /// development only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
}

impl PartyConfig {
    /// A tokio-postgres connection string. Keepalives and a TCP user timeout make a party
    /// that vanished (its host or container killed: no reset ever arrives) an error within
    /// about 20 s instead of a call that waits for the kernel's retransmissions (15 minutes),
    /// holding its caller and, in an enrolment, its batch. A party that is alive but busy
    /// acknowledges both, however long its call computes.
    ///
    /// `plan_cache_mode=force_generic_plan`: the coordinator's statements are single function
    /// calls, whose plan does not depend on the arguments; a custom plan would copy every bound
    /// argument into the plan as a constant, and round messages of iris searches are tens of MB.
    pub fn connection_string(&self) -> String {
        let sslmode = if self.ca_cert.is_some() {
            "require"
        } else {
            "disable"
        };
        format!(
            "host={} port={} dbname={} user={} password={} application_name=privmatch connect_timeout=5 \
             keepalives=1 keepalives_idle=5 keepalives_interval=2 keepalives_retries=3 \
             tcp_user_timeout=15 sslmode={sslmode} options='-c plan_cache_mode=force_generic_plan'",
            self.host, self.port, self.dbname, self.user, self.password
        )
    }

    /// The pinned key, parsed.
    pub fn pinned_key(&self) -> Result<PartyPublicKey> {
        PartyPublicKey::from_hex(&self.public_key)
            .with_context(|| format!("pinned key of party P{} in the configuration", self.index))
    }
}

/// Reads and parses a TOML configuration file; `what` names it in errors.
fn load_toml<T: DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read the {what} {} (run `privmatch cluster up` for a local cluster)",
            path.display()
        )
    })?;
    toml::from_str(&text).with_context(|| format!("invalid {what} {}", path.display()))
}

/// Writes `value` as TOML to `path` atomically, readable by its owner only (configurations
/// hold credentials).
pub fn save_toml<T: Serialize>(value: &T, path: &Path) -> Result<()> {
    let text = toml::to_string_pretty(value)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    crate::files::write_private(path, &text)
}

fn check_parties(parties: &[PartyConfig]) -> Result<()> {
    if parties.len() != 3 {
        bail!(
            "the configuration must list exactly 3 parties, found {}",
            parties.len()
        );
    }
    for (i, party) in parties.iter().enumerate() {
        if usize::from(party.index) != i {
            bail!(
                "parties must be listed in index order: entry {i} has index {}",
                party.index
            );
        }
        party.pinned_key()?;
    }
    Ok(())
}

/// The client's configuration file (`privmatch.toml`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Config {
    /// The coordinator's base URL (`https://host:port`; `http://` only on loopback).
    pub coordinator_url: String,
    /// The CA certificate (PEM) the coordinator's certificate must chain to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
    /// The client's API credential (`pm_<id>_<secret>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_token: Option<String>,
    /// The parties' pinned X25519 public keys (hex), in index order; empty, or an empty
    /// entry, for a party not pinned yet. Each key must be backed by an entry of
    /// `party_identities`.
    pub party_keys: Vec<String>,
    /// The identity bundles the keys were pinned from (`privmatch client pin`), re-verified
    /// on every load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub party_identities: Vec<PinnedIdentity>,
    /// The parties' pinned signing keys (Ed25519, 64 hex digits each, in index order, as
    /// `party_info()`'s `signing_key` shows them): what the client verifies the parties'
    /// signed search outputs with (`coordinator/src/iris/client.rs`). Empty: not verified.
    /// `privmatch client pin` fills them from the parties' identity bundles once all three are
    /// pinned; a key no pinned bundle backs is refused at load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub party_signing_keys: Vec<String>,
    /// The pinned service provider of device-held face templates (packed Paillier), when this
    /// client enrols devices or runs terminals: `privmatch device pin-service` writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paillier_service: Option<ServicePin>,
    /// The id under which the parties' operators registered this client
    /// (`privmatch client register`): with `client_key`, every sealed probe this client sends
    /// or seals for a front door is signed for its party (docs/deployment.md, "Registered
    /// clients"). Overridden by `PRIVMATCH_CLIENT_ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// This client's signing key file (`privmatch client keygen`). Overridden by
    /// `PRIVMATCH_CLIENT_KEY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
}

/// The pinned service provider of device-held face templates (packed Paillier, Game-Set-MATCH:
/// Agrawal et al., CCS 2020): which party it is, and the Ed25519 key that verifies its
/// signature σ on enrolment records. Devices and terminals check records against this key and
/// seal to this party's pinned X25519 key, never to what the coordinator reports.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServicePin {
    /// The service provider's party index (0, 1 or 2).
    pub party: u8,
    /// Its signing key's public half (64 hex digits), as `paillier_init_service()` returned
    /// it to the party's operator.
    pub signing_key: String,
}

impl ServicePin {
    /// Checks the party index and the key's form.
    pub fn check(&self) -> Result<()> {
        if self.party > 2 {
            bail!(
                "paillier_service.party must be 0, 1 or 2, not {}",
                self.party
            );
        }
        self.verifying_key()?;
        Ok(())
    }

    /// The signing key's public half.
    pub fn verifying_key(&self) -> Result<ed25519_dalek::VerifyingKey> {
        let bytes: [u8; 32] = hex::decode(&self.signing_key)
            .ok()
            .and_then(|b| b.try_into().ok())
            .context(
                "paillier_service.signing_key must be 64 hex digits (an Ed25519 public key)",
            )?;
        ed25519_dalek::VerifyingKey::from_bytes(&bytes)
            .ok()
            .context("paillier_service.signing_key is not an Ed25519 public key")
    }
}

impl Config {
    /// Reads and checks a client configuration file (a relative `ca_cert` names a file in
    /// the configuration's own directory).
    pub fn load(path: &Path) -> Result<Self> {
        let mut config: Config = load_toml(path, "privmatch client configuration")?;
        // A relative CA path names a file beside the configuration.
        if let (Some(ca), Some(dir)) = (&config.ca_cert, path.parent()) {
            if ca.is_relative() {
                config.ca_cert = Some(dir.join(ca));
            }
        }
        config
            .check_pins()
            .with_context(|| format!("in {}", path.display()))?;
        if let Some(pin) = &config.paillier_service {
            pin.check()
                .with_context(|| format!("in {}", path.display()))?;
        }
        config
            .check_transport()
            .with_context(|| format!("in {}", path.display()))?;
        Ok(config)
    }

    /// Writes the configuration (0600).
    pub fn save(&self, path: &Path) -> Result<()> {
        save_toml(self, path)
    }

    /// Checks that the coordinator is reached over TLS verified against a readable CA, or
    /// over plain HTTP on loopback only (a local development cluster).
    pub fn check_transport(&self) -> Result<()> {
        let url = self.coordinator_url();
        if let Some(rest) = url.strip_prefix("http://") {
            let host = rest.split([':', '/']).next().unwrap_or_default();
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                bail!("coordinator_url {url}: plain http:// is allowed on loopback only; use https:// with ca_cert");
            }
        } else if url.starts_with("https://") {
            let Some(ca) = &self.ca_cert else {
                bail!("coordinator_url {url} is https://: ca_cert must name the CA certificate its certificate chains to");
            };
            crate::tls::root_store(ca)?;
        } else {
            bail!("coordinator_url {url} must start with https:// (or http:// on loopback)");
        }
        Ok(())
    }

    /// The three pinned party keys, in index order; refused, naming the party, while one is
    /// not pinned.
    pub fn pinned_keys(&self) -> Result<[PartyPublicKey; 3]> {
        if !self.party_keys.is_empty() && self.party_keys.len() != 3 {
            bail!(
                "the configuration must pin exactly 3 party keys, found {}",
                self.party_keys.len()
            );
        }
        let key = |i: usize| {
            let text = self.party_keys.get(i).map_or("", String::as_str);
            if text.is_empty() {
                bail!(
                    "no key is pinned for P{i}: pin the identity bundle P{i}'s operator exported, with the fingerprint they gave you out of band: `privmatch client pin --bundle FILE --fingerprint HEX`"
                );
            }
            PartyPublicKey::from_hex(text)
                .with_context(|| format!("pinned key of party P{i} in the configuration"))
        };
        Ok([key(0)?, key(1)?, key(2)?])
    }

    /// Checks the pins: no key or three entries, each key (where pinned) backed by exactly one
    /// identity bundle of that party that verifies under the fingerprint recorded when it was
    /// pinned, and no bundle without its key. A key put in the file by hand, or by a tool that
    /// copied it from the coordinator, is refused, naming the party.
    pub fn check_pins(&self) -> Result<()> {
        if !self.party_keys.is_empty() && self.party_keys.len() != 3 {
            bail!(
                "the configuration must pin exactly 3 party keys, found {}",
                self.party_keys.len()
            );
        }
        let mut verified: [Option<PartyIdentity>; 3] = [None, None, None];
        for pinned in &self.party_identities {
            let identity = pinned.verify()?;
            let slot = &mut verified[usize::from(identity.party)];
            if slot.is_some() {
                bail!("P{} has two identity bundles pinned", identity.party);
            }
            *slot = Some(identity);
        }
        for (i, identity) in verified.iter().enumerate() {
            let key = self.party_keys.get(i).map_or("", String::as_str);
            match identity {
                None if key.is_empty() => {}
                None => bail!(
                    "P{i}'s key is not pinned from its operator's identity bundle (written by hand, or copied from the coordinator?): pin the bundle P{i}'s operator exported with `privmatch client pin --bundle FILE --fingerprint HEX`"
                ),
                Some(identity) => {
                    let parsed = PartyPublicKey::from_hex(key).ok();
                    if parsed.as_ref() != Some(&identity.public_key) {
                        bail!(
                            "P{i}'s key in party_keys is not the key of the identity bundle pinned for P{i}: refusing it"
                        );
                    }
                }
            }
        }
        // The signing keys results are verified with come from the same bundles, all three
        // or none (while a party is not pinned yet).
        if !self.party_signing_keys.is_empty() {
            if self.party_signing_keys.len() != 3 {
                bail!(
                    "party_signing_keys must pin exactly 3 keys, found {}",
                    self.party_signing_keys.len()
                );
            }
            for (i, identity) in verified.iter().enumerate() {
                let backed = identity.as_ref().is_some_and(|identity| {
                    self.party_signing_keys[i]
                        .eq_ignore_ascii_case(&hex::encode(identity.signing_key.as_bytes()))
                });
                if !backed {
                    bail!(
                        "P{i}'s signing key in party_signing_keys is not the one of the identity bundle pinned for P{i}: refusing it"
                    );
                }
            }
        }
        Ok(())
    }

    /// Pins `bundle` after verifying its signature and comparing its fingerprint with
    /// `fingerprint`, which the party's operator gave out of band. A party pinned before with
    /// another identity is refused unless `replace` (a deliberate key rotation); the same
    /// identity again changes nothing. Returns the identity pinned.
    pub fn pin_identity(
        &mut self,
        bundle: &IdentityBundle,
        fingerprint: &str,
        replace: bool,
    ) -> Result<PartyIdentity> {
        let identity = bundle.verify_fingerprint(fingerprint)?;
        let index = usize::from(identity.party);
        if let Some(previous) = self
            .party_identities
            .iter()
            .find(|p| p.bundle.party == identity.party)
        {
            let previous = previous.verify()?;
            if previous.fingerprint() != identity.fingerprint() && !replace {
                bail!(
                    "P{index} is pinned with identity fingerprint {}, and this bundle has {}: refusing to change it (pass --replace for a key rotation its operator announced)",
                    previous.fingerprint_hex(),
                    identity.fingerprint_hex()
                );
            }
        }
        self.party_identities
            .retain(|p| p.bundle.party != identity.party);
        let mut kept = bundle.clone();
        // The digest of the CA certificate is what the signature covers; the PEM itself is not
        // needed to seal.
        kept.tls_ca_pem = None;
        self.party_identities.push(PinnedIdentity {
            fingerprint: identity.fingerprint_hex(),
            bundle: kept,
        });
        self.party_identities.sort_by_key(|p| p.bundle.party);
        if self.party_keys.len() != 3 {
            self.party_keys = vec![String::new(); 3];
        }
        self.party_keys[index] = identity.public_key.to_hex();
        // The parties' output-signing keys, once all three are pinned.
        self.party_signing_keys = if self.party_identities.len() == 3 {
            self.party_identities
                .iter()
                .map(|p| p.bundle.signing_key.to_ascii_lowercase())
                .collect()
        } else {
            Vec::new()
        };
        self.check_pins()?;
        Ok(identity)
    }

    /// The coordinator's base URL, without a trailing slash.
    pub fn coordinator_url(&self) -> String {
        self.coordinator_url.trim_end_matches('/').to_owned()
    }
}

/// The coordinator's configuration file (`coordinator.toml`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Address the HTTP API listens on.
    pub listen: String,
    /// The server certificate (PEM); with `tls_key`, the API is served over TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// The API credentials file (digests and scopes, never the tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<PathBuf>,
    /// The three parties, in index order, with the coordinator's own login at each.
    pub parties: Vec<PartyConfig>,
}

impl CoordinatorConfig {
    /// Reads and checks a coordinator configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        let config: CoordinatorConfig = load_toml(path, "coordinator configuration")?;
        check_parties(&config.parties)?;
        if config.tls_cert.is_some() != config.tls_key.is_some() {
            bail!(
                "{}: tls_cert and tls_key go together (both, or neither for plain HTTP on loopback)",
                path.display()
            );
        }
        Ok(config)
    }

    /// Writes the configuration (0600).
    pub fn save(&self, path: &Path) -> Result<()> {
        save_toml(self, path)
    }
}

/// A party operator's configuration file (`operators/p<i>.toml`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OperatorConfig {
    /// The party, with the operator's own role.
    pub party: PartyConfig,
    /// The operator's Ed25519 signing key file: it signs changes of security state that the
    /// coordinator relays to this party.
    pub signing_key: PathBuf,
}

impl OperatorConfig {
    /// Reads an operator configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        let config: OperatorConfig = load_toml(path, "operator configuration")?;
        config.party.pinned_key()?;
        Ok(config)
    }

    /// The operator configurations of the three parties of a local cluster at `home`.
    pub fn load_all(home: &Path) -> Result<[OperatorConfig; 3]> {
        Ok([
            Self::load(&operator_config_file(home, 0))?,
            Self::load(&operator_config_file(home, 1))?,
            Self::load(&operator_config_file(home, 2))?,
        ])
    }

    /// Writes the configuration (0600).
    pub fn save(&self, path: &Path) -> Result<()> {
        save_toml(self, path)
    }
}

/// The privmatch home directory: `--home`, else `$PRIVMATCH_HOME`, else `/var/lib/privmatch`
/// for root and `~/.local/share/privmatch` for others.
pub fn default_home() -> PathBuf {
    if let Some(home) = std::env::var_os("PRIVMATCH_HOME") {
        return PathBuf::from(home);
    }
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/privmatch");
    }
    let base = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    base.join(".local/share/privmatch")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn party(i: u8) -> PartyConfig {
        PartyConfig {
            index: i,
            host: "127.0.0.1".into(),
            port: 5000 + u16::from(i),
            dbname: "privmatch".into(),
            user: "coordinator".into(),
            password: "pw".into(),
            public_key: hex::encode([7u8; 32]),
            ca_cert: None,
        }
    }

    /// Party `party`'s identity bundle with X25519 key `key`, signed by the operator key of
    /// seed `operator`, and its fingerprint.
    fn bundle(party: u8, key: [u8; 32], operator: u8) -> (IdentityBundle, String) {
        let signing = privmatch_core::crypto::sign::OperatorSigningKey::from_bytes(&[operator; 32]);
        let identity = PartyIdentity {
            party,
            public_key: PartyPublicKey::from_bytes(key),
            signing_key: ed25519_dalek::SigningKey::from_bytes(&[operator ^ 0x80; 32])
                .verifying_key(),
            operator_key: ed25519_dalek::VerifyingKey::from_bytes(
                &signing.verifying_key().to_bytes(),
            )
            .expect("key"),
            tls_ca_sha256: [1; 32],
        };
        (
            identity.sign(&signing, 1_700_000_000).expect("sign"),
            identity.fingerprint_hex(),
        )
    }

    #[test]
    fn keys_come_only_from_pinned_bundles() {
        let dir = temp("pins");
        let path = dir.join(CONFIG_FILE);
        let mut config = Config {
            coordinator_url: "http://127.0.0.1:1".into(),
            ca_cert: None,
            api_token: None,
            party_keys: Vec::new(),
            party_identities: Vec::new(),
            party_signing_keys: Vec::new(),
            paillier_service: None,
            client_id: None,
            client_key: None,
        };
        // Nothing pinned yet: the configuration loads, sealing is refused naming P0.
        config.save(&path).expect("save");
        let loaded = Config::load(&path).expect("load unpinned");
        let err = format!("{:#}", loaded.pinned_keys().expect_err("unpinned"));
        assert!(err.contains("no key is pinned for P0"), "{err}");
        // P1 pinned with the fingerprint its operator gave: only P1 is pinned.
        let (p1, fp1) = bundle(1, [11; 32], 21);
        config.pin_identity(&p1, &fp1, false).expect("pin P1");
        config.save(&path).expect("save");
        let loaded = Config::load(&path).expect("load");
        assert_eq!(loaded.party_keys[1], hex::encode([11u8; 32]));
        let err = format!("{:#}", loaded.pinned_keys().expect_err("P0 missing"));
        assert!(err.contains("P0"), "{err}");
        // The wrong fingerprint (another party's bundle, or a substituted key) is refused.
        let (p2, fp2) = bundle(2, [12; 32], 22);
        let err = format!(
            "{:#}",
            config.pin_identity(&p2, &fp1, false).expect_err("fp")
        );
        assert!(
            err.contains("P2's identity bundle has fingerprint"),
            "{err}"
        );
        // A key swapped inside a bundle is refused: the signature fails.
        let mut swapped = p2.clone();
        swapped.public_key = hex::encode([0xee; 32]);
        let err = format!(
            "{:#}",
            config.pin_identity(&swapped, &fp2, false).expect_err("sig")
        );
        assert!(
            err.contains("P2's identity bundle") && err.contains("signature"),
            "{err}"
        );
        let (p0, fp0) = bundle(0, [10; 32], 20);
        config.pin_identity(&p0, &fp0, false).expect("pin P0");
        config.pin_identity(&p2, &fp2, false).expect("pin P2");
        config
            .pin_identity(&p2, &fp2, false)
            .expect("the same bundle again");
        config.save(&path).expect("save");
        let loaded = Config::load(&path).expect("load");
        assert_eq!(
            loaded.pinned_keys().expect("keys")[2].as_bytes(),
            &[12u8; 32]
        );
        // The output-signing keys came with the bundles; one changed by hand is refused.
        assert_eq!(loaded.party_signing_keys.len(), 3);
        assert_eq!(loaded.party_signing_keys[1], p1.signing_key);
        let mut resigned = loaded.clone();
        resigned.party_signing_keys[2] = p1.signing_key.clone();
        resigned.save(&path).expect("save");
        let err = format!("{:#}", Config::load(&path).expect_err("signing key"));
        assert!(err.contains("P2's signing key"), "{err}");
        // A different identity for P1 needs --replace.
        let (rotated, fp_rotated) = bundle(1, [31; 32], 21);
        let err = format!(
            "{:#}",
            config
                .pin_identity(&rotated, &fp_rotated, false)
                .expect_err("rotation")
        );
        assert!(
            err.contains("P1 is pinned with identity fingerprint"),
            "{err}"
        );
        // A key edited into the file (by hand, or copied from the coordinator) is refused at
        // load, naming the party.
        let mut edited = loaded.clone();
        edited.party_keys[1] = hex::encode([0xee; 32]);
        edited.save(&path).expect("save");
        let err = format!("{:#}", Config::load(&path).expect_err("edited key"));
        assert!(
            err.contains("P1's key in party_keys is not the key of the identity bundle"),
            "{err}"
        );
        let mut unbacked = loaded.clone();
        unbacked.party_identities.retain(|p| p.bundle.party != 2);
        unbacked.save(&path).expect("save");
        let err = format!("{:#}", Config::load(&path).expect_err("no bundle"));
        assert!(
            err.contains("P2's key is not pinned from its operator's identity bundle"),
            "{err}"
        );
        let mut tampered = loaded;
        tampered.party_identities[0].bundle.public_key = hex::encode([0xee; 32]);
        tampered.party_keys[0] = hex::encode([0xee; 32]);
        tampered.save(&path).expect("save");
        let err = format!("{:#}", Config::load(&path).expect_err("tampered bundle"));
        assert!(
            err.contains("P0's identity bundle") && err.contains("signature"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    fn pinned_key(config: &Config) -> String {
        config
            .paillier_service
            .as_ref()
            .map(|p| p.signing_key.clone())
            .unwrap_or_default()
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pm-config-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn coordinator_config_round_trips_and_checks_order() {
        let dir = temp("coordinator");
        let path = dir.join(COORDINATOR_CONFIG_FILE);
        let config = CoordinatorConfig {
            listen: "127.0.0.1:1".into(),
            tls_cert: None,
            tls_key: None,
            api_keys: Some(dir.join("api-keys.toml")),
            parties: (0..3).map(party).collect(),
        };
        config.save(&path).expect("save");
        assert_eq!(CoordinatorConfig::load(&path).expect("load"), config);
        let mut bad = config.clone();
        bad.parties.swap(0, 1);
        bad.save(&path).expect("save");
        assert!(CoordinatorConfig::load(&path).is_err());
        let mut half_tls = config;
        half_tls.tls_cert = Some(dir.join("cert.pem"));
        half_tls.save(&path).expect("save");
        assert!(CoordinatorConfig::load(&path).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn client_config_holds_no_party_credentials() {
        let dir = temp("client");
        let path = dir.join(CONFIG_FILE);
        let ca = crate::tls::LocalCa::open_or_create(&dir).expect("local CA");
        let mut config = Config {
            coordinator_url: "https://127.0.0.1:1/".into(),
            ca_cert: Some(ca.cert_path()),
            api_token: Some("pm_cli_00".into()),
            party_keys: Vec::new(),
            party_identities: Vec::new(),
            party_signing_keys: Vec::new(),
            paillier_service: None,
            client_id: None,
            client_key: None,
        };
        for i in 0..3 {
            let (bundle, fingerprint) = bundle(i, [7 + i; 32], 40 + i);
            config
                .pin_identity(&bundle, &fingerprint, false)
                .expect("pin");
        }
        config.save(&path).expect("save");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(!text.contains("password"), "{text}");
        let loaded = Config::load(&path).expect("load");
        assert_eq!(loaded, config);
        assert_eq!(loaded.coordinator_url(), "https://127.0.0.1:1");
        std::fs::rename(ca.cert_path(), dir.join("moved.pem")).expect("move CA");
        let missing = format!("{:#}", Config::load(&path).expect_err("CA missing"));
        assert!(missing.contains("ca.pem"), "{missing}");
        std::fs::rename(dir.join("moved.pem"), ca.cert_path()).expect("restore CA");
        let mut pinned = config.clone();
        let signing = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
        pinned.paillier_service = Some(ServicePin {
            party: 1,
            signing_key: hex::encode(signing.verifying_key().to_bytes()),
        });
        pinned.save(&path).expect("save");
        assert_eq!(Config::load(&path).expect("load"), pinned);
        for (party, key) in [(3u8, pinned_key(&pinned)), (0, "00".repeat(31))] {
            let mut bad = pinned.clone();
            bad.paillier_service = Some(ServicePin {
                party,
                signing_key: key,
            });
            bad.save(&path).expect("save");
            assert!(Config::load(&path).is_err(), "party {party}");
        }
        let mut two = config;
        two.party_keys.pop();
        two.save(&path).expect("save");
        assert!(Config::load(&path).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
