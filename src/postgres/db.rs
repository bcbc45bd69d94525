//! The session's client as the views use it. Every statement goes through
//! [`Db`], which gives up on it at the client deadline (statement_timeout
//! plus a margin, see `failure::DEADLINE_MARGIN`).
//!
//! The views cast every column to float8 so that counters of any width
//! (int8, numeric, double precision) read the same way; SQL NULL (a time
//! with timing off, a column a backend type never fills) stays `None` and
//! becomes an absent series, never a zero.

use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use super::failure::QueryError;

pub(crate) type QResult<T> = Result<T, QueryError>;

/// The session's client, with the deadline after which a statement that got
/// no answer at all (not even the server's cancellation at
/// statement_timeout) is abandoned.
#[derive(Clone, Copy)]
pub(crate) struct Db<'a> {
    client: &'a Client,
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
    pub(crate) fn new(client: &'a Client, deadline: Duration) -> Db<'a> {
        Db { client, deadline }
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

    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> QResult<Vec<Row>> {
        self.within(self.client.query(sql, params)).await
    }

    pub(crate) async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> QResult<Row> {
        self.within(self.client.query_one(sql, params)).await
    }

    /// One statement over the simple query protocol (one message each
    /// way, as psql and pgbench send theirs), its rows dropped.
    pub(crate) async fn simple_query(&self, sql: &str) -> QResult<()> {
        self.within(self.client.simple_query(sql)).await.map(drop)
    }

    pub(crate) async fn batch_execute(&self, sql: &str) -> QResult<()> {
        self.within(self.client.batch_execute(sql)).await
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
