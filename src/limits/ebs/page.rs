//! The AWS EBS statistics log page (NVMe vendor log page 0xD0), parsed.
//!
//! Layout (4096 bytes, little-endian), as nvme-cli's `amzn` plugin
//! (`struct amzn_latency_log_page`) and the aws-ebs-csi-driver read it:
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic u32 = 0x3C23B510 (EBS; instance store answers 0xEC2C0D7E) |
//! | 4 | version u32 (0; 1 adds per-IO-size histograms after @3600) |
//! | 8..96 | 11 × u64: read ops, write ops, read bytes, write bytes, read time µs, write time µs, volume IOPS exceeded µs, volume throughput exceeded µs, instance IOPS exceeded µs, instance throughput exceeded µs, queue length |
//! | 96..512 | reserved |
//! | 512 | read latency histogram: num_bins u64, then 64 bins of {lower u64 µs, upper u64 µs, count u32, reserved u32} (24 bytes) from 520 |
//! | 2056 | write latency histogram, bins from 2064 |
//!
//! Every figure is a total since the volume was attached to the instance
//! (the controller's reset), the bin counts included: nvme-cli prints them
//! as they are and the CSI driver exports them as cumulative histograms.

use std::fmt;

/// The page's magic for EBS volumes.
pub(crate) const EBS_MAGIC: u32 = 0x3C23_B510;
/// Bytes the page must have: the end of the write histogram's 64 bins.
pub(crate) const MIN_LEN: usize = WRITE_HIST + 8 + MAX_BINS * BIN_LEN;
/// Bins a histogram has room for.
pub(crate) const MAX_BINS: usize = 64;
const BIN_LEN: usize = 24;
const COUNTERS: usize = 8;
const READ_HIST: usize = 512;
const WRITE_HIST: usize = 2056;

/// One latency bin: IOs that completed in `(lower_us, upper_us]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bin {
    pub lower_us: u64,
    pub upper_us: u64,
    pub count: u32,
}

/// The page's counters, raw (µs, bytes, ops).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_time_us: u64,
    pub write_time_us: u64,
    pub volume_exceeded_iops_us: u64,
    pub volume_exceeded_tp_us: u64,
    pub instance_exceeded_iops_us: u64,
    pub instance_exceeded_tp_us: u64,
    pub queue_length: u64,
}

impl Counters {
    /// The ten totals (not the queue length, a point-in-time gauge), in
    /// page order.
    pub(crate) fn totals(&self) -> [u64; 10] {
        [
            self.read_ops,
            self.write_ops,
            self.read_bytes,
            self.write_bytes,
            self.read_time_us,
            self.write_time_us,
            self.volume_exceeded_iops_us,
            self.volume_exceeded_tp_us,
            self.instance_exceeded_iops_us,
            self.instance_exceeded_tp_us,
        ]
    }
}

/// A parsed page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub version: u32,
    pub counters: Counters,
    pub read_latency: Vec<Bin>,
    pub write_latency: Vec<Bin>,
}

/// Why bytes are not an EBS statistics page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageError {
    Short {
        len: usize,
    },
    Magic {
        found: u32,
    },
    TooManyBins {
        histogram: &'static str,
        num_bins: u64,
    },
    /// A bin's reserved half (bytes 20..24) is set: the count would be a
    /// u64 there, or the page is not what this parser knows.
    Reserved {
        histogram: &'static str,
        bin: usize,
        reserved: u32,
    },
    /// Bin upper bounds must rise strictly (they become `le` buckets), and
    /// a bin's lower bound may not pass its upper one.
    Bounds {
        histogram: &'static str,
        bin: usize,
    },
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PageError::Short { len } => {
                write!(f, "log page is {len} bytes, at least {MIN_LEN} needed")
            }
            PageError::Magic { found } => write!(
                f,
                "magic is {found:#010x}, not the EBS statistics page's {EBS_MAGIC:#010x}"
            ),
            PageError::TooManyBins {
                histogram,
                num_bins,
            } => write!(
                f,
                "{histogram} latency histogram claims {num_bins} bins, at most {MAX_BINS} fit"
            ),
            PageError::Reserved {
                histogram,
                bin,
                reserved,
            } => write!(
                f,
                "{histogram} latency histogram bin {bin} has {reserved:#x} in its reserved half of the count"
            ),
            PageError::Bounds { histogram, bin } => write!(
                f,
                "{histogram} latency histogram bin {bin} has bounds out of order"
            ),
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

fn histogram(b: &[u8], at: usize, name: &'static str) -> Result<Vec<Bin>, PageError> {
    let num_bins = u64_at(b, at);
    // nvme-cli clamps to 64 and prints on; a count past 64 (or one using
    // the upper half of the u64) means the page is not the layout we
    // know, so none of its figures are trusted.
    let n = usize::try_from(num_bins)
        .ok()
        .filter(|n| *n <= MAX_BINS)
        .ok_or(PageError::TooManyBins {
            histogram: name,
            num_bins,
        })?;
    let mut bins: Vec<Bin> = Vec::with_capacity(n);
    for i in 0..n {
        let o = at + 8 + i * BIN_LEN;
        let bin = Bin {
            lower_us: u64_at(b, o),
            upper_us: u64_at(b, o + 8),
            count: u32_at(b, o + 16),
        };
        let reserved = u32_at(b, o + 20);
        if reserved != 0 {
            return Err(PageError::Reserved {
                histogram: name,
                bin: i,
                reserved,
            });
        }
        let rises = bins.last().is_none_or(|p| bin.upper_us > p.upper_us);
        if !rises || bin.lower_us > bin.upper_us {
            return Err(PageError::Bounds {
                histogram: name,
                bin: i,
            });
        }
        bins.push(bin);
    }
    Ok(bins)
}

/// Parses a page. Total: any bytes give a page or an error, never a panic.
pub fn parse(b: &[u8]) -> Result<Page, PageError> {
    if b.len() < MIN_LEN {
        return Err(PageError::Short { len: b.len() });
    }
    let magic = u32_at(b, 0);
    if magic != EBS_MAGIC {
        return Err(PageError::Magic { found: magic });
    }
    let c = |i: usize| u64_at(b, COUNTERS + 8 * i);
    Ok(Page {
        version: u32_at(b, 4),
        counters: Counters {
            read_ops: c(0),
            write_ops: c(1),
            read_bytes: c(2),
            write_bytes: c(3),
            read_time_us: c(4),
            write_time_us: c(5),
            volume_exceeded_iops_us: c(6),
            volume_exceeded_tp_us: c(7),
            instance_exceeded_iops_us: c(8),
            instance_exceeded_tp_us: c(9),
            queue_length: c(10),
        },
        read_latency: histogram(b, READ_HIST, "read")?,
        write_latency: histogram(b, WRITE_HIST, "write")?,
    })
}

/// Builds a page's bytes from figures: the inverse of [`parse`], for
/// fixtures (tests, and pages written to disk for the daemon tests).
pub fn build(version: u32, c: &Counters, read: &[Bin], write: &[Bin]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    let mut put = |at: usize, bytes: &[u8]| {
        if let Some(s) = b.get_mut(at..at + bytes.len()) {
            s.copy_from_slice(bytes);
        }
    };
    put(0, &EBS_MAGIC.to_le_bytes());
    put(4, &version.to_le_bytes());
    let all = c.totals();
    for (i, v) in all.iter().chain([c.queue_length].iter()).enumerate() {
        put(COUNTERS + 8 * i, &v.to_le_bytes());
    }
    for (at, bins) in [(READ_HIST, read), (WRITE_HIST, write)] {
        put(at, &(bins.len() as u64).to_le_bytes());
        for (i, bin) in bins.iter().take(MAX_BINS).enumerate() {
            let o = at + 8 + i * BIN_LEN;
            put(o, &bin.lower_us.to_le_bytes());
            put(o + 8, &bin.upper_us.to_le_bytes());
            put(o + 16, &bin.count.to_le_bytes());
        }
    }
    b
}
