//! Operator-signed commands: how a change of a party's security state (the face dealer's
//! configuration at P2, a peer pin at any party: [`PeerPin`]) travels through the untrusted coordinator without the
//! coordinator being able to forge, alter, redirect or replay it.
//!
//! Each party's operator holds an Ed25519 key pair (RFC 8032; `ed25519-dalek`, strict
//! verification). The party stores the operator's public key, set by the operator directly in
//! its own database, and the highest counter it has accepted. A command is
//!
//! ```text
//! "PMOC" | version (1) = 2 | party index (1) | counter (8, big endian)
//!        | expires at (8, big endian: microseconds since the Unix epoch) | action length (1)
//!        | action | payload length (4, big endian) | payload | Ed25519 signature (64)
//! ```
//!
//! and the signature covers the domain label [`DOMAIN`] followed by every byte before the
//! signature. The party accepts a command only if it is addressed to it, names the action the
//! called function performs, verifies under the stored key, has not expired, was not signed to
//! live longer than [`MAX_LIFETIME_MICROS`], and carries a counter strictly above the stored
//! one (which it then stores in the same transaction). Clients use the time in microseconds as
//! the counter, so they need no state of their own.
//!
//! Why an expiry as well as a counter: the counter lives in the party's database, so a party
//! restored from a backup taken before a command was accepted has forgotten it. The expiry
//! bounds that replay window to the command's lifetime (ten minutes by default), whatever
//! the database remembers. Version 1 commands (no expiry) are refused.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rand_core::{CryptoRng, RngCore};
use zeroize::Zeroizing;

use crate::party::PartyIndex;

/// The label every signature starts with, so an operator key's signature over anything else
/// can never be taken for a command.
pub const DOMAIN: &[u8] = b"privmatch operator command v2";
const MAGIC: &[u8; 4] = b"PMOC";
const VERSION: u8 = 2;
/// How long a command signed with [`OperatorSigningKey::sign`] stays valid: ten minutes after
/// its counter (the signing time in microseconds).
pub const DEFAULT_LIFETIME_MICROS: u64 = 10 * 60 * 1_000_000;
/// The longest a party lets a command live: one whose expiry lies further ahead than this is
/// refused, so no command can be kept for a replay long after it was signed.
pub const MAX_LIFETIME_MICROS: u64 = 60 * 60 * 1_000_000;
const SIGNATURE_LEN: usize = 64;
/// Largest payload a command may carry (the sealed dealer configuration is ~100 bytes).
pub const MAX_PAYLOAD: usize = 1 << 16;

/// The action of a relayed peer pin ([`PeerPin`]).
pub const PEER_PIN_ACTION: &str = "peer-pin";
const PEER_PIN_VERSION: u8 = 1;
const PEER_PIN_LEN: usize = 3 + 32;

/// The payload of a signed peer pin: pin `key` (X25519, 32 bytes) for party `peer`, replacing
/// a different pinned key only when `replace` is set. Encoded as
/// `version (1) | peer index (1) | replace (1: 0 or 1) | key (32)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPin {
    /// The peer whose key is pinned.
    pub peer: PartyIndex,
    /// Its X25519 public key.
    pub key: [u8; 32],
    /// Whether a different key already pinned may be replaced (a key rotation).
    pub replace: bool,
}

impl PeerPin {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PEER_PIN_LEN);
        out.extend_from_slice(&[PEER_PIN_VERSION, self.peer.as_u8(), u8::from(self.replace)]);
        out.extend_from_slice(&self.key);
        out
    }

    /// Parses payload bytes, refusing any other length, version, index or flag.
    pub fn decode(bytes: &[u8]) -> Result<Self, CommandError> {
        let malformed = CommandError::Malformed;
        if bytes.len() != PEER_PIN_LEN || bytes[0] != PEER_PIN_VERSION {
            return Err(malformed("a peer pin is version 1 and 35 bytes"));
        }
        let peer = PartyIndex::new(i64::from(bytes[1]))
            .map_err(|_| malformed("peer pin: party index out of range"))?;
        let replace = match bytes[2] {
            0 => false,
            1 => true,
            _ => return Err(malformed("peer pin: replace flag is not 0 or 1")),
        };
        let mut key = [0u8; 32];
        key.copy_from_slice(&bytes[3..]);
        Ok(PeerPin { peer, key, replace })
    }
}

/// Why a command was refused. Messages name the check that failed, never key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The bytes are not a command of this version.
    #[error("malformed operator command: {0}")]
    Malformed(&'static str),
    /// The command is addressed to another party.
    #[error("the operator command is addressed to {addressed}, not to {me}")]
    WrongParty {
        /// The party named in the command.
        addressed: PartyIndex,
        /// The party that received it.
        me: PartyIndex,
    },
    /// The command is for another action.
    #[error("the operator command is for {found:?}, not {expected:?}")]
    WrongAction {
        /// The action the receiving function performs.
        expected: String,
        /// The action named in the command.
        found: String,
    },
    /// The signature does not verify under the operator key the party holds.
    #[error("the operator command is not signed by this party's operator key")]
    BadSignature,
    /// The counter is not above the last accepted one: a replay or a stale command.
    #[error("the operator command's counter {counter} is not above the last accepted {last}: replayed or stale")]
    Replayed {
        /// The command's counter.
        counter: u64,
        /// The highest counter the party accepted before.
        last: u64,
    },
    /// A key that is not a valid Ed25519 public key.
    #[error("not an Ed25519 public key (64 hex digits of a valid point)")]
    BadKey,
    /// The command expired before it arrived (or the party's clock is ahead of the signer's).
    #[error("the operator command expired {late_seconds} s ago: sign it again")]
    Expired {
        /// How many seconds after its expiry it arrived.
        late_seconds: u64,
    },
    /// The command was signed to stay valid for longer than a party accepts.
    #[error("the operator command is valid for another {seconds} s, more than the {max} s a party accepts")]
    TooLongLived {
        /// Seconds from now to its expiry.
        seconds: u64,
        /// The most a party accepts ([`MAX_LIFETIME_MICROS`] in seconds).
        max: u64,
    },
}

/// An operator's signing key. Its bytes are zeroised on drop and never printed.
pub struct OperatorSigningKey(SigningKey);

impl std::fmt::Debug for OperatorSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorSigningKey(<redacted>)")
    }
}

impl OperatorSigningKey {
    /// A fresh key from `rng`.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(seed.as_mut_slice());
        OperatorSigningKey(SigningKey::from_bytes(&seed))
    }

    /// The key of a 32-byte seed.
    pub fn from_bytes(seed: &[u8; 32]) -> Self {
        OperatorSigningKey(SigningKey::from_bytes(seed))
    }

    /// The 32-byte seed (for the operator's key file).
    pub fn to_bytes(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.0.to_bytes())
    }

    /// The public half, which the party stores.
    pub fn verifying_key(&self) -> OperatorVerifyingKey {
        OperatorVerifyingKey(self.0.verifying_key())
    }

    /// Signs command `action` with `payload` for party `party` under `counter`, the signing
    /// time in microseconds since the Unix epoch; the command expires
    /// [`DEFAULT_LIFETIME_MICROS`] after it. Returns the encoded command (module docs).
    pub fn sign(&self, party: PartyIndex, counter: u64, action: &str, payload: &[u8]) -> Vec<u8> {
        let expires_at = counter.saturating_add(DEFAULT_LIFETIME_MICROS);
        self.sign_expiring(party, counter, expires_at, action, payload)
    }

    /// Signs command `action` with `payload` for party `party` under `counter`, valid until
    /// `expires_at` (microseconds since the Unix epoch); returns the encoded command.
    pub fn sign_expiring(
        &self,
        party: PartyIndex,
        counter: u64,
        expires_at: u64,
        action: &str,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut out = encode_unsigned(party, counter, expires_at, action, payload);
        let signature = self.0.sign(&signed_message(&out));
        out.extend_from_slice(&signature.to_bytes());
        out
    }
}

/// An operator's public key, as a party stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperatorVerifyingKey(VerifyingKey);

impl OperatorVerifyingKey {
    /// Parses 32 bytes (a valid, non-weak point).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CommandError> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| CommandError::BadKey)?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| CommandError::BadKey)?;
        if key.is_weak() {
            return Err(CommandError::BadKey);
        }
        Ok(OperatorVerifyingKey(key))
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, CommandError> {
        let bytes = hex::decode(text.trim()).map_err(|_| CommandError::BadKey)?;
        Self::from_bytes(&bytes)
    }

    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// 64 hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.to_bytes())
    }
}

/// A command that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedCommand {
    /// Its counter, which the party must now store as the last accepted one.
    pub counter: u64,
    /// What it carries.
    pub payload: Vec<u8>,
}

fn encode_unsigned(
    party: PartyIndex,
    counter: u64,
    expires_at: u64,
    action: &str,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(27 + action.len() + payload.len() + SIGNATURE_LEN);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(party.as_u8());
    out.extend_from_slice(&counter.to_be_bytes());
    out.extend_from_slice(&expires_at.to_be_bytes());
    // Actions are short constants of the code; a longer one is a programming error caught by
    // the round-trip tests, and truncating keeps the encoding well-formed regardless.
    let action = &action.as_bytes()[..action.len().min(255)];
    out.push(action.len() as u8);
    out.extend_from_slice(action);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn signed_message(unsigned: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(DOMAIN.len() + unsigned.len());
    message.extend_from_slice(DOMAIN);
    message.extend_from_slice(unsigned);
    message
}

/// A cursor over the command's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CommandError> {
        if self.0.len() < n {
            return Err(CommandError::Malformed(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
}

/// Checks command `bytes` received by party `me` for `action` against the operator key `key`,
/// the last accepted counter `last` and the party's clock `now` (microseconds since the Unix
/// epoch) (module docs); returns its counter and payload.
pub fn verify_command(
    bytes: &[u8],
    me: PartyIndex,
    action: &str,
    key: &OperatorVerifyingKey,
    last: u64,
    now: u64,
) -> Result<VerifiedCommand, CommandError> {
    if bytes.len() < SIGNATURE_LEN {
        return Err(CommandError::Malformed("too short"));
    }
    let (unsigned, signature) = bytes.split_at(bytes.len() - SIGNATURE_LEN);
    let mut r = Reader(unsigned);
    if r.take(4, "magic")? != MAGIC {
        return Err(CommandError::Malformed("not an operator command"));
    }
    if r.take(1, "version")?[0] != VERSION {
        return Err(CommandError::Malformed("unknown version"));
    }
    let addressed = PartyIndex::new(i64::from(r.take(1, "party")?[0]))
        .map_err(|_| CommandError::Malformed("party index"))?;
    let counter_bytes: [u8; 8] = r
        .take(8, "counter")?
        .try_into()
        .map_err(|_| CommandError::Malformed("counter"))?;
    let counter = u64::from_be_bytes(counter_bytes);
    let expiry_bytes: [u8; 8] = r
        .take(8, "expiry")?
        .try_into()
        .map_err(|_| CommandError::Malformed("expiry"))?;
    let expires_at = u64::from_be_bytes(expiry_bytes);
    let action_len = usize::from(r.take(1, "action length")?[0]);
    let found = String::from_utf8_lossy(r.take(action_len, "action")?).into_owned();
    let len_bytes: [u8; 4] = r
        .take(4, "payload length")?
        .try_into()
        .map_err(|_| CommandError::Malformed("payload length"))?;
    let payload_len = u32::from_be_bytes(len_bytes) as usize;
    if payload_len > MAX_PAYLOAD {
        return Err(CommandError::Malformed("payload too large"));
    }
    let payload = r.take(payload_len, "payload")?.to_vec();
    if !r.0.is_empty() {
        return Err(CommandError::Malformed("trailing bytes"));
    }
    // The signature first: nothing about an unauthenticated command is reported but that.
    let signature =
        Signature::from_slice(signature).map_err(|_| CommandError::Malformed("signature"))?;
    key.0
        .verify_strict(&signed_message(unsigned), &signature)
        .map_err(|_| CommandError::BadSignature)?;
    if addressed != me {
        return Err(CommandError::WrongParty { addressed, me });
    }
    if found != action {
        return Err(CommandError::WrongAction {
            expected: action.to_owned(),
            found,
        });
    }
    if now > expires_at {
        return Err(CommandError::Expired {
            late_seconds: (now - expires_at) / 1_000_000,
        });
    }
    if expires_at - now > MAX_LIFETIME_MICROS {
        return Err(CommandError::TooLongLived {
            seconds: (expires_at - now) / 1_000_000,
            max: MAX_LIFETIME_MICROS / 1_000_000,
        });
    }
    if counter <= last {
        return Err(CommandError::Replayed { counter, last });
    }
    Ok(VerifiedCommand { counter, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_pin_round_trips_and_malformed_payloads_are_refused() {
        for (peer, replace) in [(0u8, false), (2, true)] {
            let pin = PeerPin {
                peer: PartyIndex::ALL[usize::from(peer)],
                key: [peer + 7; 32],
                replace,
            };
            assert_eq!(PeerPin::decode(&pin.encode()), Ok(pin));
        }
        let good = PeerPin {
            peer: PartyIndex::ALL[1],
            key: [9; 32],
            replace: false,
        }
        .encode();
        for (at, value) in [(0usize, 2u8), (1, 3), (2, 2)] {
            let mut bad = good.clone();
            bad[at] = value;
            assert!(PeerPin::decode(&bad).is_err(), "byte {at} = {value}");
        }
        assert!(PeerPin::decode(&good[..34]).is_err());
        assert!(PeerPin::decode(&[good.clone(), vec![0]].concat()).is_err());
    }

    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    const P2: PartyIndex = PartyIndex::ALL[2];

    fn key(seed: u64) -> OperatorSigningKey {
        OperatorSigningKey::generate(&mut ChaCha20Rng::seed_from_u64(seed))
    }

    #[test]
    fn a_signed_command_verifies_once_per_counter() {
        let operator = key(1);
        let public = operator.verifying_key();
        let command = operator.sign(P2, 10, "face-dealer-config", b"sealed");
        let ok = verify_command(&command, P2, "face-dealer-config", &public, 9, 20).expect("valid");
        assert_eq!(ok.counter, 10);
        assert_eq!(ok.payload, b"sealed");
        assert_eq!(
            verify_command(&command, P2, "face-dealer-config", &public, 10, 20),
            Err(CommandError::Replayed {
                counter: 10,
                last: 10
            })
        );
    }

    #[test]
    fn wrong_key_party_action_or_any_flipped_bit_is_refused() {
        let operator = key(1);
        let public = operator.verifying_key();
        let command = operator.sign(P2, 10, "face-dealer-config", b"sealed");
        let other = key(2).sign(P2, 10, "face-dealer-config", b"sealed");
        assert_eq!(
            verify_command(&other, P2, "face-dealer-config", &public, 0, 20),
            Err(CommandError::BadSignature)
        );
        assert!(matches!(
            verify_command(
                &command,
                PartyIndex::ALL[0],
                "face-dealer-config",
                &public,
                0,
                20
            ),
            Err(CommandError::WrongParty { .. })
        ));
        assert!(matches!(
            verify_command(&command, P2, "peer-pin", &public, 0, 20),
            Err(CommandError::WrongAction { .. })
        ));
        for i in 0..command.len() {
            let mut tampered = command.clone();
            tampered[i] ^= 0x01;
            assert!(
                verify_command(&tampered, P2, "face-dealer-config", &public, 0, 20).is_err(),
                "bit flip at byte {i} accepted"
            );
        }
        assert!(verify_command(&command[..20], P2, "face-dealer-config", &public, 0, 20).is_err());
    }

    #[test]
    fn an_expired_or_too_long_lived_command_is_refused() {
        let operator = key(4);
        let public = operator.verifying_key();
        let signed_at = 1_800_000_000_000_000u64;
        let command = operator.sign(P2, signed_at, "peer-pin", b"pin");
        let valid_until = signed_at + DEFAULT_LIFETIME_MICROS;
        assert!(verify_command(&command, P2, "peer-pin", &public, 0, valid_until).is_ok());
        assert_eq!(
            verify_command(
                &command,
                P2,
                "peer-pin",
                &public,
                0,
                valid_until + 3_000_000
            ),
            Err(CommandError::Expired { late_seconds: 3 })
        );
        let long = operator.sign_expiring(
            P2,
            signed_at,
            signed_at + MAX_LIFETIME_MICROS + 1_000_000,
            "peer-pin",
            b"pin",
        );
        assert!(matches!(
            verify_command(&long, P2, "peer-pin", &public, 0, signed_at),
            Err(CommandError::TooLongLived { .. })
        ));
        // A version 1 command (no expiry) is refused before anything else is read.
        let mut v1 = command.clone();
        v1[4] = 1;
        assert_eq!(
            verify_command(&v1, P2, "peer-pin", &public, 0, signed_at),
            Err(CommandError::Malformed("unknown version"))
        );
    }

    #[test]
    fn keys_round_trip_through_bytes_and_hex() {
        let operator = key(3);
        let again = OperatorSigningKey::from_bytes(&operator.to_bytes());
        assert_eq!(again.verifying_key(), operator.verifying_key());
        let public = operator.verifying_key();
        assert_eq!(OperatorVerifyingKey::from_hex(&public.to_hex()), Ok(public));
        assert_eq!(
            OperatorVerifyingKey::from_hex("00"),
            Err(CommandError::BadKey)
        );
        assert!(!format!("{operator:?}").contains(&hex::encode(operator.to_bytes().as_slice())));
    }
}
