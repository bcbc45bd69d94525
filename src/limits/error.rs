//! Failed reads of the limits collector, and how they are logged.
//!
//! A file the collector needs and cannot read leaves the limit behind it
//! unknown. That must not look like "no limit": every such read is counted
//! by (kind, cause) and fails the collector's health for the pass. Files
//! that legitimately do not exist (no `io.max` in a cgroup whose parent does
//! not enable the io controller, no `postmaster.pid` while PostgreSQL is
//! down) are decided where they are read, not here.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::errno::{self, Set};
use crate::events::{Incidents, Report};

/// Which of the collector's inputs a failed read was: the `kind` label of
/// `pgstorage_limits_read_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// `/proc/<pid>/cgroup`.
    ProcCgroup,
    /// `postmaster.pid` in a cluster's data directory.
    PostmasterPid,
    /// The hierarchy itself (`cgroup.controllers`) and the limit files
    /// (`io.max`, `blkio.throttle.*_device`).
    CgroupLimits,
    /// `io.stat`, `blkio.throttle.io_serviced` / `io_service_bytes`.
    CgroupCounters,
    /// `io.pressure`.
    CgroupPressure,
    /// `/proc/diskstats`.
    Diskstats,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::ProcCgroup => "proc_cgroup",
            Kind::PostmasterPid => "postmaster_pid",
            Kind::CgroupLimits => "cgroup_limits",
            Kind::CgroupCounters => "cgroup_counters",
            Kind::CgroupPressure => "cgroup_pressure",
            Kind::Diskstats => "diskstats",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Cause {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("cannot parse: {0}")]
    Parse(String),
    /// `cgroup_root` holds files but neither a v2 hierarchy
    /// (`cgroup.controllers`, also under `unified/`) nor a v1 `blkio/`
    /// one: it is not where cgroups are mounted.
    #[error(
        "not a cgroup hierarchy: no cgroup.controllers, no unified/cgroup.controllers, no blkio/"
    )]
    NotCgroup,
}

impl Cause {
    /// The `cause` label: the errno name, or `parse`.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Cause::Io(e) => e
                .raw_os_error()
                .map_or("other", |n| errno::name(Set::Read, n)),
            Cause::Parse(_) => "parse",
            // The file that would make it a hierarchy is missing.
            Cause::NotCgroup => "ENOENT",
        }
    }
}

/// A read the collector needed and could not do.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {}: {cause}", path.display())]
pub(crate) struct ReadError {
    pub(crate) kind: Kind,
    pub(crate) path: PathBuf,
    #[source]
    pub(crate) cause: Cause,
}

impl ReadError {
    pub(crate) fn io(kind: Kind, path: &Path, e: io::Error) -> ReadError {
        // read_to_string reports a file that is not UTF-8 as InvalidData
        // without an errno: that is content we cannot parse.
        let cause = if e.raw_os_error().is_none() && e.kind() == io::ErrorKind::InvalidData {
            Cause::Parse(e.to_string())
        } else {
            Cause::Io(e)
        };
        ReadError {
            kind,
            path: path.to_path_buf(),
            cause,
        }
    }

    pub(crate) fn parse(kind: Kind, path: &Path, what: impl Into<String>) -> ReadError {
        ReadError {
            kind,
            path: path.to_path_buf(),
            cause: Cause::Parse(what.into()),
        }
    }

    /// The errno of an IO failure.
    pub(crate) fn errno(&self) -> Option<i32> {
        match &self.cause {
            Cause::Io(e) => e.raw_os_error(),
            _ => None,
        }
    }
}

/// Reads a whole file; `Ok(None)` when it does not exist (ENOENT), for the
/// callers to whom absence is a fact (every caller says why).
pub(crate) fn read_optional(kind: Kind, path: &Path) -> Result<Option<String>, ReadError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ReadError::io(kind, path, e)),
    }
}

/// Reads a whole file that must exist.
pub(crate) fn read_required(kind: Kind, path: &Path) -> Result<String, ReadError> {
    std::fs::read_to_string(path).map_err(|e| ReadError::io(kind, path, e))
}

/// The failed reads of one pass, one per distinct (kind, file): a broken
/// file shared by several volumes (a parent's `io.max`) counts once.
#[derive(Debug, Default)]
pub(crate) struct PassErrors {
    errors: BTreeMap<(Kind, PathBuf), ReadError>,
}

impl PassErrors {
    /// Keeps the value of a successful read; notes a failed one.
    pub(crate) fn note<T>(&mut self, r: Result<T, ReadError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.entry((e.kind, e.path.clone())).or_insert(e);
                None
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.errors.len()
    }

    /// (kind label, cause label) of each failed read.
    pub(crate) fn labels(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.errors
            .values()
            .map(|e| (e.kind.as_str(), e.cause.label()))
    }
}

/// Remembers which reads are failing so the log says so once, not every
/// pass, with the crate's one incident policy (`crate::events`): a warning
/// when a read starts failing or fails differently, again at most every
/// [`LOG_REPEAT`] while it keeps failing, and an info when it reads again.
#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    incidents: Incidents<(Kind, PathBuf), &'static str>,
}

/// What [`ErrorLog::update`] decided to log, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Logged {
    Warn(Kind, PathBuf, &'static str),
    Recovered(Kind, PathBuf),
}

impl ErrorLog {
    pub(crate) fn update(&mut self, pass: &PassErrors, now: Instant) -> Vec<Logged> {
        let mut out = Vec::new();
        for ((kind, path), e) in &pass.errors {
            let cause = e.cause.label();
            let failures = match self.incidents.failed((*kind, path.clone()), cause, now) {
                Report::New => None,
                Report::Again { failures } => Some(failures),
                Report::Quiet => continue,
            };
            tracing::warn!(
                kind = kind.as_str(),
                path = %path.display(),
                cause,
                error = %e.cause,
                failures,
                "IO limits: cannot read a file the limits depend on; its limits are unknown, not absent"
            );
            out.push(Logged::Warn(*kind, path.clone(), cause));
        }
        let recovered: Vec<_> = self
            .incidents
            .failing()
            .filter(|k| !pass.errors.contains_key(*k))
            .cloned()
            .collect();
        for key in recovered {
            self.incidents.succeeded(key.clone(), now);
            tracing::info!(
                kind = key.0.as_str(),
                path = %key.1.display(),
                "IO limits: the file reads again"
            );
            out.push(Logged::Recovered(key.0, key.1));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::LOG_REPEAT;
    use std::time::Duration;

    #[test]
    fn causes_are_errno_names_or_parse() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // A directory where a file is expected: EISDIR, whoever reads it.
        let e = read_required(Kind::CgroupLimits, d).unwrap_err();
        assert_eq!(e.cause.label(), "EISDIR");
        assert_eq!(e.errno(), Some(libc::EISDIR));
        let missing = d.join("nope");
        assert_eq!(
            read_required(Kind::Diskstats, &missing)
                .unwrap_err()
                .cause
                .label(),
            "ENOENT"
        );
        // Optional files: absent is a fact, a directory is still an error.
        assert!(
            read_optional(Kind::CgroupLimits, &missing)
                .unwrap()
                .is_none()
        );
        assert!(read_optional(Kind::CgroupLimits, d).is_err());
        // Through a regular file as if it were a directory: ENOTDIR.
        let f = d.join("f");
        std::fs::write(&f, [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_optional(Kind::CgroupLimits, &f.join("io.max"))
                .unwrap_err()
                .cause
                .label(),
            "ENOTDIR"
        );
        // Not UTF-8: content we cannot parse.
        assert_eq!(
            read_required(Kind::ProcCgroup, &f)
                .unwrap_err()
                .cause
                .label(),
            "parse"
        );
        assert_eq!(Cause::NotCgroup.label(), "ENOENT");
        let io = |e| Cause::Io(io::Error::from_raw_os_error(e)).label();
        assert_eq!(io(libc::EACCES), "EACCES");
        assert_eq!(io(libc::ESRCH), "ESRCH");
        // Not in this metric's set, though probe errors name it.
        assert_eq!(io(libc::ENOSPC), "other");
        assert_eq!(io(4095), "other");
        assert_eq!(Cause::Io(io::Error::other("no errno")).label(), "other");
    }

    #[test]
    fn a_pass_counts_each_file_once() {
        let mut p = PassErrors::default();
        let path = Path::new("/x/io.max");
        for _ in 0..3 {
            assert_eq!(
                p.note::<()>(Err(ReadError::parse(Kind::CgroupLimits, path, "x"))),
                None
            );
        }
        assert_eq!(p.note(Ok(5)), Some(5));
        p.note::<()>(Err(ReadError::parse(Kind::CgroupCounters, path, "x")));
        assert_eq!(p.len(), 2);
        let labels: Vec<_> = p.labels().collect();
        assert_eq!(
            labels,
            vec![("cgroup_limits", "parse"), ("cgroup_counters", "parse")]
        );
    }

    #[test]
    fn warns_once_then_every_log_repeat_or_on_change_and_says_when_it_recovers() {
        let path = Path::new("/cg/io.max");
        let failing = |cause: Cause| {
            let mut p = PassErrors::default();
            p.note::<()>(Err(ReadError {
                kind: Kind::CgroupLimits,
                path: path.to_path_buf(),
                cause,
            }));
            p
        };
        let mut log = ErrorLog::default();
        let t0 = Instant::now();
        let parse = || failing(Cause::Parse("x".into()));
        assert_eq!(
            log.update(&parse(), t0),
            vec![Logged::Warn(Kind::CgroupLimits, path.into(), "parse")]
        );
        for s in 1..10 {
            assert!(log.update(&parse(), t0 + Duration::from_secs(s)).is_empty());
        }
        // A different cause is news.
        let eio = failing(Cause::Io(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(
            log.update(&eio, t0 + Duration::from_secs(20)),
            vec![Logged::Warn(Kind::CgroupLimits, path.into(), "EIO")]
        );
        assert!(log.update(&eio, t0 + Duration::from_secs(300)).is_empty());
        // LOG_REPEAT after the last warning, once more.
        assert_eq!(
            log.update(&eio, t0 + Duration::from_secs(20) + LOG_REPEAT)
                .len(),
            1
        );
        assert!(
            log.update(&eio, t0 + Duration::from_secs(30) + LOG_REPEAT)
                .is_empty()
        );
        assert_eq!(
            log.update(&PassErrors::default(), t0 + Duration::from_secs(3710)),
            vec![Logged::Recovered(Kind::CgroupLimits, path.into())]
        );
        assert!(
            log.update(&PassErrors::default(), t0 + Duration::from_secs(3720))
                .is_empty()
        );
    }
}
