//! Volume discovery: the data directory, the WAL directory (following a
//! `pg_wal` symlink to wherever it points) and tablespace locations of a
//! cluster become probed volumes, one per filesystem.
//!
//! The probe directory of a discovered volume is created beside the
//! PostgreSQL directory, in its parent, on the same filesystem, never inside
//! it: `<parent>/pg-storage-exporter-probe-<cluster>`. When that parent is on
//! another filesystem (the PostgreSQL directory is itself a mount point)
//! there is no safe place to probe that filesystem from, and the volume is
//! reported as skipped with that reason.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a filesystem holds for a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    Data,
    Wal,
    Tablespace(String),
}

impl Role {
    pub(crate) fn label(&self) -> String {
        match self {
            Role::Data => "data".to_string(),
            Role::Wal => "wal".to_string(),
            Role::Tablespace(n) => format!("tablespace:{n}"),
        }
    }
}

/// One filesystem of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    /// `<cluster>/data`, `<cluster>/wal` or `<cluster>/tblspc/<name>`,
    /// after the most important role it holds.
    pub(crate) name: String,
    /// The PostgreSQL directory whose filesystem this is (resolved).
    pub(crate) path: PathBuf,
    pub(crate) dev: u64,
    pub(crate) roles: Vec<Role>,
    /// `None` when no safe probe directory exists (see `skipped`).
    pub(crate) probe_dir: Option<PathBuf>,
    pub(crate) skipped: Option<String>,
}

impl Planned {
    pub(crate) fn commit_probe(&self) -> bool {
        self.roles.contains(&Role::Wal)
    }

    pub(crate) fn read_probe(&self) -> bool {
        self.roles
            .iter()
            .any(|r| matches!(r, Role::Data | Role::Tablespace(_)))
    }
}

/// Tablespace names become part of a volume name: keep what a label allows.
fn sanitize(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    if out.is_empty() { "_".to_string() } else { out }
}

/// Plans the volumes of a cluster from its data directory and tablespaces
/// (name, location). Errors when the data directory is not on this host.
pub(crate) fn plan(
    cluster: &str,
    major: u32,
    data_directory: &Path,
    tablespaces: &[(String, String)],
) -> Result<Vec<Planned>, String> {
    let version = crate::input::read_to_string(
        &data_directory.join("PG_VERSION"),
        crate::input::Kind::PgVersion,
    )
    .map_err(|e| {
        format!(
            "{}/PG_VERSION: {e}: the cluster's files are not on this host or not readable by the exporter",
            data_directory.display()
        )
    })?;
    if version.trim() != major.to_string() {
        return Err(format!(
            "{} holds PostgreSQL {} files but the server is {major}: not this cluster's data directory",
            data_directory.display(),
            version.trim()
        ));
    }
    let mut found: Vec<(Role, PathBuf)> = Vec::new();
    let data = std::fs::canonicalize(data_directory)
        .map_err(|e| format!("{}: {e}", data_directory.display()))?;
    found.push((Role::Data, data.clone()));
    // pg_wal may be a symlink to another filesystem (initdb --waldir).
    match std::fs::canonicalize(data.join("pg_wal")) {
        Ok(w) => found.push((Role::Wal, w)),
        Err(e) => {
            tracing::warn!(cluster, error = %e, "cannot resolve pg_wal; WAL volume not discovered")
        }
    }
    for (name, loc) in tablespaces {
        match std::fs::canonicalize(loc) {
            Ok(p) => found.push((Role::Tablespace(name.clone()), p)),
            Err(e) => {
                tracing::warn!(cluster, tablespace = %name, error = %e, "cannot resolve tablespace location")
            }
        }
    }

    let mut planned: Vec<Planned> = Vec::new();
    for (role, path) in found {
        let dev = match std::fs::metadata(&path) {
            Ok(m) => m.dev(),
            Err(e) => {
                tracing::warn!(cluster, path = %path.display(), error = %e, "cannot stat; not discovered");
                continue;
            }
        };
        if let Some(p) = planned.iter_mut().find(|p| p.dev == dev) {
            p.roles.push(role);
            continue;
        }
        let name = match &role {
            Role::Data => format!("{cluster}/data"),
            Role::Wal => format!("{cluster}/wal"),
            Role::Tablespace(n) => format!("{cluster}/tblspc/{}", sanitize(n)),
        };
        let (probe_dir, skipped) = match probe_dir_beside(cluster, &path, dev) {
            Ok(d) => (Some(d), None),
            Err(why) => (None, Some(why)),
        };
        planned.push(Planned {
            name,
            path,
            dev,
            roles: vec![role],
            probe_dir,
            skipped,
        });
    }
    Ok(planned)
}

/// `<parent of dir>/pg-storage-exporter-probe-<cluster>`, if the parent is
/// on the same filesystem and not itself PostgreSQL's.
fn probe_dir_beside(cluster: &str, dir: &Path, dev: u64) -> Result<PathBuf, String> {
    let parent = dir
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", dir.display()))?;
    let pdev = std::fs::metadata(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?
        .dev();
    if pdev != dev {
        return Err(format!(
            "{} is the root of its filesystem: no directory beside it on the same filesystem to probe from; \
             add a [[volume]] with a probe_dir on that filesystem",
            dir.display()
        ));
    }
    // The caller still checks the result against the probe-placement
    // rules (never inside a PostgreSQL directory) before using it.
    Ok(parent.join(format!("pg-storage-exporter-probe-{}", sanitize(cluster))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_cluster(root: &Path, major: u32) -> PathBuf {
        let data = root.join("main");
        std::fs::create_dir_all(data.join("global")).unwrap();
        std::fs::create_dir_all(data.join("pg_wal/archive_status")).unwrap();
        std::fs::write(data.join("PG_VERSION"), format!("{major}\n")).unwrap();
        data
    }

    #[test]
    fn one_filesystem_is_one_volume_with_both_probes_beside_the_data_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let data = fake_cluster(tmp.path(), 18);
        let ts = tmp.path().join("ts one");
        std::fs::create_dir_all(ts.join("PG_18_202506291")).unwrap();
        let p = plan(
            "pg18",
            18,
            &data,
            &[("fast ts".into(), ts.display().to_string())],
        )
        .unwrap();
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].name, "pg18/data");
        assert_eq!(
            p[0].roles,
            vec![Role::Data, Role::Wal, Role::Tablespace("fast ts".into())]
        );
        assert!(p[0].commit_probe() && p[0].read_probe());
        let canon = tmp.path().canonicalize().unwrap();
        assert_eq!(
            p[0].probe_dir.as_deref(),
            Some(canon.join("pg-storage-exporter-probe-pg18").as_path())
        );
    }

    #[test]
    fn wrong_version_or_missing_files_mean_not_this_host() {
        let tmp = tempfile::tempdir().unwrap();
        let data = fake_cluster(tmp.path(), 15);
        assert!(
            plan("c", 18, &data, &[])
                .unwrap_err()
                .contains("not this cluster's data directory")
        );
        assert!(
            plan("c", 18, &tmp.path().join("nope"), &[])
                .unwrap_err()
                .contains("not on this host")
        );
    }

    #[test]
    fn sanitizes_tablespace_names() {
        assert_eq!(sanitize("fast ts/ä"), "fast_ts__");
        assert_eq!(sanitize(""), "_");
    }
}
