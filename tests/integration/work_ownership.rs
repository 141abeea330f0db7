//! The CNI work owns its admission slot, and the drain and the idle timer
//! wait for the work, not for the connection that asked for it. A client
//! that hangs up after sending a complete `/cni` request leaves its work
//! running; these tests check, against the real plexusd, that such work
//! still counts against `connectionLimit`, finishes before a SIGTERM or an
//! idle exit ends the daemon, and is named in the log when
//! `shutdownTimeout` cuts it off.
//!
//! The plugin is a slow fake that records, under flock, how many copies of
//! it run at once and when each starts and ends.

use std::fs;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use plexus::api;
use serde_json::{json, Value};

use crate::support::cni::{conflist, ok, Call, Engine};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::http;
use crate::support::netns::Netns;

const T: Duration = Duration::from_secs(30);
const NET: &str = "slow-net";

/// Writes the fake `slowplug`, whose ADD takes `work` and records itself
/// in `<dir>/events` ("start <id>", "end <id>") and the highest number of
/// ADDs running at once in `<dir>/conc.max`; DEL does nothing.
fn slow_network(e: &Engine, work: Duration) {
    let body = format!(
        r#"rec() {{
  exec 9>>"$DIR/conc.lock"
  flock 9
  n=$(( $(cat "$DIR/conc.now" 2>/dev/null || echo 0) + $1 ))
  echo "$n" > "$DIR/conc.now"
  m=$(cat "$DIR/conc.max" 2>/dev/null || echo 0)
  if [ "$n" -gt "$m" ]; then echo "$n" > "$DIR/conc.max"; fi
  echo "$2 $CNI_CONTAINERID" >> "$DIR/events"
  exec 9>&-
}}
if [ "$CNI_COMMAND" = ADD ]; then
  rec 1 start
  (exec -a "$BIN/slowplug-sleep" sleep {secs})
  rec -1 end
  echo '{{"cniVersion":"1.0.0"}}'
fi
exit 0"#,
        secs = work.as_secs_f64()
    );
    e.fake("slowplug", &body);
    e.write_network(
        "10-slow.conflist",
        &conflist(NET, "1.0.0", vec![json!({"type": "slowplug"})]),
    );
}

/// Starts plexusd on the engine with `extra` daemon settings.
fn start(e: &Engine, extra: Value) -> Daemon {
    let mut config = e.config(NET, "60s");
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let mut d = Daemon::start(&e.dir, "d", config);
    d.ready();
    d
}

fn events(e: &Engine) -> Vec<String> {
    fs::read_to_string(e.dir.join("events"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn has_event(e: &Engine, event: &str) -> bool {
    events(e).iter().any(|l| l == event)
}

fn max_concurrency(e: &Engine) -> u32 {
    fs::read_to_string(e.dir.join("conc.max"))
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The `state` of every network recorded for `id` (empty: no record).
fn record_states(e: &Engine, id: &str) -> Vec<String> {
    let Ok(text) = fs::read_to_string(e.record(id)) else {
        return Vec::new();
    };
    let v: Value = serde_json::from_str(&text).unwrap();
    v["attachments"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["delegates"].as_array().cloned().unwrap_or_default())
        .map(|d| d["state"].as_str().unwrap_or("").to_string())
        .collect()
}

fn added(e: &Engine, id: &str) -> bool {
    record_states(e, id) == ["added"]
}

/// A client that sends a complete ADD for `id` and hangs up as soon as
/// the plugin has started (so the work is surely under way).
fn abandoned_add(e: &Engine, d: &Daemon, id: &str, ns: &Netns) {
    let call = Call::new("ADD", id, ns, "eth0");
    let request = api::Request {
        env: call.env().into_iter().collect(),
        config: call.stdin(d),
        interface_attributes: None,
    };
    let raw = crate::support::http::cni_request(&request);
    let mut stream = UnixStream::connect(&d.sock).unwrap();
    stream.write_all(&raw).unwrap();
    wait_until(T, &format!("the plugin of {id} to start"), || {
        has_event(e, &format!("start {id}"))
    });
    drop(stream);
}

/// `name value` of one metric line.
fn metric(d: &Daemon, name: &str) -> Option<u64> {
    let r = http::request(&d.sock, "GET", "/metrics", b"").ok()?;
    r.body_str()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits until the daemon has noticed every hang-up: the only connection
/// left open is the metrics request itself.
fn wait_hung_up(d: &Daemon) {
    wait_until(T, "the daemon to notice the hang-up", || {
        metric(d, "plexus_connections_open") == Some(1)
    });
}

#[test]
fn hung_up_work_should_keep_its_slot_under_limit_one() {
    let e = Engine::new("own-limit1");
    slow_network(&e, Duration::from_millis(1500));
    let mut d = start(&e, json!({"connectionLimit": 1, "queueTimeout": "30s"}));
    let (ns_a, ns_b) = (Netns::new(), Netns::new());

    abandoned_add(&e, &d, "own1-a", &ns_a);
    wait_hung_up(&d);
    // The connection is gone, the work is not: it is what the gauge counts.
    if !has_event(&e, "end own1-a") {
        assert_eq!(metric(&d, "plexus_requests_in_flight"), Some(1));
    }
    let b = Call::new("ADD", "own1-b", &ns_b, "eth0").spawn(&d);
    wait_until(T, "B to queue behind A's work", || {
        metric(&d, "plexus_requests_queued") == Some(1) || has_event(&e, "start own1-b")
    });
    // Health and readiness do not wait behind CNI work.
    for path in ["/healthz", "/readyz"] {
        let t0 = Instant::now();
        let r = http::request(&d.sock, "GET", path, b"").unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert!(t0.elapsed() < Duration::from_secs(1), "{path} waited");
    }
    ok(&d, &b.finish());

    assert_eq!(max_concurrency(&e), 1, "events: {:?}", events(&e));
    assert_eq!(
        events(&e),
        ["start own1-a", "end own1-a", "start own1-b", "end own1-b"]
    );
    assert!(added(&e, "own1-a"), "{:?}", record_states(&e, "own1-a"));
    assert!(added(&e, "own1-b"), "{:?}", record_states(&e, "own1-b"));
    assert_eq!(metric(&d, "plexus_requests_in_flight"), Some(0));
    assert!(d.running());
}

#[test]
fn hung_up_work_should_keep_its_slots_under_limit_two() {
    let e = Engine::new("own-limit2");
    slow_network(&e, Duration::from_millis(1500));
    let d = start(&e, json!({"connectionLimit": 2, "queueTimeout": "30s"}));
    let (ns_a, ns_b, ns_c) = (Netns::new(), Netns::new(), Netns::new());

    abandoned_add(&e, &d, "own2-a", &ns_a);
    abandoned_add(&e, &d, "own2-b", &ns_b);
    wait_hung_up(&d);
    ok(&d, &Call::new("ADD", "own2-c", &ns_c, "eth0").run(&d));

    assert_eq!(max_concurrency(&e), 2, "events: {:?}", events(&e));
    let ev = events(&e);
    let at = |x: &str| ev.iter().position(|l| l == x).unwrap();
    assert!(
        at("start own2-c") > at("end own2-a").min(at("end own2-b")),
        "C started before either abandoned ADD ended: {ev:?}"
    );
    for id in ["own2-a", "own2-b", "own2-c"] {
        assert!(added(&e, id), "{id}: {:?}", record_states(&e, id));
    }
}

#[test]
fn sigterm_should_wait_for_work_whose_client_hung_up() {
    let e = Engine::new("own-sigterm");
    let work = Duration::from_millis(1500);
    slow_network(&e, work);
    let mut d = start(&e, json!({"shutdownTimeout": "20s"}));
    let ns = Netns::new();

    abandoned_add(&e, &d, "own-term", &ns);
    wait_hung_up(&d);
    let t0 = Instant::now();
    d.terminate();
    let st = d.wait_exit(T);
    let took = t0.elapsed();
    assert_eq!(st.code(), Some(0), "{}", d.log_text());
    assert!(
        has_event(&e, "end own-term"),
        "the plugin was cut off: {:?}\n{}",
        events(&e),
        d.log_text()
    );
    assert!(added(&e, "own-term"), "{:?}", record_states(&e, "own-term"));
    // Promptly: once the work is done, not at the end of the grace period.
    assert!(took < work + Duration::from_secs(5), "exit took {took:?}");
}

#[test]
fn idle_timeout_should_wait_for_work_whose_client_hung_up() {
    let e = Engine::new("own-idle");
    let idle = Duration::from_secs(1);
    slow_network(&e, Duration::from_millis(2500));
    let mut d = start(&e, json!({"idleTimeout": "1s"}));
    let ns = Netns::new();

    abandoned_add(&e, &d, "own-idle", &ns);
    wait_hung_up(&d);
    wait_until(T, "the work to finish or the daemon to exit", || {
        added(&e, "own-idle") || !d.running()
    });
    let finished = Instant::now();
    assert!(
        d.running(),
        "plexusd went idle during the work: {:?} {:?}\n{}",
        events(&e),
        record_states(&e, "own-idle"),
        d.log_text()
    );
    let st = d.wait_exit(T);
    assert!(st.success(), "{st:?}");
    // The idle period counts from the end of the work.
    let after = finished.elapsed();
    assert!(after >= idle / 2, "exited {after:?} after the work");
    assert!(d.log_text().contains("idle"), "{}", d.log_text());
}

#[test]
fn shutdown_timeout_should_cut_off_work_and_name_it() {
    let e = Engine::new("own-grace");
    let grace = Duration::from_millis(500);
    let work = Duration::from_secs(6);
    slow_network(&e, work);
    let mut d = start(&e, json!({"shutdownTimeout": "500ms"}));
    let ns = Netns::new();

    abandoned_add(&e, &d, "own-grace-ctr", &ns);
    wait_hung_up(&d);
    let t0 = Instant::now();
    d.terminate();
    let st = d.wait_exit(T);
    let took = t0.elapsed();
    assert!(st.success(), "{st:?}");
    assert!(took >= grace, "exited before the grace period: {took:?}");
    assert!(took < work - Duration::from_secs(2), "exit took {took:?}");
    assert!(!has_event(&e, "end own-grace-ctr"));
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("CNI work unfinished"))
        .unwrap_or_else(|| panic!("no line about unfinished work:\n{log}"));
    assert!(
        line.contains("own-grace-ctr") && line.contains("ADD"),
        "{line}"
    );
}
