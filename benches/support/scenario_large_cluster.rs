//! Scenario 12: a large cluster. plexusd starts against a test API server
//! holding 100,000 pods (250 of them on this node) and no
//! NetworkAttachmentDefinitions, 10,000 across 1,000 namespaces, or
//! 100,000; measured: the time to READY=1 (from exec and from the API
//! server's first answer), the daemon's memory once ready, what one NAD
//! change costs on the watches, and which pod lists and watches the daemon
//! makes.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::procs::{proc_cpu, status_kib};
use crate::report::{Section, Table, Target};
use crate::setup::{write_network, Network, CNI_BIN, LOG_LEVEL};
use crate::stats::{fmt_ms, Samples};
use crate::support::cni::Engine;
use crate::support::daemon::Daemon;
use crate::support::kube::{BulkConfigs, BulkSpec, FakeApi, Logged, Traffic};
use crate::Counts;

/// The node the daemon serves.
const NODE: &str = "large-node";
const PODS: usize = 100_000;
const PODS_ON_NODE: usize = 250;
const NAMESPACES: usize = 1_000;
/// The budget of the NAD cache at 10,000 NADs.
const NAD_CACHE_BUDGET_KIB: u64 = 2 * 1024;
const READY_BUDGET: Duration = Duration::from_secs(1);
/// Idle memory of a Kubernetes-mode plexusd once READY (VmRSS).
const IDLE_K8S_GOAL_KIB: u64 = 10 * 1024;

struct Case {
    label: &'static str,
    nads_per_namespace: usize,
    configs: BulkConfigs,
}

const CASES: [Case; 4] = [
    Case {
        label: "no NADs (baseline)",
        nads_per_namespace: 0,
        configs: BulkConfigs::Distinct,
    },
    Case {
        label: "10,000 NADs, each config its own",
        nads_per_namespace: 10,
        configs: BulkConfigs::Distinct,
    },
    Case {
        label: "10,000 NADs, 10 configs copied into every namespace",
        nads_per_namespace: 10,
        configs: BulkConfigs::Copied,
    },
    Case {
        label: "100,000 NADs, each config its own",
        nads_per_namespace: 100,
        configs: BulkConfigs::Distinct,
    },
];

/// One start of plexusd against one made-up cluster.
#[derive(Default)]
struct Run {
    /// exec → READY=1 received.
    ready: Option<Duration>,
    /// The API server's first answer → READY=1.
    after_answer: Option<Duration>,
    /// The last NAD list page answered → READY=1.
    after_last_page: Option<Duration>,
    /// Time the test API server spent on the NAD list requests (request
    /// read to body built).
    server_lists: Duration,
    /// plexusd's CPU time (user + system) when READY=1 arrived.
    cpu: Option<Duration>,
    rss_kib: Option<u64>,
    hwm_kib: Option<u64>,
    nads: Traffic,
    pods: Traffic,
    /// What one NAD change sent: NAD and pod watches.
    change_nads: Traffic,
    change_pods: Traffic,
    /// Pod lists and watches, with their field selectors.
    pod_requests: Vec<Logged>,
}

/// A query parameter, percent-decoded as far as selectors need.
fn param(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| {
            v.replace("%3D", "=")
                .replace("%2C", ",")
                .replace("%2F", "/")
        })
}

fn is_pod_collection(r: &Logged) -> bool {
    r.method == "GET" && r.path.ends_with("/pods")
}

fn only_this_node(r: &Logged) -> bool {
    param(&r.query, "fieldSelector").is_some_and(|s| {
        s.split(',')
            .any(|term| term == format!("spec.nodeName={NODE}"))
    })
}

fn one_run(engine: &Engine, case: &Case, tag: &str) -> Run {
    let api = FakeApi::start();
    api.fill(BulkSpec {
        namespaces: NAMESPACES,
        nads_per_namespace: case.nads_per_namespace,
        pods: PODS,
        pods_on_node: PODS_ON_NODE,
        node: NODE.into(),
        configs: case.configs,
    });
    let kubeconfig = engine.dir.join(&format!("kubeconfig-{tag}"));
    api.write_kubeconfig(&kubeconfig);
    let net = Network::loopback();
    let cfg = json!({
        "confDir": engine.conf_dir,
        "binDir": CNI_BIN,
        "stateDir": engine.dir.join(&format!("state-{tag}")),
        "clusterNetwork": net.name,
        "logLevel": LOG_LEVEL,
        "socketDir": engine.dir.join(&format!("sock-{tag}")),
        "kubeconfig": kubeconfig,
        "nodeName": NODE,
        "kubernetesRequestTimeout": "10s",
    });
    let mut run = Run::default();
    let t0 = Instant::now();
    let mut d = Daemon::start(&engine.dir, tag, cfg);
    d.wait_notify("READY=1", Duration::from_secs(60));
    let ready_at = Instant::now();
    run.rss_kib = status_kib(d.pid(), "VmRSS");
    run.hwm_kib = status_kib(d.pid(), "VmHWM");
    run.cpu = proc_cpu(d.pid()).map(|(own, _)| own);
    run.ready = Some(ready_at - t0);
    run.after_answer = api
        .first_answer()
        .map(|a| ready_at.saturating_duration_since(a));
    let log = api.log();
    let nad_lists: Vec<&Logged> = log
        .iter()
        .filter(|r| r.path.ends_with("/network-attachment-definitions") && !r.is_watch())
        .collect();
    run.after_last_page = nad_lists
        .iter()
        .filter_map(|r| r.answered)
        .max()
        .map(|a| ready_at.saturating_duration_since(a));
    run.server_lists = nad_lists
        .iter()
        .filter_map(|r| r.answered.map(|a| a.saturating_duration_since(r.at)))
        .sum();
    run.nads = api.nad_traffic();
    run.pods = api.pod_traffic();

    // One NAD changes: the first one's config (or, without NADs, one is
    // added). What reaches the daemon is counted until the event is out
    // and 200 ms more.
    let (nads_before, pods_before) = (api.nad_traffic(), api.pod_traffic());
    let (ns, name) = if case.nads_per_namespace == 0 {
        ("ns-000".to_string(), "added".to_string())
    } else {
        let w = case
            .nads_per_namespace
            .saturating_sub(1)
            .max(1)
            .to_string()
            .len();
        ("ns-000".to_string(), format!("net-{:0w$}", 0))
    };
    let changed: Value = json!({
        "cniVersion": "0.3.1",
        "name": name,
        "type": "macvlan",
        "master": "eth1",
        "ipam": {"type": "whereabouts", "range": "10.250.0.0/24"},
    });
    api.put_nad(&ns, &name, Some(&changed.to_string()), json!({}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.nad_traffic().watch_events == nads_before.watch_events && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(200));
    run.change_nads = api.nad_traffic() - nads_before;
    run.change_pods = api.pod_traffic() - pods_before;
    run.pod_requests = api.log().into_iter().filter(is_pod_collection).collect();
    d.terminate();
    d.wait_exit(Duration::from_secs(15));
    run
}

fn median(v: &mut [u64]) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn signed_mib(kib: i64) -> String {
    format!("{:+.1} MiB", kib as f64 / 1024.0)
}

pub fn large_cluster(sec: &mut Section, c: &Counts) {
    let engine = Engine::new("bench-large");
    write_network(&engine, &Network::loopback());
    let runs_per_case = c.large_runs;
    sec.para(&format!(
        "plexusd (cluster network: loopback) with `kubeconfig` and `nodeName: {NODE}` against \
         the test API server in the bench process (plain HTTP on 127.0.0.1), which holds \
         {PODS} pods in {NAMESPACES} namespaces ({PODS_ON_NODE} of them on this node, the \
         others spread over other nodes) and the NetworkAttachmentDefinitions of each case, \
         spread evenly over the same {NAMESPACES} namespaces. Every object is made up when a \
         list or a GET reaches it and looks as the API server sends it: a NAD carries a \
         macvlan `spec.config` of about 150 bytes (a VLAN per NAD name and, when each config \
         is its own, a whereabouts range per namespace), kubectl's \
         `last-applied-configuration` annotation (the object again) and `managedFields`, \
         about 1.1 KB of JSON; a pod's metadata carries labels, an owner, annotations and the \
         managedFields of the controller and the kubelet, about 2 KB. The server pages lists \
         (`limit`/`continue`) as the API server does. {runs_per_case} start(s) per case, a \
         fresh server each time."
    ));

    let mut results: Vec<(usize, Vec<Run>)> = Vec::new();
    for (k, case) in CASES.iter().enumerate() {
        eprintln!("   {}: {runs_per_case} start(s)", case.label);
        let runs = (0..runs_per_case)
            .map(|i| one_run(&engine, case, &format!("large-{k}-{i}")))
            .collect();
        results.push((k, runs));
    }

    let rss = |runs: &[Run]| median(&mut runs.iter().filter_map(|r| r.rss_kib).collect::<Vec<_>>());
    let base_rss = results.first().and_then(|(_, r)| rss(r));
    let mut t = Table::new(&[
        "case",
        "exec → READY=1 p50 (max)",
        "API server's first answer → READY=1 p50 (max)",
        "last NAD page → READY=1 p50",
        "plexusd CPU until READY=1 p50",
        "NAD list pages, items, bytes",
        "test API server building the NAD pages",
        "VmRSS once ready (median)",
        "− baseline",
        "VmHWM (median)",
    ]);
    for (k, runs) in &results {
        let case = &CASES[*k];
        let samples = |f: fn(&Run) -> Option<Duration>| {
            let mut s = Samples::new();
            for r in runs {
                if let Some(d) = f(r) {
                    s.push(d);
                }
            }
            s
        };
        let ready = samples(|r| r.ready);
        let after = samples(|r| r.after_answer);
        let last_page = samples(|r| r.after_last_page);
        let server = samples(|r| Some(r.server_lists));
        let cpu = samples(|r| r.cpu);
        let first = runs.first();
        let case_rss = rss(runs);
        t.row(vec![
            case.label.into(),
            format!("{} ({})", fmt_ms(ready.p50()), fmt_ms(ready.max())),
            format!("{} ({})", fmt_ms(after.p50()), fmt_ms(after.max())),
            fmt_ms(last_page.p50()),
            fmt_ms(cpu.p50()),
            first.map_or("n/a".into(), |r| {
                format!(
                    "{}, {}, {:.1} MB",
                    r.nads.lists,
                    r.nads.list_items,
                    r.nads.list_bytes as f64 / 1e6
                )
            }),
            fmt_ms(server.p50()),
            case_rss.map_or("n/a".into(), mib),
            match (case_rss, base_rss) {
                (Some(a), Some(b)) if *k > 0 => signed_mib(a as i64 - b as i64),
                _ => "—".into(),
            },
            median(&mut runs.iter().filter_map(|r| r.hwm_kib).collect::<Vec<_>>())
                .map_or("n/a".into(), mib),
        ]);
    }
    sec.para(
        "Start-up: READY=1 is sent once both caches (this node's pods, every NAD) have their \
         first full list. The API server's first answer is the first request the test server \
         answered; the time it spent building the NAD pages (JSON made up per request) is \
         part of the time to READY, as a real API server's time would be. The daemon fetches \
         a page, decodes it, then asks for the next, so the test server's work and the \
         daemon's add up; both share the machine's cores with whatever else runs (see the \
         load average above). plexusd's CPU time (utime + stime at READY=1, 10 ms ticks) is \
         its own share, start-up included.",
    );
    sec.table(&t);

    let mut w = Table::new(&[
        "case",
        "NAD watch events",
        "NAD watch bytes (bookmarks included)",
        "pod watch events",
        "lists during the change",
    ]);
    for (k, runs) in &results {
        if let Some(r) = runs.first() {
            w.row(vec![
                CASES[*k].label.into(),
                r.change_nads.watch_events.to_string(),
                r.change_nads.watch_bytes.to_string(),
                r.change_pods.watch_events.to_string(),
                (r.change_nads.lists + r.change_pods.lists).to_string(),
            ]);
        }
    }
    sec.para(
        "One NAD change after READY (the first NAD's `spec.config` replaced; without NADs one \
         is added): what the test server sent to the daemon until the event was out and 200 \
         ms more (first start of each case). The event carries the whole object as the API \
         server stores it.",
    );
    sec.table(&w);

    let mut p = Table::new(&[
        "case",
        "pod lists",
        "pod watches",
        "field selectors seen",
        "without spec.nodeName=<node>",
        "pods sent (lists + watch events)",
        "pod list bytes",
    ]);
    let mut strays_by_case = Vec::new();
    for (k, runs) in &results {
        let reqs: Vec<&Logged> = runs.iter().flat_map(|r| &r.pod_requests).collect();
        let lists = reqs.iter().filter(|r| !r.is_watch()).count();
        let watches = reqs.iter().filter(|r| r.is_watch()).count();
        let mut selectors: Vec<String> = reqs
            .iter()
            .map(|r| param(&r.query, "fieldSelector").unwrap_or_else(|| "(none)".into()))
            .collect();
        selectors.sort();
        selectors.dedup();
        let strays = reqs.iter().filter(|r| !only_this_node(r)).count();
        strays_by_case.push((*k, strays, reqs.len()));
        let sent: u64 = runs
            .iter()
            .map(|r| r.pods.list_items + r.pods.watch_events)
            .sum();
        let bytes: u64 = runs.iter().map(|r| r.pods.list_bytes).sum();
        p.row(vec![
            CASES[*k].label.into(),
            lists.to_string(),
            watches.to_string(),
            selectors.join(", "),
            strays.to_string(),
            format!("{} over {} start(s)", sent, runs.len()),
            format!("{:.1} KB", bytes as f64 / 1e3),
        ]);
    }
    sec.para(
        "Pod requests (lists and watches of the pod collection, from the test server's log, \
         every start of each case):",
    );
    sec.table(&p);

    // Targets.
    let rss_of = |k: usize| {
        results
            .iter()
            .find(|(i, _)| *i == k)
            .and_then(|(_, r)| rss(r))
    };
    let ready_max = |k: usize| {
        results
            .iter()
            .find(|(i, _)| *i == k)
            .and_then(|(_, runs)| runs.iter().filter_map(|r| r.after_answer).max())
    };
    for (k, budget) in [
        (1, NAD_CACHE_BUDGET_KIB),
        (2, NAD_CACHE_BUDGET_KIB),
        (3, NAD_CACHE_BUDGET_KIB * 10),
    ] {
        let cost = match (rss_of(k), base_rss) {
            (Some(a), Some(b)) => Some(a as i64 - b as i64),
            _ => None,
        };
        sec.target(Target::new(
            &format!(
                "NAD cache costs < {} MiB: {} (VmRSS − VmRSS without NADs)",
                budget / 1024,
                CASES[k].label
            ),
            &format!("< {} MiB", budget / 1024),
            cost.map_or("n/a".into(), signed_mib),
            cost.map(|c| c < budget as i64),
        ));
    }
    sec.target(Target::new(
        &format!(
            "plexusd idle RSS in Kubernetes mode: READY, no NADs, {PODS_ON_NODE} pods on this node"
        ),
        &format!("< {} MiB", IDLE_K8S_GOAL_KIB / 1024),
        base_rss.map_or("n/a".into(), mib),
        base_rss.map(|r| r < IDLE_K8S_GOAL_KIB),
    ));
    for (k, nads) in [(1, "10,000"), (3, "100,000")] {
        let r = ready_max(k);
        sec.target(Target::new(
            &format!("READY within 1 s of the API server answering, {nads} NADs (worst start)"),
            "≤ 1 s",
            fmt_ms(r),
            r.map(|d| d <= READY_BUDGET),
        ));
        if let Some((_, strays, total)) = strays_by_case.iter().find(|(i, _, _)| *i == k) {
            sec.target(Target::new(
                &format!("only this node's pods listed or watched, {nads} NADs"),
                "0 pod requests without spec.nodeName",
                format!("{strays} of {total}"),
                Some(*strays == 0 && *total > 0),
            ));
        }
    }
    sec.para(
        "Memory is VmRSS read right after READY=1, the median of the starts; VmHWM includes \
         what was freed again (pages being decoded). What a NAD costs at least: its namespace \
         and name (one small allocation), 48 bytes of entry and its `spec.config` text, which \
         NADs with the same text share: 10,000 configs of 150 bytes, each its own, are 1.5 \
         MB of text alone, so that case cannot fit in 2 MiB without compressing configs. The \
         budget at 100,000 NADs is the 10,000-NAD budget times ten.",
    );
}
