//! Configuration reload metrics, named like Prometheus's own
//! (`prometheus_config_last_reload_successful`), so the usual alert on a
//! failed reload carries over.

use std::sync::atomic::AtomicU64;

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
struct CauseLabels {
    cause: &'static str,
}

/// Cheap to clone: all handles share the same series.
#[derive(Debug, Clone)]
pub(crate) struct ConfigMetrics {
    reloads: Family<ResultLabels, Counter>,
    errors: Family<CauseLabels, Counter>,
    last_ok: Gauge,
    last_success: Gauge<f64, AtomicU64>,
}

/// Causes of a refused reload, created at start so `increase()` sees the
/// first failure.
pub(crate) const CAUSES: [&str; 4] = ["unreadable", "syntax", "invalid", "timeout"];

impl ConfigMetrics {
    pub(crate) fn register(registry: &mut Registry) -> ConfigMetrics {
        let m = ConfigMetrics {
            reloads: Family::default(),
            errors: Family::default(),
            last_ok: Gauge::default(),
            last_success: Gauge::default(),
        };
        registry.register(
            "pgstorage_config_reloads",
            "Configuration reloads (SIGHUP) by result: success or failure",
            m.reloads.clone(),
        );
        registry.register(
            "pgstorage_config_reload_errors",
            "Refused configuration reloads by cause: unreadable (the file cannot be read), syntax \
             (not TOML, an unknown or missing key), invalid (a value of the wrong type, not \
             accepted or out of range, or a filesystem fact), timeout (reading and checking the files \
             did not finish in time); the running configuration is kept",
            m.errors.clone(),
        );
        registry.register(
            "pgstorage_config_last_reload_successful",
            "1 if the last configuration load (the start or a SIGHUP reload) was applied, 0 if it \
             was refused and an older configuration is running",
            m.last_ok.clone(),
        );
        registry.register(
            "pgstorage_config_last_reload_success_timestamp_seconds",
            "Unix time of the last configuration load that was applied",
            m.last_success.clone(),
        );
        for result in ["success", "failure"] {
            m.reloads.get_or_create(&ResultLabels { result }).get();
        }
        for cause in CAUSES {
            m.errors.get_or_create(&CauseLabels { cause }).get();
        }
        m
    }

    /// The configuration in force was loaded at start.
    pub(crate) fn loaded(&self) {
        self.last_ok.set(1);
        self.last_success.set(unix_now());
    }

    pub(crate) fn reloaded(&self) {
        self.reloads
            .get_or_create(&ResultLabels { result: "success" })
            .inc();
        self.loaded();
    }

    pub(crate) fn refused(&self, cause: &'static str) {
        self.reloads
            .get_or_create(&ResultLabels { result: "failure" })
            .inc();
        self.errors.get_or_create(&CauseLabels { cause }).inc();
        self.last_ok.set(0);
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
