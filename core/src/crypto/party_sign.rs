//! A party's own signing key: Ed25519 (RFC 8032; `ed25519-dalek`, strict verification),
//! derived deterministically from the party's long-term X25519 secret (its key file) with
//! domain separation, so a party needs no second secret to sign what it outputs, and clients
//! pin the public half beside the party's X25519 key (`party_info()` shows it).
//!
//! A party signs what it computed (e.g. its output of an iris search, `crate::iris::output`),
//! so that a client can refuse a result the coordinator changed on the way. Every signature
//! covers [`DOMAIN`], a context label naming what is signed, and the message:
//! `DOMAIN ‖ len(context) (1) ‖ context ‖ message`; a signature over one kind of output can
//! never be taken for another.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::crypto::seal::PartySecretKey;

/// The label of the derivation of the signing seed from the X25519 secret.
const DERIVATION: &[u8] = b"privmatch party signing key v1";
/// The label every party signature starts with.
pub const DOMAIN: &[u8] = b"privmatch party signature v1";
/// Bytes of a signature.
pub const SIGNATURE_LEN: usize = 64;

/// Why a party signature or key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartySignError {
    /// Not a valid Ed25519 public key.
    #[error("not an Ed25519 public key (64 hex digits of a valid point)")]
    BadKey,
    /// The signature does not verify.
    #[error("the signature does not verify under the party's signing key")]
    BadSignature,
}

/// A party's signing key (derived, never stored). Zeroised on drop, never printed.
pub struct PartySigningKey(SigningKey);

impl std::fmt::Debug for PartySigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PartySigningKey({})", self.verifying_key().to_hex())
    }
}

fn signed_message(context: &[u8], message: &[u8]) -> Vec<u8> {
    // Contexts are short constants of the code.
    let context = &context[..context.len().min(255)];
    let mut out = Vec::with_capacity(DOMAIN.len() + 1 + context.len() + message.len());
    out.extend_from_slice(DOMAIN);
    out.push(context.len() as u8);
    out.extend_from_slice(context);
    out.extend_from_slice(message);
    out
}

impl PartySigningKey {
    /// The signing key of the party whose X25519 secret is `secret`: the Ed25519 seed is
    /// SHA-256(`"privmatch party signing key v1"` ‖ secret).
    pub fn derive(secret: &PartySecretKey) -> Self {
        let secret = Zeroizing::new(secret.to_bytes());
        let mut h = Sha256::new();
        h.update(DERIVATION);
        h.update(secret.as_slice());
        let seed: Zeroizing<[u8; 32]> = Zeroizing::new(h.finalize().into());
        PartySigningKey(SigningKey::from_bytes(&seed))
    }

    /// The public half.
    pub fn verifying_key(&self) -> PartyVerifyingKey {
        PartyVerifyingKey(self.0.verifying_key())
    }

    /// Signs `message` under `context` (module docs).
    pub fn sign(&self, context: &[u8], message: &[u8]) -> [u8; SIGNATURE_LEN] {
        self.0.sign(&signed_message(context, message)).to_bytes()
    }
}

/// The public half of a party's signing key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PartyVerifyingKey(VerifyingKey);

impl std::fmt::Debug for PartyVerifyingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PartyVerifyingKey({})", self.to_hex())
    }
}

impl PartyVerifyingKey {
    /// Parses 32 bytes, refusing an invalid or weak point.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PartySignError> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| PartySignError::BadKey)?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| PartySignError::BadKey)?;
        if key.is_weak() {
            return Err(PartySignError::BadKey);
        }
        Ok(PartyVerifyingKey(key))
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, PartySignError> {
        let bytes = hex::decode(text.trim()).map_err(|_| PartySignError::BadKey)?;
        Self::from_bytes(&bytes)
    }

    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.to_bytes())
    }

    /// Checks `signature` over `message` under `context` (strict verification).
    pub fn verify(
        &self,
        context: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), PartySignError> {
        let signature =
            Signature::from_slice(signature).map_err(|_| PartySignError::BadSignature)?;
        self.0
            .verify_strict(&signed_message(context, message), &signature)
            .map_err(|_| PartySignError::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn derived_keys_are_deterministic_and_signatures_are_bound_to_their_context() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let secret = PartySecretKey::generate(&mut rng);
        let key = PartySigningKey::derive(&secret);
        assert_eq!(
            key.verifying_key(),
            PartySigningKey::derive(&secret).verifying_key()
        );
        let other = PartySigningKey::derive(&PartySecretKey::generate(&mut rng));
        assert_ne!(key.verifying_key(), other.verifying_key());
        let public = key.verifying_key();
        let signature = key.sign(b"iris output", b"message");
        assert_eq!(
            public.verify(b"iris output", b"message", &signature),
            Ok(())
        );
        for (context, message) in [
            (&b"face output"[..], &b"message"[..]),
            (b"iris output", b"messagf"),
        ] {
            assert_eq!(
                public.verify(context, message, &signature),
                Err(PartySignError::BadSignature)
            );
        }
        assert!(other
            .verifying_key()
            .verify(b"iris output", b"message", &signature)
            .is_err());
        assert_eq!(PartyVerifyingKey::from_hex(&public.to_hex()), Ok(public));
        assert!(PartyVerifyingKey::from_hex("00").is_err());
        // The seed is not the X25519 secret itself.
        assert_ne!(key.0.to_bytes(), secret.to_bytes());
    }
}
