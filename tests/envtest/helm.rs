//! The Helm chart installed, upgraded and uninstalled by the real helm
//! (`scripts/install-neighbours.sh` builds it into `target/neighbours/helm/`), on a control plane
//! of its own: the chart's webhook configurations are cluster-wide and fail closed, so on the
//! shared plane they would refuse the other tests' objects. No node runs the Deployment, so no
//! webhook answers: while the chart is installed a labelled JobSet is refused (the webhooks are
//! registered and select it), and once it is uninstalled the same JobSet is admitted (nothing
//! fail-closed is left behind). On the way, the Intel/MPICH CRDs are taken over from the field
//! manager that applied them, and stay after the uninstall. `--enable-aggregator-routing` makes
//! the apiserver look the Service's endpoints up (there are none) instead of dialling its cluster
//! IP.
//!
//! Without helm the test fails, saying how to build it, unless `SKIP_TEST_SUITES=helm`.

use std::path::{Path, PathBuf};
use std::process::Command;

use pretty_assertions::assert_eq;
use serde_json::Value;

use crate::control_plane::{CRDS, ControlPlane, Options};
use crate::support::{apply, create, documents, get, repo, serving_certs};

const NAMESPACE: &str = "mpi-webhook";
const SAMPLE: &str = "manifests/samples/jobset-pi-openmpi.yaml";
const CRD_VERSION: &str = "apiextensions.k8s.io/v1";
/// The CRDs `crds.intelMpich` replaces.
const RUNTIME_CRDS: [&str; 2] = [
    "trainingruntimes.trainer.kubeflow.org",
    "clustertrainingruntimes.trainer.kubeflow.org",
];

/// helm: `HELM` if set, else the one `scripts/install-neighbours.sh` built, else PATH's; `None`
/// after one line on stderr when `SKIP_TEST_SUITES` names `helm`.
fn helm() -> Option<PathBuf> {
    static NOTICE: std::sync::Once = std::sync::Once::new();
    let found = std::env::var_os("HELM")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            repo().join("target/neighbours/helm/helm"),
            PathBuf::from("helm"),
        ])
        .find(|helm| {
            Command::new(helm)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if found.is_none() {
        crate::prerequisites::skip_or_fail(
            "helm",
            "`helm` is not installed",
            "scripts/install-neighbours.sh builds it from its Go module (Go 1.26 or later)",
            &NOTICE,
        );
    }
    found
}

/// Runs helm against `kubeconfig`; its stdout, or a panic with its output.
fn run_helm(helm: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .current_dir(repo())
        // helm's cache, config and data under the test's own directory.
        .env("HELM_CACHE_HOME", kubeconfig.with_extension("cache"))
        .env("HELM_CONFIG_HOME", kubeconfig.with_extension("config"))
        .env("HELM_DATA_HOME", kubeconfig.with_extension("data"))
        .output()
        .unwrap_or_else(|e| panic!("run helm: {e}"));
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn jobset(namespace: &str) -> Value {
    let mut sample = documents(SAMPLE).remove(0);
    sample["metadata"]["namespace"] = namespace.into();
    sample
}

#[tokio::test]
async fn helm_install_upgrade_and_uninstall_leave_no_webhook_behind() {
    let Some(helm) = helm() else { return };
    let options = Options {
        extra_apiserver_args: vec!["--enable-aggregator-routing=true".to_owned()],
        ..Options::default()
    };
    let plane = match ControlPlane::start(options).await {
        Ok(Some(plane)) => plane,
        Ok(None) => return,
        Err(e) => panic!("envtest control plane: {e}"),
    };
    plane.apply_crds(&CRDS).await;
    let admin = plane.admin();
    for namespace in documents("manifests/base/namespace.yaml") {
        apply(&admin, &namespace, "envtest").await;
    }
    let jobs = plane.namespace("helm").await;
    let kubeconfig = plane
        .write_kubeconfig(
            &plane.dir().join("helm.kubeconfig"),
            crate::control_plane::ADMIN,
        )
        .expect("a kubeconfig");
    let chart = repo().join("charts/mpi-webhook");
    let chart = chart.to_str().expect("utf-8 path");

    // Install (the Secret and caBundle by hand, as `kubectl apply -k manifests/` does).
    run_helm(
        &helm,
        &kubeconfig,
        &[
            "install",
            "mpi-webhook",
            chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "tls.mode=manual",
        ],
    );
    let deployment = get(&admin, "apps/v1", "Deployment", NAMESPACE, "mpi-webhook")
        .await
        .expect("the Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    for (kind, name) in [
        ("ValidatingWebhookConfiguration", "mpi-webhook-validator"),
        ("MutatingWebhookConfiguration", "mpi-webhook-mutator"),
    ] {
        let config = get(&admin, "admissionregistration.k8s.io/v1", kind, "", name)
            .await
            .unwrap_or_else(|| panic!("no {kind} {name}"));
        assert_eq!(
            config["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "Helm"
        );
    }
    let refused = create(&admin, &jobset(&jobs))
        .await
        .expect_err("a labelled JobSet admitted with no webhook answering");
    // Refused by our webhook for want of an endpoint: nothing was dialled.
    assert!(
        refused.to_string().contains("mpi-webhook.kubeflow.org")
            && refused
                .to_string()
                .contains(r#"no endpoints available for service "mpi-webhook""#),
        "refused otherwise: {refused}"
    );

    // Upgrade: certificates from the files `mpi-webhook certs` writes, one replica more, the
    // NetworkPolicy default on.
    let tls = plane.dir().join("helm-tls");
    std::fs::create_dir_all(&tls).expect("mkdir");
    let certs = serving_certs(&tls).expect("certificates");
    std::fs::write(tls.join("ca.crt"), &certs.ca_cert_pem).expect("write ca.crt");
    let file = |value: &str, name: &str| format!("tls.certs.{value}={}", tls.join(name).display());
    let (cert, key, ca) = (
        file("cert", "tls.crt"),
        file("key", "tls.key"),
        file("ca", "ca.crt"),
    );
    run_helm(
        &helm,
        &kubeconfig,
        &[
            "upgrade",
            "mpi-webhook",
            chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "tls.mode=certs",
            "--set-file",
            &cert,
            "--set-file",
            &key,
            "--set-file",
            &ca,
            "--set",
            "replicas=3",
            "--set",
            "networkPolicyDefault=true",
        ],
    );
    let deployment = get(&admin, "apps/v1", "Deployment", NAMESPACE, "mpi-webhook")
        .await
        .expect("the Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let reconciler = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "reconciler")
        .expect("the reconciler");
    assert!(
        reconciler["args"]
            .as_array()
            .expect("args")
            .contains(&"--network-policy-default".into()),
        "{}",
        reconciler["args"]
    );
    assert!(
        get(&admin, "v1", "Secret", NAMESPACE, "mpi-webhook-tls")
            .await
            .is_some(),
        "the upgrade made the TLS Secret"
    );
    let validator = get(
        &admin,
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "",
        "mpi-webhook-validator",
    )
    .await
    .expect("the validator");
    for hook in validator["webhooks"].as_array().expect("webhooks") {
        assert!(
            hook["clientConfig"]["caBundle"].is_string(),
            "{} has no caBundle",
            hook["name"]
        );
    }

    // The CRDs admitting Intel and MPICH, taken over from the install that made them (here the
    // test's field manager, as Trainer's would be), as the chart's README says.
    run_helm(
        &helm,
        &kubeconfig,
        &[
            "upgrade",
            "mpi-webhook",
            chart,
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--take-ownership",
            "--force-conflicts",
            "--set",
            "crds.intelMpich=true",
        ],
    );
    for name in RUNTIME_CRDS {
        let crd = get(&admin, CRD_VERSION, "CustomResourceDefinition", "", name)
            .await
            .unwrap_or_else(|| panic!("no CRD {name}"));
        assert_eq!(
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                ["mlPolicy"]["properties"]["mpi"]["properties"]["mpiImplementation"]["enum"],
            serde_json::json!(["OpenMPI", "", "Intel", "MPICH"]),
            "{name}"
        );
    }

    // Uninstall: nothing of the chart is left, and a labelled JobSet is admitted again.
    run_helm(
        &helm,
        &kubeconfig,
        &[
            "uninstall",
            "mpi-webhook",
            "--namespace",
            NAMESPACE,
            "--wait",
        ],
    );
    for (kind, name) in [
        ("ValidatingWebhookConfiguration", "mpi-webhook-validator"),
        ("MutatingWebhookConfiguration", "mpi-webhook-mutator"),
    ] {
        assert_eq!(
            get(&admin, "admissionregistration.k8s.io/v1", kind, "", name).await,
            None,
            "{kind} {name} left behind"
        );
    }
    for (api_version, kind, name) in [
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "mpi-webhook-serve",
        ),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRole",
            "mpi-webhook-reconcile",
        ),
        ("apps/v1", "Deployment", "mpi-webhook"),
        ("v1", "Secret", "mpi-webhook-tls"),
    ] {
        assert_eq!(
            get(&admin, api_version, kind, NAMESPACE, name).await,
            None,
            "{kind} {name} left behind"
        );
    }
    create(&admin, &jobset(&jobs))
        .await
        .expect("a labelled JobSet admitted once the chart is uninstalled");
    // The CRDs stay (helm.sh/resource-policy: keep): deleting them would delete every runtime.
    for name in RUNTIME_CRDS {
        assert!(
            get(&admin, CRD_VERSION, "CustomResourceDefinition", "", name)
                .await
                .is_some(),
            "the uninstall deleted the CRD {name}"
        );
    }
}
