//! `plexus-shim` on the wire: replaying the captured multus-daemon answers
//! (tests/fixtures/multus-wire) and answers no daemon should give, from a
//! tiny in-test unix-socket server that writes raw bytes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::daemon::TestDir;
use crate::support::shim::{Run, T};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multus-wire/");

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}{name}")).unwrap_or_else(|e| panic!("{name}: {e}"))
}

// ---------------------------------------------------------------------------
// Running the shim

fn shim(env: &BTreeMap<String, String>, stdin: &[u8]) -> Run {
    crate::support::shim::run(env, stdin)
}

fn cni_env(command: &str) -> BTreeMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "ctr-wire"),
        ("CNI_NETNS", "/run/netns/wire"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", "IgnoreUnknown=1"),
        ("CNI_PATH", "/usr/lib/cni"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn conf(sock: &Path, extra: Value) -> Vec<u8> {
    let mut v =
        json!({"cniVersion": "1.0.0", "name": "wire", "type": "plexus-shim", "socketPath": sock});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::to_vec(&v).unwrap()
}

// ---------------------------------------------------------------------------
// A raw one-connection server

/// Serves one connection on `<dir>/raw.sock`: reads one request (head plus
/// Content-Length body), then lets `answer` write whatever it likes.
struct Raw {
    sock: PathBuf,
    got: Option<JoinHandle<Vec<u8>>>,
    _dir: TestDir,
}

impl Raw {
    fn start(name: &str, answer: impl FnOnce(&mut UnixStream) + Send + 'static) -> Self {
        let dir = TestDir::new(name);
        let sock = dir.join("raw.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let got = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(T)).unwrap();
            let request = read_request(&mut stream);
            answer(&mut stream);
            request
        });
        Raw {
            sock,
            got: Some(got),
            _dir: dir,
        }
    }

    /// Answers with exactly `bytes`, then closes.
    fn replying(name: &str, bytes: Vec<u8>) -> Self {
        Self::start(name, move |s| {
            let _ = s.write_all(&bytes);
        })
    }

    /// The raw request the server received.
    fn request(mut self) -> Vec<u8> {
        self.got.take().unwrap().join().expect("raw server thread")
    }
}

fn read_request(stream: &mut UnixStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return buf;
            }
        }
        let n = match stream.read(&mut chunk) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => r.unwrap(),
        };
        if n == 0 {
            return buf;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A request split into its head lines and its JSON body.
fn parse_request(raw: &[u8]) -> (Vec<String>, Value) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("request head");
    let head = std::str::from_utf8(&raw[..end]).unwrap();
    let lines: Vec<String> = head.split("\r\n").map(str::to_string).collect();
    let body = &raw[end + 4..];
    let length = lines
        .iter()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("Content-Length header");
    assert_eq!(length.parse::<usize>().unwrap(), body.len());
    (
        lines,
        serde_json::from_slice(body).expect("JSON request body"),
    )
}

/// The env and decoded config of a captured multus-shim request.
fn captured(name: &str) -> (BTreeMap<String, String>, Vec<u8>) {
    let (_, body) = parse_request(&fixture(name));
    let env = serde_json::from_value(body["env"].clone()).unwrap();
    let config = base64::engine::general_purpose::STANDARD
        .decode(body["config"].as_str().unwrap())
        .unwrap();
    (env, config)
}

/// The captured shim stdin with `socketPath` added before its final `}`.
fn stdin_with_socket(sock: &Path) -> Vec<u8> {
    let original = fixture("shim-stdin-config.json");
    let text = std::str::from_utf8(&original).unwrap();
    let close = text.rfind('}').unwrap();
    format!(
        "{},\"socketPath\":{}{}",
        &text[..close],
        serde_json::to_string(sock.to_str().unwrap()).unwrap(),
        &text[close..]
    )
    .into_bytes()
}

/// Asserts that our request has the captured request's shape: `POST /cni`
/// with a JSON body of `env` (the CNI variables only) and `config` (the
/// stdin, base64).
fn assert_like_capture(raw: &[u8], capture: &str, stdin: &[u8]) {
    let (lines, body) = parse_request(raw);
    assert_eq!(lines[0], "POST /cni HTTP/1.1");
    assert!(lines.contains(&"Host: plexus".to_string()), "{lines:?}");
    assert!(
        lines.contains(&"Content-Type: application/json".to_string()),
        "{lines:?}"
    );
    let (_, captured_body) = parse_request(&fixture(capture));
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&body), keys(&captured_body));

    let (captured_env, captured_config) = captured(capture);
    let cni_only: BTreeMap<String, String> = captured_env
        .into_iter()
        .filter(|(k, _)| k.starts_with("CNI_"))
        .collect();
    let env: BTreeMap<String, String> = serde_json::from_value(body["env"].clone()).unwrap();
    assert_eq!(
        env, cni_only,
        "the CNI variables, and nothing else (no PATH)"
    );

    let config = base64::engine::general_purpose::STANDARD
        .decode(body["config"].as_str().unwrap())
        .unwrap();
    assert_eq!(config, stdin, "config is the stdin, byte for byte");
    // Apart from the socketPath we added, it is the captured config.
    let mut ours: Value = serde_json::from_slice(&config).unwrap();
    ours.as_object_mut().unwrap().remove("socketPath");
    assert_eq!(
        ours,
        serde_json::from_slice::<Value>(&captured_config).unwrap()
    );
}

// ---------------------------------------------------------------------------
// Replays of the captured multus-daemon answers

#[test]
fn replayed_multus_add_should_print_what_multus_shim_printed() {
    let server = Raw::replying("wire-add", fixture("02-ADD-cni-response.txt"));
    let stdin = stdin_with_socket(&server.sock);
    let (env, _) = captured("02-ADD-cni-request.txt");
    let run = shim(&env, &stdin);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout.as_str(),
        std::str::from_utf8(&fixture("shim-ADD-stdout.txt")).unwrap(),
        "byte for byte what multus-shim printed"
    );
    assert_eq!(run.stderr, "", "the daemon was there: no waiting");
    assert_like_capture(&server.request(), "02-ADD-cni-request.txt", &stdin);
}

#[test]
fn replayed_multus_del_should_print_nothing_and_exit_zero() {
    let server = Raw::replying("wire-del", fixture("04-DEL-cni-response.txt"));
    let stdin = stdin_with_socket(&server.sock);
    let (env, _) = captured("04-DEL-cni-request.txt");
    let run = shim(&env, &stdin);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout.as_bytes(), fixture("shim-DEL-stdout.txt"));
    assert!(run.stdout.is_empty());
    assert_like_capture(&server.request(), "04-DEL-cni-request.txt", &stdin);
}

#[test]
fn replayed_multus_text_error_should_give_a_clear_error_and_fail() {
    let server = Raw::replying(
        "wire-err",
        fixture("06-ADD-error-no-podname-cni-response.txt"),
    );
    let stdin = stdin_with_socket(&server.sock);
    let (env, _) = captured("06-ADD-error-no-podname-cni-request.txt");
    let run = shim(&env, &stdin);
    // multus-shim printed code 999 with the text wrapped in its own
    // prefixes; a plain-text body carries no code, so 999 stays.
    let err = run.error(999);
    assert_eq!(
        err["msg"],
        "the daemon answered 400: could not extract the kubernetes runtime args: missing K8S_POD_NAME"
    );
    let multus: Value =
        serde_json::from_slice(&fixture("shim-ADD-error-no-podname-stdout.txt")).unwrap();
    assert_eq!(err["code"], multus["code"]);
    assert!(
        run.stdout
            .as_str()
            .starts_with("{\n    \"code\": 999,\n    \"msg\": "),
        "pretty-printed like multus-shim: {run:?}"
    );
    assert_like_capture(
        &server.request(),
        "06-ADD-error-no-podname-cni-request.txt",
        &stdin,
    );
}

// ---------------------------------------------------------------------------
// Answers no daemon should give

#[test]
fn garbage_answers_should_give_code_102() {
    let cases: [(&str, &[u8]); 4] = [
        ("wire-garbage", b"\x00\x17garbage that is not HTTP at all"),
        ("wire-badstatus", b"HTTP/1.1 OK fine\r\n\r\n"),
        (
            "wire-notjson",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot json!",
        ),
        (
            "wire-noresult",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        ),
    ];
    for (name, answer) in cases {
        let server = Raw::replying(name, answer.to_vec());
        let run = shim(&cni_env("ADD"), &conf(&server.sock, json!({})));
        let err = run.error(102);
        let msg = err["msg"].as_str().unwrap();
        assert!(
            msg.starts_with("invalid answer from the daemon at "),
            "{msg}"
        );
        assert!(msg.contains(server.sock.to_str().unwrap()), "{msg}");
        server.request();
    }
}

#[test]
fn closing_mid_response_should_fail_with_code_101_for_add_and_del() {
    let answers: [(&str, &[u8], &str); 3] = [
        ("wire-silentclose", b"", "without answering"),
        (
            "wire-halfhead",
            b"HTTP/1.1 200 OK\r\nContent-Le",
            "response head",
        ),
        (
            "wire-shortbody",
            b"HTTP/1.1 200 OK\r\nContent-Length: 213\r\n\r\n{\"Result\":{\"cniV",
            "after 16 of 213 body bytes",
        ),
    ];
    for command in ["ADD", "DEL"] {
        for (name, answer, needle) in answers {
            let server = Raw::replying(&format!("{name}-{command}"), answer.to_vec());
            let run = shim(&cni_env(command), &conf(&server.sock, json!({})));
            let err = run.error(101);
            assert!(
                err["msg"].as_str().unwrap().contains(needle),
                "{command}: {needle:?} not in {run:?}"
            );
            assert_eq!(
                err["details"],
                "the request was sent; whether it took effect is unknown"
            );
            server.request();
        }
    }
}

#[test]
fn daemon_closing_without_reading_should_not_exit_zero() {
    // The server takes the connection and drops it at once, unread.
    let dir = TestDir::new("wire-rst");
    let sock = dir.join("rst.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || drop(listener.accept().unwrap()));
    let run = shim(&cni_env("DEL"), &conf(&sock, json!({})));
    server.join().unwrap();
    assert_eq!(run.code, Some(1), "{run:?}");
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert!(
        v["code"] == 101 || v["code"] == 11,
        "reset before or after the request was sent: {run:?}"
    );
}

#[test]
fn plain_text_errors_should_be_quoted_with_their_status() {
    let cases: [(&str, &[u8], u32, &str); 3] = [
        (
            "wire-500",
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\n  boom\n",
            999,
            "the daemon answered 500: boom",
        ),
        (
            "wire-503text",
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
            11,
            "the daemon answered 503 Service Unavailable with an empty body",
        ),
        (
            "wire-chunked",
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nbad r\r\n7\r\nequest\n\r\n0\r\n\r\n",
            999,
            "the daemon answered 400: bad request",
        ),
    ];
    for (name, answer, code, msg) in cases {
        let server = Raw::replying(name, answer.to_vec());
        let run = shim(&cni_env("CHECK"), &conf(&server.sock, json!({})));
        let err = run.error(code);
        assert_eq!(err["msg"], msg, "{name}");
        server.request();
    }
}

#[test]
fn daemon_that_never_answers_should_be_cut_off_by_timeout() {
    let server = Raw::start("wire-mute", |s| {
        // Hold the connection open until the shim gives up and closes it.
        let _ = s.read(&mut [0u8; 1]);
    });
    let started = Instant::now();
    let run = shim(
        &cni_env("ADD"),
        &conf(&server.sock, json!({"timeout": "400ms"})),
    );
    let err = run.error(101);
    assert_eq!(
        err["msg"],
        format!(
            "no answer from the daemon at {} within 400ms",
            server.sock.display()
        )
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    let (lines, _) = parse_request(&server.request());
    assert_eq!(lines[0], "POST /cni HTTP/1.1");
}

#[test]
fn answer_without_content_length_should_be_read_until_close() {
    let body = br#"{"Result":{"cniVersion":"1.1.0","ips":[{"address":"10.1.2.3/24"}]}}"#;
    let mut answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
    answer.extend_from_slice(body);
    let server = Raw::replying("wire-nolength", answer);
    let run = shim(
        &cni_env("ADD"),
        &conf(&server.sock, json!({"cniVersion": "0.4.0"})),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout.as_str(),
        "{\n    \"cniVersion\": \"0.4.0\",\n    \"ips\": [\n        {\n            \"version\": \"4\",\n            \"address\": \"10.1.2.3/24\"\n        }\n    ],\n    \"dns\": {}\n}"
    );
    server.request();
}

// ---------------------------------------------------------------------------
// multus-shim at 1.x: libcni prints 1.x results through a map

/// Indents compact JSON as Go's `json.Indent(dst, src, "", "    ")` does:
/// key order and string bytes kept, empty `{}` and `[]` left as they are.
fn go_indent(compact: &[u8]) -> String {
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        out.push_str(&"    ".repeat(depth));
    }
    let chars: Vec<char> = std::str::from_utf8(compact).unwrap().chars().collect();
    let (mut out, mut depth, mut in_string, mut escaped) = (String::new(), 0, false, false);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else {
            match c {
                '"' => {
                    in_string = true;
                    out.push(c);
                }
                '{' | '[' if matches!(chars.get(i + 1), Some('}' | ']')) => {
                    out.push(c);
                    out.push(chars[i + 1]);
                    i += 1;
                }
                '{' | '[' => {
                    out.push(c);
                    depth += 1;
                    newline(&mut out, depth);
                }
                '}' | ']' => {
                    depth -= 1;
                    newline(&mut out, depth);
                    out.push(c);
                }
                ',' => {
                    out.push(c);
                    newline(&mut out, depth);
                }
                ':' => out.push_str(": "),
                c if c.is_ascii_whitespace() => {}
                c => out.push(c),
            }
        }
        i += 1;
    }
    out
}

/// The body of a captured response (after the blank line).
fn body_of(raw: &[u8]) -> &[u8] {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    &raw[end + 4..]
}

/// The captured daemon's `Result` object, as the multus daemon wrote it.
fn captured_result() -> String {
    let response = fixture("02-ADD-cni-response.txt");
    let body = std::str::from_utf8(body_of(&response)).unwrap();
    body.strip_prefix("{\"Result\":")
        .and_then(|b| b.strip_suffix('}'))
        .expect("{\"Result\":...}")
        .to_string()
}

/// The captured shim stdin at `version`, with `socketPath` added.
fn stdin_at(version: &str, sock: &Path) -> Vec<u8> {
    let text = String::from_utf8(stdin_with_socket(sock)).unwrap();
    assert!(text.contains("\"cniVersion\":\"0.3.1\""));
    text.replace(
        "\"cniVersion\":\"0.3.1\"",
        &format!("\"cniVersion\":\"{version}\""),
    )
    .into_bytes()
}

#[test]
fn replayed_multus_add_at_1_x_should_print_what_multus_shim_prints() {
    // multus-shim prints a 1.x result with libcni's Result.MarshalJSON
    // (the encoding the captured daemon answer shows: sorted keys, no empty
    // dns), indented by json.MarshalIndent.
    for version in ["1.0.0", "1.1.0"] {
        let server = Raw::replying(
            &format!("wire-add-{version}"),
            fixture("02-ADD-cni-response.txt"),
        );
        let (env, _) = captured("02-ADD-cni-request.txt");
        let run = shim(&env, &stdin_at(version, &server.sock));
        let expected = go_indent(
            captured_result()
                .replace(
                    "\"cniVersion\":\"1.1.0\"",
                    &format!("\"cniVersion\":\"{version}\""),
                )
                .as_bytes(),
        );
        assert_eq!(run.code, Some(0), "{run:?}");
        assert_eq!(run.stdout, expected, "{version}");
        server.request();
    }
}

// ---------------------------------------------------------------------------
// multus-shim's requests answered by the real plexusd

/// A captured multus-shim request with its netns, container id and
/// config's `cniVersion` replaced, and Content-Length set to match.
fn replay_request(name: &str, netns: &str, container_id: &str, version: &str) -> Vec<u8> {
    let raw = fixture(name);
    let (env, config) = captured(name);
    let config = String::from_utf8(config).unwrap().replace(
        "\"cniVersion\":\"0.3.1\"",
        &format!("\"cniVersion\":\"{version}\""),
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    crate::support::http::edit_body(&raw, |body| {
        let old_config = body
            .split("\"config\":\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        body.replace(&env["CNI_NETNS"], netns)
            .replace(&env["CNI_CONTAINERID"], container_id)
            .replace(old_config, &b64.encode(config))
    })
}

#[test]
fn multus_shim_requests_should_get_the_1_1_0_result_from_plexusd() {
    use crate::support::cni::{conflist, Engine};
    use crate::support::netns::Netns;

    let e = Engine::new("wire-real");
    e.write_network(
        "10-lo.conflist",
        &conflist("lo-net", "1.0.0", vec![json!({"type": "loopback"})]),
    );
    let d = e.start("d", "lo-net", "20s");
    let (captured_env, _) = captured("02-ADD-cni-request.txt");
    let captured_netns = &captured_env["CNI_NETNS"];
    for version in ["0.3.1", "1.0.0"] {
        let ns = Netns::new();
        let id = format!("wire-real-{}", version.replace('.', ""));
        let add = replay_request("02-ADD-cni-request.txt", &ns.path, &id, version);
        let r = crate::support::http::send_raw(&d.sock, &add).unwrap();
        assert_eq!(
            r.status,
            200,
            "{version}: {}\n{}",
            r.body_str(),
            d.log_text()
        );

        // What multus-shim does with it: decode {"Result": <1.x result>}.
        let body: Value = r.json();
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["Result"], "{version}: {}", r.body_str());
        let result = &body["Result"];
        assert_eq!(result["cniVersion"], "1.1.0", "{version}: {result}");
        let ips = result["ips"].as_array().unwrap();
        assert!(!ips.is_empty(), "{result}");
        assert!(ips.iter().all(|ip| ip.get("version").is_none()), "{result}");
        // Byte for byte the multus daemon's answer to the same request.
        let multus_body = String::from_utf8(body_of(&fixture("02-ADD-cni-response.txt")).to_vec())
            .unwrap()
            .replace(captured_netns.as_str(), &ns.path);
        assert_eq!(r.body_str(), multus_body, "{version}");

        // ...then convert it to the config's version and print it.
        let printed = plexus::result::Success::from_value(result)
            .unwrap()
            .convert(version)
            .unwrap()
            .to_pretty();
        let printed = String::from_utf8(printed).unwrap();
        let converted: Value = serde_json::from_str(&printed).unwrap();
        assert_eq!(converted["cniVersion"], version);
        if version == "0.3.1" {
            let families: Vec<&Value> = converted["ips"]
                .as_array()
                .unwrap()
                .iter()
                .map(|ip| &ip["version"])
                .collect();
            assert_eq!(families, ["4", "6"], "{printed}");
            let multus_printed = String::from_utf8(fixture("shim-ADD-stdout.txt"))
                .unwrap()
                .replace(captured_netns.as_str(), &ns.path);
            assert_eq!(printed, multus_printed, "what multus-shim printed");
        } else {
            assert!(!printed.contains("\"version\""), "{printed}");
        }

        let del = replay_request("04-DEL-cni-request.txt", &ns.path, &id, version);
        let r = crate::support::http::send_raw(&d.sock, &del).unwrap();
        assert_eq!((r.status, r.body_str()), (200, ""), "{}", d.log_text());
        assert!(e.records().is_empty(), "{:?}", e.records());
    }
}
