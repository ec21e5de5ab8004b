//! `privmatch bench iris --batch B1,B2,…`: the cost of a search as a function of its batch
//! (docs/protocols/iris.md §13.3). For each batch size B and for 1 and 31 rotations, batches of
//! B probes (rotated near-duplicates of enrolled templates, each sealed to its own reply key
//! for its own session) run through the coordinator's batch driver
//! ([`crate::iris::batch::run_batch`]); every answer is opened with its probe's key and checked
//! against the plaintext matcher. Printed per B: the batch's wall time, time per probe,
//! comparisons per second, the bytes of template shares a party reads per probe (the scan reads
//! each share once per batch), rounds, bytes sent per party, and the plaintext matcher's time
//! per probe on the same B probes (one thread). With B = 1 in the list it also runs single
//! searches (`iris_search_start`, the path before batches) and batches of one, interleaved,
//! and prints their ratio.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use privmatch_core::crypto::seal::PartySecretKey;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::policy::DEFAULT_TAU;
use privmatch_core::iris::probe::{
    seal_iris_probe_to, Disclosure, ProbeContext, ReplyTo, IRIS_PROBE_PURPOSE,
};
use privmatch_core::iris::synth::near_duplicate;
use privmatch_core::iris::template::{IrisTemplate, MAX_ROTATION};
use privmatch_core::wire::session::new_session_id;
use rand::Rng;
use rand_chacha::ChaCha20Rng;

use super::iris::{
    enrolled, near_probe, os_rng, plaintext_matches, warm_up, IrisBenchArgs, Setup,
    SHARE_BYTES_PER_TEMPLATE,
};
use crate::cli::keys::{sealing_time, sign_each};
use crate::dev::bench::stats::median;
use crate::dev::LocalConfigs;
use crate::iris::batch::{run_batch, IrisBatchKey};
use crate::iris::driver::run_search;
use privmatch_api::iris::SearchRequest;

/// Bit flips of the batch's near-duplicate probes (well below the threshold).
const FLIP_RATE: f64 = 0.1;

/// One probe of a batch: the plaintext, its session, its reply key and its sealed shares.
struct Sealed {
    probe: IrisTemplate,
    request: SearchRequest,
    client: PartySecretKey,
}

fn seal(
    setup: &Setup<'_>,
    probe: IrisTemplate,
    params: SearchParams,
    rng: &mut ChaCha20Rng,
) -> Result<Sealed> {
    let client = PartySecretKey::generate(&mut rand::rngs::OsRng);
    let reply = ReplyTo {
        key: client.public_key(),
        disclosure: Disclosure::SealedOnly,
    };
    let context = ProbeContext {
        session: new_session_id(&mut rand::rngs::OsRng),
        eye: Eye::Left,
        params,
        sealed_at: sealing_time(),
    };
    let probes = seal_iris_probe_to(&probe, &context, &reply, &setup.keys, rng)
        .map(|p| sign_each(setup.client.as_ref(), IRIS_PROBE_PURPOSE, p))
        .map_err(|e| anyhow!("sealing a probe: {e}"))?;
    Ok(Sealed {
        probe,
        request: SearchRequest {
            session: context.session,
            probes,
        },
        client,
    })
}

/// Near-duplicates of random enrolled templates at rotations within ±`max_rotation`.
fn probes(
    setup: &Setup<'_>,
    count: usize,
    max_rotation: i32,
    rng: &mut ChaCha20Rng,
) -> Vec<IrisTemplate> {
    (0..count)
        .map(|_| {
            let original = &setup.templates[rng.gen_range(0..setup.templates.len())].1;
            near_duplicate(
                original,
                FLIP_RATE,
                rng.gen_range(-max_rotation..=max_rotation),
                rng,
            )
        })
        .collect()
}

/// Opens a probe's three outputs and checks them against the plaintext matcher.
fn check(setup: &Setup<'_>, s: &Sealed, params: SearchParams, sealed: &[Vec<u8>; 3]) -> Result<()> {
    let expected = ExpectedSearch {
        session: s.request.session,
        params,
        eye: Eye::Left,
    };
    let opened = open_outputs(
        &expected,
        &setup.keys,
        &[None, None, None],
        &s.client,
        [&sealed[0], &sealed[1], &sealed[2]],
    )
    .map_err(|e| anyhow!("{e}"))?;
    let (want, _) = plaintext_matches(
        &s.probe,
        setup.templates,
        params.max_rotation(),
        params.threshold().numerator(),
    );
    let want: Vec<&str> = want
        .iter()
        .map(|&i| setup.templates[i].0.as_str())
        .collect();
    let IrisResult::Identified(got) = opened.result else {
        bail!("an identify search answered a uniqueness bit");
    };
    let ours: Vec<&str> = got
        .iter()
        .map(String::as_str)
        .filter(|s| s.starts_with(&format!("{}-", setup.prefix)))
        .collect();
    if ours != want {
        bail!("privmatch {ours:?} but plaintext {want:?}");
    }
    Ok(())
}

/// The figures of one batch size.
struct Row {
    batch: usize,
    rotations: usize,
    wall: f64,
    entries: u64,
    rounds: u32,
    bytes_sent: [u64; 3],
    plaintext_per_probe: f64,
}

/// Runs `repetitions` batches of `b` probes; the median wall time and the last stats.
async fn measure(
    setup: &Setup<'_>,
    b: usize,
    max_rotation: i32,
    rng: &mut ChaCha20Rng,
) -> Result<Row> {
    let params = SearchParams::new(SearchMode::Identify, max_rotation, DEFAULT_TAU)
        .map_err(|e| anyhow!("{e}"))?;
    let key = IrisBatchKey {
        eye: Eye::Left,
        mode: SearchMode::Identify,
        max_rotation,
    };
    let timeout = Duration::from_secs_f64(setup.args.timeout);
    let mut walls = Vec::new();
    let mut last = None;
    let mut plaintext = f64::INFINITY;
    for repetition in 0..setup.args.repetitions.max(1) {
        let plain = probes(setup, b, max_rotation, rng);
        let started = Instant::now();
        for p in &plain {
            plaintext_matches(
                p,
                setup.templates,
                max_rotation,
                params.threshold().numerator(),
            );
        }
        plaintext = plaintext.min(started.elapsed().as_secs_f64() / b as f64);
        let sealed: Vec<Sealed> = plain
            .into_iter()
            .map(|p| seal(setup, p, params, rng))
            .collect::<Result<_>>()?;
        let requests: Vec<SearchRequest> = sealed.iter().map(|s| s.request.clone()).collect();
        let outcomes = run_batch(setup.parties, key, &requests, timeout).await;
        let mut stats = None;
        for (s, outcome) in sealed.iter().zip(outcomes) {
            let outcome = outcome.map_err(|e| anyhow!("batch of {b}, ±{max_rotation}: {e}"))?;
            check(setup, s, params, &outcome.sealed_outputs)
                .map_err(|e| anyhow!("batch of {b}, ±{max_rotation}: {e}"))?;
            stats = Some(outcome.stats);
        }
        let stats = stats.ok_or_else(|| anyhow!("an empty batch"))?;
        eprintln!(
            "  batch {b:>3}, max_rotation {max_rotation:>2}, repetition {repetition}: {:.3} s ({:.4} s per probe), answers checked",
            stats.seconds(),
            stats.seconds() / b as f64
        );
        walls.push(stats.seconds());
        last = Some(stats);
    }
    let stats = last.ok_or_else(|| anyhow!("no repetition ran"))?;
    Ok(Row {
        batch: b,
        rotations: 2 * max_rotation as usize + 1,
        wall: median(walls),
        entries: stats.entries.max(0) as u64,
        rounds: stats.rounds,
        bytes_sent: stats.bytes_sent,
        plaintext_per_probe: plaintext,
    })
}

fn print_rows(rows: &[Row]) {
    println!(
        "  {:>9} {:>5} {:>10} {:>12} {:>14} {:>16} {:>6} {:>24} {:>18} {:>11}",
        "rotations",
        "B",
        "wall s",
        "s / probe",
        "comparisons/s",
        "share MB / probe",
        "rounds",
        "MB sent / probe P0/P1/P2",
        "plaintext s/probe",
        "x plaintext"
    );
    for r in rows {
        let per_probe = r.wall / r.batch as f64;
        let comparisons = (r.entries as usize * r.rotations * r.batch) as f64;
        let share_mb = (r.entries * SHARE_BYTES_PER_TEMPLATE) as f64 / r.batch as f64 / 1e6;
        let mb = |b: u64| b as f64 / 1e6 / r.batch as f64;
        println!(
            "  {:>9} {:>5} {:>10.3} {:>12.4} {:>14.0} {:>16.2} {:>6} {:>24} {:>18.4} {:>11.1}",
            r.rotations,
            r.batch,
            r.wall,
            per_probe,
            comparisons / r.wall.max(1e-9),
            share_mb,
            r.rounds,
            format!(
                "{:.2} / {:.2} / {:.2}",
                mb(r.bytes_sent[0]),
                mb(r.bytes_sent[1]),
                mb(r.bytes_sent[2])
            ),
            r.plaintext_per_probe,
            per_probe / r.plaintext_per_probe.max(1e-12),
        );
    }
}

/// Single searches and batches of one, interleaved, with 31 rotations: their median wall times.
async fn single_against_batch_of_one(
    setup: &Setup<'_>,
    rng: &mut ChaCha20Rng,
) -> Result<(f64, f64)> {
    let params = SearchParams::new(SearchMode::Identify, MAX_ROTATION, DEFAULT_TAU)
        .map_err(|e| anyhow!("{e}"))?;
    let key = IrisBatchKey {
        eye: Eye::Left,
        mode: SearchMode::Identify,
        max_rotation: MAX_ROTATION,
    };
    let timeout = Duration::from_secs_f64(setup.args.timeout);
    let (mut single, mut batched) = (Vec::new(), Vec::new());
    for repetition in 0..setup.args.repetitions.max(1) {
        let plain = probes(setup, 2, MAX_ROTATION, rng);
        let mut sealed = plain.into_iter().map(|p| seal(setup, p, params, rng));
        let (a, b) = match (sealed.next(), sealed.next()) {
            (Some(a), Some(b)) => (a?, b?),
            _ => bail!("two probes were asked for"),
        };
        let one = run_search(setup.parties, &a.request, timeout)
            .await
            .map_err(|e| anyhow!("single search: {e}"))?;
        check(setup, &a, params, &one.sealed_outputs)?;
        let mut outcomes = run_batch(
            setup.parties,
            key,
            std::slice::from_ref(&b.request),
            timeout,
        )
        .await;
        let other = outcomes
            .pop()
            .ok_or_else(|| anyhow!("no answer"))?
            .map_err(|e| anyhow!("batch of one: {e}"))?;
        check(setup, &b, params, &other.sealed_outputs)?;
        eprintln!(
            "  interleaved {repetition}: single search {:.3} s, batch of one {:.3} s",
            one.stats.seconds(),
            other.stats.seconds()
        );
        single.push(one.stats.seconds());
        batched.push(other.stats.seconds());
    }
    Ok((median(single), median(batched)))
}

/// `privmatch bench iris --batch …` (module docs): the templates enrolled and a warm-up search
/// as `bench iris` does, then the batches.
pub async fn run(configs: &LocalConfigs, args: &IrisBenchArgs) -> Result<()> {
    let bench = enrolled(configs, args).await?;
    let mut rng = os_rng()?;
    let (probe, original, _) = near_probe(bench.templates(), &mut rng);
    let setup = bench.setup(configs, args, probe, original)?;
    let seconds = warm_up(&setup, &mut rng).await?;
    eprintln!("warm-up search: {seconds:.3} s (not counted)");
    run_batches(&setup, &args.batch, &mut rng).await
}

/// The batches of `sizes`, printed (module docs).
async fn run_batches(setup: &Setup<'_>, sizes: &[usize], rng: &mut ChaCha20Rng) -> Result<()> {
    if let Some(&b) = sizes
        .iter()
        .find(|&&b| b == 0 || b > privmatch_core::iris::service::MAX_BATCH_PROBES)
    {
        bail!(
            "--batch {b}: a batch holds 1 to {} probes",
            privmatch_core::iris::service::MAX_BATCH_PROBES
        );
    }
    let mut rows = Vec::new();
    use privmatch_core::iris::service::MAX_BATCH_COMPARISONS;
    for max_rotation in [0, MAX_ROTATION] {
        let rotations = 2 * max_rotation.max(0) as usize + 1;
        for &b in sizes {
            let comparisons = setup.args.n.saturating_mul(rotations).saturating_mul(b);
            if b > 1 && comparisons > MAX_BATCH_COMPARISONS {
                // A party refuses it (its working memory, core's `WORK_BYTES_PER_COMPARISON`);
                // the coordinator never forms it.
                eprintln!(
                    "  batch {b:>3}, max_rotation {max_rotation:>2}: skipped, {comparisons} comparisons are more than a batch may hold ({MAX_BATCH_COMPARISONS})"
                );
                continue;
            }
            rows.push(measure(setup, b, max_rotation, rng).await?);
        }
    }
    println!(
        "bench iris --batch: {} entries, identify, τ = {DEFAULT_TAU}, median of {} batch(es) per size; every answer opened with its own key and equal to the plaintext matcher",
        rows.first().map_or(0, |r| r.entries),
        setup.args.repetitions.max(1)
    );
    print_rows(&rows);
    println!("  (share MB / probe = template shares a party reads per probe: the scan reads each share once per batch; plaintext = fhd minimum over the same rotations for the same probes, one thread, best of the repetitions)");
    if sizes.contains(&1) {
        let (single, batched) = single_against_batch_of_one(setup, rng).await?;
        println!(
            "  a batch of one against a single search (31 rotations, interleaved, medians): {batched:.3} s against {single:.3} s = {:.3}",
            batched / single.max(1e-9)
        );
    }
    Ok(())
}
