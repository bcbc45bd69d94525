//! The startup message as libpq would send it, where tokio-postgres cannot:
//! its `Config` holds the user, database, options and application name as
//! Rust strings (so UTF-8), and it has no `replication` setting.
//!
//! The connection is made by tokio-postgres as usual, with UTF-8 stand-ins
//! in its `Config`; [`Rewrite`] sits between it and the stream it writes to
//! and, in the first protocol 3.0 StartupMessage that passes, sets each
//! parameter of the target's list to its bytes (adding the ones missing)
//! and fixes the message's length. Everything else passes untouched: an
//! SSLRequest or GSSENCRequest before it, the TLS records after one, and
//! every byte after the startup message. This keeps the protocol code
//! (authentication, SCRAM, the message loop) tokio-postgres's own, rather
//! than a fork of its startup for a few bytes. The password is no startup
//! parameter; the driver takes it as bytes already.
//!
//! The startup message travels inside TLS when TLS is negotiated, so the
//! wrapper goes on the socket (for a plain connection, or `sslmode`
//! prefer/allow falling back to one) and on the TLS stream ([`RewriteTls`]);
//! under TLS the socket's wrapper sees the SSLRequest, then a TLS record,
//! and stops looking.
//!
//! One limit: tokio-postgres computes an md5 password answer from its own
//! user name, the stand-in, so a user name that is not UTF-8 can log in by
//! SCRAM, trust, peer or a certificate, not by md5 (which PostgreSQL
//! deprecates).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

/// The parameters to set, by the protocol's names.
pub(crate) type Params = Arc<[(&'static str, Vec<u8>)]>;

/// Protocol 3.0's StartupMessage code.
const STARTUP_V3: u32 = 196_608;
/// SSLRequest and GSSENCRequest: 8 bytes, answered by one byte.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
/// The server refuses a longer startup packet (`MAX_STARTUP_PACKET_LENGTH`).
const MAX_STARTUP: usize = 10_000;

/// The startup message `msg` (whole, its length first) with `params` set:
/// a parameter it has takes the new value in place, one it lacks is added
/// before the final NUL. None when `msg` is not a well-formed one.
fn rewrite(msg: &[u8], params: &[(&'static str, Vec<u8>)]) -> Option<Vec<u8>> {
    let body = msg.get(8..)?;
    let mut pairs: Vec<(&[u8], &[u8])> = Vec::new();
    let mut rest = body;
    loop {
        let end = rest.iter().position(|&b| b == 0)?;
        if end == 0 {
            break;
        }
        let key = &rest[..end];
        rest = &rest[end + 1..];
        let vend = rest.iter().position(|&b| b == 0)?;
        pairs.push((key, &rest[..vend]));
        rest = &rest[vend + 1..];
    }
    let mut out = Vec::with_capacity(msg.len() + 64);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&STARTUP_V3.to_be_bytes());
    let mut put = |k: &[u8], v: &[u8]| {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    };
    for (k, v) in &pairs {
        match params.iter().find(|(name, _)| name.as_bytes() == *k) {
            Some((_, new)) => put(k, new),
            None => put(k, v),
        }
    }
    for (name, v) in params {
        if !pairs.iter().any(|(k, _)| *k == name.as_bytes()) {
            put(name.as_bytes(), v);
        }
    }
    out.push(0);
    let len = u32::try_from(out.len()).ok()?;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Some(out)
}

/// A stream whose first StartupMessage is rewritten (see the module).
pub(crate) struct Rewrite<S> {
    inner: S,
    params: Params,
    /// Still looking for the startup message.
    scanning: bool,
    /// Bytes written to us while scanning, not yet judged.
    held: Vec<u8>,
    /// Judged bytes not yet written to `inner`.
    out: Vec<u8>,
}

impl<S> Rewrite<S> {
    pub(crate) fn new(inner: S, params: Params) -> Self {
        Rewrite {
            inner,
            params,
            scanning: true,
            held: Vec::new(),
            out: Vec::new(),
        }
    }

    /// Moves what can be judged from `held` to `out`.
    fn judge(&mut self) {
        while self.scanning && self.held.len() >= 8 {
            let word = |i: usize| {
                u32::from_be_bytes([
                    self.held[i],
                    self.held[i + 1],
                    self.held[i + 2],
                    self.held[i + 3],
                ])
            };
            let (len, code) = (word(0) as usize, word(4));
            if len == 8 && (code == SSL_REQUEST || code == GSSENC_REQUEST) {
                self.out.extend(self.held.drain(..8));
                continue;
            }
            if code == STARTUP_V3 && (8..=MAX_STARTUP).contains(&len) {
                if self.held.len() < len {
                    return;
                }
                let msg: Vec<u8> = self.held.drain(..len).collect();
                let new = rewrite(&msg, &self.params).unwrap_or(msg);
                self.out.extend_from_slice(&new);
            }
            // Anything else (a TLS record after an SSLRequest, a message
            // after the startup one) is not ours to touch.
            self.scanning = false;
        }
        if !self.scanning {
            self.out.append(&mut self.held);
        }
    }
}

impl<S: AsyncWrite + Unpin> Rewrite<S> {
    /// Writes `out` to `inner`.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Rewrite<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // tokio-postgres writes its SSLRequest without a flush (a socket
        // needs none) and waits for the answer: what is judged goes out
        // before any read.
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewrite<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        if !this.scanning {
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        // Taken whole: a message split over writes is judged once all of
        // it is here, and written out at the next write or flush.
        this.held.extend_from_slice(data);
        this.judge();
        // Out at once where the socket takes it; the rest at the next
        // write, flush or read.
        if let Poll::Ready(Err(e)) = this.drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A message still held is incomplete: it goes out as it is.
        this.out.append(&mut this.held);
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: TlsStream + Unpin> TlsStream for Rewrite<S> {
    fn channel_binding(&self) -> ChannelBinding {
        self.inner.channel_binding()
    }
}

/// A `TlsConnect` whose stream is wrapped in [`Rewrite`], for the startup
/// message that follows the TLS handshake.
pub(crate) struct RewriteTls<T> {
    pub(crate) inner: T,
    pub(crate) params: Params,
}

impl<S, T> TlsConnect<S> for RewriteTls<T>
where
    T: TlsConnect<S>,
    T::Future: Unpin,
{
    type Stream = Rewrite<T::Stream>;
    type Error = T::Error;
    type Future = Handshake<T::Future>;

    fn connect(self, stream: S) -> Self::Future {
        Handshake {
            inner: self.inner.connect(stream),
            params: Some(self.params),
        }
    }
}

/// The TLS handshake of [`RewriteTls`], its stream wrapped once done.
pub(crate) struct Handshake<F> {
    inner: F,
    params: Option<Params>,
}

impl<F, St, E> Future for Handshake<F>
where
    F: Future<Output = Result<St, E>> + Unpin,
{
    type Output = Result<Rewrite<St>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let stream = ready!(Pin::new(&mut this.inner).poll(cx))?;
        let params = this.params.take().unwrap_or_else(|| Arc::from([]));
        Poll::Ready(Ok(Rewrite::new(stream, params)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A startup message as tokio-postgres writes it.
    fn startup(pairs: &[(&str, &[u8])]) -> Vec<u8> {
        let mut m = vec![0, 0, 0, 0];
        m.extend_from_slice(&STARTUP_V3.to_be_bytes());
        for (k, v) in pairs {
            m.extend_from_slice(k.as_bytes());
            m.push(0);
            m.extend_from_slice(v);
            m.push(0);
        }
        m.push(0);
        let len = u32::try_from(m.len()).unwrap().to_be_bytes();
        m[..4].copy_from_slice(&len);
        m
    }

    fn params(p: &[(&'static str, &[u8])]) -> Params {
        p.iter().map(|(k, v)| (*k, v.to_vec())).collect()
    }

    /// What arrives at the other end of a pipe when `chunks` are written
    /// one write each, with a flush at the end.
    async fn through(p: Params, chunks: &[&[u8]]) -> Vec<u8> {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let mut w = Rewrite::new(a, p);
        for c in chunks {
            w.write_all(c).await.unwrap();
        }
        w.flush().await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn the_startup_message_gets_the_bytes_whole_or_split() {
        let msg = startup(&[
            ("client_encoding", b"UTF8"),
            ("user", b"mon\xef\xbf\xbd"),
            ("database", b"caf\xef\xbf\xbd"),
        ]);
        let p = params(&[
            ("user", b"mon\xe9"),
            ("database", b"caf\xe9"),
            ("replication", b"database"),
        ]);
        let mut want = Vec::new();
        want.extend_from_slice(&[0, 0, 0, 0]);
        want.extend_from_slice(&STARTUP_V3.to_be_bytes());
        want.extend_from_slice(
            b"client_encoding\0UTF8\0user\0mon\xe9\0database\0caf\xe9\0replication\0database\0\0",
        );
        let len = u32::try_from(want.len()).unwrap().to_be_bytes();
        want[..4].copy_from_slice(&len);
        let after = b"Q\0\0\0\x0dSELECT 1\0";
        let mut whole = want.clone();
        whole.extend_from_slice(after);
        assert_eq!(through(p.clone(), &[&msg, after]).await, whole);
        // A byte at a time: held until the whole message is there.
        let bytes: Vec<&[u8]> = msg.chunks(1).chain([&after[..]]).collect();
        assert_eq!(through(p.clone(), &bytes).await, whole);
        // After an SSLRequest the server declined: the same.
        let ssl = [0, 0, 0, 8, 4, 210, 22, 47];
        let mut with_ssl = ssl.to_vec();
        with_ssl.extend_from_slice(&whole);
        assert_eq!(through(p.clone(), &[&ssl, &msg, after]).await, with_ssl);
    }

    #[tokio::test]
    async fn tls_records_after_an_ssl_request_pass_untouched() {
        let p = params(&[("database", b"caf\xe9")]);
        let ssl = [0, 0, 0, 8, 4, 210, 22, 47];
        // A ClientHello's record header, then a startup message that would
        // be inside TLS: neither is looked at.
        let hello = [0x16, 0x03, 0x01, 0x00, 0x40, 0x01, 0x00, 0x00, 0x3c, 0x03];
        let msg = startup(&[("database", b"x")]);
        let got = through(p, &[&ssl, &hello[..3], &hello[3..], &msg]).await;
        let mut want = ssl.to_vec();
        want.extend_from_slice(&hello);
        want.extend_from_slice(&msg);
        assert_eq!(got, want);
    }

    /// tokio-postgres writes its SSLRequest without a flush and waits
    /// for the server's one-byte answer.
    #[tokio::test]
    async fn an_ssl_request_goes_out_without_a_flush() {
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = Rewrite::new(a, params(&[("database", b"x")]));
        let ssl = [0, 0, 0, 8, 4, 210, 22, 47];
        w.write_all(&ssl).await.unwrap();
        let server = async {
            let mut got = [0u8; 8];
            b.read_exact(&mut got).await.unwrap();
            b.write_all(b"N").await.unwrap();
            got
        };
        let client = async {
            let mut answer = [0u8; 1];
            w.read_exact(&mut answer).await.unwrap();
            answer
        };
        let (got, answer) = tokio::join!(server, client);
        assert_eq!(got, ssl);
        assert_eq!(&answer, b"N");
    }

    #[test]
    fn only_a_well_formed_message_is_rewritten() {
        let p = params(&[("user", b"\xff")]);
        assert!(rewrite(&[0, 0, 0, 9, 0, 3, 0, 0, b'u'], &p).is_none());
        let msg = startup(&[("user", b"a")]);
        let new = rewrite(&msg, &p).unwrap();
        assert_eq!(&new[8..], b"user\0\xff\0\0");
        assert_eq!(new[..4], 16u32.to_be_bytes());
    }
}
