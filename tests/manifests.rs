//! The deployment files of deploy/: the Kubernetes manifests (every YAML
//! document parsed, and the fields that tie a shape together checked: the
//! sidecar mounts PostgreSQL's data and WAL volumes at PostgreSQL's paths,
//! port 9847 is the named `pgse-metrics` port the Service/ServiceMonitor or
//! PodMonitor scrape, the probe paths of its configuration lie on those
//! volumes beside PostgreSQL's directories, the ConfigMap and Secret it
//! mounts exist), the systemd unit and its example configuration, the
//! Dockerfile, and every shipped exporter configuration accepted by the
//! real exporter.
//!
//! YAML is parsed with Python's PyYAML (`python3 -c 'import yaml'`; Debian
//! package python3-yaml) into JSON, so the test needs no YAML crate. Where
//! no Python with PyYAML is found, the structural checks fall back to a
//! line-based reading of the same fields and say so.

// Test code: a panic is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Exporter, kit};
use serde_json::Value;

const PORT: u64 = 9847;
const PORT_NAME: &str = "pgse-metrics";
const SIDECAR: &str = "pg-storage-exporter";
const CONFIG_FILE: &str = "/etc/pg-storage-exporter/config.toml";

/// The Kubernetes shapes: directory and the uid PostgreSQL runs as there.
const SHAPES: &[(&str, u64)] = &[("statefulset", 999), ("cloudnative-pg", 26)];

/// A Python interpreter with PyYAML, if there is one.
fn python_with_yaml() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import yaml"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Every YAML document of a file, as JSON.
fn parse_yaml(python: &str, path: &Path) -> Vec<Value> {
    let out = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml\n\
             docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]\n\
             print(json.dumps(docs))",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} is not valid YAML: {}",
        path.display(),
        kit::output_text(&out)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().unwrap().clone()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    v.sort();
    v
}

/// The `config.toml` of a ConfigMap manifest, read line by line (the block
/// scalar under `config.toml: |`, indented four spaces).
fn configmap_block(text: &str, key: &str) -> Option<String> {
    let mut lines = text.lines();
    lines.by_ref().find(|l| l.trim() == format!("{key}: |"))?;
    let mut out = String::new();
    for l in lines {
        if let Some(rest) = l.strip_prefix("    ") {
            out.push_str(rest);
            out.push('\n');
        } else if l.trim().is_empty() {
            out.push('\n');
        } else {
            break;
        }
    }
    Some(out)
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    find(docs, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// `labels` contains every key/value of `selector`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(sel) = selector.as_object() else {
        return false;
    };
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// What a shape says about the sidecar, gathered from its manifests.
struct Pod<'a> {
    shape: &'a str,
    sidecar: Value,
    /// PostgreSQL's mounts of its data and WAL volumes: name → path.
    pg_mounts: BTreeMap<String, String>,
    /// PostgreSQL's data directory and pg_wal, which no probe path may be in.
    pgdata: String,
    pg_wal: String,
    /// The pod's volumes (configMap and secret volumes of the sidecar).
    volumes: Vec<Value>,
    pod_uid: u64,
}

/// Checks shared by every shape: the sidecar's port, mounts, config,
/// secret, security context, resources and probes.
fn check_sidecar(pod: &Pod<'_>, docs: &[Value]) {
    let shape = pod.shape;
    let ex = &pod.sidecar;
    assert_eq!(ex["name"], SIDECAR, "{shape}");
    assert!(!str_of(&ex["image"]).is_empty(), "{shape}: image");

    // Port 9847, named for the scrape config.
    let ports = ex["ports"].as_array().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p["name"] == PORT_NAME && p["containerPort"] == PORT),
        "{shape}: port {PORT_NAME}={PORT}: {ports:?}"
    );

    // PostgreSQL's data and WAL volumes at PostgreSQL's paths.
    let mounts = ex["volumeMounts"].as_array().unwrap();
    let mount_of = |name: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == name)
            .map(|m| str_of(&m["mountPath"]).to_string())
    };
    assert_eq!(pod.pg_mounts.len(), 2, "{shape}: data and WAL volumes");
    for (name, path) in &pod.pg_mounts {
        assert_eq!(
            mount_of(name).as_deref(),
            Some(path.as_str()),
            "{shape}: the sidecar mounts {name} where PostgreSQL does"
        );
        let m = mounts.iter().find(|m| m["name"] == name.as_str()).unwrap();
        assert_ne!(m["readOnly"], true, "{shape}: {name} must be writable");
    }

    // --config.file names a file of a mounted ConfigMap.
    let args: Vec<&str> = ex["args"].as_array().unwrap().iter().map(str_of).collect();
    let at = args
        .iter()
        .position(|a| *a == "--config.file")
        .unwrap_or_else(|| panic!("{shape}: no --config.file in {args:?}"));
    let config_path = args[at + 1];
    assert_eq!(config_path, CONFIG_FILE, "{shape}");
    let (config_dir, config_name) = config_path.rsplit_once('/').unwrap();
    let config_mount = mounts
        .iter()
        .find(|m| m["mountPath"] == config_dir)
        .unwrap_or_else(|| panic!("{shape}: nothing mounted at {config_dir}"));
    let config_vol = pod
        .volumes
        .iter()
        .find(|v| v["name"] == config_mount["name"])
        .unwrap_or_else(|| panic!("{shape}: no volume {}", config_mount["name"]));
    let cm_name = str_of(&config_vol["configMap"]["name"]);
    let cm = named(docs, "ConfigMap", cm_name)
        .unwrap_or_else(|| panic!("{shape}: ConfigMap {cm_name} not in the manifests"));
    let key = config_vol["configMap"]["items"]
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .find(|i| i["path"] == config_name)
                .map(|i| str_of(&i["key"]).to_string())
        })
        .unwrap_or_else(|| config_name.to_string());
    let toml_text = str_of(&cm["data"][&key]);
    assert!(!toml_text.is_empty(), "{shape}: {cm_name} has no {key}");
    let config: toml::Table = toml::from_str(toml_text)
        .unwrap_or_else(|e| panic!("{shape}: {cm_name}/{key} is not TOML: {e}"));

    // Probe paths: on the shared volumes, beside PostgreSQL's directories.
    let volumes = config["volume"].as_array().unwrap();
    let mut probed = Vec::new();
    for v in volumes {
        let name = v["name"].as_str().unwrap();
        let path = v["path"].as_str().unwrap();
        let probe_dir = v.get("probe_dir").and_then(|p| p.as_str()).map_or_else(
            || format!("{path}/pg-storage-exporter-probe"),
            str::to_string,
        );
        let mount = pod
            .pg_mounts
            .values()
            .find(|m| path == m.as_str() || path.starts_with(&format!("{m}/")))
            .unwrap_or_else(|| panic!("{shape}: volume {name} path {path} is on no shared volume"));
        assert!(
            probe_dir.starts_with(&format!("{mount}/")),
            "{shape}: {name}: probe_dir {probe_dir} is not on {mount}"
        );
        for pgdir in [&pod.pgdata, &pod.pg_wal] {
            assert!(
                !probe_dir.starts_with(&format!("{pgdir}/")) && probe_dir != *pgdir,
                "{shape}: {name}: probe_dir {probe_dir} inside PostgreSQL's {pgdir}"
            );
        }
        let probes: Vec<&str> = v["probes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        probed.push((mount.clone(), probes));
    }
    let wal_mount = pod.pg_wal.rsplit_once('/').unwrap().0;
    let data_mount = pod.pgdata.rsplit_once('/').unwrap().0;
    assert!(
        probed
            .iter()
            .any(|(m, p)| m == wal_mount && p.contains(&"commit")),
        "{shape}: a commit probe on the WAL volume {wal_mount}: {probed:?}"
    );
    assert!(
        probed
            .iter()
            .any(|(m, p)| m == data_mount && p.contains(&"read")),
        "{shape}: a read probe on the data volume {data_mount}: {probed:?}"
    );

    // The cluster: localhost, a password file from a mounted Secret,
    // discovery on (it records which volume holds data and WAL).
    let clusters = config["cluster"].as_array().unwrap();
    assert_eq!(clusters.len(), 1, "{shape}");
    let c = &clusters[0];
    let dsn = c["dsn"].as_str().unwrap();
    assert!(
        dsn.contains("host=127.0.0.1") && dsn.contains("port=5432"),
        "{shape}: {dsn}"
    );
    assert!(!dsn.contains("password"), "{shape}: no password in the DSN");
    assert_eq!(c["discover_volumes"].as_bool(), Some(true), "{shape}");
    let pw = c["password_file"].as_str().unwrap();
    let (pw_dir, pw_name) = pw.rsplit_once('/').unwrap();
    let pw_mount = mounts
        .iter()
        .find(|m| m["mountPath"] == pw_dir)
        .unwrap_or_else(|| panic!("{shape}: nothing mounted at {pw_dir}"));
    let pw_vol = pod
        .volumes
        .iter()
        .find(|v| v["name"] == pw_mount["name"])
        .unwrap();
    let secret_name = str_of(&pw_vol["secret"]["secretName"]);
    let secret = named(docs, "Secret", secret_name)
        .unwrap_or_else(|| panic!("{shape}: Secret {secret_name} not in the manifests"));
    let item = pw_vol["secret"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["path"] == pw_name)
        .unwrap_or_else(|| panic!("{shape}: {pw} is no item of {secret_name}"));
    assert!(
        secret["stringData"].get(str_of(&item["key"])).is_some()
            || secret["data"].get(str_of(&item["key"])).is_some(),
        "{shape}: Secret {secret_name} has no key {}",
        item["key"]
    );
    // Readable by the pod's group (the files belong to root:fsGroup).
    let mode = pw_vol["secret"]["defaultMode"].as_u64().unwrap_or(0o644);
    assert!(
        mode & 0o040 != 0 && mode & 0o007 == 0,
        "{shape}: mode {mode:o}"
    );

    // Runs as PostgreSQL's uid, locked down.
    let sc = &ex["securityContext"];
    assert_eq!(sc["runAsUser"], pod.pod_uid, "{shape}: PostgreSQL's uid");
    assert_eq!(sc["runAsNonRoot"], true, "{shape}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{shape}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{shape}");
    assert_eq!(sc["capabilities"]["drop"][0], "ALL", "{shape}");
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{shape}");

    // Requests and limits; health probes on the metrics port.
    for kind in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(
                ex["resources"][kind][r].is_string(),
                "{shape}: resources.{kind}.{r}"
            );
        }
    }
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(ex[probe]["httpGet"]["path"], "/healthz", "{shape}: {probe}");
        assert_eq!(ex[probe]["httpGet"]["port"], PORT_NAME, "{shape}: {probe}");
    }
}

fn check_statefulset(docs: &[Value]) {
    let sts = find(docs, "StatefulSet");
    assert_eq!(sts.len(), 1);
    let sts = sts[0];
    let spec = &sts["spec"]["template"]["spec"];
    let containers = spec["containers"].as_array().unwrap();
    let pg = containers.iter().find(|c| c["name"] == "postgres").unwrap();
    let env = |name: &str| {
        pg["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| str_of(&e["value"]).to_string())
            .unwrap_or_else(|| panic!("postgres container: no {name}"))
    };
    let claims: Vec<&str> = sts["spec"]["volumeClaimTemplates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| str_of(&c["metadata"]["name"]))
        .collect();
    let pg_mounts: BTreeMap<String, String> = pg["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| claims.contains(&str_of(&m["name"])))
        .map(|m| {
            (
                str_of(&m["name"]).to_string(),
                str_of(&m["mountPath"]).to_string(),
            )
        })
        .collect();
    let pod = Pod {
        shape: "statefulset",
        sidecar: containers
            .iter()
            .find(|c| c["name"] == SIDECAR)
            .expect("sidecar container")
            .clone(),
        pg_mounts,
        pgdata: env("PGDATA"),
        pg_wal: env("POSTGRES_INITDB_WALDIR"),
        volumes: spec["volumes"].as_array().unwrap().clone(),
        pod_uid: spec["securityContext"]["runAsUser"].as_u64().unwrap(),
    };
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(spec["securityContext"]["fsGroup"].is_u64(), "fsGroup");
    check_sidecar(&pod, docs);

    // The metrics Service selects the pods and exposes the named port; the
    // ServiceMonitor selects that Service and scrapes that port.
    let labels = &sts["spec"]["template"]["metadata"]["labels"];
    let svc = named(docs, "Service", SIDECAR).expect("Service pg-storage-exporter");
    assert!(selects(&svc["spec"]["selector"], labels), "{svc}");
    let p = &svc["spec"]["ports"][0];
    assert_eq!(p["name"], PORT_NAME);
    assert_eq!(p["port"], PORT);
    assert_eq!(p["targetPort"], PORT_NAME);
    let sm = find(docs, "ServiceMonitor");
    assert_eq!(sm.len(), 1);
    assert!(
        selects(
            &sm[0]["spec"]["selector"]["matchLabels"],
            &svc["metadata"]["labels"]
        ),
        "ServiceMonitor selects the metrics Service"
    );
    assert_eq!(sm[0]["spec"]["endpoints"][0]["port"], PORT_NAME);
    // The initdb script that creates the monitoring role is mounted.
    let cm = named(docs, "ConfigMap", SIDECAR).unwrap();
    assert!(str_of(&cm["data"]["10-pgse-role.sh"]).contains("GRANT pg_monitor TO pgse"));
}

fn check_cloudnative_pg(docs: &[Value]) {
    let clusters = find(docs, "Cluster");
    assert_eq!(clusters.len(), 1);
    let cluster = clusters[0];
    assert_eq!(cluster["apiVersion"], "postgresql.cnpg.io/v1");
    let name = str_of(&cluster["metadata"]["name"]);
    assert!(
        cluster["spec"]["walStorage"]["size"].is_string(),
        "walStorage: the pg-wal volume exists only with it"
    );
    let patch_text = str_of(&cluster["metadata"]["annotations"]["cnpg.io/podPatch"]);
    let patch: Value = serde_json::from_str(patch_text)
        .unwrap_or_else(|e| panic!("cnpg.io/podPatch is not JSON: {e}\n{patch_text}"));
    let ops = patch.as_array().unwrap();
    for op in ops {
        assert_eq!(op["op"], "add", "{op}");
    }
    let container = ops
        .iter()
        .find(|o| o["path"] == "/spec/containers/-")
        .expect("the patch adds the sidecar container");
    let volumes: Vec<Value> = ops
        .iter()
        .filter(|o| o["path"] == "/spec/volumes/-")
        .map(|o| o["value"].clone())
        .collect();
    // CloudNativePG's own volumes of an instance pod (pkg/specs/volumes.go):
    // "pgdata" at /var/lib/postgresql/data with PGDATA in pgdata/ under it,
    // "pg-wal" at /var/lib/postgresql/wal with pg_wal under it.
    let pg_mounts: BTreeMap<String, String> = [
        ("pgdata", "/var/lib/postgresql/data"),
        ("pg-wal", "/var/lib/postgresql/wal"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    let pod = Pod {
        shape: "cloudnative-pg",
        sidecar: container["value"].clone(),
        pg_mounts,
        pgdata: "/var/lib/postgresql/data/pgdata".into(),
        pg_wal: "/var/lib/postgresql/wal/pg_wal".into(),
        volumes,
        pod_uid: 26,
    };
    check_sidecar(&pod, docs);

    // The monitoring role: pg_monitor, password from the Secret the sidecar
    // reads.
    let roles = cluster["spec"]["managed"]["roles"].as_array().unwrap();
    let role = roles
        .iter()
        .find(|r| r["name"] == "pgse")
        .expect("role pgse");
    assert_eq!(role["login"], true);
    assert_eq!(role["inRoles"], serde_json::json!(["pg_monitor"]));
    let secret = str_of(&role["passwordSecret"]["name"]);
    assert!(
        pod.volumes
            .iter()
            .any(|v| v["secret"]["secretName"] == secret),
        "the sidecar mounts the role's Secret {secret}"
    );
    let s = named(docs, "Secret", secret).unwrap();
    assert_eq!(s["type"], "kubernetes.io/basic-auth");
    assert_eq!(s["stringData"]["username"], "pgse");
    for p in ["track_io_timing", "track_wal_io_timing"] {
        assert_eq!(cluster["spec"]["postgresql"]["parameters"][p], "on", "{p}");
    }

    // The PodMonitor selects the Cluster's pods and scrapes the named port.
    let pm = find(docs, "PodMonitor");
    assert_eq!(pm.len(), 1);
    assert_eq!(
        pm[0]["spec"]["selector"]["matchLabels"]["cnpg.io/cluster"],
        name
    );
    assert_eq!(pm[0]["spec"]["podMetricsEndpoints"][0]["port"], PORT_NAME);
}

#[test]
fn kubernetes_manifests_tie_together() {
    let root = kit::repo("deploy/kubernetes");
    let Some(python) = python_with_yaml() else {
        eprintln!(
            "NOTE: no python3 with PyYAML (Debian package python3-yaml): checking the \
             manifests line by line instead of parsing them"
        );
        line_based_checks(&root);
        return;
    };
    let mut n_docs = 0;
    for (shape, _) in SHAPES {
        let dir = root.join(shape);
        let files = yaml_files(&dir);
        let mut docs = Vec::new();
        let mut listed: Vec<String> = Vec::new();
        for f in &files {
            let parsed = parse_yaml(python, f);
            for d in &parsed {
                if d["kind"] == "Kustomization" {
                    listed = d["resources"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| str_of(r).to_string())
                        .collect();
                } else {
                    assert!(
                        d["apiVersion"].is_string() && d["kind"].is_string(),
                        "{}: a document without apiVersion/kind",
                        f.display()
                    );
                    assert!(d["metadata"]["name"].is_string(), "{}", f.display());
                }
            }
            n_docs += parsed.len();
            docs.extend(parsed);
        }
        // The kustomization lists every other file of the directory.
        let mut others: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .filter(|f| f != "kustomization.yaml")
            .collect();
        others.sort();
        listed.sort();
        assert_eq!(listed, others, "{shape}/kustomization.yaml resources");
        match *shape {
            "statefulset" => check_statefulset(&docs),
            "cloudnative-pg" => check_cloudnative_pg(&docs),
            other => panic!("unknown shape {other}"),
        }
    }
    eprintln!("parsed {n_docs} YAML documents with {python} (PyYAML); both shapes check out");
}

/// Without PyYAML: the same ties, read from the lines.
fn line_based_checks(root: &Path) {
    for (shape, uid) in SHAPES {
        let dir = root.join(shape);
        let all: String = yaml_files(&dir)
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        for needle in [
            format!("{PORT}"),
            PORT_NAME.to_string(),
            "/var/lib/postgresql/data".to_string(),
            "/var/lib/postgresql/wal".to_string(),
            format!("{uid}"),
            "RuntimeDefault".to_string(),
            CONFIG_FILE.to_string(),
            "pg-storage-exporter-probe".to_string(),
        ] {
            assert!(all.contains(&needle), "{shape}: {needle} missing");
        }
        for l in all.lines() {
            assert!(!l.contains('\t'), "{shape}: tab in YAML: {l:?}");
        }
    }
}

#[test]
fn systemd_unit_is_hardened_and_matches_its_config() {
    let unit_path = kit::repo("deploy/systemd/pg-storage-exporter.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let directive = |key: &str| -> Vec<String> {
        unit.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(|v| v.trim().to_string())
            .collect()
    };
    let one = |key: &str| -> String {
        let v = directive(key);
        assert_eq!(v.len(), 1, "{key}= set once: {v:?}");
        v[0].clone()
    };
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert_eq!(one("PrivateTmp"), "yes");
    assert_eq!(one("CapabilityBoundingSet"), "", "no capabilities at all");
    assert_eq!(
        one("SystemCallErrorNumber"),
        "EPERM",
        "EPERM, not SIGSYS: the io_uring fallback needs it"
    );
    let user = one("User");
    assert!(!user.is_empty() && user != "root", "dedicated user: {user}");
    let exec = one("ExecStart");
    assert!(
        exec.ends_with(&format!("--config.file {CONFIG_FILE}")),
        "{exec}"
    );

    // ReadWritePaths= is exactly the probe directories of the example
    // configuration, and nothing else is writable.
    let rw: Vec<String> = one("ReadWritePaths")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(kit::repo("deploy/systemd/config.toml")).unwrap())
            .unwrap();
    let mut probe_dirs: Vec<String> = config["volume"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let d = v["probe_dir"]
                .as_str()
                .expect("systemd volumes name their probe_dir");
            assert!(
                !d.ends_with("/pg-storage-exporter-probe"),
                "{d}: the exporter removes a directory of that name at shutdown, and the \
                 unit could not create it again"
            );
            d.to_string()
        })
        .collect();
    probe_dirs.sort();
    let mut rw_sorted = rw.clone();
    rw_sorted.sort();
    assert_eq!(rw_sorted, probe_dirs, "ReadWritePaths= vs probe_dir");

    // systemd's own check, with ExecStart pointing at the built binary
    // (the unit names /usr/local/bin, which does not exist here).
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("pg-storage-exporter.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/pg-storage-exporter", common::BIN),
    )
    .unwrap();
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
    {
        Ok(out) => {
            let text = kit::output_text(&out);
            eprintln!(
                "systemd-analyze verify: exit {}, output: {:?}",
                out.status, text
            );
            assert!(out.status.success(), "systemd-analyze verify: {text}");
            assert!(
                text.trim().is_empty(),
                "systemd-analyze verify warns: {text}"
            );
        }
        Err(e) => {
            eprintln!("NOTE: systemd-analyze not available ({e}); unit not verified by systemd")
        }
    }
}

#[test]
fn dockerfile_builds_a_non_root_image_on_port_9847() {
    let text = std::fs::read_to_string(kit::repo("Dockerfile")).unwrap();
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "multi-stage: {froms:?}");
    // The base images are build arguments (scripts/container-test points
    // them at local images); their defaults are the public ones.
    let arg = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
            .unwrap_or_else(|| panic!("ARG {name}= with a default"))
    };
    assert!(
        froms[0] == "FROM ${BUILDER_IMAGE} AS builder" && arg("BUILDER_IMAGE").contains("rust:"),
        "{}",
        froms[0]
    );
    assert!(
        froms[1] == "FROM ${RUNTIME_IMAGE}" && arg("RUNTIME_IMAGE").contains("debian:12-slim"),
        "{}",
        froms[1]
    );
    let user = text
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("USER");
    let uid: u32 = user.split(':').next().unwrap().parse().unwrap();
    assert!(uid >= 1000, "non-root uid: {user}");
    assert!(text.lines().any(|l| l.trim() == format!("EXPOSE {PORT}")));
    assert!(text.contains(&format!("CMD [\"--config.file\", \"{CONFIG_FILE}\"]")));
    assert!(
        text.contains("io_uring") && text.contains("seccomp"),
        "the seccomp note"
    );
    assert!(
        kit::repo("scripts/container-test").is_file(),
        "the script that builds and runs the image"
    );
}

/// A shipped configuration with its absolute paths moved under `root`
/// (directories and the password file created), small probe files, no
/// free-space reserve: what the exporter needs to start on this machine.
fn relocate(text: &str, root: &Path) -> String {
    let table: toml::Table = toml::from_str(text).unwrap();
    let mut out = text.to_string();
    let mut paths: Vec<(String, &str)> = Vec::new();
    for v in table["volume"].as_array().unwrap() {
        paths.push((v["path"].as_str().unwrap().to_string(), "dir"));
        if let Some(p) = v.get("probe_dir").and_then(|p| p.as_str()) {
            paths.push((p.to_string(), "probe_dir"));
        }
    }
    for c in table["cluster"].as_array().into_iter().flatten() {
        if let Some(p) = c.get("password_file").and_then(|p| p.as_str()) {
            paths.push((p.to_string(), "file"));
        }
    }
    for (p, what) in &paths {
        let moved = root.join(p.trim_start_matches('/'));
        match *what {
            "dir" => std::fs::create_dir_all(&moved).unwrap(),
            "file" => {
                std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
                std::fs::write(&moved, "not-the-password\n").unwrap();
            }
            _ => {
                std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
                // A directory an administrator made (systemd): 0700.
                if !p.ends_with("/pg-storage-exporter-probe") {
                    std::fs::create_dir_all(&moved).unwrap();
                    std::fs::set_permissions(&moved, std::fs::Permissions::from_mode(0o700))
                        .unwrap();
                }
            }
        }
        out = out.replace(&format!("\"{p}\""), &format!("\"{}\"", moved.display()));
    }
    let mut lines: Vec<String> = out
        .lines()
        .map(|l| {
            if l.starts_with("read_file_size") {
                "read_file_size = \"4MiB\"".to_string()
            } else if l.starts_with("free_space_reserve") {
                "free_space_reserve = \"0\"".to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    let at = lines.iter().position(|l| l.trim() == "[defaults]").unwrap();
    if !lines[at..]
        .iter()
        .take_while(|l| !l.starts_with("[["))
        .any(|l| l.starts_with("read_file_size"))
    {
        lines.insert(at + 1, "read_file_size = \"4MiB\"".to_string());
    }
    lines.join("\n") + "\n"
}

#[test]
fn the_exporter_accepts_every_shipped_configuration() {
    let mut configs: Vec<(String, String)> = vec![(
        "deploy/systemd/config.toml".into(),
        std::fs::read_to_string(kit::repo("deploy/systemd/config.toml")).unwrap(),
    )];
    for (shape, _) in SHAPES {
        for f in yaml_files(&kit::repo(&format!("deploy/kubernetes/{shape}"))) {
            let text = std::fs::read_to_string(&f).unwrap();
            if let Some(block) = configmap_block(&text, "config.toml") {
                configs.push((
                    format!("{shape}/{}", f.file_name().unwrap().to_string_lossy()),
                    block,
                ));
            }
            // The initdb script is valid shell.
            if let Some(script) = configmap_block(&text, "10-pgse-role.sh") {
                let out = Command::new("bash")
                    .args(["-n", "-c", &script])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{shape}: 10-pgse-role.sh: {}",
                    kit::output_text(&out)
                );
            }
        }
    }
    assert_eq!(configs.len(), 3, "systemd and both Kubernetes shapes");
    for (name, text) in &configs {
        let root = tempfile::Builder::new()
            .prefix("pgse-manifests-")
            .tempdir()
            .unwrap();
        let cfg = root.path().join("config.toml");
        std::fs::write(&cfg, relocate(text, root.path())).unwrap();
        let mut ex = Exporter::start_raw(
            &[
                "--web.listen-address",
                "127.0.0.1:0",
                "--config.file",
                cfg.to_str().unwrap(),
            ],
            &[],
        );
        let table: toml::Table = toml::from_str(text).unwrap();
        let vols: Vec<(String, Vec<String>)> = table["volume"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap().to_string(),
                    v["probes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| p.as_str().unwrap().to_string())
                        .collect(),
                )
            })
            .collect();
        ex.wait_for(
            &format!("{name}: a probe on every volume"),
            Duration::from_secs(60),
            |m| {
                vols.iter()
                    .all(|(v, probes)| probes.iter().all(|p| common::count(m, v, p) >= 1.0))
            },
        );
        ex.signal(libc::SIGTERM);
        assert!(
            ex.wait_exit(Duration::from_secs(15)).success(),
            "{name}: {}",
            ex.log()
        );
        eprintln!("{name}: accepted, probed {vols:?}");
    }
}
