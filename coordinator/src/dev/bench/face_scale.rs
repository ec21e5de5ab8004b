//! `privmatch bench face --part scale`: 1:N at scale with dealer-masked templates
//! (`privmatch_core::face::masked`), in process, against the plaintext 1:N and the
//! per-comparison Funshade protocol (`privmatch_core::face::funshade`, both inputs masked per
//! comparison: what a 1:N cost before) over the same templates, in the same run.
//!
//! For each N (`--scale-n`, default 10,000 and 100,000) at dimension `--dim`: N synthetic
//! templates (half re-captures of the probe's face) are shared and opened once into both
//! evaluators' in-memory sets (timed once: a one-time cost per enrolment); the dealer deals
//! one identification's keys (preprocessing, timed); the evaluators decode them (timed); then
//! the online part — probe round, distance round and sign round of P0 and of P1, one after
//! the other on this machine, each on `--threads` threads, and the reconstruction — is timed
//! over `--identifies` identifications, each with fresh keys (single use), median reported.
//! The per-comparison protocol runs once over the same N on one thread per evaluator (as a
//! session did before). Every run's bits must equal the plaintext reference.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use privmatch_core::face::dealer::DealerConfig;
use privmatch_core::face::encoding::{share_embedding, EmbeddingShare};
use privmatch_core::face::funshade::{
    deal_batch, distance_shares, masked_inputs, open_masked, reconstruct, sign_shares,
    DealerParams, KeySlice,
};
use privmatch_core::face::masked::{
    deal_identification, distance_round, open_templates_in_process, probe_round, sign_round,
    IdentificationKeys, MaskedTemplateSet, TemplateMaskMaster, BUNDLE_ID_LEN,
    IDENTIFICATION_HEADER_LEN, MASKED_KEY_LEN, ONLINE_BYTES_PER_COMPARISON,
};
use privmatch_core::face::{FaceError, Metric};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;

use super::face::{bench_set, machine, per, plaintext_scan, quantized_threshold, FaceBenchArgs};
use super::stats::median;

/// The per-comparison protocol over the same templates (before dealer-masked templates).
#[derive(Clone, Debug, Serialize)]
pub struct PerComparisonFigures {
    /// Online 1:N time: both evaluators' rounds one after the other, one thread each (s).
    pub online_s: f64,
    /// Comparisons per second of that.
    pub comparisons_per_s: f64,
    /// online_s over the plaintext 1:N time.
    pub over_plaintext: f64,
    /// Online bytes per comparison per party (8·l + 4 + 4).
    pub online_bytes_per_comparison: usize,
    /// Preprocessing bytes per comparison per party.
    pub preprocessing_bytes_per_comparison: usize,
}

/// The figures of one N.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleFigures {
    /// Templates compared.
    pub n: usize,
    /// Dimension l.
    pub dim: usize,
    /// Metric.
    pub metric: String,
    /// Threads per evaluator.
    pub threads: usize,
    /// Templates that matched (the plaintext reference agreed on every one).
    pub matches: usize,
    /// Plaintext 1:N over the same quantised templates, one thread, best of 3 (s).
    pub plaintext_s: f64,
    /// One-time opening of all N templates into both sets, in process (s).
    pub open_templates_s: f64,
    /// Bytes each evaluator sends once per template at that opening (4·l).
    pub open_bytes_per_template: usize,
    /// Dealer: one identification's keys, both halves (s, median).
    pub deal_s: f64,
    /// Each evaluator decoding its half (s, median, P0 and P1).
    pub decode_s: [f64; 2],
    /// Preprocessing bytes per comparison per party (key + the header spread over N).
    pub preprocessing_bytes_per_comparison: f64,
    /// Online 1:N time (s, median): both evaluators' rounds one after the other on this
    /// machine, plus the reconstruction.
    pub online_s: f64,
    /// Of which each evaluator's rounds (s, median, P0 and P1).
    pub online_party_s: [f64; 2],
    /// Of which the probe, distance and sign rounds, both evaluators together (s, median).
    pub online_round_s: [f64; 3],
    /// Comparisons per second of online_s.
    pub comparisons_per_s: f64,
    /// online_s over plaintext_s.
    pub online_over_plaintext: f64,
    /// Online bytes per party per identification for the probe's one vector (4·l).
    pub probe_bytes: usize,
    /// Online bytes per comparison per party beyond that (z_b and o_b).
    pub online_bytes_per_comparison: usize,
    /// Identifications timed.
    pub identifications: usize,
    /// The per-comparison protocol over the same templates, if run.
    pub per_comparison: Option<PerComparisonFigures>,
}

fn fe(e: FaceError) -> anyhow::Error {
    anyhow!("{e}")
}

/// `privmatch bench face --part scale`.
pub async fn run(args: &FaceBenchArgs) -> Result<()> {
    let metric = Metric::parse(&args.metric).map_err(|e| anyhow!("--metric: {e}"))?;
    if !(args.noise.is_finite() && args.noise >= 0.0) {
        bail!("--noise must be a non-negative number");
    }
    let machine = machine();
    let threads = if args.threads == 0 {
        machine.cpus
    } else {
        args.threads
    };
    let mut figures = Vec::with_capacity(args.scale_n.len());
    for &n in &args.scale_n {
        eprintln!("scale: N = {n}, l = {}", args.dim);
        let a = args.clone();
        let f = tokio::task::spawn_blocking(move || {
            scale(
                metric,
                a.dim,
                n,
                a.threshold,
                a.noise,
                a.seed,
                threads,
                a.identifies,
                !a.no_baseline,
            )
        })
        .await
        .context("the scale benchmark thread failed")??;
        figures.push(f);
    }
    if args.json {
        let report = serde_json::json!({ "machine": machine, "scale": figures });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{} ({} logical CPUs)", machine.cpu, machine.cpus);
        print_scale(&figures);
    }
    Ok(())
}

/// Figures of one N (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn scale(
    metric: Metric,
    dim: usize,
    n: usize,
    threshold: f64,
    noise: f64,
    seed: u64,
    threads: usize,
    identifications: usize,
    baseline: bool,
) -> Result<ScaleFigures> {
    if n == 0 || identifications == 0 {
        bail!("--scale-n and --identifies must be at least 1");
    }
    let (probe, templates) = bench_set(dim, n, noise, seed)?;
    let theta = quantized_threshold(metric, dim, threshold)?;
    let (expected, plaintext) = plaintext_scan(metric, &probe, &templates, theta);
    let mut want = vec![false; n];
    for &i in &expected {
        want[i] = true;
    }
    let params = DealerParams::new(&DealerConfig {
        metric,
        dim,
        threshold,
    })
    .map_err(fe)?;
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x5ca1_e000);
    let shared: Vec<([u8; BUNDLE_ID_LEN], [EmbeddingShare; 2])> = templates
        .iter()
        .map(|t| {
            let mut id = [0u8; BUNDLE_ID_LEN];
            rng.fill_bytes(&mut id);
            (id, share_embedding(t, &mut rng))
        })
        .collect();
    let master = TemplateMaskMaster::generate(&mut rng);
    let started = Instant::now();
    let sets = open_templates_in_process(&master, &shared, dim).map_err(fe)?;
    let open_templates = started.elapsed();

    let mut deal = Vec::new();
    let mut decode = [Vec::new(), Vec::new()];
    let mut online = Vec::new();
    let mut party = [Vec::new(), Vec::new()];
    let mut rounds = [Vec::new(), Vec::new(), Vec::new()];
    for k in 0..identifications {
        let probe_shares = share_embedding(&probe, &mut rng);
        let started = Instant::now();
        let halves = deal_identification(&params, &master, sets[0].ids(), &mut rng).map_err(fe)?;
        deal.push(started.elapsed());
        let mut keys = Vec::with_capacity(2);
        for (b, half) in halves.iter().enumerate() {
            let started = Instant::now();
            keys.push(IdentificationKeys::decode(b, half).map_err(fe)?);
            decode[b].push(started.elapsed());
        }
        let run = online_run(&keys, &sets, &probe_shares, threads)?;
        if run.bits != want {
            let wrong = run.bits.iter().zip(&want).filter(|(a, b)| a != b).count();
            bail!("N = {n}, identification {k}: {wrong} bits differ from the plaintext reference");
        }
        online.push(run.total);
        for (times, took) in party.iter_mut().zip(run.party) {
            times.push(took);
        }
        for (times, took) in rounds.iter_mut().zip(run.rounds) {
            times.push(took);
        }
    }
    let secs = |v: &[Duration]| median(v.iter().map(Duration::as_secs_f64).collect());
    let online_s = secs(&online);
    let plaintext_s = plaintext.as_secs_f64();
    let per_comparison = if baseline {
        Some(per_comparison_run(
            &params,
            &probe,
            &shared,
            &want,
            plaintext_s,
            &mut rng,
        )?)
    } else {
        None
    };
    Ok(ScaleFigures {
        n,
        dim,
        metric: metric.as_str().to_owned(),
        threads,
        matches: expected.len(),
        plaintext_s,
        open_templates_s: open_templates.as_secs_f64(),
        open_bytes_per_template: 4 * dim,
        deal_s: secs(&deal),
        decode_s: [secs(&decode[0]), secs(&decode[1])],
        preprocessing_bytes_per_comparison: MASKED_KEY_LEN as f64
            + IDENTIFICATION_HEADER_LEN as f64 / n as f64,
        online_s,
        online_party_s: [secs(&party[0]), secs(&party[1])],
        online_round_s: [secs(&rounds[0]), secs(&rounds[1]), secs(&rounds[2])],
        comparisons_per_s: n as f64 / online_s.max(1e-12),
        online_over_plaintext: online_s / plaintext_s.max(1e-12),
        probe_bytes: 4 * dim,
        online_bytes_per_comparison: ONLINE_BYTES_PER_COMPARISON,
        identifications,
        per_comparison,
    })
}

/// What one identification's online part gave.
struct OnlineRun {
    bits: Vec<bool>,
    party: [Duration; 2],
    rounds: [Duration; 3],
    total: Duration,
}

/// One identification's online part: the bits and the times.
fn online_run(
    keys: &[IdentificationKeys],
    sets: &[MaskedTemplateSet; 2],
    probe: &[EmbeddingShare; 2],
    threads: usize,
) -> Result<OnlineRun> {
    let mut times = [Duration::ZERO; 2];
    let mut rounds = [Duration::ZERO; 3];
    let started = Instant::now();
    let mut timed =
        |b: usize, round: usize, step: &mut dyn FnMut() -> Result<Vec<u32>, FaceError>| {
            let t = Instant::now();
            let out = step().map_err(fe);
            times[b] += t.elapsed();
            rounds[round] += t.elapsed();
            out
        };
    let x0 = timed(0, 0, &mut || probe_round(&keys[0], &probe[0]))?;
    let x1 = timed(1, 0, &mut || probe_round(&keys[1], &probe[1]))?;
    let z0 = timed(0, 1, &mut || {
        distance_round(&keys[0], &sets[0], &probe[0], &x0, &x1, threads)
    })?;
    let z1 = timed(1, 1, &mut || {
        distance_round(&keys[1], &sets[1], &probe[1], &x1, &x0, threads)
    })?;
    let o0 = timed(0, 2, &mut || sign_round(&keys[0], &z0, &z1, threads))?;
    let o1 = timed(1, 2, &mut || sign_round(&keys[1], &z1, &z0, threads))?;
    let bits = reconstruct(&o0, &o1).map_err(fe)?;
    Ok(OnlineRun {
        bits,
        party: times,
        rounds,
        total: started.elapsed(),
    })
}

/// The per-comparison protocol over the same templates: one run, one thread per evaluator.
fn per_comparison_run(
    params: &DealerParams,
    probe: &[i32],
    shared: &[([u8; BUNDLE_ID_LEN], [EmbeddingShare; 2])],
    want: &[bool],
    plaintext_s: f64,
    rng: &mut ChaCha20Rng,
) -> Result<PerComparisonFigures> {
    let n = shared.len();
    let probe_shares = share_embedding(probe, rng);
    let halves = deal_batch(params, n, rng);
    let keys = [
        KeySlice::new(&halves[0]).map_err(fe)?,
        KeySlice::new(&halves[1]).map_err(fe)?,
    ];
    let side = |b: usize| -> Vec<&EmbeddingShare> { shared.iter().map(|t| &t.1[b]).collect() };
    let (t0, t1) = (side(0), side(1));
    let metric = params.metric();
    let started = Instant::now();
    let m0 = masked_inputs(&keys[0], &probe_shares[0], &t0).map_err(fe)?;
    let m1 = masked_inputs(&keys[1], &probe_shares[1], &t1).map_err(fe)?;
    let z0 = distance_shares(0, metric, &keys[0], &probe_shares[0], &t0, &m1).map_err(fe)?;
    let z1 = distance_shares(1, metric, &keys[1], &probe_shares[1], &t1, &m0).map_err(fe)?;
    let z = open_masked(&z0, &z1).map_err(fe)?;
    let o0 = sign_shares(0, &keys[0], &z).map_err(fe)?;
    let o1 = sign_shares(1, &keys[1], &z).map_err(fe)?;
    let bits = reconstruct(&o0, &o1).map_err(fe)?;
    let took = started.elapsed();
    if bits != want {
        bail!("the per-comparison protocol's bits differ from the plaintext reference");
    }
    let online_s = took.as_secs_f64();
    let dim = probe.len();
    Ok(PerComparisonFigures {
        online_s,
        comparisons_per_s: n as f64 / online_s.max(1e-12),
        over_plaintext: online_s / plaintext_s.max(1e-12),
        online_bytes_per_comparison: super::face::online_bytes(dim).iter().sum(),
        preprocessing_bytes_per_comparison: privmatch_core::face::funshade::COMPARISON_KEY_LEN,
    })
}

/// Prints the figures.
pub fn print_scale(figures: &[ScaleFigures]) {
    println!("bench face (scale): 1:N with dealer-masked templates, in process");
    for f in figures {
        println!(
            "  N = {}, l = {}, {}: {} matched — bits equal to the plaintext reference in {} identification(s); {} thread(s) per evaluator",
            f.n, f.dim, f.metric, f.matches, f.identifications, f.threads
        );
        println!(
            "    online 1:N      {:>9.4} s (P0 {:.4} s, P1 {:.4} s, one after the other): {:.0} comparisons/s, {:.1} x the plaintext 1:N ({:.4} s)",
            f.online_s,
            f.online_party_s[0],
            f.online_party_s[1],
            f.comparisons_per_s,
            f.online_over_plaintext,
            f.plaintext_s
        );
        println!(
            "      of which      {:.4} s probe rounds, {:.4} s distance rounds, {:.4} s sign rounds (both evaluators)",
            f.online_round_s[0], f.online_round_s[1], f.online_round_s[2]
        );
        println!(
            "    online bytes    {} B per party for the probe (4·l) + {} B per comparison per party (z_b, o_b)",
            f.probe_bytes, f.online_bytes_per_comparison
        );
        println!(
            "    preprocessing   {:>9.4} s dealing ({:.2} µs per comparison), {:.4} / {:.4} s decoding at P0 / P1; {:.1} B per comparison per party",
            f.deal_s,
            per(Duration::from_secs_f64(f.deal_s), f.n),
            f.decode_s[0],
            f.decode_s[1],
            f.preprocessing_bytes_per_comparison
        );
        println!(
            "    one-time        {:>9.4} s opening the N templates ({} B per template per party)",
            f.open_templates_s, f.open_bytes_per_template
        );
        if let Some(b) = &f.per_comparison {
            println!(
                "    per-comparison protocol (before): {:.4} s, {:.0} comparisons/s, {:.1} x plaintext; {} online B and {} preprocessing B per comparison per party",
                b.online_s,
                b.comparisons_per_s,
                b.over_plaintext,
                b.online_bytes_per_comparison,
                b.preprocessing_bytes_per_comparison
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_benchmark_agrees_with_the_plaintext_reference() {
        for metric in [Metric::Cosine, Metric::Euclidean] {
            let f = scale(metric, 128, 50, 0.7, 0.3, 3, 2, 2, true).expect("runs and agrees");
            assert_eq!(f.matches, 25, "{metric}");
            assert_eq!(f.online_bytes_per_comparison, 8);
            assert!(f.per_comparison.is_some());
        }
    }
}
