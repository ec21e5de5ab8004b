//! `privmatch bench paillier`: the device-template (packed Paillier, [ABMR20]) benchmark, in
//! process on one core (no cluster needed). For every modulus size |N|, template length ℓ and
//! element width m it runs the core state machines end to end and prints, per protocol:
//!
//! * **enrolment**: Π1: the device's encryption of its t packed ciphertexts; Π2/Π3: the whole
//!   Π_en (slack, encryption of ℓ + 4 coordinates, key and plaintext-knowledge proofs, the SP's
//!   checks and L2 challenge, the device's response, the SP's check, packing and signing), per
//!   step, with the bytes of every message;
//! * **matching**: each round's time (median of `--reps` runs), the whole matching phase with
//!   the terminal's r^N taken from a pool filled offline (Round 1 is reusable, so a terminal
//!   can precompute for a device) and with r^N computed online, and the bytes of every message.
//!
//! Every run's output is checked against the plaintext comparison, or the benchmark fails.
//! The reference is [ABMR20] §9 (C++/GMP on a laptop; its message sizes imply a 2048-bit N),
//! at ℓ = 256, m = 16: Π1 24 ms, Π2 49 ms, Π3 119 ms, Π2/Π3 enrolment 2.2 s (encryption)
//! + 5.0 s (proofs), first message 16,656 B (Π1) and 26,896 B (Π2).
//!
//! [ABMR20] = Agrawal, Badrinarayanan, Mukherjee, Rindal, "Game-Set-MATCH", CCS 2020,
//! ePrint 2020/1363.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use ed25519_dalek::SigningKey;
use privmatch_core::paillier::cipher::{Ciphertext, SecretKey};
use privmatch_core::paillier::enroll::{DeviceEnrolment, ServiceEnrolment};
use privmatch_core::paillier::key_proof::{RingPedersenParams, DEFAULT_RING_PEDERSEN_BITS};
use privmatch_core::paillier::params::{Params, Protocol, DEFAULT_STAT_BITS};
use privmatch_core::paillier::pi1::{Pi1Device, Pi1Terminal};
use privmatch_core::paillier::pi2::{Pi2Device, Pi2Terminal};
use privmatch_core::paillier::pi3::{circuit, Pi3Device, Pi3Terminal};
use privmatch_core::paillier::precomputed::PrecomputedTemplate;
use privmatch_core::paillier::record::verify_round1_signature;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::dev::bench::stats::median;

/// Options of `privmatch bench paillier`.
#[derive(Args, Clone, Debug)]
pub struct PaillierBenchArgs {
    /// Modulus sizes |N| in bits (2048 and/or 3072).
    #[arg(long, value_delimiter = ',', default_value = "3072,2048")]
    pub modulus_bits: Vec<u32>,
    /// Template lengths ℓ.
    #[arg(long, value_delimiter = ',', default_value = "128,256,512,1024")]
    pub dims: Vec<usize>,
    /// Element widths m in bits.
    #[arg(long, value_delimiter = ',', default_value = "8,16")]
    pub value_bits: Vec<u32>,
    /// Protocols (pi1, pi2, pi3).
    #[arg(long, value_delimiter = ',', default_value = "pi1,pi2,pi3")]
    pub protocols: Vec<String>,
    /// Matching runs per configuration (the median is printed).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Seed of the synthetic templates and of all randomness.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Enrolment costs: Π1 (the device packs and encrypts, no proof) or Π2/Π3 (Π_en).
enum Enrolment {
    Packed {
        encrypt: Duration,
        bytes: usize,
    },
    Proved {
        device_start: Duration,
        sp_receive: Duration,
        device_respond: Duration,
        sp_finish: Duration,
        bytes: [usize; 4],
    },
}

/// One configuration's figures.
struct Row {
    protocol: Protocol,
    modulus_bits: u32,
    dim: usize,
    value_bits: u32,
    /// values per ciphertext / ciphertexts t.
    layout: (usize, usize),
    enrolment: Enrolment,
    /// Per round: (name, median time, bytes).
    rounds: Vec<(&'static str, Duration, usize)>,
    match_pooled: Duration,
    match_online: Duration,
    /// Π3: AND gates of the circuit.
    and_gates: Option<usize>,
    /// The same sessions with the terminal's offline tables of the device's template.
    tables: TableFigures,
}

/// The terminal's offline tables for a device ([`PrecomputedTemplate`]): their one-off cost
/// and size, and the sessions run with them.
struct TableFigures {
    offline: Duration,
    bytes: usize,
    /// Median time of T's Round 2 with the tables.
    round2: Duration,
    /// The whole matching phase with the tables (and pooled r^N).
    match_pooled: Duration,
}

/// The tables of the device's Round 1 template, timed.
fn tables_for(
    p: &Params,
    pk: &privmatch_core::paillier::cipher::PublicKey,
    template: &[Ciphertext],
) -> Result<(Arc<PrecomputedTemplate>, Duration)> {
    timed(|| {
        Ok(Arc::new(PrecomputedTemplate::new(
            pk,
            p.layout(),
            template,
        )?))
    })
}

/// Runs `session` over the probes without and then with the tables; the medians of both.
fn with_and_without_tables(
    case: &Case,
    tables: &Arc<PrecomputedTemplate>,
    mut session: impl FnMut(&[i32], Option<Arc<PrecomputedTemplate>>) -> Result<Vec<Duration>>,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut plain = Vec::new();
    let mut fast = Vec::new();
    for w in &case.probes {
        plain.push(session(w, None)?);
        fast.push(session(w, Some(tables.clone()))?);
    }
    Ok((medians(&plain), medians(&fast)))
}

/// The figures with tables from the medians of the table sessions (`rounds` timed columns
/// first, the online r^N column last).
fn table_figures(
    offline: Duration,
    bytes: usize,
    fast: &[Duration],
    rounds: usize,
) -> TableFigures {
    TableFigures {
        offline,
        bytes,
        round2: fast[0],
        match_pooled: fast[..rounds].iter().sum(),
    }
}

fn protocol_of(name: &str) -> Result<Protocol> {
    let name = name.trim().to_ascii_lowercase();
    let by_number = name
        .parse::<u8>()
        .ok()
        .and_then(|n| Protocol::from_code(n).ok());
    match by_number.or_else(|| Protocol::from_name(&name)) {
        Some(protocol) => Ok(protocol),
        None => bail!(
            "--protocols: unknown protocol {name:?} ({})",
            Protocol::NAMES.join(", ")
        ),
    }
}

fn random_vector(dim: usize, m: u32, rng: &mut ChaCha20Rng) -> Vec<i32> {
    let half = 1i64 << (m - 1);
    (0..dim)
        .map(|_| ((rng.next_u64() % (2 * half as u64)) as i64 - half) as i32)
        .collect()
}

fn dot(u: &[i32], w: &[i32]) -> i64 {
    u.iter()
        .zip(w)
        .map(|(&a, &b)| i64::from(a) * i64::from(b))
        .sum()
}

fn clone_key(sk: &SecretKey) -> Result<SecretKey> {
    let (p, q) = sk.primes();
    SecretKey::from_primes(p.clone(), q.clone()).map_err(|e| anyhow!("{e}"))
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Duration)> {
    let start = Instant::now();
    let out = f()?;
    Ok((out, start.elapsed()))
}

/// Medians of each column over the runs.
fn medians(runs: &[Vec<Duration>]) -> Vec<Duration> {
    let columns = runs.first().map_or(0, Vec::len);
    (0..columns)
        .map(|c| Duration::from_secs_f64(median(runs.iter().map(|r| r[c].as_secs_f64()).collect())))
        .collect()
}

/// The terminal's check of σ in Round 1 (the SP's template record signature).
fn verifier(sp: &SigningKey) -> impl Fn(&[u8], &[u8]) -> bool {
    let vk = sp.verifying_key();
    move |msg: &[u8], sigma: &[u8]| verify_round1_signature(&vk, 0, msg, sigma).is_ok()
}

fn check(got: bool, u: &[i32], w: &[i32], threshold: i64, what: &str) -> Result<()> {
    if got != (dot(u, w) >= threshold) {
        bail!("{what}: the protocol's output differs from the plaintext comparison");
    }
    Ok(())
}

struct Case<'a> {
    sk: &'a SecretKey,
    params: Params,
    u: Vec<i32>,
    probes: Vec<Vec<i32>>,
    sp: SigningKey,
    aux: &'a RingPedersenParams,
}

impl Case<'_> {
    fn threshold(&self, w: &[i32]) -> i64 {
        // At the inner product itself: the comparison's hardest case (IP = T).
        dot(&self.u, w)
    }
}

fn bench_pi1(case: &Case, rng: &mut ChaCha20Rng) -> Result<Row> {
    let p = &case.params;
    let (device, enrol) = timed(|| {
        Pi1Device::enrol(p.clone(), clone_key(case.sk)?, &case.u, rng).map_err(|e| anyhow!("{e}"))
    })?;
    let r1 = device.round1();
    let (tables, offline) = tables_for(p, device.public_key(), device.template())?;
    let mut sizes = (0, 0);
    let (m, fast) = with_and_without_tables(case, &tables, |w, tables| {
        let threshold = case.threshold(w);
        let mut t = Pi1Terminal::new(p.clone(), w.to_vec(), threshold)?;
        if let Some(tables) = tables {
            t = t.with_precomputed(tables);
        }
        let nonce = device.public_key().random_nonce_power(rng);
        let (r2, t2) = timed(|| Ok(t.round2_with_nonce_power(&r1, &nonce, rng)?))?;
        let (nonce_online, t_nonce) = timed(|| Ok(device.public_key().random_nonce_power(rng)))?;
        drop(nonce_online);
        let ((r3, outcome), t3) = timed(|| Ok(device.round3(&r2)?))?;
        let (out, tf) = timed(|| Ok(t.finish(&r3)?))?;
        check(out, &case.u, w, threshold, "Π1 terminal")?;
        check(outcome.matched, &case.u, w, threshold, "Π1 device")?;
        sizes = (r2.len(), r3.len());
        Ok(vec![t2, t3, tf, t_nonce])
    })?;
    let pooled = m[0] + m[1] + m[2];
    Ok(Row {
        protocol: Protocol::Pi1,
        modulus_bits: p.modulus_bits(),
        dim: p.dim(),
        value_bits: p.value_bits(),
        layout: (p.layout().values_per_ciphertext(), p.layout().ciphertexts()),
        enrolment: Enrolment::Packed {
            encrypt: enrol,
            bytes: r1.len(),
        },
        rounds: vec![
            ("R1 D→T", Duration::ZERO, r1.len()),
            ("R2 T→D", m[0], sizes.0),
            ("R3 D→T", m[1], sizes.1),
            ("out T", m[2], 0),
        ],
        match_pooled: pooled,
        match_online: pooled + m[3],
        and_gates: None,
        tables: table_figures(offline, tables.table_bytes(), &fast, 3),
    })
}

/// What Π2/Π3 enrolment leaves: the signed packed template and its costs.
struct Enrolled {
    packed: Vec<Ciphertext>,
    signature: Vec<u8>,
    /// Device: slack, encryption of ℓ + 4 coordinates, plaintext-knowledge and key proofs.
    device_start: Duration,
    /// SP: decoding, key and plaintext-knowledge proof checks, the L2 challenge, its state
    /// encoded.
    sp_receive: Duration,
    /// Device: the L2 response.
    device_respond: Duration,
    /// SP: its state decoded, the L2 check, packing and signing.
    sp_finish: Duration,
    /// Bytes: request, challenge, response, signed template.
    bytes: [usize; 4],
}

/// Π2/Π3 enrolment Π_en ([ABMR20] §6.1, §8) between the device and the SP, timed per step.
fn enrol_with_proofs(case: &Case, rng: &mut ChaCha20Rng) -> Result<Enrolled> {
    let p = &case.params;
    let session = b"bench paillier enrolment";
    let ((device, request), device_start) = timed(|| {
        Ok(DeviceEnrolment::start(
            case.sk,
            p,
            "bench-device",
            &case.u,
            case.aux,
            session,
            rng,
        )?)
    })?;
    // The SP's state travels through its encoding between the two steps, as between
    // `paillier_enroll_begin` and `paillier_enroll_finish` (a row of paillier_pending).
    let ((state, challenge), sp_receive) = timed(|| {
        let (sp, challenge) = ServiceEnrolment::receive(&request, p, case.aux, session, rng)?;
        Ok((sp.to_bytes()?, challenge))
    })?;
    let challenge = challenge.ok_or_else(|| anyhow!("Π2/Π3 enrolment without a challenge"))?;
    let (response, device_respond) = timed(|| Ok(device.respond(&challenge)?))?;
    let (signed, sp_finish) = timed(|| {
        let sp = ServiceEnrolment::from_bytes(&state)?;
        Ok(sp.finish(Some(&response), &case.sp, i64::MAX)?)
    })?;
    let signed_bytes = signed.to_bytes()?;
    let kept = device.finish(&signed_bytes, &case.sp.verifying_key(), 0)?;
    // σ as presented in Round 1: device id, expiry and the SP's signature over them and the
    // Round-1 bytes (checked by `verifier` with verify_round1_signature).
    let signature = kept.round1_signature();
    Ok(Enrolled {
        packed: kept.record.packed,
        signature,
        device_start,
        sp_receive,
        device_respond,
        sp_finish,
        bytes: [
            request.len(),
            challenge.len(),
            response.len(),
            signed_bytes.len(),
        ],
    })
}

fn bench_pi2(case: &Case, rng: &mut ChaCha20Rng) -> Result<Row> {
    let p = &case.params;
    let e = enrol_with_proofs(case, rng)?;
    let enrolment = Enrolment::Proved {
        device_start: e.device_start,
        sp_receive: e.sp_receive,
        device_respond: e.device_respond,
        sp_finish: e.sp_finish,
        bytes: e.bytes,
    };
    let packed = e.packed.clone();
    let device = Pi2Device::new(p.clone(), clone_key(case.sk)?, e.packed, e.signature)?;
    let r1 = device.round1();
    let verify = verifier(&case.sp);
    let (tables, offline) = tables_for(p, device.public_key(), &packed)?;
    let mut sizes = (0, 0, 0);
    let (m, fast) = with_and_without_tables(case, &tables, |w, tables| {
        let threshold = case.threshold(w);
        let mut t = Pi2Terminal::new(p.clone(), w.to_vec(), threshold)?;
        if let Some(tables) = tables {
            t = t.with_precomputed(tables);
        }
        let nonce = device.public_key().random_nonce_power(rng);
        let (r2, t2) = timed(|| Ok(t.round2_with_nonce_power(&r1, &verify, &nonce, rng)?))?;
        let (_, t_nonce) = timed(|| Ok(device.public_key().random_nonce_power(rng)))?;
        let mut s = device.session();
        let (r3, t3) = timed(|| Ok(s.round3(&r2)?))?;
        let ((r4, outcome), t4) = timed(|| Ok(t.round4(&r3)?))?;
        let (d, tf) = timed(|| Ok(s.finish(&r4)?))?;
        check(outcome.matched, &case.u, w, threshold, "Π2 terminal")?;
        check(d, &case.u, w, threshold, "Π2 device")?;
        sizes = (r2.len(), r3.len(), r4.len());
        Ok(vec![t2, t3, t4, tf, t_nonce])
    })?;
    let pooled = m[0] + m[1] + m[2] + m[3];
    Ok(Row {
        protocol: Protocol::Pi2,
        modulus_bits: p.modulus_bits(),
        dim: p.dim(),
        value_bits: p.value_bits(),
        layout: (p.layout().values_per_ciphertext(), p.layout().ciphertexts()),
        enrolment,
        rounds: vec![
            ("R1 D→T", Duration::ZERO, r1.len()),
            ("R2 T→D", m[0], sizes.0),
            ("R3 D→T", m[1], sizes.1),
            ("R4 T→D", m[2], sizes.2),
            ("out D", m[3], 0),
        ],
        match_pooled: pooled,
        match_online: pooled + m[4],
        and_gates: None,
        tables: table_figures(offline, tables.table_bytes(), &fast, 4),
    })
}

fn bench_pi3(case: &Case, rng: &mut ChaCha20Rng) -> Result<Row> {
    let p = &case.params;
    let e = enrol_with_proofs(case, rng)?;
    let enrolment = Enrolment::Proved {
        device_start: e.device_start,
        sp_receive: e.sp_receive,
        device_respond: e.device_respond,
        sp_finish: e.sp_finish,
        bytes: e.bytes,
    };
    let packed = e.packed.clone();
    let device = Pi3Device::new(p.clone(), clone_key(case.sk)?, e.packed, e.signature)?;
    let r1 = device.round1();
    let verify = verifier(&case.sp);
    let pk = case.sk.public_key();
    let (tables, offline) = tables_for(p, pk, &packed)?;
    let mut sizes = (0, 0, 0, 0);
    let (m, fast) = with_and_without_tables(case, &tables, |w, tables| {
        let threshold = case.threshold(w);
        let mut t = Pi3Terminal::new(p.clone(), w.to_vec(), threshold)?;
        if let Some(tables) = tables {
            t = t.with_precomputed(tables);
        }
        let nonces = [pk.random_nonce_power(rng), pk.random_nonce_power(rng)];
        let (r2, t2) = timed(|| {
            Ok(t.round2_with_nonce_powers(&r1, &verify, [&nonces[0], &nonces[1]], rng)?)
        })?;
        let (_, t_nonce) = timed(|| Ok([pk.random_nonce_power(rng), pk.random_nonce_power(rng)]))?;
        let mut s = device.session();
        let (r3, t3) = timed(|| Ok(s.round3(&r2, rng)?))?;
        let (r4, t4) = timed(|| Ok(t.round4(&r3, rng)?))?;
        let ((r5, d), t5) = timed(|| Ok(s.round5(&r4)?))?;
        let (out, tf) = timed(|| Ok(t.finish(&r5)?))?;
        check(out, &case.u, w, threshold, "Π3 terminal")?;
        check(d, &case.u, w, threshold, "Π3 device")?;
        sizes = (r2.len(), r3.len(), r4.len(), r5.len());
        Ok(vec![t2, t3, t4, t5, tf, t_nonce])
    })?;
    let pooled = m[0] + m[1] + m[2] + m[3] + m[4];
    Ok(Row {
        protocol: Protocol::Pi3,
        modulus_bits: p.modulus_bits(),
        dim: p.dim(),
        value_bits: p.value_bits(),
        layout: (p.layout().values_per_ciphertext(), p.layout().ciphertexts()),
        enrolment,
        rounds: vec![
            ("R1 D→T", Duration::ZERO, r1.len()),
            ("R2 T→D", m[0], sizes.0),
            ("R3 D→T", m[1], sizes.1),
            ("R4 T→D", m[2], sizes.2),
            ("R5 D→T", m[3], sizes.3),
            ("out T", m[4], 0),
        ],
        match_pooled: pooled,
        match_online: pooled + m[5],
        and_gates: Some(circuit(p, 0)?.and_count()),
        tables: table_figures(offline, tables.table_bytes(), &fast, 5),
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// The paper's figure for a row, where [ABMR20] §9 gives one (ℓ = 256, m = 16).
fn paper_ms(row: &Row) -> Option<f64> {
    if row.dim != 256 || row.value_bits != 16 {
        return None;
    }
    Some(match row.protocol {
        Protocol::Pi1 => 24.0,
        Protocol::Pi2 => 49.0,
        Protocol::Pi3 => 119.0,
    })
}

fn cpu() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mut features = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        for (name, on) in [
            ("aes", std::is_x86_feature_detected!("aes")),
            ("vaes", std::is_x86_feature_detected!("vaes")),
            ("avx2", std::is_x86_feature_detected!("avx2")),
            ("avx512f", std::is_x86_feature_detected!("avx512f")),
            ("avx512ifma", std::is_x86_feature_detected!("avx512ifma")),
            ("adx", std::is_x86_feature_detected!("adx")),
            ("bmi2", std::is_x86_feature_detected!("bmi2")),
        ] {
            if on {
                features.push(name);
            }
        }
    }
    format!("{model} [{}]", features.join(" "))
}

/// Runs the benchmark and prints its tables.
pub fn run(args: PaillierBenchArgs) -> Result<()> {
    let protocols: Vec<Protocol> = args
        .protocols
        .iter()
        .map(|p| protocol_of(p))
        .collect::<Result<_>>()?;
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    println!("privmatch bench paillier — one core, {}", cpu());
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let (aux, aux_time) = timed(|| {
        Ok(RingPedersenParams::generate(
            DEFAULT_RING_PEDERSEN_BITS,
            &mut rng,
        )?)
    })?;
    println!(
        "SP's ring-Pedersen parameters ({DEFAULT_RING_PEDERSEN_BITS}-bit, once per SP): {} ms",
        ms(aux_time)
    );
    let mut rows = Vec::new();
    for &bits in &args.modulus_bits {
        let (sk, keygen) = timed(|| Ok(SecretKey::generate(bits, &mut rng)?))?;
        println!("key generation, |N| = {bits}: {} ms", ms(keygen));
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let sp = SigningKey::from_bytes(&seed);
        for &dim in &args.dims {
            for &m in &args.value_bits {
                for &protocol in &protocols {
                    let params = Params::new(
                        protocol,
                        dim,
                        m,
                        bits,
                        DEFAULT_STAT_BITS,
                        Params::max_norm_bound(dim, m),
                    )?;
                    let case = Case {
                        sk: &sk,
                        u: random_vector(dim, m, &mut rng),
                        probes: (0..args.reps)
                            .map(|_| random_vector(dim, m, &mut rng))
                            .collect(),
                        params,
                        sp: sp.clone(),
                        aux: &aux,
                    };
                    eprintln!("… {protocol:?} |N| = {bits}, ℓ = {dim}, m = {m}");
                    let row = match protocol {
                        Protocol::Pi1 => bench_pi1(&case, &mut rng)?,
                        Protocol::Pi2 => bench_pi2(&case, &mut rng)?,
                        Protocol::Pi3 => bench_pi3(&case, &mut rng)?,
                    };
                    rows.push(row);
                }
            }
        }
    }
    print_tables(&rows);
    Ok(())
}

fn print_tables(rows: &[Row]) {
    println!();
    println!("## Matching (median of the runs; every output equal to the plaintext comparison)");
    println!();
    println!("| protocol | \\|N\\| | ℓ | m | values/ct, t | rounds: time ms / bytes | matching ms (r^N pooled) | matching ms (r^N online) | paper ms | ours / paper |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let rounds: Vec<String> = r
            .rounds
            .iter()
            .map(|(name, t, b)| {
                if *b == 0 {
                    format!("{name} {}", ms(*t))
                } else if t.is_zero() {
                    format!("{name} {b} B")
                } else {
                    format!("{name} {} / {b} B", ms(*t))
                }
            })
            .collect();
        let paper = paper_ms(r);
        println!(
            "| {:?} | {} | {} | {} | {}, {} | {} | {} | {} | {} | {} |",
            r.protocol,
            r.modulus_bits,
            r.dim,
            r.value_bits,
            r.layout.0,
            r.layout.1,
            rounds.join("; "),
            ms(r.match_pooled),
            ms(r.match_online),
            paper.map_or("–".into(), |p| format!("{p:.0}")),
            paper.map_or("–".into(), |p| format!(
                "{:.2}",
                r.match_pooled.as_secs_f64() * 1e3 / p
            )),
        );
    }
    print_table_rows(rows);
    println!();
    println!("## Enrolment (Π1: the device packs and encrypts; Π2/Π3: Π_en with the key, plaintext-knowledge and L2-norm proofs)");
    println!();
    println!("| protocol | \\|N\\| | ℓ | m | device: encrypt + prove ms | SP: verify + challenge ms | device: L2 response ms | SP: restore state + check + pack + sign ms | total ms | bytes: request / challenge / response / signed template |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let head = format!(
            "| {:?} | {} | {} | {} |",
            r.protocol, r.modulus_bits, r.dim, r.value_bits
        );
        match &r.enrolment {
            Enrolment::Packed { encrypt, bytes } => println!(
                "{head} {} | – | – | – | {} | {bytes} / – / – / – |",
                ms(*encrypt),
                ms(*encrypt)
            ),
            Enrolment::Proved {
                device_start,
                sp_receive,
                device_respond,
                sp_finish,
                bytes,
            } => println!(
                "{head} {} | {} | {} | {} | {} | {} / {} / {} / {} |",
                ms(*device_start),
                ms(*sp_receive),
                ms(*device_respond),
                ms(*sp_finish),
                ms(*device_start + *sp_receive + *device_respond + *sp_finish),
                bytes[0],
                bytes[1],
                bytes[2],
                bytes[3]
            ),
        }
    }
    for r in rows.iter().filter(|r| r.and_gates.is_some()) {
        println!(
            "Π3 circuit at |N| = {}, ℓ = {}, m = {}: {} AND gates",
            r.modulus_bits,
            r.dim,
            r.value_bits,
            r.and_gates.unwrap_or(0)
        );
    }
}

/// The matching with the terminal's offline tables per device, against the online path.
fn print_table_rows(rows: &[Row]) {
    println!();
    println!("## Matching with the terminal's offline tables of the device's template (Round 1 is reusable; same sessions, every output checked)");
    println!();
    println!("| protocol | \\|N\\| | ℓ | m | tables: offline ms / MiB | R2 T→D ms: online Horner → tables | matching ms (r^N pooled + tables) | speed-up | paper ms | ours / paper |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let paper = paper_ms(r);
        let round2 = r.rounds.get(1).map_or(Duration::ZERO, |x| x.1);
        let fast = r.tables.match_pooled.as_secs_f64();
        println!(
            "| {:?} | {} | {} | {} | {} / {:.1} | {} → {} | {} | {:.2}× | {} | {} |",
            r.protocol,
            r.modulus_bits,
            r.dim,
            r.value_bits,
            ms(r.tables.offline),
            r.tables.bytes as f64 / f64::from(1u32 << 20),
            ms(round2),
            ms(r.tables.round2),
            ms(r.tables.match_pooled),
            r.match_pooled.as_secs_f64() / fast.max(1e-9),
            paper.map_or("–".into(), |p| format!("{p:.0}")),
            paper.map_or("–".into(), |p| format!("{:.2}", fast * 1e3 / p)),
        );
    }
}
