//! IO engines: how a probe submits its IO.
//!
//! io_uring is what modern PostgreSQL (18's `io_method = io_uring`) and fio
//! use; it lets the write and the sync be submitted as one linked chain. Some
//! hosts forbid it (container seccomp profiles, `kernel.io_uring_disabled`),
//! so plain syscalls are always available as the fallback and give the same
//! latencies within noise: the device, not the submission path, dominates.

pub(crate) mod syscall;
pub(crate) mod uring;

use std::os::fd::BorrowedFd;
use std::time::Duration;

use thiserror::Error;

pub(crate) use self::syscall::CommitTiming;
use crate::probe::IoFailure;
use crate::types::{EngineChoice, EngineKind, SyncMethod};

/// io_uring was required but cannot be used.
#[derive(Debug, Error)]
#[error("io_uring is not available: {reason}")]
pub(crate) struct EngineUnavailable {
    pub(crate) reason: String,
}

/// An engine ready to probe, owning its buffers (so that IO still in flight
/// when something goes wrong can never write into freed memory). Reads go
/// through the chosen engine; commits are plain syscalls either way
/// ([`syscall::Committer`]).
#[derive(Debug)]
pub(crate) struct Engine {
    reads: Reads,
    commits: syscall::Committer,
}

#[derive(Debug)]
enum Reads {
    // Boxed: the ring is large and the engine is built once per volume.
    IoUring(Box<uring::UringEngine>),
    Sync(syscall::SyncEngine),
}

impl Engine {
    /// Builds the engine for `choice`. With `auto`, falls back to syscalls
    /// and returns why in the second field, for the log.
    pub(crate) fn new(choice: EngineChoice) -> Result<(Engine, Option<String>), EngineUnavailable> {
        let (reads, fallback) = match choice {
            EngineChoice::Sync => (Reads::Sync(syscall::SyncEngine::new()), None),
            EngineChoice::IoUring => uring::UringEngine::new()
                .map(|e| (Reads::IoUring(Box::new(e)), None))
                .map_err(|reason| EngineUnavailable { reason })?,
            EngineChoice::Auto => match uring::UringEngine::new() {
                Ok(e) => (Reads::IoUring(Box::new(e)), None),
                Err(reason) => (Reads::Sync(syscall::SyncEngine::new()), Some(reason)),
            },
        };
        let engine = Engine {
            reads,
            commits: syscall::Committer::new(),
        };
        Ok((engine, fallback))
    }

    pub(crate) fn kind(&self) -> EngineKind {
        match self.reads {
            Reads::IoUring(_) => EngineKind::IoUring,
            Reads::Sync(_) => EngineKind::Sync,
        }
    }

    /// Writes the next 8 KiB block at `offset` of the WAL probe file and
    /// makes it durable the way `method` says.
    pub(crate) fn commit(
        &mut self,
        fd: BorrowedFd<'_>,
        offset: u64,
        method: SyncMethod,
    ) -> Result<CommitTiming, IoFailure> {
        self.commits.commit(fd, offset, method)
    }

    /// One 8 KiB `O_DIRECT` read at `offset`.
    pub(crate) fn read(&mut self, fd: BorrowedFd<'_>, offset: u64) -> Result<Duration, IoFailure> {
        match &mut self.reads {
            Reads::IoUring(e) => e.read(fd, offset),
            Reads::Sync(e) => e.read(fd, offset),
        }
    }

    /// True when the engine can no longer be trusted (io_uring state lost)
    /// and must be rebuilt.
    pub(crate) fn is_poisoned(&self) -> bool {
        match &self.reads {
            Reads::IoUring(e) => e.is_poisoned(),
            Reads::Sync(_) => false,
        }
    }
}

/// Checks that io_uring can be used, for a fail-fast start when a volume
/// requires it.
pub(crate) fn require(choice: EngineChoice) -> Result<(), EngineUnavailable> {
    if choice == EngineChoice::IoUring {
        uring::UringEngine::new()
            .map(drop)
            .map_err(|reason| EngineUnavailable { reason })?;
    }
    Ok(())
}
