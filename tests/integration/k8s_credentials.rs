//! plexusd's Kubernetes credentials follow their files, against the test
//! API server over HTTPS with mutual TLS: a client certificate rotated as
//! kubelet rotates it (a new dated PEM, the `kubelet-client-current.pem`
//! symlink renamed over, the old certificate refused at once) and a
//! rewritten `tokenFile` are picked up while pods' ADDs run, none of which
//! fails; a client certificate file that vanishes is named in `STATUS=`
//! until a good one is back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cni::{address, ok, Call, Engine};
use crate::support::daemon::{wait_until, Daemon};
use crate::support::kube::{pod_args, FakeApi, Identity, KubeAuth, NODE};
use crate::support::netns::{Link, Netns, Subnet};

const T: Duration = Duration::from_secs(20);
/// ADDs in a run, and after how many finished ADDs each rotation comes.
const ADDS: usize = 10;
const ROTATE_AFTER: [usize; 3] = [2, 4, 6];

fn node_identity() -> Identity {
    Identity {
        user: format!("system:node:{NODE}"),
        groups: vec!["system:nodes".to_string()],
    }
}

/// An engine with a bridge cluster network and a daemon config whose
/// kubeconfig (`<dir>/kubeconfig`, written by the caller) names `api`.
fn setup(tag: &str) -> (Engine, Value, Link, Subnet) {
    let (engine, link, subnet) = Engine::with_cluster_bridge(tag);
    let mut config = engine.config("cluster", "20s");
    config["kubeconfig"] = json!(engine.dir.join("kubeconfig"));
    config["nodeName"] = json!(NODE);
    config["kubernetesRequestTimeout"] = json!("5s");
    (engine, config, link, subnet)
}

/// Writes `text` to `path` as kubelet does: a temporary file renamed over.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// kubelet's client certificate store: dated PEM files (certificate and
/// key in one) and `kubelet-client-current.pem`, a symlink to the newest.
struct KubeletPki {
    dir: PathBuf,
    rotations: usize,
}

impl KubeletPki {
    fn current(&self) -> PathBuf {
        self.dir.join("kubelet-client-current.pem")
    }

    /// A new certificate from `api`, stored kubelet's way; its PEM.
    fn rotate(&mut self, api: &FakeApi) -> String {
        let (cert, key) = api.issue_client_cert(node_identity());
        self.rotations += 1;
        let dated = self
            .dir
            .join(format!("kubelet-client-2026-01-0{}.pem", self.rotations));
        std::fs::write(&dated, format!("{cert}{key}")).unwrap();
        let link = self.dir.join("kubelet-client-current.pem.tmp");
        std::os::unix::fs::symlink(&dated, &link).unwrap();
        std::fs::rename(&link, self.current()).unwrap();
        cert
    }
}

/// One call as plexus-shim gets it: its environment and stdin.
type ShimCall = (Vec<(String, String)>, Vec<u8>);

/// What a run of ADDs saw: each ADD's time, and whether a rotation
/// happened while it ran.
struct Run {
    took: Vec<(Duration, bool)>,
}

impl Run {
    fn report(&self, what: &str) -> Duration {
        let mut all: Vec<Duration> = self.took.iter().map(|(d, _)| *d).collect();
        all.sort();
        let median = all[all.len() / 2];
        let longest_rotating = self
            .took
            .iter()
            .filter(|(_, r)| *r)
            .map(|(d, _)| *d)
            .max()
            .unwrap_or_default();
        println!(
            "{what}: {} ADDs, none failed; median {median:?}, longest {:?}; \
             longest ADD during a rotation {longest_rotating:?} (its delay over the median: {:?})",
            all.len(),
            all[all.len() - 1],
            longest_rotating.saturating_sub(median)
        );
        longest_rotating
    }
}

/// Runs [`ADDS`] pods' ADDs one after another through plexus-shim while
/// `rotate` is called after the ADDs of [`ROTATE_AFTER`]; each ADD must
/// succeed with an address of the cluster network in the pod's namespace
/// and its network-status written to the API.
fn adds_while_rotating(
    tag: &str,
    d: &Daemon,
    api: &FakeApi,
    subnet: &Subnet,
    mut rotate: impl FnMut(),
) -> Run {
    let done = AtomicUsize::new(0);
    let rotating = std::sync::atomic::AtomicBool::new(false);
    let namespaces: Vec<Netns> = (0..ADDS).map(|_| Netns::new()).collect();
    let calls: Vec<ShimCall> = (0..ADDS)
        .map(|i| {
            let name = format!("{tag}-{i}");
            api.put_pod("ns", &name, &format!("uid-{name}"), NODE, json!({}));
            let call = Call::new("ADD", &format!("{tag}{i}"), &namespaces[i], "eth0")
                .args(&pod_args("ns", &name, &format!("uid-{name}")));
            (call.env(), call.stdin(d))
        })
        .collect();
    let took = std::thread::scope(|s| {
        let adds = s.spawn(|| {
            let mut took = Vec::new();
            for (i, (env, stdin)) in calls.into_iter().enumerate() {
                let t0 = Instant::now();
                let during = rotating.load(Ordering::SeqCst);
                let run = crate::support::shim::run(env, &stdin);
                let during = during || rotating.load(Ordering::SeqCst);
                took.push((t0.elapsed(), during, run));
                done.store(i + 1, Ordering::SeqCst);
            }
            took
        });
        for after in ROTATE_AFTER {
            wait_until(T * 3, "the ADDs before a rotation", || {
                done.load(Ordering::SeqCst) >= after || adds.is_finished()
            });
            rotating.store(true, Ordering::SeqCst);
            rotate();
            // Marks the ADD that ran during the rotation.
            let mark = done.load(Ordering::SeqCst);
            wait_until(T * 3, "the ADD after a rotation", || {
                done.load(Ordering::SeqCst) > mark || adds.is_finished()
            });
            rotating.store(false, Ordering::SeqCst);
        }
        adds.join().unwrap()
    });
    let mut run = Run { took: Vec::new() };
    for (i, (took, during, shim)) in took.into_iter().enumerate() {
        let result = ok(d, &shim);
        assert!(subnet.holds(&address(&result)), "pod {i}: {result}");
        assert!(namespaces[i].iface("eth0").is_some(), "pod {i}: no eth0");
        let name = format!("{tag}-{i}");
        wait_until(T, "the pod's network-status", || {
            api.network_status("ns", &name).is_some()
        });
        run.took.push((took, during));
    }
    run
}

/// kubelet rotates its client certificate three times while pods' ADDs
/// run; each old certificate is refused (401) at once, on open
/// connections too. No ADD fails.
#[test]
fn a_kubelet_rotated_client_certificate_should_be_used_without_a_restart() {
    let api = FakeApi::start_tls();
    let (engine, config, _link, subnet) = setup("k8s-certrot");
    let dir = engine.dir.join("pki");
    std::fs::create_dir(&dir).unwrap();
    let mut pki = KubeletPki { dir, rotations: 0 };
    let mut cert = pki.rotate(&api);
    let current = pki.current();
    api.write_tls_kubeconfig(
        &engine.dir.join("kubeconfig"),
        KubeAuth::ClientCert {
            cert: &current,
            key: &current,
        },
    );
    let mut d = Daemon::start(&engine.dir, "d", config);
    d.ready();
    let run = adds_while_rotating("certrot", &d, &api, &subnet, || {
        let old = std::mem::replace(&mut cert, pki.rotate(&api));
        api.revoke_client_cert(&old);
    });
    let longest = run.report("client certificate rotated 3 times");
    assert_eq!(pki.rotations, 4);
    assert!(longest < T, "{longest:?}");
    assert!(
        d.log_text().contains("Kubernetes credentials read again"),
        "{}",
        d.log_text()
    );
}

/// The `tokenFile` is rewritten three times while pods' ADDs run; each
/// old token is refused at once. No ADD fails.
#[test]
fn a_rewritten_token_file_should_be_used_without_a_restart() {
    let api = FakeApi::start_tls();
    let (engine, config, _link, subnet) = setup("k8s-tokrot");
    let token_file = engine.dir.join("token");
    let mut n = 0;
    let mut token = "token-0".to_string();
    api.accept_token(&token, node_identity());
    replace(&token_file, &token);
    api.write_tls_kubeconfig(
        &engine.dir.join("kubeconfig"),
        KubeAuth::TokenFile(&token_file),
    );
    let mut d = Daemon::start(&engine.dir, "d", config);
    d.ready();
    let run = adds_while_rotating("tokrot", &d, &api, &subnet, || {
        n += 1;
        let new = format!("token-{n}");
        api.accept_token(&new, node_identity());
        replace(&token_file, &new);
        api.revoke_token(&std::mem::replace(&mut token, new));
    });
    run.report("tokenFile rewritten 3 times");
    assert_eq!(n, 3);
}

/// The last STATUS= line received so far.
fn last_status(d: &mut Daemon) -> String {
    d.notifications()
        .into_iter()
        .rev()
        .find(|n| n.contains("STATUS="))
        .unwrap_or_default()
}

/// One pod's ADD, which must succeed (its network-status written).
fn add_pod(d: &Daemon, api: &FakeApi, subnet: &Subnet, name: &str) -> Netns {
    let ns = Netns::new();
    api.put_pod("ns", name, &format!("uid-{name}"), NODE, json!({}));
    let run = Call::new("ADD", name, &ns, "eth0")
        .args(&pod_args("ns", name, &format!("uid-{name}")))
        .run(d);
    let result = ok(d, &run);
    assert!(subnet.holds(&address(&result)), "{result}");
    wait_until(T, "the pod's network-status", || {
        api.network_status("ns", name).is_some()
    });
    ns
}

/// The kubeconfig's client-certificate file vanishes, then holds no
/// certificate: plexusd keeps the credentials it read, logs the file and
/// names it in STATUS=; a good file put back (a new certificate, the old
/// one refused) clears it and calls use it.
#[test]
fn a_vanished_client_certificate_should_be_named_in_status_until_it_is_back() {
    let api = FakeApi::start_tls();
    let (engine, config, _link, subnet) = setup("k8s-certgone");
    let cert_file = engine.dir.join("client.pem");
    let key_file = engine.dir.join("client.key");
    let (cert, key) = api.issue_client_cert(node_identity());
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    api.write_tls_kubeconfig(
        &engine.dir.join("kubeconfig"),
        KubeAuth::ClientCert {
            cert: &cert_file,
            key: &key_file,
        },
    );
    let mut d = Daemon::start(&engine.dir, "d", config);
    d.ready();
    let _first = add_pod(&d, &api, &subnet, "gone-0");

    std::fs::remove_file(&cert_file).unwrap();
    // The next call notices; it still succeeds with what was read before.
    let _second = add_pod(&d, &api, &subnet, "gone-1");
    let named = cert_file.display().to_string();
    wait_until(T, "STATUS= naming the missing file", || {
        let status = last_status(&mut d);
        status.contains("Kubernetes credentials") && status.contains(&named)
    });
    println!("missing client certificate: {}", last_status(&mut d));
    assert!(
        d.log_text().lines().any(
            |l| l.contains("cannot read the Kubernetes credentials again") && l.contains(&named)
        ),
        "{}",
        d.log_text()
    );

    // Something that is no certificate in its place: named too.
    replace(&cert_file, "not a certificate\n");
    let _third = add_pod(&d, &api, &subnet, "gone-2");
    wait_until(T, "STATUS= naming the invalid file", || {
        let status = last_status(&mut d);
        status.contains(&named) && status.contains("no PEM certificate")
    });

    let (new_cert, new_key) = api.issue_client_cert(node_identity());
    replace(&key_file, &new_key);
    replace(&cert_file, &new_cert);
    api.revoke_client_cert(&cert);
    let _fourth = add_pod(&d, &api, &subnet, "gone-3");
    wait_until(T, "STATUS= without the credentials problem", || {
        let status = last_status(&mut d);
        status.contains("STATUS=serving") && !status.contains("Kubernetes credentials")
    });
}
