//! Registered clients' signatures on sealed inputs (issue 34, "What to build" item 4): a
//! client that a party's operator registered signs each sealed input it sends to that party,
//! so every party knows which client asked, refuses inputs no registered client signed when
//! its policy says so, refuses a replayed or expired input, and charges its budgets per
//! client (docs/trust-model.md §4a, §5).
//!
//! A **signed input** wraps one sealed blob (whatever a modality seals to one party: an iris
//! probe share, a face probe, an enrolment bundle) without touching it:
//!
//! ```text
//! "PMCA" | version (1) = 1 | party index (1) | purpose length (1) | purpose
//!        | client id length (1) | client id | nonce (16)
//!        | expires at (8, big endian: seconds since the Unix epoch)
//!        | Ed25519 signature (64) | sealed blob (the rest)
//! ```
//!
//! The signature (RFC 8032 Ed25519, `ed25519-dalek`, strict verification) covers the domain
//! label [`DOMAIN`], every byte before the signature, and the SHA-256 of the sealed blob: so
//! it binds the client, the party the blob is for, its purpose label (the sealing purpose,
//! e.g. `"iris-probe"`), a fresh random nonce and an expiry to exactly that blob. A party
//! accepts it only if the signature verifies under the key its operator registered for that
//! client id, it is addressed to this party and purpose, it has not expired (with
//! [`CLOCK_SKEW_SECS`] of tolerance) and was not signed to live longer than
//! [`MAX_LIFETIME_SECS`], and its nonce was never accepted before (the party keeps accepted
//! nonces until the input could no longer be accepted: [`ClientAuth::keep_until`]).
//!
//! Sealed boxes start with their own magic (`core::crypto::seal`), never `"PMCA"`, so a blob
//! without the magic is an unsigned input of an older client: [`unwrap`] returns it as it is
//! and the party's policy decides whether it is accepted.
//!
//! The operator's commands that manage clients travel as operator commands
//! ([`crate::crypto::sign`]) with the actions [`CLIENT_REGISTER_ACTION`],
//! [`CLIENT_REVOKE_ACTION`] and [`CLIENT_AUTH_POLICY_ACTION`]; their payloads are
//! [`ClientRegistration`], [`ClientRevocation`] and [`ClientAuthPolicy`].

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rand_core::{CryptoRng, RngCore};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::party::PartyIndex;

/// The label every signature starts with, so a client key's signature over anything else can
/// never be taken for a signed input.
pub const DOMAIN: &[u8] = b"privmatch client input v1";
/// The first bytes of a signed input.
pub const MAGIC: &[u8; 4] = b"PMCA";
const VERSION: u8 = 1;
const SIGNATURE_LEN: usize = 64;
/// The length of a signed input's nonce.
pub const NONCE_LEN: usize = 16;
/// The longest client id, in bytes.
pub const MAX_CLIENT_ID_LEN: usize = 64;
/// The longest purpose label, in bytes.
pub const MAX_PURPOSE_LEN: usize = 64;
/// How long [`ClientSigningKey::wrap`] makes an input valid: five minutes.
pub const DEFAULT_LIFETIME_SECS: u64 = 5 * 60;
/// The longest a party lets an input live: one whose expiry lies further ahead than this
/// (plus [`CLOCK_SKEW_SECS`]) is refused, so no signed input can be kept for long and the
/// nonces a party must remember stay few.
pub const MAX_LIFETIME_SECS: u64 = 10 * 60;
/// How far the client's and the party's clocks may differ: an input is still accepted this
/// long after its expiry, and may expire this much later than [`MAX_LIFETIME_SECS`] from now.
pub const CLOCK_SKEW_SECS: u64 = 60;

/// The operator command (action) that registers a client or changes its budget.
pub const CLIENT_REGISTER_ACTION: &str = "client-register";
/// The operator command (action) that revokes a client.
pub const CLIENT_REVOKE_ACTION: &str = "client-revoke";
/// The operator command (action) that sets the party's client-auth policy.
pub const CLIENT_AUTH_POLICY_ACTION: &str = "client-auth-policy";
const PAYLOAD_VERSION: u8 = 1;

/// Why a signed input (or a client command's payload) was refused. Messages name the check
/// that failed and the client id, never key material or the blob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientAuthError {
    /// The bytes carry the magic of a signed input but are not a well-formed one.
    #[error("malformed signed input: {0}")]
    Malformed(&'static str),
    /// A client id that is empty, too long or has characters other than ASCII letters,
    /// digits, '.', '_', '-', '@' (or does not start with a letter or digit).
    #[error("invalid client id {0:?}: 1 to 64 ASCII letters, digits, '.', '_', '-' or '@', starting with a letter or digit")]
    BadClientId(String),
    /// A key that is not a valid Ed25519 public key.
    #[error("not an Ed25519 public key (64 hex digits of a valid point)")]
    BadKey,
    /// The signature does not verify under the client's registered key.
    #[error("the signature of client {client:?} does not verify under its registered key: tampered, or signed by another key")]
    BadSignature {
        /// The client id the input names.
        client: String,
    },
    /// The input is addressed to another party.
    #[error("the input of client {client:?} is signed for {addressed}, not for {me}")]
    WrongParty {
        /// The client id the input names.
        client: String,
        /// The party named in the input.
        addressed: PartyIndex,
        /// The party that received it.
        me: PartyIndex,
    },
    /// The input was signed for another purpose.
    #[error("the input of client {client:?} is signed for purpose {found:?}, not {expected:?}")]
    WrongPurpose {
        /// The client id the input names.
        client: String,
        /// The purpose the receiving function expects.
        expected: String,
        /// The purpose named in the input.
        found: String,
    },
    /// The input expired before it arrived (beyond the clock skew allowed).
    #[error("the input of client {client:?} expired {late_seconds} s ago: sign it again")]
    Expired {
        /// The client id the input names.
        client: String,
        /// How many seconds after its expiry it arrived.
        late_seconds: u64,
    },
    /// The input was signed to stay valid for longer than a party accepts.
    #[error("the input of client {client:?} is valid for another {seconds} s, more than the {max} s a party accepts")]
    TooLongLived {
        /// The client id the input names.
        client: String,
        /// Seconds from now to its expiry.
        seconds: u64,
        /// The most a party accepts ([`MAX_LIFETIME_SECS`] + [`CLOCK_SKEW_SECS`]).
        max: u64,
    },
}

/// A registered client's name: 1 to [`MAX_CLIENT_ID_LEN`] bytes of ASCII letters, digits,
/// '.', '_', '-' and '@', starting with a letter or a digit (so it is safe in messages, logs
/// and file names). Constructed only through [`ClientId::new`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(String);

impl ClientId {
    /// Checks `id` (see the type's docs).
    pub fn new(id: &str) -> Result<Self, ClientAuthError> {
        let bytes = id.as_bytes();
        let allowed = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@');
        let ok = !bytes.is_empty()
            && bytes.len() <= MAX_CLIENT_ID_LEN
            && bytes[0].is_ascii_alphanumeric()
            && bytes.iter().all(allowed);
        if ok {
            Ok(ClientId(id.to_owned()))
        } else {
            // Cut what is echoed back, so a huge argument does not become a huge message.
            let shown: String = id.chars().take(MAX_CLIENT_ID_LEN + 1).collect();
            Err(ClientAuthError::BadClientId(shown))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ClientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client's Ed25519 signing key. Its bytes are zeroised on drop and never printed.
pub struct ClientSigningKey(SigningKey);

impl std::fmt::Debug for ClientSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientSigningKey(<redacted>)")
    }
}

impl ClientSigningKey {
    /// A fresh key from `rng`.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(seed.as_mut_slice());
        ClientSigningKey(SigningKey::from_bytes(&seed))
    }

    /// The key of a 32-byte seed.
    pub fn from_bytes(seed: &[u8; 32]) -> Self {
        ClientSigningKey(SigningKey::from_bytes(seed))
    }

    /// The 32-byte seed (for the client's key file).
    pub fn to_bytes(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.0.to_bytes())
    }

    /// The public half, which the party's operator registers.
    pub fn verifying_key(&self) -> ClientVerifyingKey {
        ClientVerifyingKey(self.0.verifying_key())
    }

    /// Wraps `sealed` (a blob sealed to party `party` for `purpose`) as client `client`'s
    /// signed input, valid from `now` (seconds since the Unix epoch) for
    /// [`DEFAULT_LIFETIME_SECS`], with a fresh nonce from `rng` (module docs).
    pub fn wrap<R: RngCore + CryptoRng>(
        &self,
        client: &ClientId,
        party: PartyIndex,
        purpose: &str,
        sealed: &[u8],
        now: u64,
        rng: &mut R,
    ) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        let expires_at = now.saturating_add(DEFAULT_LIFETIME_SECS);
        self.wrap_with(client, party, purpose, nonce, expires_at, sealed)
    }

    /// Wraps `sealed` with the given `nonce` and expiry `expires_at` (seconds since the Unix
    /// epoch): [`ClientSigningKey::wrap`] with every field chosen by the caller (tests, and
    /// clients with their own clock or nonce source). A purpose longer than
    /// [`MAX_PURPOSE_LEN`] bytes is cut there (purposes are short constants of the code).
    pub fn wrap_with(
        &self,
        client: &ClientId,
        party: PartyIndex,
        purpose: &str,
        nonce: [u8; NONCE_LEN],
        expires_at: u64,
        sealed: &[u8],
    ) -> Vec<u8> {
        let purpose = &purpose.as_bytes()[..purpose.len().min(MAX_PURPOSE_LEN)];
        let id = client.as_str().as_bytes();
        let mut out =
            Vec::with_capacity(8 + purpose.len() + id.len() + NONCE_LEN + 8 + 64 + sealed.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(party.as_u8());
        // Both lengths are at most 64 (checked above and by ClientId::new).
        out.push(u8::try_from(purpose.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(purpose);
        out.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(id);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&expires_at.to_be_bytes());
        let signature = self.0.sign(&signed_message(&out, sealed));
        out.extend_from_slice(&signature.to_bytes());
        out.extend_from_slice(sealed);
        out
    }
}

/// A client's public key, as a party stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientVerifyingKey(VerifyingKey);

impl ClientVerifyingKey {
    /// Parses 32 bytes (a valid, non-weak point).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ClientAuthError> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| ClientAuthError::BadKey)?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| ClientAuthError::BadKey)?;
        if key.is_weak() {
            return Err(ClientAuthError::BadKey);
        }
        Ok(ClientVerifyingKey(key))
    }

    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, ClientAuthError> {
        let bytes = hex::decode(text.trim()).map_err(|_| ClientAuthError::BadKey)?;
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

/// The header of a signed input, parsed but not yet verified ([`ClientAuth::verify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientAuth {
    /// The party the input is addressed to.
    pub party: PartyIndex,
    /// The purpose label it was signed for.
    pub purpose: String,
    /// The client that (claims to have) signed it.
    pub client: ClientId,
    /// Its single-use nonce.
    pub nonce: [u8; NONCE_LEN],
    /// When it expires, in seconds since the Unix epoch.
    pub expires_at: u64,
    signature: [u8; SIGNATURE_LEN],
    /// The header bytes the signature covers (before the signature).
    signed_header: Vec<u8>,
}

impl ClientAuth {
    /// Checks the input against the key `key` registered for its client, as party `me`
    /// expecting `purpose`, for the sealed blob `sealed` that came with it, at the party's
    /// time `now` (seconds since the Unix epoch). The signature is checked first: nothing about
    /// an input that does not verify is reported but that.
    pub fn verify(
        &self,
        key: &ClientVerifyingKey,
        me: PartyIndex,
        purpose: &str,
        sealed: &[u8],
        now: u64,
    ) -> Result<(), ClientAuthError> {
        let client = || self.client.as_str().to_owned();
        let signature = Signature::from_bytes(&self.signature);
        key.0
            .verify_strict(&signed_message(&self.signed_header, sealed), &signature)
            .map_err(|_| ClientAuthError::BadSignature { client: client() })?;
        if self.party != me {
            return Err(ClientAuthError::WrongParty {
                client: client(),
                addressed: self.party,
                me,
            });
        }
        if self.purpose != purpose {
            return Err(ClientAuthError::WrongPurpose {
                client: client(),
                expected: purpose.to_owned(),
                found: self.purpose.clone(),
            });
        }
        let deadline = self.expires_at.saturating_add(CLOCK_SKEW_SECS);
        if now > deadline {
            return Err(ClientAuthError::Expired {
                client: client(),
                late_seconds: now.wrapping_sub(self.expires_at),
            });
        }
        let max = MAX_LIFETIME_SECS.wrapping_add(CLOCK_SKEW_SECS);
        if self.expires_at > now.saturating_add(max) {
            return Err(ClientAuthError::TooLongLived {
                client: client(),
                seconds: self.expires_at.wrapping_sub(now),
                max,
            });
        }
        Ok(())
    }

    /// Until when (seconds since the Unix epoch) a party must remember this input's nonce:
    /// after that, [`ClientAuth::verify`] refuses the input as expired anyway.
    pub fn keep_until(&self) -> u64 {
        self.expires_at.saturating_add(CLOCK_SKEW_SECS)
    }
}

fn signed_message(header: &[u8], sealed: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(DOMAIN.len() + header.len() + 32);
    message.extend_from_slice(DOMAIN);
    message.extend_from_slice(header);
    message.extend_from_slice(&Sha256::digest(sealed));
    message
}

/// A cursor over an encoding's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ClientAuthError> {
        if self.0.len() < n {
            return Err(ClientAuthError::Malformed(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self, what: &'static str) -> Result<u8, ClientAuthError> {
        Ok(self.take(1, what)?[0])
    }

    fn text(&mut self, what: &'static str) -> Result<&'a str, ClientAuthError> {
        let len = usize::from(self.byte(what)?);
        std::str::from_utf8(self.take(len, what)?).map_err(|_| ClientAuthError::Malformed(what))
    }
}

/// Splits `blob` into its client signature (`None`: no [`MAGIC`], an unsigned input of an
/// older client, returned whole) and the sealed blob inside. Nothing is verified here: call
/// [`ClientAuth::verify`] with the client's registered key. A blob with the magic that does
/// not parse is refused ([`ClientAuthError::Malformed`]).
pub fn unwrap(blob: &[u8]) -> Result<(Option<ClientAuth>, &[u8]), ClientAuthError> {
    if blob.len() < MAGIC.len() || &blob[..MAGIC.len()] != MAGIC {
        return Ok((None, blob));
    }
    let mut r = Reader(&blob[MAGIC.len()..]);
    if r.byte("version")? != VERSION {
        return Err(ClientAuthError::Malformed("unknown version"));
    }
    let party = PartyIndex::new(i64::from(r.byte("party")?))
        .map_err(|_| ClientAuthError::Malformed("party index out of range"))?;
    let purpose = r.text("purpose")?;
    if purpose.is_empty() || purpose.len() > MAX_PURPOSE_LEN {
        return Err(ClientAuthError::Malformed("purpose length"));
    }
    let client = ClientId::new(r.text("client id")?)?;
    let nonce: [u8; NONCE_LEN] = r
        .take(NONCE_LEN, "nonce")?
        .try_into()
        .map_err(|_| ClientAuthError::Malformed("nonce"))?;
    let expiry: [u8; 8] = r
        .take(8, "expiry")?
        .try_into()
        .map_err(|_| ClientAuthError::Malformed("expiry"))?;
    let header_len = blob.len() - r.0.len();
    let signature: [u8; SIGNATURE_LEN] = r
        .take(SIGNATURE_LEN, "signature")?
        .try_into()
        .map_err(|_| ClientAuthError::Malformed("signature"))?;
    let inner = r.0;
    Ok((
        Some(ClientAuth {
            party,
            purpose: purpose.to_owned(),
            client,
            nonce,
            expires_at: u64::from_be_bytes(expiry),
            signature,
            signed_header: blob[..header_len].to_vec(),
        }),
        inner,
    ))
}

// --- the operator's commands about clients ---------------------------------------------------

/// The payload of a `client-register` operator command: register client `client` with the
/// Ed25519 public key `key`, allowed `per_hour` requests per hour of each budget kind at this
/// party (on top of the party-wide budgets); `replace` lets it change the key of a client
/// registered before, or reinstate a revoked one. Encoded as
/// `version (1) | replace (1: 0 or 1) | per hour (4, big endian, at most 2^31 - 1) | key (32)
/// | client id length (1) | client id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRegistration {
    /// The client's id.
    pub client: ClientId,
    /// Its public key.
    pub key: ClientVerifyingKey,
    /// Requests per hour per budget kind (0 refuses every request it signs).
    pub per_hour: u32,
    /// Whether a different key, or a revoked registration, may be replaced.
    pub replace: bool,
}

/// The most requests per hour a registration may allow (PostgreSQL's `integer`).
pub const MAX_PER_HOUR: u32 = i32::MAX as u32;

impl ClientRegistration {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let id = self.client.as_str().as_bytes();
        let mut out = Vec::with_capacity(39 + id.len());
        out.extend_from_slice(&[PAYLOAD_VERSION, u8::from(self.replace)]);
        out.extend_from_slice(&self.per_hour.min(MAX_PER_HOUR).to_be_bytes());
        out.extend_from_slice(&self.key.to_bytes());
        out.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(id);
        out
    }

    /// Parses payload bytes, refusing any other version, flag, key, id or length.
    pub fn decode(bytes: &[u8]) -> Result<Self, ClientAuthError> {
        let mut r = Reader(bytes);
        if r.byte("registration version")? != PAYLOAD_VERSION {
            return Err(ClientAuthError::Malformed(
                "a client registration is version 1",
            ));
        }
        let replace = match r.byte("replace flag")? {
            0 => false,
            1 => true,
            _ => return Err(ClientAuthError::Malformed("replace flag is not 0 or 1")),
        };
        let per_hour: [u8; 4] = r
            .take(4, "per hour")?
            .try_into()
            .map_err(|_| ClientAuthError::Malformed("per hour"))?;
        let per_hour = u32::from_be_bytes(per_hour);
        if per_hour > MAX_PER_HOUR {
            return Err(ClientAuthError::Malformed("per hour above 2^31 - 1"));
        }
        let key = ClientVerifyingKey::from_bytes(r.take(32, "key")?)?;
        let client = ClientId::new(r.text("client id")?)?;
        if !r.0.is_empty() {
            return Err(ClientAuthError::Malformed("trailing bytes"));
        }
        Ok(ClientRegistration {
            client,
            key,
            per_hour,
            replace,
        })
    }
}

/// The payload of a `client-revoke` operator command: from now on, inputs signed by `client`
/// are refused. Encoded as `version (1) | client id length (1) | client id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRevocation {
    /// The client revoked.
    pub client: ClientId,
}

impl ClientRevocation {
    /// The payload bytes.
    pub fn encode(&self) -> Vec<u8> {
        let id = self.client.as_str().as_bytes();
        let mut out = Vec::with_capacity(2 + id.len());
        out.push(PAYLOAD_VERSION);
        out.push(u8::try_from(id.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(id);
        out
    }

    /// Parses payload bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, ClientAuthError> {
        let mut r = Reader(bytes);
        if r.byte("revocation version")? != PAYLOAD_VERSION {
            return Err(ClientAuthError::Malformed(
                "a client revocation is version 1",
            ));
        }
        let client = ClientId::new(r.text("client id")?)?;
        if !r.0.is_empty() {
            return Err(ClientAuthError::Malformed("trailing bytes"));
        }
        Ok(ClientRevocation { client })
    }
}

/// A party's client-auth policy: whether sealed inputs must carry a registered client's
/// signature. Signed inputs are verified under either policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuthPolicy {
    /// Unsigned inputs (of clients older than 0.12.0) are accepted; the install default.
    Optional,
    /// Every sealed input must be signed by a registered, unrevoked client (what deployments
    /// set once their clients are registered).
    Required,
}

impl ClientAuthPolicy {
    /// The policy's name: `optional` or `required`.
    pub fn name(self) -> &'static str {
        match self {
            ClientAuthPolicy::Optional => "optional",
            ClientAuthPolicy::Required => "required",
        }
    }

    /// The policy named `name` (`optional` or `required`).
    pub fn parse(name: &str) -> Result<Self, ClientAuthError> {
        match name {
            "optional" => Ok(ClientAuthPolicy::Optional),
            "required" => Ok(ClientAuthPolicy::Required),
            _ => Err(ClientAuthError::Malformed(
                "the client-auth policy is 'optional' or 'required'",
            )),
        }
    }

    /// The payload of a `client-auth-policy` command: `version (1) | policy (1: 0 optional,
    /// 1 required)`.
    pub fn encode(self) -> Vec<u8> {
        vec![
            PAYLOAD_VERSION,
            u8::from(self == ClientAuthPolicy::Required),
        ]
    }

    /// Parses payload bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, ClientAuthError> {
        match bytes {
            [PAYLOAD_VERSION, 0] => Ok(ClientAuthPolicy::Optional),
            [PAYLOAD_VERSION, 1] => Ok(ClientAuthPolicy::Required),
            _ => Err(ClientAuthError::Malformed(
                "a client-auth policy is version 1 and 2 bytes, policy 0 or 1",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::{any, prop, proptest, ProptestConfig};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    use super::*;

    const P0: PartyIndex = PartyIndex::ALL[0];
    const P1: PartyIndex = PartyIndex::ALL[1];
    const NOW: u64 = 1_800_000_000;

    fn key(seed: u64) -> ClientSigningKey {
        ClientSigningKey::generate(&mut ChaCha20Rng::seed_from_u64(seed))
    }

    fn id(text: &str) -> ClientId {
        ClientId::new(text).expect("valid id")
    }

    fn check(
        blob: &[u8],
        key: &ClientVerifyingKey,
        me: PartyIndex,
        purpose: &str,
        now: u64,
    ) -> Result<(ClientId, Vec<u8>), ClientAuthError> {
        let (auth, inner) = unwrap(blob)?;
        let auth = auth.ok_or(ClientAuthError::Malformed("unsigned"))?;
        auth.verify(key, me, purpose, inner, now)?;
        Ok((auth.client, inner.to_vec()))
    }

    #[test]
    fn a_wrapped_input_verifies_and_returns_the_sealed_blob() {
        let alice = key(1);
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let blob = alice.wrap(
            &id("alice"),
            P1,
            "iris-probe",
            b"sealed bytes",
            NOW,
            &mut rng,
        );
        let (client, inner) =
            check(&blob, &alice.verifying_key(), P1, "iris-probe", NOW).expect("valid");
        assert_eq!(client, id("alice"));
        assert_eq!(inner, b"sealed bytes");
        let (auth, _) = unwrap(&blob).expect("parses");
        let auth = auth.expect("signed");
        assert_eq!(auth.expires_at, NOW + DEFAULT_LIFETIME_SECS);
        assert_eq!(
            auth.keep_until(),
            NOW + DEFAULT_LIFETIME_SECS + CLOCK_SKEW_SECS
        );
        // Two inputs never share a nonce.
        let again = alice.wrap(
            &id("alice"),
            P1,
            "iris-probe",
            b"sealed bytes",
            NOW,
            &mut rng,
        );
        let (other, _) = unwrap(&again).expect("parses");
        assert_ne!(other.expect("signed").nonce, auth.nonce);
    }

    #[test]
    fn an_unsigned_blob_is_returned_whole() {
        for blob in [&b""[..], b"PMC", b"PMSB\x01 sealed", b"anything else"] {
            let (auth, inner) = unwrap(blob).expect("unsigned");
            assert!(auth.is_none());
            assert_eq!(inner, blob);
        }
    }

    #[test]
    fn another_party_purpose_key_or_time_is_refused() {
        let alice = key(1);
        let public = alice.verifying_key();
        let blob = alice.wrap_with(&id("alice"), P1, "iris-probe", [7; 16], NOW + 300, b"s");
        assert!(matches!(
            check(&blob, &public, P0, "iris-probe", NOW),
            Err(ClientAuthError::WrongParty { addressed, me, .. }) if addressed == P1 && me == P0
        ));
        assert!(matches!(
            check(&blob, &public, P1, "face-probe", NOW),
            Err(ClientAuthError::WrongPurpose { ref found, .. }) if found == "iris-probe"
        ));
        assert_eq!(
            check(&blob, &key(2).verifying_key(), P1, "iris-probe", NOW),
            Err(ClientAuthError::BadSignature {
                client: "alice".into()
            })
        );
        // Expired: accepted up to the clock skew after the expiry, refused after.
        let deadline = NOW + 300 + CLOCK_SKEW_SECS;
        assert!(check(&blob, &public, P1, "iris-probe", deadline).is_ok());
        assert_eq!(
            check(&blob, &public, P1, "iris-probe", deadline + 1),
            Err(ClientAuthError::Expired {
                client: "alice".into(),
                late_seconds: CLOCK_SKEW_SECS + 1
            })
        );
        // Signed to live too long.
        let max = MAX_LIFETIME_SECS + CLOCK_SKEW_SECS;
        let long = alice.wrap_with(&id("alice"), P1, "iris-probe", [7; 16], NOW + max + 1, b"s");
        assert!(matches!(
            check(&long, &public, P1, "iris-probe", NOW),
            Err(ClientAuthError::TooLongLived { .. })
        ));
        let longest = alice.wrap_with(&id("alice"), P1, "iris-probe", [7; 16], NOW + max, b"s");
        assert!(check(&longest, &public, P1, "iris-probe", NOW).is_ok());
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let alice = key(3);
        let public = alice.verifying_key();
        let blob = alice.wrap_with(&id("alice"), P0, "face-probe", [1; 16], NOW + 60, b"inner!");
        for i in 0..blob.len() {
            for bit in [0x01u8, 0x80] {
                let mut tampered = blob.clone();
                tampered[i] ^= bit;
                let got = check(&tampered, &public, P0, "face-probe", NOW);
                // A flip in the magic makes it an unsigned blob (refused by `check` here, and
                // by the party's policy or the sealed box's own checks there).
                assert!(got.is_err(), "bit {bit:#x} of byte {i} accepted");
            }
        }
        // Truncated anywhere, or one byte appended (the inner blob changes): refused.
        for len in 4..blob.len() {
            assert!(
                check(&blob[..len], &public, P0, "face-probe", NOW).is_err(),
                "{len}"
            );
        }
        let mut longer = blob.clone();
        longer.push(0);
        assert!(check(&longer, &public, P0, "face-probe", NOW).is_err());
    }

    #[test]
    fn client_ids_are_checked() {
        for good in [
            "alice",
            "a",
            "enrol-station.07",
            "kiosk_3@site-b",
            &"x".repeat(64),
        ] {
            assert_eq!(
                ClientId::new(good).map(|c| c.to_string()),
                Ok(good.to_owned())
            );
        }
        for bad in [
            "",
            "-alice",
            ".a",
            "al ice",
            "alice\n",
            "élise",
            &"x".repeat(65),
        ] {
            assert!(ClientId::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys_round_trip_and_are_not_printed() {
        let alice = key(4);
        let again = ClientSigningKey::from_bytes(&alice.to_bytes());
        assert_eq!(again.verifying_key(), alice.verifying_key());
        let public = alice.verifying_key();
        assert_eq!(ClientVerifyingKey::from_hex(&public.to_hex()), Ok(public));
        assert_eq!(
            ClientVerifyingKey::from_hex("00"),
            Err(ClientAuthError::BadKey)
        );
        assert!(!format!("{alice:?}").contains(&hex::encode(alice.to_bytes().as_slice())));
    }

    #[test]
    fn command_payloads_round_trip_and_malformed_ones_are_refused() {
        let registration = ClientRegistration {
            client: id("kiosk-1"),
            key: key(5).verifying_key(),
            per_hour: 120,
            replace: true,
        };
        let bytes = registration.encode();
        assert_eq!(ClientRegistration::decode(&bytes), Ok(registration));
        for (at, value) in [(0usize, 2u8), (1, 2), (2, 0x80)] {
            let mut bad = bytes.clone();
            bad[at] = value;
            assert!(
                ClientRegistration::decode(&bad).is_err(),
                "byte {at} = {value}"
            );
        }
        assert!(ClientRegistration::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(ClientRegistration::decode(&[bytes.clone(), vec![0]].concat()).is_err());

        let revocation = ClientRevocation {
            client: id("kiosk-1"),
        };
        let bytes = revocation.encode();
        assert_eq!(ClientRevocation::decode(&bytes), Ok(revocation));
        assert!(ClientRevocation::decode(&bytes[..3]).is_err());
        assert!(ClientRevocation::decode(&[2, 1, b'a']).is_err());

        for policy in [ClientAuthPolicy::Optional, ClientAuthPolicy::Required] {
            assert_eq!(ClientAuthPolicy::decode(&policy.encode()), Ok(policy));
            assert_eq!(ClientAuthPolicy::parse(policy.name()), Ok(policy));
        }
        assert!(ClientAuthPolicy::decode(&[1, 2]).is_err());
        assert!(ClientAuthPolicy::decode(&[1]).is_err());
        assert!(ClientAuthPolicy::parse("maybe").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any sealed blob, client id and purpose round-trips; any change to one of the
        /// signed fields or the blob is refused.
        #[test]
        fn any_input_round_trips_and_any_field_change_is_refused(
            seed in any::<u64>(),
            inner in prop::collection::vec(any::<u8>(), 0..300),
            id_len in 1usize..=64,
            nonce in any::<[u8; 16]>(),
            lifetime in 0u64..=MAX_LIFETIME_SECS,
            party in 0usize..3,
            flip in any::<usize>(),
        ) {
            let signer = key(seed);
            let public = signer.verifying_key();
            let client = id(&"c".repeat(id_len));
            let me = PartyIndex::ALL[party];
            let blob = signer.wrap_with(&client, me, "iris-probe", nonce, NOW + lifetime, &inner);
            let (got, opened) = check(&blob, &public, me, "iris-probe", NOW).expect("valid");
            assert_eq!(got, client);
            assert_eq!(opened, inner);
            let mut tampered = blob.clone();
            let at = flip % tampered.len();
            tampered[at] ^= 0x20;
            assert!(check(&tampered, &public, me, "iris-probe", NOW).is_err(), "byte {at}");
            // Another party or purpose, with a valid signature: refused by name.
            let other = PartyIndex::ALL[(party + 1) % 3];
            let wrong = check(&blob, &public, other, "iris-probe", NOW);
            let is_wrong_party = matches!(wrong, Err(ClientAuthError::WrongParty { .. }));
            assert!(is_wrong_party);
            let wrong = check(&blob, &public, me, "iris-enrol", NOW);
            let is_wrong_purpose = matches!(wrong, Err(ClientAuthError::WrongPurpose { .. }));
            assert!(is_wrong_purpose);
        }
    }
}
