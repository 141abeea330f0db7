//! `POST /delegate`: one network, given by its own CNI configuration, added
//! to or removed from a running container (multus's hot-plug endpoint, as
//! multus-dynamic-networks-controller uses it).
//!
//! The request is multus's: `env` (CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS,
//! CNI_IFNAME for the new interface, CNI_ARGS with the pod's keys),
//! `config` (the network's configuration: one plugin or a list) and
//! `interfaceAttributes` (a selection element of which, as in multus, only
//! `ips`, `mac` and `cni-args` count). The network runs as multus runs an
//! additional network: `ips`/`mac` as capability arguments and as legacy
//! `IP=`/`MAC=` CNI_ARGS, `cni-args` merged into `args.cni`, the pod's
//! keys as CNI_ARGS. Unlike multus, nothing of the daemon's configuration
//! is put into the network's.

use std::path::Path;

use serde_json::{Map, Value};

use super::{failure::failure, CniHandler};
use crate::api::{self, code, Command};
use crate::cni::{self, ErrorKind, Planned};
use crate::k8s::PodRef;
use crate::netconf::{self, Invalid, Invocation};
use crate::result;
use crate::selection::annotation::{self, Problem, Selection};
use crate::selection::nad;
use crate::selection::runtime_config::{self, RuntimeInherit};
use crate::server::{Failure, FailureKind, Reply};

/// The element name [`annotation::parse_networks_annotation`] is given for the
/// interface attributes, which carry no name of their own.
const ATTRIBUTES_NAME: &str = "interface-attributes";

impl CniHandler {
    /// Serves one `/delegate` request: ADD hot-plugs, DEL unplugs, CHECK
    /// checks the one network, STATUS asks the network's plugins; GC is
    /// refused, as by multus.
    pub(super) async fn serve_delegate(&self, request: api::Request) -> Result<Reply, Failure> {
        let invalid = |i: Invalid| {
            Failure::new(FailureKind::InvalidRequest, i.code, i.msg).with_details(i.details)
        };
        let bad_env =
            |msg: String| Failure::new(FailureKind::InvalidRequest, code::INVALID_ENVIRONMENT, msg);
        netconf::validate_env(request.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(invalid)?;
        let inv = Invocation::from_env(|k| request.env.get(k).cloned()).map_err(invalid)?;
        let pod = PodRef::from_args(&inv.arg_pairs).map_err(|e| bad_env(e.to_string()))?;
        let attributes = attributes(request.interface_attributes.as_ref())?;
        let network = || network(&inv, pod.as_ref(), &attributes, &request.config);
        match inv.command {
            Command::Add => {
                let planned = network().map_err(failure)?;
                let name = planned.list.name.clone();
                let res = self.engine.hot_plug(&inv, planned).await.map_err(failure)?;
                super::call_log::note(&name, &inv.ifname, &res);
                let out = result::convert(&res, result::LATEST)
                    .map_err(|e| Failure::new(FailureKind::Failed, e.code(), e.to_string()))?;
                Ok(Reply::Result(out))
            }
            Command::Del => {
                self.engine.unplug(&inv, network()).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Check => {
                self.engine.check_one(&inv).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Status => {
                let planned = network().map_err(failure)?;
                self.engine.status(&planned.list).await.map_err(failure)?;
                Ok(Reply::Done)
            }
            Command::Gc | Command::Version => Err(bad_env(format!(
                "{} is not served on {}",
                inv.command,
                api::PATH_DELEGATE
            ))),
        }
    }
}

/// The interface attributes multus honours (`ips`, `mac`, `cni-args`),
/// checked as a selection element's; none when absent or `null`.
fn attributes(value: Option<&Value>) -> Result<Selection, Failure> {
    let bad = |why: String| {
        Failure::new(
            FailureKind::InvalidRequest,
            code::DECODING_FAILURE,
            format!("interfaceAttributes: {why}"),
        )
    };
    let obj = match value {
        None | Some(Value::Null) => return Ok(Selection::default()),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(bad(format!(
                "must be an object, found {}",
                crate::json::kind(other)
            )));
        }
    };
    // Only these keys, spelled as Go's decoder would match them.
    let mut element = Map::new();
    for (k, v) in obj {
        for key in ["ips", "mac", "cni-args"] {
            if k.eq_ignore_ascii_case(key) {
                element.insert(k.clone(), v.clone());
            }
        }
    }
    element.insert("name".into(), ATTRIBUTES_NAME.into());
    let text = Value::Array(vec![Value::Object(element)]).to_string();
    let mut parsed =
        annotation::parse_networks_annotation(Some(&text), "default").map_err(|e| {
            match e.problem {
                Problem::Element {
                    key: Some(key),
                    why,
                    ..
                } => bad(format!("key {key:?}: {why}")),
                other => bad(other.to_string()),
            }
        })?;
    Ok(parsed.pop().unwrap_or_default())
}

/// The network of a `/delegate` call, run as multus runs an additional
/// network of a pod.
fn network(
    inv: &Invocation,
    pod: Option<&PodRef>,
    attributes: &Selection,
    config: &[u8],
) -> Result<Planned, cni::Error> {
    let bad = |msg: String| cni::Error::new(ErrorKind::Invalid, code::INVALID_NETWORK_CONFIG, msg);
    let text = std::str::from_utf8(config)
        .map_err(|e| bad(format!("the /delegate config is not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(bad("the /delegate request has no config".into()));
    }
    let name = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            bad("the /delegate config must be a JSON object with a non-empty \"name\"".into())
        })?;
    let namespace = pod.map(|p| p.namespace.as_str()).unwrap_or("");
    let delegate = nad::delegate_from_spec(namespace, &name, text, attributes.cni_args.as_ref())
        .map_err(|e| bad(e.to_string()))?;
    let list = delegate
        .network_list()
        .map_err(|e| bad(format!("the /delegate config: {e}")))?;
    let mut planned = Planned::new(list, inv.ifname.clone(), false);
    planned.capability_args = Some(runtime_config::runtime_config(
        attributes,
        &Map::new(),
        RuntimeInherit::Multus,
        &runtime_config::AttachmentFacts {
            container_id: &inv.container_id,
            ifname: &inv.ifname,
            allocated_device: None,
            device_info_dir: Path::new(crate::device_info::DEFAULT_DIR),
        },
    ));
    let legacy = runtime_config::legacy_cni_args(attributes);
    // As multus: the pod's keys with an empty infra container id, then
    // MAC=/IP=; without pod keys, the call's CNI_ARGS then MAC=/IP=.
    let mut pairs: Vec<(String, String)> = match pod {
        Some(p) => runtime_config::pod_args(
            &p.namespace,
            &p.name,
            "",
            p.uid.as_deref().unwrap_or_default(),
        ),
        // PLEXUS_NETWORKS is ours, not the plugins'.
        None => inv
            .arg_pairs
            .iter()
            .filter(|(k, _)| k != crate::selection::ARGS_KEY)
            .cloned()
            .collect(),
    };
    pairs.extend(legacy);
    planned.cni_args = Some(runtime_config::args_text(&pairs));
    Ok(planned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn inv(args: &str) -> Invocation {
        Invocation {
            command: Command::Add,
            container_id: "c1".into(),
            netns: "/run/netns/x".into(),
            ifname: "net5".into(),
            args: args.into(),
            arg_pairs: netconf::parse_args(args).unwrap(),
        }
    }

    #[test]
    fn attributes_should_keep_ips_mac_and_cni_args_only() {
        let a = attributes(Some(&json!({
            "ips": ["10.1.1.5/24"], "mac": "02:00:00:00:00:02", "cni-args": null,
            "name": "ignored", "interface": "ignored", "portMappings": [{"hostPort": 1}]
        })))
        .unwrap();
        assert_eq!(a.ips, ["10.1.1.5/24"]);
        assert_eq!(a.mac.as_deref(), Some("02:00:00:00:00:02"));
        assert!(a.cni_args.is_none() && a.port_mappings.is_none() && a.interface.is_none());
        assert_eq!(attributes(None).unwrap(), Selection::default());
        let e = attributes(Some(&json!({"mac": "nope"}))).unwrap_err();
        assert!(
            e.error.msg.contains("interfaceAttributes: key \"mac\""),
            "{}",
            e.error.msg
        );
        let e = attributes(Some(&json!([1]))).unwrap_err();
        assert!(e.error.msg.contains("must be an object"), "{}", e.error.msg);
    }

    #[test]
    fn a_network_should_run_as_multus_runs_an_additional_one() {
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u1;K8S_POD_INFRA_CONTAINER_ID=c1";
        let inv = inv(args);
        let pod = PodRef::from_args(&inv.arg_pairs).unwrap();
        let attrs = attributes(Some(&json!({
            "ips": ["10.1.1.5/24"], "mac": "02:00:00:00:00:02", "cni-args": {"k": "v"}
        })))
        .unwrap();
        let config =
            br#"{"cniVersion":"1.0.0","name":"hp","type":"bridge","capabilities":{"ips":true}}"#;
        let p = network(&inv, pod.as_ref(), &attrs, config).unwrap();
        assert_eq!(p.list.name, "hp");
        assert_eq!(p.ifname, "net5");
        assert!(!p.primary);
        assert_eq!(p.list.plugins[0]["args"], json!({"cni": {"k": "v"}}));
        assert_eq!(
            p.cni_args.as_deref(),
            Some("IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=;K8S_POD_UID=u1;MAC=02:00:00:00:00:02;IP=10.1.1.5/24")
        );
        assert_eq!(
            Value::Object(p.capability_args.unwrap()),
            json!({"ips": ["10.1.1.5/24"], "mac": "02:00:00:00:00:02"})
        );
        // A list, and no daemon key in it.
        let list =
            br#"{"cniVersion":"1.0.0","name":"l","plugins":[{"type":"bridge"},{"type":"tuning"}]}"#;
        let p = network(&inv, pod.as_ref(), &Selection::default(), list).unwrap();
        assert_eq!(p.list.plugins.len(), 2);
        assert_eq!(
            p.list.to_value(),
            json!({"cniVersion":"1.0.0","name":"l","plugins":[{"type":"bridge"},{"type":"tuning"}]})
        );
        let plain = super::tests::inv("IgnoreUnknown=1;PLEXUS_NETWORKS=a;X=y");
        let p = network(&plain, None, &attrs, config).unwrap();
        assert_eq!(
            p.cni_args.as_deref(),
            Some("IgnoreUnknown=1;X=y;MAC=02:00:00:00:00:02;IP=10.1.1.5/24")
        );
        for bad in [&b""[..], b"[]", br#"{"type":"bridge"}"#, br#"{"name":"x"}"#] {
            let e = network(&inv, None, &Selection::default(), bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_NETWORK_CONFIG, "{}", e.msg);
        }
    }
}
