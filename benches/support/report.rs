//! The markdown report: machine description, tables, targets.

use std::fs;
use std::path::Path;

use crate::procs::output_of;

/// A markdown table.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let esc = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        let mut out = format!("| {} |\n", self.header.join(" | "));
        out.push_str(&format!(
            "|{}\n",
            self.header.iter().map(|_| "---|").collect::<String>()
        ));
        for r in &self.rows {
            let mut cells: Vec<String> = r.iter().map(|c| esc(c)).collect();
            cells.resize(self.header.len(), String::new());
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out
    }
}

/// One target line: what was promised and what was measured.
#[derive(Debug, Clone)]
pub struct Target {
    pub what: String,
    pub target: String,
    pub measured: String,
    /// `None` when it could not be measured.
    pub met: Option<bool>,
}

impl Target {
    pub fn new(what: &str, target: &str, measured: String, met: Option<bool>) -> Self {
        Self {
            what: what.into(),
            target: target.into(),
            measured,
            met,
        }
    }
}

/// `yes`, `**NO**` or `n/a`.
pub fn met(m: Option<bool>) -> String {
    match m {
        Some(true) => "yes".into(),
        Some(false) => "**NO**".into(),
        None => "n/a".into(),
    }
}

/// One scenario's part of the report.
#[derive(Debug, Clone, Default)]
pub struct Section {
    pub title: String,
    pub body: String,
    pub targets: Vec<Target>,
}

impl Section {
    pub fn new(title: &str) -> Self {
        Self {
            title: title.into(),
            ..Self::default()
        }
    }

    /// Appends a paragraph (or a rendered table).
    pub fn para(&mut self, text: &str) {
        if !self.body.is_empty() {
            self.body.push('\n');
        }
        self.body.push_str(text.trim_end());
        self.body.push('\n');
    }

    pub fn table(&mut self, t: &Table) {
        self.para(&t.render());
    }

    pub fn target(&mut self, t: Target) {
        self.targets.push(t);
    }
}

/// What the report says about the machine and the software under test.
pub fn machine(manifest_dir: &Path) -> Vec<(String, String)> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".into());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "?".into());
    let mem = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map(|k| format!("{:.1} GiB", k as f64 / (1024.0 * 1024.0)))
        .unwrap_or_else(|| "?".into());
    let plugins = output_of("dpkg-query", &["-W", "containernetworking-plugins"])
        .map(|s| s.replace('\t', " "))
        .unwrap_or_else(|| "not installed (dpkg-query failed)".into());
    let tmp = std::env::temp_dir();
    let fs_of = |p: &Path| {
        let Some(found) = output_of(
            "findmnt",
            &["-n", "-o", "FSTYPE,SOURCE", "-T", &p.to_string_lossy()],
        ) else {
            return "?".to_string();
        };
        let mut f = found.split_whitespace();
        let (fstype, source) = (f.next().unwrap_or("?"), f.next().unwrap_or("?"));
        let mut text = format!("{fstype} on {source}");
        if fstype == "ext4" {
            // A journalled ext4 has a /proc/fs/jbd2/<dev>-<n> entry.
            let dev = source.trim_start_matches("/dev/");
            let journal = fs::read_dir("/proc/fs/jbd2").ok().map(|rd| {
                rd.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{dev}-"))
                })
            });
            match journal {
                Some(true) => text.push_str(", with a journal"),
                Some(false) => text.push_str(", without a journal (no /proc/fs/jbd2 entry)"),
                None => {}
            }
        }
        text
    };
    let dir = manifest_dir.to_string_lossy().to_string();
    let commit = output_of("git", &["-C", &dir, "rev-parse", "--short", "HEAD"])
        .unwrap_or_else(|| "?".into());
    let dirty = output_of(
        "git",
        &["-C", &dir, "status", "--porcelain", "--untracked-files=no"],
    )
    .map(|s| {
        if s.is_empty() {
            String::new()
        } else {
            format!(" + uncommitted changes ({} file(s))", s.lines().count())
        }
    })
    .unwrap_or_default();
    let rustc = output_of("rustc", &["--version"]).unwrap_or_else(|| "?".into());
    vec![
        ("CPU".into(), format!("{cpu}, {cores} cores")),
        ("memory".into(), mem),
        ("kernel".into(), kernel),
        ("CNI plugins".into(), plugins),
        (
            "temp dir".into(),
            format!("{} ({})", tmp.display(), fs_of(&tmp)),
        ),
        ("load average at start".into(), load_average()),
        ("plexus".into(), format!("{commit}{dirty}")),
        ("compiler".into(), format!("{rustc}, bench profile")),
        (
            "plexus-shim of the `plexus` sides".into(),
            crate::setup::shim_kind().into(),
        ),
    ]
}

/// The current date and time in UTC, e.g. `2026-11-30 02:10 UTC`.
pub fn now_utc() -> String {
    output_of("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "?".into())
}

/// `/proc/loadavg`'s 1, 5 and 15 minute averages.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}
