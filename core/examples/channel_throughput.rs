//! Throughput of the pairwise channel (`crypto::seal::Channel`, AES-256-GCM) against the
//! XChaCha20-Poly1305 construction of privmatch 0.10, on one core, for a round message of
//! the size an iris search with 31 rotations sends at N = 100,000 (about 25 MB).
//!
//! `cargo run --release -p privmatch-core --example channel_throughput [MB] [reps]`

use std::time::Instant;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use privmatch_core::crypto::seal::{PairwiseSecrets, PartySecretKey};
use privmatch_core::party::PartyIndex;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(25);
    let reps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(7);
    let mut rng = StdRng::seed_from_u64(1);
    let mut payload = vec![0u8; mb << 20];
    rng.fill_bytes(&mut payload);
    let (p0, p1) = (PartyIndex::ALL[0], PartyIndex::ALL[1]);
    let (k0, k1) = (
        PartySecretKey::generate(&mut rng),
        PartySecretKey::generate(&mut rng),
    );
    let a = PairwiseSecrets::derive(p0, &k0, p1, &k1.public_key()).expect("derive");
    let b = PairwiseSecrets::derive(p1, &k1, p0, &k0.public_key()).expect("derive");

    let mut channel_s = Vec::new();
    for rep in 0..reps {
        let session = [rep as u8; 16];
        let (mut tx, mut rx) = (a.channel(session), b.channel(session));
        let t = Instant::now();
        let sealed = tx.seal(0, &payload, &mut rng);
        let opened = rx.open(0, &sealed).expect("open");
        channel_s.push(t.elapsed().as_secs_f64());
        assert_eq!(opened.len(), payload.len());
    }

    let cipher = XChaCha20Poly1305::new(&[9u8; 32].into());
    let mut legacy_s = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let nonce = [3u8; 24];
        let ct = cipher
            .encrypt(
                &nonce.into(),
                Payload {
                    msg: &payload,
                    aad: b"h",
                },
            )
            .expect("seal");
        let pt = cipher
            .decrypt(
                &nonce.into(),
                Payload {
                    msg: &ct,
                    aad: b"h",
                },
            )
            .expect("open");
        legacy_s.push(t.elapsed().as_secs_f64());
        assert_eq!(pt.len(), payload.len());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (c, l) = (median(&mut channel_s), median(&mut legacy_s));
    let gbps = |s: f64| (2 * payload.len()) as f64 / s / 1e9;
    println!("message {mb} MiB, seal + open, median of {reps}, one core");
    println!(
        "  channel (AES-256-GCM, ring)      {:8.2} ms  {:6.2} GB/s",
        c * 1e3,
        gbps(c)
    );
    println!(
        "  XChaCha20-Poly1305 (0.10)        {:8.2} ms  {:6.2} GB/s",
        l * 1e3,
        gbps(l)
    );
    println!("  ratio                            {:8.2} x", l / c);
}
