//! Registered clients at this party (issue 34 item 4; docs/trust-model.md §4a, §5): the
//! clients whose signatures this party accepts on sealed inputs (core's
//! `crypto::client_auth`), the nonces it accepted, its per-client query budgets and its
//! client-auth policy. Tables: `privmatch.registered_clients`, `privmatch.client_nonces`,
//! `privmatch.client_budget_use`, `privmatch.client_auth_policy` (`sql/clients.sql`), written
//! only by the functions here.
//!
//! Every change comes from this party's operator as an operator command
//! ([`crate::operator::accept_command`]): `client_register`, `client_revoke`,
//! `client_auth_set_policy`, which the coordinator may relay but cannot forge, alter,
//! redirect or replay. Every modality admits its sealed inputs through one entry point,
//! [`admit`]: it verifies a signed input against the registered key, refuses an unsigned one
//! under the policy `required`, refuses a replayed nonce, charges the client's budget, and
//! hands back the sealed blob inside. `client_auth_check` lets an operator or a client check
//! a client's setup at this party.
//!
//! Imports: [`crate::errors`], [`crate::identity`], [`crate::operator`] and [`crate::budget`]
//! only (no modality): a new modality calls [`admit`] and needs no edit here.

use pgrx::prelude::*;
use privmatch_core::crypto::client_auth::{
    self, ClientAuthError, ClientAuthPolicy, ClientId, ClientRegistration, ClientRevocation,
    ClientVerifyingKey, CLIENT_AUTH_POLICY_ACTION, CLIENT_REGISTER_ACTION, CLIENT_REVOKE_ACTION,
};
use privmatch_core::party::PartyIndex;

use crate::budget::BudgetKind;
use crate::errors::{get_one, modify, raise, run, select};
use crate::identity::load_identity;
use crate::operator::accept_command;

/// A sealed input this party admitted: the client that signed it (`None`: an unsigned input,
/// accepted because the policy is `optional`) and the sealed blob inside, to be opened as
/// before.
#[derive(Debug)]
pub struct Admitted<'a> {
    /// The registered client that signed the input, if it was signed.
    pub client: Option<ClientId>,
    /// The client's budget (requests per hour), if it was signed.
    per_hour: i32,
    /// The sealed blob the client signed (the whole argument for an unsigned input).
    pub inner: &'a [u8],
}

impl Admitted<'_> {
    /// Charges one request of `kind` to the signing client's budget (nothing for an unsigned
    /// input): for inputs whose kind is known only once they are opened (a face probe is a
    /// verification or an identification), admitted with no budget first.
    pub fn charge(&self, function: &str, kind: BudgetKind) {
        if let Some(client) = &self.client {
            charge_client(function, client, self.per_hour, kind);
        }
    }
}

/// The party's clock in seconds since the Unix epoch (an input's expiry is checked against
/// it).
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Raises a refused signed input: 22023 for bytes that are not a well-formed signed input
/// (naming the argument), 28000 for every check of who signed it, for whom and until when.
fn raise_input(function: &str, argument: &str, err: ClientAuthError) -> ! {
    let code = match err {
        ClientAuthError::Malformed(_) | ClientAuthError::BadClientId(_) => {
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE
        }
        ClientAuthError::BadKey
        | ClientAuthError::BadSignature { .. }
        | ClientAuthError::WrongParty { .. }
        | ClientAuthError::WrongPurpose { .. }
        | ClientAuthError::Expired { .. }
        | ClientAuthError::TooLongLived { .. } => {
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION
        }
    };
    raise(
        code,
        format!("{function}: argument {argument}: {err}"),
        None,
    )
}

/// Raises a malformed payload of an operator command (22023).
fn raise_payload(function: &str, err: ClientAuthError) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("{function}: {err}"),
        None,
    )
}

/// This party's client-auth policy, read in the caller's transaction (no row: `optional`, the
/// install default).
pub fn current_policy(function: &str) -> ClientAuthPolicy {
    let stored = get_one::<String>(
        function,
        "SELECT (SELECT mode FROM privmatch.client_auth_policy)",
        &[],
    );
    match stored {
        None => ClientAuthPolicy::Optional,
        Some(name) => ClientAuthPolicy::parse(&name).unwrap_or_else(|_| {
            raise(
                PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                format!("{function}: privmatch.client_auth_policy holds an invalid policy"),
                None,
            )
        }),
    }
}

/// A registered client as this party holds it.
struct Registered {
    key: ClientVerifyingKey,
    per_hour: i32,
}

/// The registered, unrevoked client `client` of an input `function` received as `argument`;
/// 28000 naming the client when it is unknown or revoked.
fn registered(function: &str, argument: &str, me: PartyIndex, client: &ClientId) -> Registered {
    let rows = select(
        function,
        "SELECT public_key, per_hour, revoked_at IS NOT NULL \
           FROM privmatch.registered_clients WHERE client_id = $1",
        &[client.as_str().into()],
        |row| (row.get::<Vec<u8>>(1), row.get::<i32>(2), row.get::<bool>(3)),
    );
    let Some((key, per_hour, revoked)) = rows.into_iter().next() else {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            format!(
                "{function}: argument {argument} is signed by client {:?}, which is not registered at {me}",
                client.as_str()
            ),
            Some("the party's operator registers it with `privmatch client register`"),
        )
    };
    if revoked.unwrap_or(true) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            format!(
                "{function}: argument {argument} is signed by client {:?}, which was revoked at {me}",
                client.as_str()
            ),
            None,
        );
    }
    let key = key
        .and_then(|k| ClientVerifyingKey::from_bytes(&k).ok())
        .unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                format!(
                    "{function}: the registered key of client {:?} is invalid",
                    client.as_str()
                ),
                None,
            )
        });
    Registered {
        key,
        per_hour: per_hour.unwrap_or(0),
    }
}

/// Records the nonce of `auth`'s input until it could no longer be accepted (28000 when it was
/// accepted before: a replay), in the caller's transaction; sweeps a bounded number of nonces
/// that expired, skipping rows other transactions hold.
fn record_nonce(function: &str, argument: &str, auth: &client_auth::ClientAuth) {
    run(
        function,
        "DELETE FROM privmatch.client_nonces WHERE ctid IN ( \
           SELECT ctid FROM privmatch.client_nonces WHERE keep_until < now() \
            LIMIT 256 FOR UPDATE SKIP LOCKED)",
        &[],
    );
    let keep_until = i64::try_from(auth.keep_until()).unwrap_or(i64::MAX);
    // No row comes back when the nonce is there already.
    let inserted = modify(
        function,
        "INSERT INTO privmatch.client_nonces (client_id, nonce, keep_until) \
         VALUES ($1, $2, to_timestamp($3::float8)) \
         ON CONFLICT (client_id, nonce) DO NOTHING RETURNING true",
        &[
            auth.client.as_str().into(),
            auth.nonce.to_vec().into(),
            keep_until.into(),
        ],
        |row| row.get::<bool>(1),
    );
    if inserted.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            format!(
                "{function}: argument {argument}: the input of client {:?} was accepted before (its nonce was used): replayed",
                auth.client.as_str()
            ),
            Some("a client signs every input afresh"),
        );
    }
}

/// Charges one request of `kind` to client `client`'s budget of this hour (`per_hour` per
/// kind), in the caller's transaction; 53400 naming the client and the kind past it.
fn charge_client(function: &str, client: &ClientId, per_hour: i32, kind: BudgetKind) {
    let used = get_one::<i32>(
        function,
        "INSERT INTO privmatch.client_budget_use AS u (client_id, kind, hour, used) \
         VALUES ($1, $2, date_trunc('hour', now()), 1) \
         ON CONFLICT (client_id, kind, hour) DO UPDATE SET used = u.used + 1 \
         RETURNING used",
        &[client.as_str().into(), kind.name().into()],
    )
    .unwrap_or(i32::MAX);
    if used > per_hour {
        raise(
            PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
            format!(
                "{function}: query budget of client {:?} exhausted: this party answers it {per_hour} {} per hour",
                client.as_str(),
                kind.name()
            ),
            Some("wait for the next hour, or the party's operator raises the client's budget with `privmatch client register --replace --per-hour N`"),
        );
    }
    if used == 1 {
        // The client's first request of this kind in an hour sweeps its earlier hours.
        run(
            function,
            "DELETE FROM privmatch.client_budget_use \
              WHERE client_id = $1 AND kind = $2 AND hour < date_trunc('hour', now())",
            &[client.as_str().into(), kind.name().into()],
        );
    }
}

/// Admits the sealed input `blob` that `function` received as its argument `argument`, for
/// `purpose` (the sealing purpose label, e.g. `"iris-probe"`) at this party `me`; the entry
/// point of every modality, called before the sealed blob is opened.
///
/// * A signed input (core's `crypto::client_auth`) is verified whatever the policy: its
///   client must be registered and not revoked, the signature must verify under its key, the
///   input must be addressed to `me` and `purpose` and unexpired (28000 otherwise, naming the
///   client and what is wrong; 22023 for a malformed one), and its nonce must be new (28000:
///   replayed). With `budget`, one request of that kind is charged to the client's budget
///   (53400 naming the client and the kind past it) — in addition to the party-wide budget,
///   which the modality charges itself (`budget::charge`).
/// * An unsigned input is refused under the policy `required` (28000 naming the function and
///   saying a registered client must sign), and passed through under `optional`.
///
/// Everything is written in the caller's transaction, so it must commit before anything
/// derived from the input leaves the party (as the budgets require, `crate::budget`).
/// Returns the client and the sealed blob inside.
pub fn admit<'a>(
    function: &str,
    argument: &str,
    purpose: &str,
    me: PartyIndex,
    blob: &'a [u8],
    budget: Option<BudgetKind>,
) -> Admitted<'a> {
    admit_checked(function, argument, purpose, me, blob, budget, Nonce::Record)
}

/// Admits a sealed input that is **single use by what it carries** as [`admit`] does —
/// registered, unrevoked client, valid signature for this party and `purpose`, unexpired; an
/// unsigned input refused under the policy `required` — but records no nonce and charges no
/// budget. Two such inputs exist:
/// * an enrolment envelope (`iris_enroll_sealed`, `face_enroll_sealed`): every bundle inside
///   carries a random bundle id that this party consumes when it opens it (`crate::bundles`,
///   `privmatch.consumed_bundles`), in the caller's transaction, so a replayed envelope,
///   signed or not, is refused as before (23505 "already consumed", which the front door
///   documents as "it committed earlier"); a nonce-level refusal would only change that
///   answer and add a nonce row per envelope. An enrolment is no query: no budget applies.
/// * a Paillier terminal input at Round 2: the session was opened with the same bytes (their
///   nonce recorded by [`admit`] then) and allows one Round 2 (23505).
pub fn admit_single_use<'a>(
    function: &str,
    argument: &str,
    purpose: &str,
    me: PartyIndex,
    blob: &'a [u8],
) -> Admitted<'a> {
    admit_checked(
        function,
        argument,
        purpose,
        me,
        blob,
        None,
        Nonce::SingleUseInside,
    )
}

/// Whether [`admit_checked`] records the input's nonce.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nonce {
    /// Recorded (28000 when seen before): probes and every input without an id of its own.
    Record,
    /// Not recorded: the input's contents are consumed as single use where it is opened.
    SingleUseInside,
}

/// [`admit`] and [`admit_single_use`].
fn admit_checked<'a>(
    function: &str,
    argument: &str,
    purpose: &str,
    me: PartyIndex,
    blob: &'a [u8],
    budget: Option<BudgetKind>,
    nonce: Nonce,
) -> Admitted<'a> {
    let (auth, inner) =
        client_auth::unwrap(blob).unwrap_or_else(|e| raise_input(function, argument, e));
    let Some(auth) = auth else {
        if current_policy(function) == ClientAuthPolicy::Required {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
                format!(
                    "{function}: argument {argument} is not signed by a client, and this party's client-auth policy is 'required': a registered client must sign its sealed inputs"
                ),
                Some("sign inputs with --client-key and --client-id; the party's operator registers clients with `privmatch client register`"),
            );
        }
        return Admitted {
            client: None,
            per_hour: 0,
            inner,
        };
    };
    let client = registered(function, argument, me, &auth.client);
    auth.verify(&client.key, me, purpose, inner, now_secs())
        .unwrap_or_else(|e| raise_input(function, argument, e));
    if nonce == Nonce::Record {
        record_nonce(function, argument, &auth);
    }
    if let Some(kind) = budget {
        charge_client(function, &auth.client, client.per_hour, kind);
    }
    Admitted {
        client: Some(auth.client),
        per_hour: client.per_hour,
        inner,
    }
}

/// Checks a client's setup at this party: admits `blob` for `purpose` as every protocol
/// function does ([`admit`]: registered, unrevoked client, valid signature for this party and
/// purpose, unexpired, fresh nonce; an unsigned input under the policy `required` refused)
/// and returns the client id (NULL for an unsigned input the policy `optional` accepts).
/// Nothing is opened and no party-wide budget is charged. The nonce is consumed, so an input
/// checked here can never be used again. With `budget` (a budget kind: 'iris-search',
/// 'face-identify', 'face-verify'), one request of that kind is charged to the client's
/// budget as a real request would be — to check a client's budget setup; it counts.
#[pg_extern(volatile)]
fn client_auth_check(
    purpose: &str,
    blob: &[u8],
    budget: default!(Option<&str>, "NULL"),
) -> Option<String> {
    const F: &str = "client_auth_check";
    let kind = budget.map(|name| {
        BudgetKind::parse(name).unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("{F}: argument budget: unknown budget kind {name:?}"),
                Some("one of 'iris-search', 'face-identify', 'face-verify'"),
            )
        })
    });
    let me = load_identity().index;
    admit(F, "blob", purpose, me, blob, kind)
        .client
        .map(|c| c.as_str().to_owned())
}

/// Registers a client from `command`: an operator command (action `client-register`) signed
/// by this party's operator key, whose payload is core's `ClientRegistration` (client id,
/// Ed25519 public key, requests per hour per budget kind, replace flag), relayed by the
/// coordinator or sent by the operator. A command not signed by the operator, for another
/// party or action, replayed or expired is refused (28000, nothing changed); a malformed
/// payload is 22023; a client registered before with another key, or revoked, is 23505
/// unless the command sets replace (a key rotation, a reinstatement; the same key and
/// another budget needs no flag). Returns the client id.
#[pg_extern(volatile)]
fn client_register(command: &[u8]) -> String {
    const F: &str = "client_register";
    let payload = accept_command(F, CLIENT_REGISTER_ACTION, command);
    let registration = ClientRegistration::decode(&payload).unwrap_or_else(|e| raise_payload(F, e));
    let id = registration.client.as_str();
    let key = registration.key.to_bytes().to_vec();
    let existing = modify(
        F,
        "SELECT public_key, revoked_at IS NOT NULL FROM privmatch.registered_clients \
          WHERE client_id = $1 FOR UPDATE",
        &[id.into()],
        |row| (row.get::<Vec<u8>>(1), row.get::<bool>(2)),
    );
    if let Some((old_key, revoked)) = existing.into_iter().next() {
        let changes_key = old_key.as_deref() != Some(key.as_slice());
        let revoked = revoked.unwrap_or(false);
        if (changes_key || revoked) && !registration.replace {
            let what = if revoked {
                "was revoked"
            } else {
                "is registered with another key"
            };
            raise(
                PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
                format!("{F}: client {id:?} {what} at this party"),
                Some("register it with replace (`privmatch client register --replace`) to change its key or reinstate it"),
            );
        }
    }
    let per_hour = i32::try_from(registration.per_hour).unwrap_or(i32::MAX);
    run(
        F,
        "INSERT INTO privmatch.registered_clients (client_id, public_key, per_hour) \
         VALUES ($1, $2, $3) \
         ON CONFLICT (client_id) DO UPDATE SET \
             registered_at = CASE WHEN registered_clients.public_key = EXCLUDED.public_key \
                                   AND registered_clients.revoked_at IS NULL \
                                  THEN registered_clients.registered_at ELSE now() END, \
             public_key = EXCLUDED.public_key, per_hour = EXCLUDED.per_hour, revoked_at = NULL",
        &[id.into(), key.into(), per_hour.into()],
    );
    id.to_owned()
}

/// Revokes a client from `command`: an operator command (action `client-revoke`) signed by
/// this party's operator key, whose payload is core's `ClientRevocation`. From its commit on,
/// every input signed by the client is refused (28000). Refused like `client_register`'s
/// commands (28000, 22023); P0002 for a client that is not registered. Returns the client id.
#[pg_extern(volatile)]
fn client_revoke(command: &[u8]) -> String {
    const F: &str = "client_revoke";
    let payload = accept_command(F, CLIENT_REVOKE_ACTION, command);
    let revocation = ClientRevocation::decode(&payload).unwrap_or_else(|e| raise_payload(F, e));
    let id = revocation.client.as_str();
    let found = modify(
        F,
        "UPDATE privmatch.registered_clients SET revoked_at = coalesce(revoked_at, now()) \
          WHERE client_id = $1 RETURNING client_id",
        &[id.into()],
        |row| row.get::<String>(1),
    );
    if found.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("{F}: client {id:?} is not registered at this party"),
            None,
        );
    }
    id.to_owned()
}

/// Sets this party's client-auth policy from `command`: an operator command (action
/// `client-auth-policy`) signed by this party's operator key, whose payload is core's
/// `ClientAuthPolicy` ('optional': unsigned inputs accepted, the install default;
/// 'required': every sealed input must be signed by a registered client). Refused like
/// `client_register`'s commands (28000, 22023). Returns the policy now.
#[pg_extern(volatile)]
fn client_auth_set_policy(command: &[u8]) -> String {
    const F: &str = "client_auth_set_policy";
    let payload = accept_command(F, CLIENT_AUTH_POLICY_ACTION, command);
    let policy = ClientAuthPolicy::decode(&payload).unwrap_or_else(|e| raise_payload(F, e));
    run(
        F,
        "INSERT INTO privmatch.client_auth_policy (mode) VALUES ($1) \
         ON CONFLICT (singleton) DO UPDATE SET mode = EXCLUDED.mode, set_at = now()",
        &[policy.name().into()],
    );
    policy.name().to_owned()
}

/// This party's client-auth policy: 'optional' (unsigned inputs accepted) or 'required'.
#[pg_extern(stable, parallel_safe)]
fn client_auth_policy() -> String {
    current_policy("client_auth_policy").name().to_owned()
}

/// The registered clients and their budgets at this party: per client and budget kind, its
/// public key (hex), the requests it may make per hour, whether it is revoked, and what it
/// used this hour. The operator's view (`sql/roles.sql`).
// The row type must be spelled out inline for pgrx's SQL generation.
#[allow(clippy::type_complexity)]
#[pg_extern(stable)]
fn client_budgets() -> TableIterator<
    'static,
    (
        name!(client_id, String),
        name!(public_key, String),
        name!(per_hour, i32),
        name!(revoked, bool),
        name!(kind, String),
        name!(used_this_hour, i32),
    ),
> {
    const F: &str = "client_budgets";
    let rows = select(
        F,
        "SELECT c.client_id, encode(c.public_key, 'hex'), c.per_hour, c.revoked_at IS NOT NULL, \
                k.kind, coalesce(u.used, 0)::int4 \
           FROM privmatch.registered_clients c \
          CROSS JOIN privmatch.query_budget_policy k \
           LEFT JOIN privmatch.client_budget_use u \
             ON u.client_id = c.client_id AND u.kind = k.kind \
            AND u.hour = date_trunc('hour', now()) \
          ORDER BY c.client_id, k.kind",
        &[],
        |row| {
            (
                row.get::<String>(1).unwrap_or_default(),
                row.get::<String>(2).unwrap_or_default(),
                row.get::<i32>(3).unwrap_or_default(),
                row.get::<bool>(4).unwrap_or_default(),
                row.get::<String>(5).unwrap_or_default(),
                row.get::<i32>(6).unwrap_or_default(),
            )
        },
    );
    TableIterator::new(rows)
}
