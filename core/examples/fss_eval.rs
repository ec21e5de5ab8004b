//! Benchmark of the FSS module (DCF and interval-containment gate of Boyle et al. 2020/1392).
//!
//! `cargo run --release -p privmatch-core --example fss_eval -- [count] [reps]`
//!
//! Prints µs per key (best of `reps` runs over `count` keys) for DCF key generation, sign-gate
//! (IC) key generation, IC evaluation one key at a time and in one batch, and the seed
//! expander; each next to the raw fixed-key AES cost of the same number of blocks measured in
//! the same run, so the figures read as a ratio to the AES floor.

use std::hint::black_box;
use std::time::Instant;

use privmatch_core::crypto::fss::aes::{self, Backend};
use privmatch_core::crypto::fss::{dcf, ic};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Best wall time in seconds of `reps` runs of `f`.
fn best<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    (0..reps.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let count: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let reps: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let count = count.max(1);
    let mut rng = ChaCha20Rng::from_entropy();
    let us = |secs: f64| secs * 1e6 / count as f64;

    println!("fss_eval: {count} keys, best of {reps}");
    println!("AES backend: {}", aes::backend().name());

    // The floor: fixed-key AES over independent blocks, 8 in flight.
    let mut blocks: Vec<u128> = (0..count * 8).map(|i| i as u128).collect();
    let t = best(reps, || aes::fixed_encrypt(black_box(&mut blocks)));
    let ns_block = t * 1e9 / (count * 8) as f64;
    println!("fixed-key AES          {ns_block:8.3} ns/block");

    let alphas: Vec<u32> = (0..count).map(|_| rng.next_u32()).collect();
    let t = best(reps, || {
        for &a in &alphas {
            black_box(dcf::gen(&mut rng, 32, a, 1).ok());
        }
    });
    // Gen: 3 blocks per party per level.
    let floor = 6.0 * 32.0 * ns_block / 1e3;
    println!(
        "dcf gen (n=32)         {:8.3} µs/key pair   (AES floor {floor:.3} µs, x{:.2})",
        us(t),
        us(t) / floor
    );

    let params: Vec<(u32, u32)> = alphas.iter().map(|&a| (a, 1)).collect();
    let mut dcf_pairs = Vec::new();
    let t = best(reps, || {
        dcf_pairs = dcf::gen_batch(&mut rng, 32, &params).unwrap_or_default();
    });
    println!(
        "dcf gen_batch (n=32)   {:8.3} µs/key pair   (AES floor {floor:.3} µs, x{:.2})",
        us(t),
        us(t) / floor
    );
    // DCF eval: 32 levels × 2 blocks.
    let dcf_batch = dcf::DcfKeyBatch::from_keys(dcf_pairs.iter().map(|(k0, _)| k0))?;
    let dcf_xs: Vec<u32> = (0..count).map(|_| rng.next_u32()).collect();
    let mut dcf_out = vec![0u32; count];
    let mut status = Ok(());
    let t = best(reps, || {
        status = dcf::eval_batch(0, &dcf_batch, &dcf_xs, &mut dcf_out);
    });
    status?;
    let eval_floor = 64.0 * ns_block / 1e3;
    println!(
        "dcf eval batch (n=32)  {:8.3} µs/key/party  (AES floor {eval_floor:.3} µs, x{:.2})",
        us(t),
        us(t) / eval_floor
    );

    let r_ins: Vec<u32> = (0..count).map(|_| rng.next_u32()).collect();
    let mut pairs = Vec::new();
    let t = best(reps, || {
        for &r in &r_ins {
            black_box(ic::gen_sign_gate(&mut rng, r));
        }
    });
    println!(
        "ic gen (sign gate)     {:8.3} µs/key pair   (AES floor {floor:.3} µs, x{:.2})",
        us(t),
        us(t) / floor
    );
    let t = best(reps, || {
        pairs = ic::gen_sign_gates(&mut rng, &r_ins);
    });
    println!(
        "ic gen_sign_gates      {:8.3} µs/key pair   (AES floor {floor:.3} µs, x{:.2})",
        us(t),
        us(t) / floor
    );

    // Masked inputs: uniformly random values v (the sign gate's answer is v as i32 ≥ 0),
    // masked by r_in.
    let values: Vec<u32> = (0..count).map(|_| rng.next_u32()).collect();
    let xs: Vec<u32> = values
        .iter()
        .zip(&r_ins)
        .map(|(v, r)| v.wrapping_add(*r))
        .collect();
    // IC eval: 2 DCF paths × 32 levels × 2 blocks.
    let floor = 128.0 * ns_block / 1e3;

    let mut out0 = vec![0u32; count];
    let mut status = Ok(());
    let t = best(reps, || {
        for ((o, (k0, _)), &x) in out0.iter_mut().zip(&pairs).zip(&xs) {
            match ic::eval(0, k0, x) {
                Ok(y) => *o = y,
                Err(e) => status = Err(e),
            }
        }
    });
    status?;
    println!(
        "ic eval single         {:8.3} µs/key/party  (AES floor {floor:.3} µs, x{:.2})",
        us(t),
        us(t) / floor
    );

    let encoded: Vec<[Vec<u8>; 2]> = pairs
        .iter()
        .map(|(a, b)| [a.encode(), b.encode()])
        .collect();
    let t = best(reps, || {
        black_box(ic::IcKeyBatch::decode_many(encoded.iter().map(|e| e[0].as_slice())).ok());
    });
    println!("ic batch decode        {:8.3} µs/key", us(t));
    let batch0 = ic::IcKeyBatch::decode_many(encoded.iter().map(|e| e[0].as_slice()))?;
    let batch1 = ic::IcKeyBatch::decode_many(encoded.iter().map(|e| e[1].as_slice()))?;
    let mut out1 = vec![0u32; count];
    let mut batch_us = f64::INFINITY;
    for backend in Backend::ALL {
        if !backend.is_available() {
            continue;
        }
        let mut status = Ok(());
        let t = best(reps, || {
            status = ic::eval_batch_with(backend, 0, &batch0, &xs, &mut out0);
        });
        status?;
        batch_us = batch_us.min(us(t));
        println!(
            "ic eval batch          {:8.3} µs/key/party  (AES floor {floor:.3} µs, x{:.2})  [{}]",
            us(t),
            us(t) / floor,
            backend.name()
        );
    }
    // The Funshade C reference on this kind of machine (BENCHMARKS.md; not measured in this run).
    println!(
        "  vs Funshade C sign-gate eval 5.7 µs/party: x{:.1} faster",
        5.7 / batch_us
    );
    ic::eval_batch(0, &batch0, &xs, &mut out0)?;
    ic::eval_batch(1, &batch1, &xs, &mut out1)?;
    let wrong = out0
        .iter()
        .zip(&out1)
        .zip(&values)
        .filter(|((a, b), v)| a.wrapping_add(**b) != u32::from(**v as i32 >= 0))
        .count();
    println!("ic check               {wrong} wrong of {count}");
    if wrong != 0 {
        return Err("sign gate gave wrong results".into());
    }

    // The Funshade mask expansion: 2·l words per party per comparison.
    for l in [128usize, 512, 1024] {
        let mut mask = vec![0u32; 2 * l];
        let seed = [7u8; 16];
        let t = best(reps, || {
            for _ in 0..count {
                aes::expand_u32(black_box(&seed), &mut mask);
            }
        });
        let floor = (2 * l).div_ceil(4) as f64 * ns_block / 1e3;
        println!(
            "expand_u32 2·l={:<5}     {:8.3} µs/seed       (AES floor {floor:.3} µs, x{:.2})",
            2 * l,
            us(t),
            us(t) / floor
        );
    }
    Ok(())
}
