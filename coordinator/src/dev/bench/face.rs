//! `privmatch bench face`: the face (Funshade) benchmark. Two parts; every figure is set
//! against something measured in the same run or a published reference.
//!
//! **(a) `micro`, in process, one core** (no cluster needed): for each dimension l (default
//! 128 and 512) one batch of comparisons (default 10,000) — one probe against that many
//! templates, half of them noisy re-captures of the probe — through the protocol's steps:
//! the dealer's `deal_batch` (setup), one evaluator's `masked_inputs` + `distance_shares`
//! (eval_dist) and `sign_shares` (sign-gate evaluation), per comparison (each the best of
//! three runs over the whole batch). Next to them: the Funshade C reference (Ibarrondo et al.,
//! ePrint 2022/1688) measured on this kind of machine (setup 15–41 µs at
//! l = 128, sign-gate evaluation 5.7 µs per party, preprocessing 12·l + 732 bytes per
//! comparison per party) with the ratios, the bytes per comparison per party (preprocessing =
//! one key; online = round 1: 8·l, round 2: 4, output: 4), and a plaintext baseline measured
//! here (quantised dot product or squared distance and the threshold compare, per
//! comparison). The reconstructed bits must equal the plaintext reference on every
//! comparison, or the benchmark fails.
//!
//! **(b) `cluster`, through the coordinator** of the configuration (`privmatch cluster up`):
//! configures the dealer (`--metric`, `--threshold`, `--dim`; this starts a new key
//! generation), enrols `--n` synthetic templates (subjects `bench-face-d<dim>-s<seed>-<i>`,
//! deterministic per seed: present ones are reused; `--reuse` requires them all present),
//! opens the templates not opened yet (the first session does: dealer-masked templates,
//! docs/protocols/face.md §6 step 1; timed as the warm-up), then measures `--verifies` sequential
//! 1:1 verifications (half genuine
//! re-captures, half another subject's; latency p50/p99 as the client sees it) and
//! `--identifies` 1:N identifications over everything enrolled (median wall time, against the
//! plaintext 1:N time over the same templates), with the bytes each evaluator sent online
//! and received from the dealer, as the coordinator counted them. Every answer is checked
//! against the plaintext reference.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use privmatch_core::face::dealer::DealerConfig;
use privmatch_core::face::encoding::{share_embedding, EmbeddingShare};
use privmatch_core::face::funshade::{
    deal_batch, distance_shares, masked_inputs, open_masked, reconstruct, sign_gate_keys,
    sign_shares, DealerParams, KeySlice, COMPARISON_KEY_LEN,
};
use privmatch_core::face::quantize::{plaintext_match, Quantizer};
use privmatch_core::face::Metric;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::Serialize;

use crate::cli::operator_key;
use crate::dev::bench::stats::{median, percentile};
use crate::dev::LocalConfigs;
use crate::face::client::FaceClient;
use crate::face::input::FaceEnrollRecord;
use crate::face::synth::{subject_id, FaceSynth};
use crate::parties::Parties;

/// The C reference's setup time per comparison at l = 128, in µs (range measured).
const C_SETUP_US_L128: (f64, f64) = (15.0, 41.0);
/// The C reference's sign-gate evaluation per comparison per party, in µs.
const C_SIGN_US: f64 = 5.7;

/// The C reference's preprocessing bytes per comparison per party.
pub fn c_preprocessing_bytes(dim: usize) -> usize {
    12 * dim + 732
}

/// Online bytes per comparison per party: round 1 (masked probe and template, 8·l), round 2
/// (the masked distance share, 4), output share (4).
pub fn online_bytes(dim: usize) -> [usize; 3] {
    [8 * dim, 4, 4]
}

/// Options of `privmatch bench face`.
#[derive(Args, Clone, Debug)]
pub struct FaceBenchArgs {
    /// Which part: `micro` (in process, no cluster), `cluster` (through the coordinator),
    /// `all` (both), or `scale` (1:N with dealer-masked templates in process, see
    /// [`super::face_scale`]).
    #[arg(long, default_value = "all", value_parser = ["all", "micro", "cluster", "scale"])]
    pub part: String,
    /// Print the figures as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Micro: comparisons per batch.
    #[arg(long, default_value_t = 10_000)]
    pub batch: usize,
    /// Micro: embedding dimensions (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![128usize, 512])]
    pub dims: Vec<usize>,
    /// Metric of both parts.
    #[arg(long, default_value = "cosine", value_parser = ["cosine", "euclidean"])]
    pub metric: String,
    /// Threshold of both parts (cosine similarity, or squared Euclidean distance of unit
    /// vectors). With the default noise, re-captures are at ≈ 0.96 (distance ≈ 0.08) and
    /// other subjects at ≈ 0 (distance ≈ 2): 0.7 separates both ways.
    #[arg(long, default_value_t = 0.7, allow_hyphen_values = true)]
    pub threshold: f64,
    /// Noise of the synthetic re-captures (see `privmatch face synth`).
    #[arg(long, default_value_t = 0.3)]
    pub noise: f64,
    /// Seed of the synthetic embeddings.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Cluster: embedding dimension.
    #[arg(long, default_value_t = 512)]
    pub dim: usize,
    /// Cluster: synthetic templates to enrol.
    #[arg(long, default_value_t = 10_000)]
    pub n: usize,
    /// Cluster: do not enrol; require the N templates of this seed and dimension enrolled.
    #[arg(long)]
    pub reuse: bool,
    /// Cluster: sequential 1:1 verifications.
    #[arg(long, default_value_t = 200)]
    pub verifies: usize,
    /// Cluster and scale: 1:N identifications (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub identifies: usize,
    /// Cluster: identifications run back to back after the timed ones, without waiting for
    /// the background refill: the sustained rate under continuous load, dealing included
    /// (nothing is dealt ahead beyond the one dealing the stock holds in steady state).
    /// 0: skip.
    #[arg(long, default_value_t = 0)]
    pub continuous: usize,
    /// Scale: numbers of templates (comma-separated); the dimension is `--dim`.
    #[arg(long, value_delimiter = ',', default_values_t = vec![10_000usize, 100_000])]
    pub scale_n: Vec<usize>,
    /// Scale: threads per evaluator (0: every logical CPU).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Scale: skip the per-comparison protocol over the same templates.
    #[arg(long)]
    pub no_baseline: bool,
}

/// The figures of one dimension of the micro benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct MicroFigures {
    /// Embedding dimension l.
    pub dim: usize,
    /// Comparisons in the batch.
    pub batch: usize,
    /// Metric.
    pub metric: String,
    /// Dealer setup per comparison (µs).
    pub setup_us: f64,
    /// eval_dist (masked_inputs + distance_shares) per comparison, P0 and P1 (µs).
    pub eval_dist_us: [f64; 2],
    /// Sign-gate evaluation per comparison, P0 and P1 (µs), key decoding included.
    pub sign_us: [f64; 2],
    /// Of which: decoding the stored keys into the batch layout, P0 and P1 (µs).
    pub sign_decode_us: [f64; 2],
    /// Of which: the IC gate evaluation on decoded keys, P0 and P1 (µs).
    pub sign_eval_us: [f64; 2],
    /// Plaintext quantised metric and compare per comparison (µs, best of 3).
    pub plaintext_us: f64,
    /// Online total per comparison per party (eval_dist + sign gate, mean of the parties) over
    /// the plaintext baseline.
    pub online_over_plaintext: f64,
    /// The C reference's setup at l = 128 (µs, range), when l = 128.
    pub c_setup_us: Option<(f64, f64)>,
    /// Our setup over the C reference's (against its range), when l = 128.
    pub setup_ratio: Option<(f64, f64)>,
    /// The C reference's sign-gate evaluation (µs).
    pub c_sign_us: f64,
    /// Our sign gate (mean of the parties) over the C reference's.
    pub sign_ratio: f64,
    /// Preprocessing bytes per comparison per party (one key).
    pub preprocessing_bytes: usize,
    /// The C reference's preprocessing bytes per comparison per party (12·l + 732).
    pub c_preprocessing_bytes: usize,
    /// Ours over the C reference's.
    pub preprocessing_ratio: f64,
    /// Online bytes per comparison per party: round 1, round 2, output.
    pub online_bytes: [usize; 3],
    /// Comparisons that matched (the plaintext reference agreed on every one).
    pub matches: usize,
}

/// The figures of the cluster part.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterFigures {
    /// Embedding dimension.
    pub dim: usize,
    /// Metric.
    pub metric: String,
    /// The dealer generation configured for the run.
    pub generation: i64,
    /// Bench templates (all enrolled).
    pub bench_templates: usize,
    /// Whether they were enrolled by this run (false: reused).
    pub enrolled_now: bool,
    /// Seconds the enrolment took (when enrolled now).
    pub enroll_seconds: Option<f64>,
    /// Seconds of the warm-up verification, which opens every template not opened yet.
    pub warmup_seconds: f64,
    /// Verifications made.
    pub verifies: usize,
    /// Verify latency, median (ms).
    pub verify_p50_ms: f64,
    /// Verify latency, 99th percentile (ms).
    pub verify_p99_ms: f64,
    /// Plaintext 1:1 (quantised metric and compare) per verification (µs).
    pub plaintext_verify_us: f64,
    /// Identifications made.
    pub identifies: usize,
    /// Templates compared per identification (everything enrolled).
    pub identify_comparisons: i64,
    /// The first identification (untimed for the median): it deals on its path, as every
    /// identification does when no dealing was made ahead of time (s).
    pub identify_first_s: f64,
    /// Identifications of the timed ones that used a dealing made ahead of time.
    pub identify_stocked: usize,
    /// Median wall time of the background refill before each timed identification: P2's
    /// dealing for the list and its delivery to P0 and P1 (ms).
    pub refill_median_ms: f64,
    /// Of the refill, P2's dealing call (dealing, sealing, the rows answered), median (ms);
    /// the rest is the delivery to P0 and P1.
    pub deal_median_ms: f64,
    /// Identify wall time, median (s).
    pub identify_median_s: f64,
    /// Comparisons per second of identification.
    pub identify_rate: f64,
    /// Plaintext 1:N over the bench templates (s, best of 3).
    pub plaintext_identify_s: f64,
    /// Identify median over the plaintext 1:N time (scaled to the same number of comparisons).
    pub identify_over_plaintext: f64,
    /// Online bytes per identification per evaluator beyond the per-comparison ones (the
    /// sealed masked probe vector and the messages' headers), measured: sent − 8·N.
    pub identify_fixed_bytes: [i64; 2],
    /// Bytes the dealer sent each evaluator per comparison (sealed key half / N).
    pub preprocessing_bytes_per_comparison: [f64; 2],
    /// Identifications of the continuous run (`--continuous`), back to back.
    pub continuous: usize,
    /// Of them, those that found a dealing made ahead of time.
    pub continuous_stocked: usize,
    /// Wall time of the continuous run (s).
    pub continuous_seconds: f64,
    /// Comparisons per second sustained by the continuous run, dealing included.
    pub sustained_rate: f64,
    /// `sustained_rate` over `identify_rate` (the online rate of the same run).
    pub sustained_over_online: f64,
    /// Answers that disagreed with the plaintext reference (must be 0).
    pub wrong: usize,
}

/// Where the figures were measured.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// CPU model (from /proc/cpuinfo).
    pub cpu: String,
    /// Logical CPUs.
    pub cpus: usize,
}

pub(super) fn machine() -> Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    Machine {
        cpu,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

fn metric_of(args: &FaceBenchArgs) -> Result<Metric> {
    Metric::parse(&args.metric).map_err(|e| anyhow!("--metric: {e}"))
}

pub(super) fn quantized_threshold(metric: Metric, dim: usize, threshold: f64) -> Result<i64> {
    Quantizer::new(dim)
        .and_then(|q| q.quantize_threshold(metric, threshold))
        .map_err(|e| anyhow!("{e}"))
}

fn quantize(dim: usize, embedding: &[f64]) -> Result<Vec<i32>> {
    Quantizer::new(dim)
        .and_then(|q| q.quantize(embedding))
        .map_err(|e| anyhow!("{e}"))
}

pub(super) fn per(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n.max(1) as f64
}

/// Plaintext 1:N: the matching indices and the best of three times.
pub(super) fn plaintext_scan(
    metric: Metric,
    probe: &[i32],
    templates: &[Vec<i32>],
    threshold: i64,
) -> (Vec<usize>, Duration) {
    let mut best = Duration::MAX;
    let mut matched = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        matched = templates
            .iter()
            .enumerate()
            .filter(|(_, t)| plaintext_match(metric, probe, t, threshold))
            .map(|(i, _)| i)
            .collect();
        black_box(&matched);
        best = best.min(started.elapsed());
    }
    (matched, best)
}

/// Runs `step` three times; its last result and the best time (the same keys may be
/// evaluated again here: this is a timing loop, not a protocol run).
pub(super) fn best_of<T>(mut step: impl FnMut() -> Result<T>) -> Result<(T, Duration)> {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..3 {
        let started = Instant::now();
        let value = black_box(step()?);
        best = best.min(started.elapsed());
        last = Some(value);
    }
    let value = last.ok_or_else(|| anyhow!("no run"))?;
    Ok((value, best))
}

/// The quantised probe and `n` templates of the in-process benchmarks: template j is a
/// re-capture of the probe's face for even j, another face for odd j.
pub(super) fn bench_set(
    dim: usize,
    n: usize,
    noise: f64,
    seed: u64,
) -> Result<(Vec<i32>, Vec<Vec<i32>>)> {
    let synth = FaceSynth { dim, seed, noise };
    let base = synth.template(0);
    let probe = quantize(dim, &base)?;
    let mut templates = Vec::with_capacity(n);
    for j in 0..n as u64 {
        // Even: a re-capture of the probe's face (stream 3·(j + 1) + 1 is no other vector's);
        // odd: another face.
        let embedding = if j % 2 == 0 {
            synth.perturb(&base, 3 * (j + 1) + 1)
        } else {
            synth.template(j + 1)
        };
        templates.push(quantize(dim, &embedding)?);
    }
    Ok((probe, templates))
}

/// The micro benchmark of one dimension (see the module docs). Runs on the calling thread.
pub fn micro(
    metric: Metric,
    dim: usize,
    batch: usize,
    threshold: f64,
    noise: f64,
    seed: u64,
) -> Result<MicroFigures> {
    if batch == 0 {
        bail!("--batch must be at least 1");
    }
    let (probe, templates) = bench_set(dim, batch, noise, seed)?;
    let theta = quantized_threshold(metric, dim, threshold)?;
    let params = DealerParams::new(&DealerConfig {
        metric,
        dim,
        threshold,
    })
    .map_err(|e| anyhow!("{e}"))?;
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0x5eed_face);
    let probe_shares = share_embedding(&probe, &mut rng);
    let template_shares: Vec<[EmbeddingShare; 2]> = templates
        .iter()
        .map(|t| share_embedding(t, &mut rng))
        .collect();
    let side =
        |b: usize| -> Vec<&EmbeddingShare> { template_shares.iter().map(|t| &t[b]).collect() };
    let (t0, t1) = (side(0), side(1));

    let (halves, setup) = best_of(|| Ok(deal_batch(&params, batch, &mut rng)))?;
    let keys = [
        KeySlice::new(&halves[0]).map_err(|e| anyhow!("{e}"))?,
        KeySlice::new(&halves[1]).map_err(|e| anyhow!("{e}"))?,
    ];
    let e = |e: privmatch_core::face::FaceError| anyhow!("{e}");
    let (m0, mask0) = best_of(|| masked_inputs(&keys[0], &probe_shares[0], &t0).map_err(e))?;
    let (m1, mask1) = best_of(|| masked_inputs(&keys[1], &probe_shares[1], &t1).map_err(e))?;
    let (z0, dist0) =
        best_of(|| distance_shares(0, metric, &keys[0], &probe_shares[0], &t0, &m1).map_err(e))?;
    let (z1, dist1) =
        best_of(|| distance_shares(1, metric, &keys[1], &probe_shares[1], &t1, &m0).map_err(e))?;
    let z = open_masked(&z0, &z1).map_err(e)?;
    let (o0, sign0) = best_of(|| sign_shares(0, &keys[0], &z).map_err(e))?;
    let (o1, sign1) = best_of(|| sign_shares(1, &keys[1], &z).map_err(e))?;
    let bits = reconstruct(&o0, &o1).map_err(e)?;
    let mut decode = [Duration::ZERO; 2];
    let mut eval_only = [Duration::ZERO; 2];
    for b in 0..2 {
        let (gates, took) = best_of(|| sign_gate_keys(&keys[b]).map_err(e))?;
        decode[b] = took;
        let mut out = vec![0u32; z.len()];
        let ((), took) = best_of(|| {
            privmatch_core::crypto::fss::ic::eval_batch(b as u8, &gates, &z, &mut out)
                .map_err(|e| anyhow!("{e}"))
        })?;
        eval_only[b] = took;
        if out != [&o0, &o1][b][..] {
            bail!("l = {dim}: sign-gate evaluation on decoded keys differs from sign_shares");
        }
    }

    let (expected, plaintext) = plaintext_scan(metric, &probe, &templates, theta);
    let mut want = vec![false; batch];
    for &i in &expected {
        want[i] = true;
    }
    let wrong = bits.iter().zip(&want).filter(|(a, b)| a != b).count();
    if wrong > 0 {
        bail!(
            "l = {dim}: the protocol's bits differ from the plaintext reference on {wrong} of {batch} comparisons"
        );
    }
    let setup_us = per(setup, batch);
    let eval_dist_us = [per(mask0 + dist0, batch), per(mask1 + dist1, batch)];
    let sign_us = [per(sign0, batch), per(sign1, batch)];
    let sign_decode_us = [per(decode[0], batch), per(decode[1], batch)];
    let sign_eval_us = [per(eval_only[0], batch), per(eval_only[1], batch)];
    let plaintext_us = per(plaintext, batch);
    let online_us = (eval_dist_us[0] + eval_dist_us[1] + sign_us[0] + sign_us[1]) / 2.0;
    let c_setup_us = (dim == 128).then_some(C_SETUP_US_L128);
    let sign_mean = (sign_us[0] + sign_us[1]) / 2.0;
    Ok(MicroFigures {
        dim,
        batch,
        metric: metric.as_str().to_owned(),
        setup_us,
        eval_dist_us,
        sign_us,
        sign_decode_us,
        sign_eval_us,
        plaintext_us,
        online_over_plaintext: online_us / plaintext_us.max(1e-12),
        c_setup_us,
        setup_ratio: c_setup_us.map(|(low, high)| (setup_us / low, setup_us / high)),
        c_sign_us: C_SIGN_US,
        sign_ratio: sign_mean / C_SIGN_US,
        preprocessing_bytes: COMPARISON_KEY_LEN,
        c_preprocessing_bytes: c_preprocessing_bytes(dim),
        preprocessing_ratio: COMPARISON_KEY_LEN as f64 / c_preprocessing_bytes(dim) as f64,
        online_bytes: online_bytes(dim),
        matches: expected.len(),
    })
}

fn print_micro(figures: &[MicroFigures], machine: &Machine) {
    println!(
        "bench face (a): per comparison, one core, {} ({} logical CPUs)",
        machine.cpu, machine.cpus
    );
    for f in figures {
        let online = f.online_bytes;
        println!(
            "  l = {}, batch {}, {}: {} of {} comparisons matched — bits equal to the plaintext reference",
            f.dim, f.batch, f.metric, f.matches, f.batch
        );
        match (f.c_setup_us, f.setup_ratio) {
            (Some((lo, hi)), Some((rl, rh))) => println!(
                "    dealer setup     {:>9.2} µs   (C reference {lo}–{hi} µs: {rh:.2}–{rl:.2} x)",
                f.setup_us
            ),
            _ => println!(
                "    dealer setup     {:>9.2} µs   (C reference measured at l = 128 only)",
                f.setup_us
            ),
        }
        println!(
            "    eval_dist        {:>9.2} µs per party (P0 {:.2}, P1 {:.2})",
            (f.eval_dist_us[0] + f.eval_dist_us[1]) / 2.0,
            f.eval_dist_us[0],
            f.eval_dist_us[1]
        );
        println!(
            "    sign gate        {:>9.2} µs per party (P0 {:.2}, P1 {:.2}; C reference {} µs: {:.2} x)",
            (f.sign_us[0] + f.sign_us[1]) / 2.0,
            f.sign_us[0],
            f.sign_us[1],
            f.c_sign_us,
            f.sign_ratio
        );
        println!(
            "      of which       {:>9.2} µs IC gate evaluation on decoded keys, {:.2} µs decoding the stored keys (per party)",
            (f.sign_eval_us[0] + f.sign_eval_us[1]) / 2.0,
            (f.sign_decode_us[0] + f.sign_decode_us[1]) / 2.0
        );
        println!(
            "    plaintext        {:>9.4} µs (quantised {} and compare; online per party = {:.0} x plaintext)",
            f.plaintext_us,
            if f.metric == "cosine" { "dot product" } else { "squared distance" },
            f.online_over_plaintext
        );
        println!(
            "    preprocessing    {:>9} B per party (C reference 12·l + 732 = {} B: {:.3} x)",
            f.preprocessing_bytes, f.c_preprocessing_bytes, f.preprocessing_ratio
        );
        println!(
            "    online           {:>9} B per party (round 1: {}, round 2: {}, output: {})",
            online.iter().sum::<usize>(),
            online[0],
            online[1],
            online[2]
        );
    }
}

/// How many of the bench subjects (and how many face templates in all) P0 and P1 hold.
async fn held_counts(parties: &Parties, prefix: &str, n: usize) -> Result<[(i64, i64); 2]> {
    let (low, high) = (format!("{prefix}-0000000"), format!("{prefix}-{n:07}"));
    let mut out = [(0, 0); 2];
    for (slot, party) in out.iter_mut().zip(&parties.all()[..2]) {
        let client = party.connect().await?;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE subject >= $1 AND subject < $2), count(*) \
                 FROM privmatch.face_templates",
                &[&low, &high],
            )
            .await
            .with_context(|| format!("counting face templates at {}", party.index))?;
        *slot = (row.get(0), row.get(1));
        party.give_back(client).await;
    }
    Ok(out)
}

/// The cluster part (see the module docs).
async fn cluster(args: &FaceBenchArgs, configs: &LocalConfigs) -> Result<ClusterFigures> {
    let metric = metric_of(args)?;
    let dim = args.dim;
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    let theta = quantized_threshold(metric, dim, args.threshold)?;
    // Counting held templates is the operators' business.
    let parties = configs.operator_parties();
    let mut client = FaceClient::new(&configs.client)?;
    let operator = operator_key::load(&configs.operators[2].signing_key)?;
    let dealer = client
        .configure(metric, args.threshold, dim, &operator)
        .await
        .context("configuring the dealer")?;
    eprintln!(
        "dealer configured: {}, l = {}, generation {}",
        dealer.metric, dealer.dim, dealer.generation
    );
    let synth = FaceSynth {
        dim,
        seed: args.seed,
        noise: args.noise,
    };
    let prefix = format!("bench-face-d{dim}-s{}", args.seed);
    eprintln!("synthesising {} templates ({prefix}-*)", args.n);
    let mut records = Vec::with_capacity(args.n);
    for i in 0..args.n {
        records.push(FaceEnrollRecord {
            line: i + 1,
            subject: subject_id(&prefix, i),
            embedding: quantize(dim, &synth.template(i as u64))?,
        });
    }
    let held = held_counts(&parties, &prefix, args.n).await?;
    let enrolled_now = held.iter().any(|(bench, _)| *bench != args.n as i64);
    let mut enroll_seconds = None;
    if enrolled_now {
        if args.reuse {
            bail!(
                "--reuse: P0 and P1 hold {} and {} of the {} bench templates {prefix}-*; run without --reuse to enrol them",
                held[0].0,
                held[1].0,
                args.n
            );
        }
        eprintln!(
            "enrolling the {} bench templates (held now: P0 {}, P1 {})",
            args.n, held[0].0, held[1].0
        );
        let started = Instant::now();
        client.enroll(&records, "skip", 250, true).await?;
        enroll_seconds = Some(started.elapsed().as_secs_f64());
    } else {
        eprintln!(
            "P0 and P1 already hold the {} bench templates: reusing them",
            args.n
        );
    }
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed ^ 0xbe7c_4face);
    let mut wrong = 0usize;
    // Warm-up (not counted): opens the templates not opened yet.
    eprintln!("warm-up verification (opens every template not opened yet)");
    let warm = quantize(dim, &synth.recapture(0))?;
    let started = Instant::now();
    client
        .verify_quantized(&records[0].subject, &warm)
        .await
        .context("warm-up verification")?;
    let warmup_seconds = started.elapsed().as_secs_f64();
    let mut latencies = Vec::with_capacity(args.verifies);
    let mut plaintext_verify = Duration::ZERO;
    for k in 0..args.verifies {
        let i = rng.gen_range(0..args.n);
        // Half genuine re-captures, half another subject's re-capture.
        let source = if k % 2 == 0 || args.n == 1 {
            i
        } else {
            (i + rng.gen_range(1..args.n)) % args.n
        };
        let probe = quantize(dim, &synth.recapture(source as u64))?;
        let started = Instant::now();
        let matched = client
            .verify_quantized(&records[i].subject, &probe)
            .await
            .with_context(|| format!("verification {k}"))?;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let expected = black_box(plaintext_match(
            metric,
            &probe,
            &records[i].embedding,
            theta,
        ));
        plaintext_verify += started.elapsed();
        if matched != expected {
            wrong += 1;
            eprintln!(
                "  WRONG: verification {k} of {} answered {matched}, plaintext {expected}",
                records[i].subject
            );
        }
        if (k + 1) % 50 == 0 {
            eprintln!("  {} verifications done", k + 1);
        }
    }
    latencies.sort_by(f64::total_cmp);

    let templates: Vec<Vec<i32>> = records.iter().map(|r| r.embedding.clone()).collect();
    let mut identify_seconds = Vec::with_capacity(args.identifies);
    let mut comparisons = 0;
    let mut sent = [0u64; 2];
    let mut dealt = [0u64; 2];
    let mut plaintext_identify = Duration::MAX;
    let mut refill_ms = Vec::with_capacity(args.identifies);
    let mut deal_ms = Vec::with_capacity(args.identifies);
    let mut identify_first_s = 0.0;
    let mut identify_stocked = 0;
    // Whether an identification's bench-set matches equal the plaintext 1:N's (a difference
    // is printed), and the plaintext scan's time.
    let check = |probe: &[i32], matches: &[String], what: &str| {
        let (expected, time) = plaintext_scan(metric, probe, &templates, theta);
        let expected: Vec<&str> = expected
            .iter()
            .map(|&j| records[j].subject.as_str())
            .collect();
        let ours: Vec<&str> = matches
            .iter()
            .map(String::as_str)
            .filter(|s| s.starts_with(&format!("{prefix}-")))
            .collect();
        if ours != expected {
            eprintln!("  WRONG: {what}: privmatch {ours:?}, plaintext {expected:?}");
        }
        (ours == expected, time)
    };
    // Identification 0 deals on its path (no dealing was made ahead of time for this list
    // yet) and is reported apart; before each later one the bench waits for the coordinator's
    // background refill, as a deployment between identifications does.
    for k in 0..=args.identifies {
        let i = rng.gen_range(0..args.n);
        let probe = quantize(dim, &synth.recapture(i as u64))?;
        let stock = if k > 0 {
            let status = client.stock().await.context("face stock")?;
            if let Some(ms) = status.last_refill_ms {
                refill_ms.push(ms);
            }
            if let Some(ms) = status.last_deal_ms {
                deal_ms.push(ms);
            }
            if let Some(e) = &status.last_error {
                eprintln!("  the last refill of the face stock failed: {e}");
            }
            Some(status)
        } else {
            None
        };
        let started = Instant::now();
        let answer = client
            .identify_answer(&probe)
            .await
            .with_context(|| format!("identification {k}"))?;
        let seconds = started.elapsed().as_secs_f64();
        let (matches, compared) = (answer.matches, answer.comparisons);
        if k == 0 {
            identify_first_s = seconds;
        } else {
            identify_seconds.push(seconds);
        }
        identify_stocked += usize::from(k > 0 && answer.stocked);
        comparisons = compared;
        sent = answer.bytes_sent;
        dealt = match &stock {
            Some(status) if answer.stocked => status.last_key_bytes,
            _ => answer.key_bytes,
        };
        let (agrees, time) = check(&probe, &matches, &format!("identification {k}"));
        plaintext_identify = plaintext_identify.min(time);
        wrong += usize::from(!agrees);
        eprintln!(
            "  identification {k}: {seconds:.3} s over {compared} templates, {} match(es), {}",
            matches.len(),
            if answer.stocked {
                "dealt ahead of time"
            } else {
                "dealt on its path"
            }
        );
    }
    // Continuous load: back to back, each identification claims whatever the refill after
    // the one before it has delivered by then (or deals on its path).
    let started = Instant::now();
    let mut continuous_stocked = 0;
    let mut checking = Duration::ZERO;
    for k in 0..args.continuous {
        let i = rng.gen_range(0..args.n);
        let probe = quantize(dim, &synth.recapture(i as u64))?;
        let answer = client
            .identify_answer(&probe)
            .await
            .with_context(|| format!("continuous identification {k}"))?;
        continuous_stocked += usize::from(answer.stocked);
        let checked = Instant::now();
        let (agrees, _) = check(
            &probe,
            &answer.matches,
            &format!("continuous identification {k}"),
        );
        wrong += usize::from(!agrees);
        checking += checked.elapsed();
    }
    // The plaintext checks ran inside the timed loop: their time is not the system's.
    let continuous_seconds = started.elapsed().saturating_sub(checking).as_secs_f64();
    let identify_median_s = median(identify_seconds);
    let refill_median_ms = median(refill_ms);
    let deal_median_ms = median(deal_ms);
    let identify_rate = comparisons as f64 / identify_median_s.max(1e-12);
    let sustained_rate = if args.continuous == 0 {
        0.0
    } else {
        (args.continuous as f64 * comparisons as f64) / continuous_seconds.max(1e-12)
    };
    let plaintext_identify_s = plaintext_identify.as_secs_f64();
    let per_comparison_plain = plaintext_identify_s / args.n as f64;
    Ok(ClusterFigures {
        dim,
        metric: metric.as_str().to_owned(),
        generation: dealer.generation,
        bench_templates: args.n,
        enrolled_now,
        enroll_seconds,
        warmup_seconds,
        verifies: args.verifies,
        verify_p50_ms: percentile(&latencies, 0.5),
        verify_p99_ms: percentile(&latencies, 0.99),
        plaintext_verify_us: per(plaintext_verify, args.verifies),
        identifies: args.identifies,
        identify_comparisons: comparisons,
        identify_first_s,
        identify_stocked,
        refill_median_ms,
        deal_median_ms,
        identify_median_s,
        identify_rate,
        plaintext_identify_s,
        identify_over_plaintext: identify_median_s
            / (per_comparison_plain * comparisons.max(1) as f64).max(1e-12),
        identify_fixed_bytes: sent.map(|b| b as i64 - 8 * comparisons),
        preprocessing_bytes_per_comparison: dealt.map(|b| b as f64 / comparisons.max(1) as f64),
        continuous: args.continuous,
        continuous_stocked,
        continuous_seconds,
        sustained_rate,
        sustained_over_online: sustained_rate / identify_rate.max(1e-12),
        wrong,
    })
}

fn print_cluster(f: &ClusterFigures) {
    println!(
        "bench face (b): through the coordinator, {} l = {}, generation {}, {} bench templates ({})",
        f.metric,
        f.dim,
        f.generation,
        f.bench_templates,
        if f.enrolled_now { "enrolled now" } else { "reused" }
    );
    if let Some(s) = f.enroll_seconds {
        println!(
            "  enrolment: {s:.2} s ({:.0} templates/s)",
            f.bench_templates as f64 / s.max(1e-9)
        );
    }
    println!(
        "  warm-up verification (opens the templates not opened yet): {:.2} s",
        f.warmup_seconds
    );
    println!(
        "  verify (1:1): p50 {:.2} ms, p99 {:.2} ms over {} sequential verifications (plaintext {:.3} µs: {:.0} x)",
        f.verify_p50_ms,
        f.verify_p99_ms,
        f.verifies,
        f.plaintext_verify_us,
        f.verify_p50_ms * 1e3 / f.plaintext_verify_us.max(1e-9)
    );
    println!(
        "  identify (1:N): median {:.3} s over {} templates ({:.0} comparisons/s; plaintext 1:N {:.4} s for {} bench templates: {:.0} x per comparison), {} repetition(s)",
        f.identify_median_s,
        f.identify_comparisons,
        f.identify_rate,
        f.plaintext_identify_s,
        f.bench_templates,
        f.identify_over_plaintext,
        f.identifies
    );
    println!(
        "  of them dealt ahead of time: {} of {} (the refill before each, off the path: median {:.1} ms, of which P2's dealing call {:.1} ms and the delivery to P0 and P1 the rest); the first identification, dealing on its path: {:.3} s",
        f.identify_stocked, f.identifies, f.refill_median_ms, f.deal_median_ms, f.identify_first_s
    );
    println!(
        "  bytes per identification per evaluator (P0, P1): online {:?} + 8 per comparison (z_b, o_b), beyond them {:?} (the sealed masked probe vector 4·l = {} and headers); from the dealer {:.1} / {:.1} per comparison",
        f.identify_fixed_bytes.map(|b| b + 8 * f.identify_comparisons),
        f.identify_fixed_bytes,
        4 * f.dim,
        f.preprocessing_bytes_per_comparison[0],
        f.preprocessing_bytes_per_comparison[1]
    );
    if f.continuous > 0 {
        println!(
            "  continuous load: {} identifications back to back in {:.2} s ({} of them found a dealing made ahead of time): {:.0} comparisons/s sustained, dealing included = {:.3} of the online rate",
            f.continuous,
            f.continuous_seconds,
            f.continuous_stocked,
            f.sustained_rate,
            f.sustained_over_online
        );
    }
    println!(
        "  check: {}",
        if f.wrong == 0 {
            "every answer equals the plaintext reference".to_owned()
        } else {
            format!("{} answer(s) differ from the plaintext reference", f.wrong)
        }
    );
}

/// `privmatch bench face` (the `scale` part runs from [`super::face_scale::run`]).
pub async fn run(
    args: &FaceBenchArgs,
    configs: impl FnOnce() -> Result<LocalConfigs>,
) -> Result<()> {
    let metric = metric_of(args)?;
    if !(args.noise.is_finite() && args.noise >= 0.0) {
        bail!("--noise must be a non-negative number");
    }
    let machine = machine();
    let mut report = serde_json::json!({ "machine": machine });
    if args.part != "cluster" {
        let mut figures = Vec::with_capacity(args.dims.len());
        for &dim in &args.dims {
            eprintln!("micro: l = {dim}, {} comparisons", args.batch);
            let (batch, threshold, noise, seed) =
                (args.batch, args.threshold, args.noise, args.seed);
            // One core: the whole batch runs on one blocking thread.
            let f = tokio::task::spawn_blocking(move || {
                micro(metric, dim, batch, threshold, noise, seed)
            })
            .await
            .context("the micro benchmark thread failed")??;
            figures.push(f);
        }
        if !args.json {
            print_micro(&figures, &machine);
        }
        report["micro"] = serde_json::to_value(&figures)?;
    }
    if args.part != "micro" {
        let configs = configs()?;
        let figures = cluster(args, &configs).await?;
        if !args.json {
            print_cluster(&figures);
        }
        let wrong = figures.wrong;
        report["cluster"] = serde_json::to_value(&figures)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        if wrong > 0 {
            bail!("{wrong} face answer(s) differ from the plaintext reference");
        }
        return Ok(());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_follow_the_formulas() {
        assert_eq!(c_preprocessing_bytes(128), 2268);
        assert_eq!(online_bytes(512), [4096, 4, 4]);
    }

    #[test]
    fn the_micro_benchmark_agrees_with_the_plaintext_reference() {
        for metric in [Metric::Cosine, Metric::Euclidean] {
            let f = micro(metric, 128, 40, 0.7, 0.3, 3).expect("runs and agrees");
            // Half the templates are re-captures of the probe's face.
            assert_eq!(f.matches, 20, "{metric}");
            assert_eq!(f.preprocessing_bytes, COMPARISON_KEY_LEN);
            assert!(f.setup_ratio.is_some());
        }
    }
}
