//! The integration suite: one test binary, so the harness in [`common`] is
//! compiled once and every module shares it. Each module is one area of the
//! product (its doc says what it drives and on what real parts); the
//! harness starts the real binary, real PostgreSQL servers, loop devices,
//! cgroups, Prometheus and Chromium.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod architecture;
mod audit;
mod check;
mod citations;
mod collectors;
mod daemon;
mod dashboards;
mod default_run;
mod e2e_prometheus;
mod ebs_fixture;
mod ebs_hardware;
mod faults;
mod golden;
mod hung_sync;
mod limits;
mod limits_fixture;
mod man_page;
mod manifests;
mod parsers_fuzz;
mod pg_harness;
mod pg_syncs;
mod postgres;
mod postgres_faults;
mod reload;
mod rules;
mod scrape_storm;
mod startup;
mod status_page;
mod sweep_caps;
mod web_config;
mod web_toolkit;
