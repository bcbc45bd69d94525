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
//! The engine owns its buffers and never returns while an SQE that points at
//! them may still be in flight; if the ring itself fails mid-operation it is
//! poisoned and leaked together with the buffers rather than freed.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};

use crate::probe::files::AlignedBuf;
use crate::probe::settings::BLOCK_SIZE;
use crate::probe::{Cause, IoFailure};
use crate::types::Op;

const READ: u64 = 3;

pub struct UringEngine {
    ring: Option<IoUring>,
    read_buf: AlignedBuf,
    poisoned: bool,
}

impl std::fmt::Debug for UringEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEngine")
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
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
    pub fn new() -> Result<UringEngine, String> {
        if std::env::var_os("PG_STORAGE_EXPORTER_DISABLE_IO_URING").is_some() {
            return Err("disabled by PG_STORAGE_EXPORTER_DISABLE_IO_URING".to_string());
        }
        // One thread submits and reaps (the probe thread that built the
        // engine), so the ring can defer completion work to the moment that
        // thread waits for it (DEFER_TASKRUN, Linux 6.1) instead of
        // interrupting it with task work: less CPU per IO. Older kernels
        // refuse the flags with EINVAL; a plain ring then works as before.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(4)
            .or_else(|_| IoUring::new(4))
            .map_err(|e| explain(&e))?;
        Ok(UringEngine {
            ring: Some(ring),
            read_buf: AlignedBuf::new(BLOCK_SIZE),
            poisoned: false,
        })
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Poisons the engine: the kernel may still own the read buffer, so it
    /// and the ring are leaked (a few KiB, once per failure of the ring).
    fn poison(&mut self, op: Op, errno: i32) -> IoFailure {
        self.poisoned = true;
        if let Some(ring) = self.ring.take() {
            std::mem::forget(ring);
        }
        let r = std::mem::replace(&mut self.read_buf, AlignedBuf::new(BLOCK_SIZE));
        std::mem::forget(r);
        IoFailure {
            op,
            cause: Cause::Errno(errno),
        }
    }

    /// Submits what is queued and reaps `want` completions, returning
    /// (user_data, result, reap time) in completion order.
    fn run(&mut self, op: Op, want: usize) -> Result<Vec<(u64, i32, Instant)>, IoFailure> {
        let mut out = Vec::with_capacity(want);
        let mut submitted = false;
        while out.len() < want {
            let Some(ring) = self.ring.as_mut() else {
                return Err(IoFailure {
                    op,
                    cause: Cause::Errno(libc::EBADF),
                });
            };
            let r = if submitted {
                ring.submitter().submit_and_wait(1)
            } else {
                ring.submit_and_wait(1)
            };
            match r {
                Ok(_) => submitted = true,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    // The SQEs were consumed if the kernel got that far; the
                    // next enter only waits.
                    submitted = ring.submission().is_empty();
                    continue;
                }
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(libc::EIO);
                    return Err(self.poison(op, errno));
                }
            }
            let now = Instant::now();
            let Some(ring) = self.ring.as_mut() else {
                continue;
            };
            for cqe in ring.completion() {
                out.push((cqe.user_data(), cqe.result(), now));
            }
        }
        Ok(out)
    }

    pub fn read(&mut self, fd: RawFd, offset: u64) -> Result<Duration, IoFailure> {
        let read = opcode::Read::new(types::Fd(fd), self.read_buf.as_mut_ptr(), BLOCK_SIZE as u32)
            .offset(offset)
            .build()
            .user_data(READ);
        let Some(ring) = self.ring.as_mut() else {
            return Err(IoFailure {
                op: Op::Read,
                cause: Cause::Errno(libc::EBADF),
            });
        };
        // SAFETY: read_buf is owned by self, aligned for O_DIRECT and stays
        // allocated until the completion is reaped (or forever if poisoned).
        if unsafe { ring.submission().push(&read) }.is_err() {
            return Err(IoFailure {
                op: Op::Read,
                cause: Cause::Errno(libc::EBUSY),
            });
        }
        let t0 = Instant::now();
        let done = self.run(Op::Read, 1)?;
        let Some(&(_, res, at)) = done.first() else {
            return Err(IoFailure {
                op: Op::Read,
                cause: Cause::Errno(libc::EIO),
            });
        };
        if res < 0 {
            return Err(IoFailure {
                op: Op::Read,
                cause: Cause::Errno(-res),
            });
        }
        if res as usize != BLOCK_SIZE {
            return Err(IoFailure {
                op: Op::Read,
                cause: Cause::Short,
            });
        }
        Ok(at - t0)
    }
}
