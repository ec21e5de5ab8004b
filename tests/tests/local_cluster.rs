//! The local cluster (`privmatch cluster up|down`) as another local user sees it, and the
//! parties' identities as a client pins them.
//!
//! * No secret (initdb's password file, the superuser and coordinator passwords, `party.key`,
//!   the operators' signing keys, the TLS private keys, the configurations, the API
//!   credentials) is readable by another local user at any moment of `up` (a thread walks the
//!   home directory while `up` runs) or after it (checked as `nobody`); every log is 0600;
//!   the coordinator does not run as root; `down --purge` leaves no key, and the next `up`
//!   makes a new CA. With the superuser passwords out of reach, a local user has no way to
//!   `pg_read_file` the party key: the only logins it could try are the coordinator's and the
//!   application's roles, which may not read server files (42501).
//! * The parties' keys come from their operators' signed identity bundles, pinned with the
//!   fingerprint given out of band: a bundle whose key was swapped, or pinned with the wrong
//!   fingerprint, is refused naming the party; a key the coordinator substitutes in its own
//!   configuration reaches no client, and a key put in the client's configuration without a
//!   bundle is refused.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use privmatch_coordinator::config::{Config, CoordinatorConfig, COORDINATOR_CONFIG_FILE};
use privmatch_coordinator::identity::IdentityBundle;
use privmatch_e2e::{run, Cluster};

/// Files whose name says they hold something secret: keys, passwords, credentials,
/// configurations (which hold passwords or tokens) and logs.
fn is_secret(path: &Path) -> bool {
    let name = file_name(path);
    name.ends_with(".key")
        || name.contains("password")
        || name.contains("pwfile")
        || name.ends_with(".credential")
        || name.ends_with(".toml")
        || name.ends_with(".log")
}

/// The file name of `path`, without the `.tmp` of a file being written atomically (which
/// has the mode of the file it will replace).
fn file_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_suffix(".tmp")
        .map_or(name.clone(), str::to_owned)
}

/// Public files other users may read when they can reach them: certificates and identity
/// bundles.
fn is_public(path: &Path) -> bool {
    let name = file_name(path);
    name.ends_with(".pem") || name.ends_with(".identity.json")
}

/// Every directory and regular file under `root` (and `root`): path and mode. Entries that
/// vanish while walking (a running `up`) are skipped.
fn walk(root: &Path) -> Vec<(PathBuf, u32, bool)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let mode = meta.mode() & 0o7777;
        if meta.is_dir() {
            out.push((path.clone(), mode, true));
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        } else if meta.is_file() {
            out.push((path, mode, false));
        }
    }
    out
}

/// What in `root` another user could read or list, or a secret with any bit for group or
/// others.
fn exposures(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (path, mode, dir) in walk(root) {
        let exposed = if dir {
            mode & 0o007 != 0
        } else if is_secret(&path) {
            mode & 0o077 != 0
        } else {
            !is_public(&path) && mode & 0o007 != 0
        };
        if exposed {
            found.push(format!("{} {mode:04o}", path.display()));
        }
    }
    found
}

/// What the watcher saw: exposures, walks that found files, and whether one of them found
/// initdb's password file (so the check covered it while it existed).
type Seen = (Vec<String>, usize, bool);

/// Walks `root` until `stop`, recording every exposure seen and how many walks found files.
fn watch(root: PathBuf, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    while !stop.load(Ordering::Relaxed) {
        let entries = walk(&root);
        let exposed = exposures(&root);
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() > 1 {
            seen.1 += 1;
        }
        if entries
            .iter()
            .any(|(p, _, _)| p.to_string_lossy().contains("pwfile"))
        {
            seen.2 = true;
        }
        for e in exposed {
            if !seen.0.contains(&e) {
                seen.0.push(e);
            }
        }
        drop(seen);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The user id and effective user id of process `pid`.
fn process_uids(pid: u32) -> (u32, u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    let ids: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().expect("uid"))
        .collect();
    (ids[0], ids[1])
}

fn uid_of(user: &str) -> u32 {
    let out = run(
        {
            let mut c = Command::new("id");
            c.args(["-u", user]);
            c
        },
        Duration::from_secs(10),
    )
    .expect_success();
    out.stdout.trim().parse().expect("uid")
}

/// The regular files under `root` that the user `nobody` can read.
fn readable_by_nobody(root: &Path) -> Vec<String> {
    let files: Vec<String> = walk(root)
        .into_iter()
        .filter(|(_, _, dir)| !dir)
        .map(|(p, _, _)| p.display().to_string())
        .collect();
    assert!(files.len() > 20, "too few files to check: {files:?}");
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "nobody", "--", "sh", "-c"])
        .arg(r#"for f in "$@"; do if [ -r "$f" ]; then echo "$f"; fi; done"#)
        .arg("sh")
        .args(&files);
    let out = run(cmd, Duration::from_secs(60)).expect_success();
    out.stdout.lines().map(str::to_owned).collect()
}

/// The names (relative to `root`) of the files left under `root` that hold or are keys,
/// passwords, credentials or configurations.
fn key_files(root: &Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .filter(|(p, _, dir)| !dir && (is_secret(p) || p.to_string_lossy().ends_with(".pem")))
        .map(|(p, _, _)| p.display().to_string())
        .collect()
}

#[test]
fn cluster_up_exposes_no_secret_and_purge_leaves_no_key() {
    let name = "local-cluster-modes";
    let root = PathBuf::from(format!("/tmp/pm-e2e-{name}"));
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Seen>> = Arc::new(Mutex::new((Vec::new(), 0, false)));
    let watcher = {
        let (root, stop, seen) = (root.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || watch(root, stop, seen))
    };
    let mut cluster = Cluster::start(name, 91);
    // Once more while it runs (`up` on a running cluster), then a restart of the coordinator.
    cluster.cluster_up();
    cluster.restart_coordinator();
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("watcher");
    let (exposed, walks, saw_pwfile) = seen.lock().map(|s| s.clone()).expect("seen");
    assert!(walks > 20, "the watcher saw the home only {walks} times");
    assert!(saw_pwfile, "the watcher never saw initdb's password file");
    assert!(
        exposed.is_empty(),
        "readable by other users during `up`: {exposed:#?}"
    );
    let after = exposures(&cluster.home);
    assert!(after.is_empty(), "readable by other users: {after:#?}");
    // As another local user, in fact.
    let readable = readable_by_nobody(&cluster.home);
    assert!(readable.is_empty(), "nobody can read {readable:#?}");
    // The home is not even listable; logs are 0600.
    let home_mode = std::fs::metadata(&cluster.home).expect("home").mode() & 0o777;
    assert_eq!(home_mode & 0o007, 0, "home {home_mode:04o}");
    let mut logs = vec![cluster.home.join("coordinator.log")];
    logs.extend((0..3).map(|i| cluster.home.join(format!("p{i}/postgres.log"))));
    for log in &logs {
        let mode = std::fs::metadata(log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()))
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{}", log.display());
    }
    // initdb's password file is gone.
    for i in 0..3 {
        assert!(!cluster.home.join(format!("p{i}/.initdb")).exists());
        assert!(!cluster.home.join(format!("p{i}/pwfile")).exists());
    }
    // The coordinator runs as the cluster's unprivileged user, not as root.
    let pid: u32 = std::fs::read_to_string(cluster.home.join("coordinator.pid"))
        .expect("coordinator.pid")
        .trim()
        .parse()
        .expect("pid");
    let (uid, euid) = process_uids(pid);
    assert!(
        uid != 0 && euid != 0,
        "the coordinator runs as uid {uid}/{euid}"
    );
    assert_eq!(uid, uid_of("postgres"));
    // Through the database: the logins a local user could hold without the superuser's
    // password cannot read the party's key file.
    let key_path = cluster.home.join("p0/party.key").display().to_string();
    let read_key = format!("SELECT pg_read_file('{key_path}')");
    let (code, message) = cluster
        .query_as_coordinator(0, &read_key)
        .expect_err("the coordinator's role read party.key");
    assert_eq!(code, "42501", "{message}");
    let application = cluster.application(0);
    let (code, message) = cluster
        .query_login(&application, &read_key, &[])
        .expect_err("the application role read party.key");
    assert_eq!(code, "42501", "{message}");

    // `down --purge` leaves no key, the CA's included; the next `up` makes a new CA.
    let ca_before = std::fs::read(cluster.home.join("tls/ca.pem")).expect("CA");
    cluster
        .cli(&["cluster", "down", "--purge"])
        .expect_success();
    let left = key_files(&cluster.home);
    assert!(left.is_empty(), "left after --purge: {left:#?}");
    assert!(!cluster.home.join("tls").exists());
    cluster.cluster_up();
    let ca_after = std::fs::read(cluster.home.join("tls/ca.pem")).expect("CA");
    assert_ne!(ca_before, ca_after, "the next `up` reused the purged CA");
    let after = exposures(&cluster.home);
    assert!(after.is_empty(), "readable by other users: {after:#?}");
}

/// `privmatch party identity-export` of party `i` into `out`: the fingerprint it prints.
fn export(cluster: &Cluster, i: usize, out: &Path) -> String {
    let operator = cluster.home.join(format!("operators/p{i}.toml"));
    let printed = cluster
        .cli(&[
            "party",
            "identity-export",
            "--operator-config",
            &operator.display().to_string(),
            "--out",
            &out.display().to_string(),
        ])
        .expect_success();
    let fingerprint = printed
        .stdout
        .split_whitespace()
        .skip_while(|w| *w != "fingerprint")
        .nth(1)
        .unwrap_or_else(|| panic!("no fingerprint in {}", printed.stdout))
        .to_owned();
    assert!(
        printed
            .stdout
            .contains(&format!("P{i} identity fingerprint")),
        "{}",
        printed.stdout
    );
    fingerprint
}

fn pin(
    cluster: &Cluster,
    config: &Path,
    bundle: &Path,
    fingerprint: &str,
) -> privmatch_e2e::CmdOutput {
    cluster.cli(&[
        "--config",
        &config.display().to_string(),
        "client",
        "pin",
        "--bundle",
        &bundle.display().to_string(),
        "--fingerprint",
        fingerprint,
    ])
}

#[test]
fn a_substituted_party_key_is_refused_naming_the_party() {
    let cluster = Cluster::start("identity-pins", 92);
    let home = &cluster.home;
    // What each party's database reports: the truth the operators export.
    let real: Vec<String> = (0..3)
        .map(|i| cluster.query(i, "SELECT public_key FROM privmatch.party_info()", &[])[0].get(0))
        .collect();
    // `cluster up` pinned exactly those, from bundles, with the keys the parties sign their
    // outputs with.
    assert_eq!(cluster.config.party_keys, real);
    assert_eq!(cluster.config.party_identities.len(), 3);
    let signing: Vec<String> = (0..3)
        .map(|i| {
            let key: Option<String> =
                cluster.query(i, "SELECT signing_key FROM privmatch.party_info()", &[])[0].get(0);
            key.expect("signing key")
        })
        .collect();
    assert_eq!(cluster.config.party_signing_keys, signing);

    // The coordinator, as an attacker, puts its own key in for P1 in its configuration.
    let attacker_key = hex::encode([0x42u8; 32]);
    let coordinator_path = home.join(COORDINATOR_CONFIG_FILE);
    let mut coordinator = CoordinatorConfig::load(&coordinator_path).expect("coordinator.toml");
    coordinator.parties[1].public_key = attacker_key.clone();
    coordinator.save(&coordinator_path).expect("save");
    // The client configuration it issues carries no party key at all (the old
    // `credential --client-config` copied this substituted key into it).
    let client_dir = home.join("new-client");
    let client_path = client_dir.join("privmatch.toml");
    cluster
        .cli(&[
            "coordinator",
            "credential",
            "--name",
            "new-client",
            "--scopes",
            "enroll,search",
            "--client-config",
            &client_path.display().to_string(),
            "--url",
            &cluster.coordinator_url(),
        ])
        .expect_success();
    let text = std::fs::read_to_string(&client_path).expect("client config");
    assert!(!text.contains(&attacker_key), "{text}");
    for key in &real {
        assert!(!text.contains(key.as_str()), "{text}");
    }
    let issued = Config::load(&client_path).expect("issued config");
    assert!(issued.party_keys.is_empty(), "{:?}", issued.party_keys);
    // Until the client pins bundles, it seals nothing (and enrols nothing).
    let templates = cluster.path("t.ndjson");
    let t = templates.display().to_string();
    cluster
        .cli(&["iris", "synth", "4", "-o", &t])
        .expect_success();
    cluster
        .cli(&[
            "--config",
            &client_path.display().to_string(),
            "iris",
            "enroll",
            "--input",
            &t,
        ])
        .expect_failure()
        .assert_stderr_contains(&["no key is pinned for P0"]);
    assert_eq!(cluster.record_counts(), [0, 0, 0]);

    // The operators export their bundles; the fingerprints reach the client out of band.
    let bundles: Vec<PathBuf> = (0..3)
        .map(|i| cluster.path(&format!("p{i}-bundle.json")))
        .collect();
    let fingerprints: Vec<String> = (0..3).map(|i| export(&cluster, i, &bundles[i])).collect();

    // A bundle whose key was swapped in transit (the coordinator's key for P1): the signature
    // fails, P1 is named, nothing is pinned.
    let mut swapped = IdentityBundle::load(&bundles[1]).expect("bundle");
    swapped.public_key = attacker_key.clone();
    let swapped_path = cluster.path("p1-swapped.json");
    std::fs::write(
        &swapped_path,
        serde_json::to_string(&swapped).expect("json"),
    )
    .expect("write");
    pin(&cluster, &client_path, &swapped_path, &fingerprints[1])
        .expect_failure()
        .assert_stderr_contains(&["P1's identity bundle", "signature does not verify"]);
    // A bundle the coordinator made for P1 with its own key, signed with its own operator
    // key: it verifies, but not under the fingerprint P1's operator gave.
    let forged = {
        use privmatch_coordinator::identity::PartyIdentity;
        use privmatch_core::crypto::seal::PartyPublicKey;
        use privmatch_core::crypto::sign::OperatorSigningKey;
        let signing = OperatorSigningKey::from_bytes(&[0x66; 32]);
        let identity = PartyIdentity {
            party: 1,
            public_key: PartyPublicKey::from_hex(&attacker_key).expect("key"),
            signing_key: ed25519_dalek::SigningKey::from_bytes(&[0x67; 32]).verifying_key(),
            operator_key: ed25519_dalek::VerifyingKey::from_bytes(
                &signing.verifying_key().to_bytes(),
            )
            .expect("operator key"),
            tls_ca_sha256: [0; 32],
        };
        identity.sign(&signing, 1).expect("sign")
    };
    let forged_path = cluster.path("p1-forged.json");
    std::fs::write(&forged_path, serde_json::to_string(&forged).expect("json")).expect("write");
    pin(&cluster, &client_path, &forged_path, &fingerprints[1])
        .expect_failure()
        .assert_stderr_contains(&["P1's identity bundle has fingerprint", "refusing"]);
    // P1's genuine bundle with P2's fingerprint: refused as well.
    pin(&cluster, &client_path, &bundles[1], &fingerprints[2])
        .expect_failure()
        .assert_stderr_contains(&["P1's identity bundle has fingerprint"]);
    let still = Config::load(&client_path).expect("config");
    assert!(still.party_keys.iter().all(String::is_empty));
    // The genuine bundles with the genuine fingerprints: pinned, the real keys.
    for i in 0..3 {
        let out = pin(&cluster, &client_path, &bundles[i], &fingerprints[i]).expect_success();
        assert!(
            out.stdout.contains(&format!("pinned P{i}")),
            "{}",
            out.stdout
        );
    }
    let pinned = Config::load(&client_path).expect("config");
    assert_eq!(pinned.party_keys, real);
    assert_eq!(pinned.party_signing_keys, signing);
    // Still movable with its CA certificate: the path stays relative.
    let text = std::fs::read_to_string(&client_path).expect("client config");
    assert!(text.contains("ca_cert = \"coordinator-ca.pem\""), "{text}");
    let listed = cluster
        .cli(&[
            "--config",
            &client_path.display().to_string(),
            "client",
            "pins",
        ])
        .expect_success();
    assert!(
        listed.stdout.contains(&fingerprints[1]),
        "{}",
        listed.stdout
    );
    // Once pinned, another identity for P1 is refused without --replace.
    pin(
        &cluster,
        &client_path,
        &forged_path,
        &forged_fingerprint(&forged),
    )
    .expect_failure()
    .assert_stderr_contains(&["P1 is pinned with identity fingerprint"]);

    // The coordinator's substituted key changed nothing the client seals to: the client's own
    // configuration still pins the real keys, and an enrolment sealed to them is opened and
    // stored by all three parties (a share sealed to another key would not open).
    let config = Config::load(&home.join("privmatch.toml")).expect("client config");
    assert_eq!(config.party_keys, real);
    cluster.enroll(&templates, &[]).expect_success();
    assert_eq!(cluster.record_counts(), [4, 4, 4]);
    // A key written into the client's configuration without its bundle (as the old flow
    // copied the coordinator's) is refused before anything is sealed, naming the party.
    let mut edited = config.clone();
    edited.party_keys[1] = attacker_key;
    let edited_path = cluster.path("edited.toml");
    edited.save(&edited_path).expect("save");
    cluster
        .cli(&[
            "--config",
            &edited_path.display().to_string(),
            "iris",
            "enroll",
            "--input",
            &t,
        ])
        .expect_failure()
        .assert_stderr_contains(&["P1's key in party_keys is not the key of the identity bundle"]);
    assert_eq!(cluster.record_counts(), [4, 4, 4]);
    // A configuration an older version wrote (keys copied, no bundle) is refused, and
    // `cluster up` writes it afresh from the operators' bundles.
    let mut old = config;
    old.party_identities.clear();
    old.party_signing_keys.clear();
    let client_config = home.join("privmatch.toml");
    old.save(&client_config).expect("save");
    let err = format!(
        "{:#}",
        Config::load(&client_config).expect_err("old config")
    );
    assert!(
        err.contains("P0's key is not pinned from its operator's identity bundle"),
        "{err}"
    );
    // `cluster up` first refuses the coordinator's substituted key, then, with the key put
    // back, writes the client configuration afresh.
    cluster
        .cli(&[
            "cluster",
            "up",
            "--base-port",
            &cluster.base_port.to_string(),
            "--coordinator-port",
            &cluster.coordinator_port.to_string(),
        ])
        .expect_failure()
        .assert_stderr_contains(&["P1 reports key", "refusing to continue"]);
    coordinator.parties[1].public_key = real[1].clone();
    coordinator.save(&coordinator_path).expect("save");
    cluster.cluster_up();
    let renewed = Config::load(&client_config).expect("renewed config");
    assert_eq!(renewed.party_keys, real);
    assert_eq!(renewed.party_identities.len(), 3);
}

/// The fingerprint of a bundle, as its signer would print it.
fn forged_fingerprint(bundle: &IdentityBundle) -> String {
    bundle.verify().expect("verifies").fingerprint_hex()
}

#[test]
fn files_keep_their_modes_when_checked() {
    // The checks above cannot pass vacuously: an exposed secret is found.
    let dir = std::env::temp_dir().join(format!("pm-modes-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::set_permissions(dir.join("sub"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let secret = dir.join("sub/party.key");
    std::fs::write(&secret, "x").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    std::fs::write(dir.join("sub/ca.pem"), "x").expect("write");
    std::fs::set_permissions(
        dir.join("sub/ca.pem"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let found = exposures(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("party.key"), "{found:?}");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert!(exposures(&dir).is_empty());
    std::fs::set_permissions(dir.join("sub"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    assert_eq!(exposures(&dir).len(), 1);
    std::fs::remove_dir_all(&dir).ok();
}
