//! Two in-process evaluators (service and in-memory template source each) and the dealer's
//! keys, running whole identifications and verifications through the calls the engine makes,
//! the outputs opened by the client and checked against the plaintext comparison.

use std::cell::Cell;

use super::*;
use crate::crypto::seal::PartySecretKey;
use crate::embedding::dot;
use crate::face::encoding::share_embedding;
use crate::face::encoding::test_support::{embedding, pairwise, seeded_keys};
use crate::face::funshade::DealerParams;
use crate::face::mask_dealer::seal_identification_key_chunks;
use crate::face::masked::{
    deal_identification, deal_verification, masked_template_share, TemplateMaskMaster,
};
use crate::face::quantize::plaintext_match;
use crate::face::reply::{open_face_identification, open_face_result, KnownSubjects};
use crate::face::Metric;
use rand::Rng;

const DIM: usize = 128;

/// One evaluator's tables, in memory.
#[derive(Default)]
struct MemorySource {
    rows: Vec<OpenedTemplate>,
    /// Enrolled but not opened here yet.
    pending: u64,
    version: u64,
    /// No dealer-masked tables (a catalog before them).
    old_catalog: bool,
    loads: Cell<usize>,
}

impl TemplateSource for MemorySource {
    fn has_masked_templates(&self) -> Result<bool, ServiceError> {
        Ok(!self.old_catalog)
    }
    fn set_version(&self) -> Result<Option<String>, ServiceError> {
        Ok((!self.old_catalog).then(|| format!("1:{}", self.version)))
    }
    fn opened_ids(&self, only: Option<&[BundleId]>) -> Result<Vec<BundleId>, ServiceError> {
        Ok(self
            .rows
            .iter()
            .map(|r| r.id)
            .filter(|id| only.is_none_or(|o| o.contains(id)))
            .collect())
    }
    fn enrolled_count(&self) -> Result<u64, ServiceError> {
        Ok(self.rows.len() as u64 + self.pending)
    }
    fn load(&self, ids: &[BundleId]) -> Result<Vec<OpenedTemplate>, ServiceError> {
        self.loads.set(self.loads.get() + 1);
        Ok(self
            .rows
            .iter()
            .filter(|r| ids.contains(&r.id))
            .map(|r| OpenedTemplate {
                id: r.id,
                subject: r.subject.clone(),
                opened: r.opened.clone(),
                seed: r.seed,
                norm: r.norm,
            })
            .collect())
    }
}

/// An identification's open of `session` over every held template, without options.
fn identification(session: [u8; 16], probe: EmbeddingShare, reply: &PartySecretKey) -> OpenRequest {
    OpenRequest {
        session,
        probe,
        reply_key: reply.public_key(),
        wanted: None,
        stock: None,
        known: None,
        verification: false,
        known_subjects: None,
    }
}

struct Evaluator {
    keys: PartyKeys,
    service: FaceService,
    source: MemorySource,
}

struct World {
    evaluators: [Evaluator; 2],
    secrets: [PartySecretKey; 3],
    publics: [PartyPublicKey; 3],
    master: TemplateMaskMaster,
    /// The plaintext templates by subject, in enrolment order.
    enrolled: Vec<(BundleId, String, Vec<i32>)>,
    rng: ChaCha20Rng,
}

fn world(seed: u64) -> World {
    let (mut rng, secrets, publics) = seeded_keys(seed);
    let master = TemplateMaskMaster::generate(&mut rng);
    let evaluators = std::array::from_fn(|b| Evaluator {
        keys: PartyKeys {
            me: PartyIndex::ALL[b],
            secret: secrets[b].clone(),
            peers: publics.map(Some),
        },
        service: FaceService::new(
            2,
            Duration::from_secs(60),
            Box::leak(Box::new(PairwiseCache::new())),
        ),
        source: MemorySource::default(),
    });
    World {
        evaluators,
        secrets,
        publics,
        master,
        enrolled: Vec::new(),
        rng,
    }
}

impl World {
    /// Enrols `template` for `subject` and opens it at both evaluators (the tables' rows).
    fn enroll(&mut self, subject: &str, template: Vec<i32>) -> BundleId {
        let id: BundleId = self.rng.gen();
        let shares = share_embedding(&template, &mut self.rng);
        let seeds = self.master.template_seeds(&id);
        let y: Vec<Vec<u32>> = (0..2)
            .map(|b| masked_template_share(&shares[b], &seeds[b]))
            .collect();
        let opened: Vec<u32> = y[0]
            .iter()
            .zip(&y[1])
            .map(|(a, c)| a.wrapping_add(*c))
            .collect();
        for (b, e) in self.evaluators.iter_mut().enumerate() {
            e.source.rows.push(OpenedTemplate {
                id,
                subject: subject.into(),
                opened: opened.clone(),
                seed: seeds[b],
                norm: shares[b].norm,
            });
            e.source.version += 1;
        }
        self.enrolled.push((id, subject.into(), template));
        id
    }

    fn delete(&mut self, id: &BundleId) {
        for e in &mut self.evaluators {
            e.source.rows.retain(|r| &r.id != id);
            e.source.version += 1;
        }
        self.enrolled.retain(|(i, ..)| i != id);
    }

    fn refresh(&self) {
        for e in &self.evaluators {
            e.service.refresh(e.keys.me, &e.source).unwrap();
        }
    }

    /// P2's pairwise secrets with evaluator `b`.
    fn dealer_to(&self, b: usize) -> PairwiseSecrets {
        pairwise(&self.secrets, &self.publics, 2, b)
    }

    /// Opens session `session` at both evaluators over `wanted` (every template: `None`).
    fn open(
        &mut self,
        session: [u8; 16],
        probe: &[i32],
        wanted: Option<Vec<BundleId>>,
        verification: bool,
        reply: &PartySecretKey,
    ) -> [Opened; 2] {
        let shares = share_embedding(probe, &mut self.rng);
        let now = Instant::now();
        std::array::from_fn(|b| {
            let e = &self.evaluators[b];
            let req = OpenRequest {
                wanted: wanted.clone(),
                verification,
                ..identification(session, shares[b].clone(), reply)
            };
            e.service.open(&e.keys, req, now).unwrap()
        })
    }

    /// Rounds 2 and 3 of an identification whose keys were given; the two sealed outputs.
    fn finish(&self, session: [u8; 16], x: [Vec<u8>; 2]) -> [Vec<u8>; 2] {
        let now = Instant::now();
        let z: [Vec<u8>; 2] = std::array::from_fn(|b| {
            self.evaluators[b]
                .service
                .round(session, 2, &x[1 - b], now)
                .unwrap()
        });
        std::array::from_fn(|b| {
            self.evaluators[b]
                .service
                .round(session, 3, &z[1 - b], now)
                .unwrap()
        })
    }

    /// A whole identification of `probe` over every template; the client's bits and subjects.
    fn identify(&mut self, compare: &Compare, probe: &[i32]) -> (Vec<bool>, Vec<String>) {
        let session: [u8; 16] = self.rng.gen();
        let reply = PartySecretKey::generate(&mut self.rng);
        self.refresh();
        let opened = self.open(session, probe, None, false, &reply);
        assert_eq!(
            opened[0].ids, opened[1].ids,
            "both evaluators compare one list"
        );
        let halves =
            deal_identification(&compare.params, &self.master, &opened[0].ids, &mut self.rng)
                .unwrap();
        let x: [Vec<u8>; 2] = std::array::from_fn(|b| {
            let chunks = seal_identification_key_chunks(
                &halves[b],
                KeysFor::Session(session),
                &self.dealer_to(b),
                1000,
                &mut self.rng,
            );
            let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            let e = &self.evaluators[b];
            e.service.keys(session, &chunks, Instant::now()).unwrap()
        });
        let sealed = self.finish(session, x);
        let mut known = KnownSubjects::default();
        let bits = open_face_identification(
            [&self.publics[0], &self.publics[1]],
            &reply,
            &session,
            [&sealed[0], &sealed[1]],
            &mut known,
        )
        .unwrap();
        (bits, known.subjects)
    }

    /// The plaintext answer of [`World::identify`], in the evaluators' (bundle id) order.
    fn expected(&self, compare: &Compare, probe: &[i32]) -> (Vec<bool>, Vec<String>) {
        let mut rows: Vec<_> = self.enrolled.iter().collect();
        rows.sort_by_key(|(id, ..)| *id);
        rows.iter()
            .map(|(_, subject, t)| (compare.matches(probe, t), subject.clone()))
            .unzip()
    }
}

/// The dealer's parameters and the plaintext comparison of a test.
struct Compare {
    params: DealerParams,
    threshold: i64,
}

impl Compare {
    fn matches(&self, probe: &[i32], template: &[i32]) -> bool {
        plaintext_match(self.params.metric(), probe, template, self.threshold)
    }
}

/// A probe and the cosine threshold halfway to its own dot product (a template equal to the
/// probe matches, a random one does not).
fn matching_setup(world: &mut World) -> (Vec<i32>, Compare) {
    let probe = embedding(&mut world.rng, DIM);
    let threshold = dot(&probe, &probe) / 2;
    let params = DealerParams::for_tests(Metric::Cosine, DIM, threshold);
    (probe, Compare { params, threshold })
}

#[test]
fn identifications_equal_the_plaintext_before_and_after_a_deletion() {
    let mut w = world(1);
    let (probe, compare) = matching_setup(&mut w);
    w.enroll("alice", probe.clone());
    let bob = embedding(&mut w.rng, DIM);
    let gone = w.enroll("bob", bob);
    for i in 0..4 {
        let t = embedding(&mut w.rng, DIM);
        w.enroll(&format!("s{i}"), t);
    }
    let want = w.expected(&compare, &probe);
    assert!(want.0.iter().any(|&b| b) && want.0.iter().any(|&b| !b));
    assert_eq!(w.identify(&compare, &probe), want);
    w.delete(&gone);
    let want = w.expected(&compare, &probe);
    assert_eq!(want.1.len(), 5);
    assert_eq!(w.identify(&compare, &probe), want);
    assert_eq!(
        w.evaluators[0].service.active(),
        0,
        "round 3 ends the session"
    );
}

#[test]
fn a_verification_is_dealt_from_the_session_and_decides_like_the_plaintext() {
    let mut w = world(2);
    let (probe, compare) = matching_setup(&mut w);
    let same = w.enroll("alice", probe.clone());
    let bob = embedding(&mut w.rng, DIM);
    let other = w.enroll("bob", bob);
    for (id, subject) in [(same, "alice"), (other, "bob")] {
        let session: [u8; 16] = w.rng.gen();
        let reply = PartySecretKey::generate(&mut w.rng);
        for e in &w.evaluators {
            e.service
                .refresh_for_open(e.keys.me, Some(&[id]), &e.source)
                .unwrap();
        }
        let opened = w.open(session, &probe, Some(vec![id]), true, &reply);
        assert!(opened.iter().all(|o| !o.masked_probe.is_empty()));
        let from = [w.dealer_to(0), w.dealer_to(1)];
        let halves =
            deal_verification(&compare.params, &session, [&from[0], &from[1]], &mut w.rng).unwrap();
        let now = Instant::now();
        let z: Vec<Vec<u8>> = (0..2)
            .map(|b| {
                let chunks = seal_identification_key_chunks(
                    &halves[b],
                    KeysFor::Verification(session),
                    &from[b],
                    1 << 20,
                    &mut w.rng,
                );
                let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
                w.evaluators[b]
                    .service
                    .keyed_round(session, &chunks, &opened[1 - b].masked_probe, now)
                    .unwrap()
            })
            .collect();
        let sealed: Vec<Vec<u8>> = (0..2)
            .map(|b| {
                w.evaluators[b]
                    .service
                    .round(session, 3, &z[1 - b], now)
                    .unwrap()
            })
            .collect();
        let result = open_face_result(
            [&w.publics[0], &w.publics[1]],
            &reply,
            &session,
            [&sealed[0], &sealed[1]],
            Some(subject),
        )
        .unwrap();
        let template = &w.enrolled.iter().find(|(i, ..)| *i == id).unwrap().2;
        let want = compare.matches(&probe, template);
        assert_eq!(result.bits, vec![want], "{subject}");
    }
}

#[test]
fn a_stocked_dealing_is_claimed_once_by_the_list_it_was_dealt_for() {
    let mut w = world(3);
    let (probe, compare) = matching_setup(&mut w);
    w.enroll("alice", probe.clone());
    let bob = embedding(&mut w.rng, DIM);
    w.enroll("bob", bob);
    w.refresh();
    let stock: [u8; 16] = w.rng.gen();
    let ids = w.evaluators[0]
        .service
        .store
        .read()
        .unwrap()
        .as_ref()
        .unwrap()
        .set
        .ids()
        .to_vec();
    let halves = deal_identification(&compare.params, &w.master, &ids, &mut w.rng).unwrap();
    for (b, half) in halves.iter().enumerate() {
        let chunks = seal_identification_key_chunks(
            half,
            KeysFor::Stock(stock),
            &w.dealer_to(b),
            1 << 20,
            &mut w.rng,
        );
        let chunks: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
        let e = &w.evaluators[b];
        assert_eq!(e.service.keep_stock(&e.keys, stock, &chunks).unwrap(), 1);
        let again = e.service.keep_stock(&e.keys, stock, &chunks).unwrap_err();
        assert_eq!(again.kind, Refusal::BadParameter, "{again}");
    }
    let session: [u8; 16] = w.rng.gen();
    let reply = PartySecretKey::generate(&mut w.rng);
    let shares = share_embedding(&probe, &mut w.rng);
    let opened: Vec<Opened> = (0..2)
        .map(|b| {
            let e = &w.evaluators[b];
            let req = OpenRequest {
                stock: Some(stock),
                ..identification(session, shares[b].clone(), &reply)
            };
            e.service.open(&e.keys, req, Instant::now()).unwrap()
        })
        .collect();
    assert!(opened.iter().all(|o| o.claimed));
    let x: [Vec<u8>; 2] = std::array::from_fn(|b| {
        w.evaluators[b]
            .service
            .keys(session, &[], Instant::now())
            .unwrap()
    });
    let sealed = w.finish(session, x);
    let mut known = KnownSubjects::default();
    let bits = open_face_identification(
        [&w.publics[0], &w.publics[1]],
        &reply,
        &session,
        [&sealed[0], &sealed[1]],
        &mut known,
    )
    .unwrap();
    assert_eq!((bits, known.subjects), w.expected(&compare, &probe));
    // Claimed once: the stock is empty now.
    assert!(w.evaluators[0].service.stock().is_empty());
}

#[test]
fn refreshes_load_only_on_a_change_and_wait_for_pending_openings() {
    let mut w = world(4);
    let t = embedding(&mut w.rng, DIM);
    w.enroll("alice", t);
    let e = &w.evaluators[0];
    e.service.refresh(e.keys.me, &e.source).unwrap();
    assert_eq!((e.service.templates(), e.source.loads.get()), (1, 1));
    e.service.refresh(e.keys.me, &e.source).unwrap();
    assert_eq!(
        e.source.loads.get(),
        1,
        "an unchanged version reads nothing more"
    );
    w.evaluators[0].source.pending = 1;
    w.evaluators[0].source.version += 1;
    let e = &w.evaluators[0];
    let pending = e.service.refresh(e.keys.me, &e.source).unwrap_err();
    assert_eq!(pending.kind, Refusal::Retry, "{pending}");
    w.evaluators[0].source.old_catalog = true;
    let e = &w.evaluators[0];
    let old = e.service.refresh(e.keys.me, &e.source).unwrap_err();
    assert_eq!(old.kind, Refusal::NotReady, "{old}");
    // P2 holds no templates.
    let not_evaluator = e
        .service
        .refresh(PartyIndex::ALL[2], &MemorySource::default())
        .unwrap_err();
    assert_eq!(not_evaluator.kind, Refusal::NotReady);
}

#[test]
fn steps_out_of_order_replays_and_aborted_sessions_are_refused() {
    let mut w = world(5);
    let (probe, _compare) = matching_setup(&mut w);
    w.enroll("alice", probe.clone());
    w.refresh();
    let session: [u8; 16] = w.rng.gen();
    let reply = PartySecretKey::generate(&mut w.rng);
    w.open(session, &probe, None, false, &reply);
    let e = &w.evaluators[0];
    let early = e
        .service
        .round(session, 2, b"x", Instant::now())
        .unwrap_err();
    assert_eq!(early.kind, Refusal::NotReady, "{early}");
    let share = share_embedding(&probe, &mut w.rng)[0].clone();
    let req = identification(session, share, &reply);
    let replay = e
        .service
        .open(&e.keys, req, Instant::now())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(replay.kind, Refusal::BadParameter, "{replay}");
    let forged = e
        .service
        .keys(session, &[b"not from P2"], Instant::now())
        .unwrap_err();
    assert_eq!(forged.kind, Refusal::Protocol, "{forged}");
    // A refused step drops the session.
    let gone = e.service.keys(session, &[], Instant::now()).unwrap_err();
    assert_eq!(gone.kind, Refusal::UnknownSession, "{gone}");
    let session: [u8; 16] = w.rng.gen();
    w.open(session, &probe, None, false, &reply);
    let e = &w.evaluators[0];
    assert!(e.service.abort(&session));
    assert!(!e.service.abort(&session));
    let later = Instant::now() + Duration::from_secs(61);
    let p1 = &w.evaluators[1].service;
    assert_eq!(p1.active(), 2);
    p1.expire(later);
    assert_eq!(p1.active(), 0, "idle sessions expire");
}

#[test]
fn a_probe_of_another_dimension_is_a_bad_parameter() {
    let mut w = world(6);
    let t = embedding(&mut w.rng, DIM);
    w.enroll("alice", t);
    w.refresh();
    let reply = PartySecretKey::generate(&mut w.rng);
    let e = &w.evaluators[0];
    let wider = EmbeddingShare {
        elements: vec![0; DIM + 1],
        norm: 0,
    };
    let req = identification([1; 16], wider, &reply);
    let err = e
        .service
        .open(&e.keys, req, Instant::now())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind, Refusal::BadParameter);
    assert!(err.message.contains("dimension"), "{err}");
}

#[test]
fn a_verification_message_of_another_template_list_asks_for_a_retry() {
    // The peer's message carries its list digest: the same list gives the words, another
    // list (an enrolment or deletion in flight) 40001, a message too short a refusal.
    let digest = [7u8; 32];
    let mut plain = digest.to_vec();
    plain.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(
        peer_verification_words(&plain, &digest).unwrap(),
        &[1, 2, 3, 4]
    );
    let other = peer_verification_words(&plain, &[8u8; 32]).unwrap_err();
    assert_eq!(other.kind, Refusal::Retry, "{}", other.message);
    let short = peer_verification_words(&plain[..31], &digest).unwrap_err();
    assert_eq!(short.kind, Refusal::Protocol, "{}", short.message);
}
