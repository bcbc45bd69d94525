//! The TLS handshake of a connection on a TLS port. It runs in the
//! connection's own task (`serve.rs`), under the same rules as a request
//! head: it must complete within the header timeout of the accept, and a
//! connection still in its handshake gives way to a newcomer at the cap, so
//! clients that connect and never finish a handshake cannot hold the port.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::http::watched::Watched;

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Completes the handshake, or answers a plain-HTTP request with a 400 the
/// way Go's servers do (so `curl http://` says what is wrong instead of
/// printing garbage) and returns None.
pub(crate) async fn handshake(
    acceptor: &TlsAcceptor,
    mut tcp: Watched,
) -> io::Result<Option<TlsStream<Watched>>> {
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
