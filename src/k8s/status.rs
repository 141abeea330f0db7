//! The pod's `k8s.v1.cni.cncf.io/network-status` annotation, byte for byte
//! as multus writes it.
//!
//! - [`entries`] turns one delegate's CNI result into its entries (the NAD
//!   client's `CreateNetworkStatuses`): one entry for a result with exactly
//!   one interface, else one entry per sandbox interface.
//! - [`annotation`] joins the entries of all delegates, in delegate order,
//!   into the annotation's value: each entry as 4-space indented JSON with
//!   Go's string escapes, joined with `,`, wrapped in `[` `]`.
//! - [`DeviceInfo::parse`] reads a CNI device-info file as Go's decoder
//!   reads it into the NAD client's `DeviceInfo` (unknown keys dropped,
//!   keys matched case-insensitively, a malformed file is no device info).
//! - [`pod_missing_result`] is the placeholder ADD result for a pod that no
//!   longer exists.
//!
//! Addresses are printed as Go's `net.IP.String` prints them: without the
//! prefix length, and an IPv4-mapped IPv6 address as plain IPv4.
//!
//! Deliberate leniency: multus (libcni) would have refused a result with an
//! unparsable address before it got here; these functions never fail and
//! print such an address as its text up to the `/`.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::device_info::DeviceInfo;
use crate::result::{self, Dns, Success};

/// What Go prints for a default route that has no `gw` (`net.IP(nil)`):
/// multus puts it in `gateway` as it is (escaped `\u003cnil\u003e`).
pub const NO_GATEWAY: &str = "<nil>";

/// One entry of the annotation (the NAD client's `NetworkStatus`), keys in
/// its order; empty fields are left out except `name` and `dns`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStatus {
    /// The delegate's display name: `<ns>/<nad>`, or the CNI network name of
    /// a file-based network.
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface: String,
    /// Bare addresses, without prefix length.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: i64,
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,
    /// Always printed, `{}` when empty.
    #[serde(default)]
    pub dns: Dns,
    #[serde(
        rename = "device-info",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub device_info: Option<DeviceInfo>,
    /// Gateways of the result's default routes (see [`entries`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway: Vec<String>,
}

/// The entries one delegate contributes, in the order multus appends them.
/// `result` is the delegate's result as its plugin returned it (multus'
/// default-route handling changes the pod's routes, not this result);
/// `primary`: the delegate is the cluster network.
///
/// - Exactly one interface: one entry. `interface`, `mac` and `mtu` come
///   from the interface only if it has a `sandbox`; `ips` holds every
///   address of the result; `default` is `primary`.
/// - Otherwise: one entry per interface with a `sandbox`, none at all
///   without one. An address goes to the entry of the interface its
///   `interface` index names (dropped if that is no sandbox interface); an
///   address without index goes to the last entry. For the primary,
///   `default` marks the interface named by the first address having both
///   an index and a `gateway`; when no address has both, the first entry.
///   (An index naming no sandbox interface marks none, as in multus.)
///
/// An interface's `mtu` counts only in a result of version 1.0.0 or later
/// (libcni's 0.x types have none). Every entry gets the result's DNS, `device_info` and the same
/// `gateway` list: the `gw` of each route whose destination address is
/// `0.0.0.0` or `::` (any prefix length) or empty, [`NO_GATEWAY`] for such
/// a route without `gw`.
pub fn entries(
    name: &str,
    result: &Success,
    primary: bool,
    device_info: Option<&DeviceInfo>,
) -> Vec<NetworkStatus> {
    let gateway: Vec<String> = result
        .routes
        .iter()
        .filter(|r| is_default_route(&r.dst))
        .map(|r| match r.gw.as_str() {
            "" => NO_GATEWAY.to_string(),
            gw => go_ip(gw),
        })
        .collect();
    let template = NetworkStatus {
        name: name.to_string(),
        dns: result.dns.clone(),
        device_info: device_info.cloned(),
        gateway,
        ..NetworkStatus::default()
    };

    // libcni's 0.x result types have no interface mtu: it never survives.
    let pre_1_0 = result::compare(&result.cni_version, "1.0.0") == Some(std::cmp::Ordering::Less);
    let mtu = |iface: &result::Interface| if pre_1_0 { 0 } else { iface.mtu };

    if let [iface] = result.interfaces.as_slice() {
        let mut entry = template;
        if !iface.sandbox.is_empty() {
            entry.interface = iface.name.clone();
            entry.mac = iface.mac.clone();
            entry.mtu = mtu(iface);
        }
        entry.ips = result.ips.iter().map(|ip| go_ip(&ip.address)).collect();
        entry.default = primary;
        return vec![entry];
    }

    // Go marks "no gateway interface" with -1, so an index of -1 means the
    // same as none.
    let gateway_index = result
        .ips
        .iter()
        .find_map(|ip| ip.interface.filter(|_| !ip.gateway.is_empty()))
        .filter(|_| primary)
        .unwrap_or(-1);

    let mut out: Vec<NetworkStatus> = Vec::new();
    // (index in result.interfaces, index in out)
    let mut slots: Vec<(usize, usize)> = Vec::new();
    let mut marked = false;
    for (i, iface) in result.interfaces.iter().enumerate() {
        if iface.sandbox.is_empty() {
            continue;
        }
        let mut entry = template.clone();
        entry.interface = iface.name.clone();
        entry.mac = iface.mac.clone();
        entry.mtu = mtu(iface);
        let named = i64::try_from(i).is_ok_and(|i| i == gateway_index);
        let first_without = gateway_index == -1 && out.is_empty();
        if primary && !marked && (named || first_without) {
            entry.default = true;
            marked = true;
        }
        slots.push((i, out.len()));
        out.push(entry);
    }
    for ip in &result.ips {
        let slot = match ip.interface {
            Some(index) => slots
                .iter()
                .find(|(i, _)| i64::try_from(*i).is_ok_and(|i| i == index))
                .map(|(_, s)| *s),
            None => out.len().checked_sub(1),
        };
        if let Some(entry) = slot.and_then(|s| out.get_mut(s)) {
            entry.ips.push(go_ip(&ip.address));
        }
    }
    out
}

/// [`entries`] for a result in its JSON form (any supported version; one
/// without `cniVersion` is read as the latest).
pub fn entries_from_value(
    name: &str,
    result: &Value,
    primary: bool,
    device_info: Option<&DeviceInfo>,
) -> Result<Vec<NetworkStatus>, result::Error> {
    let result = Success::from_value_or(result, result::LATEST)?;
    Ok(entries(name, &result, primary, device_info))
}

/// The annotation's value for `entries` (all delegates, in order), exactly
/// as multus writes it: each entry as Go's `json.MarshalIndent(e, "",
/// "    ")` prints it, joined with `,`, in `[` `]`. Multus does not write
/// the annotation at all when there is no entry; this gives `[]` then.
pub fn annotation(entries: &[NetworkStatus]) -> String {
    let mut out = Vec::with_capacity(256 * entries.len() + 2);
    out.push(b'[');
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&result::to_pretty(entry));
    }
    out.push(b']');
    // serde_json writes UTF-8 only.
    String::from_utf8_lossy(&out).into_owned()
}

/// The result multus answers an ADD with when the pod does not exist (any
/// more): success, with the request's interface in the request's netns and
/// the address `0.0.0.0/0` with gateway `0.0.0.0`. No delegate runs and
/// nothing is cached or written for such a pod.
///
/// Multus labels it with the configuration's `cniVersion` and converts it
/// to 1.1.0 for the wire; the content does not depend on the label, so this
/// is the 1.1.0 form (the shim converts it to the configuration's version
/// as any result).
pub fn pod_missing_result(ifname: &str, netns: &str) -> Success {
    Success {
        cni_version: result::LATEST.to_string(),
        interfaces: vec![result::Interface {
            name: ifname.to_string(),
            sandbox: netns.to_string(),
            ..Default::default()
        }],
        ips: vec![result::Ip {
            address: "0.0.0.0/0".to_string(),
            gateway: "0.0.0.0".to_string(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// An address (`a.b.c.d/n`, `x::y/n` or bare) as Go's `net.IP.String`
/// prints it: no prefix length, an IPv4-mapped IPv6 address as IPv4.
/// Unparsable text is kept up to the `/`.
fn go_ip(text: &str) -> String {
    let addr = text.split_once('/').map_or(text, |(a, _)| a);
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        },
        Ok(ip) => ip.to_string(),
        Err(_) => addr.to_string(),
    }
}

/// multus' `isDefaultRoute`: no destination, or a destination address of
/// `0.0.0.0` or `::` whatever its prefix length (`::ffff:0.0.0.0` equals
/// `0.0.0.0` in Go).
fn is_default_route(dst: &str) -> bool {
    if dst.is_empty() {
        return true;
    }
    let addr = dst.split_once('/').map_or(dst, |(a, _)| a);
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_unspecified(),
        Ok(IpAddr::V6(v6)) => {
            v6.is_unspecified() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified())
        }
        Err(_) => false,
    }
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
