//! Which write-IOPS cap sets a volume's `cap` commit ceiling, and how many
//! device writes one commit is taken to cost under it.
//!
//! A commit waits for its WAL write and sync, and a cap on device writes
//! lets at most cap ÷ (device writes per commit) such commits through per
//! second, however fast the device is. Every cap the exporter knows of
//! takes part:
//!
//! - `cgroup`: a throttle in the cgroup of the postmaster using the volume
//!   (or a configured cgroup, or the exporter's own for volumes of no
//!   cluster), read from the kernel: it delays exactly the IOs of the
//!   processes that commit.
//! - `provisioned`: what the configuration says the volume allows (a cloud
//!   volume's `write_iops`, or its `iops` for reads and writes together,
//!   as EBS gp3 and io2 count them). It applies to the whole disk, so to
//!   every commit on it. A combined `iops` cap lets writes reach it only
//!   when nothing reads, so as a bound on writes it can only be too high:
//!   the safe side for a ceiling that must not fall below a real rate.
//! - `detected`: the write-IOPS plateau of the volume's latest queue-depth
//!   sweep (8 KiB `O_DIRECT` writes, one device write each), measured with
//!   the exporter's own IO. It is what the exporter's IO gets, the same
//!   vantage point as the commit probe, whatever enforces the cap (a
//!   hidden cgroup, the hypervisor): the only source of a cap nobody
//!   declared.
//!
//! The binding one is the tightest: a commit is held back by every cap it
//! passes through, so the lowest of them sets the rate. On a tie the one
//! read from the kernel is named first, then the configured one, then the
//! measured one.

use crate::model::ceiling::{RATE_HEADROOM, capped_ceiling};
use crate::model::pacing::DEFAULT_WRITES_PER_COMMIT;
use crate::types::Resource;

/// The sources of caps that bound the device writes of a volume's commits,
/// as `pgstorage_io_limit`'s `source` label names them, in the order a tie
/// is settled.
pub(crate) const SOURCES: [&str; 3] = ["cgroup", "provisioned", "detected"];

/// One known cap, as `pgstorage_io_limit{volume, source, resource}` shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WriteCap<'a> {
    pub(crate) source: &'a str,
    pub(crate) resource: Resource,
    /// In IOs per second.
    pub(crate) value: f64,
}

impl WriteCap<'_> {
    /// Whether the cap bounds the device writes of the volume's commits: a
    /// cap on writes or on all IOs, from a source in [`SOURCES`], with a
    /// usable value.
    pub(crate) fn binds_commits(&self) -> bool {
        self.resource.counts_writes()
            && SOURCES.contains(&self.source)
            && self.value.is_finite()
            && self.value > 0.0
    }

    /// Tie order: the position of the source in [`SOURCES`], then a cap on
    /// writes alone before one on reads and writes together.
    fn rank(&self) -> (usize, bool) {
        (
            SOURCES
                .iter()
                .position(|s| *s == self.source)
                .unwrap_or(SOURCES.len()),
            self.resource != Resource::WriteIops,
        )
    }
}

/// The cap that binds a volume's commits among `caps`: the lowest of those
/// that [bind commits](WriteCap::binds_commits), the first in tie order on
/// equal values. `None` when none does.
pub(crate) fn binding_write_cap<'a>(
    caps: impl IntoIterator<Item = WriteCap<'a>>,
) -> Option<WriteCap<'a>> {
    caps.into_iter()
        .filter(WriteCap::binds_commits)
        .reduce(|a, b| {
            if b.value < a.value || (b.value == a.value && b.rank() < a.rank()) {
                b
            } else {
                a
            }
        })
}

/// Where the device writes per commit of a `cap` ceiling come from, as the
/// `writes_per_commit` label of `pgstorage_commit_ceiling_cap_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WritesPerCommit {
    /// Counted by the exporter's own cgroup over its commit probes
    /// (`pgstorage_probe_device_writes_per_commit`).
    Measured,
    /// [`DEFAULT_WRITES_PER_COMMIT`]: no count is attributable (the
    /// exporter shares its cgroup, runs in the root cgroup, or cannot read
    /// cgroups at all).
    Default,
}

impl WritesPerCommit {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WritesPerCommit::Measured => "measured",
            WritesPerCommit::Default => "default",
        }
    }
}

/// The device writes one commit costs: the measured figure when there is a
/// usable one, else [`DEFAULT_WRITES_PER_COMMIT`] (2.0: the data block and
/// a journal or log block on ext4 and XFS). The default is the least a
/// write + sync costs on those filesystems, and fewer writes per commit
/// make a higher ceiling: where the default is wrong (btrfs, 7-8) the
/// ceiling comes out too high, never below what a client gets.
pub(crate) fn writes_per_commit(measured: Option<f64>) -> (f64, WritesPerCommit) {
    match measured.filter(|w| w.is_finite() && *w > 0.0) {
        Some(w) => (w, WritesPerCommit::Measured),
        None => (DEFAULT_WRITES_PER_COMMIT, WritesPerCommit::Default),
    }
}

/// A volume's `cap` commit ceiling and what it was computed from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CapBasis<'a> {
    /// The binding cap.
    pub(crate) cap: WriteCap<'a>,
    pub(crate) writes_per_commit: f64,
    pub(crate) writes_source: WritesPerCommit,
    /// Commits per second: cap ÷ writes per commit, with
    /// [`RATE_HEADROOM`] where the cap is a measured plateau.
    pub(crate) ceiling: f64,
}

/// The `cap` basis from the caps known for a volume and its measured
/// device writes per commit, if any cap binds its commits.
pub(crate) fn cap_basis<'a>(
    caps: impl IntoIterator<Item = WriteCap<'a>>,
    measured_writes_per_commit: Option<f64>,
) -> Option<CapBasis<'a>> {
    let cap = binding_write_cap(caps)?;
    let (w, writes_source) = writes_per_commit(measured_writes_per_commit);
    Some(CapBasis {
        cap,
        writes_per_commit: w,
        writes_source,
        ceiling: capped_ceiling(cap.value, w)? * headroom(cap.source),
    })
}

/// A detected plateau is a measured rate, like the probe's: it gets the
/// same [`RATE_HEADROOM`]. A sweep depth skips its first quarter, so its
/// plateau is the throttle's sustained rate, and one client from idle also
/// gets the throttle's opening allowance: on the build machine plateau ÷ 2
/// read 0.991-1.033 of fio's one-client rate. A cap read from a cgroup file
/// or the configuration is exact and gets none.
pub(crate) fn headroom(source: &str) -> f64 {
    if source == "detected" {
        RATE_HEADROOM
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(source: &'static str, resource: Resource, value: f64) -> WriteCap<'static> {
        WriteCap {
            source,
            resource,
            value,
        }
    }

    /// (what the case shows, the caps known, the binding one as (source,
    /// resource, value)).
    type Case = (
        &'static str,
        Vec<WriteCap<'static>>,
        Option<(&'static str, Resource, f64)>,
    );

    #[test]
    fn the_tightest_cap_on_writes_binds() {
        use Resource::*;
        let cases: &[Case] = &[
            ("nothing known", vec![], None),
            (
                // A gp3 volume's 3,000 IOPS in the config, a PostgreSQL
                // service throttled to 500 write IOPS.
                "cgroup under a provisioned combined cap",
                vec![
                    cap("provisioned", Iops, 3000.0),
                    cap("cgroup", WriteIops, 500.0),
                ],
                Some(("cgroup", WriteIops, 500.0)),
            ),
            (
                // A hidden 240-IOPS throttle: the sweep's plateau read
                // 245, the provisioned figure is the volume's nominal 3,000.
                "a detected plateau under a provisioned cap",
                vec![
                    cap("provisioned", Iops, 3000.0),
                    cap("detected", WriteIops, 245.0),
                ],
                Some(("detected", WriteIops, 245.0)),
            ),
            (
                // The plateau of a 300-IOPS throttle read 10 % high.
                "a configured cap under the sweep's plateau",
                vec![
                    cap("detected", WriteIops, 330.0),
                    cap("provisioned", WriteIops, 300.0),
                ],
                Some(("provisioned", WriteIops, 300.0)),
            ),
            (
                "reads and bandwidth do not bound commits by count",
                vec![
                    cap("cgroup", ReadIops, 100.0),
                    cap("provisioned", BytesPerSecond, 131_072_000.0),
                    cap("detected", WriteBytesPerSecond, 10_485_760.0),
                    cap("provisioned", WriteIops, 16_000.0),
                ],
                Some(("provisioned", WriteIops, 16_000.0)),
            ),
            (
                "a tie names the kernel's figure first",
                vec![
                    cap("detected", WriteIops, 100.0),
                    cap("provisioned", Iops, 100.0),
                    cap("cgroup", WriteIops, 100.0),
                ],
                Some(("cgroup", WriteIops, 100.0)),
            ),
            (
                "a tie within a source: the cap on writes alone",
                vec![
                    cap("provisioned", Iops, 3000.0),
                    cap("provisioned", WriteIops, 3000.0),
                ],
                Some(("provisioned", WriteIops, 3000.0)),
            ),
            (
                "unusable values and unknown sources take no part",
                vec![
                    cap("cgroup", WriteIops, 0.0),
                    cap("detected", WriteIops, f64::NAN),
                    cap("guessed", WriteIops, 10.0),
                    cap("provisioned", Iops, 3000.0),
                ],
                Some(("provisioned", Iops, 3000.0)),
            ),
        ];
        for (what, caps, want) in cases {
            let got =
                binding_write_cap(caps.iter().copied()).map(|c| (c.source, c.resource, c.value));
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn writes_per_commit_falls_back_to_the_default() {
        let cases = [
            // ext4 under a v1 throttle, counted by the exporter's cgroup.
            (Some(2.27), (2.27, WritesPerCommit::Measured)),
            // btrfs, published: 7-8.
            (Some(7.5), (7.5, WritesPerCommit::Measured)),
            (None, (2.0, WritesPerCommit::Default)),
            (Some(0.0), (2.0, WritesPerCommit::Default)),
            (Some(f64::INFINITY), (2.0, WritesPerCommit::Default)),
        ];
        for (measured, want) in cases {
            assert_eq!(writes_per_commit(measured), want, "{measured:?}");
        }
    }

    #[test]
    fn cap_basis_is_the_binding_cap_over_the_writes_per_commit() {
        let cases = [
            // Build machine, fio one client back to back in a hidden
            // 240-IOPS throttle: 120.4 commits/s. The sweep's plateau
            // 245 over the default 2 writes, with a measured rate's 10 %
            // headroom: 134.75.
            (
                vec![cap("detected", Resource::WriteIops, 245.0)],
                None,
                Some(("detected", WritesPerCommit::Default, 134.75)),
            ),
            // Visible 100-IOPS throttle on PostgreSQL, 2.00 writes counted
            // per probe: 50/s (pgbench, one client: 50.1 TPS).
            (
                vec![
                    cap("cgroup", Resource::WriteIops, 100.0),
                    cap("provisioned", Resource::Iops, 3000.0),
                ],
                Some(2.0),
                Some(("cgroup", WritesPerCommit::Measured, 50.0)),
            ),
            (
                vec![cap("provisioned", Resource::WriteIops, 400.0)],
                Some(2.5),
                Some(("provisioned", WritesPerCommit::Measured, 160.0)),
            ),
            (
                vec![cap("cgroup", Resource::ReadIops, 100.0)],
                Some(2.0),
                None,
            ),
        ];
        for (caps, measured, want) in cases {
            let got = cap_basis(caps.iter().copied(), measured)
                .map(|b| (b.cap.source, b.writes_source, b.ceiling));
            assert_eq!(got, want, "{caps:?} {measured:?}");
        }
    }
}
