//! The threshold comparison of the deployed iris matcher (seed 001 §5, the comparison lemma;
//! seed 002 §5 MSB extraction): from shares of the code dot product c and the mask dot product
//! m, a bit-sliced replicated binary share of "match" = (fhd < τ).
//!
//! **Share layout.** Input per comparison: the code dot product c as a replicated Z_2^16 share
//! and the lifted mask dot product m as a replicated Z_2^32 share (party i holds
//! (x_i, x_{i−1}), [`crate::replicated`]). Output: one [`BitSliced`] vector, bit k = match of
//! comparison k, replicated XOR shares.
//!
//! **Free lift of B·c.** With B = 2^16, each party multiplies its 16-bit components c_j by 2^16
//! inside Z_2^32. If c_0 + c_1 + c_2 = c + k·2^16 over the integers, then
//! Σ 2^16·c_j = 2^16·c + k·2^32 ≡ 2^16·c (mod 2^32): the wrap-around k vanishes, so B·c is exact
//! in Z_2^32 without a lift (this holds for the signed value of c too, since 2^16·c mod 2^32
//! only depends on c mod 2^16).
//!
//! **Threshold derivation.** Over the full 12,800 bits let `common` = popcount(ma ∧ mb) and
//! `hd` = popcount((ca ⊕ cb) ∧ ma ∧ mb). The code encoding gives c = common − 2·hd; the mask is
//! shared as its real half only, so the mask dot product is m = common / 2 (DESIGN §5,
//! [`crate::iris::encoding`]). Then
//!
//! fhd < τ ⇔ hd < τ·common ⇔ (2m − c)/2 < 2τ·m ⇔ c > 2(1 − 2τ)·m ⇔ 2(1 − 2τ)·B·m − B·c < 0.
//!
//! The factor 2 is the correction for the half-size mask dot product. A must be an integer, so
//! the constant is **A = ⌈2(1 − 2τ)·B⌉ = 2^17 − ⌊2^18·τ⌋** and x = A·m − B·c, match ⇔
//! MSB(x) = 1. With this A the protocol computes *exactly* fhd < τ_A for the dyadic ratio
//! τ_A = (2B − A)/(4B) = ⌊2^18·τ⌋ / 2^18 ≤ τ, because B·c > A·m ⇔ c > (A/B)·m ⇔
//! hd/common < (2B − A)/(4B). Hence:
//!
//! * for every τ that is a multiple of 2^−18 the comparison is exactly fhd < τ;
//! * otherwise it never matches a pair with fhd ≥ τ (no false match, in particular fhd = τ
//!   exactly is no match), and misses a match only when τ_A ≤ fhd < τ, a band narrower than
//!   2^−18. For τ = 0.345: A = 40,633, τ_A = 90,439 / 2^18 ≈ 0.3449974, and exactly 78 pairs
//!   (hd, common) with even common ≤ 12,800 fall in the band, the smallest being
//!   hd = 1,331, common = 3,858 (fhd ≈ 0.3449974).
//!
//! Rounding A down instead (A = ⌊2(1 − 2τ)·B⌋ = 40,632, τ_A ≈ 0.3450012) would turn every
//! pair with fhd = τ exactly (hd = 69, common = 200, …) into a false match. An exact comparison
//! against a non-dyadic τ is impossible in Z_2^32 with the free lift: it needs A/B = 2(1 − 2τ)
//! exactly (31/50 for τ = 0.345), and no integer A works for all m ≤ 6,400 with B = 2^16;
//! doubling the precision (2A, 2B) overflows 2^31 for m near 6,400.
//!
//! We use x = A·m − B·c (no "− 1"): MSB(x − 1) = 1 ⇔ B·c ≥ A·m would compute fhd ≤ τ_A, not
//! the strict fhd < τ of the plaintext matcher.
//!
//! **Range.** For valid inputs (0 ≤ m < 8,192, |c| ≤ 2m) and τ ∈ [0, 1] (|A| ≤ 2B),
//! |x| ≤ |A|·m + B·2m ≤ 4B·m < 2^31, so x read as a signed 32-bit integer is exact and its MSB
//! is its sign. For the iris templates m ≤ 6,400.
//!
//! **Rounds.** 7 ([`crate::mpc::binary::CarryProgram`] into bit 31: carry-save layer 1,
//! generate 1, carry tree ⌈log2 30⌉ = 5), each one message from party i to party i+1;
//! [`LiftCompareProgram`] (from 16-bit mask shares: lift 8 + compare 7) 15; opening the result
//! ([`crate::mpc::binary::open_message`]) is one more.

use std::num::Wrapping;

use crate::mpc::binary::{
    BitSliced, CarryOutput, CarryProgram, MpcError, Products, Program, ProgramStep,
};
use crate::party::PartyIndex;
use crate::replicated::ReplicatedShare;
use crate::ring::{Z16, Z32};

/// The scale B = 2^16 of the code dot product (seed 001 §5).
pub const B: i64 = 1 << 16;

/// The default match threshold ratio τ (DESIGN §5).
pub const DEFAULT_TAU: f64 = 0.345;

/// The comparison constants (seed 001 §5 comparison lemma, with the half-mask correction
/// derived in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    a: i64,
}

impl Threshold {
    /// The constants for threshold ratio `tau` ∈ [0, 1]: A = 2^17 − ⌊2^18·τ⌋ (module docs).
    /// Fails for a non-finite or out-of-range τ.
    pub fn from_ratio(tau: f64) -> Result<Self, MpcError> {
        if !tau.is_finite() || !(0.0..=1.0).contains(&tau) {
            return Err(MpcError::InvalidInput("threshold ratio must be in [0, 1]"));
        }
        // 2^18·τ is exact in f64 (multiplication by a power of two), so the floor is exact.
        let scaled = (tau * (4 * B) as f64).floor() as i64;
        Ok(Self { a: 2 * B - scaled })
    }

    /// The constants for the exact dyadic ratio `numerator / 2^18` (0 ≤ numerator ≤ 2^18).
    pub fn from_dyadic(numerator: u32) -> Result<Self, MpcError> {
        let n = i64::from(numerator);
        if n > 4 * B {
            return Err(MpcError::InvalidInput(
                "dyadic threshold numerator must be <= 2^18",
            ));
        }
        Ok(Self { a: 2 * B - n })
    }

    /// The constant A multiplying the mask dot product.
    pub fn a(&self) -> i64 {
        self.a
    }

    /// The exact ratio the protocol compares against: fhd < `num` / 2^18 (module docs).
    pub fn effective_numerator(&self) -> i64 {
        2 * B - self.a
    }

    /// The plaintext value x = A·m − B·c of one comparison (the reference of the MPC).
    pub fn plain_x(&self, code_dot: i64, mask_dot: i64) -> i64 {
        self.a * mask_dot - B * code_dot
    }

    /// The plaintext decision of the protocol: x < 0 (with exact integers).
    pub fn plain_match(&self, code_dot: i64, mask_dot: i64) -> bool {
        self.plain_x(code_dot, mask_dot) < 0
    }
}

impl Default for Threshold {
    /// The constants for [`DEFAULT_TAU`].
    fn default() -> Self {
        Self {
            a: 2 * B - (DEFAULT_TAU * (4 * B) as f64).floor() as i64,
        }
    }
}

/// This party's replicated Z_2^32 share of x = A·m − B·c for each comparison (local; seed 001
/// §5). `code` are the 16-bit code dot product shares, `mask` the lifted 32-bit mask dot
/// product shares. Fails if the lengths differ.
pub fn masked_difference(
    threshold: &Threshold,
    code: &[ReplicatedShare<Z16>],
    mask: &[ReplicatedShare<Z32>],
) -> Result<Vec<ReplicatedShare<Z32>>, MpcError> {
    if code.len() != mask.len() {
        return Err(MpcError::LengthMismatch {
            what: "code and mask dot products",
            left: code.len(),
            right: mask.len(),
        });
    }
    // A as an element of Z_2^32 (two's complement for negative A).
    let a = Wrapping(threshold.a as u32);
    let lift = |v: Z16| Wrapping(u32::from(v.0) << 16);
    Ok(code
        .iter()
        .zip(mask)
        .map(|(c, m)| ReplicatedShare {
            a: a * m.a - lift(c.a),
            b: a * m.b - lift(c.b),
        })
        .collect())
}

/// MSB extraction of replicated Z_2^32 values (seed 001 §5, seed 002 §5): bit 31 of
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

/// The comparison program of seed 001 §5: x = A·m − B·c locally, then [`MsbProgram`]
/// (7 rounds). Output bit k = 1 ⇔ comparison k matches (fhd < τ_A, module docs).
pub fn compare_program(
    threshold: &Threshold,
    code: &[ReplicatedShare<Z16>],
    mask: &[ReplicatedShare<Z32>],
    party: PartyIndex,
) -> Result<MsbProgram, MpcError> {
    MsbProgram::new(&masked_difference(threshold, code, mask)?, party)
}

/// The whole comparison from 16-bit shares (seed 001 §5: MPCLift of the mask dot product,
/// then the comparison): [`crate::mpc::lift::LiftProgram`] (8 rounds) followed by
/// [`MsbProgram`] on x = A·m − B·c (7 rounds), 15 rounds in all. Output as
/// [`compare_program`].
pub struct LiftCompareProgram {
    threshold: Threshold,
    code: Vec<ReplicatedShare<Z16>>,
    lift: crate::mpc::lift::LiftProgram,
    msb: Option<MsbProgram>,
}

impl std::fmt::Debug for LiftCompareProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LiftCompareProgram({} comparisons, <redacted>)",
            self.code.len()
        )
    }
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
        Ok(Self {
            threshold: *threshold,
            code: code.to_vec(),
            lift: crate::mpc::lift::LiftProgram::new(mask, party)?,
            msb: None,
        })
    }
}

impl Program for LiftCompareProgram {
    type Output = BitSliced;

    fn next(
        &mut self,
        party: PartyIndex,
        products: Products,
    ) -> Result<ProgramStep<BitSliced>, MpcError> {
        if let Some(msb) = self.msb.as_mut() {
            return msb.next(party, products);
        }
        match self.lift.next(party, products)? {
            ProgramStep::Gates(g) => Ok(ProgramStep::Gates(g)),
            ProgramStep::Done(mask32) => {
                let mut msb = compare_program(&self.threshold, &self.code, &mask32, party)?;
                let step = msb.next(party, Products::Start)?;
                self.msb = Some(msb);
                Ok(step)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mpc::binary::testing::{contexts, run, run_with_transcript, share_u32};
    use crate::mpc::binary::{open_message, open_receive, reconstruct_bits, unpack_bits};
    use crate::replicated::share;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    const P: [PartyIndex; 3] = PartyIndex::ALL;

    /// (hd, common) → (code dot, mask dot) with the iris encoding (common even).
    fn dots(hd: i64, common: i64) -> (i64, i64) {
        (common - 2 * hd, common / 2)
    }

    /// Runs the MPC comparison on (code dot, mask dot) pairs and opens the result.
    fn mpc_compare(threshold: &Threshold, pairs: &[(i64, i64)], seed: u64) -> Vec<bool> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut code: [Vec<ReplicatedShare<Z16>>; 3] = Default::default();
        let mut mask: [Vec<ReplicatedShare<Z32>>; 3] = Default::default();
        for &(c, m) in pairs {
            let sc = share(Wrapping(c as u16), &mut rng);
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
        // Open to everyone through the message-driven opening.
        let msgs = [0, 1, 2].map(|i| open_message(P[i], &out[i], &P).unwrap());
        let mut opened = Vec::new();
        for i in 0..3 {
            let from = P[i].prev();
            opened.push(open_receive(P[i], &out[i], from, &msgs[from.as_usize()].payload).unwrap());
        }
        assert!(opened.iter().all(|o| *o == opened[0]));
        assert_eq!(reconstruct_bits(&out).unwrap(), opened[0]);
        unpack_bits(&opened[0], pairs.len())
    }

    /// Random valid (hd, common) pairs: half uniform, half within ±2 of the threshold.
    fn cases(rng: &mut ChaCha20Rng, n: usize, tau_num: i64, tau_den: i64) -> Vec<(i64, i64)> {
        (0..n)
            .map(|k| {
                let m = rng.gen_range(0..=6400i64);
                let common = 2 * m;
                let hd = if k % 2 == 0 {
                    rng.gen_range(0..=common)
                } else {
                    let edge = common * tau_num / tau_den;
                    (edge + rng.gen_range(-2..=2i64)).clamp(0, common)
                };
                (hd, common)
            })
            .collect()
    }

    #[test]
    fn constants() {
        let t = Threshold::default();
        assert_eq!(
            t.a(),
            (2.0 * (1.0 - 2.0 * 0.345) * 65536.0f64).ceil() as i64
        );
        assert_eq!(t.a(), 40633);
        assert_eq!(t.effective_numerator(), 90439);
        assert_eq!(Threshold::from_ratio(0.345), Ok(t));
        assert!(Threshold::from_ratio(1.5).is_err());
        assert!(Threshold::from_ratio(f64::NAN).is_err());
        assert!(Threshold::from_dyadic(1 << 19).is_err());
    }

    #[test]
    fn exact_for_dyadic_thresholds() {
        // τ = 11/32 = 0.34375 and τ = 90,439/2^18: the MPC decision equals the exact rational
        // check hd/common < τ on thousands of cases, half of them at the boundary.
        let mut rng = ChaCha20Rng::seed_from_u64(21);
        for (num, seed) in [(11i64 << 13, 1u64), (90439, 2), (1 << 17, 3)] {
            let t = Threshold::from_dyadic(num as u32).unwrap();
            let cs = cases(&mut rng, 3000, num, 1 << 18);
            let pairs: Vec<(i64, i64)> = cs.iter().map(|&(h, c)| dots(h, c)).collect();
            let got = mpc_compare(&t, &pairs, seed);
            for (k, &(hd, common)) in cs.iter().enumerate() {
                let want = common > 0 && hd * (1 << 18) < num * common;
                assert_eq!(got[k], want, "hd {hd} common {common}");
                let (c, m) = pairs[k];
                assert_eq!(t.plain_match(c, m), want);
            }
        }
    }

    #[test]
    fn default_threshold_agrees_with_rational_check_outside_the_rounding_band() {
        // τ = 0.345 = 69/200: the MPC computes fhd < τ_A = 90,439/2^18 exactly, and agrees with
        // hd/common < 69/200 except for fhd in [τ_A, 0.345).
        let t = Threshold::default();
        let mut rng = ChaCha20Rng::seed_from_u64(22);
        let mut cs = cases(&mut rng, 4000, 69, 200);
        // Exact-threshold and just-below/above cases at large masks.
        for m in [100i64, 200, 1929, 4096, 6300, 6329, 6400] {
            let common = 2 * m;
            let edge = common * 69 / 200;
            for hd in edge - 1..=edge + 1 {
                cs.push((hd, common));
            }
        }
        let pairs: Vec<(i64, i64)> = cs.iter().map(|&(h, c)| dots(h, c)).collect();
        let got = mpc_compare(&t, &pairs, 4);
        let mut band = 0;
        for (k, &(hd, common)) in cs.iter().enumerate() {
            let effective = common > 0 && hd * (1 << 18) < 90439 * common;
            assert_eq!(got[k], effective, "hd {hd} common {common}");
            let rational = common > 0 && 200 * hd < 69 * common;
            if got[k] != rational {
                // Only inside the documented band τ_A ≤ fhd < τ: a missed match, never a
                // false one.
                assert!(rational && hd * (1 << 18) >= 90439 * common);
                band += 1;
            }
        }
        assert!(band <= cs.len() / 100, "{band} cases in the rounding band");
    }

    #[test]
    fn exact_threshold_is_not_a_match() {
        // fhd exactly τ: 69/200 (common = 200, hd = 69) is no match; 1,331/3,858 is the
        // smallest pair of the rounding band (a documented missed match).
        let t = Threshold::default();
        let pairs = vec![
            dots(69, 200),
            dots(68, 200),
            dots(0, 0),
            dots(0, 12800),
            dots(4416, 12800),
            dots(4415, 12800),
            dots(1331, 3858),
            dots(1330, 3858),
            dots(12800, 12800),
        ];
        assert_eq!(
            mpc_compare(&t, &pairs, 5),
            vec![false, true, false, true, false, true, false, true, false]
        );
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
        fn plain_decision_is_exactly_the_dyadic_ratio(m in 0i64..8192, hd_frac in 0.0f64..=1.0, tau in 0.0f64..=1.0) {
            // x < 0 ⇔ hd/common < ⌊2^18·τ⌋/2^18 ≤ τ (module docs), for every valid pair.
            let common = 2 * m;
            let hd = ((common as f64) * hd_frac).floor() as i64;
            let t = Threshold::from_ratio(tau).unwrap();
            let num = t.effective_numerator();
            prop_assert!(num as f64 <= tau * (1u64 << 18) as f64);
            let (c, mm) = dots(hd, common);
            prop_assert_eq!(t.plain_match(c, mm), common > 0 && hd * (1 << 18) < num * common);
        }

        #[test]
        fn mpc_equals_plain_x_sign(m in 0i64..8192, frac in 0.0f64..=1.0, tau in 0.0f64..=1.0, seed: u64) {
            let common = 2 * m;
            let hd = ((common as f64) * frac).floor() as i64;
            let t = Threshold::from_ratio(tau).unwrap();
            let (c, mm) = dots(hd, common);
            let x = t.plain_x(c, mm);
            prop_assert!(x > i64::from(i32::MIN) && x < i64::from(i32::MAX));
            prop_assert_eq!(mpc_compare(&t, &[(c, mm)], seed), vec![x < 0]);
        }
    }

    #[test]
    fn messages_look_uniform_whatever_the_secrets() {
        // Two very different secret inputs (every comparison a match / none a match) in the
        // same session: every round message of every party is masked by a zero share the
        // receiver cannot remove, so its bits are balanced in both runs and the runs differ.
        let t = Threshold::default();
        let n = 4096;
        let transcript = |pair: (i64, i64), seed: u64| {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let sc = share(Wrapping(pair.0 as u16), &mut rng);
            let sm = share(Wrapping(pair.1 as u32), &mut rng);
            let progs = [0, 1, 2]
                .map(|i| compare_program(&t, &vec![sc[i]; n], &vec![sm[i]; n], P[i]).unwrap());
            run_with_transcript(&contexts(8, [2; 16]), b"cmp", progs)
                .unwrap()
                .2
        };
        let all_match = transcript(dots(0, 12800), 1);
        let no_match = transcript(dots(12800, 12800), 2);
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
    fn lift_then_compare_from_16_bit_shares() {
        let t = Threshold::default();
        let mut rng = ChaCha20Rng::seed_from_u64(24);
        let cs = cases(&mut rng, 2000, 69, 200);
        let mut code: [Vec<ReplicatedShare<Z16>>; 3] = Default::default();
        let mut mask: [Vec<ReplicatedShare<Z16>>; 3] = Default::default();
        for &(hd, common) in &cs {
            let (c, m) = dots(hd, common);
            let sc = share(Wrapping(c as u16), &mut rng);
            let sm = share(Wrapping(m as u16), &mut rng);
            for i in 0..3 {
                code[i].push(sc[i]);
                mask[i].push(sm[i]);
            }
        }
        let progs =
            [0, 1, 2].map(|i| LiftCompareProgram::new(&t, &code[i], &mask[i], P[i]).unwrap());
        let (out, stats) = run(&contexts(10, [4; 16]), b"lift+cmp", progs).unwrap();
        assert_eq!(stats.rounds, 15);
        let got = unpack_bits(&reconstruct_bits(&out).unwrap(), cs.len());
        for (k, &(hd, common)) in cs.iter().enumerate() {
            let (c, m) = dots(hd, common);
            assert_eq!(got[k], t.plain_match(c, m), "hd {hd} common {common}");
        }
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let t = Threshold::default();
        let code = vec![ReplicatedShare::<Z16>::default(); 2];
        let mask = vec![ReplicatedShare::<Z32>::default(); 3];
        assert!(compare_program(&t, &code, &mask, P[0]).is_err());
    }
}
