//! `privmatch bench iris`: the search benchmark. On the cluster of the configuration it enrols
//! N synthetic templates once (deterministic per seed, so later runs reuse them), then searches
//! one random probe — a rotated near-duplicate of an enrolled template — in identify mode
//! without rotations and with the deployed 31, several times each, calling the round driver
//! directly. Every figure is set against a baseline measured in the same run:
//!
//! * the memory floor: share bytes a party scans (entries × 38,400) over the single-thread read
//!   bandwidth of this machine (summing a large u64 buffer);
//! * a plaintext matcher: the fractional Hamming distance minimum over the same rotations on
//!   the same plaintext templates, one thread;
//! * the engines' own status: templates, share bytes and resident bytes per party, and of the
//!   resident bytes the pages of PostgreSQL's shared buffers (the engine's own memory is the rest).
//!
//! The result is checked against the plaintext matcher (the same subjects must match) and the
//! near-duplicate's subject must be found with 31 rotations.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::matcher::expected_rounds;
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{
    seal_iris_probe_to, Disclosure, ProbeContext, ReplyTo, IRIS_PROBE_PURPOSE,
};
use privmatch_core::iris::synth::near_duplicate;
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate, MAX_ROTATION};
use privmatch_core::wire::session::new_session_id;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::cli::client_key::ClientCredential;
use crate::cli::keys::{client_credential, sealing_time, sign_each};
use crate::config::Config;
use crate::dev::bench::stats::median;
use crate::dev::LocalConfigs;
use crate::iris::client::{enroll_file, BatchOptions};
use crate::iris::driver::{retry_on_set_mismatch, run_search, SearchError};
use crate::iris::synth::{enrollment_line, generate, SynthArgs};
use crate::parties::Parties;
use crate::session::retry::RetryPolicy;
use privmatch_api::iris::{SearchRequest, SearchStats};
use privmatch_core::iris::policy::{IrisPolicy, DEFAULT_TAU};

/// Share bytes per enrolled template per party: 12,800 code + 6,400 mask u16 coefficients.
pub(super) const SHARE_BYTES_PER_TEMPLATE: u64 = 38_400;

/// Bit flips of the near-duplicate probe (well below the threshold).
const PROBE_FLIP_RATE: f64 = 0.1;

/// Options of `privmatch bench iris`.
#[derive(Args, Clone, Debug)]
pub struct IrisBenchArgs {
    /// Number of synthetic templates (left eye) to search.
    #[arg(long, default_value_t = 10_000)]
    pub n: usize,
    /// Do not enrol: require the parties to hold the N templates of this seed already
    /// (without it, missing ones are enrolled and present ones reused).
    #[arg(long)]
    pub reuse: bool,
    /// Seed of the synthetic templates (subjects `bench-iris-s<SEED>-<i>`).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Searches per configuration (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Size of the buffer of the memory-bandwidth measurement, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub bandwidth_mib: usize,
    /// Per-call timeout of the parties' search functions, in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Measure batches of these sizes instead (e.g. `1,8,32,64`): time and share bytes read
    /// per probe, against the plaintext matcher on the same probes, and with 1 a batch of one
    /// against a single search, interleaved (`bench/iris_batch.rs`).
    #[arg(long, value_delimiter = ',')]
    pub batch: Vec<usize>,
}

/// The synthetic templates of a seed: subject ids and plaintexts, in order.
fn bench_templates(n: usize, seed: u64) -> Result<(String, Vec<(String, IrisTemplate)>)> {
    let prefix = format!("bench-iris-s{seed}");
    let args = SynthArgs {
        count: n,
        output: None,
        seed,
        near_duplicates: 0,
        flip_rate: 0.0,
        rotation: 0,
        prefix: prefix.clone(),
    };
    let mut out = Vec::with_capacity(n);
    generate(&args, |subject, template| {
        out.push((subject.to_owned(), *template));
        Ok(())
    })?;
    Ok((prefix, out))
}

/// How many of the first `n` bench subjects each party holds (left eye).
async fn held_counts(parties: &Parties, prefix: &str, n: usize) -> Result<Vec<i64>> {
    let (low, high) = (format!("{prefix}-0000000"), format!("{prefix}-{n:07}"));
    let mut counts = Vec::with_capacity(3);
    for party in parties.all() {
        let client = party.connect().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM privmatch.iris_templates \
                 WHERE eye = 'left' AND subject >= $1 AND subject < $2",
                &[&low, &high],
            )
            .await
            .with_context(|| format!("counting bench templates at {}", party.index))?;
        counts.push(row.get(0));
        party.give_back(client).await;
    }
    Ok(counts)
}

/// Enrols the bench templates the parties lack (present ones are skipped).
async fn enroll_missing(config: &Config, templates: &[(String, IrisTemplate)]) -> Result<()> {
    let path = std::env::temp_dir().join(format!(
        "privmatch-bench-iris-{}.ndjson",
        std::process::id()
    ));
    let written = write_enrollment(&path, templates);
    let outcome = match written {
        Ok(()) => {
            let options = BatchOptions {
                batch_size: 250,
                on_duplicate: "skip".into(),
                parallel: 2,
                progress: true,
            };
            enroll_file(config, &path, &options).await.map(|_| ())
        }
        Err(e) => Err(e),
    };
    std::fs::remove_file(&path).ok();
    outcome
}

fn write_enrollment(path: &Path, templates: &[(String, IrisTemplate)]) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    for (subject, template) in templates {
        writeln!(out, "{}", enrollment_line(subject, "left", template))?;
    }
    out.flush()?;
    Ok(())
}

/// Single-thread read bandwidth in bytes per second: the best of three sums of a buffer.
fn memory_bandwidth(mib: usize) -> f64 {
    let words = (mib.max(1) << 20) / 8;
    let buffer: Vec<u64> = (0..words as u64).collect();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let started = Instant::now();
        let sum = buffer.iter().fold(0u64, |a, &w| a.wrapping_add(w));
        black_box(sum);
        best = best.min(started.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best.max(1e-9)
}

/// The plaintext matcher: per template the minimum fractional Hamming distance over
/// rotations −max..=max (query rotations precomputed, compared exactly as integer ratios),
/// matched against τ = numerator / 10,000. Returns the matching indices and the time taken.
pub(super) fn plaintext_matches(
    probe: &IrisTemplate,
    templates: &[(String, IrisTemplate)],
    max_rotation: i32,
    numerator: i64,
) -> (Vec<usize>, Duration) {
    let rotations: Vec<IrisTemplate> = (-max_rotation..=max_rotation)
        .map(|k| probe.rotate(k))
        .collect();
    let started = Instant::now();
    let mut matched = Vec::new();
    for (index, (_, enrolled)) in templates.iter().enumerate() {
        // Best (hamming, common) so far, compared as fractions without rounding.
        let mut best: Option<(u64, u64)> = None;
        for query in &rotations {
            let (hd, common) = masked_code_distance_counts(query, enrolled);
            let (hd, common) = (u64::from(hd), u64::from(common));
            if common > 0 && best.is_none_or(|(bh, bc)| hd * bc < bh * common) {
                best = Some((hd, common));
            }
        }
        if let Some((hd, common)) = best {
            if (hd as i128) * 10_000 < i128::from(numerator) * common as i128 {
                matched.push(index);
            }
        }
    }
    (black_box(matched), started.elapsed())
}

/// One search of `probe` through the round driver, with a fresh session (and retries while the
/// parties' template sets differ); the bench is the client, so it opens the parties' sealed
/// outputs with its own reply key (the time reported is the driver's, opening excluded). The
/// probes are signed by the configured client, if any (a `cluster up` cluster requires it).
async fn search_once(
    parties: &Parties,
    probe: &IrisTemplate,
    params: SearchParams,
    keys: &[PartyPublicKey; 3],
    signer: Option<&ClientCredential>,
    rng: &mut ChaCha20Rng,
    timeout: Duration,
) -> Result<(Vec<String>, SearchStats)> {
    let client = PartySecretKey::generate(&mut rand::rngs::OsRng);
    let reply = ReplyTo {
        key: client.public_key(),
        disclosure: Disclosure::SealedOnly,
    };
    let mut last_session = None;
    let outcome = retry_on_set_mismatch(&RetryPolicy::default(), || {
        let context = ProbeContext {
            session: new_session_id(&mut rand::rngs::OsRng),
            eye: Eye::Left,
            params,
            sealed_at: sealing_time(),
        };
        let session = context.session;
        last_session = Some(session);
        let sealed = seal_iris_probe_to(probe, &context, &reply, keys, rng)
            .map(|probes| sign_each(signer, IRIS_PROBE_PURPOSE, probes));
        async move {
            let probes = sealed.map_err(|e| SearchError::Invalid(e.to_string()))?;
            let request = SearchRequest { session, probes };
            run_search(parties, &request, timeout).await
        }
    })
    .await?;
    let session = last_session.ok_or_else(|| anyhow!("no search was sent"))?;
    let expected = ExpectedSearch {
        session,
        params,
        eye: Eye::Left,
    };
    let [o0, o1, o2] = &outcome.sealed_outputs;
    let opened = open_outputs(&expected, keys, &[None, None, None], &client, [o0, o1, o2])
        .map_err(|e| anyhow!("{e}"))?;
    match opened.result {
        IrisResult::Identified(subjects) => Ok((subjects, outcome.stats)),
        IrisResult::Unique(_) | IrisResult::MatchesEarlierRequest => {
            bail!("an identify search answered a uniqueness bit")
        }
    }
}

/// The figures of one configuration (one max_rotation).
struct Figures {
    rotations: usize,
    median_seconds: f64,
    stats: SearchStats,
    /// Comparisons per second of the plaintext matcher (templates × rotations / time).
    plaintext_rate: f64,
    correct: bool,
    note: String,
}

/// Everything a configuration needs besides its rotation.
pub(super) struct Setup<'a> {
    pub(super) parties: &'a Parties,
    pub(super) keys: [PartyPublicKey; 3],
    /// The client that signs the probes, if the configuration names one.
    pub(super) client: Option<ClientCredential>,
    pub(super) prefix: &'a str,
    pub(super) templates: &'a [(String, IrisTemplate)],
    probe: IrisTemplate,
    original: usize,
    pub(super) args: &'a IrisBenchArgs,
}

async fn run_configuration(
    setup: &Setup<'_>,
    max_rotation: i32,
    rng: &mut ChaCha20Rng,
) -> Result<Figures> {
    let params = SearchParams::new(SearchMode::Identify, max_rotation, DEFAULT_TAU)
        .map_err(|e| anyhow!("{e}"))?;
    let numerator = params.threshold().numerator();
    // The plaintext baseline at its best: the fastest of three runs.
    let (expected, mut plaintext_time) =
        plaintext_matches(&setup.probe, setup.templates, max_rotation, numerator);
    for _ in 0..2 {
        let (_, time) = plaintext_matches(&setup.probe, setup.templates, max_rotation, numerator);
        plaintext_time = plaintext_time.min(time);
    }
    let expected: Vec<&str> = expected
        .iter()
        .map(|&i| setup.templates[i].0.as_str())
        .collect();
    let timeout = Duration::from_secs_f64(setup.args.timeout);
    let mut seconds = Vec::new();
    let mut last: Option<(Vec<String>, SearchStats)> = None;
    for repetition in 0..setup.args.repetitions.max(1) {
        let (subjects, stats) = search_once(
            setup.parties,
            &setup.probe,
            params,
            &setup.keys,
            setup.client.as_ref(),
            rng,
            timeout,
        )
        .await
        .with_context(|| {
            format!("search with max_rotation {max_rotation}, repetition {repetition}")
        })?;
        eprintln!(
            "  max_rotation {max_rotation:>2}, repetition {repetition}: {:.3} s, {} match(es)",
            stats.seconds(),
            subjects.len()
        );
        seconds.push(stats.seconds());
        last = Some((subjects, stats));
    }
    let (subjects, stats) = last.ok_or_else(|| anyhow!("no repetition ran"))?;
    let ours: Vec<&str> = subjects
        .iter()
        .map(String::as_str)
        .filter(|s| s.starts_with(&format!("{}-", setup.prefix)))
        .collect();
    let original = setup.templates[setup.original].0.as_str();
    let mut correct = ours == expected;
    let mut note = if correct {
        format!("{} match(es), as the plaintext matcher", ours.len())
    } else {
        format!("privmatch {ours:?} but plaintext {expected:?}")
    };
    if max_rotation == MAX_ROTATION && !ours.contains(&original) {
        correct = false;
        note = format!("{note}; the near-duplicate's subject {original} was not found");
    }
    Ok(Figures {
        rotations: params_rotations(max_rotation),
        median_seconds: median(seconds),
        stats,
        plaintext_rate: (setup.templates.len() * params_rotations(max_rotation)) as f64
            / plaintext_time.as_secs_f64().max(1e-9),
        correct,
        note,
    })
}

fn params_rotations(max_rotation: i32) -> usize {
    2 * max_rotation.max(0) as usize + 1
}

/// One party's `engine_status()`.
async fn engine_status_lines(parties: &Parties) -> Vec<String> {
    let mut lines = Vec::new();
    for party in parties.all() {
        let answer = async {
            let client = party.connect().await.map_err(|e| e.to_string())?;
            let row = client
                .query_one(
                    "SELECT state, templates, share_bytes, resident_bytes, sessions, kernel, threads, \
                            resident_shared_bytes \
                     FROM privmatch.engine_status()",
                    &[],
                )
                .await
                .map_err(|e| e.to_string())?;
            party.give_back(client).await;
            let state: Option<String> = row.try_get(0).map_err(|e| e.to_string())?;
            let templates: Option<i64> = row.try_get(1).map_err(|e| e.to_string())?;
            let share: Option<i64> = row.try_get(2).map_err(|e| e.to_string())?;
            let resident: Option<i64> = row.try_get(3).map_err(|e| e.to_string())?;
            let sessions: Option<i32> = row.try_get(4).map_err(|e| e.to_string())?;
            let kernel: Option<String> = row.try_get(5).map_err(|e| e.to_string())?;
            let threads: Option<i32> = row.try_get(6).map_err(|e| e.to_string())?;
            let shared: Option<i64> = row.try_get(7).map_err(|e| e.to_string())?;
            let (share, resident, shared) =
                (share.unwrap_or(0), resident.unwrap_or(0), shared.unwrap_or(0));
            let own = resident.saturating_sub(shared);
            let per_share = |bytes: i64| bytes as f64 / (share as f64).max(1.0);
            Ok::<_, String>(format!(
                "state {}, {} templates, share {:.1} MB, resident {:.1} MB ({:.3} x share; \
                 of it PostgreSQL's shared buffers {:.1} MB, the engine's own {:.1} MB = {:.3} x share), \
                 {} session(s), kernel {}, {} thread(s)",
                state.unwrap_or_default(),
                templates.unwrap_or(0),
                share as f64 / 1e6,
                resident as f64 / 1e6,
                per_share(resident),
                shared as f64 / 1e6,
                own as f64 / 1e6,
                per_share(own),
                sessions.unwrap_or(0),
                kernel.unwrap_or_default(),
                threads.unwrap_or(0)
            ))
        }
        .await;
        lines.push(match answer {
            Ok(line) => format!("  {}: {line}", party.index),
            Err(e) => format!("  {}: engine_status() failed: {e}", party.index),
        });
    }
    lines
}

fn print_figures(figures: &[Figures], bandwidth: f64, floor_seconds: f64) {
    println!(
        "  {:>9} {:>10} {:>14} {:>6} {:>8} {:>28} {:>10} {:>15} {:>11}",
        "rotations",
        "wall s",
        "comparisons/s",
        "rounds",
        "expected",
        "MB sent P0 / P1 / P2",
        "wall/floor",
        "plaintext cmp/s",
        "x plaintext"
    );
    // The rounds the searches should take at the bench's threshold.
    let threshold = IrisPolicy::default_policy().threshold();
    for f in figures {
        let entries = f.stats.entries.max(0) as usize;
        let comparisons = (entries * f.rotations) as f64;
        let rate = comparisons / f.median_seconds.max(1e-9);
        let mb = |b: u64| b as f64 / 1e6;
        println!(
            "  {:>9} {:>10.3} {:>14.0} {:>6} {:>8} {:>28} {:>10.1} {:>15.0} {:>11.1}",
            f.rotations,
            f.median_seconds,
            rate,
            f.stats.rounds,
            expected_rounds(
                SearchMode::Identify,
                entries,
                (f.rotations as i32 - 1) / 2,
                &threshold,
            ),
            format!(
                "{:.2} / {:.2} / {:.2}",
                mb(f.stats.bytes_sent[0]),
                mb(f.stats.bytes_sent[1]),
                mb(f.stats.bytes_sent[2])
            ),
            f.median_seconds / floor_seconds.max(1e-12),
            f.plaintext_rate,
            f.plaintext_rate / rate.max(1e-9),
        );
    }
    println!(
        "  (memory floor {:.4} s = share bytes scanned per party / {:.1} GB/s; plaintext = fhd minimum over the same rotations, same templates, one thread, best of 3; x plaintext = plaintext comparisons/s over privmatch comparisons/s)",
        floor_seconds,
        bandwidth / 1e9
    );
    for f in figures {
        println!(
            "  check, {} rotation(s): {} — {}",
            f.rotations,
            if f.correct { "ok" } else { "WRONG" },
            f.note
        );
    }
}

/// Makes sure the parties hold the bench templates (enrolling the missing ones unless
/// `--reuse`).
async fn ensure_enrolled(
    config: &Config,
    operators: &Parties,
    prefix: &str,
    templates: &[(String, IrisTemplate)],
    reuse: bool,
) -> Result<()> {
    let n = templates.len();
    let held = held_counts(operators, prefix, n).await?;
    if held.iter().all(|&c| c == n as i64) {
        eprintln!("the parties already hold the {n} bench templates ({prefix}-*): reusing them");
        return Ok(());
    }
    if reuse {
        bail!(
            "--reuse: the parties hold {held:?} of the {n} bench templates {prefix}-*; run without --reuse to enrol them"
        );
    }
    eprintln!("enrolling the {n} bench templates (held now: {held:?})");
    enroll_missing(config, templates).await
}

/// The templates of a run, enrolled, and the parties to search them as the coordinator does.
pub(super) struct Enrolled {
    parties: Parties,
    prefix: String,
    templates: Vec<(String, IrisTemplate)>,
}

/// Checks the options, synthesises the N templates of the seed and makes sure the parties
/// hold them (the part `bench iris` and `bench iris --batch` share).
pub(super) async fn enrolled(configs: &LocalConfigs, args: &IrisBenchArgs) -> Result<Enrolled> {
    if args.n == 0 {
        bail!("--n must be at least 1");
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds");
    }
    // Searches run as the coordinator does (its role); counting held templates is the
    // operators' business.
    let parties = configs.coordinator_parties();
    eprintln!("synthesising {} templates (seed {})", args.n, args.seed);
    let (prefix, templates) = bench_templates(args.n, args.seed)?;
    let operators = configs.operator_parties();
    ensure_enrolled(&configs.client, &operators, &prefix, &templates, args.reuse).await?;
    Ok(Enrolled {
        parties,
        prefix,
        templates,
    })
}

impl Enrolled {
    /// The templates, in order.
    pub(super) fn templates(&self) -> &[(String, IrisTemplate)] {
        &self.templates
    }

    /// The setup of a run over these templates with `probe`, a near-duplicate of template
    /// `original`.
    pub(super) fn setup<'a>(
        &'a self,
        configs: &LocalConfigs,
        args: &'a IrisBenchArgs,
        probe: IrisTemplate,
        original: usize,
    ) -> Result<Setup<'a>> {
        Ok(Setup {
            parties: &self.parties,
            keys: configs.client.pinned_keys()?,
            client: client_credential(&configs.client)?,
            prefix: &self.prefix,
            templates: &self.templates,
            probe,
            original,
            args,
        })
    }
}

/// A near-duplicate of a random template at a random rotation: (probe, original, rotation).
pub(super) fn near_probe(
    templates: &[(String, IrisTemplate)],
    rng: &mut ChaCha20Rng,
) -> (IrisTemplate, usize, i32) {
    let original = rng.gen_range(0..templates.len());
    let rotation = rng.gen_range(1..=MAX_ROTATION) * if rng.gen_bool(0.5) { 1 } else { -1 };
    let probe = near_duplicate(&templates[original].1, PROBE_FLIP_RATE, rotation, rng);
    (probe, original, rotation)
}

/// The first search (31 rotations), not counted: it may include the engines loading newly
/// enrolled templates. Its wall time.
pub(super) async fn warm_up(setup: &Setup<'_>, rng: &mut ChaCha20Rng) -> Result<f64> {
    let started = Instant::now();
    let timeout = Duration::from_secs_f64(setup.args.timeout);
    let params = SearchParams::new(SearchMode::Identify, MAX_ROTATION, DEFAULT_TAU)
        .map_err(|e| anyhow!("{e}"))?;
    search_once(
        setup.parties,
        &setup.probe,
        params,
        &setup.keys,
        setup.client.as_ref(),
        rng,
        timeout,
    )
    .await
    .context("warm-up search")?;
    Ok(started.elapsed().as_secs_f64())
}

/// A generator seeded from the operating system.
pub(super) fn os_rng() -> Result<ChaCha20Rng> {
    ChaCha20Rng::from_rng(rand::rngs::OsRng)
        .context("the operating system's random source is unavailable")
}

/// `privmatch bench iris`.
pub async fn run(configs: &LocalConfigs, args: &IrisBenchArgs) -> Result<()> {
    let bench = enrolled(configs, args).await?;
    let (prefix, templates, parties) = (&bench.prefix, &bench.templates, &bench.parties);
    let mut rng = os_rng()?;
    let (probe, original, rotation) = near_probe(templates, &mut rng);
    eprintln!(
        "measuring single-thread memory bandwidth ({} MiB)",
        args.bandwidth_mib
    );
    let bandwidth = memory_bandwidth(args.bandwidth_mib);
    let setup = bench.setup(configs, args, probe, original)?;
    let warm_up = warm_up(&setup, &mut rng).await?;
    let mut figures = Vec::new();
    for max_rotation in [0, MAX_ROTATION] {
        figures.push(run_configuration(&setup, max_rotation, &mut rng).await?);
    }
    let entries = figures.first().map_or(0, |f| f.stats.entries.max(0) as u64);
    let scanned = entries * SHARE_BYTES_PER_TEMPLATE;
    let floor_seconds = scanned as f64 / bandwidth;
    println!(
        "bench iris: {} entries searched ({} bench templates {prefix}-*), identify, τ = {DEFAULT_TAU}, median of {} search(es)",
        entries,
        args.n,
        args.repetitions.max(1)
    );
    println!(
        "  probe: near-duplicate of {} (rotation {rotation:+}, {:.0}% of code bits flipped)",
        templates[original].0,
        PROBE_FLIP_RATE * 100.0
    );
    println!(
        "  memory: {:.1} GB/s single-thread read; {:.1} MB of shares scanned per party per search",
        bandwidth / 1e9,
        scanned as f64 / 1e6
    );
    println!(
        "  warm-up: the first search ({warm_up:.3} s, 31 rotations, not counted) may include the engines loading newly enrolled templates"
    );
    print_figures(&figures, bandwidth, floor_seconds);
    println!("  engines, right after the searches (heap of the rounds still held):");
    for line in engine_status_lines(parties).await {
        println!("{line}");
    }
    // An idle engine returns the rounds' heap after a second without requests.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    println!("  engines, at rest (2.5 s later):");
    for line in engine_status_lines(parties).await {
        println!("{line}");
    }
    if figures.iter().any(|f| !f.correct) {
        bail!("the search results differ from the plaintext matcher (see the checks above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plaintext_matcher_finds_a_rotated_near_duplicate() {
        let (_, templates) = bench_templates(20, 7).expect("synth");
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let probe = near_duplicate(&templates[5].1, PROBE_FLIP_RATE, -9, &mut rng);
        let (with, _) = plaintext_matches(&probe, &templates, 15, 3450);
        assert_eq!(with, vec![5]);
        let (without, _) = plaintext_matches(&probe, &templates, 0, 3450);
        assert!(without.is_empty());
        let (unrotated, _) = plaintext_matches(&templates[2].1, &templates, 0, 3450);
        assert_eq!(unrotated, vec![2]);
    }

    #[test]
    fn bench_templates_are_deterministic_per_seed() {
        let (prefix, a) = bench_templates(3, 1).expect("synth");
        let (_, b) = bench_templates(5, 1).expect("synth");
        assert_eq!(prefix, "bench-iris-s1");
        assert_eq!(a[2].0, "bench-iris-s1-0000002");
        assert!(a[..] == b[..3]);
    }
}
