//! The face-embedding input format the face modalities share (`privmatch face …` and
//! `privmatch device enroll` / `privmatch terminal verify` read the same lines):
//! `{"subject": "...", "embedding": [x_0, …, x_{l−1}]}` to enrol, `{"embedding": [...]}` as a
//! probe (a `"subject"` key is then ignored, so an enrolment file can be used as probes).
//!
//! This reads the float elements strictly: JSON numbers only; JSON has no NaN or infinity, so
//! the strings `"NaN"`, `"Infinity"` and `"-Infinity"` (what many encoders write for them) are
//! recognised and refused as not finite, naming the element. Quantisation is the modality's
//! (each chooses its own M over `privmatch_core::embedding`); every error names the line.

use anyhow::{anyhow, Context, Result};
use privmatch_core::embedding::EmbeddingError;
use serde::Deserialize;
use serde_json::Value;

/// One probe line as written (other keys, such as `subject`, are ignored).
#[derive(Deserialize)]
struct RawProbeLine {
    embedding: Option<Vec<Value>>,
}

/// Parses the elements of an embedding array: JSON numbers, or the strings `"NaN"`,
/// `"Infinity"`, `"-Infinity"` (refused as not finite, with the element named).
pub fn parse_elements(values: &[Value]) -> Result<Vec<f64>, String> {
    values
        .iter()
        .enumerate()
        .map(|(index, value)| match value {
            Value::Number(n) => n
                .as_f64()
                .ok_or_else(|| format!("embedding element {index} is not a representable number")),
            Value::String(s) if is_non_finite_name(s) => {
                Err(EmbeddingError::NotFinite { index }.to_string())
            }
            Value::String(_) => Err(format!(
                "embedding element {index} is a string, not a number"
            )),
            Value::Null => Err(format!("embedding element {index} is null, not a number")),
            _ => Err(format!("embedding element {index} is not a number")),
        })
        .collect()
}

fn is_non_finite_name(text: &str) -> bool {
    matches!(
        text.trim().to_ascii_lowercase().as_str(),
        "nan" | "+nan" | "-nan" | "infinity" | "+infinity" | "-infinity" | "inf" | "+inf" | "-inf"
    )
}

/// The elements of a line's `"embedding"` field (`values`, None when the key is missing);
/// errors say `line N: missing "embedding"` or `line N: bad "embedding": …`.
pub fn elements_of(line_number: usize, values: Option<Vec<Value>>) -> Result<Vec<f64>> {
    let values = values.ok_or_else(|| anyhow!("line {line_number}: missing \"embedding\""))?;
    parse_elements(&values).map_err(|e| anyhow!("line {line_number}: bad \"embedding\": {e}"))
}

/// The float elements of one probe line `{"embedding": [...]}` (other keys ignored).
pub fn probe_elements(line_number: usize, text: &str) -> Result<Vec<f64>> {
    let raw: RawProbeLine = serde_json::from_str(text)
        .with_context(|| format!("line {line_number}: not a JSON object with \"embedding\""))?;
    elements_of(line_number, raw.embedding)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        probe_elements(4, text)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default()
    }

    #[test]
    fn elements_are_numbers_and_errors_name_the_line_and_element() {
        assert_eq!(
            probe_elements(1, r#"{"subject": 3, "embedding": [1, -0.5, 2e-3]}"#).ok(),
            Some(vec![1.0, -0.5, 0.002])
        );
        for name in ["\"NaN\"", "\"Infinity\"", "\"-inf\""] {
            let e = err(&format!("{{\"embedding\": [0, {name}]}}"));
            assert!(
                e.contains("line 4") && e.contains("element 1 is not a finite number"),
                "{e}"
            );
        }
        assert!(err(r#"{"embedding": [0, "x"]}"#).contains("element 1 is a string"));
        assert!(err(r#"{"embedding": [null]}"#).contains("element 0 is null"));
        assert!(err(r#"{"embedding": [[1]]}"#).contains("element 0 is not a number"));
        assert!(err(r#"{"subject": "a"}"#).contains("line 4: missing \"embedding\""));
        assert!(err("[1, 2]").contains("line 4: not a JSON object"));
    }
}
