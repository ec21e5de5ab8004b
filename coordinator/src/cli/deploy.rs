//! `privmatch coordinator init` and `privmatch coordinator credential`: the coordinator of a
//! deployment, configured from what the parties' operators handed over in the key ceremony
//! (each party's identity and CA certificate, the password of the coordinator's login role at
//! each party), and the API credentials it accepts. A coordinator container's entrypoint calls
//! them (`deploy/coordinator-entrypoint.sh`); `privmatch cluster up` writes the same files for
//! a local cluster.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;

use crate::config::{Config, CoordinatorConfig, PartyConfig, COORDINATOR_CONFIG_FILE};
use crate::server::auth::{ApiKeyEntry, ApiKeys, Scope};
use crate::tls::LocalCa;

/// The API credentials file in the coordinator's home.
pub const API_KEYS_FILE: &str = "api-keys.toml";

/// Options of `privmatch coordinator init`.
#[derive(Args, Clone, Debug)]
pub struct InitArgs {
    /// Address the API listens on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: String,
    /// Host names and addresses of the API's TLS certificate (from the coordinator's own CA,
    /// made in HOME/tls on first run).
    #[arg(long, value_delimiter = ',', required = true)]
    pub tls_hosts: Vec<String>,
    /// Party endpoints in index order: HOST:PORT of P0, P1, P2.
    #[arg(long, value_delimiter = ',', required = true)]
    pub parties: Vec<String>,
    /// What the operators handed over: `p<i>/identity.json` and `p<i>/ca.pem` for each party.
    #[arg(long)]
    pub handover: PathBuf,
    /// Directory of the coordinator's passwords at the parties: `p<i>_coordinator_password`
    /// (e.g. /run/secrets).
    #[arg(long)]
    pub secrets: PathBuf,
}

/// Options of `privmatch coordinator credential`.
#[derive(Args, Clone, Debug)]
pub struct CredentialArgs {
    /// The credential's name (letters, digits, '-', '.'), shown in the audit log.
    #[arg(long)]
    pub name: String,
    /// What it may do: enroll, search, delete, admin, device (comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    pub scopes: Vec<String>,
    /// Also write a client configuration holding the credential, for a client that reaches
    /// the coordinator at `--url` (the coordinator's URL and CA certificate and the credential
    /// only: the client pins the parties' keys from their operators' bundles, `privmatch
    /// client pin`).
    #[arg(long, requires = "url")]
    pub client_config: Option<PathBuf>,
    /// The coordinator's URL as the client reaches it (with --client-config).
    #[arg(long)]
    pub url: Option<String>,
}

/// A party's identity as its operator hands it over (`privmatch operator show`).
#[derive(Deserialize)]
struct HandedIdentity {
    party: u8,
    public_key: String,
}

/// Writes the coordinator's configuration in `home` (coordinator.toml, its TLS certificate,
/// an API keys file if none exists yet) from what the operators handed over.
pub fn init(home: &Path, args: &InitArgs) -> Result<()> {
    if args.parties.len() != 3 {
        bail!(
            "--parties needs three HOST:PORT endpoints (P0,P1,P2), got {}",
            args.parties.len()
        );
    }
    let mut parties = Vec::new();
    for (index, endpoint) in args.parties.iter().enumerate() {
        parties.push(handed_party(index as u8, endpoint, args)?);
    }
    let ca = LocalCa::open_or_create(&home.join("tls"))?;
    let hosts: Vec<&str> = args.tls_hosts.iter().map(String::as_str).collect();
    let cert = ca.server_cert(&home.join("tls"), "coordinator", &hosts)?;
    let api_keys = home.join(API_KEYS_FILE);
    if !api_keys.exists() {
        ApiKeys::save(&[], &api_keys)?;
    }
    let config = CoordinatorConfig {
        listen: args.listen.clone(),
        tls_cert: Some(cert.cert),
        tls_key: Some(cert.key),
        api_keys: Some(api_keys),
        parties,
    };
    let path = home.join(COORDINATOR_CONFIG_FILE);
    config.save(&path)?;
    // Checks what was written as `serve` will read it.
    CoordinatorConfig::load(&path)?;
    println!(
        "coordinator configured: {} (API CA {})",
        path.display(),
        ca.cert_path().display()
    );
    Ok(())
}

fn handed_party(index: u8, endpoint: &str, args: &InitArgs) -> Result<PartyConfig> {
    let (host, port) = endpoint
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .with_context(|| format!("P{index}'s endpoint {endpoint:?} is not HOST:PORT"))?;
    let dir = args.handover.join(format!("p{index}"));
    let identity_path = dir.join("identity.json");
    let text = std::fs::read_to_string(&identity_path).with_context(|| {
        format!(
            "P{index}'s identity is missing: {} (from `privmatch operator show` at P{index})",
            identity_path.display()
        )
    })?;
    let identity: HandedIdentity = serde_json::from_str(text.trim())
        .with_context(|| format!("invalid identity {}", identity_path.display()))?;
    if identity.party != index {
        bail!(
            "{} is the identity of P{}, not P{index}",
            identity_path.display(),
            identity.party
        );
    }
    let ca_cert = dir.join("ca.pem");
    crate::tls::root_store(&ca_cert)
        .with_context(|| format!("P{index}'s CA certificate {}", ca_cert.display()))?;
    let password_path = args.secrets.join(format!("p{index}_coordinator_password"));
    let password = std::fs::read_to_string(&password_path)
        .with_context(|| format!("cannot read {}", password_path.display()))?
        .trim()
        .to_owned();
    let party = PartyConfig {
        index,
        host: host.to_owned(),
        port,
        dbname: "privmatch".into(),
        user: crate::cli::operator::COORDINATOR_ROLE.into(),
        password,
        public_key: identity.public_key,
        ca_cert: Some(ca_cert),
    };
    party.pinned_key()?;
    Ok(party)
}

/// Adds an API credential to the coordinator's keys file (the coordinator reads it at start:
/// restart it) and prints the token, which is shown only this once.
pub fn credential(home: &Path, args: &CredentialArgs) -> Result<()> {
    let scopes = args
        .scopes
        .iter()
        .map(|s| Scope::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let path = home.join(API_KEYS_FILE);
    let mut entries: Vec<ApiKeyEntry> = if path.exists() {
        ApiKeys::load(&path)?.entries().to_vec()
    } else {
        Vec::new()
    };
    if entries.iter().any(|e| e.id == args.name) {
        bail!(
            "{}: a credential named {:?} exists already",
            path.display(),
            args.name
        );
    }
    let (token, entry) = ApiKeys::generate(&args.name, &scopes)?;
    entries.push(entry);
    ApiKeys::save(&entries, &path)?;
    if let (Some(out), Some(url)) = (&args.client_config, &args.url) {
        write_client_config(home, out, url, &token)?;
        println!("client configuration written: {}", out.display());
    } else {
        println!("{token}");
    }
    Ok(())
}

/// A client configuration for `url` with `token`: the coordinator's CA certificate is copied
/// next to it (and named relative to it). It pins no party key: the coordinator is not trusted
/// with the parties' identities (a coordinator that handed out its own key for two parties
/// could open every sealed template and probe). The client pins each party's key from the
/// bundle that party's operator exported (`privmatch client pin`).
fn write_client_config(home: &Path, out: &Path, url: &str, token: &str) -> Result<()> {
    let dir = out.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let ca_name = "coordinator-ca.pem";
    let ca_cert = dir.join(ca_name);
    std::fs::copy(home.join("tls").join("ca.pem"), &ca_cert)
        .with_context(|| format!("cannot write {}", ca_cert.display()))?;
    // Relative: resolved against the configuration's own directory, so the pair can be
    // copied to the client's machine as it is.
    let config = Config {
        coordinator_url: url.to_owned(),
        ca_cert: Some(PathBuf::from(ca_name)),
        api_token: Some(token.to_owned()),
        party_keys: Vec::new(),
        party_identities: Vec::new(),
        party_signing_keys: Vec::new(),
        paillier_service: None,
        client_id: None,
        client_key: None,
    };
    config.save(out)?;
    Config::load(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pm-deploy-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// What three operators hand over: identities, CA certificates, passwords.
    fn handover(root: &Path) -> InitArgs {
        let handover = root.join("handover");
        let secrets = root.join("secrets");
        std::fs::create_dir_all(&secrets).expect("secrets");
        for i in 0..3u8 {
            let dir = handover.join(format!("p{i}"));
            let ca = LocalCa::open_or_create(&root.join(format!("ca{i}"))).expect("CA");
            std::fs::create_dir_all(&dir).expect("handover dir");
            std::fs::copy(ca.cert_path(), dir.join("ca.pem")).expect("copy CA");
            let key = hex::encode([i + 1; 32]);
            std::fs::write(
                dir.join("identity.json"),
                format!(r#"{{"party":{i},"public_key":"{key}","fingerprint":"x"}}"#),
            )
            .expect("identity");
            std::fs::write(secrets.join(format!("p{i}_coordinator_password")), "pw\n")
                .expect("password");
        }
        InitArgs {
            listen: "0.0.0.0:8443".into(),
            tls_hosts: vec!["coordinator".into(), "localhost".into()],
            parties: vec!["p0:5432".into(), "p1:5432".into(), "p2:5432".into()],
            handover,
            secrets,
        }
    }

    #[test]
    fn init_pins_what_was_handed_over_and_a_credential_makes_a_client_config() {
        let root = temp("init");
        let home = root.join("home");
        let args = handover(&root);
        init(&home, &args).expect("init");
        let config = CoordinatorConfig::load(&home.join(COORDINATOR_CONFIG_FILE)).expect("load");
        assert_eq!(config.parties[1].host, "p1");
        assert_eq!(config.parties[2].public_key, hex::encode([3u8; 32]));
        assert_eq!(config.parties[0].password, "pw");
        assert_eq!(config.parties[0].user, "coordinator");

        let out = root.join("client").join("privmatch.toml");
        let credential_args = CredentialArgs {
            name: "app".into(),
            scopes: vec!["search".into()],
            client_config: Some(out.clone()),
            url: Some("https://localhost:8443".into()),
        };
        credential(&home, &credential_args).expect("credential");
        let client = Config::load(&out).expect("client config");
        // The coordinator hands out no party key: it pins its own (here P2's is 0303…).
        assert!(client.party_keys.is_empty() && client.party_identities.is_empty());
        let text = std::fs::read_to_string(&out).expect("client config text");
        for i in 0..3u8 {
            assert!(!text.contains(&hex::encode([i + 1; 32])), "{text}");
        }
        let err = format!("{:#}", client.pinned_keys().expect_err("nothing pinned"));
        assert!(err.contains("no key is pinned for P0"), "{err}");
        assert_eq!(
            client.ca_cert,
            Some(root.join("client").join("coordinator-ca.pem"))
        );
        let token = client.api_token.expect("token");
        assert!(ApiKeys::load(&home.join(API_KEYS_FILE))
            .expect("keys")
            .accepts(&token));
        let again = credential(&home, &credential_args).expect_err("same name twice");
        assert!(format!("{again:#}").contains("exists already"), "{again:#}");
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn a_wrong_or_missing_handover_is_refused_with_the_party_named() {
        let root = temp("refused");
        let home = root.join("home");
        let mut args = handover(&root);
        // P1's identity handed over as P2's.
        std::fs::copy(
            args.handover.join("p2/identity.json"),
            args.handover.join("p1/identity.json"),
        )
        .expect("swap");
        let err = format!("{:#}", init(&home, &args).expect_err("swapped identity"));
        assert!(err.contains("identity of P2, not P1"), "{err}");
        std::fs::remove_file(args.handover.join("p1/identity.json")).expect("remove");
        let err = format!("{:#}", init(&home, &args).expect_err("missing identity"));
        assert!(err.contains("P1's identity is missing"), "{err}");
        args.parties.pop();
        let err = format!("{:#}", init(&home, &args).expect_err("two parties"));
        assert!(err.contains("three HOST:PORT"), "{err}");
        assert!(!home.join(COORDINATOR_CONFIG_FILE).exists());
        std::fs::remove_dir_all(&root).ok();
    }
}
