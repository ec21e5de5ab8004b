//! Which big-integer library Paillier should use: the two exponentiations that dominate it,
//! timed with num-bigint (pure Rust, variable time), crypto-bigint (pure Rust, constant time,
//! Montgomery on heap-allocated integers) and GMP through rug (`mpz_powm`, and the
//! constant-time `mpz_powm_sec` used for secret exponents):
//!
//! * **encryption**: r^N mod N² (exponent |N| bits, modulus 2|N| bits; N public);
//! * **CRT decryption half**: c^(p−1) mod p² (exponent |N|/2 bits, modulus |N| bits; secret).
//!
//! and, where the CPU has AVX-512 IFMA, the project's radix-2^52 Montgomery exponentiation
//! (`paillier::montgomery`: `pow_public` variable time in the exponent, `pow_secret` constant
//! time).
//!
//! `cargo run --release -p privmatch-core --example bignum_compare [-- BITS...]` (default 2048
//! and 3072). Prints milliseconds per operation and the ratios of GMP to the IFMA paths.

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use privmatch_core::algebra::montgomery::Montgomery52;
use privmatch_core::paillier::cipher::{random_below, SecretKey};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use rug::integer::Order;
use rug::{Complete, Integer};
use std::time::Instant;

fn per_op_ms(reps: u32, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    for _ in 0..reps {
        f();
    }
    start.elapsed().as_secs_f64() * 1000.0 / f64::from(reps)
}

fn to_num(x: &Integer) -> num_bigint::BigUint {
    num_bigint::BigUint::from_bytes_be(&x.to_digits::<u8>(Order::Msf))
}

fn to_boxed(x: &Integer, bits: u32) -> BoxedUint {
    let bytes = x.to_digits::<u8>(Order::Msf);
    let precision = bits.div_ceil(64) * 64;
    let mut padded = vec![0u8; (precision / 8) as usize - bytes.len()];
    padded.extend_from_slice(&bytes);
    BoxedUint::from_be_slice(&padded, precision).expect("fits")
}

/// (num-bigint, crypto-bigint, rug pow_mod, rug secure_pow_mod, IFMA public, IFMA secret) in
/// ms for base^exp mod modulus (the IFMA figures NaN where the CPU lacks it).
fn time_all(base: &Integer, exp: &Integer, modulus: &Integer, reps: u32) -> [f64; 6] {
    let (nb, ne, nm) = (to_num(base), to_num(exp), to_num(modulus));
    let t_num = per_op_ms(reps, || {
        std::hint::black_box(nb.modpow(&ne, &nm));
    });
    let bits = modulus.significant_bits();
    let params = BoxedMontyParams::new(Odd::new(to_boxed(modulus, bits)).expect("odd modulus"));
    let cb = BoxedMontyForm::new(to_boxed(base, bits), params);
    let ce = to_boxed(exp, exp.significant_bits());
    let t_cb = per_op_ms(reps, || {
        std::hint::black_box(cb.pow(&ce));
    });
    let t_rug = per_op_ms(reps, || {
        std::hint::black_box(base.pow_mod_ref(exp, modulus).map(Integer::from));
    });
    let t_sec = per_op_ms(reps, || {
        std::hint::black_box(base.clone().secure_pow_mod(exp, modulus));
    });
    // All agree.
    let want = base.pow_mod_ref(exp, modulus).map(Integer::from);
    assert_eq!(want.as_ref().map(to_num), Some(nb.modpow(&ne, &nm)));
    let (mut t_ifma, mut t_ifma_sec) = (f64::NAN, f64::NAN);
    if let Some(ctx) = Montgomery52::for_this_cpu(modulus) {
        let bound = exp.significant_bits();
        assert_eq!(Some(ctx.pow_public(base, exp)), want);
        assert_eq!(Some(ctx.pow_secret(base, exp, bound)), want);
        t_ifma = per_op_ms(reps, || {
            std::hint::black_box(ctx.pow_public(base, exp));
        });
        t_ifma_sec = per_op_ms(reps, || {
            std::hint::black_box(ctx.pow_secret(base, exp, bound));
        });
    }
    [t_num, t_cb, t_rug, t_sec, t_ifma, t_ifma_sec]
}

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if args.is_empty() {
        vec![2048, 3072]
    } else {
        args
    };
    println!("| |N| | operation | num-bigint ms | crypto-bigint ms | rug pow_mod ms | rug secure_pow_mod ms | IFMA public ms | IFMA secret ms | pow_mod / IFMA public | secure_pow_mod / IFMA secret |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for bits in sizes {
        let mut rng = ChaCha20Rng::seed_from_u64(u64::from(bits));
        let sk = SecretKey::generate(bits, &mut rng).expect("key");
        let n = sk.public_key().n().clone();
        let n2 = sk.public_key().n_squared().clone();
        let (p, _) = sk.primes();
        let p2 = p.square_ref().complete();
        let reps = if bits > 2048 { 10 } else { 20 };
        let r = random_below(&n, &mut rng);
        let c = random_below(&p2, &mut rng);
        let p_minus_1 = (p - 1u32).complete();
        for (what, base, exp, modulus) in [
            ("r^N mod N²", &r, &n, &n2),
            ("c^(p−1) mod p²", &c, &p_minus_1, &p2),
        ] {
            let [a, b, g, s, i, j] = time_all(base, exp, modulus, reps);
            println!(
                "| {bits} | {what} | {a:.2} | {b:.2} | {g:.2} | {s:.2} | {i:.2} | {j:.2} | {:.2}× | {:.2}× |",
                g / i,
                s / j
            );
        }
    }
}
