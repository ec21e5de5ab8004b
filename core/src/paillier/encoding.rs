//! # The packing of [ABMR20] §4 (Fig. 2), signed and compact, and the homomorphic inner product
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363.
//!
//! Several template elements share one Paillier plaintext, each in a k-bit *slot*. A level-1
//! encoding (Encode1) of v_0 … v_(n−1) is u* = Σ_i v_i·2^(k·p_i); the product of two level-1
//! encodings (Mult) is a level-2 encoding whose slot 2p_i holds v_i·v'_i; Add1/Add2 are integer
//! additions; Mask re-randomises every slot that is not one of the 2p_i, so that decrypting
//! reveals the wanted products and nothing else (Fig. 2 "Security"). The terminal computes
//! ⟦Σ_c u_c*·w_c*⟧ from the device's ⟦u_c*⟧ with the additive homomorphism.
//!
//! ## Deviations from [ABMR20] §4, and why
//!
//! 1. **Slot positions from a 3-AP-free set.** Fig. 2 places value i at p_i = 2^(i−1) − 1,
//!    so n values need 2^n level-2 slots. Any set without a 3-term arithmetic progression keeps
//!    slot 2p_i free of cross products (2p_i = p_j + p_l forces j = l = i); we use a largest
//!    such subset of [0, P) for the smallest P (see `params.rs`). For n = 8 the level-2
//!    encoding spans 27 slots instead of 255.
//! 2. **Signed slots, balanced digits.** The paper's slots are unsigned, yet its zero-sum ρ
//!    (Fig. 3 step 3, "k-bit ρ_i summing to 0") cannot exist among non-negative integers, and
//!    embeddings are signed. Here a slot holds a signed v with |v| < 2^(k−1); a plaintext is the
//!    signed integer Σ_s v_s·2^(k·s) (reduced mod N for encryption, |·| < N/2 by the layout),
//!    and decoding peels balanced base-2^k digits off the signed decryption. No carry crosses a
//!    slot as long as every slot obeys its bound; the ρ_i are signed and sum to exactly 0.
//! 3. **Slot width from the norm bound, not from the element width and t.** The paper sizes
//!    the padding d = m + log n + log t + 2 (§5 "Parameter Selection"), i.e. for the worst
//!    case of t·n products of m-bit numbers in one slot. With the norm bound ζ² (the enrolment
//!    proves ‖u‖² ≤ ζ², [ABMR20] §8.3; T checks its own ‖w‖² ≤ ζ²) the Cauchy–Schwarz
//!    inequality bounds every slot of z = Σ_c u_c*·w_c* (c over the t ciphertexts, i, j over the
//!    n positions, u_(c,i) the element in ciphertext c, position i), independently of t:
//!    * diagonal slot 2p_i: |Σ_c u_(c,i)·w_(c,i)| ≤ ‖(u_(c,i))_c‖·‖(w_(c,i))_c‖ ≤ ‖u‖·‖w‖ ≤ ζ²;
//!    * cross slot s: the pairs (i, j) with p_i + p_j = s, i ≠ j, use every i at most once as
//!      the first and every j at most once as the second index, so
//!      |Σ_c Σ_(i,j) u_(c,i)·w_(c,j)| ≤ (Σ_(c,i) u_(c,i)²)^½·(Σ_(c,j) w_(c,j)²)^½ ≤ ζ².
//!
//!    So every slot of a·z is below 2^γ, γ = bits(A·ζ²) (A the largest multiplier a: 1 for
//!    Π1). It also holds for a malicious device in Π2/Π3, whose elements are bounded only by the
//!    proven norm (|u_i| ≤ ζ), not by m bits. Masks and the zero-sum shares are uniform in
//!    [−2^W, 2^W) with W = γ + λ + ⌈log2 S⌉ (S level-2 slots): a value x, |x| < 2^γ, plus such a
//!    mask is within |x|/2^(W+1) < 2^−(λ+1)/S of the mask alone in statistical distance, so
//!    all S − 1 masked values (S − n cross slots, n − 1 free shares) together are within
//!    2^−(λ+1) of what a simulator given only the diagonal sum produces; b (Π2/Π3) is uniform
//!    in [0, 2^(γ+λ+1)) and hides a·IP within 2^−(λ+1). The fullest slot is the last diagonal
//!    slot: a·D + b − Σ_(i<n−1) ρ_i, below 2^γ + 2^B + (n − 1)·2^W; k is the smallest width
//!    whose signed range [−2^(k−1), 2^(k−1)) holds it, and n the largest count whose
//!    2·max(p) + 1 level-2 slots of k bits fit in |N| − 2 bits. [`crate::paillier::params::Layout::derive`]
//!    computes it.
//! 4. **Masks per slot, λ(+log S) bits wider than the largest content** instead of Fig. 2's
//!    k-bit masks whose overflow is only "negligible": here overflow is impossible (the bound
//!    above includes the masks), and the simulation is statistical with the distance stated.
//! 5. **The homomorphic inner product by multi-exponentiation with small exponents.** The
//!    paper computes ⟦u_c*⟧^(w_c*) with full-size exponents w_c* (about |N|/2 bits each). Here
//!    z = Σ_j 2^(k·p_j)·Σ_c w_(c,j)·u_c*: for each slot position j the terminal needs
//!    C_j = Π_c ⟦u_c*⟧^(w_(c,j)) with signed m-bit exponents, and ⟦z⟧ = Horner over j of the C_j
//!    with the factor 2^(k·(p_(j+1) − p_j)) applied as repeated squaring. The C_j are computed
//!    interleaved (Straus) on the Horner accumulator itself, with width-w NAF digits over
//!    precomputed odd powers of every base and of its inverse (the inverses once per base,
//!    for the negative digits), so the squarings are shared: about k·max(p) + m squarings,
//!    n·t·(m + 1)/(w + 1) multiplications and t·(2^(w−1) + one inversion) for the tables,
//!    instead of about 1.2·t·k·max(p) multiplications. The terminal's multiplier
//!    a (Π2, Π3) is applied once to the Horner result (64 squarings) rather than folded into
//!    the exponents (which would make every exponent m + 64 bits): the `timings` test of
//!    `pi2.rs` measures both.
//!
//! **Side channel (limitation).** The multi-exponentiation is variable-time in the digits of
//! the terminal's measurement (its number of nonzero NAF digits), like the paper's; GMP's
//! arithmetic is not constant-time either. The multiplier a is applied with
//! `mpz_powm_sec`.
//!
//! ## Layouts
//!
//! Values per ciphertext n / slot width k / ciphertexts per template t, for the largest norm
//! bound ζ² = ℓ·2^(2(m−1)) (any m-bit template) and λ = 40, printed by the test
//! `layouts_table` (the paper's measured layouts, Fig. 7: Π1 8/8/7 values per 2048-bit
//! ciphertext at m = 8/16/24, ℓ = 256, and Π2 6/5/4, reading its message sizes as
//! 512-byte ciphertexts):
//!
//! | ℓ | m | N bits | Π1 n / k / t | Π2 n / k / t | Π3 n / k / t |
//! |---|---|---|---|---|---|
//! | 128 | 8 | 2048 | 8 / 71 / 16 | 4 / 132 / 32 | 5 / 110 / 26 |
//! | 256 | 8 | 2048 | 8 / 72 / 32 | 4 / 133 / 64 | 5 / 111 / 52 |
//! | 512 | 8 | 2048 | 8 / 73 / 64 | 4 / 134 / 128 | 5 / 112 / 103 |
//! | 1024 | 8 | 2048 | 8 / 74 / 128 | 4 / 135 / 256 | 5 / 113 / 205 |
//! | 128 | 16 | 2048 | 6 / 87 / 22 | 4 / 148 / 32 | 4 / 124 / 32 |
//! | 256 | 16 | 2048 | 6 / 88 / 43 | 4 / 149 / 64 | 4 / 125 / 64 |
//! | 512 | 16 | 2048 | 6 / 89 / 86 | 4 / 150 / 128 | 4 / 126 / 128 |
//! | 1024 | 16 | 2048 | 6 / 90 / 171 | 4 / 151 / 256 | 4 / 127 / 256 |
//! | 128 | 24 | 2048 | 5 / 103 / 26 | 4 / 164 / 32 | 4 / 140 / 32 |
//! | 256 | 24 | 2048 | 5 / 104 / 52 | 4 / 165 / 64 | 4 / 141 / 64 |
//! | 512 | 24 | 2048 | 5 / 105 / 103 | 4 / 166 / 128 | 4 / 142 / 128 |
//! | 1024 | 24 | 2048 | 5 / 106 / 205 | 4 / 167 / 256 | 4 / 143 / 256 |
//! | 128 | 8 | 3072 | 9 / 73 / 15 | 6 / 134 / 22 | 8 / 110 / 16 |
//! | 256 | 8 | 3072 | 9 / 74 / 29 | 6 / 135 / 43 | 8 / 111 / 32 |
//! | 512 | 8 | 3072 | 9 / 75 / 57 | 6 / 136 / 86 | 8 / 112 / 64 |
//! | 1024 | 8 | 3072 | 9 / 76 / 114 | 6 / 137 / 171 | 8 / 113 / 128 |
//! | 128 | 16 | 3072 | 8 / 87 / 16 | 5 / 150 / 26 | 6 / 126 / 22 |
//! | 256 | 16 | 3072 | 8 / 88 / 32 | 5 / 151 / 52 | 6 / 127 / 43 |
//! | 512 | 16 | 3072 | 8 / 89 / 64 | 5 / 152 / 103 | 6 / 128 / 86 |
//! | 1024 | 16 | 3072 | 8 / 90 / 128 | 5 / 153 / 205 | 6 / 129 / 171 |
//! | 128 | 24 | 3072 | 8 / 103 / 16 | 5 / 166 / 26 | 6 / 142 / 22 |
//! | 256 | 24 | 3072 | 8 / 104 / 32 | 5 / 167 / 52 | 6 / 143 / 43 |
//! | 512 | 24 | 3072 | 8 / 105 / 64 | 5 / 168 / 103 | 6 / 144 / 86 |
//! | 1024 | 24 | 3072 | 8 / 106 / 128 | 5 / 169 / 205 | 6 / 145 / 171 |
//!
//! With a unit-scale norm bound ζ² = 2^(2(m−1)) (a unit-length embedding scaled to m bits) the
//! slots shrink by log2 ℓ bits; the test prints that table too.
//!
//! The layout [ABMR20] describes does not reach its own measured figures: its constraint
//! 2^n·(2m + log n + log⌈ℓ/n⌉ + λ + 2) ≤ |N| (§5 "Parameter Selection") allows n = 4 at
//! ℓ = 256, m = 16, |N| = 2048 and n = 5 at 3072, where we pack 6 and 8 (its measured 8 per
//! 2048-bit ciphertext must come from a packing it does not describe, cf. §4.2 "more compact
//! packings are possible"). Π2's slots are wider than Π1's by the κ = 64 bits of the prime a
//! and the λ + 1 bits of b's slack (Π3's by λ bits for a), hence its smaller n.

use super::cipher::{Ciphertext, PaillierError, PublicKey, SecretKey};
use super::params::Layout;
use crate::algebra::montgomery::{GmpModulus, ModularProducts, Montgomery52};
use rand_core::{CryptoRng, RngCore};
use rug::{Complete, Integer};

/// What can go wrong when encoding, computing on or decoding packed values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodingError {
    /// A vector of the wrong length.
    #[error("{argument}: {found} values, expected {expected}")]
    Length {
        /// The argument.
        argument: &'static str,
        /// Its length.
        found: usize,
        /// The expected length.
        expected: usize,
    },
    /// A template element outside the m-bit two's complement range.
    #[error("{argument}[{index}] = {value} is outside [−2^{bits_minus_one}, 2^{bits_minus_one})")]
    Value {
        /// The argument.
        argument: &'static str,
        /// The element's index.
        index: usize,
        /// Its value.
        value: i64,
        /// m − 1.
        bits_minus_one: u32,
    },
    /// A template whose squared norm exceeds ζ².
    #[error("{argument}: squared norm {norm} exceeds the bound ζ² = {bound}")]
    Norm {
        /// The argument.
        argument: &'static str,
        /// ‖v‖².
        norm: Integer,
        /// ζ².
        bound: Integer,
    },
    /// A value that does not fit its slot, or another argument out of its range.
    #[error("{argument}: {reason}")]
    Range {
        /// The argument.
        argument: &'static str,
        /// Why.
        reason: String,
    },
    /// A plaintext that is not a valid encoding of the expected level.
    #[error("level-{level} decoding: {reason}")]
    Decode {
        /// 1 or 2.
        level: u8,
        /// Why.
        reason: String,
    },
    /// An underlying Paillier error (a ciphertext or nonce not of this key).
    #[error(transparent)]
    Paillier(#[from] PaillierError),
}

fn range(argument: &'static str, reason: impl Into<String>) -> EncodingError {
    EncodingError::Range {
        argument,
        reason: reason.into(),
    }
}

/// Checks a template (`u` of the device or `w` of the terminal, [ABMR20] §3 Fig. 1: ℓ
/// elements of m bits, norm ζ): length ℓ, every element in [−2^(m−1), 2^(m−1)), ‖v‖² ≤ ζ².
pub fn check_template(
    layout: &Layout,
    argument: &'static str,
    v: &[i32],
) -> Result<(), EncodingError> {
    if v.len() != layout.dim() {
        return Err(EncodingError::Length {
            argument,
            found: v.len(),
            expected: layout.dim(),
        });
    }
    let half = 1i64 << (layout.value_bits() - 1);
    let mut norm = Integer::new();
    for (index, &x) in v.iter().enumerate() {
        let x = i64::from(x);
        if x < -half || x >= half {
            return Err(EncodingError::Value {
                argument,
                index,
                value: x,
                bits_minus_one: layout.value_bits() - 1,
            });
        }
        // |x| ≤ 2^23: x² fits an i64 exactly.
        norm += x * x;
    }
    if &norm > layout.ip_bound() {
        return Err(EncodingError::Norm {
            argument,
            norm,
            bound: layout.ip_bound().clone(),
        });
    }
    Ok(())
}

/// The exclusive bound 2^(k−1) on the absolute value of a slot.
fn slot_limit(layout: &Layout) -> Integer {
    Integer::from(1) << (layout.slot_bits() - 1)
}

/// Σ_i values[i]·2^(k·slots[i]), each value checked against the signed slot range.
fn place(
    layout: &Layout,
    argument: &'static str,
    values: &[Integer],
    slots: impl Iterator<Item = u32>,
) -> Result<Integer, EncodingError> {
    let limit = slot_limit(layout);
    let k = layout.slot_bits();
    let mut out = Integer::new();
    for (index, (v, s)) in values.iter().zip(slots).enumerate() {
        if v.clone().abs() >= limit {
            return Err(range(
                argument,
                format!("value {index} does not fit a signed {k}-bit slot"),
            ));
        }
        out += v.clone() << (k * s);
    }
    Ok(out)
}

/// Encode1 ([ABMR20] Fig. 2, signed, at the layout's positions): up to n values into one
/// level-1 plaintext Σ_i v_i·2^(k·p_i) (missing values are 0).
pub fn encode1(layout: &Layout, values: &[Integer]) -> Result<Integer, EncodingError> {
    if values.len() > layout.values_per_ciphertext() {
        return Err(EncodingError::Length {
            argument: "values",
            found: values.len(),
            expected: layout.values_per_ciphertext(),
        });
    }
    place(layout, "values", values, layout.positions().iter().copied())
}

/// Encode2 ([ABMR20] Fig. 2): up to n values into the diagonal slots 2p_i of a level-2
/// plaintext.
pub fn encode2(layout: &Layout, values: &[Integer]) -> Result<Integer, EncodingError> {
    if values.len() > layout.values_per_ciphertext() {
        return Err(EncodingError::Length {
            argument: "values",
            found: values.len(),
            expected: layout.values_per_ciphertext(),
        });
    }
    place(layout, "values", values, layout.diagonal_slots())
}

/// Mult ([ABMR20] Fig. 2): the product of two level-1 plaintexts, a level-2 plaintext.
pub fn mult(a: &Integer, b: &Integer) -> Integer {
    (a * b).complete()
}

/// The balanced base-2^k digits of `x`: `count` signed slots v_s, |v_s| ≤ 2^(k−1), with
/// x = Σ_s v_s·2^(k·s); an error if x needs more digits.
pub fn decode_slots(
    layout: &Layout,
    level: u8,
    x: &Integer,
    count: u32,
) -> Result<Vec<Integer>, EncodingError> {
    let k = layout.slot_bits();
    let mut rest = x.clone();
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        // The low k bits (of the two's complement form, so also for negative rest), recentred.
        let mut digit = rest.keep_bits_ref(k).complete();
        if digit.get_bit(k - 1) {
            digit -= Integer::from(1) << k;
        }
        rest -= &digit;
        rest >>= k;
        out.push(digit);
    }
    if rest != 0 {
        return Err(EncodingError::Decode {
            level,
            reason: format!("the plaintext does not fit {count} slots of {k} bits"),
        });
    }
    Ok(out)
}

/// Decode1 ([ABMR20] Fig. 2): the n values at the level-1 positions of a level-1 plaintext
/// (signed, as produced by Encode1 and Add1).
pub fn decode1(layout: &Layout, x: &Integer) -> Result<Vec<Integer>, EncodingError> {
    let slots = decode_slots(layout, 1, x, layout.level1_slots())?;
    let mut out = Vec::with_capacity(layout.values_per_ciphertext());
    for (s, v) in slots.into_iter().enumerate() {
        if layout.positions().binary_search(&(s as u32)).is_ok() {
            out.push(v);
        } else if v != 0 {
            return Err(EncodingError::Decode {
                level: 1,
                reason: format!("unused slot {s} is not zero"),
            });
        }
    }
    Ok(out)
}

/// Decode2 ([ABMR20] Fig. 2): the n values in the diagonal slots 2p_i of a level-2
/// plaintext (the other slots may hold anything: cross products or masks).
pub fn decode2(layout: &Layout, x: &Integer) -> Result<Vec<Integer>, EncodingError> {
    let slots = decode_slots(layout, 2, x, layout.level2_slots())?;
    Ok(layout
        .diagonal_slots()
        .map(|s| slots[s as usize].clone())
        .collect())
}

/// Encode1 of a whole template ([ABMR20] Fig. 3, enrolment step 1): checks it (see
/// [`check_template`]) and splits it into t level-1 plaintexts of n values (the last one
/// padded with zeros).
pub fn encode_template(
    layout: &Layout,
    argument: &'static str,
    v: &[i32],
) -> Result<Vec<Integer>, EncodingError> {
    check_template(layout, argument, v)?;
    let n = layout.values_per_ciphertext();
    v.chunks(n)
        .map(|chunk| {
            let values: Vec<Integer> = chunk.iter().map(|&x| Integer::from(x)).collect();
            encode1(layout, &values)
        })
        .collect()
}

/// A uniform integer in [−2^bits, 2^bits).
pub fn random_signed<R: RngCore + CryptoRng + ?Sized>(bits: u32, rng: &mut R) -> Integer {
    let span = Integer::from(1) << (bits + 1);
    super::cipher::random_below(&span, rng) - (Integer::from(1) << bits)
}

/// The zero-sum vector ρ of [ABMR20] Fig. 3 step 3 (signed; see the module documentation):
/// ρ_0 … ρ_(n−2) uniform in [−2^W, 2^W), ρ_(n−1) = −Σ_(i<n−1) ρ_i.
pub fn zero_sum_shares<R: RngCore + CryptoRng + ?Sized>(
    layout: &Layout,
    rng: &mut R,
) -> Vec<Integer> {
    let n = layout.values_per_ciphertext();
    let mut out: Vec<Integer> = (0..n.saturating_sub(1))
        .map(|_| random_signed(layout.mask_bits(), rng))
        .collect();
    let sum: Integer = out.iter().sum();
    out.push(-sum);
    out
}

/// What Mask ([ABMR20] Fig. 2) adds: a uniform value in [−2^W, 2^W) in every level-2 slot
/// that is not a diagonal slot 2p_i.
pub fn mask_addend<R: RngCore + CryptoRng + ?Sized>(layout: &Layout, rng: &mut R) -> Integer {
    let k = layout.slot_bits();
    let mut out = Integer::new();
    for s in 0..layout.level2_slots() {
        if !layout.is_diagonal(s) {
            out += random_signed(layout.mask_bits(), rng) << (k * s);
        }
    }
    out
}

/// Mask ([ABMR20] Fig. 2): `z` plus [`mask_addend`]; Decode2 is unchanged.
pub fn mask<R: RngCore + CryptoRng + ?Sized>(layout: &Layout, z: &Integer, rng: &mut R) -> Integer {
    mask_addend(layout, rng) + z
}

/// Checks a ∈ [1, A] and b ∈ [0, 2^B) against the layout.
fn check_affine(layout: &Layout, a: &Integer, b: &Integer) -> Result<(), EncodingError> {
    if *a < 1 || a > layout.max_multiplier() {
        return Err(range(
            "multiplier",
            format!(
                "a must lie in [1, {}] for this layout ({:?})",
                layout.max_multiplier(),
                layout.protocol()
            ),
        ));
    }
    if *b < 0 || b.significant_bits() > layout.addend_bits() {
        return Err(range(
            "addend",
            format!(
                "b must lie in [0, 2^{}) for this layout ({:?})",
                layout.addend_bits(),
                layout.protocol()
            ),
        ));
    }
    Ok(())
}

/// The plaintext the terminal adds after the product: Encode2(ρ + (0, …, 0, b)) + Mask's
/// addend ([ABMR20] Fig. 3 steps 3–4 with b = 0; §6.1 and Fig. 5 step (3)–(5) with b).
/// b goes to the last diagonal slot, the one that already carries −Σρ.
pub fn affine_mask_addend<R: RngCore + CryptoRng + ?Sized>(
    layout: &Layout,
    b: &Integer,
    rng: &mut R,
) -> Result<Integer, EncodingError> {
    check_affine(layout, &Integer::from(1), b)?;
    let mut shares = zero_sum_shares(layout, rng);
    if let Some(last) = shares.last_mut() {
        *last += b;
    }
    Ok(encode2(layout, &shares)? + mask_addend(layout, rng))
}

/// The whole level-2 plaintext that [`masked_affine_inner_product`] encrypts, computed in the
/// clear (for tests and simulations): Mask(a·Σ_c u_c*·w_c* + Encode2(ρ + b)).
pub fn masked_affine_plaintext<R: RngCore + CryptoRng + ?Sized>(
    layout: &Layout,
    u_encoded: &[Integer],
    w: &[i32],
    a: &Integer,
    b: &Integer,
    rng: &mut R,
) -> Result<Integer, EncodingError> {
    check_affine(layout, a, b)?;
    let w_encoded = encode_template(layout, "w", w)?;
    if u_encoded.len() != w_encoded.len() {
        return Err(EncodingError::Length {
            argument: "u_encoded",
            found: u_encoded.len(),
            expected: w_encoded.len(),
        });
    }
    let mut z = Integer::new();
    for (u, w) in u_encoded.iter().zip(&w_encoded) {
        z += mult(u, w);
    }
    z *= a;
    Ok(z + affine_mask_addend(layout, b, rng)?)
}

/// The signed digits of a width-`w` NAF of `e` as (bit position, odd digit), |digit| < 2^(w−1).
pub(super) fn wnaf(e: i128, w: u32) -> Vec<(u32, i32)> {
    let negative = e < 0;
    let mut x = e.unsigned_abs();
    let modulus = 1u128 << w;
    let half = 1i128 << (w - 1);
    let mut out = Vec::new();
    let mut bit = 0u32;
    while x != 0 {
        if x & 1 == 1 {
            let mut d = (x % modulus) as i128;
            if d >= half {
                d -= modulus as i128;
            }
            // x − d ≥ 0 and stays below 2^127 (x < 2^127 − 2^w): exact in u128.
            x = if d >= 0 {
                x - d as u128
            } else {
                x + d.unsigned_abs()
            };
            let d = if negative { -d } else { d };
            out.push((bit, d as i32));
        }
        x >>= 1;
        bit += 1;
    }
    out
}

/// x^1, x^3, …, x^(2·count − 1) in the form of `arith`.
fn odd_powers_in<A: ModularProducts>(arith: &A, x: A::Element, count: usize) -> Vec<A::Element> {
    let mut square = x.clone();
    arith.square_assign(&mut square);
    let mut out = Vec::with_capacity(count);
    out.push(x);
    for i in 1..count {
        let mut next = out[i - 1].clone();
        arith.mul_assign(&mut next, &square);
        out.push(next);
    }
    out
}

/// x^1, x^3, …, x^(2·count − 1) mod m, as integers (the terminal's stored tables).
pub(super) fn odd_powers(x: &Integer, count: usize, m: &Integer) -> Vec<Integer> {
    let gmp = GmpModulus(m);
    odd_powers_in(&gmp, gmp.lift(x), count)
}

/// The window width minimising t·(2^(w−1) + inversion) + n·t·(bits + 1)/(w + 1)
/// multiplications (tables of both signs, then the NAF digits).
fn window_width(bases: usize, slots: usize, exponent_bits: u32) -> u32 {
    let cost = |w: u32| {
        let tables = bases as f64 * (f64::from(1u32 << (w - 1)) + 6.0);
        let digits = (slots * bases) as f64 * f64::from(exponent_bits + 1) / f64::from(w + 1);
        tables + digits
    };
    (2..=7)
        .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
        .unwrap_or(4)
}

/// Π_c bases[c]^(E_c) mod m with E_c = Σ_j exponent(c, j)·2^(k·positions[j]), by Horner over
/// the positions with the per-position multi-exponentiations interleaved on the accumulator
/// (see deviation 5 of the module documentation). The bases must be units modulo m. The
/// products are Montgomery products on AVX-512 IFMA where the CPU has it, GMP's otherwise.
fn horner_multi_exp(
    m: &Integer,
    bases: &[&Integer],
    positions: &[u32],
    k: u32,
    exponent: impl Fn(usize, usize) -> i128,
) -> Result<Integer, EncodingError> {
    match Montgomery52::for_this_cpu(m) {
        Some(ctx) => horner_multi_exp_in(&ctx, m, bases, positions, k, exponent),
        None => horner_multi_exp_in(&GmpModulus(m), m, bases, positions, k, exponent),
    }
}

/// [`horner_multi_exp`] with the products of `arith` (whose modulus is `m`).
fn horner_multi_exp_in<A: ModularProducts>(
    arith: &A,
    m: &Integer,
    bases: &[&Integer],
    positions: &[u32],
    k: u32,
    exponent: impl Fn(usize, usize) -> i128,
) -> Result<Integer, EncodingError> {
    let mut exponent_bits = 1u32;
    for c in 0..bases.len() {
        for j in 0..positions.len() {
            let e = exponent(c, j);
            exponent_bits = exponent_bits.max(128 - e.unsigned_abs().leading_zeros());
        }
    }
    let w = window_width(bases.len(), positions.len(), exponent_bits);
    let half = 1usize << (w - 2);
    // Digits as (global bit, base, digit): global bit = k·p_j + bit of the digit.
    let mut events: Vec<(u64, usize, i32)> = Vec::new();
    let mut used_negative = vec![false; bases.len()];
    for (c, flag) in used_negative.iter_mut().enumerate() {
        for (j, &p) in positions.iter().enumerate() {
            for (bit, d) in wnaf(exponent(c, j), w) {
                events.push((u64::from(k) * u64::from(p) + u64::from(bit), c, d));
                *flag |= d < 0;
            }
        }
    }
    // Per base: its odd powers, and those of its inverse where a digit is negative.
    type OddPowers<E> = (Vec<E>, Vec<E>);
    let mut tables: Vec<OddPowers<A::Element>> = Vec::with_capacity(bases.len());
    for (c, base) in bases.iter().enumerate() {
        let positive = odd_powers_in(arith, arith.lift(base), half);
        let negative = if used_negative[c] {
            let inverse = base
                .invert_ref(m)
                .map(Integer::from)
                .ok_or_else(|| range("template", format!("ciphertext {c} is not a unit")))?;
            odd_powers_in(arith, arith.lift(&inverse), half)
        } else {
            Vec::new()
        };
        tables.push((positive, negative));
    }
    events.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut acc: Option<A::Element> = None;
    let mut current = 0u64;
    for (bit, c, d) in events {
        if let Some(x) = acc.as_mut() {
            for _ in bit..current {
                arith.square_assign(x);
            }
        }
        let (positive, negative) = &tables[c];
        let entry = if d > 0 {
            &positive[(d as usize) >> 1]
        } else {
            &negative[(d.unsigned_abs() as usize) >> 1]
        };
        match acc.as_mut() {
            Some(x) => arith.mul_assign(x, entry),
            None => acc = Some(entry.clone()),
        }
        current = bit;
    }
    let mut x = acc.unwrap_or_else(|| arith.one());
    for _ in 0..current {
        arith.square_assign(&mut x);
    }
    Ok(arith.lower(&x))
}

/// Checks the template ciphertexts against the key and the layout.
pub(super) fn check_template_ciphertexts(
    pk: &PublicKey,
    layout: &Layout,
    template: &[Ciphertext],
) -> Result<(), EncodingError> {
    if pk.modulus_bits() != layout.modulus_bits() {
        return Err(range(
            "public_key",
            format!(
                "{}-bit modulus, the layout is for {} bits",
                pk.modulus_bits(),
                layout.modulus_bits()
            ),
        ));
    }
    if template.len() != layout.ciphertexts() {
        return Err(EncodingError::Length {
            argument: "template",
            found: template.len(),
            expected: layout.ciphertexts(),
        });
    }
    for (i, c) in template.iter().enumerate() {
        if c.as_integer() >= pk.n_squared() || *c.as_integer() <= 0 {
            return Err(range(
                "template",
                format!("ciphertext {i} is not below N² of this key"),
            ));
        }
    }
    Ok(())
}

/// ⟦Σ_c u_c*·w_c*⟧ ([ABMR20] Fig. 3 Round 2 steps 1–2: Encode1(w), then Mult and Add2
/// homomorphically), by the per-slot multi-exponentiation with m-bit signed exponents and
/// Horner's rule (deviation 5). `w` is checked like a template (length, range, norm).
pub fn homomorphic_inner_product(
    pk: &PublicKey,
    layout: &Layout,
    template: &[Ciphertext],
    w: &[i32],
) -> Result<Ciphertext, EncodingError> {
    check_template(layout, "w", w)?;
    check_template_ciphertexts(pk, layout, template)?;
    let n = layout.values_per_ciphertext();
    let bases: Vec<&Integer> = template.iter().map(Ciphertext::as_integer).collect();
    let x = horner_multi_exp(
        pk.n_squared(),
        &bases,
        layout.positions(),
        layout.slot_bits(),
        |c, j| w.get(c * n + j).map_or(0, |&v| i128::from(v)),
    )?;
    Ok(pk.ciphertext_from_integer(x)?)
}

/// As [`homomorphic_inner_product`] but with the multiplier a folded into the exponents
/// (a·w_(c,j), up to m + κ bits): the alternative to applying a once to the result, kept to
/// measure it (see the `timings` test of `pi2.rs`).
pub fn homomorphic_inner_product_folded(
    pk: &PublicKey,
    layout: &Layout,
    template: &[Ciphertext],
    w: &[i32],
    a: &Integer,
) -> Result<Ciphertext, EncodingError> {
    check_template(layout, "w", w)?;
    check_template_ciphertexts(pk, layout, template)?;
    let a = a
        .to_u64()
        .filter(|&a| a >= 1)
        .ok_or_else(|| range("multiplier", "folding needs 1 ≤ a < 2^64"))?;
    let n = layout.values_per_ciphertext();
    let bases: Vec<&Integer> = template.iter().map(Ciphertext::as_integer).collect();
    let x = horner_multi_exp(
        pk.n_squared(),
        &bases,
        layout.positions(),
        layout.slot_bits(),
        |c, j| {
            w.get(c * n + j)
                .map_or(0, |&v| i128::from(v).wrapping_mul(i128::from(a)))
        },
    )?;
    Ok(pk.ciphertext_from_integer(x)?)
}

/// ⟦Mask(a·Σ_c u_c*·w_c* + Encode2(ρ) + Encode2(0, …, 0, b))⟧, re-randomised with a fresh
/// r^N ([ABMR20] Fig. 3 Round 2 with a = 1, b = 0; §6.1 Π2 Round 2 with a random prime a and
/// b; Fig. 5 Round 2 step (3)–(5) for Π3: X̃ with a = 1, b = pad and Ỹ with a, b). Decrypted
/// and decoded with [`decode_sum`] it gives a·⟨u, w⟩ + b; every other slot is masked.
pub fn masked_affine_inner_product<R: RngCore + CryptoRng + ?Sized>(
    pk: &PublicKey,
    layout: &Layout,
    template: &[Ciphertext],
    w: &[i32],
    a: &Integer,
    b: &Integer,
    rng: &mut R,
) -> Result<Ciphertext, EncodingError> {
    let r_to_n = pk.random_nonce_power(rng);
    masked_affine_inner_product_with_nonce(pk, layout, template, w, a, b, &r_to_n, rng)
}

/// As [`masked_affine_inner_product`] with a precomputed r^N mod N² (from a
/// [`super::cipher::NoncePool`] filled offline for this key; it must be fresh and of this
/// key, which cannot be checked here beyond 0 < r^N < N² and gcd(r^N, N) = 1).
#[allow(clippy::too_many_arguments)]
pub fn masked_affine_inner_product_with_nonce<R: RngCore + CryptoRng + ?Sized>(
    pk: &PublicKey,
    layout: &Layout,
    template: &[Ciphertext],
    w: &[i32],
    a: &Integer,
    b: &Integer,
    r_to_n: &Integer,
    rng: &mut R,
) -> Result<Ciphertext, EncodingError> {
    let product = homomorphic_inner_product(pk, layout, template, w)?;
    mask_affine_product(pk, layout, &product, a, b, r_to_n, rng)
}

/// The second half of [`masked_affine_inner_product_with_nonce`], for a product ⟦z⟧ from
/// [`homomorphic_inner_product`]: ⟦Mask(a·z + Encode2(ρ + (0, …, 0, b)))⟧ re-randomised with
/// `r_to_n`. Π3 ([ABMR20] Fig. 5 Round 2 steps (3)–(5)) computes ⟦z⟧ once and calls this twice:
/// a = 1, b = pad for X̃ and a, b for Ỹ (each with fresh masks, ρ and r^N).
pub fn mask_affine_product<R: RngCore + CryptoRng + ?Sized>(
    pk: &PublicKey,
    layout: &Layout,
    product: &Ciphertext,
    a: &Integer,
    b: &Integer,
    r_to_n: &Integer,
    rng: &mut R,
) -> Result<Ciphertext, EncodingError> {
    check_affine(layout, a, b)?;
    let nonce = pk
        .ciphertext_from_integer(r_to_n.clone())
        .map_err(|_| range("r_to_n", "not an element of Z_{N²}^* of this key"))?;
    let scaled = if *a == 1 {
        product.clone()
    } else {
        // a is the terminal's secret: constant-time exponentiation (product is a unit).
        let raised = crate::algebra::montgomery::secure_pow_mod(
            product.as_integer(),
            a,
            a.significant_bits(),
            pk.n_squared(),
        );
        pk.ciphertext_from_integer(raised)?
    };
    let addend = affine_mask_addend(layout, b, rng)?;
    let masked = pk.add_plain(&scaled, &addend);
    Ok(pk.rerandomize(&masked, nonce.as_integer()))
}

/// The device's side of [ABMR20] Fig. 3 Round 3 step 1 (and Fig. 5 Round 3 steps 1–2):
/// decrypt, Decode2, and sum the n decoded slots. An error if the plaintext is not a level-2
/// encoding of this layout (it cannot happen with an honest terminal).
pub fn decode_sum(
    sk: &SecretKey,
    layout: &Layout,
    ct: &Ciphertext,
) -> Result<Integer, EncodingError> {
    let plain = sk.decrypt_signed(ct);
    Ok(decode2(layout, &plain)?.into_iter().sum())
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::{key_2048, small_key};
    use super::super::params::{Params, Protocol, DEFAULT_STAT_BITS};
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;
    use std::cell::RefCell;

    fn params(protocol: Protocol, dim: usize, m: u32, bits: u32) -> Params {
        Params::new_allowing_test_modulus(
            protocol,
            dim,
            m,
            bits,
            DEFAULT_STAT_BITS,
            Params::max_norm_bound(dim, m),
        )
        .unwrap()
    }

    fn runner(seed: u8, cases: u32) -> TestRunner {
        TestRunner::new_with_rng(
            Config {
                cases,
                failure_persistence: None,
                ..Config::default()
            },
            TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
        )
    }

    /// Element values with the extremes over-represented.
    fn element(m: u32) -> impl Strategy<Value = i32> {
        let hi = (1i32 << (m - 1)) - 1;
        let lo = -(1i32 << (m - 1));
        prop_oneof![
            Just(hi),
            Just(-hi),
            Just(lo),
            Just(0),
            Just(1),
            Just(-1),
            lo..=hi,
            lo..=hi,
        ]
    }

    fn dot(u: &[i32], w: &[i32]) -> Integer {
        u.iter()
            .zip(w)
            .map(|(&a, &b)| Integer::from(i64::from(a) * i64::from(b)))
            .sum()
    }

    #[test]
    fn level_one_and_two_round_trips_at_every_supported_shape() {
        let mut n_cases = 0;
        for protocol in [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3] {
            for bits in [2048u32, 3072] {
                for dim in [1usize, 2, 5, 7, 100, 128, 255, 256, 512, 1000, 1024, 4096] {
                    for m in 2u32..=24 {
                        let p = params(protocol, dim, m, bits);
                        let l = p.layout();
                        let n = l.values_per_ciphertext();
                        let mut runner = runner(n_cases as u8, 4);
                        runner
                            .run(&proptest::collection::vec(element(m), n), |v| {
                                let values: Vec<Integer> =
                                    v.iter().map(|&x| Integer::from(x)).collect();
                                let e1 = encode1(l, &values).unwrap();
                                prop_assert_eq!(decode1(l, &e1).unwrap(), values.clone());
                                let e2 = encode2(l, &values).unwrap();
                                prop_assert_eq!(decode2(l, &e2).unwrap(), values.clone());
                                // Add1 / Add2.
                                let twice = decode1(l, &(e1.clone() + &e1)).unwrap();
                                let expect: Vec<Integer> =
                                    values.iter().map(|x| x.clone() * 2u32).collect();
                                prop_assert_eq!(twice, expect);
                                // Mult: the diagonal of u*·u* holds the squares.
                                let sq = decode2(l, &mult(&e1, &e1)).unwrap();
                                let expect: Vec<Integer> =
                                    values.iter().map(|x| x.clone().square()).collect();
                                prop_assert_eq!(sq, expect);
                                Ok(())
                            })
                            .unwrap();
                        // The extreme slot values themselves.
                        let limit = Integer::from(1) << (l.slot_bits() - 1);
                        let extremes = vec![(&limit - 1u32).complete(); n];
                        let neg: Vec<Integer> = extremes.iter().map(|x| -x.clone()).collect();
                        for vals in [extremes, neg] {
                            assert_eq!(decode2(l, &encode2(l, &vals).unwrap()).unwrap(), vals);
                            assert_eq!(decode1(l, &encode1(l, &vals).unwrap()).unwrap(), vals);
                        }
                        assert!(encode1(l, std::slice::from_ref(&limit)).is_err());
                        assert!(encode2(l, &[-limit]).is_err());
                        n_cases += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn decoding_refuses_what_is_not_an_encoding() {
        let p = params(Protocol::Pi1, 16, 8, 2048);
        let l = p.layout();
        let too_big = Integer::from(1) << (l.slot_bits() * l.level2_slots() + 3);
        assert!(decode2(l, &too_big).is_err());
        let unused = Integer::from(1) << (l.slot_bits() * 2);
        // Slot 2 is not a level-1 position (positions 0, 1, 3, …).
        assert_eq!(l.positions()[..2], [0, 1]);
        assert!(decode1(l, &unused).is_err());
        assert!(encode1(l, &vec![Integer::from(1); l.values_per_ciphertext() + 1]).is_err());
    }

    #[test]
    fn templates_are_checked() {
        let p =
            Params::new_allowing_test_modulus(Protocol::Pi1, 4, 8, 1024, 40, Integer::from(100))
                .unwrap();
        let l = p.layout();
        assert!(check_template(l, "u", &[1, 2, 3, 4]).is_ok());
        let e = check_template(l, "u", &[1, 2, 3]).unwrap_err();
        assert!(e.to_string().contains("u:"), "{e}");
        let e = check_template(l, "w", &[128, 0, 0, 0]).unwrap_err();
        assert!(e.to_string().contains("w[0]"), "{e}");
        assert!(check_template(l, "w", &[-128, 0, 0, 0]).is_err(), "norm");
        assert!(check_template(l, "w", &[5, 5, 5, 0]).is_ok(), "75 ≤ 100");
        let e = check_template(l, "w", &[6, 6, 6, 0]).unwrap_err();
        assert!(e.to_string().contains("squared norm 108"), "{e}");
        assert!(check_template(l, "w", &[10, 0, 0, 0]).is_ok());
    }

    #[test]
    fn wnaf_digits_recompose() {
        for w in 2..=7 {
            for e in [
                0i128,
                1,
                -1,
                7,
                -8,
                12345,
                -65536,
                65535,
                1 << 90,
                -(1 << 100) + 3,
            ] {
                let digits = wnaf(e, w);
                let back: i128 = digits.iter().map(|&(b, d)| i128::from(d) << b).sum();
                assert_eq!(back, e, "w = {w}");
                for &(_, d) in &digits {
                    assert!(d % 2 != 0 && d.abs() < 1 << (w - 1));
                }
            }
        }
    }

    /// Mult + Add2 + ρ + Mask + decode == the plaintext inner product (no encryption).
    #[test]
    fn masked_inner_product_decodes_to_the_affine_inner_product_in_the_clear() {
        let mut case = 0u8;
        for protocol in [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3] {
            for (dim, m) in [
                (1usize, 2u32),
                (7, 8),
                (128, 8),
                (256, 16),
                (512, 24),
                (1024, 16),
            ] {
                let p = params(protocol, dim, m, 3072);
                let l = p.layout().clone();
                let rng = RefCell::new(ChaCha20Rng::seed_from_u64(u64::from(case)));
                let mut runner = runner(case, 6);
                case = case.wrapping_add(1);
                let strategy = (
                    proptest::collection::vec(element(m), dim),
                    proptest::collection::vec(element(m), dim),
                );
                runner
                    .run(&strategy, |(u, w)| {
                        let mut guard = rng.borrow_mut();
                        let mut rng: &mut ChaCha20Rng = &mut guard;
                        let u_enc = encode_template(&l, "u", &u).unwrap();
                        let (a, b) = match protocol {
                            Protocol::Pi1 => (Integer::from(1), Integer::new()),
                            _ => (
                                l.max_multiplier().clone(),
                                (Integer::from(1) << l.addend_bits()) - 1u32,
                            ),
                        };
                        let plain =
                            masked_affine_plaintext(&l, &u_enc, &w, &a, &b, &mut rng).unwrap();
                        let slots = decode2(&l, &plain).unwrap();
                        let sum: Integer = slots.iter().sum();
                        prop_assert_eq!(sum, a.clone() * dot(&u, &w) + &b);
                        // The cross slots are masked: none equals its unmasked value.
                        let all = decode_slots(&l, 2, &plain, l.level2_slots()).unwrap();
                        prop_assert_eq!(all.len() as u32, l.level2_slots());
                        Ok(())
                    })
                    .unwrap();
            }
        }
    }

    #[test]
    fn zero_sum_shares_sum_to_zero_and_masks_spare_the_diagonal() {
        let p = params(Protocol::Pi2, 256, 16, 2048);
        let l = p.layout();
        let mut rng = ChaCha20Rng::seed_from_u64(9);
        let rho = zero_sum_shares(l, &mut rng);
        assert_eq!(rho.len(), l.values_per_ciphertext());
        assert_eq!(rho.iter().sum::<Integer>(), 0);
        let m = mask_addend(l, &mut rng);
        assert!(decode2(l, &m).unwrap().iter().all(|x| *x == 0));
        let all = decode_slots(l, 2, &m, l.level2_slots()).unwrap();
        let nonzero = all.iter().filter(|x| **x != 0).count() as u32;
        assert_eq!(nonzero, l.level2_slots() - l.values_per_ciphertext() as u32);
        let z = Integer::from(12345);
        assert_eq!(decode2(l, &mask(l, &z, &mut rng)).unwrap()[0], 12345);
    }

    /// The multi-exponentiation equals the naive Π_c ⟦u_c*⟧^(w_c*) with full-size exponents.
    #[test]
    fn horner_multi_exponentiation_equals_the_naive_product() {
        let sk = small_key();
        let pk = sk.public_key();
        let rng = RefCell::new(ChaCha20Rng::seed_from_u64(10));
        for (dim, m) in [(1usize, 2u32), (3, 8), (9, 8), (20, 16), (17, 24)] {
            let p = params(Protocol::Pi1, dim, m, 1024);
            let l = p.layout();
            let mut runner = runner(dim as u8, 4);
            runner
                .run(
                    &(
                        proptest::collection::vec(element(m), dim),
                        proptest::collection::vec(element(m), dim),
                    ),
                    |(u, w)| {
                        let mut guard = rng.borrow_mut();
                        let mut rng: &mut ChaCha20Rng = &mut guard;
                        let u_enc = encode_template(l, "u", &u).unwrap();
                        let cts: Vec<Ciphertext> = u_enc
                            .iter()
                            .map(|x| sk.encrypt(&pk.reduce_signed(x).unwrap(), &mut rng).unwrap())
                            .collect();
                        let fast = homomorphic_inner_product(pk, l, &cts, &w).unwrap();
                        let w_enc = encode_template(l, "w", &w).unwrap();
                        let mut naive = pk
                            .encrypt_with_nonce_power(&Integer::new(), &Integer::from(1))
                            .unwrap();
                        for (c, we) in cts.iter().zip(&w_enc) {
                            naive = pk.add(&naive, &pk.mul_plain(c, we));
                        }
                        prop_assert_eq!(&fast, &naive);
                        let plain = sk.decrypt_signed(&fast);
                        let diag: Integer = decode2(l, &plain).unwrap().into_iter().sum();
                        prop_assert_eq!(diag, dot(&u, &w));
                        let folded = homomorphic_inner_product_folded(
                            pk,
                            l,
                            &cts,
                            &w,
                            &Integer::from(1_000_003),
                        )
                        .unwrap();
                        prop_assert_eq!(folded, pk.mul_plain(&fast, &Integer::from(1_000_003)));
                        Ok(())
                    },
                )
                .unwrap();
        }
    }

    /// With encryption: the masked affine inner product decrypts and decodes to a·IP + b.
    #[test]
    fn masked_affine_inner_product_under_encryption() {
        let rng = RefCell::new(ChaCha20Rng::seed_from_u64(11));
        let cases: [(&SecretKey, Protocol, usize, u32); 4] = [
            (small_key(), Protocol::Pi1, 16, 8),
            (small_key(), Protocol::Pi2, 10, 16),
            (key_2048(), Protocol::Pi2, 256, 16),
            (key_2048(), Protocol::Pi3, 128, 24),
        ];
        for (sk, protocol, dim, m) in cases {
            let pk = sk.public_key();
            let p = params(protocol, dim, m, pk.modulus_bits());
            let l = p.layout();
            let mut runner = runner(dim as u8, 3);
            runner
                .run(
                    &(
                        proptest::collection::vec(element(m), dim),
                        proptest::collection::vec(element(m), dim),
                    ),
                    |(u, w)| {
                        let mut guard = rng.borrow_mut();
                        let mut rng: &mut ChaCha20Rng = &mut guard;
                        let cts: Vec<Ciphertext> = encode_template(l, "u", &u)
                            .unwrap()
                            .iter()
                            .map(|x| sk.encrypt(&pk.reduce_signed(x).unwrap(), &mut rng).unwrap())
                            .collect();
                        let a = l.max_multiplier().clone();
                        let b = if protocol == Protocol::Pi1 {
                            Integer::new()
                        } else {
                            random_signed(l.addend_bits() - 1, &mut rng).abs()
                        };
                        let ct =
                            masked_affine_inner_product(pk, l, &cts, &w, &a, &b, &mut rng).unwrap();
                        let got = decode_sum(sk, l, &ct).unwrap();
                        prop_assert_eq!(got, a * dot(&u, &w) + b);
                        Ok(())
                    },
                )
                .unwrap();
        }
    }

    #[test]
    fn affine_arguments_are_checked() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(12);
        let p = params(Protocol::Pi2, 4, 8, 1024);
        let l = p.layout();
        let cts: Vec<Ciphertext> = (0..l.ciphertexts())
            .map(|_| sk.encrypt(&Integer::from(1), &mut rng).unwrap())
            .collect();
        let w = [1, 2, 3, 4];
        let too_big_a = l.max_multiplier().clone() + 1u32;
        let e = masked_affine_inner_product(pk, l, &cts, &w, &too_big_a, &Integer::new(), &mut rng)
            .unwrap_err();
        assert!(e.to_string().contains("multiplier"), "{e}");
        let e = masked_affine_inner_product(
            pk,
            l,
            &cts,
            &w,
            &Integer::from(0),
            &Integer::new(),
            &mut rng,
        )
        .unwrap_err();
        assert!(e.to_string().contains("multiplier"), "{e}");
        let too_big_b = Integer::from(1) << l.addend_bits();
        let e =
            masked_affine_inner_product(pk, l, &cts, &w, &Integer::from(3), &too_big_b, &mut rng)
                .unwrap_err();
        assert!(e.to_string().contains("addend"), "{e}");
        let e = masked_affine_inner_product(
            pk,
            l,
            &cts[..0],
            &w,
            &Integer::from(3),
            &Integer::new(),
            &mut rng,
        )
        .unwrap_err();
        assert!(e.to_string().contains("template"), "{e}");
        let big = key_2048().public_key();
        assert!(masked_affine_inner_product(
            big,
            l,
            &cts,
            &w,
            &Integer::from(3),
            &Integer::new(),
            &mut rng
        )
        .is_err());
        let pi1 = params(Protocol::Pi1, 4, 8, 1024);
        assert!(masked_affine_inner_product(
            pk,
            pi1.layout(),
            &cts,
            &w,
            &Integer::from(2),
            &Integer::new(),
            &mut rng
        )
        .is_err());
    }

    fn layout_table(norm: impl Fn(usize, u32) -> Integer) -> String {
        let mut out = String::new();
        out.push_str("| ℓ | m | N bits | Π1 n / k / t | Π2 n / k / t | Π3 n / k / t |\n|---|---|---|---|---|---|\n");
        for bits in [2048u32, 3072] {
            for m in [8u32, 16, 24] {
                for dim in [128usize, 256, 512, 1024] {
                    let mut row = format!("| {dim} | {m} | {bits} |");
                    for protocol in [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3] {
                        let p =
                            Params::new(protocol, dim, m, bits, DEFAULT_STAT_BITS, norm(dim, m))
                                .unwrap();
                        let l = p.layout();
                        row.push_str(&format!(
                            " {} / {} / {} |",
                            l.values_per_ciphertext(),
                            l.slot_bits(),
                            l.ciphertexts()
                        ));
                    }
                    out.push_str(&row);
                    out.push('\n');
                }
            }
        }
        out
    }

    #[test]
    fn layouts_table() {
        println!(
            "largest norm bound ζ² = ℓ·2^(2(m−1)), λ = 40:\n{}",
            layout_table(Params::max_norm_bound)
        );
        println!(
            "unit-scale norm bound ζ² = 2^(2(m−1)), λ = 40:\n{}",
            layout_table(|_, m| Integer::from(1) << (2 * (m - 1)))
        );
        // [ABMR20] §5's own constraint 2^n·(2m + log n + log⌈ℓ/n⌉ + λ + 2) ≤ |N| allows n = 4
        // (2048 bits) and n = 5 (3072 bits) at ℓ = 256, m = 16; ours packs 6 and 8.
        for (bits, n) in [(2048u32, 6usize), (3072, 8)] {
            let p = Params::new(
                Protocol::Pi1,
                256,
                16,
                bits,
                40,
                Params::max_norm_bound(256, 16),
            )
            .unwrap();
            assert_eq!(p.layout().values_per_ciphertext(), n);
        }
    }
}
