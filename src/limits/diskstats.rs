//! /proc/diskstats: completed reads and writes and sectors moved per disk.
//! Sectors are always 512 bytes in this file, whatever the device's own
//! sector size.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::{Kind, ReadError, read_required};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub(crate) reads: u64,
    pub(crate) writes: u64,
    pub(crate) read_bytes: u64,
    pub(crate) write_bytes: u64,
}

impl DiskStats {
    pub(crate) fn delta(&self, earlier: &DiskStats) -> DiskStats {
        DiskStats {
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
        }
    }
}

/// Each line parsed by procfs's `DiskStat::from_line` (the kernel's
/// documented field order, with the optional discard and flush fields of
/// newer kernels). procfs's own `DiskStats::from_file` would do, but its
/// errors fold an errno into `NotFound` / `PermissionDenied` / `Io`, so the
/// file is read here, where the errno stays whole for the `cause` label,
/// from the configurable proc root tests point at fixtures.
pub fn parse(text: &str) -> Result<BTreeMap<String, DiskStats>, String> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let d = procfs::DiskStat::from_line(line).map_err(|e| format!("{line:?}: {e}"))?;
        out.insert(
            d.name,
            DiskStats {
                reads: d.reads,
                read_bytes: d.sectors_read.saturating_mul(512),
                writes: d.writes,
                write_bytes: d.sectors_written.saturating_mul(512),
            },
        );
    }
    Ok(out)
}

/// `/proc/diskstats` always exists on Linux: missing, it says `proc_root`
/// is wrong, and it is an error like any other.
pub(crate) fn read(proc_root: &Path) -> Result<BTreeMap<String, DiskStats>, ReadError> {
    let path = proc_root.join("diskstats");
    let text = read_required(Kind::Diskstats, &path)?;
    parse(&text).map_err(|what| ReadError::parse(Kind::Diskstats, &path, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_diskstats_lines() {
        let t = " 254       0 vda 874 12 51234 100 542 30 9000 200 0 300 400 0 0 0 0 10 5\n   7       0 loop0 30 0 480 1 92 0 736 5 0 6 6\n";
        let m = parse(t).unwrap();
        assert_eq!(
            m["vda"],
            DiskStats {
                reads: 874,
                writes: 542,
                read_bytes: 51234 * 512,
                write_bytes: 9000 * 512
            }
        );
        assert_eq!(m["loop0"].writes, 92);
        let d = m["vda"].delta(&DiskStats {
            reads: 800,
            writes: 500,
            read_bytes: 0,
            write_bytes: 0,
        });
        assert_eq!((d.reads, d.writes), (74, 42));
    }

    #[test]
    fn a_malformed_line_is_an_error_not_an_idle_disk() {
        assert!(parse(" 254 0 vda 874 12 x 100 542 30 9000 200 0 300 400\n").is_err());
        assert!(parse(" 254 0 vda 874\n").is_err());
        assert_eq!(parse("").unwrap().len(), 0);
        let dir = tempfile::tempdir().unwrap();
        let e = read(dir.path()).unwrap_err();
        assert_eq!((e.kind, e.cause.label()), (Kind::Diskstats, "ENOENT"));
        std::fs::create_dir(dir.path().join("diskstats")).unwrap();
        assert_eq!(read(dir.path()).unwrap_err().cause.label(), "EISDIR");
    }
}
