//! The probe directory and the files in it.
//!
//! Safety rules (docs/design.md): the directory is the exporter's own (created
//! 0700, or an existing one owned by us and writable by nobody else), every
//! file is opened relative to the directory's descriptor with `O_NOFOLLOW`
//! so a symlink planted in it can never redirect a write, files are 0600,
//! a free-space reserve is kept, and everything is removed at shutdown.
//!
//! Only files the exporter created, and can prove it created, are ever
//! written, truncated or removed: the lock file records each one as it is
//! created ([`crate::probe::lock`]). Anything else found under one of its
//! names (`lock`, `wal.probe`, `read.probe`, `sweep.probe`) is refused
//! ([`SetupError::Foreign`]) and left as it is: the directory may be one an
//! administrator made and configured, holding files that are not ours to
//! judge. An existing `lock` is opened read-only and checked before
//! anything else; it is opened for writing only when it carries the
//! exporter's header.
//!
//! A symlink found at a probe file's name is refused (`ELOOP`), not removed:
//! only root or the exporter's own user can plant one in a 0700 directory,
//! so it is a deliberate act (an administrator pointing the probe at another
//! disk, or worse) that the error metric should show until someone removes
//! it. Held files are checked against their names ([`ProbeDir::check_name`])
//! because an open descriptor keeps writing to its inode after the name was
//! unlinked or renamed over, without any error.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use thiserror::Error;

use crate::errno::{self, Set};
use crate::probe::Rng;
use crate::probe::lock::{self, Identity, Record, Seen};
use crate::types::{Shown, SyncMethod};
use crate::units::fmt_bytes;

pub(crate) const WAL_FILE: &str = "wal.probe";
pub(crate) const READ_FILE: &str = "read.probe";
/// The queue-depth sweep's write target: created for a sweep with writes,
/// removed when it ends.
pub(crate) const SWEEP_FILE: &str = "sweep.probe";
pub(crate) const LOCK_FILE: &str = "lock";
/// The probe files, in the order they are looked at.
const PROBE_FILES: [&str; 3] = [WAL_FILE, READ_FILE, SWEEP_FILE];

/// Why a volume's probe files could not be set up. The daemon retries with
/// backoff; `check` reports it and exits non-zero.
#[derive(Debug, Error)]
pub(crate) enum SetupError {
    #[error("probe directory {}: {reason}", Shown(path))]
    UnsafeDir { path: PathBuf, reason: String },
    #[error(
        "probe directory {} is in use by another pg-storage-exporter (pid {pid})",
        Shown(path)
    )]
    InUse { path: PathBuf, pid: String },
    #[error(
        "probe directory {} holds {} this exporter did not create, or cannot prove it did \
         (its lock file records each file it creates): {}; left untouched: move {} away or \
         choose another probe directory",
        Shown(dir),
        if names.len() == 1 { "a file" } else { "files" },
        names.join(", "),
        if names.len() == 1 { "it" } else { "them" }
    )]
    Foreign {
        dir: PathBuf,
        names: Vec<&'static str>,
    },
    #[error(
        "not creating {} ({}): {} free, and {} must stay free (free_space_reserve)",
        Shown(path), fmt_bytes(*needed), fmt_bytes(*available), fmt_bytes(*reserve)
    )]
    Reserve {
        path: PathBuf,
        needed: u64,
        available: u64,
        reserve: u64,
    },
    #[error(
        "{}: the filesystem refuses O_DIRECT ({}); the read probe cannot bypass the page cache here",
        Shown(path), errno::name(Set::Io, *errno)
    )]
    DirectIoUnsupported { path: PathBuf, errno: i32 },
    #[error("{what} {}: {source}", Shown(path))]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is a symlink{}; probe files are never opened through a link: remove it",
        Shown(path), target.as_ref().map(|t| format!(" to {}", Shown(t))).unwrap_or_default()
    )]
    Symlink {
        path: PathBuf,
        target: Option<PathBuf>,
    },
    #[error(
        "{} was replaced between its creation and its reopening; not probing a file this exporter did not create",
        Shown(path)
    )]
    Replaced { path: PathBuf },
    #[error("{0}")]
    Engine(#[from] crate::probe::engine::EngineUnavailable),
    #[error("shutting down")]
    Stopped,
}

impl SetupError {
    /// Bounded `error` label for `pgstorage_probe_errors_total{op="setup"}`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            SetupError::UnsafeDir { .. } => "unsafe_dir",
            SetupError::InUse { .. } => "in_use",
            SetupError::Foreign { .. } => "foreign_file",
            SetupError::Reserve { .. } => "free_space_reserve",
            SetupError::DirectIoUnsupported { .. } => "no_direct_io",
            // What O_NOFOLLOW itself answers for a link: an errno the label
            // set already has.
            SetupError::Symlink { .. } => "ELOOP",
            SetupError::Replaced { .. } => "replaced",
            SetupError::Io { source, .. } => {
                errno::name(Set::Io, source.raw_os_error().unwrap_or(0))
            }
            SetupError::Engine(_) => "io_uring_unavailable",
            SetupError::Stopped => "stopped",
        }
    }
}

/// What a probe file's name refers to now, compared with the file a probe
/// thread holds open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameCheck {
    /// The name still refers to the held file.
    Same,
    /// Nothing has the name any more: the file was deleted. The held
    /// descriptor still works, on an inode no directory lists.
    Removed,
    /// The name refers to something else (another file, a symlink, a
    /// directory): renamed over or deleted and recreated.
    Replaced,
}

impl NameCheck {
    /// Bounded `error` label for `pgstorage_probe_errors_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            NameCheck::Same => "none",
            NameCheck::Removed => "removed",
            NameCheck::Replaced => "replaced",
        }
    }
}

/// Device and inode: what makes two descriptors or names the same file.
/// Fixed for the life of a descriptor, so a probe thread takes it once per
/// held file and each name check costs one stat of the name, not two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The file an open descriptor refers to.
    pub(crate) fn of_fd(fd: impl AsFd) -> io::Result<FileId> {
        Ok(FileId::of(&fstat(fd)?))
    }

    /// The file `name` in `dir` refers to (a symlink itself, not followed).
    pub(crate) fn of_name(dir: impl AsFd, name: impl rustix::path::Arg) -> io::Result<FileId> {
        Ok(FileId::of(&rustix::fs::statat(
            dir,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
        )?))
    }

    #[allow(
        clippy::unnecessary_cast,
        reason = "the field types vary by architecture; u64 holds them all"
    )]
    fn of(st: &Stat) -> FileId {
        FileId {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }
}

fn fstat(fd: impl AsFd) -> io::Result<Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

/// lstat of `name` in `dir`: a symlink is described, never followed.
fn lstatat(dir: &OwnedFd, name: &str) -> io::Result<Stat> {
    Ok(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

fn is_symlink(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Symlink
}

fn readlinkat(dir: &OwnedFd, name: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let target = rustix::fs::readlinkat(dir, name, Vec::new()).ok()?;
    Some(PathBuf::from(std::ffi::OsString::from_vec(
        target.into_bytes(),
    )))
}

/// Looks at what has the lock file's name, before anything else is done
/// in the directory. Nothing there is opened for writing unless it is the
/// exporter's own lock (its header, owned by this user, a single link: a
/// hard link would carry a write to wherever else the file is listed), and
/// that is taken over only when no live process holds its `flock`.
fn take_lock(dir: &OwnedFd, path: &Path) -> Result<Found, SetupError> {
    let lock_path = path.join(LOCK_FILE);
    let io_err = |what, source| SetupError::Io {
        what,
        path: lock_path.clone(),
        source,
    };
    let foreign = || SetupError::Foreign {
        dir: path.to_path_buf(),
        names: present(dir),
    };
    let st = match lstatat(dir, LOCK_FILE) {
        Ok(st) => st,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Found::Nothing),
        Err(e) => return Err(io_err("stat of", e)),
    };
    if is_symlink(&st) {
        return Err(SetupError::Symlink {
            target: readlinkat(dir, LOCK_FILE),
            path: lock_path,
        });
    }
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
        || st.st_uid != rustix::process::geteuid().as_raw()
        || st.st_nlink != 1
        || st.st_size > lock::MAX_LEN as i64
    {
        return Err(foreign());
    }
    // Read-only, and non-blocking in case a FIFO took the name since the
    // stat: no write, no truncation, no wait.
    let ro = openat(
        dir,
        LOCK_FILE,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| io_err("opening", e))?;
    let same = |fd: &OwnedFd| FileId::of_fd(fd).is_ok_and(|id| id == FileId::of(&st));
    if !same(&ro) {
        return Err(foreign());
    }
    let ours = |fd: &OwnedFd| -> Result<Option<Record>, SetupError> {
        let text = read_lock(fd).map_err(|e| io_err("reading", e))?;
        Ok(Record::parse(&text, &PROBE_FILES))
    };
    if ours(&ro)?.is_none() {
        return Err(foreign());
    }
    let fd =
        openat(dir, LOCK_FILE, OFlags::RDWR, Mode::empty()).map_err(|e| io_err("opening", e))?;
    if !same(&fd) {
        return Err(foreign());
    }
    drop(ro);
    if let Err(e) = rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        if e == rustix::io::Errno::WOULDBLOCK {
            let pid = ours(&fd)?
                .and_then(|r| r.pid)
                .map_or_else(|| "unknown".to_string(), |p| p.to_string());
            return Err(SetupError::InUse {
                path: path.to_path_buf(),
                pid,
            });
        }
        return Err(io_err("locking", e.into()));
    }
    // Read again under the lock: its last holder may have rewritten it
    // until it let go.
    match ours(&fd)? {
        Some(r) => Ok(Found::Crashed(fd, r)),
        None => Err(foreign()),
    }
}

/// Creates this run's lock file (`O_EXCL`: never one that appeared since
/// [`take_lock`] looked) and locks it at once; its record is written next.
/// None when a file took the name in between.
fn create_lock(dir: &OwnedFd, path: &Path) -> Result<Option<OwnedFd>, SetupError> {
    let io_err = |what, source| SetupError::Io {
        what,
        path: path.join(LOCK_FILE),
        source,
    };
    let fd = match openat(
        dir,
        LOCK_FILE,
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
        PRIVATE,
    ) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Ok(None),
        Err(e) => return Err(io_err("creating", e)),
    };
    if let Err(e) = rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        // Ours, empty and held by someone else: not left behind.
        if FileId::of_fd(&fd).is_ok_and(|id| FileId::of_name(dir, LOCK_FILE).is_ok_and(|n| n == id))
        {
            let _ = unlinkat(dir, LOCK_FILE);
        }
        return Err(io_err("locking", e.into()));
    }
    Ok(Some(fd))
}

/// Which of the exporter's names are taken in `dir`.
fn present(dir: &OwnedFd) -> Vec<&'static str> {
    [LOCK_FILE, WAL_FILE, READ_FILE, SWEEP_FILE]
        .into_iter()
        .filter(|n| !matches!(lstatat(dir, n), Err(e) if e.raw_os_error() == Some(libc::ENOENT)))
        .collect()
}

/// An open, locked probe directory.
#[derive(Debug)]
pub(crate) struct ProbeDir {
    path: PathBuf,
    /// The directory the probe directory is in (`O_PATH`) and its name
    /// there: removing the probe directory through them reaches it where it
    /// was opened, also when its volume was lazily unmounted (`umount -l`)
    /// and the path now leads to the empty mount point.
    parent: OwnedFd,
    name: OsString,
    dir: OwnedFd,
    /// The directory's identity when it was opened, for [`Self::at_path`].
    id: FileId,
    lock: Lock,
    /// Created by this run, or by an earlier one whose lock says so: the
    /// exporter's to remove at shutdown.
    created: bool,
    closed: AtomicBool,
}

/// The held lock file and what it records.
#[derive(Debug)]
struct Lock {
    fd: OwnedFd,
    id: FileId,
    /// What the file says (or is about to say). Held only to read or
    /// replace it, never across IO: shutdown reads it to know what to
    /// remove, and must not wait behind a write stuck on a hung disk.
    record: Mutex<Record>,
    /// Taken by whoever rewrites the file (the probe thread, setup), so
    /// that writes land in the order of their changes.
    writing: Mutex<()>,
}

impl Lock {
    fn record(&self) -> MutexGuard<'_, Record> {
        // A panic while the record was changed leaves it as valid as
        // before: every change is one whole assignment.
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change` to the record and, if it changed anything, writes
    /// the file. The record in memory is updated first: what it adds is
    /// already this run's to remove, whether or not the write lands.
    fn update(&self, change: impl FnOnce(&mut Record)) -> io::Result<()> {
        let _writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let next = {
            let mut record = self.record();
            let mut next = record.clone();
            change(&mut next);
            if next == *record {
                return Ok(());
            }
            *record = next.clone();
            next
        };
        self.write(&next)
    }

    /// Writes `r` over the lock file's content and syncs it: a record a
    /// crash may lose proves nothing at the next start. Overwritten in
    /// place, then cut to length, so the first line (the same in every
    /// version of the record) never goes missing in a torn write.
    ///
    /// Synced now, too, while setup writes anyway: left dirty, the page
    /// would be written back when the lock file, unlinked at shutdown, is
    /// evicted at exit: ext4 (data=ordered) writes a deleted file's dirty
    /// data from the exiting thread, and on a throttled or saturated disk
    /// that write queues behind everybody else's IO, delaying exit by a
    /// whole queue wait (measured: +7 s at 1 write IOPS behind 6 queued
    /// writes).
    fn write(&self, r: &Record) -> io::Result<()> {
        let text = r.render();
        let mut done = 0;
        while done < text.len() {
            let n = rustix::io::pwrite(&self.fd, &text.as_bytes()[done..], done as u64)?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            done += n;
        }
        rustix::fs::ftruncate(&self.fd, text.len() as u64)?;
        rustix::fs::fdatasync(&self.fd)?;
        Ok(())
    }
}

/// The lock file's first bytes (up to [`lock::MAX_LEN`]).
fn read_lock(fd: &OwnedFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; lock::MAX_LEN];
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::pread(fd, &mut buf[len..], len as u64)? {
            0 => break,
            n => len += n,
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// Refuses the probe directory at `path`, saying why.
fn refuse(path: &Path, reason: String) -> SetupError {
    SetupError::UnsafeDir {
        path: path.to_path_buf(),
        reason,
    }
}

/// The directory the probe directory is made in, and its name there.
fn parent_and_name(path: &Path) -> Result<(&Path, &OsStr), SetupError> {
    // Before any system call, whose error would show the path raw: no
    // file name can hold the byte anyway.
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(refuse(path, "path contains a NUL byte".to_string()));
    }
    match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => Ok((
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            },
            n,
        )),
        _ => Err(refuse(
            path,
            "has no name of its own in a parent directory".to_string(),
        )),
    }
}

/// Creates (0700) or opens the probe directory `name` in `parent_path`:
/// the parent, whether this call created the directory, the directory.
fn open_dir(
    path: &Path,
    parent_path: &Path,
    name: &OsStr,
) -> Result<(OwnedFd, bool, OwnedFd), SetupError> {
    let io_err = |what, source| SetupError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    // The parent is reached through symlinks (a volume path may be one);
    // only the probe directory itself must not be a link.
    let parent = rustix::fs::open(
        parent_path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("creating probe directory", e.into()))?;
    let created = match rustix::fs::mkdirat(&parent, name, PRIVATE_DIR) {
        Ok(()) => true,
        Err(rustix::io::Errno::EXIST) => false,
        Err(e) => return Err(io_err("creating probe directory", e.into())),
    };
    let dir = rustix::fs::openat(
        &parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => refuse(
            path,
            "is a symlink or not a directory; refusing to follow it".to_string(),
        ),
        e => io_err("opening probe directory", e.into()),
    })?;
    Ok((parent, created, dir))
}

/// Refuses a probe directory that another user owns or may write into:
/// what is in it would not be this process's alone.
fn owned_privately(st: &Stat, path: &Path) -> Result<(), SetupError> {
    let euid = rustix::process::geteuid().as_raw();
    if st.st_uid != euid {
        return Err(refuse(
            path,
            format!(
                "owned by uid {}, not by this process (uid {euid}); refusing to write into it",
                st.st_uid
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(refuse(
            path,
            format!(
                "mode {:o} lets other users write into it; chmod 0700 it or remove it",
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Takes the lock in `dir`: a new lock file, or a crashed run's with the
/// record it carried; `None` while another exporter holds it.
fn lock_dir(dir: &OwnedFd, path: &Path) -> Result<Option<(OwnedFd, Option<Record>)>, SetupError> {
    // Twice at most: a lock that appears between the look and the
    // creation (another exporter starting) is looked at again.
    for _ in 0..2 {
        let step = take_lock(dir, path).and_then(|found| match found {
            Found::Nothing => Ok(create_lock(dir, path)?.map(|fd| (fd, None))),
            Found::Crashed(fd, r) => Ok(Some((fd, Some(r)))),
        });
        if let Some(t) = step? {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

/// What was found at the lock file's name.
enum Found {
    /// Nothing: this run makes its own.
    Nothing,
    /// The lock of an exporter that holds it no more (crashed, or killed):
    /// now ours, with the record it carried.
    Crashed(OwnedFd, Record),
}

impl ProbeDir {
    /// Creates (0700) or opens the probe directory, takes its lock and
    /// removes probe files a crashed run left behind. When something is in
    /// the way (a file it did not create, a symlink), what is provably its
    /// own (its lock, a crashed run's recorded files, the directory if it
    /// made it) is removed before the error is returned; the rest stays.
    pub(crate) fn open(path: &Path) -> Result<ProbeDir, SetupError> {
        let pd = ProbeDir::open_locked(path)?;
        if let Err(e) = pd.remove_stale() {
            // The error names what is left; said once.
            for p in pd.remove(false) {
                tracing::error!(problem = %p, "could not remove probe file");
            }
            return Err(e);
        }
        Ok(pd)
    }

    /// Creates (0700) or opens the probe directory and takes its lock,
    /// leaving what is inside for [`ProbeDir::clear`]: the daemon registers
    /// the directory first, so shutdown cleans it up even while setup is
    /// refusing what it found there.
    pub(crate) fn open_locked(path: &Path) -> Result<ProbeDir, SetupError> {
        let io_err = |what, source| SetupError::Io {
            what,
            path: path.to_path_buf(),
            source,
        };
        let (parent_path, name) = parent_and_name(path)?;
        let (parent, created, dir) = open_dir(path, parent_path, name)?;
        let st = fstat(&dir).map_err(|e| io_err("stat of probe directory", e))?;
        let id = FileId::of(&st);
        let identity = Identity::of_fd(&dir).map_err(|e| io_err("stat of probe directory", e))?;
        // A directory this run made and cannot use is not left behind
        // (rmdir removes only an empty one).
        let undo = || {
            if created && FileId::of_name(&parent, name).is_ok_and(|now| now == id) {
                let _ = rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR);
            }
        };
        let taken = match owned_privately(&st, path).and_then(|()| lock_dir(&dir, path)) {
            Ok(taken) => taken,
            Err(e) => {
                undo();
                return Err(e);
            }
        };
        let Some((fd, earlier)) = taken else {
            undo();
            return Err(SetupError::InUse {
                path: path.to_path_buf(),
                pid: "unknown".to_string(),
            });
        };
        let lock_id = FileId::of_fd(&fd).map_err(|e| io_err("stat of lock file in", e))?;
        // A directory a crashed run created is this run's to remove.
        let created = created
            || earlier
                .as_ref()
                .and_then(|r| r.dir)
                .is_some_and(|d| d.matches(&identity));
        let record = Record {
            pid: Some(std::process::id()),
            dir: created.then_some(identity),
            files: earlier.map(|r| r.files).unwrap_or_default(),
        };
        let pd = ProbeDir {
            path: path.to_path_buf(),
            parent,
            name: name.to_os_string(),
            dir,
            id,
            lock: Lock {
                fd,
                id: lock_id,
                record: Mutex::new(Record::default()),
                writing: Mutex::new(()),
            },
            created,
            closed: AtomicBool::new(false),
        };
        if let Err(e) = pd.lock.update(|r| *r = record) {
            pd.remove_all();
            return Err(io_err("writing lock file in", e));
        }
        Ok(pd)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes probe files of an earlier run that its lock records: we
    /// hold the lock now, so whoever created them is gone.
    pub(crate) fn remove_stale(&self) -> Result<(), SetupError> {
        for name in self.clear()? {
            tracing::info!(file = %Shown(&self.path.join(name)), "removed stale probe file of an earlier run");
        }
        Ok(())
    }

    /// Makes room for new probe files: unlinks the files at the probe
    /// files' names that the lock records (this run's, or a crashed run's),
    /// and returns the names removed. Called at start and before every new
    /// setup of a running probe thread, whose old descriptors are closed by
    /// then. A symlink, or a file the lock does not record, is refused and
    /// left in place before anything is removed; unlinking never follows a
    /// link, so its target is not touched either way.
    pub(crate) fn clear(&self) -> Result<Vec<&'static str>, SetupError> {
        let record = self.lock.record().clone();
        let mut ours = Vec::new();
        let mut foreign = Vec::new();
        for name in PROBE_FILES {
            match Seen::at(&self.dir, name) {
                Ok(seen) if seen.kind == FileType::Symlink => {
                    return Err(SetupError::Symlink {
                        path: self.path.join(name),
                        target: readlinkat(&self.dir, name),
                    });
                }
                Ok(seen) => match record.file(name) {
                    Some(id)
                        if seen.kind == FileType::RegularFile && id.matches(&seen.identity) =>
                    {
                        ours.push(name)
                    }
                    _ => foreign.push(name),
                },
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => {
                    return Err(SetupError::Io {
                        what: "stat of probe file",
                        path: self.path.join(name),
                        source,
                    });
                }
            }
        }
        if !foreign.is_empty() {
            return Err(SetupError::Foreign {
                dir: self.path.clone(),
                names: foreign,
            });
        }
        let mut removed = Vec::new();
        let mut result = Ok(());
        for name in ours {
            match unlinkat(&self.dir, name) {
                Ok(()) => removed.push(name),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => {
                    result = Err(SetupError::Io {
                        what: "removing stale probe file",
                        path: self.path.join(name),
                        source,
                    });
                    break;
                }
            }
        }
        // Records of files gone are dropped (an inode number is reused),
        // a record of one still there is kept.
        let gone: Vec<&str> = record
            .files
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| removed.contains(n) || !self.name_exists(n))
            .collect();
        // The files are gone either way; a record that could not be
        // rewritten only keeps naming inodes nothing lists.
        if let Err(e) = self
            .lock
            .update(|r| r.files.retain(|(n, _)| !gone.contains(n)))
        {
            tracing::debug!(probe_dir = %Shown(&self.path), error = %e, "cannot rewrite the lock file");
        }
        result.map(|()| removed)
    }

    fn name_exists(&self, name: &str) -> bool {
        !matches!(lstatat(&self.dir, name), Err(e) if e.raw_os_error() == Some(libc::ENOENT))
    }

    /// Whether `name` in this directory still refers to `held`. Neither a
    /// write nor a sync on a descriptor fails when its name was unlinked or
    /// renamed over: the inode lives on unlisted until the last descriptor
    /// closes, so a probe thread would keep probing a file nobody can see
    /// (holding its space) and never notice a file put in its place. Only
    /// comparing the name's inode with the descriptor's tells.
    pub(crate) fn check_name(&self, name: &str, held: FileId) -> io::Result<NameCheck> {
        match FileId::of_name(&self.dir, name) {
            Ok(id) if id == held => Ok(NameCheck::Same),
            Ok(_) => Ok(NameCheck::Replaced),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(NameCheck::Removed),
            Err(e) => Err(e),
        }
    }

    /// Whether the configured path still names this directory (not removed,
    /// renamed or replaced since it was opened).
    pub(crate) fn at_path(&self) -> io::Result<bool> {
        match rustix::fs::lstat(&self.path) {
            Ok(st) => Ok(FileId::of(&st) == self.id),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Bytes available to this (unprivileged) user on the filesystem.
    pub(crate) fn available_bytes(&self) -> io::Result<u64> {
        let st = rustix::fs::fstatvfs(&self.dir)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    fn check_reserve(&self, name: &str, needed: u64, reserve: u64) -> Result<(), SetupError> {
        let available = self.available_bytes().map_err(|source| SetupError::Io {
            what: "statvfs of",
            path: self.path.clone(),
            source,
        })?;
        if available < needed.saturating_add(reserve) {
            return Err(SetupError::Reserve {
                path: self.path.join(name),
                needed,
                available,
                reserve,
            });
        }
        Ok(())
    }

    /// Creates, fills and syncs a probe file; returns the descriptor it was
    /// created through, so the caller can check that a reopening by name
    /// found the same file. The file is recorded in the lock before any
    /// byte of it is written, so a crash while it is filled leaves a file
    /// the next start can prove is its own.
    fn create(
        &self,
        name: &'static str,
        size: u64,
        reserve: u64,
        fill: Fill,
    ) -> Result<File, SetupError> {
        let path = self.path.join(name);
        let io_err = |what, source| SetupError::Io {
            what,
            path: path.clone(),
            source,
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(SetupError::Stopped);
        }
        self.check_reserve(name, size, reserve)?;
        let fd = openat(
            &self.dir,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL,
            PRIVATE,
        )
        .map_err(|e| io_err("creating", e))?;
        let mut f = File::from(fd);
        if let Err(e) = Identity::of_fd(&f).and_then(|id| self.record(name, Some(id))) {
            self.remove_own(name, &f);
            return Err(io_err("recording in the lock file", e));
        }
        let result = (|| -> io::Result<()> {
            use std::io::Write;
            let mut rng = Rng::seeded();
            let mut chunk = vec![0u8; 1 << 20];
            let mut left = size;
            while left > 0 {
                if self.closed.load(Ordering::SeqCst) {
                    return Err(io::Error::from_raw_os_error(libc::ECANCELED));
                }
                let n = left.min(chunk.len() as u64) as usize;
                if let Fill::Random = fill {
                    rng.fill(&mut chunk[..n]);
                }
                f.write_all(&chunk[..n])?;
                left -= n as u64;
            }
            // fsync, not fdatasync: the file's size and block map must be
            // durable too, so later probe writes are pure data overwrites.
            f.sync_all()?;
            // Drop the pages we just wrote from the page cache: they are not
            // what the probes should find there.
            // Advice (len None: to the end of the file); should it fail, the
            // pages merely stay cached until the kernel evicts them.
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
            Ok(())
        })();
        if let Err(e) = result {
            self.remove_own(name, &f);
            if e.raw_os_error() == Some(libc::ECANCELED) {
                return Err(SetupError::Stopped);
            }
            return Err(io_err("writing", e));
        }
        if self.closed.load(Ordering::SeqCst) {
            // Shutdown cleaned the directory while we were writing.
            self.remove_own(name, &f);
            return Err(SetupError::Stopped);
        }
        Ok(f)
    }

    /// Records `name` as the file `id` in the lock file (None: forgets it).
    fn record(&self, name: &'static str, id: Option<Identity>) -> io::Result<()> {
        self.lock.update(|r| match id {
            Some(id) => r.set_file(name, id),
            None => r.forget(name),
        })
    }

    /// Removes `name` if it is still the file `held` (created through that
    /// descriptor), and its record.
    fn remove_own(&self, name: &'static str, held: &File) {
        let still = FileId::of_fd(held)
            .is_ok_and(|id| FileId::of_name(&self.dir, name).is_ok_and(|now| now == id));
        if still && unlinkat(&self.dir, name).is_ok() {
            let _ = self.record(name, None);
        }
    }

    /// Removes `name` if the lock records it as the exporter's; a file the
    /// exporter did not create is refused, a symlink too.
    fn remove_recorded(&self, name: &'static str) -> Result<(), SetupError> {
        let seen = match Seen::at(&self.dir, name) {
            Ok(seen) => seen,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let _ = self.record(name, None);
                return Ok(());
            }
            Err(source) => {
                return Err(SetupError::Io {
                    what: "stat of",
                    path: self.path.join(name),
                    source,
                });
            }
        };
        if seen.kind == FileType::Symlink {
            return Err(SetupError::Symlink {
                path: self.path.join(name),
                target: readlinkat(&self.dir, name),
            });
        }
        let recorded = self.lock.record().file(name);
        if !recorded.is_some_and(|id| id.matches(&seen.identity)) {
            return Err(SetupError::Foreign {
                dir: self.path.clone(),
                names: vec![name],
            });
        }
        match unlinkat(&self.dir, name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(source) => {
                return Err(SetupError::Io {
                    what: "removing",
                    path: self.path.join(name),
                    source,
                });
            }
        }
        let _ = self.record(name, None);
        Ok(())
    }

    /// Opens `name` again with `flags` (O_DSYNC/O_SYNC cannot be added to an
    /// open descriptor, and the page cache must be dropped before O_DIRECT)
    /// and checks that it is still the file `created` refers to: between
    /// the two opens the name could have been renamed over, and the probe
    /// must only ever write to a file it created itself.
    fn reopen(
        &self,
        name: &str,
        created: &File,
        flags: OFlags,
    ) -> io::Result<Result<File, SetupError>> {
        let f = File::from(openat(&self.dir, name, flags, Mode::empty())?);
        let a = FileId::of(&fstat(created)?);
        let b = FileId::of(&fstat(&f)?);
        if a != b {
            return Ok(Err(SetupError::Replaced {
                path: self.path.join(name),
            }));
        }
        Ok(Ok(f))
    }

    /// Creates the WAL probe file: 16 MiB of zeros written and synced before
    /// any timing, like a WAL segment PostgreSQL preallocated. `fallocate`
    /// would leave unwritten extents whose first write costs a metadata
    /// journal commit; appending would change the size on every write. Both
    /// would time something PostgreSQL does not do on a recycled segment.
    /// Returns it opened with the flags the sync method implies.
    pub(crate) fn create_wal_file(
        &self,
        size: u64,
        method: SyncMethod,
        reserve: u64,
    ) -> Result<File, SetupError> {
        let created = self.create(WAL_FILE, size, reserve, Fill::Zero)?;
        let extra = match method {
            SyncMethod::Fdatasync | SyncMethod::Fsync => OFlags::empty(),
            // Not OFlags::DSYNC: rustix's raw-syscall backend defines it as
            // O_SYNC, which would also sync metadata, as open_sync does.
            SyncMethod::OpenDatasync => OFlags::from_bits_retain(libc::O_DSYNC as u32),
            SyncMethod::OpenSync => OFlags::SYNC,
        };
        self.reopen(WAL_FILE, &created, OFlags::RDWR | extra)
            .map_err(|source| SetupError::Io {
                what: "opening",
                path: self.path.join(WAL_FILE),
                source,
            })?
    }

    /// Creates the read probe file filled with random bytes (zeros would be
    /// compressed away by btrfs/ZFS and never reach the device) and opens it
    /// `O_DIRECT`.
    pub(crate) fn create_read_file(&self, size: u64, reserve: u64) -> Result<File, SetupError> {
        let created = self.create(READ_FILE, size, reserve, Fill::Random)?;
        match self.reopen(READ_FILE, &created, OFlags::RDONLY | OFlags::DIRECT) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.remove_own(READ_FILE, &created);
                Err(SetupError::DirectIoUnsupported {
                    path: self.path.join(READ_FILE),
                    errno: libc::EINVAL,
                })
            }
            Err(source) => Err(SetupError::Io {
                what: "opening O_DIRECT",
                path: self.path.join(READ_FILE),
                source,
            }),
        }
    }

    /// Creates the sweep file filled with random bytes (as the read probe
    /// file, so that compression cannot skip the writes) and opens it
    /// read-write `O_DIRECT`. Written in full and synced first, like the WAL
    /// probe file: the sweep's writes must be overwrites of allocated
    /// blocks, or each would also cost the filesystem a metadata update.
    pub(crate) fn create_sweep_file(&self, size: u64, reserve: u64) -> Result<File, SetupError> {
        // Left by a sweep that could not remove it (the clean-up of an
        // interrupted one happens at the next start; this covers a failed
        // unlink in between). Anything else at the name is refused.
        self.remove_recorded(SWEEP_FILE)?;
        let created = self.create(SWEEP_FILE, size, reserve, Fill::Random)?;
        match self.reopen(SWEEP_FILE, &created, OFlags::RDWR | OFlags::DIRECT) {
            Ok(Ok(f)) => Ok(f),
            Ok(Err(e)) => Err(e),
            Err(e) => {
                self.remove_own(SWEEP_FILE, &created);
                if e.raw_os_error() == Some(libc::EINVAL) {
                    return Err(SetupError::DirectIoUnsupported {
                        path: self.path.join(SWEEP_FILE),
                        errno: libc::EINVAL,
                    });
                }
                Err(SetupError::Io {
                    what: "opening O_DIRECT",
                    path: self.path.join(SWEEP_FILE),
                    source: e,
                })
            }
        }
    }

    /// Removes the sweep file, if it is the one the exporter created.
    pub(crate) fn remove_sweep_file(&self) {
        if let Err(e) = self.remove_recorded(SWEEP_FILE) {
            tracing::warn!(error = %e, "sweep file not removed");
        }
    }

    /// Removes the probe files the lock records, then the lock file and,
    /// when the exporter created it, the directory. What the exporter did
    /// not create stays, and so does the directory holding it. When a
    /// recorded file cannot be removed (a filesystem turned read-only), the
    /// lock stays too: it is what lets the next start prove that file is
    /// its own. Safe to call while a probe thread still holds a file open:
    /// the blocks are freed when the last descriptor closes, at exit at the
    /// latest. Returns what could not be removed.
    pub(crate) fn remove_all(&self) -> Vec<String> {
        self.remove(true)
    }

    /// [`Self::remove_all`]; `say_kept`: log the files left in place.
    fn remove(&self, say_kept: bool) -> Vec<String> {
        self.closed.store(true, Ordering::SeqCst);
        let mut problems = Vec::new();
        let mut kept = Vec::new();
        let record = self.lock.record().clone();
        for (name, id) in &record.files {
            let shown = Shown(&self.path.join(name)).to_string();
            match Seen::at(&self.dir, name) {
                Ok(seen) if id.matches(&seen.identity) => match unlinkat(&self.dir, name) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => problems.push(format!("{shown}: {e}")),
                },
                // Renamed over by something else since: not ours.
                Ok(_) => kept.push(*name),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => problems.push(format!("{shown}: {e}")),
            }
        }
        for name in PROBE_FILES {
            if record.file(name).is_none() && self.name_exists(name) {
                kept.push(name);
            }
        }
        if say_kept && !kept.is_empty() {
            tracing::warn!(
                probe_dir = %Shown(&self.path),
                files = %kept.join(", "),
                "left in place: files this exporter did not create"
            );
        }
        if !problems.is_empty() {
            return problems;
        }
        match FileId::of_name(&self.dir, LOCK_FILE) {
            Ok(id) if id == self.lock.id => {
                if let Err(e) = unlinkat(&self.dir, LOCK_FILE) {
                    problems.push(format!("{}: {e}", Shown(&self.path.join(LOCK_FILE))));
                    return problems;
                }
            }
            _ => {}
        }
        if self.created {
            self.remove_dir(&mut problems);
        }
        problems
    }

    /// Removes the directory this exporter created, through its parent's
    /// descriptor, if that still lists it under its name; otherwise says
    /// in one line why not.
    fn remove_dir(&self, problems: &mut Vec<String>) {
        let shown = Shown(&self.path);
        match FileId::of_name(&self.parent, self.name.as_os_str()) {
            Ok(id) if id == self.id => {
                match rustix::fs::unlinkat(&self.parent, self.name.as_os_str(), AtFlags::REMOVEDIR)
                {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(rustix::io::Errno::NOTEMPTY) => tracing::warn!(
                        probe_dir = %shown,
                        "probe directory kept: it holds files this exporter did not create"
                    ),
                    Err(e) => problems.push(format!("{shown}: {e}")),
                }
            }
            // Deleted with everything in it (nothing left to do), or moved
            // away: whatever has its name now is not the exporter's.
            _ if fstat(&self.dir).is_ok_and(|st| st.st_nlink == 0) => {}
            Ok(_) | Err(_) => tracing::warn!(
                probe_dir = %shown,
                "probe directory not removed: it was moved away since it was opened"
            ),
        }
    }
}

#[derive(Clone, Copy)]
enum Fill {
    Zero,
    Random,
}

/// Mode of every file the exporter creates: 0600.
const PRIVATE: Mode = Mode::RUSR.union(Mode::WUSR);
/// Mode of the probe directory it creates: 0700.
const PRIVATE_DIR: Mode = Mode::RWXU;

/// Opens `name` relative to `dir`. O_NOFOLLOW refuses a symlink in the last
/// component, and the names are constants without '/', so nothing is ever
/// opened through a link.
fn openat(dir: &OwnedFd, name: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    )?)
}

/// Removes `name` in `dir`; unlinkat never follows a symlink.
fn unlinkat(dir: &OwnedFd, name: &str) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?)
}

/// The descriptor of a probe file, for the engines.
pub(crate) fn raw(f: &File) -> BorrowedFd<'_> {
    f.as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::settings::PROBE_DIR_NAME;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn creates_private_dir_and_files_and_removes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("probe");
        let pd = ProbeDir::open(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let _w = pd
            .create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        let meta = std::fs::metadata(p.join(WAL_FILE)).unwrap();
        assert_eq!(meta.len(), 1 << 20);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // The sweep file: written in full, private, removed with the rest
        // (tmpfs has no O_DIRECT; then it is refused and not left behind).
        match pd.create_sweep_file(1 << 20, 0) {
            Ok(_f) => {
                let meta = std::fs::metadata(p.join(SWEEP_FILE)).unwrap();
                assert_eq!(meta.len(), 1 << 20);
                assert!(meta.blocks() * 512 >= 1 << 20, "allocated, not sparse");
                assert_eq!(meta.permissions().mode() & 0o777, 0o600);
                // A second sweep replaces the first one's file.
                let _g = pd.create_sweep_file(1 << 20, 0).unwrap();
            }
            Err(SetupError::DirectIoUnsupported { .. }) => {
                assert!(!p.join(SWEEP_FILE).exists());
            }
            Err(e) => panic!("{e}"),
        }
        assert!(pd.remove_all().is_empty());
        assert!(!p.exists());
    }

    #[test]
    fn second_open_is_refused_while_locked_and_stale_files_go() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("probe");
        let pd = ProbeDir::open(&p).unwrap();
        let e = ProbeDir::open(&p).unwrap_err();
        assert!(matches!(e, SetupError::InUse { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{e}"
        );
        pd.create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        drop(pd); // a "crash": files stay, lock is released
        assert!(p.join(WAL_FILE).exists());
        let pd = ProbeDir::open(&p).unwrap();
        assert!(!p.join(WAL_FILE).exists(), "stale file removed at start");
        pd.remove_all();
    }

    #[test]
    fn refuses_symlinked_or_shared_dirs_and_planted_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let link = tmp.path().join("probe");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = ProbeDir::open(&link).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");

        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ProbeDir::open(&shared).unwrap_err();
        assert!(e.to_string().contains("mode 777"), "{e}");

        // A symlink planted where a probe file goes is refused (ELOOP) and
        // left in place, never followed; once removed, setup goes ahead.
        let p = tmp.path().join("p2");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, p.join(WAL_FILE)).unwrap();
        let e = ProbeDir::open(&p).unwrap_err();
        assert!(matches!(e, SetupError::Symlink { .. }), "{e}");
        assert_eq!(e.label(), "ELOOP");
        assert!(e.to_string().contains("victim"), "names the target: {e}");
        assert!(p.join(WAL_FILE).is_symlink(), "left for the operator");
        assert_eq!(entries(&p), [WAL_FILE], "no lock left behind");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        std::fs::remove_file(p.join(WAL_FILE)).unwrap();
        let pd = ProbeDir::open(&p).unwrap();
        pd.create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        // A link planted after setup is not the exporter's: shutdown
        // leaves it, and its target, where they are.
        std::fs::remove_file(p.join(WAL_FILE)).unwrap();
        std::os::unix::fs::symlink(&victim, p.join(WAL_FILE)).unwrap();
        assert!(pd.remove_all().is_empty());
        assert!(p.join(WAL_FILE).is_symlink());
        assert_eq!(entries(&p), [WAL_FILE]);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn held_files_are_checked_against_their_names() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("probe");
        let pd = ProbeDir::open(&p).unwrap();
        let w = pd
            .create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        assert_eq!(
            pd.check_name(WAL_FILE, FileId::of_fd(&w).unwrap()).unwrap(),
            NameCheck::Same
        );
        assert!(pd.at_path().unwrap());

        // Renamed over by a symlink: the descriptor still works, on an
        // inode no directory lists any more.
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, p.join("planted")).unwrap();
        std::fs::rename(p.join("planted"), p.join(WAL_FILE)).unwrap();
        assert_eq!(
            pd.check_name(WAL_FILE, FileId::of_fd(&w).unwrap()).unwrap(),
            NameCheck::Replaced
        );
        assert_eq!(NameCheck::Replaced.label(), "replaced");

        std::fs::remove_file(p.join(WAL_FILE)).unwrap();
        assert_eq!(
            pd.check_name(WAL_FILE, FileId::of_fd(&w).unwrap()).unwrap(),
            NameCheck::Removed
        );
        assert_eq!(NameCheck::Removed.label(), "removed");

        // A new setup of the same directory: clear() makes room (the read
        // file of the previous setup is ours) and creation succeeds.
        let r = pd.create_read_file(1 << 20, 0).unwrap();
        drop((w, r));
        assert_eq!(pd.clear().unwrap(), vec![READ_FILE]);
        let w = pd
            .create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        assert_eq!(
            pd.check_name(WAL_FILE, FileId::of_fd(&w).unwrap()).unwrap(),
            NameCheck::Same
        );

        // The directory moved away: names in it still match, the path does not.
        std::fs::rename(&p, tmp.path().join("moved")).unwrap();
        assert!(!pd.at_path().unwrap());
        assert_eq!(
            pd.check_name(WAL_FILE, FileId::of_fd(&w).unwrap()).unwrap(),
            NameCheck::Same
        );
        assert!(pd.remove_all().is_empty());
        assert_eq!(
            std::fs::read_dir(tmp.path().join("moved")).unwrap().count(),
            0,
            "files removed through the descriptor"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    /// The names in `p`, sorted.
    fn entries(p: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A file of someone else: content, inode and times to compare.
    struct Planted {
        path: PathBuf,
        content: Vec<u8>,
        meta: (u64, i64, i64, i64, i64),
    }

    impl Planted {
        fn new(path: PathBuf, content: &[u8]) -> Planted {
            std::fs::write(&path, content).unwrap();
            let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(old)
                .unwrap();
            Planted {
                meta: Planted::meta(&path),
                path,
                content: content.to_vec(),
            }
        }

        fn meta(path: &Path) -> (u64, i64, i64, i64, i64) {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::symlink_metadata(path).unwrap();
            (
                m.ino(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            )
        }

        fn assert_untouched(&self) {
            assert_eq!(
                Planted::meta(&self.path),
                self.meta,
                "{}",
                self.path.display()
            );
            assert_eq!(std::fs::read(&self.path).unwrap(), self.content);
        }
    }

    fn admin_dir(p: &Path) {
        std::fs::create_dir(p).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn a_hard_link_at_the_lock_files_name_is_not_truncated() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("probe");
        admin_dir(&p);
        // Even a hard link to a lock of ours: a write would reach the
        // other name too.
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"").unwrap();
        std::fs::hard_link(&victim, p.join(LOCK_FILE)).unwrap();
        let victim = Planted::new(victim, format!("{}\n", lock::HEADER).as_bytes());
        let e = ProbeDir::open(&p).unwrap_err();
        assert_eq!(e.label(), "foreign_file", "{e}");
        assert!(e.to_string().contains("): lock;"), "{e}");
        victim.assert_untouched();
        assert_eq!(entries(&p), [LOCK_FILE]);
    }

    #[test]
    fn foreign_files_at_the_exporters_names_are_never_touched() {
        let tmp = tempfile::tempdir().unwrap();
        // With a lock of someone else (empty, a bare pid as older versions
        // wrote, random bytes, too long to be ours) and without one.
        let long = vec![b'x'; lock::MAX_LEN + 1];
        let with_header = format!("{}\n", lock::HEADER).repeat(200);
        for (i, lock) in [
            Some(&b""[..]),
            Some(b"4711\n"),
            Some(b"\x00\xff random"),
            Some(&long[..]),
            Some(with_header.as_bytes()),
            None,
        ]
        .into_iter()
        .enumerate()
        {
            let p = tmp.path().join(format!("probe{i}"));
            admin_dir(&p);
            let mut planted = Vec::new();
            if let Some(content) = lock {
                planted.push(Planted::new(p.join(LOCK_FILE), content));
            }
            for name in PROBE_FILES {
                planted.push(Planted::new(p.join(name), b"someone else's"));
            }
            let e = ProbeDir::open(&p).unwrap_err();
            assert_eq!(e.label(), "foreign_file", "{e}");
            let names = match &e {
                SetupError::Foreign { names, .. } => names.clone(),
                e => panic!("{e}"),
            };
            let want: Vec<&str> = lock
                .map(|_| LOCK_FILE)
                .into_iter()
                .chain(PROBE_FILES)
                .collect();
            assert_eq!(names, want, "{e}");
            for f in &planted {
                f.assert_untouched();
            }
            let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
            want.sort();
            assert_eq!(entries(&p), want, "nothing added, nothing removed");
        }
    }

    #[test]
    fn a_crashed_runs_lock_is_taken_over_with_what_it_proves() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("probe");
        let pd = ProbeDir::open(&p).unwrap();
        let _w = pd
            .create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        let _r = pd.create_read_file(1 << 20, 0);
        let text = std::fs::read_to_string(p.join(LOCK_FILE)).unwrap();
        assert!(
            text.starts_with(&format!(
                "{}\npid {}\ndir ",
                lock::HEADER,
                std::process::id()
            )),
            "{text}"
        );
        assert!(text.contains("\nfile wal.probe "), "{text}");
        drop(pd); // a crash: the files and the lock stay, its flock goes
        // A file of someone else where the crashed run had none: refused,
        // and nothing of the crashed run's removed before refusing.
        let sweep = Planted::new(p.join(SWEEP_FILE), b"not ours");
        let pd = ProbeDir::open_locked(&p).unwrap();
        let e = pd.remove_stale().unwrap_err();
        assert!(
            matches!(&e, SetupError::Foreign { names, .. } if names == &[SWEEP_FILE]),
            "{e}"
        );
        assert!(p.join(WAL_FILE).exists());
        sweep.assert_untouched();
        // The lock now says this process, and still proves the crashed
        // run's files.
        let text = std::fs::read_to_string(p.join(LOCK_FILE)).unwrap();
        assert!(
            text.contains(&format!("\npid {}\n", std::process::id())),
            "{text}"
        );
        assert!(text.contains("\nfile wal.probe "), "{text}");
        // Shutdown removes what is provably its own (the crashed run's
        // files and directory included), and only that.
        assert!(pd.remove_all().is_empty());
        assert_eq!(entries(&p), [SWEEP_FILE]);
        sweep.assert_untouched();
        // Crashed with nothing in the way: the files go at start, and the
        // directory the crashed run created at shutdown.
        let p = tmp.path().join("probe2");
        let pd = ProbeDir::open(&p).unwrap();
        pd.create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        drop(pd);
        let pd = ProbeDir::open(&p).unwrap();
        assert_eq!(entries(&p), [LOCK_FILE]);
        assert!(pd.remove_all().is_empty());
        assert!(!p.exists(), "a directory a crashed run created is removed");
    }

    #[test]
    fn a_file_renamed_over_a_probe_file_is_not_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("probe");
        let pd = ProbeDir::open(&p).unwrap();
        let _w = pd
            .create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        let other = Planted::new(tmp.path().join("other"), b"someone else's");
        std::fs::rename(&other.path, p.join(WAL_FILE)).unwrap();
        let other = Planted::new(p.join(WAL_FILE), &other.content);
        // A new setup refuses it, shutdown leaves it.
        let e = pd.clear().unwrap_err();
        assert_eq!(e.label(), "foreign_file", "{e}");
        let e = pd.create_sweep_file(1 << 20, 0).map(|_| ());
        assert!(
            e.is_ok() || e.as_ref().is_err_and(|e| e.label() == "no_direct_io"),
            "{e:?}"
        );
        assert!(pd.remove_all().is_empty());
        other.assert_untouched();
        assert_eq!(entries(&p), [WAL_FILE], "the directory stays with it");
    }

    #[test]
    fn an_administrators_probe_dir_is_kept_ours_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        // Made by someone else, even under the exporter's default name.
        for name in ["made-by-admin", PROBE_DIR_NAME] {
            let admin = tmp.path().join(name);
            admin_dir(&admin);
            let pd = ProbeDir::open(&admin).unwrap();
            pd.create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
                .unwrap();
            assert!(pd.remove_all().is_empty());
            assert!(admin.is_dir(), "kept");
            assert_eq!(std::fs::read_dir(&admin).unwrap().count(), 0, "but emptied");
        }
        let ours = tmp.path().join("ours");
        let pd = ProbeDir::open(&ours).unwrap();
        assert!(pd.remove_all().is_empty());
        assert!(!ours.exists());
    }

    #[test]
    fn a_nul_byte_in_the_path_is_refused_before_any_call_and_shown_escaped() {
        let tmp = tempfile::tempdir().unwrap();
        let p = PathBuf::from(format!("{}/a\0b", tmp.path().display()));
        let e = ProbeDir::open(&p).unwrap_err();
        assert_eq!(e.label(), "unsafe_dir");
        assert!(
            e.to_string().contains("/a\\0b: path contains a NUL byte"),
            "{e}"
        );
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn reserve_is_enforced_before_writing() {
        let tmp = tempfile::tempdir().unwrap();
        let pd = ProbeDir::open(&tmp.path().join("probe")).unwrap();
        let e = pd.create_read_file(1 << 20, u64::MAX / 2).unwrap_err();
        assert!(matches!(e, SetupError::Reserve { .. }), "{e}");
        assert!(e.to_string().contains("free_space_reserve"), "{e}");
        assert!(!tmp.path().join("probe").join(READ_FILE).exists());
        pd.remove_all();
    }

    /// The open flags of `f` as the kernel sees them (octal in fdinfo).
    fn open_flags(f: &File) -> i32 {
        use std::os::fd::AsRawFd;
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", f.as_raw_fd())).unwrap();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .unwrap()
            .trim();
        i32::from_str_radix(flags, 8).unwrap()
    }

    #[test]
    fn probe_files_are_opened_with_exactly_the_flags_their_method_implies() {
        let tmp = tempfile::tempdir().unwrap();
        let pd = ProbeDir::open(&tmp.path().join("probe")).unwrap();
        // O_SYNC includes the O_DSYNC bit: open_datasync must have that bit
        // alone, or its probes would also wait for metadata.
        let sync_only = libc::O_SYNC & !libc::O_DSYNC;
        for (method, dsync, sync) in [
            (SyncMethod::Fdatasync, false, false),
            (SyncMethod::Fsync, false, false),
            (SyncMethod::OpenDatasync, true, false),
            (SyncMethod::OpenSync, true, true),
        ] {
            pd.clear().unwrap();
            let w = pd.create_wal_file(1 << 20, method, 0).unwrap();
            let fl = open_flags(&w);
            assert_eq!(fl & libc::O_ACCMODE, libc::O_RDWR, "{method:?}");
            assert_eq!(fl & libc::O_DSYNC != 0, dsync, "{method:?}: {fl:o}");
            assert_eq!(fl & sync_only != 0, sync, "{method:?}: {fl:o}");
            assert_ne!(fl & libc::O_CLOEXEC, 0, "{method:?}");
        }
        match pd.create_read_file(1 << 20, 0) {
            Ok(r) => {
                let fl = open_flags(&r);
                assert_eq!(fl & libc::O_ACCMODE, libc::O_RDONLY);
                assert_ne!(fl & libc::O_DIRECT, 0, "{fl:o}");
            }
            // tmpfs and a few others refuse O_DIRECT.
            Err(e) => assert_eq!(e.label(), "no_direct_io", "{e}"),
        }
        assert!(pd.remove_all().is_empty());
    }
}
