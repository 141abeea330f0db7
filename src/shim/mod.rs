//! The CNI plugin side of Plexus (`plexus-shim`): checks the call the way
//! CNI skel does, forwards it to the daemon (plexusd, or a multus daemon)
//! as `POST /cni {"env", "config"}` over the unix socket, and turns the
//! answer into CNI output: an ADD answer is the daemon's result (1.1.0 from
//! both daemons) converted to the shim config's `cniVersion`.
//!
//! The shim must stay small and start fast: it uses std, serde_json and
//! base64 (through [`api`](crate::api)), [`result`](crate::result), the
//! std-only [`duration`](crate::duration) parser and [`trust`](crate::trust)
//! (it talks only to a socket, and a daemon, that root owns), with a blocking
//! [`UnixStream`](std::os::unix::net::UnixStream) and a small HTTP/1.1
//! client. No async runtime, no logging framework. Everything after the
//! pre-checks is bounded by the overall deadline (`timeout`), including a
//! `connect` that waits for room in a full listen backlog.
//!
//! Only VERSION is answered locally. Every failure, DEL included, is CNI
//! error JSON on stdout and a non-zero exit: a DEL that did not reach the
//! daemon must be retried by the runtime, never skipped (multus-shim exits
//! 0 there and leaks the attachment).
//!
//! Layout: `config` reads the shim's own settings from the network config;
//! `front` is the CNI side (environment and stdin in, result or error JSON
//! and exit status out); `client` carries the request over the socket,
//! retrying the connect (but for a STATUS, which answers code 50 at once
//! when no daemon listens); `http` reads the daemon's HTTP/1.1 answer.
//! [`run`] joins them.

use std::io::{Read, Write};
use std::time::Instant;

use crate::api::CniError;

mod client;
mod config;
mod front;
mod http;

use client::Client;
use front::Call;

pub use config::{
    Config, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, KEY_CONNECT_TIMEOUT, KEY_SOCKET_DIR,
    KEY_SOCKET_PATH, KEY_TIMEOUT,
};
pub use front::{Outcome, ENV_VARS, MAX_STDIN_BYTES};
#[doc(hidden)]
pub use http::parse_raw_response;

/// Runs one CNI call: `env` looks up environment variables, `stdin` is the
/// network config, and `log` receives progress lines (stderr in the binary).
pub fn run(env: impl Fn(&str) -> Option<String>, stdin: impl Read, log: &mut dyn Write) -> Outcome {
    let started = Instant::now();
    match call(&env, stdin, log, started) {
        Ok(stdout) => Outcome::success(stdout),
        Err(e) => Outcome::failure(&e),
    }
}

/// The call's stdout, or the error to print instead.
fn call(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: impl Read,
    log: &mut dyn Write,
    started: Instant,
) -> Result<Vec<u8>, CniError> {
    let forward = match front::read(env, stdin)? {
        Call::Version(answer) => return Ok(answer),
        Call::Forward(forward) => forward,
    };
    let response =
        Client::new(&forward.config, forward.command, started).exchange(&forward.body, log)?;
    front::answer(&forward, response)
}
