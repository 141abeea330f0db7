//! STATUS covers every network each pod gets, not only the cluster
//! network: with a default network broken, every new pod would fail, so
//! STATUS fails and names it. Through plexus-shim, with Debian's plugins;
//! in Kubernetes, a default network that is a NetworkAttachmentDefinition
//! in multusNamespace is resolved as a pod's ADD resolves it.

use serde_json::{json, Value};

use crate::support::cni::{bridge, conflist, Engine, SYSTEM_PLUGINS};
use crate::support::daemon::Daemon;
use crate::support::kube::FakeApi;
use crate::support::netns::{Link, Subnet};
use crate::support::shim::Run;
use crate::support::systemd::poll_until;

const T: std::time::Duration = std::time::Duration::from_secs(20);

/// STATUS through plexus-shim (a runtime on CNI 1.1.0, the first with it).
fn status(daemon: &Daemon) -> Run {
    let stdin = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus-shim",
        "daemonSocketDir": daemon.sock.parent().unwrap(),
    }))
    .unwrap();
    crate::support::shim::run(
        [("CNI_COMMAND", "STATUS"), ("CNI_PATH", SYSTEM_PLUGINS)],
        &stdin,
    )
}

/// A 1.1.0 network on a bridge of its own.
fn network(engine: &Engine, name: &str, link: &Link, subnet: &Subnet) -> Value {
    conflist(
        name,
        "1.1.0",
        vec![bridge(&link.name, engine.host_local(subnet))],
    )
}

/// A 1.1.0 network whose plugin is not installed.
fn broken(name: &str) -> Value {
    conflist(name, "1.1.0", vec![json!({"type": "no-such-plugin"})])
}

fn assert_not_ready(run: &Run, network: &str) {
    assert_ne!(run.code, Some(0), "{run:?}");
    let msg = run.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains(&format!("network \"{network}\" is not ready")),
        "{run:?}"
    );
    assert!(
        !msg.contains("\"cluster\""),
        "the cluster network is fine: {msg}"
    );
}

#[test]
fn a_broken_default_network_should_fail_status_naming_it() {
    let engine = Engine::new("status-default");
    let links = [Link::planned("b"), Link::planned("b")];
    let subnets = [Subnet::new(), Subnet::new()];
    engine.write_network(
        "10-cluster.conflist",
        &network(&engine, "cluster", &links[0], &subnets[0]),
    );
    engine.write_network(
        "20-extra.conflist",
        &network(&engine, "extra", &links[1], &subnets[1]),
    );
    let mut config = engine.config("cluster", "20s");
    config["defaultNetworks"] = json!(["extra"]);
    let mut d = Daemon::start(&engine.dir, "d", config);
    d.ready();
    let run = status(&d);
    assert_eq!(run.code, Some(0), "{run:?}\n{}", d.log_text());

    // Its plugin is gone: the cluster network alone would pass.
    engine.write_network("20-extra.conflist", &broken("extra"));
    let run = status(&d);
    assert_not_ready(&run, "extra");
    assert!(run.stdout.contains("no-such-plugin"), "{run:?}");

    // It is gone altogether.
    std::fs::remove_file(engine.conf_dir.join("20-extra.conflist")).unwrap();
    assert_not_ready(&status(&d), "extra");
}

#[test]
fn a_default_network_that_is_a_nad_should_be_asked_as_the_nad_says() {
    let engine = Engine::new("status-nad");
    let links = [Link::planned("b"), Link::planned("b")];
    let subnets = [Subnet::new(), Subnet::new()];
    engine.write_network(
        "10-cluster.conflist",
        &network(&engine, "cluster", &links[0], &subnets[0]),
    );
    // `extra` is no file in confDir: the NAD kube-system/extra serves it.
    let api = FakeApi::start();
    let nad = network(&engine, "extra-net", &links[1], &subnets[1]).to_string();
    api.put_nad("kube-system", "extra", Some(&nad), json!({}));
    let mut config = engine.config("cluster", "20s");
    config["defaultNetworks"] = json!(["extra"]);
    let d = api.start_daemon(&engine.dir, config, "2s");
    let synced = poll_until(T, || status(&d).code == Some(0));
    assert!(synced, "{:?}\n{}", status(&d), d.log_text());

    api.put_nad(
        "kube-system",
        "extra",
        Some(&broken("extra-net").to_string()),
        json!({}),
    );
    assert!(
        poll_until(T, || status(&d).code != Some(0)),
        "{}",
        d.log_text()
    );
    let run = status(&d);
    assert_not_ready(&run, "extra");
    assert!(run.stdout.contains("no-such-plugin"), "{run:?}");
}
