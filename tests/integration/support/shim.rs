//! Runs the built `plexus-shim` with exactly the environment and stdin a
//! test gives it, bounded in time, and collects what it printed.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const SHIM: &str = env!("CARGO_BIN_EXE_plexus-shim");
/// Longest a shim run may take before the test fails.
pub const T: Duration = Duration::from_secs(30);

/// What one shim run printed and returned.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Asserts a failed call with CNI error `code`; returns the error.
    pub fn error(&self, code: u32) -> Value {
        assert_eq!(self.code, Some(1), "{self:?}");
        let v = self.json();
        assert_eq!(v["code"], code, "{self:?}");
        assert!(!v["msg"].as_str().unwrap_or("").is_empty(), "{self:?}");
        v
    }

    /// Asserts success; returns stdout.
    pub fn success(&self) -> &str {
        assert_eq!(self.code, Some(0), "{self:?}");
        &self.stdout
    }
}

/// `program` as a runtime executes a CNI plugin: with exactly `env`
/// (nothing inherited), stdin, stdout and stderr piped.
pub fn command<I, K, V>(program: impl AsRef<OsStr>, env: I) -> Command
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Starts the shim with exactly `env` (nothing inherited) and `stdin`.
pub fn spawn<I, K, V>(env: I, stdin: &[u8]) -> Child
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut child = command(SHIM, env).spawn().expect("spawn plexus-shim");
    // The shim reads all of stdin before anything else; a write error
    // here would show up as a wrong answer below.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child
}

/// Waits (bounded by [`T`]) for a spawned shim and collects its output;
/// stderr may already have been taken by the test.
pub fn finish(mut child: Child) -> Run {
    let mut out = child.stdout.take().unwrap();
    let err = child.stderr.take();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = err {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > T {
            let _ = child.kill();
            let _ = child.wait();
            panic!("plexus-shim did not exit within {T:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    Run {
        code: status.code(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Runs the shim to completion.
pub fn run<I, K, V>(env: I, stdin: &[u8]) -> Run
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    finish(spawn(env, stdin))
}
