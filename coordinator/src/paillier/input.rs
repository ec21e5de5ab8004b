//! The one face embedding `privmatch device enroll` (the template u) and `privmatch terminal
//! verify` (the live capture w) read: the face input format of [`crate::cli::embedding`]
//! (`{"embedding": [floats]}`, a `"subject"` key ignored), exactly one non-blank line, checked
//! and quantised here before anything is sent, with the parameters' quantiser
//! (`privmatch_core::paillier::quantize`: normalised, then rounded within the norm bound ζ²
//! the enrolment proves). Every error names the file and the line.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use privmatch_core::paillier::params::Params;
use privmatch_core::paillier::quantize::Quantizer;

use crate::cli::embedding::probe_elements;
use crate::cli::ndjson::for_each_line;

/// One embedding as read: its line and its float elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// 1-based line number in the file.
    pub line: usize,
    /// The elements, as written.
    pub elements: Vec<f64>,
}

/// Reads the one embedding of `path`; a file with none or with several is refused.
pub fn read_embedding(path: &Path) -> Result<Embedding> {
    let mut found: Option<Embedding> = None;
    let mut lines = 0usize;
    for_each_line(path, |line, text| {
        lines += 1;
        if found.is_some() {
            return Ok(());
        }
        let elements =
            probe_elements(line, text).map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
        found = Some(Embedding { line, elements });
        Ok(())
    })?;
    match (found, lines) {
        (Some(embedding), 1) => Ok(embedding),
        (None, _) => bail!("{} holds no embedding", path.display()),
        (Some(_), n) => bail!(
            "{} holds {n} embeddings: one per device enrolment or verification",
            path.display()
        ),
    }
}

/// Quantises `embedding` (read from `path`) for `params`: the integer template.
pub fn quantize(path: &Path, embedding: &Embedding, params: &Params) -> Result<Vec<i32>> {
    let quantizer = Quantizer::new(params)?;
    quantizer.quantize(&embedding.elements).map_err(|e| {
        anyhow!(
            "{} line {}: bad \"embedding\": {e}",
            path.display(),
            embedding.line
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmatch_core::paillier::params::{Protocol, DEFAULT_STAT_BITS};
    use rug::Integer;

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("pm-pinput-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn exactly_one_embedding_is_read_and_quantised_within_the_bound() {
        let params = Params::new(
            Protocol::Pi1,
            4,
            8,
            2048,
            DEFAULT_STAT_BITS,
            Integer::from(10_000),
        )
        .expect("params");
        let one = file(
            "one",
            "\n{\"subject\": \"x\", \"embedding\": [3, 4, 0, 0]}\n",
        );
        let e = read_embedding(&one).expect("one");
        assert_eq!(e.line, 2);
        let u = quantize(&one, &e, &params).expect("quantised");
        assert!(u[0] > 0 && u[1] > u[0] && u[2] == 0);
        let two = file("two", "{\"embedding\": [1]}\n{\"embedding\": [1]}\n");
        let err = format!("{:#}", read_embedding(&two).expect_err("two"));
        assert!(err.contains("holds 2 embeddings"), "{err}");
        let none = file("none", "\n\n");
        assert!(format!("{:#}", read_embedding(&none).expect_err("none")).contains("no embedding"));
        let short = file("short", "{\"embedding\": [1, 2, 3]}\n");
        let e = read_embedding(&short).expect("read");
        let err = format!(
            "{:#}",
            quantize(&short, &e, &params).expect_err("dimension")
        );
        assert!(
            err.contains("line 1") && err.contains("expected 4, got 3"),
            "{err}"
        );
        let nan = file("nan", "{\"embedding\": [1, \"NaN\", 0, 0]}\n");
        let err = format!("{:#}", read_embedding(&nan).expect_err("nan"));
        assert!(
            err.contains("line 1") && err.contains("element 1 is not a finite"),
            "{err}"
        );
        for p in [one, two, none, short, nan] {
            std::fs::remove_file(p).ok();
        }
    }
}
