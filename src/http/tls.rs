//! A TLS listener for `axum::serve`. Handshakes run in their own tasks, off
//! the accept loop, so one client that connects and never speaks cannot hold
//! up everyone else's scrape; a handshake that takes too long is dropped.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Long enough for a client across a slow WAN, short enough that idle
/// half-open connections do not pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

#[derive(Debug)]
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    /// `local` is the address `listener` is bound to, read by the caller
    /// before it started anything that would need cleaning up on an error.
    /// `config` is watched: a reload sends a new certificate or settings,
    /// and every handshake after it uses them (connections already open
    /// keep theirs).
    pub fn new(
        listener: TcpListener,
        local: SocketAddr,
        config: watch::Receiver<Arc<rustls::ServerConfig>>,
    ) -> Self {
        // Small: connections wait here only while the server is between two
        // accepts.
        let (tx, ready) = mpsc::channel(32);
        let accepting = tokio::spawn(accept_loop(listener, config, tx));
        TlsListener {
            ready,
            local,
            accepting,
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        // Closes the socket once the server is done with the listener.
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop only ends when aborted, i.e. when this listener
            // is dropped; until then there is nothing to hand out.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

async fn accept_loop(
    listener: TcpListener,
    config: watch::Receiver<Arc<rustls::ServerConfig>>,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // As axum does for plain TCP: errors such as EMFILE are
                // transient, and a tight retry loop would only burn CPU.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let acceptor = TlsAcceptor::from(config.borrow().clone());
        let tx = tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&acceptor, tcp)).await {
                Ok(Ok(Some(tls))) => {
                    // Fails only when the server has stopped accepting.
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Ok(None)) => {}
                // Debug only: scanners and misconfigured clients would
                // otherwise fill the log; errors carry no secrets.
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// Completes the handshake, or answers a plain-HTTP request with a 400 the
/// way Go's servers do (so `curl http://` says what is wrong instead of
/// printing garbage) and returns None.
async fn handshake(
    acceptor: &TlsAcceptor,
    mut tcp: TcpStream,
) -> io::Result<Option<TlsStream<TcpStream>>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 {
        return Ok(None);
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        if first[0].is_ascii_uppercase() {
            // Read what was sent, so that closing does not reset the
            // connection before the client reads the answer.
            let mut sink = [0u8; 4096];
            let _ = tcp.read(&mut sink).await;
            tcp.write_all(
                b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n\
                  Client sent an HTTP request to an HTTPS server.\n",
            )
            .await?;
            tcp.shutdown().await?;
        }
        return Ok(None);
    }
    acceptor.accept(tcp).await.map(Some)
}
