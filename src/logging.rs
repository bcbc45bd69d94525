//! Log setup: logfmt (default, like Prometheus' own exporters) or JSON, to
//! stderr, so stdout stays free for `check` output.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::cli::{LogFormat, LogLevel};

pub fn init(level: LogLevel, format: LogFormat) {
    let level = match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    };
    // Our own crate at the chosen level; dependencies one notch quieter.
    let filter = EnvFilter::new(format!("warn,pg_storage_exporter={level}"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Logfmt => registry
            .with(
                tracing_logfmt::builder()
                    .with_span_name(false)
                    .with_span_path(false)
                    .with_target(false)
                    .layer()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_target(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if let Err(e) = result {
        eprintln!("logging already initialised: {e}");
    }
}
