//! The running daemon: owns the volume set, the cluster set, the limits
//! state and the metrics, and is the only place that adds or removes
//! volumes (from the configuration, a reload, or discovery plans).

pub(crate) mod audit;
pub(crate) mod daemon;
pub(crate) mod discovery;
pub(crate) mod limits_inputs;
pub(crate) mod supervisor;
pub(crate) mod warnings;
