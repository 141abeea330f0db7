//! Unit tests of [`super`], with a fake cluster and fake network
//! configurations: order, the default-network annotation, namespace
//! isolation, devices, CNI_ARGS, capability arguments, errors.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use serde_json::json;

use super::*;
use crate::selection::annotation::{DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION};

/// NADs, the kubelet's devices of the pod and those of its claims, asked
/// for counted.
#[derive(Default)]
struct FakeCluster {
    nads: HashMap<(String, String), Nad>,
    devices: DeviceIds,
    /// The kubelet fails: `Some(transient)`.
    fails: Option<bool>,
    asked: Cell<usize>,
    claim_devices: DeviceIds,
    /// Reading the claims fails: `Some(transient)`.
    claims_fail: Option<bool>,
    claims_asked: Cell<usize>,
}

impl FakeCluster {
    /// A NAD whose `spec.config` is a bridge network named `name`.
    fn nad(self, namespace: &str, name: &str) -> Self {
        let spec = json!({"cniVersion": "1.0.0", "name": name, "type": "bridge"});
        self.nad_with(namespace, name, Some(spec.to_string()), None)
    }

    fn nad_with(
        mut self,
        namespace: &str,
        name: &str,
        config: Option<String>,
        resource_name: Option<&str>,
    ) -> Self {
        let nad = Nad {
            config,
            resource_name: resource_name.map(String::from),
        };
        self.nads
            .insert((namespace.to_string(), name.to_string()), nad);
        self
    }
}

impl Cluster for FakeCluster {
    fn network_attachment(&self, namespace: &str, name: &str) -> Option<Nad> {
        self.nads
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    async fn pod_devices(&self, pod: &Pod<'_>) -> Result<DeviceIds, DevicesError> {
        self.asked.set(self.asked.get() + 1);
        // The API's uid: the kubelet's checkpoint is keyed by it.
        assert_eq!((pod.namespace, pod.name, pod.uid), ("ns1", "p", "uid-api"));
        match self.fails {
            Some(transient) => Err(DevicesError {
                transient,
                error: "kubelet is restarting".into(),
            }),
            None => Ok(self.devices.clone()),
        }
    }

    async fn pod_claim_devices(&self, pod: &Pod<'_>) -> Result<DeviceIds, DevicesError> {
        self.claims_asked.set(self.claims_asked.get() + 1);
        assert_eq!((pod.namespace, pod.uid), ("ns1", "uid-api"));
        match self.claims_fail {
            Some(transient) => Err(DevicesError {
                transient,
                error: "cannot list the ResourceClaims of namespace ns1".into(),
            }),
            None => Ok(self.claim_devices.clone()),
        }
    }
}

/// Networks by name (confDir networks and delegates alike), each load
/// noted.
#[derive(Default)]
struct FakeConfigs {
    lists: HashMap<String, NetworkList>,
    loaded: RefCell<Vec<String>>,
}

impl FakeConfigs {
    fn with(names: &[&str]) -> Self {
        let mut c = Self::default();
        for name in names {
            let doc = json!({"cniVersion": "1.0.0", "name": name, "type": "ptp"});
            let list = NetworkList::from_value(Path::new(name), doc, true).unwrap();
            c.lists.insert(name.to_string(), list);
        }
        c
    }

    fn find(&self, name: &str) -> Result<NetworkList, ConfigError> {
        self.loaded.borrow_mut().push(name.to_string());
        self.lists
            .get(name)
            .cloned()
            .ok_or_else(|| ConfigError::NotFound {
                name: name.to_string(),
                dir: "/etc/cni/net.d".into(),
                skipped: Vec::new(),
            })
    }
}

impl Configs for FakeConfigs {
    type Error = ConfigError;

    async fn load_network(&self, name: &str) -> Result<NetworkList, ConfigError> {
        self.find(name)
    }

    async fn load_selected(&self, s: &Selected) -> Result<NetworkList, ConfigError> {
        self.find(&s.network)
    }

    /// The network of that name, if there is one (else: no plugins).
    async fn auxiliary_chain(&self, name: &str) -> Result<Option<NetworkList>, ConfigError> {
        Ok(self.find(name).ok())
    }
}

/// An ADD for pod `<namespace>/p`.
struct Call {
    namespace: &'static str,
    annotations: BTreeMap<String, String>,
    runtime_uid: Option<&'static str>,
    infra_container_id: Option<&'static str>,
    capability_args: Map<String, Value>,
}

impl Call {
    fn new(namespace: &'static str) -> Self {
        Self {
            namespace,
            annotations: BTreeMap::new(),
            runtime_uid: Some("uid-rt"),
            infra_container_id: Some("infra1"),
            capability_args: Map::new(),
        }
    }

    fn networks(self, value: &str) -> Self {
        self.annotate(NETWORKS_ANNOTATION, value)
    }

    fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    /// The plan under [`config`], with the confDir networks `cluster` and
    /// `extra`.
    async fn plan(&self, cluster: &FakeCluster) -> Result<Vec<Network>, Error<ConfigError>> {
        let configs = FakeConfigs::with(&["cluster", "extra"]);
        self.plan_with(&config(), cluster, &configs).await
    }

    /// [`Call::plan`], which must succeed, and the networks it loaded.
    async fn plan_loading(&self, cluster: &FakeCluster) -> (Vec<Network>, Vec<String>) {
        let configs = FakeConfigs::with(&["cluster", "extra"]);
        let plan = self.plan_with(&config(), cluster, &configs).await.unwrap();
        (plan, configs.loaded.take())
    }

    /// The pod's networks under `config` (the auxiliary chain aside).
    async fn plan_with(
        &self,
        config: &Config,
        cluster: &FakeCluster,
        configs: &FakeConfigs,
    ) -> Result<Vec<Network>, Error<ConfigError>> {
        let plan = self.plan_whole(config, cluster, configs).await?;
        Ok(plan.networks)
    }

    async fn plan_whole(
        &self,
        config: &Config,
        cluster: &FakeCluster,
        configs: &FakeConfigs,
    ) -> Result<Plan, Error<ConfigError>> {
        let request = Request {
            pod: Pod {
                namespace: self.namespace,
                name: "p",
                uid: "uid-api",
                annotations: &self.annotations,
            },
            container_id: "c1",
            ifname: "eth0",
            runtime_uid: self.runtime_uid,
            infra_container_id: self.infra_container_id,
            capability_args: &self.capability_args,
            device_info_dir: Path::new("/devinfo"),
        };
        plan(config, &request, cluster, configs).await
    }
}

/// The `spec.config` of a NAD whose network takes a device.
fn sriov(name: &str) -> Option<String> {
    Some(json!({"cniVersion": "1.0.0", "name": name, "type": "sriov"}).to_string())
}

/// clusterNetwork `cluster`, defaultNetworks `extra`, multus's defaults.
fn config() -> Config {
    Config::new("cluster", vec!["extra".into()])
}

fn shown(plan: &[Network]) -> Vec<(&str, &str, bool)> {
    plan.iter()
        .map(|n| (n.display_name.as_str(), n.ifname.as_str(), n.primary))
        .collect()
}

#[tokio::test]
async fn networks_should_be_the_cluster_then_default_then_annotation_networks() {
    let cluster = FakeCluster::default().nad("ns1", "a").nad("other", "b");
    let (plan, loaded) = Call::new("ns1")
        .networks("a, other/b@fast0")
        .plan_loading(&cluster)
        .await;
    assert_eq!(
        shown(&plan),
        [
            ("cluster", "eth0", true),
            ("extra", "net1", false),
            ("ns1/a", "net2", false),
            ("other/b", "fast0", false),
        ]
    );
    assert_eq!(plan[3].list.name, "b");
    assert_eq!(loaded, ["cluster", "extra"]);
}

#[tokio::test]
async fn pods_in_system_namespaces_should_get_no_default_networks() {
    let cluster = FakeCluster::default().nad("kube-system", "a");
    let (plan, loaded) = Call::new("kube-system")
        .networks("a")
        .plan_loading(&cluster)
        .await;
    assert_eq!(
        shown(&plan),
        [("cluster", "eth0", true), ("kube-system/a", "net1", false)]
    );
    assert_eq!(loaded, ["cluster"]);
}

#[tokio::test]
async fn the_default_network_annotation_should_replace_the_cluster_network() {
    let cluster = FakeCluster::default().nad("kube-system", "calico2");
    let (plan, loaded) = Call::new("ns1")
        .annotate(
            DEFAULT_NETWORK_ANNOTATION,
            r#"[{"name":"calico2","default-route":["10.0.0.1"]}]"#,
        )
        .plan_loading(&cluster)
        .await;
    assert_eq!(
        shown(&plan),
        [
            ("kube-system/calico2", "eth0", true),
            ("extra", "net1", false)
        ]
    );
    assert_eq!(plan[0].list.name, "calico2");
    assert_eq!(
        plan[0].default_route,
        Some(vec!["10.0.0.1".parse().unwrap()])
    );
    // It runs with the call's capability arguments, as the cluster
    // network would.
    assert_eq!(plan[0].capability_args, None);
    assert_eq!(loaded, ["extra"]);
}

#[tokio::test]
async fn configured_networks_should_prefer_a_nad_in_the_multus_namespace() {
    let cluster = FakeCluster::default().nad("kube-system", "extra");
    let (plan, loaded) = Call::new("ns1").plan_loading(&cluster).await;
    assert_eq!(
        shown(&plan),
        [
            ("cluster", "eth0", true),
            ("kube-system/extra", "net1", false)
        ]
    );
    assert_eq!(plan[1].list.plugin_type(0), "bridge");
    assert_eq!(loaded, ["cluster"]);
    // Inline delegates are never NADs, whatever their name.
    let mut config = Config::new("", vec![]);
    config.delegates = vec![json!({"name": "extra", "type": "ptp"})];
    let configs = FakeConfigs::with(&["extra"]);
    let plan = Call::new("ns1")
        .plan_with(&config, &cluster, &configs)
        .await
        .unwrap();
    assert_eq!(shown(&plan), [("extra", "eth0", true)]);
    assert_eq!(plan[0].list.plugin_type(0), "ptp");
}

#[tokio::test]
async fn namespace_isolation_should_keep_a_pod_to_its_own_and_global_namespaces() {
    let cluster = FakeCluster::default()
        .nad("other", "b")
        .nad("default", "c")
        .nad("other", "d");
    let configs = FakeConfigs::with(&["cluster", "extra"]);
    let mut config = config();
    config.namespace_isolation = true;
    let call = Call::new("ns1").networks("default/c");
    assert!(call.plan_with(&config, &cluster, &configs).await.is_ok());
    let e = Call::new("ns1")
        .networks("default/c, other/b")
        .plan_with(&config, &cluster, &configs)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Nad(nad::Error::Isolation { .. })), "{e}");
    assert!(e.to_string().contains("namespace isolation"), "{e}");
    // The default network is the configuration's choice: not isolated.
    config.multus_namespace = "other".into();
    let plan = Call::new("ns1")
        .annotate(DEFAULT_NETWORK_ANNOTATION, "d")
        .plan_with(&config, &cluster, &configs)
        .await
        .unwrap();
    assert_eq!(plan[0].display_name, "other/d");
}

#[tokio::test]
async fn devices_should_be_taken_in_network_order_from_one_kubelet_answer() {
    let mut cluster = FakeCluster::default()
        .nad("ns1", "plain")
        .nad_with("ns1", "r1", sriov("r1"), Some("vendor/vf"))
        .nad_with("ns1", "r2", sriov("r2"), Some("vendor/vf"))
        .nad_with("ns1", "r3", sriov("r3"), Some("vendor/vf"));
    cluster.devices = BTreeMap::from([(
        "vendor/vf".to_string(),
        vec!["0000:03:00.2".to_string(), "0000:03:00.1".to_string()],
    )]);
    let plan = Call::new("ns1")
        .networks("plain, r1, r2, r3")
        .plan(&cluster)
        .await
        .unwrap();
    assert_eq!(cluster.asked.get(), 1);
    // r3 found none left: the claims were asked, once, and had none.
    assert_eq!(cluster.claims_asked.get(), 1);
    let device = |i: usize| plan[i].list.plugins[0].get("deviceID").cloned();
    assert_eq!(device(2), None);
    assert_eq!(device(3), Some(json!("0000:03:00.1")));
    assert_eq!(plan[3].list.plugins[0]["pciBusID"], "0000:03:00.1");
    assert_eq!(device(4), Some(json!("0000:03:00.2")));
    // None left: no device, no device-info file.
    assert_eq!(device(5), None);
    assert_eq!(plan[5].copy_device_info, None);
    let rc = plan[3].capability_args.as_ref().unwrap();
    assert_eq!(rc["deviceID"], "0000:03:00.1");
    let info = "/devinfo/cni/ns1-r1-c1_net3";
    assert_eq!(rc["CNIDeviceInfoFile"], info);
    assert_eq!(
        plan[3].copy_device_info,
        Some((
            crate::device_info::dp_file(Path::new("/devinfo"), "vendor/vf", "0000:03:00.1"),
            PathBuf::from(info)
        ))
    );
}

#[tokio::test]
async fn claims_should_be_asked_once_and_only_when_the_kubelet_has_no_device_left() {
    let mut cluster = FakeCluster::default()
        .nad_with("ns1", "plugin", sriov("plugin"), Some("vendor/vf"))
        .nad_with("ns1", "dra1", sriov("dra1"), Some("dra/nic"))
        .nad_with("ns1", "dra2", sriov("dra2"), Some("dra/nic"))
        .nad_with("ns1", "dra3", sriov("dra3"), Some("dra/nic"));
    cluster.devices = BTreeMap::from([("vendor/vf".to_string(), vec!["0000:03:00.1".to_string()])]);
    // The kubelet's own device of the resource stays first; the claims'
    // come after it, sorted, the one both report once.
    cluster.claim_devices = BTreeMap::from([(
        "dra/nic".to_string(),
        vec!["0000:3b:02.4".to_string(), "0000:3b:02.3".to_string()],
    )]);
    let device = |plan: &[Network], i: usize| plan[i].list.plugins[0].get("deviceID").cloned();

    // Only the device plugin's resource: the claims are never read.
    let plan = Call::new("ns1")
        .networks("plugin")
        .plan(&cluster)
        .await
        .unwrap();
    assert_eq!(device(&plan, 2), Some(json!("0000:03:00.1")));
    assert_eq!(cluster.claims_asked.get(), 0);

    let plan = Call::new("ns1")
        .networks("plugin, dra1, dra2, dra3")
        .plan(&cluster)
        .await
        .unwrap();
    assert_eq!((cluster.asked.get(), cluster.claims_asked.get()), (2, 1));
    assert_eq!(device(&plan, 2), Some(json!("0000:03:00.1")));
    assert_eq!(device(&plan, 3), Some(json!("0000:3b:02.3")));
    assert_eq!(device(&plan, 4), Some(json!("0000:3b:02.4")));
    assert_eq!(device(&plan, 5), None);
    // The same device-info handling as a device plugin's device.
    let rc = plan[3].capability_args.as_ref().unwrap();
    assert_eq!(rc["deviceID"], "0000:3b:02.3");
    assert_eq!(plan[3].list.plugins[0]["pciBusID"], "0000:3b:02.3");
    assert_eq!(
        plan[3]
            .copy_device_info
            .as_ref()
            .map(|(from, _)| from.clone()),
        Some(crate::device_info::dp_file(
            Path::new("/devinfo"),
            "dra/nic",
            "0000:3b:02.3"
        ))
    );
}

#[tokio::test]
async fn the_kubelet_should_not_be_asked_when_no_network_names_a_resource() {
    let cluster = FakeCluster {
        fails: Some(true),
        ..FakeCluster::default().nad("ns1", "plain")
    };
    let plan = Call::new("ns1")
        .networks("plain")
        .plan(&cluster)
        .await
        .unwrap();
    assert_eq!(plan.len(), 3);
    assert_eq!(cluster.asked.get(), 0);
    assert_eq!(cluster.claims_asked.get(), 0);
}

#[tokio::test]
async fn a_kubelet_or_claims_failure_should_name_the_pod_and_the_resource() {
    for transient in [true, false] {
        // The kubelet fails; then the kubelet answers without the
        // resource and reading the pod's claims fails.
        let kubelet = FakeCluster {
            fails: Some(transient),
            ..FakeCluster::default()
        };
        let claims = FakeCluster {
            claims_fail: Some(transient),
            ..FakeCluster::default()
        };
        for (cluster, why) in [
            (kubelet, "kubelet is restarting"),
            (claims, "cannot list the ResourceClaims of namespace ns1"),
        ] {
            let cluster = cluster.nad_with("ns1", "r1", sriov("r1"), Some("vendor/vf"));
            let e = Call::new("ns1")
                .networks("r1")
                .plan(&cluster)
                .await
                .unwrap_err();
            assert_eq!(e.is_transient(), transient, "{e}");
            assert_eq!(
                e.to_string(),
                format!("pod ns1/p: the devices of resource \"vendor/vf\": {why}")
            );
        }
    }
}

#[tokio::test]
async fn cni_args_should_carry_the_pod_keys_and_an_elements_mac_and_ips() {
    let cluster = FakeCluster::default().nad("ns1", "a");
    let value = r#"[{"name":"a","mac":"02:00:00:00:00:01","ips":["10.1.1.2/24"]}]"#;
    let plan = Call::new("ns1")
        .networks(value)
        .plan(&cluster)
        .await
        .unwrap();
    let keys = "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p;\
                K8S_POD_INFRA_CONTAINER_ID=infra1;K8S_POD_UID=uid-rt";
    assert_eq!(plan[0].cni_args, keys);
    assert_eq!(plan[1].cni_args, keys);
    assert_eq!(
        plan[2].cni_args,
        format!("{keys};MAC=02:00:00:00:00:01;IP=10.1.1.2/24")
    );
    // Without the runtime's uid and infra container id: the API's uid,
    // an empty id.
    let call = Call {
        runtime_uid: None,
        infra_container_id: None,
        ..Call::new("ns1")
    };
    let plan = call.plan(&cluster).await.unwrap();
    assert!(
        plan[0]
            .cni_args
            .ends_with(";K8S_POD_INFRA_CONTAINER_ID=;K8S_POD_UID=uid-api"),
        "{}",
        plan[0].cni_args
    );
}

#[tokio::test]
async fn annotation_networks_should_get_their_own_runtime_config() {
    let cluster = FakeCluster::default().nad("ns1", "a");
    let mut call = Call::new("ns1").networks(r#"[{"name":"a","ips":["10.1.1.2/24"]}]"#);
    call.capability_args =
        json!({"portMappings": [{"hostPort": 80, "containerPort": 8080}], "dns": {}})
            .as_object()
            .unwrap()
            .clone();
    let plan = call.plan(&cluster).await.unwrap();
    assert_eq!(plan[0].capability_args, None);
    assert_eq!(plan[1].capability_args, None);
    // The runtime's known keys (as multus), then the element's.
    assert_eq!(
        plan[2].capability_args.clone().map(Value::Object),
        Some(json!({
            "portMappings": [{"hostPort": 80, "containerPort": 8080}],
            "ips": ["10.1.1.2/24"]
        }))
    );
}

#[tokio::test]
async fn a_missing_nad_should_fail_in_multus_words() {
    let cluster = FakeCluster::default().nad("ns1", "a");
    let e = Call::new("ns1")
        .networks("a, nothere")
        .plan(&cluster)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Nad(nad::Error::NotFound { .. })), "{e}");
    assert_eq!(
        e.to_string(),
        "cannot find a network-attachment-definition (nothere) in namespace (ns1): \
         no such NetworkAttachmentDefinition"
    );
}

#[tokio::test]
async fn a_nad_without_spec_config_should_be_the_confdir_network_of_its_name() {
    let cluster = FakeCluster::default()
        .nad_with("ns1", "mine", None, None)
        .nad_with("ns1", "absent", None, None);
    let configs = FakeConfigs::with(&["cluster", "extra", "mine"]);
    let plan = Call::new("ns1")
        .networks("mine")
        .plan_with(&config(), &cluster, &configs)
        .await
        .unwrap();
    assert_eq!(plan[2].display_name, "ns1/mine");
    assert_eq!(plan[2].list.plugin_type(0), "ptp");
    let e = Call::new("ns1")
        .networks("absent")
        .plan_with(&config(), &cluster, &configs)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Nad(nad::Error::File { .. })), "{e}");
}

#[tokio::test]
async fn other_failures_should_keep_their_kind() {
    let cluster = FakeCluster::default().nad_with(
        "ns1",
        "old",
        Some(r#"{"name":"old","type":"bridge"}"#.into()),
        None,
    );
    let fail = |call: Call| {
        let cluster = &cluster;
        async move { call.plan(cluster).await.unwrap_err() }
    };
    let e = fail(Call::new("ns1").networks("a/b/c")).await;
    assert!(matches!(e, Error::Annotation { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("pod ns1/p: pod annotation k8s.v1.cni.cncf.io/networks: item 0"),
        "{e}"
    );
    let e = fail(Call::new("ns1").networks("x@eth0")).await;
    assert!(
        matches!(e, Error::Select(super::super::Error::Collision { .. })),
        "{e}"
    );
    // A configured network keeps the loader's error.
    let configs = FakeConfigs::with(&["cluster"]);
    let e = Call::new("ns1")
        .plan_with(&config(), &cluster, &configs)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Load(ConfigError::NotFound { name, .. }) if name == "extra"),
        "{e}"
    );
    // A NAD config the engine would not run names the NAD.
    let e = Call::new("ns1")
        .networks("old")
        .plan(&cluster)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Config { .. }), "{e}");
    assert!(e.to_string().starts_with("ns1/old: "), "{e}");
    assert!(!e.is_transient());
}

#[tokio::test]
async fn the_auxiliary_chain_should_follow_the_pods_networks_with_its_keys() {
    let cluster = FakeCluster::default().nad("ns1", "a");
    let mut config = config();
    config.auxiliary_chain = Some("aux".into());
    let configs = FakeConfigs::with(&["cluster", "extra", "aux"]);
    let call = Call::new("ns1").networks("a");
    let plan = call.plan_whole(&config, &cluster, &configs).await.unwrap();
    let aux = plan.auxiliary.unwrap();
    assert_eq!(
        (aux.display_name.as_str(), aux.ifname.as_str(), aux.primary),
        ("aux", "net3", false)
    );
    // The pod's keys, as the cluster network has them; the call's
    // capability arguments; no default route, no device-info file.
    assert_eq!(aux.cni_args, plan.networks[0].cni_args);
    assert_eq!(aux.capability_args, None);
    assert!(aux.default_route.is_none() && aux.copy_device_info.is_none());
    // A chain without plugins adds nothing.
    let configs = FakeConfigs::with(&["cluster", "extra"]);
    let plan = call.plan_whole(&config, &cluster, &configs).await.unwrap();
    assert!(plan.auxiliary.is_none());
}

#[tokio::test]
async fn configured_networks_should_resolve_as_for_a_pod_without_taking_devices() {
    // `extra` is a NAD in multusNamespace naming a resource; `cluster` a
    // confDir network; `gone` neither.
    let cluster = FakeCluster::default().nad_with(
        "kube-system",
        "extra",
        sriov("extra-net"),
        Some("intel.com/sriov"),
    );
    let configs = FakeConfigs::with(&["cluster"]);
    let mut config = Config::new("cluster", vec!["extra".into(), "gone".into()]);
    let got = configured(&config, &cluster, &configs).await.unwrap();
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cluster", "extra", "gone"]);
    assert_eq!(got[0].1.as_ref().unwrap().name, "cluster");
    let extra = got[1].1.as_ref().unwrap();
    assert_eq!(
        (extra.name.as_str(), extra.plugin_type(0)),
        ("extra-net", "sriov")
    );
    assert!(
        matches!(&got[2].1, Err(Error::Load(ConfigError::NotFound { name, .. })) if name == "gone")
    );
    assert_eq!(cluster.asked.get(), 0, "the kubelet was asked");
    // Without a cluster network, the delegates.
    config.cluster_network.clear();
    config.delegates = vec![json!({"name": "d0", "type": "ptp"})];
    let configs = FakeConfigs::with(&["d0"]);
    let got = configured(&config, &cluster, &configs).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "d0");
}

#[test]
fn devices_should_be_sorted_and_handed_out_once() {
    let mut d = Devices::new(BTreeMap::from([(
        "intel.com/sriov".to_string(),
        vec!["0000:03:00.2".to_string(), "0000:03:00.1".to_string()],
    )]));
    assert_eq!(d.take("intel.com/sriov").as_deref(), Some("0000:03:00.1"));
    assert_eq!(d.take("intel.com/sriov").as_deref(), Some("0000:03:00.2"));
    assert_eq!(d.take("intel.com/sriov"), None);
    assert_eq!(d.take("other"), None);
    d.add(BTreeMap::from([
        (
            "intel.com/sriov".to_string(),
            vec!["0000:03:00.3".to_string(), "0000:03:00.1".to_string()],
        ),
        (
            "other".to_string(),
            vec!["b".to_string(), "a".to_string(), "a".to_string()],
        ),
    ]));
    assert_eq!(d.take("intel.com/sriov").as_deref(), Some("0000:03:00.3"));
    assert_eq!(d.take("intel.com/sriov"), None);
    assert_eq!(d.take("other").as_deref(), Some("a"));
    assert_eq!(d.take("other").as_deref(), Some("b"));
    assert_eq!(d.take("other"), None);
}
