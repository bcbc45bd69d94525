//! The session's client as the views use it. Every statement goes through
//! [`Db`], which gives up on it at the client deadline (statement_timeout
//! plus a margin, see `failure::DEADLINE_MARGIN`), prepared once per
//! connection, or as a simple query on a replication session, which
//! refuses prepared statements (see [`Statements`]); its rows are [`Row`]s,
//! read alike whichever protocol carried them.
//!
//! The views cast every column to float8 so that counters of any width
//! (int8, numeric, double precision) read the same way; SQL NULL (a time
//! with timing off, a column a backend type never fills) stays `None` and
//! becomes an absent series, never a zero.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_postgres::error::{Severity, SqlState};
use tokio_postgres::{Client, SimpleQueryMessage, SimpleQueryRow, Statement};

use super::failure::{DEADLINE_MARGIN, QueryError};

pub(crate) type QResult<T> = Result<T, QueryError>;

/// A connection's statements, each prepared on its first use and kept for
/// as long as the connection lives, and the protocol the connection takes.
///
/// tokio-postgres runs a query given as text in three exchanges: Parse and
/// Describe (to learn the column types), then Bind and Execute, then a
/// Close of the statement it named. The server parses, analyses and plans
/// it every time: for the wait-event query over `pg_stat_activity` on 18
/// that was about 0.3 ms of the backend's CPU each second, against 0.03 ms
/// for executing the statement prepared once, whose plan the server keeps
/// (a statement without parameters gets its generic plan at once). One
/// exchange per query also wakes the backend and the exporter a third as
/// often.
///
/// A replication session (`replication=database`: a walsender that also
/// runs SQL) refuses the extended protocol, Parse included. There every
/// statement goes as one simple Query message, parsed and planned each
/// time: the same single exchange, the planning cost above (see
/// [`refuses_extended`]).
#[derive(Default)]
pub(crate) struct Statements {
    prepared: Mutex<HashMap<&'static str, Statement>>,
    simple: AtomicBool,
    /// The cluster, named in the line that logs the switch.
    cluster: String,
    /// The transactions the connection committed: in autocommit every
    /// exchange that ends in a Sync (a prepare, an execution) or a simple
    /// query is one transaction, read-only or not, and pg_stat_database's
    /// `xact_commit` counts each. The one-commit basis compares commits
    /// with WAL syncs, and the exporter's own would read as commits that
    /// needed no sync (see `Db::own_commits`).
    commits: AtomicU64,
}

impl std::fmt::Debug for Statements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.prepared.lock().map(|m| m.len()).unwrap_or(0);
        f.debug_struct("Statements")
            .field("prepared", &n)
            .field("simple", &self.simple())
            .field("commits", &self.commits.load(Ordering::Relaxed))
            .finish()
    }
}

impl Statements {
    /// The statements of a new connection to `cluster`: none prepared, the
    /// extended protocol until the server refuses it.
    pub(crate) fn new(cluster: &str) -> Statements {
        Statements {
            cluster: cluster.to_string(),
            ..Default::default()
        }
    }

    /// A fresh set for the same connection: none prepared, the protocol
    /// this one found kept (the server refuses the extended protocol for
    /// the whole session).
    pub(crate) fn renew(&self) -> Statements {
        Statements {
            simple: AtomicBool::new(self.simple()),
            ..Statements::new(&self.cluster)
        }
    }

    /// Whether the connection sends its statements as simple queries.
    pub(crate) fn simple(&self) -> bool {
        self.simple.load(Ordering::Relaxed)
    }

    /// Switches the connection to the simple protocol for good; logs it
    /// once (statements sent together may all be refused).
    fn go_simple(&self, why: &tokio_postgres::Error) {
        if !self.simple.swap(true, Ordering::Relaxed) {
            tracing::info!(
                cluster = %self.cluster,
                server = %super::tls::describe(why),
                "the server refuses the extended query protocol on this connection (a replication \
                 session): statements go as simple queries, parsed and planned each time"
            );
        }
    }

    fn get(&self, sql: &'static str) -> Option<Statement> {
        self.prepared.lock().ok()?.get(sql).cloned()
    }

    fn put(&self, sql: &'static str, s: &Statement) {
        if let Ok(mut m) = self.prepared.lock() {
            m.insert(sql, s.clone());
        }
    }

    /// Forgets a statement whose execution failed: prepared again on its
    /// next use. What failed may be the statement itself (a view replaced
    /// since: "cached plan must not change result type"); re-preparing
    /// after a cancelled or refused one costs one exchange.
    fn forget(&self, sql: &'static str) {
        if let Ok(mut m) = self.prepared.lock() {
            m.remove(sql);
        }
    }

    fn committed(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether preparing a statement failed because the session is a
/// walsender. PostgreSQL's `forbidden_in_wal_sender` (tcop/postgres.c)
/// answers every Parse, Bind, Execute or Describe of a walsender with
/// ERROR 08P01 (protocol_violation), "extended query protocol not
/// supported in a replication connection"; the session goes on, and takes
/// simple Query messages. The message is translated (lc_messages: German
/// servers say "erweitertes Anfrageprotokoll wird nicht auf einer
/// Replikationsverbindung unterstützt"), so the SQLSTATE and the severity
/// (ERROR, not the FATAL that ends a session), which are never translated,
/// decide. No other 08P01 ERROR answers the Parse of a well-formed
/// statement, and a connection switched wrongly would only parse and plan
/// its statements each time.
fn refuses_extended(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == SqlState::PROTOCOL_VIOLATION && db.parsed_severity() == Some(Severity::Error)
    })
}

/// One row of an answer, as the protocol that carried it gives its
/// values: binary and typed (extended protocol), or PostgreSQL's text
/// output (simple protocol). Every accessor gives `None` for SQL NULL,
/// a column the row does not have, or a value not of the accessor's type.
#[derive(Debug)]
pub(crate) enum Row {
    Extended(tokio_postgres::Row),
    Simple(SimpleQueryRow),
}

impl Row {
    fn raw(r: &SimpleQueryRow, i: usize) -> Option<&str> {
        r.try_get(i).ok().flatten()
    }

    /// A float8 column: the views cast every figure to it (see the module
    /// documentation).
    pub(crate) fn float(&self, i: usize) -> Option<f64> {
        match self {
            Row::Extended(r) => r.try_get::<_, Option<f64>>(i).ok().flatten(),
            Row::Simple(r) => Row::raw(r, i).and_then(text::float),
        }
    }

    /// A text (or name, varchar) column.
    pub(crate) fn text(&self, i: usize) -> Option<&str> {
        match self {
            Row::Extended(r) => r.try_get::<_, Option<&str>>(i).ok().flatten(),
            Row::Simple(r) => Row::raw(r, i),
        }
    }

    pub(crate) fn bool(&self, i: usize) -> Option<bool> {
        match self {
            Row::Extended(r) => r.try_get::<_, Option<bool>>(i).ok().flatten(),
            Row::Simple(r) => Row::raw(r, i).and_then(text::bool),
        }
    }

    /// An int2, int4 or int8 column.
    pub(crate) fn int(&self, i: usize) -> Option<i64> {
        match self {
            Row::Extended(r) => r
                .try_get::<_, Option<i64>>(i)
                .or_else(|_| r.try_get::<_, Option<i32>>(i).map(|v| v.map(i64::from)))
                .or_else(|_| r.try_get::<_, Option<i16>>(i).map(|v| v.map(i64::from)))
                .ok()
                .flatten(),
            Row::Simple(r) => Row::raw(r, i).and_then(text::int),
        }
    }

    /// Column `i` through `get`, or an error naming the column when it is
    /// NULL or not of that type: for values the statement always returns.
    pub(crate) fn need<'r, T>(
        &'r self,
        i: usize,
        get: fn(&'r Row, usize) -> Option<T>,
    ) -> QResult<T> {
        get(self, i).ok_or(QueryError::Column(i))
    }
}

/// PostgreSQL's text output of the types the views read, as the simple
/// protocol carries it (postgres-types' `FromSql` reads the binary format
/// only).
pub(crate) mod text {
    /// float8out: digits as Rust's `f64` parser reads them ("1.5",
    /// "1e+20", "-0"), or "NaN", "Infinity", "-Infinity", which it also
    /// reads (it takes them in any case).
    pub(crate) fn float(s: &str) -> Option<f64> {
        s.parse().ok()
    }

    /// boolout: "t" or "f".
    pub(crate) fn bool(s: &str) -> Option<bool> {
        match s {
            "t" => Some(true),
            "f" => Some(false),
            _ => None,
        }
    }

    /// int2out, int4out, int8out: an optional minus and decimal digits.
    pub(crate) fn int(s: &str) -> Option<i64> {
        s.parse().ok()
    }
}

/// The session's client, with the deadline after which a statement that got
/// no answer at all (not even the server's cancellation at
/// statement_timeout) is abandoned.
#[derive(Clone, Copy)]
pub(crate) struct Db<'a> {
    client: &'a Client,
    statements: &'a Statements,
    deadline: Duration,
}

impl std::fmt::Debug for Db<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl<'a> Db<'a> {
    /// `statements` must belong to `client`'s connection: a statement is
    /// prepared on one connection and exists on that one only.
    pub(crate) fn new(
        client: &'a Client,
        statements: &'a Statements,
        deadline: Duration,
    ) -> Db<'a> {
        Db {
            client,
            statements,
            deadline,
        }
    }

    /// This client for a statement sent behind `n` others in one pipeline
    /// (futures polled together: tokio-postgres sends their messages at
    /// once and the server answers them in turn, in either protocol). Each
    /// statement ahead may take up to statement_timeout before the server
    /// cancels it, so the answer to this one may come that much later from
    /// a server that is still answering.
    pub(crate) fn behind(self, n: u32) -> Db<'a> {
        let statement = self.deadline.saturating_sub(DEADLINE_MARGIN);
        Db {
            deadline: self.deadline + statement * n,
            ..self
        }
    }

    async fn within<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> QResult<T> {
        match tokio::time::timeout(self.deadline, f).await {
            Ok(r) => r.map_err(QueryError::Pg),
            Err(_) => Err(QueryError::NoAnswer(self.deadline)),
        }
    }

    /// The transactions this connection committed so far. A statement
    /// that failed rolled its transaction back and is not counted, as
    /// `xact_commit` does not count it.
    pub(crate) fn own_commits(&self) -> u64 {
        self.statements.commits.load(Ordering::Relaxed)
    }

    /// The prepared statement of `sql`, preparing it on first use.
    async fn prepared(&self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s);
        }
        // Parse and Describe run in a transaction of their own, which the
        // Sync after them commits.
        let s = self.client.prepare(sql).await?;
        self.statements.committed();
        self.statements.put(sql, &s);
        Ok(s)
    }

    /// The rows of `sql`, a constant: statements take no parameters, so
    /// the same text runs in either protocol (values are written into the
    /// text as literals, see [`literal`]).
    pub(crate) async fn query(&self, sql: &'static str) -> QResult<Vec<Row>> {
        self.within(async {
            if !self.statements.simple() {
                match self.extended(sql).await {
                    Ok(rows) => return Ok(rows),
                    Err(e) if refuses_extended(&e) => self.statements.go_simple(&e),
                    Err(e) => {
                        self.statements.forget(sql);
                        return Err(e);
                    }
                }
            }
            let answer = self.client.simple_query(sql).await?;
            self.statements.committed();
            Ok(answer
                .into_iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(r) => Some(Row::Simple(r)),
                    _ => None,
                })
                .collect())
        })
        .await
    }

    /// `sql`'s prepared statement run; forgotten when that fails (see
    /// `Statements::forget`).
    async fn extended(&self, sql: &'static str) -> Result<Vec<Row>, tokio_postgres::Error> {
        let s = self.prepared(sql).await?;
        let rows = self.client.query(&s, &[]).await?;
        self.statements.committed();
        Ok(rows.into_iter().map(Row::Extended).collect())
    }

    /// The one row of `sql`; an error when it returned another number.
    pub(crate) async fn query_one(&self, sql: &'static str) -> QResult<Row> {
        let mut rows = self.query(sql).await?;
        match rows.len() {
            1 => rows.pop().ok_or(QueryError::RowCount(0)),
            n => Err(QueryError::RowCount(n)),
        }
    }

    /// One statement over the simple query protocol (one message each
    /// way, as psql and pgbench send theirs), its rows dropped.
    pub(crate) async fn simple_query(&self, sql: &str) -> QResult<()> {
        self.within(self.client.simple_query(sql)).await?;
        self.statements.committed();
        Ok(())
    }

    /// Statements sent as one simple query: they run in one implicit
    /// transaction (none of the exporter's holds transaction control).
    pub(crate) async fn batch_execute(&self, sql: &str) -> QResult<()> {
        self.within(self.client.batch_execute(sql)).await?;
        self.statements.committed();
        Ok(())
    }
}

/// `s` as a SQL string literal, as libpq's PQescapeLiteral writes one:
/// single quotes doubled, and with any backslash doubled behind an `E`
/// prefix, which reads the same whether standard_conforming_strings is on
/// or off. `None` for text with a NUL, which no PostgreSQL string holds.
pub(crate) fn literal(s: &str) -> Option<String> {
    if s.contains('\0') {
        return None;
    }
    let mut out = String::with_capacity(s.len() + 3);
    if s.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for c in s.chars() {
        if c == '\'' || c == '\\' {
            out.push(c);
        }
        out.push(c);
    }
    out.push('\'');
    Some(out)
}

/// PostgreSQL reports every IO time in milliseconds (double precision).
pub(crate) fn ms_to_seconds(ms: Option<f64>) -> Option<f64> {
    ms.map(|x| x / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_output_reads_as_postgresql_writes_it() {
        // float8out with the default extra_float_digits (1): the shortest
        // exact digits, exponents with a sign, and the special values.
        for (s, want) in [
            ("0", 0.0),
            ("-0", -0.0),
            ("1.5", 1.5),
            ("123456789012", 123_456_789_012.0),
            ("1e+20", 1e20),
            ("1.2345e-05", 1.2345e-5),
            ("1.7976931348623157e+308", f64::MAX),
            ("5e-324", 5e-324),
            ("Infinity", f64::INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
        ] {
            assert_eq!(text::float(s), Some(want), "{s}");
        }
        assert!(text::float("NaN").is_some_and(f64::is_nan));
        for bad in ["", "t", "1.5 ", "one", "1,5"] {
            assert_eq!(text::float(bad), None, "{bad:?}");
        }
        assert_eq!(text::bool("t"), Some(true));
        assert_eq!(text::bool("f"), Some(false));
        // Input spellings the server never outputs.
        for bad in ["true", "on", "1", "T", ""] {
            assert_eq!(text::bool(bad), None, "{bad:?}");
        }
        assert_eq!(text::int("0"), Some(0));
        assert_eq!(text::int("-2147483648"), Some(-2_147_483_648));
        assert_eq!(text::int("9223372036854775807"), Some(i64::MAX));
        for bad in ["", "1.0", "9223372036854775808", "12a"] {
            assert_eq!(text::int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn literals_quote_as_postgresql_reads_them() {
        assert_eq!(literal("fsync").as_deref(), Some("'fsync'"));
        assert_eq!(literal("").as_deref(), Some("''"));
        assert_eq!(literal("it's").as_deref(), Some("'it''s'"));
        assert_eq!(literal("''").as_deref(), Some("''''''"));
        // A backslash is an escape with standard_conforming_strings off:
        // doubled behind E, it reads the same either way.
        assert_eq!(literal(r"a\b").as_deref(), Some(r"E'a\\b'"));
        assert_eq!(literal(r"\'").as_deref(), Some(r"E'\\'''"));
        assert_eq!(literal("a\0b"), None);
    }
}
