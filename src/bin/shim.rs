//! `plexus-shim`: CNI env + stdin -> shim::run -> stdout JSON + exit code.
//! `--version` and `--help` answer a person at a shell instead.

use std::io::Write;
use std::process::ExitCode;

const HELP: &str = "\
plexus-shim: the CNI plugin of Plexus. A container runtime runs it as a CNI plugin
(CNI_COMMAND and the other CNI_* variables in the environment, the network
configuration on stdin); it forwards the call to plexusd over its unix socket
(daemonSocketDir in the configuration, /run/plexus by default) and prints plexusd's
answer. It is not meant to be run by hand: see plexus-shim(8) and plexusd(8).

Options (only without CNI_COMMAND):
  --version  print the version and exit
  --help     print this and exit
";

fn main() -> ExitCode {
    let env = |key: &str| std::env::var_os(key).map(|v| v.to_string_lossy().into_owned());
    if env("CNI_COMMAND").is_none() {
        match std::env::args().nth(1).as_deref() {
            Some("--version" | "-V") => {
                println!("plexus-shim {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            Some("--help" | "-h") => {
                print!("{HELP}");
                return ExitCode::SUCCESS;
            }
            _ => {}
        }
    }
    let outcome = plexus::shim::run(env, std::io::stdin().lock(), &mut std::io::stderr());
    let mut stdout = std::io::stdout().lock();
    // Nothing useful is left to do when the runtime closed our stdout.
    let _ = stdout
        .write_all(&outcome.stdout)
        .and_then(|()| stdout.flush());
    ExitCode::from(outcome.exit_code)
}
