//! The probe directory's lock file, and the proof of ownership it carries.
//!
//! The exporter only ever writes, truncates or removes a file it created
//! itself and can prove it created. A probe directory may be one an
//! administrator made and configured, holding files of someone else under
//! the exporter's names; a name alone proves nothing. So the lock file is
//! the exporter's own record:
//!
//! ```text
//! pg-storage-exporter probe directory lock v1
//! pid 4711
//! dir 2049 131073 1733390000.123456789
//! file wal.probe 2049 131074 1733390001.000000001
//! ```
//!
//! The first line marks the file as the exporter's; the `dir` line says the
//! exporter created the directory itself (so a later run, taking over the
//! lock of a crashed one, may remove it); a `file` line is written right
//! after the exporter created that file with `O_EXCL`, before any byte of
//! it is filled, and names its device, inode and birth time. A leftover
//! file is removed only when a lock with this header records it: the
//! lock of a crashed run (nobody holds its `flock`), or of this run.
//!
//! Why the birth time: an inode number is free for reuse as soon as its
//! file is deleted, so device and inode alone could match a later file of
//! someone else; a birth time (`statx`, `STATX_BTIME`) tells the two apart.
//! Where the filesystem reports none (or `statx` is blocked), the device
//! and inode are compared; where it does, the device is not, since a
//! device number may change across a reboot (device-mapper and NVMe minor
//! numbers are allocated at probe time) while the inode and birth time of
//! a file on disk do not.

use std::io;
use std::os::fd::AsFd;

use rustix::fs::{AtFlags, FileType, StatxFlags};

/// The lock file's first line: what tells the exporter's lock from any
/// other file named `lock`.
pub(crate) const HEADER: &str = "pg-storage-exporter probe directory lock v1";

/// A lock file longer than this is not one the exporter wrote (its own
/// holds a few lines); reading stops there.
pub(crate) const MAX_LEN: usize = 4096;

/// What makes a file the one the exporter created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// Birth time (seconds, nanoseconds), where the filesystem reports it.
    pub(crate) btime: Option<(i64, u32)>,
}

impl Identity {
    /// Whether `now` (what a name refers to now) is the file recorded as
    /// `self`: the same inode born at the same moment, or, where either
    /// side has no birth time, the same inode on the same device.
    pub(crate) fn matches(&self, now: &Identity) -> bool {
        self.ino == now.ino
            && match (self.btime, now.btime) {
                (Some(a), Some(b)) => a == b,
                _ => self.dev == now.dev,
            }
    }

    /// The identity of the file `fd` refers to.
    pub(crate) fn of_fd(fd: impl AsFd) -> io::Result<Identity> {
        Ok(Seen::statx(fd, "", AtFlags::EMPTY_PATH)?.identity)
    }
}

/// What a name in a directory refers to, without following a symlink.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) kind: FileType,
    pub(crate) identity: Identity,
}

impl Seen {
    /// lstat of `name` in `dir`, with the birth time where there is one.
    pub(crate) fn at(dir: impl AsFd, name: &str) -> io::Result<Seen> {
        Seen::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW)
    }

    #[allow(
        clippy::unnecessary_cast,
        reason = "the field types vary by architecture; u64 holds them all"
    )]
    fn statx(fd: impl AsFd, name: &str, flags: AtFlags) -> io::Result<Seen> {
        match rustix::fs::statx(
            &fd,
            name,
            flags,
            StatxFlags::TYPE | StatxFlags::INO | StatxFlags::BTIME,
        ) {
            Ok(x) => Ok(Seen {
                kind: FileType::from_raw_mode(x.stx_mode.into()),
                identity: Identity {
                    dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor) as u64,
                    ino: x.stx_ino,
                    btime: (x.stx_mask & StatxFlags::BTIME.bits() != 0)
                        .then_some((x.stx_btime.tv_sec, x.stx_btime.tv_nsec)),
                },
            }),
            // statx is missing before Linux 4.11, and a container's seccomp
            // profile may refuse it: the same answer without a birth time.
            Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {
                let st = rustix::fs::statat(&fd, name, flags)?;
                Ok(Seen {
                    kind: FileType::from_raw_mode(st.st_mode),
                    identity: Identity {
                        dev: st.st_dev as u64,
                        ino: st.st_ino as u64,
                        btime: None,
                    },
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// What a lock file of the exporter says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Record {
    /// The process that wrote it.
    pub(crate) pid: Option<u32>,
    /// The probe directory, when the exporter created it.
    pub(crate) dir: Option<Identity>,
    /// The files the exporter created, by name.
    pub(crate) files: Vec<(&'static str, Identity)>,
}

impl Record {
    /// The identity recorded for `name`, if any.
    pub(crate) fn file(&self, name: &str) -> Option<Identity> {
        self.files
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, id)| *id)
    }

    /// Records `name` as the file with `id` (replacing an older record).
    pub(crate) fn set_file(&mut self, name: &'static str, id: Identity) {
        self.forget(name);
        self.files.push((name, id));
    }

    pub(crate) fn forget(&mut self, name: &str) {
        self.files.retain(|(n, _)| *n != name);
    }

    pub(crate) fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = format!("{HEADER}\n");
        if let Some(pid) = self.pid {
            let _ = writeln!(s, "pid {pid}");
        }
        if let Some(d) = &self.dir {
            let _ = writeln!(s, "dir {}", render_identity(d));
        }
        for (name, id) in &self.files {
            let _ = writeln!(s, "file {name} {}", render_identity(id));
        }
        s
    }

    /// The record in `text`, or None when `text` does not start with the
    /// header: then it is not the exporter's lock. `names` are the only
    /// file names a record may hold. A line that does not parse (a write
    /// torn by a power loss) is skipped: what it recorded is then not
    /// proven, and stays untouched.
    pub(crate) fn parse(text: &[u8], names: &[&'static str]) -> Option<Record> {
        let text = std::str::from_utf8(text).ok()?;
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut r = Record::default();
        for line in lines {
            let mut w = line.split(' ');
            match w.next() {
                Some("pid") => r.pid = w.next().and_then(|p| p.parse().ok()),
                Some("dir") => {
                    if let Some(id) = parse_identity(&mut w) {
                        r.dir = Some(id);
                    }
                }
                Some("file") => {
                    let name = w.next().and_then(|n| names.iter().find(|k| **k == n));
                    if let (Some(name), Some(id)) = (name, parse_identity(&mut w)) {
                        r.set_file(name, id);
                    }
                }
                _ => {}
            }
        }
        Some(r)
    }
}

fn render_identity(id: &Identity) -> String {
    let btime = match id.btime {
        Some((s, ns)) => format!("{s}.{ns:09}"),
        None => "-".to_string(),
    };
    format!("{} {} {btime}", id.dev, id.ino)
}

fn parse_identity<'a>(w: &mut impl Iterator<Item = &'a str>) -> Option<Identity> {
    let dev = w.next()?.parse().ok()?;
    let ino = w.next()?.parse().ok()?;
    let btime = match w.next()? {
        "-" => None,
        t => {
            let (s, ns) = t.split_once('.')?;
            // Nine digits, as rendered: anything else was not written here.
            if ns.len() != 9 {
                return None;
            }
            Some((s.parse().ok()?, ns.parse().ok()?))
        }
    };
    if w.next().is_some() {
        return None;
    }
    Some(Identity { dev, ino, btime })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &["wal.probe", "read.probe"];

    fn id(ino: u64, btime: Option<(i64, u32)>) -> Identity {
        Identity {
            dev: 2049,
            ino,
            btime,
        }
    }

    #[test]
    fn a_record_survives_its_text() {
        let r = Record {
            pid: Some(4711),
            dir: Some(id(12, Some((1_733_390_000, 5)))),
            files: vec![
                ("wal.probe", id(13, Some((-1, 999_999_999)))),
                ("read.probe", id(14, None)),
            ],
        };
        let text = r.render();
        assert!(text.starts_with(&format!("{HEADER}\npid 4711\n")), "{text}");
        assert!(
            text.contains("dir 2049 12 1733390000.000000005\n"),
            "{text}"
        );
        assert!(text.contains("file read.probe 2049 14 -\n"), "{text}");
        assert_eq!(Record::parse(text.as_bytes(), NAMES), Some(r));
    }

    #[test]
    fn only_the_header_makes_a_lock_ours() {
        for (text, ours) in [
            (&b""[..], false),
            (b"4711\n", false),
            (b"pid 4711\n", false),
            (b"pg-storage-exporter probe directory lock v2\n", false),
            (b" pg-storage-exporter probe directory lock v1\n", false),
            (b"\xff\xfe random bytes", false),
            (b"pg-storage-exporter probe directory lock v1", true),
            (
                b"pg-storage-exporter probe directory lock v1\npid 1\n",
                true,
            ),
        ] {
            assert_eq!(
                Record::parse(text, NAMES).is_some(),
                ours,
                "{:?}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn lines_that_do_not_parse_prove_nothing() {
        let text = format!(
            "{HEADER}\npid x\nfile wal.probe 2049 13\nfile other.probe 2049 15 -\n\
             file read.probe 2049 14 1.5\nfile read.probe 2049 14 1.1000000000\n\
             dir 2049 12 - extra\nfile read.probe 2049 16 -\n"
        );
        let r = Record::parse(text.as_bytes(), NAMES).unwrap();
        assert_eq!(r.pid, None);
        assert_eq!(r.dir, None);
        assert_eq!(r.files, vec![("read.probe", id(16, None))]);
    }

    #[test]
    fn identity_needs_the_same_birth_where_both_have_one() {
        let born = id(13, Some((100, 1)));
        assert!(born.matches(&born));
        // The inode reused by a later file.
        assert!(!born.matches(&id(13, Some((100, 2)))));
        assert!(!born.matches(&id(14, Some((100, 1)))));
        // Another device number for the same file (after a reboot).
        assert!(born.matches(&Identity { dev: 7, ..born }));
        // Without a birth time, the device decides.
        assert!(born.matches(&id(13, None)));
        assert!(!born.matches(&Identity {
            dev: 7,
            ..id(13, None)
        }));
    }

    #[test]
    fn a_created_file_has_a_stable_identity() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        let dir = std::fs::File::open(tmp.path()).unwrap();
        let by_fd = Identity::of_fd(&f).unwrap();
        let by_name = Seen::at(&dir, "f").unwrap();
        assert_eq!(by_name.kind, FileType::RegularFile);
        assert!(by_fd.matches(&by_name.identity));
        std::os::unix::fs::symlink(&p, tmp.path().join("l")).unwrap();
        assert_eq!(Seen::at(&dir, "l").unwrap().kind, FileType::Symlink);
    }
}
