//! The probe thread of one volume: set up the probe files and engine, then
//! probe on a fixed schedule until told to stop.
//!
//! Why an OS thread and not a task: a write or sync can block in the kernel
//! for as long as the device takes (seconds under a cap, forever on a dead
//! network volume). On its own thread that blocks only this volume; the
//! async runtime, the HTTP server and the other volumes carry on, and the
//! age of the stuck operation is exported as `pgstorage_probe_in_flight_seconds`.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::events::{Incidents, Report};
use crate::model::pacing::{
    BurstRead, CommitBurst, ReadBurst, steady_throttle, warmed_tail, whole_cycles,
};
use crate::probe::engine::{CommitTiming, Engine};
use crate::probe::files::{FileId, NameCheck, ProbeDir, READ_FILE, SetupError, WAL_FILE, raw};
use crate::probe::settings::{
    BLOCK_SIZE, BURST_COMMITS, BURST_READS, COMMIT_BURST, RATE_BURSTS, VolumeSpec, WAL_FILE_SIZE,
    after_idle_pause,
};
use crate::probe::state::VolumeState;
use crate::probe::{Cause, IoFailure, Rng};
use crate::types::{Op, Phase};

/// A stop signal probe threads can sleep on.
#[derive(Debug, Default)]
pub(crate) struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
    fast: AtomicBool,
}

impl Stop {
    pub(crate) fn new() -> Arc<Stop> {
        Arc::new(Stop::default())
    }

    pub(crate) fn stop(&self) {
        self.fast.store(true, Ordering::SeqCst);
        if let Ok(mut s) = self.stopped.lock() {
            *s = true;
        }
        self.cv.notify_all();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.fast.load(Ordering::SeqCst)
    }

    /// Sleeps until `deadline` or until stopped; true when stopped.
    pub(crate) fn wait_until(&self, deadline: Instant) -> bool {
        let Ok(mut guard) = self.stopped.lock() else {
            return true;
        };
        loop {
            if *guard {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            match self.cv.wait_timeout(guard, deadline - now) {
                Ok((g, _)) => guard = g,
                Err(_) => return true,
            }
        }
    }
}

/// Starts the probe thread of a volume. The thread is named
/// `probe-<volume>` (truncated by the kernel to 15 bytes) so it can be found
/// in `top -H` and stack dumps.
pub(crate) fn spawn(
    cfg: VolumeSpec,
    state: Arc<VolumeState>,
    stop: Arc<Stop>,
) -> std::io::Result<JoinHandle<()>> {
    let name = format!("probe-{}", cfg.name);
    std::thread::Builder::new().name(name).spawn(move || {
        Runner {
            cfg,
            state,
            stop,
            rng: Rng::seeded(),
            incidents: Incidents::default(),
        }
        .run();
    })
}

/// When the next round starts: at `due` (one interval after the last), or
/// now when the round overran, and never before a burst's pause is over
/// (`after_burst`).
fn next_round(due: Instant, after_burst: Option<Instant>) -> Instant {
    let mut next = due;
    let now = Instant::now();
    if next < now {
        // Overran (slow device): start the next round now rather than
        // bursting to catch up, which would add load exactly when the
        // device is slow.
        next = now;
    }
    if let Some(at) = after_burst {
        next = next.max(at);
    }
    next
}

struct Runner {
    cfg: VolumeSpec,
    state: Arc<VolumeState>,
    stop: Arc<Stop>,
    rng: Rng,
    /// Failing probes, for one log line per incident (not per probe).
    incidents: Incidents<&'static str, Cause>,
}

struct Prepared {
    engine: Engine,
    dir: Arc<ProbeDir>,
    wal: Option<File>,
    read: Option<File>,
    /// What the held files are, taken once: the periodic name check then
    /// stats only the names.
    wal_id: Option<FileId>,
    read_id: Option<FileId>,
}

const SETUP_BACKOFF_START: Duration = Duration::from_secs(5);
const SETUP_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How often the held probe files are compared with their names. One stat
/// per file, no data IO; a few seconds bounds how long a replaced or
/// deleted file goes unnoticed without adding metadata traffic (a GETATTR
/// on NFS) to every probe.
const NAME_CHECK_EVERY: Duration = Duration::from_secs(5);
/// How often the directory's path is looked up even though every name
/// matched: only a directory moved away whole goes unnoticed in between,
/// and the files in it keep measuring the same filesystem.
const PATH_CHECK_EVERY: Duration = Duration::from_secs(60);

/// What the periodic name check found.
enum Files {
    /// Every held file is still listed under its name.
    Intact,
    /// The probe directory is no longer at its path (removed or moved).
    DirGone,
    /// A probe file's name was removed or now refers to something else:
    /// (op of the probe using the file, file name, what happened).
    Changed(Vec<(Op, &'static str, NameCheck)>),
}

impl Runner {
    fn run(mut self) {
        let Some(mut p) = self.setup_with_retry() else {
            return;
        };
        let mut next_check = Instant::now() + NAME_CHECK_EVERY;
        let mut next_path_check = Instant::now() + PATH_CHECK_EVERY;
        // Once the directory is gone, checking names in it is pointless.
        let mut dir_gone = false;
        self.log_probing(&p);
        let read_blocks = self.cfg.probe.read_file_size / BLOCK_SIZE as u64;
        let (mut next_sweep, sweep_every) = self.sweep_schedule(&p);
        let mut wal_block = 0u64;
        let mut next = Instant::now();
        // The first burst a few rounds in, once the lone probes have
        // started; then every busy_every.
        let mut next_burst =
            (!self.cfg.probe.busy_every.is_zero()).then(|| next + 3 * self.cfg.probe.interval);
        let mut after_burst: Option<Instant> = None;
        loop {
            if self.stop.is_stopped() {
                break;
            }
            // Stretched when the exporter's own writes would take too large
            // a share of a write-IOPS cap that counts them.
            let slowdown = self.state.slowdown();
            let interval = self.cfg.probe.interval.mul_f64(slowdown);
            if self.lone_probes(&mut p, &mut wal_block, next + interval / 2, read_blocks) {
                break;
            }
            // The burst: three quarters into the round, so the next lone
            // commit still comes after a pause of a quarter interval (the
            // after-idle cost grows with the pause and levels off within
            // about 50 ms on the build machine).
            if let Some(at) = next_burst
                && Instant::now() >= at
            {
                if self
                    .stop
                    .wait_until(next + interval - after_idle_pause(interval))
                {
                    break;
                }
                self.burst(&mut p, &mut wal_block, read_blocks);
                // A burst that met a throttle runs a second or more, past
                // the round's end: the next lone commit still waits its
                // pause, or it would be a burst's next commit.
                after_burst = Some(Instant::now() + after_idle_pause(interval));
                // A burst that ran longer than BURST_COMMITS (it met a
                // throttle) puts the next one off in proportion.
                next_burst = Some(Instant::now() + self.busy_every(slowdown));
            }
            if let (Some(at), Some(read)) = (next_sweep, &p.read)
                && Instant::now() >= at
            {
                self.sweep(&p.dir, read);
                next_sweep = Some(Instant::now() + sweep_every);
                next = Instant::now();
            }
            if !dir_gone && Instant::now() >= next_check {
                let now = Instant::now();
                next_check = now + NAME_CHECK_EVERY;
                let path_too = now >= next_path_check;
                if path_too {
                    next_path_check = now + PATH_CHECK_EVERY;
                }
                match self.check_files(&p, path_too) {
                    Files::Intact => {}
                    Files::DirGone => {
                        dir_gone = true;
                        self.dir_gone(&p);
                    }
                    Files::Changed(changed) => {
                        self.files_changed(&changed);
                        // Closes the old descriptors: a deleted file's space
                        // is freed now, not at exit.
                        drop(p);
                        p = match self.setup_with_retry() {
                            Some(p) => p,
                            None => break,
                        };
                        tracing::info!(volume = %self.cfg.name, "probe files set up again; probing");
                        wal_block = 0;
                        next = Instant::now();
                        next_check = Instant::now() + NAME_CHECK_EVERY;
                        continue;
                    }
                }
            }
            self.rebuild_poisoned_engine(&mut p);
            next = next_round(next + interval, after_burst.take());
            if self.stop.wait_until(next) {
                break;
            }
        }
        tracing::debug!(volume = %self.cfg.name, "probe thread stopped");
    }

    /// How long from this burst to the next: busy_every, stretched by the
    /// slowdown in force and by how much longer than BURST_COMMITS the
    /// latest burst ran.
    fn busy_every(&self, slowdown: f64) -> Duration {
        self.cfg
            .probe
            .busy_every
            .mul_f64(slowdown * self.state.burst_stretch())
    }

    fn log_probing(&self, p: &Prepared) {
        tracing::info!(
            volume = %self.cfg.name,
            probe_dir = %self.cfg.probe_dir.display(),
            engine = %p.engine.kind(),
            sync_method = %self.cfg.probe.sync_method,
            commit = p.wal.is_some(),
            read = p.read.is_some(),
            interval = ?self.cfg.probe.interval,
            busy_every = ?self.cfg.probe.busy_every,
            "probing"
        );
    }

    /// When the first queue-depth sweep runs (`None`: never), and how long
    /// from one sweep to the next.
    fn sweep_schedule(&self, p: &Prepared) -> (Option<Instant>, Duration) {
        // The first sweep right after start, then every sweep_every. It needs
        // io_uring for depths above 1 and the read probe file.
        let next_sweep = if self.cfg.probe.sweep_every.is_zero() {
            None
        } else if p.read.is_none() || p.engine.kind() != crate::types::EngineKind::IoUring {
            tracing::warn!(volume = %self.cfg.name, "queue-depth sweep needs io_uring and the read probe; not sweeping");
            None
        } else {
            Some(Instant::now())
        };
        // The write half of a sweep takes a write cap in full while it runs;
        // over time it may take no more of it than the probes may.
        let sweep_every = crate::model::pacing::sweep_period(
            self.cfg.probe.sweep_every,
            self.cfg.probe.sweep_duration,
            crate::probe::sweep::write_fraction(&crate::probe::sweep::WORKLOADS),
        );
        if next_sweep.is_some() && sweep_every > self.cfg.probe.sweep_every {
            tracing::info!(
                volume = %self.cfg.name,
                sweep_every = ?sweep_every,
                "queue-depth sweep: sweep_every stretched so that the sweep's writes stay within 2 % of a write cap's time"
            );
        }
        (next_sweep, sweep_every)
    }

    /// The lone probes: what a commit and a read cost after a pause, the
    /// read at `read_at` when there is a commit probe. True when stopped.
    fn lone_probes(
        &mut self,
        p: &mut Prepared,
        wal_block: &mut u64,
        read_at: Instant,
        read_blocks: u64,
    ) -> bool {
        if let Some(wal) = &p.wal {
            self.commit_probe(&mut p.engine, wal, wal_block, Some(Phase::AfterIdle));
        }
        if let Some(read) = &p.read {
            // Half an interval after the commit probe, so the read never
            // queues behind the probe's own sync.
            if p.wal.is_some() && self.stop.wait_until(read_at) {
                return true;
            }
            let offset = self.rng.below(read_blocks) * BLOCK_SIZE as u64;
            self.read_probe(&mut p.engine, read, offset, Some(Phase::AfterIdle));
        }
        false
    }

    /// Counts and logs the probe directory gone from its path.
    fn dir_gone(&self, p: &Prepared) {
        for op in Self::held_ops(p) {
            self.state.counts.error(op.as_str(), "removed");
        }
        // The open descriptors still reach the same filesystem, so the
        // figures stay true. Creating the directory again would mean a new
        // lookup of its path, which could now lead to another filesystem
        // (the volume unmounted under it) or undo an operator's cleanup.
        tracing::warn!(
            volume = %self.cfg.name,
            probe_dir = %self.cfg.probe_dir.display(),
            "probe directory was removed or moved: probing goes on with the open \
             probe files, whose space is freed at exit; it is not created again \
             until the exporter restarts"
        );
    }

    /// Counts and logs probe files removed or replaced under their names.
    fn files_changed(&self, changed: &[(Op, &'static str, NameCheck)]) {
        let mut what = Vec::new();
        for (op, name, c) in changed {
            self.state.counts.error(op.as_str(), c.label());
            what.push(format!("{name} {}", c.label()));
        }
        tracing::warn!(
            volume = %self.cfg.name,
            probe_dir = %self.cfg.probe_dir.display(),
            files = %what.join(", "),
            "probe file removed or replaced under its name: closing the probe \
             files and setting them up again (a symlink at a probe file's name \
             is refused until it is removed)"
        );
    }

    fn rebuild_poisoned_engine(&self, p: &mut Prepared) {
        if p.engine.is_poisoned() {
            match Engine::new(self.cfg.probe.engine) {
                Ok((e, _)) => p.engine = e,
                Err(e) => {
                    tracing::error!(volume = %self.cfg.name, error = %e, "cannot rebuild IO engine")
                }
            }
        }
    }

    fn held_ops(p: &Prepared) -> Vec<Op> {
        let mut ops = Vec::new();
        if p.wal.is_some() {
            ops.push(Op::Commit);
        }
        if p.read.is_some() {
            ops.push(Op::Read);
        }
        ops
    }

    /// Compares the held probe files with what their names refer to now,
    /// and, when a name changed or `path_too`, whether the directory is
    /// still at its path. The names come first because they cost one stat
    /// each against the held directory; the path is a lookup of every
    /// component. A deleted directory shows in the names (gone with it);
    /// only a directory moved whole with its files needs the path, and that
    /// changes no figure, so it is looked at less often. A failing stat
    /// (the filesystem itself failing) proves nothing about the names: the
    /// probes' own errors report that.
    fn check_files(&self, p: &Prepared, path_too: bool) -> Files {
        let held = [
            (Op::Commit, WAL_FILE, p.wal_id),
            (Op::Read, READ_FILE, p.read_id),
        ];
        let mut changed = Vec::new();
        for (op, name, id) in held {
            let Some(id) = id else { continue };
            match p.dir.check_name(name, id) {
                Ok(NameCheck::Same) => {}
                Ok(c) => changed.push((op, name, c)),
                Err(e) => {
                    tracing::debug!(volume = %self.cfg.name, file = name, error = %e, "cannot check probe file");
                }
            }
        }
        if path_too || !changed.is_empty() {
            match p.dir.at_path() {
                Ok(false) => return Files::DirGone,
                Ok(true) => {}
                Err(e) => {
                    tracing::debug!(volume = %self.cfg.name, error = %e, "cannot check the probe directory");
                }
            }
        }
        if changed.is_empty() {
            Files::Intact
        } else {
            Files::Changed(changed)
        }
    }

    fn setup_with_retry(&mut self) -> Option<Prepared> {
        let mut backoff = SETUP_BACKOFF_START;
        loop {
            match self.setup() {
                Ok(p) => {
                    // A read probe given up at setup stays said.
                    if !(self.cfg.probe.read_probe && p.read.is_none()) {
                        self.state.counts.setup_done();
                    }
                    return Some(p);
                }
                Err(SetupError::Stopped) => return None,
                Err(e) => {
                    self.state.counts.setup_error(e.label(), e.to_string());
                    tracing::error!(
                        volume = %self.cfg.name,
                        error = %e,
                        retry_in = ?backoff,
                        "cannot set up probe files"
                    );
                    if self.stop.wait_until(Instant::now() + backoff) {
                        return None;
                    }
                    backoff = (backoff * 2).min(SETUP_BACKOFF_MAX);
                }
            }
        }
    }

    fn setup(&mut self) -> Result<Prepared, SetupError> {
        let (engine, fallback) = Engine::new(self.cfg.probe.engine)?;
        if let Some(reason) = fallback {
            tracing::info!(volume = %self.cfg.name, reason = %reason, "io_uring unavailable, using the sync (syscall) engine");
        }
        self.state.set_engine(engine.kind());
        // A retry reuses the directory (and its lock) of the failed attempt,
        // through its descriptor: files are made again on the filesystem the
        // directory was opened on. What an earlier attempt or the previous
        // setup left at the file names is removed first (a symlink refused).
        let dir = match self.state.probe_dir() {
            Some(d) => {
                for name in d.clear()? {
                    tracing::debug!(volume = %self.cfg.name, file = name, "removed the previous probe file");
                }
                d
            }
            None => {
                let d = Arc::new(ProbeDir::open_locked(&self.cfg.probe_dir)?);
                // Registered before any file exists, so shutdown can remove
                // files even while this thread is still writing them, and
                // before stale files are looked at, so shutdown also cleans
                // up while setup refuses what it found.
                self.state.set_probe_dir(d.clone());
                d.remove_stale()?;
                d
            }
        };
        let reserve = self.cfg.probe.free_space_reserve;
        let wal = if self.cfg.probe.commit_probe {
            Some(dir.create_wal_file(WAL_FILE_SIZE, self.cfg.probe.sync_method, reserve)?)
        } else {
            None
        };
        let read = if self.cfg.probe.read_probe {
            match dir.create_read_file(self.cfg.probe.read_file_size, reserve) {
                Ok(f) => Some(f),
                Err(e @ SetupError::DirectIoUnsupported { .. }) if wal.is_some() => {
                    // Permanent for this filesystem (tmpfs before 6.6, some
                    // FUSE): keep the commit probe, say so once.
                    self.state
                        .counts
                        .setup_error(e.label(), format!("read probe disabled: {e}"));
                    tracing::error!(volume = %self.cfg.name, error = %e, "read probe disabled");
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let id = |f: &Option<File>, name: &str| -> Result<Option<FileId>, SetupError> {
            f.as_ref()
                .map(|f| {
                    FileId::of_fd(f).map_err(|source| SetupError::Io {
                        what: "stat of",
                        path: dir.path().join(name),
                        source,
                    })
                })
                .transpose()
        };
        let (wal_id, read_id) = (id(&wal, WAL_FILE)?, id(&read, READ_FILE)?);
        Ok(Prepared {
            engine,
            dir,
            wal,
            read,
            wal_id,
            read_id,
        })
    }

    /// A burst of back-to-back probes: commits as [`COMMIT_BURST`] says,
    /// then reads as [`BURST_READS`] says. The commits' busy figure is
    /// chosen when the burst is over (`model::pacing::whole_cycles`): whole
    /// throttle cycles where the burst met a throttle, else its last 12 commits; the
    /// rest warmed the device path up and is only counted. The first reads
    /// warm up likewise. A failed probe ends the burst: a failing device is
    /// not hammered. Sets the volume's burst stretch: how many times
    /// [`BURST_COMMITS`] the burst's commits were.
    fn burst(&mut self, p: &mut Prepared, wal_block: &mut u64, read_blocks: u64) {
        if let Some(wal) = &p.wal {
            let start = Instant::now();
            let mut plan = CommitBurst::new(COMMIT_BURST);
            let mut done: Vec<(Instant, CommitTiming)> =
                Vec::with_capacity(COMMIT_BURST.most as usize);
            let mut failed = false;
            while plan.more(start.elapsed()) {
                if self.stop.is_stopped() {
                    failed = true;
                    break;
                }
                match self.commit_once(&mut p.engine, wal, wal_block) {
                    Some(t) => {
                        plan.done(t.commit.as_secs_f64(), start.elapsed());
                        done.push((Instant::now(), t));
                    }
                    None => {
                        failed = true;
                        break;
                    }
                }
            }
            self.state
                .set_burst_stretch(f64::from(plan.count()) / f64::from(BURST_COMMITS));
            if failed {
                return;
            }
            let lat: Vec<f64> = done.iter().map(|(_, t)| t.commit.as_secs_f64()).collect();
            let cycles = whole_cycles(&lat);
            let throttled = cycles.clone().and_then(|r| {
                let n = r.len() as f64;
                crate::model::ceiling::commit_ceiling(lat[r].iter().sum::<f64>() / n)
            });
            self.state.set_throttled_commit_rate(throttled);
            let steady = cycles.unwrap_or_else(|| warmed_tail(lat.len(), COMMIT_BURST.least));
            tracing::debug!(
                volume = %self.cfg.name,
                commits = lat.len(),
                recorded = ?steady,
                took = ?start.elapsed(),
                latencies_us = ?lat.iter().map(|s| (s * 1e6).round() as u64).collect::<Vec<_>>(),
                "commit burst"
            );
            for (at, t) in &done[steady.clone()] {
                self.record_commit(Phase::Busy, *at, t);
            }
            if let Some((at, _)) = done[steady].last() {
                let counts_for = if steady_throttle(&lat) {
                    RATE_BURSTS
                } else {
                    1
                };
                self.state.burst_recorded(false, *at, counts_for);
            }
        }
        if let Some(read) = &p.read {
            let start = Instant::now();
            let mut reads = ReadBurst::new(BURST_READS);
            let mut recorded = false;
            loop {
                let phase = match reads.next(start.elapsed()) {
                    BurstRead::Done => {
                        if recorded {
                            self.state.burst_recorded(true, Instant::now(), 1);
                        }
                        return;
                    }
                    BurstRead::WarmUp => None,
                    BurstRead::Record => Some(Phase::Busy),
                };
                let offset = self.rng.below(read_blocks) * BLOCK_SIZE as u64;
                if self.stop.is_stopped() || !self.read_probe(&mut p.engine, read, offset, phase) {
                    return;
                }
                recorded |= phase.is_some();
            }
        }
    }

    /// One commit probe into the next block of the WAL probe file; recorded
    /// under `phase`, or only counted when `None`. True when it succeeded.
    fn commit_probe(
        &mut self,
        engine: &mut Engine,
        wal: &File,
        wal_block: &mut u64,
        phase: Option<Phase>,
    ) -> bool {
        match self.commit_once(engine, wal, wal_block) {
            Some(t) => {
                if let Some(phase) = phase {
                    self.record_commit(phase, Instant::now(), &t);
                }
                true
            }
            None => false,
        }
    }

    /// One commit probe into the next block of the WAL probe file, counted
    /// but not recorded; its times when it succeeded.
    fn commit_once(
        &mut self,
        engine: &mut Engine,
        wal: &File,
        wal_block: &mut u64,
    ) -> Option<CommitTiming> {
        let offset = *wal_block * BLOCK_SIZE as u64;
        // Cycle through the file like PostgreSQL through a recycled
        // segment: overwrite preallocated blocks, never extend.
        *wal_block = (*wal_block + 1) % (WAL_FILE_SIZE / BLOCK_SIZE as u64);
        self.state.begin(Op::Commit);
        let r = engine.commit(raw(wal), offset, self.cfg.probe.sync_method);
        self.state.end();
        match r {
            Ok(t) => {
                self.state.count_commit_probe();
                self.succeeded(Op::Commit);
                Some(t)
            }
            Err(f) => {
                self.failed(f);
                None
            }
        }
    }

    /// Records a commit probe's write, sync and commit times under `phase`.
    fn record_commit(&self, phase: Phase, at: Instant, t: &CommitTiming) {
        let mut samples = [(Op::Write, t.write.as_secs_f64()); 3];
        let mut n = 1;
        if let Some(s) = t.sync {
            samples[n] = (Op::Sync, s.as_secs_f64());
            n += 1;
        }
        samples[n] = (Op::Commit, t.commit.as_secs_f64());
        n += 1;
        self.state.record_all(phase, at, &samples[..n]);
    }

    /// One read probe at `offset`; recorded under `phase`, or not at all
    /// when `None` (a burst's warm-up). True when it succeeded.
    fn read_probe(
        &mut self,
        engine: &mut Engine,
        read: &File,
        offset: u64,
        phase: Option<Phase>,
    ) -> bool {
        self.state.begin(Op::Read);
        let r = engine.read(raw(read), offset);
        self.state.end();
        let at = Instant::now();
        match r {
            Ok(d) => {
                if let Some(phase) = phase {
                    let s = d.as_secs_f64();
                    self.state.record(Op::Read, phase, at, s);
                    if d < self.cfg.probe.cache_served_threshold {
                        self.state.counts.cache_served();
                    }
                }
                self.succeeded(Op::Read);
                true
            }
            Err(f) => {
                self.failed(f);
                false
            }
        }
    }

    fn sweep(&mut self, dir: &ProbeDir, read: &File) {
        let stop = self.stop.clone();
        let t0 = Instant::now();
        let result = crate::probe::sweep::run_in(
            dir,
            read,
            self.cfg.probe.read_file_size,
            self.cfg.probe.free_space_reserve,
            self.cfg.probe.sweep_duration,
            &|| stop.is_stopped(),
            |e| {
                self.state.counts.error("sweep", "sweep_failed");
                tracing::warn!(volume = %self.cfg.name, error = %e, "queue-depth sweep: no sweep file, sweeping reads only");
            },
        );
        match result {
            Ok(tables) => {
                tracing::info!(
                    volume = %self.cfg.name,
                    took = ?t0.elapsed(),
                    rates = ?tables
                        .iter()
                        .map(|t| (t.resource.as_str(), t.points.iter().map(|p| (p.depth, t.workload().rate(p).round())).collect::<Vec<_>>()))
                        .collect::<Vec<_>>(),
                    detected = ?tables
                        .iter()
                        .filter_map(|t| t.detected.map(|d| (t.resource.as_str(), d.round())))
                        .collect::<Vec<_>>(),
                    "queue-depth sweep"
                );
                let finished_unix = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                self.state.set_sweep(crate::probe::state::SweepResult {
                    tables,
                    finished_unix,
                });
            }
            Err(e) => {
                self.state.counts.error("sweep", "sweep_failed");
                tracing::warn!(volume = %self.cfg.name, error = %e, "queue-depth sweep failed");
            }
        }
    }

    /// The incident key of an op: a commit's write and sync failures are
    /// one incident with the commit's.
    fn incident(op: Op) -> &'static str {
        match op {
            Op::Read => "read",
            Op::Write | Op::Sync | Op::Commit => "commit",
        }
    }

    /// Ends a run of failures with one line, so the log shows when a fault
    /// cleared and not only when it began.
    fn succeeded(&mut self, op: Op) {
        // The common case, nothing failing: no clock read, no lookup.
        if self.incidents.failing().next().is_none() {
            return;
        }
        if let Some((failures, lasted)) =
            self.incidents.succeeded(Self::incident(op), Instant::now())
        {
            tracing::info!(volume = %self.cfg.name, probe = %op, failures, lasted = ?lasted, "probe succeeds again");
        }
    }

    fn failed(&mut self, f: IoFailure) {
        self.state.counts.error(f.op.as_str(), f.cause.label());
        match self
            .incidents
            .failed(Self::incident(f.op), f.cause, Instant::now())
        {
            Report::New => {
                tracing::warn!(volume = %self.cfg.name, error = %f, "probe failed (repeats are counted in pgstorage_probe_errors_total and logged again every 5 minutes while they last)")
            }
            Report::Again { failures } => {
                tracing::warn!(volume = %self.cfg.name, error = %f, failures, "probe still failing")
            }
            Report::Quiet => {}
        }
    }
}

/// Counts probes in flight longer than their timeout, once each, and
/// returns when to look again: the earliest moment a probe could next pass
/// its timeout (`None` without volumes). Called by the daemon's watchdog;
/// the stuck call itself cannot be interrupted, so this is how a hang
/// becomes visible as an error.
pub(crate) fn check_timeouts(volumes: &[Arc<VolumeState>], now: Instant) -> Option<Instant> {
    let next = volumes.iter().map(|v| v.timeout_due(now)).min();
    for v in volumes {
        if let Some(op) = v.take_timeout(now) {
            v.counts.error(op.as_str(), "timeout");
            tracing::warn!(
                volume = %v.name,
                op = %op,
                timeout = ?v.timeout,
                "probe still in flight after its timeout: the device or filesystem is stalled"
            );
        }
    }
    next
}
