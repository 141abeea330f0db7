//! `plexus-shim`: CNI env + stdin -> shim::run -> stdout JSON + exit code.

fn main() -> std::process::ExitCode {
    let err = plexus::api::CniError::new(
        plexus::api::code::PLUGIN_NOT_AVAILABLE,
        "plexus-shim is not available in this build",
    );
    println!("{}", err.to_json());
    std::process::ExitCode::FAILURE
}
