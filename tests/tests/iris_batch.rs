//! Issue 36, iris searches in batches (docs/protocols/iris.md §13.3), end to end against three
//! real PostgreSQL parties with the engine worker.
//!
//! * Through the coordinator: concurrent `privmatch iris search` callers land in batches of
//!   more than one search (the coordinator's log says so), and every caller's answer, opened
//!   with its own reply key, is the plaintext matcher's, for probes around the threshold.
//! * At the parties, driven as the coordinator's role drives them (`iris_batch_start`, then
//!   `iris_batch_round` routing party i's message to party i+1): a probe a party refuses is
//!   refused alone (sealed for other parameters than the batch declares: at every party; a
//!   share swapped at one party: there only) and the others get their outputs; each output
//!   opens only with its own client's key and only for its own session id, so a relay that
//!   swaps two callers' outputs is caught by the client; a relay that gives one party a
//!   different batch (a probe left out) makes the parties' channels disagree and the batch
//!   aborts (08P01) instead of computing something else.
//! * In-batch uniqueness (docs/protocols/iris.md §13.4): concurrent `privmatch iris enroll
//!   --if-unique` callers sending the same person (rotated, noisy copies under different
//!   subjects) land in one batch or in several, and exactly one of them is enrolled, at all
//!   three parties, every time.

use std::collections::BTreeMap;
use std::time::Duration;

use privmatch_core::crypto::seal::{PartyPublicKey, PartySecretKey};
use privmatch_core::iris::enroll::Eye;
use privmatch_core::iris::output::{open_outputs, ExpectedSearch, IrisResult, OutputRefused};
use privmatch_core::iris::params::{SearchMode, SearchParams};
use privmatch_core::iris::probe::{seal_iris_probe_to, Disclosure, ProbeContext, ReplyTo};
use privmatch_core::iris::synth::{near_duplicate, random_template};
use privmatch_core::iris::template::{masked_code_distance_counts, IrisTemplate};
use privmatch_e2e::{
    by_key, enrollment_line, privmatch, read_ndjson, sqlstate_and_message, write_lines, Cluster,
    RecordKey,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::Value;
use tokio_postgres::Client;

/// The deployed threshold, exactly: a match is 10,000·hd < 3,450·common at some rotation.
fn plain_match(probe: &IrisTemplate, t: &IrisTemplate, max_rotation: i32) -> bool {
    (-max_rotation..=max_rotation).any(|k| {
        let (hd, common) = masked_code_distance_counts(&probe.rotate(k), t);
        common > 0 && u64::from(hd) * 10_000 < 3_450 * u64::from(common)
    })
}

fn enroll(cluster: &Cluster, count: usize, seed: u64) -> BTreeMap<RecordKey, IrisTemplate> {
    let path = cluster.path("enrol.ndjson");
    privmatch(&[
        "iris",
        "synth",
        &count.to_string(),
        "--seed",
        &seed.to_string(),
        "-o",
        &path.display().to_string(),
    ])
    .expect_success();
    cluster.enroll(&path, &[]).expect_success();
    by_key(&read_ndjson(&path))
}

fn probe_line(t: &IrisTemplate) -> String {
    serde_json::json!({"eye": "left", "iris_codes": t.code.to_base64(), "mask_codes": t.mask.to_base64()})
        .to_string()
}

/// Left-eye probes around the threshold: near-duplicates of enrolled templates with flip
/// rates from 0.30 to 0.38 at rotations within ±15, and strangers.
fn probes_near_the_threshold(
    enrolled: &BTreeMap<RecordKey, IrisTemplate>,
    count: usize,
    rng: &mut ChaCha20Rng,
) -> Vec<IrisTemplate> {
    let lefts: Vec<&IrisTemplate> = enrolled
        .iter()
        .filter(|((_, e), _)| e == "left")
        .map(|(_, t)| t)
        .collect();
    (0..count)
        .map(|k| {
            if k % 4 == 3 {
                random_template(rng)
            } else {
                let t = lefts[rng.gen_range(0..lefts.len())];
                near_duplicate(t, rng.gen_range(0.30..0.38), rng.gen_range(-15..=15), rng)
            }
        })
        .collect()
}

fn expected(enrolled: &BTreeMap<RecordKey, IrisTemplate>, probe: &IrisTemplate) -> Vec<String> {
    enrolled
        .iter()
        .filter(|((_, e), t)| e == "left" && plain_match(probe, t, 15))
        .map(|((s, _), _)| s.clone())
        .collect()
}

#[test]
fn concurrent_searches_run_in_batches_and_each_caller_gets_the_plaintext_answer() {
    let cluster = Cluster::start("iris-batch", 94);
    let enrolled = enroll(&cluster, 120, 94);
    let mut rng = ChaCha20Rng::seed_from_u64(94);
    let probes = probes_near_the_threshold(&enrolled, 12, &mut rng);
    let expectations: Vec<Vec<String>> = probes.iter().map(|p| expected(&enrolled, p)).collect();
    assert!(
        expectations.iter().any(|e| !e.is_empty()) && expectations.iter().any(Vec::is_empty),
        "the probes exercise both outcomes"
    );
    // Two rounds of twelve concurrent callers, one probe each.
    for round in 0..2 {
        let callers: Vec<_> = probes
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let path = cluster.path(&format!("probe-{round}-{k}.ndjson"));
                write_lines(&path, &[probe_line(p)]);
                let input = path.display().to_string();
                cluster.cli_background(&["iris", "search", "--input", &input, "--json"])
            })
            .collect();
        for (k, caller) in callers.into_iter().enumerate() {
            let out = caller.wait(Duration::from_secs(240)).expect_success();
            let line: Value = serde_json::from_str(out.stdout.lines().next().unwrap_or(""))
                .unwrap_or_else(|e| panic!("probe {k}: {e}: {}", out.stdout));
            let mut got: Vec<String> = line["matches"]
                .as_array()
                .expect("matches")
                .iter()
                .map(|m| m["subject"].as_str().expect("subject").to_owned())
                .collect();
            got.sort();
            let mut want = expectations[k].clone();
            want.sort();
            assert_eq!(got, want, "probe {k}, round {round}");
        }
    }
    // The coordinator ran some of them together.
    let sizes: Vec<usize> = cluster
        .log_lines_with("coordinator.log", "iris batch")
        .iter()
        .filter_map(|l| {
            l.split("probes=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 24, "{sizes:?}");
    assert!(
        sizes.iter().any(|&n| n > 1),
        "no batch of more than one: {sizes:?}"
    );
}

/// One client's search in a batch driven here.
struct Member {
    session: [u8; 16],
    client: PartySecretKey,
    sealed: [Vec<u8>; 3],
    params: SearchParams,
}

fn member(
    keys: &[PartyPublicKey; 3],
    probe: &IrisTemplate,
    params: SearchParams,
    rng: &mut ChaCha20Rng,
) -> Member {
    let session: [u8; 16] = rng.gen();
    let client = PartySecretKey::generate(rng);
    let context = ProbeContext {
        session,
        eye: Eye::Left,
        params,
        sealed_at: privmatch_coordinator::cli::keys::sealing_time(),
    };
    let to = ReplyTo {
        key: client.public_key(),
        disclosure: Disclosure::SealedOnly,
    };
    let sealed = seal_iris_probe_to(probe, &context, &to, keys, rng).expect("seal");
    Member {
        session,
        client,
        sealed,
        params,
    }
}

/// What the three parties answered to a batch.
struct BatchAnswers {
    refused_sqlstate: Vec<Vec<Option<String>>>,
    sealed: Vec<Vec<Option<Vec<u8>>>>,
    /// Per party, the uniqueness bits disclosed to the coordinator (enrolment batches).
    disclosed: Vec<Vec<Option<bool>>>,
}

/// Drives one identify batch (±15 rotations, left eye) as the coordinator's role; party i is
/// given the members `at[i]` (normally all of them).
async fn run_batch(
    clients: &[Client],
    members: &[Member],
    at: [&[usize]; 3],
    rng: &mut ChaCha20Rng,
) -> Result<BatchAnswers, tokio_postgres::Error> {
    run_enrolment_batch(clients, members, at, None, rng).await
}

/// Member k's enrolment: the three envelopes each party is given, and the announced hashes.
struct Enrolment {
    given: [Vec<u8>; 3],
    hashes: Vec<u8>,
}

/// As [`run_batch`]; with `enrolments`, an enroll-if-unique batch (`iris_batch_enroll_start`,
/// uniqueness, ±15 rotations) with member k's record `enrolments[k]`.
async fn run_enrolment_batch(
    clients: &[Client],
    members: &[Member],
    at: [&[usize]; 3],
    enrolments: Option<&[Enrolment]>,
    rng: &mut ChaCha20Rng,
) -> Result<BatchAnswers, tokio_postgres::Error> {
    let batch: [u8; 16] = rng.gen();
    let mut messages = Vec::new();
    let mut refused_sqlstate = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let sessions: Vec<&[u8]> = at[i].iter().map(|&k| &members[k].session[..]).collect();
        let probes: Vec<&[u8]> = at[i]
            .iter()
            .map(|&k| members[k].sealed[i].as_slice())
            .collect();
        let row = match enrolments {
            None => {
                client
                    .query_one(
                        "SELECT message, refused_sqlstate FROM privmatch.iris_batch_start($1, 'identify', 15, 'left', $2, $3)",
                        &[&batch.as_slice(), &sessions, &probes],
                    )
                    .await?
            }
            Some(records) => {
                let envelopes: Vec<&[u8]> =
                    at[i].iter().map(|&k| records[k].given[i].as_slice()).collect();
                let hashes: Vec<&[u8]> =
                    at[i].iter().map(|&k| records[k].hashes.as_slice()).collect();
                client
                    .query_one(
                        "SELECT message, refused_sqlstate FROM privmatch.iris_batch_enroll_start($1, 15, 'left', $2, $3, $4, $5)",
                        &[&batch.as_slice(), &sessions, &probes, &envelopes, &hashes],
                    )
                    .await?
            }
        };
        messages.push(row.get::<_, Vec<u8>>(0));
        refused_sqlstate.push(row.get::<_, Vec<Option<String>>>(1));
    }
    for k in 0..128 {
        let mut next = Vec::new();
        let mut sealed = Vec::new();
        let mut disclosed = Vec::new();
        for (i, client) in clients.iter().enumerate() {
            let row = client
                .query_one(
                    "SELECT message, finished, sealed_outputs, disclosed_unique FROM privmatch.iris_batch_round($1, $2, $3)",
                    &[&batch.as_slice(), &k, &messages[(i + 2) % 3]],
                )
                .await?;
            if row.get::<_, bool>(1) {
                sealed.push(row.get::<_, Vec<Option<Vec<u8>>>>(2));
                disclosed.push(row.get::<_, Vec<Option<bool>>>(3));
            } else {
                next.push(row.get::<_, Vec<u8>>(0));
            }
        }
        match sealed.len() {
            0 => messages = next,
            3 => {
                return Ok(BatchAnswers {
                    refused_sqlstate,
                    sealed,
                    disclosed,
                })
            }
            n => panic!("{n} of 3 parties finished in round {k}"),
        }
    }
    panic!("the batch did not finish in 128 rounds")
}

/// Opens member `k`'s outputs as given (`outputs[i]` from party i) with `client`.
fn open(
    keys: &[PartyPublicKey; 3],
    m: &Member,
    client: &PartySecretKey,
    outputs: [&[u8]; 3],
) -> Result<IrisResult, OutputRefused> {
    let expected = ExpectedSearch {
        session: m.session,
        params: m.params,
        eye: Eye::Left,
    };
    open_outputs(&expected, keys, &[None, None, None], client, outputs).map(|o| o.result)
}

#[test]
fn a_refused_probe_is_refused_alone_and_a_relay_cannot_swap_answers_or_split_a_batch() {
    let cluster = Cluster::start("iris-batch-relay", 95);
    let enrolled = enroll(&cluster, 30, 95);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(95);
    let identify = SearchParams::new(SearchMode::Identify, 15, 0.345).expect("params");
    let uniqueness = SearchParams::new(SearchMode::Uniqueness, 15, 0.345).expect("params");
    let (subject, template) = enrolled
        .iter()
        .find(|((_, e), _)| e == "left")
        .map(|((s, _), t)| (s.clone(), *t))
        .expect("a left eye");
    let near = near_duplicate(&template, 0.1, 4, &mut rng);
    let stranger = random_template(&mut rng);
    let mut members = vec![
        member(&keys, &near, identify, &mut rng),
        // Sealed for uniqueness, in an identify batch: refused at every party.
        member(&keys, &near, uniqueness, &mut rng),
        // P2's probe is another member's: refused at P2 only.
        member(&keys, &stranger, identify, &mut rng),
        member(&keys, &stranger, identify, &mut rng),
    ];
    members[2].sealed[2] = members[0].sealed[2].clone();
    let all: &[usize] = &[0, 1, 2, 3];
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let answers = run_batch(&clients, &members, [all, all, all], &mut rng)
            .await
            .expect("the batch runs");
        for (i, refused) in answers.refused_sqlstate.iter().enumerate() {
            assert_eq!(refused[0], None, "P{i}");
            assert_eq!(refused[1].as_deref(), Some("22023"), "P{i}");
            assert_eq!(refused[2].is_some(), i == 2, "P{i}: {:?}", refused[2]);
            assert_eq!(refused[3], None, "P{i}");
            assert!(answers.sealed[i][1].is_none());
        }
        let outputs = |k: usize| -> [&[u8]; 3] {
            std::array::from_fn(|i| answers.sealed[i][k].as_deref().expect("an output"))
        };
        assert_eq!(
            open(&keys, &members[0], &members[0].client, outputs(0)),
            Ok(IrisResult::Identified(vec![subject.clone()]))
        );
        assert_eq!(
            open(&keys, &members[3], &members[3].client, outputs(3)),
            Ok(IrisResult::Identified(vec![]))
        );
        // A relay that hands member 3 member 0's outputs: sealed to another key.
        assert!(matches!(
            open(&keys, &members[3], &members[3].client, outputs(0)),
            Err(OutputRefused::Sealed { .. })
        ));
        // Even with member 0's key, they are not member 3's session's.
        assert!(open(&keys, &members[3], &members[0].client, outputs(0)).is_err());

        // A probe whose session id was used (member 0, again) is refused alone by the SQL
        // layer (recorded durably: 42704, in a subtransaction of its own); a fresh one in the
        // same batch is answered.
        let fresh_member = member(&keys, &near, identify, &mut rng);
        let again = [
            Member {
                session: members[0].session,
                client: PartySecretKey::generate(&mut rng),
                sealed: members[0].sealed.clone(),
                params: identify,
            },
            fresh_member,
        ];
        let pair: &[usize] = &[0, 1];
        let answers = run_batch(&clients, &again, [pair, pair, pair], &mut rng)
            .await
            .expect("the batch runs");
        for (i, refused) in answers.refused_sqlstate.iter().enumerate() {
            assert_eq!(refused[0].as_deref(), Some("42704"), "P{i}");
            assert_eq!(refused[1], None, "P{i}");
        }
        let outputs: [&[u8]; 3] =
            std::array::from_fn(|i| answers.sealed[i][1].as_deref().expect("an output"));
        assert_eq!(
            open(&keys, &again[1], &again[1].client, outputs),
            Ok(IrisResult::Identified(vec![subject.clone()]))
        );

        // A relay that leaves member 3 out at P1 only: the channels disagree, nothing is
        // computed (fresh members: session ids are single use).
        let fresh: Vec<Member> = [&near, &stranger]
            .into_iter()
            .map(|p| member(&keys, p, identify, &mut rng))
            .collect();
        let err = run_batch(&clients, &fresh, [&[0, 1], &[0], &[0, 1]], &mut rng)
            .await
            .err()
            .expect("a split batch fails");
        let (code, message) = sqlstate_and_message(&err);
        assert_eq!(code, "08P01", "{message}");
    });
}

#[test]
fn concurrent_enrolments_of_one_person_enrol_exactly_one_in_one_batch_or_several() {
    let cluster = Cluster::start("iris-enrol-batch", 96);
    let enrolled = enroll(&cluster, 60, 96);
    // Another seed than the enrolled set's (`iris synth --seed 96` draws the same templates).
    let mut rng = ChaCha20Rng::seed_from_u64(9_600);
    // Two people at once, eight callers each, interleaved: the first request leaves alone and
    // the rest queue behind it, so copies of a person not enrolled yet share a batch (the
    // in-batch comparison decides) or land in later ones (the enrolled set decides).
    let (rounds, people, copies) = (3, 2, 8);
    let mut in_batch_refusals = 0;
    for round in 0..rounds {
        let mut files = Vec::new();
        for person in 0..people {
            let t = random_template(&mut rng);
            for k in 0..copies {
                let copy = if k == 0 {
                    t
                } else {
                    // Rotated by at most ±7 each, so any two copies are within the ±15
                    // rotations a search tries.
                    near_duplicate(&t, 0.08, rng.gen_range(-7..=7), &mut rng)
                };
                let path = cluster.path(&format!("r{round}-p{person}-{k}.ndjson"));
                let subject = format!("r{round}-p{person}-{k}");
                write_lines(&path, &[enrollment_line(&subject, "left", &copy)]);
                files.push((k, person, path.display().to_string()));
            }
        }
        files.sort_by_key(|(k, person, _)| (*k, *person));
        let callers: Vec<_> = files
            .iter()
            .map(|(_, _, f)| {
                cluster.cli_background(&[
                    "iris",
                    "enroll",
                    "--input",
                    f,
                    "--if-unique",
                    "--no-progress",
                ])
            })
            .collect();
        for caller in callers {
            let out = caller.wait(Duration::from_secs(300)).expect_success();
            // Why a copy was refused: an enrolled copy, or an earlier copy of its batch (the
            // parties' signed output says which; the coordinator is told only "not unique").
            in_batch_refusals += out
                .stdout
                .matches("but an earlier request sent at the same time")
                .count();
        }
        for person in 0..people {
            let prefix = format!("r{round}-p{person}-");
            let mine = |p: usize| -> Vec<RecordKey> {
                cluster
                    .keys(p)
                    .into_iter()
                    .filter(|(s, _)| s.starts_with(&prefix))
                    .collect()
            };
            let at_p0 = mine(0);
            assert_eq!(at_p0.len(), 1, "round {round}, person {person}: {at_p0:?}");
            assert_eq!(mine(1), at_p0, "round {round}, person {person} at P1");
            assert_eq!(mine(2), at_p0, "round {round}, person {person} at P2");
        }
    }
    for p in 0..3 {
        assert_eq!(
            cluster.keys(p).len(),
            enrolled.len() + rounds * people,
            "P{p}"
        );
    }
    // The coordinator ran some of them together, and every request was in a batch.
    let sizes: Vec<usize> = cluster
        .log_lines_with("coordinator.log", "iris enrolment batch")
        .iter()
        .filter_map(|l| {
            l.split("requests=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .collect();
    assert!(
        sizes.iter().sum::<usize>() >= rounds * people * copies,
        "{sizes:?}"
    );
    assert!(
        sizes.iter().any(|&n| n > 1),
        "no enrolment batch of more than one: {sizes:?}"
    );
    // Copies of a person not enrolled yet shared a batch: the later ones were told so.
    assert!(
        in_batch_refusals > 0,
        "no refusal named an earlier request of its batch"
    );
}

#[test]
fn an_enrolment_request_refused_at_one_party_is_refused_alone() {
    let cluster = Cluster::start("iris-enrol-batch-relay", 97);
    enroll(&cluster, 20, 97);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(9_700);
    let (x, y, z) = (
        random_template(&mut rng),
        random_template(&mut rng),
        random_template(&mut rng),
    );
    // X; Y, whose probe P2 refuses; Z, whose envelope P2 refuses.
    let templates = [x, y, z];
    let (mut members, mut records): (Vec<Member>, Vec<Enrolment>) = templates
        .iter()
        .enumerate()
        .map(|(k, t)| enrolment_request(&keys, t, &format!("relay-{k}"), &mut rng))
        .unzip();
    // A relay gives P2 member 0's probe in member 1's place (it does not open under member
    // 1's session: P2 refuses that probe, in the engine), and member 1's envelope in member
    // 2's place under member 2's hashes (P2 refuses that record: it does not hash to P2's
    // slot).
    members[1].sealed[2] = members[0].sealed[2].clone();
    records[2].given[2] = records[1].given[2].clone();
    let all: &[usize] = &[0, 1, 2];
    cluster.block_on(async {
        let clients = cluster.clients().await;
        let answers = run_enrolment_batch(
            &clients,
            &members,
            [all, all, all],
            Some(&records),
            &mut rng,
        )
        .await
        .unwrap_or_else(|e| panic!("the batch runs: {:?}", sqlstate_and_message(&e)));
        for (i, refused) in answers.refused_sqlstate.iter().enumerate() {
            assert_eq!(refused[0], None, "P{i}");
            assert_eq!(refused[1].is_some(), i == 2, "P{i}: {refused:?}");
            let want = (i == 2).then(|| "22023".to_owned());
            assert_eq!(refused[2], want, "P{i}");
        }
        // X is answered; the requests refused at P2 get no output there. (The comparison of
        // the requests after member 1 with its record is void: its row is a zero share at
        // P2 only; the coordinator has their callers retry, `enrolment_batch_void`.)
        let outputs: [&[u8]; 3] =
            std::array::from_fn(|i| answers.sealed[i][0].as_deref().expect("X's output"));
        let got = open(&keys, &members[0], &members[0].client, outputs).expect("opens");
        assert_eq!(got, IrisResult::Unique(true), "X");
        assert!(answers.sealed[2][1].is_none() && answers.sealed[2][2].is_none());
    });
}

/// An enroll-if-unique request as the CLI makes one: the record's three sealed envelopes and
/// their hashes, and a uniqueness probe (±15 rotations) that lets the parties disclose its bit
/// to the coordinator.
fn enrolment_request(
    keys: &[PartyPublicKey; 3],
    t: &IrisTemplate,
    subject: &str,
    rng: &mut ChaCha20Rng,
) -> (Member, Enrolment) {
    use privmatch_core::iris::enroll::seal_iris_enrollment;
    let (given, _) = seal_iris_enrollment(t, subject, Eye::Left, keys, rng).expect("seal");
    let record = announced(given);
    (probe_naming(keys, t, &record, rng), record)
}

/// Envelopes as relayed, with the hashes the coordinator computes over them.
fn announced(given: [Vec<u8>; 3]) -> Enrolment {
    use privmatch_core::iris::binding::envelope_hashes;
    let hashes = envelope_hashes([&given[0], &given[1], &given[2]]).to_vec();
    Enrolment { given, hashes }
}

/// A uniqueness probe of `t` (±15 rotations) naming `record`, as `privmatch iris enroll
/// --if-unique` seals it, with a fresh session and reply key.
fn probe_naming(
    keys: &[PartyPublicKey; 3],
    t: &IrisTemplate,
    record: &Enrolment,
    rng: &mut ChaCha20Rng,
) -> Member {
    let params = SearchParams::new(SearchMode::Uniqueness, 15, 0.345).expect("params");
    let session: [u8; 16] = rng.gen();
    let client = PartySecretKey::generate(rng);
    let context = ProbeContext {
        session,
        eye: Eye::Left,
        params,
        sealed_at: privmatch_coordinator::cli::keys::sealing_time(),
    };
    let id = privmatch_core::iris::binding::enrolment_id(
        record.hashes.as_slice().try_into().expect("96 bytes"),
    );
    let to = ReplyTo {
        key: client.public_key(),
        disclosure: Disclosure::UniqueBitForRecord(id),
    };
    let sealed = seal_iris_probe_to(t, &context, &to, keys, rng).expect("seal");
    Member {
        session,
        client,
        sealed,
        params,
    }
}

/// The bit the three parties disclosed to the coordinator for request `k` (they agree).
fn disclosed_bit(answers: &BatchAnswers, k: usize) -> Option<bool> {
    let bits: Vec<Option<bool>> = answers.disclosed.iter().map(|d| d[k]).collect();
    assert!(
        bits.iter().all(|b| *b == bits[0]),
        "parties disagree: {bits:?}"
    );
    bits[0]
}

/// A curious coordinator, as a relay that composes enrolment batches itself, tries to learn
/// whether a victim's enroll-if-unique probe matches a record of its choice — one it relayed
/// earlier and that was never enrolled — from the uniqueness bit the victim's probe lets the
/// parties disclose: (1) it replays an earlier request whole (probe and envelope) in front of
/// the victim; (2) it puts the earlier record in front of the victim with the probe of another
/// live request. Either way the victim must be answered as if that record were absent
/// ("unique": nothing enrolled matches it). Before records were bound to their own probes
/// (privmatch 0.16.0), both answered "not unique": a 1:N oracle on records of the relay's
/// choice.
#[test]
fn a_relay_cannot_compare_an_enrolment_probe_with_records_of_its_choice() {
    let cluster = Cluster::start("iris-enrol-batch-oracle", 98);
    enroll(&cluster, 20, 98);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(9_800);
    let earlier = random_template(&mut rng);
    let victim = near_duplicate(&earlier, 0.1, 3, &mut rng);
    let all = |n: usize| -> Vec<usize> { (0..n).collect() };
    cluster.block_on(async {
        let clients = cluster.clients().await;
        // The earlier request runs honestly, alone: unique. The relay does not enrol it (it
        // holds the transaction: here each call commits on its own, as after a batch whose
        // enrolment the coordinator left out).
        let (r_member, r_record) = enrolment_request(&keys, &earlier, "earlier", &mut rng);
        let (members, records) = (vec![r_member], vec![r_record]);
        let one = all(1);
        let answers = run_enrolment_batch(
            &clients,
            &members,
            [&one, &one, &one],
            Some(&records),
            &mut rng,
        )
        .await
        .unwrap_or_else(|e| panic!("the honest batch runs: {:?}", sqlstate_and_message(&e)));
        assert_eq!(
            disclosed_bit(&answers, 0),
            Some(true),
            "the earlier request"
        );
        let (r_member, r_record) = (&members[0], &records[0]);

        // (1) The earlier request replayed whole in front of the victim.
        let (v_member, v_record) = enrolment_request(&keys, &victim, "victim-1", &mut rng);
        let replayed = Member {
            session: r_member.session,
            client: r_member.client.clone(),
            sealed: r_member.sealed.clone(),
            params: r_member.params,
        };
        let replayed_record = Enrolment {
            given: r_record.given.clone(),
            hashes: r_record.hashes.clone(),
        };
        let two = all(2);
        let answers = run_enrolment_batch(
            &clients,
            &[replayed, v_member],
            [&two, &two, &two],
            Some(&[replayed_record, v_record]),
            &mut rng,
        )
        .await
        .unwrap_or_else(|e| panic!("the replaying batch runs: {:?}", sqlstate_and_message(&e)));
        assert_eq!(
            disclosed_bit(&answers, 1),
            Some(true),
            "a replayed record took part in the victim's comparison"
        );

        // (2) The earlier record, with another live request's probe, in front of the victim.
        let stranger = random_template(&mut rng);
        let (w_member, _) = enrolment_request(&keys, &stranger, "stranger", &mut rng);
        let (v_member, v_record) = enrolment_request(&keys, &victim, "victim-2", &mut rng);
        let reused_record = Enrolment {
            given: r_record.given.clone(),
            hashes: r_record.hashes.clone(),
        };
        let answers = run_enrolment_batch(
            &clients,
            &[w_member, v_member],
            [&two, &two, &two],
            Some(&[reused_record, v_record]),
            &mut rng,
        )
        .await
        .unwrap_or_else(|e| panic!("the rebinding batch runs: {:?}", sqlstate_and_message(&e)));
        assert_eq!(
            disclosed_bit(&answers, 1),
            Some(true),
            "another request's record took part in the victim's comparison"
        );
    });
}

/// A malicious client sends an enroll-if-unique request whose envelope for P2 does not open
/// there (the other two are fine), and an honest caller's request of a new person lands
/// behind it in the same batch (the test holds the template table's lock at P0 while a
/// blocker's batch waits, so both queue for the next batch, the malicious one first). The
/// malicious request is refused at P2 only, so its row is noise in the honest request's
/// comparison: the coordinator must not answer that "not unique". It voids the answer
/// (`enrolment_batch_void`), the CLI retries with a fresh probe in another batch, and the
/// honest person is enrolled at all three parties. (With the voiding disabled, the honest
/// request is answered "not unique" and nothing is enrolled: the first 0.16.0 build.)
#[test]
fn a_request_refused_at_one_party_cannot_make_the_later_ones_not_unique() {
    use privmatch_api::wire::to_base64;
    use privmatch_core::iris::enroll::seal_iris_enrollment;
    let cluster = Cluster::start("iris-enrol-batch-void", 99);
    enroll(&cluster, 20, 99);
    let keys = cluster.party_keys();
    let mut rng = ChaCha20Rng::seed_from_u64(9_900);
    let (blocker, malicious, honest) = (
        random_template(&mut rng),
        random_template(&mut rng),
        random_template(&mut rng),
    );
    // The malicious request: P2's envelope altered after sealing (it does not open at P2);
    // the hashes the coordinator computes, and the probe's record id, cover what is sent.
    let (mut envelopes, _) =
        seal_iris_enrollment(&malicious, "mallory", Eye::Left, &keys, &mut rng).expect("seal");
    let last = envelopes[2].len() - 1;
    envelopes[2][last] ^= 1;
    let record = announced(envelopes);
    let member = probe_naming(&keys, &malicious, &record, &mut rng);
    let body = serde_json::json!({
        "subject": "mallory",
        "eye": "left",
        "session": hex::encode(member.session),
        "probes": member.sealed.iter().map(|p| to_base64(p)).collect::<Vec<_>>(),
        "envelopes": record.given.iter().map(|e| to_base64(e)).collect::<Vec<_>>(),
    });
    let file = |name: &str, t: &IrisTemplate| {
        let path = cluster.path(&format!("{name}.ndjson"));
        write_lines(&path, &[enrollment_line(name, "left", t)]);
        path.display().to_string()
    };
    let (blocker_file, honest_file) = (file("blocker", &blocker), file("honest", &honest));
    let if_unique = |f: &str| {
        cluster.cli_background(&[
            "iris",
            "enroll",
            "--input",
            f,
            "--if-unique",
            "--no-progress",
        ])
    };
    let (malicious_answer, honest_out) = std::thread::scope(|s| {
        let holder = s.spawn(|| {
            cluster.block_on(async {
                let p0 = cluster.connect(0).await;
                p0.batch_execute(
                    "BEGIN; LOCK TABLE privmatch.iris_templates IN SHARE ROW EXCLUSIVE MODE",
                )
                .await
                .expect("lock");
                tokio::time::sleep(Duration::from_secs(5)).await;
                p0.batch_execute("COMMIT").await.expect("unlock");
            })
        });
        std::thread::sleep(Duration::from_millis(500));
        let blocked = if_unique(&blocker_file);
        std::thread::sleep(Duration::from_millis(1_500));
        let malicious = s.spawn(|| {
            cluster.post_bytes("/v1/iris/enroll-if-unique", body.to_string().into_bytes())
        });
        std::thread::sleep(Duration::from_millis(1_000));
        let honest = if_unique(&honest_file);
        holder.join().expect("lock holder");
        blocked.wait(Duration::from_secs(120)).expect_success();
        let answer = malicious.join().expect("malicious request");
        (answer, honest.wait(Duration::from_secs(120)))
    });
    let (status, answer) = malicious_answer;
    assert_ne!(status, 200, "the malicious request was answered: {answer}");
    assert!(answer.to_string().contains("P2"), "{answer}");
    let honest_out = honest_out.expect_success();
    // Both queued behind the blocker and ran as one batch, the malicious request first.
    let in_batch = cluster.log_lines_with("coordinator.log", "iris enroll-if-unique in batch");
    let batch_of = |session: &str| {
        in_batch
            .iter()
            .find(|l| l.contains(session))
            .and_then(|l| l.split("batch=").nth(1))
            .map(|rest| {
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
    };
    let malicious_batch =
        batch_of(&hex::encode(member.session)).expect("the malicious request's batch");
    let shared = in_batch
        .iter()
        .filter(|l| l.contains(&malicious_batch))
        .count();
    assert_eq!(
        shared, 2,
        "the malicious and the honest request share a batch: {in_batch:#?}"
    );
    for party in 0..3 {
        assert_eq!(
            cluster.subject_count(party, "honest"),
            1,
            "P{party}: the honest person is enrolled ({honest_out})"
        );
        assert_eq!(cluster.subject_count(party, "mallory"), 0, "P{party}");
    }
}
