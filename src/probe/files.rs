//! The probe directory and the two probe files in it.
//!
//! Safety rules (docs/design.md): the directory is the exporter's own (created
//! 0700, or an existing one owned by us and writable by nobody else), every
//! file is opened relative to the directory's descriptor with `O_NOFOLLOW`
//! so a symlink planted in it can never redirect a write, files are 0600,
//! a free-space reserve is kept, and everything is removed at shutdown.
//!
//! A symlink found at a probe file's name is refused (`ELOOP`), not removed:
//! only root or the exporter's own user can plant one in a 0700 directory,
//! so it is a deliberate act (an administrator pointing the probe at another
//! disk, or worse) that the error metric should show until someone removes
//! it. Held files are checked against their names ([`ProbeDir::check_name`])
//! because an open descriptor keeps writing to its inode after the name was
//! unlinked or renamed over, without any error.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use thiserror::Error;

use crate::probe::settings::{BLOCK_SIZE, CHECK_DIR_NAME, PROBE_DIR_NAME};
use crate::probe::{Rng, errno_name};
use crate::types::SyncMethod;
use crate::units::fmt_bytes;

pub const WAL_FILE: &str = "wal.probe";
pub const READ_FILE: &str = "read.probe";
/// The queue-depth sweep's write target: created for a sweep with writes,
/// removed when it ends.
pub const SWEEP_FILE: &str = "sweep.probe";
pub const LOCK_FILE: &str = "lock";

/// Why a volume's probe files could not be set up. The daemon retries with
/// backoff; `check` reports it and exits non-zero.
#[derive(Debug, Error)]
pub enum SetupError {
    #[error("probe directory {}: {reason}", path.display())]
    UnsafeDir { path: PathBuf, reason: String },
    #[error("probe directory {} is in use by another pg-storage-exporter (pid {pid})", path.display())]
    InUse { path: PathBuf, pid: String },
    #[error(
        "not creating {} ({}): {} free, and {} must stay free (free_space_reserve)",
        path.display(), fmt_bytes(*needed), fmt_bytes(*available), fmt_bytes(*reserve)
    )]
    Reserve {
        path: PathBuf,
        needed: u64,
        available: u64,
        reserve: u64,
    },
    #[error(
        "{}: the filesystem refuses O_DIRECT ({}); the read probe cannot bypass the page cache here",
        path.display(), errno_name(*errno)
    )]
    DirectIoUnsupported { path: PathBuf, errno: i32 },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is a symlink{}; probe files are never opened through a link: remove it",
        path.display(), target.as_ref().map(|t| format!(" to {}", t.display())).unwrap_or_default()
    )]
    Symlink {
        path: PathBuf,
        target: Option<PathBuf>,
    },
    #[error(
        "{} was replaced between its creation and its reopening; not probing a file this exporter did not create",
        path.display()
    )]
    Replaced { path: PathBuf },
    #[error("{0}")]
    Engine(#[from] crate::probe::engine::EngineUnavailable),
    #[error("shutting down")]
    Stopped,
}

impl SetupError {
    /// Bounded `error` label for `pgstorage_probe_errors_total{op="setup"}`.
    pub fn label(&self) -> &'static str {
        match self {
            SetupError::UnsafeDir { .. } => "unsafe_dir",
            SetupError::InUse { .. } => "in_use",
            SetupError::Reserve { .. } => "free_space_reserve",
            SetupError::DirectIoUnsupported { .. } => "no_direct_io",
            // What O_NOFOLLOW itself answers for a link: an errno the label
            // set already has.
            SetupError::Symlink { .. } => "ELOOP",
            SetupError::Replaced { .. } => "replaced",
            SetupError::Io { source, .. } => errno_name(source.raw_os_error().unwrap_or(0)),
            SetupError::Engine(_) => "io_uring_unavailable",
            SetupError::Stopped => "stopped",
        }
    }
}

/// What a probe file's name refers to now, compared with the file a probe
/// thread holds open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameCheck {
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
    pub fn label(self) -> &'static str {
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
pub struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The file an open descriptor refers to.
    pub fn of_fd(fd: impl AsFd) -> io::Result<FileId> {
        Ok(FileId::of(&fstat(fd)?))
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

/// An open, locked probe directory.
#[derive(Debug)]
pub struct ProbeDir {
    path: PathBuf,
    dir: OwnedFd,
    /// The directory's identity when it was opened, for [`Self::at_path`].
    id: FileId,
    _lock: OwnedFd,
    created: bool,
    closed: AtomicBool,
}

impl ProbeDir {
    /// Creates (0700) or opens the probe directory, takes its lock and
    /// removes probe files a crashed run left behind.
    pub fn open(path: &Path) -> Result<ProbeDir, SetupError> {
        let pd = ProbeDir::open_locked(path)?;
        pd.remove_stale()?;
        Ok(pd)
    }

    /// Creates (0700) or opens the probe directory and takes its lock,
    /// leaving what is inside for [`ProbeDir::clear`]: the daemon registers
    /// the directory first, so shutdown cleans it up even while setup is
    /// refusing what it found there.
    pub fn open_locked(path: &Path) -> Result<ProbeDir, SetupError> {
        let io_err = |what, source| SetupError::Io {
            what,
            path: path.to_path_buf(),
            source,
        };
        let refuse = |reason: String| SetupError::UnsafeDir {
            path: path.to_path_buf(),
            reason,
        };
        let created = match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io_err("creating probe directory", e)),
        };
        if path.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(refuse("path contains a NUL byte".to_string()));
        }
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            let e = io::Error::from(e);
            match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                    refuse("is a symlink or not a directory; refusing to follow it".to_string())
                }
                _ => io_err("opening probe directory", e),
            }
        })?;
        let meta = File::from(dir.try_clone().map_err(|e| io_err("dup", e))?)
            .metadata()
            .map_err(|e| io_err("stat of probe directory", e))?;
        let euid = rustix::process::geteuid().as_raw();
        if meta.uid() != euid {
            return Err(refuse(format!(
                "owned by uid {}, not by this process (uid {euid}); refusing to write into it",
                meta.uid()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(refuse(format!(
                "mode {:o} lets other users write into it; chmod 0700 it or remove it",
                meta.mode() & 0o7777
            )));
        }
        let lock = openat(&dir, LOCK_FILE, OFlags::RDWR | OFlags::CREATE, PRIVATE)
            .map_err(|e| io_err("opening lock file in", e))?;
        // The lock file is opened without O_EXCL (it survives a crash) and is
        // then truncated: a hard link planted at its name would have that
        // truncation land in the linked file, wherever else it is listed.
        let lock_st = fstat(&lock).map_err(|e| io_err("stat of lock file in", e))?;
        if FileType::from_raw_mode(lock_st.st_mode) != FileType::RegularFile
            || lock_st.st_nlink != 1
        {
            return Err(refuse(format!(
                "its {LOCK_FILE} file is not a regular file with a single link ({} links); \
                 refusing to write into what may be another file: remove it",
                lock_st.st_nlink
            )));
        }
        if let Err(e) =
            rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        {
            let e = io::Error::from(e);
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let pid = std::fs::read_to_string(path.join(LOCK_FILE))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "unknown".to_string());
                return Err(SetupError::InUse {
                    path: path.to_path_buf(),
                    pid,
                });
            }
            return Err(io_err("locking", e));
        }
        let mut lock_file = File::from(lock);
        {
            use std::io::Write;
            let _ = lock_file.set_len(0);
            let _ = writeln!(lock_file, "{}", std::process::id());
            // Written back now, while setup writes anyway. Left dirty, the
            // page would be written back when the lock file, unlinked at
            // shutdown, is evicted at exit: ext4 (data=ordered) writes a
            // deleted file's dirty data from the exiting thread, and on a
            // throttled or saturated disk that write queues behind
            // everybody else's IO, delaying exit by a whole queue wait
            // (measured: +7 s at 1 write IOPS behind 6 queued writes).
            let _ = lock_file.sync_data();
        }
        Ok(ProbeDir {
            path: path.to_path_buf(),
            dir,
            id: FileId {
                dev: meta.dev(),
                ino: meta.ino(),
            },
            _lock: OwnedFd::from(lock_file),
            created,
            closed: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes probe files of an earlier run: we hold the lock, so whoever
    /// created them is gone.
    pub fn remove_stale(&self) -> Result<(), SetupError> {
        for name in self.clear()? {
            tracing::info!(file = %self.path.join(name).display(), "removed stale probe file of an earlier run");
        }
        Ok(())
    }

    /// Makes room for new probe files: unlinks whatever regular file (or
    /// other non-link entry) has a probe file's name, and returns the names
    /// removed. Called at start and before every new setup of a running
    /// probe thread, whose old descriptors are closed by then. A symlink is
    /// refused, and left in place, before anything is removed; unlinking
    /// never follows a link, so its target is not touched either way.
    pub fn clear(&self) -> Result<Vec<&'static str>, SetupError> {
        for name in [WAL_FILE, READ_FILE, SWEEP_FILE] {
            match lstatat(&self.dir, name) {
                Ok(st) if is_symlink(&st) => {
                    return Err(SetupError::Symlink {
                        path: self.path.join(name),
                        target: readlinkat(&self.dir, name),
                    });
                }
                Ok(_) => {}
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
        let mut removed = Vec::new();
        for name in [WAL_FILE, READ_FILE, SWEEP_FILE] {
            match unlinkat(&self.dir, name) {
                Ok(()) => removed.push(name),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => {
                    return Err(SetupError::Io {
                        what: "removing stale probe file",
                        path: self.path.join(name),
                        source,
                    });
                }
            }
        }
        Ok(removed)
    }

    /// Whether `name` in this directory still refers to `held`. Neither a
    /// write nor a sync on a descriptor fails when its name was unlinked or
    /// renamed over: the inode lives on unlisted until the last descriptor
    /// closes, so a probe thread would keep probing a file nobody can see
    /// (holding its space) and never notice a file put in its place. Only
    /// comparing the name's inode with the descriptor's tells.
    pub fn check_name(&self, name: &str, held: FileId) -> io::Result<NameCheck> {
        match lstatat(&self.dir, name) {
            Ok(st) if FileId::of(&st) == held => Ok(NameCheck::Same),
            Ok(_) => Ok(NameCheck::Replaced),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(NameCheck::Removed),
            Err(e) => Err(e),
        }
    }

    /// Whether the configured path still names this directory (not removed,
    /// renamed or replaced since it was opened).
    pub fn at_path(&self) -> io::Result<bool> {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) => Ok(FileId {
                dev: m.dev(),
                ino: m.ino(),
            } == self.id),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Bytes available to this (unprivileged) user on the filesystem.
    pub fn available_bytes(&self) -> io::Result<u64> {
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
    /// found the same file.
    fn create(&self, name: &str, size: u64, reserve: u64, fill: Fill) -> Result<File, SetupError> {
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
            let _ = unlinkat(&self.dir, name);
            if e.raw_os_error() == Some(libc::ECANCELED) {
                return Err(SetupError::Stopped);
            }
            return Err(io_err("writing", e));
        }
        if self.closed.load(Ordering::SeqCst) {
            // Shutdown cleaned the directory while we were writing.
            let _ = unlinkat(&self.dir, name);
            return Err(SetupError::Stopped);
        }
        Ok(f)
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
    pub fn create_wal_file(
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
    pub fn create_read_file(&self, size: u64, reserve: u64) -> Result<File, SetupError> {
        let created = self.create(READ_FILE, size, reserve, Fill::Random)?;
        match self.reopen(READ_FILE, &created, OFlags::RDONLY | OFlags::DIRECT) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let _ = unlinkat(&self.dir, READ_FILE);
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
    pub fn create_sweep_file(&self, size: u64, reserve: u64) -> Result<File, SetupError> {
        // Left by a sweep that could not remove it (the clean-up of an
        // interrupted one happens at the next start; this covers a failed
        // unlink in between).
        self.remove_sweep_file();
        let created = self.create(SWEEP_FILE, size, reserve, Fill::Random)?;
        match self.reopen(SWEEP_FILE, &created, OFlags::RDWR | OFlags::DIRECT) {
            Ok(Ok(f)) => Ok(f),
            Ok(Err(e)) => Err(e),
            Err(e) => {
                let _ = unlinkat(&self.dir, SWEEP_FILE);
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

    /// Removes the sweep file (if there is one; never a symlink's target:
    /// unlinking does not follow links).
    pub fn remove_sweep_file(&self) {
        let _ = unlinkat(&self.dir, SWEEP_FILE);
    }

    /// Removes the probe files, the lock file and (if empty) the directory.
    /// Safe to call while a probe thread still holds a file open: the blocks
    /// are freed when the last descriptor closes, at exit at the latest.
    pub fn remove_all(&self) -> Vec<String> {
        self.closed.store(true, Ordering::SeqCst);
        let mut problems = Vec::new();
        for name in [WAL_FILE, READ_FILE, SWEEP_FILE, LOCK_FILE] {
            match unlinkat(&self.dir, name) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => problems.push(format!("{}: {e}", self.path.join(name).display())),
            }
        }
        // Remove the directory only if it is ours: created by this run, or
        // carrying one of the exporter's own names (left by an earlier run).
        // A directory an administrator made and configured as probe_dir
        // stays, so the next start does not need write access to its parent.
        let ours = self.created
            || self
                .path
                .file_name()
                .is_some_and(|n| n == PROBE_DIR_NAME || n == CHECK_DIR_NAME);
        if !ours {
            return problems;
        }
        // Only if the path still names the directory we hold: one that was
        // moved away leaves someone else's (or nothing) at the path.
        if !self.at_path().unwrap_or(false) {
            return problems;
        }
        match std::fs::remove_dir(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // A directory the user made for us and put other things in stays.
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && !self.created => {}
            Err(e) => problems.push(format!("{}: {e}", self.path.display())),
        }
        problems
    }
}

#[derive(Clone, Copy)]
enum Fill {
    Zero,
    Random,
}

/// Mode of every file the exporter creates: 0600.
const PRIVATE: Mode = Mode::RUSR.union(Mode::WUSR);

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

/// An 8 KiB buffer aligned for `O_DIRECT`, for the engines' reads.
pub type AlignedBuf = crate::sys::AlignedBuf<BLOCK_SIZE>;

/// The descriptor of a probe file, for the engines.
pub fn raw(f: &File) -> BorrowedFd<'_> {
    f.as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
        std::fs::write(p.join(READ_FILE), b"stale").unwrap();
        std::os::unix::fs::symlink(&victim, p.join(WAL_FILE)).unwrap();
        let e = ProbeDir::open(&p).unwrap_err();
        assert!(matches!(e, SetupError::Symlink { .. }), "{e}");
        assert_eq!(e.label(), "ELOOP");
        assert!(e.to_string().contains("victim"), "names the target: {e}");
        assert!(p.join(WAL_FILE).is_symlink(), "left for the operator");
        assert!(
            p.join(READ_FILE).exists(),
            "nothing removed before refusing"
        );
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        std::fs::remove_file(p.join(WAL_FILE)).unwrap();
        let pd = ProbeDir::open(&p).unwrap();
        assert!(!p.join(READ_FILE).exists(), "stale file removed");
        pd.create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        // Shutdown unlinks a link planted after setup, not its target.
        std::fs::remove_file(p.join(WAL_FILE)).unwrap();
        std::os::unix::fs::symlink(&victim, p.join(WAL_FILE)).unwrap();
        assert!(pd.remove_all().is_empty());
        assert!(!p.join(WAL_FILE).is_symlink());
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

    #[test]
    fn a_hard_link_at_the_lock_files_name_is_not_truncated() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("probe");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::hard_link(&victim, p.join(LOCK_FILE)).unwrap();
        let e = ProbeDir::open(&p).unwrap_err();
        assert_eq!(e.label(), "unsafe_dir", "{e}");
        assert!(e.to_string().contains("2 links"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn an_administrators_probe_dir_is_kept_ours_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let admin = tmp.path().join("made-by-admin");
        std::fs::create_dir(&admin).unwrap();
        std::fs::set_permissions(&admin, std::fs::Permissions::from_mode(0o700)).unwrap();
        let pd = ProbeDir::open(&admin).unwrap();
        pd.create_wal_file(1 << 20, SyncMethod::Fdatasync, 0)
            .unwrap();
        assert!(pd.remove_all().is_empty());
        assert!(admin.is_dir(), "kept");
        assert_eq!(std::fs::read_dir(&admin).unwrap().count(), 0, "but emptied");

        let leftover = tmp.path().join(PROBE_DIR_NAME);
        std::fs::create_dir(&leftover).unwrap();
        std::fs::set_permissions(&leftover, std::fs::Permissions::from_mode(0o700)).unwrap();
        let pd = ProbeDir::open(&leftover).unwrap();
        assert!(pd.remove_all().is_empty());
        assert!(!leftover.exists(), "an earlier run's directory is removed");
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

    #[test]
    fn aligned_buffer_is_aligned() {
        let b = AlignedBuf::new();
        assert_eq!(b.as_ptr() as usize % AlignedBuf::ALIGN, 0);
        assert_eq!(b.len(), 8192);
    }
}
