//! plexusd never runs a plugin in the host's own network namespace: not for
//! ADD, CHECK or DEL, not in the rollback of a failed ADD, and not for a
//! DEL from a record that names the host's namespace. Fake plugins that
//! record every run, and Debian's bridge and host-local. Needs root.
//!
//! No test here runs a real plugin's DEL against the host: were the guard
//! to fail, that would take the machine's own interfaces down.

use std::fs;
use std::path::Path;

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, failed, gc, ok, runs, Call, Engine, DEFAULT_ARGS};
use crate::support::daemon::Daemon;
use crate::support::netns::{host_link_exists, ip, unique_name, Link, Netns, Subnet};

/// Writes the fake `rec`: it appends `<command> <netns> <ifname>` to
/// `$DIR/runs` on every call but VERSION and answers ADD with an empty
/// result.
fn recording_fake(e: &Engine) {
    e.fake(
        "rec",
        &format!(
            "echo \"$CNI_COMMAND $CNI_NETNS $CNI_IFNAME\" >> \"$DIR/runs\"\n\
             case \"$CNI_COMMAND\" in ADD) {} ;; esac\n\
             exit 0",
            Engine::pass_through()
        ),
    );
}

/// `command` through the shim with `CNI_NETNS` exactly `netns`.
fn call(command: &str, id: &str, netns: &str, ifname: &str) -> Call {
    Call {
        command: command.into(),
        container_id: id.into(),
        netns: netns.into(),
        ifname: ifname.into(),
        args: DEFAULT_ARGS.into(),
        cni_version: "1.0.0".into(),
    }
}

/// Asserts `run` failed with code 4 and a message naming `netns`.
fn refused(d: &Daemon, run: &crate::support::shim::Run, netns: &str) -> String {
    let (code, msg, all) = failed(d, run);
    assert_eq!(code, 4, "{all}");
    assert!(
        msg.contains(netns),
        "the message should name {netns}: {msg}"
    );
    msg
}

/// The host's addresses in `subnet`, as `ip -o addr` prints them.
fn host_addresses_in(subnet: &Subnet) -> String {
    let out = ip(&["-4", "-o", "addr", "show", "to", &subnet.cidr()]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The host's namespace by every name a caller could give it.
fn host_paths(d: &Daemon) -> Vec<String> {
    vec![
        "/proc/self/ns/net".into(),
        format!("/proc/{}/ns/net", d.pid()),
        "/proc/1/ns/net".into(),
    ]
}

#[test]
fn add_check_and_del_in_the_hosts_namespace_should_be_refused_before_any_plugin_runs() {
    let e = Engine::new("host-fake");
    recording_fake(&e);
    e.write_network(
        "10-rec.conflist",
        &conflist("rec-net", "1.0.0", vec![json!({"type": "rec"})]),
    );
    let d = e.start("d", "rec-net", "10s");

    for path in host_paths(&d) {
        for command in ["ADD", "CHECK", "DEL"] {
            let run = call(command, "host-1", &path, "eth0").run(&d);
            let msg = refused(&d, &run, &path);
            assert!(msg.starts_with(command), "{msg}");
        }
    }
    let msg = refused(
        &d,
        &call("ADD", "host-1", "/proc/self/ns/net", "eth0").run(&d),
        "/proc/self/ns/net",
    );
    assert!(msg.contains("host"), "the message should say why: {msg}");
    assert_eq!(runs(&e), Vec::<String>::new(), "a plugin ran");
    assert_eq!(e.records(), Vec::<String>::new());

    // The same plugin does run for a container's own namespace.
    let ns = Netns::new();
    ok(&d, &call("ADD", "host-1", &ns.path, "eth0").run(&d));
    ok(&d, &call("DEL", "host-1", &ns.path, "eth0").run(&d));
    assert_eq!(
        runs(&e),
        vec![
            format!("ADD {} eth0", ns.path),
            format!("DEL {} eth0", ns.path)
        ]
    );
}

#[test]
fn cni_netns_that_is_not_a_network_namespace_should_be_refused_for_add_and_check() {
    let e = Engine::new("host-file");
    recording_fake(&e);
    e.write_network(
        "10-rec.conflist",
        &conflist("rec-net", "1.0.0", vec![json!({"type": "rec"})]),
    );
    let d = e.start("d", "rec-net", "10s");
    let file = e.dir.join("not-a-netns");
    fs::write(&file, b"").unwrap();
    let file = file.to_str().unwrap().to_string();
    let missing = e.dir.join("missing").to_str().unwrap().to_string();

    for command in ["ADD", "CHECK"] {
        let msg = refused(&d, &call(command, "file-1", &file, "eth0").run(&d), &file);
        assert!(msg.contains("not a network namespace"), "{msg}");
        let msg = refused(
            &d,
            &call(command, "file-1", "/proc/self/ns/uts", "eth0").run(&d),
            "/proc/self/ns/uts",
        );
        assert!(msg.contains("uts"), "{msg}");
        let msg = refused(
            &d,
            &call(command, "file-1", &missing, "eth0").run(&d),
            &missing,
        );
        assert!(msg.contains("does not exist"), "{msg}");
    }
    assert_eq!(runs(&e), Vec::<String>::new(), "a plugin ran");
    assert_eq!(e.records(), Vec::<String>::new());

    // DEL of a pod whose namespace is gone still runs its plugins, as
    // before: they get the path and clean up what lives outside it.
    let ns = Netns::new();
    let path = ns.path.clone();
    ok(&d, &call("ADD", "gone-1", &path, "eth0").run(&d));
    drop(ns);
    assert!(!Path::new(&path).exists());
    ok(&d, &call("DEL", "gone-1", &path, "eth0").run(&d));
    assert_eq!(
        runs(&e),
        vec![format!("ADD {path} eth0"), format!("DEL {path} eth0")]
    );
    assert_eq!(e.records(), Vec::<String>::new());
}

#[test]
fn bridge_add_in_the_hosts_namespace_should_change_nothing_on_the_host() {
    let e = Engine::new("host-bridge");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "hostbr-net";
    e.write_network(
        "10-br.conflist",
        &conflist(net, "1.0.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let d = e.start("d", net, "10s");
    // The interface the bridge plugin would create, guarded in case it does.
    let ifname = Link::planned("i");

    for path in host_paths(&d) {
        let run = call("ADD", "hostbr-1", &path, &ifname.name).run(&d);
        refused(&d, &run, &path);
        assert!(!host_link_exists(&br.name), "the bridge was created");
        assert!(
            !host_link_exists(&ifname.name),
            "{} was created",
            ifname.name
        );
        assert_eq!(host_addresses_in(&subnet), "", "an address was added");
        assert_eq!(e.reservations(net), Vec::<String>::new());
        assert_eq!(e.records(), Vec::<String>::new());
    }
}

/// The bridge plugin fails an ADD whose interface exists already; the
/// rollback's DEL then deleted the interface of that name, in the host's
/// namespace a host interface.
#[test]
fn add_naming_a_host_interface_in_the_hosts_namespace_should_leave_it_alone() {
    let e = Engine::new("host-rollback");
    let br = Link::planned("b");
    let subnet = Subnet::new();
    let net = "hostrb-net";
    e.write_network(
        "10-br.conflist",
        &conflist(net, "1.0.0", vec![bridge(&br.name, e.host_local(&subnet))]),
    );
    let d = e.start("d", net, "10s");
    let host_if = Link::dummy_or_veth();

    for path in host_paths(&d) {
        refused(
            &d,
            &call("ADD", "hostrb-1", &path, &host_if.name).run(&d),
            &path,
        );
        assert!(
            host_link_exists(&host_if.name),
            "the host's {} was deleted\n{}",
            host_if.name,
            d.log_text()
        );
    }
    assert!(!host_link_exists(&br.name), "the bridge was created");
    assert_eq!(e.records(), Vec::<String>::new());
}

/// A record as an ADD into the host's namespace would have left it (the
/// format of src/cni/record.rs): network `net` with `plugins`, attached as
/// `ifname` in `netns`.
fn plant_record(e: &Engine, id: &str, netns: &str, ifname: &str, net: &str, plugins: Vec<Value>) {
    let record = json!({
        "kind": "plexusAttachmentsV1",
        "containerId": id,
        "attachments": [{
            "ifname": ifname,
            "netns": netns,
            "cniArgs": DEFAULT_ARGS,
            "delegates": [{
                "name": net,
                "ifname": ifname,
                "primary": true,
                "state": "added",
                "config": conflist(net, "1.0.0", plugins),
            }],
        }],
    });
    fs::write(e.record(id), serde_json::to_vec(&record).unwrap()).unwrap();
}

#[test]
fn a_record_naming_the_hosts_namespace_should_never_be_deleted_there() {
    let e = Engine::new("host-record");
    recording_fake(&e);
    let br = Link::planned("b");
    let subnet = Subnet::new();
    e.write_network(
        "10-rec.conflist",
        &conflist("rec-net", "1.0.0", vec![json!({"type": "rec"})]),
    );
    let d = e.start("d", "rec-net", "10s");
    let host_if = Link::dummy_or_veth();
    // DEL runs a network's plugins in reverse: `rec` would run first and
    // leave a trace, then the bridge plugin would delete the interface.
    let plugins = vec![
        bridge(&br.name, e.host_local(&subnet)),
        json!({"type": "rec"}),
    ];
    let id = format!("planted-{}", unique_name("c"));
    plant_record(
        &e,
        &id,
        "/proc/self/ns/net",
        &host_if.name,
        "hostrec-net",
        plugins,
    );
    let before = fs::read(e.record(&id)).unwrap();

    // The runtime's DEL naming that namespace.
    let run = call("DEL", &id, "/proc/self/ns/net", &host_if.name).run(&d);
    refused(&d, &run, "/proc/self/ns/net");

    // GC, which deletes from the record, with the record's namespace.
    let (code, msg, all) = failed(&d, &gc(&d, json!([])));
    assert_eq!(code, 4, "{all}");
    assert!(msg.contains("/proc/self/ns/net"), "{msg}");

    assert!(
        host_link_exists(&host_if.name),
        "the host's {} was deleted\n{}",
        host_if.name,
        d.log_text()
    );
    assert_eq!(runs(&e), Vec::<String>::new(), "a plugin ran");
    assert_eq!(
        fs::read(e.record(&id)).unwrap(),
        before,
        "the record changed"
    );
    assert!(d.log_text().contains("refused CNI_NETNS"));

    // Once the record names a pod's namespace, GC deletes it as usual.
    let ns = Netns::new();
    let plugins = vec![json!({"type": "rec"})];
    plant_record(&e, &id, &ns.path, "eth0", "hostrec-net", plugins);
    let gc = gc(&d, json!([]));
    assert_eq!(gc.code, Some(0), "{gc:?}\n{}", d.log_text());
    assert!(!e.record(&id).exists(), "GC left the record");
    assert_eq!(runs(&e), vec![format!("DEL {} eth0", ns.path)]);
}
