//! plexusd's text is ordered (build.rs, `link/plexusd-text.ld`): the
//! functions every call runs sit together before the rest of the text, so
//! that a running daemon keeps few of its program's pages mapped.

use std::collections::BTreeMap;
use std::process::Command;

use crate::support::daemon::PLEXUSD;

/// Each section of `bin`: its address and size.
fn sections(bin: &str) -> BTreeMap<String, (u64, u64)> {
    let out = Command::new("readelf").args(["-SW", bin]).output().unwrap();
    assert!(out.status.success(), "readelf -SW {bin} failed");
    let mut found = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "  [18] .text.hot  PROGBITS  00000000001f5f10 1f4f10 329ae7 00 AX ..."
        let Some((_, rest)) = line.split_once(']') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 5 {
            continue;
        }
        let (Ok(addr), Ok(size)) = (u64::from_str_radix(f[2], 16), u64::from_str_radix(f[4], 16))
        else {
            continue;
        };
        found.insert(f[0].to_string(), (addr, size));
    }
    found
}

/// Every function symbol of `bin` and its address.
fn functions(bin: &str) -> Vec<(String, u64)> {
    let out = Command::new("nm")
        .args(["--defined-only", bin])
        .output()
        .unwrap();
    assert!(out.status.success(), "nm {bin} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let addr = u64::from_str_radix(f.first()?, 16).ok()?;
            (f.len() == 3 && "tT".contains(f[1])).then(|| (f[2].to_string(), addr))
        })
        .collect()
}

#[test]
fn the_daemons_call_path_should_sit_before_the_rest_of_its_text() {
    let sections = sections(PLEXUSD);
    let &(hot, hot_size) = sections
        .get(".text.hot")
        .expect("plexusd has no .text.hot: build.rs did not link it with link/plexusd-text.ld");
    let &(text, _) = sections.get(".text").expect("plexusd has no .text");
    assert!(hot_size > 0 && hot + hot_size <= text, "{sections:?}");
    let inside = |a: u64| (hot..hot + hot_size).contains(&a);
    let functions = functions(PLEXUSD);
    // The addresses of the functions whose symbol starts with `path` (a
    // legacy-mangled path, without its hash).
    let at = |path: &str| -> Vec<u64> {
        functions
            .iter()
            .filter(|(name, _)| name.starts_with(path))
            .map(|&(_, a)| a)
            .collect()
    };
    // What every call runs: start-up, the connection, the engine's ADD.
    for path in [
        "_ZN6plexus6daemon4main17h",
        "_ZN6plexus6server10connection5serve17h",
        "_ZN6plexus3cni6engine3add10AddPending5added17h",
    ] {
        let found = at(path);
        assert!(!found.is_empty(), "plexusd has no function {path}*");
        assert!(
            found.iter().all(|&a| inside(a)),
            "{path}* is not in .text.hot"
        );
    }
    // What a daemon never runs (`plexusd show`) stays with the rest.
    let show = at("_ZN6plexus3cni4show14multus_summary17h");
    assert!(!show.is_empty(), "plexusd has no multus_summary");
    assert!(
        show.iter().all(|&a| !inside(a)),
        "multus_summary is in .text.hot"
    );
}
