//! # Garbled circuits: half-gates with free-XOR over fixed-key AES
//!
//! Garbling of a [`Circuit`] for protocol Π3 of [ABMR20] (the terminal garbles, the device
//! evaluates and returns the output labels, the terminal decodes them):
//!
//! * **Free-XOR** (Kolesnikov, Schneider, ICALP 2008): a global secret Δ with lsb 1; wire w
//!   has labels W⁰ and W¹ = W⁰ ⊕ Δ. An XOR gate's zero-label is the XOR of its inputs'
//!   zero-labels; a NOT gate's is its input's zero-label ⊕ Δ (free inversion: the evaluator
//!   keeps the label it has). Neither costs a ciphertext.
//! * **Half-gates** (Zahur, Rosulek, Evans, "Two Halves Make a Whole", EUROCRYPT 2015,
//!   ePrint 2014/756, Fig. 2): an AND gate is a garbler half-gate plus an evaluator half-gate,
//!   two 16-byte ciphertexts (T_G, T_E) in all. Point-and-permute uses the lsb of a label
//!   (the permute bit p = lsb(W⁰); lsb(Δ) = 1 makes the two labels' lsbs differ).
//! * **Hash**: the tweakable circular-correlation-robust hash of Guo, Katz, Wang, Yu,
//!   "Efficient and Secure Multiparty Computation from Fixed-Key Block Ciphers", IEEE S&P
//!   2020, ePrint 2019/074 (their MMO-style construction with a linear orthomorphism σ):
//!   `H(x, i) = π(σ(x) ⊕ i) ⊕ σ(x)`, σ(x_L ‖ x_R) = (x_L ⊕ x_R) ‖ x_L (linear, and
//!   x ↦ σ(x) ⊕ x is also a permutation), π = AES-128 under the public key
//!   [`crate::crypto::fss::aes::FIXED_KEY`] ([`fixed_encrypt`], AES-NI/VAES where available).
//!   AND gate k uses the tweaks i = 2k (garbler half) and 2k + 1 (evaluator half).
//!
//! ## Domain separation from the FSS PRG
//!
//! The FSS PRG uses the same permutation π, as π(s ⊕ c) ⊕ s ⊕ c with three fixed 128-bit
//! tweaks c (hex digits of π). Here every tweak carries the constant [`TWEAK_DOMAIN`] in its
//! high 64 bits and the gate index in the low 64, so the two constructions never use the same
//! tweak; in the random-permutation model, with the hashed values uniformly random and secret
//! (seeds there, labels here), queries of one never help an adversary against the other.
//!
//! ## What the parties hold
//!
//! [`garble`] returns the public [`GarbledCircuit`] (2 blocks per AND gate, flat) and the
//! garbler's [`GarblerSecrets`] (Δ, the zero-labels of inputs and outputs). The evaluator gets
//! the garbler's input labels directly and its own by OT ([`GarblerSecrets::evaluator_label_pairs`]
//! are the OT sender's pairs, see [`crate::paillier::ot`]), runs [`evaluate`] and sends the
//! output labels back. [`GarblerSecrets::decode_output`] maps each to its bit and **rejects**
//! any label that is neither W⁰ nor W¹ of its output wire: without Δ the evaluator cannot
//! produce the other valid label (authenticity of garbled circuits), so a rejected label means
//! a cheating evaluator. The evaluator may learn its output bits through
//! [`OutputDecoding`] (the permute bits of the outputs), which the garbler sends only if the
//! protocol lets the evaluator learn the output (Π3, Round 5: "D learns the output bit y").
//!
//! [ABMR20]: https://eprint.iacr.org/2020/1363

use rand_core::{CryptoRng, RngCore};
use thiserror::Error;
use zeroize::Zeroize;

use super::circuit::{Circuit, Gate};
use crate::crypto::fss::aes::fixed_encrypt;

/// The high 64 bits of every hash tweak: ASCII "GChalfgt" (little-endian), separating the
/// garbling's queries to π from the FSS PRG's (see the module docs).
pub const TWEAK_DOMAIN: u64 = u64::from_le_bytes(*b"GChalfgt");

/// A wire label: 16 bytes (a little-endian `u128`). Its lsb is the point-and-permute bit.
/// `Debug` does not print the value (a garbler's zero-label is secret).
#[derive(Clone, Copy, PartialEq, Eq, Default, Zeroize)]
pub struct Label(u128);

impl std::fmt::Debug for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Label(..)")
    }
}

impl Label {
    /// Size of a label in bytes.
    pub const BYTES: usize = 16;

    /// The label with these 16 bytes (little-endian).
    pub fn from_bytes(bytes: [u8; 16]) -> Label {
        Label(u128::from_le_bytes(bytes))
    }

    /// The 16 bytes of the label (little-endian).
    pub fn to_bytes(&self) -> [u8; 16] {
        self.0.to_le_bytes()
    }

    /// The point-and-permute bit (lsb).
    pub fn permute_bit(&self) -> bool {
        self.0 & 1 == 1
    }

    /// The label as a little-endian `u128` (for the OT's one-time pad).
    pub(crate) fn as_u128(&self) -> u128 {
        self.0
    }

    /// The label from a little-endian `u128`.
    pub(crate) fn from_u128(v: u128) -> Label {
        Label(v)
    }
}

/// Concatenated label bytes (16 per label), e.g. the garbler's input labels or the output
/// labels the evaluator returns.
pub fn labels_to_bytes(labels: &[Label]) -> Vec<u8> {
    labels.iter().flat_map(|l| l.to_bytes()).collect()
}

/// Parses exactly `count` labels from their concatenated bytes; any other length is
/// [`GarbleError::Length`].
pub fn labels_from_bytes(bytes: &[u8], count: usize) -> Result<Vec<Label>, GarbleError> {
    let expected = count.checked_mul(Label::BYTES);
    if expected != Some(bytes.len()) {
        return Err(GarbleError::Length {
            what: "labels",
            expected: expected.unwrap_or(usize::MAX),
            got: bytes.len(),
        });
    }
    Ok(bytes
        .chunks_exact(Label::BYTES)
        .map(|c| {
            let mut b = [0u8; 16];
            b.copy_from_slice(c);
            Label::from_bytes(b)
        })
        .collect())
}

/// What can go wrong garbling, evaluating or decoding.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum GarbleError {
    /// The wrong number of input bits or labels for one party.
    #[error("{party} input: expected {expected}, got {got}")]
    InputCount {
        /// "garbler" or "evaluator".
        party: &'static str,
        /// What the circuit takes.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// The wrong number of output labels or bits.
    #[error("expected {expected} outputs, got {got}")]
    OutputCount {
        /// Outputs of the circuit.
        expected: usize,
        /// Given.
        got: usize,
    },
    /// An output label is neither of its wire's two labels: the evaluator cheated (or the
    /// garbled circuit or its inputs were corrupted).
    #[error("output {index}: the label is not a valid label of that output wire")]
    InvalidOutputLabel {
        /// The output index.
        index: usize,
    },
    /// A byte string has the wrong length for what it must encode.
    #[error("{what}: expected {expected} bytes, got {got}")]
    Length {
        /// What was parsed.
        what: &'static str,
        /// Bytes it must have.
        expected: usize,
        /// Bytes it had.
        got: usize,
    },
    /// A byte of an output decoding is neither 0 nor 1.
    #[error("output decoding byte {index} is not 0 or 1")]
    BadDecodingByte {
        /// Its index.
        index: usize,
    },
    /// Stored output labels whose two labels of output `index` do not differ by the one Δ
    /// (lsb 1) that free-XOR gives every wire: not what [`GarblerSecrets::output_labels`]
    /// wrote.
    #[error("output {index}: the two labels do not differ by the garbling's Δ")]
    BadOutputPair {
        /// The output index.
        index: usize,
    },
}

/// The public garbled tables: for AND gate k (in circuit order), blocks 2k = T_G and
/// 2k + 1 = T_E of [ZRE15] Fig. 2.
///
/// [ZRE15]: https://eprint.iacr.org/2014/756
#[derive(Clone, PartialEq, Eq)]
pub struct GarbledCircuit {
    tables: Vec<u128>,
}

impl std::fmt::Debug for GarbledCircuit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GarbledCircuit({} AND gates)", self.and_gates())
    }
}

impl GarbledCircuit {
    /// Number of AND gates the tables are for.
    pub fn and_gates(&self) -> usize {
        self.tables.len() / 2
    }

    /// Size in bytes of the garbled tables of `circuit`: 32 per AND gate.
    pub fn byte_len(circuit: &Circuit) -> usize {
        circuit.and_count() * 2 * Label::BYTES
    }

    /// Canonical bytes: the blocks in order, 16 little-endian bytes each.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.tables.iter().flat_map(|b| b.to_le_bytes()).collect()
    }

    /// Parses the tables for `circuit`; any length other than [`GarbledCircuit::byte_len`]
    /// is [`GarbleError::Length`].
    pub fn from_bytes(circuit: &Circuit, bytes: &[u8]) -> Result<GarbledCircuit, GarbleError> {
        let expected = Self::byte_len(circuit);
        if bytes.len() != expected {
            return Err(GarbleError::Length {
                what: "garbled circuit",
                expected,
                got: bytes.len(),
            });
        }
        let tables = bytes
            .chunks_exact(16)
            .map(|c| {
                let mut b = [0u8; 16];
                b.copy_from_slice(c);
                u128::from_le_bytes(b)
            })
            .collect();
        Ok(GarbledCircuit { tables })
    }
}

/// The garbler's secrets for one garbling: Δ and the zero-labels of the input and output
/// wires. Zeroized on drop. `Debug` prints only sizes.
pub struct GarblerSecrets {
    delta: u128,
    garbler_zero: Vec<u128>,
    evaluator_zero: Vec<u128>,
    output_zero: Vec<u128>,
}

impl Drop for GarblerSecrets {
    fn drop(&mut self) {
        self.delta.zeroize();
        self.garbler_zero.zeroize();
        self.evaluator_zero.zeroize();
        self.output_zero.zeroize();
    }
}

impl std::fmt::Debug for GarblerSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GarblerSecrets({} garbler, {} evaluator inputs, {} outputs)",
            self.garbler_zero.len(),
            self.evaluator_zero.len(),
            self.output_zero.len()
        )
    }
}

/// `0` for false, all ones for true: selects a block without branching on a secret bit.
#[inline(always)]
fn mask(bit: bool) -> u128 {
    0u128.wrapping_sub(u128::from(bit))
}

impl GarblerSecrets {
    /// The labels encoding the garbler's input `bits` (W⁰ ⊕ bit·Δ per wire), to send to the
    /// evaluator. [`GarbleError::InputCount`] unless there is one bit per garbler input.
    pub fn garbler_input_labels(&self, bits: &[bool]) -> Result<Vec<Label>, GarbleError> {
        encode(&self.garbler_zero, self.delta, bits, "garbler")
    }

    /// The labels encoding evaluator input `bits`: what the evaluator obtains by OT; for tests
    /// and for a garbler that evaluates locally.
    pub fn evaluator_input_labels(&self, bits: &[bool]) -> Result<Vec<Label>, GarbleError> {
        encode(&self.evaluator_zero, self.delta, bits, "evaluator")
    }

    /// The (label of 0, label of 1) pair of every evaluator input bit, in input order: the OT
    /// sender's messages.
    pub fn evaluator_label_pairs(&self) -> Vec<(Label, Label)> {
        self.evaluator_zero
            .iter()
            .map(|&w| (Label(w), Label(w ^ self.delta)))
            .collect()
    }

    /// Decodes the evaluator's output labels: output i is 0 if its label is W⁰ of output wire
    /// i, 1 if it is W⁰ ⊕ Δ, and [`GarbleError::InvalidOutputLabel`] naming i otherwise (a
    /// label the evaluator could not have computed honestly).
    pub fn decode_output(&self, labels: &[Label]) -> Result<Vec<bool>, GarbleError> {
        decode_output_labels(&self.output_zero, self.delta, labels)
    }

    /// The two labels of every output wire: what a garbler keeps after sending the circuit
    /// when it only has to check and decode the evaluator's answer ([`OutputLabels`]), so that
    /// Δ's other uses (the input labels) need not outlive the garbling.
    pub fn output_labels(&self) -> OutputLabels {
        OutputLabels {
            delta: self.delta,
            zero: self.output_zero.clone(),
        }
    }

    /// The public output decoding (the permute bit of each output's zero-label), which lets
    /// the evaluator read its output bits from its labels. Reveals the outputs and nothing
    /// else; send it only where the evaluator may learn them.
    pub fn output_decoding(&self) -> OutputDecoding {
        OutputDecoding {
            permute: self.output_zero.iter().map(|&w| w & 1 == 1).collect(),
        }
    }
}

/// Output i is 0 if `labels[i]` is W⁰ = `zero[i]`, 1 if it is W⁰ ⊕ Δ, and
/// [`GarbleError::InvalidOutputLabel`] naming i otherwise.
fn decode_output_labels(
    zero: &[u128],
    delta: u128,
    labels: &[Label],
) -> Result<Vec<bool>, GarbleError> {
    if labels.len() != zero.len() {
        return Err(GarbleError::OutputCount {
            expected: zero.len(),
            got: labels.len(),
        });
    }
    let mut out = Vec::with_capacity(labels.len());
    for (index, (l, &w0)) in labels.iter().zip(zero.iter()).enumerate() {
        let d = l.0 ^ w0;
        if d == 0 {
            out.push(false);
        } else if d == delta {
            out.push(true);
        } else {
            return Err(GarbleError::InvalidOutputLabel { index });
        }
    }
    Ok(out)
}

/// The two labels (W⁰, W⁰ ⊕ Δ) of every output wire of one garbling
/// ([`GarblerSecrets::output_labels`]): all the garbler needs to check and decode the
/// evaluator's output labels after it sent the circuit ([ABMR20] Fig. 5 "Output
/// Computation"). Secret (either label of an output would let an evaluator forge that
/// output), zeroized on drop; `Debug` prints the count only. Its byte form is for a garbler
/// that keeps it between rounds outside memory.
///
/// [ABMR20]: https://eprint.iacr.org/2020/1363
pub struct OutputLabels {
    delta: u128,
    zero: Vec<u128>,
}

impl Drop for OutputLabels {
    fn drop(&mut self) {
        self.delta.zeroize();
        self.zero.zeroize();
    }
}

impl std::fmt::Debug for OutputLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OutputLabels({} outputs)", self.zero.len())
    }
}

impl OutputLabels {
    /// Bytes per output in [`Self::to_bytes`]: its two labels.
    pub const BYTES_PER_OUTPUT: usize = 2 * Label::BYTES;

    /// The same check and decoding as [`GarblerSecrets::decode_output`].
    pub fn decode(&self, labels: &[Label]) -> Result<Vec<bool>, GarbleError> {
        decode_output_labels(&self.zero, self.delta, labels)
    }

    /// Number of outputs.
    pub fn outputs(&self) -> usize {
        self.zero.len()
    }

    /// `W⁰ ‖ W¹` of each output in order, 16 bytes each (little-endian), zeroized on drop.
    pub fn to_bytes(&self) -> zeroize::Zeroizing<Vec<u8>> {
        let mut out =
            zeroize::Zeroizing::new(Vec::with_capacity(self.zero.len() * Self::BYTES_PER_OUTPUT));
        for &w in &self.zero {
            out.extend_from_slice(&w.to_le_bytes());
            out.extend_from_slice(&(w ^ self.delta).to_le_bytes());
        }
        out
    }

    /// Strict decoding of [`Self::to_bytes`] for `count` outputs: exactly
    /// `count · BYTES_PER_OUTPUT` bytes ([`GarbleError::Length`]), and the two labels of every
    /// output differing by the same Δ with lsb 1 ([`GarbleError::BadOutputPair`]), as free-XOR
    /// garbling makes them.
    pub fn from_bytes(bytes: &[u8], count: usize) -> Result<OutputLabels, GarbleError> {
        let expected = count.checked_mul(Self::BYTES_PER_OUTPUT);
        if count == 0 || expected != Some(bytes.len()) {
            return Err(GarbleError::Length {
                what: "output labels",
                expected: expected.unwrap_or(usize::MAX),
                got: bytes.len(),
            });
        }
        let word = |chunk: &[u8]| {
            let mut b = [0u8; 16];
            b.copy_from_slice(chunk);
            let v = u128::from_le_bytes(b);
            b.zeroize();
            v
        };
        let mut labels = OutputLabels {
            delta: 0,
            zero: Vec::with_capacity(count),
        };
        for (index, pair) in bytes.chunks_exact(Self::BYTES_PER_OUTPUT).enumerate() {
            let w0 = word(&pair[..Label::BYTES]);
            let d = w0 ^ word(&pair[Label::BYTES..]);
            if index == 0 {
                labels.delta = d;
            }
            if d & 1 != 1 || d != labels.delta {
                return Err(GarbleError::BadOutputPair { index });
            }
            labels.zero.push(w0);
        }
        Ok(labels)
    }
}

fn encode(
    zero: &[u128],
    delta: u128,
    bits: &[bool],
    party: &'static str,
) -> Result<Vec<Label>, GarbleError> {
    if bits.len() != zero.len() {
        return Err(GarbleError::InputCount {
            party,
            expected: zero.len(),
            got: bits.len(),
        });
    }
    Ok(zero
        .iter()
        .zip(bits)
        .map(|(&w, &b)| Label(w ^ (mask(b) & delta)))
        .collect())
}

/// The permute bits of the output wires: output i = lsb(label_i) ⊕ permute_i. Public.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputDecoding {
    permute: Vec<bool>,
}

impl OutputDecoding {
    /// The output bits the labels encode (if they are valid labels; this cannot check that,
    /// only the garbler can, with [`GarblerSecrets::decode_output`]).
    pub fn decode(&self, labels: &[Label]) -> Result<Vec<bool>, GarbleError> {
        if labels.len() != self.permute.len() {
            return Err(GarbleError::OutputCount {
                expected: self.permute.len(),
                got: labels.len(),
            });
        }
        Ok(labels
            .iter()
            .zip(&self.permute)
            .map(|(l, &p)| l.permute_bit() ^ p)
            .collect())
    }

    /// One byte (0 or 1) per output.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.permute.iter().map(|&b| u8::from(b)).collect()
    }

    /// Parses the decoding of `circuit`'s outputs: exactly one byte, 0 or 1, per output.
    pub fn from_bytes(circuit: &Circuit, bytes: &[u8]) -> Result<OutputDecoding, GarbleError> {
        if bytes.len() != circuit.outputs().len() {
            return Err(GarbleError::Length {
                what: "output decoding",
                expected: circuit.outputs().len(),
                got: bytes.len(),
            });
        }
        let mut permute = Vec::with_capacity(bytes.len());
        for (index, &b) in bytes.iter().enumerate() {
            permute.push(match b {
                0 => false,
                1 => true,
                _ => return Err(GarbleError::BadDecodingByte { index }),
            });
        }
        Ok(OutputDecoding { permute })
    }
}

/// σ(x_L ‖ x_R) = (x_L ⊕ x_R) ‖ x_L with x_L the high 64 bits: the linear orthomorphism of
/// Guo–Katz–Wang–Yu (ePrint 2019/074).
#[inline(always)]
fn sigma(x: u128) -> u128 {
    let hi = x >> 64;
    let lo = x & u128::from(u64::MAX);
    ((hi ^ lo) << 64) | hi
}

/// The tweak of hash number `j` (2k and 2k + 1 for AND gate k).
#[inline(always)]
fn tweak(j: u64) -> u128 {
    (u128::from(TWEAK_DOMAIN) << 64) | u128::from(j)
}

/// H(x_n, i_n) = π(σ(x_n) ⊕ i_n) ⊕ σ(x_n) for N inputs in one call to the AES engine.
#[inline(always)]
fn tccr<const N: usize>(x: [u128; N], i: [u128; N]) -> [u128; N] {
    let s = x.map(sigma);
    let mut blocks = [0u128; N];
    for n in 0..N {
        blocks[n] = s[n] ^ i[n];
    }
    fixed_encrypt(&mut blocks);
    for n in 0..N {
        blocks[n] ^= s[n];
    }
    blocks
}

/// Garbles `circuit` ([ZRE15] Fig. 2, Gb): fresh Δ (lsb 1) and input zero-labels from
/// `rng`, free-XOR/free-NOT labels, two ciphertexts per AND gate. Returns the public tables
/// and the garbler's secrets.
///
/// [ZRE15]: https://eprint.iacr.org/2014/756
pub fn garble<R: RngCore + CryptoRng>(
    circuit: &Circuit,
    rng: &mut R,
) -> (GarbledCircuit, GarblerSecrets) {
    let random = |rng: &mut R| -> u128 {
        let mut b = [0u8; 16];
        rng.fill_bytes(&mut b);
        let v = u128::from_le_bytes(b);
        b.zeroize();
        v
    };
    let delta = random(rng) | 1;
    let n_in = circuit.num_inputs();
    let mut zero: Vec<u128> = Vec::with_capacity(circuit.num_wires());
    for _ in 0..n_in {
        zero.push(random(rng));
    }
    let mut tables = Vec::with_capacity(2 * circuit.and_count());
    let mut and_index: u64 = 0;
    for gate in circuit.gates() {
        // Wire indices were checked by `Circuit::new`.
        let w = match *gate {
            Gate::Xor(a, b) => zero[a as usize] ^ zero[b as usize],
            Gate::Not(a) => zero[a as usize] ^ delta,
            Gate::And(a, b) => {
                let a0 = zero[a as usize];
                let b0 = zero[b as usize];
                let (pa, pb) = (a0 & 1 == 1, b0 & 1 == 1);
                let j0 = tweak(and_index.wrapping_mul(2));
                let j1 = tweak(and_index.wrapping_mul(2).wrapping_add(1));
                let [ha0, ha1, hb0, hb1] = tccr([a0, a0 ^ delta, b0, b0 ^ delta], [j0, j0, j1, j1]);
                // Garbler half-gate: the garbler knows p_b.
                let tg = ha0 ^ ha1 ^ (mask(pb) & delta);
                let wg = ha0 ^ (mask(pa) & tg);
                // Evaluator half-gate: the evaluator knows b ⊕ p_b (its label's lsb).
                let te = hb0 ^ hb1 ^ a0;
                let we = hb0 ^ (mask(pb) & (te ^ a0));
                tables.push(tg);
                tables.push(te);
                and_index = and_index.wrapping_add(1);
                wg ^ we
            }
        };
        zero.push(w);
    }
    let secrets = GarblerSecrets {
        delta,
        garbler_zero: zero[..circuit.garbler_inputs()].to_vec(),
        evaluator_zero: zero[circuit.garbler_inputs()..n_in].to_vec(),
        output_zero: circuit
            .outputs()
            .iter()
            .map(|&o| zero[o as usize])
            .collect(),
    };
    zero.zeroize();
    (GarbledCircuit { tables }, secrets)
}

/// Evaluates a garbled circuit ([ZRE15] Fig. 2, Ev) on one label per input wire (the
/// garbler's, then the evaluator's); returns one label per output. The tables must be for this
/// circuit ([`GarbleError::Length`] otherwise). With wrong labels or tables it still returns
/// labels, which the garbler's [`GarblerSecrets::decode_output`] then rejects.
///
/// [ZRE15]: https://eprint.iacr.org/2014/756
pub fn evaluate(
    circuit: &Circuit,
    garbled: &GarbledCircuit,
    garbler_labels: &[Label],
    evaluator_labels: &[Label],
) -> Result<Vec<Label>, GarbleError> {
    if garbled.tables.len() != 2 * circuit.and_count() {
        return Err(GarbleError::Length {
            what: "garbled circuit",
            expected: GarbledCircuit::byte_len(circuit),
            got: garbled.tables.len() * Label::BYTES,
        });
    }
    for (party, expected, got) in [
        ("garbler", circuit.garbler_inputs(), garbler_labels.len()),
        (
            "evaluator",
            circuit.evaluator_inputs(),
            evaluator_labels.len(),
        ),
    ] {
        if expected != got {
            return Err(GarbleError::InputCount {
                party,
                expected,
                got,
            });
        }
    }
    let mut wires: Vec<u128> = Vec::with_capacity(circuit.num_wires());
    wires.extend(garbler_labels.iter().map(|l| l.0));
    wires.extend(evaluator_labels.iter().map(|l| l.0));
    let mut and_index: u64 = 0;
    let mut tables = garbled.tables.chunks_exact(2);
    for gate in circuit.gates() {
        let w = match *gate {
            Gate::Xor(a, b) => wires[a as usize] ^ wires[b as usize],
            // Free inversion: the garbler swapped the labels' meaning; the label is unchanged.
            Gate::Not(a) => wires[a as usize],
            Gate::And(a, b) => {
                let (ta, tb) = (wires[a as usize], wires[b as usize]);
                // The length check above guarantees one table pair per AND gate.
                let (tg, te) = match tables.next() {
                    Some(&[tg, te]) => (tg, te),
                    _ => (0, 0),
                };
                let j0 = tweak(and_index.wrapping_mul(2));
                let j1 = tweak(and_index.wrapping_mul(2).wrapping_add(1));
                let [ha, hb] = tccr([ta, tb], [j0, j1]);
                let wg = ha ^ (mask(ta & 1 == 1) & tg);
                let we = hb ^ (mask(tb & 1 == 1) & (te ^ ta));
                and_index = and_index.wrapping_add(1);
                wg ^ we
            }
        };
        wires.push(w);
    }
    let out = circuit
        .outputs()
        .iter()
        .map(|&o| Label(wires[o as usize]))
        .collect();
    wires.zeroize();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paillier::circuit::{match_check_circuit, MatchCheckWidths};
    use aes::cipher::{BlockEncrypt, KeyInit};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    /// A random circuit: g + e inputs, `gates` random gates over earlier wires (a third
    /// AND), `outputs` random wires (biased to late ones).
    fn random_circuit(
        rng: &mut ChaCha20Rng,
        g: usize,
        e: usize,
        gates: usize,
        outputs: usize,
    ) -> Circuit {
        let n_in = g + e;
        let mut list = Vec::with_capacity(gates);
        for k in 0..gates {
            let limit = (n_in + k) as u32;
            let a = rng.gen_range(0..limit);
            let b = rng.gen_range(0..limit);
            list.push(match rng.gen_range(0..3) {
                0 => Gate::Xor(a, b),
                1 => Gate::And(a, b),
                _ => Gate::Not(a),
            });
        }
        let wires = (n_in + gates) as u32;
        let outs = (0..outputs)
            .map(|_| wires - 1 - rng.gen_range(0..wires.min(8)))
            .collect();
        Circuit::new(g, e, list, outs).unwrap()
    }

    fn random_bits(rng: &mut ChaCha20Rng, n: usize) -> Vec<bool> {
        (0..n).map(|_| rng.gen()).collect()
    }

    #[test]
    fn garbled_evaluation_matches_plain_on_random_circuits() {
        let mut rng = ChaCha20Rng::seed_from_u64(0x6763_0001);
        for round in 0..300 {
            let (g, e) = (rng.gen_range(0..6), rng.gen_range(1..6));
            let (gates, outputs) = (rng.gen_range(1..200), rng.gen_range(1..6));
            let c = random_circuit(&mut rng, g, e, gates, outputs);
            let (gc, secrets) = garble(&c, &mut rng);
            assert_eq!(gc.and_gates(), c.and_count());
            for _ in 0..4 {
                let (xg, xe) = (random_bits(&mut rng, g), random_bits(&mut rng, e));
                let want = c.eval_plain(&xg, &xe).unwrap();
                let labels = evaluate(
                    &c,
                    &gc,
                    &secrets.garbler_input_labels(&xg).unwrap(),
                    &secrets.evaluator_input_labels(&xe).unwrap(),
                )
                .unwrap();
                assert_eq!(
                    secrets.decode_output(&labels).unwrap(),
                    want,
                    "round {round}"
                );
                assert_eq!(secrets.output_decoding().decode(&labels).unwrap(), want);
            }
        }
    }

    #[test]
    fn delta_and_label_pairs() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let c = random_circuit(&mut rng, 2, 8, 50, 2);
        let (_, s) = garble(&c, &mut rng);
        assert_eq!(s.delta & 1, 1);
        let pairs = s.evaluator_label_pairs();
        assert_eq!(pairs.len(), 8);
        for (l0, l1) in &pairs {
            assert_ne!(l0.permute_bit(), l1.permute_bit());
            assert_eq!(l0.as_u128() ^ l1.as_u128(), s.delta);
        }
        let bits = random_bits(&mut rng, 8);
        let labels = s.evaluator_input_labels(&bits).unwrap();
        for ((l, (l0, l1)), b) in labels.iter().zip(&pairs).zip(&bits) {
            assert_eq!(l, if *b { l1 } else { l0 });
        }
        assert_eq!(format!("{:?}", labels[0]), "Label(..)");
    }

    #[test]
    fn tccr_hash_matches_its_definition() {
        // H(x, i) = AES_K(σ(x) ⊕ i) ⊕ σ(x) with RustCrypto's AES under FIXED_KEY.
        let aes = aes::Aes128::new(&crate::crypto::fss::aes::FIXED_KEY.into());
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        for _ in 0..64 {
            let (x, y): (u128, u128) = (rng.gen(), rng.gen());
            let i = tweak(rng.gen());
            // σ is linear and σ(x) ⊕ x is a permutation (σ(x) ⊕ x = 0 only for x = 0).
            assert_eq!(sigma(x ^ y), sigma(x) ^ sigma(y));
            assert_ne!(sigma(x) ^ x, 0);
            let s = sigma(x);
            let mut block = (s ^ i).to_le_bytes().into();
            aes.encrypt_block(&mut block);
            let mut out = [0u8; 16];
            out.copy_from_slice(&block);
            assert_eq!(tccr([x], [i])[0], u128::from_le_bytes(out) ^ s);
        }
        assert_eq!(
            sigma(u128::MAX << 64),
            (u128::MAX << 64) | u128::from(u64::MAX)
        );
    }

    fn match_setup() -> (Circuit, Vec<bool>, Vec<bool>) {
        let w = MatchCheckWidths::new(41, 40).unwrap();
        let c = match_check_circuit(w, 1000).unwrap();
        // A consistent input: IP = 5000, pad = 2^40 + 7, a = 0xdead_beef, b = 99 (all below
        // the moduli): X = IP + pad mod 2^41, Y = a·IP + b mod P, c = b − a·2^40 mod P.
        let p: u128 = (1 << 61) - 1;
        let ip: u128 = 5000;
        let pad: u128 = (1 << 40) + 7;
        let a: u128 = 0xdead_beef;
        let b: u128 = 99;
        let x = (pad + ip) % (1 << 41);
        let y = (a * ip + b) % p;
        let offset = (b + p - (a * (1 << 40)) % p) % p;
        let xg = w
            .garbler_bits(&pad.to_le_bytes(), &a.to_le_bytes(), &offset.to_le_bytes())
            .unwrap();
        let xe = w
            .evaluator_bits(&x.to_le_bytes(), &y.to_le_bytes())
            .unwrap();
        assert_eq!(c.eval_plain(&xg, &xe).unwrap(), vec![true, true]);
        (c, xg, xe)
    }

    #[test]
    fn match_check_garbles_and_decodes() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let (c, xg, mut xe) = match_setup();
        for flip in [None, Some(0), Some(100)] {
            if let Some(i) = flip {
                xe[i] = !xe[i];
            }
            let want = c.eval_plain(&xg, &xe).unwrap();
            let (gc, s) = garble(&c, &mut rng);
            let bytes = gc.to_bytes();
            assert_eq!(bytes.len(), GarbledCircuit::byte_len(&c));
            let gc2 = GarbledCircuit::from_bytes(&c, &bytes).unwrap();
            assert_eq!(gc2, gc);
            let gl = labels_from_bytes(
                &labels_to_bytes(&s.garbler_input_labels(&xg).unwrap()),
                xg.len(),
            )
            .unwrap();
            let out = evaluate(&c, &gc2, &gl, &s.evaluator_input_labels(&xe).unwrap()).unwrap();
            assert_eq!(s.decode_output(&out).unwrap(), want);
            let dec = OutputDecoding::from_bytes(&c, &s.output_decoding().to_bytes()).unwrap();
            assert_eq!(dec.decode(&out).unwrap(), want);
        }
    }

    /// The stored output labels decode and check exactly as the garbler's secrets do; their
    /// bytes round-trip, and any other length or a pair that is not (W⁰, W⁰ ⊕ Δ) is refused.
    #[test]
    fn output_labels_check_like_the_garbler_and_decode_strictly() {
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        let (c, xg, xe) = match_setup();
        let (gc, s) = garble(&c, &mut rng);
        let out = evaluate(
            &c,
            &gc,
            &s.garbler_input_labels(&xg).unwrap(),
            &s.evaluator_input_labels(&xe).unwrap(),
        )
        .unwrap();
        let kept = s.output_labels();
        assert_eq!(format!("{kept:?}"), "OutputLabels(2 outputs)");
        let bytes = kept.to_bytes();
        assert_eq!(bytes.len(), 2 * OutputLabels::BYTES_PER_OUTPUT);
        let back = OutputLabels::from_bytes(&bytes, 2).unwrap();
        assert_eq!(back.outputs(), 2);
        let other = vec![out[0], Label(out[1].0 ^ s.delta)];
        let forged = vec![out[0], Label(rng.gen())];
        for labels in [&out, &other, &forged, &vec![out[1], out[0]]] {
            assert_eq!(back.decode(labels), s.decode_output(labels));
            assert_eq!(kept.decode(labels), s.decode_output(labels));
        }
        for len in 0..bytes.len() + 2 {
            if len != bytes.len() {
                let mut b = bytes.to_vec();
                b.resize(len, 0);
                assert!(OutputLabels::from_bytes(&b, 2).is_err(), "length {len}");
            }
        }
        assert!(OutputLabels::from_bytes(&[], 0).is_err());
        assert!(OutputLabels::from_bytes(&bytes, 1).is_err());
        // Every single-bit change breaks a pair's difference (or the shared Δ).
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.to_vec();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(
                    OutputLabels::from_bytes(&b, 2),
                    Err(GarbleError::BadOutputPair { .. })
                ),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn decode_rejects_labels_the_evaluator_could_not_compute() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let (c, xg, xe) = match_setup();
        let (gc, s) = garble(&c, &mut rng);
        let gl = s.garbler_input_labels(&xg).unwrap();
        let el = s.evaluator_input_labels(&xe).unwrap();
        let out = evaluate(&c, &gc, &gl, &el).unwrap();
        assert_eq!(s.decode_output(&out).unwrap(), vec![true, true]);
        // A random label.
        let mut bad = out.clone();
        bad[1] = Label(rng.gen());
        assert_eq!(
            s.decode_output(&bad),
            Err(GarbleError::InvalidOutputLabel { index: 1 })
        );
        // The label of the other output wire.
        let swapped = vec![out[1], out[0]];
        assert_eq!(
            s.decode_output(&swapped),
            Err(GarbleError::InvalidOutputLabel { index: 0 })
        );
        // An input label (a label of another wire the evaluator holds).
        for l in [gl[0], el[3]] {
            assert_eq!(
                s.decode_output(&[out[0], l]),
                Err(GarbleError::InvalidOutputLabel { index: 1 })
            );
        }
        // The other valid label of an output needs Δ: flipping the permute bit is not enough.
        let flipped = vec![out[0], Label(out[1].0 ^ 1)];
        assert_eq!(
            s.decode_output(&flipped),
            Err(GarbleError::InvalidOutputLabel { index: 1 })
        );
        // Wrong count.
        assert_eq!(
            s.decode_output(&out[..1]),
            Err(GarbleError::OutputCount {
                expected: 2,
                got: 1
            })
        );
    }

    #[test]
    fn tampering_is_detected_or_harmless() {
        let mut rng = ChaCha20Rng::seed_from_u64(6);
        let (c, xg, xe) = match_setup();
        let want = c.eval_plain(&xg, &xe).unwrap();
        let (gc, s) = garble(&c, &mut rng);
        let gl = s.garbler_input_labels(&xg).unwrap();
        let el = s.evaluator_input_labels(&xe).unwrap();
        let mut detected = 0;
        // Flipped bits in the tables: a flip in a block the evaluator uses corrupts its label,
        // and a corrupt label never decodes (it is not W⁰ or W¹); never a wrong output.
        for _ in 0..200 {
            let mut t = gc.clone();
            let pos = rng.gen_range(0..t.tables.len());
            t.tables[pos] ^= 1u128 << rng.gen_range(0..128);
            let out = evaluate(&c, &t, &gl, &el).unwrap();
            match s.decode_output(&out) {
                Ok(bits) => assert_eq!(bits, want),
                Err(GarbleError::InvalidOutputLabel { .. }) => detected += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(detected > 50, "{detected}");
        // Wrong input labels: a random one, or the label of the other bit of a *different*
        // wire, give invalid outputs (or, for a wire that does not influence the outputs, the
        // right ones).
        detected = 0;
        for k in 0..200 {
            let mut el2 = el.clone();
            let i = rng.gen_range(0..el2.len());
            el2[i] = if k % 2 == 0 {
                Label(rng.gen())
            } else {
                el[(i + 1) % el.len()]
            };
            let out = evaluate(&c, &gc, &gl, &el2).unwrap();
            match s.decode_output(&out) {
                Ok(bits) => assert_eq!(bits, want),
                Err(_) => detected += 1,
            }
        }
        assert!(detected > 150, "{detected}");
    }

    #[test]
    fn bytes_are_checked() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let c = random_circuit(&mut rng, 3, 3, 100, 3);
        let other = random_circuit(&mut rng, 3, 3, 300, 3);
        assert_ne!(c.and_count(), other.and_count());
        let (gc, s) = garble(&c, &mut rng);
        let bytes = gc.to_bytes();
        assert!(matches!(
            GarbledCircuit::from_bytes(&c, &bytes[..bytes.len() - 1]),
            Err(GarbleError::Length { .. })
        ));
        let mut long = bytes.clone();
        long.push(0);
        assert!(GarbledCircuit::from_bytes(&c, &long).is_err());
        assert!(GarbledCircuit::from_bytes(&other, &bytes).is_err());
        assert!(GarbledCircuit::from_bytes(&c, &[]).is_err() || c.and_count() == 0);
        // Tables of another circuit, or the wrong number of labels, are refused.
        let labels = s.garbler_input_labels(&[true, false, true]).unwrap();
        let el = s.evaluator_input_labels(&[false, false, true]).unwrap();
        assert!(matches!(
            evaluate(&other, &gc, &labels, &el),
            Err(GarbleError::Length { .. })
        ));
        assert_eq!(
            evaluate(&c, &gc, &labels[..2], &el),
            Err(GarbleError::InputCount {
                party: "garbler",
                expected: 3,
                got: 2
            })
        );
        assert!(evaluate(&c, &gc, &labels, &[]).is_err());
        assert!(s.garbler_input_labels(&[true]).is_err());
        // Labels and decodings.
        let lb = labels_to_bytes(&labels);
        assert_eq!(labels_from_bytes(&lb, 3).unwrap(), labels);
        assert!(labels_from_bytes(&lb[1..], 3).is_err());
        assert!(labels_from_bytes(&lb, 4).is_err());
        assert!(labels_from_bytes(&lb, usize::MAX).is_err());
        let dec = s.output_decoding().to_bytes();
        assert!(OutputDecoding::from_bytes(&c, &dec[1..]).is_err());
        let mut bad = dec.clone();
        bad[2] = 2;
        assert_eq!(
            OutputDecoding::from_bytes(&c, &bad),
            Err(GarbleError::BadDecodingByte { index: 2 })
        );
        assert!(s.output_decoding().decode(&labels[..2]).is_err());
    }
}
