//! The environment a CNI plugin runs in, under a container runtime and
//! under plexusd, side by side: the probe plugin (tests/bins/probe.rs), last
//! in a chain of Debian's bridge and host-local, records what it sees
//! (credentials, capabilities, seccomp, the system calls it may make,
//! umask, resource limits, namespaces, where it may write, its environment
//! and descriptors) for ADD and DEL.
//!
//! (a) Debian's containerd as a node runs it: its installed
//! `containerd.service` (only `ExecStart=` and the output adapted) in a
//! private systemd manager (support::containerd, `start_as_service`),
//! whose CRI plugin runs the chain for a pod sandbox, as the kubelet asks;
//! (b) plexusd and plexus-spawner under the shipped units in the same kind
//! of private manager (systemd_units::Plexus), which run the chain for a
//! plexus-shim call.
//!
//! Every property whose value differs must be a row of the table under
//! [`SECTION`] in [`ENV_DOC`], which says why; a row whose property no
//! longer differs is only reported.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::support::containerd::{Containerd, Pod};
use crate::support::daemon::TestDir;
use crate::support::netns::{unique_name, Link, Netns, Subnet};
use crate::systemd_units::Plexus;

/// The document whose table lists the allowed differences.
const ENV_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/plugins.md");
/// The heading of the table's section in [`ENV_DOC`].
const SECTION: &str = "## The environment a plugin sees";
const PROBE: &str = env!("CARGO_BIN_EXE_plexus-test-probe");
/// The probe's name in the chain (its file name in each binDir).
const PROBE_TYPE: &str = "plexus-test-probe";
/// Debian's plugins.
const PLUGINS: &str = "/usr/lib/cni";

/// One probe record: property name to value.
type Seen = BTreeMap<String, String>;

/// What the probe recorded for ADD and for DEL.
struct Observation {
    add: Seen,
    del: Seen,
    /// The binDir the runner gave it (`CNI_PATH` is compared without it).
    bin_dir: PathBuf,
}

/// The host's `/tmp` (`<device>:<inode>`) and namespaces, which the probe
/// compares with its own (this test runs in the host's namespaces; pid 1's
/// may not be readable).
fn host_facts() -> (String, Value) {
    let tmp = fs::metadata("/tmp").unwrap();
    let mut ns = serde_json::Map::new();
    for e in fs::read_dir("/proc/self/ns").unwrap() {
        let e = e.unwrap();
        let link = fs::read_link(e.path()).unwrap();
        ns.insert(
            e.file_name().to_string_lossy().into_owned(),
            json!(link.display().to_string()),
        );
    }
    (format!("{}:{}", tmp.dev(), tmp.ino()), Value::Object(ns))
}

/// bridge + host-local (its store in `ipam`) + the probe writing to `out`.
fn chain(name: &str, bridge: &Link, subnet: &Subnet, ipam: &Path, out: &Path) -> Value {
    let (host_tmp, host_ns) = host_facts();
    json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {"type": "bridge", "bridge": bridge.name,
             "ipam": {"type": "host-local", "dataDir": ipam,
                      "ranges": [[{"subnet": subnet.cidr()}]]}},
            {"type": PROBE_TYPE, "probeOutput": out,
             "hostTmp": host_tmp, "hostNs": host_ns},
        ],
    })
}

/// The probe's record of `command` (`<out>.<command>.json`).
fn read_seen(out: &Path, command: &str) -> Seen {
    let path = format!("{}.{command}.json", out.display());
    let text = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the probe left no record of {command} at {path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// (a) The probe under containerd.service's CRI plugin: one pod sandbox,
/// run, then stopped (the DEL compared) and removed; `None` where no
/// private systemd manager can run.
fn under_containerd() -> Option<Observation> {
    let dir = TestDir::new("plugin-env");
    let bridge = Link::planned("b");
    let subnet = Subnet::new();
    let ctd = Containerd::start_as_service(&dir, "ctd")?;
    let bin_dir = ctd.dir.join("cni-bin");
    for p in ["bridge", "host-local"] {
        std::os::unix::fs::symlink(Path::new(PLUGINS).join(p), bin_dir.join(p)).unwrap();
    }
    std::os::unix::fs::symlink(PROBE, bin_dir.join(PROBE_TYPE)).unwrap();
    let out = dir.join("probe");
    let conf = chain("probe", &bridge, &subnet, &dir.join("ipam"), &out);
    let tmp = ctd.conf_dir.join(".10-probe.tmp");
    fs::write(&tmp, conf.to_string()).unwrap();
    fs::rename(&tmp, ctd.conf_dir.join("10-probe.conflist")).unwrap();
    ctd.wait_network_ready();

    let id = ctd.run(&Pod::new("plugin-env", &unique_name("p")));
    let add = read_seen(&out, "ADD");
    // StopPodSandbox's DEL, the one plexusd's DEL stands for. The
    // kubelet's RemovePodSandbox then has containerd run DEL once more,
    // with an empty CNI_NETNS and, its cached result gone, no prevResult.
    ctd.cri
        .stop_pod_sandbox(&id)
        .unwrap_or_else(|e| panic!("StopPodSandbox {id}: {e}\n{}", ctd.log_tail()));
    let del = read_seen(&out, "DEL");
    ctd.cri
        .remove_pod_sandbox(&id)
        .unwrap_or_else(|e| panic!("RemovePodSandbox {id}: {e}\n{}", ctd.log_tail()));
    Some(Observation { add, del, bin_dir })
}

/// (b) The probe under plexusd run by the shipped units: a plexus-shim ADD
/// then DEL into a fresh network namespace; `None` where no private
/// systemd manager can run.
fn under_plexusd() -> Option<Observation> {
    let bridge = Link::planned("b");
    let subnet = Subnet::new();
    // Before the manager, whose private mount namespace sees only the
    // mounts there were when it started.
    let ns = Netns::new();
    let p = Plexus::start(json!({}))?;
    let work = p.m.work_dir().to_path_buf();
    // Copies in the work dir: the unit has a /tmp of its own.
    let bin_dir = work.join("cni-bin");
    fs::create_dir_all(&bin_dir).unwrap();
    for plugin in ["bridge", "host-local", "loopback"] {
        fs::copy(Path::new(PLUGINS).join(plugin), bin_dir.join(plugin)).unwrap();
    }
    fs::copy(PROBE, bin_dir.join(PROBE_TYPE)).unwrap();
    let out = work.join("probe");
    let conf = chain("probe", &bridge, &subnet, &work.join("ipam"), &out);
    p.serve_network(conf, &bin_dir);

    let id = unique_name("c");
    let call = |cmd: &str| {
        let (mut env, stdin) = p.shim_call(cmd, &id, &ns.path);
        // The arguments containerd's CRI plugin gives every plugin.
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=plugin-env;K8S_POD_NAME=pod;\
             K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID=uid-pod"
        );
        for (k, v) in env.iter_mut() {
            if k == "CNI_ARGS" {
                v.clone_from(&args);
            }
        }
        let run = crate::support::shim::run(env, &stdin);
        assert_eq!(
            run.code,
            Some(0),
            "{cmd} through plexusd: {run:?}\n{}\n{}",
            p.m.describe_failure(),
            fs::read_to_string(work.join("plexusd.log")).unwrap_or_default()
        );
    };
    call("ADD");
    let add = read_seen(&out, "ADD");
    call("DEL");
    let del = read_seen(&out, "DEL");
    Some(Observation { add, del, bin_dir })
}

/// `seen` without what is unique to a run: `raw.*`, the container id and
/// network namespace, the binDir in `CNI_PATH`, the values in `CNI_ARGS`
/// (their names stay).
fn normalise(seen: &Seen, bin_dir: &Path) -> Seen {
    let bin = bin_dir.display().to_string();
    seen.iter()
        .filter(|(k, _)| !k.starts_with("raw."))
        .filter(|(k, _)| *k != "env.CNI_CONTAINERID" && *k != "env.CNI_NETNS")
        .map(|(k, v)| {
            let v = match k.as_str() {
                "env.CNI_PATH" => v
                    .split(':')
                    .map(|d| if d == bin { "<binDir>" } else { d })
                    .collect::<Vec<_>>()
                    .join(":"),
                "env.CNI_ARGS" => {
                    let mut names: Vec<&str> = v
                        .split(';')
                        .map(|kv| kv.split('=').next().unwrap_or(kv))
                        .collect();
                    names.sort();
                    names.join(";")
                }
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// The first column of the table of differences (the one whose header
/// names `under containerd` and `under plexusd`) in the section
/// [`SECTION`] of [`ENV_DOC`]: the properties allowed to differ.
fn documented_differences() -> BTreeSet<String> {
    let text = fs::read_to_string(ENV_DOC).unwrap_or_else(|e| panic!("read {ENV_DOC}: {e}"));
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != SECTION)
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect();
    let header = section.iter().position(|l| {
        l.starts_with('|') && l.contains("under containerd") && l.contains("under plexusd")
    });
    let Some(header) = header else {
        panic!("no table of differences under {SECTION:?} in {ENV_DOC}");
    };
    section[header + 2..]
        .iter()
        .take_while(|l| l.starts_with('|'))
        .filter_map(|r| r.split('|').nth(1))
        .map(|c| c.trim().trim_matches('`').to_string())
        .collect()
}

/// The properties whose values differ between `a` and `b`, with both.
fn differences(a: &Seen, b: &Seen) -> Vec<(String, String, String)> {
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let absent = String::from("<absent>");
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (a.get(k).unwrap_or(&absent), b.get(k).unwrap_or(&absent));
            (x != y).then(|| (k.clone(), x.clone(), y.clone()))
        })
        .collect()
}

#[test]
fn a_plugin_should_see_under_plexusd_what_it_sees_under_containerd() {
    if let Some(why) = crate::support::systemd::skip_reason() {
        println!("skipping: {why}");
        return;
    }
    let Some(ctd) = under_containerd() else {
        return;
    };
    let Some(plexus) = under_plexusd() else {
        return;
    };
    for (who, o) in [("containerd", &ctd), ("plexusd", &plexus)] {
        println!(
            "{who} ADD: {}",
            serde_json::to_string_pretty(&o.add).unwrap()
        );
    }
    let allowed = documented_differences();
    let mut unlisted = Vec::new();
    let mut listed = BTreeSet::new();
    for (command, a, b) in [
        ("ADD", &ctd.add, &plexus.add),
        ("DEL", &ctd.del, &plexus.del),
    ] {
        let a = normalise(a, &ctd.bin_dir);
        let b = normalise(b, &plexus.bin_dir);
        for (k, x, y) in differences(&a, &b) {
            println!("{command} {k}: containerd {x:?}, plexusd {y:?}");
            if allowed.contains(&k) {
                listed.insert(k);
            } else {
                unlisted.push(format!(
                    "{command}: `{k}` differs and is not in the table: containerd {x:?}, \
                     plexusd {y:?}"
                ));
            }
        }
    }
    for k in allowed.difference(&listed) {
        println!("warning: `{k}` is in the table of {ENV_DOC} but no longer differs");
    }
    assert!(
        unlisted.is_empty(),
        "{} propert{} of a plugin's environment differ{} between containerd and plexusd \
         without a row under {SECTION:?} in {ENV_DOC}:\n{}",
        unlisted.len(),
        if unlisted.len() == 1 { "y" } else { "ies" },
        if unlisted.len() == 1 { "s" } else { "" },
        unlisted.join("\n")
    );
}

/// What a plugin needs most, asserted directly for plexusd under the
/// shipped units: the runtime's umask, every capability, no seccomp
/// filter, no no_new_privs, the host's /run, /var/log and /tmp.
#[test]
fn a_plugin_should_see_what_it_sees_under_the_runtime() {
    let Some(seen) = under_plexusd() else {
        return;
    };
    let seen = seen.add;
    let host_status = fs::read_to_string("/proc/1/status").unwrap();
    let host_bounding = host_status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .unwrap()
        .trim()
        .to_string();
    let expected = [
        ("umask", "0022".to_string()),
        ("file_mode", "0644".to_string()),
        ("CapEff", host_bounding),
        ("Seccomp", "0".to_string()),
        ("NoNewPrivs", "0".to_string()),
        ("write./var/log", "ok".to_string()),
        ("write./run", "ok".to_string()),
        ("tmp", "host".to_string()),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(k, want)| seen.get(*k) != Some(want))
        .map(|(k, want)| format!("{k}: {:?}, not {want:?}", seen.get(*k)))
        .collect();
    assert!(
        wrong.is_empty(),
        "a plugin under plexusd does not see what it sees under the runtime:\n{}",
        wrong.join("\n")
    );
}
