//! NDJSON, one JSON object per line: the CLI reads its inputs so (templates, embeddings,
//! probes; blank lines are skipped, errors name the line) and prints its results so (one line
//! per probe or record on standard output), so that programs can read them line by line.

use std::io::BufRead;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

/// Calls `f` with the 1-based number and the text of every non-blank line of `path`, in order.
pub fn for_each_line(path: &Path, mut f: impl FnMut(usize, &str) -> Result<()>) -> Result<()> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        f(i + 1, &line)?;
    }
    Ok(())
}

/// Reads a whole file and parses its non-blank lines (number, text) with `parse`; fails when
/// it holds no record. `what` names a record in that error.
pub fn read_records<T>(
    path: &Path,
    what: &str,
    parse: impl FnOnce(&[(usize, String)]) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let mut lines = Vec::new();
    for_each_line(path, |number, text| {
        lines.push((number, text.to_owned()));
        Ok(())
    })?;
    let records = parse(&lines)?;
    if records.is_empty() {
        bail!("{} holds no {what}", path.display());
    }
    Ok(records)
}

/// One line of JSON (an error object if `line` cannot be serialised, which the CLI's own
/// shapes never are).
pub fn json_line<T: Serialize>(line: &T) -> String {
    serde_json::to_string(line).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Writes one line on standard output; false when the reader went away (a closed pipe), so
/// the caller stops instead of spending more work (or single-use keys).
pub fn emit(line: &str) -> Result<bool> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(anyhow!("cannot write to standard output: {e}")),
    }
}
