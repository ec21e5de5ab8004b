//! Whole iris searches with every party scanning on the GPU: three in-process parties (store +
//! search service each, as in the engine worker), driven round by round through the sealed
//! messages the coordinator relays, against the plaintext matcher. Without a usable GPU the
//! test prints `SKIP: <reason>` and passes.
//!
//! What this does not cover: PostgreSQL, the engine socket and the coordinator process (the
//! e2e tests in `tests/` cover those with the CPU scan; the engine picks the backend through
//! `privmatch.gpu`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use privmatch_core::crypto::seal::PartyKeys;
use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::encoding::share_template;
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::policy::IrisPolicy;
use privmatch_core::iris::probe::{seal_iris_probe, ProbeContext};
use privmatch_core::iris::scan::{CpuScan, Interrupt};
use privmatch_core::iris::service::{RoundReply, SearchService};
use privmatch_core::iris::store::{IrisStore, StoredTemplate};
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate};
use privmatch_core::party::PartyIndex;
use privmatch_gpu::iris::scan::{GpuConfig, GpuScan};
use privmatch_gpu::GpuError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

const SEALED_AT: u64 = 1_700_000_000;
const TAU: f64 = 0.345;

struct Party {
    store: IrisStore,
    service: SearchService,
    gpu: Arc<GpuScan>,
    keys: PartyKeys,
}

fn plain_match(probe: &IrisTemplate, t: &IrisTemplate, max_rotation: i32) -> bool {
    (-max_rotation..=max_rotation).any(|k| {
        let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
        common > 0 && u64::from(hd) * 10_000 < 3_450 * u64::from(common)
    })
}

fn search(
    parties: &[Party],
    publics: &[PartyPublicKey; 3],
    probe: &IrisTemplate,
    params: SearchParams,
    rng: &mut ChaCha20Rng,
) -> RoundReply {
    let id: [u8; 16] = rng.gen();
    let context = ProbeContext {
        session: id,
        eye: Eye::Left,
        params,
        sealed_at: SEALED_AT,
    };
    let sealed = seal_iris_probe(probe, &context, publics, rng).expect("seal");
    let now = Instant::now();
    let mut messages: Vec<Vec<u8>> = parties
        .iter()
        .zip(&sealed)
        .map(|(p, s)| {
            p.service
                .start(
                    &p.store,
                    &p.keys,
                    id,
                    s,
                    IrisPolicy::from_threshold(params.threshold()).expect("policy"),
                    now,
                    SEALED_AT,
                    Interrupt::never(),
                )
                .expect("start")
                .message
        })
        .collect();
    for round in 0.. {
        let replies: Vec<RoundReply> = (0..3)
            .map(|i| {
                parties[i]
                    .service
                    .round(id, round, &messages[(i + 2) % 3], Instant::now())
                    .expect("round")
            })
            .collect();
        if !replies.iter().any(|r| matches!(r, RoundReply::Continue(_))) {
            assert!(replies.windows(2).all(|w| w[0] == w[1]), "{replies:?}");
            return replies.into_iter().next().expect("three replies");
        }
        messages = replies
            .into_iter()
            .map(|r| match r {
                RoundReply::Continue(m) => m,
                other => panic!("parties out of step: {other:?}"),
            })
            .collect();
    }
    unreachable!("the loop returns")
}

#[test]
fn three_parties_scanning_on_the_gpu_match_the_plaintext_reference() {
    let mut rng = ChaCha20Rng::seed_from_u64(2026);
    let secrets: [PartySecretKey; 3] = std::array::from_fn(|_| PartySecretKey::generate(&mut rng));
    let publics: [PartyPublicKey; 3] = std::array::from_fn(|i| secrets[i].public_key());
    let mut parties = Vec::new();
    for (i, secret) in secrets.into_iter().enumerate() {
        let cpu = CpuScan::detect(2);
        let gpu = match GpuScan::open(
            &GpuConfig::default(),
            cpu,
            Arc::new(|l: &str| eprintln!("{l}")),
        ) {
            Ok(g) => Arc::new(g),
            Err(GpuError::Unavailable(reason)) => {
                eprintln!("SKIP: no usable GPU ({reason})");
                return;
            }
            Err(e) => panic!("opening the GPU failed other than 'unavailable': {e}"),
        };
        parties.push(Party {
            store: IrisStore::new(PartyIndex::ALL[i]),
            service: SearchService::new(gpu.clone(), Duration::from_secs(120)),
            gpu,
            keys: PartyKeys {
                me: PartyIndex::ALL[i],
                secret,
                peers: publics.map(Some),
            },
        });
    }
    // 1,000 enrolled templates; the probes are near-duplicates of some of them (rotated,
    // with bit flips on both sides of the threshold) and fresh random templates.
    let enrolled: Vec<IrisTemplate> = (0..1_000).map(|_| random_template(&mut rng)).collect();
    for (i, t) in enrolled.iter().enumerate() {
        let shares = share_template(t, &mut rng).expect("share");
        for (p, share) in parties.iter_mut().zip(shares) {
            p.store
                .insert(StoredTemplate {
                    id: i as i64 + 1,
                    subject: format!("subject-{i:04}"),
                    eye: Eye::Left,
                    share,
                })
                .expect("insert");
        }
    }
    let mut probes = Vec::new();
    for (j, flip) in [0.1, 0.3, 0.33, 0.36].into_iter().enumerate() {
        let rotation = [-15, -4, 7, 15][j];
        probes.push(near_duplicate(
            &enrolled[97 * j + 3],
            flip,
            rotation,
            &mut rng,
        ));
    }
    probes.push(random_template(&mut rng));
    for max_rotation in [15, 0] {
        for probe in &probes {
            let expected: Vec<String> = enrolled
                .iter()
                .enumerate()
                .filter(|(_, t)| plain_match(probe, t, max_rotation))
                .map(|(i, _)| format!("subject-{i:04}"))
                .collect();
            let identify =
                SearchParams::new(SearchMode::Identify, max_rotation, TAU).expect("params");
            let got = search(&parties, &publics, probe, identify, &mut rng);
            assert_eq!(got, RoundReply::Identified(expected.clone()));
            let unique =
                SearchParams::new(SearchMode::Uniqueness, max_rotation, TAU).expect("params");
            let got = search(&parties, &publics, probe, unique, &mut rng);
            assert_eq!(got, RoundReply::Unique(expected.is_empty()));
            eprintln!(
                "±{max_rotation} columns: {} match(es), equal to the plaintext reference",
                expected.len()
            );
        }
    }
    for p in &parties {
        assert_eq!(
            p.gpu.fallback_reason(),
            None,
            "a party fell back to the CPU"
        );
    }
}
