//! The integration tests, as one test binary: one module per area (the
//! files beside this one) and the harness they share ([`support`]),
//! compiled once.
//!
//! `cargo test --test integration` runs them all, in parallel threads of
//! one process; `cargo test --test integration <module>::` runs one area.
//! Tests share this process, so a test changes nothing process-wide (the
//! environment, the umask, the current directory, signal dispositions,
//! resource limits) and names whatever it makes on the host uniquely
//! (see `support::netns`, `support::daemon::TestDir`).

// A failed unwrap here is a failed test, not a dead daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod admission;
mod architecture;
mod aux_chain;
mod call_log;
mod chaos;
mod check_config;
mod client_answers;
mod cni_faults;
mod cni_networks;
mod cni_plugins;
mod config_keys;
mod config_overlay;
mod crash_recovery;
mod cri;
mod daemon_lifecycle;
mod debian_plugins;
mod del_policy;
mod delegate;
mod fairness;
mod full_disk;
mod gc_runtime;
mod gc_safety;
mod generate_config;
mod host_safety;
mod hostile_env;
mod http_errors;
mod input_bounds;
mod k8s_credentials;
mod k8s_daemon;
mod k8s_default_route;
mod k8s_devices;
mod k8s_dra;
mod k8s_drain;
mod k8s_identity;
mod k8s_large;
mod k8s_networks;
mod k8s_publish;
mod k8s_selection;
mod k8s_source;
mod kube_fake;
mod metrics_listener;
mod multus_records;
mod multus_show;
mod multus_socket;
mod packaging;
mod packaging_docs;
mod packaging_scripts;
mod plugin_doubles;
mod plugin_env;
mod plugin_runner;
mod plugin_stderr;
mod properties;
mod readiness_file;
mod reconcile;
mod records;
mod resource_bounds;
mod shim;
mod shim_wire;
mod spawner;
mod start_order;
mod status_networks;
mod systemd_units;
mod text_order;
mod upgrade;
mod work_ownership;
