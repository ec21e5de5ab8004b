//! End-to-end tests of the parties' search functions over SQL, driven here the way the
//! coordinator drives them (start at the three parties, then rounds routing party i's message
//! to party i+1), against three real PostgreSQL parties with the engine worker: results
//! against the plaintext matcher, refused messages abort, a party killed mid-search fails the
//! search cleanly and the next search works, a search cancelled mid-scan stops the scan, the
//! scan backend `engine_status()` reports (`privmatch.gpu = auto`, the default, and `on` where
//! no GPU can be used: the engine starts anyway and scans on the CPU).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{seal_iris_probe_to, Disclosure, ProbeContext, ReplyTo};
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate};
use privmatch_e2e::{
    assert_pool_threads_block_signals, by_key, privmatch, read_ndjson, wait_until, Cluster,
    RecordKey,
};
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

/// The reply key of this test's client: the parties seal their outputs to it, and [`drive`]
/// opens them as the CLI does.
fn client_reply() -> PartySecretKey {
    PartySecretKey::generate(&mut ChaCha20Rng::seed_from_u64(0x1415))
}

/// What the client expects of a session's outputs, and the pinned keys it opens them with.
type Sealed = (ExpectedSearch, [PartyPublicKey; 3]);

thread_local! {
    /// Per session sealed by [`seal_at`].
    static SEALED: RefCell<HashMap<[u8; 16], Sealed>> = RefCell::new(HashMap::new());
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
    seal_at(
        cluster,
        probe,
        eye,
        session,
        (mode, max_rotation, 0.345),
        rng,
    )
}

/// Seals `probe` for `session` with the parameters (mode, max_rotation, threshold).
fn seal_at(
    cluster: &Cluster,
    probe: &IrisTemplate,
    eye: Eye,
    session: [u8; 16],
    (mode, max_rotation, threshold): (&str, i32, f64),
    rng: &mut ChaCha20Rng,
) -> [Vec<u8>; 3] {
    let mode = SearchMode::parse(mode).expect("mode");
    let context = ProbeContext {
        session,
        eye,
        params: SearchParams::new(mode, max_rotation, threshold).expect("params"),
        sealed_at: privmatch_coordinator::cli::keys::sealing_time(),
    };
    let expected = ExpectedSearch {
        session,
        params: context.params,
        eye,
    };
    SEALED.with(|m| {
        m.borrow_mut()
            .insert(session, (expected, cluster.party_keys()))
    });
    let reply = ReplyTo {
        key: client_reply().public_key(),
        disclosure: Disclosure::SealedOnly,
    };
    seal_iris_probe_to(probe, &context, &reply, &cluster.party_keys(), rng).expect("seal")
}

/// `iris_search_start` at the three parties, in index order: each with its own sealed probe,
/// which carries the search's mode, rotation range and threshold (they travel nowhere else).
async fn start(
    clients: &[Client],
    session: &[u8],
    sealed: &[Vec<u8>; 3],
) -> Result<Vec<(i64, Vec<u8>, Vec<u8>)>, Failure> {
    let mut out = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let row = c
            .query_one(
                "SELECT entries, set_digest, message FROM privmatch.iris_search_start($1, $2)",
                &[&session, &sealed[i]],
            )
            .await
            .map_err(|e| failure(i, &e))?;
        out.push((row.get(0), row.get(1), row.get(2)));
    }
    Ok(out)
}

/// One round at one party: the next message, whether it finished, its sealed output and the
/// disclosed uniqueness bit.
type RoundRow = (Option<Vec<u8>>, bool, Option<Vec<u8>>, Option<bool>);

async fn round(
    client: &Client,
    party: usize,
    session: &[u8],
    k: i32,
    message: &[u8],
) -> Result<RoundRow, Failure> {
    let row = client
        .query_one(
            "SELECT message, finished, sealed_output, disclosed_unique FROM privmatch.iris_search_round($1, $2, $3)",
            &[&session, &k, &message],
        )
        .await
        .map_err(|e| failure(party, &e))?;
    Ok((row.get(0), row.get(1), row.get(2), row.get(3)))
}

/// Runs the rounds from the start messages to the output, which the client opens (the three
/// sealed outputs, checked and in agreement; nothing disclosed in the clear).
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
            assert!(replies.iter().all(|r| r.3.is_none()), "a bit in the clear");
            let sealed: Vec<Vec<u8>> = replies
                .into_iter()
                .map(|r| r.2.expect("a sealed output"))
                .collect();
            let session: [u8; 16] = session.try_into().expect("16 bytes");
            let (expected, keys) = SEALED
                .with(|m| m.borrow().get(&session).copied())
                .expect("a session sealed by seal_at");
            let opened = open_outputs(
                &expected,
                &keys,
                &[None, None, None],
                &client_reply(),
                [&sealed[0], &sealed[1], &sealed[2]],
            )
            .expect("the outputs open");
            return Ok(match opened.result {
                IrisResult::Identified(s) => Outcome::Subjects(s),
                IrisResult::Unique(u) => Outcome::Unique(u),
                IrisResult::MatchesEarlierRequest => panic!("a search is in no enrolment batch"),
            });
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
    let starts = start(clients, &session, &sealed).await?;
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
    // A GPU engine scans on the device, a CPU one on more than one thread on the core's pool
    // (the coordinator's login may not read pg_stat_activity: the operator looks).
    for (p, (_, kernel, threads)) in engine_status(&cluster).iter().enumerate() {
        let engine: i32 = cluster.query(
            p,
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'privmatch engine'",
            &[],
        )[0]
        .get(0);
        assert_pool_threads_block_signals(engine, !kernel.starts_with("gpu: ") && *threads > 1);
    }
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
        let starts = start(&clients, &session, &sealed).await.expect("start");
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
        let err = start(&clients, &session, &sealed).await.expect_err("reuse");
        assert_eq!(err.sqlstate.as_deref(), Some("42704"), "{err:?}");
        let fresh: [u8; 16] = rng.gen();
        let err = start(&clients, &fresh, &sealed)
            .await
            .expect_err("other session");
        assert_eq!(err.sqlstate.as_deref(), Some("22P03"), "{err:?}");
        // P1's probe routed to P0 (a relay that swaps them) is refused as sealed for another
        // party (22023, as at enrolment), not as altered (22P03).
        let swapped = [sealed[1].clone(), sealed[0].clone(), sealed[2].clone()];
        let other: [u8; 16] = rng.gen();
        let err = start(&clients, &other, &swapped)
            .await
            .expect_err("P1's probe at P0");
        assert_eq!(err.sqlstate.as_deref(), Some("22023"), "{err:?}");
        assert_eq!(err.party, 0, "{err:?}");
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
        start(&clients, &session, &sealed).await.expect("start")
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
fn a_finished_probe_cannot_be_replayed_even_after_junk_and_a_restart() {
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
        let starts = start(&clients, &session, &sealed).await.expect("start");
        drive(
            &clients,
            &session,
            starts.into_iter().map(|s| s.2).collect(),
        )
        .await
    });
    assert_eq!(outcome.expect("search"), Outcome::Unique(false));
    // What a coordinator would try next: the same probes again (as another search: the
    // parameters are sealed in them, so it cannot even ask for another mode or threshold).
    // Refused by every party: the replayed session (42704).
    let replay = |what: &str| {
        cluster.block_on(async {
            let clients = cluster.clients().await;
            for (i, c) in clients.iter().enumerate() {
                let err = c
                    .query_one(
                        "SELECT entries FROM privmatch.iris_search_start($1, $2)",
                        &[&session.as_slice(), &sealed[i]],
                    )
                    .await
                    .expect_err("a replayed probe must be refused");
                let f = failure(i, &err);
                assert_eq!(f.sqlstate.as_deref(), Some("42704"), "{what}: {f:?}");
                assert!(f.message.contains("already used"), "{what}: {f:?}");
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
    // A fresh session whose probe was sealed at a threshold other than the policy is refused
    // too (22023), before anything is scanned.
    let fresh: [u8; 16] = rng.gen();
    let sealed = seal_at(&cluster, &t, eye, fresh, ("uniqueness", 15, 0.2), &mut rng);
    let err = cluster.block_on(async {
        let clients = cluster.clients().await;
        start(&clients, &fresh, &sealed)
            .await
            .expect_err("a threshold other than the policy")
    });
    assert_eq!(err.sqlstate.as_deref(), Some("22023"), "{err:?}");
    assert!(err.message.contains("threshold policy"), "{err:?}");
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
                    "SELECT entries FROM privmatch.iris_search_start($1, $2)",
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

/// Signs an `iris-policy` command for `party` with its operator's key (as `privmatch iris
/// policy set` does).
fn policy_command(cluster: &Cluster, party: usize, threshold: f64) -> Vec<u8> {
    use privmatch_core::iris::policy::{IrisPolicy, IRIS_POLICY_ACTION};
    let key = privmatch_coordinator::cli::operator_key::load(
        &cluster.home.join(format!("operators/p{party}.signing.key")),
    )
    .expect("operator key");
    let index = privmatch_core::party::PartyIndex::ALL[party];
    let payload = IrisPolicy::from_ratio(threshold).expect("policy").encode();
    key.sign(
        index,
        privmatch_coordinator::cli::operator_key::fresh_counter(),
        IRIS_POLICY_ACTION,
        &payload,
    )
}

/// Attack 3 of issue 34 (a caller bisects the distance between a probe and an enrolled
/// template by searching at thresholds of its choice; 12 searches bracketed it to 1e-4): the
/// threshold is each party's operator-signed policy, travels only sealed in the probe, and
/// `iris_search_start` refuses a probe sealed at any other with 22023, also when the
/// coordinator's role calls it directly with probes it sealed at that threshold. Against f21d1f1 every one of these searches ran.
#[test]
fn no_caller_chosen_threshold_is_accepted_and_only_a_signed_policy_changes_it() {
    let cluster = Cluster::start("search-policy", 86);
    let enrolled = enroll_synthetic(&cluster, 30);
    let (key, t) = enrolled
        .iter()
        .nth(5)
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let eye = Eye::parse(&key.1).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(86);
    // A probe at a true distance of about 0.3 from the enrolled template.
    let probe = near_duplicate(&t, 0.3, 2, &mut rng);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        for c in &clients {
            let tau: f64 = c
                .query_one("SELECT privmatch.iris_policy()", &[])
                .await
                .expect("policy")
                .get(0);
            assert_eq!(tau, 0.345, "the install default");
        }
        // The bisection: every threshold but the policy's is refused at every party, before
        // anything is scanned, with probes sealed at that threshold (what a coordinator that
        // seals its own probes sends).
        for tau in [0.25, 0.3, 0.2875, 0.3125, 0.2938, 0.4, 0.3449, 0.3451] {
            let session: [u8; 16] = rng.gen();
            let sealed = seal_at(
                &cluster,
                &probe,
                eye,
                session,
                ("uniqueness", 15, tau),
                &mut rng,
            );
            for (i, c) in clients.iter().enumerate() {
                let err = c
                    .query_one(
                        "SELECT entries FROM privmatch.iris_search_start($1, $2)",
                        &[&session.as_slice(), &sealed[i]],
                    )
                    .await
                    .expect_err("a threshold other than the policy");
                let f = failure(i, &err);
                assert_eq!(f.sqlstate.as_deref(), Some("22023"), "τ = {tau}: {f:?}");
                assert!(f.message.contains("threshold policy"), "τ = {tau}: {f:?}");
            }
        }
        // At the policy's threshold the search runs (and answers as the plaintext matcher).
        let got = search(&cluster, &clients, &mut rng, &probe, eye, "identify", 15)
            .await
            .expect("at the policy");
        assert_eq!(
            got,
            Outcome::Subjects(plain_matches(&enrolled, &probe, eye, 15))
        );

        // Changing the policy takes each party's operator: the coordinator's role relays the
        // signed command. P0 first: while the parties differ, no threshold runs everywhere.
        let to_030: Vec<Vec<u8>> = (0..3).map(|p| policy_command(&cluster, p, 0.3)).collect();
        let set = |p: usize, command: Vec<u8>| {
            let c = &clients[p];
            async move {
                c.query_one("SELECT privmatch.iris_set_policy($1)", &[&command])
                    .await
                    .map(|r| r.get::<_, f64>(0))
                    .map_err(|e| failure(p, &e))
            }
        };
        assert_eq!(set(0, to_030[0].clone()).await.expect("P0"), 0.3);
        for tau in [0.345, 0.3] {
            let session: [u8; 16] = rng.gen();
            let sealed = seal_at(
                &cluster,
                &probe,
                eye,
                session,
                ("identify", 15, tau),
                &mut rng,
            );
            let err = start(&clients, &session, &sealed)
                .await
                .expect_err("the parties' policies differ");
            assert_eq!(err.sqlstate.as_deref(), Some("22023"), "τ = {tau}: {err:?}");
            assert_eq!(err.party, if tau == 0.3 { 1 } else { 0 }, "τ = {tau}");
        }
        // A command replayed, signed by another key, or for another party changes nothing.
        let err = set(0, to_030[0].clone()).await.expect_err("replayed");
        assert_eq!(err.sqlstate.as_deref(), Some("28000"), "{err:?}");
        let stranger = privmatch_core::crypto::sign::OperatorSigningKey::generate(&mut rng);
        let forged = stranger.sign(
            privmatch_core::party::PartyIndex::ALL[1],
            privmatch_coordinator::cli::operator_key::fresh_counter(),
            privmatch_core::iris::policy::IRIS_POLICY_ACTION,
            &privmatch_core::iris::policy::IrisPolicy::from_ratio(0.45)
                .expect("policy")
                .encode(),
        );
        let err = set(1, forged).await.expect_err("forged");
        assert_eq!(err.sqlstate.as_deref(), Some("28000"), "{err:?}");
        let err = set(2, to_030[1].clone())
            .await
            .expect_err("P1's command at P2");
        assert_eq!(err.sqlstate.as_deref(), Some("28000"), "{err:?}");
        assert_eq!(set(1, to_030[1].clone()).await.expect("P1"), 0.3);
        assert_eq!(set(2, to_030[2].clone()).await.expect("P2"), 0.3);
        // Now 0.3 is the policy: the old default is refused, the new one runs.
        let session: [u8; 16] = rng.gen();
        let sealed = seal_at(
            &cluster,
            &probe,
            eye,
            session,
            ("identify", 15, 0.345),
            &mut rng,
        );
        let err = start(&clients, &session, &sealed)
            .await
            .expect_err("the old default");
        assert_eq!(err.sqlstate.as_deref(), Some("22023"), "{err:?}");
        let session: [u8; 16] = rng.gen();
        let sealed = seal_at(
            &cluster,
            &probe,
            eye,
            session,
            ("identify", 15, 0.3),
            &mut rng,
        );
        let starts = start(&clients, &session, &sealed)
            .await
            .expect("at the new policy");
        let got = drive(
            &clients,
            &session,
            starts.into_iter().map(|s| s.2).collect(),
        )
        .await
        .expect("search at 0.3");
        let expected = if plain_distance_below(&t, &probe, 3_000) {
            vec![key.0.clone()]
        } else {
            vec![]
        };
        assert_eq!(got, Outcome::Subjects(expected));
    });
    // The application role may read the policy but not set it.
    let app = cluster.application(0);
    let rows = cluster
        .query_login(&app, "SELECT privmatch.iris_policy()", &[])
        .expect("the application reads the policy");
    assert_eq!(rows[0].get::<_, f64>(0), 0.3);
    let command = policy_command(&cluster, 0, 0.2);
    let err = cluster
        .query_login(&app, "SELECT privmatch.iris_set_policy($1)", &[&command])
        .expect_err("the application sets no policy");
    assert_eq!(err.0, "42501", "{err:?}");
}

/// Whether `probe` is within τ = `numerator` / 10,000 of `enrolled` at some rotation in ±15.
fn plain_distance_below(enrolled: &IrisTemplate, probe: &IrisTemplate, numerator: u64) -> bool {
    (-15..=15).any(|k| {
        let (hd, common) = masked_code_distance_counts(&probe.rotate(k), enrolled);
        common > 0 && u64::from(hd) * 10_000 < numerator * u64::from(common)
    })
}

/// Attack 2 of issue 34 (sets not bound): as the coordinator's role, at P2 only, delete the
/// victim's template and store a P2 envelope of the coordinator's own for it. Against f21d1f1
/// searches then ran without error and answered wrongly (the set digest covered subject names
/// only, so all three digests still agreed). Now the entry's enrolment id differs at P2, so
/// P2's set digest differs: the parties cannot even authenticate each other's first message
/// (the digest is in the session binding), the coordinator's search fails naming P2, `privmatch
/// iris audit` names the entry and the party, and `--quarantine` deletes it at all three
/// parties, after which searches answer again. The same for an entry deleted at one party only.
#[test]
fn a_share_replaced_or_deleted_at_one_party_is_named_at_the_next_search_and_quarantined() {
    use privmatch_core::iris::binding::envelope_hashes;
    use privmatch_core::iris::enroll::seal_iris_enrollment;
    let cluster = Cluster::start("search-bound", 87);
    let enrolled = enroll_synthetic(&cluster, 24);
    let mut entries = enrolled.iter().map(|(k, t)| (k.clone(), *t));
    let (victim, victim_t) = entries.next().expect("victim");
    let (lost, _) = entries
        .find(|((_, e), _)| *e == victim.1)
        .expect("a second entry of the same eye");
    let eye = Eye::parse(&victim.1).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(87);
    // The upgrade's legacy enrolment id (migrations/privmatch--0.10.0--0.11.0.sql) is core's.
    let legacy: Vec<u8> = cluster.query(
        0,
        "SELECT pg_catalog.sha256(pg_catalog.convert_to('privmatch iris legacy enrolment v1' || $2, 'UTF8') \
         || '\\x00'::bytea || pg_catalog.convert_to($1, 'UTF8'))",
        &[&victim.0, &victim.1],
    )[0]
    .get(0);
    assert_eq!(
        legacy,
        privmatch_core::iris::binding::legacy_enrolment_id(&victim.0, eye).to_vec()
    );
    let impostor = random_template(&mut rng);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        // The attack, with nothing but the coordinator's role at P2.
        let deleted: i64 = clients[2]
            .query_one(
                "SELECT privmatch.iris_delete($1, $2)",
                &[&victim.0, &victim.1],
            )
            .await
            .expect("delete at P2")
            .get(0);
        assert_eq!(deleted, 1);
        let (forged, _) =
            seal_iris_enrollment(&impostor, &victim.0, eye, &cluster.party_keys(), &mut rng)
                .expect("seal");
        let hashes = envelope_hashes([&forged[0], &forged[1], &forged[2]]).to_vec();
        // Hashes that do not cover the envelope are refused outright.
        let err = clients[2]
            .query(
                "SELECT * FROM privmatch.iris_enroll_sealed($1, $2)",
                &[&vec![forged[2].clone()], &vec![vec![0u8; 96]]],
            )
            .await
            .expect_err("hashes without P2's envelope");
        let f = failure(2, &err);
        assert_eq!(f.sqlstate.as_deref(), Some("22023"), "{f:?}");
        assert!(f.message.contains("does not hash to P2's slot"), "{f:?}");
        let rows = clients[2]
            .query(
                "SELECT * FROM privmatch.iris_enroll_sealed($1, $2)",
                &[&vec![forged[2].clone()], &vec![hashes]],
            )
            .await
            .expect("the forged P2 envelope is stored");
        assert_eq!(rows.len(), 1);
        // Same subjects and counts everywhere, but P2's digest differs from P0's and P1's.
        let session: [u8; 16] = rng.gen();
        let sealed = seal(&cluster, &victim_t, eye, session, "identify", 15, &mut rng);
        let starts = start(&clients, &session, &sealed).await.expect("start");
        assert!(
            starts.iter().all(|s| s.0 == starts[0].0),
            "same entry counts"
        );
        assert_eq!(starts[0].1, starts[1].1);
        assert_ne!(starts[2].1, starts[0].1, "P2's set digest must differ");
        // A coordinator that ignores the digests gets no answer: the first messages of a
        // party searching another set do not authenticate at its peers.
        let err = drive(
            &clients,
            &session,
            starts.into_iter().map(|s| s.2).collect(),
        )
        .await
        .expect_err("the rounds of diverging sets");
        assert_eq!(err.sqlstate.as_deref(), Some("08P01"), "{err:?}");
        for c in &clients {
            let _ = c
                .execute(
                    "SELECT privmatch.iris_search_abort($1)",
                    &[&session.as_slice()],
                )
                .await;
        }
    });
    let probe_file = cluster.path("victim-probe.ndjson");
    privmatch_e2e::write_lines(
        &probe_file,
        &[serde_json::json!({"eye": victim.1, "iris_codes": victim_t.code.to_base64(), "mask_codes": victim_t.mask.to_base64()}).to_string()],
    );
    let probe_path = probe_file.display().to_string();
    // The coordinator's search fails (after its retries) and names P2.
    let out = cluster
        .cli(&["iris", "search", "--input", &probe_path, "--json"])
        .expect_failure();
    out.assert_stderr_contains(&["different template sets", "P2's set diverges", "iris audit"]);
    // The audit names the entry and the party, and fails while it diverges.
    let out = cluster.cli(&["iris", "audit", "--json"]).expect_failure();
    let report: serde_json::Value =
        serde_json::from_str(out.stdout.lines().next().unwrap_or_default()).expect("json");
    let diverging = report["diverging"].as_array().expect("diverging");
    assert_eq!(diverging.len(), 1, "{report}");
    assert_eq!(diverging[0]["subject"], victim.0.as_str());
    assert_eq!(diverging[0]["diverging"], serde_json::json!([2]));
    // Deleted at one party only (P1): named as well.
    cluster.block_on(async {
        let clients = cluster.clients().await;
        clients[1]
            .query_one("SELECT privmatch.iris_delete($1, $2)", &[&lost.0, &lost.1])
            .await
            .expect("delete at P1");
    });
    let out = cluster.cli(&["iris", "audit"]).expect_failure();
    assert!(
        out.stdout
            .contains(&format!("{:?} ({} eye) at P1", lost.0, lost.1))
            && out.stdout.contains("P1 missing")
            && out
                .stdout
                .contains(&format!("{:?} ({} eye) at P2", victim.0, victim.1)),
        "{out}"
    );
    // Quarantine: both entries deleted at all three parties, atomically per entry.
    let out = cluster
        .cli(&["iris", "audit", "--quarantine"])
        .expect_success();
    assert!(out.stdout.contains("2 quarantined"), "{out}");
    for p in 0..3 {
        assert_eq!(cluster.subject_count(p, &victim.0), 0, "P{p}");
        assert!(
            !cluster.keys(p).contains(&(lost.0.clone(), lost.1.clone())),
            "P{p}"
        );
    }
    cluster.cli(&["iris", "audit"]).expect_success();
    // Searches answer again: the victim's probe (and the lost one's) match nobody now.
    let out = cluster
        .cli(&["iris", "search", "--input", &probe_path, "--json"])
        .expect_success();
    assert!(out.stdout.contains("\"matches\":[]"), "{out}");
}
