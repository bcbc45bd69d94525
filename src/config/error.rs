//! Why a configuration was refused, and where the setting at fault came
//! from: its own file because the file parser (`raw.rs`) reports through
//! it as well as the checks in `mod.rs`.

use std::path::PathBuf;

use thiserror::Error;

/// Where a setting came from, so an error can point at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A config file; `line` is 1-based.
    File { file: PathBuf, line: usize },
    /// A command-line flag.
    Flag(&'static str),
    /// An environment variable.
    Env(&'static str),
    /// The built-in default.
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::File { file, line } => write!(f, "{}:{line}", file.display()),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::Default => f.write_str("built-in default"),
        }
    }
}

/// Why a configuration was refused. Each variant names what to fix.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}:{column}: {key}: {message}", file.display())]
    Syntax {
        file: PathBuf,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
    /// Valid TOML with a value its key does not take (wrong type, unknown
    /// variant, a duration without a unit): counted as `invalid`.
    #[error("{}:{line}:{column}: {key}: {message}", file.display())]
    Value {
        file: PathBuf,
        line: usize,
        column: usize,
        key: String,
        message: String,
    },
    #[error("{origin}: {key}: {message}")]
    Invalid {
        origin: Origin,
        key: String,
        message: String,
    },
}

impl ConfigError {
    /// The `cause` label of `pgstorage_config_reload_errors_total`.
    pub(crate) fn cause(&self) -> &'static str {
        match self {
            ConfigError::Read { .. } => "unreadable",
            ConfigError::Syntax { .. } => "syntax",
            ConfigError::Value { .. } | ConfigError::Invalid { .. } => "invalid",
        }
    }
}
