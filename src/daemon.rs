//! The long-running exporter: probe threads, collectors, watchdog, HTTP, and
//! an orderly shutdown that always removes the probe files.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::collectors::postgres::ClusterState;
use crate::config::Config;
use crate::http::tls::TlsListener;
use crate::http::{AppState, router, with_basic_auth};
use crate::metrics::Metrics;
use crate::web_config::WebSecurity;

#[derive(Debug, Clone)]
pub struct WebOptions {
    pub listen: SocketAddr,
    pub telemetry_path: String,
    /// From `--web.config.file`; the default is plain HTTP without auth.
    pub security: WebSecurity,
}

pub async fn run(cfg: Config, web: WebOptions) -> anyhow::Result<()> {
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

    for v in &cfg.volumes {
        volumes.add(v.clone())?;
    }

    let clusters = metrics.clusters();
    for c in &cfg.clusters {
        let state = ClusterState::new(&c.collector.name, cfg.window);
        clusters.add(state.clone());
        tracing::info!(
            cluster = %c.collector.name,
            target = %c.target.display,
            discover_volumes = c.collector.discover_volumes,
            "watching PostgreSQL"
        );
        tokio::spawn(crate::collectors::postgres::run(
            c.collector.clone(),
            c.target.clone(),
            state,
            volumes.clone(),
            cfg.volume_defaults.clone(),
        ));
    }

    tokio::spawn(crate::collectors::limits::run(
        cfg.limits.clone(),
        volumes.clone(),
        clusters.clone(),
        metrics.limits(),
    ));

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
    }));
    if let Some(auth) = &web.security.basic_auth {
        app = with_basic_auth(app, auth.clone());
    }
    let served = match &web.security.tls {
        // With TLS configured the port speaks only TLS: no plain-HTTP
        // fallback that a misconfigured scraper could silently use.
        Some(tls) => {
            axum::serve(TlsListener::new(listener, local, tls.clone()), app)
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

    let timeout = cfg.shutdown_timeout;
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
