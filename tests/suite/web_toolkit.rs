//! exporter-toolkit's own web configuration test files
//! (tests/fixtures/exporter-toolkit: its `web/testdata`, unchanged, with its
//! licence) against the real binary: each file is started with
//! `--web.config.file`, and must be refused where the toolkit refuses it
//! and served where the toolkit serves it, with the toolkit test's client
//! outcomes (client certificates, cipher suites, curves, headers, the rate
//! limit, users) checked with curl. Then mutual TLS with certificates made
//! here by the openssl CLI, reloaded by SIGHUP.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::*;

const TESTDATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/exporter-toolkit/web/testdata"
);

/// What a client check expects.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// An HTTP answer with this status.
    Status(u16),
    /// No HTTP answer: the TLS handshake (or the first read after it, where
    /// TLS 1.3 sends the server's refusal of a client certificate) fails.
    Refused,
    /// Status 200 over TLS 1.2 with this cipher suite (OpenSSL's name).
    Cipher(&'static str),
}

/// One client request, as the toolkit's tests make it.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// Plain HTTP GET of /healthz.
    Plain(Outcome),
    /// HTTPS GET of /healthz with this client certificate (a testdata
    /// name), these extra curl arguments.
    Tls(Option<&'static str>, &'static [&'static str], Outcome),
    /// A response header of a plain GET.
    Header(&'static str, &'static str),
    /// This many plain GETs in a row, each with this status.
    Burst(usize, u16),
    /// A GET with basic auth (user, password; "" for none), over TLS or not.
    Auth(bool, &'static str, &'static str, u16),
}

/// The toolkit's answer for a file: refused at start (with what the
/// exporter's message must say), or served, with checks.
#[derive(Debug)]
enum Want {
    Refuse(&'static [&'static str]),
    Serve(&'static [Check]),
}

use Check::*;
use Outcome::*;
use Want::*;

const TLS12: &[&str] = &["--tls-max", "1.2"];

/// Every file of the toolkit's web/testdata, with its answer there: from
/// its tls_config_test.go where a test uses the file, from its
/// ConfigToTLSConfig and Go's servers where none does
/// (`web_config_auth_clientCAs_missing.bad.yml` starts there: a verifying
/// policy without a CA file verifies against the system's CAs;
/// `tls_config_noAuth.requireanyclientcertkeyinline.good.yml` has no test
/// of its own).
fn table() -> Vec<(&'static str, Want)> {
    vec![
        (
            "tls_config_noAuth.requireandverifyclientcert.good.yml",
            Serve(&[
                Tls(Some("client_selfsigned"), &[], Status(200)),
                Tls(None, &[], Refused),
                Tls(Some("client2_selfsigned"), &[], Refused),
            ]),
        ),
        (
            "tls_config_noAuth.requireanyclientcert.good.yml",
            Serve(&[
                Tls(Some("client_selfsigned"), &[], Status(200)),
                Tls(Some("client2_selfsigned"), &[], Status(200)),
                Tls(None, &[], Refused),
            ]),
        ),
        (
            "tls_config_noAuth.requireanyclientcertkeyinline.good.yml",
            Serve(&[Tls(Some("client_selfsigned"), &[], Status(200))]),
        ),
        (
            "web_config_auth_clientCAs_invalid.bad.yml",
            // The toolkit names the missing file; the file has no policy
            // either, which is checked first here.
            Refuse(&["a client CA is configured without a client auth policy"]),
        ),
        (
            "web_config_auth_clientCAs_missing.bad.yml",
            Serve(&[
                Tls(None, &[], Refused),
                Tls(Some("client_selfsigned"), &[], Refused),
            ]),
        ),
        (
            "web_config_auth_client_san.bad.yaml",
            Serve(&[Tls(Some("client2_selfsigned"), &[], Refused)]),
        ),
        (
            "web_config_auth_client_san.good.yaml",
            Serve(&[
                Tls(Some("client2_selfsigned"), &[], Status(200)),
                Tls(Some("client_selfsigned"), &[], Refused),
            ]),
        ),
        (
            "web_config_auth_user_list_invalid.bad.yml",
            Refuse(&["basic_auth_users.john: not a bcrypt hash"]),
        ),
        ("web_config_empty.yml", Serve(&[Plain(Status(200))])),
        (
            "web_config_headers.good.yml",
            Serve(&[
                Plain(Status(200)),
                Header("X-Frame-Options", "deny"),
                Header("X-Content-Type-Options", "nosniff"),
                Header("X-XSS-Protection", "1"),
                Header(
                    "Strict-Transport-Security",
                    "max-age=31536000; includeSubDomains",
                ),
                Header(
                    "Content-Security-Policy",
                    "default-src 'self' *.test.example.net",
                ),
            ]),
        ),
        (
            "web_config_headers_content_type_options.bad.yml",
            Refuse(&["http_server_config.headers.X-Content-Type-Options: expected one of nosniff"]),
        ),
        (
            "web_config_headers_extra_header.bad.yml",
            Refuse(&["http_server_config.headers: `Content-Type` cannot be configured"]),
        ),
        (
            "web_config_headers_frame_options.bad.yml",
            Refuse(&[
                "http_server_config.headers.X-Frame-Options: expected one of deny, sameorigin",
            ]),
        ),
        ("web_config_junk.yml", Refuse(&["expected a map with"])),
        (
            "web_config_junk_key.yml",
            Refuse(&["tls_server_config: unknown key `cert_filse`"]),
        ),
        (
            "web_config_noAuth.bad.yml",
            Refuse(&["a client CA is configured without a client auth policy"]),
        ),
        (
            "web_config_noAuth.good.blocking.yml",
            Serve(&[Tls(None, &[], Refused)]),
        ),
        (
            "web_config_noAuth.good.yml",
            Serve(&[
                Tls(None, &[], Status(200)),
                Tls(Some("client_selfsigned"), &[], Refused),
                // An HTTP request to the HTTPS port gets Go's 400.
                Plain(Status(400)),
            ]),
        ),
        (
            "web_config_noAuth_allCiphers.good.yml",
            Serve(&[Tls(None, &[], Status(200)), Tls(None, TLS12, Status(200))]),
        ),
        (
            "web_config_noAuth_allCurves.good.yml",
            Serve(&[
                Tls(None, &[], Status(200)),
                Tls(None, &["--curves", "P-521"], Status(200)),
            ]),
        ),
        (
            "web_config_noAuth_certPath_empty.bad.yml",
            Refuse(&["tls_server_config.cert_file: missing"]),
        ),
        (
            "web_config_noAuth_certPath_invalid.bad.yml",
            Refuse(&["tls_server_config.cert_file", "No such file"]),
        ),
        (
            "web_config_noAuth_certPath_keyPath_empty.bad.yml",
            Refuse(&["tls_server_config.client_auth_type: expected one of"]),
        ),
        (
            "web_config_noAuth_certPath_keyPath_invalid.bad.yml",
            Refuse(&["tls_server_config.cert_file", "No such file"]),
        ),
        (
            "web_config_noAuth_cert_empty.bad.yml",
            Refuse(&["tls_server_config.cert_file: missing"]),
        ),
        (
            "web_config_noAuth_inventedCiphers.bad.yml",
            Refuse(&["tls_server_config.cipher_suites: item 1 is not a known name"]),
        ),
        (
            "web_config_noAuth_inventedCurves.bad.yml",
            Refuse(&["tls_server_config.curve_preferences: item 1 is not a known name"]),
        ),
        (
            "web_config_noAuth_keyPath_empty.bad.yml",
            Refuse(&["tls_server_config.key_file: missing"]),
        ),
        (
            "web_config_noAuth_keyPath_invalid.bad.yml",
            Refuse(&["tls_server_config.cert_file", "No such file"]),
        ),
        (
            "web_config_noAuth_key_empty.bad.yml",
            Refuse(&["tls_server_config.key_file: missing"]),
        ),
        (
            "web_config_noAuth_noHTTP2.good.yml",
            Serve(&[
                Tls(None, &[], Cipher("ECDHE-RSA-AES256-GCM-SHA384")),
                Tls(
                    None,
                    &[
                        "--tls-max",
                        "1.2",
                        "--ciphers",
                        "ECDHE-RSA-AES128-GCM-SHA256",
                    ],
                    Refused,
                ),
            ]),
        ),
        (
            "web_config_noAuth_noHTTP2Cipher.bad.yml",
            Refuse(&[
                "tls_server_config.cipher_suites",
                "Go's HTTP/2 server requires",
            ]),
        ),
        (
            "web_config_noAuth_someCiphers.good.yml",
            Serve(&[
                Tls(
                    None,
                    &["--ciphers", "ECDHE-RSA-AES128-GCM-SHA256"],
                    Cipher("ECDHE-RSA-AES128-GCM-SHA256"),
                ),
                Tls(None, &["--ciphers", "ECDHE-RSA-AES256-SHA"], Refused),
                // prefer_server_cipher_suites (true by default): the
                // server's order wins over the client's.
                Tls(
                    None,
                    &[
                        "--ciphers",
                        "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256",
                    ],
                    Cipher("ECDHE-RSA-AES128-GCM-SHA256"),
                ),
            ]),
        ),
        (
            "web_config_noAuth_someCiphers_noOrder.good.yml",
            Serve(&[
                // prefer_server_cipher_suites: false: the client's order.
                Tls(
                    None,
                    &[
                        "--ciphers",
                        "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384",
                    ],
                    Cipher("ECDHE-RSA-AES128-GCM-SHA256"),
                ),
                Tls(
                    None,
                    &[
                        "--ciphers",
                        "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256",
                    ],
                    Cipher("ECDHE-RSA-AES256-GCM-SHA384"),
                ),
            ]),
        ),
        (
            "web_config_noAuth_someCurves.good.yml",
            Serve(&[
                Tls(None, &["--curves", "P-521"], Status(200)),
                Tls(None, &["--curves", "P-384"], Refused),
            ]),
        ),
        (
            "web_config_noAuth_tlsInline.good.yml",
            Serve(&[Tls(None, &[], Status(200))]),
        ),
        (
            "web_config_noAuth_wrongTLSVersion.bad.yml",
            Refuse(&["tls_server_config.min_version: expected TLS12 or TLS13"]),
        ),
        (
            "web_config_rate_limiter_nonblocking.yaml",
            Serve(&[Burst(11, 200)]),
        ),
        (
            "web_config_rate_limiter_one_second.yaml",
            // burst 0: Go's limiter allows nothing.
            Serve(&[Burst(11, 429)]),
        ),
        (
            "web_config_users.good.yml",
            Serve(&[
                Auth(true, "", "", 401),
                Auth(true, "dave", "dave123", 200),
                Auth(true, "dave", "bad", 401),
            ]),
        ),
        (
            "web_config_users_noTLS.good.yml",
            Serve(&[
                Auth(false, "", "", 401),
                Auth(false, "dave", "dave123", 200),
            ]),
        ),
    ]
}

/// The exporter started with a web configuration: serving, or refused.
struct Run {
    child: Child,
    addr: Option<SocketAddr>,
    log: Arc<Mutex<String>>,
}

impl Run {
    fn start(dir: &Path, web: &Path) -> Run {
        let probe = dir.join("probe");
        std::fs::create_dir_all(&probe).unwrap();
        let mut child = Command::new(BIN)
            .args(["--web.listen-address", "127.0.0.1:0"])
            .args(fast_probe_args(&format!("t={}", probe.display())))
            .arg("--web.config.file")
            .arg(web)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("listening")
                        && let Some(rest) = line.split("address=").nth(1)
                    {
                        let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                    }
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(a) = rx.try_recv() {
                return Run {
                    child,
                    addr: Some(a.parse().unwrap()),
                    log,
                };
            }
            if child.try_wait().unwrap().is_some() {
                // Let the reader take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Run {
                    child,
                    addr: None,
                    log,
                };
            }
            assert!(
                Instant::now() < deadline,
                "neither serving nor refused: {}",
                log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn need_curl() -> bool {
    if Command::new("curl").arg("--version").output().is_ok() {
        return true;
    }
    cannot_run_current(Part::Tools, "curl is not installed");
    false
}

/// What curl got: the HTTP status (None when no answer came), the
/// negotiated cipher (from `-v`), the response head and curl's stderr.
struct Got {
    status: Option<u16>,
    cipher: Option<String>,
    head: String,
    stderr: String,
}

/// One curl GET; `extra` go before the URL. Certificates of the server are
/// not checked (`-k`): these checks are about the server's settings, and
/// the toolkit's server certificate lacks the key usage OpenSSL asks of
/// an RSA key exchange.
fn curl(url: &str, extra: &[&str]) -> Got {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-v",
            "-k",
            "--max-time",
            "20",
            "-D",
            "-",
            "-o",
            "/dev/null",
        ])
        .args(["-w", "\nstatus=%{http_code}\n"])
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let status = stdout
        .lines()
        .find_map(|l| l.strip_prefix("status="))
        .and_then(|s| s.trim().parse().ok())
        .filter(|s| *s != 0);
    let cipher = stderr
        .lines()
        .find_map(|l| l.split("SSL connection using ").nth(1))
        .and_then(|s| s.split(" / ").nth(1))
        .map(|s| s.trim().to_string());
    Got {
        status,
        cipher,
        head: stdout,
        stderr,
    }
}

fn cert_args(dir: &Path, name: Option<&str>) -> Vec<String> {
    match name {
        Some(n) => vec![
            "--cert".into(),
            dir.join(format!("{n}.pem")).display().to_string(),
            "--key".into(),
            dir.join(format!("{n}.key")).display().to_string(),
        ],
        None => Vec::new(),
    }
}

/// Runs one check; a description of the difference if it fails.
fn check(addr: SocketAddr, c: &Check) -> Result<(), String> {
    let port = addr.port();
    let https = format!("https://127.0.0.1:{port}/healthz");
    let http = format!("http://127.0.0.1:{port}/healthz");
    let data = Path::new(TESTDATA);
    let outcome = |got: &Got, want: Outcome| -> Result<(), String> {
        let ok = match want {
            Status(s) => got.status == Some(s),
            Refused => got.status.is_none() && !got.stderr.contains("Connection refused"),
            Cipher(name) => got.status == Some(200) && got.cipher.as_deref() == Some(name),
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "wanted {want:?}, got status {:?} cipher {:?}; curl: {}",
                got.status,
                got.cipher,
                got.stderr
                    .lines()
                    .filter(|l| l.starts_with("curl:") || l.contains("SSL") || l.contains("alert"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ))
        }
    };
    match *c {
        Plain(want) => outcome(&curl(&http, &[]), want),
        Tls(cert, extra, want) => {
            let mut args: Vec<String> = cert_args(data, cert);
            args.extend(extra.iter().map(|s| s.to_string()));
            if matches!(want, Cipher(_)) && !extra.contains(&"--tls-max") {
                args.extend(["--tls-max".to_string(), "1.2".to_string()]);
            }
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            outcome(&curl(&https, &refs), want)
        }
        Header(name, value) => {
            let got = curl(&http, &[]);
            let found = got.head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            });
            if found.as_deref() == Some(value) {
                Ok(())
            } else {
                Err(format!("header {name}: wanted {value:?}, got {found:?}"))
            }
        }
        Burst(n, status) => {
            let got: Vec<Option<u16>> = (0..n).map(|_| curl(&http, &[]).status).collect();
            if got.iter().all(|s| *s == Some(status)) {
                Ok(())
            } else {
                Err(format!("{n} requests: wanted {status} each, got {got:?}"))
            }
        }
        Auth(tls, user, password, status) => {
            let url = if tls { &https } else { &http };
            let cred = format!("{user}:{password}");
            let args: Vec<&str> = if user.is_empty() {
                vec![]
            } else {
                vec!["-u", &cred]
            };
            outcome(&curl(url, &args), Status(status))
        }
    }
}

/// Every file of the toolkit's web/testdata gets the toolkit's answer.
#[test]
fn every_exporter_toolkit_testdata_file_gets_the_toolkits_answer() {
    if !need_curl() {
        return;
    }
    let table = table();
    let mut on_disk: Vec<String> = std::fs::read_dir(TESTDATA)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yml") || n.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = table.iter().map(|(f, _)| f.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "the table lists every testdata file once");

    let mut failures = Vec::new();
    for (file, want) in &table {
        let dir = tempfile::tempdir().unwrap();
        let run = Run::start(dir.path(), &Path::new(TESTDATA).join(file));
        let verdict = match (want, run.addr) {
            (Refuse(wants), None) => {
                let log = run.log();
                let missing: Vec<&&str> = wants.iter().filter(|w| !log.contains(**w)).collect();
                if missing.is_empty() {
                    Ok("refused".to_string())
                } else {
                    Err(format!("refused, but {missing:?} not in: {log}"))
                }
            }
            (Refuse(_), Some(_)) => Err(format!("served; the toolkit refuses it: {}", run.log())),
            (Serve(_), None) => Err(format!("refused; the toolkit serves it: {}", run.log())),
            (Serve(checks), Some(addr)) => {
                let errs: Vec<String> = checks
                    .iter()
                    .filter_map(|c| check(addr, c).err().map(|e| format!("{c:?}: {e}")))
                    .collect();
                if errs.is_empty() {
                    Ok(format!("served, {} client checks pass", checks.len()))
                } else {
                    Err(errs.join("\n    "))
                }
            }
        };
        if run.addr.is_some() {
            run.stop();
        } else {
            let mut child = run.child;
            let status = child.wait().unwrap();
            if verdict.is_ok() {
                assert_eq!(status.code(), Some(2), "{file}: refused with exit status 2");
            }
            assert!(dir_entries(&dir.path().join("probe")).is_empty(), "{file}");
        }
        match verdict {
            Ok(what) => eprintln!("agree  {file}: {what}"),
            Err(e) => {
                eprintln!("DIFFER {file}: {e}");
                failures.push(file.to_string());
            }
        }
    }
    eprintln!(
        "{}/{} exporter-toolkit testdata files get the toolkit's answer",
        table.len() - failures.len(),
        table.len()
    );
    assert!(failures.is_empty(), "differ: {failures:?}");
}

/// Runs the openssl CLI; panics with its stderr on failure.
fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("the openssl CLI is needed to make the test certificates");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A P-256 key and a certificate in `dir`: self-signed when `ca` is None
/// (a CA when `is_ca`), else signed by `ca` (its name in `dir`), with the
/// extensions given.
fn make(dir: &Path, name: &str, ca: Option<&str>, is_ca: bool, ext: &str) -> (String, String) {
    let crt = dir.join(format!("{name}.crt")).display().to_string();
    let key = dir.join(format!("{name}.key")).display().to_string();
    let ext_file = dir.join(format!("{name}.ext"));
    let basic = if is_ca {
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
    } else {
        "basicConstraints=critical,CA:FALSE\n"
    };
    std::fs::write(&ext_file, format!("{basic}{ext}")).unwrap();
    let ext_path = ext_file.display().to_string();
    let subj = format!("/CN={name}");
    match ca {
        None => openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &subj,
            "-keyout",
            &key,
            "-out",
            &crt,
            "-extensions",
            "v3",
            "-config",
            &{
                let cfg = dir.join(format!("{name}.cnf"));
                std::fs::write(
                    &cfg,
                    format!("[req]\ndistinguished_name=dn\n[dn]\n[v3]\n{basic}{ext}"),
                )
                .unwrap();
                cfg.display().to_string()
            },
        ]),
        Some(ca) => {
            let csr = dir.join(format!("{name}.csr")).display().to_string();
            openssl(&[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &subj,
                "-keyout",
                &key,
                "-out",
                &csr,
            ]);
            let ca_crt = dir.join(format!("{ca}.crt")).display().to_string();
            let ca_key = dir.join(format!("{ca}.key")).display().to_string();
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_crt,
                "-CAkey",
                &ca_key,
                "-set_serial",
                "7",
                "-days",
                "2",
                "-extfile",
                &ext_path,
                "-out",
                &crt,
            ]);
        }
    }
    (crt, key)
}

/// What a curl outcome was, for the log: the status, or curl's error.
fn describe(g: &Got) -> String {
    match g.status {
        Some(s) => format!("HTTP {s}"),
        None => g
            .stderr
            .lines()
            .find(|l| l.starts_with("curl:"))
            .unwrap_or("no answer")
            .to_string(),
    }
}

/// Mutual TLS with `RequireAndVerifyClientCert`, checked with curl: no
/// client certificate and one from another CA are refused in the
/// handshake, the CA's own client is served; `client_allowed_sans` refuses
/// that client until one of its names is listed. Each change is made by
/// SIGHUP, as are a change of policy (`VerifyClientCertIfGiven`) and the
/// response headers and rate limit.
#[test]
fn mutual_tls_with_curl_and_every_key_reloaded_by_sighup() {
    if !need_curl() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (server_crt, _) = make(
        d,
        "server",
        None,
        false,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    );
    make(d, "ca", None, true, "");
    make(d, "other-ca", None, true, "");
    let client_ext = "subjectAltName=DNS:scraper.example,email:prom@example.org,\
                      URI:spiffe://example.org/prometheus,IP:192.0.2.7\n\
                      extendedKeyUsage=clientAuth\n";
    let (good_crt, good_key) = make(d, "client", Some("ca"), false, client_ext);
    let (bad_crt, bad_key) = make(d, "stranger", Some("other-ca"), false, client_ext);

    let web = d.join("web.yml");
    let write = |policy: &str, extra: &str| {
        std::fs::write(
            &web,
            format!(
                "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
                 client_auth_type: {policy}\n  client_ca_file: ca.crt\n{extra}"
            ),
        )
        .unwrap();
    };
    write("RequireAndVerifyClientCert", "");
    let run = Run::start(d, &web);
    let addr = run.addr.unwrap_or_else(|| panic!("refused: {}", run.log()));
    let url = format!("https://127.0.0.1:{}/metrics", addr.port());
    let get = |cert: Option<(&str, &str)>, extra: &[&str]| {
        let mut args = vec!["--cacert", server_crt.as_str()];
        if let Some((c, k)) = cert {
            args.extend(["--cert", c, "--key", k]);
        }
        args.extend(extra);
        // `-k` is not wanted here: curl checks the server against its
        // certificate.
        let out = Command::new("curl")
            .args([
                "-sS",
                "-v",
                "--max-time",
                "20",
                "-D",
                "-",
                "-o",
                "/dev/null",
            ])
            .args(["-w", "\nstatus=%{http_code}\n"])
            .args(&args)
            .arg(&url)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        Got {
            status: stdout
                .lines()
                .find_map(|l| l.strip_prefix("status="))
                .and_then(|s| s.trim().parse().ok())
                .filter(|s| *s != 0),
            cipher: None,
            head: stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let good = Some((good_crt.as_str(), good_key.as_str()));
    let stranger = Some((bad_crt.as_str(), bad_key.as_str()));
    let expect = |what: &str, got: Got, want: Option<u16>| {
        eprintln!("{what}: {}", describe(&got));
        assert_eq!(got.status, want, "{what}: {}", got.stderr);
        got
    };

    expect(
        "RequireAndVerifyClientCert, no client certificate",
        get(None, &[]),
        None,
    );
    expect(
        "RequireAndVerifyClientCert, a certificate from another CA",
        get(stranger, &[]),
        None,
    );
    expect(
        "RequireAndVerifyClientCert, over TLS 1.2, a certificate from another CA",
        get(stranger, &["--tls-max", "1.2"]),
        None,
    );
    expect(
        "RequireAndVerifyClientCert, the CA's client",
        get(good, &[]),
        Some(200),
    );
    expect(
        "RequireAndVerifyClientCert, over TLS 1.2, the CA's client",
        get(good, &["--tls-max", "1.2"]),
        Some(200),
    );

    let reload = |n: usize| {
        run.signal(libc::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(20);
        while run.log().matches("web configuration reloaded").count() < n {
            assert!(Instant::now() < deadline, "{}", run.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    write(
        "RequireAndVerifyClientCert",
        "  client_allowed_sans: [other.example, 192.0.2.8]\n",
    );
    reload(1);
    expect(
        "client_allowed_sans without the client's names, the CA's client",
        get(good, &[]),
        None,
    );
    for (n, san) in [
        (2, "scraper.example"),
        (3, "prom@example.org"),
        (4, "spiffe://example.org/prometheus"),
        (5, "192.0.2.7"),
    ] {
        write(
            "RequireAndVerifyClientCert",
            &format!("  client_allowed_sans: [other.example, \"{san}\"]\n"),
        );
        reload(n);
        expect(
            &format!("client_allowed_sans with {san}, the CA's client"),
            get(good, &[]),
            Some(200),
        );
        expect(
            &format!("client_allowed_sans with {san}, no client certificate"),
            get(None, &[]),
            None,
        );
    }

    write(
        "VerifyClientCertIfGiven",
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n\
         rate_limit:\n  interval: 1h\n  burst: 3\n",
    );
    reload(6);
    let got = expect(
        "VerifyClientCertIfGiven, no client certificate",
        get(None, &[]),
        Some(200),
    );
    assert!(got.head.contains("x-frame-options: deny"), "{}", got.head);
    expect(
        "VerifyClientCertIfGiven, a certificate from another CA",
        get(stranger, &[]),
        None,
    );
    // The third request of a burst of 3 (the refused one above counted
    // none: it never reached HTTP), then the bucket is empty.
    expect(
        "VerifyClientCertIfGiven, the CA's client",
        get(good, &[]),
        Some(200),
    );
    expect(
        "VerifyClientCertIfGiven, the CA's client",
        get(good, &[]),
        Some(200),
    );
    let got = expect("rate_limit burst 3 spent", get(good, &[]), Some(429));
    assert!(!got.head.contains("x-frame-options"), "{}", got.head);
    run.stop();
}
