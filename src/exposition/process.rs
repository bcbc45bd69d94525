//! The standard `process_*` families every Prometheus client library
//! exports (CPU seconds, memory, file descriptors, start time, threads),
//! read from /proc/self through procfs at scrape time. /proc is the
//! kernel's memory, not a disk: reading it cannot wait on the storage the
//! probes measure. The prometheus-client crate has no process collector of
//! its own, and the separate crates for it target other client libraries.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::families::{counter, gauge};

#[derive(Debug)]
pub(crate) struct ProcessCollector {
    ticks: f64,
    page: f64,
    boot: Option<u64>,
    /// `/proc/self`, opened once: resolving it again on every scrape was
    /// an openat and a path walk through procfs, a tenth of a render's CPU
    /// (perf, 8 volumes). `None` when /proc cannot be read (hidepid).
    me: Option<procfs::process::Process>,
}

impl ProcessCollector {
    pub(crate) fn new() -> ProcessCollector {
        ProcessCollector {
            ticks: procfs::ticks_per_second() as f64,
            page: procfs::page_size() as f64,
            boot: procfs::boot_time_secs().ok(),
            me: procfs::process::Process::myself().ok(),
        }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

const NO_LABELS: [(&str, &str); 0] = [];

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A /proc read failing (a hardened /proc, hidepid) leaves the
        // families out; it never fails the scrape.
        let Some(me) = self.me.as_ref() else {
            return Ok(());
        };
        if let Ok(stat) = me.stat() {
            counter(
                &mut enc,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                [(NO_LABELS, (stat.utime + stat.stime) as f64 / self.ticks)],
            )?;
            gauge(
                &mut enc,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                [(NO_LABELS, stat.rss as f64 * self.page)],
            )?;
            gauge(
                &mut enc,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                [(NO_LABELS, stat.vsize as f64)],
            )?;
            if let Some(boot) = self.boot {
                gauge(
                    &mut enc,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    [(NO_LABELS, boot as f64 + stat.starttime as f64 / self.ticks)],
                )?;
            }
            gauge(
                &mut enc,
                "process_threads",
                "Number of OS threads in the process.",
                [(NO_LABELS, stat.num_threads as f64)],
            )?;
        }
        if let Ok(n) = me.fd_count() {
            gauge(
                &mut enc,
                "process_open_fds",
                "Number of open file descriptors.",
                [(NO_LABELS, n as f64)],
            )?;
        }
        // The soft limit from getrlimit(2), the value /proc/self/limits
        // prints: one syscall instead of formatting and parsing 17 lines
        // of text per scrape. Unlimited has no number to export.
        if let Some(n) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            gauge(
                &mut enc,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                [(NO_LABELS, n as f64)],
            )?;
        }
        Ok(())
    }
}
