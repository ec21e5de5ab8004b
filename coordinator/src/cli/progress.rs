//! Progress bars of the CLI's long runs (enrolment of a whole file).

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over `total` records labelled `what` (hidden when asked, e.g. in tests).
pub fn progress_bar(total: usize, hidden: bool, what: &str) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{{spinner}} {what} [{{bar:40}}] {{pos}}/{{len}} records ({{per_sec}}, eta {{eta}})"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
