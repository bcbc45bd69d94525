//! The long-running exporter: probe threads, collectors, watchdog, HTTP, and
//! an orderly shutdown that always removes the probe files.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::collectors::limits::LimitsState;
use crate::collectors::postgres::{ClusterSet, ClusterState};
use crate::config::{ClusterConfig, Config, FlagOverrides, VolumeConfig};
use crate::http::auth::AuthSlot;
use crate::http::tls::TlsListener;
use crate::http::{AppState, router, with_basic_auth};
use crate::metrics::Metrics;
use crate::metrics::config::ConfigMetrics;
use crate::probe::set::{Removed, VolumeSet};
use crate::web_config::WebSecurity;

#[derive(Debug, Clone)]
pub struct WebOptions {
    pub listen: SocketAddr,
    pub telemetry_path: String,
    /// From `--web.config.file`; the default is plain HTTP without auth.
    pub security: WebSecurity,
    /// `--web.config.file`, read again on SIGHUP.
    pub config_file: Option<PathBuf>,
}

/// What a reload of `--web.config.file` swaps: the TLS settings new
/// handshakes use and the users basic auth checks.
struct WebHandles {
    file: Option<PathBuf>,
    tls: Option<watch::Sender<Arc<rustls::ServerConfig>>>,
    auth: AuthSlot,
}

/// Where the configuration came from, to load it again on SIGHUP: the same
/// file and the same flags.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    pub file: Option<PathBuf>,
    pub flags: FlagOverrides,
}

pub async fn run(cfg: Config, web: WebOptions, source: ReloadSource) -> anyhow::Result<()> {
    // SIGHUP's default action ends the process: take it over before
    // anything else, so a reload sent early cannot kill the exporter.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let roots = crate::probe::fsinfo::Roots {
        proc: cfg.limits.proc_root.clone(),
        sys: cfg.limits.sys_root.clone(),
    };
    let (metrics, volumes) = Metrics::new(cfg.window, roots);
    let metrics = Arc::new(metrics);

    let listener = tokio::net::TcpListener::bind(web.listen)
        .await
        .with_context(|| format!("cannot listen on {}", web.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;
    // Whether the endpoint is protected, stated once; never which users or
    // anything about their passwords.
    tracing::info!(
        address = %local,
        telemetry_path = %web.telemetry_path,
        version = env!("CARGO_PKG_VERSION"),
        tls = web.security.tls.is_some(),
        tls_min_version = web.security.tls_min_version.map(|v| v.as_str()),
        basic_auth = web.security.basic_auth.is_some(),
        basic_auth_users = web.security.basic_auth.as_ref().map(|a| a.users()),
        "listening"
    );

    let config_metrics = metrics.config();
    config_metrics.loaded();
    let shutdown_timeout = Arc::new(AtomicU64::new(millis(cfg.shutdown_timeout)));
    let mut sup = Supervisor {
        volumes: volumes.clone(),
        clusters: metrics.clusters(),
        limits_state: metrics.limits(),
        cluster_tasks: HashMap::new(),
        limits_task: None,
        shutdown_timeout: shutdown_timeout.clone(),
        cfg,
    };
    sup.start()?;
    let auth: AuthSlot = Arc::new(std::sync::RwLock::new(web.security.basic_auth.clone()));
    let (tls_tx, tls_rx) = match &web.security.tls {
        Some(c) => {
            let (tx, rx) = watch::channel(c.clone());
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let handles = WebHandles {
        file: web.config_file.clone(),
        tls: tls_tx,
        auth: auth.clone(),
    };
    let reloader = tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!(signal = "SIGHUP", "reloading the configuration");
            sup.reload(&source, &handles, &config_metrics).await;
        }
    });

    let watchdog = {
        let volumes = volumes.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                volumes.check_timeouts(Instant::now());
            }
        })
    };

    let mut app = router(Arc::new(AppState {
        metrics,
        telemetry_path: web.telemetry_path.clone(),
        volumes: volumes.clone(),
        renders: Default::default(),
    }));
    // With a web configuration file the check is always in place, so a
    // reload can add users to a file that had none.
    if web.config_file.is_some() {
        app = with_basic_auth(app, auth);
    }
    let served = match tls_rx {
        // With TLS configured the port speaks only TLS: no plain-HTTP
        // fallback that a misconfigured scraper could silently use.
        Some(tls) => {
            axum::serve(TlsListener::new(listener, local, tls), app)
                .with_graceful_shutdown(shutdown_signal())
                .await
        }
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown_signal())
                .await
        }
    }
    .context("HTTP server failed");
    watchdog.abort();
    // A reload in progress is cut short; the shutdown below stops whatever
    // probe threads it had started.
    reloader.abort();

    let timeout = Duration::from_millis(shutdown_timeout.load(Ordering::Relaxed));
    let set = volumes.clone();
    tokio::task::spawn_blocking(move || set.shutdown(timeout))
        .await
        .context("shutdown task")?;
    served
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot install SIGTERM handler");
                std::future::pending::<()>().await;
            }
        }
    };
    let int = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot install SIGINT handler");
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = term => tracing::info!(signal = "SIGTERM", "shutting down"),
        _ = int => tracing::info!(signal = "SIGINT", "shutting down"),
    }
}

/// Nice value of the async runtime's threads (HTTP, collectors, scrape
/// encoding): below the probe threads, which stay at the process's own.
pub const RUNTIME_NICENESS: i32 = 10;

/// Lowers the calling thread's CPU priority to [`RUNTIME_NICENESS`]. A probe
/// measures latency: the time from the IO's completion to the probe
/// thread running again is part of what it reports, so under a scrape
/// storm on a small host the probe threads must win the CPU over scrape
/// encoding. On Linux the nice value is per thread (setpriority(2), BUGS),
/// so this leaves the probe threads alone. Raising it needs no privilege,
/// so it cannot fail for lack of one.
pub fn lower_thread_priority() {
    // SAFETY: gettid and setpriority take plain integers and touch no memory.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, RUNTIME_NICENESS)
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot lower the runtime thread's priority");
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().try_into().unwrap_or(u64::MAX)
}

/// Owns what the configuration started (probe threads through the
/// [`VolumeSet`], one collector task per cluster, the limits task) and
/// changes it on reload.
struct Supervisor {
    cfg: Config,
    volumes: Arc<VolumeSet>,
    clusters: Arc<ClusterSet>,
    limits_state: Arc<LimitsState>,
    cluster_tasks: HashMap<String, ClusterTask>,
    limits_task: Option<JoinHandle<()>>,
    shutdown_timeout: Arc<AtomicU64>,
}

struct ClusterTask {
    state: Arc<ClusterState>,
    handle: JoinHandle<()>,
}

/// What a reload changed, for its log line.
#[derive(Debug, Default)]
struct Changes {
    added: Vec<String>,
    removed: Vec<String>,
    changed: Vec<String>,
}

impl Changes {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
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

/// Loads `--web.config.file` again, if there is one. Refused, with the
/// `pgstorage_config_reload_errors_total` cause: a file that does not load,
/// and one that turns TLS on or off (the listener speaks TLS or plain HTTP
/// from the start to the end of the process; switching needs a restart).
async fn load_web(web: &WebHandles) -> Result<Option<WebSecurity>, (&'static str, String)> {
    let Some(file) = web.file.clone() else {
        return Ok(None);
    };
    let loaded = tokio::task::spawn_blocking(move || crate::web_config::load(&file)).await;
    let sec = match loaded {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let unreadable = e.chain().any(|c| c.is::<std::io::Error>());
            let cause = if unreadable { "unreadable" } else { "invalid" };
            return Err((cause, format!("{e:#}")));
        }
        Err(e) => return Err(("invalid", e.to_string())),
    };
    if sec.tls.is_some() != web.tls.is_some() {
        let what = if web.tls.is_some() { "off" } else { "on" };
        return Err((
            "invalid",
            format!("the web configuration turns TLS {what}: that needs a restart"),
        ));
    }
    Ok(Some(sec))
}

impl Supervisor {
    fn start(&mut self) -> anyhow::Result<()> {
        for v in &self.cfg.volumes {
            self.volumes.add(v.clone())?;
        }
        for c in self.cfg.clusters.clone() {
            self.start_cluster(&c);
        }
        self.start_limits();
        Ok(())
    }

    fn start_cluster(&mut self, c: &ClusterConfig) {
        let state = ClusterState::new(&c.collector.name, self.cfg.window);
        self.clusters.add(state.clone());
        tracing::info!(
            cluster = %c.collector.name,
            target = %c.target.display,
            discover_volumes = c.collector.discover_volumes,
            "watching PostgreSQL"
        );
        let handle = tokio::spawn(crate::collectors::postgres::run(
            c.collector.clone(),
            c.target.clone(),
            state.clone(),
            self.volumes.clone(),
            self.cfg.volume_defaults.clone(),
        ));
        self.cluster_tasks
            .insert(c.collector.name.clone(), ClusterTask { state, handle });
    }

    fn start_limits(&mut self) {
        if let Some(t) = self.limits_task.take() {
            t.abort();
        }
        self.limits_task = Some(tokio::spawn(crate::collectors::limits::run(
            self.cfg.limits.clone(),
            self.volumes.clone(),
            self.clusters.clone(),
            self.limits_state.clone(),
        )));
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_timeout.load(Ordering::Relaxed))
    }

    /// Stops a cluster's collector (dropping its connection) and forgets
    /// it. Returns the volumes its discovery added.
    fn stop_cluster(&mut self, name: &str) -> Vec<String> {
        let Some(task) = self.cluster_tasks.remove(name) else {
            return Vec::new();
        };
        task.handle.abort();
        self.clusters.remove(name);
        task.state
            .snapshot()
            .volumes
            .into_iter()
            .map(|(v, _)| v)
            .collect()
    }

    /// Loads the configuration again and applies the difference. A
    /// configuration that does not load or validate changes nothing.
    async fn reload(&mut self, source: &ReloadSource, web: &WebHandles, metrics: &ConfigMetrics) {
        let loaded = {
            let source = source.clone();
            tokio::task::spawn_blocking(move || {
                crate::config::load(source.file.as_deref(), &source.flags)
            })
            .await
        };
        let new = match loaded {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                metrics.refused(e.cause());
                tracing::error!(error = %e, "configuration reload refused; the running configuration is kept");
                return;
            }
            Err(e) => {
                metrics.refused("invalid");
                tracing::error!(error = %e, "configuration reload failed; the running configuration is kept");
                return;
            }
        };
        if let Some(problem) = crate::config::engine_problem(&new) {
            metrics.refused("invalid");
            tracing::error!(error = %problem, "configuration reload refused; the running configuration is kept");
            return;
        }
        // Both files load, or neither is applied.
        let security = match load_web(web).await {
            Ok(s) => s,
            Err((cause, e)) => {
                metrics.refused(cause);
                tracing::error!(error = %e, "configuration reload refused; the running configuration is kept");
                return;
            }
        };
        let mut new = new;
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
        let vols = diff(
            &self.cfg.volumes,
            &new.volumes,
            |v: &VolumeConfig| &v.name,
            |a, b| a == b,
        );
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
        self.shutdown_timeout
            .store(millis(new.shutdown_timeout), Ordering::Relaxed);

        // Clusters first: their discovered volumes go with them.
        let configured: HashSet<String> = self
            .cfg
            .volumes
            .iter()
            .chain(new.volumes.iter())
            .map(|v| v.name.clone())
            .collect();
        let mut orphans = Vec::new();
        for name in clus.removed.iter().chain(clus.changed.iter()) {
            orphans.extend(self.stop_cluster(name));
        }
        let still_used: HashSet<String> = self
            .cluster_tasks
            .values()
            .flat_map(|t| t.state.snapshot().volumes.into_iter().map(|(v, _)| v))
            .collect();
        orphans.retain(|v| !configured.contains(v) && !still_used.contains(v));
        orphans.sort();
        orphans.dedup();
        let mut to_remove: Vec<String> = orphans.clone();
        to_remove.extend(vols.removed.iter().cloned());
        to_remove.extend(vols.changed.iter().cloned());
        let timeout = self.timeout();
        for name in to_remove {
            let set = self.volumes.clone();
            let n = name.clone();
            match tokio::task::spawn_blocking(move || set.remove(&n, timeout)).await {
                Ok(Removed::Clean | Removed::Abandoned) => {
                    tracing::info!(volume = %name, "volume stopped by the reload")
                }
                Ok(Removed::Unknown) => {}
                Err(e) => tracing::error!(volume = %name, error = %e, "stopping the volume failed"),
            }
        }
        let old = std::mem::replace(&mut self.cfg, new);
        for v in self.cfg.volumes.clone() {
            if vols.added.contains(&v.name) || vols.changed.contains(&v.name) {
                let set = self.volumes.clone();
                let name = v.name.clone();
                match tokio::task::spawn_blocking(move || set.add(v)).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::error!(volume = %name, error = %format!("{e:#}"), "cannot start the volume")
                    }
                    Err(e) => {
                        tracing::error!(volume = %name, error = %e, "cannot start the volume")
                    }
                }
            }
        }
        for c in self.cfg.clusters.clone() {
            let n = &c.collector.name;
            if clus.added.contains(n) || clus.changed.contains(n) {
                self.start_cluster(&c);
            }
        }
        let limits_changed = old.limits != self.cfg.limits;
        if limits_changed {
            self.start_limits();
        }
        if let Some(sec) = security {
            if let (Some(tx), Some(cfg)) = (&web.tls, sec.tls) {
                tx.send_replace(cfg);
            }
            if let Ok(mut a) = web.auth.write() {
                *a = sec.basic_auth.clone();
            }
            tracing::info!(
                tls = web.tls.is_some(),
                tls_min_version = sec.tls_min_version.map(|v| v.as_str()),
                basic_auth = sec.basic_auth.is_some(),
                basic_auth_users = sec.basic_auth.as_ref().map(|a| a.users()),
                "web configuration reloaded"
            );
        }
        metrics.reloaded();
        if vols.is_empty()
            && clus.is_empty()
            && !limits_changed
            && old.shutdown_timeout == self.cfg.shutdown_timeout
        {
            tracing::info!("configuration reloaded: nothing changed");
        } else {
            tracing::info!(
                volumes_added = ?vols.added,
                volumes_removed = ?vols.removed,
                volumes_changed = ?vols.changed,
                discovered_volumes_removed = ?orphans,
                clusters_added = ?clus.added,
                clusters_removed = ?clus.removed,
                clusters_changed = ?clus.changed,
                limits_changed,
                shutdown_timeout = ?self.cfg.shutdown_timeout,
                "configuration reloaded"
            );
        }
    }
}
