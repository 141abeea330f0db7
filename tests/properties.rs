//! Property tests: generated inputs for the parsers and printers whose
//! example tests only cover a few hand-picked cases.

use std::time::Duration;

use plexus::duration;
use plexus::selection::{parse_networks, Element};
use proptest::prelude::*;

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(cases())]

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
    #![proptest_config(cases())]

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
