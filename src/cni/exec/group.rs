//! Plugin process groups: identified against pid reuse, noted in a
//! [`Journal`] before a plugin reads its configuration, and killed by a
//! later daemon when a crashed one left them ([`kill_stale_group`]).

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use super::process::pidfd_open;

/// A plugin's process group, identified against pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// The plugin's pid, which is also its process group id.
    pub pgid: i32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot) of the leader.
    pub start_time: u64,
}

/// Where the runner notes each plugin's process group before the plugin is
/// given its stdin, so that a later daemon can kill what a crashed one left.
pub trait Journal: Send + Sync + std::fmt::Debug + 'static {
    /// Blocking (runs on the blocking pool). Called right after the spawn and
    /// before a single byte of stdin is written. An error fails the call: the
    /// plugin is killed and reaped without having read its config.
    fn started(&self, container_id: &str, group: Group) -> io::Result<()>;
    /// Called once the group has been killed and the plugin reaped (also
    /// when the call's future is dropped half-way, then on the blocking
    /// pool). Must not block: it runs on the async runtime, so a journal
    /// that needs I/O to close the entry defers it (the [`Markers`] of the
    /// engine empty the entry in their next trip to the file).
    ///
    /// [`Markers`]: crate::cni::state::Markers
    fn finished(&self, container_id: &str, group: Group);
}

/// The start time of `pid` (field 22 of `/proc/<pid>/stat`), if it exists.
pub fn start_time(pid: i32) -> Option<u64> {
    read_stat(pid).map(|s| s.start_time)
}

/// CLOCK_BOOTTIME in nanoseconds: the clock a process's start time is taken
/// from. Read just before and just after a spawn, it brackets the child's
/// start (see [`SpawnClock`]).
fn boottime_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// The boot clock read around a spawn, to know the child's start time
/// without reading `/proc/<pid>/stat`. That read waits while the child is
/// still in its exec (the kernel takes the child's exec lock to format the
/// line), so the spawning thread would sleep once more per plugin.
///
/// The kernel stamps a new process with the boot clock as it creates it
/// (`start_boottime`, between the two readings here) and shows it in
/// field 22 as whole clock ticks (`nsec_to_clock_t`: the nanoseconds
/// divided by 10^9 / `USER_HZ`, rounded down). When both readings fall in
/// the same tick, so does the start, and that tick is its start time
/// exactly; when a tick boundary lies between them, only /proc can say.
#[derive(Debug, Clone, Copy)]
pub struct SpawnClock {
    before: Option<u64>,
    after: Option<u64>,
}

impl SpawnClock {
    /// Read right before the spawn.
    pub fn start() -> Self {
        Self {
            before: boottime_ns(),
            after: None,
        }
    }

    /// Read right after the spawn returned.
    pub fn stop(self) -> Self {
        Self {
            after: boottime_ns(),
            ..self
        }
    }

    /// The start time (in clock ticks) of a process created between the
    /// two readings, when both are in one tick.
    pub fn start_ticks(self) -> Option<u64> {
        same_tick(self.before?, self.after?, clock_tick_ns()?)
    }

    /// The start time of `pid`, created between the two readings: the
    /// clock's when it knows it and this kernel has been seen to agree,
    /// else field 22 of `/proc/<pid>/stat`. The first spawn the clock knows
    /// is checked against /proc once per process; a kernel that disagrees
    /// (one that stamped processes with another clock) is read in /proc
    /// from then on.
    pub fn start_time_of(self, pid: i32) -> Option<u64> {
        static AGREES: AtomicU8 = AtomicU8::new(UNCHECKED);
        pick_start_time(&AGREES, self.start_ticks(), || start_time(pid))
    }
}

const UNCHECKED: u8 = 0;
const AGREES: u8 = 1;
const DISAGREES: u8 = 2;

/// [`SpawnClock::start_time_of`]'s choice, with what is known of this
/// kernel in `agrees`.
fn pick_start_time(
    agrees: &AtomicU8,
    from_clock: Option<u64>,
    from_proc: impl FnOnce() -> Option<u64>,
) -> Option<u64> {
    match (agrees.load(Ordering::Relaxed), from_clock) {
        (AGREES, Some(ticks)) => Some(ticks),
        (UNCHECKED, Some(ticks)) => {
            let read = from_proc()?;
            let seen = if read == ticks { AGREES } else { DISAGREES };
            agrees.store(seen, Ordering::Relaxed);
            Some(read)
        }
        _ => from_proc(),
    }
}

/// Nanoseconds per clock tick of `/proc/<pid>/stat`, when a whole number.
fn clock_tick_ns() -> Option<u64> {
    // SAFETY: sysconf(3) reads a constant of the system; no memory is involved.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    (hz > 0 && 1_000_000_000 % hz == 0).then(|| 1_000_000_000 / hz)
}

/// The tick holding both `before` and `after` (ns), if they share one.
fn same_tick(before: u64, after: u64, tick_ns: u64) -> Option<u64> {
    let (first, last) = (before / tick_ns, after / tick_ns);
    (before <= after && first == last).then_some(first)
}

/// What the runner needs of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    zombie: bool,
    pgrp: i32,
    start_time: u64,
}

fn read_stat(pid: i32) -> Option<Stat> {
    if pid <= 0 {
        return None;
    }
    parse_stat(&read_proc_file(&format!("/proc/{pid}/stat"))?)
}

/// A small /proc file in as few reads as it takes: one for a stat line.
/// (`read_to_string` stats the file for a size, which /proc does not give,
/// then reads in growing steps from 32 bytes: seven calls for one line,
/// on every plugin start.)
fn read_proc_file(path: &str) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = Vec::with_capacity(1024);
    loop {
        if buf.len() == buf.capacity() {
            // A stat line is a few hundred bytes; this bounds a strange one.
            if buf.len() >= 64 << 10 {
                return None;
            }
            buf.reserve(buf.len());
        }
        let start = buf.len();
        let room = buf.capacity() - start;
        buf.resize(start + room, 0);
        match file.read(&mut buf[start..]) {
            Ok(0) => {
                buf.truncate(start);
                break;
            }
            Ok(n) => buf.truncate(start + n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => buf.truncate(start),
            Err(_) => return None,
        }
    }
    String::from_utf8(buf).ok()
}

/// Parses a stat line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is index 0 here, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        // X (dead) is on its way out like a zombie.
        zombie: matches!(*fields.first()?, "Z" | "X"),
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Live (non-zombie) members of `group`: processes in process group
/// `group.pgid` that started no earlier than its leader.
fn live_members(group: Group) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            read_stat(pid).is_some_and(|s| {
                !s.zombie && s.pgrp == group.pgid && s.start_time >= group.start_time
            })
        })
        .collect()
}

/// Kills a group recorded by an earlier daemon: SIGKILL to the group if its
/// leader is still the recorded process (same start time), or, when the
/// leader is gone, to members of that group (pgrp == pgid in /proc/*/stat)
/// that started no earlier than the leader; then waits, up to `wait`, until
/// no live (non-zombie) member remains. Blocking. Ok(true) when something was
/// killed, Ok(false) when nothing of the group was left, Err when members
/// survived `wait`.
///
/// A pid that names a live process with another start time was reused: the
/// kernel frees a pid only once no process has it as its group id either,
/// so the recorded group is gone and nothing is killed. A pgid below 2 is
/// refused (InvalidInput): no plugin has it, and kill(-1) would signal every
/// process.
///
/// Before any signal, the group is let finish on its own while its leader
/// is younger than `deadline` (the `pluginTimeout` the earlier daemon ran
/// it with), for [`LET_FINISH`] at most: a plugin killed mid-way can leave
/// what no DEL finds, such as host-local's reservation file created and
/// not yet written (its `Reserve` creates the file, then writes the
/// container id in it), and a plugin's call ends within milliseconds.
pub fn kill_stale_group(group: Group, deadline: Duration, wait: Duration) -> io::Result<bool> {
    if group.pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a plugin's process group id", group.pgid),
        ));
    }
    if let Some(age) = age_of(group) {
        let until = std::time::Instant::now() + deadline.saturating_sub(age).min(LET_FINISH);
        while std::time::Instant::now() < until && !live_members(group).is_empty() {
            // A plugin ends within milliseconds, a hung one at the
            // deadline: this bounds how often /proc is scanned meanwhile.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let leader_is_ours = match read_stat(group.pgid) {
        Some(s) if s.start_time == group.start_time => true,
        Some(_) => return Ok(false),
        None => false,
    };
    let deadline = std::time::Instant::now() + wait;
    let mut killed = false;
    loop {
        let members = live_members(group);
        if members.is_empty() {
            return Ok(killed);
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "process group {} (leader start time {}): {members:?} still alive {} after SIGKILL",
                    group.pgid,
                    group.start_time,
                    crate::duration::format(wait)
                ),
            ));
        }
        if leader_is_ours {
            // One signal to the group also gets children forked meanwhile.
            // SAFETY: kill(2) with a negative pid signals a process group;
            // no memory is involved.
            unsafe { libc::kill(-group.pgid, libc::SIGKILL) };
        } else {
            for pid in members {
                kill_member(pid, group);
            }
        }
        killed = true;
        // Killed processes go away within milliseconds; this bounds how
        // often /proc is scanned meanwhile.
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The longest a stale group is let finish before it is killed: start-up
/// (which clears every stale group before serving) waits no longer.
pub const LET_FINISH: Duration = Duration::from_secs(5);

/// How long ago the group's leader started (its start time against the
/// boot clock), when its leader still runs as recorded.
fn age_of(group: Group) -> Option<Duration> {
    let stat = read_stat(group.pgid)?;
    if stat.start_time != group.start_time {
        return None;
    }
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // SAFETY: sysconf(3) reads a constant of the system; no memory is involved.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return None;
    }
    let started = group.start_time as f64 / ticks as f64;
    Some(Duration::from_secs_f64((uptime - started).max(0.0)))
}

/// SIGKILL to `pid` through a pidfd, after checking (on that pidfd's
/// process) that it still belongs to `group`, so a pid reused between the
/// scan and the kill is never hit.
fn kill_member(pid: i32, group: Group) {
    let Some(fd) = u32::try_from(pid).ok().and_then(pidfd_open) else {
        return;
    };
    let ours =
        read_stat(pid).is_some_and(|s| s.pgrp == group.pgid && s.start_time >= group.start_time);
    if ours {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal(2) on a pidfd we own, with no siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;

    #[test]
    fn a_proc_file_should_read_whole_as_read_to_string_does() {
        let me = std::process::id();
        // The environment does not change while the test runs.
        let path = format!("/proc/{me}/environ");
        assert_eq!(
            read_proc_file(&path).unwrap(),
            std::fs::read_to_string(&path).unwrap()
        );
        // The stat line fits the first read; the maps take the growing
        // path (several KiB) and end with their last line.
        let stat = read_proc_file(&format!("/proc/{me}/stat")).unwrap();
        assert!(
            stat.starts_with(&format!("{me} (")) && stat.ends_with('\n'),
            "{stat}"
        );
        let maps = read_proc_file(&format!("/proc/{me}/maps")).unwrap();
        assert!(
            maps.len() > 1024 && maps.ends_with('\n'),
            "{} bytes",
            maps.len()
        );
        let stat = read_stat(me as i32).unwrap();
        assert!(!stat.zombie);
        assert!(stat.start_time > 0);
        assert_eq!(read_proc_file("/proc/self/no-such-file"), None);
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;

    #[test]
    fn a_start_time_should_be_known_only_within_one_tick() {
        let tick = 10_000_000;
        assert_eq!(same_tick(30_000_000, 39_999_999, tick), Some(3));
        assert_eq!(same_tick(35_000_000, 35_000_000, tick), Some(3));
        // A boundary between the readings: the start may be either side.
        assert_eq!(same_tick(39_999_999, 40_000_000, tick), None);
        assert_eq!(same_tick(35_000_000, 45_000_000, tick), None);
        // A clock that went back says nothing.
        assert_eq!(same_tick(36_000_000, 35_000_000, tick), None);
        let unread = SpawnClock {
            before: None,
            after: boottime_ns(),
        };
        assert_eq!(unread.start_ticks(), None);
    }

    #[test]
    fn the_clock_should_be_trusted_only_once_proc_has_agreed() {
        let agrees = AtomicU8::new(UNCHECKED);
        // Unchecked: /proc is read, and it agrees.
        assert_eq!(pick_start_time(&agrees, Some(7), || Some(7)), Some(7));
        assert_eq!(agrees.load(Ordering::Relaxed), AGREES);
        // From then on /proc is not read when the clock knows...
        let unread = || -> Option<u64> { panic!("/proc read though the clock agreed") };
        assert_eq!(pick_start_time(&agrees, Some(9), unread), Some(9));
        // ... and read when it does not.
        assert_eq!(pick_start_time(&agrees, None, || Some(11)), Some(11));

        let disagrees = AtomicU8::new(UNCHECKED);
        // /proc wins, and the clock is not used again.
        assert_eq!(pick_start_time(&disagrees, Some(7), || Some(8)), Some(8));
        assert_eq!(pick_start_time(&disagrees, Some(9), || Some(10)), Some(10));
        assert_eq!(disagrees.load(Ordering::Relaxed), DISAGREES);
        // A process already gone from /proc: nothing is learnt.
        let unchecked = AtomicU8::new(UNCHECKED);
        assert_eq!(pick_start_time(&unchecked, Some(7), || None), None);
        assert_eq!(unchecked.load(Ordering::Relaxed), UNCHECKED);
    }

    /// The spawn clock's start time is the one /proc shows, which a later
    /// daemon compares with the recorded one before it kills a group.
    #[test]
    fn a_spawn_clocks_start_time_should_be_the_one_in_proc() {
        let mut known = 0;
        for _ in 0..200 {
            let clock = SpawnClock::start();
            let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
            let clock = clock.stop();
            // Not reaped yet: its stat line stays.
            let in_proc = start_time(child.id() as i32).unwrap();
            if let Some(ticks) = clock.start_ticks() {
                assert_eq!(ticks, in_proc, "pid {}", child.id());
                known += 1;
            }
            child.wait().unwrap();
        }
        // A spawn takes a fraction of a tick (10 ms): most fall in one.
        assert!(known >= 100, "only {known} of 200 spawns within one tick");
    }
}
