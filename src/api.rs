//! Wire types shared by the daemon and the shim: the multus thick-plugin
//! protocol (`POST /cni` with `{"env", "config"}`), the CNI commands, and
//! CNI error JSON with its codes. Only std, serde and base64: the shim links
//! it.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// Name of the socket inside the socket directory.
pub const SOCKET_NAME: &str = "plexus.sock";
/// Default socket directory.
pub const DEFAULT_SOCKET_DIR: &str = "/run/plexus";

pub const PATH_CNI: &str = "/cni";
pub const PATH_DELEGATE: &str = "/delegate";
pub const PATH_HEALTHZ: &str = "/healthz";
pub const PATH_READYZ: &str = "/readyz";
pub const PATH_METRICS: &str = "/metrics";
/// `GET /attachments/<containerID>`: what is recorded for one container.
pub const PATH_ATTACHMENTS: &str = "/attachments/";

/// Largest request body the daemon accepts.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// A CNI command (`CNI_COMMAND`, exact upper case as in skel): the one list
/// of command names for the shim, the server's metrics and the engine.
/// The shim answers VERSION itself; the daemon refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    /// Every command, in the order of the spec.
    pub const ALL: [Command; 6] = [
        Self::Add,
        Self::Del,
        Self::Check,
        Self::Gc,
        Self::Status,
        Self::Version,
    ];

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == text)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Gc => "GC",
            Self::Status => "STATUS",
            Self::Version => "VERSION",
        }
    }

    /// Whether the call names one attachment (container id and ifname).
    pub fn has_attachment(self) -> bool {
        matches!(self, Self::Add | Self::Del | Self::Check)
    }

    /// Oldest config version the command exists in (CNI spec; skel refuses
    /// older configs with code 1).
    pub fn min_version(self) -> Option<&'static str> {
        match self {
            Self::Check => Some("0.4.0"),
            Self::Gc | Self::Status => Some("1.1.0"),
            Self::Add | Self::Del | Self::Version => None,
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CNI error codes of the whole crate (CNI spec, "Error"; libcni for
/// 999): the daemon, the engine and the shim all report with these.
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables.
    pub const INVALID_ENVIRONMENT: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODING_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// Try again later: a transient condition (overload, shutdown, a
    /// plugin past its deadline).
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin is not available and cannot serve an ADD (the
    /// shim's answer when no daemon listens at its socket).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// Shim: the request was sent but no complete answer came back (reset,
    /// closed mid-response, timed out); whether it took effect is unknown.
    pub const NO_ANSWER: u32 = 101;
    /// Shim: the daemon's answer is not valid HTTP, or a 200 whose body is
    /// not what the command expects.
    pub const BAD_ANSWER: u32 = 102;
    /// Any other failure, and one reported without a code: libcni's
    /// `ErrInternal`, what skel prints for a plain error (and multus-shim
    /// for every error). Never 0, which a runtime reads as "unknown".
    pub const INTERNAL: u32 = 999;
}

/// The body of `POST /cni` and `POST /delegate`.
///
/// `config` holds the raw CNI config bytes; on the wire it is standard
/// base64 with padding, as Go marshals a `[]byte`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, with = "base64_bytes", skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<u8>,
    #[serde(
        default,
        rename = "interfaceAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    pub interface_attributes: Option<serde_json::Value>,
}

impl Request {
    /// The value of one CNI environment variable, if present.
    pub fn env_var(&self, key: &str) -> Option<&str> {
        self.env.get(key).map(String::as_str)
    }
}

/// The ADD success body: `{"Result": <CNI result>}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddResponse {
    #[serde(rename = "Result")]
    pub result: serde_json::Value,
}

/// A CNI error object, as plugins print it and as the daemon answers errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniError {
    #[serde(
        default,
        rename = "cniVersion",
        skip_serializing_if = "Option::is_none"
    )]
    pub cni_version: Option<String>,
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Self {
            cni_version: None,
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Serialises to compact JSON; never fails for this type.
    pub fn to_json(&self) -> String {
        // A struct of strings and integers always serialises.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code)?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

mod base64_bytes {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        // Go encodes a nil []byte as JSON null.
        let text: Option<String> = Option::deserialize(d)?;
        match text {
            None => Ok(Vec::new()),
            Some(t) => base64::engine::general_purpose::STANDARD
                .decode(t.as_bytes())
                .map_err(|e| serde::de::Error::custom(format!("config is not valid base64: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_roundtrip_should_encode_config_as_base64() {
        let mut req = Request::default();
        req.env.insert("CNI_COMMAND".into(), "ADD".into());
        req.config = br#"{"cniVersion":"1.0.0"}"#.to_vec();
        let json = serde_json::to_string(&req).unwrap();
        assert_eq!(
            json,
            r#"{"env":{"CNI_COMMAND":"ADD"},"config":"eyJjbmlWZXJzaW9uIjoiMS4wLjAifQ=="}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), req);
    }

    #[test]
    fn request_with_null_config_should_parse_as_empty() {
        let req: Request = serde_json::from_str(r#"{"env":{},"config":null}"#).unwrap();
        assert!(req.config.is_empty());
    }

    #[test]
    fn request_with_bad_base64_should_fail() {
        assert!(serde_json::from_str::<Request>(r#"{"config":"!!"}"#).is_err());
    }

    #[test]
    fn commands_should_parse_their_own_names_only() {
        for c in Command::ALL {
            assert_eq!(Command::parse(c.as_str()), Some(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        for bad in ["", "add", "Add", "ADD ", "DELETE"] {
            assert_eq!(Command::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cni_error_should_omit_empty_details() {
        assert_eq!(
            CniError::new(11, "try again later").to_json(),
            r#"{"code":11,"msg":"try again later"}"#
        );
    }
}
