//! Fallback engine: pwrite + fdatasync/fsync, and pread on an `O_DIRECT`
//! descriptor. Exactly the calls PostgreSQL makes for WAL with the default
//! `io_method` before 18 and `wal_sync_method = fdatasync`.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::probe::files::AlignedBuf;
use crate::probe::settings::BLOCK_SIZE;
use crate::probe::{Cause, IoFailure, Rng};
use crate::types::{Op, SyncMethod};

#[derive(Debug)]
pub struct SyncEngine {
    read_buf: AlignedBuf,
}

impl Default for SyncEngine {
    fn default() -> Self {
        Self::new()
    }
}

fn retry_eintr(mut f: impl FnMut() -> isize) -> Result<isize, i32> {
    loop {
        let r = f();
        if r >= 0 {
            return Ok(r);
        }
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// The commit probe's state: the payload of the next WAL block and its
/// sequence number. The same for both engines (see [`Committer::commit`]).
#[derive(Debug)]
pub struct Committer {
    buf: Vec<u8>,
    seq: u64,
}

impl Default for Committer {
    fn default() -> Self {
        Self::new()
    }
}

impl Committer {
    pub fn new() -> Committer {
        let mut buf = vec![0u8; BLOCK_SIZE];
        Rng::seeded().fill(&mut buf);
        Committer { buf, seq: 0 }
    }

    /// One commit probe with plain syscalls: `pwrite` of the next block, then
    /// `fdatasync`/`fsync` when the method has a separate sync call. Both
    /// engines commit this way, because PostgreSQL does: it writes and syncs
    /// WAL with plain syscalls under every `io_method` (18's io_uring is for
    /// data-file reads), and io_uring has no non-blocking fsync, so it hands the
    /// sync to a kernel worker thread: one more wake-up per commit. Measured on
    /// the build machine, back to back: io_uring commits p50 97-100 µs at 35 µs
    /// of CPU each, these 78-89 µs at 21-22 µs.
    pub fn commit(
        &mut self,
        fd: RawFd,
        offset: u64,
        method: SyncMethod,
    ) -> Result<super::CommitTiming, IoFailure> {
        self.seq += 1;
        super::stamp(&mut self.buf, self.seq);
        let buf = &self.buf;
        let len = buf.len().min(BLOCK_SIZE);
        let fail = |op, cause| IoFailure { op, cause };
        let t0 = Instant::now();
        // SAFETY: buf is valid for reads of `len` bytes for the whole call (a
        // borrowed slice of at least that length), and pwrite only reads it.
        let n = retry_eintr(|| unsafe {
            libc::pwrite(fd, buf.as_ptr().cast(), len, offset as libc::off_t)
        })
        .map_err(|e| fail(Op::Write, Cause::Errno(e)))?;
        let t1 = Instant::now();
        if n as usize != BLOCK_SIZE {
            return Err(fail(Op::Write, Cause::Short));
        }
        if !method.has_sync_call() {
            let d = t1 - t0;
            return Ok(super::CommitTiming {
                write: d,
                sync: None,
                commit: d,
            });
        }
        // SAFETY: fdatasync/fsync take only a descriptor and touch no memory of
        // ours; a stale descriptor yields EBADF, never undefined behaviour.
        retry_eintr(|| unsafe {
            (if method == SyncMethod::Fdatasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }) as isize
        })
        .map_err(|e| fail(Op::Sync, Cause::Errno(e)))?;
        let t2 = Instant::now();
        Ok(super::CommitTiming {
            write: t1 - t0,
            sync: Some(t2 - t1),
            commit: t2 - t0,
        })
    }
}

impl SyncEngine {
    pub fn new() -> SyncEngine {
        SyncEngine {
            read_buf: AlignedBuf::new(BLOCK_SIZE),
        }
    }

    pub fn read(&mut self, fd: RawFd, offset: u64) -> Result<Duration, IoFailure> {
        let buf = self.read_buf.as_mut_ptr();
        let t0 = Instant::now();
        // SAFETY: read_buf is an aligned allocation of BLOCK_SIZE bytes owned by self.
        let n = retry_eintr(|| unsafe {
            libc::pread(fd, buf.cast(), BLOCK_SIZE, offset as libc::off_t)
        })
        .map_err(|e| IoFailure {
            op: Op::Read,
            cause: Cause::Errno(e),
        })?;
        let d = t0.elapsed();
        if n as usize != BLOCK_SIZE {
            return Err(IoFailure {
                op: Op::Read,
                cause: Cause::Short,
            });
        }
        Ok(d)
    }
}
