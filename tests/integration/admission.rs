//! Admission control on a real unix socket, with a plugin-free handler whose
//! speed the test controls.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plexus::api;
use plexus::server::{Failure, Handler, Reply};
use tokio::sync::Semaphore;

use crate::support::daemon::{wait_until, Daemon, TestDir};
use crate::support::http;
use crate::support::inproc::InProcess;

const T: Duration = Duration::from_secs(20);

/// Counts concurrent calls; each call holds until the gate gives it a
/// permit (or sleeps `work` when there is no gate).
#[derive(Default)]
struct Probe {
    now: AtomicUsize,
    max: AtomicUsize,
    calls: AtomicUsize,
}

struct SlowHandler {
    probe: Arc<Probe>,
    gate: Option<Arc<Semaphore>>,
    work: Duration,
}

impl Handler for SlowHandler {
    async fn cni(&self, _request: api::Request) -> Result<Reply, Failure> {
        let now = self.probe.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.probe.max.fetch_max(now, Ordering::SeqCst);
        self.probe.calls.fetch_add(1, Ordering::SeqCst);
        match &self.gate {
            Some(g) => {
                let _ = g.acquire().await.map(|p| p.forget());
            }
            None => tokio::time::sleep(self.work).await,
        }
        self.probe.now.fetch_sub(1, Ordering::SeqCst);
        Ok(Reply::Result(serde_json::json!({"cniVersion": "1.1.0"})))
    }

    async fn delegate(&self, request: api::Request) -> Result<Reply, Failure> {
        self.cni(request).await
    }
}

/// The in-process server with a [`SlowHandler`].
struct Server(InProcess);

impl std::ops::Deref for Server {
    type Target = InProcess;
    fn deref(&self) -> &InProcess {
        &self.0
    }
}

impl Server {
    fn start(name: &str, limit: Option<usize>, queue: Duration, handler: SlowHandler) -> Self {
        Server(InProcess::start(name, handler, limit, queue))
    }
}

/// An ADD for a container of its own (a container's calls run one at a
/// time).
fn add(sock: &Path) -> http::Response {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let id = NEXT.fetch_add(1, Ordering::SeqCst);
    let body = format!(r#"{{"env":{{"CNI_COMMAND":"ADD","CNI_CONTAINERID":"c{id}"}}}}"#);
    http::request(sock, "POST", "/cni", body.as_bytes()).unwrap()
}

#[test]
fn limit_of_two_should_never_run_more_than_two_and_serve_all() {
    let probe = Arc::new(Probe::default());
    let s = Server::start(
        "limit2",
        Some(2),
        Duration::from_secs(30),
        SlowHandler {
            probe: probe.clone(),
            gate: None,
            work: Duration::from_millis(50),
        },
    );
    let clients: Vec<_> = (0..10)
        .map(|_| {
            let sock = s.sock.clone();
            std::thread::spawn(move || add(&sock))
        })
        .collect();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body_str());
        assert_eq!(r.json()["Result"]["cniVersion"], "1.1.0");
    }
    assert_eq!(probe.calls.load(Ordering::SeqCst), 10);
    let max = probe.max.load(Ordering::SeqCst);
    assert!(max <= 2, "{max} ran at once");
    assert_eq!(max, 2, "the limit should still allow two at once");
}

#[test]
fn queue_timeout_should_answer_503_code_11() {
    let probe = Arc::new(Probe::default());
    let gate = Arc::new(Semaphore::new(0));
    let s = Server::start(
        "queue",
        Some(1),
        Duration::from_millis(100),
        SlowHandler {
            probe: probe.clone(),
            gate: Some(gate.clone()),
            work: Duration::ZERO,
        },
    );
    let first = {
        let sock = s.sock.clone();
        std::thread::spawn(move || add(&sock))
    };
    wait_until(T, "the first request to hold the slot", || {
        probe.now.load(Ordering::SeqCst) == 1
    });
    let excess: Vec<_> = (0..4)
        .map(|_| {
            let sock = s.sock.clone();
            std::thread::spawn(move || add(&sock))
        })
        .collect();
    for c in excess {
        let r = c.join().unwrap();
        assert_eq!(r.status, 503, "{}", r.body_str());
        let body = r.json();
        assert_eq!(body["code"], 11);
        assert!(body["msg"].as_str().unwrap().contains("try again later"));
    }
    gate.add_permits(1);
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(probe.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn health_should_not_wait_behind_cni_work() {
    let probe = Arc::new(Probe::default());
    let gate = Arc::new(Semaphore::new(0));
    let s = Server::start(
        "healthfirst",
        Some(1),
        Duration::from_secs(30),
        SlowHandler {
            probe: probe.clone(),
            gate: Some(gate.clone()),
            work: Duration::ZERO,
        },
    );
    let busy: Vec<_> = (0..3)
        .map(|_| {
            let sock = s.sock.clone();
            std::thread::spawn(move || add(&sock))
        })
        .collect();
    wait_until(T, "slot taken", || probe.now.load(Ordering::SeqCst) == 1);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let r = http::request(&s.sock, "GET", path, b"").unwrap();
        assert_eq!(r.status, 200, "{path}");
    }
    let metrics = http::request(&s.sock, "GET", "/metrics", b"").unwrap();
    assert!(
        metrics.body_str().contains("plexus_requests_in_flight 1"),
        "{}",
        metrics.body_str()
    );
    gate.add_permits(3);
    for b in busy {
        assert_eq!(b.join().unwrap().status, 200);
    }
}

/// 200 clients that connect and say nothing hold no processing slot and
/// are dropped after readTimeout.
#[test]
fn idle_connections_should_not_delay_requests_and_should_be_closed() {
    let dir = TestDir::new("idleconns");
    let mut d = Daemon::start(
        &dir,
        "d",
        serde_json::json!({"readTimeout": "4s", "connectionLimit": 1}),
    );
    d.ready();
    let idle: Vec<UnixStream> = (0..200)
        .map(|_| UnixStream::connect(&d.sock).unwrap())
        .collect();
    // Connections open as the daemon counts them (including the metrics
    // request itself, and possibly one just answered but not yet closed).
    let open = |sock: &Path| -> u64 {
        http::request(sock, "GET", "/metrics", b"")
            .ok()
            .and_then(|r| {
                r.body_str()
                    .lines()
                    .find_map(|l| l.strip_prefix("plexus_connections_open "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    };
    wait_until(T, "all idle connections accepted", || open(&d.sock) >= 201);
    let t0 = Instant::now();
    let r = http::request(&d.sock, "POST", "/cni", br#"{"env":{"CNI_COMMAND":"ADD"}}"#).unwrap();
    let took = t0.elapsed();
    assert!(
        open(&d.sock) >= 201,
        "the idle connections were closed before the answer"
    );
    // The CNI answer (the request lacks CNI_CONTAINERID) came back while
    // all 200 were open.
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["code"], 4);
    assert_eq!(http::healthz(&d.sock), 200);
    println!("request with 200 idle connections open took {took:?}");
    for mut c in idle {
        c.set_read_timeout(Some(T)).unwrap();
        let mut buf = Vec::new();
        // The daemon closes them: EOF (possibly after a 408), never a hang.
        match std::io::Read::read_to_end(&mut c, &mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("idle connection not closed by the daemon: {e}"),
        }
    }
    wait_until(T, "every idle connection closed", || open(&d.sock) == 1);
}

#[test]
fn trickling_body_should_be_cut_off_at_read_timeout() {
    let dir = TestDir::new("trickle");
    let mut d = Daemon::start(&dir, "d", serde_json::json!({"readTimeout": "300ms"}));
    d.ready();
    let mut s = UnixStream::connect(&d.sock).unwrap();
    s.write_all(b"POST /cni HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"env\":")
        .unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let r = http::read_response(&mut s).unwrap();
    assert_eq!(r.status, 408);
    assert_eq!(r.json()["code"], 5);
    assert!(d.running());
}

/// Past maxConnections, with every connection busy with a request, the
/// daemon stops accepting; the kernel backlog holds the next client until
/// a slot frees. (Idle connections would make room instead: see
/// resource_bounds.rs.)
#[test]
fn max_connections_should_hold_excess_clients_in_the_backlog() {
    let dir = TestDir::new("maxconn");
    let port = http::free_port("127.0.0.1");
    let mut d = Daemon::start(
        &dir,
        "d",
        serde_json::json!({"maxConnections": 2, "readTimeout": "30s", "metricsPort": port}),
    );
    d.ready();
    let metrics = || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut s, &mut buf).unwrap();
        http::parse_response(&buf).unwrap().body_str().to_string()
    };
    // Busy: a request head has arrived, its body is still to come.
    let busy = || {
        let mut s = UnixStream::connect(&d.sock).unwrap();
        s.write_all(b"POST /cni HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            .unwrap();
        s
    };
    let busy1 = busy();
    let busy2 = busy();
    wait_until(T, "two connections accepted", || {
        metrics().contains("plexus_connections_open 2\n")
    });
    // The third client's connect() succeeds into the kernel backlog...
    let mut third = UnixStream::connect(&d.sock).unwrap();
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let backlog = || listen_queue(&d.sock);
    wait_until(T, "the third client in the backlog", || {
        backlog() == Some(1)
    });
    // ...and stays there while two connections are open.
    assert!(metrics().contains("plexus_connections_open 2\n"));
    assert_eq!(backlog(), Some(1), "accepted past maxConnections");
    third.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(std::io::Read::read(&mut third, &mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "answered past maxConnections"
    );
    third.set_nonblocking(false).unwrap();
    drop(busy1);
    third.set_read_timeout(Some(T)).unwrap();
    let r = http::read_response(&mut third).unwrap();
    assert_eq!(r.status, 200);
    drop(busy2);
}

/// Connections waiting in the listen backlog of the unix socket at `path`
/// (the Recv-Q that `ss` reports for a listening socket). The kernel keeps
/// the name the socket was bound to, the temporary name in the same
/// directory that was then renamed to `path`.
pub(crate) fn listen_queue(path: &Path) -> Option<u64> {
    let out = std::process::Command::new("ss")
        .args(["-xlnH"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let dir = path.parent()?.to_str()?;
    text.lines()
        .find(|l| {
            l.split_whitespace()
                .any(|f| f.starts_with(dir) && f.contains("plexus.sock"))
        })
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|q| q.parse().ok())
}
