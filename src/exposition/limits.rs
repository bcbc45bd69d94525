//! IO limit families, from the limits collector's latest snapshot.

use crate::families::{counter, gauge};
use crate::limits::LimitsSnapshot;

type Enc<'a, 'b> = &'a mut prometheus_client::encoding::DescriptorEncoder<'b>;

pub(crate) fn encode(enc: Enc<'_, '_>, s: &LimitsSnapshot) -> std::fmt::Result {
    fn row(r: &crate::limits::LimitRow) -> [(&'static str, &str); 3] {
        [
            ("volume", r.volume.as_str()),
            ("source", r.source),
            ("resource", r.resource.as_str()),
        ]
    }
    gauge(
        enc,
        "pgstorage_io_limit",
        "An IO cap on the volume's whole disk: source=cgroup (the tightest cgroup v1/v2 limit along the \
         cgroup path of the PostgreSQL postmaster using the volume, else of the exporter), \
         source=provisioned (from the config), source=detected (a read or write IOPS or bandwidth plateau \
         found by the queue-depth sweep); resource = read_iops, write_iops, read_bytes_per_second, \
         write_bytes_per_second, and for provisioned combined caps iops, bytes_per_second",
        s.rows.iter().map(|r| (row(r), r.value)),
    )?;
    gauge(
        enc,
        "pgstorage_io_limit_utilization_ratio",
        "Observed rate over the limits collector interval divided by the cap: for cgroup limits the \
         cgroup's own IO on the disk, for provisioned limits the whole disk (/proc/diskstats)",
        s.rows
            .iter()
            .filter_map(|r| r.utilization.map(|u| (row(r), u))),
    )?;
    gauge(
        enc,
        "pgstorage_io_limit_cgroup_info",
        "Always 1: whose cgroup the volume's cgroup limits were read from (scope = postgres:<cluster> \
         or exporter), the cgroup path, the reader (v1 or v2) and the whole disk",
        s.cgroups.iter().map(|c| {
            (
                [
                    ("volume", c.volume.as_str()),
                    ("scope", c.scope.as_str()),
                    ("cgroup", c.cgroup.as_str()),
                    ("version", c.version),
                    ("disk", c.disk.as_str()),
                ],
                1.0,
            )
        }),
    )?;
    counter(
        enc,
        "pgstorage_cgroup_io_pressure_seconds",
        "Time tasks of the cgroup were stalled on IO (cgroup v2 io.pressure totals); kind=some: at \
         least one task stalled, full: all non-idle tasks stalled",
        s.pressure.iter().map(|(scope, cg, kind, secs)| {
            (
                [
                    ("scope", scope.as_str()),
                    ("cgroup", cg.as_str()),
                    ("kind", *kind),
                ],
                *secs,
            )
        }),
    )?;
    gauge(
        enc,
        "pgstorage_probe_device_writes_per_commit",
        "Device writes one commit probe costs as the exporter's own cgroup counts them (io.stat / \
         blkio.throttle.io_serviced): the divisor of the cap ceiling. Absent when the exporter runs \
         in the root cgroup, where other processes' IO is mixed in",
        s.writes_per_probe
            .iter()
            .map(|(v, w)| ([("volume", v.as_str())], *w)),
    )?;
    counter(
        enc,
        "pgstorage_limits_read_errors",
        "Files the IO limits collector needed and could not read, by kind (proc_cgroup, \
         postmaster_pid, cgroup_limits, cgroup_counters, cgroup_pressure, diskstats) and cause \
         (an errno name, or parse): the limits behind them are unknown, not absent.",
        s.read_errors
            .iter()
            .map(|((kind, cause), n)| ([("kind", *kind), ("cause", *cause)], *n as f64)),
    )?;
    super::ebs::encode(enc, s.ebs.as_ref())
}
