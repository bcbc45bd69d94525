//! Gathers the audit's host and volume facts from /proc, /sys and
//! mountinfo under configurable roots, so fixture trees can stand in.
//!
//! Blocking file reads: call from a blocking thread. A file that does not
//! exist (an older kernel, no THP, a device without a queue) leaves its
//! fact `None`, which skips the checks that need it; a file that exists
//! but cannot be read or parsed is also reported as an error, so the
//! exporter can tell "not checked" from "fine".

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{BootAssignment, HostFacts, VolumeFacts};

/// Errors of one reading pass: the file and what went wrong.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReadErrors(pub(crate) Vec<String>);

impl ReadErrors {
    /// A file's trimmed text; `None` when it does not exist.
    fn text(&mut self, path: &Path) -> Option<String> {
        match std::fs::read_to_string(path) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => {
                self.0.push(format!("{}: {e}", path.display()));
                None
            }
        }
    }

    fn number(&mut self, path: &Path) -> Option<u64> {
        let t = self.text(path)?;
        match t.parse() {
            Ok(n) => Some(n),
            Err(_) => {
                self.0
                    .push(format!("{}: not a number: {t:?}", path.display()));
                None
            }
        }
    }
}

/// The bracketed choice of a sysfs selector: `always [madvise] never` → `madvise`.
pub(crate) fn selected(text: &str) -> Option<String> {
    let start = text.find('[')?;
    let end = text[start..].find(']')? + start;
    Some(text[start + 1..end].to_string())
}

/// A `/proc/meminfo` line's value in bytes (kB lines) or pages (counts).
fn meminfo_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let mut parts = rest.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        Some(match parts.next() {
            Some("kB") => n * 1024,
            _ => n,
        })
    })
}

/// The host facts with the boot configuration of the filesystem at `/`
/// (what `check` judges: it has no configuration of its own).
pub(crate) fn host(proc_root: &Path, sys_root: &Path) -> (HostFacts, ReadErrors) {
    host_at(proc_root, sys_root, Path::new("/"))
}

/// The host facts, the boot-time sysctl configuration read under `rootfs`.
pub(crate) fn host_at(proc_root: &Path, sys_root: &Path, rootfs: &Path) -> (HostFacts, ReadErrors) {
    let mut e = ReadErrors::default();
    let vm = proc_root.join("sys/vm");
    let meminfo = e.text(&proc_root.join("meminfo"));
    let facts = HostFacts {
        mem_total_bytes: meminfo
            .as_deref()
            .and_then(|m| meminfo_value(m, "MemTotal")),
        hugepages_total: meminfo
            .as_deref()
            .and_then(|m| meminfo_value(m, "HugePages_Total")),
        dirty_ratio: e.number(&vm.join("dirty_ratio")),
        dirty_bytes: e.number(&vm.join("dirty_bytes")),
        dirty_background_ratio: e.number(&vm.join("dirty_background_ratio")),
        dirty_background_bytes: e.number(&vm.join("dirty_background_bytes")),
        swappiness: e.number(&vm.join("swappiness")),
        zone_reclaim_mode: e.number(&vm.join("zone_reclaim_mode")),
        overcommit_memory: e.number(&vm.join("overcommit_memory")),
        thp_enabled: e
            .text(&sys_root.join("kernel/mm/transparent_hugepage/enabled"))
            .and_then(|t| selected(&t)),
        boot: boot_sysctls(rootfs, proc_root, &mut e),
    };
    (facts, e)
}

/// Where sysctl.d(5) files live, highest priority first: a file name in
/// an earlier directory hides the same name in the later ones. (`/lib`
/// is often a link to `/usr/lib`: the same names, hidden the same way.)
pub(crate) const SYSCTL_DIRS: &[&str] = &[
    "etc/sysctl.d",
    "run/sysctl.d",
    "usr/local/lib/sysctl.d",
    "usr/lib/sysctl.d",
    "lib/sysctl.d",
];

/// `key = value` lines of a sysctl.conf(5) file, in order. `#` and `;`
/// start comments, a leading `-` only says "ignore a failure", and `/`
/// separates the key's parts as well as `.` does.
pub(crate) fn parse_sysctl_conf(text: &str, source: &str) -> Vec<BootAssignment> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
                return None;
            }
            let (k, v) = l.split_once('=')?;
            let key = k.trim().trim_start_matches('-').replace('/', ".");
            Some(BootAssignment {
                key,
                value: v.trim().to_string(),
                source: source.to_string(),
            })
        })
        .collect()
}

/// `sysctl.vm.swappiness=1` on the kernel command line (Linux 5.8 and
/// later apply these before any init system runs).
pub(crate) fn parse_cmdline(text: &str, source: &str) -> Vec<BootAssignment> {
    text.split_whitespace()
        .filter_map(|w| {
            let (k, v) = w.strip_prefix("sysctl.")?.split_once('=')?;
            Some(BootAssignment {
                key: k.replace('/', "."),
                value: v.to_string(),
                source: source.to_string(),
            })
        })
        .collect()
}

/// The order the next boot applies sysctl files in, as systemd-sysctl and
/// `sysctl --system` do: every `*.conf` name once (from the first
/// directory that has it), sorted by name, then `etc/sysctl.conf`
/// (`sysctl --system` reads it last; systemd-sysctl reaches it through
/// Debian's `99-sysctl.conf` link: the last word either way).
/// `present[i]` lists the `.conf` names found in `SYSCTL_DIRS[i]`.
pub(crate) fn sysctl_order(present: &[Vec<String>]) -> Vec<String> {
    let mut chosen: std::collections::BTreeMap<&str, String> = Default::default();
    for (dir, names) in SYSCTL_DIRS.iter().zip(present) {
        for n in names {
            chosen
                .entry(n.as_str())
                .or_insert_with(|| format!("{dir}/{n}"));
        }
    }
    let mut order: Vec<String> = chosen.into_values().collect();
    order.push("etc/sysctl.conf".to_string());
    order
}

/// The `vm.*` assignments the next boot makes, in the order it makes
/// them: the kernel command line first, then the files. `None` when
/// `rootfs` holds none of the sysctl locations: a container's own
/// filesystem often has none, and judging the host's running values
/// against an empty configuration would report every tuned value.
pub(crate) fn boot_sysctls(
    rootfs: &Path,
    proc_root: &Path,
    e: &mut ReadErrors,
) -> Option<Vec<BootAssignment>> {
    let mut any = rootfs.join("etc/sysctl.conf").exists();
    let mut present = Vec::new();
    for dir in SYSCTL_DIRS {
        let path = rootfs.join(dir);
        let mut names = Vec::new();
        match std::fs::read_dir(&path) {
            Ok(rd) => {
                any = true;
                for entry in rd.flatten() {
                    let n = entry.file_name().to_string_lossy().into_owned();
                    if n.ends_with(".conf") {
                        names.push(n);
                    }
                }
            }
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(err) => e.0.push(format!("{}: {err}", path.display())),
        }
        present.push(names);
    }
    if !any {
        return None;
    }
    let cmdline = proc_root.join("cmdline");
    let mut out = e
        .text(&cmdline)
        .map(|t| parse_cmdline(&t, &cmdline.display().to_string()))
        .unwrap_or_default();
    for rel in sysctl_order(&present) {
        let path = rootfs.join(&rel);
        // Shown as the path on the host, not under a container's mount.
        let shown = format!("/{rel}");
        if let Some(t) = e.text(&path) {
            out.extend(parse_sysctl_conf(&t, &shown));
        }
    }
    out.retain(|a| a.key.starts_with("vm."));
    Some(out)
}

/// One mountinfo line, the fields the audit needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Mount {
    pub(crate) majmin: String,
    pub(crate) mount_point: PathBuf,
    pub(crate) fstype: String,
    /// Per-mount and superblock options together.
    pub(crate) options: Vec<String>,
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let mut options: Vec<String> = f.get(5)?.split(',').map(str::to_string).collect();
            options.extend(r.get(2).unwrap_or(&"").split(',').map(str::to_string));
            Some(Mount {
                majmin: f.get(2)?.to_string(),
                mount_point: PathBuf::from(unescape(f.get(4)?)),
                fstype: r.first()?.to_string(),
                options,
            })
        })
        .collect()
}

/// The mount that holds `path`: the longest mount point above it, among
/// the mounts of its device when the device is known.
fn mount_of<'a>(mounts: &'a [Mount], path: &Path, majmin: Option<&str>) -> Option<&'a Mount> {
    mounts
        .iter()
        .filter(|m| majmin.is_none_or(|mm| m.majmin == mm) && path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())
}

/// Disks that are virtual by name: virtio (`vd*`) and Xen (`xvd*`).
fn virtual_by_name(disk: &str) -> bool {
    disk.starts_with("vd") || disk.starts_with("xvd")
}

/// Vendors of emulated or cloud block devices.
const VIRTUAL_VENDORS: &[&str] = &["QEMU", "VMware", "Msft", "Google", "Amazon", "VBOX", "Xen"];

/// `sync_too_fast` comes from the probe; the rest from the roots. `disk`
/// is the whole disk under the volume, when there is one.
/// The size of the filesystem holding `path` (statvfs: blocks × fragment
/// size); `None` when it cannot be read.
pub(crate) fn fs_size(path: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some(st.f_blocks.saturating_mul(st.f_frsize))
}

pub(crate) fn volume(
    proc_root: &Path,
    sys_root: &Path,
    path: &Path,
    disk: Option<&str>,
    sync_too_fast: Option<bool>,
) -> (VolumeFacts, ReadErrors) {
    let mut e = ReadErrors::default();
    let majmin = match std::fs::metadata(path) {
        Ok(m) => Some(format!("{}:{}", libc::major(m.dev()), libc::minor(m.dev()))),
        Err(err) => {
            e.0.push(format!("{}: {err}", path.display()));
            None
        }
    };
    let mounts = e
        .text(&proc_root.join("self/mountinfo"))
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default();
    let mount = majmin
        .as_deref()
        .and_then(|mm| mount_of(&mounts, path, Some(mm)));
    let overlay_upper_fstype = mount.filter(|m| m.fstype == "overlay").and_then(|m| {
        let upper = m.options.iter().find_map(|o| o.strip_prefix("upperdir="))?;
        mount_of(&mounts, Path::new(upper), None).map(|u| u.fstype.clone())
    });
    let mut facts = VolumeFacts {
        fstype: mount.map(|m| m.fstype.clone()),
        overlay_upper_fstype,
        mount_options: mount.map(|m| m.options.clone()),
        disk: disk.map(str::to_string),
        sync_too_fast,
        size_bytes: majmin.as_ref().and_then(|_| fs_size(path)),
        ..VolumeFacts::default()
    };
    if let Some(d) = disk {
        let block = sys_root.join("block").join(d);
        let q = block.join("queue");
        facts.scheduler = e.text(&q.join("scheduler")).map(|t| {
            // `none` alone is printed without brackets.
            selected(&t).unwrap_or(t)
        });
        facts.rotational = e.number(&q.join("rotational")).map(|r| r != 0);
        facts.write_cache = e.text(&q.join("write_cache"));
        facts.read_ahead_kb = e.number(&q.join("read_ahead_kb"));
        let vendor = e.text(&block.join("device/vendor")).unwrap_or_default();
        facts.virtual_disk =
            virtual_by_name(d) || VIRTUAL_VENDORS.iter().any(|v| vendor.starts_with(v));
    }
    (facts, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro
30 22 0:40 / /run rw,nosuid,nodev - tmpfs tmpfs rw,size=1024k
31 22 7:3 / /srv/wal rw,noatime - ext4 /dev/loop3 rw,nobarrier
32 22 0:50 / /srv/over rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/run/up,workdir=/run/w
33 22 252:1 /a\\040b /srv/a\\040b rw - ext4 /dev/vda1 rw
";

    #[test]
    fn mountinfo_lines() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 5);
        assert_eq!(m[2].fstype, "ext4");
        assert!(m[2].options.contains(&"nobarrier".to_string()));
        assert!(m[2].options.contains(&"noatime".to_string()));
        assert_eq!(m[4].mount_point, PathBuf::from("/srv/a b"));
        let over = mount_of(&m, Path::new("/srv/over/x"), Some("0:50")).unwrap();
        assert_eq!(over.fstype, "overlay");
        let up = mount_of(&m, Path::new("/run/up"), None).unwrap();
        assert_eq!(up.fstype, "tmpfs");
    }

    #[test]
    fn sysctl_files_in_boot_order() {
        let a = parse_sysctl_conf(
            "# c\n; c\n\n vm.swappiness = 1 \n-vm/dirty_bytes=1073741824\nkernel.x = a b\nnoequals\n",
            "/etc/sysctl.d/a.conf",
        );
        let kv: Vec<(&str, &str)> = a.iter().map(|a| (&*a.key, &*a.value)).collect();
        assert_eq!(
            kv,
            [
                ("vm.swappiness", "1"),
                ("vm.dirty_bytes", "1073741824"),
                ("kernel.x", "a b")
            ]
        );
        let c = parse_cmdline("BOOT_IMAGE=/vmlinuz ro sysctl.vm.swappiness=5 quiet", "c");
        assert_eq!((&*c[0].key, &*c[0].value), ("vm.swappiness", "5"));
        assert_eq!(c.len(), 1);
        // /etc hides /usr/lib's file of the same name; names sort across
        // directories; sysctl.conf comes last.
        let present = vec![
            vec!["50-x.conf".to_string()],
            vec![],
            vec![],
            vec!["50-x.conf".to_string(), "10-y.conf".to_string()],
            vec!["99-z.conf".to_string()],
        ];
        assert_eq!(
            sysctl_order(&present),
            [
                "usr/lib/sysctl.d/10-y.conf",
                "etc/sysctl.d/50-x.conf",
                "lib/sysctl.d/99-z.conf",
                "etc/sysctl.conf"
            ]
        );
    }

    #[test]
    fn boot_sysctls_under_a_root() {
        let root = tempfile::tempdir().unwrap();
        let none = boot_sysctls(root.path(), root.path(), &mut ReadErrors::default());
        assert_eq!(none, None, "no sysctl location: nothing to judge against");
        let d = root.path().join("usr/lib/sysctl.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("10-a.conf"), "vm.swappiness = 30\nnet.x = 1\n").unwrap();
        let etc = root.path().join("etc/sysctl.d");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("10-a.conf"), "vm.swappiness = 1\n").unwrap();
        std::fs::write(etc.join("20-b.txt"), "vm.swappiness = 99\n").unwrap();
        std::fs::write(
            root.path().join("cmdline"),
            "sysctl.vm.overcommit_memory=2\n",
        )
        .unwrap();
        let mut e = ReadErrors::default();
        let got = boot_sysctls(root.path(), root.path(), &mut e).unwrap();
        let kv: Vec<(&str, &str, &str)> = got
            .iter()
            .map(|a| (&*a.key, &*a.value, &*a.source))
            .collect();
        let cmdline = root.path().join("cmdline").display().to_string();
        assert_eq!(
            kv,
            [
                ("vm.overcommit_memory", "2", cmdline.as_str()),
                ("vm.swappiness", "1", "/etc/sysctl.d/10-a.conf")
            ]
        );
        assert!(e.0.is_empty(), "{e:?}");
    }

    #[test]
    fn selectors_and_meminfo() {
        assert_eq!(
            selected("always [madvise] never").as_deref(),
            Some("madvise")
        );
        assert_eq!(selected("[none] mq-deadline").as_deref(), Some("none"));
        assert_eq!(selected("none"), None);
        let mi = "MemTotal:       16384000 kB\nHugePages_Total:      12\n";
        assert_eq!(meminfo_value(mi, "MemTotal"), Some(16_384_000 * 1024));
        assert_eq!(meminfo_value(mi, "HugePages_Total"), Some(12));
        assert_eq!(meminfo_value(mi, "HugePages_Free"), None);
    }
}
