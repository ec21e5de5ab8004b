//! `privmatch iris synth`: realistic synthetic iris templates as enrolment NDJSON (random
//! codes; masks with about 10% of positions cleared in real/imag pairs, as Open-IRIS masks are
//! duplicated along the last axis), optionally followed by near-duplicates of the first ones.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{IrisTemplate, MAX_ROTATION};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// Options of `privmatch iris synth`.
#[derive(Args, Clone, Debug)]
pub struct SynthArgs {
    /// Number of independent random templates.
    pub count: usize,
    /// Output file (default: standard output).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// RNG seed (the same seed gives the same file).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write this many near-duplicates, of templates 0, 1, 2, …
    #[arg(long, default_value_t = 0)]
    pub near_duplicates: usize,
    /// Probability that each code bit of a near-duplicate is flipped.
    #[arg(long, default_value_t = 0.1)]
    pub flip_rate: f64,
    /// Column rotation of near-duplicates (−15..=15).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub rotation: i32,
    /// Subject id prefix.
    #[arg(long, default_value = "synth")]
    pub prefix: String,
}

/// One enrolment line.
pub fn enrollment_line(subject: &str, eye: &str, template: &IrisTemplate) -> String {
    serde_json::json!({
        "subject": subject,
        "eye": eye,
        "iris_codes": template.code.to_base64(),
        "mask_codes": template.mask.to_base64(),
    })
    .to_string()
}

/// Generates the templates of a synth run: `count` random ones, then the near-duplicates,
/// each with its subject id.
pub fn generate(
    args: &SynthArgs,
    mut sink: impl FnMut(&str, &IrisTemplate) -> Result<()>,
) -> Result<()> {
    if !(0.0..=1.0).contains(&args.flip_rate) {
        bail!("--flip-rate must be between 0 and 1");
    }
    if args.rotation.abs() > MAX_ROTATION {
        bail!("--rotation must be within ±{MAX_ROTATION} columns");
    }
    if args.near_duplicates > args.count {
        bail!("--near-duplicates cannot exceed the number of templates");
    }
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let mut originals = Vec::with_capacity(args.near_duplicates);
    for i in 0..args.count {
        let template = random_template(&mut rng);
        sink(&format!("{}-{i:07}", args.prefix), &template)?;
        if i < args.near_duplicates {
            originals.push(template);
        }
    }
    for (i, original) in originals.iter().enumerate() {
        let template = near_duplicate(original, args.flip_rate, args.rotation, &mut rng);
        sink(&format!("{}-{i:07}-near", args.prefix), &template)?;
    }
    Ok(())
}

/// `privmatch iris synth`.
pub fn run(args: &SynthArgs) -> Result<()> {
    let out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::new(out);
    generate(args, |subject, template| {
        writeln!(out, "{}", enrollment_line(subject, "left", template))?;
        Ok(())
    })?;
    out.flush()?;
    Ok(())
}
