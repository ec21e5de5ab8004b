//! Issue 34's attacks, run against the OLD build f21d1f1 (extension 0.10.0) with the old
//! build's own test harness (`privmatch-e2e` of f21d1f1). Each test performs one attack and
//! prints `ATTACK <name>: SUCCEEDED (<evidence>)` or `ATTACK <name>: REFUSED (<why>)`; a test
//! fails only when the attack could not be carried out at all. `run_old_attack.sh` links it
//! into a worktree of f21d1f1 (tests/tests/) so that it builds against the old crates.
//!
//! Slots (ports 16000 + 10·slot): 95 (iris results), 96 (face results), 97 (forged share),
//! 98 (replayed command), 99 (result changed in transit). None of them is used by the new
//! suite of the current tree.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use privmatch_coordinator::cli::operator_key;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::crypto::sign::{PeerPin, PEER_PIN_ACTION};
use privmatch_core::embedding::normalize;
use privmatch_core::face::dealer::{seal_dealer_config, DealerConfig, DEALER_CONFIG_ACTION};
use privmatch_core::face::enroll::{seal_face_enrollment, FaceEnrollRequest};
use privmatch_core::face::probe::seal_face_probe;
use privmatch_core::face::quantize::Quantizer;
use privmatch_core::face::{funshade, Metric};
use privmatch_core::iris::enroll::{seal_iris_enrollment, Eye};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{seal_iris_probe, ProbeContext};
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::IrisTemplate;
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{by_key, failure, pg_bindir, privmatch, read_ndjson, run, Cluster, Failure};
use privmatch_e2e::{write_lines, RecordKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::Value;
use tokio_postgres::Client;

fn verdict(name: &str, succeeded: bool, evidence: &str) {
    let word = if succeeded { "SUCCEEDED" } else { "REFUSED" };
    println!("ATTACK {name}: {word} ({evidence})");
}

// --- iris over SQL, as the coordinator's role drives it ---------------------------------------

fn seal_probe(
    cluster: &Cluster,
    probe: &IrisTemplate,
    eye: Eye,
    session: [u8; 16],
    mode: &str,
    max_rotation: i32,
    threshold: f64,
    rng: &mut ChaCha20Rng,
) -> [Vec<u8>; 3] {
    let context = ProbeContext {
        session,
        eye,
        params: SearchParams::new(
            SearchMode::parse(mode).expect("mode"),
            max_rotation,
            threshold,
        )
        .expect("params"),
        sealed_at: privmatch_coordinator::cli::keys::sealing_time(),
    };
    seal_iris_probe(probe, &context, &cluster.party_keys(), rng).expect("seal")
}

/// What one party's `iris_search_round` returned when it finished.
#[derive(Debug, Clone)]
struct Finished {
    is_unique: Option<bool>,
    subjects: Option<Vec<String>>,
}

/// Start at the three parties, then the rounds; what each party returned to the coordinator's
/// role at the end.
async fn sql_search(
    clients: &[Client],
    session: &[u8],
    sealed: &[Vec<u8>; 3],
    mode: &str,
    max_rotation: i32,
    threshold: f64,
) -> Result<Vec<Finished>, Failure> {
    let mut messages = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let row = c
            .query_one(
                "SELECT entries, set_digest, message FROM privmatch.iris_search_start($1, $2, $3, $4, $5)",
                &[&session, &sealed[i], &mode, &max_rotation, &threshold],
            )
            .await
            .map_err(|e| failure(i, &e))?;
        messages.push(row.get::<_, Vec<u8>>(2));
    }
    for k in 0..64 {
        let mut replies = Vec::new();
        for (i, c) in clients.iter().enumerate() {
            let row = c
                .query_one(
                    "SELECT message, finished, is_unique, subjects FROM privmatch.iris_search_round($1, $2, $3)",
                    &[&session, &k, &messages[(i + 2) % 3]],
                )
                .await
                .map_err(|e| failure(i, &e))?;
            replies.push((
                row.get::<_, Option<Vec<u8>>>(0),
                row.get::<_, bool>(1),
                row.get::<_, Option<bool>>(2),
                row.get::<_, Option<Vec<String>>>(3),
            ));
        }
        if replies.iter().all(|r| r.1) {
            return Ok(replies
                .into_iter()
                .map(|(_, _, is_unique, subjects)| Finished {
                    is_unique,
                    subjects,
                })
                .collect());
        }
        messages = replies
            .into_iter()
            .map(|r| r.0.expect("message"))
            .collect();
    }
    panic!("search did not finish in 64 rounds");
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

fn probe_line(eye: &str, t: &IrisTemplate) -> String {
    serde_json::json!({"eye": eye, "iris_codes": t.code.to_base64(), "mask_codes": t.mask.to_base64()})
        .to_string()
}

fn subjects_of(v: &Value) -> Vec<String> {
    v["matches"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| m["subject"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Attack b (iris) and f: the coordinator's role runs an identification and a uniqueness
/// check through the parties' functions with a probe sealed by this process (no client
/// identity, no signature, a threshold of its own choosing) and reads the result.
#[test]
fn b_iris_coordinator_learns_results_and_f_unsigned_inputs() {
    let cluster = Cluster::start("old-attack-b-iris", 95);
    let enrolled = enroll_synthetic(&cluster, 24);
    let ((victim, eye_name), victim_t) = enrolled
        .iter()
        .next()
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let eye = Eye::parse(&eye_name).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(95);
    let probe = near_duplicate(&victim_t, 0.05, 3, &mut rng);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let session: [u8; 16] = rng.gen();
        let sealed = seal_probe(&cluster, &probe, eye, session, "identify", 15, 0.345, &mut rng);
        let out = sql_search(&clients, &session, &sealed, "identify", 15, 0.345)
            .await
            .expect("identify as the coordinator's role");
        println!("identify: what iris_search_round returned to the coordinator's role: {out:?}");
        let learned = out.iter().all(|f| {
            f.subjects
                .as_ref()
                .is_some_and(|s| s.contains(&victim))
        });
        verdict(
            "coordinator-learns-iris-result (identify)",
            learned,
            &format!(
                "iris_search_round at P0/P1/P2 returned finished=true, subjects={:?} to the role `coordinator`; the probe was a re-capture of {victim:?}",
                out[0].subjects
            ),
        );
        let session: [u8; 16] = rng.gen();
        let sealed =
            seal_probe(&cluster, &probe, eye, session, "uniqueness", 15, 0.345, &mut rng);
        let out = sql_search(&clients, &session, &sealed, "uniqueness", 15, 0.345)
            .await
            .expect("uniqueness as the coordinator's role");
        println!("uniqueness: {out:?}");
        verdict(
            "coordinator-learns-iris-result (uniqueness bit)",
            out.iter().all(|f| f.is_unique == Some(false)),
            &format!(
                "iris_search_round returned is_unique={:?} in the clear to the role `coordinator`",
                out[0].is_unique
            ),
        );
        // f: the probe above was sealed by this test process with nothing but the parties'
        // public keys; the same with a caller-chosen threshold of 0.2 (issue point 3).
        let session: [u8; 16] = rng.gen();
        let sealed = seal_probe(&cluster, &probe, eye, session, "identify", 0, 0.2, &mut rng);
        let out = sql_search(&clients, &session, &sealed, "identify", 0, 0.2).await;
        println!("identify at a caller-chosen threshold 0.2, no rotation: {out:?}");
        verdict(
            "unsigned-unregistered-sealed-input",
            out.is_ok(),
            &format!(
                "iris_search_start(session_id, probe, mode, max_rotation, threshold) accepted probes sealed by an unregistered process (no client key, signature, nonce or expiry exists in 0.10.0), also at a caller-chosen threshold 0.2: {:?}",
                out.as_ref().map(|o| o[0].subjects.clone())
            ),
        );
    });
}

// --- face -------------------------------------------------------------------------------------

fn random_embedding(rng: &mut ChaCha20Rng, dim: usize) -> Vec<f64> {
    let raw: Vec<f64> = (0..dim)
        .map(|_| {
            let (u, v): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        })
        .collect();
    normalize(&raw).expect("non-zero")
}

fn recapture(rng: &mut ChaCha20Rng, e: &[f64], noise: f64) -> Vec<f64> {
    let n = random_embedding(rng, e.len());
    normalize(
        &e.iter()
            .zip(&n)
            .map(|(a, b)| a + noise * b)
            .collect::<Vec<_>>(),
    )
    .expect("non-zero")
}

async fn face_round(
    client: &Client,
    party: usize,
    session: &[u8],
    round: i32,
    inbound: Option<&[u8]>,
) -> Vec<u8> {
    client
        .query_one(
            "SELECT privmatch.face_session_round($1, $2, $3)",
            &[&session, &round, &inbound],
        )
        .await
        .map(|r| r.get(0))
        .unwrap_or_else(|e| panic!("round {round} at P{party}: {e:?}"))
}

/// One face session driven by the coordinator's role: the subject argument it passes, the
/// subjects the parties return, and the bits it reconstructs from the round-3 outputs.
async fn face_session(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    subject: Option<&str>,
    probe: &[i32],
    rng: &mut ChaCha20Rng,
) -> Vec<(String, bool)> {
    let session: [u8; 16] = rng.gen();
    let sealed = seal_face_probe(probe, session, subject, keys, rng).expect("seal probe");
    let row = clients[0]
        .query_one(
            "SELECT comparisons, claims, subjects, digest FROM privmatch.face_session_open($1, $2, $3)",
            &[&session.as_slice(), &sealed[0], &subject],
        )
        .await
        .expect("open at P0");
    let claims: Vec<u8> = row.get(1);
    let subjects: Vec<String> = row.get(2);
    let digest: Vec<u8> = row.get(3);
    clients[1]
        .query_one(
            "SELECT comparisons, subjects FROM privmatch.face_session_open($1, $2, $3, $4, $5)",
            &[&session.as_slice(), &sealed[1], &subject, &claims, &digest],
        )
        .await
        .expect("open at P1");
    let s = session.as_slice();
    let (m0, m1) = tokio::join!(
        face_round(&clients[0], 0, s, 1, None),
        face_round(&clients[1], 1, s, 1, None)
    );
    let (z0, z1) = tokio::join!(
        face_round(&clients[0], 0, s, 2, Some(&m1)),
        face_round(&clients[1], 1, s, 2, Some(&m0))
    );
    let (o0, o1) = tokio::join!(
        face_round(&clients[0], 0, s, 3, Some(&z1)),
        face_round(&clients[1], 1, s, 3, Some(&z0))
    );
    let bits = funshade::reconstruct(
        &funshade::bytes_to_words(&o0).expect("words"),
        &funshade::bytes_to_words(&o1).expect("words"),
    )
    .expect("bits");
    subjects.into_iter().zip(bits).collect()
}

/// Attack b (faces): the coordinator's role passes the claimed subject id in the clear to
/// `face_session_open`, gets the subject list back, and reconstructs the match bits itself
/// from both evaluators' round-3 outputs.
#[test]
fn b_face_coordinator_learns_subject_and_match_bit() {
    const DIM: usize = 128;
    let cluster = Cluster::start("old-attack-b-face", 96);
    let keys = cluster.party_keys();
    let q = Quantizer::new(DIM).expect("dim");
    let mut rng = ChaCha20Rng::seed_from_u64(96);
    let floats: Vec<Vec<f64>> = (0..12).map(|_| random_embedding(&mut rng, DIM)).collect();
    let records: Vec<(String, Vec<i32>)> = floats
        .iter()
        .enumerate()
        .map(|(i, e)| (format!("person-{i:04}"), q.quantize(e).expect("q")))
        .collect();
    cluster.block_on(async {
        let clients = cluster.clients().await;
        // The dealer's configuration, signed by P2's operator (as `cluster up` and the old
        // test suite do it).
        let sealed = seal_dealer_config(
            &DealerConfig {
                metric: Metric::Cosine,
                dim: DIM,
                threshold: 0.5,
            },
            &keys[2],
            &mut rng,
        )
        .expect("config");
        let operator =
            operator_key::load(&cluster.home.join("operators/p2.signing.key")).expect("key");
        let command = operator.sign(
            PartyIndex::ALL[2],
            operator_key::fresh_counter(),
            DEALER_CONFIG_ACTION,
            &sealed,
        );
        clients[2]
            .query(
                "SELECT * FROM privmatch.face_dealer_configure($1)",
                &[&command],
            )
            .await
            .expect("configure");
        let row = clients[2]
            .query_one(
                "SELECT envelope_p0, envelope_p1 FROM privmatch.face_dealer_generate($1)",
                &[&200i32],
            )
            .await
            .expect("generate");
        for (p, client) in clients.iter().enumerate().take(2) {
            let envelope: Vec<u8> = row.get(p);
            client
                .query("SELECT * FROM privmatch.face_keys_store($1)", &[&envelope])
                .await
                .expect("store");
        }
        let requests: Vec<FaceEnrollRequest<'_>> = records
            .iter()
            .map(|(s, e)| FaceEnrollRequest {
                subject: s,
                embedding: e,
            })
            .collect();
        let (sealed, _) = seal_face_enrollment(&requests, &keys, &mut rng).expect("seal");
        for p in 0..2 {
            clients[p]
                .query(
                    "SELECT * FROM privmatch.face_enroll_sealed($1)",
                    &[&vec![sealed[p].clone()]],
                )
                .await
                .expect("enrol");
        }
        // 1:1 verification of person-0003 with a re-capture of person-0003.
        let probe = q
            .quantize(&recapture(&mut rng, &floats[3], 0.2))
            .expect("q");
        let got = face_session(&clients, &keys, Some("person-0003"), &probe, &mut rng).await;
        println!("verify: the coordinator's role passed subject \"person-0003\" to face_session_open and reconstructed {got:?}");
        verdict(
            "coordinator-learns-face-result (verify)",
            got == vec![("person-0003".to_owned(), true)],
            &format!("face_session_open(session, probe, subject => 'person-0003') in the clear; funshade::reconstruct(round-3 outputs of P0 and P1, both returned to the role `coordinator`) = {got:?}"),
        );
        // 1:N identification with a re-capture of person-0007.
        let probe = q
            .quantize(&recapture(&mut rng, &floats[7], 0.2))
            .expect("q");
        let got = face_session(&clients, &keys, None, &probe, &mut rng).await;
        let matched: Vec<&String> = got.iter().filter(|(_, b)| *b).map(|(s, _)| s).collect();
        println!("identify: subjects and bits the coordinator's role holds: {got:?}");
        verdict(
            "coordinator-learns-face-result (identify)",
            matched == vec!["person-0007"],
            &format!(
                "face_session_open returned the subject list ({} ids) and the coordinator reconstructed the bits: matching {matched:?}",
                got.len()
            ),
        );
    });
}

// --- forged share at one party ------------------------------------------------------------------

/// Attack c: as the coordinator's role at P2 only, delete the victim and store a forged P2
/// envelope (an impostor's share) under its name; searches through the old CLI then run
/// without error and answer wrongly. Then: deleted at one party only.
#[test]
fn c_forged_share_at_one_party() {
    let cluster = Cluster::start("old-attack-c-forged", 97);
    let enrolled = enroll_synthetic(&cluster, 24);
    let mut entries = enrolled.iter().map(|(k, t)| (k.clone(), *t));
    let ((victim, eye_name), victim_t) = entries.next().expect("victim");
    let ((lost, lost_eye), _) = entries
        .find(|((_, e), _)| *e == eye_name)
        .expect("a second entry of the same eye");
    let eye = Eye::parse(&eye_name).expect("eye");
    let mut rng = ChaCha20Rng::seed_from_u64(97);
    let probe_file = cluster.path("victim-probe.ndjson");
    write_lines(&probe_file, &[probe_line(&eye_name, &victim_t)]);
    let probe_path = probe_file.display().to_string();
    let search = |path: &str, extra: &[&str]| {
        let mut args = vec!["iris", "search", "--input", path, "--json"];
        args.extend_from_slice(extra);
        cluster.cli(&args)
    };
    let before = search(&probe_path, &["--max-rotation", "0"]).expect_success();
    println!("before the attack, victim's own probe, rotation 0: {}", before.stdout.trim());
    let strangers: Vec<IrisTemplate> = (0..8).map(|_| random_template(&mut rng)).collect();
    let stranger_file = cluster.path("strangers.ndjson");
    write_lines(
        &stranger_file,
        &strangers
            .iter()
            .map(|t| probe_line(&eye_name, t))
            .collect::<Vec<_>>(),
    );
    let stranger_path = stranger_file.display().to_string();
    let before_strangers = search(&stranger_path, &[]).expect_success();
    let before_hits = before_strangers
        .stdout
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .map(|v| subjects_of(&v).contains(&victim))
                .unwrap_or(false)
        })
        .count();
    println!("before the attack, 8 unrelated probes (±15 rotations) matching {victim:?}: {before_hits}");

    let impostor = random_template(&mut rng);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let deleted: i64 = clients[2]
            .query_one(
                "SELECT privmatch.iris_delete($1, $2)",
                &[&victim, &eye_name],
            )
            .await
            .expect("delete at P2")
            .get(0);
        println!("as `coordinator` at P2: iris_delete({victim:?}, {eye_name:?}) = {deleted}");
        let (forged, _) =
            seal_iris_enrollment(&impostor, &victim, eye, &cluster.party_keys(), &mut rng)
                .expect("seal");
        let rows = clients[2]
            .query(
                "SELECT subject, eye, enrolled FROM privmatch.iris_enroll_sealed($1)",
                &[&vec![forged[2].clone()]],
            )
            .await
            .expect("the forged P2 envelope is stored");
        println!(
            "as `coordinator` at P2: iris_enroll_sealed(forged P2 envelope) = {:?}",
            rows.iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1), r.get::<_, bool>(2)))
                .collect::<Vec<_>>()
        );
    });
    println!("record counts after the attack: {:?}", cluster.record_counts());
    let after = search(&probe_path, &["--max-rotation", "0"]);
    println!(
        "after: victim's own probe, rotation 0: rc {:?} stdout {} stderr {}",
        after.code,
        after.stdout.trim(),
        after.stderr.trim()
    );
    let after_v: Option<Value> = serde_json::from_str(after.stdout.trim()).ok();
    let genuine_lost = after.success()
        && after_v
            .as_ref()
            .is_some_and(|v| !subjects_of(v).contains(&victim));
    let after_strangers = search(&stranger_path, &[]);
    let hits = after_strangers
        .stdout
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .map(|v| subjects_of(&v).contains(&victim))
                .unwrap_or(false)
        })
        .count();
    println!(
        "after: 8 unrelated probes (±15 rotations): rc {:?}, {hits} of 8 match {victim:?}; stderr {}",
        after_strangers.code,
        after_strangers.stderr.trim()
    );
    verdict(
        "forged-share-at-one-party",
        genuine_lost || (after_strangers.success() && hits > before_hits),
        &format!(
            "after iris_delete + iris_enroll_sealed(forged) at P2 only, `privmatch iris search` exits 0: the victim's own probe (rotation 0) matches {:?} (before: {:?}); {hits} of 8 unrelated probes now match {victim:?} (before: {before_hits}); no error, no trace",
            after_v.as_ref().map(subjects_of),
            serde_json::from_str::<Value>(before.stdout.trim()).ok().as_ref().map(subjects_of),
        ),
    );
    // Deleted at one party only (P1).
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let n: i64 = clients[1]
            .query_one("SELECT privmatch.iris_delete($1, $2)", &[&lost, &lost_eye])
            .await
            .expect("delete at P1")
            .get(0);
        println!("as `coordinator` at P1 only: iris_delete({lost:?}, {lost_eye:?}) = {n}");
    });
    let out = search(&probe_path, &[]);
    println!(
        "after the one-party delete: rc {:?} stdout {} stderr {}",
        out.code,
        out.stdout.trim(),
        out.stderr.trim()
    );
    verdict(
        "deleted-at-one-party",
        !out.success() || !out.stderr.contains(&lost),
        &format!(
            "rc {:?}; the entry deleted at P1 is not named: {}",
            out.code,
            out.stderr.lines().last().unwrap_or_default()
        ),
    );
    let recover = cluster.cli(&["recover"]);
    println!("privmatch recover: rc {:?} {} {}", recover.code, recover.stdout.trim(), recover.stderr.trim());
    let again = search(&probe_path, &[]);
    println!(
        "search after `privmatch recover`: rc {:?} stderr {}",
        again.code,
        again.stderr.lines().last().unwrap_or_default()
    );
}

// --- replayed operator command after a restore -----------------------------------------------

/// Attack d: P2's operator signs a pin of a (fake) key for P0, then of the honest key; the
/// coordinator keeps the first command. P2's database is dumped and restored as its operator
/// would; the coordinator relays the old command again.
#[test]
fn d_replayed_signed_command_after_restore() {
    let cluster = Cluster::start("old-attack-d-replay", 98);
    let operator =
        operator_key::load(&cluster.home.join("operators/p2.signing.key")).expect("operator key");
    let relay = |command: &[u8]| {
        cluster.query_as_coordinator(
            2,
            &format!(
                "SELECT privmatch.pin_peer_signed('\\x{}'::bytea)",
                hex::encode(command)
            ),
        )
    };
    let pinned_p0 = || -> String {
        let key: Vec<u8> = cluster.query(
            2,
            "SELECT public_key FROM privmatch.peers WHERE party_index = 0",
            &[],
        )[0]
        .get(0);
        hex::encode(key)
    };
    let honest = pinned_p0();
    let fake = [0x42u8; 32];
    let fake_pin = PeerPin {
        peer: PartyIndex::ALL[0],
        key: fake,
        replace: true,
    }
    .encode();
    let old_command = operator.sign(
        PartyIndex::ALL[2],
        operator_key::fresh_counter(),
        PEER_PIN_ACTION,
        &fake_pin,
    );
    relay(&old_command).expect("the fake pin, once");
    println!("P2 pins for P0 after the signed fake pin: {}", pinned_p0());
    let honest_pin = PeerPin {
        peer: PartyIndex::ALL[0],
        key: hex::decode(&honest).expect("hex").try_into().expect("32"),
        replace: true,
    }
    .encode();
    relay(&operator.sign(
        PartyIndex::ALL[2],
        operator_key::fresh_counter(),
        PEER_PIN_ACTION,
        &honest_pin,
    ))
    .expect("the honest pin");
    println!("P2 pins for P0 after the signed honest pin: {}", pinned_p0());
    let before = relay(&old_command);
    println!("replay before any restore: {before:?}");
    // Dump and restore P2's database, as its operator would.
    let file = cluster.path("p2.dump");
    let op = &cluster.operators[2];
    let mut dump = Command::new(pg_bindir().join("pg_dump"));
    dump.args(["-h", &op.host, "-p", &op.port.to_string()])
        .args(["-U", &op.user, "-d", &op.dbname, "-Fc", "-f"])
        .arg(&file)
        .env("PGPASSWORD", &op.password);
    run(dump, Duration::from_secs(120)).expect_success();
    let mut admin = op.clone();
    admin.dbname = "postgres".into();
    cluster.block_on(async {
        let client = privmatch_coordinator::parties::open(&admin)
            .await
            .expect("connect");
        client
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", op.dbname))
            .await
            .expect("drop");
        client
            .batch_execute(&format!("CREATE DATABASE {}", op.dbname))
            .await
            .expect("create");
    });
    let mut restore = Command::new(pg_bindir().join("pg_restore"));
    restore
        .args(["-h", &op.host, "-p", &op.port.to_string()])
        .args(["-U", &op.user, "-d", &op.dbname, "--exit-on-error"])
        .arg(&file)
        .env("PGPASSWORD", &op.password);
    let restored = run(restore, Duration::from_secs(120));
    println!("pg_restore: rc {:?} {}", restored.code, restored.stderr.trim());
    let rows: i64 = cluster.query(2, "SELECT count(*) FROM privmatch.operator_key", &[])[0].get(0);
    println!(
        "after the restore: privmatch.operator_key has {rows} row(s); P2 pins for P0: {}",
        pinned_p0()
    );
    if rows == 0 {
        // The operator key was not in the dump: the operator sets it again (as `cluster up`
        // did at creation), with the same key.
        let hex_key = operator.verifying_key().to_hex();
        cluster.query(2, "SELECT privmatch.set_operator_key($1)", &[&hex_key]);
        let counter: i64 =
            cluster.query(2, "SELECT last_counter FROM privmatch.operator_key", &[])[0].get(0);
        println!("operator re-set its key: last_counter = {counter}");
    }
    let replayed = relay(&old_command);
    let now = pinned_p0();
    println!("replay of the old fake-pin command after the restore: {replayed:?}; P2 pins for P0: {now}");
    verdict(
        "replayed-signed-command-after-restore",
        replayed.is_ok() && now == hex::encode(fake),
        &format!(
            "before the restore the replay was {}; after pg_dump/pg_restore of P2 (operator_key rows restored: {rows}) the same signed peer-pin was accepted and P2 pins {now} for P0 (honest key {honest})",
            match &before { Ok(_) => "accepted".to_owned(), Err((code, msg)) => format!("refused {code} {msg}") }
        ),
    );
}

// --- a result changed in transit ---------------------------------------------------------------

fn read_http(stream: &mut impl std::io::Read) -> std::io::Result<(String, Vec<u8>)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body)?;
    Ok((head, body))
}

fn rewrite_head(head: &str, extra: &[String]) -> String {
    let mut lines: Vec<String> = head
        .trim_end()
        .lines()
        .filter(|l| {
            let name = l.split(':').next().unwrap_or_default().to_ascii_lowercase();
            name != "content-length" && name != "connection" && name != "transfer-encoding"
        })
        .map(str::to_owned)
        .collect();
    lines.extend_from_slice(extra);
    format!("{}\r\n\r\n", lines.join("\r\n"))
}

/// A TLS proxy holding the coordinator's certificate: answers to `POST /v1/iris/search` get
/// `matches` replaced by mallory's and `unique` set to true.
fn start_proxy(cluster: &Cluster) -> u16 {
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    let tls = cluster.home.join("tls");
    let server = Arc::new(
        privmatch_coordinator::tls::server_config(
            &tls.join("coordinator.pem"),
            &tls.join("coordinator.key"),
        )
        .expect("the coordinator's certificate"),
    );
    let client =
        Arc::new(privmatch_coordinator::tls::client_config(&tls.join("ca.pem")).expect("the CA"));
    let upstream = cluster.coordinator_port;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for incoming in listener.incoming() {
            let Ok(tcp) = incoming else { continue };
            let (server, client) = (Arc::clone(&server), Arc::clone(&client));
            std::thread::spawn(move || -> std::io::Result<()> {
                use std::io::Write;
                let conn = rustls::ServerConnection::new(server).map_err(std::io::Error::other)?;
                let mut down = rustls::StreamOwned::new(conn, tcp);
                loop {
                    let (head, body) = read_http(&mut down)?;
                    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
                        .map_err(std::io::Error::other)?;
                    let conn = rustls::ClientConnection::new(Arc::clone(&client), name)
                        .map_err(std::io::Error::other)?;
                    let mut up = rustls::StreamOwned::new(
                        conn,
                        TcpStream::connect(("127.0.0.1", upstream))?,
                    );
                    let head_up = rewrite_head(
                        &head,
                        &[
                            format!("Content-Length: {}", body.len()),
                            "Connection: close".into(),
                        ],
                    );
                    up.write_all(head_up.as_bytes())?;
                    up.write_all(&body)?;
                    up.flush()?;
                    let (rhead, rbody) = read_http(&mut up)?;
                    let rbody = if head.starts_with("POST /v1/iris/search ") {
                        match serde_json::from_slice::<Value>(&rbody) {
                            Ok(mut v) => {
                                eprintln!(
                                    "proxy: the coordinator answered {}",
                                    String::from_utf8_lossy(&rbody)
                                );
                                if v.get("matches").is_some_and(|m| !m.is_null()) {
                                    v["matches"] = serde_json::json!([{"subject": "mallory", "eye": "left"}]);
                                }
                                if v.get("unique").is_some_and(|u| !u.is_null()) {
                                    v["unique"] = Value::Bool(true);
                                }
                                serde_json::to_vec(&v).unwrap_or_default()
                            }
                            Err(_) => rbody,
                        }
                    } else {
                        rbody
                    };
                    let rhead = rewrite_head(&rhead, &[format!("Content-Length: {}", rbody.len())]);
                    down.write_all(rhead.as_bytes())?;
                    down.write_all(&rbody)?;
                    down.flush()?;
                }
            });
        }
    });
    port
}

/// Attack e: the old CLI accepts whatever result the coordinator (here a proxy holding its
/// certificate) sends.
#[test]
fn e_result_changed_in_transit() {
    use privmatch_coordinator::config::{Config, CONFIG_FILE};
    let cluster = Cluster::start("old-attack-e-transit", 99);
    let enrolled = enroll_synthetic(&cluster, 24);
    let ((subject, eye), t) = enrolled
        .iter()
        .find(|((_, e), _)| e == "left")
        .map(|(k, t)| (k.clone(), *t))
        .expect("a left eye");
    let probes = cluster.path("probe.ndjson");
    write_lines(&probes, &[probe_line(&eye, &t)]);
    let probe_path = probes.display().to_string();
    let direct = cluster
        .cli(&["iris", "search", "--input", &probe_path, "--json"])
        .expect_success();
    println!("direct: {}", direct.stdout.trim());
    let port = start_proxy(&cluster);
    let config_path = cluster.home.join(CONFIG_FILE);
    let mut through = Config::load(&config_path).expect("client configuration");
    through.coordinator_url = format!("https://127.0.0.1:{port}");
    through.ca_cert = Some(cluster.home.join("tls/ca.pem"));
    let proxied_path = cluster.path("proxied.toml");
    through.save(&proxied_path).expect("save");
    let proxied = proxied_path.display().to_string();
    let tampered = cluster.cli(&[
        "--config",
        &proxied,
        "iris",
        "search",
        "--input",
        &probe_path,
        "--json",
    ]);
    println!(
        "through the proxy: rc {:?} stdout {} stderr {}",
        tampered.code,
        tampered.stdout.trim(),
        tampered.stderr.trim()
    );
    let got: Option<Value> = serde_json::from_str(tampered.stdout.trim()).ok();
    let subjects = got.as_ref().map(subjects_of).unwrap_or_default();
    verdict(
        "result-changed-in-transit (CLI identify)",
        tampered.success() && subjects == vec!["mallory".to_owned()],
        &format!(
            "the old CLI exited {:?} and printed matches {subjects:?} for a probe of {subject:?} (direct: {:?})",
            tampered.code,
            serde_json::from_str::<Value>(direct.stdout.trim()).ok().as_ref().map(subjects_of)
        ),
    );
    let unique = cluster.cli(&[
        "--config",
        &proxied,
        "iris",
        "search",
        "--input",
        &probe_path,
        "--uniqueness",
        "--json",
    ]);
    println!(
        "uniqueness through the proxy: rc {:?} stdout {}",
        unique.code,
        unique.stdout.trim()
    );
    verdict(
        "result-changed-in-transit (CLI uniqueness)",
        unique.success() && unique.stdout.contains("\"unique\":true"),
        &format!(
            "an enrolled subject's own probe reported {} by the old CLI",
            unique.stdout.trim()
        ),
    );
    // The front door at P0 through the same proxy: the application role's iris_identify.
    let sealed_file = cluster.path("sealed-identify.tsv");
    cluster
        .cli(&[
            "iris",
            "seal",
            "--for",
            "identify",
            "--input",
            &probe_path,
            "--out",
            &sealed_file.display().to_string(),
        ])
        .expect_success();
    let text = std::fs::read_to_string(&sealed_file).expect("sealed");
    let sealed = text
        .lines()
        .next()
        .and_then(|l| l.split('\t').nth(1))
        .expect("one sealed input")
        .to_owned();
    let app = cluster.application(0);
    let identify = |sealed: &str| {
        cluster
            .query_login(
                &app,
                "SELECT subject, eye FROM privmatch.iris_identify($1)",
                &[&sealed],
            )
            .map(|rows| {
                rows.iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                    .collect::<Vec<_>>()
            })
    };
    println!("front door at P0, direct: {:?}", identify(&sealed));
    cluster.query(
        0,
        &format!("ALTER SYSTEM SET privmatch.coordinator_url = 'https://127.0.0.1:{port}'"),
        &[],
    );
    cluster.query(0, "SELECT pg_reload_conf()", &[]);
    std::thread::sleep(Duration::from_millis(500));
    // A sealed input is single use at the coordinator? Seal afresh to be sure.
    cluster
        .cli(&[
            "iris",
            "seal",
            "--for",
            "identify",
            "--input",
            &probe_path,
            "--out",
            &sealed_file.display().to_string(),
        ])
        .expect_success();
    let text = std::fs::read_to_string(&sealed_file).expect("sealed");
    let sealed = text
        .lines()
        .next()
        .and_then(|l| l.split('\t').nth(1))
        .expect("one sealed input")
        .to_owned();
    let through = identify(&sealed);
    println!("front door at P0, through the proxy: {through:?}");
    verdict(
        "result-changed-in-transit (front door iris_identify)",
        through
            .as_ref()
            .is_ok_and(|rows| rows.iter().any(|(s, _)| s == "mallory")),
        &format!(
            "privmatch.iris_identify as the application role at P0 returned {through:?} for a probe of {subject:?}"
        ),
    );
}
