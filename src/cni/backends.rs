//! What the engine needs from the world around it, as traits: something
//! that runs plugins ([`PluginRunner`]) and somewhere to keep attachment
//! records ([`Records`]). The daemon uses the real ones, [`Runner`] (plugin
//! processes) and [`Store`] (files under `stateDir`); the engine's unit
//! tests put scripted plugins and an in-memory store in their place
//! ([`super::Engine::with_backends`]).
//!
//! Container locks ([`super::state::Locks`]) stay outside: they are the
//! engine's own concurrency control, shared with other daemons on the same
//! `stateDir` through flock, and the plugin markers live in the lock files.
//! Tests keep them real, in a temporary directory, so what they check about
//! serialization is what the daemon does.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use super::exec::{self, CallEnv, Gate, Plugin, Runner};
use super::state::{self, Durability, Record, Store};

/// A future a trait object can return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Finds plugins, asks their VERSION and runs them.
pub trait PluginRunner: Send + Sync + fmt::Debug + 'static {
    /// Locates plugin `name` (its `type`). Blocking: the engine calls it
    /// on the blocking pool.
    fn find(&self, name: &str) -> Result<Plugin, exec::Error>;

    /// The CNI versions `plugin` supports; `None` when it does not say
    /// (the network's own version is then used).
    fn versions<'a>(&'a self, plugin: &'a Plugin) -> BoxFuture<'a, Option<Arc<Vec<String>>>>;

    /// Runs `plugin` with `env` and `stdin`: its stdout on success, else
    /// why it failed.
    fn run<'a>(
        &'a self,
        plugin: &'a Plugin,
        env: &'a CallEnv,
        stdin: Vec<u8>,
    ) -> BoxFuture<'a, Result<Vec<u8>, exec::Error>>;

    /// Runs `plugin` once `gate` is `Ok` (see [`Runner::run_gated`], which
    /// starts the process before); fails without running it otherwise.
    fn run_gated<'a>(
        &'a self,
        plugin: &'a Plugin,
        env: &'a CallEnv,
        stdin: Vec<u8>,
        gate: Gate,
    ) -> BoxFuture<'a, Result<Vec<u8>, exec::Error>> {
        Box::pin(async move {
            let outcome = tokio::task::spawn_blocking(gate)
                .await
                .unwrap_or_else(|e| Err(format!("the work was lost: {e}")));
            outcome.map_err(|why| exec::Error::Held {
                plugin: plugin.name.clone(),
                why,
            })?;
            self.run(plugin, env, stdin).await
        })
    }
}

impl PluginRunner for Runner {
    fn find(&self, name: &str) -> Result<Plugin, exec::Error> {
        Runner::find(self, name)
    }

    fn versions<'a>(&'a self, plugin: &'a Plugin) -> BoxFuture<'a, Option<Arc<Vec<String>>>> {
        Box::pin(Runner::versions(self, plugin))
    }

    fn run<'a>(
        &'a self,
        plugin: &'a Plugin,
        env: &'a CallEnv,
        stdin: Vec<u8>,
    ) -> BoxFuture<'a, Result<Vec<u8>, exec::Error>> {
        Box::pin(Runner::run(self, plugin, env, stdin))
    }

    fn run_gated<'a>(
        &'a self,
        plugin: &'a Plugin,
        env: &'a CallEnv,
        stdin: Vec<u8>,
        gate: Gate,
    ) -> BoxFuture<'a, Result<Vec<u8>, exec::Error>> {
        Box::pin(Runner::run_gated(self, plugin, env, stdin, gate))
    }
}

/// Keeps one record per container. Every method blocks: the engine calls
/// them on the blocking pool, under the container's lock for writes.
pub trait Records: Send + Sync + fmt::Debug + 'static {
    /// The record of `container_id`, if any; a damaged one is
    /// [`state::Error::Damaged`].
    fn load(&self, container_id: &str) -> Result<Option<Record>, state::Error>;
    /// Replaces the record; a record without attachments removes it.
    fn save(&self, record: &Record, durability: Durability) -> Result<(), state::Error>;
    /// Removes the record of `container_id`, if any.
    fn remove(&self, container_id: &str, durability: Durability) -> Result<(), state::Error>;
    /// Whether `container_id` has a record, readable or not.
    fn exists(&self, container_id: &str) -> bool;
    /// The ids of every container with a record.
    fn list(&self) -> Result<Vec<String>, state::Error>;
    /// Moves a damaged record out of the way (keeping it); where it went.
    fn set_aside(&self, container_id: &str) -> Result<PathBuf, state::Error>;
    /// Whether a record of `container_id` was ever set aside.
    fn was_set_aside(&self, container_id: &str) -> bool;
    /// Half-written records a crashed writer left, as (container id, path).
    fn temp_files(&self) -> Vec<(String, PathBuf)>;
    /// How long ago the record of `container_id` was last written, when
    /// known.
    fn age(&self, _container_id: &str) -> Option<std::time::Duration> {
        None
    }
}

impl Records for Store {
    fn load(&self, container_id: &str) -> Result<Option<Record>, state::Error> {
        Store::load(self, container_id)
    }

    fn save(&self, record: &Record, durability: Durability) -> Result<(), state::Error> {
        Store::save(self, record, durability)
    }

    fn remove(&self, container_id: &str, durability: Durability) -> Result<(), state::Error> {
        Store::remove(self, container_id, durability)
    }

    fn exists(&self, container_id: &str) -> bool {
        Store::exists(self, container_id)
    }

    fn list(&self) -> Result<Vec<String>, state::Error> {
        Store::list(self)
    }

    fn set_aside(&self, container_id: &str) -> Result<PathBuf, state::Error> {
        Store::set_aside(self, container_id)
    }

    fn was_set_aside(&self, container_id: &str) -> bool {
        Store::was_set_aside(self, container_id)
    }

    fn temp_files(&self) -> Vec<(String, PathBuf)> {
        Store::temp_files(self)
    }

    fn age(&self, container_id: &str) -> Option<std::time::Duration> {
        Store::age(self, container_id)
    }
}
