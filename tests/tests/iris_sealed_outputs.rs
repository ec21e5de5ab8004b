//! Issue 34, "the coordinator learns no result", for iris (docs/protocols/iris.md §13.2), and
//! the durable iris budget charge (docs/trust-model.md §5): end-to-end against three real
//! PostgreSQL parties with the engine worker, driven here as the coordinator's role drives
//! them (`coordinator/src/iris/driver.rs`: start at the three parties, then rounds routing
//! party i's message to party i+1).
//!
//! * Everything the coordinator sends to and receives from the parties during identification
//!   and uniqueness searches is recorded: no enrolled subject id, no result list, no match bit
//!   and no distance is in it; the round answers carry a sealed output and no clear result
//!   column; the sealed outputs are as long whether or not the probe matched; and the client
//!   opens them to exactly the plaintext answers. Against 0.11.0 the last round answered
//!   `subjects` / `is_unique` in the clear, which this test finds.
//! * A coordinator that runs start and rounds inside one transaction at every party and rolls
//!   them back keeps the (sealed) answer but not an uncharged search: the engine charged the
//!   budget in a transaction of its own. `privmatch iris enroll --if-unique`, which searches
//!   inside its distributed transaction, still enrols a unique record and refuses a duplicate.
//!
//! The CLI and the front door refusing altered or swapped sealed outputs through a proxy that
//! holds the coordinator's certificate: `iris_search_cli.rs`,
//! `the_threshold_is_policy_and_results_changed_in_transit_are_refused`.

use std::collections::BTreeMap;

use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult, OutputRefused};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{seal_iris_probe_to, Disclosure, ProbeContext, ReplyTo};
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate};
use privmatch_e2e::{by_key, contains, privmatch, read_ndjson, write_lines, Cluster, RecordKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio_postgres::Client;

/// What the coordinator's role sent to and received from the parties in one search.
#[derive(Default)]
struct Capture {
    /// Every argument sent (probes, relayed messages, session ids, parameters as text).
    sent: Vec<Vec<u8>>,
    /// Every value answered (entries, digests, messages, sealed outputs, flags), as bytes.
    received: Vec<Vec<u8>>,
    /// The column names of the last round's answer.
    last_columns: Vec<String>,
    /// The three sealed outputs.
    sealed: Vec<Vec<u8>>,
    /// The three disclosed bits.
    disclosed: Vec<Option<bool>>,
}

impl Capture {
    fn everything(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.sent.iter().chain(&self.received)
    }
}

/// One search of `probe` as the coordinator's role runs it, recording everything; the probe
/// is sealed by a client with reply key `reply` and `disclosure`.
#[allow(clippy::too_many_arguments)]
async fn captured_search(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    reply: &PartySecretKey,
    disclosure: Disclosure,
    probe: &IrisTemplate,
    params: SearchParams,
    session: [u8; 16],
    rng: &mut ChaCha20Rng,
) -> Capture {
    let context = ProbeContext {
        session,
        eye: Eye::Left,
        params,
        sealed_at: privmatch_coordinator::cli::keys::sealing_time(),
    };
    let to = ReplyTo {
        key: reply.public_key(),
        disclosure,
    };
    let probes = seal_iris_probe_to(probe, &context, &to, keys, rng).expect("seal");
    let mut c = Capture::default();
    let mut messages = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        c.sent.extend([session.to_vec(), probes[i].clone()]);
        let row = client
            .query_one(
                "SELECT entries, set_digest, message FROM privmatch.iris_search_start($1, $2)",
                &[&session.as_slice(), &probes[i]],
            )
            .await
            .unwrap_or_else(|e| panic!("start at P{i}: {e:?}"));
        c.received
            .push(row.get::<_, i64>(0).to_string().into_bytes());
        c.received.push(row.get::<_, i64>(0).to_le_bytes().to_vec());
        c.received.push(row.get(1));
        messages.push(row.get::<_, Vec<u8>>(2));
        c.received.push(messages[i].clone());
    }
    for k in 0..128 {
        let mut next = Vec::new();
        let mut finished = 0;
        for (i, client) in clients.iter().enumerate() {
            let inbound = &messages[(i + 2) % 3];
            c.sent.push(inbound.clone());
            let row = client
                .query_one(
                    "SELECT * FROM privmatch.iris_search_round($1, $2, $3)",
                    &[&session.as_slice(), &k, inbound],
                )
                .await
                .unwrap_or_else(|e| panic!("round {k} at P{i}: {e:?}"));
            c.last_columns = row
                .columns()
                .iter()
                .map(|col| col.name().to_owned())
                .collect();
            // Every column, whatever its type, as the coordinator would store it.
            for (j, col) in row.columns().iter().enumerate() {
                let bytes = match col.type_().name() {
                    "bytea" => row.get::<_, Option<Vec<u8>>>(j).unwrap_or_default(),
                    "bool" => row
                        .get::<_, Option<bool>>(j)
                        .map_or(vec![], |b| vec![u8::from(b)]),
                    "text" => row
                        .get::<_, Option<String>>(j)
                        .unwrap_or_default()
                        .into_bytes(),
                    "_text" => row
                        .get::<_, Option<Vec<String>>>(j)
                        .unwrap_or_default()
                        .join("\n")
                        .into_bytes(),
                    other => panic!("a column {:?} of type {other}", col.name()),
                };
                c.received.push(bytes);
            }
            if row.get::<_, bool>("finished") {
                finished += 1;
                c.sealed.push(
                    row.get::<_, Option<Vec<u8>>>("sealed_output")
                        .expect("sealed"),
                );
                c.disclosed.push(row.get("disclosed_unique"));
            } else {
                next.push(row.get::<_, Option<Vec<u8>>>("message").expect("a message"));
            }
        }
        match finished {
            0 => messages = next,
            3 => return c,
            n => panic!("{n} of 3 parties finished in round {k}"),
        }
    }
    panic!("the search did not finish in 128 rounds")
}

/// The minimum (hamming distance, common bits) over ±`max_rotation` rotations.
fn best_distance(probe: &IrisTemplate, t: &IrisTemplate, max_rotation: i32) -> (u32, u32) {
    (-max_rotation..=max_rotation)
        .map(|k| masked_code_distance_counts(&probe.rotate(k), t))
        .filter(|(_, common)| *common > 0)
        .min_by(|a, b| (u64::from(a.0) * u64::from(b.1)).cmp(&(u64::from(b.0) * u64::from(a.1))))
        .expect("some overlap")
}

fn enroll(cluster: &Cluster, count: usize, seed: u64) -> BTreeMap<RecordKey, IrisTemplate> {
    let path = cluster.path("enrol.ndjson");
    privmatch(&[
        "iris",
        "synth",
        &count.to_string(),
        "--seed",
        &seed.to_string(),
        "-o",
        &path.display().to_string(),
    ])
    .expect_success();
    cluster.enroll(&path, &[]).expect_success();
    by_key(&read_ndjson(&path))
}

fn open(
    c: &Capture,
    keys: &[PartyPublicKey; 3],
    reply: &PartySecretKey,
    session: [u8; 16],
    params: SearchParams,
) -> Result<IrisResult, OutputRefused> {
    let expected = ExpectedSearch {
        session,
        params,
        eye: Eye::Left,
    };
    open_outputs(
        &expected,
        keys,
        &[None, None, None],
        reply,
        [&c.sealed[0], &c.sealed[1], &c.sealed[2]],
    )
    .map(|o| o.result)
}

#[test]
fn the_coordinator_relays_sealed_iris_outputs_and_sees_no_subject_bit_or_distance() {
    let cluster = Cluster::start("iris-sealed-capture", 70);
    let enrolled = enroll(&cluster, 40, 70);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(70);
    let reply = PartySecretKey::generate(&mut rng);
    let lefts: Vec<(&RecordKey, &IrisTemplate)> =
        enrolled.iter().filter(|((_, e), _)| e == "left").collect();
    assert!(lefts.len() >= 4, "enough left eyes");
    let subjects: Vec<&str> = enrolled.keys().map(|(s, _)| s.as_str()).collect();
    let identify = SearchParams::new(SearchMode::Identify, 15, 0.345).expect("params");
    let uniqueness = SearchParams::new(SearchMode::Uniqueness, 15, 0.345).expect("params");
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let mut lengths: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (n, ((subject, _), t)) in lefts.iter().take(3).enumerate() {
            // A near-duplicate of an enrolled template (a match) and a stranger (none), for
            // both modes.
            let near = near_duplicate(t, 0.05, 2 + n as i32, &mut rng);
            let stranger = random_template(&mut rng);
            let (hd, common) = best_distance(&near, t, 15);
            for (probe, params, expected) in [
                (
                    &near,
                    identify,
                    IrisResult::Identified(vec![subject.clone()]),
                ),
                (&stranger, identify, IrisResult::Identified(vec![])),
                (&near, uniqueness, IrisResult::Unique(false)),
                (&stranger, uniqueness, IrisResult::Unique(true)),
            ] {
                let session: [u8; 16] = rng.gen();
                let c = captured_search(
                    &clients,
                    &keys,
                    &reply,
                    Disclosure::SealedOnly,
                    probe,
                    params,
                    session,
                    &mut rng,
                )
                .await;
                let what = format!("{:?} of {subject} ({expected:?})", params.mode());
                // No result column: the last round answers a message, the flag, a sealed
                // output and a disclosed bit, which is NULL for a search.
                assert_eq!(
                    c.last_columns,
                    ["message", "finished", "sealed_output", "disclosed_unique"],
                    "{what}"
                );
                assert_eq!(c.disclosed, [None, None, None], "{what}");
                // No enrolled subject id anywhere in what the coordinator handled.
                for s in &subjects {
                    assert!(
                        !c.everything().any(|m| contains(m, s.as_bytes())),
                        "{what}: subject {s} in the clear"
                    );
                }
                // No distance: neither the counts nor the ratio.
                let ratio = format!("{:.4}", f64::from(hd) / f64::from(common));
                let counts16: Vec<u8> = [hd as u16, common as u16]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                let counts32: Vec<u8> = [hd, common].iter().flat_map(|v| v.to_le_bytes()).collect();
                for m in &c.received {
                    assert!(
                        !contains(m, &counts16) && !contains(m, &counts32),
                        "{what}: counts"
                    );
                    assert!(
                        !contains(m, ratio.as_bytes()),
                        "{what}: the distance {ratio}"
                    );
                }
                // The sealed outputs are as long whatever the result.
                lengths
                    .entry(params.mode().as_str())
                    .or_default()
                    .extend(c.sealed.iter().map(Vec::len));
                // The client opens exactly the plaintext answer.
                let opened = open(&c, &keys, &reply, session, params).expect("the client opens");
                assert_eq!(opened, expected, "{what}");
                // Another client's key opens nothing; an output swapped between two parties
                // or altered in transit is refused, naming the party.
                let stranger_key = PartySecretKey::generate(&mut rng);
                assert!(open(&c, &keys, &stranger_key, session, params).is_err());
                let mut swapped = Capture {
                    sealed: c.sealed.clone(),
                    ..Capture::default()
                };
                swapped.sealed.swap(1, 2);
                let err = open(&swapped, &keys, &reply, session, params).expect_err("swapped");
                assert!(err.to_string().contains("P1's sealed output"), "{err}");
                let mut altered = Capture {
                    sealed: c.sealed.clone(),
                    ..Capture::default()
                };
                let last = altered.sealed[2].len() - 1;
                altered.sealed[2][last] ^= 1;
                let err = open(&altered, &keys, &reply, session, params).expect_err("altered");
                assert!(err.to_string().contains("P2's sealed output"), "{err}");
            }
        }
        for (mode, l) in &lengths {
            assert!(l.windows(2).all(|w| w[0] == w[1]), "{mode}: lengths {l:?}");
        }
    });
}

#[test]
fn a_rolled_back_search_stays_charged_and_enroll_if_unique_still_works() {
    let cluster = Cluster::start("iris-sealed-budget", 71);
    let enrolled = enroll(&cluster, 10, 71);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(71);
    let reply = PartySecretKey::generate(&mut rng);
    let ((subject, _), t) = enrolled
        .iter()
        .find(|((_, e), _)| e == "left")
        .expect("a left eye");
    let used = |cluster: &Cluster| -> Vec<i32> {
        (0..3)
            .map(|p| {
                cluster.query(
                    p,
                    "SELECT most_used_this_hour FROM privmatch.query_budgets() WHERE kind = 'iris-search'",
                    &[],
                )[0]
                .get(0)
            })
            .collect()
    };
    let before = used(&cluster);
    let params = SearchParams::new(SearchMode::Identify, 15, 0.345).expect("params");
    let session: [u8; 16] = rng.gen();
    let probe = near_duplicate(t, 0.05, 1, &mut rng);
    let c = cluster.block_on(async {
        let clients = cluster.clients().await;
        for client in &clients {
            client.batch_execute("BEGIN").await.expect("begin");
        }
        let c = captured_search(
            &clients,
            &keys,
            &reply,
            Disclosure::SealedOnly,
            &probe,
            params,
            session,
            &mut rng,
        )
        .await;
        for client in &clients {
            client.batch_execute("ROLLBACK").await.expect("rollback");
        }
        c
    });
    // The answer was obtained inside the rolled-back transactions …
    assert_eq!(
        open(&c, &keys, &reply, session, params).expect("opens"),
        IrisResult::Identified(vec![subject.clone()])
    );
    // … and every party still counts the search: the engine charged it in its own
    // transaction. (In 0.11.0 the charge was in the caller's transaction: rolled back here.)
    let after = used(&cluster);
    for p in 0..3 {
        assert_eq!(after[p], before[p] + 1, "P{p}: {before:?} → {after:?}");
    }

    // enroll --if-unique searches inside its distributed transaction: a stranger is enrolled,
    // a near-duplicate of it is not.
    let stranger = random_template(&mut rng);
    let line = |subject: &str, t: &IrisTemplate| privmatch_e2e::enrollment_line(subject, "left", t);
    let first = cluster.path("if-unique-1.ndjson");
    write_lines(&first, &[line("fresh-subject", &stranger)]);
    let out = cluster
        .cli(&[
            "iris",
            "enroll",
            "--input",
            &first.display().to_string(),
            "--if-unique",
        ])
        .expect_success();
    assert_eq!(cluster.subject_count(0, "fresh-subject"), 1, "{out}");
    let second = cluster.path("if-unique-2.ndjson");
    let twin = near_duplicate(&stranger, 0.05, 2, &mut rng);
    write_lines(&second, &[line("fresh-twin", &twin)]);
    cluster.cli(&[
        "iris",
        "enroll",
        "--input",
        &second.display().to_string(),
        "--if-unique",
    ]);
    for p in 0..3 {
        assert_eq!(
            cluster.subject_count(p, "fresh-twin"),
            0,
            "P{p} enrolled the twin"
        );
    }
}

#[test]
fn a_front_door_probe_sealed_for_another_party_is_refused_there() {
    let cluster = Cluster::start("iris-sealed-front-door", 72);
    let enrolled = enroll(&cluster, 6, 72);
    let (_, t) = enrolled
        .iter()
        .find(|((_, e), _)| e == "left")
        .expect("a left eye");
    let probes = cluster.path("probe.ndjson");
    write_lines(
        &probes,
        &[serde_json::json!({"eye": "left", "iris_codes": t.code.to_base64(), "mask_codes": t.mask.to_base64()}).to_string()],
    );
    // A search sealed without saying whose front door opens it is refused at sealing.
    let input = probes.display().to_string();
    cluster
        .cli(&["iris", "seal", "--for", "identify", "--input", &input])
        .expect_failure()
        .assert_stderr_contains(&["--front-door is required"]);
    let sealed_for = |party: &str| {
        let out = cluster.path(&format!("sealed-{party}.tsv"));
        cluster
            .cli(&[
                "iris",
                "seal",
                "--for",
                "identify",
                "--input",
                &input,
                "--out",
                &out.display().to_string(),
                "--front-door",
                party,
            ])
            .expect_success();
        std::fs::read_to_string(&out)
            .expect("sealed")
            .lines()
            .next()
            .and_then(|l| l.split('\t').nth(1))
            .expect("one sealed input")
            .to_owned()
    };
    let app = cluster.application(0);
    let identify = |sealed: &str| {
        cluster.query_login(
            &app,
            "SELECT subject, eye FROM privmatch.iris_identify($1)",
            &[&sealed],
        )
    };
    let rows = identify(&sealed_for("0")).expect("sealed for P0's front door");
    assert_eq!(rows.len(), 1);
    // Sealed for P2's front door: the outputs are sealed to P2's key; P0 cannot open them.
    let err = identify(&sealed_for("2")).expect_err("sealed for P2");
    assert_eq!(err.0, "28000", "{err:?}");
    assert!(err.1.contains("P0's sealed output"), "{err:?}");
}
