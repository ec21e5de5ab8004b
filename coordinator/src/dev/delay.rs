//! A TCP relay that holds every byte for a fixed one-way delay in each direction: the links of
//! a local cluster made to behave like links between hosts (`privmatch cluster up
//! --link-delay-ms`), where the kernel offers no `netem` (the machines this project runs on
//! have none).
//!
//! Each accepted connection is relayed to its target by two pumps, one per direction. A pump
//! reads what arrives, stamps it with the time it is due (arrival + the delay) and hands it to
//! a writer that sleeps until then: a delay, not a bandwidth limit — bytes that arrive back to
//! back leave back to back, a delay later, however many are in flight (up to
//! [`IN_FLIGHT_CHUNKS`] reads of [`CHUNK`] bytes per direction, about 64 MiB; then the reader
//! waits, as a sender waits on a full TCP window). An end of stream is passed on after the
//! delay too; an error on either side closes the connection's both directions.
//!
//! The relay sees only ciphertext (the links it carries are TLS), so it adds no party to the
//! trust model: it is the network.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The most bytes one read takes.
pub const CHUNK: usize = 64 * 1024;

/// Reads held per direction before the reader waits for the writer.
pub const IN_FLIGHT_CHUNKS: usize = 1024;

/// One delayed link: connections to `listen` are relayed to `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// Where the relay listens.
    pub listen: SocketAddr,
    /// Where it connects for each accepted connection: `host:port`, the host an address or a
    /// name resolved at each connection (a container restarted with a new address is still
    /// reached under its name).
    pub target: String,
}

impl std::str::FromStr for Link {
    type Err = String;

    /// Parses `LISTEN=TARGET`: an `ip:port` to listen on and a `host:port` to relay to.
    fn from_str(text: &str) -> Result<Link, String> {
        let (listen, target) = text
            .split_once('=')
            .ok_or_else(|| format!("a link is LISTEN=TARGET (ip:port=host:port), got {text:?}"))?;
        let listen = listen
            .trim()
            .parse::<SocketAddr>()
            .map_err(|e| format!("the link's listen address {listen:?} is not an ip:port: {e}"))?;
        let target = target.trim();
        let port_ok = target
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(format!(
                "the link's target {target:?} is not a host:port (a port of 0 to 65535)"
            ));
        }
        Ok(Link {
            listen,
            target: target.to_owned(),
        })
    }
}

/// Serves every link until the process ends: binds them all first (so a port in use is an
/// error before anything is relayed), then relays each accepted connection with `one_way`.
pub async fn serve(links: &[Link], one_way: Duration) -> Result<()> {
    let mut listeners = Vec::with_capacity(links.len());
    for link in links {
        let listener = TcpListener::bind(link.listen)
            .await
            .with_context(|| format!("cannot listen on {} for the delayed link", link.listen))?;
        listeners.push((listener, link.target.clone()));
    }
    let mut accepting = tokio::task::JoinSet::new();
    for (listener, target) in listeners {
        accepting.spawn(accept_loop(listener, target, one_way));
    }
    while let Some(done) = accepting.join_next().await {
        done.context("a link's accept loop failed")??;
    }
    Ok(())
}

/// Accepts connections on `listener` and relays each to `target` on a task of its own. A
/// failed accept (out of file descriptors, say) is logged and retried after a pause: the links
/// stay up.
pub async fn accept_loop(listener: TcpListener, target: String, one_way: Duration) -> Result<()> {
    loop {
        let (inbound, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("delayed link to {target}: accept failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let target = target.clone();
        tokio::spawn(async move {
            if let Err(e) = relay(inbound, &target, one_way).await {
                tracing::debug!("delayed link {peer} -> {target} closed: {e:#}");
            }
        });
    }
}

/// Relays one connection both ways with `one_way` added in each direction.
async fn relay(inbound: TcpStream, target: &str, one_way: Duration) -> Result<()> {
    // The connection to the target is made at once: a real link's handshake would take a
    // round trip, but the protocols carried here (TLS, PostgreSQL's start-up) pay that on
    // their own first messages, which are delayed.
    let outbound = TcpStream::connect(target)
        .await
        .with_context(|| format!("cannot reach {target}"))?;
    for stream in [&inbound, &outbound] {
        // Small protocol messages must not wait for Nagle's timer on top of the delay.
        stream.set_nodelay(true)?;
    }
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let forward = pump(in_read, out_write, one_way);
    let backward = pump(out_read, in_write, one_way);
    // Either direction failing ends the connection; a clean end of one waits for the other.
    tokio::try_join!(forward, backward)?;
    Ok(())
}

/// Copies `from` to `to`, each read leaving `one_way` after it arrived; the end of stream is
/// passed on (a write shutdown) after the delay too.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, one_way: Duration) -> Result<()> {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT_CHUNKS);
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buf).await?;
            // An empty chunk marks the end of stream.
            let chunk = buf[..n].to_vec();
            if tx.send((Instant::now() + one_way, chunk)).await.is_err() || n == 0 {
                return Ok::<(), std::io::Error>(());
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if chunk.is_empty() {
                to.shutdown().await?;
                return Ok(());
            }
            to.write_all(&chunk).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::try_join!(reader, writer)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port; returns its address.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// A delayed link to `target` on a free port; returns its address.
    async fn delayed(target: SocketAddr, one_way: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(accept_loop(listener, target.to_string(), one_way));
        addr
    }

    #[tokio::test]
    async fn a_round_trip_takes_the_delay_twice_and_bytes_arrive_intact() {
        let one_way = Duration::from_millis(40);
        let proxy = delayed(echo_server().await, one_way).await;
        let mut stream = TcpStream::connect(proxy).await.expect("connect");
        let message: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let started = Instant::now();
        stream.write_all(&message).await.expect("write");
        let mut back = vec![0u8; message.len()];
        stream.read_exact(&mut back).await.expect("read");
        assert!(started.elapsed() >= 2 * one_way, "{:?}", started.elapsed());
        assert!(back == message);
    }

    #[tokio::test]
    async fn messages_in_flight_are_delayed_together_not_one_after_another() {
        // 20 messages written 5 ms apart (separate reads at the relay), each echoed: the last
        // answer comes one round trip after the last message. A relay that held each read
        // for the delay before taking the next would need 20 round trips (1.6 s).
        let one_way = Duration::from_millis(40);
        let proxy = delayed(echo_server().await, one_way).await;
        let stream = TcpStream::connect(proxy).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (mut read, mut write) = stream.into_split();
        let started = Instant::now();
        let writer = tokio::spawn(async move {
            for i in 0..20u8 {
                write.write_all(&[i; 100]).await.expect("write");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            write
        });
        let mut back = vec![0u8; 2_000];
        read.read_exact(&mut back).await.expect("read");
        let took = started.elapsed();
        let _write = writer.await.expect("writer");
        assert!(took >= 2 * one_way, "{took:?}");
        assert!(took < Duration::from_millis(1_000), "{took:?}");
        assert!(back
            .chunks(100)
            .enumerate()
            .all(|(i, c)| c.iter().all(|&b| usize::from(b) == i)));
    }

    #[tokio::test]
    async fn a_target_named_by_host_name_is_resolved_and_reached() {
        let echo = echo_server().await;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = listener.local_addr().expect("addr");
        let target = format!("localhost:{}", echo.port());
        tokio::spawn(accept_loop(listener, target, Duration::from_millis(5)));
        let mut stream = TcpStream::connect(proxy).await.expect("connect");
        stream.write_all(b"by name").await.expect("write");
        let mut back = [0u8; 7];
        stream.read_exact(&mut back).await.expect("read");
        assert_eq!(&back, b"by name");
    }

    #[tokio::test]
    async fn the_end_of_stream_is_passed_on() {
        let proxy = delayed(echo_server().await, Duration::from_millis(5)).await;
        let mut stream = TcpStream::connect(proxy).await.expect("connect");
        stream.write_all(b"last words").await.expect("write");
        stream.shutdown().await.expect("shutdown");
        let mut back = Vec::new();
        stream
            .read_to_end(&mut back)
            .await
            .expect("read to the end");
        assert_eq!(back, b"last words");
    }

    #[tokio::test]
    async fn a_target_that_refuses_closes_the_connection() {
        // A port with nothing behind it: bind, note it, drop.
        let closed = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .local_addr()
            .expect("addr");
        let proxy = delayed(closed, Duration::from_millis(5)).await;
        let mut stream = TcpStream::connect(proxy).await.expect("connect");
        let mut back = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut back))
            .await
            .expect("the relay closed the connection");
        assert!(read.is_err() || back.is_empty());
    }

    #[test]
    fn links_parse_strictly() {
        let link: Link = "127.0.0.1:15450=127.0.0.1:15430".parse().expect("a link");
        assert_eq!(link.listen.port(), 15450);
        assert_eq!(link.target, "127.0.0.1:15430");
        let named: Link = "0.0.0.0:15432=p0:5432".parse().expect("a link to a name");
        assert_eq!(named.target, "p0:5432");
        for bad in [
            "",
            "127.0.0.1:1",
            "a=b",
            "127.0.0.1:1=",
            "=127.0.0.1:1",
            "p0:1=p0:2",
            "127.0.0.1:1=p0",
            "127.0.0.1:1=p0:99999",
            "127.0.0.1:1=:5432",
        ] {
            assert!(bad.parse::<Link>().is_err(), "{bad:?}");
        }
    }
}
