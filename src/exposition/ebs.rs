//! AWS EBS statistics families, from the limits collector's latest
//! snapshot. Names follow the aws-ebs-csi-driver's (`aws_ebs_csi_*`) under
//! our prefix, so dashboards built on those carry over; docs/metrics.md
//! has the mapping.

use crate::families::{counter, gauge, histogram};
use crate::limits::ebs::{EbsSnapshot, Histogram, VolumeStats};

type Enc<'a, 'b> = &'a mut prometheus_client::encoding::DescriptorEncoder<'b>;

/// The ten totals of the page, in page order: (base name, help, divisor to
/// the exported unit).
const TOTALS: [(&str, &str, f64); 10] = [
    (
        "pgstorage_ebs_read_ops",
        "Read operations the EBS volume completed since it was attached",
        1.0,
    ),
    (
        "pgstorage_ebs_write_ops",
        "Write operations the EBS volume completed since it was attached",
        1.0,
    ),
    (
        "pgstorage_ebs_read_bytes",
        "Bytes the EBS volume read since it was attached",
        1.0,
    ),
    (
        "pgstorage_ebs_write_bytes",
        "Bytes the EBS volume wrote since it was attached",
        1.0,
    ),
    (
        "pgstorage_ebs_read_seconds",
        "Time all completed reads of the EBS volume took, summed",
        1e6,
    ),
    (
        "pgstorage_ebs_write_seconds",
        "Time all completed writes of the EBS volume took, summed",
        1e6,
    ),
    (
        "pgstorage_ebs_volume_performance_exceeded_iops_seconds",
        "Time IO demand exceeded the EBS volume's provisioned IOPS (EBS delayed IOs); rate() is the fraction of time throttled, 0 to 1",
        1e6,
    ),
    (
        "pgstorage_ebs_volume_performance_exceeded_tp_seconds",
        "Time IO demand exceeded the EBS volume's provisioned throughput (EBS delayed IOs); rate() is the fraction of time throttled, 0 to 1",
        1e6,
    ),
    (
        "pgstorage_ebs_instance_performance_exceeded_iops_seconds",
        "Time the EBS volume's IO demand exceeded the EC2 instance's EBS IOPS limit; rate() is the fraction of time throttled, 0 to 1",
        1e6,
    ),
    (
        "pgstorage_ebs_instance_performance_exceeded_tp_seconds",
        "Time the EBS volume's IO demand exceeded the EC2 instance's EBS throughput limit; rate() is the fraction of time throttled, 0 to 1",
        1e6,
    ),
];

/// The two latency histograms: (name, help, which one).
type HistogramOf = fn(&VolumeStats) -> &Histogram;
const HISTOGRAMS: [(&str, &str, HistogramOf); 2] = [
    (
        "pgstorage_ebs_read_io_latency_seconds",
        "Read latency of the EBS volume as the device bins it (its own bin bounds), since it was attached; \
         _sum is the device's total read time",
        |v| &v.read_latency,
    ),
    (
        "pgstorage_ebs_write_io_latency_seconds",
        "Write latency of the EBS volume as the device bins it (its own bin bounds), since it was attached; \
         _sum is the device's total write time",
        |v| &v.write_latency,
    ),
];

fn vol(v: &VolumeStats) -> [(&'static str, &str); 1] {
    [("volume", v.volume.as_str())]
}

pub(crate) fn encode(enc: Enc<'_, '_>, s: Option<&EbsSnapshot>) -> std::fmt::Result {
    let Some(s) = s else { return Ok(()) };
    gauge(
        enc,
        "pgstorage_ebs_available",
        "1 when the AWS EBS statistics of every watched volume on an EBS NVMe controller were read \
         (reason=ok), else 0 with reason = no_ebs_device, permission_denied (needs CAP_SYS_ADMIN \
         and read access to /dev/nvmeN), device_error, nvme_status, bad_log_page. One series per host",
        [(
            [("reason", s.reason.as_str())],
            if s.reason == crate::limits::ebs::Reason::Ok {
                1.0
            } else {
                0.0
            },
        )],
    )?;
    // Off AWS (or without the privilege) the gauge above is all: no empty
    // families whose HELP and TYPE lines would fill every scrape of every
    // other host with EBS vocabulary.
    if s.volumes.is_empty() {
        return Ok(());
    }
    gauge(
        enc,
        "pgstorage_ebs_info",
        "Always 1: the EBS volume id and NVMe namespace device behind a watched volume",
        s.volumes.iter().map(|v| {
            (
                [
                    ("volume", v.volume.as_str()),
                    ("ebs_volume_id", v.ebs_volume_id.as_str()),
                    ("device", v.device.as_str()),
                ],
                1.0,
            )
        }),
    )?;
    for (i, (name, help, div)) in TOTALS.iter().enumerate() {
        counter(
            enc,
            name,
            help,
            s.volumes.iter().map(|v| (vol(v), v.totals[i] as f64 / div)),
        )?;
    }
    gauge(
        enc,
        "pgstorage_ebs_volume_queue_length",
        "Read and write operations waiting to complete on the EBS volume, at the time of the read",
        s.volumes.iter().map(|v| (vol(v), v.queue_length as f64)),
    )?;
    for (name, help, of) in HISTOGRAMS {
        histogram(
            enc,
            name,
            help,
            s.volumes.iter().map(|v| {
                let h = of(v);
                (vol(v), h.sum_seconds, h.count, h.buckets.clone())
            }),
        )?;
    }
    Ok(())
}
