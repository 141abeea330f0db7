//! One log line per CNI call, with Debian's plugins: `info` for a call
//! that succeeded (command, container, interface, every network an ADD
//! attached or a DEL removed with its interface and addresses, duration),
//! `warn` with the code and the error for one that failed; in the
//! journal, each a field of its own.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::cni::{bridge, conflist, failed, ok, Call, Engine};
use crate::support::daemon::Daemon;
use crate::support::netns::{Link, Netns, Subnet};

/// Two static networks on bridges of their own: `cluster` (eth0) and the
/// default network `extra` (net1).
struct Node {
    engine: Engine,
    subnets: Vec<Subnet>,
    _links: Vec<Link>,
}

fn node(tag: &str) -> Node {
    let engine = Engine::new(tag);
    let links: Vec<Link> = (0..2).map(|_| Link::planned("b")).collect();
    let subnets: Vec<Subnet> = (0..2).map(|_| Subnet::new()).collect();
    for (i, name) in ["cluster", "extra"].iter().enumerate() {
        let plugin = bridge(&links[i].name, engine.host_local(&subnets[i]));
        engine.write_network(
            &format!("{i}0-{name}.conflist"),
            &conflist(name, "1.0.0", vec![plugin]),
        );
    }
    Node {
        engine,
        subnets,
        _links: links,
    }
}

impl Node {
    fn config(&self) -> serde_json::Value {
        let mut c = self.engine.config("cluster", "20s");
        c["defaultNetworks"] = json!(["extra"]);
        c["logLevel"] = json!("info");
        c
    }
}

/// The namespace's address on each of eth0 and net1.
fn addresses(ns: &Netns) -> BTreeMap<String, String> {
    ns.ifaces()
        .into_iter()
        .filter(|i| i.name != "lo")
        .map(|i| (i.name, i.addrs.first().cloned().unwrap_or_default()))
        .collect()
}

#[test]
fn each_call_should_leave_one_line_with_what_it_did() {
    let n = node("calllog");
    let mut d = Daemon::start(&n.engine.dir, "d", n.config());
    d.ready();
    let ns = Netns::new();
    let id = "calllog1";
    ok(&d, &Call::new("ADD", id, &ns, "eth0").run(&d));
    let addrs = addresses(&ns);
    assert!(n.subnets[0].holds(&addrs["eth0"]), "{addrs:?}");
    assert!(n.subnets[1].holds(&addrs["net1"]), "{addrs:?}");
    ok(&d, &Call::new("DEL", id, &ns, "eth0").run(&d));
    // A call that fails: a network namespace that does not exist.
    let mut gone = Call::new("ADD", "calllog2", &ns, "eth0");
    gone.netns = "/run/netns/no-such-ns-calllog".into();
    let (code, msg, _) = failed(&d, &gone.run(&d));

    let log = d.log_text();
    let lines =
        |needle: &str| -> Vec<&str> { log.lines().filter(|l| l.contains(needle)).collect() };
    let add = lines(&format!("CNI ADD of {id} done"));
    assert_eq!(add.len(), 1, "{log}");
    let add = add[0];
    assert!(add.contains(" INFO "), "{add}");
    for part in [
        "command=ADD".to_string(),
        format!("container_id={id}"),
        "ifname=eth0".to_string(),
        format!("cluster eth0 {}", addrs["eth0"]),
        format!("extra net1 {}", addrs["net1"]),
        "duration_ms=".to_string(),
    ] {
        assert!(add.contains(&part), "{part} missing from {add}");
    }
    let del = lines(&format!("CNI DEL of {id} done"));
    assert_eq!(del.len(), 1, "{log}");
    let del = del[0];
    for part in [
        "command=DEL".to_string(),
        // What it removed, as the ADD's line named it.
        format!("cluster eth0 {}", addrs["eth0"]),
        format!("extra net1 {}", addrs["net1"]),
        "duration_ms=".to_string(),
    ] {
        assert!(del.contains(&part), "{part} missing from {del}");
    }
    let bad = lines("CNI ADD of calllog2 failed");
    assert_eq!(bad.len(), 1, "{log}");
    assert!(bad[0].contains(" WARN "), "{}", bad[0]);
    assert!(bad[0].contains(&format!("code={code}")), "{}", bad[0]);
    assert!(bad[0].contains(&msg), "{} lacks {msg}", bad[0]);
}

/// Makes `/run/systemd/journal` exist for the bind mount (the host has no
/// journal) and removes what it made.
pub(crate) struct JournalMountPoint(Vec<PathBuf>);

impl JournalMountPoint {
    fn new() -> Self {
        let mut made = Vec::new();
        for p in ["/run/systemd", "/run/systemd/journal"] {
            if std::fs::create_dir(p).is_ok() {
                made.push(PathBuf::from(p));
            }
        }
        Self(made)
    }
}

impl Drop for JournalMountPoint {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// The journal's native entries that `socket` received within `timeout`
/// until one has `MESSAGE` starting with `prefix`.
pub(crate) fn journal_entry(
    socket: &UnixDatagram,
    prefix: &str,
    timeout: Duration,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no journal entry {prefix:?}");

        socket.set_read_timeout(Some(left)).unwrap();
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        let entry = parse_native(&buf[..n]);
        if entry.get("MESSAGE").is_some_and(|m| m.starts_with(prefix)) {
            return entry;
        }
    }
}

/// journald's native protocol: `KEY=value\n`, or `KEY\n`, the value's
/// length as 64-bit little endian, the value and `\n`. A key given twice
/// (a span's field and the event's) keeps the event's, the later.
pub(crate) fn parse_native(mut data: &[u8]) -> BTreeMap<String, String> {
    let mut entry = BTreeMap::new();
    while let Some(nl) = data.iter().position(|b| *b == b'\n') {
        let line = &data[..nl];
        if let Some(eq) = line.iter().position(|b| *b == b'=') {
            let key = String::from_utf8_lossy(&line[..eq]).into_owned();
            entry.insert(key, String::from_utf8_lossy(&line[eq + 1..]).into_owned());
            data = &data[nl + 1..];
            continue;
        }
        let key = String::from_utf8_lossy(line).into_owned();
        let rest = &data[nl + 1..];
        let Some(len) = rest.get(..8) else { break };
        let len = u64::from_le_bytes(len.try_into().unwrap()) as usize;
        let Some(value) = rest.get(8..8 + len) else {
            break;
        };
        entry.insert(key, String::from_utf8_lossy(value).into_owned());
        data = rest.get(8 + len + 1..).unwrap_or_default();
    }
    entry
}

/// plexusd started on `config` with its stderr taken for the journal
/// (`JOURNAL_STREAM`), in a mount namespace of its own where `<dir>/journal`
/// is mounted at /run/systemd/journal: what it logs arrives on the socket
/// returned, in journald's native protocol. Keep the mount point while
/// the daemon runs.
pub(crate) fn start_with_journal(
    dir: &crate::support::daemon::TestDir,
    config: serde_json::Value,
) -> (Daemon, UnixDatagram, JournalMountPoint) {
    // journald's socket, as plexusd finds it in a mount namespace of its
    // own where the test's directory is mounted at /run/systemd/journal.
    let journal = dir.join("journal");
    std::fs::create_dir(&journal).unwrap();
    let socket = UnixDatagram::bind(journal.join("socket")).unwrap();
    let mount_point = JournalMountPoint::new();
    // stderr is "the journal": JOURNAL_STREAM names its device and inode.
    let log = dir.join("d.log");
    std::fs::write(&log, "").unwrap();
    let meta = std::fs::metadata(&log).unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let journal_arg = journal.display().to_string();
    let mut d = Daemon::start_wrapped(
        dir,
        "d",
        config,
        &[("JOURNAL_STREAM", &stream)],
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            r#"mount --bind "$0" /run/systemd/journal && exec "$@""#,
            &journal_arg,
        ],
    );
    d.ready();
    (d, socket, mount_point)
}

#[test]
fn in_the_journal_the_lines_fields_should_be_fields() {
    let n = node("calllogj");
    let dir = &n.engine.dir;
    let log = dir.join("d.log");
    // Before plexusd's mount namespace is made: it sees the mounts of
    // that moment (network namespaces are mounts under /run/netns).
    let ns = Netns::new();
    let (d, socket, _mount_point) = start_with_journal(dir, n.config());
    let id = "calllogj1";
    ok(&d, &Call::new("ADD", id, &ns, "eth0").run(&d));
    let addrs = addresses(&ns);
    let add = journal_entry(
        &socket,
        &format!("CNI ADD of {id} done"),
        Duration::from_secs(10),
    );
    assert_eq!(
        add.get("F_COMMAND").map(String::as_str),
        Some("ADD"),
        "{add:?}"
    );
    assert_eq!(
        add.get("F_CONTAINER_ID").map(String::as_str),
        Some(id),
        "{add:?}"
    );
    assert_eq!(
        add.get("F_IFNAME").map(String::as_str),
        Some("eth0"),
        "{add:?}"
    );
    assert_eq!(
        add.get("F_NETWORKS").cloned().unwrap_or_default(),
        format!(
            "cluster eth0 {}, extra net1 {}",
            addrs["eth0"], addrs["net1"]
        ),
        "{add:?}"
    );
    assert!(add.contains_key("F_DURATION_MS"), "{add:?}");
    assert_eq!(
        add.get("SYSLOG_IDENTIFIER").map(String::as_str),
        Some("plexusd")
    );
    ok(&d, &Call::new("DEL", id, &ns, "eth0").run(&d));
    let mut gone = Call::new("ADD", "calllogj2", &ns, "eth0");
    gone.netns = "/run/netns/no-such-ns-calllogj".into();
    let (code, _, _) = failed(&d, &gone.run(&d));
    let bad = journal_entry(
        &socket,
        "CNI ADD of calllogj2 failed",
        Duration::from_secs(10),
    );
    assert_eq!(
        bad.get("F_CODE").cloned(),
        Some(code.to_string()),
        "{bad:?}"
    );
    assert!(bad.contains_key("F_ERROR"), "{bad:?}");
    // warn is journald's priority 4.
    assert_eq!(
        bad.get("PRIORITY").map(String::as_str),
        Some("4"),
        "{bad:?}"
    );
    // Nothing went to stderr: the journal took it.
    assert!(
        !Path::new(&log).exists() || d.log_text().is_empty(),
        "{}",
        d.log_text()
    );
}
