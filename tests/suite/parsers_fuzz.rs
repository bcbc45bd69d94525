//! Property tests: the parsers of everything the exporter reads from outside
//! (its config file, flags, DSNs, password files, mountinfo, cgroup and
//! diskstats files, the AWS EBS NVMe log page) never panic, whatever bytes
//! they get.

use std::path::Path;

use pg_storage_exporter::limits::{cgroup, diskstats, ebs};
use pg_storage_exporter::postgres::dsn;
use pg_storage_exporter::{config, units};
use proptest::prelude::*;

/// Text that looks like the files being parsed: digits, colons, `=`,
/// keywords, spaces and newlines, plus arbitrary characters.
fn texty() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,200}",
        "([0-9]{1,3}:[0-9]{1,3}( [a-z]{1,6}=([0-9]{1,20}|max))*\n){0,5}",
        "([0-9]{1,3}:[0-9]{1,3} (Read|Write|Total|Sync) [0-9]{0,25}\n){0,5}",
        "(( *[0-9]{1,4}){3} [a-z0-9]{1,8}( [0-9]{1,22}){0,18}\n){0,4}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn cgroup_and_diskstats_parsers_never_panic(t in texty()) {
        let _ = cgroup::parse_io_max(&t);
        let _ = cgroup::parse_io_stat(&t);
        let _ = cgroup::parse_v1_throttle(&t);
        let _ = cgroup::parse_v1_serviced(&t);
        let _ = cgroup::parse_pressure(&t);
        let _ = cgroup::parse_proc_cgroup(&t);
        let _ = diskstats::parse(&t);
    }

    #[test]
    fn dsn_and_passfile_parsers_never_panic(t in ".{0,200}", host in ".{0,20}", port in any::<u16>()) {
        let _ = dsn::parse(&t);
        let _ = dsn::split_name(&t);
        let _ = dsn::target(&t, &|_| None, None);
        let _ = dsn::pgpass_lookup(&t, &host, port, "db", "u");
    }

    /// A password of characters libpq's syntax gives a meaning, and a
    /// marker, in each place a DSN holds one: whatever the DSN becomes (a
    /// target or an error), what the exporter would print of it never
    /// shows the marker.
    #[test]
    fn dsn_errors_and_targets_never_show_a_password(
        pieces in proptest::collection::vec(
            prop_oneof![
                Just(" "), Just("'"), Just("\\"), Just("@"), Just("/"), Just("?"), Just("#"),
                Just("%"), Just("%4"), Just("%41"), Just("%00"), Just(":"), Just(","), Just("="),
                Just("&"), Just("["), Just("]"), Just("QZXJ"), Just("QZXJ7"),
            ],
            1..10,
        ),
        shape in 0usize..5,
    ) {
        let pw: String = pieces.concat();
        let dsn = match shape {
            0 => format!("host=h user=u password={pw} dbname=d"),
            1 => format!("host=h user=u password='{pw}' dbname=d"),
            2 => format!("postgresql://u:{pw}@h:5432/d"),
            3 => format!("postgresql://u@h/d?password={pw}&sslmode=disable"),
            _ => format!("postgresql://u:{pw}@h1,h2:5433/d?sslmode=disable"),
        };
        let shown = match dsn::target(&dsn, &|_| None, None) {
            Ok(t) => t.display,
            Err(e) => e.to_string(),
        };
        prop_assert!(!shown.contains("QZXJ"), "{}: {}", dsn, shown);
    }

    #[test]
    fn units_never_panic(t in ".{0,40}") {
        let _ = units::parse_bytes(&t);
        let _ = units::parse_duration(&t);
        let _ = config::split_name(&t);
        let _ = config::validate_name(&t);
    }

    #[test]
    fn config_parser_never_panics_and_errors_have_a_line(t in prop_oneof![
        ".{0,300}",
        "(\\[\\[volume\\]\\]\n)?([a-z_]{1,20} = (\"[a-z0-9/ ]{0,12}\"|[0-9]{1,5}|\\[\\])\n){0,6}",
    ]) {
        let file = Path::new("/x.toml");
        if let Err(e) = config::raw::parse(file, &t) {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("/x.toml:"), "{}", msg);
        }
    }

    /// The AWS EBS statistics page comes from a device's firmware: any
    /// bytes, of any length, are a page or a refusal, never a panic. Half
    /// the cases start from a valid page with bytes flipped, so the bin
    /// checks past the magic are reached too.
    #[test]
    fn ebs_log_page_parser_never_panics(
        raw in proptest::collection::vec(any::<u8>(), 0..4200),
        flips in proptest::collection::vec((0usize..4096, any::<u8>()), 0..16),
        start_valid in any::<bool>(),
    ) {
        let mut b = if start_valid {
            let bins: Vec<ebs::page::Bin> = (0..8)
                .map(|i| ebs::page::Bin { lower_us: i * 100, upper_us: (i + 1) * 100, count: 3 })
                .collect();
            ebs::page::build(0, &ebs::page::Counters::default(), &bins, &bins)
        } else {
            raw
        };
        for (at, v) in flips {
            if let Some(x) = b.get_mut(at) {
                *x = v;
            }
        }
        if let Ok(p) = ebs::page::parse(&b) {
            prop_assert!(p.read_latency.len() <= 64 && p.write_latency.len() <= 64);
        }
    }

    /// `--web.config.file` is read again on every SIGHUP: garbage must be a
    /// refusal naming the file, never a panic.
    #[test]
    fn web_config_parser_never_panics_and_errors_name_the_file(t in prop_oneof![
        ".{0,200}",
        "(tls_server_config:\n|basic_auth_users:\n)?(  [a-z_]{1,16}: [a-zA-Z0-9/.$ ]{0,20}\n){0,5}",
    ]) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, &t).unwrap();
        if let Err(e) = pg_storage_exporter::http::web_config::load(&path) {
            let msg = format!("{e:#}");
            prop_assert!(msg.contains("web.yml"), "{}", msg);
        }
    }
}

#[test]
fn mountinfo_lookup_survives_garbage_fixtures() {
    use pg_storage_exporter::probe::fsinfo::{Roots, lookup};
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("self")).unwrap();
    for garbage in [
        "",
        "\n\n",
        "1 2 3",
        "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\nbroken line\n",
        "\u{0}\u{1}\u{2}",
    ] {
        std::fs::write(dir.path().join("self/mountinfo"), garbage).unwrap();
        let roots = Roots {
            proc: dir.path().to_path_buf(),
            sys: dir.path().to_path_buf(),
        };
        let info = lookup(Path::new("/"), &roots);
        assert!(!info.fstype.is_empty());
    }
}
