//! Links the programs with packed relative relocations (`DT_RELR`) when
//! the toolchain and the C library of this machine support them: a
//! position-independent executable otherwise carries one 24-byte
//! relocation per pointer in its read-only data (19,000 in plexusd, 0.45
//! MB), which the dynamic loader reads at every start and which stay
//! resident. Packed, they take 6 KB.
//!
//! Nothing changes when it cannot be checked: a cross build, a static
//! build, a linker that does not know the option (it warns), or a C
//! library older than glibc 2.36 (the probe program does not start).
//!
//! And orders plexusd's text: `link/plexusd-text.ld` (made by
//! `scripts/text-order.sh`) puts the functions the daemon runs first, in
//! the order they first ran. The kernel maps a program's file by whole
//! folios (and 64 KiB around each fault), so a daemon whose code ran once
//! here and there kept most of its 8 MB of text resident. Used when the
//! linker rustc uses takes the script (a probe program links with it).

use std::env;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

const FLAG: &str = "-Wl,-z,pack-relative-relocs";

/// plexusd's text order, from the manifest's directory.
const TEXT_ORDER: &str = "link/plexusd-text.ld";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={TEXT_ORDER}");
    println!("cargo:rerun-if-env-changed=CC");
    if supported() {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    }
    if let Some(script) = text_order() {
        println!(
            "cargo:rustc-link-arg-bin=plexusd=-Wl,-T,{}",
            script.display()
        );
    }
}

/// The text-order script, when the linker rustc uses for this target takes
/// it: a probe program is linked with it by the same rustc, flags and
/// target.
fn text_order() -> Option<PathBuf> {
    let script = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR")?).join(TEXT_ORDER);
    let out = PathBuf::from(env::var_os("OUT_DIR")?);
    let src = out.join("order_probe.rs");
    fs::write(&src, "fn main() {}\n").ok()?;
    let rustc = env::var_os("RUSTC")?;
    let mut probe = Command::new(rustc);
    probe
        .args(["--crate-type", "bin", "--edition", "2021", "--target"])
        .arg(env::var("TARGET").ok()?)
        .arg("-o")
        .arg(out.join("order_probe"))
        .arg(format!("-Clink-arg=-Wl,-T,{}", script.display()))
        .arg(&src);
    // The build's own flags (a linker chosen there, for one).
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        probe.args(flags.split('\x1f').filter(|f| !f.is_empty()));
    }
    let linked = probe.output().ok()?;
    linked.status.success().then_some(script)
}

/// Whether a probe program linked with [`FLAG`] links without a warning,
/// holds packed relocations and runs here.
fn supported() -> bool {
    let var = |k: &str| env::var(k).unwrap_or_default();
    let (host, target) = (var("HOST"), var("TARGET"));
    if host != target
        || !target.ends_with("-linux-gnu")
        || var("CARGO_CFG_TARGET_FEATURE")
            .split(',')
            .any(|f| f == "crt-static")
    {
        return false;
    }
    let Some(out) = env::var_os("OUT_DIR").map(PathBuf::from) else {
        return false;
    };
    let src = out.join("relr_probe.c");
    let exe = out.join("relr_probe");
    // A pointer in read-only data: one relative relocation.
    let probe = "static const char *const p[] = {\"relr\"};\n\
                 int main(void) { return p[0][0] == 'r' ? 0 : 1; }\n";
    if fs::write(&src, probe).is_err() {
        return false;
    }
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(linked) = Command::new(&cc)
        .args(["-fPIE", "-pie", FLAG, "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
    else {
        return false;
    };
    let quiet = String::from_utf8_lossy(&linked.stderr).trim().is_empty();
    if !linked.status.success() || !quiet {
        return false;
    }
    let packed = Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("(RELR)"));
    packed && Command::new(&exe).status().is_ok_and(|s| s.success())
}
