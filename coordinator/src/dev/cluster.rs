//! `privmatch cluster up|down|status`: three local parties — PostgreSQL clusters on loopback
//! ports, each with the extension and its own identity — and the coordinator, all under one
//! home directory. PostgreSQL refuses to run as root, so when invoked as root the clusters run
//! as an unprivileged user (`postgres` by default). `up` on a running cluster changes nothing;
//! `down` keeps the data unless `--purge` is given.
//!
//! Each party is set up as its own organisation would: the operator (the cluster's superuser
//! `privmatch`) creates the database and the extension, initialises the party (its key goes
//! to `p<i>/party.key`, beside the data directory, never into a table) and pins the peers'
//! keys; the coordinator gets a login role `coordinator` that is a member of
//! `privmatch_coordinator` only, so it can call the protocol functions and nothing else.
//!
//! The client pins the parties' keys as a real client does: each operator exports its party's
//! signed identity bundle (`operators/p<i>.identity.json`, [`crate::identity`]) and the
//! client configuration pins it with the fingerprint the export printed; the coordinator's
//! configuration is never read for them.
//!
//! The client is a registered client, as in a deployment (docs/deployment.md, "Registered
//! clients"): `up` makes its signing key (`client.key`, 0600, and `client.key.pub`), each
//! party's operator registers it as [`LOCAL_CLIENT_ID`] with a signed command (the path of
//! `privmatch client register --operator-config`), and sets the party's client-auth policy
//! `required` (`--client-auth optional` leaves unsigned inputs accepted). The client
//! configuration names the key, so every sealed probe and enrolment envelope the CLI sends is
//! signed for its party; an unsigned one is refused at every party.
//!
//! Layout of the home directory: `p0/`, `p1/`, `p2/` (each: `data/`, `run/` socket directory,
//! `party.key`, `postgres.log`, `tls/`); the configurations, one per role (`crate::config`):
//! `privmatch.toml` (the client's), `coordinator.toml` (the coordinator's),
//! `operators/p<i>.toml` (each operator's, with its signing key and identity bundle);
//! `client.key` (the client's signing key) and `client.key.pub`; `tls/` (the local CA and the
//! coordinator's certificate); `coordinator.log`, `coordinator.pid`; with `--link-delay-ms`,
//! `delay-proxy.log`, `delay-proxy.pid` and `link-delay-ms` (the delay the links were set up with).
//!
//! Nothing secret is ever readable by another local user, not even while `up` runs: the home
//! is 0700 (0710 with the cluster user's group when run as root, so the servers and the
//! coordinator can reach their own files in it), every party directory 0700, every key,
//! password, credential, configuration and log 0600. initdb's password file lives in a 0700
//! directory of its own, mode 0600 from its creation, and is deleted right after initdb. When
//! run as root, the coordinator runs as the cluster user too, never as root. `down --purge`
//! deletes every key, the CA's included, so the next `up` makes a new CA.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use privmatch_core::crypto::client_auth::{ClientAuthPolicy, ClientId, ClientRegistration};

use crate::cli::client_auth::{register_as_operator, set_policy_as_operator};
use crate::cli::client_key::{create_key, load_key, public_key_path};
use crate::cli::deploy::API_KEYS_FILE;
use crate::cli::http::Coordinator;
use crate::cli::operator::{self, provision, set_operator_key, COORDINATOR_ROLE};
use crate::cli::party::{export_identity, save_bundle};
use crate::config::{
    operator_config_file, Config, CoordinatorConfig, OperatorConfig, PartyConfig, CONFIG_FILE,
    COORDINATOR_CONFIG_FILE,
};
use crate::dev::delay::{self, Link};
use crate::server::auth::{ApiKeys, Scope};
use crate::tls::LocalCa;
use privmatch_api::wire::PartyStatus;

/// Actions of `privmatch cluster`.
#[derive(Subcommand, Clone, Debug)]
pub enum ClusterAction {
    /// Create (first time) and start the three parties and the coordinator.
    Up {
        /// Port of P0; P1 and P2 use the next two. The defaults lie below the kernel's ephemeral
        /// port range, so an outgoing connection can never be holding them.
        #[arg(long, default_value_t = 15430)]
        base_port: u16,
        /// Port of the coordinator's HTTP API.
        #[arg(long, default_value_t = 15439)]
        coordinator_port: u16,
        /// Unprivileged user the clusters run as when invoked as root.
        #[arg(long, default_value = "postgres")]
        run_as: String,
        /// Directory of initdb/pg_ctl (default: `pg_config --bindir`).
        #[arg(long)]
        pg_bin: Option<PathBuf>,
        /// The parties' client-auth policy: `required` (every sealed input must be signed by a
        /// registered client; the CLI signs as the local client) or `optional` (unsigned
        /// inputs accepted too, e.g. to try the protocol functions by hand in SQL).
        #[arg(long, default_value = "required", value_parser = ["required", "optional"])]
        client_auth: String,
        /// One-way delay in milliseconds on every link between the coordinator and a party,
        /// both ways (the coordinator's connections to the parties and the front doors' calls
        /// to the coordinator), as if they ran on hosts apart: a relay process
        /// (`delay-proxy.pid`, `delay-proxy.log`) listens 20 ports above each party and the
        /// coordinator. 0: direct links. A running cluster keeps its delay: `down` first.
        #[arg(long, default_value_t = 0)]
        link_delay_ms: u64,
    },
    /// The relay of `up --link-delay-ms` (started by `up`; runs until stopped).
    #[command(hide = true)]
    DelayProxy {
        /// A delayed link, `LISTEN=TARGET` (ip:port=host:port); repeated.
        #[arg(long = "link", required = true)]
        links: Vec<Link>,
        /// The one-way delay in milliseconds.
        #[arg(long)]
        one_way_ms: u64,
    },
    /// Stop the coordinator and the parties.
    Down {
        /// Also delete all data, keys and configuration.
        #[arg(long)]
        purge: bool,
    },
    /// Show whether each part runs, and the records each party holds.
    Status,
}

/// How to run PostgreSQL's programs for this cluster.
struct Runner {
    pg_bin: PathBuf,
    /// Some(user) when we are root and must drop privileges.
    run_as: Option<String>,
    /// The user id and primary group id of `run_as`.
    ids: Option<(u32, u32)>,
}

/// The user id and primary group id of `user` (`id -u`, `id -g`).
fn user_ids(user: &str) -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let out = Command::new("id")
            .args([flag, user])
            .output()
            .context("cannot run id")?;
        if !out.status.success() {
            bail!("no user {user:?} to run the cluster as (pass --run-as)");
        }
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .ok()
            .with_context(|| format!("id {flag} {user} printed no number"))
    };
    let uid = id("-u")?;
    if uid == 0 {
        bail!("--run-as {user}: the cluster and the coordinator must run as an unprivileged user, not root");
    }
    Ok((uid, id("-g")?))
}

/// Sets `path`'s permission bits to `mode`.
fn chmod(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {:04o} {}", mode, path.display()))
}

/// Creates directory `dir` (and its parents) if missing, created with `mode` from the start so
/// it is never more open than that, and sets `mode` on it.
fn make_dir(dir: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    chmod(dir, mode)
}

impl Runner {
    fn new(pg_bin: Option<PathBuf>, run_as: &str) -> Result<Self> {
        let pg_bin = match pg_bin {
            Some(dir) => dir,
            None => {
                let out = Command::new("pg_config")
                    .arg("--bindir")
                    .output()
                    .context("cannot run pg_config: install PostgreSQL (e.g. apt-get install postgresql-15) or pass --pg-bin")?;
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        if !pg_bin.join("initdb").exists() {
            bail!(
                "{} has no initdb: pass --pg-bin with PostgreSQL's bin directory",
                pg_bin.display()
            );
        }
        // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
        let run_as = (unsafe { libc::geteuid() } == 0).then(|| run_as.to_owned());
        let ids = run_as.as_deref().map(user_ids).transpose()?;
        Ok(Runner {
            pg_bin,
            run_as,
            ids,
        })
    }

    /// Makes the file or directory `path` (not what is inside) belong to the cluster user and
    /// its group, when run as root.
    fn give(&self, path: &Path) -> Result<()> {
        if let Some((uid, gid)) = self.ids {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .with_context(|| format!("cannot chown {}", path.display()))?;
        }
        Ok(())
    }

    /// A directory the cluster user must traverse but only root may list or change (the home,
    /// its `tls/`): root and the cluster user's group, mode 0710; without root, the user's
    /// own, 0700.
    fn shared_dir(&self, dir: &Path) -> Result<()> {
        match self.ids {
            Some((_, gid)) => {
                make_dir(dir, 0o710)?;
                std::os::unix::fs::chown(dir, Some(0), Some(gid))
                    .with_context(|| format!("cannot chown {}", dir.display()))
            }
            None => make_dir(dir, 0o700),
        }
    }

    fn command(&self, program: &str) -> Command {
        let path = self.pg_bin.join(program);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", user, "--"]).arg(path);
                cmd
            }
            None => Command::new(path),
        };
        // A server inheriting these would append Rust backtraces to error details.
        cmd.env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE");
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {program}"))?;
        if !out.status.success() {
            bail!(
                "{program} {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Makes `dir` belong to the cluster user.
    fn own(&self, dir: &Path) -> Result<()> {
        if let Some(user) = &self.run_as {
            let status = Command::new("chown")
                .args(["-R", &format!("{user}:"), &dir.display().to_string()])
                .status()
                .context("cannot run chown")?;
            if !status.success() {
                bail!(
                    "chown {} to {user} failed (does the user exist?)",
                    dir.display()
                );
            }
        }
        Ok(())
    }
}

fn party_dir(home: &Path, index: usize) -> PathBuf {
    home.join(format!("p{index}"))
}

fn data_dir(home: &Path, index: usize) -> PathBuf {
    party_dir(home, index).join("data")
}

/// The operator's role at every party: the cluster's superuser, which owns the database.
const OPERATOR_ROLE: &str = "privmatch";

/// Where party `index` keeps its secret key: beside its data directory, so that a physical
/// backup of the data directory does not contain it.
fn key_file(home: &Path, index: usize) -> PathBuf {
    party_dir(home, index).join("party.key")
}

/// The password of role `role` at party `index`: generated once, kept (mode 0600, owned by
/// whoever runs `up`) in the private home directory so a half-finished `up` can be resumed.
fn party_password(home: &Path, index: usize, role: &str) -> Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = home.join(password_file(index, role));
    if let Ok(text) = std::fs::read_to_string(&path) {
        return Ok(text.trim().to_owned());
    }
    let mut bytes = [0u8; 18];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
    let password = hex::encode(bytes);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(password.as_bytes())?;
    file.sync_all()?;
    Ok(password)
}

fn password_file(index: usize, role: &str) -> String {
    if role == OPERATOR_ROLE {
        format!(".p{index}.password")
    } else {
        format!(".p{index}.{role}.password")
    }
}

/// Loads the extension at server start: its engine (the in-memory share matrix and search
/// sessions) is a background worker.
const PRELOAD_SETTING: &str = "shared_preload_libraries = 'privmatch'";

const SERVER_SETTINGS: &str = "
# --- privmatch local party ---
shared_preload_libraries = 'privmatch'
listen_addresses = '127.0.0.1'
max_prepared_transactions = 64
max_connections = 160
shared_buffers = 256MB
max_wal_size = 4GB
checkpoint_timeout = 15min
wal_buffers = 16MB
";

/// Creates party `index`'s directory (0700, the cluster user's) and its socket directory.
fn make_party_dir(runner: &Runner, home: &Path, index: usize) -> Result<()> {
    let dir = party_dir(home, index);
    for dir in [dir.clone(), dir.join("run")] {
        make_dir(&dir, 0o700)?;
        runner.give(&dir)?;
    }
    Ok(())
}

/// Writes initdb's password file: in a directory of its own, 0700 from its creation, the file
/// 0600 from its creation, both then given to the cluster user (who runs initdb). No other
/// user can read the superuser's password at any moment; the caller deletes both right after
/// initdb.
fn write_initdb_password(runner: &Runner, dir: &Path, password: &str) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // A leftover of an interrupted run holds nothing secret anymore: its password is replaced.
    std::fs::remove_dir_all(dir).ok();
    make_dir(dir, 0o700)?;
    runner.give(dir)?;
    let pwfile = dir.join("pwfile");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&pwfile)
        .with_context(|| format!("cannot write {}", pwfile.display()))?;
    file.write_all(format!("{password}\n").as_bytes())?;
    file.sync_all()?;
    runner.give(&pwfile)?;
    Ok(pwfile)
}

fn initdb(runner: &Runner, home: &Path, index: usize, port: u16, password: &str) -> Result<()> {
    let dir = party_dir(home, index);
    make_party_dir(runner, home, index)?;
    let secret_dir = dir.join(".initdb");
    let pwfile = write_initdb_password(runner, &secret_dir, password)?;
    let data = data_dir(home, index);
    let result = runner.run(
        "initdb",
        &[
            "-D",
            &data.display().to_string(),
            "-U",
            "privmatch",
            "--auth=scram-sha-256",
            "--pwfile",
            &pwfile.display().to_string(),
            "--no-locale",
            "-E",
            "UTF8",
        ],
    );
    std::fs::remove_dir_all(&secret_dir).ok();
    result?;
    let settings = format!(
        "{SERVER_SETTINGS}port = {port}\nunix_socket_directories = '{}'\nprivmatch.key_file = '{}'\n",
        dir.join("run").display(),
        key_file(home, index).display()
    );
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf)?;
    text.push_str(&settings);
    std::fs::write(&conf, text)?;
    Ok(())
}

/// Adds [`PRELOAD_SETTING`] to a party created before the engine existed. Returns whether the
/// configuration changed (a running server must then be restarted to load the engine).
fn ensure_preload(home: &Path, index: usize) -> Result<bool> {
    let conf = data_dir(home, index).join("postgresql.conf");
    let text = std::fs::read_to_string(&conf)
        .with_context(|| format!("cannot read {}", conf.display()))?;
    let present = text.lines().any(|line| {
        line.trim_start().starts_with("shared_preload_libraries") && line.contains("privmatch")
    });
    if present {
        return Ok(false);
    }
    std::fs::write(&conf, format!("{text}\n{PRELOAD_SETTING}\n"))
        .with_context(|| format!("cannot write {}", conf.display()))?;
    Ok(true)
}

/// Where party `index`'s TLS certificate and key live (owned by the cluster user).
fn party_tls_dir(home: &Path, index: usize) -> PathBuf {
    party_dir(home, index).join("tls")
}

/// Rejects every TCP session without TLS; the Unix socket stays open to the server's own
/// user for maintenance. Put first in pg_hba.conf, since the first matching line decides.
const HBA_REQUIRE_TLS: &str = "hostnossl all all all reject  # privmatch: TLS only over TCP";

/// Gives party `index` a server certificate from the cluster's CA, turns TLS on and refuses
/// TCP sessions without it. Returns whether the configuration changed (a running server must
/// then reload).
fn ensure_party_tls(runner: &Runner, home: &Path, index: usize, ca: &LocalCa) -> Result<bool> {
    let dir = party_tls_dir(home, index);
    make_dir(&dir, 0o700)?;
    let issued = ca.server_cert(&dir, "server", &["127.0.0.1", "localhost"])?;
    runner.own(&dir)?;
    let data = data_dir(home, index);
    let conf = data.join("postgresql.conf");
    let text = std::fs::read_to_string(&conf)
        .with_context(|| format!("cannot read {}", conf.display()))?;
    let mut changed = false;
    if !text.contains("# --- privmatch TLS ---") {
        let settings = format!(
            "\n# --- privmatch TLS ---\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\nssl_min_protocol_version = 'TLSv1.2'\n",
            issued.cert.display(),
            issued.key.display()
        );
        std::fs::write(&conf, format!("{text}{settings}"))
            .with_context(|| format!("cannot write {}", conf.display()))?;
        changed = true;
    }
    let hba = data.join("pg_hba.conf");
    let text =
        std::fs::read_to_string(&hba).with_context(|| format!("cannot read {}", hba.display()))?;
    if !text.lines().any(|line| line.trim() == HBA_REQUIRE_TLS) {
        std::fs::write(&hba, format!("{HBA_REQUIRE_TLS}\n{text}"))
            .with_context(|| format!("cannot write {}", hba.display()))?;
        changed = true;
    }
    Ok(changed)
}

fn is_running(runner: &Runner, home: &Path, index: usize) -> bool {
    runner
        .command("pg_ctl")
        .args(["status", "-D", &data_dir(home, index).display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Makes `path` a log file of mode 0600 (created so if missing; an existing one is tightened)
/// belonging to the cluster user.
fn private_log(runner: &Runner, path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    chmod(path, 0o600)?;
    runner.give(path)
}

fn start_party(runner: &Runner, home: &Path, index: usize) -> Result<()> {
    if is_running(runner, home, index) {
        return Ok(());
    }
    let log = party_dir(home, index).join("postgres.log");
    // pg_ctl appends to it and keeps its mode: 0600 before the server writes a line.
    private_log(runner, &log)?;
    runner
        .run(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-t",
                "120",
                "-D",
                &data_dir(home, index).display().to_string(),
                "-l",
                &log.display().to_string(),
            ],
        )
        .with_context(|| format!("starting P{index} (see {})", log.display()))?;
    Ok(())
}

fn stop_party(runner: &Runner, home: &Path, index: usize) -> Result<()> {
    if !is_running(runner, home, index) {
        return Ok(());
    }
    runner.run(
        "pg_ctl",
        &[
            "stop",
            "-w",
            "-m",
            "fast",
            "-D",
            &data_dir(home, index).display().to_string(),
        ],
    )?;
    Ok(())
}

/// As each party's operator: pins the other two parties' keys.
async fn pin_peers(operators: &[PartyConfig]) -> Result<()> {
    for party in operators {
        for peer in operators.iter().filter(|p| p.index != party.index) {
            operator::pin_peer(party, peer.index, &peer.public_key, false).await?;
        }
    }
    Ok(())
}

async fn coordinator_healthy(config: &Config) -> bool {
    Coordinator::new(config)
        .is_healthy(Duration::from_secs(2))
        .await
}

/// Starts `privmatch <args>` detached from this command's session, as the cluster user when
/// run as root, logging to `<name>.log` (0600) and recording its pid in `<name>.pid`.
fn start_detached(runner: &Runner, home: &Path, name: &str, args: &[String]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::process::CommandExt;
    let log_path = home.join(format!("{name}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    // A log made by an older version may be 0644.
    chmod(&log_path, 0o600)?;
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if let Some((uid, gid)) = runner.ids {
        // The standard library sets the group, drops the supplementary groups and then sets
        // the user in the child before exec: it never runs as root.
        cmd.uid(uid).gid(gid);
    }
    // Detach from our session so the process outlives this command.
    // SAFETY: the hook runs in the forked child before exec and calls only setsid, which is
    // async-signal-safe, allocates nothing and touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start the {name}"))?;
    crate::files::write_private(&home.join(format!("{name}.pid")), &child.id().to_string())?;
    Ok(())
}

/// Starts the coordinator in the background, as the cluster user when run as root (never as
/// root), its output appended to `coordinator.log` (0600).
fn start_coordinator(runner: &Runner, home: &Path, coordinator_config: &Path) -> Result<()> {
    let config = coordinator_config.display().to_string();
    let args = ["coordinator", "serve", "--coordinator-config", &config].map(String::from);
    start_detached(runner, home, "coordinator", &args)
}

/// The pid recorded in `<name>.pid`, if that process runs and is still ours: its command line
/// names `name` (`coordinator serve …`, `cluster delay-proxy …`). A pid file that outlived a
/// reboot may name an unrelated process, which must never be signalled.
fn running_pid(home: &Path, name: &str) -> Option<i32> {
    let pid = std::fs::read_to_string(home.join(format!("{name}.pid")))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    cmdline
        .split(|&b| b == 0)
        .any(|arg| arg == name.as_bytes())
        .then_some(pid)
}

/// Stops the process recorded in `<name>.pid` (SIGTERM, then SIGKILL after 10 s).
fn stop_detached(home: &Path, name: &str) {
    if let Some(pid) = running_pid(home, name) {
        // SAFETY: kill takes plain integers and touches no memory of ours; a stale pid at
        // worst makes it fail with ESRCH.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && running_pid(home, name).is_some() {
            std::thread::sleep(Duration::from_millis(100));
        }
        if running_pid(home, name).is_some() {
            // SAFETY: kill takes plain integers and touches no memory of ours; a process that
            // exited meanwhile makes it fail with ESRCH.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    std::fs::remove_file(home.join(format!("{name}.pid"))).ok();
}

/// The process name (pid and log file stem) of the link relay.
const RELAY: &str = "delay-proxy";

/// The file that records the one-way delay the running cluster's links were set up with.
const LINK_DELAY_FILE: &str = "link-delay-ms";

/// How far above a party's or the coordinator's port its delayed link listens.
const RELAY_PORT_OFFSET: u16 = 20;

/// The delayed address in front of `port` on loopback.
fn relay_port(port: u16) -> Result<u16> {
    port.checked_add(RELAY_PORT_OFFSET)
        .with_context(|| format!("port {port} has no room for its delayed link above it"))
}

/// The delay recorded for this home (0 when none was).
fn recorded_link_delay(home: &Path) -> u64 {
    std::fs::read_to_string(home.join(LINK_DELAY_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Refuses to change the delay of a running cluster: its coordinator and front doors were
/// set up with the other addresses. With the coordinator stopped, a relay left running with
/// another delay is stopped (`up` starts one with the wanted delay).
fn check_link_delay(home: &Path, wanted: u64) -> Result<()> {
    let recorded = recorded_link_delay(home);
    if recorded != wanted {
        if running_pid(home, "coordinator").is_some() {
            bail!(
                "the cluster at {} runs with a link delay of {recorded} ms, not {wanted} ms: run `privmatch cluster down` first",
                home.display()
            );
        }
        stop_detached(home, RELAY);
    }
    Ok(())
}

/// Starts the relay for `links` with `one_way_ms` (unless it runs) and waits until every
/// link accepts connections.
async fn start_relay(runner: &Runner, home: &Path, links: &[Link], one_way_ms: u64) -> Result<()> {
    if running_pid(home, RELAY).is_none() {
        let mut args = vec!["cluster".to_owned(), "delay-proxy".to_owned()];
        for link in links {
            args.push("--link".into());
            args.push(format!("{}={}", link.listen, link.target));
        }
        args.push("--one-way-ms".into());
        args.push(one_way_ms.to_string());
        start_detached(runner, home, RELAY, &args)?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for link in links {
        while tokio::net::TcpStream::connect(link.listen).await.is_err() {
            if Instant::now() > deadline {
                bail!(
                    "the link relay did not listen on {}; see {}",
                    link.listen,
                    home.join(format!("{RELAY}.log")).display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Another process on a link's port would have answered above while the relay ended on
    // its bind error.
    if running_pid(home, RELAY).is_none() {
        bail!(
            "the link relay is not running (a port taken?); see {}",
            home.join(format!("{RELAY}.log")).display()
        );
    }
    Ok(())
}

/// Where party `index` keeps its SQL front door's API credential (mode 0600, owned by the
/// cluster user; read by its server only).
fn front_door_credential_file(home: &Path, index: usize) -> PathBuf {
    party_dir(home, index).join("front-door.credential")
}

/// The scopes of a party's SQL front door at the coordinator: it enrols and searches, never
/// deletes or administers.
const FRONT_DOOR_SCOPES: [Scope; 2] = [Scope::Enroll, Scope::Search];

/// The API credentials: the client's (every scope, returned) and each party's front door's
/// (enroll and search, written to its credential file). Kept when the keys file still accepts
/// all of them; otherwise all are made afresh (replacing the keys file).
fn api_credentials(home: &Path, config_path: &Path, api_keys: &Path) -> Result<String> {
    let keys = ApiKeys::load(api_keys).ok();
    let accepted = |token: &str| keys.as_ref().is_some_and(|k| k.accepts(token));
    let previous = Config::load(config_path).ok().and_then(|c| c.api_token);
    let doors_kept = (0..3).all(|i| {
        std::fs::read_to_string(front_door_credential_file(home, i))
            .is_ok_and(|t| accepted(t.trim()))
    });
    if let Some(token) = previous.filter(|t| accepted(t) && doors_kept) {
        return Ok(token);
    }
    let (token, entry) = ApiKeys::generate("cli", &Scope::ALL)?;
    let mut entries = vec![entry];
    for index in 0..3 {
        let (door, entry) = ApiKeys::generate(&format!("front-door-p{index}"), &FRONT_DOOR_SCOPES)?;
        crate::files::write_private(&front_door_credential_file(home, index), &door)?;
        entries.push(entry);
    }
    ApiKeys::save(&entries, api_keys)?;
    Ok(token)
}

/// Points party `index`'s SQL front door at the coordinator `url` (certificate from `ca`):
/// its credential file (written by [`api_credentials`]), a copy of the CA certificate in its
/// TLS directory, and the settings in postgresql.conf. Returns whether the configuration
/// changed (a running server must then reload).
fn ensure_front_door(
    runner: &Runner,
    home: &Path,
    index: usize,
    ca: &LocalCa,
    url: &str,
) -> Result<bool> {
    let ca_copy = party_tls_dir(home, index).join("coordinator-ca.pem");
    std::fs::copy(ca.cert_path(), &ca_copy)
        .with_context(|| format!("cannot write {}", ca_copy.display()))?;
    let credential = front_door_credential_file(home, index);
    runner.own(&ca_copy)?;
    runner.own(&credential)?;
    let conf = data_dir(home, index).join("postgresql.conf");
    let text = std::fs::read_to_string(&conf)
        .with_context(|| format!("cannot read {}", conf.display()))?;
    let block = format!(
        "\n# --- privmatch front door ---\nprivmatch.coordinator_url = '{url}'\nprivmatch.coordinator_ca_file = '{}'\nprivmatch.coordinator_credential_file = '{}'\n",
        ca_copy.display(),
        credential.display()
    );
    if text.contains(block.trim_start()) {
        return Ok(false);
    }
    let kept = match text.find("\n# --- privmatch front door ---\n") {
        // An earlier block (another coordinator address): replaced, with what follows it.
        Some(at) => {
            let rest = &text[at + 1..];
            let end = rest[1..]
                .find("\n# --- ")
                .map_or(text.len(), |e| at + 2 + e);
            format!("{}{}", &text[..at], &text[end..])
        }
        None => text,
    };
    std::fs::write(&conf, format!("{kept}{block}"))
        .with_context(|| format!("cannot write {}", conf.display()))?;
    Ok(true)
}

/// One party's endpoint on loopback over TLS (certificate from the CA `ca_cert`), logging in
/// as `user`.
fn local_party(
    index: usize,
    port: u16,
    user: &str,
    password: String,
    key: &str,
    ca_cert: &Path,
) -> PartyConfig {
    PartyConfig {
        index: index as u8,
        host: "127.0.0.1".into(),
        port,
        dbname: "privmatch".into(),
        user: user.into(),
        password,
        public_key: key.into(),
        ca_cert: Some(ca_cert.to_owned()),
    }
}

/// Creates (first time) and starts party `index` on `port`, with TLS from `ca`; returns its
/// operator's endpoint.
fn start_local_party(
    runner: &Runner,
    home: &Path,
    index: usize,
    port: u16,
    ca: &LocalCa,
) -> Result<PartyConfig> {
    let password = party_password(home, index, OPERATOR_ROLE)?;
    // Also tightens a party directory an older version made 0755.
    make_party_dir(runner, home, index)?;
    if !data_dir(home, index).join("PG_VERSION").exists() {
        eprintln!(
            "creating party P{index} in {}",
            party_dir(home, index).display()
        );
        initdb(runner, home, index, port, &password)?;
    }
    if ensure_preload(home, index)? && is_running(runner, home, index) {
        eprintln!(
            "warning: P{index} runs without the privmatch engine preloaded; restart it (`privmatch cluster down` then `up`) to enable searches"
        );
    }
    if ensure_party_tls(runner, home, index, ca)? && is_running(runner, home, index) {
        runner.run(
            "pg_ctl",
            &["reload", "-D", &data_dir(home, index).display().to_string()],
        )?;
    }
    start_party(runner, home, index)?;
    Ok(local_party(
        index,
        port,
        OPERATOR_ROLE,
        password,
        "",
        &ca.cert_path(),
    ))
}

/// Gives the coordinator's own files to the cluster user (when run as root: the coordinator
/// runs as that user and must read them), mode 0600 for the secret ones.
fn give_coordinator_files(runner: &Runner, paths: &[&Path]) -> Result<()> {
    for path in paths {
        runner.give(path)?;
    }
    Ok(())
}

/// As each party's operator: exports the party's signed identity bundle (written to
/// `operators/p<i>.identity.json`) and returns it with the fingerprint the export printed,
/// which the client then compares, as a client given the fingerprint out of band would.
async fn export_identities(
    home: &Path,
    operators: &[OperatorConfig],
    ca: &LocalCa,
) -> Result<Vec<(crate::identity::IdentityBundle, String)>> {
    let mut out = Vec::with_capacity(operators.len());
    for operator in operators {
        let (bundle, identity) = export_identity(operator, &ca.cert_path()).await?;
        save_bundle(
            &bundle,
            &home
                .join("operators")
                .join(format!("p{}.identity.json", operator.party.index)),
        )?;
        out.push((bundle, identity.fingerprint_hex()));
    }
    Ok(out)
}

/// The id under which `up` registers the local CLI at the three parties.
pub const LOCAL_CLIENT_ID: &str = "local-cli";

/// The requests per hour of each budget kind the local client may make at each party: as many
/// as the party-wide iris budget at install, so benchmarks are held by the parties' own
/// budgets only.
const LOCAL_CLIENT_PER_HOUR: u32 = 100_000;

/// The local client's signing key file in the home directory (0600; its public key beside it
/// in `client.key.pub`).
fn client_key_file(home: &Path) -> PathBuf {
    home.join("client.key")
}

/// The local client's key: the one in `home` (made on the first `up`; a key file others may
/// read is refused), its public half returned.
fn local_client_key(
    home: &Path,
) -> Result<privmatch_core::crypto::client_auth::ClientVerifyingKey> {
    let path = client_key_file(home);
    if path.exists() {
        return Ok(load_key(&path)?.verifying_key());
    }
    // A public key left without its key (an interrupted `up`) is replaced.
    let public_path = public_key_path(&path);
    std::fs::remove_file(&public_path).ok();
    let public = create_key(&path)?;
    // Nothing in the home is for other users, not even the public half.
    chmod(&public_path, 0o600)?;
    Ok(public)
}

/// As each party's operator: registers the local client (its key in `home`) and sets the
/// party's client-auth policy to `policy`, with the operator's signed commands sent straight
/// to the party (the path of `privmatch client register --operator-config`). Registering
/// again with the same key changes nothing; a new key (the old file deleted) replaces it.
async fn register_local_client(
    home: &Path,
    operators: &[OperatorConfig],
    policy: ClientAuthPolicy,
) -> Result<()> {
    let registration = ClientRegistration {
        client: ClientId::new(LOCAL_CLIENT_ID).context("the local client id")?,
        key: local_client_key(home)?,
        per_hour: LOCAL_CLIENT_PER_HOUR,
        replace: true,
    };
    for operator in operators {
        let index = operator.party.index;
        register_as_operator(operator, &registration)
            .await
            .with_context(|| format!("registering the local client at P{index}"))?;
        set_policy_as_operator(operator, policy)
            .await
            .with_context(|| format!("setting P{index}'s client-auth policy"))?;
    }
    Ok(())
}

async fn up(
    home: &Path,
    config_path: &Path,
    base_port: u16,
    coordinator_port: u16,
    runner: &Runner,
    client_auth: ClientAuthPolicy,
    link_delay_ms: u64,
) -> Result<()> {
    check_link_delay(home, link_delay_ms)?;
    // Private from the start; an older version's 0755 home is tightened.
    runner.shared_dir(home)?;
    runner.shared_dir(&home.join("tls"))?;
    make_dir(&home.join("operators"), 0o700)?;
    let coordinator_path = home.join(COORDINATOR_CONFIG_FILE);
    let existing = CoordinatorConfig::load(&coordinator_path).ok();
    let ca = LocalCa::open_or_create(&home.join("tls"))?;
    let mut operators = Vec::new();
    for index in 0..3usize {
        // The operator's configuration has the party's own port (the coordinator's may name
        // its delayed link); a home of an older version has only the coordinator's.
        let port = OperatorConfig::load(&operator_config_file(home, index as u8))
            .map(|o| o.party.port)
            .ok()
            .or_else(|| existing.as_ref().map(|c| c.parties[index].port))
            .unwrap_or(base_port + index as u16);
        operators.push(start_local_party(runner, home, index, port, &ca)?);
    }
    let delayed = |port: u16| -> Result<u16> {
        if link_delay_ms == 0 {
            Ok(port)
        } else {
            relay_port(port)
        }
    };
    let mut coordinator_logins = Vec::new();
    for operator in &mut operators {
        let index = usize::from(operator.index);
        let password = party_password(home, index, COORDINATOR_ROLE)?;
        let key = provision(operator, &password).await?;
        if let Some(previous) = existing.as_ref().map(|c| &c.parties[index]) {
            if !previous.public_key.is_empty() && previous.public_key != key {
                bail!(
                    "P{index} reports key {key}, but {} pins {}: refusing to continue",
                    coordinator_path.display(),
                    previous.public_key
                );
            }
        }
        operator.public_key = key.clone();
        coordinator_logins.push(local_party(
            index,
            delayed(operator.port)?,
            COORDINATOR_ROLE,
            password,
            &key,
            &ca.cert_path(),
        ));
    }
    pin_peers(&operators).await?;
    let mut operator_configs = Vec::new();
    for operator in &operators {
        let signing_key = home
            .join("operators")
            .join(format!("p{}.signing.key", operator.index));
        set_operator_key(operator, &signing_key).await?;
        let config = OperatorConfig {
            party: operator.clone(),
            signing_key,
        };
        config.save(&operator_config_file(home, operator.index))?;
        operator_configs.push(config);
    }
    register_local_client(home, &operator_configs, client_auth).await?;
    let identities = export_identities(home, &operator_configs, &ca).await?;
    let api_keys = home.join(API_KEYS_FILE);
    let api_token = api_credentials(home, config_path, &api_keys)?;
    let api_cert = ca.server_cert(
        &home.join("tls"),
        "coordinator",
        &["127.0.0.1", "localhost"],
    )?;
    let coordinator = CoordinatorConfig {
        listen: existing.as_ref().map_or_else(
            || format!("127.0.0.1:{coordinator_port}"),
            |c| c.listen.clone(),
        ),
        tls_cert: Some(api_cert.cert.clone()),
        tls_key: Some(api_cert.key.clone()),
        api_keys: Some(api_keys.clone()),
        parties: coordinator_logins,
    };
    coordinator.save(&coordinator_path)?;
    give_coordinator_files(
        runner,
        &[&coordinator_path, &api_keys, &api_cert.cert, &api_cert.key],
    )?;
    let coordinator_url = format!("https://{}", coordinator.listen);
    let listen: std::net::SocketAddr = coordinator
        .listen
        .parse()
        .with_context(|| format!("the coordinator's address {}", coordinator.listen))?;
    let front_door_url = format!(
        "https://{}",
        std::net::SocketAddr::new(listen.ip(), delayed(listen.port())?)
    );
    if link_delay_ms > 0 {
        let loopback = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut links = Vec::new();
        for operator in &operators {
            links.push(Link {
                listen: loopback(delayed(operator.port)?),
                target: loopback(operator.port).to_string(),
            });
        }
        links.push(Link {
            listen: loopback(delayed(listen.port())?),
            target: listen.to_string(),
        });
        start_relay(runner, home, &links, link_delay_ms).await?;
    }
    crate::files::write_private(&home.join(LINK_DELAY_FILE), &link_delay_ms.to_string())?;
    for index in 0..3usize {
        if ensure_front_door(runner, home, index, &ca, &front_door_url)? {
            runner.run(
                "pg_ctl",
                &["reload", "-D", &data_dir(home, index).display().to_string()],
            )?;
        }
    }
    // The client keeps what it pinned before (a pinned Paillier service provider, the parties'
    // identities: a party whose identity changed is refused, as a client would refuse it).
    // A configuration an older version wrote (keys without bundles) is refused by `load`: it
    // is written afresh, keeping only its Paillier service pin.
    let mut config = Config::load(config_path).unwrap_or_else(|_| Config {
        coordinator_url: String::new(),
        ca_cert: None,
        api_token: None,
        party_keys: Vec::new(),
        party_identities: Vec::new(),
        party_signing_keys: Vec::new(),
        paillier_service: std::fs::read_to_string(config_path)
            .ok()
            .and_then(|text| toml::from_str::<Config>(&text).ok())
            .and_then(|c| c.paillier_service),
        client_id: None,
        client_key: None,
    });
    config.coordinator_url = coordinator_url;
    config.ca_cert = Some(ca.cert_path());
    config.api_token = Some(api_token);
    config.client_id = Some(LOCAL_CLIENT_ID.to_owned());
    config.client_key = Some(client_key_file(home));
    for (bundle, fingerprint) in &identities {
        config.pin_identity(bundle, fingerprint, false)?;
    }
    config.save(config_path)?;
    if !coordinator_healthy(&config).await {
        start_coordinator(runner, home, &coordinator_path)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !coordinator_healthy(&config).await {
            if Instant::now() > deadline {
                bail!(
                    "the coordinator did not come up; see {}",
                    home.join("coordinator.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    println!("privmatch cluster is up (home {})", home.display());
    for (operator, (_, fingerprint)) in operators.iter().zip(&identities) {
        let key = operator.pinned_key()?;
        println!(
            "  P{}  127.0.0.1:{}  key fingerprint {}  identity fingerprint {}",
            operator.index,
            operator.port,
            key.fingerprint_hex(),
            fingerprint
        );
    }
    println!("  coordinator  {}", config.coordinator_url());
    if link_delay_ms > 0 {
        println!(
            "  links  coordinator <-> each party delayed by {link_delay_ms} ms each way (relay: {})",
            home.join(format!("{RELAY}.log")).display()
        );
    }
    println!(
        "  client  {LOCAL_CLIENT_ID} (key {}), client-auth policy {} at every party",
        client_key_file(home).display(),
        client_auth.name()
    );
    println!(
        "  configurations: client {}, coordinator {}, operators {}",
        config_path.display(),
        coordinator_path.display(),
        home.join("operators").display()
    );
    Ok(())
}

async fn status(home: &Path, config_path: &Path, runner: &Runner) -> Result<()> {
    let config = Config::load(config_path)?;
    for index in 0..3 {
        println!(
            "P{index}: {}",
            if is_running(runner, home, index) {
                "running"
            } else {
                "stopped"
            }
        );
    }
    if !coordinator_healthy(&config).await {
        println!("coordinator: not running");
        return Ok(());
    }
    println!("coordinator: running at {}", config.coordinator_url());
    let statuses: Vec<PartyStatus> = Coordinator::new(&config).get("/v1/status").await?;
    for s in statuses {
        match (s.iris_records, s.error) {
            (Some(records), _) => println!(
                "  P{}: {records} iris records, {} prepared transaction(s) in doubt, fingerprint {}",
                s.party,
                s.prepared_transactions.unwrap_or(0),
                s.fingerprint.unwrap_or_default()
            ),
            (None, error) => println!("  P{}: unreachable: {}", s.party, error.unwrap_or_default()),
        }
    }
    Ok(())
}

/// Deletes everything `up` made in `home`: the parties (data, keys, certificates, logs), the
/// operators' keys and bundles, the CA and the coordinator's key (`tls/`: the next `up` makes
/// a new CA), the client's signing key, the credentials, passwords, configurations and logs.
fn purge_home(home: &Path) -> Result<()> {
    for dir in [
        party_dir(home, 0),
        party_dir(home, 1),
        party_dir(home, 2),
        home.join("operators"),
        home.join("tls"),
    ] {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot delete {}", dir.display()))?;
        }
    }
    let mut files = vec![
        home.join("coordinator.log"),
        home.join("coordinator.pid"),
        home.join(format!("{RELAY}.log")),
        home.join(format!("{RELAY}.pid")),
        home.join(LINK_DELAY_FILE),
        home.join(API_KEYS_FILE),
        home.join(format!("{API_KEYS_FILE}.tmp")),
        home.join(CONFIG_FILE),
        home.join(format!("{CONFIG_FILE}.tmp")),
        home.join(COORDINATOR_CONFIG_FILE),
        home.join(format!("{COORDINATOR_CONFIG_FILE}.tmp")),
        client_key_file(home),
        public_key_path(&client_key_file(home)),
    ];
    for index in 0..3 {
        files.push(home.join(password_file(index, OPERATOR_ROLE)));
        files.push(home.join(password_file(index, COORDINATOR_ROLE)));
    }
    for file in files {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot delete {}", file.display())),
        }
    }
    // The home itself stays (empty, or with files the user put there, which are theirs).
    Ok(())
}

/// Runs a `privmatch cluster` action.
pub async fn run(action: &ClusterAction, home: &Path, config_path: &Path) -> Result<()> {
    match action {
        ClusterAction::Up {
            base_port,
            coordinator_port,
            run_as,
            pg_bin,
            client_auth,
            link_delay_ms,
        } => {
            let policy =
                ClientAuthPolicy::parse(client_auth).map_err(|e| anyhow::anyhow!("{e}"))?;
            let runner = Runner::new(pg_bin.clone(), run_as)?;
            up(
                home,
                config_path,
                *base_port,
                *coordinator_port,
                &runner,
                policy,
                *link_delay_ms,
            )
            .await
        }
        ClusterAction::DelayProxy { links, one_way_ms } => {
            delay::serve(links, Duration::from_millis(*one_way_ms)).await
        }
        ClusterAction::Down { purge } => {
            stop_detached(home, "coordinator");
            stop_detached(home, RELAY);
            let runner = Runner::new(None, "postgres")?;
            for index in 0..3 {
                if data_dir(home, index).exists() {
                    stop_party(&runner, home, index)?;
                }
            }
            if *purge {
                purge_home(home)?;
                println!("privmatch cluster stopped and purged ({})", home.display());
            } else {
                println!("privmatch cluster stopped; data kept in {}", home.display());
            }
            Ok(())
        }
        ClusterAction::Status => {
            let runner = Runner::new(None, "postgres")?;
            status(home, config_path, &runner).await
        }
    }
}
