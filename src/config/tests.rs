use super::*;

fn parse_str(text: &str) -> Result<Config, ConfigError> {
    let file = Path::new("/etc/pg-storage-exporter.toml");
    let raw = raw::parse(file, text)?;
    build(Some((file, text)), raw, &FlagOverrides::default())
}

#[test]
fn misspelt_key_names_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "window = \"5m\"\n\n[[volume]]\nname = \"wal\"\npath = \"{}\"\nintervall = \"1s\"\n",
        dir.path().display()
    );
    let e = parse_str(&text).unwrap_err().to_string();
    assert!(
        e.starts_with("/etc/pg-storage-exporter.toml:6:1: volume[0].intervall: "),
        "{e}"
    );
    assert!(e.contains("unknown field `intervall`"), "{e}");
    assert!(e.contains("`interval`"), "suggests the valid keys: {e}");
}

/// Each config text fails with one error holding each expected substring.
fn assert_errors(cases: Vec<(String, Vec<&str>)>) {
    for (text, wants) in cases {
        let e = parse_str(&text).map(|_| ()).unwrap_err().to_string();
        for want in wants {
            assert!(
                e.contains(want),
                "config:\n{text}\nerror: {e}\nwanted: {want}"
            );
        }
    }
}

/// TOML the keys do not take (unknown or missing keys, values of the wrong
/// form): the error names the line, the column and the key.
#[test]
fn syntax_and_value_errors_name_line_column_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().display().to_string();
    let vol = |extra: &str| format!("[[volume]]\nname = \"v\"\npath = \"{p}\"\n{extra}\n");
    // (config text, expected substrings of the one error)
    assert_errors(vec![
        (
            "windw = \"5m\"\n".to_string(),
            vec![":1:1: windw: unknown field `windw`"],
        ),
        (
            "window = \"5 minutes\"\n".to_string(),
            vec![":1:10: window: invalid duration \"5 minutes\": unknown unit \"minutes\""],
        ),
        (
            "window = 300\n".to_string(),
            vec![":1:10: window: invalid duration 300: write it as a string with a unit"],
        ),
        (
            vol("sync_method = \"fdatasnc\""),
            vec![
                ":4:15: volume[0].sync_method: unknown variant `fdatasnc`",
                "`open_datasync`",
            ],
        ),
        (
            vol("engine = \"uring\""),
            vec![
                ":4:10: volume[0].engine: unknown variant `uring`",
                "`io_uring`",
            ],
        ),
        (
            vol("read_file_size = \"64 parsecs\""),
            vec![":4:18: volume[0].read_file_size: invalid size \"64 parsecs\": unknown unit"],
        ),
        (
            vol("probes = [\"write\"]"),
            vec!["volume[0].probes[0]: unknown variant `write`, expected `commit` or `read`"],
        ),
        (
            "[[volume]]\nname = \"v\"\n".to_string(),
            vec!["missing field `path`"],
        ),
        ("window = \"5m\n".to_string(), vec![":1:"]),
    ]);
}

/// Values of the right form that are out of range or refused: the error
/// names the line and the key, and says what is allowed.
#[test]
fn invalid_values_name_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().display().to_string();
    let vol = |extra: &str| format!("[[volume]]\nname = \"v\"\npath = \"{p}\"\n{extra}\n");
    let missing_password_file = format!(
        ":4: cluster[0].password_file: password file {p}/missing: No such file or directory"
    );
    assert_errors(vec![
        (
            "window = \"1s\"\n".to_string(),
            vec![":1: window: 1s is out of range: use 10s to 24h"],
        ),
        (
            vol("interval = \"0ms\""),
            vec![":4: volume[0].interval: 0ns is out of range: use 1ms to 1h"],
        ),
        (
            vol("read_file_size = \"100KiB\""),
            vec![":4: volume[0].read_file_size: 100KiB is out of range: use 1MiB to 1TiB"],
        ),
        (vol("probes = []"), vec![":4: volume[0].probes: empty list"]),
        (
            vol("cache_served_threshold = \"5ms\""),
            vec![":4: volume[0].cache_served_threshold: 5ms is too long"],
        ),
        (
            format!("[[volume]]\nname = \"bad name\"\npath = \"{p}\"\n"),
            vec![":2: volume[0].name: invalid volume name \"bad name\": character ' ' not allowed"],
        ),
        (
            "[[volume]]\nname = \"v\"\npath = \"/nonexistent/pgwal\"\n".to_string(),
            vec![":3: volume[0].path: path /nonexistent/pgwal: No such file or directory"],
        ),
        (
            format!("{}{}", vol(""), vol("")),
            vec![":6: volume.name: duplicate volume name \"v\""],
        ),
        (
            "shutdown_timeout = \"1us\"\n".to_string(),
            vec![":1: shutdown_timeout: 1µs is out of range: use 100ms to 5m"],
        ),
        (
            "[defaults]\ninterval = \"2h\"\n".to_string(),
            vec![":2: defaults.interval: 7200s is out of range"],
        ),
        (
            format!("window = \"24h\"\n{}", vol("interval = \"10ms\"")),
            vec![
                "window: a 86400s window at a 10ms interval and a 40s busy_every keeps up to 8640000 samples per op",
            ],
        ),
        (
            format!("window = \"1h\"\n{}", vol("busy_every = \"10s\"")),
            vec![
                "window: a 3600s window at a 3s interval and a 10s busy_every keeps up to 184320 samples per op",
            ],
        ),
        (
            format!(
                "[[cluster]]\nname = \"main\"\ndsn = \"host=/run/postgresql user=mon\"\n\
                 password_file = \"{p}/missing\"\n"
            ),
            vec![&missing_password_file],
        ),
    ]);
}

#[test]
fn a_nul_byte_in_any_path_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().display().to_string();
    let vol = |extra: &str| format!("[[volume]]\nname = \"v\"\npath = \"{p}\"\n{extra}\n");
    assert_errors(vec![
        // A NUL byte (TOML's \u0000) in any path: its key named, the byte
        // shown escaped.
        (
            vol("probe_dir = \"/srv/pr\\u0000be\""),
            vec![":4: volume[0].probe_dir: the path /srv/pr\\0be contains a NUL byte"],
        ),
        (
            "[[volume]]\nname = \"v\"\npath = \"/srv/v\\u0000\"\n".to_string(),
            vec![":3: volume[0].path: the path /srv/v\\0 contains a NUL byte"],
        ),
        (
            "host_root = \"/h\\u0000\"\n".to_string(),
            vec![":1: host_root: the path /h\\0 contains a NUL byte"],
        ),
        (
            "[[cluster]]\nname = \"m\"\ndsn = \"host=/run/postgresql\"\npassword_file = \"/p\\u0000w\"\n"
                .to_string(),
            vec![":4: cluster[0].password_file: the path /p\\0w contains a NUL byte"],
        ),
    ]);
}

#[test]
fn wrong_types_are_said_in_words_and_count_as_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().display().to_string();
    let vol = |extra: &str| format!("[[volume]]\nname = \"v\"\npath = \"{p}\"\n{extra}\n");
    let cluster = |extra: &str| {
        format!("[[cluster]]\nname = \"c\"\ndsn = \"host=/run/postgresql\"\n{extra}\n")
    };
    // (config text, the whole message after the file name)
    let cases = [
        (
            vol("provisioned_iops = \"3000\""),
            ":4:20: volume[0].provisioned_iops: expected a whole number (e.g. 3000), \
             found the string \"3000\": write it without quotes",
        ),
        (
            vol("provisioned_iops = 1.5"),
            ":4:20: volume[0].provisioned_iops: expected a whole number (e.g. 3000), \
             found the number 1.5",
        ),
        (
            cluster("discover_volumes = \"yes\""),
            ":4:20: cluster[0].discover_volumes: expected true or false (without quotes), \
             found the string \"yes\"",
        ),
        (
            cluster("discover_volumes = \"false\""),
            ":4:20: cluster[0].discover_volumes: expected true or false (without quotes), \
             found the string \"false\": write it without quotes",
        ),
        (
            "[[volume]]\nname = 5\npath = \"/\"\n".to_string(),
            ":2:8: volume[0].name: expected a string in double quotes (e.g. \"main\"), \
             found the number 5",
        ),
        (
            vol("probe_dir = 5"),
            ":4:13: volume[0].probe_dir: expected a path in double quotes \
             (e.g. \"/var/lib/postgresql\"), found the number 5",
        ),
        (
            vol("probes = \"read\""),
            ":4:10: volume[0].probes: expected a list in square brackets \
             (e.g. [\"commit\", \"read\"]), found the string \"read\"",
        ),
        (
            vol("interval = true"),
            ":4:12: volume[0].interval: expected a duration in double quotes \
             (e.g. \"1s\" or \"500ms\"), found true",
        ),
        (
            vol("read_file_size = [1]"),
            ":4:18: volume[0].read_file_size: expected a size (e.g. \"64MiB\") or a whole \
             number of bytes, found a list",
        ),
    ];
    for (text, want) in cases {
        let e = parse_str(&text).map(|_| ()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("/etc/pg-storage-exporter.toml{want}"),
            "config:\n{text}"
        );
        assert_eq!(e.cause(), "invalid", "{e}");
    }
    // The shape of the file stays a syntax error.
    for text in [
        "windw = \"5m\"\n",
        "window = \"5m\n",
        "[[volume]]\nname = \"v\"\n",
    ] {
        let e = parse_str(text).map(|_| ()).unwrap_err();
        assert_eq!(e.cause(), "syntax", "{e}");
    }
}

#[test]
fn defaults_apply_and_volume_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().display();
    let text = format!(
        "window = \"5m\"\n[defaults]\ninterval = \"2s\"\nsync_method = \"fsync\"\n\
         [[volume]]\nname = \"a\"\npath = \"{p}\"\nprobe_dir = \"{p}/pa\"\n\
         [[volume]]\nname = \"b\"\npath = \"{p}\"\nprobe_dir = \"{p}/pb\"\ninterval = \"250ms\"\nprobes = [\"read\"]\n"
    );
    let c = parse_str(&text).unwrap();
    assert_eq!(c.window, Duration::from_secs(300));
    let (a, b) = (&c.volumes[0], &c.volumes[1]);
    assert_eq!(a.probe.interval, Duration::from_secs(2));
    assert_eq!(a.probe.sync_method, SyncMethod::Fsync);
    assert!(a.probe.commit_probe && a.probe.read_probe);
    assert_eq!(b.probe.interval, Duration::from_millis(250));
    assert!(!b.probe.commit_probe && b.probe.read_probe);
    assert_eq!(
        b.probe.read_file_size,
        crate::probe::settings::ProbeSettings::default().read_file_size
    );
    assert_eq!(b.probe_dir, dir.path().canonicalize().unwrap().join("pb"));
}

#[test]
fn no_volumes_means_the_embedded_default() {
    let c = build(None, RawConfig::default(), &FlagOverrides::default()).unwrap();
    assert_eq!(c.volumes.len(), 1);
    assert_eq!(c.volumes[0].name, DEFAULT_VOLUME_NAME);
    assert_eq!(
        c.volumes[0].probe_dir,
        Path::new(DEFAULT_VOLUME_PATH)
            .canonicalize()
            .unwrap()
            .join(PROBE_DIR_NAME)
    );
    assert_eq!(c.window, DEFAULT_WINDOW);
}

#[test]
fn probe_path_flags() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("pgwal");
    std::fs::create_dir(&sub).unwrap();
    let flags = FlagOverrides {
        probe_paths: vec![format!("wal={}", sub.display()), sub.display().to_string()],
        engine: Some(EngineChoice::Sync),
        ..Default::default()
    };
    // Same directory twice: the probe directory collides.
    let e = build(None, RawConfig::default(), &flags)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is used by two volumes"), "{e}");

    let flags = FlagOverrides {
        probe_paths: vec![format!("wal={}", sub.display())],
        engine: Some(EngineChoice::Sync),
        ..Default::default()
    };
    let c = build(None, RawConfig::default(), &flags).unwrap();
    assert_eq!(c.volumes[0].name, "wal");
    assert_eq!(c.volumes[0].probe.engine, EngineChoice::Sync);

    let flags = FlagOverrides {
        probe_paths: vec![sub.display().to_string()],
        ..Default::default()
    };
    let c = build(None, RawConfig::default(), &flags).unwrap();
    assert_eq!(c.volumes[0].name, "pgwal");

    let flags = FlagOverrides {
        probe_paths: vec!["x=/does/not/exist".to_string()],
        ..Default::default()
    };
    let e = build(None, RawConfig::default(), &flags)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "flag --probe.path: x=/does/not/exist: path /does/not/exist: No such file or directory (os error 2)"
    );
}

#[test]
fn split_name_table() {
    assert_eq!(split_name("wal=/srv/wal"), (Some("wal"), "/srv/wal"));
    assert_eq!(split_name("/srv/a=b"), (None, "/srv/a=b"));
    assert_eq!(split_name("=/srv"), (None, "=/srv"));
    assert_eq!(split_name("/srv"), (None, "/srv"));
}

#[test]
fn refuses_to_probe_inside_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("main");
    std::fs::create_dir_all(data.join("global")).unwrap();
    std::fs::create_dir_all(data.join("pg_wal")).unwrap();
    std::fs::write(data.join("PG_VERSION"), "18\n").unwrap();
    for target in [data.clone(), data.join("pg_wal")] {
        let flags = FlagOverrides {
            probe_paths: vec![format!("x={}", target.display())],
            ..Default::default()
        };
        let e = build(None, RawConfig::default(), &flags)
            .unwrap_err()
            .to_string();
        // The flag has no probe_dir: the advice is what a flag user can do.
        assert!(
            e.ends_with(
                "the exporter never writes there. Give --probe.path a directory beside it on the \
                 same filesystem, or probe it from --config.file with a [[volume]] whose \
                 probe_dir is a directory beside it"
            ),
            "{e}"
        );
        assert!(!e.contains("Set probe_dir"), "{e}");
    }
    // A [[volume]] has probe_dir, and is told to set it.
    let text = format!("[[volume]]\nname = \"v\"\npath = \"{}\"\n", data.display());
    let e = parse_str(&text).unwrap_err().to_string();
    assert!(
        e.ends_with(
            "the exporter never writes there. Set probe_dir to a directory beside it on the \
             same filesystem"
        ),
        "{e}"
    );
    // pg_wal symlinked to another directory (initdb --waldir): recognised by
    // its archive_status/ whatever the target is called.
    let waldir = dir.path().join("walvol");
    std::fs::create_dir_all(waldir.join("archive_status")).unwrap();
    std::fs::remove_dir(data.join("pg_wal")).unwrap();
    std::os::unix::fs::symlink(&waldir, data.join("pg_wal")).unwrap();
    // A tablespace location holds PG_<major>_<catversion>.
    let ts = dir.path().join("ts1");
    std::fs::create_dir_all(ts.join("PG_18_202506291")).unwrap();
    for target in [data.join("pg_wal"), waldir.clone(), ts.clone()] {
        let flags = FlagOverrides {
            probe_paths: vec![format!("x={}", target.display())],
            ..Default::default()
        };
        let e = build(None, RawConfig::default(), &flags)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the exporter never writes there"),
            "{target:?}: {e}"
        );
    }
    // Beside the data directory is fine.
    let flags = FlagOverrides {
        probe_paths: vec![format!("x={}", dir.path().display())],
        ..Default::default()
    };
    assert!(build(None, RawConfig::default(), &flags).is_ok());
}

#[test]
fn probe_flags_are_checked_and_applied_for_discovered_volumes_too() {
    // With only a cluster, the --probe.* flags reach the discovered volumes
    // alone; a bad one must be refused all the same.
    let dsn = || vec!["host=127.0.0.1 port=5432 user=mon dbname=postgres".to_string()];
    let flags = FlagOverrides {
        pg_dsns: dsn(),
        read_file_size: Some(1024),
        ..Default::default()
    };
    let e = build(None, RawConfig::default(), &flags)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("flag --probe.read-file-size: 1024:"), "{e}");
    let flags = FlagOverrides {
        pg_dsns: dsn(),
        interval: Some(Duration::ZERO),
        ..Default::default()
    };
    let e = build(None, RawConfig::default(), &flags)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "flag --probe.interval: 0ns: out of range: use 1ms to 1h");
    let flags = FlagOverrides {
        pg_dsns: dsn(),
        interval: Some(Duration::from_millis(250)),
        engine: Some(EngineChoice::Sync),
        ..Default::default()
    };
    let c = build(None, RawConfig::default(), &flags).unwrap();
    assert!(c.volumes.is_empty());
    assert_eq!(c.volume_defaults.interval, Duration::from_millis(250));
    assert_eq!(c.volume_defaults.engine, EngineChoice::Sync);
}

#[test]
fn audit_interval_and_ignore_lists() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().display().to_string();
    let text = format!(
        "audit_interval = \"10m\"\n[audit]\nignore = [\"swappiness_high\"]\n\
         [[volume]]\nname = \"v\"\npath = \"{p}\"\naudit.ignore = [\"atime\", \"read_ahead_large\"]\n\
         [[cluster]]\nname = \"c\"\ndsn = \"host=/run/postgresql\"\naudit = {{ ignore = [\"wal_compression_off\"] }}\n"
    );
    let cfg = parse_str(&text).unwrap();
    assert_eq!(cfg.audit.interval, Duration::from_secs(600));
    assert_eq!(
        cfg.audit.for_volume("v", &[]),
        ["atime", "read_ahead_large", "swappiness_high"]
    );
    assert_eq!(
        cfg.audit.for_cluster("c"),
        ["swappiness_high", "wal_compression_off"]
    );
    assert_eq!(cfg.audit.for_volume("c/data", &[]), ["swappiness_high"]);
    // A volume holding cluster c's directories takes c's list too, once
    // each, whether discovered or a [[volume]] of its own.
    assert_eq!(
        cfg.audit.for_volume("c/data", &["c", "other"]),
        ["swappiness_high", "wal_compression_off"]
    );
    assert_eq!(
        cfg.audit.for_volume("v", &["c", "c"]),
        [
            "atime",
            "read_ahead_large",
            "swappiness_high",
            "wal_compression_off"
        ]
    );
    assert_eq!(cfg.audit.host_root, PathBuf::from("/"));
    let cfg = parse_str(&format!(
        "host_root = \"/host\"\n[[volume]]\nname = \"v\"\npath = \"{p}\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.audit.host_root, PathBuf::from("/host"));
    // The default, and the key named in each refusal.
    let cfg = parse_str(&format!("[[volume]]\nname = \"v\"\npath = \"{p}\"\n")).unwrap();
    assert_eq!(cfg.audit.interval, Duration::from_secs(300));
    for (text, want) in [
        (
            "audit_interval = \"100ms\"\n".to_string(),
            ":1: audit_interval: ",
        ),
        (
            "[audit]\nignore = [\"fsync\"]\n".to_string(),
            ":2: audit.ignore: unknown audit code \"fsync\"",
        ),
        (
            "[[cluster]]\nname = \"c\"\ndsn = \"host=/run/postgresql\"\naudit.ignore = [\"nope\"]\n".to_string(),
            ":4: cluster[0].audit.ignore: unknown audit code \"nope\"",
        ),
        (
            "[audit]\nignor = []\n".to_string(),
            "audit.ignor: unknown field `ignor`",
        ),
    ] {
        let e = parse_str(&text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}: {e}");
    }
}

/// Two clusters with one name: the error names where both names came
/// from (config lines, which --pg.dsn, DATA_SOURCE_NAME), never the
/// default and never a DSN.
#[test]
fn duplicate_cluster_names_name_both_origins() {
    let secret = "PWMARK-dup";
    let dsn = |port: u16| format!("host=127.0.0.1 port={port} user=mon password={secret}");
    let flags = FlagOverrides {
        pg_dsns: vec![dsn(5432), dsn(5433), dsn(5432)],
        ..Default::default()
    };
    let e = build(None, RawConfig::default(), &flags)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "flag --pg.dsn: cluster.name: duplicate cluster name \"pg5432\": given by the 1st \
         --pg.dsn (no NAME=, so named after its port 5432) and by the 3rd --pg.dsn (no NAME=, so \
         named after its port 5432); names label every series and must be unique: name each \
         cluster (name = \"...\" in a [[cluster]] table, NAME=DSN on the command line)"
    );
    let flags = FlagOverrides {
        pg_dsns: vec![format!("main={}", dsn(5432))],
        data_source_name: Some(format!("main={}", dsn(5433))),
        ..Default::default()
    };
    let e = build(None, RawConfig::default(), &flags)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "environment variable DATA_SOURCE_NAME: cluster.name: duplicate cluster name \
             \"main\": given by the 1st --pg.dsn and by DATA_SOURCE_NAME;"
        ),
        "{e}"
    );
    let file = Path::new("/etc/pg-storage-exporter.toml");
    let text = format!(
        "[[cluster]]\nname = \"main\"\ndsn = \"{}\"\n\n[[cluster]]\nname = \"pg5432\"\ndsn = \"{}\"\n",
        dsn(5432),
        dsn(5433)
    );
    let raw = raw::parse(file, &text).unwrap();
    let flags = FlagOverrides {
        pg_dsns: vec![dsn(5432)],
        ..Default::default()
    };
    let e = build(Some((file, &text)), raw, &flags)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "flag --pg.dsn: cluster.name: duplicate cluster name \"pg5432\": given by \
             /etc/pg-storage-exporter.toml:6 (cluster[1].name) and by the 1st --pg.dsn (no \
             NAME=, so named after its port 5432);"
        ),
        "{e}"
    );
    assert!(
        !e.contains(secret) && !e.contains("built-in default"),
        "{e}"
    );
}

/// `password_file` holds the password alone: a second line is refused,
/// naming the file and the key's line, never its content.
#[test]
fn a_two_line_password_file_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let pf = dir.path().join("pgse.password");
    std::fs::write(&pf, "PWMARK-one\nPWMARK-two\n").unwrap();
    let text = format!(
        "[[cluster]]\nname = \"main\"\ndsn = \"host=/run/postgresql user=mon\"\n\
         password_file = \"{}\"\n",
        pf.display()
    );
    let e = parse_str(&text).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "/etc/pg-storage-exporter.toml:4: cluster[0].password_file: password file {}: has 2 \
             lines; it must hold the password alone on one line (a libpq passfile, with \
             host:port:database:user:password lines, goes in the DSN's passfile= or PGPASSFILE \
             instead)",
            pf.display()
        )
    );
    assert!(!e.contains("PWMARK"));
    std::fs::write(&pf, "PWMARK-one\n").unwrap();
    let cfg = parse_str(&text).unwrap();
    assert_eq!(
        cfg.clusters[0].target.config.get_password(),
        Some(&b"PWMARK-one"[..])
    );
}
