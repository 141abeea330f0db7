//! One log line per CNI call, at its end: the command, the container, the
//! pod, what an ADD attached or a DEL removed (each network with its
//! interface and addresses) or the error, and how long the call took; `info` when it
//! succeeded, `warn` when it failed. In the journal each is a field of its
//! own (`COMMAND`, `CONTAINER_ID`, `POD`, `NETWORKS`, `CODE`, `ERROR`,
//! `DURATION_MS`).
//!
//! The networks are noted where they are attached ([`note`]), into a
//! task-local list the call's [`logged`] scope owns, so that no signature
//! on the way carries them.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use serde_json::Value;

use crate::api;
use crate::server::{Failure, Reply};

tokio::task_local! {
    static ATTACHED: RefCell<Vec<String>>;
}

/// Who a call is for, read from its environment before it is served
/// (lenient: a call too broken to say is logged with what it has).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Meta {
    command: String,
    container_id: String,
    ifname: String,
    /// `<namespace>/<name>` from `K8S_POD_*`, empty for other containers.
    pod: String,
    /// A `/delegate` call (a hot-plug).
    delegate: bool,
}

impl Meta {
    pub(super) fn of(request: &api::Request, delegate: bool) -> Self {
        let env = |k: &str| request.env.get(k).cloned().unwrap_or_default();
        let args = env("CNI_ARGS");
        let arg = |key: &str| {
            args.split(';')
                .filter_map(|p| p.split_once('='))
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v)
                .next_back()
                .unwrap_or_default()
        };
        let (namespace, name) = (arg("K8S_POD_NAMESPACE"), arg("K8S_POD_NAME"));
        Self {
            command: env("CNI_COMMAND"),
            container_id: env("CNI_CONTAINERID"),
            ifname: env("CNI_IFNAME"),
            pod: if namespace.is_empty() && name.is_empty() {
                String::new()
            } else {
                format!("{namespace}/{name}")
            },
            delegate,
        }
    }
}

/// Serves `call` and logs its line. `call` is boxed first, so that the
/// futures awaiting this one hold a pointer, not the call's whole state.
pub(super) fn logged<'a>(
    meta: Meta,
    call: impl Future<Output = Result<Reply, Failure>> + Send + 'a,
) -> impl Future<Output = Result<Reply, Failure>> + Send + 'a {
    logged_boxed(meta, Box::pin(call))
}

async fn logged_boxed(
    meta: Meta,
    call: Pin<Box<dyn Future<Output = Result<Reply, Failure>> + Send + '_>>,
) -> Result<Reply, Failure> {
    let started = Instant::now();
    let (out, attached) = ATTACHED
        .scope(RefCell::new(Vec::new()), async {
            let out = call.await;
            (out, ATTACHED.with(|a| a.take()))
        })
        .await;
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    let duration_ms = (duration_ms * 10.0).round() / 10.0;
    let Meta {
        command,
        container_id,
        ifname,
        pod,
        delegate,
    } = meta;
    let networks = attached.join(", ");
    match &out {
        Ok(_) => tracing::info!(
            command = %command,
            container_id = %container_id,
            ifname = %ifname,
            pod = %pod,
            networks = %networks,
            delegate,
            duration_ms,
            "CNI {command} of {container_id} done{}",
            summary(&pod, &networks)
        ),
        Err(f) => tracing::warn!(
            command = %command,
            container_id = %container_id,
            ifname = %ifname,
            pod = %pod,
            delegate,
            code = f.error.code,
            error = %f.error.msg,
            duration_ms,
            "CNI {command} of {container_id} failed{}: {}",
            summary(&pod, ""),
            f.error.msg
        ),
    }
    out
}

/// The human part of the message: the pod and the networks.
fn summary(pod: &str, networks: &str) -> String {
    let mut s = String::new();
    if !pod.is_empty() {
        s.push_str(&format!(" (pod {pod})"));
    }
    if !networks.is_empty() {
        s.push_str(&format!(": {networks}"));
    }
    s
}

/// Notes that network `name` was attached as `ifname` with `result` (a
/// CNI result): shown as `<name> <ifname> <address>...` in the call's
/// line. Outside a call's scope (tests of the handler) it does nothing.
pub(super) fn note(name: &str, ifname: &str, result: &Value) {
    let addresses: Vec<&str> = result
        .get("ips")
        .and_then(Value::as_array)
        .map(|ips| {
            ips.iter()
                .filter_map(|ip| ip.get("address").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let mut line = format!("{name} {ifname}");
    for a in addresses {
        line.push(' ');
        line.push_str(a);
    }
    let _ = ATTACHED.try_with(|a| a.borrow_mut().push(line));
}

/// Notes the networks a DEL of attachment `ifname` is about to remove, as
/// the container's summary (`/attachments`, [`crate::cni::show`]) shows
/// them: the attachment's and those hot-plugged into it.
pub(super) fn note_removed(summary: &Value, ifname: &str) {
    let lines = removed(summary, ifname);
    let _ = ATTACHED.try_with(|a| a.borrow_mut().extend(lines));
}

/// [`note_removed`]'s lines, each `<name> <ifname> <address>...`.
fn removed(summary: &Value, ifname: &str) -> Vec<String> {
    let named = |a: &&Value| {
        a.get("ifname").and_then(Value::as_str) == Some(ifname)
            || a.get("hotPluggedInto").and_then(Value::as_str) == Some(ifname)
    };
    let attachments = summary.get("attachments").and_then(Value::as_array);
    let networks = attachments
        .into_iter()
        .flatten()
        .filter(named)
        .filter_map(|a| a.get("networks").and_then(Value::as_array))
        .flatten();
    networks
        .map(|n| {
            let text = |k: &str| n.get(k).and_then(Value::as_str).unwrap_or_default();
            let mut line = format!("{} {}", text("network"), text("interface"));
            for ip in n.get("ips").and_then(Value::as_array).into_iter().flatten() {
                if let Some(ip) = ip.as_str() {
                    line.push(' ');
                    line.push_str(ip);
                }
            }
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test(flavor = "current_thread")]
    async fn a_logged_call_should_be_held_by_pointer() {
        let state = [1u8; 32 * 1024];
        let call = async move {
            tokio::task::yield_now().await;
            assert_eq!(state.len(), 32 * 1024);
            Ok(Reply::Done)
        };
        let logging = logged(Meta::default(), call);
        let size = std::mem::size_of_val(&logging);
        assert!(size < 2048, "logged() holds {size} bytes");
        assert!(logging.await.is_ok());
    }

    #[test]
    fn meta_should_read_the_call_and_its_pod_leniently() {
        let mut request = api::Request::default();
        for (k, v) in [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p;junk",
            ),
        ] {
            request.env.insert(k.into(), v.into());
        }
        let m = Meta::of(&request, false);
        assert_eq!(
            (m.command.as_str(), m.container_id.as_str(), m.pod.as_str()),
            ("ADD", "c1", "ns1/p")
        );
        assert_eq!(Meta::of(&api::Request::default(), true).pod, "");
    }

    #[tokio::test]
    async fn networks_noted_in_the_call_should_reach_its_line_only() {
        let (tx, rx) = std::sync::mpsc::channel();
        let call = async move {
            note(
                "cluster",
                "eth0",
                &json!({"ips": [{"address": "10.0.0.5/24"}, {"address": "fd00::5/64"}]}),
            );
            note("ns1/red", "net1", &json!({}));
            tx.send(ATTACHED.with(|a| a.borrow().clone())).unwrap();
            Ok(Reply::Done)
        };
        logged(Meta::default(), call).await.unwrap();
        assert_eq!(
            rx.recv().unwrap(),
            ["cluster eth0 10.0.0.5/24 fd00::5/64", "ns1/red net1"]
        );
        // Outside a call: ignored.
        note("x", "eth0", &json!({}));
    }

    #[test]
    fn a_dels_networks_should_be_those_of_its_attachment_and_hot_plugs() {
        let summary = json!({
            "containerId": "c1",
            "attachments": [
                {"ifname": "eth0", "netns": "/run/netns/x", "networks": [
                    {"network": "cluster", "interface": "eth0", "primary": true,
                     "state": "added", "ips": ["10.0.0.5/24", "fd00::5/64"]},
                    {"network": "ns1/blue", "interface": "net1", "primary": false,
                     "state": "added", "ips": []}]},
                {"ifname": "hp1", "hotPluggedInto": "eth0", "networks": [
                    {"network": "hp", "interface": "hp1", "state": "added", "ips": ["10.9.0.2/24"]}]},
                {"ifname": "eth1", "networks": [{"network": "other", "interface": "eth1"}]}
            ]
        });
        assert_eq!(
            removed(&summary, "eth0"),
            [
                "cluster eth0 10.0.0.5/24 fd00::5/64",
                "ns1/blue net1",
                "hp hp1 10.9.0.2/24"
            ]
        );
        assert!(removed(&summary, "eth9").is_empty());
        assert!(removed(&json!({"damaged": true}), "eth0").is_empty());
    }
}
