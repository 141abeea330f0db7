//! The integration tests' harness, for `benches/cni_path.rs`, which
//! declares `#[path = "../tests/support/mod.rs"] mod support;`: the same
//! modules, from `tests/integration/support/`.
//!
//! The bench uses a part of the harness only; the rest is dead code there
//! (the integration tests use all of it).
#![allow(dead_code)]

#[path = "../integration/support/cni.rs"]
pub mod cni;
#[path = "../integration/support/daemon.rs"]
pub mod daemon;
#[path = "../integration/support/http.rs"]
pub mod http;
#[path = "../integration/support/inproc.rs"]
pub mod inproc;
#[path = "../integration/support/kube.rs"]
pub mod kube;
#[path = "../integration/support/kubelet.rs"]
pub mod kubelet;
#[path = "../integration/support/lock.rs"]
pub mod lock;
#[path = "../integration/support/netns.rs"]
pub mod netns;
#[path = "../integration/support/shim.rs"]
pub mod shim;
#[path = "../integration/support/systemd.rs"]
pub mod systemd;
