//! A process's TCP sockets as the kernel lists them
//! (`/proc/<pid>/net/tcp` and `tcp6`), to count what a daemon really
//! holds rather than how many descriptors it has.

use std::collections::BTreeSet;
use std::fs;

/// Which end of a connection a port is matched against.
#[derive(Clone, Copy)]
pub enum End {
    /// The socket's own port (a connection accepted on a listener).
    Local,
    /// The peer's port (a connection made to a server).
    Remote,
}

/// Inodes of the TCP sockets, listeners left out, of `pid`'s network
/// namespace whose `end` has port `port` (columns: local address 2,
/// remote address 3, state 4 with `0A` for LISTEN, inode 10).
pub fn socket_inodes(pid: i32, end: End, port: u16) -> BTreeSet<String> {
    let column = match end {
        End::Local => 1,
        End::Remote => 2,
    };
    let hex = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|f| fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let cols: Vec<&str> = line.split_whitespace().collect();
                    let matches = cols.get(column)?.ends_with(&hex) && *cols.get(3)? != "0A";
                    matches.then(|| cols.get(9).map(|s| s.to_string()))?
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// How many of `pid`'s descriptors are sockets with one of `inodes`.
pub fn descriptors_among(pid: i32, inodes: &BTreeSet<String>) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| {
            target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|r| r.strip_suffix(']'))
                .is_some_and(|inode| inodes.contains(inode))
        })
        .count()
}
