//! Reading enrolment and probe NDJSON: one JSON object per line with the Open-IRIS template
//! keys. Parsing is strict about what matters (subject, eye, the two base64 arrays, mask shape)
//! and every error names the line and the field.
//!
//! Enrolment line: `{"subject": "...", "eye": "left"|"right", "iris_codes": "<b64>",
//! "mask_codes": "<b64>"}` (eye defaults to left).
//!
//! Probe line (search input): one eye, `{"eye": "left"|"right", "iris_codes": "<b64>",
//! "mask_codes": "<b64>"}` (eye defaults to left; a `subject` key is ignored, so enrolment
//! files can be searched), or both eyes, `{"left": {"iris_codes": …, "mask_codes": …},
//! "right": {…}}` (either object may be left out, not both).

use std::collections::HashSet;
use std::path::Path;

use anyhow::{bail, Context, Result};
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::template::{IrisBits, IrisTemplate};
use privmatch_core::wire::envelope::validate_subject;
use serde::Deserialize;

use crate::cli::ndjson::{for_each_line, read_records};

/// One input line as written.
#[derive(Deserialize)]
struct RawRecord {
    subject: Option<String>,
    eye: Option<String>,
    iris_codes: Option<String>,
    mask_codes: Option<String>,
}

/// One parsed enrolment record.
pub struct EnrollRecord {
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
pub fn parse_line(line_number: usize, line: &str) -> Result<EnrollRecord> {
    let raw: RawRecord = serde_json::from_str(line)
        .with_context(|| format!("line {line_number}: not a JSON object"))?;
    let context = |what: &str| format!("line {line_number}: {what}");
    let subject = raw
        .subject
        .with_context(|| context("missing \"subject\""))?;
    validate_subject(&subject).with_context(|| context("bad \"subject\""))?;
    let (eye, template) = parse_one_eye(
        line_number,
        raw.eye.as_deref(),
        raw.iris_codes.as_deref(),
        raw.mask_codes.as_deref(),
    )?;
    Ok(EnrollRecord {
        line: line_number,
        subject,
        eye,
        template,
    })
}

/// The eye (default left) and the template of a one-eye line.
fn parse_one_eye(
    line_number: usize,
    eye: Option<&str>,
    code: Option<&str>,
    mask: Option<&str>,
) -> Result<(Eye, IrisTemplate)> {
    let eye = match eye {
        None => Eye::Left,
        Some(text) => {
            Eye::parse(text).with_context(|| format!("line {line_number}: bad \"eye\""))?
        }
    };
    Ok((eye, parse_template(line_number, "", code, mask)?))
}

/// Parses the two base64 arrays of a template and checks that the mask can be shared.
/// `prefix` locates the fields in messages (`""` or `"left."`).
fn parse_template(
    line_number: usize,
    prefix: &str,
    code: Option<&str>,
    mask: Option<&str>,
) -> Result<IrisTemplate> {
    let field = |name: &str| format!("\"{prefix}{name}\"");
    let missing = |name: &str| format!("line {line_number}: missing {}", field(name));
    let code = code.with_context(|| missing("iris_codes"))?;
    let mask = mask.with_context(|| missing("mask_codes"))?;
    let bad = |name: &str| format!("line {line_number}: bad {}", field(name));
    let template = IrisTemplate {
        code: IrisBits::from_base64(code).with_context(|| bad("iris_codes"))?,
        mask: IrisBits::from_base64(mask).with_context(|| bad("mask_codes"))?,
    };
    privmatch_core::iris::encoding::encode_mask(&template).with_context(|| bad("mask_codes"))?;
    Ok(template)
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
pub fn for_each_record(path: &Path, mut f: impl FnMut(EnrollRecord) -> Result<()>) -> Result<()> {
    for_each_line(path, |number, line| f(parse_line(number, line)?))
}

/// One probe line as written.
#[derive(Deserialize)]
struct RawProbe {
    eye: Option<String>,
    iris_codes: Option<String>,
    mask_codes: Option<String>,
    left: Option<RawEye>,
    right: Option<RawEye>,
}

/// One eye of a two-eye probe line.
#[derive(Deserialize)]
struct RawEye {
    iris_codes: Option<String>,
    mask_codes: Option<String>,
}

/// One parsed search probe: one or both eyes of one person.
pub struct ProbeRecord {
    /// 1-based line number in the input.
    pub line: usize,
    /// The eyes to search, left before right (one or two, distinct).
    pub eyes: Vec<(Eye, IrisTemplate)>,
}

/// Parses one probe line (formats in the module docs).
pub fn parse_probe_line(line_number: usize, line: &str) -> Result<ProbeRecord> {
    let raw: RawProbe = serde_json::from_str(line)
        .with_context(|| format!("line {line_number}: not a JSON object of the probe format"))?;
    let one_eye = raw.eye.is_some() || raw.iris_codes.is_some() || raw.mask_codes.is_some();
    let two_eyes = raw.left.is_some() || raw.right.is_some();
    if one_eye && two_eyes {
        bail!(
            "line {line_number}: give either \"iris_codes\"/\"mask_codes\" (one eye, with an optional \"eye\") or \"left\"/\"right\" objects, not both"
        );
    }
    let mut eyes = Vec::with_capacity(2);
    if two_eyes {
        for (eye, raw_eye) in [(Eye::Left, raw.left), (Eye::Right, raw.right)] {
            if let Some(e) = raw_eye {
                let prefix = format!("{}.", eye.as_str());
                let template = parse_template(
                    line_number,
                    &prefix,
                    e.iris_codes.as_deref(),
                    e.mask_codes.as_deref(),
                )?;
                eyes.push((eye, template));
            }
        }
    } else {
        eyes.push(parse_one_eye(
            line_number,
            raw.eye.as_deref(),
            raw.iris_codes.as_deref(),
            raw.mask_codes.as_deref(),
        )?);
    }
    Ok(ProbeRecord {
        line: line_number,
        eyes,
    })
}

/// Reads and validates a whole probe file (blank lines are skipped); nothing is searched
/// unless every line is valid.
pub fn read_probe_file(path: &Path) -> Result<Vec<ProbeRecord>> {
    read_records(path, "probe", |lines| {
        lines
            .iter()
            .map(|(number, line)| parse_probe_line(*number, line))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmatch_core::iris::synth::random_template;
    use rand::SeedableRng;

    fn template_json(seed: u64) -> (IrisTemplate, String) {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
        let t = random_template(&mut rng);
        let json = format!(
            "{{\"iris_codes\": \"{}\", \"mask_codes\": \"{}\"}}",
            t.code.to_base64(),
            t.mask.to_base64()
        );
        (t, json)
    }

    fn probe_error(line: &str) -> String {
        parse_probe_line(5, line)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default()
    }

    #[test]
    fn probe_lines_of_one_eye() {
        let (t, json) = template_json(1);
        let probe = parse_probe_line(1, &json).expect("valid");
        assert_eq!(probe.eyes.len(), 1);
        assert_eq!(probe.eyes[0].0, Eye::Left);
        assert!(probe.eyes[0].1 == t);
        let with_eye = json.replacen('{', "{\"eye\": \"right\", \"subject\": \"ignored\", ", 1);
        let probe = parse_probe_line(2, &with_eye).expect("valid");
        assert_eq!(probe.eyes[0].0, Eye::Right);
    }

    #[test]
    fn probe_lines_of_two_eyes() {
        let (l, left) = template_json(1);
        let (r, right) = template_json(2);
        let both = format!("{{\"right\": {right}, \"left\": {left}}}");
        let probe = parse_probe_line(3, &both).expect("valid");
        assert_eq!(probe.eyes.len(), 2);
        assert_eq!(probe.eyes[0].0, Eye::Left);
        assert!(probe.eyes[0].1 == l);
        assert_eq!(probe.eyes[1].0, Eye::Right);
        assert!(probe.eyes[1].1 == r);
        let only_right = format!("{{\"right\": {right}}}");
        let probe = parse_probe_line(3, &only_right).expect("valid");
        assert_eq!(probe.eyes.len(), 1);
        assert_eq!(probe.eyes[0].0, Eye::Right);
    }

    #[test]
    fn probe_errors_name_the_line_and_field() {
        let (_, json) = template_json(1);
        let err = probe_error("{}");
        assert!(
            err.contains("line 5") && err.contains("\"iris_codes\""),
            "{err}"
        );
        let err = probe_error(&format!(
            "{{\"left\": {json}, \"right\": {{\"iris_codes\": \"AAAA\"}}}}"
        ));
        assert!(
            err.contains("line 5") && err.contains("\"right.mask_codes\""),
            "{err}"
        );
        let err = probe_error(r#"{"left": {"iris_codes": "A", "mask_codes": "A"}}"#);
        assert!(err.contains("\"left.iris_codes\""), "{err}");
        let mixed = json.replacen('{', &format!("{{\"left\": {json}, "), 1);
        let err = probe_error(&mixed);
        assert!(err.contains("not both"), "{err}");
        let err = probe_error(&json.replacen('{', "{\"eye\": \"middle\", ", 1));
        assert!(err.contains("line 5") && err.contains("\"eye\""), "{err}");
        let err = probe_error("[1]");
        assert!(err.contains("line 5"), "{err}");
    }

    #[test]
    fn a_probe_file_is_validated_whole() {
        let (_, json) = template_json(3);
        let dir = std::env::temp_dir().join(format!("pm-probes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("probes.ndjson");
        std::fs::write(&path, format!("{json}\n\n{json}\n")).expect("write");
        let probes = read_probe_file(&path).expect("valid");
        assert_eq!(
            probes.iter().map(|p| p.line).collect::<Vec<_>>(),
            vec![1, 3]
        );
        std::fs::write(&path, format!("{json}\n{{\"eye\": \"left\"}}\n")).expect("write");
        let err = read_probe_file(&path)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(err.contains("line 2"), "{err}");
        std::fs::write(&path, "\n").expect("write");
        assert!(read_probe_file(&path).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

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
