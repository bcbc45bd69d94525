//! pg-storage-exporter: measures the IO PostgreSQL commits and reads with,
//! and serves it as Prometheus metrics. See ARCHITECTURE.md for the map.

pub mod app;
pub mod check;
pub mod cli;
pub mod config;
pub mod events;
pub mod exposition;
pub mod families;
pub mod http;
pub mod limits;
pub mod logging;
pub mod model;
pub mod postgres;
pub mod probe;
pub mod types;
pub mod units;
