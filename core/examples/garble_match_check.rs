//! Benchmark of the half-gates garbling of Π3's match-check circuit (Agrawal, Bhattacharya,
//! Mishra, Rindal, "Secure Biometric Authentication on Device-Held Templates", ePrint
//! 2020/1126, Π3; half-gates of Zahur, Rosulek, Evans, ePrint 2014/756).
//!
//! `cargo run --release -p privmatch-core --example garble_match_check -- [reps]`
//!
//! Prints the circuit's size and the mean garbling and evaluation times over `reps` runs
//! (default 20), each next to the fixed-key AES floor measured in the same run: garbling
//! hashes four blocks per AND gate and evaluation two, so the ratios say how far the
//! garbler and the evaluator are from the cipher they are built on. Every run's output is
//! decoded and checked (the inputs are consistent, so both checks must say "match").

use std::hint::black_box;
use std::time::Instant;

use privmatch_core::crypto::circuit::{match_check_circuit, MatchCheckWidths};
use privmatch_core::crypto::fss::aes;
use privmatch_core::crypto::garble::{evaluate, garble, GarbledCircuit};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// Mean wall time in seconds of `reps` runs of `f`.
fn mean<F: FnMut()>(reps: u32, mut f: F) -> f64 {
    let start = Instant::now();
    for _ in 0..reps {
        f();
    }
    start.elapsed().as_secs_f64() / f64::from(reps.max(1))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: u32 = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("reps: not a count: {arg}"))?,
        None => 20,
    };
    let reps = reps.max(1);
    // IP below 2^41, the hash modulus P = 2^61 − 1, a threshold of 1000.
    let widths = MatchCheckWidths::new(41, 40)?;
    let circuit = match_check_circuit(widths, 1000)?;
    // One consistent input: X = IP + pad mod 2^41, Y = a·IP + b mod P, c = b − a·2^40 mod P.
    let p: u128 = (1 << 61) - 1;
    let (ip, pad, a, b): (u128, u128, u128, u128) = (4321, (1 << 40) + 11, 0x1234_5678, 7);
    let x = (pad + ip) % (1 << 41);
    let y = (a * ip + b) % p;
    let c = (b + p - (a * (1 << 40)) % p) % p;
    let garbler_bits =
        widths.garbler_bits(&pad.to_le_bytes(), &a.to_le_bytes(), &c.to_le_bytes())?;
    let evaluator_bits = widths.evaluator_bits(&x.to_le_bytes(), &y.to_le_bytes())?;
    let mut rng = ChaCha20Rng::seed_from_u64(8);

    let and_gates = circuit.and_count();
    let mut blocks = vec![0u128; 4 * and_gates];
    let aes_garble = mean(reps, || aes::fixed_encrypt(black_box(&mut blocks)));
    let aes_evaluate = aes_garble / 2.0;

    let (mut garbling, mut evaluation) = (0.0, 0.0);
    for _ in 0..reps {
        let start = Instant::now();
        let (garbled, secrets) = garble(&circuit, &mut rng);
        let garbled_at = Instant::now();
        let out = evaluate(
            &circuit,
            &garbled,
            &secrets.garbler_input_labels(&garbler_bits)?,
            &secrets.evaluator_input_labels(&evaluator_bits)?,
        )?;
        let evaluated_at = Instant::now();
        if secrets.decode_output(&out)? != vec![true, true] {
            return Err("the garbled match check did not decode to a match".into());
        }
        garbling += (garbled_at - start).as_secs_f64();
        evaluation += (evaluated_at - garbled_at).as_secs_f64();
    }
    let (garbling, evaluation) = (garbling / f64::from(reps), evaluation / f64::from(reps));
    println!(
        "match-check circuit: {and_gates} AND gates, {} bytes of tables; AES backend {}",
        GarbledCircuit::byte_len(&circuit),
        aes::backend().name()
    );
    println!(
        "garble   {:8.3} ms  ({:.2}× the AES floor of {:.3} ms)",
        garbling * 1e3,
        garbling / aes_garble,
        aes_garble * 1e3
    );
    println!(
        "evaluate {:8.3} ms  ({:.2}× the AES floor of {:.3} ms)   mean of {reps}",
        evaluation * 1e3,
        evaluation / aes_evaluate,
        aes_evaluate * 1e3
    );
    Ok(())
}
