//! # The service provider's signature on every Round 2 it produces
//!
//! In privmatch the service provider SP computes the terminal's Round 2 of [ABMR20] (Agrawal,
//! Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile Devices for Seamless
//! External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363; Fig. 3 Round 2 for Π1,
//! §6.1 Round 2 for Π2, Fig. 5 Round 2 for Π3) and the coordinator, which is not trusted,
//! carries it to the device. The paper's terminal talks to the device directly; here a relay
//! could otherwise write a Round 2 of its own under the device's public key (Enc(0) with
//! threshold −1 in Π1; a power of a template ciphertext in Π2, whose X then returns template
//! values) or keep the SP's ciphertext and lower the threshold beside it. So the SP signs every
//! Round 2 with its Ed25519 key (the key that signs the template records, which the device
//! pinned at enrolment, out of band), and the device decrypts nothing that this signature does
//! not cover.
//!
//! The envelope (what the SP's `paillier_piN_round2` returns and the coordinator relays; all
//! integers big endian; [`WIRE_VERSION`], kind [`MessageKind::SignedRound2`] = 0x50, so a device
//! of an earlier build refuses it by kind instead of misreading it):
//!
//! ```text
//! version (1) | kind (1) = 0x50 | protocol code (1) | session (16)
//!   | device id length (1) | device id | threshold (8, signed) | expires at (8, Unix s)
//!   | terminal reply key (32) | payload length (4) | payload (the protocol's Round 2 message)
//!   | Ed25519 signature (64)
//! ```
//!
//! and the signature covers
//!
//! ```text
//! "privmatch/paillier/signed-round2/v2" | protocol code (1) | session (16)
//!   | len(device id) (u16) | device id | threshold (8) | expires at (8) | reply key (32)
//!   | SHA-256(payload)
//! ```
//!
//! The terminal's reply key (since 0.12.0; domain v2) is the X25519 key the terminal put in its
//! input sealed to the SP (`terminal.rs`): a Π1 device seals its Round 3 to it (`sealed.rs`), so
//! the coordinator, which cannot swap a key the SP signed, never sees the bit.
//!
//! **Round 4** (Π2 and Π3, since 0.12.0) comes in an envelope of its own, [`SignedRound4`]
//! (kind 0x51), signed over the session, device, protocol, SHA-256 of the device's own Round 3
//! as the SP received it and SHA-256 of the payload: a Round 4 the relay wrote, or took from
//! another session, or made for another Round 3, is refused before the device uses it.
//!
//! The session id is the one the terminal drew and sealed to the SP in its input (only the SP
//! can open it), and the device signs its own reply for that same id: a session the relay makes
//! up has no SP signature, and a signed Round 2 cannot be moved to another session, device or
//! protocol. The threshold is the policy threshold the SP applied (module `terminal`: the
//! terminal cannot choose another); in Π1 and Π3, where the threshold also travels inside the
//! payload, the device requires the two to be equal. A Round 2 past its expiry (the SP's session
//! lifetime) is refused, so an old signed Round 2 cannot be replayed later.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::messages::{header, MatchError, MessageKind, Reader, WIRE_VERSION};
use super::params::Protocol;
use super::record::check_device_id;

/// Domain separation of the signed bytes.
const DOMAIN: &[u8] = b"privmatch/paillier/signed-round2/v2";
/// Domain separation of the bytes the SP signs for a Round 4.
const DOMAIN4: &[u8] = b"privmatch/paillier/signed-round4/v1";
/// Bytes of the SP's signature (Ed25519).
pub const SIGNATURE_BYTES: usize = 64;
/// The largest Round 2 payload accepted (Π3 at 4096-bit N is two ciphertexts of 1 KiB).
pub const MAX_PAYLOAD: usize = 1 << 16;
/// How far past its expiry a device still accepts a Round 2 (clock skew between the SP and
/// the device), seconds.
pub const CLOCK_SKEW_SECS: i64 = 300;

/// A Round 2 as the SP signed it, with what the signature binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedRound2 {
    /// Π1, Π2 or Π3.
    pub protocol: Protocol,
    /// The terminal's session id (from its input sealed to the SP).
    pub session: [u8; 16],
    /// The device whose record the SP computed on.
    pub device_id: String,
    /// The policy threshold in force for the session.
    pub threshold: i64,
    /// Until when the device may answer (Unix seconds).
    pub expires_at: i64,
    /// The terminal's reply key (X25519, from its sealed input): where a Π1 device seals its
    /// Round 3 (`sealed.rs`).
    pub reply_key: [u8; 32],
    /// The protocol's Round 2 message (`Pi1Round2`, `Pi2Round2`, `Pi3Round2` bytes).
    pub payload: Vec<u8>,
}

impl SignedRound2 {
    /// The bytes the SP signs (module documentation).
    fn signing_bytes(&self) -> Vec<u8> {
        let id = self.device_id.as_bytes();
        let mut out = Vec::with_capacity(DOMAIN.len() + 67 + id.len());
        out.extend_from_slice(DOMAIN);
        out.push(self.protocol.code());
        out.extend_from_slice(&self.session);
        // Device ids are at most 64 bytes (checked before signing and when decoding).
        out.extend_from_slice(&(id.len() as u16).to_be_bytes());
        out.extend_from_slice(id);
        out.extend_from_slice(&self.threshold.to_be_bytes());
        out.extend_from_slice(&self.expires_at.to_be_bytes());
        out.extend_from_slice(&self.reply_key);
        out.extend_from_slice(&Sha256::digest(&self.payload));
        out
    }

    /// The SP's side: the envelope with its signature under `key`. Refuses a device id that
    /// is not valid or a payload over [`MAX_PAYLOAD`].
    pub fn sign(&self, key: &SigningKey) -> Result<Vec<u8>, MatchError> {
        check_device_id(&self.device_id).map_err(|e| MatchError::Argument {
            argument: "device_id",
            reason: e.to_string(),
        })?;
        if self.payload.len() > MAX_PAYLOAD {
            return Err(MatchError::Argument {
                argument: "payload",
                reason: format!("{} bytes, at most {MAX_PAYLOAD}", self.payload.len()),
            });
        }
        let signature = key.sign(&self.signing_bytes()).to_bytes();
        let id = self.device_id.as_bytes();
        let mut out = header(MessageKind::SignedRound2);
        out.reserve(72 + id.len() + self.payload.len() + SIGNATURE_BYTES);
        out.push(self.protocol.code());
        out.extend_from_slice(&self.session);
        out.push(id.len() as u8);
        out.extend_from_slice(id);
        out.extend_from_slice(&self.threshold.to_be_bytes());
        out.extend_from_slice(&self.expires_at.to_be_bytes());
        out.extend_from_slice(&self.reply_key);
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.payload);
        out.extend_from_slice(&signature);
        Ok(out)
    }

    /// Strict decoding of [`Self::sign`]'s envelope, without checking the signature: the
    /// fields and the signature bytes.
    fn decode(bytes: &[u8]) -> Result<(Self, [u8; SIGNATURE_BYTES]), MatchError> {
        let mut r = Reader::new("signed Round 2", bytes, MessageKind::SignedRound2)?;
        let protocol = Protocol::from_code(r.u8("protocol")?)?;
        let mut session = [0u8; 16];
        session.copy_from_slice(r.take(16, "session")?);
        let id_len = usize::from(r.u8("device id length")?);
        let device_id = std::str::from_utf8(r.take(id_len, "device id")?)
            .map_err(|_| r.error("device id is not UTF-8"))?
            .to_owned();
        check_device_id(&device_id).map_err(|e| r.error(e.to_string()))?;
        let threshold = i64::from_be_bytes(eight(r.take(8, "threshold")?));
        let expires_at = i64::from_be_bytes(eight(r.take(8, "expires at")?));
        let mut reply_key = [0u8; 32];
        reply_key.copy_from_slice(r.take(32, "reply key")?);
        let len = r.u32("payload length")? as usize;
        if len > MAX_PAYLOAD {
            return Err(r.error(format!("payload of {len} bytes, at most {MAX_PAYLOAD}")));
        }
        let payload = r.take(len, "payload")?.to_vec();
        let mut signature = [0u8; SIGNATURE_BYTES];
        signature.copy_from_slice(r.take(SIGNATURE_BYTES, "signature")?);
        r.finish()?;
        Ok((
            Self {
                protocol,
                session,
                device_id,
                threshold,
                expires_at,
                reply_key,
                payload,
            },
            signature,
        ))
    }

    /// The device's check before it decrypts anything: `bytes` must be a Round 2 the pinned
    /// service provider key `service` signed, for this device (`device_id`), its enrolled
    /// `protocol` and the `session` the device is about to answer (and sign its reply for),
    /// not expired at `now` (Unix seconds, [`CLOCK_SKEW_SECS`] of grace). Anything else is a
    /// [`MatchError::Unsigned`] naming what differs; the device then decrypts nothing and
    /// sends no verdict.
    pub fn open(
        bytes: &[u8],
        service: &VerifyingKey,
        device_id: &str,
        protocol: Protocol,
        session: &[u8; 16],
        now: i64,
    ) -> Result<VerifiedRound2, MatchError> {
        let (round2, signature) = Self::decode(bytes).map_err(|e| match e {
            // A Round 2 of an earlier build (no envelope) is an unsigned one, not just junk.
            MatchError::Wire { reason, .. }
                if bytes.get(..2).is_some_and(|h| {
                    h[0] == WIRE_VERSION && h[1] != MessageKind::SignedRound2 as u8
                }) =>
            {
                MatchError::Unsigned(format!("not a signed Round 2 ({reason})"))
            }
            other => other,
        })?;
        service
            .verify_strict(&round2.signing_bytes(), &Signature::from_bytes(&signature))
            .map_err(|_| {
                MatchError::Unsigned(
                    "the signature is not the pinned service provider's over this Round 2".into(),
                )
            })?;
        if round2.device_id != device_id {
            return Err(MatchError::Unsigned(format!(
                "signed for device {:?}, not {device_id:?}",
                round2.device_id
            )));
        }
        if round2.protocol != protocol {
            return Err(MatchError::Unsigned(format!(
                "signed for {:?}, the device is enrolled for {protocol:?}",
                round2.protocol
            )));
        }
        if &round2.session != session {
            return Err(MatchError::Unsigned(
                "signed for another session than the one relayed with it".into(),
            ));
        }
        if now > round2.expires_at.saturating_add(CLOCK_SKEW_SECS) {
            return Err(MatchError::Unsigned(format!(
                "expired at {} (now {now})",
                round2.expires_at
            )));
        }
        Ok(VerifiedRound2(round2))
    }
}

fn eight(b: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(b);
    out
}

/// A Round 2 whose SP signature, device, protocol, session and expiry [`SignedRound2::open`]
/// checked: the only input the devices' `*_signed` rounds take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedRound2(SignedRound2);

impl VerifiedRound2 {
    /// What the signature covers.
    pub fn fields(&self) -> &SignedRound2 {
        &self.0
    }

    /// The protocol's Round 2 message.
    pub fn payload(&self) -> &[u8] {
        &self.0.payload
    }

    /// The policy threshold the SP signed.
    pub fn threshold(&self) -> i64 {
        self.0.threshold
    }

    /// The session id.
    pub fn session(&self) -> &[u8; 16] {
        &self.0.session
    }

    /// The terminal's reply key the SP signed.
    pub fn reply_key(&self) -> &[u8; 32] {
        &self.0.reply_key
    }

    /// Requires the threshold inside the payload to be the signed one (Π1, Π3).
    pub fn require_threshold(&self, in_payload: i64) -> Result<(), MatchError> {
        if in_payload != self.0.threshold {
            return Err(MatchError::Unsigned(format!(
                "the payload's threshold {in_payload} is not the signed policy threshold {}",
                self.0.threshold
            )));
        }
        Ok(())
    }
}

/// SHA-256 of a device's Round 3 as posted: what [`SignedRound4`] binds.
pub fn round3_digest(round3: &[u8]) -> [u8; 32] {
    Sha256::digest(round3).into()
}

/// The SP's Round 4 of Π2 or Π3 (§6.1 Round 4; Fig. 5 Round 4) as it signed it (module
/// documentation): the envelope is
///
/// ```text
/// version (1) | kind (1) = 0x51 | protocol code (1) | session (16) | device id length (1)
///   | device id | SHA-256(Round 3) (32) | payload length (4) | payload | Ed25519 signature (64)
/// ```
///
/// signed over `"privmatch/paillier/signed-round4/v1" | protocol | session | len(device id)
/// (u16) | device id | SHA-256(Round 3) | SHA-256(payload)`. The payload is sealed to the
/// device's reply key (`sealed.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedRound4 {
    /// Π2 or Π3.
    pub protocol: Protocol,
    /// The terminal's session id.
    pub session: [u8; 16],
    /// The device.
    pub device_id: String,
    /// SHA-256 of the device's Round 3 as the SP received it (the bytes the device posted).
    pub round3_digest: [u8; 32],
    /// The Round 4 for the device (sealed to its reply key).
    pub payload: Vec<u8>,
}

impl SignedRound4 {
    fn signing_bytes(&self) -> Vec<u8> {
        let id = self.device_id.as_bytes();
        let mut out = Vec::with_capacity(DOMAIN4.len() + 83 + id.len());
        out.extend_from_slice(DOMAIN4);
        out.push(self.protocol.code());
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&(id.len() as u16).to_be_bytes());
        out.extend_from_slice(id);
        out.extend_from_slice(&self.round3_digest);
        out.extend_from_slice(&Sha256::digest(&self.payload));
        out
    }

    /// The SP's side: the envelope signed with `key`.
    pub fn sign(&self, key: &SigningKey) -> Result<Vec<u8>, MatchError> {
        check_device_id(&self.device_id).map_err(|e| MatchError::Argument {
            argument: "device_id",
            reason: e.to_string(),
        })?;
        let len = u32::try_from(self.payload.len()).map_err(|_| MatchError::Argument {
            argument: "payload",
            reason: "too long".into(),
        })?;
        let signature = key.sign(&self.signing_bytes()).to_bytes();
        let id = self.device_id.as_bytes();
        let mut out = header(MessageKind::SignedRound4);
        out.reserve(60 + id.len() + self.payload.len() + SIGNATURE_BYTES);
        out.push(self.protocol.code());
        out.extend_from_slice(&self.session);
        out.push(id.len() as u8);
        out.extend_from_slice(id);
        out.extend_from_slice(&self.round3_digest);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&self.payload);
        out.extend_from_slice(&signature);
        Ok(out)
    }

    /// The device's check: `bytes` must be a Round 4 the pinned SP key `service` signed for
    /// this device, `protocol`, `session` and the device's own `round3` (the bytes it posted);
    /// returns the payload. Anything else is [`MatchError::UnsignedRound4`], and the device
    /// uses nothing of it.
    pub fn open(
        bytes: &[u8],
        service: &VerifyingKey,
        device_id: &str,
        protocol: Protocol,
        session: &[u8; 16],
        round3: &[u8],
    ) -> Result<Vec<u8>, MatchError> {
        let refused = |reason: String| MatchError::UnsignedRound4(reason);
        let mut r = Reader::new("signed Round 4", bytes, MessageKind::SignedRound4)
            .map_err(|e| refused(e.to_string()))?;
        let decoded = (|| {
            let protocol = Protocol::from_code(r.u8("protocol")?)?;
            let mut session = [0u8; 16];
            session.copy_from_slice(r.take(16, "session")?);
            let id_len = usize::from(r.u8("device id length")?);
            let device_id = String::from_utf8_lossy(r.take(id_len, "device id")?).into_owned();
            let mut round3_digest = [0u8; 32];
            round3_digest.copy_from_slice(r.take(32, "Round 3 digest")?);
            let len = r.u32("payload length")? as usize;
            let payload = r.take(len, "payload")?.to_vec();
            let mut signature = [0u8; SIGNATURE_BYTES];
            signature.copy_from_slice(r.take(SIGNATURE_BYTES, "signature")?);
            Ok::<_, MatchError>((
                Self {
                    protocol,
                    session,
                    device_id,
                    round3_digest,
                    payload,
                },
                signature,
            ))
        })();
        let (round4, signature) = decoded.map_err(|e| refused(e.to_string()))?;
        r.finish().map_err(|e| refused(e.to_string()))?;
        service
            .verify_strict(&round4.signing_bytes(), &Signature::from_bytes(&signature))
            .map_err(|_| {
                refused(
                    "the signature is not the pinned service provider's over this Round 4".into(),
                )
            })?;
        if round4.device_id != device_id
            || round4.protocol != protocol
            || &round4.session != session
        {
            return Err(refused(
                "signed for another device, protocol or session (spliced from another session)"
                    .into(),
            ));
        }
        if round4.round3_digest != round3_digest(round3) {
            return Err(refused(
                "signed in answer to another Round 3 than this device's".into(),
            ));
        }
        Ok(round4.payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round2() -> SignedRound2 {
        SignedRound2 {
            protocol: Protocol::Pi1,
            session: [3u8; 16],
            device_id: "phone-1".into(),
            threshold: 1234,
            expires_at: 1_000_000,
            reply_key: [8u8; 32],
            payload: vec![1, 0x12, 9, 9, 9],
        }
    }

    #[test]
    fn a_signed_round2_opens_only_as_signed() {
        let sp = SigningKey::from_bytes(&[1u8; 32]);
        let other = SigningKey::from_bytes(&[2u8; 32]);
        let vk = sp.verifying_key();
        let bytes = round2().sign(&sp).unwrap();
        let ok = SignedRound2::open(&bytes, &vk, "phone-1", Protocol::Pi1, &[3u8; 16], 1_000_000)
            .unwrap();
        assert_eq!(ok.fields(), &round2());
        assert!(ok.require_threshold(1234).is_ok());
        assert!(ok.require_threshold(1233).is_err());
        let refused = |bytes: &[u8], device: &str, protocol, session: [u8; 16], now| {
            match SignedRound2::open(bytes, &vk, device, protocol, &session, now) {
                Err(MatchError::Unsigned(reason)) => reason,
                other => panic!("not refused as unsigned: {other:?}"),
            }
        };
        // Another key; another device, protocol, session; expired.
        let forged = round2().sign(&other).unwrap();
        assert!(refused(&forged, "phone-1", Protocol::Pi1, [3; 16], 0).contains("pinned"));
        assert!(refused(&bytes, "phone-2", Protocol::Pi1, [3; 16], 0).contains("phone-1"));
        assert!(refused(&bytes, "phone-1", Protocol::Pi3, [3; 16], 0).contains("enrolled"));
        assert!(refused(&bytes, "phone-1", Protocol::Pi1, [4; 16], 0).contains("session"));
        let late = 1_000_000 + CLOCK_SKEW_SECS + 1;
        assert!(refused(&bytes, "phone-1", Protocol::Pi1, [3; 16], late).contains("expired"));
        // Every signed byte is bound: flip each byte of the envelope in turn.
        for i in 2..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(
                SignedRound2::open(&bad, &vk, "phone-1", Protocol::Pi1, &[3; 16], 0).is_err(),
                "byte {i}"
            );
        }
        // An unsigned payload (a Round 2 of an earlier build, or one the relay wrote).
        let bare = round2().payload;
        assert!(refused(&bare, "phone-1", Protocol::Pi1, [3; 16], 0).contains("not a signed"));
        // Truncated and extended envelopes.
        for len in 0..bytes.len() {
            assert!(
                SignedRound2::open(&bytes[..len], &vk, "phone-1", Protocol::Pi1, &[3; 16], 0)
                    .is_err()
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(SignedRound2::open(&long, &vk, "phone-1", Protocol::Pi1, &[3; 16], 0).is_err());
    }

    /// Item 2 of the capture brief: a Round 4 is bound to its session, device, protocol and
    /// the device's Round 3; the relay cannot splice one across sessions or write its own.
    #[test]
    fn a_signed_round4_opens_only_for_its_session_and_round3() {
        let sp = SigningKey::from_bytes(&[1u8; 32]);
        let other = SigningKey::from_bytes(&[2u8; 32]);
        let vk = sp.verifying_key();
        let round3 = b"the device's round 3".to_vec();
        let r4 = SignedRound4 {
            protocol: Protocol::Pi2,
            session: [3u8; 16],
            device_id: "phone-1".into(),
            round3_digest: Sha256::digest(&round3).into(),
            payload: vec![9, 9, 9],
        };
        let bytes = r4.sign(&sp).unwrap();
        let open = |bytes: &[u8], device: &str, protocol, session: [u8; 16], round3: &[u8]| {
            SignedRound4::open(bytes, &vk, device, protocol, &session, round3)
        };
        assert_eq!(
            open(&bytes, "phone-1", Protocol::Pi2, [3; 16], &round3),
            Ok(vec![9, 9, 9])
        );
        let refused = |got: Result<Vec<u8>, MatchError>, what: &str| {
            assert!(
                matches!(got, Err(MatchError::UnsignedRound4(_))),
                "{what}: {got:?}"
            );
        };
        refused(
            open(&bytes, "phone-1", Protocol::Pi2, [4; 16], &round3),
            "spliced session",
        );
        refused(
            open(&bytes, "phone-2", Protocol::Pi2, [3; 16], &round3),
            "other device",
        );
        refused(
            open(&bytes, "phone-1", Protocol::Pi3, [3; 16], &round3),
            "other protocol",
        );
        refused(
            open(&bytes, "phone-1", Protocol::Pi2, [3; 16], b"x"),
            "other Round 3",
        );
        refused(
            open(
                &r4.sign(&other).unwrap(),
                "phone-1",
                Protocol::Pi2,
                [3; 16],
                &round3,
            ),
            "relay-signed",
        );
        refused(
            open(&[1, 0x24, 1], "phone-1", Protocol::Pi2, [3; 16], &round3),
            "bare bit",
        );
        for i in 2..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            refused(
                open(&bad, "phone-1", Protocol::Pi2, [3; 16], &round3),
                "flipped",
            );
        }
    }

    /// The attacks of issue 34 point 10 on the protocol level: a relay between the service
    /// provider and the device (the coordinator) writes its own Round 2, keeps the SP's
    /// ciphertext and lowers the threshold beside it, re-signs with its own key, or moves a
    /// signed Round 2 to another session; the device refuses each before it decrypts, so no
    /// Round 3 (and so no signed verdict) exists. Against the code before this module (f21d1f1)
    /// each forged Round 2 was decrypted and answered.
    mod attacks {
        use super::super::super::cipher::test_support::small_key;
        use super::super::super::cipher::{Ciphertext, PublicKey, SecretKey};
        use super::super::super::encoding::decode_sum;
        use super::super::super::messages::template_signing_bytes;
        use super::super::super::messages::test_support::{
            clone_key, dot, max_params, random_vector,
        };
        use super::super::super::params::Params;
        use super::super::super::pi1::{Pi1Device, Pi1Round2, Pi1Terminal};
        use super::super::super::pi2::{
            encrypt_elements, pack_element_ciphertexts, Pi2Device, Pi2Round2, Pi2Terminal,
        };
        use super::super::super::pi3::{Pi3Device, Pi3Round2, Pi3Terminal};
        use super::super::*;
        use ed25519_dalek::Verifier;
        use rand_chacha::ChaCha20Rng;
        use rand_core::SeedableRng;
        use rug::Integer;

        const DIM: usize = 10;
        const M: u32 = 12;
        const NOW: i64 = 1_800_000_000;
        const DEVICE: &str = "phone-7";

        fn sp() -> SigningKey {
            SigningKey::from_bytes(&[41u8; 32])
        }

        /// The relay's own Ed25519 key (it has no other).
        fn relay() -> SigningKey {
            SigningKey::from_bytes(&[42u8; 32])
        }

        /// The SP's envelope around `payload` for `session` with `threshold`.
        fn signed(
            key: &SigningKey,
            protocol: Protocol,
            session: [u8; 16],
            threshold: i64,
            payload: Vec<u8>,
        ) -> Vec<u8> {
            SignedRound2 {
                protocol,
                session,
                device_id: DEVICE.into(),
                threshold,
                expires_at: NOW + 600,
                reply_key: [5u8; 32],
                payload,
            }
            .sign(key)
            .unwrap()
        }

        fn open(
            bytes: &[u8],
            protocol: Protocol,
            session: [u8; 16],
        ) -> Result<VerifiedRound2, MatchError> {
            SignedRound2::open(
                bytes,
                &sp().verifying_key(),
                DEVICE,
                protocol,
                &session,
                NOW,
            )
        }

        fn assert_unsigned<T: std::fmt::Debug>(got: Result<T, MatchError>, what: &str) {
            assert!(
                matches!(got, Err(MatchError::Unsigned(_))),
                "{what}: {got:?}"
            );
        }

        /// Where the payload starts inside an envelope for [`DEVICE`].
        fn payload_at() -> usize {
            2 + 1 + 16 + 1 + DEVICE.len() + 8 + 8 + 32 + 4
        }

        /// ⟦u_c*⟧ raised to 2^(k·p_i): the template's values of ciphertext c shifted so that
        /// u_(c,i) lands on diagonal slot i (positions are 3-AP-free, so nothing else does).
        fn raised(pk: &PublicKey, params: &Params, c: &Ciphertext, i: usize) -> Ciphertext {
            let layout = params.layout();
            let shift = layout.slot_bits() * layout.positions()[i];
            pk.mul_plain(c, &(Integer::from(1) << shift))
        }

        /// σ of the record over the packed template (what a device holds after enrolment).
        fn enrol_signed(
            params: &Params,
            sk: &SecretKey,
            u: &[i32],
            rng: &mut ChaCha20Rng,
        ) -> (Vec<Ciphertext>, Vec<u8>) {
            let elements = encrypt_elements(sk, params, u, rng).unwrap();
            let packed = pack_element_ciphertexts(sk.public_key(), params, &elements).unwrap();
            let sig = sp().sign(&template_signing_bytes(params, sk.public_key(), &packed));
            (packed, sig.to_bytes().to_vec())
        }

        fn verifier() -> impl Fn(&[u8], &[u8]) -> bool {
            let vk = sp().verifying_key();
            move |m: &[u8], s: &[u8]| {
                ed25519_dalek::Signature::from_slice(s).is_ok_and(|s| vk.verify(m, &s).is_ok())
            }
        }

        #[test]
        fn pi1_forged_round2_gets_no_answer() {
            let mut rng = ChaCha20Rng::seed_from_u64(3401);
            let params = max_params(Protocol::Pi1, DIM, M, 1024);
            let sk = small_key();
            let pk = sk.public_key();
            let u = random_vector(DIM, M, &mut rng);
            let device = Pi1Device::enrol(params.clone(), clone_key(sk), &u, &mut rng).unwrap();
            // An impostor: w = −u (cos = −1), far below the policy threshold.
            let w: Vec<i32> = u.iter().map(|x| -x).collect();
            let policy = dot(&u, &u) / 2;
            let session = [5u8; 16];
            let mut terminal = Pi1Terminal::new(params.clone(), w, policy).unwrap();
            let honest = terminal.round2(&device.round1(), &mut rng).unwrap();
            let envelope = signed(&sp(), Protocol::Pi1, session, policy, honest.clone());
            // The honest session: answered, no match.
            let ok = open(&envelope, Protocol::Pi1, session).unwrap();
            let (_, outcome) = device.round3_signed(&ok).unwrap();
            assert!(!outcome.matched);

            // (1) The relay's own Round 2: Enc(0) with threshold −1, bare or under its own key.
            let own = Pi1Round2 {
                threshold: -1,
                ciphertext: pk.encrypt(&Integer::new(), &mut rng).unwrap(),
            }
            .to_bytes(pk);
            // (Before: the device decrypted it and answered "match" for the impostor.)
            assert!(device.round3(&own).unwrap().1.matched);
            assert_unsigned(open(&own, Protocol::Pi1, session), "bare Round 2");
            let relayed = signed(&relay(), Protocol::Pi1, session, -1, own.clone());
            assert_unsigned(
                open(&relayed, Protocol::Pi1, session),
                "relay-signed Round 2",
            );
            // (2) The SP's ciphertext, the threshold beside it lowered, the SP's signature kept.
            let mut lowered = envelope.clone();
            let at = payload_at() + 2;
            lowered[at..at + 8].copy_from_slice(&(-1i64).to_be_bytes());
            assert_unsigned(open(&lowered, Protocol::Pi1, session), "lowered threshold");
            // … and the signed threshold lowered with it.
            let at = 2 + 1 + 16 + 1 + DEVICE.len();
            lowered[at..at + 8].copy_from_slice(&(-1i64).to_be_bytes());
            assert_unsigned(open(&lowered, Protocol::Pi1, session), "both thresholds");
            // (3) A signed Round 2 moved to a session the relay made up.
            assert_unsigned(open(&envelope, Protocol::Pi1, [6u8; 16]), "another session");
            // (4) An SP envelope whose signed policy differs from the payload's threshold.
            let odd = signed(&sp(), Protocol::Pi1, session, policy + 1, honest);
            let odd = open(&odd, Protocol::Pi1, session).unwrap();
            assert_unsigned(device.round3_signed(&odd), "threshold not the policy");
        }

        #[test]
        fn pi2_forged_and_raised_round2_are_refused() {
            let mut rng = ChaCha20Rng::seed_from_u64(3402);
            let params = max_params(Protocol::Pi2, DIM, M, 1024);
            let sk = small_key();
            let pk = sk.public_key();
            let u = random_vector(DIM, M, &mut rng);
            let (packed, sigma) = enrol_signed(&params, sk, &u, &mut rng);
            let device =
                Pi2Device::new(params.clone(), clone_key(sk), packed.clone(), sigma).unwrap();
            let session = [9u8; 16];
            // Honest sessions pass the signature and the range check.
            for _ in 0..20 {
                let w = random_vector(DIM, M, &mut rng);
                let mut terminal = Pi2Terminal::new(params.clone(), w.clone(), 0).unwrap();
                let r2 = terminal
                    .round2(&device.round1(), &verifier(), &mut rng)
                    .unwrap();
                let ok = open(
                    &signed(&sp(), Protocol::Pi2, session, 0, r2),
                    Protocol::Pi2,
                    session,
                )
                .unwrap();
                let r3 = device.session().round3_signed(&ok).unwrap();
                let (_, outcome) = terminal.round4(&r3).unwrap();
                assert_eq!(outcome.inner_product, dot(&u, &w));
            }
            // The attack: a raised template ciphertext puts u[i] alone on the diagonal.
            let i = 1;
            let forged = Pi2Round2 {
                ciphertext: raised(pk, &params, &packed[0], i),
            }
            .to_bytes(pk);
            let x = decode_sum(sk, params.layout(), &raised(pk, &params, &packed[0], i)).unwrap();
            assert_eq!(x, u[i], "what the device would have sent as X before");
            assert_unsigned(open(&forged, Protocol::Pi2, session), "bare raised Round 2");
            let relayed = signed(&relay(), Protocol::Pi2, session, 0, forged.clone());
            assert_unsigned(open(&relayed, Protocol::Pi2, session), "relay-signed");
            // Even signed (an SP that deviates), the range check refuses it.
            let by_sp = open(
                &signed(&sp(), Protocol::Pi2, session, 0, forged.clone()),
                Protocol::Pi2,
                session,
            )
            .unwrap();
            assert!(matches!(
                device.session().round3_signed(&by_sp),
                Err(MatchError::OutOfRange("X"))
            ));
            assert!(matches!(
                device.session().round3(&forged),
                Err(MatchError::OutOfRange("X"))
            ));
            // A Π1 or Π3 envelope is not a Π2 Round 2.
            assert_unsigned(
                open(
                    &signed(&sp(), Protocol::Pi3, session, 0, forged),
                    Protocol::Pi2,
                    session,
                ),
                "other protocol",
            );
        }

        #[test]
        fn pi3_forged_lowered_and_raised_round2_are_refused() {
            let mut rng = ChaCha20Rng::seed_from_u64(3403);
            let params = max_params(Protocol::Pi3, DIM, M, 1024);
            let sk = small_key();
            let pk = sk.public_key();
            let u = random_vector(DIM, M, &mut rng);
            let (packed, sigma) = enrol_signed(&params, sk, &u, &mut rng);
            let device =
                Pi3Device::new(params.clone(), clone_key(sk), packed.clone(), sigma).unwrap();
            let session = [11u8; 16];
            let policy = dot(&u, &u) / 2;
            let w: Vec<i32> = u.iter().map(|x| -x).collect();
            let mut terminal = Pi3Terminal::new(params.clone(), w, policy).unwrap();
            let r2 = terminal
                .round2(&device.round1(), &verifier(), &mut rng)
                .unwrap();
            let envelope = signed(&sp(), Protocol::Pi3, session, policy, r2.clone());
            // The honest session runs to the end: no match.
            let ok = open(&envelope, Protocol::Pi3, session).unwrap();
            let mut s = device.session();
            let r3 = s.round3_signed(&ok, &mut rng).unwrap();
            let r4 = terminal.round4(&r3, &mut rng).unwrap();
            let (r5, matched) = s.round5(&r4).unwrap();
            assert!(!matched);
            assert!(!terminal.finish(&r5).unwrap());
            // The SP's ciphertexts with the threshold beside them lowered (the last bytes).
            let msg = Pi3Round2::from_bytes(pk, &r2).unwrap();
            let lowered = Pi3Round2 {
                threshold: -dot(&u, &u),
                ..msg.clone()
            }
            .to_bytes(pk);
            let mut swapped = envelope[..payload_at() - 4].to_vec();
            swapped.extend_from_slice(&(lowered.len() as u32).to_be_bytes());
            swapped.extend_from_slice(&lowered);
            swapped.extend_from_slice(&envelope[envelope.len() - SIGNATURE_BYTES..]);
            assert_unsigned(open(&swapped, Protocol::Pi3, session), "lowered threshold");
            assert_unsigned(open(&lowered, Protocol::Pi3, session), "bare");
            // Raised template ciphertexts as X̃ and Ỹ: unsigned, and out of range even if signed.
            let forged = Pi3Round2 {
                x: raised(pk, &params, &packed[0], 0),
                y: raised(pk, &params, &packed[0], 1),
                threshold: 0,
            }
            .to_bytes(pk);
            assert_unsigned(open(&forged, Protocol::Pi3, session), "bare raised");
            let relayed = signed(&relay(), Protocol::Pi3, session, 0, forged.clone());
            assert_unsigned(open(&relayed, Protocol::Pi3, session), "relay-signed");
            let by_sp = open(
                &signed(&sp(), Protocol::Pi3, session, 0, forged),
                Protocol::Pi3,
                session,
            )
            .unwrap();
            assert!(matches!(
                device.session().round3_signed(&by_sp, &mut rng),
                Err(MatchError::OutOfRange("X"))
            ));
        }
    }
}
