//! pg-storage-exporter: measures the IO PostgreSQL commits and reads with,
//! and serves it as Prometheus metrics. See ARCHITECTURE.md for the map.

pub mod check;
pub mod cli;
pub mod collectors;
pub mod config;
pub mod daemon;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod probe;
pub mod supervisor;
pub mod types;
pub mod web_config;
