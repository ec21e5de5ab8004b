//! Registered clients (issue 34 item 4; core's `crypto::client_auth`; docs/deployment.md):
//! the client's side and the operators' commands that manage clients at a party.
//!
//! * `privmatch client keygen --out F`: a client's Ed25519 signing key (F, 0600, never
//!   overwritten) and its public key (F.pub, 64 hex digits), which the client hands to each
//!   party's operator.
//! * `privmatch client register --id NAME --public-key F|HEX [--per-hour N] [--replace]`,
//!   `privmatch client revoke --id NAME`, `privmatch client-auth policy set
//!   required|optional`: operator commands (core's `crypto::sign`, actions
//!   `client-register`, `client-revoke`, `client-auth-policy`) signed with the party's
//!   operator key and sent to that one party, either straight to its database with the
//!   operator's login (`--operator-config`) or relayed by the coordinator (`--party N`,
//!   `POST /v1/clients/configure`, scope admin), which can neither forge nor replay them.
//!   Run each for every party the client talks to.
//! * `privmatch client budgets --operator-config F` and `privmatch client-auth policy show`:
//!   what a party holds.
//! * [`ClientCredential::wrap_for_party`]: how the commands that seal probes sign each sealed
//!   blob for its party and purpose (the credential comes from the configuration's
//!   `client_id` / `client_key` or `PRIVMATCH_CLIENT_ID` / `PRIVMATCH_CLIENT_KEY`:
//!   `cli/keys.rs`, `Sealer`).
//!
//! The coordinator's side of the relay is [`routes`]: `GET /v1/clients/configure` (each
//! party's policy) and `POST /v1/clients/configure` [`ClientCommandBody`].

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::get;
use axum::Json;
use clap::{Args, Subcommand};
use futures::future::join_all;
use privmatch_core::crypto::client_auth::{
    ClientAuthPolicy, ClientId, ClientRegistration, ClientRevocation, CLIENT_AUTH_POLICY_ACTION,
    CLIENT_REGISTER_ACTION, CLIENT_REVOKE_ACTION,
};
use privmatch_core::party::PartyIndex;
use serde::{Deserialize, Serialize};

use crate::cli::client_key::{create_key, parse_public_key, public_key_path};
use crate::cli::http::Coordinator;
use crate::cli::keys::ClientAction;
use crate::cli::operator_key::{self, fresh_counter};
use crate::config::{Config, OperatorConfig};
use crate::parties::column;
use crate::server::auth::Scope;
use crate::server::error::{bad_request, parse_json, party_failure_error, ApiError};
use crate::server::scoped::ScopedRoutes;
use crate::server::state::SharedState;
use privmatch_api::wire::{from_base64, to_base64};

/// Requests per hour per budget kind that `privmatch client register` allows by default.
pub const DEFAULT_PER_HOUR: u32 = 1000;

// --- the operator's commands -------------------------------------------------------------

/// Which party an operator command goes to, and how.
#[derive(Args, Clone, Debug)]
pub struct OperatorTarget {
    /// The party's operator configuration (`privmatch operator init` or `cluster up` wrote
    /// it): the command goes straight to the party with the operator's login, signed with the
    /// configuration's signing key unless --operator-key names another.
    #[arg(long)]
    pub operator_config: Option<PathBuf>,
    /// The party (0, 1 or 2) whose operator signs, when the coordinator relays the command
    /// (without --operator-config).
    #[arg(long)]
    pub party: Option<u8>,
    /// The party's operator signing key file (as `privmatch cluster up` writes it in
    /// HOME/operators/p<party>.signing.key).
    #[arg(long, env = "PRIVMATCH_OPERATOR_KEY")]
    pub operator_key: Option<PathBuf>,
}

/// One operator command about clients, as the coordinator relays it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CommandKind {
    Register,
    Revoke,
    Policy,
}

impl CommandKind {
    fn name(self) -> &'static str {
        match self {
            CommandKind::Register => "register",
            CommandKind::Revoke => "revoke",
            CommandKind::Policy => "policy",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        [
            CommandKind::Register,
            CommandKind::Revoke,
            CommandKind::Policy,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }

    fn action(self) -> &'static str {
        match self {
            CommandKind::Register => CLIENT_REGISTER_ACTION,
            CommandKind::Revoke => CLIENT_REVOKE_ACTION,
            CommandKind::Policy => CLIENT_AUTH_POLICY_ACTION,
        }
    }

    /// The party function that checks and applies the command.
    fn sql(self) -> &'static str {
        match self {
            CommandKind::Register => "SELECT privmatch.client_register($1)",
            CommandKind::Revoke => "SELECT privmatch.client_revoke($1)",
            CommandKind::Policy => "SELECT privmatch.client_auth_set_policy($1)",
        }
    }
}

/// Signs `payload` as command `kind` for the party `target` names and sends it there;
/// returns the party and its answer (the client id, or the policy now).
async fn send(
    config: &dyn Fn() -> Result<Config>,
    target: &OperatorTarget,
    kind: CommandKind,
    payload: &[u8],
) -> Result<(u8, String)> {
    if let Some(path) = &target.operator_config {
        let operator = OperatorConfig::load(path)?;
        let index = operator.party.index;
        if target.party.is_some_and(|p| p != index) {
            bail!(
                "--party {} but {} is P{index}'s operator configuration",
                target.party.unwrap_or_default(),
                path.display()
            );
        }
        let key_path = target
            .operator_key
            .as_ref()
            .unwrap_or(&operator.signing_key);
        let answer = send_direct(&operator, key_path, kind, payload).await?;
        return Ok((index, answer));
    }
    let Some(index) = target.party else {
        bail!("name the party: --operator-config F (straight to it) or --party N (through the coordinator)");
    };
    let party = PartyIndex::new(i64::from(index)).context("--party must be 0, 1 or 2")?;
    let Some(key_path) = &target.operator_key else {
        bail!("--operator-key: the signing key of P{index}'s operator");
    };
    let signer = operator_key::load(key_path)?;
    let command = signer.sign(party, fresh_counter(), kind.action(), payload);
    let body = ClientCommandBody {
        party: index,
        action: kind.name().to_owned(),
        command: to_base64(&command),
    };
    let answer: ClientCommandResponse = Coordinator::new(&config()?)
        .post("/v1/clients/configure", &body)
        .await?;
    Ok((answer.party, answer.result))
}

/// Signs `payload` as command `kind` with the operator key in `key_path` and sends it
/// straight to `operator`'s party with the operator's login; the party's answer.
async fn send_direct(
    operator: &OperatorConfig,
    key_path: &Path,
    kind: CommandKind,
    payload: &[u8],
) -> Result<String> {
    let index = operator.party.index;
    let signer = operator_key::load(key_path)?;
    let party = PartyIndex::new(i64::from(index)).context("the configuration's party")?;
    let command = signer.sign(party, fresh_counter(), kind.action(), payload);
    let client = crate::parties::open(&operator.party)
        .await
        .with_context(|| format!("connecting to P{index} as its operator"))?;
    let row = client
        .query_one(kind.sql(), &[&command])
        .await
        .map_err(|e| anyhow::anyhow!("P{index}: {}", pg_message(&e)))?;
    Ok(row.get(0))
}

/// As `operator`'s party's operator (its configuration's signing key), registers a client
/// at that party: what `privmatch client register --operator-config F` does. Returns the
/// client id the party registered.
pub async fn register_as_operator(
    operator: &OperatorConfig,
    registration: &ClientRegistration,
) -> Result<String> {
    send_direct(
        operator,
        &operator.signing_key,
        CommandKind::Register,
        &registration.encode(),
    )
    .await
}

/// As `operator`'s party's operator, sets that party's client-auth policy: what `privmatch
/// client-auth policy set P --operator-config F` does. Returns the policy now.
pub async fn set_policy_as_operator(
    operator: &OperatorConfig,
    policy: ClientAuthPolicy,
) -> Result<String> {
    send_direct(
        operator,
        &operator.signing_key,
        CommandKind::Policy,
        &policy.encode(),
    )
    .await
}

/// A party's error with its SQLSTATE, or the connection error.
fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} [SQLSTATE {}]", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// `privmatch client …`: the pins of the parties' identities ([`ClientAction`]) and the
/// registered-client commands.
#[derive(Subcommand)]
pub enum ClientCommand {
    /// The client's pins.
    #[command(flatten)]
    Pins(ClientAction),
    /// Make a client signing key: F (0600, never overwritten) and its public key F.pub, which
    /// you give each party's operator to register (`privmatch client register`).
    Keygen {
        /// The key file to create.
        #[arg(long)]
        out: PathBuf,
    },
    /// As a party's operator: register a client's public key at the party (or change its
    /// budget), signed with the operator's key. Run it for each party.
    Register {
        /// The client id (1 to 64 ASCII letters, digits, '.', '_', '-', '@').
        #[arg(long)]
        id: String,
        /// The client's public key: 64 hex digits, or the file `privmatch client keygen`
        /// wrote beside the key (F.pub).
        #[arg(long)]
        public_key: String,
        /// Requests the client may make per hour of each budget kind at this party, on top
        /// of the party-wide budgets (0: none).
        #[arg(long, default_value_t = DEFAULT_PER_HOUR)]
        per_hour: u32,
        /// Replace the key of a client registered before, or reinstate a revoked one.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        target: OperatorTarget,
    },
    /// As a party's operator: revoke a client at the party (its inputs are refused from now
    /// on), signed with the operator's key. Run it for each party.
    Revoke {
        /// The client id.
        #[arg(long)]
        id: String,
        #[command(flatten)]
        target: OperatorTarget,
    },
    /// As a party's operator: the registered clients and their budgets at the party (JSON
    /// lines), read with the operator's login.
    Budgets {
        /// The party's operator configuration.
        #[arg(long)]
        operator_config: PathBuf,
    },
}

/// `privmatch client-auth …`.
#[derive(Subcommand)]
pub enum ClientAuthAction {
    /// Whether a party requires every sealed input to be signed by a registered client.
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
}

/// `privmatch client-auth policy …`.
#[derive(Subcommand)]
pub enum PolicyAction {
    /// Show each party's policy (through the coordinator), or one party's with
    /// --operator-config.
    Show {
        /// Ask this party directly with its operator's login.
        #[arg(long)]
        operator_config: Option<PathBuf>,
    },
    /// As a party's operator: set its policy, signed with the operator's key. `required`
    /// refuses unsigned sealed inputs: register the clients first. Run it for each party.
    Set {
        /// `optional` (unsigned inputs accepted; the install default) or `required`.
        #[arg(value_parser = ["optional", "required"])]
        policy: String,
        #[command(flatten)]
        target: OperatorTarget,
    },
}

/// One client's budget of one kind at a party, as `privmatch client budgets` prints it.
#[derive(Serialize, Debug)]
struct BudgetLine {
    client_id: String,
    public_key: String,
    per_hour: i32,
    revoked: bool,
    kind: String,
    used_this_hour: i32,
}

/// Runs `privmatch client …` (`config_path`: the client configuration the pins live in;
/// `config`: loads it, for commands the coordinator relays).
pub async fn run_client(
    action: &ClientCommand,
    config_path: &Path,
    config: impl Fn() -> Result<Config>,
) -> Result<()> {
    match action {
        ClientCommand::Pins(action) => crate::cli::keys::run(action, config_path),
        ClientCommand::Keygen { out } => {
            let public = create_key(out)?;
            eprintln!(
                "client key in {} (keep it secret); public key in {}",
                out.display(),
                public_key_path(out).display()
            );
            println!("{}", public.to_hex());
            Ok(())
        }
        ClientCommand::Register {
            id,
            public_key,
            per_hour,
            replace,
            target,
        } => {
            let registration = ClientRegistration {
                client: ClientId::new(id).context("--id")?,
                key: parse_public_key(public_key)?,
                per_hour: *per_hour,
                replace: *replace,
            };
            if *per_hour > privmatch_core::crypto::client_auth::MAX_PER_HOUR {
                bail!("--per-hour must be at most 2147483647");
            }
            let (party, client) = send(
                &config,
                target,
                CommandKind::Register,
                &registration.encode(),
            )
            .await?;
            println!(
                "P{party}: client {client} registered ({per_hour} requests per hour per kind)"
            );
            Ok(())
        }
        ClientCommand::Revoke { id, target } => {
            let revocation = ClientRevocation {
                client: ClientId::new(id).context("--id")?,
            };
            let (party, client) =
                send(&config, target, CommandKind::Revoke, &revocation.encode()).await?;
            println!("P{party}: client {client} revoked");
            Ok(())
        }
        ClientCommand::Budgets { operator_config } => {
            let operator = OperatorConfig::load(operator_config)?;
            let index = operator.party.index;
            let client = crate::parties::open(&operator.party)
                .await
                .with_context(|| format!("connecting to P{index} as its operator"))?;
            let rows = client
                .query(
                    "SELECT client_id, public_key, per_hour, revoked, kind, used_this_hour \
                       FROM privmatch.client_budgets()",
                    &[],
                )
                .await
                .map_err(|e| anyhow::anyhow!("P{index}: {}", pg_message(&e)))?;
            for row in rows {
                let line = BudgetLine {
                    client_id: row.get(0),
                    public_key: row.get(1),
                    per_hour: row.get(2),
                    revoked: row.get(3),
                    kind: row.get(4),
                    used_this_hour: row.get(5),
                };
                println!("{}", serde_json::to_string(&line)?);
            }
            Ok(())
        }
    }
}

/// Runs `privmatch client-auth …`.
pub async fn run_client_auth(
    action: &ClientAuthAction,
    config: impl Fn() -> Result<Config>,
) -> Result<()> {
    let ClientAuthAction::Policy { action } = action;
    match action {
        PolicyAction::Show {
            operator_config: Some(path),
        } => {
            let operator = OperatorConfig::load(path)?;
            let index = operator.party.index;
            let client = crate::parties::open(&operator.party)
                .await
                .with_context(|| format!("connecting to P{index} as its operator"))?;
            let row = client
                .query_one("SELECT privmatch.client_auth_policy()", &[])
                .await
                .map_err(|e| anyhow::anyhow!("P{index}: {}", pg_message(&e)))?;
            let policy: String = row.get(0);
            println!("P{index}: client-auth policy {policy}");
        }
        PolicyAction::Show {
            operator_config: None,
        } => {
            let answer: PoliciesResponse = Coordinator::new(&config()?)
                .get("/v1/clients/configure")
                .await?;
            for (i, policy) in answer.parties.iter().enumerate() {
                println!("P{i}: client-auth policy {policy}");
            }
        }
        PolicyAction::Set { policy, target } => {
            let policy = ClientAuthPolicy::parse(policy).map_err(|e| anyhow::anyhow!("{e}"))?;
            let (party, now) = send(&config, target, CommandKind::Policy, &policy.encode()).await?;
            println!("P{party}: client-auth policy {now}");
        }
    }
    Ok(())
}

// --- the coordinator's relay -------------------------------------------------------------

/// The body of `POST /v1/clients/configure`: an operator command about clients signed by the
/// operator of party `party` (base64 of core's operator command), relayed to that party.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientCommandBody {
    /// The party whose operator signed (0, 1 or 2).
    pub party: u8,
    /// `register`, `revoke` or `policy`: which party function checks and applies it.
    pub action: String,
    /// The signed command (base64).
    pub command: String,
}

/// The answer to `POST /v1/clients/configure`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientCommandResponse {
    /// The party.
    pub party: u8,
    /// Its answer: the client id registered or revoked, or the policy now.
    pub result: String,
}

/// The answer to `GET /v1/clients/configure`: each party's client-auth policy, by index.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PoliciesResponse {
    /// 'optional' or 'required' at P0, P1, P2.
    pub parties: Vec<String>,
}

/// The coordinator's routes of registered clients (scope admin: the action `configure`);
/// merged into the API by `crate::server::routes::app`.
pub fn routes() -> ScopedRoutes<SharedState> {
    ScopedRoutes::new().route(
        "/v1/clients/configure",
        Scope::Admin,
        get(policies).post(relay),
    )
}

/// `GET /v1/clients/configure`: each party's client-auth policy.
async fn policies(State(state): State<SharedState>) -> Result<Json<PoliciesResponse>, ApiError> {
    let answers = join_all(state.parties.all().iter().map(|p| async move {
        let row = p
            .query_one("SELECT privmatch.client_auth_policy()", &[])
            .await?;
        column::<String>(p.index, &row, 0).map(Option::unwrap_or_default)
    }))
    .await;
    let mut parties = Vec::with_capacity(3);
    for answer in answers {
        parties.push(answer.map_err(|e| {
            party_failure_error(format!("reading the client-auth policy: {e}"), &e)
        })?);
    }
    Ok(Json(PoliciesResponse { parties }))
}

/// `POST /v1/clients/configure`: relays a signed command about clients to its party, which
/// checks the operator's signature, the party, the action and the counter.
async fn relay(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<ClientCommandResponse>, ApiError> {
    let request: ClientCommandBody = parse_json(&body)?;
    let kind = CommandKind::parse(&request.action).ok_or_else(|| {
        bad_request(format!(
            "action must be register, revoke or policy, not {:?}",
            request.action
        ))
    })?;
    let command = from_base64(&request.command, "command").map_err(bad_request)?;
    let party = state
        .parties
        .all()
        .get(usize::from(request.party))
        .ok_or_else(|| bad_request(format!("party must be 0, 1 or 2, not {}", request.party)))?;
    let row = party
        .query_one(kind.sql(), &[&command])
        .await
        .map_err(|e| party_failure_error(format!("client command {}: {e}", kind.name()), &e))?;
    let result: String = row.get(0);
    tracing::info!(
        party = request.party,
        action = kind.name(),
        "client command relayed and accepted"
    );
    Ok(Json(ClientCommandResponse {
        party: request.party,
        result,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::client_key::{load_key, wrap_for_party, ClientCredential};
    use privmatch_core::crypto::client_auth::ClientSigningKey;

    #[test]
    fn keys_are_created_once_and_public_keys_parse_from_hex_or_file() {
        let dir = std::env::temp_dir().join(format!("pm-client-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("kiosk.key");
        let public = create_key(&path).expect("create");
        assert!(
            create_key(&path).is_err(),
            "an existing key is never overwritten"
        );
        let key = load_key(&path).expect("load");
        assert_eq!(key.verifying_key(), public);
        let pub_path = public_key_path(&path);
        assert_eq!(
            parse_public_key(&pub_path.display().to_string()).expect("file"),
            public
        );
        assert_eq!(parse_public_key(&public.to_hex()).expect("hex"), public);
        assert!(parse_public_key("not a key").is_err());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(load_key(&path).is_err(), "a key others may read is refused");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_credential_wraps_for_its_party_and_purpose() {
        let key = ClientSigningKey::from_bytes(&[5; 32]);
        let public = key.verifying_key();
        let credential = ClientCredential::new(ClientId::new("kiosk").expect("id"), key);
        let p1 = PartyIndex::ALL[1];
        let blob = wrap_for_party(Some(&credential), p1, "iris-probe", b"sealed".to_vec());
        let (auth, inner) = privmatch_core::crypto::client_auth::unwrap(&blob).expect("parses");
        assert_eq!(inner, b"sealed");
        let auth = auth.expect("signed");
        assert_eq!(auth.client.as_str(), "kiosk");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        assert!(auth.verify(&public, p1, "iris-probe", inner, now).is_ok());
        assert_eq!(wrap_for_party(None, p1, "iris-probe", b"x".to_vec()), b"x");
    }

    #[test]
    fn relayed_command_kinds_round_trip() {
        for kind in [
            CommandKind::Register,
            CommandKind::Revoke,
            CommandKind::Policy,
        ] {
            assert_eq!(CommandKind::parse(kind.name()), Some(kind));
        }
        assert_eq!(CommandKind::parse("peer-pin"), None);
    }
}
