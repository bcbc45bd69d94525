//! Why a connection or a query failed, as a bounded `cause` label, and which
//! failures to log: the first of a kind, not every repeat.
//!
//! | cause            | what happened                                                                   |
//! |------------------|---------------------------------------------------------------------------------|
//! | `timeout`        | the server cancelled the statement: SQLSTATE 57014 (statement_timeout) or 55P03 (lock_timeout) |
//! | `client_timeout` | no answer at all within the client deadline; the connection is dropped         |
//! | `permission`     | 42501 insufficient_privilege                                                    |
//! | `undefined`      | 42P01, 42883, 42703: a view, function or column this server does not have        |
//! | `auth`           | SQLSTATE class 28: authentication or authorization refused at connect           |
//! | `tls`            | TLS set-up or handshake failed                                                  |
//! | `connection`     | refused, reset or closed; class 08; 57P01 to 57P03 (server shutting down or starting up) |
//! | `other`          | anything else                                                                   |

use std::time::Duration;

use super::tls::{self, ConnectError};

/// Added to statement_timeout for the client deadline of each statement.
/// The server cancels a statement at statement_timeout (and gives up a lock
/// wait at lock_timeout, set to the same value) and answers with an error
/// right away; no answer at all this much later means the server is not
/// answering: a stopped or frozen backend, a backend stuck in uninterruptible
/// IO on a stalled volume, a network path that died without a reset. Only
/// the client can notice those.
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_secs(2);

/// The cause label of a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cause {
    Timeout,
    ClientTimeout,
    Permission,
    Undefined,
    Auth,
    Tls,
    Connection,
    Other,
}

impl Cause {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Cause::Timeout => "timeout",
            Cause::ClientTimeout => "client_timeout",
            Cause::Permission => "permission",
            Cause::Undefined => "undefined",
            Cause::Auth => "auth",
            Cause::Tls => "tls",
            Cause::Connection => "connection",
            Cause::Other => "other",
        }
    }

    /// The cause of a SQLSTATE.
    pub(crate) fn of_sqlstate(code: &str) -> Cause {
        match code {
            // query_canceled: statement_timeout (also pg_cancel_backend());
            // lock_not_available: lock_timeout.
            "57014" | "55P03" => Cause::Timeout,
            "42501" => Cause::Permission,
            // undefined_table, undefined_function, undefined_column: a view
            // or column the server's version does not have.
            "42P01" | "42883" | "42703" => Cause::Undefined,
            // admin_shutdown, crash_shutdown, cannot_connect_now.
            "57P01" | "57P02" | "57P03" => Cause::Connection,
            c if c.starts_with("28") => Cause::Auth,
            c if c.starts_with("08") => Cause::Connection,
            _ => Cause::Other,
        }
    }

    /// The cause of a driver error: the server's SQLSTATE, or what the
    /// client saw (a closed socket, a TLS alert).
    pub(crate) fn of(e: &tokio_postgres::Error) -> Cause {
        if let Some(db) = e.as_db_error() {
            return Cause::of_sqlstate(db.code().code());
        }
        if e.is_closed() {
            return Cause::Connection;
        }
        let mut src = std::error::Error::source(e);
        while let Some(inner) = src {
            if inner.is::<rustls::Error>() {
                return Cause::Tls;
            }
            if let Some(io) = inner.downcast_ref::<std::io::Error>() {
                // tokio-rustls reports a handshake failure as an io::Error
                // wrapping the rustls error.
                if io.get_ref().is_some_and(|e| e.is::<rustls::Error>()) {
                    return Cause::Tls;
                }
                return Cause::Connection;
            }
            src = inner.source();
        }
        Cause::Other
    }
}

/// A failed query: the server's (or the driver's) error, no answer within
/// the client deadline, or an answer not shaped as the statement's.
#[derive(Debug)]
pub(crate) enum QueryError {
    Pg(tokio_postgres::Error),
    NoAnswer(Duration),
    /// This many rows from a statement that returns one.
    RowCount(usize),
    /// This column NULL, or not of the type the statement gives it.
    Column(usize),
}

impl From<tokio_postgres::Error> for QueryError {
    fn from(e: tokio_postgres::Error) -> Self {
        QueryError::Pg(e)
    }
}

impl QueryError {
    pub(crate) fn cause(&self) -> Cause {
        match self {
            QueryError::Pg(e) => Cause::of(e),
            QueryError::NoAnswer(_) => Cause::ClientTimeout,
            QueryError::RowCount(_) | QueryError::Column(_) => Cause::Other,
        }
    }

    /// True when the session cannot go on: the connection is closed, or the
    /// server did not answer (the reply to the abandoned query could still
    /// arrive and be taken for the next one's, so the connection is
    /// dropped, never reused).
    pub(crate) fn ends_session(&self) -> bool {
        match self {
            // A FATAL (or PANIC) error ends the backend: the server closes
            // the connection right after it (57P01 on a fast shutdown or
            // pg_terminate_backend()).
            QueryError::Pg(e) => {
                e.is_closed()
                    || e.as_db_error().is_some_and(|db| {
                        matches!(
                            db.parsed_severity(),
                            Some(tokio_postgres::error::Severity::Fatal)
                                | Some(tokio_postgres::error::Severity::Panic)
                        )
                    })
            }
            QueryError::NoAnswer(_) => true,
            QueryError::RowCount(_) | QueryError::Column(_) => false,
        }
    }
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::Pg(e) => f.write_str(&tls::describe(e)),
            QueryError::NoAnswer(d) => write!(
                f,
                "no answer from PostgreSQL within {d:?} (statement_timeout plus {:?}): \
                 the server did not even cancel the statement",
                DEADLINE_MARGIN
            ),
            QueryError::RowCount(n) => write!(f, "{n} rows where the statement returns one"),
            QueryError::Column(i) => write!(
                f,
                "column {i} is NULL or not of the type the statement returns"
            ),
        }
    }
}

/// A failed connection attempt: refused, not finished in time, or
/// connected but the session set-up (timeouts, read-only, version) failed.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    Failed(ConnectError),
    NoAnswer(Duration),
    SetUp(QueryError),
}

impl ConnectFailure {
    pub(crate) fn cause(&self) -> Cause {
        match self {
            ConnectFailure::Failed(ConnectError::Postgres(e)) => Cause::of(e),
            ConnectFailure::Failed(ConnectError::Tls(_)) => Cause::Tls,
            ConnectFailure::Failed(ConnectError::Socket { source, .. }) => {
                source.as_ref().map_or(Cause::Connection, Cause::of)
            }
            ConnectFailure::Failed(ConnectError::Host(_)) => Cause::Connection,
            ConnectFailure::Failed(ConnectError::ServerType { source, .. }) => {
                source.as_ref().map_or(Cause::Connection, Cause::of)
            }
            ConnectFailure::NoAnswer(_) => Cause::ClientTimeout,
            ConnectFailure::SetUp(e) => e.cause(),
        }
    }
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectFailure::Failed(e) => write!(f, "{e}"),
            ConnectFailure::NoAnswer(d) => write!(
                f,
                "connection not established within {d:?} (connect_timeout per host)"
            ),
            ConnectFailure::SetUp(e) => write!(f, "session set-up: {e}"),
        }
    }
}

/// Which failures to log: the shared incident policy, keyed by what
/// failed (`connect` or a query name) with this module's causes.
pub(crate) type Failures = crate::events::Incidents<&'static str, Cause>;
pub(crate) use crate::events::Report;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::LOG_REPEAT;
    use std::time::Instant;

    #[test]
    fn sqlstates_map_to_a_few_causes() {
        let cases = [
            ("57014", "timeout"),
            ("55P03", "timeout"),
            ("42501", "permission"),
            ("42P01", "undefined"),
            ("42883", "undefined"),
            ("42703", "undefined"),
            ("28P01", "auth"),
            ("28000", "auth"),
            ("08006", "connection"),
            ("57P01", "connection"),
            ("57P03", "connection"),
            ("53300", "other"),
            ("XX000", "other"),
        ];
        for (code, want) in cases {
            assert_eq!(Cause::of_sqlstate(code).label(), want, "{code}");
        }
    }

    #[test]
    fn repeats_are_quiet_until_the_cause_changes_or_time_passes() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut f = Failures::default();
        assert_eq!(f.failed("database", Cause::Timeout, t0), Report::New);
        for i in 1..10 {
            assert_eq!(
                f.failed("database", Cause::Timeout, t0 + s * i),
                Report::Quiet
            );
        }
        // Another query failing is news of its own.
        assert_eq!(f.failed("waits", Cause::Timeout, t0 + s), Report::New);
        // Still failing after LOG_REPEAT: said again, with the count.
        assert_eq!(
            f.failed("database", Cause::Timeout, t0 + LOG_REPEAT),
            Report::Again { failures: 11 }
        );
        assert_eq!(
            f.failed("database", Cause::Timeout, t0 + LOG_REPEAT + s),
            Report::Quiet
        );
        // A different cause is news.
        assert_eq!(
            f.failed("database", Cause::Permission, t0 + LOG_REPEAT + s * 2),
            Report::New
        );
        assert_eq!(
            f.succeeded("database", t0 + LOG_REPEAT + s * 5),
            Some((13, LOG_REPEAT + s * 5)),
            "the whole outage, whatever its causes"
        );
        // Succeeding again without a failure in between says nothing.
        assert_eq!(f.succeeded("database", t0 + LOG_REPEAT + s * 6), None);
        assert_eq!(f.succeeded("settings", t0), None);
    }

    #[test]
    fn a_failure_logged_elsewhere_stays_quiet() {
        let t0 = Instant::now();
        let mut f = Failures::default();
        f.already_logged("connect", Cause::ClientTimeout, t0);
        assert_eq!(f.failed("connect", Cause::ClientTimeout, t0), Report::Quiet);
        assert_eq!(
            f.failed("connect", Cause::Connection, t0),
            Report::New,
            "another cause is news"
        );
        assert_eq!(
            f.succeeded("connect", t0 + Duration::from_secs(4)),
            Some((2, Duration::from_secs(4)))
        );
    }
}
