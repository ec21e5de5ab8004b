//! # Outputs sealed to the one party that must learn them (issue 34 item 10: the capture)
//!
//! In [ABMR20] (Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363) the
//! terminal T and the device D talk directly: the match bit of Π1 Round 3 (Fig. 3), of Π2
//! Round 4 (§6.1) and Π3's output decoding (Fig. 5 Round 4) reach only their recipient. In
//! privmatch every message crosses the coordinator, which is not trusted, so each of them is
//! sealed to a **reply key**: an X25519 public key whose secret only the recipient holds, fresh
//! for every session.
//!
//! * The terminal draws a reply key R_T and puts it inside its input sealed to the service
//!   provider (`terminal.rs`, version 2): the coordinator can neither read nor swap it. The SP
//!   signs R_T into Round 2 (`signed_round2.rs`), so the device seals its Π1 Round 3 to the
//!   key the SP vouches for; the SP seals its Π2/Π3 verdict to it.
//! * The device draws a reply key R_D per session and sends it with its Round 3
//!   ([`DeviceReply`]), signed with its enrolled key (the SP checks that signature): the SP
//!   seals Π2's Round 4 (the bit) and Π3's Round 4 (which carries the output decoding) to it.
//!
//! A sealed reply (ephemeral-static X25519, HKDF-SHA256, ChaCha20-Poly1305 under a single-use
//! key, so the all-zero nonce is used once):
//!
//! ```text
//! "PMPR" | version (1) = 1 | purpose (1) | session (16) | ephemeral public key (32)
//!   | AEAD(k, nonce 0, aad = the header, plaintext)
//! k = HKDF-SHA256(ikm = X25519(e, R), salt = header, info = "privmatch/paillier/reply/v1" ‖ R)
//! ```
//!
//! Sealing is anonymous: it hides the content and binds it to the session and purpose, and
//! what must be authentic is signed inside (the verdict: by the SP or, in Π1, by the device)
//! or around it (Round 4: the SP's signed envelope, `signed_round2.rs`). The plaintexts have a
//! fixed length per protocol and key, so the length of a sealed reply says nothing either.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::ChaCha20Poly1305;
use ed25519_dalek::VerifyingKey;
use hkdf::Hkdf;
use rand_core::{CryptoRng, RngCore};
use sha2::Sha256;
use x25519_dalek::{PublicKey as XPublicKey, StaticSecret};
use zeroize::Zeroizing;

use super::cipher::PublicKey;
use super::device_signature::{self, Statement};
use super::messages::{header, MatchError, MessageKind, Reader};
use super::params::Protocol;
use super::pi1::Pi1Round3;
use super::verdict::Verdict;

/// Bytes of a reply key (an X25519 public key).
pub const REPLY_KEY_LEN: usize = 32;
const MAGIC: &[u8; 4] = b"PMPR";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 4 + 1 + 1 + 16 + 32;
const TAG_LEN: usize = 16;
const INFO: &[u8] = b"privmatch/paillier/reply/v1";
/// The largest sealed payload accepted (Π3's Round 4 at 4096-bit N is well below).
pub const MAX_SEALED: usize = 1 << 24;

/// What a sealed reply carries: bound into its header, so one cannot be passed off as another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Purpose {
    /// The session's outcome for the terminal ([`TerminalVerdict`]).
    TerminalVerdict = 1,
    /// The SP's Round 4 for the device (Π2: the bit, [`DeviceOutcome`]; Π3: `Pi3Round4`).
    DeviceRound4 = 2,
}

/// A reply key's secret half, held by the terminal or the device for one session. `Debug`
/// does not print it.
pub struct ReplySecret(StaticSecret);

impl std::fmt::Debug for ReplySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplySecret(<redacted>)")
    }
}

impl ReplySecret {
    /// A fresh reply key.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut bytes = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(bytes.as_mut());
        ReplySecret(StaticSecret::from(*bytes))
    }

    /// The public half, which the sender seals to.
    pub fn public_key(&self) -> [u8; REPLY_KEY_LEN] {
        *XPublicKey::from(&self.0).as_bytes()
    }

    /// Opens a reply sealed to this key for `purpose` in `session`.
    pub fn open(
        &self,
        purpose: Purpose,
        session: &[u8; 16],
        sealed: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, MatchError> {
        let tampered = || MatchError::Wire {
            message: "sealed reply",
            reason: "authentication failed: tampered, or not sealed to this key, session and \
                     purpose"
                .into(),
        };
        if sealed.len() < HEADER_LEN + TAG_LEN || sealed.len() > MAX_SEALED + HEADER_LEN + TAG_LEN {
            return Err(MatchError::Wire {
                message: "sealed reply",
                reason: format!("{} bytes", sealed.len()),
            });
        }
        let (head, body) = sealed.split_at(HEADER_LEN);
        if &head[..4] != MAGIC || head[4] != VERSION {
            return Err(MatchError::Wire {
                message: "sealed reply",
                reason: "wrong magic or version".into(),
            });
        }
        if head[5] != purpose as u8 || &head[6..22] != session {
            return Err(tampered());
        }
        let mut ephemeral = [0u8; 32];
        ephemeral.copy_from_slice(&head[22..]);
        let shared = self.0.diffie_hellman(&XPublicKey::from(ephemeral));
        if !shared.was_contributory() {
            return Err(tampered());
        }
        let key = derive(shared.as_bytes(), head, &self.public_key());
        let plain = ChaCha20Poly1305::new(&key)
            .decrypt(
                &chacha20poly1305::Nonce::default(),
                Payload {
                    msg: body,
                    aad: head,
                },
            )
            .map_err(|_| tampered())?;
        Ok(Zeroizing::new(plain))
    }
}

fn derive(shared: &[u8; 32], header: &[u8], reply_key: &[u8; 32]) -> chacha20poly1305::Key {
    let hk = Hkdf::<Sha256>::new(Some(header), shared);
    let mut key = chacha20poly1305::Key::default();
    let info = [INFO, reply_key.as_slice()].concat();
    // 32 bytes is always a valid HKDF-SHA256 output length.
    let _ = hk.expand(&info, &mut key);
    key
}

/// Seals `plaintext` to `reply_key` for `purpose` in `session` (module documentation).
/// Refuses a key that is not a usable X25519 point (a low-order point) or a plaintext over
/// [`MAX_SEALED`].
pub fn seal<R: RngCore + CryptoRng>(
    reply_key: &[u8; REPLY_KEY_LEN],
    purpose: Purpose,
    session: &[u8; 16],
    plaintext: &[u8],
    rng: &mut R,
) -> Result<Vec<u8>, MatchError> {
    if plaintext.len() > MAX_SEALED {
        return Err(MatchError::Argument {
            argument: "plaintext",
            reason: format!("{} bytes, at most {MAX_SEALED}", plaintext.len()),
        });
    }
    let ephemeral = ReplySecret::generate(rng);
    let mut out = Vec::with_capacity(HEADER_LEN + plaintext.len() + TAG_LEN);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(purpose as u8);
    out.extend_from_slice(session);
    out.extend_from_slice(&ephemeral.public_key());
    let shared = ephemeral.0.diffie_hellman(&XPublicKey::from(*reply_key));
    if !shared.was_contributory() {
        return Err(MatchError::Argument {
            argument: "reply_key",
            reason: "not a usable X25519 public key (a low-order point)".into(),
        });
    }
    let key = derive(shared.as_bytes(), &out, reply_key);
    let ciphertext = ChaCha20Poly1305::new(&key)
        .encrypt(
            &chacha20poly1305::Nonce::default(),
            Payload {
                msg: plaintext,
                aad: &out,
            },
        )
        .map_err(|_| MatchError::Argument {
            argument: "plaintext",
            reason: "could not be encrypted".into(),
        })?;
    out.extend_from_slice(&ciphertext);
    Ok(out)
}

/// A session's outcome as the terminal believes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The capture does not match.
    NoMatch,
    /// It matches.
    Match,
    /// The SP refused the device's answer (Π2, Π3: a cheating device).
    Refused,
}

impl Outcome {
    fn code(self) -> u8 {
        match self {
            Outcome::NoMatch => 0,
            Outcome::Match => 1,
            Outcome::Refused => 2,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Outcome::NoMatch),
            1 => Some(Outcome::Match),
            2 => Some(Outcome::Refused),
            _ => None,
        }
    }

    /// The outcome of a Π2/Π3 decision (`matched`, `valid`).
    pub fn of(matched: bool, valid: bool) -> Self {
        match (valid, matched) {
            (false, _) => Outcome::Refused,
            (true, true) => Outcome::Match,
            (true, false) => Outcome::NoMatch,
        }
    }
}

/// The session's outcome for the terminal, sealed to its reply key: the outcome and the
/// signature that makes it believable (Π2, Π3: the SP's Ed25519 signature of [`Verdict`];
/// Π1: the device's signature of its Round 3 bit, `Statement::reply_message(device, session,
/// 3, Pi1Round3)`, [ABMR20] Fig. 3 Round 3).
///
/// ```text
/// plaintext = protocol (1) | session (16) | outcome (1) | signature length (2) | signature
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminalVerdict {
    /// Π1, Π2 or Π3.
    pub protocol: Protocol,
    /// The terminal's session id.
    pub session: [u8; 16],
    /// What the session decided.
    pub outcome: Outcome,
    /// The signature of it (see the type's documentation).
    pub signature: Vec<u8>,
}

impl TerminalVerdict {
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20 + self.signature.len());
        out.push(self.protocol.code());
        out.extend_from_slice(&self.session);
        out.push(self.outcome.code());
        out.extend_from_slice(
            &(self.signature.len().min(usize::from(u16::MAX)) as u16).to_be_bytes(),
        );
        out.extend_from_slice(&self.signature);
        out
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, MatchError> {
        let bad = |reason: &str| MatchError::Wire {
            message: "terminal verdict",
            reason: reason.into(),
        };
        if bytes.len() < 20 {
            return Err(bad("truncated"));
        }
        let protocol = Protocol::from_code(bytes[0])?;
        let mut session = [0u8; 16];
        session.copy_from_slice(&bytes[1..17]);
        let outcome = Outcome::from_code(bytes[17]).ok_or_else(|| bad("unknown outcome"))?;
        let len = usize::from(u16::from_be_bytes([bytes[18], bytes[19]]));
        if bytes.len() != 20 + len {
            return Err(bad("signature length"));
        }
        Ok(Self {
            protocol,
            session,
            outcome,
            signature: bytes[20..].to_vec(),
        })
    }

    /// Sealed to the terminal's `reply_key` (the SP's or, in Π1, the device's side).
    pub fn seal<R: RngCore + CryptoRng>(
        &self,
        reply_key: &[u8; REPLY_KEY_LEN],
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        seal(
            reply_key,
            Purpose::TerminalVerdict,
            &self.session,
            &self.to_bytes(),
            rng,
        )
    }

    /// The terminal's side, first step: opens `sealed` with its reply secret for its
    /// `session` (nothing is believed yet: see [`Self::check`]).
    pub fn open(
        secret: &ReplySecret,
        sealed: &[u8],
        session: &[u8; 16],
    ) -> Result<Self, MatchError> {
        let plain = secret.open(Purpose::TerminalVerdict, session, sealed)?;
        let verdict = Self::from_bytes(&plain)?;
        if verdict.session != *session {
            return Err(MatchError::Unsigned(
                "the verdict is for another session".into(),
            ));
        }
        Ok(verdict)
    }

    /// The terminal believes the outcome only with its signature: for Π2 and Π3 the pinned SP
    /// key's `service` over exactly this [`Verdict`] of `device_id`, for Π1 the device's key
    /// `device_key` (from the record the terminal checked) over its Round 3 bit; Π1 has no
    /// refusal. Anything else is an error naming what failed, never the outcome.
    pub fn check(
        &self,
        protocol: Protocol,
        device_id: &str,
        service: &VerifyingKey,
        device_key: &PublicKey,
    ) -> Result<Outcome, MatchError> {
        let forged = || {
            MatchError::Unsigned(format!(
                "the verdict is not signed by {} for this session and device {device_id:?}",
                if protocol == Protocol::Pi1 {
                    "the device"
                } else {
                    "the pinned service provider"
                }
            ))
        };
        if self.protocol != protocol {
            return Err(forged());
        }
        match (protocol, self.outcome) {
            (Protocol::Pi1, Outcome::Refused) => return Err(forged()),
            (Protocol::Pi1, outcome) => {
                let round3 = Pi1Round3 {
                    matched: outcome == Outcome::Match,
                }
                .to_bytes();
                let statement = Statement::reply_message(device_id, &self.session, 3, &round3);
                device_signature::verify(device_key, &statement, &self.signature)
                    .map_err(|_| forged())?;
            }
            (protocol, outcome) => {
                Verdict {
                    protocol,
                    session: self.session,
                    device_id,
                    matched: outcome == Outcome::Match,
                    valid: outcome != Outcome::Refused,
                }
                .verify(service, &self.signature)
                .map_err(|_| forged())?;
            }
        }
        Ok(self.outcome)
    }

    /// [`Self::open`] then [`Self::check`]: the outcome the terminal believes.
    pub fn open_and_check(
        secret: &ReplySecret,
        sealed: &[u8],
        session: &[u8; 16],
        protocol: Protocol,
        device_id: &str,
        service: &VerifyingKey,
        device_key: &PublicKey,
    ) -> Result<Outcome, MatchError> {
        Self::open(secret, sealed, session)?.check(protocol, device_id, service, device_key)
    }
}

/// Π2 Round 4 for the device, inside the seal: the bit, or the SP's refusal (T's ⊥ of
/// [ABMR20] §6.1 Round 4). One byte, so every Round 4 has the same length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOutcome(pub Outcome);

impl DeviceOutcome {
    /// The one plaintext byte.
    pub fn to_bytes(self) -> Vec<u8> {
        vec![self.0.code()]
    }

    /// Strict decoding.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MatchError> {
        match bytes {
            [code] => {
                Outcome::from_code(*code)
                    .map(DeviceOutcome)
                    .ok_or_else(|| MatchError::Wire {
                        message: "Π2 round 4",
                        reason: "unknown outcome".into(),
                    })
            }
            _ => Err(MatchError::Wire {
                message: "Π2 round 4",
                reason: format!("{} bytes, expected 1", bytes.len()),
            }),
        }
    }
}

/// What a device posts for Round 3 of Π2 and Π3: its reply key for Round 4 and the protocol's
/// Round 3 message. The device signs the posted bytes (`Statement::reply_message`), and the SP
/// checks that signature with the key of the device's record before it uses either part, so
/// the coordinator can neither put its own reply key in nor move the message to another
/// session.
///
/// ```text
/// version (1) | kind (1) = 0x52 | reply key (32) | message length (4) | message
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceReply {
    /// The device's reply key for this session's Round 4.
    pub reply_key: [u8; REPLY_KEY_LEN],
    /// `Pi2Round3` or `Pi3Round3` bytes.
    pub message: Vec<u8>,
}

impl DeviceReply {
    /// The encoding above.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(MessageKind::DeviceReply);
        out.extend_from_slice(&self.reply_key);
        out.extend_from_slice(&(self.message.len().min(u32::MAX as usize) as u32).to_be_bytes());
        out.extend_from_slice(&self.message);
        out
    }

    /// Strict decoding.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("device reply", bytes, MessageKind::DeviceReply)?;
        let mut reply_key = [0u8; REPLY_KEY_LEN];
        reply_key.copy_from_slice(r.take(REPLY_KEY_LEN, "reply key")?);
        let len = r.u32("message length")? as usize;
        if len > MAX_SEALED {
            return Err(r.error(format!("a message of {len} bytes")));
        }
        let message = r.take(len, "message")?.to_vec();
        r.finish()?;
        Ok(Self { reply_key, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    #[test]
    fn sealed_replies_open_only_for_their_key_session_and_purpose() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let mine = ReplySecret::generate(&mut rng);
        let other = ReplySecret::generate(&mut rng);
        let session = [4u8; 16];
        let sealed = seal(
            &mine.public_key(),
            Purpose::DeviceRound4,
            &session,
            b"bit",
            &mut rng,
        )
        .unwrap();
        assert_eq!(
            mine.open(Purpose::DeviceRound4, &session, &sealed)
                .unwrap()
                .as_slice(),
            b"bit"
        );
        assert!(other
            .open(Purpose::DeviceRound4, &session, &sealed)
            .is_err());
        assert!(mine
            .open(Purpose::TerminalVerdict, &session, &sealed)
            .is_err());
        assert!(mine
            .open(Purpose::DeviceRound4, &[5u8; 16], &sealed)
            .is_err());
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(
                mine.open(Purpose::DeviceRound4, &session, &bad).is_err(),
                "byte {i}"
            );
        }
        assert!(seal(&[0u8; 32], Purpose::DeviceRound4, &session, b"x", &mut rng).is_err());
    }

    #[test]
    fn a_terminal_believes_only_a_signed_verdict_of_its_session() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let sp = SigningKey::from_bytes(&[1u8; 32]);
        let device_key = super::super::cipher::test_support::small_key()
            .public_key()
            .clone();
        let reply = ReplySecret::generate(&mut rng);
        let session = [9u8; 16];
        let sign = |matched, valid| {
            Verdict {
                protocol: Protocol::Pi2,
                session,
                device_id: "phone-1",
                matched,
                valid,
            }
            .sign(&sp)
            .to_vec()
        };
        let check = |v: &TerminalVerdict, device: &str| {
            let sealed = v.seal(&reply.public_key(), &mut ChaCha20Rng::seed_from_u64(3))?;
            TerminalVerdict::open_and_check(
                &reply,
                &sealed,
                &session,
                Protocol::Pi2,
                device,
                &sp.verifying_key(),
                &device_key,
            )
        };
        let honest = TerminalVerdict {
            protocol: Protocol::Pi2,
            session,
            outcome: Outcome::NoMatch,
            signature: sign(false, true),
        };
        assert_eq!(check(&honest, "phone-1"), Ok(Outcome::NoMatch));
        assert!(check(&honest, "phone-2").is_err());
        for outcome in [Outcome::Match, Outcome::Refused] {
            let flipped = TerminalVerdict {
                outcome,
                ..honest.clone()
            };
            assert!(check(&flipped, "phone-1").is_err(), "{outcome:?}");
        }
        let moved = TerminalVerdict {
            session: [8u8; 16],
            ..honest.clone()
        };
        assert!(check(&moved, "phone-1").is_err());
        // The plaintext has one length per protocol and key: the length says nothing.
        assert_eq!(
            honest.to_bytes().len(),
            TerminalVerdict {
                outcome: Outcome::Refused,
                signature: sign(false, false),
                ..honest.clone()
            }
            .to_bytes()
            .len()
        );
    }

    #[test]
    fn device_messages_decode_strictly() {
        let reply = DeviceReply {
            reply_key: [3u8; 32],
            message: vec![1, 2, 3],
        };
        let bytes = reply.to_bytes();
        assert_eq!(DeviceReply::from_bytes(&bytes), Ok(reply));
        for len in 0..bytes.len() {
            assert!(DeviceReply::from_bytes(&bytes[..len]).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(DeviceReply::from_bytes(&long).is_err());
        for o in [Outcome::NoMatch, Outcome::Match, Outcome::Refused] {
            assert_eq!(
                DeviceOutcome::from_bytes(&DeviceOutcome(o).to_bytes()),
                Ok(DeviceOutcome(o))
            );
        }
        assert!(DeviceOutcome::from_bytes(&[3]).is_err());
        assert!(DeviceOutcome::from_bytes(&[]).is_err());
    }
}
