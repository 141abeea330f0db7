//! Test harness shared by the integration tests: each test file declares
//! `mod support;` and uses what it needs.
#![allow(dead_code)]

pub mod cni;
pub mod daemon;
pub mod http;
pub mod inproc;
pub mod kube;
pub mod kubelet;
pub mod netns;
pub mod shim;
pub mod systemd;
