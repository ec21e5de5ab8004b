//! # The terminal's inputs, sealed to the service provider ([ABMR20] Round 2)
//!
//! Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint 2020/1363.
//! The paper lets the service provider SP and the terminal T collude (both semi-honest), so in
//! privmatch the SP performs T's homomorphic work of Round 2 (Fig. 3 Round 2 for Π1, §6.1
//! Round 2 for Π2, Fig. 5 Round 2 for Π3) on the record it stores. T's live capture w and its
//! acceptance threshold travel to the SP in a sealed box ([`crate::crypto::seal`]) addressed to
//! the SP party's pinned X25519 key, so the coordinator that relays it learns neither.
//!
//! Plaintext of the box (all integers big endian, strict decoding):
//!
//! ```text
//! "PMTI" | version (1) = 2 | protocol code (1) | session (16)
//!        | device id length (1) | device id | threshold (8, signed)
//!        | reply key (32) | count (2) | w (count × 4, signed)
//! ```
//!
//! The reply key (version 2, 0.12.0) is an X25519 public key the terminal draws for the
//! session: the session's outcome comes back sealed to it (`sealed.rs`), from the SP in Π2 and
//! Π3 and from the device in Π1 (the SP signs the key into Round 2), so the coordinator relays
//! ciphertext only. Inside this box the coordinator can neither read nor swap it. A version 1
//! input (no reply key) is refused.
//!
//! The box's purpose label is [`TERMINAL_INPUT_PURPOSE`]; the device id and protocol inside
//! are checked by the SP against the record it uses, so a box made for one device or protocol
//! cannot be spent on another.

use rand_core::{CryptoRng, RngCore};

use super::messages::MatchError;
use super::params::Protocol;
use super::record::check_device_id;
use crate::crypto::seal::{open_sealed_box, seal_to_party, PartyPublicKey, PartySecretKey};
use crate::party::PartyIndex;

/// The sealed-box purpose label of a terminal input.
pub const TERMINAL_INPUT_PURPOSE: &str = "paillier-terminal-input";
const MAGIC: &[u8; 4] = b"PMTI";
const VERSION: u8 = 2;
const MESSAGE: &str = "terminal input";

/// What T hands the SP for Round 2 of [ABMR20] (Fig. 3 for Π1, §6.1 for Π2, Fig. 5 for Π3):
/// which device and protocol, T's session id, its threshold and its measurement w.
#[derive(Clone, PartialEq, Eq)]
pub struct TerminalInput {
    /// The protocol (Π1, Π2, Π3) the session runs.
    pub protocol: Protocol,
    /// T's session id (echoed back; binds the box to one session).
    pub session: [u8; 16],
    /// The enrolled device whose record is matched.
    pub device_id: String,
    /// T's acceptance threshold on ⟨u, w⟩.
    pub threshold: i64,
    /// T's reply key for this session (X25519 public key; `sealed.rs`).
    pub reply_key: [u8; 32],
    /// T's quantised live capture w.
    pub w: Vec<i32>,
}

impl std::fmt::Debug for TerminalInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // w and the threshold are T's secrets.
        f.debug_struct("TerminalInput")
            .field("protocol", &self.protocol)
            .field("device_id", &self.device_id)
            .finish_non_exhaustive()
    }
}

fn wire(reason: impl Into<String>) -> MatchError {
    MatchError::Wire {
        message: MESSAGE,
        reason: reason.into(),
    }
}

impl TerminalInput {
    /// The canonical plaintext (see the module documentation).
    pub fn to_bytes(&self) -> Result<Vec<u8>, MatchError> {
        check_device_id(&self.device_id).map_err(|e| MatchError::Argument {
            argument: "device_id",
            reason: e.to_string(),
        })?;
        let count = u16::try_from(self.w.len()).map_err(|_| MatchError::Argument {
            argument: "w",
            reason: format!("{} elements; at most 65535", self.w.len()),
        })?;
        let mut out = Vec::with_capacity(72 + self.device_id.len() + 4 * self.w.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.protocol.code());
        out.extend_from_slice(&self.session);
        out.push(self.device_id.len() as u8);
        out.extend_from_slice(self.device_id.as_bytes());
        out.extend_from_slice(&self.threshold.to_be_bytes());
        out.extend_from_slice(&self.reply_key);
        out.extend_from_slice(&count.to_be_bytes());
        for x in &self.w {
            out.extend_from_slice(&x.to_be_bytes());
        }
        Ok(out)
    }

    /// Strict decoding of [`Self::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MatchError> {
        let mut at = 0usize;
        let mut take = |len: usize, what: &str| -> Result<&[u8], MatchError> {
            let end = at
                .checked_add(len)
                .filter(|&e| e <= bytes.len())
                .ok_or_else(|| wire(format!("truncated in {what}")))?;
            let out = &bytes[at..end];
            at = end;
            Ok(out)
        };
        if take(4, "magic")? != MAGIC {
            return Err(wire("wrong magic"));
        }
        let version = take(1, "version")?[0];
        if version != VERSION {
            return Err(wire(format!("version {version}; expected {VERSION}")));
        }
        let protocol = Protocol::from_code(take(1, "protocol")?[0])?;
        let mut session = [0u8; 16];
        session.copy_from_slice(take(16, "session")?);
        let id_len = usize::from(take(1, "device id length")?[0]);
        let device_id = std::str::from_utf8(take(id_len, "device id")?)
            .map_err(|_| wire("device id is not UTF-8"))?
            .to_owned();
        check_device_id(&device_id).map_err(|e| wire(e.to_string()))?;
        let mut threshold = [0u8; 8];
        threshold.copy_from_slice(take(8, "threshold")?);
        let mut reply_key = [0u8; 32];
        reply_key.copy_from_slice(take(32, "reply key")?);
        let count = take(2, "count")?;
        let count = usize::from(u16::from_be_bytes([count[0], count[1]]));
        let raw = take(4 * count, "w")?;
        let w = raw
            .chunks_exact(4)
            .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if at != bytes.len() {
            return Err(wire(format!("{} trailing bytes", bytes.len() - at)));
        }
        Ok(Self {
            protocol,
            session,
            device_id,
            threshold: i64::from_be_bytes(threshold),
            reply_key,
            w,
        })
    }

    /// Seals the input to the SP, party `sp` with pinned key `sp_key` (T's side).
    pub fn seal<R: RngCore + CryptoRng>(
        &self,
        sp: PartyIndex,
        sp_key: &PartyPublicKey,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        let plain = zeroize::Zeroizing::new(self.to_bytes()?);
        Ok(seal_to_party(
            sp,
            sp_key,
            TERMINAL_INPUT_PURPOSE,
            &plain,
            rng,
        ))
    }

    /// Opens a sealed input as the SP, party `me` holding `secret`.
    pub fn open(
        me: PartyIndex,
        secret: &PartySecretKey,
        sealed: &[u8],
    ) -> Result<Self, MatchError> {
        let plain = open_sealed_box(me, secret, TERMINAL_INPUT_PURPOSE, sealed)
            .map_err(|e| wire(e.to_string()))?;
        let plain = zeroize::Zeroizing::new(plain);
        Self::from_bytes(&plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn input() -> TerminalInput {
        TerminalInput {
            protocol: Protocol::Pi1,
            session: [7u8; 16],
            device_id: "phone-1".into(),
            threshold: -12,
            reply_key: [6u8; 32],
            w: vec![1, -2, 3, i32::MIN, i32::MAX],
        }
    }

    #[test]
    fn sealed_inputs_round_trip_only_for_their_recipient() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let sp = PartySecretKey::generate(&mut rng);
        let other = PartySecretKey::generate(&mut rng);
        let p0 = PartyIndex::ALL[0];
        let sealed = input().seal(p0, &sp.public_key(), &mut rng).unwrap();
        assert!(TerminalInput::open(p0, &sp, &sealed).unwrap() == input());
        assert!(TerminalInput::open(p0, &other, &sealed).is_err());
        assert!(TerminalInput::open(PartyIndex::ALL[1], &sp, &sealed).is_err());
        let mut bad = sealed.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(TerminalInput::open(p0, &sp, &bad).is_err());
    }

    #[test]
    fn malformed_plaintexts_are_refused() {
        let bytes = input().to_bytes().unwrap();
        for len in 0..bytes.len() {
            assert!(TerminalInput::from_bytes(&bytes[..len]).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(TerminalInput::from_bytes(&long).is_err());
        let mut bad = bytes.clone();
        bad[5] = 9;
        assert!(TerminalInput::from_bytes(&bad).is_err());
        let mut bad_id = input();
        bad_id.device_id = "has space".into();
        assert!(bad_id.to_bytes().is_err());
    }
}
