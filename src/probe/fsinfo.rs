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
    pub(crate) device: String,
    /// `MAJ:MIN` of the filesystem (`st_dev`).
    pub(crate) majmin: String,
    pub(crate) mount_point: PathBuf,
    /// The whole disk IO limits are set on (io.max and blkio throttles only
    /// accept whole disks, not partitions).
    pub(crate) disk: Option<Disk>,
    /// Why `disk` is unknown, when it is.
    pub(crate) disk_reason: Option<String>,
}

/// A whole block device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Disk {
    /// Kernel name: `vda`, `nvme0n1`, `loop3`, `dm-2`, `md0`.
    pub(crate) name: String,
    /// `MAJ:MIN`, as cgroup files and /proc/diskstats name it.
    pub(crate) majmin: String,
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
    let device = block_dir(&roots.sys, &majmin)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| {
            if source.is_empty() {
                "unknown".to_string()
            } else {
                source.clone()
            }
        });
    let (disk, disk_reason) = match whole_disk(&majmin, &source, roots) {
        Ok(d) => (Some(d), None),
        Err(why) => (None, Some(why)),
    };
    FsInfo {
        fstype,
        device,
        majmin,
        mount_point,
        disk,
        disk_reason,
    }
}

/// Resolves a filesystem's MAJ:MIN to the whole disk under it. A partition
/// (`/sys/dev/block/M:m/partition` exists) maps to its parent disk. An
/// anonymous device (major 0: btrfs, overlay, tmpfs, NFS) is resolved
/// through the mount source when that is a block device node (btrfs on
/// `/dev/sda2`); otherwise there is no disk to limit.
pub(crate) fn whole_disk(majmin: &str, source: &str, roots: &Roots) -> Result<Disk, String> {
    let mut mm = majmin.to_string();
    if mm.starts_with("0:") {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        match std::fs::metadata(source) {
            Ok(m) if m.file_type().is_block_device() => {
                mm = format!("{}:{}", libc::major(m.rdev()), libc::minor(m.rdev()));
            }
            _ => {
                return Err(format!(
                    "anonymous device {majmin} (mount source {source:?} is not a block device: \
                     tmpfs, overlay, network or multi-device filesystem)"
                ));
            }
        }
    }
    let dir = block_dir(&roots.sys, &mm)?;
    let disk_dir = if dir.join("partition").exists() {
        dir.parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| format!("{} has no parent disk", dir.display()))?
    } else {
        dir
    };
    let name = disk_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| format!("{}: no name", disk_dir.display()))?;
    let majmin = std::fs::read_to_string(disk_dir.join("dev"))
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{}/dev: {e}", disk_dir.display()))?;
    Ok(Disk { name, majmin })
}

/// The sysfs directory of block device `majmin`: `/sys/dev/block/M:m`,
/// or, where that directory is hidden, the entry of `/sys/class/block`
/// whose `dev` reads `M:m`. Container engines hide `/sys/dev/block`
/// (podman masks it by default) while `/sys/class/block` stays readable,
/// and without the disk no IO limit of a sidecar's volume could be found.
fn block_dir(sys: &Path, majmin: &str) -> Result<PathBuf, String> {
    let direct = sys.join("dev/block").join(majmin);
    let first = match std::fs::canonicalize(&direct) {
        Ok(p) => return Ok(p),
        Err(e) => format!("{}: {e}", direct.display()),
    };
    let class = sys.join("class/block");
    let entries =
        std::fs::read_dir(&class).map_err(|e| format!("{first}; {}: {e}", class.display()))?;
    for entry in entries.flatten() {
        let dev = std::fs::read_to_string(entry.path().join("dev")).unwrap_or_default();
        if dev.trim() == majmin {
            return std::fs::canonicalize(entry.path())
                .map_err(|e| format!("{}: {e}", entry.path().display()));
        }
    }
    Err(format!(
        "{first}; no entry of {} has dev {majmin}",
        class.display()
    ))
}

fn unknown() -> FsInfo {
    FsInfo {
        fstype: "unknown".to_string(),
        device: "unknown".to_string(),
        majmin: String::new(),
        mount_point: PathBuf::new(),
        disk: None,
        disk_reason: Some("path not accessible".to_string()),
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
    fn partitions_resolve_to_their_disk_in_a_sysfs_fixture() {
        let sys = tempfile::tempdir().unwrap();
        let disk = sys.path().join("devices/pci0/nvme/nvme0n1");
        std::fs::create_dir_all(disk.join("nvme0n1p2")).unwrap();
        std::fs::write(disk.join("dev"), "259:0\n").unwrap();
        std::fs::write(disk.join("nvme0n1p2/dev"), "259:2\n").unwrap();
        std::fs::write(disk.join("nvme0n1p2/partition"), "2\n").unwrap();
        std::fs::create_dir_all(sys.path().join("dev/block")).unwrap();
        std::os::unix::fs::symlink(disk.join("nvme0n1p2"), sys.path().join("dev/block/259:2"))
            .unwrap();
        std::os::unix::fs::symlink(&disk, sys.path().join("dev/block/259:0")).unwrap();
        let roots = Roots {
            proc: PathBuf::from("/proc"),
            sys: sys.path().to_path_buf(),
        };
        let want = Disk {
            name: "nvme0n1".into(),
            majmin: "259:0".into(),
        };
        assert_eq!(
            whole_disk("259:2", "/dev/nvme0n1p2", &roots),
            Ok(want.clone())
        );
        assert_eq!(whole_disk("259:0", "/dev/nvme0n1", &roots), Ok(want));
        let e = whole_disk("0:45", "overlay", &roots).unwrap_err();
        assert!(e.contains("anonymous device 0:45"), "{e}");
    }

    #[test]
    fn a_hidden_sys_dev_block_falls_back_to_sys_class_block() {
        // As podman shows sysfs: /sys/dev/block empty, /sys/class/block
        // symlinks into /sys/devices.
        let sys = tempfile::tempdir().unwrap();
        let disk = sys.path().join("devices/pci0/virtio3/block/vda");
        std::fs::create_dir_all(disk.join("vda1")).unwrap();
        std::fs::write(disk.join("dev"), "254:0\n").unwrap();
        std::fs::write(disk.join("vda1/dev"), "254:1\n").unwrap();
        std::fs::write(disk.join("vda1/partition"), "1\n").unwrap();
        std::fs::create_dir_all(sys.path().join("dev/block")).unwrap();
        std::fs::create_dir_all(sys.path().join("class/block")).unwrap();
        std::os::unix::fs::symlink(&disk, sys.path().join("class/block/vda")).unwrap();
        std::os::unix::fs::symlink(disk.join("vda1"), sys.path().join("class/block/vda1")).unwrap();
        let roots = Roots {
            proc: PathBuf::from("/proc"),
            sys: sys.path().to_path_buf(),
        };
        assert_eq!(
            whole_disk("254:1", "/dev/vda1", &roots),
            Ok(Disk {
                name: "vda".into(),
                majmin: "254:0".into(),
            })
        );
        let e = whole_disk("8:0", "/dev/sda", &roots).unwrap_err();
        assert!(
            e.contains("no entry of") && e.contains("has dev 8:0"),
            "{e}"
        );
    }

    #[test]
    fn the_root_filesystem_has_a_disk_here() {
        let info = lookup(Path::new("/"), &Roots::default());
        assert!(info.disk.is_some() || info.disk_reason.is_some());
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
