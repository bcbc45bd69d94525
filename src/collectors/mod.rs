//! Collectors: tasks that refresh snapshots of what others saw (PostgreSQL
//! for now) on their own schedule. Scrapes read the latest snapshot and
//! never wait on a collector.

pub mod limits;
pub mod postgres;
