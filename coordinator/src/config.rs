//! The configuration every `privmatch` command reads: where the three parties are, their
//! pinned public keys, and where the coordinator listens. `privmatch cluster up` writes it for
//! a local cluster; for a real deployment the operator writes it, pinning each party's key
//! after comparing fingerprints out of band. The client seals to the keys pinned here, never
//! to keys the coordinator reports.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use privmatch_core::crypto::seal::PartyPublicKey;
use serde::{Deserialize, Serialize};

/// Name of the configuration file inside the privmatch home directory.
pub const CONFIG_FILE: &str = "privmatch.toml";

/// One party as the coordinator and the client see it.
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
    /// Role the coordinator connects as.
    pub user: String,
    /// Password of that role.
    pub password: String,
    /// The party's pinned X25519 public key (hex).
    pub public_key: String,
}

impl PartyConfig {
    /// A tokio-postgres connection string.
    pub fn connection_string(&self) -> String {
        format!(
            "host={} port={} dbname={} user={} password={} application_name=privmatch-coordinator connect_timeout=5",
            self.host, self.port, self.dbname, self.user, self.password
        )
    }

    /// The pinned key, parsed.
    pub fn pinned_key(&self) -> Result<PartyPublicKey> {
        PartyPublicKey::from_hex(&self.public_key)
            .with_context(|| format!("pinned key of party P{} in the configuration", self.index))
    }
}

/// The whole configuration file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Config {
    /// Address the coordinator's HTTP API listens on (and the CLI talks to).
    pub coordinator_addr: String,
    /// The three parties, in index order.
    pub parties: Vec<PartyConfig>,
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read the privmatch configuration {} (run `privmatch cluster up` for a local cluster)",
                path.display()
            )
        })?;
        let config: Config = toml::from_str(&text)
            .with_context(|| format!("invalid configuration {}", path.display()))?;
        config.check()?;
        Ok(config)
    }

    /// Writes the configuration, readable by its owner only (it holds passwords).
    pub fn save(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let text = toml::to_string_pretty(self)?;
        let tmp = path.with_extension("toml.tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    fn check(&self) -> Result<()> {
        if self.parties.len() != 3 {
            bail!(
                "the configuration must list exactly 3 parties, found {}",
                self.parties.len()
            );
        }
        for (i, party) in self.parties.iter().enumerate() {
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

    /// The three pinned party keys, in index order.
    pub fn pinned_keys(&self) -> Result<[PartyPublicKey; 3]> {
        Ok([
            self.parties[0].pinned_key()?,
            self.parties[1].pinned_key()?,
            self.parties[2].pinned_key()?,
        ])
    }

    /// The coordinator's base URL.
    pub fn coordinator_url(&self) -> String {
        format!("http://{}", self.coordinator_addr)
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

    fn sample() -> Config {
        let key = hex::encode([7u8; 32]);
        Config {
            coordinator_addr: "127.0.0.1:1".into(),
            parties: (0..3)
                .map(|i| PartyConfig {
                    index: i,
                    host: "127.0.0.1".into(),
                    port: 5000 + u16::from(i),
                    dbname: "privmatch".into(),
                    user: "privmatch".into(),
                    password: "pw".into(),
                    public_key: key.clone(),
                })
                .collect(),
        }
    }

    #[test]
    fn save_and_load_round_trip() {
        let dir = std::env::temp_dir().join(format!("pm-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(CONFIG_FILE);
        sample().save(&path).expect("save");
        assert_eq!(Config::load(&path).expect("load"), sample());
        let mut bad = sample();
        bad.parties.swap(0, 1);
        bad.save(&path).expect("save");
        assert!(Config::load(&path).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
