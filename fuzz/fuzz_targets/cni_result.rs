//! CNI results of every version: parsing (`Success::from_value`,
//! `from_value_or`), conversion to every version from 0.1.0 to 1.1.0 (and
//! to nonsense), and printing. No input may panic, and for a result that
//! parses these must hold:
//! - only the supported versions convert; the others are `Unsupported`;
//! - a supported result converts to 1.x; one whose addresses are IP
//!   addresses converts to every supported version, and a converted
//!   result converts back to the version it came from (the daemon answers
//!   1.1.0, the shim converts that to the caller's version);
//! - the printed form (`to_pretty`, Go's layout) parses back to the same
//!   result, and `result::convert` agrees with `Success::convert`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus::result::{self, Error, Success};
use serde_json::Value;

const EVERY_VERSION: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.2.0", "", "1.1", "x",
];

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    // The daemon's ADD answer, `{"Result": ...}`: the shim reads the inner
    // result, taking a missing version to be the newest.
    if let Some(inner) = value.get("Result") {
        if let Ok(r) = Success::from_value_or(inner, result::LATEST) {
            for to in EVERY_VERSION {
                let _ = r.clone().convert(to).map(|c| c.to_pretty());
            }
        }
    }
    for fallback in EVERY_VERSION {
        let _ = Success::from_value_or(&value, fallback);
    }
    let Ok(parsed) = Success::from_value(&value) else {
        return;
    };
    let from = parsed.cni_version.clone();
    // An address whose family cannot be told is kept (libcni would refuse
    // it): converting such a result to 1.x works and to 0.x fails, by
    // design ("fail only when needed"). The round trips below hold for
    // results whose addresses are addresses.
    let every_family_known = parsed.ips.iter().all(|ip| {
        let addr = ip
            .address
            .split_once('/')
            .map_or(ip.address.as_str(), |(a, _)| a);
        addr.parse::<std::net::IpAddr>().is_ok()
    });
    if result::is_supported(&from) {
        // 1.x never needs a family.
        assert!(parsed.clone().convert("1.1.0").is_ok());
        assert!(parsed.clone().convert("1.0.0").is_ok());
        if every_family_known {
            for to in result::SUPPORTED {
                assert!(parsed.clone().convert(to).is_ok(), "{from:?} -> {to:?}");
            }
        }
    }
    for to in EVERY_VERSION {
        let converted = parsed.clone().convert(to);
        if !result::is_supported(&from) || !result::is_supported(to) {
            assert!(
                matches!(converted, Err(Error::Unsupported { .. })),
                "{from:?} -> {to:?}: {converted:?}"
            );
            continue;
        }
        let Ok(converted) = converted else {
            continue;
        };
        assert_eq!(converted.cni_version, *to);
        assert_eq!(
            result::convert(&value, to).ok(),
            Some(converted.to_value()),
            "{from:?} -> {to:?}"
        );

        if every_family_known {
            // Converting to its own version works when converting anywhere
            // does, and a converted result converts back.
            assert!(
                parsed.clone().convert(&from).is_ok(),
                "{to:?} converts but its own {from:?} does not"
            );
            if let Err(e) = converted.clone().convert(&from) {
                panic!("{from:?} -> {to:?} works, back to {from:?} fails: {e}");
            }
        }

        // The printed form reads back as the same result.
        let printed = converted.to_pretty();
        let reread: Value = serde_json::from_slice(&printed).expect("to_pretty prints JSON");
        let reread = Success::from_value(&reread).expect("a printed result parses");
        assert_eq!(reread, converted, "{}", String::from_utf8_lossy(&printed));
    }
});
