//! HTTP: metrics, health and a landing page. Handlers only encode what is in
//! memory; they never touch a disk or PostgreSQL, so a scrape is fast even
//! while a probe is stuck in a sync.
//!
//! TLS and basic auth (`--web.config.file`) live in the submodules and wrap
//! this router and listener; without them the endpoint is plain HTTP.

pub mod auth;
pub mod tls;
pub mod web_config;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tower_http::CompressionLevel;
use tower_http::compression::CompressionLayer;

use crate::exposition::{Format, Metrics};
use crate::probe::set::VolumeSet;
use crate::types::{Op, Phase};

/// gzip level for scrape responses: the fastest. On a 282 KB scrape (8
/// volumes, 3,185 series) zlib's level 1 gives 23 KB in 3.3 ms of CPU,
/// level 6 (client_golang's) 19 KB in 13 ms (BENCHMARKS.md): 4 KB less on
/// the wire is not worth four times the CPU, on a host whose probes must
/// keep theirs, when the render itself takes 2 ms.
pub const COMPRESSION: CompressionLevel = CompressionLevel::Fastest;

#[derive(Debug)]
pub struct AppState {
    pub metrics: Arc<Metrics>,
    pub telemetry_path: String,
    pub volumes: Arc<VolumeSet>,
    pub renders: Renders,
}

/// Concurrent scrapes share renders: a scrape is answered with a render
/// that began after it arrived (so it is never older than the request),
/// and while one render runs, the scrapes arriving meanwhile wait for the
/// next one instead of starting their own. However many scrapers there
/// are, at most one render per format runs at a time, so a scrape storm
/// costs the host one core at most and the probe threads keep theirs.
#[derive(Debug, Default)]
pub struct Renders {
    slots: [tokio::sync::Mutex<Option<Rendered>>; 2],
}

#[derive(Debug)]
struct Rendered {
    started: Instant,
    body: Bytes,
}

impl Renders {
    pub async fn get(&self, metrics: &Arc<Metrics>, format: Format) -> Result<Bytes, String> {
        let arrived = Instant::now();
        let idx = match format {
            Format::Prometheus => 0,
            Format::OpenMetrics => 1,
        };
        // tokio's Mutex is fair (FIFO): nobody waits behind later arrivals.
        let mut slot = self.slots[idx].lock().await;
        if let Some(r) = slot.as_ref()
            && r.started >= arrived
        {
            return Ok(r.body.clone());
        }
        let started = Instant::now();
        let m = metrics.clone();
        // Encoding takes a millisecond or more: off the async workers, so
        // accepting connections and the PostgreSQL collectors never wait
        // for it.
        let body = tokio::task::spawn_blocking(move || m.encode(format))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let body = Bytes::from(body);
        *slot = Some(Rendered {
            started,
            body: body.clone(),
        });
        Ok(body)
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let path = state.telemetry_path.clone();
    Router::new()
        // gzip when the scraper asks for it (Prometheus always does), as
        // client_golang's handler does; identity otherwise. Each response
        // is compressed on its own: the coalesced render is shared, its
        // compression is not (see COMPRESSION for the cost).
        .route(
            &path,
            get(metrics).layer(CompressionLayer::new().gzip(true).quality(COMPRESSION)),
        )
        .route("/healthz", get(healthz))
        .route("/", get(landing))
        .with_state(state)
}

/// Puts every route, the fallback included, behind basic auth:
/// exporter-toolkit protects all paths, and so does this.
pub fn with_basic_auth(router: Router, auth: auth::AuthSlot) -> Router {
    router.layer(axum::middleware::from_fn_with_state(auth, auth::require))
}

async fn metrics(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    match s.renders.get(&s.metrics, format).await {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding metrics failed\n",
            )
                .into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn landing(State(s): State<Arc<AppState>>) -> Html<String> {
    let now = Instant::now();
    let mut rows = String::new();
    for v in &s.volumes.list() {
        let snap = v.snapshot(now, &[0.5, 0.99]);
        let q = |op: Op, phase: Phase, k: usize| {
            snap.quantiles(op, phase)
                .and_then(|q| q.get(k))
                .map(|x| crate::model::verdict::fmt_seconds(*x))
                .unwrap_or_else(|| "-".to_string())
        };
        let probes = match (v.commit_probe, v.read_probe) {
            (true, true) => "commit, read",
            (true, false) => "commit",
            (false, true) => "read",
            _ => "",
        };
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{} / {}</td><td>{} / {}</td><td>{} / {}</td></tr>",
            esc(&v.name),
            esc(&v.path.display().to_string()),
            esc(&snap.fs.device),
            esc(&snap.fs.fstype),
            snap.engine.map(|e| e.as_str()).unwrap_or("starting"),
            if v.commit_probe {
                v.sync_method.as_str()
            } else {
                "-"
            },
            probes,
            q(Op::Commit, Phase::Busy, 0),
            q(Op::Commit, Phase::Busy, 1),
            q(Op::Commit, Phase::AfterIdle, 0),
            q(Op::Commit, Phase::AfterIdle, 1),
            q(Op::Read, Phase::Busy, 0),
            q(Op::Read, Phase::Busy, 1),
            q(Op::Read, Phase::AfterIdle, 0),
            q(Op::Read, Phase::AfterIdle, 1),
        );
    }
    let path = esc(&s.telemetry_path);
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>pg-storage-exporter</title>\
         <style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:left}}</style></head><body>\
         <h1>pg-storage-exporter {version}</h1>\
         <p>Measures the IO PostgreSQL commits and reads with, per volume.</p>\
         <ul><li><a href=\"{path}\">{path}</a> metrics</li><li><a href=\"/healthz\">/healthz</a></li></ul>\
         <h2>Volumes</h2><table><tr><th>volume</th><th>path</th><th>device (fs)</th><th>engine</th>\
         <th>sync method</th><th>probes</th><th>commit p50 / p99, busy</th><th>commit p50 / p99, after idle</th>\
         <th>read p50 / p99, busy</th><th>read p50 / p99, after idle</th></tr>{rows}</table>\
         <p>Busy: the second half of each burst of back-to-back probes, what an IO costs while the \
         storage is busy. After idle: the lone probe of each interval, what an IO costs after a pause.</p>\
         </body></html>",
        version = env!("CARGO_PKG_VERSION"),
    ))
}
