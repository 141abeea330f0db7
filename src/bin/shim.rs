//! `plexus-shim`: CNI env + stdin -> shim::run -> stdout JSON + exit code.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let env = |key: &str| std::env::var_os(key).map(|v| v.to_string_lossy().into_owned());
    let outcome = plexus::shim::run(env, std::io::stdin().lock(), &mut std::io::stderr());
    let mut stdout = std::io::stdout().lock();
    // Nothing useful is left to do when the runtime closed our stdout.
    let _ = stdout
        .write_all(&outcome.stdout)
        .and_then(|()| stdout.flush());
    ExitCode::from(outcome.exit_code)
}
