//! Symbolic errno names for metric labels, from one table.
//!
//! A label value must come from a small known set, so each metric names
//! the errnos it reports by name ([`Set`]) and every other errno is
//! `other`. The sets differ because each was published with its metric:
//! an errno that reads `other` in one set stays `other` there, or series
//! that dashboards and alerts match would change name.

/// Which metric's label set a name is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Set {
    /// Storage IO and the sockets around it: `error` of
    /// `pgstorage_probe_errors_total` and of
    /// `pgstorage_http_accept_errors_total`.
    Io,
    /// Reads of `/proc`, `/sys` and `postmaster.pid`: `cause` of
    /// `pgstorage_limits_read_errors_total`.
    Read,
}

const IO: u8 = 1;
const READ: u8 = 2;
const BOTH: u8 = IO | READ;

/// (errno, name, the sets that name it).
const NAMES: &[(i32, &str, u8)] = &[
    (libc::EIO, "EIO", BOTH),
    (libc::ENOSPC, "ENOSPC", IO),
    (libc::EDQUOT, "EDQUOT", IO),
    (libc::EROFS, "EROFS", IO),
    (libc::EINVAL, "EINVAL", BOTH),
    (libc::EBADF, "EBADF", IO),
    (libc::EPERM, "EPERM", BOTH),
    (libc::EACCES, "EACCES", BOTH),
    (libc::EAGAIN, "EAGAIN", BOTH),
    (libc::EINTR, "EINTR", BOTH),
    (libc::ENOMEM, "ENOMEM", BOTH),
    (libc::EFBIG, "EFBIG", IO),
    (libc::ENODEV, "ENODEV", BOTH),
    (libc::ENXIO, "ENXIO", BOTH),
    (libc::ENOENT, "ENOENT", BOTH),
    (libc::ECANCELED, "ECANCELED", IO),
    (libc::ETIMEDOUT, "ETIMEDOUT", IO),
    (libc::EOPNOTSUPP, "EOPNOTSUPP", BOTH),
    (libc::ENOSYS, "ENOSYS", IO),
    (libc::ESTALE, "ESTALE", BOTH),
    (libc::EFAULT, "EFAULT", IO),
    (libc::EBUSY, "EBUSY", BOTH),
    (libc::EMFILE, "EMFILE", BOTH),
    (libc::ENFILE, "ENFILE", BOTH),
    (libc::ELOOP, "ELOOP", BOTH),
    (libc::EEXIST, "EEXIST", IO),
    (libc::ENOTDIR, "ENOTDIR", BOTH),
    (libc::EISDIR, "EISDIR", BOTH),
    (libc::EUCLEAN, "EUCLEAN", IO),
    (libc::ENOLINK, "ENOLINK", IO),
    (libc::ECONNRESET, "ECONNRESET", IO),
    (libc::EHOSTDOWN, "EHOSTDOWN", IO),
    (libc::ESRCH, "ESRCH", READ),
    (libc::ENAMETOOLONG, "ENAMETOOLONG", READ),
    (libc::ENOTCONN, "ENOTCONN", READ),
];

/// The errno's name in `set`, or `other`.
pub(crate) fn name(set: Set, errno: i32) -> &'static str {
    let bit = match set {
        Set::Io => IO,
        Set::Read => READ,
    };
    NAMES
        .iter()
        .find(|(e, _, sets)| *e == errno && sets & bit != 0)
        .map_or("other", |(_, n, _)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(set: Set) -> Vec<&'static str> {
        let mut v: Vec<_> = (0..4096)
            .map(|e| name(set, e))
            .filter(|n| *n != "other")
            .collect();
        v.sort_unstable();
        v
    }

    /// The label values each metric has published: a name added to a set
    /// turns series that read `other` into new ones.
    #[test]
    fn each_set_names_exactly_its_published_errnos() {
        let mut io = vec![
            "EIO",
            "ENOSPC",
            "EDQUOT",
            "EROFS",
            "EINVAL",
            "EBADF",
            "EPERM",
            "EACCES",
            "EAGAIN",
            "EINTR",
            "ENOMEM",
            "EFBIG",
            "ENODEV",
            "ENXIO",
            "ENOENT",
            "ECANCELED",
            "ETIMEDOUT",
            "EOPNOTSUPP",
            "ENOSYS",
            "ESTALE",
            "EFAULT",
            "EBUSY",
            "EMFILE",
            "ENFILE",
            "ELOOP",
            "EEXIST",
            "ENOTDIR",
            "EISDIR",
            "EUCLEAN",
            "ENOLINK",
            "ECONNRESET",
            "EHOSTDOWN",
        ];
        io.sort_unstable();
        assert_eq!(names(Set::Io), io);
        let mut read = vec![
            "EACCES",
            "EPERM",
            "ENOENT",
            "ENOTDIR",
            "EISDIR",
            "EIO",
            "ESRCH",
            "ENODEV",
            "ENXIO",
            "EINVAL",
            "ELOOP",
            "ENAMETOOLONG",
            "EMFILE",
            "ENFILE",
            "ENOMEM",
            "EAGAIN",
            "EBUSY",
            "EINTR",
            "EOPNOTSUPP",
            "ESTALE",
            "ENOTCONN",
        ];
        read.sort_unstable();
        assert_eq!(names(Set::Read), read);
    }

    #[test]
    fn names_are_the_errnos_own() {
        assert_eq!(name(Set::Io, libc::ENOSPC), "ENOSPC");
        assert_eq!(name(Set::Read, libc::ENOSPC), "other");
        assert_eq!(name(Set::Read, libc::ESRCH), "ESRCH");
        assert_eq!(name(Set::Io, libc::ESRCH), "other");
        assert_eq!(name(Set::Io, 0), "other");
        assert_eq!(name(Set::Io, -1), "other");
        // One row per errno: a second row would never be reached.
        let mut seen: Vec<i32> = NAMES.iter().map(|(e, _, _)| *e).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), NAMES.len());
    }
}
