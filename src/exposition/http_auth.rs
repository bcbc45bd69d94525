//! Basic-auth password checks (`http::auth`): how many bcrypt checks ran,
//! how many run or wait now, and how many requests got none because the
//! wait queue was full or the client hung up. Registered only with
//! `--web.config.file` (`Metrics::register_auth`): an exporter without one
//! serves none of these families.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Why a request with credentials got no bcrypt check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skipped {
    /// Its client address already had its share of checks waiting: 429.
    AddressBusy,
    /// The wait queue was full of checks that rank before it: 503.
    QueueFull,
    /// The client hung up while the check waited: nothing was answered and
    /// no hash ran for it.
    ClientGone,
}

impl Skipped {
    pub(crate) const ALL: [Skipped; 3] = [
        Skipped::AddressBusy,
        Skipped::QueueFull,
        Skipped::ClientGone,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Skipped::AddressBusy => "address_busy",
            Skipped::QueueFull => "queue_full",
            Skipped::ClientGone => "client_gone",
        }
    }
}

/// Cheap to clone: all handles share the same series.
#[derive(Debug, Clone)]
pub(crate) struct AuthMetrics {
    checks: Family<ResultLabels, Counter>,
    skipped: Family<ReasonLabels, Counter>,
    in_flight: Family<StateLabels, Gauge>,
}

impl AuthMetrics {
    pub(crate) fn register(registry: &mut Registry) -> AuthMetrics {
        let m = AuthMetrics {
            checks: Family::default(),
            skipped: Family::default(),
            in_flight: Family::default(),
        };
        registry.register(
            "pgstorage_http_auth_checks",
            "bcrypt password checks run for basic auth, by result: success or failure (a wrong \
             password or an unknown user); successful checks are cached, so a scraper's repeated \
             scrapes are not counted",
            m.checks.clone(),
        );
        registry.register(
            "pgstorage_http_auth_skipped",
            "Requests with credentials that got no bcrypt check, by reason: address_busy (answered \
             429: checks from the same client address were already waiting), queue_full \
             (answered 503: the wait queue was full of checks that rank before it), client_gone \
             (the client hung up while the check waited)",
            m.skipped.clone(),
        );
        registry.register(
            "pgstorage_http_auth_checks_in_flight",
            "Password checks now, by state: running (a bcrypt hash, at most 2) or waiting for a \
             slot (at most 16)",
            m.in_flight.clone(),
        );
        m
    }

    /// Creates every series at 0, so `increase()` sees the first one.
    /// Called when basic auth can be in force (a web configuration file).
    pub(crate) fn init(&self) {
        for result in ["success", "failure"] {
            self.checks.get_or_create(&ResultLabels { result }).get();
        }
        for s in Skipped::ALL {
            self.skipped
                .get_or_create(&ReasonLabels { reason: s.as_str() })
                .get();
        }
        self.in_flight(0, 0);
    }

    pub(crate) fn in_flight(&self, running: usize, waiting: usize) {
        for (state, n) in [("running", running), ("waiting", waiting)] {
            self.in_flight
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn checked(&self, success: bool) {
        let result = if success { "success" } else { "failure" };
        self.checks.get_or_create(&ResultLabels { result }).inc();
    }

    pub(crate) fn skipped(&self, why: Skipped) {
        self.skipped
            .get_or_create(&ReasonLabels {
                reason: why.as_str(),
            })
            .inc();
    }
}
