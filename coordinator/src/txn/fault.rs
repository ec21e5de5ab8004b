//! Faults the end-to-end tests inject into the two-phase commit (environment variable
//! `PRIVMATCH_FAULT`); never set in production.

use std::path::PathBuf;

/// A fault to inject. `crash-after-prepare` and `crash-after-decision` abort the process at
/// that point; `pause-after-prepare=FILE` creates FILE once all parties are prepared and waits
/// until it is removed.
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
}

impl Fault {
    /// Reads `PRIVMATCH_FAULT`.
    pub fn from_env() -> Self {
        match std::env::var("PRIVMATCH_FAULT").ok().as_deref() {
            Some("crash-after-prepare") => Fault::CrashAfterPrepare,
            Some("crash-after-decision") => Fault::CrashAfterDecision,
            Some(other) => match other.strip_prefix("pause-after-prepare=") {
                Some(path) => Fault::PauseAfterPrepare(PathBuf::from(path)),
                None => Fault::None,
            },
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
            Fault::PauseAfterPrepare(path) => {
                let _ = std::fs::write(path, b"prepared\n");
                for _ in 0..1200 {
                    if !path.exists() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
            Fault::None | Fault::CrashAfterDecision => {}
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
