//! Command line, in the Prometheus exporter convention (`--web.*`,
//! `--log.*`, `--config.file`), plus the one-shot `check` subcommand.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::types::{COLLECTORS, Collectors, EngineChoice, SyncMethod};
use crate::units::{parse_bytes, parse_duration};

#[derive(Debug, Parser)]
#[command(
    name = "pg-storage-exporter",
    version,
    about = "Measures the IO PostgreSQL commits and reads with (WAL write+sync, 8 KiB O_DIRECT reads) \
             and serves it as Prometheus metrics.",
    long_about = None,
    after_help = "Without --config.file, --probe.path or --pg.dsn it probes /var/tmp (probe files \
                  in /var/tmp/pg-storage-exporter-probe) and listens on :9847.\n\
                  --probe.* flags override [defaults] of --config.file, which override the \
                  built-in defaults shown above.\n\
                  One-shot verdict for a directory: pg-storage-exporter check PATH"
)]
pub(crate) struct Cli {
    /// Address to listen on for HTTP (metrics, /healthz, landing page).
    /// Repeatable: the exporter listens on every address given.
    #[arg(
        long = "web.listen-address",
        // The default port: not node_exporter's 9100, postgres_exporter's
        // 9187 or any other exporter port we found in public material;
        // Prometheus' allocation list (9100–9999) could not be consulted
        // from here, so registering it there is a release task.
        default_value = ":9847",
        value_name = "[HOST]:PORT"
    )]
    pub(crate) listen_address: Vec<String>,

    /// Serve on the sockets systemd passes (socket activation: LISTEN_FDS,
    /// LISTEN_PID) instead of listening on --web.listen-address.
    #[arg(long = "web.systemd-socket", conflicts_with = "listen_address")]
    pub(crate) systemd_socket: bool,

    /// Path under which metrics are exposed.
    #[arg(
        long = "web.telemetry-path",
        default_value = "/metrics",
        value_name = "PATH"
    )]
    pub(crate) telemetry_path: String,

    /// Connections each listening socket holds at most; at the cap, each
    /// new connection closes the one idle longest, so a fresh scrape is
    /// always served.
    ///
    /// Anyone who can reach the port can open connections, and each holds
    /// a file descriptor. A connection with a request in progress is never
    /// closed to make room: while every one has, newcomers are refused.
    /// Lowered at start to fit the open-file limit (RLIMIT_NOFILE, raised
    /// to its hard limit) with room for probe files and PostgreSQL
    /// sessions. Whatever the cap, a connection is closed when a request
    /// head (or the TLS handshake) is not complete 10 s after the accept or
    /// after the request's first byte, and after 2 minutes idle between
    /// requests.
    #[arg(
        long = "web.max-connections",
        default_value_t = 256,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub(crate) max_connections: u32,

    /// Web configuration file (TLS, basic auth) in the format of the
    /// Prometheus exporter-toolkit: tls_server_config (cert_file, key_file,
    /// min_version, max_version) and basic_auth_users (bcrypt hashes).
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub(crate) web_config_file: Option<PathBuf>,

    /// TOML configuration file (see config/example.toml).
    #[arg(long = "config.file", value_name = "FILE")]
    pub(crate) config_file: Option<PathBuf>,

    /// Minimum level of log messages.
    #[arg(long = "log.level", default_value = "info", value_enum)]
    pub(crate) log_level: LogLevel,

    /// Log line format.
    #[arg(long = "log.format", default_value = "logfmt", value_enum)]
    pub(crate) log_format: LogFormat,

    /// Probe a directory: [NAME=]PATH, repeatable. NAME defaults to the
    /// directory's last component. Added to volumes from --config.file.
    /// Without any volume or --pg.dsn, /var/tmp is probed.
    #[arg(long = "probe.path", value_name = "[NAME=]PATH")]
    pub(crate) probe_paths: Vec<String>,

    /// IO engine for --probe.path volumes (default: auto, or [defaults].engine
    /// of --config.file).
    #[arg(long = "probe.engine", value_enum)]
    pub(crate) engine: Option<EngineArg>,

    /// wal_sync_method the WAL probe imitates, for --probe.path volumes
    /// (default: fdatasync, or [defaults].sync_method of --config.file).
    #[arg(long = "probe.sync-method", value_enum)]
    pub(crate) sync_method: Option<SyncMethodArg>,

    /// Time between probe rounds for --probe.path volumes, e.g. 250ms
    /// (default: 3s, or [defaults].interval of --config.file).
    #[arg(long = "probe.interval", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) interval: Option<Duration>,

    /// Time between bursts for the busy figure, for --probe.path volumes; 0s
    /// turns bursts off (default: 40s, or [defaults].busy_every of
    /// --config.file). Each burst is 24 back-to-back commit probes, the last
    /// 12 recorded as the busy figure (a burst that meets a throttle goes on
    /// for a second and records whole throttle cycles; the next burst comes
    /// later in proportion), then 32 warm-up reads and the reads of an 8 ms
    /// span, recorded.
    #[arg(long = "probe.busy-every", value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) busy_every: Option<Duration>,

    /// Size of the read probe file for --probe.path volumes, e.g. 256MiB
    /// (default: 64MiB, or [defaults].read_file_size of --config.file).
    #[arg(long = "probe.read-file-size", value_parser = parse_bytes, value_name = "SIZE")]
    pub(crate) read_file_size: Option<u64>,

    /// Free space that must remain after creating probe files, e.g. 10GiB
    /// (default: 1GiB, or [defaults].free_space_reserve of --config.file).
    #[arg(long = "probe.free-space-reserve", value_parser = parse_bytes, value_name = "SIZE")]
    pub(crate) free_space_reserve: Option<u64>,

    /// Watch a PostgreSQL cluster: [NAME=]DSN (libpq key=value string or
    /// postgresql:// URL), repeatable. NAME defaults to pg<port>. Also read
    /// from the DATA_SOURCE_NAME environment variable. Turns the default
    /// /var/tmp volume off: the cluster's own directories are probed instead
    /// (see --no-pg.discover-volumes).
    #[arg(long = "pg.dsn", value_name = "[NAME=]DSN")]
    pub(crate) pg_dsns: Vec<String>,

    /// How often --pg.dsn clusters' statistics are read.
    #[arg(
        long = "pg.scrape-interval",
        value_parser = parse_duration,
        value_name = "DURATION",
        default_value = "15s"
    )]
    pub(crate) pg_scrape_interval: Duration,

    /// Do not turn --pg.dsn clusters' data, WAL and tablespace directories
    /// into probed volumes (then --pg.dsn alone probes no volume).
    #[arg(long = "no-pg.discover-volumes")]
    pub(crate) no_pg_discovery: bool,

    /// Which collectors are on: filled by [`parse`] from the
    /// `--collector.NAME` / `--no-collector.NAME` flags that [`command`]
    /// adds, one pair per entry of [`COLLECTORS`].
    #[arg(skip)]
    pub(crate) collectors: Collectors,

    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

/// The flag ids of a collector: (`collector.NAME`, `no-collector.NAME`).
/// Leaked once per process: clap wants `'static` ids and there are seven.
fn collector_ids() -> &'static [(&'static str, &'static str)] {
    static IDS: std::sync::OnceLock<Vec<(&'static str, &'static str)>> = std::sync::OnceLock::new();
    IDS.get_or_init(|| {
        COLLECTORS
            .iter()
            .map(|(_, name, _, _)| {
                let on: &'static str = Box::leak(format!("collector.{name}").into_boxed_str());
                let off: &'static str = Box::leak(format!("no-collector.{name}").into_boxed_str());
                (on, off)
            })
            .collect()
    })
}

/// The whole command line: the derived [`Cli`] plus a
/// `--collector.NAME` / `--no-collector.NAME` pair per collector, generated
/// from [`COLLECTORS`] so the table, `--help` and the man page cannot
/// disagree. The last of a pair on the command line wins, as in
/// node_exporter.
pub(crate) fn command() -> clap::Command {
    use clap::{Arg, ArgAction, CommandFactory};
    let mut cmd = Cli::command();
    for ((_, name, default, help), (on, off)) in COLLECTORS.iter().zip(collector_ids()) {
        let state = if *default { "on" } else { "off" };
        cmd = cmd
            .arg(
                Arg::new(*on)
                    .long(*on)
                    .action(ArgAction::SetTrue)
                    .overrides_with(*off)
                    .help_heading("Collectors")
                    .help(format!("Turn on {name}: {help} [default: {state}]")),
            )
            .arg(
                Arg::new(*off)
                    .long(*off)
                    .action(ArgAction::SetTrue)
                    .overrides_with(*on)
                    .help_heading("Collectors")
                    .help(format!("Turn off {name}")),
            );
    }
    cmd
}

/// Parses `args` (the program name first) with [`command`].
pub(crate) fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::FromArgMatches;
    let matches = command().try_get_matches_from(args)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    for ((c, _, _, _), (on, off)) in COLLECTORS.iter().zip(collector_ids()) {
        if matches.get_flag(on) {
            cli.collectors.set(*c, true);
        } else if matches.get_flag(off) {
            cli.collectors.set(*c, false);
        }
    }
    Ok(cli)
}

/// Parses the process's command line; prints help, version or the error
/// and exits as clap does.
pub(crate) fn parse() -> Cli {
    try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Probe one directory for a while and print a verdict.
    ///
    /// The report opens with the commit ceiling in force (the most commits
    /// per second one client can do on the volume) and one verdict, ok,
    /// warning or critical, with its reasons. Exit status: 0 after a run, 1
    /// on an error, 2 for invalid flags, 3 when --fail-on is given and the
    /// verdict is at or above its level, 130 when interrupted.
    Check(CheckArgs),
    /// Write the manual page (roff) to stdout, generated from these very
    /// flag definitions so it cannot drift from `--help`; packages install
    /// it as pg-storage-exporter(1).
    #[command(hide = true)]
    Man,
}

/// The manual page of the command line, with `check` as a subcommand
/// section, in roff.
pub(crate) fn man_page() -> std::io::Result<Vec<u8>> {
    let cmd = command();
    let mut out = Vec::new();
    let man = clap_mangen::Man::new(cmd.clone());
    man.render(&mut out)?;
    // clap_mangen renders one command per page; the check subcommand's
    // options go in a section of the same page, where users look for them.
    if let Some(check) = cmd.find_subcommand("check") {
        out.extend_from_slice(b".SH \"CHECK SUBCOMMAND\"\n");
        let sub = clap_mangen::Man::new(check.clone());
        sub.render_description_section(&mut out)?;
        sub.render_options_section(&mut out)?;
    }
    Ok(out)
}

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// Directory on the volume to check (probe files go in a subdirectory).
    pub(crate) path: PathBuf,

    /// Total run time, split evenly between commit and read probes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) duration: Duration,

    /// Output format.
    #[arg(long, default_value = "text", value_enum)]
    pub(crate) format: OutputFormat,

    /// wal_sync_method to imitate.
    #[arg(long = "sync-method", default_value = "fdatasync", value_enum)]
    pub(crate) sync_method: SyncMethodArg,

    /// IO engine.
    #[arg(long, default_value = "auto", value_enum)]
    pub(crate) engine: EngineArg,

    /// Size of the read probe file; make it larger than any cache you want
    /// the reads to miss.
    #[arg(long = "read-file-size", default_value = "64MiB", value_parser = parse_bytes)]
    pub(crate) read_file_size: u64,

    /// Free space that must remain after creating the probe files.
    #[arg(long = "free-space-reserve", default_value = "1GiB", value_parser = parse_bytes)]
    pub(crate) free_space_reserve: u64,

    /// Probe directory (default PATH/pg-storage-exporter-check).
    #[arg(long = "probe-dir")]
    pub(crate) probe_dir: Option<PathBuf>,

    /// Reads faster than this are counted as served by a cache.
    #[arg(long = "cache-served-threshold", default_value = "5us", value_parser = parse_duration)]
    pub(crate) cache_served_threshold: Duration,

    /// Skip the commit probe.
    #[arg(long = "no-commit")]
    pub(crate) no_commit: bool,

    /// Skip the read probe.
    #[arg(long = "no-read")]
    pub(crate) no_read: bool,

    /// Also run a queue-depth sweep for this long after the probes (8 KiB
    /// random reads and writes at depths 1, 4, 16, 64; 256 KiB sequential
    /// reads and writes at depths 1, 4, 16), and report any plateau of read
    /// and write IOPS and bandwidth (28s when given without a value; off
    /// when not given). Writes up to 288 MiB into a sweep file of its own.
    #[arg(long = "sweep", value_parser = parse_duration, value_name = "DURATION", num_args = 0..=1, default_missing_value = "28s")]
    pub(crate) sweep: Option<Duration>,

    /// Print only the storage-configuration audit of PATH's volume and the
    /// host (mount options, device queue, kernel settings), without
    /// running any probe.
    #[arg(long = "audit-only")]
    pub(crate) audit_only: bool,

    /// Also audit this PostgreSQL cluster's settings and checkpoints over a
    /// read-only session (libpq connection string or postgresql:// URL).
    #[arg(long = "pg.dsn", value_name = "DSN")]
    pub(crate) pg_dsn: Option<String>,

    /// Exit with status 3 when the verdict is at or above this level
    /// (warning: any warning or critical finding; critical: critical ones
    /// only). Without it the exit status does not depend on the verdict: 0
    /// after a run, 1 on an error, 2 for invalid flags, 130 when
    /// interrupted (which also wins over 3).
    #[arg(long = "fail-on", value_enum, value_name = "LEVEL")]
    pub(crate) fail_on: Option<FailOn>,
}

/// The verdict level `--fail-on` fails at.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum FailOn {
    Warning,
    Critical,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum LogFormat {
    Logfmt,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum EngineArg {
    Auto,
    #[value(name = "io_uring")]
    IoUring,
    Sync,
}

impl From<EngineArg> for EngineChoice {
    fn from(e: EngineArg) -> Self {
        match e {
            EngineArg::Auto => EngineChoice::Auto,
            EngineArg::IoUring => EngineChoice::IoUring,
            EngineArg::Sync => EngineChoice::Sync,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum SyncMethodArg {
    Fdatasync,
    Fsync,
    #[value(name = "open_datasync")]
    OpenDatasync,
    #[value(name = "open_sync")]
    OpenSync,
}

impl From<SyncMethodArg> for SyncMethod {
    fn from(s: SyncMethodArg) -> Self {
        match s {
            SyncMethodArg::Fdatasync => SyncMethod::Fdatasync,
            SyncMethodArg::Fsync => SyncMethod::Fsync,
            SyncMethodArg::OpenDatasync => SyncMethod::OpenDatasync,
            SyncMethodArg::OpenSync => SyncMethod::OpenSync,
        }
    }
}

/// Parses `[HOST]:PORT` the way exporters do: `:9847` means every IPv4
/// interface.
pub(crate) fn parse_listen(addr: &str) -> Result<std::net::SocketAddr, String> {
    if !addr.is_empty() && addr.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "--web.listen-address {addr:?}: a bare port; write \":{addr}\" for every interface \
             or \"127.0.0.1:{addr}\" for one"
        ));
    }
    let full = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    };
    use std::net::ToSocketAddrs;
    full.to_socket_addrs()
        .map_err(|e| format!("--web.listen-address {addr:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("--web.listen-address {addr:?}: resolves to no address"))
}

/// Checks `--web.telemetry-path` as a literal route: an absolute path of
/// non-empty segments made of the characters a request path carries as
/// they are (RFC 3986 `pchar` without percent-encoding), none starting
/// with `:` or `*` and no `{` or `}` anywhere, and neither `/` nor
/// `/healthz`, which the exporter serves itself. axum takes `{name}` and
/// `{*rest}` as captures (so `/{id}` would serve metrics on every
/// one-segment path) and panics on a segment starting with `:` or `*` (the
/// capture syntax of its older versions); a request path never carries a
/// space, `?` or `#` as such, so a route holding one could never match.
pub(crate) fn check_telemetry_path(path: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("--web.telemetry-path {path:?}: {why}"));
    if !path.starts_with('/') {
        return bad("must start with /");
    }
    if path == "/" || path == "/healthz" {
        return bad("/ and /healthz are served by the exporter itself; choose another path");
    }
    if path.contains(['{', '}']) {
        return bad(
            "{ and } are the router's capture syntax (/{id} would serve the metrics on every \
             one-segment path): give a literal path",
        );
    }
    if let Some(c) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/-._~!$&'()*+,;=:@".contains(*c)))
    {
        return bad(&format!(
            "{c:?} is not allowed; use letters, digits and - . _ ~ ! $ & ' ( ) * + , ; = : @"
        ));
    }
    if path.contains("//") {
        return bad("an empty segment (//)");
    }
    if let Some(segment) = path
        .split('/')
        .find(|s| s.starts_with(':') || s.starts_with('*'))
    {
        return bad(&format!(
            "segment {segment:?} starts with '{}', which the router would take as a capture, \
             not a literal path",
            &segment[..1]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_paths_are_literal_routes() {
        for ok in [
            "/metrics",
            "/probe-metrics",
            "/a/b/metrics",
            "/metrics/",
            "/v1:metrics",
            "/a*b",
            "/~x.y_z",
        ] {
            assert_eq!(check_telemetry_path(ok), Ok(()), "{ok}");
            // What passes is a route axum takes as it is, without a panic.
            let _ = axum::Router::<()>::new().route(ok, axum::routing::get(|| async { "" }));
        }
        let err = |p: &str| check_telemetry_path(p).unwrap_err();
        assert_eq!(
            err("/:x"),
            "--web.telemetry-path \"/:x\": segment \":x\" starts with ':', which the router \
             would take as a capture, not a literal path"
        );
        assert!(err("/*rest").contains("segment \"*rest\" starts with '*'"));
        assert!(err("/a/:b").contains("segment \":b\""));
        assert_eq!(
            err("/{id}"),
            "--web.telemetry-path \"/{id}\": { and } are the router's capture syntax (/{id} \
             would serve the metrics on every one-segment path): give a literal path"
        );
        assert!(err("/{*rest}").contains("capture syntax"));
        assert!(err("/a}").contains("capture syntax"));
        assert!(err("/a//b").ends_with("an empty segment (//)"));
        assert!(err("//").ends_with("an empty segment (//)"));
        assert!(err("metrics").ends_with("must start with /"));
        assert!(err("").ends_with("must start with /"));
        assert!(err("/").contains("served by the exporter itself"));
        assert!(err("/healthz").contains("served by the exporter itself"));
        assert!(err("/a b").contains("' ' is not allowed"));
        assert!(err("/a?b").contains("'?' is not allowed"));
        assert!(err("/a#b").contains("'#' is not allowed"));
        assert!(err("/a%20b").contains("'%' is not allowed"));
        assert!(err("/métriques").contains("'é' is not allowed"));
        assert!(err("/a\nb").contains("'\\n' is not allowed"));
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen(":9847").unwrap().to_string(), "0.0.0.0:9847");
        assert_eq!(
            parse_listen("127.0.0.1:0").unwrap().to_string(),
            "127.0.0.1:0"
        );
        assert_eq!(
            parse_listen("[::1]:9847").unwrap().to_string(),
            "[::1]:9847"
        );
        let e = parse_listen("9847").unwrap_err();
        assert_eq!(
            e,
            "--web.listen-address \"9847\": a bare port; write \":9847\" for every interface \
             or \"127.0.0.1:9847\" for one"
        );
    }

    #[test]
    fn flags_parse() {
        use clap::Parser;
        let c = Cli::try_parse_from([
            "x",
            "--probe.path",
            "wal=/srv",
            "--probe.engine",
            "io_uring",
            "--probe.interval",
            "250ms",
            "check",
            "/tmp",
            "--duration",
            "2s",
            "--format",
            "json",
        ])
        .unwrap();
        assert_eq!(c.engine, Some(EngineArg::IoUring));
        assert_eq!(c.interval, Some(Duration::from_millis(250)));
        let Some(Command::Check(a)) = c.command else {
            panic!()
        };
        assert_eq!(a.duration, Duration::from_secs(2));
        assert_eq!(a.format, OutputFormat::Json);
        assert_eq!(a.fail_on, None);
        let c = Cli::try_parse_from(["x", "check", "/tmp", "--fail-on", "critical"]).unwrap();
        let Some(Command::Check(a)) = c.command else {
            panic!()
        };
        assert_eq!(a.fail_on, Some(FailOn::Critical));
        assert!(Cli::try_parse_from(["x", "check", "/tmp", "--fail-on", "ok"]).is_err());
        let c = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(c.listen_address, [":9847"]);
        assert!(!c.systemd_socket);
        let c = Cli::try_parse_from([
            "x",
            "--web.listen-address",
            "127.0.0.1:1",
            "--web.listen-address=[::1]:2",
        ])
        .unwrap();
        assert_eq!(c.listen_address, ["127.0.0.1:1", "[::1]:2"]);
        assert!(
            Cli::try_parse_from(["x", "--web.systemd-socket"])
                .unwrap()
                .systemd_socket
        );
        // Both at once is a mistake worth saying, not a silent choice.
        assert!(
            Cli::try_parse_from(["x", "--web.systemd-socket", "--web.listen-address", ":1"])
                .is_err()
        );
        let e = Cli::try_parse_from(["x", "--probe.interval", "5"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("a unit is required"), "{e}");
    }

    #[test]
    fn collector_flags() {
        use crate::types::Collector;
        let c = try_parse_from(["x"]).unwrap();
        assert_eq!(c.collectors, Collectors::default());
        let c = try_parse_from([
            "x",
            "--collector.probes.split",
            "--no-collector.postgres.io",
            "--no-collector.limits",
            "--collector.limits",
        ])
        .unwrap();
        assert!(c.collectors.on(Collector::ProbesSplit));
        assert!(!c.collectors.on(Collector::PostgresIo));
        // The last of a pair wins.
        assert!(c.collectors.on(Collector::Limits));
        let e = try_parse_from(["x", "--collector.nonesuch"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--collector.nonesuch"), "{e}");
        let help = command().render_long_help().to_string();
        assert!(help.contains("--no-collector.postgres.io"), "{help}");
        assert!(help.contains("[default: off]"), "{help}");
    }
}
