//! Connecting, with TLS when the DSN's `sslmode` asks for it, following
//! libpq's meaning of each mode:
//!
//! | sslmode        | encrypted            | server certificate checked            |
//! |----------------|----------------------|---------------------------------------|
//! | disable        | no                   | -                                     |
//! | allow, prefer  | if the server offers | no                                    |
//! | require        | yes                  | no (against `sslrootcert` if given)   |
//! | verify-ca      | yes                  | chain against `sslrootcert`           |
//! | verify-full    | yes                  | chain and host name                   |
//!
//! `sslrootcert` defaults to `~/.postgresql/root.crt` as in libpq;
//! `sslrootcert=system` uses the operating system's trust store.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use thiserror::Error;
use tokio_postgres::Client;

use super::dsn::{SslMode, Target};

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("{}", describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("TLS setup: {0}")]
    Tls(String),
}

/// tokio-postgres prints a server error as just "db error"; the server's
/// message (password authentication failed, database does not exist, ...)
/// is what an operator needs. It never contains the password.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any certificate, as libpq does for sslmode allow/prefer/require:
/// encryption against passive listeners, no protection against an active
/// man in the middle. Signatures are still checked.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// verify-ca: the chain must lead to a trusted root; the host name is not
/// compared (libpq's verify-ca).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end: &CertificateDer<'_>,
        inter: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end, inter, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(m, c, d)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(m, c, d)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

fn roots(path: Option<&PathBuf>, required: bool) -> Result<Option<RootCertStore>, ConnectError> {
    let mut store = RootCertStore::empty();
    if path.is_some_and(|p| p.as_os_str() == "system") {
        let found = rustls_native_certs::load_native_certs();
        for c in found.certs {
            let _ = store.add(c);
        }
        return Ok(Some(store));
    }
    let default = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql/root.crt"));
    let Some(file) = path.cloned().or(default) else {
        return if required {
            Err(ConnectError::Tls(
                "no sslrootcert given and no home directory for ~/.postgresql/root.crt".into(),
            ))
        } else {
            Ok(None)
        };
    };
    if !file.exists() {
        return if required || path.is_some() {
            Err(ConnectError::Tls(format!(
                "root certificate file {} does not exist (sslrootcert)",
                file.display()
            )))
        } else {
            Ok(None)
        };
    }
    let certs = CertificateDer::pem_file_iter(&file)
        .map_err(|e| ConnectError::Tls(format!("{}: {e}", file.display())))?;
    for c in certs {
        let c = c.map_err(|e| ConnectError::Tls(format!("{}: {e}", file.display())))?;
        store
            .add(c)
            .map_err(|e| ConnectError::Tls(format!("{}: {e}", file.display())))?;
    }
    Ok(Some(store))
}

fn client_config(t: &Target) -> Result<rustls::ClientConfig, ConnectError> {
    let p = provider();
    let builder = rustls::ClientConfig::builder_with_provider(p.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConnectError::Tls(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match t.ssl_mode {
        SslMode::VerifyCa | SslMode::VerifyFull | SslMode::Require => {
            let required = t.ssl_mode != SslMode::Require;
            match roots(t.ssl_root_cert.as_ref(), required)? {
                Some(store) => {
                    let v = WebPkiServerVerifier::builder_with_provider(Arc::new(store), p.clone())
                        .build()
                        .map_err(|e| ConnectError::Tls(e.to_string()))?;
                    if t.ssl_mode == SslMode::VerifyFull {
                        v
                    } else {
                        Arc::new(ChainOnly(v))
                    }
                }
                None => Arc::new(NoVerify(p)),
            }
        }
        _ => Arc::new(NoVerify(p)),
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// A connected client and the task that drives its socket. Dropping it
/// aborts the task, which closes the socket: tokio-postgres keeps the task
/// (and the socket) alive for as long as a reply is owed, so a query
/// abandoned at the client deadline on a server that stopped answering
/// would otherwise keep its connection open for good.
pub struct Connection {
    pub client: Client,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("closed", &self.client.is_closed())
            .finish()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connects and spawns the connection's IO task; the task ends when the
/// server goes away, after which every query on the client fails "closed".
///
/// tokio-postgres's `connect_timeout` bounds only the TCP (or Unix socket)
/// connect of each host, not the TLS handshake, authentication and
/// start-up that follow: the caller puts a deadline around the whole call.
pub async fn connect(t: &Target) -> Result<Connection, ConnectError> {
    // Like libpq, TLS is never used over a Unix-domain socket: the kernel
    // already keeps that traffic on this host.
    if t.ssl_mode == SslMode::Disable || t.sockets_only() {
        let (client, conn) = t.config.connect(tokio_postgres::NoTls).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        return Ok(Connection { client, task });
    }
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(t)?);
    let (client, conn) = t.config.connect(tls).await?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Connection { client, task })
}
