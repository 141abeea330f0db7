//! Running CNI plugins as a libcni-based runtime would, with crash-safe
//! records of what was attached.
//!
//! - [`engine`]: the operations (ADD, DEL, CHECK, STATUS, GC, hot-plugged
//!   networks, containers multus attached) and start-up recovery, one file
//!   each.
//! - [`state`]: what the engine keeps in `stateDir` (records, locks, the
//!   markers of running plugins) and how it is written.
//! - [`exec`]: the plugin process, from spawn to reap, and the runner that
//!   finds plugins and caches their VERSION answer.
//! - [`default_route`]: multus's `default-route`: which network owns a
//!   pod's default routes, and the route changes in the pod that follow.
//! - [`confdir`]: network configurations read from files.
//! - [`multus_cache`]: multus's caches of the containers it attached, read
//!   so that the engine can DEL, CHECK and GC them, and `show` show them.
//! - [`netns`]: which network namespaces a plugin may run in.
//! - [`backends`]: the traits the engine runs plugins and keeps records
//!   through, so its logic is tested with fakes.
//! - [`show`]: records, and what multus cached of the containers it
//!   attached, as `plexusd show` and `/attachments` print them.
//!
//! Nothing here knows about HTTP, the shim or Kubernetes.

pub mod backends;
pub mod confdir;
pub mod default_route;
pub mod engine;
pub mod exec;
pub mod multus_cache;
pub mod netns;
pub mod plan;
pub mod show;
pub mod state;

pub use engine::{
    AddedNetwork, CleanupPolicy, Config, Engine, Error, ErrorKind, Live, Planned, DEFAULT_BIN_DIRS,
    DEFAULT_CONF_DIR, DEFAULT_PLUGIN_TIMEOUT, DEFAULT_STATE_DIR,
};
