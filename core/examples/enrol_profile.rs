//! Where the time of Π_en goes ([ABMR20] §6.1, §8), step by step, on one core, for ℓ = 256,
//! m = 16 and |N| = 2048 and 3072 (fixed seed): the device's encryption, plaintext-knowledge
//! proof and key proof; the SP's checks of both proofs, its fresh N-th powers and the rest of
//! the norm challenge; the device's norm response. Each figure is one run. Then the cost of
//! one device signature of a relay message and of its check.
//!
//! `taskset -c 1 cargo run --release -p privmatch-core --example enrol_profile`

use privmatch_core::paillier::cipher::{NoncePool, SecretKey};
use privmatch_core::paillier::device_signature::{self, DeviceSigner, Statement};
use privmatch_core::paillier::key_proof::{KeyProof, RingPedersenParams};
use privmatch_core::paillier::params::Params;
use privmatch_core::paillier::proofs::{
    encrypt_template_with_nonces, template_with_slack, L2Response, L2Verifier,
    PlaintextKnowledgeProof,
};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use rug::Integer;
use std::time::Instant;

const DIM: usize = 256;
const VALUE_BITS: u32 = 16;

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    println!(
        "  {what:<44} {:>9.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    out
}

fn main() {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let aux = timed("SP ring-Pedersen parameters (once per SP)", || {
        RingPedersenParams::generate(2048, &mut rng).expect("aux")
    });
    for bits in [2048u32, 3072] {
        println!("|N| = {bits}, ℓ = {DIM}, m = {VALUE_BITS}");
        let sk = SecretKey::generate(bits, &mut rng).expect("key");
        let pk = sk.public_key().clone();
        let bound = Params::max_norm_bound(DIM, VALUE_BITS);
        let half = 1i64 << (VALUE_BITS - 2);
        let u: Vec<i64> = (0..DIM)
            .map(|_| (rng.next_u64() % (2 * half as u64)) as i64 - half)
            .collect();
        let values =
            template_with_slack(&u, bound.to_u64().expect("bound"), &mut rng).expect("slack");
        let session = b"profile";
        let (cts, nonces) = timed("device: encrypt ℓ + 4 (CRT)", || {
            encrypt_template_with_nonces(&sk, &values, &mut rng).expect("encrypt")
        });
        let pok = timed("device: plaintext-knowledge proof", || {
            PlaintextKnowledgeProof::prove(&sk, session, &cts, &values, &nonces, &mut rng)
                .expect("pok")
        });
        let key_proof = timed("device: key proof (Π^mod, Π^fac)", || {
            KeyProof::prove(&sk, session, &aux, &mut rng).expect("key proof")
        });
        timed("SP: key proof check", || {
            key_proof.verify(&pk, session, &aux).expect("key ok")
        });
        timed("SP: plaintext-knowledge check", || {
            pok.verify(&pk, session, &cts).expect("pok ok")
        });
        let y = Integer::from(&bound);
        let mut pool = NoncePool::new(pk.clone());
        timed("SP: ℓ + 6 fresh N-th powers", || {
            pool.fill_public(cts.len() + 2, &mut rng)
        });
        let (verifier, challenge) = timed("SP: rest of the norm challenge", || {
            L2Verifier::challenge_with_pool(&pk, &cts, &y, &mut pool, 1, &mut rng)
                .expect("challenge")
        });
        let response = timed("device: norm response (ℓ + 6 decryptions)", || {
            L2Response::respond(&sk, &challenge).expect("respond")
        });
        timed("SP: norm check", || {
            verifier.check(&response).expect("norm ok")
        });
        // The device's signatures of its relay messages (device_signature): median of 21.
        let signer = DeviceSigner::new(&sk).expect("signer");
        let statements: Vec<Statement> = (0..21)
            .map(|i| Statement::mailbox("profile-device", i))
            .collect();
        let mut sign_ms = Vec::new();
        let mut check_ms = Vec::new();
        for statement in &statements {
            let start = Instant::now();
            let signature = signer.sign(statement).expect("sign");
            sign_ms.push(start.elapsed().as_secs_f64() * 1e3);
            let start = Instant::now();
            device_signature::verify(&pk, statement, &signature).expect("verifies");
            check_ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
        for (what, times) in [
            ("device: one signature, median of 21", &mut sign_ms),
            ("coordinator: one check, median of 21", &mut check_ms),
        ] {
            times.sort_by(f64::total_cmp);
            println!("  {what:<44} {:>9.1} ms", times[times.len() / 2]);
        }
    }
}
