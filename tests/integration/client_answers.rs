//! Every client in a storm gets an answer it can read: a connection
//! evicted to make room is answered 503 (code 11) and read from until its
//! client has sent its request and closed, so the client's write succeeds
//! and it reads the answer instead of a reset; a body refused before it
//! was read is read away the same way, so the client sees its 413. The
//! outcomes are counted as a client sees them: its write, then its read.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use serde_json::json;

use crate::support::daemon::{wait_until, Daemon, TestDir};
use crate::support::http;

const T: Duration = Duration::from_secs(30);

/// What a client saw.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Seen {
    /// Its request was written whole and an answer with this status and
    /// CNI error code (0 when the body is no CNI error) was read, then the
    /// end of the stream.
    Answer(u16, u64),
    /// Writing the request failed.
    WriteFailed(ErrorKind),
    /// The request was written, reading the answer failed.
    ReadFailed(ErrorKind),
}

/// Writes `request` on `s` and reads until the end of the stream.
fn exchange(mut s: UnixStream, request: &[u8]) -> Seen {
    s.set_read_timeout(Some(T)).unwrap();
    if let Err(e) = s.write_all(request) {
        return Seen::WriteFailed(e.kind());
    }
    let mut buf = Vec::new();
    if let Err(e) = s.read_to_end(&mut buf) {
        return Seen::ReadFailed(e.kind());
    }
    match http::parse_response(&buf) {
        Ok(r) => {
            let code = serde_json::from_slice::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|v| v["code"].as_u64())
                .unwrap_or(0);
            Seen::Answer(r.status, code)
        }
        Err(_) => Seen::ReadFailed(ErrorKind::InvalidData),
    }
}

fn metric_over_tcp(port: u16, name: &str) -> Option<f64> {
    let r = http::metrics_over_tcp(port);
    r.body_str()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// maxConnections 8 and 16 clients that connect at once but send their
/// request only later: the first 8 are accepted and turn idle, the 8
/// others are each served in the place of the one idle longest. Every
/// evicted client then writes its request and reads a 503 with code 11;
/// the 8 left open are served. No client sees a reset or a failed write.
/// (As many evicted connections as the cap linger at once; one more is
/// closed at once.)
#[test]
fn evicted_clients_should_read_their_503_not_a_reset() {
    let dir = TestDir::new("answers-evict");
    let port = http::free_port("127.0.0.1");
    let mut d = Daemon::start(
        &dir,
        "d",
        json!({"maxConnections": 8, "readTimeout": "60s", "metricsPort": port}),
    );
    d.ready();
    let (clients, cap) = (16usize, 8usize);
    let go = Arc::new(Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (sock, go) = (d.sock.clone(), go.clone());
            let s = UnixStream::connect(&sock).unwrap();
            std::thread::spawn(move || {
                go.wait();
                exchange(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            })
        })
        .collect();
    // Each client waiting in the backlog got a connection evicted for it.
    wait_until(T, "8 connections evicted", || {
        metric_over_tcp(port, "plexus_connections_evicted_total") == Some((clients - cap) as f64)
    });
    go.wait();
    let mut seen: Vec<Seen> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    seen.sort();
    let evicted = seen.iter().filter(|s| **s == Seen::Answer(503, 11)).count();
    let served = seen.iter().filter(|s| **s == Seen::Answer(200, 0)).count();
    assert_eq!(
        (evicted, served),
        (clients - cap, cap),
        "what the clients saw: {seen:?}\n{}",
        d.log_text()
    );
    assert!(d.running());
}

/// A body declared larger than the cap is refused before it is read (413):
/// the client, still writing its 2 MiB, completes its write and reads the
/// 413, where it used to get a broken pipe mid-body.
#[test]
fn a_body_refused_unread_should_be_read_away_so_its_client_reads_the_413() {
    let dir = TestDir::new("answers-413");
    let mut d = Daemon::start(&dir, "d", json!({}));
    d.ready();
    let body = vec![b' '; 2 << 20];
    let mut request = format!(
        "POST /cni HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    for _ in 0..3 {
        let s = UnixStream::connect(&d.sock).unwrap();
        assert_eq!(exchange(s, &request), Seen::Answer(413, 4));
    }
    assert!(d.running());
}

/// Whether the daemon closed its end of `s` (not only shut its write side)
/// within `within`.
fn peer_closed_within(s: &UnixStream, within: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    let ms = within.as_millis() as libc::c_int;
    // SAFETY: one pollfd of a socket this test owns.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLHUP != 0
}

/// A client that sent its request and nothing more has the daemon's end
/// closed as soon as its answer is written, while it keeps its own end
/// open (lingering would keep it 2 s). One that sent more than its request
/// is read from until it closes: its write succeeds and it reads its
/// answer, not a reset.
#[test]
fn served_connections_should_close_at_once_unless_the_client_sent_more() {
    let dir = TestDir::new("answers-close");
    let mut d = Daemon::start(&dir, "d", json!({}));
    d.ready();
    let mut s = UnixStream::connect(&d.sock).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    assert_eq!(http::parse_response(&buf).unwrap().status, 200);
    assert!(
        peer_closed_within(&s, Duration::from_millis(1500)),
        "the daemon kept a served connection open"
    );

    // A body of 10 bytes, then far more than the daemon reads with it.
    let s = UnixStream::connect(&d.sock).unwrap();
    let mut request =
        b"POST /healthz HTTP/1.1\r\nHost: x\r\ncontent-length: 10\r\n\r\n0123456789".to_vec();
    request.extend(std::iter::repeat_n(b'x', 1 << 20));
    assert_eq!(exchange(s, &request), Seen::Answer(200, 0));
}
