//! Fallback engine: pwrite + fdatasync/fsync, and pread on an `O_DIRECT`
//! descriptor. Exactly the calls PostgreSQL makes for WAL with the default
//! `io_method` before 18 and `wal_sync_method = fdatasync`.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::probe::settings::BLOCK_SIZE;
use crate::probe::{Cause, IoFailure, Rng};
use crate::types::{Op, SyncMethod};

/// An 8 KiB buffer aligned for `O_DIRECT`, for the reads.
type AlignedBuf = crate::sys::AlignedBuf<BLOCK_SIZE>;

/// Timings of one commit probe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CommitTiming {
    pub(crate) write: Duration,
    /// `None` when the sync method has no separate sync call.
    pub(crate) sync: Option<Duration>,
    pub(crate) commit: Duration,
}

#[derive(Debug)]
pub(crate) struct SyncEngine {
    read_buf: AlignedBuf,
}

impl Default for SyncEngine {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `f` again while it fails with EINTR; any other failure is returned
/// as its errno, which becomes the error label.
fn retry_eintr<T>(mut f: impl FnMut() -> rustix::io::Result<T>) -> Result<T, i32> {
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.raw_os_error()),
        }
    }
}

/// The commit probe's state: the payload of the next WAL block and its
/// sequence number. The same for both engines (see [`Committer::commit`]).
#[derive(Debug)]
pub(crate) struct Committer {
    buf: Vec<u8>,
    seq: u64,
}

impl Default for Committer {
    fn default() -> Self {
        Self::new()
    }
}

impl Committer {
    pub(crate) fn new() -> Committer {
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
    pub(crate) fn commit(
        &mut self,
        fd: BorrowedFd<'_>,
        offset: u64,
        method: SyncMethod,
    ) -> Result<CommitTiming, IoFailure> {
        self.seq += 1;
        stamp(&mut self.buf, self.seq);
        let buf = &self.buf[..self.buf.len().min(BLOCK_SIZE)];
        let fail = |op, cause| IoFailure { op, cause };
        let t0 = Instant::now();
        let n = retry_eintr(|| rustix::io::pwrite(fd, buf, offset))
            .map_err(|e| fail(Op::Write, Cause::Errno(e)))?;
        let t1 = Instant::now();
        if n != BLOCK_SIZE {
            return Err(fail(Op::Write, Cause::Short));
        }
        if !method.has_sync_call() {
            let d = t1 - t0;
            return Ok(CommitTiming {
                write: d,
                sync: None,
                commit: d,
            });
        }
        retry_eintr(|| {
            if method == SyncMethod::Fdatasync {
                rustix::fs::fdatasync(fd)
            } else {
                rustix::fs::fsync(fd)
            }
        })
        .map_err(|e| fail(Op::Sync, Cause::Errno(e)))?;
        let t2 = Instant::now();
        Ok(CommitTiming {
            write: t1 - t0,
            sync: Some(t2 - t1),
            commit: t2 - t0,
        })
    }
}

impl SyncEngine {
    pub(crate) fn new() -> SyncEngine {
        SyncEngine {
            read_buf: AlignedBuf::new(),
        }
    }

    pub(crate) fn read(&mut self, fd: BorrowedFd<'_>, offset: u64) -> Result<Duration, IoFailure> {
        let buf = self.read_buf.as_mut_slice();
        let t0 = Instant::now();
        let n =
            retry_eintr(|| rustix::io::pread(fd, &mut *buf, offset)).map_err(|e| IoFailure {
                op: Op::Read,
                cause: Cause::Errno(e),
            })?;
        let d = t0.elapsed();
        if n != BLOCK_SIZE {
            return Err(IoFailure {
                op: Op::Read,
                cause: Cause::Short,
            });
        }
        Ok(d)
    }
}

/// Fills the payload of the next WAL block: random bytes (so compression
/// and dedup cannot skip the write) stamped with a sequence number.
fn stamp(buf: &mut [u8], seq: u64) {
    if buf.len() >= 8 {
        buf[..8].copy_from_slice(&seq.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_aligned() {
        let b = AlignedBuf::new();
        assert_eq!(
            b.as_slice().as_ptr() as usize % crate::sys::DIRECT_IO_ALIGN,
            0
        );
        assert_eq!(b.as_slice().len(), 8192);
    }
}
