//! Faults the end-to-end tests inject into the two-phase commit (environment variable
//! `PRIVMATCH_FAULT`); never set in production.

use std::path::PathBuf;

/// A fault to inject. `crash-after-prepare` and `crash-after-decision` abort the process at
/// that point; `pause-after-prepare=FILE` creates FILE once all parties are prepared and waits
/// until it is removed; `pause-before-p0-prepare=FILE` prepares P1 and P2, then creates FILE
/// and waits until it is removed before it prepares P0 (a coordinator stalled mid-commit, for
/// the fencing of recovery).
#[derive(Clone, Debug, Default)]
pub enum Fault {
    /// No fault.
    #[default]
    None,
    /// Abort once every party has prepared.
    CrashAfterPrepare,
    /// Abort once P0 has committed (the decision), before the others.
    CrashAfterDecision,
    /// Pause once every party has prepared.
    PauseAfterPrepare(PathBuf),
    /// Prepare P1 and P2, then pause before P0's PREPARE.
    PauseBeforeP0Prepare(PathBuf),
}

impl Fault {
    /// Reads `PRIVMATCH_FAULT`.
    pub fn from_env() -> Self {
        match std::env::var("PRIVMATCH_FAULT").ok().as_deref() {
            Some("crash-after-prepare") => Fault::CrashAfterPrepare,
            Some("crash-after-decision") => Fault::CrashAfterDecision,
            Some(other) => {
                if let Some(path) = other.strip_prefix("pause-after-prepare=") {
                    Fault::PauseAfterPrepare(PathBuf::from(path))
                } else if let Some(path) = other.strip_prefix("pause-before-p0-prepare=") {
                    Fault::PauseBeforeP0Prepare(PathBuf::from(path))
                } else {
                    Fault::None
                }
            }
            None => Fault::None,
        }
    }

    /// Injects the fault due once every party has prepared (if any).
    pub async fn after_prepare(&self) {
        match self {
            Fault::CrashAfterPrepare => {
                eprintln!("privmatch: injected fault crash-after-prepare");
                std::process::abort();
            }
            Fault::PauseAfterPrepare(path) => pause_at(path).await,
            Fault::None | Fault::CrashAfterDecision | Fault::PauseBeforeP0Prepare(_) => {}
        }
    }

    /// Whether P0 must be prepared last, after [`Fault::before_p0_prepare`].
    pub fn delays_p0_prepare(&self) -> bool {
        matches!(self, Fault::PauseBeforeP0Prepare(_))
    }

    /// Injects the fault due once P1 and P2 have prepared, before P0 (if any).
    pub async fn before_p0_prepare(&self) {
        if let Fault::PauseBeforeP0Prepare(path) = self {
            pause_at(path).await;
        }
    }

    /// Injects the fault due once P0 has committed transaction `gid` (if any).
    pub fn after_decision(&self, gid: &str) {
        if matches!(self, Fault::CrashAfterDecision) {
            eprintln!("privmatch: injected fault crash-after-decision ({gid})");
            std::process::abort();
        }
    }
}

/// Creates `path` and waits (at most two minutes) until it is removed.
async fn pause_at(path: &std::path::Path) {
    let _ = std::fs::write(path, b"paused\n");
    for _ in 0..1200 {
        if !path.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
