//! Helpers of privmatch's end-to-end tests (`tests/tests/e2e.rs`).
//!
//! Every test owns a whole local deployment — three PostgreSQL parties with the extension and a
//! coordinator, started with the real `privmatch` CLI — in its own home directory
//! (`/tmp/pm-e2e-<name>`) on its own ports (`16000 + 10·slot` … `+2` for the parties, `+9` for
//! the coordinator), so the tests of the binary run in parallel (cargo's default) as well as
//! serially (`--test-threads=1`). [`Cluster`]'s `Drop` stops and purges the deployment, also
//! when the test panics (after printing the tails of its logs); set `PRIVMATCH_E2E_KEEP=1` to
//! stop it but keep the home directory for inspection.
//!
//! Requirements (the helpers fail loudly, they never skip): the CLI binary built
//! (`cargo build --release -p privmatch-coordinator`, or `PRIVMATCH_BIN`), the extension
//! installed in the PostgreSQL that `pg_config` names, and root (the CLI runs the clusters as
//! the `postgres` user).
//!
//! The share reconstruction here ([`Cluster::read_shares`], [`reconstruct`]) is test-only: it
//! reads every party's shares directly from the databases, which no product component does.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::iris::encoding::{reconstruct_template, IrisShare};
use privmatch_core::iris::template::{IrisBits, IrisTemplate};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::{decode_share, ShareKind};

/// First port of the range the end-to-end tests may use (16000–16999): below the kernel's
/// ephemeral range (32768–60999), so no client connection can hold a port a test server needs.
pub const PORT_RANGE_START: u16 = 16000;
/// Default limit for one CLI command.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(300);

/// A record's key at every party: (subject, eye).
pub type RecordKey = (String, String);

// ------------------------------------------------------------------------------------------
// Locating programs.
// ------------------------------------------------------------------------------------------

/// The `privmatch` CLI: `$PRIVMATCH_BIN`, else `../target/release/privmatch` relative to this
/// crate. Panics with instructions when it is missing (the tests are never skipped); warns
/// when a source file of the CLI is newer than the binary.
pub fn privmatch_bin() -> PathBuf {
    let path = find_privmatch_bin().unwrap_or_else(|e| panic!("{e}"));
    static WARN: std::sync::Once = std::sync::Once::new();
    WARN.call_once(|| warn_if_stale(&path));
    path
}

fn find_privmatch_bin() -> Result<PathBuf, String> {
    let path = match std::env::var_os("PRIVMATCH_BIN") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/privmatch"),
    };
    if !path.is_file() {
        return Err(format!(
            "the privmatch CLI binary is missing at {}: build it with \
             `cargo build --release -p privmatch-coordinator` (or point PRIVMATCH_BIN at it); \
             the end-to-end tests need it and are never skipped",
            path.display()
        ));
    }
    Ok(path)
}

fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry.metadata().ok().and_then(|m| m.modified().ok())
        };
        newest = newest.max(t);
    }
    newest
}

fn warn_if_stale(bin: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some(built) = std::fs::metadata(bin).ok().and_then(|m| m.modified().ok()) else {
        return;
    };
    let sources = [root.join("coordinator/src"), root.join("core/src")]
        .iter()
        .filter_map(|d| newest_mtime(d))
        .max();
    if sources.is_some_and(|s| s > built) {
        eprintln!(
            "warning: {} is older than the coordinator/core sources: rebuild it with \
             `cargo build --release -p privmatch-coordinator`",
            bin.display()
        );
    }
}

/// PostgreSQL's bin directory (`pg_config --bindir`), where `pg_ctl` lives.
pub fn pg_bindir() -> PathBuf {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .expect("cannot run pg_config: is PostgreSQL installed?");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

// ------------------------------------------------------------------------------------------
// Running commands.
// ------------------------------------------------------------------------------------------

/// What a finished command printed and returned.
#[derive(Clone, Debug)]
pub struct CmdOutput {
    /// The command line, for messages.
    pub command: String,
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl std::fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` exited with {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.code, self.stdout, self.stderr
        )
    }
}

impl CmdOutput {
    /// True when the exit code is 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Panics (showing everything) unless it succeeded.
    pub fn expect_success(self) -> Self {
        assert!(self.success(), "command failed: {self}");
        self
    }

    /// Panics (showing everything) unless it failed with a non-zero exit code.
    pub fn expect_failure(self) -> Self {
        assert!(
            matches!(self.code, Some(c) if c != 0),
            "command should have failed with a non-zero exit code: {self}"
        );
        self
    }

    /// Panics unless standard error contains every one of `phrases`.
    pub fn assert_stderr_contains(&self, phrases: &[&str]) {
        for phrase in phrases {
            assert!(
                self.stderr.contains(phrase),
                "expected {phrase:?} in the standard error of: {self}"
            );
        }
    }
}

/// A command running in the background.
pub struct Background {
    command: String,
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
    });
    rx
}

impl Background {
    /// Starts `cmd` with captured output.
    pub fn spawn(cmd: Command) -> Self {
        Self::try_spawn(cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_spawn(mut cmd: Command) -> Result<Self, String> {
        let command = format!("{cmd:?}");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {command}: {e}"))?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(format!("{command}: no pipes"));
        };
        Ok(Background {
            command,
            child,
            stdout: drain(stdout),
            stderr: drain(stderr),
        })
    }

    /// Whether it has exited.
    pub fn finished(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits for it to exit (killing it and panicking after `timeout`).
    pub fn wait(self, timeout: Duration) -> CmdOutput {
        self.wait_result(timeout).unwrap_or_else(|e| panic!("{e}"))
    }

    fn wait_result(mut self, timeout: Duration) -> Result<CmdOutput, String> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(None) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let out = self.collect(None);
                    return Err(format!("command timed out after {timeout:?}: {out}"));
                }
                Err(e) => return Err(format!("cannot wait for {}: {e}", self.command)),
            }
        };
        Ok(self.collect(Some(status)))
    }

    fn collect(&self, status: Option<ExitStatus>) -> CmdOutput {
        // A descendant that kept the pipe open must not hang the test.
        let take = |rx: &mpsc::Receiver<String>| {
            rx.recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| "<output held open by a descendant process>".into())
        };
        CmdOutput {
            command: self.command.clone(),
            code: status.and_then(|s| s.code()),
            stdout: take(&self.stdout),
            stderr: take(&self.stderr),
        }
    }
}

/// Runs `cmd` to completion (at most `timeout`).
pub fn run(cmd: Command, timeout: Duration) -> CmdOutput {
    Background::spawn(cmd).wait(timeout)
}

/// A `privmatch` command without `--home` (e.g. `iris synth`).
pub fn privmatch(args: &[&str]) -> CmdOutput {
    let mut cmd = Command::new(privmatch_bin());
    cmd.args(args)
        .env_remove("PRIVMATCH_FAULT")
        .env_remove("PRIVMATCH_HOME");
    run(cmd, CLI_TIMEOUT)
}

/// Polls `condition` every 100 ms until it holds; panics with `what` after `timeout`.
/// The session ids (hex) a client's debug log `stderr` names on its lines containing `marker`
/// (e.g. "sealed a face probe"), in order.
pub fn logged_sessions(stderr: &str, marker: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| l.split("session=").nth(1))
        .map(|rest| rest.chars().take_while(char::is_ascii_hexdigit).collect())
        .collect()
}

pub fn wait_until(timeout: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn process_alive(pid: u32) -> bool {
    // A zombie still has /proc/PID; it counts as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

// ------------------------------------------------------------------------------------------
// Configuration (HOME/privmatch.toml, written by `privmatch cluster up`).
// ------------------------------------------------------------------------------------------

pub use privmatch_coordinator::config::{
    operator_config_file, Config, CoordinatorConfig, OperatorConfig, PartyConfig,
    COORDINATOR_CONFIG_FILE,
};

// ------------------------------------------------------------------------------------------
// Input files.
// ------------------------------------------------------------------------------------------

/// One record of an enrolment NDJSON file, parsed independently of the CLI.
#[derive(Clone, Debug)]
pub struct InputRecord {
    /// 1-based line number.
    pub line: usize,
    /// Subject id.
    pub subject: String,
    /// "left" or "right".
    pub eye: String,
    /// The plaintext template.
    pub template: IrisTemplate,
}

/// Parses an enrolment NDJSON file (every line must be a valid record).
pub fn read_ndjson(path: &Path) -> Vec<InputRecord> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{} line {}: {e}", path.display(), i + 1));
            let field = |name: &str| {
                v.get(name)
                    .and_then(|x| x.as_str())
                    .unwrap_or_else(|| panic!("{} line {}: no {name}", path.display(), i + 1))
                    .to_owned()
            };
            let bits = |name: &str| {
                IrisBits::from_base64(&field(name))
                    .unwrap_or_else(|e| panic!("{} line {}: {name}: {e}", path.display(), i + 1))
            };
            InputRecord {
                line: i + 1,
                subject: field("subject"),
                eye: v
                    .get("eye")
                    .and_then(|x| x.as_str())
                    .unwrap_or("left")
                    .to_owned(),
                template: IrisTemplate::new(bits("iris_codes"), bits("mask_codes")),
            }
        })
        .collect()
}

/// The records keyed as the parties key them.
pub fn by_key(records: &[InputRecord]) -> BTreeMap<RecordKey, IrisTemplate> {
    records
        .iter()
        .map(|r| ((r.subject.clone(), r.eye.clone()), r.template))
        .collect()
}

pub use privmatch_coordinator::iris::synth::enrollment_line;

/// Writes lines as a file (one per line, trailing newline).
pub fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// Test-only: reconstructs a template from the given parties' shares.
pub fn reconstruct(shares: &[&IrisShare]) -> IrisTemplate {
    let owned: Vec<IrisShare> = shares.iter().map(|s| (*s).clone()).collect();
    reconstruct_template(&owned).unwrap_or_else(|e| {
        let parties: Vec<String> = shares.iter().map(|s| s.party.to_string()).collect();
        panic!("reconstruction from {parties:?} failed: {e}")
    })
}

// ------------------------------------------------------------------------------------------
// The cluster.
// ------------------------------------------------------------------------------------------

/// Counters of one party: what "nothing was written" is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartyState {
    /// Rows of privmatch.iris_templates.
    pub templates: i64,
    /// Rows of privmatch.consumed_bundles.
    pub consumed_bundles: i64,
    /// Rows of privmatch.distributed_transactions (one per committed distributed transaction).
    pub transactions: i64,
    /// Prepared transactions of the whole PostgreSQL cluster (pg_prepared_xacts).
    pub prepared: i64,
}

/// The signals PostgreSQL's handlers serve (SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2,
/// SIGALRM, SIGTERM), as bits of a `/proc` signal mask (bit n − 1 for signal n).
const POSTGRES_SIGNALS: u64 =
    (1 << 0) | (1 << 1) | (1 << 2) | (1 << 9) | (1 << 11) | (1 << 13) | (1 << 14);

/// Every thread of the core's rayon pools in the PostgreSQL process `pid` (named
/// `privmatch-pool-N`, cut to 15 bytes by the kernel) blocks PostgreSQL's signals, so that a
/// handler never runs off the process's main thread; with `used_pool` (the process ran
/// parallel work) there is at least one such thread.
pub fn assert_pool_threads_block_signals(pid: i32, used_pool: bool) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("the threads of process {pid}: {e}"));
    let mut pool_threads = 0;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("privmatch-pool") {
            continue;
        }
        pool_threads += 1;
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or_else(|| panic!("no SigBlk for a thread of {pid}: {status}"));
        assert_eq!(
            blocked & POSTGRES_SIGNALS,
            POSTGRES_SIGNALS,
            "pool thread {} of process {pid} takes PostgreSQL's signals (SigBlk {blocked:016x})",
            comm.trim()
        );
    }
    assert!(
        pool_threads > 0 || !used_pool,
        "process {pid} has no pool thread after its parallel work"
    );
}

/// Whether `needle` occurs in `haystack` (the secret searches of the WAL and dumps).
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether the decimal number `number` (e.g. "0.55") occurs in `text` as a number of its own,
/// not as part of a longer one: a log's timestamps ("08:52:30.551") hold every short decimal
/// sooner or later, so a plain substring search for a secret number fails at random.
pub fn mentions_number(text: &str, number: &str) -> bool {
    let is_numeric = |c: char| c.is_ascii_digit() || c == '.';
    text.match_indices(number).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + number.len()..].chars().next();
        !before.is_some_and(is_numeric) && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

#[cfg(test)]
mod mentions_number_tests {
    use super::mentions_number;

    #[test]
    fn finds_the_number_alone_but_not_inside_a_timestamp() {
        assert!(mentions_number("threshold 0.55 set", "0.55"));
        assert!(mentions_number("t=0.55", "0.55"));
        assert!(mentions_number("0.55.", "0.55"));
        assert!(!mentions_number("08:52:30.551 UTC", "0.55"));
        assert!(!mentions_number("10.55", "0.55"));
        assert!(!mentions_number("0.553", "0.55"));
    }
}

/// Every byte of every WAL segment of the cluster in `data_dir`.
pub fn wal_bytes(data_dir: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(data_dir.join("pg_wal")).expect("pg_wal") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            all.extend(std::fs::read(&path).expect("WAL segment"));
        }
    }
    all
}

/// The SQLSTATE (empty when there is none) and the message of a failed query.
pub fn sqlstate_and_message(e: &tokio_postgres::Error) -> (String, String) {
    let code = e.code().map(|c| c.code().to_owned()).unwrap_or_default();
    let message = e
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_else(|| e.to_string());
    (code, message)
}

/// A local deployment for one test (see the module docs).
pub struct Cluster {
    /// Test name (part of the home directory).
    pub name: String,
    /// Home directory.
    pub home: PathBuf,
    /// Port of P0 (P1, P2: the next two).
    pub base_port: u16,
    /// Port of the coordinator.
    pub coordinator_port: u16,
    /// The client's configuration.
    pub config: Config,
    /// Each party as its operator reaches it (what the tests inspect tables with).
    pub operators: Vec<PartyConfig>,
    /// Each party as the coordinator's login role reaches it (the protocol functions only).
    pub coordinator_logins: Vec<PartyConfig>,
    rt: tokio::runtime::Runtime,
    /// A coordinator this test started itself (with a fault injected).
    own_coordinator: Option<Child>,
    started: Instant,
    /// The client-auth policy `cluster up` sets (`--client-auth`): see [`Cluster::start`].
    client_auth: &'static str,
}

impl Cluster {
    /// Starts a fresh deployment in `/tmp/pm-e2e-<name>` on ports `16000 + 10·slot` (parties)
    /// and `16000 + 10·slot + 9` (coordinator). Each test must use its own `name` and `slot`.
    /// A leftover deployment of an earlier, interrupted run of the same test is purged first.
    ///
    /// The parties' client-auth policy is `optional` (`cluster up --client-auth optional`):
    /// the CLI still signs every sealed input as the local client `cluster up` registers, but
    /// the tests that call the protocol functions in SQL with inputs they seal themselves (as
    /// the coordinator's role would) are not refused for lack of a signature.
    /// [`Cluster::start_required`] keeps `cluster up`'s default, `required`.
    pub fn start(name: &str, slot: u16) -> Cluster {
        Self::start_with(name, slot, "optional")
    }

    /// [`Cluster::start`] with the client-auth policy `cluster up` sets by default:
    /// `required`, every sealed input must be signed by a registered client.
    pub fn start_required(name: &str, slot: u16) -> Cluster {
        Self::start_with(name, slot, "required")
    }

    fn start_with(name: &str, slot: u16, client_auth: &'static str) -> Cluster {
        assert!(
            slot < 100,
            "slot {slot}: the tests may only use ports 16000-16999"
        );
        privmatch_bin();
        let base_port = PORT_RANGE_START + 10 * slot;
        let coordinator_port = base_port + 9;
        let home = PathBuf::from(format!("/tmp/pm-e2e-{name}"));
        if home.exists() {
            eprintln!(
                "[{name}] purging a leftover deployment in {}",
                home.display()
            );
            let out = Self::cli_at(&home, &["cluster", "down", "--purge"]);
            if !out.success() {
                eprintln!("[{name}] leftover cleanup: {out}");
            }
            std::fs::remove_dir_all(&home)
                .unwrap_or_else(|e| panic!("cannot remove {}: {e}", home.display()));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let mut cluster = Cluster {
            name: name.to_owned(),
            home: home.clone(),
            base_port,
            coordinator_port,
            config: Config {
                coordinator_url: String::new(),
                ca_cert: None,
                api_token: None,
                party_keys: Vec::new(),
                party_identities: Vec::new(),
                party_signing_keys: Vec::new(),
                paillier_service: None,
                client_id: None,
                client_key: None,
            },
            operators: Vec::new(),
            coordinator_logins: Vec::new(),
            rt,
            own_coordinator: None,
            started: Instant::now(),
            client_auth,
        };
        // From here on, Drop cleans up whatever `up` managed to create.
        let started = Instant::now();
        cluster.cluster_up();
        cluster.config = Config::load(&home.join("privmatch.toml"))
            .unwrap_or_else(|e| panic!("{}/privmatch.toml: {e:#}", home.display()));
        cluster.operators = (0..3u8)
            .map(|i| {
                let path = operator_config_file(&home, i);
                OperatorConfig::load(&path)
                    .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
                    .party
            })
            .collect();
        let coordinator_path = home.join(COORDINATOR_CONFIG_FILE);
        cluster.coordinator_logins = CoordinatorConfig::load(&coordinator_path)
            .unwrap_or_else(|e| panic!("{}: {e:#}", coordinator_path.display()))
            .parties;
        assert_eq!(cluster.operators[0].port, base_port);
        assert!(
            cluster
                .config
                .coordinator_url
                .ends_with(&format!("127.0.0.1:{coordinator_port}")),
            "{}",
            cluster.config.coordinator_url
        );
        eprintln!(
            "[{name}] cluster up in {:.1} s ({}; ports {base_port}-{}, coordinator {coordinator_port})",
            started.elapsed().as_secs_f64(),
            home.display(),
            base_port + 2
        );
        cluster
    }

    fn cli_at(home: &Path, args: &[&str]) -> CmdOutput {
        let mut cmd = Command::new(privmatch_bin());
        cmd.arg("--home")
            .arg(home)
            .args(args)
            .env_remove("PRIVMATCH_FAULT")
            .env_remove("PRIVMATCH_HOME");
        run(cmd, CLI_TIMEOUT)
    }

    /// A `privmatch --home HOME …` command object (not started), without fault injection.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(privmatch_bin());
        cmd.arg("--home")
            .arg(&self.home)
            .args(args)
            .env_remove("PRIVMATCH_FAULT")
            .env_remove("PRIVMATCH_HOME");
        cmd
    }

    /// Runs `privmatch --home HOME …` to completion.
    pub fn cli(&self, args: &[&str]) -> CmdOutput {
        run(self.command(args), CLI_TIMEOUT)
    }

    /// Runs `privmatch --home HOME …` in the background.
    pub fn cli_background(&self, args: &[&str]) -> Background {
        Background::spawn(self.command(args))
    }

    /// `privmatch cluster up` with this test's ports and client-auth policy (starts whatever
    /// is not running).
    pub fn cluster_up(&self) -> CmdOutput {
        self.cli(&[
            "cluster",
            "up",
            "--base-port",
            &self.base_port.to_string(),
            "--coordinator-port",
            &self.coordinator_port.to_string(),
            "--client-auth",
            self.client_auth,
        ])
        .expect_success()
    }

    /// A copy of the client configuration without the client credential `cluster up` wrote
    /// (`client_id`, `client_key`), in the home directory: with `--config` it, the CLI seals
    /// unsigned inputs, as a client nobody registered would.
    pub fn unsigned_config(&self) -> PathBuf {
        let mut config = self.config.clone();
        config.client_id = None;
        config.client_key = None;
        let path = self.path("unsigned-client.toml");
        config
            .save(&path)
            .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        path
    }

    /// A path inside the home directory (for test files; removed with the cluster).
    pub fn path(&self, name: &str) -> PathBuf {
        self.home.join(name)
    }

    /// The lines of the log `log` (a path under the home, e.g. `p0/postgres.log`) that
    /// contain `needle` (a session id in hex, to follow one session through the logs).
    pub fn log_lines_with(&self, log: &str, needle: &str) -> Vec<String> {
        std::fs::read_to_string(self.path(log))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// `privmatch iris enroll --input FILE --no-progress EXTRA…`.
    pub fn enroll(&self, input: &Path, extra: &[&str]) -> CmdOutput {
        let input = input.display().to_string();
        let mut args = vec!["iris", "enroll", "--input", &input, "--no-progress"];
        args.extend_from_slice(extra);
        self.cli(&args)
    }

    // --- databases ---------------------------------------------------------------------------

    /// Runs one query at `party` as its operator, on a fresh connection.
    pub fn query(
        &self,
        party: usize,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Vec<tokio_postgres::Row> {
        self.query_as(&self.operators[party], sql, params)
            .unwrap_or_else(|e| panic!("[{}] P{party}: {sql}: {e}", self.name))
    }

    /// Sets `log_min_messages` at `party` (e.g. `debug1`, where the parties log each session's
    /// steps) and waits until a new session sees it: `pg_reload_conf()` only signals the
    /// postmaster, which then signals the running backends, so a search started at once could
    /// run before the setting arrives.
    pub fn set_log_level(&self, party: usize, level: &str) {
        self.query(
            party,
            &format!("ALTER SYSTEM SET log_min_messages = {level}"),
            &[],
        );
        self.query(party, "SELECT pg_reload_conf()", &[]);
        wait_until(
            Duration::from_secs(30),
            &format!("P{party}'s log_min_messages to become {level}"),
            || {
                let rows = self.query(party, "SHOW log_min_messages", &[]);
                rows.first().map(|r| r.get::<_, String>(0)).as_deref() == Some(level)
            },
        );
        // The running backends (the coordinator's pool) take it at their next command, after
        // the postmaster's signal: give the signal a moment to be delivered.
        std::thread::sleep(Duration::from_millis(200));
    }

    /// Runs one query at `party` as the coordinator's login role: its rows, or the SQLSTATE
    /// and message of the error.
    pub fn query_as_coordinator(
        &self,
        party: usize,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::Row>, (String, String)> {
        let login = &self.coordinator_logins[party];
        self.rt.block_on(async {
            let client = privmatch_coordinator::parties::open(login)
                .await
                .map_err(|e| (String::new(), format!("connecting: {e}")))?;
            let rows = client.batch_execute(sql).await;
            let rows = match rows {
                Ok(()) => client.simple_query("SELECT 1").await.map(|_| Vec::new()),
                Err(e) => Err(e),
            };
            drop(client);
            rows.map_err(|e| sqlstate_and_message(&e))
        })
    }

    fn query_as(
        &self,
        login: &PartyConfig,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, String> {
        self.rt.block_on(async {
            let client = privmatch_coordinator::parties::open(login)
                .await
                .map_err(|e| format!("connecting: {e}"))?;
            client
                .query(sql, params)
                .await
                .map_err(|e| format!("{e} ({:?})", e.as_db_error().map(|d| d.message())))
        })
    }

    /// A login at `party` in the application role `privmatch_application` (created on first
    /// use, by the operator): what an application calls the SQL front door with.
    pub fn application(&self, party: usize) -> PartyConfig {
        let user = format!("app_p{party}");
        let password = format!("app-{}-{party}", self.name);
        let exists: i64 = self.query(
            party,
            "SELECT count(*) FROM pg_roles WHERE rolname = $1",
            &[&user],
        )[0]
        .get(0);
        if exists == 0 {
            self.query(
                party,
                &format!(
                    "CREATE ROLE {user} LOGIN PASSWORD '{password}' IN ROLE privmatch_application"
                ),
                &[],
            );
            // Its connection limit and temp_file_limit, as for every application login.
            self.query(party, "SELECT * FROM privmatch.apply_login_limits()", &[]);
        }
        PartyConfig {
            user,
            password,
            ..self.operators[party].clone()
        }
    }

    /// Runs one query at a login (e.g. [`Cluster::application`]): its rows, or the SQLSTATE
    /// and message of the error.
    pub fn query_login(
        &self,
        login: &PartyConfig,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, (String, String)> {
        self.rt.block_on(async {
            let client = privmatch_coordinator::parties::open(login)
                .await
                .map_err(|e| (String::new(), format!("connecting: {e}")))?;
            client
                .query(sql, params)
                .await
                .map_err(|e| sqlstate_and_message(&e))
        })
    }

    /// The three parties' public keys, as pinned in the configuration.
    pub fn party_keys(&self) -> [PartyPublicKey; 3] {
        std::array::from_fn(|i| {
            PartyPublicKey::from_hex(&self.config.party_keys[i]).expect("pinned key")
        })
    }

    /// One connection per party, P0 to P2, as the coordinator's login role: what the tests
    /// drive protocol functions with, so they pass only with the coordinator's privileges
    /// (call inside [`Cluster::block_on`]).
    pub async fn clients(&self) -> Vec<tokio_postgres::Client> {
        let mut out = Vec::with_capacity(3);
        for login in &self.coordinator_logins {
            let client = privmatch_coordinator::parties::open(login)
                .await
                .unwrap_or_else(|e| panic!("[{}] connecting to P{}: {e}", self.name, login.index));
            out.push(client);
        }
        out
    }

    /// Runs `f` to completion on this test's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Opens a connection to `party` as its operator, whose driver runs on this test's runtime
    /// (call inside [`Cluster::block_on`]).
    pub async fn connect(&self, party: usize) -> tokio_postgres::Client {
        privmatch_coordinator::parties::open(&self.operators[party])
            .await
            .unwrap_or_else(|e| panic!("[{}] connecting to P{party}: {e}", self.name))
    }

    /// A single bigint from a query.
    pub fn scalar(&self, party: usize, sql: &str) -> i64 {
        self.query(party, sql, &[])[0].get(0)
    }

    /// Records at each party.
    pub fn record_counts(&self) -> [i64; 3] {
        [0, 1, 2].map(|p| self.scalar(p, "SELECT count(*) FROM privmatch.iris_templates"))
    }

    /// Prepared transactions at each party's PostgreSQL cluster.
    pub fn prepared_counts(&self) -> [i64; 3] {
        [0, 1, 2].map(|p| self.scalar(p, "SELECT count(*) FROM pg_prepared_xacts"))
    }

    /// The counters of every party.
    pub fn snapshot(&self) -> [PartyState; 3] {
        [0, 1, 2].map(|p| {
            let row = &self.query(
                p,
                "SELECT (SELECT count(*) FROM privmatch.iris_templates), \
                        (SELECT count(*) FROM privmatch.consumed_bundles), \
                        (SELECT count(*) FROM privmatch.distributed_transactions), \
                        (SELECT count(*) FROM pg_prepared_xacts)",
                &[],
            )[0];
            PartyState {
                templates: row.get(0),
                consumed_bundles: row.get(1),
                transactions: row.get(2),
                prepared: row.get(3),
            }
        })
    }

    /// The (subject, eye) keys a party holds.
    pub fn keys(&self, party: usize) -> BTreeSet<RecordKey> {
        self.query(
            party,
            "SELECT subject, eye::text FROM privmatch.iris_templates",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    }

    /// How many records of `subject` a party holds.
    pub fn subject_count(&self, party: usize, subject: &str) -> i64 {
        self.query(
            party,
            "SELECT count(*) FROM privmatch.iris_templates WHERE subject = $1",
            &[&subject],
        )[0]
        .get(0)
    }

    /// Test-only: every share a party holds, decoded and checked to carry that party's index.
    pub fn read_shares(&self, party: usize) -> BTreeMap<RecordKey, IrisShare> {
        let rows = self.query(
            party,
            "SELECT subject, eye::text, privmatch.iris_code_share_send(code_share), \
                    privmatch.iris_mask_share_send(mask_share) FROM privmatch.iris_templates",
            &[],
        );
        let mut out = BTreeMap::new();
        for row in rows {
            let key: RecordKey = (row.get(0), row.get(1));
            let code: Vec<u8> = row.get(2);
            let mask: Vec<u8> = row.get(3);
            let code = decode_share(ShareKind::IrisCode, &code)
                .unwrap_or_else(|e| panic!("P{party} {key:?}: code share: {e}"));
            let mask = decode_share(ShareKind::IrisMask, &mask)
                .unwrap_or_else(|e| panic!("P{party} {key:?}: mask share: {e}"));
            assert_eq!(code.party.as_usize(), party, "{key:?}: code share party");
            assert_eq!(mask.party.as_usize(), party, "{key:?}: mask share party");
            let share = IrisShare {
                party: PartyIndex::ALL[party],
                code: code.coefs(),
                mask: mask.coefs(),
            };
            assert!(
                out.insert(key.clone(), share).is_none(),
                "{key:?} twice at P{party}"
            );
        }
        out
    }

    /// Test-only: checks that every party holds exactly the keys of `expected`, and that every
    /// record reconstructs — from all three parties and from each pair — to the expected
    /// template with its code masked ([`IrisTemplate::with_masked_code`]). Returns the number
    /// of records checked.
    pub fn assert_reconstructs(&self, expected: &BTreeMap<RecordKey, IrisTemplate>) -> usize {
        let shares = [0, 1, 2].map(|p| self.read_shares(p));
        let want: BTreeSet<&RecordKey> = expected.keys().collect();
        for (p, s) in shares.iter().enumerate() {
            let have: BTreeSet<&RecordKey> = s.keys().collect();
            assert!(
                have == want,
                "P{p} holds {} records, expected {}; missing {:?}; unexpected {:?}",
                have.len(),
                want.len(),
                want.difference(&have).take(5).collect::<Vec<_>>(),
                have.difference(&want).take(5).collect::<Vec<_>>()
            );
        }
        for (key, template) in expected {
            let [a, b, c] = [0, 1, 2].map(|p| &shares[p][key]);
            let reference = template.with_masked_code();
            for (combo, parts) in [
                ("P0+P1+P2", vec![a, b, c]),
                ("P0+P1", vec![a, b]),
                ("P0+P2", vec![a, c]),
                ("P1+P2", vec![b, c]),
            ] {
                assert!(
                    reconstruct(&parts) == reference,
                    "{key:?}: reconstruction from {combo} differs from the enrolled template"
                );
            }
        }
        expected.len()
    }

    // --- the coordinator ----------------------------------------------------------------------

    /// Base URL of the coordinator.
    pub fn coordinator_url(&self) -> String {
        self.config.coordinator_url()
    }

    /// An HTTP client that trusts the cluster's CA only.
    fn http_client(&self, timeout: Option<Duration>) -> Result<reqwest::Client, reqwest::Error> {
        let mut builder = reqwest::Client::builder().tls_built_in_root_certs(false);
        if let Some(pem) = self
            .config
            .ca_cert
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
        {
            builder = builder.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
        }
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        builder.build()
    }

    /// Whether GET /v1/health answers 200.
    pub fn healthy(&self) -> bool {
        let url = format!("{}/v1/health", self.coordinator_url());
        self.rt.block_on(async {
            let Ok(client) = self.http_client(Some(Duration::from_secs(2))) else {
                return false;
            };
            client
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
    }

    /// POSTs raw bytes with the client's API credential; returns the HTTP status and the JSON
    /// answer.
    pub fn post_bytes(&self, path_and_query: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
        let url = format!("{}{path_and_query}", self.coordinator_url());
        self.rt
            .block_on(async {
                let mut request = self
                    .http_client(None)?
                    .post(&url)
                    .header("content-type", "application/octet-stream")
                    .body(body);
                if let Some(token) = &self.config.api_token {
                    request = request.bearer_auth(token);
                }
                let response = request.send().await?;
                let status = response.status().as_u16();
                let text = response.text().await?;
                Ok::<_, reqwest::Error>((status, text))
            })
            .map(|(status, text)| {
                let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
                (status, json)
            })
            .unwrap_or_else(|e| panic!("POST {url}: {e}"))
    }

    fn coordinator_pid_file(&self) -> PathBuf {
        self.home.join("coordinator.pid")
    }

    /// Stops the running coordinator (one this test started, or the one in coordinator.pid)
    /// and waits until its port is free.
    pub fn stop_coordinator(&mut self) {
        if let Some(mut child) = self.own_coordinator.take() {
            let _ = child.kill();
            let _ = child.wait();
        } else if let Some(pid) = std::fs::read_to_string(self.coordinator_pid_file())
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            signal(pid, "TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while process_alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if process_alive(pid) {
                signal(pid, "KILL");
            }
        }
        std::fs::remove_file(self.coordinator_pid_file()).ok();
        wait_until(Duration::from_secs(15), "the coordinator to stop", || {
            !self.healthy()
        });
    }

    /// Starts `privmatch --config HOME/privmatch.toml coordinator serve` as this test's child,
    /// with `PRIVMATCH_FAULT=fault` when given (output appended to HOME/coordinator-e2e.log),
    /// and waits until it is healthy. Its pid goes to HOME/coordinator.pid so that
    /// `cluster down` can stop it as well.
    pub fn start_coordinator(&mut self, fault: Option<&str>) {
        assert!(
            self.own_coordinator.is_none(),
            "a coordinator is already running"
        );
        let log_path = self.home.join("coordinator-e2e.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("coordinator log");
        let logged_before = log.metadata().map_or(0, |m| m.len() as usize);
        let mut cmd = Command::new(privmatch_bin());
        cmd.args(["coordinator", "serve", "--coordinator-config"])
            .arg(self.home.join(COORDINATOR_CONFIG_FILE))
            .env_remove("PRIVMATCH_FAULT")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        if let Some(fault) = fault {
            cmd.env("PRIVMATCH_FAULT", fault);
        }
        let mut child = cmd.spawn().expect("cannot start the coordinator");
        std::fs::write(self.coordinator_pid_file(), child.id().to_string()).expect("pid file");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.healthy() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "[{}] the coordinator exited at start-up ({status}); see {}",
                    self.name,
                    self.home.join("coordinator-e2e.log").display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the coordinator did not become healthy"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.own_coordinator = Some(child);
        if fault.is_some() {
            // A CLI built without the feature ignores PRIVMATCH_FAULT: the test would then
            // run without its fault and prove nothing.
            let logged = std::fs::read(&log_path).unwrap_or_default();
            let started = String::from_utf8_lossy(logged.get(logged_before..).unwrap_or_default());
            assert!(
                started.contains("fault injection enabled"),
                "[{}] the coordinator did not enable fault injection: build the CLI with `cargo build --release -p privmatch-coordinator --features fault-injection` (scripts/test.sh does); see {}",
                self.name,
                log_path.display()
            );
        }
    }

    /// Waits for the coordinator this test started to exit (an injected crash) and returns
    /// its status.
    pub fn wait_coordinator_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self
            .own_coordinator
            .take()
            .expect("no coordinator started by this test");
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                std::fs::remove_file(self.coordinator_pid_file()).ok();
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the coordinator did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Replaces the running coordinator with a normal one started by `cluster up` (whose
    /// start-up recovery finishes transactions left in doubt).
    pub fn restart_coordinator(&mut self) -> CmdOutput {
        self.stop_coordinator();
        self.cluster_up()
    }

    // --- parties --------------------------------------------------------------------------------

    fn data_dir(&self, party: usize) -> PathBuf {
        self.home.join(format!("p{party}/data"))
    }

    /// `pg_dump` of party `party`'s database as its operator, in `format` (`p` plain, `c`
    /// custom), to `out`.
    pub fn pg_dump(&self, party: usize, format: &str, out: &Path) {
        let operator = &self.operators[party];
        let mut cmd = Command::new(pg_bindir().join("pg_dump"));
        cmd.args(["-h", &operator.host, "-p", &operator.port.to_string()])
            .args(["-U", &operator.user, "-d", &operator.dbname])
            .arg(format!("-F{format}"))
            .arg("-f")
            .arg(out)
            .env("PGPASSWORD", &operator.password);
        run(cmd, Duration::from_secs(120)).expect_success();
    }

    /// Drops party `party`'s database and restores the custom-format `dump` into a new one,
    /// as its operator would (the key file stays where it is).
    pub fn restore_database(&self, party: usize, dump: &Path) {
        let mut admin = self.operators[party].clone();
        admin.dbname = "postgres".into();
        self.block_on(async {
            let client = privmatch_coordinator::parties::open(&admin)
                .await
                .expect("connect");
            // Two statements: neither may run inside the implicit transaction of a batch.
            client
                .batch_execute("DROP DATABASE privmatch WITH (FORCE)")
                .await
                .expect("drop the party's database");
            client
                .batch_execute("CREATE DATABASE privmatch")
                .await
                .expect("create the party's database");
        });
        let operator = &self.operators[party];
        let mut restore = Command::new(pg_bindir().join("pg_restore"));
        restore
            .args(["-h", &operator.host, "-p", &operator.port.to_string()])
            .args([
                "-U",
                &operator.user,
                "-d",
                &operator.dbname,
                "--exit-on-error",
            ])
            .arg(dump)
            .env("PGPASSWORD", &operator.password);
        run(restore, Duration::from_secs(120)).expect_success();
    }

    /// `kill -9` of a party's postmaster; waits until it is gone.
    pub fn kill_party(&self, party: usize) {
        let pidfile = self.data_dir(party).join("postmaster.pid");
        let text = std::fs::read_to_string(&pidfile)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", pidfile.display()));
        let pid: u32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no pid in {}", pidfile.display()));
        signal(pid, "KILL");
        wait_until(Duration::from_secs(10), "the postmaster to die", || {
            !process_alive(pid)
        });
    }

    /// Starts a party's PostgreSQL with `pg_ctl start` (as `postgres`), retrying while the
    /// backends of a killed postmaster are still exiting.
    pub fn start_party(&self, party: usize) {
        let pg_ctl = pg_bindir().join("pg_ctl");
        let log = self.home.join(format!("p{party}/postgres.log"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"])
                .arg(&pg_ctl)
                .args(["start", "-w", "-t", "60", "-D"])
                .arg(self.data_dir(party))
                .arg("-l")
                .arg(&log);
            let out = run(cmd, Duration::from_secs(90));
            if out.success() {
                return;
            }
            if Instant::now() > deadline {
                panic!("[{}] cannot restart P{party}: {out}", self.name);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Runs `privmatch recover` until no prepared transaction is left at any party.
    pub fn recover_until_clean(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.cli(&["recover"]).expect_success();
            if self.prepared_counts() == [0, 0, 0] {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "[{}] prepared transactions left after {timeout:?}: {:?}; last recover: {out}",
                    self.name,
                    self.prepared_counts()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn dump_logs(&self) {
        let mut logs = vec![
            self.home.join("coordinator.log"),
            self.home.join("coordinator-e2e.log"),
        ];
        logs.extend((0..3).map(|p| self.home.join(format!("p{p}/postgres.log"))));
        for log in logs {
            if let Ok(text) = std::fs::read_to_string(&log) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(25)..];
                eprintln!(
                    "--- [{}] tail of {} ---\n{}",
                    self.name,
                    log.display(),
                    tail.join("\n")
                );
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        if let Some(mut child) = self.own_coordinator.take() {
            let _ = child.kill();
            let _ = child.wait();
            std::fs::remove_file(self.coordinator_pid_file()).ok();
        }
        // Nothing here may panic: a panic while a failed test unwinds would abort the run.
        let keep = std::env::var_os("PRIVMATCH_E2E_KEEP").is_some();
        let args: &[&str] = if keep {
            &["cluster", "down"]
        } else {
            &["cluster", "down", "--purge"]
        };
        let down = find_privmatch_bin().and_then(|bin| {
            let mut cmd = Command::new(bin);
            cmd.arg("--home").arg(&self.home).args(args);
            Background::try_spawn(cmd)?.wait_result(Duration::from_secs(120))
        });
        match down {
            Ok(out) if out.success() => {}
            Ok(out) => {
                eprintln!("[{}] teardown failed: {out}", self.name);
                return;
            }
            Err(e) => {
                eprintln!("[{}] teardown failed: {e}", self.name);
                return;
            }
        }
        if keep {
            eprintln!(
                "[{}] PRIVMATCH_E2E_KEEP: kept {}",
                self.name,
                self.home.display()
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.home) {
            eprintln!("[{}] cannot remove {}: {e}", self.name, self.home.display());
        }
        eprintln!(
            "[{}] done in {:.1} s, cluster torn down",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// A failed SQL call at one party: which party, its SQLSTATE and message.
#[derive(Debug)]
pub struct Failure {
    /// The party (0, 1, 2).
    pub party: usize,
    /// The SQLSTATE, when the party reported one.
    pub sqlstate: Option<String>,
    /// The party's message (or the connection error).
    pub message: String,
}

/// Wraps a tokio-postgres error from `party`.
pub fn failure(party: usize, e: &tokio_postgres::Error) -> Failure {
    Failure {
        party,
        sqlstate: e.code().map(|c| c.code().to_owned()),
        message: e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
    }
}
