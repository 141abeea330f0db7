//! Scenario 9: floods. What clients that misbehave in bulk cost a real
//! call and what they make plexusd hold: thousands of idle connections at
//! a small connection cap, a thousand concurrent ~1 MiB requests under a
//! small processing limit, and plugins whose children keep the plugin's
//! pipes open.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::daemon_metrics::{metric, metrics_text};
use crate::flood::{self, fds_without_clients, Fds, Fill, Flood};
use crate::procs::{poll, status_kib};
use crate::report::{met, Section, Table, Target};
use crate::setup::{
    cni_env, shim_call, shim_stdin, start_daemon, tmpfs_dir, write_network, Failures, Network,
    CNI_ARGS, CNI_BIN,
};
use crate::stats::{fmt_kib, fmt_ms, Samples};
use crate::support::cni::Engine;
use crate::support::http;
use crate::support::netns::Netns;
use crate::Counts;

/// The cap of the idle-flood daemon.
const MAX_CONNECTIONS: usize = 64;
/// The processing limit of the large-body daemon.
const CONNECTION_LIMIT: usize = 4;
/// The fake plugin whose child keeps its pipes, and its network.
const SETSID_PLUGIN: &str = "flood-setsid";
const SETSID_NET: &str = "flood-setsid-net";
/// How the fake names its children (`exec -a`), to find and kill them.
const SETSID_CHILD: &str = "flood-setsid-child";
/// How long to wait for plexusd to close its client connections.
const SETTLE: Duration = Duration::from_secs(10);
const MIB: u64 = 1024;

pub fn floods(sec: &mut Section, c: &Counts) {
    sec.para(&format!(
        "What clients that misbehave in bulk cost a real call, and what they make plexusd \
         hold (the bounds of the README's \"Limits\"). (1) Idle connections: plexusd with \
         `maxConnections` {MAX_CONNECTIONS} (readTimeout at its default, 10 s); before each \
         timed ADD, {} connections are opened and left silent (non-blocking connects; one \
         that finds the listen backlog full waits for room while plexusd makes it), then a \
         loopback ADD runs through plexus-shim in a network namespace, behind whatever is \
         still queued. The same ADD without any flood runs in the same round before the \
         flood is (re)opened, once plexusd holds no client connection and none waits in \
         its backlog. (2) Descriptors: the idle-flood daemon's open descriptors before \
         the floods, after them, and after {} ADDs of a plugin whose child (`setsid`) keeps \
         the plugin's stdout and stderr open and outlives it. (3) Large bodies: a fresh \
         plexusd with `connectionLimit` {CONNECTION_LIMIT} gets {} concurrent `POST /cni` \
         ADDs of about 1 MiB each, all released at once; its peak RSS (VmHWM) and its RSS \
         once the burst is over.",
        c.flood_conns, c.setsid_adds, c.big_bodies
    ));
    let engine = Engine::new("bench-flood");
    let net = Network::loopback();
    write_network(&engine, &net);
    idle_and_descriptors(sec, c, &engine, &net);
    large_bodies(sec, c, &engine, &net);
}

/// Samples of one kind of call, and its failures.
#[derive(Default)]
struct Timed {
    samples: Samples,
    fails: Failures,
}

impl Timed {
    fn run(&mut self, what: &str, call: &crate::procs::Call) -> crate::procs::Outcome {
        let o = call.run();
        self.samples.push(o.elapsed);
        self.fails.note(what, &o);
        o
    }
}

fn median(v: &[usize]) -> usize {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

/// Parts (1) and (2): one daemon at `maxConnections` 64.
fn idle_and_descriptors(sec: &mut Section, c: &Counts, engine: &Engine, net: &Network) {
    // The flood's descriptors, the shims' and plexusd's own.
    let want = c.flood_conns as u64 + 1024;
    match flood::raise_nofile(want) {
        Ok(n) if n >= want => {}
        Ok(n) => sec.para(&format!(
            "RLIMIT_NOFILE of the bench is only {n} (wanted {want}): the flood is smaller."
        )),
        Err(e) => sec.para(&format!("Cannot raise RLIMIT_NOFILE of the bench: {e}.")),
    }
    engine.fake(
        SETSID_PLUGIN,
        &format!(
            r#"if [ "$CNI_COMMAND" = ADD ]; then
  ready="$DIR/ready-$CNI_CONTAINERID"
  mkfifo "$ready"
  setsid bash -c 'echo > "$1"; exec -a "$0" sleep 30' "$BIN/{SETSID_CHILD}" "$ready" </dev/null >&1 2>&2 &
  read -r _ < "$ready"
  rm -f "$ready"
  echo '{{"cniVersion":"1.0.0"}}'
fi
exit 0"#
        ),
    );
    engine.write_network(
        "20-flood-setsid.conflist",
        &json!({"cniVersion": "1.0.0", "name": SETSID_NET, "plugins": [{"type": SETSID_PLUGIN}]}),
    );
    let d = start_daemon(
        engine,
        "idle",
        net,
        &engine.state_dir.join("idle"),
        json!({
            "maxConnections": MAX_CONNECTIONS,
            "binDir": format!("{}:{CNI_BIN}", engine.bin_dir.display()),
        }),
    );
    let pid = d.pid();
    let sock_dir = d.sock.parent().unwrap_or(Path::new("/"));
    let netns = Netns::new();
    let lo = |cmd: &str, cid: &str| shim_call(&d.sock, cmd, cid, &netns.path, &net.ifname);
    // The cluster network (loopback, `lo`) plus the fake as `net1`.
    let setsid = |cmd: &str, cid: &str| {
        let mut call = shim_call(&d.sock, cmd, cid, &netns.path, &net.ifname);
        for (k, v) in &mut call.env {
            if k == "CNI_ARGS" {
                *v = format!("{CNI_ARGS};PLEXUS_NETWORKS={SETSID_NET}");
            }
        }
        call
    };

    // Warm-up: the plugins' VERSION queries, whatever is opened once.
    let mut warm = Failures::default();
    for (what, call) in [
        ("warm-up ADD", lo("ADD", "flood-warm")),
        ("warm-up DEL", lo("DEL", "flood-warm")),
        ("warm-up setsid ADD", setsid("ADD", "flood-setsid-warm")),
    ] {
        warm.note(what, &call.run());
    }
    warm.report(sec, "warm-up");
    let before = fds_without_clients(pid, sock_dir, SETTLE);

    // (1) Rounds: the ADD without a flood, then with one.
    let mut base = Timed::default();
    let mut flooded = Timed::default();
    let mut dels = Failures::default();
    let mut fills: Vec<Fill> = Vec::new();
    let mut open_at_add = Vec::new();
    let (mut sockets_at_add, mut fds_at_add) = (Vec::new(), Vec::new());
    let mut flood = Flood::new();
    for r in 0..c.flood_rounds {
        eprintln!(
            "   round {r}: ADD alone, then behind {} idle connections",
            c.flood_conns
        );
        flood.clear();
        // No connection of the last round is left in plexusd or its
        // backlog.
        let _ = fds_without_clients(pid, sock_dir, SETTLE);
        let cid = format!("flood-base-{r}");
        base.run("ADD without flood", &lo("ADD", &cid));
        dels.note("DEL", &lo("DEL", &cid).run());

        let fill = flood.fill(
            &d.sock,
            c.flood_conns,
            Instant::now() + Duration::from_secs(5),
        );
        open_at_add.push(flood.still_open());
        if let Some(f) = flood::fds(pid) {
            sockets_at_add.push(f.sockets);
            fds_at_add.push(f.total);
        }
        let cid = format!("flood-idle-{r}");
        flooded.run("ADD behind the flood", &lo("ADD", &cid));
        dels.note("DEL", &lo("DEL", &cid).run());
        fills.push(fill);
    }
    flood.clear();
    let after_flood = fds_without_clients(pid, sock_dir, SETTLE);
    let text = metrics_text(&d.sock);
    let evicted = metric(&text, "plexus_connections_evicted_total", &[]);
    let cap = metric(&text, "plexus_connections_limit", &[]);

    let opened: Vec<usize> = fills.iter().map(|f| f.opened).collect();
    let waited: Vec<usize> = fills.iter().map(|f| f.waited).collect();
    let fill_ms = fills
        .iter()
        .map(|f| f.took)
        .fold(Samples::new(), |mut s, d| {
            s.push(d);
            s
        });
    let mut t = Table::new(&[
        "ADD (loopback, through plexus-shim)",
        "n",
        "p50",
        "max",
        "failures",
    ]);
    for (what, s) in [
        ("alone".to_string(), &base),
        (
            format!("behind {} idle connections", c.flood_conns),
            &flooded,
        ),
    ] {
        t.row(vec![
            what,
            s.samples.len().to_string(),
            fmt_ms(s.samples.p50()),
            fmt_ms(s.samples.max()),
            s.fails.count.to_string(),
        ]);
    }
    sec.para(&format!(
        "(1) Idle connections at `maxConnections` {MAX_CONNECTIONS} (cap in effect: {}), {} \
         rounds:",
        cap.map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
        c.flood_rounds
    ));
    sec.table(&t);
    let mut t = Table::new(&["the flood, per round (median)", "value"]);
    t.row(vec![
        "connections opened".into(),
        format!(
            "{} (min {}, max {})",
            median(&opened),
            opened.iter().min().unwrap_or(&0),
            opened.iter().max().unwrap_or(&0)
        ),
    ]);
    t.row(vec![
        "of which found the backlog full and waited for room".into(),
        median(&waited).to_string(),
    ]);
    t.row(vec!["time to open them".into(), fmt_ms(fill_ms.p50())]);
    t.row(vec![
        "still open when the ADD started (served idle, or queued in the backlog; the rest \
         were closed by plexusd to make room)"
            .into(),
        median(&open_at_add).to_string(),
    ]);
    let quiet_sockets = before.as_ref().map_or(0, |f| f.sockets);
    t.row(vec![
        "of which plexusd held (accepted, idle) when the ADD started: its sockets beyond \
         those it has with no client"
            .into(),
        median(&sockets_at_add)
            .saturating_sub(quiet_sockets)
            .to_string(),
    ]);
    t.row(vec![
        "plexusd's descriptors when the ADD started (all kinds)".into(),
        median(&fds_at_add).to_string(),
    ]);
    t.row(vec![
        "connections plexusd closed to make room, all rounds (`plexus_connections_evicted_total`)"
            .into(),
        evicted.map_or_else(|| "n/a".into(), |v| format!("{v:.0}")),
    ]);
    sec.table(&t);
    for f in fills.iter().filter_map(|f| f.error.as_ref()).take(1) {
        sec.para(&format!("The flood stopped short of its goal: {f}."));
    }
    base.fails.report(sec, "ADD without flood");
    flooded.fails.report(sec, "ADD behind the flood");
    dels.report(sec, "DEL");
    let added = match (flooded.samples.p50(), base.samples.p50()) {
        (Some(f), Some(b)) => Some(f.saturating_sub(b)),
        _ => None,
    };
    let all_ok = base.fails.count == 0 && flooded.fails.count == 0;
    let ok = added.map(|a| a < Duration::from_secs(1) && all_ok);
    sec.target(Target::new(
        &format!(
            "{} idle connections add < 1 s to an ADD",
            thousands(c.flood_conns)
        ),
        "< 1 s (p50 difference), no failed ADD",
        format!(
            "+{} ({} behind the flood vs {} alone, p50 of {}; max {}), {} failed",
            fmt_ms(added),
            fmt_ms(flooded.samples.p50()),
            fmt_ms(base.samples.p50()),
            flooded.samples.len(),
            fmt_ms(flooded.samples.max()),
            base.fails.count + flooded.fails.count
        ),
        ok,
    ));

    // (2) A plugin whose child keeps its pipes.
    let mut adds = Timed::default();
    for i in 0..c.setsid_adds {
        adds.run("setsid ADD", &setsid("ADD", &format!("flood-setsid-{i}")));
    }
    let after_setsid = fds_without_clients(pid, sock_dir, SETTLE);
    let needle = format!("{}/{SETSID_CHILD}", engine.bin_dir.display());
    let children: Vec<i32> = engine
        .fake_processes()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains(&needle))
        .map(|(pid, _)| pid)
        .collect();
    for p in &children {
        // SAFETY: kill(2) on a process the bench's fake plugin started (its
        // command line names the bench's private directory).
        unsafe {
            libc::kill(*p, libc::SIGKILL);
        }
    }
    let gone = poll(Duration::from_secs(5), Duration::from_millis(5), || {
        !engine
            .fake_processes()
            .iter()
            .any(|(_, cmd)| cmd.contains(&needle))
    });

    let show = |f: &Result<Fds, Option<Fds>>| match f {
        Ok(f) => f.describe(),
        Err(Some(f)) => format!(
            "{}, with client connections still open after {} s",
            f.describe(),
            SETTLE.as_secs()
        ),
        Err(None) => "n/a (plexusd is gone)".into(),
    };
    let total = |f: &Result<Fds, Option<Fds>>| match f {
        Ok(f) | Err(Some(f)) => Some(f.total),
        Err(None) => None,
    };
    let same = |f: &Result<Fds, Option<Fds>>| match (total(&before), total(f)) {
        (Some(b), Some(a)) => Some(a == b),
        _ => None,
    };
    let mut t = Table::new(&[
        "plexusd's descriptors (/proc/<pid>/fd)",
        "count",
        "target",
        "met?",
    ]);
    t.row(vec![
        "before the floods (after warm-up calls, no client connected)".into(),
        show(&before),
        "—".into(),
        "—".into(),
    ]);
    t.row(vec![
        format!("after the {} idle floods, the flood closed", c.flood_rounds),
        show(&after_flood),
        "same as before".into(),
        met(same(&after_flood)),
    ]);
    t.row(vec![
        format!(
            "after {} ADDs whose plugin leaves a `setsid` child holding its stdout/stderr",
            c.setsid_adds
        ),
        show(&after_setsid),
        "same as before".into(),
        met(same(&after_setsid)),
    ]);
    sec.para(&format!(
        "(2) Descriptors of the same daemon, each count taken once plexusd holds no client \
         connection (accepted sockets of its listener, from /proc/net/unix) and none waits \
         in its backlog (`ss`). The fake plugin \
         answers its ADD (attached as `net1` through `PLEXUS_NETWORKS`, after loopback) once \
         its `setsid` child runs, which keeps the plugin's stdout and stderr for 30 s; the \
         {} ADDs took p50 {}, max {}; {} children were found running afterwards and \
         killed{}.",
        c.setsid_adds,
        fmt_ms(adds.samples.p50()),
        fmt_ms(adds.samples.max()),
        children.len(),
        if gone {
            ""
        } else {
            " (some were still there 5 s later)"
        }
    ));
    sec.table(&t);
    adds.fails.report(sec, "setsid ADD");
    let before_n = total(&before).map_or_else(|| "n/a".into(), |n| n.to_string());
    sec.target(Target::new(
        &format!("plexusd descriptors after {} idle floods", c.flood_rounds),
        "same count as before",
        format!(
            "{} before, {} after",
            before_n,
            total(&after_flood).map_or_else(|| "n/a".into(), |n| n.to_string())
        ),
        same(&after_flood),
    ));
    sec.target(Target::new(
        &format!(
            "plexusd descriptors after {} ADDs whose plugin's setsid child holds its pipes",
            c.setsid_adds
        ),
        "same count as before",
        format!(
            "{} before, {} after{}",
            before_n,
            total(&after_setsid).map_or_else(|| "n/a".into(), |n| n.to_string()),
            if adds.fails.count > 0 {
                format!(" ({} ADDs failed)", adds.fails.count)
            } else {
                String::new()
            }
        ),
        same(&after_setsid).map(|s| s && adds.fails.count == 0),
    ));
}

/// `5000` as `5,000`.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// How one large request ended.
enum Answer {
    Ok,
    /// 503 with CNI code 11.
    TryAgain,
    Other(String),
}

/// `POST /cni` of an ADD whose body is `head + env + shared config`, with
/// the large part shared by every client (the bench itself must not need
/// a gigabyte for a thousand of them).
struct BigAdd {
    /// The shim's config with its padding, base64 as on the wire.
    config_b64: Arc<Vec<u8>>,
    netns: String,
}

impl BigAdd {
    /// The request of container `cid`, as three pieces to write.
    fn pieces(&self, cid: &str) -> (Vec<u8>, Arc<Vec<u8>>, &'static [u8]) {
        let env: BTreeMap<String, String> =
            cni_env("ADD", cid, &self.netns, "lo").into_iter().collect();
        let mut start = br#"{"env":"#.to_vec();
        start.extend_from_slice(&serde_json::to_vec(&env).unwrap_or_default());
        start.extend_from_slice(br#","config":""#);
        let end: &'static [u8] = br#""}"#;
        let len = start.len() + self.config_b64.len() + end.len();
        let mut head = format!(
            "POST /cni HTTP/1.1\r\nHost: plexus\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n"
        )
        .into_bytes();
        head.extend_from_slice(&start);
        (head, self.config_b64.clone(), end)
    }

    /// The body length of one request.
    fn body_len(&self) -> usize {
        let (head, mid, end) = self.pieces("big-0000");
        let start = head.len() - head.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) - 4;
        start + mid.len() + end.len()
    }
}

/// Sends the request of `cid` and classifies the answer.
fn send_big(sock: &Path, req: &BigAdd, cid: &str) -> Answer {
    let (head, mid, end) = req.pieces(cid);
    let mut s = match flood::connect(sock, Some(Duration::from_secs(30))) {
        Ok(s) => s,
        Err(e) => return Answer::Other(format!("connect: {e}")),
    };
    let t = Some(Duration::from_secs(60));
    if s.set_write_timeout(t).is_err() || s.set_read_timeout(t).is_err() {
        return Answer::Other("cannot set socket timeouts".into());
    }
    // A body turned away is not read: the write then fails, and the answer
    // is there all the same.
    let _ = s
        .write_all(&head)
        .and_then(|()| s.write_all(&mid))
        .and_then(|()| s.write_all(end));
    match http::read_response(&mut s) {
        Ok(r) if r.status == 200 => Answer::Ok,
        Ok(r)
            if r.status == 503
                && serde_json::from_slice::<Value>(&r.body)
                    .is_ok_and(|v| v["code"] == json!(11)) =>
        {
            Answer::TryAgain
        }
        Ok(r) => Answer::Other(format!(
            "status {}: {}",
            r.status,
            r.body_str().chars().take(160).collect::<String>()
        )),
        Err(e) => Answer::Other(format!("no answer: {e}")),
    }
}

/// Part (3): a fresh daemon (its VmHWM is its own peak) under a burst of
/// large requests.
fn large_bodies(sec: &mut Section, c: &Counts, engine: &Engine, net: &Network) {
    let n = c.big_bodies;
    // Records on tmpfs: this measures memory, not the disk's fsyncs.
    let tmpfs = tmpfs_dir("flood-state");
    let state = tmpfs
        .as_ref()
        .map(|t| t.0.clone())
        .unwrap_or_else(|| engine.state_dir.join("big"));
    let d = start_daemon(
        engine,
        "big",
        net,
        &state,
        json!({"connectionLimit": CONNECTION_LIMIT}),
    );
    let pid = d.pid();
    let netns = Netns::new();
    let warm = shim_call(&d.sock, "ADD", "big-warm", &netns.path, &net.ifname).run();
    let mut fails = Failures::default();
    fails.note("warm-up ADD", &warm);
    let rss_before = status_kib(pid, "VmRSS");

    // The shim's config with an unknown top-level key as padding: plexusd
    // reads and parses it, no plugin sees it, and it is not recorded (a
    // `runtimeConfig` value is kept in the attachment record whole).
    let max = plexus::api::MAX_BODY_BYTES;
    let base: Value = serde_json::from_slice(&shim_stdin(&d.sock)).unwrap_or_default();
    let base_len = serde_json::to_vec(&base).map_or(0, |v| v.len()) + r#","padding":"""#.len();
    // Room for the env and the JSON around the config.
    let b64_room = max - 4096;
    let pad = (b64_room / 4 * 3).saturating_sub(base_len);
    let mut conf = base;
    conf["padding"] = "x".repeat(pad).into();
    let conf = serde_json::to_vec(&conf).unwrap_or_default();
    let req = Arc::new(BigAdd {
        config_b64: Arc::new(
            base64::engine::general_purpose::STANDARD
                .encode(conf)
                .into_bytes(),
        ),
        netns: netns.path.clone(),
    });
    let body = req.body_len();
    let rejected_before = metric(
        &metrics_text(&d.sock),
        "plexus_requests_rejected_total",
        &["reason=\"body_budget\""],
    )
    .unwrap_or(0.0);

    eprintln!("   {n} concurrent ADDs of {body} bytes");
    let barrier = Arc::new(Barrier::new(n + 1));
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let (req, barrier, sock) = (req.clone(), barrier.clone(), d.sock.clone());
        let spawned = thread::Builder::new()
            .name("big-body".into())
            .stack_size(128 << 10)
            .spawn(move || {
                barrier.wait();
                send_big(&sock, &req, &format!("big-{i:04}"))
            });
        match spawned {
            Ok(h) => threads.push(h),
            Err(e) => {
                fails.note_msg(format!("cannot start client thread {i}: {e}"));
                break;
            }
        }
    }
    // Threads that did start wait for the full count: release them with
    // stand-ins for the missing ones.
    let missing = n - threads.len();
    let fill: Vec<_> = (0..missing)
        .map(|_| {
            let b = barrier.clone();
            thread::spawn(move || {
                b.wait();
            })
        })
        .collect();
    let t0 = Instant::now();
    barrier.wait();
    let (mut ok, mut again, mut other) = (0usize, 0usize, Failures::default());
    for h in threads {
        match h.join() {
            Ok(Answer::Ok) => ok += 1,
            Ok(Answer::TryAgain) => again += 1,
            Ok(Answer::Other(m)) => other.note_msg(m),
            Err(_) => other.note_msg("client thread panicked".into()),
        }
    }
    let wall = t0.elapsed();
    for h in fill {
        let _ = h.join();
    }
    let peak = status_kib(pid, "VmHWM");

    // The burst is over once no body is held and no work is queued or
    // running; then the daemon gives memory back (malloc_trim).
    let t_idle = Instant::now();
    let mut text = String::new();
    let idle = poll(SETTLE, Duration::from_millis(5), || {
        text = metrics_text(&d.sock);
        [
            "plexus_request_body_bytes",
            "plexus_requests_in_flight",
            "plexus_requests_queued",
        ]
        .iter()
        .all(|m| metric(&text, m, &[]) == Some(0.0))
    });
    let rss_idle = status_kib(pid, "VmRSS");
    let rejected = metric(
        &text,
        "plexus_requests_rejected_total",
        &["reason=\"body_budget\""],
    )
    .unwrap_or(0.0)
        - rejected_before;
    // The trim runs right after the last body is let go: give it a moment
    // (bounded) to show in VmRSS.
    let goal_after = 16 * MIB;
    let t_trim = Instant::now();
    poll(Duration::from_secs(2), Duration::from_millis(5), || {
        status_kib(pid, "VmRSS").is_some_and(|k| k < goal_after)
    });
    let trim_wait = t_trim.elapsed();
    let idle_after = t_trim.duration_since(t_idle);
    let rss_after = status_kib(pid, "VmRSS");

    // 503 code 11 is "try again later" only when the body budget said so.
    let budget_refusals = (rejected.max(0.0) as usize).min(again);
    for _ in budget_refusals..again {
        other.note_msg("503 code 11 not counted as a body-budget refusal".into());
    }
    let mut t = Table::new(&["measurement", "value"]);
    t.row(vec![
        "requests".into(),
        format!(
            "{n} concurrent ADDs, {body} bytes of body each ({:.2} MiB)",
            body as f64 / (1 << 20) as f64
        ),
    ]);
    t.row(vec![
        "wall time (release to last answer)".into(),
        fmt_ms(Some(wall)),
    ]);
    t.row(vec!["answered 200".into(), ok.to_string()]);
    t.row(vec![
        "answered 503, code 11, refused by the body budget (try again later)".into(),
        format!(
            "{budget_refusals} (`plexus_requests_rejected_total{{reason=\"body_budget\"}}` +{rejected:.0})"
        ),
    ]);
    t.row(vec!["failed otherwise".into(), other.count.to_string()]);
    t.row(vec![
        "VmRSS before (after one ADD)".into(),
        fmt_kib(rss_before),
    ]);
    t.row(vec!["VmHWM (peak) after the burst".into(), fmt_kib(peak)]);
    t.row(vec![
        format!(
            "VmRSS when no body was held and no work left ({})",
            if idle {
                format!("{} after the last answer", fmt_ms(Some(idle_after)))
            } else {
                format!("**not reached within {} s**", SETTLE.as_secs())
            }
        ),
        fmt_kib(rss_idle),
    ]);
    t.row(vec![
        format!("VmRSS after the burst ({} later)", fmt_ms(Some(trim_wait))),
        fmt_kib(rss_after),
    ]);
    sec.para(&format!(
        "(3) Large bodies: {n} clients connect at once and each sends one `POST /cni` ADD \
         (loopback, its own container id, one network namespace) whose config carries an \
         unknown key padded so that the body is just under the 1 MiB cap. plexusd: fresh \
         process, `connectionLimit` {CONNECTION_LIMIT}, readTimeout 10 s (default), body budget \
         {} MiB (default), stateDir on {}.",
        plexus::server::DEFAULT_BODY_BUDGET_BYTES >> 20,
        if tmpfs.is_some() {
            "tmpfs"
        } else {
            "the temp dir"
        }
    ));
    sec.table(&t);
    fails.report(sec, "setup");
    other.report(sec, "large-body ADD");
    let mib = |k: Option<u64>, lim: u64| k.map(|k| k < lim * MIB);
    let rows = if n == 1000 {
        "1,000".to_string()
    } else {
        format!("{n} (not 1,000)")
    };
    sec.target(Target::new(
        &format!("plexusd peak RSS, {rows} concurrent ~1 MiB ADDs, connectionLimit 4"),
        "< 96 MiB (16 MiB body budget + buffers of 1,000 connections), no failure but try again later",
        format!(
            "{}; {ok} answered, {budget_refusals} try again later (body budget), {} failed",
            fmt_kib(peak),
            other.count
        ),
        mib(peak, 96).map(|m| m && other.count == 0),
    ));
    sec.target(Target::new(
        &format!("plexusd RSS after the {rows} ~1 MiB ADDs"),
        "< 24 MiB",
        format!(
            "{} ({} after the burst was over)",
            fmt_kib(rss_after),
            fmt_ms(Some(trim_wait))
        ),
        mib(rss_after, 24),
    ));
    drop(d);
}
