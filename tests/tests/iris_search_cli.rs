//! End-to-end tests of iris search through the product's own interfaces: `privmatch iris
//! search` (CLI → coordinator HTTP API → three parties), `privmatch iris enroll --if-unique`,
//! checked against the plaintext matcher of open-iris (`HammingDistanceMatcher(
//! rotation_shift=15, normalise=False)`: minimum fractional Hamming distance over ±15 columns
//! below τ = 0.345), and what the logs may contain; with `privmatch.gpu = on` on a machine with a
//! usable GPU, the same through the engines' GPU scan (SKIP elsewhere; `scripts/gpu-check.sh`).

use std::collections::{BTreeMap, BTreeSet};

use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate};
use privmatch_e2e::{enrollment_line, logged_sessions, run, wait_until, write_lines, Cluster};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::Value;

const TAU_NUM: u64 = 3_450;

/// Minimum fractional Hamming distance over rotations −max..=max (None: no common bits).
fn min_fhd(probe: &IrisTemplate, t: &IrisTemplate, max_rotation: i32) -> Option<f64> {
    (-max_rotation..=max_rotation)
        .filter_map(|k| {
            let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
            (common > 0).then(|| f64::from(hd) / f64::from(common))
        })
        .min_by(f64::total_cmp)
}

/// The plaintext decision, in exact integers: some rotation has hd·10,000 < 3,450·common.
fn plain_match(probe: &IrisTemplate, t: &IrisTemplate, max_rotation: i32) -> bool {
    (-max_rotation..=max_rotation).any(|k| {
        let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
        common > 0 && u64::from(hd) * 10_000 < TAU_NUM * u64::from(common)
    })
}

type Enrolled = BTreeMap<(String, String), IrisTemplate>;

fn expected_matches(
    enrolled: &Enrolled,
    probe: &IrisTemplate,
    eye: &str,
    rot: i32,
) -> Vec<(String, String)> {
    enrolled
        .iter()
        .filter(|((_, e), t)| e == eye && plain_match(probe, t, rot))
        .map(|(k, _)| k.clone())
        .collect()
}

fn probe_line(eye: &str, t: &IrisTemplate) -> String {
    serde_json::json!({"eye": eye, "iris_codes": t.code.to_base64(), "mask_codes": t.mask.to_base64()})
        .to_string()
}

/// Runs `privmatch iris search --json` and returns one JSON object per probe, in order.
fn search_json(cluster: &Cluster, input: &std::path::Path, extra: &[&str]) -> Vec<Value> {
    let input = input.display().to_string();
    let mut args = vec!["iris", "search", "--input", &input, "--json"];
    args.extend_from_slice(extra);
    let out = cluster.cli(&args).expect_success();
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line {l:?}: {e}")))
        .collect()
}

fn matches_of(v: &Value) -> Vec<(String, String)> {
    v["matches"]
        .as_array()
        .unwrap_or_else(|| panic!("no matches in {v}"))
        .iter()
        .map(|m| {
            (
                m["subject"].as_str().unwrap_or_default().to_owned(),
                m["eye"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Enrols `n` random templates (a quarter of them right eyes) and returns them.
fn enroll(cluster: &Cluster, rng: &mut ChaCha20Rng, n: usize, file: &str) -> Enrolled {
    let mut enrolled = Enrolled::new();
    let mut lines = Vec::new();
    for i in 0..n {
        let eye = if i % 4 == 3 { "right" } else { "left" };
        let subject = format!("{file}-{i:05}");
        let t = random_template(rng);
        lines.push(enrollment_line(&subject, eye, &t));
        enrolled.insert((subject, eye.to_owned()), t);
    }
    let path = cluster.path(file);
    write_lines(&path, &lines);
    cluster.enroll(&path, &[]).expect_success();
    enrolled
}

#[test]
fn cli_search_agrees_with_the_plaintext_matcher_on_thousands_of_templates() {
    let cluster = Cluster::start("search-cli", 23);
    let mut rng = ChaCha20Rng::seed_from_u64(23);
    let enrolled = enroll(&cluster, &mut rng, 2_000, "db");
    let templates: Vec<((String, String), IrisTemplate)> =
        enrolled.iter().map(|(k, t)| (k.clone(), *t)).collect();
    // Probes: rotated near-duplicates at distances around τ, and unrelated templates.
    let mut probes: Vec<(String, IrisTemplate)> = Vec::new();
    for i in 0..70 {
        let ((_, eye), t) = &templates[(i * 29) % templates.len()];
        let flip = [0.05, 0.25, 0.33, 0.34, 0.345, 0.35, 0.36][i % 7];
        let rotation = rng.gen_range(-15..=15);
        probes.push((eye.clone(), near_duplicate(t, flip, rotation, &mut rng)));
    }
    for i in 0..10 {
        probes.push((
            if i % 2 == 0 { "left" } else { "right" }.into(),
            random_template(&mut rng),
        ));
    }
    let path = cluster.path("probes.ndjson");
    write_lines(
        &path,
        &probes
            .iter()
            .map(|(eye, t)| probe_line(eye, t))
            .collect::<Vec<_>>(),
    );

    let near_threshold = probes
        .iter()
        .filter(|(eye, p)| {
            enrolled
                .iter()
                .filter(|((_, e), _)| e == eye)
                .filter_map(|(_, t)| min_fhd(p, t, 15))
                .any(|d| (d - 0.345).abs() < 0.005)
        })
        .count();
    assert!(
        near_threshold >= 10,
        "only {near_threshold} probes within 0.005 of τ"
    );

    let mut compared = 0;
    for (rot, extra) in [(15, vec![]), (0, vec!["--max-rotation", "0"])] {
        let got = search_json(&cluster, &path, &extra);
        assert_eq!(got.len(), probes.len());
        for (i, ((eye, probe), v)) in probes.iter().zip(&got).enumerate() {
            assert_eq!(v["probe"].as_u64(), Some(i as u64), "{v}");
            let expected = expected_matches(&enrolled, probe, eye, rot);
            assert_eq!(
                matches_of(v),
                expected,
                "probe {i} ({eye}), rotation ±{rot}"
            );
            compared += enrolled.len();
        }
    }
    let unique = search_json(&cluster, &path, &["--uniqueness"]);
    let mut found = 0;
    for (i, ((eye, probe), v)) in probes.iter().zip(&unique).enumerate() {
        let expected = expected_matches(&enrolled, probe, eye, 15).is_empty();
        assert_eq!(v["unique"].as_bool(), Some(expected), "probe {i}: {v}");
        found += usize::from(!expected);
    }
    assert!(
        found >= 30 && found < probes.len(),
        "{found} probes matched"
    );
    // Four clients searching at once (the engine runs their starts and rounds on request
    // threads side by side): each answer still equals the plaintext matcher's.
    let quarters: Vec<Vec<usize>> = (0..4)
        .map(|q| (0..probes.len()).filter(|i| i % 4 == q).collect())
        .collect();
    let concurrent: Vec<Vec<Value>> = std::thread::scope(|scope| {
        let running: Vec<_> = quarters
            .iter()
            .enumerate()
            .map(|(q, indices)| {
                let path = cluster.path(&format!("probes-{q}.ndjson"));
                let lines: Vec<String> = indices
                    .iter()
                    .map(|&i| probe_line(&probes[i].0, &probes[i].1))
                    .collect();
                write_lines(&path, &lines);
                let cluster = &cluster;
                scope.spawn(move || search_json(cluster, &path, &[]))
            })
            .collect();
        running.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (indices, answers) in quarters.iter().zip(&concurrent) {
        assert_eq!(answers.len(), indices.len());
        for (&i, v) in indices.iter().zip(answers) {
            let (eye, probe) = &probes[i];
            assert_eq!(
                matches_of(v),
                expected_matches(&enrolled, probe, eye, 15),
                "probe {i} ({eye}) in four concurrent searches"
            );
        }
    }
    eprintln!(
        "[search-cli] {compared} comparisons, {near_threshold} probes within 0.005 of τ, {found} matched: zero disagreements"
    );
    // Privacy: nothing of a probe or a share reaches a log.
    let mut logs = String::new();
    for p in 0..3 {
        logs.push_str(
            &std::fs::read_to_string(cluster.path(&format!("p{p}/postgres.log")))
                .unwrap_or_default(),
        );
    }
    logs.push_str(&std::fs::read_to_string(cluster.path("coordinator.log")).unwrap_or_default());
    for (_, probe) in &probes {
        let code = probe.code.to_base64();
        assert!(
            !logs.contains(&code[..24]),
            "a probe's code appears in a log"
        );
    }
    assert!(
        !logs.to_lowercase().contains("distance"),
        "a log mentions distances"
    );
}

/// `engine_status()`'s `kernel` column of every party.
fn engine_kernels(cluster: &Cluster) -> Vec<String> {
    (0..3)
        .map(|p| cluster.query(p, "SELECT kernel FROM privmatch.engine_status()", &[])[0].get(0))
        .collect()
}

/// Probes of `enrolled`: rotated near-duplicates around τ, and `strangers` unrelated ones.
fn probes_near(
    enrolled: &Enrolled,
    rng: &mut ChaCha20Rng,
    count: usize,
    strangers: usize,
) -> Vec<(String, IrisTemplate)> {
    let templates: Vec<(&(String, String), &IrisTemplate)> = enrolled.iter().collect();
    let mut probes: Vec<(String, IrisTemplate)> = (0..count)
        .map(|i| {
            let ((_, eye), t) = templates[(i * 37) % templates.len()];
            let flip = [0.05, 0.3, 0.34, 0.35, 0.4][i % 5];
            let rotation = rng.gen_range(-15..=15);
            (eye.clone(), near_duplicate(t, flip, rotation, rng))
        })
        .collect();
    probes.extend((0..strangers).map(|i| {
        let eye = if i % 2 == 0 { "left" } else { "right" };
        (eye.to_owned(), random_template(rng))
    }));
    probes
}

/// Searches `probes` through the CLI and the coordinator with ±15 columns and with none,
/// and asserts every answer equals the plaintext matcher's; returns the comparisons made.
fn assert_searches_agree(
    cluster: &Cluster,
    enrolled: &Enrolled,
    probes: &[(String, IrisTemplate)],
    file: &str,
) -> usize {
    let path = cluster.path(file);
    let lines: Vec<String> = probes.iter().map(|(eye, t)| probe_line(eye, t)).collect();
    write_lines(&path, &lines);
    let mut compared = 0;
    for (rot, extra) in [(15, vec![]), (0, vec!["--max-rotation", "0"])] {
        let got = search_json(cluster, &path, &extra);
        assert_eq!(got.len(), probes.len());
        for (i, ((eye, probe), v)) in probes.iter().zip(&got).enumerate() {
            let expected = expected_matches(enrolled, probe, eye, rot);
            assert_eq!(matches_of(v), expected, "{file}: probe {i} ({eye}), ±{rot}");
            compared += enrolled.len() * (2 * rot as usize + 1);
        }
    }
    compared
}

/// The whole search with `privmatch.gpu = on` on a machine with a usable GPU: every party's
/// engine scans on the GPU (`engine_status()` says so before and after), and CLI searches
/// through the coordinator equal the plaintext matcher's answers, also after the store grew
/// and shrank under the GPU copy (enrolments and deletions between searches) and after the
/// engines restarted (the copy is rebuilt). Prints SKIP and passes where no GPU is usable
/// (CI); `scripts/gpu-check.sh` runs it on a GPU machine.
#[test]
fn with_gpu_on_searches_scan_on_the_gpu_and_agree_with_the_plaintext_matcher() {
    if let Err(reason) = privmatch_gpu::probe::probe() {
        eprintln!("SKIP: no usable GPU here ({reason})");
        return;
    }
    let cluster = Cluster::start("search-gpu", 29);
    let mut rng = ChaCha20Rng::seed_from_u64(29);
    let mut enrolled = enroll(&cluster, &mut rng, 2_000, "before");
    let restart_engines_on_the_gpu = |cluster: &Cluster| {
        for p in 0..3 {
            cluster.query(p, "ALTER SYSTEM SET privmatch.gpu = 'on'", &[]);
            cluster.query(p, "SELECT pg_reload_conf()", &[]);
            cluster.query(
                p,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'privmatch engine'",
                &[],
            );
        }
        privmatch_e2e::wait_until(
            std::time::Duration::from_secs(60),
            "every engine to scan on the GPU",
            || {
                engine_kernels(cluster)
                    .iter()
                    .all(|k| k.starts_with("gpu: "))
            },
        );
    };
    restart_engines_on_the_gpu(&cluster);
    eprintln!("[search-gpu] engines: {:?}", engine_kernels(&cluster));
    let mut compared = 0;
    let probes = probes_near(&enrolled, &mut rng, 24, 6);
    compared += assert_searches_agree(&cluster, &enrolled, &probes, "probes-1.ndjson");
    // The store grows and shrinks under the GPU's copy of the shares.
    enrolled.extend(enroll(&cluster, &mut rng, 1_001, "after"));
    let deleted: Vec<(String, String)> = enrolled.keys().step_by(40).cloned().collect();
    let mut gone = Enrolled::new();
    for (subject, _) in &deleted {
        cluster
            .cli(&["iris", "delete", "--subject", subject])
            .expect_success();
        gone.extend(enrolled.extract_if(.., |(s, _), _| s == subject));
    }
    // New probes, and probes of deleted records (which must find nothing of them).
    let mut probes = probes_near(&enrolled, &mut rng, 24, 6);
    probes.extend(probes_near(&gone, &mut rng, 6, 0));
    compared += assert_searches_agree(&cluster, &enrolled, &probes, "probes-2.ndjson");
    // Restarted engines rebuild the copy from the store.
    restart_engines_on_the_gpu(&cluster);
    let probes = probes_near(&enrolled, &mut rng, 12, 4);
    compared += assert_searches_agree(&cluster, &enrolled, &probes, "probes-3.ndjson");
    let kernels = engine_kernels(&cluster);
    assert!(
        kernels.iter().all(|k| k.starts_with("gpu: ")),
        "{kernels:?}"
    );
    for p in 0..3 {
        let log = std::fs::read_to_string(cluster.path(&format!("p{p}/postgres.log")))
            .unwrap_or_default();
        assert!(
            !log.contains("falling back to the CPU"),
            "party {p} fell back to the CPU scan:\n{log}"
        );
    }
    eprintln!(
        "[search-gpu] {} records, {compared} rotation comparisons on the GPU scan: zero disagreements; {kernels:?}",
        enrolled.len()
    );
}

#[test]
fn both_eyes_policies_and_probe_file_errors() {
    let cluster = Cluster::start("search-eyes", 24);
    let mut rng = ChaCha20Rng::seed_from_u64(24);
    // Subject A has both eyes enrolled, B only a left eye.
    let (al, ar, bl) = (
        random_template(&mut rng),
        random_template(&mut rng),
        random_template(&mut rng),
    );
    let path = cluster.path("enrol.ndjson");
    write_lines(
        &path,
        &[
            enrollment_line("A", "left", &al),
            enrollment_line("A", "right", &ar),
            enrollment_line("B", "left", &bl),
        ],
    );
    cluster.enroll(&path, &[]).expect_success();
    let near = |t: &IrisTemplate, rng: &mut ChaCha20Rng| near_duplicate(t, 0.1, 4, rng);
    let two = |l: &IrisTemplate, r: &IrisTemplate| {
        serde_json::json!({
            "left": {"iris_codes": l.code.to_base64(), "mask_codes": l.mask.to_base64()},
            "right": {"iris_codes": r.code.to_base64(), "mask_codes": r.mask.to_base64()},
        })
        .to_string()
    };
    let other = random_template(&mut rng);
    let probes = cluster.path("probes.ndjson");
    // Probe 0: A's two eyes; probe 1: B's left eye and a stranger's right eye.
    write_lines(
        &probes,
        &[
            two(&near(&al, &mut rng), &near(&ar, &mut rng)),
            two(&near(&bl, &mut rng), &other),
        ],
    );
    let key = |s: &str, e: &str| (s.to_owned(), e.to_owned());
    let or = search_json(&cluster, &probes, &["--policy", "or"]);
    assert_eq!(
        matches_of(&or[0]),
        vec![key("A", "left"), key("A", "right")]
    );
    assert_eq!(matches_of(&or[1]), vec![key("B", "left")]);
    let and = search_json(&cluster, &probes, &["--policy", "and"]);
    assert_eq!(
        matches_of(&and[0]),
        vec![key("A", "left"), key("A", "right")]
    );
    assert_eq!(matches_of(&and[1]), Vec::<(String, String)>::new());
    let unique = search_json(&cluster, &probes, &["--uniqueness"]);
    assert_eq!(unique[0]["unique"], Value::Bool(false));
    // Uniqueness with the AND policy is refused before anything is searched.
    let input = probes.display().to_string();
    cluster
        .cli(&[
            "iris",
            "search",
            "--input",
            &input,
            "--uniqueness",
            "--policy",
            "and",
        ])
        .expect_failure();
    // A malformed line is reported with its number; nothing is searched.
    let bad = cluster.path("bad.ndjson");
    write_lines(
        &bad,
        &[
            probe_line("left", &al),
            "{\"eye\": \"left\", \"iris_codes\": \"AAAA\"}".into(),
        ],
    );
    let bad_input = bad.display().to_string();
    let out = cluster
        .cli(&["iris", "search", "--input", &bad_input])
        .expect_failure();
    out.assert_stderr_contains(&["line 2"]);
    // The HTTP API refuses a malformed request with 400.
    let (status, body) =
        cluster.post_bytes("/v1/iris/search", b"{\"mode\": \"identify\"}".to_vec());
    assert_eq!(status, 400, "{body}");
}

#[test]
fn enroll_if_unique_is_atomic_against_concurrent_enrollments() {
    let cluster = Cluster::start("if-unique", 25);
    let mut rng = ChaCha20Rng::seed_from_u64(25);
    let base = enroll(&cluster, &mut rng, 50, "base");
    // Two files enrolled concurrently: record i of the first and record i of the second are
    // near-duplicates of each other (different subjects); exactly one of each pair may end up
    // enrolled. A third file duplicates an already enrolled template.
    let pairs = 12;
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let t = random_template(&mut rng);
        let twin = near_duplicate(&t, 0.1, rng.gen_range(-15..=15), &mut rng);
        first.push(enrollment_line(&format!("x-{i}"), "left", &t));
        second.push(enrollment_line(&format!("y-{i}"), "left", &twin));
    }
    let (f1, f2) = (cluster.path("first.ndjson"), cluster.path("second.ndjson"));
    write_lines(&f1, &first);
    write_lines(&f2, &second);
    let (s1, s2) = (f1.display().to_string(), f2.display().to_string());
    let a = cluster.cli_background(&[
        "iris",
        "enroll",
        "--input",
        &s1,
        "--if-unique",
        "--no-progress",
    ]);
    let b = cluster.cli_background(&[
        "iris",
        "enroll",
        "--input",
        &s2,
        "--if-unique",
        "--no-progress",
    ]);
    let timeout = std::time::Duration::from_secs(300);
    let (a, b) = (
        a.wait(timeout).expect_success(),
        b.wait(timeout).expect_success(),
    );
    eprintln!(
        "[if-unique] first: {}\n[if-unique] second: {}",
        a.stdout.trim(),
        b.stdout.trim()
    );
    for p in 0..3 {
        let keys: BTreeSet<String> = cluster.keys(p).into_iter().map(|(s, _)| s).collect();
        for i in 0..pairs {
            let both = [format!("x-{i}"), format!("y-{i}")];
            let n = both.iter().filter(|s| keys.contains(*s)).count();
            assert_eq!(n, 1, "P{p}: pair {i} has {n} enrolled");
        }
    }
    assert_eq!(cluster.record_counts(), [50 + pairs as i64; 3]);
    assert_eq!(cluster.prepared_counts(), [0; 3]);
    // A near-duplicate of an enrolled template is refused, a fresh one enrolled.
    let (key, t) = base
        .iter()
        .next()
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let dup = near_duplicate(&t, 0.2, 7, &mut rng);
    let f3 = cluster.path("third.ndjson");
    write_lines(
        &f3,
        &[
            enrollment_line("z-dup", &key.1, &dup),
            enrollment_line("z-new", "left", &random_template(&mut rng)),
        ],
    );
    let s3 = f3.display().to_string();
    let out = cluster
        .cli(&[
            "iris",
            "enroll",
            "--input",
            &s3,
            "--if-unique",
            "--no-progress",
        ])
        .expect_success();
    assert!(
        out.stdout
            .contains("enrolled 1, skipped (duplicates) 0, refused (not unique) 1"),
        "{out}"
    );
    assert_eq!(cluster.subject_count(0, "z-dup"), 0);
    assert_eq!(cluster.subject_count(2, "z-new"), 1);
}

#[test]
fn a_search_with_a_party_down_fails_clearly_and_leaves_nothing_behind() {
    let cluster = Cluster::start("search-down", 26);
    let mut rng = ChaCha20Rng::seed_from_u64(26);
    let enrolled = enroll(&cluster, &mut rng, 20, "db");
    let ((subject, eye), t) = enrolled
        .iter()
        .next()
        .map(|(k, t)| (k.clone(), *t))
        .expect("one");
    let probes = cluster.path("probes.ndjson");
    write_lines(
        &probes,
        &[probe_line(&eye, &near_duplicate(&t, 0.1, -6, &mut rng))],
    );
    let input = probes.display().to_string();
    // P1, the middle one: the coordinator reaches P0 and P2 and must give each connection
    // back to its own party's pool (a P2 connection filed under P1 once served the next
    // transaction as P1's).
    cluster.kill_party(1);
    let out = cluster
        .cli(&["iris", "search", "--input", &input, "--json"])
        .expect_failure();
    out.assert_stderr_contains(&["P1"]);
    assert!(
        out.stdout.trim().is_empty(),
        "no result may be printed: {out}"
    );
    // The parties that were reached hold no session of the failed search.
    for p in [0, 2] {
        let sessions: i32 =
            cluster.query(p, "SELECT sessions FROM privmatch.engine_status()", &[])[0].get(0);
        assert_eq!(sessions, 0, "P{p} kept a session");
    }
    let down = cluster.path("while-down.ndjson");
    write_lines(
        &down,
        &[enrollment_line(
            "while-down",
            "left",
            &random_template(&mut rng),
        )],
    );
    cluster
        .enroll(&down, &[])
        .expect_failure()
        .assert_stderr_contains(&["P1"]);
    cluster.start_party(1);
    let got = search_json(&cluster, &probes, &[]);
    assert_eq!(matches_of(&got[0]), vec![(subject.clone(), eye.clone())]);
    // Enrolment and search through the same coordinator after the party is back.
    let more = enroll(&cluster, &mut rng, 3, "after");
    let ((new_subject, new_eye), new_t) = more.into_iter().next().expect("one");
    write_lines(
        &probes,
        &[probe_line(
            &new_eye,
            &near_duplicate(&new_t, 0.1, 4, &mut rng),
        )],
    );
    let got = search_json(&cluster, &probes, &[]);
    assert_eq!(matches_of(&got[0]), vec![(new_subject, new_eye)]);
}

/// The client configuration at `path` with the parties' signing keys pinned (as
/// `party_info()` shows them; their operators hand them out with their identity bundles).
fn config_pinning_signing_keys(
    cluster: &Cluster,
    path: &std::path::Path,
) -> privmatch_coordinator::config::Config {
    let mut config =
        privmatch_coordinator::config::Config::load(path).expect("client configuration");
    config.party_signing_keys = (0..3)
        .map(|p| {
            cluster.query(p, "SELECT signing_key FROM privmatch.party_info()", &[])[0]
                .get::<_, String>(0)
        })
        .collect();
    config
}

/// How the proxy of [`start_proxy`] changes the coordinator's answers to `POST
/// /v1/iris/search` (and, for the last two, to `POST /v1/iris/enroll-if-unique`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tamper {
    /// Passes them through.
    Nothing,
    /// Flips one bit of P1's sealed output of the first eye.
    AlterP1,
    /// Swaps P0's and P2's sealed outputs of the first eye.
    SwapP0P2,
    /// Adds a combined `matches` (and `unique`) of its own, which the coordinator never sends.
    AddCombined,
    /// Turns an enroll-if-unique `outcome` of `not_unique` into `enrolled` and back.
    FlipOutcome,
    /// Removes the sealed outputs from an enroll-if-unique answer.
    DropOutcomeOutputs,
}

/// A TLS proxy in front of the coordinator holding the coordinator's own certificate (what
/// a coordinator that rewrites its answers looks like to a client), on an ephemeral loopback
/// port; it rewrites search answers as `tamper` says.
struct TamperProxy {
    port: u16,
    tamper: std::sync::Arc<std::sync::Mutex<Tamper>>,
    /// The bodies of the iris search and enroll-if-unique requests it relayed.
    searches: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl TamperProxy {
    fn set(&self, tamper: Tamper) {
        *self.tamper.lock().expect("tamper") = tamper;
    }

    /// What a curious coordinator reads in the search requests: no field names the mode, the
    /// rotation range or the threshold (the probes carry them, sealed). Against e81c3c7 every
    /// request named all three (`mode`, `max_rotation`, `threshold`; enroll-if-unique its
    /// `threshold`).
    fn assert_no_search_parameters(&self) {
        let searches = self.searches.lock().expect("searches");
        assert!(!searches.is_empty(), "the proxy relayed no search");
        for body in searches.iter() {
            let request: Value = serde_json::from_slice(body).expect("a JSON request");
            let fields: Vec<&String> = request
                .as_object()
                .map(|o| o.keys().collect())
                .unwrap_or_default();
            for key in ["mode", "max_rotation", "threshold"] {
                assert!(
                    request.get(key).is_none(),
                    "the coordinator was sent the search's {key} (the request's fields: {fields:?})"
                );
            }
            // Since 0.15.0 a search declares its mode and rotation range for batching (what the
            // rounds tell anyway; enroll-if-unique declares nothing); the threshold never.
            let declared = &request["batch"];
            assert!(
                declared.get("threshold").is_none(),
                "the batch declaration: {declared}"
            );
        }
    }
}

/// Reads one HTTP/1.1 message (head and a Content-Length body).
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

/// `head` without its Content-Length and Connection lines, with `extra` lines added.
fn rewrite_head(head: &str, extra: &[String]) -> String {
    let mut lines: Vec<String> = head
        .trim_end()
        .lines()
        .filter(|l| {
            let name = l.split(':').next().unwrap_or_default().to_ascii_lowercase();
            name != "content-length" && name != "connection"
        })
        .map(str::to_owned)
        .collect();
    lines.extend_from_slice(extra);
    format!("{}\r\n\r\n", lines.join("\r\n"))
}

fn tamper_answer(tamper: Tamper, body: &[u8]) -> Vec<u8> {
    use privmatch_api::wire::{from_base64, to_base64};
    let Ok(mut v) = serde_json::from_slice::<Value>(body) else {
        return body.to_vec();
    };
    match tamper {
        Tamper::Nothing => return body.to_vec(),
        Tamper::AlterP1 => {
            let output = &mut v["eyes"][0]["sealed_outputs"][1];
            if let Some(mut bytes) = output.as_str().and_then(|s| from_base64(s, "o").ok()) {
                let at = bytes.len() / 2;
                bytes[at] ^= 1;
                *output = Value::String(to_base64(&bytes));
            }
        }
        Tamper::SwapP0P2 => {
            if let Some(outputs) = v["eyes"][0]["sealed_outputs"].as_array_mut() {
                outputs.swap(0, 2);
            }
        }
        Tamper::AddCombined => {
            v["matches"] = serde_json::json!([{"subject": "mallory", "eye": "left"}]);
            v["unique"] = Value::Bool(true);
        }
        Tamper::FlipOutcome => {
            let flipped = match v["outcome"].as_str() {
                Some("not_unique") => "enrolled",
                Some("enrolled") => "not_unique",
                _ => return body.to_vec(),
            };
            v["outcome"] = Value::String(flipped.into());
        }
        Tamper::DropOutcomeOutputs => {
            if let Some(answer) = v.as_object_mut() {
                answer.remove("sealed_outputs");
            }
        }
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// With [`Tamper::FlipOutcome`], the answer of a coordinator whose API refused a non-unique
/// record with HTTP 409 (`not_unique`, privmatch 0.12.0 and earlier) rewritten as a 200
/// `enrolled` for the request's subject and eye; None for any other answer.
fn forge_enrolled(tamper: Tamper, head: &str, body: &[u8], request: &[u8]) -> Option<Vec<u8>> {
    if tamper != Tamper::FlipOutcome || !head.starts_with("HTTP/1.1 409") {
        return None;
    }
    let error: Value = serde_json::from_slice(body).ok()?;
    if error["code"] != "not_unique" {
        return None;
    }
    let request: Value = serde_json::from_slice(request).ok()?;
    serde_json::to_vec(&serde_json::json!({
        "subject": request["subject"],
        "eye": request["eye"],
        "outcome": "enrolled",
        "pending_recovery": [],
    }))
    .ok()
}

fn start_proxy(cluster: &Cluster) -> TamperProxy {
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};
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
    let tamper = Arc::new(Mutex::new(Tamper::Nothing));
    let searches = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&searches);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let port = listener.local_addr().expect("address").port();
    let shared = Arc::clone(&tamper);
    std::thread::spawn(move || {
        for incoming in listener.incoming() {
            let Ok(tcp) = incoming else { continue };
            let (server, client, tamper, seen) = (
                Arc::clone(&server),
                Arc::clone(&client),
                Arc::clone(&shared),
                Arc::clone(&seen),
            );
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
                    let (mut rhead, rbody) = read_http(&mut up)?;
                    let is_search = head.starts_with("POST /v1/iris/search ")
                        || head.starts_with("POST /v1/iris/enroll-if-unique ");
                    if is_search {
                        seen.lock()
                            .map_err(|_| std::io::Error::other("lock"))?
                            .push(body.clone());
                    }
                    let mode = *tamper.lock().map_err(|_| std::io::Error::other("lock"))?;
                    let rbody = if let Some(forged) = forge_enrolled(mode, &rhead, &rbody, &body) {
                        rhead = rhead.replacen("409 Conflict", "200 OK", 1);
                        forged
                    } else if is_search {
                        tamper_answer(mode, &rbody)
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
    TamperProxy {
        port,
        tamper,
        searches,
    }
}

/// Items 2, 3 and 4 of issue 34 through the product's interfaces. (a) The iris threshold is
/// the operators' policy: the CLI has no `--threshold`, `privmatch iris policy set` changes it
/// at one party with that party's operator key, and the front door refuses a probe sealed with
/// another threshold (22023). (b) Every party signs its output and seals it to the client: the
/// coordinator's answer carries sealed outputs only (no subject, no bit), and a proxy holding
/// the coordinator's certificate that alters one (P1's) or swaps two (P0's and P2's) is
/// refused by the CLI and by the front door at P0 (28000), naming the party; a combined answer
/// the proxy adds is ignored (the client combines what it opened). Against f21d1f1 the
/// threshold was the caller's and both clients took whatever JSON the coordinator sent; in
/// 0.11.0 the results were signed but travelled in the clear.
#[test]
fn the_threshold_is_policy_and_results_changed_in_transit_are_refused() {
    use privmatch_coordinator::config::CONFIG_FILE;
    let cluster = Cluster::start("search-signed", 88);
    let mut rng = ChaCha20Rng::seed_from_u64(88);
    let enrolled = enroll(&cluster, &mut rng, 24, "db");
    let ((subject, eye), t) = enrolled
        .iter()
        .find(|((_, e), _)| e == "left")
        .map(|(k, t)| (k.clone(), *t))
        .expect("a left eye");
    let probes = cluster.path("probe.ndjson");
    write_lines(&probes, &[probe_line(&eye, &t)]);
    let probe_path = probes.display().to_string();

    // (a) The threshold is policy.
    let out = cluster
        .cli(&[
            "iris",
            "search",
            "--input",
            &probe_path,
            "--threshold",
            "0.2",
        ])
        .expect_failure();
    out.assert_stderr_contains(&["--threshold"]);
    let shown = cluster.cli(&["iris", "policy", "show"]).expect_success();
    assert!(shown.stdout.contains("P2: iris threshold 0.345"), "{shown}");
    let key = |p: usize| {
        cluster
            .home
            .join(format!("operators/p{p}.signing.key"))
            .display()
            .to_string()
    };
    for p in 0..3 {
        let set = cluster
            .cli(&[
                "iris",
                "policy",
                "set",
                "--party",
                &p.to_string(),
                "--threshold",
                "0.3",
                "--operator-key",
                &key(p),
            ])
            .expect_success();
        assert!(set.stdout.contains("set to 0.3"), "{set}");
    }
    let shown = cluster.cli(&["iris", "policy", "show"]).expect_success();
    assert!(shown.stdout.contains("P1: iris threshold 0.3\n"), "{shown}");
    // The front door: a probe sealed at the old default is refused by the parties.
    let app = cluster.application(0);
    let seal = |threshold: &str, purpose: &str| {
        let out = cluster.path(&format!("sealed-{purpose}-{threshold}.tsv"));
        cluster
            .cli(&[
                "iris",
                "seal",
                "--for",
                purpose,
                "--input",
                &probe_path,
                "--out",
                &out.display().to_string(),
                "--threshold",
                threshold,
                "--front-door",
                "0",
            ])
            .expect_success();
        let text = std::fs::read_to_string(&out).expect("sealed");
        text.lines()
            .next()
            .and_then(|l| l.split('\t').nth(1))
            .expect("one sealed input")
            .to_owned()
    };
    let identify = |sealed: &str| {
        cluster.query_login(
            &app,
            "SELECT subject, eye FROM privmatch.iris_identify($1)",
            &[&sealed],
        )
    };
    let err = identify(&seal("0.345", "identify")).expect_err("not the policy");
    assert_eq!(err.0, "22023", "{err:?}");
    assert!(err.1.contains("threshold policy"), "{err:?}");
    let rows = identify(&seal("0.3", "identify")).expect("at the policy");
    assert_eq!(
        rows.iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect::<Vec<_>>(),
        vec![(subject.clone(), eye.clone())]
    );

    // (b) Signed outputs. The client pins the parties' signing keys (as party_info() shows
    // them; their operators hand them out with their identity bundles).
    let config_path = cluster.home.join(CONFIG_FILE);
    let config = config_pinning_signing_keys(&cluster, &config_path);
    config.save(&config_path).expect("save");
    let direct = cluster
        .cli(&["iris", "search", "--input", &probe_path, "--json"])
        .expect_success();
    assert!(!direct.stderr.contains("not verified"), "{direct}");
    assert_eq!(
        matches_of(&serde_json::from_str(direct.stdout.trim()).expect("json")),
        vec![(subject.clone(), eye.clone())]
    );
    let proxy = start_proxy(&cluster);
    let mut through = config.clone();
    through.coordinator_url = format!("https://127.0.0.1:{}", proxy.port);
    through.ca_cert = Some(cluster.home.join("tls/ca.pem"));
    let proxied_path = cluster.path("proxied.toml");
    through.save(&proxied_path).expect("save");
    let proxied = proxied_path.display().to_string();
    let search = |extra: &[&str]| {
        let mut args = vec![
            "--config",
            &proxied,
            "iris",
            "search",
            "--input",
            &probe_path,
        ];
        args.extend_from_slice(extra);
        cluster.cli(&args)
    };
    // Passed through untouched: accepted. What the coordinator answered holds no subject and
    // no combined result (the proxy sees what the coordinator sends).
    let ok = search(&["--json"]).expect_success();
    assert_eq!(
        matches_of(&serde_json::from_str(ok.stdout.trim()).expect("json")),
        vec![(subject.clone(), eye.clone())]
    );
    proxy.set(Tamper::AlterP1);
    search(&[]).expect_failure().assert_stderr_contains(&[
        "P1's sealed output of the left eye's search is refused",
        "does not open",
    ]);
    proxy.set(Tamper::SwapP0P2);
    search(&["--uniqueness"])
        .expect_failure()
        .assert_stderr_contains(&["P0's sealed output of the left eye's search is refused"]);
    proxy.set(Tamper::AddCombined);
    let added = search(&["--json"]).expect_success();
    assert_eq!(
        matches_of(&serde_json::from_str(added.stdout.trim()).expect("json")),
        vec![(subject.clone(), eye.clone())]
    );
    let unique = search(&["--uniqueness", "--json"]).expect_success();
    assert!(unique.stdout.contains("\"unique\":false"), "{unique}");

    // The front door at P0, through the same proxy.
    cluster.query(
        0,
        &format!(
            "ALTER SYSTEM SET privmatch.coordinator_url = 'https://127.0.0.1:{}'",
            proxy.port
        ),
        &[],
    );
    cluster.query(0, "SELECT pg_reload_conf()", &[]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    proxy.set(Tamper::AlterP1);
    let err = identify(&seal("0.3", "identify")).expect_err("an altered output");
    assert_eq!(err.0, "28000", "{err:?}");
    assert!(
        err.1
            .contains("P1's sealed output of the left eye's search is refused"),
        "{err:?}"
    );
    // A combined list added by the proxy: the rows come from the opened outputs.
    proxy.set(Tamper::AddCombined);
    let rows = identify(&seal("0.3", "identify")).expect("the opened rows");
    assert_eq!(
        rows.iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect::<Vec<_>>(),
        vec![(subject.clone(), eye.clone())]
    );
    proxy.set(Tamper::SwapP0P2);
    let err = cluster
        .query_login(
            &app,
            "SELECT privmatch.iris_is_unique($1)",
            &[&seal("0.3", "uniqueness")],
        )
        .expect_err("swapped outputs");
    assert_eq!(err.0, "28000", "{err:?}");
    assert!(err.1.contains("P0's sealed output"), "{err:?}");
    proxy.set(Tamper::Nothing);
    let unique: bool = cluster
        .query_login(
            &app,
            "SELECT privmatch.iris_is_unique($1)",
            &[&seal("0.3", "uniqueness")],
        )
        .expect("untouched")[0]
        .get(0);
    assert!(!unique);
    // The CLI's searches and the front door's, identify and uniqueness.
    proxy.assert_no_search_parameters();
}

/// Enroll-if-unique's outcome is checked by the client: the coordinator's answer carries the
/// three parties' signed outputs of the uniqueness search, sealed to the reply key in the
/// client's probe, and the CLI refuses an outcome they contradict. A proxy holding the
/// coordinator's certificate that turns `not_unique` into `enrolled` (a duplicate reported as
/// a fresh identity) or `enrolled` into `not_unique`, or drops the outputs, is refused; the
/// untouched answers are accepted. Against 0.12.0 (6fd0073) the client discarded the reply key
/// and believed the `outcome` field: the flipped answers were accepted (run on 2026-11-29).
#[test]
fn an_enroll_if_unique_outcome_changed_in_transit_is_refused() {
    use privmatch_coordinator::config::CONFIG_FILE;
    let cluster = Cluster::start("if-unique-signed", 48);
    let mut rng = ChaCha20Rng::seed_from_u64(48);
    let base = enroll(&cluster, &mut rng, 20, "base");
    let mut config = config_pinning_signing_keys(&cluster, &cluster.home.join(CONFIG_FILE));
    let proxy = start_proxy(&cluster);
    config.coordinator_url = format!("https://127.0.0.1:{}", proxy.port);
    config.ca_cert = Some(cluster.home.join("tls/ca.pem"));
    let proxied_path = cluster.path("proxied.toml");
    config.save(&proxied_path).expect("save");
    let proxied = proxied_path.display().to_string();
    let (dup_of, t) = base
        .iter()
        .find(|((_, eye), _)| eye == "left")
        .map(|(k, t)| (k.clone(), *t))
        .expect("a left eye");
    let one = |name: &str, template: &IrisTemplate| {
        let file = cluster.path(&format!("{name}.ndjson"));
        write_lines(&file, &[enrollment_line(name, "left", template)]);
        let file = file.display().to_string();
        cluster.cli(&[
            "--config",
            &proxied,
            "iris",
            "enroll",
            "--input",
            &file,
            "--if-unique",
            "--no-progress",
        ])
    };
    // A near-duplicate reported as enrolled: refused, and nothing was enrolled.
    proxy.set(Tamper::FlipOutcome);
    let dup = near_duplicate(&t, 0.2, 5, &mut rng);
    one("flip-dup", &dup)
        .expect_failure()
        .assert_stderr_contains(&[
            "the coordinator reported enrolled",
            "say the template is not unique",
        ]);
    assert_eq!(cluster.subject_count(0, "flip-dup"), 0, "{dup_of:?}");
    // A fresh template reported as not unique: refused (it was enrolled; the user is told).
    let fresh = random_template(&mut rng);
    one("flip-fresh", &fresh)
        .expect_failure()
        .assert_stderr_contains(&[
            "the coordinator reported not unique",
            "say the template is unique",
        ]);
    // Outputs dropped: refused.
    proxy.set(Tamper::DropOutcomeOutputs);
    let other = random_template(&mut rng);
    one("dropped", &other)
        .expect_failure()
        .assert_stderr_contains(&["carries no sealed outputs"]);
    // Untouched: a duplicate refused as not unique, a fresh one enrolled.
    proxy.set(Tamper::Nothing);
    let out = one("plain-dup", &near_duplicate(&t, 0.2, -3, &mut rng)).expect_success();
    assert!(
        out.stdout
            .contains("enrolled 0, skipped (duplicates) 0, refused (not unique) 1"),
        "{out}"
    );
    let out = one("plain-fresh", &random_template(&mut rng)).expect_success();
    assert!(
        out.stdout
            .contains("enrolled 1, skipped (duplicates) 0, refused (not unique) 0"),
        "{out}"
    );
    assert_eq!(cluster.subject_count(2, "plain-fresh"), 1);
    assert_eq!(cluster.subject_count(1, "plain-dup"), 0);
    // The enroll-if-unique requests carried no threshold: the probes hold it, sealed.
    proxy.assert_no_search_parameters();
}

/// Issue 35's tracing: one search is found by its session id in all five logs — the client's
/// (the id it sealed its probe to), the coordinator's and the three parties' (DEBUG1, where the
/// operator sets `log_min_messages = debug1`), each of which ties it to its batch (0.15.0),
/// whose every line carries the batch id.
#[test]
fn one_search_is_found_by_its_session_id_in_all_five_logs() {
    let cluster = Cluster::start("search-trace", 39);
    let mut rng = ChaCha20Rng::seed_from_u64(39);
    let template = random_template(&mut rng);
    let enrolment = cluster.path("enrol.ndjson");
    write_lines(&enrolment, &[enrollment_line("T", "left", &template)]);
    cluster.enroll(&enrolment, &[]).expect_success();
    for party in 0..3 {
        cluster.set_log_level(party, "debug1");
    }
    let probes = cluster.path("probe.ndjson");
    let probe = near_duplicate(&template, 0.1, 4, &mut rng);
    write_lines(&probes, &[probe_line("left", &probe)]);
    let input = probes.display().to_string();
    let mut search = cluster.command(&["iris", "search", "--input", &input, "--json"]);
    search.env(
        "PRIVMATCH_LOG",
        "warn,privmatch_coordinator::iris::client=debug",
    );
    let out = run(search, std::time::Duration::from_secs(120)).expect_success();
    assert!(out.stdout.contains("\"T\""), "the probe matches T: {out}");
    // The client's line names the session it sealed the probe to.
    let sessions = logged_sessions(&out.stderr, "sealed an iris probe");
    assert_eq!(sessions.len(), 1, "one probe, one session: {}", out.stderr);
    let session = &sessions[0];
    assert_eq!(session.len(), 32, "a 16-byte session id in hex: {session}");
    // Since 0.15.0 a search runs in a batch (alone, here): the coordinator's and each party's
    // line with the search's id name the batch, whose lines carry the batch id.
    let batch_of = |log: &str| -> Option<String> {
        cluster.log_lines_with(log, session).iter().find_map(|l| {
            // The coordinator writes `batch=<hex>`, a party `in batch <hex>`.
            let at = ["batch=", "in batch "]
                .iter()
                .find_map(|m| l.find(m).map(|i| i + m.len()))?;
            l.get(at..at + 32).map(str::to_owned)
        })
    };
    wait_until(
        std::time::Duration::from_secs(20),
        "the session's lines in the coordinator's and the parties' logs",
        || {
            let Some(batch) = batch_of("coordinator.log") else {
                return false;
            };
            cluster
                .log_lines_with("coordinator.log", &batch)
                .iter()
                .any(|l| l.contains("session finished"))
                && (0..3).all(|p| {
                    let log = format!("p{p}/postgres.log");
                    batch_of(&log).as_deref() == Some(batch.as_str()) && {
                        let lines = cluster.log_lines_with(&log, &batch);
                        lines.iter().any(|l| l.contains("(iris_batch_start)"))
                            && lines
                                .iter()
                                .any(|l| l.contains("finished (iris_batch_round)"))
                    }
                })
        },
    );
}
