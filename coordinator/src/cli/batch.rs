//! Enrolment in batches, as every modality's client sends it: each batch of input lines is
//! one distributed transaction at the coordinator, so it is written at every party or at
//! none. The accounting here says, when a batch fails, what is known about it and from which
//! line to resume.

use anyhow::{bail, Result};
use indicatif::ProgressBar;

use crate::cli::http::CallError;

/// Totals of an enrolment run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EnrollTotals {
    /// Newly enrolled.
    pub enrolled: usize,
    /// Already present, skipped.
    pub skipped: usize,
}

impl EnrollTotals {
    /// Records done so far (enrolled or skipped).
    pub fn done(&self) -> usize {
        self.enrolled + self.skipped
    }
}

/// The input lines of one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchLines {
    /// First line number (1-based).
    pub first: usize,
    /// Last line number.
    pub last: usize,
    /// Records in the batch.
    pub records: usize,
}

impl BatchLines {
    /// The lines of a batch of records with these line numbers, in order.
    pub fn of(lines: impl IntoIterator<Item = usize>) -> Self {
        let mut batch = BatchLines {
            first: 0,
            last: 0,
            records: 0,
        };
        for line in lines {
            if batch.records == 0 {
                batch.first = line;
            }
            batch.last = line;
            batch.records += 1;
        }
        batch
    }
}

/// What the coordinator answered for a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchAnswer {
    /// Per record, in input order: newly enrolled (false: already enrolled, skipped).
    pub enrolled: Vec<bool>,
    /// Parties whose commit recovery still has to complete (the batch is decided).
    pub pending_recovery: Vec<String>,
}

/// Accounts the answer to one batch in `totals` and the progress bar, or says what is known
/// about a failed batch: in doubt (recovery writes it `scope`, e.g. "at all three parties or
/// at none") or not written at all, and from which line to resume.
pub fn account(
    totals: &mut EnrollTotals,
    batch: &BatchLines,
    answer: Result<BatchAnswer, CallError>,
    scope: &str,
    bar: &ProgressBar,
) -> Result<()> {
    let done = totals.done();
    let (first, last) = (batch.first, batch.last);
    let answer = match answer {
        Ok(answer) => answer,
        Err(err) if err.outcome_unknown() => {
            bar.finish_and_clear();
            bail!(
                "batch of lines {first}..={last} is in doubt ({err}): recovery enrols it {scope}; {done} records before it were enrolled; re-run from line {first} with --on-duplicate skip to finish"
            )
        }
        Err(err) => {
            bar.finish_and_clear();
            return Err(anyhow::Error::new(err).context(format!(
                "batch of lines {first}..={last} was not enrolled (nothing of it was written; {done} records before it were enrolled; resume from line {first})"
            )));
        }
    };
    if answer.enrolled.len() != batch.records {
        bail!(
            "the coordinator answered {} results for a batch of {} records",
            answer.enrolled.len(),
            batch.records
        );
    }
    for &enrolled in &answer.enrolled {
        if enrolled {
            totals.enrolled += 1;
        } else {
            totals.skipped += 1;
        }
    }
    for pending in &answer.pending_recovery {
        eprintln!("warning: batch committed; recovery will complete it at {pending}");
    }
    bar.inc(batch.records as u64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_counted_and_failures_say_where_to_resume() {
        let bar = ProgressBar::hidden();
        let mut totals = EnrollTotals::default();
        let batch = BatchLines::of([3, 4, 6]);
        assert_eq!((batch.first, batch.last, batch.records), (3, 6, 3));
        let answer = |enrolled: Vec<bool>| {
            Ok(BatchAnswer {
                enrolled,
                pending_recovery: Vec::new(),
            })
        };
        account(
            &mut totals,
            &batch,
            answer(vec![true, false, true]),
            "",
            &bar,
        )
        .expect("counted");
        assert_eq!((totals.enrolled, totals.skipped), (2, 1));
        let mut failure = |answer, scope| {
            account(&mut totals, &batch, answer, scope, &bar)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default()
        };
        let err = failure(Err(CallError::Broken("reset".into())), "at all of them");
        for phrase in [
            "lines 3..=6 is in doubt",
            "at all of them",
            "3 records before it",
        ] {
            assert!(err.contains(phrase), "{err}");
        }
        let err = failure(Err(CallError::Local("refused".into())), "");
        assert!(err.contains("nothing of it was written") && err.ends_with("refused"));
        assert!(failure(answer(vec![true]), "").contains("1 results for a batch of 3"));
    }
}
