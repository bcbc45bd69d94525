//! The long-running exporter: probe threads, collectors, watchdog, HTTP, and
//! an orderly shutdown that always removes the probe files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::watch;

pub use crate::app::supervisor::ReloadSource;
use crate::app::supervisor::{Supervisor, WebHandles, millis};
use crate::config::Config;
use crate::exposition::Metrics;
use crate::http::auth::AuthSlot;
use crate::http::tls::TlsListener;
use crate::http::web_config::WebSecurity;
use crate::http::{AppState, router, with_basic_auth};

#[derive(Debug, Clone)]
pub struct WebOptions {
    pub listen: SocketAddr,
    pub telemetry_path: String,
    /// From `--web.config.file`; the default is plain HTTP without auth.
    pub security: WebSecurity,
    /// `--web.config.file`, read again on SIGHUP.
    pub config_file: Option<PathBuf>,
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
    // The daemon owns the sets; exposition and HTTP only read them.
    let volumes = crate::probe::set::VolumeSet::new(cfg.window, roots);
    let clusters = Arc::new(crate::postgres::ClusterSet::default());
    let limits = Arc::new(crate::limits::LimitsState::default());
    let metrics = Arc::new(Metrics::new(
        volumes.clone(),
        clusters.clone(),
        limits.clone(),
    ));

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
    let mut sup = Supervisor::new(
        cfg,
        volumes.clone(),
        clusters,
        limits,
        shutdown_timeout.clone(),
    );
    sup.start().await?;
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
    // PRIO_PROCESS with a thread id: on Linux that names the thread alone.
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), RUNTIME_NICENESS) {
        tracing::debug!(error = %std::io::Error::from(e), "cannot lower the runtime thread's priority");
    }
}
