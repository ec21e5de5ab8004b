//! End-to-end tests of device-held face templates (packed Paillier, Game-Set-MATCH: Agrawal,
//! Badrinarayanan, Mukherjee, Rindal, CCS 2020, ePrint 2020/1363) through the product's own
//! interfaces: `privmatch device keygen | pin-service | enroll | respond | list | delete` and
//! `privmatch terminal verify`, through the coordinator's relay to the service provider P0 of
//! three real PostgreSQL parties (the coordinator logs in with its restricted role). Every
//! outcome is checked against the plaintext reference: the quantised inner product against
//! the quantised threshold. Also: tampered relay messages, inputs and records are refused,
//! and nothing secret reaches the coordinator's log.
//!
//! `devices_enrol_under_every_protocol_and_match_with_pi1` needs only what the service
//! provider has today (enrolment for Π1–Π3, Π1's Round 2).
//! `pi2_and_pi3_devices_match_and_a_cheating_device_is_refused` needs Π2's and Π3's rounds at
//! the service provider (`paillier_pi2_round2/round4`, `paillier_pi3_round2/round4/finish`).
//! `terminal_inputs_are_signed_by_a_registered_client` runs under the client-auth policy
//! `required` (issue 34 item 4): the CLI terminal signs its sealed input, and the SP refuses an
//! unsigned, re-signed, replayed or relay-forged one (28000) before any session exists.

use std::path::{Path, PathBuf};
use std::time::Duration;

use privmatch_api::paillier::unix_now_ms;
use privmatch_api::paillier::{DeviceMessage, Reply, SessionState, SessionView};
use privmatch_coordinator::cli::client_key::load_key as load_client_key;
use privmatch_coordinator::cli::http::CallError;
use privmatch_coordinator::config::Config;
use privmatch_coordinator::paillier::client::{
    serve, unix_now, Device as DeviceRef, PaillierClient, Responder,
};
use privmatch_coordinator::paillier::device::{load_key, load_record, record_path, Answered};
use privmatch_core::crypto::client_auth::{unwrap as unwrap_signed, ClientId, ClientSigningKey};
use privmatch_core::paillier::device_signature::{DeviceSigner, Statement};
use privmatch_core::paillier::params::{Params, Protocol, DEFAULT_STAT_BITS};
use privmatch_core::paillier::pi1::Pi1Round2;
use privmatch_core::paillier::pi2::Pi2Round3;
use privmatch_core::paillier::quantize::{plaintext_match, Quantizer};
use privmatch_core::paillier::sealed::{
    DeviceOutcome, DeviceReply, Outcome, Purpose, ReplySecret, TerminalVerdict,
};
use privmatch_core::paillier::signed_round2::SignedRound2;
use privmatch_core::paillier::signed_round2::SignedRound4;
use privmatch_core::paillier::terminal::{TerminalInput, TERMINAL_INPUT_PURPOSE};
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{
    logged_sessions, run, wait_until, write_lines, Background, Cluster, CmdOutput,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{json, Value};

/// ℓ: a small embedding keeps the Π2/Π3 enrolment proofs (linear in ℓ + 4) quick.
const DIM: usize = 64;
/// m: elements of 8 bits.
const BITS: u32 = 8;
/// The cosine similarity the terminals ask for.
const THRESHOLD: f64 = 0.5;
/// Processes run at once.
const PARALLEL: usize = 3;

fn params(protocol: Protocol) -> Params {
    Params::new(
        protocol,
        DIM,
        BITS,
        2048,
        DEFAULT_STAT_BITS,
        Params::max_norm_bound(DIM, BITS),
    )
    .expect("params")
}

fn protocol_name(p: Protocol) -> &'static str {
    p.name()
}

/// A raw (unnormalised) embedding: the CLI normalises.
fn random_embedding(rng: &mut ChaCha20Rng) -> Vec<f64> {
    (0..DIM).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

/// A re-capture of `e` with uniform noise of amplitude `noise`.
fn recapture(rng: &mut ChaCha20Rng, e: &[f64], noise: f64) -> Vec<f64> {
    e.iter()
        .map(|x| x + noise * rng.gen_range(-1.0..1.0))
        .collect()
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

/// The JSON lines of a command's standard output.
fn lines(output: &str) -> Vec<Value> {
    output
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// One device of a test: its files, protocol and captures.
#[derive(Clone)]
struct Device {
    id: String,
    protocol: Protocol,
    key: PathBuf,
    face: PathBuf,
    /// The quantised template u of `face`.
    template: Vec<i32>,
    /// Probe files with the plaintext reference's answer and the quantised capture:
    /// (file, match expected, w).
    probes: Vec<(PathBuf, bool, Vec<i32>)>,
}

/// Writes `embedding` as a one-line NDJSON file (the face input format).
fn write_embedding(path: &Path, subject: &str, embedding: &[f64]) {
    write_lines(
        path,
        &[json!({"subject": subject, "embedding": embedding}).to_string()],
    );
}

/// The SP's operator: service keys (1024-bit ring-Pedersen parameters keep the test fast),
/// the parameter sets and the session policies (threshold, budgets); the client pins the SP with `privmatch device pin-service`. Returns the
/// reloaded client configuration.
fn set_up_service(cluster: &Cluster) -> Config {
    let signing: String =
        cluster.query(0, "SELECT privmatch.paillier_init_service(1024)", &[])[0].get(0);
    for protocol in [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3] {
        cluster.query(
            0,
            "SELECT privmatch.paillier_set_params($1, 30)",
            &[&params(protocol).to_bytes()],
        );
        // The threshold is the SP's policy: the terminals' cosine THRESHOLD, quantised.
        let theta = Quantizer::new(&params(protocol))
            .and_then(|q| q.quantize_threshold(THRESHOLD))
            .expect("θ");
        cluster.query(
            0,
            "SELECT privmatch.paillier_set_policy($1, $2, 1000, 100000)",
            &[&protocol_name(protocol), &theta],
        );
    }
    cluster
        .cli(&[
            "device",
            "pin-service",
            "--party",
            "0",
            "--signing-key",
            &signing,
        ])
        .expect_success();
    Config::load(&cluster.home.join("privmatch.toml")).expect("client configuration")
}

/// Makes `count` devices with `protocol_of(i)`: embeddings, a genuine re-capture (noise
/// growing with i, so some genuine captures fall below the threshold) and an impostor, and the
/// plaintext reference's answers.
fn make_devices(
    cluster: &Cluster,
    rng: &mut ChaCha20Rng,
    prefix: &str,
    count: usize,
    protocol_of: impl Fn(usize) -> Protocol,
) -> Vec<Device> {
    let dir = cluster.path(prefix);
    std::fs::create_dir_all(&dir).expect("dir");
    (0..count)
        .map(|i| {
            let protocol = protocol_of(i);
            let q = Quantizer::new(&params(protocol)).expect("quantiser");
            let theta = q.quantize_threshold(THRESHOLD).expect("θ");
            let id = format!("{prefix}-{i:03}");
            let face = random_embedding(rng);
            let genuine = recapture(rng, &face, 0.3 + 1.4 * i as f64 / count as f64);
            let impostor = random_embedding(rng);
            let u = q.quantize(&face).expect("u");
            let face_path = dir.join(format!("{id}.face.ndjson"));
            write_embedding(&face_path, &id, &face);
            let probes = [("genuine", genuine), ("impostor", impostor)]
                .into_iter()
                .map(|(kind, w)| {
                    let path = dir.join(format!("{id}.{kind}.ndjson"));
                    write_embedding(&path, &id, &w);
                    let w = q.quantize(&w).expect("w");
                    let expected = plaintext_match(&u, &w, theta);
                    (path, expected, w)
                })
                .collect();
            Device {
                key: dir.join(format!("{id}.key")),
                id,
                protocol,
                face: face_path,
                template: u,
                probes,
            }
        })
        .collect()
}

/// Runs `f` on every item, `PARALLEL` at a time.
fn in_parallel<T: Sync>(items: &[T], f: impl Fn(&T) + Sync) {
    for chunk in items.chunks(PARALLEL) {
        std::thread::scope(|s| {
            for item in chunk {
                s.spawn(|| f(item));
            }
        });
    }
}

/// `device keygen` and `device enroll` for every device.
fn keygen_and_enrol(cluster: &Cluster, devices: &[Device]) {
    in_parallel(devices, |d| {
        let out = cluster
            .cli(&[
                "device",
                "keygen",
                "--out",
                &path_arg(&d.key),
                "--bits",
                "2048",
            ])
            .expect_success();
        let made = &lines(&out.stdout)[0];
        assert_eq!(made["bits"], 2048, "{out}");
        let out = cluster
            .cli(&[
                "device",
                "enroll",
                "--key",
                &path_arg(&d.key),
                "--device",
                &d.id,
                "--protocol",
                protocol_name(d.protocol),
                "--input",
                &path_arg(&d.face),
            ])
            .expect_success();
        let enrolled = &lines(&out.stdout)[0];
        assert_eq!(enrolled["device"], d.id.as_str(), "{out}");
        assert!(
            Path::new(enrolled["record"].as_str().unwrap_or_default()).is_file(),
            "{out}"
        );
    });
}

/// The arguments of `terminal verify --json` of `probe` against `device`.
fn verify_args(device: &Device, probe: &Path) -> Vec<String> {
    [
        "terminal",
        "verify",
        "--device",
        &device.id,
        "--protocol",
        protocol_name(device.protocol),
        "--input",
        &path_arg(probe),
        "--threshold",
        &THRESHOLD.to_string(),
        "--timeout",
        "60",
        "--json",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `terminal verify --json` of `probe` against `device`.
fn verify(cluster: &Cluster, device: &Device, probe: &Path) -> CmdOutput {
    let args = verify_args(device, probe);
    cluster.cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Each device answers its probes (`device respond --count N` in the background) while the
/// terminal verifies them; every outcome equals the plaintext reference, on the terminal's
/// side (exit status and JSON) and on the device's.
fn match_all(cluster: &Cluster, devices: &[Device]) {
    in_parallel(devices, |d| {
        let responder = cluster.cli_background(&[
            "device",
            "respond",
            "--key",
            &path_arg(&d.key),
            "--device",
            &d.id,
            "--count",
            &d.probes.len().to_string(),
        ]);
        let mut expected = Vec::new();
        for (probe, matches, _) in &d.probes {
            let out = verify(cluster, d, probe);
            let (code, outcome) = if *matches {
                (Some(0), "match")
            } else {
                (Some(2), "no_match")
            };
            assert_eq!(out.code, code, "{} {}: {out}", d.id, probe.display());
            let verdict = &lines(&out.stdout)[0];
            assert_eq!(verdict["outcome"], outcome, "{out}");
            assert_eq!(verdict["match"], *matches, "{out}");
            expected.push(outcome);
        }
        let answered = responder.wait(Duration::from_secs(120)).expect_success();
        let served: Vec<String> = lines(&answered.stdout)
            .iter()
            .map(|l| l["outcome"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(served, expected, "{answered}");
    });
}

/// The coordinator's log holds none of the devices' keys (hex, and the primes in decimal),
/// none of their quantised templates, and not the SP's signing seed.
fn assert_log_holds_no_secret(cluster: &Cluster, devices: &[Device]) {
    let log = std::fs::read_to_string(cluster.home.join("coordinator.log")).expect("log");
    assert!(
        log.contains("/v1/paillier/verify"),
        "the audit lines are there"
    );
    let party_key = std::fs::read_to_string(cluster.home.join("p0/party.key")).expect("key");
    let seed = party_key
        .lines()
        .find_map(|l| l.strip_prefix("privmatch-sp-signing-key-v1 "))
        .expect("the SP's signing seed");
    assert!(
        !log.contains(seed.trim()),
        "the SP's signing seed is in the log"
    );
    for d in devices {
        let key_line = std::fs::read_to_string(&d.key).expect("key file");
        let hex = key_line.split_whitespace().nth(1).expect("hex");
        assert!(!log.contains(&hex[16..80]), "{}'s key is in the log", d.id);
        let secret = load_key(&d.key).expect("key");
        let (p, q) = secret.primes();
        for prime in [p.to_string(), q.to_string()] {
            assert!(
                !log.contains(&prime[..40]),
                "a prime of {} is in the log",
                d.id
            );
        }
        let template = serde_json::to_string(&d.template[..8]).expect("json");
        let inner = template.trim_start_matches('[').trim_end_matches(']');
        assert!(!log.contains(inner), "{}'s template is in the log", d.id);
    }
}

/// One Π1 session's lines are found by its session id in the four logs of the processes it
/// crosses: the terminal's (it sealed its input to the id), the coordinator's, the service
/// provider's (P0, at `log_min_messages = debug1`) and the device's.
fn one_session_is_found_by_its_id_in_all_four_logs(cluster: &Cluster, device: &Device) {
    cluster.set_log_level(0, "debug1");
    let mut respond = cluster.command(&[
        "device",
        "respond",
        "--key",
        &path_arg(&device.key),
        "--device",
        &device.id,
        "--count",
        "1",
    ]);
    respond.env(
        "PRIVMATCH_LOG",
        "warn,privmatch_coordinator::paillier::client=debug",
    );
    let responder = Background::spawn(respond);
    let args = verify_args(device, &device.probes[0].0);
    let mut verify = cluster.command(&args.iter().map(String::as_str).collect::<Vec<_>>());
    verify.env(
        "PRIVMATCH_LOG",
        "warn,privmatch_coordinator::paillier::client=debug",
    );
    let terminal = run(verify, Duration::from_secs(120));
    assert!(
        terminal.code == Some(0) || terminal.code == Some(2),
        "{terminal}"
    );
    let answered = responder.wait(Duration::from_secs(120)).expect_success();
    let sessions = logged_sessions(&terminal.stderr, "sealed a paillier terminal input");
    assert_eq!(sessions.len(), 1, "one input, one session: {terminal}");
    let session = &sessions[0];
    assert_eq!(session.len(), 32, "a 16-byte session id in hex: {session}");
    assert_eq!(
        logged_sessions(&answered.stderr, "the device answers"),
        vec![session.clone()],
        "the device's line names the session: {answered}"
    );
    let has = |log: &str, text: &str| {
        cluster
            .log_lines_with(log, session)
            .iter()
            .any(|l| l.contains(text))
    };
    wait_until(
        Duration::from_secs(20),
        "the session's lines in the coordinator's and the service provider's logs",
        || {
            has("coordinator.log", "paillier session opened")
                && has("coordinator.log", "paillier device reply relayed")
                && has("p0/postgres.log", "opened (paillier_session_open)")
                && has("p0/postgres.log", "round 2 answered (paillier_pi1_round2)")
        },
    );
    cluster.set_log_level(0, "warning");
}

#[test]
fn devices_enrol_under_every_protocol_and_match_with_pi1() {
    let cluster = Cluster::start("paillier-cli", 61);
    let mut rng = ChaCha20Rng::seed_from_u64(61);
    let started = std::time::Instant::now();
    let config = set_up_service(&cluster);
    // 100 devices: 80 under Π1, 10 under Π2, 10 under Π3.
    let devices = make_devices(&cluster, &mut rng, "dev", 100, |i| match i % 10 {
        8 => Protocol::Pi2,
        9 => Protocol::Pi3,
        _ => Protocol::Pi1,
    });
    let expected = devices
        .iter()
        .flat_map(|d| &d.probes)
        .filter(|p| p.1)
        .count();
    assert!(
        (60..200).contains(&expected),
        "the captures cover both outcomes: {expected} of 200 match"
    );
    keygen_and_enrol(&cluster, &devices);
    eprintln!(
        "[paillier-cli] 100 devices enrolled after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let listed = cluster.cli(&["device", "list"]).expect_success();
    let listed: Value = serde_json::from_str(&listed.stdout).expect("json");
    let listed = listed["devices"].as_array().expect("devices").clone();
    assert_eq!(listed.len(), 100);
    for (entry, d) in listed.iter().zip(&devices) {
        assert_eq!(entry["device"], d.id.as_str());
        assert_eq!(entry["protocol"], protocol_name(d.protocol));
    }

    let pi1: Vec<Device> = devices
        .iter()
        .filter(|d| d.protocol == Protocol::Pi1)
        .cloned()
        .collect();
    match_all(&cluster, &pi1);
    eprintln!(
        "[paillier-cli] {} Π1 sessions after {:.1} s",
        2 * pi1.len(),
        started.elapsed().as_secs_f64()
    );
    one_session_is_found_by_its_id_in_all_four_logs(&cluster, &pi1[0]);

    // Errors a user gets, each changing nothing.
    let d = &pi1[0];
    let again = cluster.cli(&[
        "device",
        "keygen",
        "--out",
        &path_arg(&d.key),
        "--bits",
        "2048",
    ]);
    again
        .expect_failure()
        .assert_stderr_contains(&["never overwritten"]);
    let twice = cluster.cli(&[
        "device",
        "enroll",
        "--key",
        &path_arg(&d.key),
        "--device",
        &d.id,
        "--protocol",
        "pi1",
        "--input",
        &path_arg(&d.face),
    ]);
    twice
        .expect_failure()
        .assert_stderr_contains(&["already enrolled"]);
    let wrong = cluster.cli(&[
        "terminal",
        "verify",
        "--device",
        &d.id,
        "--protocol",
        "pi2",
        "--input",
        &path_arg(&d.probes[0].0),
    ]);
    assert_eq!(wrong.code, Some(1), "{wrong}");
    wrong.assert_stderr_contains(&["enrolled for pi1, not pi2"]);
    let unknown = cluster.cli(&[
        "terminal",
        "verify",
        "--device",
        "nobody",
        "--protocol",
        "pi1",
        "--input",
        &path_arg(&d.probes[0].0),
    ]);
    assert_eq!(unknown.code, Some(1), "{unknown}");
    unknown.assert_stderr_contains(&["nobody"]);
    let short = cluster.path("short.ndjson");
    write_lines(&short, &[json!({"embedding": [0.5, 0.5]}).to_string()]);
    let bad = cluster.cli(&[
        "terminal",
        "verify",
        "--device",
        &d.id,
        "--protocol",
        "pi1",
        "--input",
        &path_arg(&short),
    ]);
    assert_eq!(bad.code, Some(1), "{bad}");
    bad.assert_stderr_contains(&["line 1", "expected 64, got 2"]);
    let threshold = cluster.cli(&[
        "terminal",
        "verify",
        "--device",
        &d.id,
        "--protocol",
        "pi1",
        "--input",
        &path_arg(&d.probes[0].0),
        "--threshold",
        "1.5",
    ]);
    assert_eq!(threshold.code, Some(1), "{threshold}");
    threshold.assert_stderr_contains(&["--threshold"]);
    // A terminal cannot choose its threshold: one other than the SP's policy is refused.
    let lower = cluster.cli(&[
        "terminal",
        "verify",
        "--device",
        &d.id,
        "--protocol",
        "pi1",
        "--input",
        &path_arg(&d.probes[0].0),
        "--threshold",
        "0.2",
    ]);
    assert_eq!(lower.code, Some(1), "{lower}");
    lower.assert_stderr_contains(&["cannot choose the threshold"]);

    // A terminal whose configuration pins another signing key refuses the SP's records.
    let mut other = config.clone();
    if let Some(pin) = other.paillier_service.as_mut() {
        let fake = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
        pin.signing_key = hex::encode(fake.verifying_key().to_bytes());
    }
    let other_path = cluster.path("other-pin.toml");
    other.save(&other_path).expect("save");
    let refused = cluster.cli(&[
        "--config",
        &path_arg(&other_path),
        "terminal",
        "verify",
        "--device",
        &d.id,
        "--protocol",
        "pi1",
        "--input",
        &path_arg(&d.probes[0].0),
    ]);
    assert_eq!(refused.code, Some(1), "{refused}");
    refused.assert_stderr_contains(&["signature does not verify"]);

    tampering_is_refused(&cluster, &config, &pi1, &mut rng);
    assert_log_holds_no_secret(&cluster, &devices);

    // Deletion needs the device's key: with another device's key it is refused (the SP
    // answers 28000) and the record stays; with its own, the record is gone and terminals get
    // a clear error.
    let wrong_key = cluster.cli(&[
        "device",
        "delete",
        "--key",
        &path_arg(&pi1[2].key),
        "--device",
        &pi1[1].id,
    ]);
    assert_eq!(wrong_key.code, Some(1), "{wrong_key}");
    wrong_key.assert_stderr_contains(&["another key"]);
    let gone = cluster
        .cli(&[
            "device",
            "delete",
            "--key",
            &path_arg(&pi1[1].key),
            "--device",
            &pi1[1].id,
        ])
        .expect_success();
    assert_eq!(lines(&gone.stdout)[0]["deleted"], true, "{gone}");
    let after = verify(&cluster, &pi1[1], &pi1[1].probes[0].0);
    assert_eq!(after.code, Some(1), "{after}");
    eprintln!(
        "[paillier-cli] done after {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Tampered relay messages, sealed inputs and records are refused; nothing is relayed for
/// them.
fn tampering_is_refused(
    cluster: &Cluster,
    config: &Config,
    devices: &[Device],
    rng: &mut ChaCha20Rng,
) {
    let keys = cluster.party_keys();
    let d = &devices[2];
    let p = params(Protocol::Pi1);
    let q = Quantizer::new(&p).expect("quantiser");
    let w = d.probes[0].2.clone();
    let theta = q.quantize_threshold(THRESHOLD).expect("θ");
    let mut session = [0u8; 16];
    rng.fill(&mut session);
    let input = TerminalInput {
        protocol: Protocol::Pi1,
        session,
        device_id: d.id.clone(),
        threshold: theta,
        reply_key: ReplySecret::generate(rng).public_key(),
        w: w.clone(),
    };
    let mut sealed = input.seal(PartyIndex::ALL[0], &keys[0], rng).expect("seal");
    let last = sealed.len() - 1;
    sealed[last] ^= 1;
    let signer_of =
        |dev: &Device| DeviceSigner::new(&load_key(&dev.key).expect("key")).expect("signer");
    let (mine, theirs) = (signer_of(d), signer_of(&devices[3]));
    cluster.block_on(async {
        let mut client = PaillierClient::new(config).expect("client");
        // A sealed input tampered on the way: the SP refuses it (08P01 → 422), nothing waits
        // for the device, and the session id cannot be used again.
        match client
            .open_sealed(&d.id, Protocol::Pi1, &session, &sealed)
            .await
        {
            Err(CallError::Api { status, body }) => {
                assert_eq!(status, 422, "{}", body.error);
                assert_eq!(body.sqlstate.as_deref(), Some("08P01"), "{}", body.error);
            }
            other => panic!("a tampered terminal input was accepted: {other:?}"),
        }
        let queued = client.mailbox(&d.id, &mine, 0, 16).await.expect("mailbox");
        assert!(queued.is_empty(), "{queued:?}");
        // A device message tampered on the way: the coordinator refuses it and the session
        // fails; a message for another device's session or of another round is refused.
        let opened = client
            .open(&d.id, Protocol::Pi1, w.clone(), theta)
            .await
            .expect("open");
        // Another device (a valid credential of scope `device`, its own enrolled key) can
        // neither take this device's Round 2 nor answer in its place.
        fn refused_signature<T: std::fmt::Debug>(what: &str, result: Result<T, CallError>) {
            match result {
                Err(CallError::Api { status, body }) => {
                    assert_eq!(status, 403, "{what}: {}", body.error);
                    assert_eq!(body.code.as_deref(), Some("device_signature"), "{what}");
                }
                other => panic!("{what} was accepted: {other:?}"),
            }
        }
        refused_signature(
            "a poll of another device's mailbox",
            client.mailbox(&d.id, &theirs, 0, 16).await,
        );
        let taken = client
            .mailbox(&d.id, &mine, 5_000, 1)
            .await
            .expect("mailbox");
        assert_eq!(taken.len(), 1);
        let hex_session = taken[0].session.clone();
        refused_signature(
            "a reply signed by another device",
            client
                .reply(
                    &d.id,
                    &theirs,
                    &hex_session,
                    3,
                    Reply::Message(vec![1, 19, 1]),
                )
                .await,
        );
        for (device, signer, round) in [(&devices[3].id, &theirs, 3u8), (&d.id, &mine, 5)] {
            match client
                .reply(
                    device,
                    signer,
                    &hex_session,
                    round,
                    Reply::Message(vec![1, 19, 1]),
                )
                .await
            {
                Err(CallError::Api { status, .. }) => assert_eq!(status, 409),
                other => panic!("a misaddressed reply was accepted: {other:?}"),
            }
        }
        // Π1's Round 3 is sealed to the terminal (the coordinator cannot read it, so it
        // cannot refuse a malformed one): relayed as it is, and the terminal believes nothing
        // of it.
        client
            .reply(
                &d.id,
                &mine,
                &hex_session,
                3,
                Reply::Message(vec![1, 0x13, 7]),
            )
            .await
            .expect("relayed");
        let view = client
            .outcome(&opened, Duration::from_secs(5))
            .await
            .expect("outcome");
        assert_eq!(view.state, SessionState::Done, "{view:?}");
        let key = load_record(
            &record_path(&d.key, &d.id),
            &d.id,
            &load_key(&d.key).expect("key"),
            client.service_key(),
            unix_now(),
        )
        .expect("record")
        .record
        .public_key;
        let err = client
            .check_verdict(&opened, &d.id, Protocol::Pi1, &key, &view)
            .expect_err("a malformed Round 3 believed");
        assert!(format!("{err:#}").contains("not trusted"), "{err:#}");
    });
    // A record tampered at rest (its expiry changed): the SP, the device and the terminal
    // refuse it.
    let d = &devices[4];
    let stored: String = cluster.query(
        0,
        "SELECT record::text FROM privmatch.paillier_devices WHERE device_id = $1",
        &[&d.id],
    )[0]
    .get(0);
    let mut bytes = hex::decode(stored.trim()).expect("hex");
    let at = bytes.len() - 65;
    bytes[at] ^= 1;
    cluster.query(
        0,
        "UPDATE privmatch.paillier_devices SET record = $1::text::privmatch.paillier_template \
         WHERE device_id = $2",
        &[&hex::encode(&bytes), &d.id],
    );
    let refused = verify(cluster, d, &d.probes[0].0);
    assert_eq!(refused.code, Some(1), "{refused}");
    refused.assert_stderr_contains(&["signature does not verify"]);
    let record = record_path(&d.key, &d.id);
    let secret = load_key(&d.key).expect("key");
    let client = PaillierClient::new(config).expect("client");
    let signed = load_record(&record, &d.id, &secret, client.service_key(), unix_now())
        .expect("the device's own copy is intact");
    assert!(Responder::new(secret, &signed).is_ok());
    // The device's own copy tampered the same way: it refuses to answer with it.
    let text = std::fs::read_to_string(&record).expect("record");
    let (magic, digits) = text.trim().split_once(' ').expect("tagged line");
    let mut bytes = hex::decode(digits).expect("hex");
    let at = bytes.len() - 65;
    bytes[at] ^= 1;
    std::fs::write(&record, format!("{magic} {}\n", hex::encode(&bytes))).expect("write");
    let respond = cluster.cli(&[
        "device",
        "respond",
        "--key",
        &path_arg(&d.key),
        "--device",
        &d.id,
        "--once",
    ]);
    assert_eq!(respond.code, Some(1), "{respond}");
    respond.assert_stderr_contains(&["signature does not verify"]);
    let d = &devices[2];
    pi1_outcome_is_the_devices_signed_bit(cluster, config, d, &mine, w.clone(), theta);
    relay_rewritten_round2_gets_no_verdict(cluster, config, d, &mine, w, theta, rng);
}

/// The coordinator as a relay that rewrites Round 2 in the device's mailbox (issue 34 point
/// 10 (a)): its own Round 2 (Enc(0), threshold −1: "match" for anyone), or the SP's under a
/// session id it made up. The device (the product's `serve`, as `device respond` runs it)
/// refuses each before decrypting, gives the session up with a fixed reason, and no verdict
/// exists: the terminal's session fails. Against f21d1f1 the device signed "match".
fn relay_rewritten_round2_gets_no_verdict(
    cluster: &Cluster,
    config: &Config,
    d: &Device,
    signer: &DeviceSigner,
    w: Vec<i32>,
    theta: i64,
    rng: &mut ChaCha20Rng,
) {
    let secret = load_key(&d.key).expect("key");
    let client = PaillierClient::new(config).expect("client");
    let signed = load_record(
        &record_path(&d.key, &d.id),
        &d.id,
        &secret,
        client.service_key(),
        unix_now(),
    )
    .expect("record");
    let pk = signed.record.public_key.clone();
    let responder = Responder::new(secret, &signed).expect("device");
    let device = DeviceRef { id: &d.id, signer };
    let own = Pi1Round2 {
        threshold: -1,
        ciphertext: pk.encrypt(&rug::Integer::new(), rng).expect("Enc(0)"),
    }
    .to_bytes(&pk);
    cluster.block_on(async {
        let mut client = PaillierClient::new(config).expect("client");
        for forge in ["own Round 2", "made-up session"] {
            let session = client
                .open(&d.id, Protocol::Pi1, w.clone(), theta)
                .await
                .expect("open");
            let taken = client
                .mailbox(&d.id, signer, 5_000, 1)
                .await
                .expect("mailbox");
            assert_eq!(taken.len(), 1);
            let forged = match forge {
                "own Round 2" => DeviceMessage {
                    message: privmatch_api::wire::to_base64(&own),
                    ..taken[0].clone()
                },
                _ => DeviceMessage {
                    session: hex::encode([0x77u8; 16]),
                    ..taken[0].clone()
                },
            };
            let err = serve(
                &client,
                &device,
                &responder,
                &forged,
                &mut Answered::in_memory(),
                rng,
            )
            .await
            .expect_err(forge);
            assert!(
                format!("{err:#}").contains("Round 2 refused"),
                "{forge}: {err:#}"
            );
            if forge == "made-up session" {
                // The made-up session is unknown to the relay's terminal side; the real one
                // was never answered and expires unanswered: no verdict either way.
                let view = client
                    .outcome(&session, Duration::from_millis(500))
                    .await
                    .expect("outcome");
                assert_eq!(view.state, SessionState::Waiting, "{view:?}");
                assert!(view.verdict.is_none());
                continue;
            }
            let view = client
                .outcome(&session, Duration::from_secs(5))
                .await
                .expect("outcome");
            assert_eq!(view.state, SessionState::Failed, "{forge}: {view:?}");
            assert!(view.verdict.is_none(), "{forge}: a verdict exists");
        }
    });
}

/// Π1's bit comes from the device ([ABMR20] Fig. 3 Round 3): the terminal believes the
/// coordinator's report only with the device's signature of that bit for that session; a
/// flipped, unsigned, moved or stale-clocked report is refused, and so is a poll whose clock
/// is far from the coordinator's.
fn pi1_outcome_is_the_devices_signed_bit(
    cluster: &Cluster,
    config: &Config,
    d: &Device,
    signer: &DeviceSigner,
    w: Vec<i32>,
    theta: i64,
) {
    let secret = load_key(&d.key).expect("key");
    let client = PaillierClient::new(config).expect("client");
    let signed = load_record(
        &record_path(&d.key, &d.id),
        &d.id,
        &secret,
        client.service_key(),
        unix_now(),
    )
    .expect("record");
    let key = signed.record.public_key.clone();
    let Responder::Pi1(device) = Responder::new(secret, &signed).expect("device") else {
        panic!("a Π1 device");
    };
    // A poll stamped ten minutes off is refused even with the right key.
    let stamp = unix_now_ms() - 600_000;
    let stale = signer
        .sign(&Statement::mailbox(&d.id, stamp))
        .expect("sign");
    let body = json!({
        "device": d.id,
        "wait_ms": 0,
        "time_ms": stamp,
        "signature": privmatch_api::wire::to_base64(&stale),
    });
    let (status, answer) =
        cluster.post_bytes("/v1/paillier/mailbox", body.to_string().into_bytes());
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap_or_default()
            .contains("clock"),
        "{answer}"
    );
    cluster.block_on(async {
        let mut client = PaillierClient::new(config).expect("client");
        let session = client
            .open(&d.id, Protocol::Pi1, w, theta)
            .await
            .expect("open");
        let taken = client
            .mailbox(&d.id, signer, 5_000, 1)
            .await
            .expect("mailbox");
        assert_eq!(taken.len(), 1);
        let round2 =
            privmatch_api::wire::from_base64(&taken[0].message, "round 2").expect("base64");
        let round2 = SignedRound2::open(
            &round2,
            client.service_key(),
            &d.id,
            Protocol::Pi1,
            &session,
            unix_now(),
        )
        .expect("the SP's signed Round 2");
        let (round3, outcome) = device.round3_signed(&round2).expect("round 3");
        // The device's bit with its signature, sealed to the terminal's reply key the SP
        // signed into Round 2 (what `serve` posts).
        let signature = signer
            .sign(&Statement::reply_message(&d.id, &session, 3, &round3))
            .expect("sign");
        let honest = TerminalVerdict {
            protocol: Protocol::Pi1,
            session,
            outcome: if outcome.matched {
                Outcome::Match
            } else {
                Outcome::NoMatch
            },
            signature,
        };
        let sealed = honest
            .seal(round2.reply_key(), &mut rand::thread_rng())
            .expect("seal");
        client
            .reply(&d.id, signer, &taken[0].session, 3, Reply::Message(sealed))
            .await
            .expect("relayed");
        let view = client
            .outcome(&session, Duration::from_secs(5))
            .await
            .expect("outcome");
        // The coordinator knows only that the session is over.
        assert_eq!(view.state, SessionState::Done, "{view:?}");
        assert_eq!(
            client
                .check_verdict(&session, &d.id, Protocol::Pi1, &key, &view)
                .expect("the device's signed bit"),
            SessionState::of_bit(outcome.matched)
        );
        let lie = |edit: &dyn Fn(&mut SessionView)| {
            let mut v = view.clone();
            edit(&mut v);
            v
        };
        // The reply key is public (it is in the signed Round 2), so the relay can seal what it
        // likes to it: the flipped bit beside the device's signature of the real one.
        let flipped = TerminalVerdict {
            outcome: if outcome.matched {
                Outcome::NoMatch
            } else {
                Outcome::Match
            },
            ..honest.clone()
        }
        .seal(round2.reply_key(), &mut rand::thread_rng())
        .expect("seal");
        let other_session = [0x5a; 16];
        for (what, forged, device, session) in [
            (
                "flipped and resealed",
                lie(&|v| v.verdict = Some(privmatch_api::wire::to_base64(&flipped))),
                d.id.as_str(),
                &session,
            ),
            (
                "an outcome in the clear",
                lie(&|v| v.state = SessionState::of_bit(outcome.matched)),
                d.id.as_str(),
                &session,
            ),
            (
                "refused in the clear",
                lie(&|v| v.state = SessionState::Refused),
                d.id.as_str(),
                &session,
            ),
            (
                "unsigned",
                lie(&|v| v.verdict = None),
                d.id.as_str(),
                &session,
            ),
            ("other device", view.clone(), "someone-else", &session),
            ("other session", view.clone(), d.id.as_str(), &other_session),
        ] {
            let err = client
                .check_verdict(session, device, Protocol::Pi1, &key, &forged)
                .expect_err(what);
            assert!(
                format!("{err:#}").contains("not trusted"),
                "{what}: {err:#}"
            );
        }
    });
}

/// Π2 and Π3 through the CLI, and a device that cheats in Π2 (X + 1) refused: this needs
/// `paillier_pi2_round2`, `paillier_pi2_round4`, `paillier_pi3_round2`, `paillier_pi3_round4`
/// and `paillier_pi3_finish` at the service provider.
#[test]
fn pi2_and_pi3_devices_match_and_a_cheating_device_is_refused() {
    let cluster = Cluster::start("paillier-cli-malicious", 62);
    let mut rng = ChaCha20Rng::seed_from_u64(62);
    let config = set_up_service(&cluster);
    let devices = make_devices(&cluster, &mut rng, "mal", 12, |i| {
        if i % 2 == 0 {
            Protocol::Pi2
        } else {
            Protocol::Pi3
        }
    });
    keygen_and_enrol(&cluster, &devices);
    match_all(&cluster, &devices);

    // A Π2 device that sends X + 1 instead of X: the SP's check fails, the terminal exits 3
    // (refused) and the device gets no Round 4.
    let d = &devices[0];
    let terminal = Background::spawn(cluster.command(&[
        "terminal",
        "verify",
        "--device",
        &d.id,
        "--protocol",
        "pi2",
        "--input",
        &path_arg(&d.probes[0].0),
        "--threshold",
        &THRESHOLD.to_string(),
        "--json",
    ]));
    let secret = load_key(&d.key).expect("key");
    let client = PaillierClient::new(&config).expect("client");
    let record = record_path(&d.key, &d.id);
    let signed =
        load_record(&record, &d.id, &secret, client.service_key(), unix_now()).expect("record");
    let p = signed.record.params.clone();
    let key = signed.record.public_key.clone();
    let signer = DeviceSigner::new(&secret).expect("signer");
    let Responder::Pi2(device) = Responder::new(secret, &signed).expect("device") else {
        panic!("a Π2 device");
    };
    cluster.block_on(async {
        let taken = client
            .mailbox(&d.id, &signer, 20_000, 1)
            .await
            .expect("mailbox");
        assert_eq!(taken.len(), 1, "the terminal's session reached the mailbox");
        let round2 =
            privmatch_api::wire::from_base64(&taken[0].message, "round 2").expect("base64");
        let session =
            privmatch_api::wire::session_from_hex(&taken[0].session, "session").expect("hex");
        let round2 = SignedRound2::open(
            &round2,
            client.service_key(),
            &d.id,
            Protocol::Pi2,
            &session,
            unix_now(),
        )
        .expect("the SP's signed Round 2");
        let honest = device.session().round3_signed(&round2).expect("round 3");
        let mut cheat = Pi2Round3::from_bytes(&p, &honest).expect("decodes");
        cheat.x += 1u32;
        let reply_secret = ReplySecret::generate(&mut rand::thread_rng());
        let posted = DeviceReply {
            reply_key: reply_secret.public_key(),
            message: cheat.to_bytes(&p),
        }
        .to_bytes();
        let answer = client
            .reply(
                &d.id,
                &signer,
                &taken[0].session,
                3,
                Reply::Message(posted.clone()),
            )
            .await
            .expect("relayed");
        // Round 4 comes whatever the outcome (the coordinator cannot tell a refusal), signed
        // for this session and Round 3 and sealed to the device: it says "refused".
        assert!(answer.closed, "{answer:?}");
        let round4 = answer.next.expect("a Round 4");
        let sealed = SignedRound4::open(
            &privmatch_api::wire::from_base64(&round4.message, "round 4").expect("b64"),
            client.service_key(),
            &d.id,
            Protocol::Pi2,
            &session,
            &posted,
        )
        .expect("the SP's signed Round 4");
        let told = DeviceOutcome::from_bytes(
            &reply_secret
                .open(Purpose::DeviceRound4, &session, &sealed)
                .expect("sealed to the device"),
        )
        .expect("decodes");
        assert_eq!(told, DeviceOutcome(Outcome::Refused));
        // The SP signed the refusal for this session and device, sealed to the terminal; a
        // coordinator that reports an outcome in the clear, drops the verdict or moves it to
        // another device or protocol is not believed.
        let view = client
            .outcome(&session, Duration::from_secs(5))
            .await
            .expect("outcome");
        assert_eq!(view.state, SessionState::Done, "{view:?}");
        let lie = |edit: &dyn Fn(&mut SessionView)| {
            let mut v = view.clone();
            edit(&mut v);
            v
        };
        for (what, forged, device, protocol) in [
            (
                "match",
                lie(&|v| v.state = SessionState::Match),
                d.id.as_str(),
                Protocol::Pi2,
            ),
            (
                "no match",
                lie(&|v| v.state = SessionState::NoMatch),
                d.id.as_str(),
                Protocol::Pi2,
            ),
            (
                "unsigned",
                lie(&|v| v.verdict = None),
                d.id.as_str(),
                Protocol::Pi2,
            ),
            (
                "other device",
                view.clone(),
                devices[2].id.as_str(),
                Protocol::Pi2,
            ),
            ("other protocol", view.clone(), d.id.as_str(), Protocol::Pi3),
        ] {
            let err = client
                .check_verdict(&session, device, protocol, &key, &forged)
                .expect_err(what);
            assert!(
                format!("{err:#}").contains("not trusted"),
                "{what}: {err:#}"
            );
        }
    });
    let out = terminal.wait(Duration::from_secs(60));
    assert_eq!(out.code, Some(3), "{out}");
    assert_eq!(lines(&out.stdout)[0]["outcome"], "refused", "{out}");
    assert_log_holds_no_secret(&cluster, &devices);
}

/// `sql` with `args` at the SP as the coordinator's login role, in a transaction of its own:
/// the first column of the first row, or (SQLSTATE, message).
fn at_sp(
    cluster: &Cluster,
    sql: &str,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<u8>, (String, String)> {
    cluster
        .query_login(&cluster.coordinator_logins[0], sql, args)
        .map(|rows| rows[0].get::<_, Vec<u8>>(0))
}

/// Asserts that `got` was refused with SQLSTATE 28000 and a message containing `phrase`.
fn refused_28000<T: std::fmt::Debug>(got: Result<T, (String, String)>, phrase: &str, what: &str) {
    match got {
        Ok(v) => panic!("{what}: accepted ({v:?})"),
        Err((code, message)) => {
            assert_eq!(code, "28000", "{what}: {message}");
            assert!(
                message.contains(phrase),
                "{what}: {phrase:?} not in {message:?}"
            );
        }
    }
}

/// Sessions the SP's log holds for the session id `session`.
fn sessions_logged(cluster: &Cluster, session: &[u8; 16]) -> i64 {
    cluster.query(
        0,
        "SELECT count(*) FROM privmatch.paillier_session_log WHERE session = $1",
        &[&session.to_vec()],
    )[0]
    .get(0)
}

#[test]
fn terminal_inputs_are_signed_by_a_registered_client() {
    let cluster = Cluster::start_required("paillier-cli-signed", 13);
    let mut rng = ChaCha20Rng::seed_from_u64(13);
    let config = set_up_service(&cluster);
    let devices = make_devices(&cluster, &mut rng, "signed", 1, |_| Protocol::Pi1);
    keygen_and_enrol(&cluster, &devices);
    let d = &devices[0];

    // The CLI terminal signs its input as the client `cluster up` registered: the sessions
    // run and every outcome is the plaintext reference's.
    match_all(&cluster, &devices);

    let keys = cluster.party_keys();
    let theta = Quantizer::new(&params(Protocol::Pi1))
        .and_then(|q| q.quantize_threshold(THRESHOLD))
        .expect("θ");
    let w = d.probes[0].2.clone();
    let seal = |rng: &mut ChaCha20Rng| -> ([u8; 16], Vec<u8>) {
        let session: [u8; 16] = rng.gen();
        let sealed = TerminalInput {
            protocol: Protocol::Pi1,
            session,
            device_id: d.id.clone(),
            threshold: theta,
            reply_key: ReplySecret::generate(rng).public_key(),
            w: w.clone(),
        }
        .seal(PartyIndex::ALL[0], &keys[0], rng)
        .expect("seal");
        (session, sealed)
    };
    let client_id = config
        .client_id
        .clone()
        .expect("cluster up names its client");
    let client = ClientId::new(&client_id).expect("client id");
    let key = load_client_key(config.client_key.as_deref().expect("client key")).expect("key");
    let now = u64::try_from(unix_now()).unwrap_or_default();
    let sign = |party: PartyIndex, purpose: &str, sealed: &[u8], rng: &mut ChaCha20Rng| {
        key.wrap(&client, party, purpose, sealed, now, rng)
    };

    // Unsigned, through the coordinator's API: refused at the SP (28000 → 403), no session
    // opened, nothing for the device.
    let (session, unsigned) = seal(&mut rng);
    cluster.block_on(async {
        let terminal = PaillierClient::new(&config).expect("client");
        match terminal
            .open_sealed(&d.id, Protocol::Pi1, &session, &unsigned)
            .await
        {
            Err(CallError::Api { status, body }) => {
                assert_eq!(status, 403, "{}", body.error);
                assert_eq!(body.sqlstate.as_deref(), Some("28000"), "{}", body.error);
                assert!(
                    body.error.contains("not signed by a client"),
                    "{}",
                    body.error
                );
            }
            other => panic!("an unsigned terminal input was accepted: {other:?}"),
        }
        let signer = DeviceSigner::new(&load_key(&d.key).expect("key")).expect("signer");
        let queued = terminal
            .mailbox(&d.id, &signer, 0, 16)
            .await
            .expect("mailbox");
        assert!(queued.is_empty(), "{queued:?}");
    });
    assert_eq!(sessions_logged(&cluster, &session), 0);

    // The CLI terminal without a client credential: refused the same way.
    let mut unsigned_config = config.clone();
    unsigned_config.client_id = None;
    unsigned_config.client_key = None;
    let unsigned_path = cluster.path("unsigned-terminal.toml");
    unsigned_config.save(&unsigned_path).expect("save");
    cluster
        .cli(&[
            "--config",
            &path_arg(&unsigned_path),
            "terminal",
            "verify",
            "--device",
            &d.id,
            "--protocol",
            "pi1",
            "--input",
            &path_arg(&d.probes[0].0),
            "--threshold",
            &THRESHOLD.to_string(),
            "--timeout",
            "10",
            "--json",
        ])
        .expect_failure()
        .assert_stderr_contains(&["not signed by a client"]);

    // What a relay could make of a signed input, at the SP as the coordinator's role: each
    // refused (28000) and no session opened.
    let open_sql = "SELECT privmatch.paillier_session_open($1, $2, 'relay')";
    let (session, sealed) = seal(&mut rng);
    let signed = sign(
        PartyIndex::ALL[0],
        TERMINAL_INPUT_PURPOSE,
        &sealed,
        &mut rng,
    );
    // A byte of the signature changed.
    let mut rewritten = signed.clone();
    let inner_len = unwrap_signed(&signed).expect("signed").1.len();
    let last_signature_byte = rewritten.len() - inner_len - 1;
    rewritten[last_signature_byte] ^= 1;
    refused_28000(
        at_sp(&cluster, open_sql, &[&d.id, &rewritten]),
        "signature",
        "a rewritten signature",
    );
    // Re-signed under the client's id with a key the relay holds.
    let relay_key = ClientSigningKey::generate(&mut rng);
    let resigned = relay_key.wrap(
        &client,
        PartyIndex::ALL[0],
        TERMINAL_INPUT_PURPOSE,
        &sealed,
        now,
        &mut rng,
    );
    refused_28000(
        at_sp(&cluster, open_sql, &[&d.id, &resigned]),
        "signature",
        "re-signed by the relay",
    );
    // The client's signature for another party or another purpose.
    let other_party = sign(
        PartyIndex::ALL[1],
        TERMINAL_INPUT_PURPOSE,
        &sealed,
        &mut rng,
    );
    refused_28000(
        at_sp(&cluster, open_sql, &[&d.id, &other_party]),
        &client_id,
        "signed for P1",
    );
    let other_purpose = sign(PartyIndex::ALL[0], "face-probe", &sealed, &mut rng);
    refused_28000(
        at_sp(&cluster, open_sql, &[&d.id, &other_purpose]),
        &client_id,
        "signed for another purpose",
    );
    // The signature stripped.
    refused_28000(
        at_sp(&cluster, open_sql, &[&d.id, &sealed]),
        "not signed by a client",
        "the signature stripped",
    );
    assert_eq!(sessions_logged(&cluster, &session), 0);

    // The genuine signed input opens its session once; replayed, it is refused (its nonce).
    let opened = at_sp(&cluster, open_sql, &[&d.id, &signed]).expect("a signed input opens");
    assert_eq!(opened, session.to_vec());
    refused_28000(
        at_sp(&cluster, open_sql, &[&d.id, &signed]),
        "replayed",
        "a replayed signed input",
    );
    // Round 2 of that session with an input the relay sealed itself for the same session id
    // (it learnt the id from paillier_session_open): unsigned, refused; the session keeps its
    // Round 2 for the terminal's own input.
    let forged = TerminalInput {
        protocol: Protocol::Pi1,
        session,
        device_id: d.id.clone(),
        threshold: theta,
        reply_key: ReplySecret::generate(&mut rng).public_key(),
        w: vec![0; w.len()],
    }
    .seal(PartyIndex::ALL[0], &keys[0], &mut rng)
    .expect("seal");
    let round2_sql = "SELECT privmatch.paillier_pi1_round2($1, $2)";
    refused_28000(
        at_sp(&cluster, round2_sql, &[&d.id, &forged]),
        "not signed by a client",
        "a forged Round 2 input",
    );
    let round2 = at_sp(&cluster, round2_sql, &[&d.id, &signed]).expect("Round 2");
    let service_key = PaillierClient::new(&config)
        .expect("client")
        .service_key()
        .to_owned();
    SignedRound2::open(
        &round2,
        &service_key,
        &d.id,
        Protocol::Pi1,
        &session,
        unix_now(),
    )
    .expect("the SP's signed Round 2 of the signed input");
    assert_eq!(sessions_logged(&cluster, &session), 1);
}
