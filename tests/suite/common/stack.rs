//! A PostgreSQL server and the exporter watching it: the preamble the
//! PostgreSQL tests share, in one place.
//!
//! [`Stack::builder`] collects what a test wants; [`StackBuilder::start`]
//! then
//! 1. starts the server ([`PgServer::start`]; `None` when it is not
//!    installed and the test should skip, as there),
//! 2. creates the roles, all with the builder's password,
//! 3. runs the test's own setup on the server ([`StackBuilder::setup`]),
//! 4. writes the exporter's configuration into a fresh work dir: a probed
//!    volume `t` in `<work>/vol`, the clusters with their DSNs (or the test's
//!    own text, or command-line flags instead of a file),
//! 5. starts the exporter on a free loopback port and, when asked, waits
//!    for the first scrape that shows what the test needs.
//!
//! Dropping the [`Stack`] kills the exporter, stops the server and removes
//! its dirs, then removes the work dir, also when the test panicked: its
//! fields drop in declaration order, the exporter first so it never sees
//! its server or its volume go away under it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::pg::{PgKind, PgServer};
use super::{Exporter, sample};

/// Password of the roles when the test does not choose one.
const DEFAULT_PASSWORD: &str = "Stack-Pa55word-4-tests";
/// The exporter's configuration file in the work dir.
const CONFIG_FILE: &str = "c.toml";
/// The probed volume's dir in the work dir.
const VOLUME_DIR: &str = "vol";

/// A running PostgreSQL server and exporter; see the module docs.
pub struct Stack {
    /// The exporter (its log, its address, signals to it).
    pub ex: Exporter,
    /// The server the exporter watches.
    pub pg: PgServer,
    /// Holds the configuration file and the probed volume's dir.
    pub work: tempfile::TempDir,
    /// The scrape that satisfied [`StackBuilder::ready`]; empty without it.
    pub ready: String,
    password: String,
}

impl Stack {
    /// A builder for PostgreSQL 18 with no role, no volume, no cluster.
    pub fn builder<'a>() -> StackBuilder<'a> {
        StackBuilder {
            kind: PgKind::V18,
            waldir: None,
            password: DEFAULT_PASSWORD.to_string(),
            roles: Vec::new(),
            setup: Vec::new(),
            head: "window = \"1m\"\n".to_string(),
            volume: None,
            clusters: Vec::new(),
            config: None,
            cli: None,
            args: Vec::new(),
            ready: None,
        }
    }

    /// The exporter's configuration file (rewrite it and send SIGHUP to
    /// reload). Absent when the exporter runs on command-line flags.
    pub fn config_path(&self) -> PathBuf {
        self.work.path().join(CONFIG_FILE)
    }

    /// `http://ADDR{path}` of the exporter.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.ex.addr)
    }

    /// DSN of `role` over TCP with the stack's password.
    pub fn dsn(&self, role: &str) -> String {
        self.pg.dsn(role, &self.password)
    }
}

/// One `[[cluster]]` of the generated configuration.
struct ClusterSpec {
    name: String,
    role: String,
    /// Appended to the role's DSN, e.g. `connect_timeout=2`.
    dsn_params: String,
    /// The table's other keys, one per line.
    fields: String,
}

type Setup<'a> = Box<dyn FnOnce(&PgServer) + 'a>;
type Cli<'a> = Box<dyn FnOnce(&PgServer, &Path) -> Vec<String> + 'a>;
type Ready<'a> = (String, Duration, Box<dyn Fn(&str) -> bool + 'a>);

/// What [`Stack::builder`] starts; see the module docs.
pub struct StackBuilder<'a> {
    kind: PgKind,
    waldir: Option<PathBuf>,
    password: String,
    roles: Vec<(String, bool)>,
    setup: Vec<Setup<'a>>,
    head: String,
    volume: Option<String>,
    clusters: Vec<ClusterSpec>,
    config: Option<String>,
    cli: Option<Cli<'a>>,
    args: Vec<String>,
    ready: Option<Ready<'a>>,
}

/// `text` ending in a newline, so that TOML pieces can be concatenated.
fn lines(text: &str) -> String {
    let mut s = text.to_string();
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

impl<'a> StackBuilder<'a> {
    /// Which PostgreSQL (default 18).
    pub fn pg_version(mut self, kind: PgKind) -> Self {
        self.kind = kind;
        self
    }

    /// Puts `pg_wal` in `waldir` (a symlink from the data dir), as
    /// [`PgServer::start`] does.
    pub fn waldir(mut self, waldir: &Path) -> Self {
        self.waldir = Some(waldir.to_path_buf());
        self
    }

    /// Password of every role the stack creates and of every cluster DSN.
    pub fn password(mut self, password: &str) -> Self {
        self.password = password.to_string();
        self
    }

    /// A login role, member of pg_monitor when `monitor`; created in the
    /// order given.
    pub fn role(mut self, name: &str, monitor: bool) -> Self {
        self.roles.push((name.to_string(), monitor));
        self
    }

    /// Runs `f` on the server after the roles exist, before the exporter
    /// starts; several run in the order given.
    pub fn setup(mut self, f: impl FnOnce(&PgServer) + 'a) -> Self {
        self.setup.push(Box::new(f));
        self
    }

    /// Top of the generated configuration: top-level keys, `[defaults]`
    /// (default `window = "1m"`).
    pub fn config_head(mut self, text: &str) -> Self {
        self.head = lines(text);
        self
    }

    /// A probed `[[volume]]` named `t` in `<work>/vol`, with these keys.
    pub fn volume(mut self, fields: &str) -> Self {
        self.volume = Some(lines(fields));
        self
    }

    /// A `[[cluster]]` watched as `role`, with these keys.
    pub fn cluster(self, name: &str, role: &str, fields: &str) -> Self {
        self.cluster_dsn(name, role, "", fields)
    }

    /// [`Self::cluster`] with `dsn_params` appended to the role's DSN.
    pub fn cluster_dsn(mut self, name: &str, role: &str, dsn_params: &str, fields: &str) -> Self {
        self.clusters.push(ClusterSpec {
            name: name.to_string(),
            role: role.to_string(),
            dsn_params: dsn_params.to_string(),
            fields: lines(fields),
        });
        self
    }

    /// The whole configuration file instead of the generated one.
    pub fn config(mut self, text: &str) -> Self {
        self.config = Some(text.to_string());
        self
    }

    /// No configuration file: the exporter's flags are what `f` returns for
    /// the server and the work dir.
    pub fn cli(mut self, f: impl FnOnce(&PgServer, &Path) -> Vec<String> + 'a) -> Self {
        self.cli = Some(Box::new(f));
        self
    }

    /// More flags for the exporter, after the others.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Waits up to `timeout` after the start for a scrape where `pred`
    /// holds (see [`Exporter::wait_for`]); it becomes [`Stack::ready`].
    pub fn ready(
        mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool + 'a,
    ) -> Self {
        self.ready = Some((what.to_string(), timeout, Box::new(pred)));
        self
    }

    /// [`Self::ready`] once `cluster` is up (`pgstorage_pg_up` 1), within 30 s.
    pub fn ready_pg_up(self, cluster: &str) -> Self {
        let series = format!("pgstorage_pg_up{{cluster=\"{cluster}\"}}");
        self.ready("pg_up 1", Duration::from_secs(30), move |m| {
            sample(m, &series) == Some(1.0)
        })
    }

    /// Steps 1 to 3 only, for a test that starts its exporters itself:
    /// the server with its roles, set up; `None` to skip.
    pub fn start_postgres(mut self) -> Option<PgServer> {
        self.postgres()
    }

    fn postgres(&mut self) -> Option<PgServer> {
        let pg = PgServer::start(self.kind, self.waldir.as_deref())?;
        for (name, monitor) in &self.roles {
            pg.create_role(name, &self.password, *monitor);
        }
        for f in self.setup.drain(..) {
            f(&pg);
        }
        Some(pg)
    }

    /// The generated configuration, for the server and the work dir.
    fn generated_config(&self, pg: &PgServer, work: &Path) -> String {
        let mut cfg = self.head.clone();
        if let Some(fields) = &self.volume {
            cfg.push_str(&format!(
                "[[volume]]\nname = \"t\"\npath = \"{}\"\n{fields}",
                work.join(VOLUME_DIR).display()
            ));
        }
        for c in &self.clusters {
            let mut dsn = pg.dsn(&c.role, &self.password);
            if !c.dsn_params.is_empty() {
                dsn = format!("{dsn} {}", c.dsn_params);
            }
            cfg.push_str(&format!(
                "[[cluster]]\nname = \"{}\"\ndsn = \"{dsn}\"\n{}",
                c.name, c.fields
            ));
        }
        cfg
    }

    /// Starts everything (see the module docs); `None` when PostgreSQL is
    /// not installed and the test should skip.
    pub fn start(mut self) -> Option<Stack> {
        let pg = self.postgres()?;
        let work = tempfile::Builder::new()
            .prefix("pgse-stack-")
            .tempdir()
            .unwrap();
        if self.volume.is_some() {
            std::fs::create_dir_all(work.path().join(VOLUME_DIR)).unwrap();
        }
        let mut args = match self.cli.take() {
            Some(cli) => cli(&pg, work.path()),
            None => {
                let text = match &self.config {
                    Some(text) => text.clone(),
                    None => self.generated_config(&pg, work.path()),
                };
                let path = work.path().join(CONFIG_FILE);
                std::fs::write(&path, text).unwrap();
                vec!["--config.file".to_string(), path.display().to_string()]
            }
        };
        args.append(&mut self.args);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let ex = Exporter::start(&refs);
        let ready = match &self.ready {
            Some((what, timeout, pred)) => ex.wait_for(what, *timeout, pred),
            None => String::new(),
        };
        Some(Stack {
            ex,
            pg,
            work,
            ready,
            password: self.password,
        })
    }
}
