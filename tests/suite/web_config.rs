//! `--web.config.file`: TLS and basic auth on the real binary, over real
//! sockets, with a self-signed certificate made here by the openssl CLI and
//! bcrypt hashes made here by the bcrypt crate.

use crate::common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;

/// Distinctive, so that finding it anywhere in the output is meaningful.
const PASSWORD: &str = "pw-Zq7x-tangerine-4411";
const OTHER_PASSWORD: &str = "pw-Kd2m-marmalade-9083";

/// A self-signed end-entity certificate for localhost and 127.0.0.1, with
/// its key, in `dir`. CA:FALSE because webpki refuses a CA certificate as a
/// server's own.
fn make_cert(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .arg("ec_paramgen_curve:prime256v1")
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl CLI is needed to make the test certificate");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

fn hash(password: &str) -> String {
    // Cost 4, the lowest: the test is about wiring, not about bcrypt's cost.
    bcrypt::hash(password, 4).unwrap()
}

fn client_config(
    cert: &Path,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

/// One HTTP/1.0 GET over any stream; the server closes after the answer.
fn get_over(mut s: impl Read + Write, path: &str, auth: Option<(&str, &str)>) -> io::Result<Reply> {
    let auth = auth
        .map(|(u, p)| {
            let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
            format!("Authorization: Basic {b}\r\n")
        })
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n")?;
    s.flush()?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // A peer that closes without close_notify after a complete
            // answer is still an answer.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !raw.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::other(format!("not an HTTP response: {raw:?}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no status: {head:?}")))?;
    Ok(Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn tls_get(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    path: &str,
    auth: Option<(&str, &str)>,
) -> io::Result<Reply> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
    get_over(rustls::StreamOwned::new(conn, connect(addr)), path, auth)
}

fn plain_get(addr: SocketAddr, path: &str, auth: Option<(&str, &str)>) -> io::Result<Reply> {
    get_over(connect(addr), path, auth)
}

/// Starts the exporter with a fast probe volume in `dir` and the web config.
fn start(dir: &Path, web_config: &Path) -> Exporter {
    let probe = dir.join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    let mut args = fast_probe_args(&format!("t={}", probe.display()));
    args.extend([
        "--log.level".to_string(),
        "debug".to_string(),
        "--web.config.file".to_string(),
        web_config.display().to_string(),
    ]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Exporter::start(&refs)
}

fn stop(mut ex: Exporter) -> String {
    ex.signal(libc::SIGTERM);
    let status = ex.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "{status:?}\n{}", ex.log());
    ex.log()
}

#[test]
fn tls_and_basic_auth_protect_every_path() {
    let dir = tempfile::tempdir().unwrap();
    // The certificate sits beside the web config and is named relative to
    // it; the exporter runs from elsewhere (the crate root).
    std::fs::create_dir(dir.path().join("certs")).unwrap();
    let (cert, _) = make_cert(&dir.path().join("certs"), "server");
    let alice = hash(PASSWORD);
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: certs/server.crt\n  key_file: certs/server.key\n\
             basic_auth_users:\n  alice: {alice}\n  bob: {}\n",
            hash(OTHER_PASSWORD)
        ),
    )
    .unwrap();
    let ex = start(dir.path(), &web);
    let tls = client_config(&cert, rustls::DEFAULT_VERSIONS);
    let good = Some(("alice", PASSWORD));

    // The right password, twice (the second from the verification cache).
    let mut metrics = String::new();
    for _ in 0..2 {
        let r = tls_get(ex.addr, &tls, "/metrics", good).unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.body.contains("pgstorage_build_info"), "{}", r.body);
        metrics = r.body;
    }
    let r = tls_get(ex.addr, &tls, "/healthz", good).unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    let r = tls_get(ex.addr, &tls, "/", good).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("pg-storage-exporter"), "{}", r.body);
    assert_eq!(
        tls_get(ex.addr, &tls, "/", Some(("bob", OTHER_PASSWORD)))
            .unwrap()
            .status,
        200
    );

    // Every path, the unknown ones too, wants credentials: none, a wrong
    // password, another user's password, an unknown user with a valid one.
    let bad: [Option<(&str, &str)>; 5] = [
        None,
        Some(("alice", "wrong")),
        Some(("alice", OTHER_PASSWORD)),
        Some(("carol", PASSWORD)),
        Some(("alice", "")),
    ];
    for path in ["/metrics", "/healthz", "/", "/no-such-path"] {
        for auth in bad {
            let r = tls_get(ex.addr, &tls, path, auth).unwrap();
            assert_eq!(r.status, 401, "{path} {auth:?}: {r:?}");
            assert_eq!(
                r.header("www-authenticate").as_deref(),
                Some("Basic"),
                "{r:?}"
            );
            assert!(!r.body.contains("pgstorage_"), "{r:?}");
        }
    }

    // Plain HTTP on the TLS port, even with the right password: no metrics.
    // The exporter answers a recognisable HTTP request with a 400 saying
    // why, as Go's servers do; a closed connection would be as good.
    match plain_get(ex.addr, "/metrics", good) {
        Ok(r) => {
            assert_ne!(r.status, 200, "{r:?}");
            assert!(!r.body.contains("pgstorage_"), "{r:?}");
        }
        Err(e) => eprintln!("plain HTTP refused: {e}"),
    }
    // TLS still works after that.
    assert_eq!(
        tls_get(ex.addr, &tls, "/healthz", good).unwrap().status,
        200
    );

    let log = stop(ex);
    let start_line = log.lines().find(|l| l.contains("address=")).unwrap();
    assert!(start_line.contains("tls=true"), "{start_line}");
    assert!(start_line.contains("tls_min_version=TLS12"), "{start_line}");
    assert!(start_line.contains("basic_auth=true"), "{start_line}");
    assert!(start_line.contains("basic_auth_users=2"), "{start_line}");
    // No secret anywhere: not the passwords, not even the hashes, neither in
    // the (debug-level) log nor in the metrics.
    for secret in [PASSWORD, OTHER_PASSWORD, alice.as_str()] {
        assert!(!log.contains(secret), "{secret:?} in the log:\n{log}");
        assert!(!metrics.contains(secret), "{secret:?} in the metrics");
    }
}

#[test]
fn tls_alone_serves_without_auth_and_honours_min_version() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = make_cert(dir.path(), "server");
    let web = dir.path().join("web.yml");
    // Absolute paths work as well as relative ones.
    std::fs::write(
        &web,
        format!(
            "# TLS 1.3 only\ntls_server_config:\n  cert_file: {}\n  key_file: {}\n  min_version: TLS13\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let ex = start(dir.path(), &web);

    let tls13 = client_config(&cert, &[&rustls::version::TLS13]);
    let r = tls_get(ex.addr, &tls13, "/metrics", None).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("pgstorage_build_info"));

    let tls12 = client_config(&cert, &[&rustls::version::TLS12]);
    let e = tls_get(ex.addr, &tls12, "/metrics", None).unwrap_err();
    assert!(
        e.to_string().contains("Protocol") || e.to_string().contains("alert"),
        "a TLS 1.2 client must be refused: {e}"
    );
    // A client that does not trust the certificate gets nothing either.
    let (other, _) = make_cert(dir.path(), "other");
    let e = tls_get(
        ex.addr,
        &client_config(&other, rustls::DEFAULT_VERSIONS),
        "/",
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("certificate"), "{e}");

    let log = stop(ex);
    let start_line = log.lines().find(|l| l.contains("address=")).unwrap();
    assert!(start_line.contains("tls=true"), "{start_line}");
    assert!(start_line.contains("tls_min_version=TLS13"), "{start_line}");
    assert!(start_line.contains("basic_auth=false"), "{start_line}");
}

/// The TLS port under a smaller version of `scrape_storm`'s hold: 1,000
/// connections that never send a byte and 300 that send the start of a
/// ClientHello and nothing more, opened again whenever the exporter closes
/// them, with the open-file limit at 1,024 (soft and hard). A TLS scrape on
/// a fresh connection is answered within a second throughout.
#[test]
fn held_connections_and_half_handshakes_do_not_block_a_tls_scrape() {
    use common::flood::{FdWatch, Holders, open_fds, raise_own_nofile, under_prlimit};
    // A TLS record header announcing a 512-byte handshake message, and the
    // first bytes of a ClientHello: the handshake can never complete.
    const HALF_HELLO: &[u8] = &[
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    const BUDGET: Duration = Duration::from_secs(1);
    assert!(
        raise_own_nofile() >= 4_096,
        "the test's own open-file limit"
    );
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = make_cert(dir.path(), "server");
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            cert.display(),
            key.display()
        ),
    )
    .unwrap();
    let probe = dir.path().join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    let mut cmd = under_prlimit(1_024, 1_024);
    cmd.args(["--web.listen-address", "127.0.0.1:0", "--web.config.file"])
        .arg(&web)
        // The descriptors counted are the HTTP layer's: the sync tracing's
        // programs, maps and tracepoint links open on their own thread some
        // time after the start, and would land between the two counts.
        .arg("--no-collector.postgres.syncs")
        .args(fast_probe_args(&format!("t={}", probe.display())));
    let mut ex = Exporter::spawn(cmd);
    let pid = ex.child.id();
    let tls = client_config(&cert, rustls::DEFAULT_VERSIONS);
    assert_eq!(
        tls_get(ex.addr, &tls, "/healthz", None).unwrap().status,
        200
    );
    let fds_before = open_fds(pid);

    let holders = Holders::start(ex.addr, 1_000, 300, HALF_HELLO);
    let fds = FdWatch::start(pid);
    let start = Instant::now();
    let (mut answered, mut slowest, mut failed) = (0, Duration::ZERO, Vec::new());
    while start.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let r = TcpStream::connect_timeout(&ex.addr, BUDGET).and_then(|s| {
            s.set_read_timeout(Some(BUDGET))?;
            let conn =
                rustls::ClientConnection::new(tls.clone(), name).map_err(io::Error::other)?;
            get_over(rustls::StreamOwned::new(conn, s), "/metrics", None)
        });
        let took = t0.elapsed();
        match r {
            Ok(r)
                if r.status == 200 && r.body.contains("pgstorage_build_info") && took <= BUDGET =>
            {
                answered += 1;
                slowest = slowest.max(took);
            }
            Ok(r) => failed.push(format!("status {} after {took:.2?}", r.status)),
            Err(e) => failed.push(format!("{e} after {took:.2?}")),
        }
    }
    let fds_max = fds.max();
    drop(fds);
    let connects = holders.connects();
    eprintln!(
        "TLS under a hold of 1,300 connections: {answered} scrapes answered (slowest \
         {slowest:.1?}), {} not; {connects} holder connections opened; exporter descriptors \
         {fds_before} before, at most {fds_max} during",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "TLS scrapes not answered within {BUDGET:?}: {failed:#?}"
    );
    assert!(answered >= 5, "{answered} scrapes");
    // The default cap of 256, 16 connections being closed, a few files.
    assert!(
        fds_max <= fds_before + 256 + 32,
        "descriptors {fds_before} -> {fds_max}"
    );
    ex.signal(libc::SIGTERM);
    let status = ex.wait_exit(Duration::from_secs(15));
    holders.stop();
    assert!(status.success(), "{status:?}");
    let log = ex.log();
    assert!(!log.contains("Too many open files"), "{log}");
}

#[test]
fn basic_auth_alone_works_over_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!("basic_auth_users:\n  alice: {}\n", hash(PASSWORD)),
    )
    .unwrap();
    let ex = start(dir.path(), &web);

    let r = plain_get(ex.addr, "/metrics", Some(("alice", PASSWORD))).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("pgstorage_build_info"));
    let r = plain_get(ex.addr, "/metrics", Some(("alice", "nope"))).unwrap();
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.header("www-authenticate").as_deref(), Some("Basic"));
    let r = plain_get(ex.addr, "/healthz", None).unwrap();
    assert_eq!(r.status, 401, "{r:?}");

    let log = stop(ex);
    let start_line = log.lines().find(|l| l.contains("address=")).unwrap();
    assert!(start_line.contains("tls=false"), "{start_line}");
    assert!(start_line.contains("basic_auth=true"), "{start_line}");
    assert!(!log.contains(PASSWORD), "{log}");
}

/// Runs the exporter with a web config that must be refused; returns
/// (exit code, stderr). Fails if it is still running after 20 s.
fn refused(dir: &Path, web: &Path) -> (i32, String) {
    let probe = dir.join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    let mut child = Command::new(BIN)
        .args(["--web.listen-address", "127.0.0.1:0", "--probe.path"])
        .arg(format!("t={}", probe.display()))
        .arg("--web.config.file")
        .arg(web)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the exporter started with a bad web config {}",
                web.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    // Refused before anything was bound or written.
    assert!(
        dir_entries(&probe).is_empty(),
        "probe files written: {:?}",
        dir_entries(&probe)
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_web_configs_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, _) = make_cert(d, "good");
    let (_, _) = make_cert(d, "unrelated");
    std::fs::write(d.join("garbage.key"), "not a key\n").unwrap();
    let tls = |cert: &str, key: &str, extra: &str| {
        format!("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n{extra}")
    };
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        (
            "unknown top-level key",
            "tls_srever_config:\n  cert_file: good.crt\n".into(),
            vec!["unknown key `tls_srever_config`; expected one of `tls_server_config`".into()],
        ),
        (
            "unknown key in tls_server_config",
            tls("good.crt", "good.key", "  cert_flie: x\n"),
            vec!["tls_server_config: unknown key `cert_flie`; expected one of `cert_file`".into()],
        ),
        (
            "client CA without a client auth policy",
            tls("good.crt", "good.key", "  client_ca_file: good.crt\n"),
            vec!["a client CA is configured without a client auth policy".into()],
        ),
        (
            "unknown client auth policy",
            tls("good.crt", "good.key", "  client_auth_type: Sometimes\n"),
            vec!["tls_server_config.client_auth_type: expected one of NoClientCert".into()],
        ),
        (
            "client CA file without a certificate",
            tls(
                "good.crt",
                "good.key",
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: garbage.key\n",
            ),
            vec![
                "tls_server_config.client_ca_file".into(),
                d.join("garbage.key").display().to_string(),
            ],
        ),
        (
            "missing cert file",
            tls("missing.crt", "good.key", ""),
            vec![
                "tls_server_config.cert_file".into(),
                d.join("missing.crt").display().to_string(),
                "No such file".into(),
            ],
        ),
        (
            "missing key file",
            tls("good.crt", "missing.key", ""),
            vec![
                "tls_server_config.key_file".into(),
                d.join("missing.key").display().to_string(),
            ],
        ),
        (
            "key file that is a directory",
            tls("good.crt", ".", ""),
            vec!["tls_server_config.key_file".into(), "cannot read".into()],
        ),
        (
            "key file without a key",
            tls("good.crt", "garbage.key", ""),
            vec![
                "tls_server_config.key_file".into(),
                d.join("garbage.key").display().to_string(),
            ],
        ),
        (
            "key of another certificate",
            tls("good.crt", "unrelated.key", ""),
            vec![
                "good.crt".into(),
                "unrelated.key".into(),
                "do not form a usable pair".into(),
            ],
        ),
        (
            "cert_file missing",
            "tls_server_config:\n  key_file: good.key\n".into(),
            vec!["tls_server_config.cert_file: missing".into()],
        ),
        (
            "TLS 1.0",
            tls("good.crt", "good.key", "  min_version: TLS10\n"),
            vec!["tls_server_config.min_version".into()],
        ),
        (
            "plain password instead of a hash",
            format!("basic_auth_users:\n  alice: {PASSWORD}\n"),
            vec!["basic_auth_users.alice".into(), "not a bcrypt hash".into()],
        ),
        (
            "rate limit interval that is not a duration",
            "rate_limit:\n  interval: 1 second\n  burst: 10\n".into(),
            vec!["rate_limit.interval: expected a duration".into()],
        ),
        (
            "inline certificate that is not PEM",
            "tls_server_config:\n  cert: x\n  key_file: good.key\n".into(),
            vec!["tls_server_config.cert: no PEM certificate".into()],
        ),
        (
            "response header the toolkit does not allow",
            "http_server_config:\n  headers:\n    Server: x\n".into(),
            vec!["http_server_config.headers: `Server` cannot be configured".into()],
        ),
        (
            "cipher suites without one HTTP/2 requires",
            tls(
                "good.crt",
                "good.key",
                "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n",
            ),
            vec!["Go's HTTP/2 server requires".into()],
        ),
        (
            "duplicate user",
            format!(
                "basic_auth_users:\n  alice: {h}\n  bob: {h}\n  alice: {h}\n",
                h = hash(OTHER_PASSWORD)
            ),
            vec!["basic_auth_users: user \"alice\" is listed twice".into()],
        ),
        (
            "duplicate key",
            format!("{}  cert_file: good.crt\n", tls("good.crt", "good.key", "")),
            vec!["`tls_server_config.cert_file` is given twice".into()],
        ),
        (
            "not YAML",
            "tls_server_config: [\n".into(),
            vec!["web.yml".into()],
        ),
    ];
    let web = d.join("web.yml");
    for (what, text, wants) in &cases {
        std::fs::write(&web, text).unwrap();
        let (code, stderr) = refused(d, &web);
        assert_eq!(code, 2, "{what}: {stderr}");
        assert!(
            stderr.contains(&format!("--web.config.file {}", web.display())),
            "{what}: the file is not named: {stderr}"
        );
        for want in wants {
            assert!(
                stderr.contains(want.as_str()),
                "{what}: {want:?} not in: {stderr}"
            );
        }
        assert!(!stderr.contains("listening"), "{what}: {stderr}");
        assert!(
            !stderr.contains(PASSWORD),
            "{what}: the password is quoted: {stderr}"
        );
    }

    let missing = d.join("no-such-web.yml");
    let (code, stderr) = refused(d, &missing);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");
}

/// A value of the wrong type, or not a hash, is most likely a password: in
/// no case does it reach stderr, while the key at fault is named.
#[test]
fn wrong_values_are_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = PASSWORD;
    let cases: Vec<(String, &str)> = vec![
        (
            format!("basic_auth_users: \"alice:{p}\"\n"),
            "basic_auth_users: expected a map of user name to bcrypt hash",
        ),
        (
            format!("basic_auth_users: [alice, \"{p}\"]\n"),
            "basic_auth_users: expected a map",
        ),
        (
            format!("basic_auth_users:\n  alice: [\"{p}\"]\n"),
            "basic_auth_users.alice: expected a bcrypt hash",
        ),
        (
            format!("basic_auth_users:\n  alice: \"{p}\"\n"),
            "basic_auth_users.alice: not a bcrypt hash",
        ),
        (
            format!("basic_auth_users:\n  alice:{p}:\n"),
            "basic_auth_users: a user name is empty or contains ':'",
        ),
        (
            format!("basic_auth_users:\n  alice: !!int \"{p}\"\n"),
            "line 2 column",
        ),
        (
            format!("basic_auth_users:\n  alice: !!bool {p}\n"),
            "line 2 column",
        ),
        (
            format!("basic_auth_users: {{alice: \"{p}\"\n"),
            "not valid YAML",
        ),
        (
            format!("tls_server_config: \"{p}\"\n"),
            "tls_server_config: expected a map",
        ),
        (
            format!("tls_server_config:\n  key: \"{p}\"\n"),
            "tls_server_config.cert_file: missing",
        ),
        (
            format!("tls_server_config:\n  cert: \"{p}\"\n  key: \"{p}\"\n"),
            "tls_server_config.cert: no PEM certificate",
        ),
        (
            format!("http_server_config:\n  headers:\n    X-Frame-Options: \"{p}\"\n"),
            "http_server_config.headers.X-Frame-Options: expected one of deny, sameorigin",
        ),
        (
            format!("rate_limit:\n  interval: \"{p}\"\n"),
            "rate_limit.interval: expected a duration",
        ),
        (
            format!("tls_server_config:\n  client_auth_type: \"{p}\"\n"),
            "tls_server_config.client_auth_type: expected one of",
        ),
        (
            format!("tls_server_config:\n  min_version: \"{p}\"\n"),
            "tls_server_config.min_version: expected TLS12 or TLS13",
        ),
        (
            format!("http_server_config:\n  http2: \"{p}\"\n"),
            "http_server_config.http2: expected true or false",
        ),
    ];
    let web = d.join("web.yml");
    for (text, want) in &cases {
        std::fs::write(&web, text).unwrap();
        let (code, stderr) = refused(d, &web);
        assert_eq!(code, 2, "{text:?}: {stderr}");
        assert!(stderr.contains(want), "{text:?}: {want:?} not in: {stderr}");
        assert!(
            stderr.contains(&format!("--web.config.file {}", web.display())),
            "{text:?}: the file is not named: {stderr}"
        );
        assert!(
            !stderr.contains(p),
            "{text:?}: the password is quoted: {stderr}"
        );
        // Not even a part of it, as a YAML or serde message would show it.
        assert!(!stderr.contains("tangerine"), "{text:?}: {stderr}");
    }
}

/// SIGHUP reads the web configuration again: a rotated certificate is
/// served to new connections and the new users replace the old ones; a file
/// that does not load, or that would turn TLS off, changes nothing.
#[test]
fn sighup_rotates_the_certificate_and_the_users() {
    let dir = tempfile::tempdir().unwrap();
    let (old_cert, _) = make_cert(dir.path(), "old");
    let (new_cert, _) = make_cert(dir.path(), "new");
    let web = dir.path().join("web.yml");
    let write = |cert: &str, user: &str, password: &str| {
        std::fs::write(
            &web,
            format!(
                "tls_server_config:\n  cert_file: {cert}.crt\n  key_file: {cert}.key\n\
                 basic_auth_users:\n  {user}: {}\n",
                hash(password)
            ),
        )
        .unwrap();
    };
    write("old", "alice", PASSWORD);
    let ex = start(dir.path(), &web);
    let trusts_old = client_config(&old_cert, rustls::DEFAULT_VERSIONS);
    let trusts_new = client_config(&new_cert, rustls::DEFAULT_VERSIONS);
    let alice = Some(("alice", PASSWORD));
    let bob = Some(("bob", OTHER_PASSWORD));
    assert_eq!(
        tls_get(ex.addr, &trusts_old, "/metrics", alice)
            .unwrap()
            .status,
        200
    );
    assert!(tls_get(ex.addr, &trusts_new, "/metrics", alice).is_err());

    write("new", "bob", OTHER_PASSWORD);
    ex.signal(libc::SIGHUP);
    ex.wait_log("web configuration reloaded", Duration::from_secs(20));
    assert!(
        tls_get(ex.addr, &trusts_old, "/metrics", bob).is_err(),
        "new connections get the new certificate"
    );
    assert_eq!(
        tls_get(ex.addr, &trusts_new, "/metrics", bob)
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        tls_get(ex.addr, &trusts_new, "/metrics", alice)
            .unwrap()
            .status,
        401
    );

    // Turning TLS off needs a restart: refused, TLS and bob stay.
    std::fs::write(
        &web,
        format!("basic_auth_users:\n  carol: {}\n", hash(PASSWORD)),
    )
    .unwrap();
    ex.signal(libc::SIGHUP);
    let log = ex.wait_log(
        "turns TLS off: that needs a restart",
        Duration::from_secs(20),
    );
    assert!(log.contains("configuration reload refused"), "{log}");
    // A file that is not YAML: refused too.
    std::fs::write(&web, "tls_server_config: [\n").unwrap();
    ex.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while ex.log().matches("configuration reload refused").count() < 2 {
        assert!(Instant::now() < deadline, "{}", ex.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = tls_get(ex.addr, &trusts_new, "/metrics", bob).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        sample(
            &r.body,
            "pgstorage_config_reload_errors_total{cause=\"invalid\"}"
        ),
        Some(2.0),
        "{}",
        r.body
    );
    assert_eq!(
        sample(&r.body, "pgstorage_config_last_reload_successful"),
        Some(0.0)
    );
    assert_eq!(
        tls_get(ex.addr, &trusts_new, "/metrics", Some(("carol", PASSWORD)))
            .unwrap()
            .status,
        401
    );
    let log = stop(ex);
    for secret in [PASSWORD, OTHER_PASSWORD] {
        assert!(!log.contains(secret), "a password in the log");
    }
}

/// TLS and basic auth hold on every socket: each of two
/// `--web.listen-address`es, and a socket passed by systemd
/// (`systemd-socket-activate`, which execs the exporter on the first
/// connection).
#[test]
fn tls_and_basic_auth_on_every_listen_address_and_on_a_systemd_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = make_cert(dir.path(), "server");
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  alice: {}\n",
            cert.display(),
            key.display(),
            hash(PASSWORD)
        ),
    )
    .unwrap();
    let tls = client_config(&cert, rustls::DEFAULT_VERSIONS);
    let good = Some(("alice", PASSWORD));
    let check = |addr: SocketAddr| {
        let r = tls_get(addr, &tls, "/metrics", good).unwrap();
        assert_eq!(r.status, 200, "{addr}: {r:?}");
        assert!(r.body.contains("pgstorage_build_info"), "{addr}");
        let r = tls_get(addr, &tls, "/metrics", None).unwrap();
        assert_eq!(r.status, 401, "{addr}: {r:?}");
        assert!(plain_get(addr, "/metrics", good).map_or(true, |r| r.status != 200));
    };
    let probe = dir.path().join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    let mut common_args = fast_probe_args(&format!("t={}", probe.display()));
    common_args.extend(["--web.config.file".to_string(), web.display().to_string()]);

    let mut args: Vec<String> = [
        "--web.listen-address",
        "127.0.0.1:0",
        "--web.listen-address",
        "127.0.0.2:0",
    ]
    .map(String::from)
    .to_vec();
    args.extend(common_args.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let ex = Exporter::start_raw(&refs, &[]);
    let log = ex.wait_log("address=127.0.0.2:", Duration::from_secs(10));
    let addrs: Vec<SocketAddr> = log
        .lines()
        .filter(|l| l.contains("msg=listening"))
        .filter_map(|l| l.split("address=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(addrs.len(), 2, "{log}");
    for a in addrs {
        check(a);
    }
    let log = stop(ex);
    assert!(
        log.lines()
            .filter(|l| l.contains("msg=listening"))
            .all(|l| l.contains("tls=true") && l.contains("basic_auth=true")),
        "{log}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut cmd = Command::new("systemd-socket-activate");
    cmd.args(["-l", &addr.to_string(), BIN, "--web.systemd-socket"])
        .args(&common_args);
    let knock = {
        let tls = tls.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while TcpStream::connect(addr).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "systemd-socket-activate never listened"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            tls_get(addr, &tls, "/healthz", Some(("alice", PASSWORD))).map(|r| r.status)
        })
    };
    let ex = Exporter::spawn(cmd);
    assert_eq!(ex.addr, addr, "{}", ex.log());
    assert_eq!(knock.join().unwrap().unwrap(), 200);
    check(addr);
    let log = stop(ex);
    let line = log.lines().find(|l| l.contains("msg=listening")).unwrap();
    assert!(
        line.contains("systemd_socket=true") && line.contains("tls=true"),
        "{line}"
    );
}

/// A TCP connection to `to` from the loopback address `from` (any of
/// 127.0.0.0/8 is this host), so the exporter sees a client other than
/// 127.0.0.1.
fn connect_from(from: [u8; 4], to: SocketAddr) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.bind(&SocketAddr::from((from, 0)).into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

fn request(user: &str, password: &str) -> String {
    let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("GET /metrics HTTP/1.0\r\nHost: localhost\r\nAuthorization: Basic {b}\r\n\r\n")
}

/// A request sent without waiting for its answer.
struct Pending {
    stream: TcpStream,
    raw: Vec<u8>,
}

impl Pending {
    fn send(from: [u8; 4], to: SocketAddr, user: &str, password: &str) -> Pending {
        let mut stream = connect_from(from, to).unwrap();
        stream
            .write_all(request(user, password).as_bytes())
            .unwrap();
        stream.set_nonblocking(true).unwrap();
        Pending {
            stream,
            raw: Vec::new(),
        }
    }

    /// The status once the whole answer is in (the server closes after an
    /// HTTP/1.0 answer); None while it is not.
    fn poll(&mut self) -> Option<u16> {
        let mut buf = [0u8; 16384];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.raw.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(_) => break,
            }
        }
        let head = String::from_utf8_lossy(&self.raw);
        Some(
            head.split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
        )
    }

    /// Blocks until the answer is in.
    fn wait(mut self, timeout: Duration) -> u16 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.poll() {
                return s;
            }
            assert!(Instant::now() < deadline, "no answer in {timeout:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[derive(Debug, Default)]
struct Flood {
    sent: usize,
    /// Answers by status.
    answers: std::collections::BTreeMap<u16, usize>,
    /// Still unanswered when the flood gave up on them and hung up.
    unanswered: usize,
}

/// `rate` requests a second for `length` from `from`, each on its own
/// connection, without waiting for answers (an attacker does not); then up
/// to `grace` for the answers still due, then hangs up on the rest.
fn flood(
    to: SocketAddr,
    from: [u8; 4],
    (user, password): (&str, &str),
    rate: u32,
    length: Duration,
    grace: Duration,
) -> Flood {
    let total = (rate as f64 * length.as_secs_f64()) as usize;
    let start = Instant::now();
    let mut open: Vec<Pending> = Vec::new();
    let mut f = Flood::default();
    loop {
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as usize + 1).min(total);
        while f.sent < due {
            open.push(Pending::send(from, to, user, password));
            f.sent += 1;
        }
        open.retain_mut(|p| match p.poll() {
            Some(status) => {
                *f.answers.entry(status).or_default() += 1;
                false
            }
            None => true,
        });
        if f.sent == total && (open.is_empty() || start.elapsed() > length + grace) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f.unanswered = open.len();
    f
}

/// GET /metrics with credentials from 127.0.0.1: (status, body, time taken).
fn timed_get(addr: SocketAddr, user: &str, password: &str) -> (u16, String, Duration) {
    let t = Instant::now();
    let s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let r = get_over(s, "/metrics", Some((user, password))).unwrap();
    (r.status, r.body, t.elapsed())
}

/// The acceptance test of the wait queue in front of bcrypt: 50 wrong
/// passwords a second for 10 s from 127.0.0.2, at cost 12, and meanwhile
/// three first scrapes with the right password (three users, so none is
/// cached) from 127.0.0.1, each answered 200 after its own check only: one
/// of the two check slots is kept for addresses without failures, so the
/// flood's checks run beside it, not before it. On two cores busy with
/// other tests one cost-12 check ranges from 0.5 to over 1.5 s, so the
/// bound is loose: five uncontended checks (at least 3 s), against the
/// many seconds of a scrape queued behind the flood. The flood's checks
/// that finished meanwhile are printed (they run in the other slot). With
/// one FIFO queue each scrape waited behind the flood's checks until the
/// flood hung up.
#[test]
fn a_first_scrape_is_answered_during_a_password_flood_from_another_address() {
    const COST: u32 = 12;
    let dir = tempfile::tempdir().unwrap();
    let users: Vec<(String, String)> = ["monitor", "prom1", "prom2", "prom3"]
        .iter()
        .map(|u| (u.to_string(), format!("{PASSWORD}-{u}")))
        .collect();
    let hashes: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = users
            .iter()
            .map(|(_, p)| s.spawn(move || bcrypt::hash(p, COST).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut yaml = "basic_auth_users:\n".to_string();
    for ((u, _), h) in users.iter().zip(&hashes) {
        yaml.push_str(&format!("  {u}: {h}\n"));
    }
    let web = dir.path().join("web.yml");
    std::fs::write(&web, yaml).unwrap();
    let ex = start(dir.path(), &web);

    // One uncontended check, as a yardstick for this machine; the monitor
    // is cached from here on and reads the metrics without a check.
    let (status, _, one_check) = timed_get(ex.addr, "monitor", &users[0].1);
    assert_eq!(status, 200);
    let failures = || {
        let (_, m, _) = timed_get(ex.addr, "monitor", &users[0].1);
        sample(&m, "pgstorage_http_auth_checks_total{result=\"failure\"}").unwrap_or(-1.0)
    };

    let length = Duration::from_secs(10);
    let addr = ex.addr;
    let flooder = std::thread::spawn(move || {
        flood(
            addr,
            [127, 0, 0, 2],
            ("prom1", "wrong-password"),
            50,
            length,
            // For the answers of the flood's last checks, which wait
            // behind everything else.
            Duration::from_secs(30),
        )
    });
    let t0 = Instant::now();
    let (mut took, mut ahead) = (Vec::new(), Vec::new());
    for (i, (user, password)) in users[1..].iter().enumerate() {
        let at = Duration::from_millis(2500) * (i as u32 + 1);
        while t0.elapsed() < at {
            std::thread::sleep(Duration::from_millis(10));
        }
        let before = failures();
        let (status, body, t) = timed_get(ex.addr, user, password);
        assert_eq!(status, 200, "{user}: {body}");
        took.push(t);
        ahead.push(failures() - before);
    }
    let flood = flooder.join().unwrap();
    let (_, m, _) = timed_get(ex.addr, "monitor", &users[0].1);
    let metric = |s: &str| sample(&m, s).unwrap_or(-1.0);
    let busy = metric("pgstorage_http_auth_skipped_total{reason=\"address_busy\"}");
    let full = metric("pgstorage_http_auth_skipped_total{reason=\"queue_full\"}");
    let gone = metric("pgstorage_http_auth_skipped_total{reason=\"client_gone\"}");
    let failed = metric("pgstorage_http_auth_checks_total{result=\"failure\"}");
    let passed = metric("pgstorage_http_auth_checks_total{result=\"success\"}");
    eprintln!(
        "one uncontended cost-{COST} check: {one_check:?}; first scrapes during the flood: \
         {took:?}, flood checks finished meanwhile {ahead:?}; flood: {} sent, answers {:?}, \
         {} unanswered; checks run: {failed} failed, {passed} passed; skipped: {busy} \
         address_busy, {full} queue_full, {gone} client_gone",
        flood.sent, flood.answers, flood.unanswered
    );
    let bound = Duration::from_secs(3).max(one_check * 5);
    for (i, (t, n)) in took.iter().zip(&ahead).enumerate() {
        assert!(
            *t <= bound,
            "first scrape {} waited {t:?} (bound {bound:?}), {n} flood checks finished meanwhile",
            i + 1
        );
    }
    assert_eq!(flood.sent, 500);
    assert_eq!(flood.unanswered, 0, "{flood:?}");
    let refused = flood.answers.get(&429).copied().unwrap_or(0);
    let unauthorized = flood.answers.get(&401).copied().unwrap_or(0);
    assert_eq!(refused + unauthorized, 500, "{flood:?}");
    // Most of the flood was answered without a hash, and counted so.
    assert!(refused > 250, "{flood:?}");
    assert_eq!(busy as usize, refused);
    assert_eq!(failed as usize, unauthorized);
    assert_eq!(passed, 4.0);
    assert_eq!(
        metric("pgstorage_http_auth_checks_in_flight{state=\"waiting\"}"),
        0.0,
        "{}",
        m.lines()
            .filter(|l| l.contains("http_auth"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // One line for the whole incident, naming the flood's address.
    let log = stop(ex);
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("too many password checks waiting"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("client=127.0.0.2"), "{}", lines[0]);
    assert!(!log.contains(PASSWORD), "a password in the log");
    // Accepted, with a warning at start.
    assert!(
        log.contains(
            "bcrypt cost above 10 (exporter-toolkit's default) for cost 12: monitor, prom1, \
             prom2, prom3"
        ),
        "{log}"
    );
}

/// A client that hangs up while its check waits leaves the queue: no hash
/// runs for it (hyper notices the hang-up while the answer is pending and
/// drops the request).
#[test]
fn a_check_whose_client_hung_up_is_never_run() {
    // Cost 13 (about 1.2 s a check in a debug build): the two checks that
    // hold the slots stay busy while the waiting ones come and go.
    const COST: u32 = 13;
    const RUNNING: &str = "pgstorage_http_auth_checks_in_flight{state=\"running\"}";
    const WAITING: &str = "pgstorage_http_auth_checks_in_flight{state=\"waiting\"}";
    let dir = tempfile::tempdir().unwrap();
    let (hm, ha) = std::thread::scope(|s| {
        let m = s.spawn(|| bcrypt::hash(OTHER_PASSWORD, COST).unwrap());
        let a = s.spawn(|| bcrypt::hash(PASSWORD, COST).unwrap());
        (m.join().unwrap(), a.join().unwrap())
    });
    let web = dir.path().join("web.yml");
    std::fs::write(
        &web,
        format!("basic_auth_users:\n  monitor: {hm}\n  alice: {ha}\n"),
    )
    .unwrap();
    let ex = start(dir.path(), &web);
    let metrics = || {
        let r = plain_get(ex.addr, "/metrics", Some(("monitor", OTHER_PASSWORD))).unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        r.body
    };
    let auth_line = |m: &str, s: &str| sample(m, s).unwrap_or(-1.0);
    // The monitor's one check; cached from here on.
    metrics();

    let to = ex.addr;
    let t0 = Instant::now();
    let await_metric = |series: &str, want: f64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let m = metrics();
            if auth_line(&m, series) == want {
                return m;
            }
            assert!(Instant::now() < deadline, "{series} never {want}: {m}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let holders = [
        Pending::send([127, 0, 0, 2], to, "alice", "wrong"),
        Pending::send([127, 0, 0, 3], to, "alice", "wrong"),
    ];
    await_metric(RUNNING, 2.0);
    let waiters: Vec<Pending> = (0..3)
        .map(|_| Pending::send([127, 0, 0, 4], to, "alice", "wrong"))
        .collect();
    await_metric(WAITING, 3.0);
    let waited = t0.elapsed();
    drop(waiters);
    let m = await_metric(
        "pgstorage_http_auth_skipped_total{reason=\"client_gone\"}",
        3.0,
    );
    eprintln!(
        "3 checks waiting {waited:?} after the 2 holding the slots were sent; \
         gone from the queue {:?} after they hung up",
        t0.elapsed() - waited
    );
    assert_eq!(auth_line(&m, WAITING), 0.0, "{m}");
    assert_eq!(auth_line(&m, RUNNING), 2.0, "{m}");
    for h in holders {
        assert_eq!(h.wait(Duration::from_secs(30)), 401);
    }
    // A check after them: had the three stayed in the queue, they would
    // have had their hashes before this one.
    assert_eq!(
        Pending::send([127, 0, 0, 5], to, "alice", "wrong").wait(Duration::from_secs(30)),
        401
    );
    let m = metrics();
    assert_eq!(
        auth_line(&m, "pgstorage_http_auth_checks_total{result=\"failure\"}"),
        3.0,
        "{m}"
    );
    assert_eq!(
        auth_line(&m, "pgstorage_http_auth_checks_total{result=\"success\"}"),
        1.0,
        "{m}"
    );
    stop(ex);
}

/// A hash of cost `c` made from a cost-4 one: only the cost field is read
/// when the file is loaded, and cost 31 would take days to make.
fn hash_of_cost(password: &str, c: u32) -> String {
    hash(password).replacen("$04$", &format!("${c:02}$"), 1)
}

/// Costs up to 18 are accepted, as exporter-toolkit accepts them (its own
/// test file has a user at 18): above 10, above 14 (where a first scrape
/// no longer fits the scrape timeout) and costs that differ between users
/// are warned of at start and at a reload, naming the users and never the
/// hash. Above 18 a wrong password would hold a check slot for half a
/// minute to 36 hours (31): refused at start (exit 2) and at a reload
/// (the running users stay).
#[test]
fn costs_up_to_18_are_accepted_with_a_warning_and_above_refused_at_start_and_at_reload() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let web = d.join("web.yml");
    for c in [19, 31] {
        let h = hash_of_cost(PASSWORD, c);
        std::fs::write(
            &web,
            format!(
                "basic_auth_users:\n  alice: {}\n  bob: {h}\n",
                hash(PASSWORD)
            ),
        )
        .unwrap();
        let (code, stderr) = refused(d, &web);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains(&format!(
                "basic_auth_users.bob: bcrypt cost {c} is above 18, the highest accepted"
            )),
            "{stderr}"
        );
        assert!(!stderr.contains(&h[7..]), "the hash is quoted: {stderr}");
    }

    let high = hash_of_cost(OTHER_PASSWORD, 18);
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  alice: {}\n  bob: {high}\n",
            hash(PASSWORD)
        ),
    )
    .unwrap();
    let ex = start(d, &web);
    let log = ex.wait_log(
        "bcrypt cost above 14 for cost 18: bob",
        Duration::from_secs(20),
    );
    assert!(!log.contains(&high[7..]), "the hash is logged: {log}");
    // alice, at cost 4, is served.
    assert_eq!(
        plain_get(ex.addr, "/metrics", Some(("alice", PASSWORD)))
            .unwrap()
            .status,
        200
    );
    let twelve = hash_of_cost(OTHER_PASSWORD, 12);
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  alice: {}\n  carol: {twelve}\n",
            hash(PASSWORD)
        ),
    )
    .unwrap();
    ex.signal(libc::SIGHUP);
    let log = ex.wait_log("web configuration reloaded", Duration::from_secs(20));
    assert!(
        log.contains("bcrypt cost above 10 (exporter-toolkit's default) for cost 12: carol"),
        "{log}"
    );
    assert!(
        log.contains("the users' bcrypt costs differ (cost 4: alice; cost 12: carol)"),
        "{log}"
    );
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  alice: {}\n  dave: {}\n",
            hash(PASSWORD),
            hash_of_cost(OTHER_PASSWORD, 31)
        ),
    )
    .unwrap();
    ex.signal(libc::SIGHUP);
    let log = ex.wait_log("configuration reload refused", Duration::from_secs(20));
    assert!(
        log.contains("basic_auth_users.dave: bcrypt cost 31 is above 18"),
        "{log}"
    );
    // The running users stay.
    assert_eq!(
        plain_get(ex.addr, "/metrics", Some(("alice", PASSWORD)))
            .unwrap()
            .status,
        200
    );
    let log = stop(ex);
    assert!(!log.contains(&twelve[7..]), "a hash in the log");
}
