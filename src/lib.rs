//! pg-storage-exporter: measures the IO PostgreSQL commits and reads with,
//! and serves it as Prometheus metrics. See ARCHITECTURE.md for the map.

// Code the compiler cannot check lives in `sys` alone, behind safe
// interfaces with their arguments written next to them.
#![deny(unsafe_code)]

pub mod app;
pub mod audit;
pub mod check;
pub mod cli;
pub mod config;
pub mod entry;
pub(crate) mod errno;
pub mod events;
pub mod exposition;
pub mod families;
pub mod http;
pub mod input;
pub mod limits;
pub mod logging;
pub mod model;
pub mod postgres;
pub mod probe;
#[allow(unsafe_code)]
pub mod sys;
pub mod types;
pub mod units;
