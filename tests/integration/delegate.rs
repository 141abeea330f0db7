//! `POST /delegate` (hot-plug, as multus-dynamic-networks-controller calls
//! it) with Debian's bridge and host-local in real namespaces: a container
//! attached through plexus-shim gets `net5` hot-plugged and unplugged over
//! the socket in multus's request shape; the runtime's DEL removes what was
//! hot-plugged too, after a crash as well; a taken interface name and a
//! failing plugin change nothing. Needs root.

use std::fs;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::cni::{
    address, bare, bridge, cni, conflist, gc_call, ok, Call, Engine, SETTLE,
};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::http::{self, Response};
use crate::support::netns::{bridge_ports, ip_ok, Link, Netns, Subnet};
use crate::support::shim;

/// The pod keys multus-dynamic-networks-controller sends in CNI_ARGS.
const POD_ARGS: &str =
    "K8S_POD_NAMESPACE=default;K8S_POD_NAME=samplepod;K8S_POD_UID=6a1f3c2e-8d4b-4e9a-b1c2-7f0e9d8c6b5a";
const POD_NET: &str = "pod-net";
const HP_NET: &str = "hp-net";

/// A container's runtime network (`pod-net`: bridge + host-local) and the
/// network hot-plugged into it (`hp-net`, another bridge and subnet).
struct Setup {
    e: Engine,
    pod_br: Link,
    hp_br: Link,
    hp_subnet: Subnet,
    ns: Netns,
}

impl Setup {
    fn new(name: &str) -> Self {
        let e = Engine::new(name);
        let pod_br = Link::bridge();
        let hp_br = Link::bridge();
        let pod_subnet = Subnet::new();
        let hp_subnet = Subnet::new();
        e.write_network(
            "10-pod.conflist",
            &conflist(
                POD_NET,
                "1.0.0",
                vec![bridge(&pod_br.name, e.host_local(&pod_subnet))],
            ),
        );
        Setup {
            e,
            pod_br,
            hp_br,
            hp_subnet,
            ns: Netns::new(),
        }
    }

    fn start(&self, tag: &str) -> Daemon {
        self.e.start(tag, POD_NET, "20s")
    }

    /// The hot-plugged network as a NAD's `spec.config` with its name: one
    /// bridge plugin taking `ips` and `mac` as capabilities.
    fn hp_config(&self) -> Value {
        let mut b = bridge(&self.hp_br.name, self.e.host_local(&self.hp_subnet));
        b["cniVersion"] = "1.0.0".into();
        b["name"] = HP_NET.into();
        b["capabilities"] = json!({"ips": true, "mac": true});
        b
    }

    /// The bytes of the container's record (empty when there is none).
    fn record_bytes(&self, id: &str) -> Vec<u8> {
        fs::read(self.e.record(id)).unwrap_or_default()
    }

    fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&self.record_bytes(id)).unwrap_or(Value::Null)
    }
}

/// `POST /delegate` over the daemon's socket, the body as multus's
/// `CreateDelegateRequest` builds it.
fn delegate(
    d: &Daemon,
    command: &str,
    id: &str,
    ns: &Netns,
    ifname: &str,
    config: &Value,
    attributes: Value,
) -> Response {
    let body = json!({
        "env": {
            "CNI_ARGS": POD_ARGS,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": id,
            "CNI_IFNAME": ifname,
            "CNI_NETNS": ns.path,
        },
        "config": base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(config).unwrap()),
        "interfaceAttributes": attributes,
    });
    http::request(
        &d.sock,
        "POST",
        "/delegate",
        &serde_json::to_vec(&body).unwrap(),
    )
    .expect("the daemon answers /delegate")
}

/// Asserts a 200; returns the body as JSON (Null when empty).
fn ok_200(d: &Daemon, r: &Response) -> Value {
    assert_eq!(
        r.status,
        200,
        "{}\n--- plexusd log ---\n{}",
        r.body_str(),
        d.log_text()
    );
    if r.body.is_empty() {
        Value::Null
    } else {
        r.json()
    }
}

/// Asserts a 400 with a CNI error; returns (code, msg).
fn error_400(r: &Response) -> (u64, String) {
    assert_eq!(r.status, 400, "{}", r.body_str());
    let v = r.json();
    (
        v["code"].as_u64().unwrap_or(0),
        v["msg"].as_str().unwrap_or("").to_string(),
    )
}

/// The MAC address of `ifname` in `ns`.
fn mac(ns: &Netns, ifname: &str) -> String {
    let v: Value =
        serde_json::from_str(&ip_ok(&["-n", &ns.name, "-j", "link", "show", ifname])).unwrap();
    v[0]["address"].as_str().unwrap_or("").to_string()
}

/// The runtime's ADD of eth0 through plexus-shim; its address.
fn attach(s: &Setup, d: &Daemon, id: &str) -> String {
    let res = ok(d, &cni(d, "ADD", id, &s.ns, "eth0"));
    let a = address(&res);
    assert!(s.ns.iface("eth0").unwrap().has_addr(&a));
    a
}

#[test]
fn a_hot_plugged_interface_should_go_with_its_own_del_and_with_the_pods() {
    let s = Setup::new("dg-life");
    let d = s.start("d");
    let id = "dg-life-1";
    let eth0 = attach(&s, &d, id);
    let wanted = format!("{}.77/24", s.hp_subnet.prefix);
    let wanted_mac = "02:00:00:00:00:5e";

    let r = delegate(
        &d,
        "ADD",
        id,
        &s.ns,
        "net5",
        &s.hp_config(),
        json!({"ips": [wanted], "mac": wanted_mac, "cni-args": null}),
    );
    let body = ok_200(&d, &r);
    // multus's answer: the 1.1.0 result under "Result".
    let res = &body["Result"];
    assert_eq!(res["cniVersion"], "1.1.0", "{body}");
    assert_eq!(address(res), wanted, "{body}");
    let net5 = s.ns.iface("net5").expect("net5 in the container");
    assert!(net5.has_addr(&wanted), "{net5:?}");
    assert_eq!(mac(&s.ns, "net5"), wanted_mac);
    assert_eq!(s.e.reservations(HP_NET), [bare(&wanted)]);
    assert_eq!(bridge_ports(&s.hp_br.name).len(), 1);
    let rec = s.record(id);
    let hp = rec["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["ifname"] == "net5")
        .unwrap_or_else(|| panic!("net5 not recorded: {rec}"));
    assert_eq!(hp["hotPluggedInto"], "eth0", "{rec}");
    // CHECK of that one network passes.
    ok_200(
        &d,
        &delegate(&d, "CHECK", id, &s.ns, "net5", &s.hp_config(), json!(null)),
    );

    // Unplugged: net5, its port and its address go; eth0 stays.
    let r = delegate(&d, "DEL", id, &s.ns, "net5", &s.hp_config(), json!(null));
    assert_eq!(ok_200(&d, &r), Value::Null);
    assert!(!s.ns.has_link("net5"), "{:?}", s.ns.ifaces());
    assert_eq!(s.e.reservations(HP_NET), Vec::<String>::new());
    assert_eq!(bridge_ports(&s.hp_br.name), Vec::<String>::new());
    assert!(s.ns.iface("eth0").unwrap().has_addr(&eth0));
    assert_eq!(s.e.reservations(POD_NET), [bare(&eth0)]);
    assert!(
        !String::from_utf8_lossy(&s.record_bytes(id)).contains("net5"),
        "{}",
        s.record(id)
    );

    // Plugged again, then the runtime's DEL of the pod takes everything.
    let r = delegate(&d, "ADD", id, &s.ns, "net5", &s.hp_config(), json!({}));
    let again = address(&ok_200(&d, &r)["Result"]);
    assert!(s.ns.iface("net5").unwrap().has_addr(&again));
    ok(&d, &cni(&d, "DEL", id, &s.ns, "eth0"));
    assert!(
        !s.ns.has_link("net5") && !s.ns.has_link("eth0"),
        "{:?}\n{}",
        s.ns.ifaces(),
        d.log_text()
    );
    assert_eq!(s.e.reservations(HP_NET), Vec::<String>::new());
    assert_eq!(s.e.reservations(POD_NET), Vec::<String>::new());
    assert_eq!(bridge_ports(&s.hp_br.name), Vec::<String>::new());
    assert_eq!(bridge_ports(&s.pod_br.name), Vec::<String>::new());
    assert_eq!(s.e.records(), Vec::<String>::new());
}

#[test]
fn gc_should_keep_a_hot_plugged_interface_with_its_pod_and_drop_it_with_it() {
    let s = Setup::new("dg-gc");
    let d = s.start("d");
    let id = "dg-gc-1";
    let eth0 = attach(&s, &d, id);
    let r = delegate(&d, "ADD", id, &s.ns, "net5", &s.hp_config(), json!({}));
    let net5 = address(&ok_200(&d, &r)["Result"]);

    // The runtime lists only its own attachment: net5 is part of it.
    gc(&d, json!([{"containerID": id, "ifname": "eth0"}]));
    assert!(s.ns.iface("net5").unwrap().has_addr(&net5));
    assert_eq!(s.e.reservations(HP_NET), [bare(&net5)]);
    assert!(s.ns.iface("eth0").unwrap().has_addr(&eth0));

    // The pod is gone for the runtime: both go.
    gc(&d, json!([]));
    assert!(
        !s.ns.has_link("net5") && !s.ns.has_link("eth0"),
        "{:?}",
        s.ns.ifaces()
    );
    assert_eq!(s.e.reservations(HP_NET), Vec::<String>::new());
    assert_eq!(s.e.reservations(POD_NET), Vec::<String>::new());
    assert_eq!(s.e.records(), Vec::<String>::new());
}

/// GC through plexus-shim with `valid` as the valid attachments.
fn gc(d: &Daemon, valid: Value) {
    ok(d, &shim::finish(gc_call(d, valid)));
}

#[test]
fn a_taken_interface_name_or_an_unknown_container_should_fail_and_change_nothing() {
    let s = Setup::new("dg-taken");
    // Leaves a mark when it runs at all.
    s.e.fake(
        "tattle",
        r#"touch "$DIR/ran.$CNI_IFNAME"; printf '%s' "$STDIN" | /usr/lib/cni/bridge"#,
    );
    let d = s.start("d");
    let id = "dg-taken-1";
    attach(&s, &d, id);
    let r = delegate(&d, "ADD", id, &s.ns, "net5", &s.hp_config(), json!({}));
    ok_200(&d, &r);
    let before = s.record_bytes(id);
    let reserved = s.e.reservations(HP_NET);
    let links: Vec<String> = s.ns.ifaces().into_iter().map(|i| i.name).collect();
    let mut tattle = s.hp_config();
    tattle["type"] = "tattle".into();
    tattle["name"] = "other-net".into();

    for (ifname, holder) in [
        ("eth0", "the runtime's attachment \"eth0\""),
        ("net5", "network \"hp-net\", hot-plugged into \"eth0\""),
    ] {
        let (code, msg) = error_400(&delegate(&d, "ADD", id, &s.ns, ifname, &tattle, json!({})));
        assert_eq!(code, 4, "{msg}");
        assert!(
            msg.contains(&format!(
                "interface \"{ifname}\" is already in use by {holder}"
            )),
            "{msg}"
        );
        assert!(!s.e.dir.join(&format!("ran.{ifname}")).exists());
    }
    assert_eq!(s.record_bytes(id), before);
    assert_eq!(s.e.reservations(HP_NET), reserved);
    let now: Vec<String> = s.ns.ifaces().into_iter().map(|i| i.name).collect();
    assert_eq!(now, links);

    // A container the runtime never attached through plexusd.
    let other = Netns::new();
    let (code, msg) = error_400(&delegate(
        &d,
        "ADD",
        "dg-taken-none",
        &other,
        "net5",
        &tattle,
        json!({}),
    ));
    assert_eq!(code, 3, "{msg}");
    assert!(
        msg.contains("\"dg-taken-none\" has no attachment recorded"),
        "{msg}"
    );
    assert!(!s.e.dir.join("ran.net5").exists());
    assert!(!s.e.record("dg-taken-none").exists());
    assert!(!other.has_link("net5"));
}

#[test]
fn a_failing_hot_plug_should_roll_back_and_leave_the_record_as_it_was() {
    let s = Setup::new("dg-fail");
    s.e.fake(
        "refuse",
        r#"case "$CNI_COMMAND" in
  ADD) echo '{"code":7,"msg":"refused on purpose"}'; exit 1 ;;
esac
exit 0"#,
    );
    let d = s.start("d");
    let id = "dg-fail-1";
    let eth0 = attach(&s, &d, id);
    let before = s.record_bytes(id);
    // bridge + host-local run, then the second plugin fails.
    let mut list = conflist(
        HP_NET,
        "1.0.0",
        vec![
            bridge(&s.hp_br.name, s.e.host_local(&s.hp_subnet)),
            json!({"type": "refuse"}),
        ],
    );
    list["cniVersion"] = "1.0.0".into();
    let (code, msg) = error_400(&delegate(&d, "ADD", id, &s.ns, "net5", &list, json!({})));
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("refused on purpose"), "{msg}");
    assert!(!s.ns.has_link("net5"), "{:?}", s.ns.ifaces());
    assert_eq!(s.e.reservations(HP_NET), Vec::<String>::new());
    assert_eq!(bridge_ports(&s.hp_br.name), Vec::<String>::new());
    assert_eq!(s.record_bytes(id), before);
    assert!(s.ns.iface("eth0").unwrap().has_addr(&eth0));
}

/// A daemon killed (-9) while a hot-plug's plugins run: after a restart,
/// the runtime's DEL of the pod also removes what the cut-short hot-plug
/// made (the bridge's net5 and host-local's address).
#[test]
fn the_pods_del_after_a_crash_should_remove_a_cut_short_hot_plug() {
    let s = Setup::new("dg-crash");
    // Second in the hot-plugged list: says it started, then waits on a
    // fifo nobody writes.
    s.e.fake(
        "stall",
        r#"if [ "$CNI_COMMAND" = ADD ]; then
  mkfifo "$DIR/fifo" 2>/dev/null
  touch "$DIR/stalled"
  read -r _ < "$DIR/fifo"
fi
exit 0"#,
    );
    let mut d = s.start("d");
    let id = "dg-crash-1";
    attach(&s, &d, id);
    let list = conflist(
        HP_NET,
        "1.0.0",
        vec![
            bridge(&s.hp_br.name, s.e.host_local(&s.hp_subnet)),
            json!({"type": "stall"}),
        ],
    );
    let sock = d.sock.clone();
    let body = {
        let ns_path = s.ns.path.clone();
        let list = list.clone();
        move || {
            let body = json!({
                "env": {"CNI_ARGS": POD_ARGS, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": id,
                        "CNI_IFNAME": "net5", "CNI_NETNS": ns_path},
                "config": base64::engine::general_purpose::STANDARD
                    .encode(serde_json::to_vec(&list).unwrap()),
                "interfaceAttributes": {"cni-args": null},
            });
            let _ = http::request(&sock, "POST", "/delegate", &body.to_string().into_bytes());
        }
    };
    let pending = std::thread::spawn(body);
    wait_until(SETTLE, "the stalling plugin to start", || {
        s.e.dir.join("stalled").exists()
    });
    assert!(s.ns.has_link("net5"));
    assert_eq!(s.e.reservations(HP_NET).len(), 1);
    d.signal(libc::SIGKILL);
    d.wait_exit(SETTLE);
    pending.join().unwrap();

    let d2 = s.start("d2");
    ok(&d2, &Call::new("DEL", id, &s.ns, "eth0").run(&d2));
    assert!(
        !s.ns.has_link("net5") && !s.ns.has_link("eth0"),
        "{:?}\n{}",
        s.ns.ifaces(),
        d2.log_text()
    );
    assert_eq!(s.e.reservations(HP_NET), Vec::<String>::new());
    assert_eq!(s.e.reservations(POD_NET), Vec::<String>::new());
    assert_eq!(bridge_ports(&s.hp_br.name), Vec::<String>::new());
    assert_eq!(s.e.records(), Vec::<String>::new());
    assert!(s.e.fake_processes().is_empty());
}

/// `/delegate` takes its slot where `/cni` does: with one slot and a short
/// queue, each waits behind the other and is answered 503 (code 11) when
/// the queue times out.
#[test]
fn delegate_and_cni_should_share_the_admission_slots() {
    let e = Engine::new("dg-admit");
    // Holds its slot until `$DIR/go.<ifname>` exists.
    e.fake(
        "gate",
        &format!(
            r#"if [ "$CNI_COMMAND" = ADD ]; then
  touch "$DIR/started.$CNI_IFNAME"
  for _ in $(seq 2000); do [ -e "$DIR/go.$CNI_IFNAME" ] && break; sleep 0.01; done
  {}
fi
exit 0"#,
            Engine::pass_through()
        ),
    );
    let net = conflist("gate-net", "1.0.0", vec![json!({"type": "gate"})]);
    e.write_network("10-gate.conflist", &net);
    let mut cfg = e.config("gate-net", "20s");
    cfg["connectionLimit"] = 1.into();
    cfg["queueTimeout"] = "300ms".into();
    let mut d = Daemon::start(&e.dir, "d", cfg);
    d.ready();
    let ns = Netns::new();
    let started = |ifname: &str| e.dir.join(&format!("started.{ifname}")).exists();
    let go = |ifname: &str| fs::write(e.dir.join(&format!("go.{ifname}")), b"").unwrap();
    let refused = |r: &Response| {
        assert_eq!(r.status, 503, "{}", r.body_str());
        assert_eq!(r.json()["code"], 11, "{}", r.body_str());
    };

    // /cni holds the slot: /delegate is not admitted.
    let add = Call::new("ADD", "dg-admit-1", &ns, "eth0").spawn(&d);
    wait_until(SETTLE, "the runtime's ADD to run", || started("eth0"));
    refused(&delegate(
        &d,
        "ADD",
        "dg-admit-1",
        &ns,
        "net5",
        &net,
        json!({}),
    ));
    assert!(!started("net5"));
    go("eth0");
    ok(&d, &add.finish());

    // /delegate holds it: /cni is not admitted.
    let pending = {
        let (sock, ns_path, net) = (d.sock.clone(), ns.path.clone(), net.clone());
        std::thread::spawn(move || {
            let body = json!({
                "env": {"CNI_ARGS": POD_ARGS, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "dg-admit-1",
                        "CNI_IFNAME": "net5", "CNI_NETNS": ns_path},
                "config": base64::engine::general_purpose::STANDARD
                    .encode(serde_json::to_vec(&net).unwrap()),
            });
            http::request(&sock, "POST", "/delegate", &body.to_string().into_bytes()).unwrap()
        })
    };
    wait_until(SETTLE, "the hot-plug to run", || started("net5"));
    let other = Call::new("ADD", "dg-admit-2", &ns, "eth0").run(&d);
    let (code, msg) = (
        other.json()["code"].as_u64(),
        other.json()["msg"].to_string(),
    );
    assert_eq!(code, Some(11), "{msg}");
    assert!(!e.record("dg-admit-2").exists());
    go("net5");
    let r = pending.join().unwrap();
    ok_200(&d, &r);
}

/// The controller also removes networks the pod got at its creation: such
/// a network of the runtime's attachment is unplugged alone; the runtime's
/// own interface is refused; an interface nothing recorded gets the DEL of
/// the request's network, as from multus.
#[test]
fn an_additional_network_of_the_pod_should_be_unplugged_alone() {
    let s = Setup::new("dg-extra");
    s.e.fake(
        "tattle",
        r#"touch "$DIR/ran.$CNI_COMMAND.$CNI_IFNAME"; exit 0"#,
    );
    let mut hp = s.hp_config();
    hp["capabilities"] = json!({});
    s.e.write_network("20-hp.conf", &hp);
    let d = s.start("d");
    let id = "dg-extra-1";
    let res = ok(
        &d,
        &Call::new("ADD", id, &s.ns, "eth0")
            .args(&format!("IgnoreUnknown=1;PLEXUS_NETWORKS={HP_NET}@net1"))
            .run(&d),
    );
    let eth0 = address(&res);
    assert!(s.ns.has_link("net1"), "{:?}", s.ns.ifaces());
    assert_eq!(s.e.reservations(HP_NET).len(), 1);

    let (code, msg) = error_400(&delegate(&d, "DEL", id, &s.ns, "eth0", &hp, json!({})));
    assert_eq!(code, 4, "{msg}");
    assert!(
        msg.contains("interface \"eth0\" is the runtime's attachment"),
        "{msg}"
    );
    assert!(s.ns.iface("eth0").unwrap().has_addr(&eth0));

    ok_200(&d, &delegate(&d, "DEL", id, &s.ns, "net1", &hp, json!({})));
    assert!(!s.ns.has_link("net1"), "{:?}", s.ns.ifaces());
    assert_eq!(s.e.reservations(HP_NET), Vec::<String>::new());
    assert!(s.ns.iface("eth0").unwrap().has_addr(&eth0));
    let rec = s.record(id);
    let networks: Vec<&str> = rec["attachments"][0]["delegates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["ifname"].as_str().unwrap())
        .collect();
    assert_eq!(networks, ["eth0"], "{rec}");

    let before = s.record_bytes(id);
    let mut tattle = hp.clone();
    tattle["type"] = "tattle".into();
    ok_200(
        &d,
        &delegate(&d, "DEL", id, &s.ns, "net9", &tattle, json!({})),
    );
    assert!(s.e.dir.join("ran.DEL.net9").exists());
    assert_eq!(s.record_bytes(id), before);

    ok(&d, &cni(&d, "DEL", id, &s.ns, "eth0"));
    assert_eq!(s.e.reservations(POD_NET), Vec::<String>::new());
    assert_eq!(s.e.records(), Vec::<String>::new());
}
