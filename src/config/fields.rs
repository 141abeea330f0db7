//! Reading one key of the file by its kind: the check its value must
//! pass, what it becomes, and how a value of that kind is written in the
//! docs. [`super::keys`] names a kind for every key; the reader it
//! declares calls [`Fields::read`] with that kind.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use super::Problem;
use crate::{cni, duration, json, k8s, logging};

/// A kind of value: how a key of that kind is read and checked, and how a
/// value of it is shown (as it would be written in the file).
pub(super) trait Read {
    /// What the key becomes once checked.
    type Value;
    /// The checked value of `key`; `None` when it is absent or null, or
    /// wrong (then with a problem recorded).
    fn read(f: &mut Fields<'_>, key: &str) -> Option<Self::Value>;
    /// `value` as the file would have it (Markdown code, without the
    /// backticks).
    fn show(value: &Self::Value) -> String;
}

/// Typed access to the keys of one file, collecting problems.
pub(super) struct Fields<'a> {
    pub(super) file: &'a Path,
    obj: &'a Map<String, Value>,
    pub(super) problems: Vec<Problem>,
    /// The keys read, in order (for the test that every key is read).
    #[cfg(test)]
    pub(super) read: Vec<String>,
}

impl<'a> Fields<'a> {
    pub(super) fn new(file: &'a Path, obj: &'a Map<String, Value>) -> Self {
        Fields {
            file,
            obj,
            problems: Vec::new(),
            #[cfg(test)]
            read: Vec::new(),
        }
    }

    /// The checked value of `key`, read as kind `K`.
    pub(super) fn read<K: Read>(&mut self, key: &str) -> Option<K::Value> {
        #[cfg(test)]
        self.read.push(key.to_string());
        K::read(self, key)
    }

    pub(super) fn problem(&mut self, key: &str, why: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            why: why.into(),
        });
    }

    /// The value of `key`, treating JSON null like an absent key.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn string(&mut self, key: &str) -> Option<String> {
        match self.get(key)? {
            Value::String(s) => Some(s.clone()),
            other => {
                let why = format!("must be a string, found {}", json::kind(other));
                self.problem(key, why);
                None
            }
        }
    }

    /// A string, where an empty one counts as unset.
    fn text(&mut self, key: &str) -> Option<String> {
        self.string(key).filter(|s| !s.is_empty())
    }

    /// A path, or `""` for none (`Some(None)`).
    fn optional_path(&mut self, key: &str) -> Option<Option<PathBuf>> {
        let s = self.string(key)?;
        if s.is_empty() {
            return Some(None);
        }
        Some(Some(self.resolve(&s)))
    }

    fn path(&mut self, key: &str) -> Option<PathBuf> {
        let s = self.string(key)?;
        if s.is_empty() {
            self.problem(key, "must not be empty");
            return None;
        }
        Some(self.resolve(&s))
    }

    /// Relative paths are taken relative to the configuration file's
    /// directory, so a config and its network files can travel together.
    fn resolve(&self, p: &str) -> PathBuf {
        let path = Path::new(p);
        if path.is_absolute() {
            return path.to_path_buf();
        }
        match self.file.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }

    /// A network reference: a name, or (with a '/') a path, resolved like
    /// other paths.
    fn network_ref(&self, s: String) -> String {
        if s.contains('/') {
            self.resolve(&s).to_string_lossy().into_owned()
        } else {
            s
        }
    }

    /// multus's inline network configurations: a list of JSON objects.
    fn delegates(&mut self, key: &str) -> Option<Vec<Value>> {
        match self.get(key)? {
            Value::Array(items) if items.iter().all(Value::is_object) => Some(items.clone()),
            other => {
                let why = format!(
                    "must be a list of network configurations (JSON objects), found {}",
                    json::kind(other)
                );
                self.problem(key, why);
                None
            }
        }
    }

    /// A list of non-empty strings.
    fn string_list(&mut self, key: &str) -> Option<Vec<String>> {
        let v = self.get(key)?;
        let Value::Array(items) = v else {
            let why = format!("must be a list of strings, found {}", json::kind(v));
            self.problem(key, why);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) if !s.is_empty() => out.push(s.clone()),
                other => {
                    let why = format!(
                        "item {i} must be a non-empty string, found {}",
                        json::kind(other)
                    );
                    self.problem(key, why);
                    return None;
                }
            }
        }
        Some(out)
    }

    /// A ':'-separated list of absolute directories.
    fn search_path(&mut self, key: &str) -> Option<Vec<PathBuf>> {
        let s = self.string(key)?;
        let dirs: Vec<PathBuf> = s
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| self.resolve(d))
            .collect();
        if dirs.is_empty() {
            self.problem(key, "must name at least one directory");
            return None;
        }
        Some(dirs)
    }

    fn bool(&mut self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Value::Bool(b) => Some(*b),
            other => {
                let why = format!("must be true or false, found {}", json::kind(other));
                self.problem(key, why);
                None
            }
        }
    }

    fn positive(&mut self, key: &str) -> Option<usize> {
        let v = self.get(key)?;
        match v.as_i64() {
            Some(n) if n > 0 => usize::try_from(n).ok(),
            Some(n) => {
                self.problem(key, format!("must be greater than 0, got {n}"));
                None
            }
            None => {
                let why = format!(
                    "must be a whole number greater than 0, found {}",
                    json::kind(v)
                );
                self.problem(key, why);
                None
            }
        }
    }

    /// A whole number from 0 to 1000000.
    fn count(&mut self, key: &str) -> Option<u32> {
        let v = self.get(key)?;
        match v.as_i64() {
            Some(n) if (0..=1_000_000).contains(&n) => u32::try_from(n).ok(),
            _ => {
                let why = format!(
                    "must be a whole number from 0 to 1000000, found {}",
                    json::kind(v)
                );
                self.problem(key, why);
                None
            }
        }
    }

    fn port(&mut self, key: &str) -> Option<u16> {
        let v = self.get(key)?;
        match v.as_i64() {
            Some(n) if (1..=65535).contains(&n) => u16::try_from(n).ok(),
            _ => {
                self.problem(
                    key,
                    format!("must be a TCP port from 1 to 65535, found {v}"),
                );
                None
            }
        }
    }

    fn ip_addr(&mut self, key: &str) -> Option<IpAddr> {
        let s = self.string(key)?;
        match s.trim().parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                self.problem(
                    key,
                    format!(
                        "{s:?} is not an IP address (such as \"127.0.0.1\", \"0.0.0.0\" or \"::\")"
                    ),
                );
                None
            }
        }
    }

    fn duration(&mut self, key: &str) -> Option<Duration> {
        let v = self.get(key)?;
        let Value::String(s) = v else {
            let why = format!(
                "must be a duration string such as \"10s\" or \"500ms\", found {}",
                json::kind(v)
            );
            self.problem(key, why);
            return None;
        };
        match duration::parse(s) {
            Ok(d) => Some(d),
            Err(why) => {
                self.problem(key, why);
                None
            }
        }
    }

    fn nonzero_duration(&mut self, key: &str) -> Option<Duration> {
        let d = self.duration(key)?;
        if d.is_zero() {
            self.problem(key, "must be longer than zero");
            return None;
        }
        Some(d)
    }

    fn log_level(&mut self, key: &str) -> Option<logging::Level> {
        let s = self.string(key)?;
        match logging::Level::parse(&s) {
            Some(l) => Some(l),
            None => {
                self.problem(
                    key,
                    format!(
                        "unknown level {s:?}; use one of trace, debug, verbose, info, warn, error, panic"
                    ),
                );
                None
            }
        }
    }
}

/// The kinds, one type each; [`super::Kind`] has a variant of the same
/// name for the docs.
pub(super) mod kind {
    use super::*;

    /// A path; relative ones are taken from the file's directory.
    pub struct Path;
    /// A path, or `""` for none.
    pub struct OptionalPath;
    /// `:`-separated directories, searched in order.
    pub struct SearchPath;
    /// A string; an empty one counts as unset.
    pub struct Text;
    /// A network's name, or a path to its configuration.
    pub struct Network;
    /// A list of [`Network`]s.
    pub struct Networks;
    /// A list of non-empty strings.
    pub struct Strings;
    /// A list of inline network configurations.
    pub struct Delegates;
    pub struct Bool;
    /// A whole number above 0.
    pub struct Positive;
    /// A whole number from 0 to 1000000.
    pub struct Count;
    /// A TCP port.
    pub struct Port;
    /// An IP address.
    pub struct Address;
    /// A duration string ("10s"); "0" allowed.
    pub struct Duration;
    /// A duration string, longer than zero.
    pub struct NonZeroDuration;
    /// A log level, multus's names included.
    pub struct LogLevel;
    /// A Kubernetes node name; an empty one counts as unset.
    pub struct NodeName;
    /// The name of a directory of plugin configurations (multus's
    /// auxiliary chain); an empty one counts as unset.
    pub struct ChainName;

    /// A string as JSON writes it.
    fn quoted(s: &str) -> String {
        Value::from(s).to_string()
    }

    impl Read for Path {
        type Value = PathBuf;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<PathBuf> {
            f.path(key)
        }
        fn show(v: &PathBuf) -> String {
            v.display().to_string()
        }
    }

    impl Read for OptionalPath {
        type Value = Option<PathBuf>;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<Option<PathBuf>> {
            f.optional_path(key)
        }
        fn show(v: &Option<PathBuf>) -> String {
            v.as_ref()
                .map_or_else(|| quoted(""), |p| p.display().to_string())
        }
    }

    impl Read for SearchPath {
        type Value = Vec<PathBuf>;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<Vec<PathBuf>> {
            f.search_path(key)
        }
        fn show(v: &Vec<PathBuf>) -> String {
            let dirs: Vec<String> = v.iter().map(|d| d.display().to_string()).collect();
            dirs.join(":")
        }
    }

    impl Read for Text {
        type Value = String;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<String> {
            f.text(key)
        }
        fn show(v: &String) -> String {
            quoted(v)
        }
    }

    impl Read for Network {
        type Value = String;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<String> {
            let s = f.text(key)?;
            Some(f.network_ref(s))
        }
        fn show(v: &String) -> String {
            quoted(v)
        }
    }

    impl Read for Networks {
        type Value = Vec<String>;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<Vec<String>> {
            let list = f.string_list(key)?;
            Some(list.into_iter().map(|s| f.network_ref(s)).collect())
        }
        fn show(v: &Vec<String>) -> String {
            Value::from(v.clone()).to_string()
        }
    }

    impl Read for Strings {
        type Value = Vec<String>;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<Vec<String>> {
            f.string_list(key)
        }
        fn show(v: &Vec<String>) -> String {
            Value::from(v.clone()).to_string()
        }
    }

    impl Read for Delegates {
        type Value = Vec<Value>;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<Vec<Value>> {
            f.delegates(key)
        }
        fn show(v: &Vec<Value>) -> String {
            Value::from(v.clone()).to_string()
        }
    }

    impl Read for Bool {
        type Value = bool;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<bool> {
            f.bool(key)
        }
        fn show(v: &bool) -> String {
            v.to_string()
        }
    }

    impl Read for Positive {
        type Value = usize;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<usize> {
            f.positive(key)
        }
        fn show(v: &usize) -> String {
            v.to_string()
        }
    }

    impl Read for Count {
        type Value = u32;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<u32> {
            f.count(key)
        }
        fn show(v: &u32) -> String {
            v.to_string()
        }
    }

    impl Read for Port {
        type Value = u16;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<u16> {
            f.port(key)
        }
        fn show(v: &u16) -> String {
            v.to_string()
        }
    }

    impl Read for Address {
        type Value = IpAddr;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<IpAddr> {
            f.ip_addr(key)
        }
        fn show(v: &IpAddr) -> String {
            quoted(&v.to_string())
        }
    }

    impl Read for Duration {
        type Value = std::time::Duration;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<Self::Value> {
            f.duration(key)
        }
        fn show(v: &Self::Value) -> String {
            quoted(&duration::format(*v))
        }
    }

    impl Read for NonZeroDuration {
        type Value = std::time::Duration;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<Self::Value> {
            f.nonzero_duration(key)
        }
        fn show(v: &Self::Value) -> String {
            quoted(&duration::format(*v))
        }
    }

    impl Read for LogLevel {
        type Value = logging::Level;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<logging::Level> {
            f.log_level(key)
        }
        fn show(v: &logging::Level) -> String {
            quoted(&format!("{v:?}").to_ascii_lowercase())
        }
    }

    impl Read for NodeName {
        type Value = String;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<String> {
            let n = f.text(key)?;
            if !k8s::is_valid_node_name(&n) {
                f.problem(
                    key,
                    format!("{n:?} is not a Kubernetes node name (a lowercase DNS subdomain)"),
                );
            }
            Some(n)
        }
        fn show(v: &String) -> String {
            quoted(v)
        }
    }

    impl Read for ChainName {
        type Value = String;
        fn read(f: &mut Fields<'_>, key: &str) -> Option<String> {
            let name = f.text(key)?;
            if !cni::confdir::is_plugin_dir_name(&name) {
                f.problem(key, format!("{name:?} cannot name a plugin directory"));
            }
            Some(name)
        }
        fn show(v: &String) -> String {
            quoted(v)
        }
    }
}
