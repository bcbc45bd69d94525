//! The README's quick start: no flags at all on a fresh machine.

use crate::common;

use std::time::Duration;

use common::*;

#[test]
fn no_flags_probes_var_tmp_on_the_default_port() {
    if std::net::TcpListener::bind("0.0.0.0:9847").is_err() {
        panic!("port 9847 is busy: stop whatever listens there (another exporter?) and rerun");
    }
    let probe_dir = std::path::Path::new("/var/tmp/pg-storage-exporter-probe");
    let mut ex = Exporter::start_raw(&[], &[]);
    assert_eq!(ex.addr.to_string(), "0.0.0.0:9847");
    ex.addr = "127.0.0.1:9847".parse().unwrap();
    let m = ex.wait_for(
        "probes on the default volume",
        Duration::from_secs(60),
        |m| count(m, "default", "commit") >= 1.0 && count(m, "default", "read") >= 1.0,
    );
    assert!(
        m.contains("pgstorage_volume_info{volume=\"default\",path=\"/var/tmp\""),
        "{m}"
    );
    assert!(probe_dir.join("wal.probe").exists());
    let log = ex.log();
    assert!(log.contains("msg=listening address=0.0.0.0:9847"), "{log}");
    assert!(
        log.contains("msg=probing volume=default probe_dir=/var/tmp/pg-storage-exporter-probe"),
        "{log}"
    );
    ex.signal(libc::SIGTERM);
    assert!(ex.wait_exit(Duration::from_secs(15)).success());
    assert!(!probe_dir.exists());
}
