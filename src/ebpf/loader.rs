//! The kernel side, loaded with aya: the programs of syncs.bpf.c attached
//! to their tracepoints, and the maps user space seeds and reads.
//!
//! Why aya: a pure-Rust loader (no libbpf to build or link, a small
//! dependency tree) that does the CO-RE relocations itself from the
//! kernel's BTF; the C program is the only part that needs clang, and
//! only with the `bpf` feature.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use aya::maps::{Array, HashMap as BpfHash, MapData, PerCpuArray, PerCpuValues};
use aya::programs::{BtfTracePoint, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};

use super::seed::{self, Dirs, Off, Reading};

/// wal, data, other: the program's kinds.
const KINDS: u32 = 3;

/// The compiled program (build.rs), aligned as the ELF parser needs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/syncs.bpf.o"));

/// MAX_SLOTS in the program: clusters traced at once.
const MAX_SLOTS: u32 = 64;
/// Per histogram: 37 bounds + Inf, the sum, the count.
const WORDS: usize = 40;

/// (syscall tracepoint, program) pairs.
const SYSCALLS: [(&str, &str); 6] = [
    ("sys_enter_fdatasync", "enter_fdatasync"),
    ("sys_exit_fdatasync", "exit_fdatasync"),
    ("sys_enter_fsync", "enter_fsync"),
    ("sys_exit_fsync", "exit_fsync"),
    ("sys_enter_pwrite64", "enter_pwrite64"),
    ("sys_exit_pwrite64", "exit_pwrite64"),
];

/// Rounds between two readings of a traced cluster's directories while its
/// postmaster stays the same (every other round: 10 s): only a tablespace
/// created or dropped changes them then (`pg_wal` moves only across a
/// restart).
const DIRS_EVERY: u32 = 2;

/// A traced cluster's slot and what the kernel was last told about it.
#[derive(Debug)]
struct Slot {
    index: u32,
    postmaster: Option<u32>,
    dirs: Option<Dirs>,
    traced_once: bool,
    /// `postmaster.pid` when the postmaster was last found from it, and
    /// the data directory's (device, inode) then.
    pid_file: Option<(seed::Stamp, (u64, u64))>,
    /// Rounds since the directories were read.
    dirs_age: u32,
}

pub(super) struct Tracer {
    /// Owns the programs and their links: dropping it detaches them.
    _bpf: Ebpf,
    procs: BpfHash<MapData, u32, u32>,
    clusters: Array<MapData, [u64; 6]>,
    db_parents: BpfHash<MapData, [u64; 2], u32>,
    hist: PerCpuArray<MapData, [u64; WORDS]>,
    slots: HashMap<String, Slot>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("slots", &self.slots)
            .finish()
    }
}

fn load_err(what: &str, e: impl std::fmt::Display) -> (Off, String) {
    let text = e.to_string();
    // EPERM from bpf() under a restrictive LSM or seccomp profile, even
    // with the capabilities.
    let off = if text.contains("Operation not permitted") {
        Off::Permission
    } else {
        Off::Load
    };
    (off, format!("{what}: {text}"))
}

impl Tracer {
    pub(super) fn start() -> Result<Tracer, (Off, String)> {
        let btf = Btf::from_sys_fs().map_err(|e| (Off::Btf, e.to_string()))?;
        let bounds: Vec<u64> = crate::model::buckets::probe_buckets()
            .iter()
            .map(|s| (s * 1e9).round() as u64)
            .collect();
        let bounds: [u64; 37] = bounds
            .try_into()
            .map_err(|_| (Off::Load, "bucket layout is not 37 bounds".to_string()))?;
        let mut bpf = EbpfLoader::new()
            .btf(Some(&btf))
            .set_global("BOUNDS", &bounds, true)
            .load(OBJECT)
            .map_err(|e| load_err("loading the programs", e))?;
        for (tp, name) in SYSCALLS {
            let prog: &mut TracePoint = bpf
                .program_mut(name)
                .ok_or_else(|| (Off::Load, format!("program {name} missing")))?
                .try_into()
                .map_err(|e| load_err(name, e))?;
            prog.load().map_err(|e| load_err(name, e))?;
            prog.attach("syscalls", tp).map_err(|e| load_err(tp, e))?;
        }
        for (tp, name) in [
            ("sched_process_fork", "on_fork"),
            ("sched_process_exit", "on_exit"),
        ] {
            let prog: &mut BtfTracePoint = bpf
                .program_mut(name)
                .ok_or_else(|| (Off::Load, format!("program {name} missing")))?
                .try_into()
                .map_err(|e| load_err(name, e))?;
            prog.load(tp, &btf).map_err(|e| load_err(name, e))?;
            prog.attach().map_err(|e| load_err(tp, e))?;
        }
        let mut take = |name: &str| {
            bpf.take_map(name)
                .ok_or_else(|| (Off::Load, format!("map {name} missing")))
        };
        let procs = BpfHash::try_from(take("procs")?).map_err(|e| load_err("procs", e))?;
        let clusters = Array::try_from(take("clusters")?).map_err(|e| load_err("clusters", e))?;
        let db_parents =
            BpfHash::try_from(take("db_parents")?).map_err(|e| load_err("db_parents", e))?;
        let hist = PerCpuArray::try_from(take("hist")?).map_err(|e| load_err("hist", e))?;
        Ok(Tracer {
            _bpf: bpf,
            procs,
            clusters,
            db_parents,
            hist,
            slots: HashMap::new(),
        })
    }

    /// Reconciles the traced clusters with `targets` and reads their
    /// histograms.
    pub(super) fn round(&mut self, targets: &[(String, Option<PathBuf>)]) -> Vec<Reading> {
        let gone: Vec<String> = self
            .slots
            .keys()
            .filter(|n| !targets.iter().any(|(t, _)| t == *n))
            .cloned()
            .collect();
        for name in gone {
            if let Some(s) = self.slots.remove(&name) {
                self.forget(s.index);
            }
        }
        let mut out = Vec::new();
        for (name, data) in targets {
            let traced = self.reconcile(name, data.as_deref());
            let kinds = self
                .slots
                .get(name)
                .filter(|s| s.traced_once)
                .map(|s| self.read(s.index));
            out.push((name.clone(), traced, kinds));
        }
        out
    }

    fn reconcile(
        &mut self,
        name: &str,
        data: Option<&std::path::Path>,
    ) -> Result<(), &'static str> {
        if !self.slots.contains_key(name) {
            let used: BTreeSet<u32> = self.slots.values().map(|s| s.index).collect();
            let index = (0..MAX_SLOTS)
                .find(|i| !used.contains(i))
                .ok_or("too_many_clusters")?;
            // The slot may have held a cluster a reload removed.
            self.zero(index);
            self.slots.insert(
                name.to_string(),
                Slot {
                    index,
                    postmaster: None,
                    dirs: None,
                    traced_once: false,
                    pid_file: None,
                    dirs_age: 0,
                },
            );
        }
        let data = data.ok_or("no_data_directory")?;
        let Some(slot) = self.slots.get(name) else {
            return Err("no_data_directory");
        };
        let (index, had_pid, had_dirs) = (slot.index, slot.postmaster, slot.dirs.clone());
        // The cheap way while nothing changed: the same postmaster.pid
        // naming a process that still runs in the same data directory is
        // the same postmaster (2 stats, not 10 file system calls), and the
        // directories are read again every DIRS_EVERY rounds.
        let stamp = seed::stamp(&data.join("postmaster.pid"));
        let same = match (had_pid, slot.pid_file, stamp) {
            (Some(p), Some((was, dir)), Some(now)) if was == now && seed::runs_in(p, dir) => {
                Some((p, dir))
            }
            _ => None,
        };
        let read_dirs = same.is_none() || had_dirs.is_none() || slot.dirs_age >= DIRS_EVERY;
        let pid = match same {
            Some((p, _)) => Ok(p),
            None => seed::postmaster(data),
        };
        let dirs = match &had_dirs {
            Some(d) if !read_dirs => Ok(d.clone()),
            _ => seed::dirs(data).ok_or("not_local"),
        };
        let (pid, dirs) = match (pid, dirs) {
            (Ok(p), Ok(d)) => (p, d),
            (Err(e), _) | (_, Err(e)) => {
                if had_pid.is_some() {
                    drop_cluster(&mut self.procs, index);
                    if let Some(s) = self.slots.get_mut(name) {
                        s.postmaster = None;
                    }
                }
                return Err(e);
            }
        };
        if had_dirs.as_ref() != Some(&dirs) {
            self.set_dirs(index, &dirs);
        }
        if had_pid != Some(pid) {
            // A new postmaster (a restart): its old processes are gone.
            drop_cluster(&mut self.procs, index);
            // The postmaster first: from then on the kernel adds what it
            // forks, so a backend forked while /proc is read is not missed.
            let _ = self.procs.insert(pid, index, 0);
            for p in seed::descendants(pid) {
                // A full map drops the entry: that process goes untraced.
                let _ = self.procs.insert(p, index, 0);
            }
        }
        if let Some(s) = self.slots.get_mut(name) {
            s.postmaster = Some(pid);
            s.dirs_age = if read_dirs { 0 } else { s.dirs_age + 1 };
            if same.is_none() {
                s.pid_file = stamp.zip(seed::dir_id(data));
            }
            s.dirs = Some(dirs);
            s.traced_once = true;
        }
        Ok(())
    }

    fn set_dirs(&mut self, index: u32, d: &Dirs) {
        drop_cluster(&mut self.db_parents, index);
        for (dev, ino) in &d.db_parents {
            let _ = self.db_parents.insert([*dev, *ino], index, 0);
        }
        let value = [d.wal.0, d.wal.1, d.data_dev, d.global, d.control, 1];
        let _ = self.clusters.set(index, value, 0);
    }

    fn forget(&mut self, index: u32) {
        drop_cluster(&mut self.procs, index);
        drop_cluster(&mut self.db_parents, index);
        let _ = self.clusters.set(index, [0; 6], 0);
    }

    fn zero(&mut self, index: u32) {
        let Ok(cpus) = aya::util::nr_cpus() else {
            return;
        };
        for k in 0..KINDS {
            if let Ok(v) = PerCpuValues::try_from(vec![[0u64; WORDS]; cpus]) {
                let _ = self.hist.set(index * KINDS + k, v, 0);
            }
        }
    }

    /// Each kind's histogram words, summed over the CPUs.
    fn read(&self, index: u32) -> [Vec<u64>; 3] {
        let mut out: [Vec<u64>; 3] = Default::default();
        for (k, h) in out.iter_mut().enumerate() {
            *h = vec![0; WORDS];
            let Ok(per_cpu) = self.hist.get(&(index * KINDS + k as u32), 0) else {
                continue;
            };
            for words in per_cpu.iter() {
                for (sum, w) in h.iter_mut().zip(words.iter()) {
                    *sum += w;
                }
            }
        }
        out
    }
}

/// Removes a cluster's entries from a map whose values are cluster indexes
/// (its processes, its database directories).
fn drop_cluster<K: aya::Pod>(map: &mut BpfHash<MapData, K, u32>, index: u32) {
    let stale: Vec<K> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, v)| *v == index)
        .map(|(k, _)| k)
        .collect();
    for k in stale {
        let _ = map.remove(&k);
    }
}
