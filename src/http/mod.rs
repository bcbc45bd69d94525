//! HTTP: metrics, health and a landing page. Handlers only encode what is in
//! memory; they never touch a disk or PostgreSQL, so a scrape is fast even
//! while a probe is stuck in a sync.
//!
//! TLS and basic auth (`--web.config.file`) live in the submodules and wrap
//! this router and listener; without them the endpoint is plain HTTP.
//! `serve.rs` accepts and serves connections under the rules of `conns.rs`.

pub(crate) mod auth;
pub(crate) mod conns;
pub(crate) mod extras;
pub(crate) mod serve;
mod state;
pub(crate) mod status;
pub(crate) mod tls;
mod watched;
pub mod web_config;

pub(crate) use state::AppState;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tower_http::CompressionLevel;
use tower_http::compression::CompressionLayer;

use crate::exposition::Format;

/// gzip level for scrape responses: the fastest. On a 282 KB scrape (8
/// volumes, 3,185 series) zlib's level 1 gives 23 KB in 3.3 ms of CPU,
/// level 6 (client_golang's) 19 KB in 13 ms (BENCHMARKS.md): 4 KB less on
/// the wire is not worth four times the CPU, on a host whose probes must
/// keep theirs, when the render itself takes about 1 ms
/// (`pgstorage_scrape_render_duration_seconds`).
pub(crate) const COMPRESSION: CompressionLevel = CompressionLevel::Fastest;

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
