//! End-to-end tests of the packed Paillier service provider over SQL (Game-Set-MATCH,
//! Agrawal et al., CCS 2020): P0 of a real three-party deployment is the SP. The device side
//! runs here with core's state machines (`DeviceEnrolment`, `Pi1Device`, `Pi2Device`,
//! `Pi3Device`), the SP side through the coordinator's login role, as the coordinator will
//! relay it: enrolment end to end with the SP's signature verified by the device, refused
//! requests and proofs that store nothing, a duplicate device (23505), fetch, delete, Π1's
//! Round 2 computed at the SP from the terminal's sealed input, against the plaintext inner
//! product; and Π2 and Π3 with the terminal's rounds at the SP (its secrets kept in
//! `paillier_sessions` between the calls) against the plaintext comparison, cheating devices
//! (valid = false, the session consumed), replayed, unknown, expired and misdirected sessions.

use std::cell::RefCell;
use std::collections::HashMap;

use ed25519_dalek::VerifyingKey;
use privmatch_core::crypto::seal::PartyPublicKey;
use privmatch_core::paillier::cipher::SecretKey;
use privmatch_core::paillier::device_signature::{DeviceSigner, Statement};
use privmatch_core::paillier::enroll::DeviceEnrolment;
use privmatch_core::paillier::garble::Label;
use privmatch_core::paillier::key_proof::RingPedersenParams;
use privmatch_core::paillier::params::{Params, Protocol, DEFAULT_STAT_BITS};
use privmatch_core::paillier::pi1::Pi1Device;
use privmatch_core::paillier::pi2::{Pi2Device, Pi2Round3, Pi2Round4};
use privmatch_core::paillier::pi3::{Pi3Device, Pi3Round5};
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::sealed::{
    DeviceOutcome, DeviceReply, Outcome, Purpose, ReplySecret, TerminalVerdict,
};
use privmatch_core::paillier::signed_round2::{SignedRound2, SignedRound4, VerifiedRound2};
use privmatch_core::paillier::terminal::TerminalInput;
use privmatch_core::paillier::verdict::Verdict;
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{
    assert_pool_threads_block_signals, contains, sqlstate_and_message, wal_bytes, Cluster,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio_postgres::Client;

const DIM: usize = 8;
const BITS: u32 = 8;
const NOW_SLACK: i64 = 60;

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

fn template(rng: &mut ChaCha20Rng) -> Vec<i32> {
    (0..DIM).map(|_| rng.gen_range(-128..128)).collect()
}

fn dot(u: &[i32], w: &[i32]) -> i64 {
    u.iter()
        .zip(w)
        .map(|(&a, &b)| i64::from(a) * i64::from(b))
        .sum()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

fn clone_key(sk: &SecretKey) -> SecretKey {
    let (p, q) = sk.primes();
    SecretKey::from_primes(p.clone(), q.clone()).expect("key")
}

/// `sql` with `args` at `client`: the first column of the first row, or (SQLSTATE, message).
async fn call(
    client: &Client,
    sql: &str,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Option<Vec<u8>>, (String, String)> {
    client
        .query_one(sql, args)
        .await
        .map(|row| row.get(0))
        .map_err(|e| sqlstate_and_message(&e))
}

fn expect_code<T: std::fmt::Debug>(got: Result<T, (String, String)>, code: &str, what: &str) {
    match got {
        Ok(v) => panic!("{what}: accepted ({v:?})"),
        Err((c, m)) => assert_eq!(c, code, "{what}: {m}"),
    }
}

/// The coordinator's two calls of a Round 2 at the SP: the session opened (policy, budgets;
/// its own transaction), then `round2_sql` (the SP's signed Round 2). The first error, if any.
async fn round2_at(
    sp: &Client,
    round2_sql: &str,
    device: &str,
    sealed: &[u8],
) -> Result<Vec<u8>, (String, String)> {
    sp.query_one(
        "SELECT privmatch.paillier_session_open($1, $2, 'terminal-1')",
        &[&device, &sealed],
    )
    .await
    .map_err(|e| sqlstate_and_message(&e))?;
    call(sp, round2_sql, &[&device, &sealed])
        .await
        .map(|b| b.expect("a Round 2"))
}

/// The device's check of the SP's signed Round 2 (core's `SignedRound2::open`).
fn verified(
    envelope: &[u8],
    vk: &VerifyingKey,
    device: &str,
    protocol: Protocol,
    session: &[u8; 16],
) -> VerifiedRound2 {
    SignedRound2::open(envelope, vk, device, protocol, session, now())
        .expect("the SP's signed Round 2")
}

/// The SP's operator sets `protocol`'s policy: `threshold` and the hourly budgets.
async fn set_policy(
    operator: &Client,
    protocol: &str,
    threshold: i64,
    per_device: i32,
    per_terminal: i32,
) {
    operator
        .query_one(
            "SELECT privmatch.paillier_set_policy($1, $2, $3, $4)",
            &[&protocol, &threshold, &per_device, &per_terminal],
        )
        .await
        .expect("set the policy");
}

const BEGIN: &str = "SELECT privmatch.paillier_enroll_begin($1, $2, $3)";
const FINISH: &str = "SELECT privmatch.paillier_enroll_finish($1, $2)";
const DELETE: &str = "SELECT privmatch.paillier_delete($1, $2)";

/// The SP's operator at P0 makes it the service provider (1024-bit ring-Pedersen parameters
/// keep the tests fast; idempotent) and sets the parameters of `protocols`; returns the key
/// that verifies σ and the ring-Pedersen parameters, as `paillier_service_info` gives them.
fn init_service_provider(
    cluster: &Cluster,
    protocols: &[Protocol],
) -> (VerifyingKey, RingPedersenParams) {
    let signing: String =
        cluster.query(0, "SELECT privmatch.paillier_init_service(1024)", &[])[0].get(0);
    let again: String =
        cluster.query(0, "SELECT privmatch.paillier_init_service(1024)", &[])[0].get(0);
    assert_eq!(signing, again, "idempotent");
    for &protocol in protocols {
        cluster.query(
            0,
            "SELECT privmatch.paillier_set_params($1, 30)",
            &[&params(protocol).to_bytes()],
        );
    }
    let info = cluster.query(
        0,
        "SELECT party_index, signing_key, ring_pedersen FROM privmatch.paillier_service_info()",
        &[],
    );
    assert_eq!(info[0].get::<_, i32>(0), 0);
    let vk_bytes: Vec<u8> = info[0].get(1);
    assert_eq!(hex::encode(&vk_bytes), signing);
    let vk =
        VerifyingKey::from_bytes(&vk_bytes.try_into().expect("32 bytes")).expect("Ed25519 key");
    let aux = RingPedersenParams::from_bytes(&info[0].get::<_, Vec<u8>>(2)).expect("aux");
    (vk, aux)
}

#[test]
fn devices_enrol_match_and_are_deleted_at_the_service_provider() {
    let cluster = Cluster::start("paillier-sql", 60);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(60);
    let (vk, aux) = init_service_provider(&cluster, &[Protocol::Pi1, Protocol::Pi2]);

    let secret = SecretKey::generate(2048, &mut rng).expect("device key");
    let p2 = params(Protocol::Pi2);
    let u = template(&mut rng);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let sp = &clients[0];
        // The SP's operator, who may read the tables.
        let operator = cluster.connect(0).await;
        let count = |table: &str| {
            let sql = format!("SELECT count(*) FROM privmatch.{table}");
            let operator = &operator;
            async move {
                let row = operator.query_one(&sql, &[]).await.expect("count");
                row.get::<_, i64>(0)
            }
        };

        // Π2 enrolment end to end; the device checks σ and that the packing decrypts to u.
        let (device, request) =
            DeviceEnrolment::start(&secret, &p2, "phone-1", &u, &aux, b"s1", &mut rng)
                .expect("request");
        let challenge = call(sp, BEGIN, &[&"phone-1", &request, &b"s1".as_slice()])
            .await
            .expect("begin")
            .expect("a Π2 challenge");
        assert_eq!(count("paillier_pending").await, 1);
        let response = device.respond(&challenge).expect("response");
        let record = call(sp, FINISH, &[&"phone-1", &Some(response)])
            .await
            .expect("finish")
            .expect("record");
        let signed = device
            .finish(&record, &vk, now())
            .expect("device accepts σ");
        assert_eq!(count("paillier_pending").await, 0);
        let fetched = call(sp, "SELECT privmatch.paillier_device($1)", &[&"phone-1"])
            .await
            .expect("fetch")
            .expect("bytes");
        assert_eq!(fetched, record);
        let stored = SignedTemplate::from_bytes(&fetched).expect("decodes");
        stored.verify(&vk, now()).expect("σ verifies");
        assert_eq!(stored, signed);
        assert!(stored.record.expires_at > now() + 29 * 86_400 - NOW_SLACK);
        let listed = sp
            .query(
                "SELECT device_id, protocol FROM privmatch.paillier_devices()",
                &[],
            )
            .await
            .expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].get::<_, String>(1), "pi2");

        // A duplicate device: 23505 at begin, naming the device.
        let (_, again) = DeviceEnrolment::start(&secret, &p2, "phone-1", &u, &aux, b"s2", &mut rng)
            .expect("request");
        match call(sp, BEGIN, &[&"phone-1", &again, &b"s2".as_slice()]).await {
            Err((code, message)) => {
                assert_eq!(code, "23505", "{message}");
                assert!(message.contains("phone-1"), "{message}");
            }
            Ok(v) => panic!("duplicate accepted: {v:?}"),
        }

        // Malformed and refused requests store nothing.
        expect_code(
            call(
                sp,
                BEGIN,
                &[&"phone-2", &b"junk".as_slice(), &b"s3".as_slice()],
            )
            .await,
            "22P03",
            "junk request",
        );
        let (_, good) = DeviceEnrolment::start(&secret, &p2, "phone-2", &u, &aux, b"s3", &mut rng)
            .expect("request");
        let mut forged = good.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        expect_code(
            call(sp, BEGIN, &[&"phone-2", &forged, &b"s3".as_slice()]).await,
            "08P01",
            "forged plaintext-knowledge proof",
        );
        expect_code(
            call(
                sp,
                BEGIN,
                &[&"phone-2", &good, &b"other session".as_slice()],
            )
            .await,
            "08P01",
            "proofs bound to another session",
        );
        expect_code(
            call(sp, BEGIN, &[&"phone-9", &good, &b"s3".as_slice()]).await,
            "22023",
            "request for another device id",
        );
        assert_eq!(count("paillier_pending").await, 0);

        // A wrong norm answer is refused and stores no device; unknown pending: P0002.
        let (device2, request2) =
            DeviceEnrolment::start(&secret, &p2, "phone-3", &u, &aux, b"s4", &mut rng)
                .expect("request");
        let challenge2 = call(sp, BEGIN, &[&"phone-3", &request2, &b"s4".as_slice()])
            .await
            .expect("begin")
            .expect("challenge");
        let right = device2.respond(&challenge2).expect("response");
        let mut wrong = right.clone();
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        // Refused as NULL (with a WARNING), not an ERROR, so that the refusal commits: the
        // challenge is single use, and the right answer afterwards finds nothing pending.
        assert_eq!(
            call(sp, FINISH, &[&"phone-3", &Some(wrong)]).await,
            Ok(None),
            "wrong norm response"
        );
        assert_eq!(count("paillier_pending").await, 0);
        expect_code(
            call(sp, FINISH, &[&"phone-3", &Some(right)]).await,
            "P0002",
            "a second answer to a refused challenge",
        );
        expect_code(
            call(sp, FINISH, &[&"phone-7", &None::<Vec<u8>>]).await,
            "P0002",
            "no pending enrolment",
        );
        assert_eq!(count("paillier_devices").await, 1);

        // Delete, signed by the device over its stored record: true; the record is gone
        // (P0002), and a second deletion finds nothing (P0002).
        let signer = DeviceSigner::new(&secret).expect("signer");
        let signature = signer
            .sign(&Statement::delete("phone-1", &fetched))
            .expect("sign");
        let row = sp
            .query_one(DELETE, &[&"phone-1", &signature])
            .await
            .expect("delete");
        assert!(row.get::<_, bool>(0));
        expect_code(
            call(sp, "SELECT privmatch.paillier_device($1)", &[&"phone-1"]).await,
            "P0002",
            "deleted device",
        );
        expect_code(
            call(sp, DELETE, &[&"phone-1", &signature]).await,
            "P0002",
            "deleted twice",
        );

        // Π1: the device packs and encrypts itself (no challenge); the terminal seals w and
        // its threshold to P0; the SP computes Round 2 on the stored record; the device's
        // Round 3 gives ⟨u, w⟩ and the bit.
        let p1 = params(Protocol::Pi1);
        let (device3, request3) =
            DeviceEnrolment::start(&secret, &p1, "phone-p1", &u, &aux, b"s5", &mut rng)
                .expect("request");
        let none = call(sp, BEGIN, &[&"phone-p1", &request3, &b"s5".as_slice()])
            .await
            .expect("begin");
        assert!(none.is_none(), "Π1 has no challenge");
        let record3 = call(sp, FINISH, &[&"phone-p1", &None::<Vec<u8>>])
            .await
            .expect("finish")
            .expect("record");
        let signed3 = device3.finish(&record3, &vk, now()).expect("σ");
        let pi1 = Pi1Device::from_encrypted(
            p1.clone(),
            clone_key(&secret),
            signed3.record.packed.clone(),
        )
        .expect("device");
        // No policy for Π1 yet: no session opens (55000).
        let (_, sealed) = sealed_input(&keys, Protocol::Pi1, "phone-p1", &u, 0, &mut rng);
        expect_code(
            round2_at(sp, PI1_ROUND2, "phone-p1", &sealed).await,
            "55000",
            "no policy",
        );
        for w in [template(&mut rng), u.clone()] {
            let ip = dot(&u, &w);
            for threshold in [ip, ip + 1] {
                // The threshold is the operator's policy, not the terminal's choice.
                set_policy(&operator, "pi1", threshold, 1000, 1000).await;
                let (session, sealed) =
                    sealed_input(&keys, Protocol::Pi1, "phone-p1", &w, threshold, &mut rng);
                let envelope = round2_at(sp, PI1_ROUND2, "phone-p1", &sealed)
                    .await
                    .expect("round 2");
                let round2 = verified(&envelope, &vk, "phone-p1", Protocol::Pi1, &session);
                assert_eq!(round2.threshold(), threshold);
                let (_, outcome) = pi1.round3_signed(&round2).expect("round 3");
                assert_eq!(outcome.inner_product, ip);
                assert_eq!(outcome.matched, threshold == ip);
            }
        }
        set_policy(&operator, "pi1", 0, 1000, 1000).await;
        // A terminal input sealed to P1, or for another device: refused.
        let input = TerminalInput {
            protocol: Protocol::Pi1,
            session: [9; 16],
            device_id: "phone-p1".into(),
            threshold: 0,
            reply_key: ReplySecret::generate(&mut rng).public_key(),
            w: u.clone(),
        };
        let to_p1 = input
            .seal(PartyIndex::ALL[1], &keys[1], &mut rng)
            .expect("seal");
        expect_code(
            round2_at(sp, PI1_ROUND2, "phone-p1", &to_p1).await,
            "08P01",
            "input sealed to P1",
        );
        let to_p0 = input
            .seal(PartyIndex::ALL[0], &keys[0], &mut rng)
            .expect("seal");
        expect_code(
            round2_at(sp, PI1_ROUND2, "phone-2", &to_p0).await,
            "22023",
            "input for another device",
        );
        // P1 is not the service provider.
        expect_code(
            call(
                &clients[1],
                "SELECT privmatch.paillier_device($1)",
                &[&"phone-p1"],
            )
            .await,
            "55000",
            "P1 is no service provider",
        );
    });
}

/// The coordinator's calls of Π1, Π2 and Π3 at the SP.
const PI1_ROUND2: &str = "SELECT privmatch.paillier_pi1_round2($1, $2)";
const PI2_ROUND2: &str = "SELECT privmatch.paillier_pi2_round2($1, $2)";
const PI2_ROUND4: &str = "SELECT message, verdict FROM privmatch.paillier_pi2_round4($1, $2, $3)";
const PI3_ROUND2: &str = "SELECT privmatch.paillier_pi3_round2($1, $2)";
const PI3_ROUND4: &str = "SELECT privmatch.paillier_pi3_round4($1, $2, $3)";
const PI3_FINISH: &str = "SELECT privmatch.paillier_pi3_finish($1, $2, $3)";

thread_local! {
    /// The terminal's side of each session this test opened ([`sealed_input`]): the device,
    /// and the reply key the verdict is sealed to.
    static TERMINALS: RefCell<HashMap<[u8; 16], (String, ReplySecret)>> =
        RefCell::new(HashMap::new());
}

/// The device of a session this test opened ("unknown" for one it made up).
fn device_of(session: &[u8; 16]) -> String {
    TERMINALS.with(|t| {
        t.borrow()
            .get(session)
            .map_or_else(|| "unknown".to_owned(), |(d, _)| d.clone())
    })
}

/// `session` as 16 bytes (zeros for a malformed one, which the SP refuses first).
fn session16(session: &[u8]) -> [u8; 16] {
    session.try_into().unwrap_or([0u8; 16])
}

/// The device's signature (key `secret`) of its `message` of `round` in `session`.
fn device_signature(secret: &SecretKey, session: &[u8; 16], round: u8, message: &[u8]) -> Vec<u8> {
    DeviceSigner::new(secret)
        .expect("signer")
        .sign(&Statement::reply_message(
            &device_of(session),
            session,
            round,
            message,
        ))
        .expect("sign")
}

/// The terminal opens a sealed verdict of `protocol` for `session` and believes it only
/// signed (core's `TerminalVerdict`): (matched, valid, the signature inside).
fn open_verdict(
    vk: &VerifyingKey,
    secret: &SecretKey,
    protocol: Protocol,
    session: &[u8; 16],
    sealed: &[u8],
) -> (bool, bool, Vec<u8>) {
    let device = device_of(session);
    let verdict = TERMINALS.with(|t| {
        let t = t.borrow();
        let (_, reply) = t.get(session).expect("a session this test opened");
        TerminalVerdict::open(reply, sealed, session).expect("sealed to the terminal")
    });
    let outcome = verdict
        .check(protocol, &device, vk, secret.public_key())
        .expect("signed");
    (
        outcome == Outcome::Match,
        outcome != Outcome::Refused,
        verdict.signature,
    )
}

/// Π2 Round 4 at the SP as the coordinator relays it: the device's `round3` posted with a
/// fresh reply key (core's `DeviceReply`) and its signature (key `secret`); the Round 4 and
/// the verdict opened as the device and the terminal do. (The bit for the device as
/// `Pi2Round4` bytes, None when refused; matched; valid; the SP's signature of the verdict),
/// or (SQLSTATE, message).
async fn pi2_round4(
    sp: &Client,
    secret: &SecretKey,
    vk: &VerifyingKey,
    session: &[u8],
    round3: &[u8],
) -> Result<(Option<Vec<u8>>, bool, bool, Vec<u8>), (String, String)> {
    let id = session16(session);
    let reply = ReplySecret::generate(&mut rand::thread_rng());
    let posted = DeviceReply {
        reply_key: reply.public_key(),
        message: round3.to_vec(),
    }
    .to_bytes();
    let signature = device_signature(secret, &id, 3, &posted);
    let (message, verdict): (Vec<u8>, Vec<u8>) = sp
        .query_one(PI2_ROUND4, &[&session, &posted, &signature])
        .await
        .map(|row| (row.get(0), row.get(1)))
        .map_err(|e| sqlstate_and_message(&e))?;
    let sealed = SignedRound4::open(&message, vk, &device_of(&id), Protocol::Pi2, &id, &posted)
        .expect("the SP's signed Round 4");
    let told = DeviceOutcome::from_bytes(
        &reply
            .open(Purpose::DeviceRound4, &id, &sealed)
            .expect("sealed to the device"),
    )
    .expect("decodes");
    let (matched, valid, signature) = open_verdict(vk, secret, Protocol::Pi2, &id, &verdict);
    assert_eq!(told, DeviceOutcome(Outcome::of(matched, valid)));
    let bit = valid.then(|| Pi2Round4 { matched }.to_bytes());
    Ok((bit, matched, valid, signature))
}

/// Π3 Round 4 at the SP as the coordinator relays it (as [`pi2_round4`]): the opened
/// `Pi3Round4` for the device, or (SQLSTATE, message).
async fn pi3_round4(
    sp: &Client,
    secret: &SecretKey,
    vk: &VerifyingKey,
    session: &[u8],
    round3: &[u8],
) -> Result<Option<Vec<u8>>, (String, String)> {
    let id = session16(session);
    let reply = ReplySecret::generate(&mut rand::thread_rng());
    let posted = DeviceReply {
        reply_key: reply.public_key(),
        message: round3.to_vec(),
    }
    .to_bytes();
    let signature = device_signature(secret, &id, 3, &posted);
    let message: Vec<u8> = call(sp, PI3_ROUND4, &[&session, &posted, &signature])
        .await?
        .expect("bytes");
    let sealed = SignedRound4::open(&message, vk, &device_of(&id), Protocol::Pi3, &id, &posted)
        .expect("the SP's signed Round 4");
    Ok(Some(
        reply
            .open(Purpose::DeviceRound4, &id, &sealed)
            .expect("sealed to the device")
            .to_vec(),
    ))
}

/// Π3's output at the SP: the device's signed `round5`; the verdict opened as the terminal
/// does: (matched, valid, the SP's signature of the verdict), or (SQLSTATE, message).
async fn pi3_finish(
    sp: &Client,
    secret: &SecretKey,
    vk: &VerifyingKey,
    session: &[u8],
    round5: &[u8],
) -> Result<(bool, bool, Vec<u8>), (String, String)> {
    let id = session16(session);
    let signature = device_signature(secret, &id, 5, round5);
    let verdict = call(sp, PI3_FINISH, &[&session, &round5, &signature])
        .await?
        .expect("bytes");
    Ok(open_verdict(vk, secret, Protocol::Pi3, &id, &verdict))
}

/// Checks the SP's signature of a session's verdict (what the terminal checks): it verifies
/// for exactly this outcome, and not for the opposite decision.
fn assert_signed(
    vk: &VerifyingKey,
    protocol: Protocol,
    session: &[u8; 16],
    device_id: &str,
    (matched, valid): (bool, bool),
    signature: &[u8],
) {
    let verdict = Verdict {
        protocol,
        session: *session,
        device_id,
        matched,
        valid,
    };
    verdict
        .verify(vk, signature)
        .expect("the SP's signed verdict");
    let flipped = Verdict {
        matched: !matched,
        ..verdict.clone()
    };
    assert!(
        flipped.verify(vk, signature).is_err(),
        "the opposite verdict verifies"
    );
}

/// The terminal's input for `device` sealed to P0, with a fresh random session id.
fn sealed_input(
    keys: &[PartyPublicKey; 3],
    protocol: Protocol,
    device: &str,
    w: &[i32],
    threshold: i64,
    rng: &mut ChaCha20Rng,
) -> ([u8; 16], Vec<u8>) {
    let session: [u8; 16] = rng.gen();
    let reply = ReplySecret::generate(rng);
    let input = TerminalInput {
        protocol,
        session,
        device_id: device.into(),
        threshold,
        reply_key: reply.public_key(),
        w: w.to_vec(),
    };
    TERMINALS.with(|t| t.borrow_mut().insert(session, (device.to_owned(), reply)));
    let sealed = input.seal(PartyIndex::ALL[0], &keys[0], rng).expect("seal");
    (session, sealed)
}

/// Captures to match against template `u`: u itself and four random ones, each with the
/// thresholds IP, IP + 1 and IP − 1: (w, IP, threshold).
fn captures(u: &[i32], rng: &mut ChaCha20Rng) -> Vec<(Vec<i32>, i64, i64)> {
    let mut out = Vec::new();
    for k in 0..5 {
        let w = if k == 0 { u.to_vec() } else { template(rng) };
        let ip = dot(u, &w);
        for threshold in [ip, ip + 1, ip - 1] {
            out.push((w.clone(), ip, threshold));
        }
    }
    out
}

/// Enrols `device` for `protocol` through the SP (begin, norm answer, finish) and returns the
/// record the device accepted.
#[allow(clippy::too_many_arguments)]
async fn enrol(
    sp: &Client,
    secret: &SecretKey,
    protocol: Protocol,
    device: &str,
    u: &[i32],
    aux: &RingPedersenParams,
    vk: &VerifyingKey,
    rng: &mut ChaCha20Rng,
) -> SignedTemplate {
    let p = params(protocol);
    let session = device.as_bytes();
    let (state, request) =
        DeviceEnrolment::start(secret, &p, device, u, aux, session, rng).expect("request");
    let challenge = call(sp, BEGIN, &[&device, &request, &session])
        .await
        .expect("begin")
        .expect("challenge");
    let response = state.respond(&challenge).expect("response");
    let record = call(sp, FINISH, &[&device, &Some(response)])
        .await
        .expect("finish")
        .expect("record");
    state.finish(&record, vk, now()).expect("σ")
}

#[test]
fn pi2_and_pi3_run_at_the_service_provider_and_catch_cheating_devices() {
    let cluster = Cluster::start("paillier-sql-malicious", 64);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(64);
    let (vk, aux) = init_service_provider(&cluster, &[Protocol::Pi2, Protocol::Pi3]);
    let secret = SecretKey::generate(2048, &mut rng).expect("device key");
    let (p2, p3) = (params(Protocol::Pi2), params(Protocol::Pi3));
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let sp = &clients[0];
        let operator = cluster.connect(0).await;
        let sessions = || {
            let operator = &operator;
            async move {
                let row = operator
                    .query_one("SELECT count(*) FROM privmatch.paillier_sessions", &[])
                    .await
                    .expect("count");
                row.get::<_, i64>(0)
            }
        };

        // Two devices per protocol; for each, captures whose inner product is the threshold,
        // one above and one below it, against the plaintext comparison.
        let mut pi2_devices = Vec::new();
        let mut pi3_devices = Vec::new();
        for i in 0..2 {
            let u = template(&mut rng);
            let id = format!("phone-pi2-{i}");
            let signed = enrol(sp, &secret, Protocol::Pi2, &id, &u, &aux, &vk, &mut rng).await;
            if i == 0 {
                // The proofs ran on the core's pool in this backend (on a machine with more
                // than one CPU: `privmatch.paillier_threads` is 0, one per CPU), started from
                // its main thread: the pool's threads must still block PostgreSQL's signals.
                let backend: i32 = sp
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await
                    .expect("pid")
                    .get(0);
                let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
                assert_pool_threads_block_signals(backend, cpus > 1);
            }
            let device = Pi2Device::new(
                p2.clone(),
                clone_key(&secret),
                signed.record.packed.clone(),
                signed.round1_signature(),
            )
            .expect("Π2 device");
            pi2_devices.push((id, u, device));
            let u = template(&mut rng);
            let id = format!("phone-pi3-{i}");
            let signed = enrol(sp, &secret, Protocol::Pi3, &id, &u, &aux, &vk, &mut rng).await;
            let device = Pi3Device::new(
                p3.clone(),
                clone_key(&secret),
                signed.record.packed.clone(),
                signed.round1_signature(),
            )
            .expect("Π3 device");
            pi3_devices.push((id, u, device));
        }
        let mut runs = 0;
        for (id, u, device) in &pi2_devices {
            for (w, ip, threshold) in captures(u, &mut rng) {
                set_policy(&operator, "pi2", threshold, 1000, 1000).await;
                let (session, sealed) =
                    sealed_input(&keys, Protocol::Pi2, id, &w, threshold, &mut rng);
                let envelope = round2_at(sp, PI2_ROUND2, id, &sealed)
                    .await
                    .expect("Π2 round 2");
                let round2 = verified(&envelope, &vk, id, Protocol::Pi2, &session);
                assert_eq!(sessions().await, 1);
                let mut s = device.session();
                let round3 = s.round3_signed(&round2).expect("round 3");
                let (message, matched, valid, verdict) =
                    pi2_round4(sp, &secret, &vk, &session, &round3)
                        .await
                        .expect("Π2 round 4");
                assert!(valid);
                assert_signed(&vk, Protocol::Pi2, &session, id, (matched, valid), &verdict);
                assert_eq!(matched, ip >= threshold, "IP {ip}, threshold {threshold}");
                let bit = s.finish(&message.expect("the bit")).expect("round 4");
                assert_eq!(bit, matched);
                assert_eq!(sessions().await, 0, "consumed");
                runs += 1;
            }
        }
        for (id, u, device) in &pi3_devices {
            for (w, ip, threshold) in captures(u, &mut rng) {
                set_policy(&operator, "pi3", threshold, 1000, 1000).await;
                let (session, sealed) =
                    sealed_input(&keys, Protocol::Pi3, id, &w, threshold, &mut rng);
                let envelope = round2_at(sp, PI3_ROUND2, id, &sealed)
                    .await
                    .expect("Π3 round 2");
                let round2 = verified(&envelope, &vk, id, Protocol::Pi3, &session);
                let mut s = device.session();
                let round3 = s.round3_signed(&round2, &mut rng).expect("round 3");
                let round4 = pi3_round4(sp, &secret, &vk, &session, &round3)
                    .await
                    .expect("Π3 round 4")
                    .expect("bytes");
                assert_eq!(sessions().await, 1);
                let (round5, device_bit) = s.round5(&round4).expect("round 5");
                let (matched, valid, verdict) = pi3_finish(sp, &secret, &vk, &session, &round5)
                    .await
                    .expect("Π3 output");
                assert!(valid);
                assert_signed(&vk, Protocol::Pi3, &session, id, (matched, valid), &verdict);
                assert_eq!(matched, ip >= threshold, "IP {ip}, threshold {threshold}");
                assert_eq!(device_bit, matched);
                assert_eq!(sessions().await, 0, "consumed");
                runs += 1;
            }
        }
        assert_eq!(runs, 60);
        set_policy(&operator, "pi2", 0, 1000, 1000).await;
        set_policy(&operator, "pi3", 0, 1000, 1000).await;

        // Π2: a device that shifts X is refused (valid = false, no message) and the session is
        // gone: the honest X cannot follow (P0002). A Round 3 that does not decode first:
        // 22P03, the session untouched.
        let (id2, u2, device2) = &pi2_devices[0];
        let (session, sealed) = sealed_input(&keys, Protocol::Pi2, id2, u2, 0, &mut rng);
        let round2 = verified(
            &round2_at(sp, PI2_ROUND2, id2, &sealed)
                .await
                .expect("round 2"),
            &vk,
            id2,
            Protocol::Pi2,
            &session,
        );
        let round3 = device2.session().round3_signed(&round2).expect("round 3");
        expect_code(
            pi2_round4(sp, &secret, &vk, &session, &round3[..round3.len() - 1]).await,
            "22P03",
            "truncated Round 3",
        );
        assert_eq!(sessions().await, 1, "a malformed Round 3 changes nothing");
        let x = Pi2Round3::from_bytes(&p2, &round3).expect("X").x;
        let shifted = Pi2Round3 { x: x + 1u32 }.to_bytes(&p2);
        let refused = pi2_round4(sp, &secret, &vk, &session, &shifted)
            .await
            .expect("answered");
        assert_eq!(
            (refused.0.clone(), refused.1, refused.2),
            (None, false, false)
        );
        assert_signed(
            &vk,
            Protocol::Pi2,
            &session,
            id2,
            (false, false),
            &refused.3,
        );
        assert_eq!(sessions().await, 0, "a refused X consumes the session");
        expect_code(
            pi2_round4(sp, &secret, &vk, &session, &round3).await,
            "P0002",
            "the honest X after a refused one",
        );
        // The same sealed input twice: the session id is in use (23505); after the session
        // ends, the replayed Round 3 finds none (P0002).
        let (session, sealed) = sealed_input(&keys, Protocol::Pi2, id2, u2, 0, &mut rng);
        let round2 = verified(
            &round2_at(sp, PI2_ROUND2, id2, &sealed)
                .await
                .expect("round 2"),
            &vk,
            id2,
            Protocol::Pi2,
            &session,
        );
        expect_code(
            round2_at(sp, PI2_ROUND2, id2, &sealed).await,
            "23505",
            "a session id in use",
        );
        expect_code(
            call(sp, PI2_ROUND2, &[id2, &sealed]).await,
            "23505",
            "a second Round 2 for an opened session",
        );
        let state_in_wal = || async {
            let row = operator
                .query_one("SELECT state FROM privmatch.paillier_sessions", &[])
                .await
                .expect("the session's state");
            operator
                .execute("CHECKPOINT", &[])
                .await
                .expect("checkpoint");
            let state: Vec<u8> = row.get(0);
            contains(&wal_bytes(&cluster.home.join("p0/data")), &state)
        };
        assert!(!state_in_wal().await, "Π2 session secrets in the WAL");
        let round3 = device2.session().round3_signed(&round2).expect("round 3");
        let (_, matched, valid, _) = pi2_round4(sp, &secret, &vk, &session, &round3)
            .await
            .expect("round 4");
        assert!(valid && matched);
        expect_code(
            pi2_round4(sp, &secret, &vk, &session, &round3).await,
            "P0002",
            "replayed Round 3",
        );
        expect_code(
            pi2_round4(sp, &secret, &vk, &[7u8; 16], &round3).await,
            "P0002",
            "unknown session",
        );
        expect_code(
            pi2_round4(sp, &secret, &vk, &[7u8; 15], &round3).await,
            "22023",
            "a session id of 15 bytes",
        );

        // Π3: a wrong output label is refused (valid = false) and consumes the session.
        let (id3, u3, device3) = &pi3_devices[0];
        let (session, sealed) = sealed_input(&keys, Protocol::Pi3, id3, u3, 0, &mut rng);
        let round2 = verified(
            &round2_at(sp, PI3_ROUND2, id3, &sealed)
                .await
                .expect("round 2"),
            &vk,
            id3,
            Protocol::Pi3,
            &session,
        );
        let mut s = device3.session();
        let round3 = s.round3_signed(&round2, &mut rng).expect("round 3");
        expect_code(
            pi3_finish(sp, &secret, &vk, &session, &[1, 0x38]).await,
            "P0002",
            "output before Round 4",
        );
        expect_code(
            pi3_round4(sp, &secret, &vk, &session, &round3[..40]).await,
            "22P03",
            "truncated Round 3",
        );
        let round4 = pi3_round4(sp, &secret, &vk, &session, &round3)
            .await
            .expect("round 4")
            .expect("bytes");
        expect_code(
            pi3_round4(sp, &secret, &vk, &session, &round3).await,
            "P0002",
            "Round 4 again",
        );
        assert!(!state_in_wal().await, "Π3 output labels in the WAL");
        let (round5, _) = s.round5(&round4).expect("round 5");
        expect_code(
            pi3_finish(sp, &secret, &vk, &session, &round5[..round5.len() - 1]).await,
            "22P03",
            "truncated Round 5",
        );
        assert_eq!(sessions().await, 1, "a malformed Round 5 changes nothing");
        let mut forged = Pi3Round5::from_bytes(&round5).expect("labels");
        forged.labels[1] = Label::from_bytes([0x5a; 16]);
        let refused = pi3_finish(sp, &secret, &vk, &session, &forged.to_bytes())
            .await
            .expect("answered");
        assert_eq!((refused.0, refused.1), (false, false));
        assert_signed(
            &vk,
            Protocol::Pi3,
            &session,
            id3,
            (false, false),
            &refused.2,
        );
        assert_eq!(sessions().await, 0, "a refused label consumes the session");
        expect_code(
            pi3_finish(sp, &secret, &vk, &session, &round5).await,
            "P0002",
            "the honest labels after a refused one",
        );
        expect_code(
            pi2_round4(sp, &secret, &vk, &session, &round3).await,
            "P0002",
            "a Π3 session id at Π2",
        );

        // Wrong protocol: a Π3 input at Π2's function, a Π2 input for a Π3 device.
        let (_, sealed) = sealed_input(&keys, Protocol::Pi3, id3, u3, 0, &mut rng);
        expect_code(
            round2_at(sp, PI2_ROUND2, id3, &sealed).await,
            "22023",
            "a Π3 input at paillier_pi2_round2",
        );
        let (_, sealed) = sealed_input(&keys, Protocol::Pi2, id3, u3, 0, &mut rng);
        expect_code(
            round2_at(sp, PI2_ROUND2, id3, &sealed).await,
            "22023",
            "a Π2 input for a Π3 device",
        );
        let (_, sealed) = sealed_input(&keys, Protocol::Pi3, id2, u2, 0, &mut rng);
        expect_code(
            round2_at(sp, PI3_ROUND2, id3, &sealed).await,
            "22023",
            "an input for another device",
        );
        assert_eq!(sessions().await, 0);

        // An expired session (its Round 2 made 11 minutes old by the operator): P0002, and
        // the next Round 2 sweeps it.
        let (session, sealed) = sealed_input(&keys, Protocol::Pi2, id2, u2, 0, &mut rng);
        let round2 = verified(
            &round2_at(sp, PI2_ROUND2, id2, &sealed)
                .await
                .expect("round 2"),
            &vk,
            id2,
            Protocol::Pi2,
            &session,
        );
        operator
            .execute(
                "UPDATE privmatch.paillier_sessions SET created_at = now() - interval '11 minutes'",
                &[],
            )
            .await
            .expect("age the session");
        let round3 = device2.session().round3_signed(&round2).expect("round 3");
        expect_code(
            pi2_round4(sp, &secret, &vk, &session, &round3).await,
            "P0002",
            "expired session",
        );
        let (_, sealed) = sealed_input(&keys, Protocol::Pi2, id2, u2, 0, &mut rng);
        round2_at(sp, PI2_ROUND2, id2, &sealed)
            .await
            .expect("round 2");
        assert_eq!(sessions().await, 1, "the expired session was swept");
        // Deleting the device (its signature over its record) ends its sessions.
        let record2 = call(sp, "SELECT privmatch.paillier_device($1)", &[id2])
            .await
            .expect("fetch")
            .expect("record");
        let signature = DeviceSigner::new(&secret)
            .expect("signer")
            .sign(&Statement::delete(id2, &record2))
            .expect("sign");
        let row = sp
            .query_one(DELETE, &[id2, &signature])
            .await
            .expect("delete");
        assert!(row.get::<_, bool>(0));
        assert_eq!(sessions().await, 0, "deleted with its device");

        // Only the SP runs them; the coordinator cannot read the sessions.
        let (_, sealed) = sealed_input(&keys, Protocol::Pi3, id3, u3, 0, &mut rng);
        expect_code(
            round2_at(&clients[1], PI3_ROUND2, id3, &sealed).await,
            "55000",
            "P1 is no service provider",
        );
        expect_code(
            call(sp, "SELECT state FROM privmatch.paillier_sessions", &[]).await,
            "42501",
            "the coordinator reads the sessions",
        );
    });
}

/// Issue 34 point 10 at the service provider, the coordinator played by this test as a relay
/// that calls the SP's functions with the coordinator's role and rewrites what it relays:
/// every forged Round 2 (its own under Π1/Π2/Π3, the SP's ciphertext beside a lowered
/// threshold, a session id it made up) is refused by the device (core's `SignedRound2::open`),
/// so no Round 3 and no verdict exists; a raised Π2 ciphertext is refused by the range check;
/// a Round 2 is given only for a session opened (and charged) in an earlier transaction; a
/// deletion (and so a re-enrolment) needs the device's key, or the operator's signed command;
/// a terminal cannot choose the threshold, and the per-device and per-terminal budgets stop a
/// bisection, across a crash of the SP. Against f21d1f1 each of these attacks succeeded (the
/// device decrypted any Round 2, deletion was unsigned, the terminal chose θ, no budget).
#[test]
fn relay_rewrites_deletions_and_bisection_are_refused_at_the_service_provider() {
    use privmatch_core::crypto::sign::OperatorSigningKey;
    use privmatch_core::paillier::messages::MatchError;
    use privmatch_core::paillier::pi1::Pi1Round2;
    use privmatch_core::paillier::pi2::Pi2Round2;
    use rug::Integer;

    let cluster = Cluster::start("paillier-sql-attacks", 68);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(68);
    let (vk, aux) = init_service_provider(&cluster, &[Protocol::Pi1, Protocol::Pi2, Protocol::Pi3]);
    let secret = SecretKey::generate(2048, &mut rng).expect("device key");
    let pk = secret.public_key().clone();
    let u = template(&mut rng);
    let impostor: Vec<i32> = u.iter().map(|x| -x).collect();
    let theta = dot(&u, &u) / 2;
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let sp = &clients[0];
        let operator = cluster.connect(0).await;
        for protocol in ["pi1", "pi2", "pi3"] {
            set_policy(&operator, protocol, theta, 1000, 1000).await;
        }
        // The relay's own key: whatever it signs, the device pinned the SP's.
        let relay_key = ed25519_dalek::SigningKey::from_bytes(&[99u8; 32]);
        let refused = |got: Result<VerifiedRound2, MatchError>, what: &str| match got {
            Err(MatchError::Unsigned(_)) => {}
            other => panic!("{what}: not refused as unsigned: {other:?}"),
        };
        let open = |envelope: &[u8], device: &str, protocol, session: &[u8; 16]| {
            SignedRound2::open(envelope, &vk, device, protocol, session, now())
        };

        // ---- Π1: the relay's own Round 2 (Enc(0), threshold −1) for an impostor. ----
        let p1 = params(Protocol::Pi1);
        let (d1, r1) = DeviceEnrolment::start(&secret, &p1, "phone-a", &u, &aux, b"a", &mut rng)
            .expect("request");
        call(sp, BEGIN, &[&"phone-a", &r1, &b"a".as_slice()])
            .await
            .expect("begin");
        let rec1 = call(sp, FINISH, &[&"phone-a", &None::<Vec<u8>>])
            .await
            .expect("finish")
            .expect("record");
        let s1 = d1.finish(&rec1, &vk, now()).expect("σ");
        let pi1 = Pi1Device::from_encrypted(p1.clone(), clone_key(&secret), s1.record.packed)
            .expect("device");
        let (session, sealed) =
            sealed_input(&keys, Protocol::Pi1, "phone-a", &impostor, theta, &mut rng);
        let envelope = round2_at(sp, PI1_ROUND2, "phone-a", &sealed)
            .await
            .expect("round 2");
        let own = Pi1Round2 {
            threshold: -1,
            ciphertext: pk.encrypt(&Integer::new(), &mut rng).expect("Enc(0)"),
        }
        .to_bytes(&pk);
        // What the device of f21d1f1 did with it: "match" for the impostor.
        assert!(pi1.round3(&own).expect("decrypted").1.matched);
        refused(
            open(&own, "phone-a", Protocol::Pi1, &session),
            "Π1 own Round 2",
        );
        let own_signed = SignedRound2 {
            protocol: Protocol::Pi1,
            session,
            device_id: "phone-a".into(),
            threshold: -1,
            expires_at: now() + 600,
            reply_key: [1u8; 32],
            payload: own,
        }
        .sign(&relay_key)
        .expect("sign");
        refused(
            open(&own_signed, "phone-a", Protocol::Pi1, &session),
            "Π1 relay-signed",
        );
        // The SP's ciphertext kept, the threshold beside it lowered to −1.
        let at = 2 + 1 + 16 + 1 + "phone-a".len() + 8 + 8 + 4 + 2;
        let mut lowered = envelope.clone();
        lowered[at..at + 8].copy_from_slice(&(-1i64).to_be_bytes());
        refused(
            open(&lowered, "phone-a", Protocol::Pi1, &session),
            "Π1 lowered threshold",
        );
        // The SP's Round 2 under a session id the relay made up.
        refused(
            open(&envelope, "phone-a", Protocol::Pi1, &[0xee; 16]),
            "made-up session",
        );
        // The honest one: answered, no match.
        let honest = open(&envelope, "phone-a", Protocol::Pi1, &session).expect("SP's");
        assert!(!pi1.round3_signed(&honest).expect("round 3").1.matched);

        // ---- Π2: a raised record ciphertext (template values on the diagonal). ----
        let signed2 = enrol(
            sp,
            &secret,
            Protocol::Pi2,
            "phone-b",
            &u,
            &aux,
            &vk,
            &mut rng,
        )
        .await;
        let p2 = params(Protocol::Pi2);
        let pi2 = Pi2Device::new(
            p2.clone(),
            clone_key(&secret),
            signed2.record.packed.clone(),
            signed2.round1_signature(),
        )
        .expect("Π2 device");
        let layout = p2.layout();
        let shift = layout.slot_bits() * layout.positions()[1];
        let raised = pk.mul_plain(&signed2.record.packed[0], &(Integer::from(1) << shift));
        let forged = Pi2Round2 { ciphertext: raised }.to_bytes(&pk);
        let (session, sealed) = sealed_input(&keys, Protocol::Pi2, "phone-b", &u, theta, &mut rng);
        let envelope = round2_at(sp, PI2_ROUND2, "phone-b", &sealed)
            .await
            .expect("round 2");
        refused(
            open(&forged, "phone-b", Protocol::Pi2, &session),
            "Π2 raised, bare",
        );
        let mut swapped = envelope[..2 + 1 + 16 + 1 + "phone-b".len() + 16 + 32].to_vec();
        swapped.extend_from_slice(&(forged.len() as u32).to_be_bytes());
        swapped.extend_from_slice(&forged);
        swapped.extend_from_slice(&envelope[envelope.len() - 64..]);
        refused(
            open(&swapped, "phone-b", Protocol::Pi2, &session),
            "Π2 raised under the SP's σ",
        );
        // The range check: the raised ciphertext's X would be u[1] itself; refused.
        assert!(matches!(
            pi2.session().round3(&forged),
            Err(MatchError::OutOfRange("X"))
        ));
        let honest = open(&envelope, "phone-b", Protocol::Pi2, &session).expect("SP's");
        let round3 = pi2.session().round3_signed(&honest).expect("round 3");
        let (_, matched, valid, _) = pi2_round4(sp, &secret, &vk, &session, &round3)
            .await
            .expect("round 4");
        assert!(valid && matched, "the genuine capture matches");

        // ---- Π3: the SP's ciphertexts with the threshold lowered; a Round 2 of Π2. ----
        let signed3 = enrol(
            sp,
            &secret,
            Protocol::Pi3,
            "phone-c",
            &u,
            &aux,
            &vk,
            &mut rng,
        )
        .await;
        let pi3 = Pi3Device::new(
            params(Protocol::Pi3),
            clone_key(&secret),
            signed3.record.packed.clone(),
            signed3.round1_signature(),
        )
        .expect("Π3 device");
        let (session, sealed) =
            sealed_input(&keys, Protocol::Pi3, "phone-c", &impostor, theta, &mut rng);
        let envelope = round2_at(sp, PI3_ROUND2, "phone-c", &sealed)
            .await
            .expect("round 2");
        let mut lowered = envelope.clone();
        let at = 2 + 1 + 16 + 1 + "phone-c".len();
        lowered[at..at + 8].copy_from_slice(&(-1i64).to_be_bytes());
        refused(
            open(&lowered, "phone-c", Protocol::Pi3, &session),
            "Π3 signed θ lowered",
        );
        // The payload's threshold is its last field (sign byte, u16 length, magnitude): make
        // it −θ under the SP's signature.
        let magnitude = (64 - theta.unsigned_abs().leading_zeros() as usize).div_ceil(8);
        let mut lowered = envelope.clone();
        lowered[envelope.len() - 64 - magnitude - 3] = 1;
        refused(
            open(&lowered, "phone-c", Protocol::Pi3, &session),
            "Π3 payload θ changed",
        );
        refused(
            open(&envelope, "phone-b", Protocol::Pi2, &session),
            "Π3 Round 2 as Π2",
        );
        let honest = open(&envelope, "phone-c", Protocol::Pi3, &session).expect("SP's");
        let mut s = pi3.session();
        let round3 = s.round3_signed(&honest, &mut rng).expect("round 3");
        let round4 = pi3_round4(sp, &secret, &vk, &session, &round3)
            .await
            .expect("round 4")
            .expect("bytes");
        let (round5, bit) = s.round5(&round4).expect("round 5");
        let (matched, valid, _) = pi3_finish(sp, &secret, &vk, &session, &round5)
            .await
            .expect("output");
        assert!(valid && !matched && !bit, "the impostor does not match");

        // ---- A Round 2 only for a session opened, and charged, in an earlier transaction. ----
        let (_, sealed) = sealed_input(&keys, Protocol::Pi1, "phone-a", &u, theta, &mut rng);
        expect_code(
            call(sp, PI1_ROUND2, &[&"phone-a", &sealed]).await,
            "P0002",
            "a Round 2 of a session never opened",
        );
        sp.batch_execute("BEGIN").await.expect("begin");
        sp.query_one(
            "SELECT privmatch.paillier_session_open($1, $2, 'terminal-1')",
            &[&"phone-a", &sealed],
        )
        .await
        .expect("open");
        expect_code(
            call(sp, PI1_ROUND2, &[&"phone-a", &sealed]).await,
            "55000",
            "open and Round 2 in one transaction (the charge could be rolled back)",
        );
        sp.batch_execute("ROLLBACK").await.expect("rollback");

        // ---- Deletion and re-enrolment need the device's key. ----
        let record_b = call(sp, "SELECT privmatch.paillier_device($1)", &[&"phone-b"])
            .await
            .expect("fetch")
            .expect("record");
        let other = SecretKey::generate(2048, &mut rng).expect("the relay's Paillier key");
        let other_signer = DeviceSigner::new(&other).expect("signer");
        let by_other = other_signer
            .sign(&Statement::delete("phone-b", &record_b))
            .expect("sign");
        for (signature, what) in [
            (vec![1u8; 1], "a junk signature"),
            (by_other, "a signature with another key"),
        ] {
            expect_code(
                call(sp, DELETE, &[&"phone-b", &signature]).await,
                "28000",
                what,
            );
        }
        // A signature of the device, but for another device's record, or replayed later.
        let signer = DeviceSigner::new(&secret).expect("signer");
        let for_c = signer
            .sign(&Statement::delete("phone-c", &record_b))
            .expect("sign");
        expect_code(
            call(sp, DELETE, &[&"phone-c", &for_c]).await,
            "28000",
            "another record",
        );
        // Re-enrolment of the id under the relay's key and an impostor's template: refused.
        let (_, request) =
            DeviceEnrolment::start(&other, &p2, "phone-b", &impostor, &aux, b"again", &mut rng)
                .expect("request");
        expect_code(
            call(sp, BEGIN, &[&"phone-b", &request, &b"again".as_slice()]).await,
            "23505",
            "re-enrolment of an enrolled id",
        );
        assert_eq!(
            call(sp, "SELECT privmatch.paillier_device($1)", &[&"phone-b"]).await,
            Ok(Some(record_b.clone())),
            "the device's record is untouched"
        );
        // The device's own signed deletion works; a replay of it after a re-enrolment does not.
        let mine = signer
            .sign(&Statement::delete("phone-b", &record_b))
            .expect("sign");
        assert_eq!(call_bool(sp, DELETE, &[&"phone-b", &mine]).await, Ok(true));
        enrol(
            sp,
            &secret,
            Protocol::Pi2,
            "phone-b",
            &u,
            &aux,
            &vk,
            &mut rng,
        )
        .await;
        expect_code(
            call(sp, DELETE, &[&"phone-b", &mine]).await,
            "28000",
            "a replayed deletion",
        );
        // A lost device: the SP's operator signs a paillier-delete command.
        let operator_key = privmatch_coordinator::cli::operator_key::load(
            &cluster.home.join("operators/p0.signing.key"),
        )
        .expect("P0's operator key");
        let micros = privmatch_coordinator::cli::operator_key::fresh_counter();
        let command = operator_key.sign(PartyIndex::ALL[0], micros, "paillier-delete", b"phone-b");
        let wrong_action =
            operator_key.sign(PartyIndex::ALL[0], micros + 1, "peer-pin", b"phone-b");
        expect_code(
            call(
                sp,
                "SELECT privmatch.paillier_delete_signed($1)",
                &[&wrong_action],
            )
            .await,
            "28000",
            "another action",
        );
        let forged = OperatorSigningKey::from_bytes(&[18u8; 32]).sign(
            PartyIndex::ALL[0],
            micros + 2,
            "paillier-delete",
            b"phone-b",
        );
        expect_code(
            call(
                sp,
                "SELECT privmatch.paillier_delete_signed($1)",
                &[&forged],
            )
            .await,
            "28000",
            "not the operator's key",
        );
        assert_eq!(
            call_bool(
                sp,
                "SELECT privmatch.paillier_delete_signed($1)",
                &[&command]
            )
            .await,
            Ok(true)
        );
        expect_code(
            call(
                sp,
                "SELECT privmatch.paillier_delete_signed($1)",
                &[&command],
            )
            .await,
            "28000",
            "a replayed operator command",
        );

        // ---- The bisection of a score: the threshold is policy, the budgets bound it. ----
        for (probe, what) in [
            (theta - 1, "a lower θ"),
            (theta + 1, "a higher θ"),
            (-1, "θ = −1"),
        ] {
            let (_, sealed) = sealed_input(&keys, Protocol::Pi3, "phone-c", &u, probe, &mut rng);
            expect_code(
                round2_at(sp, PI3_ROUND2, "phone-c", &sealed).await,
                "22023",
                what,
            );
        }
        set_policy(&operator, "pi3", theta, 3, 1000).await;
        // This hour's Π3 sessions of phone-c so far: the one above.
        let mut opened = 1;
        let budget_code = loop {
            let (_, sealed) = sealed_input(&keys, Protocol::Pi3, "phone-c", &u, theta, &mut rng);
            match round2_at(sp, PI3_ROUND2, "phone-c", &sealed).await {
                Ok(_) => opened += 1,
                Err((code, message)) => {
                    assert!(message.contains("budget"), "{message}");
                    break code;
                }
            }
            assert!(opened <= 3, "past the device's budget");
        };
        assert_eq!((budget_code.as_str(), opened), ("53400", 3));
        // Per terminal: another device, the same terminal.
        set_policy(&operator, "pi3", theta, 1000, 0).await;
        let (_, sealed) = sealed_input(&keys, Protocol::Pi3, "phone-c", &u, theta, &mut rng);
        expect_code(
            round2_at(sp, PI3_ROUND2, "phone-c", &sealed).await,
            "53400",
            "terminal budget",
        );
        // The budget survives a crash of the SP.
        set_policy(&operator, "pi3", theta, 3, 1000).await;
        drop(operator);
        drop(clients);
        cluster.kill_party(0);
        cluster.start_party(0);
        let clients = cluster.clients().await;
        let (_, sealed) = sealed_input(&keys, Protocol::Pi3, "phone-c", &u, theta, &mut rng);
        expect_code(
            round2_at(&clients[0], PI3_ROUND2, "phone-c", &sealed).await,
            "53400",
            "the device's budget after a restart",
        );
        // The operator reads the budget's use, the coordinator cannot change it.
        expect_code(
            call(
                &clients[0],
                "DELETE FROM privmatch.paillier_budget_use RETURNING NULL::bytea",
                &[],
            )
            .await,
            "42501",
            "the coordinator resets the budget",
        );
    });
}

/// `sql` with `args`: the first column of the first row as a bool, or (SQLSTATE, message).
async fn call_bool(
    client: &Client,
    sql: &str,
    args: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<bool, (String, String)> {
    client
        .query_one(sql, args)
        .await
        .map(|row| row.get(0))
        .map_err(|e| sqlstate_and_message(&e))
}
