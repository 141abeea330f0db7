//! Every key of daemon-config.json, each described once: its name, kind
//! (type and check), default and help. The reader ([`Raw`]), the
//! unknown-key warning and its suggestion, `plexusd --check-config`,
//! plexusd(8) and README.md's tables all come from [`KEYS`].
//!
//! A key plexusd reads is declared in the `read` part of [`keys!`], which
//! gives it a field of [`Raw`] and reads it there: a key cannot be read
//! without being declared, and a declared key whose field nothing uses is
//! a compile error (an unread field). The `multus` part lists the keys of
//! multus's schema that plexusd itself does not act on.

use std::path::PathBuf;

use super::fields::{kind, Fields, Read};
use crate::{
    api, cni, device_info, k8s, limit, logging, readiness_file, reconcile, selection, server,
};

/// One key of daemon-config.json.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    /// What its value must be.
    pub kind: Kind,
    /// What applies when the file leaves it out (or sets it to null).
    pub default: Unset,
    /// What it does, in Markdown (`code`, links to docs/*.md).
    pub help: &'static str,
    pub role: Role,
}

/// What a key's value must be. Those plexusd reads are checked as
/// `config::fields::kind` has it, the others are not checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Path,
    /// A path, or `""` for none.
    OptionalPath,
    SearchPath,
    Text,
    Network,
    Networks,
    Strings,
    Delegates,
    Bool,
    Positive,
    Count,
    Port,
    Address,
    Duration,
    NonZeroDuration,
    LogLevel,
    NodeName,
    ChainName,
    /// A JSON object.
    Object,
    /// Anything (a key plexusd neither reads nor checks).
    Any,
}

impl Kind {
    /// The kind in a few words, for the docs.
    pub fn text(self) -> &'static str {
        match self {
            Kind::Path => "path",
            Kind::OptionalPath => "path, or `\"\"` for none",
            Kind::SearchPath => "directories separated by `:`",
            Kind::Text => "string",
            Kind::Network => "network name or path",
            Kind::Networks => "list of network names or paths",
            Kind::Strings => "list of strings",
            Kind::Delegates => "list of network configurations",
            Kind::Bool => "`true` or `false`",
            Kind::Positive => "whole number above 0",
            Kind::Count => "whole number from 0 to 1000000",
            Kind::Port => "TCP port",
            Kind::Address => "IP address",
            Kind::Duration => "duration",
            Kind::NonZeroDuration => "duration above 0",
            Kind::LogLevel => "log level",
            Kind::NodeName => "node name",
            Kind::ChainName => "directory name",
            Kind::Object => "object",
            Kind::Any => "any",
        }
    }

    /// Whether a value of this kind may be a path on this host (as
    /// opposed to one of multus's container, `/host/...`).
    pub fn may_be_path(self) -> bool {
        matches!(
            self,
            Kind::Path | Kind::OptionalPath | Kind::SearchPath | Kind::Network | Kind::Networks
        )
    }
}

/// What applies when a key is left out.
#[derive(Debug, Clone, Copy)]
pub enum Unset {
    /// This value; the function writes it as the file would have it.
    Value(fn() -> String),
    /// Nothing (an optional file or name).
    None,
    /// The feature is off.
    Off,
    /// Worked out when the file is read, as this says.
    Derived(&'static str),
}

impl Unset {
    /// The default as the docs write it (Markdown).
    pub fn text(&self) -> String {
        match self {
            Unset::Value(show) => format!("`{}`", show()),
            Unset::None => "none".into(),
            Unset::Off => "off".into(),
            Unset::Derived(words) => (*words).into(),
        }
    }
}

/// What plexusd does with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// plexusd reads it.
    Read,
    /// `plexusd generate-config` reads it; the daemon does not.
    GenerateConfig,
    /// multus's: plexusd does not act on it, and `--check-config` warns,
    /// with the help as what to do instead.
    Ignored,
    /// Part of multus's schema; accepted without a word and without
    /// effect.
    Accepted,
}

impl Role {
    /// What plexusd does with such a key, for the docs (Markdown).
    pub fn text(self) -> &'static str {
        match self {
            Role::Read => "read by plexusd",
            Role::GenerateConfig => "read by `plexusd generate-config` only",
            Role::Ignored => "ignored, with a warning from `--check-config`",
            Role::Accepted => "accepted, with no effect",
        }
    }
}

/// The key called `name`, if there is one.
pub fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// The known key nearest to `key`, when one is near enough to be what
/// was meant: the same but for case, or a few letters off (a typo such
/// as `conectionLimit`).
pub fn nearest_known_key(key: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    KEYS.iter()
        .map(|k| {
            let d = strsim::levenshtein(&lower, &k.name.to_ascii_lowercase());
            (d, k.name)
        })
        .filter(|(d, k)| *d <= 2.max(k.len() / 5) && *d < k.len() / 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The type of the field of [`Raw`] that holds a key of kind `$kind`:
/// the value itself with a fixed default, else an option.
macro_rules! field_type {
    ($kind:ident, value) => {
        <kind::$kind as Read>::Value
    };
    ($kind:ident, $unset:ident) => {
        Option<<kind::$kind as Read>::Value>
    };
}

/// Reads one key into its field of [`Raw`].
macro_rules! field_value {
    ($f:ident, $kind:ident, $name:literal, value($default:expr)) => {
        $f.read::<kind::$kind>($name)
            .unwrap_or_else(|| ($default).into())
    };
    ($f:ident, $kind:ident, $name:literal, $unset:ident $(($words:literal))?) => {
        $f.read::<kind::$kind>($name)
    };
}

/// A key's [`Unset`].
macro_rules! unset {
    ($kind:ident, value($default:expr)) => {
        Unset::Value(|| <kind::$kind as Read>::show(&($default).into()))
    };
    ($kind:ident, none) => {
        Unset::None
    };
    ($kind:ident, off) => {
        Unset::Off
    };
    ($kind:ident, derived($words:literal)) => {
        Unset::Derived($words)
    };
}

/// Declares [`KEYS`] and, for the keys plexusd reads, [`Raw`] and its
/// reader. A read key is `field: Kind "name", default, "help";` where the
/// default is `value(expr)` (the value used and shown), `none`, `off`, or
/// `derived("what it is")` (worked out where [`Raw`] is used).
macro_rules! keys {
    (
        read {
            $(
                $field:ident: $kind:ident $name:literal,
                $unset:ident $(($($default:tt)*))?,
                $help:expr;
            )*
        }
        multus {
            $( $other:expr, )*
        }
    ) => {
        /// Every key: those plexusd reads in the order it reads them, then
        /// multus's others.
        pub const KEYS: &[Key] = &[
            $(
                Key {
                    name: $name,
                    kind: Kind::$kind,
                    default: unset!($kind, $unset $(($($default)*))?),
                    help: $help,
                    role: Role::Read,
                },
            )*
            $( $other, )*
        ];

        /// The keys plexusd reads, each checked, with its default applied
        /// where the default is a fixed value.
        pub(super) struct Raw {
            $( pub(super) $field: field_type!($kind, $unset), )*
        }

        /// The name of each key plexusd reads, by its field of [`Raw`],
        /// for messages about it.
        #[allow(dead_code)]
        pub(super) struct Names {
            $( pub(super) $field: &'static str, )*
        }

        pub(super) const NAMES: Names = Names { $( $field: $name, )* };

        impl Raw {
            /// Reads every key in [`KEYS`] order (so problems come in that
            /// order); the problems are left in `f`.
            pub(super) fn read(f: &mut Fields<'_>) -> Self {
                Raw {
                    $( $field: field_value!(f, $kind, $name, $unset $(($($default)*))?), )*
                }
            }
        }
    };
}

/// A key of multus's that plexusd does not read.
const fn multus(name: &'static str, kind: Kind, role: Role, help: &'static str) -> Key {
    // A key plexusd reads is declared with its field in `keys!`'s `read`.
    assert!(
        !matches!(role, Role::Read),
        "a read key needs a field of Raw"
    );
    Key {
        name,
        kind,
        default: Unset::None,
        help,
        role,
    }
}

fn default_bin_dirs() -> Vec<PathBuf> {
    cni::DEFAULT_BIN_DIRS.iter().map(PathBuf::from).collect()
}

fn default_cleanup() -> cni::CleanupPolicy {
    cni::CleanupPolicy::default()
}

keys! {
    read {
        socket_dir: Path "socketDir", value(api::DEFAULT_SOCKET_DIR),
            "directory of `plexus.sock` when the daemon binds it itself (without a socket from \
             systemd); must be safe from other users";
        connection_limit: Positive "connectionLimit", derived("8 per CPU, at least 16"),
            "ADD, CHECK and STATUS calls processed at once; DEL and GC calls have slots of \
             their own (`deleteLimit`), so the two never wait for each other's. multus bounds \
             its connections with it and leaves it unlimited; Plexus bounds the calls running \
             plugins (a call waiting for a slot holds none, and accepting pauses once \
             `4 × connectionLimit` calls wait, [Limits](#limits)). This default comes from \
             herds of 250 and 1,000 pods measured on 2 CPUs (BENCHMARKS.md, section 11): the \
             herd's ADDs are CPU-bound, and 16 slots kept them at the pace of an unlimited \
             daemon (and of the plugins called directly) with half its peak memory";
        delete_limit: Positive "deleteLimit", value(limit::DEFAULT_DELETE_LIMIT),
            "DEL and GC calls processed at once, in slots of their own beside \
             `connectionLimit`'s: a DEL never waits for an ADD's slot, nor a flood of DELs \
             takes the ADDs' slots. A DEL waits mostly for the kernel's veth teardown and the \
             IPAM plugin's lock, not for a CPU, so its default does not follow the CPUs; more \
             slots did not speed a 1,000-pod DEL herd up, only made each DEL slower and \
             plexusd larger (BENCHMARKS.md, section 11). Plexus only: multus has one limit";
        queue_timeout: Duration "queueTimeout", value(super::DEFAULT_QUEUE_TIMEOUT),
            "how long a request may wait for a processing slot; then HTTP 503 with CNI error \
             code 11";
        max_connections: Positive "maxConnections", value(super::DEFAULT_MAX_CONNECTIONS),
            "open client connections; past it a new client takes the place of the connection \
             idle longest, or waits in the kernel backlog ([Limits](#limits))";
        read_timeout: NonZeroDuration "readTimeout", value(super::DEFAULT_READ_TIMEOUT),
            "request head and body must arrive within it, else the connection is closed (408 \
             if the head arrived)";
        body_budget_bytes: Positive "bodyBudgetBytes", value(server::DEFAULT_BODY_BUDGET_BYTES),
            "request body bytes read at once across all connections (16 MiB by default); a \
             body waits for room within `readTimeout`, then gets 503 with code 11. Never below \
             one largest body (1 MiB)";
        shutdown_timeout: Duration "shutdownTimeout", value(super::DEFAULT_SHUTDOWN_TIMEOUT),
            "how long in-flight requests may take to finish after SIGTERM/SIGINT";
        idle_timeout: Duration "idleTimeout", off,
            "exit after this long without connections; systemd starts the daemon again on the \
             next one. `\"0\"` is off";
        log_level: LogLevel "logLevel", value(logging::Level::Info),
            "`trace`, `debug`, `info` (multus `verbose`), `warn`, `error` (multus `panic`)";
        log_file: Path "logFile", none,
            "also log to this file; its directory must be safe from other users";
        log_to_stderr: Bool "logToStderr", derived("`true` unless `logFile` is set"),
            "log to stderr; when stderr is the journal, structured journald fields are used";
        metrics_port: Port "metricsPort", off,
            "also serve `GET /metrics` on this TCP port, at most 16 connections at a time";
        metrics_bind_address: Address "metricsBindAddress",
            value(super::DEFAULT_METRICS_BIND_ADDRESS),
            "address `metricsPort` listens on; multus listens on all addresses, Plexus only on \
             this host unless told otherwise (`\"0.0.0.0\"`, `\"::\"`)";
        bin_dirs: SearchPath "binDir", value(default_bin_dirs()),
            "plugin search path, searched in order (a missing directory is skipped); also the \
             plugins' `CNI_PATH`";
        plugin_spawner: Path "pluginSpawner", none,
            "the socket of `plexus-spawner` (`plexus-plugins.socket`; \
             `/run/plexus/plugins.sock` as packaged), which then starts every plugin outside \
             plexusd's sandbox, as the runtime would; without it, plexusd forks plugins itself, \
             and they share its limits and sandbox ([docs/plugins.md](docs/plugins.md))";
        del_errors_reported: Count "delErrorsReported",
            value(default_cleanup().errors_reported),
            "how many of the runtime's DELs of an attachment are answered with their error; \
             when a later one fails too it is answered with success and plexusd keeps what is \
             left and retries it alone \
             ([docs/records.md](docs/records.md#pending-cleanup)); `0`: never report a DEL \
             error";
        cleanup_retry_interval: NonZeroDuration "cleanupRetryInterval",
            value(default_cleanup().retry_interval),
            "the wait before plexusd's own first retry of a failed DEL, doubled after each \
             failed retry up to 64 times it";
        cleanup_give_up_after: Positive "cleanupGiveUpAfter",
            value(default_cleanup().give_up_after as usize),
            "plexusd gives up a DEL once it has failed this many times in a row with the same \
             error after the container's network namespace went; logged and counted \
             (`plexus_cleanups_total{outcome=\"given_up\"}`)";
        conf_dir: Path "confDir", value(cni::DEFAULT_CONF_DIR),
            "where networks named by `clusterNetwork` and `defaultNetworks` are found (`.conf`, \
             `.conflist`, `.json`, first match in file-name order)";
        state_dir: Path "stateDir", value(cni::DEFAULT_STATE_DIR),
            "attachment records (`attachments/<containerId>.json`); must be safe from other \
             users";
        plugin_timeout: NonZeroDuration "pluginTimeout", value(cni::DEFAULT_PLUGIN_TIMEOUT),
            "how long one plugin call may run; then its whole process group is killed";
        cluster_network: Network "clusterNetwork", none,
            "the network attached as the runtime's `CNI_IFNAME`, whose result goes back to the \
             runtime: a network `name` in `confDir`, or a path (file or directory). Without it \
             here, each call's CNI configuration must name it ([Networks named by the call's \
             configuration](#networks-named-by-the-calls-configuration))";
        default_networks: Networks "defaultNetworks", value(Vec::<String>::new()),
            "networks attached to every container after the cluster network, as `net1`, \
             `net2`, ... (names or paths, like `clusterNetwork`)";
        delegates: Delegates "delegates", value(Vec::<serde_json::Value>::new()),
            "multus's alternative to `clusterNetwork`: a list of inline network configurations \
             (single plugin, or a list with `plugins`); the first is the cluster network, the \
             others follow as `net1`, ...; `defaultNetworks` are then not attached. Ignored \
             when `clusterNetwork` is set, as in multus";
        auxiliary_chain: ChainName "auxiliaryCNIChainName", none,
            "multus's auxiliary chain, run after every other network: its plugins are \
             `<directory of clusterNetwork>/<auxiliaryCNIChainName>/*.conf`, so \
             `clusterNetwork` must then be a path \
             ([The auxiliary CNI chain](#the-auxiliary-cni-chain))";
        cni_dir: Path "cniDir", value(cni::multus_cache::DEFAULT_CNI_DIR),
            "multus's cache directory: DEL, CHECK and GC of containers multus attached read \
             their networks there (and remove the caches after DEL); must be safe from other \
             users like `stateDir`";
        multus_namespace: Text "multusNamespace", value(selection::DEFAULT_MULTUS_NAMESPACE),
            "where the NetworkAttachmentDefinitions named by `clusterNetwork`, \
             `defaultNetworks` and the `v1.multus-cni.io/default-network` annotation are";
        system_namespaces: Strings "systemNamespaces",
            value(vec![selection::DEFAULT_MULTUS_NAMESPACE.to_string()]),
            "pods in these namespaces get no `defaultNetworks`";
        namespace_isolation: Bool "namespaceIsolation", value(false),
            "a pod may name NetworkAttachmentDefinitions of its own namespace and of \
             `globalNamespaces` only";
        global_namespaces: Text "globalNamespaces",
            value(selection::nad::DEFAULT_GLOBAL_NAMESPACES.join(",")),
            "with `namespaceIsolation`, the namespaces whose NetworkAttachmentDefinitions every \
             pod may name (a comma-separated list)";
        readiness_path: Path "readinessindicatorfile", none,
            "a file the cluster network's agent creates once it is up (multus's key): ADD, \
             STATUS and GC wait for it ([Readiness indicator file](#readiness-indicator-file))";
        readiness_timeout: Duration "readinessIndicatorTimeout",
            value(readiness_file::DEFAULT_TIMEOUT),
            "how long a call waits for `readinessindicatorfile` (multus waits as long); then it \
             fails with code 11 (try again later)";
        kubeconfig: Path "kubeconfig", none,
            "credentials for the Kubernetes API (for example the node's kubelet kubeconfig); \
             without it, the in-cluster service account when running in a pod; without either, \
             no Kubernetes (static networks only). multus ignores this key; Plexus reads it. \
             The file must be root's and writable by no one else";
        node_name: NodeName "nodeName", derived("the host name, lowercased"),
            "this node's name: only pods with this `spec.nodeName` are watched";
        pod_events: Bool "podEvents", value(true),
            "post a pod event per ADD (`AddedInterface`, every interface in one event) and a \
             `NoNetworkFound` warning for a missing NAD, in the background; `false` posts none";
        kubernetes_sync_timeout: Duration "kubernetesSyncTimeout",
            value(k8s::DEFAULT_SYNC_TIMEOUT),
            "how long start-up waits for the pod and NetworkAttachmentDefinition caches before \
             reporting ready anyway (`/readyz` and `STATUS=` then say the caches have not \
             synced, and name the watches' last error with its causes: a refused certificate, \
             401 Unauthorized, a refused connection). A pod's ADD that arrives before the caches \
             synced waits for them, at most until `kubernetesSyncTimeout` after the daemon's \
             start and at most `queueTimeout` (what a call accepts to wait for admission), then \
             fails with code 11 naming that error; after the start-up window it does not wait. \
             The wait comes after admission, so such an ADD holds its processing slot \
             (`connectionLimit`) meanwhile. DEL, CHECK and GC never need the caches; STATUS needs them only for a `defaultNetworks` entry named as a NetworkAttachmentDefinition (code 11 before they synced)";
        kubernetes_request_timeout: NonZeroDuration "kubernetesRequestTimeout",
            value(k8s::DEFAULT_REQUEST_TIMEOUT),
            "bound of one Kubernetes API request (and of connecting), and of one kubelet \
             pod-resources call";
        pod_resources_socket: Path "podResourcesSocket",
            value(k8s::devices::DEFAULT_POD_RESOURCES_SOCKET),
            "the kubelet's pod-resources API, for NADs with a `resourceName` \
             ([Devices](#devices-resourcename))";
        device_checkpoint: Path "deviceCheckpointFile",
            value(k8s::devices::DEFAULT_CHECKPOINT_FILE),
            "read instead when `podResourcesSocket` does not exist";
        device_info_dir: Path "deviceInfoDir", value(device_info::DEFAULT_DIR),
            "device-info files: device plugins' in `dp/`, networks' in `cni/` (a network's file \
             there is removed by its DEL, also for pods multus attached; only a regular file, \
             never through a symbolic link)";
        cri_socket: OptionalPath "criSocket",
            derived("the first of `/run/containerd/containerd.sock`, `/run/crio/crio.sock` that \
                     exists when plexusd starts"),
            "the container runtime's CRI socket, asked which pod sandboxes exist \
             ([Reconcile](#reconcile-addresses-the-runtime-forgot)); `\"\"`: none (no \
             reconciling)";
        reconcile: Bool "reconcile", value(true),
            "delete, as a pending cleanup, the networks of Kubernetes pods whose sandbox the \
             runtime no longer lists and whose network namespace is gone, so that their \
             addresses are given back ([Reconcile](#reconcile-addresses-the-runtime-forgot))";
        reconcile_grace: NonZeroDuration "reconcileGrace", value(reconcile::DEFAULT_GRACE),
            "nothing is reclaimed from a record written, a runtime started, or an empty sandbox \
             list (after a non-empty one) younger than this: longer than a runtime takes to \
             come back and a sandbox's ADD may take";
        reconcile_interval: NonZeroDuration "reconcileInterval",
            value(reconcile::DEFAULT_INTERVAL),
            "how often the runtime's sandboxes are compared with the records (also once at \
             start); one CRI call, bounded by this interval (1s to 10s)";
    }
    multus {
        multus(
            "chrootDir",
            Kind::Any,
            Role::Ignored,
            "multus's daemon runs in a container and reaches the host through a chroot; \
             plexusd runs on the host and needs none: remove the key",
        ),
        multus(
            "perNodeCertificate",
            Kind::Any,
            Role::Ignored,
            "plexusd requests no certificate of its own: point `kubeconfig` at credentials with \
             the rights README lists (a kubelet's kubeconfig works for the pods) and remove the \
             key",
        ),
        multus(
            "logOptions",
            Kind::Any,
            Role::Ignored,
            "plexusd logs to the journal (`journalctl -u plexusd`) and does not rotate \
             `logFile`: rotate it with logrotate's `copytruncate`, or drop `logFile`, and remove \
             the key",
        ),
        multus(
            "enablePprof",
            Kind::Any,
            Role::Ignored,
            "plexusd has no profiling endpoint; its metrics are at GET /metrics on its socket \
             (and on `metricsPort` when set): remove the key",
        ),
        multus(
            "retryDeleteOnError",
            Kind::Any,
            Role::Ignored,
            "plexusd always keeps what a failed DEL needs and answers the error, so the runtime \
             retries: remove the key",
        ),
        multus(
            "forceCNIVersion",
            Kind::Any,
            Role::Ignored,
            "plexusd runs each network at a CNI version its plugins support: remove the key",
        ),
        multus(
            "multusConfigFile",
            Kind::Any,
            Role::Ignored,
            "the runtime's configuration for plexus-shim is written by `plexusd \
             generate-config`, run on every change by plexus-config.path (`systemctl enable \
             --now plexus-config.path`): remove the key",
        ),
        multus(
            "multusAutoconfigDir",
            Kind::Path,
            Role::GenerateConfig,
            "where the primary CNI configuration is looked for \
             ([docs/autoconf.md](docs/autoconf.md))",
        ),
        multus(
            "cniConfigDir",
            Kind::Path,
            Role::GenerateConfig,
            "where `00-plexus.conf` is written",
        ),
        multus(
            "multusMasterCNI",
            Kind::Text,
            Role::GenerateConfig,
            "the primary's file name in `multusAutoconfigDir`, instead of looking for it",
        ),
        multus(
            "cniVersion",
            Kind::Text,
            Role::GenerateConfig,
            "the generated file's `cniVersion`",
        ),
        multus(
            "overrideNetworkName",
            Kind::Bool,
            Role::GenerateConfig,
            "name the generated network after the primary instead of `multus-cni-network`",
        ),
        multus(
            "capabilities",
            Kind::Object,
            Role::GenerateConfig,
            "capabilities the generated file declares besides the primary's",
        ),
        multus(
            "daemonSocketDir",
            Kind::Path,
            Role::GenerateConfig,
            "copied into the generated file, for `plexus-shim`: its socket is \
             `<daemonSocketDir>/plexus.sock`",
        ),
        multus(
            "runtimeConfig",
            Kind::Any,
            Role::Accepted,
            "a key of multus's schema; plexusd takes the runtime's `runtimeConfig` from each \
             call",
        ),
        multus(
            "type",
            Kind::Any,
            Role::Accepted,
            "a key of multus's schema, as in a network configuration",
        ),
        multus(
            "name",
            Kind::Any,
            Role::Accepted,
            "a key of multus's schema, as in a network configuration",
        ),
    }
}
