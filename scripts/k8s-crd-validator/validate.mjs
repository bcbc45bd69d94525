// Validates the Prometheus Operator resources (monitoring.coreos.com:
// ServiceMonitor, PodMonitor, ...) in YAML files with the schemas of the npm
// package @kubernetes-models/prometheus-operator, which are generated from
// the operator's Go API types (field types, required fields, enums and
// patterns such as the Duration format). Unlike `kubernetes-validate
// --strict`, those schemas do not reject unknown fields.
//
// Usage: node scripts/k8s-crd-validator/validate.mjs FILE...
//
// The packages come from scripts/install-k8s-validator, in
// $PGSE_K8S_VALIDATORS/node (default /opt/pgse/k8s-validators/node), with
// the versions of package-lock.json beside this file. Prints one line per
// resource, as kubernetes-validate does ("INFO FILE passed for resource
// KIND/NAME ...", "ERROR FILE did not validate for resource KIND/NAME ...:
// WHY"); documents of other API groups are left to kubernetes-validate and
// not printed. Exits 1 when a resource did not validate.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = join(
  process.env.PGSE_K8S_VALIDATORS || "/opt/pgse/k8s-validators",
  "node",
  "node_modules",
);
const load = (path) => import(pathToFileURL(join(modules, path)).href);
const pkg = JSON.parse(
  readFileSync(join(modules, "@kubernetes-models/prometheus-operator/package.json"), "utf8"),
);
const yaml = (await load("yaml/dist/index.js")).default;
const groups = {
  "monitoring.coreos.com/v1": await load(
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.js",
  ),
  "monitoring.coreos.com/v1alpha1": await load(
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1alpha1/index.js",
  ),
  "monitoring.coreos.com/v1beta1": await load(
    "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1beta1/index.js",
  ),
};
const against = `against ${pkg.name} ${pkg.version}`;

let failed = false;
for (const file of process.argv.slice(2)) {
  for (const doc of yaml.parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length) {
      console.log(`ERROR ${file} is not valid YAML: ${doc.errors[0].message}`);
      failed = true;
      continue;
    }
    const data = doc.toJS();
    if (!data || !String(data.apiVersion).startsWith("monitoring.coreos.com/")) continue;
    const resource = `${String(data.kind).toLowerCase()}/${data.metadata?.name}`;
    const model = groups[data.apiVersion]?.[data.kind];
    if (!model) {
      console.log(`ERROR ${file} has no schema for kind ${data.kind} ${data.apiVersion} ${against}`);
      failed = true;
      continue;
    }
    try {
      new model(data).validate();
      console.log(`INFO ${file} passed for resource ${resource} ${against}`);
    } catch (e) {
      console.log(`ERROR ${file} did not validate for resource ${resource} ${against}: ${e.message}`);
      failed = true;
    }
  }
}
process.exit(failed ? 1 : 0);
