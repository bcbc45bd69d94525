//! The long-running exporter: probe threads, watchdog, HTTP, and an orderly
//! shutdown that always removes the probe files.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::Config;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::probe::fsinfo::{self, Roots};
use crate::probe::runner::{self, Stop};
use crate::probe::state::VolumeState;

#[derive(Debug, Clone)]
pub struct WebOptions {
    pub listen: SocketAddr,
    pub telemetry_path: String,
}

pub async fn run(cfg: Config, web: WebOptions) -> anyhow::Result<()> {
    let roots = Roots::default();
    let volumes: Vec<Arc<VolumeState>> = cfg
        .volumes
        .iter()
        .map(|v| {
            Arc::new(VolumeState::new(
                v,
                cfg.window,
                fsinfo::lookup(&v.path, &roots),
            ))
        })
        .collect();
    let metrics = Arc::new(Metrics::new(volumes.clone()));

    let listener = tokio::net::TcpListener::bind(web.listen)
        .await
        .with_context(|| format!("cannot listen on {}", web.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;
    tracing::info!(
        address = %local,
        telemetry_path = %web.telemetry_path,
        version = env!("CARGO_PKG_VERSION"),
        "listening"
    );

    let stop = Stop::new();
    let (done_tx, done_rx) = mpsc::channel::<String>();
    let mut running = HashSet::new();
    for (vcfg, state) in cfg.volumes.iter().zip(&volumes) {
        tracing::info!(
            volume = %vcfg.name,
            path = %vcfg.path.display(),
            device = %state.snapshot(Instant::now(), &[]).fs.device,
            probe_dir = %vcfg.probe_dir.display(),
            "volume configured"
        );
        runner::spawn(
            vcfg.clone(),
            state.clone(),
            metrics.probe.clone(),
            stop.clone(),
            done_tx.clone(),
        )
        .with_context(|| format!("starting the probe thread of volume {:?}", vcfg.name))?;
        running.insert(vcfg.name.clone());
    }
    drop(done_tx);

    let watchdog = {
        let volumes = volumes.clone();
        let probe_metrics = metrics.probe.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                runner::check_timeouts(&volumes, &probe_metrics, Instant::now());
            }
        })
    };

    let app = router(Arc::new(AppState {
        metrics,
        telemetry_path: web.telemetry_path.clone(),
        volumes: volumes.clone(),
    }));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("HTTP server failed")?;
    watchdog.abort();

    shutdown(&stop, done_rx, running, &volumes, cfg.shutdown_timeout).await;
    Ok(())
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

/// Stops the probe threads, waits at most `timeout` for them, then removes
/// every volume's probe files whether or not its thread finished. A thread
/// stuck in a sync cannot be interrupted; it is abandoned (the process exits
/// around it) and said so in the log.
async fn shutdown(
    stop: &Stop,
    done: mpsc::Receiver<String>,
    mut running: HashSet<String>,
    volumes: &[Arc<VolumeState>],
    timeout: Duration,
) {
    stop.stop();
    let deadline = Instant::now() + timeout;
    let waited = tokio::task::spawn_blocking(move || {
        while !running.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match done.recv_timeout(left) {
                Ok(name) => {
                    running.remove(&name);
                }
                Err(_) => break,
            }
        }
        running
    })
    .await
    .unwrap_or_default();
    let now = Instant::now();
    for name in &waited {
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
    for v in volumes {
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
