//! pg_settings: the settings that decide how PostgreSQL does IO, as the
//! server shows them and in base units.
//!
//! The same query serves every version: a setting the server does not have
//! (io_method exists from 18) is simply not returned.

use std::fmt;
use std::sync::LazyLock;

use crate::families::{self, Encoder};
use crate::postgres::db::{Db, QResult, Row, literal};
use crate::postgres::snapshot::ClusterSnapshot;
use crate::postgres::views::rows::Setting;

/// Settings that decide how PostgreSQL does IO: the first [`EXPORTED_LEN`]
/// are exported as values; data_directory and port are read for volume
/// discovery and the IO limits, and the last seven for the
/// storage-configuration audit only.
pub(crate) const SETTINGS: &[&str] = &[
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
    "huge_pages",
    "shared_memory_size_in_huge_pages",
    "random_page_cost",
    "effective_io_concurrency",
    "checkpoint_timeout",
    "checkpoint_completion_target",
    "block_size",
];

/// How many of [`SETTINGS`], from the start, are exported as values.
const EXPORTED_LEN: usize = 13;

/// Settings exported as values: the IO settings, not the paths and not
/// what only the audit reads.
const EXPORTED: &[&str] = SETTINGS.split_at(EXPORTED_LEN).0;

/// Rows with `pending_restart` come too, whatever their name: the audit
/// reports every setting waiting for a restart. The names are written
/// into the text rather than sent as a parameter: a replication session
/// takes simple queries only, which carry none (see `db::Statements`).
/// Built once, so that it is the one statement the connection prepares.
static SQL: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<String> = SETTINGS.iter().filter_map(|s| literal(s)).collect();
    format!(
        "SELECT name, setting, unit, vartype, source, pending_restart FROM pg_settings \
         WHERE name IN ({}) OR pending_restart ORDER BY name",
        names.join(", ")
    )
});

/// Settings exported as values.
pub(crate) fn exported_setting(name: &str) -> bool {
    EXPORTED.contains(&name)
}

/// Converts a pg_settings value to base units.
pub(crate) fn numeric_setting(setting: &str, unit: Option<&str>, vartype: &str) -> Option<f64> {
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

/// When this connection's backend last loaded the configuration files.
/// Every process of the server re-reads them on a reload (SIGHUP,
/// `pg_reload_conf()`) and then sets this time, pending_restart included;
/// nothing else changes what pg_settings shows this backend (its own SETs
/// are made once, at connection). So pg_settings, which builds every one of the server's
/// several hundred settings to return the few asked for (0.4 ms of the
/// backend's CPU on 18 against 0.01 ms for this), is read again only when
/// this time changes.
const SQL_LOADED: &str = "SELECT pg_conf_load_time()::text";

pub(crate) async fn loaded(c: Db<'_>) -> QResult<String> {
    Ok(c.query_one(SQL_LOADED)
        .await?
        .need(0, Row::text)?
        .to_string())
}

pub(crate) async fn read(c: Db<'_>) -> QResult<Vec<Setting>> {
    let rows = c.query(SQL.as_str()).await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let name = r.text(0)?.to_string();
            let value = r.text(1)?.to_string();
            let unit = r.text(2).map(str::to_string);
            let vartype = r.text(3)?;
            // pg_settings gives commit_delay no unit; it is microseconds.
            let unit = if name == "commit_delay" && unit.is_none() {
                Some("us".to_string())
            } else {
                unit
            };
            let numeric = numeric_setting(&value, unit.as_deref(), vartype);
            Some(Setting {
                name,
                value,
                numeric,
                source: r.text(4).unwrap_or_default().to_string(),
                pending_restart: r.bool(5).unwrap_or(false),
            })
        })
        .collect())
}

/// The settings a cluster's last scrape read; none while it is down.
fn exported(c: &ClusterSnapshot) -> impl Iterator<Item = &Setting> {
    c.stats
        .iter()
        .flat_map(|s| &s.settings)
        .filter(|s| exported_setting(&s.name))
}

pub(crate) fn encode(enc: &mut Encoder<'_>, clusters: &[ClusterSnapshot]) -> fmt::Result {
    families::gauge(
        enc,
        "pgstorage_pg_setting",
        "IO-relevant settings with a numeric value, in base units (bytes, seconds; booleans 1/0)",
        clusters.iter().flat_map(|c| {
            exported(c).filter_map(|s| {
                Some((
                    [("cluster", c.name.as_str()), ("name", s.name.as_str())],
                    s.numeric?,
                ))
            })
        }),
    )?;
    families::gauge(
        enc,
        "pgstorage_pg_setting_info",
        "Always 1: IO-relevant settings as PostgreSQL shows them (wal_sync_method, synchronous_commit, io_method, ...)",
        clusters.iter().flat_map(|c| {
            exported(c).map(|s| {
                (
                    [
                        ("cluster", c.name.as_str()),
                        ("name", s.name.as_str()),
                        ("value", s.value.as_str()),
                    ],
                    1.0,
                )
            })
        }),
    )?;
    families::gauge(
        enc,
        "pgstorage_pg_io_timing_enabled",
        "1 when PostgreSQL times IO (setting=track_io_timing) or WAL IO (setting=track_wal_io_timing); while 0 the matching *_seconds_total series are absent",
        clusters.iter().flat_map(|c| {
            ["track_io_timing", "track_wal_io_timing"]
                .into_iter()
                .filter_map(|name| {
                    let on = c.setting(name)?.value == "on";
                    Some((
                        [("cluster", c.name.as_str()), ("setting", name)],
                        if on { 1.0 } else { 0.0 },
                    ))
                })
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::PgStats;
    use crate::postgres::views::render;

    #[test]
    fn every_setting_is_in_the_statement() {
        for name in SETTINGS {
            assert!(SQL.contains(&format!("'{name}'")), "{name}: {}", *SQL);
        }
        assert!(!SQL.contains('$'), "no parameter: {}", *SQL);
    }

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

    fn setting(name: &str, value: &str, numeric: Option<f64>) -> Setting {
        Setting {
            name: name.into(),
            value: value.into(),
            numeric,
            source: "default".into(),
            pending_restart: false,
        }
    }

    #[test]
    fn paths_are_read_not_exported() {
        let c = ClusterSnapshot {
            name: "c".into(),
            up: true,
            stats: Some(std::sync::Arc::new(PgStats {
                settings: vec![
                    setting("data_directory", "/srv/pg", None),
                    setting("port", "5432", Some(5432.0)),
                    setting("track_io_timing", "off", Some(0.0)),
                    setting("wal_sync_method", "fdatasync", None),
                ],
                ..Default::default()
            })),
            ..Default::default()
        };
        let out = render(&[c], encode);
        assert!(!out.contains("/srv/pg") && !out.contains("5432"), "{out}");
        for want in [
            "pgstorage_pg_setting{cluster=\"c\",name=\"track_io_timing\"} 0.0\n",
            "pgstorage_pg_setting_info{cluster=\"c\",name=\"wal_sync_method\",value=\"fdatasync\"} 1.0\n",
            "pgstorage_pg_io_timing_enabled{cluster=\"c\",setting=\"track_io_timing\"} 0.0\n",
        ] {
            assert!(out.contains(want), "{want} missing from:\n{out}");
        }
        // A string setting has no numeric series; an unread one no timing.
        assert!(!out.contains("pgstorage_pg_setting{cluster=\"c\",name=\"wal_sync_method\""));
        assert!(!out.contains("setting=\"track_wal_io_timing\""), "{out}");
    }
}
