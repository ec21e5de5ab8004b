//! # The service provider's signed verdict of a Π2 or Π3 session
//!
//! In Π2 and Π3 of [ABMR20] (Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH",
//! CCS 2020, ePrint 2020/1363; §6.1 Round 4, Fig. 5 "Output Computation") the terminal T
//! computes the decision. In privmatch the service provider SP runs T's rounds (SP and T may
//! collude in the paper's model, so this is inside it), and the decision reaches the terminal
//! through the coordinator, which is not trusted. So the SP signs it with its Ed25519 key (the
//! key that signs the template records, which every client pins) over
//!
//! ```text
//! "privmatch/paillier/verdict/v1" | protocol code (1) | session id (16)
//!   | len(device id) (u16, BE) | device id | matched (1) | valid (1)
//! ```
//!
//! The session id is the one T drew and sealed to the SP in its input, so a verdict cannot be
//! replayed into another session, moved to another device or turned from `no_match` into
//! `match` without the SP's key: the coordinator can withhold a verdict, not change one.
//! Π1 has no verdict of the SP: there the device reports the bit (all parties semi-honest).

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

use super::params::Protocol;

/// Domain separation of [`Verdict::signing_bytes`].
const VERDICT_DOMAIN: &[u8] = b"privmatch/paillier/verdict/v1";

/// Bytes of a verdict's signature (Ed25519).
pub const VERDICT_SIGNATURE_BYTES: usize = 64;

/// Why a verdict's signature is not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerdictError {
    /// The signature does not have [`VERDICT_SIGNATURE_BYTES`] bytes.
    #[error("the verdict's signature has {0} bytes, expected {VERDICT_SIGNATURE_BYTES}")]
    Length(usize),
    /// It is not the pinned service provider's signature of this verdict.
    #[error(
        "the verdict ({0}) is not signed by the pinned service provider for this session and \
         device: the coordinator's report is not trusted"
    )]
    Forged(String),
}

/// The decision of one Π2 or Π3 session as the SP reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict<'a> {
    /// Π2 or Π3.
    pub protocol: Protocol,
    /// T's session id (from its sealed input).
    pub session: [u8; 16],
    /// The device the session matched against.
    pub device_id: &'a str,
    /// T's decision [IP ≥ threshold] (false when the answer was refused).
    pub matched: bool,
    /// False when the device's answer was refused (a cheating device).
    pub valid: bool,
}

impl Verdict<'_> {
    /// The canonical bytes the SP signs (module documentation). Device ids are at most
    /// [`super::record::MAX_DEVICE_ID`] bytes (checked at enrolment), well within the u16
    /// length.
    pub fn signing_bytes(&self) -> Vec<u8> {
        let id = self.device_id.as_bytes();
        let mut out = Vec::with_capacity(VERDICT_DOMAIN.len() + 21 + id.len());
        out.extend_from_slice(VERDICT_DOMAIN);
        out.push(self.protocol.code());
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&(id.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
        out.extend_from_slice(id);
        out.push(u8::from(self.matched));
        out.push(u8::from(self.valid));
        out
    }

    /// The SP's signature of this verdict.
    pub fn sign(&self, key: &SigningKey) -> [u8; VERDICT_SIGNATURE_BYTES] {
        key.sign(&self.signing_bytes()).to_bytes()
    }

    /// Checks `signature` against the pinned SP key (strict Ed25519 verification).
    pub fn verify(&self, key: &VerifyingKey, signature: &[u8]) -> Result<(), VerdictError> {
        let bytes: [u8; VERDICT_SIGNATURE_BYTES] = signature
            .try_into()
            .map_err(|_| VerdictError::Length(signature.len()))?;
        key.verify_strict(&self.signing_bytes(), &Signature::from_bytes(&bytes))
            .map_err(|_| VerdictError::Forged(self.describe()))
    }

    fn describe(&self) -> String {
        let outcome = match (self.valid, self.matched) {
            (false, _) => "refused",
            (true, true) => "match",
            (true, false) => "no match",
        };
        format!("{outcome} for device {:?}", self.device_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(device_id: &str) -> Verdict<'_> {
        Verdict {
            protocol: Protocol::Pi3,
            session: [7u8; 16],
            device_id,
            matched: false,
            valid: true,
        }
    }

    #[test]
    fn a_verdict_verifies_only_as_signed() {
        let sp = SigningKey::from_bytes(&[1u8; 32]);
        let other = SigningKey::from_bytes(&[2u8; 32]);
        let v = verdict("phone-1");
        let sig = v.sign(&sp);
        assert_eq!(v.verify(&sp.verifying_key(), &sig), Ok(()));
        // Every field is bound: a changed outcome, session, device or protocol is refused.
        let changed = [
            Verdict {
                matched: true,
                ..verdict("phone-1")
            },
            Verdict {
                valid: false,
                ..verdict("phone-1")
            },
            Verdict {
                session: [8u8; 16],
                ..verdict("phone-1")
            },
            Verdict {
                protocol: Protocol::Pi2,
                ..verdict("phone-1")
            },
            verdict("phone-2"),
            verdict("phone-"),
        ];
        for c in &changed {
            assert!(
                matches!(
                    c.verify(&sp.verifying_key(), &sig),
                    Err(VerdictError::Forged(_))
                ),
                "{c:?}"
            );
        }
        // Another key, a short or tampered signature.
        assert!(v.verify(&other.verifying_key(), &sig).is_err());
        assert_eq!(
            v.verify(&sp.verifying_key(), &sig[..63]),
            Err(VerdictError::Length(63))
        );
        let mut bad = sig;
        bad[10] ^= 1;
        assert!(v.verify(&sp.verifying_key(), &bad).is_err());
    }

    #[test]
    fn signing_bytes_are_the_documented_layout() {
        let v = Verdict {
            protocol: Protocol::Pi2,
            session: [0xab; 16],
            device_id: "d",
            matched: true,
            valid: true,
        };
        let mut want = b"privmatch/paillier/verdict/v1".to_vec();
        want.push(2);
        want.extend_from_slice(&[0xab; 16]);
        want.extend_from_slice(&[0, 1, b'd', 1, 1]);
        assert_eq!(v.signing_bytes(), want);
    }
}
