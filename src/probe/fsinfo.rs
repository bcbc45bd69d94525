//! Which filesystem and device a path lives on, from mountinfo and sysfs.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use procfs::FromRead;
use procfs::process::MountInfos;

/// Filesystem facts for `pgstorage_volume_info` and `check`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FsInfo {
    /// Filesystem type from mountinfo (`ext4`, `xfs`, `tmpfs`, ...).
    pub fstype: String,
    /// Kernel block device name (`vda`, `nvme0n1p2`, `loop3`), or the mount
    /// source for filesystems without one (`tmpfs`, `overlay`).
    pub device: String,
    /// `MAJ:MIN` of the filesystem (`st_dev`).
    pub majmin: String,
    pub mount_point: PathBuf,
}

/// Roots of /proc and /sys, configurable so tests can use fixture trees.
#[derive(Debug, Clone)]
pub struct Roots {
    pub proc: PathBuf,
    pub sys: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
        }
    }
}

/// Looks up the filesystem of `path`. Never fails: unknown parts are
/// reported as `unknown`, because a missing label must not stop probing.
pub fn lookup(path: &Path, roots: &Roots) -> FsInfo {
    let Ok(meta) = std::fs::metadata(path) else {
        return unknown();
    };
    let dev = meta.dev();
    let majmin = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let mounts = std::fs::File::open(roots.proc.join("self/mountinfo"))
        .ok()
        .and_then(|f| MountInfos::from_read(f).ok());
    let best = mounts.as_ref().and_then(|m| {
        m.0.iter()
            .filter(|mi| mi.majmin == majmin && path.starts_with(&mi.mount_point))
            .max_by_key(|mi| mi.mount_point.as_os_str().len())
    });
    let (fstype, source, mount_point) = match best {
        Some(mi) => (
            mi.fs_type.clone(),
            mi.mount_source.clone().unwrap_or_default(),
            mi.mount_point.clone(),
        ),
        None => ("unknown".to_string(), String::new(), PathBuf::new()),
    };
    let device = std::fs::canonicalize(roots.sys.join("dev/block").join(&majmin))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| {
            if source.is_empty() {
                "unknown".to_string()
            } else {
                source.clone()
            }
        });
    FsInfo {
        fstype,
        device,
        majmin,
        mount_point,
    }
}

fn unknown() -> FsInfo {
    FsInfo {
        fstype: "unknown".to_string(),
        device: "unknown".to_string(),
        majmin: String::new(),
        mount_point: PathBuf::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_filesystem_of_a_real_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let info = lookup(tmp.path(), &Roots::default());
        assert_ne!(info.fstype, "unknown", "{info:?}");
        assert!(!info.majmin.is_empty());
        assert!(tmp.path().starts_with(&info.mount_point));
    }

    #[test]
    fn proc_fixture_without_the_mount_gives_unknown() {
        let fake = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(fake.path().join("self")).unwrap();
        std::fs::write(fake.path().join("self/mountinfo"), "").unwrap();
        let roots = Roots {
            proc: fake.path().to_path_buf(),
            sys: fake.path().to_path_buf(),
        };
        let info = lookup(Path::new("/"), &roots);
        assert_eq!(info.fstype, "unknown");
        assert_eq!(info.device, "unknown");
    }
}
