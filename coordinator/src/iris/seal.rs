//! `privmatch iris seal`: enrolments and probes shared and sealed here, to the pinned party
//! keys, and written as sealed inputs for the SQL front door (`privmatch.iris_enroll`,
//! `privmatch.iris_identify`, `privmatch.iris_is_unique`) instead of being sent. Nothing is
//! contacted: sealing needs only the configuration's pinned keys.
//!
//! A probe's reply key (docs/protocols/iris.md §13.2) is the static public key of the party
//! whose front door will be called (`--front-door`, pinned in this configuration): the three
//! parties seal their signed outputs to it, and that party opens them with its key file. The
//! coordinator relays them unread.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use privmatch_core::iris::params::SearchMode;
use privmatch_core::wire::sealed_input::SealedKind;

use crate::cli::keys::Sealer;
use crate::cli::sealed::{report, SealedWriter};
use crate::config::Config;
use crate::iris::client::{enroll_body, search_body};
use crate::iris::input::{for_each_record, read_probe_file, validate_file};
use privmatch_api::iris::eyes::EyePolicy;
use privmatch_api::iris::{check_policy, search_params, SealedSearch, SearchParamsBody};
use privmatch_core::iris::policy::DEFAULT_TAU;

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
    #[arg(long, default_value_t = DEFAULT_TAU)]
    pub threshold: f64,
    /// Two-eye probes: `or` or `and` (see `privmatch iris search --policy`).
    #[arg(long, default_value = "or", value_parser = ["or", "and"])]
    pub policy: String,
    /// Identify and uniqueness: the party (0, 1 or 2) whose SQL front door the application
    /// will call. The parties seal their outputs to that party's pinned key; only it can open
    /// them.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub front_door: Option<u8>,
}

/// Runs `privmatch iris seal`.
pub fn run(config: &Config, args: &SealArgs) -> Result<()> {
    let mut sealer = Sealer::new(config)?;
    match (args.purpose.as_str(), args.front_door) {
        ("enroll", Some(_)) => {
            bail!("--front-door is for probes (--for identify or uniqueness)")
        }
        ("enroll", None) | (_, Some(_)) => {}
        (purpose, None) => bail!(
            "--front-door is required with --for {purpose}: the party (0, 1 or 2) whose SQL front door will be called, which opens the result"
        ),
    }
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
        let body = enroll_body(std::slice::from_ref(&record), sealer)?;
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
    let front_door = usize::from(args.front_door.unwrap_or_default());
    let reply_key = sealer.keys[front_door];
    let probes = read_probe_file(&args.input)?;
    let mut out = SealedWriter::create(args.out.as_deref())?;
    for probe in &probes {
        check_policy(mode, policy, probe.eyes.len())
            .map_err(|e| anyhow!("line {}: {e}", probe.line))?;
        let search = search_body(sealer, probe, params, policy, &reply_key)
            .map_err(|e| anyhow!("line {}: {e}", probe.line))?;
        // The front door keeps the parameters (to check the outputs) and forwards the body.
        let sealed = SealedSearch {
            params: SearchParamsBody::of(params),
            search,
        };
        out.write_json("", kind, &sealed)?;
    }
    out.finish()
}
