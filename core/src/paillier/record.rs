//! # The service provider's signed template record ([ABMR20] §6.1, σ)
//!
//! After a successful enrolment the service provider SP packs the device's ciphertexts and
//! signs them; in every matching session the device presents the record and the terminal
//! checks the signature instead of a new proof (Agrawal, Badrinarayanan, Mukherjee, Rindal,
//! "Game-Set-MATCH", CCS 2020, ePrint 2020/1363, Fig. 5 Round 2 step 1). The signature binds
//! everything the terminal relies on: which device, under which parameters (the packing
//! layout, the norm bound the proofs enforced, the protocol), with which public key, the packed
//! ciphertexts themselves, and until when.
//!
//! Canonical encoding, version 1 (all integers big endian):
//!
//! ```text
//! "PMPT" | version (1) | device id length (1) | device id (UTF-8)
//!        | params length (2) | params (the canonical parameter encoding)
//!        | public key length (2) | N (big endian, fixed length)
//!        | ciphertext count (2) | ciphertexts (each the fixed length of N², big endian)
//!        | expires at (8, Unix seconds, signed)
//!        | Ed25519 signature (64)
//! ```
//!
//! The Ed25519 signature (RFC 8032, strict verification) covers
//!
//! ```text
//! DOMAIN | device id length (1) | device id | expires at (8) | template_signing_bytes(params, epk, ⟦u*⟧)
//! ```
//!
//! ([`signing_message`]; the last part is what the matching protocols' Round 1 carries, see
//! `messages::template_signing_bytes`), so a terminal that receives Round 1 (params, epk,
//! ⟦u*⟧) and the short σ of [`SignedTemplate::round1_signature`] (device id, expiry,
//! signature) checks everything with [`verify_round1_signature`], and an SP key's signature
//! over anything else is never a template signature.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use super::cipher::{Ciphertext, PaillierError, PublicKey};
use super::messages::template_signing_bytes;
use super::params::{Params, ParamsError};

/// The label every template signature starts with.
pub const DOMAIN: &[u8] = b"privmatch paillier template v1";
const MAGIC: &[u8; 4] = b"PMPT";
const VERSION: u8 = 1;
const SIGNATURE_LEN: usize = 64;
/// Longest device id, in bytes.
pub const MAX_DEVICE_ID: usize = 64;

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The bytes are not a version-1 template record (the message names the field).
    #[error("template record: {0}")]
    Malformed(String),
    /// The device id is empty, too long, or has characters outside [A-Za-z0-9._:-].
    #[error("device id {0:?}: 1 to 64 characters from A-Z a-z 0-9 . _ : -")]
    BadDeviceId(String),
    /// The parameters do not decode.
    #[error("template record: {0}")]
    Params(#[from] ParamsError),
    /// The public key or a ciphertext is invalid.
    #[error("template record: {0}")]
    Paillier(#[from] PaillierError),
    /// The signature does not verify under the service provider's key.
    #[error("template record: the service provider's signature does not verify")]
    BadSignature,
    /// The record expired.
    #[error("template record of device {device}: expired at {expires_at} (now {now})")]
    Expired {
        /// The device.
        device: String,
        /// When it expired (Unix seconds).
        expires_at: i64,
        /// The time of the check.
        now: i64,
    },
}

/// Checks a device id: 1 to [`MAX_DEVICE_ID`] bytes of `[A-Za-z0-9._:-]`.
pub fn check_device_id(id: &str) -> Result<(), RecordError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_DEVICE_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(RecordError::BadDeviceId(id.chars().take(80).collect()))
    }
}

/// What the service provider signs: one enrolled device's packed encrypted template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateRecord {
    /// The device.
    pub device_id: String,
    /// The parameters (layout, norm bound, protocol) the template was enrolled under.
    pub params: Params,
    /// The device's Paillier public key.
    pub public_key: PublicKey,
    /// The packed ciphertexts ⟦u_1*⟧ … ⟦u_t*⟧.
    pub packed: Vec<Ciphertext>,
    /// Unix seconds after which terminals refuse the record.
    pub expires_at: i64,
}

/// A [`TemplateRecord`] with the service provider's signature, as stored and as presented.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedTemplate {
    /// The record.
    pub record: TemplateRecord,
    /// Ed25519 over [`signing_message`].
    pub signature: [u8; SIGNATURE_LEN],
}

fn push_len16(out: &mut Vec<u8>, len: usize, what: &str) -> Result<(), RecordError> {
    let len = u16::try_from(len)
        .map_err(|_| RecordError::Malformed(format!("{what} longer than 65535 bytes")))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

impl TemplateRecord {
    /// The canonical encoding (everything the signature covers, without [`DOMAIN`]).
    pub fn encode(&self) -> Result<Vec<u8>, RecordError> {
        check_device_id(&self.device_id)?;
        if self.packed.len() != self.params.layout().ciphertexts() {
            return Err(RecordError::Malformed(format!(
                "{} ciphertexts; the parameters give t = {}",
                self.packed.len(),
                self.params.layout().ciphertexts()
            )));
        }
        if self.public_key.modulus_bits() != self.params.modulus_bits() {
            return Err(RecordError::Malformed(
                "the public key's size differs from the parameters".into(),
            ));
        }
        let pk = &self.public_key;
        let params = self.params.to_bytes();
        let mut out = Vec::with_capacity(
            32 + params.len() + pk.modulus_bytes() + self.packed.len() * pk.ciphertext_bytes(),
        );
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.device_id.len() as u8);
        out.extend_from_slice(self.device_id.as_bytes());
        push_len16(&mut out, params.len(), "params")?;
        out.extend_from_slice(&params);
        let n = pk.to_bytes();
        push_len16(&mut out, n.len(), "public key")?;
        out.extend_from_slice(&n);
        out.extend_from_slice(&(self.packed.len() as u16).to_be_bytes());
        for c in &self.packed {
            out.extend_from_slice(&pk.ciphertext_to_bytes(c));
        }
        out.extend_from_slice(&self.expires_at.to_be_bytes());
        Ok(out)
    }

    /// The bytes the service provider signs ([`signing_message`]).
    pub fn signing_message(&self) -> Result<Vec<u8>, RecordError> {
        check_device_id(&self.device_id)?;
        Ok(signing_message(
            &self.device_id,
            self.expires_at,
            &template_signing_bytes(&self.params, &self.public_key, &self.packed),
        ))
    }

    /// Signs the record with the service provider's key.
    pub fn sign(self, key: &SigningKey) -> Result<SignedTemplate, RecordError> {
        let message = self.signing_message()?;
        let signature = key.sign(&message).to_bytes();
        Ok(SignedTemplate {
            record: self,
            signature,
        })
    }
}

/// A cursor over bytes that names the field when they run out.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], RecordError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| RecordError::Malformed(format!("truncated in {what}")))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, RecordError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<usize, RecordError> {
        let b = self.take(2, what)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

impl SignedTemplate {
    /// The record followed by its signature.
    pub fn to_bytes(&self) -> Result<Vec<u8>, RecordError> {
        let mut out = self.record.encode()?;
        out.extend_from_slice(&self.signature);
        Ok(out)
    }

    /// Decodes a signed record, strictly (every length checked, every ciphertext an element of
    /// Z_{N²}^*, no trailing bytes), WITHOUT checking the signature: see [`Self::verify`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, RecordError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4, "magic")? != MAGIC {
            return Err(RecordError::Malformed("not a template record".into()));
        }
        let version = r.u8("version")?;
        if version != VERSION {
            return Err(RecordError::Malformed(format!(
                "version {version}; expected {VERSION}"
            )));
        }
        let id_len = usize::from(r.u8("device id length")?);
        let id = std::str::from_utf8(r.take(id_len, "device id")?)
            .map_err(|_| RecordError::Malformed("device id is not UTF-8".into()))?
            .to_owned();
        check_device_id(&id)?;
        let params_len = r.u16("params length")?;
        let params = Params::from_bytes(r.take(params_len, "params")?)?;
        let pk_len = r.u16("public key length")?;
        let public_key = PublicKey::from_bytes(r.take(pk_len, "public key")?)?;
        if public_key.modulus_bytes() != pk_len {
            return Err(RecordError::Malformed(
                "public key not of its fixed length".into(),
            ));
        }
        let count = r.u16("ciphertext count")?;
        if count != params.layout().ciphertexts()
            || public_key.modulus_bits() != params.modulus_bits()
        {
            return Err(RecordError::Malformed(format!(
                "{count} ciphertexts of a {}-bit key; the parameters give t = {} under {} bits",
                public_key.modulus_bits(),
                params.layout().ciphertexts(),
                params.modulus_bits()
            )));
        }
        let mut packed = Vec::with_capacity(count);
        for _ in 0..count {
            let raw = r.take(public_key.ciphertext_bytes(), "ciphertexts")?;
            packed.push(public_key.ciphertext_from_bytes(raw)?);
        }
        let expires = r.take(8, "expiry")?;
        let mut e = [0u8; 8];
        e.copy_from_slice(expires);
        let mut signature = [0u8; SIGNATURE_LEN];
        signature.copy_from_slice(r.take(SIGNATURE_LEN, "signature")?);
        if r.at != bytes.len() {
            return Err(RecordError::Malformed(format!(
                "{} trailing bytes",
                bytes.len() - r.at
            )));
        }
        Ok(Self {
            record: TemplateRecord {
                device_id: id,
                params,
                public_key,
                packed,
                expires_at: i64::from_be_bytes(e),
            },
            signature,
        })
    }

    /// Checks the service provider's signature and the expiry at time `now` (Unix seconds):
    /// the terminal's check of [ABMR20] Fig. 5 Round 2 step 1.
    pub fn verify(&self, key: &VerifyingKey, now: i64) -> Result<(), RecordError> {
        let message = self.record.signing_message()?;
        let signature = Signature::from_bytes(&self.signature);
        key.verify_strict(&message, &signature)
            .map_err(|_| RecordError::BadSignature)?;
        if now > self.record.expires_at {
            return Err(RecordError::Expired {
                device: self.record.device_id.clone(),
                expires_at: self.record.expires_at,
                now,
            });
        }
        Ok(())
    }
}

/// DOMAIN ‖ len(id) ‖ id ‖ expires_at ‖ `template_bytes` (the Round-1 signed bytes).
pub fn signing_message(device_id: &str, expires_at: i64, template_bytes: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 9 + device_id.len() + template_bytes.len());
    m.extend_from_slice(DOMAIN);
    m.push(device_id.len() as u8);
    m.extend_from_slice(device_id.as_bytes());
    m.extend_from_slice(&expires_at.to_be_bytes());
    m.extend_from_slice(template_bytes);
    m
}

impl SignedTemplate {
    /// σ as the device presents it in Round 1 of Π2 and Π3 (at most a few dozen bytes):
    /// `len(id) (1) ‖ id ‖ expires at (8) ‖ Ed25519 signature (64)`.
    pub fn round1_signature(&self) -> Vec<u8> {
        let id = self.record.device_id.as_bytes();
        let mut out = Vec::with_capacity(73 + id.len());
        out.push(id.len() as u8);
        out.extend_from_slice(id);
        out.extend_from_slice(&self.record.expires_at.to_be_bytes());
        out.extend_from_slice(&self.signature);
        out
    }
}

/// The terminal's check of [ABMR20] Fig. 5 Round 2 step (1) on a Round-1 message:
/// `template_bytes` are its signed bytes (params, epk, ⟦u*⟧), `sigma` the device's
/// [`SignedTemplate::round1_signature`]. Returns the device id the SP signed for, refused if the
/// signature does not verify under `key` or the record expired at `now`.
pub fn verify_round1_signature(
    key: &VerifyingKey,
    now: i64,
    template_bytes: &[u8],
    sigma: &[u8],
) -> Result<String, RecordError> {
    let mut r = Reader {
        bytes: sigma,
        at: 0,
    };
    let id_len = usize::from(r.u8("σ device id length")?);
    let id = std::str::from_utf8(r.take(id_len, "σ device id")?)
        .map_err(|_| RecordError::Malformed("device id is not UTF-8".into()))?
        .to_owned();
    check_device_id(&id)?;
    let mut e = [0u8; 8];
    e.copy_from_slice(r.take(8, "σ expiry")?);
    let expires_at = i64::from_be_bytes(e);
    let mut signature = [0u8; SIGNATURE_LEN];
    signature.copy_from_slice(r.take(SIGNATURE_LEN, "σ signature")?);
    if r.at != sigma.len() {
        return Err(RecordError::Malformed("σ has trailing bytes".into()));
    }
    let message = signing_message(&id, expires_at, template_bytes);
    key.verify_strict(&message, &Signature::from_bytes(&signature))
        .map_err(|_| RecordError::BadSignature)?;
    if now > expires_at {
        return Err(RecordError::Expired {
            device: id,
            expires_at,
            now,
        });
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::key_2048;
    use super::super::params::{Protocol, DEFAULT_STAT_BITS};
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;
    use rug::Integer;

    fn key(rng: &mut ChaCha20Rng) -> SigningKey {
        let mut seed = [0u8; 32];
        rand_core::RngCore::fill_bytes(rng, &mut seed);
        SigningKey::from_bytes(&seed)
    }

    fn record(rng: &mut ChaCha20Rng) -> TemplateRecord {
        let pk = key_2048().public_key().clone();
        let params = Params::new(
            Protocol::Pi2,
            40,
            8,
            2048,
            DEFAULT_STAT_BITS,
            Params::max_norm_bound(40, 8),
        )
        .unwrap();
        let packed = (0..params.layout().ciphertexts() as u32)
            .map(|i| pk.encrypt(&Integer::from(i), rng).unwrap())
            .collect();
        TemplateRecord {
            device_id: "phone-0001".into(),
            params,
            public_key: pk,
            packed,
            expires_at: 2_000_000_000,
        }
    }

    #[test]
    fn a_signed_record_round_trips_and_verifies() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let sp = key(&mut rng);
        let signed = record(&mut rng).sign(&sp).unwrap();
        let bytes = signed.to_bytes().unwrap();
        let back = SignedTemplate::from_bytes(&bytes).unwrap();
        assert_eq!(back, signed);
        back.verify(&sp.verifying_key(), 1_900_000_000).unwrap();
    }

    #[test]
    fn tampering_expiry_and_other_keys_are_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let sp = key(&mut rng);
        let vk = sp.verifying_key();
        let signed = record(&mut rng).sign(&sp).unwrap();
        let bytes = signed.to_bytes().unwrap();
        // A flipped bit anywhere before the signature: either undecodable or a bad signature.
        for at in (0..bytes.len() - SIGNATURE_LEN).step_by(7) {
            let mut t = bytes.clone();
            t[at] ^= 0x10;
            if let Ok(rec) = SignedTemplate::from_bytes(&t) {
                assert!(rec.verify(&vk, 0).is_err(), "bit flip at {at} accepted");
            }
        }
        let other = key(&mut rng);
        assert_eq!(
            signed.verify(&other.verifying_key(), 0),
            Err(RecordError::BadSignature)
        );
        assert!(matches!(
            signed.verify(&vk, 2_000_000_001),
            Err(RecordError::Expired { .. })
        ));
        // A ciphertext swapped for another valid one.
        let mut swapped = signed.clone();
        swapped.record.packed.swap(0, 1);
        assert_eq!(swapped.verify(&vk, 0), Err(RecordError::BadSignature));
    }

    #[test]
    fn the_round1_signature_verifies_against_the_protocol_bytes() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let sp = key(&mut rng);
        let signed = record(&mut rng).sign(&sp).unwrap();
        let rec = &signed.record;
        let bytes = template_signing_bytes(&rec.params, &rec.public_key, &rec.packed);
        let sigma = signed.round1_signature();
        let vk = sp.verifying_key();
        assert_eq!(
            verify_round1_signature(&vk, 0, &bytes, &sigma).unwrap(),
            "phone-0001"
        );
        assert!(matches!(
            verify_round1_signature(&vk, 2_000_000_001, &bytes, &sigma),
            Err(RecordError::Expired { .. })
        ));
        let mut other = rec.packed.clone();
        other.swap(0, 1);
        let swapped = template_signing_bytes(&rec.params, &rec.public_key, &other);
        assert_eq!(
            verify_round1_signature(&vk, 0, &swapped, &sigma),
            Err(RecordError::BadSignature)
        );
        // Another device id or expiry in σ.
        let mut forged = sigma.clone();
        forged[1] ^= 1;
        assert!(verify_round1_signature(&vk, 0, &bytes, &forged).is_err());
        let mut later = sigma.clone();
        later[1 + 10] ^= 0x40;
        assert!(verify_round1_signature(&vk, 0, &bytes, &later).is_err());
        for len in 0..sigma.len() {
            assert!(verify_round1_signature(&vk, 0, &bytes, &sigma[..len]).is_err());
        }
    }

    #[test]
    fn malformed_bytes_are_refused_without_panics() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let sp = key(&mut rng);
        let bytes = record(&mut rng).sign(&sp).unwrap().to_bytes().unwrap();
        for len in 0..bytes.len() {
            assert!(SignedTemplate::from_bytes(&bytes[..len]).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(SignedTemplate::from_bytes(&long).is_err());
        for bad in ["", "has space", "ü", &"x".repeat(65)] {
            assert!(check_device_id(bad).is_err());
        }
    }
}
