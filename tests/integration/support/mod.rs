//! Test harness shared by the integration tests (declared once, in
//! `main.rs`; the test modules use it as `crate::support`).

pub mod chaos;
pub mod cni;
pub mod containerd;
pub mod cri_client;
pub mod daemon;
pub mod http;
pub mod inproc;
pub mod kube;
pub mod kubelet;
pub mod lock;
pub mod multus;
pub mod netns;
pub mod procnet;
pub mod shim;
pub mod systemd;
pub mod tmpfs;
