//! End-to-end tests of the parties' search functions over SQL, driven here the way the
//! coordinator drives them (start at the three parties, then rounds routing party i's message
//! to party i+1), against three real PostgreSQL parties with the engine worker: results
//! against the plaintext matcher, refused messages abort, a party killed mid-search fails the
//! search cleanly and the next search works, a search cancelled mid-scan stops the scan, the
//! scan backend `engine_status()` reports (`privmatch.gpu = auto`, the default, and `on` where
//! no GPU can be used: the engine starts anyway and scans on the CPU).

use std::collections::BTreeMap;

use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{seal_iris_probe, ProbeContext};
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate};
use privmatch_e2e::{by_key, privmatch, read_ndjson, wait_until, Cluster, RecordKey};
use privmatch_e2e::{failure, Failure};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio_postgres::Client;

/// The outcome of one search at the three parties.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Subjects(Vec<String>),
    Unique(bool),
}

/// Seals `probe` for `session` with the parameters `start` calls the parties with (`mode`,
/// `max_rotation`, threshold 0.345), sealed now.
fn seal(
    cluster: &Cluster,
    probe: &IrisTemplate,
    eye: Eye,
    session: [u8; 16],
    mode: &str,
    max_rotation: i32,
    rng: &mut ChaCha20Rng,
) -> [Vec<u8>; 3] {
    let mode = SearchMode::parse(mode).expect("mode");
    let context = ProbeContext {
        session,
        eye,
        params: SearchParams::new(mode, max_rotation, 0.345).expect("params"),
        sealed_at: privmatch_coordinator::cli::keys::sealing_time(),
    };
    seal_iris_probe(probe, &context, &cluster.party_keys(), rng).expect("seal")
}

async fn start(
    clients: &[Client],
    session: &[u8],
    sealed: &[Vec<u8>; 3],
    mode: &str,
    max_rotation: i32,
) -> Result<Vec<(i64, Vec<u8>, Vec<u8>)>, Failure> {
    let mut out = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let row = c
            .query_one(
                "SELECT entries, set_digest, message FROM privmatch.iris_search_start($1, $2, $3, $4, 0.345)",
                &[&session, &sealed[i], &mode, &max_rotation],
            )
            .await
            .map_err(|e| failure(i, &e))?;
        out.push((row.get(0), row.get(1), row.get(2)));
    }
    Ok(out)
}

async fn round(
    client: &Client,
    party: usize,
    session: &[u8],
    k: i32,
    message: &[u8],
) -> Result<(Option<Vec<u8>>, bool, Option<bool>, Option<Vec<String>>), Failure> {
    let row = client
        .query_one(
            "SELECT message, finished, is_unique, subjects FROM privmatch.iris_search_round($1, $2, $3)",
            &[&session, &k, &message],
        )
        .await
        .map_err(|e| failure(party, &e))?;
    Ok((row.get(0), row.get(1), row.get(2), row.get(3)))
}

/// Runs the rounds from the start messages to the output; all three parties must agree.
async fn drive(
    clients: &[Client],
    session: &[u8],
    first: Vec<Vec<u8>>,
) -> Result<Outcome, Failure> {
    let mut messages = first;
    for k in 0..64 {
        let mut replies = Vec::new();
        for (i, c) in clients.iter().enumerate() {
            replies.push(round(c, i, session, k, &messages[(i + 2) % 3]).await?);
        }
        if replies.iter().all(|r| r.1) {
            let outcomes: Vec<Outcome> = replies
                .into_iter()
                .map(|(_, _, unique, subjects)| match (unique, subjects) {
                    (Some(u), _) => Outcome::Unique(u),
                    (None, Some(s)) => Outcome::Subjects(s),
                    _ => panic!("finished without output"),
                })
                .collect();
            assert!(outcomes.windows(2).all(|w| w[0] == w[1]), "{outcomes:?}");
            return Ok(outcomes.into_iter().next().expect("three outcomes"));
        }
        assert!(
            replies.iter().all(|r| !r.1),
            "parties finished in different rounds"
        );
        messages = replies.into_iter().map(|r| r.0.expect("message")).collect();
    }
    panic!("search did not finish in 64 rounds");
}

async fn search(
    cluster: &Cluster,
    clients: &[Client],
    rng: &mut ChaCha20Rng,
    probe: &IrisTemplate,
    eye: Eye,
    mode: &str,
    max_rotation: i32,
) -> Result<Outcome, Failure> {
    let session: [u8; 16] = rng.gen();
    let sealed = seal(cluster, probe, eye, session, mode, max_rotation, rng);
    let starts = start(clients, &session, &sealed, mode, max_rotation).await?;
    assert!(starts
        .windows(2)
        .all(|w| w[0].0 == w[1].0 && w[0].1 == w[1].1));
    drive(clients, &session, starts.into_iter().map(|s| s.2).collect()).await
}

fn plain_matches(
    enrolled: &BTreeMap<RecordKey, IrisTemplate>,
    probe: &IrisTemplate,
    eye: Eye,
    max_rotation: i32,
) -> Vec<String> {
    enrolled
        .iter()
        .filter(|((_, e), _)| e == eye.as_str())
        .filter(|(_, t)| {
            (-max_rotation..=max_rotation).any(|k| {
                let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
                common > 0 && u64::from(hd) * 10_000 < 3_450 * u64::from(common)
            })
        })
        .map(|((s, _), _)| s.clone())
        .collect()
}

fn enroll_synthetic(cluster: &Cluster, count: usize) -> BTreeMap<RecordKey, IrisTemplate> {
    let path = cluster.path("enrol.ndjson");
    privmatch(&[
        "iris",
        "synth",
        &count.to_string(),
        "--seed",
        "31",
        "-o",
        &path.display().to_string(),
    ])
    .expect_success();
    cluster.enroll(&path, &[]).expect_success();
    by_key(&read_ndjson(&path))
}

#[test]
fn sql_search_rounds_match_the_plaintext_reference() {
    let cluster = Cluster::start("search-sql", 20);
    let enrolled = enroll_synthetic(&cluster, 200);
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let templates: Vec<(RecordKey, IrisTemplate)> =
        enrolled.iter().map(|(k, t)| (k.clone(), *t)).collect();
    cluster.block_on(async {
        let clients = cluster.clients().await;
        for (i, ((_, eye), t)) in templates.iter().take(16).enumerate() {
            let eye = Eye::parse(eye).expect("eye");
            let flip = [0.05, 0.3, 0.345, 0.4][i % 4];
            let probe = near_duplicate(t, flip, (i as i32 % 31) - 15, &mut rng);
            for max_rotation in [0, 15] {
                let expected = plain_matches(&enrolled, &probe, eye, max_rotation);
                let got = search(
                    &cluster,
                    &clients,
                    &mut rng,
                    &probe,
                    eye,
                    "identify",
                    max_rotation,
                )
                .await
                .expect("search");
                assert_eq!(
                    got,
                    Outcome::Subjects(expected.clone()),
                    "probe {i}, rotation {max_rotation}"
                );
                let unique = search(
                    &cluster,
                    &clients,
                    &mut rng,
                    &probe,
                    eye,
                    "uniqueness",
                    max_rotation,
                )
                .await
                .expect("uniqueness");
                assert_eq!(unique, Outcome::Unique(expected.is_empty()));
            }
        }
        let stranger = random_template(&mut rng);
        let got = search(
            &cluster,
            &clients,
            &mut rng,
            &stranger,
            Eye::Left,
            "identify",
            15,
        )
        .await;
        assert_eq!(got.expect("search"), Outcome::Subjects(vec![]));
        // Nothing stays behind in the engines. They scan with what `privmatch.gpu = auto`
        // (the default) found: the GPUs, or the CPU with the reason.
        for c in &clients {
            let row = c
                .query_one(
                    "SELECT sessions, kernel FROM privmatch.engine_status()",
                    &[],
                )
                .await
                .expect("status");
            assert_eq!(row.get::<_, i32>(0), 0);
            let kernel: String = row.get(1);
            assert!(
                kernel.starts_with("gpu: ") || kernel.contains(" (GPU unavailable: "),
                "{kernel}"
            );
        }
    });
}

/// `engine_status()` of every party: (state, kernel, threads).
fn engine_status(cluster: &Cluster) -> Vec<(String, String, i32)> {
    (0..3)
        .map(|p| {
            let row = &cluster.query(
                p,
                "SELECT state, kernel, threads FROM privmatch.engine_status()",
                &[],
            )[0];
            (row.get(0), row.get(1), row.get(2))
        })
        .collect()
}

#[test]
fn with_gpu_on_and_no_usable_gpu_the_engine_starts_and_searches_on_the_cpu() {
    let cluster = Cluster::start("search-gpu-on", 28);
    let enrolled = enroll_synthetic(&cluster, 40);
    // GPUs required, on a device no machine has (so that the test means the same on a
    // machine with GPUs); the engines read the settings when they start, so they are
    // restarted (the postmaster starts a terminated engine again after two seconds).
    for p in 0..3 {
        cluster.query(p, "ALTER SYSTEM SET privmatch.gpu = 'on'", &[]);
        cluster.query(p, "ALTER SYSTEM SET privmatch.gpu_devices = '999'", &[]);
        cluster.query(p, "SELECT pg_reload_conf()", &[]);
        cluster.query(
            p,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'privmatch engine'",
            &[],
        );
    }
    let required = " (privmatch.gpu = on, but no GPU is in use: ";
    wait_until(
        std::time::Duration::from_secs(30),
        "the engines to restart with privmatch.gpu = on",
        || {
            engine_status(&cluster)
                .iter()
                .all(|(_, kernel, _)| kernel.contains(required))
        },
    );
    // A warning with the reason in the server log.
    let log = std::fs::read_to_string(cluster.home.join("p0/postgres.log")).unwrap_or_default();
    assert!(
        log.contains(
            "WARNING:  privmatch engine: privmatch.gpu = on, but the GPU scan cannot be used ("
        ),
        "no warning in p0/postgres.log"
    );
    // Searches answer on the CPU, as the plaintext matcher does.
    let templates: Vec<(RecordKey, IrisTemplate)> =
        enrolled.iter().map(|(k, t)| (k.clone(), *t)).collect();
    let mut rng = ChaCha20Rng::seed_from_u64(28);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        for (i, ((_, eye), t)) in templates.iter().take(4).enumerate() {
            let eye = Eye::parse(eye).expect("eye");
            let probe = near_duplicate(t, [0.05, 0.4][i % 2], 3 - i as i32, &mut rng);
            let expected = plain_matches(&enrolled, &probe, eye, 15);
            let got = search(&cluster, &clients, &mut rng, &probe, eye, "identify", 15)
                .await
                .expect("search");
            assert_eq!(got, Outcome::Subjects(expected.clone()), "probe {i}");
            let unique = search(&cluster, &clients, &mut rng, &probe, eye, "uniqueness", 15)
                .await
                .expect("uniqueness");
            assert_eq!(unique, Outcome::Unique(expected.is_empty()), "probe {i}");
        }
    });
    for (state, kernel, threads) in engine_status(&cluster) {
        assert_eq!(state, "ready");
        assert!(kernel.contains(required), "{kernel}");
        assert!(threads > 0);
    }
}

#[test]
fn refused_round_messages_abort_the_search() {
    let cluster = Cluster::start("search-abort", 21);
    let enrolled = enroll_synthetic(&cluster, 20);
    let (key, t) = enrolled
        .iter()
        .next()
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let eye = Eye::parse(&key.1).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(6);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        // A tampered message: 08P01 at the receiver, which drops the search (42704 after).
        let session: [u8; 16] = rng.gen();
        let sealed = seal(&cluster, &t, eye, session, "identify", 15, &mut rng);
        let starts = start(&clients, &session, &sealed, "identify", 15)
            .await
            .expect("start");
        let mut tampered = starts[2].2.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 0x40;
        let err = round(&clients[0], 0, &session, 0, &tampered)
            .await
            .expect_err("tampered");
        assert_eq!(
            (err.party, err.sqlstate.as_deref()),
            (0, Some("08P01")),
            "{err:?}"
        );
        assert!(err.message.contains("authentication failed"), "{err:?}");
        let err = round(&clients[0], 0, &session, 0, &starts[2].2)
            .await
            .expect_err("gone");
        assert_eq!(err.sqlstate.as_deref(), Some("42704"), "{err:?}");
        // A message replayed into the next round, and a message of another sender.
        let ok = round(&clients[1], 1, &session, 0, &starts[0].2)
            .await
            .expect("P1 round 0");
        assert!(!ok.1);
        let err = round(&clients[1], 1, &session, 1, &starts[0].2)
            .await
            .expect_err("replay");
        assert_eq!(err.sqlstate.as_deref(), Some("08P01"), "{err:?}");
        let err = round(&clients[2], 2, &session, 0, &starts[0].2)
            .await
            .expect_err("misrouted");
        assert_eq!(err.sqlstate.as_deref(), Some("08P01"), "{err:?}");
        // A reused session id and a probe sealed for another session are refused.
        let err = start(&clients, &session, &sealed, "identify", 15)
            .await
            .expect_err("reuse");
        assert_eq!(err.sqlstate.as_deref(), Some("42704"), "{err:?}");
        let fresh: [u8; 16] = rng.gen();
        let err = start(&clients, &fresh, &sealed, "identify", 15)
            .await
            .expect_err("other session");
        assert_eq!(err.sqlstate.as_deref(), Some("22P03"), "{err:?}");
        // Bad parameters name the argument.
        let err = start(&clients, &rng.gen::<[u8; 16]>(), &sealed, "lookup", 15)
            .await
            .expect_err("mode");
        assert_eq!(err.sqlstate.as_deref(), Some("22023"), "{err:?}");
        assert!(err.message.contains("mode"), "{err:?}");
        for c in &clients {
            let _ = c
                .execute(
                    "SELECT privmatch.iris_search_abort($1)",
                    &[&session.as_slice()],
                )
                .await;
        }
        // The next search works and finds the template.
        let got = search(&cluster, &clients, &mut rng, &t, eye, "identify", 15)
            .await
            .expect("fresh");
        assert_eq!(got, Outcome::Subjects(vec![key.0.clone()]));
    });
}

#[test]
fn a_party_killed_mid_search_fails_it_cleanly_and_the_next_search_works() {
    let cluster = Cluster::start("search-kill", 22);
    let enrolled = enroll_synthetic(&cluster, 30);
    let (key, t) = enrolled
        .iter()
        .nth(3)
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let eye = Eye::parse(&key.1).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let session: [u8; 16] = rng.gen();
    let sealed = seal(&cluster, &t, eye, session, "identify", 15, &mut rng);
    let starts = cluster.block_on(async {
        let clients = cluster.clients().await;
        start(&clients, &session, &sealed, "identify", 15)
            .await
            .expect("start")
    });
    cluster.kill_party(1);
    cluster.start_party(1);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        // The restarted party has lost the search: a clear error, not a wrong answer.
        let err = round(&clients[1], 1, &session, 0, &starts[0].2)
            .await
            .expect_err("lost");
        assert_eq!(
            (err.party, err.sqlstate.as_deref()),
            (1, Some("42704")),
            "{err:?}"
        );
        assert!(err.message.contains("not running"), "{err:?}");
        for c in &clients {
            let _ = c
                .execute(
                    "SELECT privmatch.iris_search_abort($1)",
                    &[&session.as_slice()],
                )
                .await;
        }
    });
    // The engine reloads the templates from the table (the start call waits for the engine
    // to come up); the next search finds the template.
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let got = search(&cluster, &clients, &mut rng, &t, eye, "identify", 15)
            .await
            .expect("after restart");
        assert_eq!(got, Outcome::Subjects(vec![key.0.clone()]));
    });
}

#[test]
fn a_finished_probe_cannot_be_replayed_with_other_parameters_even_after_junk_and_a_restart() {
    let cluster = Cluster::start("search-replay", 27);
    let enrolled = enroll_synthetic(&cluster, 30);
    let (key, t) = enrolled
        .iter()
        .next()
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let eye = Eye::parse(&key.1).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    let session: [u8; 16] = rng.gen();
    // The client's uniqueness search, run to the end.
    let sealed = seal(&cluster, &t, eye, session, "uniqueness", 15, &mut rng);
    let outcome = cluster.block_on(async {
        let clients = cluster.clients().await;
        let starts = start(&clients, &session, &sealed, "uniqueness", 15)
            .await
            .expect("start");
        drive(
            &clients,
            &session,
            starts.into_iter().map(|s| s.2).collect(),
        )
        .await
    });
    assert_eq!(outcome.expect("search"), Outcome::Unique(false));
    // What a coordinator would try next: the same probes as an identification (which subjects
    // match), or at another threshold (to bisect the distance). Refused by every party.
    let replay = |what: &str| {
        cluster.block_on(async {
            let clients = cluster.clients().await;
            for (i, c) in clients.iter().enumerate() {
                for (mode, threshold) in [("identify", 0.345), ("uniqueness", 0.2)] {
                    let err = c
                        .query_one(
                            "SELECT entries FROM privmatch.iris_search_start($1, $2, $3, 15, $4)",
                            &[&session.as_slice(), &sealed[i], &mode, &threshold],
                        )
                        .await
                        .expect_err("a replayed probe must be refused");
                    let f = failure(i, &err);
                    assert_eq!(f.sqlstate.as_deref(), Some("42704"), "{what}: {f:?}");
                    assert!(f.message.contains("already used"), "{what}: {f:?}");
                }
            }
        })
    };
    replay("right after the search");
    // 10,000 junk starts at P0 (the engine remembers only the last 4,096 ids in memory).
    cluster.block_on(async {
        let clients = cluster.clients().await;
        clients[0]
            .batch_execute(
                "DO $$ BEGIN FOR i IN 1..10000 LOOP BEGIN \
                   PERFORM * FROM privmatch.iris_search_start(decode(md5(random()::text), 'hex'), '\\x00'::bytea); \
                 EXCEPTION WHEN others THEN NULL; END; END LOOP; END $$",
            )
            .await
            .expect("junk starts");
    });
    replay("after 10,000 junk starts");
    cluster.kill_party(0);
    cluster.start_party(0);
    replay("after a restart of P0");
    // The parameters are sealed: a fresh session run with other parameters than sealed is
    // refused too (22023), before anything is scanned.
    let fresh: [u8; 16] = rng.gen();
    let sealed = seal(&cluster, &t, eye, fresh, "uniqueness", 15, &mut rng);
    let err = cluster.block_on(async {
        let clients = cluster.clients().await;
        start(&clients, &fresh, &sealed, "identify", 15)
            .await
            .expect_err("other parameters than sealed")
    });
    assert_eq!(err.sqlstate.as_deref(), Some("22023"), "{err:?}");
    assert!(err.message.contains("sealed with the probe"), "{err:?}");
}

#[test]
fn a_search_cancelled_mid_scan_stops_the_scan_and_the_next_search_works() {
    // 30,000 templates with 31 rotations: a scan of a few hundred milliseconds on two threads,
    // so a 30 ms statement timeout lands in it.
    let cluster = Cluster::start("search-cancel", 35);
    let enrolled = enroll_synthetic(&cluster, 30_000);
    let (key, t) = enrolled
        .iter()
        .nth(11)
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let eye = Eye::parse(&key.1).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(8);
    // A first search loads the templates into every engine.
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let got = search(&cluster, &clients, &mut rng, &t, eye, "identify", 15)
            .await
            .expect("first search");
        assert_eq!(got, Outcome::Subjects(vec![key.0.clone()]));
    });
    let log = cluster.home.join("p0/postgres.log");
    let stopped = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("its scan was stopped")
            .count()
    };
    let before = stopped(&log);
    let mut stopped_scans = 0;
    for attempt in 0..3 {
        let session: [u8; 16] = rng.gen();
        let sealed = seal(&cluster, &t, eye, session, "identify", 15, &mut rng);
        let (elapsed, err) = cluster.block_on(async {
            let clients = cluster.clients().await;
            clients[0]
                .batch_execute("SET statement_timeout = 30")
                .await
                .expect("set");
            let began = std::time::Instant::now();
            let err = clients[0]
                .query_one(
                    "SELECT entries FROM privmatch.iris_search_start($1, $2, 'identify', 15, 0.345)",
                    &[&session.as_slice(), &sealed[0]],
                )
                .await
                .expect_err("cancelled");
            (began.elapsed(), err)
        });
        assert_eq!(
            err.code().map(|c| c.code()),
            Some("57014"),
            "attempt {attempt}: {err}"
        );
        assert!(
            elapsed < std::time::Duration::from_secs(1),
            "the cancelled call took {elapsed:?}"
        );
        // The engine notices the hang-up between chunks of rows and says so in the log.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline && stopped(&log) == before + stopped_scans {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        stopped_scans = stopped(&log) - before;
        if stopped_scans > 0 {
            break;
        }
    }
    assert!(
        stopped_scans > 0,
        "no cancelled request stopped its scan (see {})",
        log.display()
    );
    // The next search works and finds the template.
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let got = search(&cluster, &clients, &mut rng, &t, eye, "identify", 15)
            .await
            .expect("after the cancelled search");
        assert_eq!(got, Outcome::Subjects(vec![key.0.clone()]));
    });
}
