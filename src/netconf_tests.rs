//! Unit tests of [`super`].

use super::*;
use serde_json::json;

fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        pairs
            .iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.to_string())
    }
}

const ADD: &[(&str, &str)] = &[
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "a.b-c_d"),
    ("CNI_NETNS", "/run/netns/x"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=p"),
];

#[test]
fn valid_add_should_parse() {
    let inv = Invocation::from_env(env(ADD)).unwrap();
    assert_eq!(inv.command, Command::Add);
    assert_eq!(inv.arg_pairs.len(), 2);
}

#[test]
fn bad_container_ids_should_be_rejected_with_code_4() {
    for id in ["_abc", "a/b", "abc def", "..", ""] {
        let mut e: Vec<_> = ADD.to_vec();
        e[1] = ("CNI_CONTAINERID", id);
        let err = Invocation::from_env(env(&e)).unwrap_err();
        assert_eq!(err.code, 4, "{id:?}");
    }
}

#[test]
fn control_characters_in_any_cni_variable_should_be_code_4() {
    for (i, key) in [
        "CNI_COMMAND",
        "CNI_CONTAINERID",
        "CNI_NETNS",
        "CNI_IFNAME",
        "CNI_ARGS",
    ]
    .iter()
    .enumerate()
    {
        for bad in ["\0", "\n", "\x1b", "\x7f", "\u{85}"] {
            let mut e: Vec<(&str, String)> = ADD.iter().map(|(k, v)| (*k, v.to_string())).collect();
            e[i].1.push_str(bad);
            let got = Invocation::from_env(|k| {
                e.iter().find(|(key, _)| *key == k).map(|(_, v)| v.clone())
            });
            let err = got.unwrap_err();
            assert_eq!(err.code, 4, "{key} with {bad:?}");
            assert!(err.msg.contains(key), "{key}: {}", err.msg);
        }
    }
    // DEL without a netns reads CNI_NETNS too.
    let del = [
        ("CNI_COMMAND", "DEL"),
        ("CNI_CONTAINERID", "c"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/run/netns/a\0b"),
    ];
    assert_eq!(Invocation::from_env(env(&del)).unwrap_err().code, 4);
    // Any variable of the request, read or not.
    assert!(validate_env([("CNI_PATH", "/usr/lib/cni\0")]).is_err());
    assert!(validate_env([("CNI_\0X", "v")]).is_err());
    validate_env([("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"), ("X", "ünïcode")]).unwrap();
}

#[test]
fn container_ids_should_be_capped_at_the_maximum() {
    let mut e: Vec<(&str, String)> = ADD.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let get = |e: &Vec<(&str, String)>| {
        Invocation::from_env(|k| e.iter().find(|(key, _)| *key == k).map(|(_, v)| v.clone()))
    };
    e[1].1 = "a".repeat(MAX_CONTAINER_ID);
    get(&e).unwrap();
    assert!(is_valid_container_id(&e[1].1));
    e[1].1.push('a');
    let err = get(&e).unwrap_err();
    assert_eq!(err.code, 4);
    assert!(
        err.msg.contains(&MAX_CONTAINER_ID.to_string()),
        "{}",
        err.msg
    );
    assert!(!is_valid_container_id(&e[1].1));
}

#[test]
fn bad_ifnames_should_be_rejected_and_15_bytes_accepted() {
    for name in [
        "abcdefghijklmnop",
        "a/b",
        "a:b",
        "a b",
        ".",
        "..",
        "a\0",
        "a\x01",
    ] {
        assert_eq!(validate_ifname(name).unwrap_err().code, 4, "{name:?}");
    }
    validate_ifname("abcdefghijklmno").unwrap();
}

#[test]
fn cni_args_should_need_exactly_one_equals() {
    assert!(parse_args("FOO").is_err());
    assert!(parse_args("A=b=c").is_err());
    assert!(parse_args("=x").is_err());
    assert_eq!(parse_args("").unwrap(), vec![]);
    assert_eq!(parse_args("A=1;").unwrap().len(), 1);
}

#[test]
fn version_should_be_refused_like_an_unknown_command() {
    let err = Invocation::from_env(env(&[("CNI_COMMAND", "VERSION")])).unwrap_err();
    assert_eq!(err.code, 4);
    assert_eq!(err.msg, "unknown CNI_COMMAND: VERSION");
}

#[test]
fn del_should_accept_an_empty_netns_but_add_should_not() {
    let mut e: Vec<_> = ADD.to_vec();
    e[2] = ("CNI_NETNS", "");
    assert_eq!(Invocation::from_env(env(&e)).unwrap_err().code, 4);
    e[0] = ("CNI_COMMAND", "DEL");
    Invocation::from_env(env(&e)).unwrap();
}

#[test]
fn status_and_gc_should_need_no_attachment() {
    Invocation::from_env(env(&[("CNI_COMMAND", "GC")])).unwrap();
    assert_eq!(
        Invocation::from_env(env(&[("CNI_COMMAND", "add")]))
            .unwrap_err()
            .code,
        4
    );
}

#[test]
fn single_plugin_conf_should_become_a_one_plugin_list() {
    let l = NetworkList::from_value(
        Path::new("x.conf"),
        json!({"cniVersion":"0.4.0","name":"n","type":"bridge","bridge":"b"}),
        true,
    )
    .unwrap();
    assert_eq!(l.plugins.len(), 1);
    assert_eq!(l.plugin_type(0), "bridge");
}

#[test]
fn invalid_lists_should_name_the_field() {
    let cases = [
        (
            json!({"cniVersion":"1.0.0","plugins":[{"type":"x"}]}),
            "name",
        ),
        (
            json!({"cniVersion":"1.0.0","name":"n","plugins":[]}),
            "plugins",
        ),
        (
            json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"../x"}]}),
            "plugins[0].type",
        ),
        (
            json!({"cniVersion":"one","name":"n","plugins":[{"type":"x"}]}),
            "cniVersion",
        ),
        (
            json!({"cniVersion":"1.0.0","name":"_n","plugins":[{"type":"x"}]}),
            "name",
        ),
    ];
    for (v, key) in cases {
        match NetworkList::from_value(Path::new("f.conflist"), v, false) {
            Err(ConfigError::Field { key: k, file, .. }) => {
                assert_eq!(k, key);
                assert_eq!(file, Path::new("f.conflist"));
            }
            other => panic!("{key}: {other:?}"),
        }
    }
}

#[test]
fn shim_types_should_be_refused_as_delegates() {
    for shim in ["plexus-shim", "multus-shim"] {
        let list =
            json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":shim}]});
        let single = json!({"cniVersion":"1.0.0","name":"n","type":shim});
        for (v, is_single, key) in [(list, false, "plugins[1].type"), (single, true, "type")] {
            match NetworkList::from_value(Path::new("f"), v, is_single) {
                Err(ConfigError::Field { key: k, why, .. }) => {
                    assert_eq!(k, key);
                    assert!(why.contains(shim) && why.contains("call itself"), "{why}");
                }
                other => panic!("{shim}: {other:?}"),
            }
        }
    }
    // A name that merely contains one is an ordinary plugin.
    NetworkList::from_value(
        Path::new("f"),
        json!({"cniVersion":"1.0.0","name":"n","type":"plexus-shim-helper"}),
        true,
    )
    .unwrap();
}

#[test]
fn negotiation_should_step_a_1_1_list_down_to_1_0() {
    let list = NetworkList::from_value(
        Path::new("x"),
        json!({"cniVersion":"1.1.0","name":"n","plugins":[{"type":"x"}]}),
        false,
    )
    .unwrap();
    let debian: Vec<String> = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]
        .map(String::from)
        .to_vec();
    assert_eq!(
        negotiate(&list.candidate_versions(), &debian).as_deref(),
        Some("1.0.0")
    );
    let both = vec!["1.1.0".to_string(), "0.4.0".to_string()];
    assert_eq!(negotiate(&both, &debian).as_deref(), Some("0.4.0"));
    let old = vec!["0.1.0".to_string()];
    assert_eq!(negotiate(&both, &old), None);
}
