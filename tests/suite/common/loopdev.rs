//! A small ext4 filesystem on a loop device, mounted in a temp dir, and v1
//! blkio cgroups that throttle it: the real resources the IO tests use.
//! Everything is undone on drop, also when a test fails.

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

/// Why these tests cannot run here, if they cannot: they need root,
/// losetup/mkfs.ext4/mount/lsblk, (for throttles) cgroup v1 blkio, and the
/// extra command-line `tools`.
pub fn unavailable_with(needs_blkio: bool, tools: &[&str]) -> Option<String> {
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
    for tool in ["losetup", "mkfs.ext4", "mount", "lsblk"]
        .iter()
        .chain(tools)
    {
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

/// Returns false when the test is skipped (root tests left out, see
/// [`super::cannot_run`]); fails the test when it cannot run.
pub fn can_run(test: &str, needs_blkio: bool) -> bool {
    can_run_with(test, needs_blkio, &[])
}

/// [`can_run`], also needing the extra command-line `tools` (e.g. `fio`).
pub fn can_run_with(test: &str, needs_blkio: bool, tools: &[&str]) -> bool {
    match unavailable_with(needs_blkio, tools) {
        None => true,
        Some(why) => {
            super::cannot_run(super::Part::Root, test, &why);
            false
        }
    }
}

/// One client's back-to-back commits measured by fio: see [`fio_commits`].
#[derive(Debug, Clone, Copy)]
pub struct FioCommits {
    /// Commits (write + fdatasync) completed per second.
    pub per_second: f64,
    /// Commits completed in the run.
    pub count: u64,
}

/// One client's commit rate in `dir` inside the blkio `group`: fio, one
/// job, 8 KiB sequential writes each followed by an fdatasync, back to
/// back, for `seconds` (the WAL writer's pattern, with no think time). The
/// 16 MiB file is laid out and synced outside the group first, so the
/// timed run overwrites allocated blocks as PostgreSQL does in recycled
/// WAL segments, and pays no layout IO against the group's throttle.
pub fn fio_commits(dir: &Path, group: &Path, seconds: u32) -> FioCommits {
    std::fs::create_dir_all(dir).unwrap();
    let job = |extra: &[String]| {
        let mut c = Command::new("fio");
        c.args([
            "--name=commits",
            // One process: fio's forked jobs would not be the child we hold.
            "--thread",
            "--rw=write",
            "--bs=8k",
            "--ioengine=sync",
            "--fdatasync=1",
            "--size=16M",
            "--overwrite=1",
            "--output-format=json",
        ])
        .arg(format!("--directory={}", dir.display()))
        .args(extra);
        c
    };
    let out = job(&["--create_only=1".into()]).output().unwrap();
    assert!(out.status.success(), "fio layout: {out:?}");
    run("sync", &["-f", dir.to_str().unwrap()]);
    let mut timed = job(&["--time_based".into(), format!("--runtime={seconds}")]);
    super::join_cgroup_before_exec(&mut timed, &group.join("cgroup.procs"));
    let out = timed.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fio: {out:?}");
    // fio prints notes before the JSON document on some versions.
    let json = &text[text.find('{').unwrap_or(0)..];
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("fio output: {e}: {text}"));
    let w = &v["jobs"][0]["write"];
    let per_second = w["iops"].as_f64().unwrap();
    let count = w["total_ios"].as_u64().unwrap();
    assert!(count > 0 && per_second > 0.0, "fio did no commit: {text}");
    FioCommits { per_second, count }
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

    /// A fault on this device in `group`: throttles and processes started
    /// inside the group, undone when the [`Fault`] is stopped or dropped.
    pub fn fault(&self, group: &Path) -> Fault {
        Fault {
            majmin: self.majmin.clone(),
            group: group.to_path_buf(),
            throttles: Vec::new(),
            children: Vec::new(),
        }
    }
}

/// Throttles set on a blkio group and processes started inside it (other
/// writers on the slow disk). Stopping lifts the throttles first, so the
/// IO the processes have queued drains at once and killing them does not
/// wait out the queue at the throttled rate (a process exits only when
/// its IO in flight completes), then kills and reaps them. Drop stops, so a
/// failing test leaves no throttle and no process behind; declare it after
/// the exporter it slows down, so that it is dropped first and the
/// exporter, killed next, is not held by throttled IO either.
pub struct Fault {
    majmin: String,
    group: PathBuf,
    throttles: Vec<String>,
    children: Vec<(String, std::process::Child)>,
}

impl Fault {
    /// Sets `blkio.throttle.<file>` of the group on the device.
    pub fn throttle(&mut self, file: &str, value: u64) {
        std::fs::write(
            self.group.join(format!("blkio.throttle.{file}")),
            format!("{} {value}", self.majmin),
        )
        .unwrap();
        self.throttles.push(file.to_string());
    }

    /// Starts `cmd` inside the group (joined between fork and exec, so even
    /// its first IO is in it); stdout and stderr go to null unless set.
    /// Returns its pid.
    pub fn spawn(&mut self, what: &str, mut cmd: Command) -> u32 {
        super::join_cgroup_before_exec(&mut cmd, &self.group.join("cgroup.procs"));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let pid = child.id();
        self.children.push((what.to_string(), child));
        pid
    }

    /// Whether every process started is still running (a writer that died
    /// early would make the fault milder than the test thinks).
    pub fn running(&mut self) -> Result<(), String> {
        for (what, c) in &mut self.children {
            if let Ok(Some(s)) = c.try_wait() {
                return Err(format!("{what} exited early: {s}"));
            }
        }
        Ok(())
    }

    /// Lifts the throttles, then kills and reaps the processes.
    pub fn stop(&mut self) {
        for file in self.throttles.drain(..) {
            let _ = std::fs::write(
                self.group.join(format!("blkio.throttle.{file}")),
                format!("{} 0", self.majmin),
            );
        }
        for (_, mut c) in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Fault {
    fn drop(&mut self) {
        // Never panics: stop ignores every error.
        self.stop();
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
