//! Property tests: generated inputs for the parsers and printers whose
//! example tests only cover a few hand-picked cases.

use std::time::Duration;

use plexus::duration;
use plexus::selection::{parse_networks, Element};
use proptest::prelude::*;
use proptest::test_runner::{FailurePersistence, FileFailurePersistence};

/// `cases` cases, with the failures found kept in (and replayed from)
/// `properties.proptest-regressions` beside this file. Proptest's default
/// would look for a `lib.rs` or `main.rs` above this file, find `main.rs`
/// beside it, and use `tests/proptest-regressions/properties.txt` instead.
fn cases(cases: u32) -> ProptestConfig {
    let default = ProptestConfig::default();
    // None when PROPTEST_DISABLE_FAILURE_PERSISTENCE is set.
    let persistence = default.failure_persistence.as_ref().map(|_| {
        Box::new(FileFailurePersistence::WithSource("proptest-regressions"))
            as Box<dyn FailurePersistence>
    });
    ProptestConfig {
        cases,
        failure_persistence: persistence,
        ..default
    }
}

proptest! {
    #![proptest_config(cases(256))]

    /// Every millisecond-granular duration prints as something parse reads
    /// back to the same duration.
    #[test]
    fn duration_format_then_parse_is_identity(ms in 0u64..10_000_000_000) {
        let d = Duration::from_millis(ms);
        let text = duration::format(d);
        prop_assert_eq!(duration::parse(&text), Ok(d), "text {:?}", text);
    }

    /// A duration written with whole units parses to that value and prints
    /// back to a string that parses to the same value.
    #[test]
    fn duration_parse_then_format_is_stable(
        n in 0u64..100_000,
        unit in prop::sample::select(vec!["ms", "s", "m", "h"]),
    ) {
        let text = format!("{n}{unit}");
        let d = duration::parse(&text).unwrap();
        let per = match unit { "ms" => 1, "s" => 1000, "m" => 60_000, _ => 3_600_000 };
        prop_assert_eq!(d, Duration::from_millis(n * per));
        prop_assert_eq!(duration::parse(&duration::format(d)), Ok(d));
    }

    /// Decimal seconds with millisecond digits parse to whole milliseconds
    /// (float rounding must not lose a nanosecond).
    #[test]
    fn duration_decimal_seconds_are_exact(secs in 0u64..1_000_000, frac in 0u64..1000) {
        let text = format!("{secs}.{frac:03}s");
        prop_assert_eq!(duration::parse(&text), Ok(Duration::from_millis(secs * 1000 + frac)), "text {:?}", text);
    }

    /// Arbitrary text never panics the duration parser.
    #[test]
    fn duration_parse_never_panics(s in any::<String>()) {
        let _ = duration::parse(&s);
    }

    /// Valid elements print and parse back to themselves, lists included.
    #[test]
    fn selection_print_then_parse_is_identity(
        elems in prop::collection::vec(
            (
                prop::option::of("[a-zA-Z0-9][a-zA-Z0-9_.-]{0,20}"),
                "[a-zA-Z0-9][a-zA-Z0-9_.-]{0,20}",
                prop::option::of("[a-z][a-z0-9]{0,10}"),
            ),
            1..5,
        )
    ) {
        let elems: Vec<Element> = elems
            .into_iter()
            .map(|(namespace, name, interface)| Element { namespace, name, interface })
            .collect();
        let text = elems.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(",");
        let parsed = parse_networks(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        prop_assert_eq!(parsed, elems);
    }

    /// Malformed selection strings give errors, never panics.
    #[test]
    fn selection_parse_never_panics(s in "[a-z0-9/@,. _-]{0,40}|\\PC{0,40}") {
        if let Ok(v) = parse_networks(&s) {
            // What parses prints back to something that parses the same.
            let text = v.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_networks(&text).ok(), Some(v));
        }
    }
}

fn ipv4() -> impl Strategy<Value = String> {
    (any::<[u8; 4]>(), 0u8..=32)
        .prop_map(|(a, p)| format!("{}.{}.{}.{}/{p}", a[0], a[1], a[2], a[3]))
}

fn ipv6() -> impl Strategy<Value = String> {
    (any::<[u16; 8]>(), 0u8..=128).prop_map(|(a, p)| format!("{}/{p}", std::net::Ipv6Addr::from(a)))
}

fn result_json() -> impl Strategy<Value = serde_json::Value> {
    (
        prop::collection::vec("[a-z][a-z0-9]{0,10}", 1..4),
        prop::collection::vec((prop_oneof![ipv4(), ipv6()], any::<prop::sample::Index>()), 0..4),
        prop::collection::vec(prop_oneof![ipv4(), ipv6()], 0..3),
        prop::collection::vec("[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}", 0..3),
        0u64..10_000,
    )
        .prop_map(|(ifaces, ips, routes, ns, mtu)| {
            let n = ifaces.len();
            serde_json::json!({
                "cniVersion": "1.1.0",
                "interfaces": ifaces.iter().map(|i| serde_json::json!({
                    "name": i, "mac": "02:00:00:00:00:01", "sandbox": "/var/run/netns/x", "mtu": mtu + 1,
                })).collect::<Vec<_>>(),
                "ips": ips.iter().map(|(a, k)| serde_json::json!({
                    "address": a, "interface": k.index(n),
                })).collect::<Vec<_>>(),
                "routes": routes.iter().map(|d| serde_json::json!({"dst": d})).collect::<Vec<_>>(),
                "dns": {"nameservers": ns},
            })
        })
}

fn strip(v: &serde_json::Value, key: &str) -> serde_json::Value {
    let mut v = v.clone();
    if let Some(list) = v.get_mut(key).and_then(|l| l.as_array_mut()) {
        for item in list {
            if let Some(o) = item.as_object_mut() {
                o.remove("version");
                o.remove("mtu");
            }
        }
    }
    // Empty lists are left out of the printed result, as libcni does.
    match &v[key] {
        serde_json::Value::Null => serde_json::json!([]),
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(cases(256))]

    /// Converting between any two supported versions keeps interfaces,
    /// addresses, routes and DNS; `ips[].version` is present exactly at 0.x
    /// and names the address family; interface mtu is dropped at 0.x.
    /// The result is first converted to `from`, then to `to`.
    #[test]
    fn result_conversion_keeps_content(
        result in result_json(),
        from in prop::sample::select(plexus::result::SUPPORTED.to_vec()),
        to in prop::sample::select(plexus::result::SUPPORTED.to_vec()),
    ) {
        let start = plexus::result::convert(&result, from).unwrap();
        let out = plexus::result::convert(&start, to).unwrap();
        prop_assert_eq!(out["cniVersion"].as_str(), Some(to));
        let pre_1_0 = to.starts_with("0.");
        for key in ["interfaces", "ips", "routes"] {
            prop_assert_eq!(strip(&out, key), strip(&result, key), "{}", key);
        }
        let ns = &result["dns"]["nameservers"];
        if ns.as_array().is_some_and(|a| !a.is_empty()) {
            prop_assert_eq!(&out["dns"]["nameservers"], ns);
        }
        for ip in out.get("ips").and_then(|v| v.as_array()).cloned().unwrap_or_default().iter() {
            let addr = ip["address"].as_str().unwrap();
            let family = if addr.contains(':') { "6" } else { "4" };
            if pre_1_0 {
                prop_assert_eq!(ip["version"].as_str(), Some(family));
            } else {
                prop_assert!(ip.get("version").is_none());
            }
        }
        for iface in out["interfaces"].as_array().unwrap_or(&Vec::new()) {
            // Once dropped at 0.x, mtu cannot come back.
            prop_assert_eq!(iface.get("mtu").is_some(), !pre_1_0 && !from.starts_with("0."));
        }
    }
}

/// Serves one connection at a fresh socket: reads the shim's request
/// (head plus Content-Length body), writes `answer`, closes.
fn shim_against(answer: Vec<u8>) -> plexus::shim::Outcome {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("p.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "the shim closed before its request head");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        while buf.len() < head_end + len {
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
        // The shim may give up early on a bad head; a broken pipe is fine.
        let _ = s.write_all(&answer);
    });
    let env = |k: &str| -> Option<String> {
        Some(
            match k {
                "CNI_COMMAND" => "ADD",
                "CNI_CONTAINERID" => "ctr-prop",
                "CNI_NETNS" => "/run/netns/prop",
                "CNI_IFNAME" => "eth0",
                "CNI_PATH" => "/usr/lib/cni",
                _ => return None,
            }
            .to_string(),
        )
    };
    let conf = serde_json::to_vec(&serde_json::json!({
        "cniVersion": "1.0.0", "name": "prop", "type": "plexus-shim", "socketPath": sock,
    }))
    .unwrap();
    let mut log = Vec::new();
    let out = plexus::shim::run(env, &conf[..], &mut log);
    server.join().unwrap();
    out
}

proptest! {
    #![proptest_config(cases(64))]

    /// Whatever bytes the daemon answers, the shim fails cleanly with a
    /// CNI error on stdout (or succeeds), and never panics.
    #[test]
    fn shim_survives_any_answer(
        answer in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            (prop::collection::vec(any::<u8>(), 0..100))
                .prop_map(|b| [b"HTTP/1.1 200 OK\r\n".to_vec(), b].concat()),
        ]
    ) {
        let out = shim_against(answer);
        if out.exit_code != 0 {
            let err: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            prop_assert!(err["code"].as_u64().is_some(), "{}", err);
            prop_assert!(err["msg"].as_str().is_some_and(|m| !m.is_empty()), "{}", err);
        }
    }

    /// A well-formed 200 answer carrying a result is printed back with the
    /// same addresses.
    #[test]
    fn shim_prints_the_result_it_is_given(result in result_json()) {
        let result = plexus::result::convert(&result, "1.0.0").unwrap();
        let body = serde_json::to_vec(&serde_json::json!({"Result": result})).unwrap();
        let mut answer = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        answer.extend_from_slice(&body);
        let out = shim_against(answer);
        prop_assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stdout));
        let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        prop_assert_eq!(&printed["ips"], &result["ips"]);
        prop_assert_eq!(&printed["interfaces"], &result["interfaces"]);
    }
}

fn status_address() -> impl Strategy<Value = String> {
    prop_oneof![
        ipv4(),
        ipv6(),
        (any::<[u8; 4]>(), 96u8..=128)
            .prop_map(|(a, p)| format!("::ffff:{}.{}.{}.{}/{p}", a[0], a[1], a[2], a[3])),
    ]
}

/// A 1.1.0 result with sandbox and host-side interfaces, addresses with
/// and without (possibly dangling) interface indexes and gateways, default
/// and other routes with and without `gw`, and names with characters Go
/// escapes.
fn status_result_json() -> impl Strategy<Value = serde_json::Value> {
    let name = "[a-z0-9<>&\"\\\\\u{2028}é-]{1,12}";
    (
        prop::collection::vec((name, any::<bool>(), 0i64..10_000), 0..5),
        prop::collection::vec(
            (
                status_address(),
                prop::option::of(-2i64..6),
                prop::option::of(status_address()),
            ),
            0..6,
        ),
        prop::collection::vec(
            (
                prop_oneof![
                    Just("0.0.0.0/0".to_string()),
                    Just("::/0".to_string()),
                    Just("0.0.0.0/8".to_string()),
                    status_address(),
                ],
                prop::option::of(status_address()),
            ),
            0..4,
        ),
        prop::collection::vec("[a-z0-9.:]{1,15}", 0..3),
    )
        .prop_map(|(ifaces, ips, routes, ns)| {
            serde_json::json!({
                "cniVersion": "1.1.0",
                "interfaces": ifaces.iter().map(|(n, sandbox, mtu)| {
                    let mut i = serde_json::json!({"name": n, "mac": "02:00:00:00:00:01", "mtu": mtu});
                    if *sandbox {
                        i["sandbox"] = serde_json::json!("/var/run/netns/p");
                    }
                    i
                }).collect::<Vec<_>>(),
                "ips": ips.iter().map(|(a, index, gw)| {
                    let mut ip = serde_json::json!({"address": a});
                    if let Some(i) = index {
                        ip["interface"] = serde_json::json!(i);
                    }
                    if let Some(g) = gw {
                        ip["gateway"] = serde_json::json!(g.split('/').next());
                    }
                    ip
                }).collect::<Vec<_>>(),
                "routes": routes.iter().map(|(dst, gw)| {
                    let mut r = serde_json::json!({"dst": dst});
                    if let Some(g) = gw {
                        r["gw"] = serde_json::json!(g.split('/').next());
                    }
                    r
                }).collect::<Vec<_>>(),
                "dns": {"nameservers": ns},
            })
        })
}

/// A DNS-1123 label, the comma form's rule for names and namespaces.
fn dns_label() -> impl Strategy<Value = String> {
    "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?"
}

/// Arbitrary JSON, with the selection element's keys and values that
/// almost parse (addresses, MACs, names) among the random ones.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,12}".prop_map(Value::from),
        prop::sample::select(vec![
            "net-a",
            "ns",
            "eth1",
            "10.0.0.1",
            "10.0.0.1/24",
            "fd00::1/64",
            "::",
            "02:00:00:00:00:01",
            "0000.5e00.5301",
            "00:11:22:33:44:55:66:77",
            "",
            "way-too-long-interface",
        ])
        .prop_map(Value::from),
    ];
    let key = prop_oneof![
        prop::sample::select(vec![
            "name",
            "namespace",
            "interface",
            "interfaceRequest",
            "ips",
            "mac",
            "infiniband-guid",
            "portMappings",
            "bandwidth",
            "cni-args",
            "default-route",
            "deviceID",
            "ipam-claim-reference",
            "NAME",
            "Interface",
            "hostPort",
            "containerPort",
            "ingressRate",
            "args",
            "cni",
            "type",
            "plugins",
        ])
        .prop_map(String::from),
        "\\PC{0,8}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(cases(256))]

    /// Any valid 1.1.0 result gives an annotation that is JSON, reads back
    /// to the entries, escapes as Go does, and places every address at
    /// most once, bare, where multus places it.
    #[test]
    fn network_status_of_any_result_reads_back(
        result in status_result_json(),
        name in "[a-z0-9/<>&-]{1,20}",
        primary in any::<bool>(),
        repeat in 1usize..3,
    ) {
        use plexus::k8s::status::{annotation, entries_from_value, NetworkStatus};
        let e = entries_from_value(&name, &result, primary, None).unwrap();
        let mut all = Vec::new();
        for _ in 0..repeat {
            all.extend(e.iter().cloned());
        }
        let text = annotation(&all);
        prop_assert!(!text.contains(['<', '>', '&', '\u{2028}']), "{}", text);
        let back: Vec<NetworkStatus> = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&back, &all);

        let ifaces = result["interfaces"].as_array().unwrap();
        let sandbox: Vec<usize> = (0..ifaces.len()).filter(|i| ifaces[*i].get("sandbox").is_some()).collect();
        let ips = result["ips"].as_array().unwrap();
        let expected_ips = if ifaces.len() == 1 {
            prop_assert_eq!(e.len(), 1);
            prop_assert_eq!(e[0].default, primary);
            ips.len()
        } else {
            prop_assert_eq!(e.len(), sandbox.len());
            prop_assert!(e.iter().filter(|s| s.default).count() <= usize::from(primary));
            ips.iter().filter(|ip| match ip.get("interface").and_then(|i| i.as_i64()) {
                Some(i) => usize::try_from(i).is_ok_and(|i| sandbox.contains(&i)),
                None => !sandbox.is_empty(),
            }).count()
        };
        if ifaces.len() != 1 {
            // Each sandbox interface's entry holds its indexed addresses;
            // the last also those without index, in result order.
            for (k, iface) in sandbox.iter().enumerate() {
                let mine: Vec<String> = ips.iter().filter(|ip| match ip.get("interface").and_then(|i| i.as_i64()) {
                    Some(i) => usize::try_from(i).is_ok_and(|i| i == *iface),
                    None => k + 1 == sandbox.len(),
                }).map(|ip| {
                    let a = ip["address"].as_str().unwrap().split('/').next().unwrap();
                    match a.parse::<std::net::IpAddr>().unwrap() {
                        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(v6.to_string(), |v4| v4.to_string()),
                        v4 => v4.to_string(),
                    }
                }).collect();
                prop_assert_eq!(&e[k].ips, &mine, "entry {}", k);
                prop_assert_eq!(e[k].interface.as_str(), ifaces[*iface]["name"].as_str().unwrap());
            }
        }
        let placed: Vec<&String> = e.iter().flat_map(|s| &s.ips).collect();
        prop_assert_eq!(placed.len(), expected_ips);
        for ip in placed {
            prop_assert!(ip.parse::<std::net::IpAddr>().is_ok_and(|a| !matches!(a, std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some())), "{}", ip);
        }
        for s in &e {
            for gw in &s.gateway {
                prop_assert!(gw == "<nil>" || gw.parse::<std::net::IpAddr>().is_ok(), "{}", gw);
            }
        }
    }

    /// Any bytes as a device-info file: no panic; what is read prints as
    /// JSON that reads back to the same.
    #[test]
    fn device_info_of_any_bytes_never_panics(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            "\\{(\"(type|pci|PCI|vdpa|memif|vhost-user|version|pci-address|x)\": ?(\"[a-z<]{0,4}\"|null|1|\\{\\}|\\[\\]),? ?){0,5}\\}".prop_map(String::into_bytes),
        ],
    ) {
        use plexus::device_info::DeviceInfo;
        if let Some(d) = DeviceInfo::parse(&bytes) {
            let text = serde_json::to_string(&d).unwrap();
            prop_assert_eq!(DeviceInfo::parse(text.as_bytes()), Some(d));
        }
    }

    /// Valid comma-form annotations print (`ns/name@ifname`) and parse back
    /// to the same selections; unqualified names get the pod's namespace.
    #[test]
    fn annotation_comma_form_print_then_parse_is_identity(
        items in prop::collection::vec(
            (prop::option::of(dns_label()), dns_label(), prop::option::of("[a-z][a-z0-9]{0,14}")),
            1..8,
        )
    ) {
        use plexus::selection::annotation::parse_networks_annotation;
        let text = items
            .iter()
            .map(|(ns, name, i)| {
                let mut s = ns.as_ref().map(|n| format!("{n}/")).unwrap_or_default();
                s.push_str(name);
                if let Some(i) = i {
                    s.push('@');
                    s.push_str(i);
                }
                s
            })
            .collect::<Vec<_>>()
            .join(" , ");
        let parsed = parse_networks_annotation(Some(&text), "pod-ns")
            .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        prop_assert_eq!(parsed.len(), items.len());
        for (s, (ns, name, i)) in parsed.iter().zip(&items) {
            prop_assert_eq!(s.namespace.as_str(), ns.as_deref().unwrap_or("pod-ns"));
            prop_assert_eq!(&s.name, name);
            prop_assert_eq!(&s.interface, i);
        }
        let printed = parsed.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
        let again = parse_networks_annotation(Some(&printed), "other-ns").unwrap();
        prop_assert_eq!(again, parsed);
    }

    /// Any JSON, as a list or bare, never panics the annotation parsers;
    /// what they accept is fully valid.
    #[test]
    fn annotation_json_form_never_panics(doc in json_value(), wrap in any::<bool>()) {
        use plexus::selection::annotation::{parse_default_network_annotation, parse_hardware_addr, parse_networks_annotation};
        let doc = if wrap { serde_json::Value::Array(vec![doc]) } else { doc };
        let text = doc.to_string();
        if let Ok(list) = parse_networks_annotation(Some(&text), "pod-ns") {
            for s in &list {
                prop_assert!(!s.name.is_empty() && !s.namespace.is_empty(), "{:?}", s);
                if let Some(i) = &s.interface {
                    prop_assert!(plexus::names::check_ifname(i).is_ok(), "{:?}", i);
                }
                if let Some(m) = &s.mac {
                    prop_assert!(parse_hardware_addr(m).is_some(), "{:?}", m);
                }
            }
        }
        if let Ok(Some(d)) = parse_default_network_annotation(Some(&text), "kube-system") {
            prop_assert!(!d.name.is_empty());
        }
        // The same document as a NAD's spec.config never panics either;
        // an accepted one always has a name and a type somewhere.
        if let Ok(d) = plexus::selection::nad::delegate_from_spec("ns", "nad", &text, doc.as_object()) {
            prop_assert!(!d.network_name().is_empty());
            let typed = if d.is_list { &d.config["plugins"][0]["type"] } else { &d.config["type"] };
            prop_assert!(typed.as_str().is_some_and(|t| !t.is_empty()), "{}", text);
        }
    }

    /// Hostile text (random, huge, repeated separators, deep nesting) gives
    /// an answer or an error, never a panic, within the bounds.
    #[test]
    fn annotation_hostile_text_is_bounded(
        s in "\\PC{0,60}|[a-z/@, \\[\\]{}\"]{0,60}",
        repeat in 1usize..20_000,
    ) {
        use plexus::selection::annotation::{parse_networks_annotation, MAX_ANNOTATION_BYTES};
        use plexus::selection::MAX_NETWORKS;
        if let Ok(list) = parse_networks_annotation(Some(&s), "ns") {
            prop_assert!(list.len() <= MAX_NETWORKS);
        }
        let big = s.repeat(repeat);
        if let Ok(list) = parse_networks_annotation(Some(&big), "ns") {
            prop_assert!(list.len() <= MAX_NETWORKS && big.len() <= MAX_ANNOTATION_BYTES);
        }
        let deep = format!("{}{}", "[".repeat(repeat), "]".repeat(repeat));
        let _ = parse_networks_annotation(Some(&deep), "ns");
    }
}
