//! The soak's measurements and its report: readings of plexusd and its
//! state directory, the windows the run is cut into, the goals judged from
//! them, the `## 14. Soak` section of BENCHMARKS.md with its SVG plot, and
//! the splice that puts the section in its place. Nothing here starts a
//! process or makes a call: `benches/soak.rs` runs the soak and hands its
//! windows over.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use crate::report::{met, Table, Target};
use crate::stats::{fmt_bytes, fmt_kib, fmt_ms, fmt_ratio, ms, ratio, Samples};

/// The title line of the section; [`splice`] finds the section by it.
pub const TITLE: &str = "## 14. Soak";
/// RSS may grow by less than this many KiB per 10,000 calls.
pub const RSS_GOAL_KIB_PER_10K: f64 = 1.0;
/// A window's p99 may be at most this multiple of window 1's.
pub const P99_GOAL_RATIO: f64 = 1.10;

/// One reading of plexusd and its state directory.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// `VmRSS` of `/proc/<pid>/status`.
    pub rss_kib: u64,
    /// `RssAnon`: the part of RSS that is heap and stacks, not mapped files.
    pub anon_kib: u64,
    /// Entries of `/proc/<pid>/fd`.
    pub fds: u64,
    /// `Threads` of `/proc/<pid>/status`.
    pub threads: u64,
    /// Files and directories under the state dir, recursively, not
    /// counting the dir itself.
    pub state_entries: u64,
    /// The sum of the sizes (`st_size`) of the files among them.
    pub state_bytes: u64,
}

/// Reads plexusd `pid` and `state_dir`; an error names what could not be
/// read.
pub fn read(pid: i32, state_dir: &Path) -> Result<Reading, String> {
    let status_path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&status_path).map_err(|e| format!("{status_path}: {e}"))?;
    let field = |key: &str| -> Result<u64, String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| format!("{status_path}: no number on a `{key}:` line"))
    };
    let fd_dir = format!("/proc/{pid}/fd");
    let fds = fs::read_dir(&fd_dir)
        .map_err(|e| format!("{fd_dir}: {e}"))?
        .count() as u64;
    let (state_entries, state_bytes) = walk(state_dir)?;
    Ok(Reading {
        rss_kib: field("VmRSS")?,
        anon_kib: field("RssAnon")?,
        fds,
        threads: field("Threads")?,
        state_entries,
        state_bytes,
    })
}

/// The entries under `root` (not `root` itself) and the sizes of the files
/// among them, without following symbolic links. plexusd replaces its
/// records by renaming temporary files, so an entry that is gone by the time
/// it is looked at is skipped, not an error; `root` itself must exist.
fn walk(root: &Path) -> Result<(u64, u64), String> {
    let (mut entries, mut bytes) = (0, 0);
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let listing = match fs::read_dir(&dir) {
            Ok(l) => l,
            Err(e) if e.kind() == ErrorKind::NotFound && dir != root => continue,
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        };
        for entry in listing {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            // DirEntry::metadata does not follow a symbolic link.
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("{}: {e}", entry.path().display())),
            };
            entries += 1;
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.is_file() {
                bytes += meta.len();
            }
        }
    }
    Ok((entries, bytes))
}

/// One window of the soak (five minutes in the real run; any length works).
#[derive(Debug, Clone)]
pub struct Window {
    /// 1-based.
    pub index: usize,
    /// The fault injector was on during the window.
    pub faults: bool,
    /// Seconds since the soak began.
    pub start_s: f64,
    pub end_s: f64,
    /// CNI calls (ADD and DEL) answered since the soak began, at the
    /// window's end.
    pub calls_total: u64,
    /// Taken at the window's end.
    pub reading: Reading,
    /// Latencies of the ADDs answered in the window.
    pub add: Samples,
    /// Latencies of the DELs answered in the window.
    pub del: Samples,
    /// Calls that failed in the window.
    pub failed: u64,
    /// Faults injected in the window (0 when the injector was off).
    pub faults_injected: u64,
}

impl Window {
    /// The calls answered in the window.
    pub fn calls(&self) -> u64 {
        (self.add.len() + self.del.len()) as u64
    }

    /// Calls answered per second of the window; 0 for a window without
    /// length.
    pub fn calls_per_s(&self) -> f64 {
        let len = self.end_s - self.start_s;
        if len > 0.0 {
            self.calls() as f64 / len
        } else {
            0.0
        }
    }

    fn end_min(&self) -> f64 {
        self.end_s / 60.0
    }
}

/// Least-squares slope of y over x; `None` with fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let first = points.first()?.0;
    if points.iter().all(|p| p.0 == first) {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), &(x, y)| {
        (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx))
    });
    Some(sxy / sxx)
}

/// A count over the steady windows: its least and greatest value, and its
/// value in the first and in the last of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spread {
    pub min: u64,
    pub max: u64,
    pub first: u64,
    pub last: u64,
}

impl Spread {
    fn of(values: &[u64]) -> Option<Self> {
        Some(Self {
            min: *values.iter().min()?,
            max: *values.iter().max()?,
            first: *values.first()?,
            last: *values.last()?,
        })
    }

    /// `max - min`.
    pub fn range(&self) -> u64 {
        self.max - self.min
    }
}

/// The p99 of one kind of call in the steady window where it was highest
/// relative to window 1's.
#[derive(Debug, Clone, Copy)]
pub struct Drift {
    /// Window 1's p99.
    pub base: Duration,
    pub worst: Duration,
    /// The window of `worst`.
    pub window: usize,
    /// `worst / base`.
    pub ratio: f64,
}

/// What the report states about the goals. Everything but `failed` comes
/// from the steady windows: those with the fault injector off, without
/// window 1, which warms plexusd up (allocator arenas, caches, the first
/// records). Failures count in every window with the injector off, window 1
/// included: warming up may cost memory and time, never a call.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// The steady windows (their `index`).
    pub steady: Vec<usize>,
    /// RSS over the steady windows, in KiB.
    pub rss: Option<Spread>,
    /// Slope of RSS over the calls answered since the soak began, in KiB per
    /// 10,000 calls.
    pub rss_kib_per_10k: Option<f64>,
    pub fds: Option<Spread>,
    pub threads: Option<Spread>,
    pub state_entries: Option<Spread>,
    pub add_p99: Option<Drift>,
    pub del_p99: Option<Drift>,
    /// Failed calls in the windows with the fault injector off.
    pub failed: u64,
    /// How many windows had the fault injector off.
    pub fault_free_windows: usize,
}

/// The goals judged from `windows` (see [`Verdict`]).
pub fn verdict(windows: &[Window]) -> Verdict {
    let steady: Vec<&Window> = windows.iter().skip(1).filter(|w| !w.faults).collect();
    let spread = |f: fn(&Reading) -> u64| {
        Spread::of(&steady.iter().map(|w| f(&w.reading)).collect::<Vec<_>>())
    };
    let rss_points: Vec<(f64, f64)> = steady
        .iter()
        .map(|w| (w.calls_total as f64, w.reading.rss_kib as f64))
        .collect();
    let drift = |of: fn(&Window) -> &Samples| {
        let base = of(windows.first()?).p99()?;
        steady
            .iter()
            .filter_map(|w| {
                let worst = of(w).p99()?;
                let ratio = ratio(Some(worst), Some(base))?;
                Some(Drift {
                    base,
                    worst,
                    window: w.index,
                    ratio,
                })
            })
            .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
    };
    let fault_free: Vec<&Window> = windows.iter().filter(|w| !w.faults).collect();
    Verdict {
        steady: steady.iter().map(|w| w.index).collect(),
        rss: spread(|r| r.rss_kib),
        rss_kib_per_10k: slope(&rss_points).map(|s| s * 10_000.0),
        fds: spread(|r| r.fds),
        threads: spread(|r| r.threads),
        state_entries: spread(|r| r.state_entries),
        add_p99: drift(|w| &w.add),
        del_p99: drift(|w| &w.del),
        failed: fault_free.iter().map(|w| w.failed).sum(),
        fault_free_windows: fault_free.len(),
    }
}

impl Verdict {
    /// One line per goal: what, the goal, what was measured, and whether it
    /// was met (`None`: too few windows to tell).
    pub fn goals(&self) -> Vec<Target> {
        let (first, last) = (
            self.steady.first().copied().unwrap_or(0),
            self.steady.last().copied().unwrap_or(0),
        );
        let rss = match (self.rss_kib_per_10k, self.rss) {
            (Some(s), Some(r)) => format!(
                "{s:+.2} KiB (RSS {} KiB in window {first}, {} KiB in window {last})",
                r.first, r.last
            ),
            _ => "n/a (fewer than two steady windows)".into(),
        };
        let flat = |s: Option<Spread>| match s {
            Some(s) => format!("min {}, max {} (max − min {})", s.min, s.max, s.range()),
            None => "n/a (no steady window)".into(),
        };
        let entries = match self.state_entries {
            Some(s) => format!(
                "window {first}: {}, window {last}: {} (max − min {})",
                s.first,
                s.last,
                s.range()
            ),
            None => "n/a (no steady window)".into(),
        };
        let drift = |d: Option<Drift>| match d {
            Some(d) => format!(
                "worst {}: {} in window {} against {}",
                fmt_ratio(Some(d.ratio)),
                fmt_ms(Some(d.worst)),
                d.window,
                fmt_ms(Some(d.base))
            ),
            None => "n/a (no samples)".into(),
        };
        // A hair of tolerance, so that exactly +10% is within +10%.
        let within = |d: Option<Drift>| d.map(|d| d.ratio <= P99_GOAL_RATIO + 1e-9);
        let n = self.fault_free_windows;
        vec![
            Target::new(
                "RSS growth per 10,000 calls",
                "< 1 KiB",
                rss,
                self.rss_kib_per_10k.map(|s| s < RSS_GOAL_KIB_PER_10K),
            ),
            Target::new(
                "open descriptors",
                "no growth",
                flat(self.fds),
                self.fds.map(|s| s.range() == 0),
            ),
            Target::new(
                "threads",
                "no growth",
                flat(self.threads),
                self.threads.map(|s| s.range() == 0),
            ),
            Target::new(
                "state dir entries",
                "no growth from the first steady window to the last",
                entries,
                self.state_entries.map(|s| s.last <= s.first),
            ),
            Target::new(
                "ADD p99",
                "within +10% of window 1's",
                drift(self.add_p99),
                within(self.add_p99),
            ),
            Target::new(
                "DEL p99",
                "within +10% of window 1's",
                drift(self.del_p99),
                within(self.del_p99),
            ),
            Target::new(
                "failed calls with the fault injector off",
                "0",
                format!("{} in {n} window(s)", self.failed),
                (n > 0).then_some(self.failed == 0),
            ),
        ]
    }

    /// Every goal was measured and met.
    pub fn all_met(&self) -> bool {
        self.goals().iter().all(|t| t.met == Some(true))
    }
}

/// The markdown section for BENCHMARKS.md, starting with the line
/// [`TITLE`] and ending with a newline: `meta` (how the soak was run) as a
/// paragraph, the windows, the goals, and the plot at `svg_rel_path`
/// (relative to BENCHMARKS.md).
pub fn markdown(windows: &[Window], meta: &[String], svg_rel_path: &str) -> String {
    let mut out = format!("{TITLE}\n\n");
    let meta: Vec<&str> = meta
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    if !meta.is_empty() {
        out.push_str(&meta.join("\n"));
        out.push_str("\n\n");
    }
    out.push_str(
        "### Windows\n\n\
         One row per window. Calls, latencies, failures and faults count what was answered \
         in the window; the rest is read at its end: `VmRSS`, `RssAnon` and `Threads` from \
         `/proc/<pid>/status`, the entries of `/proc/<pid>/fd`, and every file and directory \
         under the state dir with the sum of the files' sizes.\n\n",
    );
    out.push_str(&windows_table(windows).render());
    let v = verdict(windows);
    let list: Vec<String> = v.steady.iter().map(|i| i.to_string()).collect();
    out.push_str(&format!(
        "\n### Goals\n\n\
         From the windows with the fault injector off, without window 1 (warm-up): {}. \
         RSS growth is the least-squares slope of RSS over the calls answered since the soak \
         began; p99 is compared with window 1's; failed calls count in every window with the \
         fault injector off, window 1 included.\n\n",
        if list.is_empty() {
            "none".into()
        } else {
            format!("window(s) {}", list.join(", "))
        }
    ));
    let mut goals = Table::new(&["goal", "measured", "met?"]);
    for t in v.goals() {
        goals.row(vec![
            format!("{}: {}", t.what, t.target),
            t.measured,
            met(t.met),
        ]);
    }
    out.push_str(&goals.render());
    out.push_str(
        "\n### Plot\n\n\
         RSS (left axis) and the p99 of ADD and of DEL (right axis) of each window, at the \
         window's end; shaded: the fault injector was on.\n\n",
    );
    // A destination with spaces or parentheses needs the <...> form.
    let dest = if svg_rel_path.contains([' ', '(', ')']) {
        format!("<{svg_rel_path}>")
    } else {
        svg_rel_path.to_string()
    };
    out.push_str(&format!(
        "![RSS and p99 of ADD and DEL per window of the soak]({dest})\n"
    ));
    out
}

/// The windows table, one row per window.
fn windows_table(windows: &[Window]) -> Table {
    let mut t = Table::new(&[
        "window",
        "fault injector",
        "end (min)",
        "calls",
        "calls since start",
        "calls/s",
        "ADD p50",
        "ADD p99",
        "DEL p50",
        "DEL p99",
        "failed",
        "faults injected",
        "RSS",
        "anon",
        "fds",
        "threads",
        "state entries",
        "state bytes",
    ]);
    for w in windows {
        let r = &w.reading;
        t.row(vec![
            w.index.to_string(),
            if w.faults { "on" } else { "off" }.into(),
            format!("{:.1}", w.end_min()),
            w.calls().to_string(),
            w.calls_total.to_string(),
            format!("{:.1}", w.calls_per_s()),
            fmt_ms(w.add.p50()),
            fmt_ms(w.add.p99()),
            fmt_ms(w.del.p50()),
            fmt_ms(w.del.p99()),
            w.failed.to_string(),
            w.faults_injected.to_string(),
            fmt_kib(Some(r.rss_kib)),
            fmt_kib(Some(r.anon_kib)),
            r.fds.to_string(),
            r.threads.to_string(),
            r.state_entries.to_string(),
            fmt_bytes(r.state_bytes),
        ]);
    }
    t
}

/// Where `## 14. Soak` begins in BENCHMARKS.md's text, and where it ends:
/// at the next `## ` line or at the end of the text.
fn section_bounds(text: &str) -> Option<(usize, usize)> {
    let is_title = |l: &str| {
        l.trim_end()
            .strip_prefix(TITLE)
            .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric()))
    };
    let (mut start, mut pos) = (None, 0);
    for line in text.split_inclusive('\n') {
        match start {
            None if is_title(line) => start = Some(pos),
            Some(s) if line.starts_with("## ") => return Some((s, pos)),
            _ => {}
        }
        pos += line.len();
    }
    start.map(|s| (s, text.len()))
}

/// The soak section of `benchmarks` (the text of BENCHMARKS.md), if it
/// has one: the report of `cargo bench --bench cni_path` keeps it.
pub fn section_of(benchmarks: &str) -> Option<&str> {
    section_bounds(benchmarks).map(|(start, end)| &benchmarks[start..end])
}

/// `benchmarks` (the text of BENCHMARKS.md) with the soak section replaced
/// by `section`: from the line [`TITLE`] up to, not including, the next line
/// starting with `## `, or to the end of the text; appended at the end after
/// one blank line when there is no such section.
pub fn splice(benchmarks: &str, section: &str) -> String {
    let section = section.trim_end_matches('\n');
    match section_bounds(benchmarks) {
        Some((start, end)) => {
            let after = &benchmarks[end..];
            let gap = if after.is_empty() { "\n" } else { "\n\n" };
            format!("{}{section}{gap}{after}", &benchmarks[..start])
        }
        None => {
            let before = benchmarks.trim_end();
            if before.is_empty() {
                format!("{section}\n")
            } else {
                format!("{before}\n\n{section}\n")
            }
        }
    }
}

// The plot: its size, the plot area within it (pixels), its colours.
const SVG_W: f64 = 800.0;
const SVG_H: f64 = 400.0;
const PLOT_L: f64 = 70.0;
const PLOT_R: f64 = 730.0;
const PLOT_T: f64 = 50.0;
const PLOT_B: f64 = 320.0;
const RSS_COLOUR: &str = "#1f77b4";
const ADD_COLOUR: &str = "#e6550d";
const DEL_COLOUR: &str = "#2ca02c";
const FAULT_COLOUR: &str = "#d62728";
const FAULT_OPACITY: f64 = 0.12;

/// A linear axis from `lo` to `hi` with a tick every `step`.
#[derive(Debug, Clone, Copy)]
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
}

impl Axis {
    /// Round bounds around `lo..=hi`, about six steps of 1, 2 or 5 times a
    /// power of ten.
    fn nice(lo: f64, hi: f64) -> Self {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        let raw = (hi - lo) / 6.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        let (a, b) = ((lo / step).floor() * step, (hi / step).ceil() * step);
        Self {
            lo: a,
            hi: if b > a { b } else { a + step },
            step,
        }
    }

    fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=n).map(|k| self.lo + k as f64 * self.step).collect()
    }

    fn label(&self, v: f64) -> String {
        let decimals = if self.step >= 1.0 {
            0
        } else {
            (-self.step.log10()).ceil() as usize
        };
        format!("{v:.decimals$}")
    }

    /// Where `v` lies from `lo` (0) to `hi` (1).
    fn frac(&self, v: f64) -> f64 {
        (v - self.lo) / (self.hi - self.lo)
    }
}

/// The three axes of the plot and their mapping to pixels.
struct Plot {
    minutes: Axis,
    rss_mib: Axis,
    p99_ms: Axis,
}

impl Plot {
    fn for_windows(windows: &[Window]) -> Self {
        let end = windows.iter().map(Window::end_min).fold(0.0, f64::max);
        let rss: Vec<f64> = windows.iter().map(|w| mib(w.reading.rss_kib)).collect();
        let (lo, hi) = match (
            rss.iter().copied().reduce(f64::min),
            rss.iter().copied().reduce(f64::max),
        ) {
            (Some(lo), Some(hi)) => (lo, hi),
            _ => (0.0, 1.0),
        };
        // At least a fifth of the highest RSS in view, so that a few KiB
        // of noise stay small, and a margin above and below.
        let pad = ((hi * 0.2).max(0.5) - (hi - lo)).max(0.0) / 2.0 + (hi - lo) * 0.05;
        let top = windows
            .iter()
            .flat_map(|w| [w.add.p99(), w.del.p99()])
            .flatten()
            .map(ms)
            .fold(0.0, f64::max);
        Self {
            minutes: Axis::nice(0.0, if end > 0.0 { end } else { 1.0 }),
            rss_mib: Axis::nice((lo - pad).max(0.0), hi + pad),
            p99_ms: Axis::nice(0.0, if top > 0.0 { top * 1.05 } else { 1.0 }),
        }
    }

    fn x(&self, minutes: f64) -> f64 {
        PLOT_L + self.minutes.frac(minutes) * (PLOT_R - PLOT_L)
    }

    fn y(axis: &Axis, v: f64) -> f64 {
        PLOT_B - axis.frac(v) * (PLOT_B - PLOT_T)
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Text for an SVG text node or attribute value.
fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A `<text>` element.
fn text(x: f64, y: f64, attrs: &str, s: &str) -> String {
    format!(
        "<text x=\"{x:.1}\" y=\"{y:.1}\" {attrs}>{}</text>\n",
        xml_escape(s)
    )
}

/// The shapes that tell the series apart without colour.
#[derive(Debug, Clone, Copy)]
enum Marker {
    Circle,
    Square,
    Diamond,
}

fn marker(m: Marker, x: f64, y: f64, colour: &str) -> String {
    match m {
        Marker::Circle => format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3.5\" fill=\"{colour}\"/>\n"),
        Marker::Square => format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"7\" height=\"7\" fill=\"{colour}\"/>\n",
            x - 3.5,
            y - 3.5
        ),
        Marker::Diamond => format!(
            "<polygon points=\"{x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1} {:.1},{y:.1}\" fill=\"{colour}\"/>\n",
            y - 4.5,
            x + 4.5,
            y + 4.5,
            x - 4.5
        ),
    }
}

/// One line of the plot: `points` in pixels, a gap where a window has no
/// value (a p99 without samples), a marker on every point.
fn series(points: &[Option<(f64, f64)>], colour: &str, dash: &str, m: Marker) -> String {
    let mut out = String::new();
    for run in points.split(Option::is_none).filter(|r| r.len() > 1) {
        let coords: Vec<String> = run
            .iter()
            .flatten()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        out.push_str(&format!(
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" \
             stroke-dasharray=\"{dash}\"/>\n",
            coords.join(" ")
        ));
    }
    for (x, y) in points.iter().flatten() {
        out.push_str(&marker(m, *x, *y, colour));
    }
    out
}

/// The shaded spans of the windows with the fault injector on; adjacent
/// windows make one span.
fn fault_spans(plot: &Plot, windows: &[Window]) -> String {
    let mut spans: Vec<(f64, f64)> = Vec::new();
    for w in windows.iter().filter(|w| w.faults) {
        match spans.last_mut() {
            Some(last) if w.start_s <= last.1 + 1e-6 => last.1 = last.1.max(w.end_s),
            _ => spans.push((w.start_s, w.end_s)),
        }
    }
    let mut out = String::new();
    for (a, b) in spans {
        let (xa, xb) = (plot.x(a / 60.0), plot.x(b / 60.0));
        out.push_str(&format!(
            "<rect x=\"{xa:.1}\" y=\"{PLOT_T}\" width=\"{:.1}\" height=\"{}\" fill=\"{FAULT_COLOUR}\" \
             fill-opacity=\"{FAULT_OPACITY}\"/>\n",
            (xb - xa).max(0.0),
            PLOT_B - PLOT_T
        ));
    }
    out
}

/// Grid, frame, ticks, tick labels and axis titles.
fn axes(plot: &Plot) -> String {
    let mut out = String::new();
    let end = "text-anchor=\"end\" dominant-baseline=\"middle\"";
    for v in plot.rss_mib.ticks() {
        let y = Plot::y(&plot.rss_mib, v);
        out.push_str(&format!(
            "<line x1=\"{PLOT_L}\" y1=\"{y:.1}\" x2=\"{PLOT_R}\" y2=\"{y:.1}\" stroke=\"#dddddd\"/>\n\
             <line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{PLOT_L}\" y2=\"{y:.1}\" stroke=\"#444444\"/>\n",
            PLOT_L - 5.0
        ));
        let attrs = format!("{end} fill=\"{RSS_COLOUR}\"");
        out.push_str(&text(PLOT_L - 8.0, y, &attrs, &plot.rss_mib.label(v)));
    }
    for v in plot.p99_ms.ticks() {
        let y = Plot::y(&plot.p99_ms, v);
        out.push_str(&format!(
            "<line x1=\"{PLOT_R}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#444444\"/>\n",
            PLOT_R + 5.0
        ));
        let attrs = "text-anchor=\"start\" dominant-baseline=\"middle\"";
        out.push_str(&text(PLOT_R + 8.0, y, attrs, &plot.p99_ms.label(v)));
    }
    for v in plot.minutes.ticks() {
        let x = plot.x(v);
        out.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{PLOT_B}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#444444\"/>\n",
            PLOT_B + 5.0
        ));
        let attrs = "text-anchor=\"middle\"";
        out.push_str(&text(x, PLOT_B + 19.0, attrs, &plot.minutes.label(v)));
    }
    out.push_str(&format!(
        "<rect x=\"{PLOT_L}\" y=\"{PLOT_T}\" width=\"{}\" height=\"{}\" fill=\"none\" \
         stroke=\"#444444\"/>\n",
        PLOT_R - PLOT_L,
        PLOT_B - PLOT_T
    ));
    let mid_y = (PLOT_T + PLOT_B) / 2.0;
    let rotated =
        |x: f64| format!("text-anchor=\"middle\" transform=\"rotate(-90 {x:.1} {mid_y:.1})\"");
    let rss_attrs = format!("{} fill=\"{RSS_COLOUR}\"", rotated(20.0));
    out.push_str(&text(20.0, mid_y, &rss_attrs, "RSS (MiB)"));
    out.push_str(&text(
        SVG_W - 14.0,
        mid_y,
        &rotated(SVG_W - 14.0),
        "p99 (ms)",
    ));
    let x_title = "text-anchor=\"middle\"";
    let mid_x = (PLOT_L + PLOT_R) / 2.0;
    out.push_str(&text(
        mid_x,
        PLOT_B + 40.0,
        x_title,
        "time since the soak began (min)",
    ));
    out
}

/// The legend, in a row under the x axis title.
fn legend() -> String {
    let y = SVG_H - 18.0;
    let mut out = String::new();
    let lines = [
        ("RSS (left axis)", RSS_COLOUR, "none", Marker::Circle),
        ("ADD p99 (right axis)", ADD_COLOUR, "7 4", Marker::Square),
        ("DEL p99 (right axis)", DEL_COLOUR, "2 3", Marker::Diamond),
    ];
    let mut x = PLOT_L;
    for (label, colour, dash, m) in lines {
        out.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" \
             stroke-width=\"2\" stroke-dasharray=\"{dash}\"/>\n",
            x + 28.0
        ));
        out.push_str(&marker(m, x + 14.0, y, colour));
        out.push_str(&text(x + 34.0, y, "dominant-baseline=\"middle\"", label));
        x += 170.0;
    }
    out.push_str(&format!(
        "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"28\" height=\"12\" fill=\"{FAULT_COLOUR}\" \
         fill-opacity=\"{FAULT_OPACITY}\" stroke=\"{FAULT_COLOUR}\" stroke-opacity=\"0.4\"/>\n",
        y - 6.0
    ));
    out.push_str(&text(
        x + 34.0,
        y,
        "dominant-baseline=\"middle\"",
        "fault injector on",
    ));
    out
}

/// An SVG 1.1 plot (800x400) of RSS (MiB, left axis) and the p99 of ADD and
/// DEL (ms, right axis) over time (minutes), one point per window at its
/// end, the windows with the fault injector on shaded.
pub fn svg(windows: &[Window]) -> String {
    let plot = Plot::for_windows(windows);
    let title = "plexusd during the soak: RSS and p99 of ADD and DEL per window";
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{SVG_W}\" \
         height=\"{SVG_H}\" viewBox=\"0 0 {SVG_W} {SVG_H}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<title>{}</title>\n\
         <rect width=\"{SVG_W}\" height=\"{SVG_H}\" fill=\"#ffffff\"/>\n",
        xml_escape(title)
    );
    out.push_str(&fault_spans(&plot, windows));
    out.push_str(&axes(&plot));
    let at = |axis: &Axis, v: Option<f64>, w: &Window| {
        v.map(|v| (plot.x(w.end_min()), Plot::y(axis, v)))
    };
    let rss: Vec<_> = windows
        .iter()
        .map(|w| at(&plot.rss_mib, Some(mib(w.reading.rss_kib)), w))
        .collect();
    let add: Vec<_> = windows
        .iter()
        .map(|w| at(&plot.p99_ms, w.add.p99().map(ms), w))
        .collect();
    let del: Vec<_> = windows
        .iter()
        .map(|w| at(&plot.p99_ms, w.del.p99().map(ms), w))
        .collect();
    out.push_str(&series(&add, ADD_COLOUR, "7 4", Marker::Square));
    out.push_str(&series(&del, DEL_COLOUR, "2 3", Marker::Diamond));
    out.push_str(&series(&rss, RSS_COLOUR, "none", Marker::Circle));
    out.push_str(&legend());
    let attrs = "text-anchor=\"middle\" font-size=\"15\"";
    out.push_str(&text(SVG_W / 2.0, 28.0, attrs, title));
    if windows.is_empty() {
        let attrs = "text-anchor=\"middle\" fill=\"#888888\"";
        out.push_str(&text(
            (PLOT_L + PLOT_R) / 2.0,
            (PLOT_T + PLOT_B) / 2.0,
            attrs,
            "no windows",
        ));
    }
    out.push_str("</svg>\n");
    out
}

/// Checks this module against synthetic windows, a real /proc and a temp
/// dir; panics on the first thing that is wrong. The soak bench runs it
/// with `PLEXUS_SOAK_SELF_CHECK=1`.
pub fn self_check() {
    check_slope();
    check_verdict();
    check_markdown_and_svg();
    check_splice();
    check_read();
}

/// Twelve five-minute windows of 6,000 calls: window 1 warming up (less
/// RSS, slower calls), then RSS flat but for a few KiB of noise plus
/// `leak_kib` per window, and the fault injector on in windows 9 to 12
/// (slower calls, failures, more descriptors and state entries).
fn synthetic(leak_kib: u64) -> Vec<Window> {
    const NOISE: [u64; 12] = [0, 3, 0, 4, 1, 3, 2, 0, 5, 9, 2, 7];
    let mut calls_total = 0;
    (1..=12usize)
        .map(|index| {
            let faults = index > 8;
            let slow: u32 = match (index, faults) {
                (1, _) => 3,
                (_, true) => 4,
                _ => 2,
            };
            let (mut add, mut del) = (Samples::new(), Samples::new());
            for k in 0..3000u64 {
                let jitter = Duration::from_micros(k * 7 % 500);
                add.push(Duration::from_millis(2) * slow + jitter);
                del.push(Duration::from_millis(1) * slow + jitter);
            }
            calls_total += 6000;
            let rss_kib = match index {
                1 => 9000,
                _ => 10_000 + NOISE[index - 1] + leak_kib * index as u64,
            };
            let extra = if faults { index as u64 } else { 0 };
            Window {
                index,
                faults,
                start_s: (index - 1) as f64 * 300.0,
                end_s: index as f64 * 300.0,
                calls_total,
                reading: Reading {
                    rss_kib,
                    anon_kib: rss_kib - 4000,
                    fds: 14 + extra,
                    threads: 6,
                    state_entries: 40 + extra,
                    state_bytes: (40 + extra) * 512,
                },
                add,
                del,
                failed: if faults { 3 } else { 0 },
                faults_injected: if faults { 25 } else { 0 },
            }
        })
        .collect()
}

fn check_slope() {
    let line: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 3.0 * x as f64 - 2.0)).collect();
    let s = slope(&line);
    assert!(s.is_some_and(|s| (s - 3.0).abs() < 1e-12), "slope {s:?}");
    let flat_x = [(2.0, 1.0), (2.0, 5.0)];
    assert_eq!(slope(&flat_x), None);
    assert_eq!(slope(&[(1.0, 1.0)]), None);
    assert_eq!(slope(&[]), None);
}

fn check_verdict() {
    let v = verdict(&synthetic(0));
    assert_eq!(v.steady, (2..=8).collect::<Vec<_>>());
    assert!(v.all_met(), "synthetic windows miss a goal: {v:#?}");
    assert_eq!(v.fds.map(|s| s.range()), Some(0));
    assert_eq!(v.fault_free_windows, 8);
    // Window 1 is slower than the steady windows.
    assert!(v.add_p99.is_some_and(|d| d.ratio < 1.0), "{v:#?}");

    // 2 KiB per window of 6,000 calls: 3.3 KiB per 10,000 calls.
    let leak = verdict(&synthetic(2));
    let rss = leak.rss_kib_per_10k.unwrap_or(0.0);
    assert!((rss - 2.0 * 10_000.0 / 6000.0).abs() < 0.5, "{rss}");
    assert!(!leak.all_met());
    assert_eq!(leak.goals()[0].met, Some(false));

    // A failure in window 1 counts; a steady window as slow as the ones with
    // faults misses the p99 goal.
    let mut w = synthetic(0);
    w[0].failed = 1;
    let slow = w[10].add.clone();
    w[4].add.extend(&slow);
    w[4].add.extend(&slow);
    let v = verdict(&w);
    let met: Vec<Option<bool>> = v.goals().iter().map(|t| t.met).collect();
    assert_eq!(v.failed, 1);
    assert_eq!(met.last(), Some(&Some(false)));
    assert_eq!(v.add_p99.map(|d| d.window), Some(5));
    assert_eq!(met[4], Some(false), "{v:#?}");

    let none = verdict(&[]);
    assert!(none.goals().iter().all(|t| t.met.is_none()));
}

fn check_markdown_and_svg() {
    let windows = synthetic(0);
    let meta = ["Run <here> & now.".to_string()];
    let md = markdown(&windows, &meta, "benches/soak.svg");
    assert!(md.starts_with(&format!("{TITLE}\n\nRun <here> & now.\n\n")));
    assert!(md.ends_with("(benches/soak.svg)\n"), "{md}");
    assert!(!md.contains("**NO**"), "{md}");
    assert_eq!(md.lines().filter(|l| l.starts_with("| 1")).count(), 4);
    let leaking = markdown(&synthetic(2), &[], "a plot.svg");
    assert!(leaking.contains("**NO**") && leaking.contains("(<a plot.svg>)"));

    for ws in [&windows[..], &windows[..1], &[]] {
        let s = svg(ws);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(balanced(&s), "unbalanced tags in {s}");
        assert!(entities_only(&s), "a bare & in {s}");
    }
    let s = svg(&windows);
    assert_eq!(s.matches("<polyline").count(), 3, "{s}");
    // Windows 9 to 12 make one shaded span.
    assert_eq!(
        s.matches(&format!("fill-opacity=\"{FAULT_OPACITY}\"/>"))
            .count(),
        1
    );
}

/// Every tag that opens is closed, in order (a check of the shape, not a
/// parser: no comments, CDATA or `>` inside attribute values).
fn balanced(xml: &str) -> bool {
    let mut open: Vec<&str> = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find('<') {
        let Some(j) = rest[i..].find('>') else {
            return false;
        };
        let tag = &rest[i + 1..i + j];
        rest = &rest[i + j + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            if open.pop() != Some(name.trim()) {
                return false;
            }
        } else if !tag.ends_with('/') {
            open.push(tag.split_whitespace().next().unwrap_or(""));
        }
    }
    open.is_empty() && !rest.contains('>')
}

/// Every `&` starts one of the five predefined entities.
fn entities_only(xml: &str) -> bool {
    xml.match_indices('&').all(|(i, _)| {
        ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
            .iter()
            .any(|e| xml[i..].starts_with(e))
    })
}

fn check_splice() {
    let section = format!("{TITLE}\n\nnew\n");
    let middle = format!("# B\n\n## 13. A\n\na\n\n{TITLE}\n\nold\n### sub\nold\n\n## 15. C\n\nc\n");
    let want = format!("# B\n\n## 13. A\n\na\n\n{section}\n## 15. C\n\nc\n");
    assert_eq!(splice(&middle, &section), want);
    assert_eq!(splice(&want, &section), want);
    assert_eq!(
        section_of(&want).map(str::trim_end),
        Some(section.trim_end())
    );
    assert_eq!(section_of("# B\n\n## 13. A\n"), None);

    let last = format!("# B\n\n## 13. A\n\na\n\n{TITLE}\n\nold\n");
    assert_eq!(
        splice(&last, &section),
        format!("# B\n\n## 13. A\n\na\n\n{section}")
    );

    let missing = "# B\n\n## 13. A\n\na\n";
    let appended = splice(missing, &section);
    assert_eq!(appended, format!("{missing}\n{section}"));
    assert_eq!(splice(&appended, &section), appended);
    // `## 14. Soaking` is another section.
    let other = "## 14. Soaking\n\nx\n";
    assert_eq!(splice(other, &section), format!("{other}\n{section}"));
}

fn check_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    fs::write(root.join("a"), b"12345").expect("write a");
    fs::create_dir(root.join("d")).expect("mkdir d");
    fs::write(root.join("d/b"), b"1234567").expect("write d/b");
    std::os::unix::fs::symlink("a", root.join("l")).expect("symlink");
    let me = std::process::id() as i32;
    let r = read(me, root).expect("read this process");
    assert_eq!((r.state_entries, r.state_bytes), (4, 12), "{r:?}");
    assert!(
        r.rss_kib > 0 && r.anon_kib > 0 && r.anon_kib <= r.rss_kib,
        "{r:?}"
    );
    assert!(r.fds >= 3 && r.threads >= 1, "{r:?}");

    let gone = read(i32::MAX, root).expect_err("no such process");
    assert!(
        gone.contains(&format!("/proc/{}/status", i32::MAX)),
        "{gone}"
    );
    let missing = root.join("missing");
    let err = read(me, &missing).expect_err("no such dir");
    assert!(err.contains(&missing.display().to_string()), "{err}");
}
