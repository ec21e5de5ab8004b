//! The trust model, enforced (docs/trust-model.md): what the coordinator's login role can do at
//! a party (the protocol functions, nothing else), where a party's secret key is (a key file:
//! in no table, no WAL record, no dump), and that a dump restored by the operator (key file
//! kept) matches as before.

use std::path::Path;
use std::time::Duration;

use privmatch_e2e::{contains, wait_until, wal_bytes, Cluster};

/// What the coordinator's login may not do at a party, with the SQLSTATE it gets.
const FORBIDDEN: &[(&str, &str)] = &[
    ("SELECT * FROM privmatch.iris_templates", "42501"),
    ("SELECT * FROM privmatch.face_templates", "42501"),
    ("SELECT * FROM privmatch.party_identity", "42501"),
    ("SELECT * FROM privmatch.peers", "42501"),
    ("SELECT * FROM privmatch.operator_key", "42501"),
    ("SELECT * FROM privmatch.face_stock_used", "42501"),
    ("SELECT * FROM privmatch.face_dealer", "42501"),
    ("SELECT * FROM privmatch.face_template_master", "42501"),
    ("SELECT * FROM privmatch.face_masked_templates", "42501"),
    ("DELETE FROM privmatch.face_masked_templates", "42501"),
    ("DELETE FROM privmatch.face_sessions", "42501"),
    ("DELETE FROM privmatch.consumed_bundles", "42501"),
    ("SELECT * FROM privmatch.paillier_pending", "42501"),
    ("SELECT * FROM privmatch.paillier_sessions", "42501"),
    ("SELECT * FROM privmatch.paillier_devices", "42501"),
    ("SELECT privmatch.paillier_init_service(1024)", "42501"),
    (
        "SELECT privmatch.paillier_set_params('\\x00'::bytea)",
        "42501",
    ),
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

/// Every secret of a party's key file: (what it is, raw bytes, hex) for each line — the
/// party's X25519 secret, and the Paillier service provider's Ed25519 seed where the file has
/// one (`init_party` writes it).
fn secret_keys(cluster: &Cluster, party: usize) -> Vec<(String, Vec<u8>, String)> {
    let path = cluster.home.join(format!("p{party}/party.key"));
    let text = std::fs::read_to_string(&path).expect("key file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            let what = words.next().expect("key line tag").to_owned();
            let hex_key = words.next().expect("key line value").to_owned();
            let raw = hex::decode(&hex_key).expect("hex key");
            (what, raw, hex_key)
        })
        .collect()
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
        let keys = secret_keys(&cluster, party);
        assert!(!keys.is_empty(), "P{party}'s key file holds no key");
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
        // Not in a dump, which does hold the templates.
        let dump = cluster.path(&format!("p{party}.sql"));
        cluster.pg_dump(party, "p", &dump);
        let text = std::fs::read(&dump).expect("dump");
        for (what, raw, hex_key) in &keys {
            assert!(!contains(&wal, raw), "P{party}'s {what} is in its WAL");
            assert!(
                !contains(&wal, hex_key.as_bytes()),
                "P{party}'s {what} (hex) is in its WAL"
            );
            assert!(
                !contains(&text, raw) && !contains(&text, hex_key.as_bytes()),
                "P{party}'s {what} is in its dump"
            );
        }
        if party == 0 {
            assert!(
                keys.iter()
                    .any(|(what, _, _)| what == "privmatch-sp-signing-key-v1"),
                "P0's key file holds no Paillier service-provider signing seed"
            );
        }
        assert!(
            contains(&text, b"COPY privmatch.iris_templates"),
            "templates not dumped"
        );
    }

    // Restore P1 from a dump into a fresh database, as its operator would.
    let dump = cluster.path("p1.dump");
    cluster.pg_dump(1, "c", &dump);
    cluster.restore_database(1, &dump);
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

/// Sends a request head (and no body) to the coordinator over TLS (verified against the
/// cluster's CA); returns the status code.
fn raw_status(cluster: &Cluster, head: &str) -> u16 {
    use std::io::{Read, Write};
    let addr = cluster
        .coordinator_url()
        .trim_start_matches("https://")
        .to_owned();
    let host = addr
        .rsplit_once(':')
        .map_or(addr.as_str(), |(h, _)| h)
        .to_owned();
    let ca = cluster.config.ca_cert.clone().expect("the cluster's CA");
    let tls = privmatch_coordinator::tls::client_config(&ca).expect("TLS client config");
    let name = rustls::pki_types::ServerName::try_from(host).expect("server name");
    let connection =
        rustls::ClientConnection::new(std::sync::Arc::new(tls), name).expect("TLS session");
    let socket = std::net::TcpStream::connect(&addr).expect("connect to the coordinator");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut stream = rustls::StreamOwned::new(connection, socket);
    stream.write_all(head.as_bytes()).expect("send");
    let mut answer = String::new();
    let mut buf = [0u8; 512];
    while !answer.contains("\r\n") {
        let n = stream.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// Whether the coordinator answers a plain-HTTP request (it must not: TLS only).
fn answers_plain_http(cluster: &Cluster) -> bool {
    use std::io::{Read, Write};
    let addr = cluster
        .coordinator_url()
        .trim_start_matches("https://")
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).expect("connect to the coordinator");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("send");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 200")
}

#[test]
fn api_calls_need_tls_and_a_credential_with_the_right_scope_and_a_bounded_body() {
    let mut cluster = Cluster::start("trust-api", 42);
    let templates = cluster.path("t.ndjson");
    let t = templates.display().to_string();
    cluster
        .cli(&["iris", "synth", "3", "-o", &t])
        .expect_success();
    cluster.enroll(&templates, &[]).expect_success();
    let subject = "synth-0000000";
    let delete = "POST /v1/iris/delete HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: 2\r\nConnection: close\r\n{auth}\r\n{}";
    let with = |auth: &str| delete.replace("{auth}", auth);
    // No credential, a wrong one, a malformed header: 401, and nothing is deleted.
    for auth in [
        String::new(),
        "Authorization: Bearer pm_cli_0000\r\n".to_owned(),
        "Authorization: Basic cm9vdDpyb290\r\n".to_owned(),
    ] {
        assert_eq!(raw_status(&cluster, &with(&auth)), 401, "{auth:?}");
    }
    assert_eq!(cluster.subject_count(0, subject), 1);
    // A credential with the search scope only: 403 for a deletion, and nothing is deleted.
    let keys_file = cluster.home.join("api-keys.toml");
    let mut keys = std::fs::read_to_string(&keys_file).expect("keys file");
    let (search_only, entry) = privmatch_coordinator::server::auth::ApiKeys::generate(
        "search-only",
        &[privmatch_coordinator::server::auth::Scope::Search],
    )
    .expect("generate");
    keys.push_str(&format!(
        "\n[[key]]\nid = \"{}\"\nscopes = [\"search\"]\nsha256 = \"{}\"\n",
        entry.id, entry.sha256
    ));
    std::fs::write(&keys_file, keys).expect("keys file");
    cluster.restart_coordinator().expect_success();
    let forbidden = with(&format!("Authorization: Bearer {search_only}\r\n"));
    assert_eq!(raw_status(&cluster, &forbidden), 403);
    assert_eq!(cluster.subject_count(0, subject), 1);
    // The operator's client credential may delete; the body is checked by the handler.
    let token = cluster.config.api_token.clone().expect("client credential");
    let allowed = with(&format!("Authorization: Bearer {token}\r\n"));
    assert_eq!(
        raw_status(&cluster, &allowed),
        400,
        "an empty JSON object is a bad request"
    );
    // A body over the limit (64 MiB by default) is refused before it is read.
    let oversize = format!(
        "POST /v1/iris/enroll HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 1000000000\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(raw_status(&cluster, &oversize), 413);
    // Health stays open; an unknown endpoint is not found.
    assert_eq!(
        raw_status(
            &cluster,
            "GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ),
        200
    );
    // Paths no modality declares, the face key pool's retired in 0.13.0 among them, are not
    // found with the operator's client credential, and answer nothing without one.
    for path in [
        "POST /v1/face/refill",
        "GET /v1/face/pool",
        "GET /v1/nowhere",
    ] {
        let (method, path) = path.split_once(' ').expect("method and path");
        let request = |auth: &str| {
            format!(
                "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: 2\r\nConnection: close\r\n{auth}\r\n{{}}"
            )
        };
        let authorised = request(&format!("Authorization: Bearer {token}\r\n"));
        assert_eq!(raw_status(&cluster, &authorised), 404, "{method} {path}");
        let anonymous = raw_status(&cluster, &request(""));
        assert!(
            matches!(anonymous, 401 | 404),
            "{method} {path}: {anonymous}"
        );
    }
    assert_eq!(cluster.record_counts(), [3, 3, 3]);
    // TLS only: the API does not answer plain HTTP, and every party refuses a TCP session
    // without TLS, even with the right password.
    assert!(!answers_plain_http(&cluster));
    for party in 0..3 {
        let mut plain = cluster.coordinator_logins[party].clone();
        plain.ca_cert = None;
        let refused = cluster
            .block_on(privmatch_coordinator::parties::open(&plain))
            .err()
            .map(|e| match e {
                privmatch_coordinator::parties::ConnectError::Pg(e) => e
                    .as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
                other => other.to_string(),
            })
            .unwrap_or_default();
        assert!(
            refused.contains("no encryption"),
            "P{party} accepted or refused a plain session otherwise: {refused:?}"
        );
    }
}

#[test]
fn a_relayed_peer_pin_must_be_signed_by_the_party_operator_and_fresh() {
    use privmatch_coordinator::cli::operator_key::{fresh_counter, load};
    use privmatch_core::crypto::sign::{PeerPin, PEER_PIN_ACTION};
    use privmatch_core::party::PartyIndex;
    const P: [PartyIndex; 3] = PartyIndex::ALL;
    let cluster = Cluster::start("trust-pins", 43);
    let operator = |i: usize| {
        load(&cluster.home.join(format!("operators/p{i}.signing.key"))).expect("operator key")
    };
    let pinned = |party: usize, peer: i32| -> Vec<u8> {
        cluster.query(
            party,
            "SELECT public_key FROM privmatch.peers WHERE party_index = $1",
            &[&peer],
        )[0]
        .get(0)
    };
    let relay = |party: usize, command: &[u8]| {
        cluster.query_as_coordinator(
            party,
            &format!(
                "SELECT privmatch.pin_peer_signed('\\x{}'::bytea)",
                hex::encode(command)
            ),
        )
    };
    let honest = pinned(0, 1);
    // The coordinator's own key in place of P1's, at P0: every forgery is refused with 28000.
    let swap = PeerPin {
        peer: P[1],
        key: [0x42; 32],
        replace: true,
    }
    .encode();
    let forgeries = [
        (
            "signed by P1's operator",
            operator(1).sign(P[0], fresh_counter(), PEER_PIN_ACTION, &swap),
        ),
        (
            "addressed to P2",
            operator(0).sign(P[2], fresh_counter(), PEER_PIN_ACTION, &swap),
        ),
        (
            "for another action",
            operator(0).sign(P[0], fresh_counter(), "face-dealer-config", &swap),
        ),
    ];
    for (what, command) in &forgeries {
        let err = relay(0, command).expect_err(what);
        assert_eq!(err.0, "28000", "{what}: {err:?}");
    }
    assert_eq!(pinned(0, 1), honest, "a refused pin changed nothing");
    // P0's operator's pin of the key already pinned is accepted once; its replay is refused.
    let same = PeerPin {
        peer: P[1],
        key: honest.clone().try_into().expect("32 bytes"),
        replace: false,
    }
    .encode();
    let good = operator(0).sign(P[0], fresh_counter(), PEER_PIN_ACTION, &same);
    relay(0, &good).expect("a signed pin");
    let replayed = relay(0, &good).expect_err("a replayed pin");
    assert_eq!(replayed.0, "28000", "{replayed:?}");
    // A signed pin of another key without replace is refused by the pin's own rule (23505).
    let other = PeerPin {
        peer: P[1],
        key: [0x43; 32],
        replace: false,
    }
    .encode();
    let command = operator(0).sign(P[0], fresh_counter(), PEER_PIN_ACTION, &other);
    assert_eq!(relay(0, &command).expect_err("no replace").0, "23505");
    assert_eq!(pinned(0, 1), honest);
    // Through the coordinator's API with the CLI: the honest pin is relayed and accepted, and
    // searches still work.
    let out = cluster
        .cli(&[
            "party",
            "pin",
            "--party",
            "2",
            "--peer",
            "0",
            "--key",
            &cluster.config.party_keys[0],
        ])
        .expect_success();
    assert!(out.stdout.contains("P2 pinned P0's key"), "{}", out.stdout);
    let templates = cluster.path("t.ndjson");
    let t = templates.display().to_string();
    cluster
        .cli(&["iris", "synth", "5", "-o", &t])
        .expect_success();
    cluster.enroll(&templates, &[]).expect_success();
    let found = cluster
        .cli(&["iris", "search", "--input", &t, "--json"])
        .expect_success();
    assert_eq!(
        found.stdout.matches("\"matches\":[{").count(),
        5,
        "{}",
        found.stdout
    );
}
