//! `tls_server_config` made into rustls's server settings, with
//! exporter-toolkit's meaning (its `ConfigToTLSConfig`, and Go's TLS and
//! HTTP/2 servers behind it) wherever rustls can give it.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use rustls::SupportedCipherSuite;
use rustls::crypto::ring::{cipher_suite, kx_group};
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use zeroize::Zeroizing;

use super::client_auth::{ClientAuth, ClientCerts};

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

    pub(super) fn parse(key: &str, s: &str) -> anyhow::Result<TlsVersion> {
        match s {
            "TLS12" => Ok(TlsVersion::Tls12),
            "TLS13" => Ok(TlsVersion::Tls13),
            // Shown because they are the toolkit's own spellings, matched
            // here, not text from the file. rustls has no TLS 1.0 or 1.1,
            // which RFC 8996 deprecates.
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

/// `tls_server_config`, as written; [`build`] gives it meaning.
#[derive(Default)]
pub(super) struct TlsFile {
    pub(super) cert_file: Option<String>,
    pub(super) key_file: Option<String>,
    /// Inline PEM, used when `cert_file` is not set (as in the toolkit).
    pub(super) cert: Option<String>,
    pub(super) key: Option<Zeroizing<String>>,
    pub(super) client_ca_file: Option<String>,
    pub(super) client_ca: Option<String>,
    pub(super) client_auth_type: Option<ClientAuth>,
    /// Set when the key is present with a non-empty value: what counts for
    /// the toolkit's "is TLS enabled".
    pub(super) client_auth_type_set: bool,
    pub(super) client_allowed_sans: Option<Vec<String>>,
    pub(super) cipher_suites: Vec<Cipher>,
    pub(super) curve_preferences: Vec<Curve>,
    pub(super) min_version: Option<TlsVersion>,
    pub(super) max_version: Option<TlsVersion>,
    pub(super) prefer_server_cipher_suites: Option<bool>,
}

impl TlsFile {
    /// exporter-toolkit's `TLSConfig.IsEnabled`: TLS is on when a
    /// certificate, key, client CA or client policy is given. Settings such
    /// as `min_version` alone leave the endpoint plain HTTP.
    pub(super) fn is_enabled(&self) -> bool {
        let set = |o: &Option<String>| o.as_deref().is_some_and(|s| !s.is_empty());
        set(&self.cert_file)
            || set(&self.key_file)
            || set(&self.cert)
            || self.key.as_ref().is_some_and(|k| !k.is_empty())
            || set(&self.client_ca_file)
            || set(&self.client_ca)
            || self.client_auth_type_set
    }
}

/// The names exporter-toolkit accepts in `cipher_suites`: those of Go's
/// `tls.CipherSuites()` (Go 1.25, which the toolkit requires), in its order.
const GO_CIPHERS: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

pub(super) const CIPHER_EXAMPLE: &str = "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256";
pub(super) const CURVE_EXAMPLE: &str = "CurveP256, CurveP384, CurveP521, X25519";

/// The suites Go's HTTP/2 server requires among a TLS 1.2 list.
const HTTP2_REQUIRED: [&str; 2] = [
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
];

/// One of [`GO_CIPHERS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cipher(&'static str);

enum Suite {
    /// A TLS 1.3 suite: Go does not let them be chosen (every TLS 1.3
    /// suite stays on), so naming one changes nothing, there as here.
    Tls13,
    Tls12(SupportedCipherSuite),
    /// CBC with SHA-1, which rustls does not implement.
    Missing,
}

impl Cipher {
    pub(super) fn parse(s: &str) -> Option<Cipher> {
        GO_CIPHERS.iter().find(|n| **n == s).map(|n| Cipher(n))
    }

    fn suite(self) -> Suite {
        match self.0 {
            "TLS_AES_128_GCM_SHA256"
            | "TLS_AES_256_GCM_SHA384"
            | "TLS_CHACHA20_POLY1305_SHA256" => Suite::Tls13,
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => {
                Suite::Tls12(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
            }
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => {
                Suite::Tls12(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)
            }
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => {
                Suite::Tls12(cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)
            }
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => {
                Suite::Tls12(cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384)
            }
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
                Suite::Tls12(cipher_suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256)
            }
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
                Suite::Tls12(cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256)
            }
            _ => Suite::Missing,
        }
    }
}

/// exporter-toolkit's `curve_preferences` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Curve {
    P256,
    P384,
    P521,
    X25519,
}

impl Curve {
    pub(super) fn parse(s: &str) -> Option<Curve> {
        Some(match s {
            "CurveP256" => Curve::P256,
            "CurveP384" => Curve::P384,
            "CurveP521" => Curve::P521,
            "X25519" => Curve::X25519,
            _ => return None,
        })
    }

    fn group(self) -> &'static dyn SupportedKxGroup {
        match self {
            Curve::P256 => kx_group::SECP256R1,
            Curve::P384 => kx_group::SECP384R1,
            Curve::P521 => super::p521::SECP521R1,
            Curve::X25519 => kx_group::X25519,
        }
    }
}

/// The settings built from `tls_server_config`.
pub(super) struct Built {
    pub(super) config: rustls::ServerConfig,
    pub(super) min_version: TlsVersion,
    pub(super) client_auth: ClientAuth,
}

/// Builds the server settings. Checks run in the toolkit's order (the
/// certificate and key, then the client CA and policy), so a file with
/// several faults is refused for the same one; `warnings` collects what is
/// accepted but worth saying.
pub(super) fn build(
    t: &TlsFile,
    dir: &Path,
    http2: bool,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Built> {
    let given = |o: &Option<String>| o.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
    let cert_file = given(&t.cert_file);
    let cert_inline = given(&t.cert);
    let key_file = given(&t.key_file);
    let key_inline = t.key.as_ref().filter(|k| !k.is_empty());
    if cert_file.is_none() && cert_inline.is_none() {
        bail!(
            "tls_server_config.cert_file: missing (give `cert_file` or an inline `cert`: \
             required when TLS is on)"
        );
    }
    if key_file.is_none() && key_inline.is_none() {
        bail!(
            "tls_server_config.key_file: missing (give `key_file` or an inline `key`: required \
             when TLS is on)"
        );
    }
    // A file wins over inline text, as in the toolkit.
    for (file, inline, name) in [
        (cert_file.is_some(), cert_inline.is_some(), "cert"),
        (key_file.is_some(), key_inline.is_some(), "key"),
        (
            given(&t.client_ca_file).is_some(),
            given(&t.client_ca).is_some(),
            "client_ca",
        ),
    ] {
        if file && inline {
            warnings.push(format!(
                "tls_server_config: both `{name}_file` and `{name}` are given; `{name}` is \
                 ignored, as exporter-toolkit ignores it"
            ));
        }
    }
    let (certs, cert_what) = match (&cert_file, &cert_inline) {
        (Some(f), _) => {
            let p = dir.join(f);
            (read_certs(&p)?, format!("cert_file {}", p.display()))
        }
        (None, Some(pem)) => (
            parse_certs(pem.as_bytes(), "tls_server_config.cert")?,
            "cert (inline)".to_string(),
        ),
        (None, None) => unreachable_missing()?,
    };
    let (key, key_what) = match (&key_file, key_inline) {
        (Some(f), _) => {
            let p = dir.join(f);
            (read_key(&p)?, format!("key_file {}", p.display()))
        }
        (None, Some(pem)) => (
            parse_key(pem.as_bytes(), "tls_server_config.key")?,
            "key (inline)".to_string(),
        ),
        (None, None) => unreachable_missing()?,
    };

    let policy = t.client_auth_type.unwrap_or(ClientAuth::NoClientCert);
    let cas = client_cas(t, dir, policy)?;
    if policy == ClientAuth::NoClientCert {
        if t.client_allowed_sans.is_some() {
            warnings.push(
                "tls_server_config.client_allowed_sans has no effect with client_auth_type \
                 NoClientCert (the default): no client certificate is asked for"
                    .to_string(),
            );
        }
    } else if policy.verifies() && cas.is_none() {
        warnings.push(format!(
            "tls_server_config: client_auth_type {} without client_ca_file: client \
             certificates are verified against the system's CA store, as exporter-toolkit does, \
             so one issued by any public CA is accepted; set client_ca_file",
            policy.as_str()
        ));
    }
    if let Some(sans) = &t.client_allowed_sans
        && sans.is_empty()
        && policy != ClientAuth::NoClientCert
    {
        warnings.push(
            "tls_server_config.client_allowed_sans is an empty list: every client certificate \
             is refused, as with exporter-toolkit"
                .to_string(),
        );
    }

    let min = t.min_version.unwrap_or(TlsVersion::Tls12);
    let max = t.max_version.unwrap_or(TlsVersion::Tls13);
    if min > max {
        bail!(
            "tls_server_config: min_version {} is above max_version {}",
            min.as_str(),
            max.as_str()
        );
    }
    let provider = Arc::new(provider(t, min, max, http2, warnings)?);
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [TlsVersion::Tls13, TlsVersion::Tls12]
            .into_iter()
            .filter(|v| (min..=max).contains(v))
            .map(TlsVersion::rustls)
            .collect();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .context("tls_server_config: min_version/max_version and cipher_suites")?;
    let builder = if policy == ClientAuth::NoClientCert {
        builder.with_no_client_auth()
    } else {
        let verifier = ClientCerts::new(policy, cas, t.client_allowed_sans.clone(), &provider)
            .context("tls_server_config.client_ca_file")?;
        builder.with_client_cert_verifier(Arc::new(verifier))
    };
    let mut config = builder.with_single_cert(certs, key).with_context(|| {
        format!("tls_server_config: {cert_what} and {key_what} do not form a usable pair")
    })?;
    // Go's `PreferServerCipherSuites`, true unless the file says false: the
    // server's order (that of `cipher_suites`) rather than the client's.
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    Ok(Built {
        config,
        min_version: min,
        client_auth: policy,
    })
}

fn unreachable_missing<T>() -> anyhow::Result<T> {
    Err(anyhow!("tls_server_config: certificate or key missing"))
}

/// The client CA certificates (`client_ca_file`, else inline `client_ca`),
/// or None when neither is set.
fn client_cas(
    t: &TlsFile,
    dir: &Path,
    policy: ClientAuth,
) -> anyhow::Result<Option<Vec<CertificateDer<'static>>>> {
    let file = t.client_ca_file.as_deref().filter(|s| !s.is_empty());
    let inline = t.client_ca.as_deref().filter(|s| !s.is_empty());
    if (file.is_some() || inline.is_some()) && policy == ClientAuth::NoClientCert {
        bail!(
            "tls_server_config: a client CA is configured without a client auth policy: \
             client_auth_type is NoClientCert (the default), so the CA would never be used; set \
             client_auth_type (RequireAndVerifyClientCert checks every client). exporter-toolkit \
             refuses this too"
        );
    }
    let (pem, what) = match (file, inline) {
        (Some(f), _) => {
            let p = dir.join(f);
            let what = format!("tls_server_config.client_ca_file {}", p.display());
            let pem = crate::input::read(&p, crate::input::Kind::CaCertificates)
                .with_context(|| format!("{what}: cannot read"))?;
            (pem, what)
        }
        (None, Some(text)) => (
            text.as_bytes().to_vec(),
            "tls_server_config.client_ca".to_string(),
        ),
        (None, None) => return Ok(None),
    };
    // Go's AppendCertsFromPEM skips what it cannot parse; a file with no
    // certificate at all is refused here, since no client could ever be
    // verified against it.
    let certs = parse_certs(&pem, &what)?;
    Ok(Some(certs))
}

/// The crypto provider: ring's, with the file's cipher suites and curves.
fn provider(
    t: &TlsFile,
    min: TlsVersion,
    max: TlsVersion,
    http2: bool,
    warnings: &mut Vec<String>,
) -> anyhow::Result<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !t.cipher_suites.is_empty() {
        let mut tls12: Vec<SupportedCipherSuite> = Vec::new();
        let mut missing = Vec::new();
        for c in &t.cipher_suites {
            match c.suite() {
                Suite::Tls12(s) if !tls12.contains(&s) => tls12.push(s),
                Suite::Tls12(_) | Suite::Tls13 => {}
                Suite::Missing => missing.push(c.0),
            }
        }
        if !missing.is_empty() {
            warnings.push(format!(
                "tls_server_config.cipher_suites: {} (CBC with SHA-1) are not implemented by \
                 rustls and are left out",
                missing.join(", ")
            ));
        }
        if tls12.is_empty() && min == TlsVersion::Tls12 {
            if max == TlsVersion::Tls12 {
                bail!(
                    "tls_server_config.cipher_suites: none of the TLS 1.2 suites listed is \
                     implemented by rustls, and max_version is TLS12: no client could connect; \
                     add an AES-GCM or ChaCha20-Poly1305 suite such as {CIPHER_EXAMPLE}"
                );
            }
            warnings.push(
                "tls_server_config.cipher_suites: no TLS 1.2 suite is left, so only TLS 1.3 \
                 clients can connect"
                    .to_string(),
            );
        }
        // Go's HTTP/2 server refuses to start on a TLS 1.2 suite list
        // without one of the suites HTTP/2 requires (RFC 7540 §9.2.2), and
        // exporter-toolkit serves HTTP/2 unless `http2: false`. This
        // exporter serves HTTP/1.1 only, but refuses the same file, so that
        // one file means the same to it and to the toolkit's exporters.
        if http2
            && min < TlsVersion::Tls13
            && !t
                .cipher_suites
                .iter()
                .any(|c| HTTP2_REQUIRED.contains(&c.0))
        {
            bail!(
                "tls_server_config.cipher_suites: with http_server_config.http2 true (the \
                 toolkit's default) the list needs {} or {}, which Go's HTTP/2 server requires \
                 (exporter-toolkit refuses to start without one); add one, or set \
                 http_server_config.http2: false",
                HTTP2_REQUIRED[0],
                HTTP2_REQUIRED[1]
            );
        }
        // TLS 1.3 suites first, in rustls's order, as they are not chosen
        // by the file; then the TLS 1.2 suites in the file's order.
        provider
            .cipher_suites
            .retain(|s| matches!(s, SupportedCipherSuite::Tls13(_)));
        provider.cipher_suites.extend(tls12);
    }
    if !t.curve_preferences.is_empty() {
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for c in &t.curve_preferences {
            let g = c.group();
            if !groups.iter().any(|x| x.name() == g.name()) {
                groups.push(g);
            }
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let what = format!("tls_server_config.cert_file {}", path.display());
    // Read first so that a missing or unreadable file gets the plain OS error
    // (which names no content).
    let pem = crate::input::read(path, crate::input::Kind::Certificate)
        .with_context(|| format!("{what}: cannot read"))?;
    parse_certs(&pem, &what)
}

fn parse_certs(pem: &[u8], what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{what}: not PEM certificates ({})", pem_reason(&e)))?;
    if certs.is_empty() {
        bail!("{what}: no PEM certificate in it");
    }
    Ok(certs)
}

pub(super) fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let what = format!("tls_server_config.key_file {}", path.display());
    let pem = crate::input::read(path, crate::input::Kind::PrivateKey)
        .with_context(|| format!("{what}: cannot read"))?;
    parse_key(&pem, &what)
}

fn parse_key(pem: &[u8], what: &str) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| {
        anyhow!(
            "{what}: no usable PEM private key (PKCS#8, PKCS#1 or SEC1) in it ({})",
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
