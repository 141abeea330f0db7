//! Unit tests of [`super`]: both annotation forms, their errors and
//! bounds, hardware addresses, the default-network annotation.

use super::*;
use serde_json::json;

fn nets(v: &str) -> Result<Vec<Selection>, Error> {
    parse_networks_annotation(Some(v), "pod-ns")
}

fn short(list: &[Selection]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn absent_or_empty_should_select_nothing() {
    assert!(parse_networks_annotation(None, "ns").unwrap().is_empty());
    assert!(nets("").unwrap().is_empty());
    // Without `[`, `{` or `"` it is the comma form: a network "null".
    assert_eq!(short(&nets("null").unwrap()), ["pod-ns/null"]);
    assert!(nets("[]").unwrap().is_empty());
}

#[test]
fn comma_form_should_parse_like_multus() {
    // multus's own examples.
    assert_eq!(
        short(&nets("net-a,net-b").unwrap()),
        ["pod-ns/net-a", "pod-ns/net-b"]
    );
    assert_eq!(
        short(&nets(" other/net-a@eth1 , net-b@x , ns2 / net-c ").unwrap()),
        ["other/net-a@eth1", "pod-ns/net-b@x", "ns2/net-c"]
    );
    // An empty interface after '@' is no interface.
    assert_eq!(nets("a@").unwrap()[0].interface, None);
}

#[test]
fn comma_form_errors_should_say_what_and_where() {
    for (bad, says) in [
        ("a/b/c", "more than one '/'"),
        ("a@b@c", "more than one '@'"),
        ("ok,Net_A", "lower case alphanumeric"),
        ("NS/net", "lower case alphanumeric"),
        ("-a", "lower case alphanumeric"),
        ("a-", "lower case alphanumeric"),
        ("my.net", "lower case alphanumeric"),
        ("a@this-is-too-long", "too long"),
        ("a@x\ty", "whitespace"),
        ("a,,b", "no network name"),
        ("a,", "no network name"),
        ("ns/", "no network name"),
    ] {
        let e = nets(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad:?}: {e}");
        assert!(e.contains(NETWORKS_ANNOTATION), "{e}");
    }
    let e = nets("ok, x/y/z").unwrap_err().to_string();
    assert!(e.contains("item 1") && e.contains("x/y/z"), "{e}");
}

#[test]
fn json_form_should_read_every_key() {
    let v = json!([{
        "name": "sriov",
        "namespace": "other",
        "interface": "net7",
        "ips": ["10.1.1.2/24", "fd00::2"],
        "mac": "02:00:00:00:00:01",
        "infiniband-guid": "c2:11:22:33:44:55:66:77",
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 1000, "ingressBurst": 10, "egressRate": 2000, "egressBurst": 20},
        "cni-args": {"foo": "bar", "n": 1},
        "default-route": ["10.1.1.1"],
        "deviceID": "0000:03:00.1",
        "ipam-claim-reference": "claim",
        "unknown": 1
    }]);
    let s = nets(&v.to_string()).unwrap().pop().unwrap();
    assert_eq!(s.display_name(), "other/sriov");
    assert_eq!(s.interface.as_deref(), Some("net7"));
    assert_eq!(s.ips, ["10.1.1.2/24", "fd00::2"]);
    assert_eq!(s.mac.as_deref(), Some("02:00:00:00:00:01"));
    assert_eq!(
        s.infiniband_guid.as_deref(),
        Some("c2:11:22:33:44:55:66:77")
    );
    assert_eq!(
        s.port_mappings,
        Some(vec![PortMapping {
            host_port: 8080,
            container_port: 80,
            protocol: Some("tcp".into()),
            host_ip: None
        }])
    );
    assert_eq!(
        s.bandwidth,
        Some(Bandwidth {
            ingress_rate: 1000,
            ingress_burst: 10,
            egress_rate: 2000,
            egress_burst: 20
        })
    );
    assert_eq!(s.cni_args.as_ref().unwrap()["foo"], "bar");
    assert_eq!(s.default_route, Some(vec!["10.1.1.1".parse().unwrap()]));
    assert_eq!(s.device_id.as_deref(), Some("0000:03:00.1"));
}

#[test]
fn json_form_defaults_and_legacy_keys() {
    let list = nets(r#"[{"name":"a","interfaceRequest":"old0"},{"name":"b","interface":"new0","interfaceRequest":"old1"},{"Name":"c","default-route":[]}]"#).unwrap();
    assert_eq!(short(&list), ["pod-ns/a@old0", "pod-ns/b@new0", "pod-ns/c"]);
    // "default-route": [] is kept as given: it changes route handling.
    assert_eq!(list[2].default_route, Some(vec![]));
    assert_eq!(list[0].default_route, None);
}

#[test]
fn json_form_errors_should_name_element_and_key() {
    for (bad, says) in [
        (
            r#"{"name":"a"}"#,
            "must be a list of selection objects, found an object",
        ),
        (r#"[{"name":"a"}"#, "failed to parse the JSON format"),
        (r#"[null]"#, "element 0: must be an object, found null"),
        (r#"[{"namespace":"x"}]"#, r#"key "name": missing"#),
        (
            r#"[{"name":"a"},{"name":"b","mac":"zz"}]"#,
            r#"element 1 ("b"): key "mac": failed to parse MAC address "zz""#,
        ),
        (
            r#"[{"name":"a","infiniband-guid":"00:11"}]"#,
            "infiniband GUID",
        ),
        (
            r#"[{"name":"a","ips":["10.0.0.300"]}]"#,
            r#"key "ips": failed to parse IP address "10.0.0.300""#,
        ),
        (
            r#"[{"name":"a","ips":["10.0.0.1/33"]}]"#,
            r#"failed to parse CIDR "10.0.0.1/33""#,
        ),
        (
            r#"[{"name":"a","ips":"10.0.0.1"}]"#,
            "must be a list of strings",
        ),
        (
            r#"[{"name":"a","interface":"way-too-long-name"}]"#,
            r#"key "interface""#,
        ),
        (
            r#"[{"name":"a","bandwidth":{"ingressRate":1.5}}]"#,
            "ingressRate",
        ),
        (
            r#"[{"name":"a","portMappings":[{"hostPort":"80"}]}]"#,
            r#"key "portMappings[0]": hostPort"#,
        ),
        (
            r#"[{"name":"a","cni-args":[1]}]"#,
            r#"key "cni-args": must be an object"#,
        ),
        (
            r#"[{"name":"a","default-route":["x"]}]"#,
            r#"key "default-route": invalid IP address"#,
        ),
        (
            r#"[{"name":"Bad_Name"}]"#,
            "not a valid Kubernetes object name",
        ),
        (
            r#"[{"name":"a","namespace":"a.b"}]"#,
            "not a valid namespace name",
        ),
        (r#"[{"name":5}]"#, r#"key "name": must be a string"#),
    ] {
        let e = nets(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn hostile_values_should_be_bounded() {
    let long = "a".repeat(MAX_ANNOTATION_BYTES + 1);
    assert!(matches!(
        nets(&long).unwrap_err().problem,
        Problem::TooLong { .. }
    ));
    let many = vec!["a"; MAX_NETWORKS + 1].join(",");
    assert!(matches!(
        nets(&many).unwrap_err().problem,
        Problem::TooMany { count } if count == MAX_NETWORKS + 1
    ));
    let many = format!("[{}]", vec![r#"{"name":"a"}"#; MAX_NETWORKS + 1].join(","));
    assert!(matches!(
        nets(&many).unwrap_err().problem,
        Problem::TooMany { .. }
    ));
    // Deep nesting is refused by the JSON parser, not the stack.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(nets(&deep).is_err());
    assert_eq!(
        nets(&vec!["a"; MAX_NETWORKS].join(",")).unwrap().len(),
        MAX_NETWORKS
    );
}

#[test]
fn errors_should_not_repeat_huge_values() {
    let e = nets(&format!("{},a", "X".repeat(100_000)))
        .unwrap_err()
        .to_string();
    assert!(e.len() < 400 && e.contains("(100000 bytes)"), "{e}");
    let v = format!(
        r#"[{{"name":"{}","mac":"{}"}}]"#,
        "n".repeat(50_000),
        "m".repeat(50_000)
    );
    let e = nets(&v).unwrap_err().to_string();
    assert!(e.len() < 400, "{e}");
}

#[test]
fn hardware_addresses_should_parse_like_go() {
    for (good, len) in [
        ("00:00:5e:00:53:01", 6),
        ("02:00:5E:10:00:00:00:01", 8),
        (
            "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01",
            20,
        ),
        ("00-00-5e-00-53-01", 6),
        ("0000.5e00.5301", 6),
        ("0200.5e10.0000.0001", 8),
        ("0000.0000.fe80.0000.0000.0000.0200.5e10.0000.0001", 20),
    ] {
        assert_eq!(
            parse_hardware_addr(good).map(|b| b.len()),
            Some(len),
            "{good}"
        );
    }
    for bad in [
        "",
        "00:00:5e:00:53",
        "00:00:5e:00:53:01:02",
        "00:00-5e:00:53:01",
        "0g:00:5e:00:53:01",
        "0000.5e00.530",
        "00005e005301",
        "é0:00:5e:00:53:01",
    ] {
        assert_eq!(parse_hardware_addr(bad), None, "{bad}");
    }
}

#[test]
fn default_network_should_use_multus_namespace_and_allow_one() {
    let d = parse_default_network_annotation(Some("calico"), "kube-system")
        .unwrap()
        .unwrap();
    assert_eq!(d.display_name(), "kube-system/calico");
    let d =
        parse_default_network_annotation(Some(r#"[{"name":"x","namespace":"n"}]"#), "kube-system")
            .unwrap()
            .unwrap();
    assert_eq!(d.display_name(), "n/x");
    assert_eq!(
        parse_default_network_annotation(None, "kube-system"),
        Ok(None)
    );
    for bad in ["a,b", "", "[]", r#"[{"name":"a"},{"name":"b"}]"#] {
        let e = parse_default_network_annotation(Some(bad), "kube-system").unwrap_err();
        assert_eq!(e.annotation, DEFAULT_NETWORK_ANNOTATION);
    }
    let e = parse_default_network_annotation(Some("a,b"), "kube-system").unwrap_err();
    assert!(
        e.to_string().contains("more than one default network"),
        "{e}"
    );
}

#[test]
fn static_elements_should_take_the_same_path() {
    let e = super::super::parse_networks("x@fast0, ns/y").unwrap();
    let s: Vec<Selection> = e
        .iter()
        .map(|e| Selection::from_element(e, "pod"))
        .collect();
    assert_eq!(short(&s), ["pod/x@fast0", "ns/y"]);
    assert_eq!(s[1].element(), e[1]);
    let config = super::super::Config::new("c", vec![]);
    let elems: Vec<Element> = nets("a, b@fast0")
        .unwrap()
        .iter()
        .map(Selection::element)
        .collect();
    let sel = super::super::select(&config, "eth0", &elems).unwrap();
    let names: Vec<_> = sel.iter().map(|s| s.ifname.as_str()).collect();
    assert_eq!(names, ["eth0", "net1", "fast0"]);
}
