//! The effective MPI policy of one JobSet (docs/behaviour.md sections A.4, C.1, C.2, D.3): pod sets with their
//! counts, slots per node, the implementation and the containers wired. Both the JobSet patch and
//! the hostfile are derived from an [`MpiPlan`], so they agree on every count and name.
//!
//! TrainJob mode builds it from a TrainJob on its runtime ([`MpiPlan::new`]); JobSet mode from
//! the JobSet's own label and annotations, read once into [`super::jobset_mode`]'s settings
//! ([`MpiPlan::from_settings`]; [`MpiPlan::for_jobset`] reads them too, for the tests and the
//! fuzzer).

use crate::api::resources::ResourceRequirements;
use crate::api::{
    Container, JobSet, MpiPolicySource, ReplicatedJob, RuntimeKind, TrainJob, TrainingRuntime,
};
use crate::field_error::{FieldError, go_quote};

use super::implementation::{self, DEFAULT_SSH_PORT, Implementation};
use super::jobset_mode::{Settings, SshSetup, settings, ssh_setup};
use super::{
    ANCESTOR_LABEL, ANCESTOR_TRAINER, LAUNCHER, NODE, SSH_PRIVATE_KEY_FILE_MODE_STRICT,
    SSH_PRIVATE_KEY_FILE_MODE_TRAINER,
};

/// Why no plan can be made for an MPI runtime.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// `mpiImplementation` is not in the implementation table (Decisions 4 and 7).
    #[error("unsupported mpiImplementation {0:?}")]
    UnsupportedImplementation(String),
    /// `sshAuthMountPath` is the hostfile's mount path, so the two mounts would replace each other
    /// on every pass and the pods would get only one of them.
    #[error("sshAuthMountPath {0:?} is where the hostfile is mounted")]
    SshAuthMountOnHostfile(String),
}

impl PlanError {
    /// What is wrong with runtime `name` of `kind`, for denials and Events (Decision 4's form:
    /// the runtime and the value named).
    pub fn detail(&self, kind: RuntimeKind, name: &str) -> String {
        match self {
            PlanError::UnsupportedImplementation(value) => {
                unsupported_implementation_detail(kind, name, value)
            }
            PlanError::SshAuthMountOnHostfile(path) => format!(
                "{} {name:?} has spec.mlPolicy.mpi.sshAuthMountPath {path:?}: {}",
                kind.as_str(),
                super::SSH_MOUNT_ON_HOSTFILE_DETAIL
            ),
        }
    }
}

/// Why a runtime's implementation is unusable, naming the runtime and the value (Decision 4).
pub fn unsupported_implementation_detail(kind: RuntimeKind, runtime: &str, value: &str) -> String {
    format!(
        "{} {} has an unsupported spec.mlPolicy.mpi.mpiImplementation {}: supported values: {}",
        kind.as_str(),
        go_quote(runtime),
        go_quote(value),
        implementation::supported_names()
            .iter()
            .map(|n| go_quote(n))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// One replicated job of the runtime, with the counts the TrainJob gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSet {
    /// replicatedJob name.
    pub name: String,
    /// Job replicas (`r` in the endpoint names).
    pub replicas: i64,
    /// Pods per Job (`p` in the endpoint names).
    pub count: i64,
}

/// A worker group: a replicatedJob whose pods are MPI hosts, with their slots each (`node` in
/// TrainJob mode; in JobSet mode those `mpi-webhook.io/worker-groups` names, Decision 20).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerGroup {
    /// replicatedJob name.
    pub name: String,
    /// Slots per host.
    pub slots: i64,
}

/// Which containers of the `launcher` and `node` pod templates get the mounts and the env.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WiredContainer {
    /// Every container named `node` (TrainJob mode, upstream's rule: Decision 15).
    NamedNode,
    /// The container of this name (JobSet mode's `mpi-webhook.io/container`).
    Named(String),
    /// Each template's first container (JobSet mode's default).
    First,
}

impl WiredContainer {
    /// Whether the container at `index` of a pod template, named `name`, is wired.
    pub fn wires(&self, index: usize, name: Option<&str>) -> bool {
        match self {
            WiredContainer::NamedNode => name == Some(NODE),
            WiredContainer::Named(wired) => name == Some(wired.as_str()),
            WiredContainer::First => index == 0,
        }
    }

    /// The index of the wired container among `names` (a template's container names in order),
    /// or `None` when none is.
    pub fn index_in<'n>(&self, names: impl IntoIterator<Item = &'n str>) -> Option<usize> {
        names
            .into_iter()
            .enumerate()
            .position(|(i, name)| self.wires(i, Some(name)))
    }

    /// JobSet mode's: the container `mpi-webhook.io/container` names, else each template's
    /// first.
    pub fn for_jobset(container: Option<&str>) -> Self {
        match container {
            Some(name) => WiredContainer::Named(name.to_string()),
            None => WiredContainer::First,
        }
    }

    /// The wired container of a replicatedJob's pod template, with its index.
    pub fn container_in<'j>(&self, rjob: &'j ReplicatedJob) -> Option<(usize, &'j Container)> {
        let containers = rjob.containers();
        let index = self.index_in(containers.iter().map(|c| c.name.as_str()))?;
        Some((index, &containers[index]))
    }
}

/// The effective MPI policy of one JobSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpiPlan {
    /// The implementation row.
    pub implementation: &'static Implementation,
    /// Processes per node of the first worker group: the slots env vars, and the launcher's
    /// hostfile line when it runs as a node.
    pub slots: i64,
    /// The replicatedJobs whose pods are listed in the hostfile, in hostfile order, with their
    /// slots: `node` alone but in JobSet mode with `mpi-webhook.io/worker-groups`.
    pub worker_groups: Vec<WorkerGroup>,
    /// Where the SSH Secret is mounted.
    pub ssh_auth_mount_path: String,
    /// Mode of the projected private key file (`id_rsa`): upstream's in TrainJob mode
    /// (Decision 16), 0o600 in JobSet mode (Decision 18).
    pub ssh_private_key_mode: i32,
    /// Whether the launcher is also listed in the hostfile.
    pub run_launcher_as_node: bool,
    /// The `node` replicatedJob's parallelism/completions, when the TrainJob sets numNodes.
    pub node_count: Option<i64>,
    /// The runtime's replicated jobs in template order, with effective counts.
    pub pod_sets: Vec<PodSet>,
    /// Host name suffix: the JobSet subdomain, by default the JobSet name.
    pub subdomain: String,
    /// The JobSet's name (in TrainJob mode the TrainJob's): the prefix of host names and of the
    /// Secret's and ConfigMap's names.
    pub jobset_name: String,
    /// The containers that get the mounts and the env.
    pub wired_container: WiredContainer,
    /// What JobSet mode fills in where the user left it unset; `None` in TrainJob mode, whose
    /// patch is Trainer's and nothing more.
    pub jobset_defaults: Option<JobSetDefaults>,
}

/// What JobSet mode's defaults (docs/jobset-mode.md "Defaults": the sshd command and readiness
/// probe of the workers, the launcher's `dependsOn`, the ssh port on the client side, the
/// launcher pre-flight) follow: the JobSet's settings, as read once, and the webhook's options.
/// A new default reads its setting or option here, in the writer: the plan is not changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSetDefaults {
    /// The JobSet's settings (`mpi-webhook.io/ssh-port`, `ssh-setup`, `preflight`, ...).
    pub settings: Settings,
    /// The webhook's options (`--preflight-image`).
    pub options: Options,
}

/// What the webhook's policy is configured with besides the objects it looks up: plain data
/// from the command line of `serve` and `review` (`crate::cli::PolicyArgs`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// `--preflight-image`: the image of JobSet mode's launcher pre-flight init container;
    /// empty, no pre-flight.
    pub preflight_image: String,
}

impl MpiPlan {
    /// The plan for `train_job` on `runtime`; `Ok(None)` when the runtime has no MPI policy.
    ///
    /// # Errors
    /// [`PlanError::UnsupportedImplementation`] when the runtime names no known implementation.
    pub fn new(train_job: &TrainJob, runtime: &TrainingRuntime) -> Result<Option<Self>, PlanError> {
        let Some(mpi) = runtime.mpi() else {
            return Ok(None);
        };
        let implementation = implementation::lookup(mpi.mpi_implementation()).ok_or_else(|| {
            PlanError::UnsupportedImplementation(mpi.mpi_implementation().to_string())
        })?;
        if super::mounts_over_hostfile(mpi.ssh_auth_mount_path()) {
            return Err(PlanError::SshAuthMountOnHostfile(
                mpi.ssh_auth_mount_path().to_string(),
            ));
        }
        let trainer = train_job.spec.trainer.as_ref();
        let num_nodes = trainer.and_then(|t| t.num_nodes).map(i64::from);
        let run_launcher_as_node = mpi.run_launcher_as_node();
        let template = &runtime.spec.template.spec;
        let mut pod_sets: Vec<PodSet> = template
            .replicated_jobs
            .iter()
            .map(|rjob| initial_pod_set(rjob, runtime))
            .collect();
        // C.1: only when the TrainJob sets numNodes and a `node` PodSet exists.
        let node_count = match (num_nodes, pod_sets.iter_mut().find(|p| p.name == NODE)) {
            (Some(n), Some(node)) => {
                node.count = if run_launcher_as_node {
                    (n - 1).max(1)
                } else {
                    n
                };
                Some(node.count)
            }
            _ => None,
        };
        let slots = slots(train_job, mpi, &template.replicated_jobs);
        Ok(Some(Self {
            implementation,
            slots,
            worker_groups: vec![WorkerGroup {
                name: NODE.to_string(),
                slots,
            }],
            ssh_auth_mount_path: mpi.ssh_auth_mount_path().to_string(),
            ssh_private_key_mode: SSH_PRIVATE_KEY_FILE_MODE_TRAINER,
            run_launcher_as_node,
            node_count,
            pod_sets,
            subdomain: template
                .subdomain()
                .unwrap_or_else(|| train_job.name())
                .to_string(),
            jobset_name: train_job.name().to_string(),
            wired_container: WiredContainer::NamedNode,
            jobset_defaults: None,
        }))
    }

    /// The port ssh reaches the workers' sshd on: 22 but in JobSet mode with another port.
    pub fn ssh_port(&self) -> u16 {
        self.jobset_defaults
            .as_ref()
            .map_or(DEFAULT_SSH_PORT, |d| d.settings.ssh_port)
    }

    /// Whether the pods get JobSet mode's `generated` ssh setup.
    pub fn generated_ssh(&self) -> bool {
        self.jobset_defaults
            .as_ref()
            .is_some_and(|d| d.settings.ssh_setup == SshSetup::Generated)
    }

    /// The launcher env of the plan's implementation, as `(name, value)` pairs.
    pub fn launcher_env(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        let suffix = if self.generated_ssh() {
            ssh_setup::ssh_args_suffix()
        } else {
            implementation::port_suffix(self.ssh_port())
        };
        let pairs: Vec<_> = self.implementation.env_pairs(self.slots, &suffix).collect();
        pairs.into_iter()
    }

    /// The image of the launcher pre-flight, when the plan has one: JobSet mode, an image
    /// configured and the JobSet not opted out.
    pub fn preflight_image(&self) -> Option<&str> {
        self.jobset_defaults
            .as_ref()
            .filter(|d| d.settings.preflight && !d.options.preflight_image.is_empty())
            .map(|d| d.options.preflight_image.as_str())
    }

    /// The worker group named `name`, if it is one.
    pub fn worker_group(&self, name: &str) -> Option<&WorkerGroup> {
        self.worker_groups.iter().find(|g| g.name == name)
    }

    /// Whether the hostfile lists the pods of this pod set.
    pub fn lists_in_hostfile(&self, pod_set: &PodSet) -> bool {
        self.worker_group(&pod_set.name).is_some()
            || (pod_set.name == LAUNCHER && self.run_launcher_as_node)
    }

    /// Whether the hostfile gives its hosts different slots (worker groups of different slots,
    /// or the launcher as a node with other slots than theirs).
    pub fn uneven_slots(&self) -> bool {
        let listed = self.hostfile_pod_sets();
        let mut slots = listed
            .iter()
            .filter(|(p, _)| p.replicas > 0 && p.count > 0)
            .map(|(_, slots)| *slots);
        slots
            .next()
            .is_some_and(|first| slots.any(|other| other != first))
    }

    /// The pod sets the hostfile lists, in its order, with the slots of each of their hosts:
    /// the worker groups in their order, and the launcher, when it runs as a node, before them
    /// when it is listed before the first group's pod set, else after them (Decision 20; for
    /// `node` alone, D.2's template order).
    pub fn hostfile_pod_sets(&self) -> Vec<(&PodSet, i64)> {
        let group_rank = |p: &PodSet| self.worker_groups.iter().position(|g| g.name == p.name);
        let first_group = self.pod_sets.iter().position(|p| group_rank(p).is_some());
        let mut listed: Vec<(usize, &PodSet)> = self
            .pod_sets
            .iter()
            .enumerate()
            .filter(|(_, p)| self.lists_in_hostfile(p))
            .collect();
        // Stable: pod sets of the same rank keep their template order.
        listed.sort_by_key(|(i, p)| match group_rank(p) {
            Some(rank) => (1, rank),
            None if first_group.is_none_or(|first| *i < first) => (0, 0),
            None => (2, 0),
        });
        listed
            .into_iter()
            .map(|(_, p)| {
                (
                    p,
                    self.worker_group(&p.name).map_or(self.slots, |g| g.slots),
                )
            })
            .collect()
    }
}

impl MpiPlan {
    /// The plan of a JobSet-mode JobSet, its settings read here: what tests and the fuzzer use.
    /// Production code reads the settings once for its rules too and calls
    /// [`MpiPlan::from_settings`]. Its settings, its own counts (`replicas` x
    /// `parallelism`, never changed: no `node_count`), `spec.network.subdomain` else its name,
    /// the private key projected with 0o600 (Decision 18), and the pre-flight of `options`.
    ///
    /// # Errors
    /// The field errors of [`settings`].
    pub fn for_jobset(jobset: &JobSet, options: &Options) -> Result<Self, Vec<FieldError>> {
        Ok(Self::from_settings(
            jobset,
            settings(&jobset.metadata)?,
            options,
        ))
    }

    /// The plan of a JobSet-mode JobSet whose settings were already read, complete.
    pub fn from_settings(jobset: &JobSet, settings: Settings, options: &Options) -> Self {
        let wired_container = WiredContainer::for_jobset(settings.container.as_deref());
        let spec = &jobset.spec;
        let worker_groups: Vec<WorkerGroup> = settings
            .worker_groups
            .iter()
            .map(|name| WorkerGroup {
                name: name.clone(),
                slots: settings
                    .slots_of(name)
                    .unwrap_or_else(|| gpu_slots(jobset, name, &wired_container)),
            })
            .collect();
        // The settings always name a group (`node` by default): the first's are `node`'s slots.
        let slots = worker_groups.first().map_or(1, |g| g.slots);
        MpiPlan {
            implementation: settings.implementation,
            slots,
            worker_groups,
            ssh_auth_mount_path: settings.ssh_auth_mount_path().to_string(),
            ssh_private_key_mode: SSH_PRIVATE_KEY_FILE_MODE_STRICT,
            run_launcher_as_node: settings.run_launcher_as_node,
            node_count: None,
            pod_sets: spec
                .replicated_jobs
                .iter()
                .map(|rjob| PodSet {
                    name: rjob.name.clone(),
                    replicas: i64::from(rjob.replicas().max(0)),
                    count: i64::from(rjob.template.spec.parallelism.unwrap_or(1).max(0)),
                })
                .collect(),
            subdomain: spec.subdomain().unwrap_or(jobset.name()).to_string(),
            jobset_name: jobset.name().to_string(),
            wired_container,
            jobset_defaults: Some(JobSetDefaults {
                settings,
                options: options.clone(),
            }),
        }
    }
}

/// Decision 3 on the wired container of worker group `group`: its GPUs when more than 1, else 1.
fn gpu_slots(jobset: &JobSet, group: &str, wired: &WiredContainer) -> i64 {
    let resources = jobset
        .replicated_job(group)
        .and_then(|(_, rjob)| wired.container_in(rjob))
        .and_then(|(_, container)| container.resources.as_ref());
    match resources.map(gpus_per_node) {
        Some(gpus) if gpus > 1 => gpus,
        _ => 1,
    }
}

fn is_trainer(rjob: &ReplicatedJob) -> bool {
    rjob.label(ANCESTOR_LABEL) == Some(ANCESTOR_TRAINER)
}

/// A.4: count = parallelism (default 1), or mlPolicy.numNodes for the trainer-labelled job;
/// floored at 1. The trainer-labelled job runs with exactly one replica (JobSet plugin).
fn initial_pod_set(rjob: &ReplicatedJob, runtime: &TrainingRuntime) -> PodSet {
    let ml_policy_nodes = runtime
        .spec
        .ml_policy
        .as_ref()
        .map(|p| p.num_nodes.unwrap_or(1));
    let count = match ml_policy_nodes {
        Some(n) if is_trainer(rjob) => n,
        _ => rjob.template.spec.parallelism.unwrap_or(1),
    };
    PodSet {
        name: rjob.name.clone(),
        replicas: if is_trainer(rjob) {
            1
        } else {
            i64::from(rjob.replicas().max(0))
        },
        count: i64::from(count.max(1)),
    }
}

/// C.2: the TrainJob's numProcPerNode; else, when the runtime says 1, the GPU count per node
/// (when above 1); else the runtime's value.
fn slots(train_job: &TrainJob, mpi: &MpiPolicySource, rjobs: &[ReplicatedJob]) -> i64 {
    let trainer = train_job.spec.trainer.as_ref();
    if let Some(n) = trainer.and_then(|t| t.num_proc_per_node) {
        return i64::from(n);
    }
    let runtime_value = i64::from(mpi.num_proc_per_node());
    if runtime_value != 1 {
        return runtime_value;
    }
    let resources = trainer
        .and_then(|t| t.resources_per_node.as_ref())
        .or_else(|| runtime_node_resources(rjobs));
    match resources.map(gpus_per_node) {
        Some(gpus) if gpus > 1 => gpus,
        _ => 1,
    }
}

/// The first replicatedJob named `node` or labelled trainer whose `node` container has resources.
fn runtime_node_resources(rjobs: &[ReplicatedJob]) -> Option<&ResourceRequirements> {
    rjobs
        .iter()
        .filter(|r| r.name == NODE || is_trainer(r))
        .find_map(|r| {
            r.containers()
                .iter()
                .find(|c| c.name == NODE)
                .and_then(|c| c.resources.as_ref())
        })
}

/// Decision 3: names in sorted order, the first containing `gpu` (case-insensitive) counts;
/// requests first, limits when the request gives 0; quantities rounded up.
pub fn gpus_per_node(resources: &ResourceRequirements) -> i64 {
    let first_gpu = |list: &Option<std::collections::BTreeMap<String, _>>| -> i64 {
        list.iter()
            .flatten()
            .find(|(name, _)| name.to_lowercase().contains("gpu"))
            .and_then(|(_, q): (_, &crate::api::resources::Quantity)| q.ceil_value())
            .unwrap_or(0)
    };
    match first_gpu(&resources.requests) {
        0 => first_gpu(&resources.limits),
        n => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn runtime(value: serde_json::Value) -> TrainingRuntime {
        serde_json::from_value(value).expect("runtime parses")
    }

    fn train_job(trainer: serde_json::Value) -> TrainJob {
        serde_json::from_value(json!({
            "metadata": {"name": "pi", "namespace": "default", "uid": "u1"},
            "spec": {"runtimeRef": {"name": "rt"}, "trainer": trainer}
        }))
        .expect("trainjob parses")
    }

    fn deepspeed_like(mpi: serde_json::Value) -> TrainingRuntime {
        runtime(json!({
            "metadata": {"name": "rt"},
            "spec": {
                "mlPolicy": {"numNodes": 1, "mpi": mpi},
                "template": {"spec": {"replicatedJobs": [
                    {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}}},
                    {"name": "launcher", "template": {
                        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                        "spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}}}
                ]}}
            }
        }))
    }

    #[test]
    fn non_mpi_runtime_has_no_plan() {
        let rt = runtime(json!({"spec": {"mlPolicy": {"numNodes": 2}}}));
        assert_eq!(MpiPlan::new(&train_job(json!({})), &rt), Ok(None));
    }

    #[test]
    fn defaults_apply_when_mpi_fields_are_absent() {
        let plan = MpiPlan::new(&train_job(json!(null)), &deepspeed_like(json!({})))
            .expect("plan")
            .expect("mpi");
        assert_eq!(plan.implementation.name, "OpenMPI");
        assert_eq!(plan.slots, 1);
        assert_eq!(plan.ssh_auth_mount_path, "/root/.ssh");
        assert!(!plan.run_launcher_as_node);
        assert_eq!(plan.node_count, None);
        assert_eq!(plan.subdomain, "pi");
    }

    #[test]
    fn run_launcher_as_node_takes_one_node_but_never_below_one() {
        let rt = deepspeed_like(json!({"runLauncherAsNode": true}));
        for (nodes, expected) in [(3, 2), (2, 1), (1, 1), (0, 1)] {
            let plan = MpiPlan::new(&train_job(json!({"numNodes": nodes})), &rt)
                .expect("plan")
                .expect("mpi");
            assert_eq!(plan.node_count, Some(expected), "numNodes {nodes}");
        }
    }

    #[test]
    fn unsupported_implementation_is_an_error() {
        for value in ["", "LAM"] {
            let rt = deepspeed_like(json!({"mpiImplementation": value}));
            assert_eq!(
                MpiPlan::new(&train_job(json!({})), &rt),
                Err(PlanError::UnsupportedImplementation(value.to_string()))
            );
        }
    }

    #[test]
    fn gpu_count_is_deterministic_and_rounds_up() {
        let r: ResourceRequirements = serde_json::from_value(json!({
            "requests": {"b.com/gpu": "0", "a.com/GPU": "3", "cpu": "8"},
            "limits": {"nvidia.com/gpu": 9}
        }))
        .expect("parses");
        assert_eq!(gpus_per_node(&r), 3);
        let limits_only: ResourceRequirements =
            serde_json::from_value(json!({"limits": {"nvidia.com/gpu": "1500m"}})).expect("parses");
        assert_eq!(gpus_per_node(&limits_only), 2);
        let zero_request: ResourceRequirements = serde_json::from_value(
            json!({"requests": {"nvidia.com/gpu": "0"}, "limits": {"nvidia.com/gpu": "4"}}),
        )
        .expect("parses");
        assert_eq!(gpus_per_node(&zero_request), 4);
    }

    #[test]
    fn slots_come_from_trainjob_then_gpus_then_runtime() {
        let rt = deepspeed_like(json!({"numProcPerNode": 1}));
        let with_procs = train_job(
            json!({"numProcPerNode": 8, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}),
        );
        assert_eq!(
            MpiPlan::new(&with_procs, &rt)
                .expect("ok")
                .expect("mpi")
                .slots,
            8
        );
        let with_gpus = train_job(json!({"resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}));
        assert_eq!(
            MpiPlan::new(&with_gpus, &rt)
                .expect("ok")
                .expect("mpi")
                .slots,
            4
        );
        let rt4 = deepspeed_like(json!({"numProcPerNode": 4}));
        assert_eq!(
            MpiPlan::new(&with_gpus, &rt4)
                .expect("ok")
                .expect("mpi")
                .slots,
            4
        );
        let rt2 = deepspeed_like(json!({"numProcPerNode": 2}));
        assert_eq!(
            MpiPlan::new(&train_job(json!({})), &rt2)
                .expect("ok")
                .expect("mpi")
                .slots,
            2
        );
    }
}
