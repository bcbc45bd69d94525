//! PostgreSQL connection strings: libpq `key=value` strings and
//! `postgresql://` URLs, libpq's environment variables and password file,
//! turned into a `tokio_postgres::Config`. Passwords are never part of any
//! string this module returns for display.

use std::collections::BTreeMap;
use std::ops::Range;
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
    "service",
    "replication",
];

/// The keywords a URL may give as bytes that are not UTF-8: the ones that
/// reach the server in the startup message (and the password, which the
/// driver takes as bytes). A host, port or setting of libpq must be text.
const RAW_KEYWORDS: &[&str] = &["user", "password", "dbname", "options", "application_name"];

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

/// Why a DSN was refused. No variant carries text of the DSN other than a
/// keyword from [`LIBPQ_KEYWORDS`]: a password with an unquoted space, an
/// unencoded `@` or `/` is cut where libpq cuts it, and its pieces land in
/// the next word, the host, the port or the database name. So errors say
/// which part is wrong and where (a keyword, a URL part, a character
/// position counted from 1), never what it holds.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DsnError {
    #[error("invalid connection string: {0}")]
    Syntax(String),
    #[error("connection option {0:?} is not supported by pg-storage-exporter")]
    Unsupported(&'static str),
    #[error("connection option {key:?}: {why}")]
    Value { key: &'static str, why: String },
    /// A connection service file that cannot be read, or one of its
    /// lines (`line`, from 1). The path comes from the environment or the
    /// home directory, never from the DSN, so it is shown; the line's
    /// text is not (it may hold a password).
    #[error("{}", service_file_message(path, *line, why))]
    ServiceFile {
        path: PathBuf,
        line: Option<usize>,
        why: String,
    },
    /// `shown` is the path, or "the passfile named in the DSN" when the
    /// path is DSN text (a password typed after `passfile=`).
    #[error("{shown}: {why}")]
    PasswordFile {
        path: PathBuf,
        shown: String,
        why: String,
    },
}

fn syntax(message: String) -> DsnError {
    DsnError::Syntax(message)
}

fn service_file_message(path: &Path, line: Option<usize>, why: &str) -> String {
    match line {
        Some(n) => format!("service file {}, line {n}: {why}", path.display()),
        None => format!("service file {}: {why}", path.display()),
    }
}

/// libpq's `target_session_attrs` values that tokio-postgres does not
/// have (libpq 14's): the exporter tries the hosts itself and checks each
/// server's `in_hot_standby`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerType {
    /// Not in hot standby (`pg_is_in_recovery()` false).
    Primary,
    /// In hot standby.
    Standby,
    /// A standby if any host is one, else any server: libpq tries every
    /// host for a standby, then every host again for any server.
    PreferStandby,
}

impl ServerType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ServerType::Primary => "primary",
            ServerType::Standby => "standby",
            ServerType::PreferStandby => "prefer-standby",
        }
    }
}
/// How to secure the connection, libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
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

    pub(crate) fn as_str(self) -> &'static str {
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
    pub(crate) config: tokio_postgres::Config,
    pub(crate) ssl_mode: SslMode,
    pub(crate) ssl_root_cert: Option<PathBuf>,
    /// host, port, user, dbname, sslmode, for logs and errors: built from
    /// the parsed and checked parts only, never from the DSN's text, so
    /// never a password nor a piece of one.
    pub display: String,
    /// Each host as written (a socket directory or a name) with its port,
    /// in the order they are tried.
    pub(crate) hosts: Vec<(String, u16)>,
    /// The first host's port.
    pub(crate) port: u16,
    /// `target_session_attrs` primary, standby or prefer-standby: the
    /// hosts are tried one at a time by the exporter, not tokio-postgres.
    pub(crate) server_type: Option<ServerType>,
    /// `config` without hosts and ports, for [`Target::for_host`].
    base: tokio_postgres::Config,
    /// Startup-message parameters to send in place of tokio-postgres's
    /// (by the protocol's names: `user`, `database`, ...) or besides them
    /// (`replication`): bytes that are not UTF-8, which the driver's
    /// `Config` cannot hold, and the walsender request it has no setting
    /// for. Empty for almost every target.
    pub(crate) startup: Vec<(&'static str, Vec<u8>)>,
    /// `replication=database`: the server runs a logical-replication
    /// walsender, which takes SQL over the simple query protocol only.
    pub(crate) replication: bool,
}

/// A host that names a Unix-domain socket directory: a path, or (libpq
/// 14 and later, on Linux) a name in the abstract namespace after `@`.
pub(crate) fn is_socket(host: &str) -> bool {
    host.starts_with('/') || host.starts_with('@')
}

impl Target {
    /// The target of host `i` alone, with that host's TLS rule: what the
    /// exporter's own host loop connects to.
    pub(crate) fn for_host(&self, i: usize) -> Option<Target> {
        let (h, p) = self.hosts.get(i)?.clone();
        let mut config = self.base.clone();
        config.host(&h);
        config.port(p);
        config.ssl_mode(driver_ssl_mode(self.ssl_mode, is_socket(&h)));
        Some(Target {
            config,
            ssl_mode: self.ssl_mode,
            ssl_root_cert: self.ssl_root_cert.clone(),
            display: self.display.clone(),
            hosts: vec![(h, p)],
            port: p,
            server_type: None,
            base: self.base.clone(),
            startup: self.startup.clone(),
            replication: self.replication,
        })
    }

    /// How many times a connection attempt may try each host: twice for
    /// prefer-standby (a pass for a standby, then one for any server).
    pub(crate) fn passes(&self) -> u32 {
        if self.server_type == Some(ServerType::PreferStandby) {
            2
        } else {
            1
        }
    }

    /// Every host is a Unix-domain socket directory, so no TLS is ever
    /// negotiated (libpq never uses TLS over a socket).
    pub(crate) fn sockets_only(&self) -> bool {
        self.hosts.iter().all(|(h, _)| is_socket(h))
    }

    /// The exporter must open the connection itself (see `tls::connect`):
    /// an abstract socket, which tokio-postgres cannot reach, or a startup
    /// message to rewrite.
    pub(crate) fn needs_own_connect(&self) -> bool {
        !self.startup.is_empty() || self.hosts.iter().any(|(h, _)| h.starts_with('@'))
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
    let (kv, raw) = parse_bytes(dsn)?;
    match raw.keys().next() {
        Some(k) => Err(DsnError::Value {
            key: keyword(k).unwrap_or("dbname"),
            why: "not UTF-8 once percent-decoded".into(),
        }),
        None => Ok(kv),
    }
}

/// [`parse`], with the URL values that are not UTF-8 once percent-decoded
/// kept apart as bytes (a key=value string is text throughout).
pub(crate) fn parse_bytes(dsn: &str) -> Result<(BTreeMap<String, String>, Raw), DsnError> {
    // libpq takes a string as a URI only when it starts with one of the two
    // designators, with nothing in front, not even a space.
    for prefix in ["postgresql://", "postgres://"] {
        if dsn.starts_with(prefix) {
            return parse_url(dsn, prefix.len());
        }
    }
    parse_kv(dsn).map(|kv| (kv, Raw::new()))
}

/// The entry of [`LIBPQ_KEYWORDS`] equal to `word`: the only DSN text an
/// error may quote.
fn keyword(word: &str) -> Option<&'static str> {
    LIBPQ_KEYWORDS.iter().copied().find(|&k| k == word)
}

/// A word of a key=value string, for an error: its name when it is a libpq
/// keyword, else only where it starts.
fn word_at(key: Option<&'static str>, at: usize) -> String {
    match key {
        Some(k) => format!("{k:?} at character {at}"),
        None => format!("the word at character {at}"),
    }
}

/// Where a word that is no keyword sits, for an error: after an unquoted
/// value, it is most likely the rest of that value, cut at a space
/// (`password=Sekr1t Zebra42`). `certain`: the word has no `=` at all.
fn cut_value_hint(before: Option<(&'static str, bool)>, word: &str, certain: bool) -> String {
    match before {
        _ if word.contains("://") => {
            " (a URL must start the string, with postgresql:// or postgres://)".into()
        }
        Some((k, true)) if certain => format!(
            ", which follows the unquoted value of {k:?}: a value with a space in it must be in \
             single quotes ({k}='...', with \\' and \\\\ for a quote and a backslash)"
        ),
        Some((k, true)) => format!(
            ", after the value of {k:?} (if that value has a space in it, quote it: {k}='...')"
        ),
        Some((k, false)) => format!(", after the value of {k:?}"),
        None => String::new(),
    }
}

/// libpq's keyword/value syntax: spaces around `=` are allowed, a value is
/// either unquoted (up to the next space) or in single quotes, and `\`
/// escapes the next character in both.
fn parse_kv(s: &str) -> Result<BTreeMap<String, String>, DsnError> {
    let c: Vec<char> = s.chars().collect();
    let mut out = BTreeMap::new();
    let mut i = 0;
    // The keyword before, and whether its value was unquoted.
    let mut before: Option<(&'static str, bool)> = None;
    let skip_spaces = |i: &mut usize| {
        while c.get(*i).is_some_and(|&ch| is_space(ch)) {
            *i += 1;
        }
    };
    loop {
        skip_spaces(&mut i);
        if i == c.len() {
            break;
        }
        let start = i;
        while c.get(i).is_some_and(|&ch| ch != '=' && !is_space(ch)) {
            i += 1;
        }
        let word: String = c[start..i].iter().collect();
        let key = keyword(&word);
        skip_spaces(&mut i);
        if c.get(i) != Some(&'=') {
            return Err(syntax(format!(
                "missing \"=\" after {}{}",
                word_at(key, start + 1),
                if key.is_some() {
                    String::new()
                } else {
                    cut_value_hint(before, &word, true)
                }
            )));
        }
        i += 1;
        skip_spaces(&mut i);
        let mut value = String::new();
        let quoted = c.get(i) == Some(&'\'');
        if quoted {
            let open = i + 1;
            i += 1;
            loop {
                match c.get(i) {
                    None => {
                        return Err(syntax(format!(
                            "unterminated quoted value of {} (its quote is at character {open})",
                            word_at(key, start + 1)
                        )));
                    }
                    Some('\\') => {
                        value.extend(c.get(i + 1));
                        i = (i + 2).min(c.len());
                    }
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some(&ch) => {
                        value.push(ch);
                        i += 1;
                    }
                }
            }
        } else {
            while let Some(&ch) = c.get(i).filter(|&&ch| !is_space(ch)) {
                if ch == '\\' {
                    value.extend(c.get(i + 1));
                    i = (i + 2).min(c.len());
                } else {
                    value.push(ch);
                    i += 1;
                }
            }
        }
        let Some(key) = key else {
            return Err(syntax(format!(
                "unknown connection option at character {}{}",
                start + 1,
                cut_value_hint(before, &word, false)
            )));
        };
        store(&mut out, key, value);
        before = Some((key, !quoted));
    }
    Ok(out)
}

/// Stores a keyword's value as libpq's `conninfo_storeval` does: the
/// deprecated `requiressl` is stored as `sslmode`, `require` when its value
/// starts with "1" and `prefer` (libpq's default) for anything else, so
/// that of the two keywords the one written last wins.
fn store(out: &mut BTreeMap<String, String>, key: &str, value: String) {
    if key == "requiressl" {
        let mode = if value.starts_with('1') {
            "require"
        } else {
            "prefer"
        };
        out.insert("sslmode".into(), mode.into());
    } else {
        out.insert(key.to_string(), value);
    }
}

/// Which ends of a URL part may carry spaces: libpq 18 drops spaces
/// before and after a part's text and refuses one inside it (earlier
/// versions kept them). A host or port list is one part to libpq, so only
/// its first item may start with spaces and only its last may end with
/// them.
#[derive(Clone, Copy)]
struct Ends {
    first: bool,
    last: bool,
}

const WHOLE: Ends = Ends {
    first: true,
    last: true,
};

/// Values of a URL that are not UTF-8 once percent-decoded, by keyword:
/// libpq keeps any bytes, and a server whose encoding is not UTF-8 may
/// have a database or role by such a name (`caf%E9` in LATIN1).
pub(crate) type Raw = BTreeMap<String, Vec<u8>>;

/// Percent-decodes one part of a URL, `from` being the character position
/// of its first character. Errors name the part and the position, never
/// the text, which may be a password (libpq's own messages quote it).
fn decode(s: &str, part: &str, from: usize, ends: Ends) -> Result<Vec<u8>, DsnError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    if ends.first {
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
    }
    // Every byte looked at below is ASCII, so `i` is a character boundary.
    let at = |i: usize| from + s[..i].chars().count();
    while i < b.len() {
        if b[i] == b' ' {
            let rest = &b[i..];
            if ends.last && rest.iter().all(|&c| c == b' ') {
                break;
            }
            return Err(syntax(format!(
                "unexpected space in the URL's {part} at character {} (percent-encode a space as \
                 %20)",
                at(i)
            )));
        }
        if b[i] != b'%' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let hex = |j: usize| b.get(j).and_then(|&c| char::from(c).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
            return Err(syntax(format!(
                "invalid percent-encoded token in the URL's {part} at character {} (\"%\" must \
                 be followed by two hexadecimal digits; a \"%\" itself is %25)",
                at(i)
            )));
        };
        // As in libpq: %00 would cut the value short in C, so it is refused.
        if hi == 0 && lo == 0 {
            return Err(syntax(format!(
                "forbidden value %00 in the URL's {part} at character {}",
                at(i)
            )));
        }
        out.push((hi * 16 + lo) as u8);
        i += 3;
    }
    Ok(out)
}

/// Stores a decoded URL value: as text when it is UTF-8 (through
/// [`store`]), else its bytes in `raw`. A later value of a keyword
/// replaces an earlier one, whichever map held it.
fn store_bytes(out: &mut BTreeMap<String, String>, raw: &mut Raw, key: &str, value: Vec<u8>) {
    match String::from_utf8(value) {
        Ok(text) => {
            raw.remove(key);
            store(out, key, text);
        }
        // libpq reads requiressl by its first byte alone.
        Err(e) if key == "requiressl" => {
            store(
                out,
                key,
                if e.as_bytes().first() == Some(&b'1') {
                    "1"
                } else {
                    ""
                }
                .into(),
            );
        }
        Err(e) => {
            out.remove(key);
            raw.insert(key.to_string(), e.into_bytes());
        }
    }
}

/// The `@` rule of URLs, checked before [`parse`]: an unencoded `@` is
/// allowed once, before the first `/`. libpq reads the user name and
/// password up to the first `@` before the first `/`, and the rest as
/// hosts, ports and the database name; psql 15 and 18 agree
/// (`postgresql://u:a@b@h/db` looks up the host `b@h`, and
/// `postgresql://u:a/b@h/db` reads the port `a`). A password with an
/// unencoded `@` or `/` therefore ends up, in part, as a host, a port or a
/// database name, which libpq prints in its errors and may even connect to
/// (`u:1234/x@h` is the host `u` on port 1234). Any other `@` is refused:
/// an `@` in a database name or query value must be encoded as well, since
/// it cannot be told from the rest of a password cut at a `/`.
fn check_url_at_signs(dsn: &str) -> Result<(), DsnError> {
    let Some(prefix_len) = ["postgresql://", "postgres://"]
        .iter()
        .find(|p| dsn.starts_with(**p))
        .map(|p| p.len())
    else {
        return Ok(());
    };
    let rest = &dsn[prefix_len..];
    let at = |i: usize| dsn[..prefix_len + i].chars().count() + 1;
    let b = rest.as_bytes();
    let first_slash = b.iter().position(|&c| c == b'/').unwrap_or(b.len());
    let mut ats = b
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c == b'@')
        .map(|(i, _)| i);
    match (ats.next(), ats.next()) {
        (Some(a), Some(second)) if second < first_slash => Err(syntax(format!(
            "the URL has a second \"@\" before its first \"/\" (characters {} and {}): libpq \
             would read the user name and password up to the first one and look up the rest as \
             a host name; percent-encode \"@\" in a user name or password as %40",
            at(a),
            at(second)
        ))),
        (Some(a), _) if a > first_slash => Err(syntax(format!(
            "the URL has an \"@\" after its first \"/\" (character {}): a \"/\" in a user name \
             or password ends the host part there, and the rest would be read as a database \
             name; percent-encode \"/\" as %2F and \"@\" as %40",
            at(a)
        ))),
        (Some(_), Some(second)) => Err(syntax(format!(
            "the URL has an \"@\" after its first \"/\" (character {}): percent-encode \"/\" as \
             %2F and \"@\" as %40 in a user name, password, database name or query value",
            at(second)
        ))),
        _ => Ok(()),
    }
}

/// libpq's URI syntax (`conninfo_uri_parse_options`):
/// `[user[:password]@][host][:port][,host[:port]...][/dbname][?key=value&...]`,
/// the designator being the first `prefix_len` bytes of `dsn`. The user
/// info ends at the first `@` before the first `/`, as in libpq; see
/// [`check_url_at_signs`] for the URLs the exporter refuses before this.
fn parse_url(dsn: &str, prefix_len: usize) -> Result<(BTreeMap<String, String>, Raw), DsnError> {
    let rest = &dsn[prefix_len..];
    // The character position (from 1, in the whole DSN) of byte `i` of
    // `rest`, always a character boundary here.
    let at = |i: usize| dsn[..prefix_len + i].chars().count() + 1;
    let mut out = BTreeMap::new();
    let mut raw = Raw::new();
    let b = rest.as_bytes();
    let byte = |i: usize| b.get(i).copied();
    let p = parse_user_info(rest, &at, &mut out, &mut raw)?;
    let (hosts, ports, mut p) = parse_hosts(rest, p, &at)?;
    let mut end = byte(p);
    store_hosts(rest, &at, hosts, ports, &mut out, &mut raw)?;
    if end.is_some_and(|c| c != b'?') {
        p += 1;
        let start = p;
        while byte(p).is_some_and(|c| c != b'?') {
            p += 1;
        }
        // An empty path leaves dbname unset, so PGDATABASE still applies,
        // as in libpq.
        if p > start {
            let db = decode(&rest[start..p], "database name", at(start), WHOLE)?;
            store_bytes(&mut out, &mut raw, "dbname", db);
        }
        end = byte(p);
    }
    if end.is_some() {
        parse_query(rest, p + 1, &at, &mut out, &mut raw)?;
    }
    Ok((out, raw))
}

/// The URL's `user[:password]@`, when it has one: it ends at the first
/// `@` before the first `/`. Returns the byte of `rest` after it.
fn parse_user_info(
    rest: &str,
    at: &dyn Fn(usize) -> usize,
    out: &mut BTreeMap<String, String>,
    raw: &mut Raw,
) -> Result<usize, DsnError> {
    let b = rest.as_bytes();
    let user_end = b
        .iter()
        .position(|&c| c == b'@' || c == b'/')
        .filter(|&i| b[i] == b'@');
    let Some(i) = user_end else {
        return Ok(0);
    };
    let info = &rest[..i];
    let (user, password) = match info.split_once(':') {
        Some((u, pw)) => (u, Some(pw)),
        None => (info, None),
    };
    if !user.is_empty() {
        let name = decode(user, "user name", at(0), WHOLE)?;
        store_bytes(out, raw, "user", name);
    }
    if let Some(pw) = password
        && !pw.is_empty()
    {
        let pw = decode(pw, "password", at(user.len() + 1), WHOLE)?;
        store_bytes(out, raw, "password", pw);
    }
    Ok(i + 1)
}

/// Byte ranges of `rest`, one per item of a host or port list.
type Spans = Vec<Range<usize>>;

/// The byte ranges in `rest` of the hosts and of the ports, from byte `p`
/// to the path, the query or the end, and the byte where they end.
fn parse_hosts(
    rest: &str,
    mut p: usize,
    at: &dyn Fn(usize) -> usize,
) -> Result<(Spans, Spans, usize), DsnError> {
    let byte = |i: usize| rest.as_bytes().get(i).copied();
    // host[:port] pairs separated by commas; the host and port lists keep
    // one item per pair, empty where a pair leaves it out (libpq then uses
    // the default for that host).
    let (mut hosts, mut ports) = (Vec::new(), Vec::new());
    loop {
        if byte(p) == Some(b'[') {
            let start = p + 1;
            let Some(len) = rest[start..].find(']') else {
                return Err(syntax(format!(
                    "end of string reached when looking for matching \"]\" in IPv6 host \
                     address in URL (its \"[\" is at character {})",
                    at(p)
                )));
            };
            if len == 0 {
                return Err(syntax(format!(
                    "IPv6 host address may not be empty in URL (character {})",
                    at(p)
                )));
            }
            hosts.push(start..start + len);
            p = start + len + 1;
            // libpq: "]" must be followed by a port, the path, the query,
            // another host or the end; `[::1]6543` is not `[::1]:6543`.
            if byte(p).is_some_and(|c| !matches!(c, b':' | b'/' | b'?' | b',')) {
                return Err(syntax(format!(
                    "unexpected character at character {} of the URL, after an IPv6 host address \
                     in brackets (expected \":\", \"/\", \"?\", \",\" or the end)",
                    at(p)
                )));
            }
        } else {
            let start = p;
            while byte(p).is_some_and(|c| !matches!(c, b':' | b'/' | b'?' | b',')) {
                p += 1;
            }
            hosts.push(start..p);
        }
        let mut port = p..p;
        if byte(p) == Some(b':') {
            // Everything up to the next "/", "?" or "," is the port, so
            // `h:5432:6543` is the port "5432:6543", refused later, never
            // the host "h:5432".
            p += 1;
            let start = p;
            while byte(p).is_some_and(|c| !matches!(c, b'/' | b'?' | b',')) {
                p += 1;
            }
            port = start..p;
        }
        ports.push(port);
        if byte(p) != Some(b',') {
            return Ok((hosts, ports, p));
        }
        p += 1;
    }
}

/// Stores the hosts and ports `parse_hosts` found, percent-decoded and
/// joined with commas, as libpq's `host` and `port` lists.
fn store_hosts(
    rest: &str,
    at: &dyn Fn(usize) -> usize,
    hosts: Spans,
    ports: Spans,
    out: &mut BTreeMap<String, String>,
    raw: &mut Raw,
) -> Result<(), DsnError> {
    let list = |items: Spans, part: &str| {
        let n = items.len();
        items
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let ends = Ends {
                    first: i == 0,
                    last: i + 1 == n,
                };
                decode(&rest[r.clone()], part, at(r.start), ends)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.join(&b","[..]))
    };
    // As in libpq, a list is stored when its text is not empty, even if
    // it decodes to nothing (spaces alone).
    let written = |items: &[Range<usize>]| items.iter().any(|r| !r.is_empty());
    let (hosts_written, ports_written) = (
        written(&hosts) || hosts.len() > 1,
        written(&ports) || ports.len() > 1,
    );
    let (hosts, ports) = (list(hosts, "host")?, list(ports, "port")?);
    if hosts_written {
        store_bytes(out, raw, "host", hosts);
    }
    if ports_written {
        store_bytes(out, raw, "port", ports);
    }
    Ok(())
}

/// libpq's URI query, from byte `p` of `rest`: `key=value` pairs separated
/// by `&`, each with exactly one `=`; both sides percent-decoded. A
/// parameter is named by its keyword when it is one, else by its number.
fn parse_query(
    rest: &str,
    mut p: usize,
    at: &dyn Fn(usize) -> usize,
    out: &mut BTreeMap<String, String>,
    raw: &mut Raw,
) -> Result<(), DsnError> {
    let mut n = 0;
    while p < rest.len() {
        n += 1;
        let end = rest[p..].find('&').map_or(rest.len(), |j| p + j);
        let pair = &rest[p..end];
        let Some(eq) = pair.find('=') else {
            return Err(syntax(format!(
                "missing key/value separator \"=\" in URL query parameter {n} (character {})",
                at(p)
            )));
        };
        let (k, v) = (&pair[..eq], &pair[eq + 1..]);
        let key = decode(k, &format!("query parameter {n}"), at(p), WHOLE)?;
        let known = std::str::from_utf8(&key).ok().and_then(keyword);
        let what = match known {
            Some(kw) => format!("query parameter {kw:?}"),
            None => format!("query parameter {n}"),
        };
        if let Some(j) = v.find('=') {
            return Err(syntax(format!(
                "extra key/value separator \"=\" in URL {what} (character {}): percent-encode \
                 \"=\" in a value as %3D",
                at(p + eq + 1 + j)
            )));
        }
        let value = decode(v, &format!("value of {what}"), at(p + eq + 1), WHOLE)?;
        match known {
            Some(kw) => store_bytes(out, raw, kw, value),
            // For JDBC's sake libpq reads `ssl=true` (that value only) as
            // sslmode=require.
            None if key == b"ssl" => {
                if value != b"true" {
                    return Err(syntax(format!(
                        "the URL's query parameter \"ssl\" (character {}) takes only the value \
                         true (sslmode=require); use sslmode",
                        at(p)
                    )));
                }
                out.insert("sslmode".into(), "require".into());
            }
            None => {
                return Err(syntax(format!(
                    "unknown connection option in the URL's query parameter {n} (character {})",
                    at(p)
                )));
            }
        }
        p = end + 1;
    }
    Ok(())
}

/// Where the environment comes from (tests pass a map).
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn os_user() -> Option<String> {
    // The effective user's name, looked up with getpwuid_r (getpwuid's
    // static buffer is shared by all threads).
    whoami::username_os()
        .ok()
        .map(|n| n.to_string_lossy().into_owned())
}

/// libpq's host when none is given, or an empty one is.
pub(crate) fn default_host() -> String {
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
fn libpq_int(key: &'static str, v: &str) -> Result<i32, DsnError> {
    let t = v.trim_matches(is_space);
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = t.parse::<i32>()
    {
        return Ok(n);
    }
    Err(DsnError::Value {
        key,
        why: "not an integer".into(),
    })
}

/// Item `n` (from 1) of a list of `of` items, for an error.
fn item(n: usize, of: usize) -> String {
    if of > 1 {
        format!("item {n} of {of}: ")
    } else {
        String::new()
    }
}

/// One item of `port`: empty is the default port; otherwise 1 to 65535, as
/// libpq requires (0 would reach the kernel as "any port").
fn port_number(text: &str, n: usize, of: usize) -> Result<u16, DsnError> {
    if text.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    libpq_int("port", text)
        .ok()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)
        .ok_or_else(|| DsnError::Value {
            key: "port",
            why: format!("{}not a port number from 1 to 65535", item(n, of)),
        })
}

/// A host libpq could reach: a socket directory (an absolute path, or
/// `@` and a name in Linux's abstract namespace), an IPv6 address (with an optional zone), or a host name or IPv4 address
/// (letters, digits, `-`, `.` and `_`). Anything else (a space, an `@`, a
/// `=`...) has no address: libpq fails its name lookup and prints the
/// host, which then is most likely a piece of a password (`host=` after an
/// unquoted value with a space, or the part of a URL after an unencoded
/// `@`). Refused before connecting, without the text.
fn reachable_host(h: &str) -> bool {
    if is_socket(h) {
        return !h.chars().any(char::is_control);
    }
    if h.contains(':') {
        let (addr, zone) = match h.split_once('%') {
            Some((a, z)) => (a, Some(z)),
            None => (h, None),
        };
        return addr.parse::<std::net::Ipv6Addr>().is_ok()
            && zone.is_none_or(|z| {
                !z.is_empty()
                    && z.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
            });
    }
    h.len() <= 253
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
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
    let of = hosts.len();
    for (n, h) in hosts.iter().enumerate() {
        if !reachable_host(h) {
            return Err(DsnError::Value {
                key: "host",
                why: format!(
                    "{}not a host name, an IP address or an absolute socket directory (a host \
                     name has letters, digits, \"-\", \".\" and \"_\" only)",
                    item(n + 1, of)
                ),
            });
        }
    }
    let ports: Vec<u16> = match given(kv, "port") {
        None => vec![DEFAULT_PORT; of],
        Some(list) => {
            let items: Vec<&str> = list.split(',').collect();
            match items.as_slice() {
                [one] => vec![port_number(one, 1, 1)?; of],
                _ if items.len() == of => items
                    .iter()
                    .enumerate()
                    .map(|(n, p)| port_number(p, n + 1, of))
                    .collect::<Result<_, _>>()?,
                _ => {
                    return Err(DsnError::Value {
                        key: "port",
                        why: format!("could not match {} port numbers to {of} hosts", items.len()),
                    });
                }
            }
        }
    };
    Ok(hosts.into_iter().zip(ports).collect())
}

/// A user or database name for [`Target::display`]: as it is when it
/// reads back as one key=value word, else single-quoted with libpq's
/// escapes, control characters escaped, so a log line stays one line.
fn shown(v: &str) -> String {
    let plain = |c: char| !is_space(c) && !matches!(c, '\'' | '\\') && !c.is_control();
    if !v.is_empty() && v.chars().all(plain) {
        return v.to_string();
    }
    let mut out = String::from("'");
    for c in v.chars() {
        match c {
            '\'' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// `options` as the server splits it (at spaces, `\` escaping the next
/// character): only settings, `-c name=value`, `-cname=value` or
/// `--name=value`, are accepted. The server's errors quote any other
/// argument (`invalid command-line argument for server process: ...`), and
/// text that is no setting is most likely a password cut into this value;
/// so it is refused before it is sent. libpq sends any text.
fn check_options(o: &str) -> Result<(), DsnError> {
    let mut args = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = o.chars();
    while let Some(c) = chars.next() {
        if is_space(c) {
            args.extend(cur.take());
            continue;
        }
        let arg = cur.get_or_insert_with(String::new);
        if c == '\\' {
            arg.extend(chars.next());
        } else {
            arg.push(c);
        }
    }
    args.extend(cur);
    let setting = |s: &str, dashes: bool| {
        s.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty()
                && name.chars().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, '_' | '.') || (dashes && c == '-')
                })
        })
    };
    let mut i = 0;
    let mut n = 0;
    while i < args.len() {
        n += 1;
        let a = args[i].as_str();
        let ok = if a == "-c" {
            i += 1;
            args.get(i).is_some_and(|v| setting(v, false))
        } else if let Some(r) = a.strip_prefix("--") {
            setting(r, true)
        } else if let Some(r) = a.strip_prefix("-c") {
            setting(r, false)
        } else {
            false
        };
        if !ok {
            return Err(DsnError::Value {
                key: "options",
                why: format!(
                    "argument {n} is not a setting: pg-storage-exporter sends only -c name=value \
                     and --name=value"
                ),
            });
        }
        i += 1;
    }
    Ok(())
}

/// Where a passfile's path came from: a path written in the DSN is DSN
/// text, never printed (a password typed after `passfile=`).
#[derive(Debug, Clone, Copy)]
enum PassfileFrom {
    Dsn,
    Env,
    Home,
}

fn passfile_shown(path: &Path, from: PassfileFrom) -> String {
    match from {
        PassfileFrom::Dsn => "the passfile named in the DSN".into(),
        PassfileFrom::Env => format!("password file {} (PGPASSFILE)", path.display()),
        PassfileFrom::Home => format!("password file {}", path.display()),
    }
}

/// The cluster's `password_file`: the password alone, on one line. A
/// second line, or an empty file, is refused rather than guessed at: the
/// file is then not what the exporter expects (a libpq passfile given as
/// `password_file`, whose first line would go to the server whole as a
/// password; a rotation left half done), and sending the wrong secret
/// would fail as an authentication error far from its cause.
pub(crate) fn read_password_file(path: &Path) -> Result<String, DsnError> {
    let err = |why: String| DsnError::PasswordFile {
        path: path.to_path_buf(),
        shown: format!("password file {}", path.display()),
        why,
    };
    let text = crate::input::read_to_string(path, crate::input::Kind::Password)
        .map_err(|e| err(e.to_string()))?;
    let password = text.trim_end_matches(['\n', '\r']);
    if let Some(i) = password.find(['\n', '\r']) {
        let lines = password[i..].lines().filter(|l| !l.is_empty()).count() + 1;
        return Err(err(format!(
            "has {lines} lines; it must hold the password alone on one line (a libpq passfile, \
             with host:port:database:user:password lines, goes in the DSN's passfile= or \
             PGPASSFILE instead)"
        )));
    }
    if password.is_empty() {
        return Err(err(
            "is empty; it must hold the password alone on one line".into()
        ));
    }
    Ok(password.to_string())
}

/// Builds a connection target from a DSN, libpq's environment variables for
/// keywords the DSN leaves out, an optional password file of our own
/// (`password_file`: the password alone, one line), then libpq's passfile.
pub fn target(dsn: &str, env: Env<'_>, password_file: Option<&Path>) -> Result<Target, DsnError> {
    check_url_at_signs(dsn)?;
    let (mut kv, raw) = parse_bytes(dsn)?;
    if let Some(k) = kv
        .keys()
        .chain(raw.keys())
        .find_map(|k| keyword(k).filter(|k| !SUPPORTED.contains(k)))
    {
        return Err(DsnError::Unsupported(k));
    }
    if let Some(k) = raw
        .keys()
        .find_map(|k| keyword(k).filter(|k| !RAW_KEYWORDS.contains(k)))
    {
        return Err(DsnError::Value {
            key: k,
            why: "not UTF-8 once percent-decoded (only user, password, dbname, options and \
                  application_name may hold other bytes)"
                .into(),
        });
    }
    // A value given as bytes counts as given: the environment, a service
    // file and the defaults stay out of it. Its text here is a stand-in;
    // `build` takes the bytes.
    for (k, v) in &raw {
        kv.insert(k.clone(), String::from_utf8_lossy(v).into_owned());
    }
    let mut from = Vec::new();
    // libpq reads the service file before the environment: its settings
    // beat the environment variables, and the DSN's beat both.
    apply_service(&mut kv, env, &mut from)?;
    for &(var, key) in ENV_DEFAULTS {
        // A configured password file is more specific than PGPASSWORD.
        if key == "password" && password_file.is_some() {
            continue;
        }
        // libpq consults the variable only for a keyword the DSN does not
        // name at all: `host=''` means the default host, not PGHOST.
        if !kv.contains_key(key)
            && let Some(v) = env(var)
            && !v.is_empty()
        {
            kv.insert(key.to_string(), v);
            from.push((key, Origin::Env(var)));
        }
    }
    // libpq's deprecated PGREQUIRESSL: a value starting with 1 stands for
    // sslmode=require when neither the string nor PGSSLMODE gives one.
    if !kv.contains_key("sslmode") && env("PGREQUIRESSL").is_some_and(|v| v.starts_with('1')) {
        kv.insert("sslmode".into(), "require".into());
        from.push(("sslmode", Origin::Env("PGREQUIRESSL")));
    }
    // A value from an environment variable or a service file is no DSN
    // text, but shown no more than one from the DSN: the error names the
    // variable, or the file and line.
    build(&kv, &raw, env, password_file, &from).map_err(|e| match e {
        DsnError::Value { key, why } => match from.iter().find(|(k, _)| *k == key) {
            Some((_, origin)) => DsnError::Value {
                key,
                why: format!("{why} (the value comes from {origin})"),
            },
            None => DsnError::Value { key, why },
        },
        e => e,
    })
}

/// Where a keyword's value came from, when not from the DSN.
#[derive(Debug, Clone)]
enum Origin {
    Env(&'static str),
    Service { path: PathBuf, line: usize },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Env(var) => f.write_str(var),
            Origin::Service { path, line } => {
                write!(f, "service file {}, line {line}", path.display())
            }
        }
    }
}

/// libpq's compiled-in system configuration directory in Debian's and
/// Ubuntu's libpq5 (built with `--sysconfdir=/etc/postgresql-common`):
/// the system-wide `pg_service.conf` is there unless `PGSYSCONFDIR` names
/// another directory.
const SYSCONFDIR: &str = "/etc/postgresql-common";

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|v| !v.is_empty())
}

/// libpq's connection service (`parseServiceInfo`): the service named by
/// `service=` (else `PGSERVICE`) is looked up in `PGSERVICEFILE` (which
/// must exist) or `~/.pg_service.conf` (skipped when missing), then in
/// `pg_service.conf` of `PGSYSCONFDIR` (skipped when missing). Its
/// settings fill in the keywords the DSN does not name. The service's name
/// is DSN text and is never shown (a password cut at a space could run on
/// into `service=`).
fn apply_service(
    kv: &mut BTreeMap<String, String>,
    env: Env<'_>,
    from: &mut Vec<(&'static str, Origin)>,
) -> Result<(), DsnError> {
    let (service, var) = match kv.get("service") {
        Some(s) => (s.clone(), None),
        None => match non_empty(env("PGSERVICE")) {
            Some(s) => (s, Some("PGSERVICE")),
            None => return Ok(()),
        },
    };
    let user = match non_empty(env("PGSERVICEFILE")) {
        Some(p) => Some((PathBuf::from(p), true)),
        None => non_empty(env("HOME")).map(|h| (Path::new(&h).join(".pg_service.conf"), false)),
    };
    let sysconfdir = non_empty(env("PGSYSCONFDIR")).unwrap_or_else(|| SYSCONFDIR.into());
    let system = (Path::new(&sysconfdir).join("pg_service.conf"), false);
    let mut looked = Vec::new();
    for (path, must_exist) in user.into_iter().chain([system]) {
        // libpq stats the optional files and skips them when missing; a
        // file that is there but cannot be read is an error.
        if !must_exist && std::fs::symlink_metadata(&path).is_err() {
            looked.push(format!("{} (missing)", path.display()));
            continue;
        }
        let text = crate::input::read(&path, crate::input::Kind::ServiceFile).map_err(|e| {
            DsnError::ServiceFile {
                path: path.clone(),
                line: None,
                why: e.to_string(),
            }
        })?;
        looked.push(path.display().to_string());
        if let Some(lines) = service_lines(&text, &service, &path)? {
            for (key, value, line) in lines {
                if !kv.contains_key(key) {
                    kv.insert(key.to_string(), value);
                    from.push((
                        key,
                        Origin::Service {
                            path: path.clone(),
                            line,
                        },
                    ));
                }
            }
            return Ok(());
        }
    }
    Err(DsnError::Value {
        key: "service",
        why: format!(
            "definition of service not found{} in {}",
            var.map_or(String::new(), |v| format!(" (the name comes from {v})")),
            looked.join(", ")
        ),
    })
}

/// libpq's `isspace()` on a byte, in the C locale.
fn is_space_byte(b: u8) -> bool {
    is_space(char::from(b))
}

/// A service file's setting: keyword, value and line (from 1).
type ServiceSetting = (&'static str, String, usize);

/// The settings of service `service` in a service file, each with its
/// keyword and line, as libpq's `parseServiceFile` reads them; None when
/// the file has no such service.
///
/// Written out rather than taken from an INI crate because libpq's format
/// is not INI: the key is everything before the first `=` and the value
/// everything after it, neither trimmed (`host = h` is a syntax error), only
/// the line's ends are; `#` starts a comment only at the start of a line
/// and `;` never does; a section header need only start with `[name]`; a
/// keyword given twice keeps its first value; lines of other services are
/// not looked at; and a line of 1023 bytes or more is refused (libpq reads
/// lines with `fgets` into 1024 bytes).
fn service_lines(
    text: &[u8],
    service: &str,
    path: &Path,
) -> Result<Option<Vec<ServiceSetting>>, DsnError> {
    let err = |line: usize, why: String| DsnError::ServiceFile {
        path: path.to_path_buf(),
        line: Some(line),
        why,
    };
    let mut found = false;
    let mut out: Vec<ServiceSetting> = Vec::new();
    for (i, raw) in text.split_inclusive(|&b| b == b'\n').enumerate() {
        let n = i + 1;
        if raw.len() >= 1023 {
            return Err(err(
                n,
                "line too long (libpq reads at most 1022 bytes of a line)".into(),
            ));
        }
        let start = raw.iter().position(|&b| !is_space_byte(b));
        let end = raw.iter().rposition(|&b| !is_space_byte(b));
        let (Some(start), Some(end)) = (start, end) else {
            continue;
        };
        let line = &raw[start..=end];
        if line[0] == b'#' {
            continue;
        }
        if line[0] == b'[' {
            if found {
                break;
            }
            let name = service.as_bytes();
            found = line[1..].starts_with(name) && line.get(name.len() + 1) == Some(&b']');
            continue;
        }
        if !found {
            continue;
        }
        let Some(eq) = line.iter().position(|&b| b == b'=') else {
            return Err(err(n, "syntax error: the line is not keyword=value".into()));
        };
        let (k, v) = (&line[..eq], &line[eq + 1..]);
        if k == b"service" {
            return Err(err(
                n,
                "nested service specifications are not supported (\"service\" in a service file)"
                    .into(),
            ));
        }
        // requiressl left libpq's table of options in PostgreSQL 16: only
        // a connection string's parser still translates it.
        let Some(key) = std::str::from_utf8(k)
            .ok()
            .and_then(keyword)
            .filter(|k| *k != "requiressl")
        else {
            return Err(err(
                n,
                "syntax error: no libpq connection keyword before \"=\" (spaces around \"=\" \
                 are part of the keyword)"
                    .into(),
            ));
        };
        if !SUPPORTED.contains(&key) {
            return Err(err(
                n,
                format!("connection option {key:?} is not supported by pg-storage-exporter"),
            ));
        }
        let value = String::from_utf8(v.to_vec())
            .map_err(|_| err(n, format!("the value of {key:?} is not UTF-8")))?;
        if !out.iter().any(|(seen, ..)| *seen == key) {
            out.push((key, value, n));
        }
    }
    Ok(found.then_some(out))
}

/// tokio-postgres's sslmode for libpq's: TLS is never used over a
/// Unix-domain socket, whatever sslmode says.
pub(crate) fn driver_ssl_mode(mode: SslMode, socket: bool) -> tokio_postgres::config::SslMode {
    use tokio_postgres::config::SslMode as D;
    match mode {
        _ if socket => D::Disable,
        SslMode::Disable => D::Disable,
        SslMode::Allow | SslMode::Prefer => D::Prefer,
        _ => D::Require,
    }
}

fn build(
    kv: &BTreeMap<String, String>,
    raw: &Raw,
    env: Env<'_>,
    password_file: Option<&Path>,
    from: &[(&'static str, Origin)],
) -> Result<Target, DsnError> {
    let hosts = hosts_and_ports(kv)?;
    let user = given(kv, "user")
        .map(str::to_string)
        .or_else(os_user)
        .unwrap_or_else(|| "postgres".into());
    let dbname = given(kv, "dbname")
        .map(str::to_string)
        .unwrap_or_else(|| user.clone());
    let (ssl_mode, ssl_root_cert) = ssl_settings(kv)?;
    let who = Who {
        hosts: &hosts,
        dbname: &dbname,
        user: &user,
    };
    let password = password(kv, env, password_file, from, &who)?;

    let mut c = tokio_postgres::Config::new();
    c.user(&user);
    c.dbname(&dbname);
    // tokio-postgres takes a password as bytes: raw ones go as they are.
    match (raw.get("password"), &password) {
        (Some(bytes), _) => {
            c.password(bytes.as_slice());
        }
        (None, Some(p)) => {
            c.password(p.as_bytes());
        }
        (None, None) => {}
    }
    let server_type = session_options(kv, &mut c)?;
    let replication = replication(kv)?;
    // What the startup message must carry that tokio-postgres cannot put
    // there: raw bytes for the text stand-ins above (by the protocol's
    // names), and the walsender request.
    let mut startup: Vec<(&'static str, Vec<u8>)> = [
        ("user", "user"),
        ("dbname", "database"),
        ("options", "options"),
        ("application_name", "application_name"),
    ]
    .iter()
    .filter_map(|&(k, name)| {
        // The database defaults to the user name, bytes and all.
        let db_is_user = k == "dbname" && given(kv, "dbname").is_none();
        let bytes = if db_is_user {
            raw.get("user")
        } else {
            raw.get(k)
        };
        bytes.map(|v| (name, v.clone()))
    })
    .collect();
    if replication {
        startup.push(("replication", b"database".to_vec()));
    }
    let base = c.clone();
    // Ports are given one per host, in the same order: tokio-postgres pairs
    // them by position and tries the hosts in turn, as libpq does.
    for (h, p) in &hosts {
        c.host(h);
        c.port(*p);
    }
    let port = hosts.first().map_or(DEFAULT_PORT, |(_, p)| *p);
    let mut t = Target {
        config: c,
        ssl_mode,
        ssl_root_cert,
        display: String::new(),
        hosts,
        port,
        server_type,
        base,
        startup,
        replication,
    };
    // libpq never uses TLS over a Unix-domain socket, whatever sslmode says.
    // tokio-postgres has one sslmode for all hosts, so only a list of
    // sockets alone turns it off.
    t.config
        .ssl_mode(driver_ssl_mode(ssl_mode, t.sockets_only()));
    let user_shown = raw
        .get("user")
        .map_or_else(|| shown(&user), |b| shown_bytes(b));
    let db_shown = match (raw.get("dbname"), given(kv, "dbname")) {
        (Some(b), _) => shown_bytes(b),
        // The database defaults to the user name, bytes and all.
        (None, None) => user_shown.clone(),
        (None, Some(_)) => shown(&dbname),
    };
    t.display = display(&t.hosts, &user_shown, &db_shown, ssl_mode);
    Ok(t)
}

/// Whom a password is for: the hosts tried, the database and the user, as
/// a password file's lines match them.
struct Who<'a> {
    hosts: &'a [(String, u16)],
    dbname: &'a str,
    user: &'a str,
}

/// The sslmode in force and the root certificate (`sslrootcert`).
fn ssl_settings(kv: &BTreeMap<String, String>) -> Result<(SslMode, Option<PathBuf>), DsnError> {
    let ssl_root_cert = given(kv, "sslrootcert").map(PathBuf::from);
    let system_roots = ssl_root_cert
        .as_ref()
        .is_some_and(|p| p.as_os_str() == "system");
    // An empty sslmode is no sslmode at all, and libpq refuses it.
    let ssl_mode = match kv.get("sslmode") {
        Some(m) => SslMode::parse(m).ok_or_else(|| DsnError::Value {
            key: "sslmode",
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
            key: "sslmode",
            why: "weak sslmode may not be used with sslrootcert=system (use verify-full)".into(),
        });
    }
    Ok((ssl_mode, ssl_root_cert))
}

/// The password: the DSN's, else the configured password file's, else the
/// matching line of libpq's password file (`passfile`, or ~/.pgpass).
fn password(
    kv: &BTreeMap<String, String>,
    env: Env<'_>,
    password_file: Option<&Path>,
    from: &[(&'static str, Origin)],
    who: &Who<'_>,
) -> Result<Option<String>, DsnError> {
    let mut password = given(kv, "password").map(str::to_string);
    if password.is_none()
        && let Some(pf) = password_file
    {
        password = Some(read_password_file(pf)?);
    }
    if password.is_none() {
        let origin = from.iter().find(|(k, _)| *k == "passfile").map(|(_, o)| o);
        let passfile = match given(kv, "passfile") {
            Some(p) => Some((
                PathBuf::from(p),
                match origin {
                    Some(Origin::Env(_)) => PassfileFrom::Env,
                    // A service file's path is no DSN text: shown.
                    Some(Origin::Service { .. }) => PassfileFrom::Home,
                    None => PassfileFrom::Dsn,
                },
            )),
            None => env("HOME").map(|h| (Path::new(&h).join(".pgpass"), PassfileFrom::Home)),
        };
        if let Some((pf, from)) = passfile
            && let Some(text) = pgpass_text(&pf, from)
        {
            password = one_password(&text, &pf, from, who.hosts, who.dbname, who.user)?;
        }
    }
    Ok(password)
}

/// The session keywords: application name, options, timeouts, keepalives
/// and which server of a list to keep (the server type the exporter checks
/// itself, for the values tokio-postgres lacks).
fn session_options(
    kv: &BTreeMap<String, String>,
    c: &mut tokio_postgres::Config,
) -> Result<Option<ServerType>, DsnError> {
    c.application_name(given(kv, "application_name").unwrap_or("pg-storage-exporter"));
    if let Some(o) = given(kv, "options") {
        check_options(o)?;
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
                key: "keepalives_idle",
                why: "use at least 1 second".into(),
            })?;
        c.keepalives_idle(Duration::from_secs(secs));
    }
    let mut server_type = None;
    if let Some(t) = kv.get("target_session_attrs") {
        use tokio_postgres::config::TargetSessionAttrs as A;
        // tokio-postgres asks `SHOW transaction_read_only` after connecting,
        // which is what libpq's read-write and read-only check. It has no
        // primary, standby nor prefer-standby: for those it connects to any
        // server and the exporter checks (see `tls::connect`).
        c.target_session_attrs(match t.as_str() {
            "any" => A::Any,
            "read-write" => A::ReadWrite,
            "read-only" => A::ReadOnly,
            "primary" => {
                server_type = Some(ServerType::Primary);
                A::Any
            }
            "standby" => {
                server_type = Some(ServerType::Standby);
                A::Any
            }
            "prefer-standby" => {
                server_type = Some(ServerType::PreferStandby);
                A::Any
            }
            _ => {
                return Err(DsnError::Value {
                    key: "target_session_attrs",
                    why: "use any, read-write, read-only, primary, standby or prefer-standby"
                        .into(),
                });
            }
        });
    }
    Ok(server_type)
}

/// The target as logs and errors show it: only parts that were parsed and
/// checked (hosts that passed `reachable_host`, port numbers, the user and
/// database names, the sslmode keyword).
fn display(hosts: &[(String, u16)], user: &str, dbname: &str, ssl_mode: SslMode) -> String {
    let list =
        |f: &dyn Fn(&(String, u16)) -> String| hosts.iter().map(f).collect::<Vec<_>>().join(",");
    format!(
        "host={} port={} user={user} dbname={dbname} sslmode={}",
        list(&|(h, _)| shown(h)),
        list(&|(_, p)| p.to_string()),
        ssl_mode.as_str()
    )
}

/// [`shown`] for a name that is not UTF-8: quoted, each byte that is no
/// part of a character written `\xNN`.
fn shown_bytes(b: &[u8]) -> String {
    let mut out = String::from("'");
    for chunk in b.utf8_chunks() {
        let valid = shown(chunk.valid());
        let inner = valid
            .strip_prefix('\'')
            .and_then(|v| v.strip_suffix('\''))
            .unwrap_or(&valid);
        out.push_str(inner);
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02X}"));
        }
    }
    out.push('\'');
    out
}

/// libpq's `replication`, which it passes to the server as it is: the
/// server runs a logical-replication walsender for `database` and takes
/// anything else as a boolean (`parse_bool`). True asks for physical
/// replication, which runs no SQL at all: refused, as the collectors need
/// SQL. An empty value is not sent, as in libpq.
fn replication(kv: &BTreeMap<String, String>) -> Result<bool, DsnError> {
    let Some(v) = given(kv, "replication") else {
        return Ok(false);
    };
    if v == "database" {
        return Ok(true);
    }
    match server_bool(v) {
        Some(false) => Ok(false),
        Some(true) => Err(DsnError::Value {
            key: "replication",
            why: "physical replication (true, on, yes or 1) runs no SQL, and the exporter's \
                  collectors need SQL: use replication=database (a logical-replication \
                  walsender, which runs SQL over the simple query protocol) or leave it out"
                .into(),
        }),
        None => Err(DsnError::Value {
            key: "replication",
            why: "use database, or false, off, no or 0 for a normal connection (the server \
                  refuses any other value)"
                .into(),
        }),
    }
}

/// PostgreSQL's `parse_bool`: true, yes, on, 1, false, no, off, 0, any
/// case, and any unambiguous prefix of the words (`t`, `of`).
fn server_bool(v: &str) -> Option<bool> {
    let l = v.to_ascii_lowercase();
    let prefix_of = |word: &str, min: usize| l.len() >= min && word.starts_with(&l);
    if prefix_of("true", 1) || prefix_of("yes", 1) || prefix_of("on", 2) || l == "1" {
        Some(true)
    } else if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || l == "0" {
        Some(false)
    } else {
        None
    }
}

/// libpq's password file, unless others can read it.
fn pgpass_text(path: &Path, from: PassfileFrom) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    if meta.mode() & 0o077 != 0 {
        // libpq ignores a password file others can read, and so do we.
        tracing::warn!(
            file = %passfile_shown(path, from),
            "password file has group or world access; ignoring it (chmod 0600)"
        );
        return None;
    }
    match crate::input::read_to_string(path, crate::input::Kind::Passfile) {
        Ok(t) => Some(t),
        // libpq warns about a passfile that is not a plain file and goes
        // on without it; so does a missing or unreadable one here, silently.
        Err(e) if e.get_ref().is_some_and(|r| r.is::<crate::input::Refused>()) => {
            tracing::warn!(file = %passfile_shown(path, from), error = %e, "ignoring the password file");
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
    from: PassfileFrom,
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
        shown: passfile_shown(path, from),
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
    let host = if is_socket(host) || host.is_empty() {
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
    fn refuses_unknown_and_unsupported_options_by_place_or_keyword() {
        let e = target("host=x colour=blue", &no_env, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid connection string: unknown connection option at character 8, after the value \
             of \"host\" (if that value has a space in it, quote it: host='...')"
        );
        let e = target("host=x sslcert=/c.pem", &no_env, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "connection option \"sslcert\" is not supported by pg-storage-exporter"
        );
        let e = target("host=x sslmode=maybe", &no_env, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "connection option \"sslmode\": use disable, allow, prefer, require, verify-ca or \
             verify-full"
        );
        let e = target("host=x port=http", &no_env, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "connection option \"port\": not a port number from 1 to 65535"
        );
        let e = target("host=x,y port=5432,http", &no_env, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "connection option \"port\": item 2 of 2: not a port number from 1 to 65535"
        );
        // A value from the environment names its variable.
        let env = |k: &str| (k == "PGSSLMODE").then(|| "maybe".to_string());
        let e = target("host=x", &env, None).unwrap_err();
        assert!(
            e.to_string().ends_with("(the value comes from PGSSLMODE)"),
            "{e}"
        );
    }

    /// The defect this module's errors were rewritten for: libpq (and the
    /// parser before) quoted the word after an unquoted password, the
    /// host after a second `@` and the port before a `/`.
    #[test]
    fn errors_never_quote_what_may_be_a_password() {
        let cases = [
            (
                "host=h user=u password=Sekr1t Zebra42",
                "missing \"=\" after the word at character 31, which follows the unquoted value of \
                 \"password\"",
            ),
            (
                "postgresql://u:PWMARK30@x@127.0.0.1/db",
                "a second \"@\" before its first \"/\" (characters 24 and 26)",
            ),
            (
                "postgresql://u:PWMARK32/x@127.0.0.1/db",
                "an \"@\" after its first \"/\" (character 26)",
            ),
            (
                "host=h password=PWMARK04 PWMARK04b=x",
                "unknown connection option at character 26, after the value of \"password\"",
            ),
            (
                "host=h password='PWMARK05",
                "unterminated quoted value of \"password\" at character 8 (its quote is at \
                 character 17)",
            ),
            (
                "host=h password=PWMARK06 sslmode=PWMARK06b",
                "connection option \"sslmode\": use disable",
            ),
            (
                "host=h password=Sekr1t host=PW@MARK07",
                "connection option \"host\": not a host name",
            ),
            (
                "host=h options=PWMARK08",
                "connection option \"options\": argument 1 is not a setting",
            ),
            (
                "postgresql://u:PW%zMARK09@h/db",
                "invalid percent-encoded token in the URL's password at character 18",
            ),
            (
                "postgresql://u:PW MARK10@h/db",
                "unexpected space in the URL's password at character 18",
            ),
            (
                "postgresql://u@h:PWMARK11/db",
                "connection option \"port\": not a port number",
            ),
            (
                "postgresql://u:a/b?PWMARK12@h/db",
                "an \"@\" after its first \"/\" (character 28)",
            ),
        ];
        for (dsn, want) in cases {
            let e = target(dsn, &no_env, None).unwrap_err().to_string();
            assert!(e.contains(want), "{dsn}: {e}");
            for piece in ["PW", "MARK", "Sekr1t", "Zebra42"] {
                assert!(!e.contains(piece), "{dsn}: {e}");
            }
        }
    }

    #[test]
    fn replication_database_only_and_physical_refused_by_name() {
        let t = target("host=h replication=database", &no_env, None).unwrap();
        assert!(t.replication);
        assert_eq!(t.startup, [("replication", b"database".to_vec())]);
        assert!(t.needs_own_connect());
        for normal in ["false", "OFF", "no", "0", "f", "of", ""] {
            let t = target(&format!("host=h replication='{normal}'"), &no_env, None).unwrap();
            assert!(!t.replication && t.startup.is_empty(), "{normal}");
            assert!(!t.needs_own_connect(), "{normal}");
        }
        for physical in ["true", "on", "yes", "1", "T", "Y"] {
            let e = target(&format!("host=h replication={physical}"), &no_env, None)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(
                    "connection option \"replication\": physical replication (true, on, yes \
                     or 1) runs no SQL"
                ),
                "{physical}: {e}"
            );
        }
        for bad in ["Database", "o", "2", "maybe"] {
            let e = target(&format!("host=h replication={bad}"), &no_env, None).unwrap_err();
            assert!(
                e.to_string().contains("use database, or false"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn url_bytes_that_are_not_utf8_are_sent_and_shown_escaped() {
        let t = target(
            "postgresql://mon%E9:pw%FF@h/caf%E9?options=-c%20x%3Dy%E9&application_name=a%FF",
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(
            t.startup,
            [
                ("user", b"mon\xe9".to_vec()),
                ("database", b"caf\xe9".to_vec()),
                ("options", b"-c x=y\xe9".to_vec()),
                ("application_name", b"a\xff".to_vec()),
            ]
        );
        assert_eq!(t.config.get_password(), Some(&b"pw\xff"[..]));
        assert_eq!(
            t.display,
            r"host=h port=5432 user='mon\xE9' dbname='caf\xE9' sslmode=prefer"
        );
        // A value given as bytes keeps the environment out, as in libpq.
        let env = |k: &str| (k == "PGDATABASE").then(|| "other".to_string());
        let t = target("postgresql://h/caf%E9", &env, None).unwrap();
        assert_eq!(t.startup, [("database", b"caf\xe9".to_vec())]);
        // A host, port or setting must be text.
        let e = target("postgresql://h%FF/db", &no_env, None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("connection option \"host\": not UTF-8 once percent-decoded"),
            "{e}"
        );
        // UTF-8 needs no rewriting: tokio-postgres's own connect.
        let t = target("postgresql://mon%C3%A9@h/caf%C3%A9", &no_env, None).unwrap();
        assert!(t.startup.is_empty() && !t.needs_own_connect());
        assert_eq!(t.config.get_dbname(), Some("café"));
    }

    #[test]
    fn options_are_settings_only() {
        for ok in [
            r"-c search_path=a\\ b",
            "-csearch_path=x --work-mem=4MB",
            "  -c geqo=off   -c x.y=1 ",
        ] {
            let t = target(&format!("host=h options='{ok}'"), &no_env, None);
            assert!(t.is_ok(), "{ok}: {t:?}");
        }
        for bad in ["-c", "-c =x", "x", "-d 2", "--=1", "-c a b=1"] {
            let e = target(&format!("host=h options='{bad}'"), &no_env, None).unwrap_err();
            assert!(
                e.to_string().contains("\"options\": argument"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn display_quotes_names_that_would_not_read_back() {
        let t = target(
            r"host=/run/pg user='mon itor' dbname='it\'s'",
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(
            t.display,
            r"host=/run/pg port=5432 user='mon itor' dbname='it\'s' sslmode=prefer"
        );
        let t = target("host=h user='a\nb'", &no_env, None).unwrap();
        assert!(!t.display.contains('\n'), "{}", t.display);
    }

    #[test]
    fn a_password_file_holds_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let pf = dir.path().join("pw");
        for (text, want) in [
            ("Sekr1t\n", Ok("Sekr1t")),
            ("Sekr1t\r\n\n", Ok("Sekr1t")),
            ("Sekr1t with spaces", Ok("Sekr1t with spaces")),
            ("Sekr1t\nZebra42\n", Err("has 2 lines")),
            ("h:5432:*:u:Sekr1t\n*:*:*:*:Zebra42\n\n", Err("has 2 lines")),
            ("Sekr1t\n\nZebra42", Err("has 2 lines")),
            ("\n", Err("is empty")),
        ] {
            std::fs::write(&pf, text).unwrap();
            match (read_password_file(&pf), want) {
                (Ok(pw), Ok(w)) => assert_eq!(pw, w),
                (Err(e), Err(w)) => {
                    let e = e.to_string();
                    assert!(e.contains(w), "{text:?}: {e}");
                    assert!(e.starts_with(&format!("password file {}: ", pf.display())));
                    assert!(!e.contains("Sekr1t") && !e.contains("Zebra42"), "{e}");
                }
                (got, w) => panic!("{text:?}: {got:?}, want {w:?}"),
            }
        }
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
        // The exporter's own host loop (primary, standby, prefer-standby)
        // gives each host its own TLS rule, as libpq does.
        let t = target(
            "host=/run/pg,db2 port=5433,5434 user=u sslmode=require \
             target_session_attrs=prefer-standby",
            &no_env,
            None,
        )
        .unwrap();
        assert_eq!(t.passes(), 2);
        let (sock, tcp) = (t.for_host(0).unwrap(), t.for_host(1).unwrap());
        assert_eq!(sock.hosts, [("/run/pg".to_string(), 5433)]);
        assert_eq!(sock.config.get_ports(), [5433]);
        assert_eq!(
            sock.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
        assert_eq!(
            tcp.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(tcp.config.get_user(), Some("u"));
        assert!(t.for_host(2).is_none());
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
            // A path written in the DSN is DSN text: named, not quoted.
            assert!(
                text.starts_with("the passfile named in the DSN: "),
                "{text}"
            );
            assert!(!text.contains(&pf.display().to_string()), "{text}");
            assert!(!text.contains("Pw1xq") && !text.contains("Pw2xq"), "{text}");
        }
        // From PGPASSFILE it is no DSN text, and the path is shown.
        let env = |k: &str| (k == "PGPASSFILE").then(|| pf.display().to_string());
        let e = target("user=u host=h1,h2 port=5432,5433", &env, None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("password file {} (PGPASSFILE): ", pf.display())),
            "{e}"
        );
    }

    /// libpq's reading of a service file: errors name the file and line,
    /// never a value; a value of the file that is wrong names them too.
    #[test]
    fn service_file_lines() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pg_service.conf");
        let file = f.display().to_string();
        let env = |k: &str| match k {
            "PGSERVICEFILE" => Some(file.clone()),
            "PGSYSCONFDIR" => Some("/nonexistent".into()),
            _ => None,
        };
        let long = format!("[s]\nhost=/{}\n", "x".repeat(1016));
        // 1023 bytes with its newline: fgets fills libpq's buffer.
        assert_eq!(long.lines().nth(1).unwrap().len() + 1, 1023);
        let cases: [(&[u8], &str); 7] = [
            (long.as_bytes(), "line 2: line too long"),
            (
                b"[s]\nsslmode=Sekr1t\n",
                "(the value comes from service file ",
            ),
            (b"[s]\npassword=Sekr1t\nZebra42\n", "line 3: syntax error"),
            (
                b"[s]\nsslcert=/Sekr1t\n",
                "line 2: connection option \"sslcert\" is not",
            ),
            (b"[s]\nrequiressl=1\n", "line 2: syntax error"),
            (
                b"[s]\nhost=/\xffSekr1t\n",
                "line 2: the value of \"host\" is not UTF-8",
            ),
            (b"[t]\nhost=/a\n", "definition of service not found in "),
        ];
        for (text, want) in cases {
            std::fs::write(&f, text).unwrap();
            let e = target("service=s", &env, None).unwrap_err().to_string();
            let text = String::from_utf8_lossy(text);
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.contains(&file), "{text:?}: {e}");
            assert!(!e.contains("Sekr1t") && !e.contains("Zebra42"), "{e}");
        }
        std::fs::write(&f, b"[s]\nhost=/\xffSekr1t\n").unwrap();
        let e = target("service=s", &env, None).unwrap_err();
        assert!(
            matches!(e, DsnError::ServiceFile { line: Some(2), .. }),
            "{e}"
        );
        // Without its newline it is read; a line of another service never is.
        std::fs::write(
            &f,
            format!("[t]\nno equals sign\n[s]\nhost=/{}", "x".repeat(1016)),
        )
        .unwrap();
        let t = target("service=s", &env, None).unwrap();
        assert_eq!(t.hosts[0].0.len(), 1017);
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
