//! A deliberately plain HTTP/1.1 client over a unix socket, so tests see
//! exactly what the daemon wrote on the wire.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// The raw bytes of `POST /cni` carrying `request`, as a shim sends it.
pub fn cni_request(request: &plexus::api::Request) -> Vec<u8> {
    let body = serde_json::to_vec(request).expect("a request serialises");
    let mut raw = format!(
        "POST /cni HTTP/1.1\r\nHost: plexus\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    raw
}

/// One parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn body_str(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or("<non-utf8 body>")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body_str()))
    }
}

/// Sends `method path` with `body` and reads the response until the server
/// closes the connection (the daemon serves one request per connection).
pub fn request(sock: &Path, method: &str, path: &str, body: &[u8]) -> io::Result<Response> {
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: plexus\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    send_raw(sock, &raw)
}

/// `GET /healthz` at `sock`: the answer's status.
pub fn healthz(sock: &Path) -> u16 {
    request(sock, "GET", "/healthz", b"").unwrap().status
}

/// A TCP port on `ip` that was free when asked.
pub fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` over TCP at 127.0.0.1:`port`, read until the server
/// closes the connection.
pub fn metrics_over_tcp(port: u16) -> Response {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    parse_response(&buf).unwrap()
}

/// A raw HTTP request (a capture) with its body rewritten by `edit` and
/// its Content-Length set to match.
pub fn edit_body(raw: &[u8], edit: impl FnOnce(&str) -> String) -> Vec<u8> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a request head");
    let head = std::str::from_utf8(&raw[..end]).expect("a text head");
    let body = edit(std::str::from_utf8(&raw[end + 4..]).expect("a text body"));
    let head: Vec<String> = head
        .split("\r\n")
        .map(|l| match l.strip_prefix("Content-Length: ") {
            Some(_) => format!("Content-Length: {}", body.len()),
            None => l.to_string(),
        })
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n")).into_bytes()
}

/// Writes raw bytes and parses what comes back.
pub fn send_raw(sock: &Path, raw: &[u8]) -> io::Result<Response> {
    let mut stream = UnixStream::connect(sock)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    stream.write_all(raw)?;
    read_response(&mut stream)
}

/// Reads one response until EOF and parses it.
pub fn read_response(stream: &mut UnixStream) -> io::Result<Response> {
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf)?;
    parse_response(&buf)
}

pub fn parse_response(buf: &[u8]) -> io::Result<Response> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            bad(&format!(
                "no header end in {:?}",
                String::from_utf8_lossy(buf)
            ))
        })?;
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| bad("non-utf8 head"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty response"))?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(&format!("bad status line {status_line:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: buf[end + 4..].to_vec(),
    })
}

/// The value of the sample `sample` (a metric name with its labels, as
/// rendered) in `GET /metrics` at `sock`; `None` when it has none yet.
pub fn metric(sock: &Path, sample: &str) -> Option<f64> {
    let resp = request(sock, "GET", "/metrics", b"").unwrap();
    resp.body_str()
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
}
