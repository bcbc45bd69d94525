//! pg-storage-exporter: measures the IO PostgreSQL commits and reads with,
//! and serves it as Prometheus metrics. See ARCHITECTURE.md for the map.

// Code the compiler cannot check lives in `sys` alone, behind safe
// interfaces with their arguments written next to them.
#![deny(unsafe_code)]

pub(crate) mod app;
pub mod audit;
pub(crate) mod check;
pub(crate) mod cli;
pub mod config;
pub(crate) mod ebpf;
pub mod entry;
pub(crate) mod errno;
pub(crate) mod events;
pub(crate) mod exposition;
pub(crate) mod families;
pub mod http;
pub(crate) mod input;
pub mod limits;
pub(crate) mod logging;
pub mod model;
pub mod postgres;
pub mod probe;
#[allow(unsafe_code)]
pub(crate) mod sys;
pub(crate) mod types;
pub mod units;
