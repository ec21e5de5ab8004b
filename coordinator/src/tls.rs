//! TLS for the two links the coordinator is part of: clients → coordinator API (the
//! coordinator serves, [`server_config`]) and coordinator → parties' PostgreSQL (the coordinator
//! connects, [`party_connector`] and [`party_connector_for`], and cancels its queries there,
//! [`CancelTls`]); and a small certificate authority for local clusters ([`LocalCa`]) that
//! `privmatch cluster up` uses to issue the coordinator's and the parties' certificates.
//!
//! One rustls with the *ring* provider everywhere (passed explicitly, so no process-wide
//! default is needed). Certificates are verified against a pinned CA file (never the system
//! roots: a deployment's CA is its own) and the host name or IP address connected to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::files::write_atomic;
use anyhow::{bail, Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file, refusing a file with none.
fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read the certificate file {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("invalid PEM in {}", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no certificate", path.display());
    }
    Ok(certs)
}

/// The private key of a PEM file.
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("cannot read a private key from {}", path.display()))
}

/// A root store holding the CA certificates of `ca_file` only.
pub fn root_store(ca_file: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca_file)? {
        roots
            .add(cert)
            .with_context(|| format!("{}: not a usable CA certificate", ca_file.display()))?;
    }
    Ok(roots)
}

/// The coordinator API's server configuration from its certificate chain and key (PEM).
pub fn server_config(cert: &Path, key: &Path) -> Result<ServerConfig> {
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .with_context(|| {
            format!(
                "the key {} does not fit the certificate {}",
                key.display(),
                cert.display()
            )
        })?;
    Ok(config)
}

/// A client configuration trusting the CA of `ca_file` only.
pub fn client_config(ca_file: &Path) -> Result<ClientConfig> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(root_store(ca_file)?)
        .with_no_client_auth())
}

/// The TLS connector for a party's PostgreSQL whose certificate chains to `ca_file`.
pub fn party_connector(ca_file: &Path) -> Result<MakeRustlsConnect> {
    Ok(MakeRustlsConnect::new(client_config(ca_file)?))
}

/// [`party_connector`] for the party at `host`, whose CA is also recorded for the cancel
/// requests of connections to `host` ([`CancelTls`]).
pub fn party_connector_for(host: &str, ca_file: &Path) -> Result<MakeRustlsConnect> {
    let connector = party_connector(ca_file)?;
    let certs = load_certs(ca_file)?;
    let mut pinned = CANCEL_ROOTS.lock().unwrap_or_else(|e| e.into_inner());
    let known = pinned.entry(host.to_owned()).or_default();
    for cert in certs {
        if !known.contains(&cert) {
            known.push(cert);
        }
    }
    Ok(connector)
}

/// The CA certificates pinned for each party host name that a connection was opened to with
/// TLS ([`party_connector_for`]): what a cancel request to that host verifies against.
static CANCEL_ROOTS: Mutex<BTreeMap<String, Vec<CertificateDer<'static>>>> =
    Mutex::new(BTreeMap::new());

/// The TLS of cancel requests to the parties, for
/// `tokio_postgres::CancelToken::cancel_query`.
///
/// A cancel request travels on a new connection to the party, and carries the backend's
/// process id and secret key: whoever reads it can cancel that backend's queries for as long
/// as the backend lives. PostgreSQL checks no `pg_hba.conf` line for a cancel request and so
/// also accepts one without TLS where every session must use TLS; sent in the clear (or with a
/// token of a TLS connection given no TLS at all: then it is not sent), it would give the key
/// away to the network between the coordinator and the party. The token knows the connection's
/// host, port and `sslmode`, not its TLS configuration: this connector takes the party's
/// pinned CA from what [`party_connector_for`] recorded for that host name, so the request
/// goes after an SSLRequest, inside TLS verified as the connection's own (the CA certificates
/// of every party at that host name: one, except on a local cluster, whose parties share one
/// CA). A host nothing was recorded for gets no trusted root, so the handshake fails and
/// nothing is sent, never a plain request. A connection without TLS (`sslmode=disable`, a
/// configuration without a CA) is cancelled as it was opened, in the clear: `tokio-postgres`
/// then does not use this connector at all.
#[derive(Clone, Copy, Debug, Default)]
pub struct CancelTls;

impl<S> MakeTlsConnect<S> for CancelTls
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = rustls::Error;

    fn make_tls_connect(&mut self, host: &str) -> Result<Self::TlsConnect, Self::Error> {
        let mut roots = RootCertStore::empty();
        if let Some(certs) = CANCEL_ROOTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(host)
        {
            // Each was accepted as a root when it was recorded (a connection was opened with it).
            roots.add_parsable_certificates(certs.iter().cloned());
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        match MakeTlsConnect::<S>::make_tls_connect(&mut MakeRustlsConnect::new(config), host) {
            Ok(connect) => Ok(connect),
            Err(never) => match never {},
        }
    }
}

/// A certificate and its key, as PEM file paths.
#[derive(Clone, Debug)]
pub struct IssuedCert {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, 0600).
    pub key: PathBuf,
}

/// A certificate authority for one local deployment: `ca.pem` (public, given to every client
/// and to the coordinator) and `ca.key` (0600, kept by whoever runs `cluster up`) in `dir`.
/// In a real deployment each organisation's own PKI takes its place.
pub struct LocalCa {
    dir: PathBuf,
    params: CertificateParams,
    key: KeyPair,
}

const CA_NAME: &str = "privmatch local CA";

fn ca_params() -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

impl LocalCa {
    /// The CA in `dir`: loaded when `ca.key` exists, else created.
    pub fn open_or_create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let key_path = dir.join("ca.key");
        let key = if key_path.exists() {
            let pem = std::fs::read_to_string(&key_path)
                .with_context(|| format!("cannot read {}", key_path.display()))?;
            KeyPair::from_pem(&pem).with_context(|| format!("invalid {}", key_path.display()))?
        } else {
            let key = KeyPair::generate()?;
            write_atomic(&key_path, &key.serialize_pem(), 0o600)?;
            key
        };
        let ca = LocalCa {
            dir: dir.to_owned(),
            params: ca_params()?,
            key,
        };
        if !ca.cert_path().exists() {
            let cert = ca.params.clone().self_signed(&ca.key)?;
            write_atomic(&ca.cert_path(), &cert.pem(), 0o644)?;
        }
        Ok(ca)
    }

    /// The CA certificate (PEM) clients and the coordinator pin.
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Issues (first time; afterwards reuses) a server certificate `name`.pem / `name`.key in
    /// `dir` for the host names and IP addresses `hosts`.
    pub fn server_cert(&self, dir: &Path, name: &str, hosts: &[&str]) -> Result<IssuedCert> {
        let issued = IssuedCert {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        };
        if issued.cert.exists() && issued.key.exists() {
            return Ok(issued);
        }
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let mut params = CertificateParams::new(hosts)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        // The issuer is rebuilt from the same name and key: what a verifier checks (subject,
        // key identifier, signature) is identical to the stored ca.pem.
        let issuer = self.params.clone().self_signed(&self.key)?;
        let cert = params.signed_by(&key, &issuer, &self.key)?;
        write_atomic(&issued.key, &key.serialize_pem(), 0o600)?;
        write_atomic(&issued.cert, &cert.pem(), 0o644)?;
        Ok(issued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("privmatch-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn issued_certificates_verify_against_the_ca_and_the_ca_key_is_private() {
        use std::os::unix::fs::MetadataExt;
        let dir = temp_dir("ca");
        let ca = LocalCa::open_or_create(&dir).expect("ca");
        let issued = ca
            .server_cert(&dir, "coordinator", &["localhost", "127.0.0.1"])
            .expect("issue");
        assert_eq!(
            std::fs::metadata(dir.join("ca.key"))
                .expect("ca.key")
                .mode()
                & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(&issued.key).expect("key").mode() & 0o777,
            0o600
        );
        server_config(&issued.cert, &issued.key).expect("server config");
        let roots = root_store(&ca.cert_path()).expect("roots");
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .expect("verifier");
        let chain = load_certs(&issued.cert).expect("chain");
        let now = rustls_pki_types::UnixTime::now();
        for host in ["localhost", "127.0.0.1"] {
            let name = rustls_pki_types::ServerName::try_from(host).expect("name");
            verifier
                .verify_server_cert(&chain[0], &[], &name, &[], now)
                .unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        let other = rustls_pki_types::ServerName::try_from("example.org").expect("name");
        assert!(verifier
            .verify_server_cert(&chain[0], &[], &other, &[], now)
            .is_err());
        // Reopened, the CA keeps its key: certificates issued later still verify.
        let again = LocalCa::open_or_create(&dir).expect("reopen");
        let later = again
            .server_cert(&dir, "party", &["127.0.0.1"])
            .expect("issue");
        let chain = load_certs(&later.cert).expect("chain");
        let ip = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("ip");
        verifier
            .verify_server_cert(&chain[0], &[], &ip, &[], now)
            .expect("later certificate");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_foreign_ca_is_not_trusted() {
        let (a, b) = (temp_dir("a"), temp_dir("b"));
        let ca_a = LocalCa::open_or_create(&a).expect("a");
        let ca_b = LocalCa::open_or_create(&b).expect("b");
        let issued = ca_b.server_cert(&b, "x", &["127.0.0.1"]).expect("issue");
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(root_store(&ca_a.cert_path()).expect("roots")),
            provider(),
        )
        .build()
        .expect("verifier");
        let chain = load_certs(&issued.cert).expect("chain");
        let ip = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("ip");
        assert!(verifier
            .verify_server_cert(&chain[0], &[], &ip, &[], rustls_pki_types::UnixTime::now())
            .is_err());
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
    }
}
