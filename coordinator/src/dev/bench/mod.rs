//! `privmatch bench …`: benchmark programs. They print figures and ratios against a baseline
//! measured in the same run; they are not tests.
//!
//! `bench enroll` enrols N synthetic templates end to end (client sealing → coordinator →
//! two-phase commit at three parties) and compares with the floor of the same machine: plain
//! inserts of the same number of bytes (random bytea of the share sizes) into a scratch table at
//! the three parties, in the same batch size, without sealing or two-phase commit.
//!
//! `bench iris` ([`iris`]) measures searches; `bench face` ([`face`]) measures the face
//! modality.

pub mod face;
pub mod face_scale;
pub mod iris;
pub mod iris_batch;
pub mod paillier;
pub mod stats;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use futures::future::try_join_all;
use rand::RngCore;
use tokio_postgres::Client;

use crate::config::PartyConfig;
use crate::dev::LocalConfigs;
use crate::iris::client::{enroll_file, BatchOptions};
use crate::iris::synth::{enrollment_line, generate, SynthArgs};

/// Benchmarks.
#[derive(Subcommand, Clone, Debug)]
pub enum BenchAction {
    /// Bulk enrolment throughput, storage and WAL per record.
    Enroll(EnrollBenchArgs),
    /// Search latency and throughput against the memory floor and a plaintext matcher.
    Iris(iris::IrisBenchArgs),
    /// Face (Funshade): per-comparison costs against the C reference and a plaintext
    /// baseline, then verify latency and identify time through a running cluster.
    Face(face::FaceBenchArgs),
    /// Device-held templates (packed Paillier, Game-Set-MATCH): enrolment and Π1/Π2/Π3
    /// matching per round, in process on one core, against the paper's figures.
    Paillier(paillier::PaillierBenchArgs),
}

/// Options of `privmatch bench enroll`.
#[derive(Args, Clone, Debug)]
pub struct EnrollBenchArgs {
    /// Number of synthetic templates to enrol.
    #[arg(long, default_value_t = 100_000)]
    pub n: usize,
    /// Records per distributed transaction.
    #[arg(long, default_value_t = 250)]
    pub batch_size: usize,
    /// Where to write the synthetic input (default: a temporary file, removed afterwards).
    #[arg(long)]
    pub input: Option<PathBuf>,
}

const CODE_SHARE_BYTES: usize = 25_600;
const MASK_SHARE_BYTES: usize = 12_800;

async fn connect(party: &PartyConfig) -> Result<Client> {
    crate::parties::open(party)
        .await
        .with_context(|| format!("cannot connect to P{}", party.index))
}

/// WAL position and the size of the party's iris tables.
async fn snapshot(client: &Client) -> Result<(i64, i64)> {
    let row = client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, \
                    (pg_total_relation_size('privmatch.iris_templates') + pg_total_relation_size('privmatch.consumed_bundles') \
                     + pg_total_relation_size('privmatch.distributed_transactions'))::bigint",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

async fn baseline_insert(client: &Client, n: usize, batch: usize) -> Result<()> {
    client
        .batch_execute(
            "DROP TABLE IF EXISTS pm_bench_baseline; \
             CREATE TABLE pm_bench_baseline (id bigint, code bytea, mask bytea); \
             ALTER TABLE pm_bench_baseline ALTER COLUMN code SET STORAGE EXTERNAL, ALTER COLUMN mask SET STORAGE EXTERNAL;",
        )
        .await?;
    let mut rng = rand::rngs::OsRng;
    let mut done = 0;
    while done < n {
        let k = batch.min(n - done);
        let mut codes = Vec::with_capacity(k);
        let mut masks = Vec::with_capacity(k);
        for _ in 0..k {
            let mut code = vec![0u8; CODE_SHARE_BYTES];
            let mut mask = vec![0u8; MASK_SHARE_BYTES];
            rng.fill_bytes(&mut code);
            rng.fill_bytes(&mut mask);
            codes.push(code);
            masks.push(mask);
        }
        let ids: Vec<i64> = (done as i64..(done + k) as i64).collect();
        client
            .execute(
                "INSERT INTO pm_bench_baseline SELECT * FROM unnest($1::bigint[], $2::bytea[], $3::bytea[])",
                &[&ids, &codes, &masks],
            )
            .await?;
        done += k;
    }
    Ok(())
}

async fn enroll_bench(configs: &LocalConfigs, args: &EnrollBenchArgs) -> Result<()> {
    let run_id = {
        let mut b = [0u8; 4];
        rand::rngs::OsRng.fill_bytes(&mut b);
        hex::encode(b)
    };
    let (input, temporary) = match &args.input {
        Some(path) => (path.clone(), false),
        None => (
            std::env::temp_dir().join(format!("privmatch-bench-{run_id}.ndjson")),
            true,
        ),
    };
    eprintln!(
        "writing {} synthetic templates to {}",
        args.n,
        input.display()
    );
    {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(&input)?);
        let synth = SynthArgs {
            count: args.n,
            output: None,
            seed: u64::from_le_bytes([run_id.as_bytes()[0], 1, 2, 3, 4, 5, 6, 7]),
            near_duplicates: 0,
            flip_rate: 0.0,
            rotation: 0,
            prefix: format!("bench-{run_id}"),
        };
        generate(&synth, |subject, template| {
            writeln!(out, "{}", enrollment_line(subject, "left", template))?;
            Ok(())
        })?;
        out.flush()?;
    }
    // The operators' connections: the baseline writes a table of its own and reads WAL positions.
    let clients = try_join_all(configs.operators.iter().map(|o| connect(&o.party))).await?;

    eprintln!("baseline: plain inserts of the same bytes at the three parties");
    let before = try_join_all(clients.iter().map(snapshot)).await?;
    let started = Instant::now();
    try_join_all(
        clients
            .iter()
            .map(|c| baseline_insert(c, args.n, args.batch_size)),
    )
    .await?;
    let baseline_seconds = started.elapsed().as_secs_f64();
    let after = try_join_all(clients.iter().map(snapshot)).await?;
    let baseline_wal: Vec<f64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a.0 - b.0) as f64 / args.n as f64)
        .collect();
    for c in &clients {
        c.batch_execute("DROP TABLE pm_bench_baseline").await?;
        c.batch_execute("CHECKPOINT").await.ok();
    }

    eprintln!("privmatch: enrolling through the coordinator");
    let before = try_join_all(clients.iter().map(snapshot)).await?;
    let started = Instant::now();
    let options = BatchOptions {
        batch_size: args.batch_size,
        on_duplicate: "error".into(),
        parallel: 2,
        progress: true,
    };
    let (totals, _) = enroll_file(&configs.client, &input, &options).await?;
    let seconds = started.elapsed().as_secs_f64();
    let after = try_join_all(clients.iter().map(snapshot)).await?;
    if temporary {
        std::fs::remove_file(&input).ok();
    }

    let n = args.n as f64;
    let rate = n / seconds;
    let baseline_rate = n / baseline_seconds;
    println!(
        "bench enroll: N = {}, batch = {}, enrolled = {}",
        args.n, args.batch_size, totals.enrolled
    );
    println!(
        "  privmatch end to end : {seconds:.2} s, {rate:.0} records/s ({:.2} x the plain-insert baseline)",
        rate / baseline_rate
    );
    println!("  plain-insert baseline: {baseline_seconds:.2} s, {baseline_rate:.0} records/s (same bytes, no sealing, no 2PC)");
    println!(
        "  share bytes per record per party (code + mask): {}",
        CODE_SHARE_BYTES + MASK_SHARE_BYTES
    );
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        let stored = (a.1 - b.1) as f64 / n;
        let wal = (a.0 - b.0) as f64 / n;
        println!(
            "  P{i}: {stored:.0} bytes stored per record ({:.3} x share bytes), {wal:.0} WAL bytes per record ({:.2} x baseline WAL {:.0})",
            stored / (CODE_SHARE_BYTES + MASK_SHARE_BYTES) as f64,
            wal / baseline_wal[i],
            baseline_wal[i]
        );
    }
    Ok(())
}

/// Runs a benchmark; `configs` loads the local cluster's configurations (the in-process part
/// of `bench face` needs none).
pub async fn run(
    action: &BenchAction,
    configs: impl FnOnce() -> Result<LocalConfigs>,
) -> Result<()> {
    match action {
        BenchAction::Enroll(args) => enroll_bench(&configs()?, args).await,
        BenchAction::Iris(args) if !args.batch.is_empty() => {
            iris_batch::run(&configs()?, args).await
        }
        BenchAction::Iris(args) => iris::run(&configs()?, args).await,
        BenchAction::Face(args) if args.part == "scale" => face_scale::run(args).await,
        BenchAction::Face(args) => face::run(args, configs).await,
        BenchAction::Paillier(args) => paillier::run(args.clone()),
    }
}
