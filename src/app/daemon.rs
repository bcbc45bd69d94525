//! The long-running exporter: probe threads, collectors, watchdog, HTTP, and
//! an orderly shutdown that always removes the probe files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(crate) use crate::app::supervisor::ReloadSource;
use crate::app::supervisor::{Supervisor, WebHandles, millis};
use crate::config::Config;
use crate::exposition::Metrics;
use crate::exposition::config::ConfigMetrics;
use crate::exposition::connections::ConnectionMetrics;
use crate::exposition::http_auth::AuthMetrics;
use crate::http::auth::AuthSlot;
use crate::http::conns::{Closed, Table, Timeouts};
use crate::http::extras::ExtrasSlot;
use crate::http::serve::{self, Server};
use crate::http::web_config::WebSecurity;
use crate::http::{AppState, router, with_basic_auth};
use crate::probe::set::VolumeSet;

/// Where HTTP is served.
#[derive(Debug)]
pub(crate) enum Listen {
    /// `--web.listen-address`, each bound in [`run`].
    Addresses(Vec<SocketAddr>),
    /// `--web.systemd-socket`: sockets bound by systemd, from
    /// [`systemd_listeners`].
    Inherited(Vec<std::net::TcpListener>),
}

/// The sockets systemd passed by socket activation (`LISTEN_FDS` from fd 3
/// on, for the process `LISTEN_PID` names), as exporter-toolkit's
/// `--web.systemd-socket` takes them. Call it while the process has a single
/// thread: it removes those variables from the environment, as systemd's
/// `sd_listen_fds(1)` does. listenfd checks each descriptor is a TCP socket
/// before taking it (a crate rather than `from_raw_fd`: that check and the
/// ownership transfer are its whole job, and its unsafe code is not ours).
pub(crate) fn systemd_listeners() -> anyhow::Result<Vec<std::net::TcpListener>> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() == 0 {
        anyhow::bail!(
            "--web.systemd-socket: no socket activation file descriptors found \
             (LISTEN_FDS and LISTEN_PID are not set for this process)"
        );
    }
    let mut out = Vec::with_capacity(fds.len());
    for i in 0..fds.len() {
        match fds.take_tcp_listener(i) {
            Ok(Some(l)) => out.push(l),
            Ok(None) => {}
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "--web.systemd-socket: socket {} (fd {})",
                    i + 1,
                    i + 3
                )));
            }
        }
    }
    Ok(out)
}

#[derive(Debug)]
pub(crate) struct WebOptions {
    pub(crate) listen: Listen,
    pub(crate) telemetry_path: String,
    /// From `--web.config.file`; the default is plain HTTP without auth.
    pub(crate) security: WebSecurity,
    /// `--web.config.file`, read again on SIGHUP.
    pub(crate) config_file: Option<PathBuf>,
    /// `--web.max-connections`: per listener, lowered at start if the
    /// open-file limit cannot hold that many on every listener.
    pub(crate) max_connections: usize,
}

/// SIGTERM, SIGINT and SIGHUP, taken over from their default action (which
/// ends the process at once, leaving its probe files behind) before the
/// exporter binds a port or creates a file. A signal that arrives after
/// [`Signals::install`] is kept until the daemon reads it: a SIGTERM sent
/// while the probe files are being created stops the exporter as soon as
/// they exist, and it removes them.
#[derive(Debug)]
pub(crate) struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers. Call it inside the runtime
    /// (`Runtime::enter`), while `sys::hold_stop_signals` holds the
    /// signals, and release them afterwards: then no moment of the start
    /// is left to the default action.
    pub(crate) fn install() -> anyhow::Result<Signals> {
        let one = |kind: SignalKind, name: &str| {
            signal(kind).with_context(|| format!("installing the {name} handler"))
        };
        Ok(Signals {
            term: one(SignalKind::terminate(), "SIGTERM")?,
            int: one(SignalKind::interrupt(), "SIGINT")?,
            hup: one(SignalKind::hangup(), "SIGHUP")?,
        })
    }
}

pub(crate) async fn run(
    cfg: Config,
    web: WebOptions,
    source: ReloadSource,
    signals: Signals,
) -> anyhow::Result<()> {
    let Signals { term, int, hup } = signals;
    let roots = crate::probe::fsinfo::Roots {
        proc: cfg.limits.proc_root.clone(),
        sys: cfg.limits.sys_root.clone(),
    };
    // The daemon owns the sets; exposition and HTTP only read them.
    let volumes = crate::probe::set::VolumeSet::new(cfg.window, roots);
    let clusters = Arc::new(crate::postgres::ClusterSet::default());
    let limits = Arc::new(crate::limits::LimitsState::default());
    let mut metrics = Metrics::new(
        volumes.clone(),
        clusters.clone(),
        limits.clone(),
        cfg.collectors,
    );
    // With a web configuration file basic auth can be in force (a reload
    // can add users to a file that had none); without one it never is.
    let auth_metrics = web.config_file.is_some().then(|| metrics.register_auth());
    if cfg.collectors.on(crate::types::Collector::PostgresSyncs) {
        spawn_syncs(&metrics, clusters.clone())?;
    }
    let metrics = Arc::new(metrics);

    // Every socket is bound (or taken over) before anything starts, so a
    // port in use stops the start with nothing to clean up.
    let (bound, max_connections) = listen(
        web.listen,
        &web.security,
        &web.telemetry_path,
        web.max_connections,
    )?;

    let changed = cfg.collectors.changed();
    if !changed.is_empty() {
        tracing::info!(collectors = %changed.join(" "), "collectors differ from the defaults");
    }
    let config_metrics = metrics.config();
    config_metrics.loaded();
    let shutdown_timeout = Arc::new(AtomicU64::new(millis(cfg.shutdown_timeout)));
    let auth: AuthSlot = Arc::new(std::sync::RwLock::new(web.security.basic_auth.clone()));
    let extras: ExtrasSlot = Arc::new(std::sync::RwLock::new(web.security.extras.clone()));
    // Built before any probe file exists: axum's router panics on a route
    // it cannot parse (the telemetry path is checked at start for that, see
    // `cli::check_telemetry_path`), and a panic must not leave files.
    let app = http_app(&metrics, &web.telemetry_path, auth_metrics, &auth, &extras);
    let mut sup = Supervisor::new(
        cfg,
        volumes.clone(),
        clusters,
        limits,
        metrics.audit(),
        shutdown_timeout.clone(),
    );
    // One server per socket, all stopped by the same signal; should one
    // fail, the others are stopped too. Listening for the signal starts
    // before the first probe file is created.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let stopper = spawn_stopper(term, int, stop_tx.clone());
    let started = start_unless_stopped(&mut sup, stop_rx.clone()).await;
    if let Err(e) = started {
        stopper.abort();
        // The volumes added before the one that failed have their files.
        let _ = shutdown_volumes(&volumes, &shutdown_timeout).await;
        return Err(e);
    }
    let (tls_tx, tls_rx) = tls_channel(&web.security);
    let handles = WebHandles {
        file: web.config_file.clone(),
        tls: tls_tx,
        auth: auth.clone(),
        extras,
    };
    let reloader = spawn_reloader(hup, sup, source, handles, config_metrics);
    let watchdog = spawn_watchdog(volumes.clone());

    let servers = Servers {
        app,
        tls: tls_rx,
        metrics: metrics.connections(),
        max_connections,
    };
    let served = servers.serve(bound, stop_rx, &stop_tx).await;
    stopper.abort();
    watchdog.abort();
    // A reload in progress is cut short; the shutdown below stops whatever
    // probe threads it had started.
    reloader.abort();

    shutdown_volumes(&volumes, &shutdown_timeout)
        .await
        .context("shutdown task")?;
    served
}

/// Raises the open-file limit, binds (or takes over) every socket and fits
/// the connection cap to the limit: the sockets with their addresses, and
/// the cap.
fn listen(
    listen: Listen,
    security: &WebSecurity,
    telemetry_path: &str,
    wanted: usize,
) -> anyhow::Result<(Vec<(TcpListener, SocketAddr)>, usize)> {
    let nofile = raise_nofile_limit();
    let systemd = matches!(listen, Listen::Inherited(_));
    let bound = bind_listeners(listen)?;
    let max_connections = fit_connections(wanted, bound.len(), nofile);
    log_listening(&bound, security, telemetry_path, systemd, max_connections);
    Ok((bound, max_connections))
}

/// Starts the `postgres.syncs` collector's thread: it traces the clusters
/// the PostgreSQL collectors watch, each at the `data_directory` its
/// collector read (none until its first scrape).
fn spawn_syncs(
    metrics: &Metrics,
    clusters: Arc<crate::postgres::ClusterSet>,
) -> anyhow::Result<()> {
    let targets = move || clusters.data_directories();
    crate::ebpf::spawn(metrics.syncs(), Box::new(targets))
        .context("starting the postgres.syncs thread")
}

/// One line per socket, as exporter-toolkit logs; whether the endpoint is
/// protected, never which users or anything about their passwords.
fn log_listening(
    bound: &[(TcpListener, SocketAddr)],
    security: &WebSecurity,
    telemetry_path: &str,
    systemd: bool,
    max_connections: usize,
) {
    for (_, local) in bound {
        tracing::info!(
            address = %local,
            systemd_socket = systemd.then_some(true),
            telemetry_path = %telemetry_path,
            version = env!("CARGO_PKG_VERSION"),
            tls = security.tls.is_some(),
            tls_min_version = security.tls_min_version.map(|v| v.as_str()),
            client_auth = security.client_auth.map(|c| c.as_str()),
            basic_auth = security.basic_auth.is_some(),
            basic_auth_users = security.basic_auth.as_ref().map(|a| a.users()),
            headers = (security.extras.headers() > 0).then(|| security.extras.headers()),
            rate_limit = security.extras.rate_limit().map(|(i, b)| format!("{}/{i:?}", b.max(0))),
            max_connections,
            "listening"
        );
    }
}

/// Binds the `--web.listen-address` sockets, or takes over systemd's,
/// each with its address.
fn bind_listeners(listen: Listen) -> anyhow::Result<Vec<(TcpListener, SocketAddr)>> {
    let mut listeners = Vec::new();
    match listen {
        Listen::Addresses(addrs) => {
            for addr in addrs {
                let l = serve::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
                listeners.push(l);
            }
        }
        Listen::Inherited(socks) => {
            for sock in socks {
                sock.set_nonblocking(true)
                    .context("--web.systemd-socket: making the socket non-blocking")?;
                listeners.push(
                    TcpListener::from_std(sock)
                        .context("--web.systemd-socket: registering the socket")?,
                );
            }
        }
    }
    let mut bound = Vec::with_capacity(listeners.len());
    for l in listeners {
        let local = l.local_addr().context("reading the bound address")?;
        // Connections that never send a byte stay in the kernel (see
        // `set_tcp_defer_accept`) for as long as a request head may take;
        // a listener without it still holds, since its connection rules
        // close them after that time.
        let defer = u32::try_from(serve::HEADER_TIMEOUT.as_secs()).unwrap_or(u32::MAX);
        if let Err(e) = crate::sys::set_tcp_defer_accept(std::os::fd::AsFd::as_fd(&l), defer) {
            tracing::warn!(address = %local, error = %e, "cannot set TCP_DEFER_ACCEPT");
        }
        bound.push((l, local));
    }
    Ok(bound)
}

/// `--web.max-connections`, lowered (with a warning) when `listeners`
/// times that many would not fit the open-file limit `nofile`.
fn fit_connections(wanted: usize, listeners: usize, nofile: Option<u64>) -> usize {
    let max_connections = match nofile {
        Some(n) => crate::http::conns::fit(wanted, listeners, n),
        None => wanted,
    };
    if max_connections < wanted {
        tracing::warn!(
            max_connections = wanted,
            listeners,
            open_file_limit = nofile,
            using = max_connections,
            "--web.max-connections lowered to fit the open-file limit (RLIMIT_NOFILE) with \
             room for probe files and PostgreSQL sessions"
        );
    }
    max_connections
}

/// The HTTP application: the routes, behind basic auth, and then the rate
/// limit and response headers, when a web configuration file is in use.
fn http_app(
    metrics: &Arc<Metrics>,
    telemetry_path: &str,
    auth_metrics: Option<AuthMetrics>,
    auth: &AuthSlot,
    extras: &ExtrasSlot,
) -> Router {
    let app = router(Arc::new(AppState {
        metrics: metrics.clone(),
        telemetry_path: telemetry_path.to_string(),
        renders: Default::default(),
    }));
    // With a web configuration file the check is always in place, so a
    // reload can add users to a file that had none.
    match auth_metrics {
        Some(auth_metrics) => {
            let guard = crate::http::auth::Guard {
                users: auth.clone(),
                gate: Arc::new(crate::http::auth::Gate::new(auth_metrics)),
            };
            // Outermost, as in exporter-toolkit's handler: the rate limit
            // counts every request, answered or not, before any password
            // check, and the headers go on 401s too.
            with_basic_auth(app, guard).layer(axum::middleware::from_fn_with_state(
                extras.clone(),
                crate::http::extras::apply,
            ))
        }
        None => app,
    }
}

/// Sends the stop to every server on the first SIGTERM or SIGINT.
fn spawn_stopper(
    mut term: Signal,
    mut int: Signal,
    stop_tx: Arc<watch::Sender<bool>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "shutting down"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "shutting down"),
        }
        stop_tx.send_replace(true);
    })
}

/// Starts what the configuration names, unless SIGTERM or SIGINT comes
/// first.
async fn start_unless_stopped(
    sup: &mut Supervisor,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    tokio::select! {
        r = sup.start() => r,
        // Stopped while volumes were being added: the shutdown removes
        // what was created, and a volume still being added either is seen
        // by it or sees the stop and creates nothing (`VolumeSet::add`).
        _ = stop.wait_for(|s| *s) => Ok(()),
    }
}

/// The TLS settings new handshakes use.
type Tls = Arc<rustls::ServerConfig>;

/// The channel a reload sends new TLS settings on; none without TLS.
fn tls_channel(
    security: &WebSecurity,
) -> (Option<watch::Sender<Tls>>, Option<watch::Receiver<Tls>>) {
    match &security.tls {
        Some(c) => {
            let (tx, rx) = watch::channel(c.clone());
            (Some(tx), Some(rx))
        }
        None => (None, None),
    }
}

/// Reloads the configuration on every SIGHUP.
fn spawn_reloader(
    mut hup: Signal,
    mut sup: Supervisor,
    source: ReloadSource,
    handles: WebHandles,
    config_metrics: ConfigMetrics,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!(signal = "SIGHUP", "reloading the configuration");
            sup.reload(&source, &handles, &config_metrics).await;
        }
    })
}

/// Counts probe operations past their timeout, waking when the earliest
/// one could pass it (or a volume is added), not on a fixed tick: an idle
/// exporter has nothing to wake for.
fn spawn_watchdog(volumes: Arc<VolumeSet>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            // A volume added after this check leaves a permit: the wait
            // below then ends at once.
            match volumes.check_timeouts(Instant::now()) {
                Some(at) => {
                    // With the other periodic tasks
                    // (`model::pacing::until_boundary`): at the first
                    // boundary of their default 10 s interval when that
                    // comes before `at` (waking early is harmless: nothing
                    // is due yet), else on the whole second after `at`, so
                    // that a stuck probe is counted less than a second
                    // after its timeout, as with the 1 s tick this
                    // replaces.
                    let unix = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    let to_due = at.saturating_duration_since(Instant::now());
                    let shared = crate::model::pacing::until_boundary(
                        unix,
                        Duration::from_secs(10),
                        Duration::from_millis(1),
                    );
                    let wait = if shared <= to_due {
                        shared
                    } else {
                        crate::model::pacing::until_boundary(unix, Duration::from_secs(1), to_due)
                    };
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = volumes.added.notified() => {}
                    }
                }
                None => volumes.added.notified().await,
            }
        }
    })
}

/// Stops every probe thread and removes the probe files, within the
/// shutdown timeout in force.
async fn shutdown_volumes(
    volumes: &Arc<VolumeSet>,
    shutdown_timeout: &AtomicU64,
) -> Result<(), tokio::task::JoinError> {
    let timeout = Duration::from_millis(shutdown_timeout.load(Ordering::Relaxed));
    let set = volumes.clone();
    tokio::task::spawn_blocking(move || set.shutdown(timeout)).await
}

/// What every listener's server shares.
struct Servers {
    app: Router,
    tls: Option<watch::Receiver<Tls>>,
    metrics: ConnectionMetrics,
    max_connections: usize,
}

impl Servers {
    /// Serves every bound socket until `stop`; a server that panics stops
    /// the others too, and is the error returned.
    async fn serve(
        self,
        bound: Vec<(TcpListener, SocketAddr)>,
        stop: watch::Receiver<bool>,
        stop_tx: &watch::Sender<bool>,
    ) -> anyhow::Result<()> {
        let mut servers = tokio::task::JoinSet::new();
        let timeouts = Timeouts {
            header: serve::HEADER_TIMEOUT,
            idle: serve::IDLE_TIMEOUT,
        };
        let reasons = Closed::ALL.map(Closed::as_str);
        for (listener, local) in bound {
            let server = Server {
                app: self.app.clone(),
                tls: self.tls.clone(),
                metrics: self
                    .metrics
                    .listener(&local.to_string(), self.max_connections, &reasons),
            };
            let table = Arc::new(Table::new(self.max_connections, timeouts));
            servers.spawn(serve::serve(listener, local, server, table, stop.clone()));
        }
        let mut served: anyhow::Result<()> = Ok(());
        while let Some(r) = servers.join_next().await {
            // A listener ends only when stopped; a panic in one stops the
            // others too.
            if let Err(e) = r {
                if served.is_ok() {
                    served = Err(anyhow::Error::new(e).context("HTTP server task"));
                }
                stop_tx.send_replace(true);
            }
        }
        served
    }
}

/// Raises the soft limit on open files to the hard limit and returns the
/// limit in force (`None`: unlimited). Every HTTP connection, probe file and
/// PostgreSQL session holds a descriptor, and the soft limit is what runs
/// out: 1,024 by default under systemd and most shells, while the hard
/// limit is usually far higher (524,288 under systemd since v240), kept low
/// only for programs that still use select(2), which fails above 1,024
/// descriptors. Nothing here uses select(2). Raising the soft limit up to
/// the hard one needs no privilege; should it fail all the same, the
/// exporter runs with the limit it has and fits its connection caps to it.
fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let text = |l: Option<u64>| l.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
    let before = getrlimit(Resource::Nofile);
    if before.current == before.maximum {
        tracing::debug!(
            limit = %text(before.current),
            "open-file limit (RLIMIT_NOFILE) already at its hard limit"
        );
        return before.current;
    }
    let raised = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::debug!(
                from = %text(before.current),
                to = %text(before.maximum),
                "open-file limit (RLIMIT_NOFILE) raised to its hard limit"
            );
            before.maximum
        }
        Err(e) => {
            tracing::warn!(
                limit = %text(before.current),
                hard = %text(before.maximum),
                error = %std::io::Error::from(e),
                "cannot raise the open-file limit (RLIMIT_NOFILE) to its hard limit"
            );
            before.current
        }
    }
}

/// Nice value of the async runtime's worker threads (HTTP, collectors,
/// scrape encoding): below the probe threads, which stay at the process's
/// own.
pub(crate) const RUNTIME_NICENESS: i32 = 10;

/// Lowers the calling worker thread's CPU priority to [`RUNTIME_NICENESS`],
/// once. A probe measures latency: the time from the IO's completion to the
/// probe thread running again is part of what it reports, so under a
/// scrape storm on a small host the probe threads must win the CPU over
/// scrape encoding. On Linux the nice value is per thread (setpriority(2),
/// BUGS), and a new thread inherits its creator's. So this runs from the
/// runtime's park hook, which only worker threads call, and not at thread
/// start: the blocking pool's threads are the ones that create the probe
/// threads (volumes are added on blocking threads), and a probe thread
/// created by a niced thread would be niced too, with no way back without
/// CAP_SYS_NICE. That is what happened until 2026-12-04: every probe thread
/// ran at nice 10, and its syncs in bursts read 12-25 % slower than fio's
/// at nice 0. Raising the value needs no privilege, so it cannot fail for
/// lack of one.
pub(crate) fn lower_worker_priority() {
    thread_local! {
        static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if LOWERED.with(|l| l.replace(true)) {
        return;
    }
    // PRIO_PROCESS with a thread id: on Linux that names the thread alone.
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), RUNTIME_NICENESS) {
        tracing::debug!(error = %std::io::Error::from(e), "cannot lower the runtime thread's priority");
    }
}
