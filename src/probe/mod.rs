//! Storage probes: the only code that writes files, and only in its own
//! probe directory.
//!
//! A volume gets one dedicated OS thread (`runner`) that owns its probe
//! files (`files`) and an IO `engine` (io_uring, or plain syscalls when
//! io_uring is unavailable). A sync that hangs blocks only that thread; its
//! age is visible through `state::VolumeState` while it is in flight.

pub(crate) mod counts;
pub(crate) mod engine;
pub(crate) mod files;
pub mod fsinfo;
pub(crate) mod lock;
pub(crate) mod placement;
pub(crate) mod runner;
pub(crate) mod set;
pub mod settings;
pub(crate) mod state;
pub(crate) mod sweep;

use std::fmt;

use crate::errno::{self, Set};
use crate::types::Op;

/// One failed IO, labelled for `pgstorage_probe_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IoFailure {
    pub(crate) op: Op,
    pub(crate) cause: Cause,
}

/// Why an IO failed: an errno, or a result that was not an error but not a
/// full 8 KiB either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Errno(i32),
    Short,
}

impl Cause {
    /// Bounded label value: the errno's symbolic name, or `short_io`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Cause::Errno(e) => errno::name(Set::Io, e),
            Cause::Short => "short_io",
        }
    }
}

impl fmt::Display for IoFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            Cause::Errno(e) => write!(
                f,
                "{} failed: {} ({})",
                self.op,
                errno::name(Set::Io, e),
                std::io::Error::from_raw_os_error(e)
            ),
            Cause::Short => write!(f, "{} transferred less than 8 KiB", self.op),
        }
    }
}

/// xorshift64*: cheap, good enough to pick offsets and fill payloads so
/// compressing or deduplicating storage cannot shortcut the IO.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn seeded() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9_7F4A_7C15);
        Rng::new(t ^ u64::from(std::process::id()).rotate_left(32))
    }

    pub(crate) fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0); modulo bias is irrelevant at these sizes.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_labels_are_bounded_names() {
        assert_eq!(Cause::Errno(libc::EIO).label(), "EIO");
        assert_eq!(Cause::Errno(libc::ENOSPC).label(), "ENOSPC");
        assert_eq!(Cause::Errno(9999).label(), "other");
        assert_eq!(Cause::Short.label(), "short_io");
    }

    #[test]
    fn rng_covers_the_range() {
        let mut r = Rng::new(42);
        let mut seen = [false; 16];
        for _ in 0..1000 {
            seen[r.below(16) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        let mut buf = [0u8; 13];
        r.fill(&mut buf);
        assert!(buf.iter().any(|&b| b != 0));
    }
}
