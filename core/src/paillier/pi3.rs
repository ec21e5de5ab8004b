//! # Π3: matching with a malicious device and no leakage ([ABMR20] §7, Fig. 5 and 6)
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363.
//!
//! * **Round 1** D → T: Π2's Round 1 ([`Pi2Round1`]: σ, epk, ⟦u_1*⟧ … ⟦u_t*⟧), unchanged.
//! * **Round 2** T → D ([`Pi3Round2`]): T checks σ, picks a uniform in [1, 2^λ), pad and b,
//!   computes the product ⟦z⟧ = ⟦Σ u_c*·w_c*⟧ once and sends ⟦X̃⟧ = ⟦Mask(z + Encode2(ρ_0 +
//!   pad))⟧ and ⟦Ỹ⟧ = ⟦Mask(a·z + Encode2(ρ_1 + b))⟧, each with fresh masks, zero-sum ρ and
//!   r^N (Fig. 5 Round 2 steps (1)–(5)), and its threshold (the circuit's constant, public).
//! * **Round 3** D → T ([`Pi3Round3`]): D decodes X = IP + pad and Y = a·IP + b and sends the
//!   OT receiver's message for the bits of X mod 2^k and Y mod P (two-message OT of [MR19],
//!   secure against a malicious receiver; the paper used Chou–Orlandi).
//! * **Round 4** T → D ([`Pi3Round4`]): T garbles the circuit of Fig. 6 with reduced inputs
//!   ([`match_check_circuit`]: IP = X − pad mod 2^k read signed; valid = (a·IP + b ≡ Y mod P);
//!   matched = valid ∧ IP ≥ threshold), and sends it with the labels of pad mod 2^k, a and
//!   c = (b − a·2^(k−1)) mod P, the OT sender's message (the labels of X and Y) and the public
//!   output decoding (Fig. 5 Round 5 step (2): "D learns y").
//! * **Round 5** D → T ([`Pi3Round5`]): D evaluates and returns the two output labels; T
//!   accepts only labels it made ([`GarblerSecrets::decode_output`]): a wrong label is caught.
//!   valid = 0 means the device fed values other than the decrypted ones: T refuses
//!   ([`MatchError::Cheating`]).
//!
//! **Ranges.** T offsets its one-time pads: pad = 2ζ² + U[0, 2^(bits(ζ²)+λ)) makes X = IP +
//! pad ≥ ζ² and hides IP (|IP| ≤ ζ²) within 2^−λ; b = 2·A·ζ² + U[0, 2^(B−1)) with A = 2^λ − 1
//! and B = bits(A·ζ²) + λ + 1 (the layout's addend width) makes Y ≥ A·ζ² and hides a·IP within
//! 2^−λ. Both stay below 2^B, the room the layout reserves. The device refuses X or Y outside
//! the ranges an honest T produces (`OutOfRange`), so a Round 2 not made as the protocol says
//! (a raised template ciphertext: small values) is refused before any oblivious transfer.
//!
//! **Reduced inputs.** The circuit needs only X mod 2^k with k = bits(ζ²) + 1 (IP is
//! recovered exactly from X − pad mod 2^k, since |IP| < 2^(k−1); pad mod 2^k is uniform, the
//! pad's range being a multiple of 2^k) and Y mod P, the smallest Mersenne prime P = 2^e − 1
//! above 2^k and 2^λ. A device that feeds X* ≢ X (mod 2^k) changes IP + 2^(k−1) by δ with
//! 0 < |δ| < 2^k < P, so it passes only with Y* ≡ Y + a·δ (mod P), which differs for each of
//! the 2^λ − 1 values of a (a < P, δ invertible): it must guess a, hidden from it by b within
//! 2^−λ — the bound of the exact-integer circuit. D's input is k + e bits (102 at ℓ = 256,
//! m = 16) instead of ≈ 2·bits(ζ²) + 3λ (≈ 200), which halves the oblivious transfers that
//! dominate Π3's time, and the circuit shrinks with it.
//!
//! Leakage: none beyond the bit. D sees X and Y (one-time padded), the garbled circuit and its
//! output; T sees the OT receiver's message (hides X, Y) and the output labels.

use rand_core::{CryptoRng, RngCore};
use rug::integer::Order;
use rug::{Complete, Integer};
use sha2::{Digest, Sha256};

use super::cipher::{random_below, Ciphertext, PublicKey, SecretKey};
use super::encoding::{check_template, decode_sum, mask_affine_product};
use super::messages::{
    begin_state, check_session_params, end_state, header, put_signed, state_reader, to_i64,
    MatchError, MessageKind, Reader,
};
use super::params::{Layout, Params, Protocol};
use super::pi2::{Pi2Round1, SignedDevice};
use super::precomputed::{inner_product_with, PrecomputedTemplate};
use super::signed_round2::VerifiedRound2;
use crate::paillier::circuit::{
    match_check_circuit, Circuit, MatchCheckWidths, MATCH_CHECK_MATCHED, MATCH_CHECK_VALID,
};
use crate::paillier::garble::{
    evaluate, garble, labels_from_bytes, labels_to_bytes, GarbledCircuit, OutputDecoding,
    OutputLabels,
};
use crate::paillier::ot::{OtReceiver, OtSender, ReceiverMessage, SenderMessage};
use std::sync::Arc;

/// Domain of the OT session id, derived from T's Round 2 (fresh randomness both sides hold).
const OT_SESSION_DOMAIN: &[u8] = b"privmatch/paillier/pi3/ot-session/v1";

fn garbled(what: &str, e: impl std::fmt::Display) -> MatchError {
    MatchError::Garbled(format!("{what}: {e}"))
}

/// The widths of the circuit's inputs for a Π3 layout (see the module documentation): IP
/// (|IP| ≤ ζ²) in bits(ζ²) + 1 signed bits, a in λ bits, the MAC modulo the smallest
/// Mersenne prime above both.
pub fn circuit_widths(layout: &Layout) -> Result<MatchCheckWidths, MatchError> {
    let ip = layout.ip_bound().significant_bits() as usize + 1;
    MatchCheckWidths::new(ip, layout.multiplier_bits() as usize).map_err(|e| garbled("widths", e))
}

/// P = 2^e − 1, the MAC's modulus.
fn mac_modulus(widths: &MatchCheckWidths) -> Integer {
    (Integer::from(1) << widths.mac as u32) - 1u32
}

/// D's circuit inputs from the decrypted X, Y ≥ 0: X mod 2^k and Y mod P.
fn device_input_bits(
    widths: &MatchCheckWidths,
    x: &Integer,
    y: &Integer,
) -> Result<Vec<bool>, MatchError> {
    let x = x.clone().keep_bits(widths.ip as u32);
    let y = y.clone().modulo(&mac_modulus(widths));
    widths
        .evaluator_bits(&le_bytes(&x), &le_bytes(&y))
        .map_err(|e| garbled("X, Y", e))
}

/// T's circuit inputs: pad mod 2^k, a, and c = (b − a·2^(k−1)) mod P, so that the circuit's
/// a·(IP + 2^(k−1)) + c is a·IP + b mod P.
fn terminal_input_bits(
    widths: &MatchCheckWidths,
    secrets: &TerminalSecrets,
) -> Result<Vec<bool>, MatchError> {
    let pad = secrets.pad.clone().keep_bits(widths.ip as u32);
    let shift = (&secrets.a << (widths.ip as u32 - 1)).complete();
    let offset = (&secrets.b - shift).modulo(&mac_modulus(widths));
    widths
        .garbler_bits(&le_bytes(&pad), &le_bytes(&secrets.a), &le_bytes(&offset))
        .map_err(|e| garbled("pad, a, b", e))
}

/// The circuit of [ABMR20] Fig. 6 for `params` and the terminal's `threshold`.
pub fn circuit(params: &Params, threshold: i64) -> Result<Circuit, MatchError> {
    match_check_circuit(circuit_widths(params.layout())?, i128::from(threshold))
        .map_err(|e| garbled("circuit", e))
}

fn le_bytes(x: &Integer) -> Vec<u8> {
    x.to_digits::<u8>(Order::Lsf)
}

fn put_block(out: &mut Vec<u8>, bytes: &[u8]) {
    // Blocks are far below 4 GiB (the circuit of ℓ = 1024 is under 1 MiB).
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn read_block<'a>(r: &mut Reader<'a>, max: usize, what: &str) -> Result<&'a [u8], MatchError> {
    let len = r.u32(what)? as usize;
    if len > max {
        return Err(r.error(format!("{what}: {len} bytes, at most {max}")));
    }
    r.take(len, what)
}

/// Bytes of the OT session id.
const OT_SESSION_BYTES: usize = 32;

/// Outputs of the circuit of Fig. 6: [valid, matched].
const CIRCUIT_OUTPUTS: usize = 2;

/// The OT session id: a hash of T's Round 2 message.
fn ot_session(round2: &[u8]) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(OT_SESSION_DOMAIN);
    h.update(round2);
    h.finalize().to_vec()
}

/// Π3 Round 2, T → D ([ABMR20] Fig. 5 Round 2 step (5)): ⟦X̃⟧, ⟦Ỹ⟧ and the threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pi3Round2 {
    /// ⟦Mask(z + ρ_0 + pad)⟧: X = IP + pad.
    pub x: Ciphertext,
    /// ⟦Mask(a·z + ρ_1 + b)⟧: Y = a·IP + b.
    pub y: Ciphertext,
    /// The threshold the circuit compares with (public, as in [ABMR20]).
    pub threshold: i64,
}

impl Pi3Round2 {
    /// `version ‖ kind ‖ ⟦X̃⟧ ‖ ⟦Ỹ⟧ ‖ threshold (signed)`.
    pub fn to_bytes(&self, pk: &PublicKey) -> Vec<u8> {
        let mut out = header(MessageKind::Pi3Masked);
        out.extend_from_slice(&pk.ciphertext_to_bytes(&self.x));
        out.extend_from_slice(&pk.ciphertext_to_bytes(&self.y));
        put_signed(&mut out, &Integer::from(self.threshold));
        out
    }

    /// Strict decoding for the key `pk`.
    pub fn from_bytes(pk: &PublicKey, bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π3 round 2", bytes, MessageKind::Pi3Masked)?;
        let x = r.ciphertext(pk, "X̃")?;
        let y = r.ciphertext(pk, "Ỹ")?;
        let threshold = to_i64("threshold", &r.signed(8, "threshold")?)?;
        r.finish()?;
        Ok(Self { x, y, threshold })
    }
}

/// Π3 Round 3, D → T ([ABMR20] Fig. 5 Round 3 step (3)): OT.Round1((X, Y)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pi3Round3 {
    /// The OT receiver's message, one OT per bit of X and Y.
    pub ot: ReceiverMessage,
}

impl Pi3Round3 {
    /// `version ‖ kind ‖ len (u32) ‖ OT receiver message`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(MessageKind::Pi3OtRequest);
        put_block(&mut out, &self.ot.to_bytes());
        out
    }

    /// Strict decoding; the number of OTs must be the circuit's evaluator inputs.
    pub fn from_bytes(circuit: &Circuit, bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π3 round 3", bytes, MessageKind::Pi3OtRequest)?;
        let block = read_block(&mut r, 1 << 20, "OT request")?;
        r.finish()?;
        let ot = ReceiverMessage::from_bytes(block).map_err(|e| garbled("OT request", e))?;
        if ot.len() != circuit.evaluator_inputs() {
            return Err(garbled(
                "OT request",
                format!(
                    "{} OTs, the circuit has {} evaluator inputs",
                    ot.len(),
                    circuit.evaluator_inputs()
                ),
            ));
        }
        Ok(Self { ot })
    }
}

/// Π3 Round 4, T → D ([ABMR20] Fig. 5 Round 4 step (3)): (C̃, lab_pad, lab_a, lab_b, ot^sen)
/// and the public decoding of the output bits.
#[derive(Clone, Debug)]
pub struct Pi3Round4 {
    /// C̃.
    pub circuit: GarbledCircuit,
    /// The labels of pad, a, b (the garbler's inputs, in the circuit's order).
    pub garbler_labels: Vec<crate::paillier::garble::Label>,
    /// The OT sender's message carrying the labels of X and Y.
    pub ot: SenderMessage,
    /// The permute bits of the output wires, so D learns its output bit.
    pub decoding: OutputDecoding,
}

impl Pi3Round4 {
    /// `version ‖ kind ‖ C̃ (u32-prefixed) ‖ garbler labels ‖ OT (u32-prefixed) ‖ decoding
    /// (u32-prefixed)`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(MessageKind::Pi3Garbled);
        put_block(&mut out, &self.circuit.to_bytes());
        out.extend_from_slice(&labels_to_bytes(&self.garbler_labels));
        put_block(&mut out, &self.ot.to_bytes());
        put_block(&mut out, &self.decoding.to_bytes());
        out
    }

    /// Strict decoding against the circuit D rebuilt from the parameters and threshold.
    pub fn from_bytes(circuit: &Circuit, bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π3 round 4", bytes, MessageKind::Pi3Garbled)?;
        let tables = read_block(&mut r, GarbledCircuit::byte_len(circuit), "garbled circuit")?;
        let gc = GarbledCircuit::from_bytes(circuit, tables).map_err(|e| garbled("circuit", e))?;
        let count = circuit.garbler_inputs();
        let labels = r.take(16 * count, "garbler labels")?;
        let garbler_labels =
            labels_from_bytes(labels, count).map_err(|e| garbled("garbler labels", e))?;
        let ot_bytes = read_block(&mut r, 1 << 22, "OT reply")?;
        let ot = SenderMessage::from_bytes(ot_bytes).map_err(|e| garbled("OT reply", e))?;
        let dec = read_block(&mut r, 1024, "output decoding")?;
        let decoding =
            OutputDecoding::from_bytes(circuit, dec).map_err(|e| garbled("output decoding", e))?;
        r.finish()?;
        Ok(Self {
            circuit: gc,
            garbler_labels,
            ot,
            decoding,
        })
    }
}

/// Π3 Round 5, D → T ([ABMR20] Fig. 5 Round 5 step (2)): the output labels.
#[derive(Clone, Debug)]
pub struct Pi3Round5 {
    /// The labels of the outputs [valid, matched].
    pub labels: Vec<crate::paillier::garble::Label>,
}

impl Pi3Round5 {
    /// `version ‖ kind ‖ labels (16 bytes each)`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(MessageKind::Pi3OutputLabels);
        out.extend_from_slice(&labels_to_bytes(&self.labels));
        out
    }

    /// Strict decoding: exactly two labels.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π3 round 5", bytes, MessageKind::Pi3OutputLabels)?;
        let raw = r.take(CIRCUIT_OUTPUTS * 16, "output labels")?;
        r.finish()?;
        let labels =
            labels_from_bytes(raw, CIRCUIT_OUTPUTS).map_err(|e| garbled("output labels", e))?;
        Ok(Self { labels })
    }
}

/// The device D of Π3 after enrolment (the same enrolment as Π2's, under Π3 parameters).
#[derive(Debug)]
pub struct Pi3Device {
    inner: SignedDevice,
}

impl Pi3Device {
    /// The device from SP's enrolment answer: the packed template and σ.
    pub fn new(
        params: Params,
        secret: SecretKey,
        template: Vec<Ciphertext>,
        signature: Vec<u8>,
    ) -> Result<Self, MatchError> {
        let inner = SignedDevice::new(params, Protocol::Pi3, secret, template, signature)?;
        Ok(Self { inner })
    }

    /// Round 1 (Fig. 5 Round 1, the same message as Π2's), encoded.
    pub fn round1(&self) -> Vec<u8> {
        self.inner.round1()
    }

    /// A matching session (Rounds 3 and 5 of one run).
    pub fn session(&self) -> Pi3DeviceSession<'_> {
        Pi3DeviceSession {
            device: self,
            state: DeviceState::AwaitingRound2,
        }
    }
}

enum DeviceState {
    AwaitingRound2,
    AwaitingRound4 {
        circuit: Circuit,
        receiver: OtReceiver,
    },
    Done(bool),
    Failed,
}

/// One Π3 session on the device's side.
pub struct Pi3DeviceSession<'a> {
    device: &'a Pi3Device,
    state: DeviceState,
}

impl std::fmt::Debug for Pi3DeviceSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            DeviceState::AwaitingRound2 => "AwaitingRound2",
            DeviceState::AwaitingRound4 { .. } => "AwaitingRound4",
            DeviceState::Done(_) => "Done",
            DeviceState::Failed => "Failed",
        };
        write!(f, "Pi3DeviceSession({state})")
    }
}

impl Pi3DeviceSession<'_> {
    /// Round 3 (Fig. 5 Round 3): decrypt and decode X and Y, then the OT receiver's message
    /// for their bits; encoded.
    pub fn round3<R: RngCore + CryptoRng>(
        &mut self,
        round2: &[u8],
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        if !matches!(self.state, DeviceState::AwaitingRound2) {
            return Err(MatchError::State("Π3 round 3 was already sent".into()));
        }
        let d = &self.device.inner;
        let msg = Pi3Round2::from_bytes(d.public_key(), round2)?;
        check_session_params(d.params(), Protocol::Pi3, msg.threshold)?;
        let layout = d.params().layout();
        let x = decode_sum(d.secret(), layout, &msg.x)?;
        let y = decode_sum(d.secret(), layout, &msg.y)?;
        let widths = circuit_widths(layout)?;
        // Nothing outside the honest ranges goes into the oblivious transfer: a Round 2 not
        // made as the protocol says (a power of a template ciphertext, say) decodes outside
        // them, and its bits would otherwise be what the circuit's outputs reveal.
        let [x_range, y_range] = SecretRanges::of(layout).decoded(layout);
        if x < x_range.0 || x >= x_range.1 {
            return Err(MatchError::OutOfRange("X"));
        }
        if y < y_range.0 || y >= y_range.1 {
            return Err(MatchError::OutOfRange("Y"));
        }
        let choices = device_input_bits(&widths, &x, &y)?;
        let circuit = circuit(d.params(), msg.threshold)?;
        let (receiver, request) = OtReceiver::new(&ot_session(round2), &choices, rng);
        self.state = DeviceState::AwaitingRound4 { circuit, receiver };
        Ok(Pi3Round3 { ot: request }.to_bytes())
    }

    /// Round 3 on a Round 2 the pinned service provider signed for this device and session
    /// (`signed_round2`), whose threshold inside must be the signed policy threshold: the only
    /// Round 3 a device that talks through an untrusted relay makes.
    pub fn round3_signed<R: RngCore + CryptoRng>(
        &mut self,
        round2: &VerifiedRound2,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        if round2.fields().protocol != Protocol::Pi3 {
            return Err(MatchError::Unsigned("not a Π3 Round 2".into()));
        }
        let msg = Pi3Round2::from_bytes(self.device.inner.public_key(), round2.payload())?;
        round2.require_threshold(msg.threshold)?;
        self.round3(round2.payload(), rng)
    }

    /// Round 5 (Fig. 5 Round 5): obtain the labels of X and Y by OT, evaluate, learn the
    /// output bit; returns the encoded output labels for T and D's output (matched).
    pub fn round5(&mut self, round4: &[u8]) -> Result<(Vec<u8>, bool), MatchError> {
        let (circuit, receiver) = match std::mem::replace(&mut self.state, DeviceState::Failed) {
            DeviceState::AwaitingRound4 { circuit, receiver } => (circuit, receiver),
            other => {
                self.state = other;
                return Err(MatchError::State("Π3 round 5 follows round 3, once".into()));
            }
        };
        let msg = Pi3Round4::from_bytes(&circuit, round4)?;
        let mine = receiver
            .finish(&msg.ot)
            .map_err(|e| garbled("OT reply", e))?;
        let outputs = evaluate(&circuit, &msg.circuit, &msg.garbler_labels, &mine)
            .map_err(|e| garbled("evaluation", e))?;
        let bits = msg
            .decoding
            .decode(&outputs)
            .map_err(|e| garbled("output decoding", e))?;
        let matched = bits[MATCH_CHECK_VALID] && bits[MATCH_CHECK_MATCHED];
        self.state = DeviceState::Done(matched);
        Ok((Pi3Round5 { labels: outputs }.to_bytes(), matched))
    }

    /// D's output once the session is over.
    pub fn outcome(&self) -> Option<bool> {
        match self.state {
            DeviceState::Done(b) => Some(b),
            _ => None,
        }
    }
}

/// T's secrets of one session.
struct TerminalSecrets {
    a: Integer,
    b: Integer,
    pad: Integer,
}

/// The ranges T draws its secrets from (see the module documentation), each [low, high).
struct SecretRanges {
    a: (Integer, Integer),
    pad: (Integer, Integer),
    b: (Integer, Integer),
}

impl SecretRanges {
    fn of(layout: &Layout) -> Self {
        let one = Integer::from(1);
        let zeta2 = layout.ip_bound();
        let lambda = layout.stat_bits();
        // Floors of 2ζ² and 2·A·ζ² (not ζ² and A·ζ²): every honest X and Y is then at least
        // ζ² and A·ζ², so the device can refuse small values (`decoded_ranges`). The widths,
        // and so the hiding and the uniformity of pad mod 2^k, are unchanged.
        let pad_low = (zeta2 * 2u32).complete();
        let pad_high = (&one << (zeta2.significant_bits() + lambda)).complete() + &pad_low;
        let b_low = (layout.max_multiplier() * zeta2).complete() * 2u32;
        let b_high = (&one << (layout.addend_bits() - 1)).complete() + &b_low;
        Self {
            a: (one.clone(), (&one << lambda).complete()),
            pad: (pad_low, pad_high),
            b: (b_low, b_high),
        }
    }

    /// The ranges [low, high) of X = IP + pad and Y = a·IP + b an honest T produces (|IP| ≤
    /// ζ², 1 ≤ a ≤ A): pad's and b's ranges widened by ζ² and A·ζ² on both sides.
    fn decoded(&self, layout: &Layout) -> [(Integer, Integer); 2] {
        let zeta2 = layout.ip_bound();
        let a_zeta = (layout.max_multiplier() * zeta2).complete();
        [
            (
                (&self.pad.0 - zeta2).complete(),
                (&self.pad.1 + zeta2).complete(),
            ),
            (
                (&self.b.0 - &a_zeta).complete(),
                (&self.b.1 + &a_zeta).complete(),
            ),
        ]
    }

    /// Uniform in [low, high).
    fn draw<R: RngCore + CryptoRng>(range: &(Integer, Integer), rng: &mut R) -> Integer {
        random_below(&(&range.1 - &range.0).complete(), rng) + &range.0
    }

    /// Fig. 5 Round 2 step (2): a uniform in [1, 2^λ), pad and b offset as documented.
    fn draw_secrets<R: RngCore + CryptoRng>(&self, rng: &mut R) -> TerminalSecrets {
        let a = Self::draw(&self.a, rng);
        let pad = Self::draw(&self.pad, rng);
        let b = Self::draw(&self.b, rng);
        TerminalSecrets { a, b, pad }
    }
}

enum TerminalState {
    AwaitingRound1,
    AwaitingRound3 {
        secrets: TerminalSecrets,
        session: Vec<u8>,
    },
    /// Only what the label check needs, not the whole garbling.
    AwaitingRound5 {
        outputs: OutputLabels,
    },
    Done(bool),
    Failed,
}

/// The terminal T of Π3 for one session: its measurement w and threshold, then its secrets.
pub struct Pi3Terminal {
    params: Params,
    /// Used by Round 2 only; empty in a resumed terminal.
    w: Vec<i32>,
    threshold: i64,
    state: TerminalState,
    /// The offline tables of the device's template (see [`super::precomputed`]), if any.
    precomputed: Option<Arc<PrecomputedTemplate>>,
}

impl std::fmt::Debug for Pi3Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // w and the session secrets are the terminal's.
        let state = match self.state {
            TerminalState::AwaitingRound1 => "AwaitingRound1",
            TerminalState::AwaitingRound3 { .. } => "AwaitingRound3",
            TerminalState::AwaitingRound5 { .. } => "AwaitingRound5",
            TerminalState::Done(_) => "Done",
            TerminalState::Failed => "Failed",
        };
        write!(f, "Pi3Terminal({state})")
    }
}

impl Pi3Terminal {
    /// A session with measurement `w` (length ℓ, m-bit elements, ‖w‖² ≤ ζ²) and `threshold`
    /// (|threshold| ≤ ζ²).
    pub fn new(params: Params, w: Vec<i32>, threshold: i64) -> Result<Self, MatchError> {
        check_session_params(&params, Protocol::Pi3, threshold)?;
        check_template(params.layout(), "w", &w)?;
        Ok(Self {
            params,
            w,
            threshold,
            state: TerminalState::AwaitingRound1,
            precomputed: None,
        })
    }

    /// Uses the terminal's offline tables of the device's Round 1 template for Round 2 (see
    /// [`super::precomputed`]): the same Round 2 message, fewer squarings. A Round 1 whose
    /// template is not the tables' is refused.
    pub fn with_precomputed(mut self, tables: Arc<PrecomputedTemplate>) -> Self {
        self.precomputed = Some(tables);
        self
    }

    /// Round 2 (Fig. 5 Round 2): verify σ with `verify(message, signature)`, draw a, b, pad,
    /// compute ⟦X̃⟧ and ⟦Ỹ⟧ with fresh r^N; encoded.
    pub fn round2<R: RngCore + CryptoRng>(
        &mut self,
        round1: &[u8],
        verify: &dyn Fn(&[u8], &[u8]) -> bool,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        self.round2_with(round1, verify, None, rng)
    }

    /// Round 2 with two r^N precomputed offline for the device's key (fresh, of this key;
    /// Round 1 is reusable, so a terminal can fill a pool for a device ahead of time).
    pub fn round2_with_nonce_powers<R: RngCore + CryptoRng>(
        &mut self,
        round1: &[u8],
        verify: &dyn Fn(&[u8], &[u8]) -> bool,
        r_to_n: [&Integer; 2],
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        self.round2_with(round1, verify, Some(r_to_n), rng)
    }

    fn round2_with<R: RngCore + CryptoRng>(
        &mut self,
        round1: &[u8],
        verify: &dyn Fn(&[u8], &[u8]) -> bool,
        r_to_n: Option<[&Integer; 2]>,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        if !matches!(self.state, TerminalState::AwaitingRound1) {
            return Err(MatchError::State("Π3 round 2 was already sent".into()));
        }
        let msg = Pi2Round1::from_bytes(&self.params, round1)?;
        if !verify(&msg.signed_bytes(&self.params), &msg.signature) {
            return Err(MatchError::Signature);
        }
        let layout = self.params.layout();
        let pk = &msg.public_key;
        let one = Integer::from(1);
        let TerminalSecrets { a, b, pad } = SecretRanges::of(layout).draw_secrets(rng);
        let product = inner_product_with(
            self.precomputed.as_deref(),
            pk,
            layout,
            &msg.template,
            &self.w,
        )?;
        let [nonce_x, nonce_y] = match r_to_n {
            Some([x, y]) => [x.clone(), y.clone()],
            None => [pk.random_nonce_power(rng), pk.random_nonce_power(rng)],
        };
        let x = mask_affine_product(pk, layout, &product, &one, &pad, &nonce_x, rng)?;
        let y = mask_affine_product(pk, layout, &product, &a, &b, &nonce_y, rng)?;
        let out = Pi3Round2 {
            x,
            y,
            threshold: self.threshold,
        }
        .to_bytes(pk);
        self.state = TerminalState::AwaitingRound3 {
            secrets: TerminalSecrets { a, b, pad },
            session: ot_session(&out),
        };
        Ok(out)
    }

    /// Round 4 (Fig. 5 Round 4): garble the circuit, answer the OT with the labels of X and
    /// Y; encoded.
    pub fn round4<R: RngCore + CryptoRng>(
        &mut self,
        round3: &[u8],
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        let (secrets, session) = match std::mem::replace(&mut self.state, TerminalState::Failed) {
            TerminalState::AwaitingRound3 { secrets, session } => (secrets, session),
            other => {
                self.state = other;
                return Err(MatchError::State("Π3 round 4 follows round 2, once".into()));
            }
        };
        let widths = circuit_widths(self.params.layout())?;
        let circuit = circuit(&self.params, self.threshold)?;
        let request = Pi3Round3::from_bytes(&circuit, round3)?;
        let (tables, garbler) = garble(&circuit, rng);
        let inputs = terminal_input_bits(&widths, &secrets)?;
        let garbler_labels = garbler
            .garbler_input_labels(&inputs)
            .map_err(|e| garbled("garbler labels", e))?;
        let ot = OtSender::respond(&session, &request.ot, &garbler.evaluator_label_pairs(), rng)
            .map_err(|e| garbled("OT request", e))?;
        let out = Pi3Round4 {
            circuit: tables,
            garbler_labels,
            ot,
            decoding: garbler.output_decoding(),
        }
        .to_bytes();
        self.state = TerminalState::AwaitingRound5 {
            outputs: garbler.output_labels(),
        };
        Ok(out)
    }

    /// Output (Fig. 5 "Output Computation"): decode D's output labels. A label T did not make
    /// for that output, or valid = 0 (X, Y inconsistent with a, b, pad), is
    /// [`MatchError::Cheating`] and the session fails.
    pub fn finish(&mut self, round5: &[u8]) -> Result<bool, MatchError> {
        let outputs = match std::mem::replace(&mut self.state, TerminalState::Failed) {
            TerminalState::AwaitingRound5 { outputs } => outputs,
            other => {
                self.state = other;
                return Err(MatchError::State("Π3 round 5 follows round 4, once".into()));
            }
        };
        let msg = Pi3Round5::from_bytes(round5)?;
        let bits = outputs.decode(&msg.labels).map_err(|e| {
            MatchError::Cheating(format!("an output label the terminal did not make ({e})"))
        })?;
        if !bits[MATCH_CHECK_VALID] {
            return Err(MatchError::Cheating(
                "the circuit's check a·(X − pad) + b = Y failed: the device fed other values \
                 than the ones it decrypted"
                    .into(),
            ));
        }
        let matched = bits[MATCH_CHECK_MATCHED];
        self.state = TerminalState::Done(matched);
        Ok(matched)
    }

    /// The output once the session is over (None while running or after a failure).
    pub fn outcome(&self) -> Option<bool> {
        match self.state {
            TerminalState::Done(b) => Some(b),
            _ => None,
        }
    }

    /// The terminal's state between two of its rounds, for a terminal that does not stay in
    /// memory (the service provider keeps it in a table), only what the next step needs:
    ///
    /// * after Round 2 (Fig. 5 Round 2): `version ‖ kind ‖ threshold ‖ a ‖ b ‖ pad` (signed
    ///   integers as in the messages) `‖ OT session id (32)`; w is no longer needed;
    /// * after Round 4: `version ‖ kind ‖` the two labels of each output wire (64 bytes:
    ///   what the label check of "Output Computation" needs, not the garbling's other labels);
    ///
    /// then a 16-byte check value over the parameters and those bytes. As secret as the
    /// values; zeroized on drop. [`MatchError::State`] at any other stage. The record's
    /// parameters are not in it: they are given again to [`Self::resume`].
    pub fn suspend(&self) -> Result<zeroize::Zeroizing<Vec<u8>>, MatchError> {
        match &self.state {
            TerminalState::AwaitingRound3 { secrets, session } => {
                let mut out = begin_state(MessageKind::Pi3TerminalAfterRound2);
                put_signed(&mut out, &Integer::from(self.threshold));
                put_signed(&mut out, &secrets.a);
                put_signed(&mut out, &secrets.b);
                put_signed(&mut out, &secrets.pad);
                out.extend_from_slice(session);
                Ok(end_state(&self.params, out))
            }
            TerminalState::AwaitingRound5 { outputs } => {
                let mut out = begin_state(MessageKind::Pi3TerminalAfterRound4);
                out.extend_from_slice(&outputs.to_bytes());
                Ok(end_state(&self.params, out))
            }
            _ => Err(MatchError::State(
                "a Π3 terminal is suspended after round 2 or round 4 only".into(),
            )),
        }
    }

    /// The terminal at the stage [`Self::suspend`] left it (awaiting Round 3, or Round 5),
    /// for the same `params` (the check value binds them). Strict: a wrong kind, version,
    /// length or check value, a threshold outside ±ζ², a, b or pad outside the ranges they are
    /// drawn from, or output labels that are not pairs (W⁰, W⁰ ⊕ Δ) are a
    /// [`MatchError::Wire`] naming the field (never the value). A terminal resumed after
    /// Round 4 has no threshold (the circuit it sent holds it).
    pub fn resume(params: Params, state: &[u8]) -> Result<Self, MatchError> {
        const WHAT: &str = "Π3 terminal state";
        check_session_params(&params, Protocol::Pi3, 0)?;
        let kind = match state.get(1) {
            Some(&k) if k == MessageKind::Pi3TerminalAfterRound4 as u8 => {
                MessageKind::Pi3TerminalAfterRound4
            }
            _ => MessageKind::Pi3TerminalAfterRound2,
        };
        let mut r = state_reader(WHAT, &params, state, kind)?;
        let (threshold, state) = if kind == MessageKind::Pi3TerminalAfterRound4 {
            let raw = r.take(
                CIRCUIT_OUTPUTS * OutputLabels::BYTES_PER_OUTPUT,
                "output labels",
            )?;
            let outputs = OutputLabels::from_bytes(raw, CIRCUIT_OUTPUTS)
                .map_err(|e| r.error(format!("output labels: {e}")))?;
            (0, TerminalState::AwaitingRound5 { outputs })
        } else {
            let threshold = to_i64("threshold", &r.signed(8, "threshold")?)?;
            check_session_params(&params, Protocol::Pi3, threshold)?;
            let ranges = SecretRanges::of(params.layout());
            let a = r.bounded(&ranges.a.0, &ranges.a.1, "a")?;
            let b = r.bounded(&ranges.b.0, &ranges.b.1, "b")?;
            let pad = r.bounded(&ranges.pad.0, &ranges.pad.1, "pad")?;
            let session = r.take(OT_SESSION_BYTES, "OT session id")?.to_vec();
            let secrets = TerminalSecrets { a, b, pad };
            (
                threshold,
                TerminalState::AwaitingRound3 { secrets, session },
            )
        };
        r.finish()?;
        Ok(Self {
            params,
            w: Vec::new(),
            threshold,
            state,
            precomputed: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::{key_2048, small_key};
    use super::super::messages::template_signing_bytes;
    use super::super::messages::test_support::{clone_key, dot, random_vector};
    use super::super::params::DEFAULT_STAT_BITS;
    use super::super::pi2::{encrypt_elements, pack_element_ciphertexts};
    use super::*;
    use crate::paillier::garble::Label;
    use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn params(dim: usize, m: u32, bits: u32) -> Params {
        Params::new_allowing_test_modulus(
            Protocol::Pi3,
            dim,
            m,
            bits,
            DEFAULT_STAT_BITS,
            Params::max_norm_bound(dim, m),
        )
        .unwrap()
    }

    fn sp_key() -> SigningKey {
        SigningKey::from_bytes(&[9u8; 32])
    }

    fn verifier(sp: &SigningKey) -> impl Fn(&[u8], &[u8]) -> bool {
        let vk = sp.verifying_key();
        move |msg: &[u8], sig: &[u8]| {
            Signature::from_slice(sig)
                .map(|s| vk.verify(msg, &s).is_ok())
                .unwrap_or(false)
        }
    }

    fn enrol(params: &Params, sk: &SecretKey, u: &[i32], rng: &mut ChaCha20Rng) -> Pi3Device {
        let elements = encrypt_elements(sk, params, u, rng).unwrap();
        let packed = pack_element_ciphertexts(sk.public_key(), params, &elements).unwrap();
        let sig = sp_key().sign(&template_signing_bytes(params, sk.public_key(), &packed));
        Pi3Device::new(
            params.clone(),
            clone_key(sk),
            packed,
            sig.to_bytes().to_vec(),
        )
        .unwrap()
    }

    /// With the terminal's offline tables of the Round 1 template: both outputs equal the
    /// plaintext comparison at IP − 1, IP, IP + 1.
    #[test]
    fn sessions_with_offline_tables_equal_the_plaintext_comparison() {
        let mut rng = ChaCha20Rng::seed_from_u64(303);
        let (dim, m) = (12, 16);
        let p = params(dim, m, 1024);
        let sk = small_key();
        for i in 0..9 {
            let u = random_vector(dim, m, &mut rng);
            let device = enrol(&p, sk, &u, &mut rng);
            let round1 = Pi2Round1::from_bytes(&p, &device.round1()).unwrap();
            let tables = PrecomputedTemplate::new(sk.public_key(), p.layout(), &round1.template);
            let w = random_vector(dim, m, &mut rng);
            let ip = dot(&u, &w);
            let threshold = ip - 1 + (i % 3);
            let t = Pi3Terminal::new(p.clone(), w, threshold)
                .unwrap()
                .with_precomputed(Arc::new(tables.unwrap()));
            let (out, d) = run_terminal(&device, t, &mut rng);
            assert_eq!(out, ip >= threshold);
            assert_eq!(d, ip >= threshold);
        }
    }

    /// One honest run: (T's output, D's output).
    fn run(device: &Pi3Device, w: &[i32], threshold: i64, rng: &mut ChaCha20Rng) -> (bool, bool) {
        let t = Pi3Terminal::new(device.inner.params().clone(), w.to_vec(), threshold).unwrap();
        run_terminal(device, t, rng)
    }

    /// One honest run with terminal `t`: (T's output, D's output).
    fn run_terminal(device: &Pi3Device, mut t: Pi3Terminal, rng: &mut ChaCha20Rng) -> (bool, bool) {
        let r2 = t
            .round2(&device.round1(), &verifier(&sp_key()), rng)
            .unwrap();
        let mut s = device.session();
        let r3 = s.round3(&r2, rng).unwrap();
        let r4 = t.round4(&r3, rng).unwrap();
        let (r5, d) = s.round5(&r4).unwrap();
        let out = t.finish(&r5).unwrap();
        assert_eq!(t.outcome(), Some(out));
        assert_eq!(s.outcome(), Some(d));
        (out, d)
    }

    /// 1,200 sessions (3 shapes × 20 devices × 5 captures × 4 thresholds: IP, IP ± 1, random)
    /// at 1024 bits: both outputs equal the plaintext comparison.
    #[test]
    fn outputs_equal_the_plaintext_comparison_on_random_pairs() {
        let sk = small_key();
        let mut rng = ChaCha20Rng::seed_from_u64(300);
        for (dim, m) in [(8usize, 8u32), (16, 12), (5, 16)] {
            let p = params(dim, m, 1024);
            for _ in 0..20 {
                let u = random_vector(dim, m, &mut rng);
                let device = enrol(&p, sk, &u, &mut rng);
                for _ in 0..5 {
                    let w = random_vector(dim, m, &mut rng);
                    let ip = dot(&u, &w);
                    let random_t = (rng.next_u64() % 2001) as i64 - 1000;
                    for threshold in [ip, ip - 1, ip + 1, random_t] {
                        let (t_out, d_out) = run(&device, &w, threshold, &mut rng);
                        assert_eq!(t_out, ip >= threshold, "IP {ip}, threshold {threshold}");
                        assert_eq!(d_out, t_out);
                    }
                }
            }
        }
    }

    #[test]
    fn extreme_templates_at_2048_bits() {
        let sk = key_2048();
        let mut rng = ChaCha20Rng::seed_from_u64(301);
        let p = params(256, 16, 2048);
        let u = random_vector(256, 16, &mut rng);
        let device = enrol(&p, sk, &u, &mut rng);
        let w = random_vector(256, 16, &mut rng);
        let ip = dot(&u, &w);
        for threshold in [ip, ip + 1] {
            assert_eq!(run(&device, &w, threshold, &mut rng).0, ip >= threshold);
        }
        // Extremes: every element at the most negative value.
        let p = params(16, 16, 2048);
        let low = vec![-(1i32 << 15); 16];
        let device = enrol(&p, sk, &low, &mut rng);
        let ip = dot(&low, &low);
        // IP = ζ², the largest possible, and IP = −ζ², the smallest.
        assert!(run(&device, &low, ip, &mut rng).0);
        let high: Vec<i32> = low.iter().map(|&v| -(v + 1)).collect();
        let ip = dot(&low, &high);
        assert!(run(&device, &high, ip, &mut rng).0);
        assert!(!run(&device, &high, ip + 1, &mut rng).0);
    }

    /// Suspended after Round 2 and again after Round 4 and resumed from the bytes each time,
    /// the terminal answers exactly as the one that stayed in memory (same randomness: same
    /// Round 2, same garbled Round 4, same output), on random pairs including IP = T, T ± 1,
    /// and catches a forged output label the same way.
    #[test]
    fn a_suspended_terminal_gives_the_in_memory_outcome() {
        let sk = small_key();
        let mut rng = ChaCha20Rng::seed_from_u64(305);
        let verify = verifier(&sp_key());
        for (dim, m) in [(8usize, 8u32), (5, 16)] {
            let p = params(dim, m, 1024);
            for _ in 0..3 {
                let u = random_vector(dim, m, &mut rng);
                let device = enrol(&p, sk, &u, &mut rng);
                let r1 = device.round1();
                for _ in 0..3 {
                    let w = random_vector(dim, m, &mut rng);
                    let ip = dot(&u, &w);
                    let random_t = (rng.next_u64() % 2001) as i64 - 1000;
                    for threshold in [ip, ip - 1, ip + 1, random_t] {
                        let seeds = [rng.next_u64(), rng.next_u64()];
                        let same = |i: usize| ChaCha20Rng::seed_from_u64(seeds[i]);
                        let mut kept = Pi3Terminal::new(p.clone(), w.clone(), threshold).unwrap();
                        let mut paused = Pi3Terminal::new(p.clone(), w.clone(), threshold).unwrap();
                        let r2 = kept.round2(&r1, &verify, &mut same(0)).unwrap();
                        assert_eq!(paused.round2(&r1, &verify, &mut same(0)).unwrap(), r2);
                        let after2 = paused.suspend().unwrap();
                        let mut paused = Pi3Terminal::resume(p.clone(), &after2).unwrap();
                        assert!(paused.suspend().unwrap() == after2, "suspends the same");
                        let mut s = device.session();
                        let r3 = s.round3(&r2, &mut rng).unwrap();
                        let r4 = kept.round4(&r3, &mut same(1)).unwrap();
                        assert_eq!(paused.round4(&r3, &mut same(1)).unwrap(), r4);
                        let after4 = paused.suspend().unwrap();
                        assert_eq!(after4.len(), 2 + 64 + 16);
                        let (r5, d) = s.round5(&r4).unwrap();
                        let mut forged = Pi3Round5::from_bytes(&r5).unwrap();
                        forged.labels[MATCH_CHECK_MATCHED] = Label::from_bytes([0x5a; 16]);
                        let mut cheated = Pi3Terminal::resume(p.clone(), &after4).unwrap();
                        assert!(matches!(
                            cheated.finish(&forged.to_bytes()),
                            Err(MatchError::Cheating(_))
                        ));
                        let mut paused = Pi3Terminal::resume(p.clone(), &after4).unwrap();
                        let out = kept.finish(&r5).unwrap();
                        assert_eq!(paused.finish(&r5).unwrap(), out);
                        assert_eq!(out, ip >= threshold, "IP {ip}, T {threshold}");
                        assert_eq!(d, out);
                        assert!(matches!(paused.suspend(), Err(MatchError::State(_))));
                    }
                }
            }
        }
    }

    /// Both suspended states decode strictly: every truncation, an extension, every
    /// single-bit change, other parameters, a state of the other stage's kind with values out
    /// of range, and a suspend at the wrong stage are clean errors; Debug shows no secret.
    #[test]
    fn suspended_states_are_strict_and_secret() {
        let sk = small_key();
        let mut rng = ChaCha20Rng::seed_from_u64(306);
        let p = params(8, 8, 1024);
        let u = random_vector(8, 8, &mut rng);
        let device = enrol(&p, sk, &u, &mut rng);
        let threshold = 4321;
        let mut t = Pi3Terminal::new(p.clone(), u.clone(), threshold).unwrap();
        assert!(matches!(t.suspend(), Err(MatchError::State(_))));
        let r2 = t
            .round2(&device.round1(), &verifier(&sp_key()), &mut rng)
            .unwrap();
        let after2 = t.suspend().unwrap();
        let (a, b, pad) = match &t.state {
            TerminalState::AwaitingRound3 { secrets, .. } => {
                (secrets.a.clone(), secrets.b.clone(), secrets.pad.clone())
            }
            _ => unreachable!(),
        };
        let shown = format!("{t:?}");
        for secret in [&a, &b, &pad] {
            assert!(!shown.contains(&secret.to_string()), "{shown}");
        }
        assert!(!shown.contains(&threshold.to_string()), "{shown}");
        let mut s = device.session();
        let r3 = s.round3(&r2, &mut rng).unwrap();
        t.round4(&r3, &mut rng).unwrap();
        let after4 = t.suspend().unwrap();
        let other = Params::new_allowing_test_modulus(
            Protocol::Pi3,
            8,
            8,
            1024,
            DEFAULT_STAT_BITS,
            Params::max_norm_bound(8, 8) - 1u32,
        )
        .unwrap();
        for state in [&after2, &after4] {
            assert!(Pi3Terminal::resume(p.clone(), state).is_ok());
            for len in 0..state.len() {
                let e = Pi3Terminal::resume(p.clone(), &state[..len]).unwrap_err();
                assert!(matches!(e, MatchError::Wire { .. }), "{len}: {e}");
            }
            let mut longer = state.to_vec();
            longer.push(0);
            assert!(Pi3Terminal::resume(p.clone(), &longer).is_err());
            for bit in 0..state.len() * 8 {
                let mut b = state.to_vec();
                b[bit / 8] ^= 1 << (bit % 8);
                assert!(Pi3Terminal::resume(p.clone(), &b).is_err(), "bit {bit}");
            }
            assert!(Pi3Terminal::resume(other.clone(), state).is_err());
        }
        // Well-formed states with values the terminal never draws.
        let forge = |threshold: i64, a: &Integer, b: &Integer, pad: &Integer| {
            let mut out = begin_state(MessageKind::Pi3TerminalAfterRound2);
            for x in [&Integer::from(threshold), a, b, pad] {
                put_signed(&mut out, x);
            }
            out.extend_from_slice(&[7u8; OT_SESSION_BYTES]);
            end_state(&p, out)
        };
        assert!(Pi3Terminal::resume(p.clone(), &forge(threshold, &a, &b, &pad)).is_ok());
        let ranges = SecretRanges::of(p.layout());
        let below = |x: &Integer| (x - 1u32).complete();
        for (a2, b2, pad2) in [
            (Integer::new(), b.clone(), pad.clone()),
            (ranges.a.1.clone(), b.clone(), pad.clone()),
            (a.clone(), below(&ranges.b.0), pad.clone()),
            (a.clone(), ranges.b.1.clone(), pad.clone()),
            (a.clone(), b.clone(), below(&ranges.pad.0)),
            (a.clone(), b.clone(), ranges.pad.1.clone()),
        ] {
            assert!(Pi3Terminal::resume(p.clone(), &forge(threshold, &a2, &b2, &pad2)).is_err());
        }
        assert!(Pi3Terminal::resume(p.clone(), &forge(i64::MIN, &a, &b, &pad)).is_err());
        // Output labels that are not (W⁰, W⁰ ⊕ Δ) pairs, with a valid check value.
        let mut out = begin_state(MessageKind::Pi3TerminalAfterRound4);
        out.extend_from_slice(&[3u8; 64]);
        assert!(Pi3Terminal::resume(p.clone(), &end_state(&p, out)).is_err());
    }

    /// A device that feeds the circuit other values than the ones it decrypted (X + δ, or Y
    /// changed) is caught by valid = 0; a wrong output label is caught by T's decoding.
    #[test]
    fn a_cheating_device_is_caught() {
        let sk = small_key();
        let mut rng = ChaCha20Rng::seed_from_u64(302);
        let p = params(8, 8, 1024);
        let u = random_vector(8, 8, &mut rng);
        let device = enrol(&p, sk, &u, &mut rng);
        let w = random_vector(8, 8, &mut rng);
        let ip = dot(&u, &w);
        let widths = circuit_widths(p.layout()).unwrap();
        for (dx, dy) in [(1i64, 0i64), (-1, 0), (0, 1), (1000, 0), (1, 1), (0, -1)] {
            let mut t = Pi3Terminal::new(p.clone(), w.clone(), ip).unwrap();
            let r2 = t
                .round2(&device.round1(), &verifier(&sp_key()), &mut rng)
                .unwrap();
            // The device's side, by hand, with shifted inputs.
            let msg = Pi3Round2::from_bytes(sk.public_key(), &r2).unwrap();
            let x = decode_sum(sk, p.layout(), &msg.x).unwrap() + dx;
            let y = decode_sum(sk, p.layout(), &msg.y).unwrap() + dy;
            let choices = device_input_bits(&widths, &x, &y).unwrap();
            let c = circuit(&p, ip).unwrap();
            let (receiver, request) = OtReceiver::new(&ot_session(&r2), &choices, &mut rng);
            let r4 = t
                .round4(&Pi3Round3 { ot: request }.to_bytes(), &mut rng)
                .unwrap();
            let m4 = Pi3Round4::from_bytes(&c, &r4).unwrap();
            let labels = receiver.finish(&m4.ot).unwrap();
            let out = evaluate(&c, &m4.circuit, &m4.garbler_labels, &labels).unwrap();
            let err = t.finish(&Pi3Round5 { labels: out }.to_bytes()).unwrap_err();
            assert!(
                matches!(err, MatchError::Cheating(_)),
                "shift ({dx}, {dy}): {err}"
            );
            assert_eq!(t.outcome(), None);
        }
        // Honest evaluation, but a forged output label.
        let mut t = Pi3Terminal::new(p.clone(), w.clone(), ip).unwrap();
        let r2 = t
            .round2(&device.round1(), &verifier(&sp_key()), &mut rng)
            .unwrap();
        let mut s = device.session();
        let r3 = s.round3(&r2, &mut rng).unwrap();
        let r4 = t.round4(&r3, &mut rng).unwrap();
        let (r5, _) = s.round5(&r4).unwrap();
        let mut forged = Pi3Round5::from_bytes(&r5).unwrap();
        forged.labels[1] = Label::from_bytes([0x5a; 16]);
        let err = t.finish(&forged.to_bytes()).unwrap_err();
        assert!(matches!(err, MatchError::Cheating(_)), "{err}");
    }

    #[test]
    fn tampered_or_out_of_order_messages_are_refused() {
        let sk = small_key();
        let mut rng = ChaCha20Rng::seed_from_u64(303);
        let p = params(8, 8, 1024);
        let u = random_vector(8, 8, &mut rng);
        let device = enrol(&p, sk, &u, &mut rng);
        let w = random_vector(8, 8, &mut rng);
        // Another service provider's key.
        let other = SigningKey::from_bytes(&[1u8; 32]);
        let mut t = Pi3Terminal::new(p.clone(), w.clone(), 0).unwrap();
        assert_eq!(
            t.round2(&device.round1(), &verifier(&other), &mut rng),
            Err(MatchError::Signature)
        );
        // A truncated round 1; out-of-order calls.
        let mut t = Pi3Terminal::new(p.clone(), w.clone(), 0).unwrap();
        let r1 = device.round1();
        assert!(t
            .round2(&r1[..r1.len() - 1], &verifier(&sp_key()), &mut rng)
            .is_err());
        assert!(t.round4(&[1, 0x33], &mut rng).is_err());
        let r2 = t.round2(&r1, &verifier(&sp_key()), &mut rng).unwrap();
        let mut s = device.session();
        assert!(s.round5(&[1, 0x34]).is_err());
        assert!(s.round3(&r2[..r2.len() - 3], &mut rng).is_err());
        let mut s = device.session();
        let r3 = s.round3(&r2, &mut rng).unwrap();
        assert!(s.round3(&r2, &mut rng).is_err());
        // A round 3 with a different number of OTs.
        let mut t2 = Pi3Terminal::new(p.clone(), w.clone(), 0).unwrap();
        t2.round2(&r1, &verifier(&sp_key()), &mut rng).unwrap();
        let (_, short) = OtReceiver::new(b"x", &[true; 3], &mut rng);
        assert!(t2
            .round4(&Pi3Round3 { ot: short }.to_bytes(), &mut rng)
            .is_err());
        // A flipped byte in the garbled circuit: an error or a detected label, never a wrong
        // accepted answer.
        let mut r4 = t.round4(&r3, &mut rng).unwrap();
        r4[100] ^= 0x01;
        if let Ok((r5, _)) = s.round5(&r4) {
            let ip = dot(&u, &w);
            match t.finish(&r5) {
                Ok(out) => assert_eq!(out, ip >= 0),
                Err(e) => assert!(matches!(e, MatchError::Cheating(_)), "{e}"),
            }
        }
        // Wrong parameters for the protocol.
        let p2 = Params::new_allowing_test_modulus(
            Protocol::Pi2,
            8,
            8,
            1024,
            DEFAULT_STAT_BITS,
            Params::max_norm_bound(8, 8),
        )
        .unwrap();
        assert!(Pi3Terminal::new(p2, w, 0).is_err());
    }
}
