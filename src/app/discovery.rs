//! Turns a cluster's discovery request into probed volumes. Runs on a
//! blocking thread: planning resolves paths and stats directories, and
//! adding a volume creates its probe files, any of which can hang on a dead
//! network volume, this product's main case.

use crate::postgres::DiscoveryRequest;
use crate::postgres::discovery;
use crate::probe::placement::{Asker, check_probe_dir};
use crate::probe::set::VolumeSet;
use crate::probe::settings::{ProbeSettings, VolumeSpec};

/// Plans the cluster's filesystems and adds a volume for each one no
/// other volume probes yet. Returns (volume, role) for every role found,
/// including those held by volumes that already existed.
pub fn apply(
    req: &DiscoveryRequest,
    volumes: &VolumeSet,
    defaults: &ProbeSettings,
) -> Vec<(String, String)> {
    let cluster = req.cluster.as_str();
    let plan = match discovery::plan(cluster, req.major, &req.data_directory, &req.tablespaces) {
        Ok(p) => p,
        Err(why) => {
            tracing::warn!(
                cluster,
                reason = %why,
                code = "no_discovered_volume",
                "volume discovery skipped: no volume of this cluster is probed unless \
                 --probe.path or a [[volume]] names its directories"
            );
            return Vec::new();
        }
    };
    let planned = !plan.is_empty();
    let mut roles = Vec::new();
    for p in plan {
        let labels: Vec<String> = p.roles.iter().map(|r| r.label()).collect();
        if let Some(existing) = volumes.on_device(p.dev) {
            tracing::info!(cluster, volume = %existing.name, roles = ?labels, "filesystem already probed by another volume");
            roles.extend(labels.into_iter().map(|r| (existing.name.clone(), r)));
            continue;
        }
        let probe_dir = match p.probe_dir.clone() {
            Some(pd) => match check_probe_dir(&p.path, &pd, Asker::Discovery) {
                Ok(()) => pd,
                Err(why) => {
                    tracing::warn!(cluster, path = %p.path.display(), roles = ?labels, reason = %why, "not probing this filesystem");
                    continue;
                }
            },
            None => {
                tracing::warn!(cluster, path = %p.path.display(), roles = ?labels, reason = ?p.skipped, "not probing this filesystem");
                continue;
            }
        };
        let mut probe = defaults.clone();
        probe.commit_probe = p.commit_probe();
        probe.read_probe = p.read_probe();
        probe.sync_method = req.sync_method;
        let spec = VolumeSpec {
            name: p.name.clone(),
            path: p.path.clone(),
            probe_dir,
            probe,
            provisioned: Vec::new(),
            cgroup: None,
        };
        match volumes.add(spec) {
            Ok(v) => {
                super::warnings::volume(&v);
                roles.extend(labels.into_iter().map(|r| (v.name.clone(), r)));
            }
            Err(e) => {
                tracing::warn!(cluster, volume = %p.name, error = %e, "cannot add discovered volume")
            }
        }
    }
    if planned && roles.is_empty() {
        tracing::warn!(
            cluster,
            code = "no_discovered_volume",
            "none of this cluster's filesystems is probed (see the lines above); add \
             --probe.path or a [[volume]] with a probe_dir beside its directories"
        );
    }
    roles
}
