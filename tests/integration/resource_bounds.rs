//! Every resource a client can make plexusd hold is bounded, checked on
//! the real daemon with a fake plugin in a real network namespace:
//! memory under a burst of large requests (the body budget, and memory
//! given back afterwards), descriptors under a low `RLIMIT_NOFILE` (the
//! connection cap is fitted so plugin runs still get theirs), idle
//! connections at the connection cap (the one idle longest makes room for
//! a real call), and a client that half-closes after its request (it
//! still gets its answer). Needs root and iproute2.

use std::fs;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use plexus::api;
use serde_json::{json, Value};

use crate::support::cni::{conflist, Call, Engine};
use crate::support::daemon::{wait_until, Daemon, TestDir, PLEXUSD};
use crate::support::http;
use crate::support::netns::Netns;
use crate::support::shim::{self, Run};

const T: Duration = Duration::from_secs(30);
const NET: &str = "rb-net";
const MIB: u64 = 1 << 20;

/// The fake `rbplug`: an ADD appends "start <id>" and "add <id>" to
/// `<dir>/calls` around a nap of 1 s for containers named `slow-*`, or,
/// for `hold-*`, a wait until the test opens and closes the FIFO
/// `<dir>/gate` for writing.
fn network(e: &Engine) {
    e.fake(
        "rbplug",
        r#"if [ "$CNI_COMMAND" = ADD ]; then
  echo "start $CNI_CONTAINERID" >> "$DIR/calls"
  case "$CNI_CONTAINERID" in
    slow-*) sleep 1 ;;
    hold-*) cat "$DIR/gate" > /dev/null ;;
  esac
  echo "add $CNI_CONTAINERID" >> "$DIR/calls"
  echo '{"cniVersion":"1.0.0"}'
fi
exit 0"#,
    );
    e.write_network(
        "10-rb.conflist",
        &conflist(NET, "1.0.0", vec![json!({"type": "rbplug"})]),
    );
}

/// The lines of `<dir>/calls`.
fn calls(e: &Engine) -> Vec<String> {
    fs::read_to_string(e.dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The engine's config with `extra` settings.
fn config(e: &Engine, extra: Value) -> Value {
    let mut c = e.config(NET, "60s");
    c["logLevel"] = "info".into();
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn start(e: &Engine, extra: Value) -> Daemon {
    let mut d = Daemon::start(&e.dir, "d", config(e, extra));
    d.ready();
    d
}

/// The raw HTTP request of an ADD of `id` in `ns`, sent to `sock`, whose
/// network config carries `pad` bytes of padding (base64 on the wire).
fn raw_add(sock: &Path, id: &str, ns: &Netns, pad: usize) -> Vec<u8> {
    let call = Call::new("ADD", id, ns, "eth0");
    let mut conf = shim_conf(sock, "30s");
    if pad > 0 {
        conf["padding"] = "x".repeat(pad).into();
    }
    let request = api::Request {
        env: call.env().into_iter().collect(),
        config: serde_json::to_vec(&conf).unwrap(),
        interface_attributes: None,
    };
    http::cni_request(&request)
}

/// The shim's stdin for the daemon at `sock`, with an overall `timeout`.
fn shim_conf(sock: &Path, timeout: &str) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "plexus",
        "type": "plexus-shim",
        "socketPath": sock,
        "timeout": timeout,
    })
}

/// An ADD of `id` in `ns` through the built plexus-shim, bounded by
/// `timeout` (the shim's own deadline).
fn shim_add(sock: &Path, id: &str, ns: &Netns, timeout: &str) -> Run {
    let stdin = serde_json::to_vec(&shim_conf(sock, timeout)).unwrap();
    shim::run(Call::new("ADD", id, ns, "eth0").env(), &stdin)
}

/// An ADD as [`shim_add`] with a 10 s deadline, asserted to succeed (the
/// failure shows `log_text()`, the daemon's log); returns how long it took.
fn timed_add(sock: &Path, id: &str, ns: &Netns, log_text: impl FnOnce() -> String) -> Duration {
    let t0 = Instant::now();
    let run = shim_add(sock, id, ns, "10s");
    let took = t0.elapsed();
    assert_eq!(
        run.code,
        Some(0),
        "ADD failed: {run:?}\n--- plexusd log ---\n{}",
        log_text()
    );
    took
}

/// A metric of the daemon at `sock`, read through the socket.
fn metric(sock: &Path, name: &str) -> Option<u64> {
    let r = http::request(sock, "GET", "/metrics", b"").ok()?;
    r.body_str()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// A field of `/proc/<pid>/status`, in bytes (`VmRSS`, `VmHWM`).
fn vm(pid: i32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        * 1024
}

/// Descriptors open in process `pid`.
fn fds(pid: i32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Up to `n` connections to `sock` opened without waiting: a connect that
/// finds the listen backlog full fails at once (and is not counted).
fn idle_flood(sock: &Path, n: usize) -> Vec<UnixStream> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let fd = unsafe {
            // SAFETY: a plain socket(2); the fd is owned right below.
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        assert!(fd >= 0, "socket: {}", io::Error::last_os_error());
        // SAFETY: fd was just returned by socket(2) and is ours alone.
        let s = unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let addr = sockaddr_un(sock);
        // SAFETY: addr is a valid sockaddr_un for its size.
        let r = unsafe {
            libc::connect(
                fd,
                &addr as *const libc::sockaddr_un as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if r == 0 {
            out.push(s);
        }
    }
    out
}

fn sockaddr_un(path: &Path) -> libc::sockaddr_un {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    addr
}

/// 200 concurrent ADDs of 512 KiB each under connectionLimit 2: without a
/// body budget every body is read and parsed while it waits for a slot
/// (over 200 MiB); with it the daemon holds about the budget (16 MiB) of
/// bodies, and gives the memory back once the burst is over.
/// `PLEXUS_BURST=<clients>:<KiB>` changes the burst (for measurements).
#[test]
fn burst_of_large_requests_should_stay_within_the_body_budget() {
    let (clients, kib) = std::env::var("PLEXUS_BURST")
        .ok()
        .and_then(|v| {
            let (n, k) = v.split_once(':')?;
            Some((n.parse().ok()?, k.parse().ok()?))
        })
        .unwrap_or((200usize, 512usize));
    let body_bytes = kib << 10;
    const BUDGET: u64 = plexus::server::DEFAULT_BODY_BUDGET_BYTES as u64;
    let e = Engine::new("rb-mem");
    network(&e);
    let d = start(
        &e,
        json!({"connectionLimit": 2, "queueTimeout": "120s", "readTimeout": "120s"}),
    );
    let ns = Netns::new();
    // Padding such that the base64 config makes a body of about body_bytes.
    let pad = body_bytes * 3 / 4;
    let warm = http::send_raw(&d.sock, &raw_add(&d.sock, "mem-warm", &ns, pad)).unwrap();
    assert_eq!(warm.status, 200, "{}", warm.body_str());
    let before = vm(d.pid(), "VmRSS");

    // One request serialised, the container id swapped per client.
    let template = raw_add(&d.sock, "mem-0000", &ns, pad);
    let at = template.windows(8).position(|w| w == b"mem-0000").unwrap();
    let barrier = Arc::new(Barrier::new(clients));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let mut raw = template.clone();
            raw[at..at + 8].copy_from_slice(format!("mem-{i:04}").as_bytes());
            let (sock, barrier) = (d.sock.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let mut s = UnixStream::connect(&sock).unwrap();
                s.set_write_timeout(Some(Duration::from_secs(120))).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                s.write_all(&raw).unwrap();
                http::read_response(&mut s).unwrap()
            })
        })
        .collect();
    let t0 = Instant::now();
    let statuses: Vec<u16> = threads
        .into_iter()
        .map(|c| c.join().unwrap().status)
        .collect();
    let took = t0.elapsed();
    let peak = vm(d.pid(), "VmHWM");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "not all answered 200: {statuses:?}\n{}",
        d.log_text()
    );
    let added = calls(&e).iter().filter(|l| l.starts_with("add ")).count();
    assert_eq!(added, clients + 1, "each ADD ran once");
    // The budget of bodies, plus what the work and the buffers hold.
    let bound = before + BUDGET + 60 * MIB;
    println!(
        "{clients} x {} KiB: {took:?}; RSS before {} MiB, peak {} MiB",
        body_bytes >> 10,
        before / MIB,
        peak / MIB
    );
    assert!(
        peak < bound,
        "peak RSS {} MiB over the bound of {} MiB",
        peak / MIB,
        bound / MIB
    );
    // Given back once the burst is over (waited for, bounded). Without
    // the trim glibc keeps about 30 MiB of freed bodies here.
    let settle = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let rss = vm(d.pid(), "VmRSS");
        if rss < before + 12 * MIB || Instant::now() > settle {
            break rss;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    println!("RSS after the burst {} MiB", after / MIB);
    assert!(
        after < before + 12 * MIB,
        "RSS stayed at {} MiB after the burst (start {} MiB)",
        after / MIB,
        before / MIB
    );
    assert_eq!(metric(&d.sock, "plexus_request_body_bytes"), Some(0));
}

/// A body that finds the budget full waits for room only within
/// readTimeout, then is turned away with "try again later" (code 11)
/// rather than read into memory: here 16 bodies of 1000 KiB wait for the
/// five processing slots (held by a plugin the test controls) and hold the
/// 16 MiB budget. (Five slots: with 4 requests per slot waiting, at least
/// 16, plexusd would stop accepting before the budget filled.)
#[test]
fn body_without_room_in_the_budget_should_get_try_again_later() {
    let e = Engine::new("rb-budget");
    network(&e);
    let gate = e.dir.join("gate");
    let c = std::ffi::CString::new(gate.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let d = start(
        &e,
        json!({"connectionLimit": 5, "queueTimeout": "60s", "readTimeout": "3s"}),
    );
    let ns = Netns::new();
    let send = |id: &str, pad: usize| {
        let raw = raw_add(&d.sock, id, &ns, pad);
        let sock = d.sock.clone();
        std::thread::spawn(move || {
            let mut s = UnixStream::connect(&sock).unwrap();
            s.set_read_timeout(Some(T)).unwrap();
            // A body turned away is never read: the write may then fail,
            // the answer is there all the same.
            let _ = s.write_all(&raw);
            http::read_response(&mut s).unwrap()
        })
    };
    let holders: Vec<_> = (0..5).map(|i| send(&format!("hold-{i}"), 0)).collect();
    wait_until(T, "the slots to be taken", || {
        let started = calls(&e);
        (0..5).all(|i| started.contains(&format!("start hold-{i}")))
    });
    let pad = 750 << 10; // a body of about 1000 KiB
    let queued: Vec<_> = (0..16).map(|i| send(&format!("fill-{i}"), pad)).collect();
    wait_until(T, "16 requests queued", || {
        metric(&d.sock, "plexus_requests_queued") == Some(16)
    });
    let held = metric(&d.sock, "plexus_request_body_bytes").unwrap();
    assert!(held > 15 << 20, "the queued bodies hold {held} bytes");

    let r = send("late", pad).join().unwrap();
    assert_eq!(r.status, 503, "{}", r.body_str());
    assert_eq!(r.json()["code"], 11, "{}", r.body_str());
    let text = http::request(&d.sock, "GET", "/metrics", b"").unwrap();
    assert!(
        text.body_str()
            .contains("plexus_requests_rejected_total{reason=\"body_budget\"} 1"),
        "{}",
        text.body_str()
    );

    // Open the gate: the held ADDs and the queued ones finish.
    drop(fs::OpenOptions::new().write(true).open(&gate).unwrap());
    for h in holders {
        assert_eq!(h.join().unwrap().status, 200);
    }
    for q in queued {
        assert_eq!(q.join().unwrap().status, 200);
    }
    assert!(!calls(&e).contains(&"start late".to_string()));
}

/// plexusd as its own process with `RLIMIT_NOFILE` set to `nofile` (soft
/// and hard) before exec; killed on drop.
struct Limited {
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

impl Limited {
    fn start(dir: &TestDir, mut config: Value, nofile: u64) -> Self {
        let sock_dir = dir.join("sock");
        config["socketDir"] = sock_dir.to_string_lossy().into();
        let cfg = dir.join("limited.json");
        fs::write(&cfg, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        let log = dir.join("limited.log");
        let logf = fs::File::create(&log).unwrap();
        let mut cmd = Command::new(PLEXUSD);
        cmd.arg("--config")
            .arg(&cfg)
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf);
        // SAFETY: only setrlimit(2), async-signal-safe, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let l = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn plexusd");
        let d = Limited {
            child,
            sock: sock_dir.join(api::SOCKET_NAME),
            log,
        };
        wait_until(T, "plexusd to serve", || {
            http::request(&d.sock, "GET", "/healthz", b"").is_ok_and(|r| r.status == 200)
        });
        d
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With 128 descriptors and maxConnections 1024, a flood of idle
/// connections used to take every descriptor: accept failed with EMFILE
/// and a real ADD was never served (or its plugin could not start). The
/// cap is now fitted so that the plugin runs' reserve stays free.
#[test]
fn low_nofile_should_keep_descriptors_for_plugin_runs() {
    let e = Engine::new("rb-nofile");
    network(&e);
    let d = Limited::start(
        &e.dir,
        config(
            &e,
            json!({"maxConnections": 1024, "connectionLimit": 2, "deleteLimit": 2,
                   "readTimeout": "30s"}),
        ),
        128,
    );
    // 128 - (64 + (2 + 2) * 8) descriptors (a reserve per slot of both
    // pools) for connections and as many evicted ones lingering before
    // they close.
    assert_eq!(metric(&d.sock, "plexus_connections_limit"), Some(16));
    let ns = Netns::new();
    let idle = idle_flood(&d.sock, 300);
    println!("{} idle connections opened", idle.len());
    let took = timed_add(&d.sock, "fd-add", &ns, || d.log_text());
    println!(
        "ADD with {} idle connections at 128 descriptors took {took:?}; daemon fds {}",
        idle.len(),
        fds(d.pid())
    );
    assert!(calls(&e).contains(&"add fd-add".to_string()));
    assert!(e.record("fd-add").exists(), "no record of the ADD");
    assert!(fds(d.pid()) <= 128);
    drop(idle);
}

/// At maxConnections 32 with 500 idle connections (most in the listen
/// backlog) and a 30 s read timeout, a real ADD used to wait until the
/// idle ones timed out, batch after batch. Now each new client is served
/// in the place of the connection idle longest, while a connection whose
/// request is in progress is never closed.
#[test]
fn idle_connections_at_the_cap_should_make_room_for_a_real_call() {
    let flood: usize = std::env::var("PLEXUS_IDLE_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let e = Engine::new("rb-evict");
    network(&e);
    let d = start(&e, json!({"maxConnections": 32, "readTimeout": "30s"}));
    let (ns_slow, ns) = (Netns::new(), Netns::new());

    // A request in progress during the flood.
    let slow = {
        let stdin = serde_json::to_vec(&shim_conf(&d.sock, "20s")).unwrap();
        shim::spawn(
            Call::new("ADD", "slow-busy", &ns_slow, "eth0").env(),
            &stdin,
        )
    };
    wait_until(T, "the slow ADD to start", || {
        calls(&e).contains(&"start slow-busy".to_string())
    });
    let t_flood = Instant::now();
    let mut idle = idle_flood(&d.sock, flood);
    let opened = t_flood.elapsed();

    let took = timed_add(&d.sock, "fast-add", &ns, || d.log_text());
    println!(
        "{} idle connections opened in {opened:?}; ADD took {took:?}",
        idle.len()
    );
    assert!(took < Duration::from_secs(5), "ADD took {took:?}");
    let slow = shim::finish(slow);
    assert_eq!(
        slow.code,
        Some(0),
        "the busy connection was closed: {slow:?}"
    );

    // The first idle connection was the one idle longest: closed with a
    // try-again-later answer, long before the read timeout.
    let first = &mut idle[0];
    first.set_nonblocking(false).unwrap();
    first.set_read_timeout(Some(T)).unwrap();
    let answer = http::read_response(first).unwrap();
    assert_eq!(answer.status, 503);
    assert_eq!(answer.json()["code"], 11);
    let evicted = metric(&d.sock, "plexus_connections_evicted_total").unwrap_or(0);
    println!("evicted {evicted}");
    assert!(evicted >= 1);
    assert!(metric(&d.sock, "plexus_connections_open").unwrap() <= 32);
}

/// A client that shuts down its write side after the request (as some
/// HTTP clients do) gets the answer; the work runs once.
#[test]
fn half_closed_client_should_get_its_answer() {
    let e = Engine::new("rb-halfclose");
    network(&e);
    let d = start(&e, json!({}));
    let ns = Netns::new();
    let mut s = UnixStream::connect(&d.sock).unwrap();
    s.write_all(&raw_add(&d.sock, "slow-half", &ns, 0)).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let r = http::parse_response(&buf).unwrap_or_else(|e| {
        panic!(
            "no answer to the half-closed client ({e})\n--- plexusd log ---\n{}",
            d.log_text()
        )
    });
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert!(r.json()["Result"].is_object(), "{}", r.body_str());
    let ran: Vec<_> = calls(&e)
        .into_iter()
        .filter(|l| l == "add slow-half")
        .collect();
    assert_eq!(ran.len(), 1);
}

/// The unit's `LimitNOFILE=` covers the shipped configurations' connection
/// cap plus the plugin runs' reserve, so the daemon never has to lower
/// the cap (it had no `LimitNOFILE=`: 1024 descriptors for 1024
/// connections and every plugin run).
#[test]
fn unit_nofile_should_cover_the_shipped_configs() {
    use plexus::limit::{descriptors_needed, fit_to_descriptors};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = fs::read_to_string(root.join("systemd/plexusd.service")).unwrap();
    let soft: usize = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("LimitNOFILE="))
        .expect("plexusd.service sets no LimitNOFILE=")
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("LimitNOFILE= is a number");
    for file in [
        "packaging/debian/daemon-config.json",
        "packaging/rpm/daemon-config.json",
    ] {
        let path = root.join(file);
        let c = plexus::config::Config::from_json(&path, &fs::read(&path).unwrap()).unwrap();
        let max = c.limit.max_connections.get();
        let slots = c.limit.slots();
        let needed = descriptors_needed(max, slots);
        assert!(
            soft >= needed,
            "{file}: LimitNOFILE={soft} < {needed} descriptors needed"
        );
        assert_eq!(fit_to_descriptors(max, slots, soft), max, "{file}");
    }
}
