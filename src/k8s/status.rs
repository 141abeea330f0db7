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
mod tests {
    use super::*;
    use serde_json::json;

    fn success(v: Value) -> Success {
        Success::from_value(&v).unwrap()
    }

    fn one(name: &str, v: Value, primary: bool) -> Vec<NetworkStatus> {
        entries(name, &success(v), primary, None)
    }

    /// The example of the multus documentation, to the byte.
    #[test]
    fn annotation_should_match_the_multus_example_byte_for_byte() {
        let cbr0 = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/var/run/netns/cni-1"}],
            "ips": [{"address": "10.244.1.5/24", "gateway": "10.244.1.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
        });
        let macvlan = json!({
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "net1", "mac": "86:1d:96:ff:55:0d", "sandbox": "/var/run/netns/cni-1"}],
            "ips": [{"version": "4", "address": "192.168.1.205/24", "interface": 0}],
        });
        let mut all = one("cbr0", cbr0, true);
        all.extend(one("default/macvlan-conf", macvlan, false));
        let expected = r#"[{
    "name": "cbr0",
    "interface": "eth0",
    "ips": [
        "10.244.1.5"
    ],
    "mac": "0a:58:0a:f4:01:05",
    "default": true,
    "dns": {},
    "gateway": [
        "10.244.1.1"
    ]
},{
    "name": "default/macvlan-conf",
    "interface": "net1",
    "ips": [
        "192.168.1.205"
    ],
    "mac": "86:1d:96:ff:55:0d",
    "dns": {}
}]"#;
        assert_eq!(annotation(&all), expected);
    }

    #[test]
    fn every_key_should_print_in_the_nad_client_order() {
        let v = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "mtu": 9000, "sandbox": "/run/netns/a"}],
            "ips": [{"address": "10.1.0.5/16", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}],
            "dns": {"options": ["ndots:5"], "search": ["svc"], "domain": "cluster.local", "nameservers": ["10.96.0.10"]},
        });
        let dev = DeviceInfo::parse(
            br#"{"version":"1.1.0","type":"pci","pci":{"pci-address":"0000:03:00.1"}}"#,
        );
        let e = entries("ns/sriov", &success(v), true, dev.as_ref());
        let expected = r#"[{
    "name": "ns/sriov",
    "interface": "net1",
    "ips": [
        "10.1.0.5"
    ],
    "mac": "02:00:00:00:00:01",
    "mtu": 9000,
    "default": true,
    "dns": {
        "nameservers": [
            "10.96.0.10"
        ],
        "domain": "cluster.local",
        "search": [
            "svc"
        ],
        "options": [
            "ndots:5"
        ]
    },
    "device-info": {
        "type": "pci",
        "version": "1.1.0",
        "pci": {
            "pci-address": "0000:03:00.1"
        }
    },
    "gateway": [
        "10.1.0.1"
    ]
}]"#;
        assert_eq!(annotation(&e), expected);
    }

    #[test]
    fn dual_stack_single_interface_should_list_both_families() {
        let e = one(
            "kindnet",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "sandbox": "/run/netns/a"}],
                "ips": [
                    {"address": "10.244.0.7/24", "gateway": "10.244.0.1", "interface": 0},
                    {"address": "fd00:10:244::7/64", "gateway": "fd00:10:244::1", "interface": 0},
                ],
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.244.0.1"},
                    {"dst": "::/0", "gw": "fd00:10:244::1"},
                    {"dst": "10.96.0.0/12", "gw": "10.244.0.1"},
                ],
            }),
            true,
        );
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].ips, ["10.244.0.7", "fd00:10:244::7"]);
        assert_eq!(e[0].gateway, ["10.244.0.1", "fd00:10:244::1"]);
        assert!(e[0].default);
    }

    /// bridge/veth-style result: host-side interfaces first, without
    /// sandbox, then two sandbox interfaces.
    #[test]
    fn host_side_interfaces_should_get_no_entry_and_ips_follow_their_index() {
        let v = json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa:00:00:00:00:01"},
                {"name": "veth1234", "mac": "aa:00:00:00:00:02"},
                {"name": "eth0", "mac": "aa:00:00:00:00:03", "sandbox": "/run/netns/a"},
                {"name": "net1", "mac": "aa:00:00:00:00:04", "mtu": 1400, "sandbox": "/run/netns/a"},
            ],
            "ips": [
                {"address": "10.0.0.5/24", "interface": 3},
                {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 2},
                {"address": "10.9.0.1/24", "interface": 0},
                {"address": "fd00::5/64", "interface": 2},
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}],
        });
        let e = one("multi", v.clone(), true);
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[0].interface.as_str(), e[0].mac.as_str(), e[0].mtu),
            ("eth0", "aa:00:00:00:00:03", 0)
        );
        assert_eq!((e[1].interface.as_str(), e[1].mtu), ("net1", 1400));
        // The host bridge's address (index 0) is nobody's.
        assert_eq!(e[0].ips, ["10.1.0.5", "fd00::5"]);
        assert_eq!(e[1].ips, ["10.0.0.5"]);
        // The first address with index and gateway names eth0.
        assert!(e[0].default && !e[1].default);
        assert_eq!(e[0].gateway, ["10.1.0.1"]);
        assert_eq!(e[1].gateway, ["10.1.0.1"]);

        let e = one("multi", v, false);
        assert!(e.iter().all(|s| !s.default), "{e:?}");
    }

    #[test]
    fn ips_without_index_should_go_to_the_last_sandbox_entry() {
        let e = one(
            "multi",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "eth0", "sandbox": "/run/netns/a"},
                    {"name": "net1", "sandbox": "/run/netns/a"},
                    {"name": "vethhost"},
                ],
                "ips": [
                    {"address": "10.0.0.5/24", "gateway": "10.0.0.1"},
                    {"address": "10.1.0.5/24", "interface": 0},
                    {"address": "fd00::9/64"},
                ],
            }),
            true,
        );
        assert_eq!(e[0].ips, ["10.1.0.5"]);
        assert_eq!(e[1].ips, ["10.0.0.5", "fd00::9"]);
        // No address has both an index and a gateway: the first sandbox
        // interface is the default.
        assert!(e[0].default && !e[1].default);
    }

    #[test]
    fn the_default_should_follow_the_first_indexed_gateway() {
        let e = one(
            "multi",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "eth0", "sandbox": "/run/netns/a"},
                    {"name": "net1", "sandbox": "/run/netns/a"},
                ],
                "ips": [
                    {"address": "10.0.0.5/24", "gateway": "10.0.0.1"},
                    {"address": "10.1.0.5/24", "interface": 0},
                    {"address": "10.2.0.5/24", "gateway": "10.2.0.1", "interface": 1},
                    {"address": "10.3.0.5/24", "gateway": "10.3.0.1", "interface": 0},
                ],
            }),
            true,
        );
        assert!(!e[0].default && e[1].default, "{e:?}");
    }

    /// multus marks no interface when the gateway's index names one
    /// without sandbox.
    #[test]
    fn a_gateway_on_a_host_interface_should_mark_no_default() {
        let e = one(
            "multi",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [
                    {"name": "br0"},
                    {"name": "eth0", "sandbox": "/run/netns/a"},
                    {"name": "net1", "sandbox": "/run/netns/a"},
                ],
                "ips": [{"address": "10.0.0.1/24", "gateway": "10.0.0.254", "interface": 0}],
            }),
            true,
        );
        assert_eq!(e.len(), 2);
        assert!(e.iter().all(|s| !s.default && s.ips.is_empty()), "{e:?}");
    }

    #[test]
    fn no_sandbox_interface_should_give_no_entry_unless_it_is_the_only_interface() {
        let none = json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.5/24"}]});
        assert!(one("n", none, true).is_empty());
        let two_host = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "a"}, {"name": "b"}],
            "ips": [{"address": "10.0.0.5/24"}],
        });
        assert!(one("n", two_host, true).is_empty());

        // One interface, no sandbox: one entry without interface fields.
        let host = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "host0", "mac": "02:00:00:00:00:01", "mtu": 1500}],
            "ips": [{"address": "10.0.0.5/24", "interface": 0}, {"address": "10.0.0.6/24", "interface": 7}],
        });
        let e = one("n", host, true);
        assert_eq!(e.len(), 1);
        assert_eq!(
            annotation(&e),
            "[{\n    \"name\": \"n\",\n    \"ips\": [\n        \"10.0.0.5\",\n        \"10.0.0.6\"\n    ],\n    \"default\": true,\n    \"dns\": {}\n}]"
        );
    }

    #[test]
    fn default_routes_should_be_any_zero_destination() {
        let e = one(
            "v6",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "net1", "sandbox": "/run/netns/a"}],
                "ips": [{"address": "2001:db8::5/64", "interface": 0}],
                "routes": [
                    {"dst": "::/0", "gw": "2001:db8::1"},
                    {"dst": "::/64", "gw": "2001:db8::2"},
                    {"dst": "0.0.0.0/8", "gw": "192.0.2.1"},
                    {"dst": "::ffff:0.0.0.0/96", "gw": "::ffff:192.0.2.2"},
                    {"dst": "2001:db8:1::/48", "gw": "2001:db8::3"},
                    {"dst": "10.0.0.0/8", "gw": "192.0.2.4"},
                    {"dst": "", "gw": "192.0.2.5"},
                ],
            }),
            false,
        );
        assert_eq!(
            e[0].gateway,
            [
                "2001:db8::1",
                "2001:db8::2",
                "192.0.2.1",
                "192.0.2.2",
                "192.0.2.5"
            ]
        );
        assert!(!e[0].default);
    }

    /// Go prints a missing gateway as `<nil>` and escapes it.
    #[test]
    fn a_default_route_without_gateway_should_print_as_go_nil() {
        let e = one(
            "n",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "net1", "sandbox": "/run/netns/a"}],
                "routes": [{"dst": "0.0.0.0/0"}],
            }),
            false,
        );
        assert_eq!(e[0].gateway, [NO_GATEWAY]);
        assert!(annotation(&e).contains("\"gateway\": [\n        \"\\u003cnil\\u003e\"\n    ]"));
    }

    #[test]
    fn strings_should_be_escaped_as_go_does() {
        let e = one(
            "ns/a&b",
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "x<y>", "sandbox": "/run/netns/a"}],
            }),
            false,
        );
        let text = annotation(&e);
        assert!(text.contains(r#""name": "ns/a\u0026b""#), "{text}");
        assert!(text.contains(r#""interface": "x\u003cy\u003e""#), "{text}");
    }

    #[test]
    fn addresses_should_print_as_go_prints_them() {
        assert_eq!(go_ip("::ffff:192.0.2.1/120"), "192.0.2.1");
        assert_eq!(go_ip("2001:db8:0:0:1:0:0:1/64"), "2001:db8::1:0:0:1");
        assert_eq!(go_ip("2001:0db8:0000::0001/64"), "2001:db8::1");
        assert_eq!(go_ip("::102:304/64"), "::102:304");
        assert_eq!(go_ip("10.0.0.1"), "10.0.0.1");
        assert_eq!(go_ip("not-an-ip/24"), "not-an-ip");
    }

    #[test]
    fn a_pre_1_0_result_should_have_no_mtu() {
        let v = json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "mtu": 1400, "sandbox": "/n"}],
        });
        assert_eq!(one("n", v.clone(), false)[0].mtu, 0);
        let mut v = v;
        v["cniVersion"] = json!("1.0.0");
        assert_eq!(one("n", v, false)[0].mtu, 1400);
    }

    #[test]
    fn no_entries_should_print_an_empty_array() {
        assert_eq!(annotation(&[]), "[]");
    }

    #[test]
    fn entries_from_value_should_read_any_version_and_refuse_garbage() {
        let v = json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/a"}],
            "ips": [{"version": "4", "address": "10.0.0.5/24", "interface": 0}],
        });
        let e = entries_from_value("n", &v, true, None).unwrap();
        assert_eq!(e[0].ips, ["10.0.0.5"]);
        assert!(entries_from_value("n", &json!([1]), true, None).is_err());
    }

    #[test]
    fn device_info_should_be_on_every_entry_of_the_delegate() {
        let dev = DeviceInfo::parse(br#"{"type":"pci","pci":{"pci-address":"0000:03:00.1"}}"#);
        let v = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "a", "sandbox": "/n"}, {"name": "b", "sandbox": "/n"}],
        });
        let e = entries("n", &success(v), false, dev.as_ref());
        assert_eq!(e.len(), 2);
        assert!(e.iter().all(|s| s.device_info == dev));
    }

    #[test]
    fn the_annotation_should_read_back_to_the_entries() {
        let v = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 1450, "sandbox": "/n"}],
            "ips": [{"address": "10.0.0.5/24", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}],
            "dns": {"nameservers": ["10.96.0.10"]},
        });
        let dev = DeviceInfo::parse(
            br#"{"type":"vhost-user","vhost-user":{"mode":"server","path":"/s"}}"#,
        );
        let e = entries("ns/net", &success(v), true, dev.as_ref());
        let back: Vec<NetworkStatus> = serde_json::from_str(&annotation(&e)).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn the_pod_missing_result_should_be_the_multus_placeholder() {
        let r = pod_missing_result("eth0", "/var/run/netns/cni-1");
        assert_eq!(
            r.to_value(),
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1"}],
                "ips": [{"address": "0.0.0.0/0", "gateway": "0.0.0.0"}],
            })
        );
        // It converts to any version a configuration may name.
        for v in result::SUPPORTED {
            assert!(r.clone().convert(v).is_ok(), "{v}");
        }
    }
}
