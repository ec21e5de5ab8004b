//! The upgrade paths (`migrations/privmatch--0.1.0--0.2.0.sql`, then `--0.2.0--0.3.0.sql`, then
//! `--0.3.0--0.4.0.sql`, then `--0.4.0--0.5.0.sql`, then `--0.5.0--0.6.0.sql`, then
//! `--0.6.0--0.7.0.sql`, then `--0.7.0--0.8.0.sql`, then `--0.8.0--0.9.0.sql`, then
//! `--0.9.0--0.10.0.sql`, then `--0.10.0--0.11.0.sql`, then `--0.11.0--0.12.0.sql`, then
//! `--0.12.0--0.13.0.sql`, then `--0.13.0--0.14.0.sql`, then `--0.14.0--0.15.0.sql`, then
//! `--0.15.0--0.16.0.sql`): a
//! party created with the released 0.1.0 schema (the released install scripts are kept in
//! `tests/upgrade/`), holding an identity (secret key in the 0.1.0 column), pinned peers and
//! enrolled templates, is upgraded with `ALTER EXTENSION privmatch UPDATE` under the current
//! library; it must then have the catalog of a fresh install (functions, grants, types,
//! tables, dumped tables), its key in the key file and out of every table, the same
//! templates, and still search: its engine opens a probe sealed to its (unchanged) public key
//! and scans every enrolled template. A party created at 0.2.0 must likewise reach the
//! catalog of a fresh install, and so must parties created at 0.3.0, 0.4.0, 0.5.0, 0.6.0,
//! 0.7.0, 0.8.0, 0.9.0, 0.10.0, 0.11.0, 0.12.0, 0.13.0, 0.14.0 and 0.15.0 (the released scripts of each, kept
//! verbatim). The 0.10.0 party is a face dealer with θ and its template master key K in the
//! clear: after the upgrade both are sealed under its key file and open to the values it held.
//! The 0.12.0 party holds a session of the retired face key pool still running and a finished
//! one over dealer-masked templates: after the upgrade the first is aborted and both rows stay.
//!
//! The 0.1.0 rows are written by SQL, as the 0.1.0 functions would have left them (the 0.1.0
//! library is not built here; the rows are plain data of the 0.1.0 tables).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use privmatch_core::crypto::at_rest::AtRestKey;
use privmatch_core::crypto::seal::PartySecretKey;
use privmatch_core::iris::encoding::share_template;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{seal_iris_probe, ProbeContext};
use privmatch_core::iris::synth::random_template;
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::{decode_share, encode_share, format_share_text, ShareKind};
use privmatch_e2e::{pg_bindir, run, wait_until};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

const PORT: u16 = 16990;
/// The released install scripts kept in `tests/upgrade/`.
const OLD_SCRIPTS: [&str; 15] = [
    "privmatch--0.1.0.sql",
    "privmatch--0.2.0.sql",
    "privmatch--0.3.0.sql",
    "privmatch--0.4.0.sql",
    "privmatch--0.5.0.sql",
    "privmatch--0.6.0.sql",
    "privmatch--0.7.0.sql",
    "privmatch--0.8.0.sql",
    "privmatch--0.9.0.sql",
    "privmatch--0.10.0.sql",
    "privmatch--0.11.0.sql",
    "privmatch--0.12.0.sql",
    "privmatch--0.13.0.sql",
    "privmatch--0.14.0.sql",
    "privmatch--0.15.0.sql",
];

/// Everything the catalog says about the extension's objects, one line each, sorted.
const CATALOG: &str = "
SELECT string_agg(x, E'\\n' ORDER BY x) FROM (
  SELECT 'function ' || p.oid::regprocedure::text || ' -> ' || pg_get_function_result(p.oid)
         || ' secdef=' || p.prosecdef || ' config=' || coalesce(array_to_string(p.proconfig, ','), '')
         || ' vol=' || p.provolatile::text || ' strict=' || p.proisstrict || ' par=' || p.proparallel::text
         || ' acl=' || coalesce(p.proacl::text, '') || ' src=' || p.prosrc
         || ' args=' || coalesce(pg_get_function_arguments(p.oid), '')
    FROM pg_proc p WHERE p.pronamespace = 'privmatch'::regnamespace
  UNION ALL
  SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
         || ' notnull=' || a.attnotnull || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
         || ' identity=' || a.attidentity::text || ' storage=' || a.attstorage::text
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE c.relnamespace = 'privmatch'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'relation ' || c.relname || ' kind=' || c.relkind::text || ' persistence=' || c.relpersistence::text
         || ' acl=' || coalesce(c.relacl::text, '')
    FROM pg_class c WHERE c.relnamespace = 'privmatch'::regnamespace
  UNION ALL
  SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'privmatch'::regnamespace
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
   WHERE c.relnamespace = 'privmatch'::regnamespace
  UNION ALL
  SELECT 'trigger ' || pg_get_triggerdef(t.oid)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
   WHERE c.relnamespace = 'privmatch'::regnamespace AND NOT t.tgisinternal
  UNION ALL
  SELECT 'view ' || c.relname || ' ' || pg_get_viewdef(c.oid)
    FROM pg_class c WHERE c.relnamespace = 'privmatch'::regnamespace AND c.relkind = 'v'
  UNION ALL
  SELECT 'type ' || t.typname || ' acl=' || coalesce(t.typacl::text, '')
    FROM pg_type t WHERE t.typnamespace = 'privmatch'::regnamespace
  UNION ALL
  SELECT 'cast ' || format_type(castsource, NULL) || ' -> ' || format_type(casttarget, NULL) || ' ' || castcontext::text
    FROM pg_cast WHERE castfunc IN (SELECT oid FROM pg_proc WHERE pronamespace = 'privmatch'::regnamespace)
  UNION ALL
  SELECT 'schema acl=' || coalesce(nspacl::text, '') FROM pg_namespace WHERE nspname = 'privmatch'
  UNION ALL
  SELECT 'extension ' || extversion || ' dumps '
         || coalesce((SELECT string_agg(c::regclass::text, ',' ORDER BY c::regclass::text) FROM unnest(extconfig) c), '')
    FROM pg_extension WHERE extname = 'privmatch'
  UNION ALL
  SELECT 'member ' || pg_describe_object(classid, objid, 0)
    FROM pg_depend
   WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
     AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'privmatch')
) s(x)";

fn pg_config(flag: &str) -> PathBuf {
    // The `pg_config` on PATH, as for the clusters (`pg_bindir`): the old scripts must go to
    // the PostgreSQL the test runs.
    let out = Command::new("pg_config")
        .arg(flag)
        .output()
        .expect("pg_config");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A throwaway PostgreSQL cluster run as `postgres`, removed on drop.
struct Server {
    dir: PathBuf,
    old_scripts: Vec<PathBuf>,
}

impl Server {
    fn as_postgres(program: &Path) -> Command {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    }

    fn start(dir: &Path) -> Server {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("dir");
        let mut chown = Command::new("chown");
        chown.args(["postgres:", &dir.display().to_string()]);
        run(chown, Duration::from_secs(10)).expect_success();
        // The released install scripts, so that CREATE EXTENSION … VERSION '0.1.0' works.
        let mut old_scripts = Vec::new();
        for script in OLD_SCRIPTS {
            let installed = pg_config("--sharedir").join("extension").join(script);
            std::fs::copy(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("upgrade")
                    .join(script),
                &installed,
            )
            .unwrap_or_else(|e| panic!("install {script}: {e}"));
            old_scripts.push(installed);
        }
        let server = Server {
            dir: dir.to_path_buf(),
            old_scripts,
        };
        let data = dir.join("data");
        let mut initdb = Self::as_postgres(&pg_bindir().join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "--no-locale",
            "-E",
            "UTF8",
        ]);
        run(initdb, Duration::from_secs(120)).expect_success();
        let conf = format!(
            "port = {PORT}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             shared_preload_libraries = 'privmatch'\nprivmatch.database = 'party'\n\
             privmatch.key_file = '{}'\nmax_prepared_transactions = 8\n",
            dir.display(),
            dir.join("party.key").display()
        );
        let path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).expect("conf");
        text.push_str(&conf);
        std::fs::write(&path, text).expect("conf");
        let mut start = Self::as_postgres(&pg_bindir().join("pg_ctl"));
        start
            .args(["start", "-w", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(dir.join("postgres.log"));
        run(start, Duration::from_secs(60)).expect_success();
        server
    }

    fn client(&self, db: &str) -> postgres_sync::Client {
        postgres_sync::Client::connect(&format!(
            "host=127.0.0.1 port={PORT} user=postgres dbname={db}"
        ))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for script in &self.old_scripts {
            let _ = std::fs::remove_file(script);
        }
        let mut stop = Self::as_postgres(&pg_bindir().join("pg_ctl"));
        stop.args(["stop", "-m", "immediate", "-D"])
            .arg(self.dir.join("data"));
        let _ = stop.output();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.join("postgres.log")) {
                eprintln!("--- postgres.log ---\n{log}");
            }
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A blocking wrapper over tokio-postgres, enough for this test.
mod postgres_sync {
    pub struct Client {
        rt: tokio::runtime::Runtime,
        client: tokio_postgres::Client,
    }

    impl Client {
        pub fn connect(conn: &str) -> Client {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let client = rt.block_on(async {
                let (client, connection) = tokio_postgres::connect(conn, tokio_postgres::NoTls)
                    .await
                    .unwrap_or_else(|e| panic!("connecting ({conn}): {e}"));
                tokio::spawn(connection);
                client
            });
            Client { rt, client }
        }

        pub fn execute(&self, sql: &str) {
            self.rt
                .block_on(self.client.batch_execute(sql))
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        }

        pub fn try_query(
            &self,
            sql: &str,
            params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
            self.rt.block_on(self.client.query(sql, params))
        }

        pub fn query(
            &self,
            sql: &str,
            params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        ) -> Vec<tokio_postgres::Row> {
            self.rt
                .block_on(self.client.query(sql, params))
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        }
    }
}

/// Fails listing the differences when the catalog of a party upgraded from `from` is not
/// that of a fresh install.
fn assert_same_catalog(from: &str, upgraded: &str, expected: &str) {
    if upgraded != expected {
        let a: Vec<&str> = upgraded.lines().collect();
        let b: Vec<&str> = expected.lines().collect();
        let only_upgraded: Vec<_> = a.iter().filter(|l| !b.contains(l)).collect();
        let only_fresh: Vec<_> = b.iter().filter(|l| !a.contains(l)).collect();
        panic!("catalogs differ after the upgrade from {from}:\nonly after the upgrade: {only_upgraded:#?}\nonly in a fresh install: {only_fresh:#?}");
    }
}

#[test]
fn older_parties_upgrade_to_the_catalog_of_a_fresh_install_and_keep_matching() {
    let server = Server::start(Path::new("/tmp/pm-e2e-upgrade"));
    let mut rng = ChaCha20Rng::seed_from_u64(2024);
    let admin = server.client("postgres");
    admin.execute("CREATE DATABASE party");
    admin.execute("CREATE DATABASE fresh");
    admin.execute("CREATE DATABASE at_0_2_0");
    admin.execute("CREATE DATABASE at_0_3_0");
    admin.execute("CREATE DATABASE at_0_4_0");
    admin.execute("CREATE DATABASE at_0_5_0");
    admin.execute("CREATE DATABASE at_0_6_0");
    admin.execute("CREATE DATABASE at_0_7_0");
    admin.execute("CREATE DATABASE at_0_8_0");
    admin.execute("CREATE DATABASE at_0_9_0");
    admin.execute("CREATE DATABASE at_0_10_0");
    admin.execute("CREATE DATABASE at_0_11_0");
    admin.execute("CREATE DATABASE at_0_12_0");
    admin.execute("CREATE DATABASE at_0_13_0");
    admin.execute("CREATE DATABASE at_0_14_0");
    admin.execute("CREATE DATABASE at_0_15_0");

    // A party at 0.1.0: P1 with its key pair in the identity table, two pinned peers and 20
    // enrolled templates (its Shamir shares).
    let party = server.client("party");
    party.execute("CREATE EXTENSION privmatch VERSION '0.1.0'");
    let me = PartyIndex::ALL[1];
    let secrets: Vec<PartySecretKey> = (0..3).map(|_| PartySecretKey::generate(&mut rng)).collect();
    let publics: [_; 3] = std::array::from_fn(|i| secrets[i].public_key());
    party.query(
        "INSERT INTO privmatch.party_identity (party_index, public_key, secret_key) VALUES (1, $1, $2)",
        &[&publics[1].as_bytes().to_vec(), &secrets[1].to_bytes().to_vec()],
    );
    for peer in [0usize, 2] {
        party.query(
            "INSERT INTO privmatch.peers (party_index, public_key) VALUES ($1, $2)",
            &[&(peer as i32), &publics[peer].as_bytes().to_vec()],
        );
    }
    let templates: Vec<_> = (0..20).map(|_| random_template(&mut rng)).collect();
    for (i, t) in templates.iter().enumerate() {
        let share = share_template(t, &mut rng)
            .expect("share")
            .into_iter()
            .find(|s| s.party == me)
            .expect("P1's share");
        let text = |kind: ShareKind, coefs: &[u16]| {
            let bytes = encode_share(kind, me, coefs);
            format_share_text(&decode_share(kind, &bytes).expect("share layout"))
        };
        party.query(
            "INSERT INTO privmatch.iris_templates (subject, eye, code_share, mask_share) \
             VALUES ($1, 'left', $2::text::privmatch.iris_code_share, $3::text::privmatch.iris_mask_share)",
            &[
                &format!("s{i:03}"),
                &text(ShareKind::IrisCode, &share.code),
                &text(ShareKind::IrisMask, &share.mask),
            ],
        );
    }
    let shares_sql = "SELECT subject, privmatch.iris_code_share_send(code_share), \
                      privmatch.iris_mask_share_send(mask_share) FROM privmatch.iris_templates ORDER BY subject";
    let rows = |c: &postgres_sync::Client| -> Vec<(String, Vec<u8>, Vec<u8>)> {
        c.query(shares_sql, &[])
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    };
    let before = rows(&party);

    // The upgrade, under the current library, through every script on the way.
    party.execute("ALTER EXTENSION privmatch UPDATE");
    let fresh = server.client("fresh");
    fresh.execute("CREATE EXTENSION privmatch");
    let catalog = |c: &postgres_sync::Client| -> String { c.query(CATALOG, &[])[0].get(0) };
    let expected = catalog(&fresh);
    // Functions, columns, grants, …: a fingerprint of well over a hundred lines.
    assert!(expected.lines().count() > 100, "{expected}");
    assert_same_catalog("0.1.0", &catalog(&party), &expected);
    let at_0_2_0 = server.client("at_0_2_0");
    at_0_2_0.execute("CREATE EXTENSION privmatch VERSION '0.2.0'");
    at_0_2_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.2.0", &catalog(&at_0_2_0), &expected);
    let at_0_3_0 = server.client("at_0_3_0");
    at_0_3_0.execute("CREATE EXTENSION privmatch VERSION '0.3.0'");
    at_0_3_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.3.0", &catalog(&at_0_3_0), &expected);
    let at_0_4_0 = server.client("at_0_4_0");
    at_0_4_0.execute("CREATE EXTENSION privmatch VERSION '0.4.0'");
    at_0_4_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.4.0", &catalog(&at_0_4_0), &expected);
    let at_0_5_0 = server.client("at_0_5_0");
    at_0_5_0.execute("CREATE EXTENSION privmatch VERSION '0.5.0'");
    at_0_5_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.5.0", &catalog(&at_0_5_0), &expected);
    let at_0_6_0 = server.client("at_0_6_0");
    at_0_6_0.execute("CREATE EXTENSION privmatch VERSION '0.6.0'");
    at_0_6_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.6.0", &catalog(&at_0_6_0), &expected);
    let at_0_7_0 = server.client("at_0_7_0");
    at_0_7_0.execute("CREATE EXTENSION privmatch VERSION '0.7.0'");
    at_0_7_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.7.0", &catalog(&at_0_7_0), &expected);
    let at_0_8_0 = server.client("at_0_8_0");
    at_0_8_0.execute("CREATE EXTENSION privmatch VERSION '0.8.0'");
    at_0_8_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.8.0", &catalog(&at_0_8_0), &expected);
    let at_0_9_0 = server.client("at_0_9_0");
    at_0_9_0.execute("CREATE EXTENSION privmatch VERSION '0.9.0'");
    at_0_9_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.9.0", &catalog(&at_0_9_0), &expected);
    let at_0_11_0 = server.client("at_0_11_0");
    at_0_11_0.execute("CREATE EXTENSION privmatch VERSION '0.11.0'");
    at_0_11_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.11.0", &catalog(&at_0_11_0), &expected);
    // A 0.12.0 evaluator with a running session of the retired key pool and a finished session
    // over dealer-masked templates: the pool's session is aborted (nothing can run it any
    // more), both rows stay as history.
    let at_0_12_0 = server.client("at_0_12_0");
    at_0_12_0.execute("CREATE EXTENSION privmatch VERSION '0.12.0'");
    at_0_12_0.query(
        "INSERT INTO privmatch.face_sessions \
         (session, metric, dim, template_ids, set_digest, claims, masked) \
         VALUES ($1, 'cosine', 128, '{1}', '\\x00', '\\x00', false)",
        &[&vec![1u8; 16]],
    );
    at_0_12_0.query(
        "INSERT INTO privmatch.face_sessions \
         (session, dim, template_ids, set_digest, claims, round, finished_at, masked) \
         VALUES ($1, 128, '{}', '\\x00', '', 3, now(), true)",
        &[&vec![2u8; 16]],
    );
    // Under this library, before the update, the retired pool functions the 0.12.0 script
    // created only refuse, naming the retirement (their C symbols are stubs).
    for call in [
        "SELECT * FROM privmatch.face_pool_status()",
        "SELECT * FROM privmatch.face_dealer_generate(1)",
    ] {
        let err = at_0_12_0.try_query(call, &[]).expect_err(call);
        let db = err.as_db_error().expect("a database error");
        assert_eq!(db.code().code(), "0A000", "{call}: {db:?}");
        assert!(
            db.message().contains("retired in privmatch 0.13.0"),
            "{call}: {db:?}"
        );
    }
    at_0_12_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.12.0", &catalog(&at_0_12_0), &expected);
    let sessions: Vec<(Vec<u8>, bool, bool, bool)> = at_0_12_0
        .query(
            "SELECT session, masked, aborted, finished_at IS NOT NULL \
               FROM privmatch.face_sessions ORDER BY session",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        sessions,
        vec![
            (vec![1u8; 16], false, true, true),
            (vec![2u8; 16], true, false, true)
        ]
    );
    // A 0.13.0 party: the verification functions change signature (P2 deals from the session
    // id alone; the evaluators' opens no longer answer a request for P2).
    let at_0_13_0 = server.client("at_0_13_0");
    at_0_13_0.execute("CREATE EXTENSION privmatch VERSION '0.13.0'");
    at_0_13_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.13.0", &catalog(&at_0_13_0), &expected);
    // A 0.14.0 party: the batch functions are new.
    let at_0_14_0 = server.client("at_0_14_0");
    at_0_14_0.execute("CREATE EXTENSION privmatch VERSION '0.14.0'");
    at_0_14_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.14.0", &catalog(&at_0_14_0), &expected);
    // A 0.15.0 party: the enrolment batch function is new.
    let at_0_15_0 = server.client("at_0_15_0");
    at_0_15_0.execute("CREATE EXTENSION privmatch VERSION '0.15.0'");
    at_0_15_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.15.0", &catalog(&at_0_15_0), &expected);
    // A 0.10.0 dealer with θ and K in the clear (the identity of the 0.1.0 party above, whose
    // key file its upgrade wrote): both come out sealed under the key file.
    let at_0_10_0 = server.client("at_0_10_0");
    at_0_10_0.execute("CREATE EXTENSION privmatch VERSION '0.10.0'");
    at_0_10_0.query(
        "INSERT INTO privmatch.party_identity (party_index, public_key) VALUES (1, $1)",
        &[&publics[1].as_bytes().to_vec()],
    );
    let theta = 0.6180339887_f64;
    at_0_10_0.query(
        "INSERT INTO privmatch.face_dealer (metric, dim, threshold, generation) \
         VALUES ('cosine', 128, $1, 1)",
        &[&theta],
    );
    at_0_10_0.query(
        "INSERT INTO privmatch.face_template_master (master_key) VALUES ($1)",
        &[&vec![9u8; 32]],
    );
    at_0_10_0.execute("ALTER EXTENSION privmatch UPDATE");
    assert_same_catalog("0.10.0", &catalog(&at_0_10_0), &expected);
    let sealed: Vec<u8> =
        at_0_10_0.query("SELECT threshold_sealed FROM privmatch.face_dealer", &[])[0].get(0);
    let opened = AtRestKey::derive(&secrets[1], PartyIndex::ALL[1], "face-dealer-threshold")
        .open(&sealed)
        .expect("θ opens under the key file");
    assert_eq!(opened.as_slice(), theta.to_bits().to_be_bytes().as_slice());
    let sealed: Vec<u8> = at_0_10_0.query(
        "SELECT master_key_sealed FROM privmatch.face_template_master",
        &[],
    )[0]
    .get(0);
    let opened = AtRestKey::derive(&secrets[1], PartyIndex::ALL[1], "face-template-master")
        .open(&sealed)
        .expect("K opens under the key file");
    assert_eq!(opened.as_slice(), [9u8; 32].as_slice());

    // The key: same identity, in the key file (0600), in no column.
    let info = party.query(
        "SELECT party_index, public_key FROM privmatch.party_info()",
        &[],
    );
    assert_eq!(info[0].get::<_, i32>(0), 1);
    assert_eq!(info[0].get::<_, String>(1), publics[1].to_hex());
    let key_file = server.dir.join("party.key");
    let text = std::fs::read_to_string(&key_file).expect("key file written by the upgrade");
    assert!(text.contains(&hex::encode(secrets[1].to_bytes())));
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&key_file).expect("meta"));
    assert_eq!(mode & 0o777, 0o600);
    let secret_columns = party.query(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'privmatch' AND column_name LIKE '%secret%'",
        &[],
    );
    assert_eq!(secret_columns[0].get::<_, i64>(0), 0);

    // The templates, unchanged; and the party still searches them: its engine opens a probe
    // sealed to its public key and scans all 20.
    assert_eq!(rows(&party), before);
    let params = SearchParams::new(SearchMode::Identify, 15, 0.345).expect("params");
    let session: [u8; 16] = rand::Rng::gen(&mut rng);
    let context = ProbeContext {
        session,
        eye: Eye::Left,
        params,
        sealed_at: privmatch_coordinator::cli::keys::sealing_time(),
    };
    let sealed = seal_iris_probe(&templates[3], &context, &publics, &mut rng).expect("seal");
    let mut entries = 0i64;
    wait_until(
        Duration::from_secs(60),
        "the engine to serve the upgraded party",
        || {
            let got = party.try_query(
                "SELECT entries FROM privmatch.iris_search_start($1, $2)",
                &[&session.as_slice(), &sealed[1]],
            );
            entries = got.map_or(-1, |rows| rows[0].get(0));
            entries >= 0
        },
    );
    assert_eq!(entries, 20);
}
