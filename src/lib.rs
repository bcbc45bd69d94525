//! pg-storage-exporter: measures the IO PostgreSQL commits and reads with,
//! and serves it as Prometheus metrics. See ARCHITECTURE.md for the map.

pub mod config;
pub mod model;
pub mod types;
