//! The coordinator's cancel requests and the life of their keys (issue 34, item 8).
//!
//! A call that misses its deadline is cancelled at the party with a cancel request, which
//! carries the backend's process id and secret cancel key. PostgreSQL takes a cancel request
//! without looking at `pg_hba.conf`, so it accepts one in the clear even where every session
//! must use TLS (`hostnossl all all all reject`, as on the local cluster): whoever reads the
//! key off the network can cancel that backend's queries for as long as it lives.
//!
//! Against 0.10.0 (f21d1f1) the coordinator sent the request with `NoTls` on connections
//! opened with `sslmode=require`: tokio-postgres sent an SSLRequest, got 'S' and could not go
//! on without TLS, so the cancel never arrived, and the timed-out call kept running at the
//! party (the first check below fails there: `pg_sleep(60)` stays active). Sent in the clear
//! instead (`sslmode=disable`), it would show as a plaintext CancelRequest (code 80877102) to
//! the proxy below (the second check). Pooled connections lived as long as the pool, and their
//! cancel keys with them (the third check: the same backend is handed out again after its
//! maximum age).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use privmatch_coordinator::iris::driver::SearchError;
use privmatch_coordinator::parties::{open, Parties, PartyError};
use privmatch_coordinator::session::driver::{call_with_timeout, SessionError};
use privmatch_core::party::PartyIndex;
use privmatch_e2e::{Cluster, PartyConfig};

/// The protocol code of an SSLRequest (PostgreSQL protocol, "Message Formats").
const SSL_REQUEST: u32 = 80_877_103;
/// The protocol code of a CancelRequest.
const CANCEL_REQUEST: u32 = 80_877_102;

/// What the proxy saw at the start of one connection from the coordinator: the first packet's
/// length and code, and the first byte after an SSLRequest (0x16: a TLS handshake record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Opening {
    length: u32,
    code: u32,
    after_ssl_request: Option<u8>,
}

/// A TCP proxy on an ephemeral loopback port in front of a party's PostgreSQL that records how
/// each connection opens, then relays both ways.
struct Proxy {
    port: u16,
    seen: Arc<Mutex<Vec<Opening>>>,
}

impl Proxy {
    fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let log = Arc::clone(&log);
                std::thread::spawn(move || relay(client, upstream_port, &log));
            }
        });
        Proxy { port, seen }
    }

    fn seen(&self) -> Vec<Opening> {
        self.seen.lock().expect("proxy log").clone()
    }
}

/// Relays one connection, recording its opening.
fn relay(mut client: TcpStream, upstream_port: u16, log: &Mutex<Vec<Opening>>) {
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream_port)) else {
        return;
    };
    let mut header = [0u8; 8];
    if client.read_exact(&mut header).is_err() {
        return;
    }
    let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let code = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if server.write_all(&header).is_err() {
        return;
    }
    // The server's answers go back on their own thread (its 'S' comes before the client's
    // next byte).
    let (Ok(mut from_server), Ok(mut to_client)) = (server.try_clone(), client.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Write);
    });
    let mut after_ssl_request = None;
    if length == 8 && code == SSL_REQUEST {
        let mut next = [0u8; 1];
        if client.read_exact(&mut next).is_ok() {
            after_ssl_request = Some(next[0]);
            let _ = server.write_all(&next);
        }
    }
    log.lock().expect("proxy log").push(Opening {
        length,
        code,
        after_ssl_request,
    });
    let _ = std::io::copy(&mut client, &mut server);
    let _ = server.shutdown(Shutdown::Write);
}

/// The state of backend `pid` at a party (None once it has ended), read by its operator.
async fn backend_state(operator: &tokio_postgres::Client, pid: i32) -> Option<String> {
    operator
        .query_opt(
            "SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .expect("pg_stat_activity")
        .map(|row| row.get(0))
}

async fn backend_pid(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid")
        .get(0)
}

/// Waits up to `timeout` for `done`, polling every 50 ms; whether it happened.
async fn eventually<F, Fut>(timeout: Duration, mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_timed_out_call_is_cancelled_over_tls_and_pooled_connections_age_out() {
    let cluster = Cluster::start("cancel-tls", 77);
    let p0 = PartyIndex::ALL[0];

    // --- 1. a call past its deadline is cancelled at the party, over TLS -------------------
    let proxy = Proxy::start(cluster.base_port);
    let login = PartyConfig {
        port: proxy.port,
        ..cluster.coordinator_logins[0].clone()
    };
    assert!(
        login.ca_cert.is_some(),
        "the local cluster's coordinator connects with TLS"
    );
    let (pid, outcome, stopped, waited) = cluster.block_on(async {
        let operator = &cluster.connect(0).await;
        let client = open(&login)
            .await
            .expect("the coordinator's login through the proxy");
        let pid = backend_pid(&client).await;
        let outcome = call_with_timeout::<_, SearchError>(
            p0,
            &client,
            "pg_sleep",
            Duration::from_millis(500),
            client.query("SELECT pg_sleep(60)", &[]),
        )
        .await;
        // The client stays open meanwhile: only the cancel request can stop the sleep.
        let began = Instant::now();
        let stopped = eventually(Duration::from_secs(15), move || async move {
            backend_state(operator, pid).await.as_deref() != Some("active")
        })
        .await;
        let waited = began.elapsed();
        drop(client);
        (pid, outcome, stopped, waited)
    });
    match outcome {
        Err(e) => assert!(e.is_timeout(), "not a timeout: {e}"),
        Ok(rows) => panic!("pg_sleep(60) answered within 500 ms: {} rows", rows.len()),
    }
    assert!(
        stopped,
        "backend {pid} at P0 still runs pg_sleep(60) 15 s after its call timed out: the cancel \
         request did not arrive"
    );
    eprintln!("[cancel-tls] the timed-out call stopped at P0 {waited:?} after the timeout");
    // Two connections went through the proxy: the session and the cancel request. Both began
    // with an SSLRequest followed by a TLS handshake; none with a plaintext CancelRequest.
    let seen = proxy.seen();
    assert!(
        seen.len() >= 2,
        "the proxy saw {} connection(s), expected the session and the cancel request: {seen:?}",
        seen.len()
    );
    for opening in &seen {
        assert_ne!(
            opening.code, CANCEL_REQUEST,
            "a CancelRequest went in the clear: {seen:?}"
        );
        assert_eq!(
            (opening.length, opening.code, opening.after_ssl_request),
            (8, SSL_REQUEST, Some(0x16)),
            "a connection that did not open with TLS: {seen:?}"
        );
    }

    // --- 2. pooled connections are retired after their maximum age -------------------------
    let logins: [PartyConfig; 3] = cluster
        .coordinator_logins
        .clone()
        .try_into()
        .expect("three parties");
    let max_age = Duration::from_secs(2);
    let parties = Parties::with_max_age(logins, max_age);
    cluster.block_on(async {
        let operator = &cluster.connect(0).await;
        let party = &parties.all()[0];
        let connect = move || async move {
            party
                .connect()
                .await
                .unwrap_or_else(|e: PartyError| panic!("{e}"))
        };
        let client = connect().await;
        let first = backend_pid(&client).await;
        party.give_back(client).await;
        let client = connect().await;
        assert_eq!(
            backend_pid(&client).await,
            first,
            "a young connection is reused"
        );
        // It ages while lent: given back, it is closed, and its backend (and cancel key) ends.
        tokio::time::sleep(max_age + Duration::from_millis(200)).await;
        party.give_back(client).await;
        assert!(
            eventually(Duration::from_secs(10), move || async move {
                backend_state(operator, first).await.is_none()
            })
            .await,
            "backend {first} outlived its maximum age"
        );
        let client = connect().await;
        let second = backend_pid(&client).await;
        assert_ne!(second, first, "a retired connection was handed out again");
        party.give_back(client).await;
        // It ages while idle in the pool: the next connect opens a new one and closes it.
        tokio::time::sleep(max_age + Duration::from_millis(200)).await;
        let client = connect().await;
        let third = backend_pid(&client).await;
        assert_ne!(
            third, second,
            "an idle connection past its maximum age was reused"
        );
        assert!(
            eventually(Duration::from_secs(10), move || async move {
                backend_state(operator, second).await.is_none()
            })
            .await,
            "backend {second} outlived its maximum age"
        );
        party.give_back(client).await;
    });
}
