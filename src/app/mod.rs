//! The running daemon: owns the volume set, the cluster set, the limits
//! state and the metrics, and is the only place that adds or removes
//! volumes (from the configuration, a reload, or discovery plans).

pub mod audit;
pub mod daemon;
pub mod discovery;
pub mod limits_inputs;
pub mod supervisor;
pub mod warnings;
