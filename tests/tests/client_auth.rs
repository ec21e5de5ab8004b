//! Registered clients at the parties (issue 34 item 4; docs/trust-model.md §4a, §5): sealed
//! inputs signed by a registered client (signature, nonce, expiry) and checked by the party,
//! per-client budgets kept at the party, and the operator-signed commands that manage them.
//!
//! Against 0.11.0 none of this existed: any caller's sealed input was accepted, and the only
//! budgets were party-wide, so the coordinator (or one client) could spend everyone's budget
//! and no party knew which client asked. The inputs here go through
//! `privmatch.client_auth_check`, which admits an input exactly as the protocol functions do
//! (`extension/src/clients.rs`, `admit`), called as the coordinator's login: the attacks are
//! a relay that rewrites, replays or redirects what a client signed, and a coordinator or
//! application login that tries to register clients or change the policy itself.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use privmatch_coordinator::cli::client_key::load_key;
use privmatch_coordinator::cli::operator_key::{fresh_counter, load};
use privmatch_coordinator::config::PartyConfig;
use privmatch_core::crypto::client_auth::{
    ClientAuthPolicy, ClientId, ClientRegistration, ClientSigningKey, CLIENT_AUTH_POLICY_ACTION,
    CLIENT_REGISTER_ACTION, MAX_LIFETIME_SECS,
};
use privmatch_core::crypto::sign::OperatorSigningKey;
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{wait_until, Cluster};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

const P: [PartyIndex; 3] = PartyIndex::ALL;
const PURPOSE: &str = "iris-probe";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn id(text: &str) -> ClientId {
    ClientId::new(text).expect("client id")
}

/// `privmatch.client_auth_check(purpose, blob, budget)` at P0 as `login`: the client id (None
/// for an accepted unsigned input), or the SQLSTATE and message.
fn check(
    cluster: &Cluster,
    login: &PartyConfig,
    purpose: &str,
    blob: &[u8],
    budget: Option<&str>,
) -> Result<Option<String>, (String, String)> {
    cluster
        .query_login(
            login,
            "SELECT privmatch.client_auth_check($1, $2, $3)",
            &[&purpose, &blob, &budget],
        )
        .map(|rows| rows[0].get::<_, Option<String>>(0))
}

/// Asserts that `got` was refused with `sqlstate` and a message containing every phrase.
fn refused(got: Result<Option<String>, (String, String)>, sqlstate: &str, phrases: &[&str]) {
    let (code, message) = got.expect_err("refused");
    assert_eq!(code, sqlstate, "{message}");
    for phrase in phrases {
        assert!(message.contains(phrase), "{phrase:?} not in {message:?}");
    }
}

/// A sealed input as a client would send it: random bytes stand in for the sealed box (the
/// check opens nothing).
fn sealed(rng: &mut ChaCha20Rng) -> Vec<u8> {
    let mut blob = vec![0u8; 200];
    rng.fill(blob.as_mut_slice());
    blob
}

/// An operator command for party `party` signed by its operator's key file.
fn operator_command(cluster: &Cluster, party: usize, action: &str, payload: &[u8]) -> Vec<u8> {
    let key =
        load(&cluster.home.join(format!("operators/p{party}.signing.key"))).expect("operator key");
    key.sign(P[party], fresh_counter(), action, payload)
}

#[test]
fn signed_inputs_are_checked_and_only_the_operator_manages_clients() {
    let cluster = Cluster::start("client-auth", 80);
    let mut rng = ChaCha20Rng::seed_from_u64(80);
    let coordinator = cluster.coordinator_logins[0].clone();
    let app = cluster.application(0);
    let p0_operator = cluster.home.join("operators/p0.toml").display().to_string();

    // Fresh install: the policy is 'optional' at every party, readable by every role.
    for p in 0..3 {
        let rows = cluster.query(p, "SELECT privmatch.client_auth_policy()", &[]);
        assert_eq!(rows[0].get::<_, String>(0), "optional", "P{p}");
    }
    let rows = cluster
        .query_login(&app, "SELECT privmatch.client_auth_policy()", &[])
        .expect("the application reads the policy");
    assert_eq!(rows[0].get::<_, String>(0), "optional");

    // The client makes its key; P0's operator registers it.
    let key_path = cluster.path("alice.key");
    let out = cluster
        .cli(&["client", "keygen", "--out", &key_path.display().to_string()])
        .expect_success();
    let mode = std::fs::metadata(&key_path)
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the client key is private");
    let alice = load_key(&key_path).expect("client key");
    assert_eq!(out.stdout.trim(), alice.verifying_key().to_hex());
    let pub_path = format!("{}.pub", key_path.display());
    cluster
        .cli(&[
            "client",
            "register",
            "--id",
            "alice",
            "--public-key",
            &pub_path,
            "--operator-config",
            &p0_operator,
        ])
        .expect_success();

    // A signed input is admitted (as the coordinator's login relays it) and names its client.
    let inner = sealed(&mut rng);
    let blob = alice.wrap(&id("alice"), P[0], PURPOSE, &inner, now(), &mut rng);
    assert_eq!(
        check(&cluster, &coordinator, PURPOSE, &blob, None).expect("signed"),
        Some("alice".to_owned())
    );
    // Replayed: refused, whoever relays it.
    refused(
        check(&cluster, &coordinator, PURPOSE, &blob, None),
        "28000",
        &["alice", "replayed"],
    );
    // Unsigned under 'optional': passed through (NULL client).
    assert_eq!(
        check(&cluster, &coordinator, PURPOSE, &inner, None).expect("unsigned"),
        None
    );

    // A relay that rewrites any part of a signed input: client id, nonce, expiry, signature,
    // the sealed blob. Each is refused (28000; 22023 where it no longer parses).
    let fresh = alice.wrap(&id("alice"), P[0], PURPOSE, &inner, now(), &mut rng);
    let header = 4 + 1 + 1 + 1 + PURPOSE.len() + 1 + "alice".len();
    for (what, at) in [
        ("client id", header - 1),
        ("nonce", header + 3),
        ("expiry", header + 16 + 7),
        ("signature", header + 24 + 10),
        ("sealed blob", fresh.len() - 1),
    ] {
        let mut tampered = fresh.clone();
        tampered[at] ^= 0x01;
        let (code, message) =
            check(&cluster, &coordinator, PURPOSE, &tampered, None).expect_err(what);
        assert!(
            code == "28000" || code == "22023",
            "{what}: {code} {message}"
        );
    }
    // The untampered input still passes afterwards (nothing above consumed its nonce).
    assert_eq!(
        check(&cluster, &coordinator, PURPOSE, &fresh, None).expect("untampered"),
        Some("alice".to_owned())
    );
    // Expired, signed to live too long, for another party, for another purpose.
    let nonce: [u8; 16] = rng.gen();
    let expired = alice.wrap_with(&id("alice"), P[0], PURPOSE, nonce, now() - 120, &inner);
    refused(
        check(&cluster, &coordinator, PURPOSE, &expired, None),
        "28000",
        &["alice", "expired"],
    );
    let long = alice.wrap_with(
        &id("alice"),
        P[0],
        PURPOSE,
        rng.gen(),
        now() + MAX_LIFETIME_SECS + 600,
        &inner,
    );
    refused(
        check(&cluster, &coordinator, PURPOSE, &long, None),
        "28000",
        &["alice", "more than"],
    );
    let for_p1 = alice.wrap(&id("alice"), P[1], PURPOSE, &inner, now(), &mut rng);
    refused(
        check(&cluster, &coordinator, PURPOSE, &for_p1, None),
        "28000",
        &["alice", "signed for P1, not for P0"],
    );
    let face = alice.wrap(&id("alice"), P[0], "face-probe", &inner, now(), &mut rng);
    refused(
        check(&cluster, &coordinator, PURPOSE, &face, None),
        "28000",
        &["alice", "face-probe"],
    );
    // Another key under alice's id, and a client nobody registered.
    let mallory = ClientSigningKey::generate(&mut rng);
    let forged = mallory.wrap(&id("alice"), P[0], PURPOSE, &inner, now(), &mut rng);
    refused(
        check(&cluster, &coordinator, PURPOSE, &forged, None),
        "28000",
        &["alice", "does not verify"],
    );
    let unknown = mallory.wrap(&id("mallory"), P[0], PURPOSE, &inner, now(), &mut rng);
    refused(
        check(&cluster, &coordinator, PURPOSE, &unknown, None),
        "28000",
        &["mallory", "not registered"],
    );

    // 'required': an unsigned input is refused, naming the function; signed ones pass.
    cluster
        .cli(&[
            "client-auth",
            "policy",
            "set",
            "required",
            "--operator-config",
            &p0_operator,
        ])
        .expect_success();
    refused(
        check(&cluster, &coordinator, PURPOSE, &inner, None),
        "28000",
        &["client_auth_check", "registered client must sign"],
    );
    let signed = alice.wrap(&id("alice"), P[0], PURPOSE, &inner, now(), &mut rng);
    assert_eq!(
        check(&cluster, &coordinator, PURPOSE, &signed, None).expect("signed"),
        Some("alice".to_owned())
    );
    // The other parties keep their own policy.
    let rows = cluster.query(1, "SELECT privmatch.client_auth_policy()", &[]);
    assert_eq!(rows[0].get::<_, String>(0), "optional");

    // Revoked: refused, naming the client; re-registering needs --replace.
    cluster
        .cli(&[
            "client",
            "revoke",
            "--id",
            "alice",
            "--operator-config",
            &p0_operator,
        ])
        .expect_success();
    let after = alice.wrap(&id("alice"), P[0], PURPOSE, &inner, now(), &mut rng);
    refused(
        check(&cluster, &coordinator, PURPOSE, &after, None),
        "28000",
        &["alice", "revoked"],
    );
    let register_alice = |extra: &[&str]| {
        let mut args = vec![
            "client",
            "register",
            "--id",
            "alice",
            "--public-key",
            &pub_path,
            "--operator-config",
            &p0_operator,
        ];
        args.extend_from_slice(extra);
        cluster.cli(&args)
    };
    register_alice(&[])
        .expect_failure()
        .assert_stderr_contains(&["alice", "revoked", "23505"]);
    register_alice(&["--replace"]).expect_success();
    let back = alice.wrap(&id("alice"), P[0], PURPOSE, &inner, now(), &mut rng);
    assert_eq!(
        check(&cluster, &coordinator, PURPOSE, &back, None).expect("reinstated"),
        Some("alice".to_owned())
    );

    // Only the operator's signed commands change clients or the policy. The coordinator's
    // login may relay a command the operator signed, but not write the tables, forge a
    // command, replay one, or pass one addressed to another party; the application's login
    // may do none of it.
    for sql in [
        "INSERT INTO privmatch.registered_clients (client_id, public_key, per_hour) VALUES ('eve', '\\x00', 1)",
        "UPDATE privmatch.client_auth_policy SET mode = 'optional'",
        "DELETE FROM privmatch.client_nonces",
        "DELETE FROM privmatch.client_budget_use",
        "SELECT * FROM privmatch.client_budgets()",
    ] {
        let err = cluster
            .query_login(&coordinator, sql, &[])
            .expect_err(sql);
        assert_eq!(err.0, "42501", "coordinator: {sql}: {err:?}");
        let err = cluster.query_login(&app, sql, &[]).expect_err(sql);
        assert_eq!(err.0, "42501", "application: {sql}: {err:?}");
    }
    let eve = ClientSigningKey::generate(&mut rng);
    let eve_registration = ClientRegistration {
        client: id("eve"),
        key: eve.verifying_key(),
        per_hour: 1_000_000,
        replace: true,
    }
    .encode();
    let stranger = OperatorSigningKey::generate(&mut rng);
    let forged = stranger.sign(
        P[0],
        fresh_counter(),
        CLIENT_REGISTER_ACTION,
        &eve_registration,
    );
    let addressed_to_p1 = operator_command(&cluster, 1, CLIENT_REGISTER_ACTION, &eve_registration);
    let optional = ClientAuthPolicy::Optional.encode();
    let policy_as_register = operator_command(&cluster, 0, CLIENT_REGISTER_ACTION, &optional);
    for (what, sql, command) in [
        ("forged", "SELECT privmatch.client_register($1)", &forged),
        (
            "for P1",
            "SELECT privmatch.client_register($1)",
            &addressed_to_p1,
        ),
        (
            "another action",
            "SELECT privmatch.client_auth_set_policy($1)",
            &policy_as_register,
        ),
    ] {
        let err = cluster
            .query_login(&coordinator, sql, &[command])
            .expect_err(what);
        assert_eq!(err.0, "28000", "{what}: {err:?}");
    }
    let relaxed = operator_command(&cluster, 0, CLIENT_AUTH_POLICY_ACTION, &optional);
    let err = cluster
        .query_login(
            &app,
            "SELECT privmatch.client_auth_set_policy($1)",
            &[&relaxed],
        )
        .expect_err("the application relays no command");
    assert_eq!(err.0, "42501", "{err:?}");
    let err = cluster
        .query_login(
            &app,
            "SELECT privmatch.client_auth_check($1, $2)",
            &[&PURPOSE, &inner],
        )
        .expect_err("the application checks no input");
    assert_eq!(err.0, "42501", "{err:?}");
    // The policy is still 'required' and eve unknown.
    let rows = cluster.query(0, "SELECT privmatch.client_auth_policy()", &[]);
    assert_eq!(rows[0].get::<_, String>(0), "required");
    let by_eve = eve.wrap(&id("eve"), P[0], PURPOSE, &inner, now(), &mut rng);
    refused(
        check(&cluster, &coordinator, PURPOSE, &by_eve, None),
        "28000",
        &["eve", "not registered"],
    );
    // A command the operator signed, relayed by the coordinator's login: accepted once.
    let rows = cluster
        .query_login(
            &coordinator,
            "SELECT privmatch.client_auth_set_policy($1)",
            &[&relaxed],
        )
        .expect("a relayed operator command");
    assert_eq!(rows[0].get::<_, String>(0), "optional");
    let err = cluster
        .query_login(
            &coordinator,
            "SELECT privmatch.client_auth_set_policy($1)",
            &[&relaxed],
        )
        .expect_err("replayed");
    assert_eq!(err.0, "28000", "{err:?}");
}

#[test]
fn per_client_budgets_are_kept_at_the_party_and_survive_a_restart() {
    let cluster = Cluster::start("client-budget", 81);
    let mut rng = ChaCha20Rng::seed_from_u64(81);
    let coordinator = cluster.coordinator_logins[0].clone();
    let p0_operator = cluster.home.join("operators/p0.toml").display().to_string();
    let carol = ClientSigningKey::generate(&mut rng);
    let dave = ClientSigningKey::generate(&mut rng);
    for (name, key) in [("carol", &carol), ("dave", &dave)] {
        cluster
            .cli(&[
                "client",
                "register",
                "--id",
                name,
                "--public-key",
                &key.verifying_key().to_hex(),
                "--per-hour",
                "3",
                "--operator-config",
                &p0_operator,
            ])
            .expect_success();
    }
    let inner = sealed(&mut rng);
    let mut ask = |key: &ClientSigningKey, name: &str, budget: Option<&str>| {
        let blob = key.wrap(&id(name), P[0], PURPOSE, &inner, now(), &mut rng);
        check(&cluster, &coordinator, PURPOSE, &blob, budget)
    };
    // A check without a budget kind charges nothing.
    for _ in 0..5 {
        assert_eq!(
            ask(&carol, "carol", None).expect("no charge"),
            Some("carol".into())
        );
    }
    for _ in 0..3 {
        assert_eq!(
            ask(&carol, "carol", Some("iris-search")).expect("within the budget"),
            Some("carol".into())
        );
    }
    refused(
        ask(&carol, "carol", Some("iris-search")),
        "53400",
        &["client \"carol\"", "iris-search"],
    );
    // Another kind, and another client, still pass; an unknown kind is 22023.
    assert!(ask(&carol, "carol", Some("face-identify")).is_ok());
    assert!(ask(&dave, "dave", Some("iris-search")).is_ok());
    refused(ask(&dave, "dave", Some("everything")), "22023", &["budget"]);
    // The operator sees the counts (SQL and CLI).
    let used: i32 = cluster.query(
        0,
        "SELECT used_this_hour FROM privmatch.client_budgets() WHERE client_id = 'carol' AND kind = 'iris-search'",
        &[],
    )[0]
    .get(0);
    assert_eq!(used, 3);
    let out = cluster
        .cli(&["client", "budgets", "--operator-config", &p0_operator])
        .expect_success();
    assert!(
        out.stdout.lines().any(|l| l.contains("\"carol\"")
            && l.contains("\"iris-search\"")
            && l.contains("\"used_this_hour\":3")),
        "{}",
        out.stdout
    );
    // A restart of the party does not refill the budget.
    cluster.kill_party(0);
    cluster.start_party(0);
    wait_until(Duration::from_secs(30), "P0 to accept connections", || {
        cluster.query_login(&coordinator, "SELECT 1", &[]).is_ok()
    });
    refused(
        ask(&carol, "carol", Some("iris-search")),
        "53400",
        &["client \"carol\"", "iris-search"],
    );
    assert!(ask(&dave, "dave", Some("iris-search")).is_ok());
    // The operator raises carol's budget (same key: no --replace needed).
    cluster
        .cli(&[
            "client",
            "register",
            "--id",
            "carol",
            "--public-key",
            &carol.verifying_key().to_hex(),
            "--per-hour",
            "10",
            "--operator-config",
            &p0_operator,
        ])
        .expect_success();
    assert!(ask(&carol, "carol", Some("iris-search")).is_ok());
}

/// The protocol functions admit their inputs as `client_auth_check` does: with the policy
/// `required` at every party, an iris search from a client without a registered key is refused
/// at the parties, and the same search signed by a registered client (`PRIVMATCH_CLIENT_ID`,
/// `PRIVMATCH_CLIENT_KEY`) answers and is charged to its budget at every party.
#[test]
fn iris_searches_carry_the_registered_clients_signature() {
    let cluster = Cluster::start("client-auth-wired", 82);
    let enrol = cluster.path("enrol.ndjson");
    let synth = cluster
        .cli(&["iris", "synth", "3", "--seed", "82"])
        .expect_success();
    std::fs::write(&enrol, &synth.stdout).expect("write templates");
    let enrol = enrol.display().to_string();
    cluster
        .cli(&["iris", "enroll", "--input", &enrol, "--no-progress"])
        .expect_success();

    let key_path = cluster.path("alice.key");
    let key = key_path.display().to_string();
    cluster
        .cli(&["client", "keygen", "--out", &key])
        .expect_success();
    let public = format!("{key}.pub");
    for p in 0..3 {
        let operator = cluster
            .home
            .join(format!("operators/p{p}.toml"))
            .display()
            .to_string();
        cluster
            .cli(&[
                "client",
                "register",
                "--id",
                "alice",
                "--public-key",
                &public,
                "--operator-config",
                &operator,
            ])
            .expect_success();
        cluster
            .cli(&[
                "client-auth",
                "policy",
                "set",
                "required",
                "--operator-config",
                &operator,
            ])
            .expect_success();
    }

    // Unsigned (a configuration without the local client `cluster up` registered): refused
    // at the parties, nothing answered.
    let unsigned = cluster.unsigned_config().display().to_string();
    let out = cluster
        .cli(&[
            "--config", &unsigned, "iris", "search", "--input", &enrol, "--json",
        ])
        .expect_failure();
    out.assert_stderr_contains(&["registered client"]);
    assert!(out.stdout.trim().is_empty(), "{out}");

    // Signed by alice (the environment takes precedence over the configuration's client):
    // every template finds itself.
    let mut signed = cluster.command(&["iris", "search", "--input", &enrol, "--json"]);
    signed
        .env("PRIVMATCH_CLIENT_ID", "alice")
        .env("PRIVMATCH_CLIENT_KEY", &key);
    let out = privmatch_e2e::run(signed, Duration::from_secs(300)).expect_success();
    for i in 0..3 {
        let subject = format!("synth-{i:07}");
        assert!(out.stdout.contains(&subject), "{subject} not found: {out}");
    }
    // Charged to alice at every party: three searches (one per probe).
    for p in 0..3 {
        let rows = cluster.query(
            p,
            "SELECT used_this_hour FROM privmatch.client_budgets() \
              WHERE client_id = 'alice' AND kind = 'iris-search'",
            &[],
        );
        assert_eq!(rows.len(), 1, "P{p}");
        assert_eq!(rows[0].get::<_, i32>(0), 3, "P{p}");
    }
}

// --- enrolment envelopes, and `cluster up` -----------------------------------------------

/// Iris templates at each party, by subject prefix.
fn iris_rows(cluster: &Cluster, prefix: &str) -> [i64; 3] {
    [0, 1, 2].map(|p| {
        cluster.query(
            p,
            "SELECT count(*) FROM privmatch.iris_templates WHERE subject LIKE $1 || '%'",
            &[&prefix],
        )[0]
        .get(0)
    })
}

/// Face templates at each party, by subject prefix.
fn face_rows(cluster: &Cluster, prefix: &str) -> [i64; 3] {
    [0, 1, 2].map(|p| {
        cluster.query(
            p,
            "SELECT count(*) FROM privmatch.face_templates WHERE subject LIKE $1 || '%'",
            &[&prefix],
        )[0]
        .get(0)
    })
}

/// `privmatch.iris_enroll_sealed` at `party` as the coordinator's login, with the envelope
/// hashes of `all` (the three envelopes of the record, as relayed): the rows, or the SQLSTATE
/// and message.
fn iris_enroll_at(
    cluster: &Cluster,
    party: usize,
    all: &[Vec<u8>; 3],
) -> Result<usize, (String, String)> {
    let hashes = privmatch_core::iris::binding::envelope_hashes([&all[0], &all[1], &all[2]]);
    cluster
        .query_login(
            &cluster.coordinator_logins[party],
            "SELECT * FROM privmatch.iris_enroll_sealed($1, $2)",
            &[&vec![all[party].clone()], &vec![hashes.to_vec()]],
        )
        .map(|rows| rows.len())
}

/// `privmatch.face_enroll_sealed` at `party` (P0 or P1) as the coordinator's login.
fn face_enroll_at(
    cluster: &Cluster,
    party: usize,
    envelope: &[u8],
) -> Result<usize, (String, String)> {
    cluster
        .query_login(
            &cluster.coordinator_logins[party],
            "SELECT * FROM privmatch.face_enroll_sealed($1)",
            &[&vec![envelope.to_vec()]],
        )
        .map(|rows| rows.len())
}

/// The SQLSTATE of a refusal, and that its message has every phrase.
fn refused_with<T: std::fmt::Debug>(
    got: Result<T, (String, String)>,
    code: &str,
    phrases: &[&str],
) {
    let (got_code, message) = got.expect_err("refused");
    assert_eq!(got_code, code, "{message}");
    for phrase in phrases {
        assert!(message.contains(phrase), "{phrase:?} not in {message:?}");
    }
}

/// Issue 34 item 4, for enrolments: `privmatch cluster up` (its default, run again on a
/// cluster the harness started with `--client-auth optional`) registers the CLI as client
/// `local-cli` at the three parties and sets the policy `required`; iris and face enrolment
/// envelopes are then admitted like probes at every party. Unsigned envelopes (through the
/// CLI without a credential, or in SQL as the coordinator's login), envelopes whose signature
/// a relay rewrote, envelopes for another party or purpose, and replayed envelopes are refused
/// with 28000, a replayed one with 23505 (its bundle ids are consumed), and nothing is enrolled
/// anywhere; enrolments keep no nonce; the CLI's signed enrolments and searches work end to
/// end; an unsigned probe is refused; expired nonces are swept as probes are admitted.
#[test]
fn enrolment_envelopes_are_signed_and_cluster_up_requires_signatures() {
    use privmatch_core::face::enroll::{
        seal_face_enrollment, FaceEnrollRequest, FACE_ENROLL_PURPOSE,
    };
    use privmatch_core::face::quantize::Quantizer;
    use privmatch_core::iris::enroll::{seal_iris_enrollment, Eye, IRIS_ENROLL_PURPOSE};
    use privmatch_core::iris::synth::random_template;

    let cluster = Cluster::start("client-auth-enrol", 7);
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    for p in 0..3 {
        let rows = cluster.query(p, "SELECT privmatch.client_auth_policy()", &[]);
        assert_eq!(rows[0].get::<_, String>(0), "optional", "P{p} (harness)");
    }
    // `cluster up` as a user runs it: the policy becomes 'required' at every party, the
    // CLI's key is registered there and named in its configuration.
    cluster
        .cli(&[
            "cluster",
            "up",
            "--base-port",
            &cluster.base_port.to_string(),
            "--coordinator-port",
            &cluster.coordinator_port.to_string(),
        ])
        .expect_success();
    let key_path = cluster.home.join("client.key");
    let mode = std::fs::metadata(&key_path)
        .expect("client.key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the client key is private");
    let local = load_key(&key_path).expect("client key");
    let config = privmatch_coordinator::config::Config::load(&cluster.home.join("privmatch.toml"))
        .expect("client configuration");
    assert_eq!(config.client_id.as_deref(), Some("local-cli"));
    assert_eq!(config.client_key.as_deref(), Some(key_path.as_path()));
    for p in 0..3 {
        let rows = cluster.query(p, "SELECT privmatch.client_auth_policy()", &[]);
        assert_eq!(rows[0].get::<_, String>(0), "required", "P{p}");
        let rows = cluster.query(
            p,
            "SELECT DISTINCT public_key FROM privmatch.client_budgets() WHERE client_id = 'local-cli' AND NOT revoked",
            &[],
        );
        assert_eq!(rows.len(), 1, "P{p}");
        assert_eq!(
            rows[0].get::<_, String>(0),
            local.verifying_key().to_hex(),
            "P{p}"
        );
        // An unsigned sealed probe is refused (as every protocol function admits it).
        let inner = sealed(&mut rng);
        refused_with(
            cluster.query_login(
                &cluster.coordinator_logins[p],
                "SELECT privmatch.client_auth_check($1, $2)",
                &[&PURPOSE, &inner],
            ),
            "28000",
            &["registered client must sign"],
        );
    }

    // Through the CLI without a credential: iris (batch and --if-unique) and face
    // enrolments refused at the parties, nothing enrolled anywhere.
    let unsigned = cluster.unsigned_config().display().to_string();
    let iris_file = cluster.path("unsigned-iris.ndjson");
    let synth = cluster
        .cli(&["iris", "synth", "2", "--seed", "71", "--prefix", "nosig"])
        .expect_success();
    std::fs::write(&iris_file, &synth.stdout).expect("write");
    let iris_arg = iris_file.display().to_string();
    for extra in [&[][..], &["--if-unique"][..]] {
        let mut args = vec![
            "--config", &unsigned, "iris", "enroll", "--input", &iris_arg,
        ];
        args.extend_from_slice(extra);
        args.push("--no-progress");
        cluster
            .cli(&args)
            .expect_failure()
            .assert_stderr_contains(&["registered client"]);
        assert_eq!(iris_rows(&cluster, "nosig"), [0, 0, 0], "{extra:?}");
    }
    const DIM: usize = 128;
    let embedding = |rng: &mut ChaCha20Rng| -> Vec<f64> {
        let raw: Vec<f64> = (0..DIM).map(|_| rng.gen_range(-1.0..1.0)).collect();
        privmatch_core::embedding::normalize(&raw).expect("non-zero")
    };
    let face_file = cluster.path("faces.ndjson");
    let faces: Vec<String> = (0..3)
        .map(|i| {
            serde_json::json!({"subject": format!("face-{i}"), "embedding": embedding(&mut rng)})
                .to_string()
        })
        .collect();
    privmatch_e2e::write_lines(&face_file, &faces);
    let face_arg = face_file.display().to_string();
    cluster
        .cli(&[
            "--config", &unsigned, "face", "enroll", "--input", &face_arg,
        ])
        .expect_failure()
        .assert_stderr_contains(&["registered client"]);
    assert_eq!(face_rows(&cluster, "face-"), [0, 0, 0]);

    // In SQL as the coordinator's login (a relay that drops the signature, or forges its own
    // envelope): refused at each party, naming the function.
    let keys = cluster.party_keys();
    let template = random_template(&mut rng);
    let (plain, _) =
        seal_iris_enrollment(&template, "sql-iris", Eye::Left, &keys, &mut rng).expect("seal");
    for p in 0..3 {
        refused_with(
            iris_enroll_at(&cluster, p, &plain),
            "28000",
            &["iris_enroll_sealed", "registered client must sign"],
        );
    }
    let quantizer = Quantizer::new(DIM).expect("dim");
    let face_embedding = quantizer.quantize(&embedding(&mut rng)).expect("quantise");
    let request = FaceEnrollRequest {
        subject: "sql-face",
        embedding: &face_embedding,
    };
    let (face_plain, _) = seal_face_enrollment(&[request], &keys, &mut rng).expect("seal");
    for (p, envelope) in face_plain.iter().enumerate() {
        refused_with(
            face_enroll_at(&cluster, p, envelope),
            "28000",
            &["face_enroll_sealed", "registered client must sign"],
        );
    }

    // Signed by the registered client, then rewritten by a relay (signature, nonce, the
    // sealed envelope), redirected to another party, or signed for another purpose: refused.
    let client = id("local-cli");
    let sign = |party: usize, purpose: &str, blob: &[u8], rng: &mut ChaCha20Rng| {
        local.wrap(&client, P[party], purpose, blob, now(), rng)
    };
    let signed: [Vec<u8>; 3] =
        std::array::from_fn(|p| sign(p, IRIS_ENROLL_PURPOSE, &plain[p], &mut rng));
    let header = 4 + 1 + 1 + 1 + IRIS_ENROLL_PURPOSE.len() + 1 + "local-cli".len();
    for p in 0..3 {
        for (what, at) in [
            ("nonce", header + 2),
            ("signature", header + 24 + 5),
            ("sealed envelope", signed[p].len() - 1),
        ] {
            let mut relayed = signed.clone();
            relayed[p][at] ^= 0x01;
            let (code, message) = iris_enroll_at(&cluster, p, &relayed).expect_err(what);
            assert_eq!(code, "28000", "P{p} {what}: {message}");
            assert!(
                message.contains("iris_enroll_sealed") && message.contains("local-cli"),
                "P{p} {what}: {message}"
            );
        }
        let mut redirected = signed.clone();
        redirected[p] = signed[(p + 1) % 3].clone();
        refused_with(
            iris_enroll_at(&cluster, p, &redirected),
            "28000",
            &["local-cli", "signed for"],
        );
        let mut as_probe = signed.clone();
        as_probe[p] = sign(p, "iris-probe", &plain[p], &mut rng);
        refused_with(
            iris_enroll_at(&cluster, p, &as_probe),
            "28000",
            &["local-cli", "iris-probe"],
        );
    }
    let face_signed: [Vec<u8>; 2] =
        std::array::from_fn(|p| sign(p, FACE_ENROLL_PURPOSE, &face_plain[p], &mut rng));
    for (p, envelope) in face_signed.iter().enumerate() {
        let mut rewritten = envelope.clone();
        rewritten[header] ^= 0x01; // the nonce (the purpose label has the same length)
        refused_with(
            face_enroll_at(&cluster, p, &rewritten),
            "28000",
            &["face_enroll_sealed", "local-cli"],
        );
    }
    assert_eq!(iris_rows(&cluster, "sql-"), [0, 0, 0]);
    assert_eq!(face_rows(&cluster, "sql-"), [0, 0, 0]);

    let nonces = |cluster: &Cluster| -> [i64; 3] {
        [0, 1, 2].map(|p| cluster.scalar(p, "SELECT count(*) FROM privmatch.client_nonces"))
    };
    let nonces_before = nonces(&cluster);
    // The signed envelopes, as an honest coordinator relays them: enrolled at every party
    // (the same enrolment id at the three), then replayed: refused, nothing more enrolled.
    for p in 0..3 {
        assert_eq!(
            iris_enroll_at(&cluster, p, &signed).expect("signed"),
            1,
            "P{p}"
        );
    }
    for (p, envelope) in face_signed.iter().enumerate() {
        assert_eq!(
            face_enroll_at(&cluster, p, envelope).expect("signed"),
            1,
            "P{p}"
        );
    }
    // Enrolments keep no nonce (their bundle ids are single use): a 100,000-record enrolment
    // adds nothing to privmatch.client_nonces.
    assert_eq!(nonces(&cluster), nonces_before);
    let ids: Vec<Vec<u8>> = (0..3)
        .map(|p| {
            cluster.query(
                p,
                "SELECT enrolment_id FROM privmatch.iris_templates WHERE subject = 'sql-iris'",
                &[],
            )[0]
            .get(0)
        })
        .collect();
    assert!(
        ids.iter().all(|i| *i == ids[0]),
        "one enrolment id at the three"
    );
    // A replayed enrolment is refused by its consumed bundle ids (23505 "already consumed":
    // the front door's "it committed earlier"), signed or not.
    for p in 0..3 {
        refused_with(
            iris_enroll_at(&cluster, p, &signed),
            "23505",
            &["already consumed"],
        );
    }
    for (p, envelope) in face_signed.iter().enumerate() {
        refused_with(
            face_enroll_at(&cluster, p, envelope),
            "23505",
            &["already consumed"],
        );
    }
    assert_eq!(iris_rows(&cluster, "sql-"), [1, 1, 1]);
    assert_eq!(face_rows(&cluster, "sql-"), [1, 1, 0]);

    // The CLI signs through its configuration: batch and --if-unique iris enrolments, a face
    // enrolment, and searches, end to end under 'required'.
    let enrol_file = cluster.path("signed-iris.ndjson");
    let synth = cluster
        .cli(&["iris", "synth", "3", "--seed", "72", "--prefix", "signed"])
        .expect_success();
    std::fs::write(&enrol_file, &synth.stdout).expect("write");
    let enrol_arg = enrol_file.display().to_string();
    cluster.enroll(&enrol_file, &[]).expect_success();
    assert_eq!(iris_rows(&cluster, "signed"), [3, 3, 3]);
    let unique_file = cluster.path("unique-iris.ndjson");
    let synth = cluster
        .cli(&["iris", "synth", "1", "--seed", "73", "--prefix", "unique"])
        .expect_success();
    std::fs::write(&unique_file, &synth.stdout).expect("write");
    cluster
        .enroll(&unique_file, &["--if-unique"])
        .expect_success();
    assert_eq!(iris_rows(&cluster, "unique"), [1, 1, 1]);
    cluster
        .cli(&["face", "enroll", "--input", &face_arg])
        .expect_success();
    assert_eq!(face_rows(&cluster, "face-"), [3, 3, 0]);
    let out = cluster
        .cli(&["iris", "search", "--input", &enrol_arg, "--json"])
        .expect_success();
    for i in 0..3 {
        let subject = format!("signed-{i:07}");
        assert!(out.stdout.contains(&subject), "{subject} not found: {out}");
    }
    // An expired nonce left in the table is swept when the next probe is admitted.
    cluster.query(
        0,
        "INSERT INTO privmatch.client_nonces (client_id, nonce, keep_until) \
         VALUES ('local-cli', '\\x00000000000000000000000000000000', now() - interval '1 hour')",
        &[],
    );
    // The template enrolled in SQL with signed envelopes is found too.
    let probe_file = cluster.path("sql-probe.ndjson");
    privmatch_e2e::write_lines(
        &probe_file,
        &[serde_json::json!({"eye": "left", "iris_codes": template.code.to_base64(), "mask_codes": template.mask.to_base64()}).to_string()],
    );
    let out = cluster
        .cli(&[
            "iris",
            "search",
            "--input",
            &probe_file.display().to_string(),
            "--json",
        ])
        .expect_success();
    assert!(out.stdout.contains("sql-iris"), "{out}");
    let expired_left = cluster.scalar(
        0,
        "SELECT count(*) FROM privmatch.client_nonces WHERE keep_until < now()",
    );
    assert_eq!(expired_left, 0, "expired nonces are swept");
}
