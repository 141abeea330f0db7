//! What one selected network hands its plugins, as multus builds it: the
//! `runtimeConfig` capability arguments (the element's ips, mac,
//! portMappings, bandwidth, device and device-info file, over the
//! runtime's own per [`RuntimeInherit`]) and the CNI_ARGS (the pod's
//! keys, then the legacy `MAC=`/`IP=`).
//!
//! Pure functions of a parsed [`Selection`] and the call's facts
//! ([`AttachmentFacts`]).

use serde_json::{Map, Value};

use super::annotation::{PortMapping, Selection};

/// The runtime capability arguments multus knows; it drops every other
/// key the runtime sends.
pub const RUNTIME_KEYS: &[&str] = &[
    "portMappings",
    "bandwidth",
    "ips",
    "mac",
    "infinibandGUID",
    "deviceID",
    "CNIDeviceInfoFile",
];

/// Which of the runtime's own capability arguments an additional network
/// is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuntimeInherit {
    /// As multus: the runtime's [`RUNTIME_KEYS`] values, overridden by the
    /// element's. The pod's host ports and bandwidth then also reach an
    /// additional network that declares those capabilities.
    #[default]
    Multus,
    /// As the network plumbing specification (section 7.5) asks: only what
    /// the element requests; the runtime's values belong to the cluster
    /// network.
    None,
}

/// The call-specific facts [`runtime_config`] needs.
#[derive(Debug, Clone, Copy)]
pub struct AttachmentFacts<'a> {
    /// The runtime's container id.
    pub container_id: &'a str,
    /// The interface this network gets.
    pub ifname: &'a str,
    /// A device the NAD's `resourceName` allocated, if any: it wins over
    /// the element's `deviceID`.
    pub allocated_device: Option<&'a str>,
    /// The device-info directory (multus's is fixed:
    /// [`crate::device_info::DEFAULT_DIR`]).
    pub device_info_dir: &'a std::path::Path,
}

/// The `runtimeConfig` capability arguments for an additional network
/// (multus `mergeCNIRuntimeConfig` and `newCNIRuntimeConf`): the runtime's
/// known values per `inherit`, overridden by the element's `portMappings`,
/// `bandwidth`, `ips`, `mac`, `infiniband-guid` and device ID. With a device
/// ID, `CNIDeviceInfoFile` is
/// `<device-info dir>/cni/<namespace>-<name>-<containerID>_<ifname>`
/// (every `/` of the file name turned into `-`). Keys are emitted only when
/// non-empty.
pub fn runtime_config(
    sel: &Selection,
    runtime: &Map<String, Value>,
    inherit: RuntimeInherit,
    facts: &AttachmentFacts<'_>,
) -> Map<String, Value> {
    let mut rc = Map::new();
    if inherit == RuntimeInherit::Multus {
        for key in RUNTIME_KEYS {
            if let Some(v) = runtime.get(*key) {
                rc.insert((*key).to_string(), v.clone());
            }
        }
    }
    if let Some(pm) = &sel.port_mappings {
        rc.insert(
            "portMappings".into(),
            Value::Array(pm.iter().map(PortMapping::to_value).collect()),
        );
    }
    if let Some(bw) = &sel.bandwidth {
        rc.insert("bandwidth".into(), bw.to_value());
    }
    if !sel.ips.is_empty() {
        rc.insert("ips".into(), sel.ips.clone().into());
    }
    if let Some(mac) = &sel.mac {
        rc.insert("mac".into(), mac.clone().into());
    }
    if let Some(guid) = &sel.infiniband_guid {
        rc.insert("infinibandGUID".into(), guid.clone().into());
    }
    let device = facts.allocated_device.or(sel.device_id.as_deref());
    if let Some(id) = device.filter(|d| !d.is_empty()) {
        rc.insert("deviceID".into(), id.into());
        let file = crate::device_info::cni_file(
            facts.device_info_dir,
            &sel.display_name(),
            facts.container_id,
            facts.ifname,
        );
        rc.insert(
            "CNIDeviceInfoFile".into(),
            file.to_string_lossy().into_owned().into(),
        );
    }
    rc.retain(|_, v| !is_empty_value(v));
    rc
}

/// multus's "non-empty": empty strings, lists and nulls are left out.
fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// The `CNI_ARGS` multus gives every network of a pod, in its order; the
/// runtime's other keys are not passed on.
pub fn pod_args(
    namespace: &str,
    name: &str,
    infra_container_id: &str,
    uid: &str,
) -> Vec<(String, String)> {
    vec![
        ("IgnoreUnknown".into(), "true".into()),
        ("K8S_POD_NAMESPACE".into(), namespace.into()),
        ("K8S_POD_NAME".into(), name.into()),
        (
            "K8S_POD_INFRA_CONTAINER_ID".into(),
            infra_container_id.into(),
        ),
        ("K8S_POD_UID".into(), uid.into()),
    ]
}

/// `CNI_ARGS` text: `KEY=value` pairs joined with `;`.
pub fn args_text(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// The legacy CNI_ARGS multus adds for an element: `MAC=<mac>` then
/// `IP=<ips joined by commas>`.
///
/// Differs from multus: `"ips": []` adds nothing (multus adds an empty
/// `IP=`, which IPAM plugins read as a request for no address at all).
pub fn legacy_cni_args(sel: &Selection) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(mac) = &sel.mac {
        out.push(("MAC".to_string(), mac.clone()));
    }
    if !sel.ips.is_empty() {
        out.push(("IP".to_string(), sel.ips.join(",")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selection::annotation::{parse_networks_annotation, Error};
    use serde_json::json;

    fn nets(v: &str) -> Result<Vec<Selection>, Error> {
        parse_networks_annotation(Some(v), "pod-ns")
    }

    fn facts<'a>(device: Option<&'a str>) -> AttachmentFacts<'a> {
        AttachmentFacts {
            container_id: "abc123",
            ifname: "net1",
            allocated_device: device,
            device_info_dir: std::path::Path::new(crate::device_info::DEFAULT_DIR),
        }
    }

    #[test]
    fn runtime_config_should_merge_like_multus() {
        let runtime = json!({
            "portMappings": [{"hostPort": 1, "containerPort": 2}],
            "bandwidth": {"ingressRate": 5},
            "ips": [],
            "mac": "",
            "dns": {"servers": ["1.1.1.1"]}
        });
        let runtime = runtime.as_object().unwrap();
        let plain = nets("a").unwrap().pop().unwrap();
        let rc = runtime_config(&plain, runtime, RuntimeInherit::Multus, &facts(None));
        // Known non-empty runtime values are offered; unknown keys and
        // empty values are not.
        assert_eq!(
            Value::Object(rc),
            json!({"portMappings": [{"hostPort": 1, "containerPort": 2}], "bandwidth": {"ingressRate": 5}})
        );
        assert!(runtime_config(&plain, runtime, RuntimeInherit::None, &facts(None)).is_empty());

        let rich = nets(r#"[{"name":"n","namespace":"ns","ips":["10.0.0.2/24"],"mac":"02:00:00:00:00:01","infiniband-guid":"00:11:22:33:44:55:66:77","portMappings":[{"hostPort":80,"containerPort":8080,"hostIP":""}],"bandwidth":{"egressRate":9},"deviceID":"0000:01:00.0"}]"#)
            .unwrap()
            .pop()
            .unwrap();
        let rc = runtime_config(&rich, runtime, RuntimeInherit::Multus, &facts(None));
        assert_eq!(
            Value::Object(rc),
            json!({
                "portMappings": [{"hostPort": 80, "containerPort": 8080}],
                "bandwidth": {"ingressRate": 0, "ingressBurst": 0, "egressRate": 9, "egressBurst": 0},
                "ips": ["10.0.0.2/24"],
                "mac": "02:00:00:00:00:01",
                "infinibandGUID": "00:11:22:33:44:55:66:77",
                "deviceID": "0000:01:00.0",
                "CNIDeviceInfoFile": "/var/run/k8s.cni.cncf.io/devinfo/cni/ns-n-abc123_net1"
            })
        );
        // A device from the NAD's resourceName wins over the element's.
        let rc = runtime_config(
            &rich,
            runtime,
            RuntimeInherit::None,
            &facts(Some("0000:02:00.0")),
        );
        assert_eq!(rc["deviceID"], "0000:02:00.0");
    }

    #[test]
    fn legacy_args_should_be_mac_then_ip() {
        let s =
            nets(r#"[{"name":"n","ips":["10.0.0.2/24","fd00::2/64"],"mac":"02:00:00:00:00:01"}]"#)
                .unwrap()
                .pop()
                .unwrap();
        assert_eq!(
            legacy_cni_args(&s),
            vec![
                ("MAC".to_string(), "02:00:00:00:00:01".to_string()),
                ("IP".to_string(), "10.0.0.2/24,fd00::2/64".to_string())
            ]
        );
        assert!(legacy_cni_args(&nets("n").unwrap()[0]).is_empty());
    }
}
