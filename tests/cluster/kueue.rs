//! The real Kueue controller manager in the single-node cluster, as its release ships it: built
//! from its Go module by `scripts/install-neighbours.sh` into `target/neighbours/kueue/`, with that
//! release's CRDs, RBAC (the controller runs as its ServiceAccount's user, [`KUEUE`]) and webhook
//! configurations (as `url:` webhooks on 127.0.0.1), cut to the integrations it runs here: Jobs,
//! JobSets and TrainJobs.
//!
//! Started once per test binary, on first use ([`running`]), and left running: with no
//! `kueue.x-k8s.io/queue-name` label on a job (and `manageJobsWithoutQueueName` off, its
//! default) it leaves the job alone, so the scenarios beside it are unaffected. Its log is
//! `target/cluster/logs/kueue.log`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::OnceCell;

use crate::cluster::{Cluster, neighbour};
use crate::control_plane::{KUEUE, Process, free_port};
use crate::support::{apply, documents, serving_certs};
use crate::trainer::{kustomize, ready};

/// The namespace Kueue's release installs into (its ServiceAccount's, [`KUEUE`]'s).
pub const NAMESPACE: &str = "kueue-system";
/// How long the controller may take to answer `/readyz` and its webhooks to admit.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The integrations Kueue runs here; its release registers a webhook for every framework it
/// knows, and those of a framework not enabled would fail every create of their kind.
const FRAMEWORKS: [&str; 3] = [
    "batch/job",
    "jobset.x-k8s.io/jobset",
    "trainer.kubeflow.org/trainjob",
];
/// The webhook paths served with [`FRAMEWORKS`] enabled: Kueue's own kinds and theirs.
const SERVED_PATHS: [&str; 4] = [
    "-kueue-x-k8s-io-",
    "-batch-v1-job",
    "-jobset-x-k8s-io-",
    "-trainer-kubeflow-org-",
];

static KUEUE_PROCESS: OnceCell<Result<Process, String>> = OnceCell::const_new();

/// The folder `scripts/install-neighbours.sh` built Kueue into.
pub fn folder() -> PathBuf {
    neighbour("kueue")
}

/// What this machine lacks to run Kueue, in words.
pub fn missing() -> Option<String> {
    let binary = folder().join("kueue");
    (!binary.is_file()).then(|| {
        format!(
            "no {} (scripts/install-neighbours.sh builds it from its Go module)",
            binary.display()
        )
    })
}

/// Kueue, started on first use and left running.
///
/// # Errors
/// When it does not start (then every later call says the same).
pub async fn running(cluster: &Cluster) -> Result<(), String> {
    KUEUE_PROCESS
        .get_or_init(|| start(cluster))
        .await
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

/// The objects of the release's kustomization `dir` under its default overlay's namespace and
/// name prefix (`kueue-system`, `kueue-`), as `kubectl kustomize` renders them.
fn kustomize_overlaid(dir: &std::path::Path, work: &std::path::Path) -> Result<Vec<Value>, String> {
    let overlay = work.join("overlay");
    std::fs::create_dir_all(&overlay).map_err(|e| e.to_string())?;
    // kustomize takes a base by a path relative to the overlay.
    let (overlay_abs, dir_abs) = (
        overlay.canonicalize().map_err(|e| e.to_string())?,
        dir.canonicalize().map_err(|e| e.to_string())?,
    );
    let common = overlay_abs
        .ancestors()
        .find(|a| dir_abs.starts_with(a))
        .ok_or("no common folder")?;
    let ups = overlay_abs.components().count() - common.components().count();
    let base = std::path::Path::new(&"../".repeat(ups))
        .join(dir_abs.strip_prefix(common).map_err(|e| e.to_string())?);
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "namespace: {NAMESPACE}\nnamePrefix: kueue-\nresources:\n- {}\n",
            base.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    kustomize(&overlay)
}

/// A shell that runs Kueue with `/etc` overlaid in a mount namespace of its own, where the
/// metrics server's certificate is: Kueue reads it from the fixed `/etc/kueue/metrics/certs`
/// whenever its own certificate management is off, and the host's `/etc` stays untouched.
const WITH_METRICS_CERTS: &str = r#"set -e
work="$1"; shift
mount -t tmpfs kueue-etc "$work/etc"
mkdir -p "$work/etc/upper" "$work/etc/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$work/etc/upper,workdir=$work/etc/work" /etc
mkdir -p /etc/kueue/metrics/certs
cp "$work/tls.crt" "$work/tls.key" /etc/kueue/metrics/certs/
exec "$@"
"#;

async fn start(cluster: &Cluster) -> Result<Process, String> {
    let started = Instant::now();
    if let Some(missing) = missing() {
        return Err(missing);
    }
    let release = folder().join("config/components");
    let admin = cluster.admin();
    let work = cluster.logs.join("../kueue");
    std::fs::create_dir_all(work.join("etc")).map_err(|e| e.to_string())?;
    let work = work.canonicalize().map_err(|e| e.to_string())?;

    // Its CRDs as served (v1beta2 stored, no conversion webhook: nothing here asks for v1beta1).
    let bases = release.join("crd/bases");
    let crds: Vec<String> = std::fs::read_dir(&bases)
        .map_err(|e| format!("{}: {e}", bases.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path().display().to_string()))
        .collect();
    let crds: Vec<&str> = crds.iter().map(String::as_str).collect();
    cluster.plane.apply_crds(&crds).await;

    cluster.plane.create_namespace(NAMESPACE).await;
    for object in kustomize_overlaid(&release.join("rbac"), &work)? {
        apply(&admin, &object, "cluster").await;
    }

    let certs = serving_certs(&work)?;
    let webhook_port = free_port()?;
    let health_port = free_port()?;
    let frameworks = FRAMEWORKS.map(|f| format!("\"{f}\"")).join(", ");
    let config = format!(
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n\
         namespace: {NAMESPACE}\n\
         health: {{healthProbeBindAddress: \"127.0.0.1:{health_port}\"}}\n\
         metrics: {{bindAddress: \"0\"}}\n\
         webhook: {{host: 127.0.0.1, port: {webhook_port}, certDir: {}}}\n\
         leaderElection: {{leaderElect: false}}\n\
         internalCertManagement: {{enable: false}}\n\
         integrations: {{frameworks: [{frameworks}]}}\n",
        work.display()
    );
    std::fs::write(work.join("config.yaml"), config).map_err(|e| e.to_string())?;
    let kubeconfig = cluster
        .plane
        .write_kubeconfig(&work.join("kubeconfig"), KUEUE)?
        .display()
        .to_string();
    let mut process = Process::spawn(
        "kueue",
        std::path::Path::new("unshare"),
        &[
            "--mount".into(),
            "--propagation=private".into(),
            "sh".into(),
            "-c".into(),
            WITH_METRICS_CERTS.into(),
            "kueue-start".into(),
            work.display().to_string(),
            folder().join("kueue").display().to_string(),
            format!("--config={}", work.join("config.yaml").display()),
            // The visibility API server is an aggregated apiserver of its own: not registered here.
            "--feature-gates=VisibilityOnDemand=false".into(),
            "--zap-devel=false".into(),
            "--zap-log-level=2".into(),
        ],
        &[("KUBECONFIG", &kubeconfig)],
        &cluster.logs.join("kueue.log"),
    )?;
    ready(
        "Kueue",
        &mut process,
        health_port,
        Instant::now() + START_TIMEOUT,
    )
    .await?;

    // Its webhooks as the release configures them, cut to those it serves, as `url:` webhooks.
    let mut configurations =
        documents(&release.join("webhook/manifests.yaml").display().to_string());
    for configuration in &mut configurations {
        if let Some(webhooks) = configuration["webhooks"].as_array_mut() {
            webhooks.retain(|webhook| {
                let path = webhook["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or_default();
                SERVED_PATHS.iter().any(|served| path.contains(served))
            });
        }
    }
    cluster
        .register_webhooks(
            configurations,
            "kueue-",
            &format!("https://127.0.0.1:{webhook_port}"),
            &certs.ca_bundle(),
            |_, _| {},
        )
        .await;
    eprintln!(
        "cluster: Kueue ready in {:.0?} (log {})",
        started.elapsed(),
        process.log().display()
    );
    Ok(process)
}
