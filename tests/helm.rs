//! The Helm chart (`charts/mpi-webhook/`) with the real helm (`scripts/install-neighbours.sh`
//! builds it from its Go module into `target/neighbours/helm/`): it lints; every values file under
//! `charts/mpi-webhook/ci/` (the combinations its README documents) renders to objects that
//! validate against the Kubernetes schemas (`tests/validate_manifests.py`); and it cannot drift
//! from `manifests/`: each TLS mode renders exactly what the matching kustomization renders
//! (`kubectl kustomize`), but for the Namespace and Helm's own labels, and so do the opt-in CRDs
//! and runtimes. The chart reads manifests/ itself (its `files/` are links), so a change there
//! shows here, through the chart, with no copy to update.
//!
//! Without helm, kubectl or python3 every test fails, saying what to install, unless
//! `SKIP_TEST_SUITES=helm` (`tests/support/prerequisites.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

#[path = "support/kustomize.rs"]
mod kustomize;
use kustomize::{kustomize, placeholder_tls};
#[path = "support/prerequisites.rs"]
mod prerequisites;

const SUITE: &str = "helm";
const RELEASE: &str = "mpi-webhook";
const NAMESPACE: &str = "mpi-webhook";
const IMAGE: &str = "ghcr.io/mpi-webhook/mpi-webhook:0.1.0";
/// The labels Helm's chart adds to every object and the kustomize base does not.
const HELM_LABELS: [&str; 2] = ["helm.sh/chart", "app.kubernetes.io/managed-by"];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("charts/mpi-webhook")
}

/// The tool at `path` (or `name` on PATH) when it answers `probe`; `None` after saying so when
/// `SKIP_TEST_SUITES` names `helm`.
///
/// # Panics
/// The tool is missing and not opted out of.
fn tool(name: &str, candidates: &[PathBuf], probe: &[&str], hint: &str) -> Option<PathBuf> {
    static NOTICE: std::sync::Once = std::sync::Once::new();
    let found = candidates
        .iter()
        .cloned()
        .chain([PathBuf::from(name)])
        .find(|path| {
            Command::new(path)
                .args(probe)
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if found.is_none() {
        prerequisites::skip_or_fail(SUITE, &format!("`{name}` is not installed"), hint, &NOTICE);
    }
    found
}

/// helm: `HELM` if set, else the one `scripts/install-neighbours.sh` built, else PATH's.
fn helm() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("HELM")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(repo().join("target/neighbours/helm/helm"));
    tool(
        "helm",
        &candidates,
        &["version"],
        "scripts/install-neighbours.sh builds it from its Go module (Go 1.26 or later)",
    )
}

fn kubectl() -> Option<PathBuf> {
    tool(
        "kubectl",
        &[],
        &["version", "--client"],
        "scripts/install-test-deps.sh installs it",
    )
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

fn parse(text: &str) -> Vec<Value> {
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(text)
        .expect("rendered YAML parses")
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `helm template` of the chart into namespace `mpi-webhook` with `args` (values flags).
fn helm_template(helm: &Path, args: &[&str]) -> Vec<Value> {
    let out = helm_template_output(helm, args);
    assert!(
        out.status.success(),
        "helm template {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&String::from_utf8(out.stdout).expect("utf-8"))
}

fn helm_template_output(helm: &Path, args: &[&str]) -> Output {
    let chart = chart();
    let mut all = vec![
        "template",
        RELEASE,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        NAMESPACE,
    ];
    all.extend_from_slice(args);
    run(helm, &all)
}

fn key(object: &Value) -> (String, String, String) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

/// The chart's objects without Helm's labels, in a stable order.
fn without_helm_labels(mut objects: Vec<Value>) -> Vec<Value> {
    for object in &mut objects {
        let id = key(object);
        let labels = object["metadata"]["labels"]
            .as_object_mut()
            .unwrap_or_else(|| panic!("{id:?} has no labels"));
        for label in HELM_LABELS {
            assert!(
                labels.remove(label).is_some(),
                "{id:?} lacks the label {label}"
            );
        }
        if labels.is_empty() {
            object["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("labels");
        }
    }
    sorted(objects)
}

fn sorted(mut objects: Vec<Value>) -> Vec<Value> {
    objects.sort_by_key(key);
    objects
}

/// kustomize's objects but the Namespace, which Helm leaves to `--create-namespace` (the chart
/// README says how to label it as the base does).
fn without_namespace(objects: Vec<Value>) -> Vec<Value> {
    let (namespaces, rest): (Vec<_>, Vec<_>) =
        objects.into_iter().partition(|o| o["kind"] == "Namespace");
    assert_eq!(
        namespaces.iter().map(key).collect::<Vec<_>>(),
        [("Namespace".into(), String::new(), NAMESPACE.into())],
        "the base renders one Namespace, the only object the chart leaves out"
    );
    sorted(rest)
}

// ---------------------------------------------------------------------------------------------
// helm lint and the documented combinations

/// The values files of `charts/mpi-webhook/ci/`, each a combination the chart's README documents.
fn ci_values() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart().join("ci"))
        .expect("read charts/mpi-webhook/ci")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no values file in charts/mpi-webhook/ci");
    files
}

#[test]
fn the_chart_lints_strictly_with_every_documented_values_file() {
    let Some(helm) = helm() else { return };
    let chart = chart();
    let chart = chart.to_str().expect("utf-8 path");
    let mut runs = vec![vec!["lint", "--strict", chart]];
    let files = ci_values();
    for file in &files {
        runs.push(vec![
            "lint",
            "--strict",
            chart,
            "--values",
            file.to_str().expect("utf-8 path"),
        ]);
    }
    for args in runs {
        let out = run(&helm, &args);
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_documented_values_file_renders_objects_that_validate_against_the_schemas() {
    let Some(helm) = helm() else { return };
    let Some(python) = tool(
        "python3",
        &[],
        &["--version"],
        "install Python 3 (scripts/install-test-deps.sh)",
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut rendered = Vec::new();
    for file in ci_values() {
        let objects = helm_template(&helm, &["--values", file.to_str().expect("utf-8 path")]);
        assert!(!objects.is_empty(), "{} renders nothing", file.display());
        let name = file.file_name().expect("file name");
        let out = tmp.path().join(name);
        let text = objects
            .iter()
            .map(|o| serde_json::to_string(o).expect("json"))
            .collect::<Vec<_>>()
            .join("\n---\n");
        std::fs::write(&out, text).expect("write");
        rendered.push(out);
    }
    let out = Command::new(python)
        .arg(repo().join("tests/validate_manifests.py"))
        .args(&rendered)
        .output()
        .expect("run tests/validate_manifests.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) && prerequisites::opted_out(SUITE) {
        eprintln!("{stderr}");
        return;
    }
    assert!(
        out.status.success(),
        "schema validation of the chart's renders failed:\n{stdout}\n{stderr}"
    );
}

// ---------------------------------------------------------------------------------------------
// No drift from manifests/

#[test]
fn the_default_values_install_what_the_cert_manager_overlay_installs() {
    let (Some(helm), Some(kubectl)) = (helm(), kubectl()) else {
        return;
    };
    assert_eq!(
        without_helm_labels(helm_template(&helm, &[])),
        without_namespace(kustomize(&kubectl, "overlays/cert-manager"))
    );
}

#[test]
fn tls_mode_manual_installs_what_the_base_installs() {
    let (Some(helm), Some(kubectl)) = (helm(), kubectl()) else {
        return;
    };
    assert_eq!(
        without_helm_labels(helm_template(&helm, &["--set", "tls.mode=manual"])),
        without_namespace(kustomize(&kubectl, ""))
    );
}

#[test]
fn tls_mode_certs_installs_what_the_cli_certs_overlay_installs_from_the_same_files() {
    let (Some(helm), Some(kubectl)) = (helm(), kubectl()) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let files = placeholder_tls(tmp.path());
    let set_file = |value: &str, file: &str| {
        let path = &files.iter().find(|(f, _)| f == file).expect("file").1;
        format!("tls.certs.{value}={}", path.display())
    };
    let (cert, key, ca) = (
        set_file("cert", "tls.crt"),
        set_file("key", "tls.key"),
        set_file("ca", "ca.crt"),
    );
    let args = [
        "--set",
        "tls.mode=certs",
        "--set-file",
        &cert,
        "--set-file",
        &key,
        "--set-file",
        &ca,
    ];
    assert_eq!(
        without_helm_labels(helm_template(&helm, &args)),
        without_namespace(kustomize(&kubectl, "overlays/cli-certs"))
    );
}

#[test]
fn tls_mode_certs_without_its_files_fails_saying_which() {
    let Some(helm) = helm() else { return };
    let out = helm_template_output(&helm, &["--set", "tls.mode=certs"]);
    assert!(!out.status.success(), "rendered without certificates");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "tls.mode certs needs tls.certs.cert (--set-file tls.certs.cert=DIR/tls.crt)"
        ),
        "{stderr}"
    );
}

/// The objects the chart adds to the manual mode's when `args` switch an option on.
fn added_by(helm: &Path, args: &[&str]) -> Vec<Value> {
    let base = helm_template(helm, &["--set", "tls.mode=manual"]);
    let mut all = vec!["--set", "tls.mode=manual"];
    all.extend_from_slice(args);
    let with = helm_template(helm, &all);
    let added: Vec<Value> = with.into_iter().filter(|o| !base.contains(o)).collect();
    assert!(!added.is_empty(), "{args:?} adds nothing");
    added
}

#[test]
fn crds_intel_mpich_installs_the_crd_overlay_kept_on_uninstall() {
    let (Some(helm), Some(kubectl)) = (helm(), kubectl()) else {
        return;
    };
    let mut added = added_by(&helm, &["--set", "crds.intelMpich=true"]);
    for crd in &mut added {
        let annotations = crd["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations");
        assert_eq!(
            annotations.remove("helm.sh/resource-policy"),
            Some(json!("keep")),
            "{:?}",
            key(crd)
        );
    }
    assert_eq!(
        without_helm_labels(added),
        sorted(kustomize(&kubectl, "overlays/crds-intel-mpich"))
    );
}

#[test]
fn runtimes_default_enabled_installs_what_manifests_runtimes_installs() {
    let (Some(helm), Some(kubectl)) = (helm(), kubectl()) else {
        return;
    };
    assert_eq!(
        without_helm_labels(added_by(&helm, &["--set", "runtimes.defaultEnabled=true"])),
        sorted(kustomize(&kubectl, "runtimes"))
    );
}

/// `helm package` follows the links of `files/`: the packaged chart holds the files of
/// manifests/ themselves and renders what the chart's folder renders.
#[test]
fn the_packaged_chart_holds_the_manifests_and_renders_the_same() {
    let Some(helm) = helm() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dest = tmp.path().to_str().expect("utf-8 path");
    let chart = chart();
    let out = run(
        &helm,
        &[
            "package",
            chart.to_str().expect("utf-8 path"),
            "--destination",
            dest,
        ],
    );
    assert!(
        out.status.success(),
        "helm package failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = tmp.path().join("mpi-webhook-0.1.0.tgz");
    let archive = archive.to_str().expect("utf-8 path");
    for args in [
        vec![],
        vec![
            "--set",
            "crds.intelMpich=true",
            "--set",
            "runtimes.defaultEnabled=true",
        ],
    ] {
        let mut packaged = vec!["template", RELEASE, archive, "--namespace", NAMESPACE];
        packaged.extend_from_slice(&args);
        let out = run(&helm, &packaged);
        assert!(
            out.status.success(),
            "helm template of the package failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let from_package = parse(&String::from_utf8(out.stdout).expect("utf-8"));
        assert_eq!(from_package, helm_template(&helm, &args), "{args:?}");
    }
}

#[test]
fn the_charts_app_version_is_the_image_tag_the_kustomize_base_deploys() {
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("read Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let kustomization: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo().join("manifests/base/kustomization.yaml"))
            .expect("read kustomization.yaml"),
    )
    .expect("kustomization.yaml parses");
    assert_eq!(chart["appVersion"], kustomization["images"][0]["newTag"]);
}

/// The chart refuses a cluster older than the oldest Kubernetes docs/install.md supports, so
/// the two cannot drift apart.
#[test]
fn the_charts_kube_version_is_the_oldest_kubernetes_install_md_supports() {
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("read Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let install =
        std::fs::read_to_string(repo().join("docs/install.md")).expect("read docs/install.md");
    let oldest = install
        .lines()
        .find_map(|l| {
            l.strip_prefix("- Kubernetes ")
                .and_then(|rest| rest.split_once(" or later"))
                .map(|(version, _)| version.to_owned())
        })
        .expect("docs/install.md: a line `- Kubernetes X.Y or later`");
    assert_eq!(chart["kubeVersion"], format!(">= {oldest}.0-0"));
}

// ---------------------------------------------------------------------------------------------
// Values

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

fn container<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    &container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name}"))["value"]
}

fn args(container: &Value) -> Vec<&str> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string"))
        .collect()
}

#[test]
fn the_image_is_the_preflight_image_unless_set_apart() {
    let Some(helm) = helm() else { return };
    let default = helm_template(&helm, &[]);
    let deployment = find(&default, "Deployment");
    for name in ["webhook", "reconciler"] {
        assert_eq!(container(deployment, name)["image"], IMAGE);
    }
    assert_eq!(
        env(
            container(deployment, "webhook"),
            "MPI_WEBHOOK_PREFLIGHT_IMAGE"
        ),
        IMAGE
    );

    let mine = "registry.example/mpi-webhook:1.2.3";
    let moved = helm_template(
        &helm,
        &[
            "--set",
            "image.repository=registry.example/mpi-webhook",
            "--set",
            "image.tag=1.2.3",
        ],
    );
    let deployment = find(&moved, "Deployment");
    for name in ["webhook", "reconciler"] {
        assert_eq!(container(deployment, name)["image"], mine);
    }
    assert_eq!(
        env(
            container(deployment, "webhook"),
            "MPI_WEBHOOK_PREFLIGHT_IMAGE"
        ),
        mine
    );

    let apart = helm_template(
        &helm,
        &["--set", "preflightImage=registry.example/preflight:9"],
    );
    let deployment = find(&apart, "Deployment");
    assert_eq!(container(deployment, "webhook")["image"], IMAGE);
    assert_eq!(
        env(
            container(deployment, "webhook"),
            "MPI_WEBHOOK_PREFLIGHT_IMAGE"
        ),
        "registry.example/preflight:9"
    );
}

#[test]
fn every_operator_value_reaches_its_field() {
    let Some(helm) = helm() else { return };
    let objects = helm_template(
        &helm,
        &[
            "--namespace",
            "mpi",
            "--set",
            "replicas=1",
            "--set",
            "leaderElection=false",
            "--set",
            "networkPolicyDefault=true",
            "--set",
            "shutdownDelay=12s",
            "--set",
            "terminationGracePeriodSeconds=45",
            "--set",
            "resources.webhook.limits.memory=1Gi",
            "--set",
            "image.pullPolicy=Always",
            "--set",
            "webhooks.namespaceSelector.matchLabels.mpi=enabled",
            "--set",
            "nodeSelector.pool=system",
        ],
    );
    let deployment = find(&objects, "Deployment");
    assert_eq!(deployment["metadata"]["namespace"], "mpi");
    assert_eq!(deployment["spec"]["replicas"], 1);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 45);
    assert_eq!(pod["nodeSelector"], json!({"pool": "system"}));
    let webhook = container(deployment, "webhook");
    assert_eq!(webhook["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(webhook["imagePullPolicy"], "Always");
    let serve = args(webhook);
    let delay = serve
        .iter()
        .position(|a| *a == "--shutdown-delay")
        .expect("--shutdown-delay");
    assert_eq!(serve[delay + 1], "12s");
    let reconcile = args(container(deployment, "reconciler"));
    assert!(!reconcile.contains(&"--leader-elect"), "{reconcile:?}");
    assert!(
        reconcile.contains(&"--network-policy-default"),
        "{reconcile:?}"
    );

    let certificate = objects
        .iter()
        .find(|o| o["kind"] == "Certificate" && o["metadata"]["name"] == "mpi-webhook-serving-cert")
        .expect("the serving Certificate");
    assert_eq!(
        certificate["spec"]["dnsNames"],
        json!(["mpi-webhook.mpi.svc", "mpi-webhook.mpi.svc.cluster.local"])
    );
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let config = find(&objects, kind);
        assert_eq!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "mpi/mpi-webhook-serving-cert"
        );
        for hook in config["webhooks"].as_array().expect("webhooks") {
            assert_eq!(hook["clientConfig"]["service"]["namespace"], "mpi");
            assert_eq!(
                hook["namespaceSelector"],
                json!({
                    "matchExpressions": [{
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": ["mpi", "kube-system"],
                    }],
                    "matchLabels": {"mpi": "enabled"},
                }),
                "{}",
                hook["name"]
            );
        }
    }
    for binding in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        assert_eq!(binding["subjects"][0]["namespace"], "mpi");
    }
}

#[test]
fn a_mistyped_or_invalid_value_fails_naming_it() {
    let Some(helm) = helm() else { return };
    for (set, says) in [
        ("replica=3", "replica"),
        ("tls.mode=cert_manager", "tls/mode"),
        ("shutdownDelay=5", "shutdownDelay"),
        ("crds.intelMPICH=true", "intelMPICH"),
    ] {
        let out = helm_template_output(&helm, &["--set", set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {set} rendered");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(says),
            "--set {set}: {stderr}"
        );
    }
    let out = helm_template_output(&helm, &["--set", "leaderElection=false"]);
    assert!(
        !out.status.success(),
        "two replicas without leader election rendered"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("leaderElection: false needs replicas: 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
