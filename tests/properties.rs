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
