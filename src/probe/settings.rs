//! What a probed volume is and how it is probed: `VolumeSpec` (identity,
//! place, limits) around one [`ProbeSettings`] (the knobs a `[[volume]]`,
//! `[defaults]` and the `--probe.*` flags share), and `RANGES`, the one
//! table of their allowed values. The configuration, discovery and `check`
//! build specs from here; nothing here knows where a value was written.

use std::path::PathBuf;
use std::time::Duration;

use crate::model::pacing::{CommitBurstPlan, ReadBurstPlan};
use crate::types::{EngineChoice, SyncMethod};
use crate::units::{fmt_bytes, fmt_duration};

/// The IO size PostgreSQL uses for WAL and heap pages (BLCKSZ).
pub(crate) const BLOCK_SIZE: usize = 8192;
/// A WAL segment is 16 MiB by default; the WAL probe cycles through one.
pub(crate) const WAL_FILE_SIZE: u64 = 16 << 20;
/// Probe directory created inside a volume path when none is configured.
pub(crate) const PROBE_DIR_NAME: &str = "pg-storage-exporter-probe";
/// Where `check` probes when given no probe directory: its own name, so a
/// `check` never touches a running exporter's files.
pub(crate) const CHECK_DIR_NAME: &str = "pg-storage-exporter-check";
/// Samples one window may hold per op; bounds memory at about 2.4-3.2 MB
/// per (op, phase) window (24-32 bytes a sample: its time in arrival order
/// and its value in the sorted copy the quantiles are read from).
pub(crate) const MAX_WINDOW_SAMPLES: u64 = 100_000;
/// Commit probes in one burst. The first half warms the device path up and
/// is not recorded: on the build machine a burst's commits after a 1 s
/// pause took about 530, 190, 170, 140, 130 µs, and reached the back-to-back
/// figure (±10 %) only after about eight.
pub const BURST_COMMITS: u32 = 24;
/// How a burst's commits run: at least [`BURST_COMMITS`]; a burst that
/// meets a throttle's wait goes on for a second after it (ten slices of a
/// v1 blkio throttle; a cloud volume's accounting period may be longer,
/// and then the burst holds at least one whole period), at most 256
/// commits. Why: [`CommitBurstPlan`]. The next burst waits the longer in
/// proportion, so the bursts' share of the device writes stays as
/// configured.
pub(crate) const COMMIT_BURST: CommitBurstPlan = CommitBurstPlan {
    least: BURST_COMMITS,
    span: Duration::from_secs(1),
    most: 256,
};
/// How a burst's reads, after its commits, are recorded: 32 warm-up reads
/// (reads need longer to converge than commits: about 30 on the build
/// machine), then every read that starts within 8 ms of the first recorded
/// one, at least 16 (a slow disk) and at most 512 (a cache). Reads cost no
/// device write. At the build machine's 70-110 µs that is 70-115 recorded
/// reads per burst; why a span and not a count: [`ReadBurstPlan`].
pub(crate) const BURST_READS: ReadBurstPlan = ReadBurstPlan {
    warm_up: 32,
    span: Duration::from_millis(8),
    min: 16,
    max: 512,
};

/// The idle time before a lone (after-idle) commit at probe interval
/// `interval`. The daemon runs its burst three quarters into a round, so the
/// next lone commit comes a quarter interval after the burst's last IO (and
/// half an interval after the lone read otherwise); `check` pauses this long
/// at the default interval before each of its lone commits, so both report
/// the same "after a pause". The after-idle cost grows with the pause and
/// levels off within about 50 ms on the build machine: a quarter of the
/// default second is well past that.
pub(crate) fn after_idle_pause(interval: Duration) -> Duration {
    interval / 4
}

/// The per-volume probe knobs, with their defaults in [`Default`].
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSettings {
    pub(crate) commit_probe: bool,
    pub(crate) read_probe: bool,
    /// Time between lone probes (the after-idle figure).
    pub interval: Duration,
    /// A probe in flight longer than this is reported as hung.
    pub(crate) timeout: Duration,
    pub read_file_size: u64,
    pub sync_method: SyncMethod,
    /// Never let the probe files push a volume below this much free space.
    pub free_space_reserve: u64,
    pub engine: EngineChoice,
    /// Reads faster than this did not reach a device.
    pub(crate) cache_served_threshold: Duration,
    /// Queue-depth sweep period; zero = off.
    pub(crate) sweep_every: Duration,
    pub sweep_duration: Duration,
    /// How often a burst runs for the busy figure; zero = no bursts (no
    /// busy figure).
    pub busy_every: Duration,
}

impl Default for ProbeSettings {
    fn default() -> Self {
        ProbeSettings {
            commit_probe: true,
            read_probe: true,
            // The lone probes are most of the exporter's own CPU: on a
            // 2-vCPU virtual machine a round (a commit, then a read half an
            // interval later) took about 450 µs of the probe thread's CPU,
            // six wakeups, so 13.5 ms a minute at 2 s. At 3 s that is 9,
            // and a 15 min window still holds 300 after-idle samples.
            interval: Duration::from_secs(3),
            timeout: Duration::from_secs(10),
            // Big enough that random 8 KiB reads rarely hit the same block
            // twice in a window, small enough to write at start on any volume.
            read_file_size: 64 << 20,
            sync_method: SyncMethod::default(),
            // Never let the probe files push a PostgreSQL volume into its
            // last GiB.
            free_space_reserve: 1 << 30,
            engine: EngineChoice::default(),
            // Flash needs tens of µs for an 8 KiB read; a hypervisor cache
            // answered in 668 ns (published figures in docs/storage-facts.md).
            cache_served_threshold: Duration::from_micros(5),
            sweep_every: Duration::ZERO,
            // 2 s per depth: long enough for a steady figure at depth 64.
            // 2 s per depth of the 14 (four workloads): a v1 blkio
            // throttle releases IO in 100 ms slices, and half-second depths
            // measured a 10 MiB/s cap 15 % off.
            sweep_duration: Duration::from_secs(28),
            // With a burst of BURST_COMMITS commits this adds 0.6 commits per
            // second to the lone probe's third. On the build machine's ext4 a
            // commit probe cost 2.27 device writes (two of its own and a
            // share of the journal thread's), so 0.93 commits per second are
            // 2.1 device writes per second per volume, under a budget of 4
            // (at the earlier 1 s interval a burst every 30 s measured 4.08).
            busy_every: Duration::from_secs(40),
        }
    }
}

/// One volume to probe, fully resolved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VolumeSpec {
    pub(crate) name: String,
    /// The directory whose storage is measured.
    pub(crate) path: PathBuf,
    /// Where probe files live: on the same filesystem as `path`.
    pub(crate) probe_dir: PathBuf,
    pub(crate) probe: ProbeSettings,
    /// Provisioned (cloud) limits: (resource label, value).
    pub(crate) provisioned: Vec<(crate::types::Resource, u64)>,
    /// A configured cgroup path whose limits apply.
    pub(crate) cgroup: Option<String>,
}

/// The part of a [`VolumeSpec`] only the IO limits collector reads: a
/// reload that changes nothing else updates it on the running volume.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct VolumeLimits {
    pub(crate) provisioned: Vec<(crate::types::Resource, u64)>,
    pub(crate) cgroup: Option<String>,
}

/// How a volume's spec changed between two configurations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpecChange {
    Same,
    /// Only [`VolumeLimits`] changed: the probe runs as before, so its
    /// thread, window and counters can stay.
    LimitsOnly,
    /// Something the probe thread uses changed: it must be restarted.
    Probe,
}

impl VolumeSpec {
    pub(crate) fn limits(&self) -> VolumeLimits {
        VolumeLimits {
            provisioned: self.provisioned.clone(),
            cgroup: self.cgroup.clone(),
        }
    }

    /// What changed from `self` to `new`. Everything but the limits counts
    /// as probe-affecting, including any field added later: the limits
    /// are blanked on copies and the rest compared whole, so a new field
    /// restarts the volume until someone decides it need not.
    pub(crate) fn change_to(&self, new: &VolumeSpec) -> SpecChange {
        if self == new {
            return SpecChange::Same;
        }
        let probe_part = |s: &VolumeSpec| VolumeSpec {
            provisioned: Vec::new(),
            cgroup: None,
            ..s.clone()
        };
        if probe_part(self) == probe_part(new) {
            SpecChange::LimitsOnly
        } else {
            SpecChange::Probe
        }
    }
}

/// A knob with a bounded value. Every source of a value (file, flag,
/// default for discovery, `check`) checks it against [`RANGES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Knob {
    Interval,
    Timeout,
    ReadFileSize,
    CacheServedThreshold,
    SweepEvery,
    SweepDuration,
    BusyEvery,
    Window,
    ShutdownTimeout,
    LimitsInterval,
    ScrapeInterval,
    WaitSamplingInterval,
    StatementTimeout,
    AuditInterval,
}

/// The allowed values of one knob.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Range {
    pub(crate) knob: Knob,
    /// The config file key (also named in flag errors).
    pub(crate) key: &'static str,
    pub(crate) min: u64,
    pub(crate) max: u64,
    /// 0 is allowed and means "off" even though it is below `min`.
    pub(crate) zero_is_off: bool,
    /// The message for a value below `min` when the bound has a reason
    /// worth telling ("too short: ..."); else "out of range: use A to B".
    pub(crate) below: &'static str,
    /// The same for a value above `max`.
    pub(crate) above: &'static str,
}

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

/// Durations in nanoseconds, sizes in bytes.
pub(crate) const RANGES: &[Range] = &[
    Range {
        knob: Knob::Interval,
        key: "interval",
        min: MS,
        max: 3600 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::Timeout,
        key: "timeout",
        min: 10 * MS,
        max: u64::MAX,
        zero_is_off: false,
        below: "too short: a healthy network volume can take 10 ms",
        above: "",
    },
    Range {
        knob: Knob::ReadFileSize,
        key: "read_file_size",
        min: 1 << 20,
        max: 1 << 40,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::CacheServedThreshold,
        key: "cache_served_threshold",
        min: 0,
        max: MS,
        zero_is_off: false,
        below: "",
        above: "too long: devices answer 8 KiB reads in tens of µs; use at most 1ms",
    },
    Range {
        knob: Knob::SweepEvery,
        key: "sweep_every",
        min: 60 * S,
        max: u64::MAX,
        zero_is_off: true,
        below: "too often: a sweep loads the device; use 0s (off) or at least 1m",
        above: "",
    },
    Range {
        knob: Knob::SweepDuration,
        key: "sweep_duration",
        min: S,
        max: 300 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::BusyEvery,
        key: "busy_every",
        min: 5 * S,
        max: 3600 * S,
        zero_is_off: true,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::Window,
        key: "window",
        min: 10 * S,
        max: 24 * 3600 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::ShutdownTimeout,
        key: "shutdown_timeout",
        min: 100 * MS,
        max: 300 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::LimitsInterval,
        key: "limits_interval",
        min: 200 * MS,
        max: 600 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        // The audit reads a few dozen small files and pg_settings rows;
        // a second is short enough for tests, a day long enough for anyone.
        knob: Knob::AuditInterval,
        key: "audit_interval",
        min: S,
        max: 86_400 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::ScrapeInterval,
        key: "scrape_interval",
        min: 100 * MS,
        max: 3600 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::WaitSamplingInterval,
        key: "wait_sampling_interval",
        min: 100 * MS,
        max: 3600 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
    Range {
        knob: Knob::StatementTimeout,
        key: "statement_timeout",
        min: 100 * MS,
        max: 3600 * S,
        zero_is_off: false,
        below: "",
        above: "",
    },
];

impl Knob {
    pub(crate) fn range(self) -> &'static Range {
        // Every knob has a row: the unit test `every_knob_has_one_row`
        // keeps it so; the first row is a harmless fallback.
        RANGES.iter().find(|r| r.knob == self).unwrap_or(&RANGES[0])
    }

    fn is_size(self) -> bool {
        matches!(self, Knob::ReadFileSize)
    }

    /// Checks a duration knob. The error says why, without the value
    /// (callers put the value and where it came from in front).
    pub(crate) fn check_duration(self, d: Duration) -> Result<Duration, String> {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.check_raw(n).map(|_| d)
    }

    /// Checks a size knob.
    pub(crate) fn check_bytes(self, b: u64) -> Result<u64, String> {
        self.check_raw(b)?;
        if self == Knob::ReadFileSize && b % BLOCK_SIZE as u64 != 0 {
            return Err("not a multiple of 8KiB, the read size".to_string());
        }
        Ok(b)
    }

    fn check_raw(self, v: u64) -> Result<(), String> {
        let r = self.range();
        if (r.zero_is_off && v == 0) || (r.min..=r.max).contains(&v) {
            return Ok(());
        }
        if v < r.min && !r.below.is_empty() {
            return Err(r.below.to_string());
        }
        if v > r.max && !r.above.is_empty() {
            return Err(r.above.to_string());
        }
        let show = |n: u64| {
            if self.is_size() {
                fmt_bytes(n)
            } else {
                fmt_duration(Duration::from_nanos(n))
            }
        };
        Err(if r.zero_is_off {
            format!(
                "out of range: use 0s (off) or {} to {}",
                show(r.min),
                show(r.max)
            )
        } else {
            format!("out of range: use {} to {}", show(r.min), show(r.max))
        })
    }

    /// Checks a duration and phrases the error as the config file does:
    /// `7200s is out of range: use 1ms to 1h`.
    pub(crate) fn check_written(self, d: Duration) -> Result<Duration, String> {
        self.check_duration(d).map_err(|m| format!("{d:?} is {m}"))
    }

    /// The same for a size.
    pub(crate) fn check_written_bytes(self, b: u64) -> Result<u64, String> {
        self.check_bytes(b).map_err(|m| {
            if m.starts_with("not a multiple") {
                format!("{b} bytes is {m}")
            } else {
                format!("{} is {m}", fmt_bytes(b))
            }
        })
    }
}

/// Bursts whose busy samples the window must hold before a rate (a commit
/// ceiling, PostgreSQL's sync against the probe's) is derived from them.
/// On a virtual machine one burst is one moment of the host: within one
/// hour on one host the median commit of single bursts ranged from 201 to
/// 695 µs, and a ceiling read from one burst at 319 µs came out below what
/// one pgbench client committed. Three bursts take the median over three
/// moments. A window too short to hold three needs as many as it can hold
/// ([`rate_min_samples`]).
pub(crate) const RATE_BURSTS: u32 = 3;

/// Bursts the window must hold before rates derive from them:
/// [`RATE_BURSTS`], or as many as the window is sure to hold, at least one
/// (see [`rate_min_samples`]). Counted as well as the samples because a
/// burst that met a throttle's cycles, or stalls of a busy host that look
/// like them, runs on and records up to [`COMMIT_BURST`]`.most` commits:
/// one such burst holds three bursts' worth of samples but is still one
/// moment. `None` when bursts are off.
pub(crate) fn rate_min_bursts(
    window: Duration,
    busy_every: Duration,
    interval: Duration,
    slowdown: f64,
) -> Option<usize> {
    if busy_every.is_zero() {
        return None;
    }
    let period = (busy_every + interval).as_secs_f64() * slowdown.max(1.0) + 2.0;
    let fit = (window.as_secs_f64() / period).floor();
    Some(fit.clamp(1.0, f64::from(RATE_BURSTS)) as usize)
}

/// Busy samples of one op the window must hold before rates derive from
/// them: [`RATE_BURSTS`] bursts' worth, or as many bursts as the window is
/// sure to hold, at least one. A window of length W always holds
/// floor(W / period) bursts that come one per period; the period is
/// `busy_every` plus up to one `interval` (a burst waits for its place in
/// the round) plus the burst itself, all stretched by `slowdown`, so it is
/// taken as (`busy_every` + `interval`) × `slowdown` + 2 s. Counting on
/// more would make the ceilings come and go as bursts leave the window.
/// A burst records half of its [`BURST_COMMITS`] commits and at least
/// [`ReadBurstPlan::min`] reads. `None` when bursts are off: there is no
/// busy figure to wait for.
pub(crate) fn rate_min_samples(
    read: bool,
    window: Duration,
    busy_every: Duration,
    interval: Duration,
    slowdown: f64,
) -> Option<usize> {
    let bursts = rate_min_bursts(window, busy_every, interval, slowdown)?;
    let per_burst = if read {
        BURST_READS.min as usize
    } else {
        (BURST_COMMITS / 2) as usize
    };
    Some(bursts * per_burst)
}

/// The most samples one (op, phase) window holds: the lone probes' or, for
/// the busy phase, the most reads each burst can record.
pub(crate) fn window_samples(window: Duration, interval: Duration, busy_every: Duration) -> f64 {
    let w = window.as_secs_f64();
    let lone = w / interval.as_secs_f64().max(1e-9);
    let busy = if busy_every.is_zero() {
        0.0
    } else {
        w / busy_every.as_secs_f64() * f64::from(BURST_READS.most_recorded())
    };
    lone.max(busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_wait_for_three_bursts_or_what_the_window_holds() {
        let s = Duration::from_secs;
        let need = |read, window, every, slowdown| {
            rate_min_samples(read, s(window), s(every), s(1), slowdown)
        };
        // Defaults: a 15 min window, a burst every 40 s (about 43 s apart).
        assert_eq!(need(false, 900, 40, 1.0), Some(36));
        assert_eq!(need(true, 900, 40, 1.0), Some(48));
        // A 1 min window is sure of one burst.
        assert_eq!(need(false, 60, 40, 1.0), Some(12));
        // 2 min: three exactly 40 s apart would fit, but bursts come a
        // little later than that, so only two are sure.
        assert_eq!(need(false, 120, 40, 1.0), Some(24));
        assert_eq!(need(false, 130, 40, 1.0), Some(36));
        // Stretched 2x under a write cap: about 84 s apart, two in 3 min.
        assert_eq!(need(false, 180, 40, 2.0), Some(24));
        // A window shorter than one burst period still needs one burst.
        assert_eq!(need(false, 10, 40, 1.0), Some(12));
        assert_eq!(need(false, 900, 0, 1.0), None);
    }

    #[test]
    fn after_idle_pause_is_a_quarter_interval() {
        assert_eq!(
            after_idle_pause(ProbeSettings::default().interval),
            Duration::from_millis(750)
        );
        assert_eq!(
            after_idle_pause(Duration::from_secs(10)),
            Duration::from_millis(2500)
        );
    }

    #[test]
    fn every_knob_has_one_row() {
        use Knob::*;
        for k in [
            Interval,
            Timeout,
            ReadFileSize,
            CacheServedThreshold,
            SweepEvery,
            SweepDuration,
            BusyEvery,
            Window,
            ShutdownTimeout,
            LimitsInterval,
            ScrapeInterval,
            WaitSamplingInterval,
            StatementTimeout,
            AuditInterval,
        ] {
            assert_eq!(RANGES.iter().filter(|r| r.knob == k).count(), 1, "{k:?}");
        }
    }

    #[test]
    fn ranges_name_the_bounds_and_the_reason() {
        let e = Knob::Timeout
            .check_written(Duration::from_millis(5))
            .unwrap_err();
        assert_eq!(
            e,
            "5ms is too short: a healthy network volume can take 10 ms"
        );
        assert_eq!(
            Knob::Interval.check_written(Duration::from_secs(7200)),
            Err("7200s is out of range: use 1ms to 1h".to_string())
        );
        assert!(Knob::BusyEvery.check_duration(Duration::ZERO).is_ok());
        assert_eq!(
            Knob::BusyEvery.check_duration(Duration::from_secs(1)),
            Err("out of range: use 0s (off) or 5s to 1h".to_string())
        );
        assert!(Knob::Interval.check_duration(Duration::ZERO).is_err());
        let e = Knob::SweepEvery
            .check_written(Duration::from_secs(30))
            .unwrap_err();
        assert!(e.starts_with("30s is too often"), "{e}");
        assert!(Knob::ReadFileSize.check_bytes(64 << 20).is_ok());
        let e = Knob::ReadFileSize
            .check_written_bytes((1 << 20) + 1)
            .unwrap_err();
        assert_eq!(e, "1048577 bytes is not a multiple of 8KiB, the read size");
        let e = Knob::ReadFileSize
            .check_written_bytes(100 << 10)
            .unwrap_err();
        assert_eq!(e, "100KiB is out of range: use 1MiB to 1TiB");
    }
}
