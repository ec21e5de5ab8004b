//! # Π2: matching secure against a malicious device ([ABMR20] §6)
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH: Using Mobile
//! Devices for Seamless External-Facing Biometric Matching", CCS 2020, ePrint 2020/1363.
//!
//! The paper's Fig. 4 did not survive in the copy we work from; the protocol below is rebuilt
//! from §6.1's text, the simulator of Appendix D.1 and Fig. 5 (Π3, which extends it):
//!
//! * **Enrolment** (§6.1 "Overview"): D encrypts its elements one by one,
//!   ⟦u_1⟧ … ⟦u_ℓ⟧ ([`encrypt_elements`]), and proves in zero knowledge that the key is well
//!   formed, that it knows the plaintexts and that ‖u‖² ≤ ζ² (§8; the proofs are elsewhere).
//!   SP turns them into the packed ⟦u_1*⟧ … ⟦u_t*⟧ homomorphically
//!   ([`pack_element_ciphertexts`]) and signs (params, epk, ⟦u_c*⟧) with its own scheme over
//!   [`template_signing_bytes`]; because SP packs, the packed ciphertexts are honest encodings
//!   of a norm-bounded u whatever D does, which the slot sizing relies on.
//! * **Round 1** D → T ([`Pi2Round1`]): (σ, epk, ⟦u_1*⟧ … ⟦u_t*⟧). Reusable.
//! * **Round 2** T → D ([`Pi2Round2`]): T verifies σ (else ⊥), picks a fresh random prime a of
//!   κ ≥ 64 bits ([`random_prime_multiplier`]) and b uniform in [2·A·ζ², 2^B)
//!   ([`random_addend`], [`pi2_addend_range`]), and sends ⟦Mask(a·Σ_c u_c*·w_c* + Encode2(ρ̃ + (0, …, 0, b)))⟧,
//!   re-randomised. The product is computed with m-bit exponents and a applied once to it (the
//!   cheaper of the two ways, measured by the `timings` test).
//! * **Round 3** D → T ([`Pi2Round3`]): X, the sum of the decoded diagonal slots
//!   (= a·IP + b for an honest D). The device sends X only if it lies in [`pi2_x_range`],
//!   where every honest X lies (b's floor makes it at least A·ζ²); and a device that talks
//!   through an untrusted relay answers only a Round 2 the service provider signed
//!   ([`Pi2DeviceSession::round3_signed`], `signed_round2.rs`).
//! * **Round 4** T → D ([`Pi2Round4`]): T computes IP′ = (X − b)/a and outputs ⊥ (a
//!   [`MatchError::Cheating`]) unless a | (X − b) and |IP′| ≤ IP_max = ζ² (the signed form of
//!   §6.1's 0 ≤ IP′ ≤ IP_max); otherwise it outputs [IP′ ≥ threshold] and sends the bit.
//!
//! Leakage: T learns IP (L_term); D learns the bit only: X = a·IP + b is within 2^−(λ+1) of
//! uniform given anything D knows, and the masked slots are simulatable (see `encoding.rs`).
//!
//! **Why a prime a of κ ≥ 64 bits.** A device that sends X′ = X + Δ is accepted only if a | Δ
//! and |IP + Δ/a| ≤ ζ², so |Δ| < 2^(κ+1)·ζ². Its view is independent of a (up to 2^−(λ+1)), so Δ
//! is fixed before a is drawn. A uniform κ-bit *integer* a is a poor choice: a Δ with many
//! divisors (a product of many small primes) is divisible by a noticeable fraction of them. For
//! a uniform κ-bit *prime*, Δ has at most ⌊(κ + 1 + bits(ζ²))/(κ − 1)⌋ prime factors of κ bits
//! among at least 2^(κ−1)/κ such primes, so the cheating chance is below 2^−56 at κ = 64,
//! λ = 40, bits(ζ²) ≤ 59; `Layout::multiplier_bits` raises κ when λ demands it. A λ-bit prime
//! would give only about 2^−33 for λ = 40. Sampling costs about 22 primality tests of 64-bit
//! numbers, negligible.
//!
//! **Cost** (the `timings` test; release, one core of a 2-vCPU AMD EPYC, ℓ = 256, m = 16,
//! |N| = 3072, n = 5, t = 52): T's Round 2 about 24 ms with a pooled r^N (about 52 ms computing
//! r^N on the spot), D's Round 3 about 11 ms, T's Round 4 a few µs; applying a once costs about
//! 23 ms for the product and its power, folding a into the exponents about 46 ms. [ABMR20] §9
//! reports 49 ms for the Π2 matching phase on a laptop.
//!
//! **What Π3 reuses** ([ABMR20] Fig. 5 Round 2, T's side):
//! `encoding::homomorphic_inner_product` once for ⟦z⟧, then `encoding::mask_affine_product`
//! twice (a = 1, b = pad for X̃; a, b for Ỹ), and on D's side `encoding::decode_sum` for X
//! and Y. Π3's layout takes a uniform in [1, 2^λ) (its circuit checks Y = a·(X − pad) + b, an
//! equation: a device without a guesses it with probability 2^−λ).

use super::cipher::{random_below, Ciphertext, PublicKey, SecretKey};
use super::encoding::{check_template, decode_sum, mask_affine_product};
use super::messages::{
    begin_state, check_device_parts, check_session_params, decode_bit, encode_bit, end_state,
    header, put_signed, put_template, read_template, state_reader, template_signing_bytes, to_i64,
    MatchError, MessageKind, Reader, MAX_SIGNATURE_BYTES,
};
use super::params::{Layout, Params, Protocol};
use super::precomputed::{inner_product_with, PrecomputedTemplate};
use super::signed_round2::VerifiedRound2;
use crate::algebra::montgomery::{GmpModulus, ModularProducts, Montgomery52};
use rand_core::{CryptoRng, RngCore};
use rug::integer::IsPrime;
use rug::{Complete, Integer};
use std::sync::Arc;

/// Miller–Rabin rounds (after GMP's Baillie–PSW) for the multiplier a.
const PRIME_TEST_REPS: u32 = 30;

/// Π2 enrolment, D's first step ([ABMR20] §6.1 "Overview"): the template u (checked: ℓ
/// elements of m bits, ‖u‖² ≤ ζ²) encrypted element by element, by the key owner's CRT path.
/// These ciphertexts are what the zero-knowledge proofs of §8 speak about.
pub fn encrypt_elements<R: RngCore + CryptoRng + ?Sized>(
    secret: &SecretKey,
    params: &Params,
    u: &[i32],
    rng: &mut R,
) -> Result<Vec<Ciphertext>, MatchError> {
    let pk = secret.public_key();
    if pk.modulus_bits() != params.modulus_bits() {
        return Err(MatchError::Argument {
            argument: "secret",
            reason: format!(
                "{}-bit key, the parameters say {} bits",
                pk.modulus_bits(),
                params.modulus_bits()
            ),
        });
    }
    check_template(params.layout(), "u", u)?;
    u.iter()
        .map(|&x| {
            let m = pk.reduce_signed(&Integer::from(x))?;
            Ok(secret.encrypt(&m, rng)?)
        })
        .collect()
}

/// Π2 enrolment, SP's step ([ABMR20] §6.1 "Overview", D.1 step (2)): the packed ⟦u_c*⟧ from
/// the element ciphertexts ⟦u_(c,0)⟧ … ⟦u_(c,n−1)⟧, homomorphically: Horner over the slot
/// positions, ⟦u_c*⟧ = (…(⟦u_(c,n−1)⟧^(2^(k(p_(n−1)−p_(n−2)))) · ⟦u_(c,n−2)⟧)…)^(2^(k·p_1)) · ⟦u_(c,0)⟧,
/// the powers of two as repeated squaring. Deterministic (D knows the plaintexts anyway); the
/// result is what SP signs.
pub fn pack_element_ciphertexts(
    pk: &PublicKey,
    params: &Params,
    elements: &[Ciphertext],
) -> Result<Vec<Ciphertext>, MatchError> {
    let layout = params.layout();
    if pk.modulus_bits() != params.modulus_bits() {
        return Err(MatchError::Argument {
            argument: "public_key",
            reason: "key size differs from the parameters".into(),
        });
    }
    if elements.len() != layout.dim() {
        return Err(MatchError::Argument {
            argument: "elements",
            reason: format!(
                "{} ciphertexts, expected ℓ = {}",
                elements.len(),
                layout.dim()
            ),
        });
    }
    let n2 = pk.n_squared();
    for x in elements {
        if x.as_integer() >= n2 || *x.as_integer() <= 0 {
            return Err(MatchError::Argument {
                argument: "elements",
                reason: "a ciphertext is not below N² of this key".into(),
            });
        }
    }
    let packed = match Montgomery52::for_this_cpu(n2) {
        Some(ctx) => pack_with(&ctx, layout, elements),
        None => pack_with(&GmpModulus(n2), layout, elements),
    };
    packed
        .into_iter()
        .map(|c| Ok(pk.ciphertext_from_integer(c)?))
        .collect()
}

/// The packed ciphertexts of [`pack_element_ciphertexts`] with the modular products of
/// `arith` (Montgomery products on AVX-512 IFMA, or GMP's).
fn pack_with<A: ModularProducts>(
    arith: &A,
    layout: &Layout,
    elements: &[Ciphertext],
) -> Vec<Integer> {
    let k = layout.slot_bits();
    let positions = layout.positions();
    let mut out = Vec::with_capacity(layout.ciphertexts());
    for chunk in elements.chunks(layout.values_per_ciphertext()) {
        let mut acc: Option<A::Element> = None;
        for j in (0..chunk.len()).rev() {
            let x = arith.lift(chunk[j].as_integer());
            acc = Some(match acc {
                None => x,
                Some(mut a) => {
                    // positions[j + 1] exists: the loop went down from the last one.
                    let gap = k * (positions[j + 1] - positions[j]);
                    for _ in 0..gap {
                        arith.square_assign(&mut a);
                    }
                    arith.mul_assign(&mut a, &x);
                    a
                }
            });
        }
        out.push(arith.lower(&acc.unwrap_or_else(|| arith.one())));
    }
    out
}

/// A uniform prime of exactly κ = [`Layout::multiplier_bits`] bits: Π2's multiplier a
/// ([ABMR20] §6.1 Round 2; see the module documentation for why a prime).
pub fn random_prime_multiplier<R: RngCore + CryptoRng + ?Sized>(
    layout: &Layout,
    rng: &mut R,
) -> Result<Integer, MatchError> {
    let bits = layout.multiplier_bits();
    if layout.protocol() != Protocol::Pi2 || bits < 2 {
        return Err(MatchError::Argument {
            argument: "layout",
            reason: format!("no prime multiplier in a {:?} layout", layout.protocol()),
        });
    }
    let top = Integer::from(1) << (bits - 1);
    loop {
        // Uniform in [2^(κ−1), 2^κ): rejection keeps the prime uniform among κ-bit primes.
        let candidate = random_below(&top, rng) + &top;
        if candidate.is_probably_prime(PRIME_TEST_REPS) != IsPrime::No {
            return Ok(candidate);
        }
    }
}

/// The range [low, high) of Π2's addend b ([ABMR20] §6.1 Round 2): [2·A·ζ², 2^B), B =
/// [`Layout::addend_bits`] = bits(A·ζ²) + λ + 1, A the largest multiplier. The floor keeps every
/// honest X = a·IP + b at or above A·ζ² (a ≤ A, |IP| ≤ ζ²), so the device can refuse small
/// values ([`pi2_x_range`]); the interval is still at least 2^B·(1 − 2^−λ) wide, so b hides
/// a·IP within about 2^−λ, and b stays below 2^B, the room the layout reserves.
pub fn pi2_addend_range(layout: &Layout) -> (Integer, Integer) {
    let low = Integer::from(2) * layout.max_multiplier() * layout.ip_bound();
    let high = Integer::from(1) << layout.addend_bits();
    (low, high)
}

/// The range [low, high) of X = a·IP + b that an honest Π2 Round 2 produces: [A·ζ², 2^B + A·ζ²)
/// (b from [`pi2_addend_range`], 1 ≤ a ≤ A, |IP| ≤ ζ²). The device refuses to send any other X
/// ([`MatchError::OutOfRange`]): a Round 2 that was not made as the protocol says (a power of
/// a template ciphertext, say, which puts template values on the diagonal) decodes outside it.
pub fn pi2_x_range(layout: &Layout) -> (Integer, Integer) {
    let a_zeta = (layout.max_multiplier() * layout.ip_bound()).complete();
    let high = (Integer::from(1) << layout.addend_bits()) + &a_zeta;
    (a_zeta, high)
}

/// The addend b of Π2 ([ABMR20] §6.1 Round 2): uniform in [`pi2_addend_range`].
pub fn random_addend<R: RngCore + CryptoRng + ?Sized>(layout: &Layout, rng: &mut R) -> Integer {
    let (low, high) = pi2_addend_range(layout);
    random_below(&(high - &low), rng) + low
}

/// [ABMR20] §6.1 Round 4's check: IP′ = (X − b)/a, refused ([`MatchError::Cheating`]) unless a
/// divides X − b and |IP′| ≤ IP_max = ζ².
pub fn recover_inner_product(
    layout: &Layout,
    a: &Integer,
    b: &Integer,
    x: &Integer,
) -> Result<Integer, MatchError> {
    if *a < 1 {
        return Err(MatchError::Argument {
            argument: "a",
            reason: "the multiplier must be positive".into(),
        });
    }
    let shifted = (x - b).complete();
    let (quotient, remainder) = shifted.div_rem_euc_ref(a).complete();
    if remainder != 0 {
        return Err(MatchError::Cheating(
            "X − b is not a multiple of the terminal's multiplier a".into(),
        ));
    }
    if quotient.clone().abs() > *layout.ip_bound() {
        return Err(MatchError::Cheating(format!(
            "the implied inner product (X − b)/a is outside [−IP_max, IP_max] = ±{}",
            layout.ip_bound()
        )));
    }
    Ok(quotient)
}

/// Π2 Round 1, D → T ([ABMR20] §6.1 / Fig. 5 Round 1): (σ, epk, ⟦u_1*⟧ … ⟦u_t*⟧).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pi2Round1 {
    /// epk.
    pub public_key: PublicKey,
    /// ⟦u_1*⟧ … ⟦u_t*⟧ as packed and signed by SP.
    pub template: Vec<Ciphertext>,
    /// σ, SP's signature over [`template_signing_bytes`] (opaque here).
    pub signature: Vec<u8>,
}

impl Pi2Round1 {
    /// `version ‖ kind ‖ template fields ‖ len(σ) (u16) ‖ σ`.
    pub fn to_bytes(&self, params: &Params) -> Vec<u8> {
        let mut out = header(MessageKind::Pi2Template);
        put_template(&mut out, params, &self.public_key, &self.template);
        // At most MAX_SIGNATURE_BYTES (checked when the device is built).
        out.extend_from_slice(&(self.signature.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.signature);
        out
    }

    /// Strict decoding against the expected parameters.
    pub fn from_bytes(params: &Params, bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π2 round 1", bytes, MessageKind::Pi2Template)?;
        let (public_key, template) = read_template(&mut r, params)?;
        let len = usize::from(r.u16("signature length")?);
        if len > MAX_SIGNATURE_BYTES {
            return Err(r.error(format!(
                "signature of {len} bytes, at most {MAX_SIGNATURE_BYTES}"
            )));
        }
        let signature = r.take(len, "signature")?.to_vec();
        r.finish()?;
        Ok(Self {
            public_key,
            template,
            signature,
        })
    }

    /// The bytes σ must sign ([`template_signing_bytes`]).
    pub fn signed_bytes(&self, params: &Params) -> Vec<u8> {
        template_signing_bytes(params, &self.public_key, &self.template)
    }
}

/// Π2 Round 2, T → D ([ABMR20] §6.1): ⟦Mask(a·z + Encode2(b) + ρ̃)⟧.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pi2Round2 {
    /// The masked level-2 encoding of a·IP + b.
    pub ciphertext: Ciphertext,
}

impl Pi2Round2 {
    /// `version ‖ kind ‖ ciphertext`.
    pub fn to_bytes(&self, pk: &PublicKey) -> Vec<u8> {
        let mut out = header(MessageKind::Pi2Masked);
        out.extend_from_slice(&pk.ciphertext_to_bytes(&self.ciphertext));
        out
    }

    /// Strict decoding for the key `pk`.
    pub fn from_bytes(pk: &PublicKey, bytes: &[u8]) -> Result<Self, MatchError> {
        let mut r = Reader::new("Π2 round 2", bytes, MessageKind::Pi2Masked)?;
        let ciphertext = r.ciphertext(pk, "masked ciphertext")?;
        r.finish()?;
        Ok(Self { ciphertext })
    }
}

/// Π2 Round 3, D → T ([ABMR20] §6.1, D.1 "Round 3"): X.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pi2Round3 {
    /// X, the sum of the decoded slots (a·IP + b from an honest device).
    pub x: Integer,
}

/// The width of X's magnitude in a Π2 Round 3: the bytes of the largest X an honest device
/// sends (2^B + A·ζ², [`pi2_x_range`]). X = a·IP + b is written at this fixed width so that the
/// message has one length for every X: a minimal-length X would let the coordinator, which
/// relays the device's reply, see whether X fell below a byte boundary.
fn pi2_x_width(params: &Params) -> usize {
    pi2_x_range(params.layout())
        .1
        .significant_bits()
        .div_ceil(8) as usize
}

impl Pi2Round3 {
    /// `version ‖ kind ‖ sign ‖ |X|` (big-endian, zero-padded to the fixed width of
    /// [`pi2_x_width`] for `params`; an X beyond it, which no honest device sends, is written at
    /// its own length and refused by [`Self::from_bytes`]).
    pub fn to_bytes(&self, params: &Params) -> Vec<u8> {
        let mut out = header(MessageKind::Pi2Decoded);
        out.push(u8::from(self.x < 0));
        let magnitude = self.x.as_abs().to_digits::<u8>(rug::integer::Order::Msf);
        let width = pi2_x_width(params).max(magnitude.len());
        out.resize(out.len() + width - magnitude.len(), 0);
        out.extend(magnitude);
        out
    }

    /// Strict decoding: a sign byte (0 or 1, no negative zero) and |X| at the fixed width of
    /// [`pi2_x_width`] for `params`, or longer without a leading zero byte and at most as long
    /// as N (an X no honest device sends: it decodes, and the terminal's check names the
    /// cheat).
    pub fn from_bytes(params: &Params, bytes: &[u8]) -> Result<Self, MatchError> {
        /// Version, kind and sign.
        const BEFORE_MAGNITUDE: usize = 3;
        let mut r = Reader::new("Π2 round 3", bytes, MessageKind::Pi2Decoded)?;
        let sign = r.u8("X")?;
        let width = pi2_x_width(params);
        let len = bytes.len().saturating_sub(BEFORE_MAGNITUDE);
        let longest = params.modulus_bits().div_ceil(8) as usize;
        if len < width || len > width.max(longest) {
            return Err(r.error(format!(
                "X: {len} bytes, expected {width} (at most {longest})"
            )));
        }
        let magnitude = r.take(len, "X")?;
        if len > width && magnitude.first() == Some(&0) {
            return Err(r.error("X: leading zero byte beyond the fixed width"));
        }
        let x = Integer::from_digits(magnitude, rug::integer::Order::Msf);
        let x = match sign {
            0 => x,
            1 if x != 0 => -x,
            1 => return Err(r.error("X: negative zero")),
            other => return Err(r.error(format!("X: sign byte {other}"))),
        };
        r.finish()?;
        Ok(Self { x })
    }
}

/// Π2 Round 4, T → D ([ABMR20] §6.1 Round 4): the match bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pi2Round4 {
    /// [IP′ ≥ threshold].
    pub matched: bool,
}

impl Pi2Round4 {
    /// `version ‖ kind ‖ bit`.
    pub fn to_bytes(&self) -> Vec<u8> {
        encode_bit(MessageKind::Pi2Outcome, self.matched)
    }

    /// Strict decoding: one byte 0 or 1.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, MatchError> {
        let matched = decode_bit("Π2 round 4", MessageKind::Pi2Outcome, bytes)?;
        Ok(Self { matched })
    }
}

/// What the terminal outputs in Π2 ([ABMR20] §6.1 Round 4, and L_term = IP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminalOutcome {
    /// [IP ≥ threshold].
    pub matched: bool,
    /// IP = ⟨u, w⟩, the leakage to the terminal.
    pub inner_product: i64,
}

/// A device after the malicious-model enrolment ([ABMR20] §6.1; Π2 and Π3 share it): its
/// key, the parameters, SP's packed template and σ. Round 1 is the same message in both.
pub struct SignedDevice {
    params: Params,
    secret: SecretKey,
    template: Vec<Ciphertext>,
    signature: Vec<u8>,
}

impl std::fmt::Debug for SignedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is the device's secret.
        f.debug_struct("SignedDevice")
            .field("params", &self.params)
            .finish_non_exhaustive()
    }
}

impl SignedDevice {
    /// The device from SP's enrolment answer for `protocol` (Π2 or Π3): the packed template
    /// and σ, checked by [`check_device_parts`].
    pub fn new(
        params: Params,
        protocol: Protocol,
        secret: SecretKey,
        template: Vec<Ciphertext>,
        signature: Vec<u8>,
    ) -> Result<Self, MatchError> {
        check_device_parts(
            &params,
            protocol,
            secret.public_key(),
            &template,
            &signature,
        )?;
        Ok(Self {
            params,
            secret,
            template,
            signature,
        })
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The device's secret key.
    pub fn secret(&self) -> &SecretKey {
        &self.secret
    }

    /// The public key.
    pub fn public_key(&self) -> &PublicKey {
        self.secret.public_key()
    }

    /// Round 1 ([ABMR20] §6.1 Round 1, Fig. 5 Round 1): (σ, epk, ⟦u_1*⟧ … ⟦u_t*⟧), encoded.
    pub fn round1(&self) -> Vec<u8> {
        Pi2Round1 {
            public_key: self.secret.public_key().clone(),
            template: self.template.clone(),
            signature: self.signature.clone(),
        }
        .to_bytes(&self.params)
    }
}

/// The device D of Π2 after enrolment.
#[derive(Debug)]
pub struct Pi2Device {
    inner: SignedDevice,
}

impl Pi2Device {
    /// The device from SP's enrolment answer: the packed template and σ ([ABMR20] §6.1).
    pub fn new(
        params: Params,
        secret: SecretKey,
        template: Vec<Ciphertext>,
        signature: Vec<u8>,
    ) -> Result<Self, MatchError> {
        let inner = SignedDevice::new(params, Protocol::Pi2, secret, template, signature)?;
        Ok(Self { inner })
    }

    /// The public key.
    pub fn public_key(&self) -> &PublicKey {
        self.inner.public_key()
    }

    /// Round 1 ([ABMR20] §6.1 Round 1), encoded.
    pub fn round1(&self) -> Vec<u8> {
        self.inner.round1()
    }

    /// A matching session (Rounds 3 and 4 of one run).
    pub fn session(&self) -> Pi2DeviceSession<'_> {
        Pi2DeviceSession {
            device: self,
            state: DeviceState::AwaitingRound2,
        }
    }
}

#[derive(Debug)]
enum DeviceState {
    AwaitingRound2,
    AwaitingRound4,
    Done(bool),
}

/// One Π2 session on the device's side.
#[derive(Debug)]
pub struct Pi2DeviceSession<'a> {
    device: &'a Pi2Device,
    state: DeviceState,
}

impl Pi2DeviceSession<'_> {
    /// Round 3 ([ABMR20] §6.1 Round 3): decrypt, Decode2, X = Σ of the slots; encoded.
    pub fn round3(&mut self, round2: &[u8]) -> Result<Vec<u8>, MatchError> {
        if !matches!(self.state, DeviceState::AwaitingRound2) {
            return Err(MatchError::State("Π2 round 3 was already sent".into()));
        }
        let d = &self.device.inner;
        let msg = Pi2Round2::from_bytes(d.public_key(), round2)?;
        let x = decode_sum(d.secret(), d.params().layout(), &msg.ciphertext)?;
        // Nothing outside the honest range leaves the device (see `pi2_x_range`).
        let (low, high) = pi2_x_range(d.params().layout());
        if x < low || x >= high {
            return Err(MatchError::OutOfRange("X"));
        }
        self.state = DeviceState::AwaitingRound4;
        Ok(Pi2Round3 { x }.to_bytes(d.params()))
    }

    /// Round 3 on a Round 2 the pinned service provider signed for this device and session
    /// (`signed_round2`): the only Round 3 a device that talks through an untrusted relay makes.
    pub fn round3_signed(&mut self, round2: &VerifiedRound2) -> Result<Vec<u8>, MatchError> {
        if round2.fields().protocol != Protocol::Pi2 {
            return Err(MatchError::Unsigned("not a Π2 Round 2".into()));
        }
        self.round3(round2.payload())
    }

    /// Output ([ABMR20] §6.1 Round 4): the bit T sent.
    pub fn finish(&mut self, round4: &[u8]) -> Result<bool, MatchError> {
        if !matches!(self.state, DeviceState::AwaitingRound4) {
            return Err(MatchError::State(
                "Π2 round 4 arrives only after round 3".into(),
            ));
        }
        let matched = Pi2Round4::from_bytes(round4)?.matched;
        self.state = DeviceState::Done(matched);
        Ok(matched)
    }

    /// The output once the session is over.
    pub fn outcome(&self) -> Option<bool> {
        match self.state {
            DeviceState::Done(b) => Some(b),
            _ => None,
        }
    }
}

enum TerminalState {
    AwaitingRound1,
    AwaitingRound3 { a: Integer, b: Integer },
    Done(TerminalOutcome),
    Failed,
}

impl std::fmt::Debug for TerminalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // a and b are the terminal's secrets.
        match self {
            TerminalState::AwaitingRound1 => f.write_str("AwaitingRound1"),
            TerminalState::AwaitingRound3 { .. } => f.write_str("AwaitingRound3(<secret a, b>)"),
            TerminalState::Done(o) => write!(f, "Done({o:?})"),
            TerminalState::Failed => f.write_str("Failed"),
        }
    }
}

/// The terminal T of Π2 for one session: its measurement w, its threshold, and (after Round
/// 2) its secret a and b. `Debug` shows the parameters and the stage only.
pub struct Pi2Terminal {
    params: Params,
    /// Used by Round 2 only; empty in a resumed terminal.
    w: Vec<i32>,
    threshold: i64,
    state: TerminalState,
    /// The offline tables of the device's template (see [`super::precomputed`]), if any.
    precomputed: Option<Arc<PrecomputedTemplate>>,
}

impl std::fmt::Debug for Pi2Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // w and the threshold are the terminal's secrets, as are a and b.
        f.debug_struct("Pi2Terminal")
            .field("params", &self.params)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Pi2Terminal {
    /// A session with measurement `w` (checked: length ℓ, m-bit elements, ‖w‖² ≤ ζ²) and
    /// `threshold` (|threshold| ≤ ζ²).
    pub fn new(params: Params, w: Vec<i32>, threshold: i64) -> Result<Self, MatchError> {
        check_session_params(&params, Protocol::Pi2, threshold)?;
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

    /// Round 2 ([ABMR20] §6.1 Round 2) with a fresh r^N computed now. `verify(message,
    /// signature)` is SP's signature check over [`template_signing_bytes`].
    pub fn round2<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        round1: &[u8],
        verify: &dyn Fn(&[u8], &[u8]) -> bool,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        let msg = self.check_round1(round1, verify)?;
        let r_to_n = msg.public_key.random_nonce_power(rng);
        self.respond(msg, &r_to_n, rng)
    }

    /// Round 2 with an r^N precomputed offline for the device's key (fresh, of this key).
    pub fn round2_with_nonce_power<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        round1: &[u8],
        verify: &dyn Fn(&[u8], &[u8]) -> bool,
        r_to_n: &Integer,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        let msg = self.check_round1(round1, verify)?;
        self.respond(msg, r_to_n, rng)
    }

    /// Step (1): decode and verify σ (⊥ if it does not verify).
    fn check_round1(
        &self,
        round1: &[u8],
        verify: &dyn Fn(&[u8], &[u8]) -> bool,
    ) -> Result<Pi2Round1, MatchError> {
        if !matches!(self.state, TerminalState::AwaitingRound1) {
            return Err(MatchError::State("Π2 round 2 was already sent".into()));
        }
        let msg = Pi2Round1::from_bytes(&self.params, round1)?;
        if !verify(&msg.signed_bytes(&self.params), &msg.signature) {
            return Err(MatchError::Signature);
        }
        Ok(msg)
    }

    fn respond<R: RngCore + CryptoRng + ?Sized>(
        &mut self,
        msg: Pi2Round1,
        r_to_n: &Integer,
        rng: &mut R,
    ) -> Result<Vec<u8>, MatchError> {
        let layout = self.params.layout();
        let a = random_prime_multiplier(layout, rng)?;
        let b = random_addend(layout, rng);
        let (pk, tables) = (&msg.public_key, self.precomputed.as_deref());
        let product = inner_product_with(tables, pk, layout, &msg.template, &self.w)?;
        let ciphertext = mask_affine_product(pk, layout, &product, &a, &b, r_to_n, rng)?;
        self.state = TerminalState::AwaitingRound3 { a, b };
        Ok(Pi2Round2 { ciphertext }.to_bytes(&msg.public_key))
    }

    /// Round 4 ([ABMR20] §6.1 Round 4): checks X ([`recover_inner_product`]; a cheating
    /// device gets [`MatchError::Cheating`] and the session fails), compares IP′ with the
    /// threshold; returns the encoded bit for D and T's outcome.
    pub fn round4(&mut self, round3: &[u8]) -> Result<(Vec<u8>, TerminalOutcome), MatchError> {
        let (a, b) = match &self.state {
            TerminalState::AwaitingRound3 { a, b } => (a.clone(), b.clone()),
            _ => {
                return Err(MatchError::State(
                    "Π2 round 3 arrives only after round 2, once".into(),
                ))
            }
        };
        let result = Pi2Round3::from_bytes(&self.params, round3).and_then(|msg| {
            let ip = recover_inner_product(self.params.layout(), &a, &b, &msg.x)?;
            to_i64("inner product", &ip)
        });
        match result {
            Ok(inner_product) => {
                let outcome = TerminalOutcome {
                    matched: inner_product >= self.threshold,
                    inner_product,
                };
                self.state = TerminalState::Done(outcome);
                Ok((
                    Pi2Round4 {
                        matched: outcome.matched,
                    }
                    .to_bytes(),
                    outcome,
                ))
            }
            Err(e) => {
                self.state = TerminalState::Failed;
                Err(e)
            }
        }
    }

    /// The output once the session is over (None while running or after a failure).
    pub fn outcome(&self) -> Option<TerminalOutcome> {
        match self.state {
            TerminalState::Done(o) => Some(o),
            _ => None,
        }
    }

    /// The terminal's state between its Round 2 and Round 4 ([ABMR20] §6.1: the threshold and
    /// the secrets a, b; w is no longer needed), for a terminal that does not stay in memory
    /// between the rounds (the service provider keeps it in a table): `version ‖ kind ‖
    /// threshold ‖ a ‖ b` (signed integers as in the messages) ‖ a 16-byte check value over the
    /// parameters and those bytes. As secret as a and b; zeroized on drop. Only after Round 2
    /// ([`MatchError::State`] otherwise). The record's parameters and key are not in it: they
    /// are given again to [`Self::resume`].
    pub fn suspend(&self) -> Result<zeroize::Zeroizing<Vec<u8>>, MatchError> {
        let TerminalState::AwaitingRound3 { a, b } = &self.state else {
            return Err(MatchError::State(
                "a Π2 terminal is suspended between round 2 and round 4 only".into(),
            ));
        };
        let mut out = begin_state(MessageKind::Pi2TerminalState);
        put_signed(&mut out, &Integer::from(self.threshold));
        put_signed(&mut out, a);
        put_signed(&mut out, b);
        Ok(end_state(&self.params, out))
    }

    /// The terminal awaiting Round 3 again from [`Self::suspend`]'s bytes, for the same
    /// `params` (the check value binds them). Strict: a wrong kind, version, length or check
    /// value, a threshold outside ±ζ², an a that is not a κ-bit prime or a b outside
    /// [`pi2_addend_range`] is a [`MatchError::Wire`] naming the field (never the value).
    pub fn resume(params: Params, state: &[u8]) -> Result<Self, MatchError> {
        const WHAT: &str = "Π2 terminal state";
        let mut r = state_reader(WHAT, &params, state, MessageKind::Pi2TerminalState)?;
        let layout = params.layout();
        let threshold = to_i64("threshold", &r.signed(8, "threshold")?)?;
        check_session_params(&params, Protocol::Pi2, threshold)?;
        let one = Integer::from(1);
        let kappa = layout.multiplier_bits();
        let a = r.bounded(
            &(&one << (kappa - 1)).complete(),
            &(&one << kappa).complete(),
            "a",
        )?;
        if a.is_probably_prime(PRIME_TEST_REPS) == IsPrime::No {
            return Err(r.error("a is not prime"));
        }
        let (b_low, b_high) = pi2_addend_range(layout);
        let b = r.bounded(&b_low, &b_high, "b")?;
        r.finish()?;
        Ok(Self {
            params,
            w: Vec::new(),
            threshold,
            state: TerminalState::AwaitingRound3 { a, b },
            precomputed: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::cipher::test_support::{key_2048, small_key};
    use super::super::messages::test_support::{clone_key, dot, random_vector};
    use super::super::params::DEFAULT_STAT_BITS;
    use super::*;
    use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn params(dim: usize, m: u32, bits: u32, norm: Integer) -> Params {
        Params::new_allowing_test_modulus(Protocol::Pi2, dim, m, bits, DEFAULT_STAT_BITS, norm)
            .unwrap()
    }

    /// The service provider of the tests: an Ed25519 key.
    struct Sp(SigningKey);

    impl Sp {
        fn new() -> Self {
            Sp(SigningKey::from_bytes(&[7u8; 32]))
        }

        /// The enrolment: pack D's element ciphertexts and sign.
        fn enrol(
            &self,
            params: &Params,
            pk: &PublicKey,
            elements: &[Ciphertext],
        ) -> (Vec<Ciphertext>, Vec<u8>) {
            let packed = pack_element_ciphertexts(pk, params, elements).unwrap();
            let sig = self.0.sign(&template_signing_bytes(params, pk, &packed));
            (packed, sig.to_bytes().to_vec())
        }

        fn verifier(&self) -> impl Fn(&[u8], &[u8]) -> bool {
            let vk: VerifyingKey = self.0.verifying_key();
            move |msg: &[u8], sig: &[u8]| {
                Signature::from_slice(sig)
                    .map(|s| vk.verify(msg, &s).is_ok())
                    .unwrap_or(false)
            }
        }
    }

    fn enrol_device(
        params: &Params,
        sk: &SecretKey,
        u: &[i32],
        sp: &Sp,
        rng: &mut ChaCha20Rng,
    ) -> Pi2Device {
        let elements = encrypt_elements(sk, params, u, rng).unwrap();
        let (packed, sig) = sp.enrol(params, sk.public_key(), &elements);
        Pi2Device::new(params.clone(), clone_key(sk), packed, sig).unwrap()
    }

    fn run(
        device: &Pi2Device,
        params: &Params,
        w: &[i32],
        threshold: i64,
        sp: &Sp,
        rng: &mut ChaCha20Rng,
    ) -> (TerminalOutcome, bool) {
        let mut terminal = Pi2Terminal::new(params.clone(), w.to_vec(), threshold).unwrap();
        let verify = sp.verifier();
        let r2 = terminal.round2(&device.round1(), &verify, rng).unwrap();
        let mut session = device.session();
        let r3 = session.round3(&r2).unwrap();
        let (r4, outcome) = terminal.round4(&r3).unwrap();
        let d = session.finish(&r4).unwrap();
        assert_eq!(terminal.outcome(), Some(outcome));
        assert_eq!(session.outcome(), Some(d));
        (outcome, d)
    }

    #[test]
    fn packing_by_the_service_provider_equals_encode1() {
        let sk = small_key();
        let pk = sk.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(200);
        let p = params(11, 16, 1024, Params::max_norm_bound(11, 16));
        let u = random_vector(11, 16, &mut rng);
        let elements = encrypt_elements(sk, &p, &u, &mut rng).unwrap();
        let packed = pack_element_ciphertexts(pk, &p, &elements).unwrap();
        let expected = super::super::encoding::encode_template(p.layout(), "u", &u).unwrap();
        assert_eq!(packed.len(), expected.len());
        for (c, e) in packed.iter().zip(&expected) {
            assert_eq!(sk.decrypt_signed(c), *e);
        }
        assert!(pack_element_ciphertexts(pk, &p, &elements[1..]).is_err());
        assert!(pack_element_ciphertexts(key_2048().public_key(), &p, &elements).is_err());
        // An element above N² of this key (a ciphertext of a larger key) is refused before
        // any product.
        let big = key_2048().public_key();
        let mut tampered = elements.clone();
        tampered[3] = big
            .ciphertext_from_integer(pk.n_squared().clone() + 1u32)
            .unwrap();
        let err = pack_element_ciphertexts(pk, &p, &tampered).unwrap_err();
        assert!(err.to_string().contains("not below N²"), "{err}");
    }

    /// With the terminal's offline tables of the packed template: T's IP and both outputs
    /// equal the plaintext comparison at IP − 1, IP, IP + 1.
    #[test]
    fn sessions_with_offline_tables_equal_the_plaintext_comparison() {
        let mut rng = ChaCha20Rng::seed_from_u64(202);
        let sp = Sp::new();
        let (dim, m) = (20, 16);
        let p = params(dim, m, 1024, Params::max_norm_bound(dim, m));
        let sk = small_key();
        let verify = sp.verifier();
        for i in 0..12 {
            let u = random_vector(dim, m, &mut rng);
            let elements = encrypt_elements(sk, &p, &u, &mut rng).unwrap();
            let (packed, sig) = sp.enrol(&p, sk.public_key(), &elements);
            let tables =
                Arc::new(PrecomputedTemplate::new(sk.public_key(), p.layout(), &packed).unwrap());
            let device = Pi2Device::new(p.clone(), clone_key(sk), packed, sig).unwrap();
            let w = random_vector(dim, m, &mut rng);
            let ip = dot(&u, &w);
            let threshold = ip - 1 + (i % 3);
            let mut terminal = Pi2Terminal::new(p.clone(), w, threshold)
                .unwrap()
                .with_precomputed(tables);
            let r2 = terminal
                .round2(&device.round1(), &verify, &mut rng)
                .unwrap();
            let mut session = device.session();
            let r3 = session.round3(&r2).unwrap();
            let (r4, outcome) = terminal.round4(&r3).unwrap();
            assert_eq!(outcome.inner_product, ip);
            assert_eq!(outcome.matched, ip >= threshold);
            assert_eq!(session.finish(&r4).unwrap(), outcome.matched);
        }
    }

    /// Thousands of random pairs at 1024 bits (small ℓ): the terminal's and the device's
    /// outputs equal the plaintext comparison, including IP = T and T ± 1.
    #[test]
    fn outputs_equal_the_plaintext_comparison_on_many_pairs() {
        let mut rng = ChaCha20Rng::seed_from_u64(201);
        let sp = Sp::new();
        let dim = 6;
        let m = 8;
        let p = params(dim, m, 1024, Params::max_norm_bound(dim, m));
        let bound = p.norm_bound().to_i64().unwrap();
        let sk = small_key();
        let mut matches = 0;
        let mut pairs = 0;
        for _ in 0..300 {
            let u = random_vector(dim, m, &mut rng);
            let device = enrol_device(&p, sk, &u, &sp, &mut rng);
            for i in 0..5 {
                let w = random_vector(dim, m, &mut rng);
                let ip = dot(&u, &w);
                let threshold = match i {
                    0 => ip - 1,
                    1 => ip,
                    2 => ip + 1,
                    _ => (rng.next_u64() % (2 * bound as u64)) as i64 - bound,
                }
                .clamp(-bound, bound);
                let (t, d) = run(&device, &p, &w, threshold, &sp, &mut rng);
                assert_eq!(t.inner_product, ip);
                assert_eq!(t.matched, ip >= threshold);
                assert_eq!(d, t.matched);
                matches += usize::from(d);
                pairs += 1;
            }
        }
        assert!(matches > pairs / 4 && matches < pairs);
    }

    #[test]
    fn realistic_shape_at_2048_bits() {
        let mut rng = ChaCha20Rng::seed_from_u64(202);
        let sp = Sp::new();
        let p = params(256, 16, 2048, Params::max_norm_bound(256, 16));
        let u = random_vector(256, 16, &mut rng);
        let device = enrol_device(&p, key_2048(), &u, &sp, &mut rng);
        for delta in [-1i64, 0, 1] {
            let w = random_vector(256, 16, &mut rng);
            let ip = dot(&u, &w);
            let (t, d) = run(&device, &p, &w, ip + delta, &sp, &mut rng);
            assert_eq!(t.inner_product, ip);
            assert_eq!(d, delta <= 0);
        }
        // Extreme values with a tight norm bound.
        let p = params(8, 24, 2048, Integer::from(1u64 << 46));
        let mut u = vec![0i32; 8];
        u[5] = -(1 << 23);
        let device = enrol_device(&p, key_2048(), &u, &sp, &mut rng);
        let (t, d) = run(&device, &p, &u, 1 << 46, &sp, &mut rng);
        assert_eq!(t.inner_product, 1 << 46);
        assert!(d);
        let mut w = u.clone();
        w[5] = (1 << 23) - 1;
        let (t, d) = run(&device, &p, &w, -(1 << 46), &sp, &mut rng);
        assert_eq!(t.inner_product, -(1i64 << 23) * ((1 << 23) - 1));
        assert!(d);
    }

    /// Suspended after Round 2 and resumed from its bytes, the terminal answers exactly as
    /// the one that stayed in memory (same randomness: same Round 2, same Round 4, same
    /// outcome), on random pairs including IP = T and T ± 1, and refuses the same cheats.
    #[test]
    fn a_suspended_terminal_gives_the_in_memory_outcome() {
        let mut rng = ChaCha20Rng::seed_from_u64(207);
        let sp = Sp::new();
        let verify = sp.verifier();
        for (dim, m) in [(6usize, 8u32), (9, 12)] {
            let p = params(dim, m, 1024, Params::max_norm_bound(dim, m));
            let bound = p.norm_bound().to_i64().unwrap();
            for _ in 0..4 {
                let u = random_vector(dim, m, &mut rng);
                let device = enrol_device(&p, small_key(), &u, &sp, &mut rng);
                let r1 = device.round1();
                for _ in 0..4 {
                    let w = random_vector(dim, m, &mut rng);
                    let ip = dot(&u, &w);
                    let random_t = (rng.next_u64() % (2 * bound as u64 + 1)) as i64 - bound;
                    for threshold in [ip, ip - 1, ip + 1, random_t] {
                        if threshold.abs() > bound {
                            continue;
                        }
                        let seed = rng.next_u64();
                        let mut kept = Pi2Terminal::new(p.clone(), w.clone(), threshold).unwrap();
                        let mut paused = Pi2Terminal::new(p.clone(), w.clone(), threshold).unwrap();
                        let r2 = kept
                            .round2(&r1, &verify, &mut ChaCha20Rng::seed_from_u64(seed))
                            .unwrap();
                        let r2_paused = paused
                            .round2(&r1, &verify, &mut ChaCha20Rng::seed_from_u64(seed))
                            .unwrap();
                        assert_eq!(r2, r2_paused);
                        let state = paused.suspend().unwrap();
                        drop(paused);
                        let mut resumed = Pi2Terminal::resume(p.clone(), &state).unwrap();
                        assert!(resumed.suspend().unwrap() == state, "suspends the same");
                        let mut session = device.session();
                        let r3 = session.round3(&r2).unwrap();
                        let (r4, outcome) = kept.round4(&r3).unwrap();
                        let (r4_resumed, outcome_resumed) = resumed.round4(&r3).unwrap();
                        assert_eq!(r4, r4_resumed);
                        assert_eq!(outcome, outcome_resumed);
                        assert_eq!(outcome.inner_product, ip);
                        assert_eq!(outcome.matched, ip >= threshold, "IP {ip}, T {threshold}");
                        assert_eq!(session.finish(&r4).unwrap(), ip >= threshold);
                        // A shifted X: both refuse it.
                        let x = Pi2Round3::from_bytes(&p, &r3).unwrap().x;
                        let shifted = Pi2Round3 { x: x + 1u32 }.to_bytes(&p);
                        let mut again = Pi2Terminal::resume(p.clone(), &state).unwrap();
                        assert!(matches!(
                            again.round4(&shifted),
                            Err(MatchError::Cheating(_))
                        ));
                    }
                }
            }
        }
    }

    /// The suspended state decodes strictly: every truncation, an extension, every single-bit
    /// change, other parameters, out-of-range values with a valid check value, and a suspend
    /// at the wrong stage are clean errors; Debug shows no secret.
    #[test]
    fn a_suspended_state_is_strict_and_secret() {
        let mut rng = ChaCha20Rng::seed_from_u64(208);
        let sp = Sp::new();
        let p = params(8, 8, 1024, Params::max_norm_bound(8, 8));
        let u = random_vector(8, 8, &mut rng);
        let device = enrol_device(&p, small_key(), &u, &sp, &mut rng);
        let threshold = 1234;
        let mut t = Pi2Terminal::new(p.clone(), u.clone(), threshold).unwrap();
        assert!(matches!(t.suspend(), Err(MatchError::State(_))));
        let r2 = t
            .round2(&device.round1(), &sp.verifier(), &mut rng)
            .unwrap();
        let state = t.suspend().unwrap();
        let (a, b) = match &t.state {
            TerminalState::AwaitingRound3 { a, b } => (a.clone(), b.clone()),
            _ => unreachable!(),
        };
        let shown = format!("{t:?}");
        for secret in [
            a.to_string(),
            b.to_string(),
            threshold.to_string(),
            format!("{u:?}"),
        ] {
            assert!(!shown.contains(&secret), "{shown}");
        }
        assert!(Pi2Terminal::resume(p.clone(), &state).is_ok());
        for len in 0..state.len() {
            let e = Pi2Terminal::resume(p.clone(), &state[..len]).unwrap_err();
            assert!(matches!(e, MatchError::Wire { .. }), "{len}: {e}");
        }
        let mut longer = state.to_vec();
        longer.push(0);
        assert!(Pi2Terminal::resume(p.clone(), &longer).is_err());
        for bit in 0..state.len() * 8 {
            let mut b = state.to_vec();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(Pi2Terminal::resume(p.clone(), &b).is_err(), "bit {bit}");
        }
        let other = params(8, 8, 1024, Params::max_norm_bound(8, 8) - 1u32);
        assert!(Pi2Terminal::resume(other, &state).is_err());
        let pi3 = Params::new_allowing_test_modulus(
            Protocol::Pi3,
            8,
            8,
            1024,
            40,
            Params::max_norm_bound(8, 8),
        )
        .unwrap();
        assert!(Pi2Terminal::resume(pi3, &state).is_err());
        // Well-formed states with values the terminal never draws.
        let forge = |threshold: i64, a: &Integer, b: &Integer| {
            let mut out = begin_state(MessageKind::Pi2TerminalState);
            put_signed(&mut out, &Integer::from(threshold));
            put_signed(&mut out, a);
            put_signed(&mut out, b);
            end_state(&p, out)
        };
        assert!(Pi2Terminal::resume(p.clone(), &forge(threshold, &a, &b)).is_ok());
        let top = Integer::from(1) << p.layout().addend_bits();
        let composite = a.clone() + 1u32;
        for (t, a2, b2) in [
            (threshold, &composite, &b),
            (threshold, &Integer::from(3), &b),
            (threshold, &a, &top),
            (threshold, &a, &Integer::from(-1)),
            (i64::MAX, &a, &b),
        ] {
            assert!(Pi2Terminal::resume(p.clone(), &forge(t, a2, b2)).is_err());
        }
        // After round 4 there is nothing to suspend.
        let mut resumed = Pi2Terminal::resume(p.clone(), &state).unwrap();
        let r3 = device.session().round3(&r2).unwrap();
        let (_, outcome) = resumed.round4(&r3).unwrap();
        assert_eq!(outcome.inner_product, dot(&u, &u));
        assert!(matches!(resumed.suspend(), Err(MatchError::State(_))));
    }

    /// A cheating device's X as a function of the honest X and the terminal's a.
    type Cheat<'a> = Box<dyn Fn(&Integer, &Integer) -> Integer + 'a>;

    /// A device that shifts X is caught unless it shifts by a multiple of the secret a that
    /// keeps IP′ in range (which needs a).
    #[test]
    fn a_cheating_device_is_caught() {
        let mut rng = ChaCha20Rng::seed_from_u64(203);
        let sp = Sp::new();
        let p = params(16, 8, 1024, Params::max_norm_bound(16, 8));
        let ip_max = p.norm_bound().clone();
        let u = random_vector(16, 8, &mut rng);
        let device = enrol_device(&p, small_key(), &u, &sp, &mut rng);
        let verify = sp.verifier();
        let w = random_vector(16, 8, &mut rng);
        let ip = dot(&u, &w);
        // Returns (honest X, a, the terminal awaiting round 3).
        let setup = |rng: &mut ChaCha20Rng| {
            let mut t = Pi2Terminal::new(p.clone(), w.clone(), 0).unwrap();
            let r2 = t.round2(&device.round1(), &verify, rng).unwrap();
            let r3 = device.session().round3(&r2).unwrap();
            let x = Pi2Round3::from_bytes(&p, &r3).unwrap().x;
            let a = match &t.state {
                TerminalState::AwaitingRound3 { a, .. } => a.clone(),
                _ => unreachable!(),
            };
            (x, a, t)
        };
        let send = |t: &mut Pi2Terminal, x: Integer| t.round4(&Pi2Round3 { x }.to_bytes(&p));
        let wide = (ip_max.clone() * 2u32) + 1u32;
        let cheats: Vec<Cheat<'_>> = vec![
            Box::new(|x, _| x.clone() + 1u32),
            Box::new(|x, _| x.clone() - 1u32),
            Box::new(|x, a| x.clone() + a.clone() * &wide),
            Box::new(|x, a| x.clone() - a.clone() * &wide),
            Box::new(|x, a| x.clone() + a.clone() * (ip_max.clone() + 1u32) * 2u32),
            Box::new(|x, a| x.clone() + (a.clone() >> 1u32)),
            Box::new(|x, _| -x.clone()),
            Box::new(|_, _| Integer::new()),
            Box::new(|x, _| x.clone() << 100u32),
        ];
        for (i, cheat) in cheats.iter().enumerate() {
            let (x, a, mut t) = setup(&mut rng);
            let e = send(&mut t, cheat(&x, &a)).unwrap_err();
            assert!(matches!(e, MatchError::Cheating(_)), "cheat {i}: {e}");
            assert!(e.to_string().contains("cheated"), "{e}");
            assert!(t.outcome().is_none());
            assert!(send(&mut t, x).is_err(), "the session failed for good");
        }
        // Random shifts without knowing a: all refused.
        for _ in 0..50 {
            let (x, _, mut t) = setup(&mut rng);
            let shift = Integer::from(rng.next_u64()) * Integer::from(rng.next_u64() | 1);
            assert!(matches!(
                send(&mut t, x + shift),
                Err(MatchError::Cheating(_))
            ));
        }
        // With a (which the device never sees), X − a passes as IP − 1: this is why a is secret.
        let (x, a, mut t) = setup(&mut rng);
        let (_, outcome) = send(&mut t, x - a).unwrap();
        assert_eq!(outcome.inner_product, ip - 1);
        // The honest X passes.
        let (x, _, mut t) = setup(&mut rng);
        assert_eq!(send(&mut t, x).unwrap().1.inner_product, ip);
    }

    #[test]
    fn tampered_and_out_of_order_messages_are_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(204);
        let sp = Sp::new();
        let p = params(12, 8, 1024, Params::max_norm_bound(12, 8));
        let u = random_vector(12, 8, &mut rng);
        let w = random_vector(12, 8, &mut rng);
        let device = enrol_device(&p, small_key(), &u, &sp, &mut rng);
        let pk = device.public_key().clone();
        let verify = sp.verifier();
        let r1 = device.round1();
        let fresh = || Pi2Terminal::new(p.clone(), w.clone(), 0).unwrap();
        // A forged signature, a swapped ciphertext, another SP.
        let mut t = fresh();
        let mut forged = r1.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        assert!(matches!(
            t.round2(&forged, &verify, &mut rng),
            Err(MatchError::Signature)
        ));
        let mut msg = Pi2Round1::from_bytes(&p, &r1).unwrap();
        msg.template.swap(0, 1);
        assert!(matches!(
            t.round2(&msg.to_bytes(&p), &verify, &mut rng),
            Err(MatchError::Signature)
        ));
        let other_sp = Sp(SigningKey::from_bytes(&[8u8; 32]));
        assert!(matches!(
            t.round2(&r1, &other_sp.verifier(), &mut rng),
            Err(MatchError::Signature)
        ));
        // The signature binds the parameters: a terminal with other parameters refuses even
        // before the signature.
        let other = params(12, 8, 1024, Params::max_norm_bound(12, 8) - 1u32);
        let mut t_other = Pi2Terminal::new(other, w.clone(), 0).unwrap();
        assert!(t_other.round2(&r1, &verify, &mut rng).is_err());
        // Structure: truncated, trailing, kind, oversized signature length.
        assert!(t.round2(&r1[..r1.len() - 1], &verify, &mut rng).is_err());
        let mut longer = r1.clone();
        longer.push(0);
        assert!(t.round2(&longer, &verify, &mut rng).is_err());
        let mut kind = r1.clone();
        kind[1] = MessageKind::Pi1Template as u8;
        assert!(t.round2(&kind, &verify, &mut rng).is_err());
        let mut huge = Pi2Round1::from_bytes(&p, &r1).unwrap();
        huge.signature = vec![0; MAX_SIGNATURE_BYTES + 1];
        assert!(t.round2(&huge.to_bytes(&p), &verify, &mut rng).is_err());
        // Round 4 before round 2.
        assert!(t
            .round4(&Pi2Round3 { x: Integer::new() }.to_bytes(&p))
            .is_err());
        // Honest round 2 after the refusals.
        let r2 = t.round2(&r1, &verify, &mut rng).unwrap();
        assert!(t.round2(&r1, &verify, &mut rng).is_err(), "once");
        let mut session = device.session();
        assert!(session
            .finish(&Pi2Round4 { matched: true }.to_bytes())
            .is_err());
        assert!(session.round3(&r2[..r2.len() - 1]).is_err());
        let mut zero = r2.clone();
        for b in &mut zero[2..] {
            *b = 0;
        }
        assert!(session.round3(&zero).is_err());
        let junk = pk.encrypt(&(pk.n().clone() >> 1u32), &mut rng).unwrap();
        assert!(session
            .round3(&Pi2Round2 { ciphertext: junk }.to_bytes(&pk))
            .is_err());
        let r3 = session.round3(&r2).unwrap();
        assert!(session.round3(&r2).is_err(), "once");
        // Round 3 at the terminal: malformed X.
        let mut bad_sign = r3.clone();
        bad_sign[2] = 7;
        let mut t2 = fresh();
        let r2b = t2.round2(&r1, &verify, &mut rng).unwrap();
        assert!(t2.round4(&bad_sign).is_err());
        assert!(t2.round4(&r3).is_err(), "a failed session stays failed");
        let mut s2 = device.session();
        let _ = s2.round3(&r2b).unwrap();
        // Round 4 at the device: not a bit.
        let (r4, _) = t.round4(&r3).unwrap();
        let mut not_bit = r4.clone();
        not_bit[2] = 3;
        assert!(session.finish(&not_bit).is_err());
        assert_eq!(session.finish(&r4).unwrap(), dot(&u, &w) >= 0);
    }

    #[test]
    fn inputs_are_checked() {
        let mut rng = ChaCha20Rng::seed_from_u64(205);
        let p = params(4, 8, 1024, Integer::from(500));
        assert!(Pi2Terminal::new(p.clone(), vec![1, 2, 3], 0).is_err());
        assert!(Pi2Terminal::new(p.clone(), vec![30, 0, 0, 0], 0).is_err());
        let e = Pi2Terminal::new(p.clone(), vec![1, 1, 1, 1], -501).unwrap_err();
        assert!(e.to_string().contains("threshold"), "{e}");
        assert!(encrypt_elements(small_key(), &p, &[-129, 0, 0, 0], &mut rng).is_err());
        assert!(encrypt_elements(key_2048(), &p, &[1, 0, 0, 0], &mut rng).is_err());
        assert!(Pi2Device::new(p.clone(), clone_key(small_key()), vec![], vec![]).is_err());
        let pi1 =
            Params::new_allowing_test_modulus(Protocol::Pi1, 4, 8, 1024, 40, Integer::from(500))
                .unwrap();
        assert!(Pi2Terminal::new(pi1.clone(), vec![1, 1, 1, 1], 0).is_err());
        assert!(random_prime_multiplier(pi1.layout(), &mut rng).is_err());
        let a = random_prime_multiplier(p.layout(), &mut rng).unwrap();
        assert_eq!(a.significant_bits(), p.layout().multiplier_bits());
        assert_ne!(a.is_probably_prime(30), IsPrime::No);
    }
}
