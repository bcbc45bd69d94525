//! A small ext4 filesystem on a loop device, mounted in a temp dir, and v1
//! blkio cgroups that throttle it: the real resources the IO tests use.
//! Everything is undone on drop, also when a test fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const BLKIO: &str = "/sys/fs/cgroup/blkio";

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Same rule as tests/common/pg.rs: set, and not empty, 0 or false.
fn ci() -> bool {
    match std::env::var("CI") {
        Ok(v) => {
            let v = v.trim();
            !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
        }
        Err(std::env::VarError::NotPresent) => false,
        Err(std::env::VarError::NotUnicode(_)) => true,
    }
}

/// Why these tests cannot run here, if they cannot: they need root,
/// losetup/mkfs.ext4/mount/lsblk and (for throttles) cgroup v1 blkio.
pub fn unavailable(needs_blkio: bool) -> Option<String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if needs_blkio
        && !Path::new(BLKIO)
            .join("blkio.throttle.write_iops_device")
            .exists()
    {
        return Some(format!("no cgroup v1 blkio throttling at {BLKIO}"));
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "lsblk"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} not found"));
        }
    }
    None
}

/// Returns false (after saying why) when the test should skip; panics
/// instead under CI, which must not skip silently.
pub fn can_run(test: &str, needs_blkio: bool) -> bool {
    match unavailable(needs_blkio) {
        None => true,
        Some(why) => {
            assert!(!ci(), "CI must be able to run {test}: {why}");
            eprintln!("SKIPPED {test}: {why}");
            false
        }
    }
}

pub struct LoopVolume {
    _tmp: tempfile::TempDir,
    pub mnt: PathBuf,
    pub dev: String,
    pub majmin: String,
    groups: Vec<PathBuf>,
}

impl LoopVolume {
    /// `size` bytes of ext4, mounted at `<tmp>/mnt`. `for_postgres` makes
    /// the mount owned by postgres and the temp dir traversable by it.
    pub fn new(size: u64, for_postgres: bool) -> LoopVolume {
        let tmp = tempfile::tempdir().unwrap();
        let img = tmp.path().join("img");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        let dev = run("losetup", &["-f", "--show", img.to_str().unwrap()]);
        run("mkfs.ext4", &["-q", &dev]);
        run("mount", &[&dev, mnt.to_str().unwrap()]);
        if for_postgres {
            run("chown", &["postgres:postgres", mnt.to_str().unwrap()]);
            run("chmod", &["755", tmp.path().to_str().unwrap()]);
        }
        let majmin = run("lsblk", &["-dno", "MAJ:MIN", &dev]).replace(' ', "");
        LoopVolume {
            _tmp: tmp,
            mnt,
            dev,
            majmin,
            groups: Vec::new(),
        }
    }

    /// Kernel name of the loop device (`loop3`).
    pub fn name(&self) -> String {
        Path::new(&self.dev)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    /// A v1 blkio cgroup with `(file, value)` throttles on this device, e.g.
    /// `("write_iops_device", 100)`; removed on drop.
    pub fn group(&mut self, name: &str, limits: &[(&str, u64)]) -> PathBuf {
        let g = Path::new(BLKIO).join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&g).unwrap();
        self.groups.push(g.clone());
        for (file, v) in limits {
            self.throttle(&g, file, *v);
        }
        g
    }

    /// Sets a throttle of `group` on this device (0 removes it).
    pub fn throttle(&self, group: &Path, file: &str, value: u64) {
        std::fs::write(
            group.join(format!("blkio.throttle.{file}")),
            format!("{} {value}", self.majmin),
        )
        .unwrap();
    }
}

impl Drop for LoopVolume {
    fn drop(&mut self) {
        // Never panic here: drop may run while a failed test unwinds.
        for g in &self.groups {
            for f in [
                "write_iops_device",
                "read_iops_device",
                "write_bps_device",
                "read_bps_device",
            ] {
                let _ = std::fs::write(
                    g.join(format!("blkio.throttle.{f}")),
                    format!("{} 0", self.majmin),
                );
            }
            for pid in std::fs::read_to_string(g.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                let _ = std::fs::write(Path::new(BLKIO).join("cgroup.procs"), pid);
            }
            let _ = std::fs::remove_dir(g);
        }
        // IO that was throttled may still be draining (an exited process's
        // last writes): retry the unmount for a while rather than leak it.
        for _ in 0..40 {
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok || !self.mnt.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}
