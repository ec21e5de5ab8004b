//! Lifting replicated shares from Z_2^16 to Z_2^32 ([BGK+24] §5, MPCLift of the deployed
//! matcher) and bit injection (binary → arithmetic, [MR18]).
//!
//! **Share layout.** Input: replicated Z_2^16 shares of values m (party i holds (m_i, m_{i−1}),
//! [`crate::iris::sharing::replicated`]); output: replicated Z_2^32 shares of the same m read as an unsigned
//! integer in [0, 2^16) (the mask dot product is 0 ≤ m ≤ 6,400).
//!
//! **Lift.** Over the integers m_0 + m_1 + m_2 = m + k·2^16 with the wrap count k ∈ {0, 1, 2}.
//! Zero-extending each component to 32 bits gives shares of m + k·2^16, so the lift is
//! ⟦m⟧_32 = zext(⟦m⟧_16) − 2^16·⟦k⟧_32. The wrap count is computed in binary: the carry-save
//! layer writes the three components as s + 2c (s, c 16-bit words), so
//! k = c_15 + carry_out(s + ((c ≪ 1) mod 2^16)) — two bits, found by
//! [`crate::iris::mpc::binary::CarryProgram`] with width 16 and top 16 (1 + 1 + ⌈log2 15⌉ = 6 rounds),
//! then injected into Z_2^32 (2 rounds).
//!
//! **Bit injection** (no OT): a bit b = b_0 ⊕ b_1 ⊕ b_2 has trivial arithmetic shares of each
//! component ⟦b_j⟧ (component j = b_j, known to P_j and P_{j+1}). Using u ⊕ v = u + v − 2uv:
//! round 1 computes ⟦p⟧ = ⟦b_0⟧·⟦b_1⟧ (replicated Z_2^32 multiplication, one message i → i+1),
//! t = ⟦b_0⟧ + ⟦b_1⟧ − 2⟦p⟧; round 2 computes ⟦q⟧ = ⟦t⟧·⟦b_2⟧ and ⟦b⟧ = ⟦t⟧ + ⟦b_2⟧ − 2⟦q⟧.
//!
//! **Rounds.** [`InjectProgram`]: 2. [`LiftProgram`]: 8 (6 binary + 2 injection), each one
//! message from party i to party i+1.
//!
//! The iris matcher no longer lifts: [`crate::iris::mpc::compare::LiftCompareProgram`] takes the
//! wrap bits u, v of the same carry computation into the comparison's binary sum, which needs
//! neither the injection rounds nor their 32-bit products. The lift stays for sums that must
//! continue in Z_2^32.

use std::num::Wrapping;

use crate::algebra::ring::{Z16, Z32};
use crate::iris::mpc::binary::{
    ArithVec, BitSliced, CarryOutput, CarryProgram, Gates, MpcError, Products, Program,
    ProgramStep, WORD_BITS,
};
use crate::iris::sharing::replicated::ReplicatedShare;
use crate::party::PartyIndex;

/// The bit k of a word vector as 0 or 1.
fn bit_at(words: &[u64], k: usize) -> u32 {
    words
        .get(k / WORD_BITS)
        .map_or(0, |w| ((w >> (k % WORD_BITS)) & 1) as u32)
}

/// This party's trivial arithmetic shares of the component bits b_j of `bits`, j = 0, 1, 2.
fn component_arith(bits: &BitSliced, party: PartyIndex) -> [ArithVec; 3] {
    PartyIndex::ALL.map(|component| {
        (0..bits.len())
            .map(|k| {
                let mut share = ReplicatedShare::<Z32>::default();
                if component == party {
                    share.a = Wrapping(bit_at(bits.a(), k));
                } else if component == party.prev() {
                    share.b = Wrapping(bit_at(bits.b(), k));
                }
                share
            })
            .collect()
    })
}

/// ⟦t⟧ = ⟦u⟧ + ⟦v⟧ − 2⟦uv⟧ element-wise: arithmetic XOR of bits.
fn arith_xor(u: &ArithVec, v: &ArithVec, uv: &ArithVec) -> ArithVec {
    u.iter()
        .zip(v)
        .zip(uv)
        .map(|((&x, &y), &p)| x + y - p.mul_constant(Wrapping(2)))
        .collect()
}

/// Bit injection of several bit-sliced vectors into replicated Z_2^32 shares ([MR18],
/// module docs): 2 rounds of batched multiplications. Output k is the 0/1 vector of input k.
pub struct InjectProgram {
    comps: Vec<[ArithVec; 3]>,
    t: Vec<ArithVec>,
    phase: u8,
}

impl std::fmt::Debug for InjectProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InjectProgram({} vectors, <redacted>)", self.comps.len())
    }
}

impl std::fmt::Debug for LiftProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiftProgram({} values, <redacted>)", self.extended.len())
    }
}

impl InjectProgram {
    /// The injection of `bits` (this party's shares).
    pub fn new(bits: &[BitSliced], party: PartyIndex) -> Self {
        Self {
            comps: bits.iter().map(|b| component_arith(b, party)).collect(),
            t: Vec::new(),
            phase: 0,
        }
    }
}

impl Program for InjectProgram {
    type Output = Vec<ArithVec>;

    fn next(
        &mut self,
        _party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        match (self.phase, products) {
            (0, Products::Start) => {
                self.phase = 1;
                let pairs = self
                    .comps
                    .iter()
                    .map(|[b0, b1, _]| (b0.clone(), b1.clone()))
                    .collect();
                Ok(ProgramStep::Gates(Gates::Mul(pairs)))
            }
            (1, Products::Mul(p)) if p.len() == self.comps.len() => {
                self.phase = 2;
                self.t = self
                    .comps
                    .iter()
                    .zip(&p)
                    .map(|([b0, b1, _], p)| arith_xor(b0, b1, p))
                    .collect();
                let pairs = self
                    .t
                    .iter()
                    .zip(&self.comps)
                    .map(|(t, [_, _, b2])| (t.clone(), b2.clone()))
                    .collect();
                Ok(ProgramStep::Gates(Gates::Mul(pairs)))
            }
            (2, Products::Mul(q)) if q.len() == self.comps.len() => {
                self.phase = 3;
                let out = self
                    .t
                    .iter()
                    .zip(&self.comps)
                    .zip(&q)
                    .map(|((t, [_, _, b2]), q)| arith_xor(t, b2, q))
                    .collect();
                Ok(ProgramStep::Done(out))
            }
            _ => Err(MpcError::OutOfStep("bit injection")),
        }
    }
}

/// The lift Z_2^16 → Z_2^32 of [BGK+24] §5 (module docs): 8 rounds. Output: replicated
/// Z_2^32 shares of the unsigned values.
pub struct LiftProgram {
    extended: Vec<ReplicatedShare<Z32>>,
    carry: CarryProgram,
    inject: Option<InjectProgram>,
}

impl LiftProgram {
    /// The lift of this party's shares `values`.
    pub fn new(values: &[ReplicatedShare<Z16>], party: PartyIndex) -> Result<Self, MpcError> {
        let extended: Vec<ReplicatedShare<Z32>> = values
            .iter()
            .map(|s| ReplicatedShare {
                a: Wrapping(u32::from(s.a.0)),
                b: Wrapping(u32::from(s.b.0)),
            })
            .collect();
        let carry = CarryProgram::new(&extended, 16, 16, party)?;
        Ok(Self {
            extended,
            carry,
            inject: None,
        })
    }
}

impl Program for LiftProgram {
    type Output = Vec<ReplicatedShare<Z32>>;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<Self::Output>, MpcError> {
        if let Some(inject) = self.inject.as_mut() {
            return match inject.next(party, products)? {
                ProgramStep::Gates(g) => Ok(ProgramStep::Gates(g)),
                ProgramStep::Done(k) => {
                    let [k0, k1] = k.as_slice() else {
                        return Err(MpcError::OutOfStep("lift"));
                    };
                    let shift = Wrapping(1u32 << 16);
                    Ok(ProgramStep::Done(
                        self.extended
                            .iter()
                            .zip(k0.iter().zip(k1))
                            .map(|(&e, (&u, &v))| e - (u + v).mul_constant(shift))
                            .collect(),
                    ))
                }
            };
        }
        match self.carry.next(party, products)? {
            ProgramStep::Gates(g) => Ok(ProgramStep::Gates(g)),
            ProgramStep::Done(CarryOutput { c, carry, .. }) => {
                let c15 = c.get(15).ok_or(MpcError::OutOfStep("lift"))?.clone();
                let mut inject = InjectProgram::new(&[c15, carry], party);
                let ProgramStep::Gates(gates) = inject.next(party, Products::Start)? else {
                    return Err(MpcError::OutOfStep("lift"));
                };
                self.inject = Some(inject);
                Ok(ProgramStep::Gates(gates))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::mpc::binary::testing::{contexts, run};
    use crate::iris::mpc::binary::{pack_bits, share_bits};
    use crate::iris::sharing::replicated::{reconstruct, share};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    fn lift_all(vals: &[u16], seed: u64) -> Vec<u32> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut shares: [Vec<ReplicatedShare<Z16>>; 3] = Default::default();
        for &v in vals {
            let s = share(Wrapping(v), &mut rng);
            for i in 0..3 {
                shares[i].push(s[i]);
            }
        }
        let progs = [0, 1, 2].map(|i| LiftProgram::new(&shares[i], P[i]).unwrap());
        let (out, stats) = run(&contexts(seed as u8, [3; 16]), b"lift", progs).unwrap();
        assert_eq!(stats.rounds, 8);
        (0..vals.len())
            .map(|k| reconstruct(&[out[0][k], out[1][k], out[2][k]]).unwrap().0)
            .collect()
    }

    #[test]
    fn lifts_mask_dot_products() {
        let mut rng = ChaCha20Rng::seed_from_u64(31);
        let mut vals: Vec<u16> = (0..3000).map(|_| rng.gen_range(0..=6400)).collect();
        vals.extend([0, 1, 6400, 0x7fff, 0x8000, 0xffff]);
        let got = lift_all(&vals, 1);
        assert_eq!(got, vals.iter().map(|&v| u32::from(v)).collect::<Vec<_>>());
    }

    proptest! {
        #[test]
        fn lift_matches_plaintext(vals in proptest::collection::vec(any::<u16>(), 0..100), seed: u64) {
            let got = lift_all(&vals, seed);
            prop_assert_eq!(got, vals.iter().map(|&v| u32::from(v)).collect::<Vec<_>>());
        }

        #[test]
        fn injection_matches_plaintext(bits in proptest::collection::vec(any::<bool>(), 0..200), seed: u64) {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let words = pack_bits(&bits);
            let s = share_bits(&words, bits.len(), &mut rng).unwrap();
            let progs = [0, 1, 2].map(|i| InjectProgram::new(&[s[i].clone(), s[i].not(P[i])], P[i]));
            let (out, stats) = run(&contexts(7, [8; 16]), b"inject", progs).unwrap();
            prop_assert_eq!(stats.rounds, 2);
            for (k, &b) in bits.iter().enumerate() {
                let v = reconstruct(&[out[0][0][k], out[1][0][k], out[2][0][k]]).unwrap();
                let nv = reconstruct(&[out[0][1][k], out[1][1][k], out[2][1][k]]).unwrap();
                prop_assert_eq!(v.0, u32::from(b));
                prop_assert_eq!(nv.0, u32::from(!b));
            }
        }
    }
}
