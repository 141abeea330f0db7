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
//!   limit       open-connection cap and CNI admission (limit + FIFO queue)
//!   handler     wire request -> validated call -> networks -> engine -> answer
//!   k8s         this node's pods and the NetworkAttachmentDefinitions (watch
//!               caches), the pod a call names, the network-status write
//!   selection   which networks a container gets, in which order, ifnames:
//!               static config, pod annotations, NADs -> network configs
//!   cni         plugin chains per the CNI spec (engine), attachment records
//!
//! beside the path:
//!   shim        the CNI plugin: environment + stdin -> request -> CNI answer
//!   api         wire types, command names, CNI error codes (shared with the shim)
//!   names       the spec's rules for container, network and interface names
//!   result      CNI result versions and conversions
//!   duration    "10s"-style durations
//!   config      daemon-config.json -> validated per-module configs
//!   cli         plexusd's command line
//!   autoconf    `plexusd generate-config`: the runtime's CNI config for the shim
//!   logging     log level, file and stderr
//!   notify      sd_notify READY / STATUS / STOPPING / WATCHDOG
//!   metrics     Prometheus registry and typed handles
//!   trust       paths the daemon writes must be out of other users' reach
//!   daemon      composition root and lifecycle (the only module wiring others)
//! ```
//!
//! Dependency direction:
//!
//! - Along the path, a module calls only modules after it. The one
//!   reference back is by design: `server` calls the handler through its own
//!   [`server::Handler`] trait, so `handler` uses `server` for that trait and
//!   its reply types while `server` knows nothing of `handler`, the engine or
//!   systemd. `k8s` uses `result` and `duration`; `selection` uses `names`
//!   and the engine's configuration types (`cni::types`, what a selected
//!   network turns into); `cni` uses none of the modules before it.
//! - `api`, `duration`, `logging`, `metrics`, `names`, `notify` and `trust`
//!   depend on no other module; `result` only on `api` (the one table of CNI
//!   error codes, which `cni`, `result`, `server` and `shim` share).
//! - `autoconf` (the `generate-config` command) uses `result` and `trust`
//!   only; the daemon never calls it.
//! - `config` builds each module's settings from the file and depends on no
//!   lifecycle module (`daemon`, `handler`, `notify`); `cli` only on
//!   `config`.
//! - Only `daemon` wires modules together, and only the `plexusd` binary
//!   uses `daemon`.
//! - `shim` uses `api`, `result` and `duration` only (std-only modules, so
//!   the plugin stays small).

pub mod activation;
pub mod api;
pub mod autoconf;
pub mod cli;
pub mod cni;
pub mod config;
pub mod daemon;
pub mod device_info;
pub mod duration;
pub mod handler;
pub mod json;
pub mod k8s;
pub mod limit;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod netconf;
pub mod notify;
pub mod readiness_file;
pub mod result;
pub mod selection;
pub mod server;
pub mod shim;
pub mod trust;
