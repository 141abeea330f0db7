//! Dynamic Resource Allocation objects (resource.k8s.io/v1), as the API
//! server holds them once the scheduler allocated a claim and a DRA driver
//! published its devices.

use serde_json::{json, Map, Value};

use super::{FakeApi, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES};

/// A device of a ResourceSlice: its name and the CNI attributes a network
/// driver publishes (`None`: that attribute is left out).
pub struct SliceDevice<'a> {
    pub name: &'a str,
    pub device_id: Option<&'a str>,
    pub resource_name: Option<&'a str>,
}

/// One allocated device: `<driver>/<pool>/<device>`.
pub type Allocated<'a> = (&'a str, &'a str, &'a str);

impl FakeApi {
    /// Adds or replaces ResourceClaim `namespace/name`, generated for the
    /// pod claim `nic` of pod `pod` (uid `pod_uid`) from a template,
    /// allocated `devices` on `node` and reserved for that pod.
    pub fn put_claim(
        &self,
        namespace: &str,
        name: &str,
        (pod, pod_uid): (&str, &str),
        node: &str,
        devices: &[Allocated<'_>],
    ) {
        let results: Vec<Value> = devices
            .iter()
            .map(|(driver, pool, device)| {
                json!({"request": "vf", "driver": driver, "pool": pool, "device": device})
            })
            .collect();
        let claim = json!({
            "metadata": {
                "name": name,
                "namespace": namespace,
                "generateName": format!("{pod}-nic-"),
                "uid": format!("claim-{namespace}-{name}"),
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "annotations": {"resource.kubernetes.io/pod-claim-name": "nic"},
                "finalizers": ["resource.kubernetes.io/delete-protection"],
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid,
                    "controller": true, "blockOwnerDeletion": true
                }],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                   "apiVersion": "resource.k8s.io/v1", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {"devices": {"requests": [{
                "name": "vf",
                "exactly": {"deviceClassName": "sriov.example.com", "allocationMode": "ExactCount",
                            "count": devices.len()}
            }]}},
            "status": {
                "allocation": {
                    "devices": {"results": results},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}
                    ]}]},
                    "allocationTimestamp": "2026-12-01T10:00:01Z"
                },
                "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}]
            }
        });
        self.lock().put(RESOURCE_CLAIMS, namespace, name, claim);
    }

    /// Pod `namespace/pod` uses ResourceClaim `claim` as its pod claim
    /// `pod_claim`, made from a template: its `spec.resourceClaims` names
    /// the template and its `status.resourceClaimStatuses` the claim made,
    /// as the resourceclaim controller writes it (the Node authorizer's
    /// pod -> claim edge). Panics without such a pod.
    pub fn reference_claim(&self, namespace: &str, pod: &str, pod_claim: &str, claim: &str) {
        let mut s = self.lock();
        let mut object = s.get(PODS, namespace, pod).expect("the pod exists");
        let push = |list: &mut Value, entry: Value| match list.as_array_mut() {
            Some(l) => l.push(entry),
            None => *list = json!([entry]),
        };
        push(
            &mut object["spec"]["resourceClaims"],
            json!({"name": pod_claim, "resourceClaimTemplateName": format!("{pod_claim}-template")}),
        );
        push(
            &mut object["status"]["resourceClaimStatuses"],
            json!({"name": pod_claim, "resourceClaimName": claim}),
        );
        s.put(PODS, namespace, pod, object);
    }

    /// Adds or replaces ResourceSlice `name` of driver `driver`, pool
    /// `pool`, on `node`, with `devices`. Each device also has attributes
    /// of the driver's own, and a capacity, as real drivers publish.
    pub fn put_slice(
        &self,
        name: &str,
        node: &str,
        (driver, pool): (&str, &str),
        devices: &[SliceDevice<'_>],
    ) {
        let devices: Vec<Value> = devices
            .iter()
            .map(|d| {
                let mut attributes = Map::new();
                attributes.insert(format!("{driver}/pfName"), json!({"string": "ens1f0"}));
                attributes.insert(format!("{driver}/numaNode"), json!({"int": 0}));
                if let Some(id) = d.device_id {
                    attributes.insert("k8s.cni.cncf.io/deviceID".into(), json!({ "string": id }));
                }
                if let Some(r) = d.resource_name {
                    attributes.insert(
                        "k8s.cni.cncf.io/resourceName".into(),
                        json!({ "string": r }),
                    );
                }
                json!({
                    "name": d.name,
                    "attributes": attributes,
                    "capacity": {format!("{driver}/bandwidth"): {"value": "10G"}}
                })
            })
            .collect();
        let slice = json!({
            "metadata": {
                "name": name,
                "generateName": format!("{node}-{driver}-"),
                "uid": format!("slice-{name}"),
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                     "uid": format!("node-{node}"), "controller": true}]
            },
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "devices": devices
            }
        });
        self.lock().put(RESOURCE_SLICES, "", name, slice);
    }

    /// The resource.k8s.io requests so far that are not watches, as
    /// (method, path, query).
    pub fn dra_requests(&self) -> Vec<(String, String, String)> {
        self.log()
            .into_iter()
            .filter(|r| r.path.starts_with("/apis/resource.k8s.io/") && !r.is_watch())
            .map(|r| (r.method, r.path, r.query))
            .collect()
    }
}
