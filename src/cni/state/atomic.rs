//! Atomic writes and careful reads of the state's files: a spare file
//! written and renamed over its target (synced when asked), reads that never
//! follow a symbolic link nor wait on a FIFO, and moving a damaged file
//! aside as it is.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::spare::{rename2, unsupported, Spares};
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

/// Writes `body` to `path` atomically: into a spare file of `spares`
/// (a new one when the pool is empty), which then takes the place of the
/// record by rename. When `path` is a regular file, the two are exchanged
/// (`RENAME_EXCHANGE`), and the replaced file goes back to the pool under
/// the spare's name: no inode is allocated or freed.
///
/// A `sync` write is written over the spare's blocks, cut to its length
/// and fsynced before the exchange. Any other write takes the spare empty
/// (the pool's thread emptied it, see [`Spares::emptied`]; else it is cut
/// to nothing here) and, once written, starts its writeback before the exchange
/// (as ext4's `auto_da_alloc` does for a rename over a file): its blocks
/// are new, so a journaling file system commits them before the rename,
/// and after a power loss the name holds the old record or the new one,
/// never a spare's earlier content.
pub(super) fn write_atomically(
    spares: &Spares,
    path: &Path,
    body: &[u8],
    sync: bool,
) -> Result<(), Error> {
    let (spare, file) = open_spare(spares)?;
    let write = || -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        if sync {
            room_for(&file, body.len())?;
            file.write_all_at(body, 0)?;
            file.set_len(body.len() as u64)?;
            file.sync_all()
        } else {
            // Emptied already, unless the pool's thread is behind.
            if file.metadata()?.len() > 0 {
                file.set_len(0)?;
            }
            file.write_all_at(body, 0)?;
            start_writeback(&file);
            Ok(())
        }
    };
    if let Err(e) = write() {
        spares.put(spare);
        return Err(io_error(path, "cannot write the temporary file")(e));
    }
    drop(file);
    install(spares, spare, path).map_err(io_error(path, "cannot rename into place"))
}

/// Renames `spare` to `path`: exchanged with a regular file there (the old
/// one goes back to the pool), else a rename that replaces nothing, else
/// (a symbolic link, a special file: never kept) a plain rename over it.
fn install(spares: &Spares, spare: PathBuf, path: &Path) -> io::Result<()> {
    let flags = match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => libc::RENAME_EXCHANGE,
        Ok(_) => 0,
        Err(e) if e.kind() == io::ErrorKind::NotFound => libc::RENAME_NOREPLACE,
        Err(e) => {
            spares.put(spare);
            return Err(e);
        }
    };
    let r = match rename2(&spare, path, flags) {
        Ok(()) if flags == libc::RENAME_EXCHANGE => {
            spares.put(spare);
            return Ok(());
        }
        Err(e) if flags != 0 && unsupported(&e) => fs::rename(&spare, path),
        // Made meanwhile, or gone meanwhile: only a file the lock's holder
        // does not know of; a plain rename, as before there were spares.
        Err(e)
            if flags != 0
                && e.raw_os_error()
                    .is_some_and(|c| c == libc::EEXIST || c == libc::ENOENT) =>
        {
            fs::rename(&spare, path)
        }
        r => r,
    };
    if r.is_err() {
        spares.put(spare);
    }
    r
}

/// A spare of `spares` opened for writing, or a new one: never through a
/// symbolic link, never waiting on a FIFO, only a regular file. A spare
/// that vanished or is anything else is forgotten and left as it is.
fn open_spare(spares: &Spares) -> Result<(PathBuf, File), Error> {
    while let Some(spare) = spares.take() {
        let opened = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&spare);
        if let Ok(f) = opened {
            if f.metadata().is_ok_and(|m| m.is_file()) {
                return Ok((spare, f));
            }
        }
    }
    let spare = spares.fresh_name();
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&spare)
        .map_err(io_error(&spare, "cannot create the temporary file"))?;
    Ok((spare, f))
}

/// ENOSPC unless the file system of `file` has room for `len` new bytes:
/// a synced write (an ADD's, before its plugins read their configuration)
/// fails on a full disk as it did when it made a new file, even when the
/// spare's own blocks could hold it, so that no plugin runs on a full
/// state directory.
fn room_for(file: &File, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs(3) fills the struct we own, on a descriptor `file`
    // owns.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return Ok(());
    }
    let free = u128::from(st.f_bfree) * u128::from(st.f_frsize);
    if st.f_blocks > 0 && free < len.max(1) as u128 {
        return Err(io::Error::from_raw_os_error(libc::ENOSPC));
    }
    Ok(())
}

/// Starts writing `file`'s dirty pages out without waiting for them
/// (sync_file_range(2), SYNC_FILE_RANGE_WRITE): the file system allocates
/// their blocks now. Best effort: without it the write is still atomic.
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a descriptor `file` owns.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Temporary files in `dir` named `.<id>.<n>.<n>.tmp`, as (id, path):
/// what an earlier plexusd, which wrote records through them, left.
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

/// Reads of a file that another writer kept replacing, at most.
const READ_TRIES: usize = 8;

/// The bytes of regular file `path`, at most `max` of them; `None` when
/// there is no such file. A symbolic link is never followed and a FIFO
/// never waited on. Blocking.
///
/// What is read is what `path` named while it was read: a file replaced
/// meanwhile (renamed away, then reused as a spare and emptied or written
/// over: see [`Spares`]) is read again under its new name. A reader that
/// does not hold the container's lock (GC, `plexusd show`) therefore never
/// takes a spare's content for a damaged record.
pub fn read_regular(path: &Path, max: u64) -> Result<Option<Vec<u8>>, Unreadable> {
    let mut tries = 0;
    loop {
        tries += 1;
        match read_once(path, max)? {
            ReadOnce::Missing => return Ok(None),
            ReadOnce::Stable(text) => return Ok(Some(text)),
            ReadOnce::Replaced if tries >= READ_TRIES => {
                return Err(Unreadable::Io(
                    "cannot read it",
                    io::Error::other(format!("it was replaced {tries} times while it was read")),
                ))
            }
            ReadOnce::Replaced => {}
        }
    }
}

/// One read of [`read_regular`].
enum ReadOnce {
    Missing,
    /// `path` still names the file read, unchanged since it was opened.
    Stable(Vec<u8>),
    /// The file was replaced or changed while it was read: what was read
    /// means nothing.
    Replaced,
}

/// Whether `before` (the opened file) and `after` (what `path` names
/// once it was read) are the same file, unchanged: a rename or a write
/// moves its ctime.
fn unchanged(before: &fs::Metadata, after: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    before.dev() == after.dev()
        && before.ino() == after.ino()
        && before.size() == after.size()
        && before.ctime() == after.ctime()
        && before.ctime_nsec() == after.ctime_nsec()
}

fn read_once(path: &Path, max: u64) -> Result<ReadOnce, Unreadable> {
    let damaged = |why: &str| Unreadable::Damaged(why.to_string());
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ReadOnce::Missing),
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
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ReadOnce::Missing),
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
    let now = fs::symlink_metadata(path);
    if !now.is_ok_and(|now| unchanged(&meta, &now)) {
        return Ok(ReadOnce::Replaced);
    }
    if text.len() as u64 > max {
        return Err(damaged(&format!("it is larger than {max} bytes")));
    }
    Ok(ReadOnce::Stable(text))
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
