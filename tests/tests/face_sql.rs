//! End-to-end tests of the face modality (Funshade) over SQL against three real PostgreSQL
//! parties: the dealer P2 configured and dealing keys, P0 and P1 storing shares, opening them
//! under the dealer's masks and evaluating, driven here the way the coordinator drives them.
//! Results are checked against the plaintext comparison on the quantised values; forged or
//! replayed steps are refused; bad inputs fail with clear SQLSTATEs and change nothing.

use privmatch_coordinator::cli::operator_key;
use privmatch_core::crypto::seal::{PairwiseSecrets, PartyPublicKey, PartySecretKey};
use privmatch_core::crypto::sign::OperatorSigningKey;
use privmatch_core::embedding::{dot, normalize};
use privmatch_core::face::dealer::{seal_dealer_config, DealerConfig, DEALER_CONFIG_ACTION};
use privmatch_core::face::encoding::{share_embedding, EmbeddingShare};
use privmatch_core::face::enroll::{seal_face_enrollment, FaceEnrollRequest};
use privmatch_core::face::mask_dealer::{open_identification_key_chunks, open_template_seeds};
use privmatch_core::face::masked::{
    distance_round, masked_template_share, probe_round, sign_round, KeysFor, MaskedTemplateSet,
};
use privmatch_core::face::probe::{seal_face_probe, seal_face_probe_knowing};
use privmatch_core::face::quantize::{plaintext_match, squared_distance, Quantizer};
use privmatch_core::face::reply::{
    open_face_identification, open_face_reply, open_face_result, sealed_output_len, KnownSubjects,
};
use privmatch_core::face::{funshade, FaceError, Metric};
use privmatch_core::party::PartyIndex;
use privmatch_core::wire::storage::{decode_share, ShareKind};
use privmatch_e2e::Cluster;
use privmatch_e2e::{failure, sqlstate_and_message, Failure};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio_postgres::Client;

/// The reply key's secret of the client these tests play: P0 and P1 seal their outputs to
/// its public key (docs/protocols/face.md §13).
fn client_reply() -> PartySecretKey {
    PartySecretKey::from_bytes([0x5a; 32])
}

/// The client's step: opens P0's and P1's sealed outputs of `session` and adds them: per
/// compared subject (a verification: the `claimed` one; an identification: those listed
/// inside the outputs) its bit.
fn open_bits(
    keys: &[PartyPublicKey; 3],
    session: &[u8; 16],
    o0: &[u8],
    o1: &[u8],
    claimed: Option<&str>,
) -> Vec<(String, bool)> {
    let result = open_face_result(
        [&keys[0], &keys[1]],
        &client_reply(),
        session,
        [o0, o1],
        claimed,
    )
    .expect("the client opens the sealed outputs");
    result.subjects.into_iter().zip(result.bits).collect()
}

/// A random L2-normalised embedding.
fn random_embedding(rng: &mut ChaCha20Rng, dim: usize) -> Vec<f64> {
    let raw: Vec<f64> = (0..dim)
        .map(|_| {
            // Box-Muller: a standard normal variate.
            let (u, v): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        })
        .collect();
    normalize(&raw).expect("non-zero")
}

/// A re-capture of `e`: Gaussian noise of relative size `noise`, normalised again.
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

/// Enrolment records: (subject, quantised embedding).
type Records = Vec<(String, Vec<i32>)>;

/// `count` random people: their embeddings and their quantised records `person-NNNN`.
fn population(rng: &mut ChaCha20Rng, q: &Quantizer, count: usize) -> (Vec<Vec<f64>>, Records) {
    let floats: Vec<Vec<f64>> = (0..count).map(|_| random_embedding(rng, q.dim())).collect();
    let records = floats
        .iter()
        .enumerate()
        .map(|(i, e)| (format!("person-{i:04}"), q.quantize(e).expect("quantise")))
        .collect();
    (floats, records)
}

/// Seals a dealer configuration to P2 and signs it as P2's operator (the key `cluster up`
/// wrote), with a fresh counter.
fn signed_config(cluster: &Cluster, keys: &[PartyPublicKey; 3], config: &DealerConfig) -> Vec<u8> {
    let mut rng = ChaCha20Rng::from_entropy();
    let sealed = seal_dealer_config(config, &keys[2], &mut rng).expect("config");
    let operator = operator_key::load(&cluster.home.join("operators/p2.signing.key"))
        .expect("P2's operator key");
    operator.sign(
        PartyIndex::ALL[2],
        operator_key::fresh_counter(),
        DEALER_CONFIG_ACTION,
        &sealed,
    )
}

/// P2's dealer configuration generation.
async fn dealer_generation(p2: &Client) -> i64 {
    p2.query_one("SELECT generation FROM privmatch.face_dealer_status()", &[])
        .await
        .expect("dealer status")
        .get(0)
}

async fn configure(
    cluster: &Cluster,
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    metric: Metric,
    dim: usize,
    threshold: f64,
) {
    let command = signed_config(
        cluster,
        keys,
        &DealerConfig {
            metric,
            dim,
            threshold,
        },
    );
    clients[2]
        .query(
            "SELECT * FROM privmatch.face_dealer_configure($1)",
            &[&command],
        )
        .await
        .expect("configure");
}

async fn enroll(clients: &[Client], keys: &[PartyPublicKey; 3], records: &[(String, Vec<i32>)]) {
    let requests: Vec<FaceEnrollRequest<'_>> = records
        .iter()
        .map(|(s, e)| FaceEnrollRequest {
            subject: s,
            embedding: e,
        })
        .collect();
    let mut rng = ChaCha20Rng::from_entropy();
    let (sealed, _) = seal_face_enrollment(&requests, keys, &mut rng).expect("seal");
    for p in 0..2 {
        clients[p]
            .query(
                "SELECT * FROM privmatch.face_enroll_sealed($1)",
                &[&vec![sealed[p].clone()]],
            )
            .await
            .expect("enrol");
    }
}

fn metric_value(metric: Metric, x: &[i32], y: &[i32]) -> i64 {
    match metric {
        Metric::Cosine => dot(x, y),
        Metric::Euclidean => squared_distance(x, y),
    }
}

/// Opens verification `session` at P0 alone with a probe of `probe` sealed for `subject` (the
/// checks of an open run before anything is dealt); `sealed_for` picks the evaluator whose
/// sealed probe is sent (P1's must be refused at P0).
async fn verification_open_at_p0(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    session: [u8; 16],
    subject: &str,
    probe: &[i32],
    sealed_for: usize,
) -> Result<(), Failure> {
    let mut rng = ChaCha20Rng::from_entropy();
    let sealed = seal_face_probe(
        probe,
        session,
        Some(subject),
        &client_reply().public_key(),
        keys,
        &mut rng,
    )
    .expect("seal probe");
    clients[0]
        .query_one(
            "SELECT comparisons FROM privmatch.face_masked_open($1, $2)",
            &[&session.as_slice(), &sealed[sealed_for]],
        )
        .await
        .map(|_| ())
        .map_err(|e| failure(0, &e))
}

#[test]
fn bad_face_inputs_fail_clearly_and_change_nothing() {
    const DIM: usize = 128;
    let cluster = Cluster::start("face-errors", 32);
    let keys = cluster.party_keys();
    let q = Quantizer::new(DIM).expect("dim");
    let mut rng = ChaCha20Rng::seed_from_u64(32);
    let alice = q.quantize(&random_embedding(&mut rng, DIM)).expect("q");
    let state = |cluster: &Cluster| -> Vec<i64> {
        (0..2)
            .flat_map(|p| {
                [
                    cluster.scalar(p, "SELECT count(*) FROM privmatch.face_templates"),
                    cluster.scalar(p, "SELECT count(*) FROM privmatch.face_sessions"),
                ]
            })
            .collect()
    };
    cluster.block_on(async {
        let clients = cluster.clients().await;
        // An unconfigured dealer shows no state.
        let rows = clients[2]
            .query("SELECT * FROM privmatch.face_dealer_status()", &[])
            .await
            .expect("status");
        assert!(rows.is_empty(), "{rows:?}");
        let accepted = signed_config(
            &cluster,
            &keys,
            &DealerConfig {
                metric: Metric::Euclidean,
                dim: DIM,
                threshold: 0.8,
            },
        );
        clients[2]
            .query(
                "SELECT * FROM privmatch.face_dealer_configure($1)",
                &[&accepted],
            )
            .await
            .expect("a configuration signed by P2's operator");
        let before = dealer_generation(&clients[2]).await;
        // What a coordinator could try: replay the accepted configuration, forge one with a
        // threshold of its choosing (cosine θ = −1: every face verifies), or send a bare sealed
        // configuration. P2 refuses each (28000 / 22023) and its state does not change.
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let door_open = seal_dealer_config(
            &DealerConfig {
                metric: Metric::Cosine,
                dim: DIM,
                threshold: -1.0,
            },
            &keys[2],
            &mut rng,
        )
        .expect("seal");
        let forged = OperatorSigningKey::generate(&mut rng).sign(
            PartyIndex::ALL[2],
            u64::MAX >> 2,
            DEALER_CONFIG_ACTION,
            &door_open,
        );
        for (what, command, sqlstate) in [
            ("replayed", accepted.clone(), "28000"),
            ("forged", forged, "28000"),
            ("unsigned", door_open.clone(), "22023"),
        ] {
            let err = clients[2]
                .query(
                    "SELECT * FROM privmatch.face_dealer_configure($1)",
                    &[&command],
                )
                .await
                .expect_err(what);
            assert_eq!(
                err.code().map(|c| c.code()),
                Some(sqlstate),
                "{what}: {err:?}"
            );
        }
        assert_eq!(
            dealer_generation(&clients[2]).await,
            before,
            "a refused configuration changed P2"
        );
        enroll(&clients, &keys, &[("alice".to_owned(), alice.clone())]).await;
        // The threshold never reaches P0/P1, and P2's status does not show it.
        let status = clients[2]
            .query_one(
                "SELECT row_to_json(s)::text FROM privmatch.face_dealer_status() s",
                &[],
            )
            .await
            .expect("status");
        assert!(!status.get::<_, String>(0).contains("0.8"));
    });
    let before = state(&cluster);
    cluster.block_on(async {
        let clients = cluster.clients().await;
        // Wrong dimension.
        let wide = Quantizer::new(256)
            .expect("256")
            .quantize(&random_embedding(&mut rng, 256))
            .expect("q");
        let err = verification_open_at_p0(&clients, &keys, [0x31; 16], "alice", &wide, 0)
            .await
            .expect_err("dimension");
        assert_eq!(err.sqlstate.as_deref(), Some("22023"), "{err:?}");
        assert!(err.message.contains("dimension"), "{err:?}");
        // Unknown subject.
        let err = verification_open_at_p0(&clients, &keys, [0x32; 16], "mallory", &alice, 0)
            .await
            .expect_err("unknown");
        assert_eq!(err.sqlstate.as_deref(), Some("P0002"), "{err:?}");
        // The subject is not named: the message reaches the coordinator, which must not learn
        // whom a verification was for.
        assert!(
            !err.message.contains("mallory") && err.message.contains("verified subject"),
            "{err:?}"
        );
        // A probe sealed to P1 is refused by P0 as sealed for another party (22023, as at
        // enrolment), not as altered (22P03).
        let err = verification_open_at_p0(&clients, &keys, [0x33; 16], "alice", &alice, 1)
            .await
            .expect_err("sealed to P1");
        assert_eq!(err.sqlstate.as_deref(), Some("22023"), "{err:?}");
        // Enrolling a template of another dimension.
        let requests = [FaceEnrollRequest {
            subject: "bob",
            embedding: &wide,
        }];
        let (sealed, _) = seal_face_enrollment(&requests, &keys, &mut rng).expect("seal");
        let err = clients[0]
            .query(
                "SELECT * FROM privmatch.face_enroll_sealed($1)",
                &[&vec![sealed[0].clone()]],
            )
            .await
            .expect_err("dim");
        assert_eq!(err.code().map(|c| c.code()), Some("22023"), "{err:?}");
    });
    assert_eq!(state(&cluster), before, "a refused input changed a party");
}

/// Evaluator `party`'s secret key, from the key file `cluster up` wrote: the test plays the
/// evaluator's side of the dealer-masked protocol, which the engine does not run yet.
fn evaluator_channel_to_dealer(
    cluster: &Cluster,
    keys: &[PartyPublicKey; 3],
    party: usize,
) -> PairwiseSecrets {
    let text = std::fs::read_to_string(cluster.home.join(format!("p{party}/party.key")))
        .expect("key file");
    let hex_key = text
        .lines()
        .find_map(|l| l.strip_prefix("privmatch-party-key-v1 "))
        .expect("party key line");
    let bytes: [u8; 32] = hex::decode(hex_key.trim())
        .expect("hex")
        .try_into()
        .expect("32 bytes");
    let secret = PartySecretKey::from_bytes(bytes);
    PairwiseSecrets::derive(
        PartyIndex::ALL[party],
        &secret,
        PartyIndex::ALL[2],
        &keys[2],
    )
    .expect("pairwise")
}

/// Evaluator `party`'s stored templates in subject order: (subject, bundle id, share).
async fn stored_templates(client: &Client) -> Vec<(String, [u8; 16], EmbeddingShare)> {
    let rows = client
        .query(
            "SELECT subject, bundle_id, privmatch.face_share_send(template), norm_share \
               FROM privmatch.face_templates ORDER BY subject COLLATE \"C\"",
            &[],
        )
        .await
        .expect("templates");
    rows.iter()
        .map(|row| {
            let bytes: Vec<u8> = row.get(2);
            let view = decode_share(ShareKind::FaceTemplate, &bytes).expect("share");
            let share = EmbeddingShare {
                elements: view.words(),
                norm: row.get::<_, i32>(3) as u32,
            };
            let id: Vec<u8> = row.get(1);
            (row.get(0), id.try_into().expect("16 bytes"), share)
        })
        .collect()
}

/// Both evaluators' mask seeds of the templates `ids`, as P2 answers them
/// (`face_dealer_template_seeds`), opened by each evaluator.
async fn dealer_seeds(
    p2: &Client,
    channels: &[PairwiseSecrets; 2],
    ids: &[[u8; 16]],
) -> Vec<Vec<[u8; 16]>> {
    let id_args: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
    let mut seeds = Vec::new();
    for b in 0..2i32 {
        let sealed: Vec<u8> = p2
            .query_one(
                "SELECT privmatch.face_dealer_template_seeds($1, $2)",
                &[&b, &id_args],
            )
            .await
            .expect("seeds")
            .get(0);
        let me = PartyIndex::ALL[b as usize];
        seeds.push(open_template_seeds(me, &channels[b as usize], ids, &sealed).expect("open"));
    }
    seeds
}

/// Both evaluators' masked template sets, opened with the seeds P2 answers and the exchange
/// of Y_b.
async fn open_masked_sets(
    clients: &[Client],
    channels: &[PairwiseSecrets; 2],
    stored: &[Vec<(String, [u8; 16], EmbeddingShare)>; 2],
    dim: usize,
) -> [MaskedTemplateSet; 2] {
    let ids: Vec<[u8; 16]> = stored[0].iter().map(|t| t.1).collect();
    let seeds = dealer_seeds(&clients[2], channels, &ids).await;
    let masked: Vec<Vec<Vec<u32>>> = (0..2)
        .map(|b| {
            stored[b]
                .iter()
                .zip(&seeds[b])
                .map(|(t, seed)| masked_template_share(&t.2, seed))
                .collect()
        })
        .collect();
    let mut sets = [
        MaskedTemplateSet::new(0, dim).expect("set"),
        MaskedTemplateSet::new(1, dim).expect("set"),
    ];
    for (b, set) in sets.iter_mut().enumerate() {
        for (j, id) in ids.iter().enumerate() {
            let norm = stored[b][j].2.norm;
            set.push(*id, &masked[b][j], &masked[1 - b][j], &seeds[b][j], norm)
                .expect("push");
        }
    }
    sets
}

/// P2's sealed key halves of `session` for the templates `ids`, chunk by chunk.
async fn dealt_halves(
    p2: &Client,
    session: &[u8; 16],
    ids: &[[u8; 16]],
) -> Result<[Vec<Vec<u8>>; 2], Failure> {
    dealt_halves_for(p2, KeysFor::Session(*session), ids).await
}

/// P2's sealed key halves for `keys_for` (`face_dealer_identify` for a session,
/// `face_dealer_stock` for a stock id, both for the templates `ids`; `face_dealer_verify` for
/// a verification, from its session id alone), chunk by chunk.
async fn dealt_halves_for(
    p2: &Client,
    keys_for: KeysFor,
    ids: &[[u8; 16]],
) -> Result<[Vec<Vec<u8>>; 2], Failure> {
    let id_args: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
    let id = keys_for.id().to_vec();
    let rows = match keys_for {
        KeysFor::Session(_) | KeysFor::Stock(_) => {
            let function = match keys_for {
                KeysFor::Stock(_) => "face_dealer_stock",
                _ => "face_dealer_identify",
            };
            p2.query(
                &format!(
                    "SELECT envelope_p0, envelope_p1 FROM privmatch.{function}($1, $2) ORDER BY chunk"
                ),
                &[&id, &id_args],
            )
            .await
        }
        KeysFor::Verification(_) => {
            p2.query(
                "SELECT envelope_p0, envelope_p1 FROM privmatch.face_dealer_verify($1) ORDER BY chunk",
                &[&id],
            )
            .await
        }
    }
    .map_err(|e| failure(2, &e))?;
    Ok([0, 1].map(|b| rows.iter().map(|r| r.get::<_, Vec<u8>>(b)).collect()))
}

/// One masked identification as the two evaluators run it, from P2's dealt halves: the
/// reconstructed bits, in template order.
fn masked_identification(
    channels: &[PairwiseSecrets; 2],
    keys_for: KeysFor,
    halves: &[Vec<Vec<u8>>; 2],
    sets: &[MaskedTemplateSet; 2],
    probe: &[EmbeddingShare; 2],
) -> Result<Vec<bool>, FaceError> {
    let keys = [0, 1].map(|b| {
        let chunks: Vec<&[u8]> = halves[b].iter().map(Vec::as_slice).collect();
        open_identification_key_chunks(PartyIndex::ALL[b], &channels[b], keys_for, &chunks)
    });
    let [k0, k1] = keys;
    let (k0, k1) = (k0?, k1?);
    let x0 = probe_round(&k0, &probe[0])?;
    let x1 = probe_round(&k1, &probe[1])?;
    let z0 = distance_round(&k0, &sets[0], &probe[0], &x0, &x1, 2)?;
    let z1 = distance_round(&k1, &sets[1], &probe[1], &x1, &x0, 2)?;
    let o0 = sign_round(&k0, &z0, &z1, 2)?;
    let o1 = sign_round(&k1, &z1, &z0, 2)?;
    funshade::reconstruct(&o0, &o1)
}

#[test]
fn dealer_masked_keys_from_p2_give_the_plaintext_answers_for_their_session_and_list_only() {
    const DIM: usize = 128;
    const TEMPLATES: usize = 150;
    let cluster = Cluster::start("face-masked-dealer", 36);
    let keys = cluster.party_keys();
    let q = Quantizer::new(DIM).expect("dim");
    let mut rng = ChaCha20Rng::seed_from_u64(36);
    let (floats, records) = population(&mut rng, &q, TEMPLATES);
    let probes: Vec<Vec<i32>> = (0..4)
        .map(|i| {
            q.quantize(&recapture(&mut rng, &floats[i * 11], 0.2 + 0.2 * i as f64))
                .expect("q")
        })
        .collect();
    let m2 = f64::from(q.magnitude()).powi(2);
    let channels = [0, 1].map(|b| evaluator_channel_to_dealer(&cluster, &keys, b));
    cluster.block_on(async {
        let clients = cluster.clients().await;
        enroll(&clients, &keys, &records).await;
        // The evaluators' stored shares, read as each party's operator (the test plays the
        // evaluators' side).
        let stored = [
            stored_templates(&cluster.connect(0).await).await,
            stored_templates(&cluster.connect(1).await).await,
        ];
        let ids: Vec<[u8; 16]> = stored[0].iter().map(|t| t.1).collect();
        let same: Vec<[u8; 16]> = stored[1].iter().map(|t| t.1).collect();
        assert_eq!(
            ids, same,
            "P0 and P1 hold the same bundle ids, in the same order"
        );
        let id_args: Vec<Vec<u8>> = ids.iter().map(|id| id.to_vec()).collect();
        // Before the dealer is configured there is no master key.
        let err = clients[2]
            .query(
                "SELECT privmatch.face_dealer_template_seeds(0, $1)",
                &[&id_args],
            )
            .await
            .expect_err("unconfigured");
        assert_eq!(sqlstate_and_message(&err).0, "55000", "{err}");
        let mut first_seeds = None;
        for metric in [Metric::Cosine, Metric::Euclidean] {
            let pivot = metric_value(metric, &probes[1], &records[11].1);
            for step in [-1i64, 0, 1] {
                let theta_q = pivot + step;
                configure(&cluster, &clients, &keys, metric, DIM, theta_q as f64 / m2).await;
                if first_seeds.is_none() {
                    first_seeds = Some(dealer_seeds(&clients[2], &channels, &ids).await);
                }
                // Templates are opened once per configuration here; K survives
                // reconfiguration, so the sets opened the first time would do as well.
                let sets = open_masked_sets(&clients, &channels, &stored, DIM).await;
                for probe in &probes {
                    let shares = share_embedding(probe, &mut rng);
                    let session: [u8; 16] = rng.gen();
                    let halves = dealt_halves(&clients[2], &session, &ids)
                        .await
                        .expect("deal");
                    let got = masked_identification(
                        &channels,
                        KeysFor::Session(session),
                        &halves,
                        &sets,
                        &shares,
                    )
                    .expect("identify");
                    for (bit, (name, template)) in got.iter().zip(&records) {
                        let expected = plaintext_match(metric, probe, template, theta_q);
                        assert_eq!(*bit, expected, "{metric} θ_q {theta_q} vs {name}");
                    }
                }
            }
        }
        // K survived the five reconfigurations: the seeds, hence the opened templates, are
        // those of the first configuration.
        assert_eq!(
            dealer_seeds(&clients[2], &channels, &ids).await,
            first_seeds.expect("configured at least once")
        );
        let sets = open_masked_sets(&clients, &channels, &stored, DIM).await;
        let shares = share_embedding(&probes[0], &mut rng);
        let session: [u8; 16] = rng.gen();
        let halves = dealt_halves(&clients[2], &session, &ids)
            .await
            .expect("deal");
        // A half opened for another session is refused (the channel is bound to it).
        let other: [u8; 16] = rng.gen();
        let err =
            masked_identification(&channels, KeysFor::Session(other), &halves, &sets, &shares)
                .expect_err("another session");
        assert!(err.to_string().contains("session"), "{err}");
        // Stocked under the same 16 bytes (docs/protocols/face.md §11): P2 deals other keys,
        // which open only as that stock id (never as the session) and give the plaintext
        // answers; the session's halves do not open as stock.
        let stock = KeysFor::Stock(session);
        let stocked = dealt_halves_for(&clients[2], stock, &ids)
            .await
            .expect("stock");
        assert_ne!(
            stocked, halves,
            "a stock id deals other keys than the session id"
        );
        let got = masked_identification(&channels, stock, &stocked, &sets, &shares)
            .expect("stocked identification");
        // The last configuration of the loop above: Euclidean, one step above the pivot.
        let theta_q = metric_value(Metric::Euclidean, &probes[1], &records[11].1) + 1;
        assert_eq!(got.len(), records.len());
        for (bit, (name, template)) in got.iter().zip(&records) {
            let expected = plaintext_match(Metric::Euclidean, &probes[0], template, theta_q);
            assert_eq!(*bit, expected, "stocked dealing vs {name}");
        }
        assert!(masked_identification(
            &channels,
            KeysFor::Session(session),
            &stocked,
            &sets,
            &shares
        )
        .is_err());
        assert!(masked_identification(&channels, stock, &halves, &sets, &shares).is_err());
        // Keys dealt for another template list (two swapped) are refused by the evaluators.
        let mut swapped = ids.clone();
        swapped.swap(3, 4);
        let halves = dealt_halves(&clients[2], &session, &swapped)
            .await
            .expect("deal");
        let err = masked_identification(
            &channels,
            KeysFor::Session(session),
            &halves,
            &sets,
            &shares,
        )
        .expect_err("another list");
        assert!(err.to_string().contains("another template list"), "{err}");
        // Bad input: a clear SQLSTATE naming the argument.
        let seeds_sql = "SELECT privmatch.face_dealer_template_seeds($1, $2)";
        let fifteen = vec![vec![0u8; 15]];
        let no_ids: Vec<Vec<u8>> = Vec::new();
        for (party, ids_arg, names) in [
            (2, &id_args, "party must be 0 or 1"),
            (0, &fifteen, "bundle_ids[1] must be 16 bytes"),
            (0, &no_ids, "bundle_ids is empty"),
        ] {
            let err = clients[2]
                .query(seeds_sql, &[&party, ids_arg])
                .await
                .expect_err(names);
            let (code, message) = sqlstate_and_message(&err);
            assert_eq!(code, "22023", "{message}");
            assert!(message.contains(names), "{message}");
        }
        let err = clients[2]
            .query(
                "SELECT * FROM privmatch.face_dealer_identify($1, $2)",
                &[&vec![0u8; 15], &id_args],
            )
            .await
            .expect_err("short session");
        let (code, message) = sqlstate_and_message(&err);
        assert_eq!(
            (code.as_str(), message.contains("session must be 16 bytes")),
            ("22023", true),
            "{message}"
        );
        let with_null: Vec<Option<Vec<u8>>> = vec![Some(vec![1u8; 16]), None];
        let err = clients[2]
            .query(seeds_sql, &[&0i32, &with_null])
            .await
            .expect_err("NULL id");
        let (code, message) = sqlstate_and_message(&err);
        assert_eq!(code, "22004", "{message}");
        assert!(message.contains("bundle_ids[2] is NULL"), "{message}");
        // Only P2 deals.
        let err = clients[0]
            .query(seeds_sql, &[&0i32, &id_args])
            .await
            .expect_err("at P0");
        assert_eq!(sqlstate_and_message(&err).0, "55000", "{err}");
    });
}

/// The SQLSTATE of a failed query, asserting that it failed.
fn refused_with<T: std::fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    what: &str,
) -> (String, String) {
    let err = result.expect_err(what);
    sqlstate_and_message(&err)
}

async fn opened_count(operator: &Client) -> i64 {
    operator
        .query_one("SELECT count(*) FROM privmatch.face_masked_templates", &[])
        .await
        .expect("opened templates")
        .get(0)
}

/// `face_masked_prepare` at evaluator `b` (the coordinator's login).
async fn prepare(
    client: &Client,
    ids: &[Vec<u8>],
    seeds: &[u8],
) -> Result<Vec<u8>, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT privmatch.face_masked_prepare($1, $2)",
            &[&ids, &seeds],
        )
        .await
        .map(|r| r.get(0))
}

async fn accept(
    client: &Client,
    ids: &[Vec<u8>],
    seeds: &[u8],
    peer: &[u8],
) -> Result<i64, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT privmatch.face_masked_accept($1, $2, $3)",
            &[&ids, &seeds, &peer],
        )
        .await
        .map(|r| r.get(0))
}

/// P2's sealed seeds of `ids` for evaluator `b`.
async fn sealed_seeds(p2: &Client, b: i32, ids: &[Vec<u8>]) -> Vec<u8> {
    p2.query_one(
        "SELECT privmatch.face_dealer_template_seeds($1, $2)",
        &[&b, &ids],
    )
    .await
    .expect("seeds")
    .get(0)
}

/// A masked session opened at P0 and P1 (identification against every opened template):
/// the compared bundle ids in the evaluators' order (the subjects are named nowhere but
/// inside the sealed outputs).
async fn masked_open(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    session: [u8; 16],
    probe: &[i32],
) -> Result<Vec<u8>, Failure> {
    let mut rng = ChaCha20Rng::from_entropy();
    let sealed = seal_face_probe(
        probe,
        session,
        None,
        &client_reply().public_key(),
        keys,
        &mut rng,
    )
    .expect("seal probe");
    let row = clients[0]
        .query_one(
            "SELECT bundle_ids, masked_probe FROM privmatch.face_masked_open($1, $2)",
            &[&session.as_slice(), &sealed[0]],
        )
        .await
        .map_err(|e| failure(0, &e))?;
    let ids: Vec<u8> = row.get(0);
    assert_eq!(
        row.get::<_, Option<Vec<u8>>>(1),
        None,
        "an identification's open sends no message"
    );
    let row = clients[1]
        .query_one(
            "SELECT bundle_ids FROM privmatch.face_masked_open($1, $2, $3)",
            &[&session.as_slice(), &sealed[1], &ids],
        )
        .await
        .map_err(|e| failure(1, &e))?;
    assert_eq!(row.get::<_, Vec<u8>>(0), ids, "the evaluators' lists");
    Ok(ids)
}

async fn masked_keys(
    client: &Client,
    session: &[u8; 16],
    chunks: &[Vec<u8>],
) -> Result<Vec<u8>, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT privmatch.face_masked_keys($1, $2)",
            &[&session.as_slice(), &chunks],
        )
        .await
        .map(|r| r.get(0))
}

async fn masked_round(
    client: &Client,
    session: &[u8; 16],
    round: i32,
    inbound: &[u8],
) -> Result<Vec<u8>, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT privmatch.face_masked_round($1, $2, $3)",
            &[&session.as_slice(), &round, &inbound],
        )
        .await
        .map(|r| r.get(0))
}

/// Flips one bit in the middle of `bytes`.
/// `face_masked_keyed_round` at `client`: a verification's key half and the peer's message of
/// the open in, the sealed distance shares out.
async fn keyed_round(
    client: &Client,
    session: &[u8; 16],
    chunks: &[Vec<u8>],
    inbound: &[u8],
) -> Result<Vec<u8>, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT privmatch.face_masked_keyed_round($1, $2, $3)",
            &[&session.as_slice(), &chunks, &inbound],
        )
        .await
        .map(|row| row.get(0))
}

fn tampered(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let i = out.len() / 2;
    out[i] ^= 0x10;
    out
}

/// What a malicious party or a curious coordinator can try against the dealer-masked steps
/// at P0 and P1, through the coordinator's own role: forged or misdirected seeds, a tampered
/// or reflected peer message, another session's key half, a tampered round message, a reused
/// session id, P2 calling an evaluator's function. Each is refused with its SQLSTATE and
/// stores nothing; the honest run afterwards still gives the plaintext answers.
#[test]
fn dealer_masked_steps_refuse_forgeries_and_store_nothing() {
    const DIM: usize = 128;
    const TEMPLATES: usize = 24;
    let cluster = Cluster::start("face-masked-forgery", 37);
    let keys = cluster.party_keys();
    let q = Quantizer::new(DIM).expect("dim");
    let mut rng = ChaCha20Rng::seed_from_u64(37);
    let (floats, records) = population(&mut rng, &q, TEMPLATES);
    let probe = q
        .quantize(&recapture(&mut rng, &floats[5], 0.3))
        .expect("q");
    let m2 = f64::from(q.magnitude()).powi(2);
    let theta_q = dot(&probe, &records[5].1) - 1;
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let operators = [cluster.connect(0).await, cluster.connect(1).await];
        enroll(&clients, &keys, &records).await;
        configure(&cluster, &clients, &keys, Metric::Cosine, DIM, theta_q as f64 / m2).await;
        let pending: Vec<Vec<u8>> = clients[0]
            .query_one("SELECT privmatch.face_masked_pending()", &[])
            .await
            .expect("pending")
            .get(0);
        assert_eq!(pending.len(), TEMPLATES);
        let ids = pending;
        let mut swapped = ids.clone();
        swapped.swap(0, 1);

        // P2 holds no evaluator's role.
        for (sql, what) in [
            ("SELECT privmatch.face_masked_pending()", "pending at P2"),
            (
                "SELECT * FROM privmatch.face_masked_open('\\x00000000000000000000000000000000', '\\x00')",
                "open at P2",
            ),
        ] {
            let (code, message) = refused_with(clients[2].query(sql, &[]).await, what);
            assert_eq!(code, "55000", "{what}: {message}");
        }
        let seeds = [
            sealed_seeds(&clients[2], 0, &ids).await,
            sealed_seeds(&clients[2], 1, &ids).await,
        ];
        let (code, message) = refused_with(prepare(&clients[2], &ids, &seeds[0]).await, "prepare at P2");
        assert_eq!(code, "55000", "{message}");

        // Seeds sealed for the other evaluator, tampered, or for another list: 08P01.
        for (seed_bytes, list, what) in [
            (&seeds[1], &ids, "P1's seeds at P0"),
            (&tampered(&seeds[0]), &ids, "tampered seeds"),
            (&seeds[0], &swapped, "seeds of another list"),
        ] {
            let (code, message) = refused_with(prepare(&clients[0], list, seed_bytes).await, what);
            assert_eq!(code, "08P01", "{what}: {message}");
            assert!(message.contains("dealer's seeds were refused"), "{message}");
        }

        let y = [
            prepare(&clients[0], &ids, &seeds[0]).await.expect("prepare P0"),
            prepare(&clients[1], &ids, &seeds[1]).await.expect("prepare P1"),
        ];
        let seeds_swapped = sealed_seeds(&clients[2], 0, &swapped).await;
        // A tampered peer message, P0's own message reflected, P1's message for another
        // list: refused, nothing stored.
        for (list, seed_bytes, peer, what) in [
            (&ids, &seeds[0], tampered(&y[1]), "tampered peer message"),
            (&ids, &seeds[0], y[0].clone(), "own message reflected"),
            (&swapped, &seeds_swapped, y[1].clone(), "peer message of another list"),
        ] {
            let (code, message) =
                refused_with(accept(&clients[0], list, seed_bytes, &peer).await, what);
            assert_eq!(code, "08P01", "{what}: {message}");
            assert!(message.contains("other evaluator's message was refused"), "{message}");
            assert_eq!(opened_count(&operators[0]).await, 0, "{what}: nothing stored");
        }
        // The honest accept stores each template once; a replay stores nothing more.
        for b in 0..2 {
            let stored = accept(&clients[b], &ids, &seeds[b], &y[1 - b]).await.expect("accept");
            assert_eq!(stored, TEMPLATES as i64);
            let again = accept(&clients[b], &ids, &seeds[b], &y[1 - b]).await.expect("replay");
            assert_eq!(again, 0, "P{b}: a replayed accept stores nothing");
            assert_eq!(opened_count(&operators[b]).await, TEMPLATES as i64);
        }

        // Sessions: a reused id is 23505; another session's key half, the other evaluator's
        // half, a tampered round message are 08P01 and end the session at that party.
        let session_a: [u8; 16] = rng.gen();
        let session_b: [u8; 16] = rng.gen();
        let list_a = masked_open(&clients, &keys, session_a, &probe).await.expect("open a");
        assert_eq!(list_a.len(), 16 * TEMPLATES);
        let list_b = masked_open(&clients, &keys, session_b, &probe).await.expect("open b");
        let reuse = seal_face_probe(&probe, session_a, None, &client_reply().public_key(), &keys, &mut rng).expect("seal");
        let (code, message) = refused_with(
            clients[0]
                .query(
                    "SELECT * FROM privmatch.face_masked_open($1, $2)",
                    &[&session_a.as_slice(), &reuse[0]],
                )
                .await,
            "reused session id",
        );
        assert_eq!(code, "23505", "{message}");
        let id_list = |bytes: &[u8]| -> Vec<[u8; 16]> {
            bytes.chunks_exact(16).map(|c| c.try_into().expect("16")).collect()
        };
        let halves_a = dealt_halves(&clients[2], &session_a, &id_list(&list_a)).await.expect("deal a");
        let halves_b = dealt_halves(&clients[2], &session_b, &id_list(&list_b)).await.expect("deal b");
        let (code, message) =
            refused_with(masked_keys(&clients[0], &session_a, &halves_b[0]).await, "B's half for A");
        assert_eq!(code, "08P01", "{message}");
        let (code, message) = refused_with(
            masked_keys(&clients[0], &session_a, &halves_a[0]).await,
            "A at P0 after a refused half",
        );
        assert_eq!(code, "42704", "the refused step ended session A at P0: {message}");
        let (code, message) =
            refused_with(masked_keys(&clients[1], &session_a, &halves_a[0]).await, "P0's half at P1");
        assert_eq!(code, "08P01", "{message}");

        // Session B, honestly, up to a tampered round-2 message at P1.
        let x0 = masked_keys(&clients[0], &session_b, &halves_b[0]).await.expect("keys P0");
        let x1 = masked_keys(&clients[1], &session_b, &halves_b[1]).await.expect("keys P1");
        let (code, message) =
            refused_with(masked_round(&clients[1], &session_b, 2, &tampered(&x0)).await, "tampered X");
        assert_eq!(code, "08P01", "{message}");
        let (code, _) =
            refused_with(masked_round(&clients[1], &session_b, 2, &x0).await, "B at P1 after");
        assert_eq!(code, "42704");

        // A third session, honest from end to end: the plaintext answers.
        let session_c: [u8; 16] = rng.gen();
        let list_c = masked_open(&clients, &keys, session_c, &probe).await.expect("open c");
        let halves = dealt_halves(&clients[2], &session_c, &id_list(&list_c)).await.expect("deal c");
        let x0 = masked_keys(&clients[0], &session_c, &halves[0]).await.expect("keys P0");
        let x1c = masked_keys(&clients[1], &session_c, &halves[1]).await.expect("keys P1");
        assert_ne!(x1, x1c, "fresh keys per session");
        let z0 = masked_round(&clients[0], &session_c, 2, &x1c).await.expect("z0");
        let z1 = masked_round(&clients[1], &session_c, 2, &x0).await.expect("z1");
        let o0 = masked_round(&clients[0], &session_c, 3, &z1).await.expect("o0");
        let o1 = masked_round(&clients[1], &session_c, 3, &z0).await.expect("o1");
        let bits = open_bits(&keys, &session_c, &o0, &o1, None);
        assert_eq!(bits.len(), TEMPLATES);
        let mut matched = 0;
        for (subject, bit) in &bits {
            let template = &records.iter().find(|r| &r.0 == subject).expect("subject").1;
            let expected = plaintext_match(Metric::Cosine, &probe, template, theta_q);
            assert_eq!(*bit, expected, "{subject}");
            matched += usize::from(*bit);
        }
        assert!(matched >= 1, "the recapture of {} matches", records[5].0);
        let (code, _) =
            refused_with(masked_round(&clients[0], &session_c, 3, &z1).await, "finished session");
        assert_eq!(code, "42704");
        // Nothing of the refused steps reached the opened templates.
        for operator in &operators {
            assert_eq!(opened_count(operator).await, TEMPLATES as i64);
        }
    });
}

/// Everything the coordinator sends and receives in one masked session, as its role drives
/// it the way `coordinator/src/face/driver.rs` does (an identification: open at P0, open at
/// P1 with P0's list, P2's dealing for the list; a verification: opens at P0 and P1 and P2's
/// dealing from the session id; then keys, rounds 2 and 3), together with the client's HTTP
/// request body and the coordinator's answer to it: every parameter of every call to P0, P1
/// and P2, and every byte string of every answer. Also P0's and P1's round-3 outputs and a
/// verification's round-2 messages from the opens.
struct Captured {
    /// What the coordinator sends: the client's answer, every SQL argument to every party.
    sent: Vec<Vec<u8>>,
    /// What the coordinator receives: the client's request, every answer of every party.
    received: Vec<Vec<u8>>,
    outputs: [Vec<u8>; 2],
    /// A verification's sealed round-2 messages (X_b ‖ Y'_b), as the opens answered them.
    messages: Option<[Vec<u8>; 2]>,
}

async fn captured_session(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    session: [u8; 16],
    subject: Option<&str>,
    probe: &[i32],
) -> Captured {
    captured_session_knowing(clients, keys, session, subject, None, probe).await
}

/// [`captured_session`] with a probe that names the compared-subject list the client knows
/// (`known`, its subjects digest).
async fn captured_session_knowing(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    session: [u8; 16],
    subject: Option<&str>,
    known: Option<&[u8; 32]>,
    probe: &[i32],
) -> Captured {
    use privmatch_api::face::{
        FaceIdentifyBody, FaceIdentifyResponse, FaceVerifyBody, FaceVerifyResponse,
    };
    use privmatch_api::wire::to_base64;
    let (mut sent, mut received): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (Vec::new(), Vec::new());
    let mut rng = ChaCha20Rng::from_entropy();
    let sealed = seal_face_probe_knowing(
        probe,
        session,
        subject,
        known,
        &client_reply().public_key(),
        keys,
        &mut rng,
    )
    .expect("seal probe");
    // The client's request, as the client library sends it.
    let probes = [to_base64(&sealed[0]), to_base64(&sealed[1])];
    let body = match subject {
        Some(_) => serde_json::to_vec(&FaceVerifyBody {
            session: hex::encode(session),
            probes,
            subject: None,
        }),
        None => serde_json::to_vec(&FaceIdentifyBody {
            session: hex::encode(session),
            probes,
        }),
    }
    .expect("json");
    received.push(body);
    let open = "SELECT comparisons, bundle_ids, digest, masked_probe \
                FROM privmatch.face_masked_open($1, $2, $3)";
    let answer = |row: &tokio_postgres::Row, received: &mut Vec<Vec<u8>>| {
        received.push(row.get::<_, i32>(0).to_le_bytes().to_vec());
        received.push(row.get(1));
        received.push(row.get(2));
        received.extend(row.get::<_, Option<Vec<u8>>>(3));
        (row.get::<_, Vec<u8>>(1), row.get::<_, Option<Vec<u8>>>(3))
    };
    let none: Option<Vec<u8>> = None;
    sent.extend([session.to_vec(), sealed[0].clone()]);
    let row = clients[0]
        .query_one(open, &[&session.as_slice(), &sealed[0], &none])
        .await
        .expect("open at P0");
    let (ids, opened_x0) = answer(&row, &mut received);
    let expect = subject.is_none().then(|| ids.clone());
    sent.extend([session.to_vec(), sealed[1].clone()]);
    sent.extend(expect.clone());
    let row = clients[1]
        .query_one(open, &[&session.as_slice(), &sealed[1], &expect])
        .await
        .expect("open at P1");
    let (_, opened_x1) = answer(&row, &mut received);
    let halves = match subject {
        Some(_) => {
            sent.push(session.to_vec());
            dealt_halves_for(&clients[2], KeysFor::Verification(session), &[])
                .await
                .expect("deal verification")
        }
        None => {
            let list: Vec<[u8; 16]> = ids
                .chunks_exact(16)
                .map(|c| c.try_into().expect("16"))
                .collect();
            sent.push(session.to_vec());
            sent.extend(list.iter().map(|id| id.to_vec()));
            dealt_halves(&clients[2], &session, &list)
                .await
                .expect("deal")
        }
    };
    received.extend(halves.iter().flatten().cloned());
    sent.extend(halves.iter().flatten().cloned());
    // A verification's messages went out with the opens: its keys step and round 2 are one
    // call, as the coordinator runs it; an identification's keys answer its masked probe.
    let messages = match (&opened_x0, &opened_x1) {
        (Some(a), Some(b)) => Some([a.clone(), b.clone()]),
        _ => None,
    };
    let (x0, x1, z0, z1) = match (opened_x0, opened_x1) {
        (Some(x0), Some(x1)) => {
            let z0 = keyed_round(&clients[0], &session, &halves[0], &x1)
                .await
                .expect("z0");
            let z1 = keyed_round(&clients[1], &session, &halves[1], &x0)
                .await
                .expect("z1");
            (x0, x1, z0, z1)
        }
        (None, None) => {
            let x0 = masked_keys(&clients[0], &session, &halves[0])
                .await
                .expect("keys P0");
            let x1 = masked_keys(&clients[1], &session, &halves[1])
                .await
                .expect("keys P1");
            let z0 = masked_round(&clients[0], &session, 2, &x1)
                .await
                .expect("z0");
            let z1 = masked_round(&clients[1], &session, 2, &x0)
                .await
                .expect("z1");
            (x0, x1, z0, z1)
        }
        _ => panic!("one evaluator answered a masked probe at the open, the other not"),
    };
    let o0 = masked_round(&clients[0], &session, 3, &z1)
        .await
        .expect("o0");
    let o1 = masked_round(&clients[1], &session, 3, &z0)
        .await
        .expect("o1");
    received.extend([
        x0.clone(),
        x1.clone(),
        z0.clone(),
        z1.clone(),
        o0.clone(),
        o1.clone(),
    ]);
    sent.extend([x0, x1, z0, z1]);
    sent.extend([2i32, 3].map(|r| r.to_le_bytes().to_vec()));
    // The coordinator's answer to the client.
    let outputs = vec![to_base64(&o0), to_base64(&o1)];
    let answer = match subject {
        Some(_) => serde_json::to_vec(&FaceVerifyResponse {
            comparisons: 1,
            outputs,
        }),
        None => serde_json::to_vec(&FaceIdentifyResponse {
            comparisons: (ids.len() / 16) as i64,
            outputs,
            bytes_sent: [0, 0],
            key_bytes: [0, 0],
            stocked: false,
        }),
    }
    .expect("json");
    sent.push(answer);
    Captured {
        sent,
        received,
        outputs: [o0, o1],
        messages,
    }
}

/// Whether `name` (a subject id) appears in `captured` in the clear: as UTF-8, as hex (either
/// case), or as base64 (at each of the three alignments, so also inside a longer base64 text).
fn names_in_the_clear(captured: &[Vec<u8>], name: &str) -> bool {
    let bytes = name.as_bytes();
    let mut forms: Vec<Vec<u8>> = vec![
        bytes.to_vec(),
        hex::encode(bytes).into_bytes(),
        hex::encode_upper(bytes).into_bytes(),
    ];
    for shift in 0..3 {
        // Base64 of the name preceded by `shift` bytes: the characters that depend on the
        // name only (drop those mixing in neighbours at either end).
        let mut padded = vec![0u8; shift];
        padded.extend_from_slice(bytes);
        let text = privmatch_api::wire::to_base64(&padded);
        let skip = if shift == 0 {
            0
        } else {
            (shift * 8).div_ceil(6)
        };
        let keep = (padded.len() * 8 / 6).saturating_sub(skip);
        if keep >= 4 {
            forms.push(text.as_bytes()[skip..skip + keep].to_vec());
        }
    }
    captured
        .iter()
        .any(|m| forms.iter().any(|f| privmatch_e2e::contains(m, f)))
}

/// Whether `bits` can be read off the capture in the clear: as 0/1 bytes or 0/1
/// little-endian words anywhere in one message, or as the word-wise sum of two messages at
/// the same offset (how the coordinator added the output shares before 0.11.0).
fn bits_in_the_clear(received: &[Vec<u8>], bits: &[bool]) -> bool {
    let as_bytes: Vec<u8> = bits.iter().map(|b| u8::from(*b)).collect();
    let as_words: Vec<u8> = bits
        .iter()
        .flat_map(|b| u32::from(*b).to_le_bytes())
        .collect();
    if received
        .iter()
        .any(|m| privmatch_e2e::contains(m, &as_bytes) || privmatch_e2e::contains(m, &as_words))
    {
        return true;
    }
    let n = 4 * bits.len();
    received.iter().any(|a| {
        received.iter().any(|b| {
            let len = a.len().min(b.len());
            (0..=len.saturating_sub(n)).step_by(4).any(|at| {
                len >= n
                    && (0..bits.len()).all(|k| {
                        let word = |m: &[u8]| {
                            let i = at + 4 * k;
                            u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]])
                        };
                        word(a).wrapping_add(word(b)) == u32::from(bits[k])
                    })
            })
        })
    })
}

/// Issue 34, "a capture of everything the coordinator sends and receives during face sessions
/// contains no subject id, match bit or score in the clear" (docs/protocols/face.md §13,
/// §14): the coordinator's role drives an identification and two verifications the way the
/// driver does, recording every request and answer in both directions (the client's request
/// and the answer it gets, every argument to P0, P1 and the dealer P2 and every answer of
/// theirs). No enrolled subject id is in it (as text, hex or base64), no comparison bit (the
/// round-3 outputs are sealed to the client's reply key and do not add up to the bits) and no
/// score (the quantised inner products, as words or text) — while the client opens the
/// outputs to exactly the plaintext answers, with the compared subjects read from inside
/// them. Before 0.12.0 the verified subject was a request parameter and every open answered
/// the compared subjects (`names_in_the_clear` finds them); before 0.11.0 the round-3 answers
/// were the output shares themselves, whose word-wise sum is the bit vector
/// (`bits_in_the_clear` finds them). A relay that rewrites, swaps or replays what it relays is
/// refused, naming the party.
#[test]
fn the_coordinator_receives_sealed_outputs_and_no_match_bit() {
    const DIM: usize = 128;
    const TEMPLATES: usize = 16;
    let cluster = Cluster::start("face-sealed-outputs", 38);
    let keys = cluster.party_keys();
    let q = Quantizer::new(DIM).expect("dim");
    let mut rng = ChaCha20Rng::seed_from_u64(38);
    let (floats, records) = population(&mut rng, &q, TEMPLATES);
    let probe = q
        .quantize(&recapture(&mut rng, &floats[3], 0.3))
        .expect("q");
    let m2 = f64::from(q.magnitude()).powi(2);
    let theta_q = dot(&probe, &records[3].1) - 1;
    cluster.block_on(async {
        let clients = cluster.clients().await;
        enroll(&clients, &keys, &records).await;
        configure(
            &cluster,
            &clients,
            &keys,
            Metric::Cosine,
            DIM,
            theta_q as f64 / m2,
        )
        .await;
        // The one opening of the templates, as the coordinator runs it.
        let ids: Vec<Vec<u8>> = clients[0]
            .query_one("SELECT privmatch.face_masked_pending()", &[])
            .await
            .expect("pending")
            .get(0);
        let seeds = [
            sealed_seeds(&clients[2], 0, &ids).await,
            sealed_seeds(&clients[2], 1, &ids).await,
        ];
        let y = [
            prepare(&clients[0], &ids, &seeds[0])
                .await
                .expect("prepare P0"),
            prepare(&clients[1], &ids, &seeds[1])
                .await
                .expect("prepare P1"),
        ];
        for b in 0..2 {
            accept(&clients[b], &ids, &seeds[b], &y[1 - b])
                .await
                .expect("accept");
        }

        let expected = |subject: &str| {
            let template = &records.iter().find(|r| r.0 == subject).expect("subject").1;
            plaintext_match(Metric::Cosine, &probe, template, theta_q)
        };
        // An identification and two verifications (the genuine subject, another one).
        let mut cases = vec![(None, 0u8)];
        cases.push((Some(records[3].0.as_str()), 1));
        cases.push((Some(records[7].0.as_str()), 2));
        let mut matched = 0;
        for (subject, tag) in cases {
            let session = [tag; 16];
            let c = captured_session(&clients, &keys, session, subject, &probe).await;
            let all: Vec<Vec<u8>> = c.sent.iter().chain(&c.received).cloned().collect();
            // No enrolled subject id, in either direction, in any form.
            for (name, _) in &records {
                assert!(
                    !names_in_the_clear(&all, name),
                    "{subject:?}: subject {name} is in what the coordinator sends or receives"
                );
            }
            // The search can fail: a capture that holds a name is caught.
            let mut leaky = all.clone();
            leaky.push(format!("{{\"subject\":\"{}\"}}", records[3].0).into_bytes());
            assert!(names_in_the_clear(&leaky, &records[3].0));
            leaky.push(
                privmatch_api::wire::to_base64(format!("xy{}", records[9].0).as_bytes())
                    .into_bytes(),
            );
            assert!(names_in_the_clear(&leaky, &records[9].0));
            // No score: the quantised inner product of the probe with any template (the value
            // the sign gate compares with θ), as a little-endian word in an answer of the
            // evaluators or the relayed outputs, nor as a JSON number (text after ':', ',' or
            // '[', which base64 and hex never hold; scores of five digits or more, so that
            // ciphertext does not spell one by chance).
            let scores: Vec<i64> = records.iter().map(|(_, t)| dot(&probe, t)).collect();
            let answers: Vec<Vec<u8>> = c.received[1..]
                .iter()
                .filter(|m| m.len() < 4096)
                .cloned()
                .collect();
            for score in &scores {
                let word = (*score as i32).to_le_bytes();
                assert!(
                    !answers.iter().any(|m| privmatch_e2e::contains(m, &word)),
                    "{subject:?}: score {score} as a word"
                );
                if score.abs() >= 10_000 {
                    for lead in [":", ",", "["] {
                        let text = format!("{lead}{score}");
                        assert!(
                            !all.iter()
                                .any(|m| privmatch_e2e::contains(m, text.as_bytes())),
                            "{subject:?}: score {score} as text"
                        );
                    }
                }
            }
            // A verification: the coordinator learns that one happened and nothing that names
            // or identifies whom: no bundle id, no digest, messages of one fixed length (the
            // dimension's) for every subject.
            if let Some(messages) = &c.messages {
                let fixed = 2 * 4 * DIM + 32;
                for m in messages {
                    assert!(
                        m.len() > fixed && m.len() <= fixed + 64,
                        "{} bytes",
                        m.len()
                    );
                }
            }
            let result = open_face_result(
                [&keys[0], &keys[1]],
                &client_reply(),
                &session,
                [&c.outputs[0], &c.outputs[1]],
                subject,
            )
            .expect("the client opens the sealed outputs");
            let bits_expected: Vec<bool> = result.subjects.iter().map(|s| expected(s)).collect();
            match subject {
                Some(s) => assert_eq!(result.subjects, [s]),
                None => {
                    let mut names = result.subjects.clone();
                    names.sort();
                    let mut enrolled: Vec<String> =
                        records.iter().map(|(n, _)| n.clone()).collect();
                    enrolled.sort();
                    assert_eq!(names, enrolled, "the identification lists every subject");
                }
            }
            assert_eq!(result.bits, bits_expected, "{subject:?}");
            matched += bits_expected.iter().filter(|b| **b).count();
            // A verification's output has one length whatever the subject.
            if subject.is_some() {
                for o in &c.outputs {
                    assert_eq!(o.len(), sealed_output_len(1), "{subject:?}");
                }
            }
            // No bit in the clear anywhere in the capture (a verification's bit as well: the
            // capture is checked for the exact vector, of length 1 there).
            if bits_expected.len() > 1 {
                assert!(
                    !bits_in_the_clear(&c.received, &bits_expected),
                    "{subject:?}: the comparison bits can be read off what the coordinator received"
                );
            } else {
                // One bit: check that the two round-3 answers do not add up to 0 or 1 in any
                // word (a one-word sum is 0 or 1 by chance with probability 2^-31 per offset).
                let [o0, o1] = &c.outputs;
                let words = |m: &[u8]| -> Vec<u32> {
                    m.chunks_exact(4)
                        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                        .collect()
                };
                let sums: Vec<u32> = words(o0)
                    .iter()
                    .zip(words(o1))
                    .map(|(a, b)| a.wrapping_add(b))
                    .collect();
                assert!(
                    sums.iter().all(|s| *s > 1),
                    "{subject:?}: a share sum is a bit"
                );
            }
            // The coordinator holds no key that opens them: a key of its own does not.
            let coordinator = PartySecretKey::from_bytes([0x17; 32]);
            for ((party, key), output) in PartyIndex::ALL.iter().zip(&keys).zip(&c.outputs) {
                assert!(
                    open_face_reply(*party, key, &coordinator, &session, output).is_err(),
                    "{subject:?}: {party}'s output opens without the client's key"
                );
            }
            // A relay that rewrites an output, swaps the two, or claims another subject's
            // verification is refused by the client, naming the party.
            let open = |o0: &[u8], o1: &[u8], claimed: Option<&str>| {
                open_face_result(
                    [&keys[0], &keys[1]],
                    &client_reply(),
                    &session,
                    [o0, o1],
                    claimed,
                )
            };
            let mut altered = c.outputs[1].clone();
            altered[40] ^= 1;
            let err = open(&c.outputs[0], &altered, subject).expect_err("altered output");
            assert!(
                matches!(err, FaceError::SealedOutput { party: 1, .. }),
                "{err}"
            );
            assert!(err.to_string().contains("P1"), "{err}");
            let err = open(&c.outputs[1], &c.outputs[0], subject).expect_err("swapped outputs");
            assert!(
                matches!(err, FaceError::SealedOutput { party: 0, .. }),
                "{err}"
            );
            if subject.is_some() {
                assert_eq!(
                    open(&c.outputs[0], &c.outputs[1], Some(&records[11].0)),
                    Err(FaceError::WrongTarget),
                    "the outputs bind the subject sealed in the probe"
                );
            }
        }
        assert!(
            matched >= 2,
            "the recapture matches its subject in both sessions"
        );

        // An identification by a client that knows the compared list (from the first one):
        // the evaluators seal the shares and the list's digest only, the client maps the bits
        // onto its own copy. A probe naming another list's digest gets the listing again.
        let mut known = KnownSubjects::default();
        let first = captured_session(&clients, &keys, [12u8; 16], None, &probe).await;
        let open_knowing = |c: &Captured, session: [u8; 16], known: &mut KnownSubjects| {
            open_face_identification(
                [&keys[0], &keys[1]],
                &client_reply(),
                &session,
                [&c.outputs[0], &c.outputs[1]],
                known,
            )
        };
        let bits = open_knowing(&first, [12u8; 16], &mut known).expect("listed");
        assert!(first.outputs[0].len() > sealed_output_len(TEMPLATES));
        let digest = known.digest.expect("the client keeps the list's digest");
        let again =
            captured_session_knowing(&clients, &keys, [13u8; 16], None, Some(&digest), &probe)
                .await;
        for o in &again.outputs {
            assert_eq!(o.len(), sealed_output_len(TEMPLATES), "no listing");
        }
        assert_eq!(
            open_knowing(&again, [13u8; 16], &mut known),
            Ok(bits.clone())
        );
        let bits_expected: Vec<bool> = known.subjects.iter().map(|s| expected(s)).collect();
        assert_eq!(bits, bits_expected);
        let stale = [0x5au8; 32];
        let relisted =
            captured_session_knowing(&clients, &keys, [14u8; 16], None, Some(&stale), &probe).await;
        assert_eq!(relisted.outputs[0].len(), first.outputs[0].len());
        // Without the list, an unlisted answer does not open: the subjects come from the
        // parties only.
        let err = open_knowing(&again, [13u8; 16], &mut KnownSubjects::default())
            .expect_err("no list to map the bits onto");
        assert!(matches!(err, FaceError::SealedOutput { .. }), "{err}");

        // The relay rewrites a verification's round-2 messages (X_b ‖ Y'_b, sent from the
        // opens) or its keys: P0 given its own message back, a tampered one, P1's message of
        // another session, or the keys P2 dealt for another session. Each is refused (08P01)
        // at P0, which then drops the session.
        let opened = |session: [u8; 16]| {
            let (clients, keys, probe, subject) = (&clients, &keys, &probe, &records[3].0);
            async move { verification_opened(clients, keys, session, subject, probe).await }
        };
        let other = opened([20u8; 16]).await;
        for (n, attack) in ["reflected", "tampered", "replayed", "other keys"]
            .into_iter()
            .enumerate()
        {
            let session = [21 + n as u8; 16];
            let v = opened(session).await;
            let keys_for_p0 = if attack == "other keys" {
                &other.halves[0]
            } else {
                &v.halves[0]
            };
            let result = match masked_keys(&clients[0], &session, keys_for_p0).await {
                Err(e) => Err(e),
                Ok(_) => {
                    let inbound = match attack {
                        "reflected" => v.messages[0].clone(),
                        "tampered" => tampered(&v.messages[1]),
                        "replayed" => other.messages[1].clone(),
                        _ => v.messages[1].clone(),
                    };
                    masked_round(&clients[0], &session, 2, &inbound).await
                }
            };
            let (code, message) = refused_with(result, attack);
            assert_eq!(code, "08P01", "{attack}: {message}");
        }
        // The same through the one call the coordinator makes (keys and round 2 at once): a
        // tampered message is refused there too, and an identification, whose masked probe
        // must reach the peer between the two steps, is refused (22023).
        let session = [25u8; 16];
        let v = opened(session).await;
        let (code, message) = refused_with(
            keyed_round(
                &clients[0],
                &session,
                &v.halves[0],
                &tampered(&v.messages[1]),
            )
            .await,
            "tampered, in one call",
        );
        assert_eq!(code, "08P01", "{message}");
        let session = [26u8; 16];
        let ids: Vec<[u8; 16]> = masked_open(&clients, &keys, session, &probe)
            .await
            .expect("open")
            .chunks_exact(16)
            .map(|c| c.try_into().expect("16"))
            .collect();
        let halves = dealt_halves(&clients[2], &session, &ids)
            .await
            .expect("deal");
        let (code, message) = refused_with(
            keyed_round(&clients[0], &session, &halves[0], &[0u8; 64]).await,
            "an identification in one call",
        );
        assert_eq!(code, "22023", "{message}");
        // A verification session takes no identification keys: a coordinator that guesses the
        // template (it knows every bundle id from the identifications) and deals for it with
        // face_dealer_identify is refused, so it cannot test which template is verified.
        let guess = [11u8; 16];
        let sealed = seal_face_probe(
            &probe,
            guess,
            Some(&records[3].0),
            &client_reply().public_key(),
            &keys,
            &mut rng,
        )
        .expect("seal");
        let none: Option<Vec<u8>> = None;
        let row = clients[0]
            .query_one(
                "SELECT bundle_ids, digest FROM privmatch.face_masked_open($1, $2, $3)",
                &[&guess.as_slice(), &sealed[0], &none],
            )
            .await
            .expect("open");
        assert!(row.get::<_, Vec<u8>>(0).is_empty() && row.get::<_, Vec<u8>>(1).is_empty());
        // The right guess: the verified subject's own template (read here as P0's owner).
        let owner = cluster.connect(0).await;
        let right: Vec<u8> = owner
            .query_one(
                "SELECT bundle_id FROM privmatch.face_templates WHERE subject = $1",
                &[&records[3].0],
            )
            .await
            .expect("bundle id")
            .get(0);
        let right: [u8; 16] = right.try_into().expect("16");
        let halves = dealt_halves(&clients[2], &guess, &[right])
            .await
            .expect("deal");
        let (code, message) = refused_with(
            masked_keys(&clients[0], &guess, &halves[0]).await,
            "guessed keys",
        );
        assert_eq!(code, "08P01", "{message}");
        // Every bundle id is known to the coordinator from identifications (not who it is).
        assert!(captured_ids(&clients, &keys, &probe).await.contains(&right));
    });
}

/// A verification opened at P0 and P1 and dealt at P2, as the coordinator runs it, before
/// any keys step: the evaluators' sealed round-2 messages and P2's key halves.
struct OpenedVerification {
    messages: [Vec<u8>; 2],
    halves: [Vec<Vec<u8>>; 2],
}

async fn verification_opened(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    session: [u8; 16],
    subject: &str,
    probe: &[i32],
) -> OpenedVerification {
    let mut rng = ChaCha20Rng::from_entropy();
    let sealed = seal_face_probe(
        probe,
        session,
        Some(subject),
        &client_reply().public_key(),
        keys,
        &mut rng,
    )
    .expect("seal");
    let mut messages = [Vec::new(), Vec::new()];
    for b in 0..2 {
        let row = clients[b]
            .query_one(
                "SELECT masked_probe FROM privmatch.face_masked_open($1, $2)",
                &[&session.as_slice(), &sealed[b]],
            )
            .await
            .expect("open");
        messages[b] = row
            .get::<_, Option<Vec<u8>>>(0)
            .expect("a verification's message");
    }
    let halves = dealt_halves_for(&clients[2], KeysFor::Verification(session), &[])
        .await
        .expect("deal");
    OpenedVerification { messages, halves }
}

/// The bundle ids an identification compares (P0's open of a fresh identification session).
async fn captured_ids(
    clients: &[Client],
    keys: &[PartyPublicKey; 3],
    probe: &[i32],
) -> Vec<[u8; 16]> {
    let session: [u8; 16] = ChaCha20Rng::from_entropy().gen();
    masked_open(clients, keys, session, probe)
        .await
        .expect("open")
        .chunks_exact(16)
        .map(|c| c.try_into().expect("16"))
        .collect()
}
