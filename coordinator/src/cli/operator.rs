//! `privmatch operator init|pin|show|tls`: what a party's operator does at its own party,
//! connected directly to its PostgreSQL as the database owner (never through the coordinator):
//! initialise the party, pin the peers' keys in the key ceremony, show what the other operators
//! must compare, make the party's TLS certificate. `privmatch cluster up` provisions its three
//! local parties with the same functions, and a party container's entrypoint calls these
//! commands (`deploy/party-entrypoint.sh`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde::Serialize;

use crate::cli::operator_key;
use crate::config::{OperatorConfig, PartyConfig};
use crate::parties::open;
use crate::tls::LocalCa;

/// The login role of the coordinator at a party (a member of `privmatch_coordinator` only).
pub const COORDINATOR_ROLE: &str = "coordinator";

/// Actions of `privmatch operator`.
#[derive(Subcommand, Clone, Debug)]
pub enum OperatorAction {
    /// Initialise this party: database, extension, the party's key (in its key file), the
    /// coordinator's login role, the operator's signing key; writes the operator's
    /// configuration and prints the party's identity (JSON). Run again, it changes nothing
    /// but the coordinator's password, and refuses a party whose key differs from the one
    /// the configuration pins.
    Init {
        /// This party's index: 0, 1 or 2.
        #[arg(long)]
        index: u8,
        /// PostgreSQL host, or the directory of its Unix socket.
        #[arg(long, default_value = "/var/run/postgresql")]
        host: String,
        /// PostgreSQL port.
        #[arg(long, default_value_t = 5432)]
        port: u16,
        /// Database that holds the extension (created if missing).
        #[arg(long, default_value = "privmatch")]
        dbname: String,
        /// The operator's role (owner of the database; superuser to create the extension).
        #[arg(long, default_value = "privmatch")]
        user: String,
        /// File holding the operator role's password.
        #[arg(long)]
        password_file: PathBuf,
        /// File holding the password the coordinator's login role gets.
        #[arg(long)]
        coordinator_password_file: PathBuf,
        /// The operator's Ed25519 signing key (created if missing, 0600).
        #[arg(long)]
        signing_key: PathBuf,
        /// The operator configuration to write (0600).
        #[arg(long)]
        config: PathBuf,
    },
    /// Pin a peer party's public key at this party (the key ceremony: compare its fingerprint
    /// with the peer's operator out of band first).
    Pin {
        /// The operator configuration (`init` wrote it).
        #[arg(long)]
        config: PathBuf,
        /// The peer's index.
        #[arg(long)]
        peer: u8,
        /// The peer's public key (64 hex digits).
        #[arg(long)]
        key: String,
        /// Replace a different key pinned before (a key rotation).
        #[arg(long)]
        replace: bool,
    },
    /// Print this party's identity (JSON): index, public key, fingerprint.
    Show {
        /// The operator configuration (`init` wrote it).
        #[arg(long)]
        config: PathBuf,
    },
    /// Make (first time; afterwards reuse) this party's own CA and a server certificate for
    /// `hosts` in `dir` (ca.pem, ca.key, server.pem, server.key).
    Tls {
        /// Directory of the CA and the certificate.
        #[arg(long)]
        dir: PathBuf,
        /// Host names and IP addresses the certificate is valid for.
        #[arg(long, value_delimiter = ',', required = true)]
        hosts: Vec<String>,
    },
}

/// What operators exchange and compare in the key ceremony.
#[derive(Serialize, Debug)]
pub struct Identity {
    /// The party's index.
    pub party: u8,
    /// Its X25519 public key (hex).
    pub public_key: String,
    /// The key's fingerprint (hex), to compare by voice or on paper.
    pub fingerprint: String,
}

/// Runs `privmatch operator …`.
pub async fn run(action: &OperatorAction) -> Result<()> {
    match action {
        OperatorAction::Init {
            index,
            host,
            port,
            dbname,
            user,
            password_file,
            coordinator_password_file,
            signing_key,
            config,
        } => {
            let mut party = PartyConfig {
                index: *index,
                host: host.clone(),
                port: *port,
                dbname: dbname.clone(),
                user: user.clone(),
                password: read_secret(password_file)?,
                public_key: String::new(),
                ca_cert: None,
            };
            let previous = OperatorConfig::load(config).ok();
            let coordinator_password = read_secret(coordinator_password_file)?;
            party.public_key = provision(&party, &coordinator_password).await?;
            if let Some(previous) = previous {
                if previous.party.public_key != party.public_key {
                    bail!(
                        "P{index} reports key {}, but {} pins {}: refusing to continue",
                        party.public_key,
                        config.display(),
                        previous.party.public_key
                    );
                }
            }
            set_operator_key(&party, signing_key).await?;
            OperatorConfig {
                party: party.clone(),
                signing_key: signing_key.clone(),
            }
            .save(config)?;
            print_identity(&party)
        }
        OperatorAction::Pin {
            config,
            peer,
            key,
            replace,
        } => {
            let operator = OperatorConfig::load(config)?;
            let fingerprint = pin_peer(&operator.party, *peer, key, *replace).await?;
            println!(
                "pinned P{peer} at P{}: fingerprint {fingerprint}",
                operator.party.index
            );
            Ok(())
        }
        OperatorAction::Show { config } => print_identity(&OperatorConfig::load(config)?.party),
        OperatorAction::Tls { dir, hosts } => {
            let ca = LocalCa::open_or_create(dir)?;
            let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
            let issued = ca.server_cert(dir, "server", &hosts)?;
            println!(
                "CA {}, certificate {} for {}",
                ca.cert_path().display(),
                issued.cert.display(),
                hosts.join(", ")
            );
            Ok(())
        }
    }
}

/// A password from a file (one line; surrounding white space dropped).
fn read_secret(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the password file {}", path.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        bail!("the password file {} is empty", path.display());
    }
    Ok(secret.to_owned())
}

fn print_identity(party: &PartyConfig) -> Result<()> {
    let key = party.pinned_key()?;
    let identity = Identity {
        party: party.index,
        public_key: key.to_hex(),
        fingerprint: key.fingerprint_hex(),
    };
    println!("{}", serde_json::to_string(&identity)?);
    Ok(())
}

/// As the party's operator: creates the database, the extension and the party identity, and
/// the coordinator's login role (member of `privmatch_coordinator` only, with
/// `coordinator_password`). Returns the party's public key (hex).
pub async fn provision(operator: &PartyConfig, coordinator_password: &str) -> Result<String> {
    if !coordinator_password
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.+/=".contains(c))
    {
        bail!("the coordinator's password may hold letters, digits and -_.+/= only");
    }
    let mut admin = operator.clone();
    admin.dbname = "postgres".into();
    let client = open(&admin).await?;
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1",
            &[&operator.dbname],
        )
        .await?
        .is_some();
    if !exists {
        client
            .batch_execute(&format!("CREATE DATABASE \"{}\"", operator.dbname))
            .await?;
    }
    drop(client);
    let client = open(operator).await?;
    client
        .batch_execute("CREATE EXTENSION IF NOT EXISTS privmatch")
        .await
        .context(
            "CREATE EXTENSION privmatch failed: is the extension installed (cargo pgrx install)?",
        )?;
    let row = client
        .query_one(
            "SELECT privmatch.init_party($1)",
            &[&i32::from(operator.index)],
        )
        .await?;
    let role_exists = client
        .query_opt(
            "SELECT 1 FROM pg_roles WHERE rolname = $1",
            &[&COORDINATOR_ROLE],
        )
        .await?
        .is_some();
    let verb = if role_exists { "ALTER" } else { "CREATE" };
    // Utility statements take no parameters; the password's characters were checked above,
    // so quoting it as a literal is safe.
    client
        .batch_execute(&format!(
            "{verb} ROLE {COORDINATOR_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE INHERIT \
             NOREPLICATION NOBYPASSRLS PASSWORD '{coordinator_password}'; \
             GRANT privmatch_coordinator TO {COORDINATOR_ROLE}"
        ))
        .await
        .context("creating the coordinator's login role")?;
    // Its connection limit and temp_file_limit (and those of any application login).
    client
        .batch_execute("SELECT count(*) FROM privmatch.apply_login_limits()")
        .await
        .context("applying the login limits")?;
    Ok(row.get(0))
}

/// As the party's operator: pins peer `peer`'s key `key` (hex). Returns its fingerprint.
pub async fn pin_peer(
    operator: &PartyConfig,
    peer: u8,
    key: &str,
    replace: bool,
) -> Result<String> {
    let client = open(operator).await?;
    let row = client
        .query_one(
            "SELECT privmatch.pin_peer($1, $2, $3)",
            &[&i32::from(peer), &key, &replace],
        )
        .await
        .with_context(|| format!("pinning P{peer}'s key at P{}", operator.index))?;
    Ok(row.get(0))
}

/// As the party's operator: creates the operator's signing key (first time) and sets its
/// public half at the party, which then accepts relayed commands signed by it.
pub async fn set_operator_key(operator: &PartyConfig, signing_key: &Path) -> Result<()> {
    let key = operator_key::create_if_missing(signing_key)?;
    let client = open(operator).await?;
    client
        .query_one(
            "SELECT privmatch.set_operator_key($1)",
            &[&key.verifying_key().to_hex()],
        )
        .await
        .with_context(|| format!("setting the operator key of P{}", operator.index))?;
    Ok(())
}
