//! Unit tests of [`super`].

use super::*;

#[test]
fn a_lists_subdirectory_should_add_plugins_unless_it_loads_only_inlined_ones() {
    let dir = tempfile::tempdir().unwrap();
    let list = |extra: &str| {
        format!(r#"{{"cniVersion":"1.0.0","name":"net",{extra}"plugins":[{{"type":"bridge"}}]}}"#)
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

/// The plugin types of the network `name` as `cache` loads it.
fn types_of(cache: &Cache, dir: &Path, name: &str) -> Vec<String> {
    let l = cache.load(dir, name).unwrap();
    (0..l.plugins.len())
        .map(|i| l.plugin_type(i).to_string())
        .collect()
}

fn single(name: &str, kind: &str) -> String {
    format!(r#"{{"cniVersion":"1.0.0","name":"{name}","type":"{kind}"}}"#)
}

#[test]
fn the_cache_should_read_again_whatever_changed_in_confdir() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cache = Cache::with_settle(Duration::ZERO);
    let file = d.join("10-a.conf");
    std::fs::write(&file, single("a", "aaaa")).unwrap();
    assert_eq!(types_of(&cache, d, "a"), ["aaaa"]);
    assert_eq!(types_of(&cache, d, "a"), ["aaaa"]);
    assert_eq!(cache.reads(), 1, "an unchanged network is not read again");

    // Edited in place: same inode, same size, right away (within the
    // same second); only the timestamps' nanoseconds differ.
    let before = std::fs::metadata(&file).unwrap();
    std::fs::write(&file, single("a", "bbbb")).unwrap();
    let after = std::fs::metadata(&file).unwrap();
    assert_eq!((before.ino(), before.len()), (after.ino(), after.len()));
    assert_eq!(types_of(&cache, d, "a"), ["bbbb"]);

    // Replaced by a rename.
    std::fs::write(d.join("new.tmp"), single("a", "cccc")).unwrap();
    std::fs::rename(d.join("new.tmp"), &file).unwrap();
    assert_eq!(types_of(&cache, d, "a"), ["cccc"]);

    // An earlier file with the same name wins; removing it, the later one.
    std::fs::write(d.join("05-a.conf"), single("a", "earlier")).unwrap();
    assert_eq!(types_of(&cache, d, "a"), ["earlier"]);
    std::fs::remove_file(d.join("05-a.conf")).unwrap();
    assert_eq!(types_of(&cache, d, "a"), ["cccc"]);

    // Removed: the network is gone.
    std::fs::remove_file(&file).unwrap();
    assert!(cache.load(d, "a").is_err());
    std::fs::write(&file, single("a", "dddd")).unwrap();
    assert_eq!(types_of(&cache, d, "a"), ["dddd"]);
    let reads = cache.reads();
    assert_eq!(types_of(&cache, d, "a"), ["dddd"]);
    assert_eq!(cache.reads(), reads);
}

#[test]
fn the_cache_should_read_again_when_a_lists_subdirectory_changes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cache = Cache::with_settle(Duration::ZERO);
    std::fs::write(
        d.join("10-net.conflist"),
        r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    assert_eq!(types_of(&cache, d, "net"), ["bridge"]);
    // The subdirectory appears with a plugin.
    std::fs::create_dir(d.join("net")).unwrap();
    std::fs::write(d.join("net/20-b.conf"), r#"{"type":"tuning"}"#).unwrap();
    assert_eq!(types_of(&cache, d, "net"), ["bridge", "tuning"]);
    // Another plugin added to it.
    std::fs::write(d.join("net/10-a.conf"), r#"{"type":"portmap"}"#).unwrap();
    assert_eq!(types_of(&cache, d, "net"), ["bridge", "portmap", "tuning"]);
    // One edited in place, same size.
    std::fs::write(d.join("net/10-a.conf"), r#"{"type":"portmop"}"#).unwrap();
    assert_eq!(types_of(&cache, d, "net"), ["bridge", "portmop", "tuning"]);
    let reads = cache.reads();
    assert_eq!(types_of(&cache, d, "net"), ["bridge", "portmop", "tuning"]);
    assert_eq!(cache.reads(), reads, "an unchanged list is not read again");
    // The subdirectory removed.
    std::fs::remove_dir_all(d.join("net")).unwrap();
    assert_eq!(types_of(&cache, d, "net"), ["bridge"]);
}

#[test]
fn the_cache_should_read_again_a_network_given_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cache = Cache::with_settle(Duration::ZERO);
    let file = d.join("x.conf");
    let by_path = file.to_str().unwrap();
    std::fs::write(&file, single("x", "aaaa")).unwrap();
    assert_eq!(
        types_of(&cache, Path::new("/nonexistent"), by_path),
        ["aaaa"]
    );
    std::fs::write(&file, single("x", "bbbb")).unwrap();
    assert_eq!(
        types_of(&cache, Path::new("/nonexistent"), by_path),
        ["bbbb"]
    );
    // A directory given by path: its first file.
    let by_dir = d.to_str().unwrap();
    assert_eq!(
        types_of(&cache, Path::new("/nonexistent"), by_dir),
        ["bbbb"]
    );
    std::fs::write(d.join("a.conf"), single("y", "first")).unwrap();
    assert_eq!(
        types_of(&cache, Path::new("/nonexistent"), by_dir),
        ["first"]
    );
}

#[test]
fn the_cache_should_not_keep_a_load_of_files_changed_just_before() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Files changed within the settle time may change again without
    // their timestamps moving (coarse clocks): such a load is not kept.
    let cache = Cache::with_settle(Duration::from_secs(3600));
    std::fs::write(d.join("10-a.conf"), single("a", "aaaa")).unwrap();
    assert_eq!(types_of(&cache, d, "a"), ["aaaa"]);
    assert_eq!(types_of(&cache, d, "a"), ["aaaa"]);
    assert_eq!(cache.reads(), 2);
}
