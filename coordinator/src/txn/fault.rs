//! Faults the end-to-end tests inject (environment variable `PRIVMATCH_FAULT`): into the
//! two-phase commit, and a face output altered in transit. Compiled in only with the cargo
//! feature `fault-injection`, which the test script's build of the CLI turns on
//! (`scripts/test.sh`); without it [`Fault`] has no variant but `None`, nothing reads
//! `PRIVMATCH_FAULT` but a warning that it is ignored, and no injecting code is in the binary.

#[cfg(feature = "fault-injection")]
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
    #[cfg(feature = "fault-injection")]
    CrashAfterPrepare,
    /// Abort once P0 has committed (the decision), before the others.
    #[cfg(feature = "fault-injection")]
    CrashAfterDecision,
    /// Pause once every party has prepared.
    #[cfg(feature = "fault-injection")]
    PauseAfterPrepare(PathBuf),
    /// Prepare P1 and P2, then pause before P0's PREPARE.
    #[cfg(feature = "fault-injection")]
    PauseBeforeP0Prepare(PathBuf),
}

impl Fault {
    /// Reads `PRIVMATCH_FAULT` (in a build with the `fault-injection` feature; else none,
    /// with a warning when the variable is set).
    pub fn from_env() -> Self {
        let value = std::env::var("PRIVMATCH_FAULT").ok();
        #[cfg(feature = "fault-injection")]
        {
            if let Some(value) = &value {
                tracing::warn!(fault = %value, "fault injection enabled (a test build)");
            }
            Self::parse(value.as_deref())
        }
        #[cfg(not(feature = "fault-injection"))]
        {
            if value.is_some() {
                tracing::warn!(
                    "PRIVMATCH_FAULT is ignored: this build has no fault injection (cargo feature fault-injection)"
                );
            }
            Fault::None
        }
    }

    /// The fault named by `value` (a `PRIVMATCH_FAULT` value); none for anything else.
    #[cfg(feature = "fault-injection")]
    fn parse(value: Option<&str>) -> Self {
        match value {
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
        #[cfg(feature = "fault-injection")]
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
        #[cfg(feature = "fault-injection")]
        if matches!(self, Fault::PauseBeforeP0Prepare(_)) {
            return true;
        }
        false
    }

    /// Injects the fault due once P1 and P2 have prepared, before P0 (if any).
    pub async fn before_p0_prepare(&self) {
        #[cfg(feature = "fault-injection")]
        if let Fault::PauseBeforeP0Prepare(path) = self {
            pause_at(path).await;
        }
    }

    /// Injects the fault due once P0 has committed transaction `gid` (if any).
    pub fn after_decision(&self, gid: &str) {
        #[cfg(feature = "fault-injection")]
        if matches!(self, Fault::CrashAfterDecision) {
            eprintln!("privmatch: injected fault crash-after-decision ({gid})");
            std::process::abort();
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = gid;
    }
}

/// Creates `path` and waits (at most two minutes) until it is removed.
#[cfg(feature = "fault-injection")]
async fn pause_at(path: &std::path::Path) {
    let _ = std::fs::write(path, b"paused\n");
    for _ in 0..1200 {
        if !path.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The evaluator (0 or 1) whose sealed face output the coordinator alters in transit, from
/// `PRIVMATCH_FAULT=face-alter-output=<b>`: the end-to-end tests' model of a coordinator that
/// rewrites results (the client must refuse, naming the party). Always none in a build
/// without the `fault-injection` feature.
pub fn altered_face_output() -> Option<usize> {
    #[cfg(feature = "fault-injection")]
    {
        std::env::var("PRIVMATCH_FAULT")
            .ok()
            .and_then(|f| f.strip_prefix("face-alter-output=").map(str::to_owned))
            .and_then(|p| p.parse::<usize>().ok())
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        None
    }
}
