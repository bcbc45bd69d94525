//! The session's client as the views use it. Every statement goes through
//! [`Db`], which gives up on it at the client deadline (statement_timeout
//! plus a margin, see `failure::DEADLINE_MARGIN`).
//!
//! The views cast every column to float8 so that counters of any width
//! (int8, numeric, double precision) read the same way; SQL NULL (a time
//! with timing off, a column a backend type never fills) stays `None` and
//! becomes an absent series, never a zero.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use super::failure::{DEADLINE_MARGIN, QueryError};

pub(crate) type QResult<T> = Result<T, QueryError>;

/// A connection's statements, each prepared on its first use and kept for
/// as long as the connection lives.
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
/// It also counts the transactions the connection committed: in
/// autocommit every exchange that ends in a Sync (a prepare, an execution)
/// or a simple query is one transaction, read-only or not, and
/// pg_stat_database's `xact_commit` counts each. The one-commit basis
/// compares commits with WAL syncs, and the exporter's own would read as
/// commits that needed no sync (see `own_commits`).
#[derive(Default)]
pub(crate) struct Statements {
    prepared: Mutex<HashMap<&'static str, Statement>>,
    commits: AtomicU64,
}

impl std::fmt::Debug for Statements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.prepared.lock().map(|m| m.len()).unwrap_or(0);
        f.debug_struct("Statements")
            .field("prepared", &n)
            .field("commits", &self.commits.load(Ordering::Relaxed))
            .finish()
    }
}

impl Statements {
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
    /// once and the server answers them in turn). Each statement ahead may
    /// take up to statement_timeout before the server cancels it, so the
    /// answer to this one may come that much later from a server that is
    /// still answering.
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

    pub(crate) async fn query(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> QResult<Vec<Row>> {
        self.run(sql, |s| async move { self.client.query(&s, params).await })
            .await
    }

    pub(crate) async fn query_one(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> QResult<Row> {
        self.run(
            sql,
            |s| async move { self.client.query_one(&s, params).await },
        )
        .await
    }

    /// Runs `sql`'s prepared statement under the deadline, forgetting it
    /// when that fails (see `Statements::forget`).
    async fn run<T, F>(&self, sql: &'static str, f: impl FnOnce(Statement) -> F) -> QResult<T>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let r = self
            .within(async {
                let s = self.prepared(sql).await?;
                f(s).await
            })
            .await;
        match r {
            Ok(_) => self.statements.committed(),
            Err(_) => self.statements.forget(sql),
        }
        r
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

/// Column `i` of a row whose columns are all cast to float8.
pub(crate) fn float(row: &Row, i: usize) -> Option<f64> {
    row.try_get::<_, Option<f64>>(i).ok().flatten()
}

/// PostgreSQL reports every IO time in milliseconds (double precision).
pub(crate) fn ms_to_seconds(ms: Option<f64>) -> Option<f64> {
    ms.map(|x| x / 1000.0)
}
