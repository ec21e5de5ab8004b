//! Benchmark of the two building blocks of Π3's comparison (Agrawal, Badrinarayanan,
//! Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020, ePrint 2020/1363, Π3): the half-gates
//! garbling of its match-check circuit (Zahur, Rosulek, Evans, ePrint 2014/756) and the 256
//! oblivious transfers of the evaluator's input labels (`crypto::ot`).
//!
//! `cargo run --release -p privmatch-core --example garble_match_check -- [reps]`
//!
//! Prints the circuit's size and the mean garbling and evaluation times over `reps` runs
//! (default 20), each next to the fixed-key AES floor measured in the same run: garbling
//! hashes four blocks per AND gate and evaluation two, so the ratios say how far the
//! garbler and the evaluator are from the cipher they are built on. Every run's output is
//! decoded and checked (the inputs are consistent, so both checks must say "match"). Then
//! 256 OTs, each run's received labels checked against the choices, next to one Ristretto
//! scalar multiplication measured in the same run (the unit an OT is built from).

use std::hint::black_box;
use std::time::Instant;

use privmatch_core::crypto::fss::aes;
use privmatch_core::paillier::circuit::{match_check_circuit, MatchCheckWidths};
use privmatch_core::paillier::garble::{evaluate, garble, GarbledCircuit, Label};
use privmatch_core::paillier::ot::{OtReceiver, OtSender};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// OTs per run: one per input bit of the evaluator at ℓ = 256.
const OTS: usize = 256;

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
    oblivious_transfers(reps, &mut rng)
}

/// Times `reps` runs of [`OTS`] oblivious transfers and checks each.
fn oblivious_transfers(reps: u32, rng: &mut ChaCha20Rng) -> Result<(), Box<dyn std::error::Error>> {
    let label = |rng: &mut ChaCha20Rng| {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        Label::from_bytes(bytes)
    };
    let mut scalar = [0u8; 64];
    rng.fill_bytes(&mut scalar);
    let s = curve25519_dalek::Scalar::from_bytes_mod_order_wide(&scalar);
    // Many more base multiplications than OT runs: one takes tens of µs, too short to time alone.
    let unit = mean(reps.saturating_mul(100), || {
        std::hint::black_box(curve25519_dalek::RistrettoPoint::mul_base(&s));
    });
    let (mut receive, mut send, mut finish) = (0.0, 0.0, 0.0);
    let mut bytes = 0;
    for _ in 0..reps {
        let choices: Vec<bool> = (0..OTS).map(|_| rng.next_u32() & 1 == 1).collect();
        let pairs: Vec<(Label, Label)> = (0..OTS).map(|_| (label(rng), label(rng))).collect();
        let t0 = Instant::now();
        let (receiver, request) = OtReceiver::new(b"bench", &choices, rng);
        let t1 = Instant::now();
        let reply = OtSender::respond(b"bench", &request, &pairs, rng)?;
        let t2 = Instant::now();
        let got = receiver.finish(&reply)?;
        let t3 = Instant::now();
        let right = got
            .iter()
            .zip(&pairs)
            .zip(&choices)
            .all(|((l, (l0, l1)), &c)| l == if c { l1 } else { l0 });
        if !right {
            return Err("an OT delivered the wrong label".into());
        }
        receive += (t1 - t0).as_secs_f64();
        send += (t2 - t1).as_secs_f64();
        finish += (t3 - t2).as_secs_f64();
        bytes = request.to_bytes().len() + reply.to_bytes().len();
    }
    let per = |t: f64| t / f64::from(reps);
    println!(
        "{OTS} OTs: receiver message {:.2} ms, sender {:.2} ms, receiver finish {:.2} ms ({:.0}, {:.0}, {:.0} base multiplications of {:.1} µs); {bytes} bytes",
        per(receive) * 1e3,
        per(send) * 1e3,
        per(finish) * 1e3,
        per(receive) / unit,
        per(send) / unit,
        per(finish) / unit,
        unit * 1e6
    );
    Ok(())
}
