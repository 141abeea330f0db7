//! Plexus: a systemd-native thick CNI plugin.
//!
//! The container runtime executes `plexus-shim` (a CNI plugin) for every CNI
//! call; the shim forwards the call over a unix socket to the long-lived
//! `plexusd` daemon, which decides which networks the container gets and
//! runs the real CNI plugins for each of them.
//!
//! # Architecture
//!
//! ```text
//! runtime -> plexus-shim --HTTP/1.1 over unix socket--> plexusd
//!                                                         |
//!   activation  listener from systemd (LISTEN_FDS) or a safe self-bind
//!   server      accept loop, HTTP, routes, read timeouts, graceful drain
//!   limit       open-connection cap and CNI admission (limit + FIFO queue)
//!   selection   which networks a container gets, in which order, ifnames
//!   cni         plugin chains per the CNI spec (engine), attachment records
//!   notify      sd_notify READY / STATUS / STOPPING / WATCHDOG
//!   metrics     Prometheus registry and typed handles
//!   config      daemon-config.json -> validated per-module configs
//!   trust       paths the daemon writes must be out of other users' reach
//!   daemon      composition root and lifecycle (the only module wiring others)
//! ```
//!
//! Dependency direction: `api` depends on nothing (it holds the one table of
//! CNI error codes, which `cni`, `result`, `server` and `shim` share);
//! `server` knows nothing of
//! systemd or CNI internals and calls the [`server::Handler`] trait; only
//! `daemon` wires modules together; `shim` uses `api`, `result` and
//! `duration` only (std-only modules, so the plugin stays small).

pub mod activation;
pub mod api;
pub mod cli;
pub mod cni;
pub mod config;
pub mod daemon;
pub mod duration;
pub mod k8s;
pub mod limit;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod result;
pub mod selection;
pub mod server;
pub mod shim;
pub mod trust;
