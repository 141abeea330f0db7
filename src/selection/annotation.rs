//! The pod annotations that select networks, parsed the way multus
//! parses them: `k8s.v1.cni.cncf.io/networks` (additional networks) and
//! `v1.multus-cni.io/default-network` (a replacement for the cluster
//! network), each in its comma and its JSON form, with every key of a
//! selection element (ips, mac, infiniband-guid, portMappings, bandwidth,
//! cni-args, default-route, deviceID) checked.
//!
//! Everything here is a pure function of strings and JSON values. The
//! static `PLEXUS_NETWORKS` source ([`super::parse_networks`]) and these
//! annotations meet in [`Selection`]: [`Selection::from_element`] lifts a
//! static element, [`Selection::element`] gives what [`super::select`]
//! orders and names, so both sources take one path. What a selected
//! network then hands its plugins is built in [`super::runtime_config`].
//!
//! Where Plexus differs from multus on purpose, the item's documentation
//! says so and why; the differences only ever turn an input multus accepts
//! and later fails on (or panics on) into an earlier, clearer error.

use std::fmt;
use std::net::IpAddr;

use serde_json::{Map, Value};

use super::{Element, MAX_NETWORKS};
use crate::names::check_ifname;

/// The pod annotation listing additional networks.
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

/// The pod annotation replacing the cluster network.
pub const DEFAULT_NETWORK_ANNOTATION: &str = "v1.multus-cni.io/default-network";

/// Longest annotation value read, in bytes. Kubernetes caps all of an
/// object's annotations together at 256 KiB, so a longer value cannot come
/// from the API server; the bound keeps a hostile caller from making the
/// parser do unbounded work.
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// Longest Kubernetes object name (DNS-1123 subdomain).
const MAX_OBJECT_NAME: usize = 253;

/// Longest namespace name (DNS-1123 label).
const MAX_NAMESPACE: usize = 63;

/// One `portMappings` entry of a selection element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: i64,
    pub container_port: i64,
    pub protocol: Option<String>,
    pub host_ip: Option<String>,
}

impl PortMapping {
    /// The capability argument form: empty `protocol`/`hostIP` left out,
    /// as multus serialises it.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("hostPort".into(), self.host_port.into());
        m.insert("containerPort".into(), self.container_port.into());
        if let Some(p) = self.protocol.as_deref().filter(|p| !p.is_empty()) {
            m.insert("protocol".into(), p.into());
        }
        if let Some(ip) = self.host_ip.as_deref().filter(|p| !p.is_empty()) {
            m.insert("hostIP".into(), ip.into());
        }
        Value::Object(m)
    }
}

/// The `bandwidth` of a selection element (absent rates are 0, as in
/// multus).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bandwidth {
    pub ingress_rate: i64,
    pub ingress_burst: i64,
    pub egress_rate: i64,
    pub egress_burst: i64,
}

impl Bandwidth {
    /// The capability argument form.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("ingressRate".into(), self.ingress_rate.into());
        m.insert("ingressBurst".into(), self.ingress_burst.into());
        m.insert("egressRate".into(), self.egress_rate.into());
        m.insert("egressBurst".into(), self.egress_burst.into());
        Value::Object(m)
    }
}

/// One selected network with every key of a multus selection element,
/// validated, the namespace filled in.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selection {
    /// The NetworkAttachmentDefinition's name.
    pub name: String,
    /// Its namespace; the pod's (or multusNamespace) when not given.
    pub namespace: String,
    /// `interface`, or the legacy `interfaceRequest` when `interface` is
    /// empty.
    pub interface: Option<String>,
    /// `ips`: addresses or CIDRs, as written.
    pub ips: Vec<String>,
    /// `mac`, as written (valid per Go's `net.ParseMAC`).
    pub mac: Option<String>,
    /// `infiniband-guid`, as written (valid per Go's `net.ParseMAC`).
    pub infiniband_guid: Option<String>,
    /// `portMappings`; `None` when absent (then the runtime's are kept,
    /// see [`super::runtime_config::RuntimeInherit`]).
    pub port_mappings: Option<Vec<PortMapping>>,
    pub bandwidth: Option<Bandwidth>,
    /// `cni-args`, merged into the delegate config's `args.cni`.
    pub cni_args: Option<Map<String, Value>>,
    /// `default-route`: `Some(vec![])` is meaningful (the key was given).
    pub default_route: Option<Vec<IpAddr>>,
    /// `deviceID`.
    pub device_id: Option<String>,
}

impl Selection {
    /// Lifts an element of the static `PLEXUS_NETWORKS` source; an
    /// unqualified name gets `default_namespace`.
    pub fn from_element(e: &Element, default_namespace: &str) -> Self {
        Self {
            name: e.name.clone(),
            namespace: e
                .namespace
                .clone()
                .unwrap_or_else(|| default_namespace.to_string()),
            interface: e.interface.clone(),
            ..Self::default()
        }
    }

    /// What [`super::select`] orders and names. The network it selects
    /// for `selections[i]` has origin [`super::Origin::Requested`]`(i)`.
    pub fn element(&self) -> Element {
        Element {
            namespace: Some(self.namespace.clone()),
            name: self.name.clone(),
            interface: self.interface.clone(),
        }
    }

    /// `<namespace>/<name>`: the name multus shows in network-status,
    /// events and device-info file names.
    pub fn display_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The comma form: `namespace/name@ifname`.
impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if let Some(i) = &self.interface {
            write!(f, "@{i}")?;
        }
        Ok(())
    }
}

/// What is wrong with an annotation. Items (comma form) and elements
/// (JSON form) are counted from 0, as in `plugins[0]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("the value is {len} bytes long; at most {MAX_ANNOTATION_BYTES} are read")]
    TooLong { len: usize },
    #[error("{count} networks listed; at most {MAX_NETWORKS} are allowed per container")]
    TooMany { count: usize },
    #[error("failed to parse the JSON format: {why}")]
    Json { why: String },
    #[error("the JSON format must be a list of selection objects, found {found}")]
    NotAList { found: &'static str },
    #[error("item {index} ({}): {why}", shown(.item))]
    Item {
        index: usize,
        item: String,
        why: String,
    },
    #[error("element {index}{}: {}{why}", name_note(.name), key_note(.key))]
    Element {
        index: usize,
        name: Option<String>,
        key: Option<String>,
        why: String,
    },
    #[error("the value names no network")]
    Empty,
    #[error("more than one default network is specified ({count})")]
    MoreThanOne { count: usize },
}

/// Longest part of the caller's text an error message repeats.
const SHOWN_CHARS: usize = 80;

/// `s` quoted for an error message, cut after [`SHOWN_CHARS`] characters
/// so a hostile value cannot make the message huge.
fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        None => format!("{s:?}"),
        Some((at, _)) => format!("{:?}... ({} bytes)", &s[..at], s.len()),
    }
}

fn name_note(name: &Option<String>) -> String {
    match name {
        Some(n) => format!(" ({})", shown(n)),
        None => String::new(),
    }
}

fn key_note(key: &Option<String>) -> String {
    match key {
        Some(k) => format!("key {}: ", shown(k)),
        None => String::new(),
    }
}

/// An annotation that cannot be used; the ADD fails with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod annotation {annotation}: {problem}")]
pub struct Error {
    pub annotation: &'static str,
    pub problem: Problem,
}

/// Parses `k8s.v1.cni.cncf.io/networks` (multus `parsePodNetworkAnnotation`).
///
/// `None` or an empty value selects nothing. A value holding `[`, `{` or
/// `"` is the JSON form, a list of selection objects; anything else is the
/// comma form `[namespace/]name[@ifname]`. Elements without a namespace get
/// `pod_namespace`.
///
/// Differences from multus, all turning a later failure into an earlier,
/// clearer one:
/// - an empty item (`a,,b`, a trailing comma) is refused; multus asks for a
///   network named "" and fails the lookup;
/// - a `null` element of the JSON list is refused (multus dereferences it
///   and panics);
/// - JSON-form names and namespaces must be valid Kubernetes names
///   (DNS-1123 subdomain / label), which no lookup could match otherwise;
/// - interface names are checked in both forms with the kernel's rules
///   ([`check_ifname`]: also `:`, `.`/`..` and control characters), where
///   multus checks the comma form's length, whitespace and `/` only and
///   lets the kernel refuse the rest;
/// - `default-route` entries must be non-empty strings (Go reads `""` as a
///   nil address and counts it as an IPv6 gateway);
/// - the value and the element count are bounded ([`MAX_ANNOTATION_BYTES`],
///   [`MAX_NETWORKS`]).
///
/// JSON keys match as Go's `encoding/json` does: exactly, else ignoring
/// ASCII case; unknown keys (`ipam-claim-reference` among them) are
/// ignored.
pub fn parse_networks_annotation(
    value: Option<&str>,
    pod_namespace: &str,
) -> Result<Vec<Selection>, Error> {
    let err = |problem| Error {
        annotation: NETWORKS_ANNOTATION,
        problem,
    };
    match value {
        None | Some("") => Ok(Vec::new()),
        Some(v) => parse_value(v, pod_namespace).map_err(err),
    }
}

/// Parses `v1.multus-cni.io/default-network` (multus
/// `tryLoadK8sPodDefaultNetwork`): the same two forms, unqualified names in
/// `multus_namespace`, at most one network. `None` means no override.
///
/// A present but empty value (or `[]`) is an error, as in multus (which
/// panics on `[]`). The element's `interface`, when given, is kept: multus
/// then names the cluster interface with it instead of the runtime's
/// `CNI_IFNAME`, and DEL must recompute the same name.
pub fn parse_default_network_annotation(
    value: Option<&str>,
    multus_namespace: &str,
) -> Result<Option<Selection>, Error> {
    let err = |problem| Error {
        annotation: DEFAULT_NETWORK_ANNOTATION,
        problem,
    };
    let Some(v) = value else {
        return Ok(None);
    };
    if v.trim().is_empty() {
        return Err(err(Problem::Empty));
    }
    let mut list = parse_value(v, multus_namespace).map_err(err)?;
    match list.len() {
        0 => Err(err(Problem::Empty)),
        1 => Ok(list.pop()),
        count => Err(err(Problem::MoreThanOne { count })),
    }
}

fn parse_value(value: &str, default_namespace: &str) -> Result<Vec<Selection>, Problem> {
    if value.len() > MAX_ANNOTATION_BYTES {
        return Err(Problem::TooLong { len: value.len() });
    }
    if value.contains(['[', '{', '"']) {
        parse_json(value, default_namespace)
    } else {
        parse_comma(value, default_namespace)
    }
}

/// DNS-1123 label pattern `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$` (no length
/// limit, as in multus's comma form).
fn is_dns_label_pattern(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => edge(f) && edge(l) && b.iter().all(|&c| edge(c) || c == b'-'),
        _ => false,
    }
}

/// DNS-1123 subdomain: dot-separated labels, at most 253 bytes.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_OBJECT_NAME && s.split('.').all(is_dns_label_pattern)
}

fn parse_comma(value: &str, default_namespace: &str) -> Result<Vec<Selection>, Problem> {
    // Counting commas first keeps a huge list from being parsed.
    let count = value.matches(',').count() + 1;
    if count > MAX_NETWORKS {
        return Err(Problem::TooMany { count });
    }
    let mut out = Vec::with_capacity(count);
    for (index, raw) in value.split(',').enumerate() {
        let item = raw.trim();
        let bad = |why: String| Problem::Item {
            index,
            item: item.to_string(),
            why,
        };
        let (namespace, rest) = match item.splitn(3, '/').collect::<Vec<_>>()[..] {
            [rest] => ("", rest),
            [ns, rest] => (ns.trim(), rest),
            _ => return Err(bad("invalid network object (more than one '/')".into())),
        };
        let (name, ifname) = match rest.splitn(3, '@').collect::<Vec<_>>()[..] {
            [n] => (n.trim(), ""),
            [n, i] => (n.trim(), i.trim()),
            _ => return Err(bad("invalid network object (more than one '@')".into())),
        };
        if name.is_empty() {
            return Err(bad("no network name".into()));
        }
        for part in [namespace, name] {
            if !part.is_empty() && (!is_dns_label_pattern(part) || part.len() > MAX_OBJECT_NAME) {
                return Err(bad(format!(
                    "{} must consist of lower case alphanumeric characters or '-' and start and end with an alphanumeric character",
                    shown(part)
                )));
            }
        }
        if namespace.len() > MAX_NAMESPACE {
            return Err(bad(format!(
                "namespace {} is longer than {MAX_NAMESPACE} characters",
                shown(namespace)
            )));
        }
        let interface = if ifname.is_empty() {
            None
        } else {
            check_ifname(ifname)
                .map_err(|e| bad(format!("interface name {}: {e}", shown(ifname))))?;
            Some(ifname.to_string())
        };
        out.push(Selection {
            name: name.to_string(),
            namespace: if namespace.is_empty() {
                default_namespace.to_string()
            } else {
                namespace.to_string()
            },
            interface,
            ..Selection::default()
        });
    }
    Ok(out)
}

fn parse_json(value: &str, default_namespace: &str) -> Result<Vec<Selection>, Problem> {
    // serde_json limits nesting (128 levels), so hostile input cannot
    // exhaust the stack; the length was bounded by the caller.
    let doc: Value =
        serde_json::from_str(value).map_err(|e| Problem::Json { why: e.to_string() })?;
    let items = match doc {
        Value::Array(items) => items,
        other => {
            return Err(Problem::NotAList {
                found: crate::json::kind(&other),
            })
        }
    };
    if items.len() > MAX_NETWORKS {
        return Err(Problem::TooMany { count: items.len() });
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| parse_element(index, item, default_namespace))
        .collect()
}

/// The keys of a selection element, as multus spells them.
const KEYS: &[&str] = &[
    "name",
    "namespace",
    "ips",
    "mac",
    "infiniband-guid",
    "interface",
    "interfaceRequest",
    "portMappings",
    "bandwidth",
    "deviceID",
    "cni-args",
    "default-route",
];

/// Finds the element key `key` names the way Go's `encoding/json` does.
fn canonical_key(key: &str) -> Option<&'static str> {
    KEYS.iter()
        .find(|k| **k == key)
        .or_else(|| KEYS.iter().find(|k| k.eq_ignore_ascii_case(key)))
        .copied()
}

fn parse_element(
    index: usize,
    item: &Value,
    default_namespace: &str,
) -> Result<Selection, Problem> {
    let Value::Object(obj) = item else {
        return Err(Problem::Element {
            index,
            name: None,
            key: None,
            why: format!("must be an object, found {}", crate::json::kind(item)),
        });
    };
    let name_hint = obj
        .iter()
        .find(|(k, _)| canonical_key(k) == Some("name"))
        .and_then(|(_, v)| v.as_str())
        .map(str::to_string);
    let bad = |key: &str, why: String| Problem::Element {
        index,
        name: name_hint.clone(),
        key: Some(key.to_string()),
        why,
    };
    let mut s = Selection::default();
    let mut interface_request = None;
    for (key, v) in obj {
        let Some(canon) = canonical_key(key) else {
            continue;
        };
        let value = KeyValue {
            key,
            value: v,
            bad: &bad,
        };
        match canon {
            "interfaceRequest" => interface_request = value.non_empty_string()?,
            _ => set_field(&mut s, canon, value)?,
        }
    }
    if s.interface.is_none() {
        s.interface = interface_request;
    }
    finish(index, s, default_namespace)
}

/// One key of a selection element as written, its value, and how an error
/// about it is reported.
#[derive(Clone, Copy)]
struct KeyValue<'a> {
    key: &'a str,
    value: &'a Value,
    bad: &'a dyn Fn(&str, String) -> Problem,
}

impl KeyValue<'_> {
    /// The error for a bad value of this key.
    fn bad(&self, why: String) -> Problem {
        (self.bad)(self.key, why)
    }

    /// A string; null is empty.
    fn string(&self) -> Result<String, Problem> {
        match self.value {
            Value::Null => Ok(String::new()),
            Value::String(s) => Ok(s.clone()),
            other => Err(self.bad(format!(
                "must be a string, found {}",
                crate::json::kind(other)
            ))),
        }
    }

    /// A string; null and empty are `None`.
    fn non_empty_string(&self) -> Result<Option<String>, Problem> {
        Ok(Some(self.string()?).filter(|s| !s.is_empty()))
    }

    /// An object; `None` for null.
    fn object(&self) -> Result<Option<&Map<String, Value>>, Problem> {
        match self.value {
            Value::Null => Ok(None),
            Value::Object(m) => Ok(Some(m)),
            other => Err(self.bad(format!(
                "must be an object, found {}",
                crate::json::kind(other)
            ))),
        }
    }

    /// A list of IP addresses (`default-route`).
    fn addresses(&self) -> Result<Vec<IpAddr>, Problem> {
        string_list(self.value)
            .map_err(|why| self.bad(why))?
            .iter()
            .map(|gw| {
                gw.parse::<IpAddr>()
                    .map_err(|_| self.bad(format!("invalid IP address {}", shown(gw))))
            })
            .collect()
    }

    /// A list of port mappings; `None` for null. A bad mapping is reported
    /// under `<key>[<i>]`.
    fn port_mappings(&self) -> Result<Option<Vec<PortMapping>>, Problem> {
        let items = match self.value {
            Value::Null => return Ok(None),
            Value::Array(items) => items,
            other => {
                return Err(self.bad(format!(
                    "must be a list, found {}",
                    crate::json::kind(other)
                )))
            }
        };
        items
            .iter()
            .enumerate()
            .map(|(i, p)| {
                parse_port_mapping(p).map_err(|why| (self.bad)(&format!("{}[{i}]", self.key), why))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

/// Sets the field of `s` that the element key multus spells `canon` names;
/// a null leaves an object or list field as it was.
fn set_field(s: &mut Selection, canon: &str, value: KeyValue<'_>) -> Result<(), Problem> {
    match canon {
        "name" => s.name = value.string()?,
        "namespace" => s.namespace = value.string()?,
        "interface" => s.interface = value.non_empty_string()?,
        "mac" => s.mac = value.non_empty_string()?,
        "infiniband-guid" => s.infiniband_guid = value.non_empty_string()?,
        "deviceID" => s.device_id = value.non_empty_string()?,
        "ips" => s.ips = string_list(value.value).map_err(|why| value.bad(why))?,
        "default-route" if !value.value.is_null() => s.default_route = Some(value.addresses()?),
        "cni-args" => {
            if let Some(m) = value.object()? {
                s.cni_args = Some(m.clone());
            }
        }
        "bandwidth" => {
            if let Some(m) = value.object()? {
                s.bandwidth = Some(parse_bandwidth(m).map_err(|why| value.bad(why))?);
            }
        }
        "portMappings" => {
            if let Some(mappings) = value.port_mappings()? {
                s.port_mappings = Some(mappings);
            }
        }
        _ => {}
    }
    Ok(())
}

/// The checks multus runs after parsing either form, and Plexus's name
/// checks for the JSON form.
fn finish(index: usize, mut s: Selection, default_namespace: &str) -> Result<Selection, Problem> {
    let bad = |s: &Selection, key: &str, why: String| Problem::Element {
        index,
        name: Some(s.name.clone()).filter(|n| !n.is_empty()),
        key: Some(key.to_string()),
        why,
    };
    if s.name.is_empty() {
        return Err(bad(
            &s,
            "name",
            "missing: the NetworkAttachmentDefinition's name is required".into(),
        ));
    }
    if !is_dns_subdomain(&s.name) {
        return Err(bad(
            &s,
            "name",
            format!(
                "{} is not a valid Kubernetes object name (lower case alphanumerics, '-' and '.')",
                shown(&s.name)
            ),
        ));
    }
    if s.namespace.is_empty() {
        s.namespace = default_namespace.to_string();
    } else if !is_dns_label_pattern(&s.namespace) || s.namespace.len() > MAX_NAMESPACE {
        return Err(bad(
            &s,
            "namespace",
            format!("{} is not a valid namespace name", shown(&s.namespace)),
        ));
    }
    if let Some(mac) = &s.mac {
        if parse_hardware_addr(mac).is_none() {
            return Err(bad(
                &s,
                "mac",
                format!(
                    "failed to parse MAC address {}: invalid MAC address",
                    shown(mac)
                ),
            ));
        }
    }
    if let Some(guid) = &s.infiniband_guid {
        if parse_hardware_addr(guid).is_none() {
            return Err(bad(
                &s,
                "infiniband-guid",
                format!(
                    "failed to validate infiniband GUID {}: invalid MAC address",
                    shown(guid)
                ),
            ));
        }
    }
    for ip in &s.ips {
        if ip.contains('/') {
            if !is_cidr(ip) {
                return Err(bad(
                    &s,
                    "ips",
                    format!("failed to parse CIDR {}", shown(ip)),
                ));
            }
        } else if ip.parse::<IpAddr>().is_err() {
            return Err(bad(
                &s,
                "ips",
                format!("failed to parse IP address {}", shown(ip)),
            ));
        }
    }
    if let Some(i) = &s.interface {
        if let Err(e) = check_ifname(i) {
            return Err(bad(
                &s,
                "interface",
                format!("interface name {}: {e}", shown(i)),
            ));
        }
    }
    Ok(s)
}

fn string_list(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(format!(
                    "entry {i} must be a string, found {}",
                    crate::json::kind(other)
                )),
            })
            .collect(),
        other => Err(format!(
            "must be a list of strings, found {}",
            crate::json::kind(other)
        )),
    }
}

/// A JSON number that fits Go's `int` (64-bit): integers only, as
/// `encoding/json` reads them (`1.0` and `1e3` are refused).
fn int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Null => Ok(0),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| format!("{n} is not an integer that fits 64 bits")),
        other => Err(format!(
            "must be an integer, found {}",
            crate::json::kind(other)
        )),
    }
}

fn field<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).or_else(|| {
        m.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

fn parse_bandwidth(m: &Map<String, Value>) -> Result<Bandwidth, String> {
    let get = |key: &str| -> Result<i64, String> {
        field(m, key).map_or(Ok(0), |v| int(v).map_err(|e| format!("{key}: {e}")))
    };
    Ok(Bandwidth {
        ingress_rate: get("ingressRate")?,
        ingress_burst: get("ingressBurst")?,
        egress_rate: get("egressRate")?,
        egress_burst: get("egressBurst")?,
    })
}

fn parse_port_mapping(v: &Value) -> Result<PortMapping, String> {
    let Value::Object(m) = v else {
        return Err(format!("must be an object, found {}", crate::json::kind(v)));
    };
    let int_key = |key: &str| -> Result<i64, String> {
        field(m, key).map_or(Ok(0), |v| int(v).map_err(|e| format!("{key}: {e}")))
    };
    let str_key = |key: &str| -> Result<Option<String>, String> {
        match field(m, key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
            Some(other) => Err(format!(
                "{key}: must be a string, found {}",
                crate::json::kind(other)
            )),
        }
    };
    Ok(PortMapping {
        host_port: int_key("hostPort")?,
        container_port: int_key("containerPort")?,
        protocol: str_key("protocol")?,
        host_ip: str_key("hostIP")?,
    })
}

/// `ip/prefix` as Go's `net.ParseCIDR` reads it.
fn is_cidr(s: &str) -> bool {
    let Some((ip, prefix)) = s.split_once('/') else {
        return false;
    };
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return false;
    };
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let max = if ip.is_ipv4() { 32 } else { 128 };
    prefix.parse::<u32>().is_ok_and(|p| p <= max)
}

/// A hardware address as Go's `net.ParseMAC` reads it: 6, 8 or 20 bytes,
/// written as hex pairs separated by `:` or `-`, or as hex quads separated
/// by `.`. Returns the bytes.
pub fn parse_hardware_addr(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() < 14 {
        return None;
    }
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::new();
    if b[2] == b':' || b[2] == b'-' {
        if (b.len() + 1) % 3 != 0 {
            return None;
        }
        let n = (b.len() + 1) / 3;
        if !matches!(n, 6 | 8 | 20) {
            return None;
        }
        for i in 0..n {
            let at = 3 * i;
            if i > 0 && b[at - 1] != b[2] {
                return None;
            }
            out.push(hex(b[at])? << 4 | hex(b[at + 1])?);
        }
    } else if b[4] == b'.' {
        if (b.len() + 1) % 5 != 0 {
            return None;
        }
        let n = 2 * (b.len() + 1) / 5;
        if !matches!(n, 6 | 8 | 20) {
            return None;
        }
        for i in 0..n / 2 {
            let at = 5 * i;
            if i > 0 && b[at - 1] != b'.' {
                return None;
            }
            out.push(hex(b[at])? << 4 | hex(b[at + 1])?);
            out.push(hex(b[at + 2])? << 4 | hex(b[at + 3])?);
        }
    } else {
        return None;
    }
    Some(out)
}

#[cfg(test)]
#[path = "annotation_tests.rs"]
mod tests;
