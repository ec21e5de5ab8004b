//! Single-core cost of the matching phase of the three device-held-template protocols of
//! Agrawal, Bhattacharya, Mishra, Rindal, "Secure Biometric Authentication on Device-Held
//! Templates" (ePrint 2020/1126; [ABMR20] §9 reports 24 ms for Π1's and 49 ms for Π2's
//! matching phase on a laptop) at ℓ = 256, m = 16, |N| = 3072, fixed seeds.
//!
//! `taskset -c 1 cargo run --release -p privmatch-core --example paillier_rounds -- [runs]`
//!
//! Generates one 3072-bit key (seconds), enrols one template per protocol and runs `runs`
//! sessions of each (default 5), checking every outcome against the plaintext inner product.
//! Prints the mean time of each round, and each next to one Paillier encryption of the same
//! key measured in the same run (the unit the protocols are built from). For Π2 it also
//! compares applying the multiplier a to the product with folding it into the exponents.

use std::time::Instant;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier};
use privmatch_core::embedding::dot;
use privmatch_core::paillier::cipher::{Ciphertext, NoncePool, SecretKey};
use privmatch_core::paillier::encoding::{
    homomorphic_inner_product, homomorphic_inner_product_folded,
};
use privmatch_core::paillier::messages::template_signing_bytes;
use privmatch_core::paillier::params::{Params, Protocol, DEFAULT_STAT_BITS};
use privmatch_core::paillier::pi1::{Pi1Device, Pi1Terminal};
use privmatch_core::paillier::pi2::{
    encrypt_elements, pack_element_ciphertexts, random_prime_multiplier, Pi2Device, Pi2Terminal,
};
use privmatch_core::paillier::pi3::{Pi3Device, Pi3Terminal};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use rug::Integer;

const DIM: usize = 256;
const VALUE_BITS: u32 = 16;
const MODULUS_BITS: u32 = 3072;

type Failure = Box<dyn std::error::Error>;

fn random_vector(rng: &mut ChaCha20Rng) -> Vec<i32> {
    let half = 1i64 << (VALUE_BITS - 1);
    (0..DIM)
        .map(|_| (i64::from(rng.next_u32()) % (2 * half) - half) as i32)
        .collect()
}

fn params(protocol: Protocol) -> Result<Params, Failure> {
    Ok(Params::new(
        protocol,
        DIM,
        VALUE_BITS,
        MODULUS_BITS,
        DEFAULT_STAT_BITS,
        Params::max_norm_bound(DIM, VALUE_BITS),
    )?)
}

/// A copy of `sk` (a device owns its key).
fn copy_key(sk: &SecretKey) -> Result<SecretKey, Failure> {
    let (p, q) = sk.primes();
    Ok(SecretKey::from_primes(p.clone(), q.clone())?)
}

/// The service provider's enrolment of Π2 and Π3: pack the device's element ciphertexts
/// and sign them.
fn packed_and_signed(
    p: &Params,
    sk: &SecretKey,
    sp: &SigningKey,
    u: &[i32],
    rng: &mut ChaCha20Rng,
) -> Result<(Vec<Ciphertext>, Vec<u8>), Failure> {
    let elements = encrypt_elements(sk, p, u, rng)?;
    let packed = pack_element_ciphertexts(sk.public_key(), p, &elements)?;
    let sig = sp.sign(&template_signing_bytes(p, sk.public_key(), &packed));
    Ok((packed, sig.to_bytes().to_vec()))
}

/// Mean milliseconds of `total` seconds over `runs`, and the same in Paillier encryptions.
fn per_run(total: f64, runs: usize, encryption: f64) -> String {
    let mean = total / runs as f64;
    format!("{:8.3} ms ({:6.2} enc)", mean * 1e3, mean / encryption)
}

fn main() -> Result<(), Failure> {
    let runs: usize = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("runs: not a count: {arg}"))?,
        None => 5,
    };
    let runs = runs.max(1);
    let mut rng = ChaCha20Rng::seed_from_u64(0x3072);
    let started = Instant::now();
    let sk = SecretKey::generate(MODULUS_BITS, &mut rng)?;
    println!(
        "key generation ({MODULUS_BITS}-bit N): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let sp = SigningKey::from_bytes(&[7u8; 32]);
    let sp_public = sp.verifying_key();
    let verify = move |msg: &[u8], sig: &[u8]| {
        Signature::from_slice(sig).is_ok_and(|s| sp_public.verify(msg, &s).is_ok())
    };
    let u = random_vector(&mut rng);
    let w = random_vector(&mut rng);
    let expected = dot(&u, &w);

    // The unit: one encryption of a template value under the device's key.
    let m = sk.public_key().reduce_signed(&Integer::from(u[0]))?;
    let started = Instant::now();
    for _ in 0..16 {
        sk.encrypt(&m, &mut rng)?;
    }
    let encryption = started.elapsed().as_secs_f64() / 16.0;
    println!(
        "ℓ = {DIM}, m = {VALUE_BITS}, |N| = {MODULUS_BITS}; one encryption (CRT) {:.2} ms; mean of {runs} sessions per protocol",
        encryption * 1e3
    );

    // Π1 (semi-honest).
    let p = params(Protocol::Pi1)?;
    let device = Pi1Device::enrol(p.clone(), copy_key(&sk)?, &u, &mut rng)?;
    let r1 = device.round1();
    let mut pool = NoncePool::new(device.public_key().clone());
    pool.fill_public(runs, &mut rng);
    let (mut t2, mut t3, mut t4) = (0.0, 0.0, 0.0);
    for _ in 0..runs {
        let mut terminal = Pi1Terminal::new(p.clone(), w.clone(), 0)?;
        let clock = Instant::now();
        let r_to_n = pool.take(&mut rng);
        let r2 = terminal.round2_with_nonce_power(&r1, &r_to_n, &mut rng)?;
        t2 += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let (r3, outcome) = device.round3(&r2)?;
        t3 += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let bit = terminal.finish(&r3)?;
        t4 += clock.elapsed().as_secs_f64();
        if outcome.inner_product != expected || bit != (expected >= 0) {
            return Err("Π1 gave another inner product than the plaintext".into());
        }
    }
    println!(
        "Π1: round 2 (T, pooled r^N) {}  round 3 (D) {}  output (T) {}",
        per_run(t2, runs, encryption),
        per_run(t3, runs, encryption),
        per_run(t4, runs, encryption)
    );

    // Π2 (malicious device).
    let p = params(Protocol::Pi2)?;
    let (packed, sig) = packed_and_signed(&p, &sk, &sp, &u, &mut rng)?;
    let device = Pi2Device::new(p.clone(), copy_key(&sk)?, packed.clone(), sig)?;
    let r1 = device.round1();
    pool.fill_public(runs, &mut rng);
    let (mut t2, mut t3, mut t4) = (0.0, 0.0, 0.0);
    for _ in 0..runs {
        let mut terminal = Pi2Terminal::new(p.clone(), w.clone(), 0)?;
        let clock = Instant::now();
        let r_to_n = pool.take(&mut rng);
        let r2 = terminal.round2_with_nonce_power(&r1, &verify, &r_to_n, &mut rng)?;
        t2 += clock.elapsed().as_secs_f64();
        let mut session = device.session();
        let clock = Instant::now();
        let r3 = session.round3(&r2)?;
        t3 += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let (_, outcome) = terminal.round4(&r3)?;
        t4 += clock.elapsed().as_secs_f64();
        if outcome.inner_product != expected {
            return Err("Π2 gave another inner product than the plaintext".into());
        }
    }
    println!(
        "Π2: round 2 (T, pooled r^N) {}  round 3 (D) {}  round 4 (T) {}",
        per_run(t2, runs, encryption),
        per_run(t3, runs, encryption),
        per_run(t4, runs, encryption)
    );
    let pk = device.public_key();
    let layout = p.layout();
    let a = random_prime_multiplier(layout, &mut rng)?;
    let (mut once, mut folded) = (0.0, 0.0);
    for _ in 0..runs {
        let clock = Instant::now();
        let z = homomorphic_inner_product(pk, layout, &packed, &w)?;
        let za = z.as_integer().clone().secure_pow_mod(&a, pk.n_squared());
        once += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let zf = homomorphic_inner_product_folded(pk, layout, &packed, &w, &a)?;
        folded += clock.elapsed().as_secs_f64();
        if &za != zf.as_integer() {
            return Err("folding a into the exponents changed the product".into());
        }
    }
    println!(
        "Π2: product then ^a {}  a folded into the exponents {}  ({:.2}×)",
        per_run(once, runs, encryption),
        per_run(folded, runs, encryption),
        folded / once
    );

    // Π3 (no leakage: the comparison in a garbled circuit).
    let p = params(Protocol::Pi3)?;
    let (packed, sig) = packed_and_signed(&p, &sk, &sp, &u, &mut rng)?;
    let device = Pi3Device::new(p.clone(), copy_key(&sk)?, packed, sig)?;
    let r1 = device.round1();
    let (mut t2, mut t3, mut t4, mut t5, mut t6) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for _ in 0..runs {
        let mut terminal = Pi3Terminal::new(p.clone(), w.clone(), 0)?;
        let clock = Instant::now();
        let r2 = terminal.round2(&r1, &verify, &mut rng)?;
        t2 += clock.elapsed().as_secs_f64();
        let mut session = device.session();
        let clock = Instant::now();
        let r3 = session.round3(&r2, &mut rng)?;
        t3 += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let r4 = terminal.round4(&r3, &mut rng)?;
        t4 += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let (r5, _) = session.round5(&r4)?;
        t5 += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let bit = terminal.finish(&r5)?;
        t6 += clock.elapsed().as_secs_f64();
        if bit != (expected >= 0) {
            return Err("Π3 gave another comparison than the plaintext".into());
        }
    }
    println!(
        "Π3: round 2 (T) {}  round 3 (D) {}  round 4 (T) {}  round 5 (D) {}  output (T) {}",
        per_run(t2, runs, encryption),
        per_run(t3, runs, encryption),
        per_run(t4, runs, encryption),
        per_run(t5, runs, encryption),
        per_run(t6, runs, encryption)
    );
    Ok(())
}
