//! The device-template enrolment Π_en of Agrawal, Badrinarayanan, Mukherjee, Rindal,
//! "Game-Set-MATCH" (CCS 2020, ePrint 2020/1363, §6.1 and §8; [ABMR20] §9 reports 2.2 s of
//! encryption and 5.0 s of proofs on a laptop) for Π2 at ℓ = 256, m = 16, run end to end
//! through the state machines the CLI and the parties use — the device's request
//! (`DeviceEnrolment::start_parallel`: slack, encryption of ℓ + 4 coordinates, plaintext-
//! knowledge and key proofs), the service provider's checks and norm challenge
//! (`ServiceEnrolment::receive_parallel`), the device's response, the SP's check, packing and
//! signature, the device's check — on 1 thread and on every core, fixed seeds.
//!
//! `cargo run --release -p privmatch-core --example paillier_enrolment -- [bits] [runs]`
//!
//! Prints each step's median over `runs` enrolments (default 3) at |N| = `bits` (default
//! 3072) per thread count, and the ratio of the whole enrolment on 1 thread to that on all.

use std::time::Instant;

use ed25519_dalek::SigningKey;
use privmatch_core::paillier::cipher::SecretKey;
use privmatch_core::paillier::enroll::{DeviceEnrolment, ServiceEnrolment};
use privmatch_core::paillier::key_proof::RingPedersenParams;
use privmatch_core::paillier::params::{Params, Protocol, DEFAULT_STAT_BITS};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

const DIM: usize = 256;
const VALUE_BITS: u32 = 16;

type Failure = Box<dyn std::error::Error>;

/// Seconds of each step of one enrolment: device request, SP receive, device response, SP
/// finish, device finish.
type Steps = [f64; 5];

const STEP_NAMES: [&str; 5] = [
    "device request (encryption + proofs)",
    "SP checks + norm challenge",
    "device norm response",
    "SP check, packing, signature",
    "device check of the signed record",
];

fn template(rng: &mut ChaCha20Rng) -> Vec<i32> {
    let half = 1i64 << (VALUE_BITS - 2);
    (0..DIM)
        .map(|_| (i64::from(rng.next_u32()) % (2 * half) - half) as i32)
        .collect()
}

/// One enrolment of `u` on `threads` threads; every step is checked.
fn enrol(
    sk: &SecretKey,
    params: &Params,
    aux: &RingPedersenParams,
    sp: &SigningKey,
    u: &[i32],
    threads: usize,
    rng: &mut ChaCha20Rng,
) -> Result<Steps, Failure> {
    let session = [7u8; 16];
    let mut steps = [0.0; 5];
    let clock = Instant::now();
    let (device, request) = DeviceEnrolment::start_parallel(
        sk,
        params,
        "bench-device",
        u,
        aux,
        &session,
        threads,
        rng,
    )?;
    steps[0] = clock.elapsed().as_secs_f64();
    let clock = Instant::now();
    let (service, challenge) =
        ServiceEnrolment::receive_parallel(&request, params, aux, &session, threads, rng)?;
    steps[1] = clock.elapsed().as_secs_f64();
    let challenge = challenge.ok_or("Π2 enrolment without a norm challenge")?;
    let clock = Instant::now();
    let response = device.respond(&challenge)?;
    steps[2] = clock.elapsed().as_secs_f64();
    let now = 1_800_000_000;
    let clock = Instant::now();
    let signed = service.finish(Some(&response), sp, now + 3600)?;
    steps[3] = clock.elapsed().as_secs_f64();
    let clock = Instant::now();
    device.finish(&signed.to_bytes()?, &sp.verifying_key(), now)?;
    steps[4] = clock.elapsed().as_secs_f64();
    Ok(steps)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<(), Failure> {
    let mut args = std::env::args().skip(1);
    let bits: u32 = match args.next() {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("bits: not a number: {arg}"))?,
        None => 3072,
    };
    let runs: usize = match args.next() {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("runs: not a count: {arg}"))?,
        None => 3,
    };
    let runs = runs.max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rng = ChaCha20Rng::seed_from_u64(u64::from(bits));
    let clock = Instant::now();
    let aux = RingPedersenParams::generate(2048, &mut rng)?;
    let sk = SecretKey::generate(bits, &mut rng)?;
    println!(
        "SP's 2048-bit ring-Pedersen parameters and the device's {bits}-bit key: {:.1} s (once)",
        clock.elapsed().as_secs_f64()
    );
    let params = Params::new(
        Protocol::Pi2,
        DIM,
        VALUE_BITS,
        bits,
        DEFAULT_STAT_BITS,
        Params::max_norm_bound(DIM, VALUE_BITS),
    )?;
    let sp = SigningKey::from_bytes(&[9u8; 32]);
    let u = template(&mut rng);
    let mut totals = Vec::new();
    let thread_counts: Vec<usize> = if cores > 1 { vec![1, cores] } else { vec![1] };
    for &threads in &thread_counts {
        let mut per_step: Vec<Vec<f64>> = vec![Vec::new(); 5];
        let mut whole = Vec::new();
        for _ in 0..runs {
            let steps = enrol(&sk, &params, &aux, &sp, &u, threads, &mut rng)?;
            for (all, step) in per_step.iter_mut().zip(steps) {
                all.push(step);
            }
            whole.push(steps.iter().sum::<f64>());
        }
        let whole = median(whole);
        println!("Π2 enrolment, ℓ = {DIM}, m = {VALUE_BITS}, |N| = {bits}, {threads} thread(s), median of {runs}:");
        for (name, values) in STEP_NAMES.iter().zip(per_step) {
            println!("  {name:40} {:9.1} ms", median(values) * 1e3);
        }
        println!("  {:40} {:9.1} ms", "whole enrolment", whole * 1e3);
        totals.push((threads, whole));
    }
    if let [(_, one), .., (all, many)] = totals.as_slice() {
        println!(
            "whole enrolment on {all} threads against 1: {:.2}× faster",
            one / many
        );
    }
    Ok(())
}
