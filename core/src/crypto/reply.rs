//! Outputs sealed to the client that asked (issue 34, "the coordinator learns no result"): a
//! party seals what it computed for one session to the client's **reply key**, so that the
//! coordinator, which relays it, can neither read, alter nor forge it. Used by the face
//! evaluators' output shares ([`crate::face::reply`]) and the iris parties' signed outputs
//! ([`crate::iris::output`]); each names its own [`ReplyFormat`] (magic, version, HKDF label),
//! so an output of one kind never opens as another.
//!
//! The client puts the reply key R (an X25519 public key whose secret r only it holds) inside
//! its sealed probe, where the coordinator cannot swap it. Party P_i, with static key pair
//! (s_i, S_i), seals under
//!
//! ```text
//! k_i = HKDF-SHA256(ikm = X25519(s_i, R), salt = none,
//!                   info = label ‖ session (16) ‖ i (1) ‖ S_i (32) ‖ R (32))
//! ```
//!
//! with XChaCha20-Poly1305 (RFC 8439 with the extended nonce of draft-irtf-cfrg-xchacha;
//! random 24-byte nonce). The client computes the same key as X25519(r, S_i) with S_i from
//! its own pinned configuration, never from the coordinator (an ephemeral–static
//! Diffie–Hellman with the party's static key, as in the "one-pass" schemes of NIST SP
//! 800-56A rev. 3, §6.2.2). Only P_i and the holder of r can compute k_i, so an output that
//! opens is authenticated as P_i's for this session and reply key. For a SQL front door the
//! reply key is the called party's own static key: that party opens the outputs with its
//! key file.
//!
//! Layout:
//!
//! ```text
//! magic (4) | version (1) | party (1) | nonce (24) | AEAD(k_i, nonce, aad = header ‖ session, plaintext)
//! ```

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use hkdf::Hkdf;
use rand_core::{CryptoRng, RngCore};
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, Zeroizing};

use crate::crypto::seal::{PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;
use crate::wire::session::SESSION_ID_LEN;

/// Length of a reply key (an X25519 public key).
pub const REPLY_KEY_LEN: usize = 32;
/// Length of the random nonce.
pub const NONCE_LEN: usize = 24;
/// Length of the header: magic, version, party, nonce.
pub const HEADER_LEN: usize = 4 + 1 + 1 + NONCE_LEN;
/// Length of the AEAD tag.
pub const TAG_LEN: usize = 16;

/// What tells one kind of sealed output from another: its magic, layout version and HKDF
/// label (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyFormat {
    /// The first four bytes.
    pub magic: &'static [u8; 4],
    /// The layout version.
    pub version: u8,
    /// The HKDF info label.
    pub label: &'static [u8],
}

impl ReplyFormat {
    /// Length of a sealed output of `plaintext` bytes.
    pub const fn sealed_len(&self, plaintext: usize) -> usize {
        HEADER_LEN + plaintext + TAG_LEN
    }
}

/// Why a sealed output was refused by the client. Names no secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// Wrong magic or version, or too short.
    #[error("it is not a sealed output of this kind")]
    NotThisKind,
    /// The header names another party.
    #[error("it was sealed by another party")]
    OtherParty,
    /// The AEAD refused it.
    #[error("it does not open: altered in transit, or not sealed by this party for this session and reply key")]
    DoesNotOpen,
}

impl ReplyError {
    /// The error's text, for the callers' own error types.
    pub fn why(self) -> &'static str {
        match self {
            ReplyError::NotThisKind => "it is not a sealed output of this kind",
            ReplyError::OtherParty => "it was sealed by another party",
            ReplyError::DoesNotOpen => "it does not open: altered in transit, or not sealed by this party for this session and reply key",
        }
    }
}

/// The AEAD of party `party`'s output in `session` (module docs).
fn reply_cipher(
    format: &ReplyFormat,
    shared: &[u8; 32],
    session: &[u8; SESSION_ID_LEN],
    party: PartyIndex,
    party_key: &PartyPublicKey,
    reply_key: &PartyPublicKey,
) -> XChaCha20Poly1305 {
    let hk = Hkdf::<Sha256>::new(None, shared);
    let mut info = Vec::with_capacity(format.label.len() + SESSION_ID_LEN + 1 + 64);
    info.extend_from_slice(format.label);
    info.extend_from_slice(session);
    info.push(party.as_u8());
    info.extend_from_slice(party_key.as_bytes());
    info.extend_from_slice(reply_key.as_bytes());
    let mut key = [0u8; 32];
    // 32 bytes is always a valid HKDF-SHA256 output length.
    hk.expand(&info, &mut key)
        .expect("HKDF-SHA256 can expand 32 bytes");
    let cipher = XChaCha20Poly1305::new(&key.into());
    key.zeroize();
    cipher
}

/// The cipher of `party`'s outputs of `session` to `reply_key`, from the key agreement of
/// one side: `mine` is (own secret, the other side's public key) — the party's secret and the
/// reply key when sealing, the reply key's secret and the party's key when opening.
fn agreed_cipher(
    format: &ReplyFormat,
    session: &[u8; SESSION_ID_LEN],
    party: PartyIndex,
    party_key: &PartyPublicKey,
    reply_key: &PartyPublicKey,
    mine: (&PartySecretKey, &PartyPublicKey),
) -> XChaCha20Poly1305 {
    let mut shared = x25519(mine.0, mine.1);
    let cipher = reply_cipher(format, &shared, session, party, party_key, reply_key);
    shared.zeroize();
    cipher
}

fn x25519(secret: &PartySecretKey, public: &PartyPublicKey) -> [u8; 32] {
    let mut bytes = secret.to_bytes();
    let shared = StaticSecret::from(bytes)
        .diffie_hellman(&PublicKey::from(*public.as_bytes()))
        .to_bytes();
    bytes.zeroize();
    shared
}

fn aad(header: &[u8], session: &[u8; SESSION_ID_LEN]) -> Vec<u8> {
    [header, session.as_slice()].concat()
}

/// The sealing of one party's outputs to one reply key in one session, with its key derived
/// once (when the party's secret is at hand, at the session's start).
pub struct ReplySealer {
    format: ReplyFormat,
    party: PartyIndex,
    session: [u8; SESSION_ID_LEN],
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for ReplySealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplySealer({}, <redacted>)", self.party)
    }
}

impl ReplySealer {
    /// Party `me` (holding `secret`) prepares to seal its outputs of `session` to
    /// `reply_key` (from the client's sealed probe).
    pub fn new(
        format: ReplyFormat,
        me: PartyIndex,
        secret: &PartySecretKey,
        reply_key: &PartyPublicKey,
        session: &[u8; SESSION_ID_LEN],
    ) -> Self {
        let cipher = agreed_cipher(
            &format,
            session,
            me,
            &secret.public_key(),
            reply_key,
            (secret, reply_key),
        );
        ReplySealer {
            format,
            party: me,
            session: *session,
            cipher,
        }
    }

    /// The party that seals.
    pub fn party(&self) -> PartyIndex {
        self.party
    }

    /// Seals `plaintext` (layout in the module docs).
    pub fn seal<R: RngCore + CryptoRng>(&self, plaintext: &[u8], rng: &mut R) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.format.sealed_len(plaintext.len()));
        out.extend_from_slice(self.format.magic);
        out.push(self.format.version);
        out.push(self.party.as_u8());
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        out.extend_from_slice(&nonce);
        let ciphertext = self
            .cipher
            .encrypt(
                &nonce.into(),
                Payload {
                    msg: plaintext,
                    aad: &aad(&out, &self.session),
                },
            )
            .expect("XChaCha20-Poly1305 encryption of an in-memory buffer cannot fail");
        out.extend_from_slice(&ciphertext);
        out
    }
}

/// Client side: opens party `party`'s sealed output of `session` with the reply key's secret
/// `reply_secret` and the party's pinned public key `party_key`. Refused when it is of
/// another kind, names another party, or was altered, forged, or sealed for another session,
/// party or reply key.
pub fn open_reply(
    format: &ReplyFormat,
    party: PartyIndex,
    party_key: &PartyPublicKey,
    reply_secret: &PartySecretKey,
    session: &[u8; SESSION_ID_LEN],
    sealed: &[u8],
) -> Result<Zeroizing<Vec<u8>>, ReplyError> {
    ReplyOpener::new(*format, party, party_key, reply_secret, session).open(sealed)
}

/// Client side: the opening of party `party`'s sealed outputs of one session to one reply
/// key, with the key derived once ([`open_reply`] in two steps): a client that opens several
/// outputs of a session agrees on the key once.
pub struct ReplyOpener {
    format: ReplyFormat,
    party: PartyIndex,
    session: [u8; SESSION_ID_LEN],
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for ReplyOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplyOpener({}, <redacted>)", self.party)
    }
}

impl ReplyOpener {
    /// Derives the key of `party`'s outputs of `session` (pinned key `party_key`) to the
    /// reply key whose secret is `reply_secret`.
    pub fn new(
        format: ReplyFormat,
        party: PartyIndex,
        party_key: &PartyPublicKey,
        reply_secret: &PartySecretKey,
        session: &[u8; SESSION_ID_LEN],
    ) -> Self {
        let reply_key = reply_secret.public_key();
        let cipher = agreed_cipher(
            &format,
            session,
            party,
            party_key,
            &reply_key,
            (reply_secret, party_key),
        );
        ReplyOpener {
            format,
            party,
            session: *session,
            cipher,
        }
    }

    /// The party whose outputs this opens.
    pub fn party(&self) -> PartyIndex {
        self.party
    }

    /// Opens one sealed output (refused as [`open_reply`] refuses).
    pub fn open(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, ReplyError> {
        let format = &self.format;
        if sealed.len() < HEADER_LEN + TAG_LEN
            || &sealed[..4] != format.magic
            || sealed[4] != format.version
        {
            return Err(ReplyError::NotThisKind);
        }
        if sealed[5] != self.party.as_u8() {
            return Err(ReplyError::OtherParty);
        }
        let (header, ciphertext) = sealed.split_at(HEADER_LEN);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&header[6..]);
        self.cipher
            .decrypt(
                &nonce.into(),
                Payload {
                    msg: ciphertext,
                    aad: &aad(header, &self.session),
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| ReplyError::DoesNotOpen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    const A: ReplyFormat = ReplyFormat {
        magic: b"TSTA",
        version: 1,
        label: b"privmatch test output a",
    };
    const B: ReplyFormat = ReplyFormat {
        magic: b"TSTA",
        version: 1,
        label: b"privmatch test output b",
    };

    #[test]
    fn an_output_opens_for_the_reply_key_only_and_as_its_kind_only() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let party = PartySecretKey::generate(&mut rng);
        let client = PartySecretKey::generate(&mut rng);
        let p1 = PartyIndex::ALL[1];
        let session = [7u8; 16];
        let sealer = ReplySealer::new(A, p1, &party, &client.public_key(), &session);
        let sealed = sealer.seal(b"the result", &mut rng);
        assert_eq!(sealed.len(), A.sealed_len(10));
        assert!(!sealed.windows(10).any(|w| w == b"the result"));
        let open = |f: &ReplyFormat,
                    p: PartyIndex,
                    k: &PartyPublicKey,
                    r: &PartySecretKey,
                    s: &[u8; 16],
                    m: &[u8]| { open_reply(f, p, k, r, s, m) };
        let pk = party.public_key();
        assert_eq!(
            open(&A, p1, &pk, &client, &session, &sealed)
                .unwrap()
                .as_slice(),
            b"the result"
        );
        // Another label (same magic and version): another key, does not open.
        assert_eq!(
            open(&B, p1, &pk, &client, &session, &sealed),
            Err(ReplyError::DoesNotOpen)
        );
        assert_eq!(
            open(&A, PartyIndex::ALL[0], &pk, &client, &session, &sealed),
            Err(ReplyError::OtherParty)
        );
        assert_eq!(
            open(&A, p1, &pk, &client, &[8u8; 16], &sealed),
            Err(ReplyError::DoesNotOpen)
        );
        let other = PartySecretKey::generate(&mut rng);
        assert_eq!(
            open(&A, p1, &pk, &other, &session, &sealed),
            Err(ReplyError::DoesNotOpen)
        );
        assert_eq!(
            open(&A, p1, &other.public_key(), &client, &session, &sealed),
            Err(ReplyError::DoesNotOpen)
        );
        for at in [0, 4, 6, HEADER_LEN, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[at] ^= 1;
            assert!(open(&A, p1, &pk, &client, &session, &bad).is_err(), "{at}");
        }
        assert_eq!(
            open(&A, p1, &pk, &client, &session, &sealed[..20]),
            Err(ReplyError::NotThisKind)
        );
    }
}
