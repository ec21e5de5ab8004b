//! # Boolean circuits for garbling
//!
//! A [`Circuit`] is the public function of a two-party garbled-circuit evaluation: wires are
//! numbered `0..num_wires`, the first ones are the inputs (first the garbler's, then the
//! evaluator's), and gate k (XOR, AND or NOT, in topological order) defines wire
//! `num_inputs + k`. XOR and NOT cost nothing to garble (free-XOR, free inversion; see
//! [`crate::paillier::garble`]), so circuits here are built to use few AND gates.
//!
//! [`CircuitBuilder`] constructs circuits from word-level gadgets on little-endian bit vectors
//! ([`Word`], two's complement where signed): ripple-carry addition and subtraction (1 AND per
//! bit), schoolbook multiplication (exact, [`CircuitBuilder::mul_wide`], or mod 2^w,
//! [`CircuitBuilder::mul`]), equality (w − 1 ANDs) and signed comparison (w ANDs). The builder
//! folds constants and tracks negations, so a gadget fed a public constant (a threshold, a
//! zero-extension) only pays for the bits that depend on inputs.
//!
//! [`match_check_circuit`] is the circuit of protocol Π3 of [ABMR20] (Agrawal, Badrinarayanan,
//! Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint 2020/1363), Fig. 6, with the
//! device's inputs reduced: the evaluator (device) inputs X = IP + pad mod 2^k and
//! Y = a·IP + b mod P (P = 2^e − 1 a Mersenne prime), the garbler (terminal) pad mod 2^k, a and
//! c = (b − a·2^(k−1)) mod P; the circuit recomputes IP from X − pad mod 2^k, checks the MAC
//! a·IP + b ≡ Y (mod P) (so a device that changed X cannot also fix Y without knowing a) and
//! outputs that bit together with (check ∧ IP ≥ threshold).

//! [`Circuit::eval_plain`] evaluates in the clear; it is the reference the garbling is tested
//! against.
//!
//! [ABMR20]: https://eprint.iacr.org/2020/1363

use std::collections::BTreeMap;

use thiserror::Error;

/// Largest width of one input word or gadget operand the builders accept, in bits. Keeps a
/// width that arrives from configuration from allocating without bound.
pub const MAX_WORD_WIDTH: usize = 4096;

/// Largest number of wires of a [`Circuit`] (wire ids are `u32`).
pub const MAX_WIRES: usize = 1 << 30;

/// What can go wrong building or evaluating a circuit.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CircuitError {
    /// A gate or output refers to a wire that does not exist yet (gates must be in
    /// topological order: gate k reads only wires below `num_inputs + k`).
    #[error("gate {gate} reads wire {wire}, which is not defined before it")]
    WireOutOfOrder {
        /// The gate index.
        gate: usize,
        /// The offending wire.
        wire: u32,
    },
    /// An output names a wire past the last one.
    #[error("output {output} names wire {wire}, but the circuit has {wires} wires")]
    OutputOutOfRange {
        /// The output index.
        output: usize,
        /// The offending wire.
        wire: u32,
        /// The number of wires.
        wires: usize,
    },
    /// The circuit would have more than [`MAX_WIRES`] wires.
    #[error("a circuit may have at most {MAX_WIRES} wires")]
    TooManyWires,
    /// The wrong number of input bits for one party.
    #[error("{party} input has {got} bits, the circuit takes {expected}")]
    InputCount {
        /// "garbler" or "evaluator".
        party: &'static str,
        /// Bits the circuit takes.
        expected: usize,
        /// Bits given.
        got: usize,
    },
    /// Two operands of a gadget have different widths.
    #[error("operand widths differ: {left} and {right}")]
    WidthMismatch {
        /// Width of the left operand.
        left: usize,
        /// Width of the right operand.
        right: usize,
    },
    /// A width is zero or above [`MAX_WORD_WIDTH`].
    #[error("width {0} is outside 1..={MAX_WORD_WIDTH}")]
    BadWidth(usize),
    /// A value given as bytes has a bit set at or above the width it must fit.
    #[error("value does not fit in {width} bits")]
    ValueTooWide {
        /// The width it had to fit.
        width: usize,
    },
    /// A constant output in a circuit without any input wire (a constant output is encoded as
    /// `w ⊕ w` of some input wire w).
    #[error("a circuit without inputs cannot have a constant output")]
    ConstantOutputWithoutInputs,
}

/// One gate. Its output wire is implicit: gate k of a circuit defines wire
/// `num_inputs + k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    /// a ⊕ b (free under free-XOR).
    Xor(u32, u32),
    /// a ∧ b (two ciphertexts under half-gates).
    And(u32, u32),
    /// ¬a (free: the garbler swaps the wire's two labels).
    Not(u32),
}

/// A boolean circuit with inputs split between the garbler and the evaluator. Constructed
/// only through [`Circuit::new`] or [`CircuitBuilder::build`], both of which check that every
/// gate reads earlier wires only, so evaluation and garbling index without failing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Circuit {
    garbler_inputs: usize,
    evaluator_inputs: usize,
    gates: Vec<Gate>,
    outputs: Vec<u32>,
    and_count: usize,
}

impl Circuit {
    /// A circuit from its parts: `garbler_inputs` wires `0..g`, `evaluator_inputs` wires
    /// `g..g+e`, then one wire per gate, and the output wires. Fails unless every gate reads
    /// only wires defined before it and every output names an existing wire.
    pub fn new(
        garbler_inputs: usize,
        evaluator_inputs: usize,
        gates: Vec<Gate>,
        outputs: Vec<u32>,
    ) -> Result<Circuit, CircuitError> {
        let inputs = garbler_inputs
            .checked_add(evaluator_inputs)
            .ok_or(CircuitError::TooManyWires)?;
        let wires = inputs
            .checked_add(gates.len())
            .ok_or(CircuitError::TooManyWires)?;
        if wires > MAX_WIRES {
            return Err(CircuitError::TooManyWires);
        }
        let mut and_count = 0usize;
        for (k, gate) in gates.iter().enumerate() {
            // Gate k defines wire inputs + k; it may read only wires below that.
            let limit = inputs + k;
            let reads: &[u32] = match gate {
                Gate::Xor(a, b) => &[*a, *b],
                Gate::And(a, b) => {
                    and_count += 1;
                    &[*a, *b]
                }
                Gate::Not(a) => &[*a],
            };
            for &w in reads {
                if w as usize >= limit {
                    return Err(CircuitError::WireOutOfOrder { gate: k, wire: w });
                }
            }
        }
        for (output, &wire) in outputs.iter().enumerate() {
            if wire as usize >= wires {
                return Err(CircuitError::OutputOutOfRange {
                    output,
                    wire,
                    wires,
                });
            }
        }
        Ok(Circuit {
            garbler_inputs,
            evaluator_inputs,
            gates,
            outputs,
            and_count,
        })
    }

    /// Number of garbler input bits (wires `0..garbler_inputs()`).
    pub fn garbler_inputs(&self) -> usize {
        self.garbler_inputs
    }

    /// Number of evaluator input bits (the wires right after the garbler's).
    pub fn evaluator_inputs(&self) -> usize {
        self.evaluator_inputs
    }

    /// Number of input wires of both parties.
    pub fn num_inputs(&self) -> usize {
        self.garbler_inputs + self.evaluator_inputs
    }

    /// Number of wires: inputs plus one per gate.
    pub fn num_wires(&self) -> usize {
        self.num_inputs() + self.gates.len()
    }

    /// The gates, in topological order.
    pub fn gates(&self) -> &[Gate] {
        &self.gates
    }

    /// The output wires, in output order.
    pub fn outputs(&self) -> &[u32] {
        &self.outputs
    }

    /// Number of AND gates: what garbling costs (two 16-byte ciphertexts each).
    pub fn and_count(&self) -> usize {
        self.and_count
    }

    /// Number of XOR and NOT gates (free to garble).
    pub fn free_gate_count(&self) -> usize {
        self.gates.len() - self.and_count
    }

    /// Evaluates the circuit in the clear: the reference semantics that garbled evaluation
    /// must reproduce. Fails only on a wrong number of input bits.
    pub fn eval_plain(
        &self,
        garbler_bits: &[bool],
        evaluator_bits: &[bool],
    ) -> Result<Vec<bool>, CircuitError> {
        check_count("garbler", self.garbler_inputs, garbler_bits.len())?;
        check_count("evaluator", self.evaluator_inputs, evaluator_bits.len())?;
        let mut wires = Vec::with_capacity(self.num_wires());
        wires.extend_from_slice(garbler_bits);
        wires.extend_from_slice(evaluator_bits);
        for gate in &self.gates {
            // Indices were checked by `Circuit::new`.
            let v = match *gate {
                Gate::Xor(a, b) => wires[a as usize] ^ wires[b as usize],
                Gate::And(a, b) => wires[a as usize] & wires[b as usize],
                Gate::Not(a) => !wires[a as usize],
            };
            wires.push(v);
        }
        Ok(self.outputs.iter().map(|&w| wires[w as usize]).collect())
    }
}

fn check_count(party: &'static str, expected: usize, got: usize) -> Result<(), CircuitError> {
    if expected == got {
        Ok(())
    } else {
        Err(CircuitError::InputCount {
            party,
            expected,
            got,
        })
    }
}

/// Where a builder value lives before wires are numbered: inputs may be declared after gates,
/// so numbering waits for [`CircuitBuilder::build`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Garbler(u32),
    Evaluator(u32),
    Gate(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BitRepr {
    /// A public constant: gadgets fold it away.
    Const(bool),
    /// A node, possibly negated: negation is tracked here and only becomes a (free) NOT gate
    /// where a negated value feeds an AND gate or an output.
    Wire { node: Node, neg: bool },
}

/// One bit of a circuit under construction: a public constant or a (possibly negated) wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bit(BitRepr);

impl Bit {
    /// The public constant `value`.
    pub const fn constant(value: bool) -> Bit {
        Bit(BitRepr::Const(value))
    }

    /// The constant value, if this bit is a public constant.
    pub fn as_constant(self) -> Option<bool> {
        match self.0 {
            BitRepr::Const(v) => Some(v),
            BitRepr::Wire { .. } => None,
        }
    }
}

/// Signedness of a gadget operand: how it extends to a wider width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signedness {
    /// Zero-extended; value in `0..2^w`.
    Unsigned,
    /// Two's complement, sign-extended; value in `-2^(w-1)..2^(w-1)`.
    Signed,
}

/// A word: bits in little-endian order (bit 0 least significant). Signedness is not stored;
/// each gadget says how it reads its operands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Word(Vec<Bit>);

impl Word {
    /// A word from its bits, least significant first.
    pub fn from_bits(bits: Vec<Bit>) -> Word {
        Word(bits)
    }

    /// The public constant `value` in two's complement, truncated to `width` bits.
    pub fn constant_i128(value: i128, width: usize) -> Word {
        Word(
            (0..width)
                .map(|i| {
                    Bit::constant(if i < 128 {
                        (value >> i) & 1 == 1
                    } else {
                        value < 0
                    })
                })
                .collect(),
        )
    }

    /// Number of bits.
    pub fn width(&self) -> usize {
        self.0.len()
    }

    /// The bits, least significant first.
    pub fn bits(&self) -> &[Bit] {
        &self.0
    }

    /// The most significant bit (the sign when read as signed); constant 0 for an empty word.
    pub fn msb(&self) -> Bit {
        self.0.last().copied().unwrap_or(Bit::constant(false))
    }

    /// This word resized to `width` bits: truncated, or extended with zeros (unsigned) or
    /// copies of the sign bit (signed). Extension bits are copies, not gates.
    pub fn resize(&self, width: usize, signedness: Signedness) -> Word {
        let fill = match signedness {
            Signedness::Unsigned => Bit::constant(false),
            Signedness::Signed => self.msb(),
        };
        Word(
            (0..width)
                .map(|i| self.0.get(i).copied().unwrap_or(fill))
                .collect(),
        )
    }

    /// Bits `from..from + len` (clamped to the word).
    pub fn slice(&self, from: usize, len: usize) -> Word {
        Word(self.0.iter().skip(from).take(len).copied().collect())
    }
}

#[derive(Clone, Copy, Debug)]
enum BuilderGate {
    Xor(Node, Node),
    And(Node, Node),
    Not(Node),
}

/// Builds a [`Circuit`] from bit- and word-level gadgets, folding constants and negations so
/// that only input-dependent AND gates are emitted.
#[derive(Clone, Debug, Default)]
pub struct CircuitBuilder {
    garbler_inputs: u32,
    evaluator_inputs: u32,
    gates: Vec<BuilderGate>,
    outputs: Vec<Bit>,
    /// The NOT gate already emitted for a node, so a negated value used by several AND gates
    /// becomes one gate.
    negated: BTreeMap<Node, Node>,
    /// Set when more wires were requested than a circuit may have; `build` then fails.
    overflow: bool,
}

impl CircuitBuilder {
    /// An empty builder.
    pub fn new() -> CircuitBuilder {
        CircuitBuilder::default()
    }

    /// Declares `width` new garbler input bits (in order after those declared before) and
    /// returns them as a word.
    pub fn garbler_input(&mut self, width: usize) -> Word {
        let start = self.garbler_inputs;
        let width32 = self.reserve(width);
        self.garbler_inputs = start.wrapping_add(width32);
        Word(
            (0..width32)
                .map(|i| wire_bit(Node::Garbler(start.wrapping_add(i))))
                .collect(),
        )
    }

    /// Declares `width` new evaluator input bits and returns them as a word.
    pub fn evaluator_input(&mut self, width: usize) -> Word {
        let start = self.evaluator_inputs;
        let width32 = self.reserve(width);
        self.evaluator_inputs = start.wrapping_add(width32);
        Word(
            (0..width32)
                .map(|i| wire_bit(Node::Evaluator(start.wrapping_add(i))))
                .collect(),
        )
    }

    /// Checks that `count` more wires keep the circuit within [`MAX_WIRES`]; if not, marks the
    /// builder failed and reserves nothing.
    fn reserve(&mut self, count: usize) -> u32 {
        let used = self.garbler_inputs as usize + self.evaluator_inputs as usize + self.gates.len();
        match used.checked_add(count) {
            Some(total) if total <= MAX_WIRES => count as u32,
            _ => {
                self.overflow = true;
                0
            }
        }
    }

    fn push_gate(&mut self, gate: BuilderGate) -> Node {
        if self.reserve(1) == 0 {
            // The circuit is already too large; `build` reports it. Return some node so
            // construction can go on without panicking.
            return Node::Gate(0);
        }
        self.gates.push(gate);
        Node::Gate((self.gates.len() - 1) as u32)
    }

    /// The node carrying the value of `node` (negated if `neg`): a negated node gets one NOT
    /// gate, shared by every later use.
    fn materialise(&mut self, node: Node, neg: bool) -> Node {
        if !neg {
            return node;
        }
        if let Some(&n) = self.negated.get(&node) {
            return n;
        }
        let n = self.push_gate(BuilderGate::Not(node));
        self.negated.insert(node, n);
        n
    }

    /// a ⊕ b. Free: constants and negations fold, otherwise one XOR gate.
    pub fn xor(&mut self, a: Bit, b: Bit) -> Bit {
        match (a.0, b.0) {
            (BitRepr::Const(x), BitRepr::Const(y)) => Bit::constant(x ^ y),
            (BitRepr::Const(k), BitRepr::Wire { node, neg })
            | (BitRepr::Wire { node, neg }, BitRepr::Const(k)) => {
                Bit(BitRepr::Wire { node, neg: neg ^ k })
            }
            (BitRepr::Wire { node: n1, neg: g1 }, BitRepr::Wire { node: n2, neg: g2 }) => {
                if n1 == n2 {
                    return Bit::constant(g1 ^ g2);
                }
                let node = self.push_gate(BuilderGate::Xor(n1, n2));
                Bit(BitRepr::Wire { node, neg: g1 ^ g2 })
            }
        }
    }

    /// ¬a. Free (tracked on the bit; no gate unless needed).
    pub fn not(&mut self, a: Bit) -> Bit {
        self.xor(a, Bit::constant(true))
    }

    /// a ∧ b: one AND gate unless a constant or equal/opposite operands fold it.
    pub fn and(&mut self, a: Bit, b: Bit) -> Bit {
        match (a.0, b.0) {
            (BitRepr::Const(false), _) | (_, BitRepr::Const(false)) => Bit::constant(false),
            (BitRepr::Const(true), _) => b,
            (_, BitRepr::Const(true)) => a,
            (BitRepr::Wire { node: n1, neg: g1 }, BitRepr::Wire { node: n2, neg: g2 }) => {
                if n1 == n2 {
                    return if g1 == g2 { a } else { Bit::constant(false) };
                }
                let x = self.materialise(n1, g1);
                let y = self.materialise(n2, g2);
                let node = self.push_gate(BuilderGate::And(x, y));
                Bit(BitRepr::Wire { node, neg: false })
            }
        }
    }

    /// a ∨ b = a ⊕ b ⊕ (a ∧ b): one AND gate.
    pub fn or(&mut self, a: Bit, b: Bit) -> Bit {
        let both = self.and(a, b);
        let either = self.xor(a, b);
        self.xor(either, both)
    }

    /// `if s { a } else { b }` = b ⊕ (s ∧ (a ⊕ b)): one AND gate.
    pub fn mux(&mut self, s: Bit, a: Bit, b: Bit) -> Bit {
        let d = self.xor(a, b);
        let sd = self.and(s, d);
        self.xor(b, sd)
    }

    /// The carry of a full adder, ((a ⊕ c) ∧ (b ⊕ c)) ⊕ c = majority(a, b, c): one AND gate.
    fn carry(&mut self, a: Bit, b: Bit, c: Bit) -> Bit {
        let ac = self.xor(a, c);
        let bc = self.xor(b, c);
        let t = self.and(ac, bc);
        self.xor(t, c)
    }

    /// Ripple-carry a + b + carry_in over equal-length bit slices, mod 2^len (the carry out of
    /// the top bit is not computed, saving its AND gate).
    fn ripple(&mut self, a: &[Bit], b: &[Bit], carry_in: Bit) -> Vec<Bit> {
        let mut out = Vec::with_capacity(a.len());
        let mut c = carry_in;
        for (i, (&x, &y)) in a.iter().zip(b.iter()).enumerate() {
            let xy = self.xor(x, y);
            out.push(self.xor(xy, c));
            if i + 1 < a.len() {
                c = self.carry(x, y, c);
            }
        }
        out
    }

    fn same_width(a: &Word, b: &Word) -> Result<(), CircuitError> {
        if a.width() == b.width() {
            Ok(())
        } else {
            Err(CircuitError::WidthMismatch {
                left: a.width(),
                right: b.width(),
            })
        }
    }

    /// a + b mod 2^w (ripple-carry, w − 1 AND gates at most).
    pub fn add(&mut self, a: &Word, b: &Word) -> Result<Word, CircuitError> {
        Self::same_width(a, b)?;
        Ok(Word(self.ripple(&a.0, &b.0, Bit::constant(false))))
    }

    /// a − b mod 2^w, computed as a + ¬b + 1 (w − 1 AND gates at most).
    pub fn sub(&mut self, a: &Word, b: &Word) -> Result<Word, CircuitError> {
        Self::same_width(a, b)?;
        let nb: Vec<Bit> = b.0.iter().map(|&x| self.not(x)).collect();
        Ok(Word(self.ripple(&a.0, &nb, Bit::constant(true))))
    }

    /// −a mod 2^w (0 − a).
    pub fn negate(&mut self, a: &Word) -> Word {
        let zero = Word::constant_i128(0, a.width());
        let na: Vec<Bit> = a.0.iter().map(|&x| self.not(x)).collect();
        Word(self.ripple(&zero.0, &na, Bit::constant(true)))
    }

    /// a · b mod 2^w: truncated schoolbook, row j adds (a ∧ b_j) · 2^j over the w − j bits
    /// it can still reach (about w² AND gates).
    pub fn mul(&mut self, a: &Word, b: &Word) -> Result<Word, CircuitError> {
        Self::same_width(a, b)?;
        let w = a.width();
        let mut acc: Vec<Bit> = Vec::with_capacity(w);
        for j in 0..w {
            let bj = b.0[j];
            let row: Vec<Bit> = a.0[..w - j].iter().map(|&x| self.and(x, bj)).collect();
            if j == 0 {
                acc = row;
            } else {
                let high = self.ripple(&acc[j..], &row, Bit::constant(false));
                acc.truncate(j);
                acc.extend(high);
            }
        }
        Ok(Word(acc))
    }

    /// The exact product of a (p bits) and b (q bits), each read with its signedness, as a
    /// (p + q)-bit word (two's complement if either operand is signed; the product always
    /// fits). Schoolbook over the rows of the narrower operand; each row costs its partial
    /// products plus one adder over the bits the running sum can occupy, about 2·p·q AND
    /// gates in all (constant bits fold).
    pub fn mul_wide(&mut self, a: &Word, a_sign: Signedness, b: &Word, b_sign: Signedness) -> Word {
        // Rows over the narrower operand: fewer adders, same partial-product count.
        let (a, a_sign, b, b_sign) = if b.width() <= a.width() {
            (a, a_sign, b, b_sign)
        } else {
            (b, b_sign, a, a_sign)
        };
        let out_width = a.width() + b.width();
        if b.width() == 0 || a.width() == 0 {
            return Word::constant_i128(0, out_width);
        }
        // Work on a as a signed value of p' bits (an unsigned a gets a constant-0 sign bit).
        let a_s = match a_sign {
            Signedness::Signed => a.clone(),
            Signedness::Unsigned => a.resize(a.width() + 1, Signedness::Unsigned),
        };
        let p = a_s.width();
        let q = b.width();
        // Internal width: |S_j| < 2^(p + j) for the partial sum S_j of rows 0..=j, so it fits
        // p + j + 1 signed bits; the final one also fits out_width when read correctly, and
        // p + q ≥ out_width covers every case, so work in at most p + q bits and truncate.
        let cap = p + q;
        let mut acc: Vec<Bit> = Vec::new();
        for j in 0..q {
            let bj = b.0[j];
            let row: Vec<Bit> = a_s.0.iter().map(|&x| self.and(x, bj)).collect();
            let negative = b_sign == Signedness::Signed && j + 1 == q;
            let width = (p + j + 1).min(cap);
            if j == 0 {
                let row = Word(row).resize(width, Signedness::Signed);
                acc = if negative { self.negate(&row).0 } else { row.0 };
                continue;
            }
            // Bits below j are final (the row is zero there); add/subtract on bits j.. only.
            let hi_len = width - j;
            let acc_hi = Word(acc[j..].to_vec()).resize(hi_len, Signedness::Signed);
            let row_hi = Word(row).resize(hi_len, Signedness::Signed);
            let sum = if negative {
                let nr: Vec<Bit> = row_hi.0.iter().map(|&x| self.not(x)).collect();
                self.ripple(&acc_hi.0, &nr, Bit::constant(true))
            } else {
                self.ripple(&acc_hi.0, &row_hi.0, Bit::constant(false))
            };
            acc.truncate(j);
            acc.extend(sum);
        }
        let acc = Word(acc);
        // Read as signed (the internal representation), then cut to the output width.
        acc.resize(out_width, Signedness::Signed)
    }

    /// a = b as one bit: w XNORs (free) and a balanced AND tree (w − 1 AND gates).
    pub fn eq(&mut self, a: &Word, b: &Word) -> Result<Bit, CircuitError> {
        Self::same_width(a, b)?;
        let same: Vec<Bit> =
            a.0.iter()
                .zip(b.0.iter())
                .map(|(&x, &y)| {
                    let d = self.xor(x, y);
                    self.not(d)
                })
                .collect();
        Ok(self.and_all(&same))
    }

    /// The AND of all bits (constant 1 for none), as a balanced tree.
    pub fn and_all(&mut self, bits: &[Bit]) -> Bit {
        let mut layer: Vec<Bit> = bits.to_vec();
        if layer.is_empty() {
            return Bit::constant(true);
        }
        while layer.len() > 1 {
            let mut next = Vec::with_capacity(layer.len().div_ceil(2));
            for pair in layer.chunks(2) {
                next.push(match pair {
                    [x, y] => self.and(*x, *y),
                    [x] => *x,
                    _ => Bit::constant(true),
                });
            }
            layer = next;
        }
        layer[0]
    }

    /// The unsigned word v reduced modulo the Mersenne number 2^e − 1, as the canonical
    /// residue in [0, 2^e − 1) on e bits. Since 2^e ≡ 1, v is folded by adding its e-bit
    /// chunks until it has e + 1 bits, then once more to v' ≤ 2^e; the last step maps
    /// v' ∈ {2^e − 1, 2^e} to 0 and 1 by adding g = [v' ≥ 2^e − 1] mod 2^e (≈ e AND gates per
    /// fold, e for g and the increment).
    pub fn reduce_mersenne(&mut self, v: &Word, e: usize) -> Word {
        let mut v = v.resize(v.width().max(e + 1), Signedness::Unsigned);
        while v.width() > e + 1 {
            let chunks: Vec<Word> = (0..v.width())
                .step_by(e)
                .map(|i| v.slice(i, e.min(v.width() - i)))
                .collect();
            // The sum of n chunks below 2^e is below n·2^e ≤ 2^(e + ⌈log2 n⌉).
            let width = e + chunks.len().next_power_of_two().trailing_zeros() as usize;
            let mut sum = chunks[0].resize(width, Signedness::Unsigned);
            for chunk in &chunks[1..] {
                sum = Word(self.ripple(
                    &sum.0,
                    &chunk.resize(width, Signedness::Unsigned).0,
                    Bit::constant(false),
                ));
            }
            v = sum;
        }
        // v < 2^(e+1): v' = (v mod 2^e) + bit e ≤ 2^e, on e + 1 bits.
        let low = v.slice(0, e).resize(e + 1, Signedness::Unsigned);
        let top = Word::from_bits(vec![v.0[e]]).resize(e + 1, Signedness::Unsigned);
        let folded = Word(self.ripple(&low.0, &top.0, Bit::constant(false)));
        // g = [v' ≥ 2^e − 1]: bit e set (v' = 2^e) or the low e bits all one (v' = 2^e − 1).
        let all_ones = self.and_all(&folded.0[..e]);
        let g = self.or(folded.0[e], all_ones);
        let increment = Word::from_bits(vec![g]).resize(e, Signedness::Unsigned);
        Word(self.ripple(&folded.0[..e], &increment.0, Bit::constant(false)))
    }

    /// Unsigned a ≥ b: the carry out of a + ¬b + 1 (w AND gates at most).
    pub fn ge_unsigned(&mut self, a: &Word, b: &Word) -> Result<Bit, CircuitError> {
        Self::same_width(a, b)?;
        let mut c = Bit::constant(true);
        for (&x, &y) in a.0.iter().zip(b.0.iter()) {
            let ny = self.not(y);
            c = self.carry(x, ny, c);
        }
        Ok(c)
    }

    /// Signed (two's complement) a ≥ b: unsigned comparison with both sign bits flipped.
    pub fn ge_signed(&mut self, a: &Word, b: &Word) -> Result<Bit, CircuitError> {
        Self::same_width(a, b)?;
        let (fa, fb) = (self.flip_msb(a), self.flip_msb(b));
        self.ge_unsigned(&fa, &fb)
    }

    /// a with its most significant bit inverted (free): for a signed word, a + 2^(w−1) read
    /// unsigned.
    pub fn flip_msb(&mut self, a: &Word) -> Word {
        let mut bits = a.0.clone();
        if let Some(top) = bits.last_mut() {
            *top = self.not(*top);
        }
        Word(bits)
    }

    /// Signed a ≥ c for a public constant c. A constant outside a's range folds to a
    /// constant bit; otherwise the comparator sees c's bits, so its trailing zeros (and the
    /// first one) cost nothing.
    pub fn ge_signed_const(&mut self, a: &Word, c: i128) -> Bit {
        let w = a.width();
        if w == 0 {
            return Bit::constant(c <= 0);
        }
        if w < 128 {
            let max = (1i128 << (w - 1)).wrapping_sub(1);
            let min = max.wrapping_neg().wrapping_sub(1);
            if c <= min {
                return Bit::constant(true);
            }
            if c > max {
                return Bit::constant(false);
            }
        }
        let k = Word::constant_i128(c, w);
        // Widths are equal by construction.
        let fa = self.flip_msb(a);
        let fk = self.flip_msb(&k);
        let mut carry = Bit::constant(true);
        for (&x, &y) in fa.0.iter().zip(fk.0.iter()) {
            let ny = self.not(y);
            carry = self.carry(x, ny, carry);
        }
        carry
    }

    /// Appends `bit` to the circuit's outputs.
    pub fn output(&mut self, bit: Bit) {
        self.outputs.push(bit);
    }

    /// Appends every bit of `word` (least significant first) to the outputs.
    pub fn output_word(&mut self, word: &Word) {
        self.outputs.extend_from_slice(&word.0);
    }

    /// Numbers the wires (garbler inputs, evaluator inputs, gates in emission order) and
    /// returns the circuit. A negated output gets a NOT gate; a constant output becomes
    /// `w ⊕ w` (or its negation) of input wire 0.
    pub fn build(mut self) -> Result<Circuit, CircuitError> {
        let outputs = std::mem::take(&mut self.outputs);
        let mut out_nodes = Vec::with_capacity(outputs.len());
        for bit in outputs {
            let node = match bit.0 {
                BitRepr::Wire { node, neg } => self.materialise(node, neg),
                BitRepr::Const(v) => {
                    let first = if self.garbler_inputs > 0 {
                        Node::Garbler(0)
                    } else if self.evaluator_inputs > 0 {
                        Node::Evaluator(0)
                    } else {
                        return Err(CircuitError::ConstantOutputWithoutInputs);
                    };
                    let zero = self.push_gate(BuilderGate::Xor(first, first));
                    self.materialise(zero, v)
                }
            };
            out_nodes.push(node);
        }
        if self.overflow {
            return Err(CircuitError::TooManyWires);
        }
        let g = self.garbler_inputs;
        let e = self.evaluator_inputs;
        let base = g.wrapping_add(e);
        let wire = |n: Node| -> u32 {
            match n {
                Node::Garbler(i) => i,
                Node::Evaluator(i) => g.wrapping_add(i),
                Node::Gate(k) => base.wrapping_add(k),
            }
        };
        let gates = self
            .gates
            .iter()
            .map(|gate| match *gate {
                BuilderGate::Xor(a, b) => Gate::Xor(wire(a), wire(b)),
                BuilderGate::And(a, b) => Gate::And(wire(a), wire(b)),
                BuilderGate::Not(a) => Gate::Not(wire(a)),
            })
            .collect();
        let outputs = out_nodes.into_iter().map(wire).collect();
        Circuit::new(g as usize, e as usize, gates, outputs)
    }
}

fn wire_bit(node: Node) -> Bit {
    Bit(BitRepr::Wire { node, neg: false })
}

/// The low `width` bits of `value` (two's complement), least significant first.
pub fn bits_from_i128(value: i128, width: usize) -> Vec<bool> {
    (0..width)
        .map(|i| {
            if i < 128 {
                (value >> i) & 1 == 1
            } else {
                value < 0
            }
        })
        .collect()
}

/// The low `width` bits of `value`, least significant first (zeros above bit 127).
pub fn bits_from_u128(value: u128, width: usize) -> Vec<bool> {
    (0..width)
        .map(|i| i < 128 && (value >> i) & 1 == 1)
        .collect()
}

/// The unsigned value of little-endian bits, or `None` if a bit at or above 128 is set.
pub fn bits_to_u128(bits: &[bool]) -> Option<u128> {
    let mut v = 0u128;
    for (i, &b) in bits.iter().enumerate() {
        if b {
            if i >= 128 {
                return None;
            }
            v |= 1u128 << i;
        }
    }
    Some(v)
}

/// The two's-complement value of little-endian bits (the last bit is the sign), or `None`
/// if it does not fit an `i128`.
pub fn bits_to_i128(bits: &[bool]) -> Option<i128> {
    let Some(&sign) = bits.last() else {
        return Some(0);
    };
    if bits.len() > 128 && bits[127..].iter().any(|&b| b != sign) {
        return None;
    }
    let mut v: i128 = if sign { -1 } else { 0 };
    for (i, &b) in bits.iter().take(128).enumerate() {
        let m = 1i128 << i;
        v = if b { v | m } else { v & !m };
    }
    Some(v)
}

/// The `width` low bits of a little-endian byte string (an unsigned integer), least
/// significant first; [`CircuitError::ValueTooWide`] if a bit at or above `width` is set.
pub fn bits_from_le_bytes(bytes: &[u8], width: usize) -> Result<Vec<bool>, CircuitError> {
    for (i, &byte) in bytes.iter().enumerate() {
        for k in 0..8 {
            if (byte >> k) & 1 == 1 && i * 8 + k >= width {
                return Err(CircuitError::ValueTooWide { width });
            }
        }
    }
    Ok((0..width)
        .map(|i| bytes.get(i / 8).is_some_and(|&b| (b >> (i % 8)) & 1 == 1))
        .collect())
}

/// Little-endian bits packed into little-endian bytes (the inverse of [`bits_from_le_bytes`]).
pub fn bits_to_le_bytes(bits: &[bool]) -> Vec<u8> {
    let mut out = vec![0u8; bits.len().div_ceil(8)];
    for (i, &b) in bits.iter().enumerate() {
        if b {
            out[i / 8] |= 1 << (i % 8);
        }
    }
    out
}

/// The Mersenne exponents e (2^e − 1 is prime) the match check may reduce its MAC modulo,
/// smallest first. Folding modulo 2^e − 1 costs only additions (2^e ≡ 1), so the reduction is
/// a few adders instead of a division.
pub const MERSENNE_EXPONENTS: [usize; 15] =
    [2, 3, 5, 7, 13, 17, 19, 31, 61, 89, 107, 127, 521, 607, 1279];

/// Bit widths of the inputs of [`match_check_circuit`].
///
/// X and pad are k-bit words (values mod 2^k, k = [`MatchCheckWidths::ip`]); a is an
/// [`MatchCheckWidths::a`]-bit word; Y and the MAC offset c are e-bit words holding residues
/// modulo the Mersenne prime P = 2^e − 1 (e = [`MatchCheckWidths::mac`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatchCheckWidths {
    /// k: IP is read from X − pad mod 2^k as a signed k-bit word, so an honest |IP| must be
    /// below 2^(k−1).
    pub ip: usize,
    /// Bits of the secret multiplier a.
    pub a: usize,
    /// e: the MAC a·IP + b is compared modulo P = 2^e − 1, a Mersenne prime with
    /// P > 2^k and P > 2^a (see [`MatchCheckWidths::validate`]).
    pub mac: usize,
}

/// Output index of the bit "a·IP + b ≡ Y (mod P)" in [`match_check_circuit`].
pub const MATCH_CHECK_VALID: usize = 0;
/// Output index of the bit "valid ∧ IP ≥ threshold" in [`match_check_circuit`].
pub const MATCH_CHECK_MATCHED: usize = 1;

impl MatchCheckWidths {
    /// The widths for an IP of `ip` signed bits and a multiplier of `a` bits, with the
    /// smallest Mersenne exponent e > max(ip, a) ([`MERSENNE_EXPONENTS`]);
    /// [`CircuitError::BadWidth`] if a width is out of range or no exponent is large enough.
    pub fn new(ip: usize, a: usize) -> Result<MatchCheckWidths, CircuitError> {
        let need = ip.max(a);
        let mac = MERSENNE_EXPONENTS
            .iter()
            .copied()
            .find(|&e| e > need)
            .ok_or(CircuitError::BadWidth(need))?;
        let w = MatchCheckWidths { ip, a, mac };
        w.validate()?;
        Ok(w)
    }

    /// Checks the widths: k ≥ 2, a ≥ 1, all at most [`MAX_WORD_WIDTH`], e a Mersenne exponent
    /// with e > k and e > a. The last two are the soundness conditions: a device that moves
    /// X by δ ≢ 0 (mod 2^k) moves IP + 2^(k−1) by some δ' with 0 < |δ'| < 2^k < P, so δ' is
    /// invertible mod P and the Y that passes is Y + a·δ' mod P, which takes a different value
    /// for each of the 2^a − 1 possible a (a < P): the device must guess a.
    pub fn validate(&self) -> Result<(), CircuitError> {
        for w in [self.ip, self.a, self.mac] {
            if w == 0 || w > MAX_WORD_WIDTH {
                return Err(CircuitError::BadWidth(w));
            }
        }
        if self.ip < 2 {
            return Err(CircuitError::BadWidth(self.ip));
        }
        if !MERSENNE_EXPONENTS.contains(&self.mac) || self.mac <= self.ip.max(self.a) {
            return Err(CircuitError::BadWidth(self.mac));
        }
        Ok(())
    }

    /// The garbler's input bits (pad mod 2^k, a, c = (b − a·2^(k−1)) mod P, in this order,
    /// each little-endian) from little-endian byte strings; [`CircuitError::ValueTooWide`] if
    /// one does not fit its width.
    pub fn garbler_bits(&self, pad: &[u8], a: &[u8], c: &[u8]) -> Result<Vec<bool>, CircuitError> {
        let mut bits = bits_from_le_bytes(pad, self.ip)?;
        bits.extend(bits_from_le_bytes(a, self.a)?);
        bits.extend(bits_from_le_bytes(c, self.mac)?);
        Ok(bits)
    }

    /// The evaluator's input bits (X mod 2^k, then Y mod P, each little-endian) from
    /// little-endian byte strings; [`CircuitError::ValueTooWide`] if one does not fit.
    pub fn evaluator_bits(&self, x: &[u8], y: &[u8]) -> Result<Vec<bool>, CircuitError> {
        let mut bits = bits_from_le_bytes(x, self.ip)?;
        bits.extend(bits_from_le_bytes(y, self.mac)?);
        Ok(bits)
    }
}

/// The consistency-and-threshold circuit of Π3 ([ABMR20] Fig. 6), with the device's inputs
/// reduced: X modulo 2^k and Y modulo a Mersenne prime P = 2^e − 1.
///
/// [ABMR20]: https://eprint.iacr.org/2020/1363
///
/// Inputs: garbler (terminal) pad, a, c; evaluator (device) X, Y; little-endian, in that
/// order (see [`MatchCheckWidths::garbler_bits`] and [`MatchCheckWidths::evaluator_bits`]).
/// With D = X − pad mod 2^k read as a signed k-bit integer:
///
/// ```text
/// IP      = D                                       (signed k bits)
/// valid   = (a·(IP + 2^(k−1)) + c mod P == Y)       (the sum exact, then folded mod P)
/// matched = valid ∧ (IP ≥ threshold)                (signed comparison)
/// ```
///
/// and outputs `[valid, matched]` ([`MATCH_CHECK_VALID`], [`MATCH_CHECK_MATCHED`]). The
/// terminal sets c = (b − a·2^(k−1)) mod P, so that an honest device holding X = IP + pad
/// and Y = a·IP + b (over the integers, reduced mod 2^k and mod P) passes exactly when
/// |IP| < 2^(k−1). IP + 2^(k−1) is D with its top bit flipped (free), so the product is of
/// two unsigned words. Why the reduction is sound is [`MatchCheckWidths::validate`]'s
/// condition; it halves the device's input bits against the exact-integer version (and so
/// the oblivious transfers), which is what Π3's time is made of.
///
/// Cost (AND gates): the subtraction (k), the a × (IP + 2^(k−1)) product (≈ 2·a·k), the
/// addition of c and the folds mod P (≈ 3·e), the equality (e − 1) and the comparison (≤ k).
pub fn match_check_circuit(
    widths: MatchCheckWidths,
    threshold: i128,
) -> Result<Circuit, CircuitError> {
    widths.validate()?;
    let mut b = CircuitBuilder::new();
    let pad = b.garbler_input(widths.ip);
    let a = b.garbler_input(widths.a);
    let offset = b.garbler_input(widths.mac);
    let x = b.evaluator_input(widths.ip);
    let y = b.evaluator_input(widths.mac);

    let ip = b.sub(&x, &pad)?;
    let ip_offset = b.flip_msb(&ip);
    let product = b.mul_wide(&a, Signedness::Unsigned, &ip_offset, Signedness::Unsigned);
    let sum_width = product.width().max(widths.mac) + 1;
    let sum = b.add(
        &product.resize(sum_width, Signedness::Unsigned),
        &offset.resize(sum_width, Signedness::Unsigned),
    )?;
    let residue = b.reduce_mersenne(&sum, widths.mac);
    let valid = b.eq(&residue, &y)?;
    let above = b.ge_signed_const(&ip, threshold);
    let matched = b.and(valid, above);
    b.output(valid);
    b.output(matched);
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use num_bigint::{BigInt, BigUint};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    fn mask(w: usize) -> u128 {
        if w >= 128 {
            u128::MAX
        } else {
            (1u128 << w) - 1
        }
    }

    /// Sign-extends the low `w` bits of `v`.
    fn signed(v: u128, w: usize) -> i128 {
        if w >= 128 {
            v as i128
        } else {
            let s = 128 - w;
            ((v << s) as i128) >> s
        }
    }

    /// A w-bit value: an edge case (0, 1, −1, min, max, min + 1, max − 1) or `r`.
    fn pick(w: usize, sel: u8, r: u128) -> u128 {
        let min = 1u128 << (w - 1);
        let max = min - 1;
        let v = match sel {
            0 => 0,
            1 => 1,
            2 => u128::MAX,
            3 => min,
            4 => max,
            5 => min.wrapping_add(1),
            6 => max.wrapping_sub(1),
            _ => r,
        };
        v & mask(w)
    }

    /// Builds garbler word a (wa bits) and evaluator word b (wb bits), lets `f` compute the
    /// outputs, and evaluates on (x, y).
    fn run2(
        wa: usize,
        wb: usize,
        x: u128,
        y: u128,
        f: impl FnOnce(&mut CircuitBuilder, &Word, &Word) -> Vec<Bit>,
    ) -> (Vec<bool>, Circuit) {
        let mut b = CircuitBuilder::new();
        let a = b.garbler_input(wa);
        let bb = b.evaluator_input(wb);
        for bit in f(&mut b, &a, &bb) {
            b.output(bit);
        }
        let c = b.build().unwrap();
        let out = c
            .eval_plain(&bits_from_u128(x, wa), &bits_from_u128(y, wb))
            .unwrap();
        (out, c)
    }

    fn sel_and_value() -> impl Strategy<Value = (u8, u128)> {
        (0u8..12, any::<u128>())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        #[test]
        fn add_sub_negate_mul_mod_2w(w in 1usize..=128, (sx, rx) in sel_and_value(), (sy, ry) in sel_and_value()) {
            let (x, y) = (pick(w, sx, rx), pick(w, sy, ry));
            let m = mask(w);
            let (out, _) = run2(w, w, x, y, |b, a, c| b.add(a, c).unwrap().bits().to_vec());
            prop_assert_eq!(bits_to_u128(&out), Some(x.wrapping_add(y) & m));
            let (out, _) = run2(w, w, x, y, |b, a, c| b.sub(a, c).unwrap().bits().to_vec());
            prop_assert_eq!(bits_to_u128(&out), Some(x.wrapping_sub(y) & m));
            let (out, _) = run2(w, w, x, y, |b, _, c| b.negate(c).bits().to_vec());
            prop_assert_eq!(bits_to_u128(&out), Some(y.wrapping_neg() & m));
            let (out, _) = run2(w, w, x, y, |b, a, c| b.mul(a, c).unwrap().bits().to_vec());
            prop_assert_eq!(bits_to_u128(&out), Some(x.wrapping_mul(y) & m));
        }

        #[test]
        fn mul_wide_is_exact(p in 1usize..=62, q in 1usize..=62, sa in any::<bool>(), sb in any::<bool>(),
                             (sx, rx) in sel_and_value(), (sy, ry) in sel_and_value()) {
            let (x, y) = (pick(p, sx, rx), pick(q, sy, ry));
            let sign = |s: bool| if s { Signedness::Signed } else { Signedness::Unsigned };
            let (out, _) = run2(p, q, x, y, |b, a, c| b.mul_wide(a, sign(sa), c, sign(sb)).bits().to_vec());
            prop_assert_eq!(out.len(), p + q);
            let vx = if sa { signed(x, p) } else { x as i128 };
            let vy = if sb { signed(y, q) } else { y as i128 };
            let want = vx * vy;
            let got = if sa || sb { bits_to_i128(&out).unwrap() } else { bits_to_u128(&out).unwrap() as i128 };
            prop_assert_eq!(got, want);
        }

        #[test]
        fn comparisons_and_equality(w in 1usize..=128, (sx, rx) in sel_and_value(), (sy, ry) in sel_and_value(), near in 0u8..3) {
            let x = pick(w, sx, rx);
            // Often compare against a value next to x, where comparators go wrong.
            let y = match near {
                0 => x.wrapping_add(1) & mask(w),
                1 => x.wrapping_sub(1) & mask(w),
                _ => pick(w, sy, ry),
            };
            let (out, _) = run2(w, w, x, y, |b, a, c| vec![
                b.eq(a, c).unwrap(),
                b.ge_unsigned(a, c).unwrap(),
                b.ge_signed(a, c).unwrap(),
            ]);
            prop_assert_eq!(out, vec![x == y, x >= y, signed(x, w) >= signed(y, w)]);
            let (out, _) = run2(w, w, x, x, |b, a, c| vec![b.eq(a, c).unwrap()]);
            prop_assert_eq!(out, vec![true]);
        }

        #[test]
        fn ge_signed_const_matches_i128(w in 1usize..=128, (sx, rx) in sel_and_value(), delta in -2i128..=2, k in any::<i128>(), far in any::<bool>()) {
            let x = pick(w, sx, rx);
            let vx = signed(x, w);
            // Thresholds next to x (x − 2 ..= x + 2) or anywhere, even outside w bits.
            let c = if far { k } else { vx.saturating_add(delta) };
            let (out, _) = run2(w, 1, x, 0, |b, a, _| vec![b.ge_signed_const(a, c)]);
            prop_assert_eq!(out, vec![vx >= c]);
        }

        #[test]
        fn bit_gadgets(x in any::<bool>(), y in any::<bool>(), s in any::<bool>()) {
            let (out, _) = run2(2, 1, u128::from(x) | (u128::from(s) << 1), u128::from(y), |b, a, c| {
                let (x, s, y) = (a.bits()[0], a.bits()[1], c.bits()[0]);
                let nx = b.not(x);
                vec![b.and(x, y), b.or(x, y), b.xor(x, y), nx, b.mux(s, x, y), b.and(x, nx), b.xor(nx, x)]
            });
            prop_assert_eq!(out, vec![x & y, x | y, x ^ y, !x, if s { x } else { y }, false, true]);
        }
    }

    #[test]
    fn gadget_and_counts() {
        let w = 64;
        let count = |f: &dyn Fn(&mut CircuitBuilder, &Word, &Word)| {
            let mut b = CircuitBuilder::new();
            let x = b.garbler_input(w);
            let y = b.evaluator_input(w);
            f(&mut b, &x, &y);
            b.gates
                .iter()
                .filter(|g| matches!(g, BuilderGate::And(..)))
                .count()
        };
        assert_eq!(count(&|b, x, y| drop(b.add(x, y))), w - 1);
        assert_eq!(count(&|b, x, y| drop(b.sub(x, y))), w - 1);
        assert_eq!(count(&|b, x, y| drop(b.eq(x, y))), w - 1);
        assert_eq!(count(&|b, x, y| drop(b.ge_signed(x, y))), w);
        // A constant with t trailing zeros: the comparator's low t + 1 bits are free.
        assert_eq!(
            count(&|b, x, _| {
                b.ge_signed_const(x, 1 << 20);
            }),
            w - 21
        );
        let mul = count(&|b, x, y| drop(b.mul(x, y)));
        assert!(mul <= w * w, "{mul}");
        println!("AND gates at w = {w}: mul mod 2^w {mul}");
    }

    #[test]
    fn circuit_new_rejects_bad_wiring_and_eval_checks_counts() {
        assert_eq!(
            Circuit::new(1, 1, vec![Gate::And(0, 2)], vec![2]),
            Err(CircuitError::WireOutOfOrder { gate: 0, wire: 2 })
        );
        assert!(matches!(
            Circuit::new(1, 1, vec![Gate::Xor(0, 1)], vec![3]),
            Err(CircuitError::OutputOutOfRange { output: 0, .. })
        ));
        let c = Circuit::new(1, 1, vec![Gate::And(0, 1), Gate::Not(2)], vec![3, 2]).unwrap();
        assert_eq!(c.and_count(), 1);
        assert_eq!(c.eval_plain(&[true], &[true]).unwrap(), vec![false, true]);
        assert_eq!(
            c.eval_plain(&[true, false], &[true]),
            Err(CircuitError::InputCount {
                party: "garbler",
                expected: 1,
                got: 2
            })
        );
        assert!(c.eval_plain(&[true], &[]).is_err());
    }

    #[test]
    fn constant_and_negated_outputs() {
        let mut b = CircuitBuilder::new();
        let x = b.evaluator_input(1);
        let nx = b.not(x.bits()[0]);
        b.output(Bit::constant(true));
        b.output(Bit::constant(false));
        b.output(nx);
        let c = b.build().unwrap();
        for v in [false, true] {
            assert_eq!(c.eval_plain(&[], &[v]).unwrap(), vec![true, false, !v]);
        }
        let mut b = CircuitBuilder::new();
        b.output(Bit::constant(true));
        assert_eq!(b.build(), Err(CircuitError::ConstantOutputWithoutInputs));
    }

    #[test]
    fn bit_helpers() {
        assert_eq!(bits_to_i128(&bits_from_i128(-5, 200)), Some(-5));
        assert_eq!(
            bits_to_i128(&bits_from_i128(i128::MIN, 128)),
            Some(i128::MIN)
        );
        assert_eq!(
            bits_to_u128(&bits_from_u128(u128::MAX, 128)),
            Some(u128::MAX)
        );
        let mut wide = bits_from_u128(1, 130);
        wide[129] = true;
        assert_eq!(bits_to_u128(&wide), None);
        assert_eq!(bits_to_i128(&wide), None);
        let bytes = [0x34, 0x12, 0x01];
        let bits = bits_from_le_bytes(&bytes, 17).unwrap();
        assert_eq!(bits_to_u128(&bits), Some(0x11234));
        assert_eq!(bits_to_le_bytes(&bits), bytes.to_vec());
        assert_eq!(
            bits_from_le_bytes(&bytes, 16),
            Err(CircuitError::ValueTooWide { width: 16 })
        );
        // Trailing zero bytes beyond the width are fine.
        assert_eq!(
            bits_from_le_bytes(&[1, 0, 0, 0], 3).unwrap(),
            vec![true, false, false]
        );
    }

    // ---- the match-check circuit ----

    fn random_biguint(rng: &mut ChaCha20Rng, bits: usize) -> BigUint {
        let mut bytes = vec![0u8; bits.div_ceil(8)];
        rng.fill(&mut bytes[..]);
        BigUint::from_bytes_le(&bytes) % (BigUint::from(1u8) << bits)
    }

    fn le(v: &BigUint) -> Vec<u8> {
        v.to_bytes_le()
    }

    fn mersenne(e: usize) -> BigUint {
        (BigUint::from(1u8) << e) - 1u8
    }

    /// Non-negative residue of v mod m.
    fn modulo(v: &BigInt, m: &BigUint) -> BigUint {
        let m = BigInt::from(m.clone());
        (((v % &m) + &m) % &m).to_biguint().unwrap()
    }

    /// Plaintext semantics of the circuit: D = X − pad mod 2^k read signed; valid iff
    /// a·(D + 2^(k−1)) + c ≡ Y (mod P) with Y taken as given (so Y = P never passes).
    fn reference(w: MatchCheckWidths, [x, y, pad, a, c]: [&BigUint; 5], t: i128) -> [bool; 2] {
        let two_k = BigUint::from(1u8) << w.ip;
        let d = (x + &two_k - (pad % &two_k)) % &two_k;
        let half = BigUint::from(1u8) << (w.ip - 1);
        let ip = if d >= half {
            BigInt::from(d.clone()) - BigInt::from(two_k)
        } else {
            BigInt::from(d.clone())
        };
        let offset = &ip + BigInt::from(half);
        let p = mersenne(w.mac);
        let valid = modulo(
            &(BigInt::from(a.clone()) * offset + BigInt::from(c.clone())),
            &p,
        ) == *y;
        [valid, valid && ip >= BigInt::from(t)]
    }

    fn eval_match(
        c: &Circuit,
        w: MatchCheckWidths,
        [x, y, pad, a, off]: [&BigUint; 5],
    ) -> [bool; 2] {
        let out = c
            .eval_plain(
                &w.garbler_bits(&le(pad), &le(a), &le(off)).unwrap(),
                &w.evaluator_bits(&le(x), &le(y)).unwrap(),
            )
            .unwrap();
        [out[MATCH_CHECK_VALID], out[MATCH_CHECK_MATCHED]]
    }

    /// What an honest terminal and device feed the circuit for IP, pad, a, b over the
    /// integers: [X mod 2^k, a·IP + b mod P, pad mod 2^k, a, (b − a·2^(k−1)) mod P].
    fn honest(
        w: MatchCheckWidths,
        ip: &BigInt,
        pad: &BigUint,
        a: &BigUint,
        b: &BigUint,
    ) -> [BigUint; 5] {
        let two_k = BigUint::from(1u8) << w.ip;
        let p = mersenne(w.mac);
        let (a_i, b_i) = (BigInt::from(a.clone()), BigInt::from(b.clone()));
        let x = modulo(&(ip + BigInt::from(pad.clone())), &two_k);
        let y = modulo(&(&a_i * ip + &b_i), &p);
        let c = modulo(&(&b_i - &a_i * (BigInt::from(1u8) << (w.ip - 1))), &p);
        [x, y, pad % &two_k, a.clone(), c]
    }

    fn refs(v: &[BigUint; 5]) -> [&BigUint; 5] {
        [&v[0], &v[1], &v[2], &v[3], &v[4]]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn reduce_mersenne_is_the_residue(pick in 0usize..12, width in 1usize..=400, seed in any::<u64>()) {
            let e = MERSENNE_EXPONENTS[pick];
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let v = match seed % 4 {
                0 => (BigUint::from(1u8) << width) - 1u8,
                1 => mersenne(e) * (seed % 5),
                _ => random_biguint(&mut rng, width),
            };
            let width = width.max(v.bits() as usize);
            let mut b = CircuitBuilder::new();
            let input = b.evaluator_input(width);
            let r = b.reduce_mersenne(&input, e);
            prop_assert_eq!(r.width(), e);
            b.output_word(&r);
            let c = b.build().unwrap();
            let bits = bits_from_le_bytes(&le(&v), width).unwrap();
            let out = c.eval_plain(&[], &bits).unwrap();
            prop_assert_eq!(BigUint::from_bytes_le(&bits_to_le_bytes(&out)), &v % mersenne(e));
        }
    }

    #[test]
    fn match_check_widths_pick_a_mersenne_prime_above_ip_and_a() {
        assert_eq!(MatchCheckWidths::new(41, 40).unwrap().mac, 61);
        assert_eq!(MatchCheckWidths::new(61, 40).unwrap().mac, 89);
        assert_eq!(MatchCheckWidths::new(41, 127).unwrap().mac, 521);
        assert_eq!(MatchCheckWidths::new(3, 2).unwrap().mac, 5);
        assert!(MatchCheckWidths::new(1279, 2).is_err());
        assert!(MatchCheckWidths::new(1, 2).is_err());
        let w = MatchCheckWidths {
            ip: 41,
            a: 40,
            mac: 41,
        };
        assert_eq!(match_check_circuit(w, 0), Err(CircuitError::BadWidth(41)));
        let w = MatchCheckWidths {
            ip: 41,
            a: 40,
            mac: 60,
        };
        assert_eq!(match_check_circuit(w, 0), Err(CircuitError::BadWidth(60)));
        let w = MatchCheckWidths {
            ip: 41,
            a: 0,
            mac: 61,
        };
        assert_eq!(match_check_circuit(w, 0), Err(CircuitError::BadWidth(0)));
        // pad needs 42 bits: too wide for 41.
        let w = MatchCheckWidths::new(41, 40).unwrap();
        let mut pad = vec![0u8; 6];
        pad[5] = 2;
        assert_eq!(
            w.garbler_bits(&pad, &[1], &[1]),
            Err(CircuitError::ValueTooWide { width: 41 })
        );
    }

    #[test]
    fn match_check_agrees_with_the_integers() {
        let w = MatchCheckWidths::new(41, 40).unwrap();
        let t: i128 = 123_456_789;
        let c = match_check_circuit(w, t).unwrap();
        assert_eq!(
            (c.garbler_inputs(), c.evaluator_inputs(), c.outputs().len()),
            (41 + 40 + 61, 41 + 61, 2)
        );
        let mut rng = ChaCha20Rng::seed_from_u64(0x6d61_7463_6802);
        let bound = (1i128 << 40) - 1;
        let p = mersenne(61);
        for n in 0..3000 {
            let ip: i128 = match n % 6 {
                0 => t,
                1 => t + 1,
                2 => t - 1,
                3 => [bound, -bound, 0, -1][n / 6 % 4],
                _ => rng.gen_range(-bound..=bound),
            };
            // As the terminal draws them: pad and b wide over the integers, a in [1, 2^40).
            let pad = random_biguint(&mut rng, 81);
            let a = random_biguint(&mut rng, 40).max(BigUint::from(1u8));
            let b = random_biguint(&mut rng, 145);
            let ipb = BigInt::from(ip);
            let h = honest(w, &ipb, &pad, &a, &b);
            let got = eval_match(&c, w, refs(&h));
            assert_eq!(got, [true, ip >= t], "ip {ip}");
            assert_eq!(got, reference(w, refs(&h), t));
            // Y moved by ±1 mod P, or replaced by P itself: invalid.
            for y in [(&h[1] + 1u8) % &p, (&h[1] + &p - 1u8) % &p, p.clone()] {
                let v = [&h[0], &y, &h[2], &h[3], &h[4]];
                assert_eq!(eval_match(&c, w, v), [false, false]);
            }
            // X moved by δ ≢ 0 mod 2^41 with Y kept: always invalid, since a·δ' ≢ 0 mod P.
            let delta = match n % 3 {
                0 => BigUint::from(rng.gen_range(1u64..1 << 41)),
                1 => BigUint::from(1u8) << (n % 41),
                _ => BigUint::from(1u8) << 40,
            };
            let x2 = (&h[0] + &delta) % (BigUint::from(1u8) << 41);
            let v = [&x2, &h[1], &h[2], &h[3], &h[4]];
            assert_eq!(eval_match(&c, w, v), [false, false]);
            assert_eq!(reference(w, v, t), [false, false]);
            // A device that knew a could move Y with X: the circuit then reads the new IP.
            // (X* − pad mod 2^41, read signed, is the IP the circuit sees.)
            let two41 = BigInt::from(1u8) << 41;
            let mut ip2: BigInt = modulo(
                &(BigInt::from(x2.clone()) - BigInt::from(h[2].clone())),
                &(BigUint::from(1u8) << 41),
            )
            .into();
            if ip2 >= BigInt::from(1u8) << 40 {
                ip2 -= &two41;
            }
            let cheat = honest(w, &ip2, &BigUint::from(0u8), &a, &b);
            let moved = [
                x2.clone(),
                cheat[1].clone(),
                h[2].clone(),
                a.clone(),
                h[4].clone(),
            ];
            assert_eq!(
                eval_match(&c, w, refs(&moved)),
                reference(w, refs(&moved), t)
            );
            assert!(eval_match(&c, w, refs(&moved))[0]);
        }
        // Arbitrary (mostly inconsistent) inputs, full width.
        for _ in 0..500 {
            let v = [
                random_biguint(&mut rng, 41),
                random_biguint(&mut rng, 61),
                random_biguint(&mut rng, 41),
                random_biguint(&mut rng, 40),
                random_biguint(&mut rng, 61),
            ];
            assert_eq!(eval_match(&c, w, refs(&v)), reference(w, refs(&v), t));
        }
    }

    #[test]
    fn match_check_small_widths_exhaustive() {
        // k = 3, a = 2, P = 31: every input, against the reference.
        let w = MatchCheckWidths::new(3, 2).unwrap();
        let big = |v: u32| BigUint::from(v);
        for t in [-5i128, -4, -1, 0, 1, 3, 4, 100] {
            let c = match_check_circuit(w, t).unwrap();
            for x in 0..8 {
                for y in 0..32 {
                    for pad in 0..8 {
                        for a in 0..4 {
                            for off in 0..32 {
                                let v = [big(x), big(y), big(pad), big(a), big(off)];
                                assert_eq!(
                                    eval_match(&c, w, refs(&v)),
                                    reference(w, refs(&v), t),
                                    "x {x} y {y} pad {pad} a {a} c {off} t {t}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_cheat_passes_for_at_most_one_multiplier() {
        // The device sees X and Y (here: residues) and knows nothing of a. For every honest
        // view and every other (X*, Y*), at most one a ∈ [1, 4) accepts it: the soundness
        // bound 1/(2^a − 1) of the reduction, checked exhaustively at k = 3, a = 2, P = 31.
        let w = MatchCheckWidths::new(3, 2).unwrap();
        let c = match_check_circuit(w, 0).unwrap();
        let p = 31i64;
        for pad in [0u32, 5] {
            for ip in -3i64..=3 {
                for y_honest in 0..31i64 {
                    let x_honest = (ip + i64::from(pad)).rem_euclid(8);
                    for x in (0..8i64).filter(|&x| x != x_honest) {
                        for y in 0..32i64 {
                            let accepted = (1..4i64)
                                .filter(|&a| {
                                    // The b that gives this honest Y for this a.
                                    let b = (y_honest - a * ip).rem_euclid(p);
                                    let off = (b - a * 4).rem_euclid(p);
                                    let v = [x, y, i64::from(pad), a, off]
                                        .map(|v| BigUint::from(v as u64));
                                    eval_match(&c, w, refs(&v))[0]
                                })
                                .count();
                            assert!(accepted <= 1, "pad {pad} ip {ip} X* {x} Y* {y}: {accepted}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn match_check_and_counts() {
        for (ip, a) in [(41, 40), (43, 40), (61, 64), (41, 128)] {
            let w = MatchCheckWidths::new(ip, a).unwrap();
            let c = match_check_circuit(w, 1000).unwrap();
            println!(
                "match-check [k {ip}, a {a}, e {}]: {} AND gates ({} KiB of tables), {} free gates, {} evaluator inputs",
                w.mac,
                c.and_count(),
                c.and_count() * 32 / 1024,
                c.free_gate_count(),
                c.evaluator_inputs()
            );
            // ≈ 2·a·k + 4·e + 2·k, with slack.
            let bound = 2 * w.a * w.ip + 5 * w.mac + 3 * w.ip;
            assert!(c.and_count() <= bound, "{} > {bound}", c.and_count());
        }
    }
}
