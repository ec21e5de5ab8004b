//! # Wire format and errors shared by the matching protocols of [ABMR20]
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363.
//!
//! Every message starts with the wire version ([`WIRE_VERSION`]) and a kind byte
//! ([`MessageKind`]); integers are big-endian; public keys and ciphertexts have the fixed
//! lengths of the key (`PublicKey::modulus_bytes`, `PublicKey::ciphertext_bytes`). Decoding is
//! strict and never panics: a wrong version or kind, a length that does not match the agreed
//! parameters, a count other than t, a ciphertext that is not in Z_{N²}^*, a non-canonical
//! integer or trailing bytes are all errors. The receiver always decodes against the
//! [`Params`] it expects (it does not take the sender's word for them).

use super::cipher::{Ciphertext, PaillierError, PublicKey};
use super::encoding::EncodingError;
use super::params::{Params, ParamsError, Protocol};
use rug::integer::Order;
use rug::Integer;
use sha2::{Digest, Sha256};

/// The version byte every message starts with.
pub const WIRE_VERSION: u8 = 1;

/// Domain separation of [`template_signing_bytes`].
const SIGNING_DOMAIN: &[u8] = b"privmatch/paillier/signed-template/v1";

/// Domain of the check value that ends a suspended terminal state ([`end_state`]).
const STATE_CHECK_DOMAIN: &[u8] = b"privmatch/paillier/terminal-state/v1";

/// Bytes of the check value at the end of a suspended terminal state.
pub const STATE_CHECK_BYTES: usize = 16;

/// Room for any suspended terminal state, allocated once so that the secret bytes are never
/// left behind in a reallocated buffer (the largest, Π3 after Round 2, is under 160 bytes).
const STATE_CAPACITY: usize = 256;

/// The largest accepted signature (bytes), whatever the service provider's scheme.
pub const MAX_SIGNATURE_BYTES: usize = 4096;

/// The kind byte of each message ([ABMR20] Fig. 3 for Π1, §6.1 for Π2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    /// Π1 Round 1, D → T: (epk, {⟦u_c*⟧}).
    Pi1Template = 0x11,
    /// Π1 Round 2, T → D: ⟦Mask(z + ρ)⟧.
    Pi1Masked = 0x12,
    /// Π1 Round 3, D → T: the match bit.
    Pi1Outcome = 0x13,
    /// Π2 Round 1, D → T: (σ, epk, {⟦u_c*⟧}).
    Pi2Template = 0x21,
    /// Π2 Round 2, T → D: ⟦Mask(a·z + Encode2(b) + ρ)⟧.
    Pi2Masked = 0x22,
    /// Π2 Round 3, D → T: X, the sum of the decoded slots.
    Pi2Decoded = 0x23,
    /// Π2 Round 4, T → D: the match bit.
    Pi2Outcome = 0x24,
    /// Π3 Round 2, T → D: ⟦X̃⟧, ⟦Ỹ⟧ (Π3's Round 1 is Π2's).
    Pi3Masked = 0x32,
    /// Π3 Round 3, D → T: the OT receiver's message for the bits of X and Y.
    /// (0x33–0x35 were Rounds 3–5 of the circuit over exact integers, whose device inputs
    /// were twice as wide; a device or terminal of that version is refused by kind.)
    Pi3OtRequest = 0x36,
    /// Π3 Round 4, T → D: the garbled circuit, the labels of pad, a, c, the OT sender's
    /// message and the public output decoding.
    Pi3Garbled = 0x37,
    /// Π3 Round 5, D → T: the output labels.
    Pi3OutputLabels = 0x38,
    /// Not a message: the Π2 terminal's state between its Round 2 and Round 4 (threshold,
    /// a, b), kept by whoever runs the terminal between the rounds (`Pi2Terminal::suspend`).
    Pi2TerminalState = 0x2a,
    /// Not a message: the Π3 terminal's state between its Round 2 and Round 4 (threshold, a,
    /// b, pad, OT session id; `Pi3Terminal::suspend`).
    Pi3TerminalAfterRound2 = 0x3a,
    /// Not a message: the Π3 terminal's state between its Round 4 and the output (the two
    /// labels of each output wire; `Pi3Terminal::suspend`).
    Pi3TerminalAfterRound4 = 0x3b,
    /// The service provider's signed envelope around any Round 2 (`signed_round2.rs`).
    SignedRound2 = 0x50,
    /// The service provider's signed envelope around a Π2/Π3 Round 4 (`signed_round2.rs`).
    SignedRound4 = 0x51,
    /// What a device posts for Round 3 of Π2/Π3: its reply key and the Round 3 (`sealed.rs`).
    DeviceReply = 0x52,
}

/// Everything that can go wrong in a matching session (input, wire, or protocol).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    /// A message that does not decode (names the message and what is wrong).
    #[error("{message}: {reason}")]
    Wire {
        /// The message.
        message: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An argument out of range (names the argument).
    #[error("{argument}: {reason}")]
    Argument {
        /// The argument.
        argument: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A call out of the protocol's order.
    #[error("out of order: {0}")]
    State(String),
    /// The service provider's signature on the template does not verify ([ABMR20] §6.1
    /// Round 2 step 1: output ⊥).
    #[error("the service provider's signature on the encrypted template does not verify")]
    Signature,
    /// The device's answer is inconsistent with the terminal's a and b ([ABMR20] §6.1
    /// Round 4: output ⊥).
    #[error("the device cheated: {0}")]
    Cheating(String),
    /// A Round 2 that is not one the pinned service provider signed for this device, protocol
    /// and session (or has expired): the device decrypts nothing and answers nothing.
    #[error("Round 2 refused: {0}")]
    Unsigned(String),
    /// A Round 4 that is not one the pinned service provider signed for this device, protocol,
    /// session and the device's own Round 3: the device uses nothing of it.
    #[error("Round 4 refused: {0}")]
    UnsignedRound4(String),
    /// A decrypted value outside what an honest Round 2 can produce (the device refuses to
    /// answer; names the value, never its content).
    #[error("Round 2 refused: the decrypted {0} is outside the range an honest service provider produces")]
    OutOfRange(&'static str),
    /// The garbled circuit or the oblivious transfer of Π3 refused an input (names what).
    #[error("Π3 {0}")]
    Garbled(String),
    /// Parameters.
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// Packing.
    #[error(transparent)]
    Encoding(#[from] EncodingError),
    /// Paillier.
    #[error(transparent)]
    Paillier(#[from] PaillierError),
}

/// A strict reader over one message.
pub struct Reader<'a> {
    message: &'static str,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader for `bytes`, which must start with [`WIRE_VERSION`] and `kind`.
    pub fn new(
        message: &'static str,
        bytes: &'a [u8],
        kind: MessageKind,
    ) -> Result<Self, MatchError> {
        let mut r = Self {
            message,
            bytes,
            pos: 0,
        };
        let version = r.u8("version")?;
        if version != WIRE_VERSION {
            return Err(r.error(format!("version {version}, expected {WIRE_VERSION}")));
        }
        let found = r.u8("kind")?;
        if found != kind as u8 {
            return Err(r.error(format!(
                "kind 0x{found:02x}, expected 0x{:02x} ({kind:?})",
                kind as u8
            )));
        }
        Ok(r)
    }

    /// A wire error naming this message.
    pub fn error(&self, reason: impl Into<String>) -> MatchError {
        MatchError::Wire {
            message: self.message,
            reason: reason.into(),
        }
    }

    /// The next `len` bytes.
    pub fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], MatchError> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| {
                self.error(format!(
                    "truncated in {what}: {len} bytes needed, {} left",
                    self.bytes.len() - self.pos
                ))
            })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// One byte.
    pub fn u8(&mut self, what: &str) -> Result<u8, MatchError> {
        Ok(self.take(1, what)?[0])
    }

    /// A big-endian u16.
    pub fn u16(&mut self, what: &str) -> Result<u16, MatchError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A big-endian u32.
    pub fn u32(&mut self, what: &str) -> Result<u32, MatchError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A bit encoded as one byte 0 or 1.
    pub fn bit(&mut self, what: &str) -> Result<bool, MatchError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.error(format!("{what}: byte {other} is not a bit"))),
        }
    }

    /// A ciphertext of `pk` (fixed length, checked to be in Z_{N²}^*).
    pub fn ciphertext(&mut self, pk: &PublicKey, what: &str) -> Result<Ciphertext, MatchError> {
        let bytes = self.take(pk.ciphertext_bytes(), what)?;
        pk.ciphertext_from_bytes(bytes)
            .map_err(|e| self.error(format!("{what}: {e}")))
    }

    /// A signed integer as written by [`put_signed`], at most `max_bytes` of magnitude.
    pub fn signed(&mut self, max_bytes: usize, what: &str) -> Result<Integer, MatchError> {
        let sign = self.u8(what)?;
        let len = usize::from(self.u16(what)?);
        if len > max_bytes {
            return Err(self.error(format!("{what}: {len} bytes, at most {max_bytes}")));
        }
        let magnitude = self.take(len, what)?;
        if magnitude.first() == Some(&0) {
            return Err(self.error(format!("{what}: leading zero byte")));
        }
        let x = Integer::from_digits(magnitude, Order::Msf);
        match sign {
            0 => Ok(x),
            1 if x != 0 => Ok(-x),
            1 => Err(self.error(format!("{what}: negative zero"))),
            other => Err(self.error(format!("{what}: sign byte {other}"))),
        }
    }

    /// A non-negative integer as written by [`put_signed`] in [`low`, `high`) (else an error
    /// naming `what`); its magnitude may have at most as many bytes as `high`.
    pub fn bounded(
        &mut self,
        low: &Integer,
        high: &Integer,
        what: &str,
    ) -> Result<Integer, MatchError> {
        let max_bytes = high.significant_bits().div_ceil(8) as usize;
        let x = self.signed(max_bytes, what)?;
        if x < *low || x >= *high {
            return Err(self.error(format!("{what} is outside its range")));
        }
        Ok(x)
    }

    /// Succeeds only if every byte was read.
    pub fn finish(self) -> Result<(), MatchError> {
        if self.pos != self.bytes.len() {
            return Err(self.error(format!("{} trailing bytes", self.bytes.len() - self.pos)));
        }
        Ok(())
    }
}

/// The header of a message of `kind`.
pub fn header(kind: MessageKind) -> Vec<u8> {
    vec![WIRE_VERSION, kind as u8]
}

/// A one-bit message (the match bit of Π1 Round 3 and Π2 Round 4): `version ‖ kind ‖ bit`.
pub fn encode_bit(kind: MessageKind, bit: bool) -> Vec<u8> {
    let mut out = header(kind);
    out.push(u8::from(bit));
    out
}

/// Strict decoding of [`encode_bit`]: exactly one byte, 0 or 1, after the header.
pub fn decode_bit(
    message: &'static str,
    kind: MessageKind,
    bytes: &[u8],
) -> Result<bool, MatchError> {
    let mut r = Reader::new(message, bytes, kind)?;
    let bit = r.bit("match bit")?;
    r.finish()?;
    Ok(bit)
}

/// Appends a signed integer: sign byte (0 or 1), u16 length, big-endian magnitude without a
/// leading zero byte (zero: sign 0, length 0).
pub fn put_signed(out: &mut Vec<u8>, x: &Integer) {
    let magnitude = x.clone().abs().to_digits::<u8>(Order::Msf);
    out.push(u8::from(*x < 0));
    // Callers write bounded values (far below 2^(8·65535)); saturate rather than wrap.
    let len = u16::try_from(magnitude.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&magnitude[..usize::from(len)]);
}

/// A suspended terminal state being written: `version ‖ kind`, zeroized on drop, with room
/// for every field ([`end_state`] appends the check value).
pub fn begin_state(kind: MessageKind) -> zeroize::Zeroizing<Vec<u8>> {
    let mut out = zeroize::Zeroizing::new(Vec::with_capacity(STATE_CAPACITY));
    out.extend_from_slice(&header(kind));
    out
}

/// SHA-256 over the domain, the canonical `params` and `body`, cut to
/// [`STATE_CHECK_BYTES`].
fn state_check(params: &Params, body: &[u8]) -> [u8; STATE_CHECK_BYTES] {
    let p = params.to_bytes();
    let mut h = Sha256::new();
    h.update(STATE_CHECK_DOMAIN);
    // Canonical parameters are about 20 bytes.
    h.update((p.len() as u16).to_be_bytes());
    h.update(&p);
    h.update(body);
    let digest = h.finalize();
    let mut out = [0u8; STATE_CHECK_BYTES];
    out.copy_from_slice(&digest[..STATE_CHECK_BYTES]);
    out
}

/// Ends a suspended terminal state with its check value: a hash over the session's
/// parameters and every byte before it. It is not a MAC (whoever may write the state may
/// recompute it); it makes a resumed state refuse parameters other than its session's and any
/// stored byte that changed, instead of silently running with other secrets.
pub fn end_state(
    params: &Params,
    mut state: zeroize::Zeroizing<Vec<u8>>,
) -> zeroize::Zeroizing<Vec<u8>> {
    let check = state_check(params, &state);
    state.extend_from_slice(&check);
    state
}

/// A strict reader over the fields of a suspended terminal state of `kind` written by
/// [`begin_state`] … [`end_state`] for `params`: the check value must match (else a wire
/// error naming `message`); the reader stops before it.
pub fn state_reader<'a>(
    message: &'static str,
    params: &Params,
    state: &'a [u8],
    kind: MessageKind,
) -> Result<Reader<'a>, MatchError> {
    let Some(split) = state.len().checked_sub(STATE_CHECK_BYTES) else {
        return Err(MatchError::Wire {
            message,
            reason: format!(
                "{} bytes, shorter than its {STATE_CHECK_BYTES}-byte check value",
                state.len()
            ),
        });
    };
    let (body, check) = state.split_at(split);
    let r = Reader::new(message, body, kind)?;
    if state_check(params, body) != check {
        return Err(r.error(
            "the check value does not match: the state was changed or belongs to other parameters",
        ));
    }
    Ok(r)
}

/// Appends the fields of an encrypted template message (Round 1 of Π1 and Π2): the
/// canonical parameters, the public key, the count t and the t ciphertexts.
pub fn put_template(out: &mut Vec<u8>, params: &Params, pk: &PublicKey, template: &[Ciphertext]) {
    let p = params.to_bytes();
    // Canonical parameters are about 20 bytes; t ≤ 4096.
    out.extend_from_slice(&(p.len() as u16).to_be_bytes());
    out.extend_from_slice(&p);
    out.extend_from_slice(&pk.to_bytes());
    out.extend_from_slice(&(template.len() as u32).to_be_bytes());
    for c in template {
        out.extend_from_slice(&pk.ciphertext_to_bytes(c));
    }
}

/// Reads the fields written by [`put_template`], checked against the expected `params`: the
/// same canonical parameters, a key of |N| bits, exactly t valid ciphertexts.
pub fn read_template(
    r: &mut Reader<'_>,
    params: &Params,
) -> Result<(PublicKey, Vec<Ciphertext>), MatchError> {
    let len = usize::from(r.u16("parameters length")?);
    let p = r.take(len, "parameters")?;
    if p != params.to_bytes().as_slice() {
        return Err(r.error("the parameters differ from the agreed ones"));
    }
    let modulus_bytes = params.modulus_bits().div_ceil(8) as usize;
    let pk_bytes = r.take(modulus_bytes, "public key")?;
    let pk = PublicKey::from_bytes(pk_bytes).map_err(|e| r.error(format!("public key: {e}")))?;
    if pk.modulus_bits() != params.modulus_bits() {
        return Err(r.error(format!(
            "public key: {}-bit modulus, expected {}",
            pk.modulus_bits(),
            params.modulus_bits()
        )));
    }
    let count = r.u32("ciphertext count")? as usize;
    let expected = params.layout().ciphertexts();
    if count != expected {
        return Err(r.error(format!("{count} ciphertexts, expected t = {expected}")));
    }
    let mut template = Vec::with_capacity(count);
    for _ in 0..count {
        template.push(r.ciphertext(&pk, "template ciphertext")?);
    }
    Ok((pk, template))
}

/// The bytes the service provider signs at enrolment and the terminal verifies in Round 2
/// ([ABMR20] §6.1: σ = Sign(sk, (epk, ⟦u_1*⟧, …, ⟦u_t*⟧))), with a domain separator and the
/// canonical parameters added: `domain ‖ len(params) (u16) ‖ params ‖ N ‖ t (u32) ‖ ⟦u_c*⟧…`.
pub fn template_signing_bytes(params: &Params, pk: &PublicKey, template: &[Ciphertext]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        SIGNING_DOMAIN.len() + 64 + pk.modulus_bytes() + template.len() * pk.ciphertext_bytes(),
    );
    out.extend_from_slice(SIGNING_DOMAIN);
    put_template(&mut out, params, pk, template);
    out
}

/// Checks that `params` are for `protocol` and that |threshold| ≤ ζ².
pub fn check_session_params(
    params: &Params,
    protocol: Protocol,
    threshold: i64,
) -> Result<(), MatchError> {
    if params.protocol() != protocol {
        return Err(MatchError::Argument {
            argument: "params",
            reason: format!("parameters for {:?}, not {protocol:?}", params.protocol()),
        });
    }
    let t = Integer::from(threshold);
    if t.clone().abs() > *params.norm_bound() {
        return Err(MatchError::Argument {
            argument: "threshold",
            reason: format!(
                "{threshold} is outside [−ζ², ζ²] = ±{}",
                params.norm_bound()
            ),
        });
    }
    Ok(())
}

/// The checks of a device built from SP's enrolment answer (Π2, Π3): parameters for
/// `protocol`, a key of the parameters' size, t ciphertexts, a signature of bounded size.
pub fn check_device_parts(
    params: &Params,
    protocol: Protocol,
    public_key: &PublicKey,
    template: &[Ciphertext],
    signature: &[u8],
) -> Result<(), MatchError> {
    check_session_params(params, protocol, 0)?;
    if public_key.modulus_bits() != params.modulus_bits() {
        return Err(MatchError::Argument {
            argument: "secret",
            reason: "key size differs from the parameters".into(),
        });
    }
    if template.len() != params.layout().ciphertexts() {
        return Err(MatchError::Argument {
            argument: "template",
            reason: format!(
                "{} ciphertexts, expected t = {}",
                template.len(),
                params.layout().ciphertexts()
            ),
        });
    }
    if signature.len() > MAX_SIGNATURE_BYTES {
        return Err(MatchError::Argument {
            argument: "signature",
            reason: format!("{} bytes, at most {MAX_SIGNATURE_BYTES}", signature.len()),
        });
    }
    Ok(())
}

/// The inner product as an i64 (|IP| ≤ ζ² ≤ 2^58 for valid parameters).
pub fn to_i64(argument: &'static str, x: &Integer) -> Result<i64, MatchError> {
    x.to_i64().ok_or_else(|| MatchError::Argument {
        argument,
        reason: format!("{x} does not fit an i64"),
    })
}

/// Shared test fixtures of the protocol tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::super::cipher::SecretKey;
    use rand_chacha::ChaCha20Rng;
    use rand_core::RngCore;

    /// A copy of a test key (SecretKey is deliberately not Clone).
    pub(crate) fn clone_key(sk: &SecretKey) -> SecretKey {
        let (p, q) = sk.primes();
        SecretKey::from_primes(p.clone(), q.clone()).expect("a valid key's primes")
    }

    /// Parameters of `protocol` with the largest norm bound, allowing the 1024-bit test key.
    pub(crate) fn max_params(
        protocol: super::super::params::Protocol,
        dim: usize,
        m: u32,
        bits: u32,
    ) -> super::super::params::Params {
        use super::super::params::{Params, DEFAULT_STAT_BITS};
        let norm = Params::max_norm_bound(dim, m);
        Params::new_allowing_test_modulus(protocol, dim, m, bits, DEFAULT_STAT_BITS, norm)
            .expect("test parameters")
    }

    /// ℓ uniform signed m-bit values.
    pub(crate) fn random_vector(dim: usize, m: u32, rng: &mut ChaCha20Rng) -> Vec<i32> {
        let half = 1u64 << (m - 1);
        (0..dim)
            .map(|_| ((rng.next_u64() % (2 * half)) as i64 - half as i64) as i32)
            .collect()
    }

    /// The plaintext inner product.
    pub(crate) fn dot(u: &[i32], w: &[i32]) -> i64 {
        u.iter()
            .zip(w)
            .map(|(&a, &b)| i64::from(a) * i64::from(b))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_integers_round_trip_and_are_canonical() {
        for x in [0i64, 1, -1, 255, -256, 1 << 40, -(1 << 58)] {
            let mut out = header(MessageKind::Pi2Decoded);
            put_signed(&mut out, &Integer::from(x));
            let mut r = Reader::new("X", &out, MessageKind::Pi2Decoded).unwrap();
            assert_eq!(r.signed(16, "X").unwrap(), x);
            r.finish().unwrap();
        }
        let bad = |body: &[u8]| {
            let mut out = header(MessageKind::Pi2Decoded);
            out.extend_from_slice(body);
            let mut r = Reader::new("X", &out, MessageKind::Pi2Decoded).unwrap();
            r.signed(4, "X").and_then(|_| r.finish())
        };
        assert!(bad(&[1, 0, 0]).is_err(), "negative zero");
        assert!(bad(&[0, 0, 1, 0]).is_err(), "leading zero");
        assert!(bad(&[2, 0, 1, 5]).is_err(), "sign byte");
        assert!(bad(&[0, 0, 5, 1, 2, 3, 4, 5]).is_err(), "too long");
        assert!(bad(&[0, 0, 2, 1]).is_err(), "truncated");
        assert!(bad(&[0, 0, 1, 1, 9]).is_err(), "trailing");
        assert!(bad(&[0, 0, 1, 7]).is_ok());
    }

    #[test]
    fn headers_are_checked() {
        let out = header(MessageKind::Pi1Outcome);
        assert!(Reader::new("m", &out, MessageKind::Pi1Outcome).is_ok());
        assert!(Reader::new("m", &out, MessageKind::Pi2Outcome).is_err());
        assert!(Reader::new("m", &[2, 0x13], MessageKind::Pi1Outcome).is_err());
        assert!(Reader::new("m", &[1], MessageKind::Pi1Outcome).is_err());
        assert!(Reader::new("m", &[], MessageKind::Pi1Outcome).is_err());
        let mut r = Reader::new("m", &[1, 0x13, 2], MessageKind::Pi1Outcome).unwrap();
        assert!(r.bit("bit").is_err());
    }
}
