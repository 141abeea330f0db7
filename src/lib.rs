//! Plexus: a systemd-native thick CNI plugin.
//!
//! The container runtime executes `plexus-shim` (a CNI plugin) for every CNI
//! call; the shim forwards the call over a unix socket to the long-lived
//! `plexusd` daemon, which decides which networks the container gets and
//! runs the real CNI plugins for each of them.
//!
//! # Architecture
//!
//! The folders read as the path a request takes through `plexusd`:
//!
//! ```text
//! runtime -> plexus-shim --HTTP/1.1 over unix socket--> plexusd
//!
//!   activation  listener from systemd (LISTEN_FDS) or a safe self-bind
//!   server      accept loop, HTTP, routes, read timeouts, graceful drain
//!   limit       open-connection cap and CNI admission (a turn per container,
//!               then a slot of its pool, ADD-like or DEL-like, with a FIFO
//!               queue; accepting pauses on a deep queue)
//!   handler     joins the others: wire request -> validated call -> the
//!               plan selection makes -> the engine carries it out -> answer
//!               (and what Kubernetes learns, published by k8s)
//!   k8s         this node's pods and the NetworkAttachmentDefinitions (watch
//!               caches of slim values, not objects), the kubelet's devices,
//!               publishing network-status and events (retries tracked for
//!               the drain);
//!               implements selection's lookup trait for pods
//!   selection   which networks a container gets, in which order, ifnames:
//!               static config, pod annotations, NADs -> network configs
//!               (a pod's plan behind a lookup trait, no Kubernetes client)
//!   cni         the engine (one file per operation; an ADD carried out as a
//!               plan, locks taken and released by one bracket), the records in
//!               stateDir, the plugin process runner (forking plugins, or
//!               asking the plugin spawner to), default-route changes
//!
//! shared by several layers (leaves):
//!   netconf     network configuration lists and the call, with their rules
//!   device_info device-info files: paths, copying, decoding
//!   names       the spec's rules for container, network and interface names
//!   result      CNI result versions and conversions
//!   api         wire types, command names, CNI error codes (shared with the shim)
//!   memory      the allocator's free memory given back after bursts and lists
//!   json        a JSON value's kind, for messages
//!   cri         the runtime's CRI: its pod sandboxes, when it started
//!   grpc        one unary gRPC call on a unix socket (kubelet, runtime)
//!   causes      an error's text with every cause under it
//!   duration    "10s"-style durations
//!   op_thread   a CNI call run on a thread of its own, its blocking work in
//!               place (fewer hand-offs between threads per call)
//!
//! beside the path:
//!   shim        the CNI plugin: config, CNI front end, client, HTTP reader
//!   config      daemon-config.json -> validated per-module configs
//!   cli         plexusd's command line
//!   autoconf    `plexusd generate-config`: the runtime's CNI config for the shim
//!   logging     log level, file and stderr
//!   notify      sd_notify READY / STATUS / STOPPING / WATCHDOG
//!   readiness_file  the file that says plexusd is ready, for runtimes that look
//!   reconcile   the records against the runtime's sandboxes: the networks of
//!               pods the runtime forgot are deleted (through the engine)
//!   metrics     Prometheus registry and typed handles
//!   trust       paths the daemon writes must be out of other users' reach
//!   spawner     the plugin spawner (`plexus-spawner`): its protocol and its
//!               serving side; plugins started outside plexusd's sandbox
//!   daemon      composition root and lifecycle (the only module wiring others)
//! ```
//!
//! Dependency direction (every `crate::` import; nothing else, as
//! `tests/integration/architecture.rs` checks):
//!
//! - Leaves: `api`, `causes`, `device_info`, `duration`, `grpc`, `json`, `logging`,
//!   `memory`, `metrics`, `names`, `notify`, `op_thread`, `spawner` and `trust` use no
//!   other module;
//!   `cri` uses `duration` and `grpc`; `result`
//!   uses `api`; `netconf` uses `api`, `names` and `result`;
//!   `readiness_file` uses `duration`.
//! - Along the path, a module uses only modules after it and the leaves.
//!   `cni` uses the leaves only. `selection` uses `netconf`, `names`,
//!   `device_info` and `json`: it never reaches into `cni`, `k8s` or
//!   `config`. `k8s` uses `selection` (to implement its lookup trait),
//!   `causes`, `device_info`, `duration`, `grpc`, `memory` and `result`. `limit` uses
//!   `duration`, `memory` and `metrics`.
//! - The one reference back is by design: `server` calls the handler
//!   through its own [`server::Handler`] trait, so `handler` uses `server`
//!   for that trait and its reply types while `server` (which uses `api`,
//!   `limit`, `duration`, `memory` and `metrics`) knows nothing of `handler`, the
//!   engine or systemd. `handler` uses `server`, `k8s`, `selection`, `cni`
//!   and the leaves, and `readiness_file`.
//! - `activation` uses `api` and `trust`; `autoconf` (the `generate-config`
//!   command) uses `result` and `trust`; the daemon never calls it.
//! - `reconcile` uses `cni` (the engine, the records read-only), `cri`,
//!   `netconf`, `causes` and `duration`; only `daemon` starts it.
//! - `config` builds each module's settings from the file: it uses the
//!   modules whose `Config` it fills and no lifecycle module (`daemon`,
//!   `handler`, `notify`); `cli` uses only `config`.
//! - Only `daemon` wires modules together, and only the `plexusd` binary
//!   uses `daemon` (`gendocs` reads its exit statuses for the man page).
//! - `shim` uses `api`, `result`, `duration` and `trust` only (std-only
//!   modules, so the plugin stays small; `trust` decides whose socket it
//!   may talk to).

pub mod activation;
pub mod api;
pub mod autoconf;
pub mod causes;
pub mod cli;
pub mod cni;
pub mod config;
pub mod cri;
pub mod daemon;
pub mod device_info;
pub mod duration;
pub mod grpc;
pub mod handler;
pub mod json;
pub mod k8s;
pub mod limit;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod netconf;
pub mod notify;
pub mod op_thread;
pub mod readiness_file;
pub mod reconcile;
pub mod result;
pub mod selection;
pub mod server;
pub mod shim;
pub mod spawner;
pub mod trust;
