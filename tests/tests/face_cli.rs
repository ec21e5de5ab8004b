//! End-to-end tests of the face modality through the product's own interfaces: `privmatch
//! face configure | dealer | enroll | verify | identify | delete` (CLI → coordinator HTTP API →
//! the dealer P2 and the evaluators P0, P1), checked against the plaintext comparison on the
//! quantised embeddings, and the errors a user gets for bad input.

use std::path::Path;

use privmatch_core::embedding::normalize;
use privmatch_core::face::quantize::{plaintext_match, Quantizer};
use privmatch_core::face::Metric;
use privmatch_e2e::{logged_sessions, mentions_number, run, wait_until, write_lines, Cluster};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{json, Value};

const DIM: usize = 128;

fn random_embedding(rng: &mut ChaCha20Rng) -> Vec<f64> {
    let raw: Vec<f64> = (0..DIM).map(|_| rng.gen_range(-1.0..1.0)).collect();
    normalize(&raw).expect("non-zero")
}

fn recapture(rng: &mut ChaCha20Rng, e: &[f64], noise: f64) -> Vec<f64> {
    let raw: Vec<f64> = e
        .iter()
        .map(|x| x + noise * rng.gen_range(-1.0..1.0))
        .collect();
    normalize(&raw).expect("non-zero")
}

fn counts(cluster: &Cluster) -> [i64; 3] {
    [0, 1, 2].map(|p| cluster.scalar(p, "SELECT count(*) FROM privmatch.face_templates"))
}

/// Stocked dealings claimed at P0 and P1 (docs/protocols/face.md §11).
fn stock_claims(cluster: &Cluster) -> [i64; 2] {
    [0, 1].map(|p| cluster.scalar(p, "SELECT count(*) FROM privmatch.face_stock_used"))
}

fn lines(output: &str) -> Vec<Value> {
    output
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn face_cli_verifies_and_identifies_like_the_plaintext_reference() {
    let cluster = Cluster::start("face-cli", 33);
    let mut rng = ChaCha20Rng::seed_from_u64(33);
    let q = Quantizer::new(DIM).expect("dim");
    let people: Vec<(String, Vec<f64>)> = (0..40)
        .map(|i| (format!("person-{i:03}"), random_embedding(&mut rng)))
        .collect();
    let enroll_file = cluster.path("faces.ndjson");
    write_lines(
        &enroll_file,
        &people
            .iter()
            .map(|(s, e)| json!({"subject": s, "embedding": e}).to_string())
            .collect::<Vec<_>>(),
    );
    // Probes: re-captures of the first 6 people at growing noise, then 3 strangers.
    let mut probes: Vec<Vec<f64>> = (0..6)
        .map(|i| recapture(&mut rng, &people[i].1, 0.02 + 0.04 * i as f64))
        .collect();
    probes.extend((0..3).map(|_| random_embedding(&mut rng)));
    let probe_file = cluster.path("probes.ndjson");
    write_lines(
        &probe_file,
        &probes
            .iter()
            .map(|e| json!({"embedding": e}).to_string())
            .collect::<Vec<_>>(),
    );
    let quantised: Vec<Vec<i32>> = people
        .iter()
        .map(|(_, e)| q.quantize(e).expect("q"))
        .collect();
    let quantised_probes: Vec<Vec<i32>> =
        probes.iter().map(|e| q.quantize(e).expect("q")).collect();

    cluster
        .cli(&["face", "enroll", "--input", &path_arg(&enroll_file)])
        .expect_success();
    assert_eq!(counts(&cluster), [40, 40, 0], "shares at P0 and P1 only");
    // Stocked dealings claimed after each metric's nine identifications: the first of the
    // nine deals on its path, the next eight use the dealing the coordinator made after the
    // one before. After the reconfiguration the cosine stock is claimed (burnt) but not used:
    // P2's generation changed, so the first Euclidean identification deals on its path.
    let mut claims_after = [8, 17].into_iter();
    for (metric, threshold) in [(Metric::Cosine, 0.55), (Metric::Euclidean, 0.9)] {
        cluster
            .cli(&[
                "face",
                "configure",
                "--metric",
                metric.as_str(),
                "--threshold",
                &threshold.to_string(),
                "--dim",
                "128",
            ])
            .expect_success();
        // The dealer's public state names the metric and never the threshold.
        let dealer = cluster.cli(&["face", "dealer"]).expect_success();
        let state: serde_json::Value = serde_json::from_str(&dealer.stdout).expect("JSON");
        assert_eq!(state["dealer"]["metric"], metric.as_str(), "{dealer}");
        assert_eq!(state["dealer"]["dim"], 128, "{dealer}");
        assert!(!dealer.stdout.contains(&threshold.to_string()), "{dealer}");
        let theta = q.quantize_threshold(metric, threshold).expect("θ");
        // 1:N identification.
        let out = cluster
            .cli(&["face", "identify", "--input", &path_arg(&probe_file)])
            .expect_success();
        let got = lines(&out.stdout);
        assert_eq!(got.len(), probes.len(), "{out}");
        let mut matched = 0;
        for (i, line) in got.iter().enumerate() {
            assert_eq!(line["probe"], json!(i));
            let expected: Vec<&str> = people
                .iter()
                .zip(&quantised)
                .filter(|(_, t)| plaintext_match(metric, &quantised_probes[i], t, theta))
                .map(|((s, _), _)| s.as_str())
                .collect();
            let mut listed: Vec<String> =
                serde_json::from_value(line["matches"].clone()).expect("matches");
            listed.sort();
            assert_eq!(listed, expected, "{metric} probe {i}");
            matched += listed.len();
        }
        assert!(matched >= 3, "{metric}: only {matched} matches");
        let claims = claims_after.next().unwrap_or_default();
        assert_eq!(stock_claims(&cluster), [claims; 2], "{metric}");
        // 1:1 verification of every probe against person-002.
        let out = cluster
            .cli(&[
                "face",
                "verify",
                "--subject",
                "person-002",
                "--input",
                &path_arg(&probe_file),
            ])
            .expect_success();
        let got = lines(&out.stdout);
        assert_eq!(got.len(), probes.len(), "{out}");
        for (i, line) in got.iter().enumerate() {
            assert_eq!(line["probe"], json!(i));
            assert_eq!(line["subject"], json!("person-002"));
            let expected = plaintext_match(metric, &quantised_probes[i], &quantised[2], theta);
            assert_eq!(line["match"], json!(expected), "{metric} probe {i}");
        }
    }
    // Deletion is atomic and takes effect at once.
    cluster
        .cli(&["face", "delete", "--subject", "person-000"])
        .expect_success();
    assert_eq!(counts(&cluster), [39, 39, 0]);
    let out = cluster
        .cli(&["face", "identify", "--input", &path_arg(&probe_file)])
        .expect_success();
    assert!(lines(&out.stdout)
        .iter()
        .all(|l| !l["matches"].to_string().contains("person-000")));
    // The stock dealt for the 40 templates does not fit the 39 left: neither evaluator claims
    // it; the eight identifications after the first use fresh stock.
    assert_eq!(stock_claims(&cluster), [25, 25]);
    // A template enrolled after the last identification is not opened yet: the stocked open
    // is refused at both (nothing recorded), the coordinator opens it and asks again, and the
    // new template is compared (it has person-001's embedding, so it matches exactly when
    // person-001 does); the stock dealt for 39 does not fit the 40.
    let late = cluster.path("late.ndjson");
    write_lines(
        &late,
        &[json!({"subject": "person-late", "embedding": people[1].1}).to_string()],
    );
    cluster
        .cli(&["face", "enroll", "--input", &path_arg(&late)])
        .expect_success();
    let out = cluster
        .cli(&["face", "identify", "--input", &path_arg(&probe_file)])
        .expect_success();
    let got = lines(&out.stdout);
    assert_eq!(got.len(), probes.len(), "{out}");
    assert!(got
        .iter()
        .any(|l| l["matches"].to_string().contains("person-001")));
    for line in &got {
        let matches = line["matches"].to_string();
        assert_eq!(
            matches.contains("person-late"),
            matches.contains("person-001"),
            "{line}"
        );
    }
    assert_eq!(stock_claims(&cluster), [33, 33]);
    // The operator deletes person-late by hand at P0 and P1 (plain SQL, not face_delete): the
    // set version moves with it (docs/protocols/face.md §12), so the engines pass over the
    // set again and no identification compares the deleted template. Were the set taken as
    // unchanged, person-late would match with person-001 as above.
    for p in 0..2 {
        cluster.query(
            p,
            "WITH gone AS (DELETE FROM privmatch.face_templates WHERE subject = 'person-late' \
                           RETURNING bundle_id) \
             DELETE FROM privmatch.face_masked_templates m USING gone \
              WHERE m.bundle_id = gone.bundle_id",
            &[],
        );
    }
    let out = cluster
        .cli(&["face", "identify", "--input", &path_arg(&probe_file)])
        .expect_success();
    let got = lines(&out.stdout);
    assert!(got
        .iter()
        .any(|l| l["matches"].to_string().contains("person-001")));
    assert!(
        got.iter()
            .all(|l| !l["matches"].to_string().contains("person-late")),
        "{out}"
    );
    // The version is the owner's: the coordinator's role can neither move nor read it, run
    // its trigger function or switch the triggers off; a malformed known list is refused.
    let refused =
        |party: usize, sql: &str| cluster.query_as_coordinator(party, sql).expect_err(sql).0;
    for sql in [
        "UPDATE privmatch.face_set_version SET version = 0",
        "SELECT version FROM privmatch.face_set_version",
        "SELECT privmatch.face_set_changed()",
        "ALTER TABLE privmatch.face_templates DISABLE TRIGGER ALL",
    ] {
        assert_eq!(refused(0, sql), "42501", "{sql}");
    }
    let id = hex::encode([9u8; 16]);
    assert_eq!(
        refused(
            0,
            &format!(
                "SELECT * FROM privmatch.face_masked_open_stocked('\\x{id}', '\\x00', '\\x{id}', '\\x01')"
            )
        ),
        "22023"
    );
    // Stock ids are single use: a claimed one cannot be stocked again (checked before the
    // chunks are even opened); halves not sealed by P2 are refused; the coordinator's role
    // cannot read the claims; P2 refuses a malformed stock id.
    let claimed: Vec<u8> = cluster
        .query(
            0,
            "SELECT stock FROM privmatch.face_stock_used LIMIT 1",
            &[],
        )
        .first()
        .map(|r| r.get(0))
        .unwrap_or_default();
    let stock_sql = |id: &[u8]| {
        format!(
            "SELECT privmatch.face_masked_stock('\\x{}', ARRAY['\\x00'::bytea])",
            hex::encode(id)
        )
    };
    assert_eq!(refused(0, &stock_sql(&claimed)), "23505");
    assert_eq!(refused(0, &stock_sql(&[7; 16])), "08P01");
    assert_eq!(
        refused(1, "SELECT count(*) FROM privmatch.face_stock_used"),
        "42501"
    );
    assert_eq!(
        refused(
            2,
            "SELECT * FROM privmatch.face_dealer_stock('\\x00', '{}')"
        ),
        "22023"
    );
    // No log holds a probe's share or a threshold in the clear.
    for p in 0..3 {
        let log = std::fs::read_to_string(cluster.home.join(format!("p{p}/postgres.log")))
            .unwrap_or_default();
        assert!(
            !mentions_number(&log, "0.55") && !log.contains("threshold"),
            "P{p} log mentions the threshold"
        );
    }
}

#[test]
fn face_cli_bad_input_fails_clearly_and_changes_nothing() {
    let mut cluster = Cluster::start("face-cli-errors", 34);
    let mut rng = ChaCha20Rng::seed_from_u64(34);
    let alice = random_embedding(&mut rng);
    let good = json!({"subject": "alice", "embedding": alice}).to_string();
    let file = cluster.path("in.ndjson");
    cluster
        .cli(&[
            "face",
            "configure",
            "--metric",
            "cosine",
            "--threshold",
            "0.5",
            "--dim",
            "128",
        ])
        .expect_success();
    let refuse = |cluster: &Cluster, second: String, phrases: &[&str]| {
        write_lines(&file, &[good.clone(), second]);
        let before = counts(cluster);
        let out = cluster
            .cli(&["face", "enroll", "--input", &path_arg(&file)])
            .expect_failure();
        out.assert_stderr_contains(phrases);
        assert_eq!(counts(cluster), before, "nothing enrolled: {out}");
    };
    let mut short = alice.clone();
    short.pop();
    refuse(
        &cluster,
        json!({"subject": "bob", "embedding": short}).to_string(),
        &["line 2", "dimension"],
    );
    let mut big = alice.clone();
    big[3] = 1.5;
    refuse(
        &cluster,
        json!({"subject": "bob", "embedding": big}).to_string(),
        &["line 2", "overflow"],
    );
    let nan = format!(
        "{{\"subject\": \"bob\", \"embedding\": [\"NaN\"{}]}}",
        ", 0.0".repeat(DIM - 1)
    );
    refuse(&cluster, nan, &["line 2", "finite"]);
    let inf = format!(
        "{{\"subject\": \"bob\", \"embedding\": [\"Infinity\"{}]}}",
        ", 0.0".repeat(DIM - 1)
    );
    refuse(&cluster, inf, &["line 2", "finite"]);
    refuse(&cluster, "{\"subject\": \"bob\"".to_owned(), &["line 2"]);
    cluster
        .cli(&["face", "enroll", "--input", &path_arg(&file)])
        .expect_failure();
    write_lines(&file, std::slice::from_ref(&good));
    cluster
        .cli(&["face", "enroll", "--input", &path_arg(&file)])
        .expect_success();
    assert_eq!(counts(&cluster), [1, 1, 0]);

    let probe = cluster.path("probe.ndjson");
    write_lines(&probe, &[json!({"embedding": alice}).to_string()]);
    // No key pool is needed: P2 deals each session's keys (the template is opened first).
    let out = cluster
        .cli(&[
            "face",
            "verify",
            "--subject",
            "alice",
            "--input",
            &path_arg(&probe),
        ])
        .expect_success();
    assert!(out.stdout.contains("\"match\":true"), "{out}");
    // Unknown subject, wrong probe dimension.
    let out = cluster
        .cli(&[
            "face",
            "verify",
            "--subject",
            "mallory",
            "--input",
            &path_arg(&probe),
        ])
        .expect_failure();
    out.assert_stderr_contains(&["mallory"]);
    let wide = cluster.path("wide.ndjson");
    let mut w = alice.clone();
    w.extend(std::iter::repeat_n(0.0, 128));
    write_lines(&wide, &[json!({"embedding": w}).to_string()]);
    let out = cluster
        .cli(&[
            "face",
            "verify",
            "--subject",
            "alice",
            "--input",
            &path_arg(&wide),
        ])
        .expect_failure();
    out.assert_stderr_contains(&["dimension"]);
    let out = cluster
        .cli(&[
            "face",
            "verify",
            "--subject",
            "alice",
            "--input",
            &path_arg(&probe),
        ])
        .expect_success();
    assert_eq!(lines(&out.stdout)[0]["match"], json!(true), "{out}");
    // Reconfiguring the dealer applies at once: P2 deals every session's keys under its
    // current threshold. A recapture (cosine ≈ 0.95) matches at 0.5 and not at 0.99.
    let near = cluster.path("near.ndjson");
    write_lines(
        &near,
        &[json!({"embedding": recapture(&mut rng, &alice, 0.05)}).to_string()],
    );
    let verify = |cluster: &Cluster, file: &std::path::Path| {
        let out = cluster
            .cli(&[
                "face",
                "verify",
                "--subject",
                "alice",
                "--input",
                &path_arg(file),
            ])
            .expect_success();
        lines(&out.stdout)[0]["match"].clone()
    };
    assert_eq!(verify(&cluster, &near), json!(true));
    cluster
        .cli(&[
            "face",
            "configure",
            "--metric",
            "cosine",
            "--threshold",
            "0.99",
            "--dim",
            "128",
        ])
        .expect_success();
    assert_eq!(verify(&cluster, &near), json!(false));
    assert_eq!(verify(&cluster, &probe), json!(true));
    // Enrolment is atomic across the parties: with P1 down nothing is enrolled anywhere.
    let bob = cluster.path("bob.ndjson");
    write_lines(
        &bob,
        &[json!({"subject": "bob", "embedding": random_embedding(&mut rng)}).to_string()],
    );
    cluster.kill_party(1);
    let out = cluster
        .cli(&["face", "enroll", "--input", &path_arg(&bob)])
        .expect_failure();
    out.assert_stderr_contains(&["P1"]);
    cluster.start_party(1);
    cluster.restart_coordinator();
    assert_eq!(counts(&cluster), [1, 1, 0]);
    cluster
        .cli(&["face", "enroll", "--input", &path_arg(&bob)])
        .expect_success();
    assert_eq!(counts(&cluster), [2, 2, 0]);
    // P1's engine restarted with it: it reloads the opened template from its table, and bob,
    // enrolled since, is opened (once, at both evaluators) by the next identification.
    let opened = |c: &Cluster| {
        [0, 1, 2].map(|p| c.scalar(p, "SELECT count(*) FROM privmatch.face_masked_templates"))
    };
    assert_eq!(opened(&cluster), [1, 1, 0]);
    let out = cluster
        .cli(&["face", "identify", "--input", &path_arg(&probe)])
        .expect_success();
    assert_eq!(lines(&out.stdout)[0]["matches"], json!(["alice"]), "{out}");
    assert_eq!(opened(&cluster), [2, 2, 0]);
    // This coordinator (restarted above) now knows alice's bundle id from a verification and
    // asks P2 for the next one's keys while P0 and P1 open.
    assert_eq!(verify(&cluster, &probe), json!(true));
    assert_eq!(verify(&cluster, &near), json!(false));
    // A deleted template leaves the opened set with its enrolment.
    cluster
        .cli(&["face", "delete", "--subject", "alice"])
        .expect_success();
    assert_eq!(opened(&cluster), [1, 1, 0]);
    let out = cluster
        .cli(&["face", "identify", "--input", &path_arg(&probe)])
        .expect_success();
    assert_eq!(lines(&out.stdout)[0]["matches"], json!([]), "{out}");
    let out = cluster
        .cli(&[
            "face",
            "verify",
            "--subject",
            "alice",
            "--input",
            &path_arg(&probe),
        ])
        .expect_failure();
    out.assert_stderr_contains(&["alice"]);
    // Enrolled again, alice has a new bundle id: the coordinator's remembered one is stale,
    // its early dealing is dropped and the keys are dealt for the opened id.
    let again = cluster.path("alice-again.ndjson");
    write_lines(
        &again,
        &[json!({"subject": "alice", "embedding": alice}).to_string()],
    );
    cluster
        .cli(&["face", "enroll", "--input", &path_arg(&again)])
        .expect_success();
    assert_eq!(verify(&cluster, &probe), json!(true));
    assert_eq!(verify(&cluster, &near), json!(false));
    assert_eq!(verify(&cluster, &probe), json!(true));
    // A coordinator that alters a sealed output in transit (issue 34: the coordinator learns
    // no result and cannot change it): P0 and P1 seal their output shares to the CLI's fresh
    // reply key, so the altered one does not open and the CLI refuses it, naming the party.
    // Against 0.10.0 the coordinator added the shares itself and answered any bit it liked.
    for (party, name) in [(0, "P0"), (1, "P1")] {
        cluster.stop_coordinator();
        cluster.start_coordinator(Some(&format!("face-alter-output={party}")));
        for args in [
            vec!["face", "verify", "--subject", "alice"],
            vec!["face", "identify"],
        ] {
            let input = path_arg(&probe);
            let mut args = args;
            args.extend(["--input", input.as_str()]);
            let out = cluster.cli(&args).expect_failure();
            out.assert_stderr_contains(&[
                &format!("the sealed output of {name} is refused"),
                "changed in transit",
            ]);
        }
    }
    cluster.stop_coordinator();
    cluster.start_coordinator(None);
    assert_eq!(verify(&cluster, &probe), json!(true));
}

/// One face verification's log lines are found by its session id in all five processes: the
/// client (the id it sealed the probe to), the coordinator (the session's span), P0 and P1
/// (opened, finished) and the dealer P2 (dealt) — at DEBUG1 in the parties' logs, where the
/// session ids are (they are not secret: the coordinator relays them).
#[test]
fn one_verification_is_found_by_its_session_id_in_all_five_logs() {
    let cluster = Cluster::start("face-trace", 41);
    let mut rng = ChaCha20Rng::seed_from_u64(41);
    let person = random_embedding(&mut rng);
    let enrolment = cluster.path("face.ndjson");
    write_lines(
        &enrolment,
        &[json!({"subject": "P", "embedding": person}).to_string()],
    );
    cluster
        .cli(&[
            "face",
            "configure",
            "--metric",
            "cosine",
            "--threshold",
            "0.55",
            "--dim",
            "128",
        ])
        .expect_success();
    cluster
        .cli(&["face", "enroll", "--input", &path_arg(&enrolment)])
        .expect_success();
    for party in 0..3 {
        cluster.set_log_level(party, "debug1");
    }
    let probes = cluster.path("probe.ndjson");
    let probe = recapture(&mut rng, &person, 0.02);
    write_lines(&probes, &[json!({"embedding": probe}).to_string()]);
    let input = path_arg(&probes);
    let mut verify = cluster.command(&["face", "verify", "--subject", "P", "--input", &input]);
    verify.env(
        "PRIVMATCH_LOG",
        "warn,privmatch_coordinator::face::client=debug",
    );
    let out = run(verify, std::time::Duration::from_secs(120)).expect_success();
    assert!(
        out.stdout.contains("\"match\":true"),
        "the re-capture matches: {out}"
    );
    // The client's line names the session it sealed the probe to.
    let sessions = logged_sessions(&out.stderr, "sealed a face probe");
    assert_eq!(sessions.len(), 1, "one probe, one session: {}", out.stderr);
    let session = &sessions[0];
    assert_eq!(session.len(), 32, "a 16-byte session id in hex: {session}");
    let lines_with = |log: &str| cluster.log_lines_with(log, session);
    let has = |log: &str, text: &str| lines_with(log).iter().any(|l| l.contains(text));
    wait_until(
        std::time::Duration::from_secs(20),
        "the session's lines in the coordinator's and the parties' logs",
        || {
            has("coordinator.log", "session finished")
                && (0..2).all(|p| {
                    let log = format!("p{p}/postgres.log");
                    has(&log, "opened (face_masked_open)")
                        && has(&log, "finished (face_masked_round)")
                })
                && has("p2/postgres.log", "dealt (face_dealer_verify)")
        },
    );
}
