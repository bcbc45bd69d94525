//! /proc/diskstats: completed reads and writes and sectors moved per disk.
//! Sectors are always 512 bytes in this file, whatever the device's own
//! sector size.

use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl DiskStats {
    pub fn delta(&self, earlier: &DiskStats) -> DiskStats {
        DiskStats {
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
        }
    }
}

pub fn parse(text: &str) -> BTreeMap<String, DiskStats> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            Some((
                f.get(2)?.to_string(),
                DiskStats {
                    reads: n(3)?,
                    read_bytes: n(5)?.saturating_mul(512),
                    writes: n(7)?,
                    write_bytes: n(9)?.saturating_mul(512),
                },
            ))
        })
        .collect()
}

pub fn read(proc_root: &Path) -> BTreeMap<String, DiskStats> {
    std::fs::read_to_string(proc_root.join("diskstats"))
        .map(|t| parse(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_diskstats_lines() {
        let t = " 254       0 vda 874 12 51234 100 542 30 9000 200 0 300 400 0 0 0 0 10 5\n   7       0 loop0 30 0 480 1 92 0 736 5 0 6 6\n";
        let m = parse(t);
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
}
