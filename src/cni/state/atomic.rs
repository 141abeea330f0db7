//! Atomic writes and careful reads of the state's files: a temporary
//! file renamed over its target (synced when asked), reads that never
//! follow a symbolic link nor wait on a FIFO, and moving a damaged file
//! aside as it is.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{io_error, Error};
use crate::names::is_valid_name;

/// Creates `dir` and its parents (mode 0700 for the ones made here).
pub(super) fn create_private_dir(dir: &Path) -> Result<(), Error> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_error(dir, "cannot create the directory"))
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir, "cannot sync the directory"))
}

/// Writes `body` to `tmp` (replacing a leftover of the same name, never
/// following a symbolic link) and renames it over `path`.
pub(super) fn write_atomically(
    tmp: &Path,
    path: &Path,
    body: &[u8],
    sync: bool,
) -> Result<(), Error> {
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)?;
        f.write_all(body)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(tmp);
        return Err(io_error(tmp, "cannot write the temporary file")(e));
    }
    if let Err(e) = fs::rename(tmp, path) {
        let _ = fs::remove_file(tmp);
        return Err(io_error(path, "cannot rename into place")(e));
    }
    Ok(())
}

/// Temporary files in `dir` named `.<id>.<n>.<n>.tmp`, as (id, path).
pub(super) fn temp_files_in(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(inner) = name
            .to_str()
            .and_then(|n| n.strip_prefix('.'))
            .and_then(|n| n.strip_suffix(".tmp"))
        else {
            continue;
        };
        let mut parts = inner.rsplitn(3, '.');
        let (Some(seq), Some(pid), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if numeric(seq) && numeric(pid) && is_valid_name(id) {
            out.push((id.to_string(), e.path()));
        }
    }
    out
}

/// Why [`read_regular`] gave no bytes.
#[derive(Debug)]
pub enum Unreadable {
    /// Not a file to read: a symbolic link (never followed), a directory
    /// or another special file, or larger than allowed. Left as it is.
    Damaged(String),
    /// Reading failed: worth a retry.
    Io(&'static str, io::Error),
}

/// The bytes of regular file `path`, at most `max` of them; `None` when
/// there is no such file. A symbolic link is never followed and a FIFO
/// never waited on. Blocking.
pub fn read_regular(path: &Path, max: u64) -> Result<Option<Vec<u8>>, Unreadable> {
    let damaged = |why: &str| Unreadable::Damaged(why.to_string());
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Unreadable::Io("cannot look it up", e)),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(damaged("it is a symbolic link"));
    }
    if kind.is_dir() {
        return Err(damaged("it is a directory"));
    }
    if !kind.is_file() {
        return Err(damaged("it is not a regular file"));
    }
    // O_NOFOLLOW and O_NONBLOCK: whatever replaced the file since the
    // lstat is neither followed nor waited on (a FIFO).
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(damaged("it is a symbolic link"))
        }
        Err(e) => return Err(Unreadable::Io("cannot open it", e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| Unreadable::Io("cannot stat it", e))?;
    if !meta.is_file() {
        return Err(damaged("it is not a regular file"));
    }
    if meta.len() > max {
        return Err(damaged(&format!("it is larger than {max} bytes")));
    }
    let mut text = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut text)
        .map_err(|e| Unreadable::Io("cannot read it", e))?;
    if text.len() as u64 > max {
        return Err(damaged(&format!("it is larger than {max} bytes")));
    }
    Ok(Some(text))
}

/// Moves `from` as it is (a symbolic link or a directory is moved itself,
/// never followed) into `dir` (created 0700), named `<unix time><suffix>`
/// (`<unix time>.<n><suffix>` when taken), and returns the new path.
pub fn move_aside(from: &Path, dir: &Path, suffix: &str) -> Result<PathBuf, Error> {
    create_private_dir(dir)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for n in 0..1000 {
        let name = if n == 0 {
            format!("{now}{suffix}")
        } else {
            format!("{now}.{n}{suffix}")
        };
        let to = dir.join(name);
        if fs::symlink_metadata(&to).is_ok() {
            continue;
        }
        fs::rename(from, &to).map_err(io_error(from, "cannot move the damaged file aside"))?;
        return Ok(to);
    }
    Err(io_error(dir, "cannot move the damaged file aside")(
        io::Error::other("too many damaged files this second"),
    ))
}
