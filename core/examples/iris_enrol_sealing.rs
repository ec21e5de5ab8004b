//! How fast a client shares and seals iris enrolments (`seal_iris_enrollment_batch`): batches
//! of 250 synthetic templates (the CLI's default batch), sealed to three fresh party keys,
//! on one thread and then on every thread count up to the one asked for; medians of
//! `repetitions` runs, and the ratio of each against one thread measured in the same run.
//!
//! `cargo run --release -p privmatch-core --example iris_enrol_sealing -- [records] [repetitions] [max_threads]`

use std::time::Instant;

use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::enroll::{seal_iris_enrollment_batch_on, EnrollRequest, Eye};
use privmatch_core::iris::synth::random_template;
use privmatch_core::iris::template::IrisTemplate;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

const BATCH: usize = 250;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// Seconds to seal every record once, batch by batch, on `threads` threads.
fn seal_all(
    templates: &[IrisTemplate],
    subjects: &[String],
    keys: &[PartyPublicKey; 3],
    threads: usize,
) -> f64 {
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    let started = Instant::now();
    for (chunk, names) in templates.chunks(BATCH).zip(subjects.chunks(BATCH)) {
        let requests: Vec<EnrollRequest<'_>> = chunk
            .iter()
            .zip(names)
            .map(|(template, subject)| EnrollRequest {
                template,
                subject,
                eye: Eye::Left,
            })
            .collect();
        let sealed = seal_iris_enrollment_batch_on(&requests, keys, threads, &mut rng)
            .expect("synthetic records seal");
        std::hint::black_box(sealed);
    }
    started.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let records = arg(1, 5_000);
    let repetitions = arg(2, 3).max(1);
    let max_threads = arg(3, 2).max(1);
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let keys = [0, 1, 2].map(|_| PartySecretKey::generate(&mut rng).public_key());
    let templates: Vec<IrisTemplate> = (0..records).map(|_| random_template(&mut rng)).collect();
    let subjects: Vec<String> = (0..records).map(|i| format!("subject-{i:07}")).collect();
    println!("sealing {records} iris enrolments in batches of {BATCH}, medians of {repetitions}");
    // Alternate the thread counts within each repetition so drift hits them alike.
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); max_threads];
    for _ in 0..repetitions {
        for threads in 1..=max_threads {
            times[threads - 1].push(seal_all(&templates, &subjects, &keys, threads));
        }
    }
    let one = median(times[0].clone());
    for (i, t) in times.into_iter().enumerate() {
        let t = median(t);
        println!(
            "  {} thread(s): {:>8.3} s, {:>9.0} records/s, {:.2} x one thread",
            i + 1,
            t,
            records as f64 / t,
            one / t
        );
    }
}
