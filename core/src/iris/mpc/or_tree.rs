//! OR-reduction of bit-sliced shared bits ([TACEO24] §2.3 OR tree; uniqueness output of [BGK+24]
//! §5: one shared bit "matched anybody" revealing nothing else).
//!
//! **Share layout.** Input: one or more groups, each a [`BitSliced`] replicated binary share
//! (party i holds (x_i, x_{i−1})). Output: one [`BitSliced`] vector with one bit per group,
//! bit g = OR of the bits of group g.
//!
//! **Protocol.** a ∨ b = ¬(¬a ∧ ¬b): every bit is negated locally, then each level ANDs the
//! lower half of every group with its upper half (an odd last bit passes through), all groups
//! batched in one round, and the single remaining bit is negated back.
//!
//! **Rounds.** ⌈log2 L⌉ for the longest group of L bits (0 if every group has at most one bit),
//! each one message from party i to party i+1.

use crate::iris::mpc::binary::{BitSliced, Gates, MpcError, Products, Program, ProgramStep};
use crate::party::PartyIndex;

/// OR-reduction of groups of shared bits (module docs): ⌈log2 L⌉ rounds of batched ANDs.
#[derive(Debug)]
pub struct OrTreeProgram {
    /// The negated, partially AND-reduced groups.
    groups: Vec<BitSliced>,
    /// Per group, the odd bit set aside during the current level.
    rest: Vec<Option<BitSliced>>,
    /// Per group, whether it takes part in the current level (length ≥ 2).
    active: Vec<bool>,
}

impl OrTreeProgram {
    /// The OR of each group of this party's shared bits. An empty group reduces to 0.
    pub fn new(groups: Vec<BitSliced>, party: PartyIndex) -> Self {
        Self {
            groups: groups.iter().map(|g| g.not(party)).collect(),
            rest: Vec::new(),
            active: Vec::new(),
        }
    }

    /// The OR of all bits of one vector.
    pub fn single(bits: &BitSliced, party: PartyIndex) -> Self {
        Self::new(vec![bits.clone()], party)
    }

    /// The next level's gates, or `None` once every group has at most one bit.
    fn level(&mut self) -> Result<Option<Gates>, MpcError> {
        self.active = self.groups.iter().map(|g| g.len() >= 2).collect();
        if !self.active.iter().any(|&a| a) {
            return Ok(None);
        }
        let mut pairs = Vec::new();
        self.rest = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            let len = g.len();
            if len < 2 {
                self.rest.push(None);
                continue;
            }
            let h = len / 2;
            pairs.push((g.slice(0, h)?, g.slice(h, h)?));
            self.rest.push(if len % 2 == 1 {
                Some(g.slice(2 * h, 1)?)
            } else {
                None
            });
        }
        Ok(Some(Gates::And(pairs)))
    }

    /// The final output: bit g = ¬(AND of the negated bits of group g).
    fn output(&self, party: PartyIndex) -> Result<BitSliced, MpcError> {
        let mut out = BitSliced::zeros(0);
        for g in &self.groups {
            // An empty group's negated AND is the empty AND = 1, so its OR is 0.
            let bit = if g.is_empty() {
                BitSliced::zeros(1)
            } else {
                g.slice(0, 1)?.not(party)
            };
            out = out.concat(&bit);
        }
        Ok(out)
    }
}

impl Program for OrTreeProgram {
    type Output = BitSliced;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<BitSliced>, MpcError> {
        match products {
            Products::Start => {}
            Products::And(out) => {
                let mut it = out.into_iter();
                for (k, g) in self.groups.iter_mut().enumerate() {
                    if !self.active.get(k).copied().unwrap_or(false) {
                        continue;
                    }
                    let reduced = it.next().ok_or(MpcError::OutOfStep("or-tree"))?;
                    *g = match self.rest.get(k) {
                        Some(Some(r)) => reduced.concat(r),
                        _ => reduced,
                    };
                }
            }
            Products::Mul(_) => return Err(MpcError::OutOfStep("or-tree")),
        }
        match self.level()? {
            Some(gates) => Ok(ProgramStep::Gates(gates)),
            None => Ok(ProgramStep::Done(self.output(party)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iris::mpc::binary::testing::{contexts, run};
    use crate::iris::mpc::binary::{pack_bits, reconstruct_bits, share_bits, unpack_bits};
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    /// Runs the OR-tree on plaintext groups; returns the opened bits and the round count.
    fn or_groups(groups: &[Vec<bool>], seed: u64) -> (Vec<bool>, u32) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut shares: [Vec<BitSliced>; 3] = Default::default();
        for g in groups {
            let s = share_bits(&pack_bits(g), g.len(), &mut rng).unwrap();
            for i in 0..3 {
                shares[i].push(s[i].clone());
            }
        }
        let [s0, s1, s2] = shares;
        let progs = [
            OrTreeProgram::new(s0, P[0]),
            OrTreeProgram::new(s1, P[1]),
            OrTreeProgram::new(s2, P[2]),
        ];
        let (out, stats) = run(&contexts(seed as u8, [6; 16]), b"or", progs).unwrap();
        let bits = reconstruct_bits(&out).unwrap();
        (unpack_bits(&bits, groups.len()), stats.rounds)
    }

    fn log2_ceil(n: usize) -> u32 {
        if n <= 1 {
            0
        } else {
            n.next_power_of_two().trailing_zeros()
        }
    }

    #[test]
    fn all_zero_single_one_and_edges() {
        for len in [0usize, 1, 2, 3, 63, 64, 65, 1000] {
            let zeros = vec![false; len];
            assert_eq!(
                or_groups(std::slice::from_ref(&zeros), 1),
                (vec![false], log2_ceil(len))
            );
            for pos in [0, len / 2, len.saturating_sub(1)] {
                if len == 0 {
                    continue;
                }
                let mut one = zeros.clone();
                one[pos] = true;
                assert_eq!(or_groups(&[one], 2).0, vec![true], "len {len} pos {pos}");
            }
        }
        let ones = vec![true; 77];
        assert_eq!(or_groups(&[ones], 3).0, vec![true]);
    }

    proptest! {
        #[test]
        fn or_matches_plaintext(
            groups in proptest::collection::vec(
                proptest::collection::vec(proptest::bool::weighted(0.02), 0..300), 0..6),
            seed: u64,
        ) {
            let (got, rounds) = or_groups(&groups, seed);
            let want: Vec<bool> = groups.iter().map(|g| g.iter().any(|&b| b)).collect();
            prop_assert_eq!(got, want);
            let longest = groups.iter().map(Vec::len).max().unwrap_or(0);
            prop_assert_eq!(rounds, log2_ceil(longest));
        }
    }
}
