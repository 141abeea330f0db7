//! The plugin process runner: finds a plugin binary, runs it with a
//! controlled environment and stdin, enforces the deadline, and turns what
//! it printed into a result or an error that names the plugin.
//!
//! Every plugin runs in its own process group. The group is killed when the
//! deadline passes, and again after the plugin exits (leftover children),
//! before the plugin itself is reaped: the group id cannot be reused while
//! the unreaped plugin holds it, so the kill never hits a stranger. The
//! answer is what the plugin printed by the time it exited: a process that
//! left the group (setsid) and inherited the pipes is neither waited for nor
//! killed (under systemd the unit's cgroup takes care of it), and no task,
//! buffer or descriptor of the call outlives it.
//!
//! With a [`Journal`], each plugin's process group is noted before the
//! plugin gets a byte of its config, so a daemon restarted after a crash can
//! kill what the old one left running ([`kill_stale_group`]); a plugin whose
//! daemon died before its config was written reads EOF and does nothing.
//!
//! Plugins are started with posix_spawn (vfork semantics): no `pre_exec`
//! hook, because one forces a real fork, which copies the daemon's page
//! tables and, in a burst, costs more CPU than the plugins themselves. So a
//! daemon killed by SIGKILL does not take its running plugins with it; under
//! systemd, `KillMode=mixed` kills whatever is left in the unit's cgroup
//! before the restart. Nothing here blocks the async runtime: spawning runs
//! on the blocking pool, exits are awaited on a pidfd, pipes are async.

mod error;
mod group;
mod process;
mod remote;
mod runner;
#[cfg(test)]
mod tests;

pub use error::{Error, PluginError};
pub use group::{kill_stale_group, start_time, Group, Journal, SpawnClock};
pub use process::{run_command, Finished, STDERR_CAP, STDOUT_CAP};
pub use runner::{CallEnv, Plugin, Runner, VERSION_RETRY, VERSION_TIMEOUT};

/// What must be done before a plugin may read its configuration (see
/// [`Runner::run_gated`]): blocking work, started on a blocking thread of
/// its own just before the plugin is spawned, so that its disk waits
/// overlap the plugin's exec and start-up. It runs even when the spawn
/// fails, only once (not again when the spawn is retried), and is over
/// before the run goes on either way. `Ok` lets the plugin go on, `Err`
/// stops it.
pub type Gate = Box<dyn FnOnce() -> Result<(), String> + Send>;
