//! The deployment manifests (`manifests/`) against the code and the contract: every file parses,
//! the webhook paths are the server's routes, the RBAC grants exactly `API_CALLS`, the pod is
//! hardened as promised, every kustomization renders, and (through `tests/validate_manifests.py`)
//! every rendered object validates against the Kubernetes schemas; the sample JobSets, as the
//! webhook patches them, are what the kube-apiserver takes.
//!
//! Tests that need `kubectl` or the `kubernetes-validate` Python package fail when the tool is
//! missing, unless `SKIP_TEST_SUITES=manifests` opts out (`tests/support/prerequisites.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mpi_webhook::api_calls::{API_CALLS, RECONCILE, SERVE};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

#[path = "support/kustomize.rs"]
mod kustomize;
use kustomize::{copy_dir, kustomize, kustomize_with};
#[path = "support/pod_validation.rs"]
mod pod_validation;
#[path = "support/prerequisites.rs"]
mod prerequisites;
#[path = "support/pss.rs"]
mod pss;

const NAMESPACE: &str = "mpi-webhook";
const SERVICE_ACCOUNT: &str = "mpi-webhook";
const IMAGE: &str = "ghcr.io/mpi-webhook/mpi-webhook:0.1.0";
const TLS_SECRET: &str = "mpi-webhook-tls";
const TLS_DIR: &str = "/etc/mpi-webhook/tls";
const OWNED_BY_TRAINJOB: &str = "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r, r.apiVersion.startsWith('trainer.kubeflow.org/') && r.kind == 'TrainJob' && has(r.controller) && r.controller)";
/// JobSet mode's opt-in label: the JobSet-mode webhooks select on it.
const JOBSET_MODE_LABEL: &str = "mpi-webhook.io/implementation";
const MUTATE_JOBSET: &str = "/mutate-jobset-x-k8s-io-v1alpha2-jobset";

/// The HTTPS routes `serve` answers on, from the server's own route table.
fn server_routes() -> BTreeSet<&'static str> {
    mpi_webhook::admission::Route::ALL
        .iter()
        .map(|route| route.path())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manifests() -> PathBuf {
    repo().join("manifests")
}

/// Every `*.yaml`, `*.yml` and `*.json` file under `dir`, in path order.
fn data_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read manifests dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            out.extend(data_files(&path));
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(path);
        }
    }
    out
}

/// The documents of one YAML or JSON file, parsed as the code parses them (serde-saphyr).
fn docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read manifest");
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(&text)
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()))
}

fn docs_of(paths: &[&str]) -> Vec<Value> {
    paths
        .iter()
        .flat_map(|p| docs(&manifests().join(p)))
        .collect()
}

fn base() -> Vec<Value> {
    let kustomization = docs(&manifests().join("base/kustomization.yaml"));
    let resources = kustomization[0]["resources"]
        .as_array()
        .expect("base resources");
    resources
        .iter()
        .flat_map(|r| {
            docs(
                &manifests()
                    .join("base")
                    .join(r.as_str().expect("resource path")),
            )
        })
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn webhooks(objects: &[Value]) -> Vec<(&str, &Value)> {
    let mut out = Vec::new();
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        for config in of_kind(objects, kind) {
            for hook in config["webhooks"].as_array().expect("webhooks") {
                out.push((kind, hook));
            }
        }
    }
    out
}

fn container<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// A tool from PATH; `None` after saying so when `SKIP_TEST_SUITES` names `manifests`.
///
/// # Panics
/// The tool is missing and not opted out of.
fn tool(name: &str, probe: &[&str]) -> Option<PathBuf> {
    static NOTICE: std::sync::Once = std::sync::Once::new();
    let found = Command::new(name)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(PathBuf::from(name));
    }
    prerequisites::skip_or_fail(
        "manifests",
        &format!("`{name}` is not installed"),
        "scripts/install-test-deps.sh installs it",
        &NOTICE,
    );
    None
}

// ---------------------------------------------------------------------------------------------
// Every file

#[test]
fn every_manifest_parses_into_objects_with_kind_and_name() {
    let files = data_files(&manifests());
    assert!(files.len() > 10, "found only {files:?}");
    for path in files {
        let documents = docs(&path);
        assert!(!documents.is_empty(), "{} is empty", path.display());
        // A kustomize transformer configuration is not an object: its kustomization lists it.
        if path
            .file_name()
            .is_some_and(|n| n == "kustomizeconfig.yaml")
        {
            let kustomization = docs(&path.with_file_name("kustomization.yaml"));
            assert_eq!(
                kustomization[0]["configurations"],
                json!(["kustomizeconfig.yaml"]),
                "{}",
                path.display()
            );
            continue;
        }
        for doc in documents {
            let shown = path.display();
            assert!(doc.is_object(), "{shown}: a document is not an object");
            assert!(doc["apiVersion"].is_string(), "{shown}: no apiVersion");
            assert!(doc["kind"].is_string(), "{shown}: no kind");
            if doc["kind"] != "Kustomization" && doc["kind"] != "AdmissionReview" {
                assert!(
                    doc["metadata"]["name"].is_string(),
                    "{shown}: no metadata.name"
                );
            }
        }
    }
}

#[test]
fn the_cli_certs_overlay_never_commits_key_material() {
    let tls = manifests().join("overlays/cli-certs/tls");
    let ignore = std::fs::read_to_string(tls.join(".gitignore")).expect(".gitignore");
    assert!(ignore.lines().any(|l| l == "*"), "{ignore}");
}

// ---------------------------------------------------------------------------------------------
// Webhook configurations

#[test]
fn webhook_paths_are_exactly_the_server_routes() {
    let objects = base();
    let paths: Vec<&str> = webhooks(&objects)
        .iter()
        .map(|(_, hook)| {
            hook["clientConfig"]["service"]["path"]
                .as_str()
                .expect("path")
        })
        .collect();
    let unique: BTreeSet<&str> = paths.iter().copied().collect();
    // The JobSet mutation is registered twice, once per mode (TrainJob-owned; labelled).
    let twice: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| paths.iter().filter(|q| q == &p).count() > 1)
        .collect();
    assert_eq!(
        twice,
        [MUTATE_JOBSET, MUTATE_JOBSET],
        "only the mutation twice"
    );
    assert_eq!(unique, server_routes());
}

#[test]
fn every_webhook_fails_closed_fast_and_never_sees_its_own_namespace_or_kube_system() {
    let objects = base();
    let hooks = webhooks(&objects);
    assert_eq!(hooks.len(), 6);
    for (kind, hook) in hooks {
        let name = hook["name"].as_str().expect("name");
        assert_eq!(hook["sideEffects"], "None", "{name}");
        assert_eq!(strings(&hook["admissionReviewVersions"]), ["v1"], "{name}");
        assert_eq!(hook["failurePolicy"], "Fail", "{name}");
        assert_eq!(hook["timeoutSeconds"], 5, "{name}");
        assert!(hook["clientConfig"]["url"].is_null(), "{name}");
        let service = &hook["clientConfig"]["service"];
        assert_eq!(service["name"], "mpi-webhook", "{name}");
        assert_eq!(service["namespace"], NAMESPACE, "{name}");
        assert_eq!(service["port"], 443, "{name}");
        let excluded = hook["namespaceSelector"]["matchExpressions"]
            .as_array()
            .expect("namespaceSelector")
            .iter()
            .find(|e| e["key"] == "kubernetes.io/metadata.name")
            .unwrap_or_else(|| panic!("{name}: no namespace exclusion"));
        assert_eq!(excluded["operator"], "NotIn", "{name}");
        let values: BTreeSet<&str> = strings(&excluded["values"]).into_iter().collect();
        assert_eq!(values, BTreeSet::from([NAMESPACE, "kube-system"]), "{name}");
        let rules = hook["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 1, "{name}");
        let rule = &rules[0];
        if kind == "MutatingWebhookConfiguration" {
            assert_eq!(strings(&rule["apiGroups"]), ["jobset.x-k8s.io"]);
            assert_eq!(strings(&rule["apiVersions"]), ["v1alpha2"]);
            assert_eq!(strings(&rule["resources"]), ["jobsets"]);
            assert_eq!(strings(&rule["operations"]), ["CREATE"]);
            let conditions = hook["matchConditions"].as_array().expect("matchConditions");
            if hook["objectSelector"].is_null() {
                assert!(
                    conditions
                        .iter()
                        .any(|c| c["expression"] == OWNED_BY_TRAINJOB),
                    "{name}: only TrainJob-owned JobSets may reach the webhook"
                );
            } else {
                assert_selects_the_jobset_mode_label(name, hook);
                assert!(
                    conditions
                        .iter()
                        .any(|c| c["expression"] == format!("!({OWNED_BY_TRAINJOB})")),
                    "{name}: TrainJob-owned JobSets are the TrainJob-mode entry's"
                );
            }
        } else if strings(&rule["resources"]) == ["jobsets"] {
            assert_eq!(strings(&rule["apiGroups"]), ["jobset.x-k8s.io"]);
            assert_eq!(strings(&rule["apiVersions"]), ["v1alpha2"]);
            assert_eq!(strings(&rule["operations"]), ["CREATE", "UPDATE"]);
            assert_selects_the_jobset_mode_label(name, hook);
        } else {
            assert_eq!(strings(&rule["apiGroups"]), ["trainer.kubeflow.org"]);
            assert_eq!(strings(&rule["apiVersions"]), ["v1alpha1"]);
            assert_eq!(strings(&rule["operations"]), ["CREATE", "UPDATE"]);
        }
    }
}

/// Only labelled JobSets reach a JobSet-mode webhook: every other JobSet never depends on it.
fn assert_selects_the_jobset_mode_label(name: &str, hook: &Value) {
    assert_eq!(
        hook["objectSelector"],
        json!({"matchExpressions": [{"key": JOBSET_MODE_LABEL, "operator": "Exists"}]}),
        "{name}"
    );
}

#[test]
fn each_route_is_registered_for_its_own_resource() {
    let objects = base();
    let expected = [
        (
            "/validate-trainer-kubeflow-org-v1alpha1-trainjob",
            "trainjobs",
        ),
        (
            "/validate-trainer-kubeflow-org-v1alpha1-trainingruntime",
            "trainingruntimes",
        ),
        (
            "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime",
            "clustertrainingruntimes",
        ),
        ("/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobsets"),
        ("/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobsets"),
    ];
    for (path, resource) in expected {
        let (_, hook) = webhooks(&objects)
            .into_iter()
            .find(|(_, h)| h["clientConfig"]["service"]["path"] == path)
            .unwrap_or_else(|| panic!("no webhook for {path}"));
        assert_eq!(
            strings(&hook["rules"][0]["resources"]),
            [resource],
            "{path}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Service, Deployment, PodDisruptionBudget

#[test]
fn the_service_sends_443_to_the_webhook_containers_9443() {
    let objects = base();
    let service = find(&objects, "Service", "mpi-webhook");
    assert_eq!(service["metadata"]["namespace"], NAMESPACE);
    let ports = service["spec"]["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["port"], 443);
    assert_eq!(ports[0]["name"], "webhook");
    let deployment = find(&objects, "Deployment", "mpi-webhook");
    let webhook = container(deployment, "webhook");
    let target = &ports[0]["targetPort"];
    let port = webhook["ports"]
        .as_array()
        .expect("container ports")
        .iter()
        .find(|p| &p["name"] == target || &p["containerPort"] == target)
        .expect("targetPort names a webhook container port");
    assert_eq!(port["containerPort"], 9443);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&labels[key], value, "Service selector {key}");
    }
}

#[test]
fn the_deployment_runs_serve_and_reconcile_from_one_image_as_the_contract_says() {
    let objects = base();
    let deployment = find(&objects, "Deployment", "mpi-webhook");
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], SERVICE_ACCOUNT);
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2);

    let webhook = container(deployment, "webhook");
    assert_eq!(webhook["image"], IMAGE);
    assert_eq!(
        env_value(webhook, "MPI_WEBHOOK_PREFLIGHT_IMAGE"),
        IMAGE,
        "the pre-flight runs the webhook's image"
    );
    assert_eq!(
        strings(&webhook["args"]),
        [
            "serve",
            "--listen",
            "0.0.0.0:9443",
            "--tls-cert-file",
            "/etc/mpi-webhook/tls/tls.crt",
            "--tls-key-file",
            "/etc/mpi-webhook/tls/tls.key",
            "--metrics-listen",
            "0.0.0.0:9090",
            "--shutdown-delay",
            "5s",
        ]
    );
    // The kubelet must wait for the shutdown delay plus the drain before it kills the pod.
    let delay = Duration::from_secs(5);
    let drain = mpi_webhook::serve::ServeOptions::DEFAULT_SHUTDOWN_GRACE;
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        Duration::from_secs(grace) > delay + drain,
        "terminationGracePeriodSeconds {grace} does not cover delay {delay:?} + drain {drain:?}"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &webhook[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["scheme"], "HTTPS", "{probe}");
        assert!(get["port"] == "webhook" || get["port"] == 9443, "{probe}");
    }
    let mount = webhook["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["mountPath"] == TLS_DIR)
        .expect("TLS mount");
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("TLS volume");
    assert_eq!(volume["secret"]["secretName"], TLS_SECRET);

    let reconciler = container(deployment, "reconciler");
    assert_eq!(reconciler["image"], IMAGE);
    assert_eq!(
        strings(&reconciler["args"]),
        [
            "reconcile",
            "--leader-elect",
            "--metrics-listen",
            "0.0.0.0:9091"
        ]
    );
    let liveness = &reconciler["livenessProbe"]["httpGet"];
    assert_eq!(liveness["path"], "/healthz");
    assert_eq!(liveness["scheme"], "HTTP");
    assert!(liveness["port"] == "reconcile-http" || liveness["port"] == 9091);
    let env = reconciler["env"].as_array().expect("env");
    for (name, field) in [
        ("MPI_WEBHOOK_LEASE_NAMESPACE", "metadata.namespace"),
        ("MPI_WEBHOOK_LEASE_HOLDER", "metadata.name"),
    ] {
        let var = env
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(var["valueFrom"]["fieldRef"]["fieldPath"], field, "{name}");
    }
}

#[test]
fn the_pod_is_non_root_read_only_unprivileged_with_runtime_default_seccomp_and_bounded() {
    let objects = base();
    let deployment = find(&objects, "Deployment", "mpi-webhook");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(pod["hostNetwork"].is_null() && pod["hostPID"].is_null());
    for c in pod["containers"].as_array().expect("containers") {
        let name = c["name"].as_str().expect("name");
        let security = &c["securityContext"];
        assert_eq!(security["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(security["runAsNonRoot"], true, "{name}");
        assert_eq!(
            strings(&security["capabilities"]["drop"]),
            ["ALL"],
            "{name}"
        );
        assert_ne!(security["privileged"], true, "{name}");
        for bound in ["requests", "limits"] {
            for resource in ["cpu", "memory"] {
                assert!(
                    c["resources"][bound][resource].is_string(),
                    "{name}: {bound}.{resource}"
                );
            }
        }
        assert!(c["livenessProbe"].is_object(), "{name}: livenessProbe");
    }
}

#[test]
fn two_replicas_spread_over_nodes_and_a_disruption_budget_keeps_one() {
    let objects = base();
    let deployment = find(&objects, "Deployment", "mpi-webhook");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        .as_array()
        .expect("topologySpreadConstraints");
    assert!(
        spread
            .iter()
            .any(|s| s["topologyKey"] == "kubernetes.io/hostname")
    );
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let pdb = find(&objects, "PodDisruptionBudget", "mpi-webhook");
    assert_eq!(pdb["metadata"]["namespace"], NAMESPACE);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    for (key, value) in pdb["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("PDB selector")
    {
        assert_eq!(&labels[key], value, "PDB selector {key}");
    }
}

// ---------------------------------------------------------------------------------------------
// RBAC

/// One granted or needed permission: (component, group, resource, verb, own namespace only).
type Grant = (String, String, String, String, bool);

fn needed() -> BTreeSet<Grant> {
    API_CALLS
        .iter()
        .flat_map(|call| {
            call.verbs.iter().map(|verb| {
                (
                    call.component.to_string(),
                    call.group.to_string(),
                    call.resource.to_string(),
                    verb.to_string(),
                    call.namespaced_to_own_namespace,
                )
            })
        })
        .collect()
}

/// The permissions the manifests give the ServiceAccount, per component (the role's
/// `app.kubernetes.io/component` label). `resourceNames` only narrows a rule, so it is ignored.
fn granted(objects: &[Value]) -> BTreeSet<Grant> {
    let is_ours = |binding: &Value| {
        let subjects = binding["subjects"].as_array().expect("subjects");
        assert_eq!(subjects.len(), 1, "{binding}");
        subjects[0]["kind"] == "ServiceAccount"
            && subjects[0]["name"] == SERVICE_ACCOUNT
            && subjects[0]["namespace"] == NAMESPACE
    };
    let mut out = BTreeSet::new();
    for (binding_kind, role_kind) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        for binding in of_kind(objects, binding_kind) {
            assert!(is_ours(binding), "{binding} binds someone else");
            assert_eq!(binding["roleRef"]["kind"], role_kind, "{binding}");
            let role_name = binding["roleRef"]["name"].as_str().expect("roleRef.name");
            let role = find(objects, role_kind, role_name);
            let own_namespace = role_kind == "Role";
            if own_namespace {
                assert_eq!(role["metadata"]["namespace"], NAMESPACE);
                assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
            }
            let component = role["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap_or_else(|| panic!("{role_name} has no component label"));
            for rule in role["rules"].as_array().expect("rules") {
                assert!(rule["nonResourceURLs"].is_null(), "{role_name}: {rule}");
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            for word in [group, resource, verb] {
                                assert_ne!(word, "*", "{role_name}: wildcard in {rule}");
                            }
                            out.insert((
                                component.to_string(),
                                group.to_string(),
                                resource.to_string(),
                                verb.to_string(),
                                own_namespace,
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn rbac_grants_every_verb_the_code_uses_and_no_more() {
    let objects = base();
    let granted = granted(&objects);
    let needed = needed();
    let missing: Vec<_> = needed.difference(&granted).collect();
    let extra: Vec<_> = granted.difference(&needed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "RBAC and src/api_calls.rs differ.\nmissing from manifests/base/rbac.yaml: {missing:#?}\n\
         granted but not in API_CALLS: {extra:#?}"
    );
    for component in [SERVE, RECONCILE] {
        assert!(granted.iter().any(|g| g.0 == component), "{component}");
    }
}

/// The rows of the table under docs/operations.md's "What mpi-webhook can read", one grant per
/// verb, in [`needed`]'s form; a row that does not parse is an error naming its line.
fn documented_grants() -> Result<BTreeSet<Grant>, String> {
    let path = repo().join("docs/operations.md");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let start = text
        .find("\n## What mpi-webhook can read\n")
        .ok_or("docs/operations.md has no section \"What mpi-webhook can read\"")?;
    let section = &text[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut grants = BTreeSet::new();
    let rows = section
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (line, cells)
        });
    for (line, cells) in rows {
        let [_, component, group, resource, verbs, scope, ..] = cells[..] else {
            return Err(format!("a row without six cells: {line}"));
        };
        let group = match group {
            "(core)" => "",
            quoted => quoted.trim_matches('`'),
        };
        let own_namespace = match scope {
            "cluster" => false,
            "own namespace" => true,
            other => {
                return Err(format!(
                    "scope {other:?} is neither cluster nor own namespace: {line}"
                ));
            }
        };
        for verb in verbs.split(',').map(str::trim) {
            grants.insert((
                component.to_string(),
                group.to_string(),
                resource.to_string(),
                verb.to_string(),
                own_namespace,
            ));
        }
    }
    Ok(grants)
}

/// docs/operations.md's "What mpi-webhook can read" says what the ServiceAccount may do: each
/// permission of API_CALLS (and so of the RBAC, checked above) once, and no other.
#[test]
fn the_operations_page_lists_exactly_the_grants_of_api_calls() {
    let documented = documented_grants().unwrap_or_else(|e| panic!("{e}"));
    let needed = needed();
    let missing: Vec<_> = needed.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&needed).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/operations.md \"What mpi-webhook can read\" and src/api_calls.rs differ.\n\
         missing from the table: {missing:#?}\nin the table but not in API_CALLS: {extra:#?}"
    );
    assert!(
        !documented
            .iter()
            .any(|g| g.2 == "secrets" && matches!(g.3.as_str(), "get" | "list" | "watch")),
        "a read of Secrets is documented"
    );
}

#[test]
fn every_role_is_bound_and_every_role_and_binding_is_named_for_us() {
    let objects = base();
    for (role_kind, binding_kind) in [
        ("ClusterRole", "ClusterRoleBinding"),
        ("Role", "RoleBinding"),
    ] {
        for role in of_kind(&objects, role_kind) {
            let name = &role["metadata"]["name"];
            assert!(
                name.as_str().expect("name").starts_with("mpi-webhook-"),
                "{name}"
            );
            assert!(
                of_kind(&objects, binding_kind)
                    .iter()
                    .any(|b| &b["roleRef"]["name"] == name),
                "{role_kind} {name} is not bound"
            );
        }
    }
    find(&objects, "ServiceAccount", SERVICE_ACCOUNT);
}

// ---------------------------------------------------------------------------------------------
// Runtimes and samples

/// The upstream files the repository carries (`tests/fixtures/upstream/README.md`): path in the
/// repository, and the upstream path `SHA256SUMS` names it by.
const VENDORED: &[(&str, &str)] = &[
    (
        "tests/fixtures/upstream/kubeflow-trainer/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
        "kubeflow-trainer/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
    ),
    (
        "manifests/overlays/crds-intel-mpich/upstream/trainer.kubeflow.org_trainingruntimes.yaml",
        "kubeflow-trainer/manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
    ),
    (
        "manifests/overlays/crds-intel-mpich/upstream/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "kubeflow-trainer/manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ),
    (
        "manifests/runtimes/deepspeed_distributed.yaml",
        "kubeflow-trainer/manifests/base/runtimes/deepspeed_distributed.yaml",
    ),
    (
        "manifests/runtimes/mlx_distributed.yaml",
        "kubeflow-trainer/manifests/base/runtimes/mlx_distributed.yaml",
    ),
    (
        "tests/fixtures/upstream/jobset/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
        "jobset/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
    ),
    (
        "tests/fixtures/upstream/jobset/config/components/webhook/manifests.yaml",
        "jobset/config/components/webhook/manifests.yaml",
    ),
    (
        "tests/fixtures/upstream/jobset/config/components/webhook/patches/mutating-patch.yaml",
        "jobset/config/components/webhook/patches/mutating-patch.yaml",
    ),
    (
        "tests/fixtures/upstream/jobset/config/components/webhook/patches/validating-patch.yaml",
        "jobset/config/components/webhook/patches/validating-patch.yaml",
    ),
];

#[test]
fn the_shipped_runtimes_are_the_four_mpi_implementations() {
    let runtimes = docs_of(&[
        "runtimes/deepspeed_distributed.yaml",
        "runtimes/mlx_distributed.yaml",
        "runtimes/intel_mpi_distributed.yaml",
        "runtimes/mpich_distributed.yaml",
    ]);
    let got: Vec<(&str, &str)> = runtimes
        .iter()
        .map(|r| {
            (
                r["metadata"]["name"].as_str().expect("name"),
                r["spec"]["mlPolicy"]["mpi"]["mpiImplementation"]
                    .as_str()
                    .expect("mpiImplementation"),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("deepspeed-distributed", "OpenMPI"),
            ("mlx-distributed", "OpenMPI"),
            ("intel-mpi-distributed", "Intel"),
            ("mpich-distributed", "MPICH"),
        ]
    );
    for runtime in &runtimes {
        assert_eq!(runtime["kind"], "ClusterTrainingRuntime");
    }
}

/// A clone of the repository is all a user has: no file that builds, tests, benchmarks or runs
/// the project may point outside it (the team's spec folder next to the repository root in
/// particular, which a clone does not have). One exception: `scripts/install-envtest.sh` may
/// unpack the team's copy of the envtest binaries when that folder exists (it takes
/// `KUBEBUILDER_ASSETS` or the envtest release otherwise); it is checked to name the folder once
/// and use it only behind a test for it.
#[test]
fn no_file_refers_outside_the_repository() {
    // Spelled in two pieces so that this file does not match itself.
    let outside = format!("{}/shared", "..");
    let optional = format!("envtest_src=\"${{TEAM_ENVTEST:-{outside}/envtest}}\"\n");
    let guarded = "elif [ -d \"$envtest_src\" ]; then";
    let mut offenders = Vec::new();
    for dir in ["src", "tests", "benches", "scripts", ".ci", "fuzz"] {
        let mut files = Vec::new();
        walk(&repo().join(dir), &mut files);
        for file in files {
            // Binary files (none today) are not read as text.
            if let Ok(text) = std::fs::read_to_string(&file)
                && text.contains(&outside)
                && !(file.ends_with("scripts/install-envtest.sh")
                    && text.matches(&outside).count() == 1
                    && text.contains(&optional)
                    && text.matches("$envtest_src").count() == 3
                    && text.contains(guarded))
            {
                offenders.push(
                    file.strip_prefix(repo())
                        .unwrap_or(&file)
                        .display()
                        .to_string(),
                );
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "these files refer to {outside}, which a clone does not have: {offenders:?}"
    );
}

/// Every file below `dir` (none when it does not exist), skipping build output and fuzzing's
/// corpora and crash artifacts (generated bytes, git-ignored).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if !["target", "corpus", "artifacts"]
                .iter()
                .any(|skipped| path.ends_with(skipped))
            {
                walk(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// Every vendored upstream file is byte for byte the upstream file: its SHA-256 is the one
/// `tests/fixtures/upstream/SHA256SUMS` records for the upstream path, and every recorded file
/// is vendored.
#[test]
fn vendored_upstream_files_are_verbatim_copies() {
    use sha2::{Digest, Sha256};
    let sums = std::fs::read_to_string(repo().join("tests/fixtures/upstream/SHA256SUMS"))
        .expect("SHA256SUMS");
    let recorded: BTreeSet<(&str, &str)> = sums
        .lines()
        .map(|line| line.split_once("  ").expect("`<sha256>  <path>` lines"))
        .map(|(sum, path)| (path, sum))
        .collect();
    let mut vendored = BTreeSet::new();
    for (ours, theirs) in VENDORED {
        let bytes = std::fs::read(repo().join(ours)).unwrap_or_else(|e| panic!("{ours}: {e}"));
        let sum: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(
            recorded.contains(&(*theirs, sum.as_str())),
            "{ours} is not upstream's {theirs} (sha256 {sum})"
        );
        vendored.insert(*theirs);
    }
    let listed: BTreeSet<&str> = recorded.iter().map(|(path, _)| *path).collect();
    assert_eq!(listed, vendored, "every file of SHA256SUMS is vendored");
}

#[test]
fn sample_trainjobs_reference_shipped_runtimes_and_can_be_matched_offline() {
    let runtimes: BTreeSet<String> = data_files(&manifests().join("runtimes"))
        .iter()
        .flat_map(|p| docs(p))
        .filter(|d| d["kind"] == "ClusterTrainingRuntime")
        .map(|d| d["metadata"]["name"].as_str().expect("name").to_string())
        .collect();
    let samples: Vec<Value> = data_files(&manifests().join("samples"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .flat_map(|p| docs(p))
        .collect();
    let trainjobs = of_kind(&samples, "TrainJob");
    assert_eq!(trainjobs.len(), 4);
    for tj in trainjobs {
        let name = tj["metadata"]["name"].as_str().expect("name");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{name}"
        );
        assert_eq!(tj["metadata"]["namespace"], "default", "{name}");
        assert!(tj["metadata"]["uid"].is_string(), "{name}");
        assert_eq!(tj["spec"]["trainer"]["numNodes"], 3, "{name}");
        let runtime = tj["spec"]["runtimeRef"]["name"].as_str().expect("runtime");
        assert!(runtimes.contains(runtime), "{name}: runtime {runtime}");
    }
}

#[test]
fn sample_reviews_are_the_three_documented_cases() {
    let reviews = manifests().join("samples/reviews");
    let read = |file: &str| docs(&reviews.join(file)).remove(0);

    let allowed = read("trainjob-create-allowed.json");
    let denied = read("trainjob-create-denied-reserved-env.json");
    let jobset = read("jobset-create-owned-by-trainjob.json");
    let mut uids = BTreeSet::new();
    for review in [&allowed, &denied, &jobset] {
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        assert_eq!(review["request"]["operation"], "CREATE");
        assert!(uids.insert(review["request"]["uid"].as_str().expect("uid")));
        assert_eq!(
            review["request"]["object"]["kind"],
            review["request"]["kind"]["kind"]
        );
    }
    let env = &denied["request"]["object"]["spec"]["trainer"]["env"];
    assert!(
        env.as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "OMPI_MCA_orte_default_hostfile")
    );

    let owner = &jobset["request"]["object"]["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "TrainJob");
    assert_eq!(owner["controller"], true);
    let sample = docs(&manifests().join("samples/trainjob-pi-deepspeed.yaml")).remove(0);
    assert_eq!(owner["name"], sample["metadata"]["name"]);
    assert_eq!(owner["uid"], sample["metadata"]["uid"]);
    assert_eq!(
        allowed["request"]["object"]["metadata"]["uid"],
        sample["metadata"]["uid"]
    );
}

/// JobSet mode: one plain JobSet per implementation that `kubectl create` takes as is (the
/// CRD schema is checked by tests/validate_manifests.py), written minimally (images, the
/// launcher's command, the counts; no command on the workers, no probe, no dependsOn: the
/// webhook fills them in; one annotation, the mpioperator images' sshd port), `node` listed
/// before `launcher` (JobSet lets a replicatedJob depend only on earlier ones, so the webhook
/// can add the launcher's), and an AdmissionReview of its CREATE carrying exactly that JobSet
/// (`scripts/sample-reviews.py` writes it).
#[test]
fn jobset_mode_samples_are_one_per_implementation_with_their_reviews() {
    // The restricted and worker-groups samples have tests of their own (below).
    let samples: Vec<Value> = data_files(&manifests().join("samples"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.to_string_lossy().ends_with("-restricted.yaml"))
        .filter(|p| !p.to_string_lossy().ends_with("-groups.yaml"))
        .flat_map(|p| docs(p))
        .filter(|d| d["kind"] == "JobSet")
        .collect();
    let implementations: Vec<&str> = samples
        .iter()
        .map(|j| {
            j["metadata"]["labels"][JOBSET_MODE_LABEL]
                .as_str()
                .expect("label")
        })
        .collect();
    assert_eq!(implementations, ["Intel", "MPICH", "OpenMPI"]);
    for jobset in &samples {
        let name = jobset["metadata"]["name"].as_str().expect("name");
        assert!(jobset["metadata"]["ownerReferences"].is_null(), "{name}");
        let rjobs = jobset["spec"]["replicatedJobs"].as_array().expect("rjobs");
        let names: Vec<&str> = rjobs
            .iter()
            .map(|r| r["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["node", "launcher"], "{name}");
        let keys = |value: &Value| -> Vec<String> {
            let mut keys: Vec<String> = value
                .as_object()
                .expect("an object")
                .keys()
                .cloned()
                .collect();
            keys.sort();
            keys
        };
        for (rjob, job, container) in [
            (
                &rjobs[0],
                vec!["completions", "parallelism", "template"],
                vec!["image", "name"],
            ),
            (
                &rjobs[1],
                vec!["template"],
                vec!["command", "image", "name"],
            ),
        ] {
            let at = format!("{name} {}", rjob["name"]);
            assert_eq!(keys(rjob), ["name", "template"], "{at}: no dependsOn");
            assert_eq!(keys(&rjob["template"]["spec"]), job, "{at}");
            let pod = &rjob["template"]["spec"]["template"]["spec"];
            assert_eq!(keys(pod), ["containers", "restartPolicy"], "{at}");
            let containers = pod["containers"].as_array().expect("containers");
            assert_eq!(containers.len(), 1, "{at}");
            assert_eq!(
                keys(&containers[0]),
                container,
                "{at}: no command, args or probe"
            );
        }
        assert_eq!(
            jobset["metadata"]["annotations"],
            json!({"mpi-webhook.io/ssh-port": "2222"}),
            "{name}: the images' sshd port, nothing else"
        );
        let review = docs(&manifests().join(format!(
            "samples/reviews/jobset-mode-create-{}.json",
            name.strip_prefix("pi-jobset-").expect("pi-jobset-<implementation>")
        )))
        .remove(0);
        assert_eq!(review["request"]["operation"], "CREATE", "{name}");
        assert_eq!(&review["request"]["object"], jobset, "{name}");
    }
}

/// `jobset-pi-openmpi-groups.yaml` (Decision 20): two worker groups with their own node
/// selectors, listed before the launcher (so the webhook can add its dependsOn on both), 2 hosts
/// of 1 slot and 1 host of 3; its review carries exactly it.
#[test]
fn the_worker_groups_sample_has_two_groups_before_the_launcher_and_its_review() {
    let sample = docs(&manifests().join("samples/jobset-pi-openmpi-groups.yaml")).remove(0);
    assert_eq!(
        sample["metadata"]["annotations"],
        json!({
            "mpi-webhook.io/worker-groups": "node-small,node-big",
            "mpi-webhook.io/slots-per-group": "node-big=3"
        })
    );
    let rjobs = sample["spec"]["replicatedJobs"].as_array().expect("rjobs");
    let shape: Vec<(&str, &Value, &Value)> = rjobs
        .iter()
        .map(|r| {
            let job = &r["template"]["spec"];
            (
                r["name"].as_str().expect("name"),
                &job["parallelism"],
                &job["template"]["spec"]["nodeSelector"],
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (
                "node-small",
                &json!(2),
                &json!({"example.com/pool": "small"})
            ),
            ("node-big", &json!(1), &json!({"example.com/pool": "big"})),
            ("launcher", &Value::Null, &Value::Null),
        ]
    );
    let review =
        docs(&manifests().join("samples/reviews/jobset-mode-create-openmpi-groups.json")).remove(0);
    assert_eq!(review["request"]["operation"], "CREATE");
    assert_eq!(review["request"]["object"], sample);
}

/// `jobset-pi-openmpi-restricted.yaml`: its review carries exactly it, and every pod of it, as
/// `review mutate` patches it (with and without the pre-flight), meets the `restricted` Pod
/// Security Standard; the same pod with the ssh setup's securityContext removed does not (so
/// the check can fail). It says nothing about ssh, leaving `generated` to do it.
#[test]
fn the_restricted_sample_is_admitted_under_restricted_once_patched() {
    let sample = docs(&manifests().join("samples/jobset-pi-openmpi-restricted.yaml")).remove(0);
    let path = manifests().join("samples/reviews/jobset-mode-create-openmpi-restricted.json");
    let review = docs(&path).remove(0);
    assert_eq!(review["request"]["operation"], "CREATE");
    assert_eq!(review["request"]["object"], sample);
    assert_eq!(
        sample["metadata"]["annotations"],
        Value::Null,
        "no ssh-setup, ssh-port or mount path: generated's defaults"
    );
    for image in ["", IMAGE] {
        let mut jobset = sample.clone();
        json_patch::patch(&mut jobset, &mutate(&path, image)).expect("the patch applies");
        for rjob in jobset["spec"]["replicatedJobs"].as_array().expect("rjobs") {
            let at = format!("{} (pre-flight image {image:?})", rjob["name"]);
            let pod = &rjob["template"]["spec"]["template"]["spec"];
            assert_eq!(pod["initContainers"][0]["name"], "mpi-ssh-setup", "{at}");
            assert_eq!(
                pss::restricted_violations(pod),
                Vec::<String>::new(),
                "{at}"
            );
            let mut bare = pod.clone();
            bare["initContainers"][0]
                .as_object_mut()
                .expect("an object")
                .remove("securityContext");
            assert_eq!(
                pss::restricted_violations(&bare),
                [
                    "spec.initContainers[0].securityContext.allowPrivilegeEscalation: must be false",
                    "spec.initContainers[0].securityContext.capabilities.drop: must include ALL"
                ],
                "{at}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// kubectl kustomize

#[test]
fn the_base_renders_to_what_its_files_say() {
    let Some(kubectl) = tool("kubectl", &["version", "--client"]) else {
        return;
    };
    let rendered = kustomize(&kubectl, "");
    let files = base();
    let ids = |objects: &[Value]| -> BTreeSet<String> {
        objects
            .iter()
            .map(|o| format!("{} {}", o["kind"], o["metadata"]["name"]))
            .collect()
    };
    assert_eq!(ids(&rendered), ids(&files));
    for object in &rendered {
        let kind = object["kind"].as_str().expect("kind");
        let cluster_scoped = matches!(
            kind,
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingWebhookConfiguration"
                | "MutatingWebhookConfiguration"
        );
        if !cluster_scoped {
            assert_eq!(object["metadata"]["namespace"], NAMESPACE, "{kind}");
        }
    }
}

/// The Deployment's pods meet the `restricted` Pod Security Standard, as its files say them and
/// as every shipped kustomization renders them.
#[test]
fn the_deployment_pods_meet_the_restricted_pod_security_standard() {
    let pod = |objects: &[Value]| {
        find(objects, "Deployment", "mpi-webhook")["spec"]["template"]["spec"].clone()
    };
    let none = Vec::<String>::new();
    assert_eq!(pss::restricted_violations(&pod(&base())), none, "base/");
    let Some(kubectl) = tool("kubectl", &["version", "--client"]) else {
        return;
    };
    for path in ["", "overlays/cert-manager", "overlays/cli-certs"] {
        let rendered = kustomize(&kubectl, path);
        assert_eq!(pss::restricted_violations(&pod(&rendered)), none, "{path}");
    }
}

/// The value of env var `name` of `container`.
fn env_value<'a>(container: &'a Value, name: &str) -> &'a Value {
    &container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name}"))["value"]
}

/// An overlay's `images:` entry moves the pre-flight image with the webhook's own image: the
/// base's kustomizeconfig.yaml applies in every overlay built on it.
#[test]
fn an_overlays_image_is_the_preflight_image_too() {
    let Some(kubectl) = tool("kubectl", &["version", "--client"]) else {
        return;
    };
    let overlay = "resources:\n  - ../cert-manager\nimages:\n  - name: ghcr.io/mpi-webhook/mpi-webhook\n    newName: registry.example/team/mpi-webhook\n    newTag: v9\n";
    let rendered = kustomize_with(
        &kubectl,
        "overlays/mirror",
        &[("overlays/mirror/kustomization.yaml", overlay)],
    );
    let deployment = find(&rendered, "Deployment", "mpi-webhook");
    let webhook = container(deployment, "webhook");
    let image = "registry.example/team/mpi-webhook:v9";
    assert_eq!(webhook["image"], image);
    assert_eq!(env_value(webhook, "MPI_WEBHOOK_PREFLIGHT_IMAGE"), image);
    assert_eq!(container(deployment, "reconciler")["image"], image);
    assert_eq!(env_value(webhook, "RUST_LOG"), "info", "other values stay");
}

#[test]
fn the_cert_manager_overlay_issues_the_tls_secret_and_injects_the_ca() {
    let Some(kubectl) = tool("kubectl", &["version", "--client"]) else {
        return;
    };
    let rendered = kustomize(&kubectl, "overlays/cert-manager");
    let certificate = find(&rendered, "Certificate", "mpi-webhook-serving-cert");
    assert_eq!(certificate["spec"]["secretName"], TLS_SECRET);
    let dns = strings(&certificate["spec"]["dnsNames"]);
    assert!(dns.contains(&"mpi-webhook.mpi-webhook.svc"), "{dns:?}");
    for (kind, name) in [
        ("ValidatingWebhookConfiguration", "mpi-webhook-validator"),
        ("MutatingWebhookConfiguration", "mpi-webhook-mutator"),
    ] {
        let config = find(&rendered, kind, name);
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "mpi-webhook/mpi-webhook-serving-cert",
            "{name}"
        );
    }
    // The overlay only adds to the base.
    assert_eq!(rendered.len(), base().len() + 4);
}

#[test]
fn the_cli_certs_overlay_makes_the_tls_secret_and_fills_every_ca_bundle() {
    let Some(kubectl) = tool("kubectl", &["version", "--client"]) else {
        return;
    };
    let rendered = kustomize(&kubectl, "overlays/cli-certs");
    let secret = find(&rendered, "Secret", TLS_SECRET);
    assert_eq!(secret["metadata"]["namespace"], NAMESPACE);
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let ca = secret["data"]["ca.crt"].as_str().expect("ca.crt");
    assert!(secret["data"]["tls.crt"].is_string() && secret["data"]["tls.key"].is_string());
    let hooks = webhooks(&rendered);
    assert_eq!(hooks.len(), 6);
    for (_, hook) in hooks {
        assert_eq!(hook["clientConfig"]["caBundle"], ca, "{}", hook["name"]);
    }
}

#[test]
fn the_optional_crd_overlay_admits_intel_and_mpich() {
    let Some(kubectl) = tool("kubectl", &["version", "--client"]) else {
        return;
    };
    let rendered = kustomize(&kubectl, "overlays/crds-intel-mpich");
    assert_eq!(rendered.len(), 2);
    for crd in &rendered {
        let enumeration = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["mlPolicy"]["properties"]["mpi"]["properties"]["mpiImplementation"]["enum"];
        assert_eq!(
            strings(enumeration),
            ["OpenMPI", "", "Intel", "MPICH"],
            "{}",
            crd["metadata"]["name"]
        );
    }
    let runtimes = kustomize(&kubectl, "runtimes");
    assert_eq!(runtimes.len(), 2);
}

// ---------------------------------------------------------------------------------------------
// Kubernetes schemas

#[test]
fn every_rendered_object_validates_against_the_kubernetes_schemas() {
    validate_schemas(&[]);
}

/// The sample JobSets as `review mutate` patches them, with and without the pre-flight, are
/// what the kube-apiserver takes: every replicatedJob's pod template passes its Pod and Job
/// validation (`support/pod_validation.rs`), and the patched JobSet (the JobSet CRD's schema)
/// and a Pod of each template (Kubernetes' schemas) validate strictly.
#[test]
fn patched_sample_jobsets_are_what_the_apiserver_takes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut files = Vec::new();
    let reviews = data_files(&manifests().join("samples/reviews"));
    let jobsets = reviews
        .iter()
        .filter(|path| docs(path)[0]["request"]["kind"]["kind"] == "JobSet");
    for (n, review) in jobsets.enumerate() {
        for image in ["", IMAGE] {
            let mut jobset = docs(review).remove(0)["request"]["object"].take();
            let patch = mutate(review, image);
            json_patch::patch(&mut jobset, &patch).expect("the patch applies");
            let name = jobset["metadata"]["name"]
                .as_str()
                .expect("name")
                .to_owned();
            let at = format!("{} (pre-flight image {image:?})", review.display());
            let rjobs = jobset["spec"]["replicatedJobs"].as_array().expect("rjobs");
            let mut pods = Vec::new();
            for rjob in rjobs {
                let template = &rjob["template"]["spec"]["template"];
                let rjob = rjob["name"].as_str().expect("name");
                assert_eq!(
                    pod_validation::job_template_errors(template),
                    Vec::<String>::new(),
                    "{at}: replicatedJob {rjob}"
                );
                pods.push(json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": format!("{name}-{rjob}")},
                    "spec": template["spec"],
                }));
            }
            for (what, objects) in [("jobset", vec![jobset]), ("pods", pods)] {
                let file = tmp.path().join(format!("{n}-{}-{what}.json", image.len()));
                let text = objects.iter().map(Value::to_string).collect::<Vec<_>>();
                std::fs::write(&file, text.join("\n---\n")).expect("write");
                files.push(file);
            }
        }
    }
    assert_eq!(files.len(), 6 * 2 * 2, "six sample JobSet reviews");
    validate_schemas(&files);
}

/// What the reconciler writes, as `render --network-policy-default` prints it for every MPI
/// TrainJob and JobSet-mode JobSet under `manifests/` (the Secret, the ConfigMap and the
/// NetworkPolicy of each), validates strictly against Kubernetes' schemas.
#[test]
fn the_reconcilers_objects_validate_against_the_kubernetes_schemas() {
    let out = mpi_webhook(&[
        "render",
        "--objects-dir",
        "manifests",
        "--network-policy-default",
    ]);
    let text = String::from_utf8(out).expect("utf-8");
    let objects: Vec<Value> =
        serde_saphyr::from_str_multiple(&text).expect("render prints YAML documents");
    let kinds: BTreeSet<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["ConfigMap", "NetworkPolicy", "Secret"])
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("rendered.yaml");
    std::fs::write(&file, text).expect("write");
    validate_schemas(&[file]);
}

/// The JSON patch `mpi-webhook review mutate` answers `review` with.
fn mutate(review: &Path, preflight_image: &str) -> json_patch::Patch {
    use base64::Engine as _;
    let review = review.to_str().expect("a UTF-8 path");
    let out = mpi_webhook(&[
        "review",
        "mutate",
        review,
        "--objects-dir",
        "manifests",
        "--preflight-image",
        preflight_image,
    ]);
    let answer: Value = serde_json::from_slice(&out).expect("a JSON review");
    assert_eq!(answer["response"]["allowed"], true, "{review}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().expect("a patch"))
        .expect("base64");
    serde_json::from_slice(&patch).expect("an RFC 6902 patch")
}

/// What `mpi-webhook ARGS`, run from the repository root, prints; it must succeed.
fn mpi_webhook(args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("mpi-webhook runs");
    assert!(
        out.status.success(),
        "mpi-webhook {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs `tests/validate_manifests.py` on `files`, or on the repository's manifests when there
/// are none.
fn validate_schemas(files: &[PathBuf]) {
    let Some(python) = tool("python3", &["--version"]) else {
        return;
    };
    let out = Command::new(python)
        .arg(repo().join("tests/validate_manifests.py"))
        .args(files)
        .output()
        .expect("run tests/validate_manifests.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) {
        eprintln!("{stderr}");
        return;
    }
    assert!(
        out.status.success(),
        "schema validation failed:\n{stdout}\n{stderr}"
    );
    println!("{stdout}");
}

// ---------------------------------------------------------------------------------------------
// Dockerfile

#[test]
fn the_dockerfile_builds_with_the_ci_command_and_exposes_the_pods_ports() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    assert!(dockerfile.contains("cargo build --release --locked"));
    assert!(dockerfile.contains("FROM gcr.io/distroless/cc-debian12:nonroot"));
    assert!(dockerfile.contains("USER 65532:65532"));
    let exposed: BTreeSet<u64> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|ports| ports.split_whitespace().map(|p| p.parse().expect("port")))
        .collect();
    let objects = base();
    let deployment = find(&objects, "Deployment", "mpi-webhook");
    let ports: BTreeSet<u64> = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p["containerPort"].as_u64().expect("containerPort"))
        .collect();
    assert_eq!(exposed, ports);
}

/// The paths `.dockerignore` lets into the Docker build context: an allowlist after `*`.
fn docker_context() -> Vec<String> {
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore");
    ignore
        .lines()
        .filter_map(|l| l.strip_prefix('!'))
        .map(|p| p.trim_end_matches('/').to_owned())
        .collect()
}

/// Every file the crate compiles in (`include_str!`, `include_bytes!`) must be in the Docker build
/// context, which `.dockerignore` limits to an allowlist.
#[test]
fn the_docker_build_context_holds_every_compiled_in_file() {
    let allowed = docker_context();
    let mut sources = Vec::new();
    let mut stack = vec![repo().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(path);
            }
        }
    }
    for source in sources {
        let text = std::fs::read_to_string(&source).expect("read source");
        for marker in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                let target = &rest[..rest.find('"').expect("closing quote")];
                let dir = source.parent().expect("parent");
                let full = std::fs::canonicalize(dir.join(target))
                    .unwrap_or_else(|e| panic!("{}: {target}: {e}", source.display()));
                let root = std::fs::canonicalize(repo()).expect("repo");
                let relative = full.strip_prefix(&root).expect("inside the repository");
                assert!(
                    allowed.iter().any(|a| relative.starts_with(a)),
                    "{} compiles in {}, which .dockerignore keeps out of the image build",
                    source.display(),
                    relative.display()
                );
            }
        }
    }
}

/// The Docker image's build, replayed without Docker: the builder stage's `COPY`s, of what
/// `.dockerignore` lets into the context, into an empty directory, the stub sources its first
/// `RUN` writes, and at each `RUN` a `cargo fetch --locked --offline` for this machine's target,
/// which refuses a manifest naming a file the build does not have (a bench, a build script) as
/// `cargo build` would, before it looks for any package.
#[test]
fn the_dockerfile_builder_stage_has_every_file_cargo_needs() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let context = docker_context();
    let instructions = dockerfile.replace("\\\n", " ");
    let builder: Vec<&str> = instructions
        .lines()
        .map(str::trim)
        .skip_while(|l| !(l.starts_with("FROM ") && l.ends_with(" AS builder")))
        .skip(1)
        .take_while(|l| !l.starts_with("FROM "))
        .filter(|l| l.starts_with("COPY ") || l.starts_with("RUN "))
        .collect();
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    let tmp = tempfile::tempdir().expect("tempdir");
    let build = tmp.path();
    let mut runs = 0;
    for instruction in builder {
        let words: Vec<&str> = instruction.split_whitespace().skip(1).collect();
        if instruction.starts_with("COPY ") {
            let (dest, sources) = words.split_last().expect("COPY names a destination");
            for source in sources {
                assert!(
                    !source.starts_with("--"),
                    "{instruction}: no COPY flags here"
                );
                assert!(
                    context.iter().any(|c| Path::new(source).starts_with(c)),
                    "{instruction}: {source} is kept out of the build context by .dockerignore"
                );
                let from = repo().join(source);
                let to = if dest.ends_with('/') {
                    build.join(dest).join(from.file_name().expect("a name"))
                } else {
                    build.join(dest)
                };
                if from.is_dir() {
                    copy_dir(&from, &to);
                } else {
                    std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
                    std::fs::copy(&from, &to).expect("copy");
                }
            }
            continue;
        }
        if runs == 0 {
            // What the dependency layer's RUN writes before it builds.
            assert!(instruction.contains("echo 'fn main() {}' > src/main.rs"));
            assert!(instruction.contains("touch src/lib.rs"));
            std::fs::create_dir_all(build.join("src")).expect("mkdir");
            std::fs::write(build.join("src/main.rs"), "fn main() {}").expect("write");
            std::fs::write(build.join("src/lib.rs"), "").expect("write");
        }
        assert!(instruction.contains("cargo build --release --locked"));
        // This machine's target only: what the test build has downloaded already.
        let out = Command::new(env!("CARGO"))
            .args(["fetch", "--locked", "--offline", "--target", &host])
            .current_dir(build)
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "the image build's `{instruction}` would fail:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if instruction.contains("rm -rf src") {
            std::fs::remove_dir_all(build.join("src")).expect("rm src");
        }
        runs += 1;
    }
    assert_eq!(runs, 2, "a dependency layer and the crate's build");
}
