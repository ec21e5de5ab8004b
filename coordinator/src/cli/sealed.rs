//! The output of `privmatch iris seal` and `privmatch face seal`: sealed inputs for the SQL
//! front door (`privmatch_core::wire::sealed_input`), one per input record, as tab-separated
//! lines `<subject>\t<sealed input>` (the subject is empty for probes that claim none), ready
//! for `COPY table (subject, sealed) FROM …` or for an application to read line by line.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use privmatch_core::wire::sealed_input::{SealedInput, SealedKind};
use serde::Serialize;

/// Where sealed inputs go: a file (created with mode 0600, replaced atomically at the end) or
/// standard output.
pub struct SealedWriter {
    out: Box<dyn Write>,
    target: Option<(std::path::PathBuf, std::path::PathBuf)>,
    written: usize,
}

impl SealedWriter {
    /// Writes to `path`, or to standard output when `None`.
    pub fn create(path: Option<&Path>) -> Result<Self> {
        let Some(path) = path else {
            return Ok(SealedWriter {
                out: Box::new(BufWriter::new(std::io::stdout().lock())),
                target: None,
                written: 0,
            });
        };
        let partial = path.with_extension("partial");
        let file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&partial)
        }
        .with_context(|| format!("cannot create {}", partial.display()))?;
        Ok(SealedWriter {
            out: Box::new(BufWriter::new(file)),
            target: Some((partial, path.to_owned())),
            written: 0,
        })
    }

    /// Writes one sealed input with the subject it is for (`""` for none).
    pub fn write(&mut self, subject: &str, kind: SealedKind, body: Vec<u8>) -> Result<()> {
        let sealed = SealedInput { kind, body }.encode();
        writeln!(self.out, "{subject}\t{sealed}").context("cannot write a sealed input")?;
        self.written += 1;
        Ok(())
    }

    /// Writes one sealed input whose body is the JSON of `body`.
    pub fn write_json<B: Serialize>(
        &mut self,
        subject: &str,
        kind: SealedKind,
        body: &B,
    ) -> Result<()> {
        let bytes = serde_json::to_vec(body).context("encoding a sealed input")?;
        self.write(subject, kind, bytes)
    }

    /// Flushes and, for a file, moves it into place; returns how many inputs were written.
    pub fn finish(mut self) -> Result<usize> {
        self.out.flush().context("cannot write the sealed inputs")?;
        if let Some((partial, path)) = self.target.take() {
            File::open(&partial)
                .and_then(|f| f.sync_all())
                .and_then(|_| std::fs::rename(&partial, &path))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok(self.written)
    }
}

impl Drop for SealedWriter {
    /// A file left unfinished (an input line was bad) is removed: half a set of sealed inputs
    /// is never left where the whole was asked for.
    fn drop(&mut self) {
        if let Some((partial, _)) = self.target.take() {
            let _ = std::fs::remove_file(partial);
        }
    }
}

/// The line a seal command ends with, on standard error (standard output may be the data).
pub fn report(written: usize, kind: SealedKind, out: Option<&Path>) {
    let to = out.map_or_else(|| "standard output".to_owned(), |p| p.display().to_string());
    let lifetime = match kind {
        SealedKind::IrisIdentify | SealedKind::IrisUniqueness => {
            "; use each once, within 10 minutes (the parties refuse older probes)"
        }
        SealedKind::FaceVerify | SealedKind::FaceIdentify => "; use each once",
        SealedKind::IrisEnroll | SealedKind::FaceEnroll => "",
    };
    eprintln!(
        "sealed {written} input(s) for privmatch.{}() to {to}{lifetime}",
        kind.sql_function()
    );
}
