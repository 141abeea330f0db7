//! `plexusd --check-config`: what start-up would find wrong, without
//! starting. It checks what start-up checks (the keys, the directories the
//! daemon writes, the kubeconfig) and what start-up only warns about but
//! an ADD would then fail on (the configured networks and their plugins,
//! `confDir`, `binDir`), and it says what is ignored: keys of multus's
//! thick plugin that mean nothing here, paths of multus's container
//! (`/host/...`), unknown keys (with the known key nearest to each), and a
//! missing file (the built-in defaults).
//!
//! Errors make it exit 78 (EX_CONFIG); warnings do too with `--strict`.
//! It creates nothing but a private scratch directory, removed at the end
//! (the networks are checked by the handler's own preflight, which needs an
//! engine, and an engine needs a state directory).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::cni::exec::Runner;
use crate::cni::state::Store;
use crate::config::{self, Config, PathScope, Role};
use crate::handler::CniHandler;
use crate::{cni, k8s};

use super::plugin_needs;

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Worth knowing; never fails the check.
    Note,
    /// Probably not what was meant; fails the check with `--strict`.
    Warning,
    /// The daemon would not start, or would fail ADDs.
    Error,
}

/// One thing the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub text: String,
}

/// Runs the check and prints its findings (`plexusd: error: ...` on
/// `err`) and the verdict (on `out`); the process's exit status.
pub fn run(config: &Config, strict: bool, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let findings = check(config);
    report(&config.path, &findings, strict, out, err)
}

/// Prints `findings` and the verdict; the exit status.
fn report(
    path: &Path,
    findings: &[Finding],
    strict: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
    let (errors, warnings) = (count(Severity::Error), count(Severity::Warning));
    for f in findings {
        let label = match f.severity {
            Severity::Error => "error",
            Severity::Warning if strict => "error (--strict)",
            Severity::Warning => "warning",
            Severity::Note => "note",
        };
        let _ = writeln!(err, "plexusd: {label}: {}", f.text);
    }
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let failed = errors > 0 || (strict && warnings > 0);
    let _ = if failed {
        writeln!(
            out,
            "{}: configuration is not usable: {}, {}{}",
            path.display(),
            plural(errors, "error"),
            plural(warnings, "warning"),
            if strict {
                " (--strict: warnings count)"
            } else {
                ""
            }
        )
    } else if warnings > 0 {
        writeln!(
            out,
            "{}: configuration is valid, with {}",
            path.display(),
            plural(warnings, "warning")
        )
    } else {
        writeln!(out, "{}: configuration is valid", path.display())
    };
    if failed {
        super::EXIT_CONFIG
    } else {
        0
    }
}

/// Everything the check finds, most serious first.
pub fn check(config: &Config) -> Vec<Finding> {
    let mut found = Vec::new();
    let raw = read_raw(config, &mut found);
    keys(config, raw.as_ref(), &mut found);
    if let Err(e) = config.check_paths(PathScope { socket_dir: true }) {
        found.extend(e.problems.iter().map(|p| error(p.to_string())));
    }
    directories(config, &mut found);
    let types = networks_and_kubernetes(config, &mut found);
    where_plugins_run(config, &types, &mut found);
    // Stable: the order of discovery within each severity.
    found.sort_by_key(|f| std::cmp::Reverse(f.severity));
    found
}

fn error(text: String) -> Finding {
    Finding {
        severity: Severity::Error,
        text,
    }
}

fn warning(text: String) -> Finding {
    Finding {
        severity: Severity::Warning,
        text,
    }
}

/// The file as JSON; `None` (and a warning) when there is no file.
fn read_raw(config: &Config, found: &mut Vec<Finding>) -> Option<serde_json::Map<String, Value>> {
    let path = &config.path;
    match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(Value::Object(map)) => Some(map),
            // Config::load already refused anything else.
            _ => None,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dirs: Vec<String> = config
                .cni
                .bin_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            found.push(warning(format!(
                "{}: no such file: plexusd would run on its built-in defaults (confDir {}, \
                 binDir {}, stateDir {}, socketDir {}, no cluster network: each call's network \
                 configuration must name one); write the file, or install the package's",
                path.display(),
                config.cni.conf_dir.display(),
                dirs.join(":"),
                config.cni.state_dir.display(),
                config.activation.socket_dir.display(),
            )));
            None
        }
        Err(e) => {
            found.push(error(format!("{}: cannot read it: {e}", path.display())));
            None
        }
    }
}

/// Unknown keys (with the nearest known one), multus keys that do
/// nothing here (with what to do instead), and multus's container paths.
fn keys(config: &Config, raw: Option<&serde_json::Map<String, Value>>, found: &mut Vec<Finding>) {
    let file = config.path.display();
    for key in &config.unknown_keys {
        let hint = config::nearest_known_key(key)
            .map(|k| format!("; did you mean {k:?}?"))
            .unwrap_or_default();
        found.push(warning(format!(
            "{file}: key {key:?} is not a plexusd or multus key and is ignored{hint}"
        )));
    }
    let Some(raw) = raw else {
        return;
    };
    let ignored = config::KEYS.iter().filter(|k| k.role == Role::Ignored);
    for key in ignored.filter(|k| raw.contains_key(k.name)) {
        found.push(warning(format!(
            "{file}: key {:?} is multus's and is ignored: {}",
            key.name, key.help
        )));
    }
    let mut host_paths = Vec::new();
    // Keys whose values are paths of the host (where `/host/...` is
    // multus's container's view of it).
    let path_keys = config::KEYS
        .iter()
        .filter(|k| k.kind.may_be_path() && k.role != Role::Ignored);
    for key in path_keys.map(|k| k.name) {
        let values: Vec<&str> = match raw.get(key) {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => continue,
        };
        for v in values {
            // binDir may list several directories.
            for part in v.split(':') {
                if part == "/host" || part.starts_with("/host/") {
                    host_paths.push((key, part.to_string()));
                }
            }
        }
    }
    for (key, path) in &host_paths {
        let here = path.strip_prefix("/host").unwrap_or(path);
        let here = if here.is_empty() { "/" } else { here };
        let exists = Path::new(path).exists();
        let text = format!(
            "{file}: key {key:?} is {path:?}, a path of multus's thick-plugin container, which \
             sees the host's file system under /host; plexusd runs on the host itself: use \
             {here:?}{}",
            if exists {
                " (this host has the /host path, so it is used as written)"
            } else {
                " (this host has no such path)"
            }
        );
        found.push(if exists { warning(text) } else { error(text) });
    }
}

/// `confDir` and `binDir`: present where ADDs need them.
fn directories(config: &Config, found: &mut Vec<Finding>) {
    let file = config.path.display();
    let cfg = config.selection.base();
    let conf_dir = &config.cni.conf_dir;
    if !conf_dir.is_dir() {
        let named = std::iter::once(&cfg.cluster_network)
            .chain(&cfg.default_networks)
            .any(|n| !n.is_empty() && !n.contains('/'));
        let text = format!(
            "{file}: key \"confDir\": {} is not a directory: networks named by clusterNetwork and \
             defaultNetworks, and NetworkAttachmentDefinitions without spec.config, are looked \
             up there",
            conf_dir.display()
        );
        found.push(if named { error(text) } else { warning(text) });
    }
    // A missing entry is normal (the packaged list names the node's and
    // the distribution's directory); none at all is worth a word. The
    // configured networks' plugins are checked one by one below.
    let bin_dirs = &config.cni.bin_dirs;
    if !bin_dirs.iter().any(|d| d.is_dir()) {
        let dirs: Vec<String> = bin_dirs.iter().map(|d| d.display().to_string()).collect();
        found.push(warning(format!(
            "{file}: key \"binDir\": none of [{}] is a directory: no plugin can be found there",
            dirs.join(", ")
        )));
    }
}

/// The configured networks and their plugins (as start-up's preflight
/// checks them) and the Kubernetes client's settings. The plugin types of
/// the networks that loaded, by network.
fn networks_and_kubernetes(
    config: &Config,
    found: &mut Vec<Finding>,
) -> Vec<(String, Vec<String>)> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            found.push(error(format!("cannot start an async runtime: {e}")));
            return Vec::new();
        }
    };
    let kubernetes = config.kubernetes.enabled();
    if kubernetes {
        if let Err(e) = runtime.block_on(k8s::client_config(&config.kubernetes)) {
            found.push(error(format!(
                "{}: {}",
                config.path.display(),
                crate::causes::chain(&e)
            )));
        }
    } else {
        found.push(Finding {
            severity: Severity::Note,
            text: "no kubeconfig and not in a cluster: plexusd serves the configured networks \
                   only (no pods' annotations, no NetworkAttachmentDefinitions)"
                .into(),
        });
    }
    let scratch = match Scratch::new() {
        Ok(s) => s,
        Err(e) => {
            found.push(error(format!(
                "cannot make a scratch directory to check the networks in: {e}"
            )));
            return Vec::new();
        }
    };
    let mut cni_config = config.cni.clone();
    cni_config.state_dir = scratch.0.clone();
    let problems = runtime.block_on(async {
        let store = Store::open(&cni_config.state_dir).map_err(|e| e.to_string())?;
        let runner = Runner::new(cni_config.bin_dirs.clone(), cni_config.plugin_timeout, None);
        let engine = cni::Engine::with_backends(cni_config, Arc::new(runner), Arc::new(store))
            .map_err(|e| e.msg)?;
        let handler = CniHandler::new(
            Arc::new(engine),
            config.selection.clone(),
            None,
            config.kubernetes.sync_timeout,
            config.limit.queue_timeout,
        );
        let problems = handler.preflight_problems().await;
        Ok::<_, String>((problems, handler.configured_plugin_types().await))
    });
    match problems {
        Err(e) => {
            found.push(error(format!("cannot check the networks: {e}")));
            Vec::new()
        }
        Ok((problems, types)) => {
            for p in problems {
                // In Kubernetes mode a network that is not a file may be a
                // NetworkAttachmentDefinition, which only the API can say.
                if kubernetes && !p.loaded {
                    found.push(warning(format!(
                        "{} (unless a NetworkAttachmentDefinition of that name serves it)",
                        p.msg
                    )));
                } else {
                    found.push(error(p.msg));
                }
            }
            types
        }
    }
}

/// Where plugins run: with `pluginSpawner`, whether its socket is there
/// and the spawner will accept binDir's plugins; without, what the
/// configured networks' plugins need that plexusd.service's sandbox does
/// not give them (see [`plugin_needs`]).
fn where_plugins_run(config: &Config, types: &[(String, Vec<String>)], found: &mut Vec<Finding>) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let file = config.path.display();
    if let Some(sock) = &config.cni.plugin_spawner {
        let listening = std::fs::metadata(sock).is_ok_and(|m| m.file_type().is_socket());
        if !listening {
            found.push(warning(format!(
                "{file}: key \"pluginSpawner\": {} is not a socket: no plugin can be started \
                 until plexus-plugins.socket listens there (systemctl enable --now \
                 plexus-plugins.socket)",
                sock.display()
            )));
        }
        for dir in &config.cni.bin_dirs {
            let Ok(md) = std::fs::metadata(dir) else {
                continue;
            };
            let others_write = md.mode() & 0o022 != 0 && md.mode() & 0o1000 == 0;
            if md.uid() != 0 || others_write {
                found.push(warning(format!(
                    "{file}: key \"binDir\": plexus-spawner runs no plugin from {}: it must be \
                     root's and writable by no one else",
                    dir.display()
                )));
            }
        }
        return;
    }
    let mut needed: Vec<&'static plugin_needs::Need> = Vec::new();
    for (network, plugins) in types {
        for plugin in plugins {
            let Some(need) = plugin_needs::lookup(plugin) else {
                continue;
            };
            found.push(warning(format!(
                "network {network:?}: plugin {plugin:?} runs inside plexusd.service's sandbox \
                 (no pluginSpawner): {}",
                need.effect
            )));
            if !needed.iter().any(|n| std::ptr::eq(*n, need)) {
                needed.push(need);
            }
        }
    }
    let text = if needed.is_empty() {
        "plugins run inside plexusd's own sandbox (no pluginSpawner); networks found later \
         (NetworkAttachmentDefinitions) may need more: docs/plugins.md"
            .to_string()
    } else {
        format!(
            "{file}: set \"pluginSpawner\": \"{}\" (as packaged) with plexus-plugins.socket \
             enabled, so that plugins run as the runtime would run them; or give them what \
             they need with a drop-in (systemctl edit plexusd.service):\n{}",
            crate::spawner::DEFAULT_SOCKET,
            plugin_needs::drop_in(&needed)
        )
    };
    found.push(Finding {
        severity: Severity::Note,
        text,
    });
}

/// A private directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir =
            std::env::temp_dir().join(format!("plexusd-check-{}-{nanos}", std::process::id()));
        // Fails on anything already there: nothing planted is used.
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(severity: Severity, text: &str) -> Finding {
        Finding {
            severity,
            text: text.into(),
        }
    }

    fn reported(findings: &[Finding], strict: bool) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = report(Path::new("/c.json"), findings, strict, &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn a_missing_file_should_be_a_warning_naming_the_defaults() {
        let path = Path::new("/nonexistent-plexus-dir/daemon-config.json");
        let config = Config::load(path, true).unwrap();
        let found = check(&config);
        let missing = found
            .iter()
            .find(|f| f.text.contains("no such file"))
            .expect("no finding about the missing file");
        assert_eq!(missing.severity, Severity::Warning);
        for part in [
            "/nonexistent-plexus-dir/daemon-config.json: no such file",
            &format!("confDir {}", config.cni.conf_dir.display()),
            &format!("stateDir {}", config.cni.state_dir.display()),
            "no cluster network",
        ] {
            assert!(missing.text.contains(part), "{part}: {}", missing.text);
        }
        // An explicit file that is missing is an error before any check.
        assert!(Config::load(path, false).is_err());
    }

    #[test]
    fn warnings_should_fail_only_when_strict_and_notes_never() {
        let w = [
            finding(Severity::Warning, "w1"),
            finding(Severity::Note, "n1"),
        ];
        let (code, out, err) = reported(&w, false);
        assert_eq!(code, 0);
        assert_eq!(out, "/c.json: configuration is valid, with 1 warning\n");
        assert_eq!(err, "plexusd: warning: w1\nplexusd: note: n1\n");
        let (code, out, err) = reported(&w, true);
        assert_eq!(code, 78);
        assert_eq!(
            out,
            "/c.json: configuration is not usable: 0 errors, 1 warning (--strict: warnings count)\n"
        );
        assert!(err.starts_with("plexusd: error (--strict): w1\n"), "{err}");
        let (code, out, _) = reported(&[finding(Severity::Note, "n")], true);
        assert_eq!(
            (code, out.as_str()),
            (0, "/c.json: configuration is valid\n")
        );
        let (code, out, _) = reported(&[finding(Severity::Error, "e")], false);
        assert_eq!(code, 78);
        assert!(out.contains("1 error, 0 warnings"), "{out}");
    }

    #[test]
    fn keys_should_be_judged_as_the_key_table_describes_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon-config.json");
        let text = r#"{"chrootDir": "/hostroot", "forceCNIVersion": true, "cniVersion": "0.3.1",
            "pluginSpawner": "/host/run/plexus/plugins.sock", "binDir": "/opt/cni/bin:/host/x",
            "podEvent": false}"#;
        std::fs::write(&path, text).unwrap();
        let config = Config::load(&path, false).unwrap();
        let raw = serde_json::from_str(text).unwrap();
        let mut found = Vec::new();
        keys(&config, Some(&raw), &mut found);
        let texts: Vec<&str> = found.iter().map(|f| f.text.as_str()).collect();
        let count = |part: &str| texts.iter().filter(|t| t.contains(part)).count();
        // Each ignored key with its advice from the table; a key
        // generate-config reads is not one.
        for key in ["chrootDir", "forceCNIVersion"] {
            let advice = config::key(key).unwrap().help;
            let want = format!("key {key:?} is multus's and is ignored: {advice}");
            assert!(texts.iter().any(|t| t.ends_with(&want)), "{texts:#?}");
        }
        assert_eq!(count("\"cniVersion\""), 0, "{texts:#?}");
        // Every key whose value may be a path is looked at for multus's
        // container paths.
        let spawner = "key \"pluginSpawner\" is \"/host/run/plexus/plugins.sock\"";
        assert_eq!(count(spawner), 1, "{texts:#?}");
        assert_eq!(count("key \"binDir\" is \"/host/x\""), 1, "{texts:#?}");
        assert!(
            texts.iter().any(
                |t| t.contains("key \"podEvent\" is not a plexusd or multus key")
                    && t.ends_with("did you mean \"podEvents\"?")
            ),
            "{texts:#?}"
        );
        assert_eq!(found.len(), 5, "{texts:#?}");
    }
}
