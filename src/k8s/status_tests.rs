//! Unit tests of [`super`].

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
    let dev =
        DeviceInfo::parse(br#"{"type":"vhost-user","vhost-user":{"mode":"server","path":"/s"}}"#);
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
