//! End-to-end tests of the SQL front door: an application logged in to a party in the role
//! `privmatch_application` enrols and matches with `privmatch.iris_enroll`,
//! `iris_identify`, `iris_is_unique`, `face_enroll`, `face_verify` and `face_identify`, on
//! inputs sealed by `privmatch iris seal` / `privmatch face seal`; the party's function asks
//! the coordinator, which runs the real protocol among the three parties. Results are checked
//! against the plaintext references; bad input, replays, cancellation and a stopped
//! coordinator give the documented SQLSTATEs and change nothing; the application role can do
//! nothing else.

use std::path::Path;

use privmatch_core::embedding::normalize;
use privmatch_core::face::quantize::{plaintext_match, Quantizer};
use privmatch_core::face::Metric;
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate};
use privmatch_core::wire::sealed_input::{SealedInput, SealedKind};
use privmatch_e2e::{enrollment_line, write_lines, Cluster, PartyConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::json;

/// The plaintext iris decision with ±15 rotations at τ = 0.345, in exact integers.
fn iris_match(probe: &IrisTemplate, t: &IrisTemplate) -> bool {
    (-15..=15).any(|k| {
        let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
        common > 0 && u64::from(hd) * 10_000 < 3_450 * u64::from(common)
    })
}

/// The sealed inputs a seal command wrote: (subject, sealed) per line.
fn sealed_lines(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let (subject, sealed) = l.split_once('\t').unwrap_or_else(|| panic!("{l:.80}"));
            (subject.to_owned(), sealed.to_owned())
        })
        .collect()
}

/// Runs `privmatch <modality> seal --for <purpose>` on `input` and returns its lines.
fn seal(
    cluster: &Cluster,
    modality: &str,
    purpose: &str,
    input: &Path,
    extra: &[&str],
) -> Vec<(String, String)> {
    let out = cluster.path(&format!("{modality}-{purpose}.sealed"));
    let (input_arg, out_arg) = (input.display().to_string(), out.display().to_string());
    let mut args = vec![
        modality, "seal", "--for", purpose, "--input", &input_arg, "--out", &out_arg,
    ];
    args.extend_from_slice(extra);
    cluster.cli(&args).expect_success();
    sealed_lines(&out)
}

fn one_bool(cluster: &Cluster, app: &PartyConfig, sql: &str, args: &[&str]) -> bool {
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
        .iter()
        .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let rows = cluster
        .query_login(app, sql, &params)
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    rows[0].get(0)
}

fn rows_of(cluster: &Cluster, app: &PartyConfig, sql: &str, sealed: &str) -> Vec<Vec<String>> {
    cluster
        .query_login(app, sql, &[&sealed])
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .iter()
        .map(|r| (0..r.len()).map(|i| r.get::<_, String>(i)).collect())
        .collect()
}

/// The SQLSTATE and message of a call that must fail.
fn refused(cluster: &Cluster, app: &PartyConfig, sql: &str, args: &[&str]) -> (String, String) {
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
        .iter()
        .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    match cluster.query_login(app, sql, &params) {
        Ok(_) => panic!("{sql} succeeded"),
        Err(e) => e,
    }
}

#[test]
fn the_front_door_enrols_and_matches_with_sql_like_the_plaintext_references() {
    let mut cluster = Cluster::start("front-door", 50);
    let mut rng = ChaCha20Rng::seed_from_u64(50);
    // The application talks to P1 (any party has the front door).
    let app = cluster.application(1);

    // --- iris: 30 templates enrolled through SQL -------------------------------------------
    let templates: Vec<(String, IrisTemplate)> = (0..30)
        .map(|i| (format!("iris-{i:03}"), random_template(&mut rng)))
        .collect();
    let enrol_file = cluster.path("iris.ndjson");
    write_lines(
        &enrol_file,
        &templates
            .iter()
            .map(|(s, t)| enrollment_line(s, "left", t))
            .collect::<Vec<_>>(),
    );
    let sealed = seal(&cluster, "iris", "enroll", &enrol_file, &[]);
    assert_eq!(sealed.len(), 30);
    for (subject, input) in &sealed {
        assert!(
            one_bool(&cluster, &app, "SELECT privmatch.iris_enroll($1)", &[input]),
            "{subject}"
        );
    }
    assert_eq!(cluster.record_counts(), [30; 3]);
    assert_eq!(cluster.prepared_counts(), [0; 3]);

    // A sealed enrolment is single use: replayed, it is refused and nothing changes.
    let (code, message) = refused(
        &cluster,
        &app,
        "SELECT privmatch.iris_enroll($1)",
        &[&sealed[0].1],
    );
    assert_eq!(code, "23505", "{message}");
    assert!(message.contains("already consumed"), "{message}");
    // The same subject sealed afresh: already enrolled, false, nothing written.
    write_lines(
        &enrol_file,
        &[enrollment_line(&templates[0].0, "left", &templates[0].1)],
    );
    let again = seal(&cluster, "iris", "enroll", &enrol_file, &[]);
    assert!(!one_bool(
        &cluster,
        &app,
        "SELECT privmatch.iris_enroll($1)",
        &[&again[0].1]
    ));
    assert_eq!(cluster.record_counts(), [30; 3]);

    // Probes: near-duplicates of five enrolled templates, and three strangers.
    let mut probes: Vec<IrisTemplate> = (0..5)
        .map(|i| near_duplicate(&templates[i].1, 0.08, i as i32 - 2, &mut rng))
        .collect();
    probes.extend((0..3).map(|_| random_template(&mut rng)));
    let iris_probe_file = cluster.path("probes.ndjson");
    write_lines(
        &iris_probe_file,
        &probes
            .iter()
            .map(|t| json!({"eye": "left", "iris_codes": t.code.to_base64(), "mask_codes": t.mask.to_base64()}).to_string())
            .collect::<Vec<_>>(),
    );
    let identify = seal(
        &cluster,
        "iris",
        "identify",
        &iris_probe_file,
        &["--front-door", "1"],
    );
    let uniqueness = seal(
        &cluster,
        "iris",
        "uniqueness",
        &iris_probe_file,
        &["--front-door", "1"],
    );
    let mut matched = 0;
    for (i, probe) in probes.iter().enumerate() {
        let expected: Vec<Vec<String>> = templates
            .iter()
            .filter(|(_, t)| iris_match(probe, t))
            .map(|(s, _)| vec![s.clone(), "left".to_owned()])
            .collect();
        let got = rows_of(
            &cluster,
            &app,
            "SELECT subject, eye FROM privmatch.iris_identify($1)",
            &identify[i].1,
        );
        assert_eq!(got, expected, "probe {i}");
        let unique = one_bool(
            &cluster,
            &app,
            "SELECT privmatch.iris_is_unique($1)",
            &[&uniqueness[i].1],
        );
        assert_eq!(unique, expected.is_empty(), "probe {i}");
        matched += expected.len();
    }
    assert!(matched >= 5, "only {matched} matches");

    // A sealed search relabelled for the other function (its kind changed, its sealed mode
    // not): refused with 22023 before the coordinator is asked, and no session is left.
    for (sealed, kind, sql, sealed_for) in [
        (
            &uniqueness[0].1,
            SealedKind::IrisIdentify,
            "SELECT count(*) FROM privmatch.iris_identify($1)",
            "uniqueness",
        ),
        (
            &identify[0].1,
            SealedKind::IrisUniqueness,
            "SELECT privmatch.iris_is_unique($1)",
            "identify",
        ),
    ] {
        let mut relabelled = SealedInput::parse(sealed).expect("a sealed input");
        relabelled.kind = kind;
        let (code, message) = refused(&cluster, &app, sql, &[&relabelled.encode()]);
        assert_eq!(code, "22023", "{sql}: {message}");
        assert!(
            message.contains(&format!("was sealed for {sealed_for} but given to")),
            "{message}"
        );
    }
    assert_eq!(cluster.prepared_counts(), [0; 3]);

    // --- faces: 20 templates enrolled through SQL ----------------------------------------
    const DIM: usize = 128;
    let q = Quantizer::new(DIM).expect("dim");
    let random_face = |rng: &mut ChaCha20Rng| -> Vec<f64> {
        normalize(
            &(0..DIM)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect::<Vec<f64>>(),
        )
        .expect("non-zero")
    };
    let people: Vec<(String, Vec<f64>)> = (0..20)
        .map(|i| (format!("face-{i:03}"), random_face(&mut rng)))
        .collect();
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
    let face_file = cluster.path("faces.ndjson");
    write_lines(
        &face_file,
        &people
            .iter()
            .map(|(s, e)| json!({"subject": s, "embedding": e}).to_string())
            .collect::<Vec<_>>(),
    );
    for (subject, input) in seal(&cluster, "face", "enroll", &face_file, &[]) {
        assert!(
            one_bool(
                &cluster,
                &app,
                "SELECT privmatch.face_enroll($1)",
                &[&input]
            ),
            "{subject}"
        );
    }
    let face_counts = |cluster: &Cluster| {
        [0, 1, 2].map(|p| cluster.scalar(p, "SELECT count(*) FROM privmatch.face_templates"))
    };
    assert_eq!(face_counts(&cluster), [20, 20, 0]);
    // Probes: re-captures of the first four people, then two strangers; each claims the
    // identity of the person it re-captures (strangers claim face-000).
    let mut probes: Vec<(String, Vec<f64>)> = (0..4)
        .map(|i| {
            let noisy: Vec<f64> = people[i]
                .1
                .iter()
                .map(|x| x + 0.04 * rng.gen_range(-1.0..1.0))
                .collect();
            (people[i].0.clone(), normalize(&noisy).expect("non-zero"))
        })
        .collect();
    probes.extend((0..2).map(|_| ("face-000".to_owned(), random_face(&mut rng))));
    let probe_file = cluster.path("face-probes.ndjson");
    write_lines(
        &probe_file,
        &probes
            .iter()
            .map(|(s, e)| json!({"subject": s, "embedding": e}).to_string())
            .collect::<Vec<_>>(),
    );
    let theta = q.quantize_threshold(Metric::Cosine, 0.55).expect("θ");
    let quantised: Vec<Vec<i32>> = people
        .iter()
        .map(|(_, e)| q.quantize(e).expect("q"))
        .collect();
    // The application calls P1's front door: P0 and P1 seal their outputs to P1's key.
    let verify = seal(
        &cluster,
        "face",
        "verify",
        &probe_file,
        &["--front-door", "1"],
    );
    let identify = seal(
        &cluster,
        "face",
        "identify",
        &probe_file,
        &["--front-door", "1"],
    );
    for (i, (claimed, embedding)) in probes.iter().enumerate() {
        let probe = q.quantize(embedding).expect("q");
        let claimed_index = people
            .iter()
            .position(|(s, _)| s == claimed)
            .expect("enrolled");
        let expected = plaintext_match(Metric::Cosine, &probe, &quantised[claimed_index], theta);
        assert_eq!(verify[i].0, *claimed);
        let got = one_bool(
            &cluster,
            &app,
            "SELECT privmatch.face_verify($1, $2)",
            &[claimed, &verify[i].1],
        );
        assert_eq!(got, expected, "verify probe {i}");
        let expected: Vec<Vec<String>> = people
            .iter()
            .zip(&quantised)
            .filter(|(_, t)| plaintext_match(Metric::Cosine, &probe, t, theta))
            .map(|((s, _), _)| vec![s.clone()])
            .collect();
        let got = rows_of(
            &cluster,
            &app,
            "SELECT subject FROM privmatch.face_identify($1)",
            &identify[i].1,
        );
        assert_eq!(got, expected, "identify probe {i}");
    }

    // --- sealed outputs (issue 34: the coordinator learns no result) ----------------------
    // A probe whose reply key is another party's (sealed for P2's front door) cannot be
    // opened here: 28000, nothing learnt.
    let for_p2 = seal(
        &cluster,
        "face",
        "verify",
        &probe_file,
        &["--front-door", "2"],
    );
    let (code, message) = refused(
        &cluster,
        &app,
        "SELECT privmatch.face_verify($1, $2)",
        &[&for_p2[0].0, &for_p2[0].1],
    );
    assert_eq!(code, "28000", "{message}");
    assert!(
        message.contains("sealed output of P0 is refused"),
        "{message}"
    );
    // A coordinator that alters P0's or P1's sealed output in transit: the front door
    // refuses it, naming the party (28000). Against 0.10.0 the front door trusted the
    // coordinator's JSON "match" and "matches".
    for (party, name) in [(0, "P0"), (1, "P1")] {
        cluster.stop_coordinator();
        cluster.start_coordinator(Some(&format!("face-alter-output={party}")));
        let verify = seal(
            &cluster,
            "face",
            "verify",
            &probe_file,
            &["--front-door", "1"],
        );
        let identify = seal(
            &cluster,
            "face",
            "identify",
            &probe_file,
            &["--front-door", "1"],
        );
        for (sql, args) in [
            (
                "SELECT privmatch.face_verify($1, $2)",
                vec![verify[0].0.as_str(), verify[0].1.as_str()],
            ),
            (
                "SELECT subject FROM privmatch.face_identify($1)",
                vec![identify[0].1.as_str()],
            ),
        ] {
            let (code, message) = refused(&cluster, &app, sql, &args);
            assert_eq!(code, "28000", "{sql}: {message}");
            assert!(
                message.contains(&format!("sealed output of {name} is refused")),
                "{sql}: {message}"
            );
        }
    }
    cluster.stop_coordinator();
    cluster.start_coordinator(None);

    // --- bad input: a clear SQLSTATE naming the argument, nothing written ------------------
    let before = (cluster.record_counts(), face_counts(&cluster));
    let (code, message) = refused(
        &cluster,
        &app,
        "SELECT privmatch.iris_enroll($1)",
        &["not sealed"],
    );
    assert_eq!(code, "22P02", "{message}");
    assert!(message.contains("argument sealed"), "{message}");
    let (code, message) = refused(
        &cluster,
        &app,
        "SELECT privmatch.iris_enroll($1)",
        &[&verify[0].1],
    );
    assert_eq!(code, "22023", "{message}");
    assert!(
        message.contains("sealed for privmatch.face_verify"),
        "{message}"
    );
    let corrupt = "privmatch-sealed-v1:iris-enroll:UE1FQgEAAAB5";
    let (code, message) = refused(
        &cluster,
        &app,
        "SELECT privmatch.iris_enroll($1)",
        &[corrupt],
    );
    assert_eq!(code, "22023", "{message}");
    // A probe sealed for another subject than the argument: the subject is sealed inside the
    // probe (the coordinator is not told it), so the front door finds out from P0's and P1's
    // sealed outputs, which bind it (a fresh probe: the session of verify[1] was used).
    let fresh = seal(
        &cluster,
        "face",
        "verify",
        &probe_file,
        &["--front-door", "1"],
    );
    let (code, message) = refused(
        &cluster,
        &app,
        "SELECT privmatch.face_verify($1, $2)",
        &["face-009", &fresh[1].1],
    );
    assert_eq!(code, "22023", "{message}");
    assert!(
        message.contains("not sealed for the subject given as argument subject"),
        "{message}"
    );
    assert_eq!((cluster.record_counts(), face_counts(&cluster)), before);

    // --- the application role can call the front door and nothing else --------------------
    for sql in [
        "SELECT count(*) FROM privmatch.iris_templates",
        "SELECT count(*) FROM privmatch.face_templates",
        "SELECT privmatch.iris_search_abort('\\x00'::bytea)",
        "SELECT * FROM privmatch.iris_batch_round('\\x00'::bytea, 0, '\\x00'::bytea)",
        "SELECT * FROM privmatch.iris_batch_enroll_start('\\x00'::bytea, 15, 'left', '{}', '{}', '{}', '{}')",
        "SELECT privmatch.iris_delete('iris-000', NULL)",
        "SELECT * FROM privmatch.engine_status()",
    ] {
        let (code, message) = refused(&cluster, &app, sql, &[]);
        assert_eq!(code, "42501", "{sql}: {message}");
    }

    // --- cancellation: statement_timeout ends the wait with 57014 ------------------------
    let fresh = seal(
        &cluster,
        "iris",
        "identify",
        &iris_probe_file,
        &["--front-door", "1"],
    );
    let started = std::time::Instant::now();
    let timed_out = cluster.block_on(async {
        let client = privmatch_coordinator::parties::open(&app)
            .await
            .expect("connect");
        client
            .batch_execute("SET statement_timeout = '2ms'")
            .await
            .expect("set");
        client
            .query(
                "SELECT count(*) FROM privmatch.iris_identify($1)",
                &[&fresh[0].1],
            )
            .await
    });
    let error = timed_out.expect_err("a 2 ms statement_timeout ends the wait");
    assert_eq!(error.code().map(|c| c.code()), Some("57014"), "{error:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));

    // --- the coordinator down: an error that names it, nothing written ---------------------
    cluster.stop_coordinator();
    let (code, message) = refused(
        &cluster,
        &app,
        "SELECT privmatch.iris_enroll($1)",
        &[&again[0].1],
    );
    assert_eq!(code, "08001", "{message}");
    assert!(
        message.contains("cannot reach the coordinator at https://127.0.0.1:"),
        "{message}"
    );
    assert_eq!(cluster.record_counts(), [30; 3]);
    assert_eq!(cluster.prepared_counts(), [0; 3]);
}
