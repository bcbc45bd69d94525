//! The row type of each view the collector reads, and the wait-event
//! totals its samples add up to: what a cluster's snapshot holds. Apart
//! from the views' SQL and encoders because the snapshot holds them and
//! the encoders read the snapshot, so one file with both would make the
//! snapshot and that view depend on each other.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One setting of pg_settings (`settings.rs`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Setting {
    pub(crate) name: String,
    pub(crate) value: String,
    /// In base units (bytes, seconds), booleans as 0/1; `None` for enums
    /// and strings.
    pub(crate) numeric: Option<f64>,
    /// Where the value comes from (`default`, `configuration file`, ...).
    pub(crate) source: String,
    /// Changed in the configuration but waiting for a restart.
    pub(crate) pending_restart: bool,
}

/// One row of pg_stat_io (`io.rs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct IoRow {
    pub(crate) backend_type: String,
    pub(crate) object: String,
    pub(crate) context: String,
    /// read, write, writeback, extend, hit, eviction, reuse, fsync.
    pub(crate) ops: Vec<IoOp>,
}

/// One op column group of a pg_stat_io row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct IoOp {
    pub(crate) op: &'static str,
    pub(crate) count: Option<f64>,
    pub(crate) seconds: Option<f64>,
    pub(crate) bytes: Option<f64>,
}

/// WAL generated, written and synced (`wal.rs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WalStats {
    pub(crate) syncs: Option<f64>,
    pub(crate) sync_seconds: Option<f64>,
    pub(crate) writes: Option<f64>,
    pub(crate) write_seconds: Option<f64>,
    pub(crate) records: Option<f64>,
    pub(crate) fpi: Option<f64>,
    pub(crate) bytes: Option<f64>,
    pub(crate) buffers_full: Option<f64>,
    /// Seconds since pg_stat_wal's statistics were reset (at the first
    /// start, after a crash, or by pg_stat_reset_shared): the span its
    /// counters cover.
    pub(crate) seconds_since_reset: Option<f64>,
}

/// pg_stat_database summed over all databases (`database.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Transactions {
    pub(crate) commits: Option<f64>,
    pub(crate) rollbacks: Option<f64>,
    /// The next transaction id to be assigned; None in recovery.
    pub(crate) next_xid: Option<f64>,
}

/// Checkpoints and the background writer (`checkpoints.rs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Checkpoints {
    pub(crate) timed: Option<f64>,
    pub(crate) requested: Option<f64>,
    pub(crate) write_seconds: Option<f64>,
    pub(crate) sync_seconds: Option<f64>,
    pub(crate) buffers_written: Option<f64>,
    pub(crate) bgwriter_buffers_clean: Option<f64>,
    pub(crate) bgwriter_maxwritten_clean: Option<f64>,
    pub(crate) buffers_alloc: Option<f64>,
    /// Up to 16 only: writes and fsyncs backends had to do themselves.
    pub(crate) backend_buffers_written: Option<f64>,
    pub(crate) backend_fsyncs: Option<f64>,
}

/// Distinct (type, event) pairs kept per cluster.
pub(crate) const MAX_EVENTS: usize = 400;

const TYPES: &[&str] = &[
    "Activity",
    "BufferPin",
    "Client",
    "Extension",
    "InjectionPoint",
    "IO",
    "IPC",
    "Lock",
    "LWLock",
    "Timeout",
];

/// What one sample of pg_stat_activity stands for, fixed when it was
/// scheduled (`activity::Schedule`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Planned {
    /// The time from the previous sample to this one, as scheduled.
    pub(crate) gap: Duration,
    /// The backend-seconds each backend waiting in this sample adds when
    /// the sample comes on time: one sampling interval divided by the
    /// chance that this interval was sampled, so that on average the
    /// totals are what a sample every interval would have added. The gap
    /// itself while sampling every interval.
    pub(crate) weight: Duration,
}

impl Planned {
    /// A sample every `interval`: it stands for its gap.
    pub(crate) fn every(interval: Duration) -> Planned {
        Planned {
            gap: interval,
            weight: interval,
        }
    }
}

/// Backend-seconds in each wait event, from the pg_stat_activity samples
/// (`activity.rs`).
#[derive(Debug, Clone, Default)]
pub(crate) struct WaitTotals {
    /// Backend-seconds per (wait_event_type, wait_event).
    pub(crate) seconds: BTreeMap<(String, String), f64>,
    /// Backends waiting in the latest sample, per wait_event_type.
    pub(crate) now: BTreeMap<String, u64>,
    /// Backends whose wait state the role could not see in the latest
    /// sample (see `SQL`); `None` before the first sample of a
    /// session.
    pub(crate) hidden: Option<u64>,
    /// The mean time to the next sample, as the latest sample left it
    /// (`activity::Schedule`); `None` before the first sample of a session.
    pub(crate) interval: Option<Duration>,
    last: Option<Instant>,
}

impl WaitTotals {
    /// Adds one sample taken at `at`, planned as `planned`. Each waiting
    /// backend adds the sample's weight, stretched by how late the sample
    /// came against its gap (a slow query, an exporter paused) up to
    /// twice, so that a gap (server down, exporter stalled) is not charged
    /// to whatever waits right after it; the first sample of a session
    /// adds its weight. Sampling every interval, that is the time since
    /// the previous sample, capped at twice the interval.
    pub(crate) fn add(&mut self, at: Instant, planned: Planned, rows: &[(String, String, i64)]) {
        let late = match self.last {
            Some(prev) if !planned.gap.is_zero() => {
                (at.saturating_duration_since(prev).as_secs_f64() / planned.gap.as_secs_f64())
                    .min(2.0)
            }
            _ => 1.0,
        };
        let dt = planned.weight.as_secs_f64() * late;
        self.last = Some(at);
        for v in self.now.values_mut() {
            *v = 0;
        }
        for (t, e, n) in rows {
            let n = (*n).max(0) as u64;
            let ty = if TYPES.contains(&t.as_str()) {
                t.clone()
            } else {
                "Other".to_string()
            };
            *self.now.entry(ty.clone()).or_default() += n;
            let key = (ty.clone(), e.clone());
            let key = if self.seconds.contains_key(&key) || self.seconds.len() < MAX_EVENTS {
                key
            } else {
                (ty, "other".to_string())
            };
            *self.seconds.entry(key).or_default() += dt * n as f64;
        }
    }

    /// Forgets the sampling clock (after an outage), keeping the totals:
    /// they are counters and must not go backwards.
    pub(crate) fn pause(&mut self) {
        self.last = None;
        self.hidden = None;
        self.interval = None;
        for v in self.now.values_mut() {
            *v = 0;
        }
    }
}
