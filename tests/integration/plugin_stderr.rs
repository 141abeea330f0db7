//! A plugin's stderr reaches the operator: each line a log line of its
//! own in the journal, with the plugin, the network, the container and the
//! command as fields, bounded per call; the runtime still gets the
//! plugin's CNI error as its answer.

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::call_log::{parse_native, start_with_journal};
use crate::support::cni::{conflist, failed, Call, Engine};
use crate::support::netns::Netns;

/// Every journal entry `socket` receives until one whose `MESSAGE` starts
/// with `last` (included).
fn entries_until(socket: &UnixDatagram, last: &str) -> Vec<BTreeMap<String, String>> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no journal entry {last:?} after {out:?}");
        socket.set_read_timeout(Some(left)).unwrap();
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        let entry = parse_native(&buf[..n]);
        let done = entry.get("MESSAGE").is_some_and(|m| m.starts_with(last));
        out.push(entry);
        if done {
            return out;
        }
    }
}

#[test]
fn a_plugins_stderr_should_reach_the_journal_line_by_line_and_bounded() {
    let e = Engine::new("stderr-j");
    // Calico-like: a few lines of its own log on stderr, then a flood,
    // then its CNI error on stdout.
    e.fake(
        "noisy",
        "echo 'first: reading the config' >&2\n\
         printf 'second: caf\\xc3\\xa9 \\xff done\\n' >&2\n\
         for i in $(seq 1 200); do echo \"spam $i\" >&2; done\n\
         echo '{\"cniVersion\":\"1.0.0\",\"code\":7,\"msg\":\"noisy says no\",\"details\":\"the datastore is away\"}'\n\
         exit 1",
    );
    e.write_network(
        "10-net.conflist",
        &conflist("noisy-net", "1.0.0", vec![json!({"type": "noisy"})]),
    );
    let ns = Netns::new();
    let mut config = e.config("noisy-net", "10s");
    config["logLevel"] = json!("info");
    let (d, socket, _mount_point) = start_with_journal(&e.dir, config);
    let id = "stderr-j1";
    // Read while plexusd logs: the host's datagram queue is short (a real
    // journald reads at once).
    let last = format!("CNI ADD of {id} failed");
    let reader = std::thread::spawn(move || entries_until(&socket, &last));
    let (code, msg, details) = failed(&d, &Call::new("ADD", id, &ns, "eth0").run(&d));
    // The runtime's answer is the plugin's own error.
    assert_eq!(code, 7);
    assert!(
        msg.ends_with("plugin \"noisy\" failed: noisy says no"),
        "{msg}"
    );
    assert!(details.contains("the datastore is away"), "{details}");

    let entries = reader.join().unwrap();
    let from_plugin: Vec<&BTreeMap<String, String>> = entries
        .iter()
        .filter(|e| e.get("F_PLUGIN").map(String::as_str) == Some("noisy"))
        .collect();
    // The ADD's 64 lines, then one that counts the rest (202 lines in
    // all); the same for the DEL of the rollback.
    let (add, del): (Vec<_>, Vec<_>) = from_plugin
        .into_iter()
        .partition(|e| e.get("F_COMMAND").map(String::as_str) == Some("ADD"));
    let messages = |v: &[&BTreeMap<String, String>]| -> Vec<String> {
        v.iter().map(|e| e["MESSAGE"].clone()).collect()
    };
    assert_eq!(add.len(), 65, "{:?}", messages(&add));
    assert_eq!(del.len(), 65, "{:?}", messages(&del));
    let from_plugin = add;
    let first = from_plugin[0];
    assert_eq!(first["MESSAGE"], "noisy: first: reading the config");
    assert_eq!(first["F_NETWORK"], "noisy-net");
    assert_eq!(first["F_CONTAINER_ID"], id);
    assert_eq!(first["F_COMMAND"], "ADD");
    assert_eq!(first["F_IFNAME"], "eth0");
    assert_eq!(
        from_plugin[1]["MESSAGE"],
        "noisy: second: café \u{fffd} done"
    );
    assert_eq!(from_plugin[63]["MESSAGE"], "noisy: spam 62");
    assert_eq!(
        from_plugin[64]["MESSAGE"],
        "noisy: 138 more lines of stderr (1205 bytes) not logged"
    );
}
