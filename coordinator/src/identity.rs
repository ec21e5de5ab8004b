//! Party identity bundles: how a party's identity reaches a client from that party's own
//! operator, never from the coordinator.
//!
//! A client seals every share of a template or probe to the three parties' X25519 keys. If the
//! coordinator could choose those keys, it could put its own in for two parties, open every
//! sealed enrolment and probe, and re-seal them to the real parties without anyone noticing.
//! So the keys a client pins come from the parties' operators:
//!
//! 1. each operator exports a **bundle** (`privmatch party identity-export`): the party's
//!    index, its X25519 public key, the Ed25519 key it signs its outputs with, its operator's
//!    Ed25519 public key and the SHA-256 of its TLS CA certificate, signed by the operator's
//!    Ed25519 key (RFC 8032, strict verification)
//!    under the domain label [`SIGNATURE_DOMAIN`], so the signature can never be taken for an
//!    operator command (`privmatch_core::crypto::sign`, whose label differs) or anything else;
//! 2. the operator also gives out the bundle's **fingerprint** ([`PartyIdentity::fingerprint`]:
//!    SHA-256 of every field above under [`FINGERPRINT_DOMAIN`], truncated to 128 bits) over a
//!    second channel — a call, a signed mail, paper — as with SSH host keys;
//! 3. the client pins the bundle with `privmatch client pin --bundle FILE --fingerprint HEX`,
//!    which verifies the signature and refuses a fingerprint that differs, naming the party.
//!
//! Whoever carries the bundle (the coordinator included) cannot substitute a key: changing
//! any field breaks the signature, and re-signing with another operator key changes the
//! fingerprint. The client configuration keeps each pinned bundle ([`PinnedIdentity`]) and
//! re-verifies it on every load; nothing the coordinator answers is ever written there.

use std::path::Path;

use anyhow::{bail, Context, Result};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::crypto::sign::OperatorSigningKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `format` field of a bundle file.
pub const BUNDLE_FORMAT: &str = "privmatch-party-identity-v1";
/// The label every bundle signature starts with. It differs from the operator-command label
/// in its first eleven bytes, so no signed command is a signed bundle or the reverse.
pub const SIGNATURE_DOMAIN: &[u8] = b"privmatch party identity bundle v1";
/// The label of the fingerprint's hash.
pub const FINGERPRINT_DOMAIN: &[u8] = b"privmatch party identity fingerprint v1";
/// Length of a bundle fingerprint in bytes (32 hex digits).
pub const FINGERPRINT_LEN: usize = 16;

/// What a bundle vouches for: the fields its signature and its fingerprint cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartyIdentity {
    /// The party's index (0, 1 or 2).
    pub party: u8,
    /// The party's X25519 public key: what clients seal shares to.
    pub public_key: PartyPublicKey,
    /// The Ed25519 key the party signs its outputs with (`party_info()`'s `signing_key`):
    /// what clients verify results with.
    pub signing_key: VerifyingKey,
    /// The public half of the party operator's Ed25519 key, which signs the bundle.
    pub operator_key: VerifyingKey,
    /// SHA-256 of the DER form of the party's TLS CA certificate.
    pub tls_ca_sha256: [u8; 32],
}

impl PartyIdentity {
    /// `party (1) | X25519 key (32) | signing key (32) | operator key (32) | CA digest (32)`.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(129);
        out.push(self.party);
        out.extend_from_slice(self.public_key.as_bytes());
        out.extend_from_slice(self.signing_key.as_bytes());
        out.extend_from_slice(self.operator_key.as_bytes());
        out.extend_from_slice(&self.tls_ca_sha256);
        out
    }

    /// The message the operator signs: the domain label, the fields and the export time.
    fn signed_message(&self, created: u64) -> Vec<u8> {
        let mut message = SIGNATURE_DOMAIN.to_vec();
        message.extend_from_slice(&self.encode());
        message.extend_from_slice(&created.to_be_bytes());
        message
    }

    /// SHA-256 of the domain label and every field, truncated: what the operator reads out
    /// and the client compares. The export time is not covered, so exporting again gives the
    /// same fingerprint.
    pub fn fingerprint(&self) -> [u8; FINGERPRINT_LEN] {
        let mut hasher = Sha256::new();
        hasher.update(FINGERPRINT_DOMAIN);
        hasher.update(self.encode());
        let digest = hasher.finalize();
        let mut out = [0u8; FINGERPRINT_LEN];
        out.copy_from_slice(&digest[..FINGERPRINT_LEN]);
        out
    }

    /// The fingerprint, 32 lower-case hex digits.
    pub fn fingerprint_hex(&self) -> String {
        hex::encode(self.fingerprint())
    }

    /// Signs the identity with the operator's key (which must be `operator_key`'s secret
    /// half) at time `created` (seconds since the Unix epoch): the bundle to hand out.
    pub fn sign(&self, operator: &OperatorSigningKey, created: u64) -> Result<IdentityBundle> {
        let signing = SigningKey::from_bytes(&operator.to_bytes());
        if signing.verifying_key() != self.operator_key {
            bail!(
                "P{}'s identity names another operator key than the one signing it",
                self.party
            );
        }
        let signature = signing.sign(&self.signed_message(created));
        Ok(IdentityBundle {
            format: BUNDLE_FORMAT.to_owned(),
            party: self.party,
            public_key: self.public_key.to_hex(),
            signing_key: hex::encode(self.signing_key.as_bytes()),
            operator_key: hex::encode(self.operator_key.as_bytes()),
            tls_ca_sha256: hex::encode(self.tls_ca_sha256),
            created,
            signature: hex::encode(signature.to_bytes()),
            tls_ca_pem: None,
        })
    }
}

/// SHA-256 of the DER form of the first certificate in `pem`.
pub fn ca_digest(pem: &str) -> Result<[u8; 32]> {
    let cert = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .context("no PEM certificate")?
        .context("invalid PEM certificate")?;
    Ok(Sha256::digest(cert.as_ref()).into())
}

/// A bundle as a file holds it (JSON): every field in the clear for a human to read, the
/// signature over them, and optionally the CA certificate itself (its digest is signed).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdentityBundle {
    /// [`BUNDLE_FORMAT`].
    pub format: String,
    /// The party's index.
    pub party: u8,
    /// The party's X25519 public key (64 hex digits).
    pub public_key: String,
    /// The party's output-signing Ed25519 public key (64 hex digits).
    pub signing_key: String,
    /// The operator's Ed25519 public key (64 hex digits).
    pub operator_key: String,
    /// SHA-256 of the party's TLS CA certificate, DER form (64 hex digits).
    pub tls_ca_sha256: String,
    /// When the operator exported it (seconds since the Unix epoch; signed).
    pub created: u64,
    /// The operator's Ed25519 signature (128 hex digits).
    pub signature: String,
    /// The party's TLS CA certificate (PEM), when handed out with the bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_pem: Option<String>,
}

fn hex32(text: &str, what: &str, party: u8) -> Result<[u8; 32]> {
    hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .with_context(|| format!("P{party}'s identity bundle: {what} is not 64 hex digits"))
}

impl IdentityBundle {
    /// Reads a bundle file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the identity bundle {}", path.display()))?;
        serde_json::from_str(text.trim())
            .with_context(|| format!("{} is not a privmatch identity bundle", path.display()))
    }

    /// Checks the format and the signature (and the CA certificate, when one is attached);
    /// returns what the bundle vouches for. Errors name the party the bundle claims to be.
    pub fn verify(&self) -> Result<PartyIdentity> {
        let party = self.party;
        if self.format != BUNDLE_FORMAT {
            bail!(
                "P{party}'s identity bundle has format {:?}, not {BUNDLE_FORMAT}",
                self.format
            );
        }
        if party > 2 {
            bail!("an identity bundle names party {party}: a party index is 0, 1 or 2");
        }
        let public_key = PartyPublicKey::from_hex(&self.public_key)
            .map_err(|e| anyhow::anyhow!("P{party}'s identity bundle: public_key: {e}"))?;
        let ed25519 = |text: &str, what: &str| -> Result<VerifyingKey> {
            VerifyingKey::from_bytes(&hex32(text, what, party)?)
                .ok()
                .filter(|k| !k.is_weak())
                .with_context(|| {
                    format!("P{party}'s identity bundle: {what} is not an Ed25519 key")
                })
        };
        let operator_key = ed25519(&self.operator_key, "operator_key")?;
        let identity = PartyIdentity {
            party,
            public_key,
            signing_key: ed25519(&self.signing_key, "signing_key")?,
            operator_key,
            tls_ca_sha256: hex32(&self.tls_ca_sha256, "tls_ca_sha256", party)?,
        };
        let signature: [u8; 64] = hex::decode(self.signature.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .with_context(|| {
                format!("P{party}'s identity bundle: signature is not 128 hex digits")
            })?;
        operator_key
            .verify_strict(
                &identity.signed_message(self.created),
                &Signature::from_bytes(&signature),
            )
            .map_err(|_| {
                anyhow::anyhow!(
                    "P{party}'s identity bundle: the signature does not verify under its operator key: the bundle was altered after its operator exported it (a substituted key?); refusing it"
                )
            })?;
        if let Some(pem) = &self.tls_ca_pem {
            let digest = ca_digest(pem)
                .with_context(|| format!("P{party}'s identity bundle: tls_ca_pem"))?;
            if digest != identity.tls_ca_sha256 {
                bail!("P{party}'s identity bundle: the attached CA certificate is not the one its operator signed; refusing it");
            }
        }
        Ok(identity)
    }

    /// Verifies the bundle and compares its fingerprint with `expected` (obtained from the
    /// party's operator out of band; hex, separators `:`, `-` and spaces ignored). Refuses a
    /// mismatch, naming the party.
    pub fn verify_fingerprint(&self, expected: &str) -> Result<PartyIdentity> {
        let identity = self.verify()?;
        let given = normalise_fingerprint(expected).with_context(|| {
            format!(
                "the fingerprint given for P{}'s identity bundle",
                identity.party
            )
        })?;
        let actual = identity.fingerprint_hex();
        if given != actual {
            bail!(
                "P{}'s identity bundle has fingerprint {actual}, not {given} as its operator told you: refusing to pin it (a substituted key, or the wrong bundle)",
                identity.party
            );
        }
        Ok(identity)
    }
}

/// A fingerprint as typed: lower-cased, separators dropped, checked to be 32 hex digits.
pub fn normalise_fingerprint(text: &str) -> Result<String> {
    let digits: String = text
        .chars()
        .filter(|c| !matches!(c, ':' | '-' | ' ' | '\t'))
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if digits.len() != 2 * FINGERPRINT_LEN || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "a fingerprint is {} hex digits, got {text:?}",
            2 * FINGERPRINT_LEN
        );
    }
    Ok(digits)
}

/// A bundle as the client configuration keeps it: the signed fields (without the CA
/// certificate) and the fingerprint the client compared when it pinned them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PinnedIdentity {
    /// The fingerprint compared at pinning time (32 hex digits).
    pub fingerprint: String,
    /// The bundle.
    #[serde(flatten)]
    pub bundle: IdentityBundle,
}

impl PinnedIdentity {
    /// Re-verifies the signature and the fingerprint recorded at pinning time.
    pub fn verify(&self) -> Result<PartyIdentity> {
        self.bundle.verify_fingerprint(&self.fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(party: u8, operator: &OperatorSigningKey) -> PartyIdentity {
        PartyIdentity {
            party,
            public_key: PartyPublicKey::from_bytes([party + 1; 32]),
            signing_key: SigningKey::from_bytes(&[party + 40; 32]).verifying_key(),
            operator_key: SigningKey::from_bytes(&operator.to_bytes()).verifying_key(),
            tls_ca_sha256: [9; 32],
        }
    }

    fn operator(seed: u8) -> OperatorSigningKey {
        OperatorSigningKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn a_bundle_verifies_and_its_fingerprint_ignores_the_export_time() {
        let op = operator(5);
        let id = identity(1, &op);
        let bundle = id.sign(&op, 1_700_000_000).expect("sign");
        assert_eq!(bundle.verify().expect("verify"), id);
        let later = id.sign(&op, 1_800_000_000).expect("sign");
        assert_eq!(
            later.verify().expect("verify").fingerprint(),
            id.fingerprint()
        );
        let spaced: String = id
            .fingerprint_hex()
            .to_uppercase()
            .as_bytes()
            .chunks(4)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(bundle.verify_fingerprint(&spaced).expect("pin"), id);
        // Through JSON and back, as a file carries it.
        let text = serde_json::to_string(&bundle).expect("json");
        let back: IdentityBundle = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, bundle);
    }

    #[test]
    fn a_substituted_key_or_fingerprint_is_refused_naming_the_party() {
        let op = operator(5);
        let id = identity(1, &op);
        let bundle = id.sign(&op, 7).expect("sign");
        // The key swapped in transit: the signature fails.
        let mut swapped = bundle.clone();
        swapped.public_key = hex::encode([0xee; 32]);
        let err = format!("{:#}", swapped.verify().expect_err("swapped key"));
        assert!(
            err.contains("P1's identity bundle") && err.contains("signature"),
            "{err}"
        );
        // Every signed field is covered, the time included.
        for field in 0..5 {
            let mut altered = bundle.clone();
            match field {
                0 => altered.party = 2,
                1 => altered.tls_ca_sha256 = hex::encode([8u8; 32]),
                2 => altered.created = 8,
                3 => {
                    altered.signing_key =
                        hex::encode(SigningKey::from_bytes(&[99; 32]).verifying_key().as_bytes())
                }
                _ => altered.operator_key = hex::encode(operator(6).verifying_key().to_bytes()),
            }
            assert!(altered.verify().is_err(), "field {field}");
        }
        // Re-signed by someone else's operator key: it verifies, but the fingerprint the
        // real operator gave out no longer matches.
        let attacker = operator(66);
        let mut forged_id = identity(1, &attacker);
        forged_id.public_key = PartyPublicKey::from_bytes([0xee; 32]);
        let forged = forged_id.sign(&attacker, 7).expect("sign");
        forged.verify().expect("a self-consistent forgery verifies");
        let err = format!(
            "{:#}",
            forged
                .verify_fingerprint(&id.fingerprint_hex())
                .expect_err("wrong fingerprint")
        );
        assert!(
            err.contains("P1's identity bundle has fingerprint") && err.contains("refusing"),
            "{err}"
        );
        // Signing with a key other than the one named is refused at export.
        assert!(id.sign(&attacker, 7).is_err());
        assert!(normalise_fingerprint("abc").is_err());
        assert!(bundle.verify_fingerprint("zz").is_err());
    }

    #[test]
    fn an_attached_ca_must_be_the_signed_one() {
        let dir = std::env::temp_dir().join(format!("pm-identity-ca-{}", std::process::id()));
        let ca = crate::tls::LocalCa::open_or_create(&dir).expect("CA");
        let pem = std::fs::read_to_string(ca.cert_path()).expect("CA certificate");
        std::fs::remove_dir_all(&dir).ok();
        let op = operator(3);
        let mut id = identity(0, &op);
        id.tls_ca_sha256 = ca_digest(&pem).expect("digest");
        let mut bundle = id.sign(&op, 1).expect("sign");
        bundle.tls_ca_pem = Some(pem.clone());
        bundle.verify().expect("attached CA matches");
        let mut other = id.clone();
        other.tls_ca_sha256 = [1; 32];
        let mut wrong = other.sign(&op, 1).expect("sign");
        wrong.tls_ca_pem = Some(pem);
        let err = format!("{:#}", wrong.verify().expect_err("other CA"));
        assert!(
            err.contains("P0") && err.contains("CA certificate"),
            "{err}"
        );
    }
}
