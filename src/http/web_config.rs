//! `--web.config.file`: TLS, client certificates, basic auth, response
//! headers and a request rate limit for the HTTP endpoint, in the format of
//! the Prometheus exporter-toolkit's web configuration and with its
//! meaning, so one file can serve this exporter and node_exporter alike.
//!
//! Everything is read and checked here, once, before any port is bound: a
//! missing certificate or a malformed hash is a start-up error naming the file
//! and the key, never a failure on the first scrape.

mod client_auth;
mod p521;
mod tls;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use serde::Deserialize;
use zeroize::Zeroizing;

use crate::http::auth::{self, BasicAuth};
use crate::http::extras::{Extras, RateLimiter};

pub(crate) use self::client_auth::ClientAuth;
pub(crate) use self::tls::TlsVersion;

/// The file once checked, as plain values. Built by hand from a [`Node`]
/// tree rather than derived with serde, because serde's type errors quote
/// the offending value (`invalid type: string "alice:hunter2"`), and in this
/// file a value of the wrong type is most likely a password pasted where a
/// hash belongs.
#[derive(Default)]
struct File {
    tls_server_config: Option<tls::TlsFile>,
    basic_auth_users: BTreeMap<String, String>,
    http: HttpFile,
    rate_limit: Option<RateLimit>,
}

/// `http_server_config`.
struct HttpFile {
    /// The toolkit's default is true; this exporter serves HTTP/1.1 only,
    /// but the value still decides the toolkit's HTTP/2 cipher-suite check
    /// (see [`tls::build`]).
    http2: bool,
    headers: Vec<(String, String)>,
}

impl Default for HttpFile {
    fn default() -> HttpFile {
        HttpFile {
            http2: true,
            headers: Vec::new(),
        }
    }
}

/// `rate_limit` with a positive interval: one request per `interval`,
/// `burst` at once.
#[derive(Debug, Clone, Copy)]
struct RateLimit {
    interval: Duration,
    burst: i64,
}

/// A YAML value as read, before any meaning is given to it. Maps keep every
/// entry in order, duplicates included, so that a duplicate can be refused
/// by name (serde_norway's own maps refuse one quoting the key, and typed
/// maps silently keep the last). Values are never shown in errors, only
/// their kind.
enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    String(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// What was found, for "expected X, found Y": a kind, never a value.
    fn kind(&self) -> &'static str {
        match self {
            Node::Null => "nothing",
            Node::Bool(_) => "a boolean",
            Node::Int(_) | Node::Float(_) => "a number",
            Node::String(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a map",
        }
    }

    /// A scalar as Go's YAML decoder puts it in a string field: its text.
    /// `X-XSS-Protection: 1` is a number to YAML and "1" to the toolkit.
    fn scalar_text(&self) -> Option<String> {
        match self {
            Node::String(s) => Some(s.clone()),
            Node::Int(i) => Some(i.to_string()),
            Node::Float(f) => Some(f.to_string()),
            Node::Bool(b) => Some(b.to_string()),
            Node::Null | Node::Seq(_) | Node::Map(_) => None,
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> serde::de::Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u128<E>(self, v: u128) -> Result<Node, E> {
        Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::String(v))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<Node, Node>()? {
            entries.push(entry);
        }
        Ok(Node::Map(entries))
    }
    // Custom tags (`!foo x`) arrive as enums and bytes cannot occur in YAML
    // text: serde's default refusals name the kind, not the value.
}

/// Every key of exporter-toolkit's web configuration, by section. Any
/// other key is refused by name, as the toolkit's strict YAML decoding
/// refuses it.
const TOP_KEYS: &[&str] = &[
    "tls_server_config",
    "basic_auth_users",
    "http_server_config",
    "rate_limit",
];

const TLS_KEYS: &[&str] = &[
    "cert_file",
    "key_file",
    "cert",
    "key",
    "client_auth_type",
    "client_ca_file",
    "client_ca",
    "client_allowed_sans",
    "cipher_suites",
    "curve_preferences",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
];

const HTTP_KEYS: &[&str] = &["http2", "headers"];

const RATE_KEYS: &[&str] = &["interval", "burst"];

/// The response headers the toolkit lets a file set, with the values it
/// allows (none listed: any value). Its list, kept private there "to ensure
/// consistency in the Prometheus ecosystem", and matched as it matches it:
/// by exact name.
const HEADERS: &[(&str, &[&str])] = &[
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// Whether a key from the file may be shown in an error: only if it looks
/// like a key name. A "key" such as `alice:hunter2` (a password typed where
/// a user name or a key belongs) is not shown.
fn showable(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 64
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// How an unknown key is named in an error.
fn unknown_key(key: &Node) -> String {
    match key {
        Node::String(k) if showable(k) => format!("unknown key `{k}`"),
        Node::String(_) => "an unknown key that is not a key name (not shown)".to_string(),
        other => format!("a key that is {} instead of a name", other.kind()),
    }
}

/// The entries of the map at `path` after refusing unknown keys and
/// duplicates. `path` is "" for the top level.
fn known_entries<'a>(
    path: &str,
    entries: &'a [(Node, Node)],
    keys: &[&'static str],
) -> anyhow::Result<Vec<(&'static str, &'a Node)>> {
    let mut seen: Vec<(&'static str, &'a Node)> = Vec::new();
    for (key, value) in entries {
        let known = match key {
            Node::String(k) => keys.iter().find(|name| *name == k),
            _ => None,
        };
        let Some(name) = known else {
            let expected: Vec<String> = keys.iter().map(|name| format!("`{name}`")).collect();
            let prefix = if path.is_empty() {
                String::new()
            } else {
                format!("{path}: ")
            };
            bail!(
                "{prefix}{}; expected one of {}",
                unknown_key(key),
                expected.join(", ")
            );
        };
        if seen.iter().any(|(n, _)| n == name) {
            let at = if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            bail!("`{at}` is given twice; give it once");
        }
        seen.push((name, value));
    }
    Ok(seen)
}

fn parse_file(root: &Node) -> anyhow::Result<File> {
    let entries = match root {
        // An empty file (or one of comments only) is valid and turns
        // nothing on, as with exporter-toolkit.
        Node::Null => return Ok(File::default()),
        Node::Map(entries) => entries,
        other => bail!(
            "expected a map with `tls_server_config` and/or `basic_auth_users`, found {}",
            other.kind()
        ),
    };
    let mut file = File::default();
    for (key, value) in known_entries("", entries, TOP_KEYS)? {
        match key {
            "tls_server_config" => file.tls_server_config = parse_tls(value)?,
            "basic_auth_users" => file.basic_auth_users = parse_users(value)?,
            "http_server_config" => file.http = parse_http(value)?,
            "rate_limit" => file.rate_limit = parse_rate_limit(value)?,
            // known_entries returns only the keys listed.
            _ => {}
        }
    }
    Ok(file)
}

fn parse_tls(node: &Node) -> anyhow::Result<Option<tls::TlsFile>> {
    let entries = match node {
        // `tls_server_config:` with nothing under it: no TLS, as in Go.
        Node::Null => return Ok(None),
        Node::Map(entries) => entries,
        other => bail!(
            "tls_server_config: expected a map of TLS settings (`cert_file`, `key_file`, ...), \
             found {}",
            other.kind()
        ),
    };
    let mut t = tls::TlsFile::default();
    for (key, value) in known_entries("tls_server_config", entries, TLS_KEYS)? {
        match key {
            "cert_file" => t.cert_file = file_name(key, value)?,
            "key_file" => t.key_file = file_name(key, value)?,
            "client_ca_file" => t.client_ca_file = file_name(key, value)?,
            "cert" => t.cert = pem_text(key, value)?,
            "client_ca" => t.client_ca = pem_text(key, value)?,
            "key" => t.key = pem_text(key, value)?.map(Zeroizing::new),
            "min_version" => t.min_version = tls_version(key, value)?,
            "max_version" => t.max_version = tls_version(key, value)?,
            "client_auth_type" => {
                const EXPECTED: &str = "expected one of NoClientCert, RequestClientCert, \
                                        RequireAnyClientCert, VerifyClientCertIfGiven, \
                                        RequireAndVerifyClientCert";
                match value {
                    Node::Null => {}
                    Node::String(s) => {
                        t.client_auth_type_set = !s.is_empty();
                        t.client_auth_type = Some(ClientAuth::parse(s).ok_or_else(|| {
                            anyhow!("tls_server_config.client_auth_type: {EXPECTED}")
                        })?);
                    }
                    other => bail!(
                        "tls_server_config.client_auth_type: {EXPECTED}, found {}",
                        other.kind()
                    ),
                }
            }
            "client_allowed_sans" => t.client_allowed_sans = allowed_sans(value)?,
            "cipher_suites" => {
                t.cipher_suites = names(key, value, tls::Cipher::parse, tls::CIPHER_EXAMPLE)?;
            }
            "curve_preferences" => {
                t.curve_preferences = names(key, value, tls::Curve::parse, tls::CURVE_EXAMPLE)?;
            }
            "prefer_server_cipher_suites" => match value {
                Node::Null => {}
                Node::Bool(b) => t.prefer_server_cipher_suites = Some(*b),
                other => bail!(
                    "tls_server_config.prefer_server_cipher_suites: expected true or false, \
                     found {}",
                    other.kind()
                ),
            },
            _ => {}
        }
    }
    Ok(Some(t))
}

fn file_name(key: &str, value: &Node) -> anyhow::Result<Option<String>> {
    match value {
        Node::Null => Ok(None),
        // YAML's "\0": no file name can hold the byte, and an error naming
        // the path raw would hand it to the terminal or the log.
        Node::String(s) if s.contains('\0') => bail!(
            "tls_server_config.{key}: the path {} contains a NUL byte (shown as \\0), which no \
             file name can hold",
            crate::types::Shown(Path::new(s))
        ),
        Node::String(s) => Ok(Some(s.clone())),
        other => bail!(
            "tls_server_config.{key}: expected a file name (a string), found {}",
            other.kind()
        ),
    }
}

/// Inline PEM (`cert`, `key`, `client_ca`): a string, never shown.
fn pem_text(key: &str, value: &Node) -> anyhow::Result<Option<String>> {
    match value {
        Node::Null => Ok(None),
        Node::String(s) => Ok(Some(s.clone())),
        other => bail!(
            "tls_server_config.{key}: expected PEM text (a string), found {}",
            other.kind()
        ),
    }
}

fn tls_version(key: &str, value: &Node) -> anyhow::Result<Option<TlsVersion>> {
    match value {
        Node::Null => Ok(None),
        Node::String(s) => TlsVersion::parse(key, s).map(Some),
        other => bail!(
            "tls_server_config.{key}: expected TLS12 or TLS13, found {}",
            other.kind()
        ),
    }
}

/// A list of the toolkit's names (cipher suites, curves). An unknown name
/// is refused by its place in the list, not shown.
fn names<T>(
    key: &str,
    value: &Node,
    parse: fn(&str) -> Option<T>,
    example: &str,
) -> anyhow::Result<Vec<T>> {
    let items = match value {
        Node::Null => return Ok(Vec::new()),
        Node::Seq(items) => items,
        other => bail!(
            "tls_server_config.{key}: expected a list of names such as {example}, found {}",
            other.kind()
        ),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let parsed = match item {
            Node::String(s) => parse(s),
            _ => None,
        };
        match parsed {
            Some(v) => out.push(v),
            None => bail!(
                "tls_server_config.{key}: item {} is not a known name (not shown); expected \
                 names such as {example}",
                i + 1
            ),
        }
    }
    Ok(out)
}

fn allowed_sans(value: &Node) -> anyhow::Result<Option<Vec<String>>> {
    let items = match value {
        Node::Null => return Ok(None),
        Node::Seq(items) => items,
        other => bail!(
            "tls_server_config.client_allowed_sans: expected a list of names, found {}",
            other.kind()
        ),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match item.scalar_text() {
            Some(s) => out.push(s),
            None => bail!(
                "tls_server_config.client_allowed_sans: item {} is {}, not a name",
                i + 1,
                item.kind()
            ),
        }
    }
    Ok(Some(out))
}

fn parse_http(node: &Node) -> anyhow::Result<HttpFile> {
    let entries = match node {
        Node::Null => return Ok(HttpFile::default()),
        Node::Map(entries) => entries,
        other => bail!("http_server_config: expected a map, found {}", other.kind()),
    };
    let mut http = HttpFile::default();
    for (key, value) in known_entries("http_server_config", entries, HTTP_KEYS)? {
        match key {
            "http2" => match value {
                Node::Null => {}
                Node::Bool(false) => http.http2 = false,
                Node::Bool(true) => bail!(
                    "`http_server_config.http2` is not supported by pg-storage-exporter: it \
                     serves HTTP/1.1 only; set it to false or remove it"
                ),
                other => bail!(
                    "http_server_config.http2: expected true or false, found {}",
                    other.kind()
                ),
            },
            "headers" => http.headers = parse_headers(value)?,
            _ => {}
        }
    }
    Ok(http)
}

fn parse_headers(node: &Node) -> anyhow::Result<Vec<(String, String)>> {
    let entries = match node {
        Node::Null => return Ok(Vec::new()),
        Node::Map(entries) => entries,
        other => bail!(
            "http_server_config.headers: expected a map of header name to value, found {}",
            other.kind()
        ),
    };
    let allowed = || {
        HEADERS
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for (key, value) in entries {
        let name = match key {
            Node::String(k) => HEADERS.iter().find(|(n, _)| n == k),
            _ => None,
        };
        let Some((name, values)) = name else {
            let shown = match key {
                Node::String(k) if showable(k) => format!("`{k}`"),
                _ => "a header (name not shown)".to_string(),
            };
            // The toolkit's rule: only its own list, matched exactly.
            bail!(
                "http_server_config.headers: {shown} cannot be configured; exporter-toolkit \
                 allows only {}",
                allowed()
            );
        };
        if out.iter().any(|(n, _)| n == name) {
            bail!("`http_server_config.headers.{name}` is given twice; give it once");
        }
        let Some(text) = value.scalar_text() else {
            bail!(
                "http_server_config.headers.{name}: expected a header value, found {}",
                value.kind()
            );
        };
        if !values.is_empty() && !values.contains(&text.as_str()) {
            bail!(
                "http_server_config.headers.{name}: expected one of {} (the value is not shown)",
                values.join(", ")
            );
        }
        if axum::http::HeaderValue::from_str(&text).is_err() {
            bail!(
                "http_server_config.headers.{name}: not a valid HTTP header value (a control \
                 character or a non-ASCII byte; the value is not shown)"
            );
        }
        out.push((name.to_string(), text));
    }
    Ok(out)
}

/// `rate_limit`: the toolkit's token bucket (Go's `rate.Limiter`), on when
/// `interval` is positive; `interval` 0 (or unset, or negative, which Go's
/// `rate.Every` turns into no limit) means no limit.
fn parse_rate_limit(node: &Node) -> anyhow::Result<Option<RateLimit>> {
    let entries = match node {
        Node::Null => return Ok(None),
        Node::Map(entries) => entries,
        other => bail!(
            "rate_limit: expected a map with `interval` and `burst`, found {}",
            other.kind()
        ),
    };
    let mut interval: i128 = 0;
    let mut burst: i64 = 0;
    for (key, value) in known_entries("rate_limit", entries, RATE_KEYS)? {
        match (key, value) {
            (_, Node::Null) => {}
            // Go's YAML decoding of a time.Duration: a string is parsed as
            // a Go duration, an integer counts nanoseconds.
            ("interval", Node::String(s)) => {
                interval = parse_go_duration(s).ok_or_else(|| {
                    anyhow!(
                        "rate_limit.interval: expected a duration such as 1s, 500ms or 1m30s \
                         (the value is not shown)"
                    )
                })?;
            }
            ("interval", Node::Int(n)) => interval = *n,
            ("interval", other) => bail!(
                "rate_limit.interval: expected a duration such as 1s, found {}",
                other.kind()
            ),
            ("burst", Node::Int(n)) => {
                burst = i64::try_from(*n).map_err(|_| anyhow!("rate_limit.burst: out of range"))?;
            }
            ("burst", other) => bail!(
                "rate_limit.burst: expected a whole number, found {}",
                other.kind()
            ),
            _ => {}
        }
    }
    if interval <= 0 {
        return Ok(None);
    }
    let nanos = u64::try_from(interval).unwrap_or(u64::MAX);
    Ok(Some(RateLimit {
        interval: Duration::from_nanos(nanos),
        burst,
    }))
}

/// Go's `time.ParseDuration`: an optional sign, then one or more decimal
/// numbers each with a unit (ns, us, µs, ms, s, m, h), such as `1m30s` or
/// `1.5h`; `0` alone is allowed. Nanoseconds, or None.
fn parse_go_duration(s: &str) -> Option<i128> {
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * unit;
    }
    // Go refuses a duration beyond int64 nanoseconds (about 292 years).
    if total > i64::MAX as f64 {
        return None;
    }
    let n = total.round() as i128;
    Some(if neg { -n } else { n })
}

fn parse_users(node: &Node) -> anyhow::Result<BTreeMap<String, String>> {
    const EXPECTED: &str = "expected a map of user name to bcrypt hash";
    let entries = match node {
        Node::Null => return Ok(BTreeMap::new()),
        Node::Map(entries) => entries,
        other => bail!("basic_auth_users: {EXPECTED}, found {}", other.kind()),
    };
    // Names first, then hashes: a duplicate is refused as such even when
    // one of its hashes is also wrong.
    let mut users = BTreeMap::new();
    for (key, value) in entries {
        let Node::String(user) = key else {
            bail!(
                "basic_auth_users: {EXPECTED}; found a user name that is {} (quote it)",
                key.kind()
            );
        };
        if user.is_empty() || user.contains(':') {
            // RFC 7617: the user-id cannot contain a colon. Not shown: a
            // "user name" with a colon is most likely `user:password`.
            bail!("basic_auth_users: a user name is empty or contains ':' (not shown)");
        }
        if users.insert(user.clone(), value).is_some() {
            // User names are not secret; naming it is what makes the error
            // useful. exporter-toolkit's strict YAML refuses it too.
            bail!("basic_auth_users: user {user:?} is listed twice; list each user once");
        }
    }
    let mut hashes = BTreeMap::new();
    for (user, value) in users {
        // The value is never quoted: if it is not a hash it is probably a
        // plain password pasted by mistake.
        let Node::String(hash) = value else {
            bail!(
                "basic_auth_users.{user}: expected a bcrypt hash (a string), found {}",
                value.kind()
            );
        };
        check_bcrypt(hash)
            .map_err(|why| anyhow!("basic_auth_users.{user}: not a bcrypt hash ({why})"))?;
        let cost = auth::cost(hash);
        if cost > auth::REFUSED_ABOVE {
            bail!(
                "basic_auth_users.{user}: bcrypt cost {cost} is above {}, the highest accepted: \
                 each step doubles a check's time (about 16 s of a core at {}), and a wrong \
                 password holds one of the two check slots that long; make the hash again \
                 with `htpasswd -nBC {} {user}`",
                auth::REFUSED_ABOVE,
                auth::REFUSED_ABOVE,
                auth::USUAL_COST
            );
        }
        hashes.insert(user, hash.clone());
    }
    Ok(hashes)
}

/// What the HTTP endpoint enforces. The default (no `--web.config.file`)
/// enforces nothing: plain HTTP, no authentication.
#[derive(Clone, Default)]
pub struct WebSecurity {
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// Lowest TLS version accepted, when `tls` is set.
    pub(crate) tls_min_version: Option<TlsVersion>,
    /// The client-certificate policy, when `tls` is set.
    pub(crate) client_auth: Option<ClientAuth>,
    pub(crate) basic_auth: Option<Arc<BasicAuth>>,
    /// Response headers and the rate limit.
    pub(crate) extras: Arc<Extras>,
}

// By hand so that a `{:?}` of the options can never print a hash or a key.
impl fmt::Debug for WebSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebSecurity")
            .field("tls", &self.tls.is_some())
            .field("tls_min_version", &self.tls_min_version)
            .field("client_auth", &self.client_auth)
            .field("basic_auth", &self.basic_auth.is_some())
            .field("extras", &self.extras)
            .finish()
    }
}

/// Reads and checks a web configuration file. Errors name the file and the
/// key at fault; they never quote a password hash or a key.
pub fn load(path: &Path) -> anyhow::Result<WebSecurity> {
    load_inner(path).with_context(|| format!("--web.config.file {}", path.display()))
}

fn load_inner(path: &Path) -> anyhow::Result<WebSecurity> {
    let text =
        crate::input::read_to_string(path, crate::input::Kind::WebConfig).context("cannot read")?;
    let file = parse_file(&read_yaml(&text)?)?;
    // Paths in the file are relative to the file, as in exporter-toolkit, so
    // the file and its certificate can move together.
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut warnings = Vec::new();
    let built = match &file.tls_server_config {
        Some(t) if t.is_enabled() => Some(tls::build(t, dir, file.http.http2, &mut warnings)?),
        Some(_) => {
            warnings.push(
                "tls_server_config gives no certificate, key, client CA or client_auth_type: \
                 TLS is off and the endpoint is plain HTTP, as with exporter-toolkit"
                    .to_string(),
            );
            None
        }
        None => None,
    };
    let basic_auth = if file.basic_auth_users.is_empty() {
        // exporter-toolkit treats an empty user list as "no authentication".
        None
    } else {
        warnings.extend(cost_warnings(&file.basic_auth_users));
        Some(Arc::new(
            BasicAuth::new(file.basic_auth_users).context("basic_auth_users")?,
        ))
    };
    if let Some(r) = file.rate_limit
        && r.burst <= 0
    {
        warnings.push(
            "rate_limit: burst is 0 or less, so every request is answered 429 Too Many \
             Requests, as with exporter-toolkit; set burst to 1 or more"
                .to_string(),
        );
    }
    for w in warnings {
        tracing::warn!(file = %path.display(), "{w}");
    }
    let headers = file
        .http
        .headers
        .iter()
        .filter_map(|(n, v)| {
            Some((
                axum::http::HeaderName::from_bytes(n.as_bytes()).ok()?,
                axum::http::HeaderValue::from_str(v).ok()?,
            ))
        })
        .collect();
    let rate_limit = file
        .rate_limit
        .map(|r| Arc::new(RateLimiter::new(r.interval, r.burst)));
    Ok(WebSecurity {
        tls_min_version: built.as_ref().map(|b| b.min_version),
        client_auth: built.as_ref().map(|b| b.client_auth),
        tls: built.map(|b| Arc::new(b.config)),
        basic_auth,
        extras: Arc::new(Extras::new(headers, rate_limit)),
    })
}

/// What to warn of in the users' bcrypt costs, all accepted as the toolkit
/// accepts them: a cost above exporter-toolkit's default, a cost at which a
/// first scrape no longer fits Prometheus's scrape timeout, and costs that
/// differ between users (the time of a 401 then tells those users apart,
/// and from unknown names, which are checked at the cost most users have).
/// Names users, never hashes.
fn cost_warnings(users: &BTreeMap<String, String>) -> Vec<String> {
    let mut by_cost: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (user, hash) in users {
        by_cost.entry(auth::cost(hash)).or_default().push(user);
    }
    let list = |costs: &mut dyn Iterator<Item = (&u32, &Vec<&str>)>| {
        costs
            .map(|(c, u)| format!("cost {c}: {}", u.join(", ")))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut out = Vec::new();
    let mut high = by_cost.range(auth::USUAL_COST + 1..).peekable();
    if high.peek().is_some() {
        out.push(format!(
            "basic_auth_users: bcrypt cost above {} (exporter-toolkit's default) for {}: each \
             step doubles a check's time (about 250 ms of a core at 12), paid by every first \
             scrape after a start or reload and by every wrong password",
            auth::USUAL_COST,
            list(&mut high)
        ));
    }
    let mut too_high = by_cost.range(auth::MAX_COST + 1..).peekable();
    if too_high.peek().is_some() {
        out.push(format!(
            "basic_auth_users: bcrypt cost above {} for {}: one check takes 2 s of a core or \
             more (36 hours at 31), longer than Prometheus's default 10 s scrape timeout allows \
             once a check waits for another, and a wrong password for such a user holds one of \
             the two check slots that long; make the hash again with `htpasswd -nBC {} USER`",
            auth::MAX_COST,
            list(&mut too_high),
            auth::USUAL_COST
        ));
    }
    if by_cost.len() > 1 {
        let stand_in = auth::usual_cost(users.values().map(|h| auth::cost(h))).unwrap_or(0);
        out.push(format!(
            "basic_auth_users: the users' bcrypt costs differ ({}): the time of a wrong answer \
             tells users of one cost from users of another, and from unknown names (checked at \
             cost {stand_in}); make every hash with the same cost",
            list(&mut by_cost.iter())
        ));
    }
    out
}

/// Parses the YAML into a [`Node`] tree without ever showing a value.
///
/// serde_norway's messages are shown only from a first pass that gives no
/// scalar any meaning: its errors there are syntax errors from the YAML
/// parser ("did not find expected key at line 3 column 1"), which name
/// positions and tokens, not text. The second pass can fail only on a scalar
/// whose YAML tag does not fit it (`!!int hunter2`), and serde_norway's
/// message for that quotes the scalar, so only its position is shown.
fn read_yaml(text: &str) -> anyhow::Result<Node> {
    if let Err(e) = serde_norway::from_str::<serde::de::IgnoredAny>(text) {
        bail!("not valid YAML: {e}");
    }
    serde_norway::from_str::<Node>(text).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" at line {} column {}", l.line(), l.column()))
            .unwrap_or_default();
        anyhow!(
            "a value{at} cannot be read: a YAML tag that does not fit the value (such as \
             !!int on text), a custom tag or nesting too deep (the value is not shown)"
        )
    })
}

/// Accepts what `bcrypt::verify` accepts: `$2a$`, `$2b$`, `$2x$` or `$2y$`,
/// cost 4 to 31, 22 characters of salt and 31 of hash.
fn check_bcrypt(hash: &str) -> Result<(), String> {
    // Matched rather than displayed, so that a later bcrypt whose messages
    // quote the input cannot leak a pasted password through here.
    let parts: bcrypt::HashParts = hash.parse().map_err(|e| match e {
        bcrypt::BcryptError::InvalidHash(why) => why.to_string(),
        bcrypt::BcryptError::CostNotAllowed(cost) => format!("cost {cost} is outside 4 to 31"),
        _ => "not in bcrypt's format".to_string(),
    })?;
    let cost = parts.get_cost();
    if !(4..=31).contains(&cost) {
        return Err(format!("cost {cost} is outside 4 to 31"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::tls::read_key;
    use super::*;
    use std::path::PathBuf;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("web.yml");
        std::fs::write(&p, text).unwrap();
        p
    }

    fn err(text: &str) -> String {
        let d = tempfile::tempdir().unwrap();
        format!("{:#}", load(&write(d.path(), text)).unwrap_err())
    }

    #[test]
    fn empty_file_turns_nothing_on() {
        let d = tempfile::tempdir().unwrap();
        for text in [
            "",
            "\n# only a comment\n",
            "basic_auth_users: {}\n",
            "basic_auth_users:\n",
            "tls_server_config:\n",
            // Toolkit keys left at their default ask for nothing.
            "tls_server_config:\nhttp_server_config:\n  http2: false\n  headers: {}\nrate_limit:\n",
        ] {
            let s = load(&write(d.path(), text)).unwrap();
            assert!(s.tls.is_none() && s.basic_auth.is_none(), "{text:?}");
        }
    }

    #[test]
    fn unknown_keys_and_wrong_values_are_named() {
        let e = err("tls_server_config:\n  cert_file: c\n  key_file: k\n  bogus_key: 1\n");
        assert!(
            e.contains("tls_server_config: unknown key `bogus_key`; expected one of `cert_file`"),
            "{e}"
        );
        let e = err("basic_auth_user:\n  a: b\n");
        assert!(e.contains("unknown key `basic_auth_user`"), "{e}");
        // A client CA without a policy: the toolkit's refusal.
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("ca.pem"), "").unwrap();
        let e = format!(
            "{:#}",
            load(&write(
                d.path(),
                "tls_server_config:\n  client_ca_file: ca.pem\n"
            ))
            .unwrap_err()
        );
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
        let e = err("tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n");
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
        let e = err("tls_server_config:\n  client_auth_type: SometimesClientCert\n");
        assert!(
            e.contains("tls_server_config.client_auth_type: expected one of NoClientCert"),
            "{e}"
        );
        let e = err("http_server_config:\n  http2: true\n");
        assert!(
            e.contains("`http_server_config.http2` is not supported by pg-storage-exporter"),
            "{e}"
        );
        let e = err("http_server_config:\n  headers:\n    X-Frame-Options: allow\n");
        assert!(
            e.contains(
                "http_server_config.headers.X-Frame-Options: expected one of deny, sameorigin"
            ),
            "{e}"
        );
        let e = err("http_server_config:\n  headers:\n    Content-Type: x\n");
        assert!(
            e.contains("http_server_config.headers: `Content-Type` cannot be configured"),
            "{e}"
        );
        let e = err("rate_limit:\n  interval: 1 second\n");
        assert!(
            e.contains("rate_limit.interval: expected a duration"),
            "{e}"
        );
        let e = err("rate_limit:\n  burst: many\n");
        assert!(
            e.contains("rate_limit.burst: expected a whole number"),
            "{e}"
        );
        let e = err("tls_server_config:\n  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n");
        assert!(
            e.contains("tls_server_config.cipher_suites: item 1 is not a known name"),
            "{e}"
        );
        let e = err("tls_server_config:\n  curve_preferences: [X25519, CurveP257]\n");
        assert!(
            e.contains("tls_server_config.curve_preferences: item 2 is not a known name"),
            "{e}"
        );
        let e = err("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS10\n");
        assert!(
            e.contains("tls_server_config.min_version: TLS10 is not supported"),
            "{e}"
        );
        let e = err("tls_server_config:\n  key_file: k\n");
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
        let e = err("tls_server_config:\n  cert: \"\"\n  key_file: k\n");
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
        // A NUL byte (YAML's "\0") is refused with the key, shown escaped.
        let e = err("tls_server_config:\n  cert_file: \"/c\\0rt\"\n  key_file: k\n");
        assert!(
            e.contains("tls_server_config.cert_file: the path /c\\0rt contains a NUL byte"),
            "{e}"
        );
        assert!(!e.contains('\0'), "{e:?}");
    }

    #[test]
    fn settings_without_a_certificate_leave_tls_off_as_in_the_toolkit() {
        let d = tempfile::tempdir().unwrap();
        for text in [
            "tls_server_config:\n  min_version: TLS13\n",
            "tls_server_config:\n  client_auth_type: \"\"\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
        ] {
            let s = load(&write(d.path(), text)).unwrap();
            assert!(s.tls.is_none(), "{text:?}");
        }
    }

    #[test]
    fn go_durations() {
        let ns = |s: &str| parse_go_duration(s);
        assert_eq!(ns("0"), Some(0));
        assert_eq!(ns("1s"), Some(1_000_000_000));
        assert_eq!(ns("1m30s"), Some(90_000_000_000));
        assert_eq!(ns("1.5h"), Some(5_400_000_000_000));
        assert_eq!(ns("500ms"), Some(500_000_000));
        assert_eq!(ns("-2us"), Some(-2_000));
        assert_eq!(ns("3\u{b5}s"), Some(3_000));
        for bad in ["", "1", "s", "1x", "1.2.3s", "--1s", "1 s"] {
            assert_eq!(ns(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rate_limit_follows_the_toolkit() {
        let d = tempfile::tempdir().unwrap();
        for (text, want) in [
            ("rate_limit:\n  interval: 0\n  burst: 0\n", None),
            ("rate_limit:\n  interval: -1s\n  burst: 5\n", None),
            ("rate_limit:\n  burst: 5\n", None),
            (
                "rate_limit:\n  interval: 1s\n  burst: 0\n",
                Some((Duration::from_secs(1), 0)),
            ),
            (
                "rate_limit:\n  interval: 250ms\n  burst: 10\n",
                Some((Duration::from_millis(250), 10)),
            ),
            // An integer counts nanoseconds, as Go's YAML decoding has it.
            (
                "rate_limit:\n  interval: 1000\n  burst: 1\n",
                Some((Duration::from_micros(1), 1)),
            ),
        ] {
            let s = load(&write(d.path(), text)).unwrap();
            assert_eq!(s.extras.rate_limit(), want, "{text:?}");
        }
    }

    #[test]
    fn duplicates_are_refused_by_name() {
        let h = bcrypt::hash("pw", 4).unwrap();
        let e = err(&format!(
            "basic_auth_users:\n  alice: {h}\n  bob: {h}\n  alice: not-a-hash\n"
        ));
        assert!(
            e.contains("basic_auth_users: user \"alice\" is listed twice"),
            "{e}"
        );
        assert!(e.contains("web.yml"), "{e}");
        let e = err("tls_server_config:\n  cert_file: a\n  cert_file: b\n");
        assert!(
            e.contains("`tls_server_config.cert_file` is given twice"),
            "{e}"
        );
        let e = err("basic_auth_users: {}\nbasic_auth_users: {}\n");
        assert!(e.contains("`basic_auth_users` is given twice"), "{e}");
    }

    /// Wrong-typed values holding a marker: the marker never appears, the
    /// key path does.
    #[test]
    fn errors_never_quote_a_value() {
        const M: &str = "Hunter2Secret";
        let cases = [
            (
                format!("basic_auth_users: \"alice:{M}\"\n"),
                "basic_auth_users: expected a map of user name to bcrypt hash, found a string",
            ),
            (
                format!("basic_auth_users: [{M}]\n"),
                "basic_auth_users: expected a map",
            ),
            (
                format!("basic_auth_users:\n  alice: [{M}]\n"),
                "basic_auth_users.alice: expected a bcrypt hash",
            ),
            (
                format!("basic_auth_users:\n  alice: {{{M}: 1}}\n"),
                "basic_auth_users.alice: expected a bcrypt hash",
            ),
            (
                format!("basic_auth_users:\n  alice: {M}\n"),
                "basic_auth_users.alice: not a bcrypt hash",
            ),
            (
                format!("basic_auth_users:\n  alice: $2y$10${M}\n"),
                "basic_auth_users.alice: not a bcrypt hash",
            ),
            (
                format!("basic_auth_users:\n  alice:{M}:\n"),
                "basic_auth_users: a user name is empty or contains ':'",
            ),
            (
                format!("basic_auth_users:\n  alice: !!int {M}\n"),
                "at line 2 column",
            ),
            (
                format!("basic_auth_users:\n  alice: !secret {M}\n"),
                "at line 2 column",
            ),
            (format!("basic_auth_users: \"{M}\n"), "not valid YAML"),
            (
                format!("basic_auth_users: {{alice: {M}\n"),
                "not valid YAML",
            ),
            (
                format!("alice:{M}: 1\n"),
                "an unknown key that is not a key name (not shown); expected one of",
            ),
            (format!("{M}\n"), "expected a map with `tls_server_config`"),
            (
                format!("tls_server_config: {M}\n"),
                "tls_server_config: expected a map",
            ),
            (
                format!("tls_server_config:\n  cert_file: [{M}]\n"),
                "tls_server_config.cert_file: expected a file name",
            ),
            (
                format!("tls_server_config:\n  key: {M}\n"),
                "tls_server_config.cert_file: missing",
            ),
            (
                format!(
                    "tls_server_config:\n  cert_file: c\n  key: \"-----BEGIN PRIVATE KEY-----\\n{M}\\n\"\n"
                ),
                "tls_server_config.cert_file",
            ),
            (
                format!("tls_server_config:\n  cipher_suites: [{M}]\n"),
                "tls_server_config.cipher_suites: item 1 is not a known name",
            ),
            (
                format!("tls_server_config:\n  client_allowed_sans: {{{M}: 1}}\n"),
                "tls_server_config.client_allowed_sans: expected a list",
            ),
            (
                format!("http_server_config:\n  headers:\n    X-Frame-Options: {M}\n"),
                "http_server_config.headers.X-Frame-Options: expected one of deny, sameorigin",
            ),
            (
                format!("http_server_config:\n  headers:\n    \"alice:{M}\": x\n"),
                "http_server_config.headers: a header (name not shown) cannot be configured",
            ),
            (
                format!("tls_server_config:\n  min_version: {M}\n"),
                "tls_server_config.min_version: expected TLS12 or TLS13",
            ),
            (
                format!("tls_server_config:\n  client_auth_type: {M}\n"),
                "tls_server_config.client_auth_type: expected one of NoClientCert",
            ),
            (
                format!("http_server_config:\n  http2: {M}\n"),
                "http_server_config.http2: expected true or false",
            ),
            (
                format!("http_server_config: {M}\n"),
                "http_server_config: expected a map",
            ),
            (
                format!("rate_limit:\n  interval: {M}\n"),
                "rate_limit.interval: expected a duration",
            ),
            (
                format!("rate_limit:\n  burst: {M}\n"),
                "rate_limit.burst: expected a whole number",
            ),
        ];
        for (text, want) in &cases {
            let e = err(text);
            assert!(!e.contains(M), "{text:?} quoted: {e}");
            assert!(e.contains(want), "{text:?}: {want:?} not in: {e}");
        }
        let e = err("basic_auth_users:\n  alice: 12345678\n");
        assert!(
            e.contains("basic_auth_users.alice: expected a bcrypt hash"),
            "{e}"
        );
        assert!(!e.contains("12345678"), "{e}");
    }

    #[test]
    fn pem_errors_quote_nothing_from_the_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("k.pem"), "-----BEGIN Hunter2Secret\nAAAA\n").unwrap();
        let p = write(
            d.path(),
            "tls_server_config:\n  cert_file: k.pem\n  key_file: k.pem\n",
        );
        let e = format!("{:#}", load(&p).unwrap_err());
        assert!(e.contains("tls_server_config.cert_file"), "{e}");
        assert!(!e.contains("Hunter2Secret"), "{e}");
        assert!(read_key(&d.path().join("k.pem")).is_err());
        let e = format!("{:#}", read_key(&d.path().join("k.pem")).unwrap_err());
        assert!(!e.contains("Hunter2Secret"), "{e}");
    }

    /// A hash of cost `c` made from a cost-4 one: loading reads the cost
    /// field only, and cost 31 would take days to make for real.
    fn hash_of_cost(c: u32) -> String {
        bcrypt::hash("pw", 4)
            .unwrap()
            .replacen("$04$", &format!("${c:02}$"), 1)
    }

    /// exporter-toolkit accepts any cost bcrypt allows (its own test
    /// file has a user at 18); so does this, warning of those above the
    /// ceiling by name, never by hash.
    #[test]
    fn a_cost_above_the_ceiling_is_accepted_with_a_warning_naming_the_user() {
        let d = tempfile::tempdir().unwrap();
        for c in [auth::MAX_COST + 1, auth::REFUSED_ABOVE] {
            let h = hash_of_cost(c);
            let users: BTreeMap<String, String> = [
                ("alice".to_string(), hash_of_cost(10)),
                ("bob".to_string(), h.clone()),
            ]
            .into();
            let w = cost_warnings(&users);
            let line = w
                .iter()
                .find(|w| w.contains(&format!("cost above {}", auth::MAX_COST)))
                .unwrap_or_else(|| panic!("{w:?}"));
            assert!(line.contains(&format!("cost {c}: bob")), "{line}");
            assert!(w.iter().all(|w| !w.contains(&h[7..])), "{w:?}");
            let p = write(
                d.path(),
                &format!(
                    "basic_auth_users:\n  alice: {}\n  bob: {h}\n",
                    hash_of_cost(10)
                ),
            );
            assert!(load(&p).unwrap().basic_auth.is_some());
        }
        let users: BTreeMap<String, String> =
            [("a".to_string(), hash_of_cost(auth::MAX_COST))].into();
        assert!(
            cost_warnings(&users)
                .iter()
                .all(|w| !w.contains(&format!("cost above {}", auth::MAX_COST)))
        );
    }

    /// Above the toolkit's own highest (18), a check would hold a slot for
    /// half a minute to 36 hours (31): refused at start and at reload,
    /// naming the user and never the hash.
    #[test]
    fn a_cost_above_the_highest_accepted_is_refused_naming_the_user() {
        for c in [auth::REFUSED_ABOVE + 1, 31] {
            let h = hash_of_cost(c);
            let e = err(&format!(
                "basic_auth_users:\n  alice: {}\n  bob: {h}\n",
                hash_of_cost(10)
            ));
            assert!(
                e.contains(&format!(
                    "basic_auth_users.bob: bcrypt cost {c} is above {}",
                    auth::REFUSED_ABOVE
                )),
                "{e}"
            );
            assert!(!e.contains(&h) && !e.contains(&h[7..]), "{e}");
        }
    }

    #[test]
    fn high_and_differing_costs_are_warned_of_by_user() {
        let users = |list: &[(&str, u32)]| {
            list.iter()
                .map(|&(u, c)| (u.to_string(), hash_of_cost(c)))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(cost_warnings(&users(&[("a", 10), ("b", 10)])).is_empty());
        assert!(cost_warnings(&users(&[("a", 4)])).is_empty());
        let w = cost_warnings(&users(&[("alice", 12)]));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("cost above 10"), "{w:?}");
        assert!(w[0].contains("cost 12: alice"), "{w:?}");
        let mixed = users(&[("alice", 12), ("bob", 10), ("carol", 12)]);
        let w = cost_warnings(&mixed);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("cost 12: alice, carol"), "{w:?}");
        assert!(!w[0].contains("bob"), "{w:?}");
        assert!(
            w[1].contains("costs differ (cost 10: bob; cost 12: alice, carol)"),
            "{w:?}"
        );
        assert!(w[1].contains("unknown names (checked at cost 12)"), "{w:?}");
        for h in mixed.values() {
            assert!(w.iter().all(|w| !w.contains(&h[7..])), "{w:?}");
        }
    }

    #[test]
    fn valid_hashes_pass() {
        let h = bcrypt::hash("pw", 4).unwrap();
        assert!(check_bcrypt(&h).is_ok());
        assert!(check_bcrypt(&h.replacen("$2b$", "$2y$", 1)).is_ok());
        assert!(check_bcrypt(&h.replacen("$04$", "$03$", 1)).is_err());
    }
}
