//! `--web.config.file`: TLS and basic auth for the HTTP endpoint, in the
//! format of the Prometheus exporter-toolkit's web configuration, so one file
//! can serve this exporter and node_exporter alike.
//!
//! Everything is read and checked here, once, before any port is bound: a
//! missing certificate or a malformed hash is a start-up error naming the file
//! and the key, never a failure on the first scrape.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use crate::http::auth::{self, BasicAuth};

/// The file once checked: only the keys this exporter implements, as plain
/// values. Built by hand from a [`Node`] tree rather than derived with serde,
/// because serde's type errors quote the offending value (`invalid type:
/// string "alice:hunter2"`), and in this file a value of the wrong type is
/// most likely a password pasted where a hash belongs.
#[derive(Default)]
struct File {
    tls_server_config: Option<TlsFile>,
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Default)]
struct TlsFile {
    cert_file: Option<String>,
    key_file: Option<String>,
    min_version: Option<TlsVersion>,
    max_version: Option<TlsVersion>,
}

/// A YAML value as read, before any meaning is given to it. Maps keep every
/// entry in order, duplicates included, so that a duplicate can be refused
/// by name (serde_norway's own maps refuse one quoting the key, and typed
/// maps silently keep the last). Numbers and lists keep no contents: nothing
/// here needs them, and what is not kept cannot be echoed.
enum Node {
    Null,
    Bool(bool),
    Number,
    String(String),
    Seq(usize),
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// What was found, for "expected X, found Y": a kind, never a value.
    fn kind(&self) -> &'static str {
        match self {
            Node::Null => "nothing",
            Node::Bool(_) => "a boolean",
            Node::Number => "a number",
            Node::String(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a map",
        }
    }

    /// Null, "", [] or {}: what Go's YAML decoding leaves at the zero value,
    /// which exporter-toolkit reads as "not set".
    fn is_empty(&self) -> bool {
        match self {
            Node::Null => true,
            Node::String(s) => s.is_empty(),
            Node::Seq(n) => *n == 0,
            Node::Map(m) => m.is_empty(),
            Node::Bool(_) | Node::Number => false,
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
    fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Number)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Number)
    }
    fn visit_i128<E>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Number)
    }
    fn visit_u128<E>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Number)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Number)
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
        let mut n = 0;
        while seq.next_element::<Node>()?.is_some() {
            n += 1;
        }
        Ok(Node::Seq(n))
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

/// How each exporter-toolkit key is treated. The toolkit's keys are all
/// listed, so a key the toolkit has but this exporter does not implement is
/// refused by name ("not supported") instead of being ignored: silently
/// dropping, say, `client_auth_type` would leave an endpoint open that the
/// operator believes requires client certificates. The README's table of
/// keys says the same; keep them together.
enum Support {
    Yes,
    /// Refused unless empty; the text says what this exporter does instead.
    No(&'static str),
}

const NO_CLIENT_CERTS: &str = "it does not ask for or check client certificates; \
                               `basic_auth_users` is how it authenticates clients";
const RUSTLS_DEFAULTS: &str = "it uses rustls's default cipher suites, key \
                               exchange groups and their order; `min_version` and \
                               `max_version` choose the TLS versions";

const TOP_KEYS: &[(&str, Support)] = &[
    ("tls_server_config", Support::Yes),
    ("basic_auth_users", Support::Yes),
    // Checked key by key: `http2: false` says what this exporter does.
    ("http_server_config", Support::Yes),
    (
        "rate_limit",
        Support::No("it has no request rate limit; put a reverse proxy in front"),
    ),
];

const TLS_KEYS: &[(&str, Support)] = &[
    ("cert_file", Support::Yes),
    ("key_file", Support::Yes),
    ("min_version", Support::Yes),
    ("max_version", Support::Yes),
    (
        "cert",
        Support::No("it reads the certificate from a PEM file: use `cert_file`"),
    ),
    (
        "key",
        Support::No("it reads the key from a PEM file: use `key_file`"),
    ),
    // `client_auth_type: NoClientCert` (the toolkit's default) is accepted:
    // it says what this exporter does.
    ("client_auth_type", Support::Yes),
    ("client_ca", Support::No(NO_CLIENT_CERTS)),
    ("client_ca_file", Support::No(NO_CLIENT_CERTS)),
    ("client_allowed_sans", Support::No(NO_CLIENT_CERTS)),
    ("cipher_suites", Support::No(RUSTLS_DEFAULTS)),
    ("curve_preferences", Support::No(RUSTLS_DEFAULTS)),
    ("prefer_server_cipher_suites", Support::No(RUSTLS_DEFAULTS)),
];

const HTTP_KEYS: &[(&str, Support)] = &[
    // `http2: false` is accepted: this exporter serves HTTP/1.1 only.
    ("http2", Support::Yes),
    (
        "headers",
        Support::No("it adds no configurable response headers"),
    ),
];

/// How an unknown key is named in an error: by its text only if it looks
/// like a key name. A "key" such as `alice:hunter2` (a password typed where
/// a user name or a key belongs) is not shown.
fn unknown_key(key: &Node) -> String {
    match key {
        Node::String(k)
            if !k.is_empty()
                && k.len() <= 64
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) =>
        {
            format!("unknown key `{k}`")
        }
        Node::String(_) => "an unknown key that is not a key name (not shown)".to_string(),
        other => format!("a key that is {} instead of a name", other.kind()),
    }
}

/// The entries of the map at `path` whose keys this exporter implements,
/// after refusing unknown keys, duplicates and set toolkit keys it does not
/// implement. `path` is "" for the top level.
fn known_entries<'a>(
    path: &str,
    entries: &'a [(Node, Node)],
    keys: &[(&'static str, Support)],
) -> anyhow::Result<Vec<(&'static str, &'a Node)>> {
    let at = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    let mut seen: Vec<(&'static str, &'a Node)> = Vec::new();
    for (key, value) in entries {
        let known = match key {
            Node::String(k) => keys.iter().find(|(name, _)| name == k),
            _ => None,
        };
        let Some((name, support)) = known else {
            let expected: Vec<String> = keys
                .iter()
                .filter(|(_, s)| matches!(s, Support::Yes))
                .map(|(name, _)| format!("`{name}`"))
                .collect();
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
            bail!("`{}` is given twice; give it once", at(name));
        }
        if let Support::No(instead) = support {
            // Null, "", [] or {} is the toolkit's default: nothing is asked
            // that this exporter does not do.
            if !value.is_empty() {
                bail!(
                    "`{}` is not supported by pg-storage-exporter: {instead}",
                    at(name)
                );
            }
            continue;
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
            "http_server_config" => check_http(value)?,
            // known_entries returns only keys listed as supported.
            _ => {}
        }
    }
    Ok(file)
}

fn parse_tls(node: &Node) -> anyhow::Result<Option<TlsFile>> {
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
    let mut t = TlsFile::default();
    for (key, value) in known_entries("tls_server_config", entries, TLS_KEYS)? {
        match key {
            "cert_file" => t.cert_file = file_name(key, value)?,
            "key_file" => t.key_file = file_name(key, value)?,
            "min_version" => t.min_version = tls_version(key, value)?,
            "max_version" => t.max_version = tls_version(key, value)?,
            "client_auth_type" => match value {
                Node::Null => {}
                Node::String(s) if s.is_empty() || s == "NoClientCert" => {}
                _ => bail!(
                    "`tls_server_config.client_auth_type` is not supported by \
                     pg-storage-exporter (other than NoClientCert): {NO_CLIENT_CERTS}"
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

fn check_http(node: &Node) -> anyhow::Result<()> {
    let entries = match node {
        Node::Null => return Ok(()),
        Node::Map(entries) => entries,
        other => bail!("http_server_config: expected a map, found {}", other.kind()),
    };
    for (key, value) in known_entries("http_server_config", entries, HTTP_KEYS)? {
        if key == "http2" {
            match value {
                Node::Null | Node::Bool(false) => {}
                Node::Bool(true) => bail!(
                    "`http_server_config.http2` is not supported by pg-storage-exporter: it \
                     serves HTTP/1.1 only; set it to false or remove it"
                ),
                other => bail!(
                    "http_server_config.http2: expected true or false, found {}",
                    other.kind()
                ),
            }
        }
    }
    Ok(())
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
        if cost > auth::MAX_COST {
            bail!(
                "basic_auth_users.{user}: bcrypt cost {cost} is above {}, the highest accepted: \
                 each step doubles a check's time (about 1 s of a core at {}), and every first \
                 scrape and every wrong password pays it; make the hash again with \
                 `htpasswd -nBC {} {user}`",
                auth::MAX_COST,
                auth::MAX_COST,
                auth::USUAL_COST
            );
        }
        hashes.insert(user, hash.clone());
    }
    Ok(hashes)
}

/// TLS protocol versions rustls speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    /// The exporter-toolkit spelling, also used in the start-up log line.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "TLS12",
            TlsVersion::Tls13 => "TLS13",
        }
    }

    fn parse(key: &str, s: &str) -> anyhow::Result<TlsVersion> {
        match s {
            "TLS12" => Ok(TlsVersion::Tls12),
            "TLS13" => Ok(TlsVersion::Tls13),
            // Shown because they are the toolkit's own spellings, matched
            // here, not text from the file.
            "TLS10" | "TLS11" => {
                bail!("tls_server_config.{key}: {s} is not supported: only TLS12 and TLS13 are")
            }
            _ => bail!("tls_server_config.{key}: expected TLS12 or TLS13"),
        }
    }

    fn rustls(self) -> &'static rustls::SupportedProtocolVersion {
        match self {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        }
    }
}

/// What the HTTP endpoint enforces. The default (no `--web.config.file`)
/// enforces nothing: plain HTTP, no authentication.
#[derive(Clone, Default)]
pub struct WebSecurity {
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// Lowest TLS version accepted, when `tls` is set.
    pub(crate) tls_min_version: Option<TlsVersion>,
    pub(crate) basic_auth: Option<Arc<BasicAuth>>,
}

// By hand so that a `{:?}` of the options can never print a hash or a key.
impl fmt::Debug for WebSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebSecurity")
            .field("tls", &self.tls.is_some())
            .field("tls_min_version", &self.tls_min_version)
            .field("basic_auth", &self.basic_auth.is_some())
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
    let (tls, tls_min_version) = match file.tls_server_config {
        Some(t) => {
            let (config, min) = tls_config(&t, dir)?;
            (Some(Arc::new(config)), Some(min))
        }
        None => (None, None),
    };
    let basic_auth = if file.basic_auth_users.is_empty() {
        // exporter-toolkit treats an empty user list as "no authentication".
        None
    } else {
        for w in cost_warnings(&file.basic_auth_users) {
            tracing::warn!(file = %path.display(), "{w}");
        }
        Some(Arc::new(
            BasicAuth::new(file.basic_auth_users).context("basic_auth_users")?,
        ))
    };
    Ok(WebSecurity {
        tls,
        tls_min_version,
        basic_auth,
    })
}

/// What to warn of in the users' bcrypt costs, all accepted: a cost above
/// exporter-toolkit's default, and costs that differ between users (the
/// time of a 401 then tells those users apart, and from unknown names,
/// which are checked at the cost most users have). Names users, never
/// hashes.
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

fn tls_config(t: &TlsFile, dir: &Path) -> anyhow::Result<(rustls::ServerConfig, TlsVersion)> {
    // exporter-toolkit's defaults, and the versions rustls speaks.
    let min = t.min_version.unwrap_or(TlsVersion::Tls12);
    let max = t.max_version.unwrap_or(TlsVersion::Tls13);
    if min > max {
        bail!(
            "tls_server_config: min_version {} is above max_version {}",
            min.as_str(),
            max.as_str()
        );
    }
    let cert_path = required_path(&t.cert_file, "cert_file", dir)?;
    let key_path = required_path(&t.key_file, "key_file", dir)?;
    let certs = read_certs(&cert_path)?;
    let key = read_key(&key_path)?;

    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [TlsVersion::Tls13, TlsVersion::Tls12]
            .into_iter()
            .filter(|v| (min..=max).contains(v))
            .map(TlsVersion::rustls)
            .collect();
    // The ring provider explicitly, as the PostgreSQL client does: the
    // process-wide default would be ambiguous if another crate ever enabled
    // aws-lc-rs.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .context("tls_server_config: min_version/max_version")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| {
            format!(
                "tls_server_config: cert_file {} and key_file {} do not form a usable pair",
                cert_path.display(),
                key_path.display()
            )
        })?;
    Ok((config, min))
}

fn required_path(value: &Option<String>, key: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    match value.as_deref() {
        Some(p) if !p.is_empty() => Ok(dir.join(p)),
        _ => bail!("tls_server_config.{key}: missing (required when tls_server_config is present)"),
    }
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let what = || format!("tls_server_config.cert_file {}", path.display());
    // Read first so that a missing or unreadable file gets the plain OS error
    // (which names no content).
    let pem = crate::input::read(path, crate::input::Kind::Certificate)
        .with_context(|| format!("{}: cannot read", what()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            anyhow!(
                "{}: not a PEM certificate file ({})",
                what(),
                pem_reason(&e)
            )
        })?;
    if certs.is_empty() {
        bail!("{}: no PEM certificate in it", what());
    }
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let what = || format!("tls_server_config.key_file {}", path.display());
    let pem = crate::input::read(path, crate::input::Kind::PrivateKey)
        .with_context(|| format!("{}: cannot read", what()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow!(
            "{}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1) in it ({})",
            what(),
            pem_reason(&e)
        )
    })
}

/// The PEM parser's error in words that quote nothing from the file: its
/// own Display shows the offending line of a malformed section start, and
/// in a key file that line is the key's.
fn pem_reason(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match e {
        Error::MissingSectionEnd { .. } => "a PEM section has no END line",
        Error::IllegalSectionStart { .. } => "a malformed BEGIN line",
        Error::Base64Decode(_) => "a PEM section is not valid base64",
        Error::NoItemsFound => "no PEM section of the expected kind",
        Error::SectionTooLarge => "a PEM section is too large",
        _ => "not in PEM format",
    }
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
    use super::*;

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
    fn unknown_and_unsupported_keys_are_named() {
        let e = err("tls_server_config:\n  cert_file: c\n  key_file: k\n  bogus_key: 1\n");
        assert!(
            e.contains("tls_server_config: unknown key `bogus_key`; expected one of `cert_file`"),
            "{e}"
        );
        let e = err("basic_auth_user:\n  a: b\n");
        assert!(e.contains("unknown key `basic_auth_user`"), "{e}");
        let e = err("tls_server_config:\n  client_ca_file: ca.pem\n");
        assert!(
            e.contains("`tls_server_config.client_ca_file` is not supported by pg-storage-exporter: it does not ask for or check client certificates"),
            "{e}"
        );
        let e = err("tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n");
        assert!(
            e.contains("`tls_server_config.client_auth_type` is not supported"),
            "{e}"
        );
        let e = err("http_server_config:\n  http2: true\n");
        assert!(
            e.contains("`http_server_config.http2` is not supported by pg-storage-exporter"),
            "{e}"
        );
        let e = err("http_server_config:\n  headers:\n    X-Frame-Options: deny\n");
        assert!(
            e.contains("`http_server_config.headers` is not supported"),
            "{e}"
        );
        let e = err("rate_limit:\n  interval: 1s\n  burst: 5\n");
        assert!(e.contains("`rate_limit` is not supported"), "{e}");
        let e = err("tls_server_config:\n  cert: |\n    -----BEGIN CERTIFICATE-----\n");
        assert!(
            e.contains("`tls_server_config.cert` is not supported"),
            "{e}"
        );
        assert!(e.contains("`cert_file`"), "{e}");
        let e = err("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS10\n");
        assert!(
            e.contains("tls_server_config.min_version: TLS10 is not supported"),
            "{e}"
        );
        let e = err("tls_server_config:\n  key_file: k\n");
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
        // A NUL byte (YAML's "\0") is refused with the key, shown escaped.
        let e = err("tls_server_config:\n  cert_file: \"/c\\0rt\"\n  key_file: k\n");
        assert!(
            e.contains("tls_server_config.cert_file: the path /c\\0rt contains a NUL byte"),
            "{e}"
        );
        assert!(!e.contains('\0'), "{e:?}");
        // Accepted: what the toolkit's default says is what this exporter does.
        let e = err("tls_server_config:\n  client_auth_type: NoClientCert\n");
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
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
                "`tls_server_config.key` is not supported",
            ),
            (
                format!("tls_server_config:\n  min_version: {M}\n"),
                "tls_server_config.min_version: expected TLS12 or TLS13",
            ),
            (
                format!("tls_server_config:\n  client_auth_type: {M}\n"),
                "`tls_server_config.client_auth_type` is not supported",
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
                "`rate_limit` is not supported",
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

    #[test]
    fn a_cost_above_the_ceiling_is_refused_naming_the_user() {
        for c in [auth::MAX_COST + 1, 31] {
            let h = hash_of_cost(c);
            let e = err(&format!(
                "basic_auth_users:\n  alice: {}\n  bob: {h}\n",
                hash_of_cost(10)
            ));
            assert!(
                e.contains(&format!(
                    "basic_auth_users.bob: bcrypt cost {c} is above {}",
                    auth::MAX_COST
                )),
                "{e}"
            );
            assert!(!e.contains(&h) && !e.contains(&h[7..]), "{e}");
        }
        let d = tempfile::tempdir().unwrap();
        let p = write(
            d.path(),
            &format!("basic_auth_users:\n  a: {}\n", hash_of_cost(auth::MAX_COST)),
        );
        assert!(load(&p).unwrap().basic_auth.is_some());
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
