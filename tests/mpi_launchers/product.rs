//! mpi-webhook's side of the test: the Kubeflow objects a user and Trainer's controller create,
//! run through the product's own CLI (`render`, `review mutate`), exactly as a user runs them.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::launchers::Launcher;
use crate::proc;

pub const NAMESPACE: &str = "mpiw";
/// numProcPerNode of every test runtime: 2, so that "slots" is visible in the placement.
pub const SLOTS: u32 = 2;
/// The TrainJob's spec.trainer.numNodes (issue 7: numNodes 3).
pub const NUM_NODES: u32 = 3;

/// Which of mpi-webhook's modes a scenario runs, and so how its pods run. JobSet mode (issue 14,
/// root launchers, `id_rsa` 0600) becomes a second variant with its own [`Image`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Next to Kubeflow Trainer: the runtime has the shape of Trainer's shipped MPI runtimes
    /// (`deepspeed-distributed`, `mlx-distributed`), which run launcher and workers as user 1000
    /// with `fsGroup: 1000` and mount the SSH Secret at `/home/mpiuser/.ssh`.
    TrainJob,
}

/// The user a runtime image runs as (an entry of the image's /etc/passwd).
#[derive(Clone, Copy, Debug)]
pub struct ImageUser {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
    pub home: &'static str,
}

/// What the test emulates of a runtime's image and pod security context.
#[derive(Clone, Copy, Debug)]
pub struct Image {
    /// `runAsUser` of both containers and `fsGroup` of both pods (`None`: root, no fsGroup).
    pub user: Option<ImageUser>,
    /// The runtime's `mlPolicy.mpi.sshAuthMountPath`.
    pub ssh_auth_mount_path: &'static str,
    /// The image's sshd configuration file, passed to sshd with `-f`.
    pub sshd_config: &'static str,
    /// The port the image's sshd listens on, and its ssh client's default port.
    pub sshd_port: u16,
}

/// Upstream's runtimes (manifests/runtimes/deepspeed_distributed.yaml): `runAsUser: 1000`,
/// `fsGroup: 1000`, `sshAuthMountPath: /home/mpiuser/.ssh`, sshd `-De -f /home/mpiuser/.sshd_config`
/// listening on 2222 (the readiness probe's port).
const TRAINER_RUNTIME_IMAGE: Image = Image {
    user: Some(ImageUser {
        name: "mpiuser",
        uid: 1000,
        gid: 1000,
        home: "/home/mpiuser",
    }),
    ssh_auth_mount_path: "/home/mpiuser/.ssh",
    sshd_config: "/home/mpiuser/.sshd_config",
    sshd_port: 2222,
};

impl Mode {
    pub fn image(self) -> Image {
        match self {
            Mode::TrainJob => TRAINER_RUNTIME_IMAGE,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Mode::TrainJob => "TrainJob mode",
        }
    }
}

/// What the user and the cluster give mpi-webhook for one scenario.
pub struct Inputs {
    pub runtime: Value,
    pub trainjob: Value,
    /// The JobSet as Trainer's controller creates it, before the mutating webhook.
    pub jobset: Value,
}

/// What the product made of it.
pub struct Products {
    /// Everything `render` printed (Secret, ConfigMap).
    pub rendered: Vec<Value>,
    /// The JobSet after applying the webhook's JSON patch.
    pub jobset: Value,
}

pub fn inputs(
    l: &Launcher,
    mode: Mode,
    name: &str,
    run_launcher_as_node: bool,
    command: Vec<String>,
) -> Inputs {
    let image = mode.image();
    let runtime_name = format!("{name}-rt");
    let image_name = format!("mpiw.test/{}:latest", l.id);
    // Kubelet's and the container runtime's inputs: the pod's fsGroup, the container's user.
    let (pod_security, container_security) = match image.user {
        Some(u) => (json!({"fsGroup": u.gid}), json!({"runAsUser": u.uid})),
        None => (json!({}), json!({})),
    };
    let runtime = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": runtime_name},
        "spec": {
            "mlPolicy": {
                "numNodes": 1,
                "mpi": {
                    "numProcPerNode": SLOTS,
                    "mpiImplementation": l.implementation,
                    "sshAuthMountPath": image.ssh_auth_mount_path,
                    "runLauncherAsNode": run_launcher_as_node,
                }
            },
            // The shape of upstream's deepspeed-distributed runtime, security context included.
            "template": {"spec": {
                "network": {"publishNotReadyAddresses": true},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                "replicatedJobs": [
                    {"name": "node", "template": {"spec": {"template": {"spec": {
                        "securityContext": pod_security,
                        "containers": [{
                            "name": "node",
                            "image": image_name,
                            "securityContext": container_security,
                            "command": ["/usr/sbin/sshd"],
                            "args": ["-De", "-f", image.sshd_config],
                            "readinessProbe": {"tcpSocket": {"port": image.sshd_port}, "initialDelaySeconds": 1},
                        }]
                    }}}}},
                    {"name": "launcher",
                     "dependsOn": [{"name": "node", "status": "Ready"}],
                     "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": {"template": {"spec": {
                            "securityContext": pod_security,
                            "containers": [{"name": "node", "image": image_name, "securityContext": container_security}]
                        }}}
                    }},
                ]
            }}
        }
    });
    // Open MPI refuses to run as root unless told; a root launcher image or TrainJob sets these
    // (they are the user's env, not MPI wiring, and reach the launcher like any trainer env).
    let env: Vec<Value> = if l.implementation == "OpenMPI" && image.user.is_none() {
        vec![
            json!({"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"}),
            json!({"name": "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "value": "1"}),
        ]
    } else {
        vec![]
    };
    let uid = format!(
        "0000{:04x}-6d70-4977-8000-{:012x}",
        std::process::id() & 0xffff,
        fnv(name)
    );
    let trainjob = json!({
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
        "spec": {
            "runtimeRef": {"name": runtime_name, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "trainer": {"numNodes": NUM_NODES, "command": command, "env": env},
        }
    });
    let jobset = controller_jobset(&trainjob, &runtime);
    Inputs {
        runtime,
        trainjob,
        jobset,
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    }) & 0xffff_ffff_ffff
}

/// The JobSet Trainer's controller builds from the runtime template and the TrainJob (its own
/// part: owner reference, trainer image/command/env on the trainer-labelled replicatedJob). The MPI
/// wiring is mpi-webhook's job and is deliberately absent.
fn controller_jobset(trainjob: &Value, runtime: &Value) -> Value {
    let mut spec = runtime["spec"]["template"]["spec"].clone();
    if let Some(rjobs) = spec["replicatedJobs"].as_array_mut() {
        for rj in rjobs {
            let labelled = rj["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
                == "trainer";
            if !labelled {
                continue;
            }
            rj["replicas"] = json!(1);
            if let Some(cs) =
                rj["template"]["spec"]["template"]["spec"]["containers"].as_array_mut()
            {
                for c in cs.iter_mut().filter(|c| c["name"] == "node") {
                    c["command"] = trainjob["spec"]["trainer"]["command"].clone();
                    c["env"] = trainjob["spec"]["trainer"]["env"].clone();
                }
            }
        }
    }
    json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": trainjob["metadata"]["name"],
            "namespace": trainjob["metadata"]["namespace"],
            "ownerReferences": [{
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "name": trainjob["metadata"]["name"],
                "uid": trainjob["metadata"]["uid"],
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": spec,
    })
}

fn webhook() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mpi-webhook"));
    // Every flag also reads MPI_WEBHOOK_<FLAG>: keep the caller's environment out of it.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MPI_WEBHOOK_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Write the inputs to an objects dir and run the product on them.
pub fn run(inputs: &Inputs, work: &Path) -> Result<Products> {
    let objects = work.join("objects");
    std::fs::create_dir_all(&objects)?;
    std::fs::write(
        objects.join("runtime.json"),
        serde_json::to_vec_pretty(&inputs.runtime)?,
    )?;
    std::fs::write(
        objects.join("trainjob.json"),
        serde_json::to_vec_pretty(&inputs.trainjob)?,
    )?;
    if std::env::var("MPI_LAUNCHERS_PRODUCT").as_deref() == Ok("spec") {
        return crate::spec_model::run(inputs, work);
    }

    let out = proc::run_ok(
        webhook().arg("render").arg("--objects-dir").arg(&objects),
        Duration::from_secs(60),
    )
    .context("mpi-webhook render")?;
    let rendered: Vec<Value> = serde_saphyr::from_multiple(&out)
        .with_context(|| format!("render output is not YAML:\n{out}"))?;
    let rendered: Vec<Value> = rendered.into_iter().filter(|d| !d.is_null()).collect();

    let uid = "7b0e4c1a-0000-4000-8000-00000000e7e7";
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"},
            "resource": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "resource": "jobsets"},
            "requestKind": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "kind": "JobSet"},
            "requestResource": {"group": "jobset.x-k8s.io", "version": "v1alpha2", "resource": "jobsets"},
            "name": inputs.jobset["metadata"]["name"],
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"},
            "object": inputs.jobset,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    });
    let review_file = work.join("review.json");
    std::fs::write(&review_file, serde_json::to_vec_pretty(&review)?)?;
    let out = proc::run_ok(
        webhook()
            .args(["review", "mutate"])
            .arg(&review_file)
            .arg("--objects-dir")
            .arg(&objects),
        Duration::from_secs(60),
    )
    .context("mpi-webhook review mutate")?;
    let resp: Value =
        serde_json::from_str(&out).with_context(|| format!("review output is not JSON:\n{out}"))?;
    let r = &resp["response"];
    ensure!(
        r["uid"] == uid,
        "response uid {} != request uid {uid}",
        r["uid"]
    );
    ensure!(
        r["allowed"] == true,
        "the webhook denied the JobSet: {}",
        r["status"]
    );
    ensure!(
        r["patchType"] == "JSONPatch",
        "patchType is {}, not JSONPatch",
        r["patchType"]
    );
    let patch_b64 = r["patch"].as_str().context("response.patch missing")?;
    let patch_bytes = B64
        .decode(patch_b64)
        .context("response.patch is not base64")?;
    let patch: json_patch::Patch =
        serde_json::from_slice(&patch_bytes).context("response.patch is not an RFC 6902 patch")?;
    let mut jobset = inputs.jobset.clone();
    json_patch::patch(&mut jobset, &patch.0)
        .context("applying the webhook's patch to the JobSet")?;
    Ok(Products { rendered, jobset })
}

/// The object `render` produced with this kind and name.
pub fn find<'a>(rendered: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    rendered
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .with_context(|| format!("render printed no {kind} named {name}"))
}

/// Decoded `data` entry of a Secret (base64) or ConfigMap (plain text).
pub fn data_bytes(obj: &Value, key: &str) -> Result<Vec<u8>> {
    let v = obj["data"][key].as_str().with_context(|| {
        format!(
            "{} {} has no data.{key}",
            obj["kind"], obj["metadata"]["name"]
        )
    })?;
    if obj["kind"] == "Secret" {
        Ok(B64
            .decode(v.trim())
            .with_context(|| format!("Secret data.{key} is not base64"))?)
    } else {
        Ok(v.as_bytes().to_vec())
    }
}

/// `(name, value)` of a container's env; valueFrom is not something a launcher pod here could
/// resolve, so it is an error.
pub fn env_of(container: &Value) -> Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().context("env entry without name")?;
        if e.get("valueFrom").is_some_and(|v| !v.is_null()) {
            bail!("env {name} uses valueFrom, which this test cannot resolve");
        }
        env.push((
            name.to_string(),
            e["value"].as_str().unwrap_or("").to_string(),
        ));
    }
    Ok(env)
}

/// The container named `node` of a pod spec (the only one the MPI wiring touches).
pub fn node_container(pod_spec: &Value) -> Result<&Value> {
    pod_spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "node")
        .context("pod template has no container named node")
}
