//! The terminal's offline tables per device (`paillier::precomputed`) against their NAF
//! window: offline time, size, and the median time of Round 2's homomorphic inner product
//! with them, for a Π1 template at ℓ = 256, m = 16, |N| = 2048 and 3072 (fixed seed). Each
//! table's result is checked against the online Horner path.
//!
//! `cargo run --release -p privmatch-core --example paillier_tables`

use privmatch_core::paillier::cipher::{Ciphertext, SecretKey};
use privmatch_core::paillier::encoding::{encode_template, homomorphic_inner_product};
use privmatch_core::paillier::params::{Layout, Params, Protocol, DEFAULT_STAT_BITS};
use privmatch_core::paillier::precomputed::PrecomputedTemplate;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use std::time::Instant;

const DIM: usize = 256;
const VALUE_BITS: u32 = 16;
const SESSIONS: usize = 15;

fn random_vector(rng: &mut ChaCha20Rng) -> Vec<i32> {
    let half = 1i64 << (VALUE_BITS - 1);
    (0..DIM)
        .map(|_| ((rng.next_u64() % (2 * half as u64)) as i64 - half) as i32)
        .collect()
}

fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// The median and the fastest time of the inner product with `tables` over fresh
/// measurements (on a shared machine the minimum is the steadier figure).
fn median_session_ms(
    sk: &SecretKey,
    layout: &Layout,
    cts: &[Ciphertext],
    tables: &PrecomputedTemplate,
    rng: &mut ChaCha20Rng,
) -> (f64, f64) {
    let pk = sk.public_key();
    let mut times: Vec<f64> = (0..SESSIONS)
        .map(|_| {
            let w = random_vector(rng);
            let start = Instant::now();
            let fast = tables
                .inner_product(pk, layout, cts, &w)
                .expect("inner product");
            let elapsed = ms_since(start);
            let online = homomorphic_inner_product(pk, layout, cts, &w).expect("online");
            assert_eq!(fast, online, "tables and the online path differ");
            elapsed
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[SESSIONS / 2], times[0])
}

fn main() {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    println!("| \\|N\\| | window W | offline ms | MiB | Round 2 inner product ms: median of {SESSIONS} / fastest |");
    println!("|---|---|---|---|---|");
    for bits in [2048u32, 3072] {
        let sk = SecretKey::generate(bits, &mut rng).expect("keygen");
        let pk = sk.public_key();
        let norm = Params::max_norm_bound(DIM, VALUE_BITS);
        let params = Params::new(
            Protocol::Pi1,
            DIM,
            VALUE_BITS,
            bits,
            DEFAULT_STAT_BITS,
            norm,
        )
        .expect("params");
        let layout = params.layout();
        let u = random_vector(&mut rng);
        let cts: Vec<Ciphertext> = encode_template(layout, "u", &u)
            .expect("template")
            .iter()
            .map(|x| {
                sk.encrypt(&pk.reduce_signed(x).expect("fits"), &mut rng)
                    .expect("enc")
            })
            .collect();
        for window in [4u32, 5, 6, 7] {
            let start = Instant::now();
            let tables =
                PrecomputedTemplate::with_window(pk, layout, &cts, window).expect("tables");
            let offline = ms_since(start);
            let (median, fastest) = median_session_ms(&sk, layout, &cts, &tables, &mut rng);
            println!(
                "| {bits} | {window} | {offline:.0} | {:.1} | {median:.2} / {fastest:.2} |",
                tables.table_bytes() as f64 / f64::from(1u32 << 20)
            );
        }
    }
}
