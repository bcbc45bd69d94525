//! The PostgreSQL test harness itself (tests/suite/common/pg.rs) on every
//! supported version, 14 to 18: start, roles and auth, pgbench, restart,
//! pg_wal elsewhere, cleanup.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::pg::{self, PgKind, PgServer};

fn lifecycle(kind: PgKind) {
    let Some(pg) = PgServer::start(kind, None) else {
        return;
    };
    let major = pg.major();
    assert_eq!(major, kind.major());
    let version = pg.version().to_string();
    assert!(
        version.starts_with(&format!("{major}.")),
        "{version} for PostgreSQL {major}"
    );

    let num = pg.psql("SHOW server_version_num");
    assert!(
        num.starts_with(&major.to_string()),
        "server_version_num {num} for PostgreSQL {major}"
    );
    assert_eq!(pg.psql("SHOW track_io_timing"), "on");
    assert_eq!(pg.psql("SHOW track_wal_io_timing"), "on");
    assert_eq!(pg.psql("SHOW shared_buffers"), "32MB");
    assert_eq!(pg.psql("SHOW max_connections"), "50");
    assert_eq!(pg.psql("SHOW fsync"), "on");
    assert_eq!(pg.psql("SHOW listen_addresses"), "127.0.0.1");
    assert_eq!(pg.psql("SHOW port"), pg.port().to_string());
    assert!(pg.bin("pgbench").is_file());

    // A monitor-only role: logs in over TCP with its password, cannot write.
    let password = "s3cret pa'ss\\word";
    pg.create_role("pgse_monitor", password, true);
    assert_eq!(
        pg.psql("SELECT pg_has_role('pgse_monitor', 'pg_monitor', 'member')"),
        "t"
    );
    assert_eq!(
        pg.psql_tcp("pgse_monitor", password, "SELECT 1").unwrap(),
        "1"
    );
    pg.psql("CREATE TABLE t_owned(x int)");
    let err = pg
        .psql_tcp("pgse_monitor", password, "INSERT INTO t_owned VALUES (1)")
        .unwrap_err();
    assert!(err.contains("permission denied"), "{err}");
    // Up to 14 every role may create tables in the schema public; 15
    // revoked that from PUBLIC.
    let created = pg.psql_tcp("pgse_monitor", password, "CREATE TABLE t_mon(x int)");
    if major >= 15 {
        let err = created.unwrap_err();
        assert!(err.contains("permission denied"), "{err}");
    } else {
        assert!(created.is_ok(), "{created:?}");
    }
    let err = pg
        .psql_tcp("pgse_monitor", "wrong", "SELECT 1")
        .unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
    // The superuser has no password: TCP is refused too.
    assert!(pg.psql_tcp("postgres", "", "SELECT 1").is_err());
    let dsn = pg.dsn("pgse_monitor", password);
    assert!(
        dsn.starts_with(&format!(
            "host=127.0.0.1 port={} user=pgse_monitor ",
            pg.port()
        )),
        "{dsn}"
    );
    assert!(dsn.ends_with(" dbname=postgres sslmode=disable"), "{dsn}");

    let out = pg.pgbench_inserts(2, 2);
    assert!(
        out.contains("number of transactions actually processed"),
        "{out}"
    );
    let rows: u64 = pg.psql("SELECT count(*) FROM ins").parse().unwrap();
    assert!(rows > 0, "pgbench inserted nothing:\n{out}");

    pg.stop();
    assert!(pg.psql_tcp("pgse_monitor", password, "SELECT 1").is_err());
    pg.start_again();
    assert_eq!(
        pg.psql("SELECT count(*) FROM ins"),
        rows.to_string(),
        "rows lost across a clean restart"
    );
    assert_eq!(
        pg.psql_tcp("pgse_monitor", password, "SELECT 1").unwrap(),
        "1"
    );
    let log = pg.log();
    assert!(
        log.matches("database system is ready to accept connections")
            .count()
            >= 2,
        "log:\n{log}"
    );

    // Drop stops the server and removes its dirs.
    let data = pg.data_dir().to_path_buf();
    let pid: i32 = std::fs::read_to_string(data.join("postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    drop(pg);
    assert!(!data.exists(), "{} left behind", data.display());
    assert!(!pg::process_running(pid), "postmaster {pid} still running");
    pg::report(&format!(
        "postgres {version}: harness ok, server_version_num {num}, binaries from {}",
        kind.bin_dir().display()
    ));
}

#[test]
fn pg14_lifecycle() {
    lifecycle(PgKind::V14);
}

#[test]
fn pg15_lifecycle() {
    lifecycle(PgKind::V15);
}

#[test]
fn pg16_lifecycle() {
    lifecycle(PgKind::V16);
}

#[test]
fn pg17_lifecycle() {
    lifecycle(PgKind::V17);
}

#[test]
fn pg18_lifecycle() {
    lifecycle(PgKind::V18);
}

/// The env overrides and defaults of every supported version.
#[test]
fn every_version_has_its_bin_dir_and_override() {
    let majors: Vec<u32> = PgKind::ALL.iter().map(|k| k.major()).collect();
    assert_eq!(majors, [14, 15, 16, 17, 18]);
    for k in PgKind::ALL {
        assert_eq!(k.bin_env(), format!("PG{}_BIN", k.major()));
        let from_env = std::env::var_os(k.bin_env()).filter(|v| !v.is_empty());
        match from_env {
            Some(v) => assert_eq!(k.bin_dir(), std::path::PathBuf::from(v)),
            None => assert_eq!(k.bin_dir(), std::path::PathBuf::from(k.default_bin())),
        }
    }
}

#[test]
fn pg18_waldir_is_symlinked() {
    let tmp = tempfile::tempdir().unwrap();
    // The OS user postgres must be able to reach the WAL dir.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let waldir = tmp.path().join("wal");
    let Some(pg) = PgServer::start(PgKind::V18, Some(&waldir)) else {
        return;
    };
    let link = pg.data_dir().join("pg_wal");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "{} is not a symlink",
        link.display()
    );
    assert_eq!(std::fs::read_link(&link).unwrap(), waldir);
    pg.psql("CREATE TABLE w AS SELECT generate_series(1, 1000) AS x");
    let segment = pg.psql("SELECT pg_walfile_name(pg_current_wal_lsn())");
    assert!(waldir.join(&segment).is_file(), "{segment} not in waldir");
    let data = pg.data_dir().to_path_buf();
    drop(pg);
    assert!(!data.exists());
    // The WAL dir belongs to the caller: still there until `tmp` goes.
    assert!(waldir.is_dir());
}
