//! Order statistics over per-call durations and their formatting.

use std::time::Duration;

/// Durations of one kind of call.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    v: Vec<Duration>,
}

impl Samples {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, d: Duration) {
        self.v.push(d);
    }

    pub fn extend(&mut self, other: &Samples) {
        self.v.extend_from_slice(&other.v);
    }

    pub fn len(&self) -> usize {
        self.v.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// Nearest-rank quantile (`q` in 0..=1): the smallest sample with at
    /// least `q` of all samples at or below it.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.v.is_empty() {
            return None;
        }
        let mut s = self.v.clone();
        s.sort();
        let rank = (q * s.len() as f64).ceil().max(1.0) as usize;
        Some(s[rank.min(s.len()) - 1])
    }

    pub fn p50(&self) -> Option<Duration> {
        self.quantile(0.5)
    }

    pub fn p99(&self) -> Option<Duration> {
        self.quantile(0.99)
    }

    pub fn max(&self) -> Option<Duration> {
        self.v.iter().max().copied()
    }

    pub fn mean(&self) -> Option<Duration> {
        if self.v.is_empty() {
            return None;
        }
        Some(self.v.iter().sum::<Duration>() / self.v.len() as u32)
    }
}

/// Milliseconds as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `4.21 ms`, `0.712 ms`, `1234 ms`; `n/a` for nothing.
pub fn fmt_ms(d: Option<Duration>) -> String {
    match d {
        None => "n/a".into(),
        Some(d) => fmt_ms_f(ms(d)),
    }
}

/// [`fmt_ms`] for a value already in milliseconds.
pub fn fmt_ms_f(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0} ms")
    } else if v.abs() >= 10.0 {
        format!("{v:.1} ms")
    } else if v.abs() >= 1.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.3} ms")
    }
}

/// `plexus / direct` as `1.23x`.
pub fn ratio(plexus: Option<Duration>, direct: Option<Duration>) -> Option<f64> {
    match (plexus, direct) {
        (Some(p), Some(d)) if !d.is_zero() => Some(p.as_secs_f64() / d.as_secs_f64()),
        _ => None,
    }
}

pub fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".into(), |r| format!("{r:.2}x"))
}

/// Signed difference `plexus - direct` in milliseconds, e.g. `+1.20 ms`.
pub fn fmt_delta(plexus: Option<Duration>, direct: Option<Duration>) -> String {
    match (plexus, direct) {
        (Some(p), Some(d)) => {
            let v = ms(p) - ms(d);
            let s = fmt_ms_f(v.abs());
            if v < 0.0 {
                format!("-{s}")
            } else {
                format!("+{s}")
            }
        }
        _ => "n/a".into(),
    }
}

/// Bytes as `1234567 B (1.18 MiB)`.
pub fn fmt_bytes(b: u64) -> String {
    format!("{b} B ({:.2} MiB)", b as f64 / (1024.0 * 1024.0))
}

/// KiB as `3.4 MiB (3480 KiB)`.
pub fn fmt_kib(k: Option<u64>) -> String {
    k.map_or_else(
        || "n/a".into(),
        |k| format!("{:.1} MiB ({k} KiB)", k as f64 / 1024.0),
    )
}
