//! Unit tests of [`super`]: NAD configurations, the confDir fallback
//! (through a fake loader), cni-args, device IDs, namespace isolation.

use super::*;
use serde_json::json;

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

/// A confDir of two networks, found by network name as the engine's
/// loader finds them.
fn conf_dir(name: &str) -> Result<NetworkList, ConfigError> {
    let doc = match name {
        "other" => json!({"cniVersion": "1.0.0", "name": "other", "type": "loopback"}),
        "mine" => json!({"cniVersion": "1.0.0", "name": "mine", "type": "bridge"}),
        _ => {
            return Err(ConfigError::NotFound {
                name: name.to_string(),
                dir: "/etc/cni/net.d".into(),
                skipped: Vec::new(),
            })
        }
    };
    NetworkList::from_value(Path::new(name), doc, true)
}

fn no_file(_: &str) -> Result<NetworkList, ConfigError> {
    panic!("the file lookup must not run when spec.config is set")
}

#[test]
fn a_missing_or_empty_name_should_become_the_nad_name() {
    for spec in [
        r#"{"cniVersion":"1.0.0","type":"macvlan","master":"eth0"}"#,
        r#"{"cniVersion":"1.0.0","name":"","type":"macvlan"}"#,
        r#"{"cniVersion":"1.0.0","name":null,"type":"macvlan"}"#,
    ] {
        let d = delegate_from_spec("ns", "mv", spec, None).unwrap();
        assert_eq!(d.network_name(), "mv");
        assert_eq!(d.display_name, "ns/mv");
        assert!(!d.is_list);
        // Re-serialised with sorted keys, as multus does.
        let text = serde_json::to_string(&d.config).unwrap();
        assert!(text.starts_with(r#"{"cniVersion":"1.0.0","#), "{text}");
    }
    let d = delegate_from_spec("ns", "mv", r#"{"name":"own","type":"bridge"}"#, None).unwrap();
    assert_eq!(d.network_name(), "own");
    assert_eq!(d.display_name, "ns/mv");
}

#[test]
fn an_empty_type_should_need_a_plugin_list_with_a_type() {
    let d = delegate_from_spec(
        "ns",
        "l",
        r#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"},{"type":"tuning"}]}"#,
        None,
    )
    .unwrap();
    assert!(d.is_list);
    assert_eq!(d.network_list().unwrap().plugins.len(), 2);
    for (spec, says) in [
        (r#"{"cniVersion":"1.0.0"}"#, "'type' or 'plugins'"),
        (r#"{"type":"","plugins":[]}"#, "empty"),
        (r#"{"plugins":[{"type":""}]}"#, "plugins[0].type"),
        (r#"{"plugins":[{"x":1}]}"#, "plugins[0].type"),
        (
            r#"{"plugins":[{"type":"a"}, 3]}"#,
            "plugins[1] must be an object",
        ),
        (r#"{"plugins":{}}"#, "must be a list"),
        (r#"[1]"#, "must be a JSON object"),
        (r#"{"#, "failed to unmarshal"),
        (r#"{"type":5}"#, "\"type\" must be a string"),
        (r#"{"name":5,"type":"x"}"#, "\"name\" must be a string"),
    ] {
        let e = delegate_from_spec("ns", "l", spec, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{spec}: {e}");
        assert!(e.contains("ns/l"), "{e}");
    }
}

#[test]
fn cni_args_should_merge_into_args_cni_with_the_annotation_winning() {
    let a = args(json!({"k": "new", "extra": 1}));
    let d = delegate_from_spec(
        "ns",
        "n",
        r#"{"type":"bridge","args":{"cni":{"k":"old","keep":true},"other":1}}"#,
        Some(&a),
    )
    .unwrap();
    assert_eq!(
        d.config["args"],
        json!({"cni": {"k": "new", "keep": true, "extra": 1}, "other": 1})
    );
    let d = delegate_from_spec("ns", "n", r#"{"type":"bridge"}"#, Some(&a)).unwrap();
    assert_eq!(d.config["args"], json!({"cni": {"k": "new", "extra": 1}}));
    // Every plugin of a list.
    let d = delegate_from_spec(
        "ns",
        "n",
        r#"{"plugins":[{"type":"bridge"},{"type":"tuning","args":{"cni":{"k":"x"}}}]}"#,
        Some(&a),
    )
    .unwrap();
    assert_eq!(d.config["plugins"][0]["args"]["cni"]["k"], "new");
    assert_eq!(d.config["plugins"][1]["args"]["cni"]["k"], "new");
    assert_eq!(d.config["plugins"][1]["args"]["cni"]["extra"], 1);
    // Args that cannot take them are an error, not a panic.
    for spec in [
        r#"{"type":"b","args":1}"#,
        r#"{"type":"b","args":{"cni":"x"}}"#,
    ] {
        let e = delegate_from_spec("ns", "n", spec, Some(&a)).unwrap_err();
        assert!(e.to_string().contains("must be an object"), "{e}");
    }
}

#[test]
fn an_empty_spec_should_use_the_confdir_file_named_like_the_nad() {
    let load = conf_dir;
    let a = args(json!({"x": "y"}));
    for spec in [None, Some("")] {
        let d = delegate_for_nad("ns", "mine", spec, Some(&a), load).unwrap();
        assert_eq!(d.display_name, "ns/mine");
        assert_eq!(d.network_name(), "mine");
        let list = d.network_list().unwrap();
        assert_eq!(list.plugin_type(0), "bridge");
        assert_eq!(list.plugins[0]["args"]["cni"]["x"], "y");
    }
    let e = delegate_for_nad("ns", "absent", None, None, load).unwrap_err();
    assert!(matches!(e, Error::File { .. }), "{e}");
    assert!(e.to_string().contains("absent"), "{e}");
    // A name that the loader would read as a path is refused.
    for name in ["../../etc/x", "/etc/cni/net.d/10-x.conf", ""] {
        let e = delegate_for_nad("ns", name, None, None, no_file).unwrap_err();
        assert!(matches!(e, Error::Spec { .. }), "{e}");
    }
    // A set spec.config never looks at files.
    delegate_for_nad("ns", "x", Some(r#"{"type":"b"}"#), None, no_file).unwrap();
}

#[test]
fn selection_elements_should_feed_the_nad_lookup() {
    let sel = crate::selection::annotation::parse_networks_annotation(
        Some(r#"[{"name":"n","namespace":"other","cni-args":{"a":1}}]"#),
        "pod",
    )
    .unwrap()
    .pop()
    .unwrap();
    let d = delegate_for_selection(&sel, Some(r#"{"type":"b"}"#), no_file).unwrap();
    assert_eq!(d.display_name, "other/n");
    assert_eq!(d.config["args"]["cni"]["a"], 1);
}

#[test]
fn device_ids_should_go_into_every_plugin() {
    let mut d = delegate_from_spec("ns", "n", r#"{"type":"sriov"}"#, None).unwrap();
    d.inject_device_id("0000:03:00.1");
    assert_eq!(d.config["deviceID"], "0000:03:00.1");
    assert_eq!(d.config["pciBusID"], "0000:03:00.1");
    let mut d = delegate_from_spec(
        "ns",
        "n",
        r#"{"plugins":[{"type":"sriov"},{"type":"tuning"}]}"#,
        None,
    )
    .unwrap();
    d.inject_device_id("id");
    assert_eq!(d.config["plugins"][1]["pciBusID"], "id");
    assert!(d.config.get("deviceID").is_none());
}

#[test]
fn namespace_isolation_should_allow_own_and_global_namespaces_only() {
    let global = parse_global_namespaces("");
    assert_eq!(global, ["default"]);
    check_namespace_isolation(true, "a", "a", &global).unwrap();
    check_namespace_isolation(true, "a", "default", &global).unwrap();
    check_namespace_isolation(false, "a", "b", &global).unwrap();
    let e = check_namespace_isolation(true, "a", "b", &global).unwrap_err();
    assert_eq!(
        e.to_string(),
        "namespace isolation enabled, annotation violates permission, pod is in namespace a but refers to target namespace b"
    );
    let global = parse_global_namespaces("default, shared ,x");
    assert_eq!(global, ["default", "shared", "x"]);
    check_namespace_isolation(true, "a", "shared", &global).unwrap();
}
