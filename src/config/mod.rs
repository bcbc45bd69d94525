//! Configuration: what the user wrote (TOML file and flags), validated into
//! typed settings before anything is opened, bound or probed.
//!
//! Two phases, as in ripgrep: [`raw`] mirrors the file exactly (serde with
//! `deny_unknown_fields`, every value spanned so errors can name the line),
//! then `build` merges defaults, checks values and the filesystem facts a
//! volume depends on, and returns `Config` or one [`ConfigError`].

mod error;
pub mod raw;

pub use error::{ConfigError, Origin};

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::limits::LimitsSettings;
use crate::probe::placement::{Asker, check_probe_dir};
use crate::probe::settings::{
    BURST_READS, Knob, MAX_WINDOW_SAMPLES, PROBE_DIR_NAME, ProbeSettings, VolumeSpec,
    window_samples,
};
use crate::types::{Collector, Collectors, EngineChoice, Resource, Shown, SyncMethod};
use raw::{RawConfig, RawVolume, RawVolumeDefaults, Sp};

/// Where the exporter probes when given no volume at all: /var/tmp is on
/// persistent storage on common distributions (unlike /tmp, often tmpfs),
/// writable by any user, and not cleaned at boot.
pub(crate) const DEFAULT_VOLUME_PATH: &str = "/var/tmp";
pub(crate) const DEFAULT_VOLUME_NAME: &str = "default";

pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(15 * 60);
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Validated configuration of the daemon.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) window: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) volumes: Vec<VolumeSpec>,
    pub(crate) clusters: Vec<ClusterConfig>,
    /// Settings for volumes discovered at run time: `[defaults]` with the
    /// `--probe.*` flags on top (the sync method follows the cluster).
    pub(crate) volume_defaults: ProbeSettings,
    pub(crate) limits: LimitsSettings,
    /// `--collector.*` / `--no-collector.*`: fixed at start (flags are not
    /// read again on reload).
    pub(crate) collectors: Collectors,
    pub(crate) audit: AuditSettings,
}

/// The storage-configuration audit's schedule and silenced codes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AuditSettings {
    pub(crate) interval: Duration,
    /// `[audit] ignore`: silenced everywhere, host findings included.
    pub(crate) ignore: Vec<String>,
    /// `audit.ignore` of each `[[volume]]`, by volume name.
    pub(crate) volumes: std::collections::BTreeMap<String, Vec<String>>,
    /// `audit.ignore` of each `[[cluster]]`, by cluster name.
    pub(crate) clusters: std::collections::BTreeMap<String, Vec<String>>,
    /// `host_root`: where the host's root filesystem is seen, for its
    /// boot-time sysctl configuration (`/` unless in a container).
    pub(crate) host_root: PathBuf,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            interval: DEFAULT_AUDIT_INTERVAL,
            ignore: Vec::new(),
            volumes: Default::default(),
            clusters: Default::default(),
            host_root: PathBuf::from("/"),
        }
    }
}

impl AuditSettings {
    /// The codes silenced for a volume: the global list, its own (when it
    /// is a `[[volume]]`) and those of the clusters whose data directory,
    /// WAL or tablespaces are on it (`of_clusters`): a discovered volume
    /// has no table of its own, and the cluster's table is where its owner
    /// writes down a deliberate choice.
    pub(crate) fn for_volume(&self, name: &str, of_clusters: &[&str]) -> Vec<String> {
        let mut v = self.ignore.clone();
        v.extend(self.volumes.get(name).into_iter().flatten().cloned());
        for c in of_clusters {
            v.extend(self.clusters.get(*c).into_iter().flatten().cloned());
        }
        v.sort();
        v.dedup();
        v
    }

    pub(crate) fn for_cluster(&self, name: &str) -> Vec<String> {
        let mut v = self.ignore.clone();
        v.extend(self.clusters.get(name).into_iter().flatten().cloned());
        v
    }
}

/// Slow on purpose: the configuration it reads changes by hand, rarely.
pub(crate) const DEFAULT_AUDIT_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// Each limits pass reads some twenty cgroup, /proc and /sys files on a
/// blocking thread: about 1 ms of CPU on a 2-vCPU virtual machine, most of
/// it the wakeups. Every 10 s that was 6.6 ms/min, a sixth of the
/// exporter's and its backend's whole cost on an idle host (measured:
/// async threads 9.7 → 4.2 ms/min at 60 s); 30 s keeps a reading for every
/// other scrape at 15 s, and the limits it reads change by hand.
pub(crate) const DEFAULT_LIMITS_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_SCRAPE_INTERVAL: Duration = Duration::from_secs(15);
pub(crate) const DEFAULT_WAIT_SAMPLING_INTERVAL: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A PostgreSQL cluster to watch, with its connection target resolved.
#[derive(Debug, Clone)]
pub(crate) struct ClusterConfig {
    pub(crate) collector: crate::postgres::ClusterConfig,
    pub(crate) target: crate::postgres::dsn::Target,
}

/// A volume that insists on io_uring on a host that forbids it is a
/// configuration problem, found before anything is started: the message
/// names the volume (or the discovered volumes' defaults).
pub(crate) fn engine_problem(cfg: &Config) -> Option<String> {
    let discovered = (!cfg.clusters.is_empty()).then(|| {
        (
            "volumes discovered from PostgreSQL".to_string(),
            cfg.volume_defaults.engine,
        )
    });
    cfg.volumes
        .iter()
        .map(|v| (format!("volume {:?}", v.name), v.probe.engine))
        .chain(discovered)
        .find_map(|(what, engine)| {
            crate::probe::engine::require(engine)
                .err()
                .map(|e| format!("{what} sets engine = \"io_uring\": {e}"))
        })
}

/// Settings given on the command line that shape volumes.
#[derive(Debug, Clone, Default)]
pub(crate) struct FlagOverrides {
    /// `--probe.path [NAME=]PATH`, in order.
    pub(crate) probe_paths: Vec<String>,
    pub(crate) engine: Option<EngineChoice>,
    pub(crate) sync_method: Option<SyncMethod>,
    pub(crate) interval: Option<Duration>,
    pub(crate) busy_every: Option<Duration>,
    pub(crate) read_file_size: Option<u64>,
    pub(crate) free_space_reserve: Option<u64>,
    /// `--pg.dsn [NAME=]DSN`, in order.
    pub(crate) pg_dsns: Vec<String>,
    /// `DATA_SOURCE_NAME` (`[NAME=]DSN`), when set and not blank: one more
    /// cluster after the `--pg.dsn` ones.
    pub(crate) data_source_name: Option<String>,
    /// `--pg.scrape-interval` for clusters from flags.
    pub(crate) pg_scrape_interval: Option<Duration>,
    /// `--no-pg.discover-volumes`.
    pub(crate) pg_no_discovery: bool,
    /// `--collector.*` / `--no-collector.*`.
    pub(crate) collectors: Collectors,
}

/// Loads and validates the configuration from an optional file plus flags.
pub(crate) fn load(file: Option<&Path>, flags: &FlagOverrides) -> Result<Config, ConfigError> {
    let raw = match file {
        Some(path) => {
            let text = crate::input::read_to_string(path, crate::input::Kind::Config).map_err(
                |source| ConfigError::Read {
                    file: path.to_path_buf(),
                    source,
                },
            )?;
            Some((path.to_path_buf(), text))
        }
        None => None,
    };
    match raw {
        Some((path, text)) => {
            let parsed = raw::parse(&path, &text)?;
            build(Some((&path, &text)), parsed, flags)
        }
        None => build(None, RawConfig::default(), flags),
    }
}

/// Turns a parsed file and flags into a validated [`Config`].
pub(crate) fn build(
    file: Option<(&Path, &str)>,
    raw: RawConfig,
    flags: &FlagOverrides,
) -> Result<Config, ConfigError> {
    let at = |span: Option<std::ops::Range<usize>>| -> Origin {
        match (file, span) {
            (Some((f, text)), Some(s)) => Origin::File {
                file: f.to_path_buf(),
                line: raw::line_of(text, s.start),
            },
            _ => Origin::Default,
        }
    };

    paths_without_nul(&raw, &at)?;

    let window = top_duration(&raw.window, Knob::Window, DEFAULT_WINDOW, &at)?;
    let shutdown_timeout = top_duration(
        &raw.shutdown_timeout,
        Knob::ShutdownTimeout,
        DEFAULT_SHUTDOWN_TIMEOUT,
        &at,
    )?;

    let no_defaults = RawVolumeDefaults::default();
    let defaults = raw.defaults.as_ref().unwrap_or(&no_defaults);
    let env = |k: &str| std::env::var(k).ok();
    let clusters = clusters(&raw.cluster, flags, &at, &env)?;
    let probes = flags.collectors.on(Collector::Probes);
    let (mut volumes, flagged) = volume_specs(&raw, defaults, flags, clusters.is_empty(), &at)?;
    volumes_apart(&raw, &volumes, window, &at)?;

    // Discovered volumes take [defaults], then the --probe.* flags, like
    // --probe.path volumes (their sync method follows the cluster instead).
    let volume_defaults = flagged;
    if !clusters.is_empty()
        && let Some(why) = window_too_big(window, &volume_defaults, "on the discovered volumes")
    {
        return Err(invalid(
            at(raw.window.as_ref().map(|w| w.span())),
            "window",
            why,
        ));
    }
    let limits = LimitsSettings {
        interval: top_duration(
            &raw.limits_interval,
            Knob::LimitsInterval,
            DEFAULT_LIMITS_INTERVAL,
            &at,
        )?,
        cgroup_root: root(&raw.cgroup_root, "/sys/fs/cgroup"),
        proc_root: root(&raw.proc_root, "/proc"),
        sys_root: root(&raw.sys_root, "/sys"),
    };
    let audit = audit_settings(&raw, &at)?;
    // --no-collector.probes: everything above is still validated (a
    // mistake in the file is reported now, not when probes are turned on
    // again), then nothing is probed.
    if !probes {
        volumes.clear();
    }
    Ok(Config {
        window,
        shutdown_timeout,
        volumes,
        clusters,
        volume_defaults,
        limits,
        collectors: flags.collectors,
        audit,
    })
}

fn invalid(origin: Origin, key: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin,
        key: key.to_string(),
        message,
    }
}

/// A top-level duration key, checked against its knob's range, or its
/// default.
fn top_duration(
    v: &Option<Sp<crate::units::HumanDuration>>,
    knob: Knob,
    default: Duration,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<Duration, ConfigError> {
    match v {
        Some(x) => knob
            .check_written(x.get_ref().0)
            .map_err(|message| invalid(at(Some(x.span())), knob.range().key, message)),
        None => Ok(default),
    }
}

/// A `*_root` key made absolute, or its default.
fn root(p: &Option<Sp<PathBuf>>, default: &str) -> PathBuf {
    p.as_ref()
        .map(|p| absolute(p.get_ref()))
        .unwrap_or_else(|| PathBuf::from(default))
}

/// The volumes to probe: the `[[volume]]` tables, then the `--probe.path`
/// ones, then the embedded default volume when nothing else says what to
/// probe; with the validated "[defaults] + --probe.* flags" settings
/// (`no_clusters`: no cluster discovers volumes either).
fn volume_specs(
    raw: &RawConfig,
    defaults: &RawVolumeDefaults,
    flags: &FlagOverrides,
    no_clusters: bool,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<(Vec<VolumeSpec>, ProbeSettings), ConfigError> {
    let mut volumes = Vec::new();
    for (i, v) in raw.volume.iter().enumerate() {
        volumes.push(volume_from_file(i, v, defaults, at)?);
    }
    // One validated "[defaults] + --probe.* flags" for --probe.path volumes
    // and discovered volumes alike, so a bad flag is refused whichever of
    // them it would reach.
    let flagged = flag_settings(defaults, flags, at)?;
    for spec in &flags.probe_paths {
        volumes.push(volume_from_flag(spec, &flagged)?);
    }
    // The embedded default volume only when nothing else says what to probe:
    // with clusters, discovery does.
    if volumes.is_empty() && no_clusters && flags.collectors.on(Collector::Probes) {
        let mut v = volume_from_flag(
            &format!("{DEFAULT_VOLUME_NAME}={DEFAULT_VOLUME_PATH}"),
            &flagged,
        )?;
        v.name = DEFAULT_VOLUME_NAME.to_string();
        volumes.push(v);
    }
    Ok((volumes, flagged))
}

/// Refuses two volumes with one name or one probe directory, and a volume
/// whose window would hold too many samples.
fn volumes_apart(
    raw: &RawConfig,
    volumes: &[VolumeSpec],
    window: Duration,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<(), ConfigError> {
    let mut names = HashSet::new();
    let mut probe_dirs = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let origin = raw
            .volume
            .get(i)
            .map(|r| at(Some(r.name.span())))
            .unwrap_or(Origin::Flag("--probe.path"));
        if !names.insert(v.name.clone()) {
            return Err(invalid(
                origin,
                "volume.name",
                format!(
                    "duplicate volume name {:?}: names label every metric and must be unique",
                    v.name
                ),
            ));
        }
        if !probe_dirs.insert(v.probe_dir.clone()) {
            return Err(invalid(
                origin,
                "volume.probe_dir",
                format!(
                    "probe directory {} is used by two volumes; give each its own",
                    v.probe_dir.display()
                ),
            ));
        }
        if let Some(why) = window_too_big(window, &v.probe, &format!("on volume {:?}", v.name)) {
            return Err(invalid(origin, "window", why));
        }
    }
    Ok(())
}

/// The audit's schedule and silenced codes: `[audit]`, and the
/// `audit.ignore` of each `[[volume]]` and `[[cluster]]`.
fn audit_settings(
    raw: &RawConfig,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<AuditSettings, ConfigError> {
    // An unknown code in an ignore list is refused rather than silently
    // ignoring nothing: a typo would otherwise keep paging.
    let ignore_list =
        |a: &Option<raw::RawAudit>, key: String| -> Result<Vec<String>, ConfigError> {
            let mut out = Vec::new();
            for code in a.iter().flat_map(|a| &a.ignore) {
                if crate::audit::check(code.get_ref()).is_none() {
                    return Err(invalid(
                        at(Some(code.span())),
                        &key,
                        format!(
                            "unknown audit code {:?}; the codes are listed in docs/audit.md",
                            code.get_ref()
                        ),
                    ));
                }
                out.push(code.get_ref().clone());
            }
            Ok(out)
        };
    let mut audit = AuditSettings {
        interval: top_duration(
            &raw.audit_interval,
            Knob::AuditInterval,
            DEFAULT_AUDIT_INTERVAL,
            at,
        )?,
        ignore: ignore_list(&raw.audit, "audit.ignore".to_string())?,
        host_root: root(&raw.host_root, "/"),
        ..AuditSettings::default()
    };
    for (i, v) in raw.volume.iter().enumerate() {
        let codes = ignore_list(&v.audit, format!("volume[{i}].audit.ignore"))?;
        if !codes.is_empty() {
            audit.volumes.insert(v.name.get_ref().clone(), codes);
        }
    }
    for (i, c) in raw.cluster.iter().enumerate() {
        let codes = ignore_list(&c.audit, format!("cluster[{i}].audit.ignore"))?;
        if !codes.is_empty() {
            audit.clusters.insert(c.name.get_ref().clone(), codes);
        }
    }
    Ok(audit)
}

/// Why `window` would hold too many samples per op at these probe settings
/// (`whose`: which volumes, for the message), or `None` when it fits.
fn window_too_big(window: Duration, probe: &ProbeSettings, whose: &str) -> Option<String> {
    let samples = window_samples(window, probe.interval, probe.busy_every);
    (samples > MAX_WINDOW_SAMPLES as f64).then(|| {
        format!(
            "a {window:?} window at a {:?} interval and a {:?} busy_every keeps up to {samples:.0} samples \
             per op {whose}; the maximum is {MAX_WINDOW_SAMPLES}: shorten the window, or lengthen the \
             interval or busy_every (a burst records up to {} reads)",
            probe.interval,
            probe.busy_every,
            BURST_READS.most_recorded()
        )
    })
}

/// Cluster names label every PostgreSQL series and prefix discovered
/// volume names (`<cluster>/wal`): same rules as volume names, minus `/`.
pub(crate) fn validate_cluster_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 48 {
        return Err(format!(
            "invalid cluster name {name:?}: use 1 to 48 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "invalid cluster name {name:?}: character {c:?} not allowed (use letters, digits, _ - .)"
        ));
    }
    Ok(())
}

/// Refuses a path holding a NUL byte (TOML's `\u0000`), naming its key and
/// showing the byte escaped: no file name can hold one (a system call would
/// cut the path there), and written raw it would reach a terminal or log.
fn paths_without_nul(
    raw: &RawConfig,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<(), ConfigError> {
    let top = [
        ("cgroup_root", &raw.cgroup_root),
        ("proc_root", &raw.proc_root),
        ("sys_root", &raw.sys_root),
        ("host_root", &raw.host_root),
    ]
    .into_iter()
    .map(|(k, p)| (k.to_string(), p));
    let volumes = raw.volume.iter().enumerate().flat_map(|(i, v)| {
        [
            (format!("volume[{i}].path"), Some(&v.path)),
            (format!("volume[{i}].probe_dir"), v.probe_dir.as_ref()),
        ]
    });
    let clusters = raw.cluster.iter().enumerate().map(|(i, c)| {
        (
            format!("cluster[{i}].password_file"),
            c.password_file.as_ref(),
        )
    });
    for (key, p) in top
        .map(|(k, p)| (k, p.as_ref()))
        .chain(volumes)
        .chain(clusters)
    {
        let Some(p) = p else { continue };
        if p.get_ref().as_os_str().as_encoded_bytes().contains(&0) {
            return Err(ConfigError::Invalid {
                origin: at(Some(p.span())),
                key,
                message: format!(
                    "the path {} contains a NUL byte (shown as \\0), which no file name can hold",
                    Shown(p.get_ref())
                ),
            });
        }
    }
    Ok(())
}

fn clusters(
    raw: &[raw::RawCluster],
    flags: &FlagOverrides,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
    env: crate::postgres::dsn::Env<'_>,
) -> Result<Vec<ClusterConfig>, ConfigError> {
    let mut out: Vec<ClusterConfig> = Vec::new();
    // Where each cluster's name comes from, for a duplicate: the origin,
    // and how the name was given. Never the DSN: it may hold a password.
    let mut named: Vec<(Origin, String)> = Vec::new();
    for (i, c) in raw.iter().enumerate() {
        let (cluster, how) = cluster_from_file(i, c, flags, at, env)?;
        out.push(cluster);
        named.push(how);
    }
    if let Some(i) = flags.pg_scrape_interval {
        Knob::ScrapeInterval
            .check_duration(i)
            .map_err(|message| ConfigError::Invalid {
                origin: Origin::Flag("--pg.scrape-interval"),
                key: format!("{i:?}"),
                message,
            })?;
    }
    clusters_from_flags(flags, env, &mut out, &mut named)?;
    unique_cluster_names(&out, &named)?;
    Ok(out)
}

/// The `[[cluster]]` table `i`, with where its name comes from (origin,
/// and how it was given).
fn cluster_from_file(
    i: usize,
    c: &raw::RawCluster,
    flags: &FlagOverrides,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
    env: crate::postgres::dsn::Env<'_>,
) -> Result<(ClusterConfig, (Origin, String)), ConfigError> {
    use crate::postgres::{ClusterConfig as Collector, dsn};
    let key = |k: &str| format!("cluster[{i}].{k}");
    let invalid = |span: std::ops::Range<usize>, k: &str, message: String| ConfigError::Invalid {
        origin: at(Some(span)),
        key: key(k),
        message,
    };
    let name = c.name.get_ref().clone();
    validate_cluster_name(&name).map_err(|m| invalid(c.name.span(), "name", m))?;
    let origin = at(Some(c.name.span()));
    let how = format!("{origin} ({})", key("name"));
    let password_file = c.password_file.as_ref().map(|p| absolute(p.get_ref()));
    let target = dsn::target(c.dsn.get_ref(), env, password_file.as_deref()).map_err(|e| {
        // The password_file key's own file is blamed on that key's
        // line; a passfile named in the DSN stays with the DSN.
        match (&e, &c.password_file, &password_file) {
            (dsn::DsnError::PasswordFile { path, .. }, Some(written), Some(read))
                if path == read =>
            {
                invalid(written.span(), "password_file", e.to_string())
            }
            _ => invalid(c.dsn.span(), "dsn", e.to_string()),
        }
    })?;
    let dur = |v: &Option<Sp<crate::units::HumanDuration>>, knob: Knob, default: Duration| match v {
        Some(x) => knob
            .check_written(x.get_ref().0)
            .map_err(|m| invalid(x.span(), knob.range().key, m)),
        None => Ok(default),
    };
    let cluster = ClusterConfig {
        collector: Collector {
            name,
            dsn: c.dsn.get_ref().clone(),
            password_file,
            scrape_interval: dur(
                &c.scrape_interval,
                Knob::ScrapeInterval,
                DEFAULT_SCRAPE_INTERVAL,
            )?,
            wait_sampling_interval: dur(
                &c.wait_sampling_interval,
                Knob::WaitSamplingInterval,
                DEFAULT_WAIT_SAMPLING_INTERVAL,
            )?,
            statement_timeout: dur(
                &c.statement_timeout,
                Knob::StatementTimeout,
                DEFAULT_STATEMENT_TIMEOUT,
            )?,
            discover_volumes: c
                .discover_volumes
                .as_ref()
                .map(|b| *b.get_ref())
                .unwrap_or(true)
                && flags.collectors.on(crate::types::Collector::Probes),
            collectors: flags.collectors,
        },
        target,
    };
    Ok((cluster, (origin, how)))
}

/// The clusters of `--pg.dsn` and `DATA_SOURCE_NAME`, after the file's.
fn clusters_from_flags(
    flags: &FlagOverrides,
    env: crate::postgres::dsn::Env<'_>,
    out: &mut Vec<ClusterConfig>,
    named: &mut Vec<(Origin, String)>,
) -> Result<(), ConfigError> {
    use crate::postgres::{ClusterConfig as Collector, dsn};
    let given = flags
        .pg_dsns
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            (
                Origin::Flag("--pg.dsn"),
                format!("the {} --pg.dsn", ordinal(i + 1)),
                spec,
            )
        })
        .chain(flags.data_source_name.iter().map(|spec| {
            (
                Origin::Env("DATA_SOURCE_NAME"),
                "DATA_SOURCE_NAME".to_string(),
                spec,
            )
        }));
    for (origin, which, spec) in given {
        let (name, text) = dsn::split_name(spec);
        let flag_err = |message: String| ConfigError::Invalid {
            origin: origin.clone(),
            key: name
                .map(str::to_string)
                .unwrap_or_else(|| "DSN".to_string()),
            message,
        };
        let target = dsn::target(text, env, None).map_err(|e| flag_err(e.to_string()))?;
        let how = match name {
            Some(_) => which,
            None => format!(
                "{which} (no NAME=, so named after its port {})",
                target.port
            ),
        };
        named.push((origin.clone(), how));
        let name = name
            .map(str::to_string)
            .unwrap_or_else(|| format!("pg{}", target.port));
        validate_cluster_name(&name).map_err(flag_err)?;
        out.push(ClusterConfig {
            collector: Collector {
                name,
                dsn: text.to_string(),
                password_file: None,
                scrape_interval: flags.pg_scrape_interval.unwrap_or(DEFAULT_SCRAPE_INTERVAL),
                wait_sampling_interval: DEFAULT_WAIT_SAMPLING_INTERVAL,
                statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
                discover_volumes: !flags.pg_no_discovery
                    && flags.collectors.on(crate::types::Collector::Probes),
                collectors: flags.collectors,
            },
            target,
        });
    }
    Ok(())
}

/// Refuses two clusters with one name, saying where each was given.
fn unique_cluster_names(
    out: &[ClusterConfig],
    named: &[(Origin, String)],
) -> Result<(), ConfigError> {
    for (j, c) in out.iter().enumerate() {
        let name = &c.collector.name;
        if let Some(i) = out[..j].iter().position(|o| o.collector.name == *name) {
            let (origin, second) = named[j].clone();
            return Err(ConfigError::Invalid {
                origin,
                key: "cluster.name".into(),
                message: format!(
                    "duplicate cluster name {name:?}: given by {} and by {second}; names label \
                     every series and must be unique: name each cluster (name = \"...\" in a \
                     [[cluster]] table, NAME=DSN on the command line)",
                    named[i].1
                ),
            });
        }
    }
    Ok(())
}

/// 1st, 2nd, 3rd, 4th... for messages.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn volume_from_file(
    i: usize,
    v: &RawVolume,
    d: &RawVolumeDefaults,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<VolumeSpec, ConfigError> {
    let key = |k: &str| format!("volume[{i}].{k}");
    let name = v.name.get_ref().clone();
    validate_name(&name).map_err(|message| ConfigError::Invalid {
        origin: at(Some(v.name.span())),
        key: key("name"),
        message,
    })?;
    let s = settings(
        &|field, from_volume, span, message| ConfigError::Invalid {
            origin: at(span),
            key: if from_volume {
                key(field)
            } else {
                format!("defaults.{field}")
            },
            message,
        },
        &v.settings(),
        d,
    )?;
    let (path, probe_dir) = volume_dirs(i, v, at)?;
    Ok(VolumeSpec {
        name,
        path,
        probe_dir,
        probe: s,
        provisioned: provisioned(v),
        cgroup: cgroup_path(i, v, at)?,
    })
}

/// A `[[volume]]`'s directory and its probe directory (`probe_dir`, or one
/// inside the volume's), refused where probe files may not go.
fn volume_dirs(
    i: usize,
    v: &RawVolume,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<(PathBuf, PathBuf), ConfigError> {
    let key = |k: &str| format!("volume[{i}].{k}");
    let path_origin = at(Some(v.path.span()));
    let path = resolve_dir(v.path.get_ref()).map_err(|message| ConfigError::Invalid {
        origin: path_origin.clone(),
        key: key("path"),
        message,
    })?;
    let (probe_dir, pd_origin, pd_key) = match &v.probe_dir {
        Some(pd) => (
            absolute(pd.get_ref()),
            at(Some(pd.span())),
            key("probe_dir"),
        ),
        None => (path.join(PROBE_DIR_NAME), path_origin, key("path")),
    };
    check_probe_dir(&path, &probe_dir, Asker::ConfigFile).map_err(|message| {
        ConfigError::Invalid {
            origin: pd_origin,
            key: pd_key,
            message,
        }
    })?;
    Ok((path, probe_dir))
}

/// A `[[volume]]`'s `provisioned_*` limits; zero means none.
fn provisioned(v: &RawVolume) -> Vec<(Resource, u64)> {
    [
        (
            Resource::Iops,
            v.provisioned_iops.as_ref().map(|x| *x.get_ref()),
        ),
        (
            Resource::ReadIops,
            v.provisioned_read_iops.as_ref().map(|x| *x.get_ref()),
        ),
        (
            Resource::WriteIops,
            v.provisioned_write_iops.as_ref().map(|x| *x.get_ref()),
        ),
        (
            Resource::BytesPerSecond,
            v.provisioned_throughput.as_ref().map(|x| x.get_ref().0),
        ),
        (
            Resource::ReadBytesPerSecond,
            v.provisioned_read_throughput
                .as_ref()
                .map(|x| x.get_ref().0),
        ),
        (
            Resource::WriteBytesPerSecond,
            v.provisioned_write_throughput
                .as_ref()
                .map(|x| x.get_ref().0),
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.filter(|&x| x > 0).map(|x| (k, x)))
    .collect()
}

/// A `[[volume]]`'s `cgroup`, which must be written as `/proc/<pid>/cgroup`
/// shows it.
fn cgroup_path(
    i: usize,
    v: &RawVolume,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<Option<String>, ConfigError> {
    let Some(cg) = &v.cgroup else {
        return Ok(None);
    };
    if !cg.get_ref().starts_with('/') {
        return Err(ConfigError::Invalid {
            origin: at(Some(cg.span())),
            key: format!("volume[{i}].cgroup"),
            message: format!(
                "{:?} is not a cgroup path: write it as /proc/<pid>/cgroup shows it, starting with /",
                cg.get_ref()
            ),
        });
    }
    Ok(Some(cg.get_ref().clone()))
}

/// Reports a bad setting: field name, whether the volume (not `[defaults]`)
/// set it, where, and why.
type SettingError<'a> =
    dyn Fn(&str, bool, Option<std::ops::Range<usize>>, String) -> ConfigError + 'a;

fn settings(
    err: &SettingError<'_>,
    v: &RawVolumeDefaults,
    d: &RawVolumeDefaults,
) -> Result<ProbeSettings, ConfigError> {
    // Pick the volume's value, else the default's, keeping the span of
    // whichever was written so errors point at the right line.
    fn pick<'a, T>(a: &'a Option<Sp<T>>, b: &'a Option<Sp<T>>) -> Option<(&'a Sp<T>, bool)> {
        match (a, b) {
            (Some(x), _) => Some((x, true)),
            (None, Some(x)) => Some((x, false)),
            (None, None) => None,
        }
    }
    type Durations = Option<Sp<crate::units::HumanDuration>>;
    let duration = |a: &Durations, b: &Durations, knob: Knob, slot: &mut Duration| {
        if let Some((x, vol)) = pick(a, b) {
            *slot = knob
                .check_written(x.get_ref().0)
                .map_err(|m| err(knob.range().key, vol, Some(x.span()), m))?;
        }
        Ok::<(), ConfigError>(())
    };
    let mut s = ProbeSettings::default();
    if let Some((p, vol)) = pick(&v.probes, &d.probes) {
        let list = p.get_ref();
        if list.is_empty() {
            return Err(err(
                "probes",
                vol,
                Some(p.span()),
                "empty list: give at least one of \"commit\", \"read\"".to_string(),
            ));
        }
        s.commit_probe = list.contains(&crate::types::ProbeKind::Commit);
        s.read_probe = list.contains(&crate::types::ProbeKind::Read);
    }
    duration(&v.interval, &d.interval, Knob::Interval, &mut s.interval)?;
    duration(&v.timeout, &d.timeout, Knob::Timeout, &mut s.timeout)?;
    duration(
        &v.cache_served_threshold,
        &d.cache_served_threshold,
        Knob::CacheServedThreshold,
        &mut s.cache_served_threshold,
    )?;
    duration(
        &v.sweep_every,
        &d.sweep_every,
        Knob::SweepEvery,
        &mut s.sweep_every,
    )?;
    duration(
        &v.sweep_duration,
        &d.sweep_duration,
        Knob::SweepDuration,
        &mut s.sweep_duration,
    )?;
    duration(
        &v.busy_every,
        &d.busy_every,
        Knob::BusyEvery,
        &mut s.busy_every,
    )?;
    if let Some((x, vol)) = pick(&v.read_file_size, &d.read_file_size) {
        s.read_file_size = Knob::ReadFileSize
            .check_written_bytes(x.get_ref().0)
            .map_err(|m| err("read_file_size", vol, Some(x.span()), m))?;
    }
    if let Some((x, _)) = pick(&v.sync_method, &d.sync_method) {
        s.sync_method = *x.get_ref();
    }
    if let Some((x, _)) = pick(&v.free_space_reserve, &d.free_space_reserve) {
        s.free_space_reserve = x.get_ref().0;
    }
    if let Some((x, _)) = pick(&v.engine, &d.engine) {
        s.engine = *x.get_ref();
    }
    Ok(s)
}

/// `[defaults]` with the `--probe.*` flags on top, each flag checked.
fn flag_settings(
    d: &RawVolumeDefaults,
    flags: &FlagOverrides,
    at: &dyn Fn(Option<std::ops::Range<usize>>) -> Origin,
) -> Result<ProbeSettings, ConfigError> {
    let empty = RawVolumeDefaults::default();
    let mut s = settings(
        &|field, _vol, span, message| ConfigError::Invalid {
            origin: at(span),
            key: format!("defaults.{field}"),
            message,
        },
        &empty,
        d,
    )?;
    let flag = |name: &'static str, shown: String| {
        move |message: String| ConfigError::Invalid {
            origin: Origin::Flag(name),
            key: shown,
            message,
        }
    };
    if let Some(e) = flags.engine {
        s.engine = e;
    }
    if let Some(m) = flags.sync_method {
        s.sync_method = m;
    }
    if let Some(i) = flags.interval {
        s.interval = Knob::Interval
            .check_duration(i)
            .map_err(flag("--probe.interval", format!("{i:?}")))?;
    }
    if let Some(t) = flags.busy_every {
        s.busy_every = Knob::BusyEvery
            .check_duration(t)
            .map_err(flag("--probe.busy-every", format!("{t:?}")))?;
    }
    if let Some(b) = flags.read_file_size {
        s.read_file_size = Knob::ReadFileSize
            .check_bytes(b)
            .map_err(flag("--probe.read-file-size", b.to_string()))?;
    }
    if let Some(b) = flags.free_space_reserve {
        s.free_space_reserve = b;
    }
    Ok(s)
}

fn volume_from_flag(spec: &str, s: &ProbeSettings) -> Result<VolumeSpec, ConfigError> {
    const FLAG: &str = "--probe.path";
    let flag_err = |message: String| ConfigError::Invalid {
        origin: Origin::Flag(FLAG),
        key: spec.to_string(),
        message,
    };
    let (name, path) = split_name(spec);
    let path = resolve_dir(Path::new(path)).map_err(&flag_err)?;
    let name = match name {
        Some(n) => n.to_string(),
        None => default_name(&path),
    };
    validate_name(&name).map_err(|m| flag_err(format!("{m} (write NAME=PATH to choose one)")))?;
    let probe_dir = path.join(PROBE_DIR_NAME);
    check_probe_dir(&path, &probe_dir, Asker::ProbePathFlag).map_err(flag_err)?;
    Ok(VolumeSpec {
        name,
        path,
        probe_dir,
        probe: s.clone(),
        provisioned: Vec::new(),
        cgroup: None,
    })
}

/// Splits `NAME=PATH`. A prefix counts as a name only when it contains no
/// `/`, so a path that happens to contain `=` still works.
pub fn split_name(spec: &str) -> (Option<&str>, &str) {
    match spec.split_once('=') {
        Some((n, p)) if !n.is_empty() && !n.contains('/') => (Some(n), p),
        _ => (None, spec),
    }
}

/// A volume named after its directory: `/srv/pgwal` → `pgwal`.
fn default_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".to_string())
}

/// Volume names become label values in every series: keep them short and
/// free of characters that need escaping in PromQL.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!(
            "invalid volume name {name:?}: use 1 to 64 characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')))
    {
        return Err(format!(
            "invalid volume name {name:?}: character {c:?} not allowed (use letters, digits, _ - . /)"
        ));
    }
    Ok(())
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// Resolves a volume path to an existing directory (symlinks followed: a
/// `pg_wal` symlink to another disk must be measured where it points).
fn resolve_dir(p: &Path) -> Result<PathBuf, String> {
    let canonical = std::fs::canonicalize(p).map_err(|e| format!("path {}: {e}", p.display()))?;
    let meta =
        std::fs::metadata(&canonical).map_err(|e| format!("path {}: {e}", canonical.display()))?;
    if !meta.is_dir() {
        return Err(format!("path {} is not a directory", canonical.display()));
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests;
