//! The coordinator untrusted in fact, at the parties (issue 34; docs/trust-model.md §2a, §4):
//! what the application's and the coordinator's logins can take from the others (the
//! coordinator's lock, connections, temporary objects, disk), signed operator commands that
//! expire and stay refused after a dump and restore, the secrets a party keeps in its tables
//! (θ, the template master key K, the single-use face keys) in no WAL record, dump or log in
//! the clear, and the query budgets kept and enforced at the parties.
//!
//! Each attack here worked against 0.10.0 (f21d1f1): the application login could take the
//! coordinator's advisory lock key, open connections until `max_connections`, create TEMP
//! tables; a signed peer pin replayed after a restore; θ, K and key batches were in the WAL.

use std::path::Path;

use privmatch_coordinator::cli::operator_key::{fresh_counter, load};
use privmatch_core::crypto::at_rest::AtRestKey;
use privmatch_core::crypto::seal::PartySecretKey;
use privmatch_core::crypto::sign::{PeerPin, PEER_PIN_ACTION};
use privmatch_core::face::probe::seal_face_probe;
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{contains, sqlstate_and_message, wal_bytes, Cluster};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

const P: [PartyIndex; 3] = PartyIndex::ALL;
/// The key of the coordinator's lock at P0 in 0.10.0 ("privmatc" as an integer); 0.11.0 uses
/// it too, behind privmatch.coordinator_lock().
const LOCK_KEY: i64 = 0x7072_6976_6d61_7463;

#[test]
fn logins_cannot_take_the_coordinator_lock_fill_connections_or_write_temporary_objects() {
    let mut cluster = Cluster::start("limits", 44);
    let app = cluster.application(0);
    let app_sql = |sql: &str| cluster.query_login(&app, sql, &[]);
    // The lock: the application (and the coordinator's role, but through coordinator_lock())
    // may take no advisory lock at all.
    for sql in [
        format!("SELECT pg_try_advisory_lock({LOCK_KEY})"),
        format!("SELECT pg_advisory_lock({LOCK_KEY})"),
        "SELECT pg_try_advisory_xact_lock(1)".to_owned(),
        "SELECT pg_try_advisory_lock_shared(1, 2)".to_owned(),
        "SELECT privmatch.coordinator_lock()".to_owned(),
    ] {
        let err = app_sql(&sql).expect_err(&sql);
        assert_eq!(err.0, "42501", "application: {sql}: {err:?}");
    }
    let err = cluster
        .query_as_coordinator(0, &format!("SELECT pg_try_advisory_lock({LOCK_KEY})"))
        .expect_err("the coordinator's role takes the raw lock");
    assert_eq!(err.0, "42501", "{err:?}");
    // The coordinator holds its lock (it is running): a second try is refused, not an error.
    let rows = cluster
        .query_as_coordinator(0, "SELECT privmatch.coordinator_lock()")
        .expect("coordinator_lock");
    drop(rows);
    // No temporary objects for either login.
    for sql in ["CREATE TEMP TABLE t (x int)", "CREATE TEMPORARY SEQUENCE s"] {
        assert_eq!(
            app_sql(sql).expect_err(sql).0,
            "42501",
            "application: {sql}"
        );
        assert_eq!(
            cluster.query_as_coordinator(0, sql).expect_err(sql).0,
            "42501",
            "coordinator: {sql}"
        );
    }
    // A temp_file_limit each, which neither login may lift.
    let setting = |login: &privmatch_coordinator::config::PartyConfig| -> String {
        cluster
            .query_login(login, "SELECT current_setting('temp_file_limit')", &[])
            .expect("temp_file_limit")[0]
            .get(0)
    };
    assert_eq!(setting(&app), "256MB");
    assert_eq!(setting(&cluster.coordinator_logins[0]), "1GB");
    assert_eq!(
        app_sql("SET temp_file_limit = -1").expect_err("lift").0,
        "42501"
    );
    // Connections: the application login gets 8; the 9th is refused (53300) while the
    // coordinator still logs in and serves.
    let held: Vec<_> = (0..8)
        .map(|i| {
            cluster
                .block_on(privmatch_coordinator::parties::open(&app))
                .unwrap_or_else(|e| panic!("application connection {i}: {e}"))
        })
        .collect();
    let Err(refused) = cluster.block_on(privmatch_coordinator::parties::open(&app)) else {
        panic!("a 9th application connection was accepted");
    };
    let privmatch_coordinator::parties::ConnectError::Pg(refused) = refused else {
        panic!("a 9th application connection: {refused}");
    };
    let (code, message) = sqlstate_and_message(&refused);
    assert_eq!(code, "53300", "{message}");
    assert!(
        message.contains("too many connections for role"),
        "{message}"
    );
    let out = cluster.restart_coordinator();
    assert!(out.success(), "the coordinator restarts: {out}");
    assert!(cluster.healthy(), "the coordinator serves");
    let templates = cluster.path("t.ndjson");
    let t = templates.display().to_string();
    cluster
        .cli(&["iris", "synth", "4", "-o", &t])
        .expect_success();
    cluster.enroll(&templates, &[]).expect_success();
    drop(held);
    // The coordinator's login has a connection limit too, below max_connections.
    let limit: i32 = cluster.query(
        0,
        "SELECT rolconnlimit FROM pg_roles WHERE rolname = 'coordinator'",
        &[],
    )[0]
    .get(0);
    assert_eq!(limit, 32);
}

#[test]
fn signed_commands_expire_and_stay_refused_after_a_restore() {
    use privmatch_core::crypto::sign::MAX_LIFETIME_MICROS;
    let cluster = Cluster::start("commands", 45);
    let operator = load(&cluster.home.join("operators/p2.signing.key")).expect("operator key");
    let relay = |command: &[u8]| {
        cluster.query_as_coordinator(
            2,
            &format!(
                "SELECT privmatch.pin_peer_signed('\\x{}'::bytea)",
                hex::encode(command)
            ),
        )
    };
    let honest: Vec<u8> = cluster.query(
        2,
        "SELECT public_key FROM privmatch.peers WHERE party_index = 0",
        &[],
    )[0]
    .get(0);
    let pin = PeerPin {
        peer: P[0],
        key: honest.clone().try_into().expect("32 bytes"),
        replace: false,
    }
    .encode();
    // Expired, and signed to live for longer than a party accepts: refused (28000).
    let now = fresh_counter();
    let expired = operator.sign_expiring(
        P[2],
        now - 2_000_000,
        now - 1_000_000,
        PEER_PIN_ACTION,
        &pin,
    );
    let err = relay(&expired).expect_err("expired");
    assert_eq!(err.0, "28000", "{err:?}");
    assert!(err.1.contains("expired"), "{err:?}");
    let forever = operator.sign_expiring(
        P[2],
        now,
        now + MAX_LIFETIME_MICROS + 60_000_000,
        PEER_PIN_ACTION,
        &pin,
    );
    assert_eq!(relay(&forever).expect_err("too long").0, "28000");
    // Accepted once; dumped and restored, the party still refuses its replay.
    let good = operator.sign(P[2], fresh_counter(), PEER_PIN_ACTION, &pin);
    relay(&good).expect("a fresh signed pin");
    let file = cluster.path("p2.dump");
    cluster.pg_dump(2, "c", &file);
    cluster.restore_database(2, &file);
    let counter: i64 =
        cluster.query(2, "SELECT last_counter FROM privmatch.operator_key", &[])[0].get(0);
    assert!(counter > 0, "the counter was restored");
    let replayed = relay(&good).expect_err("replayed after the restore");
    assert_eq!(replayed.0, "28000", "{replayed:?}");
    assert!(replayed.1.contains("replayed"), "{replayed:?}");
}

/// Every file of the deployment's logs (parties' server logs, the coordinator's).
fn log_bytes(home: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    let mut stack = vec![home.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                if !path.ends_with("data") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "log") {
                all.extend(std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    all
}

/// Party `party`'s secret key, read from its key file (the test plays the operator).
fn party_secret(cluster: &Cluster, party: usize) -> PartySecretKey {
    let text =
        std::fs::read_to_string(cluster.home.join(format!("p{party}/party.key"))).expect("key");
    let hex_key = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("the key line");
    let bytes: [u8; 32] = hex::decode(hex_key)
        .expect("hex")
        .try_into()
        .expect("32 bytes");
    PartySecretKey::from_bytes(bytes)
}

#[test]
fn face_secrets_are_in_no_wal_dump_or_log_and_verifications_have_a_budget() {
    let cluster = Cluster::start("at-rest", 46);
    let theta = 0.6180339887_f64;
    let faces = cluster.path("faces.ndjson");
    let probes = cluster.path("probes.ndjson");
    let (f, p) = (faces.display().to_string(), probes.display().to_string());
    cluster
        .cli(&[
            "face",
            "synth",
            "--subjects",
            "6",
            "--dim",
            "128",
            "--out",
            &f,
            "--probes",
            &p,
        ])
        .expect_success();
    cluster
        .cli(&[
            "face",
            "configure",
            "--metric",
            "cosine",
            "--threshold",
            &theta.to_string(),
            "--dim",
            "128",
        ])
        .expect_success();
    cluster
        .cli(&["face", "enroll", "--input", &f])
        .expect_success();
    cluster
        .cli(&["face", "identify", "--input", &p])
        .expect_success();
    // Where each secret lives: θ and K sealed at P2; each session's keys only in the engine's
    // memory at P0 and P1 (no table holds them since the key pool was retired in 0.13.0).
    let persistence = |party: usize, table: &str| -> String {
        cluster.query(
            party,
            "SELECT relpersistence::text FROM pg_class WHERE oid = $1::text::regclass",
            &[&format!("privmatch.{table}")],
        )[0]
        .get(0)
    };
    // The Paillier SP's pending enrolments (the norm challenge's seed) and sessions, at P0.
    for table in ["paillier_pending", "paillier_sessions"] {
        assert_eq!(persistence(0, table), "u", "{table}");
    }
    for (table, column) in [
        ("face_dealer", "threshold"),
        ("face_template_master", "master_key"),
    ] {
        let clear: i64 = cluster.query(
            2,
            "SELECT count(*) FROM information_schema.columns \
              WHERE table_schema = 'privmatch' AND table_name = $1 AND column_name = $2",
            &[&table, &column],
        )[0]
        .get(0);
        assert_eq!(clear, 0, "{table}.{column} in the clear");
    }
    let sealed_k: Vec<u8> = cluster.query(
        2,
        "SELECT master_key_sealed FROM privmatch.face_template_master",
        &[],
    )[0]
    .get(0);
    let master = AtRestKey::derive(&party_secret(&cluster, 2), P[2], "face-template-master")
        .open(&sealed_k)
        .expect("K opens under P2's key file");
    let bits = theta.to_bits();
    let secrets: Vec<(&str, usize, Vec<Vec<u8>>)> = vec![
        (
            "θ",
            2,
            vec![bits.to_le_bytes().to_vec(), bits.to_be_bytes().to_vec()],
        ),
        ("K", 2, vec![master.to_vec()]),
    ];
    for (what, party, needles) in &secrets {
        cluster.query(*party, "CHECKPOINT", &[]);
        let wal = wal_bytes(&cluster.home.join(format!("p{party}/data")));
        let file = cluster.path(&format!("p{party}.dump"));
        cluster.pg_dump(*party, "c", &file);
        let dumped = std::fs::read(&file).expect("dump");
        let logs = log_bytes(&cluster.home);
        assert!(!wal.is_empty() && !logs.is_empty());
        for needle in needles {
            assert!(!contains(&wal, needle), "{what} is in P{party}'s WAL");
            assert!(!contains(&dumped, needle), "{what} is in P{party}'s dump");
            assert!(!contains(&logs, needle), "{what} is in a log");
        }
    }

    // Budgets: three verifications of one subject per hour at P0 and P1; the fourth is refused
    // by the parties (53400), through the CLI and when the coordinator's role calls the party
    // function itself.
    for party in [0, 1] {
        cluster.query(
            party,
            "SELECT privmatch.set_query_budget('face-verify', 3)",
            &[],
        );
    }
    let one_probe = cluster.path("one.ndjson");
    let first = std::fs::read_to_string(&probes).expect("probes");
    std::fs::write(
        &one_probe,
        first.lines().next().expect("a probe").to_owned() + "\n",
    )
    .expect("write");
    let o = one_probe.display().to_string();
    for _ in 0..3 {
        cluster
            .cli(&["face", "verify", "--subject", "face-0000001", "--input", &o])
            .expect_success();
    }
    let out = cluster
        .cli(&["face", "verify", "--subject", "face-0000001", "--input", &o])
        .expect_failure();
    out.assert_stderr_contains(&["budget"]);
    // Another subject still has its own budget.
    cluster
        .cli(&["face", "verify", "--subject", "face-0000002", "--input", &o])
        .expect_success();
    let session = [7u8; 16];
    let sealed = seal_face_probe(
        &vec![1000; 128],
        session,
        Some("face-0000001"),
        &cluster.party_keys()[2],
        &cluster.party_keys(),
        &mut ChaCha20Rng::seed_from_u64(1),
    )
    .expect("seal");
    let direct = cluster
        .query_as_coordinator(
            0,
            &format!(
                "SELECT * FROM privmatch.face_masked_open('\\x{}'::bytea, '\\x{}'::bytea)",
                hex::encode(session),
                hex::encode(&sealed[0])
            ),
        )
        .expect_err("past the budget");
    assert_eq!(direct.0, "53400", "{direct:?}");
    // Neither the operator's budget table nor the policy is the coordinator's to change.
    for sql in [
        "SELECT privmatch.set_query_budget('face-verify', 1000000)",
        "DELETE FROM privmatch.query_budget_use",
    ] {
        assert_eq!(
            cluster.query_as_coordinator(0, sql).expect_err(sql).0,
            "42501",
            "{sql}"
        );
    }
}

#[test]
fn iris_searches_past_a_party_budget_are_refused_there() {
    let cluster = Cluster::start("iris-budget", 47);
    let templates = cluster.path("t.ndjson");
    let t = templates.display().to_string();
    cluster
        .cli(&["iris", "synth", "3", "-o", &t])
        .expect_success();
    cluster.enroll(&templates, &[]).expect_success();
    let probe = cluster.path("probe.ndjson");
    let first = std::fs::read_to_string(&templates).expect("templates");
    std::fs::write(
        &probe,
        first.lines().next().expect("a template").to_owned() + "\n",
    )
    .expect("write");
    let p = probe.display().to_string();
    // P1 answers two searches an hour (a probe of one eye is one search).
    cluster.query(
        1,
        "SELECT privmatch.set_query_budget('iris-search', 2)",
        &[],
    );
    for _ in 0..2 {
        cluster
            .cli(&["iris", "search", "--input", &p, "--uniqueness"])
            .expect_success();
    }
    let out = cluster
        .cli(&["iris", "search", "--input", &p, "--uniqueness"])
        .expect_failure();
    out.assert_stderr_contains(&["budget"]);
    // Called directly by the coordinator's role: refused before the probe is even opened.
    let direct = cluster
        .query_as_coordinator(
            1,
            "SELECT * FROM privmatch.iris_search_start(decode(repeat('ab', 16), 'hex'), '\\x00')",
        )
        .expect_err("past the budget");
    assert_eq!(direct.0, "53400", "{direct:?}");
    // The other parties keep their own budgets.
    let budgets = cluster.query(
        0,
        "SELECT per_hour FROM privmatch.query_budgets() WHERE kind = 'iris-search'",
        &[],
    );
    assert_eq!(budgets[0].get::<_, i32>(0), 100_000);
}
