//! The PostgreSQL rows of the fault matrix, each against a real PostgreSQL
//! server started by the test harness (tests/suite/common/pg.rs):
//!
//! - a statistics query that hangs server-side (a catalog lock): cancelled
//!   at statement_timeout, counted with `cause="timeout"`, the other queries
//!   go on, one log line, recovery when the lock goes;
//! - a server that stops answering at all (postmaster and the exporter's
//!   backend stopped with SIGSTOP): the client deadline drops the
//!   connection, `pgstorage_pg_up` goes to 0, reconnection after SIGCONT;
//! - a role without pg_read_all_stats, which sees NULL wait events for other
//!   roles' backends: counted in `pgstorage_pg_wait_hidden_backends`, no
//!   query error, one warning; a pg_monitor role sees the waits. On every
//!   supported version, 14 to 18 (the others on 18).
//!
//! Every test also checks from the server log (`log_statement = 'all'` for
//! the exporter's roles) that the exporter ran nothing but SELECT and SET.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::pg::{self, PgKind, PgServer};
use common::stack::{Stack, StackBuilder};
use common::*;

const PASSWORD: &str = "Fault-Pa55word-4-tests";

/// PostgreSQL `kind` and the exporter with a small probed volume of its own;
/// the test adds roles and clusters (see [`cluster`]).
fn stack<'a>(kind: PgKind) -> StackBuilder<'a> {
    Stack::builder()
        .pg_version(kind)
        .password(PASSWORD)
        .volume("interval = \"200ms\"\nread_file_size = \"4MiB\"\nfree_space_reserve = \"0\"")
}

/// The keys of a `[[cluster]]`: fast intervals, no discovery.
fn cluster(statement_timeout: &str) -> String {
    format!(
        "scrape_interval = \"500ms\"\nwait_sampling_interval = \"200ms\"\n\
         statement_timeout = \"{statement_timeout}\"\ndiscover_volumes = false\n"
    )
}

fn pg_up(m: &str, cluster: &str) -> Option<f64> {
    sample(m, &format!("pgstorage_pg_up{{cluster=\"{cluster}\"}}"))
}

/// Sum of `pgstorage_pg_scrape_errors_total` over the series with these
/// labels.
fn errors(m: &str, labels: &[&str]) -> f64 {
    samples_with(m, "pgstorage_pg_scrape_errors_total", labels)
        .iter()
        .map(|(_, v)| v)
        .sum()
}

fn hidden(m: &str, cluster: &str) -> Option<f64> {
    sample(
        m,
        &format!("pgstorage_pg_wait_hidden_backends{{cluster=\"{cluster}\"}}"),
    )
}

fn pg_sleep_seconds(m: &str, cluster: &str) -> f64 {
    samples_with(
        m,
        "pgstorage_pg_wait_event_seconds_total",
        &[&format!("cluster=\"{cluster}\""), "wait_event=\"PgSleep\""],
    )
    .iter()
    .map(|(_, v)| v)
    .sum()
}

/// Log lines of this level (`warn`, printed `level=WARN` as slog does)
/// holding every needle.
fn log_lines(log: &str, level: &str, needles: &[&str]) -> Vec<String> {
    let level = format!("level={}", level.to_ascii_uppercase());
    log.lines()
        .filter(|l| l.contains(&level) && needles.iter().all(|n| l.contains(n)))
        .map(str::to_string)
        .collect()
}

/// Makes the server log every statement `role` runs.
fn log_statements_of(pg: &PgServer, role: &str) {
    pg.psql(&format!("ALTER ROLE {role} SET log_statement = 'all'"));
}

/// Checks from the server log that `role` ran only SELECT and SET: the
/// exporter never writes. Returns how many statements it ran.
fn assert_only_reads(pg: &PgServer, role: &str) -> usize {
    let log = pg.log();
    // log_line_prefix is '%m [%p] %q%u@%d ': "... [pid] mon@postgres LOG:  ...".
    let tag = format!(" {role}@postgres LOG:  ");
    let mut n = 0;
    for line in log.lines() {
        let Some(rest) = line.split(&tag).nth(1) else {
            continue;
        };
        // Simple protocol: "statement: SQL"; extended: "execute NAME: SQL".
        let sql = if let Some(s) = rest.strip_prefix("statement: ") {
            s
        } else if let Some(s) = rest.strip_prefix("execute ") {
            s.split_once(": ").map(|(_, sql)| sql).unwrap_or("")
        } else {
            continue;
        };
        n += 1;
        let verb = sql
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        assert!(
            verb == "SELECT" || verb == "SET",
            "{role} ran something else than SELECT or SET: {line}"
        );
    }
    assert!(n > 0, "no statement of {role} in the server log");
    n
}

/// A psql session as the superuser over the unix socket that stays open:
/// the statements it runs hold their transaction, and it exists before a
/// lock on pg_database would keep new connections from starting.
struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    marks: u32,
}

impl Session {
    fn open(pg: &PgServer) -> Session {
        let mut c = pg.command("psql");
        c.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(pg.socket_dir())
            .args([
                "-p",
                &pg.port().to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx2.send(format!("stderr: {l}"));
            }
        });
        let mut s = Session {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            marks: 0,
        };
        s.run("SELECT 1", Duration::from_secs(30));
        s
    }

    /// Runs SQL and waits until psql has done it (a marker query after it
    /// prints); panics on an error or after `timeout`.
    fn run(&mut self, sql: &str, timeout: Duration) -> Vec<String> {
        self.marks += 1;
        let mark = format!("mark-{}", self.marks);
        let stdin = self.stdin.as_mut().unwrap();
        // The lone ';' ends `sql` when it lacks one (an empty statement
        // otherwise).
        writeln!(stdin, "{sql}\n;\nSELECT '{mark}';").unwrap();
        stdin.flush().unwrap();
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == mark => return out,
                Ok(l) if l.starts_with("stderr: ") => panic!("psql: {l} (running {sql})"),
                Ok(l) => out.push(l),
                Err(e) => panic!("psql did not finish {sql:?} within {timeout:?}: {e}"),
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Row 1: a query that hangs server-side. A superuser session holds an
/// ACCESS EXCLUSIVE lock on pg_database; pg_stat_database and
/// pg_stat_activity join pg_database, so the exporter's `database` query
/// (commits) and its wait sampling wait for the lock until lock_timeout /
/// statement_timeout (1 s here) cancel them, while pg_settings, pg_stat_wal
/// and pg_stat_bgwriter read no catalog and go on.
#[test]
fn a_query_blocked_by_a_catalog_lock_times_out_and_the_others_go_on() {
    let Some(stack) = stack(PgKind::V18)
        .role("mon", true)
        .setup(|pg| {
            log_statements_of(pg, "mon");
            pg.psql("CREATE TABLE w(v int)");
        })
        .cluster("c", "mon", &cluster("1s"))
        .ready("pg_up 1 with commits", Duration::from_secs(30), |m| {
            pg_up(m, "c") == Some(1.0)
                && sample(m, "pgstorage_pg_commits_total{cluster=\"c\"}").is_some()
        })
        .start()
    else {
        return;
    };
    let (pg, ex, m0) = (&stack.pg, &stack.ex, stack.ready.clone());
    // Both sessions exist before the lock: a new connection would wait for
    // pg_database too.
    let mut writer = Session::open(pg);
    let mut locker = Session::open(pg);
    let records =
        |m: &str| sample(m, "pgstorage_pg_wal_records_total{cluster=\"c\"}").unwrap_or(-1.0);
    let timeouts = |m: &str| {
        errors(
            m,
            &["cluster=\"c\"", "query=\"database\"", "cause=\"timeout\""],
        )
    };
    assert_eq!(timeouts(&m0), 0.0, "no timeout before the lock");

    locker.run(
        "BEGIN; LOCK TABLE pg_catalog.pg_database IN ACCESS EXCLUSIVE MODE;",
        Duration::from_secs(30),
    );
    let locked = Instant::now();
    let r0 = records(&ex.metrics());
    // WAL from a session that was connected before the lock. A backend
    // hands its statistics to shared memory at most once a second, or 10 s
    // after going idle; pg_stat_force_next_flush() makes it do so at the end
    // of that very statement.
    writer.run(
        "INSERT INTO w SELECT generate_series(1, 1000); SELECT pg_stat_force_next_flush();",
        Duration::from_secs(30),
    );
    let mut ups = Vec::new();
    let m = loop {
        let m = ex.metrics();
        ups.push(pg_up(&m, "c"));
        if timeouts(&m) >= 3.0 && records(&m) > r0 {
            break m;
        }
        assert!(
            locked.elapsed() < Duration::from_secs(40),
            "no 3 timeouts with WAL records moving; last scrape:\n{m}\nlog:\n{}",
            ex.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let during = locked.elapsed();
    assert!(
        ups.iter().all(|u| *u == Some(1.0)),
        "pg_up left 1 during the lock: {ups:?}"
    );
    assert!(
        sample(&m, "pgstorage_pg_commits_total{cluster=\"c\"}").is_none(),
        "commits come from the timed-out query: absent, not stale"
    );
    assert!(m.contains("pgstorage_pg_setting_info{cluster=\"c\",name=\"wal_sync_method\""));
    let (db_timeouts, wait_timeouts) = (
        timeouts(&m),
        errors(
            &m,
            &["cluster=\"c\"", "query=\"waits\"", "cause=\"timeout\""],
        ),
    );
    assert!(
        errors(&m, &["cluster=\"c\"", "cause=\"client_timeout\""]) == 0.0,
        "the server cancelled in time: no client deadline"
    );
    let log = ex.wait_log("query=database", Duration::from_secs(10));
    let warned = log_lines(&log, "warn", &["query=database"]);
    assert_eq!(
        warned.len(),
        1,
        "one line for {db_timeouts} timeouts:\n{log}"
    );
    assert!(warned[0].contains("cause=timeout"), "{}", warned[0]);
    assert!(
        warned[0].contains("statement timeout") || warned[0].contains("lock timeout"),
        "the server's reason: {}",
        warned[0]
    );
    eprintln!(
        "lock held {during:?}: database timeouts {db_timeouts}, waits timeouts {wait_timeouts}, \
         WAL records {r0} -> {}, pg_up over {} scrapes: all 1",
        records(&m),
        ups.len()
    );

    locker.run("ROLLBACK", Duration::from_secs(30));
    let unlocked = Instant::now();
    let m1 = ex.wait_for("commits back", Duration::from_secs(30), |m| {
        sample(m, "pgstorage_pg_commits_total{cluster=\"c\"}").is_some()
    });
    let back = unlocked.elapsed();
    let e1 = timeouts(&m1);
    // Four scrape rounds later the count has not moved.
    std::thread::sleep(Duration::from_secs(2));
    let m2 = ex.metrics();
    assert_eq!(timeouts(&m2), e1, "timeouts stopped with the lock");
    assert_eq!(pg_up(&m2, "c"), Some(1.0));
    let log = ex.wait_log("query succeeds again", Duration::from_secs(10));
    let recovered = log_lines(&log, "info", &["query=database", "query succeeds again"]);
    assert_eq!(recovered.len(), 1, "{log}");
    eprintln!(
        "log lines about the database query:\n{}\n{}",
        warned[0], recovered[0]
    );
    assert_eq!(
        log_lines(&log, "warn", &["query=database"]).len(),
        1,
        "{log}"
    );
    let reads = assert_only_reads(pg, "mon");
    eprintln!(
        "after ROLLBACK: commits back in {back:?}, database timeouts stayed at {e1}; \
         {reads} statements of the exporter in the server log, all SELECT or SET"
    );
    drop(writer);
}

/// Sends `sig` to `pid`.
fn signal(pid: i32, sig: i32) {
    // SAFETY: plain kill(2) on a PostgreSQL process this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// Stopped processes, continued when dropped, so a failing test never
/// leaves a stopped PostgreSQL behind (the harness could not stop it).
struct Stopped(Vec<i32>);

impl Stopped {
    fn stop(pids: &[i32]) -> Stopped {
        for &p in pids {
            signal(p, libc::SIGSTOP);
        }
        Stopped(pids.to_vec())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: plain kill(2) on a process this test stopped.
            unsafe { libc::kill(p, libc::SIGCONT) };
        }
    }
}

/// Socket inodes of the TCP connections of process `pid` to
/// 127.0.0.1:`port` in state ESTABLISHED, from /proc/net/tcp and the
/// process's descriptors.
fn established_to(pid: u32, port: u16) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let remote = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            // sl local remote st tx:rx tr:when retrnsmt uid timeout inode
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[2] == remote && f[3] == "01" && inodes.iter().any(|i| i == f[9]))
                .then(|| f[9].to_string())
        })
        .collect()
}

/// Row 2: a server that stops answering entirely, which no
/// statement_timeout can report: the postmaster and the backend serving the
/// exporter are stopped with SIGSTOP. The kernel still accepts TCP
/// connections on the listening socket, so new connections hang in the
/// start-up packet exchange too.
#[test]
fn a_server_that_stops_answering_is_dropped_and_reconnected() {
    // Client deadlines: 1 s + 2 s per statement, 2 s per connection attempt.
    let Some(mut stack) = stack(PgKind::V18)
        .role("mon", true)
        .setup(|pg| log_statements_of(pg, "mon"))
        .cluster_dsn("c", "mon", "connect_timeout=2", &cluster("1s"))
        .ready_pg_up("c")
        .start()
    else {
        return;
    };
    let (pg, ex) = (&stack.pg, &mut stack.ex);
    let backend: i32 = pg
        .psql(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pg-storage-exporter' \
             AND usename = 'mon'",
        )
        .parse()
        .unwrap();
    let postmaster: i32 = std::fs::read_to_string(pg.data_dir().join("postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let first = established_to(ex.child.id(), pg.port());
    assert_eq!(first.len(), 1, "the exporter's one connection: {first:?}");
    let stopped_at = Instant::now();
    let stopped = Stopped::stop(&[postmaster, backend]);
    let m = ex.wait_for("pg_up 0", Duration::from_secs(30), |m| {
        pg_up(m, "c") == Some(0.0)
    });
    let to_down = stopped_at.elapsed();
    assert!(
        sample(&m, "pgstorage_pg_wal_records_total{cluster=\"c\"}").is_none(),
        "no stale figures while down"
    );
    let lost = errors(&m, &["cluster=\"c\"", "cause=\"client_timeout\""])
        - errors(&m, &["cluster=\"c\"", "query=\"connect\""]);
    assert!(lost >= 1.0, "the query that got no answer is counted: {m}");
    // The reconnection attempts hang in the start-up exchange: cut at the
    // connect deadline, counted, not logged again.
    let m = ex.wait_for(
        "2 connection attempts cut at the deadline",
        Duration::from_secs(40),
        |m| {
            errors(
                m,
                &[
                    "cluster=\"c\"",
                    "query=\"connect\"",
                    "cause=\"client_timeout\"",
                ],
            ) >= 2.0
        },
    );
    assert_eq!(pg_up(&m, "c"), Some(0.0));
    // The abandoned connection is closed, not kept open by the driver's task
    // waiting for a reply that never comes; at most the attempt in flight
    // (accepted by the kernel, waiting for the stopped postmaster) is open.
    let mut open = 0;
    for _ in 0..10 {
        let now = established_to(ex.child.id(), pg.port());
        assert!(
            !now.contains(&first[0]),
            "the abandoned connection is still open: {now:?}"
        );
        open = open.max(now.len());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(open <= 1, "{open} connections to the stopped server");
    let connects = errors(
        &m,
        &[
            "cluster=\"c\"",
            "query=\"connect\"",
            "cause=\"client_timeout\"",
        ],
    );
    let log = ex.log();
    let warned = log_lines(&log, "warn", &["cluster=c"]);
    assert_eq!(warned.len(), 1, "one line for the outage:\n{log}");
    assert!(warned[0].contains("cause=client_timeout"), "{}", warned[0]);
    assert!(warned[0].contains("stopped answering"), "{}", warned[0]);
    eprintln!(
        "stopped: pg_up 0 after {to_down:?}; client_timeout errors: {lost} query, then {connects} \
         connection attempts; at most {open} connection open; 1 warn line:\n{}",
        warned[0]
    );

    let continued_at = Instant::now();
    drop(stopped);
    ex.wait_for("pg_up back to 1", Duration::from_secs(60), |m| {
        pg_up(m, "c") == Some(1.0)
    });
    let to_up = continued_at.elapsed();
    assert!(ex.child.try_wait().unwrap().is_none(), "the same exporter");
    let log = ex.wait_log("reconnected to PostgreSQL", Duration::from_secs(10));
    assert_eq!(log_lines(&log, "warn", &["cluster=c"]).len(), 1, "{log}");
    let reconnected = log_lines(&log, "info", &["reconnected to PostgreSQL"]);
    assert_eq!(reconnected.len(), 1, "{log}");
    eprintln!("{}", reconnected[0]);
    // The stopped backend, continued, finds its client gone and exits: the
    // exporter kept no connection to it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let sessions = loop {
        let n: u32 = pg
            .psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'mon'")
            .parse()
            .unwrap();
        if n == 1 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(sessions, 1, "one exporter session after recovery");
    assert!(
        pg::wait_gone(backend, Duration::from_secs(10)),
        "old backend exited"
    );
    let reads = assert_only_reads(pg, "mon");
    eprintln!(
        "continued: pg_up 1 after {to_up:?}, 1 exporter session, old backend gone; \
         {reads} statements of the exporter, all SELECT or SET"
    );
}

/// Sessions of another role sleeping in pg_sleep; killed (they are our
/// psql processes) when dropped.
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn start(pg: &PgServer, role: &str, n: usize) -> Sleepers {
        let mut v = Vec::new();
        for _ in 0..n {
            let mut c = pg.command("psql");
            c.env("PGPASSWORD", PASSWORD)
                .args(["-X", "-q", "-h", "127.0.0.1", "-p", &pg.port().to_string()])
                .args(["-U", role, "-d", "postgres", "-c", "SELECT pg_sleep(120)"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            v.push(c.spawn().unwrap());
        }
        Sleepers(v)
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Row 3: without pg_read_all_stats a role sees other roles' backends with
/// NULL wait_event_type, wait_event, state and backend_type. One exporter
/// watches the same server as a plain role (`blind`) and as a pg_monitor
/// role (`mon`) while 3 sessions of a third role sleep.
fn hidden_wait_events_are_counted(kind: PgKind) {
    let Some(stack) = stack(kind)
        .role("blind", false)
        .role("mon", true)
        .role("sleeper", false)
        .setup(|pg| {
            log_statements_of(pg, "blind");
            log_statements_of(pg, "mon");
        })
        .cluster("blind", "blind", &cluster("5s"))
        .cluster("mon", "mon", &cluster("5s"))
        .ready("both up with a wait sample", Duration::from_secs(30), |m| {
            pg_up(m, "blind") == Some(1.0)
                && pg_up(m, "mon") == Some(1.0)
                && hidden(m, "blind").is_some()
                && hidden(m, "mon").is_some()
        })
        .start()
    else {
        return;
    };
    let (pg, ex) = (&stack.pg, &stack.ex);
    // Background processes are hidden from a plain role too: the baseline
    // is the lowest count of a few samples (an autovacuum worker may come
    // and go).
    let mut base = f64::MAX;
    for _ in 0..5 {
        base = base.min(hidden(&ex.metrics(), "blind").unwrap());
        std::thread::sleep(Duration::from_millis(250));
    }

    let sleepers = Sleepers::start(pg, "sleeper", 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    while pg.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") != "3" {
        assert!(Instant::now() < deadline, "the 3 sleepers never slept");
        std::thread::sleep(Duration::from_millis(100));
    }
    let m = ex.wait_for(
        "3 more hidden backends for blind, PgSleep seen by mon",
        Duration::from_secs(30),
        |m| {
            hidden(m, "blind").unwrap_or(0.0) >= base + 3.0
                && sample(
                    m,
                    "pgstorage_pg_backends_waiting{cluster=\"mon\",wait_event_type=\"Timeout\"}",
                )
                .unwrap_or(0.0)
                    >= 3.0
        },
    );
    let blind_hidden = hidden(&m, "blind").unwrap();
    assert!(blind_hidden >= 3.0);
    assert_eq!(
        errors(&m, &["cluster=\"blind\"", "query=\"waits\""]),
        0.0,
        "NULL wait events are no query error: {m}"
    );
    assert_eq!(
        pg_sleep_seconds(&m, "blind"),
        0.0,
        "blind cannot see PgSleep"
    );
    assert_eq!(
        hidden(&m, "mon"),
        Some(0.0),
        "pg_monitor sees every backend"
    );
    let mon_sleep = pg_sleep_seconds(&m, "mon");
    assert!(mon_sleep > 0.0, "{m}");
    let log = ex.log();
    let warned = log_lines(&log, "warn", &["pg_read_all_stats"]);
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("cluster=blind"), "{}", warned[0]);
    eprintln!("{}", warned[0]);
    assert!(
        log_lines(&log, "warn", &["cluster=mon"]).is_empty(),
        "{log}"
    );
    eprintln!(
        "PostgreSQL {}: blind role: hidden backends {base} before, {blind_hidden} with 3 sleepers, \
         PgSleep 0 s, waits errors 0; pg_monitor role: hidden 0, PgSleep {mon_sleep:.1} backend-s",
        pg.major()
    );

    // The fault clears: granted pg_read_all_stats, the same session sees
    // every backend from its next sample on.
    pg.psql("GRANT pg_read_all_stats TO blind");
    let granted = Instant::now();
    let m = ex.wait_for("blind sees the sleepers", Duration::from_secs(30), |m| {
        hidden(m, "blind") == Some(0.0) && pg_sleep_seconds(m, "blind") > 0.0
    });
    eprintln!(
        "PostgreSQL {}: after GRANT pg_read_all_stats: hidden 0 and PgSleep {:.1} backend-s for blind within {:?}",
        pg.major(),
        pg_sleep_seconds(&m, "blind"),
        granted.elapsed()
    );
    pg.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'sleeper'");
    drop(sleepers);
    let reads = assert_only_reads(pg, "blind") + assert_only_reads(pg, "mon");
    eprintln!("{reads} statements of the exporter, all SELECT or SET");
    pg::report(&format!(
        "postgres {}: hidden waits ok, plain role {base} hidden idle / {blind_hidden} with 3 sleepers, \
         pg_monitor role 0 hidden, {reads} statements all SELECT or SET",
        pg.version()
    ));
}

#[test]
fn hidden_wait_events_are_counted_14() {
    hidden_wait_events_are_counted(PgKind::V14);
}

#[test]
fn hidden_wait_events_are_counted_15() {
    hidden_wait_events_are_counted(PgKind::V15);
}

#[test]
fn hidden_wait_events_are_counted_16() {
    hidden_wait_events_are_counted(PgKind::V16);
}

#[test]
fn hidden_wait_events_are_counted_17() {
    hidden_wait_events_are_counted(PgKind::V17);
}

#[test]
fn hidden_wait_events_are_counted_18() {
    hidden_wait_events_are_counted(PgKind::V18);
}
