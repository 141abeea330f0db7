//! Unit tests of [`super`].

use super::*;

fn parse(text: &str) -> Result<Config> {
    Config::from_json(Path::new("/etc/plexus/daemon-config.json"), text.as_bytes())
}

#[test]
fn kubernetes_keys_should_default_and_be_checked() {
    let c = parse("{}").unwrap();
    assert_eq!(c.kubernetes.kubeconfig, None);
    assert_eq!(c.kubernetes.node_name, k8s::host_node_name());
    assert_eq!(c.kubernetes.sync_timeout, k8s::DEFAULT_SYNC_TIMEOUT);
    assert_eq!(c.kubernetes.request_timeout, k8s::DEFAULT_REQUEST_TIMEOUT);
    let c = parse(
        r#"{"kubeconfig": "kube/node.conf", "nodeName": "worker-1.example",
                "kubernetesSyncTimeout": "5s", "kubernetesRequestTimeout": "2s"}"#,
    )
    .unwrap();
    assert_eq!(
        c.kubernetes.kubeconfig.as_deref(),
        Some(Path::new("/etc/plexus/kube/node.conf"))
    );
    assert_eq!(c.kubernetes.node_name, "worker-1.example");
    assert_eq!(c.kubernetes.sync_timeout, Duration::from_secs(5));
    assert_eq!(c.kubernetes.request_timeout, Duration::from_secs(2));
    let e =
        parse(r#"{"kubeconfig": "", "nodeName": "Worker_1", "kubernetesRequestTimeout": "0s"}"#)
            .unwrap_err();
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["kubeconfig", "nodeName", "kubernetesRequestTimeout"]);
}

#[test]
fn the_auxiliary_chain_should_need_a_cluster_network_path_and_a_plain_name() {
    let c = parse(
            r#"{"clusterNetwork": "/etc/cni/net.d/10-flannel.conflist", "auxiliaryCNIChainName": "aux-1"}"#,
        )
        .unwrap();
    assert_eq!(c.selection.base().auxiliary_chain.as_deref(), Some("aux-1"));
    // The call's configuration may name the path (generate-config's
    // clusterNetwork).
    parse(r#"{"auxiliaryCNIChainName": "aux"}"#).unwrap();
    for bad in [
        r#"{"clusterNetwork": "flannel", "auxiliaryCNIChainName": "aux"}"#,
        r#"{"clusterNetwork": "/etc/cni/net.d/a.conf", "auxiliaryCNIChainName": "../aux"}"#,
    ] {
        let e = parse(bad).unwrap_err();
        assert_eq!(e.problems[0].key, "auxiliaryCNIChainName", "{bad}");
    }
    let c = parse(r#"{"clusterNetwork": "flannel", "auxiliaryCNIChainName": ""}"#).unwrap();
    assert_eq!(c.selection.base().auxiliary_chain, None);
}

#[test]
fn delegates_should_be_a_list_of_network_configurations() {
    let c = parse(r#"{"delegates": [{"name": "a", "type": "bridge"}]}"#).unwrap();
    assert!(c.selection.base().has_networks());
    assert_eq!(c.selection.base().delegates.len(), 1);
    assert!(!c.selection.open_keys().contains(&"delegates"));
    for bad in [r#"{"delegates": "a"}"#, r#"{"delegates": [1]}"#] {
        assert_eq!(
            parse(bad).unwrap_err().problems[0].key,
            "delegates",
            "{bad}"
        );
    }
    let e = parse(r#"{"delegates": [{"name": "a"}], "auxiliaryCNIChainName": "aux"}"#).unwrap_err();
    assert_eq!(e.problems[0].key, "auxiliaryCNIChainName");
}

#[test]
fn empty_object_should_give_defaults() {
    let c = parse("{}").unwrap();
    assert_eq!(c.activation.socket_dir, PathBuf::from("/run/plexus"));
    assert_eq!(
        c.limit.connection_limit,
        Some(crate::limit::default_connection_limit())
    );
    assert_eq!(
        c.limit.delete_limit,
        Some(crate::limit::default_delete_limit())
    );
    assert_eq!(c.limit.queue_timeout, DEFAULT_QUEUE_TIMEOUT);
    assert_eq!(c.limit.max_connections.get(), DEFAULT_MAX_CONNECTIONS);
    assert_eq!(c.server.read_timeout, DEFAULT_READ_TIMEOUT);
    assert_eq!(c.lifecycle.shutdown_timeout, DEFAULT_SHUTDOWN_TIMEOUT);
    assert_eq!(c.lifecycle.idle_timeout, None);
    assert!(c.logging.to_stderr);
    assert_eq!(
        c.lifecycle.metrics_bind_address,
        DEFAULT_METRICS_BIND_ADDRESS
    );
}

#[test]
fn metrics_bind_address_should_parse_and_bad_ones_fail() {
    let c = parse(r#"{"metricsPort":9091,"metricsBindAddress":"::"}"#).unwrap();
    assert_eq!(
        c.lifecycle.metrics_bind_address,
        "::".parse::<IpAddr>().unwrap()
    );
    let err = parse(r#"{"metricsBindAddress":"localhost"}"#).unwrap_err();
    assert_eq!(err.problems[0].key, "metricsBindAddress");
    assert!(parse(r#"{"metricsBindAddress":7}"#).is_err());
}

#[test]
fn check_paths_should_name_each_untrusted_key() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let open = t.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = Config::from_json(
            &t.path().join("c.json"),
            br#"{"socketDir":"open/sock","stateDir":"open","cniDir":"open/multus","logFile":"open/x.log","clusterNetwork":"n"}"#,
        )
        .unwrap();
    let err = cfg.check_paths(PathScope { socket_dir: true }).unwrap_err();
    let keys: Vec<_> = err.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        ["socketDir", "stateDir", "cniDir", "logFile"],
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!("{} is writable", open.display())),
        "{text}"
    );
    assert!(text.contains("mode 0777"), "{text}");
    let err = cfg
        .check_paths(PathScope { socket_dir: false })
        .unwrap_err();
    assert_eq!(err.problems.len(), 3);
    assert_eq!(
        cfg.cni.cni_dir,
        t.path().join("open/multus"),
        "cniDir is resolved like the other paths"
    );
    let defaults = Config::from_json(&t.path().join("c.json"), b"{}").unwrap();
    assert_eq!(
        defaults.cni.cni_dir,
        Path::new(cni::multus_cache::DEFAULT_CNI_DIR)
    );
    let fine = Config::from_json(&t.path().join("c.json"), br#"{"socketDir":"sock"}"#).unwrap();
    fine.check_paths(PathScope { socket_dir: true }).unwrap();
}

#[test]
fn body_budget_should_parse_and_never_go_below_one_body() {
    let c = parse(r#"{"bodyBudgetBytes":67108864}"#).unwrap();
    assert_eq!(c.server.body_budget_bytes, 64 << 20);
    let c = parse(r#"{"bodyBudgetBytes":1000}"#).unwrap();
    assert_eq!(c.server.body_budget_bytes, api::MAX_BODY_BYTES);
    assert!(parse(r#"{"bodyBudgetBytes":0}"#).is_err());
}

#[test]
fn multus_keys_should_be_accepted() {
    let c = parse(
        r#"{"socketDir":"/run/multus/","connectionLimit":4,"logLevel":"verbose",
                "logFile":"/var/log/plexus.log","multusConfigFile":"auto","cniVersion":"0.3.1",
                "clusterNetwork":"flannel","binDir":"/usr/lib/cni","queueTimeout":"500ms"}"#,
    )
    .unwrap();
    assert_eq!(c.limit.connection_limit.map(|n| n.get()), Some(4));
    assert_eq!(c.limit.queue_timeout, Duration::from_millis(500));
    assert_eq!(
        c.server.body_budget_bytes,
        server::DEFAULT_BODY_BUDGET_BYTES
    );
    assert_eq!(c.logging.level, logging::Level::Info);
    assert!(!c.logging.to_stderr);
    assert!(c.unknown_keys.is_empty());
}

#[test]
fn engine_keys_should_parse_and_relative_paths_follow_the_file() {
    let c = Config::from_json(
        Path::new("/srv/plexus/daemon-config.json"),
        br#"{"confDir":"net.d","stateDir":"/var/lib/x","binDir":"/a:bin","pluginTimeout":"5s",
                "clusterNetwork":"cluster","defaultNetworks":["extra","./more.conflist"]}"#,
    )
    .unwrap();
    assert_eq!(c.cni.conf_dir, PathBuf::from("/srv/plexus/net.d"));
    assert_eq!(c.cni.state_dir, PathBuf::from("/var/lib/x"));
    assert_eq!(
        c.cni.bin_dirs,
        vec![PathBuf::from("/a"), PathBuf::from("/srv/plexus/bin")]
    );
    assert_eq!(c.cni.plugin_timeout, Duration::from_secs(5));
    let sel = c.selection.base();
    assert_eq!(sel.cluster_network, "cluster");
    assert_eq!(
        sel.default_networks,
        ["extra", "/srv/plexus/./more.conflist"]
    );
    let defaults = parse("{}").unwrap();
    assert!(!defaults.selection.base().has_networks());
    assert_eq!(
        defaults.selection.open_keys(),
        selection::overlay::REQUEST_KEYS,
        "a file without network keys leaves them all to the call"
    );
    assert!(!c.selection.open_keys().contains(&"clusterNetwork"));
    assert!(!c.selection.open_keys().contains(&"confDir"));
    assert!(c.selection.open_keys().contains(&"multusNamespace"));
    assert_eq!(
        defaults.cni.plugin_timeout,
        crate::cni::DEFAULT_PLUGIN_TIMEOUT
    );
    let err = parse(r#"{"defaultNetworks":"x","pluginTimeout":"0s"}"#).unwrap_err();
    assert_eq!(err.problems.len(), 2, "{err}");
}

#[test]
fn cleanup_keys_should_parse_with_their_bounds() {
    let c =
        parse(r#"{"delErrorsReported":0,"cleanupRetryInterval":"250ms","cleanupGiveUpAfter":7}"#)
            .unwrap();
    assert_eq!(c.cni.cleanup.errors_reported, 0);
    assert_eq!(c.cni.cleanup.retry_interval, Duration::from_millis(250));
    assert_eq!(c.cni.cleanup.give_up_after, 7);
    assert_eq!(
        parse("{}").unwrap().cni.cleanup,
        crate::cni::CleanupPolicy::default()
    );
    let err =
        parse(r#"{"delErrorsReported":-1,"cleanupRetryInterval":"0s","cleanupGiveUpAfter":0}"#)
            .unwrap_err();
    let keys: Vec<_> = err.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "delErrorsReported",
            "cleanupRetryInterval",
            "cleanupGiveUpAfter"
        ]
    );
}

#[test]
fn delete_limit_should_bound_the_del_slots_apart() {
    let c = parse(r#"{"connectionLimit": 4, "deleteLimit": 12}"#).unwrap();
    assert_eq!(c.limit.connection_limit.map(|n| n.get()), Some(4));
    assert_eq!(c.limit.delete_limit.map(|n| n.get()), Some(12));
    assert_eq!(c.limit.slots(), Some(16));
    // connectionLimit alone leaves the DEL slots at their default.
    let c = parse(r#"{"connectionLimit": 2}"#).unwrap();
    assert_eq!(
        c.limit.delete_limit,
        Some(crate::limit::default_delete_limit())
    );
    for bad in [
        r#"{"deleteLimit": 0}"#,
        r#"{"deleteLimit": -3}"#,
        r#"{"deleteLimit": "8"}"#,
    ] {
        let e = parse(bad).unwrap_err();
        assert_eq!(e.problems.len(), 1, "{bad}: {e}");
        assert_eq!(e.problems[0].key, "deleteLimit", "{bad}");
    }
}

#[test]
fn three_mistakes_should_all_be_reported() {
    let err =
        parse(r#"{"connectionLimit":0,"readTimeout":"soon","logToStderr":"yes"}"#).unwrap_err();
    let keys: Vec<_> = err.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["connectionLimit", "readTimeout", "logToStderr"]);
    let text = err.to_string();
    assert!(text.contains("3 problems"), "{text}");
    assert!(text.contains("/etc/plexus/daemon-config.json"), "{text}");
    assert!(text.contains("must be greater than 0, got 0"), "{text}");
}

#[test]
fn not_an_object_should_fail() {
    assert!(parse("[]").is_err());
    assert!(parse("{")
        .unwrap_err()
        .to_string()
        .contains("not valid JSON"));
}

#[test]
fn unknown_keys_should_be_listed() {
    let c = parse(r#"{"conectionLimit": 3}"#).unwrap();
    assert_eq!(c.unknown_keys, ["conectionLimit"]);
}

#[test]
fn zero_idle_timeout_should_mean_off() {
    assert_eq!(
        parse(r#"{"idleTimeout":"0"}"#)
            .unwrap()
            .lifecycle
            .idle_timeout,
        None
    );
    assert_eq!(
        parse(r#"{"idleTimeout":"3s"}"#)
            .unwrap()
            .lifecycle
            .idle_timeout,
        Some(Duration::from_secs(3))
    );
}

#[test]
fn the_nearest_known_key_should_be_suggested_for_a_typo_only() {
    assert_eq!(
        super::nearest_known_key("conectionLimit"),
        Some("connectionLimit")
    );
    assert_eq!(super::nearest_known_key("socketdir"), Some("socketDir"));
    assert_eq!(
        super::nearest_known_key("cluster_network"),
        Some("clusterNetwork")
    );
    assert_eq!(super::nearest_known_key("binDirs"), Some("binDir"));
    assert_eq!(super::nearest_known_key("colour"), None);
    assert_eq!(super::nearest_known_key("x"), None);
    assert_eq!(super::nearest_known_key(""), None);
}

#[test]
fn a_typo_of_any_known_key_should_get_it_suggested() {
    // Levenshtein (strsim) on lowercased names: a swap is two edits.
    assert_eq!(
        nearest_known_key("conenctionLimit"),
        Some("connectionLimit")
    );
    assert_eq!(nearest_known_key("PODEVENT"), Some("podEvents"));
    // multus's keys that plexusd does not read are known too.
    assert_eq!(nearest_known_key("chrootdir"), Some("chrootDir"));
    assert_eq!(
        nearest_known_key("multusAutoConfigDirs"),
        Some("multusAutoconfigDir")
    );
    assert_eq!(nearest_known_key("nme"), Some("name"));
    // Too far from every key: six letters more than `stateDir`.
    assert_eq!(nearest_known_key("stateDirectory"), None);
}

#[test]
fn every_key_should_be_declared_once_and_each_read_key_read_once_in_order() {
    let mut names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "a key is declared twice");

    let obj = Map::new();
    let mut f = fields::Fields::new(Path::new("/c.json"), &obj);
    keys::Raw::read(&mut f);
    let read_keys: Vec<&str> = KEYS
        .iter()
        .filter(|k| k.role == Role::Read)
        .map(|k| k.name)
        .collect();
    assert_eq!(f.read, read_keys);
    for k in KEYS.iter().filter(|k| k.role != Role::Read) {
        assert!(
            matches!(k.default, Unset::None),
            "{}: a default for a key plexusd does not read",
            k.name
        );
    }
}

#[test]
fn no_declared_key_should_be_reported_unknown() {
    let all: Map<String, Value> = KEYS
        .iter()
        .map(|k| (k.name.to_string(), Value::Null))
        .collect();
    let c = parse(&Value::Object(all).to_string()).unwrap();
    assert!(c.unknown_keys.is_empty(), "{:?}", c.unknown_keys);
    let c = parse(r#"{"cniVersion": "0.3.1", "podEvent": true}"#).unwrap();
    assert_eq!(c.unknown_keys, ["podEvent"]);
}

#[test]
fn the_keys_a_call_may_set_should_be_keys_plexusd_reads() {
    for name in selection::overlay::REQUEST_KEYS {
        assert_eq!(key(name).map(|k| k.role), Some(Role::Read), "{name}");
    }
}

/// Each module's settings, for comparing two configurations (the path,
/// the unknown keys and which keys a call may still set left out).
fn settings(c: &Config) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        c.activation,
        c.limit,
        c.server,
        c.logging,
        c.lifecycle,
        c.cni,
        c.selection.base(),
        c.readiness_file,
        c.kubernetes
    )
}

#[test]
fn each_default_shown_should_be_the_one_applied() {
    let defaults = settings(&parse("{}").unwrap());
    let mut checked = 0;
    for k in KEYS {
        let Unset::Value(show) = k.default else {
            continue;
        };
        let shown = show();
        // Paths are shown as they are; the others as JSON.
        let value = match k.kind {
            Kind::Path | Kind::SearchPath => Value::String(shown.clone()),
            _ => serde_json::from_str(&shown).unwrap_or_else(|e| panic!("{}: {e}", k.name)),
        };
        let file = serde_json::json!({ k.name: value }).to_string();
        let c = parse(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(settings(&c), defaults, "{}: {shown}", k.name);
        checked += 1;
    }
    assert!(checked > 25, "{checked}");
    let shown = |name: &str| key(name).unwrap().default.text();
    assert_eq!(shown("queueTimeout"), "`\"30s\"`");
    assert_eq!(shown("binDir"), "`/opt/cni/bin:/usr/lib/cni`");
    assert_eq!(shown("logLevel"), "`\"info\"`");
    assert_eq!(shown("bodyBudgetBytes"), "`16777216`");
    assert_eq!(shown("systemNamespaces"), "`[\"kube-system\"]`");
    assert_eq!(shown("idleTimeout"), "off");
    assert_eq!(shown("logFile"), "none");
    assert_eq!(shown("nodeName"), "the host name, lowercased");
}

#[test]
fn problems_should_come_in_the_order_of_the_keys() {
    let e = parse(
        r#"{"cniDir": "", "clusterNetwork": "flannel", "auxiliaryCNIChainName": "aux",
            "socketDir": 1}"#,
    )
    .unwrap_err();
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["socketDir", "auxiliaryCNIChainName", "cniDir"]);
}
