//! Serving the router on one listener (a `--web.listen-address` or a
//! systemd socket, plain or TLS): the accept loop and one task per
//! connection, which runs the TLS handshake and hyper's HTTP/1 connection
//! under the rules of `conns.rs` (a cap per listener, header and idle
//! deadlines, the connection idle longest giving way to a newcomer).
//!
//! Why not `axum::serve`: it gives hyper no timer, and hyper silently drops
//! its 30-s header timeout without one, so a connection that sent nothing
//! or half a request head stayed open for ever; with its file-descriptor
//! limit at the usual 1,024, a thousand such connections from anyone who
//! could reach the port took the exporter's scrapes, probe-file creation
//! and collectors down with EMFILE. Nor hyper's own `header_read_timeout`
//! with a timer: it starts when the connection begins waiting for a request
//! (at the accept and again at the end of each response) and is not
//! extended by the bytes that arrive, so it is one deadline for idle
//! keep-alive time and header time together; a keep-alive connection kept
//! between Prometheus scrapes needs the first long and the second short.
//!
//! The daemon also sets TCP_DEFER_ACCEPT on each listener, so connections
//! that never send a byte wait in the kernel and never reach this loop
//! (see `sys::set_tcp_defer_accept`); what does reach it, this bounds.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::events::{Incidents, Report};
use crate::exposition::connections::Listener as ListenerMetrics;
use crate::http::conns::{Admission, Closed, Conn, Table};
use crate::http::watched::{Clock, Watched};

/// Long enough for a TLS handshake and a request head across a slow WAN,
/// short enough that connections which never complete one do not pile up.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Twice Prometheus's default scrape interval (1 m): a scraper's keep-alive
/// connection lasts from one scrape to the next, so each scrape need not
/// open a TCP connection (and do a TLS handshake) again.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a stopping listener waits for requests in progress.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The most often a listener's deadlines are checked: one pass over its
/// connections instead of a timer per connection (under a flood each
/// newcomer would set one and cancel another). Otherwise the pass runs at
/// the earliest deadline, so an idle exporter does not wake for nothing,
/// and a connection is closed at its deadline, or at most this much after
/// it while connections keep changing.
const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// Pauses after a failed accept(2), doubling from the first to the last,
/// as Go's net/http does: EMFILE or ENFILE lasts until some descriptor is
/// closed, and retrying at once would spin a CPU; the connection waits in
/// the kernel's queue meanwhile.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(250));

/// The accept queue's length asked of listen(2). Linux caps it at
/// net.core.somaxconn (4,096 by default since 5.4), so this asks for that
/// cap, as Go's net.Listen does. A connection that finds the queue full has
/// its SYN dropped and the client retries only after a second; at the
/// connection cap every accept closes a connection whose client may connect
/// again at once, so a short queue (tokio's 1,024) would fill with those
/// reconnections and delay a scrape by a second or more.
const BACKLOG: u32 = 65_535;

/// Binds `addr` for [`serve`]: SO_REUSEADDR, as tokio and Go set it (a
/// restart can bind while the previous run's connections are in
/// TIME_WAIT), and the longest accept queue the kernel allows.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// What every connection of a listener shares.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) app: Router,
    /// With TLS configured the port speaks only TLS: no plain-HTTP fallback
    /// that a misconfigured scraper could silently use. Watched: a reload
    /// sends a new certificate or settings, used from the next handshake
    /// on (connections already open keep theirs).
    pub(crate) tls: Option<watch::Receiver<Arc<rustls::ServerConfig>>>,
    pub(crate) metrics: ListenerMetrics,
}

/// The peer address of a connection, as `ConnectInfo`, for every listener
/// (plain TCP, systemd's sockets, TLS).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientAddr(pub(crate) SocketAddr);

/// Accepts connections on `listener` (bound to `local`) until `stop` turns
/// true, then waits up to [`SHUTDOWN_GRACE`] for the requests in progress.
/// Never fails: a failed accept is counted, logged once per incident and
/// retried after a short pause.
pub(crate) async fn serve(
    listener: TcpListener,
    local: SocketAddr,
    server: Server,
    table: Arc<Table>,
    mut stop: watch::Receiver<bool>,
) {
    let server = Arc::new(server);
    let clock = Clock::start();
    let sweeper = spawn_sweeper(table.clone(), clock);
    let mut at_cap_logged = false;
    let mut failures = AcceptFailures::new();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            r = async {
                table.room().await;
                listener.accept().await
            } => r,
        };
        let (tcp, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                if !failures.failed(&e, &server, local, &mut stop).await {
                    break;
                }
                continue;
            }
        };
        failures.succeeded(local);
        let Some((conn, tcp)) = admit(&table, clock, tcp, &server, &mut at_cap_logged, local)
        else {
            continue;
        };
        server.metrics.opened();
        let entry = Entry {
            table: table.clone(),
            conn,
            server: server.clone(),
        };
        tokio::spawn(connection(entry, tcp, peer, clock, stop.clone()));
    }
    // Closes the listening socket: new connections are refused by the
    // kernel while the open ones finish.
    drop(listener);
    sweeper.abort();
    if tokio::time::timeout(SHUTDOWN_GRACE, table.emptied())
        .await
        .is_err()
    {
        tracing::debug!(listener = %local, open = table.open(), "connections still open at shutdown");
    }
}

/// Checks the listener's deadlines until aborted: at the earliest one, or
/// when a connection gets a new one, at most every [`SWEEP_EVERY`].
fn spawn_sweeper(table: Arc<Table>, clock: Clock) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let swept = tokio::time::Instant::now();
            // A change after this pass leaves a permit: the wait below
            // then ends at once.
            match table.sweep(clock.now()) {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(clock.instant(at)) => {}
                        () = table.changed.notified() => {}
                    }
                }
                None => table.changed.notified().await,
            }
            tokio::time::sleep_until(swept + SWEEP_EVERY).await;
        }
    })
}

/// A listener's failed accepts: each counted, logged once per incident,
/// and retried after a pause that doubles while they go on.
struct AcceptFailures {
    failing: Incidents<(), i32>,
    backoff: Duration,
}

impl AcceptFailures {
    fn new() -> AcceptFailures {
        AcceptFailures {
            failing: Incidents::default(),
            backoff: ACCEPT_BACKOFF.0,
        }
    }

    /// Counts and logs a failed accept, then pauses before the next one;
    /// false when `stop` turned true during the pause.
    async fn failed(
        &mut self,
        e: &io::Error,
        server: &Server,
        local: SocketAddr,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let errno = e.raw_os_error().unwrap_or(0);
        server
            .metrics
            .accept_failed(crate::errno::name(crate::errno::Set::Io, errno));
        match self.failing.failed((), errno, std::time::Instant::now()) {
            Report::New => tracing::warn!(
                listener = %local, error = %e,
                "accepting connections failed; retrying after short pauses"
            ),
            Report::Again { failures } => tracing::warn!(
                listener = %local, error = %e, failures,
                "accepting connections still fails"
            ),
            Report::Quiet => {}
        }
        // The client gave up before the accept: nothing is
        // exhausted, the next connection may be fine.
        if errno == libc::ECONNABORTED {
            return true;
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return false,
            () = tokio::time::sleep(self.backoff) => {}
        }
        self.backoff = (self.backoff * 2).min(ACCEPT_BACKOFF.1);
        true
    }

    /// An accept succeeded: the incident, if one was open, ends.
    fn succeeded(&mut self, local: SocketAddr) {
        if let Some((failures, lasted)) = self.failing.succeeded((), std::time::Instant::now()) {
            tracing::info!(
                listener = %local, failures, lasted = ?lasted,
                "accepting connections again"
            );
        }
        self.backoff = ACCEPT_BACKOFF.0;
    }
}

/// A place in the table for a newcomer (at the cap, the connection idle
/// longest gives way); `None` when every connection has a request in
/// progress, and the newcomer is closed.
fn admit(
    table: &Table,
    clock: Clock,
    tcp: TcpStream,
    server: &Server,
    at_cap_logged: &mut bool,
    local: SocketAddr,
) -> Option<(Arc<Conn>, TcpStream)> {
    match table.admit(clock.now()) {
        Admission::Admitted { conn, evicted } => {
            if evicted {
                log_cap_reached(at_cap_logged, local, table.max());
            }
            Some((conn, tcp))
        }
        Admission::Refused => {
            // A reset, as for any connection closed unanswered (see
            // `Watched`).
            let _ = tcp.set_zero_linger();
            drop(tcp);
            server.metrics.closed(Closed::Refused.as_str());
            log_cap_reached(at_cap_logged, local, table.max());
            None
        }
    }
}

/// One line per listener for its life, at the first newcomer that found
/// the cap reached: under a flood every connection reaches it, and the
/// count is in `pgstorage_http_connections_closed_total`.
fn log_cap_reached(logged: &mut bool, local: SocketAddr, max: usize) {
    if !std::mem::replace(logged, true) {
        tracing::warn!(
            listener = %local,
            max_connections = max,
            "connection limit reached: each new connection now closes the one idle longest \
             (or is refused while every connection has a request in progress); counted in \
             pgstorage_http_connections_closed_total, not logged again"
        );
    }
}

/// A connection's place in its listener's table and gauge, given back when
/// its task ends however it ends (its socket is closed by then: the task
/// owned it).
struct Entry {
    table: Arc<Table>,
    conn: Arc<Conn>,
    server: Arc<Server>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.table.remove(&self.conn);
        self.server.metrics.gone();
    }
}

async fn connection(
    entry: Entry,
    tcp: TcpStream,
    peer: SocketAddr,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
) {
    let conn = &entry.conn;
    let server = &entry.server;
    let io = Watched::new(tcp, conn.clone(), clock);
    let closed = match &server.tls {
        // hyper's connection (its buffers, the router's clone) is set up
        // only once the client sends something: a flood of connections
        // that never do costs an accept, a task and a close each.
        None => match bounded(io.readable(), conn, &mut stop).await {
            Ok(Ok(())) => drive(io, peer, conn, server, clock, &mut stop).await,
            Ok(Err(_)) => None,
            Err(cut) => cut,
        },
        Some(config) => {
            let acceptor = TlsAcceptor::from(config.borrow().clone());
            let handshake = crate::http::tls::handshake(&acceptor, io);
            match bounded(handshake, conn, &mut stop).await {
                Ok(Ok(Some(tls))) => drive(tls, peer, conn, server, clock, &mut stop).await,
                // Plain HTTP on the TLS port, answered with a 400.
                Ok(Ok(None)) => None,
                // Debug only: scanners and misconfigured clients would
                // otherwise fill the log; errors carry no secrets.
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    None
                }
                Err(cut) => cut,
            }
        }
    };
    if let Some(reason) = closed {
        server.metrics.closed(reason.as_str());
    }
    // The socket is closed here, before `entry` gives back the place.
    drop(entry);
}

/// Runs `work` unless the table tells the connection to close (evicted or
/// past its deadline) or the server stops first; then `Err` with why the
/// exporter closed it (`None` for a stop).
async fn bounded<F: Future>(
    work: F,
    conn: &Conn,
    stop: &mut watch::Receiver<bool>,
) -> Result<F::Output, Option<Closed>> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = work.as_mut() => return Ok(out),
            () = conn.wake.notified() => {
                if let Some(reason) = conn.closing() {
                    return Err(Some(reason));
                }
            }
            _ = stop.wait_for(|s| *s) => return Err(None),
        }
    }
}

/// Serves HTTP/1 on `io` until the client closes, the connection is
/// evicted or times out, or the server stops; returns why the exporter
/// closed it, if it did.
async fn drive<I>(
    io: I,
    peer: SocketAddr,
    conn: &Arc<Conn>,
    server: &Server,
    clock: Clock,
    stop: &mut watch::Receiver<bool>,
) -> Option<Closed>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = Tracked {
        inner: TowerToHyperService::new(server.app.clone()),
        peer: ClientAddr(peer),
        conn: conn.clone(),
        clock,
    };
    let http = http1_builder().serve_connection(TokioIo::new(io), service);
    tokio::pin!(http);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = http.as_mut() => {
                if let Err(e) = r {
                    tracing::trace!(error = %e, "HTTP connection ended with an error");
                }
                return None;
            }
            () = conn.wake.notified() => {
                if let Some(reason) = conn.closing() {
                    return Some(reason);
                }
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                if !conn.busy() {
                    return None;
                }
                // Answers the request in progress, then closes.
                http.as_mut().graceful_shutdown();
            }
        }
    }
}

fn http1_builder() -> http1::Builder {
    let mut b = http1::Builder::new();
    // The deadlines are ours (see the module doc); without a timer hyper
    // would ignore its own anyway, this says so.
    b.header_read_timeout(None)
        // The read buffer bounds a request head (hyper answers 431 past
        // it) and so the memory a connection that sends an endless head
        // can hold: 64 KiB instead of hyper's ~400 KiB, times the cap.
        // A scrape's head is a few hundred bytes, with basic auth too.
        .max_buf_size(64 * 1024);
    b
}

/// The router as hyper's service, marking the connection busy from the
/// handler's call to the drop of the response body: a connection with a
/// request in progress is never closed to make room or for a deadline.
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    /// The client's address, for handlers that read `ConnectInfo` (the
    /// password checks' wait queue ranks clients by it).
    peer: ClientAddr,
    conn: Arc<Conn>,
    clock: Clock,
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let busy = Busy::start(self.conn.clone(), self.clock);
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Body::new(Guarded { body, _busy: busy })))
        })
    }
}

/// A request in progress on its connection, until dropped.
struct Busy {
    conn: Arc<Conn>,
    clock: Clock,
}

impl Busy {
    fn start(conn: Arc<Conn>, clock: Clock) -> Busy {
        conn.request_started();
        Busy { conn, clock }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.conn.request_done(self.clock.now());
    }
}

/// A response body that holds its request's [`Busy`] until hyper has
/// taken its last frame (or dropped it).
struct Guarded {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    //! The connection rules on real loopback sockets, with short deadlines.
    //! Bounds are loose (a busy machine delays a timer by whole seconds);
    //! what is asserted is the order of events: open before a deadline,
    //! closed after it, this connection closed rather than that one.

    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::Semaphore;
    use tokio::time::Instant;

    const HEADER: Duration = Duration::from_millis(400);
    const IDLE: Duration = Duration::from_millis(2_000);
    const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";

    struct Running {
        addr: SocketAddr,
        table: Arc<Table>,
        registry: prometheus_client::registry::Registry,
        stop: watch::Sender<bool>,
        done: tokio::task::JoinHandle<()>,
        /// `/hold` waits for a permit here: a request in progress for as
        /// long as the test wants.
        release: Arc<Semaphore>,
    }

    async fn start(max: usize) -> Running {
        let release = Arc::new(Semaphore::new(0));
        let held = release.clone();
        let app = Router::new().route("/", get(|| async { "ok\n" })).route(
            "/hold",
            get(move || {
                let held = held.clone();
                async move {
                    let _permit = held.acquire().await;
                    "released\n"
                }
            }),
        );
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = crate::exposition::connections::ConnectionMetrics::register(&mut registry);
        let server = Server {
            app,
            tls: None,
            metrics: metrics.listener("t", max, &Closed::ALL.map(Closed::as_str)),
        };
        let timeouts = crate::http::conns::Timeouts {
            header: HEADER,
            idle: IDLE,
        };
        let table = Arc::new(Table::new(max, timeouts));
        let (stop, stop_rx) = watch::channel(false);
        let done = tokio::spawn(serve(listener, addr, server, table.clone(), stop_rx));
        Running {
            addr,
            table,
            registry,
            stop,
            done,
            release,
        }
    }

    impl Running {
        fn metrics(&self) -> String {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
            out
        }

        fn closed(&self, reason: &str) -> u64 {
            let series = format!(
                "pgstorage_http_connections_closed_total{{listener=\"t\",reason=\"{reason}\"}} "
            );
            self.metrics()
                .lines()
                .find_map(|l| l.strip_prefix(&series)?.parse().ok())
                .unwrap()
        }

        /// Waits until the table holds `n` connections (an accept is not
        /// instant after connect(2) returns).
        async fn until_open(&self, n: usize) {
            let t0 = Instant::now();
            while self.table.open() != n {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "open {}",
                    self.table.open()
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Reads until EOF; returns what was read and when the EOF came.
    async fn until_closed(s: &mut TcpStream) -> (String, Instant) {
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut buf)).await;
        assert!(r.is_ok(), "still open after 20 s");
        (String::from_utf8_lossy(&buf).into_owned(), Instant::now())
    }

    /// Whether the server has closed the connection (EOF or reset) by now.
    fn is_closed(s: &TcpStream) -> bool {
        let mut b = [0u8; 1];
        match s.try_read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    /// One keep-alive request: the response head and body (`ok\n`).
    async fn request(s: &mut TcpStream, path: &str) -> String {
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).ends_with("\n\n") || got.is_empty() {
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("response within 10 s")
                .unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if text.contains("\r\n\r\n") && (text.ends_with("ok\n") || text.ends_with("released\n"))
            {
                break;
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn header_and_idle_deadlines() {
        let r = start(16).await;
        let t0 = Instant::now();
        // Nothing sent; half a head at once; a head trickled a byte every
        // 100 ms, which must not extend the deadline.
        let mut silent = TcpStream::connect(r.addr).await.unwrap();
        let mut half = TcpStream::connect(r.addr).await.unwrap();
        half.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n")
            .await
            .unwrap();
        let trickle = TcpStream::connect(r.addr).await.unwrap();
        let (mut trickle_r, mut trickle_w) = trickle.into_split();
        tokio::spawn(async move {
            for b in b"GET / HTTP/1.1\r\nHost: a-very-long-host-name-sent-slowly\r\n" {
                if trickle_w.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        // A keep-alive connection with one request answered.
        let mut kept = TcpStream::connect(r.addr).await.unwrap();
        assert!(request(&mut kept, "/").await.starts_with("HTTP/1.1 200"));
        let answered = Instant::now();

        let (_, silent_closed) = until_closed(&mut silent).await;
        let (_, half_closed) = until_closed(&mut half).await;
        // Closed unanswered: with a reset, which read_to_end reports as
        // an error.
        let mut rest = Vec::new();
        let _ = trickle_r.read_to_end(&mut rest).await;
        assert!(rest.is_empty());
        let trickle_closed = Instant::now();
        for (what, at) in [
            ("silent", silent_closed),
            ("half", half_closed),
            ("trickle", trickle_closed),
        ] {
            let after = at - t0;
            assert!(
                after >= HEADER && after < HEADER + Duration::from_secs(5),
                "{what} closed after {after:?}"
            );
        }
        // Waiting between requests is not header time: still open past
        // the header deadline, and serving.
        tokio::time::sleep(HEADER * 2).await;
        assert!(
            !is_closed(&kept),
            "keep-alive closed at the header deadline"
        );
        // The server counts the idle time from the end of its response
        // (in whole milliseconds), which comes after the request was sent
        // and before the client has read the answer: the lower bound is
        // from the sending, the upper from the answer.
        let sent_again = Instant::now();
        assert!(request(&mut kept, "/").await.starts_with("HTTP/1.1 200"));
        let answered_again = Instant::now();
        assert!(answered_again - answered < IDLE);
        // Then idle until the idle deadline.
        let (_, idle_closed) = until_closed(&mut kept).await;
        let idle_for = idle_closed - answered_again;
        assert!(
            idle_closed - sent_again >= IDLE && idle_for < IDLE + Duration::from_secs(5),
            "idle connection closed after {idle_for:?} from the answer, {:?} from the request",
            idle_closed - sent_again
        );
        // After an idle wait, a request head has the header time from its
        // first byte, not the rest of the idle time.
        let mut late = TcpStream::connect(r.addr).await.unwrap();
        assert!(request(&mut late, "/").await.starts_with("HTTP/1.1 200"));
        tokio::time::sleep(HEADER * 2).await;
        late.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let first_byte = Instant::now();
        let (_, late_closed) = until_closed(&mut late).await;
        let head_for = late_closed - first_byte;
        assert!(
            head_for >= HEADER - Duration::from_millis(20) && head_for < IDLE,
            "half head after an idle wait closed after {head_for:?}"
        );
        assert_eq!(r.closed("header_timeout"), 4);
        assert_eq!(r.closed("idle_timeout"), 1);
        assert_eq!(r.closed("evicted") + r.closed("refused"), 0);
        r.until_open(0).await;
        assert!(
            r.metrics()
                .contains("pgstorage_http_connections{listener=\"t\"} 0\n")
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_the_cap_the_oldest_idle_gives_way_and_busy_ones_stay() {
        let r = start(3).await;
        // Oldest first: a idle since its accept, b half a head, c busy.
        let mut a = TcpStream::connect(r.addr).await.unwrap();
        r.until_open(1).await;
        let mut b = TcpStream::connect(r.addr).await.unwrap();
        b.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        r.until_open(2).await;
        let mut c = TcpStream::connect(r.addr).await.unwrap();
        c.write_all(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        r.until_open(3).await;
        // A newcomer is served at once; a (idle longest) gives way.
        let mut d = TcpStream::connect(r.addr).await.unwrap();
        assert!(request(&mut d, "/").await.starts_with("HTTP/1.1 200"));
        let (got, _) = until_closed(&mut a).await;
        assert_eq!(got, "");
        assert!(!is_closed(&b) && !is_closed(&c));
        // The next one: b, whose half head is older than d's wait.
        let mut e = TcpStream::connect(r.addr).await.unwrap();
        assert!(request(&mut e, "/").await.starts_with("HTTP/1.1 200"));
        until_closed(&mut b).await;
        assert!(!is_closed(&c) && !is_closed(&d));
        assert_eq!(r.closed("evicted"), 2);
        // c's request is in progress: every idle one goes before it.
        let mut f = TcpStream::connect(r.addr).await.unwrap();
        assert!(request(&mut f, "/").await.starts_with("HTTP/1.1 200"));
        until_closed(&mut d).await;
        assert!(!is_closed(&c));
        // All three busy: the newcomer is refused, the three go on.
        e.write_all(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        f.write_all(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let t0 = Instant::now();
        while r.table.busy() != 3 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "busy {}",
                r.table.busy()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Refused: reset unanswered, so fast that even connect(2) may
        // report it.
        if let Ok(mut g) = TcpStream::connect(r.addr).await {
            let _ = g.write_all(REQUEST).await;
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), g.read_to_end(&mut buf)).await;
            assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
        }
        let t0 = Instant::now();
        while r.closed("refused") == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "not refused");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(r.closed("refused"), 1);
        assert_eq!(r.table.open(), 3);
        r.release.add_permits(3);
        for s in [&mut c, &mut e, &mut f] {
            let mut buf = [0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        }
        assert!(
            r.metrics()
                .contains("pgstorage_http_connections_max{listener=\"t\"} 3\n")
        );
        r.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(10), r.done)
            .await
            .expect("serve returns")
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopping_closes_idle_connections_and_answers_requests_in_progress() {
        let r = start(16).await;
        let mut idle = TcpStream::connect(r.addr).await.unwrap();
        let mut half = TcpStream::connect(r.addr).await.unwrap();
        half.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut busy = TcpStream::connect(r.addr).await.unwrap();
        busy.write_all(b"GET /hold HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        r.until_open(3).await;
        let t0 = Instant::now();
        while r.table.busy() != 1 {
            assert!(t0.elapsed() < Duration::from_secs(10), "never busy");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        r.stop.send_replace(true);
        until_closed(&mut idle).await;
        until_closed(&mut half).await;
        // Closed by the stop, not by the header deadline.
        assert_eq!(r.closed("header_timeout"), 0);
        assert!(!is_closed(&busy));
        assert!(!r.done.is_finished(), "returned with a request in progress");
        r.release.add_permits(1);
        let (got, _) = until_closed(&mut busy).await;
        assert!(
            got.starts_with("HTTP/1.1 200") && got.ends_with("released\n"),
            "{got}"
        );
        tokio::time::timeout(Duration::from_secs(10), r.done)
            .await
            .expect("serve returns once the request is answered")
            .unwrap();
        assert!(TcpStream::connect(r.addr).await.is_err());
    }
}
