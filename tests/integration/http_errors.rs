//! Malformed and unexpected input: the right status, CNI error JSON, no
//! panic, and the daemon keeps serving.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::json;

use crate::support::daemon::{Daemon, TestDir};
use crate::support::http;

fn daemon(name: &str) -> (TestDir, Daemon) {
    let dir = TestDir::new(name);
    let mut d = Daemon::start(&dir, "d", json!({}));
    d.ready();
    (dir, d)
}

/// Asserts a CNI error JSON body: a numeric code and a non-empty message.
fn assert_cni_error(r: &http::Response, status: u16) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", r.body_str());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert!(v["code"].is_u64(), "{v}");
    assert!(!v["msg"].as_str().unwrap_or("").is_empty(), "{v}");
    v
}

/// Asserts the daemon is still running and answers `/healthz`.
fn assert_serving(d: &mut Daemon) {
    assert!(d.running());
    assert_eq!(http::healthz(&d.sock), 200);
}

#[test]
fn malformed_requests_should_get_cni_errors_and_leave_daemon_serving() {
    let (_dir, mut d) = daemon("malformed");
    let sock = d.sock.clone();
    let s = &sock;
    let cases: &[(&str, &str, &[u8], u16, u64)] = &[
        ("POST", "/cni", b"{not json", 400, 6),
        ("POST", "/cni", b"", 400, 6),
        ("POST", "/cni", b"[1,2,3]", 400, 6),
        ("POST", "/cni", br#"{"env": 5}"#, 400, 6),
        ("POST", "/cni", br#"{"env": {"CNI_COMMAND": 1}}"#, 400, 6),
        ("POST", "/cni", br#"{"config": "***"}"#, 400, 6),
        ("POST", "/cni", b"\xff\xfe\x00garbage", 400, 6),
        ("POST", "/delegate", b"{", 400, 6),
        ("GET", "/cni", b"", 405, 999),
        ("DELETE", "/healthz", b"", 405, 999),
        ("POST", "/metrics", b"", 405, 999),
        ("GET", "/", b"", 404, 999),
        ("POST", "/cni/", b"{}", 404, 999),
        ("GET", "/../etc/passwd", b"", 404, 999),
    ];
    for (method, path, body, status, code) in cases {
        let r = http::request(s, method, path, body).unwrap();
        let v = assert_cni_error(&r, *status);
        assert_eq!(v["code"], *code, "{method} {path}: {v}");
    }
    assert_eq!(
        http::request(s, "GET", "/cni", b"")
            .unwrap()
            .header("allow"),
        Some("POST")
    );
    assert_serving(&mut d);
}

#[test]
fn oversize_bodies_should_get_413() {
    let (_dir, mut d) = daemon("oversize");
    // Declared too large: refused before reading.
    let mut raw = b"POST /cni HTTP/1.1\r\nHost: x\r\nContent-Length: 2097152\r\n\r\n".to_vec();
    raw.extend_from_slice(&[b' '; 1024]);
    let mut c = UnixStream::connect(&d.sock).unwrap();
    c.write_all(&raw).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let r = http::read_response(&mut c).unwrap();
    assert_cni_error(&r, 413);

    // Chunked, no length given: cut off at the cap.
    let mut c = UnixStream::connect(&d.sock).unwrap();
    c.write_all(b"POST /cni HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let writer = {
        let mut c = c.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..40 {
                if c.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .is_err()
                    || c.write_all(&chunk).is_err()
                    || c.write_all(b"\r\n").is_err()
                {
                    return;
                }
            }
            let _ = c.write_all(b"0\r\n\r\n");
        })
    };
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let r = http::read_response(&mut c);
    let _ = writer.join();
    // The client may see the reset before the answer; when it does read
    // the answer, it must be 413.
    if let Ok(r) = r {
        assert_cni_error(&r, 413);
    }
    // Exactly at the cap is still fine (it reaches the handler).
    let mut body = br#"{"env":{"CNI_COMMAND":"ADD"},"x":""#.to_vec();
    body.resize(plexus::api::MAX_BODY_BYTES - 2, b'a');
    body.extend_from_slice(b"\"}");
    let r = http::request(&d.sock, "POST", "/cni", &body).unwrap();
    assert_cni_error(&r, 400);
    assert_serving(&mut d);
}

/// Requests hyper cannot parse are answered 400 with a CNI error body like
/// every other refusal, not an empty one.
#[test]
fn unparsable_requests_should_get_a_cni_error_body() {
    let (_dir, mut d) = daemon("unparsable");
    for raw in [
        &b"\x00\x01\x02\x03 not http at all\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"POST /cni HTTP/1.1\r\nContent-Length: banana\r\n\r\n",
        b"POST /cni HTTP/9.9\r\n\r\n",
        b"POST /cni HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"POST /cni HTTP/1.1\r\nbad header\r\n\r\n",
        b"POST /cni HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST  /cni HTTP/1.1\r\n\r\n",
    ] {
        let r = http::send_raw(&d.sock, raw).unwrap();
        let v = assert_cni_error(&r, 400);
        assert_eq!(v["code"], 6, "{}: {v}", String::from_utf8_lossy(raw));
        assert_eq!(r.header("connection"), Some("close"));
    }
    assert_serving(&mut d);
}

#[test]
fn garbage_bytes_should_not_hurt_the_daemon() {
    let (_dir, mut d) = daemon("garbage");
    for raw in [
        &b"\x00\x01\x02\x03 not http at all\r\n\r\n"[..],
        b"GET\r\n\r\n",
        b"POST /cni HTTP/1.1\r\nContent-Length: banana\r\n\r\n",
        b"POST /cni HTTP/9.9\r\n\r\n",
    ] {
        let mut c = UnixStream::connect(&d.sock).unwrap();
        let _ = c.write_all(raw);
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut c, &mut buf);
    }
    // Abrupt disconnects mid-request.
    for _ in 0..20 {
        let mut c = UnixStream::connect(&d.sock).unwrap();
        let _ = c.write_all(b"POST /cni HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"env\"");
    }
    assert_serving(&mut d);
}

#[test]
fn one_request_per_connection_should_close_after_the_answer() {
    let (_dir, d) = daemon("oneperconn");
    let r = http::request(&d.sock, "GET", "/healthz", b"").unwrap();
    assert_eq!(r.header("connection"), Some("close"));
}

/// The exact bytes a real multus-shim sent for its readiness probes.
#[test]
fn multus_shim_probe_bytes_should_get_multus_shaped_answers() {
    let (_dir, d) = daemon("multusprobe");
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multus-wire/");
    for (req, resp) in [
        ("01-ADD-readyz-request.txt", "01-ADD-readyz-response.txt"),
        ("03-DEL-healthz-request.txt", "03-DEL-healthz-response.txt"),
    ] {
        let raw = std::fs::read(format!("{fixtures}{req}")).unwrap();
        let want =
            http::parse_response(&std::fs::read(format!("{fixtures}{resp}")).unwrap()).unwrap();
        let got = http::send_raw(&d.sock, &raw).unwrap();
        assert_eq!(got.status, want.status, "{req}");
        assert_eq!(got.body, want.body, "{req}");
        assert_eq!(got.header("connection"), Some("close"));
    }
}

#[test]
fn metrics_should_count_requests_by_endpoint_command_and_outcome() {
    let (_dir, d) = daemon("metrics");
    http::request(&d.sock, "POST", "/cni", br#"{"env":{"CNI_COMMAND":"DEL"}}"#).unwrap();
    http::request(&d.sock, "GET", "/nowhere", b"").unwrap();
    let r = http::request(&d.sock, "GET", "/metrics", b"").unwrap();
    assert_eq!(r.status, 200);
    let text = r.body_str();
    for needle in [
        // A DEL without CNI_CONTAINERID: refused as invalid.
        r#"plexus_requests_total{endpoint="/cni",command="DEL",outcome="invalid"} 1"#,
        r#"plexus_requests_total{endpoint="NotFound",command="",outcome="not_found"} 1"#,
        r#"plexus_request_duration_seconds_count{endpoint="/cni",command="DEL"} 1"#,
        "plexus_requests_in_flight 0",
        "plexus_requests_queued 0",
        r#"multus_server_request_total{handler="/cni",code="400",method="post"} 1"#,
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}
