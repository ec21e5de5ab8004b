//! End-to-end tests: the real CLI, coordinator and three PostgreSQL parties with the extension.
//!
//! Each test starts its own deployment (own home directory and ports, see
//! `privmatch_e2e::Cluster`), so they run in parallel; `cargo test -p privmatch-e2e --release
//! -- --test-threads=1` runs them one at a time. Results are checked against plaintext: the
//! input files are parsed here independently of the CLI, and what the parties store is read
//! back from their databases and reconstructed (test-only) to compare with the templates.

use std::collections::BTreeMap;
use std::time::Duration;

use privmatch_core::crypto::seal::{PartySecretKey, SEALED_BOX_OVERHEAD};
use privmatch_core::iris::encoding::reconstruct_template;
use privmatch_core::iris::enroll::{seal_iris_enrollment, Eye};
use privmatch_core::iris::synth::random_template;
use privmatch_core::iris::template::IrisTemplate;
use privmatch_core::wire::envelope::encode_enroll_batch;
use privmatch_e2e::{
    by_key, enrollment_line, privmatch, read_ndjson, write_lines, Cluster, RecordKey,
};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

fn key(subject: &str, eye: &str) -> RecordKey {
    (subject.to_owned(), eye.to_owned())
}

/// `privmatch iris synth COUNT --seed SEED --prefix PREFIX -o PATH`; returns the parsed file.
fn synth(
    cluster: &Cluster,
    file: &str,
    count: usize,
    seed: u64,
    prefix: &str,
) -> (std::path::PathBuf, BTreeMap<RecordKey, IrisTemplate>) {
    let path = cluster.path(file);
    privmatch(&[
        "iris",
        "synth",
        &count.to_string(),
        "--seed",
        &seed.to_string(),
        "--prefix",
        prefix,
        "-o",
        &path.display().to_string(),
    ])
    .expect_success();
    let records = read_ndjson(&path);
    assert_eq!(records.len(), count);
    (path, by_key(&records))
}

fn lines_of(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("read input")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// 1,000 synthetic templates (+20 rotated near-duplicates, +2 right eyes) are enrolled; every
/// party holds exactly those records; every record reconstructs from all three parties and
/// from each pair to the input template; re-running is a no-op; deletion is atomic across the
/// parties and idempotent; a deleted record can be enrolled again.
#[test]
fn enroll_1000_and_reconstruct() {
    let c = Cluster::start("enrol", 0);
    let input = c.path("synth.ndjson");
    privmatch(&[
        "iris",
        "synth",
        "1000",
        "--seed",
        "7",
        "--near-duplicates",
        "20",
        "--rotation",
        "3",
        "-o",
        &input.display().to_string(),
    ])
    .expect_success();
    // Two right eyes of existing subjects, so that deleting a subject removes both eyes.
    let mut rng = ChaCha20Rng::seed_from_u64(70);
    let mut lines = lines_of(&input);
    assert_eq!(lines.len(), 1020, "synth wrote 1000 + 20 near-duplicates");
    lines.push(enrollment_line(
        "synth-0000005",
        "right",
        &random_template(&mut rng),
    ));
    lines.push(enrollment_line(
        "synth-0000006",
        "right",
        &random_template(&mut rng),
    ));
    write_lines(&input, &lines);
    let records = read_ndjson(&input);
    let mut expected = by_key(&records);
    assert_eq!(
        expected.len(),
        1022,
        "all (subject, eye) pairs are distinct"
    );
    assert!(expected.contains_key(&key("synth-0000019-near", "left")));

    let out = c.enroll(&input, &["--batch-size", "100"]).expect_success();
    assert!(
        out.stdout
            .contains("enrolled 1022 records, 0 already enrolled (skipped), 1022 lines"),
        "{out}"
    );
    assert_eq!(c.record_counts(), [1022; 3]);
    assert_eq!(c.prepared_counts(), [0; 3]);
    assert_eq!(c.assert_reconstructs(&expected), 1022);

    // Idempotent: the same input again enrols nothing and changes no record (fresh shares
    // would differ, so equal shares mean nothing was overwritten).
    let p2_before = c.read_shares(2);
    let out = c.enroll(&input, &["--batch-size", "100"]).expect_success();
    assert!(
        out.stdout
            .contains("enrolled 0 records, 1022 already enrolled (skipped), 1022 lines"),
        "{out}"
    );
    assert_eq!(c.record_counts(), [1022; 3]);
    assert_eq!(c.prepared_counts(), [0; 3]);
    assert!(
        c.read_shares(2) == p2_before,
        "re-running the input changed stored shares"
    );
    drop(p2_before);

    // Delete a subject (both eyes) everywhere; deleting again removes nothing.
    let out = c
        .cli(&["iris", "delete", "--subject", "synth-0000005"])
        .expect_success();
    assert!(out.stdout.contains("deleted 2 record(s)"), "{out}");
    assert_eq!(c.record_counts(), [1020; 3]);
    for p in 0..3 {
        assert_eq!(c.subject_count(p, "synth-0000005"), 0, "P{p}");
    }
    let out = c
        .cli(&["iris", "delete", "--subject", "synth-0000005"])
        .expect_success();
    assert!(out.stdout.contains("deleted 0 record(s)"), "{out}");
    assert_eq!(c.record_counts(), [1020; 3]);
    // One eye only.
    let out = c
        .cli(&[
            "iris",
            "delete",
            "--subject",
            "synth-0000006",
            "--eye",
            "right",
        ])
        .expect_success();
    assert!(out.stdout.contains("deleted 1 record(s)"), "{out}");
    for p in 0..3 {
        assert_eq!(
            c.subject_count(p, "synth-0000006"),
            1,
            "P{p}: the left eye stays"
        );
    }
    expected.remove(&key("synth-0000005", "left"));
    expected.remove(&key("synth-0000005", "right"));
    expected.remove(&key("synth-0000006", "right"));
    for p in 0..3 {
        assert!(
            c.keys(p).iter().eq(expected.keys()),
            "P{p} holds other records than expected after the deletions"
        );
    }

    // A deleted record can be enrolled again (fresh bundles); re-running the whole input
    // fills exactly the three gaps.
    let out = c.enroll(&input, &[]).expect_success();
    assert!(
        out.stdout
            .contains("enrolled 3 records, 1019 already enrolled (skipped)"),
        "{out}"
    );
    let expected_all = by_key(&records);
    assert_eq!(c.record_counts(), [1022; 3]);
    assert_eq!(c.assert_reconstructs(&expected_all), 1022);

    // Negative control: the check above has teeth. Mixing two records' shares is caught as
    // inconsistent with three parties and reconstructs neither record with two.
    let shares = [0, 1, 2].map(|p| c.read_shares(p));
    let (a, b) = (key("synth-0000000", "left"), key("synth-0000001", "left"));
    let mixed = [
        shares[0][&a].clone(),
        shares[1][&a].clone(),
        shares[2][&b].clone(),
    ];
    assert!(
        reconstruct_template(&mixed).is_err(),
        "mixed shares must be inconsistent"
    );
    if let Ok(t) = reconstruct_template(&[shares[0][&a].clone(), shares[2][&b].clone()]) {
        assert!(t != expected_all[&a].with_masked_code());
        assert!(t != expected_all[&b].with_masked_code());
    }
}

/// Bad input files are refused before anything is sent (a bad line late in a file that would
/// span several batches), and a batch the parties refuse is written nowhere: the parties'
/// counters are unchanged and no prepared transaction is left.
#[test]
fn bad_inputs_write_nothing() {
    let c = Cluster::start("bad-inputs", 1);
    let (base, mut expected) = synth(&c, "base.ndjson", 3, 20, "base");
    c.enroll(&base, &[]).expect_success();
    assert_eq!(c.record_counts(), [3; 3]);
    let (good, good_records) = synth(&c, "good.ndjson", 10, 21, "bad");
    let good_lines = lines_of(&good);

    let check = |case: &str, lines: &[String], extra: &[&str], phrases: &[&str]| {
        let path = c.path(&format!("{case}.ndjson"));
        write_lines(&path, lines);
        let before = c.snapshot();
        let out = c.enroll(&path, extra).expect_failure();
        out.assert_stderr_contains(phrases);
        assert_eq!(
            c.snapshot(),
            before,
            "{case}: something was written at a party: {out}"
        );
        assert_eq!(c.prepared_counts(), [0; 3], "{case}");
    };
    let with_line = |index: usize, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut lines = good_lines.clone();
        let mut v: serde_json::Value = serde_json::from_str(&lines[index]).expect("json");
        edit(&mut v);
        lines[index] = v.to_string();
        lines
    };
    // Line 7 of 10, sent in batches of 2: validation must reject the file before batch 1.
    let batches = ["--batch-size", "2"];
    check(
        "bad-base64",
        &with_line(6, &|v| v["iris_codes"] = "AAAA!!!not*base64".into()),
        &batches,
        &["line 7", "bad \"iris_codes\"", "base64"],
    );
    check(
        "short-base64",
        &with_line(6, &|v| v["mask_codes"] = "AAAA".into()),
        &batches,
        &["line 7", "bad \"mask_codes\""],
    );
    check(
        "missing-field",
        &with_line(6, &|v| {
            v.as_object_mut().expect("object").remove("mask_codes");
        }),
        &batches,
        &["line 7", "missing \"mask_codes\""],
    );
    check(
        "missing-subject",
        &with_line(6, &|v| {
            v.as_object_mut().expect("object").remove("subject");
        }),
        &batches,
        &["line 7", "missing \"subject\""],
    );
    check(
        "bad-eye",
        &with_line(6, &|v| v["eye"] = "middle".into()),
        &batches,
        &["line 7", "bad \"eye\"", "middle"],
    );
    check(
        "mask-not-duplicated",
        &with_line(6, &|v| {
            let t = IrisTemplate::from_base64(
                v["iris_codes"].as_str().expect("code"),
                v["mask_codes"].as_str().expect("mask"),
            )
            .expect("template");
            let mut mask = t.mask;
            // Bit 1 is the imaginary part of bit 0's position: make them differ.
            mask.set(1, !mask.get(0));
            v["mask_codes"] = mask.to_base64().into();
        }),
        &batches,
        &["line 7", "not duplicated along the last axis"],
    );
    let mut not_json = good_lines.clone();
    not_json[6] = "{this is not json".into();
    check(
        "not-json",
        &not_json,
        &batches,
        &["line 7", "not a JSON object"],
    );
    let mut duplicate = good_lines.clone();
    let mut v: serde_json::Value = serde_json::from_str(&duplicate[8]).expect("json");
    v["subject"] = "bad-0000002".into();
    duplicate[8] = v.to_string();
    check(
        "duplicate-in-file",
        &duplicate,
        &batches,
        &["line 9", "bad-0000002", "appears twice"],
    );

    // --on-duplicate error: one batch of 5 whose line 3 is already enrolled.
    let base_lines = lines_of(&base);
    let mut on_dup: Vec<String> = good_lines[..4].to_vec();
    on_dup.insert(2, base_lines[0].clone());
    check(
        "on-duplicate-error",
        &on_dup,
        &["--on-duplicate", "error"],
        &[
            "already enrolled",
            "base-0000000",
            "lines 1..=5",
            "nothing of it was written",
        ],
    );

    // Controls: the same inputs are fine where they should be.
    let out = c
        .enroll(&c.path("on-duplicate-error.ndjson"), &[])
        .expect_success();
    assert!(
        out.stdout
            .contains("enrolled 4 records, 1 already enrolled"),
        "{out}"
    );
    let out = c.enroll(&good, &batches).expect_success();
    assert!(
        out.stdout
            .contains("enrolled 6 records, 4 already enrolled"),
        "{out}"
    );
    expected.extend(good_records);
    assert_eq!(c.record_counts(), [13; 3]);
    assert_eq!(c.assert_reconstructs(&expected), 13);
}

/// The coordinator's HTTP API spoken directly (bodies framed with `encode_enrol_batch`, sealed
/// with `seal_iris_enrolment` to the pinned keys): sealed data swapped between parties,
/// tampered, replayed or sealed to a key that is not the party's is refused, and the whole
/// batch — including its valid records — is written nowhere.
#[test]
fn sealed_bundle_attacks_rejected() {
    let c = Cluster::start("sealed", 2);
    let keys = c.config.pinned_keys().expect("pinned keys parse");
    let mut rng = ChaCha20Rng::seed_from_u64(30);
    let mut expected = BTreeMap::new();
    let seal = |subject: &str, rng: &mut ChaCha20Rng| {
        let t = random_template(rng);
        let (sealed, _) = seal_iris_enrollment(&t, subject, Eye::Left, &keys, rng).expect("seal");
        (t, sealed)
    };

    // A valid batch is accepted.
    let (t, base) = seal("sealed-base", &mut rng);
    let (status, answer) = c.post_bytes("/v1/iris/enroll", encode_enroll_batch(&[base]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["results"],
        serde_json::json!([{"subject": "sealed-base", "eye": "left", "enrolled": true}])
    );
    expected.insert(key("sealed-base", "left"), t);
    assert_eq!(c.record_counts(), [1; 3]);

    let reject = |case: &str, body: Vec<u8>, status_expected: u16, phrases: &[&str]| {
        let before = c.snapshot();
        let (status, answer) = c.post_bytes("/v1/iris/enroll", body);
        let message = answer["error"].as_str().unwrap_or_default().to_owned();
        assert_eq!(status, status_expected, "{case}: {answer}");
        for phrase in phrases {
            assert!(
                message.contains(phrase),
                "{case}: {phrase:?} not in {answer}"
            );
        }
        assert_eq!(
            c.snapshot(),
            before,
            "{case}: something was written at a party"
        );
        assert_eq!(c.prepared_counts(), [0; 3], "{case}");
        answer
    };

    // (a) Record 2's P0 slot holds the bundle sealed to P1 (slots swapped).
    let (_, good) = seal("sealed-a-good", &mut rng);
    let (_, [s0, s1, s2]) = seal("sealed-a-swapped", &mut rng);
    let answer = reject(
        "swapped slots",
        encode_enroll_batch(&[good, [s1, s0, s2]]),
        422,
        &["addressed to P1", "#1", "nothing written at any party"],
    );
    assert_eq!(answer["party"], 0, "{answer}");

    // (b) One byte of P2's ciphertext flipped: P0 and P1 open theirs fine, and still nothing
    // is written anywhere.
    let (_, good) = seal("sealed-b-good", &mut rng);
    let (_, [s0, s1, mut s2]) = seal("sealed-b-tampered", &mut rng);
    let i = SEALED_BOX_OVERHEAD + 100;
    s2[i] ^= 0x01;
    let answer = reject(
        "tampered ciphertext",
        encode_enroll_batch(&[good, [s0, s1, s2]]),
        422,
        &["authentication failed", "#1"],
    );
    assert_eq!(answer["party"], 2, "{answer}");

    // (c) Replay: enrol, delete, post the very same bytes again.
    let (t, replayed) = seal("sealed-c-replayed", &mut rng);
    let body = encode_enroll_batch(std::slice::from_ref(&replayed));
    let (status, answer) = c.post_bytes("/v1/iris/enroll", body.clone());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["enrolled"], true, "{answer}");
    let mut with_replayed = expected.clone();
    with_replayed.insert(key("sealed-c-replayed", "left"), t);
    c.assert_reconstructs(&with_replayed);
    let out = c
        .cli(&["iris", "delete", "--subject", "sealed-c-replayed"])
        .expect_success();
    assert!(out.stdout.contains("deleted 1 record(s)"), "{out}");
    assert_eq!(c.record_counts(), [1; 3]);
    reject(
        "replayed batch",
        body,
        422,
        &["already consumed", "replayed"],
    );
    // The replayed record behind a fresh one in a new batch: the fresh one is not written.
    let (_, fresh) = seal("sealed-c-fresh", &mut rng);
    reject(
        "replay inside a fresh batch",
        encode_enroll_batch(&[fresh, replayed]),
        422,
        &["already consumed", "#1"],
    );

    // (d) P1's bundle sealed to a fresh key instead of P1's pinned key.
    let rogue = PartySecretKey::generate(&mut rng);
    let rogue_keys = [keys[0], rogue.public_key(), keys[2]];
    let t = random_template(&mut rng);
    let (sealed, _) =
        seal_iris_enrollment(&t, "sealed-d-rogue", Eye::Left, &rogue_keys, &mut rng).expect("seal");
    let answer = reject(
        "sealed to an unpinned key",
        encode_enroll_batch(&[sealed]),
        422,
        &["sealed to key", &rogue.public_key().fingerprint_hex()],
    );
    assert_eq!(answer["party"], 1, "{answer}");

    // (e) Broken framing never reaches the parties.
    let (_, ok) = seal("sealed-e", &mut rng);
    let mut truncated = encode_enroll_batch(&[ok]);
    truncated.pop();
    reject("truncated framing", truncated, 400, &["framing"]);
    reject("empty batch", encode_enroll_batch(&[]), 400, &["empty"]);

    assert_eq!(c.assert_reconstructs(&expected), 1);
}

/// A party's PostgreSQL is killed (-9) while a batch is prepared everywhere and the
/// coordinator is paused before its decision, then restarted; the batch must end up at all
/// three parties or at none, with no prepared transaction left, and the next enrolment works
/// normally. Killing P1 (not the decision party): P0 commits, the client is told that recovery
/// completes P1, and recovery does. Killing P0 (the decision party): its commit fails, the
/// outcome is reported unknown, and recovery rolls the batch back everywhere.
#[test]
fn crash_party_between_prepare_and_commit() {
    let mut c = Cluster::start("crash-party", 3);
    let (base, mut expected) = synth(&c, "base.ndjson", 4, 40, "base");
    c.enroll(&base, &[]).expect_success();

    let pause = c.path("paused");
    c.stop_coordinator();
    c.start_coordinator(Some(&format!("pause-after-prepare={}", pause.display())));

    for (crashed, seed) in [(1usize, 41u64), (0, 43)] {
        let n = expected.len() as i64;
        let prefix = format!("crash-p{crashed}");
        let (batch, batch_records) = synth(&c, &format!("{prefix}.ndjson"), 6, seed, &prefix);
        let batch_arg = batch.display().to_string();
        let enroll = c.cli_background(&["iris", "enroll", "--input", &batch_arg, "--no-progress"]);
        privmatch_e2e::wait_until(Duration::from_secs(30), "the pause file", || pause.exists());
        assert_eq!(
            c.prepared_counts(),
            [1; 3],
            "P{crashed}: prepared at every party"
        );
        assert_eq!(
            c.record_counts(),
            [n; 3],
            "P{crashed}: nothing committed yet"
        );

        c.kill_party(crashed);
        c.start_party(crashed);
        assert_eq!(
            c.scalar(crashed, "SELECT count(*) FROM pg_prepared_xacts"),
            1,
            "the prepared transaction survives P{crashed}'s crash"
        );
        std::fs::remove_file(&pause).expect("remove the pause file");
        let out = enroll.wait(Duration::from_secs(120));
        eprintln!("[crash-party] enroll after P{crashed}'s crash: {out}");
        c.recover_until_clean(Duration::from_secs(60));

        let counts = c.record_counts();
        assert!(
            counts[0] == counts[1] && counts[1] == counts[2],
            "P{crashed}: the batch is at some parties only: {counts:?}"
        );
        if out.success() {
            assert_eq!(
                counts,
                [n + 6; 3],
                "enroll succeeded but the batch is missing"
            );
        }
        if crashed == 1 {
            // P0 committed (the decision); P1's commit failed on the broken connection.
            assert!(out.success(), "{out}");
            out.assert_stderr_contains(&["recovery will complete it at P1"]);
            expected.extend(batch_records);
        } else {
            // P0's commit failed: no decision, so the batch is rolled back everywhere.
            out.clone().expect_failure();
            out.assert_stderr_contains(&[
                "lines 1..=6 is in doubt",
                "at all three parties or at none",
            ]);
            assert_eq!(
                counts, [n; 3],
                "P0 never committed: the batch must be nowhere"
            );
        }
        assert_eq!(c.prepared_counts(), [0; 3]);
        c.assert_reconstructs(&expected);
    }

    // A normal coordinator again; the next enrolment just works, and the rolled-back batch
    // can be enrolled now.
    c.restart_coordinator();
    let (next, next_records) = synth(&c, "next.ndjson", 5, 42, "after");
    let out = c.enroll(&next, &[]).expect_success();
    assert!(
        out.stdout.contains("enrolled 5 records, 0 already"),
        "{out}"
    );
    assert!(!out.stderr.contains("warning"), "{out}");
    let out = c.enroll(&c.path("crash-p0.ndjson"), &[]).expect_success();
    assert!(
        out.stdout.contains("enrolled 6 records, 0 already"),
        "{out}"
    );
    expected.extend(next_records);
    expected.extend(by_key(&read_ndjson(&c.path("crash-p0.ndjson"))));
    assert_eq!(c.record_counts(), [expected.len() as i64; 3]);
    assert_eq!(c.prepared_counts(), [0; 3]);
    c.assert_reconstructs(&expected);
}

/// The coordinator process dies (injected abort) after every party prepared, and after the
/// decision (P0 committed, P1 and P2 still prepared). A fresh coordinator's start-up recovery
/// then rolls the first back everywhere and commits the second everywhere.
#[test]
fn crash_coordinator_mid_batch() {
    let mut c = Cluster::start("crash-coord", 4);
    let (base, mut expected) = synth(&c, "base.ndjson", 3, 50, "base");
    c.enroll(&base, &[]).expect_success();

    for (variant, seed, decided) in [
        ("crash-after-prepare", 51, false),
        ("crash-after-decision", 52, true),
    ] {
        let n = expected.len() as i64;
        let (batch, batch_records) = synth(&c, &format!("{variant}.ndjson"), 4, seed, variant);
        c.stop_coordinator();
        c.start_coordinator(Some(variant));
        let out = c.enroll(&batch, &[]).expect_failure();
        // The request reached the coordinator, which died before answering: the client
        // cannot know the outcome and must not claim that nothing was written.
        out.assert_stderr_contains(&[
            "lines 1..=4 is in doubt",
            "connection to the coordinator broke",
            "--on-duplicate skip",
        ]);
        assert!(
            !out.stderr.contains("nothing of it was written"),
            "{variant}: {out}"
        );
        let status = c.wait_coordinator_exit(Duration::from_secs(30));
        assert!(
            !status.success(),
            "{variant}: the coordinator should have aborted"
        );

        // In doubt, as the fault left it.
        if decided {
            assert_eq!(c.prepared_counts(), [0, 1, 1], "{variant}");
            assert_eq!(c.record_counts(), [n + 4, n, n], "{variant}");
        } else {
            assert_eq!(c.prepared_counts(), [1, 1, 1], "{variant}");
            assert_eq!(c.record_counts(), [n; 3], "{variant}");
        }

        // A normal coordinator: its start-up recovery finishes the batch before it serves.
        c.restart_coordinator();
        assert_eq!(c.prepared_counts(), [0; 3], "{variant}: left in doubt");
        if decided {
            assert_eq!(
                c.record_counts(),
                [n + 4; 3],
                "{variant}: committed everywhere"
            );
        } else {
            assert_eq!(
                c.record_counts(),
                [n; 3],
                "{variant}: rolled back everywhere"
            );
            for p in 0..3 {
                assert_eq!(c.subject_count(p, &format!("{variant}-0000000")), 0, "P{p}");
            }
        }
        let rerun = c.enroll(&batch, &[]).expect_success();
        if decided {
            assert!(
                rerun.stdout.contains("enrolled 0 records, 4 already"),
                "{variant}: {rerun}"
            );
        } else {
            assert!(
                rerun.stdout.contains("enrolled 4 records, 0 already"),
                "{variant}: the rolled-back batch must be enrolable again: {rerun}"
            );
        }
        expected.extend(batch_records);
        assert_eq!(c.record_counts(), [n + 4; 3], "{variant}");
        assert_eq!(c.prepared_counts(), [0; 3], "{variant}");
    }
    c.assert_reconstructs(&expected);
}

/// Eight concurrent `iris enroll` runs of eight shufflings of the same 400 templates, in
/// batches of 25 (so batches overlap everywhere): every run succeeds (no hang, no "deadlock
/// detected"), and every record is held exactly once at each of the three parties and
/// reconstructs to its template.
#[test]
fn overlapping_concurrent_enrolments_all_succeed() {
    let c = Cluster::start("enrol-concurrent", 5);
    let (path, expected) = synth(&c, "all.ndjson", 400, 77, "overlap");
    let lines = lines_of(&path);
    let mut rng = ChaCha20Rng::seed_from_u64(78);
    let runs: Vec<_> = (0..8)
        .map(|i| {
            let mut shuffled = lines.clone();
            rand::seq::SliceRandom::shuffle(shuffled.as_mut_slice(), &mut rng);
            let file = c.path(&format!("shuffle-{i}.ndjson"));
            write_lines(&file, &shuffled);
            let file = file.display().to_string();
            c.cli_background(&[
                "iris",
                "enroll",
                "--input",
                &file,
                "--batch-size",
                "25",
                "--no-progress",
            ])
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let out = run.wait(Duration::from_secs(300));
        assert!(out.success(), "run {i}: {out}");
    }
    let keys: std::collections::BTreeSet<RecordKey> = expected.keys().cloned().collect();
    for party in 0..3 {
        assert_eq!(c.keys(party), keys, "P{party} holds other records");
    }
    assert_eq!(c.record_counts(), [400; 3]);
    assert_eq!(c.prepared_counts(), [0; 3]);
    assert_eq!(c.assert_reconstructs(&expected), 400);
}

/// Recovery by a second coordinator, against one stalled after P1 and P2 prepared but before
/// P0's PREPARE: while the first still holds its transaction open at P0, recovery leaves it
/// alone (the fence at P0 waits on it), and when the first resumes everything commits; once
/// the first is gone, recovery fences P0 and rolls P1 and P2 back. Never a half-enrolled
/// record.
#[test]
fn recovery_is_fenced_against_a_stalled_coordinator() {
    use std::sync::Arc;

    use privmatch_coordinator::parties::Parties;
    use privmatch_coordinator::txn::fault::Fault;
    use privmatch_coordinator::txn::twophase::TwoPhase;

    let mut c = Cluster::start("fence", 6);
    let coordinator_config = privmatch_e2e::CoordinatorConfig::load(
        &c.home.join(privmatch_e2e::COORDINATOR_CONFIG_FILE),
    )
    .expect("coordinator configuration");
    let second_recovery = |c: &Cluster| {
        c.block_on(async {
            let parties = Arc::new(Parties::new(&coordinator_config));
            TwoPhase::new(parties, "second".into(), Fault::None)
                .recover()
                .await
        })
    };
    let pause = c.path("pause");
    let fault = format!("pause-before-p0-prepare={}", pause.display());

    // 1. The first coordinator stalls and then resumes.
    c.stop_coordinator();
    c.start_coordinator(Some(&fault));
    let (first, _) = synth(&c, "first.ndjson", 5, 91, "fence-a");
    let first = first.display().to_string();
    let enroll = c.cli_background(&["iris", "enroll", "--input", &first, "--no-progress"]);
    privmatch_e2e::wait_until(Duration::from_secs(30), "the pause file", || pause.exists());
    assert_eq!(
        c.prepared_counts(),
        [0, 1, 1],
        "P1 and P2 prepared, P0 not yet"
    );
    let report = second_recovery(&c);
    assert!(
        report.rolled_back.is_empty() && report.committed.is_empty(),
        "recovery touched a transaction its coordinator still runs: {report:?}"
    );
    assert_eq!(c.prepared_counts(), [0, 1, 1]);
    std::fs::remove_file(&pause).expect("resume");
    let out = enroll.wait(Duration::from_secs(60));
    assert!(out.success(), "{out}");
    assert_eq!(c.record_counts(), [5, 5, 5]);
    assert_eq!(c.prepared_counts(), [0, 0, 0]);

    // 2. The first coordinator stalls and dies.
    let (second, _) = synth(&c, "second.ndjson", 5, 92, "fence-b");
    let second = second.display().to_string();
    let enroll = c.cli_background(&["iris", "enroll", "--input", &second, "--no-progress"]);
    privmatch_e2e::wait_until(Duration::from_secs(30), "the pause file", || pause.exists());
    assert_eq!(c.prepared_counts(), [0, 1, 1]);
    c.stop_coordinator();
    std::fs::remove_file(&pause).ok();
    let _ = enroll.wait(Duration::from_secs(60));
    // P0 aborts the dead coordinator's open transaction when it notices the lost connection;
    // until then the fence still waits on it.
    let mut rolled_back = Vec::new();
    privmatch_e2e::wait_until(
        Duration::from_secs(30),
        "recovery to fence and roll back",
        || {
            rolled_back.extend(second_recovery(&c).rolled_back);
            !rolled_back.is_empty()
        },
    );
    assert_eq!(rolled_back.len(), 1, "{rolled_back:?}");
    assert_eq!(c.prepared_counts(), [0, 0, 0]);
    assert_eq!(
        c.record_counts(),
        [5, 5, 5],
        "nothing of the dead coordinator's batch"
    );
}
