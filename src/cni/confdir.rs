//! Network configurations on disk: finding a network by name in `confDir`
//! (or by path) and reading its file. Parsing is [`super::types`]'s job.
//! Everything here blocks (directory listings and reads): call it on the
//! blocking pool.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::types::{ConfigError, NetworkList};

/// File name extensions of network configuration files.
const EXTENSIONS: &[&str] = &["conf", "conflist", "json"];

fn is_single(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()) != Some("conflist")
}

fn config_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ConfigError::File {
        file: dir.to_path_buf(),
        why: format!("cannot read the directory: {e}"),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e))
                && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

fn load_file(path: &Path) -> Result<NetworkList, ConfigError> {
    let text = std::fs::read(path).map_err(|e| ConfigError::File {
        file: path.to_path_buf(),
        why: format!("cannot read the file: {e}"),
    })?;
    if is_single(path) {
        return NetworkList::parse(path, &text, true);
    }
    let mut value: Value = serde_json::from_slice(&text).map_err(|e| ConfigError::File {
        file: path.to_path_buf(),
        why: format!("not valid JSON: {e}"),
    })?;
    if let Some(obj) = value.as_object_mut() {
        let inlined_only = matches!(obj.get("loadOnlyInlinedPlugins"), Some(Value::Bool(true)));
        if !inlined_only {
            if let (Some(Value::String(name)), Some(dir)) = (obj.get("name"), path.parent()) {
                let more = subdirectory_plugins(path, dir, name)?;
                if !more.is_empty() {
                    let plugins = obj
                        .entry("plugins")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(list) = plugins {
                        list.extend(more.into_iter().map(Value::Object));
                    }
                }
            }
        }
    }
    NetworkList::from_value(path, value, false)
}

/// A name libcni accepts as a plugin directory: an alphanumeric, then
/// alphanumerics, `_`, `.` and `-`.
pub fn is_plugin_dir_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// libcni's subdirectory plugin loading: the plugin configs in
/// `<dir>/<name>/*.conf`, in name order, appended to list `name` (read
/// from `file`). No such directory: none. The name must then be one that
/// can name a directory.
pub fn subdirectory_plugins(
    file: &Path,
    dir: &Path,
    name: &str,
) -> Result<Vec<Map<String, Value>>, ConfigError> {
    let sub = dir.join(name);
    if !sub.is_dir() {
        return Ok(Vec::new());
    }
    if !is_plugin_dir_name(name) {
        return Err(ConfigError::Field {
            file: file.to_path_buf(),
            key: "name".into(),
            why: format!("{name:?} cannot name a plugin directory"),
        });
    }
    let entries = std::fs::read_dir(&sub).map_err(|e| ConfigError::File {
        file: sub.clone(),
        why: format!("cannot read the directory: {e}"),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("conf") && p.is_file())
        .collect();
    files.sort();
    let mut plugins = Vec::with_capacity(files.len());
    for f in files {
        let text = std::fs::read(&f).map_err(|e| ConfigError::File {
            file: f.clone(),
            why: format!("cannot read the file: {e}"),
        })?;
        match serde_json::from_slice::<Value>(&text) {
            Ok(Value::Object(m))
                if m.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.is_empty()) =>
            {
                plugins.push(m)
            }
            Ok(_) => {
                return Err(ConfigError::File {
                    file: f,
                    why: "a plugin config must be a JSON object with a type".into(),
                })
            }
            Err(e) => {
                return Err(ConfigError::File {
                    file: f,
                    why: format!("not valid JSON: {e}"),
                })
            }
        }
    }
    Ok(plugins)
}

/// multus's auxiliary CNI chain: a list `name` of `cniVersion` made of
/// `passthru` followed by the plugins in `<directory of
/// cluster_network>/<name>/*.conf`; `None` when that adds no plugin (the
/// chain is then not run). `cluster_network` must be a path.
pub fn aux_chain(
    cluster_network: &str,
    name: &str,
    cni_version: &str,
) -> Result<Option<NetworkList>, ConfigError> {
    let file = Path::new(cluster_network);
    let dir = file.parent().unwrap_or(Path::new("/"));
    let plugins = subdirectory_plugins(file, dir, name)?;
    if plugins.is_empty() {
        return Ok(None);
    }
    let mut all = vec![serde_json::json!({"type": "passthru", "name": "passthru-cni"})];
    all.extend(plugins.into_iter().map(Value::Object));
    let value = serde_json::json!({"cniVersion": cni_version, "name": name, "plugins": all});
    NetworkList::from_value(&dir.join(name), value, false).map(Some)
}

/// Loads a network by name from `conf_dir` (the first file, in name order,
/// whose `name` matches), or from a path when `network` contains a `/`
/// (a file, or a directory whose first config file is used). Blocking.
pub fn load_network(conf_dir: &Path, network: &str) -> Result<NetworkList, ConfigError> {
    if network.contains('/') {
        let path = Path::new(network);
        if path.is_dir() {
            let first =
                config_files(path)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| ConfigError::File {
                        file: path.to_path_buf(),
                        why: "the directory holds no .conf, .conflist or .json file".into(),
                    })?;
            return load_file(&first);
        }
        return load_file(path);
    }
    let mut skipped = Vec::new();
    for file in config_files(conf_dir)? {
        match load_file(&file) {
            Ok(list) if list.name == network => return Ok(list),
            Ok(_) => {}
            Err(e) => skipped.push(e.to_string()),
        }
    }
    Err(ConfigError::NotFound {
        name: network.to_string(),
        dir: conf_dir.to_path_buf(),
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lists_subdirectory_should_add_plugins_unless_it_loads_only_inlined_ones() {
        let dir = tempfile::tempdir().unwrap();
        let list = |extra: &str| {
            format!(
                r#"{{"cniVersion":"1.0.0","name":"net",{extra}"plugins":[{{"type":"bridge"}}]}}"#
            )
        };
        std::fs::write(dir.path().join("10-net.conflist"), list("")).unwrap();
        std::fs::create_dir(dir.path().join("net")).unwrap();
        std::fs::write(dir.path().join("net/20-b.conf"), r#"{"type":"tuning"}"#).unwrap();
        std::fs::write(dir.path().join("net/10-a.conf"), r#"{"type":"portmap"}"#).unwrap();
        std::fs::write(dir.path().join("net/30-c.json"), r#"{"type":"ignored"}"#).unwrap();
        let types = |l: &NetworkList| -> Vec<String> {
            (0..l.plugins.len())
                .map(|i| l.plugin_type(i).to_string())
                .collect()
        };
        let l = load_network(dir.path(), "net").unwrap();
        assert_eq!(types(&l), ["bridge", "portmap", "tuning"]);
        std::fs::write(
            dir.path().join("10-net.conflist"),
            list(r#""loadOnlyInlinedPlugins":true,"#),
        )
        .unwrap();
        assert_eq!(types(&load_network(dir.path(), "net").unwrap()), ["bridge"]);
        // A plugin file that is not a plugin config fails the load.
        std::fs::write(dir.path().join("10-net.conflist"), list("")).unwrap();
        std::fs::write(dir.path().join("net/40-d.conf"), "[]").unwrap();
        let err = load_network(dir.path(), "net").unwrap_err().to_string();
        assert!(err.contains("40-d.conf"), "{err}");
    }

    #[test]
    fn the_auxiliary_chain_should_be_passthru_then_the_directorys_plugins() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = dir.path().join("10-cluster.conflist");
        let cluster = cluster.to_str().unwrap();
        assert!(aux_chain(cluster, "aux", "1.0.0").unwrap().is_none());
        std::fs::create_dir(dir.path().join("aux")).unwrap();
        assert!(aux_chain(cluster, "aux", "1.0.0").unwrap().is_none());
        std::fs::write(
            dir.path().join("aux/10-t.conf"),
            r#"{"type":"tuning","sysctl":{}}"#,
        )
        .unwrap();
        let l = aux_chain(cluster, "aux", "1.0.0").unwrap().unwrap();
        assert_eq!(l.name, "aux");
        assert_eq!(l.cni_version, "1.0.0");
        assert_eq!(l.plugin_type(0), "passthru");
        assert_eq!(l.plugin_type(1), "tuning");
        // A name that leaves the directory is refused.
        assert!(aux_chain(cluster, "..", "1.0.0").is_err());
    }

    #[test]
    fn load_network_should_find_by_name_and_report_unreadable_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("10-a.conflist"), b"{broken").unwrap();
        std::fs::write(
            dir.path().join("20-b.conf"),
            br#"{"cniVersion":"1.0.0","name":"b","type":"loopback"}"#,
        )
        .unwrap();
        assert_eq!(load_network(dir.path(), "b").unwrap().name, "b");
        let err = load_network(dir.path(), "c").unwrap_err().to_string();
        assert!(err.contains("10-a.conflist"), "{err}");
        let path = dir.path().join("20-b.conf");
        assert_eq!(
            load_network(dir.path(), path.to_str().unwrap())
                .unwrap()
                .name,
            "b"
        );
    }
}
