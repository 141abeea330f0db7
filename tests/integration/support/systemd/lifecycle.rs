//! The manager's own life: spawning it in its mount namespace and
//! cgroup, waiting until it runs, and tearing it down with every trace
//! (the unit files it starts from, the console it writes to).

use super::*;

impl Manager {
    pub(super) fn spawn_manager(&mut self) {
        let c = |s: &str| CString::new(s).unwrap();
        let cpath = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
        let procs: Vec<CString> = self
            .cgroups
            .iter()
            .map(|d| cpath(&d.join("cgroup.procs")))
            .collect();
        let runtime = cpath(&self.work.join("run"));
        let pts = self.console.as_ref().map(|con| cpath(&con.pts));
        let (source, tmpfs) = (c(MOUNT_SOURCE), c("tmpfs"));
        let (run_systemd, marker) = (c("/run/systemd"), c(MARKER));
        let (run_opts, rt_opts) = (c("mode=0755,size=64m"), c("mode=0700,size=64m"));
        let (root, console, run) = (c("/"), c("/dev/console"), c("/run"));
        let inaccessible = c("/run/systemd/inaccessible");
        let nodes: Vec<(CString, libc::mode_t)> = [
            ("reg", libc::S_IFREG),
            ("dir", libc::S_IFDIR),
            ("fifo", libc::S_IFIFO),
            ("sock", libc::S_IFSOCK),
            ("chr", libc::S_IFCHR),
            ("blk", libc::S_IFBLK),
        ]
        .iter()
        .map(|(n, m)| (c(&format!("/run/systemd/inaccessible/{n}")), *m))
        .collect();

        let level = std::env::var("PLEXUS_SYSTEMD_LOG_LEVEL").unwrap_or_else(|_| "info".into());
        let target = if pts.is_some() { "console" } else { "null" };
        let out = File::create(self.work.join("manager.out")).unwrap();
        let mut cmd = Command::new(SYSTEMD_BIN);
        cmd.arg("--user")
            .arg(format!("--log-target={target}"))
            .arg(format!("--log-level={level}"))
            .arg("--log-color=no")
            .env_clear()
            .envs(self.client_env())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        // SAFETY: the closure runs between fork and exec and only makes raw
        // system calls on memory prepared above (no allocation, no locks).
        unsafe {
            cmd.pre_exec(move || {
                let err = io::Error::last_os_error;
                let null = std::ptr::null::<libc::c_char>();
                if libc::setsid() < 0 {
                    return Err(err());
                }
                // The test thread owns the manager: if it dies, so does this.
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGTERM as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                for p in &procs {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(err());
                    }
                    // "0" = the writing process, in cgroup v1 and v2.
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let e = err();
                    libc::close(fd);
                    if n != 1 {
                        return Err(e);
                    }
                }
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return Err(err());
                }
                let private = libc::MS_REC | libc::MS_PRIVATE;
                if libc::mount(null, root.as_ptr(), null, private, std::ptr::null()) != 0 {
                    return Err(err());
                }
                // On real hosts /run is a mount point (a tmpfs). Here it may be
                // a plain directory, and then MountAPIVFS= (implied by
                // ProtectControlGroups=) hides it under an empty tmpfs. A bind
                // mount onto itself keeps the host's /run contents visible.
                let bind = libc::MS_BIND | libc::MS_REC;
                if libc::mount(run.as_ptr(), run.as_ptr(), null, bind, std::ptr::null()) != 0 {
                    return Err(err());
                }
                let flags = libc::MS_NOSUID | libc::MS_NODEV;
                let tmp = |target: &CString, opts: &CString| {
                    libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        tmpfs.as_ptr(),
                        flags,
                        opts.as_ptr().cast(),
                    )
                };
                if tmp(&run_systemd, &run_opts) != 0 {
                    return Err(err());
                }
                if libc::mkdir(marker.as_ptr(), 0o755) != 0 {
                    return Err(err());
                }
                // What PID 1 creates at boot: the nodes that sandboxing options
                // (ProtectKernelLogs=, InaccessiblePaths=, ...) bind-mount over
                // hidden paths.
                if libc::mkdir(inaccessible.as_ptr(), 0o755) != 0 {
                    return Err(err());
                }
                for (path, mode) in &nodes {
                    let r = if *mode == libc::S_IFDIR {
                        libc::mkdir(path.as_ptr(), 0)
                    } else {
                        libc::mknod(path.as_ptr(), *mode, libc::makedev(0, 0))
                    };
                    if r != 0 {
                        return Err(err());
                    }
                }
                if tmp(&runtime, &rt_opts) != 0 {
                    return Err(err());
                }
                if let Some(pts) = &pts {
                    let bind = libc::MS_BIND;
                    if libc::mount(pts.as_ptr(), console.as_ptr(), null, bind, std::ptr::null())
                        != 0
                    {
                        return Err(err());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "starting {SYSTEMD_BIN} (cgroup move, namespace or mounts failed): {e}\n{}",
                self.describe_failure()
            )
        });
        self.pid = child.id();
        self.child = Some(child);
        self.mnt_ns = fs::read_link(format!("/proc/{}/ns/mnt", self.pid))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let own = fs::read_link("/proc/self/ns/mnt").map(|p| p.display().to_string());
        assert!(
            !self.mnt_ns.is_empty() && Ok(&self.mnt_ns) != own.as_ref().map_err(|_| ()),
            "the manager did not get its own mount namespace ({})",
            self.mnt_ns
        );
    }

    pub(super) fn manager_alive(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_))) | Some(Err(_)) | None => false,
        }
    }

    pub(super) fn wait_until_running(&mut self) {
        // The private bus socket lives in the namespace-only tmpfs: look at it
        // through the manager's root.
        let private = PathBuf::from(format!("/proc/{}/root", self.pid)).join(
            self.work
                .join("run/systemd/private")
                .strip_prefix("/")
                .unwrap(),
        );
        let deadline = Instant::now() + START_TIMEOUT;
        let mut state = String::new();
        loop {
            if !self.manager_alive() {
                panic!(
                    "the manager exited during start-up\n{}",
                    self.describe_failure()
                );
            }
            let up = fs::metadata(&private)
                .map(|m| m.file_type().is_socket())
                .unwrap_or(false);
            if up {
                let out = self.systemctl(&["is-system-running"]);
                state = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if state == "running" || state == "degraded" {
                    return;
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "the manager did not reach running within {START_TIMEOUT:?} (state {state:?})\n{}",
                    self.describe_failure()
                );
            }
            thread::sleep(POLL);
        }
    }

    /// Stops the manager and removes every trace; returns what went wrong.
    pub(super) fn teardown(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.manager_alive() {
            let out = self.systemctl(&["exit"]);
            if !out.status.success() && self.manager_alive() {
                problems.push(format!(
                    "`systemctl --user exit` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                // SAFETY: kill(2) of the manager this harness started; no memory involved.
                unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
            }
            let alive = !poll_until(EXIT_TIMEOUT, || !self.manager_alive());
            if alive {
                problems.push(format!(
                    "manager {} still alive {EXIT_TIMEOUT:?} after the exit request",
                    self.pid
                ));
                // SAFETY: kill(2) of the manager this harness started; no memory involved.
                unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
                if let Some(c) = self.child.as_mut() {
                    let _ = c.wait();
                }
            }
        }
        // Anything left in our cgroups or our mount namespace is ours.
        let ours_left = || {
            let mut left = cgroup_pids(&self.cgroups);
            if !self.mnt_ns.is_empty() {
                left.extend(pids_in_mount_ns(&self.mnt_ns));
            }
            left.remove(&std::process::id());
            left
        };
        // The manager SIGKILLs what is left of its units as it exits; on a
        // loaded machine those processes may take a moment to be gone.
        // Only what outlives that is reported.
        poll_until(Duration::from_secs(3), || ours_left().is_empty());
        let mut reported = false;
        let clean = poll_until(Duration::from_secs(10), || {
            let left = ours_left();
            if left.is_empty() {
                return true;
            }
            if !reported {
                reported = true;
                problems.push(format!("processes left after the manager exited: {left:?}"));
            }
            for pid in left {
                // SAFETY: kill(2) of a process of this harness; no memory involved.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            false
        });
        if !clean {
            problems.push("could not kill the processes left behind".into());
        }
        for dir in &self.cgroups {
            if let Err(e) = remove_cgroup_tree(dir) {
                problems.push(format!("could not remove cgroup {}: {e}", dir.display()));
            }
        }
        if let Some(console) = self.console.take() {
            console.close();
        }
        // Host checks.
        if !self.host_had_marker && Path::new(MARKER).exists() {
            problems.push(format!("{MARKER} exists on the host"));
        }
        if self.created_run_systemd {
            let _ = fs::remove_dir("/run/systemd");
        }
        let work = self.work.display().to_string();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for line in mountinfo.lines() {
            if line.contains(&work)
                || line
                    .split(" - ")
                    .nth(1)
                    .is_some_and(|r| r.contains(MOUNT_SOURCE))
            {
                problems.push(format!("harness mount visible on the host: {line}"));
            }
        }
        for (pid, (start, cg_after)) in foreign_cgroups(&self.name) {
            if let Some((start_before, cg_before)) = self.foreign_before.get(&pid) {
                if *start_before == start && *cg_before != cg_after && looks_systemd_made(&cg_after)
                {
                    problems.push(format!(
                        "foreign process {pid} moved between cgroups: {cg_before:?} -> {cg_after:?}"
                    ));
                }
            }
        }
        problems
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let failed = thread::panicking();
        if failed {
            eprintln!(
                "systemd harness: test failed; manager {} work dir {}\n{}",
                self.pid,
                self.work.display(),
                self.describe_failure()
            );
        }
        let problems = self.teardown();
        let keep = std::env::var("PLEXUS_SYSTEMD_KEEP").as_deref() == Ok("1");
        if keep {
            let _ = fs::write(self.work.join("KEEP"), "");
            eprintln!("systemd harness: work dir kept: {}", self.work.display());
        } else {
            let dirs = std::iter::once(self.work.as_path())
                .chain(self.root_fs_dir.get().map(PathBuf::as_path));
            for dir in dirs {
                if let Err(e) = fs::remove_dir_all(dir) {
                    eprintln!("systemd harness: could not remove {}: {e}", dir.display());
                }
            }
        }
        // Only managers (serialised by the lock we still hold) use the bases.
        let _ = fs::remove_dir(WORK_BASE);
        let _ = fs::remove_dir(ROOT_FS_BASE);
        if !problems.is_empty() {
            let msg = format!(
                "systemd harness teardown problems:\n  {}",
                problems.join("\n  ")
            );
            if failed {
                eprintln!("{msg}");
            } else {
                panic!("{msg}");
            }
        }
    }
}

pub(super) fn write_minimal_units(dir: &Path) {
    let units = [
        (
            "default.target",
            "[Unit]\nDescription=plexus test default target\n",
        ),
        ("basic.target", "[Unit]\nDescription=Basic System\n"),
        ("sockets.target", "[Unit]\nDescription=Sockets\n"),
        (
            "shutdown.target",
            "[Unit]\nDescription=Shutdown\nDefaultDependencies=no\nRefuseManualStart=yes\n",
        ),
        (
            "systemd-exit.service",
            "[Unit]\nDescription=Exit the manager\nDefaultDependencies=no\n\
             Requires=shutdown.target\nAfter=shutdown.target\nSuccessAction=exit-force\n\n\
             [Service]\nSlice=-.slice\n",
        ),
        (
            "exit.target",
            "[Unit]\nDescription=Exit the manager\nDefaultDependencies=no\n\
             Requires=systemd-exit.service\nAfter=systemd-exit.service\nAllowIsolate=yes\n",
        ),
    ];
    for (name, text) in units {
        fs::write(dir.join(name), text).unwrap();
    }
}

/// A pty whose slave side serves as the manager's /dev/console; a thread
/// copies everything written to it into a log file.
pub(super) struct Console {
    pts: PathBuf,
    slave: File,
    reader: JoinHandle<()>,
}

impl Console {
    pub(super) fn open(log: &Path) -> io::Result<Console> {
        let master = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open("/dev/ptmx")?;
        let mut buf = [0 as libc::c_char; 128];
        // SAFETY: grantpt, unlockpt and ptsname_r on the pty master we opened;
        // ptsname_r writes at most `buf.len()` bytes into `buf`.
        unsafe {
            if libc::grantpt(master.as_raw_fd()) != 0 || libc::unlockpt(master.as_raw_fd()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let rc = libc::ptsname_r(master.as_raw_fd(), buf.as_mut_ptr(), buf.len());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
        }
        // SAFETY: ptsname_r succeeded, so `buf` holds a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        let pts = PathBuf::from(OsStr::from_bytes(name.to_bytes()));
        // Held open until teardown: with no slave open, reads on the master
        // fail with EIO and the copier would stop too early.
        let slave = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(&pts)?;
        let mut out = File::create(log)?;
        let mut master = master;
        let reader = thread::Builder::new()
            .name("systemd-console".into())
            .spawn(move || {
                let mut buf = [0u8; 16384];
                loop {
                    match master.read(&mut buf) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let text: Vec<u8> =
                                buf[..n].iter().copied().filter(|&b| b != b'\r').collect();
                            let _ = out.write_all(&text);
                        }
                    }
                }
            })?;
        Ok(Console { pts, slave, reader })
    }

    fn close(self) {
        drop(self.slave);
        // Every other slave holder is gone by now; the read fails with EIO.
        if poll_until(Duration::from_secs(5), || self.reader.is_finished()) {
            let _ = self.reader.join();
        } else {
            eprintln!("systemd harness: console reader did not finish");
        }
    }
}
