//! Reading the files the operator names: the configuration file,
//! `--web.config.file`, a `password_file` or passfile, TLS certificates,
//! keys and CA files. Every such read goes through [`read`]: a regular file
//! only, of a bounded size, opened so that nothing can make the open or the
//! read wait. A path given by mistake (`/dev/zero`, a FIFO, a log file)
//! then fails the start or the reload at once with an error that says
//! what the file is, instead of filling memory with an endless device,
//! blocking until a FIFO gets a writer, or acquiring a terminal.
//!
//! Files the kernel serves (/proc, /sys, cgroup files) are read where they
//! are used: they are not regular files of a known size, and the kernel
//! bounds them.
//!
//! None of these opens uses `O_NOFOLLOW`: configuration files and secrets
//! are symlinks as often as not (Kubernetes mounts a ConfigMap or Secret
//! as links into a `..data` directory, and alternatives systems link
//! certificates), and what matters, the type of the file finally opened,
//! is checked on the open descriptor.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a file holds, which sets the most it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `--config.file`.
    Config,
    /// `--web.config.file`.
    WebConfig,
    /// A `[[cluster]]` table's `password_file`: one password.
    Password,
    /// libpq's passfile (`passfile=`, `PGPASSFILE`, `~/.pgpass`).
    Passfile,
    /// libpq's connection service file (`PGSERVICEFILE`,
    /// `~/.pg_service.conf`, `pg_service.conf` in `PGSYSCONFDIR`).
    ServiceFile,
    /// A PEM certificate chain (`tls_server_config.cert_file`).
    Certificate,
    /// A PEM private key (`tls_server_config.key_file`).
    PrivateKey,
    /// PEM CA certificates (`sslrootcert`): a distribution's whole bundle
    /// is about 200 KiB.
    CaCertificates,
    /// A data directory's `PG_VERSION`: one short line.
    PgVersion,
}

impl Kind {
    /// The most a file of this kind may hold, in bytes: far above any real
    /// one, far below what would strain the host.
    pub(crate) const fn limit(self) -> u64 {
        match self {
            Kind::Config | Kind::WebConfig | Kind::Passfile | Kind::ServiceFile => 1 << 20,
            Kind::Certificate | Kind::PrivateKey => 1 << 20,
            Kind::CaCertificates => 4 << 20,
            Kind::Password => 64 << 10,
            Kind::PgVersion => 4 << 10,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Kind::Config => "a configuration file",
            Kind::WebConfig => "a web configuration file",
            Kind::Password => "a password file",
            Kind::Passfile => "a passfile",
            Kind::ServiceFile => "a connection service file",
            Kind::Certificate => "a certificate file",
            Kind::PrivateKey => "a private key file",
            Kind::CaCertificates => "a CA certificate file",
            Kind::PgVersion => "PG_VERSION",
        }
    }
}

/// Why a file was refused before its contents were looked at. Carried as
/// the inner error of an `io::Error`, so callers that tell "unreadable"
/// from "invalid" by the error type keep doing so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A FIFO, a device, a socket or a directory.
    NotRegular(&'static str),
    /// Larger than [`Kind::limit`].
    TooLarge { limit: u64, what: &'static str },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NotRegular(t) => write!(f, "is {t}, not a regular file"),
            Refused::TooLarge { limit, what } => {
                write!(
                    f,
                    "is larger than {}, the most {what} may hold",
                    size(*limit)
                )
            }
        }
    }
}

impl std::error::Error for Refused {}

fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// The file type in words, for anything but a regular file.
fn not_regular(t: std::fs::FileType) -> Option<&'static str> {
    if t.is_file() {
        None
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_dir() {
        Some("a directory")
    } else {
        Some("not a plain file")
    }
}

fn refuse(kind: io::ErrorKind, r: Refused) -> io::Error {
    io::Error::new(kind, r)
}

/// The whole of the regular file at `path` (symlinks followed), at most
/// `kind.limit()` bytes. The error names neither the path nor the key (the
/// caller's message does) and quotes nothing from the file.
///
/// The type is checked twice: by a stat of the path before the open, so
/// that a device is never opened (opening one can have effects of its
/// own: a tape rewinds, a serial line hangs up), and on the opened
/// descriptor, which is the check that counts (the name may have been
/// replaced in between). The open itself cannot wait: `O_NONBLOCK`
/// returns at once from a FIFO without a writer (a plain open waits for
/// one, for ever), and `O_NOCTTY` keeps a terminal from becoming the
/// exporter's controlling terminal. On a regular file `O_NONBLOCK` changes
/// nothing. The size is checked before reading, and the read stops one
/// byte past the limit whatever the size said, for a file that grows
/// while it is read.
pub(crate) fn read(path: &Path, kind: Kind) -> io::Result<Vec<u8>> {
    let limit = kind.limit();
    let too_large = || {
        refuse(
            io::ErrorKind::FileTooLarge,
            Refused::TooLarge {
                limit,
                what: kind.what(),
            },
        )
    };
    let check = |meta: &std::fs::Metadata| -> io::Result<()> {
        if let Some(t) = not_regular(meta.file_type()) {
            return Err(refuse(io::ErrorKind::InvalidInput, Refused::NotRegular(t)));
        }
        if meta.len() > limit {
            return Err(too_large());
        }
        Ok(())
    };
    check(&std::fs::metadata(path)?)?;
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let meta = file.metadata()?;
    check(&meta)?;
    // The size as a hint only: sysfs-like files and files being written
    // report something else than what a read returns.
    let mut out = Vec::with_capacity(usize::try_from(meta.len().min(limit)).unwrap_or(0) + 1);
    file.take(limit + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(out)
}

/// [`read`] as UTF-8 text; a file that is not UTF-8 fails as
/// `std::fs::read_to_string` does (`InvalidData`), without quoting it.
pub(crate) fn read_to_string(path: &Path, kind: Kind) -> io::Result<String> {
    String::from_utf8(read(path, kind)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::{Duration, Instant};

    fn err(path: &Path, kind: Kind) -> String {
        read(path, kind).unwrap_err().to_string()
    }

    #[test]
    fn a_regular_file_is_read_whole_up_to_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, vec![b'x'; Kind::Password.limit() as usize]).unwrap();
        assert_eq!(
            read(&p, Kind::Password).unwrap().len() as u64,
            Kind::Password.limit()
        );
        std::fs::write(&p, vec![b'x'; Kind::Password.limit() as usize + 1]).unwrap();
        let e = read(&p, Kind::Password).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            e.to_string(),
            "is larger than 64 KiB, the most a password file may hold"
        );
        assert_eq!(
            read_to_string(&p, Kind::Config).unwrap().len(),
            64 * 1024 + 1
        );
        // Through a symlink, as Kubernetes mounts secrets.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(read(&link, Kind::Config).is_ok());
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_to_string(&p, Kind::Config).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_at_once() {
        let t0 = Instant::now();
        assert_eq!(
            err(Path::new("/dev/zero"), Kind::Config),
            "is a character device, not a regular file"
        );
        assert_eq!(
            err(Path::new("/dev/null"), Kind::Password),
            "is a character device, not a regular file"
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            err(dir.path(), Kind::Config),
            "is a directory, not a regular file"
        );
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(
            err(&fifo, Kind::Password),
            "is a FIFO (named pipe), not a regular file"
        );
        let e = read(&fifo, Kind::Password).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(matches!(
            e.get_ref().and_then(|r| r.downcast_ref::<Refused>()),
            Some(Refused::NotRegular(_))
        ));
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "nothing waited: {:?}",
            t0.elapsed()
        );
        assert_eq!(
            read(&dir.path().join("missing"), Kind::Config)
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn limits_read_as_sizes() {
        assert_eq!(size(1 << 20), "1 MiB");
        assert_eq!(size(4 << 20), "4 MiB");
        assert_eq!(size(64 << 10), "64 KiB");
        assert_eq!(size(100), "100 bytes");
    }
}
