//! `privmatch face synth`: synthetic face embeddings for demos, tests and benchmarks.
//!
//! The generator (deterministic per seed, documented so that results can be checked):
//!
//! * **Enrolled template of subject i**: a uniformly random direction on the unit sphere of
//!   R^l — l independent standard normal draws (Box–Muller), divided by their L2 norm.
//! * **Re-capture of subject i** (a probe of the same face): template_i + (noise / √l) · g,
//!   with g a fresh standard normal vector, L2-normalised again. The perturbation has norm ≈
//!   `noise`, so the cosine similarity with the template is ≈ 1 / √(1 + noise²) (0.958 for the
//!   default 0.3) and the squared Euclidean distance ≈ 2 − 2·that (0.084).
//! * **Impostor k**: another independent random direction (a face never enrolled).
//!
//! Two independent random unit vectors of dimension l have cosine ≈ N(0, 1/l) (standard
//! deviation 0.088 at l = 128, 0.044 at l = 512), so with the default noise any cosine threshold
//! around 0.5–0.8 (or squared Euclidean distance around 0.4–1.0) separates re-captures from
//! impostors with overwhelming probability.
//!
//! Every vector has its own ChaCha20 stream of the seed (template i: stream 3i, re-capture i:
//! 3i + 1, impostor k: 3k + 2), so any subset can be regenerated without the others.
//!
//! Output: `--out` gets one enrolment line per subject, `{"subject": "<prefix>-<i:07>",
//! "embedding": [...]}`; `--probes` gets one re-capture per subject, in order, with the subject
//! it belongs to, then `--impostors` lines with subjects `<prefix>-impostor-<k:07>` (which are
//! never enrolled). Verify and identify ignore the `subject` key of a probe line; it records the
//! expected answer.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use privmatch_core::face::quantize::check_dim;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::face::input::embedding_line;

/// The synthetic embedding generator (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaceSynth {
    /// Embedding dimension l.
    pub dim: usize,
    /// RNG seed.
    pub seed: u64,
    /// Norm of a re-capture's perturbation before renormalisation.
    pub noise: f64,
}

impl FaceSynth {
    fn rng(&self, stream: u64) -> ChaCha20Rng {
        let mut rng = ChaCha20Rng::seed_from_u64(self.seed);
        rng.set_stream(stream);
        rng
    }

    fn gaussian(rng: &mut ChaCha20Rng, dim: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(dim + 1);
        while out.len() < dim {
            // Box–Muller: u1 in (0, 1] so that the logarithm is finite.
            let u1: f64 = 1.0 - rng.gen::<f64>();
            let u2: f64 = rng.gen::<f64>();
            let r = (-2.0 * u1.ln()).sqrt();
            let t = std::f64::consts::TAU * u2;
            out.push(r * t.cos());
            out.push(r * t.sin());
        }
        out.truncate(dim);
        out
    }

    fn unit(v: Vec<f64>) -> Vec<f64> {
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm == 0.0 || !norm.is_finite() {
            // Probability zero; a fixed axis keeps the output well defined.
            let mut e = vec![0.0; v.len()];
            if let Some(first) = e.first_mut() {
                *first = 1.0;
            }
            return e;
        }
        v.into_iter().map(|x| (x / norm).clamp(-1.0, 1.0)).collect()
    }

    fn random_direction(&self, stream: u64) -> Vec<f64> {
        Self::unit(Self::gaussian(&mut self.rng(stream), self.dim))
    }

    /// The enrolled template of subject `i` (a unit vector).
    pub fn template(&self, i: u64) -> Vec<f64> {
        self.random_direction(i.wrapping_mul(3))
    }

    /// A noisy re-capture of subject `i` (a unit vector).
    pub fn recapture(&self, i: u64) -> Vec<f64> {
        self.perturb(&self.template(i), i.wrapping_mul(3).wrapping_add(1))
    }

    /// `base` + (noise / √l) · g with g standard normal from ChaCha20 stream `stream` of the
    /// seed, L2-normalised (re-captures use stream 3i + 1; other callers pick streams that
    /// collide with none they use).
    pub fn perturb(&self, base: &[f64], stream: u64) -> Vec<f64> {
        let mut rng = self.rng(stream);
        let scale = self.noise / (base.len().max(1) as f64).sqrt();
        let noisy = base
            .iter()
            .zip(Self::gaussian(&mut rng, base.len()))
            .map(|(x, g)| x + scale * g)
            .collect();
        Self::unit(noisy)
    }

    /// Impostor `k`: a random face that is not enrolled (a unit vector).
    pub fn impostor(&self, k: u64) -> Vec<f64> {
        self.random_direction(k.wrapping_mul(3).wrapping_add(2))
    }
}

/// Options of `privmatch face synth`.
#[derive(Args, Clone, Debug)]
pub struct FaceSynthArgs {
    /// Number of subjects.
    #[arg(long)]
    pub subjects: usize,
    /// Embedding dimension (128..=1024).
    #[arg(long, default_value_t = 512)]
    pub dim: usize,
    /// Enrolment NDJSON to write: one template per subject.
    #[arg(long)]
    pub out: PathBuf,
    /// Probe NDJSON to write: one noisy re-capture per subject, then the impostors.
    #[arg(long)]
    pub probes: Option<PathBuf>,
    /// RNG seed (the same seed gives the same files).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Norm of the perturbation of a re-capture (0 = identical to the template).
    #[arg(long, default_value_t = 0.3)]
    pub noise: f64,
    /// Probes of faces that are not enrolled, appended to --probes.
    #[arg(long, default_value_t = 0)]
    pub impostors: usize,
    /// Subject id prefix.
    #[arg(long, default_value = "face")]
    pub prefix: String,
}

/// The subject id of synthetic subject `i`.
pub fn subject_id(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:07}")
}

/// The subject id of synthetic impostor `k` (never enrolled).
pub fn impostor_id(prefix: &str, k: usize) -> String {
    format!("{prefix}-impostor-{k:07}")
}

fn create(path: &Path) -> Result<BufWriter<std::fs::File>> {
    Ok(BufWriter::new(std::fs::File::create(path).with_context(
        || format!("cannot create {}", path.display()),
    )?))
}

/// `privmatch face synth`.
pub fn run(args: &FaceSynthArgs) -> Result<()> {
    check_dim(args.dim).map_err(|e| anyhow::anyhow!("--dim: {e}"))?;
    if !(args.noise.is_finite() && args.noise >= 0.0) {
        bail!("--noise must be a non-negative number");
    }
    if args.probes.is_none() && args.impostors > 0 {
        bail!("--impostors needs --probes");
    }
    let synth = FaceSynth {
        dim: args.dim,
        seed: args.seed,
        noise: args.noise,
    };
    let mut out = create(&args.out)?;
    for i in 0..args.subjects {
        writeln!(
            out,
            "{}",
            embedding_line(&subject_id(&args.prefix, i), &synth.template(i as u64))
        )?;
    }
    out.flush()?;
    if let Some(path) = &args.probes {
        let mut probes = create(path)?;
        for i in 0..args.subjects {
            writeln!(
                probes,
                "{}",
                embedding_line(&subject_id(&args.prefix, i), &synth.recapture(i as u64))
            )?;
        }
        for k in 0..args.impostors {
            writeln!(
                probes,
                "{}",
                embedding_line(&impostor_id(&args.prefix, k), &synth.impostor(k as u64))
            )?;
        }
        probes.flush()?;
    }
    eprintln!(
        "wrote {} subjects (dim {}) to {}{}",
        args.subjects,
        args.dim,
        args.out.display(),
        args.probes
            .as_ref()
            .map(|p| format!(
                ", {} re-captures and {} impostors to {}",
                args.subjects,
                args.impostors,
                p.display()
            ))
            .unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn vectors_are_unit_deterministic_and_independent_of_order() {
        let s = FaceSynth {
            dim: 512,
            seed: 9,
            noise: 0.3,
        };
        let t = s.template(4);
        assert_eq!(t.len(), 512);
        assert!((cosine(&t, &t) - 1.0).abs() < 1e-9);
        assert_eq!(t, s.template(4));
        assert_ne!(t, s.template(5));
        let other_seed = FaceSynth { seed: 10, ..s };
        assert_ne!(t, other_seed.template(4));
    }

    #[test]
    fn recaptures_are_close_and_impostors_far() {
        let s = FaceSynth {
            dim: 512,
            seed: 1,
            noise: 0.3,
        };
        for i in 0..20 {
            let c = cosine(&s.template(i), &s.recapture(i));
            assert!((0.9..1.0).contains(&c), "recapture {i}: {c}");
            let far = cosine(&s.template(i), &s.impostor(i));
            assert!(far.abs() < 0.3, "impostor {i}: {far}");
            let other = cosine(&s.template(i), &s.template(i + 1));
            assert!(other.abs() < 0.3, "pair {i}: {other}");
        }
        let exact = FaceSynth { noise: 0.0, ..s };
        assert!((cosine(&exact.template(3), &exact.recapture(3)) - 1.0).abs() < 1e-9);
    }
}
