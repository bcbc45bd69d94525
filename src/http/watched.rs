//! The accepted socket as hyper and the TLS handshake see it, and the
//! listener's clock that stamps its activity. Its own file because both
//! `serve.rs` (plain connections) and `tls.rs` (handshakes) take it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::http::conns::Conn;

/// Milliseconds since the listener started: the clock of `conns.rs`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(Instant);

impl Clock {
    pub(crate) fn start() -> Clock {
        Clock(Instant::now())
    }

    pub(crate) fn now(self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// When [`Clock::now`] reads `at` (a day from now past what an
    /// `Instant` holds: a deadline that far is no deadline).
    pub(crate) fn instant(self, at: u64) -> Instant {
        let day = std::time::Duration::from_secs(86_400);
        self.0
            .checked_add(std::time::Duration::from_millis(at))
            .unwrap_or_else(|| Instant::now() + day)
    }
}

/// The accepted socket, telling its [`Conn`] when bytes arrive: the first
/// byte after an idle wait starts the next request's header time.
///
/// Until the exporter first writes to it, the socket is closed with a reset
/// (SO_LINGER 0) rather than a FIN: a connection that never got an answer
/// (idle, half a request head or handshake) has nothing to deliver, and an
/// abortive close leaves no TIME_WAIT socket behind; under a flood each
/// eviction would leave one for a minute, and the kernel's table of them
/// overflows. The first write turns the normal close back on, so no
/// answer is ever cut short.
#[derive(Debug)]
pub(crate) struct Watched {
    tcp: TcpStream,
    conn: Arc<Conn>,
    clock: Clock,
    abortive: bool,
}

impl Watched {
    pub(crate) fn new(tcp: TcpStream, conn: Arc<Conn>, clock: Clock) -> Watched {
        let abortive = tcp.set_zero_linger().is_ok();
        Watched {
            tcp,
            conn,
            clock,
            abortive,
        }
    }

    /// Before the first write: back to the normal close, which delivers
    /// what was written before the FIN.
    fn graceful(&mut self) {
        if std::mem::take(&mut self.abortive) {
            // Deprecated only for a nonzero linger, which blocks the thread
            // in close(2); None restores the default, which never does.
            #[allow(deprecated)]
            if let Err(e) = self.tcp.set_linger(None) {
                tracing::debug!(error = %e, "cannot clear SO_LINGER");
            }
        }
    }

    pub(crate) async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.peek(buf).await
    }

    pub(crate) async fn readable(&self) -> io::Result<()> {
        self.tcp.readable().await
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.bytes_arrived(self.clock.now());
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.graceful();
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.graceful();
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
