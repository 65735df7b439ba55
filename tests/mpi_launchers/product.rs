//! mpi-webhook's side of the test: the objects a user (and, in TrainJob mode, Trainer's
//! controller) create, run through the product's own CLI (`render`, `review mutate`), exactly as a
//! user runs them.

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
/// The TrainJob's spec.trainer.numNodes (numNodes 3).
pub const NUM_NODES: u32 = 3;

/// Which of mpi-webhook's modes a scenario runs, and so how its pods run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Next to Kubeflow Trainer: the runtime has the shape of Trainer's shipped MPI runtimes
    /// (`deepspeed-distributed`, `mlx-distributed`), which run launcher and workers as user 1000
    /// with `fsGroup: 1000` and mount the SSH Secret at `/home/mpiuser/.ssh`.
    TrainJob,
    /// A plain JobSet labelled `mpi-webhook.io/implementation` (Decision 18), its pods
    /// running as root without `fsGroup`, the SSH Secret at the default `/root/.ssh`: the case
    /// JobSet mode's `id_rsa` 0600 is for.
    JobSet(JobSetShape),
}

/// The JobSet-mode settings a scenario sets beyond the label (and `run-launcher-as-node`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobSetShape {
    /// `mpi-webhook.io/container`: the wired container's name in both pod templates, where it is
    /// listed after a sidecar. `None`: no annotation, each template's first (only) container is
    /// wired (`node` in the workers', `launcher` in the launcher's, as in the samples).
    pub container: Option<&'static str>,
    /// `mpi-webhook.io/slots-per-node`. `None`: no annotation, 1 (the pods ask for no GPUs).
    pub slots_per_node: Option<u32>,
    /// `mpi-webhook.io/ssh-port`. `None`: no annotation, the default of the ssh setup (22 with
    /// `image`: the emulated image's ssh client default, which the webhook's default sshd
    /// command matches; 2222 with `generated`).
    pub ssh_port: Option<u16>,
    /// `mpi-webhook.io/ssh-setup`. `None`: no annotation, `generated`.
    pub ssh_setup: Option<&'static str>,
    /// The pods run as the UID the platform assigns ([`ANY_UID`], GID 0), as OpenShift does: the
    /// template names no user, the image has no passwd entry for it, all capabilities are dropped
    /// and no_new_privs is set. `false`: root.
    pub any_uid: bool,
    /// `mpi-webhook.io/preflight: "false"`.
    pub no_preflight: bool,
    /// Two worker groups (Decision 20) instead of `node`: [`GROUPS`], named by
    /// `mpi-webhook.io/worker-groups`, the second's slots from `mpi-webhook.io/slots-per-group`.
    pub groups: bool,
}

/// The worker groups of [`JobSetShape::groups`]: (replicatedJob, hosts, slots per host). 2 hosts
/// of 1 slot and 1 host of 2: the machine's cores bound a host's slots (Open MPI 5 refuses more
/// ranks on a host than it has cores), and 1 against 2 still tells the groups' slots apart.
pub const GROUPS: [(&str, u32, u32); 2] = [("node-small", 2, 1), ("node-big", 1, 2)];
pub const WORKER_GROUPS_ANNOTATION: &str = "mpi-webhook.io/worker-groups";
pub const SLOTS_PER_GROUP_ANNOTATION: &str = "mpi-webhook.io/slots-per-group";

/// The UID OpenShift's `restricted-v2` would assign (the first of a namespace's range).
pub const ANY_UID: u32 = 1_000_650_000;

impl JobSetShape {
    /// `image` as today's JobSet mode (the image sets up ssh).
    pub const IMAGE: JobSetShape = JobSetShape {
        container: None,
        slots_per_node: None,
        ssh_port: None,
        ssh_setup: Some("image"),
        any_uid: false,
        no_preflight: false,
        groups: false,
    };

    /// Whether the webhook's init container sets up ssh.
    pub fn generated(self) -> bool {
        self.ssh_setup != Some("image")
    }

    /// The port the workers' sshd must listen on and the launcher's ssh must dial.
    pub fn ssh_port(self) -> u16 {
        self.ssh_port
            .unwrap_or(if self.generated() { 2222 } else { 22 })
    }
}

/// JobSet mode's label and annotations (interface.md "JobSet mode").
pub const IMPLEMENTATION_LABEL: &str = "mpi-webhook.io/implementation";
pub const RUN_LAUNCHER_AS_NODE_ANNOTATION: &str = "mpi-webhook.io/run-launcher-as-node";
pub const CONTAINER_ANNOTATION: &str = "mpi-webhook.io/container";
pub const SLOTS_PER_NODE_ANNOTATION: &str = "mpi-webhook.io/slots-per-node";
pub const SSH_PORT_ANNOTATION: &str = "mpi-webhook.io/ssh-port";
pub const SSH_SETUP_ANNOTATION: &str = "mpi-webhook.io/ssh-setup";
pub const PREFLIGHT_ANNOTATION: &str = "mpi-webhook.io/preflight";
/// `review mutate --preflight-image` of every JobSet-mode run: the launcher pod gets the
/// pre-flight init container, which the test runs before the launcher's command.
pub const PREFLIGHT_IMAGE: &str = "mpiw.test/mpi-webhook:latest";
/// Where the pre-flight image has the binary (the shipped Dockerfile's path); the test runs the
/// binary under test in its place.
pub const IMAGE_BINARY: &str = "/usr/local/bin/mpi-webhook";
/// The container listed before the wired one when [`JobSetShape::container`] is set.
pub const SIDECAR: &str = "sidecar";

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
    /// The UID and GID the platform runs a container as when neither it nor its pod names a
    /// user (OpenShift's SCCs); `None`: the image's default user.
    pub platform_user: Option<(u32, u32)>,
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
    platform_user: None,
};

/// A root image (mpi-operator's base images run sshd as root on port 22): no user to switch to,
/// the image's sshd configuration in the usual place. JobSet mode's default `sshAuthMountPath`.
const ROOT_IMAGE: Image = Image {
    user: None,
    ssh_auth_mount_path: "/root/.ssh",
    sshd_config: "/etc/ssh/sshd_config",
    sshd_port: 22,
    platform_user: None,
};

impl Mode {
    pub fn image(self) -> Image {
        match self {
            Mode::TrainJob => TRAINER_RUNTIME_IMAGE,
            Mode::JobSet(shape) if shape.any_uid => Image {
                platform_user: Some((ANY_UID, 0)),
                ..ROOT_IMAGE
            },
            Mode::JobSet(_) => ROOT_IMAGE,
        }
    }

    /// The uid every rank must run as: the platform's, the image's user's, else root.
    pub fn uid(self) -> u32 {
        let image = self.image();
        image
            .platform_user
            .map(|(uid, _)| uid)
            .or(image.user.map(|u| u.uid))
            .unwrap_or(0)
    }

    pub fn label(self) -> &'static str {
        match self {
            Mode::TrainJob => "TrainJob mode",
            Mode::JobSet(_) => "JobSet mode",
        }
    }

    /// The container the MPI wiring goes to in the pods of replicatedJob `rjob`, and that the
    /// pod runs: Trainer's `node`; in JobSet mode the annotation's, else the one the test lists
    /// first.
    pub fn wired_container(self, rjob: &str) -> &'static str {
        match self {
            Mode::TrainJob => "node",
            Mode::JobSet(JobSetShape {
                container: Some(c), ..
            }) => c,
            Mode::JobSet(_) if rjob == "launcher" => "launcher",
            Mode::JobSet(_) => "node",
        }
    }

    /// The replicatedJobs of the workers, in the order the JobSet lists them (before the
    /// launcher): `node`, or the worker groups.
    pub fn worker_rjobs(self) -> Vec<&'static str> {
        match self {
            Mode::JobSet(shape) if shape.groups => GROUPS.iter().map(|(rj, _, _)| *rj).collect(),
            _ => vec!["node"],
        }
    }

    /// Processes per host the hostfile must give: the runtime's numProcPerNode (TrainJob
    /// mode), the annotation or else 1 (JobSet mode).
    pub fn slots(self) -> u32 {
        match self {
            Mode::TrainJob => SLOTS,
            Mode::JobSet(shape) => shape.slots_per_node.unwrap_or(1),
        }
    }
}

/// What the user and the cluster give mpi-webhook for one scenario.
pub struct Inputs {
    pub mode: Mode,
    /// TrainJob mode only: the runtime and the TrainJob, which `render` and `review mutate` read
    /// from the objects dir. JobSet mode needs neither.
    pub trainer: Option<TrainerObjects>,
    /// The JobSet before the mutating webhook: as Trainer's controller creates it (TrainJob mode),
    /// as the user writes it (JobSet mode).
    pub jobset: Value,
}

pub struct TrainerObjects {
    pub runtime: Value,
    pub trainjob: Value,
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
    match mode {
        Mode::TrainJob => trainjob_inputs(l, name, run_launcher_as_node, command),
        Mode::JobSet(shape) => jobset_mode_inputs(l, shape, name, run_launcher_as_node, command),
    }
}

/// The user's env a root launcher of `l` needs: Open MPI refuses to run as root unless told
/// (this is the user's env, not MPI wiring, and reaches the launcher like any other).
fn root_env(l: &Launcher, image: Image) -> Vec<Value> {
    if l.implementation == "OpenMPI" && image.user.is_none() && image.platform_user.is_none() {
        vec![
            json!({"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"}),
            json!({"name": "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "value": "1"}),
        ]
    } else {
        vec![]
    }
}

/// A metadata.uid unique to this run and name (`render` sets it in the ownerReferences).
fn uid_for(name: &str) -> String {
    format!(
        "0000{:04x}-6d70-4977-8000-{:012x}",
        std::process::id() & 0xffff,
        fnv(name)
    )
}

fn trainjob_inputs(
    l: &Launcher,
    name: &str,
    run_launcher_as_node: bool,
    command: Vec<String>,
) -> Inputs {
    let mode = Mode::TrainJob;
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
    let env = root_env(l, image);
    let uid = uid_for(name);
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
        mode,
        trainer: Some(TrainerObjects { runtime, trainjob }),
        jobset,
    }
}

/// A JobSet-mode JobSet written minimally, as `manifests/samples/jobset-pi-*.yaml` are: the
/// label, the images, the launcher's command (and the user's env a root Open MPI needs), the
/// counts, and only the annotations the scenario sets. `node` (3 workers, or 2 when the launcher
/// runs as a node: 3 hosts either way, as in TrainJob mode) is listed before `launcher`. No
/// command on the workers, no readiness probe, no `dependsOn`: the webhook fills them in, and the
/// test runs what its patch says. The pods run as root.
fn jobset_mode_inputs(
    l: &Launcher,
    shape: JobSetShape,
    name: &str,
    run_launcher_as_node: bool,
    command: Vec<String>,
) -> Inputs {
    let mode = Mode::JobSet(shape);
    let image = mode.image();
    let image_name = format!("mpiw.test/{}:latest", l.id);
    // Listed first when the annotation names the wired container; it must come out untouched.
    let containers = |wired: Value| match shape.container {
        Some(_) => json!([
            {"name": SIDECAR, "image": "mpiw.test/sidecar:latest", "command": ["sleep", "infinity"]},
            wired
        ]),
        None => json!([wired]),
    };
    let worker = json!({
        "name": mode.wired_container("node"),
        "image": image_name,
    });
    let launcher = json!({
        "name": mode.wired_container("launcher"),
        "image": image_name,
        "command": command,
        "env": root_env(l, image),
    });
    let workers = if run_launcher_as_node {
        NUM_NODES - 1
    } else {
        NUM_NODES
    };
    let mut annotations = serde_json::Map::new();
    if run_launcher_as_node {
        annotations.insert(RUN_LAUNCHER_AS_NODE_ANNOTATION.into(), json!("true"));
    }
    if let Some(c) = shape.container {
        annotations.insert(CONTAINER_ANNOTATION.into(), json!(c));
    }
    if let Some(n) = shape.slots_per_node {
        annotations.insert(SLOTS_PER_NODE_ANNOTATION.into(), json!(n.to_string()));
    }
    if let Some(port) = shape.ssh_port {
        annotations.insert(SSH_PORT_ANNOTATION.into(), json!(port.to_string()));
    }
    if let Some(setup) = shape.ssh_setup {
        annotations.insert(SSH_SETUP_ANNOTATION.into(), json!(setup));
    }
    if shape.no_preflight {
        annotations.insert(PREFLIGHT_ANNOTATION.into(), json!("false"));
    }
    let worker_rjob = |rjob: &str, pods: u32| {
        json!({"name": rjob, "template": {"spec": {
            "parallelism": pods,
            "completions": pods,
            "template": {"spec": {"restartPolicy": "OnFailure", "containers": containers(worker.clone())}}
        }}})
    };
    let mut rjobs = vec![worker_rjob("node", workers)];
    if shape.groups {
        let names: Vec<&str> = GROUPS.iter().map(|(rj, _, _)| *rj).collect();
        annotations.insert(WORKER_GROUPS_ANNOTATION.into(), json!(names.join(",")));
        let (big, _, slots) = GROUPS[1];
        annotations.insert(
            SLOTS_PER_GROUP_ANNOTATION.into(),
            json!(format!("{big}={slots}")),
        );
        rjobs = GROUPS
            .iter()
            .map(|(rj, pods, _)| worker_rjob(rj, *pods))
            .collect();
    }
    rjobs.push(json!({"name": "launcher",
    "template": {"spec": {
        "template": {"spec": {"restartPolicy": "OnFailure", "containers": containers(launcher)}}
    }}}));
    let jobset = json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid_for(name),
            "labels": {IMPLEMENTATION_LABEL: l.implementation},
            "annotations": annotations,
        },
        "spec": {
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
            "replicatedJobs": rjobs
        }
    });
    Inputs {
        mode,
        trainer: None,
        jobset,
    }
}

/// The hostfile JobSet mode must produce for a JobSet of [`jobset_mode_inputs`]: every `node`
/// pod as `<pod>.<subdomain>` (no subdomain set: the JobSet's name), then the launcher when it
/// runs as a node, which Hydra (Intel, MPICH) lists by its bare pod host name (Decision 17); the
/// implementation's line syntax (Decision 5) with the mode's slots.
pub fn jobset_mode_hostfile(
    l: &Launcher,
    mode: Mode,
    name: &str,
    run_launcher_as_node: bool,
) -> String {
    let workers = if run_launcher_as_node {
        NUM_NODES - 1
    } else {
        NUM_NODES
    };
    let slots = mode.slots();
    let mut hosts: Vec<(String, u32)> = (0..workers)
        .map(|p| (format!("{name}-node-0-{p}.{name}"), slots))
        .collect();
    // Worker groups (docs/jobset-mode.md "Worker groups"): group by group in the annotation's
    // order, each host with its group's slots.
    if let Mode::JobSet(JobSetShape { groups: true, .. }) = mode {
        hosts = GROUPS
            .iter()
            .flat_map(|(rj, pods, slots)| {
                (0..*pods).map(move |p| (format!("{name}-{rj}-0-{p}.{name}"), *slots))
            })
            .collect();
    }
    if run_launcher_as_node {
        let host = match l.implementation {
            "OpenMPI" => format!("{name}-launcher-0-0.{name}"),
            _ => format!("{name}-launcher-0-0"),
        };
        hosts.push((host, slots));
    }
    hosts
        .iter()
        .map(|(h, slots)| match l.implementation {
            "OpenMPI" => format!("{h} slots={slots}\n"),
            _ => format!("{h}:{slots}\n"),
        })
        .collect()
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
    // What the user has in the cluster when the JobSet is created: the runtime and the TrainJob
    // (TrainJob mode), or the JobSet itself (JobSet mode: `render` finds it there).
    let files: Vec<(&str, &Value)> = match &inputs.trainer {
        Some(t) => vec![("runtime.json", &t.runtime), ("trainjob.json", &t.trainjob)],
        None => vec![("jobset.json", &inputs.jobset)],
    };
    for (file, obj) in files {
        std::fs::write(objects.join(file), serde_json::to_vec_pretty(obj)?)?;
    }
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
            "userInfo": {"username": match inputs.mode {
                Mode::TrainJob => "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager",
                Mode::JobSet(_) => "mpiw-user",
            }},
            "object": inputs.jobset,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        }
    });
    let review_file = work.join("review.json");
    std::fs::write(&review_file, serde_json::to_vec_pretty(&review)?)?;
    let mut mutate = webhook();
    mutate.args(["review", "mutate"]).arg(&review_file);
    if inputs.trainer.is_some() {
        // TrainJob mode reads the policy from the TrainJob's runtime; JobSet mode from the
        // JobSet alone, so a user runs it without objects.
        mutate.arg("--objects-dir").arg(&objects);
    }
    // As the shipped Deployment runs it: JobSet mode adds the launcher pre-flight (TrainJob
    // mode ignores the flag: its patch is Trainer's).
    mutate.args(["--preflight-image", PREFLIGHT_IMAGE]);
    let out =
        proc::run_ok(&mut mutate, Duration::from_secs(60)).context("mpi-webhook review mutate")?;
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

/// The container named `name` of a pod spec.
pub fn container<'a>(pod_spec: &'a Value, name: &str) -> Result<&'a Value> {
    pod_spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .with_context(|| format!("pod template has no container named {name}"))
}
