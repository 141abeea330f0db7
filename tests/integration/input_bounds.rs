//! What plexusd accepts from a caller, and the codes it answers with:
//! control characters in CNI variables, the longest container id, the size
//! of attachment records, and the code of a plugin past its deadline.
//! Requests go to plexusd as raw HTTP where the shim would refuse first (or
//! where the network configuration matters); fake plugins record their
//! runs. Needs root.

use std::fs;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::support::cni::{
    failed, gc, ok, processes_matching, runs, Call, Engine, DEFAULT_ARGS, SETTLE,
};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::http;
use crate::support::netns::Netns;

/// Writes the fake `rec`, declaring the `portMappings` capability in
/// network `net`: it appends `<command> <container id> <ifname>` to
/// `$DIR/runs` on every call but VERSION, keeps the stdin of its last DEL
/// in `$DIR/del-stdin` and answers ADD with an empty result.
fn recording_network(e: &Engine, net: &str) {
    e.fake(
        "rec",
        &format!(
            "echo \"$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME\" >> \"$DIR/runs\"\n\
             case \"$CNI_COMMAND\" in\n\
             \x20 ADD) {} ;;\n\
             \x20 DEL) printf '%s' \"$STDIN\" > \"$DIR/del-stdin\" ;;\n\
             esac\n\
             exit 0",
            Engine::pass_through()
        ),
    );
    e.write_network(
        "10-rec.conflist",
        &json!({"cniVersion": "1.0.0", "name": net, "plugins": [
            {"type": "rec", "capabilities": {"portMappings": true}}
        ]}),
    );
}

/// `POST /cni` with exactly `env` and `config` as the network config.
fn post(d: &Daemon, env: &[(&str, &str)], config: &Value) -> http::Response {
    let env: Map<String, Value> = env
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    let config = base64::engine::general_purpose::STANDARD.encode(config.to_string());
    let body = json!({"env": env, "config": config}).to_string();
    http::request(&d.sock, "POST", "/cni", body.as_bytes()).expect("POST /cni")
}

/// The runtime's config for plexus, plus `extra` keys.
fn config(extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus-shim"});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn env<'a>(command: &'a str, id: &'a str, netns: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", id),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", DEFAULT_ARGS),
        ("CNI_PATH", "/usr/lib/cni"),
    ]
}

/// Asserts an error answer with CNI `code`; returns its msg.
fn error(r: &http::Response, status: u16, code: u64) -> String {
    assert_eq!(r.status, status, "{}", r.body_str());
    let v = r.json();
    assert_eq!(v["code"], code, "{v}");
    v["msg"].as_str().unwrap_or_default().to_string()
}

/// A GC that keeps nothing, through the shim: it must succeed.
fn gc_everything(d: &Daemon) {
    let gc = gc(d, json!([]));
    assert_eq!(gc.code, Some(0), "{gc:?}\n{}", d.log_text());
}

/// A CNI_IFNAME with a NUL used to pass: the plugin could not be started,
/// nor the rollback, and the record it left could never be deleted, so
/// every GC failed from then on.
#[test]
fn control_characters_in_cni_variables_should_be_code_4_before_anything_runs() {
    let e = Engine::new("bounds-ctl");
    recording_network(&e, "ctl-net");
    let d = e.start("d", "ctl-net", "10s");
    let ns = Netns::new();
    let netns_nul = format!("{}\0", ns.path);
    let netns_nl = format!("{}\n", ns.path);
    let cases: &[(&str, &str)] = &[
        ("CNI_IFNAME", "eth0\0x"),
        ("CNI_IFNAME", "eth\x01"),
        ("CNI_CONTAINERID", "ctl\0"),
        ("CNI_NETNS", &netns_nul),
        ("CNI_NETNS", &netns_nl),
        ("CNI_ARGS", "IgnoreUnknown=1\0"),
        ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=a\x1bb"),
        ("CNI_PATH", "/usr/lib/cni\0"),
    ];
    for command in ["ADD", "DEL", "CHECK"] {
        for (key, value) in cases {
            let mut env = env(command, "ctl-1", &ns.path);
            for kv in env.iter_mut() {
                if kv.0 == *key {
                    kv.1 = value;
                }
            }
            let msg = error(&post(&d, &env, &config(json!({}))), 400, 4);
            assert!(msg.contains(key), "{command} {key}={value:?}: {msg}");
        }
    }
    assert_eq!(runs(&e), Vec::<String>::new(), "a plugin ran");
    assert_eq!(e.records(), Vec::<String>::new());
    gc_everything(&d);

    // The same request without the control character is served.
    let r = post(&d, &env("ADD", "ctl-1", &ns.path), &config(json!({})));
    assert_eq!(r.status, 200, "{}", r.body_str());
    assert_eq!(runs(&e), vec!["ADD ctl-1 eth0"]);
    gc_everything(&d);
    assert_eq!(e.records(), Vec::<String>::new());
}

/// Ids of 236 bytes and more failed with 500 (or not) depending on the
/// daemon's pid, when the record's temporary file name grew past NAME_MAX.
#[test]
fn container_ids_up_to_200_bytes_should_work_end_to_end_and_longer_ones_be_code_4() {
    let e = Engine::new("bounds-id");
    recording_network(&e, "id-net");
    let d = e.start("d", "id-net", "10s");
    let ns = Netns::new();
    let longest = "c".repeat(200);

    ok(&d, &Call::new("ADD", &longest, &ns, "eth0").run(&d));
    assert!(e.record(&longest).exists(), "no record for the longest id");
    ok(&d, &Call::new("CHECK", &longest, &ns, "eth0").run(&d));
    ok(&d, &Call::new("DEL", &longest, &ns, "eth0").run(&d));
    assert_eq!(e.records(), Vec::<String>::new());
    let expected: Vec<String> = ["ADD", "CHECK", "DEL"]
        .iter()
        .map(|c| format!("{c} {longest} eth0"))
        .collect();
    assert_eq!(runs(&e), expected);

    for len in [201, 236, 255, 300] {
        let id = "c".repeat(len);
        for command in ["ADD", "DEL"] {
            let r = post(&d, &env(command, &id, &ns.path), &config(json!({})));
            let msg = error(&r, 400, 4);
            assert!(
                msg.contains("CNI_CONTAINERID") && msg.contains("200"),
                "{msg}"
            );
        }
    }
    assert_eq!(runs(&e), expected, "a plugin ran for a refused id");
    assert_eq!(e.records(), Vec::<String>::new());
}

/// A record stored the whole runtimeConfig: a 1 MiB one made a 1 MiB
/// record, read back on every call for the container and by every GC.
#[test]
fn records_should_keep_only_declared_capabilities_and_pass_them_at_del() {
    let e = Engine::new("bounds-cap");
    recording_network(&e, "cap-net");
    let d = e.start("d", "cap-net", "10s");
    let ns = Netns::new();
    let ports = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
    let runtime = json!({
        "portMappings": ports,
        "undeclared": "x".repeat(512 << 10),
    });

    let r = post(
        &d,
        &env("ADD", "cap-1", &ns.path),
        &config(json!({"runtimeConfig": runtime})),
    );
    assert_eq!(r.status, 200, "{}", r.body_str());
    let size = fs::metadata(e.record("cap-1")).unwrap().len();
    assert!(size < 16 << 10, "the record is {size} bytes");
    let record: Value = serde_json::from_slice(&fs::read(e.record("cap-1")).unwrap()).unwrap();
    let kept = &record["attachments"][0]["capabilityArgs"];
    assert_eq!(kept, &json!({"portMappings": ports}), "{record}");

    // The DEL brings no runtimeConfig: the plugin gets the recorded one.
    let r = post(&d, &env("DEL", "cap-1", &ns.path), &config(json!({})));
    assert_eq!(r.status, 200, "{}", r.body_str());
    let stdin: Value = serde_json::from_slice(&fs::read(e.dir.join("del-stdin")).unwrap()).unwrap();
    assert_eq!(
        stdin["runtimeConfig"],
        json!({"portMappings": ports}),
        "{stdin}"
    );
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn an_add_whose_record_would_be_too_large_should_be_refused_before_any_plugin_runs() {
    let e = Engine::new("bounds-big");
    recording_network(&e, "big-net");
    let d = e.start("d", "big-net", "10s");
    let ns = Netns::new();
    // A declared capability is kept, so this one would make the record
    // 300 KiB.
    let huge = json!([{"hostPort": 8080, "containerPort": 80, "note": "p".repeat(300 << 10)}]);
    let r = post(
        &d,
        &env("ADD", "big-1", &ns.path),
        &config(json!({"runtimeConfig": {"portMappings": huge}})),
    );
    let msg = error(&r, 400, 7);
    assert!(msg.contains("big-1") && msg.contains("262144"), "{msg}");
    assert_eq!(runs(&e), Vec::<String>::new(), "a plugin ran");
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn a_plugin_past_plugin_timeout_should_be_code_11_naming_it_and_the_deadline() {
    let e = Engine::new("bounds-timeout");
    e.fake(
        "hang",
        "case \"$CNI_COMMAND\" in ADD) exec -a \"$BIN/hang-sleep\" sleep 1000 ;; esac\nexit 0",
    );
    e.write_network(
        "10-hang.conflist",
        &json!({"cniVersion": "1.0.0", "name": "hang-net", "plugins": [{"type": "hang"}]}),
    );
    let d = e.start("d", "hang-net", "1s");
    let ns = Netns::new();

    let started = Instant::now();
    let run = Call::new("ADD", "hang-1", &ns, "eth0").run(&d);
    let took = started.elapsed();
    let (code, msg, all) = failed(&d, &run);
    assert_eq!(code, 11, "{all}");
    assert!(
        msg.contains("\"hang\""),
        "the msg should name the plugin: {msg}"
    );
    assert!(
        msg.contains("1s"),
        "the msg should name the deadline: {msg}"
    );
    assert!(took < Duration::from_secs(10), "ADD took {took:?}");
    let needle = format!("{}/hang-sleep", e.bin_dir.display());
    wait_until(SETTLE, "the hung plugin to be killed", || {
        processes_matching(&needle).is_empty()
    });
    assert_eq!(e.records(), Vec::<String>::new());
}

/// A plugin's error without a code (0, "unknown", for libcni) reaches the
/// runtime as 999, never as 0.
#[test]
fn a_plugin_error_without_a_code_should_reach_the_runtime_as_999() {
    let e = Engine::new("bounds-nocode");
    e.fake(
        "nocode",
        "case \"$CNI_COMMAND\" in ADD) echo '{\"msg\":\"no code here\"}'; exit 1 ;; esac\nexit 0",
    );
    e.write_network(
        "10-nocode.conflist",
        &json!({"cniVersion": "1.0.0", "name": "nocode-net", "plugins": [{"type": "nocode"}]}),
    );
    let d = e.start("d", "nocode-net", "10s");
    let ns = Netns::new();
    let run = Call::new("ADD", "nocode-1", &ns, "eth0").run(&d);
    let (code, msg, all) = failed(&d, &run);
    assert_eq!(code, 999, "{all}");
    assert!(msg.contains("no code here"), "{msg}");
    assert_eq!(e.records(), Vec::<String>::new());
}
