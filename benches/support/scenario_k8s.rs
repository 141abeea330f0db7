//! Scenario 10: ADD and DEL of a Kubernetes pod with two networks (the
//! cluster network from confDir and one NetworkAttachmentDefinition named
//! in the pod's annotation) through plexus-shim and plexusd watching a test
//! API server, side by side with the same two networks chosen statically
//! (`PLEXUS_NETWORKS`) and with executing the two plugins directly; and the
//! API calls each ADD and DEL make.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::daemon_metrics::{metric, metrics_text};
use crate::procs::{Call, Outcome};
use crate::report::{Section, Table};
use crate::setup::{
    breakdown_table, minus, shim_call_args, side_rows, start_daemon, write_network, AddDel,
    Failures, Network, CNI_ARGS, CNI_BIN,
};
use crate::stats::{fmt_delta, fmt_ms, fmt_ratio, ms, ratio, Samples};
use crate::support::cni::Engine;
use crate::support::kube::{FakeApi, Logged};
use crate::support::netns::{Link, Netns, Subnet};
use crate::Counts;

/// The node the daemon serves; every pod is scheduled on it.
const NODE: &str = "bench-node";
/// The pods' namespace, and the NetworkAttachmentDefinition's.
const POD_NS: &str = "bench";
/// The NetworkAttachmentDefinition the pods' annotation names.
const NAD: &str = "second";
const NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
const STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Direct,
    Static,
    Kube,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Direct => "direct (two plugin executions)",
            Side::Static => "plexus, static selection",
            Side::Kube => "plexus, Kubernetes selection",
        }
    }
}

struct SideRun {
    side: Side,
    sock: Option<PathBuf>,
    add: Samples,
    del: Samples,
    fails: Failures,
}

impl SideRun {
    fn new(side: Side, sock: Option<PathBuf>) -> Self {
        Self {
            side,
            sock,
            add: Samples::new(),
            del: Samples::new(),
            fails: Failures::default(),
        }
    }
}

/// API calls seen during the calls of one kind.
#[derive(Default)]
struct ApiTally {
    calls: usize,
    patches: usize,
    gets: usize,
    max_per_call: usize,
    /// Calls that made exactly the expected number of requests.
    as_expected: usize,
}

impl ApiTally {
    fn note(&mut self, calls: &[Logged], expected: usize) {
        self.calls += calls.len();
        self.patches += calls.iter().filter(|c| c.method == "PATCH").count();
        self.gets += calls.iter().filter(|c| c.method == "GET").count();
        self.max_per_call = self.max_per_call.max(calls.len());
        if calls.len() == expected {
            self.as_expected += 1;
        }
    }
}

/// A pod's CNI_ARGS as a runtime gives them.
fn pod_args(name: &str, uid: &str, cid: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={POD_NS};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid}"
    )
}

/// A pod's name and uid, for a timed iteration or a warm-up one.
fn pod(tag: &str, i: usize) -> (String, String) {
    (format!("pod-{tag}-{i}"), format!("uid-{tag}-{i}"))
}

/// `call` with `CNI_ARGS` replaced by `args`.
fn with_args(mut call: Call, args: &str) -> Call {
    for (k, v) in &mut call.env {
        if k == "CNI_ARGS" {
            *v = args.to_string();
        }
    }
    call
}

/// Both networks' ADD (in order) or DEL (reverse order) executed directly,
/// each with the result of its ADD as `prevResult` at DEL. The outcome is
/// the first failure, or the last call's, with the summed time.
fn direct_pair(
    nets: &[&Network; 2],
    command: &str,
    cid: &str,
    netns: &str,
    args: &str,
    prev: &mut [Option<Value>; 2],
) -> Outcome {
    let order: [usize; 2] = if command == "DEL" { [1, 0] } else { [0, 1] };
    let mut total = Duration::ZERO;
    let mut last = None;
    for k in order {
        let call = with_args(nets[k].direct(command, cid, netns, prev[k].as_ref()), args);
        let mut o = call.run();
        total += o.elapsed;
        if command == "ADD" {
            prev[k] = o.json();
        }
        let failed = !o.ok();
        o.elapsed = total;
        last = Some(o);
        if failed {
            break;
        }
    }
    let mut o = last.expect("two networks");
    o.elapsed = total;
    o
}

/// What `netns` lacks of eth0 and net1 with an IPv4 address in their
/// subnets, as a sentence; `None` when both are there.
fn missing(netns: &Netns, subnets: &[Subnet; 2], ifnames: [&str; 2]) -> Option<String> {
    let ifaces = netns.ifaces();
    let mut lacks = Vec::new();
    for (ifname, subnet) in ifnames.iter().zip(subnets) {
        let ok = ifaces
            .iter()
            .find(|i| i.name == *ifname)
            .is_some_and(|i| i.addrs.iter().any(|a| subnet.holds(a)));
        if !ok {
            lacks.push(format!("{ifname} with an address in {}", subnet.cidr()));
        }
    }
    (!lacks.is_empty()).then(|| format!("the namespace lacks {}", lacks.join(" and ")))
}

/// Sum of a histogram's samples between two scrapes, in milliseconds.
fn hist_sum_ms(before: &str, after: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let sum = |t: &str| metric(t, &format!("{name}_sum"), labels);
    Some((sum(after)? - sum(before).unwrap_or(0.0)) * 1000.0)
}

pub fn kubernetes(sec: &mut Section, c: &Counts) {
    let n = c.k8s;
    let engine = Engine::new("bench-k8s");
    let subnets = [Subnet::new(), Subnet::new()];
    let bridges = [Link::bridge(), Link::bridge()];
    let cluster = Network::bridge(&bridges[0].name, engine.host_local(&subnets[0]));
    let second = Network::bridge(&bridges[1].name, engine.host_local(&subnets[1])).renamed(
        "plexus-bench-second",
        "20-bench-second.conflist",
        "net1",
    );
    let nets = [&cluster, &second];

    // The Kubernetes daemon's confDir holds the cluster network only; the
    // static one's also the second network. Each has its own stateDir.
    write_network(&engine, &cluster);
    let static_conf = engine.dir.join("conf-static");
    let kube_state = engine.dir.join("state-kube");
    for d in [&static_conf, &kube_state] {
        fs::create_dir_all(d).expect("create a scratch directory");
    }
    for net in nets {
        fs::write(
            static_conf.join(&net.file),
            serde_json::to_vec_pretty(&net.config).expect("config JSON"),
        )
        .expect("write a network config");
    }

    // Every pod is stored before the daemon starts: its first list holds
    // them all and no ADD needs a GET.
    let api = FakeApi::start();
    api.put_nad(POD_NS, NAD, Some(&second.config.to_string()), json!({}));
    for (tag, count) in [("warm", c.warmup), ("timed", n)] {
        for i in 0..count {
            let (name, uid) = pod(tag, i);
            api.put_pod(POD_NS, &name, &uid, NODE, json!({ NETWORKS: NAD }));
        }
    }
    let kubeconfig = engine.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);

    sec.para(&format!(
        "Two networks per pod, each `bridge` (bridge made beforehand, no isGateway/ipMasq) + \
         `host-local` (dataDir in a temp dir): `{}` on {} as CNI_IFNAME `eth0` (the cluster \
         network, from confDir) and `{}` on {} as `net1`. `plexus, Kubernetes selection`: \
         plexusd with `kubeconfig` and `nodeName` watching a test API server in the bench \
         process (plain HTTP on 127.0.0.1, {} pods of this node and the \
         NetworkAttachmentDefinition `{POD_NS}/{NAD}` stored before the daemon starts); each \
         pod's annotation `{NETWORKS}: {NAD}` selects the second network, and each call \
         carries CNI_ARGS `IgnoreUnknown=1;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;\
         K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=..` of its own pod. `plexus, static \
         selection`: a second plexusd without kubeconfig whose confDir also holds the second \
         network, selected with CNI_ARGS `IgnoreUnknown=1;PLEXUS_NETWORKS={}`: the same daemon \
         work minus the Kubernetes part. `direct`: the two plugins executed one after the \
         other (ADD cluster then second, DEL in reverse order, DEL with each ADD's result as \
         `prevResult`) with the environment and stdin plexusd gives them and the pod's \
         CNI_ARGS; its time is the sum of both executions.",
        cluster.name,
        subnets[0].cidr(),
        second.name,
        subnets[1].cidr(),
        n + c.warmup,
        second.name,
    ));
    sec.para(&format!(
        "{n} iterations. An iteration makes one ADD per side, then one DEL per side, each \
         side with a fresh network namespace, container id and (Kubernetes) pod; the side \
         that goes first rotates every iteration. {} untimed ADD+DEL pairs per side come \
         first; after their ADDs the bench checks that each side's namespace has `eth0` and \
         `net1` with addresses in their subnets.",
        c.warmup
    ));

    let static_d = start_daemon(
        &engine,
        "static",
        &cluster,
        &engine.state_dir,
        json!({ "confDir": static_conf }),
    );
    let kube_d = start_daemon(
        &engine,
        "kube",
        &cluster,
        &kube_state,
        json!({
            "kubeconfig": kubeconfig,
            "nodeName": NODE,
            "kubernetesRequestTimeout": "5s",
        }),
    );

    let mut sides = vec![
        SideRun::new(Side::Direct, None),
        SideRun::new(Side::Static, Some(static_d.sock.clone())),
        SideRun::new(Side::Kube, Some(kube_d.sock.clone())),
    ];
    let static_args = format!("{CNI_ARGS};PLEXUS_NETWORKS={}", second.name);
    // The call of `side` for container `cid` of pod `(name, uid)`.
    let call = |s: &SideRun,
                command: &str,
                cid: &str,
                netns: &Netns,
                pod: &(String, String),
                prev: &mut [Option<Value>; 2]|
     -> Outcome {
        let args = pod_args(&pod.0, &pod.1, cid);
        match (s.side, &s.sock) {
            (Side::Static, Some(sock)) => {
                shim_call_args(sock, command, cid, &netns.path, "eth0", &static_args).run()
            }
            (Side::Kube, Some(sock)) => {
                shim_call_args(sock, command, cid, &netns.path, "eth0", &args).run()
            }
            _ => direct_pair(&nets, command, cid, &netns.path, &args, prev),
        }
    };

    // Warm-up (not counted), with a check that both networks arrive.
    let mut attached = Failures::default();
    for i in 0..c.warmup {
        let p = pod("warm", i);
        for (j, s) in sides.iter().enumerate() {
            let netns = Netns::new();
            let cid = format!("k8s-warm-{i}-{j}");
            let mut prev = [None, None];
            let add = call(s, "ADD", &cid, &netns, &p, &mut prev);
            if add.ok() {
                if let Some(why) = missing(&netns, &subnets, ["eth0", "net1"]) {
                    attached.note_msg(format!("{} ADD: {why}", s.side.label()));
                }
            } else {
                attached.note_msg(format!("{} ADD: {}", s.side.label(), add.describe()));
            }
            let _ = call(s, "DEL", &cid, &netns, &p, &mut prev);
        }
    }

    let scrape = |sides: &[SideRun]| -> Vec<String> {
        sides
            .iter()
            .map(|s| s.sock.as_deref().map(metrics_text).unwrap_or_default())
            .collect()
    };
    let before = scrape(&sides);
    let mut api_add = ApiTally::default();
    let mut api_del = ApiTally::default();
    // From the PATCH's arrival at the API server to the shim's exit.
    let mut after_patch = Samples::new();

    eprintln!("   {n} iterations x {} sides", sides.len());
    let k = sides.len();
    for i in 0..n {
        let p = pod("timed", i);
        let order: Vec<usize> = (0..k).map(|j| (i + j) % k).collect();
        let netns: Vec<Netns> = (0..k).map(|_| Netns::new()).collect();
        let mut prev: Vec<[Option<Value>; 2]> = vec![[None, None]; k];
        for command in ["ADD", "DEL"] {
            for &j in &order {
                let cid = format!("k8s-{i}-{j}");
                let mark = api.mark();
                let t0 = Instant::now();
                let o = call(&sides[j], command, &cid, &netns[j], &p, &mut prev[j]);
                let end = t0 + o.elapsed;
                let s = &mut sides[j];
                if s.side == Side::Kube {
                    let calls = api.calls_since(mark);
                    if command == "ADD" {
                        api_add.note(&calls, 1);
                        if let Some(patch) = calls.iter().find(|c| c.method == "PATCH") {
                            after_patch.push(end.saturating_duration_since(patch.at));
                        }
                    } else {
                        api_del.note(&calls, 0);
                    }
                }
                if command == "ADD" {
                    s.add.push(o.elapsed);
                } else {
                    s.del.push(o.elapsed);
                }
                s.fails.note(command, &o);
            }
        }
    }
    let after = scrape(&sides);

    let p90 = |s: &Samples| s.quantile(0.9);
    let mut t = Table::new(&[
        "call",
        "n",
        "direct p50",
        "direct p90",
        "direct p99",
        "plexus p50",
        "plexus p90",
        "plexus p99",
        "plexus − direct (p50)",
        "plexus/direct p50",
        "plexus/direct p99",
    ]);
    let direct = &sides[0];
    for cmd in ["ADD", "DEL"] {
        for s in &sides[1..] {
            let (ds, ps) = if cmd == "ADD" {
                (&direct.add, &s.add)
            } else {
                (&direct.del, &s.del)
            };
            t.row(vec![
                format!("{cmd}, {}", s.side.label()),
                ps.len().to_string(),
                fmt_ms(ds.p50()),
                fmt_ms(p90(ds)),
                fmt_ms(ds.p99()),
                fmt_ms(ps.p50()),
                fmt_ms(p90(ps)),
                fmt_ms(ps.p99()),
                fmt_delta(ps.p50(), ds.p50()),
                fmt_ratio(ratio(ps.p50(), ds.p50())),
                fmt_ratio(ratio(ps.p99(), ds.p99())),
            ]);
        }
    }
    sec.table(&t);

    let (st, ku) = (&sides[1], &sides[2]);
    let mut d = Table::new(&[
        "call",
        "Kubernetes − static p50",
        "Kubernetes − static p90",
        "Kubernetes − static p99",
        "Kubernetes/static p50",
    ]);
    for (cmd, a, b) in [("ADD", &ku.add, &st.add), ("DEL", &ku.del, &st.del)] {
        d.row(vec![
            cmd.into(),
            fmt_delta(a.p50(), b.p50()),
            fmt_delta(p90(a), p90(b)),
            fmt_delta(a.p99(), b.p99()),
            fmt_ratio(ratio(a.p50(), b.p50())),
        ]);
    }
    sec.para("What Kubernetes selection adds over static selection of the same networks:");
    sec.table(&d);
    attached.report(sec, "warm-up attachment (check)");
    for s in &sides {
        s.fails.report(sec, s.side.label());
    }

    // API calls: counted from the test API server's request log, watches
    // left out (FakeApi::calls_since).
    let per = |x: usize, of: usize| {
        if of == 0 {
            "n/a".to_string()
        } else {
            format!("{:.2}", x as f64 / of as f64)
        }
    };
    let mut a = Table::new(&[
        "call",
        "n",
        "API calls per call (mean)",
        "PATCH per call",
        "GET per call",
        "most in one call",
        "calls with the expected count",
    ]);
    for (cmd, tally, expected) in [("ADD", &api_add, 1), ("DEL", &api_del, 0)] {
        a.row(vec![
            cmd.into(),
            n.to_string(),
            per(tally.calls, n),
            per(tally.patches, n),
            per(tally.gets, n),
            tally.max_per_call.to_string(),
            format!("{} of {n} (expected: {expected})", tally.as_expected),
        ]);
    }
    let with_status = (0..n)
        .filter(|&i| {
            let (name, _) = pod("timed", i);
            api.pod(POD_NS, &name)
                .and_then(|p| {
                    let text = p["metadata"]["annotations"][STATUS].as_str()?.to_string();
                    serde_json::from_str::<Value>(&text).ok()
                })
                .and_then(|v| v.as_array().map(Vec::len))
                == Some(2)
        })
        .count();
    sec.para(
        "Kubernetes API requests of the Kubernetes side, from the test API server's log \
         between the start and the end of each call (watch requests left out; a re-list \
         by the daemon's caches would count as a GET):",
    );
    sec.table(&a);
    sec.para(&format!(
        "Pods whose `{STATUS}` annotation names both networks after the run: {with_status} \
         of {n}. The daemon writes it before it answers, after both plugins ran: from the \
         PATCH's arrival at the test API server to the shim's exit (the server's answer, the \
         daemon's reply, the shim's exit) took p50 {}, p90 {} over {} ADDs.",
        fmt_ms(after_patch.p50()),
        fmt_ms(p90(&after_patch)),
        after_patch.len()
    ));

    // Where the time goes, from the daemons' own histograms.
    let calls_of = |s: &Samples| s.len() as f64;
    let mut rows: Vec<(String, AddDel)> = Vec::new();
    let mean = |s: &Samples| s.mean().map(ms);
    rows.push((
        "direct: both plugin executions (bench: spawn to exit, summed)".into(),
        [mean(&direct.add), mean(&direct.del)],
    ));
    let mut req_of: Vec<AddDel> = Vec::new();
    for (j, s) in sides.iter().enumerate().skip(1) {
        let cmds = ["command=\"ADD\"", "command=\"DEL\""];
        let count = [calls_of(&s.add), calls_of(&s.del)];
        let per_call = |v: Option<f64>, i: usize| v.map(|v| v / count[i]);
        let req = [0, 1].map(|i| {
            per_call(
                hist_sum_ms(
                    &before[j],
                    &after[j],
                    "plexus_request_duration_seconds",
                    &["endpoint=\"/cni\"", cmds[i]],
                ),
                i,
            )
        });
        let run = [0, 1].map(|i| {
            per_call(
                hist_sum_ms(
                    &before[j],
                    &after[j],
                    "plexus_plugin_duration_seconds",
                    &["plugin=\"bridge\"", cmds[i]],
                ),
                i,
            )
        });
        let e2e = [mean(&s.add), mean(&s.del)];
        let l = s.side.label();
        rows.extend(side_rows(l, e2e, req));
        rows.push((
            format!("{l}: daemon plugin runs, both networks (`plexus_plugin_duration_seconds`)"),
            run,
        ));
        rows.push((
            format!("{l}: → daemon work around the plugins (selection, records, API, JSON)"),
            minus(req, run),
        ));
        req_of.push(req);
    }
    if let [st_req, ku_req] = req_of[..] {
        rows.push((
            "→ Kubernetes part: daemon request time, Kubernetes − static".into(),
            minus(ku_req, st_req),
        ));
    }
    let b = breakdown_table(rows);
    sec.para(
        "Where the time goes (means over the timed calls; daemon times from its own \
         Prometheus histograms, scraped before and after the timed loop, divided by the \
         number of timed calls):",
    );
    sec.table(&b);
    sec.para(&format!(
        "Plugins from `{CNI_BIN}`; the static daemon's stateDir and the Kubernetes daemon's \
         are both in the temp dir. The test API server answers from memory over loopback, \
         without TLS, authentication, admission or an etcd write: against a real API server \
         every ADD also waits for that PATCH, so the Kubernetes side here is a lower bound."
    ));
    drop(kube_d);
    drop(static_d);
    drop(api);
}
