//! Reading face embeddings from NDJSON: one JSON object per line.
//!
//! Enrolment line: `{"subject": "...", "embedding": [x_0, …, x_{l−1}]}`. Probe line (verify,
//! identify): `{"embedding": [...]}`; a `"subject"` key is ignored, so an enrolment file can be
//! used as probes. Blank lines are skipped; probe *i* is the line with 0-based index *i*.
//!
//! The line format and the strict reading of the float elements are shared with the other face
//! modality ([`crate::cli::embedding`]). Every embedding is checked and quantised here, on the
//! client, before anything is sent (`privmatch_core::face::quantize` over
//! `privmatch_core::embedding`): the dimension must be supported (128..=1024) and equal to
//! that of the file's first embedding; every element must be a finite number in [−1, 1]
//! (anything larger could overflow the secure comparison). `--normalize` L2-normalises each
//! embedding first (the cosine metric expects unit vectors; a normalised vector always lies in
//! [−1, 1]). Every error names the line and the reason; nothing is sent while any line is bad.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use privmatch_core::embedding::{check_finite, normalize, EmbeddingError};
use privmatch_core::face::quantize::Quantizer;
use privmatch_core::face::FaceError;
use privmatch_core::wire::envelope::validate_subject;
use serde::Deserialize;
use serde_json::Value;

use crate::cli::embedding::{elements_of, probe_elements};
use crate::cli::ndjson::read_records;

/// One enrolment line as written.
#[derive(Deserialize)]
struct RawEnrollLine {
    subject: Option<Value>,
    embedding: Option<Vec<Value>>,
}

/// One enrolment record, checked and quantised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaceEnrollRecord {
    /// 1-based line number in the input, for messages.
    pub line: usize,
    /// Subject id.
    pub subject: String,
    /// The quantised embedding (never leaves the client unshared).
    pub embedding: Vec<i32>,
}

/// One probe, checked and quantised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaceProbeRecord {
    /// 1-based line number in the input.
    pub line: usize,
    /// The probe's index: the 0-based line index.
    pub index: usize,
    /// The quantised embedding.
    pub embedding: Vec<i32>,
}

/// How embeddings are prepared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbeddingOptions {
    /// L2-normalise each embedding before quantising it.
    pub normalize: bool,
}

/// Checks and quantises one embedding. `expected` is the dimension of the file's first
/// embedding (None for the first one).
pub fn prepare_embedding(
    elements: &[f64],
    expected: Option<usize>,
    options: EmbeddingOptions,
) -> Result<Vec<i32>, String> {
    if let Some(expected) = expected {
        if elements.len() != expected {
            return Err(format!(
                "wrong embedding dimension: expected {expected} (the dimension of the first embedding), got {}",
                elements.len()
            ));
        }
    }
    let quantizer = Quantizer::new(elements.len()).map_err(|e| e.to_string())?;
    check_finite(elements).map_err(|e| e.to_string())?;
    let quantized = if options.normalize {
        let unit = normalize(elements).map_err(|e| e.to_string())?;
        quantizer.quantize(&unit)
    } else {
        quantizer.quantize(elements)
    };
    quantized.map_err(|e| match e {
        FaceError::Embedding(EmbeddingError::OutOfRange { .. }) if !options.normalize => {
            format!("{e} — pass --normalize to L2-normalise every embedding")
        }
        other => other.to_string(),
    })
}

/// Quantises the float `elements` of line `line_number` ([`prepare_embedding`]).
fn quantized(
    line_number: usize,
    elements: &[f64],
    expected: Option<usize>,
    options: EmbeddingOptions,
) -> Result<Vec<i32>> {
    prepare_embedding(elements, expected, options)
        .map_err(|e| anyhow!("line {line_number}: bad \"embedding\": {e}"))
}

/// Parses one enrolment line (`expected`: the dimension of the first embedding, if any).
pub fn parse_enroll_line(
    line_number: usize,
    text: &str,
    expected: Option<usize>,
    options: EmbeddingOptions,
) -> Result<FaceEnrollRecord> {
    let raw: RawEnrollLine = serde_json::from_str(text).with_context(|| {
        format!("line {line_number}: not a JSON object with \"subject\" and \"embedding\"")
    })?;
    let subject = match raw.subject {
        Some(Value::String(s)) => s,
        Some(_) => bail!("line {line_number}: bad \"subject\": it must be a string"),
        None => bail!("line {line_number}: missing \"subject\""),
    };
    validate_subject(&subject).with_context(|| format!("line {line_number}: bad \"subject\""))?;
    let elements = elements_of(line_number, raw.embedding)?;
    let embedding = quantized(line_number, &elements, expected, options)?;
    Ok(FaceEnrollRecord {
        line: line_number,
        subject,
        embedding,
    })
}

/// Parses one probe line (`expected`: the dimension of the first embedding, if any).
pub fn parse_probe_line(
    line_number: usize,
    text: &str,
    expected: Option<usize>,
    options: EmbeddingOptions,
) -> Result<FaceProbeRecord> {
    let elements = probe_elements(line_number, text)?;
    let embedding = quantized(line_number, &elements, expected, options)?;
    Ok(FaceProbeRecord {
        line: line_number,
        index: line_number.saturating_sub(1),
        embedding,
    })
}

/// Parses enrolment NDJSON text (already read): every line, the common dimension, no subject
/// twice. Errors name the line.
pub fn parse_enroll_lines<'a>(
    lines: impl IntoIterator<Item = (usize, &'a str)>,
    options: EmbeddingOptions,
) -> Result<Vec<FaceEnrollRecord>> {
    let mut records: Vec<FaceEnrollRecord> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for (line_number, text) in lines {
        let expected = records.first().map(|r| r.embedding.len());
        let record = parse_enroll_line(line_number, text, expected, options)?;
        if !seen.insert(record.subject.clone()) {
            bail!(
                "line {line_number}: subject {:?} appears twice in the input (one face template per subject)",
                record.subject
            );
        }
        records.push(record);
    }
    Ok(records)
}

/// The lines of a file as `parse_*_lines` take them.
fn numbered(lines: &[(usize, String)]) -> impl Iterator<Item = (usize, &str)> {
    lines.iter().map(|(n, t)| (*n, t.as_str()))
}

/// Reads and validates a whole enrolment file (nothing is sent if any line is bad).
pub fn read_enroll_file(path: &Path, options: EmbeddingOptions) -> Result<Vec<FaceEnrollRecord>> {
    read_records(path, "enrolment record", |lines| {
        parse_enroll_lines(numbered(lines), options)
            .with_context(|| format!("{} (nothing was enrolled)", path.display()))
    })
}

/// Parses probe NDJSON text (already read): every line, the common dimension.
pub fn parse_probe_lines<'a>(
    lines: impl IntoIterator<Item = (usize, &'a str)>,
    options: EmbeddingOptions,
) -> Result<Vec<FaceProbeRecord>> {
    let mut records: Vec<FaceProbeRecord> = Vec::new();
    for (line_number, text) in lines {
        let expected = records.first().map(|r| r.embedding.len());
        records.push(parse_probe_line(line_number, text, expected, options)?);
    }
    Ok(records)
}

/// Reads and validates a whole probe file (nothing is sent if any line is bad).
pub fn read_probe_file(path: &Path, options: EmbeddingOptions) -> Result<Vec<FaceProbeRecord>> {
    read_records(path, "probe", |lines| {
        parse_probe_lines(numbered(lines), options)
            .with_context(|| format!("{} (no probe was searched)", path.display()))
    })
}

/// One NDJSON line with a subject and an embedding (elements written as f32, the precision
/// embedding models produce, which keeps files small).
pub fn embedding_line(subject: &str, embedding: &[f64]) -> String {
    use std::fmt::Write;
    let mut line = String::with_capacity(32 + 12 * embedding.len());
    line.push_str("{\"subject\":");
    line.push_str(&serde_json::Value::from(subject).to_string());
    line.push_str(",\"embedding\":[");
    for (i, &x) in embedding.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        let x = x as f32;
        // Display of an f32 is its shortest round-trip form; a non-finite value (never made
        // by the generator) is written as the string the reader refuses.
        let _ = if x.is_finite() {
            write!(line, "{x}")
        } else {
            write!(
                line,
                "\"{}\"",
                if x.is_nan() {
                    "NaN"
                } else if x > 0.0 {
                    "Infinity"
                } else {
                    "-Infinity"
                }
            )
        };
    }
    line.push_str("]}");
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(subject: &str, elements: &[String]) -> String {
        format!(
            "{{\"subject\": \"{subject}\", \"embedding\": [{}]}}",
            elements.join(", ")
        )
    }

    fn unit(dim: usize, axis: usize) -> Vec<String> {
        (0..dim)
            .map(|i| if i == axis { "1.0".into() } else { "0".into() })
            .collect()
    }

    fn enroll_err(text: &str, expected: Option<usize>, normalize: bool) -> String {
        parse_enroll_line(7, text, expected, EmbeddingOptions { normalize })
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default()
    }

    #[test]
    fn a_good_line_is_quantised() {
        let record = parse_enroll_line(1, &line("alice", &unit(128, 3)), None, Default::default())
            .expect("valid");
        assert_eq!(record.subject, "alice");
        assert_eq!(record.embedding.len(), 128);
        assert_eq!(record.embedding[3], 1448);
        assert_eq!(record.embedding[0], 0);
    }

    #[test]
    fn errors_name_the_line_and_the_reason() {
        let mut big = unit(128, 0);
        big[5] = "1.5".into();
        let err = enroll_err(&line("a", &big), None, false);
        assert!(err.contains("line 7") && err.contains("element 5"), "{err}");
        assert!(
            err.contains("could overflow") && err.contains("--normalize"),
            "{err}"
        );
        // --normalize makes the same line acceptable.
        assert!(parse_enroll_line(
            7,
            &line("a", &big),
            None,
            EmbeddingOptions { normalize: true }
        )
        .is_ok());

        let err = enroll_err(&line("a", &unit(128, 0)), Some(256), false);
        assert!(
            err.contains("line 7") && err.contains("expected 256") && err.contains("got 128"),
            "{err}"
        );
        let err = enroll_err(&line("a", &unit(100, 0)), None, false);
        assert!(err.contains("unsupported embedding dimension 100"), "{err}");

        for name in ["\"NaN\"", "\"Infinity\"", "\"-Infinity\""] {
            let mut e = unit(128, 0);
            e[9] = name.into();
            let err = enroll_err(&line("a", &e), None, false);
            assert!(
                err.contains("line 7") && err.contains("element 9 is not a finite number"),
                "{name}: {err}"
            );
            // Normalising does not launder a non-finite element.
            let err = enroll_err(&line("a", &e), None, true);
            assert!(err.contains("element 9 is not a finite number"), "{err}");
        }
        let mut e = unit(128, 0);
        e[2] = "\"abc\"".into();
        assert!(enroll_err(&line("a", &e), None, false).contains("element 2 is a string"));
        e[2] = "null".into();
        assert!(enroll_err(&line("a", &e), None, false).contains("element 2 is null"));

        let err = enroll_err(&line("", &unit(128, 0)), None, false);
        assert!(err.contains("line 7: bad \"subject\""), "{err}");
        let err = enroll_err("{\"embedding\": [1]}", None, false);
        assert!(err.contains("missing \"subject\""), "{err}");
        let err = enroll_err("{\"subject\": 5, \"embedding\": [1]}", None, false);
        assert!(err.contains("must be a string"), "{err}");
        let err = enroll_err("{\"subject\": \"a\"}", None, false);
        assert!(err.contains("missing \"embedding\""), "{err}");
        let err = enroll_err("not json", None, false);
        assert!(err.contains("line 7: not a JSON object"), "{err}");
        let zero: Vec<String> = (0..128).map(|_| "0".into()).collect();
        let err = enroll_err(&line("a", &zero), None, true);
        assert!(err.contains("zero vector"), "{err}");
    }

    #[test]
    fn files_need_one_dimension_and_distinct_subjects() {
        let a = line("a", &unit(128, 0));
        let b = line("b", &unit(128, 1));
        let short = line("c", &unit(129, 1));
        let ok = parse_enroll_lines([(1, a.as_str()), (3, b.as_str())], Default::default())
            .expect("valid");
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[1].line, 3);
        let err = parse_enroll_lines([(1, a.as_str()), (2, short.as_str())], Default::default())
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            err.contains("line 2") && err.contains("expected 128"),
            "{err}"
        );
        let err = parse_enroll_lines([(1, a.as_str()), (2, a.as_str())], Default::default())
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            err.contains("line 2") && err.contains("appears twice"),
            "{err}"
        );
    }

    #[test]
    fn probes_ignore_the_subject_and_are_indexed_by_line() {
        let a = line("whoever", &unit(128, 0));
        let b = "{\"embedding\": [".to_owned() + &unit(128, 1).join(",") + "]}";
        let probes =
            parse_probe_lines([(1, a.as_str()), (4, b.as_str())], Default::default()).expect("ok");
        assert_eq!(probes[0].index, 0);
        assert_eq!(probes[1].index, 3);
        assert_eq!(probes[1].embedding[1], 1448);
        let subject_not_a_string =
            "{\"subject\": 3, \"embedding\": [".to_owned() + &unit(128, 1).join(",") + "]}";
        assert!(parse_probe_line(1, &subject_not_a_string, None, Default::default()).is_ok());
    }

    #[test]
    fn written_lines_read_back() {
        let e: Vec<f64> = (0..128).map(|i| if i == 2 { -0.5 } else { 0.0 }).collect();
        let text = embedding_line("s-1", &e);
        let record = parse_enroll_line(1, &text, None, Default::default()).expect("valid");
        assert_eq!(record.subject, "s-1");
        assert_eq!(record.embedding[2], -724);
        assert!(
            text.starts_with(r#"{"subject":"s-1","embedding":[0,0,-0.5,0"#),
            "{text}"
        );
        let mut odd = e.clone();
        odd[0] = 0.1;
        odd[1] = f64::NAN;
        let text = embedding_line("q\"uote", &odd);
        assert!(
            text.contains(r#""q\"uote""#) && text.contains("0.1,\"NaN\""),
            "{text}"
        );
        let err = parse_enroll_line(1, &text, None, Default::default())
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains("element 1 is not a finite number"), "{err}");
    }
}
