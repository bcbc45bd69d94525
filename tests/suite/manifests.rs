//! The deployment files of deploy/: the Kubernetes manifests (every YAML
//! document validated against the Kubernetes API schemas of several
//! Kubernetes versions, and the fields that tie a shape together checked:
//! the sidecar mounts PostgreSQL's data and WAL volumes at PostgreSQL's
//! paths, port 9847 is the named `pgse-metrics` port the
//! Service/ServiceMonitor or PodMonitor scrape, the probe paths of its
//! configuration lie on those volumes beside PostgreSQL's directories, the
//! ConfigMap and Secret it mounts exist), the systemd unit and its example
//! configuration, the Dockerfile, and every shipped exporter configuration
//! accepted by the real exporter.
//!
//! The validators come from scripts/install-k8s-validator, under
//! $PGSE_K8S_VALIDATORS (default /opt/pgse/k8s-validators):
//! kubernetes-validate (PyPI), which bundles the API schemas of each
//! Kubernetes release, for the core kinds; for the kinds it has no schema
//! for, listed in [`NOT_IN_K8S_SCHEMAS`] with what checks them instead,
//! scripts/cnpg-crd-check (CloudNativePG's Cluster, against the types
//! generated from its CRD) and scripts/k8s-crd-validator (the Prometheus
//! Operator's ServiceMonitor and PodMonitor). A missing validator is a
//! failure unless tool tests are left out (`scripts/test --skip-tool-tests`).
//!
//! YAML is parsed with Python's PyYAML into JSON, so the test needs no YAML
//! crate: the system's (Debian package python3-yaml) or the copy installed
//! with the validator. Without either the tests fail (or skip, as above).

use crate::common;

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

/// The directory scripts/install-k8s-validator installs into.
fn validators_dir() -> PathBuf {
    std::env::var_os("PGSE_K8S_VALIDATORS")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/opt/pgse/k8s-validators"), PathBuf::from)
}

/// A Python interpreter and the `PYTHONPATH` it needs (if any).
struct Python {
    cmd: &'static str,
    path: Option<PathBuf>,
}

impl Python {
    fn command(&self) -> Command {
        let mut c = Command::new(self.cmd);
        if let Some(p) = &self.path {
            c.env("PYTHONPATH", p);
        }
        c
    }

    /// Whether `python -c code` succeeds.
    fn runs(&self, code: &str) -> bool {
        self.command()
            .args(["-c", code])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

const PYTHONS: [&str; 2] = ["python3", "/usr/bin/python3"];

/// kubernetes-validate as scripts/install-k8s-validator installed it, and
/// its version.
fn kubernetes_validate() -> Option<(Python, String)> {
    let path = validators_dir().join("python");
    PYTHONS.into_iter().find_map(|cmd| {
        let py = Python {
            cmd,
            path: Some(path.clone()),
        };
        let out = py
            .command()
            .args([
                "-c",
                "import kubernetes_validate; print(kubernetes_validate.__version__)",
            ])
            .output()
            .ok()?;
        out.status.success().then(|| {
            let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (py, v)
        })
    })
}

/// A Python interpreter with PyYAML: the system's, else the one installed
/// with kubernetes-validate.
fn python_with_yaml() -> Option<Python> {
    PYTHONS
        .into_iter()
        .map(|cmd| Python { cmd, path: None })
        .find(|p| p.runs("import yaml"))
        .or_else(|| kubernetes_validate().map(|(p, _)| p))
}

/// `None` when tool tests are left out (see [`common::cannot_run`]); a
/// failure otherwise (scripts/install-k8s-validator installs the validators).
fn unavailable<T>(why: &str) -> Option<T> {
    common::cannot_run_current(common::Part::Tools, why);
    None
}

/// Every YAML document of a file, as JSON.
fn parse_yaml(python: &Python, path: &Path) -> Vec<Value> {
    let out = python
        .command()
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

    // Requests and limits set (their form is the schemas' business);
    // health probes on the metrics port.
    for kind in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(
                !ex["resources"][kind][r].is_null(),
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
    // The volumes belong to PostgreSQL's group, which the sidecar is in.
    assert_eq!(
        spec["securityContext"]["fsGroup"], spec["securityContext"]["runAsGroup"],
        "fsGroup"
    );
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
    let name = str_of(&cluster["metadata"]["name"]);
    assert!(
        !cluster["spec"]["walStorage"]["size"].is_null(),
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
        unavailable::<()>(
            "no python3 with PyYAML (Debian package python3-yaml) to parse the manifests",
        );
        return;
    };
    let mut n_docs = 0;
    for (shape, _) in SHAPES {
        let dir = root.join(shape);
        let files = yaml_files(&dir);
        let mut docs = Vec::new();
        let mut listed: Vec<String> = Vec::new();
        for f in &files {
            let parsed = parse_yaml(&python, f);
            // apiVersion, kind and the rest of each document's form are
            // checked by the schema tests below.
            for d in &parsed {
                if d["kind"] == "Kustomization" {
                    listed = d["resources"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|r| str_of(r).to_string())
                        .collect();
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
    eprintln!(
        "parsed {n_docs} YAML documents with {} (PyYAML); both shapes check out",
        python.cmd
    );
}

/// The Kubernetes releases the manifests are validated against: the three
/// minor releases the Kubernetes project maintains as of kubernetes-validate
/// 1.37.0, the newest it bundles (it has 1.25 to 1.37).
const K8S_VERSIONS: &[&str] = &["1.35", "1.36", "1.37"];

/// Kinds the Kubernetes API schemas do not have, and what checks them
/// instead (printed by the test, so that none is skipped silently).
const NOT_IN_K8S_SCHEMAS: &[(&str, &str)] = &[
    (
        "Kustomization",
        "kustomize's build file (kustomize.config.k8s.io), never sent to the API server; \
         kubernetes_manifests_tie_together checks that it lists every other file",
    ),
    (
        "Cluster",
        "CloudNativePG CRD (postgresql.cnpg.io/v1): checked by \
         cloudnative_pg_cluster_matches_its_crd_types (structure: fields, types, enums, \
         required fields; not the CRD's patterns, bounds or CEL rules), and the container and \
         volumes its cnpg.io/podPatch adds are schema-checked here inside an instance Pod",
    ),
    (
        "ServiceMonitor",
        "Prometheus Operator CRD (monitoring.coreos.com/v1): schema-checked by \
         prometheus_operator_resources_match_their_schemas (types, required fields, patterns; \
         unknown fields are not rejected there)",
    ),
    (
        "PodMonitor",
        "Prometheus Operator CRD (monitoring.coreos.com/v1): schema-checked by \
         prometheus_operator_resources_match_their_schemas (types, required fields, patterns; \
         unknown fields are not rejected there)",
    ),
];

/// `doc` with a JSON-patch `add` of `value` at `path` (RFC 6902: `-` appends
/// to an array).
fn json_patch_add(doc: &mut Value, path: &str, value: Value) {
    let mut tokens: Vec<String> = path
        .strip_prefix('/')
        .unwrap_or_else(|| panic!("JSON pointer {path}"))
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let last = tokens.pop().unwrap();
    let mut at = doc;
    for t in &tokens {
        at = match at {
            Value::Array(a) => &mut a[t.parse::<usize>().unwrap()],
            other => other
                .get_mut(t.as_str())
                .unwrap_or_else(|| panic!("{path}: no {t}")),
        };
    }
    match at {
        Value::Array(a) if last == "-" => a.push(value),
        Value::Array(a) => a.insert(last.parse().unwrap(), value),
        Value::Object(o) => {
            o.insert(last, value);
        }
        other => panic!("{path}: cannot add into {other}"),
    }
}

/// An instance pod of the CloudNativePG Cluster with its cnpg.io/podPatch
/// applied: CloudNativePG's postgres container and its "pgdata" and "pg-wal"
/// volumes (pkg/specs), plus what the patch adds.
fn cnpg_instance_pod(cluster: &Value) -> Value {
    let name = str_of(&cluster["metadata"]["name"]);
    let mut pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("{name}-1"), "labels": {"cnpg.io/cluster": name}},
        "spec": {
            "securityContext": {
                "runAsUser": 26, "runAsGroup": 26, "fsGroup": 26,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": "postgres",
                "image": cluster["spec"]["imageName"],
                "volumeMounts": [
                    {"name": "pgdata", "mountPath": "/var/lib/postgresql/data"},
                    {"name": "pg-wal", "mountPath": "/var/lib/postgresql/wal"}
                ]
            }],
            "volumes": [
                {"name": "pgdata", "persistentVolumeClaim": {"claimName": format!("{name}-1")}},
                {"name": "pg-wal", "persistentVolumeClaim": {"claimName": format!("{name}-1-wal")}}
            ]
        }
    });
    let patch_text = str_of(&cluster["metadata"]["annotations"]["cnpg.io/podPatch"]);
    let patch: Value = serde_json::from_str(patch_text).unwrap();
    for op in patch.as_array().unwrap() {
        assert_eq!(op["op"], "add", "{op}");
        json_patch_add(&mut pod, str_of(&op["path"]), op["value"].clone());
    }
    pod
}

/// kubernetes-validate, strict (unknown fields are errors), on every
/// manifest and the patched CloudNativePG instance pod, for each of
/// [`K8S_VERSIONS`]; and a manifest with a misspelt field must fail.
#[test]
fn kubernetes_manifests_match_the_api_schemas() {
    let Some((python, version)) = kubernetes_validate().or_else(|| {
        unavailable(&format!(
            "kubernetes-validate is not installed in {}",
            validators_dir().join("python").display()
        ))
    }) else {
        return;
    };
    let repo = kit::repo("");
    let tmp = tempfile::tempdir().unwrap();
    // Each file as kubernetes-validate names it, and its (kind, name)s.
    let mut files: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for (shape, _) in SHAPES {
        for f in yaml_files(&kit::repo(&format!("deploy/kubernetes/{shape}"))) {
            let docs = parse_yaml(&python, &f);
            if let Some(c) = find(&docs, "Cluster").first() {
                let pod = tmp
                    .path()
                    .join(format!("{shape}-instance-pod-with-podPatch.json"));
                std::fs::write(
                    &pod,
                    serde_json::to_string_pretty(&cnpg_instance_pod(c)).unwrap(),
                )
                .unwrap();
                let name = str_of(&c["metadata"]["name"]);
                files.push((
                    pod.to_str().unwrap().to_string(),
                    vec![("Pod".into(), format!("{name}-1"))],
                ));
            }
            let rel = f.strip_prefix(&repo).unwrap().to_str().unwrap().to_string();
            let kinds = docs
                .iter()
                .map(|d| {
                    (
                        str_of(&d["kind"]).to_string(),
                        str_of(&d["metadata"]["name"]).to_string(),
                    )
                })
                .collect();
            files.push((rel, kinds));
        }
    }
    files.sort();
    let validate = |version: &str, paths: &[&str]| {
        let out = python
            .command()
            .current_dir(&repo)
            .args(["-m", "kubernetes_validate", "--strict", "-k", version])
            .args(paths)
            .output()
            .unwrap();
        (out.status.success(), kit::output_text(&out))
    };
    let paths: Vec<&str> = files.iter().map(|(f, _)| f.as_str()).collect();
    eprintln!("kubernetes-validate {version} --strict, Kubernetes {K8S_VERSIONS:?}:");
    for v in K8S_VERSIONS {
        let (ok, text) = validate(v, &paths);
        for line in text.lines() {
            eprintln!("  {line}");
        }
        assert!(ok, "kubernetes-validate -k {v} failed:\n{text}");
        assert!(!text.contains("ERROR"), "{text}");
        for (file, kinds) in &files {
            for (kind, name) in kinds {
                let line = if NOT_IN_K8S_SCHEMAS.iter().any(|(k, _)| k == kind) {
                    format!("WARN {file} Couldn't find schema for kind {kind} ")
                } else {
                    format!(
                        "INFO {file} passed for resource {}/{name} against version {v}",
                        kind.to_lowercase()
                    )
                };
                assert!(
                    text.lines().any(|l| l.starts_with(&line)),
                    "no line {line:?} from kubernetes-validate -k {v}:\n{text}"
                );
            }
        }
    }
    for (file, kinds) in &files {
        for (kind, name) in kinds {
            if let Some((_, why)) = NOT_IN_K8S_SCHEMAS.iter().find(|(k, _)| k == kind) {
                eprintln!("no Kubernetes API schema: {file} {kind} {name}: {why}");
            }
        }
    }

    // The validator is strict: a misspelt field fails, for every version.
    let sts = std::fs::read_to_string(kit::repo("deploy/kubernetes/statefulset/statefulset.yaml"))
        .unwrap();
    assert!(sts.contains("readOnlyRootFilesystem: true"));
    let bad = tmp.path().join("statefulset-misspelt.yaml");
    std::fs::write(
        &bad,
        sts.replace(
            "readOnlyRootFilesystem: true",
            "readOnlyRootFileSystem: true",
        ),
    )
    .unwrap();
    for v in K8S_VERSIONS {
        let (ok, text) = validate(v, &[bad.to_str().unwrap()]);
        assert!(
            !ok && text.contains("'readOnlyRootFileSystem' was unexpected"),
            "kubernetes-validate -k {v} accepted a misspelt field:\n{text}"
        );
        eprintln!(
            "  misspelt readOnlyRootFileSystem rejected by -k {v}: {}",
            text.trim()
        );
    }
}

/// The ServiceMonitor and PodMonitor, validated by
/// scripts/k8s-crd-validator/validate.mjs with the schemas of the npm package
/// @kubernetes-models/prometheus-operator (generated from the Prometheus
/// Operator's API types); and an interval that is no Prometheus duration
/// must fail.
#[test]
fn prometheus_operator_resources_match_their_schemas() {
    let modules = validators_dir().join("node");
    let node_version = Command::new("node")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(node_version) = node_version else {
        unavailable::<()>("no node (Node.js) to run scripts/k8s-crd-validator/validate.mjs");
        return;
    };
    if !modules.join(".installed-lock").is_file() {
        unavailable::<()>(&format!(
            "the npm packages of scripts/k8s-crd-validator are not installed in {}",
            modules.display()
        ));
        return;
    }
    let Some(python) = python_with_yaml() else {
        unavailable::<()>("no python3 with PyYAML to parse the manifests");
        return;
    };
    let repo = kit::repo("");
    let validate = |paths: &[&str]| {
        let out = Command::new("node")
            .current_dir(&repo)
            .env("PGSE_K8S_VALIDATORS", validators_dir())
            .arg("scripts/k8s-crd-validator/validate.mjs")
            .args(paths)
            .output()
            .unwrap();
        (out.status.success(), kit::output_text(&out))
    };
    let mut files = Vec::new();
    let mut expected = Vec::new();
    for (shape, _) in SHAPES {
        for f in yaml_files(&kit::repo(&format!("deploy/kubernetes/{shape}"))) {
            let rel = f.strip_prefix(&repo).unwrap().to_str().unwrap().to_string();
            for d in parse_yaml(&python, &f) {
                if str_of(&d["apiVersion"]).starts_with("monitoring.coreos.com/") {
                    expected.push(format!(
                        "INFO {rel} passed for resource {}/{} against \
                         @kubernetes-models/prometheus-operator ",
                        str_of(&d["kind"]).to_lowercase(),
                        str_of(&d["metadata"]["name"])
                    ));
                }
            }
            files.push(rel);
        }
    }
    assert_eq!(expected.len(), 2, "a ServiceMonitor and a PodMonitor");
    let paths: Vec<&str> = files.iter().map(String::as_str).collect();
    let (ok, text) = validate(&paths);
    eprintln!("scripts/k8s-crd-validator/validate.mjs, node {node_version}:");
    for line in text.lines() {
        eprintln!("  {line}");
    }
    assert!(ok, "validate.mjs failed:\n{text}");
    for want in &expected {
        assert!(
            text.lines().any(|l| l.starts_with(want.as_str())),
            "no line {want:?}:\n{text}"
        );
    }

    // An interval that is no Prometheus duration fails.
    let tmp = tempfile::tempdir().unwrap();
    let sm = std::fs::read_to_string(kit::repo(
        "deploy/kubernetes/statefulset/servicemonitor.yaml",
    ))
    .unwrap();
    assert!(sm.contains("interval: 15s"));
    let bad = tmp.path().join("servicemonitor-bad-interval.yaml");
    std::fs::write(&bad, sm.replace("interval: 15s", "interval: 15 seconds")).unwrap();
    let (ok, text) = validate(&[bad.to_str().unwrap()]);
    assert!(
        !ok && text.contains("/interval must match pattern"),
        "validate.mjs accepted interval: 15 seconds:\n{text}"
    );
    eprintln!("  interval \"15 seconds\" rejected: {}", text.trim());
}

/// Runs cnpg-crd-check on `docs` (JSON on its standard input).
fn cnpg_crd_check(bin: &Path, label: &str, docs: &Value) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(bin)
        .arg(label)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(docs.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), kit::output_text(&out))
}

/// The CloudNativePG resources, read by scripts/cnpg-crd-check into the
/// types kopium generated from CloudNativePG's CRDs (crate
/// k8s-crds-cloud-native-pg) and written back whole; a misspelt field and a
/// value outside an enum must fail.
#[test]
fn cloudnative_pg_cluster_matches_its_crd_types() {
    let bin = validators_dir().join("cnpg/bin/cnpg-crd-check");
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(version) = version else {
        unavailable::<()>(&format!("{} is not installed", bin.display()));
        return;
    };
    let Some(python) = python_with_yaml() else {
        unavailable::<()>("no python3 with PyYAML to parse the manifests");
        return;
    };
    let repo = kit::repo("");
    eprintln!("{version}:");
    let mut clusters = Vec::new();
    for (shape, _) in SHAPES {
        for f in yaml_files(&kit::repo(&format!("deploy/kubernetes/{shape}"))) {
            let rel = f.strip_prefix(&repo).unwrap().to_str().unwrap().to_string();
            let docs = parse_yaml(&python, &f);
            let cnpg: Vec<&Value> = docs
                .iter()
                .filter(|d| str_of(&d["apiVersion"]).starts_with("postgresql.cnpg.io/"))
                .collect();
            if cnpg.is_empty() {
                continue;
            }
            let (ok, text) = cnpg_crd_check(&bin, &rel, &Value::Array(docs.clone()));
            for line in text.lines() {
                eprintln!("  {line}");
            }
            assert!(ok, "cnpg-crd-check {rel}:\n{text}");
            for d in cnpg {
                let want = format!(
                    "INFO {rel} passed for resource {}/{} against ",
                    str_of(&d["kind"]).to_lowercase(),
                    str_of(&d["metadata"]["name"])
                );
                assert!(
                    text.lines().any(|l| l.starts_with(&want)),
                    "no line {want:?}:\n{text}"
                );
                if d["kind"] == "Cluster" {
                    clusters.push(d.clone());
                }
            }
        }
    }
    assert_eq!(clusters.len(), 1, "the CloudNativePG Cluster");

    // A misspelt field and a value outside an enum fail.
    let mut misspelt = clusters[0].clone();
    let wal = misspelt["spec"]
        .as_object_mut()
        .unwrap()
        .remove("walStorage")
        .unwrap();
    misspelt["spec"]["walstorage"] = wal;
    let (ok, text) = cnpg_crd_check(&bin, "misspelt", &misspelt);
    assert!(
        !ok && text.contains(".spec.walstorage: no such field in the CRD"),
        "{text}"
    );
    eprintln!("  {}", text.trim());
    let mut bad_enum = clusters[0].clone();
    bad_enum["spec"]["managed"]["roles"][0]["ensure"] = "presnt".into();
    let (ok, text) = cnpg_crd_check(&bin, "bad-enum", &bad_enum);
    assert!(!ok && text.contains("unknown variant `presnt`"), "{text}");
    eprintln!("  {}", text.trim());
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
    // Room for the default connection cap (256) plus the rest
    // (http::conns::FD_RESERVE), so the exporter need not lower the cap.
    let nofile: u64 = one("LimitNOFILE").parse().expect("LimitNOFILE= a number");
    assert!(nofile >= 1_024, "LimitNOFILE={nofile}");
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
    // The builder image is a build argument (scripts/container-test points
    // it at a local image); its default is the public one. The run-time
    // stage is scratch: the binary and what it links, nothing else.
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
    assert_eq!(froms[1], "FROM scratch");
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
