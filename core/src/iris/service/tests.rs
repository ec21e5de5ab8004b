//! Three in-process parties (store + service each) running whole searches through the
//! sealed-message interface the coordinator uses, checked against the plaintext matcher.

use super::*;
use crate::crypto::seal::PartySecretKey;
use crate::iris::encoding::share_template;
use crate::iris::probe::{seal_iris_probe, ProbeContext};

/// The sealing time of the tests' probes; they are started at the same time.
const SEALED_AT: u64 = 1_700_000_000;

fn context(session: SessionId, eye: Eye, params: SearchParams) -> ProbeContext {
    ProbeContext {
        session,
        eye,
        params,
        sealed_at: SEALED_AT,
    }
}
use crate::iris::scan::CpuScan;
use crate::iris::store::StoredTemplate;
use crate::iris::synth::{near_duplicate, random_template};
use crate::iris::template::{masked_code_distance_counts, IrisTemplate};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

struct Party {
    store: IrisStore,
    service: SearchService,
    keys: PartyKeys,
}

struct World {
    parties: Vec<Party>,
    publics: [PartyPublicKey; 3],
    rng: ChaCha20Rng,
    next_id: i64,
}

fn world(seed: u64) -> World {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let secrets: [PartySecretKey; 3] = std::array::from_fn(|_| PartySecretKey::generate(&mut rng));
    let publics: [PartyPublicKey; 3] = std::array::from_fn(|i| secrets[i].public_key());
    let parties = secrets
        .into_iter()
        .enumerate()
        .map(|(i, secret)| Party {
            store: IrisStore::new(PartyIndex::ALL[i]),
            service: SearchService::new(Arc::new(CpuScan::detect(2)), Duration::from_secs(60)),
            keys: PartyKeys {
                me: PartyIndex::ALL[i],
                secret,
                peers: publics.map(Some),
            },
        })
        .collect();
    World {
        parties,
        publics,
        rng,
        next_id: 1,
    }
}

impl World {
    fn enroll(&mut self, subject: &str, eye: Eye, t: &IrisTemplate) {
        let shares = share_template(t, &mut self.rng).unwrap();
        for (party, share) in self.parties.iter_mut().zip(shares) {
            party
                .store
                .insert(StoredTemplate {
                    id: self.next_id,
                    subject: subject.into(),
                    eye,
                    share,
                })
                .unwrap();
        }
        self.next_id += 1;
    }

    fn session(&mut self) -> SessionId {
        self.rng.gen()
    }

    fn start(
        &mut self,
        id: SessionId,
        probe: &IrisTemplate,
        eye: Eye,
        params: SearchParams,
    ) -> Vec<StartReply> {
        let sealed = seal_iris_probe(
            probe,
            &context(id, eye, params),
            &self.publics,
            &mut self.rng,
        )
        .unwrap();
        start_all(&self.parties, id, &sealed, params)
    }

    /// Drives rounds as the coordinator does: party i's message goes to party i+1.
    fn finish(&mut self, id: SessionId, first: Vec<Vec<u8>>) -> (Vec<RoundReply>, u32) {
        finish_all(&self.parties, id, first)
    }

    fn search(&mut self, probe: &IrisTemplate, eye: Eye, params: SearchParams) -> RoundReply {
        let id = self.session();
        let starts = self.start(id, probe, eye, params);
        assert!(starts.windows(2).all(|w| w[0].digest == w[1].digest));
        let (replies, _) = self.finish(id, starts.into_iter().map(|s| s.message).collect());
        assert!(replies.windows(2).all(|w| w[0] == w[1]), "{replies:?}");
        assert_eq!(
            self.parties
                .iter()
                .map(|p| p.service.active())
                .sum::<usize>(),
            0
        );
        replies.into_iter().next().unwrap()
    }
}

/// Starts search `id` at the three parties with their sealed probes.
fn start_all(
    parties: &[Party],
    id: SessionId,
    sealed: &[Vec<u8>],
    params: SearchParams,
) -> Vec<StartReply> {
    let now = Instant::now();
    parties
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p.service
                .start(
                    &p.store,
                    &p.keys,
                    id,
                    &sealed[i],
                    policy_of(params),
                    now,
                    SEALED_AT,
                    Interrupt::never(),
                )
                .unwrap()
        })
        .collect()
}

/// Drives rounds as the coordinator does (party i's message goes to party i+1) until every
/// party answers its output; returns the outputs and the number of rounds.
fn finish_all(parties: &[Party], id: SessionId, first: Vec<Vec<u8>>) -> (Vec<RoundReply>, u32) {
    let mut messages = first;
    let mut round = 0;
    loop {
        let now = Instant::now();
        let replies: Vec<RoundReply> = (0..3)
            .map(|i| {
                let inbound = &messages[(i + 2) % 3];
                parties[i].service.round(id, round, inbound, now).unwrap()
            })
            .collect();
        if replies
            .iter()
            .all(|r| !matches!(r, RoundReply::Continue(_)))
        {
            return (replies, round + 1);
        }
        messages = replies
            .into_iter()
            .map(|r| match r {
                RoundReply::Continue(m) => m,
                other => panic!("parties out of step: {other:?}"),
            })
            .collect();
        round += 1;
    }
}

fn plain_match(probe: &IrisTemplate, t: &IrisTemplate, max_rotation: i32, tau: u32) -> bool {
    (-max_rotation..=max_rotation).any(|k| {
        let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
        common > 0 && u64::from(hd) * 10_000 < u64::from(tau) * u64::from(common)
    })
}

/// The threshold policy of a party that accepts probes sealed with `params`.
fn policy_of(params: SearchParams) -> IrisPolicy {
    IrisPolicy::from_threshold(params.threshold()).expect("policy")
}

fn params(mode: &str, max_rotation: i32) -> SearchParams {
    SearchParams::new(SearchMode::parse(mode).unwrap(), max_rotation, 0.345).unwrap()
}

#[test]
fn identification_and_uniqueness_match_the_plaintext_reference() {
    let mut w = world(11);
    let mut enrolled = Vec::new();
    for i in 0..40 {
        let t = random_template(&mut w.rng);
        let eye = if i % 4 == 0 { Eye::Right } else { Eye::Left };
        let subject = format!("subject-{i:02}");
        w.enroll(&subject, eye, &t);
        enrolled.push((subject, eye, t));
    }
    let mut probes: Vec<(IrisTemplate, Eye)> = Vec::new();
    for (i, (_, eye, t)) in enrolled.iter().enumerate().take(12) {
        let flip = [0.1, 0.3, 0.33, 0.36][i % 4];
        let rotation = (i as i32 % 31) - 15;
        probes.push((near_duplicate(t, flip, rotation, &mut w.rng), *eye));
    }
    probes.push((random_template(&mut w.rng), Eye::Left));
    for max_rotation in [0, 15] {
        for (probe, eye) in &probes {
            let expected: Vec<String> = enrolled
                .iter()
                .filter(|(_, e, t)| e == eye && plain_match(probe, t, max_rotation, 3450))
                .map(|(s, _, _)| s.clone())
                .collect();
            let got = w.search(probe, *eye, params("identify", max_rotation));
            assert_eq!(got, RoundReply::Identified(expected.clone()));
            let unique = w.search(probe, *eye, params("uniqueness", max_rotation));
            assert_eq!(unique, RoundReply::Unique(expected.is_empty()));
        }
    }
}

#[test]
fn identify_takes_21_rounds_with_31_rotations() {
    let mut w = world(12);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let id = w.session();
    let starts = w.start(id, &t, Eye::Left, params("identify", 15));
    let (replies, rounds) = w.finish(id, starts.into_iter().map(|s| s.message).collect());
    assert_eq!(rounds, 21);
    assert_eq!(replies[0], RoundReply::Identified(vec!["a".into()]));
}

#[test]
fn deleted_templates_are_not_matched_and_empty_eye_is_unique() {
    let mut w = world(13);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let other = random_template(&mut w.rng);
    w.enroll("b", Eye::Left, &other);
    assert_eq!(
        w.search(&t, Eye::Left, params("identify", 0)),
        RoundReply::Identified(vec!["a".into()])
    );
    for p in &mut w.parties {
        assert!(p.store.remove(1));
    }
    assert_eq!(
        w.search(&t, Eye::Left, params("identify", 0)),
        RoundReply::Identified(vec![])
    );
    assert_eq!(
        w.search(&t, Eye::Right, params("uniqueness", 15)),
        RoundReply::Unique(true)
    );
}

#[test]
fn different_sets_or_parameters_fail_authentication_instead_of_computing() {
    let mut w = world(14);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let other = random_template(&mut w.rng);
    w.enroll("b", Eye::Left, &other);
    // P2 misses a record: its digest differs and P0 cannot open its first message.
    w.parties[2].store.remove(2);
    let id = w.session();
    let starts = w.start(id, &t, Eye::Left, params("identify", 0));
    assert_ne!(starts[0].digest, starts[2].digest);
    let err = w.parties[0]
        .service
        .round(id, 0, &starts[2].message, Instant::now())
        .unwrap_err();
    assert!(matches!(err, SearchError::Channel { .. }), "{err}");
    // The failed session is gone.
    assert!(matches!(
        w.parties[0]
            .service
            .round(id, 0, &starts[2].message, Instant::now()),
        Err(SearchError::UnknownSession(_))
    ));
}

#[test]
fn tampered_replayed_or_reordered_messages_abort() {
    let mut w = world(15);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let id = w.session();
    let starts = w.start(id, &t, Eye::Left, params("identify", 0));
    let mut tampered = starts[2].message.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let now = Instant::now();
    assert!(w.parties[0].service.round(id, 0, &tampered, now).is_err());
    // P1: wrong round number.
    assert!(matches!(
        w.parties[1].service.round(id, 1, &starts[0].message, now),
        Err(SearchError::WrongRound { .. })
    ));
    // P2: a message from the wrong sender (P0's to P1).
    assert!(w.parties[2]
        .service
        .round(id, 0, &starts[0].message, now)
        .is_err());
    assert!(w.parties.iter().all(|p| p.service.active() == 0));
}

#[test]
fn session_ids_are_single_use_and_idle_sessions_expire() {
    let mut w = world(16);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let id = w.session();
    let params = params("identify", 0);
    let sealed =
        seal_iris_probe(&t, &context(id, Eye::Left, params), &w.publics, &mut w.rng).unwrap();
    let p = &mut w.parties[0];
    let now = Instant::now();
    p.service
        .start(
            &p.store,
            &p.keys,
            id,
            &sealed[0],
            policy_of(params),
            now,
            SEALED_AT,
            Interrupt::never(),
        )
        .unwrap();
    assert!(matches!(
        p.service.start(
            &p.store,
            &p.keys,
            id,
            &sealed[0],
            policy_of(params),
            now,
            SEALED_AT,
            Interrupt::never(),
        ),
        Err(SearchError::ReplayedSession(_))
    ));
    assert_eq!(p.service.expire(now + Duration::from_secs(30)), 0);
    assert_eq!(p.service.expire(now + Duration::from_secs(61)), 1);
    assert!(!p.service.abort(&id));
}

#[test]
fn messages_do_not_depend_on_the_secrets() {
    // Same shapes, same session schedule, different databases and probes: every message
    // has the same length in every round (what the coordinator and a party see beyond
    // ciphertext is lengths and timing of a fixed schedule).
    let mut lengths = Vec::new();
    for seed in [21, 22] {
        let mut w = world(seed);
        for i in 0..8 {
            let t = random_template(&mut w.rng);
            w.enroll(&format!("s{i}"), Eye::Left, &t);
        }
        let probe = random_template(&mut w.rng);
        let id = w.session();
        let starts = w.start(id, &probe, Eye::Left, params("identify", 15));
        let mut seen: Vec<usize> = starts.iter().map(|s| s.message.len()).collect();
        let mut messages: Vec<Vec<u8>> = starts.into_iter().map(|s| s.message).collect();
        for round in 0.. {
            let replies: Vec<RoundReply> = (0..3)
                .map(|i| {
                    w.parties[i]
                        .service
                        .round(id, round, &messages[(i + 2) % 3], Instant::now())
                        .unwrap()
                })
                .collect();
            if !matches!(replies[0], RoundReply::Continue(_)) {
                break;
            }
            messages = replies
                .into_iter()
                .map(|r| match r {
                    RoundReply::Continue(m) => m,
                    _ => unreachable!(),
                })
                .collect();
            seen.extend(messages.iter().map(Vec::len));
        }
        lengths.push(seen);
    }
    assert_eq!(lengths[0], lengths[1]);
}

#[test]
fn a_probe_runs_only_at_the_threshold_policy_and_while_fresh() {
    let mut w = world(17);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let sealed_params = params("uniqueness", 15);
    let id = w.session();
    let sealed = seal_iris_probe(
        &t,
        &context(id, Eye::Left, sealed_params),
        &w.publics,
        &mut w.rng,
    )
    .unwrap();
    let p = &mut w.parties[0];
    let now = Instant::now();
    // A party whose threshold policy is not the sealed threshold refuses the probe (the
    // parameters travel only sealed in it: nobody can run it in another mode or rotation range).
    assert!(matches!(
        p.service.start(
            &p.store,
            &p.keys,
            id,
            &sealed[0],
            IrisPolicy::from_ratio(0.2).expect("policy"),
            now,
            SEALED_AT,
            Interrupt::never(),
        ),
        Err(SearchError::ProbeRefused(_))
    ));
    // So is a probe kept past its lifetime, even in a session id never seen.
    let late = SEALED_AT + crate::iris::probe::PROBE_LIFETIME_SECS + 1;
    let other_id = w.rng.gen();
    let again = seal_iris_probe(
        &t,
        &context(other_id, Eye::Left, sealed_params),
        &w.publics,
        &mut w.rng,
    )
    .unwrap();
    let p = &mut w.parties[0];
    assert!(matches!(
        p.service.start(
            &p.store,
            &p.keys,
            other_id,
            &again[0],
            policy_of(sealed_params),
            now,
            late,
            Interrupt::never(),
        ),
        Err(SearchError::ProbeRefused(_))
    ));
}

#[test]
fn a_party_refuses_more_running_searches_than_its_limit_and_consumes_no_id() {
    let mut w = world(8);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let params = params("identify", 0);
    let now = Instant::now();
    let start = |w: &mut World, id| {
        let sealed =
            seal_iris_probe(&t, &context(id, Eye::Left, params), &w.publics, &mut w.rng).unwrap();
        let p = &mut w.parties[0];
        p.service.start(
            &p.store,
            &p.keys,
            id,
            &sealed[0],
            policy_of(params),
            now,
            SEALED_AT,
            Interrupt::never(),
        )
    };
    for _ in 0..MAX_ACTIVE_SEARCHES {
        let id = w.session();
        start(&mut w, id).expect("under the limit");
    }
    let id = w.session();
    assert!(matches!(
        start(&mut w, id),
        Err(SearchError::TooManySearches(MAX_ACTIVE_SEARCHES))
    ));
    // Once one ends, the same id starts: the refusal did not consume it.
    assert_eq!(
        w.parties[0].service.expire(now + Duration::from_secs(61)),
        MAX_ACTIVE_SEARCHES
    );
    start(&mut w, id).expect("after the others expired");
}

/// Runs one whole search over shared services (`&Party` only), as a request thread of the
/// engine does: starts at the three parties, then rounds until the output.
fn run_shared(
    parties: &[Party],
    id: SessionId,
    sealed: &[Vec<u8>],
    params: SearchParams,
) -> RoundReply {
    let first = start_all(parties, id, sealed, params)
        .into_iter()
        .map(|s| s.message)
        .collect();
    let (replies, _) = finish_all(parties, id, first);
    assert!(replies.windows(2).all(|w| w[0] == w[1]), "{replies:?}");
    replies.into_iter().next().unwrap()
}

#[test]
fn concurrent_searches_through_shared_services_match_the_plaintext_reference() {
    fn shared<T: Send + Sync>() {}
    shared::<SearchService>();
    shared::<IrisStore>();
    let mut w = world(21);
    let mut enrolled = Vec::new();
    for i in 0..30 {
        let t = random_template(&mut w.rng);
        let subject = format!("subject-{i:02}");
        w.enroll(&subject, Eye::Left, &t);
        enrolled.push((subject, t));
    }
    // Eight searches at once: near duplicates of enrolled templates and strangers, with and
    // without rotations, identification and uniqueness mixed.
    let mut jobs = Vec::new();
    for k in 0..8 {
        let probe = if k % 3 == 2 {
            random_template(&mut w.rng)
        } else {
            near_duplicate(&enrolled[k].1, 0.2, k as i32 - 4, &mut w.rng)
        };
        let p = params(
            if k % 2 == 0 { "identify" } else { "uniqueness" },
            15 * (k as i32 % 2),
        );
        let id = w.session();
        let sealed =
            seal_iris_probe(&probe, &context(id, Eye::Left, p), &w.publics, &mut w.rng).unwrap();
        let expected: Vec<String> = enrolled
            .iter()
            .filter(|(_, t)| plain_match(&probe, t, p.max_rotation(), 3450))
            .map(|(s, _)| s.clone())
            .collect();
        let want = match p.mode() {
            SearchMode::Identify => RoundReply::Identified(expected),
            SearchMode::Uniqueness => RoundReply::Unique(expected.is_empty()),
        };
        jobs.push((id, sealed, p, want));
    }
    let parties = &w.parties;
    std::thread::scope(|scope| {
        let running: Vec<_> = jobs
            .iter()
            .map(|(id, sealed, p, want)| {
                scope.spawn(move || assert_eq!(&run_shared(parties, *id, sealed, *p), want))
            })
            .collect();
        for r in running {
            r.join().unwrap();
        }
    });
    assert!(w.parties.iter().all(|p| p.service.active() == 0));
}

#[test]
fn admission_counts_searches_that_are_starting() {
    let mut w = world(22);
    for i in 0..3 {
        let t = random_template(&mut w.rng);
        w.enroll(&format!("s{i}"), Eye::Left, &t);
    }
    let p = &w.parties[0];
    // Holding MAX_ACTIVE_SEARCHES start slots (as that many starts in progress would) leaves
    // no room for another start, and the refused one leaves its session id unused.
    let slots: Vec<_> = (0..MAX_ACTIVE_SEARCHES)
        .map(|_| {
            p.service.table().starting += 1;
            p.service.busy(Busy::Starting)
        })
        .collect();
    let id = [7u8; 16];
    let refused = p.service.start(
        &p.store,
        &p.keys,
        id,
        b"not even a probe",
        IrisPolicy::default_policy(),
        Instant::now(),
        SEALED_AT,
        Interrupt::never(),
    );
    assert!(
        matches!(refused, Err(SearchError::TooManySearches(_))),
        "{refused:?}"
    );
    assert_eq!(p.service.active(), MAX_ACTIVE_SEARCHES);
    drop(slots);
    assert_eq!(p.service.active(), 0);
    assert!(!p.service.table().used.contains(&id));
}

#[test]
fn every_party_signs_its_output_and_seals_it_to_the_clients_reply_key() {
    use crate::crypto::party_sign::PartySigningKey;
    use crate::iris::output::{open_outputs, ExpectedSearch, IrisResult, OutputRefused};
    use crate::iris::probe::{seal_iris_probe_to, Disclosure, ReplyTo};
    let mut w = world(23);
    let t = random_template(&mut w.rng);
    let other = random_template(&mut w.rng);
    w.enroll("alice", Eye::Left, &t);
    w.enroll("bob", Eye::Left, &other);
    let signing =
        [0, 1, 2].map(|i| Some(PartySigningKey::derive(&w.parties[i].keys.secret).verifying_key()));
    let client = PartySecretKey::generate(&mut w.rng);
    for (mode, disclosure) in [
        ("identify", Disclosure::SealedOnly),
        ("uniqueness", Disclosure::SealedOnly),
        ("uniqueness", Disclosure::UniqueBitToCoordinator),
        ("uniqueness", Disclosure::UniqueBitForRecord([7; 32])),
    ] {
        let p = params(mode, 15);
        let id = w.session();
        let probe = near_duplicate(&t, 0.05, 3, &mut w.rng);
        let reply = ReplyTo {
            key: client.public_key(),
            disclosure,
        };
        let sealed = seal_iris_probe_to(
            &probe,
            &context(id, Eye::Left, p),
            &reply,
            &w.publics,
            &mut w.rng,
        )
        .unwrap();
        let starts = start_all(&w.parties, id, &sealed, p);
        let mut messages: Vec<Vec<u8>> = starts.into_iter().map(|s| s.message).collect();
        let mut round = 0;
        let outputs: Vec<SealedOutput> = loop {
            let replies: Vec<SealedRound> = (0..3)
                .map(|i| {
                    w.parties[i]
                        .service
                        .round_sealed(id, round, &messages[(i + 2) % 3], Instant::now())
                        .unwrap()
                })
                .collect();
            if let SealedRound::Continue(_) = &replies[0] {
                messages = replies
                    .into_iter()
                    .map(|r| match r {
                        SealedRound::Continue(m) => m,
                        other => panic!("out of step: {other:?}"),
                    })
                    .collect();
                round += 1;
                continue;
            }
            break replies
                .into_iter()
                .map(|r| match r {
                    SealedRound::Finished(o) => o,
                    other => panic!("out of step: {other:?}"),
                })
                .collect();
        };
        // What the coordinator relays: ciphertext, and the bit only where the client allowed it.
        for o in &outputs {
            assert!(!o.sealed.windows(5).any(|x| x == b"alice"));
            let disclosed = disclosure.discloses_bit().then_some(false);
            assert_eq!(o.disclosed_unique, disclosed);
        }
        let expected = ExpectedSearch {
            session: id,
            params: p,
            eye: Eye::Left,
        };
        let sealed: [&[u8]; 3] = std::array::from_fn(|i| outputs[i].sealed.as_slice());
        let opened = open_outputs(&expected, &w.publics, &signing, &client, sealed).unwrap();
        let result = match mode {
            "identify" => IrisResult::Identified(vec!["alice".into()]),
            _ => IrisResult::Unique(false),
        };
        assert_eq!(opened.result, result);
        assert_eq!(opened.entries, 2);
        // The client asked about another eye: refused, naming P0.
        let right = ExpectedSearch {
            eye: Eye::Right,
            ..expected
        };
        assert!(matches!(
            open_outputs(&right, &w.publics, &signing, &client, sealed),
            Err(OutputRefused::OtherSearch { .. })
        ));
        // Another client cannot open them.
        let stranger = PartySecretKey::generate(&mut w.rng);
        assert!(matches!(
            open_outputs(&expected, &w.publics, &signing, &stranger, sealed),
            Err(OutputRefused::Sealed { .. })
        ));
    }
}

/// One client's search in a batch: its session id, its reply key and its three sealed probes.
struct BatchedProbe {
    id: SessionId,
    client: PartySecretKey,
    sealed: Vec<Vec<u8>>,
}

impl BatchedProbe {
    /// The same sealed probe again (as a relay replays it).
    fn clone_for_test(&self) -> BatchedProbe {
        BatchedProbe {
            id: self.id,
            client: self.client.clone(),
            sealed: self.sealed.clone(),
        }
    }
}

impl World {
    /// Seals `probe` as a client of its own would (own session id, own reply key).
    fn batched_probe(&mut self, probe: &IrisTemplate, eye: Eye, p: SearchParams) -> BatchedProbe {
        self.probe_disclosing(probe, eye, p, crate::iris::probe::Disclosure::SealedOnly)
    }

    /// An enroll-if-unique request as the CLI seals one: the record's three envelopes (of
    /// `envelope_eye`) and a uniqueness probe of `eye` naming that record.
    fn enrolment_request(
        &mut self,
        t: &IrisTemplate,
        subject: &str,
        envelope_eye: Eye,
        p: SearchParams,
    ) -> (BatchedProbe, [Vec<u8>; 3]) {
        use crate::iris::binding::{enrolment_id, envelope_hashes};
        use crate::iris::enroll::seal_iris_enrollment;
        use crate::iris::probe::Disclosure;
        let (sealed, _) =
            seal_iris_enrollment(t, subject, envelope_eye, &self.publics, &mut self.rng).unwrap();
        let id = enrolment_id(&envelope_hashes([&sealed[0], &sealed[1], &sealed[2]]));
        let probe = self.probe_disclosing(t, Eye::Left, p, Disclosure::UniqueBitForRecord(id));
        (probe, sealed)
    }

    /// As [`World::batched_probe`], allowing `disclosure`.
    fn probe_disclosing(
        &mut self,
        probe: &IrisTemplate,
        eye: Eye,
        p: SearchParams,
        disclosure: crate::iris::probe::Disclosure,
    ) -> BatchedProbe {
        use crate::iris::probe::{seal_iris_probe_to, ReplyTo};
        let id = self.session();
        let client = PartySecretKey::generate(&mut self.rng);
        let reply = ReplyTo {
            key: client.public_key(),
            disclosure,
        };
        let sealed = seal_iris_probe_to(
            probe,
            &context(id, eye, p),
            &reply,
            &self.publics,
            &mut self.rng,
        )
        .unwrap();
        BatchedProbe {
            id,
            client,
            sealed: sealed.to_vec(),
        }
    }

    /// Runs `probes` as one batch declared with `p` and `eye`, as the coordinator does:
    /// each party's start replies and, per party, what it relays for each probe.
    fn run_batch(
        &mut self,
        probes: &[BatchedProbe],
        eye: Eye,
        p: SearchParams,
    ) -> (Vec<BatchStartReply>, Vec<Vec<Result<SealedOutput, String>>>) {
        self.run_enrolment_batch(probes, &[], eye, p)
    }

    /// As [`World::run_batch`] for a batch of enrol-if-unique requests: `envelopes[k]` is
    /// request k's three sealed enrolment envelopes (empty: a search batch).
    fn run_enrolment_batch(
        &mut self,
        probes: &[BatchedProbe],
        envelopes: &[[Vec<u8>; 3]],
        eye: Eye,
        p: SearchParams,
    ) -> (Vec<BatchStartReply>, Vec<Vec<Result<SealedOutput, String>>>) {
        let hashes: Vec<[u8; crate::iris::binding::ENVELOPE_HASHES_LEN]> = envelopes
            .iter()
            .map(|e| crate::iris::binding::envelope_hashes([&e[0], &e[1], &e[2]]))
            .collect();
        let batch = self.session();
        let now = Instant::now();
        let starts: Vec<BatchStartReply> = self
            .parties
            .iter()
            .enumerate()
            .map(|(i, party)| {
                let mine: Vec<(SessionId, &[u8])> = probes
                    .iter()
                    .map(|b| (b.id, b.sealed[i].as_slice()))
                    .collect();
                let enrolments: Vec<BatchEnrolment<'_>> = envelopes
                    .iter()
                    .zip(&hashes)
                    .map(|(e, h)| BatchEnrolment {
                        envelope: &e[i],
                        hashes: h,
                    })
                    .collect();
                let start = BatchStart {
                    enrolments: &enrolments,
                    batch,
                    params: p,
                    eye,
                    probes: &mine,
                };
                party
                    .service
                    .start_batch(
                        &party.store,
                        &party.keys,
                        &start,
                        policy_of(p),
                        now,
                        SEALED_AT,
                        Interrupt::never(),
                    )
                    .unwrap()
            })
            .collect();
        let mut messages: Vec<Vec<u8>> = starts.iter().map(|s| s.start.message.clone()).collect();
        let mut round = 0;
        loop {
            let replies: Vec<BatchRound> = (0..3)
                .map(|i| {
                    self.parties[i]
                        .service
                        .round_batch(batch, round, &messages[(i + 2) % 3], now)
                        .unwrap()
                })
                .collect();
            if let BatchRound::Continue(_) = &replies[0] {
                messages = replies
                    .into_iter()
                    .map(|r| match r {
                        BatchRound::Continue(m) => m,
                        other => panic!("out of step: {other:?}"),
                    })
                    .collect();
                round += 1;
                continue;
            }
            let outputs = replies
                .into_iter()
                .map(|r| match r {
                    BatchRound::Finished(o) => o,
                    other => panic!("out of step: {other:?}"),
                })
                .collect();
            assert!(self.parties.iter().all(|p| p.service.active() == 0));
            return (starts, outputs);
        }
    }

    /// The verifying keys of the three parties' output signatures.
    fn signing_keys(&self) -> [Option<crate::crypto::party_sign::PartyVerifyingKey>; 3] {
        use crate::crypto::party_sign::PartySigningKey;
        [0, 1, 2]
            .map(|i| Some(PartySigningKey::derive(&self.parties[i].keys.secret).verifying_key()))
    }
}

/// Opens probe `k`'s three relayed outputs with its client's key.
fn open_batched(
    w: &World,
    probes: &[BatchedProbe],
    outputs: &[Vec<Result<SealedOutput, String>>],
    k: usize,
    eye: Eye,
    p: SearchParams,
    client: &PartySecretKey,
) -> Result<crate::iris::output::IrisResult, crate::iris::output::OutputRefused> {
    use crate::iris::output::{open_outputs, ExpectedSearch};
    let expected = ExpectedSearch {
        session: probes[k].id,
        params: p,
        eye,
    };
    let sealed: [&[u8]; 3] = std::array::from_fn(|i| {
        outputs[i][k]
            .as_ref()
            .expect("an accepted probe has an output")
            .sealed
            .as_slice()
    });
    open_outputs(&expected, &w.publics, &w.signing_keys(), client, sealed).map(|o| o.result)
}

#[test]
fn a_batch_answers_every_probe_as_the_plaintext_matcher_sealed_to_its_own_client() {
    use crate::iris::output::{IrisResult, OutputRefused};
    let mut w = world(31);
    let mut enrolled = Vec::new();
    for i in 0..24 {
        let t = random_template(&mut w.rng);
        let subject = format!("s{i:02}");
        w.enroll(&subject, Eye::Left, &t);
        enrolled.push((subject, t));
    }
    for (mode, max_rotation) in [("identify", 2), ("uniqueness", 2), ("identify", 15)] {
        let p = params(mode, max_rotation);
        let templates: Vec<IrisTemplate> = [0.1, 0.33, 0.345, 0.36, 0.5]
            .iter()
            .enumerate()
            .map(|(k, &rate)| {
                let (_, t) = &enrolled[k * 3];
                near_duplicate(t, rate, (k as i32 % 3) - 1, &mut w.rng)
            })
            .collect();
        let probes: Vec<BatchedProbe> = templates
            .iter()
            .map(|t| w.batched_probe(t, Eye::Left, p))
            .collect();
        let (starts, outputs) = w.run_batch(&probes, Eye::Left, p);
        assert!(starts.iter().all(|s| s.refused.iter().all(Option::is_none)));
        for (k, t) in templates.iter().enumerate() {
            let want: Vec<String> = enrolled
                .iter()
                .filter(|(_, e)| plain_match(t, e, max_rotation, 3450))
                .map(|(s, _)| s.clone())
                .collect();
            let expected = if mode == "identify" {
                IrisResult::Identified(want)
            } else {
                IrisResult::Unique(want.is_empty())
            };
            let got = open_batched(&w, &probes, &outputs, k, Eye::Left, p, &probes[k].client);
            assert_eq!(
                got.unwrap(),
                expected,
                "probe {k} ({mode}, ±{max_rotation})"
            );
            // Another caller of the same batch cannot open it.
            let other = &probes[(k + 1) % probes.len()].client;
            assert!(matches!(
                open_batched(&w, &probes, &outputs, k, Eye::Left, p, other),
                Err(OutputRefused::Sealed { .. })
            ));
        }
    }
}

#[test]
fn a_refused_probe_gets_its_refusal_and_the_rest_of_the_batch_runs() {
    use crate::iris::output::IrisResult;
    let mut w = world(32);
    let t = random_template(&mut w.rng);
    w.enroll("alice", Eye::Left, &t);
    let other = random_template(&mut w.rng);
    w.enroll("bob", Eye::Left, &other);
    let p = params("identify", 1);
    let good = near_duplicate(&t, 0.1, 1, &mut w.rng);
    let mut probes = vec![w.batched_probe(&good, Eye::Left, p)];
    // Sealed for other parameters than the batch declares.
    probes.push(w.batched_probe(&good, Eye::Left, params("uniqueness", 1)));
    // Sealed for the other eye.
    probes.push(w.batched_probe(&good, Eye::Right, p));
    // A session id used before, by a single search.
    let used = w.batched_probe(&good, Eye::Left, p);
    let starts = start_all(&w.parties, used.id, &used.sealed, p);
    w.finish(used.id, starts.into_iter().map(|s| s.message).collect());
    probes.push(used);
    // P2's share is another probe's: refused at P2 only.
    let mut mixed = w.batched_probe(&good, Eye::Left, p);
    mixed.sealed[2] = probes[0].sealed[2].clone();
    probes.push(mixed);
    let (starts, outputs) = w.run_batch(&probes, Eye::Left, p);
    for (i, s) in starts.iter().enumerate() {
        assert!(s.refused[0].is_none());
        for (k, (refused, output)) in s
            .refused
            .iter()
            .zip(&outputs[i])
            .enumerate()
            .take(4)
            .skip(1)
        {
            assert!(refused.is_some(), "P{i} probe {k}");
            assert!(output.is_err());
        }
        assert_eq!(s.refused[4].is_some(), i == 2, "P{i} probe 4");
    }
    let why = |k: usize| starts[0].refused[k].as_ref().unwrap().to_string();
    assert!(why(1).contains("other search parameters"), "{}", why(1));
    assert!(why(2).contains("another eye"), "{}", why(2));
    assert!(why(3).contains("already used"), "{}", why(3));
    let got = open_batched(&w, &probes, &outputs, 0, Eye::Left, p, &probes[0].client);
    assert_eq!(got.unwrap(), IrisResult::Identified(vec!["alice".into()]));
    // A refused probe names no share value, key or subject.
    for s in &starts {
        for why in s.refused.iter().flatten() {
            let why = why.to_string();
            assert!(!why.contains("alice") && !why.contains("bob"), "{why}");
        }
    }
}

#[test]
fn a_batch_refuses_a_used_id_or_more_probes_than_allowed_as_a_whole() {
    let mut w = world(33);
    let t = random_template(&mut w.rng);
    w.enroll("a", Eye::Left, &t);
    let p = params("identify", 0);
    let probe = w.batched_probe(&t, Eye::Left, p);
    let party = &w.parties[0];
    let batch_id = [7u8; SESSION_ID_LEN];
    let start = |probes: &[(SessionId, &[u8])]| {
        party.service.start_batch(
            &party.store,
            &party.keys,
            &BatchStart {
                batch: batch_id,
                params: p,
                eye: Eye::Left,
                probes,
                enrolments: &[],
            },
            policy_of(p),
            Instant::now(),
            SEALED_AT,
            Interrupt::never(),
        )
    };
    assert!(matches!(start(&[]), Err(SearchError::BatchSize(0))));
    let many: Vec<(SessionId, &[u8])> = (0..=MAX_BATCH_PROBES)
        .map(|k| ([k as u8; SESSION_ID_LEN], probe.sealed[0].as_slice()))
        .collect();
    assert!(matches!(start(&many), Err(SearchError::BatchSize(_))));
    let one = [(probe.id, probe.sealed[0].as_slice())];
    assert!(start(&one).is_ok());
    assert!(party.service.abort(&batch_id));
    assert!(matches!(start(&one), Err(SearchError::ReplayedSession(_))));
}

#[test]
fn an_enrolment_batch_compares_each_request_with_the_enrolled_set_and_the_earlier_requests() {
    use crate::iris::output::IrisResult;
    let mut w = world(34);
    let mut enrolled = Vec::new();
    for i in 0..12 {
        let t = random_template(&mut w.rng);
        w.enroll(&format!("s{i:02}"), Eye::Left, &t);
        enrolled.push(t);
    }
    let p = params("uniqueness", 1);
    let (a, d, e) = (
        random_template(&mut w.rng),
        random_template(&mut w.rng),
        random_template(&mut w.rng),
    );
    // (template, eye of its enrolment envelope): A, a noisy rotated A, a noisy copy of an
    // enrolled template, D, A again, E sealed for the other eye (refused at every party, so
    // nobody compares with it), a noisy E.
    let requests = [
        (a, Eye::Left),
        (near_duplicate(&a, 0.1, 1, &mut w.rng), Eye::Left),
        (near_duplicate(&enrolled[3], 0.1, -1, &mut w.rng), Eye::Left),
        (d, Eye::Left),
        (near_duplicate(&a, 0.2, -1, &mut w.rng), Eye::Left),
        (e, Eye::Right),
        (near_duplicate(&e, 0.1, 0, &mut w.rng), Eye::Left),
    ];
    let mut probes = Vec::new();
    let mut envelopes = Vec::new();
    for (k, (t, eye)) in requests.iter().enumerate() {
        let (probe, sealed) = w.enrolment_request(t, &format!("r{k}"), *eye, p);
        probes.push(probe);
        envelopes.push(sealed);
    }
    let (starts, outputs) = w.run_enrolment_batch(&probes, &envelopes, Eye::Left, p);
    for s in &starts {
        for (k, refused) in s.refused.iter().enumerate() {
            assert_eq!(refused.is_some(), k == 5, "request {k}: {refused:?}");
        }
    }
    let mut earlier: Vec<&IrisTemplate> = Vec::new();
    for (k, (t, eye)) in requests.iter().enumerate() {
        if *eye == Eye::Left {
            let matches = |set: &[&IrisTemplate]| set.iter().any(|o| plain_match(t, o, 1, 3450));
            let enrolled_refs: Vec<&IrisTemplate> = enrolled.iter().collect();
            let want = if matches(&enrolled_refs) {
                IrisResult::Unique(false)
            } else if matches(&earlier) {
                IrisResult::MatchesEarlierRequest
            } else {
                IrisResult::Unique(true)
            };
            let got = open_batched(&w, &probes, &outputs, k, Eye::Left, p, &probes[k].client);
            assert_eq!(got.unwrap(), want, "request {k}");
            earlier.push(t);
        }
    }
    let results: Vec<IrisResult> = (0..requests.len())
        .filter(|&k| k != 5)
        .map(|k| open_batched(&w, &probes, &outputs, k, Eye::Left, p, &probes[k].client).unwrap())
        .collect();
    use IrisResult::{MatchesEarlierRequest as Earlier, Unique};
    assert_eq!(
        results,
        [
            Unique(true),
            Earlier,
            Unique(false),
            Unique(true),
            Earlier,
            Unique(true)
        ]
    );
    // The coordinator is disclosed one bit: not unique, whichever of the two matched.
    for o in &outputs {
        assert_eq!(o[1].as_ref().unwrap().disclosed_unique, Some(false));
        assert_eq!(o[2].as_ref().unwrap().disclosed_unique, Some(false));
    }

    let hashes = crate::iris::binding::envelope_hashes([
        &envelopes[1][0],
        &envelopes[1][1],
        &envelopes[1][2],
    ]);
    // An enrolment batch is a uniqueness batch with one enrolment per probe.
    let identify = params("identify", 1);
    let probe = w.batched_probe(&requests[1].0, Eye::Left, identify);
    let party = &w.parties[0];
    let refused = party.service.start_batch(
        &party.store,
        &party.keys,
        &BatchStart {
            batch: [10u8; SESSION_ID_LEN],
            params: identify,
            eye: Eye::Left,
            probes: &[(probe.id, probe.sealed[0].as_slice())],
            enrolments: &[BatchEnrolment {
                envelope: &envelopes[1][0],
                hashes: &hashes,
            }],
        },
        policy_of(identify),
        Instant::now(),
        SEALED_AT,
        Interrupt::never(),
    );
    assert!(matches!(refused, Err(SearchError::EnrolmentBatch(_))));
}

#[test]
fn a_record_is_compared_only_with_its_own_probe_admitted() {
    use crate::iris::output::IrisResult;
    use crate::iris::probe::{Disclosure, ProbeRefusal};
    let mut w = world(35);
    for i in 0..6 {
        let t = random_template(&mut w.rng);
        w.enroll(&format!("s{i}"), Eye::Left, &t);
    }
    let p = params("uniqueness", 1);
    let (r, stranger) = (random_template(&mut w.rng), random_template(&mut w.rng));
    let victim = near_duplicate(&r, 0.1, 1, &mut w.rng);
    let (r_probe, r_envelopes) = w.enrolment_request(&r, "earlier", Eye::Left, p);
    let (w_probe, _) = w.enrolment_request(&stranger, "stranger", Eye::Left, p);
    let unbound = w.probe_disclosing(&r, Eye::Left, p, Disclosure::UniqueBitToCoordinator);
    // R's record in front of a near-duplicate of R, with: R's own probe (the honest batch);
    // another request's probe; a probe naming no record; R's own probe used before.
    for (case, probe) in [
        ("its own probe", r_probe.clone_for_test()),
        ("another request's probe", w_probe),
        ("a probe naming no record", unbound),
        ("its own probe replayed", r_probe),
    ] {
        let (v_probe, v_envelopes) = w.enrolment_request(&victim, "victim", Eye::Left, p);
        let probes = [probe, v_probe];
        let envelopes = [r_envelopes.clone(), v_envelopes];
        let (starts, outputs) = w.run_enrolment_batch(&probes, &envelopes, Eye::Left, p);
        let honest = case == "its own probe";
        for s in &starts {
            assert_eq!(s.refused[0].is_none(), honest, "{case}: {:?}", s.refused[0]);
            assert!(s.refused[1].is_none(), "{case}");
        }
        if !honest {
            let why = starts[0].refused[0].as_ref().unwrap();
            let named = matches!(
                why,
                SearchError::ProbeRefused(ProbeRefusal::NotItsRecord | ProbeRefusal::Replayed)
            );
            assert!(named, "{case}: {why}");
        }
        // With its own probe, R's record makes the victim "not unique"; otherwise it is left
        // out at all three parties alike (a zero row matches nothing): the victim is unique.
        let got = open_batched(&w, &probes, &outputs, 1, Eye::Left, p, &probes[1].client);
        let want = if honest {
            IrisResult::MatchesEarlierRequest
        } else {
            IrisResult::Unique(true)
        };
        assert_eq!(got.unwrap(), want, "{case}");
        for o in &outputs {
            let bit = o[1].as_ref().expect("the victim's output").disclosed_unique;
            assert_eq!(bit, Some(!honest), "{case}: the disclosed bit");
        }
    }
}

#[test]
fn working_memory_admits_one_search_of_any_size_and_others_only_within_the_budget() {
    // 1 MiB: 8,192 comparisons.
    let work = Arc::new(WorkMemory::new(1));
    assert_eq!(work.budget, 8_192);
    let stop = Interrupt::default();
    let big = work
        .reserve(20_000, Duration::ZERO, &stop)
        .expect("alone, a search of any size runs");
    // Beside it nothing fits: refused once the wait is over (here: none).
    let refused = work.reserve(10, Duration::ZERO, &stop);
    assert!(
        matches!(
            refused,
            Err(SearchError::NoWorkMemory { budget_mib: 1, .. })
        ),
        "{:?}",
        refused.err()
    );
    // A start waiting for memory gets it when the running search ends.
    let waiter = {
        let work = Arc::clone(&work);
        std::thread::spawn(move || {
            work.reserve(5_000, Duration::from_secs(20), Interrupt::never())
                .map(|r| r.comparisons)
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    drop(big);
    assert_eq!(waiter.join().expect("waiter").expect("admitted"), 5_000);
    assert_eq!(work.reserved.load(AtomicOrdering::Acquire), 0);
    // Two that fit together run together; a raised interrupt ends a wait at once.
    let a = work.reserve(4_000, Duration::ZERO, &stop).expect("a");
    let b = work.reserve(4_000, Duration::ZERO, &stop).expect("b");
    stop.raise();
    let started = Instant::now();
    assert!(work.reserve(1_000, Duration::from_secs(20), &stop).is_err());
    assert!(started.elapsed() < Duration::from_secs(5));
    drop((a, b));
    assert_eq!(work.reserved.load(AtomicOrdering::Acquire), 0);
}

#[test]
fn a_search_holds_its_working_memory_until_it_ends_or_is_aborted() {
    let mut w = world(36);
    for i in 0..40 {
        let t = random_template(&mut w.rng);
        w.enroll(&format!("s{i}"), Eye::Left, &t);
    }
    let p = params("identify", 15);
    let probe = random_template(&mut w.rng);
    let id = w.session();
    let sealed =
        seal_iris_probe(&probe, &context(id, Eye::Left, p), &w.publics, &mut w.rng).unwrap();
    let starts = start_all(&w.parties, id, &sealed, p);
    // 40 entries × 31 rotations, held at each party while the search runs.
    for party in &w.parties {
        assert_eq!(party.service.work_memory().0, 40 * 31);
    }
    w.finish(id, starts.into_iter().map(|s| s.message).collect());
    for party in &w.parties {
        assert_eq!(party.service.work_memory().0, 0, "released when it ended");
    }
    let id = w.session();
    let sealed =
        seal_iris_probe(&probe, &context(id, Eye::Left, p), &w.publics, &mut w.rng).unwrap();
    start_all(&w.parties, id, &sealed, p);
    for party in &w.parties {
        assert!(party.service.abort(&id));
        assert_eq!(party.service.work_memory().0, 0, "released when aborted");
    }
}
