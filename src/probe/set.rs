//! The set of probed volumes. Volumes come from the configuration at start
//! and from PostgreSQL volume discovery later, so the set grows at run time;
//! readers (metrics, landing page, watchdog) take a cheap copy of the list.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::VolumeConfig;
use crate::metrics::probe::ProbeMetrics;
use crate::probe::fsinfo::{self, Roots};
use crate::probe::runner::{self, Stop};
use crate::probe::state::VolumeState;

#[derive(Debug)]
pub struct VolumeSet {
    volumes: RwLock<Vec<Arc<VolumeState>>>,
    window: Duration,
    roots: Roots,
    metrics: ProbeMetrics,
    stop: Arc<Stop>,
    done_tx: Mutex<Option<Sender<String>>>,
    done_rx: Mutex<Option<Receiver<String>>>,
    running: Mutex<HashSet<String>>,
}

impl VolumeSet {
    pub fn new(window: Duration, metrics: ProbeMetrics, roots: Roots) -> Arc<VolumeSet> {
        let (tx, rx) = mpsc::channel();
        Arc::new(VolumeSet {
            volumes: RwLock::new(Vec::new()),
            window,
            roots,
            metrics,
            stop: Stop::new(),
            done_tx: Mutex::new(Some(tx)),
            done_rx: Mutex::new(Some(rx)),
            running: Mutex::new(HashSet::new()),
        })
    }

    /// Current volumes, in the order they were added.
    pub fn list(&self) -> Vec<Arc<VolumeState>> {
        self.volumes.read().map(|v| v.clone()).unwrap_or_default()
    }

    pub fn metrics(&self) -> &ProbeMetrics {
        &self.metrics
    }

    /// The volume already probing the filesystem `dev` (st_dev), if any.
    pub fn on_device(&self, dev: u64) -> Option<Arc<VolumeState>> {
        self.list().into_iter().find(|v| {
            std::fs::metadata(&v.path)
                .map(|m| m.dev() == dev)
                .unwrap_or(false)
        })
    }

    /// Adds a volume and starts its probe thread.
    pub fn add(&self, cfg: VolumeConfig) -> anyhow::Result<Arc<VolumeState>> {
        if self.stop.is_stopped() {
            anyhow::bail!("shutting down");
        }
        if self.list().iter().any(|v| v.name == cfg.name) {
            anyhow::bail!("a volume named {:?} exists already", cfg.name);
        }
        let fs = fsinfo::lookup(&cfg.path, &self.roots);
        let state = Arc::new(VolumeState::new(&cfg, self.window, fs.clone()));
        self.metrics.init_volume(&state);
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
        let tx = self
            .done_tx
            .lock()
            .ok()
            .and_then(|t| t.clone())
            .context("shutting down")?;
        if let Ok(mut v) = self.volumes.write() {
            v.push(state.clone());
        }
        if let Ok(mut r) = self.running.lock() {
            r.insert(cfg.name.clone());
        }
        let name = cfg.name.clone();
        runner::spawn(
            cfg,
            state.clone(),
            self.metrics.clone(),
            self.stop.clone(),
            tx,
        )
        .with_context(|| format!("starting the probe thread of volume {name:?}"))?;
        Ok(state)
    }

    /// Counts probes stuck past their timeout (the watchdog's tick).
    pub fn check_timeouts(&self, now: Instant) {
        runner::check_timeouts(&self.list(), &self.metrics, now);
    }

    /// Stops every probe thread, waits at most `timeout` for them, then
    /// removes every volume's probe files whether or not its thread
    /// finished. A thread stuck in a sync cannot be interrupted; it is
    /// abandoned (the process exits around it) and said so in the log.
    pub fn shutdown(&self, timeout: Duration) {
        self.stop.stop();
        if let Ok(mut t) = self.done_tx.lock() {
            t.take();
        }
        let mut running = self.running.lock().map(|r| r.clone()).unwrap_or_default();
        let rx = self.done_rx.lock().ok().and_then(|mut r| r.take());
        let deadline = Instant::now() + timeout;
        if let Some(rx) = rx {
            while !running.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                match rx.recv_timeout(left) {
                    Ok(name) => {
                        running.remove(&name);
                    }
                    Err(_) => break,
                }
            }
        }
        let volumes = self.list();
        let now = Instant::now();
        for name in &running {
            let stuck = volumes
                .iter()
                .find(|v| &v.name == name)
                .and_then(|v| v.in_flight(now));
            match stuck {
                Some((op, age)) => tracing::warn!(
                    volume = %name,
                    op = %op,
                    in_flight = ?age,
                    "abandoning probe thread stuck in IO; its probe files are removed anyway"
                ),
                None => {
                    tracing::warn!(volume = %name, "abandoning probe thread that did not stop in time")
                }
            }
        }
        for v in &volumes {
            if let Some(dir) = v.probe_dir() {
                let problems = dir.remove_all();
                if problems.is_empty() {
                    tracing::info!(volume = %v.name, probe_dir = %dir.path().display(), "removed probe files");
                }
                for p in problems {
                    tracing::error!(volume = %v.name, problem = %p, "could not remove probe file");
                }
            }
        }
    }
}
