//! The trust model, enforced (docs/trust-model.md): what the coordinator's login role can do at
//! a party (the protocol functions, nothing else), where a party's secret key is (a key file:
//! in no table, no WAL record, no dump), and that a dump restored by the operator (key file
//! kept) matches as before.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use privmatch_e2e::{pg_bindir, run, wait_until, Cluster};

/// What the coordinator's login may not do at a party, with the SQLSTATE it gets.
const FORBIDDEN: &[(&str, &str)] = &[
    ("SELECT * FROM privmatch.iris_templates", "42501"),
    ("SELECT * FROM privmatch.face_templates", "42501"),
    ("SELECT * FROM privmatch.party_identity", "42501"),
    ("SELECT * FROM privmatch.peers", "42501"),
    ("SELECT * FROM privmatch.operator_key", "42501"),
    ("SELECT * FROM privmatch.face_key_batches", "42501"),
    ("SELECT * FROM privmatch.face_dealer", "42501"),
    ("DELETE FROM privmatch.face_key_claims", "42501"),
    ("DELETE FROM privmatch.consumed_bundles", "42501"),
    (
        "SELECT privmatch.pin_peer(1, repeat('ab', 32), true)",
        "42501",
    ),
    ("SELECT privmatch.init_party(0)", "42501"),
    (
        "SELECT privmatch.set_operator_key(repeat('ab', 32), true)",
        "42501",
    ),
    ("SELECT privmatch.apply_function_roles()", "42501"),
    ("COPY (SELECT 1) TO PROGRAM 'id'", "42501"),
    (
        "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "42501",
    ),
    (
        "CREATE FUNCTION privmatch.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "42501",
    ),
    ("CREATE TABLE public.t (x int)", "42501"),
    ("SELECT pg_read_file('postmaster.pid')", "42501"),
    ("SET privmatch.key_file = '/tmp/other.key'", "55P02"),
];

#[test]
fn the_coordinator_role_can_call_protocol_functions_only() {
    let cluster = Cluster::start("trust-roles", 40);
    for party in 0..3 {
        for (sql, expected) in FORBIDDEN {
            match cluster.query_as_coordinator(party, sql) {
                Ok(_) => panic!("P{party}: the coordinator's role could run {sql}"),
                Err((code, message)) => {
                    assert_eq!(&code, expected, "P{party}: {sql}: {message}")
                }
            }
        }
        // What it needs works.
        for sql in [
            "SELECT * FROM privmatch.party_info()",
            "SELECT privmatch.iris_records()",
            "SELECT * FROM privmatch.engine_status()",
        ] {
            if let Err(e) = cluster.query_as_coordinator(party, sql) {
                panic!("P{party}: {sql}: {e:?}");
            }
        }
        // And it is what it claims: no superuser, no membership but privmatch_coordinator.
        let rows = cluster.query(
            party,
            "SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, \
                    array(SELECT g.rolname::text FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid \
                          WHERE m.member = r.oid ORDER BY 1) \
               FROM pg_roles r WHERE r.rolname = 'coordinator'",
            &[],
        );
        let (superuser, createrole, createdb, groups): (bool, bool, bool, Vec<String>) = (
            rows[0].get(0),
            rows[0].get(1),
            rows[0].get(2),
            rows[0].get(3),
        );
        assert!(!superuser && !createrole && !createdb, "P{party}");
        assert_eq!(groups, vec!["privmatch_coordinator".to_owned()], "P{party}");
    }
    // Every privmatch function that is not a type's I/O runs as its owner with a pinned
    // search_path, and PUBLIC may execute none of them.
    let loose = cluster.query(
        0,
        "SELECT p.oid::regprocedure::text FROM pg_proc p \
          WHERE p.pronamespace = 'privmatch'::regnamespace \
            AND NOT EXISTS (SELECT 1 FROM pg_type t WHERE p.oid IN (t.typinput, t.typoutput, \
                              t.typreceive, t.typsend, t.typmodin, t.typmodout)) \
            AND NOT EXISTS (SELECT 1 FROM pg_cast c WHERE c.castfunc = p.oid) \
            AND p.proname NOT IN ('face_share_dim', 'function_roles', 'apply_function_roles') \
            AND (NOT p.prosecdef OR p.proconfig IS NULL \
                 OR has_function_privilege('public', p.oid, 'EXECUTE'))",
        &[],
    );
    let loose: Vec<String> = loose.iter().map(|r| r.get(0)).collect();
    assert!(
        loose.is_empty(),
        "functions without the definer rule: {loose:?}"
    );
}

fn secret_key_bytes(cluster: &Cluster, party: usize) -> ([u8; 32], String) {
    let path = cluster.home.join(format!("p{party}/party.key"));
    let text = std::fs::read_to_string(&path).expect("key file");
    let hex_key = text.split_whitespace().nth(1).expect("key line").to_owned();
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(&hex_key, &mut bytes).expect("hex key");
    (bytes, hex_key)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every byte of every WAL segment of a party.
fn wal_bytes(data_dir: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(data_dir.join("pg_wal")).expect("pg_wal") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            all.extend(std::fs::read(&path).expect("WAL segment"));
        }
    }
    all
}

/// `pg_dump` of a party's database as its operator, in `format` (`p` plain, `c` custom).
fn pg_dump(cluster: &Cluster, party: usize, format: &str, out: &Path) {
    let operator = &cluster.operators[party];
    let mut cmd = Command::new(pg_bindir().join("pg_dump"));
    cmd.args(["-h", &operator.host, "-p", &operator.port.to_string()])
        .args(["-U", &operator.user, "-d", &operator.dbname])
        .arg(format!("-F{format}"))
        .arg("-f")
        .arg(out)
        .env("PGPASSWORD", &operator.password);
    run(cmd, Duration::from_secs(120)).expect_success();
}

fn search_lines(cluster: &Cluster, probes: &Path) -> Vec<String> {
    let input = probes.display().to_string();
    let out = cluster
        .cli(&["iris", "search", "--input", &input, "--json"])
        .expect_success();
    out.stdout.lines().map(str::to_owned).collect()
}

#[test]
fn the_party_key_is_in_no_table_wal_or_dump_and_a_restored_party_still_matches() {
    let cluster = Cluster::start("trust-keys", 41);
    let templates = cluster.path("templates.ndjson");
    let probes = cluster.path("probes.ndjson");
    let t = templates.display().to_string();
    cluster
        .cli(&[
            "iris",
            "synth",
            "60",
            "--near-duplicates",
            "6",
            "--rotation",
            "2",
            "-o",
            &t,
        ])
        .expect_success();
    cluster.enroll(&templates, &[]).expect_success();
    let lines: Vec<String> = std::fs::read_to_string(&templates)
        .expect("templates")
        .lines()
        .take(8)
        .map(str::to_owned)
        .collect();
    std::fs::write(&probes, lines.join("\n") + "\n").expect("probes");
    let before = search_lines(&cluster, &probes);
    assert!(
        before.iter().any(|l| l.contains("\"matches\":[{")),
        "{before:?}"
    );

    for party in 0..3 {
        let (raw, hex_key) = secret_key_bytes(&cluster, party);
        let mode = std::os::unix::fs::MetadataExt::mode(
            &std::fs::metadata(cluster.home.join(format!("p{party}/party.key"))).expect("meta"),
        );
        assert_eq!(mode & 0o777, 0o600, "P{party}'s key file mode");
        // Not in any table the operator can read (the identity row holds the public key).
        let rows = cluster.query(
            party,
            "SELECT count(*) FROM information_schema.columns \
              WHERE table_schema = 'privmatch' AND column_name LIKE '%secret%'",
            &[],
        );
        assert_eq!(rows[0].get::<_, i64>(0), 0, "P{party} has a secret column");
        // Not in the WAL written since the party was created.
        cluster.query(party, "CHECKPOINT", &[]);
        let wal = wal_bytes(&cluster.home.join(format!("p{party}/data")));
        assert!(!wal.is_empty());
        assert!(!contains(&wal, &raw), "P{party}'s secret key is in its WAL");
        assert!(
            !contains(&wal, hex_key.as_bytes()),
            "P{party}'s key (hex) is in its WAL"
        );
        // Not in a dump, which does hold the templates.
        let dump = cluster.path(&format!("p{party}.sql"));
        pg_dump(&cluster, party, "p", &dump);
        let text = std::fs::read(&dump).expect("dump");
        assert!(!contains(&text, &raw) && !contains(&text, hex_key.as_bytes()));
        assert!(
            contains(&text, b"COPY privmatch.iris_templates"),
            "templates not dumped"
        );
    }

    // Restore P1 from a dump into a fresh database, as its operator would.
    let dump = cluster.path("p1.dump");
    pg_dump(&cluster, 1, "c", &dump);
    let admin = {
        let mut admin = cluster.operators[1].clone();
        admin.dbname = "postgres".into();
        admin
    };
    cluster.block_on(async {
        let (client, conn) =
            tokio_postgres::connect(&admin.connection_string(), tokio_postgres::NoTls)
                .await
                .expect("connect");
        tokio::spawn(conn);
        // Two statements: neither may run inside the implicit transaction of a batch.
        client
            .batch_execute("DROP DATABASE privmatch WITH (FORCE)")
            .await
            .expect("drop P1's database");
        client
            .batch_execute("CREATE DATABASE privmatch")
            .await
            .expect("recreate P1's database");
    });
    let operator = &cluster.operators[1];
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
        .arg(&dump)
        .env("PGPASSWORD", &operator.password);
    run(restore, Duration::from_secs(120)).expect_success();
    // Without its key file the restored party refuses clearly; with it, it matches as before.
    let key = cluster.home.join("p1/party.key");
    let aside = cluster.home.join("p1/party.key.aside");
    std::fs::rename(&key, &aside).expect("move the key file aside");
    let input = probes.display().to_string();
    let refused = cluster
        .cli(&["iris", "search", "--input", &input])
        .expect_failure();
    refused.assert_stderr_contains(&["key file"]);
    std::fs::rename(&aside, &key).expect("put the key file back");
    wait_until(
        Duration::from_secs(60),
        "the restored P1 to match again",
        || {
            let out = cluster.cli(&["iris", "search", "--input", &input, "--json"]);
            out.success() && out.stdout.lines().map(str::to_owned).collect::<Vec<_>>() == before
        },
    );
}
