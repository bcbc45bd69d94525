//! io_uring engine.
//!
//! Reads go through the ring, as PostgreSQL 18 reads data files with
//! `io_method = io_uring`. Commit probes do not: PostgreSQL writes and syncs
//! WAL with plain syscalls under every `io_method`, and an io_uring fsync is
//! always handed to a kernel worker thread (there is no non-blocking
//! fsync), which added 12-24 % to the back-to-back commit latency and 40 %
//! to its CPU on the build machine. So both engines commit with
//! [`super::syscall::Committer`] (held by [`super::Engine`]).
//!
//! The ring and its read buffer are a [`crate::sys::UringReader`], which
//! never lets the buffer go while a read into it may still be in flight:
//! if the ring itself fails mid-operation it is poisoned and leaked
//! together with the buffer rather than freed.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::probe::settings::BLOCK_SIZE;
use crate::probe::{Cause, IoFailure};
use crate::sys::UringReader;
use crate::types::Op;

#[derive(Debug)]
pub(crate) struct UringEngine {
    reader: UringReader<BLOCK_SIZE>,
}

/// Why io_uring could not be set up, in words an operator can act on.
fn explain(e: &std::io::Error) -> String {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok());
    match (e.raw_os_error(), disabled) {
        (Some(libc::ENOSYS), _) => {
            "io_uring_setup returned ENOSYS: the kernel lacks io_uring or a seccomp profile hides it"
                .to_string()
        }
        (Some(libc::EPERM), Some(2)) => {
            "io_uring_setup returned EPERM: disabled by sysctl kernel.io_uring_disabled=2".to_string()
        }
        (Some(libc::EPERM), Some(1)) => "io_uring_setup returned EPERM: kernel.io_uring_disabled=1 \
             and this process is not in kernel.io_uring_group"
            .to_string(),
        (Some(libc::EPERM), _) => {
            "io_uring_setup returned EPERM: blocked by a seccomp profile or LSM (common in containers)"
                .to_string()
        }
        (Some(libc::ENOMEM), _) => {
            "io_uring_setup returned ENOMEM: RLIMIT_MEMLOCK too low for the ring".to_string()
        }
        _ => format!("io_uring_setup failed: {e}"),
    }
}

impl UringEngine {
    pub(crate) fn new() -> Result<UringEngine, String> {
        if std::env::var_os("PG_STORAGE_EXPORTER_DISABLE_IO_URING").is_some() {
            return Err("disabled by PG_STORAGE_EXPORTER_DISABLE_IO_URING".to_string());
        }
        let reader = UringReader::new().map_err(|e| explain(&e))?;
        Ok(UringEngine { reader })
    }

    /// True once the ring failed mid-operation: the kernel may still own
    /// the read buffer, so it and the ring were leaked (a few KiB, once per
    /// failure of the ring) and the engine must be rebuilt.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.reader.is_poisoned()
    }

    pub(crate) fn read(&mut self, fd: BorrowedFd<'_>, offset: u64) -> Result<Duration, IoFailure> {
        let fail = |cause| IoFailure {
            op: Op::Read,
            cause,
        };
        let (res, took) = self
            .reader
            .read(fd, offset)
            .map_err(|errno| fail(Cause::Errno(errno)))?;
        if res < 0 {
            return Err(fail(Cause::Errno(-res)));
        }
        if res as usize != BLOCK_SIZE {
            return Err(fail(Cause::Short));
        }
        Ok(took)
    }
}
