//! Sealing: how secrets travel between privmatch's client, parties and coordinator.
//!
//! The coordinator is untrusted for privacy (docs/trust-model.md): everything secret that passes
//! through it is sealed with a key it does not have.
//!
//! * **Party keys.** Each party owns a long-term X25519 key pair, generated inside the party.
//!   Others pin its public key from configuration ([`PartyPublicKey::fingerprint`] is what
//!   operators compare out of band); a key offered by the coordinator is never trusted.
//! * **Sealed boxes** (client → party), HPKE-style: a fresh ephemeral X25519 key, HKDF-SHA256
//!   over the shared secret (salted with both public keys), ChaCha20-Poly1305 under that
//!   single-use key. The header (recipient index, recipient key fingerprint, ephemeral key)
//!   and a purpose label are authenticated, so a box sealed to P1 cannot be opened by P0, and a
//!   box sealed for one purpose cannot be passed off as another. Sealed boxes are not
//!   replay-protected by themselves: the payloads carry a unique id that the receiving party
//!   records (see [`crate::iris::enroll`]).
//! * **Pairwise channels** (party ↔ party): static-static Diffie-Hellman between the two
//!   parties' long-term keys, expanded with HKDF into one key per direction and one PRF seed;
//!   each session derives its own AES-256-GCM key per direction from them. Messages carry
//!   random 96-bit nonces (so a counter reset after a restart can never repeat a nonce);
//!   session id, round, sequence number, sender and receiver are authenticated and the
//!   receiver insists on the next expected sequence number, so a replayed, reordered,
//!   misrouted or tampered message is rejected.
//! * **Pairwise PRF seeds** give correlated randomness without interaction, e.g. the
//!   zero-sharing r_i = F(k_{i,i+1}) − F(k_{i−1,i}) used to re-randomise additive shares
//!   ([TACEO24] §3.2, ABY3 resharing).

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, XChaCha20Poly1305};
use hkdf::Hkdf;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha12Rng;
use rand_core::{CryptoRng, RngCore};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::party::PartyIndex;

/// Errors of the sealing layer. Messages never contain key material or plaintext.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The bytes are not a privmatch sealed object of the expected kind or version.
    #[error("not a privmatch {0}: bad magic, version or length")]
    Malformed(&'static str),
    /// A sealed box addressed to another party reached this one.
    #[error("sealed box is addressed to {addressed}, but this party is {me}")]
    WrongRecipient {
        /// The party named in the box's header.
        addressed: PartyIndex,
        /// The party that tried to open it.
        me: PartyIndex,
    },
    /// The box was sealed to a different public key than this party's (e.g. a stale or
    /// swapped pinned key).
    #[error("sealed box was sealed to key {sealed_to}, but this party's key is {mine}")]
    WrongKey {
        /// Fingerprint in the box header.
        sealed_to: String,
        /// This party's fingerprint.
        mine: String,
    },
    /// Authentication failed: tampered, truncated, or sealed under another key or purpose.
    #[error("authentication failed: the {0} was tampered with or was not sealed for this recipient and purpose")]
    Tampered(&'static str),
    /// A channel message arrived out of order or twice.
    #[error("channel message out of sequence (expected #{expected}, got #{got}): replayed, dropped or reordered")]
    OutOfSequence {
        /// The sequence number the receiver expected.
        expected: u64,
        /// The sequence number in the message.
        got: u64,
    },
    /// A channel message names another session, round, sender or receiver.
    #[error("channel message belongs to another {0}")]
    Misrouted(&'static str),
    /// A public key in text form could not be parsed.
    #[error("invalid party public key: {0}")]
    BadPublicKey(String),
}

/// The keys a party runs a session with, whatever the modality: its own and its pinned
/// peers'. The engine reads them once per session (a key file moved aside, a peer re-pinned,
/// is seen by the next session).
pub struct PartyKeys {
    /// This party.
    pub me: PartyIndex,
    /// Its long-term secret key.
    pub secret: PartySecretKey,
    /// Pinned public keys by party index (`None` where not pinned; this party's own slot is
    /// ignored).
    pub peers: [Option<PartyPublicKey>; 3],
}

impl SealError {
    /// Whether the box was sealed for another party or to another key than the opener's: a
    /// client's stale pinned keys or a misrouting, not an alteration. Every entry point
    /// refuses it the same way (SQLSTATE 22023), apart from boxes that do not open (22P03).
    pub fn is_for_another_party(&self) -> bool {
        matches!(
            self,
            SealError::WrongRecipient { .. } | SealError::WrongKey { .. }
        )
    }
}

/// Length of a key fingerprint in bytes (hex-encoded for humans: 32 characters).
pub const FINGERPRINT_LEN: usize = 16;

/// A party's long-term X25519 public key, as pinned in configuration.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartyPublicKey([u8; 32]);

impl std::fmt::Debug for PartyPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PartyPublicKey({})", self.to_hex())
    }
}

impl PartyPublicKey {
    /// Wraps 32 raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        PartyPublicKey(bytes)
    }

    /// Parses 64 hex characters.
    pub fn from_hex(text: &str) -> Result<Self, SealError> {
        let bytes = hex::decode(text.trim())
            .map_err(|e| SealError::BadPublicKey(format!("not hex ({e})")))?;
        let array: [u8; 32] = bytes.try_into().map_err(|v: Vec<u8>| {
            SealError::BadPublicKey(format!("expected 32 bytes, got {}", v.len()))
        })?;
        Ok(PartyPublicKey(array))
    }

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex of the key.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// SHA-256 of the key, truncated: what operators compare out of band.
    pub fn fingerprint(&self) -> [u8; FINGERPRINT_LEN] {
        let digest = Sha256::digest(self.0);
        let mut out = [0u8; FINGERPRINT_LEN];
        out.copy_from_slice(&digest[..FINGERPRINT_LEN]);
        out
    }

    /// The fingerprint in hex.
    pub fn fingerprint_hex(&self) -> String {
        hex::encode(self.fingerprint())
    }
}

/// A party's long-term X25519 secret key (or a client's reply key), with its public key
/// computed once: opening a sealed box or a sealed output names the recipient's public key in
/// its key derivation, and a scalar multiplication per use would sit on every search's path.
/// The secret is zeroised on drop; never printed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PartySecretKey {
    secret: [u8; 32],
    #[zeroize(skip)]
    public: PartyPublicKey,
}

impl std::fmt::Debug for PartySecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PartySecretKey(<redacted>)")
    }
}

impl PartySecretKey {
    /// Generates a fresh key from a cryptographic RNG.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut bytes = [0u8; 32];
        rng.fill_bytes(&mut bytes);
        let key = Self::from_bytes(bytes);
        bytes.zeroize();
        key
    }

    /// Restores a key from its 32 stored bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let public = PartyPublicKey(*PublicKey::from(&StaticSecret::from(bytes)).as_bytes());
        PartySecretKey {
            secret: bytes,
            public,
        }
    }

    /// The stored form of the key. Only the party's own storage may hold it.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.secret
    }

    /// The matching public key.
    pub fn public_key(&self) -> PartyPublicKey {
        self.public
    }

    fn diffie_hellman(&self, peer: &PartyPublicKey) -> [u8; 32] {
        StaticSecret::from(self.secret)
            .diffie_hellman(&PublicKey::from(peer.0))
            .to_bytes()
    }
}

const SEALED_BOX_MAGIC: &[u8; 4] = b"PMSB";
const SEALED_BOX_VERSION: u8 = 1;
/// magic, version, recipient index, recipient fingerprint, ephemeral public key.
const SEALED_BOX_HEADER_LEN: usize = 4 + 1 + 1 + FINGERPRINT_LEN + 32;
const AEAD_TAG_LEN: usize = 16;

/// Bytes a sealed box adds to its plaintext.
pub const SEALED_BOX_OVERHEAD: usize = SEALED_BOX_HEADER_LEN + AEAD_TAG_LEN;

fn sealed_box_key(shared: &[u8; 32], header: &[u8], purpose: &str) -> chacha20poly1305::Key {
    let hk = Hkdf::<Sha256>::new(Some(header), shared);
    let mut key = chacha20poly1305::Key::default();
    let info = [b"privmatch sealed box v1/".as_slice(), purpose.as_bytes()].concat();
    // 32 bytes is always a valid HKDF-SHA256 output length.
    hk.expand(&info, &mut key)
        .expect("HKDF-SHA256 can expand 32 bytes");
    key
}

/// Seals `plaintext` to party `recipient` whose pinned public key is `recipient_key`, for the
/// given `purpose` (a fixed label such as `"iris-enrol"`). Only that party can open it.
pub fn seal_to_party<R: RngCore + CryptoRng>(
    recipient: PartyIndex,
    recipient_key: &PartyPublicKey,
    purpose: &str,
    plaintext: &[u8],
    rng: &mut R,
) -> Vec<u8> {
    let ephemeral = PartySecretKey::generate(rng);
    let mut out = Vec::with_capacity(SEALED_BOX_OVERHEAD + plaintext.len());
    out.extend_from_slice(SEALED_BOX_MAGIC);
    out.push(SEALED_BOX_VERSION);
    out.push(recipient.as_u8());
    out.extend_from_slice(&recipient_key.fingerprint());
    out.extend_from_slice(ephemeral.public_key().as_bytes());
    let mut shared = ephemeral.diffie_hellman(recipient_key);
    let key = sealed_box_key(&shared, &out, purpose);
    shared.zeroize();
    let cipher = ChaCha20Poly1305::new(&key);
    // The key is fresh for every box, so the all-zero nonce is used exactly once.
    let nonce = chacha20poly1305::Nonce::default();
    let ciphertext = cipher
        .encrypt(
            &nonce,
            Payload {
                msg: plaintext,
                aad: &out,
            },
        )
        .expect("ChaCha20-Poly1305 encryption of an in-memory buffer cannot fail");
    out.extend_from_slice(&ciphertext);
    out
}

/// The recipient named in a sealed box's header, without opening it (for routing and for
/// clear errors).
pub fn sealed_box_recipient(sealed: &[u8]) -> Result<PartyIndex, SealError> {
    if sealed.len() < SEALED_BOX_OVERHEAD
        || &sealed[..4] != SEALED_BOX_MAGIC
        || sealed[4] != SEALED_BOX_VERSION
    {
        return Err(SealError::Malformed("sealed box"));
    }
    PartyIndex::new(i64::from(sealed[5])).map_err(|_| SealError::Malformed("sealed box"))
}

/// Opens a sealed box as party `me` holding `secret`, for `purpose`. Fails with
/// [`SealError::WrongRecipient`] / [`SealError::WrongKey`] when the box was addressed
/// elsewhere and with [`SealError::Tampered`] when authentication fails.
pub fn open_sealed_box(
    me: PartyIndex,
    secret: &PartySecretKey,
    purpose: &str,
    sealed: &[u8],
) -> Result<Vec<u8>, SealError> {
    let addressed = sealed_box_recipient(sealed)?;
    if addressed != me {
        return Err(SealError::WrongRecipient { addressed, me });
    }
    let my_public = secret.public_key();
    let fingerprint = &sealed[6..6 + FINGERPRINT_LEN];
    if fingerprint != my_public.fingerprint() {
        return Err(SealError::WrongKey {
            sealed_to: hex::encode(fingerprint),
            mine: my_public.fingerprint_hex(),
        });
    }
    let (header, ciphertext) = sealed.split_at(SEALED_BOX_HEADER_LEN);
    let mut ephemeral = [0u8; 32];
    ephemeral.copy_from_slice(&header[6 + FINGERPRINT_LEN..]);
    let mut shared = secret.diffie_hellman(&PartyPublicKey(ephemeral));
    let key = sealed_box_key(&shared, header, purpose);
    shared.zeroize();
    ChaCha20Poly1305::new(&key)
        .decrypt(
            &chacha20poly1305::Nonce::default(),
            Payload {
                msg: ciphertext,
                aad: header,
            },
        )
        .map_err(|_| SealError::Tampered("sealed box"))
}

/// The secrets two parties share, derived from their long-term keys by static-static
/// Diffie-Hellman: one AEAD key per direction and one PRF seed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PairwiseSecrets {
    #[zeroize(skip)]
    me: PartyIndex,
    #[zeroize(skip)]
    peer: PartyIndex,
    send_key: [u8; 32],
    recv_key: [u8; 32],
    prf_seed: [u8; 32],
}

impl std::fmt::Debug for PairwiseSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PairwiseSecrets({} ↔ {}, <redacted>)",
            self.me, self.peer
        )
    }
}

impl PairwiseSecrets {
    /// Derives the secrets `me` shares with `peer`. Both sides derive the same values (with
    /// send and receive keys swapped). Fails if `me == peer`.
    pub fn derive(
        me: PartyIndex,
        my_secret: &PartySecretKey,
        peer: PartyIndex,
        peer_key: &PartyPublicKey,
    ) -> Result<Self, SealError> {
        if me == peer {
            return Err(SealError::Misrouted(
                "party: a party has no channel to itself",
            ));
        }
        let my_key = my_secret.public_key();
        let (low_key, high_key) = if me < peer {
            (my_key, *peer_key)
        } else {
            (*peer_key, my_key)
        };
        let salt = [low_key.as_bytes().as_slice(), high_key.as_bytes()].concat();
        let mut shared = my_secret.diffie_hellman(peer_key);
        let hk = Hkdf::<Sha256>::new(Some(&salt), &shared);
        shared.zeroize();
        let (low, high) = if me < peer { (me, peer) } else { (peer, me) };
        let expand = |label: &str| {
            let mut out = [0u8; 32];
            let info = format!("privmatch pairwise v1/{label}/{low}-{high}");
            hk.expand(info.as_bytes(), &mut out)
                .expect("HKDF-SHA256 can expand 32 bytes");
            out
        };
        let low_to_high = expand("low-to-high");
        let high_to_low = expand("high-to-low");
        let (send_key, recv_key) = if me < peer {
            (low_to_high, high_to_low)
        } else {
            (high_to_low, low_to_high)
        };
        Ok(PairwiseSecrets {
            me,
            peer,
            send_key,
            recv_key,
            prf_seed: expand("prf"),
        })
    }

    /// The pairwise PRF, shared by exactly these two parties.
    pub fn prf(&self) -> PairwisePrf {
        PairwisePrf {
            seed: self.prf_seed,
        }
    }

    /// Opens the channel of one protocol session. `session` must be fresh for every session
    /// (it is authenticated into every message, so messages of one session are rejected in
    /// another).
    pub fn channel(&self, session: [u8; 16]) -> Channel {
        Channel {
            me: self.me,
            peer: self.peer,
            session,
            send: session_key(&self.send_key, &session, self.me, self.peer),
            recv: session_key(&self.recv_key, &session, self.peer, self.me),
            legacy_recv: XChaCha20Poly1305::new(&self.recv_key.into()),
            next_send: 0,
            next_recv: 0,
        }
    }
}

/// Pairwise secrets derived once per process and reused: [`PairwiseSecrets::derive`] costs two
/// X25519 scalar multiplications and depends on long-term keys only, yet a party's services
/// derived it afresh for every session (≈ 0.1 ms each, several per face verification).
/// Entries are keyed by both parties, the peer's public key and a SHA-256 digest of the own
/// secret key, so a rotated or re-pinned key derives anew; at most [`Self::CAPACITY`] are kept
/// (the oldest is dropped first). The secrets are zeroised when an entry is dropped.
pub struct PairwiseCache {
    entries: std::sync::Mutex<std::collections::VecDeque<CachedPair>>,
}

struct CachedPair {
    me: PartyIndex,
    peer: PartyIndex,
    peer_key: PartyPublicKey,
    own_digest: [u8; 32],
    secrets: PairwiseSecrets,
}

impl PairwiseCache {
    /// Pairs kept at most (a party has two peers; rotations add a few).
    pub const CAPACITY: usize = 16;

    /// An empty cache (usable in a `static`).
    pub const fn new() -> Self {
        PairwiseCache {
            entries: std::sync::Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// [`PairwiseSecrets::derive`] for these keys, from the cache when derived before.
    pub fn derive(
        &self,
        me: PartyIndex,
        my_secret: &PartySecretKey,
        peer: PartyIndex,
        peer_key: &PartyPublicKey,
    ) -> Result<PairwiseSecrets, SealError> {
        let mut own = my_secret.to_bytes();
        let own_digest: [u8; 32] = Sha256::digest(own).into();
        own.zeroize();
        let same = |e: &CachedPair| {
            e.me == me && e.peer == peer && e.peer_key == *peer_key && e.own_digest == own_digest
        };
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(hit) = entries.iter().find(|e| same(e)) {
                return Ok(hit.secrets.clone());
            }
        }
        let secrets = PairwiseSecrets::derive(me, my_secret, peer, peer_key)?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if !entries.iter().any(same) {
            if entries.len() >= Self::CAPACITY {
                entries.pop_front();
            }
            entries.push_back(CachedPair {
                me,
                peer,
                peer_key: *peer_key,
                own_digest,
                secrets: secrets.clone(),
            });
        }
        Ok(secrets)
    }
}

impl Default for PairwiseCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Magic of channel messages: AES-256-GCM under a key derived for the session and direction.
const CHANNEL_MAGIC: &[u8; 4] = b"PMC2";
/// Magic of the channel messages of privmatch 0.10 and earlier (XChaCha20-Poly1305 under the
/// long-term direction key). Still opened, never sealed: P0 and P1 keep the dealer's sealed
/// key batches in their tables across an upgrade.
const LEGACY_CHANNEL_MAGIC: &[u8; 4] = b"PMCH";
/// Bytes of magic, sender, receiver, session, round and sequence number (the nonce follows).
const CHANNEL_ROUTING_LEN: usize = 4 + 1 + 1 + 16 + 4 + 8;
/// Header of a channel message: routing fields and the 96-bit nonce.
const CHANNEL_HEADER_LEN: usize = CHANNEL_ROUTING_LEN + NONCE_LEN;
/// Header of a legacy channel message: routing fields and the 192-bit XChaCha nonce.
const LEGACY_CHANNEL_HEADER_LEN: usize = CHANNEL_ROUTING_LEN + 24;

/// The session id a channel message names in its header (authenticated when the message is
/// opened), in either format; `None` for bytes that are not a channel message. Lets a receiver
/// open the channel a stored message belongs to.
pub fn channel_message_session(message: &[u8]) -> Option<[u8; 16]> {
    let magic = message.get(..4)?;
    if magic != CHANNEL_MAGIC && magic != LEGACY_CHANNEL_MAGIC {
        return None;
    }
    message.get(6..22)?.try_into().ok()
}

/// The AES-256-GCM key of one direction of one session: HKDF-SHA256 of the long-term direction
/// key, with the session id, sender and receiver as context. A key per session keeps each key's
/// message count tiny, so random 96-bit nonces never come near GCM's collision bound, and a
/// session id used again (after a restart) still never repeats a (key, nonce) pair but by a
/// 2^-96 chance.
fn session_key(
    direction_key: &[u8; 32],
    session: &[u8; 16],
    from: PartyIndex,
    to: PartyIndex,
) -> LessSafeKey {
    let hk = Hkdf::<Sha256>::new(Some(b"privmatch channel v2"), direction_key);
    let info = [session.as_slice(), &[from.as_u8(), to.as_u8()]].concat();
    let mut key = [0u8; 32];
    hk.expand(&info, &mut key)
        .expect("HKDF-SHA256 can expand 32 bytes");
    let unbound = UnboundKey::new(&AES_256_GCM, &key).expect("an AES-256 key is 32 bytes");
    key.zeroize();
    LessSafeKey::new(unbound)
}

/// An authenticated, encrypted, replay-checked channel between two parties for one session.
///
/// Messages are AES-256-GCM (ring's implementation: AES-NI and carry-less multiplication, with
/// VAES/VPCLMULQDQ where the CPU has them) under per-session direction keys ([`session_key`]),
/// sealed and opened in place. Round messages of an iris search with 31 rotations are tens of
/// MB per party and round; XChaCha20-Poly1305, used before, took about a tenth of the parties'
/// CPU there.
pub struct Channel {
    me: PartyIndex,
    peer: PartyIndex,
    session: [u8; 16],
    send: LessSafeKey,
    recv: LessSafeKey,
    legacy_recv: XChaCha20Poly1305,
    next_send: u64,
    next_recv: u64,
}

impl Channel {
    /// Seals `payload` as this side's next message of `round`: one copy of the payload,
    /// encrypted where it lies.
    pub fn seal<R: RngCore + CryptoRng>(
        &mut self,
        round: u32,
        payload: &[u8],
        rng: &mut R,
    ) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        let mut out = Vec::with_capacity(CHANNEL_HEADER_LEN + payload.len() + AEAD_TAG_LEN);
        out.extend_from_slice(CHANNEL_MAGIC);
        out.push(self.me.as_u8());
        out.push(self.peer.as_u8());
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&round.to_le_bytes());
        out.extend_from_slice(&self.next_send.to_le_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(payload);
        let (header, body) = out.split_at_mut(CHANNEL_HEADER_LEN);
        let tag = self
            .send
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&*header),
                body,
            )
            .expect("AES-256-GCM sealing of an in-memory buffer below 64 GB cannot fail");
        out.extend_from_slice(tag.as_ref());
        self.next_send += 1;
        out
    }

    /// Opens the peer's next message, which must belong to this session and `round`, be
    /// addressed from the peer to this party, and carry the next expected sequence number.
    pub fn open(&mut self, round: u32, message: &[u8]) -> Result<Vec<u8>, SealError> {
        let header_len = match message.get(..4) {
            Some(m) if m == CHANNEL_MAGIC => CHANNEL_HEADER_LEN,
            Some(m) if m == LEGACY_CHANNEL_MAGIC => LEGACY_CHANNEL_HEADER_LEN,
            _ => return Err(SealError::Malformed("channel message")),
        };
        if message.len() < header_len + AEAD_TAG_LEN {
            return Err(SealError::Malformed("channel message"));
        }
        let (header, ciphertext) = message.split_at(header_len);
        self.check_routing(round, header)?;
        let nonce = &header[CHANNEL_ROUTING_LEN..];
        let plaintext = if header_len == CHANNEL_HEADER_LEN {
            let mut nonce_bytes = [0u8; NONCE_LEN];
            nonce_bytes.copy_from_slice(nonce);
            let mut body = ciphertext.to_vec();
            let opened = self
                .recv
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce_bytes),
                    Aad::from(header),
                    &mut body,
                )
                .map_err(|_| SealError::Tampered("channel message"))?
                .len();
            body.truncate(opened);
            body
        } else {
            let mut nonce_bytes = [0u8; 24];
            nonce_bytes.copy_from_slice(nonce);
            self.legacy_recv
                .decrypt(
                    &nonce_bytes.into(),
                    Payload {
                        msg: ciphertext,
                        aad: header,
                    },
                )
                .map_err(|_| SealError::Tampered("channel message"))?
        };
        self.next_recv += 1;
        Ok(plaintext)
    }

    /// Checks sender, receiver, session, round and sequence number of a message's header.
    fn check_routing(&self, round: u32, header: &[u8]) -> Result<(), SealError> {
        if header[4] != self.peer.as_u8() || header[5] != self.me.as_u8() {
            return Err(SealError::Misrouted("sender or receiver"));
        }
        if header[6..22] != self.session {
            return Err(SealError::Misrouted("session"));
        }
        let mut round_bytes = [0u8; 4];
        round_bytes.copy_from_slice(&header[22..26]);
        if u32::from_le_bytes(round_bytes) != round {
            return Err(SealError::Misrouted("round"));
        }
        let mut seq_bytes = [0u8; 8];
        seq_bytes.copy_from_slice(&header[26..34]);
        let seq = u64::from_le_bytes(seq_bytes);
        if seq != self.next_recv {
            return Err(SealError::OutOfSequence {
                expected: self.next_recv,
                got: seq,
            });
        }
        Ok(())
    }
}

/// A PRF keyed by a seed that exactly two parties share. Outputs are ChaCha12 streams keyed
/// by HKDF(seed, context), so distinct contexts give independent streams. ChaCha12 (the
/// round count of `rand`'s `StdRng`) keeps a wide margin over the best known attacks (7
/// rounds) and is 1.7× faster than ChaCha20: the zero-sharings of one search at N = 100,000
/// with 31 rotations draw hundreds of MB of PRF output.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PairwisePrf {
    seed: [u8; 32],
}

impl std::fmt::Debug for PairwisePrf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PairwisePrf(<redacted>)")
    }
}

impl PairwisePrf {
    /// A PRF from an explicit seed (tests and key ceremonies).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        PairwisePrf { seed }
    }

    /// The pseudo-random stream for `context` (e.g. session id ‖ round ‖ purpose).
    pub fn stream(&self, context: &[u8]) -> ChaCha12Rng {
        let hk = Hkdf::<Sha256>::new(Some(b"privmatch prf v1"), &self.seed);
        let mut key = [0u8; 32];
        hk.expand(context, &mut key)
            .expect("HKDF-SHA256 can expand 32 bytes");
        ChaCha12Rng::from_seed(key)
    }

    /// Fills `out` with the PRF's bits for `context` from AES-128 in counter mode
    /// ([`crate::crypto::fss::aes::expand_u32_domain`], VAES or AES-NI where the CPU has them:
    /// 1.8× the ChaCha12 stream on an AVX-512 Xeon) under a key derived by HKDF from the seed
    /// and `context`. Word j of 64 bits is words 2j and 2j+1 of the expander (low, high);
    /// chunks of [`PRF_CHUNK_WORDS`] use the expander's domain as chunk index. For the
    /// single-session zero-sharings of the binary circuits, which draw hundreds of MB per
    /// search; a function independent of [`PairwisePrf::stream`] (another HKDF salt).
    pub fn fill_words(&self, context: &[u8], out: &mut [u64]) {
        self.words(context, out, |w, r| *w = r);
    }

    /// XORs the words [`PairwisePrf::fill_words`] would write into `out`.
    pub fn xor_words(&self, context: &[u8], out: &mut [u64]) {
        self.words(context, out, |w, r| *w ^= r);
    }

    fn words(&self, context: &[u8], out: &mut [u64], apply: impl Fn(&mut u64, u64)) {
        let hk = Hkdf::<Sha256>::new(Some(b"privmatch prf aes v1"), &self.seed);
        let mut key = [0u8; 16];
        hk.expand(context, &mut key)
            .expect("HKDF-SHA256 can expand 16 bytes");
        let mut halves = [0u32; 2 * PRF_CHUNK_WORDS];
        for (domain, chunk) in out.chunks_mut(PRF_CHUNK_WORDS).enumerate() {
            let halves = &mut halves[..2 * chunk.len()];
            crate::crypto::fss::aes::expand_u32_domain(&key, domain as u64, halves);
            for (w, pair) in chunk.iter_mut().zip(halves.chunks_exact(2)) {
                apply(w, u64::from(pair[0]) | (u64::from(pair[1]) << 32));
            }
        }
        halves.zeroize();
        key.zeroize();
    }
}

/// 64-bit words per expander call of [`PairwisePrf::fill_words`] (16 KB of stack).
pub const PRF_CHUNK_WORDS: usize = 2048;

/// Fills `out` with this party's share of a 3-party additive sharing of zero over Z_2^16:
/// r_i = F(k_{i,i+1}) − F(k_{i−1,i}), so r_0 + r_1 + r_2 = 0 (ABY3 re-randomisation, seed
/// 002 §2). `with_next` is the PRF shared with party i+1, `with_prev` the one shared with i−1.
pub fn zero_share_u16(
    with_next: &PairwisePrf,
    with_prev: &PairwisePrf,
    context: &[u8],
    out: &mut [u16],
) {
    let mut mine = with_next.stream(context);
    let mut theirs = with_prev.stream(context);
    for value in out.iter_mut() {
        *value = (mine.next_u32() as u16).wrapping_sub(theirs.next_u32() as u16);
    }
}

/// As [`zero_share_u16`], over Z_2^32.
pub fn zero_share_u32(
    with_next: &PairwisePrf,
    with_prev: &PairwisePrf,
    context: &[u8],
    out: &mut [u32],
) {
    let mut mine = with_next.stream(context);
    let mut theirs = with_prev.stream(context);
    for value in out.iter_mut() {
        *value = mine.next_u32().wrapping_sub(theirs.next_u32());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;

    fn rng() -> ChaCha20Rng {
        ChaCha20Rng::seed_from_u64(7)
    }

    fn keys(rng: &mut ChaCha20Rng) -> Vec<PartySecretKey> {
        (0..3).map(|_| PartySecretKey::generate(rng)).collect()
    }

    fn p(i: i64) -> PartyIndex {
        PartyIndex::ALL[i as usize]
    }

    #[test]
    fn sealed_box_round_trip() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let sealed = seal_to_party(p(1), &ks[1].public_key(), "test", b"secret share", &mut rng);
        assert_eq!(sealed.len(), b"secret share".len() + SEALED_BOX_OVERHEAD);
        assert_eq!(
            open_sealed_box(p(1), &ks[1], "test", &sealed).as_deref(),
            Ok(b"secret share".as_slice())
        );
    }

    #[test]
    fn sealed_box_to_p1_rejected_by_p0() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let sealed = seal_to_party(p(1), &ks[1].public_key(), "test", b"x", &mut rng);
        assert_eq!(
            open_sealed_box(p(0), &ks[0], "test", &sealed),
            Err(SealError::WrongRecipient {
                addressed: p(1),
                me: p(0)
            })
        );
    }

    #[test]
    fn relabelled_box_fails_authentication_or_key_check() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let mut sealed = seal_to_party(p(1), &ks[1].public_key(), "test", b"x", &mut rng);
        sealed[5] = 0; // a coordinator re-addressing the box to P0
        assert!(matches!(
            open_sealed_box(p(0), &ks[0], "test", &sealed),
            Err(SealError::WrongKey { .. })
        ));
    }

    #[test]
    fn sealed_box_to_swapped_key_is_refused() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let attacker = PartySecretKey::generate(&mut rng);
        let sealed = seal_to_party(p(0), &attacker.public_key(), "test", b"x", &mut rng);
        assert!(matches!(
            open_sealed_box(p(0), &ks[0], "test", &sealed),
            Err(SealError::WrongKey { .. })
        ));
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let sealed = seal_to_party(p(2), &ks[2].public_key(), "test", b"payload", &mut rng);
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x04;
            assert!(
                open_sealed_box(p(2), &ks[2], "test", &bad).is_err(),
                "byte {i}"
            );
        }
        assert!(open_sealed_box(p(2), &ks[2], "test", &sealed[..sealed.len() - 1]).is_err());
        assert_eq!(
            open_sealed_box(p(2), &ks[2], "other purpose", &sealed),
            Err(SealError::Tampered("sealed box"))
        );
    }

    #[test]
    fn pairwise_secrets_agree() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let a = PairwiseSecrets::derive(p(0), &ks[0], p(2), &ks[2].public_key()).expect("derive");
        let b = PairwiseSecrets::derive(p(2), &ks[2], p(0), &ks[0].public_key()).expect("derive");
        assert_eq!(a.send_key, b.recv_key);
        assert_eq!(a.recv_key, b.send_key);
        assert_ne!(a.send_key, a.recv_key);
        assert_eq!(a.prf_seed, b.prf_seed);
        assert!(PairwiseSecrets::derive(p(1), &ks[1], p(1), &ks[1].public_key()).is_err());
    }

    #[test]
    fn the_cache_gives_the_derived_secrets_and_derives_anew_for_other_keys() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let cache = PairwiseCache::new();
        let same = |a: &PairwiseSecrets, b: &PairwiseSecrets| {
            a.send_key == b.send_key && a.recv_key == b.recv_key && a.prf_seed == b.prf_seed
        };
        let direct = PairwiseSecrets::derive(p(0), &ks[0], p(1), &ks[1].public_key()).unwrap();
        for _ in 0..2 {
            let cached = cache
                .derive(p(0), &ks[0], p(1), &ks[1].public_key())
                .unwrap();
            assert!(same(&cached, &direct));
        }
        // Another own key, another peer key or another peer: another entry, right secrets.
        let rotated = PartySecretKey::generate(&mut rng);
        let fresh = cache
            .derive(p(0), &rotated, p(1), &ks[1].public_key())
            .unwrap();
        let expect = PairwiseSecrets::derive(p(0), &rotated, p(1), &ks[1].public_key()).unwrap();
        assert!(same(&fresh, &expect) && !same(&fresh, &direct));
        let repinned = PartySecretKey::generate(&mut rng).public_key();
        let fresh = cache.derive(p(0), &ks[0], p(1), &repinned).unwrap();
        assert!(!same(&fresh, &direct));
        let to_p2 = cache
            .derive(p(0), &ks[0], p(2), &ks[2].public_key())
            .unwrap();
        let expect = PairwiseSecrets::derive(p(0), &ks[0], p(2), &ks[2].public_key()).unwrap();
        assert!(same(&to_p2, &expect));
        assert!(cache
            .derive(p(1), &ks[1], p(1), &ks[1].public_key())
            .is_err());
        // Bounded: the oldest entries go first, answers stay right.
        for _ in 0..PairwiseCache::CAPACITY + 3 {
            let k = PartySecretKey::generate(&mut rng);
            cache.derive(p(0), &k, p(1), &ks[1].public_key()).unwrap();
        }
        let entries = cache.entries.lock().unwrap().len();
        assert_eq!(entries, PairwiseCache::CAPACITY);
        let again = cache
            .derive(p(0), &ks[0], p(1), &ks[1].public_key())
            .unwrap();
        assert!(same(&again, &direct));
    }

    fn channel_pair(rng: &mut ChaCha20Rng, session: [u8; 16]) -> (Channel, Channel) {
        let ks = keys(rng);
        let a = PairwiseSecrets::derive(p(0), &ks[0], p(1), &ks[1].public_key()).expect("derive");
        let b = PairwiseSecrets::derive(p(1), &ks[1], p(0), &ks[0].public_key()).expect("derive");
        (a.channel(session), b.channel(session))
    }

    #[test]
    fn channel_delivers_in_order_and_rejects_replay() {
        let mut rng = rng();
        let (mut a, mut b) = channel_pair(&mut rng, [9; 16]);
        let m0 = a.seal(1, b"first", &mut rng);
        let m1 = a.seal(1, b"second", &mut rng);
        assert_eq!(b.open(1, &m0).as_deref(), Ok(b"first".as_slice()));
        assert_eq!(
            b.open(1, &m0),
            Err(SealError::OutOfSequence {
                expected: 1,
                got: 0
            })
        );
        assert_eq!(b.open(1, &m1).as_deref(), Ok(b"second".as_slice()));
        let back = b.seal(2, b"reply", &mut rng);
        assert_eq!(a.open(2, &back).as_deref(), Ok(b"reply".as_slice()));
    }

    #[test]
    fn channel_rejects_wrong_round_session_direction_and_tamper() {
        let mut rng = rng();
        let (mut a, mut b) = channel_pair(&mut rng, [1; 16]);
        let m = a.seal(3, b"data", &mut rng);
        assert_eq!(b.open(4, &m), Err(SealError::Misrouted("round")));
        assert_eq!(
            a.open(3, &m),
            Err(SealError::Misrouted("sender or receiver"))
        );
        let mut other_session = m.clone();
        other_session[6] ^= 1;
        assert_eq!(
            b.open(3, &other_session),
            Err(SealError::Misrouted("session"))
        );
        let mut tampered = m.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert_eq!(
            b.open(3, &tampered),
            Err(SealError::Tampered("channel message"))
        );
        assert_eq!(b.open(3, &m).as_deref(), Ok(b"data".as_slice()));
    }

    /// A channel message as privmatch 0.10 sealed it: XChaCha20-Poly1305 under the long-term
    /// direction key, 24-byte nonce.
    fn legacy_seal(
        secrets: &PairwiseSecrets,
        session: [u8; 16],
        round: u32,
        seq: u64,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut out = LEGACY_CHANNEL_MAGIC.to_vec();
        out.extend_from_slice(&[secrets.me.as_u8(), secrets.peer.as_u8()]);
        out.extend_from_slice(&session);
        out.extend_from_slice(&round.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        let nonce = [7u8; 24];
        out.extend_from_slice(&nonce);
        let ciphertext = XChaCha20Poly1305::new(&secrets.send_key.into())
            .encrypt(
                &nonce.into(),
                Payload {
                    msg: payload,
                    aad: &out,
                },
            )
            .unwrap();
        out.extend_from_slice(&ciphertext);
        out
    }

    #[test]
    fn channel_opens_messages_sealed_by_privmatch_0_10() {
        let mut rng = rng();
        let ks = keys(&mut rng);
        let a = PairwiseSecrets::derive(p(0), &ks[0], p(1), &ks[1].public_key()).unwrap();
        let b = PairwiseSecrets::derive(p(1), &ks[1], p(0), &ks[0].public_key()).unwrap();
        let mut from_a = b.channel([5; 16]);
        let old = legacy_seal(&a, [5; 16], 0, 0, b"stored batch");
        let new = a.channel([5; 16]).seal(0, b"x", &mut rng);
        assert_eq!(&new[..4], CHANNEL_MAGIC);
        assert_eq!(channel_message_session(&old), Some([5; 16]));
        assert_eq!(channel_message_session(&new), Some([5; 16]));
        assert_eq!(channel_message_session(b"PMXX\0\x01"), None);
        assert_eq!(channel_message_session(&new[..10]), None);
        assert_eq!(
            from_a.open(0, &old).as_deref(),
            Ok(b"stored batch".as_slice())
        );
        // Sequence numbers run on across both formats; a tampered legacy message is refused.
        let mut second = legacy_seal(&a, [5; 16], 0, 1, b"more");
        let last = second.len() - 1;
        second[last] ^= 1;
        assert_eq!(
            from_a.open(0, &second),
            Err(SealError::Tampered("channel message"))
        );
    }

    #[test]
    fn channel_keys_are_per_session() {
        // Two channels of the same pair (same keys: same seed), sessions 1 and 2.
        let (mut a, mut b) = channel_pair(&mut ChaCha20Rng::seed_from_u64(0x5ea1), [1; 16]);
        let (_, mut b_other) = channel_pair(&mut ChaCha20Rng::seed_from_u64(0x5ea1), [2; 16]);
        let mut rng = rng();
        let m = a.seal(0, b"data", &mut rng);
        // Header rewritten to session 2: the routing checks pass, the session key does not.
        let mut moved = m.clone();
        moved[6..22].copy_from_slice(&[2; 16]);
        assert_eq!(
            b_other.open(0, &moved),
            Err(SealError::Tampered("channel message"))
        );
        assert_eq!(b.open(0, &m).as_deref(), Ok(b"data".as_slice()));
        // Two seals of the same payload differ (fresh nonces).
        let again = a.seal(0, b"data", &mut rng);
        assert_ne!(again[CHANNEL_ROUTING_LEN..], m[CHANNEL_ROUTING_LEN..]);
    }

    #[test]
    fn prf_words_are_a_function_of_seed_and_context_across_chunks() {
        let prf = PairwisePrf::from_seed([4; 32]);
        let n = 2 * PRF_CHUNK_WORDS + 5;
        let mut long = vec![0u64; n];
        prf.fill_words(b"ctx", &mut long);
        let mut short = vec![0u64; PRF_CHUNK_WORDS + 3];
        prf.fill_words(b"ctx", &mut short);
        assert_eq!(short[..], long[..short.len()]);
        // XOR of the same words cancels; another context or seed gives other words.
        let mut x = long.clone();
        prf.xor_words(b"ctx", &mut x);
        assert!(x.iter().all(|&w| w == 0));
        let mut other = vec![0u64; n];
        prf.fill_words(b"ctx2", &mut other);
        assert_ne!(other, long);
        PairwisePrf::from_seed([5; 32]).fill_words(b"ctx", &mut other);
        assert_ne!(other, long);
        // Not trivially structured: chunks differ, words use both halves.
        assert_ne!(long[..8], long[PRF_CHUNK_WORDS..PRF_CHUNK_WORDS + 8]);
        assert!(
            long.iter()
                .filter(|&&w| w >> 32 != 0 && w as u32 != 0)
                .count()
                > n - 4
        );
    }

    #[test]
    fn zero_shares_sum_to_zero() {
        let prf01 = PairwisePrf::from_seed([1; 32]);
        let prf12 = PairwisePrf::from_seed([2; 32]);
        let prf20 = PairwisePrf::from_seed([3; 32]);
        let n = 1000;
        let (mut r0, mut r1, mut r2) = (vec![0u16; n], vec![0u16; n], vec![0u16; n]);
        zero_share_u16(&prf01, &prf20, b"ctx", &mut r0);
        zero_share_u16(&prf12, &prf01, b"ctx", &mut r1);
        zero_share_u16(&prf20, &prf12, b"ctx", &mut r2);
        for i in 0..n {
            assert_eq!(r0[i].wrapping_add(r1[i]).wrapping_add(r2[i]), 0);
        }
        assert!(
            r0.iter().filter(|&&v| v != 0).count() > n / 2,
            "shares are not trivial"
        );
        let mut w = vec![0u32; n];
        let (mut w1, mut w2) = (vec![0u32; n], vec![0u32; n]);
        zero_share_u32(&prf01, &prf20, b"ctx32", &mut w);
        zero_share_u32(&prf12, &prf01, b"ctx32", &mut w1);
        zero_share_u32(&prf20, &prf12, b"ctx32", &mut w2);
        for i in 0..n {
            assert_eq!(w[i].wrapping_add(w1[i]).wrapping_add(w2[i]), 0);
        }
    }

    #[test]
    fn fingerprint_and_hex_round_trip() {
        let mut rng = rng();
        let key = PartySecretKey::generate(&mut rng).public_key();
        assert_eq!(PartyPublicKey::from_hex(&key.to_hex()), Ok(key));
        assert_eq!(key.fingerprint_hex().len(), 2 * FINGERPRINT_LEN);
        assert!(PartyPublicKey::from_hex("abcd").is_err());
        assert!(PartyPublicKey::from_hex("zz").is_err());
        assert!(!format!("{:?}", PartySecretKey::from_bytes([5; 32])).contains('5'));
    }
}
