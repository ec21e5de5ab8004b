//! Reading enrolment NDJSON: one JSON object per line with the Open-IRIS template keys.
//! Parsing is strict about what matters (subject, eye, the two base64 arrays, mask shape) and
//! every error names the line.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::Path;

use anyhow::{bail, Context, Result};
use privmatch_core::bundle::{validate_subject, Eye};
use privmatch_core::iris::template::{IrisBits, IrisTemplate};
use serde::Deserialize;

/// One input line as written.
#[derive(Deserialize)]
struct RawRecord {
    subject: Option<String>,
    eye: Option<String>,
    iris_codes: Option<String>,
    mask_codes: Option<String>,
}

/// One parsed enrolment record.
pub struct EnrolRecord {
    /// 1-based line number in the input, for messages.
    pub line: usize,
    /// Subject id.
    pub subject: String,
    /// Which eye (default left).
    pub eye: Eye,
    /// The plaintext template (never leaves the client unshared).
    pub template: IrisTemplate,
}

/// Parses one NDJSON line.
pub fn parse_line(line_number: usize, line: &str) -> Result<EnrolRecord> {
    let raw: RawRecord = serde_json::from_str(line)
        .with_context(|| format!("line {line_number}: not a JSON object"))?;
    let context = |what: &str| format!("line {line_number}: {what}");
    let subject = raw
        .subject
        .with_context(|| context("missing \"subject\""))?;
    validate_subject(&subject).with_context(|| context("bad \"subject\""))?;
    let eye = match raw.eye.as_deref() {
        None => Eye::Left,
        Some(text) => Eye::parse(text).with_context(|| context("bad \"eye\""))?,
    };
    let code = raw
        .iris_codes
        .with_context(|| context("missing \"iris_codes\""))?;
    let mask = raw
        .mask_codes
        .with_context(|| context("missing \"mask_codes\""))?;
    let template = IrisTemplate {
        code: IrisBits::from_base64(&code).with_context(|| context("bad \"iris_codes\""))?,
        mask: IrisBits::from_base64(&mask).with_context(|| context("bad \"mask_codes\""))?,
    };
    privmatch_core::iris::encoding::encode_mask(&template)
        .with_context(|| context("bad \"mask_codes\""))?;
    Ok(EnrolRecord {
        line: line_number,
        subject,
        eye,
        template,
    })
}

/// Validates a whole enrolment file before anything is sent: every line parses, and no
/// subject+eye appears twice. Returns the number of records.
pub fn validate_file(path: &Path) -> Result<usize> {
    let mut seen: HashSet<(String, Eye)> = HashSet::new();
    let mut count = 0;
    for_each_record(path, |record| {
        if let Some(previous) = seen.replace((record.subject.clone(), record.eye)) {
            bail!(
                "line {}: subject {:?} ({} eye) appears twice in the input",
                record.line,
                previous.0,
                previous.1.as_str()
            );
        }
        count += 1;
        Ok(())
    })?;
    Ok(count)
}

/// Calls `f` on every record of the file, in order; blank lines are skipped.
pub fn for_each_record(path: &Path, mut f: impl FnMut(EnrolRecord) -> Result<()>) -> Result<()> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        f(parse_line(i + 1, &line)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_line_and_field() {
        let err = parse_line(7, "{\"subject\": \"a\"}")
            .err()
            .map(|e| format!("{e:#}"));
        assert!(err
            .as_deref()
            .is_some_and(|e| e.contains("line 7") && e.contains("iris_codes")));
        let err = parse_line(3, "not json").err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("line 3")));
        let err = parse_line(
            2,
            "{\"subject\": \"a\", \"eye\": \"middle\", \"iris_codes\": \"\", \"mask_codes\": \"\"}",
        )
        .err()
        .map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("eye")));
    }
}
