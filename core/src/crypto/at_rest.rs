//! Secrets a party must keep in its database but never in the clear there (issue 34, item 9):
//! the face dealer's threshold θ and its template master key K. The table is in every WAL
//! record and physical backup of the party, so the value is stored sealed under a key derived
//! from the party's key file, which is in none of them.
//!
//! ```text
//! sealed = "PMAR" | version (1) = 1 | nonce (24) | XChaCha20-Poly1305(plaintext) with tag (16)
//! key    = HKDF-SHA256(salt = "privmatch at rest v1", ikm = party X25519 secret,
//!                      info = purpose)
//! AAD    = "PMAR" | version | party index (1) | purpose
//! ```
//!
//! The purpose (e.g. `"face-dealer-threshold"`) separates the keys and binds each value to the
//! column it was written for: a sealed θ copied into K's column does not open. A value sealed
//! under an earlier party key does not open after the key is rotated
//! ([`AtRestError::WrongKey`]): the operator then configures the secret again.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hkdf::Hkdf;
use rand_core::{CryptoRng, RngCore};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::crypto::seal::PartySecretKey;
use crate::party::PartyIndex;

const MAGIC: &[u8; 4] = b"PMAR";
const VERSION: u8 = 1;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
const SALT: &[u8] = b"privmatch at rest v1";

/// Bytes sealing adds to a plaintext.
pub const OVERHEAD: usize = MAGIC.len() + 1 + NONCE_LEN + TAG_LEN;

/// Why a stored value does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AtRestError {
    /// Not a sealed value of this version.
    #[error("not a sealed at-rest value of version 1")]
    Malformed,
    /// The value does not authenticate under this party's key and this purpose: sealed under
    /// another (an earlier, rotated) party key, for another column, or altered.
    #[error("the stored secret does not open under this party's key file (sealed under another key, for another purpose, or altered)")]
    WrongKey,
}

/// The key that seals one purpose's secrets at one party.
pub struct AtRestKey {
    party: PartyIndex,
    purpose: String,
    key: Zeroizing<[u8; 32]>,
}

impl AtRestKey {
    /// Derives the key of `purpose` at party `party` from its secret key.
    pub fn derive(secret: &PartySecretKey, party: PartyIndex, purpose: &str) -> Self {
        let ikm = Zeroizing::new(secret.to_bytes());
        let hk = Hkdf::<Sha256>::new(Some(SALT), ikm.as_slice());
        let mut key = Zeroizing::new([0u8; 32]);
        // 32 bytes is always a valid HKDF-SHA256 output length.
        hk.expand(purpose.as_bytes(), key.as_mut_slice())
            .expect("HKDF-SHA256 can expand 32 bytes");
        AtRestKey {
            party,
            purpose: purpose.to_owned(),
            key,
        }
    }

    fn aad(&self) -> Vec<u8> {
        let mut aad = Vec::with_capacity(6 + self.purpose.len());
        aad.extend_from_slice(MAGIC);
        aad.push(VERSION);
        aad.push(self.party.as_u8());
        aad.extend_from_slice(self.purpose.as_bytes());
        aad
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(self.key.as_slice()))
    }

    /// Seals `plaintext` with a fresh random nonce from `rng`.
    pub fn seal<R: RngCore + CryptoRng>(&self, rng: &mut R, plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        let aad = self.aad();
        // Encryption with a 24-byte nonce cannot fail for plaintexts this small.
        let sealed = self
            .cipher()
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: &aad,
                },
            )
            .expect("XChaCha20-Poly1305 encrypts any plaintext under 256 GiB");
        let mut out = Vec::with_capacity(OVERHEAD + plaintext.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// Opens a value sealed by [`AtRestKey::seal`] under this key.
    pub fn open(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, AtRestError> {
        if sealed.len() < OVERHEAD || &sealed[..4] != MAGIC || sealed[4] != VERSION {
            return Err(AtRestError::Malformed);
        }
        let nonce = XNonce::from_slice(&sealed[5..5 + NONCE_LEN]);
        let aad = self.aad();
        self.cipher()
            .decrypt(
                nonce,
                Payload {
                    msg: &sealed[5 + NONCE_LEN..],
                    aad: &aad,
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| AtRestError::WrongKey)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    use super::*;

    fn secret(seed: u64) -> PartySecretKey {
        PartySecretKey::generate(&mut ChaCha20Rng::seed_from_u64(seed))
    }

    const P2: PartyIndex = PartyIndex::ALL[2];

    #[test]
    fn a_sealed_value_opens_only_under_its_key_party_and_purpose() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let key = AtRestKey::derive(&secret(1), P2, "face-dealer-threshold");
        let sealed = key.seal(&mut rng, b"0.7");
        assert_eq!(sealed.len(), OVERHEAD + 3);
        assert!(!sealed.windows(3).any(|w| w == b"0.7"));
        assert_eq!(key.open(&sealed).expect("opens").as_slice(), b"0.7");
        for other in [
            AtRestKey::derive(&secret(2), P2, "face-dealer-threshold"),
            AtRestKey::derive(&secret(1), PartyIndex::ALL[1], "face-dealer-threshold"),
            AtRestKey::derive(&secret(1), P2, "face-template-master"),
        ] {
            assert_eq!(other.open(&sealed), Err(AtRestError::WrongKey));
        }
        for i in 0..sealed.len() {
            let mut tampered = sealed.clone();
            tampered[i] ^= 1;
            assert!(
                key.open(&tampered).is_err(),
                "bit flip at byte {i} accepted"
            );
        }
        assert_eq!(
            key.open(&sealed[..OVERHEAD - 1]),
            Err(AtRestError::Malformed)
        );
    }

    #[test]
    fn two_seals_of_one_value_differ() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let key = AtRestKey::derive(&secret(1), P2, "face-template-master");
        assert_ne!(key.seal(&mut rng, &[5; 32]), key.seal(&mut rng, &[5; 32]));
    }
}
