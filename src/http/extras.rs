//! What `--web.config.file` adds to every response besides TLS and basic
//! auth, as exporter-toolkit's handler does: a request rate limit
//! (`rate_limit`), checked before anything else, and the configured
//! response headers (`http_server_config.headers`), set on every answer
//! that passes the limit, 401s included.

use std::fmt;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The headers and the limiter in force; replaced whole on a reload.
#[derive(Default)]
pub(crate) struct Extras {
    headers: Vec<(HeaderName, HeaderValue)>,
    limiter: Option<Arc<RateLimiter>>,
}

impl fmt::Debug for Extras {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extras")
            .field("headers", &self.headers.len())
            .field("rate_limit", &self.limiter)
            .finish()
    }
}

impl Extras {
    pub(crate) fn new(
        headers: Vec<(HeaderName, HeaderValue)>,
        limiter: Option<Arc<RateLimiter>>,
    ) -> Extras {
        Extras { headers, limiter }
    }

    pub(crate) fn headers(&self) -> usize {
        self.headers.len()
    }

    pub(crate) fn rate_limit(&self) -> Option<(Duration, i64)> {
        self.limiter.as_ref().map(|l| (l.interval, l.burst))
    }
}

/// Where the middleware finds the extras in force; a reload swaps them.
pub(crate) type ExtrasSlot = Arc<RwLock<Arc<Extras>>>;

/// A token bucket with Go's `rate.Limiter` semantics, as exporter-toolkit
/// uses it: it starts full, holds at most `burst` tokens, gains one every
/// `interval`, and a request that finds less than one token is refused. A
/// `burst` of 0 or less refuses every request, as Go's does. One bucket for
/// the whole process (all listeners).
pub(crate) struct RateLimiter {
    interval: Duration,
    burst: i64,
    /// Tokens, and when they were last counted.
    state: Mutex<(f64, Instant)>,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("interval", &self.interval)
            .field("burst", &self.burst)
            .finish()
    }
}

impl RateLimiter {
    pub(crate) fn new(interval: Duration, burst: i64) -> RateLimiter {
        RateLimiter {
            interval,
            burst,
            state: Mutex::new((burst.max(0) as f64, Instant::now())),
        }
    }

    pub(crate) fn allow(&self, now: Instant) -> bool {
        if self.burst <= 0 {
            return false;
        }
        let Ok(mut s) = self.state.lock() else {
            return true;
        };
        let elapsed = now.saturating_duration_since(s.1);
        let gained = elapsed.as_secs_f64() / self.interval.as_secs_f64().max(f64::MIN_POSITIVE);
        let tokens = (s.0 + gained).min(self.burst as f64);
        s.1 = now.max(s.1);
        if tokens >= 1.0 {
            s.0 = tokens - 1.0;
            true
        } else {
            s.0 = tokens;
            false
        }
    }
}

/// Middleware: the rate limit, then the headers on whatever the inner
/// service answers. A refused request gets Go's `http.Error` answer: 429
/// with the status text, and none of the configured headers (the toolkit
/// sets them after its limiter).
pub(crate) async fn apply(State(slot): State<ExtrasSlot>, req: Request, next: Next) -> Response {
    let extras = slot.read().map(|e| e.clone()).unwrap_or_default();
    if let Some(l) = &extras.limiter
        && !l.allow(Instant::now())
    {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            "Too Many Requests\n",
        )
            .into_response();
    }
    let mut resp = next.run(req).await;
    for (name, value) in &extras.headers {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_starts_full_and_refills_one_token_per_interval() {
        let l = RateLimiter::new(Duration::from_secs(1), 3);
        let t0 = Instant::now();
        assert!(l.allow(t0) && l.allow(t0) && l.allow(t0));
        assert!(!l.allow(t0));
        assert!(!l.allow(t0 + Duration::from_millis(500)));
        assert!(l.allow(t0 + Duration::from_millis(1000)));
        assert!(!l.allow(t0 + Duration::from_millis(1100)));
        // Never more than the burst, however long it waited.
        let later = t0 + Duration::from_secs(100);
        assert!(l.allow(later) && l.allow(later) && l.allow(later));
        assert!(!l.allow(later));
    }

    #[test]
    fn a_burst_of_zero_refuses_everything() {
        let l = RateLimiter::new(Duration::from_secs(1), 0);
        let t0 = Instant::now();
        assert!(!l.allow(t0));
        assert!(!l.allow(t0 + Duration::from_secs(10)));
    }
}
