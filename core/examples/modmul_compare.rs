//! Whether a Montgomery product would speed up the terminal's Round 2 of packed Paillier:
//! one squaring or product modulo an odd modulus of 4096 bits (N² for |N| = 2048) and 6144
//! bits (N² for |N| = 3072), timed as the code computes it (`mpz_mul` + `mpz_mod` through rug)
//! against GMP's `mpn` layer with Montgomery reduction: `mpn_sqr`/`mpn_mul_n` followed by
//! `mpn_redc_1` (quadratic) or `mpn_redc_n` (subquadratic). The two REDC functions are GMP
//! internals (declared in `gmp-impl.h`, not `gmp.h`, so without a stable interface); they are
//! declared here only to measure them, and every result is checked against rug.
//!
//! `cargo run --release -p privmatch-core --example modmul_compare`. Prints µs per operation.

use gmp_mpfr_sys::gmp;
use rug::integer::Order;
use rug::{Complete, Integer};
use std::time::Instant;

extern "C" {
    /// R = U / B^n mod M (up to one subtraction of M, signalled by the carry returned), for
    /// U < M·B^n of 2n limbs and invm = −M⁻¹ mod B. Destroys U.
    fn __gmpn_redc_1(rp: *mut u64, up: *mut u64, mp: *const u64, n: i64, invm: u64) -> u64;
    /// R = U / B^n mod M for U of 2n limbs, ip = M⁻¹ mod B^n (n limbs).
    fn __gmpn_redc_n(rp: *mut u64, up: *mut u64, mp: *const u64, n: i64, ip: *const u64);
}

const REPS: u32 = 20_000;

fn per_op_us(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..REPS {
        f();
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(REPS)
}

fn limbs_of(x: &Integer, limbs: usize) -> Vec<u64> {
    let mut v: Vec<u64> = x.to_digits(Order::Lsf);
    v.resize(limbs, 0);
    v
}

/// The Montgomery side: modulus limbs, −M⁻¹ mod B, M⁻¹ mod B^n.
struct Montgomery {
    modulus: Vec<u64>,
    neg_inv_1: u64,
    inv_n: Vec<u64>,
}

impl Montgomery {
    fn new(m: &Integer, limbs: usize) -> Self {
        let b = Integer::from(1) << 64u32;
        let bn = Integer::from(1) << (64 * limbs as u32);
        let inv_1 = m.invert_ref(&b).map(Integer::from).expect("odd modulus");
        let neg_inv_1 = (b - inv_1).to_u64().expect("one limb");
        let inv_n = m.invert_ref(&bn).map(Integer::from).expect("odd modulus");
        Self {
            modulus: limbs_of(m, limbs),
            neg_inv_1,
            inv_n: limbs_of(&inv_n, limbs),
        }
    }

    /// r = a·b / B^n mod M (a, b < M) with `mpn_mul_n` (or `mpn_sqr` when `a` is `b`) and REDC.
    fn product(
        &self,
        r: &mut [u64],
        a: &[u64],
        b: Option<&[u64]>,
        scratch: &mut [u64],
        quad: bool,
    ) {
        let n = self.modulus.len();
        // SAFETY: every slice has n limbs, scratch 2n; GMP's documented preconditions (no
        // overlap of the product with its inputs) hold since scratch is separate.
        unsafe {
            match b {
                Some(b) => gmp::mpn_mul_n(scratch.as_mut_ptr(), a.as_ptr(), b.as_ptr(), n as i64),
                None => gmp::mpn_sqr(scratch.as_mut_ptr(), a.as_ptr(), n as i64),
            }
            if quad {
                let m = self.modulus.as_ptr();
                let carry = __gmpn_redc_1(
                    r.as_mut_ptr(),
                    scratch.as_mut_ptr(),
                    m,
                    n as i64,
                    self.neg_inv_1,
                );
                if carry != 0 {
                    gmp::mpn_sub_n(r.as_mut_ptr(), r.as_ptr(), m, n as i64);
                }
            } else {
                let (m, ip) = (self.modulus.as_ptr(), self.inv_n.as_ptr());
                __gmpn_redc_n(r.as_mut_ptr(), scratch.as_mut_ptr(), m, n as i64, ip);
            }
        }
    }
}

fn main() {
    println!("| modulus bits | rug square+mod | rug mul+mod | mpn_sqr + redc_1 | mpn_mul_n + redc_1 | mpn_sqr + redc_n |");
    println!("|---|---|---|---|---|---|");
    for limbs in [64usize, 96] {
        let m = (Integer::from(1) << (64 * limbs as u32 - 1)) + 12_345u32;
        let x = Integer::from(Integer::u_pow_u(3, 40_000)) % &m;
        let y = Integer::from(Integer::u_pow_u(5, 30_000)) % &m;
        let mut a = x.clone();
        let rug_square = per_op_us(|| {
            a.square_mut();
            a %= &m;
        });
        let rug_mul = per_op_us(|| {
            a *= &y;
            a %= &m;
        });
        let mont = Montgomery::new(&m, limbs);
        let (xv, yv) = (limbs_of(&x, limbs), limbs_of(&y, limbs));
        let mut scratch = vec![0u64; 2 * limbs];
        let mut r = xv.clone();
        let mut t = Vec::new();
        for (b, quad) in [(None, true), (Some(&yv[..]), true), (None, false)] {
            t.push(per_op_us(|| {
                let a = r.clone();
                mont.product(&mut r, &a, b, &mut scratch, quad);
            }));
        }
        // Check: x·y/B^n mod M from both REDCs equals rug's.
        let r_inv = Integer::from(1) << (64 * limbs as u32);
        let r_inv = r_inv.invert(&m).expect("unit");
        let want = (&x * &y).complete() * &r_inv % &m;
        for quad in [true, false] {
            mont.product(&mut r, &xv, Some(&yv), &mut scratch, quad);
            let got = Integer::from_digits(&r, Order::Lsf) % &m;
            assert_eq!(got, want, "REDC result differs from rug");
        }
        println!(
            "| {} | {rug_square:.2} | {rug_mul:.2} | {:.2} | {:.2} | {:.2} |",
            64 * limbs,
            t[0],
            t[1],
            t[2]
        );
    }
}
