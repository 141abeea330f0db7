//! A tmpfs of the test's own, for file-system boundaries and full disks.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a directory of the test's own, unmounted on drop.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs (mode 0700) on `dir`, created if missing; `size`
    /// (tmpfs's `size=` option, such as `64k`) bounds its space.
    pub fn mount(dir: &Path, size: Option<&str>) -> Self {
        fs::create_dir_all(dir).unwrap();
        let mut options = "mode=0700".to_string();
        if let Some(size) = size {
            options.push_str(&format!(",size={size}"));
        }
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, "plexus-test"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {out:?}");
        Tmpfs(dir.to_path_buf())
    }

    /// Fills the file system up with a file `name` until a write fails
    /// with ENOSPC; the file's path.
    pub fn fill(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        let mut f = fs::File::create(&path).unwrap();
        let block = [0xa5u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // What a single byte more would take is refused too.
        let mut probe = fs::File::create(self.0.join(format!("{name}.probe"))).unwrap();
        let err = probe.write_all(&[0u8; 4096]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}
