//! Turns a cluster's discovery request into probed volumes. Runs on a
//! blocking thread: planning resolves paths and stats directories, and
//! adding a volume creates its probe files, any of which can hang on a dead
//! network volume, this product's main case.

use std::time::Duration;

use crate::postgres::DiscoveryRequest;
use crate::postgres::discovery;
use crate::probe::placement::{Asker, check_probe_dir};
use crate::probe::set::VolumeSet;
use crate::probe::settings::{ProbeSettings, VolumeSpec};
use crate::probe::state::VolumeState;

/// Plans the cluster's filesystems and adds a volume for each one no
/// other volume probes yet. Returns (volume, role) for every role found,
/// including those held by volumes that already existed.
///
/// `carried`: the volumes this cluster's discovery added before a reload
/// restarted its collector (a new password, say). Each one the plan has
/// again, at the same path with the same probe directory and probes, is
/// kept with its window and counters; the others are stopped and their
/// files removed, as a removed cluster's are.
pub(crate) fn apply(
    req: &DiscoveryRequest,
    volumes: &VolumeSet,
    defaults: &ProbeSettings,
    carried: &[String],
    timeout: Duration,
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
            stop_carried(cluster, volumes, carried, timeout);
            return Vec::new();
        }
    };
    let same = |v: &VolumeState| {
        plan.iter().any(|p| {
            p.name == v.name
                && p.path == v.path
                && p.probe_dir.as_ref() == Some(&v.probe_dir_path)
                && p.commit_probe() == v.commit_probe
                && p.read_probe() == v.read_probe
                && req.sync_method == v.sync_method
        })
    };
    let running = volumes.list();
    let (kept, gone): (Vec<String>, Vec<String>) = carried
        .iter()
        .cloned()
        .partition(|name| running.iter().any(|v| v.name == *name && same(v.as_ref())));
    // Before the plan is applied: a volume left at an old path must not
    // be taken for the one probing its filesystem.
    stop_carried(cluster, volumes, &gone, timeout);
    let planned = !plan.is_empty();
    let mut roles = Vec::new();
    for p in plan {
        let labels: Vec<String> = p.roles.iter().map(|r| r.label()).collect();
        if let Some(existing) = volumes.on_device(p.dev) {
            if kept.contains(&existing.name) {
                tracing::info!(cluster, volume = %existing.name, roles = ?labels, "discovered volume kept across the reload, with its window and counters");
            } else {
                tracing::info!(cluster, volume = %existing.name, roles = ?labels, "filesystem already probed by another volume");
            }
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

/// Stops carried volumes the new discovery does not have again.
fn stop_carried(cluster: &str, volumes: &VolumeSet, names: &[String], timeout: Duration) {
    for name in names {
        if volumes.remove(name, timeout) {
            tracing::info!(
                cluster,
                volume = %name,
                "discovered volume stopped: the cluster's discovery no longer finds it as it was"
            );
        }
    }
}
