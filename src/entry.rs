//! The process from its first line to its exit code: parse flags, load
//! config, hand over to the daemon or to `check`, print one error and pick
//! the exit code. `main.rs` only calls [`main`], so everything it reaches
//! stays inside the crate.

use std::process::ExitCode;

use crate::app::daemon::{self, Listen, WebOptions};
use crate::check::{self, CheckOptions};
use crate::cli::{self, CheckArgs, Cli, Command, FailOn, OutputFormat, parse_listen};
use crate::config::{self, FlagOverrides};
use crate::http::web_config::{self, WebSecurity};
use crate::model::verdict::Level;
use crate::{logging, sys};

/// The whole process: `main.rs` calls this and nothing else.
pub fn main() -> ExitCode {
    // Before anything else, while this is the only thread: SIGTERM, SIGINT
    // and SIGHUP wait, instead of killing the process, until the daemon or
    // `check` has its handlers in place (every thread started from here on
    // inherits the held mask). A stop request at any moment of the start
    // then ends in the orderly shutdown that removes the probe files.
    sys::hold_stop_signals();
    let cli = cli::parse();
    logging::init(cli.log_level, cli.log_format);
    match cli.command {
        Some(Command::Check(ref a)) => run_check(a),
        Some(Command::Man) => {
            use std::io::Write;
            match cli::man_page().and_then(|page| std::io::stdout().write_all(&page)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("pg-storage-exporter man: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None => run_daemon(cli),
    }
}

/// `check`: the flags checked before any probe runs, then the audit alone
/// or the whole run, printed, and the exit status.
fn run_check(a: &CheckArgs) -> ExitCode {
    let opts = CheckOptions {
        path: a.path.clone(),
        duration: a.duration,
        sync_method: a.sync_method.into(),
        engine: a.engine.into(),
        read_file_size: a.read_file_size,
        free_space_reserve: a.free_space_reserve,
        probe_dir: a.probe_dir.clone(),
        cache_served_threshold: a.cache_served_threshold,
        commit: !a.no_commit,
        read: !a.no_read,
        sweep: a.sweep,
    };
    if let Some(d) = a.sweep
        && (d < std::time::Duration::from_secs(1) || d > std::time::Duration::from_secs(300))
    {
        eprintln!("pg-storage-exporter check: --sweep {d:?}: out of range, use 1s to 5m");
        return ExitCode::from(2);
    }
    // A DSN that does not parse is an invalid flag: said before
    // any probe runs, not after.
    if let Some(dsn) = &a.pg_dsn
        && let Err(e) = crate::postgres::dsn::target(dsn, &|k| std::env::var(k).ok(), None)
    {
        eprintln!("pg-storage-exporter check: --pg.dsn: {e}");
        return ExitCode::from(2);
    }
    if a.audit_only {
        return run_audit_only(a);
    }
    // The cluster's findings join the audit after the run: the
    // verdict is judged again with them.
    let report = match check::run(&opts).and_then(|mut r| {
        cluster_audit(a, &mut r.audit)?;
        r.judge();
        Ok(r)
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pg-storage-exporter check: {}", chain(&e));
            return ExitCode::from(1);
        }
    };
    let out = match a.format {
        OutputFormat::Text => Ok(check::render_text(&report)),
        OutputFormat::Json => check::render_json(&report),
    };
    match out {
        Ok(s) => print!("{s}"),
        Err(e) => {
            eprintln!("pg-storage-exporter check: {}", chain(&e));
            return ExitCode::from(1);
        }
    }
    if report.interrupted {
        ExitCode::from(130)
    } else {
        verdict_status(a.fail_on, report.verdict.level)
    }
}

/// `check --audit-only`: the audit, printed, and the exit status.
fn run_audit_only(a: &CheckArgs) -> ExitCode {
    // Creates no file: the signals keep their default action,
    // so Ctrl-C ends a slow audit at once.
    sys::release_stop_signals();
    let out = check::audit_only(&a.path)
        .and_then(|mut r| cluster_audit(a, &mut r).map(|()| r))
        .and_then(|r| {
            let text = match a.format {
                OutputFormat::Text => Ok(check::render_audit_only_text(&r)),
                OutputFormat::Json => check::render_audit_only_json(&r),
            };
            text.map(|t| (t, check::audit_verdict(&r).level))
        });
    match out {
        Ok((s, level)) => {
            print!("{s}");
            verdict_status(a.fail_on, level)
        }
        Err(e) => {
            eprintln!("pg-storage-exporter check: {}", chain(&e));
            ExitCode::from(1)
        }
    }
}

/// With `--pg.dsn`, adds the cluster's findings to `r`, from a read-only
/// session: the check module itself never talks to PostgreSQL.
fn cluster_audit(a: &CheckArgs, r: &mut check::AuditReport) -> anyhow::Result<()> {
    if let Some(dsn) = &a.pg_dsn {
        let (host, _) =
            crate::audit::read::host(std::path::Path::new("/proc"), std::path::Path::new("/sys"));
        let (outcome, data_dir) = crate::app::audit::check_cluster(dsn, &host)?;
        r.cluster = Some(outcome);
        r.server_syncs = Some(server_syncs(data_dir));
    }
    Ok(())
}

/// A few seconds of the server's own syncs, where the exporter can trace
/// them (the daemon's postgres.syncs collector), or why it cannot.
fn server_syncs(data_dir: Option<std::path::PathBuf>) -> check::ServerSyncs {
    let seconds = 5;
    let traced = match data_dir {
        Some(d) => crate::app::audit::server_syncs(&d, seconds),
        None => Err("no data_directory".to_string()),
    };
    check::ServerSyncs {
        seconds: seconds as f64,
        off: traced.as_ref().err().cloned(),
        kinds: traced
            .unwrap_or_default()
            .into_iter()
            .map(|(kind, count, mean, p50, p99)| check::KindSyncs {
                kind,
                count,
                mean_seconds: mean,
                p50_le_seconds: p50,
                p99_le_seconds: p99,
            })
            .collect(),
    }
}

/// `check`'s exit status for a finished run: [`check::EXIT_VERDICT`] when
/// the verdict reached `--fail-on`, else 0.
fn verdict_status(fail_on: Option<FailOn>, level: Level) -> ExitCode {
    let at = match fail_on {
        None => return ExitCode::SUCCESS,
        Some(FailOn::Warning) => Level::Warning,
        Some(FailOn::Critical) => Level::Critical,
    };
    if level >= at {
        ExitCode::from(check::EXIT_VERDICT)
    } else {
        ExitCode::SUCCESS
    }
}

/// The daemon: its settings checked before anything starts, then the
/// runtime and the signal handlers, and the run to its end.
fn run_daemon(cli: Cli) -> ExitCode {
    let (cfg, flags) = match load_config(&cli) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let web = match web_options(&cli) {
        Ok(w) => w,
        Err(code) => return code,
    };
    // One worker: the async side only waits on sockets and timers (the
    // probes have threads of their own, file and cgroup reads and password
    // hashing go to blocking threads), so a second worker adds nothing but
    // wakeups. With two, a task woken on one often unparks the other to
    // steal it: about 3.5 ms of CPU per minute more at defaults on a 2-vCPU
    // virtual machine, where each wakeup costs an exit to the hypervisor.
    // It also caps what a flood of scrapes can take from the database's
    // host at one core.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("pgse-async")
        // The limits pass runs on a blocking thread every 10 s by default:
        // at tokio's 10 s keep-alive that thread often exits just before
        // the next pass, which then starts a new one.
        .thread_keep_alive(std::time::Duration::from_secs(60))
        .on_thread_park(daemon::lower_worker_priority)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pg-storage-exporter: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let source = daemon::ReloadSource {
        file: cli.config_file.clone(),
        flags,
    };
    // Installed inside the runtime, then released on this thread (the one
    // that runs the daemon to its end): a signal held since the first line
    // of main reaches its handler now.
    let signals = {
        let _inside = runtime.enter();
        daemon::Signals::install()
    };
    let signals = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pg-storage-exporter: {}", chain(&e));
            return ExitCode::from(1);
        }
    };
    sys::release_stop_signals();
    let result = runtime.block_on(daemon::run(cfg, web, source, signals));
    // Abandoned probe threads must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pg-storage-exporter: {}", chain(&e));
            ExitCode::from(1)
        }
    }
}

/// The configuration from the file and the flags, checked, with the flags
/// kept for each reload; else the exit status, the error said.
fn load_config(cli: &Cli) -> Result<(config::Config, FlagOverrides), ExitCode> {
    let flags = FlagOverrides {
        probe_paths: cli.probe_paths.clone(),
        engine: cli.engine.map(Into::into),
        sync_method: cli.sync_method.map(Into::into),
        interval: cli.interval,
        busy_every: cli.busy_every,
        read_file_size: cli.read_file_size,
        free_space_reserve: cli.free_space_reserve,
        pg_dsns: cli.pg_dsns.clone(),
        // postgres_exporter's convention, so existing deployments carry over.
        data_source_name: std::env::var("DATA_SOURCE_NAME")
            .ok()
            .filter(|v| !v.trim().is_empty()),
        pg_scrape_interval: Some(cli.pg_scrape_interval),
        pg_no_discovery: cli.no_pg_discovery,
        collectors: cli.collectors,
    };
    // Configuration errors exit with 2 before any port is bound or file written.
    let cfg = match config::load(cli.config_file.as_deref(), &flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pg-storage-exporter: invalid configuration: {e}");
            return Err(ExitCode::from(2));
        }
    };
    if let Some(problem) = config::engine_problem(&cfg) {
        eprintln!("pg-storage-exporter: invalid configuration: {problem}");
        return Err(ExitCode::from(2));
    }
    Ok((cfg, flags))
}

/// Where and how HTTP is served: the listen addresses (or systemd's
/// sockets), the path, TLS and basic auth; else the exit status, the error
/// said.
fn web_options(cli: &Cli) -> Result<WebOptions, ExitCode> {
    let listen = match cli
        .listen_address
        .iter()
        .map(|a| parse_listen(a))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(a) => Listen::Addresses(a),
        Err(e) => {
            eprintln!("pg-storage-exporter: {e}");
            return Err(ExitCode::from(2));
        }
    };
    if let Err(e) = cli::check_telemetry_path(&cli.telemetry_path) {
        eprintln!("pg-storage-exporter: {e}");
        return Err(ExitCode::from(2));
    }
    // Like the configuration: a missing certificate or a malformed hash stops
    // the start with exit 2, before the port is bound.
    let security = match cli.web_config_file.as_deref() {
        Some(path) => match web_config::load(path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("pg-storage-exporter: invalid web configuration: {e:#}");
                return Err(ExitCode::from(2));
            }
        },
        None => WebSecurity::default(),
    };
    // Taken while the process has one thread: taking them clears
    // LISTEN_FDS and LISTEN_PID from the environment.
    let listen = if cli.systemd_socket {
        match daemon::systemd_listeners() {
            Ok(l) => Listen::Inherited(l),
            Err(e) => {
                eprintln!("pg-storage-exporter: {e:#}");
                return Err(ExitCode::from(1));
            }
        }
    } else {
        listen
    };
    Ok(WebOptions {
        listen,
        telemetry_path: cli.telemetry_path.clone(),
        security,
        config_file: cli.web_config_file.clone(),
        max_connections: cli.max_connections as usize,
    })
}

/// An error and its causes on one line, each cause only when the text so far
/// does not already say it: many errors here print their source in their own
/// message, and `{:#}` would repeat it ("Permission denied (os error 13):
/// Permission denied (os error 13)").
fn chain(e: &anyhow::Error) -> String {
    let mut s = e.to_string();
    for cause in e.chain().skip(1) {
        let t = cause.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
    }
    s
}
