//! The CNI front end: the call as the runtime makes it (CNI environment
//! and the network config on stdin), checked the way CNI skel checks it and
//! turned into the daemon's request; and the daemon's answer turned into
//! what a CNI plugin prints (result or error JSON) and its exit status.
//!
//! Only VERSION is answered here. This module never touches the socket:
//! the client carries the request and brings back the answer.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::io::Read;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::client;
use super::config::Config;
use super::http::Response;
use crate::api::{self, code, CniError, Command};
use crate::result;

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

/// How much of a plain-text error body goes into the CNI error message.
const MAX_QUOTED_BODY_CHARS: usize = 4096;

/// What the process prints on stdout and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub exit_code: u8,
}

impl Outcome {
    pub(super) fn success(stdout: Vec<u8>) -> Self {
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

/// A CNI call, read from the environment and stdin.
pub(super) enum Call {
    /// VERSION, answered here: what to print.
    Version(Vec<u8>),
    /// Every other command, for the daemon.
    Forward(Forward),
}

/// A call the daemon answers.
pub(super) struct Forward {
    pub(super) command: Command,
    /// The shim's settings from the network config.
    pub(super) config: Config,
    /// The request to send: `POST /cni {"env", "config"}`.
    pub(super) body: Vec<u8>,
}

/// Reads the call from `env` and `stdin` and checks it the way skel does:
/// the command, the environment it needs, the network config and whether
/// its version allows the command.
pub(super) fn read(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: impl Read,
) -> Result<Call, CniError> {
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
        return Ok(Call::Version(version_answer(
            stdin.as_deref().unwrap_or_default(),
        )));
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
    Ok(Call::Forward(Forward {
        command,
        config,
        body,
    }))
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

/// Turns the daemon's answer to `forward` into the shim's output.
pub(super) fn answer(forward: &Forward, response: Response) -> Result<Vec<u8>, CniError> {
    let bad_answer = |why: &str| client::bad_answer(&forward.config.socket, why);
    if response.status != 200 {
        return Err(error_from(&response));
    }
    if forward.command != Command::Add {
        return Ok(Vec::new());
    }
    let body: Value = serde_json::from_slice(&response.body)
        .map_err(|e| bad_answer(&format!("the ADD answer is not JSON: {e}")))?;
    let found = match body.get("Result") {
        Some(r) if !r.is_null() => r,
        _ => return Err(bad_answer("the ADD answer has no Result")),
    };
    let converted = result::Success::from_value_or(found, result::LATEST)
        .and_then(|r| r.convert(&forward.config.cni_version))
        .map_err(|e| match e {
            result::Error::Unsupported { .. } => CniError::new(e.code(), e.to_string()),
            _ => bad_answer(&format!("the ADD answer holds an {e}")),
        })?;
    Ok(converted.to_pretty())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::run;
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

    /// A daemon's answer with `status` and `body`.
    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            reason: "Whatever".into(),
            body: body.as_bytes().to_vec(),
        }
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
    fn status_should_not_wait_for_a_missing_daemon_but_other_commands_should() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("absent.sock");
        let stdin = |connect_timeout: &str| {
            serde_json::to_vec(&serde_json::json!({
                "cniVersion": "1.1.0",
                "socketPath": sock,
                "connectTimeout": connect_timeout,
                "timeout": "1h",
            }))
            .unwrap()
        };
        // A STATUS that waited would end after 10 s, with code 11.
        let (out, json) = run_with(&[("CNI_COMMAND", "STATUS")], &stdin("10s"));
        assert_eq!(out.exit_code, 1);
        assert_eq!(json["code"], crate::api::code::PLUGIN_NOT_AVAILABLE);
        assert!(json["msg"]
            .as_str()
            .unwrap()
            .contains(sock.to_str().unwrap()));
        let started = std::time::Instant::now();
        let (_, json) = run_with(&[("CNI_COMMAND", "GC")], &stdin("100ms"));
        assert_eq!(json["code"], code::TRY_AGAIN_LATER);
        assert!(started.elapsed() >= std::time::Duration::from_millis(100));
    }

    #[test]
    fn oversize_stdin_should_be_refused() {
        let big = vec![b' '; MAX_STDIN_BYTES + 1];
        let (out, json) = run_with(&[("CNI_COMMAND", "GC")], &big);
        assert_eq!((out.exit_code, &json["code"]), (1, &Value::from(7)));
    }

    #[test]
    fn error_bodies_should_keep_the_daemon_code_or_quote_the_text() {
        let e = error_from(&response(400, r#"{"code":7,"msg":"bad","details":"why"}"#));
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_str()),
            (7, "bad", "why")
        );
        let e = error_from(&response(
            503,
            r#"{"code":11,"msg":"busy; try again later"}"#,
        ));
        assert_eq!(e.code, 11);
        let e = error_from(&response(400, "could not extract: missing K8S_POD_NAME\n"));
        assert_eq!(e.code, 999);
        assert_eq!(
            e.msg,
            "the daemon answered 400: could not extract: missing K8S_POD_NAME"
        );
        let e = error_from(&response(503, ""));
        assert_eq!(e.code, 11);
        assert_eq!(e.msg, "the daemon answered 503 Whatever with an empty body");
        let e = error_from(&response(400, r#"{"code":7}"#));
        assert_eq!(e.code, 999, "no msg: quoted as text");
        assert_eq!(e.code, code::INTERNAL);
        let long = "x".repeat(10_000);
        assert!(error_from(&response(500, &long)).msg.len() < 4200);
    }

    #[test]
    fn daemon_errors_without_a_code_should_not_become_code_0() {
        for body in [r#"{"msg":"x"}"#, r#"{"code":0,"msg":"x"}"#] {
            let e = error_from(&response(400, body));
            assert_eq!((e.code, e.msg.as_str()), (code::INTERNAL, "x"), "{body}");
            let e = error_from(&response(500, body));
            assert_eq!(e.code, code::INTERNAL, "{body}");
            let e = error_from(&response(503, body));
            assert_eq!(
                (e.code, e.msg.as_str()),
                (code::TRY_AGAIN_LATER, "x"),
                "{body}"
            );
        }
        let e = error_from(&response(400, r#"{"msg":"x","details":"d"}"#));
        assert_eq!(e.details, "d");
        // What the runtime reads: a non-zero code and the message.
        let out = Outcome::failure(&error_from(&response(400, r#"{"msg":"x"}"#)));
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (json["code"].as_u64(), json["msg"].as_str()),
            (Some(999), Some("x"))
        );
    }
}
