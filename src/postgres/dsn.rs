//! PostgreSQL connection strings: libpq `key=value` strings and
//! `postgresql://` URLs, libpq's environment variables and password file,
//! turned into a `tokio_postgres::Config`. Passwords are never part of any
//! string this module returns for display.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

/// libpq connection keywords (PostgreSQL 18). A `--pg.dsn NAME=...` prefix
/// counts as a cluster name only when it is not one of these, so
/// `host=/run/postgresql user=x` stays a plain DSN.
pub const LIBPQ_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslkeylogfile",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "min_protocol_version",
    "max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "scram_client_key",
    "scram_server_key",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

/// Keywords this exporter accepts; others are refused by name rather than
/// silently ignored. `client_encoding` and `fallback_application_name` are
/// accepted and have no effect (the exporter reads numbers and sets its own
/// application_name).
const SUPPORTED: &[&str] = &[
    "host",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "connect_timeout",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "sslmode",
    "sslrootcert",
    "target_session_attrs",
    "client_encoding",
];

/// libpq's environment variables and the keyword each one defaults.
const ENV_DEFAULTS: &[(&str, &str)] = &[
    ("PGHOST", "host"),
    ("PGPORT", "port"),
    ("PGDATABASE", "dbname"),
    ("PGUSER", "user"),
    ("PGPASSWORD", "password"),
    ("PGPASSFILE", "passfile"),
    ("PGCONNECT_TIMEOUT", "connect_timeout"),
    ("PGOPTIONS", "options"),
    ("PGSSLMODE", "sslmode"),
    ("PGSSLROOTCERT", "sslrootcert"),
    ("PGTARGETSESSIONATTRS", "target_session_attrs"),
    ("PGAPPNAME", "application_name"),
];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DsnError {
    #[error("invalid connection string: {0}")]
    Syntax(String),
    #[error("connection option {0:?} is not supported by pg-storage-exporter")]
    Unsupported(String),
    #[error("connection option {key:?}: invalid value {value:?}: {why}")]
    Value {
        key: String,
        value: String,
        why: String,
    },
    #[error("password file {}: {why}", path.display())]
    PasswordFile { path: PathBuf, why: String },
}

/// How to secure the connection, libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> Option<SslMode> {
        Some(match v {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A connection target, ready to connect.
#[derive(Debug, Clone)]
pub struct Target {
    pub config: tokio_postgres::Config,
    pub ssl_mode: SslMode,
    pub ssl_root_cert: Option<PathBuf>,
    /// host, port, user, dbname, sslmode: for logs and errors, never a password.
    pub display: String,
    /// First host as written (a socket directory or a name).
    pub host: String,
    pub port: u16,
}

/// Splits `--pg.dsn NAME=DSN`: the prefix is a name only when it looks like
/// one and is not a libpq keyword.
pub fn split_name(spec: &str) -> (Option<&str>, &str) {
    if let Some((n, rest)) = spec.split_once('=')
        && !n.is_empty()
        && !rest.is_empty()
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !LIBPQ_KEYWORDS.contains(&n.trim())
    {
        return (Some(n), rest);
    }
    (None, spec)
}

/// Parses a DSN (URL or key=value) into libpq keywords.
pub fn parse(dsn: &str) -> Result<BTreeMap<String, String>, DsnError> {
    let t = dsn.trim();
    if t.starts_with("postgresql://") || t.starts_with("postgres://") {
        parse_url(t)
    } else {
        parse_kv(t)
    }
}

fn parse_kv(s: &str) -> Result<BTreeMap<String, String>, DsnError> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.next() != Some('=') {
            return Err(DsnError::Syntax(format!("missing \"=\" after {key:?}")));
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(n) = chars.next() {
                            value.push(n);
                        }
                    }
                    '\'' => {
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(DsnError::Syntax(format!(
                    "unterminated quoted value of {key:?}"
                )));
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        value.push(n);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        if key.is_empty() {
            return Err(DsnError::Syntax("empty keyword".into()));
        }
        out.insert(key, value);
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, DsnError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| DsnError::Syntax("invalid percent-encoding in URL".into()))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| DsnError::Syntax("URL is not UTF-8 after decoding".into()))
}

fn parse_url(s: &str) -> Result<BTreeMap<String, String>, DsnError> {
    let mut out = BTreeMap::new();
    let rest = s.split_once("://").map(|(_, r)| r).unwrap_or(s);
    let (rest, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    let hosts = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (u, p) = match userinfo.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (userinfo, None),
            };
            if !u.is_empty() {
                out.insert("user".into(), percent_decode(u)?);
            }
            if let Some(p) = p {
                out.insert("password".into(), percent_decode(p)?);
            }
            hosts
        }
        None => authority,
    };
    if !hosts.is_empty() {
        let mut hs = Vec::new();
        let mut ps = Vec::new();
        for h in hosts.split(',') {
            // [v6addr]:port or host:port
            let (host, port) = if let Some(r) = h.strip_prefix('[') {
                match r.split_once(']') {
                    Some((a, p)) => (a.to_string(), p.strip_prefix(':').map(str::to_string)),
                    None => return Err(DsnError::Syntax("unterminated [ in URL host".into())),
                }
            } else {
                match h.rsplit_once(':') {
                    Some((a, p)) => (a.to_string(), Some(p.to_string())),
                    None => (h.to_string(), None),
                }
            };
            hs.push(percent_decode(&host)?);
            ps.push(port.unwrap_or_default());
        }
        if hs.iter().any(|h| !h.is_empty()) {
            out.insert("host".into(), hs.join(","));
        }
        if ps.iter().any(|p| !p.is_empty()) {
            out.insert("port".into(), ps.join(","));
        }
    }
    if let Some(p) = path
        && !p.is_empty()
    {
        out.insert("dbname".into(), percent_decode(p)?);
    }
    if let Some(q) = query {
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| DsnError::Syntax(format!("URL parameter {pair:?} has no value")))?;
            out.insert(percent_decode(k)?, percent_decode(v)?);
        }
    }
    Ok(out)
}

/// Where the environment comes from (tests pass a map).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn os_user() -> Option<String> {
    // The effective user's name, looked up with getpwuid_r (getpwuid's
    // static buffer is shared by all threads).
    whoami::username_os()
        .ok()
        .map(|n| n.to_string_lossy().into_owned())
}

/// Builds a connection target from a DSN, libpq's environment variables for
/// keywords the DSN leaves out, an optional password file of our own
/// (`password_file`: the password alone, one line), then libpq's passfile.
pub fn target(dsn: &str, env: Env<'_>, password_file: Option<&Path>) -> Result<Target, DsnError> {
    let mut kv = parse(dsn)?;
    for k in kv.keys() {
        if !LIBPQ_KEYWORDS.contains(&k.as_str()) {
            return Err(DsnError::Syntax(format!("unknown connection option {k:?}")));
        }
        if !SUPPORTED.contains(&k.as_str()) {
            return Err(DsnError::Unsupported(k.clone()));
        }
    }
    for (var, key) in ENV_DEFAULTS {
        // A configured password file is more specific than PGPASSWORD.
        if *key == "password" && password_file.is_some() {
            continue;
        }
        if !kv.contains_key(*key)
            && let Some(v) = env(var)
            && !v.is_empty()
        {
            kv.insert((*key).to_string(), v);
        }
    }
    let host = kv.get("host").cloned().unwrap_or_else(|| {
        // Debian's libpq looks for the socket here; upstream's default is /tmp.
        if Path::new("/var/run/postgresql").is_dir() {
            "/var/run/postgresql".to_string()
        } else {
            "/tmp".to_string()
        }
    });
    let port: u16 = match kv.get("port") {
        Some(p) => p
            .split(',')
            .next()
            .unwrap_or("5432")
            .parse()
            .map_err(|_| DsnError::Value {
                key: "port".into(),
                value: p.clone(),
                why: "not a port number".into(),
            })?,
        None => 5432,
    };
    let user = kv
        .get("user")
        .cloned()
        .or_else(os_user)
        .unwrap_or_else(|| "postgres".into());
    let dbname = kv.get("dbname").cloned().unwrap_or_else(|| user.clone());
    let ssl_mode = match kv.get("sslmode") {
        Some(m) => SslMode::parse(m).ok_or_else(|| DsnError::Value {
            key: "sslmode".into(),
            value: m.clone(),
            why: "use disable, allow, prefer, require, verify-ca or verify-full".into(),
        })?,
        None => SslMode::Prefer,
    };

    let mut password = kv.get("password").cloned();
    if password.is_none()
        && let Some(pf) = password_file
    {
        let text = std::fs::read_to_string(pf).map_err(|e| DsnError::PasswordFile {
            path: pf.to_path_buf(),
            why: e.to_string(),
        })?;
        password = Some(text.trim_end_matches(['\n', '\r']).to_string());
    }
    if password.is_none() {
        let passfile = kv
            .get("passfile")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".pgpass")));
        if let Some(pf) = passfile {
            password = pgpass_lookup_file(&pf, &host, port, &dbname, &user);
        }
    }

    let mut c = tokio_postgres::Config::new();
    for h in host.split(',') {
        c.host(h);
    }
    c.port(port);
    c.user(&user);
    c.dbname(&dbname);
    if let Some(p) = &password {
        c.password(p.as_bytes());
    }
    c.application_name(
        kv.get("application_name")
            .map(String::as_str)
            .unwrap_or("pg-storage-exporter"),
    );
    if let Some(o) = kv.get("options") {
        c.options(o);
    }
    let timeout = match kv.get("connect_timeout") {
        Some(t) => {
            let secs: u64 = t.parse().map_err(|_| DsnError::Value {
                key: "connect_timeout".into(),
                value: t.clone(),
                why: "not a number of seconds".into(),
            })?;
            Duration::from_secs(secs.max(2))
        }
        None => Duration::from_secs(10),
    };
    c.connect_timeout(timeout);
    if let Some(k) = kv.get("keepalives") {
        c.keepalives(k != "0");
    }
    if let Some(k) = kv.get("keepalives_idle")
        && let Ok(s) = k.parse::<u64>()
    {
        c.keepalives_idle(Duration::from_secs(s));
    }
    if let Some(t) = kv.get("target_session_attrs") {
        c.target_session_attrs(match t.as_str() {
            "any" => tokio_postgres::config::TargetSessionAttrs::Any,
            "read-write" => tokio_postgres::config::TargetSessionAttrs::ReadWrite,
            "read-only" => tokio_postgres::config::TargetSessionAttrs::ReadOnly,
            _ => {
                return Err(DsnError::Value {
                    key: "target_session_attrs".into(),
                    value: t.clone(),
                    why: "use any, read-write or read-only".into(),
                });
            }
        });
    }
    // libpq never uses TLS over a Unix-domain socket, whatever sslmode says.
    let socket = host.starts_with('/');
    c.ssl_mode(match ssl_mode {
        _ if socket => tokio_postgres::config::SslMode::Disable,
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Allow | SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let display = format!(
        "host={host} port={port} user={user} dbname={dbname} sslmode={}",
        ssl_mode.as_str()
    );
    Ok(Target {
        config: c,
        ssl_mode,
        ssl_root_cert: kv.get("sslrootcert").map(PathBuf::from),
        display,
        host: host.split(',').next().unwrap_or("").to_string(),
        port,
    })
}

fn pgpass_lookup_file(path: &Path, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    if meta.mode() & 0o077 != 0 {
        // libpq ignores a password file others can read, and so do we.
        tracing::warn!(
            file = %path.display(),
            "password file has group or world access; ignoring it (chmod 0600)"
        );
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    pgpass_lookup(&text, host, port, db, user)
}

/// libpq's password file: `host:port:db:user:password` lines, `*` matches
/// anything, `\` escapes `:` and `\`. A socket directory matches the host
/// `localhost`, as in libpq.
pub fn pgpass_lookup(text: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let host = if host.starts_with('/') || host.is_empty() {
        "localhost"
    } else {
        host
    };
    let port = port.to_string();
    for line in text.lines() {
        if line.trim_start().starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::with_capacity(5);
        let mut cur = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        fields.push(cur);
        if fields.len() != 5 {
            continue;
        }
        let ok = |f: &str, v: &str| f == "*" || f == v;
        if ok(&fields[0], host)
            && ok(&fields[1], &port)
            && ok(&fields[2], db)
            && ok(&fields[3], user)
        {
            return fields.pop();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn split_name_table() {
        let cases = [
            (
                "main=host=/run/postgresql",
                (Some("main"), "host=/run/postgresql"),
            ),
            (
                "host=/run/postgresql user=x",
                (None, "host=/run/postgresql user=x"),
            ),
            ("user=x", (None, "user=x")),
            (
                "postgresql://u@h/db?sslmode=require",
                (None, "postgresql://u@h/db?sslmode=require"),
            ),
            (
                "pg18=postgresql://u@h/db",
                (Some("pg18"), "postgresql://u@h/db"),
            ),
            ("sslmode=require", (None, "sslmode=require")),
        ];
        for (spec, want) in cases {
            assert_eq!(split_name(spec), want, "{spec}");
        }
    }

    #[test]
    fn key_value_strings() {
        let kv = parse(
            "host=/run/postgresql  port = 5433 user='mon itor' password='it''s' dbname=postgres",
        )
        .unwrap_err();
        assert!(
            matches!(kv, DsnError::Syntax(_)),
            "'' is not an escape in libpq: {kv}"
        );
        let kv = parse(
            r"host=/run/postgresql port = 5433 user='mon itor' password='it\'s' dbname=postgres",
        )
        .unwrap();
        assert_eq!(kv["host"], "/run/postgresql");
        assert_eq!(kv["port"], "5433");
        assert_eq!(kv["user"], "mon itor");
        assert_eq!(kv["password"], "it's");
        assert!(parse("host").is_err());
        assert!(parse("host='x").is_err());
    }

    #[test]
    fn urls() {
        let kv = parse(
            "postgresql://mon:s%40cret@db.example:5433/app?sslmode=verify-full&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(kv["user"], "mon");
        assert_eq!(kv["password"], "s@cret");
        assert_eq!(kv["host"], "db.example");
        assert_eq!(kv["port"], "5433");
        assert_eq!(kv["dbname"], "app");
        assert_eq!(kv["sslmode"], "verify-full");
        let kv = parse("postgresql:///postgres?host=/var/run/postgresql").unwrap();
        assert_eq!(kv["host"], "/var/run/postgresql");
        assert_eq!(kv["dbname"], "postgres");
        let kv = parse("postgres://[::1]:5432/x").unwrap();
        assert_eq!(kv["host"], "::1");
        let kv = parse("postgresql://%2Frun%2Fpostgresql/db").unwrap();
        assert_eq!(kv["host"], "/run/postgresql");
    }

    #[test]
    fn env_fills_what_the_dsn_leaves_out_and_display_hides_the_password() {
        let env = |k: &str| match k {
            "PGPORT" => Some("6543".to_string()),
            "PGUSER" => Some("envuser".to_string()),
            "PGPASSWORD" => Some("hunter2".to_string()),
            "PGSSLMODE" => Some("disable".to_string()),
            _ => None,
        };
        let t = target("host=127.0.0.1 user=mon", &env, None).unwrap();
        assert_eq!(t.port, 6543);
        assert_eq!(t.config.get_user(), Some("mon"));
        assert_eq!(t.config.get_password(), Some(&b"hunter2"[..]));
        assert_eq!(t.ssl_mode, SslMode::Disable);
        assert_eq!(
            t.display,
            "host=127.0.0.1 port=6543 user=mon dbname=mon sslmode=disable"
        );
        assert!(!format!("{:?} {}", t.config, t.display).contains("hunter2"));
    }

    #[test]
    fn refuses_unknown_and_unsupported_options_by_name() {
        let e = target("host=x colour=blue", &no_env, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid connection string: unknown connection option \"colour\""
        );
        let e = target("host=x sslcert=/c.pem", &no_env, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "connection option \"sslcert\" is not supported by pg-storage-exporter"
        );
        let e = target("host=x sslmode=maybe", &no_env, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"sslmode\": invalid value \"maybe\""),
            "{e}"
        );
        let e = target("host=x port=http", &no_env, None).unwrap_err();
        assert!(e.to_string().contains("\"port\""), "{e}");
    }

    #[test]
    fn password_sources_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let pf = dir.path().join("pw");
        std::fs::write(&pf, "from-file\n").unwrap();
        let env = |k: &str| (k == "PGPASSWORD").then(|| "from-env".to_string());
        let t = target("host=h user=u", &env, Some(&pf)).unwrap();
        assert_eq!(
            t.config.get_password(),
            Some(&b"from-file"[..]),
            "password_file beats PGPASSWORD"
        );
        let t = target("host=h user=u", &env, None).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"from-env"[..]));
        let t = target("host=h user=u", &no_env, Some(&pf)).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"from-file"[..]));
        let t = target("host=h user=u password=inline", &no_env, Some(&pf)).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"inline"[..]));
        let e = target("host=h user=u", &no_env, Some(&dir.path().join("missing"))).unwrap_err();
        assert!(e.to_string().starts_with("password file "), "{e}");
    }

    #[test]
    fn pgpass_matching() {
        let text =
            "# comment\nother:5432:*:u:nope\nlocalhost:5432:*:u:sock\\:pw\n*:*:*:*:fallback\n";
        assert_eq!(
            pgpass_lookup(text, "/var/run/postgresql", 5432, "db", "u").as_deref(),
            Some("sock:pw")
        );
        assert_eq!(
            pgpass_lookup(text, "db.example", 5432, "db", "u").as_deref(),
            Some("fallback")
        );
        assert_eq!(pgpass_lookup("h:1:d:u\n", "h", 1, "d", "u"), None);
    }
}
