//! Unit tests of [`super`].

use super::*;
use serde_json::json;

fn rich_1_1() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "br0", "mac": "a2:6b:1c:3d:4e:5f"},
            {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "mtu": 1400,
             "sandbox": "/run/netns/x", "socketPath": "/run/vhost.sock", "pciID": "0000:04:00.5"}
        ],
        "ips": [
            {"interface": 1, "address": "10.244.1.5/24", "gateway": "10.244.1.1"},
            {"interface": 1, "address": "fd00::5/64"}
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1", "mtu": 1300, "table": 0, "scope": 253}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
        "unknownKey": true
    })
}

#[test]
fn convert_to_every_supported_version_should_set_version_and_ip_families() {
    for to in SUPPORTED {
        let out = convert(&rich_1_1(), to).unwrap();
        assert_eq!(out["cniVersion"], *to);
        let ips = out["ips"].as_array().unwrap();
        if to.starts_with("0.") {
            assert_eq!(ips[0]["version"], "4", "{to}");
            assert_eq!(ips[1]["version"], "6", "{to}");
            assert!(out["interfaces"][1].get("mtu").is_none(), "{to}");
            assert!(out["interfaces"][1].get("socketPath").is_none(), "{to}");
            assert!(out["interfaces"][1].get("pciID").is_none(), "{to}");
        } else {
            assert!(ips.iter().all(|ip| ip.get("version").is_none()), "{to}");
            assert_eq!(out["interfaces"][1]["mtu"], 1400, "{to}");
            assert_eq!(out["interfaces"][1]["pciID"], "0000:04:00.5", "{to}");
        }
        // Shared fields survive every conversion.
        assert_eq!(out["ips"][0]["interface"], 1);
        assert_eq!(out["ips"][0]["gateway"], "10.244.1.1");
        assert_eq!(out["interfaces"][1]["sandbox"], "/run/netns/x");
        assert_eq!(out["routes"][0]["scope"], 253);
        assert_eq!(out["routes"][0]["table"], 0);
        assert_eq!(out["routes"][0]["mtu"], 1300);
        assert_eq!(out["dns"]["nameservers"][0], "10.96.0.10");
        assert!(out.get("unknownKey").is_none());
    }
}

#[test]
fn convert_from_0_x_to_1_x_should_drop_ip_version() {
    let old = json!({
        "cniVersion": "0.3.1",
        "ips": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1"}],
        "dns": {}
    });
    let out = convert(&old, "1.0.0").unwrap();
    assert_eq!(
        out,
        json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1"}]})
    );
    // Back at 0.x the empty dns is there again.
    assert_eq!(convert(&out, "0.3.1").unwrap()["dns"], json!({}));
}

#[test]
fn convert_should_trust_the_address_over_a_wrong_version() {
    let v = json!({"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "fd00::1/64"}]});
    assert_eq!(convert(&v, "0.3.0").unwrap()["ips"][0]["version"], "6");
}

#[test]
fn convert_should_derive_missing_version_like_libcni() {
    // Debian's loopback labels a 1.0-shaped body 0.3.1.
    let v = json!({"cniVersion": "0.3.1", "ips": [{"interface": 0, "address": "::1/128"}]});
    assert_eq!(convert(&v, "0.4.0").unwrap()["ips"][0]["version"], "6");
}

#[test]
fn convert_to_or_from_unsupported_versions_should_name_both() {
    for (from, to) in [("1.1.0", "0.2.0"), ("1.1.0", "2.0.0"), ("0.2.0", "1.0.0")] {
        let err = convert(&json!({"cniVersion": from}), to).unwrap_err();
        assert_eq!(
            err,
            Error::Unsupported {
                from: from.into(),
                to: to.into()
            }
        );
        assert_eq!(err.code(), 1);
        let text = err.to_string();
        assert!(text.contains(from) && text.contains(to), "{text}");
    }
}

#[test]
fn invalid_results_should_be_errors_with_code_6() {
    for bad in [
        json!([1, 2]),
        json!({"cniVersion": "1.0.0", "ips": [{"gateway": "10.0.0.1"}]}),
        json!({"cniVersion": "1.0.0", "ips": "nope"}),
        json!({"cniVersion": "1.0.0", "interfaces": [{"mtu": "big"}]}),
    ] {
        let err = Success::from_value(&bad).unwrap_err();
        assert!(matches!(err, Error::Invalid { .. }), "{bad}: {err}");
        assert_eq!(err.code(), 6);
    }
    assert_eq!(
        Success::from_value(&json!({})).unwrap_err(),
        Error::NoVersion
    );
}

#[test]
fn unknown_address_family_should_fail_only_when_needed() {
    let v = json!({"cniVersion": "1.0.0", "ips": [{"address": "nonsense"}]});
    assert!(convert(&v, "1.1.0").is_ok());
    assert!(matches!(
        convert(&v, "0.4.0").unwrap_err(),
        Error::Invalid { .. }
    ));
}

#[test]
fn nulls_should_read_as_absent() {
    let v = json!({"cniVersion": "1.1.0", "interfaces": null, "ips": null,
                       "routes": null, "dns": null,
                       "extra": null});
    assert_eq!(
        convert(&v, "1.0.0").unwrap(),
        json!({"cniVersion": "1.0.0"})
    );
    assert_eq!(
        convert(&v, "0.4.0").unwrap(),
        json!({"cniVersion": "0.4.0", "dns": {}})
    );
}

#[test]
fn missing_version_should_take_the_fallback() {
    let v = json!({"ips": [{"address": "10.0.0.2/24"}]});
    let s = Success::from_value_or(&v, "1.1.0").unwrap();
    assert_eq!(s.cni_version, "1.1.0");
}

#[test]
fn pretty_output_should_match_go_indentation_and_key_order() {
    let v = json!({"cniVersion":"1.1.0","interfaces":[{"mac":"00:00:00:00:00:00","name":"lo","sandbox":"/run/netns/n"}],
                       "ips":[{"address":"127.0.0.1/8","interface":0}]});
    let out = Success::from_value(&v)
        .unwrap()
        .convert("0.3.1")
        .unwrap()
        .to_pretty();
    let expected = "{\n    \"cniVersion\": \"0.3.1\",\n    \"interfaces\": [\n        {\n            \"name\": \"lo\",\n            \"mac\": \"00:00:00:00:00:00\",\n            \"sandbox\": \"/run/netns/n\"\n        }\n    ],\n    \"ips\": [\n        {\n            \"version\": \"4\",\n            \"interface\": 0,\n            \"address\": \"127.0.0.1/8\"\n        }\n    ],\n    \"dns\": {}\n}";
    assert_eq!(String::from_utf8(out).unwrap(), expected);
}

#[test]
fn pretty_output_at_1_x_should_sort_keys_and_drop_an_empty_dns_like_libcni() {
    // libcni 1.x prints through Result.MarshalJSON, which re-marshals a
    // map: every object's keys sorted, an empty dns left out.
    let mut v = rich_1_1();
    v["dns"] = json!({});
    for version in ["1.0.0", "1.1.0"] {
        let out = Success::from_value(&v)
            .unwrap()
            .convert(version)
            .unwrap()
            .to_pretty();
        let expected = format!(
            r#"{{
    "cniVersion": "{version}",
    "interfaces": [
        {{
            "mac": "a2:6b:1c:3d:4e:5f",
            "name": "br0"
        }},
        {{
            "mac": "0a:58:0a:f4:01:05",
            "mtu": 1400,
            "name": "eth0",
            "pciID": "0000:04:00.5",
            "sandbox": "/run/netns/x",
            "socketPath": "/run/vhost.sock"
        }}
    ],
    "ips": [
        {{
            "address": "10.244.1.5/24",
            "gateway": "10.244.1.1",
            "interface": 1
        }},
        {{
            "address": "fd00::5/64",
            "interface": 1
        }}
    ],
    "routes": [
        {{
            "dst": "0.0.0.0/0",
            "gw": "10.244.1.1",
            "mtu": 1300,
            "scope": 253,
            "table": 0
        }}
    ]
}}"#
        );
        assert_eq!(String::from_utf8(out).unwrap(), expected, "{version}");
    }
    // A dns with content stays, its keys sorted too.
    let out = Success::from_value(&rich_1_1()).unwrap().to_pretty();
    let text = String::from_utf8(out).unwrap();
    assert!(
            text.starts_with("{\n    \"cniVersion\": \"1.1.0\",\n    \"dns\": {\n        \"nameservers\": [\n            \"10.96.0.10\"\n        ],\n        \"search\": ["),
            "{text}"
        );
}

#[test]
fn pretty_output_should_escape_strings_as_go_does() {
    let v = json!({"cniVersion": "0.4.0",
                       "interfaces": [{"name": "a<b>&c\u{2028}d\u{2029}\"\\\n\u{1}é"}]});
    let out = Success::from_value(&v).unwrap().to_pretty();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains(r#""name": "a\u003cb\u003e\u0026c\u2028d\u2029\"\\\n\u0001é""#),
        "{text}"
    );
}

#[test]
fn route_fields_should_print_in_go_order() {
    let v = json!({"cniVersion":"1.1.0","routes":[{"scope":0,"table":5,"priority":3,"advmss":2,"mtu":1,"gw":"10.0.0.1","dst":"0.0.0.0/0"}]});
    let s = Success::from_value(&v).unwrap();
    assert_eq!(
        serde_json::to_string(&s.routes).unwrap(),
        r#"[{"dst":"0.0.0.0/0","gw":"10.0.0.1","mtu":1,"advmss":2,"priority":3,"table":5,"scope":0}]"#
    );
}

#[test]
fn compare_should_order_versions_numerically() {
    assert_eq!(compare("0.4.0", "0.10.0"), Some(Ordering::Less));
    assert_eq!(compare("1.1.0", "1.1.0"), Some(Ordering::Equal));
    assert_eq!(compare("1.1.0", "1.0.0"), Some(Ordering::Greater));
    assert_eq!(compare("1.1", "1.0.0"), None);
    assert_eq!(compare("1.a.0", "1.0.0"), None);
    assert_eq!(compare("1.0.0.0", "1.0.0"), None);
    assert_eq!(compare("+1.0.0", "1.0.0"), None);
}
