//! Benchmark of the MPC part of one iris search (everything after the local dot products):
//! three in-process parties, random dot-product shares for N entries × R rotations, one
//! thread, messages passed in memory. Prints the time per round summed over the three
//! parties, the total, and the bytes each party sends.
//!
//! `cargo run --release -p privmatch-core --example match_rounds -- [N] [R] [identify|uniqueness]`

use std::time::{Duration, Instant};

use privmatch_core::crypto::seal::PairwisePrf;
use privmatch_core::iris::dot::DotShares;
use privmatch_core::iris::matcher::{IrisMatchSession, MatchConfig, MatchOutput};
use privmatch_core::iris::mpc::binary::{MpcContext, Step};
use privmatch_core::iris::params::SearchMode;
use privmatch_core::party::PartyIndex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

fn contexts() -> [MpcContext; 3] {
    let prfs: [PairwisePrf; 3] = std::array::from_fn(|i| PairwisePrf::from_seed([i as u8; 32]));
    PartyIndex::ALL.map(|p| {
        MpcContext::new(
            p,
            [7; 16],
            prfs[p.as_usize()].clone(),
            prfs[p.prev().as_usize()].clone(),
        )
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let r: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(31);
    let mode = match args.get(3).map(String::as_str) {
        Some("uniqueness") => SearchMode::Uniqueness,
        _ => SearchMode::Identify,
    };
    let mut config = MatchConfig::new(mode);
    config.max_rotation = (r as i32 - 1) / 2;
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let ctx = contexts();
    let mut steps: Vec<Step<IrisMatchSession, Vec<MatchOutput>>> = Vec::new();
    let started = Instant::now();
    for c in &ctx {
        let dots = DotShares {
            num_rotations: r,
            num_entries: n,
            code: (0..n * r).map(|_| rng.gen()).collect(),
            mask: (0..n * r).map(|_| rng.gen()).collect(),
        };
        steps.push(IrisMatchSession::start_with_dots(c, &config, dots).expect("start"));
    }
    let mut per_round: Vec<Duration> = vec![started.elapsed()];
    let mut bytes = 0usize;
    loop {
        if steps.iter().all(|s| matches!(s, Step::Done(_))) {
            break;
        }
        let payloads: Vec<Vec<u8>> = steps
            .iter()
            .map(|s| match s {
                Step::Send(_, out) => out.payload.clone(),
                Step::Done(_) => Vec::new(),
            })
            .collect();
        bytes += payloads[0].len();
        let t = Instant::now();
        steps = steps
            .into_iter()
            .map(|s| match s {
                Step::Send(session, _) => {
                    let from = session.party().prev();
                    session
                        .receive(from, &payloads[from.as_usize()])
                        .expect("round")
                }
                done => done,
            })
            .collect();
        per_round.push(t.elapsed());
    }
    let total: Duration = per_round.iter().sum();
    println!(
        "N = {n}, R = {r}, {mode:?}: {} rounds, {:.3} s for three parties on one thread ({:.0} comparisons/s per party-thread), {bytes} bytes sent per party",
        per_round.len() - 1,
        total.as_secs_f64(),
        (n * r) as f64 * 3.0 / total.as_secs_f64()
    );
    let ms: Vec<String> = per_round
        .iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
        .collect();
    println!("per round (ms, start first): {}", ms.join(" "));
}
