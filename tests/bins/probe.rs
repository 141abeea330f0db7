//! `plexus-test-probe`: a CNI plugin that records the environment it runs
//! in, for the tests that compare how a container runtime and plexusd run
//! a plugin (tests/integration/plugin_env.rs).
//!
//! It works alone or as the last plugin of a chain: ADD answers with the
//! config's `prevResult` unchanged, or with an empty result when there is
//! none; CHECK, DEL, GC and STATUS answer nothing; VERSION answers the
//! versions 0.3.0 to 1.1.0.
//!
//! For every command but VERSION it writes one JSON object, atomically
//! (a temporary file renamed), to `<probeOutput>.<COMMAND>.json`, where
//! `probeOutput` is a key of its config. The object is flat; its keys are
//! the property names the tests and docs/plugins.md use:
//!
//! * `uid`, `gid` (real, effective, saved, file system), `groups`;
//! * `CapInh`, `CapPrm`, `CapEff`, `CapBnd`, `CapAmb`, `NoNewPrivs`,
//!   `Seccomp`, as `/proc/self/status` gives them;
//! * `syscall.*`: whether a system call is allowed, each made harmlessly
//!   in a forked child (a seccomp filter may kill the caller): `ok`, the
//!   errno's name, or `killed by SIGSYS`. `syscall.mount` is
//!   `mount(NULL, "/", NULL, MS_PRIVATE|MS_SHARED)`, which the kernel
//!   rejects with EINVAL only after seccomp and the capability check have
//!   let it through: that EINVAL is reported as `ok`, and nothing changes;
//! * `umask`, `file_mode` (of a file it creates with mode 0666);
//! * `rlimit.<NAME>` as `soft/hard`; `oom_score_adj`; `cwd`;
//! * `cgroup` and `pgrp`: `runner's` when the same as its parent's, else
//!   `own`; `ns.<type>`: `host` (the namespace of the config's `hostNs`,
//!   or of pid 1 without it), `runner's` (its parent's) or `own`;
//! * `env.CNI_*` and `env.PATH` with their values, `env.others` (the
//!   names of the other variables); `stdin.keys` (its config's keys);
//! * `fds` (descriptors beyond 0-2, with what they are), `stdio`;
//! * `write.<dir>`: whether it can create a file in that directory (and
//!   then removes it): `ok`, the errno's name, or `missing`;
//! * `tmp`: `host` when `/tmp` is the one the config's `hostTmp`
//!   (`<device>:<inode>`) names, else `other` (`unknown` without it);
//! * `raw.*`: details for people, never compared (`raw.cgroup`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use serde_json::{json, Map, Value};

/// The directories whose writability the probe records.
const WRITE_DIRS: &[&str] = &[
    "/run",
    "/var/run",
    "/var/lib",
    "/var/log",
    "/etc/cni",
    "/opt/cni/bin",
    "/tmp",
    "/root",
];

/// The resource limits the probe records, with their names.
const RLIMITS: &[(&str, libc::__rlimit_resource_t)] = &[
    ("AS", libc::RLIMIT_AS),
    ("CORE", libc::RLIMIT_CORE),
    ("CPU", libc::RLIMIT_CPU),
    ("DATA", libc::RLIMIT_DATA),
    ("FSIZE", libc::RLIMIT_FSIZE),
    ("LOCKS", libc::RLIMIT_LOCKS),
    ("MEMLOCK", libc::RLIMIT_MEMLOCK),
    ("MSGQUEUE", libc::RLIMIT_MSGQUEUE),
    ("NICE", libc::RLIMIT_NICE),
    ("NOFILE", libc::RLIMIT_NOFILE),
    ("NPROC", libc::RLIMIT_NPROC),
    ("RSS", libc::RLIMIT_RSS),
    ("RTPRIO", libc::RLIMIT_RTPRIO),
    ("RTTIME", libc::RLIMIT_RTTIME),
    ("SIGPENDING", libc::RLIMIT_SIGPENDING),
    ("STACK", libc::RLIMIT_STACK),
];

fn main() {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    if command == "VERSION" {
        let versions = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
        reply(&json!({"cniVersion": "1.1.0", "supportedVersions": versions}));
        return;
    }
    let config: Value = match serde_json::from_slice(&stdin) {
        Ok(v @ Value::Object(_)) => v,
        _ => fail(6, "the config on stdin is not a JSON object"),
    };
    if let Some(out) = config["probeOutput"].as_str() {
        let seen = Value::Object(observe(&config, Path::new(out)));
        let path = format!("{out}.{command}.json");
        let tmp = format!("{path}.tmp-{}", std::process::id());
        let written = std::fs::write(&tmp, seen.to_string() + "\n")
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            fail(999, &format!("write {path}: {e}"));
        }
    }
    if command == "ADD" {
        match config.get("prevResult") {
            Some(prev) => reply(prev),
            None => reply(&json!({
                "cniVersion": config["cniVersion"], "interfaces": [], "ips": [],
            })),
        }
    }
}

/// Prints `v` on stdout, the plugin's answer.
fn reply(v: &Value) {
    let _ = writeln!(std::io::stdout(), "{v}");
}

/// Prints a CNI error and exits with 1.
fn fail(code: u32, msg: &str) -> ! {
    reply(&json!({"cniVersion": "1.0.0", "code": code, "msg": msg}));
    std::process::exit(1)
}

/// Everything the probe records; see the module documentation.
fn observe(config: &Value, out: &Path) -> Map<String, Value> {
    let mut m = Map::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_string(), Value::String(v));
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| "absent".into())
    };
    for (key, name) in [("uid", "Uid"), ("gid", "Gid"), ("groups", "Groups")] {
        put(key, field(name));
    }
    for name in [
        "CapInh",
        "CapPrm",
        "CapEff",
        "CapBnd",
        "CapAmb",
        "NoNewPrivs",
        "Seccomp",
    ] {
        put(name, field(name));
    }
    for (name, result) in syscalls() {
        put(&format!("syscall.{name}"), result);
    }

    // SAFETY: umask(2) cannot fail; the old mask is put back at once.
    let mask = unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    };
    put("umask", format!("{mask:04o}"));
    put("file_mode", file_mode(out));
    for (name, resource) in RLIMITS {
        put(&format!("rlimit.{name}"), rlimit(*resource));
    }
    let oom = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default();
    put("oom_score_adj", oom.trim().to_string());
    let cwd = std::env::current_dir().map(|d| d.display().to_string());
    put("cwd", cwd.unwrap_or_else(|e| format!("unknown: {e}")));

    // SAFETY: getppid(2), getpgrp(2) and getpgid(2) cannot harm anything.
    let (pid, ppid, pgrp) = unsafe { (libc::getpid(), libc::getppid(), libc::getpgrp()) };
    // SAFETY: as above.
    let parent_pgrp = unsafe { libc::getpgid(ppid) };
    let pgrp_kind = if pgrp == parent_pgrp {
        "runner's"
    } else if pgrp == pid {
        "own"
    } else {
        "other"
    };
    put("pgrp", pgrp_kind.into());
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let parent_cgroup = std::fs::read_to_string(format!("/proc/{ppid}/cgroup"));
    let same = parent_cgroup.is_ok_and(|c| c == cgroup);
    put("cgroup", if same { "runner's" } else { "own" }.into());
    put("raw.cgroup", cgroup.trim().replace('\n', " "));
    for (name, kind) in namespaces(config, ppid) {
        put(&format!("ns.{name}"), kind);
    }

    let mut others = Vec::new();
    for (k, v) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CNI_") || k == "PATH" {
            put(&format!("env.{k}"), v.to_string_lossy().into_owned());
        } else {
            others.push(k);
        }
    }
    others.sort();
    put("env.others", others.join(" "));
    let mut keys: Vec<&String> = config
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    keys.sort();
    put(
        "stdin.keys",
        keys.iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(" "),
    );
    let (stdio, fds) = descriptors();
    put("stdio", stdio);
    put("fds", fds);

    for dir in WRITE_DIRS {
        put(&format!("write.{dir}"), can_create_in(Path::new(dir)));
    }
    let tmp = std::fs::metadata("/tmp").map(|m| format!("{}:{}", m.dev(), m.ino()));
    let tmp_kind = match (config["hostTmp"].as_str(), tmp) {
        (Some(host), Ok(mine)) if host == mine => "host",
        (Some(_), Ok(_)) => "other",
        _ => "unknown",
    };
    put("tmp", tmp_kind.into());
    m
}

/// Each probed system call's outcome, made in a forked child.
fn syscalls() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    // BPF_MAP_CREATE of a one-element array map (bpf_attr: map_type,
    // key_size, value_size, max_entries, the rest zero).
    out.push((
        "bpf",
        in_child(|| {
            let attr: [u32; 32] = {
                let mut a = [0u32; 32];
                a[..4].copy_from_slice(&[2, 4, 4, 1]);
                a
            };
            // SAFETY: bpf(2) reads `attr`, a live buffer of the size given.
            let fd = unsafe { libc::syscall(libc::SYS_bpf, 0, attr.as_ptr(), 128) };
            close_or_errno(fd)
        }),
    ));
    out.push((
        "mount",
        in_child(|| {
            let root = c"/";
            let flags = libc::MS_PRIVATE | libc::MS_SHARED;
            // SAFETY: two propagation types at once are invalid: the kernel
            // checks the caller's rights, then refuses with EINVAL.
            let r = unsafe {
                libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    flags,
                    std::ptr::null(),
                )
            };
            match errno_of(r as libc::c_long) {
                libc::EINVAL => 0,
                e => e,
            }
        }),
    ));
    out.push((
        "unshare_mnt",
        // SAFETY: the child leaves its parent's mount namespace, then exits.
        in_child(|| errno_of(unsafe { libc::unshare(libc::CLONE_NEWNS) } as libc::c_long)),
    ));
    out.push((
        "setns_net",
        in_child(|| {
            let Ok(f) = std::fs::File::open("/proc/self/ns/net") else {
                return last_errno();
            };
            use std::os::fd::AsRawFd;
            // SAFETY: joins the network namespace it is already in.
            errno_of(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } as libc::c_long)
        }),
    ));
    out.push((
        "perf_event_open",
        in_child(|| {
            // perf_event_attr: type SOFTWARE, size 64 (version 0), config
            // CPU_CLOCK, flags disabled|exclude_kernel|exclude_hv.
            let mut attr = [0u64; 16];
            attr[0] = 1 | (64 << 32);
            attr[5] = 1 | (1 << 5) | (1 << 6);
            // SAFETY: perf_event_open(2) reads `attr`; the counter is
            // created disabled on this process and closed.
            let fd =
                unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), 0, -1, -1, 0) };
            close_or_errno(fd)
        }),
    ));
    out.push((
        "keyctl",
        // SAFETY: KEYCTL_GET_KEYRING_ID of the session keyring, without
        // creating one.
        in_child(|| errno_of(unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) })),
    ));
    out.push((
        "mmap_wx",
        in_child(|| {
            let prot = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            // SAFETY: a fresh anonymous mapping, unmapped at once.
            unsafe {
                let p = libc::mmap(std::ptr::null_mut(), 4096, prot, flags, -1, 0);
                if p == libc::MAP_FAILED {
                    return last_errno();
                }
                libc::munmap(p, 4096);
            }
            0
        }),
    ));
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) fills `lim`.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    out.push((
        "setrlimit_nofile_soft",
        in_child(|| {
            let l = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            // SAFETY: setrlimit(2) reads `l`; only the child's limit changes.
            errno_of(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } as libc::c_long)
        }),
    ));
    let hard = if lim.rlim_max == libc::RLIM_INFINITY {
        "hard limit unlimited".to_string()
    } else {
        in_child(|| {
            let l = libc::rlimit {
                rlim_cur: lim.rlim_cur,
                rlim_max: lim.rlim_max + 1,
            };
            // SAFETY: as above.
            errno_of(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } as libc::c_long)
        })
    };
    out.push(("setrlimit_nofile_hard", hard));
    out
}

/// Runs `f` in a forked child, which exits with what `f` returns (0 or an
/// errno); `ok`, the errno's name, or the signal that killed the child.
fn in_child(f: impl FnOnce() -> i32) -> String {
    // SAFETY: the probe has one thread, so the child may run any code; it
    // leaves with _exit(2), running nothing of the parent's.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = f();
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) }
    }
    if pid < 0 {
        return format!("fork failed: {}", errno_name(last_errno()));
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is a live int.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return format!("waitpid failed: {}", errno_name(last_errno()));
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let name = if sig == libc::SIGSYS {
            "SIGSYS".to_string()
        } else {
            format!("signal {sig}")
        };
        return format!("killed by {name}");
    }
    match libc::WEXITSTATUS(status) {
        0 => "ok".into(),
        e => errno_name(e),
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// 0 for a successful system call's return value `r`, else errno.
fn errno_of(r: libc::c_long) -> i32 {
    if r < 0 {
        last_errno()
    } else {
        0
    }
}

/// Closes `fd` (a system call's new descriptor) or returns the errno.
fn close_or_errno(fd: libc::c_long) -> i32 {
    if fd < 0 {
        return last_errno();
    }
    // SAFETY: `fd` is the descriptor the call just returned.
    unsafe { libc::close(fd as i32) };
    0
}

fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EROFS => "EROFS",
        libc::EEXIST => "EEXIST",
        libc::ENOSYS => "ENOSYS",
        libc::EINVAL => "EINVAL",
        libc::ENOKEY => "ENOKEY",
        libc::EBADF => "EBADF",
        libc::ENOSPC => "ENOSPC",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::E2BIG => "E2BIG",
        libc::EFAULT => "EFAULT",
        _ => return format!("errno {e}"),
    };
    name.into()
}

/// `soft/hard` of one resource limit, `unlimited` for RLIM_INFINITY.
fn rlimit(resource: libc::__rlimit_resource_t) -> String {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) fills `l`.
    if unsafe { libc::getrlimit(resource, &mut l) } != 0 {
        return errno_name(last_errno());
    }
    let show = |v: libc::rlim_t| match v {
        libc::RLIM_INFINITY => "unlimited".to_string(),
        v => v.to_string(),
    };
    format!("{}/{}", show(l.rlim_cur), show(l.rlim_max))
}

/// The permission bits of a file created with mode 0666 beside `out`.
fn file_mode(out: &Path) -> String {
    let path = format!("{}.mode-{}", out.display(), std::process::id());
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(&path)
        .and_then(|f| f.metadata());
    let _ = std::fs::remove_file(&path);
    match made {
        Ok(m) => format!("{:04o}", m.mode() & 0o7777),
        Err(e) => format!("unknown: {e}"),
    }
}

/// Whether a new file can be created in `dir` (removed again).
fn can_create_in(dir: &Path) -> String {
    if !dir.is_dir() {
        return "missing".into();
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let name = dir.join(format!(".plexus-probe-{}-{nanos}", std::process::id()));
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&name);
    match made {
        Ok(_) => {
            let _ = std::fs::remove_file(&name);
            "ok".into()
        }
        Err(e) => errno_name(e.raw_os_error().unwrap_or(0)),
    }
}

/// Each namespace type in /proc/self/ns: `host`, `runner's` or `own`.
fn namespaces(config: &Value, ppid: i32) -> BTreeMap<String, String> {
    let link = |p: String| std::fs::read_link(p).ok().map(|l| l.display().to_string());
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/ns") else {
        return out;
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let mine = link(format!("/proc/self/ns/{name}"));
        let host = match config["hostNs"][&name].as_str() {
            Some(h) => Some(h.to_string()),
            None => link(format!("/proc/1/ns/{name}")),
        };
        let parent = link(format!("/proc/{ppid}/ns/{name}"));
        let kind = match (mine, host) {
            (Some(m), Some(h)) if m == h => "host",
            (Some(m), _) if parent.as_ref() == Some(&m) => "runner's",
            (Some(_), _) => "own",
            (None, _) => "unknown",
        };
        out.insert(name, kind.to_string());
    }
    out
}

/// What descriptors 0-2 are, and the open descriptors beyond them with
/// what they point to (`pipe`, `socket`, a path...), or `none`.
fn descriptors() -> (String, String) {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // The directory's own descriptor is closed by now: keep those still open.
    let mut open: Vec<i32> = fds
        .into_iter()
        // SAFETY: F_GETFD only asks whether the descriptor is open.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1)
        .collect();
    open.sort();
    let what = |fd: i32| {
        let target = std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".into());
        // pipe:[1234] and socket:[1234]: the kind, not the inode.
        let kind = match target.split_once(":[") {
            Some((kind, _)) => kind.to_string(),
            None => target,
        };
        format!("{fd}:{kind}")
    };
    let stdio: Vec<String> = open
        .iter()
        .filter(|&&fd| fd <= 2)
        .map(|&fd| what(fd))
        .collect();
    let rest: Vec<String> = open
        .iter()
        .filter(|&&fd| fd > 2)
        .map(|&fd| what(fd))
        .collect();
    let rest = if rest.is_empty() {
        "none".to_string()
    } else {
        rest.join(" ")
    };
    (stdio.join(" "), rest)
}
