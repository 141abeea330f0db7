//! Durations written as strings in configuration files: `"500ms"`, `"10s"`,
//! `"2m"`, `"1h30m"` (Go's `time.ParseDuration` units, without signs).

use std::time::Duration;

/// Parses a duration string; the error says what is wrong with it.
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration; use a number with a unit, e.g. \"10s\"".into());
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!(
                "{text:?} is not a duration: expected a number at {rest:?}"
            ));
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| {
            format!(
                "{text:?} is not a duration: bad number {:?}",
                &rest[..num_len]
            )
        })?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per_unit: f64 = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => {
                return Err(format!(
                    "{text:?} has no unit; use ns, us, ms, s, m or h, e.g. \"10s\""
                ))
            }
            other => {
                return Err(format!(
                    "{text:?} has an unknown unit {other:?}; use ns, us, ms, s, m or h"
                ))
            }
        };
        let nanos = number * nanos_per_unit;
        if !nanos.is_finite() || nanos > 1e18 {
            return Err(format!("{text:?} is too long"));
        }
        // Round, not truncate: "524288.298s" is 524288.297999… s in binary.
        total += Duration::from_nanos(nanos.round() as u64);
    }
    Ok(total)
}

/// Formats a duration the way [`parse`] reads it (used in messages).
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_simple_units_should_work() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn parse_garbage_should_explain() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("10").unwrap_err().contains("no unit"));
        assert!(parse("10 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse("-1s").unwrap_err().contains("expected a number"));
        assert!(parse("1e300h").is_err());
    }
}
