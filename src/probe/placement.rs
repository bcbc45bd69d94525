//! Where probe files may go. The exporter never writes inside a directory
//! PostgreSQL owns (data directory, WAL directory, tablespace location), and
//! a probe directory must be on the filesystem it is meant to measure.
//! The configuration, volume discovery and `check` all ask here.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Where a probe directory came from, which decides what the user can do
/// when it falls inside a directory PostgreSQL owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asker {
    /// A `[[volume]]` of the configuration file (it has a `probe_dir` key).
    ConfigFile,
    /// `--probe.path`, which has no way to choose the probe directory.
    ProbePathFlag,
    /// `check PATH` (it has `--probe-dir`).
    Check,
    /// Volume discovery from a cluster's directories.
    Discovery,
}

impl Asker {
    fn remedy(self) -> &'static str {
        match self {
            Asker::ConfigFile => "Set probe_dir to a directory beside it on the same filesystem",
            Asker::ProbePathFlag => {
                "Give --probe.path a directory beside it on the same filesystem, or probe it \
                 from --config.file with a [[volume]] whose probe_dir is a directory beside it"
            }
            Asker::Check => {
                "Give check a directory beside it on the same filesystem, or --probe-dir \
                 with one"
            }
            Asker::Discovery => {
                "To probe this filesystem, add a [[volume]] to --config.file whose probe_dir \
                 is a directory beside it on the same filesystem"
            }
        }
    }
}

/// Refuses probe directories that PostgreSQL owns or that would measure a
/// different filesystem than the volume.
pub(crate) fn check_probe_dir(volume: &Path, probe_dir: &Path, asker: Asker) -> Result<(), String> {
    if let Some(owner) = postgres_owned_ancestor(probe_dir) {
        return Err(format!(
            "probe directory {} would be inside PostgreSQL's {}: the exporter never writes there. {}",
            probe_dir.display(),
            owner.display(),
            asker.remedy()
        ));
    }
    // The probe directory itself may not exist yet: compare its parent.
    let existing = if probe_dir.exists() {
        probe_dir.to_path_buf()
    } else {
        match probe_dir.parent() {
            Some(p) => p.to_path_buf(),
            None => {
                return Err(format!(
                    "probe directory {} has no parent",
                    probe_dir.display()
                ));
            }
        }
    };
    let pd = std::fs::metadata(&existing)
        .map_err(|e| format!("probe directory parent {}: {e}", existing.display()))?;
    let vol = std::fs::metadata(volume).map_err(|e| format!("path {}: {e}", volume.display()))?;
    if pd.dev() != vol.dev() {
        return Err(format!(
            "probe directory {} is on a different filesystem than {}: it would measure the wrong device",
            probe_dir.display(),
            volume.display()
        ));
    }
    Ok(())
}

/// The PostgreSQL-owned directory that contains `p`, if any:
/// - a data directory: `PG_VERSION` next to `global/`;
/// - a WAL directory: named `pg_wal` (`pg_xlog` before 10), or holding
///   `archive_status/`, which PostgreSQL creates in every WAL directory,
///   so a `pg_wal` symlinked elsewhere (`initdb --waldir`) is caught by
///   content whatever its name;
/// - a tablespace location: holding a `PG_<major>_<catversion>` directory.
pub(crate) fn postgres_owned_ancestor(p: &Path) -> Option<PathBuf> {
    let mut cur = PathBuf::new();
    for comp in p.components() {
        cur.push(comp);
        if let Component::Normal(n) = comp
            && (n == "pg_wal" || n == "pg_xlog")
        {
            return Some(cur);
        }
        if matches!(comp, Component::RootDir) {
            continue;
        }
        if cur.join("PG_VERSION").is_file() && cur.join("global").is_dir() {
            return Some(cur);
        }
        if cur.join("archive_status").is_dir() {
            return Some(cur);
        }
        if is_tablespace_location(&cur) {
            return Some(cur);
        }
    }
    None
}

fn is_tablespace_location(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.filter_map(Result::ok).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let mut parts = name.splitn(3, '_');
        parts.next() == Some("PG")
            && parts
                .next()
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
            && parts
                .next()
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
            && e.file_type().is_ok_and(|t| t.is_dir())
    })
}
