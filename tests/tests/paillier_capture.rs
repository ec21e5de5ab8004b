//! Device-held face templates (packed Paillier, Game-Set-MATCH: Agrawal, Badrinarayanan,
//! Mukherjee, Rindal, CCS 2020, ePrint 2020/1363), issue 34 item 10, the rest (0.12.0):
//!
//! 1. **Capture.** Everything the coordinator sends and receives in Π1, Π2 and Π3 sessions —
//!    the terminal's sealed input and every answer to it, every mailbox message, every device
//!    post and every answer to it, every outcome poll — holds no match bit, no validity bit and
//!    no verdict in the clear. The SP's answers reach the coordinator and are relayed verbatim
//!    (signed Round 2, sealed Round 4, sealed verdict), so this capture covers the SP ↔
//!    coordinator link too. Searched for: the states' names, the verdicts' signatures (the SP's
//!    and, in Π1, the device's), the encoded bits; and the coordinator's view of a matching,
//!    a non-matching and a refused session has the same shape (the same steps, the same
//!    lengths). Before 0.12.0 the outcome's state was `match`/`no_match` in the clear and the
//!    Π3 output decoding travelled beside the output labels.
//! 2. **Round 3–5 bound.** The coordinator (this test, with the coordinator's role at the SP)
//!    splices a device's Round 3 into another session of the same device: refused (28000),
//!    the session unchanged; a signed Round 4 moved to another session: refused by the device.
//! 3. **Replay.** A signed Round 2 handed to the device again (also after a restart of the
//!    device): refused, nothing decrypted.
//! 4. **Lost device.** A deletion without any signature: 400; with a forged one: refused at
//!    the SP (28000), the record kept; the SP operator's signed command through
//!    `privmatch device delete --operator-key`: deleted; the same command replayed: refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use privmatch_api::paillier::{DeviceMessage, Reply, SessionState};
use privmatch_api::wire::{from_base64, session_from_hex, to_base64};
use privmatch_coordinator::config::Config;
use privmatch_coordinator::paillier::client::{
    serve, unix_now, Device as DeviceRef, PaillierClient, Responder,
};
use privmatch_coordinator::paillier::device::{
    answered_path, load_key, load_record, record_path, Answered,
};
use privmatch_core::paillier::cipher::SecretKey;
use privmatch_core::paillier::device_signature::{DeviceSigner, Statement};
use privmatch_core::paillier::params::{Params, Protocol, DEFAULT_STAT_BITS};
use privmatch_core::paillier::pi1::Pi1Round3;
use privmatch_core::paillier::pi2::{Pi2Round3, Pi2Round4};
use privmatch_core::paillier::quantize::{plaintext_match, Quantizer};
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::sealed::{
    DeviceOutcome, DeviceReply, Outcome, Purpose, ReplySecret, TerminalVerdict,
};
use privmatch_core::paillier::signed_round2::{SignedRound2, SignedRound4};
use privmatch_core::paillier::terminal::TerminalInput;
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{contains, sqlstate_and_message, write_lines, Cluster};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::{json, Value};

const DIM: usize = 16;
const BITS: u32 = 8;
const THRESHOLD: f64 = 0.5;

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

fn name(p: Protocol) -> &'static str {
    p.name()
}

fn path_arg(p: &Path) -> String {
    p.display().to_string()
}

/// The SP's operator sets the service up (keys, parameters, policies with the cosine
/// THRESHOLD); the client pins it. Returns the client configuration.
fn set_up_service(cluster: &Cluster) -> Config {
    let signing: String =
        cluster.query(0, "SELECT privmatch.paillier_init_service(1024)", &[])[0].get(0);
    for protocol in [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3] {
        cluster.query(
            0,
            "SELECT privmatch.paillier_set_params($1, 30)",
            &[&params(protocol).to_bytes()],
        );
        let theta = Quantizer::new(&params(protocol))
            .and_then(|q| q.quantize_threshold(THRESHOLD))
            .expect("θ");
        cluster.query(
            0,
            "SELECT privmatch.paillier_set_policy($1, $2, 1000, 100000)",
            &[&name(protocol), &theta],
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

/// One enrolled device: id, protocol, key file, its template u.
struct Dev {
    id: String,
    protocol: Protocol,
    key: PathBuf,
    u: Vec<i32>,
}

impl Dev {
    fn secret(&self) -> SecretKey {
        load_key(&self.key).expect("key")
    }

    fn signer(&self) -> DeviceSigner {
        DeviceSigner::new(&self.secret()).expect("signer")
    }

    fn record(&self, client: &PaillierClient) -> SignedTemplate {
        load_record(
            &record_path(&self.key, &self.id),
            &self.id,
            &self.secret(),
            client.service_key(),
            unix_now(),
        )
        .expect("record")
    }
}

/// `device keygen` and `device enroll` of a random face under `protocol`.
fn enrol(cluster: &Cluster, rng: &mut ChaCha20Rng, id: &str, protocol: Protocol) -> Dev {
    let face: Vec<f64> = (0..DIM).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let key = cluster.path(&format!("{id}.key"));
    let input = cluster.path(&format!("{id}.face.ndjson"));
    write_lines(&input, &[json!({"embedding": face}).to_string()]);
    cluster
        .cli(&[
            "device",
            "keygen",
            "--out",
            &path_arg(&key),
            "--bits",
            "2048",
        ])
        .expect_success();
    cluster
        .cli(&[
            "device",
            "enroll",
            "--key",
            &path_arg(&key),
            "--device",
            id,
            "--protocol",
            name(protocol),
            "--input",
            &path_arg(&input),
        ])
        .expect_success();
    let u = Quantizer::new(&params(protocol))
        .and_then(|q| q.quantize(&face))
        .expect("u");
    Dev {
        id: id.to_owned(),
        protocol,
        key,
        u,
    }
}

/// What crossed the coordinator in one session, as its clients saw it: every JSON text
/// exchanged and every binary field decoded.
#[derive(Default)]
struct Capture {
    texts: Vec<String>,
    bytes: Vec<Vec<u8>>,
    /// (step, length of what crossed) in order: the shape of the coordinator's view.
    shape: Vec<(String, usize)>,
}

impl Capture {
    fn json(&mut self, step: &str, value: Value) {
        let text = value.to_string();
        let parsed: Value = serde_json::from_str(&text).expect("json");
        self.walk(&parsed);
        self.shape.push((step.to_owned(), 0));
        self.texts.push(text);
    }

    fn walk(&mut self, v: &Value) {
        match v {
            Value::String(s) => {
                if let Ok(b) = from_base64(s, "field") {
                    self.bytes.push(b);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| self.walk(x)),
            Value::Object(o) => o.values().for_each(|x| self.walk(x)),
            _ => {}
        }
    }

    fn raw(&mut self, step: &str, bytes: &[u8]) {
        self.shape.push((step.to_owned(), bytes.len()));
        self.bytes.push(bytes.to_vec());
    }

    /// Whether `needle` crossed in the clear.
    fn holds(&self, needle: &[u8]) -> bool {
        self.bytes.iter().any(|b| contains(b, needle))
    }
}

/// What a session decided, and what the terminal opened.
struct Run {
    capture: Capture,
    outcome: Outcome,
    /// The signature inside the verdict the terminal opened.
    signature: Vec<u8>,
}

/// One session through the coordinator's API, the terminal and the device played here with
/// the product's client calls and core's state machines (as `serve` does), everything
/// captured. `cheat`: a Π2 device that sends X + 1.
async fn captured_session(
    cluster: &Cluster,
    config: &Config,
    dev: &Dev,
    w: &[i32],
    cheat: bool,
    rng: &mut ChaCha20Rng,
) -> Run {
    let keys = cluster.party_keys();
    let mut cap = Capture::default();
    let client = PaillierClient::new(config).expect("client");
    let record = dev.record(&client);
    let theta = Quantizer::new(&params(dev.protocol))
        .and_then(|q| q.quantize_threshold(THRESHOLD))
        .expect("θ");
    // The terminal: its reply key inside the input sealed to the SP.
    let terminal = ReplySecret::generate(rng);
    let session: [u8; 16] = rng.gen();
    let sealed = TerminalInput {
        protocol: dev.protocol,
        session,
        device_id: dev.id.clone(),
        threshold: theta,
        reply_key: terminal.public_key(),
        w: w.to_vec(),
    }
    .seal(PartyIndex::ALL[0], &keys[0], rng)
    .expect("seal");
    cap.raw("terminal input", &sealed);
    let opened = client
        .open_sealed(&dev.id, dev.protocol, &session, &sealed)
        .await
        .expect("open");
    cap.json(
        "verify answer",
        serde_json::to_value(&opened).expect("json"),
    );
    // The device.
    let signer = dev.signer();
    let messages = client
        .mailbox(&dev.id, &signer, 10_000, 1)
        .await
        .expect("mailbox");
    cap.json("mailbox", serde_json::to_value(&messages).expect("json"));
    assert_eq!(messages.len(), 1);
    let envelope = from_base64(&messages[0].message, "round 2").expect("b64");
    let round2 = SignedRound2::open(
        &envelope,
        client.service_key(),
        &dev.id,
        dev.protocol,
        &session,
        unix_now(),
    )
    .expect("the SP's Round 2");
    let hex = messages[0].session.clone();
    let responder = Responder::new(dev.secret(), &record).expect("device");
    let device_learnt = match &responder {
        Responder::Pi1(d) => {
            let (round3, outcome) = d.round3_signed(&round2).expect("round 3");
            let signature = signer
                .sign(&Statement::reply_message(&dev.id, &session, 3, &round3))
                .expect("sign");
            let posted = TerminalVerdict {
                protocol: Protocol::Pi1,
                session,
                outcome: if outcome.matched {
                    Outcome::Match
                } else {
                    Outcome::NoMatch
                },
                signature,
            }
            .seal(round2.reply_key(), rng)
            .expect("seal");
            cap.raw("round 3", &posted);
            let answer = client
                .reply(&dev.id, &signer, &hex, 3, Reply::Message(posted))
                .await
                .expect("reply");
            cap.json("reply answer", serde_json::to_value(&answer).expect("json"));
            Outcome::of(outcome.matched, true)
        }
        Responder::Pi2(d) => {
            let mut s = d.session();
            let mut round3 = s.round3_signed(&round2).expect("round 3");
            if cheat {
                let mut x = Pi2Round3::from_bytes(&params(Protocol::Pi2), &round3).expect("X");
                x.x += 1u32;
                round3 = x.to_bytes(&params(Protocol::Pi2));
            }
            let reply = ReplySecret::generate(rng);
            let posted = DeviceReply {
                reply_key: reply.public_key(),
                message: round3,
            }
            .to_bytes();
            cap.raw("round 3", &posted);
            let answer = client
                .reply(&dev.id, &signer, &hex, 3, Reply::Message(posted.clone()))
                .await
                .expect("reply");
            cap.json("reply answer", serde_json::to_value(&answer).expect("json"));
            let round4 = from_base64(&answer.next.expect("Round 4").message, "r4").expect("b64");
            let sealed = SignedRound4::open(
                &round4,
                client.service_key(),
                &dev.id,
                Protocol::Pi2,
                &session,
                &posted,
            )
            .expect("signed Round 4");
            for bit in [false, true] {
                assert_ne!(
                    sealed,
                    Pi2Round4 { matched: bit }.to_bytes(),
                    "Round 4 in the clear"
                );
            }
            DeviceOutcome::from_bytes(
                &reply
                    .open(Purpose::DeviceRound4, &session, &sealed)
                    .expect("sealed to the device"),
            )
            .expect("decodes")
            .0
        }
        Responder::Pi3(d) => {
            let mut s = d.session();
            let round3 = s.round3_signed(&round2, rng).expect("round 3");
            let reply = ReplySecret::generate(rng);
            let posted = DeviceReply {
                reply_key: reply.public_key(),
                message: round3,
            }
            .to_bytes();
            cap.raw("round 3", &posted);
            let answer = client
                .reply(&dev.id, &signer, &hex, 3, Reply::Message(posted.clone()))
                .await
                .expect("reply");
            cap.json("reply answer", serde_json::to_value(&answer).expect("json"));
            let round4 = from_base64(&answer.next.expect("Round 4").message, "r4").expect("b64");
            cap.raw("round 4", &round4);
            let sealed = SignedRound4::open(
                &round4,
                client.service_key(),
                &dev.id,
                Protocol::Pi3,
                &session,
                &posted,
            )
            .expect("signed Round 4");
            let opened = reply
                .open(Purpose::DeviceRound4, &session, &sealed)
                .expect("sealed to the device");
            // What the coordinator has of Round 4 is not Round 4: its end (the OT answer's
            // last bytes and the output decoding, which with the Round 5 labels would give
            // the bit) stays sealed.
            assert!(!contains(&round4, &opened[opened.len() - 64..]));
            let (round5, matched) = s.round5(&opened).expect("round 5");
            cap.raw("round 5", &round5);
            let answer = client
                .reply(&dev.id, &signer, &hex, 5, Reply::Message(round5))
                .await
                .expect("reply");
            cap.json("reply answer", serde_json::to_value(&answer).expect("json"));
            Outcome::of(matched, true)
        }
    };
    let view = client
        .outcome(&session, Duration::from_secs(10))
        .await
        .expect("outcome");
    cap.json("outcome", serde_json::to_value(&view).expect("json"));
    assert_eq!(view.state, SessionState::Done, "{view:?}");
    let sealed = from_base64(view.verdict.as_deref().expect("a verdict"), "verdict").expect("b64");
    cap.raw("verdict", &sealed);
    let verdict = TerminalVerdict::open(&terminal, &sealed, &session).expect("opens");
    let outcome = verdict
        .check(
            dev.protocol,
            &dev.id,
            client.service_key(),
            &record.record.public_key,
        )
        .expect("signed");
    assert_eq!(outcome, device_learnt, "the device and the terminal agree");
    Run {
        capture: cap,
        outcome,
        signature: verdict.signature,
    }
}

/// The capture holds nothing of the outcome (module documentation, point 1).
fn assert_blind(run: &Run, what: &str) {
    let cap = &run.capture;
    for text in &cap.texts {
        for word in [
            "\"match\"",
            "no_match",
            "refused",
            "matched",
            "\"valid\"",
            "inner_product",
        ] {
            assert!(!text.contains(word), "{what}: {word} in {text}");
        }
    }
    assert!(
        !cap.holds(&run.signature),
        "{what}: the verdict's signature crossed the coordinator in the clear"
    );
    for bit in [false, true] {
        let encodings = [
            Pi1Round3 { matched: bit }.to_bytes(),
            Pi2Round4 { matched: bit }.to_bytes(),
        ];
        for e in &encodings {
            assert!(
                !cap.bytes.iter().any(|b| b == e),
                "{what}: an encoded bit crossed as a message"
            );
        }
    }
}

#[test]
fn the_coordinator_relays_no_outcome_splices_nothing_and_devices_answer_once() {
    let cluster = Cluster::start("paillier-capture", 93);
    let mut rng = ChaCha20Rng::seed_from_u64(93);
    let config = set_up_service(&cluster);
    let devs: Vec<Dev> = [Protocol::Pi1, Protocol::Pi2, Protocol::Pi3]
        .into_iter()
        .map(|p| enrol(&cluster, &mut rng, &format!("cap-{}", name(p)), p))
        .collect();

    // ---- 1. The capture. ----
    cluster.block_on(async {
        let mut rng = ChaCha20Rng::seed_from_u64(930);
        for dev in &devs {
            let theta = Quantizer::new(&params(dev.protocol))
                .and_then(|q| q.quantize_threshold(THRESHOLD))
                .expect("θ");
            let genuine = dev.u.clone();
            let impostor: Vec<i32> = dev.u.iter().map(|x| -x).collect();
            assert!(plaintext_match(&dev.u, &genuine, theta));
            assert!(!plaintext_match(&dev.u, &impostor, theta));
            let yes = captured_session(&cluster, &config, dev, &genuine, false, &mut rng).await;
            let no = captured_session(&cluster, &config, dev, &impostor, false, &mut rng).await;
            assert_eq!(yes.outcome, Outcome::Match, "{}", dev.id);
            assert_eq!(no.outcome, Outcome::NoMatch, "{}", dev.id);
            assert_blind(&yes, &format!("{} match", dev.id));
            assert_blind(&no, &format!("{} no match", dev.id));
            // The coordinator's view of a match and of a non-match has the same shape.
            assert_eq!(yes.capture.shape, no.capture.shape, "{}", dev.id);
            if dev.protocol == Protocol::Pi2 {
                let cheat =
                    captured_session(&cluster, &config, dev, &genuine, true, &mut rng).await;
                assert_eq!(cheat.outcome, Outcome::Refused);
                assert_blind(&cheat, "Π2 refused");
                assert_eq!(
                    cheat.capture.shape, yes.capture.shape,
                    "a refusal looks like any other end to the coordinator"
                );
            }
        }
    });
    let log = std::fs::read_to_string(cluster.home.join("coordinator.log")).expect("log");
    for word in ["no_match", "\"match\"", "refused"] {
        assert!(!log.contains(word), "the coordinator's log says {word}");
    }

    // ---- 2. A device's Round 3 spliced into another session of the same device; a signed
    // Round 4 moved to another session. The coordinator is played here with its own role at
    // the SP. ----
    let pi2 = &devs[1];
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let sp = &clients[0];
        let keys = cluster.party_keys();
        let mut rng = ChaCha20Rng::seed_from_u64(931);
        let client = PaillierClient::new(&config).expect("client");
        let record = pi2.record(&client);
        let responder = Responder::new(pi2.secret(), &record).expect("device");
        let Responder::Pi2(device) = &responder else {
            panic!("a Π2 device")
        };
        let theta = Quantizer::new(&params(Protocol::Pi2))
            .and_then(|q| q.quantize_threshold(THRESHOLD))
            .expect("θ");
        let signer = pi2.signer();
        let mut open = |sessions: &mut Vec<[u8; 16]>| {
            let session: [u8; 16] = rng.gen();
            sessions.push(session);
            TerminalInput {
                protocol: Protocol::Pi2,
                session,
                device_id: pi2.id.clone(),
                threshold: theta,
                reply_key: ReplySecret::generate(&mut rng).public_key(),
                w: pi2.u.clone(),
            }
            .seal(PartyIndex::ALL[0], &keys[0], &mut rng)
            .expect("seal")
        };
        let mut sessions = Vec::new();
        let mut posted = Vec::new();
        for _ in 0..2 {
            let sealed = open(&mut sessions);
            let session = *sessions.last().expect("session");
            sp.query_one(
                "SELECT privmatch.paillier_session_open($1, $2, 'capture')",
                &[&pi2.id, &sealed],
            )
            .await
            .expect("open");
            let envelope: Vec<u8> = sp
                .query_one(
                    "SELECT privmatch.paillier_pi2_round2($1, $2)",
                    &[&pi2.id, &sealed],
                )
                .await
                .expect("round 2")
                .get(0);
            let round2 = SignedRound2::open(
                &envelope,
                client.service_key(),
                &pi2.id,
                Protocol::Pi2,
                &session,
                unix_now(),
            )
            .expect("signed");
            let round3 = device.session().round3_signed(&round2).expect("round 3");
            let bytes = DeviceReply {
                reply_key: ReplySecret::generate(&mut rand::thread_rng()).public_key(),
                message: round3,
            }
            .to_bytes();
            let signature = signer
                .sign(&Statement::reply_message(&pi2.id, &session, 3, &bytes))
                .expect("sign");
            posted.push((bytes, signature));
        }
        const ROUND4: &str =
            "SELECT message, verdict FROM privmatch.paillier_pi2_round4($1, $2, $3)";
        let (a, b) = (sessions[0].as_slice(), sessions[1].as_slice());
        // Session A's Round 3, with the device's signature for A, relayed into B.
        match sp
            .query_one(ROUND4, &[&b, &posted[0].0, &posted[0].1])
            .await
        {
            Err(e) => {
                let (code, message) = sqlstate_and_message(&e);
                assert_eq!(code, "28000", "{message}");
                assert!(message.contains("not signed by device"), "{message}");
            }
            Ok(_) => panic!("a Round 3 spliced from another session was accepted"),
        }
        // Re-signed by nobody: the coordinator's own signature bytes for B.
        let forged = vec![7u8; posted[0].1.len()];
        assert!(sp
            .query_one(ROUND4, &[&b, &posted[1].0, &forged])
            .await
            .is_err());
        // Both sessions are intact: each runs with its own Round 3.
        let row_a = sp
            .query_one(ROUND4, &[&a, &posted[0].0, &posted[0].1])
            .await
            .expect("A's Round 4");
        let row_b = sp
            .query_one(ROUND4, &[&b, &posted[1].0, &posted[1].1])
            .await
            .expect("B's Round 4");
        let (round4_a, round4_b): (Vec<u8>, Vec<u8>) = (row_a.get(0), row_b.get(0));
        // The device in session B given A's signed Round 4 refuses it.
        let moved = SignedRound4::open(
            &round4_a,
            client.service_key(),
            &pi2.id,
            Protocol::Pi2,
            &sessions[1],
            &posted[1].0,
        );
        assert!(
            format!("{:?}", moved.expect_err("spliced Round 4")).contains("another"),
            "refused as another session's"
        );
        SignedRound4::open(
            &round4_b,
            client.service_key(),
            &pi2.id,
            Protocol::Pi2,
            &sessions[1],
            &posted[1].0,
        )
        .expect("B's own Round 4");
    });

    // ---- 3. A signed Round 2 replayed to the device: answered once, also across a
    // restart. ----
    let pi1 = &devs[0];
    cluster.block_on(async {
        let mut rng = ChaCha20Rng::seed_from_u64(932);
        let mut client = PaillierClient::new(&config).expect("client");
        let record = pi1.record(&client);
        let responder = Responder::new(pi1.secret(), &record).expect("device");
        let signer = pi1.signer();
        let device = DeviceRef {
            id: &pi1.id,
            signer: &signer,
        };
        let file = answered_path(&pi1.key, &pi1.id);
        let theta = Quantizer::new(&params(Protocol::Pi1))
            .and_then(|q| q.quantize_threshold(THRESHOLD))
            .expect("θ");
        let session = client
            .open(&pi1.id, Protocol::Pi1, pi1.u.clone(), theta)
            .await
            .expect("open");
        let taken: Vec<DeviceMessage> = client
            .mailbox(&pi1.id, &signer, 10_000, 1)
            .await
            .expect("mailbox");
        assert_eq!(taken.len(), 1);
        let mut answered = Answered::load(&file).expect("memory");
        serve(
            &client,
            &device,
            &responder,
            &taken[0],
            &mut answered,
            &mut rng,
        )
        .await
        .expect("answered once");
        let view = client
            .verified_outcome(
                &session,
                &pi1.id,
                Protocol::Pi1,
                &record.record.public_key,
                Duration::from_secs(10),
            )
            .await
            .expect("outcome");
        assert_eq!(view.state, SessionState::Match);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).expect("kept").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the answered sessions are private");
        for (what, memory) in [
            ("the same process", &mut answered),
            (
                "after a restart",
                &mut Answered::load(&file).expect("memory"),
            ),
        ] {
            let err = serve(&client, &device, &responder, &taken[0], memory, &mut rng)
                .await
                .expect_err(what);
            assert!(
                format!("{err:#}").contains("answered already"),
                "{what}: {err:#}"
            );
        }
        // Without the memory (a device of 0.11.0) the same Round 2 would be decrypted and
        // answered again: the refusal above is the memory's.
        assert!(
            SignedRound2::open(
                &from_base64(&taken[0].message, "r2").expect("b64"),
                client.service_key(),
                &pi1.id,
                Protocol::Pi1,
                &session_from_hex(&taken[0].session, "s").expect("hex"),
                unix_now(),
            )
            .is_ok(),
            "the replayed Round 2 is validly signed and unexpired"
        );
    });

    // ---- 4. A lost device: unsigned and forged deletions refused, the operator's signed
    // command through the CLI accepted, the same command replayed refused. ----
    let pi3 = &devs[2];
    let (status, answer) = cluster.post_bytes(
        "/v1/paillier/delete",
        json!({"device": pi3.id}).to_string().into_bytes(),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("signature"), "{answer}");
    let (status, answer) = cluster.post_bytes(
        "/v1/paillier/delete",
        json!({"device": pi3.id, "signature": to_base64(&[5u8; 256])})
            .to_string()
            .into_bytes(),
    );
    assert!(status >= 400, "{answer}");
    assert_eq!(answer["sqlstate"], "28000", "{answer}");
    let unsigned = cluster.cli(&["device", "delete", "--device", &pi3.id]);
    assert_ne!(unsigned.code, Some(0), "{unsigned}");
    let listed = |cluster: &Cluster| -> Vec<String> {
        let out = cluster.cli(&["device", "list"]).expect_success();
        let v: Value = serde_json::from_str(&out.stdout).expect("json");
        v["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["device"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert!(listed(&cluster).contains(&pi3.id), "still enrolled");
    let operator_key = cluster.home.join("operators/p0.signing.key");
    let deleted = cluster
        .cli(&[
            "device",
            "delete",
            "--device",
            &pi3.id,
            "--operator-key",
            &path_arg(&operator_key),
        ])
        .expect_success();
    assert!(deleted.stdout.contains("\"deleted\":true"), "{deleted}");
    assert!(!listed(&cluster).contains(&pi3.id), "deleted");
    // A command signed once and relayed twice: the second time the SP refuses it.
    let operator = privmatch_coordinator::cli::operator_key::load(&operator_key).expect("key");
    let command = operator.sign(
        PartyIndex::ALL[0],
        privmatch_coordinator::cli::operator_key::fresh_counter(),
        "paillier-delete",
        pi2.id.as_bytes(),
    );
    let body = json!({"device": pi2.id, "command": to_base64(&command)}).to_string();
    let (status, answer) = cluster.post_bytes("/v1/paillier/delete", body.clone().into_bytes());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["deleted"], true, "{answer}");
    let (status, answer) = cluster.post_bytes("/v1/paillier/delete", body.into_bytes());
    assert!(status >= 400, "{answer}");
    assert_eq!(answer["sqlstate"], "28000", "a replayed command: {answer}");
}
