//! The Prometheus text of a running plexusd, and sums and means of its
//! samples.

use std::path::Path;

use crate::support::http;

/// Sum of every sample of `name` whose labels contain all of `labels`.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, lab) = key.split_once('{').unwrap_or((key, ""));
        if n == name && labels.iter().all(|l| lab.contains(l)) {
            if let Ok(v) = value.parse::<f64>() {
                *sum.get_or_insert(0.0) += v;
            }
        }
    }
    sum
}

pub fn metrics_text(sock: &Path) -> String {
    http::request(sock, "GET", "/metrics", b"")
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_default()
}

/// Mean of a histogram between two scrapes, in milliseconds.
pub fn hist_mean_ms(before: &str, after: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let sum = |t: &str| metric(t, &format!("{name}_sum"), labels);
    let count = |t: &str| metric(t, &format!("{name}_count"), labels);
    let s = sum(after)? - sum(before).unwrap_or(0.0);
    let c = count(after)? - count(before).unwrap_or(0.0);
    (c > 0.0).then(|| s / c * 1000.0)
}
