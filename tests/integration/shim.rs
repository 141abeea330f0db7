//! The built `plexus-shim` against a daemon over a real unix socket: the
//! library server with a recording handler for the success paths, the real
//! `plexusd` (unconfigured, and with Debian's bridge + host-local), and no
//! daemon at all.

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use plexus::api::{self, CniError};
use plexus::server::{Failure, FailureKind, Handler, Reply};
use serde_json::{json, Value};

use crate::support::cni::{address, assert_sandbox_iface, bridge, conflist, ok, Call, Engine};
use crate::support::daemon::{Daemon, TestDir};
use crate::support::inproc::InProcess;
use crate::support::netns::{Link, Netns, Subnet};
use crate::support::shim::{finish, Run};
use crate::support::systemd::poll_until;

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

// ---------------------------------------------------------------------------
// Running the shim

fn shim(env: &[(&str, &str)], stdin: &[u8]) -> Run {
    crate::support::shim::run(env.iter().copied(), stdin)
}

fn spawn(env: &[(&str, &str)], stdin: &[u8]) -> Child {
    crate::support::shim::spawn(env.iter().copied(), stdin)
}

/// The runtime's environment for `command`, plus variables that must not
/// reach the daemon.
fn env(command: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "3f8a1c2e9b7d"),
        ("CNI_NETNS", "/run/netns/shim-test"),
        ("CNI_IFNAME", "eth0"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod",
        ),
        ("CNI_PATH", "/usr/lib/cni"),
        ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        ("SECRET_TOKEN", "must-not-leak"),
    ]
}

/// A network config for the shim: `cniVersion`, the socket, and `extra`.
fn conf(version: &str, sock: &Path, extra: Value) -> Vec<u8> {
    let mut v = json!({
        "cniVersion": version,
        "name": "plexus-net",
        "type": "plexus-shim",
        "socketPath": sock,
        "runtimeConfig": {"portMappings": []},
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::to_vec(&v).unwrap()
}

// ---------------------------------------------------------------------------
// An in-process daemon: the library server with a recording handler

type Respond = dyn Fn(&api::Request) -> Result<Reply, Failure> + Send + Sync;

struct Recorder {
    seen: Arc<Mutex<Vec<api::Request>>>,
    respond: Arc<Respond>,
}

impl Handler for Recorder {
    async fn cni(&self, request: api::Request) -> Result<Reply, Failure> {
        self.seen.lock().unwrap().push(request.clone());
        (self.respond)(&request)
    }

    async fn delegate(&self, request: api::Request) -> Result<Reply, Failure> {
        self.cni(request).await
    }
}

struct Server {
    inner: InProcess,
    sock: PathBuf,
    seen: Arc<Mutex<Vec<api::Request>>>,
}

impl Server {
    /// Serves `<dir>/plexus.sock`, answering with `respond`.
    fn start(
        name: &str,
        respond: impl Fn(&api::Request) -> Result<Reply, Failure> + Send + Sync + 'static,
    ) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler = Recorder {
            seen: seen.clone(),
            respond: Arc::new(respond),
        };
        let inner = InProcess::start(name, handler, None, Duration::from_secs(10));
        Server {
            sock: inner.sock.clone(),
            inner,
            seen,
        }
    }

    fn requests(&self) -> Vec<api::Request> {
        self.seen.lock().unwrap().clone()
    }
}

/// Asserts a failed call with CNI error `code` whose msg contains `needle`.
fn assert_error_contains(run: &Run, code: u32, needle: &str) {
    let err = run.error(code);
    assert!(err["msg"].as_str().unwrap().contains(needle), "{run:?}");
}

/// The fixed 1.1.0 result the fake daemon answers every ADD with.
fn result_1_1() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "cni0", "mac": "a2:6b:1c:3d:4e:5f"},
            {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "mtu": 1400,
             "sandbox": "/run/netns/shim-test", "pciID": "0000:04:00.5"}
        ],
        "ips": [
            {"interface": 1, "address": "10.244.1.5/24", "gateway": "10.244.1.1"},
            {"interface": 1, "address": "fd00:10:244:1::5/64"}
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
    })
}

/// ADD answers [`result_1_1`]; every other command an empty 200.
fn answer_success(request: &api::Request) -> Result<Reply, Failure> {
    match request.env_var("CNI_COMMAND") {
        Some("ADD") => Ok(Reply::Result(result_1_1())),
        _ => Ok(Reply::Done),
    }
}

/// Asserts the daemon got only CNI variables, with the runtime's values,
/// and the shim's stdin byte for byte.
fn assert_forwarded(request: &api::Request, command: &str, stdin: &[u8]) {
    let expected: Vec<(String, String)> = env(match command {
        "ADD" => "ADD",
        "DEL" => "DEL",
        "CHECK" => "CHECK",
        "GC" => "GC",
        _ => "STATUS",
    })
    .into_iter()
    .filter(|(k, _)| k.starts_with("CNI_"))
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let got: Vec<(String, String)> = request.env.clone().into_iter().collect();
    let mut expected_sorted = expected;
    expected_sorted.sort();
    assert_eq!(got, expected_sorted, "env forwarded for {command}");
    assert_eq!(request.config, stdin, "config forwarded for {command}");
    assert!(request.interface_attributes.is_none());
}

// ---------------------------------------------------------------------------
// Success paths

#[test]
fn add_should_print_the_result_converted_to_each_cni_version() {
    let s = Server::start("shim-add", answer_success);
    for (i, version) in VERSIONS.iter().enumerate() {
        let stdin = conf(version, &s.sock, json!({}));
        let run = shim(&env("ADD"), &stdin);
        let out = run.success();
        assert!(!out.ends_with('\n'), "no trailing newline, as Go plugins");
        assert!(out.starts_with("{\n    \"cniVersion\": "), "{out}");
        let v = run.json();
        assert_eq!(v["cniVersion"], *version);
        let pre_1_0 = version.starts_with("0.");
        for (ip, family) in v["ips"].as_array().unwrap().iter().zip(["4", "6"]) {
            if pre_1_0 {
                assert_eq!(ip["version"], family, "{version}: {out}");
            } else {
                assert!(ip.get("version").is_none(), "{version}: {out}");
            }
            assert_eq!(ip["interface"], 1);
        }
        assert_eq!(v["interfaces"][1].get("mtu").is_some(), !pre_1_0, "{out}");
        assert_eq!(v["interfaces"][1].get("pciID").is_some(), !pre_1_0, "{out}");
        assert_eq!(
            v["routes"],
            json!([{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}])
        );
        assert_eq!(v["dns"], result_1_1()["dns"]);

        let requests = s.requests();
        assert_eq!(requests.len(), i + 1);
        assert_forwarded(&requests[i], "ADD", &stdin);
    }
}

#[test]
fn add_output_should_match_go_formatting_byte_for_byte() {
    let s = Server::start("shim-add-bytes", answer_success);
    let run = shim(&env("ADD"), &conf("0.4.0", &s.sock, json!({})));
    let expected = r#"{
    "cniVersion": "0.4.0",
    "interfaces": [
        {
            "name": "cni0",
            "mac": "a2:6b:1c:3d:4e:5f"
        },
        {
            "name": "eth0",
            "mac": "0a:58:0a:f4:01:05",
            "sandbox": "/run/netns/shim-test"
        }
    ],
    "ips": [
        {
            "version": "4",
            "interface": 1,
            "address": "10.244.1.5/24",
            "gateway": "10.244.1.1"
        },
        {
            "version": "6",
            "interface": 1,
            "address": "fd00:10:244:1::5/64"
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0",
            "gw": "10.244.1.1"
        }
    ],
    "dns": {
        "nameservers": [
            "10.96.0.10"
        ],
        "search": [
            "svc.cluster.local"
        ]
    }
}"#;
    assert_eq!(run.success(), expected);

    // At 1.x libcni prints through a map: keys sorted at every level, and
    // an empty dns would be left out (this one has content).
    let run = shim(&env("ADD"), &conf("1.1.0", &s.sock, json!({})));
    let expected = r#"{
    "cniVersion": "1.1.0",
    "dns": {
        "nameservers": [
            "10.96.0.10"
        ],
        "search": [
            "svc.cluster.local"
        ]
    },
    "interfaces": [
        {
            "mac": "a2:6b:1c:3d:4e:5f",
            "name": "cni0"
        },
        {
            "mac": "0a:58:0a:f4:01:05",
            "mtu": 1400,
            "name": "eth0",
            "pciID": "0000:04:00.5",
            "sandbox": "/run/netns/shim-test"
        }
    ],
    "ips": [
        {
            "address": "10.244.1.5/24",
            "gateway": "10.244.1.1",
            "interface": 1
        },
        {
            "address": "fd00:10:244:1::5/64",
            "interface": 1
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0",
            "gw": "10.244.1.1"
        }
    ]
}"#;
    assert_eq!(run.success(), expected);
}

#[test]
fn del_check_status_gc_should_print_nothing_and_exit_zero() {
    let s = Server::start("shim-others", answer_success);
    // DEL finds the socket through the multus key daemonSocketDir.
    let cases: [(&str, Vec<u8>); 4] = [
        (
            "DEL",
            conf(
                "0.3.1",
                Path::new("/nonexistent/ignored.sock"),
                json!({"socketPath": null, "daemonSocketDir": s.inner.dir.path}),
            ),
        ),
        ("CHECK", conf("0.4.0", &s.sock, json!({}))),
        ("STATUS", conf("1.1.0", &s.sock, json!({}))),
        (
            "GC",
            conf("1.1.0", &s.sock, json!({"cni.dev/valid-attachments": []})),
        ),
    ];
    for (i, (command, stdin)) in cases.iter().enumerate() {
        let run = shim(&env(command), stdin);
        assert_eq!(run.success(), "", "{command}");
        let requests = s.requests();
        assert_eq!(requests.len(), i + 1, "{command}");
        assert_forwarded(&requests[i], command, stdin);
    }
}

#[test]
fn del_with_empty_netns_should_still_reach_the_daemon() {
    let s = Server::start("shim-del-nonetns", answer_success);
    let mut e = env("DEL");
    e.retain(|(k, _)| *k != "CNI_NETNS");
    e.push(("CNI_NETNS", ""));
    let run = shim(&e, &conf("1.0.0", &s.sock, json!({})));
    run.success();
    assert_eq!(s.requests()[0].env_var("CNI_NETNS"), Some(""));
}

#[test]
fn version_should_be_answered_without_a_daemon() {
    let dir = TestDir::new("shim-version");
    let nowhere = dir.join("absent.sock");
    let expected = |v: &str| {
        format!(
            "{{\"cniVersion\":\"{v}\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}}\n"
        )
    };
    for version in VERSIONS {
        let run = shim(
            &[("CNI_COMMAND", "VERSION")],
            &conf(version, &nowhere, json!({})),
        );
        assert_eq!(run.success(), expected(version));
        assert_eq!(run.stderr, "", "VERSION must not try to connect");
    }
    // libcni's probe: dummy env values and a bare cniVersion.
    let run = shim(
        &[
            ("CNI_COMMAND", "VERSION"),
            ("CNI_NETNS", "dummy"),
            ("CNI_IFNAME", "dummy"),
            ("CNI_PATH", "dummy"),
        ],
        br#"{"cniVersion":"1.1.0"}"#,
    );
    assert_eq!(run.success(), expected("1.1.0"));
    let run = shim(&[("CNI_COMMAND", "VERSION")], b"");
    assert_eq!(run.success(), expected("1.1.0"));
}

#[test]
fn a_person_at_a_shell_should_get_the_version_and_help() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(crate::support::shim::SHIM);
        c.args(args)
            .env_remove("CNI_COMMAND")
            .envs(env.iter().copied());
        c.output().unwrap()
    };
    let out = run(&["--version"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("plexus-shim {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = run(&["--help"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("plexus-shim(8)"));
    // Under a runtime (CNI_COMMAND set) arguments change nothing: the call
    // is a CNI call, answered as CNI.
    let out = run(&["--version"], &[("CNI_COMMAND", "VERSION")]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("supportedVersions"));
}

// ---------------------------------------------------------------------------
// The real plexusd

#[test]
fn add_against_real_plexusd_should_pass_its_code_7_through() {
    let dir = TestDir::new("shim-real");
    let mut d = Daemon::start(&dir, "d", json!({}));
    d.ready();
    let run = shim(&env("ADD"), &conf("1.0.0", &d.sock, json!({})));
    assert_error_contains(&run, 7, "no networks are configured");
    assert_eq!(run.stderr, "", "the daemon was up: no waiting");
}

/// The shim through the real plexusd and Debian's bridge + host-local
/// (a 0.3.1 network): the result is printed in the shim config's version,
/// laid out as libcni lays out that version.
#[test]
fn add_through_real_plexusd_should_print_each_cni_version() {
    let e = Engine::new("shim-real-versions");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    e.write_network(
        "10-net.conflist",
        &conflist(
            "vers-net",
            "0.3.1",
            vec![bridge(&br.name, e.host_local(&subnet))],
        ),
    );
    let d = e.start("d", "vers-net", "20s");
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let ns = Netns::new();
        let id = format!("vers-{version}");
        let call = Call::new("ADD", &id, &ns, "eth0").version(version);
        let run = call.run(&d);
        let v = ok(&d, &run);
        let out = run.stdout.as_str();
        assert_eq!(v["cniVersion"], version, "{out}");
        let addr = address(&v);
        assert!(subnet.holds(&addr), "{addr} not in {}", subnet.cidr());
        assert!(ns.iface("eth0").unwrap().has_addr(&addr));
        assert_sandbox_iface(&v, "eth0", &ns);
        let pre_1_0 = version.starts_with("0.");
        assert_eq!(v["ips"][0].get("version").is_some(), pre_1_0, "{out}");
        if pre_1_0 {
            assert_eq!(v["ips"][0]["version"], "4", "{out}");
        }
        // 0.x: struct order and an empty dns; 1.x: sorted keys, no dns.
        assert_eq!(out.contains("\"dns\": {}"), pre_1_0, "{out}");
        let (first, second) = if pre_1_0 {
            ("\"name\"", "\"mac\"")
        } else {
            ("\"mac\"", "\"name\"")
        };
        assert!(out.find(first) < out.find(second), "{version}: {out}");
        assert!(!out.ends_with('\n'));
        ok(
            &d,
            &Call::new("DEL", &id, &ns, "eth0").version(version).run(&d),
        );
        assert!(!ns.has_link("eth0"));
    }
    assert_eq!(e.reservations("vers-net"), Vec::<String>::new());
}

#[test]
fn shim_started_before_the_daemon_should_reach_it_once_it_listens() {
    let dir = TestDir::new("shim-late");
    let sock = dir.join("sock").join(api::SOCKET_NAME);
    let mut child = spawn(
        &env("DEL"),
        &conf("1.0.0", &sock, json!({"connectTimeout": "60s"})),
    );
    // Wait for the shim to report that it is waiting, then start plexusd.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(
        line.starts_with("plexus-shim: waiting for the daemon at ") && line.contains("plexus.sock"),
        "{line:?}"
    );
    let mut d = Daemon::start(&dir, "d", json!({}));
    let run = finish(child);
    let err = run.error(7);
    assert!(
        err["msg"]
            .as_str()
            .unwrap()
            .contains("no networks are configured"),
        "the DEL reached plexusd: {run:?}"
    );
    assert!(d.running());
}

// ---------------------------------------------------------------------------
// Daemon errors

#[test]
fn daemon_down_for_the_whole_connect_timeout_should_give_code_11() {
    let dir = TestDir::new("shim-down");
    // Missing socket (ENOENT), and a bound socket nobody listens on
    // (ECONNREFUSED).
    let refusing = dir.join("refusing.sock");
    drop(UnixListener::bind(&refusing).unwrap());
    for sock in [dir.join("absent.sock"), refusing] {
        for command in ["ADD", "DEL", "CHECK", "GC"] {
            let started = Instant::now();
            let run = shim(
                &env(command),
                &conf("1.1.0", &sock, json!({"connectTimeout": "200ms"})),
            );
            let err = run.error(11);
            let msg = err["msg"].as_str().unwrap();
            assert!(msg.contains("try again later"), "{msg}");
            assert!(msg.contains(sock.to_str().unwrap()), "{msg}");
            assert!(
                run.stderr
                    .starts_with("plexus-shim: waiting for the daemon at "),
                "{run:?}"
            );
            assert!(started.elapsed() >= Duration::from_millis(200));
        }
    }
}

#[test]
fn status_without_a_daemon_should_answer_code_50_without_waiting() {
    let dir = TestDir::new("shim-status-down");
    // Missing socket (ENOENT), and a bound socket nobody listens on
    // (ECONNREFUSED).
    let refusing = dir.join("refusing.sock");
    drop(UnixListener::bind(&refusing).unwrap());
    for sock in [dir.join("absent.sock"), refusing] {
        let mut child = spawn(
            &env("STATUS"),
            &conf(
                "1.1.0",
                &sock,
                json!({"connectTimeout": "30s", "timeout": "60s"}),
            ),
        );
        // Far less than connectTimeout: a shim that waits for the daemon
        // is still running when this ends.
        let exited = poll_until(Duration::from_secs(10), || {
            child.try_wait().unwrap().is_some()
        });
        if !exited {
            let _ = child.kill();
        }
        let run = finish(child);
        assert!(exited, "STATUS waited for the daemon at {sock:?}: {run:?}");
        let err = run.error(plexus::api::code::PLUGIN_NOT_AVAILABLE);
        assert_eq!(err["code"], 50);
        let msg = err["msg"].as_str().unwrap();
        assert!(msg.contains("no daemon is listening at"), "{msg}");
        assert!(msg.contains(sock.to_str().unwrap()), "{msg}");
        assert_eq!(run.stderr, "", "no waiting line: {run:?}");
    }
}

#[test]
fn full_backlog_should_not_hold_the_shim_past_connect_timeout() {
    let dir = TestDir::new("shim-backlog");
    let sock = dir.join("full.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    // Backlog 0 holds one pending connection; ours takes it, so every
    // further connect(2) would block until the listener accepts.
    // SAFETY: listen(2) on a socket we own.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let _filler = UnixStream::connect(&sock).unwrap();
    let run = shim(
        &env("ADD"),
        &conf(
            "1.0.0",
            &sock,
            json!({"connectTimeout": "300ms", "timeout": "60s"}),
        ),
    );
    assert_error_contains(&run, 11, "try again later");
    assert!(run.stderr.contains("waiting for the daemon"), "{run:?}");
}

#[test]
fn overall_timeout_should_bound_the_connect_window() {
    let dir = TestDir::new("shim-overall");
    let run = shim(
        &env("DEL"),
        &conf(
            "1.0.0",
            &dir.join("absent.sock"),
            json!({"connectTimeout": "1h", "timeout": "300ms"}),
        ),
    );
    assert_error_contains(&run, 11, "retried for 300ms");
}

#[test]
fn daemon_503_should_pass_code_11_through() {
    let s = Server::start("shim-503", |_| {
        Err(Failure::new(
            FailureKind::Unavailable,
            api::code::TRY_AGAIN_LATER,
            "the CNI request queue is full; try again later",
        ))
    });
    for command in ["ADD", "DEL"] {
        let run = shim(&env(command), &conf("0.3.1", &s.sock, json!({})));
        let err = run.error(11);
        assert_eq!(
            err["msg"], "the CNI request queue is full; try again later",
            "{command}"
        );
    }
}

#[test]
fn daemon_cni_error_should_pass_code_msg_and_details_through() {
    let s = Server::start("shim-400", |r| {
        Err(Failure {
            kind: FailureKind::Failed,
            error: CniError::new(
                3,
                format!(
                    "container {} is unknown",
                    r.env_var("CNI_CONTAINERID").unwrap_or("")
                ),
            )
            .with_details("no attachment record"),
        })
    });
    for command in ["ADD", "DEL", "CHECK"] {
        let run = shim(&env(command), &conf("1.0.0", &s.sock, json!({})));
        let err = run.error(3);
        assert_eq!(
            err,
            json!({"code": 3, "msg": "container 3f8a1c2e9b7d is unknown", "details": "no attachment record"}),
            "{command}"
        );
        assert!(
            run.stdout.starts_with("{\n    \"code\": 3,\n    \"msg\": "),
            "pretty-printed like skel: {run:?}"
        );
    }
}

#[test]
fn add_with_an_unconvertible_result_should_name_both_versions() {
    let s = Server::start("shim-oldresult", |_| {
        Ok(Reply::Result(
            json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}}),
        ))
    });
    let run = shim(&env("ADD"), &conf("1.0.0", &s.sock, json!({})));
    let err = run.error(1);
    let msg = err["msg"].as_str().unwrap();
    assert!(msg.contains("0.2.0") && msg.contains("1.0.0"), "{msg}");
}

#[test]
fn add_with_an_invalid_result_should_give_code_102() {
    let s = Server::start("shim-badresult", |_| {
        Ok(Reply::Result(
            json!({"cniVersion": "1.1.0", "ips": "not a list"}),
        ))
    });
    let run = shim(&env("ADD"), &conf("1.0.0", &s.sock, json!({})));
    assert_error_contains(&run, 102, "invalid answer from the daemon");
}

// ---------------------------------------------------------------------------
// Bad input: refused before contacting anything

#[test]
fn malformed_stdin_or_env_should_give_clear_errors_without_connecting() {
    let dir = TestDir::new("shim-badinput");
    let sock = dir.join("absent.sock");
    let good = conf("1.0.0", &sock, json!({}));
    let no_command: Vec<_> = env("ADD")
        .into_iter()
        .filter(|(k, _)| *k != "CNI_COMMAND")
        .collect();
    let mut no_ids = env("ADD");
    no_ids.retain(|(k, _)| *k != "CNI_CONTAINERID" && *k != "CNI_IFNAME");
    type Env = Vec<(&'static str, &'static str)>;
    let cases: Vec<(Env, Vec<u8>, u32, &str)> = vec![
        (
            env("ADD"),
            b"{not json".to_vec(),
            6,
            "cannot decode the network config",
        ),
        (env("DEL"), Vec::new(), 6, "empty"),
        (env("ADD"), b"[1,2]".to_vec(), 6, "not a JSON object"),
        (
            env("ADD"),
            br#"{"name":"n","type":"plexus-shim"}"#.to_vec(),
            7,
            "no cniVersion",
        ),
        (
            env("ADD"),
            conf("0.2.0", &sock, json!({})),
            1,
            "incompatible CNI versions",
        ),
        (
            env("CHECK"),
            conf("0.3.1", &sock, json!({})),
            1,
            "does not allow CHECK",
        ),
        (
            env("STATUS"),
            conf("1.0.0", &sock, json!({})),
            1,
            "does not allow STATUS",
        ),
        (
            env("ADD"),
            conf("1.0.0", &sock, json!({"socketPath": 7, "timeout": "soon"})),
            7,
            "socketPath",
        ),
        (no_command, good.clone(), 4, "CNI_COMMAND"),
        (env("add"), good.clone(), 4, "unknown CNI_COMMAND: add"),
        (no_ids, good.clone(), 4, "[CNI_CONTAINERID,CNI_IFNAME]"),
    ];
    for (env, stdin, code, needle) in cases {
        let run = shim(&env, &stdin);
        let err = run.error(code);
        assert!(
            err["msg"].as_str().unwrap().contains(needle),
            "{needle:?} not in {run:?}"
        );
        assert_eq!(run.stderr, "", "refused before connecting: {run:?}");
    }
}

#[test]
fn missing_netns_should_be_refused_for_add_and_check_but_not_del() {
    let s = Server::start("shim-netns", answer_success);
    let mut e = env("ADD");
    e.retain(|(k, _)| *k != "CNI_NETNS");
    for command in ["ADD", "CHECK"] {
        e[0] = ("CNI_COMMAND", command);
        let run = shim(&e, &conf("1.0.0", &s.sock, json!({})));
        let err = run.error(4);
        assert_eq!(err["msg"], "required env variables [CNI_NETNS] missing");
    }
    e[0] = ("CNI_COMMAND", "DEL");
    shim(&e, &conf("1.0.0", &s.sock, json!({}))).success();
    assert_eq!(s.requests().len(), 1);
    assert_eq!(s.requests()[0].env_var("CNI_NETNS"), None);
}

#[test]
fn request_body_should_decode_with_the_api_types() {
    // The wire body is exactly what api::Request encodes: env + base64 config.
    let s = Server::start("shim-body", answer_success);
    let stdin = b"{\"cniVersion\":\"1.1.0\",\n \"socketPath\": \"SOCK\"}".to_vec();
    let stdin = String::from_utf8(stdin)
        .unwrap()
        .replace("SOCK", s.sock.to_str().unwrap())
        .into_bytes();
    shim(&env("GC"), &stdin);
    let req = &s.requests()[0];
    let wire = serde_json::to_value(req).unwrap();
    assert_eq!(
        wire["config"],
        base64::engine::general_purpose::STANDARD.encode(&stdin)
    );
    assert_eq!(req.config, stdin, "whitespace and key order kept");
}
