//! The HTTP listeners' connections: how many are open against the cap, how
//! many the exporter closed and why, and failed accepts. `listener` is the
//! bound address (one per `--web.listen-address` or systemd socket), so the
//! label set stays as small as the command line.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    listener: String,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabels {
    listener: String,
    error: &'static str,
}

/// Cheap to clone: all handles share the same series.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionMetrics {
    open: Family<ListenerLabels, Gauge>,
    max: Family<ListenerLabels, Gauge>,
    closed: Family<ReasonLabels, Counter>,
    accept_errors: Family<ErrorLabels, Counter>,
}

impl ConnectionMetrics {
    pub(crate) fn register(registry: &mut Registry) -> ConnectionMetrics {
        let m = ConnectionMetrics::default();
        registry.register(
            "pgstorage_http_connections",
            "HTTP connections open on the listener, each holding a file descriptor (those being \
             closed, evicted or past a deadline, included)",
            m.open.clone(),
        );
        registry.register(
            "pgstorage_http_connections_max",
            "Connections the listener holds at most (--web.max-connections, lowered to fit the \
             open-file limit); at the cap each newcomer closes the connection idle longest",
            m.max.clone(),
        );
        registry.register(
            "pgstorage_http_connections_closed",
            "Connections the exporter closed before the client did, by reason: evicted (idle, \
             closed at the cap to make room for a new one), refused (new, closed at once: at the \
             cap every connection had a request in progress), header_timeout (request head or \
             TLS handshake not complete in time), idle_timeout (no new request in time after a \
             response)",
            m.closed.clone(),
        );
        registry.register(
            "pgstorage_http_accept_errors",
            "Failed accept(2) calls on the listener by errno (EMFILE, ENFILE: out of file \
             descriptors); the listener waits briefly and goes on",
            m.accept_errors.clone(),
        );
        m
    }

    /// The series of one listener, created now so that `increase()` sees
    /// the first closed connection.
    pub(crate) fn listener(
        &self,
        listener: &str,
        max: usize,
        reasons: &[&'static str],
    ) -> Listener {
        let labels = ListenerLabels {
            listener: listener.to_string(),
        };
        self.max
            .get_or_create(&labels)
            .set(i64::try_from(max).unwrap_or(i64::MAX));
        let closed = reasons
            .iter()
            .map(|&reason| {
                let c = self
                    .closed
                    .get_or_create(&ReasonLabels {
                        listener: listener.to_string(),
                        reason,
                    })
                    .clone();
                (reason, c)
            })
            .collect();
        Listener {
            name: listener.to_string(),
            open: self.open.get_or_create(&labels).clone(),
            closed,
            accept_errors: self.accept_errors.clone(),
        }
    }
}

/// One listener's series, held by its accept loop and connection tasks
/// (cloned handles: no lookup per connection).
#[derive(Debug, Clone)]
pub(crate) struct Listener {
    name: String,
    open: Gauge,
    closed: Vec<(&'static str, Counter)>,
    accept_errors: Family<ErrorLabels, Counter>,
}

impl Listener {
    pub(crate) fn opened(&self) {
        self.open.inc();
    }

    pub(crate) fn gone(&self) {
        self.open.dec();
    }

    /// A connection closed by the exporter; `reason` is one given to
    /// [`ConnectionMetrics::listener`].
    pub(crate) fn closed(&self, reason: &'static str) {
        if let Some((_, c)) = self.closed.iter().find(|(r, _)| *r == reason) {
            c.inc();
        }
    }

    /// `error` from a fixed list of errno names, so the label set stays
    /// bounded.
    pub(crate) fn accept_failed(&self, error: &'static str) {
        self.accept_errors
            .get_or_create(&ErrorLabels {
                listener: self.name.clone(),
                error,
            })
            .inc();
    }
}
