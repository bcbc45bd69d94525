//! HTTP: metrics, health and a landing page. Handlers only encode what is in
//! memory; they never touch a disk or PostgreSQL, so a scrape is fast even
//! while a probe is stuck in a sync.
//!
//! TLS and basic auth (`--web.config.file`) live in the submodules and wrap
//! this router and listener; without them the endpoint is plain HTTP.
//! `serve.rs` accepts and serves connections under the rules of `conns.rs`.

pub(crate) mod auth;
pub(crate) mod conns;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod tls;
pub mod web_config;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower_http::CompressionLevel;
use tower_http::compression::CompressionLayer;

use crate::exposition::{Format, Metrics};

/// gzip level for scrape responses: the fastest. On a 282 KB scrape (8
/// volumes, 3,185 series) zlib's level 1 gives 23 KB in 3.3 ms of CPU,
/// level 6 (client_golang's) 19 KB in 13 ms (BENCHMARKS.md): 4 KB less on
/// the wire is not worth four times the CPU, on a host whose probes must
/// keep theirs, when the render itself takes about 1 ms
/// (`pgstorage_scrape_render_duration_seconds`).
pub(crate) const COMPRESSION: CompressionLevel = CompressionLevel::Fastest;

#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) telemetry_path: String,
    pub(crate) renders: Renders,
}

/// Concurrent scrapes share renders: a scrape is answered with a render
/// that began after it arrived (so it is never older than the request),
/// and while one render runs, the scrapes arriving meanwhile wait for the
/// next one instead of starting their own. However many scrapers there
/// are, at most one render per format runs at a time, so a scrape storm
/// costs the host one core at most and the probe threads keep theirs.
#[derive(Debug, Default)]
pub(crate) struct Renders {
    slots: [tokio::sync::Mutex<Option<Rendered>>; 2],
}

#[derive(Debug)]
struct Rendered {
    started: Instant,
    body: Bytes,
}

impl Renders {
    pub(crate) async fn get(
        &self,
        metrics: &Arc<Metrics>,
        format: Format,
    ) -> Result<Bytes, String> {
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
        // Encoded right here on the async worker, not handed to a blocking
        // thread: the render is under a millisecond of CPU (2 clusters, 8
        // volumes), and on a VM each hand-over between threads costs a
        // wake-up of an idle vCPU. bench/encode_ab, side by side, 3 rounds:
        // CPU per scrape 0.95-0.97 against 1.20-1.27 ms with
        // `spawn_blocking`, GET p50 1.22-1.31 against 1.38-1.63 ms. The
        // encode touches only memory and /proc/self (no lock is held for
        // long: probe threads take the window locks for a push), and at most
        // one render per format runs at a time, so of the two workers one
        // is always free for connections and the PostgreSQL collectors.
        let mut out = slot.take().map(|r| reclaim(r.body)).unwrap_or_default();
        metrics
            .encode_into(&mut out, format)
            .map_err(|e| e.to_string())?;
        let body = Bytes::from(out);
        *slot = Some(Rendered {
            started,
            body: body.clone(),
        });
        Ok(body)
    }
}

/// The previous body's buffer, for the next render to write into, when no
/// response still holds it (the usual case: scrapes are seconds apart and a
/// response is sent in microseconds); an empty String otherwise, which
/// `Metrics::encode_into` sizes from the last body's length. Reusing it
/// saves the allocation of a ~200 KB body and the free of the previous
/// one on every render. No copy either way: a unique `Bytes` made from a
/// `Vec` gives that `Vec` back.
fn reclaim(body: Bytes) -> String {
    match body.try_into_mut() {
        Ok(buf) => {
            let mut v = Vec::from(buf);
            v.clear();
            // Empty, so valid UTF-8: this cannot fail.
            String::from_utf8(v).unwrap_or_default()
        }
        Err(_) => String::new(),
    }
}

pub(crate) fn router(state: Arc<AppState>) -> Router {
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
        .route("/", get(status::page))
        .with_state(state)
}

/// Puts every route, the fallback included, behind basic auth:
/// exporter-toolkit protects all paths, and so does this. The wait queue of
/// the password checks ranks clients by address: `serve` puts each
/// request's `ConnectInfo<ClientAddr>` in place.
pub(crate) fn with_basic_auth(router: Router, guard: auth::Guard) -> Router {
    router.layer(axum::middleware::from_fn_with_state(guard, auth::require))
}

/// The peer address of a connection, as `ConnectInfo`, for every listener
/// (plain TCP, systemd's sockets, TLS).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientAddr(pub(crate) SocketAddr);

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
