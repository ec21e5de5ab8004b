//! `privmatch`: the coordinator service and the command-line client.
//!
//! * `privmatch cluster up|down|status` — three local parties (PostgreSQL clusters with the
//!   extension) and the coordinator, for development and demos.
//! * `privmatch coordinator serve` — the coordinator's HTTP API.
//! * `privmatch iris enroll|search|delete|synth` — client side: templates and probes are
//!   secret-shared and sealed here, so the coordinator only ever relays ciphertext.
//!   `iris enroll --if-unique` enrolls only templates that match no enrolled one.
//! * `privmatch face configure|dealer|enroll|delete|verify|identify|seal|synth` — face
//!   templates with Funshade: P0 and P1 evaluate, P2 deals single-use keys; embeddings are
//!   quantised, shared and sealed here.
//! * `privmatch device keygen|pin-service|enroll|respond|list|delete` and `privmatch terminal
//!   verify` — device-held face templates (packed Paillier): the device's key and enrolment,
//!   its side of matching sessions, and the terminal's (exit status 0 match, 2 no match,
//!   3 refused).
//! * `privmatch party pin` — a party's operator pins a peer's key through the coordinator,
//!   signed with the operator's key; `privmatch party identity-export` — the operator's
//!   signed identity bundle for clients.
//! * `privmatch client pin|pins` — the client pins a party's key from its operator's bundle,
//!   after comparing the fingerprint given out of band; `privmatch client keygen` — a client's
//!   signing key; `privmatch client register|revoke|budgets` and `privmatch client-auth policy
//!   show|set` — a party's operator manages the registered clients (signed commands).
//! * `privmatch recover` — finish distributed transactions a crash left in doubt.
//! * `privmatch bench enroll|iris|face` — the bulk-enrolment, search and face benchmarks.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use privmatch_coordinator::cli::recover;
use privmatch_coordinator::dev::{bench, cluster, LocalConfigs};
use privmatch_coordinator::server::state::ServeOptions;
use privmatch_coordinator::{config, face, iris, paillier, server};

#[derive(Parser)]
#[command(
    name = "privmatch",
    version,
    about = "Secret-shared biometric matching across three parties"
)]
struct Cli {
    /// Home directory of a local cluster (default: $PRIVMATCH_HOME, /var/lib/privmatch for root,
    /// ~/.local/share/privmatch otherwise).
    #[arg(long, global = true)]
    home: Option<PathBuf>,
    /// The client's configuration file (default: HOME/privmatch.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Three local parties and a coordinator on this machine.
    Cluster {
        #[command(subcommand)]
        action: cluster::ClusterAction,
    },
    /// The coordinator service.
    Coordinator {
        #[command(subcommand)]
        action: CoordinatorAction,
    },
    /// Iris templates: enrol, delete, synthesise.
    Iris {
        #[command(subcommand)]
        action: iris::cli::IrisAction,
    },
    /// Face templates (Funshade): configure the dealer, enrol, verify, identify.
    Face {
        #[command(subcommand)]
        action: face::cli::FaceAction,
    },
    /// A user's device holding its face template encrypted under its own Paillier key
    /// (packed Paillier): key, enrolment, answering matching sessions.
    Device {
        #[command(subcommand)]
        action: paillier::cli::DeviceAction,
    },
    /// A terminal matching a live capture against a device's template (packed Paillier).
    Terminal {
        #[command(subcommand)]
        action: paillier::cli::TerminalAction,
    },
    /// A party's security state, changed by its operator through the coordinator (signed).
    Party {
        #[command(subcommand)]
        action: privmatch_coordinator::cli::party::PartyAction,
    },
    /// The client's pins of the parties' identities (from bundles their operators exported),
    /// its signing key, and the operators' registration of clients at their parties.
    Client {
        #[command(subcommand)]
        action: privmatch_coordinator::cli::client_auth::ClientCommand,
    },
    /// A party's client-auth policy: whether sealed inputs must be signed by a registered
    /// client (set by the party's operator, signed).
    ClientAuth {
        #[command(subcommand)]
        action: privmatch_coordinator::cli::client_auth::ClientAuthAction,
    },
    /// A party operator's own commands at its party: initialise it, pin peers (key ceremony),
    /// show its identity, make its TLS certificate.
    Operator {
        #[command(subcommand)]
        action: privmatch_coordinator::cli::operator::OperatorAction,
    },
    /// Finish distributed transactions left in doubt by a crash (also runs automatically in the
    /// coordinator every few seconds).
    Recover,
    /// Benchmarks (programs that print figures, not tests).
    Bench {
        #[command(subcommand)]
        action: bench::BenchAction,
    },
}

#[derive(Subcommand)]
enum CoordinatorAction {
    /// Serve the HTTP API in the foreground.
    Serve {
        /// The coordinator's configuration (default: HOME/coordinator.toml).
        #[arg(long)]
        coordinator_config: Option<PathBuf>,
        /// Per-call timeout of the parties' search functions, in seconds.
        #[arg(long, env = "PRIVMATCH_SEARCH_TIMEOUT", default_value_t = 60.0)]
        search_timeout: f64,
        /// Largest request body in bytes; larger requests are refused with 413.
        #[arg(long, default_value_t = privmatch_coordinator::server::state::MAX_BODY_BYTES)]
        max_body_bytes: usize,
        /// API requests served at once; more are refused with 429 (retry shortly).
        #[arg(long, env = "PRIVMATCH_MAX_IN_FLIGHT", default_value_t = privmatch_coordinator::server::state::MAX_IN_FLIGHT)]
        max_in_flight: usize,
        /// Most iris searches run as one batch (1: every search alone). A batch also holds
        /// at most 2^24 comparisons at a party (fewer searches over a large template set).
        #[arg(long, env = "PRIVMATCH_BATCH_MAX", default_value_t = 32)]
        batch_max: usize,
        /// Longest an iris search waits for others to join its batch while another batch of
        /// its kind runs, in milliseconds (a search that finds none running leaves at once).
        #[arg(long, env = "PRIVMATCH_BATCH_WINDOW_MS", default_value_t = 5)]
        batch_window_ms: u64,
        /// Batches of one kind (eye, mode, rotation range) running at once.
        #[arg(long, env = "PRIVMATCH_BATCH_IN_FLIGHT", default_value_t = 8)]
        batch_in_flight: usize,
    },
    /// Configure the coordinator of a deployment (HOME/coordinator.toml, its TLS certificate)
    /// from what the parties' operators handed over.
    Init(privmatch_coordinator::cli::deploy::InitArgs),
    /// Add an API credential (printed once); restart the coordinator to accept it.
    Credential(privmatch_coordinator::cli::deploy::CredentialArgs),
}

impl Cli {
    fn home(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(config::default_home)
    }

    fn config_path(&self) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| self.home().join(config::CONFIG_FILE))
    }

    fn load_config(&self) -> Result<config::Config> {
        config::Config::load(&self.config_path())
    }
}

async fn run(cli: Cli) -> Result<()> {
    match &cli.command {
        Command::Cluster { action } => cluster::run(action, &cli.home(), &cli.config_path()).await,
        Command::Coordinator {
            action:
                CoordinatorAction::Serve {
                    coordinator_config,
                    search_timeout,
                    max_body_bytes,
                    max_in_flight,
                    batch_max,
                    batch_window_ms,
                    batch_in_flight,
                },
        } => {
            if !(search_timeout.is_finite() && *search_timeout > 0.0) {
                anyhow::bail!("--search-timeout must be a positive number of seconds");
            }
            if !(1..=privmatch_core::iris::service::MAX_BATCH_PROBES).contains(batch_max) {
                anyhow::bail!(
                    "--batch-max must be 1 to {}",
                    privmatch_core::iris::service::MAX_BATCH_PROBES
                );
            }
            if *batch_in_flight == 0 {
                anyhow::bail!("--batch-in-flight must be at least 1");
            }
            let options = ServeOptions {
                search_timeout: std::time::Duration::from_secs_f64(*search_timeout),
                max_body_bytes: *max_body_bytes,
                max_in_flight: *max_in_flight,
                iris_batches: privmatch_coordinator::session::batcher::BatchPolicy {
                    max_items: *batch_max,
                    window: std::time::Duration::from_millis(*batch_window_ms),
                    in_flight: *batch_in_flight,
                    ..Default::default()
                },
            };
            let path = coordinator_config
                .clone()
                .unwrap_or_else(|| cli.home().join(config::COORDINATOR_CONFIG_FILE));
            server::serve(config::CoordinatorConfig::load(&path)?, options).await
        }
        Command::Coordinator {
            action: CoordinatorAction::Init(args),
        } => privmatch_coordinator::cli::deploy::init(&cli.home(), args),
        Command::Coordinator {
            action: CoordinatorAction::Credential(args),
        } => privmatch_coordinator::cli::deploy::credential(&cli.home(), args),
        Command::Iris { action } => iris::cli::run(action, || cli.load_config()).await,
        Command::Face { action } => face::cli::run(action, &cli.home(), || cli.load_config()).await,
        Command::Device { action } => {
            paillier::cli::run_device(action, &cli.config_path(), || cli.load_config()).await
        }
        Command::Terminal { action } => {
            let code = paillier::cli::run_terminal(action, || cli.load_config()).await?;
            if code != 0 {
                // The verdict is printed; the status tells no match (2) from refused (3).
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Party { action } => {
            privmatch_coordinator::cli::party::run(action, &cli.home(), || cli.load_config()).await
        }
        Command::Client { action } => {
            privmatch_coordinator::cli::client_auth::run_client(action, &cli.config_path(), || {
                cli.load_config()
            })
            .await
        }
        Command::ClientAuth { action } => {
            privmatch_coordinator::cli::client_auth::run_client_auth(action, || cli.load_config())
                .await
        }
        Command::Operator { action } => privmatch_coordinator::cli::operator::run(action).await,
        Command::Recover => recover::run(&cli.load_config()?).await,
        Command::Bench { action } => {
            bench::run(action, || {
                LocalConfigs::load(&cli.home(), &cli.config_path())
            })
            .await
        }
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PRIVMATCH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: the coordinator's log file and a captured standard
        // error hold plain text (grep for a session id finds it whole).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    use privmatch_core::algebra::montgomery::{ifma_switch_says_off, switch_ifma_off, IFMA_SWITCH};
    if std::env::var(IFMA_SWITCH).is_ok_and(|v| ifma_switch_says_off(&v)) {
        switch_ifma_off();
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(err) = runtime.block_on(run(cli)) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
