//! Checks CloudNativePG resources (postgresql.cnpg.io/v1) against the Rust
//! types that kopium generated from CloudNativePG's CRDs, published as the
//! crate k8s-crds-cloud-native-pg (its versions follow CloudNativePG's
//! releases; 1.30.0 here).
//!
//! Each resource is read into its type and written back: reading fails on a
//! wrong type, a value outside an enum or a missing required field, and
//! a field that does not come back is not in the CRD (a misspelt field).
//! What the CRD's schema says beyond its structure (patterns, minimums,
//! CEL rules) is not checked.
//!
//! Usage: cnpg-crd-check [LABEL] < DOCUMENTS.json
//!
//! DOCUMENTS.json is one document or an array of them (YAML turned into
//! JSON); LABEL names them in the output, which has one line per
//! postgresql.cnpg.io resource in kubernetes-validate's form
//! ("INFO LABEL passed for resource KIND/NAME against ...", "ERROR LABEL did
//! not validate for resource KIND/NAME against ...: WHY"). Documents of other
//! API groups are not printed. Exits 1 when a resource did not validate.

use std::io::Read;
use std::process::ExitCode;

use k8s_crds_cloud_native_pg as cnpg;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

const AGAINST: &str = "against the CloudNativePG CRD types of k8s-crds-cloud-native-pg 1.30.0";

/// Where `read` (what was given) and `back` (what came back) differ.
fn diff(path: &str, read: &Value, back: &Value, out: &mut Vec<String>) {
    match (read, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => diff(&p, v, w, out),
                    None => out.push(format!("{p}: no such field in the CRD")),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                out.push(format!("{path}.{k}: added when read back"));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{i}]"), v, w, out);
            }
        }
        _ if read == back => {}
        _ => out.push(format!("{path}: {read} read back as {back}")),
    }
}

/// The problems of `doc` as a `T`: none when it reads and comes back whole.
fn check<T: DeserializeOwned + Serialize>(doc: &Value) -> Vec<String> {
    match serde_json::from_value::<T>(doc.clone()) {
        Err(e) => vec![e.to_string()],
        Ok(t) => {
            let back = serde_json::to_value(&t).expect("a read resource serializes");
            let mut out = Vec::new();
            diff("", doc, &back, &mut out);
            out
        }
    }
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("cnpg-crd-check {} {AGAINST}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let label = std::env::args().nth(1).unwrap_or_else(|| "-".into());
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("cnpg-crd-check: reading standard input: {e}");
        return ExitCode::from(2);
    }
    let docs = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(docs)) => docs,
        Ok(doc) => vec![doc],
        Err(e) => {
            eprintln!("cnpg-crd-check: standard input is not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for doc in &docs {
        let api = doc["apiVersion"].as_str().unwrap_or("");
        if !api.starts_with("postgresql.cnpg.io/") {
            continue;
        }
        let kind = doc["kind"].as_str().unwrap_or("");
        let name = doc["metadata"]["name"].as_str().unwrap_or("");
        let resource = format!("{}/{name}", kind.to_lowercase());
        let problems = match (api, kind) {
            ("postgresql.cnpg.io/v1", "Cluster") => check::<cnpg::Cluster>(doc),
            ("postgresql.cnpg.io/v1", "Pooler") => check::<cnpg::Pooler>(doc),
            ("postgresql.cnpg.io/v1", "Backup") => check::<cnpg::Backup>(doc),
            ("postgresql.cnpg.io/v1", "ScheduledBackup") => check::<cnpg::ScheduledBackup>(doc),
            ("postgresql.cnpg.io/v1", "Database") => check::<cnpg::Database>(doc),
            _ => vec![format!("no type for kind {kind} {api}")],
        };
        if problems.is_empty() {
            println!("INFO {label} passed for resource {resource} {AGAINST}");
        } else {
            failed = true;
            println!(
                "ERROR {label} did not validate for resource {resource} {AGAINST}: {}",
                problems.join("; ")
            );
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
