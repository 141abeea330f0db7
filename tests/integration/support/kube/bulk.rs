//! A large cluster made up on demand: NetworkAttachmentDefinitions spread
//! over namespaces and pods spread over nodes, each object rendered as the
//! API server sends it (metadata with `managedFields` and kubectl's
//! `last-applied-configuration`) when a list or a GET reaches it, and
//! never held. 100,000 objects cost a few integers here.
//!
//! Names are zero-padded so that index order is the API server's order
//! (namespace, then name): a page boundary (a `continue` token) is found
//! by binary search, and a field selector on `spec.nodeName` is answered
//! from the index without rendering anything.

use std::fmt::Write;

use super::{NADS, PODS};

/// What a [`Bulk`] holds.
#[derive(Debug, Clone)]
pub struct BulkSpec {
    /// Namespaces the NADs are spread over (also the pods').
    pub namespaces: usize,
    /// NADs in each namespace: `net-000`, `net-001`, ...
    pub nads_per_namespace: usize,
    /// Pods in the cluster, spread evenly over the namespaces.
    pub pods: usize,
    /// Of those, how many run on `node` (evenly spread; the others run on
    /// other nodes).
    pub pods_on_node: usize,
    pub node: String,
    /// How the NADs' `spec.config` differ.
    pub configs: BulkConfigs,
}

/// The `spec.config` of the made-up NADs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkConfigs {
    /// Every NAD's text is its own (a VLAN per name, a range per
    /// namespace).
    Distinct,
    /// `net-NNN` has the same text in every namespace (one definition
    /// copied into each tenant's namespace).
    Copied,
}

/// The made-up objects, at one resourceVersion.
#[derive(Debug, Clone)]
pub(super) struct Bulk {
    spec: BulkSpec,
    /// resourceVersion of every made-up object.
    rv: u64,
    /// Widths of the zero-padded numbers in the names.
    ns_width: usize,
    nad_width: usize,
    pod_width: usize,
    pods_per_namespace: usize,
}

/// The fields a field selector may name, of one made-up object.
pub(super) struct Fields {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) node: Option<String>,
}

fn width(n: usize) -> usize {
    n.saturating_sub(1).max(1).to_string().len()
}

impl Bulk {
    pub(super) fn new(spec: BulkSpec, rv: u64) -> Self {
        let namespaces = spec.namespaces.max(1);
        let pods_per_namespace = spec.pods.div_ceil(namespaces).max(1);
        Self {
            ns_width: width(namespaces),
            nad_width: width(spec.nads_per_namespace),
            pod_width: width(pods_per_namespace),
            pods_per_namespace,
            spec: BulkSpec { namespaces, ..spec },
            rv,
        }
    }

    /// How many objects of `resource` there are.
    pub(super) fn count(&self, resource: &str) -> usize {
        match resource {
            NADS => self.spec.namespaces * self.spec.nads_per_namespace,
            PODS => self.spec.pods,
            _ => 0,
        }
    }

    fn namespace(&self, i: usize) -> String {
        format!("ns-{i:0w$}", w = self.ns_width)
    }

    /// Object `i`'s (namespace, name).
    pub(super) fn key(&self, resource: &str, i: usize) -> (String, String) {
        match resource {
            NADS => {
                let per = self.spec.nads_per_namespace;
                (
                    self.namespace(i / per),
                    format!("net-{:0w$}", i % per, w = self.nad_width),
                )
            }
            _ => {
                let per = self.pods_per_namespace;
                (
                    self.namespace(i / per),
                    format!("pod-{:0w$}", i % per, w = self.pod_width),
                )
            }
        }
    }

    /// The index of `namespace/name`, if it is a made-up object.
    pub(super) fn find(&self, resource: &str, namespace: &str, name: &str) -> Option<usize> {
        let i = self.lower_bound(resource, namespace, name);
        (i < self.count(resource) && self.key(resource, i) == (namespace.into(), name.into()))
            .then_some(i)
    }

    /// The first index whose (namespace, name) is not below the given one.
    pub(super) fn lower_bound(&self, resource: &str, namespace: &str, name: &str) -> usize {
        let (mut lo, mut hi) = (0, self.count(resource));
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (ns, n) = self.key(resource, mid);
            if (ns.as_str(), n.as_str()) < (namespace, name) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Whether pod `i` runs on the node (the others run elsewhere).
    fn on_node(&self, i: usize) -> bool {
        let on = self.spec.pods_on_node;
        on > 0 && i % (self.spec.pods / on).max(1) == 0 && i / (self.spec.pods / on).max(1) < on
    }

    fn node_of(&self, i: usize) -> String {
        if self.on_node(i) {
            self.spec.node.clone()
        } else {
            format!("worker-{:03}", i % 397)
        }
    }

    pub(super) fn fields(&self, resource: &str, i: usize) -> Fields {
        let (namespace, name) = self.key(resource, i);
        Fields {
            namespace,
            name,
            node: (resource == PODS).then(|| self.node_of(i)),
        }
    }

    /// Object `i` as JSON text: the whole object with its kind, or (for
    /// `meta`) a PartialObjectMetadata.
    pub(super) fn render(&self, resource: &str, i: usize, meta: bool) -> String {
        match resource {
            NADS => self.nad(i, meta),
            _ => self.pod(i, meta),
        }
    }

    fn nad(&self, i: usize, meta: bool) -> String {
        let per = self.spec.nads_per_namespace;
        let (ns_i, j) = (i / per, i % per);
        let (namespace, name) = self.key(NADS, i);
        let range = match self.spec.configs {
            BulkConfigs::Distinct => format!("10.{}.{}.0/24", ns_i / 256, ns_i % 256),
            BulkConfigs::Copied => format!("10.{}.0.0/16", j % 256),
        };
        let config = format!(
            r#"{{"cniVersion":"0.3.1","name":"{name}","type":"macvlan","master":"eth0","mode":"bridge","vlan":{},"ipam":{{"type":"whereabouts","range":"{range}"}}}}"#,
            100 + j % 3900
        );
        let config = json_string(&config);
        let applied = json_string(&format!(
            "{{\"apiVersion\":\"k8s.cni.cncf.io/v1\",\"kind\":\"NetworkAttachmentDefinition\",\"metadata\":{{\"annotations\":{{}},\"name\":\"{name}\",\"namespace\":\"{namespace}\"}},\"spec\":{{\"config\":{config}}}}}\n"
        ));
        let mut o = String::with_capacity(1400);
        let _ = write!(
            o,
            r#"{{"apiVersion":"{api}","kind":"{kind}","metadata":{{"annotations":{{"kubectl.kubernetes.io/last-applied-configuration":{applied}}},"creationTimestamp":"2025-03-01T10:00:00Z","generation":1,"managedFields":[{{"apiVersion":"k8s.cni.cncf.io/v1","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:annotations":{{".":{{}},"f:kubectl.kubernetes.io/last-applied-configuration":{{}}}}}},"f:spec":{{".":{{}},"f:config":{{}}}}}},"manager":"kubectl-client-side-apply","operation":"Update","time":"2025-03-01T10:00:00Z"}}],"name":"{name}","namespace":"{namespace}","resourceVersion":"{rv}","uid":"{uid}"}}"#,
            api = if meta {
                "meta.k8s.io/v1"
            } else {
                "k8s.cni.cncf.io/v1"
            },
            kind = if meta {
                "PartialObjectMetadata"
            } else {
                "NetworkAttachmentDefinition"
            },
            rv = self.rv,
            uid = uid(1, i),
        );
        if meta {
            o.push('}');
        } else {
            let _ = write!(o, r#","spec":{{"config":{config}}}}}"#);
        }
        o
    }

    fn pod(&self, i: usize, meta: bool) -> String {
        let (namespace, name) = self.key(PODS, i);
        let node = self.node_of(i);
        let rs = format!("{namespace}-app-{:x}", i / 8);
        let mut o = String::with_capacity(3000);
        let _ = write!(
            o,
            r#"{{"apiVersion":"{api}","kind":"{kind}","metadata":{{"annotations":{{"k8s.v1.cni.cncf.io/networks":"{first_nad}","kubernetes.io/config.seen":"2025-03-01T10:00:00.000000000Z","kubernetes.io/config.source":"api"}},"creationTimestamp":"2025-03-01T10:00:00Z","generateName":"{rs}-","labels":{{"app":"{namespace}-app","pod-template-hash":"{h:x}"}},"managedFields":[{{"apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{{"f:metadata":{{"f:annotations":{{".":{{}},"f:k8s.v1.cni.cncf.io/networks":{{}}}},"f:generateName":{{}},"f:labels":{{".":{{}},"f:app":{{}},"f:pod-template-hash":{{}}}},"f:ownerReferences":{{".":{{}},"k:{{\"uid\":\"{owner}\"}}":{{}}}}}},"f:spec":{{"f:containers":{{"k:{{\"name\":\"app\"}}":{{".":{{}},"f:image":{{}},"f:imagePullPolicy":{{}},"f:name":{{}},"f:resources":{{}}}}}},"f:dnsPolicy":{{}},"f:enableServiceLinks":{{}},"f:restartPolicy":{{}},"f:schedulerName":{{}},"f:securityContext":{{}},"f:terminationGracePeriodSeconds":{{}}}}}},"manager":"kube-controller-manager","operation":"Update","time":"2025-03-01T10:00:00Z"}},{{"apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{{"f:status":{{"f:conditions":{{"k:{{\"type\":\"Ready\"}}":{{".":{{}},"f:lastProbeTime":{{}},"f:lastTransitionTime":{{}},"f:status":{{}},"f:type":{{}}}}}},"f:containerStatuses":{{}},"f:hostIP":{{}},"f:phase":{{}},"f:podIP":{{}},"f:startTime":{{}}}}}},"manager":"kubelet","operation":"Update","subresource":"status","time":"2025-03-01T10:00:05Z"}}],"name":"{name}","namespace":"{namespace}","ownerReferences":[{{"apiVersion":"apps/v1","blockOwnerDeletion":true,"controller":true,"kind":"ReplicaSet","name":"{rs}","uid":"{owner}"}}],"resourceVersion":"{rv}","uid":"{uid}"}}"#,
            api = if meta { "meta.k8s.io/v1" } else { "v1" },
            kind = if meta { "PartialObjectMetadata" } else { "Pod" },
            h = i / 8,
            first_nad = format_args!("net-{:0w$}", 0, w = self.nad_width),
            owner = uid(3, i / 8),
            rv = self.rv,
            uid = uid(2, i),
        );
        if !meta {
            let _ = write!(
                o,
                r#","spec":{{"containers":[{{"image":"registry.example/app:1.0","imagePullPolicy":"IfNotPresent","name":"app","resources":{{}}}}],"dnsPolicy":"ClusterFirst","enableServiceLinks":true,"nodeName":"{node}","restartPolicy":"Always","schedulerName":"default-scheduler","securityContext":{{}},"terminationGracePeriodSeconds":30}},"status":{{"phase":"Running","hostIP":"192.0.2.{}","podIP":"10.244.{}.{}","startTime":"2025-03-01T10:00:01Z"}}"#,
                i % 250 + 1,
                (i / 250) % 256,
                i % 250 + 1,
            );
        }
        o.push('}');
        o
    }
}

/// A uid made of a kind tag and an index.
fn uid(tag: u32, i: usize) -> String {
    format!("{tag:08x}-0000-4000-8000-{i:012x}")
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}
