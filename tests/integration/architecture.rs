//! The module graph that `src/lib.rs` describes is the one the code has:
//! every `crate::` path in a module's files (tests excluded) names only
//! modules that module may use, and the graph has no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may use, as `src/lib.rs`'s
/// map says. A module missing here, or an import not listed, fails.
const MAY_USE: &[(&str, &[&str])] = &[
    // Leaves.
    ("api", &[]),
    ("causes", &[]),
    ("device_info", &[]),
    ("duration", &[]),
    ("memory", &[]),
    ("json", &[]),
    ("logging", &[]),
    ("metrics", &[]),
    ("names", &[]),
    ("notify", &[]),
    ("op_thread", &[]),
    ("trust", &[]),
    ("spawner", &[]),
    ("result", &["api"]),
    ("netconf", &["api", "names", "result"]),
    ("readiness_file", &["duration"]),
    ("grpc", &[]),
    ("cri", &["duration", "grpc"]),
    // Along the request's path.
    ("activation", &["api", "trust"]),
    ("server", &["api", "duration", "limit", "memory", "metrics"]),
    ("limit", &["duration", "memory", "metrics"]),
    (
        "handler",
        &[
            "api",
            "causes",
            "cni",
            "cri",
            "device_info",
            "duration",
            "json",
            "k8s",
            "netconf",
            "op_thread",
            "readiness_file",
            "result",
            "selection",
            "server",
        ],
    ),
    (
        "k8s",
        &[
            "causes",
            "device_info",
            "duration",
            "grpc",
            "memory",
            "result",
            "selection",
        ],
    ),
    ("selection", &["device_info", "json", "names", "netconf"]),
    (
        "cni",
        &[
            "api",
            "device_info",
            "duration",
            "metrics",
            "names",
            "netconf",
            "op_thread",
            "result",
            "spawner",
        ],
    ),
    // Beside it.
    (
        "reconcile",
        &["causes", "cni", "cri", "duration", "netconf"],
    ),
    ("shim", &["api", "duration", "result", "trust"]),
    ("autoconf", &["result", "trust"]),
    ("cli", &["config"]),
    (
        "config",
        &[
            "activation",
            "api",
            "causes",
            "cni",
            "device_info",
            "duration",
            "json",
            "k8s",
            "limit",
            "logging",
            "readiness_file",
            "reconcile",
            "selection",
            "server",
            "trust",
        ],
    ),
    (
        "daemon",
        &[
            "activation",
            "causes",
            "cni",
            "config",
            "duration",
            "handler",
            "k8s",
            "limit",
            "logging",
            "memory",
            "metrics",
            "notify",
            "readiness_file",
            "reconcile",
            "server",
            "spawner",
        ],
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `.rs` files under `dir`, test files (`*_tests.rs`, `tests.rs`) left
/// out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".rs") && !name.ends_with("_tests.rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The top-level module a file under `src/` belongs to (`None` for
/// `lib.rs` and the binaries).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    if first == "bin" || first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// `text` without comments and without an inline `#[cfg(test)] mod tests`
/// at its end.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module named by a `crate::` path in `code`: `crate::a::..` and
/// each name of `crate::{a, b::c, ..}`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            out.insert(ident(after));
        }
        rest = after;
    }
    out
}

/// The import graph of `src/`: module -> (module it uses -> a file that
/// does).
fn graph() -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let uses = graph.entry(module.clone()).or_default();
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for used in crate_paths(&code) {
            if used != module && modules.contains(&used) {
                uses.entry(used).or_insert_with(|| file.clone());
            }
        }
    }
    graph
}

#[test]
fn every_import_should_be_one_the_map_allows() {
    let allowed: BTreeMap<&str, &[&str]> = MAY_USE.iter().copied().collect();
    let mut wrong = Vec::new();
    for (module, uses) in graph() {
        let Some(may) = allowed.get(module.as_str()) else {
            wrong.push(format!("module {module} is not in the map"));
            continue;
        };
        for (used, file) in uses {
            if !may.contains(&used.as_str()) {
                wrong.push(format!("{module} uses {used} ({})", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports the map does not allow:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_map_should_list_no_import_that_is_not_there() {
    let graph = graph();
    let mut stale = Vec::new();
    for (module, may) in MAY_USE {
        let uses = graph.get(*module).cloned().unwrap_or_default();
        for m in *may {
            if !uses.contains_key(*m) {
                stale.push(format!("{module} -> {m}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "edges in the map but not in the code:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_module_graph_should_have_no_cycle() {
    let graph = graph();
    // Depth-first search; a module met again on the current path closes
    // a cycle.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeMap<String, PathBuf>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in graph.get(m).map(|u| u.keys()).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        if let Some(cycle) = visit(m, &graph, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_import_parser_should_see_both_forms_and_skip_comments() {
    let code = code_of(
        "use crate::{a, b::c, self as _};\nuse crate::d::e; // crate::f\nfn x() { crate::g::h(); }\n#[cfg(test)]\nmod tests {\n use crate::z;\n}\n",
    );
    let found: Vec<String> = crate_paths(&code).into_iter().collect();
    assert_eq!(found, ["a", "b", "d", "g", "self"]);
}
