//! Version-aware queries. Each function reads one view and returns plain
//! numbers; which view and columns exist depends on the server version:
//!
//! | what                  | 14, 15                 | 16                     | 17                         | 18+                              |
//! |-----------------------|------------------------|------------------------|----------------------------|----------------------------------|
//! | IO by backend/context | none                   | pg_stat_io (op_bytes)  | pg_stat_io (op_bytes)      | pg_stat_io (*_bytes, object wal) |
//! | WAL syncs and time    | pg_stat_wal            | pg_stat_wal            | pg_stat_wal                | pg_stat_io object='wal'          |
//! | checkpoints           | pg_stat_bgwriter       | pg_stat_bgwriter       | pg_stat_checkpointer       | pg_stat_checkpointer             |
//!
//! Every column is cast to float8 so counters of any width read the same
//! way; SQL NULL (a time with timing off, a column a backend type never
//! fills) stays `None` and becomes an absent series, never a zero.
//!
//! Every statement goes through [`Db`], which gives up on it at the client
//! deadline (statement_timeout plus a margin, see `super::DEADLINE_MARGIN`).

use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use super::failure::QueryError;

/// The session's client, with the deadline after which a statement that got
/// no answer at all (not even the server's cancellation at
/// statement_timeout) is abandoned.
#[derive(Clone, Copy)]
pub struct Db<'a> {
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
    pub fn new(client: &'a Client, deadline: Duration) -> Db<'a> {
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

    pub async fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> QResult<Vec<Row>> {
        self.within(self.client.query(sql, params)).await
    }

    pub async fn query_one(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> QResult<Row> {
        self.within(self.client.query_one(sql, params)).await
    }

    pub async fn batch_execute(&self, sql: &str) -> QResult<()> {
        self.within(self.client.batch_execute(sql)).await
    }
}

/// One row of pg_stat_io.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IoRow {
    pub backend_type: String,
    pub object: String,
    pub context: String,
    /// read, write, writeback, extend, hit, eviction, reuse, fsync.
    pub ops: Vec<IoOp>,
}

/// One op column group of a pg_stat_io row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IoOp {
    pub op: &'static str,
    pub count: Option<f64>,
    pub seconds: Option<f64>,
    pub bytes: Option<f64>,
}

fn op(op: &'static str, count: Option<f64>, seconds: Option<f64>, bytes: Option<f64>) -> IoOp {
    IoOp {
        op,
        count,
        seconds,
        bytes,
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct WalStats {
    pub syncs: Option<f64>,
    pub sync_seconds: Option<f64>,
    pub writes: Option<f64>,
    pub write_seconds: Option<f64>,
    pub records: Option<f64>,
    pub fpi: Option<f64>,
    pub bytes: Option<f64>,
    pub buffers_full: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoints {
    pub timed: Option<f64>,
    pub requested: Option<f64>,
    pub write_seconds: Option<f64>,
    pub sync_seconds: Option<f64>,
    pub buffers_written: Option<f64>,
    pub bgwriter_buffers_clean: Option<f64>,
    pub bgwriter_maxwritten_clean: Option<f64>,
    pub buffers_alloc: Option<f64>,
    /// Up to 16 only: writes and fsyncs backends had to do themselves.
    pub backend_buffers_written: Option<f64>,
    pub backend_fsyncs: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    pub name: String,
    pub value: String,
    /// In base units (bytes, seconds), booleans as 0/1; `None` for enums
    /// and strings.
    pub numeric: Option<f64>,
}

/// Settings that decide how PostgreSQL does IO.
pub const SETTINGS: &[&str] = &[
    "wal_sync_method",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_compression",
    "track_io_timing",
    "track_wal_io_timing",
    "shared_buffers",
    "io_method",
    "commit_delay",
    "commit_siblings",
    "max_wal_size",
    "wal_buffers",
    "data_directory",
    "port",
];

/// Settings exported as values: everything but the paths.
pub fn exported_setting(name: &str) -> bool {
    name != "data_directory" && name != "port"
}

pub type QResult<T> = Result<T, QueryError>;

fn f(row: &tokio_postgres::Row, i: usize) -> Option<f64> {
    row.try_get::<_, Option<f64>>(i).ok().flatten()
}

pub async fn version(c: Db<'_>) -> QResult<(u32, String)> {
    let row = c
        .query_one(
            "SELECT current_setting('server_version_num')::int4, current_setting('server_version')",
            &[],
        )
        .await?;
    let num: i32 = row.try_get(0)?;
    let text: String = row.try_get(1)?;
    Ok((num.max(0) as u32, text))
}

/// Converts a pg_settings value to base units.
pub fn numeric_setting(setting: &str, unit: Option<&str>, vartype: &str) -> Option<f64> {
    match vartype {
        "bool" => Some(if setting == "on" { 1.0 } else { 0.0 }),
        "integer" | "real" => {
            let v: f64 = setting.parse().ok()?;
            let mult = match unit.unwrap_or("") {
                "" => 1.0,
                "B" => 1.0,
                "kB" => 1024.0,
                "8kB" => 8192.0,
                "16kB" => 16384.0,
                "MB" => 1024.0 * 1024.0,
                "GB" => 1024.0 * 1024.0 * 1024.0,
                // Divide rather than multiply by 1e-6: exact for whole values.
                "us" => return Some(v / 1e6),
                "ms" => return Some(v / 1e3),
                "s" => 1.0,
                "min" => 60.0,
                "h" => 3600.0,
                "d" => 86400.0,
                _ => return None,
            };
            Some(v * mult)
        }
        _ => None,
    }
}

pub async fn settings(c: Db<'_>) -> QResult<Vec<Setting>> {
    let names: Vec<String> = SETTINGS.iter().map(|s| s.to_string()).collect();
    let rows = c
        .query(
            "SELECT name, setting, unit, vartype FROM pg_settings WHERE name = ANY($1) ORDER BY name",
            &[&names],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let name: String = r.try_get(0).ok()?;
            let value: String = r.try_get::<_, Option<String>>(1).ok()??;
            let unit: Option<String> = r.try_get(2).ok()?;
            let vartype: String = r.try_get(3).ok()?;
            // pg_settings gives commit_delay no unit; it is microseconds.
            let unit = if name == "commit_delay" && unit.is_none() {
                Some("us".to_string())
            } else {
                unit
            };
            let numeric = numeric_setting(&value, unit.as_deref(), &vartype);
            Some(Setting {
                name,
                value,
                numeric,
            })
        })
        .collect())
}

pub async fn io(c: Db<'_>, version: u32) -> QResult<Option<Vec<IoRow>>> {
    if version < 160000 {
        return Ok(None);
    }
    // Bytes: 18 has *_bytes columns; 16 and 17 have op_bytes (BLCKSZ).
    let bytes = if version >= 180000 {
        "read_bytes::float8, write_bytes::float8, extend_bytes::float8"
    } else {
        "(reads * op_bytes)::float8, (writes * op_bytes)::float8, (extends * op_bytes)::float8"
    };
    let sql = format!(
        "SELECT backend_type, object, context, \
         reads::float8, read_time::float8, writes::float8, write_time::float8, \
         writebacks::float8, writeback_time::float8, extends::float8, extend_time::float8, \
         hits::float8, evictions::float8, reuses::float8, fsyncs::float8, fsync_time::float8, {bytes} \
         FROM pg_stat_io"
    );
    let rows = c.query(&sql, &[]).await?;
    let ms = |v: Option<f64>| v.map(|x| x / 1000.0);
    Ok(Some(
        rows.iter()
            .filter_map(|r| {
                Some(IoRow {
                    backend_type: r.try_get(0).ok()?,
                    object: r.try_get(1).ok()?,
                    context: r.try_get(2).ok()?,
                    ops: vec![
                        op("read", f(r, 3), ms(f(r, 4)), f(r, 16)),
                        op("write", f(r, 5), ms(f(r, 6)), f(r, 17)),
                        op("writeback", f(r, 7), ms(f(r, 8)), None),
                        op("extend", f(r, 9), ms(f(r, 10)), f(r, 18)),
                        op("hit", f(r, 11), None, None),
                        op("eviction", f(r, 12), None, None),
                        op("reuse", f(r, 13), None, None),
                        op("fsync", f(r, 14), ms(f(r, 15)), None),
                    ],
                })
            })
            .collect(),
    ))
}

/// WAL statistics. Up to 17 the write and sync counters are in pg_stat_wal;
/// 18 moved them to pg_stat_io (object 'wal'); the syncs a commit waits for
/// are in context 'normal' ('init' is the creation of new segments).
pub async fn wal(c: Db<'_>, version: u32, timing: bool) -> QResult<Option<WalStats>> {
    if version < 140000 {
        return Ok(None);
    }
    let secs = |v: Option<f64>| if timing { v.map(|x| x / 1000.0) } else { None };
    if version < 180000 {
        let r = c
            .query_one(
                "SELECT wal_records::float8, wal_fpi::float8, wal_bytes::float8, wal_buffers_full::float8, \
                 wal_write::float8, wal_sync::float8, wal_write_time::float8, wal_sync_time::float8 FROM pg_stat_wal",
                &[],
            )
            .await?;
        return Ok(Some(WalStats {
            records: f(&r, 0),
            fpi: f(&r, 1),
            bytes: f(&r, 2),
            buffers_full: f(&r, 3),
            writes: f(&r, 4),
            syncs: f(&r, 5),
            write_seconds: secs(f(&r, 6)),
            sync_seconds: secs(f(&r, 7)),
        }));
    }
    let r = c
        .query_one(
            "SELECT wal_records::float8, wal_fpi::float8, wal_bytes::float8, wal_buffers_full::float8 FROM pg_stat_wal",
            &[],
        )
        .await?;
    let io = c
        .query_one(
            "SELECT sum(writes)::float8, sum(fsyncs)::float8, sum(write_time)::float8, sum(fsync_time)::float8 \
             FROM pg_stat_io WHERE object = 'wal' AND context = 'normal'",
            &[],
        )
        .await?;
    Ok(Some(WalStats {
        records: f(&r, 0),
        fpi: f(&r, 1),
        bytes: f(&r, 2),
        buffers_full: f(&r, 3),
        writes: f(&io, 0),
        syncs: f(&io, 1),
        write_seconds: secs(f(&io, 2)),
        sync_seconds: secs(f(&io, 3)),
    }))
}

pub async fn commits(c: Db<'_>) -> QResult<(Option<f64>, Option<f64>)> {
    let r = c
        .query_one(
            "SELECT sum(xact_commit)::float8, sum(xact_rollback)::float8 FROM pg_stat_database",
            &[],
        )
        .await?;
    Ok((f(&r, 0), f(&r, 1)))
}

pub async fn checkpoints(c: Db<'_>, version: u32) -> QResult<Checkpoints> {
    let ms = |v: Option<f64>| v.map(|x| x / 1000.0);
    if version < 170000 {
        let r = c
            .query_one(
                "SELECT checkpoints_timed::float8, checkpoints_req::float8, checkpoint_write_time::float8, \
                 checkpoint_sync_time::float8, buffers_checkpoint::float8, buffers_clean::float8, \
                 maxwritten_clean::float8, buffers_alloc::float8, buffers_backend::float8, \
                 buffers_backend_fsync::float8 FROM pg_stat_bgwriter",
                &[],
            )
            .await?;
        return Ok(Checkpoints {
            timed: f(&r, 0),
            requested: f(&r, 1),
            write_seconds: ms(f(&r, 2)),
            sync_seconds: ms(f(&r, 3)),
            buffers_written: f(&r, 4),
            bgwriter_buffers_clean: f(&r, 5),
            bgwriter_maxwritten_clean: f(&r, 6),
            buffers_alloc: f(&r, 7),
            backend_buffers_written: f(&r, 8),
            backend_fsyncs: f(&r, 9),
        });
    }
    let cp = c
        .query_one(
            "SELECT num_timed::float8, num_requested::float8, write_time::float8, sync_time::float8, \
             buffers_written::float8 FROM pg_stat_checkpointer",
            &[],
        )
        .await?;
    let bg = c
        .query_one(
            "SELECT buffers_clean::float8, maxwritten_clean::float8, buffers_alloc::float8 FROM pg_stat_bgwriter",
            &[],
        )
        .await?;
    Ok(Checkpoints {
        timed: f(&cp, 0),
        requested: f(&cp, 1),
        write_seconds: ms(f(&cp, 2)),
        sync_seconds: ms(f(&cp, 3)),
        buffers_written: f(&cp, 4),
        bgwriter_buffers_clean: f(&bg, 0),
        bgwriter_maxwritten_clean: f(&bg, 1),
        buffers_alloc: f(&bg, 2),
        backend_buffers_written: None,
        backend_fsyncs: None,
    })
}

/// One sample of pg_stat_activity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WaitSample {
    /// Backends waiting right now, by (wait_event_type, wait_event).
    pub waiting: Vec<(String, String, i64)>,
    /// Backends whose wait state this role may not see.
    pub hidden: u64,
}

/// Backends waiting right now, by (wait_event_type, wait_event), and the
/// backends this role cannot see. Idle client connections (waiting for the
/// next query in Client:ClientRead) are left out: they are not waiting on
/// the server.
///
/// Without pg_read_all_stats (which pg_monitor includes) a role sees only
/// its own sessions: for every other backend, background processes
/// included, pg_stat_activity shows the pid, the user and
/// `<insufficient privilege>` as the query, and NULL in backend_type,
/// state, wait_event_type and wait_event (checked on 15 and 18). Those rows
/// are counted as hidden rather than dropped by `wait_event IS NOT NULL`, so
/// that "nobody waits" and "cannot see who waits" differ. backend_type is
/// never NULL for a backend the role may see, so it is the marker; in the
/// result a hidden row is the group whose type and event are both NULL.
pub async fn waits(c: Db<'_>) -> QResult<WaitSample> {
    let rows = c
        .query(
            "SELECT CASE WHEN backend_type IS NOT NULL THEN wait_event_type END, \
             CASE WHEN backend_type IS NOT NULL THEN wait_event END, count(*) \
             FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND (backend_type IS NULL \
             OR (wait_event IS NOT NULL AND NOT (backend_type = 'client backend' AND state = 'idle'))) \
             GROUP BY 1, 2",
            &[],
        )
        .await?;
    let mut sample = WaitSample::default();
    for r in &rows {
        let ty: Option<String> = r.try_get(0)?;
        let event: Option<String> = r.try_get(1)?;
        let n: i64 = r.try_get(2)?;
        match (ty, event) {
            (Some(t), Some(e)) => sample.waiting.push((t, e, n)),
            _ => sample.hidden += n.max(0) as u64,
        }
    }
    Ok(sample)
}

/// Whether this role sees every backend in pg_stat_activity: PostgreSQL
/// shows another role's backend in full only to members of that role and
/// of pg_read_all_stats (`has_privs_of_role`, which is what
/// `pg_has_role(..., 'USAGE')` checks; a superuser passes).
pub async fn sees_all_backends(c: Db<'_>) -> QResult<bool> {
    let row = c
        .query_one(
            "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')",
            &[],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// Tablespaces with a location outside the data directory.
pub async fn tablespaces(c: Db<'_>) -> QResult<Vec<(String, String)>> {
    let rows = c
        .query(
            "SELECT spcname::text, pg_tablespace_location(oid) FROM pg_tablespace \
             WHERE pg_tablespace_location(oid) <> '' ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_in_base_units() {
        let cases = [
            ("16384", Some("8kB"), "integer", Some(134_217_728.0)),
            ("1024", Some("MB"), "integer", Some(1_073_741_824.0)),
            ("0", None, "integer", Some(0.0)),
            ("10", Some("us"), "integer", Some(1e-5)),
            ("on", None, "bool", Some(1.0)),
            ("off", None, "bool", Some(0.0)),
            ("fdatasync", None, "enum", None),
            ("3", Some("parsecs"), "integer", None),
        ];
        for (s, unit, t, want) in cases {
            assert_eq!(numeric_setting(s, unit, t), want, "{s} {unit:?}");
        }
    }
}
