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

/// libpq's port when none is given (or an empty one is).
const DEFAULT_PORT: u16 = 5432;

/// The exporter's connect_timeout when the DSN and PGCONNECT_TIMEOUT give
/// none. libpq would wait indefinitely; a collector that hangs on one
/// attempt never reports the cluster down.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Each host as written (a socket directory or a name) with its port,
    /// in the order they are tried.
    pub hosts: Vec<(String, u16)>,
    /// The first host's port.
    pub port: u16,
}

impl Target {
    /// Every host is a Unix-domain socket directory, so no TLS is ever
    /// negotiated (libpq never uses TLS over a socket).
    pub fn sockets_only(&self) -> bool {
        self.hosts.iter().all(|(h, _)| h.starts_with('/'))
    }
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

/// libpq's `isspace()` in the C locale, the only characters that separate
/// key=value pairs. Other whitespace (a no-break space, say) belongs to the
/// keyword or value it is in, as it does in libpq.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

/// Parses a DSN (URL or key=value) into libpq keywords, as libpq's
/// `PQconninfoParse` does: no environment, no defaults, an unknown keyword
/// is an error. A later value of a keyword replaces an earlier one.
pub fn parse(dsn: &str) -> Result<BTreeMap<String, String>, DsnError> {
    // libpq takes a string as a URI only when it starts with one of the two
    // designators, with nothing in front, not even a space.
    for prefix in ["postgresql://", "postgres://"] {
        if let Some(rest) = dsn.strip_prefix(prefix) {
            return parse_url(rest, prefix.len());
        }
    }
    parse_kv(dsn)
}

fn store(out: &mut BTreeMap<String, String>, key: &str, value: String) -> Result<(), DsnError> {
    if !LIBPQ_KEYWORDS.contains(&key) {
        return Err(DsnError::Syntax(format!(
            "unknown connection option {key:?}"
        )));
    }
    out.insert(key.to_string(), value);
    Ok(())
}

/// libpq's keyword/value syntax: spaces around `=` are allowed, a value is
/// either unquoted (up to the next space) or in single quotes, and `\`
/// escapes the next character in both.
fn parse_kv(s: &str) -> Result<BTreeMap<String, String>, DsnError> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    let skip_spaces = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.next_if(|&c| is_space(c)).is_some() {}
    };
    loop {
        skip_spaces(&mut chars);
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|&c| c != '=' && !is_space(c)) {
            key.push(c);
        }
        skip_spaces(&mut chars);
        if chars.next() != Some('=') {
            return Err(DsnError::Syntax(format!("missing \"=\" after {key:?}")));
        }
        skip_spaces(&mut chars);
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => {
                        return Err(DsnError::Syntax(format!(
                            "unterminated quoted value of {key:?}"
                        )));
                    }
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|&c| !is_space(c)) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        store(&mut out, &key, value)?;
    }
    Ok(out)
}

/// Percent-decodes one part of a URL. Errors name the part and never repeat
/// its text, which may be a password (libpq's own messages quote it).
fn decode(s: &str, part: &str) -> Result<String, DsnError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let hex = |j: usize| b.get(j).and_then(|&c| char::from(c).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
            return Err(DsnError::Syntax(format!(
                "invalid percent-encoded token in the URL's {part}"
            )));
        };
        // As in libpq: %00 would cut the value short in C, so it is refused.
        if hi == 0 && lo == 0 {
            return Err(DsnError::Syntax(format!(
                "forbidden value %00 in the URL's {part}"
            )));
        }
        out.push((hi * 16 + lo) as u8);
        i += 3;
    }
    String::from_utf8(out).map_err(|_| {
        DsnError::Syntax(format!(
            "the URL's {part} is not UTF-8 once percent-decoded"
        ))
    })
}

/// libpq's URI syntax (`conninfo_uri_parse_options`):
/// `[user[:password]@][host][:port][,host[:port]...][/dbname][?key=value&...]`,
/// `rest` being what follows the designator (`prefix_len` bytes long).
fn parse_url(rest: &str, prefix_len: usize) -> Result<BTreeMap<String, String>, DsnError> {
    let mut out = BTreeMap::new();
    let b = rest.as_bytes();
    let at = |i: usize| b.get(i).copied();
    let mut p = 0;
    // libpq looks for the "@" of the user part up to the first "/" only.
    if let Some(i) = b.iter().position(|&c| c == b'@' || c == b'/')
        && b[i] == b'@'
    {
        let info = &rest[..i];
        let (user, password) = match info.split_once(':') {
            Some((u, pw)) => (u, Some(pw)),
            None => (info, None),
        };
        if !user.is_empty() {
            out.insert("user".into(), decode(user, "user")?);
        }
        if let Some(pw) = password
            && !pw.is_empty()
        {
            out.insert("password".into(), decode(pw, "password")?);
        }
        p = i + 1;
    }
    // host[:port] pairs separated by commas; the host and port lists keep
    // one item per pair, empty where a pair leaves it out (libpq then uses
    // the default for that host).
    let (mut hosts, mut ports) = (String::new(), String::new());
    let end = loop {
        if at(p) == Some(b'[') {
            let start = p + 1;
            let Some(len) = rest[start..].find(']') else {
                return Err(DsnError::Syntax(
                    "end of string reached when looking for matching \"]\" in IPv6 host address in URL"
                        .into(),
                ));
            };
            if len == 0 {
                return Err(DsnError::Syntax(
                    "IPv6 host address may not be empty in URL".into(),
                ));
            }
            hosts.push_str(&rest[start..start + len]);
            p = start + len + 1;
            // libpq: "]" must be followed by a port, the path, the query,
            // another host or the end; `[::1]6543` is not `[::1]:6543`.
            if let Some(c) = rest[p..].chars().next()
                && !matches!(c, ':' | '/' | '?' | ',')
            {
                return Err(DsnError::Syntax(format!(
                    "unexpected character \"{c}\" at position {} in URL (expected \":\" or \"/\")",
                    prefix_len + p + 1
                )));
            }
        } else {
            let start = p;
            while at(p).is_some_and(|c| !matches!(c, b':' | b'/' | b'?' | b',')) {
                p += 1;
            }
            hosts.push_str(&rest[start..p]);
        }
        if at(p) == Some(b':') {
            // Everything up to the next "/", "?" or "," is the port, so
            // `h:5432:6543` is the port "5432:6543", refused later, never
            // the host "h:5432".
            p += 1;
            let start = p;
            while at(p).is_some_and(|c| !matches!(c, b'/' | b'?' | b',')) {
                p += 1;
            }
            ports.push_str(&rest[start..p]);
        }
        if at(p) != Some(b',') {
            break at(p);
        }
        p += 1;
        hosts.push(',');
        ports.push(',');
    };
    if !hosts.is_empty() {
        out.insert("host".into(), decode(&hosts, "host")?);
    }
    if !ports.is_empty() {
        out.insert("port".into(), decode(&ports, "port")?);
    }
    let mut end = end;
    if end.is_some_and(|c| c != b'?') {
        p += 1;
        let start = p;
        while at(p).is_some_and(|c| c != b'?') {
            p += 1;
        }
        // An empty path leaves dbname unset, so PGDATABASE still applies,
        // as in libpq.
        if p > start {
            out.insert("dbname".into(), decode(&rest[start..p], "database name")?);
        }
        end = at(p);
    }
    if end.is_some() {
        parse_query(&rest[p + 1..], &mut out)?;
    }
    Ok(out)
}

/// libpq's URI query: `key=value` pairs separated by `&`, each with exactly
/// one `=`; both sides percent-decoded.
fn parse_query(mut q: &str, out: &mut BTreeMap<String, String>) -> Result<(), DsnError> {
    while !q.is_empty() {
        let (pair, next) = q.split_once('&').unwrap_or((q, ""));
        q = next;
        let Some((k, v)) = pair.split_once('=') else {
            return Err(DsnError::Syntax(format!(
                "missing key/value separator \"=\" in URL query parameter {pair:?}"
            )));
        };
        if v.contains('=') {
            return Err(DsnError::Syntax(format!(
                "extra key/value separator \"=\" in URL query parameter {k:?}"
            )));
        }
        let key = decode(k, "query parameter name")?;
        let value = decode(v, &format!("query parameter {key:?}"))?;
        // For JDBC's sake libpq reads `ssl=true` (that value only) as
        // sslmode=require.
        if key == "ssl" && value == "true" {
            store(out, "sslmode", "require".into())?;
        } else {
            store(out, &key, value)?;
        }
    }
    Ok(())
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

/// libpq's host when none is given, or an empty one is.
pub fn default_host() -> String {
    // Debian's libpq looks for the socket here; upstream's default is /tmp.
    if Path::new("/var/run/postgresql").is_dir() {
        "/var/run/postgresql".to_string()
    } else {
        "/tmp".to_string()
    }
}

/// A keyword's value, an empty one counting as not given: libpq reads
/// `host=`, `port=`, `user=''` and the like as "the default". (An empty
/// value still keeps the environment variable out, as in libpq.)
fn given<'a>(kv: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    kv.get(key).map(String::as_str).filter(|v| !v.is_empty())
}

/// A libpq integer option, read as libpq's pqParseIntParam does: an
/// optionally signed decimal number with nothing but spaces around it.
fn libpq_int(key: &str, v: &str) -> Result<i32, DsnError> {
    let t = v.trim_matches(is_space);
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = t.parse::<i32>()
    {
        return Ok(n);
    }
    Err(DsnError::Value {
        key: key.into(),
        value: v.into(),
        why: "not an integer".into(),
    })
}

/// One item of `port`: empty is the default port; otherwise 1 to 65535, as
/// libpq requires (0 would reach the kernel as "any port").
fn port_number(item: &str) -> Result<u16, DsnError> {
    if item.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    u16::try_from(libpq_int("port", item)?)
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| DsnError::Value {
            key: "port".into(),
            value: item.into(),
            why: "invalid port number: use 1 to 65535".into(),
        })
}

/// The hosts and their ports, as libpq pairs them: the host list (or the
/// default host), each empty item the default; then one port for every
/// host, or exactly one port per host.
fn hosts_and_ports(kv: &BTreeMap<String, String>) -> Result<Vec<(String, u16)>, DsnError> {
    let hosts: Vec<String> = match given(kv, "host") {
        None => vec![default_host()],
        Some(list) => list
            .split(',')
            .map(|h| {
                if h.is_empty() {
                    default_host()
                } else {
                    h.to_string()
                }
            })
            .collect(),
    };
    if let Some(h) = hosts.iter().find(|h| h.starts_with('@')) {
        return Err(DsnError::Value {
            key: "host".into(),
            value: h.clone(),
            why: "abstract Unix-domain sockets are not supported by pg-storage-exporter".into(),
        });
    }
    let ports: Vec<u16> = match given(kv, "port") {
        None => vec![DEFAULT_PORT; hosts.len()],
        Some(list) => {
            let items: Vec<&str> = list.split(',').collect();
            match items.as_slice() {
                [one] => vec![port_number(one)?; hosts.len()],
                _ if items.len() == hosts.len() => items
                    .iter()
                    .map(|p| port_number(p))
                    .collect::<Result<_, _>>()?,
                _ => {
                    return Err(DsnError::Value {
                        key: "port".into(),
                        value: list.into(),
                        why: format!(
                            "could not match {} port numbers to {} hosts",
                            items.len(),
                            hosts.len()
                        ),
                    });
                }
            }
        }
    };
    Ok(hosts.into_iter().zip(ports).collect())
}

/// Builds a connection target from a DSN, libpq's environment variables for
/// keywords the DSN leaves out, an optional password file of our own
/// (`password_file`: the password alone, one line), then libpq's passfile.
pub fn target(dsn: &str, env: Env<'_>, password_file: Option<&Path>) -> Result<Target, DsnError> {
    let mut kv = parse(dsn)?;
    if let Some(k) = kv.keys().find(|k| !SUPPORTED.contains(&k.as_str())) {
        return Err(DsnError::Unsupported(k.clone()));
    }
    for (var, key) in ENV_DEFAULTS {
        // A configured password file is more specific than PGPASSWORD.
        if *key == "password" && password_file.is_some() {
            continue;
        }
        // libpq consults the variable only for a keyword the DSN does not
        // name at all: `host=''` means the default host, not PGHOST.
        if !kv.contains_key(*key)
            && let Some(v) = env(var)
            && !v.is_empty()
        {
            kv.insert((*key).to_string(), v);
        }
    }
    let hosts = hosts_and_ports(&kv)?;
    let user = given(&kv, "user")
        .map(str::to_string)
        .or_else(os_user)
        .unwrap_or_else(|| "postgres".into());
    let dbname = given(&kv, "dbname")
        .map(str::to_string)
        .unwrap_or_else(|| user.clone());
    let ssl_root_cert = given(&kv, "sslrootcert").map(PathBuf::from);
    let system_roots = ssl_root_cert
        .as_ref()
        .is_some_and(|p| p.as_os_str() == "system");
    // An empty sslmode is no sslmode at all, and libpq refuses it.
    let ssl_mode = match kv.get("sslmode") {
        Some(m) => SslMode::parse(m).ok_or_else(|| DsnError::Value {
            key: "sslmode".into(),
            value: m.clone(),
            why: "use disable, allow, prefer, require, verify-ca or verify-full".into(),
        })?,
        // libpq: the system's trust store makes verify-full the default...
        None if system_roots => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    // ...and the only mode allowed: any public CA's certificate would pass
    // a check without the host name.
    if system_roots && ssl_mode != SslMode::VerifyFull {
        return Err(DsnError::Value {
            key: "sslmode".into(),
            value: ssl_mode.as_str().into(),
            why: "weak sslmode may not be used with sslrootcert=system (use verify-full)".into(),
        });
    }

    let mut password = given(&kv, "password").map(str::to_string);
    if password.is_none()
        && let Some(pf) = password_file
    {
        let text = crate::input::read_to_string(pf, crate::input::Kind::Password).map_err(|e| {
            DsnError::PasswordFile {
                path: pf.to_path_buf(),
                why: e.to_string(),
            }
        })?;
        password = Some(text.trim_end_matches(['\n', '\r']).to_string());
    }
    if password.is_none() {
        let passfile = given(&kv, "passfile")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".pgpass")));
        if let Some(pf) = passfile
            && let Some(text) = pgpass_text(&pf)
        {
            password = one_password(&text, &pf, &hosts, &dbname, &user)?;
        }
    }

    let mut c = tokio_postgres::Config::new();
    // Ports are given one per host, in the same order: tokio-postgres pairs
    // them by position and tries the hosts in turn, as libpq does.
    for (h, p) in &hosts {
        c.host(h);
        c.port(*p);
    }
    c.user(&user);
    c.dbname(&dbname);
    if let Some(p) = &password {
        c.password(p.as_bytes());
    }
    c.application_name(given(&kv, "application_name").unwrap_or("pg-storage-exporter"));
    if let Some(o) = given(&kv, "options") {
        c.options(o);
    }
    // libpq: zero or negative waits indefinitely, and so does the exporter
    // then (no connect_timeout, and no deadline around the attempt). libpq
    // 18 honours 1 as one second; older ones rounded it up to 2.
    match kv.get("connect_timeout") {
        Some(t) => {
            if let Ok(secs) = u64::try_from(libpq_int("connect_timeout", t)?)
                && secs > 0
            {
                c.connect_timeout(Duration::from_secs(secs));
            }
        }
        None => {
            c.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
    }
    if let Some(k) = kv.get("keepalives") {
        c.keepalives(libpq_int("keepalives", k)? != 0);
    }
    if let Some(k) = kv.get("keepalives_idle") {
        let secs = u64::try_from(libpq_int("keepalives_idle", k)?)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| DsnError::Value {
                key: "keepalives_idle".into(),
                value: k.clone(),
                why: "use at least 1 second".into(),
            })?;
        c.keepalives_idle(Duration::from_secs(secs));
    }
    if let Some(t) = kv.get("target_session_attrs") {
        use tokio_postgres::config::TargetSessionAttrs as A;
        // tokio-postgres asks `SHOW transaction_read_only` after connecting,
        // which is what libpq's read-write and read-only check.
        c.target_session_attrs(match t.as_str() {
            "any" => A::Any,
            "read-write" => A::ReadWrite,
            "read-only" => A::ReadOnly,
            "primary" | "standby" | "prefer-standby" => {
                return Err(DsnError::Value {
                    key: "target_session_attrs".into(),
                    value: t.clone(),
                    why: "not supported by pg-storage-exporter: use any, read-write or read-only"
                        .into(),
                });
            }
            _ => {
                return Err(DsnError::Value {
                    key: "target_session_attrs".into(),
                    value: t.clone(),
                    why: "use any, read-write or read-only".into(),
                });
            }
        });
    }
    let port = hosts.first().map_or(DEFAULT_PORT, |(_, p)| *p);
    let mut t = Target {
        config: c,
        ssl_mode,
        ssl_root_cert,
        display: String::new(),
        hosts,
        port,
    };
    // libpq never uses TLS over a Unix-domain socket, whatever sslmode says.
    // tokio-postgres has one sslmode for all hosts, so only a list of
    // sockets alone turns it off.
    t.config.ssl_mode(match ssl_mode {
        _ if t.sockets_only() => tokio_postgres::config::SslMode::Disable,
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Allow | SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    let list =
        |f: &dyn Fn(&(String, u16)) -> String| t.hosts.iter().map(f).collect::<Vec<_>>().join(",");
    t.display = format!(
        "host={} port={} user={user} dbname={dbname} sslmode={}",
        list(&|(h, _)| h.clone()),
        list(&|(_, p)| p.to_string()),
        ssl_mode.as_str()
    );
    Ok(t)
}

/// libpq's password file, unless others can read it.
fn pgpass_text(path: &Path) -> Option<String> {
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
    match crate::input::read_to_string(path, crate::input::Kind::Passfile) {
        Ok(t) => Some(t),
        // libpq warns about a passfile that is not a plain file and goes
        // on without it; so does a missing or unreadable one here, silently.
        Err(e) if e.get_ref().is_some_and(|r| r.is::<crate::input::Refused>()) => {
            tracing::warn!(file = %path.display(), error = %e, "ignoring the password file");
            None
        }
        Err(_) => None,
    }
}

/// The passfile's password for the hosts of a DSN. libpq looks one up for
/// each host and port; tokio-postgres sends a single password to whichever
/// host answers. So the hosts must all get the same answer: otherwise one
/// host's password could be sent to another, and the DSN is refused.
fn one_password(
    text: &str,
    path: &Path,
    hosts: &[(String, u16)],
    db: &str,
    user: &str,
) -> Result<Option<String>, DsnError> {
    let mut found = hosts
        .iter()
        .map(|(h, p)| pgpass_lookup(text, h, *p, db, user));
    let first = found.next().flatten();
    if found.all(|f| f == first) {
        return Ok(first);
    }
    Err(DsnError::PasswordFile {
        path: path.to_path_buf(),
        why: "its lines give the hosts of this DSN different passwords (or a password to some \
              of them only), and one password is sent to whichever host answers: give the \
              password in the DSN, a password_file or PGPASSWORD, or make the lines agree"
            .into(),
    })
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
    fn multi_host_targets() {
        let t = target(
            "host=127.0.0.1,db2 port=5432,5433 user=u sslmode=require",
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(
            t.hosts,
            [("127.0.0.1".to_string(), 5432), ("db2".to_string(), 5433)]
        );
        assert_eq!(t.port, 5432);
        assert_eq!(
            t.display,
            "host=127.0.0.1,db2 port=5432,5433 user=u dbname=u sslmode=require"
        );
        assert!(!t.sockets_only());
        // A socket first must not switch TLS off for the TCP host after it.
        let t = target("host=/run/pg,db2 user=u sslmode=require", &no_env, None).unwrap();
        assert!(!t.sockets_only());
        assert_eq!(
            t.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        let t = target("host=/run/pg,/tmp user=u sslmode=require", &no_env, None).unwrap();
        assert!(t.sockets_only());
        assert_eq!(
            t.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
    }

    #[test]
    fn passfile_per_host_must_agree() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pf = dir.path().join("pgpass");
        std::fs::write(
            &pf,
            "h1:5432:*:u:Pw1xq\nh2:5433:*:u:Pw2xq\n*:6000:*:u:all\n",
        )
        .unwrap();
        std::fs::set_permissions(&pf, std::fs::Permissions::from_mode(0o600)).unwrap();
        let dsn = |rest: &str| format!("user=u passfile={} {rest}", pf.display());
        let t = target(&dsn("host=h1,h2 port=6000"), &no_env, None).unwrap();
        assert_eq!(
            t.config.get_password(),
            Some(&b"all"[..]),
            "the same line for both"
        );
        let t = target(&dsn("host=h1 port=5432"), &no_env, None).unwrap();
        assert_eq!(t.config.get_password(), Some(&b"Pw1xq"[..]));
        for rest in ["host=h1,h2 port=5432,5433", "host=h1,h3 port=5432"] {
            let e = target(&dsn(rest), &no_env, None).unwrap_err();
            let text = e.to_string();
            assert!(text.starts_with("password file "), "{text}");
            assert!(!text.contains("Pw1xq") && !text.contains("Pw2xq"), "{text}");
        }
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

#[cfg(test)]
mod libpq_cases;
