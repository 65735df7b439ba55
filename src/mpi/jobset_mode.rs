//! JobSet mode (Decision 18): a JobSet labelled `mpi-webhook.io/implementation` and not owned by
//! a TrainJob gets its MPI wiring from its own label and annotations, without Kubeflow Trainer.
//!
//! This module only reads those settings, turns them into an [`MpiPlan`] and holds the admission
//! rules of the mode. Everything else (the implementation table, the hostfile, the patch writer,
//! the Secret and the ConfigMap) is TrainJob mode's, fed with this plan. Pure: no I/O.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};

use crate::api::jobset::{JobSet, ReplicatedJob};
use crate::api::runtime::DEFAULT_SSH_AUTH_MOUNT_PATH;
use crate::api::{Container, TRAINER_GROUP};
use crate::field_error::{BadValue, FieldError};
use crate::raw_json::RawJson;

use super::hostfile::check_hostfile_size;
use super::implementation::{self, Implementation};
use super::plan::{
    DEFAULT_SSH_PORT, JobSetDefaults, MpiPlan, PodSet, WiredContainer, gpus_per_node,
};
use super::validate::reserved_env_names_error;
use super::{LAUNCHER, NODE, SSH_PRIVATE_KEY_FILE_MODE_STRICT};

/// The opt-in label; its value names the implementation (`OpenMPI`, `Intel`, `MPICH`).
pub const IMPLEMENTATION_LABEL: &str = "mpi-webhook.io/implementation";
/// Annotation: processes per node, an integer >= 1.
pub const SLOTS_PER_NODE_ANNOTATION: &str = "mpi-webhook.io/slots-per-node";
/// Annotation: where the SSH Secret is mounted, an absolute path.
pub const SSH_AUTH_MOUNT_PATH_ANNOTATION: &str = "mpi-webhook.io/ssh-auth-mount-path";
/// Annotation: `true` lists the launcher in the hostfile too.
pub const RUN_LAUNCHER_AS_NODE_ANNOTATION: &str = "mpi-webhook.io/run-launcher-as-node";
/// Annotation: the name of the container to wire in both pod templates.
pub const CONTAINER_ANNOTATION: &str = "mpi-webhook.io/container";
/// Annotation: `true` or `false`, whether the reconciler creates the job's NetworkPolicy
///; absent means the reconciler's `--network-policy-default`.
pub const NETWORK_POLICY_ANNOTATION: &str = "mpi-webhook.io/network-policy";
/// Annotation: the workers' sshd port, an integer 1-65535.
pub const SSH_PORT_ANNOTATION: &str = "mpi-webhook.io/ssh-port";
/// Annotation: `false` opts out of the launcher pre-flight init container.
pub const PREFLIGHT_ANNOTATION: &str = "mpi-webhook.io/preflight";
/// Every annotation JobSet mode reads; like the label, fixed once the JobSet exists.
pub const SETTING_ANNOTATIONS: [&str; 7] = [
    SLOTS_PER_NODE_ANNOTATION,
    SSH_AUTH_MOUNT_PATH_ANNOTATION,
    RUN_LAUNCHER_AS_NODE_ANNOTATION,
    CONTAINER_ANNOTATION,
    NETWORK_POLICY_ANNOTATION,
    SSH_PORT_ANNOTATION,
    PREFLIGHT_ANNOTATION,
];

/// Where a JobSet's MPI policy comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode<'m> {
    /// Its controller is a TrainJob (this reference): the TrainJob's runtime gives the policy.
    TrainJob(&'m OwnerReference),
    /// It carries [`IMPLEMENTATION_LABEL`] and no TrainJob controls it.
    JobSet,
    /// Neither: mpi-webhook leaves it alone.
    Plain,
}

/// The mode of a JobSet with `metadata`. TrainJob mode wins over the label.
pub fn mode(metadata: &ObjectMeta) -> Mode<'_> {
    let train_job = metadata.owner_references.iter().flatten().find(|r| {
        r.controller == Some(true)
            && r.kind == "TrainJob"
            && r.api_version.split('/').next() == Some(TRAINER_GROUP)
    });
    match (train_job, label(metadata)) {
        (Some(owner), _) => Mode::TrainJob(owner),
        (None, Some(_)) => Mode::JobSet,
        (None, None) => Mode::Plain,
    }
}

fn label(metadata: &ObjectMeta) -> Option<&str> {
    metadata
        .labels
        .as_ref()?
        .get(IMPLEMENTATION_LABEL)
        .map(String::as_str)
}

fn annotation<'m>(metadata: &'m ObjectMeta, key: &str) -> Option<&'m str> {
    metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn label_field(key: &str) -> String {
    format!("metadata.labels[{key}]")
}

fn annotation_field(key: &str) -> String {
    format!("metadata.annotations[{key}]")
}

fn replicated_job_field(index: usize, rest: &str) -> String {
    format!("spec.replicatedJobs[{index}]{rest}")
}

const CONTAINERS: &str = ".template.spec.template.spec.containers";

/// The MPI settings of a JobSet-mode JobSet, read from its label and annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// From the label.
    pub implementation: &'static Implementation,
    /// The annotation's slots, or `None` to count the `node` container's GPUs (Decision 3).
    pub slots_per_node: Option<i64>,
    /// The annotation's mount path, or `/root/.ssh`.
    pub ssh_auth_mount_path: String,
    /// The annotation's `true`/`false`, or `false`.
    pub run_launcher_as_node: bool,
    /// The annotation's container, or each template's first.
    pub wired_container: WiredContainer,
    /// The network-policy annotation's `true`/`false`, or `None`: the reconciler's default.
    pub network_policy: Option<bool>,
    /// The annotation's sshd port, or 22.
    pub ssh_port: u16,
    /// The annotation's `true`/`false`, or `true`: whether the launcher gets the pre-flight
    /// (when an image for it is configured).
    pub preflight: bool,
}

/// The containers wired: the one the annotation names, else each template's first.
fn wired_container(metadata: &ObjectMeta) -> WiredContainer {
    match annotation(metadata, CONTAINER_ANNOTATION) {
        Some(name) => WiredContainer::Named(name.to_string()),
        None => WiredContainer::First,
    }
}

/// Reads the settings from `metadata`, with their defaults.
///
/// # Errors
/// One field error per label or annotation value that does not parse.
pub fn settings(metadata: &ObjectMeta) -> Result<Settings, Vec<FieldError>> {
    let mut errors = Vec::new();
    let name = label(metadata).unwrap_or_default();
    let implementation = implementation::lookup(name);
    if implementation.is_none() {
        errors.push(FieldError::unsupported(
            label_field(IMPLEMENTATION_LABEL),
            BadValue::Str(name.to_string()),
            &implementation::supported_names(),
        ));
    }
    let slots_per_node = annotation(metadata, SLOTS_PER_NODE_ANNOTATION).and_then(|text| {
        let slots = text.parse::<i64>().ok().filter(|n| *n >= 1);
        if slots.is_none() {
            errors.push(FieldError::invalid(
                annotation_field(SLOTS_PER_NODE_ANNOTATION),
                BadValue::Str(text.to_string()),
                "must be an integer >= 1",
            ));
        }
        slots
    });
    let ssh_auth_mount_path = match annotation(metadata, SSH_AUTH_MOUNT_PATH_ANNOTATION) {
        None => DEFAULT_SSH_AUTH_MOUNT_PATH,
        Some(path) if !path.starts_with('/') => {
            errors.push(FieldError::invalid(
                annotation_field(SSH_AUTH_MOUNT_PATH_ANNOTATION),
                BadValue::Str(path.to_string()),
                "must be an absolute path",
            ));
            path
        }
        Some(path) if super::mounts_over_hostfile(path) => {
            errors.push(FieldError::invalid(
                annotation_field(SSH_AUTH_MOUNT_PATH_ANNOTATION),
                BadValue::Str(path.to_string()),
                super::SSH_MOUNT_ON_HOSTFILE_DETAIL,
            ));
            path
        }
        Some(path) => path,
    };
    let run_launcher_as_node = match annotation(metadata, RUN_LAUNCHER_AS_NODE_ANNOTATION) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            errors.push(FieldError::unsupported(
                annotation_field(RUN_LAUNCHER_AS_NODE_ANNOTATION),
                BadValue::Str(other.to_string()),
                &["true", "false"],
            ));
            false
        }
    };
    let network_policy = network_policy(metadata)
        .map_err(|e| errors.push(*e))
        .ok()
        .flatten();
    let ssh_port = match annotation(metadata, SSH_PORT_ANNOTATION) {
        None => DEFAULT_SSH_PORT,
        Some(text) => text
            .parse::<u16>()
            .ok()
            .filter(|p| *p >= 1)
            .unwrap_or_else(|| {
                errors.push(FieldError::invalid(
                    annotation_field(SSH_PORT_ANNOTATION),
                    BadValue::Str(text.to_string()),
                    "must be an integer between 1 and 65535, inclusive",
                ));
                DEFAULT_SSH_PORT
            }),
    };
    let preflight = match annotation(metadata, PREFLIGHT_ANNOTATION) {
        None | Some("true") => true,
        Some("false") => false,
        Some(other) => {
            errors.push(FieldError::unsupported(
                annotation_field(PREFLIGHT_ANNOTATION),
                BadValue::Str(other.to_string()),
                &["true", "false"],
            ));
            true
        }
    };
    match implementation {
        Some(implementation) if errors.is_empty() => Ok(Settings {
            implementation,
            slots_per_node,
            ssh_auth_mount_path: ssh_auth_mount_path.to_string(),
            run_launcher_as_node,
            wired_container: wired_container(metadata),
            network_policy,
            ssh_port,
            preflight,
        }),
        _ => Err(errors),
    }
}

/// The network-policy annotation: `Some(true)`, `Some(false)`, or `None` when absent.
///
/// # Errors
/// An Unsupported-value field error for any other text.
pub fn network_policy(metadata: &ObjectMeta) -> Result<Option<bool>, Box<FieldError>> {
    match annotation(metadata, NETWORK_POLICY_ANNOTATION) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(other) => Err(Box::new(FieldError::unsupported(
            annotation_field(NETWORK_POLICY_ANNOTATION),
            BadValue::Str(other.to_string()),
            &["true", "false"],
        ))),
    }
}

impl MpiPlan {
    /// The plan of a JobSet-mode JobSet: its settings, its own counts (`replicas` x
    /// `parallelism`, never changed: no `node_count`), `spec.network.subdomain` else its name,
    /// and the private key projected with 0o600 (Decision 18).
    ///
    /// # Errors
    /// The field errors of [`settings`].
    pub fn for_jobset(jobset: &JobSet) -> Result<Self, Vec<FieldError>> {
        Ok(plan(jobset, settings(&jobset.metadata)?))
    }
}

fn plan(jobset: &JobSet, settings: Settings) -> MpiPlan {
    let spec = &jobset.spec;
    let slots = settings
        .slots_per_node
        .unwrap_or_else(|| gpu_slots(jobset, &settings.wired_container));
    MpiPlan {
        implementation: settings.implementation,
        slots,
        ssh_auth_mount_path: settings.ssh_auth_mount_path,
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
        wired_container: settings.wired_container,
        jobset_defaults: Some(JobSetDefaults {
            ssh_port: settings.ssh_port,
            preflight: settings.preflight,
            preflight_image: String::new(),
        }),
    }
}

/// Decision 3 on the wired container of `node`: its GPUs when more than 1, else 1.
fn gpu_slots(jobset: &JobSet, wired: &WiredContainer) -> i64 {
    let resources = find(jobset, NODE)
        .and_then(|(_, rjob)| wired_in(rjob, wired))
        .and_then(|(_, container)| container.resources.as_ref());
    match resources.map(gpus_per_node) {
        Some(gpus) if gpus > 1 => gpus,
        _ => 1,
    }
}

/// The first replicatedJob named `name`, with its index.
fn find<'j>(jobset: &'j JobSet, name: &str) -> Found<'j> {
    jobset
        .spec
        .replicated_jobs
        .iter()
        .enumerate()
        .find(|(_, rjob)| rjob.name == name)
}

/// The wired container of a replicatedJob's pod template, with its index.
fn wired_in<'j>(rjob: &'j ReplicatedJob, wired: &WiredContainer) -> Option<(usize, &'j Container)> {
    let containers = rjob.containers();
    let index = wired.index_in(containers.iter().map(|c| c.name.as_str()))?;
    Some((index, &containers[index]))
}

/// What admission makes of a JobSet-mode JobSet.
#[derive(Debug, Default)]
pub struct Checked {
    /// The plan, when the settings parse (the mutation uses it only when there are no errors).
    pub plan: Option<MpiPlan>,
    /// Every rule broken, in the order of the contract's list.
    pub errors: Vec<FieldError>,
    /// Admitted but risky.
    pub warnings: Vec<String>,
}

/// The admission rules of JobSet mode on CREATE and UPDATE (the label and annotations on UPDATE
/// are [`immutable_errors`]'s). `raw` is the JobSet as the client sent it, for the env list the
/// reserved-env error quotes.
pub fn check(jobset: &JobSet, raw: &RawJson<'_>) -> Checked {
    let mut checked = Checked::default();
    let errors = &mut checked.errors;
    let settings = settings(&jobset.metadata)
        .map_err(|e| errors.extend(e))
        .ok();
    if jobset.name().is_empty() {
        errors.push(FieldError::required(
            "metadata.name",
            "JobSet mode names the Secret, the ConfigMap and the host names after the JobSet: set a name (generateName alone is not enough)",
        ));
    }
    errors.extend(network_error(jobset));
    let (launcher, node) = (find(jobset, LAUNCHER), find(jobset, NODE));
    errors.extend(shape_errors(jobset, launcher, node));
    errors.extend(container_errors(jobset, [launcher, node]));
    if let Some(settings) = settings {
        let plan = plan(jobset, settings);
        if let Some((i, rjob)) = launcher {
            errors.extend(reserved_env_error(i, rjob, raw, &plan));
        }
        errors.extend(hostfile_error(&plan, node.or(launcher)));
        checked.plan = Some(plan);
    }
    if let (Some((i, rjob)), Some((n, _))) = (launcher, node)
        && !waits_for_ready_nodes(rjob)
    {
        let unset = rjob.depends_on.is_none();
        // Unset with `node` listed first, the mutation adds the dependsOn: nothing to warn of.
        if !unset || n > i {
            checked.warnings.push(dependency_warning(i, unset));
        }
    }
    checked
}

/// The warning for a launcher at index `i` that does not wait for Ready workers; `unset`: it
/// has no `dependsOn`, and `node` is listed after it, so none could be added.
fn dependency_warning(i: usize, unset: bool) -> String {
    let warning = format!(
        "spec.replicatedJobs[{i}].dependsOn: the launcher does not wait for the workers: without dependsOn [{{name: node, status: Ready}}] it may start before their sshd listens"
    );
    if unset {
        format!(
            "{warning}; none was added because node is listed after launcher, and JobSet lets a replicatedJob depend only on those listed before it: list node first"
        )
    } else {
        warning
    }
}

/// A replicatedJob found by name, with its index.
type Found<'j> = Option<(usize, &'j ReplicatedJob)>;

/// Hosts are listed by their pod host names, which JobSet publishes only with DNS host names.
fn network_error(jobset: &JobSet) -> Option<FieldError> {
    let network = jobset.spec.network.as_ref()?;
    (network.enable_dns_hostnames == Some(false)).then(|| {
        FieldError::invalid(
            "spec.network.enableDNSHostnames",
            BadValue::Json(false.into()),
            "must not be false in JobSet mode: MPI reaches every host by its pod host name",
        )
    })
}

/// A one-pod `launcher`, and a `node` unless the launcher runs as the only node.
fn shape_errors(jobset: &JobSet, launcher: Found<'_>, node: Found<'_>) -> Vec<FieldError> {
    let mut errors = match launcher {
        Some((i, rjob)) => launcher_pod_errors(i, rjob),
        None => vec![FieldError::required(
            "spec.replicatedJobs",
            format!("JobSet mode needs a replicatedJob named {LAUNCHER:?}"),
        )],
    };
    let run_launcher_as_node =
        annotation(&jobset.metadata, RUN_LAUNCHER_AS_NODE_ANNOTATION) == Some("true");
    if node.is_none() && !run_launcher_as_node {
        errors.push(FieldError::required(
            "spec.replicatedJobs",
            format!(
                "JobSet mode needs a replicatedJob named {NODE:?} unless {RUN_LAUNCHER_AS_NODE_ANNOTATION} is \"true\""
            ),
        ));
    }
    errors
}

/// The wired container exists in the launcher's and the workers' pod templates.
fn container_errors(jobset: &JobSet, rjobs: [Found<'_>; 2]) -> Vec<FieldError> {
    let wired = wired_container(&jobset.metadata);
    rjobs
        .into_iter()
        .flatten()
        .filter(|(_, rjob)| wired_in(rjob, &wired).is_none())
        .map(|(i, _)| {
            let field = replicated_job_field(i, CONTAINERS);
            match &wired {
                WiredContainer::Named(name) => FieldError::invalid(
                    field,
                    BadValue::Str(name.clone()),
                    format!(
                        "must contain the container named by annotation {CONTAINER_ANNOTATION}"
                    ),
                ),
                _ => FieldError::required(
                    field,
                    "JobSet mode wires the first container of the launcher and node pod templates",
                ),
            }
        })
        .collect()
}

/// Decision 8: the hostfile fits a ConfigMap; reported on the pod count of `rjob` (the workers,
/// or the launcher when there are none).
fn hostfile_error(plan: &MpiPlan, rjob: Found<'_>) -> Option<FieldError> {
    let too_large = check_hostfile_size(plan).err()?;
    let (i, rjob) = rjob?;
    Some(FieldError::invalid(
        replicated_job_field(i, ".template.spec.parallelism"),
        BadValue::Int(i64::from(rjob.template.spec.parallelism.unwrap_or(1))),
        too_large.to_string(),
    ))
}

/// The launcher runs exactly one pod: one replica, parallelism and completions 1 (or unset).
fn launcher_pod_errors(i: usize, rjob: &ReplicatedJob) -> Vec<FieldError> {
    const ONE_POD: &str = "the launcher must run exactly 1 pod";
    let job = &rjob.template.spec;
    [
        (".replicas", rjob.replicas),
        (".template.spec.parallelism", job.parallelism),
        (".template.spec.completions", job.completions),
    ]
    .into_iter()
    .filter_map(|(field, value)| {
        let value = value.filter(|n| *n != 1)?;
        Some(FieldError::invalid(
            replicated_job_field(i, field),
            BadValue::Int(i64::from(value)),
            ONE_POD,
        ))
    })
    .collect()
}

/// Section B's reserved-env rule on the launcher's wired container (Decision 6). An entry equal
/// to the one the mutation writes is no conflict: the validator sees the JobSet after the
/// mutation, and the mutation may run again (reinvocation).
fn reserved_env_error(
    i: usize,
    launcher: &ReplicatedJob,
    raw: &RawJson<'_>,
    plan: &MpiPlan,
) -> Option<FieldError> {
    let (c, _) = wired_in(launcher, &plan.wired_container)?;
    let env = raw.at(&format!(
        "/spec/replicatedJobs/{i}/template/spec/template/spec/containers/{c}/env"
    ));
    let injected: Vec<Value> = plan
        .launcher_env()
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect();
    let names = env
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| !injected.contains(e))
        .filter_map(|e| e.get("name")?.as_str());
    reserved_env_names_error(
        replicated_job_field(i, &format!("{CONTAINERS}[{c}].env")),
        || env.clone(),
        names,
        plan.implementation,
    )
}

fn waits_for_ready_nodes(launcher: &ReplicatedJob) -> bool {
    launcher
        .depends_on
        .iter()
        .flatten()
        .any(|d| d.name == NODE && d.status == "Ready")
}

/// The label on a JobSet a TrainJob controls: denied, its policy comes from the runtime.
pub fn label_on_train_job_error(metadata: &ObjectMeta) -> Option<FieldError> {
    let value = label(metadata)?;
    Some(FieldError::invalid(
        label_field(IMPLEMENTATION_LABEL),
        BadValue::Str(value.to_string()),
        "must not be set on a JobSet owned by a TrainJob: its MPI policy comes from the TrainJob's runtime",
    ))
}

/// On UPDATE: any change of the label or of a setting annotation, added, changed or removed
/// (the wiring is fixed at creation). An absent value reads as `""`, as Go reads a map.
pub fn immutable_errors(old: &ObjectMeta, new: &ObjectMeta) -> Vec<FieldError> {
    let changed = |field: String, old: Option<&str>, new: Option<&str>| {
        (old != new).then(|| {
            FieldError::invalid(
                field,
                BadValue::Str(new.unwrap_or_default().to_string()),
                "field is immutable",
            )
        })
    };
    let label_error = changed(label_field(IMPLEMENTATION_LABEL), label(old), label(new));
    let annotation_errors = SETTING_ANNOTATIONS.iter().filter_map(|key| {
        changed(
            annotation_field(key),
            annotation(old, key),
            annotation(new, key),
        )
    });
    label_error.into_iter().chain(annotation_errors).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metadata(value: Value) -> ObjectMeta {
        serde_json::from_value(value).expect("metadata")
    }

    #[test]
    fn a_trainjob_controller_wins_over_the_label() {
        let owned = metadata(json!({
            "labels": {IMPLEMENTATION_LABEL: "MPICH"},
            "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                 "name": "pi", "uid": "u", "controller": true}]
        }));
        assert!(matches!(mode(&owned), Mode::TrainJob(owner) if owner.name == "pi"));
        let labelled = metadata(json!({"labels": {IMPLEMENTATION_LABEL: "MPICH"}}));
        assert_eq!(mode(&labelled), Mode::JobSet);
        assert_eq!(
            mode(&metadata(json!({"labels": {"app": "x"}}))),
            Mode::Plain
        );
    }

    #[test]
    fn settings_default_as_the_contract_says() {
        let settings = settings(&metadata(
            json!({"labels": {IMPLEMENTATION_LABEL: "Intel"}}),
        ))
        .expect("parses");
        assert_eq!(
            settings,
            Settings {
                implementation: implementation::lookup("Intel").expect("Intel"),
                slots_per_node: None,
                ssh_auth_mount_path: "/root/.ssh".into(),
                run_launcher_as_node: false,
                wired_container: WiredContainer::First,
                network_policy: None,
                ssh_port: 22,
                preflight: true,
            }
        );
    }

    #[test]
    fn every_bad_setting_is_reported_at_once() {
        let errors = settings(&metadata(json!({
            "labels": {IMPLEMENTATION_LABEL: ""},
            "annotations": {SLOTS_PER_NODE_ANNOTATION: "-1", RUN_LAUNCHER_AS_NODE_ANNOTATION: "True"}
        })))
        .expect_err("three errors");
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.labels[mpi-webhook.io/implementation]",
                "metadata.annotations[mpi-webhook.io/slots-per-node]",
                "metadata.annotations[mpi-webhook.io/run-launcher-as-node]"
            ]
        );
    }
}
