//! The real Kubeflow Trainer controller manager in the single-node cluster, as its release ships
//! it: built from its Go module by `scripts/install-neighbours.sh` into
//! `target/neighbours/trainer-<version>/`, with that release's CRDs, RBAC (the controller runs as
//! its ServiceAccount's user, [`TRAINER`]), webhook configurations (as `url:` webhooks on
//! 127.0.0.1, the shipped selectors kept) and MPI ClusterTrainingRuntimes (their image replaced
//! by the offline [`TRAINER_IMAGE`]).
//!
//! One Trainer runs at a time. [`running`] gives a scenario shared use of the version it needs,
//! starting it (and stopping another first) when no scenario uses another; [`exclusive`] gives a
//! scenario the controller to itself, to replace one version by another under a TrainJob
//! ([`switch`]). Its log is `target/cluster/logs/trainer-<version>-<n>.log`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::cluster::{Cluster, TRAINER_IMAGE, neighbour};
use crate::control_plane::{Process, TRAINER, free_port};
use crate::support::{api_for, apply, serving_certs};

/// The namespace Trainer's release installs into (its ServiceAccount's, [`TRAINER`]'s).
pub const NAMESPACE: &str = "kubeflow-system";
/// How long the controller may take to answer `/readyz` and its webhooks to admit.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// The ClusterTrainingRuntimes of the release whose `mlPolicy` is MPI.
const MPI_RUNTIMES: [&str; 2] = ["deepspeed_distributed.yaml", "mlx_distributed.yaml"];

/// The Trainer controller that runs, and its version (`v2.3`: `target/neighbours/trainer-v2.3`).
pub struct Running {
    pub version: String,
    process: Process,
}

static TRAINER_PROCESS: RwLock<Option<Running>> = RwLock::const_new(None);
static STARTS: AtomicUsize = AtomicUsize::new(0);

/// Shared use of Trainer `version`, started if needed: scenarios on the same version run
/// together, one on another version waits until they are done.
///
/// # Errors
/// When it does not start.
pub async fn running(
    cluster: &Cluster,
    version: &str,
) -> Result<RwLockReadGuard<'static, Option<Running>>, String> {
    loop {
        let running = TRAINER_PROCESS.read().await;
        if running.as_ref().is_some_and(|r| r.version == version) {
            return Ok(running);
        }
        drop(running);
        let mut running = TRAINER_PROCESS.write().await;
        if running.as_ref().is_none_or(|r| r.version != version) {
            switch(cluster, &mut running, version).await?;
        }
    }
}

/// The controller to this scenario alone (none of another scenario runs meanwhile).
pub async fn exclusive() -> RwLockWriteGuard<'static, Option<Running>> {
    TRAINER_PROCESS.write().await
}

/// Replaces the Trainer that runs (if any; the same version too) by `version`: stops it
/// (SIGTERM, as a Deployment's rollout does), then applies `version`'s CRDs, RBAC, webhooks and
/// runtimes and starts it.
///
/// # Errors
/// When it does not start.
pub async fn switch(
    cluster: &Cluster,
    running: &mut Option<Running>,
    version: &str,
) -> Result<(), String> {
    if let Some(mut old) = running.take() {
        eprintln!("cluster: stopping Trainer {}", old.version);
        old.process.stop();
    }
    *running = Some(start(cluster, version).await?);
    Ok(())
}

/// The folder `scripts/install-neighbours.sh` built Trainer `version` into.
pub fn folder(version: &str) -> PathBuf {
    neighbour(&format!("trainer-{version}"))
}

/// What this machine lacks to run Trainer `version`, in words.
pub fn missing(version: &str) -> Option<String> {
    let binary = folder(version).join("trainer-controller-manager");
    (!binary.is_file()).then(|| {
        format!(
            "no {} (scripts/install-neighbours.sh builds it from its Go module)",
            binary.display()
        )
    })
}

/// The objects of kustomization `dir` (a neighbour's release), as `kubectl kustomize` renders
/// them.
pub fn kustomize(dir: &Path) -> Result<Vec<Value>, String> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .map_err(|e| format!("kubectl kustomize {}: {e}", dir.display()))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    mpi_webhook::objects::dir::parse_documents(&String::from_utf8_lossy(&out.stdout), false)
        .map_err(|e| format!("kubectl kustomize {}: {e}", dir.display()))
}

async fn start(cluster: &Cluster, version: &str) -> Result<Running, String> {
    let started = Instant::now();
    if let Some(missing) = missing(version) {
        return Err(missing);
    }
    let release = folder(version);
    let manifests = release.join("manifests/base");
    let admin = cluster.admin();

    // The release's CRDs, replacing those the cluster started with.
    let crds: Vec<String> = std::fs::read_dir(manifests.join("crds"))
        .map_err(|e| format!("{}: {e}", manifests.join("crds").display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .map(|path| path.display().to_string())
        .collect();
    let crds: Vec<&str> = crds.iter().map(String::as_str).collect();
    cluster.plane.apply_crds(&crds).await;

    // Its RBAC, the ServiceAccount's namespace as the release's overlay sets it.
    cluster.plane.create_namespace(NAMESPACE).await;
    for mut object in kustomize(&manifests.join("rbac"))? {
        match object["kind"].as_str() {
            Some("ClusterRole" | "ClusterRoleBinding") => {}
            _ => object["metadata"]["namespace"] = json!(NAMESPACE),
        }
        let subjects = object.get_mut("subjects").and_then(Value::as_array_mut);
        for subject in subjects.into_iter().flatten() {
            if subject["kind"] == "ServiceAccount" {
                subject["namespace"] = json!(NAMESPACE);
            }
        }
        apply(&admin, &object, "cluster").await;
    }

    // The controller: webhooks on 127.0.0.1 with a certificate of ours (its certificate
    // management, which writes a Secret and the webhook configurations' caBundle, off),
    // controller-runtime's certificate folder under TMPDIR, no leader election, no metrics.
    let n = STARTS.fetch_add(1, Ordering::Relaxed);
    let dir = cluster.logs.join(format!("../trainer-{version}-{n}"));
    let certs_dir = dir.join("tmp/k8s-webhook-server/serving-certs");
    std::fs::create_dir_all(&certs_dir).map_err(|e| e.to_string())?;
    let dir = dir.canonicalize().map_err(|e| e.to_string())?;
    let certs = serving_certs(&certs_dir)?;
    let webhook_port = free_port()?;
    let health_port = free_port()?;
    let config = format!(
        "apiVersion: config.trainer.kubeflow.org/v1alpha1\nkind: Configuration\n\
         webhook: {{host: 127.0.0.1, port: {webhook_port}}}\n\
         metrics: {{bindAddress: \"0\"}}\n\
         health: {{healthProbeBindAddress: \"127.0.0.1:{health_port}\"}}\n\
         leaderElection: {{leaderElect: false}}\n\
         certManagement: {{enable: false}}\n"
    );
    std::fs::write(dir.join("config.yaml"), config).map_err(|e| e.to_string())?;
    let kubeconfig = cluster
        .plane
        .write_kubeconfig(&dir.join("kubeconfig"), TRAINER)?
        .display()
        .to_string();
    let tmp = dir.join("tmp").display().to_string();
    let mut process = Process::spawn(
        &format!("trainer-{version}"),
        &release.join("trainer-controller-manager"),
        &[
            format!("--config={}", dir.join("config.yaml").display()),
            "--zap-devel=false".into(),
        ],
        &[("KUBECONFIG", &kubeconfig), ("TMPDIR", &tmp)],
        &cluster.logs.join(format!("trainer-{version}-{n}.log")),
    )?;
    let deadline = Instant::now() + START_TIMEOUT;
    ready(
        &format!("Trainer {version}"),
        &mut process,
        health_port,
        deadline,
    )
    .await?;

    // Its webhooks as the release configures them, as `url:` webhooks.
    cluster
        .register_webhooks(
            kustomize(&manifests.join("webhook"))?,
            "",
            &format!("https://127.0.0.1:{webhook_port}"),
            &certs.ca_bundle(),
            |_, _| {},
        )
        .await;

    // The release's MPI runtimes in the offline image, through Trainer's validating webhook:
    // retried until it answers.
    for file in MPI_RUNTIMES {
        let path = manifests.join("runtimes").join(file);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for mut runtime in mpi_webhook::objects::dir::parse_documents(&text, false)
            .map_err(|e| format!("{}: {e}", path.display()))?
        {
            offline_image(&mut runtime);
            let name = crate::jobs::name_of(&runtime);
            let api = api_for(&admin, &runtime, None);
            loop {
                match api
                    .patch(
                        &name,
                        &PatchParams::apply("cluster").force(),
                        &Patch::Apply(&runtime),
                    )
                    .await
                {
                    Ok(_) => break,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("cluster: runtime {name} not yet admitted: {e}");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(format!("apply runtime {name}: {e}")),
                }
            }
        }
    }
    eprintln!(
        "cluster: Trainer {version} ready in {:.0?} (log {})",
        started.elapsed(),
        process.log().display()
    );
    Ok(Running {
        version: version.to_owned(),
        process,
    })
}

/// Waits until controller `what` (a controller-runtime manager, `process`) answers `ok` on
/// `/readyz` at 127.0.0.1:`health_port`, failing when it exits or at `deadline`.
///
/// # Errors
/// It exited or was not ready in time; the message holds its last log lines.
pub async fn ready(
    what: &str,
    process: &mut Process,
    health_port: u16,
    deadline: Instant,
) -> Result<(), String> {
    let health = std::net::SocketAddr::from(([127, 0, 0, 1], health_port));
    loop {
        let ready = crate::support::get_plain(health, "/readyz").await;
        if ready.is_some_and(|body| body.trim() == "ok") {
            return Ok(());
        }
        if let Some(status) = process.exited() {
            return Err(format!("{what} exited ({status}):\n{}", process.log_tail()));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: no /readyz in time:\n{}",
                process.log_tail()
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every container of a runtime's or TrainJob's JobSet template in [`TRAINER_IMAGE`], never
/// pulled: the commands stay the release's own.
pub fn offline_image(object: &mut Value) {
    let rjobs = &mut object["spec"]["template"]["spec"]["replicatedJobs"];
    crate::jobs::for_each_container_of(rjobs, |container| {
        container["image"] = json!(TRAINER_IMAGE);
        container["imagePullPolicy"] = json!("Never");
    });
}
