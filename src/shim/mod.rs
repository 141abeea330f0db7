//! The CNI plugin side of Plexus (`plexus-shim`): checks the call the way
//! CNI skel does, forwards it to the daemon (plexusd, or a multus daemon)
//! as `POST /cni {"env", "config"}` over the unix socket, and turns the
//! answer into CNI output: an ADD answer is the daemon's result (1.1.0 from
//! both daemons) converted to the shim config's `cniVersion`.
//!
//! The shim must stay small and start fast: it uses std, serde_json and
//! base64 (through [`api`]), [`result`] and the std-only [`duration`]
//! parser, with a blocking [`UnixStream`] and a small HTTP/1.1 client. No
//! async runtime, no logging framework. Everything after the pre-checks is
//! bounded by the overall deadline (`timeout`), including a `connect` that
//! waits for room in a full listen backlog.
//!
//! Only VERSION is answered locally. Every failure, DEL included, is CNI
//! error JSON on stdout and a non-zero exit: a DEL that did not reach the
//! daemon must be retried by the runtime, never skipped (multus-shim exits
//! 0 there and leaks the attachment).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{self, code, CniError, Command};
use crate::{duration, result};

mod config;
mod http;

pub use config::{
    Config, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, KEY_CONNECT_TIMEOUT, KEY_SOCKET_DIR,
    KEY_SOCKET_PATH, KEY_TIMEOUT,
};

#[doc(hidden)]
pub use http::parse_raw_response;
use http::Response;

/// Largest network config read from stdin.
pub const MAX_STDIN_BYTES: usize = api::MAX_BODY_BYTES;

/// The environment variables forwarded to the daemon; nothing else of the
/// shim's environment is sent.
pub const ENV_VARS: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(100);
/// How much of a plain-text error body goes into the CNI error message.
const MAX_QUOTED_BODY_CHARS: usize = 4096;

/// What the process prints on stdout and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub exit_code: u8,
}

impl Outcome {
    fn success(stdout: Vec<u8>) -> Self {
        Self {
            stdout,
            exit_code: 0,
        }
    }

    /// The error as skel prints it: 4-space indented JSON, exit 1.
    pub fn failure(error: &CniError) -> Self {
        Self {
            stdout: result::to_pretty(error),
            exit_code: 1,
        }
    }
}

/// Runs one CNI call: `env` looks up environment variables, `stdin` is the
/// network config, and `log` receives progress lines (stderr in the binary).
pub fn run(env: impl Fn(&str) -> Option<String>, stdin: impl Read, log: &mut dyn Write) -> Outcome {
    let started = Instant::now();
    match call(&env, stdin, log, started) {
        Ok(stdout) => Outcome::success(stdout),
        Err(e) => Outcome::failure(&e),
    }
}

fn call(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: impl Read,
    log: &mut dyn Write,
    started: Instant,
) -> Result<Vec<u8>, CniError> {
    // Read first, whatever happens next, so a runtime writing the config
    // never meets a closed pipe (skel does the same).
    let stdin = read_stdin(stdin);
    let command = match env("CNI_COMMAND").filter(|c| !c.is_empty()) {
        None => {
            return Err(CniError::new(
                code::INVALID_ENVIRONMENT,
                "required env variables [CNI_COMMAND] missing",
            ))
        }
        Some(c) => Command::parse(&c).ok_or_else(|| {
            CniError::new(
                code::INVALID_ENVIRONMENT,
                format!("unknown CNI_COMMAND: {c}"),
            )
        })?,
    };
    if command == Command::Version {
        // Answered even when stdin is unreadable: skel ignores it too.
        return Ok(version_answer(stdin.as_deref().unwrap_or_default()));
    }
    let stdin = stdin?;
    check_env(command, env)?;
    let config = Config::from_stdin(&stdin)?;
    if let Some(min) = command.min_version() {
        if result::compare(&config.cni_version, min) == Some(Ordering::Less) {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "config version {} does not allow {}",
                    config.cni_version,
                    command.as_str()
                ),
            )
            .with_details(format!(
                "{} needs cniVersion {min} or later",
                command.as_str()
            )));
        }
    }
    let request = api::Request {
        env: ENV_VARS
            .iter()
            .filter_map(|k| env(k).map(|v| (k.to_string(), v)))
            .collect::<BTreeMap<_, _>>(),
        config: stdin,
        interface_attributes: None,
    };
    let body = serde_json::to_vec(&request)
        .map_err(|e| CniError::new(code::INTERNAL, format!("cannot encode the request: {e}")))?;
    let client = Client {
        config: &config,
        deadline: started + config.timeout,
        started,
    };
    let response = client.exchange(&body, log)?;
    client.answer(command, response)
}

/// Reads stdin up to [`MAX_STDIN_BYTES`].
fn read_stdin(stdin: impl Read) -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    stdin
        .take(MAX_STDIN_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| {
            CniError::new(
                code::IO_FAILURE,
                format!("cannot read the network config from stdin: {e}"),
            )
        })?;
    if buf.len() > MAX_STDIN_BYTES {
        return Err(CniError::new(
            code::INVALID_NETWORK_CONFIG,
            format!("the network config on stdin is larger than {MAX_STDIN_BYTES} bytes"),
        ));
    }
    Ok(buf)
}

/// The environment skel requires per command (CNI spec, section 3).
fn check_env(command: Command, env: &dyn Fn(&str) -> Option<String>) -> Result<(), CniError> {
    let needs: &[&str] = match command {
        Command::Add | Command::Check => &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"],
        Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME"],
        Command::Gc | Command::Status | Command::Version => &[],
    };
    let missing: Vec<&str> = needs
        .iter()
        .copied()
        .filter(|k| env(k).is_none_or(|v| v.is_empty()))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENVIRONMENT,
            format!("required env variables [{}] missing", missing.join(",")),
        ))
    }
}

#[derive(Serialize)]
struct VersionAnswer<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    #[serde(rename = "supportedVersions")]
    supported_versions: &'a [&'a str],
}

/// VERSION: the config's `cniVersion` echoed when supported, else the
/// newest; compact with a trailing newline, as Go plugins print it.
fn version_answer(stdin: &[u8]) -> Vec<u8> {
    #[derive(Deserialize)]
    struct Asked {
        #[serde(rename = "cniVersion")]
        cni_version: Option<String>,
    }
    let asked = serde_json::from_slice::<Asked>(stdin)
        .ok()
        .and_then(|a| a.cni_version)
        .filter(|v| result::is_supported(v));
    let answer = VersionAnswer {
        cni_version: asked.as_deref().unwrap_or(result::LATEST),
        supported_versions: result::SUPPORTED,
    };
    let mut out = serde_json::to_vec(&answer).unwrap_or_default();
    out.push(b'\n');
    out
}

/// One request to the daemon, within the call's deadline.
struct Client<'a> {
    config: &'a Config,
    deadline: Instant,
    started: Instant,
}

impl Client<'_> {
    fn path(&self) -> std::path::Display<'_> {
        self.config.socket.display()
    }

    /// Connects, sends the request and reads the answer.
    fn exchange(&self, body: &[u8], log: &mut dyn Write) -> Result<Response, CniError> {
        let mut stream = self.connect(log)?;
        let mut raw = format!(
            "POST {} HTTP/1.1\r\nHost: plexus\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            api::PATH_CNI,
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(body);
        // The write side is never shut down: a server may take a half-close
        // for an abandoned request.
        let sent = write_all(&mut stream, &raw, self.deadline);
        // Even when the write failed, the daemon may have answered (e.g. a
        // 413 before reading the whole body); that answer wins.
        match (http::read_response(&mut stream, self.deadline), sent) {
            (Ok(response), _) => Ok(response),
            (Err(_), Err(e)) => Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "the connection to the daemon at {} failed before the request was sent ({e}); try again later",
                    self.path()
                ),
            )),
            (Err(e), Ok(())) => Err(self.read_error(e)),
        }
    }

    /// Connects, retrying while the socket is missing, refuses or has a
    /// full backlog, until `connectTimeout` (bounded by `timeout`).
    fn connect(&self, log: &mut dyn Write) -> Result<UnixStream, CniError> {
        let until = (self.started + self.config.connect_timeout).min(self.deadline);
        let mut backoff = FIRST_BACKOFF;
        let mut waited = false;
        loop {
            let window = until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let err = match connect_once(&self.config.socket, window) {
                Ok(stream) => return Ok(stream),
                Err(e) => e,
            };
            if !is_transient(&err) {
                return Err(CniError::new(
                    code::IO_FAILURE,
                    format!("cannot connect to the daemon at {}: {err}", self.path()),
                ));
            }
            if !waited {
                waited = true;
                let line = format!(
                    "plexus-shim: waiting for the daemon at {}: {err}\n",
                    self.path()
                );
                // A closed stderr must not fail the call.
                let _ = log.write_all(line.as_bytes());
            }
            let now = Instant::now();
            if now >= until {
                return Err(CniError::new(
                    code::TRY_AGAIN_LATER,
                    format!(
                        "the daemon is not reachable at {}: {err} (retried for {}); try again later",
                        self.path(),
                        duration::format(until.saturating_duration_since(self.started))
                    ),
                ));
            }
            std::thread::sleep(backoff.min(until - now));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn read_error(&self, e: http::Error) -> CniError {
        match e {
            http::Error::TimedOut => CniError::new(
                code::NO_ANSWER,
                format!(
                    "no answer from the daemon at {} within {}",
                    self.path(),
                    duration::format(self.config.timeout)
                ),
            )
            .with_details("the request was sent; whether it took effect is unknown"),
            http::Error::Closed(why) => CniError::new(
                code::NO_ANSWER,
                format!(
                    "no complete answer from the daemon at {}: {why}",
                    self.path()
                ),
            )
            .with_details("the request was sent; whether it took effect is unknown"),
            http::Error::Io(err) => CniError::new(
                code::NO_ANSWER,
                format!(
                    "no complete answer from the daemon at {}: {err}",
                    self.path()
                ),
            )
            .with_details("the request was sent; whether it took effect is unknown"),
            http::Error::Garbage(why) => self.bad_answer(&why),
        }
    }

    fn bad_answer(&self, why: &str) -> CniError {
        CniError::new(
            code::BAD_ANSWER,
            format!("invalid answer from the daemon at {}: {why}", self.path()),
        )
    }

    /// Turns the daemon's answer into the shim's output.
    fn answer(&self, command: Command, response: Response) -> Result<Vec<u8>, CniError> {
        if response.status != 200 {
            return Err(error_from(&response));
        }
        if command != Command::Add {
            return Ok(Vec::new());
        }
        let body: Value = serde_json::from_slice(&response.body)
            .map_err(|e| self.bad_answer(&format!("the ADD answer is not JSON: {e}")))?;
        let found = match body.get("Result") {
            Some(r) if !r.is_null() => r,
            _ => return Err(self.bad_answer("the ADD answer has no Result")),
        };
        let converted = result::Success::from_value_or(found, result::LATEST)
            .and_then(|r| r.convert(&self.config.cni_version))
            .map_err(|e| match e {
                result::Error::Unsupported { .. } => CniError::new(e.code(), e.to_string()),
                _ => self.bad_answer(&format!("the ADD answer holds an {e}")),
            })?;
        Ok(converted.to_pretty())
    }
}

/// The CNI error for a non-200 answer: the daemon's own error JSON when it
/// sent one (code, msg and details kept), else a message quoting the body.
/// An error without a code (or with code 0, "unknown") gets the code the
/// status implies: the runtime must never see success-looking 0.
fn error_from(response: &Response) -> CniError {
    #[derive(Deserialize)]
    struct WireError {
        #[serde(default)]
        code: u32,
        #[serde(default)]
        msg: String,
        #[serde(default)]
        details: String,
    }
    // A 503 means "try again later" whatever its body says.
    let uncoded = if response.status == 503 {
        code::TRY_AGAIN_LATER
    } else {
        code::INTERNAL
    };
    // Like multus-shim: a CNI error counts when it has a message.
    if let Ok(e) = serde_json::from_slice::<WireError>(&response.body) {
        if !e.msg.is_empty() {
            let code = if e.code == 0 { uncoded } else { e.code };
            return CniError::new(code, e.msg).with_details(e.details);
        }
    }
    let text = String::from_utf8_lossy(&response.body);
    let text = text.trim();
    let code = uncoded;
    if text.is_empty() {
        return CniError::new(
            code,
            format!(
                "the daemon answered {} {} with an empty body",
                response.status, response.reason
            ),
        );
    }
    let quoted: String = match text.char_indices().nth(MAX_QUOTED_BODY_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    };
    CniError::new(
        code,
        format!("the daemon answered {}: {quoted}", response.status),
    )
}

/// Whether a failed connect may succeed later: no socket yet, nobody
/// listening (daemon restarting without socket activation), backlog full.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::TimedOut
            | io::ErrorKind::Interrupted
    )
}

/// One `connect(2)` that waits at most `wait` for room in the listener's
/// backlog.
///
/// `UnixStream::connect` would block without limit on a full backlog: the
/// kernel waits for room for as long as the socket's send timeout, which
/// is infinite by default. So the socket is made by hand and gets
/// `SO_SNDTIMEO` first; then a full backlog ends in EAGAIN, which is
/// retried like a refused connection.
fn connect_once(path: &Path, wait: Duration) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain old data, for which all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a usable socket path (empty, longer than {} bytes, or with a NUL byte)",
                addr.sun_path.len() - 1
            ),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nothing else.
    let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    stream.set_write_timeout(Some(wait))?;
    loop {
        // SAFETY: `addr` is an initialised sockaddr_un and `len` lies within
        // it (the path is shorter than sun_path, checked above).
        let rc = unsafe {
            libc::connect(
                stream.as_raw_fd(),
                std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
                len as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(stream);
        }
        let err = io::Error::last_os_error();
        // An interrupted unix-socket connect leaves the socket unconnected,
        // so it may simply be repeated.
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn write_all(stream: &mut UnixStream, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        let left = http::remaining(deadline).ok_or(io::ErrorKind::TimedOut)?;
        stream.set_write_timeout(Some(left))?;
        match stream.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run_with(env: &[(&str, &str)], stdin: &[u8]) -> (Outcome, Value) {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut log = Vec::new();
        let out = run(|k| env.get(k).cloned(), stdin, &mut log);
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out, json)
    }

    #[test]
    fn version_should_echo_a_supported_config_version() {
        let (out, _) = run_with(&[("CNI_COMMAND", "VERSION")], br#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(out.exit_code, 0);
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "{\"cniVersion\":\"0.4.0\",\"supportedVersions\":[\"0.3.0\",\"0.3.1\",\"0.4.0\",\"1.0.0\",\"1.1.0\"]}\n"
        );
        for stdin in [&b""[..], b"garbage", br#"{"cniVersion":"0.2.0"}"#] {
            let (out, json) = run_with(&[("CNI_COMMAND", "VERSION")], stdin);
            assert_eq!(out.exit_code, 0);
            assert_eq!(json["cniVersion"], "1.1.0");
        }
    }

    #[test]
    fn env_errors_should_be_code_4_and_name_the_variables() {
        let ok_stdin = br#"{"cniVersion":"1.0.0","socketPath":"/nonexistent/s"}"#;
        let (out, json) = run_with(&[], ok_stdin);
        assert_eq!((out.exit_code, &json["code"]), (1, &Value::from(4)));
        assert!(json["msg"].as_str().unwrap().contains("CNI_COMMAND"));
        let (_, json) = run_with(&[("CNI_COMMAND", "add")], ok_stdin);
        assert_eq!(json["code"], 4);
        assert_eq!(json["msg"], "unknown CNI_COMMAND: add");
        let (_, json) = run_with(&[("CNI_COMMAND", "ADD"), ("CNI_NETNS", "")], ok_stdin);
        assert_eq!(
            json["msg"],
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing"
        );
        let (_, json) = run_with(&[("CNI_COMMAND", "DEL"), ("CNI_IFNAME", "eth0")], ok_stdin);
        assert_eq!(
            json["msg"],
            "required env variables [CNI_CONTAINERID] missing"
        );
    }

    #[test]
    fn version_gates_should_refuse_old_configs() {
        let env = [
            ("CNI_COMMAND", "CHECK"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_NETNS", "/n"),
            ("CNI_IFNAME", "eth0"),
        ];
        let (_, json) = run_with(&env, br#"{"cniVersion":"0.3.1"}"#);
        assert_eq!(json["code"], 1);
        for cmd in ["GC", "STATUS"] {
            let (_, json) = run_with(&[("CNI_COMMAND", cmd)], br#"{"cniVersion":"1.0.0"}"#);
            assert_eq!(json["code"], 1, "{cmd}");
            assert!(json["msg"].as_str().unwrap().contains(cmd));
        }
    }

    #[test]
    fn oversize_stdin_should_be_refused() {
        let big = vec![b' '; MAX_STDIN_BYTES + 1];
        let (out, json) = run_with(&[("CNI_COMMAND", "GC")], &big);
        assert_eq!((out.exit_code, &json["code"]), (1, &Value::from(7)));
    }

    #[test]
    fn error_bodies_should_keep_the_daemon_code_or_quote_the_text() {
        let resp = |status, body: &str| Response {
            status,
            reason: "Whatever".into(),
            body: body.as_bytes().to_vec(),
        };
        let e = error_from(&resp(400, r#"{"code":7,"msg":"bad","details":"why"}"#));
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_str()),
            (7, "bad", "why")
        );
        let e = error_from(&resp(503, r#"{"code":11,"msg":"busy; try again later"}"#));
        assert_eq!(e.code, 11);
        let e = error_from(&resp(400, "could not extract: missing K8S_POD_NAME\n"));
        assert_eq!(e.code, 999);
        assert_eq!(
            e.msg,
            "the daemon answered 400: could not extract: missing K8S_POD_NAME"
        );
        let e = error_from(&resp(503, ""));
        assert_eq!(e.code, 11);
        assert_eq!(e.msg, "the daemon answered 503 Whatever with an empty body");
        let e = error_from(&resp(400, r#"{"code":7}"#));
        assert_eq!(e.code, 999, "no msg: quoted as text");
        assert_eq!(e.code, code::INTERNAL);
        let long = "x".repeat(10_000);
        assert!(error_from(&resp(500, &long)).msg.len() < 4200);
    }
    #[test]
    fn daemon_errors_without_a_code_should_not_become_code_0() {
        let resp = |status, body: &str| Response {
            status,
            reason: "Whatever".into(),
            body: body.as_bytes().to_vec(),
        };
        for body in [r#"{"msg":"x"}"#, r#"{"code":0,"msg":"x"}"#] {
            let e = error_from(&resp(400, body));
            assert_eq!((e.code, e.msg.as_str()), (code::INTERNAL, "x"), "{body}");
            let e = error_from(&resp(500, body));
            assert_eq!(e.code, code::INTERNAL, "{body}");
            let e = error_from(&resp(503, body));
            assert_eq!(
                (e.code, e.msg.as_str()),
                (code::TRY_AGAIN_LATER, "x"),
                "{body}"
            );
        }
        let e = error_from(&resp(400, r#"{"msg":"x","details":"d"}"#));
        assert_eq!(e.details, "d");
        // What the runtime reads: a non-zero code and the message.
        let out = Outcome::failure(&error_from(&resp(400, r#"{"msg":"x"}"#)));
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (json["code"].as_u64(), json["msg"].as_str()),
            (Some(999), Some("x"))
        );
    }
}
