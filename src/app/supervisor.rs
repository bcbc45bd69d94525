//! What the configuration starts, and what a reload (SIGHUP) changes: the
//! `Supervisor` owns the probe threads (through the [`VolumeSet`]), one
//! PostgreSQL collector task per cluster and the IO limits task, and on
//! reload loads the configuration file and `--web.config.file` again and
//! applies the difference. A file that does not load or validate changes
//! nothing.

use anyhow::Context;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{ClusterConfig, Config, FlagOverrides};
use crate::exposition::config::ConfigMetrics;
use crate::http::auth::AuthSlot;
use crate::http::web_config::WebSecurity;
use crate::limits::LimitsState;
use crate::postgres::{ClusterSet, ClusterState};
use crate::probe::set::VolumeSet;
use crate::probe::settings::{SpecChange, VolumeLimits, VolumeSpec};
use crate::types::Resource;

/// Where the configuration came from, to load it again on SIGHUP: the same
/// file and the same flags.
#[derive(Debug, Clone)]
pub(crate) struct ReloadSource {
    pub(crate) file: Option<PathBuf>,
    pub(crate) flags: FlagOverrides,
}

/// What a reload of `--web.config.file` swaps: the TLS settings new
/// handshakes use and the users basic auth checks.
#[derive(Debug)]
pub(crate) struct WebHandles {
    pub(crate) file: Option<PathBuf>,
    pub(crate) tls: Option<watch::Sender<Arc<rustls::ServerConfig>>>,
    pub(crate) auth: AuthSlot,
    pub(crate) extras: crate::http::extras::ExtrasSlot,
}

pub(crate) fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// The most a reload waits for one piece of blocking work: reading and
/// checking both files, or starting or stopping one volume. Each takes
/// milliseconds; only a file or volume on a disk or network filesystem
/// that stopped answering takes longer, and a read stuck there cannot be
/// interrupted (the thread waits in the kernel). So the reload stops
/// waiting for it: the stuck thread is left to finish on its own and its
/// result is dropped, and the next SIGHUP starts afresh instead of queueing
/// behind it.
pub(crate) const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Blocking work of a reload, on the blocking pool, waited for at most
/// `limit`. `Err` says what happened: it panicked, or it is still running
/// (and left to run).
async fn blocking_within<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BlockingFailure> {
    match tokio::time::timeout(limit, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(BlockingFailure::Failed(e.to_string())),
        Err(_) => Err(BlockingFailure::TimedOut(limit)),
    }
}

#[derive(Debug)]
enum BlockingFailure {
    Failed(String),
    TimedOut(Duration),
}

impl std::fmt::Display for BlockingFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlockingFailure::Failed(e) => f.write_str(e),
            BlockingFailure::TimedOut(d) => write!(
                f,
                "did not finish within {}s (a disk or network filesystem that does not \
                 answer?); left to finish in the background",
                d.as_secs()
            ),
        }
    }
}

/// Owns what the configuration started (probe threads through the
/// [`VolumeSet`], one collector task per cluster, the limits task) and
/// changes it on reload.
#[derive(Debug)]
pub(crate) struct Supervisor {
    cfg: Config,
    volumes: Arc<VolumeSet>,
    clusters: Arc<ClusterSet>,
    limits_state: Arc<LimitsState>,
    cluster_tasks: HashMap<String, ClusterTask>,
    limits_task: Option<JoinHandle<()>>,
    audit_state: Arc<crate::audit::AuditState>,
    audit_task: Option<JoinHandle<()>>,
    shutdown_timeout: Arc<AtomicU64>,
}

#[derive(Debug)]
struct ClusterTask {
    state: Arc<ClusterState>,
    handle: JoinHandle<()>,
    /// Applies the collector's discovery requests.
    discovery: JoinHandle<()>,
}

/// What a reload keeps of a restarted cluster's discovered volumes: the
/// (volume, role) pairs it had, and the volumes its discovery added, which
/// its next discovery keeps or stops.
#[derive(Debug, Default)]
struct Carried {
    roles: Vec<(String, String)>,
    volumes: Vec<String>,
}

/// What a reload changed, for its log line.
#[derive(Debug, Default)]
struct Changes {
    added: Vec<String>,
    removed: Vec<String>,
    changed: Vec<String>,
    /// Volumes whose provisioned limits or cgroup alone changed: updated in
    /// place, not restarted (never set for clusters).
    limits_only: Vec<String>,
}

impl Changes {
    fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && self.limits_only.is_empty()
    }
}

/// Names in `old` and `new` sorted into added, removed and changed.
fn diff<T>(
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &str,
    same: impl Fn(&T, &T) -> bool,
) -> Changes {
    let mut c = Changes::default();
    for o in old {
        match new.iter().find(|n| name(n) == name(o)) {
            None => c.removed.push(name(o).to_string()),
            Some(n) if !same(o, n) => c.changed.push(name(o).to_string()),
            Some(_) => {}
        }
    }
    for n in new {
        if !old.iter().any(|o| name(o) == name(n)) {
            c.added.push(name(n).to_string());
        }
    }
    c
}

/// Volumes sorted like [`diff`], then the changed ones whose probe runs as
/// before (only provisioned limits or the cgroup differ) moved to
/// `limits_only`: restarting those would throw away a window of samples and
/// the counters for a change the probe thread never sees.
fn diff_volumes(old: &[VolumeSpec], new: &[VolumeSpec]) -> Changes {
    let mut c = diff(old, new, |v: &VolumeSpec| &v.name, |a, b| a == b);
    let find = |list: &[VolumeSpec], name: &str| list.iter().find(|v| v.name == name).cloned();
    let (limits_only, restart) =
        std::mem::take(&mut c.changed)
            .into_iter()
            .partition(|name| match (find(old, name), find(new, name)) {
                (Some(o), Some(n)) => o.change_to(&n) == SpecChange::LimitsOnly,
                _ => false,
            });
    c.changed = restart;
    c.limits_only = limits_only;
    c
}

/// What differs between two volumes' limits, in the configuration's own
/// keys, for the log line: `provisioned_iops 1000 -> 3000, cgroup none ->
/// /pg.slice`.
fn describe_limits(old: &VolumeLimits, new: &VolumeLimits) -> String {
    let key = |r: Resource| {
        format!(
            "provisioned_{}",
            r.as_str().replace("bytes_per_second", "throughput")
        )
    };
    let value = |l: &VolumeLimits, r: Resource| {
        l.provisioned
            .iter()
            .find(|(x, _)| *x == r)
            .map_or_else(|| "none".to_string(), |(_, v)| v.to_string())
    };
    let mut resources: Vec<Resource> = Vec::new();
    for (r, _) in old.provisioned.iter().chain(new.provisioned.iter()) {
        if !resources.contains(r) {
            resources.push(*r);
        }
    }
    let mut parts: Vec<String> = resources
        .into_iter()
        .filter(|r| value(old, *r) != value(new, *r))
        .map(|r| format!("{} {} -> {}", key(r), value(old, r), value(new, r)))
        .collect();
    if old.cgroup != new.cgroup {
        let c = |l: &VolumeLimits| l.cgroup.clone().unwrap_or_else(|| "none".to_string());
        parts.push(format!("cgroup {} -> {}", c(old), c(new)));
    }
    parts.join(", ")
}

/// Two cluster configurations connect and collect the same way. The
/// resolved targets are compared, not only the DSNs as written: a password
/// read from a password file or a passfile that changed must reconnect.
fn same_cluster(a: &ClusterConfig, b: &ClusterConfig) -> bool {
    let (ca, cb) = (&a.collector, &b.collector);
    ca.name == cb.name
        && ca.dsn == cb.dsn
        && ca.password_file == cb.password_file
        && ca.scrape_interval == cb.scrape_interval
        && ca.wait_sampling_interval == cb.wait_sampling_interval
        && ca.statement_timeout == cb.statement_timeout
        && ca.discover_volumes == cb.discover_volumes
        && a.target.config == b.target.config
        && a.target.ssl_mode == b.target.ssl_mode
        && a.target.ssl_root_cert == b.target.ssl_root_cert
}

/// Loads the configuration file and `--web.config.file` (if any) again, on
/// a blocking thread, waiting at most [`RELOAD_TIMEOUT`]. Refused, with the
/// `pgstorage_config_reload_errors_total` cause: a file that does not load
/// (`unreadable`, `syntax`, `invalid`), one that turns TLS on or off
/// (`invalid`: the listener speaks TLS or plain HTTP from the start to the
/// end of the process; switching needs a restart), and reading and checking
/// that took too long (`timeout`).
async fn load_files(
    source: &ReloadSource,
    web: &WebHandles,
) -> Result<(Config, Option<WebSecurity>), (&'static str, String)> {
    let source = source.clone();
    let web_file = web.file.clone();
    let loaded = blocking_within(RELOAD_TIMEOUT, move || {
        let cfg = crate::config::load(source.file.as_deref(), &source.flags)
            .map_err(|e| (e.cause(), e.to_string()))?;
        if let Some(problem) = crate::config::engine_problem(&cfg) {
            return Err(("invalid", problem));
        }
        let Some(file) = web_file else {
            return Ok((cfg, None));
        };
        match crate::http::web_config::load(&file) {
            Ok(sec) => Ok((cfg, Some(sec))),
            Err(e) => {
                let unreadable = e.chain().any(|c| c.is::<std::io::Error>());
                let cause = if unreadable { "unreadable" } else { "invalid" };
                Err((cause, format!("{e:#}")))
            }
        }
    })
    .await;
    let (cfg, sec) = match loaded {
        Ok(r) => r?,
        Err(e @ BlockingFailure::TimedOut(_)) => {
            return Err(("timeout", format!("reading and checking the files {e}")));
        }
        Err(e @ BlockingFailure::Failed(_)) => return Err(("invalid", e.to_string())),
    };
    if let Some(sec) = &sec
        && sec.tls.is_some() != web.tls.is_some()
    {
        let what = if web.tls.is_some() { "off" } else { "on" };
        return Err((
            "invalid",
            format!("the web configuration turns TLS {what}: that needs a restart"),
        ));
    }
    Ok((cfg, sec))
}

impl Supervisor {
    pub(crate) fn new(
        cfg: Config,
        volumes: Arc<VolumeSet>,
        clusters: Arc<ClusterSet>,
        limits_state: Arc<LimitsState>,
        audit_state: Arc<crate::audit::AuditState>,
        shutdown_timeout: Arc<AtomicU64>,
    ) -> Supervisor {
        Supervisor {
            cfg,
            volumes,
            clusters,
            limits_state,
            cluster_tasks: HashMap::new(),
            limits_task: None,
            audit_state,
            audit_task: None,
            shutdown_timeout,
        }
    }

    /// Starts what the configuration names: volumes, cluster collectors,
    /// the limits collector.
    pub(crate) async fn start(&mut self) -> anyhow::Result<()> {
        // Adding a volume creates its probe files and thread: blocking
        // work that can hang on a dead network volume, so not on an async
        // worker (as on reload).
        let (set, specs) = (self.volumes.clone(), self.cfg.volumes.clone());
        tokio::task::spawn_blocking(move || {
            for v in specs {
                set.add(v)?;
            }
            Ok::<(), anyhow::Error>(())
        })
        .await
        .context("adding the configured volumes")??;
        // Settings are logged by each collector after its first scrape.
        super::warnings::all(&self.cfg, &self.volumes, &self.clusters, &[]);
        for c in self.cfg.clusters.clone() {
            self.start_cluster(&c, Carried::default());
        }
        self.start_limits();
        self.start_audit();
        Ok(())
    }

    /// (Re)starts the audit task, whose first pass runs at once: after a
    /// SIGHUP the findings follow the new configuration and the host's
    /// current settings without waiting a whole `audit_interval`.
    fn start_audit(&mut self) {
        if let Some(t) = self.audit_task.take() {
            t.abort();
        }
        let inputs = super::audit::AuditInputs {
            settings: self.cfg.audit.clone(),
            proc_root: self.cfg.limits.proc_root.clone(),
            sys_root: self.cfg.limits.sys_root.clone(),
            volumes: self.volumes.clone(),
            clusters: self.clusters.clone(),
        };
        self.audit_task = Some(tokio::spawn(super::audit::run(
            inputs,
            self.audit_state.clone(),
        )));
    }

    /// Starts a cluster's collector; `carried` is what a reload kept of
    /// its discovered volumes (see [`Carried`]).
    fn start_cluster(&mut self, c: &ClusterConfig, carried: Carried) {
        let state = ClusterState::new(&c.collector.name, self.cfg.window);
        // Until its discovery runs again, the cluster keeps the volumes
        // and roles it had: its series go on naming them.
        state.set_volumes(carried.roles);
        self.clusters.add(state.clone());
        tracing::info!(
            cluster = %c.collector.name,
            target = %c.target.display,
            discover_volumes = c.collector.discover_volumes,
            "watching PostgreSQL"
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let handle = tokio::spawn(crate::postgres::run(
            c.collector.clone(),
            c.target.clone(),
            state.clone(),
            Some(tx),
        ));
        // Discovery requests are planned and applied here, on a blocking
        // thread: the collector never adds volumes itself.
        let volumes = self.volumes.clone();
        let defaults = self.cfg.volume_defaults.clone();
        let discovered_into = state.clone();
        let timeout = self.timeout();
        let mut carried = carried.volumes;
        let discovery = tokio::spawn(async move {
            while let Some(req) = rx.recv().await {
                let volumes = volumes.clone();
                let defaults = defaults.clone();
                // Only the first discovery decides about carried volumes.
                let carried = std::mem::take(&mut carried);
                let applied = tokio::task::spawn_blocking(move || {
                    super::discovery::apply(&req, &volumes, &defaults, &carried, timeout)
                })
                .await;
                match applied {
                    Ok(roles) => discovered_into.set_volumes(roles),
                    Err(e) => tracing::error!(error = %e, "volume discovery failed"),
                }
            }
        });
        self.cluster_tasks.insert(
            c.collector.name.clone(),
            ClusterTask {
                state,
                handle,
                discovery,
            },
        );
    }

    fn start_limits(&mut self) {
        if let Some(t) = self.limits_task.take() {
            t.abort();
        }
        if !self.cfg.collectors.on(crate::types::Collector::Limits) {
            return;
        }
        let inputs = Arc::new(super::limits_inputs::LimitsInputs {
            volumes: self.volumes.clone(),
            clusters: self.clusters.clone(),
        });
        let ebs = self
            .cfg
            .collectors
            .on(crate::types::Collector::LimitsEbs)
            .then(crate::limits::ebs::source);
        self.limits_task = Some(tokio::spawn(crate::limits::run(
            self.cfg.limits.clone(),
            inputs,
            self.limits_state.clone(),
            ebs,
        )));
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout.load(Ordering::Relaxed))
    }

    /// Stops a cluster's collector (dropping its connection) and forgets
    /// it. Returns the (volume, role) pairs of its volumes.
    fn stop_cluster(&mut self, name: &str) -> Vec<(String, String)> {
        let Some(task) = self.cluster_tasks.remove(name) else {
            return Vec::new();
        };
        task.handle.abort();
        task.discovery.abort();
        self.clusters.remove(name);
        task.state.snapshot().volumes
    }

    /// Loads the configuration again and applies the difference. A
    /// configuration that does not load or validate changes nothing.
    pub(crate) async fn reload(
        &mut self,
        source: &ReloadSource,
        web: &WebHandles,
        metrics: &ConfigMetrics,
    ) {
        // Both files load, or neither is applied.
        let (mut new, security) = match load_files(source, web).await {
            Ok(loaded) => loaded,
            Err((cause, e)) => {
                metrics.refused(cause);
                tracing::error!(error = %e, cause, "configuration reload refused; the running configuration is kept");
                return;
            }
        };
        if new.window != self.cfg.window {
            // Every window, summary and mean is sized by it: changing it
            // means starting over, which a restart says more honestly.
            tracing::warn!(
                window = ?self.cfg.window,
                requested = ?new.window,
                "window cannot change without a restart; keeping the running value"
            );
            new.window = self.cfg.window;
        }
        let plan = self.plan(&new);
        let applied = self.apply(new, &plan).await;
        if let Some(sec) = security {
            swap_web(web, sec);
        }
        metrics.reloaded();
        self.log_reloaded(&plan, &applied);
    }

    /// What a reload to `new` changes, decided before anything stops.
    fn plan(&self, new: &Config) -> ReloadPlan {
        let vols = diff_volumes(&self.cfg.volumes, &new.volumes);
        let defaults_changed = new.volume_defaults != self.cfg.volume_defaults;
        let mut clus = diff(
            &self.cfg.clusters,
            &new.clusters,
            |c: &ClusterConfig| &c.collector.name,
            same_cluster,
        );
        if defaults_changed {
            // Discovered volumes carry the defaults: rediscover them all.
            for c in &new.clusters {
                let n = &c.collector.name;
                if self.cluster_tasks.contains_key(n) && !clus.changed.contains(n) {
                    clus.changed.push(n.clone());
                }
            }
        }
        let configured: HashSet<String> = self
            .cfg
            .volumes
            .iter()
            .chain(new.volumes.iter())
            .map(|v| v.name.clone())
            .collect();
        // A changed cluster that still discovers volumes with the same
        // settings keeps them through its restart: a new password or
        // password file reconnects it, and its next discovery stops only
        // the volumes it no longer finds as they were. Restarting them
        // would throw away their windows and counters for a change that
        // has nothing to do with the storage.
        let carries = |name: &String| {
            clus.changed.contains(name)
                && !defaults_changed
                && [&self.cfg.clusters, &new.clusters].iter().all(|list| {
                    list.iter()
                        .any(|c| c.collector.name == *name && c.collector.discover_volumes)
                })
        };
        let carrying: HashSet<String> = clus
            .changed
            .iter()
            .filter(|n| carries(n))
            .cloned()
            .collect();
        ReloadPlan {
            vols,
            clus,
            configured,
            carrying,
        }
    }

    /// Applies `plan`: stops what goes or changes, clusters first (their
    /// discovered volumes go with them), then starts what is new or
    /// changed under `new`.
    async fn apply(&mut self, new: Config, plan: &ReloadPlan) -> Applied {
        self.shutdown_timeout
            .store(millis(new.shutdown_timeout), Ordering::Relaxed);
        let (orphans, mut carried) = self.stop_clusters(plan);
        let mut carried_volumes: Vec<String> =
            carried.values().flat_map(|c| c.volumes.clone()).collect();
        carried_volumes.sort();
        let mut to_remove: Vec<String> = orphans.clone();
        to_remove.extend(plan.vols.removed.iter().cloned());
        to_remove.extend(plan.vols.changed.iter().cloned());
        self.stop_volumes(to_remove).await;
        let old = std::mem::replace(&mut self.cfg, new);
        self.start_volumes(&plan.vols).await;
        for c in self.cfg.clusters.clone() {
            let n = &c.collector.name;
            if plan.clus.added.contains(n) || plan.clus.changed.contains(n) {
                let carried = carried.remove(n).unwrap_or_default();
                self.start_cluster(&c, carried);
            }
        }
        let limits_changed = old.limits != self.cfg.limits;
        if limits_changed {
            self.start_limits();
        } else if !plan.vols.is_empty() || !orphans.is_empty() {
            self.limits_state.pass_now();
        }
        self.start_audit();
        Applied {
            orphans,
            carried_volumes,
            limits_changed,
            shutdown_timeout_changed: old.shutdown_timeout != self.cfg.shutdown_timeout,
        }
    }

    /// Stops the removed and changed clusters. Returns the discovered
    /// volumes that go with them (no longer configured nor discovered by a
    /// running cluster), and what each carrying cluster keeps.
    fn stop_clusters(&mut self, plan: &ReloadPlan) -> (Vec<String>, HashMap<String, Carried>) {
        let mut stopped: Vec<(String, Vec<(String, String)>)> = Vec::new();
        for name in plan.clus.removed.iter().chain(plan.clus.changed.iter()) {
            let roles = self.stop_cluster(name);
            stopped.push((name.clone(), roles));
        }
        let still_used: HashSet<String> = self
            .cluster_tasks
            .values()
            .flat_map(|t| t.state.snapshot().volumes.into_iter().map(|(v, _)| v))
            .collect();
        let mut orphans = Vec::new();
        let mut carried: HashMap<String, Carried> = HashMap::new();
        for (name, roles) in stopped {
            let mut theirs: Vec<String> = roles
                .iter()
                .map(|(v, _)| v.clone())
                .filter(|v| !plan.configured.contains(v) && !still_used.contains(v))
                .collect();
            theirs.sort();
            theirs.dedup();
            if plan.carrying.contains(&name) {
                carried.insert(
                    name,
                    Carried {
                        roles,
                        volumes: theirs,
                    },
                );
            } else {
                orphans.extend(theirs);
            }
        }
        // A volume two stopped clusters shared goes only when neither
        // carries it.
        orphans.retain(|v| !carried.values().any(|c| c.volumes.contains(v)));
        orphans.sort();
        orphans.dedup();
        (orphans, carried)
    }

    /// Stops the named volumes, one after the other.
    async fn stop_volumes(&self, names: Vec<String>) {
        let timeout = self.timeout();
        for name in names {
            let set = self.volumes.clone();
            let n = name.clone();
            // Waits up to `timeout` for the probe thread, then removes the
            // files: bounded as a whole, as removing files can hang too.
            match blocking_within(timeout + RELOAD_TIMEOUT, move || set.remove(&n, timeout)).await {
                Ok(true) => tracing::info!(volume = %name, "volume stopped by the reload"),
                Ok(false) => {}
                Err(e) => tracing::error!(volume = %name, error = %e, "stopping the volume failed"),
            }
        }
    }

    /// Starts the added and changed volumes of the configuration in force,
    /// and updates in place those whose limits alone changed.
    async fn start_volumes(&self, vols: &Changes) {
        for v in self.cfg.volumes.clone() {
            if vols.added.contains(&v.name) || vols.changed.contains(&v.name) {
                self.start_volume(v).await;
            }
        }
        for v in &self.cfg.volumes {
            if !vols.limits_only.contains(&v.name) {
                continue;
            }
            let limits = v.limits();
            match self.volumes.set_limits(&v.name, limits.clone()) {
                Some(before) => tracing::info!(
                    volume = %v.name,
                    changed = %describe_limits(&before, &limits),
                    "volume limits updated in place; its probe window and counters are kept"
                ),
                // Not running (it failed to start on an earlier reload):
                // start it, as any changed volume would be.
                None => self.start_volume(v.clone()).await,
            }
        }
    }

    /// Starts one volume, logging why when it cannot.
    async fn start_volume(&self, spec: VolumeSpec) {
        let (set, name) = (self.volumes.clone(), spec.name.clone());
        match blocking_within(RELOAD_TIMEOUT, move || set.add(spec)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(volume = %name, error = %format!("{e:#}"), "cannot start the volume")
            }
            Err(e) => {
                tracing::error!(volume = %name, error = %e, "cannot start the volume")
            }
        }
    }

    /// Logs what applies now and what the reload changed.
    fn log_reloaded(&self, plan: &ReloadPlan, applied: &Applied) {
        let (vols, clus) = (&plan.vols, &plan.clus);
        // What applies now, again: restarted collectors log their settings
        // after their first scrape, the others' are logged here.
        let kept: Vec<String> = self
            .cfg
            .clusters
            .iter()
            .map(|c| c.collector.name.clone())
            .filter(|n| !clus.added.contains(n) && !clus.changed.contains(n))
            .collect();
        super::warnings::all(&self.cfg, &self.volumes, &self.clusters, &kept);
        if vols.is_empty()
            && clus.is_empty()
            && !applied.limits_changed
            && !applied.shutdown_timeout_changed
        {
            tracing::info!("configuration reloaded: nothing changed");
        } else {
            tracing::info!(
                volumes_added = ?vols.added,
                volumes_removed = ?vols.removed,
                volumes_changed = ?vols.changed,
                volumes_limits_updated = ?vols.limits_only,
                discovered_volumes_removed = ?applied.orphans,
                discovered_volumes_kept = ?applied.carried_volumes,
                clusters_added = ?clus.added,
                clusters_removed = ?clus.removed,
                clusters_changed = ?clus.changed,
                limits_changed = applied.limits_changed,
                shutdown_timeout = ?self.cfg.shutdown_timeout,
                "configuration reloaded"
            );
        }
    }
}

/// Swaps in a reloaded `--web.config.file`: the TLS settings new
/// handshakes use and the users basic auth checks.
fn swap_web(web: &WebHandles, sec: WebSecurity) {
    if let (Some(tx), Some(cfg)) = (&web.tls, sec.tls) {
        tx.send_replace(cfg);
    }
    if let Ok(mut a) = web.auth.write() {
        *a = sec.basic_auth.clone();
    }
    if let Ok(mut e) = web.extras.write() {
        *e = sec.extras.clone();
    }
    tracing::info!(
        tls = web.tls.is_some(),
        tls_min_version = sec.tls_min_version.map(|v| v.as_str()),
        client_auth = sec.client_auth.map(|c| c.as_str()),
        headers = sec.extras.headers(),
        rate_limit = sec
            .extras
            .rate_limit()
            .map(|(i, b)| format!("{}/{i:?}", b.max(0))),
        basic_auth = sec.basic_auth.is_some(),
        basic_auth_users = sec.basic_auth.as_ref().map(|a| a.users()),
        "web configuration reloaded"
    );
}

/// What a reload changes: [`Supervisor::plan`] decides it from the running
/// and the new configuration, [`Supervisor::apply`] carries it out.
#[derive(Debug)]
struct ReloadPlan {
    vols: Changes,
    clus: Changes,
    /// Every volume named in the old or the new configuration: never one
    /// a stopped cluster's discovery takes with it.
    configured: HashSet<String>,
    /// The changed clusters that keep their discovered volumes through
    /// their restart.
    carrying: HashSet<String>,
}

/// What [`Supervisor::apply`] did beyond the plan, for the log line.
#[derive(Debug)]
struct Applied {
    /// Discovered volumes stopped with their cluster.
    orphans: Vec<String>,
    /// Discovered volumes kept through their cluster's restart.
    carried_volumes: Vec<String>,
    limits_changed: bool,
    shutdown_timeout_changed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(old: &[(&str, u32)], new: &[(&str, u32)]) -> (Vec<String>, Vec<String>, Vec<String>) {
        let c = diff(old, new, |x: &(&str, u32)| x.0, |a, b| a.1 == b.1);
        (c.added, c.removed, c.changed)
    }

    #[test]
    fn diff_sorts_names_into_added_removed_changed() {
        let (added, removed, changed) = d(
            &[("a", 1), ("b", 1), ("c", 1)],
            &[("b", 1), ("c", 2), ("d", 1)],
        );
        assert_eq!(added, vec!["d"]);
        assert_eq!(removed, vec!["a"]);
        assert_eq!(changed, vec!["c"]);
    }

    #[test]
    fn diff_of_equal_lists_is_empty_whatever_the_order() {
        let c = diff(
            &[("a", 1), ("b", 2)],
            &[("b", 2), ("a", 1)],
            |x: &(&str, u32)| x.0,
            |a, b| a.1 == b.1,
        );
        assert!(c.is_empty(), "{c:?}");
    }

    fn spec(name: &str) -> VolumeSpec {
        VolumeSpec {
            name: name.to_string(),
            path: PathBuf::from(format!("/v/{name}")),
            probe_dir: PathBuf::from(format!("/v/{name}/probe")),
            probe: crate::probe::settings::ProbeSettings::default(),
            provisioned: vec![(Resource::Iops, 1000)],
            cgroup: None,
        }
    }

    #[test]
    fn volumes_whose_limits_alone_changed_are_kept_apart_from_restarts() {
        let old = [
            spec("iops"),
            spec("cg"),
            spec("interval"),
            spec("both"),
            spec("dir"),
            spec("same"),
        ];
        let mut new = old.clone();
        new[0].provisioned = vec![(Resource::Iops, 3000), (Resource::WriteIops, 500)];
        new[1].cgroup = Some("/pg.slice".into());
        new[2].probe.interval = Duration::from_millis(200);
        // A probe change wins over a limits change made with it.
        new[3].provisioned.clear();
        new[3].probe.sync_method = crate::types::SyncMethod::Fsync;
        new[4].probe_dir = PathBuf::from("/v/dir/elsewhere");
        let c = diff_volumes(&old, &new);
        assert_eq!(c.limits_only, vec!["iops", "cg"]);
        assert_eq!(c.changed, vec!["interval", "both", "dir"]);
        assert!(c.added.is_empty() && c.removed.is_empty(), "{c:?}");
        assert!(!c.is_empty());
        assert!(diff_volumes(&old, &old).is_empty());
    }

    #[test]
    fn every_probe_setting_restarts_the_volume() {
        let base = spec("v");
        let mut changes: Vec<VolumeSpec> = Vec::new();
        let mut with = |f: &dyn Fn(&mut VolumeSpec)| {
            let mut s = base.clone();
            f(&mut s);
            changes.push(s);
        };
        with(&|s| s.path = PathBuf::from("/elsewhere"));
        with(&|s| s.probe.commit_probe = false);
        with(&|s| s.probe.read_probe = false);
        with(&|s| s.probe.timeout = Duration::from_secs(3));
        with(&|s| s.probe.read_file_size = 1 << 20);
        with(&|s| s.probe.free_space_reserve = 0);
        with(&|s| s.probe.cache_served_threshold = Duration::ZERO);
        with(&|s| s.probe.sweep_every = Duration::from_secs(600));
        with(&|s| s.probe.sweep_duration = Duration::from_secs(2));
        with(&|s| s.probe.busy_every = Duration::ZERO);
        with(&|s| s.probe.engine = crate::types::EngineChoice::Sync);
        for new in &changes {
            assert_eq!(base.change_to(new), SpecChange::Probe, "{new:?}");
        }
        let mut limits = base.clone();
        limits
            .provisioned
            .push((Resource::ReadBytesPerSecond, 1 << 27));
        assert_eq!(base.change_to(&limits), SpecChange::LimitsOnly);
        assert_eq!(base.change_to(&base.clone()), SpecChange::Same);
    }

    #[test]
    fn limits_changes_are_described_in_configuration_keys() {
        let old = VolumeLimits {
            provisioned: vec![(Resource::Iops, 1000), (Resource::ReadBytesPerSecond, 5)],
            cgroup: None,
        };
        let new = VolumeLimits {
            provisioned: vec![(Resource::Iops, 3000), (Resource::ReadBytesPerSecond, 5)],
            cgroup: Some("/pg.slice".into()),
        };
        assert_eq!(
            describe_limits(&old, &new),
            "provisioned_iops 1000 -> 3000, cgroup none -> /pg.slice"
        );
        let dropped = VolumeLimits::default();
        assert_eq!(
            describe_limits(&old, &dropped),
            "provisioned_iops 1000 -> none, provisioned_read_throughput 5 -> none"
        );
    }

    #[test]
    fn diff_from_and_to_nothing() {
        assert_eq!(d(&[], &[("a", 1)]).0, vec!["a"]);
        assert_eq!(d(&[("a", 1)], &[]).1, vec!["a"]);
        assert!(diff::<(&str, u32)>(&[], &[], |x| x.0, |a, b| a == b).is_empty());
    }
}
