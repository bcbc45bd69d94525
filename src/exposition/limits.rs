//! IO limit metrics, encoded from the limits collector's latest snapshot.

use super::Format;
use super::text::{counter_header, gauge_header, labels, sample};
use crate::limits::LimitsSnapshot;

pub fn encode(out: &mut String, format: Format, s: &LimitsSnapshot) {
    gauge_header(
        out,
        "pgstorage_io_limit",
        "An IO cap on the volume's whole disk: source=cgroup (the tightest cgroup v1/v2 limit along the \
         cgroup path of the PostgreSQL postmaster using the volume, else of the exporter), \
         source=provisioned (from the config), source=detected (a read-IOPS plateau found by the \
         queue-depth sweep); resource = read_iops, write_iops, read_bytes_per_second, \
         write_bytes_per_second, and for provisioned combined caps iops, bytes_per_second",
    );
    for r in &s.rows {
        sample(
            out,
            "pgstorage_io_limit",
            &labels(&[
                ("volume", &r.volume),
                ("source", r.source),
                ("resource", r.resource),
            ]),
            r.value,
        );
    }
    gauge_header(
        out,
        "pgstorage_io_limit_utilization_ratio",
        "Observed rate over the limits collector interval divided by the cap: for cgroup limits the \
         cgroup's own IO on the disk, for provisioned limits the whole disk (/proc/diskstats)",
    );
    for r in &s.rows {
        if let Some(u) = r.utilization {
            sample(
                out,
                "pgstorage_io_limit_utilization_ratio",
                &labels(&[
                    ("volume", &r.volume),
                    ("source", r.source),
                    ("resource", r.resource),
                ]),
                u,
            );
        }
    }
    gauge_header(
        out,
        "pgstorage_io_limit_cgroup_info",
        "Always 1: whose cgroup the volume's cgroup limits were read from (scope = postgres:<cluster> \
         or exporter), the cgroup path, the reader (v1 or v2) and the whole disk",
    );
    for c in &s.cgroups {
        sample(
            out,
            "pgstorage_io_limit_cgroup_info",
            &labels(&[
                ("volume", &c.volume),
                ("scope", &c.scope),
                ("cgroup", &c.cgroup),
                ("version", c.version),
                ("disk", &c.disk),
            ]),
            1.0,
        );
    }
    counter_header(
        out,
        format,
        "pgstorage_cgroup_io_pressure_seconds",
        "Time tasks of the cgroup were stalled on IO (cgroup v2 io.pressure totals); kind=some: at \
         least one task stalled, full: all non-idle tasks stalled",
    );
    for (scope, cg, kind, secs) in &s.pressure {
        sample(
            out,
            "pgstorage_cgroup_io_pressure_seconds_total",
            &labels(&[("scope", scope), ("cgroup", cg), ("kind", kind)]),
            *secs,
        );
    }
    gauge_header(
        out,
        "pgstorage_probe_device_writes_per_commit",
        "Device writes one commit probe costs as the exporter's own cgroup counts them (io.stat / \
         blkio.throttle.io_serviced): the divisor of the cap ceiling. Absent when the exporter runs \
         in the root cgroup, where other processes' IO is mixed in",
    );
    for (v, w) in &s.writes_per_probe {
        sample(
            out,
            "pgstorage_probe_device_writes_per_commit",
            &labels(&[("volume", v)]),
            *w,
        );
    }
}
