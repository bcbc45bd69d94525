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

use crate::http::auth::BasicAuth;

/// The file as written. Every exporter-toolkit key is known here, so a key
/// the toolkit has but this exporter does not implement is refused by name
/// ("not supported") instead of being ignored: silently dropping, say,
/// `client_auth_type` would leave an endpoint open that the operator believes
/// requires client certificates.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<serde_norway::Value>,
    /// Values stay untyped until checked: a serde type error would quote the
    /// value, and a value that is not a hash is most likely a plain password.
    basic_auth_users: Option<BTreeMap<String, serde_norway::Value>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<String>,
    key_file: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    // exporter-toolkit keys this exporter does not implement (see `File`).
    cert: Option<serde_norway::Value>,
    key: Option<serde_norway::Value>,
    client_auth_type: Option<serde_norway::Value>,
    client_ca_file: Option<serde_norway::Value>,
    client_allowed_sans: Option<serde_norway::Value>,
    cipher_suites: Option<serde_norway::Value>,
    curve_preferences: Option<serde_norway::Value>,
    prefer_server_cipher_suites: Option<serde_norway::Value>,
}

/// TLS protocol versions rustls speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    /// The exporter-toolkit spelling, also used in the start-up log line.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "TLS12",
            TlsVersion::Tls13 => "TLS13",
        }
    }

    fn parse(key: &str, s: &str) -> anyhow::Result<TlsVersion> {
        match s {
            "TLS12" => Ok(TlsVersion::Tls12),
            "TLS13" => Ok(TlsVersion::Tls13),
            "TLS10" | "TLS11" => {
                bail!("tls_server_config.{key}: {s:?} is not supported: only TLS12 and TLS13 are")
            }
            _ => bail!("tls_server_config.{key}: {s:?} is not one of TLS12, TLS13"),
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
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Lowest TLS version accepted, when `tls` is set.
    pub tls_min_version: Option<TlsVersion>,
    pub basic_auth: Option<Arc<BasicAuth>>,
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
    let text = std::fs::read_to_string(path).context("cannot read")?;
    // An empty file (or one of comments only) is valid and turns nothing on,
    // as with exporter-toolkit; YAML reads it as null, not as an empty map.
    let file: File = if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        File::default()
    } else {
        // serde_norway's messages start with the path of the offending key
        // (e.g. "tls_server_config: unknown field `foo`") and end with its
        // line and column.
        serde_norway::from_str(&text).map_err(|e| anyhow!("{e}"))?
    };
    if file.http_server_config.is_some() {
        bail!("http_server_config: not supported by pg-storage-exporter");
    }
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
    let basic_auth = match file.basic_auth_users {
        // exporter-toolkit treats an empty user list as "no authentication".
        Some(users) if !users.is_empty() => Some(Arc::new(basic_auth(users)?)),
        _ => None,
    };
    Ok(WebSecurity {
        tls,
        tls_min_version,
        basic_auth,
    })
}

fn tls_config(t: &TlsFile, dir: &Path) -> anyhow::Result<(rustls::ServerConfig, TlsVersion)> {
    let unsupported = [
        ("cert", t.cert.is_some()),
        ("key", t.key.is_some()),
        ("client_auth_type", t.client_auth_type.is_some()),
        ("client_ca_file", t.client_ca_file.is_some()),
        ("client_allowed_sans", t.client_allowed_sans.is_some()),
        ("cipher_suites", t.cipher_suites.is_some()),
        ("curve_preferences", t.curve_preferences.is_some()),
        (
            "prefer_server_cipher_suites",
            t.prefer_server_cipher_suites.is_some(),
        ),
    ];
    if let Some((key, _)) = unsupported.iter().find(|(_, set)| *set) {
        bail!("tls_server_config.{key}: not supported by pg-storage-exporter");
    }
    let min = match &t.min_version {
        Some(v) => TlsVersion::parse("min_version", v)?,
        // exporter-toolkit's default, and the lowest rustls speaks.
        None => TlsVersion::Tls12,
    };
    let max = match &t.max_version {
        Some(v) => TlsVersion::parse("max_version", v)?,
        None => TlsVersion::Tls13,
    };
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
    // Read first so that a missing or unreadable file gets the plain OS error.
    let pem = std::fs::read(path).with_context(|| format!("{}: cannot read", what()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not a PEM certificate file", what()))?;
    if certs.is_empty() {
        bail!("{}: no PEM certificate in it", what());
    }
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let what = || format!("tls_server_config.key_file {}", path.display());
    let pem = std::fs::read(path).with_context(|| format!("{}: cannot read", what()))?;
    // The PEM error never contains key material, only a structural reason.
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow!(
            "{}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1) in it: {e}",
            what()
        )
    })
}

fn basic_auth(users: BTreeMap<String, serde_norway::Value>) -> anyhow::Result<BasicAuth> {
    let mut hashes = BTreeMap::new();
    for (user, value) in users {
        if user.is_empty() || user.contains(':') {
            // RFC 7617: the user-id cannot contain a colon.
            bail!("basic_auth_users: user name {user:?} is empty or contains ':'");
        }
        // The value is never quoted: if it is not a hash it is probably a
        // plain password pasted by mistake.
        let serde_norway::Value::String(hash) = value else {
            bail!("basic_auth_users.{user}: must be a bcrypt hash string");
        };
        check_bcrypt(&hash)
            .map_err(|why| anyhow!("basic_auth_users.{user}: not a bcrypt hash ({why})"))?;
        hashes.insert(user, hash);
    }
    BasicAuth::new(hashes).context("basic_auth_users")
}

/// Accepts what `bcrypt::verify` accepts: `$2a$`, `$2b$`, `$2x$` or `$2y$`,
/// cost 4 to 31, 22 characters of salt and 31 of hash.
fn check_bcrypt(hash: &str) -> Result<(), String> {
    let parts: bcrypt::HashParts = hash.parse().map_err(|e: bcrypt::BcryptError| {
        // BcryptError's messages describe the format, never the input.
        e.to_string()
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
        for text in ["", "\n# only a comment\n", "basic_auth_users: {}\n"] {
            let s = load(&write(d.path(), text)).unwrap();
            assert!(s.tls.is_none() && s.basic_auth.is_none(), "{text:?}");
        }
    }

    #[test]
    fn unknown_and_unsupported_keys_are_named() {
        let e = err("tls_server_config:\n  cert_file: c\n  key_file: k\n  bogus_key: 1\n");
        assert!(e.contains("bogus_key"), "{e}");
        let e = err("basic_auth_user:\n  a: b\n");
        assert!(e.contains("basic_auth_user"), "{e}");
        let e = err("tls_server_config:\n  client_ca_file: ca.pem\n");
        assert!(
            e.contains("tls_server_config.client_ca_file: not supported"),
            "{e}"
        );
        let e = err("http_server_config:\n  http2: false\n");
        assert!(e.contains("http_server_config"), "{e}");
        let e = err("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS10\n");
        assert!(e.contains("min_version"), "{e}");
        let e = err("tls_server_config:\n  key_file: k\n");
        assert!(e.contains("tls_server_config.cert_file: missing"), "{e}");
    }

    #[test]
    fn hash_errors_name_the_user_and_never_quote_the_value() {
        for value in ["hunter2-secret", "12345678", "$2y$03$hunter2-secret"] {
            let e = err(&format!("basic_auth_users:\n  alice: '{value}'\n"));
            assert!(e.contains("basic_auth_users.alice"), "{e}");
            assert!(!e.contains("hunter2") && !e.contains("12345678"), "{e}");
        }
        let e = err("basic_auth_users:\n  alice: 12345678\n");
        assert!(e.contains("basic_auth_users.alice"), "{e}");
        assert!(!e.contains("12345678"), "{e}");
    }

    #[test]
    fn valid_hashes_pass() {
        let h = bcrypt::hash("pw", 4).unwrap();
        assert!(check_bcrypt(&h).is_ok());
        assert!(check_bcrypt(&h.replacen("$2b$", "$2y$", 1)).is_ok());
        assert!(check_bcrypt(&h.replacen("$04$", "$03$", 1)).is_err());
    }
}
