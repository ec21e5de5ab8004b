//! # Modular exponentiation in radix 2^52 on AVX-512 IFMA
//!
//! Paillier's work is exponentiation modulo N² (6,144 bits at the default |N| = 3072) and, at
//! the key owner, modulo p, p² and q, q². GMP's `mpz_powm` multiplies 64-bit limbs one product
//! at a time; AVX-512 IFMA (`VPMADD52LUQ` / `VPMADD52HUQ`) computes eight 52 × 52-bit products
//! per instruction, which is what this module uses where the CPU has it:
//!
//! * **Almost Montgomery multiplication** (AMM) in radix 2^52, word by word as in Gueron and
//!   Krasnov, "Accelerating Big Integer Arithmetic Using Intel IFMA Extensions", ARITH 2016
//!   (DOI 10.1109/ARITH.2016.22), after Montgomery, "Modular Multiplication Without Trial
//!   Division", Math. Comp. 44 (1985) (DOI 10.1090/S0025-5718-1985-0777282-X). With R = 2^(52n)
//!   and 4M < R, inputs below 2M give an output below 2M, so no conditional subtraction (and
//!   no branch on data) is needed between products. The accumulator keeps 64-bit lanes with
//!   unnormalised digits (each iteration adds at most four 52-bit halves to a lane, so n < 2^9
//!   iterations cannot overflow), shifts down one digit per iteration, and normalises once at
//!   the end.
//! * **Fixed-window exponentiation**: [`Montgomery52::pow_public`] for public exponents (r^N
//!   with the public N, the homomorphic scalar products; windows of zeros skipped), and
//!   [`Montgomery52::pow_secret`] for exponents that depend on p and q: a number of windows
//!   fixed by a public bound, a product with every window (zero too), and each table entry
//!   selected by reading the whole table under masks, so neither the instruction stream nor
//!   the memory addresses depend on the exponent.
//!
//! [`pow_mod`] and [`secure_pow_mod`] pick this path on CPUs with `avx512f` and `avx512ifma`
//! and GMP's `mpz_powm` / `mpz_powm_sec` elsewhere; both give the same integer. The scalar
//! [`amm_portable`] follows the vector code lane for lane, so the algorithm is tested on every
//! machine and the vector code against it where the CPU allows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rug::integer::Order;
use rug::{Complete, Integer};

/// Bits per digit: IFMA multiplies the low 52 bits of each 64-bit lane.
const DIGIT_BITS: u32 = 52;
const DIGIT_MASK: u64 = (1 << DIGIT_BITS) - 1;
/// 64-bit lanes per AVX-512 vector.
const LANES: usize = 8;
/// The largest modulus handled, in vectors of digits (16 × 8 × 52 = 6,656 bits, above the
/// 6,144 of N² at |N| = 3072).
const MAX_VECTORS: usize = 16;

/// The environment variable by which the programs (the CLI, the extension) turn the IFMA path
/// off (`PRIVMATCH_IFMA=off`): GMP then does every exponentiation, e.g. to compare the two in
/// one benchmark or to rule this code out. The core reads no environment: a program reads it
/// at its start ([`ifma_switch_says_off`]) and calls [`switch_ifma_off`].
pub const IFMA_SWITCH: &str = "PRIVMATCH_IFMA";

static IFMA_SWITCHED_OFF: AtomicBool = AtomicBool::new(false);

/// Whether `value`, the value of [`IFMA_SWITCH`], asks for the IFMA path to be off.
pub fn ifma_switch_says_off(value: &str) -> bool {
    value.eq_ignore_ascii_case("off")
}

/// Turns the IFMA path off for this process: every later exponentiation takes GMP's.
pub fn switch_ifma_off() {
    IFMA_SWITCHED_OFF.store(true, Ordering::Relaxed);
}

/// Whether exponentiations take the IFMA path: the CPU has `avx512f` and `avx512ifma` (detected
/// once per process) and the program did not switch it off ([`switch_ifma_off`]).
pub fn ifma_available() -> bool {
    static CPU: OnceLock<bool> = OnceLock::new();
    *CPU.get_or_init(cpu_has_ifma) && !IFMA_SWITCHED_OFF.load(Ordering::Relaxed)
}

/// Whether the CPU has the instructions of the IFMA path.
pub fn cpu_has_ifma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512ifma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// base^exp mod modulus for a public exponent (`exp` ≥ 0, `modulus` odd and > 1): IFMA where
/// the CPU has it, GMP's `mpz_powm` otherwise. `base` may be any integer; a base without an
/// inverse is fine (the result is the same integer GMP gives).
pub fn pow_mod(base: &Integer, exp: &Integer, modulus: &Integer) -> Integer {
    match Montgomery52::for_this_cpu(modulus) {
        Some(ctx) if *exp >= 0 => ctx.pow_public(base, exp),
        _ => gmp_pow_mod(base, exp, modulus),
    }
}

/// base^exp mod modulus where `exp` is secret (`0 ≤ exp < 2^exp_bits`, `exp_bits` public,
/// `modulus` odd and > 1): constant time in `exp` on both paths (IFMA or GMP's `mpz_powm_sec`).
pub fn secure_pow_mod(base: &Integer, exp: &Integer, exp_bits: u32, modulus: &Integer) -> Integer {
    match Montgomery52::for_this_cpu(modulus) {
        Some(ctx) if *exp >= 0 => ctx.pow_secret(base, exp, exp_bits),
        _ => {
            let base = base.modulo_ref(modulus).complete();
            if *exp == 0 {
                // mpz_powm_sec requires a positive exponent.
                return Integer::from(1).modulo(modulus);
            }
            base.secure_pow_mod(exp, modulus)
        }
    }
}

fn gmp_pow_mod(base: &Integer, exp: &Integer, modulus: &Integer) -> Integer {
    base.pow_mod_ref(exp, modulus)
        .map(Integer::from)
        .unwrap_or_default()
}

/// An odd modulus M prepared for Montgomery products in radix 2^52: its digits, n (digits per
/// operand, with 4M < 2^(52n)), −M⁻¹ mod 2^52 and R² mod M.
#[derive(Clone, Debug)]
pub struct Montgomery52 {
    modulus: Integer,
    /// Digits per operand.
    digits: usize,
    /// Vectors per operand (digits rounded up to whole vectors; the padding digits are 0).
    vectors: usize,
    /// M's digits, `vectors × 8` of them.
    m: Vec<u64>,
    /// −M⁻¹ mod 2^52.
    m_prime: u64,
    /// R² mod M as digits.
    r_squared: Vec<u64>,
}

impl Montgomery52 {
    /// The context of `modulus`, or None if it is even, below 3 or above the largest size.
    pub fn new(modulus: &Integer) -> Option<Self> {
        if modulus.is_even() || *modulus < 3 {
            return None;
        }
        // 4M < R = 2^(52n).
        let digits = (modulus.significant_bits() + 2).div_ceil(DIGIT_BITS) as usize;
        let vectors = digits.div_ceil(LANES);
        if vectors > MAX_VECTORS {
            return None;
        }
        let m = to_digits(modulus, vectors * LANES);
        let r_squared = (Integer::from(1) << (2 * DIGIT_BITS * digits as u32)) % modulus;
        Some(Self {
            modulus: modulus.clone(),
            digits,
            vectors,
            m_prime: negated_inverse_mod_2_52(m[0]),
            r_squared: to_digits(&r_squared, vectors * LANES),
            m,
        })
    }

    /// The context of `modulus` if this CPU has the IFMA path, else None.
    pub fn for_this_cpu(modulus: &Integer) -> Option<Self> {
        if ifma_available() {
            Self::new(modulus)
        } else {
            None
        }
    }

    /// The modulus.
    pub fn modulus(&self) -> &Integer {
        &self.modulus
    }

    /// base^exp mod M for a public `exp` ≥ 0 (left-to-right fixed windows; zero windows
    /// skipped, so the time depends on the exponent).
    pub fn pow_public(&self, base: &Integer, exp: &Integer) -> Integer {
        let exp_bits = exp.significant_bits();
        let window = window_bits(exp_bits);
        let table = self.power_table(base, window);
        let mut acc = self.one_in_montgomery_form();
        let mut started = false;
        for value in windows(exp, exp_bits, window) {
            if started {
                for _ in 0..window {
                    acc = self.mul_digits(&acc, &acc);
                }
            }
            if value != 0 {
                acc = if started {
                    self.mul_digits(&acc, &table[value])
                } else {
                    table[value].clone()
                };
                started = true;
            }
        }
        self.leave_montgomery_form(&acc)
    }

    /// base^exp mod M for a secret `exp` with 0 ≤ exp < 2^exp_bits: the windows, the products
    /// and the table reads are the same for every exponent of that bound.
    pub fn pow_secret(&self, base: &Integer, exp: &Integer, exp_bits: u32) -> Integer {
        // An exponent above its stated bound still gets the right answer (its length is then
        // what the caller got wrong, not a secret).
        let exp_bits = exp_bits.max(exp.significant_bits()).max(1);
        let window = window_bits(exp_bits);
        let table = self.power_table(base, window);
        let mut acc = self.one_in_montgomery_form();
        let mut selected = vec![0u64; self.vectors * LANES];
        for (index, value) in windows(exp, exp_bits, window).enumerate() {
            if index > 0 {
                for _ in 0..window {
                    acc = self.mul_digits(&acc, &acc);
                }
            }
            select_constant_time(&table, value, &mut selected);
            acc = self.mul_digits(&acc, &selected);
        }
        self.leave_montgomery_form(&acc)
    }

    /// [x^0, x^1, …, x^(2^window − 1)] in Montgomery form, x = base mod M.
    fn power_table(&self, base: &Integer, window: u32) -> Vec<Vec<u64>> {
        let reduced = base.modulo_ref(&self.modulus).complete();
        let x = self.mul_digits(&to_digits(&reduced, self.m.len()), &self.r_squared);
        let size = 1usize << window;
        let mut table = Vec::with_capacity(size);
        table.push(self.one_in_montgomery_form());
        table.push(x.clone());
        for k in 2..size {
            let next = self.mul_digits(&table[k - 1], &x);
            table.push(next);
        }
        table
    }

    /// R mod M (1 in Montgomery form), as AMM(R² mod M, 1).
    fn one_in_montgomery_form(&self) -> Vec<u64> {
        let mut one = vec![0u64; self.m.len()];
        one[0] = 1;
        self.mul_digits(&self.r_squared, &one)
    }

    /// The integer of a Montgomery-form value: AMM(a, 1) ≤ M, then M subtracted if it is
    /// reached, by a masked selection (the value may be secret).
    fn leave_montgomery_form(&self, a: &[u64]) -> Integer {
        let mut one = vec![0u64; self.m.len()];
        one[0] = 1;
        let mut out = self.mul_digits(a, &one);
        subtract_if_not_below(&mut out, &self.m);
        from_digits(&out)
    }

    /// AMM(a, b) = a·b·R⁻¹ mod M, below 2M for inputs below 2M.
    ///
    /// # Panics
    /// If an operand has another length than this context's digits: a [`Residue`] of another
    /// context. The vector kernel reads whole vectors, so this is checked before it runs.
    fn mul_digits(&self, a: &[u64], b: &[u64]) -> Vec<u64> {
        assert!(
            a.len() == self.m.len() && b.len() == self.m.len(),
            "Montgomery52: an operand of another modulus"
        );
        let mut out = vec![0u64; self.m.len()];
        #[cfg(target_arch = "x86_64")]
        if cpu_has_ifma() {
            // SAFETY: the CPU has avx512f and avx512ifma (checked above); every slice has
            // `vectors × 8` digits (all are made by this context) and vectors ≤ MAX_VECTORS.
            unsafe {
                amm_ifma_dispatch(
                    self.vectors,
                    self.digits,
                    a,
                    b,
                    &self.m,
                    self.m_prime,
                    &mut out,
                )
            };
            return out;
        }
        amm_portable(self.digits, a, b, &self.m, self.m_prime, &mut out);
        out
    }
}

/// Modular products over one modulus, the interface of the multi-exponentiations
/// (`proofs::multi_exp`, `encoding`'s Horner products): values are lifted once into the
/// implementation's own form, multiplied there, and lowered once at the end.
pub trait ModularProducts {
    /// A value modulo the modulus in this implementation's form.
    type Element: Clone;
    /// x mod M in this form (x may be negative or ≥ M).
    fn lift(&self, x: &Integer) -> Self::Element;
    /// 1 in this form.
    fn one(&self) -> Self::Element;
    /// a ← a·b mod M.
    fn mul_assign(&self, a: &mut Self::Element, b: &Self::Element);
    /// a ← a² mod M.
    fn square_assign(&self, a: &mut Self::Element);
    /// The integer in [0, M) of a value.
    fn lower(&self, a: &Self::Element) -> Integer;
}

/// GMP's products: a multiplication and a division by M each (`mpz_mul`, `mpz_mod`).
pub struct GmpModulus<'a>(pub &'a Integer);

impl ModularProducts for GmpModulus<'_> {
    type Element = Integer;

    fn lift(&self, x: &Integer) -> Integer {
        x.modulo_ref(self.0).complete()
    }

    fn one(&self) -> Integer {
        Integer::from(1).modulo(self.0)
    }

    fn mul_assign(&self, a: &mut Integer, b: &Integer) {
        *a *= b;
        *a %= self.0;
    }

    fn square_assign(&self, a: &mut Integer) {
        a.square_mut();
        *a %= self.0;
    }

    fn lower(&self, a: &Integer) -> Integer {
        a.clone()
    }
}

/// A value in Montgomery form x·R mod M of one [`Montgomery52`] context: normalised 52-bit
/// digits, below 2M. Only the context that made it may use it (another one panics).
#[derive(Clone, Debug)]
pub struct Residue(Vec<u64>);

impl ModularProducts for Montgomery52 {
    type Element = Residue;

    fn lift(&self, x: &Integer) -> Residue {
        let reduced = x.modulo_ref(&self.modulus).complete();
        Residue(self.mul_digits(&to_digits(&reduced, self.m.len()), &self.r_squared))
    }

    fn one(&self) -> Residue {
        Residue(self.one_in_montgomery_form())
    }

    fn mul_assign(&self, a: &mut Residue, b: &Residue) {
        a.0 = self.mul_digits(&a.0, &b.0);
    }

    fn square_assign(&self, a: &mut Residue) {
        a.0 = self.mul_digits(&a.0, &a.0);
    }

    fn lower(&self, a: &Residue) -> Integer {
        self.leave_montgomery_form(&a.0)
    }
}

/// Window width for an exponent of `bits` bits (fewer products for longer exponents).
fn window_bits(bits: u32) -> u32 {
    match bits {
        0..=64 => 3,
        65..=512 => 4,
        _ => 5,
    }
}

/// The exponent's `window`-bit windows over its low `bits` bits, most significant first (the
/// top window holds the remainder when `window` does not divide `bits`).
fn windows(exp: &Integer, bits: u32, window: u32) -> impl Iterator<Item = usize> + '_ {
    (0..bits.div_ceil(window)).rev().map(move |w| {
        let low = w * window;
        let high = (low + window).min(bits);
        (low..high).rev().fold(0usize, |value, bit| {
            (value << 1) | usize::from(exp.get_bit(bit))
        })
    })
}

/// Copies `table[index]` into `out` reading every entry, each under a mask that is all ones
/// for the wanted entry only (no address or branch depends on `index`).
fn select_constant_time(table: &[Vec<u64>], index: usize, out: &mut [u64]) {
    out.fill(0);
    for (k, entry) in table.iter().enumerate() {
        // 0 − 1 = all ones when k == index, else 0, without a comparison branch.
        let diff = (k ^ index) as u64;
        let is_zero = ((diff | diff.wrapping_neg()) >> 63) ^ 1;
        let mask = is_zero.wrapping_neg();
        for (o, e) in out.iter_mut().zip(entry) {
            *o |= e & mask;
        }
    }
}

/// x ← x − m if x ≥ m, else x unchanged, for normalised digits, without a branch on them:
/// the subtraction is always done and its result kept under a mask from the final borrow.
fn subtract_if_not_below(x: &mut [u64], m: &[u64]) {
    let mut difference = vec![0u64; x.len()];
    let mut borrow = 0u64;
    for ((d, &xi), &mi) in difference.iter_mut().zip(x.iter()).zip(m) {
        let v = xi.wrapping_sub(mi).wrapping_sub(borrow);
        *d = v & DIGIT_MASK;
        borrow = v >> 63;
    }
    // borrow = 1: x < m, keep x.
    let keep_difference = borrow.wrapping_sub(1);
    for (xi, d) in x.iter_mut().zip(&difference) {
        *xi = (*xi & !keep_difference) | (d & keep_difference);
    }
}

/// −m0⁻¹ mod 2^52 for odd m0 (Newton's iteration doubles the correct low bits each step).
fn negated_inverse_mod_2_52(m0: u64) -> u64 {
    let mut inv: u64 = 1;
    for _ in 0..6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(m0.wrapping_mul(inv)));
    }
    inv.wrapping_neg() & DIGIT_MASK
}

/// The 52-bit digits of 0 ≤ x < 2^(52·len), least significant first.
fn to_digits(x: &Integer, len: usize) -> Vec<u64> {
    let limbs = x.to_digits::<u64>(Order::Lsf);
    let limb = |i: usize| limbs.get(i).copied().unwrap_or(0);
    (0..len)
        .map(|j| {
            let bit = j * DIGIT_BITS as usize;
            let (word, shift) = (bit / 64, bit % 64);
            let low = limb(word) >> shift;
            let high = if shift > 64 - DIGIT_BITS as usize {
                limb(word + 1) << (64 - shift)
            } else {
                0
            };
            (low | high) & DIGIT_MASK
        })
        .collect()
}

/// The integer of normalised 52-bit digits, least significant first.
fn from_digits(digits: &[u64]) -> Integer {
    let mut limbs = vec![0u64; (digits.len() * DIGIT_BITS as usize).div_ceil(64) + 1];
    for (j, &d) in digits.iter().enumerate() {
        let bit = j * DIGIT_BITS as usize;
        let (word, shift) = (bit / 64, bit % 64);
        limbs[word] |= d << shift;
        if shift > 64 - DIGIT_BITS as usize {
            limbs[word + 1] |= d >> (64 - shift);
        }
    }
    Integer::from_digits(&limbs, Order::Lsf)
}

/// AMM in scalar code, lane for lane what the IFMA kernel does: for each digit a_i, add the
/// low halves of a_i·B and q·M (q = a-lane-0 · −M⁻¹ mod 2^52), move lane 0's carry up, shift
/// the lanes down by one, add the high halves; normalise at the end. `out` gets
/// a·b·2^(−52n) mod M, below 2M when a and b are.
pub fn amm_portable(digits: usize, a: &[u64], b: &[u64], m: &[u64], m_prime: u64, out: &mut [u64]) {
    let lanes = m.len();
    let mut acc = vec![0u64; lanes];
    let lo = |x: u64, y: u64| ((x as u128 * y as u128) as u64) & DIGIT_MASK;
    let hi = |x: u64, y: u64| ((x as u128 * y as u128) >> DIGIT_BITS) as u64;
    for &ai in &a[..digits] {
        for j in 0..lanes {
            acc[j] = acc[j].wrapping_add(lo(ai, b[j]));
        }
        let a0 = acc[0];
        let q = a0.wrapping_mul(m_prime) & DIGIT_MASK;
        for j in 0..lanes {
            acc[j] = acc[j].wrapping_add(lo(q, m[j]));
        }
        let carry = lane_zero_carry(a0);
        acc.rotate_left(1);
        acc[lanes - 1] = 0;
        acc[0] = acc[0].wrapping_add(carry);
        for j in 0..lanes {
            acc[j] = acc[j].wrapping_add(hi(ai, b[j])).wrapping_add(hi(q, m[j]));
        }
    }
    normalise(&acc, digits, out);
}

/// Lane 0's carry once q·M's low half is added: a0 + (−a0 mod 2^52) is a multiple of 2^52, so
/// the carry is a0 >> 52, plus one unless a0's low digit was already zero.
fn lane_zero_carry(a0: u64) -> u64 {
    let low = a0 & DIGIT_MASK;
    (a0 >> DIGIT_BITS) + ((low | low.wrapping_neg()) >> 63)
}

/// Carries the unnormalised lanes into 52-bit digits (the value is below 2M < 2^(52n), so
/// nothing is left above digit n − 1).
fn normalise(acc: &[u64], digits: usize, out: &mut [u64]) {
    let mut carry = 0u64;
    for j in 0..digits {
        let v = acc[j].wrapping_add(carry);
        out[j] = v & DIGIT_MASK;
        carry = v >> DIGIT_BITS;
    }
    out[digits..].fill(0);
}

#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_vectors {
    ($vectors:expr, $call:ident, ($($arg:expr),*)) => {
        match $vectors {
            1 => $call::<1>($($arg),*),
            2 => $call::<2>($($arg),*),
            3 => $call::<3>($($arg),*),
            4 => $call::<4>($($arg),*),
            5 => $call::<5>($($arg),*),
            6 => $call::<6>($($arg),*),
            7 => $call::<7>($($arg),*),
            8 => $call::<8>($($arg),*),
            9 => $call::<9>($($arg),*),
            10 => $call::<10>($($arg),*),
            11 => $call::<11>($($arg),*),
            12 => $call::<12>($($arg),*),
            13 => $call::<13>($($arg),*),
            14 => $call::<14>($($arg),*),
            15 => $call::<15>($($arg),*),
            _ => $call::<16>($($arg),*),
        }
    };
}

/// Runs [`amm_ifma`] with the vector count as a constant (so the accumulators stay in
/// registers).
///
/// # Safety
/// The CPU has avx512f and avx512ifma; `a`, `b`, `m` and `out` hold `vectors × 8` digits and
/// `1 ≤ vectors ≤ MAX_VECTORS`.
#[cfg(target_arch = "x86_64")]
unsafe fn amm_ifma_dispatch(
    vectors: usize,
    digits: usize,
    a: &[u64],
    b: &[u64],
    m: &[u64],
    m_prime: u64,
    out: &mut [u64],
) {
    // SAFETY: forwarded from the caller.
    unsafe { dispatch_vectors!(vectors, amm_ifma, (digits, a, b, m, m_prime, out)) }
}

/// The AMM of [`amm_portable`] on `V` AVX-512 vectors of eight 64-bit lanes.
///
/// # Safety
/// The CPU has avx512f and avx512ifma; `a`, `b`, `m` and `out` hold at least `V × 8` digits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512ifma")]
unsafe fn amm_ifma<const V: usize>(
    digits: usize,
    a: &[u64],
    b: &[u64],
    m: &[u64],
    m_prime: u64,
    out: &mut [u64],
) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() >= V * LANES && b.len() >= V * LANES && m.len() >= V * LANES);
    debug_assert!(out.len() >= V * LANES && digits <= V * LANES);
    let zero = _mm512_setzero_si512();
    let mut bv = [zero; V];
    let mut mv = [zero; V];
    for k in 0..V {
        // SAFETY: k·8 + 8 ≤ V·8 ≤ the slices' lengths (caller's contract).
        unsafe {
            bv[k] = _mm512_loadu_si512(b.as_ptr().add(k * LANES).cast());
            mv[k] = _mm512_loadu_si512(m.as_ptr().add(k * LANES).cast());
        }
    }
    let mut acc = [zero; V];
    for &ai in &a[..digits] {
        let av = _mm512_set1_epi64(ai as i64);
        for k in 0..V {
            acc[k] = _mm512_madd52lo_epu64(acc[k], av, bv[k]);
        }
        let a0 = _mm_cvtsi128_si64(_mm512_castsi512_si128(acc[0])) as u64;
        let q = a0.wrapping_mul(m_prime) & DIGIT_MASK;
        let qv = _mm512_set1_epi64(q as i64);
        for k in 0..V {
            acc[k] = _mm512_madd52lo_epu64(acc[k], qv, mv[k]);
        }
        for k in 0..V {
            let next = if k + 1 < V { acc[k + 1] } else { zero };
            acc[k] = _mm512_alignr_epi64::<1>(next, acc[k]);
        }
        acc[0] = _mm512_add_epi64(
            acc[0],
            _mm512_maskz_set1_epi64(1, lane_zero_carry(a0) as i64),
        );
        for k in 0..V {
            acc[k] = _mm512_madd52hi_epu64(acc[k], av, bv[k]);
            acc[k] = _mm512_madd52hi_epu64(acc[k], qv, mv[k]);
        }
    }
    let mut lanes = [0u64; MAX_VECTORS * LANES];
    for (k, vector) in acc.iter().enumerate() {
        // SAFETY: k·8 + 8 ≤ V·8 ≤ MAX_VECTORS·8.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().add(k * LANES).cast(), *vector) };
    }
    normalise(&lanes[..V * LANES], digits, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    fn random_odd(bits: u32, rng: &mut ChaCha20Rng) -> Integer {
        let mut bytes = vec![0u8; bits.div_ceil(8) as usize];
        rng.fill_bytes(&mut bytes);
        let mut x = Integer::from_digits(&bytes, Order::Lsf);
        x.keep_bits_mut(bits);
        x.set_bit(bits - 1, true);
        x.set_bit(0, true);
        x
    }

    fn random_below(bound: &Integer, rng: &mut ChaCha20Rng) -> Integer {
        let bits = bound.significant_bits() + 64;
        let mut bytes = vec![0u8; bits.div_ceil(8) as usize];
        rng.fill_bytes(&mut bytes);
        Integer::from_digits(&bytes, Order::Lsf) % bound
    }

    #[test]
    fn digits_round_trip() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        for bits in [1u32, 51, 52, 53, 63, 64, 65, 1000, 6144] {
            let x = random_odd(bits, &mut rng);
            let len = (bits as usize).div_ceil(52) + 1;
            assert_eq!(from_digits(&to_digits(&x, len)), x, "{bits} bits");
        }
    }

    #[test]
    fn conditional_subtraction() {
        let m = to_digits(&Integer::from(1_000_003u32), 3);
        for (x, want) in [
            (5u32, 5u32),
            (1_000_002, 1_000_002),
            (1_000_003, 0),
            (1_000_010, 7),
        ] {
            let mut digits = to_digits(&Integer::from(x), 3);
            subtract_if_not_below(&mut digits, &m);
            assert_eq!(from_digits(&digits), want, "{x}");
        }
        let big = (Integer::from(1) << 200u32) - 1u32;
        let m = to_digits(&big, 5);
        let mut digits = m.clone();
        subtract_if_not_below(&mut digits, &m);
        assert_eq!(from_digits(&digits), 0);
    }

    #[test]
    fn inverse_is_the_negated_inverse() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        for _ in 0..100 {
            let m0 = rng.next_u64() | 1;
            let inv = negated_inverse_mod_2_52(m0);
            assert_eq!(m0.wrapping_mul(inv).wrapping_add(1) & DIGIT_MASK, 0);
        }
    }

    /// The portable AMM against a·b·R⁻¹ mod M computed with GMP, including inputs close to 2M.
    fn check_amm(ctx: &Montgomery52, a: &Integer, b: &Integer, use_ifma: bool) {
        let len = ctx.m.len();
        let mut out = vec![0u64; len];
        let (ad, bd) = (to_digits(a, len), to_digits(b, len));
        if use_ifma {
            // SAFETY: the caller checked the CPU; all slices have vectors × 8 digits.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                amm_ifma_dispatch(
                    ctx.vectors,
                    ctx.digits,
                    &ad,
                    &bd,
                    &ctx.m,
                    ctx.m_prime,
                    &mut out,
                )
            };
        } else {
            amm_portable(ctx.digits, &ad, &bd, &ctx.m, ctx.m_prime, &mut out);
        }
        let got = from_digits(&out);
        let two_m = ctx.modulus.clone() * 2u32;
        assert!(got < two_m, "AMM output not below 2M");
        let r = Integer::from(1) << (52 * ctx.digits as u32);
        let r_inv = r.invert(&ctx.modulus).unwrap();
        let want = (a * b).complete() * r_inv % &ctx.modulus;
        assert_eq!(got.modulo(&ctx.modulus), want);
    }

    fn amm_cases(use_ifma: bool) {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        for bits in [64u32, 100, 512, 1024, 1536, 2048, 3072, 4096, 6144, 6600] {
            let m = random_odd(bits, &mut rng);
            let ctx = Montgomery52::new(&m).unwrap();
            let two_m_minus_1 = m.clone() * 2u32 - 1u32;
            let cases = [
                (Integer::ZERO, random_below(&m, &mut rng)),
                (two_m_minus_1.clone(), two_m_minus_1.clone()),
                (
                    random_below(&two_m_minus_1, &mut rng),
                    two_m_minus_1.clone(),
                ),
                (random_below(&m, &mut rng), random_below(&m, &mut rng)),
                (
                    random_below(&two_m_minus_1, &mut rng),
                    random_below(&two_m_minus_1, &mut rng),
                ),
            ];
            for (a, b) in &cases {
                check_amm(&ctx, a, b, use_ifma);
            }
        }
    }

    #[test]
    fn portable_amm_is_montgomery_multiplication() {
        amm_cases(false);
    }

    #[test]
    fn ifma_amm_is_montgomery_multiplication() {
        if !cpu_has_ifma() {
            eprintln!("SKIP: this CPU has no AVX-512 IFMA (the portable AMM is tested above)");
            return;
        }
        amm_cases(true);
    }

    #[test]
    #[should_panic(expected = "another modulus")]
    fn residues_of_another_context_are_refused() {
        let small = Montgomery52::new(&Integer::from(1_000_003)).unwrap();
        let large = Montgomery52::new(&((Integer::from(1) << 2000u32) + 1u32)).unwrap();
        let mut x = large.lift(&Integer::from(5));
        large.mul_assign(&mut x, &small.lift(&Integer::from(7)));
    }

    #[test]
    fn too_large_or_even_moduli_are_refused() {
        assert!(Montgomery52::new(&Integer::from(10)).is_none());
        assert!(Montgomery52::new(&Integer::from(1)).is_none());
        let big = (Integer::from(1) << 6700u32) + 1u32;
        assert!(Montgomery52::new(&big).is_none());
        // pow_mod still answers (GMP) for a modulus the IFMA path refuses.
        assert_eq!(pow_mod(&Integer::from(3), &Integer::from(5), &big), 243);
    }

    #[test]
    fn exponentiation_edge_cases() {
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let m = random_odd(2048, &mut rng);
        let ctx = Montgomery52::new(&m).unwrap();
        let x = random_below(&m, &mut rng);
        for e in [0u32, 1, 2, 3, 31, 32, 33] {
            let want = x.clone().pow_mod(&Integer::from(e), &m).unwrap();
            assert_eq!(
                ctx.pow_public(&x, &Integer::from(e)),
                want,
                "public e = {e}"
            );
            assert_eq!(
                ctx.pow_secret(&x, &Integer::from(e), 64),
                want,
                "secret e = {e}"
            );
        }
        // Bases ≥ M, negative, zero and a multiple of M.
        for base in [
            m.clone() + 5u32,
            Integer::from(-7),
            Integer::ZERO,
            m.clone() * 3u32,
        ] {
            let e = Integer::from(65537);
            let want = base.clone().pow_mod(&e, &m).unwrap();
            assert_eq!(ctx.pow_public(&base, &e), want);
            assert_eq!(ctx.pow_secret(&base, &e, 17), want);
        }
    }

    #[test]
    fn both_product_implementations_agree() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let m = random_odd(3072, &mut rng);
        let ctx = Montgomery52::new(&m).unwrap();
        let gmp = GmpModulus(&m);
        let xs: Vec<Integer> = (0..6).map(|_| random_below(&m, &mut rng)).collect();
        let (mut a, mut b) = (ctx.one(), gmp.one());
        for x in &xs {
            ctx.mul_assign(&mut a, &ctx.lift(x));
            gmp.mul_assign(&mut b, &gmp.lift(x));
            ctx.square_assign(&mut a);
            gmp.square_assign(&mut b);
        }
        ctx.mul_assign(&mut a, &ctx.lift(&Integer::from(-3)));
        gmp.mul_assign(&mut b, &gmp.lift(&Integer::from(-3)));
        assert_eq!(ctx.lower(&a), gmp.lower(&b));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Both exponentiations equal GMP's for random moduli of Paillier's sizes.
        #[test]
        fn exponentiation_equals_gmp(seed in any::<u64>(), size in 0usize..5) {
            let bits = [1024u32, 1536, 2048, 3072, 4096][size];
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let m = random_odd(bits, &mut rng);
            let ctx = Montgomery52::new(&m).unwrap();
            let base = random_below(&m, &mut rng);
            let exp = random_below(&(Integer::from(1) << bits), &mut rng);
            let want = base.clone().pow_mod(&exp, &m).unwrap();
            prop_assert_eq!(ctx.pow_public(&base, &exp), want.clone());
            prop_assert_eq!(ctx.pow_secret(&base, &exp, bits), want.clone());
            prop_assert_eq!(pow_mod(&base, &exp, &m), want.clone());
            prop_assert_eq!(secure_pow_mod(&base, &exp, bits, &m), want);
        }
    }
}
