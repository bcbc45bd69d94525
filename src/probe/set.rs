//! The set of probed volumes. Volumes come from the configuration at start
//! and from PostgreSQL volume discovery later, so the set grows at run time;
//! readers (metrics, landing page, watchdog) take a cheap copy of the list.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::probe::fsinfo::{self, Roots};
use crate::probe::runner::{self, Stop};
use crate::probe::settings::{VolumeLimits, VolumeSpec};
use crate::probe::state::VolumeState;

#[derive(Debug)]
pub(crate) struct VolumeSet {
    volumes: RwLock<Vec<Arc<VolumeState>>>,
    window: Duration,
    roots: Roots,
    stop: Arc<Stop>,
    /// Per volume: its own stop signal (a reload removes one volume) and
    /// its thread, to wait for it.
    threads: Mutex<HashMap<String, ProbeThread>>,
    /// Signalled when a volume is added, for the watchdog, which otherwise
    /// sleeps until the earliest moment a probe could pass its timeout.
    pub(crate) added: tokio::sync::Notify,
}

/// A running probe thread: its own stop signal and its handle.
type ProbeThread = (Arc<Stop>, JoinHandle<()>);

impl VolumeSet {
    pub(crate) fn new(window: Duration, roots: Roots) -> Arc<VolumeSet> {
        Arc::new(VolumeSet {
            volumes: RwLock::new(Vec::new()),
            window,
            roots,
            stop: Stop::new(),
            threads: Mutex::new(HashMap::new()),
            added: tokio::sync::Notify::new(),
        })
    }

    /// Current volumes, in the order they were added.
    pub(crate) fn list(&self) -> Vec<Arc<VolumeState>> {
        self.volumes.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// The volume already probing the filesystem `dev` (st_dev), if any.
    pub(crate) fn on_device(&self, dev: u64) -> Option<Arc<VolumeState>> {
        self.list().into_iter().find(|v| {
            std::fs::metadata(&v.path)
                .map(|m| m.dev() == dev)
                .unwrap_or(false)
        })
    }

    /// Adds a volume and starts its probe thread.
    pub(crate) fn add(&self, cfg: VolumeSpec) -> anyhow::Result<Arc<VolumeState>> {
        if self.stop.is_stopped() {
            anyhow::bail!("shutting down");
        }
        if self.list().iter().any(|v| v.name == cfg.name) {
            anyhow::bail!("a volume named {:?} exists already", cfg.name);
        }
        let fs = fsinfo::lookup(&cfg.path, &self.roots);
        let state = Arc::new(VolumeState::new(&cfg, self.window, fs.clone()));
        tracing::info!(
            volume = %cfg.name,
            path = %cfg.path.display(),
            device = %fs.device,
            fstype = %fs.fstype,
            disk = %fs.disk.as_ref().map(|d| format!("{} ({})", d.name, d.majmin)).unwrap_or_else(|| "unknown".into()),
            probe_dir = %cfg.probe_dir.display(),
            "volume configured"
        );
        if let Some(why) = &fs.disk_reason {
            tracing::info!(volume = %cfg.name, reason = %why, "no whole disk for this volume: IO limits cannot be read for it");
        }
        // Under the threads lock, which shutdown takes after signalling
        // stop: either shutdown sees this thread (and waits for it and
        // removes its files), or this sees the stop and starts nothing.
        let mut threads = self
            .threads
            .lock()
            .map_err(|_| anyhow::anyhow!("probe thread table poisoned"))?;
        if self.stop.is_stopped() {
            anyhow::bail!("shutting down");
        }
        if let Ok(mut v) = self.volumes.write() {
            v.push(state.clone());
        }
        let name = cfg.name.clone();
        let stop = Stop::new();
        let handle = match runner::spawn(cfg, state.clone(), stop.clone()) {
            Ok(h) => h,
            Err(e) => {
                if let Ok(mut v) = self.volumes.write() {
                    v.retain(|v| v.name != name);
                }
                return Err(e)
                    .with_context(|| format!("starting the probe thread of volume {name:?}"));
            }
        };
        threads.insert(name, (stop, handle));
        self.added.notify_one();
        Ok(state)
    }

    /// Gives a running volume new provisioned limits and cgroup, keeping
    /// its probe thread, window and counters. The previous limits, or
    /// `None` when there is no such volume.
    pub(crate) fn set_limits(&self, name: &str, limits: VolumeLimits) -> Option<VolumeLimits> {
        let v = self.list().into_iter().find(|v| v.name == name)?;
        let before = v.limits();
        v.set_limits(limits);
        Some(before)
    }

    /// Stops one volume's probe thread, waits at most `timeout` for it,
    /// removes its probe files and its series. Used by a configuration
    /// reload; the same rules as [`VolumeSet::shutdown`] apply to a thread
    /// stuck in IO (it is abandoned, and said so). False when there is no
    /// such volume.
    pub(crate) fn remove(&self, name: &str, timeout: Duration) -> bool {
        let entry = self.threads.lock().ok().and_then(|mut t| t.remove(name));
        let Some(state) = self.list().into_iter().find(|v| v.name == name) else {
            return false;
        };
        if let Some((stop, handle)) = entry {
            stop.stop();
            if !join_until(handle, Instant::now() + timeout) {
                abandon(&state);
            }
        }
        remove_files(&state);
        if let Ok(mut v) = self.volumes.write() {
            v.retain(|v| v.name != name);
        }
        true
    }

    /// Counts probes stuck past their timeout; when to look again (see
    /// `runner::check_timeouts`).
    pub(crate) fn check_timeouts(&self, now: Instant) -> Option<Instant> {
        runner::check_timeouts(&self.list(), now)
    }

    /// Stops every probe thread, waits at most `timeout` for them, then
    /// removes every volume's probe files whether or not its thread
    /// finished. A thread stuck in a sync cannot be interrupted; it is
    /// abandoned (the process exits around it) and said so in the log.
    pub(crate) fn shutdown(&self, timeout: Duration) {
        self.stop.stop();
        let threads: Vec<(String, ProbeThread)> = self
            .threads
            .lock()
            .map(|mut t| t.drain().collect())
            .unwrap_or_default();
        for (_, (stop, _)) in &threads {
            stop.stop();
        }
        let deadline = Instant::now() + timeout;
        let volumes = self.list();
        for (name, (_, handle)) in threads {
            if !join_until(handle, deadline)
                && let Some(v) = volumes.iter().find(|v| v.name == name)
            {
                abandon(v);
            }
        }
        for v in &volumes {
            remove_files(v);
        }
    }
}

/// Waits for a probe thread until `deadline`; false if it is still running
/// (stuck in the kernel: nothing can interrupt it).
fn join_until(handle: JoinHandle<()>, deadline: Instant) -> bool {
    // JoinHandle has no timed join; the wait is short and rare (shutdown,
    // reload), so polling costs nothing that matters.
    while !handle.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if handle.is_finished() {
        let _ = handle.join();
        true
    } else {
        false
    }
}

fn abandon(v: &VolumeState) {
    match v.in_flight(Instant::now()) {
        Some((op, age)) => tracing::warn!(
            volume = %v.name,
            op = %op,
            in_flight = ?age,
            "abandoning probe thread stuck in IO; its probe files are removed anyway"
        ),
        None => {
            tracing::warn!(volume = %v.name, "abandoning probe thread that did not stop in time")
        }
    }
}

fn remove_files(v: &VolumeState) {
    if let Some(dir) = v.probe_dir() {
        let problems = dir.remove_all();
        if problems.is_empty() {
            tracing::info!(volume = %v.name, probe_dir = %crate::types::Shown(dir.path()), "removed probe files");
        }
        for p in problems {
            tracing::error!(volume = %v.name, problem = %p, "could not remove probe file");
        }
    }
}
