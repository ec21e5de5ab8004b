//! End-to-end tests of the packed Paillier service provider over SQL (Game-Set-MATCH,
//! Agrawal et al., CCS 2020): P0 of a real three-party deployment is the SP. The device side
//! runs here with core's state machines (`DeviceEnrolment`, `Pi1Device`), the SP side through
//! the coordinator's login role, as the coordinator will relay it: enrolment end to end with
//! the SP's signature verified by the device, refused requests and proofs that store nothing,
//! a duplicate device (23505), fetch, delete, and Π1's Round 2 computed at the SP from the
//! terminal's sealed input, against the plaintext inner product.

use privmatch_core::paillier::cipher::SecretKey;
use privmatch_core::paillier::enroll::DeviceEnrolment;
use privmatch_core::paillier::key_proof::RingPedersenParams;
use privmatch_core::paillier::params::{Params, Protocol, DEFAULT_STAT_BITS};
use privmatch_core::paillier::record::SignedTemplate;
use privmatch_core::paillier::semi_honest::Pi1Device;
use privmatch_core::paillier::terminal::TerminalInput;
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{sqlstate_and_message, Cluster};
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

const BEGIN: &str = "SELECT privmatch.paillier_enroll_begin($1, $2, $3)";
const FINISH: &str = "SELECT privmatch.paillier_enroll_finish($1, $2)";

#[test]
fn devices_enrol_match_and_are_deleted_at_the_service_provider() {
    let cluster = Cluster::start("paillier-sql", 60);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(60);
    // The SP's operator: its keys (1024-bit ring-Pedersen parameters keep the test fast) and
    // the parameter sets for Π1 and Π2.
    let signing: String =
        cluster.query(0, "SELECT privmatch.paillier_init_service(1024)", &[])[0].get(0);
    let again: String =
        cluster.query(0, "SELECT privmatch.paillier_init_service(1024)", &[])[0].get(0);
    assert_eq!(signing, again, "idempotent");
    for protocol in [Protocol::Pi1, Protocol::Pi2] {
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
    let vk = ed25519_dalek::VerifyingKey::from_bytes(&vk_bytes.try_into().expect("32 bytes"))
        .expect("Ed25519 key");
    let aux = RingPedersenParams::from_bytes(&info[0].get::<_, Vec<u8>>(2)).expect("aux");

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
        let mut wrong = device2.respond(&challenge2).expect("response");
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        expect_code(
            call(sp, FINISH, &[&"phone-3", &Some(wrong)]).await,
            "08P01",
            "wrong norm response",
        );
        expect_code(
            call(sp, FINISH, &[&"phone-7", &None::<Vec<u8>>]).await,
            "P0002",
            "no pending enrolment",
        );
        assert_eq!(count("paillier_devices").await, 1);

        // Delete: true, then false; the record is gone (P0002).
        let mut deleted = Vec::new();
        for _ in 0..2 {
            let row = sp
                .query_one("SELECT privmatch.paillier_delete($1)", &[&"phone-1"])
                .await
                .expect("delete");
            deleted.push(row.get::<_, bool>(0));
        }
        assert_eq!(deleted, [true, false]);
        expect_code(
            call(sp, "SELECT privmatch.paillier_device($1)", &[&"phone-1"]).await,
            "P0002",
            "deleted device",
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
        for (i, w) in [template(&mut rng), u.clone()].into_iter().enumerate() {
            let ip = dot(&u, &w);
            for threshold in [ip, ip + 1] {
                let input = TerminalInput {
                    protocol: Protocol::Pi1,
                    session: [i as u8; 16],
                    device_id: "phone-p1".into(),
                    threshold,
                    w: w.clone(),
                };
                let sealed = input
                    .seal(PartyIndex::ALL[0], &keys[0], &mut rng)
                    .expect("seal");
                let round2 = call(
                    sp,
                    "SELECT privmatch.paillier_pi1_round2($1, $2)",
                    &[&"phone-p1", &sealed],
                )
                .await
                .expect("round 2")
                .expect("bytes");
                let (_, outcome) = pi1.round3(&round2).expect("round 3");
                assert_eq!(outcome.inner_product, ip);
                assert_eq!(outcome.matched, threshold == ip);
            }
        }
        // A terminal input sealed to P1, or for another device: refused.
        let input = TerminalInput {
            protocol: Protocol::Pi1,
            session: [9; 16],
            device_id: "phone-p1".into(),
            threshold: 0,
            w: u.clone(),
        };
        let to_p1 = input
            .seal(PartyIndex::ALL[1], &keys[1], &mut rng)
            .expect("seal");
        expect_code(
            call(
                sp,
                "SELECT privmatch.paillier_pi1_round2($1, $2)",
                &[&"phone-p1", &to_p1],
            )
            .await,
            "08P01",
            "input sealed to P1",
        );
        let to_p0 = input
            .seal(PartyIndex::ALL[0], &keys[0], &mut rng)
            .expect("seal");
        expect_code(
            call(
                sp,
                "SELECT privmatch.paillier_pi1_round2($1, $2)",
                &[&"phone-2", &to_p0],
            )
            .await,
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
