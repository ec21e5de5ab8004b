//! `privmatch iris seal`: enrolments and probes shared and sealed here, to the pinned party
//! keys, and written as sealed inputs for the SQL front door (`privmatch.iris_enroll`,
//! `privmatch.iris_identify`, `privmatch.iris_is_unique`) instead of being sent. Nothing is
//! contacted: sealing needs only the configuration's pinned keys.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::Args;
use privmatch_core::iris::params::SearchMode;
use privmatch_core::wire::sealed_input::SealedKind;

use crate::cli::keys::Sealer;
use crate::cli::sealed::{report, SealedWriter};
use crate::config::Config;
use crate::iris::api::{search_params, DEFAULT_THRESHOLD};
use crate::iris::client::{enroll_body, search_body};
use crate::iris::eyes::{EyePolicy, UNIQUENESS_AND_UNSUPPORTED};
use crate::iris::input::{for_each_record, read_probe_file, validate_file};

/// Options of `privmatch iris seal`.
#[derive(Args, Clone, Debug)]
pub struct SealArgs {
    /// What the inputs are for: `enroll` (privmatch.iris_enroll; the input is enrolment NDJSON),
    /// `identify` (privmatch.iris_identify) or `uniqueness` (privmatch.iris_is_unique; both
    /// take probe NDJSON).
    #[arg(long = "for", value_parser = ["enroll", "identify", "uniqueness"])]
    pub purpose: String,
    /// NDJSON input file (the format of `privmatch iris enroll` or `privmatch iris search`).
    #[arg(long)]
    pub input: PathBuf,
    /// Output file (default: standard output): `<subject>\t<sealed input>` per record.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Probes: rotations tried, −N..=N columns (0..=15).
    #[arg(long, default_value_t = 15)]
    pub max_rotation: i32,
    /// Probes: the deployment's iris threshold policy (`privmatch iris policy show`; 0.345 at
    /// install). Sealing is offline, so it is given here; the parties refuse a probe sealed
    /// with any other threshold than their policy (22023), so it cannot be chosen per search.
    #[arg(long, default_value_t = DEFAULT_THRESHOLD)]
    pub threshold: f64,
    /// Two-eye probes: `or` or `and` (see `privmatch iris search --policy`).
    #[arg(long, default_value = "or", value_parser = ["or", "and"])]
    pub policy: String,
}

/// Runs `privmatch iris seal`.
pub fn run(config: &Config, args: &SealArgs) -> Result<()> {
    let mut sealer = Sealer::new(config)?;
    let (kind, written) = match args.purpose.as_str() {
        "enroll" => (SealedKind::IrisEnroll, seal_enrolments(&mut sealer, args)?),
        "identify" => (
            SealedKind::IrisIdentify,
            seal_probes(&mut sealer, args, SearchMode::Identify)?,
        ),
        _ => (
            SealedKind::IrisUniqueness,
            seal_probes(&mut sealer, args, SearchMode::Uniqueness)?,
        ),
    };
    report(written, kind, args.out.as_deref());
    Ok(())
}

/// One sealed enrolment per record (validated as a whole first, as `iris enroll` does).
fn seal_enrolments(sealer: &mut Sealer, args: &SealArgs) -> Result<usize> {
    validate_file(&args.input)?;
    let mut out = SealedWriter::create(args.out.as_deref())?;
    for_each_record(&args.input, |record| {
        let body = enroll_body(std::slice::from_ref(&record), &sealer.keys, &mut sealer.rng)?;
        out.write(&record.subject, SealedKind::IrisEnroll, body)
    })?;
    out.finish()
}

/// One sealed search per probe line, each eye for its own fresh session.
fn seal_probes(sealer: &mut Sealer, args: &SealArgs, mode: SearchMode) -> Result<usize> {
    let params = search_params(mode, args.max_rotation, args.threshold).map_err(|e| anyhow!(e))?;
    let policy = if args.policy == "and" {
        EyePolicy::And
    } else {
        EyePolicy::Or
    };
    let kind = match mode {
        SearchMode::Identify => SealedKind::IrisIdentify,
        SearchMode::Uniqueness => SealedKind::IrisUniqueness,
    };
    let probes = read_probe_file(&args.input)?;
    let mut out = SealedWriter::create(args.out.as_deref())?;
    for probe in &probes {
        if mode == SearchMode::Uniqueness && policy == EyePolicy::And && probe.eyes.len() > 1 {
            return Err(anyhow!("line {}: {UNIQUENESS_AND_UNSUPPORTED}", probe.line));
        }
        let body = search_body(sealer, probe, params, policy)
            .map_err(|e| anyhow!("line {}: {e}", probe.line))?;
        out.write_json("", kind, &body)?;
    }
    out.finish()
}
