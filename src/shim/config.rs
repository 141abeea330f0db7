//! The shim's own settings, read from the network config the runtime
//! passes on stdin: the config's `cniVersion`, the daemon's socket and the
//! two deadlines. Unknown keys are the daemon's business and are ignored
//! here; this module only reads, it never connects.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::api::{self, code, CniError};
use crate::{duration, result};

/// Config key: directory of `plexus.sock` (the multus shim's key).
pub const KEY_SOCKET_DIR: &str = "daemonSocketDir";
/// Config key: full path of the daemon's socket; wins over `daemonSocketDir`.
pub const KEY_SOCKET_PATH: &str = "socketPath";
/// Config key: how long to retry connecting while the socket is missing or
/// refuses.
pub const KEY_CONNECT_TIMEOUT: &str = "connectTimeout";
/// Config key: deadline of the whole call.
pub const KEY_TIMEOUT: &str = "timeout";

/// Default of `connectTimeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `timeout`: well under the kubelet's runtime request timeout
/// (2 minutes for the whole RunPodSandbox; 4 minutes overall).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// What the shim reads from its own network config (stdin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The config's `cniVersion`; ADD results are printed in it.
    pub cni_version: String,
    /// The daemon's socket.
    pub socket: PathBuf,
    /// `connectTimeout`: how long to retry connecting.
    pub connect_timeout: Duration,
    /// `timeout`: the deadline of the whole call.
    pub timeout: Duration,
}

impl Config {
    /// Reads and checks the network config; every bad shim key is reported
    /// in one error.
    pub fn from_stdin(stdin: &[u8]) -> Result<Self, CniError> {
        if stdin.iter().all(u8::is_ascii_whitespace) {
            return Err(CniError::new(
                code::DECODING_FAILURE,
                "the network config on stdin is empty",
            ));
        }
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                code::DECODING_FAILURE,
                format!("cannot decode the network config on stdin: {e}"),
            )
        })?;
        let Value::Object(map) = value else {
            return Err(CniError::new(
                code::DECODING_FAILURE,
                "the network config on stdin is not a JSON object",
            ));
        };
        let cni_version = match map.get("cniVersion") {
            Some(Value::String(v)) if !v.is_empty() => v.clone(),
            None | Some(Value::Null) | Some(Value::String(_)) => {
                return Err(CniError::new(
                    code::INVALID_NETWORK_CONFIG,
                    "the network config on stdin has no cniVersion",
                ))
            }
            Some(_) => {
                return Err(CniError::new(
                    code::INVALID_NETWORK_CONFIG,
                    "the cniVersion of the network config on stdin is not a string",
                ))
            }
        };
        if !result::is_supported(&cni_version) {
            return Err(
                CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
                    .with_details(format!(
                        "config is {cni_version:?}, plexus-shim supports {:?}",
                        result::SUPPORTED
                    )),
            );
        }

        let mut problems = Vec::new();
        let mut string = |key: &str| match map.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(_) => {
                problems.push(format!("{key}: must be a non-empty string"));
                None
            }
        };
        let socket_path = string(KEY_SOCKET_PATH);
        let socket_dir = string(KEY_SOCKET_DIR);
        let connect_timeout = string(KEY_CONNECT_TIMEOUT);
        let timeout = string(KEY_TIMEOUT);
        let mut parse_duration = |key: &str, text: Option<String>, default: Duration| {
            let Some(text) = text else { return default };
            match duration::parse(&text) {
                Ok(d) => d,
                Err(why) => {
                    problems.push(format!("{key}: {why}"));
                    default
                }
            }
        };
        let connect_timeout = parse_duration(
            KEY_CONNECT_TIMEOUT,
            connect_timeout,
            DEFAULT_CONNECT_TIMEOUT,
        );
        let timeout = parse_duration(KEY_TIMEOUT, timeout, DEFAULT_TIMEOUT);
        if timeout.is_zero() {
            problems.push(format!("{KEY_TIMEOUT}: must be longer than zero"));
        }
        if !problems.is_empty() {
            return Err(CniError::new(
                code::INVALID_NETWORK_CONFIG,
                format!(
                    "invalid plexus-shim settings in the network config: {}",
                    problems.join("; ")
                ),
            ));
        }
        let socket = match (socket_path, socket_dir) {
            (Some(path), _) => PathBuf::from(path),
            (None, Some(dir)) => Path::new(&dir).join(api::SOCKET_NAME),
            (None, None) => Path::new(api::DEFAULT_SOCKET_DIR).join(api::SOCKET_NAME),
        };
        Ok(Self {
            cni_version,
            socket,
            connect_timeout,
            timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Result<Config, CniError> {
        Config::from_stdin(json.as_bytes())
    }

    #[test]
    fn config_should_default_to_the_plexus_socket() {
        let c = config(r#"{"cniVersion":"1.0.0"}"#).unwrap();
        assert_eq!(c.socket, Path::new("/run/plexus/plexus.sock"));
        assert_eq!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn config_socket_path_should_win_over_socket_dir() {
        let c = config(r#"{"cniVersion":"1.0.0","daemonSocketDir":"/run/multus/"}"#).unwrap();
        assert_eq!(c.socket, Path::new("/run/multus/plexus.sock"));
        let c = config(
            r#"{"cniVersion":"1.0.0","daemonSocketDir":"/x","socketPath":"/run/multus/multus.sock","connectTimeout":"2s","timeout":"1m"}"#,
        )
        .unwrap();
        assert_eq!(c.socket, Path::new("/run/multus/multus.sock"));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.timeout, Duration::from_secs(60));
    }

    #[test]
    fn config_errors_should_have_their_codes() {
        let cases = [
            ("", 6),
            ("  \n", 6),
            ("{", 6),
            ("[1]", 6),
            (r#"{"name":"x"}"#, 7),
            (r#"{"cniVersion":""}"#, 7),
            (r#"{"cniVersion":1}"#, 7),
            (r#"{"cniVersion":"0.2.0"}"#, 1),
            (r#"{"cniVersion":"9.9.9"}"#, 1),
        ];
        for (stdin, code) in cases {
            assert_eq!(config(stdin).unwrap_err().code, code, "{stdin:?}");
        }
    }

    #[test]
    fn every_bad_shim_key_should_be_reported_at_once() {
        let e = config(
            r#"{"cniVersion":"1.0.0","socketPath":5,"daemonSocketDir":"","connectTimeout":"soon","timeout":"0"}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 7);
        for key in ["socketPath", "daemonSocketDir", "connectTimeout", "timeout"] {
            assert!(e.msg.contains(key), "{key} missing in {}", e.msg);
        }
    }
}
