//! Network configurations on disk: finding a network by name in `confDir`
//! (or by path) and reading its file. Parsing is [`super::types`]'s job.
//! Everything here blocks (directory listings and reads): call it on the
//! blocking pool.

use std::path::{Path, PathBuf};

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
    NetworkList::parse(path, &text, is_single(path))
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
