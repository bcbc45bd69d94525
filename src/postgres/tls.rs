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

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use thiserror::Error;
use tokio_postgres::Client;
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::tls::MakeTlsConnect;

use super::dsn::{ServerType, SslMode, Target, driver_ssl_mode, is_socket};
use super::startup::{Params, Rewrite, RewriteTls};

#[derive(Debug, Error)]
pub(crate) enum ConnectError {
    #[error("{}", describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("TLS setup: {0}")]
    Tls(String),
    /// A Unix-domain socket could not be reached: the message names the
    /// socket file(s) tried, which the driver's "No such file or directory"
    /// does not.
    #[error("{message}")]
    Socket {
        message: String,
        /// None when the exporter opened the socket itself.
        source: Option<tokio_postgres::Error>,
    },
    /// A host of a connection the exporter opened itself (see
    /// `connect_own`) could not be reached, or was not of the
    /// `target_session_attrs` read-write or read-only asked for.
    #[error("{0}")]
    Host(String),
    /// `target_session_attrs` primary, standby or prefer-standby and no
    /// host was of that type: what each host answered. `source`: the last
    /// driver error, when no host was reached at all.
    #[error("{message}")]
    ServerType {
        message: String,
        source: Option<tokio_postgres::Error>,
    },
}

/// The socket file libpq and PostgreSQL use for a directory and port. An
/// abstract name (`@name`) is kept as it is written, as both write it
/// (`@name/` is another name than `@name`).
fn socket_file(dir: &str, port: u16) -> String {
    let dir = if dir.starts_with('@') {
        dir
    } else {
        dir.trim_end_matches('/')
    };
    format!("{dir}/.s.PGSQL.{port}")
}

/// Turns a failed connect to Unix-domain socket(s) into a message naming the
/// socket file(s) tried and what to check; any other error is kept as it is.
pub(crate) fn socket_error(t: &Target, e: tokio_postgres::Error) -> ConnectError {
    if !t.sockets_only() || t.hosts.is_empty() || e.as_db_error().is_some() {
        return ConnectError::Postgres(e);
    }
    let mut io = None;
    let mut src = std::error::Error::source(&e);
    while let Some(inner) = src {
        if let Some(i) = inner.downcast_ref::<std::io::Error>() {
            io = Some(i);
            break;
        }
        src = inner.source();
    }
    let Some(io) = io else {
        return ConnectError::Postgres(e);
    };
    ConnectError::Socket {
        message: socket_message(t, io),
        source: Some(e),
    }
}

/// What a failed connect to the Unix-domain socket(s) of `t` means.
fn socket_message(t: &Target, io: &io::Error) -> String {
    match t.hosts.as_slice() {
        [(dir, port)] => {
            let file = socket_file(dir, *port);
            match io.kind() {
                std::io::ErrorKind::NotFound => {
                    format!("{file}: no such socket; is PostgreSQL listening on port {port} there?")
                }
                // An abstract name is no file: nobody listening on it is
                // all a refusal can mean.
                std::io::ErrorKind::ConnectionRefused if dir.starts_with('@') => {
                    format!("{file}: no such socket; is PostgreSQL listening on port {port} there?")
                }
                std::io::ErrorKind::ConnectionRefused => format!(
                    "{file}: connection refused; the socket file is there but no server \
                     accepts on it (is PostgreSQL running?)"
                ),
                std::io::ErrorKind::PermissionDenied => format!(
                    "{file}: permission denied; the exporter's user may not reach the socket \
                     (directory or socket permissions)"
                ),
                _ => format!("{file}: {io}"),
            }
        }
        many => {
            let files: Vec<String> = many.iter().map(|(d, p)| socket_file(d, *p)).collect();
            format!(
                "no PostgreSQL socket answered; tried {} (last: {io})",
                files.join(", ")
            )
        }
    }
}

/// tokio-postgres prints a server error as just "db error"; the server's
/// message (password authentication failed, database does not exist, ...)
/// is what an operator needs. It never contains the password.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
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
    // Read through the bounded reader: this runs on an async worker at
    // each connection attempt, where a FIFO named by mistake must not
    // block it.
    let pem = crate::input::read(&file, crate::input::Kind::CaCertificates)
        .map_err(|e| ConnectError::Tls(format!("{} (sslrootcert): {e}", file.display())))?;
    for c in CertificateDer::pem_slice_iter(&pem) {
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
pub(crate) struct Connection {
    pub(crate) client: Client,
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
pub(crate) async fn connect(t: &Target) -> Result<Connection, ConnectError> {
    match t.server_type {
        None => connect_any(t).await.map(|(c, _)| c),
        Some(want) => connect_server_type(t, want).await,
    }
}

/// Connects to the first host that answers, with the server's
/// `in_hot_standby` (reported at start-up by PostgreSQL 14 and later).
async fn connect_any(t: &Target) -> Result<(Connection, Option<bool>), ConnectError> {
    if t.needs_own_connect() {
        return connect_own(t).await;
    }
    // Like libpq, TLS is never used over a Unix-domain socket: the kernel
    // already keeps that traffic on this host.
    if t.ssl_mode == SslMode::Disable || t.sockets_only() {
        let (client, conn) = t
            .config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| socket_error(t, e))?;
        return Ok(spawn(client, conn));
    }
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(t)?);
    let (client, conn) = t.config.connect(tls).await?;
    Ok(spawn(client, conn))
}

fn spawn<S, T>(client: Client, conn: tokio_postgres::Connection<S, T>) -> (Connection, Option<bool>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let standby = conn.parameter("in_hot_standby").map(|v| v == "on");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (Connection { client, task }, standby)
}

/// Whether the server is in hot standby: the `in_hot_standby` it reported
/// at start-up, else (a server that does not report it) what libpq asks
/// then, `pg_is_in_recovery()`. A walsender (`replication=database`)
/// takes the simple query protocol only.
async fn in_hot_standby(
    c: &Connection,
    reported: Option<bool>,
    simple: bool,
) -> Result<bool, ConnectError> {
    if let Some(s) = reported {
        return Ok(s);
    }
    const SQL: &str = "SELECT pg_catalog.pg_is_in_recovery()";
    if simple {
        let rows = simple_query(&c.client, SQL).await?;
        return Ok(first_value(&rows).as_deref() == Some("t"));
    }
    let row = c.client.query_one(SQL, &[]).await?;
    Ok(row.try_get(0)?)
}

/// `Client::simple_query`, boxed as a `Send` future: the driver's own
/// future, awaited inside the collector's spawned task, trips the
/// compiler's higher-ranked `Send` check ("not general enough").
fn simple_query<'a>(
    client: &'a Client,
    sql: &'a str,
) -> std::pin::Pin<
    Box<
        dyn Future<Output = Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error>>
            + Send
            + 'a,
    >,
> {
    Box::pin(client.simple_query(sql))
}

/// The first column of the first row of a simple query's answer.
fn first_value(messages: &[tokio_postgres::SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

/// A socket the exporter opened itself.
enum Opened {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

/// Opens the socket of one host as libpq would: a Unix-domain socket in a
/// directory, or in Linux's abstract namespace for `@name` (the address
/// is `name/.s.PGSQL.<port>` after a NUL byte, where the server listens
/// with `unix_socket_directories = '@name'`); else TCP as tokio-postgres
/// does it (each address of the name in turn, no Nagle delay, its
/// keepalives).
async fn open(host: &str, port: u16, c: &tokio_postgres::Config) -> io::Result<Opened> {
    use std::os::unix::ffi::OsStrExt;
    if host.starts_with('@') {
        // tokio connects to the abstract address for a path that starts
        // with a NUL byte, without blocking.
        let mut path = socket_file(host, port).into_bytes();
        path[0] = 0;
        let path = std::ffi::OsStr::from_bytes(&path);
        return Ok(Opened::Unix(tokio::net::UnixStream::connect(path).await?));
    }
    if host.starts_with('/') {
        let path = socket_file(host, port);
        return Ok(Opened::Unix(tokio::net::UnixStream::connect(path).await?));
    }
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => {
                s.set_nodelay(true)?;
                if c.get_keepalives() {
                    let ka = socket2::TcpKeepalive::new().with_time(c.get_keepalives_idle());
                    socket2::SockRef::from(&s).set_tcp_keepalive(&ka)?;
                }
                return Ok(Opened::Tcp(s));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
}

/// Why one host of [`connect_own`] failed.
enum HostError {
    /// Its socket could not be opened.
    Open(io::Error),
    Connect(ConnectError),
}

impl From<ConnectError> for HostError {
    fn from(e: ConnectError) -> Self {
        HostError::Connect(e)
    }
}

impl From<tokio_postgres::Error> for HostError {
    fn from(e: tokio_postgres::Error) -> Self {
        HostError::Connect(ConnectError::Postgres(e))
    }
}

/// Connects through a socket the exporter opens itself, for what
/// tokio-postgres cannot do alone: an abstract socket, or a startup
/// message with bytes it cannot hold (see `startup`). The hosts are
/// tried in turn as libpq does, each within connect_timeout (libpq's
/// per-host meaning), each with its TLS rule, with read-write and
/// read-only checked as tokio-postgres checks them.
async fn connect_own(t: &Target) -> Result<(Connection, Option<bool>), ConnectError> {
    let params: Params = t.startup.clone().into();
    let per_host = t.config.get_connect_timeout().copied();
    let mut last = None;
    for (host, port) in &t.hosts {
        let attempt = connect_host(t, host, *port, &params);
        let outcome = match per_host {
            Some(d) => tokio::time::timeout(d, attempt).await.unwrap_or_else(|_| {
                Err(HostError::Open(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {d:?} (connect_timeout)"),
                )))
            }),
            None => attempt.await,
        };
        match outcome {
            Ok(c) => return Ok(c),
            Err(e) => last = Some((host, *port, e)),
        }
    }
    Err(match last {
        None => ConnectError::Host("no host to connect to".into()),
        Some((_, _, HostError::Open(io))) if t.sockets_only() => ConnectError::Socket {
            message: socket_message(t, &io),
            source: None,
        },
        Some((host, port, HostError::Open(io))) => ConnectError::Host(format!(
            "{host} port {port}: error connecting to server: {io}"
        )),
        Some((_, _, HostError::Connect(e))) => e,
    })
}

/// One host of [`connect_own`].
async fn connect_host(
    t: &Target,
    host: &str,
    port: u16,
    params: &Params,
) -> Result<(Connection, Option<bool>), HostError> {
    let opened = open(host, port, &t.config).await.map_err(HostError::Open)?;
    let mut config = t.config.clone();
    // Like libpq, TLS is never used over a Unix-domain socket.
    let mode = driver_ssl_mode(t.ssl_mode, is_socket(host));
    config.ssl_mode(mode);
    let (conn, reported) = match opened {
        Opened::Unix(s) => {
            let s = Rewrite::new(s, params.clone());
            let (client, conn) = config.connect_raw(s, tokio_postgres::NoTls).await?;
            spawn(client, conn)
        }
        Opened::Tcp(s) if mode == tokio_postgres::config::SslMode::Disable => {
            let s = Rewrite::new(s, params.clone());
            let (client, conn) = config.connect_raw(s, tokio_postgres::NoTls).await?;
            spawn(client, conn)
        }
        Opened::Tcp(s) => {
            let s = Rewrite::new(s, params.clone());
            let mut make = tokio_postgres_rustls::MakeRustlsConnect::new(client_config(t)?);
            let tls = match MakeTlsConnect::<Rewrite<tokio::net::TcpStream>>::make_tls_connect(
                &mut make, host,
            ) {
                Ok(tls) => tls,
                Err(never) => match never {},
            };
            let tls = RewriteTls {
                inner: tls,
                params: params.clone(),
            };
            let (client, conn) = config.connect_raw(s, tls).await?;
            spawn(client, conn)
        }
    };
    // What tokio-postgres's own connect checks for these two values.
    let want_read_only = match config.get_target_session_attrs() {
        TargetSessionAttrs::ReadWrite => Some(false),
        TargetSessionAttrs::ReadOnly => Some(true),
        _ => None,
    };
    if let Some(want) = want_read_only {
        let rows = simple_query(&conn.client, "SHOW transaction_read_only").await?;
        let read_only = first_value(&rows).as_deref() == Some("on");
        if read_only != want {
            return Err(HostError::Connect(ConnectError::Host(format!(
                "{host} port {port}: the server is {} (target_session_attrs)",
                if read_only {
                    "read-only"
                } else {
                    "not read-only"
                }
            ))));
        }
    }
    Ok((conn, reported))
}

/// libpq's `target_session_attrs` primary, standby and prefer-standby:
/// each host in turn, each attempt (connection and check) within the
/// host's connect_timeout as in libpq, until one is of the type wanted.
/// prefer-standby makes a second pass over the hosts taking any server
/// when the first found no standby.
async fn connect_server_type(t: &Target, want: ServerType) -> Result<Connection, ConnectError> {
    // Which servers each pass takes: Some(true) standbys, Some(false)
    // primaries, None any.
    let passes: &[Option<bool>] = match want {
        ServerType::Primary => &[Some(false)],
        ServerType::Standby => &[Some(true)],
        ServerType::PreferStandby => &[Some(true), None],
    };
    let per_host = t.config.get_connect_timeout().copied();
    let mut tried = Vec::new();
    let mut wrong_type = false;
    let mut last = None;
    for &pass in passes {
        for i in 0..t.hosts.len() {
            let Some(one) = t.for_host(i) else { continue };
            let (host, port) = &one.hosts[0];
            let attempt = async {
                let (c, reported) = connect_any(&one).await?;
                let standby = in_hot_standby(&c, reported, one.replication).await?;
                Ok::<_, ConnectError>((c, standby))
            };
            let outcome = match per_host {
                Some(d) => match tokio::time::timeout(d, attempt).await {
                    Ok(r) => r.map_err(Some),
                    Err(_) => Err(None),
                },
                None => attempt.await.map_err(Some),
            };
            // A socket's error names its socket file: it says which host.
            let mut named = false;
            let what = match outcome {
                Ok((c, standby)) if pass.is_none_or(|s| s == standby) => return Ok(c),
                Ok((_, standby)) => {
                    wrong_type = true;
                    if standby {
                        "is in hot standby".to_string()
                    } else {
                        "is not in hot standby".to_string()
                    }
                }
                Err(Some(e)) => {
                    named = matches!(e, ConnectError::Socket { .. });
                    let text = e.to_string();
                    last = match e {
                        ConnectError::Postgres(e)
                        | ConnectError::Socket {
                            source: Some(e), ..
                        } => Some(e),
                        _ => last,
                    };
                    text
                }
                Err(None) => format!(
                    "no answer within {:?} (connect_timeout)",
                    per_host.unwrap_or_default()
                ),
            };
            let entry = if named {
                what
            } else {
                format!("{host} port {port}: {what}")
            };
            if !tried.contains(&entry) {
                tried.push(entry);
            }
        }
    }
    let wanted = match want {
        ServerType::Primary => "a primary (a server not in hot standby)",
        ServerType::Standby => "a standby (a server in hot standby)",
        ServerType::PreferStandby => "reachable",
    };
    Err(ConnectError::ServerType {
        message: format!(
            "connection option \"target_session_attrs\" ({}): no host is {wanted}: {}",
            want.as_str(),
            tried.join("; ")
        ),
        source: if wrong_type { None } else { last },
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::postgres::dsn;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[tokio::test]
    async fn wrong_port_over_a_socket_names_the_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let t = dsn::target(
            &format!("host={d} port=5433 user=u dbname=u"),
            &no_env,
            None,
        )
        .unwrap();
        let e = connect(&t).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{d}/.s.PGSQL.5433: no such socket; is PostgreSQL listening on port 5433 there?"
            )
        );
        assert!(matches!(e, ConnectError::Socket { .. }));
        // A socket file left behind by a server that is gone.
        let stale =
            std::os::unix::net::UnixListener::bind(dir.path().join(".s.PGSQL.5434")).unwrap();
        drop(stale);
        let t = dsn::target(&format!("host={d}/ port=5434 user=u"), &no_env, None).unwrap();
        let e = connect(&t).await.unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{d}/.s.PGSQL.5434: connection refused;")),
            "{e}"
        );
        // An abstract name is no file: nobody listening on it is all a
        // refusal can mean. Shown with its `@`, as libpq shows it.
        let name = format!("@pgse-test-{}-none", std::process::id());
        let t = dsn::target(&format!("host={name} port=5433 user=u"), &no_env, None).unwrap();
        let e = connect(&t).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{name}/.s.PGSQL.5433: no such socket; is PostgreSQL listening on port 5433 there?"
            )
        );
        assert!(matches!(e, ConnectError::Socket { source: None, .. }));
        let t = dsn::target(
            &format!("host={name},{d} port=5433,5436 user=u"),
            &no_env,
            None,
        )
        .unwrap();
        let e = connect(&t).await.unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "no PostgreSQL socket answered; tried {name}/.s.PGSQL.5433, {d}/.s.PGSQL.5436 \
                 (last: "
            )),
            "{e}"
        );
        let t = dsn::target(
            &format!("host={d},{d}/x port=5433,5435 user=u"),
            &no_env,
            None,
        )
        .unwrap();
        let e = connect(&t).await.unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "no PostgreSQL socket answered; tried {d}/.s.PGSQL.5433, {d}/x/.s.PGSQL.5435 (last: "
            )),
            "{e}"
        );
    }
}
