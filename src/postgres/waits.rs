//! Wait events from sampling: each sample of pg_stat_activity counts every
//! waiting backend for the time since the previous sample, so over time the
//! totals approach backend-seconds spent in each wait event.
//!
//! Names are PostgreSQL's own and differ across versions: 17 renamed many
//! IO and IPC events to CamelCase (`WALSync` → `WalSync`, `WALWrite` →
//! `WalWrite`, `WALInitSync` → `WalInitSync`, ...), and 17+ lets extensions
//! define their own `Extension` events. Labels are exported as the server
//! reports them; dashboards should match both spellings
//! (`wait_event=~"WALSync|WalSync"`). The label set is bounded: unknown
//! types become `Other`, and past [`MAX_EVENTS`] distinct events the rest
//! are counted as `other`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Distinct (type, event) pairs kept per cluster.
pub const MAX_EVENTS: usize = 400;

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

#[derive(Debug, Clone, Default)]
pub struct WaitTotals {
    /// Backend-seconds per (wait_event_type, wait_event).
    pub seconds: BTreeMap<(String, String), f64>,
    /// Backends waiting in the latest sample, per wait_event_type.
    pub now: BTreeMap<String, u64>,
    /// Backends whose wait state the role could not see in the latest
    /// sample (see `queries::waits`); `None` before the first sample of a
    /// session.
    pub hidden: Option<u64>,
    last: Option<Instant>,
}

impl WaitTotals {
    /// Adds one sample taken at `at`. The time attributed is the time since
    /// the previous sample, capped at twice the sampling interval so that a
    /// gap (server down, exporter paused) is not charged to whatever waits
    /// right after it; the first sample counts one interval.
    pub fn add(&mut self, at: Instant, interval: Duration, rows: &[(String, String, i64)]) {
        let dt = match self.last {
            Some(prev) => at.saturating_duration_since(prev).min(interval * 2),
            None => interval,
        }
        .as_secs_f64();
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
    pub fn pause(&mut self) {
        self.last = None;
        self.hidden = None;
        for v in self.now.values_mut() {
            *v = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: &str, e: &str, n: i64) -> (String, String, i64) {
        (t.into(), e.into(), n)
    }

    #[test]
    fn accumulates_backend_seconds_with_capped_gaps() {
        let t0 = Instant::now();
        let i = Duration::from_secs(1);
        let mut w = WaitTotals::default();
        w.add(t0, i, &[row("IO", "WalSync", 3)]);
        w.add(
            t0 + i,
            i,
            &[row("IO", "WalSync", 1), row("IO", "DataFileRead", 2)],
        );
        // 10 s gap: charged as 2 s only.
        w.add(t0 + i * 11, i, &[row("IO", "WalSync", 1)]);
        assert_eq!(w.seconds[&("IO".into(), "WalSync".into())], 3.0 + 1.0 + 2.0);
        assert_eq!(w.seconds[&("IO".into(), "DataFileRead".into())], 2.0);
        assert_eq!(w.now["IO"], 1);
    }

    #[test]
    fn label_set_is_bounded() {
        let t0 = Instant::now();
        let mut w = WaitTotals::default();
        let rows: Vec<_> = (0..MAX_EVENTS + 50)
            .map(|i| row("Extension", &format!("e{i}"), 1))
            .collect();
        w.add(t0, Duration::from_secs(1), &rows);
        w.add(t0, Duration::from_secs(1), &[row("Weird", "Thing", 1)]);
        assert!(w.seconds.len() <= MAX_EVENTS + 2, "{}", w.seconds.len());
        assert!(
            w.seconds
                .contains_key(&("Extension".into(), "other".into()))
        );
        assert!(w.seconds.contains_key(&("Other".into(), "other".into())));
    }
}
