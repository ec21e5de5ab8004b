//! The threshold comparison of the deployed iris matcher ([BGK+24] §5, the comparison lemma;
//! [TACEO24] §2.2 MSB extraction): from shares of the code dot product c and the mask dot product
//! m, a bit-sliced replicated binary share of "match" = (fhd < τ), **exactly**, for every
//! τ = P/Q with Q = 10,000 (τ given with up to four decimals, e.g. 0.345 = 3,450/10,000).
//!
//! **Share layout.** Input per comparison: c and m as replicated Z_2^32 shares
//! ([`compare_program`]) or as replicated Z_2^16 shares ([`LiftCompareProgram`], which lifts
//! both first); party i holds (x_i, x_{i−1}), [`crate::iris::sharing::replicated`]. Output: one
//! [`BitSliced`] vector, bit k = match of comparison k, replicated XOR shares.
//!
//! **Threshold derivation.** Over the full 12,800 bits let `common` = popcount(ma ∧ mb) and
//! `hd` = popcount((ca ⊕ cb) ∧ ma ∧ mb). The code encoding gives c = common − 2·hd
//! (|c| ≤ 12,800); the mask is shared as its real half only, so the mask dot product is
//! m = common / 2 (0 ≤ m ≤ 6,400; docs/protocols/iris.md, [`crate::iris::encoding`]). Hence
//! common = 2m and hd = (2m − c)/2. For τ = P/Q (integers, Q = 10,000, 0 ≤ P ≤ Q):
//!
//! fhd < τ ⇔ hd·Q < P·common (common > 0) ⇔ (2m − c)·Q < 4P·m ⇔ Q·c − (2Q − 4P)·m > 0.
//!
//! With **A = 2Q − 4P** and **B = Q** let x = A·m − B·c. Then match ⇔ x < 0, all in exact
//! integer arithmetic (no rounding of τ at all). The factor 2 in A is the correction for the
//! half-size mask dot product. For τ = 0.345: P = 3,450, A = 6,200, B = 10,000 (A/B = 31/50 =
//! 2(1 − 2τ) exactly).
//!
//! * Strictness: fhd = τ exactly (hd = 69, common = 200; hd = 138, common = 400; …) gives
//!   x = 0, whose MSB is 0: no match, as the strict fhd < τ of the plaintext matcher demands.
//!   We therefore use x itself, never x − 1 (MSB(x − 1) = 1 ⇔ x ≤ 0 would be fhd ≤ τ).
//! * common = 0 (no overlap): c = m = 0, x = 0, no match.
//!
//! **Range.** For valid inputs (0 ≤ m ≤ 6,400, |c| ≤ 2m) and 0 ≤ P ≤ Q (so |A| ≤ 2Q),
//! |x| ≤ |A|·m + Q·|c| ≤ 2Q·m + 2Q·m = 4Q·m ≤ 2.56·10^8 < 2^31. So x computed in Z_2^32 and
//! read as a signed 32-bit integer is exact, and its MSB is 1 exactly when x < 0, i.e. exactly
//! when the pair matches. (The bound holds for every m < 2^31 / (4Q) ≈ 53,687.)
//!
//! **Why c must be lifted too.** The previous design used B = 2^16 so that B·c was exact in
//! Z_2^32 straight from 16-bit shares (the wrap-around k·2^16 of the components vanishes when
//! multiplied by 2^16), but then A = 2(1 − 2τ)·B is an integer only for τ a multiple of 2^−18,
//! and τ = 0.345 misclassified the 78 pairs with fhd in [90,439/2^18, 0.345). With B = Q =
//! 10,000 the wrap-around of the 16-bit components no longer vanishes, so c needs a real
//! Z_2^32 sharing of x. [`LiftCompareProgram`] never lifts c or m themselves: it computes x
//! from the zero-extended 16-bit components and subtracts the components' wrap-arounds
//! 2^16·(A·k_m − B·k_c) inside the binary sum that extracts the MSB (the wrap counts are two
//! shared bits each, found as in [`crate::iris::mpc::lift`]; times public constants they are free
//! binary rows). c is offset to c + 2^15 ∈ [19,968, 45,568] ⊂ [0, 2^16) first, so that its
//! wrap count is that of an unsigned value, and the offset is taken back as + B·2^15.
//!
//! **Rounds.** [`MsbProgram`]: 7 ([`crate::iris::mpc::binary::CarryProgram`] into bit 31: carry-save
//! layer 1, generate 1, carry tree ⌈log2 30⌉ = 5), each one message from party i to party i+1;
//! [`LiftCompareProgram`] (from 16-bit shares) [`lift_compare_rounds`]: 14 for τ = 0.345 (13–14
//! for every τ; 15 when c and m were lifted to Z_2^32 by bit injection, with 64.2 instead of
//! 36.7 bytes per comparison and party in a whole search); opening the result
//! ([`crate::iris::mpc::binary::open_message`]) is one more.

use std::num::Wrapping;

use crate::algebra::ring::{Z16, Z32};
use crate::iris::mpc::binary::{
    component_planes, BitSliced, BothProgram, CarryOutput, CarryProgram, Gates, MpcError,
    OperandCarryProgram, Products, Program, ProgramStep,
};
use crate::iris::sharing::replicated::ReplicatedShare;
use crate::party::PartyIndex;

/// The denominator Q of the threshold ratio τ = P/Q (τ has at most four decimals); also the
/// scale B of the code dot product in x = A·m − B·c (module docs).
pub const Q: i64 = 10_000;

/// The offset 2^15 that makes the signed code dot product unsigned for the lift (module docs).
const CODE_OFFSET: u32 = 1 << 15;

/// The exact threshold ratio τ = P / [`Q`] and its comparison constants A = 2Q − 4P, B = Q
/// (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    p: i64,
}

impl Threshold {
    /// The threshold for the ratio `tau` ∈ [0, 1] with at most four decimals:
    /// P = round(τ·10,000), so `from_ratio(0.345)` is exactly 3,450/10,000. Fails for a
    /// non-finite or out-of-range τ and for a τ that is not a multiple of 1/10,000 (more than
    /// four decimals, e.g. 0.34505), rather than silently rounding it.
    pub fn from_ratio(tau: f64) -> Result<Self, MpcError> {
        if !tau.is_finite() || !(0.0..=1.0).contains(&tau) {
            return Err(MpcError::InvalidInput("threshold ratio must be in [0, 1]"));
        }
        let scaled = tau * Q as f64;
        let p = scaled.round();
        // A decimal with four digits is not exact in binary; τ·Q lies within a few ulps of the
        // integer P. Anything farther away has more than four decimals.
        if (scaled - p).abs() > 1e-6 {
            return Err(MpcError::InvalidInput(
                "threshold ratio must have at most four decimals",
            ));
        }
        Self::from_ten_thousandths(p as u32)
    }

    /// The threshold for the exact ratio `numerator` / 10,000 (0 ≤ numerator ≤ 10,000).
    pub fn from_ten_thousandths(numerator: u32) -> Result<Self, MpcError> {
        let p = i64::from(numerator);
        if p > Q {
            return Err(MpcError::InvalidInput(
                "threshold numerator must be <= 10,000",
            ));
        }
        Ok(Self { p })
    }

    /// The numerator P of τ = P / [`Q`].
    pub fn numerator(&self) -> i64 {
        self.p
    }

    /// The constant A = 2Q − 4P multiplying the mask dot product.
    pub fn a(&self) -> i64 {
        2 * Q - 4 * self.p
    }

    /// The constant B = Q multiplying the code dot product.
    pub fn b(&self) -> i64 {
        Q
    }

    /// The plaintext value x = A·m − B·c of one comparison (the reference of the MPC).
    pub fn plain_x(&self, code_dot: i64, mask_dot: i64) -> i64 {
        self.a() * mask_dot - self.b() * code_dot
    }

    /// The plaintext decision of the protocol: x < 0 (with exact integers), which is
    /// hd·Q < P·common, i.e. fhd < τ (module docs).
    pub fn plain_match(&self, code_dot: i64, mask_dot: i64) -> bool {
        self.plain_x(code_dot, mask_dot) < 0
    }
}

/// This party's replicated Z_2^32 share of x = A·m − B·c for each comparison (local; module
/// docs). `code` and `mask` are the 32-bit code and mask dot product shares (c as a signed
/// value in two's complement). Fails if the lengths differ.
pub fn masked_difference(
    threshold: &Threshold,
    code: &[ReplicatedShare<Z32>],
    mask: &[ReplicatedShare<Z32>],
) -> Result<Vec<ReplicatedShare<Z32>>, MpcError> {
    if code.len() != mask.len() {
        return Err(MpcError::LengthMismatch {
            what: "code and mask dot products",
            left: code.len(),
            right: mask.len(),
        });
    }
    // A and B as elements of Z_2^32 (two's complement for negative A).
    let a = Wrapping(threshold.a() as u32);
    let b = Wrapping(threshold.b() as u32);
    Ok(code
        .iter()
        .zip(mask)
        .map(|(&c, &m)| m.mul_constant(a) - c.mul_constant(b))
        .collect())
}

/// MSB extraction of replicated Z_2^32 values ([BGK+24] §5, [TACEO24] §2.2): bit 31 of
/// x = x0 + x1 + x2 is s_31 ⊕ c_30 ⊕ (carry into bit 31 of s + 2c), where s, c come from the
/// carry-save layer. 7 rounds. Output: bit k = MSB of value k.
#[derive(Debug)]
pub struct MsbProgram {
    inner: CarryProgram,
}

impl MsbProgram {
    /// The MSB extraction of this party's shares `values`.
    pub fn new(values: &[ReplicatedShare<Z32>], party: PartyIndex) -> Result<Self, MpcError> {
        Ok(Self {
            inner: CarryProgram::new(values, 32, 31, party)?,
        })
    }
}

impl Program for MsbProgram {
    type Output = BitSliced;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<BitSliced>, MpcError> {
        match self.inner.next(party, products)? {
            ProgramStep::Gates(g) => Ok(ProgramStep::Gates(g)),
            ProgramStep::Done(CarryOutput { s, c, carry }) => {
                let (s31, c30) = match (s.get(31), c.get(30)) {
                    (Some(s31), Some(c30)) => (s31, c30),
                    _ => return Err(MpcError::OutOfStep("msb")),
                };
                Ok(ProgramStep::Done(s31.xor_same(c30).xor_same(&carry)))
            }
        }
    }
}

/// The comparison program of [BGK+24] §5 on 32-bit shares: x = A·m − B·c locally, then
/// [`MsbProgram`] (7 rounds). Output bit k = 1 ⇔ comparison k matches (fhd < τ exactly,
/// module docs).
pub fn compare_program(
    threshold: &Threshold,
    code: &[ReplicatedShare<Z32>],
    mask: &[ReplicatedShare<Z32>],
    party: PartyIndex,
) -> Result<MsbProgram, MpcError> {
    MsbProgram::new(&masked_difference(threshold, code, mask)?, party)
}

/// Operands of a multi-operand binary sum, as rows of 32 bit planes (least significant
/// first); `None` is a plane known to be zero (no gate is spent on it).
type Rows = Vec<Vec<Option<BitSliced>>>;

/// Bits of x.
const WIDTH: usize = 32;

/// The lift's corrections have weight 2^16 and up: columns below never receive them.
const LOW: usize = 16;

/// A full or half adder whose AND is in flight: its carry lands in column `column` of the
/// carry row of its group; `c` is the third input (or `None` for a half adder).
#[derive(Debug)]
struct PendingCarry {
    group: usize,
    column: usize,
    c: Option<BitSliced>,
}

/// One carry-save layer ([TACEO24] §2.2, applied to rows as in a Wallace tree): the rows are
/// taken three at a time (one or two left over pass unchanged); each triple gives a sum row
/// and a carry row shifted one column up. Per column a gate is spent only where two or three
/// inputs are present (full adder maj(a, b, c) = ((a ⊕ c) ∧ (b ⊕ c)) ⊕ c, half adder a ∧ b),
/// and none in the top column (its carry would leave the 32 bits). Returns the rows (carry
/// rows filled by [`land_carries`]), the AND gates and the carries they make.
fn csa_rows(rows: Rows) -> (Rows, Vec<(BitSliced, BitSliced)>, Vec<PendingCarry>) {
    let mut out: Rows = Vec::with_capacity(rows.len());
    let mut gates = Vec::new();
    let mut pending = Vec::new();
    let triples = rows.len() / 3;
    let mut it = rows.into_iter();
    for _ in 0..triples {
        let mut inputs: Vec<Vec<Option<BitSliced>>> = it.by_ref().take(3).collect();
        let group = out.len() + 1; // where this triple's carry row goes in `out`
        let mut sum = vec![None; WIDTH];
        for (k, slot) in sum.iter_mut().enumerate() {
            // The inputs are owned: their planes move into the gates instead of being copied.
            let present: Vec<BitSliced> = inputs.iter_mut().filter_map(|r| r[k].take()).collect();
            *slot = match present.as_slice() {
                [] => None,
                [a] => Some(a.clone()),
                [a, rest @ ..] => Some(rest.iter().fold(a.clone(), |acc, b| acc.xor_same(b))),
            };
            if k + 1 >= WIDTH {
                continue;
            }
            let mut bits = present.into_iter();
            match (bits.next(), bits.next(), bits.next()) {
                (Some(a), Some(b), None) => {
                    gates.push((a, b));
                    pending.push(PendingCarry {
                        group,
                        column: k + 1,
                        c: None,
                    });
                }
                (Some(a), Some(b), Some(c)) => {
                    gates.push((a.xor_same(&c), b.xor_same(&c)));
                    pending.push(PendingCarry {
                        group,
                        column: k + 1,
                        c: Some(c),
                    });
                }
                _ => {}
            }
        }
        out.push(sum);
        out.push(vec![None; WIDTH]);
    }
    out.extend(it);
    (out, gates, pending)
}

/// Puts the carries of a finished [`csa_rows`] layer into their rows.
fn land_carries(
    rows: &mut Rows,
    pending: Vec<PendingCarry>,
    products: Vec<BitSliced>,
) -> Result<(), MpcError> {
    if products.len() != pending.len() {
        return Err(MpcError::OutOfStep("carry-save rows"));
    }
    for (p, product) in pending.into_iter().zip(products) {
        let carry = match &p.c {
            Some(c) => product.xor_same(c),
            None => product,
        };
        let slot = rows
            .get_mut(p.group)
            .and_then(|row| row.get_mut(p.column))
            .ok_or(MpcError::OutOfStep("carry-save rows"))?;
        *slot = Some(carry);
    }
    Ok(())
}

/// Merges rows whose present planes are in disjoint columns (local: the sum is the same).
fn merge_disjoint(rows: Rows) -> Rows {
    let mut out: Rows = Vec::with_capacity(rows.len());
    for row in rows {
        let fits = out
            .iter()
            .position(|o| o.iter().zip(&row).all(|(x, y)| x.is_none() || y.is_none()));
        match fits {
            Some(i) => {
                for (slot, plane) in out[i].iter_mut().zip(row) {
                    if plane.is_some() {
                        *slot = plane;
                    }
                }
            }
            None => out.push(row),
        }
    }
    out.retain(|row| row.iter().any(Option::is_some));
    out
}
/// Rows `rows` (at most two) restricted to columns below `top` as planes (a missing plane is
/// a zero plane), and the lowest position from `from` on where both rows are present (no
/// carry arises below it).
fn two_operands(
    rows: &Rows,
    from: usize,
    top: usize,
    len: usize,
) -> Result<(Vec<BitSliced>, Vec<BitSliced>, usize), MpcError> {
    if rows.len() > 2 {
        return Err(MpcError::OutOfStep("two operands"));
    }
    let plane = |r: usize, k: usize| {
        rows.get(r)
            .and_then(|row| row[k].clone())
            .unwrap_or_else(|| BitSliced::zeros(len))
    };
    let both = |k: usize| (0..2).all(|r| rows.get(r).is_some_and(|row| row[k].is_some()));
    let x = (0..top).map(|k| plane(0, k)).collect();
    let y = (0..top).map(|k| plane(1, k)).collect();
    let first = (from..top).find(|&k| both(k)).unwrap_or(top);
    Ok((x, y, first))
}

/// The low half of x = A·m − B·c from its three 32-bit components: one carry-save layer over
/// all columns (round 1), then the carry into bit 16 of the two rows in columns 0..15
/// (5 rounds). Output: the two rows (columns 16 and up still to be summed) and that carry.
#[derive(Debug)]
struct LowHalfProgram {
    len: usize,
    rows: Rows,
    pending: Vec<PendingCarry>,
    carry: Option<OperandCarryProgram>,
}

impl LowHalfProgram {
    fn new(x: &[ReplicatedShare<Z32>], party: PartyIndex) -> Self {
        let rows = component_planes(x, WIDTH, party)
            .into_iter()
            .map(|planes| planes.into_iter().map(Some).collect())
            .collect();
        Self {
            len: x.len(),
            rows,
            pending: Vec::new(),
            carry: None,
        }
    }

    fn carry_step(&mut self, step: ProgramStep<BitSliced>) -> ProgramStep<(Rows, BitSliced)> {
        match step {
            ProgramStep::Gates(g) => ProgramStep::Gates(g),
            ProgramStep::Done(c16) => {
                self.carry = None;
                ProgramStep::Done((std::mem::take(&mut self.rows), c16))
            }
        }
    }
}

impl Program for LowHalfProgram {
    type Output = (Rows, BitSliced);

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        if let Some(carry) = self.carry.as_mut() {
            let step = carry.next(party, products)?;
            return Ok(self.carry_step(step));
        }
        match products {
            Products::Start => {
                let (rows, gates, pending) = csa_rows(std::mem::take(&mut self.rows));
                self.rows = rows;
                self.pending = pending;
                Ok(ProgramStep::Gates(Gates::And(gates)))
            }
            Products::And(maj) => {
                land_carries(&mut self.rows, std::mem::take(&mut self.pending), maj)?;
                let (x, y, first) = two_operands(&self.rows, 0, LOW, self.len)?;
                for row in &mut self.rows {
                    row[..LOW].fill(None);
                }
                let mut carry = OperandCarryProgram::new(x, y, first, LOW)?;
                let step = carry.next(party, Products::Start)?;
                self.carry = Some(carry);
                Ok(self.carry_step(step))
            }
            Products::Mul(_) => Err(MpcError::OutOfStep("low half")),
        }
    }
}

/// The rows of columns 16..31 once the lift is done: x's two rows, the carry into bit 16, and
/// the corrections 2^16·κ·bit for the wrap bits (u, v) of each block (code, mask), merged
/// where their columns do not overlap.
fn upper_rows(
    rows: Rows,
    c16: BitSliced,
    wraps: [[BitSliced; 2]; 2],
    threshold: &Threshold,
) -> Rows {
    let mut all = rows;
    let mut carry_in = vec![None; WIDTH];
    carry_in[LOW] = Some(c16);
    all.push(carry_in);
    for (kappa, bits) in correction_constants(threshold).into_iter().zip(wraps) {
        for bit in bits {
            let row = (0..WIDTH)
                .map(|k| (k >= LOW && (kappa >> (k - LOW)) & 1 == 1).then(|| bit.clone()))
                .collect();
            all.push(row);
        }
    }
    merge_disjoint(all)
}

/// Once two upper rows are left: the program of the carry into bit 31 of their sum, and the
/// parity of column 31 (bit 31 of x is their XOR).
fn top_carry(rows: &Rows, len: usize) -> Result<(OperandCarryProgram, BitSliced), MpcError> {
    let top = WIDTH - 1;
    let (x, y, first) = two_operands(rows, LOW, top, len)?;
    let mut parity = BitSliced::zeros(len);
    for row in rows {
        if let Some(bit) = &row[top] {
            parity = parity.xor_same(bit);
        }
    }
    Ok((OperandCarryProgram::new(x, y, first, top)?, parity))
}

/// The whole comparison from 16-bit shares ([BGK+24] §5, MPCLift and the comparison, with the
/// lift folded into the comparison's binary sum so that no value is lifted to Z_2^32).
///
/// Over the integers the components of c' = c + 2^15 and of m wrap k_c, k_m ∈ {0, 1, 2} times
/// 2^16 ([`crate::iris::mpc::lift`]); with zero-extended components X_j = A·m_j − B·c'_j (+ B·2^15 on
/// X_0), x = A·m − B·c = X_0 + X_1 + X_2 + 2^16·(B·k_c − A·k_m) mod 2^32. The wrap counts are
/// k = u + v with the bits u, v of [`CarryProgram`] (carry-save bit 15 and the carry out of
/// the 16-bit sum), so the correction is four binary rows 2^16·κ·bit (κ = B or −A mod 2^16):
/// public constants times shared bits, free. Rounds 1–6: the wrap bits of c' ‖ m side by side
/// with the low half of x (a carry-save layer over the three components, then the carry into
/// bit 16); then carry-save layers over columns 16..31 until two rows are left, and the carry
/// into bit 31 ([`OperandCarryProgram`]); MSB(x) = the parity of column 31 ⊕ that carry.
/// [`lift_compare_rounds`] counts the rounds (14 for τ = 0.345). Output as
/// [`compare_program`].
pub struct LiftCompareProgram {
    len: usize,
    wraps_for: Threshold,
    stage: Stage,
}

/// Where a [`LiftCompareProgram`] is.
enum Stage {
    /// Rounds 1–6: the wrap bits ‖ the low half of x.
    Lift(Box<BothProgram<CarryProgram, LowHalfProgram>>),
    /// A carry-save layer over the upper rows (its carries in flight).
    Reduce {
        rows: Rows,
        pending: Vec<PendingCarry>,
    },
    /// The carry into bit 31, and the parity of column 31.
    Top {
        carry: OperandCarryProgram,
        parity: BitSliced,
    },
    Finished,
}

impl std::fmt::Debug for LiftCompareProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LiftCompareProgram({} comparisons, <redacted>)",
            self.len
        )
    }
}

/// The public constants κ of the correction rows 2^16·κ·bit, per block (code, then mask):
/// B for the code's wraps, −A for the mask's (mod 2^16).
fn correction_constants(threshold: &Threshold) -> [u32; 2] {
    let wrap = 1i64 << 16;
    [
        threshold.b().rem_euclid(wrap) as u32,
        (-threshold.a()).rem_euclid(wrap) as u32,
    ]
}

/// The wrap bits (u, v) of the code block and the mask block from the lift's carry output
/// over c' ‖ m.
fn wrap_bits(lifted: &CarryOutput, len: usize) -> Result<[[BitSliced; 2]; 2], MpcError> {
    let u = lifted.c.get(15).ok_or(MpcError::OutOfStep("lift"))?;
    let v = &lifted.carry;
    Ok([
        [u.slice(0, len)?, v.slice(0, len)?],
        [u.slice(len, len)?, v.slice(len, len)?],
    ])
}

impl LiftCompareProgram {
    /// The comparison of this party's 16-bit code and mask dot product shares; fails if the
    /// lengths differ.
    pub fn new(
        threshold: &Threshold,
        code: &[ReplicatedShare<Z16>],
        mask: &[ReplicatedShare<Z16>],
        party: PartyIndex,
    ) -> Result<Self, MpcError> {
        if code.len() != mask.len() {
            return Err(MpcError::LengthMismatch {
                what: "code and mask dot products",
                left: code.len(),
                right: mask.len(),
            });
        }
        let zext = |s: ReplicatedShare<Z16>| ReplicatedShare::<Z32> {
            a: Wrapping(u32::from(s.a.0)),
            b: Wrapping(u32::from(s.b.0)),
        };
        // c' = c + 2^15 ∈ [0, 2^16) (unsigned, as the wrap count needs), then m: one batch.
        let offset = Wrapping(CODE_OFFSET as u16);
        let values: Vec<ReplicatedShare<Z32>> = code
            .iter()
            .map(|&c| zext(c.add_constant(offset, party)))
            .chain(mask.iter().map(|&m| zext(m)))
            .collect();
        let (code32, mask32) = values.split_at(code.len());
        // X = A·m − B·c' + B·2^15 on the zero-extended components.
        let plus = Wrapping((threshold.b() as u32).wrapping_mul(CODE_OFFSET));
        let x: Vec<ReplicatedShare<Z32>> = masked_difference(threshold, code32, mask32)?
            .into_iter()
            .map(|v| v.add_constant(plus, party))
            .collect();
        let lift = CarryProgram::new(&values, 16, 16, party)?;
        let low = LowHalfProgram::new(&x, party);
        Ok(Self {
            len: code.len(),
            wraps_for: *threshold,
            stage: Stage::Lift(Box::new(BothProgram::new(lift, low))),
        })
    }

    /// The next carry-save layer over the upper rows, or the top carry once two are left.
    fn reduce_or_finish(
        &mut self,
        party: PartyIndex,
        rows: Rows,
    ) -> Result<ProgramStep<BitSliced>, MpcError> {
        if rows.len() > 2 {
            let (rows, gates, pending) = csa_rows(rows);
            self.stage = Stage::Reduce { rows, pending };
            return Ok(ProgramStep::Gates(Gates::And(gates)));
        }
        let (mut carry, parity) = top_carry(&rows, self.len)?;
        match carry.next(party, Products::Start)? {
            ProgramStep::Gates(g) => {
                self.stage = Stage::Top { carry, parity };
                Ok(ProgramStep::Gates(g))
            }
            ProgramStep::Done(c31) => Ok(ProgramStep::Done(parity.xor_same(&c31))),
        }
    }
}

impl Program for LiftCompareProgram {
    type Output = BitSliced;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<BitSliced>, MpcError> {
        match std::mem::replace(&mut self.stage, Stage::Finished) {
            Stage::Lift(mut both) => match both.next(party, products)? {
                ProgramStep::Gates(g) => {
                    self.stage = Stage::Lift(both);
                    Ok(ProgramStep::Gates(g))
                }
                ProgramStep::Done((lifted, (rows, c16))) => {
                    let wraps = wrap_bits(&lifted, self.len)?;
                    drop(lifted);
                    let rows = upper_rows(rows, c16, wraps, &self.wraps_for);
                    self.reduce_or_finish(party, rows)
                }
            },
            Stage::Reduce { mut rows, pending } => {
                let Products::And(maj) = products else {
                    return Err(MpcError::OutOfStep("lift and compare"));
                };
                land_carries(&mut rows, pending, maj)?;
                self.reduce_or_finish(party, rows)
            }
            Stage::Top { mut carry, parity } => match carry.next(party, products)? {
                ProgramStep::Gates(g) => {
                    self.stage = Stage::Top { carry, parity };
                    Ok(ProgramStep::Gates(g))
                }
                ProgramStep::Done(c31) => Ok(ProgramStep::Done(parity.xor_same(&c31))),
            },
            Stage::Finished => Err(MpcError::OutOfStep("lift and compare")),
        }
    }
}

/// The rounds of [`LiftCompareProgram`] for `threshold` (public: they depend on the bits of
/// the constants A and B only): 6 (wrap bits ‖ low half), one per carry-save layer over the
/// upper rows, then 1 + ⌈log2(positions)⌉ for the carry into bit 31. Counted by running the
/// program's own planning on empty planes.
pub fn lift_compare_rounds(threshold: &Threshold) -> u32 {
    let empty = || BitSliced::zeros(0);
    let x_rows: Rows = (0..2)
        .map(|_| (0..WIDTH).map(|k| (k >= LOW).then(empty)).collect())
        .collect();
    let wraps = [[empty(), empty()], [empty(), empty()]];
    let mut rows = upper_rows(x_rows, empty(), wraps, threshold);
    let mut rounds = 6;
    while rows.len() > 2 {
        let (next, gates, pending) = csa_rows(rows);
        rows = next;
        let products = gates.iter().map(|_| empty()).collect();
        if land_carries(&mut rows, pending, products).is_err() {
            break;
        }
        rounds += 1;
    }
    let top = WIDTH - 1;
    let first = two_operands(&rows, LOW, top, 0).map_or(top, |(_, _, first)| first);
    let positions = (top - first) as u32;
    if positions > 0 {
        rounds += 1 + positions.next_power_of_two().trailing_zeros();
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// τ = 0.345, the deployed default (whose one definition is the iris policy's).
    fn tau_0345() -> Threshold {
        Threshold::from_ten_thousandths(3_450).expect("τ = 0.345")
    }
    use crate::iris::mpc::binary::testing::{contexts, run, run_with_transcript, share_u32};
    use crate::iris::mpc::binary::{open_message, open_receive, reconstruct_bits, unpack_bits};
    use crate::iris::sharing::replicated::share;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    /// (hd, common) → (code dot, mask dot) with the iris encoding (common even).
    fn dots(hd: i64, common: i64) -> (i64, i64) {
        (common - 2 * hd, common / 2)
    }

    /// The exact rational reference for τ = 0.345 = 69/200: hd/common < 69/200.
    fn rational_0345(hd: i64, common: i64) -> bool {
        common > 0 && 200 * hd < 69 * common
    }

    /// Opens bit-sliced output shares through the message-driven opening (all three agree).
    fn open(out: &[BitSliced; 3], len: usize) -> Vec<bool> {
        let msgs = [0, 1, 2].map(|i| open_message(P[i], &out[i], &P).unwrap());
        let mut opened = Vec::new();
        for i in 0..3 {
            let from = P[i].prev();
            opened.push(open_receive(P[i], &out[i], from, &msgs[from.as_usize()].payload).unwrap());
        }
        assert!(opened.iter().all(|o| *o == opened[0]));
        assert_eq!(reconstruct_bits(out).unwrap(), opened[0]);
        unpack_bits(&opened[0], len)
    }

    /// Runs the MPC comparison on 32-bit shares of (code dot, mask dot) pairs and opens it.
    fn mpc_compare(threshold: &Threshold, pairs: &[(i64, i64)], seed: u64) -> Vec<bool> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut code: [Vec<ReplicatedShare<Z32>>; 3] = Default::default();
        let mut mask: [Vec<ReplicatedShare<Z32>>; 3] = Default::default();
        for &(c, m) in pairs {
            let sc = share(Wrapping(c as u32), &mut rng);
            let sm = share(Wrapping(m as u32), &mut rng);
            for i in 0..3 {
                code[i].push(sc[i]);
                mask[i].push(sm[i]);
            }
        }
        let progs =
            [0, 1, 2].map(|i| compare_program(threshold, &code[i], &mask[i], P[i]).unwrap());
        let (out, stats) = run(&contexts(seed as u8, [9; 16]), b"compare", progs).unwrap();
        assert_eq!(stats.rounds, 7);
        open(&out, pairs.len())
    }

    /// Runs the whole comparison from 16-bit shares (lift of c and m, then MSB) and opens it.
    fn mpc_lift_compare(threshold: &Threshold, pairs: &[(i64, i64)], seed: u64) -> Vec<bool> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut code: [Vec<ReplicatedShare<Z16>>; 3] = Default::default();
        let mut mask: [Vec<ReplicatedShare<Z16>>; 3] = Default::default();
        for &(c, m) in pairs {
            let sc = share(Wrapping(c as u16), &mut rng);
            let sm = share(Wrapping(m as u16), &mut rng);
            for i in 0..3 {
                code[i].push(sc[i]);
                mask[i].push(sm[i]);
            }
        }
        let progs = [0, 1, 2]
            .map(|i| LiftCompareProgram::new(threshold, &code[i], &mask[i], P[i]).unwrap());
        let (out, stats) = run(&contexts(seed as u8, [4; 16]), b"lift+cmp", progs).unwrap();
        assert_eq!(
            stats.rounds,
            lift_compare_rounds(threshold),
            "rounds as counted"
        );
        assert!(
            stats.rounds <= 15,
            "no more rounds than lifting both values"
        );
        open(&out, pairs.len())
    }

    /// Random valid (hd, common) pairs: half uniform, half within ±2 of τ = num/den.
    fn cases(rng: &mut ChaCha20Rng, n: usize, num: i64, den: i64) -> Vec<(i64, i64)> {
        (0..n)
            .map(|k| {
                let m = rng.gen_range(0..=6400i64);
                let common = 2 * m;
                let hd = if k % 2 == 0 {
                    rng.gen_range(0..=common)
                } else {
                    let edge = common * num / den;
                    (edge + rng.gen_range(-2..=2i64)).clamp(0, common)
                };
                (hd, common)
            })
            .collect()
    }

    /// The 78 pairs that the former dyadic constant A = 40,633 (τ_A = 90,439/2^18) missed:
    /// 90,439/2^18 ≤ hd/common < 69/200, common even ≤ 12,800.
    fn former_band() -> Vec<(i64, i64)> {
        let mut band = Vec::new();
        for common in (2..=12_800i64).step_by(2) {
            for hd in 0..=common {
                if rational_0345(hd, common) && hd * (1 << 18) >= 90_439 * common {
                    band.push((hd, common));
                }
            }
        }
        band
    }

    /// For every even common in 2..=12,800: the pairs at ±1 around the boundary hd* (the
    /// smallest non-matching hd, hd* = ⌈0.345·common⌉) and hd* itself; for common a multiple of
    /// 200, hd* is fhd = τ exactly.
    fn boundary_sweep() -> Vec<(i64, i64)> {
        let mut cs = Vec::new();
        for common in (2..=12_800i64).step_by(2) {
            let edge = (69 * common + 199) / 200;
            for hd in edge - 2..=edge + 1 {
                if (0..=common).contains(&hd) {
                    cs.push((hd, common));
                }
            }
        }
        cs
    }

    #[test]
    fn constants() {
        let t = tau_0345();
        assert_eq!(t.numerator(), 3450);
        assert_eq!(t.a(), 6200);
        assert_eq!(t.b(), 10_000);
        // A/B = 2(1 − 2τ) = 31/50 exactly.
        assert_eq!(t.a() * 50, t.b() * 31);
        assert_eq!(Threshold::from_ratio(0.345), Ok(t));
        assert_eq!(Threshold::from_ten_thousandths(3450), Ok(t));
        assert_eq!(
            Threshold::from_ratio(0.3),
            Threshold::from_ten_thousandths(3000)
        );
        assert_eq!(Threshold::from_ratio(0.0001).unwrap().numerator(), 1);
        assert_eq!(Threshold::from_ratio(0.9999).unwrap().numerator(), 9999);
        assert_eq!(Threshold::from_ratio(1.0).unwrap().numerator(), 10_000);
        assert_eq!(Threshold::from_ratio(0.0).unwrap().numerator(), 0);
        assert!(Threshold::from_ratio(1.5).is_err());
        assert!(Threshold::from_ratio(-0.1).is_err());
        assert!(Threshold::from_ratio(f64::NAN).is_err());
        assert!(Threshold::from_ratio(f64::INFINITY).is_err());
        assert!(Threshold::from_ratio(0.34505).is_err(), "five decimals");
        assert!(Threshold::from_ratio(1.0 / 3.0).is_err());
        assert!(Threshold::from_ten_thousandths(10_001).is_err());
        // Every four-decimal τ is accepted with exactly its numerator.
        for p in 0..=10_000u32 {
            let tau: f64 = format!("0.{p:04}").parse().unwrap();
            let tau = if p == 10_000 { 1.0 } else { tau };
            assert_eq!(
                Threshold::from_ratio(tau).unwrap().numerator(),
                i64::from(p)
            );
        }
    }

    #[test]
    fn former_rounding_band_has_78_pairs() {
        let band = former_band();
        assert_eq!(band.len(), 78);
        assert_eq!(band[0], (1331, 3858));
        // The exact plaintext decision matches all of them now.
        let t = tau_0345();
        for &(hd, common) in &band {
            let (c, m) = dots(hd, common);
            assert!(t.plain_match(c, m), "hd {hd} common {common}");
        }
    }

    #[test]
    fn default_threshold_is_exact_on_the_whole_boundary() {
        // τ = 0.345: zero disagreements with 200·hd < 69·common on the whole boundary sweep
        // (every even common, ±1 around the boundary, every pair with fhd = τ exactly), the
        // 78 pairs of the former rounding band and thousands of random cases; through the
        // real path (lift of c and m from 16-bit shares, 15 rounds).
        let t = Threshold::from_ratio(0.345).unwrap();
        let mut rng = ChaCha20Rng::seed_from_u64(22);
        let mut cs = boundary_sweep();
        let exact: Vec<(i64, i64)> = (1..=64).map(|k| (69 * k, 200 * k)).collect();
        cs.extend(&exact);
        cs.extend(former_band());
        cs.extend(cases(&mut rng, 4000, 69, 200));
        cs.extend([(0, 0), (0, 2), (1, 2), (0, 12_800), (12_800, 12_800)]);
        let pairs: Vec<(i64, i64)> = cs.iter().map(|&(h, c)| dots(h, c)).collect();
        let got = mpc_lift_compare(&t, &pairs, 4);
        let mut disagreements = 0;
        for (k, &(hd, common)) in cs.iter().enumerate() {
            let want = rational_0345(hd, common);
            let (c, m) = pairs[k];
            assert_eq!(t.plain_match(c, m), want, "plain hd {hd} common {common}");
            disagreements += usize::from(got[k] != want);
        }
        assert_eq!(disagreements, 0);
        // Both outcomes occur, and fhd = τ exactly is never a match.
        assert!(got.iter().any(|&b| b) && got.iter().any(|&b| !b));
        for &(hd, common) in &exact {
            let k = cs.iter().position(|&p| p == (hd, common)).unwrap();
            assert!(!got[k], "fhd = τ exactly: hd {hd} common {common}");
        }
    }

    #[test]
    fn exact_for_other_four_decimal_thresholds() {
        // τ ∈ {0.3, 0.32, 0.3333, 0.345, 0.4, 0.0001, 0.9999, 1}: zero disagreements with
        // hd·10,000 < P·common on 32-bit shares (7 rounds) and from 16-bit shares (the lift
        // folded into the sum), half the cases at the boundary.
        let mut rng = ChaCha20Rng::seed_from_u64(21);
        for (seed, p) in [3000i64, 3200, 3333, 3450, 4000, 1, 9999, 10_000]
            .into_iter()
            .enumerate()
        {
            let t = Threshold::from_ten_thousandths(p as u32).unwrap();
            let mut cs = cases(&mut rng, 1500, p, Q);
            // Pairs exactly at τ.
            for k in 1..=20i64 {
                let g = Q / gcd(p, Q);
                let common = if g % 2 == 0 { g * k } else { 2 * g * k };
                if common <= 12_800 {
                    cs.push((common * p / Q, common));
                }
            }
            let pairs: Vec<(i64, i64)> = cs.iter().map(|&(h, c)| dots(h, c)).collect();
            let got = mpc_compare(&t, &pairs, seed as u64);
            // And from 16-bit shares, where the lift's corrections depend on A and B.
            let lifted = mpc_lift_compare(&t, &pairs, seed as u64);
            for (k, &(hd, common)) in cs.iter().enumerate() {
                let want = common > 0 && hd * Q < p * common;
                assert_eq!(got[k], want, "τ {p}/10,000: hd {hd} common {common}");
                assert_eq!(
                    lifted[k], want,
                    "lifted, τ {p}/10,000: hd {hd} common {common}"
                );
            }
        }
    }

    fn gcd(a: i64, b: i64) -> i64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }

    #[test]
    fn lift_compare_takes_at_most_14_rounds_for_every_threshold() {
        for p in 0..=10_000u32 {
            let t = Threshold::from_ten_thousandths(p).unwrap();
            let rounds = lift_compare_rounds(&t);
            assert!((13..=14).contains(&rounds), "P = {p}: {rounds} rounds");
        }
        assert_eq!(lift_compare_rounds(&tau_0345()), 14);
    }

    #[test]
    fn exact_threshold_is_not_a_match() {
        // fhd exactly τ (69/200, 138/400, 4,416/12,800) is no match; one below is. 1,331/3,858,
        // the smallest pair of the former rounding band, now matches.
        let t = tau_0345();
        let pairs = vec![
            dots(69, 200),
            dots(68, 200),
            dots(138, 400),
            dots(137, 400),
            dots(0, 0),
            dots(0, 12800),
            dots(4416, 12800),
            dots(4415, 12800),
            dots(1331, 3858),
            dots(1332, 3858),
            dots(12800, 12800),
        ];
        let want = vec![
            false, true, false, true, false, true, false, true, true, false, false,
        ];
        assert_eq!(mpc_compare(&t, &pairs, 5), want);
        assert_eq!(mpc_lift_compare(&t, &pairs, 6), want);
    }

    #[test]
    fn msb_of_random_values() {
        let mut rng = ChaCha20Rng::seed_from_u64(23);
        let vals: Vec<u32> = (0..1000).map(|_| rng.gen()).collect();
        let shares = share_u32(&vals, &mut rng);
        let progs = [0, 1, 2].map(|i| MsbProgram::new(&shares[i], P[i]).unwrap());
        let (out, _) = run(&contexts(6, [1; 16]), b"msb", progs).unwrap();
        let bits = unpack_bits(&reconstruct_bits(&out).unwrap(), vals.len());
        for (v, b) in vals.iter().zip(bits) {
            assert_eq!(b, v >> 31 == 1);
        }
    }

    proptest! {
        #[test]
        fn plain_decision_is_exactly_the_rational_ratio(m in 0i64..=6400, hd_frac in 0.0f64..=1.0, p in 0i64..=10_000) {
            // x < 0 ⇔ hd/common < P/10,000 (module docs), and |x| < 2^31, for every valid pair.
            let common = 2 * m;
            let hd = ((common as f64) * hd_frac).floor() as i64;
            let t = Threshold::from_ten_thousandths(p as u32).unwrap();
            let (c, mm) = dots(hd, common);
            let x = t.plain_x(c, mm);
            prop_assert!(x.abs() <= 4 * Q * mm && x.abs() < 1 << 31);
            prop_assert_eq!(t.plain_match(c, mm), common > 0 && hd * Q < p * common);
        }

        #[test]
        fn mpc_equals_plain_x_sign(m in 0i64..=6400, frac in 0.0f64..=1.0, p in 0i64..=10_000, seed: u64) {
            let common = 2 * m;
            let hd = ((common as f64) * frac).floor() as i64;
            let t = Threshold::from_ten_thousandths(p as u32).unwrap();
            let (c, mm) = dots(hd, common);
            let x = t.plain_x(c, mm);
            prop_assert_eq!(mpc_compare(&t, &[(c, mm)], seed), vec![x < 0]);
            prop_assert_eq!(mpc_lift_compare(&t, &[(c, mm)], seed), vec![x < 0]);
        }
    }

    #[test]
    fn messages_look_uniform_whatever_the_secrets() {
        // Two very different secret inputs (every comparison a match / none a match) in the
        // same session: every round message of every party is masked by a zero share the
        // receiver cannot remove, so its bits are balanced in both runs and the runs differ.
        let t = tau_0345();
        let n = 4096;
        let transcript = |pair: (i64, i64), seed: u64| {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let sc = share(Wrapping(pair.0 as u32), &mut rng);
            let sm = share(Wrapping(pair.1 as u32), &mut rng);
            let progs = [0, 1, 2]
                .map(|i| compare_program(&t, &vec![sc[i]; n], &vec![sm[i]; n], P[i]).unwrap());
            run_with_transcript(&contexts(8, [2; 16]), b"cmp", progs)
                .unwrap()
                .2
        };
        let all_match = transcript(dots(0, 12800), 1);
        let no_match = transcript(dots(12800, 12800), 2);
        assert_eq!(all_match.len(), 7);
        assert_eq!(all_match.len(), no_match.len());
        for (r, (x, y)) in all_match.iter().zip(&no_match).enumerate() {
            for i in 0..3 {
                assert_eq!(x[i].len(), y[i].len());
                assert_ne!(x[i], y[i]);
                for m in [&x[i], &y[i]] {
                    let ones: u32 = m.iter().map(|b| b.count_ones()).sum();
                    let frac = f64::from(ones) / (8 * m.len()) as f64;
                    assert!((0.47..0.53).contains(&frac), "round {r} party {i}: {frac}");
                }
            }
        }
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let t = tau_0345();
        let code = vec![ReplicatedShare::<Z32>::default(); 2];
        let mask = vec![ReplicatedShare::<Z32>::default(); 3];
        assert!(compare_program(&t, &code, &mask, P[0]).is_err());
        let code16 = vec![ReplicatedShare::<Z16>::default(); 2];
        let mask16 = vec![ReplicatedShare::<Z16>::default(); 3];
        assert!(LiftCompareProgram::new(&t, &code16, &mask16, P[0]).is_err());
    }
}
#[cfg(test)]
mod tmp_rounds {
    #[test]
    fn print_rounds() {
        for p in [
            0u32, 1, 2500, 3000, 3200, 3333, 3450, 4000, 5000, 7777, 9999, 10000,
        ] {
            let t = super::Threshold::from_ten_thousandths(p).unwrap();
            eprintln!("p {p}: {}", super::lift_compare_rounds(&t));
        }
    }
}
