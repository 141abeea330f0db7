//! CNI result conversion between spec versions.
//!
//! Results of the 0.3.0, 0.3.1 and 0.4.0 family and of the 1.0.0 / 1.1.0
//! family share one shape; they differ in `ips[].version` (0.x only) and in
//! the interface fields 1.1.0 added. [`Success`] is that shape as a typed
//! struct. Parsing is lenient like libcni: unknown keys are dropped, `null`
//! reads as absent, and an address's family is worked out from the address
//! rather than trusted from `version`.
//!
//! Output follows libcni's Go types, which print the two families
//! differently, so a converted result prints exactly as a Go plugin or the
//! multus shim prints it:
//! - 0.x: keys in struct order, `dns` always present (`{}` when empty);
//! - 1.x: libcni re-marshals the result through a map to leave out an empty
//!   `dns`, so every object's keys come out sorted and `dns` is absent when
//!   empty.
//!
//! Strings are escaped as Go's encoding/json escapes them (`<`, `>`, `&`,
//! U+2028 and U+2029 as `\u` sequences).
//!
//! This module depends on nothing else in the crate but the error codes of
//! `api` (the shim and the CNI engine both use it) and on nothing heavier
//! than serde.

use std::cmp::Ordering;
use std::fmt;
use std::io;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::ser::{Formatter, PrettyFormatter};
use serde_json::Value;

use crate::api::code;

/// Result versions this module reads and writes, oldest first.
pub const SUPPORTED: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest supported version (the one plexusd answers in).
pub const LATEST: &str = "1.1.0";

/// Why a result could not be read or converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Conversion from or to a version this module does not support.
    Unsupported { from: String, to: String },
    /// The result has no `cniVersion` and no fallback was given.
    NoVersion,
    /// The document is not a valid result.
    Invalid { version: String, reason: String },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The CNI error code that fits: 1 (incompatible version) or 6
    /// (decoding failure).
    pub fn code(&self) -> u32 {
        match self {
            Error::Unsupported { .. } => code::INCOMPATIBLE_VERSION,
            Error::NoVersion | Error::Invalid { .. } => code::DECODING_FAILURE,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unsupported { from, to } => write!(
                f,
                "cannot convert a CNI result from version {from:?} to {to:?}: supported versions are {}",
                SUPPORTED.join(", ")
            ),
            Error::NoVersion => f.write_str("the CNI result has no cniVersion"),
            Error::Invalid { version, reason } => {
                write!(f, "invalid CNI result (version {version:?}): {reason}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// Whether `version` is one of [`SUPPORTED`].
pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}

/// Compares two `major.minor.patch` version strings numerically; `None`
/// when either is malformed.
pub fn compare(a: &str, b: &str) -> Option<Ordering> {
    Some(parse_version(a)?.cmp(&parse_version(b)?))
}

fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            p.parse::<u32>().ok()
        }
    });
    let triple = (parts.next()??, parts.next()??, parts.next()??);
    match parts.next() {
        None => Some(triple),
        Some(_) => None,
    }
}

/// Whether `version` uses the 0.3.x / 0.4.0 shape (`ips[].version` present).
fn is_pre_1_0(version: &str) -> bool {
    matches!(version, "0.3.0" | "0.3.1" | "0.4.0")
}

/// Converts a result (with its own `cniVersion`) to version `to`.
///
/// The returned `Value` has the right content and, like every `Value`,
/// sorted keys: the 1.x print order, not the 0.x one. Use
/// [`Success::to_pretty`] when the printed form matters.
pub fn convert(result: &Value, to: &str) -> Result<Value> {
    Ok(Success::from_value(result)?.convert(to)?.to_value())
}

/// A CNI success result of the 0.3.0 ... 1.1.0 versions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Success {
    #[serde(rename = "cniVersion", default, deserialize_with = "nullable")]
    pub cni_version: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub interfaces: Vec<Interface>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ips: Vec<Ip>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub routes: Vec<Route>,
    /// Printed as `{}` when empty at 0.x; left out when empty at 1.x (see
    /// [`Success::to_value`]), as libcni's Go types do.
    #[serde(default, deserialize_with = "nullable")]
    pub dns: Dns,
}

/// An interface (`interfaces[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub mac: String,
    /// 1.1.0 and later.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "is_zero"
    )]
    pub mtu: i64,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub sandbox: String,
    /// 1.1.0 and later.
    #[serde(
        rename = "socketPath",
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub socket_path: String,
    /// 1.1.0 and later.
    #[serde(
        rename = "pciID",
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub pci_id: String,
}

/// An address (`ips[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ip {
    /// `"4"` or `"6"`; only in the 0.3.x / 0.4.0 shape.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub version: String,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<i64>,
    /// CIDR notation, e.g. `10.1.0.5/24`.
    pub address: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub gateway: String,
}

/// A route (`routes[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub gw: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "is_zero"
    )]
    pub mtu: i64,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "is_zero"
    )]
    pub advmss: i64,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "is_zero"
    )]
    pub priority: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<i64>,
}

/// DNS settings (`dns`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub nameservers: Vec<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub domain: String,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub search: Vec<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub options: Vec<String>,
}

impl Success {
    /// Reads a result that names its own `cniVersion`.
    pub fn from_value(value: &Value) -> Result<Self> {
        let parsed = Self::parse(value)?;
        if parsed.cni_version.is_empty() {
            return Err(Error::NoVersion);
        }
        Ok(parsed)
    }

    /// Reads a result; a missing or empty `cniVersion` is taken to be
    /// `version` (libcni's rule for plugins that leave it out).
    pub fn from_value_or(value: &Value, version: &str) -> Result<Self> {
        let mut parsed = Self::parse(value)?;
        if parsed.cni_version.is_empty() {
            parsed.cni_version = version.to_string();
        }
        Ok(parsed)
    }

    fn parse(value: &Value) -> Result<Self> {
        let version = || match value.get("cniVersion") {
            Some(Value::String(s)) => s.clone(),
            _ => String::new(),
        };
        if !value.is_object() {
            return Err(Error::Invalid {
                version: version(),
                reason: "not a JSON object".into(),
            });
        }
        Success::deserialize(value).map_err(|e| Error::Invalid {
            version: version(),
            reason: e.to_string(),
        })
    }

    /// Converts to version `to`: both this result's version and `to` must
    /// be [`SUPPORTED`].
    ///
    /// Going to 0.3.x / 0.4.0 sets `ips[].version` from each address's
    /// family and drops the 1.1.0 interface fields (`mtu`, `socketPath`,
    /// `pciID`); going to 1.x drops `ips[].version`. Routes keep every field,
    /// as libcni's shared route type does.
    pub fn convert(mut self, to: &str) -> Result<Self> {
        if !is_supported(&self.cni_version) || !is_supported(to) {
            return Err(Error::Unsupported {
                from: self.cni_version,
                to: to.to_string(),
            });
        }
        if is_pre_1_0(to) {
            for ip in &mut self.ips {
                ip.version = match family(&ip.address) {
                    Some(v) => v.to_string(),
                    None if ip.version == "4" || ip.version == "6" => ip.version.clone(),
                    None => {
                        return Err(Error::Invalid {
                            version: self.cni_version,
                            reason: format!("cannot tell the family of address {:?}", ip.address),
                        })
                    }
                };
            }
            for iface in &mut self.interfaces {
                iface.mtu = 0;
                iface.socket_path.clear();
                iface.pci_id.clear();
            }
        } else {
            for ip in &mut self.ips {
                ip.version.clear();
            }
        }
        self.cni_version = to.to_string();
        Ok(self)
    }

    /// The result as a JSON value, with libcni's content for its version:
    /// at 1.x an empty `dns` is left out (libcni's `Result.MarshalJSON`),
    /// at 0.x it is `{}`.
    pub fn to_value(&self) -> Value {
        // Strings, integers and vectors of them always serialise.
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if !is_pre_1_0(&self.cni_version) && self.dns == Dns::default() {
            if let Value::Object(map) = &mut value {
                map.remove("dns");
            }
        }
        value
    }

    /// The result as Go plugins and the multus shim print it at its
    /// version: 4-space indentation, no trailing newline; keys in struct
    /// order at 0.x, sorted at 1.x (see the module docs).
    pub fn to_pretty(&self) -> Vec<u8> {
        if is_pre_1_0(&self.cni_version) {
            to_pretty(self)
        } else {
            // A Value's map is ordered by key: the order Go's map encoding
            // gives.
            to_pretty(&self.to_value())
        }
    }
}

/// Serialises `value` with 4-space indentation and no trailing newline, as
/// Go's `json.MarshalIndent(v, "", "    ")` does, Go's string escapes
/// included.
pub fn to_pretty<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    let fmt = GoFormatter(PrettyFormatter::with_indent(b"    "));
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    // Writing into a Vec cannot fail and these types always serialise;
    // on the impossible error the output is whatever was written.
    let _ = value.serialize(&mut ser);
    out
}

/// serde_json's pretty printer plus the escapes Go's encoding/json adds to
/// serde_json's: `<`, `>` and `&` (HTML safety) and U+2028, U+2029
/// (JavaScript line terminators). Control characters, quotes and
/// backslashes are escaped the same way by both already.
struct GoFormatter<'a>(PrettyFormatter<'a>);

impl Formatter for GoFormatter<'_> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escaped = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(escaped.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_array(writer)
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array(writer)
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(writer, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_array_value(writer)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object(writer)
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object(writer)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(writer, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.begin_object_value(writer)
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.0.end_object_value(writer)
    }
}

/// `"4"` or `"6"` for an address in CIDR (or plain) notation.
fn family(address: &str) -> Option<&'static str> {
    let ip = address.split_once('/').map_or(address, |(ip, _)| ip);
    match ip.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(_) => Some("4"),
        std::net::IpAddr::V6(_) => Some("6"),
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Reads `null` as the type's default, as Go's decoder does.
fn nullable<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
#[path = "result_tests.rs"]
mod tests;
