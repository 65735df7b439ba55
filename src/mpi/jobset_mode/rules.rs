//! JobSet mode's admission rules: what a JobSet-mode JobSet must look like on CREATE, the
//! warnings it gets, and the settings fixed on UPDATE. Built on the settings and the plan.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::api::jobset::{JobSet, ReplicatedJob};
use crate::field_error::{BadValue, FieldError, go_quote};
use crate::mpi::hostfile::{check_hostfile_size, host_name_too_long};
use crate::mpi::plan::{MpiPlan, WiredContainer};
use crate::mpi::validate::reserved_env_names_error;
use crate::mpi::{HOSTFILE_PATH, LAUNCHER, NODE, SSH_AUTH_VOLUME};
use crate::raw_json::RawJson;

use super::settings::*;

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
    let launcher = jobset.replicated_job(LAUNCHER);
    // The worker groups (Decision 20) found in the JobSet, in the groups' order; when the
    // annotation does not parse, `node` stands in for the checks of its pods (the settings
    // report the annotation).
    let named = worker_groups(&jobset.metadata);
    let groups = named
        .as_ref()
        .map_or_else(|_| vec![NODE.to_string()], Clone::clone);
    let found: Vec<(&str, Found<'_>)> = groups
        .iter()
        .map(|name| (name.as_str(), jobset.replicated_job(name)))
        .collect();
    let group_jobs: Vec<Found<'_>> = found.iter().map(|(_, rjob)| *rjob).collect();
    let unset = if wired_by_image(jobset, launcher, raw) {
        SshSetup::Image
    } else {
        SshSetup::Generated
    };
    let settings = settings_with(&jobset.metadata, unset)
        .map_err(|e| errors.extend(e))
        .ok();
    errors.extend(ssh_auth_mount_path_error(&jobset.metadata, unset));
    if jobset.name().is_empty() {
        errors.push(FieldError::required(
            "metadata.name",
            "JobSet mode names the Secret, the ConfigMap and the host names after the JobSet: set a name (generateName alone is not enough)",
        ));
    }
    errors.extend(network_error(jobset));
    errors.extend(shape_errors(
        jobset,
        launcher,
        named.is_ok().then_some(&found[..]),
    ));
    errors.extend(container_errors(
        jobset,
        std::iter::once(launcher).chain(group_jobs.iter().copied()),
    ));
    if let Some(settings) = settings {
        let plan = MpiPlan::from_settings(jobset, settings);
        if let Some((i, rjob)) = launcher {
            errors.extend(reserved_env_error(i, rjob, raw, &plan));
            checked
                .warnings
                .extend(uneven_slots_warning(i, rjob, raw, &plan));
        }
        let first_group = group_jobs.iter().copied().flatten().next();
        errors.extend(hostfile_error(&plan, first_group.or(launcher)));
        checked.plan = Some(plan);
    }
    let present: Vec<(&str, usize)> = found
        .iter()
        .filter_map(|(name, rjob)| Some((*name, rjob.as_ref()?.0)))
        .collect();
    if let Some((i, rjob)) = launcher
        && !present.is_empty()
        && !waits_for_ready_groups(rjob, &groups)
    {
        let unset = rjob.depends_on.is_none();
        let after: Vec<&str> = present
            .iter()
            .filter(|(_, n)| *n > i)
            .map(|(name, _)| *name)
            .collect();
        // Unset with every group listed first, the mutation adds the dependsOn: nothing to warn
        // of.
        if !unset || !after.is_empty() {
            let after = if unset { after } else { Vec::new() };
            checked
                .warnings
                .push(dependency_warning(i, &groups, &after));
        }
    }
    checked
}

/// Worker groups of different slots on an implementation whose launcher env gives every host the
/// same count (the table's `uneven_slots`), and a launcher command that does not name the flag
/// that keeps each host's own: the ranks would not land as the hostfile says.
fn uneven_slots_warning(
    i: usize,
    launcher: &ReplicatedJob,
    raw: &RawJson<'_>,
    plan: &MpiPlan,
) -> Option<String> {
    let needs = plan.implementation.uneven_slots.as_ref()?;
    let (c, _) = plan.wired_container.container_in(launcher)?;
    let container = format!("/spec/replicatedJobs/{i}/template/spec/template/spec/containers/{c}");
    // A word of the command or args, `sh -c` scripts included.
    let named = ["command", "args"].iter().any(|key| {
        raw.at(&format!("{container}/{key}"))
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|word| word.contains(needs.flag))
    });
    (plan.uneven_slots() && !named).then(|| {
        format!(
            "{}: {}: with worker groups of different slots, add {} {HOSTFILE_PATH} to the launcher's command",
            replicated_job_field(i, &format!("{CONTAINERS}[{c}].command")),
            needs.why,
            needs.flag
        )
    })
}

/// The warning for a launcher at index `i` that does not wait for Ready workers of `groups`;
/// `after`: the groups listed after it when it has no `dependsOn`, which is why none was added.
fn dependency_warning(i: usize, groups: &[String], after: &[&str]) -> String {
    let wanted: Vec<String> = groups
        .iter()
        .map(|name| format!("{{name: {name}, status: Ready}}"))
        .collect();
    let warning = format!(
        "spec.replicatedJobs[{i}].dependsOn: the launcher does not wait for the workers: without dependsOn [{}] it may start before their sshd listens",
        wanted.join(", ")
    );
    if after.is_empty() {
        return warning;
    }
    let (names, verb) = (
        after.join(", "),
        if after.len() == 1 { "is" } else { "are" },
    );
    format!(
        "{warning}; none was added because {names} {verb} listed after launcher, and JobSet lets a replicatedJob depend only on those listed before it: list {names} first"
    )
}

/// Whether the launcher's wired container already mounts the SSH Secret: a JobSet the webhook
/// wired before `generated` was the default, which stays `image` for its UPDATEs (only the init
/// container mounts the Secret under `generated`).
fn wired_by_image(jobset: &JobSet, launcher: Found<'_>, raw: &RawJson<'_>) -> bool {
    let Some((i, rjob)) = launcher else {
        return false;
    };
    let wired = WiredContainer::for_jobset(container(&jobset.metadata));
    let Some((c, _)) = wired.container_in(rjob) else {
        return false;
    };
    let mounts = raw.at(&format!(
        "/spec/replicatedJobs/{i}/template/spec/template/spec/containers/{c}/volumeMounts"
    ));
    mounts
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m.get("name").and_then(Value::as_str) == Some(SSH_AUTH_VOLUME))
}

/// `ssh-auth-mount-path` means nothing under `generated`: the key is no longer mounted there.
fn ssh_auth_mount_path_error(metadata: &ObjectMeta, unset: SshSetup) -> Option<FieldError> {
    let path = annotation(metadata, SSH_AUTH_MOUNT_PATH_ANNOTATION)?;
    let generated = match annotation(metadata, SSH_SETUP_ANNOTATION) {
        None => unset == SshSetup::Generated,
        Some(value) => value == "generated",
    };
    generated.then(|| {
        FieldError::invalid(
            annotation_field(SSH_AUTH_MOUNT_PATH_ANNOTATION),
            BadValue::Str(path.to_string()),
            format!(
                "must not be set when {SSH_SETUP_ANNOTATION} is \"generated\" (the default): the SSH key is no longer mounted there; set {SSH_SETUP_ANNOTATION}: \"image\" to mount it there"
            ),
        )
    })
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

/// A one-pod `launcher`, and a `node` unless the launcher runs as the only node; with
/// `mpi-webhook.io/worker-groups`, every group it names (`groups`: each with its replicatedJob,
/// `None` when the annotation does not parse, which the settings report).
fn shape_errors(
    jobset: &JobSet,
    launcher: Found<'_>,
    groups: Option<&[(&str, Found<'_>)]>,
) -> Vec<FieldError> {
    let mut errors = match launcher {
        Some((i, rjob)) => launcher_pod_errors(i, rjob),
        None => vec![FieldError::required(
            "spec.replicatedJobs",
            format!("JobSet mode needs a replicatedJob named {LAUNCHER:?}"),
        )],
    };
    if let Some(text) = annotation(&jobset.metadata, WORKER_GROUPS_ANNOTATION) {
        // Named groups must all exist, with or without the launcher as a node: a missing one
        // is a typo, not a shape.
        let missing = groups
            .into_iter()
            .flatten()
            .filter(|(_, rjob)| rjob.is_none());
        errors.extend(missing.map(|(name, _)| {
            FieldError::invalid(
                annotation_field(WORKER_GROUPS_ANNOTATION),
                BadValue::Str(text.to_string()),
                format!(
                    "must name replicatedJobs of this JobSet: there is no replicatedJob {}",
                    go_quote(name)
                ),
            )
        }));
        return errors;
    }
    let run_launcher_as_node =
        annotation(&jobset.metadata, RUN_LAUNCHER_AS_NODE_ANNOTATION) == Some("true");
    let node = groups.into_iter().flatten().find_map(|(_, rjob)| *rjob);
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

/// The wired container exists in the launcher's and every worker group's pod templates.
fn container_errors<'j>(
    jobset: &JobSet,
    rjobs: impl IntoIterator<Item = Found<'j>>,
) -> Vec<FieldError> {
    let wired = WiredContainer::for_jobset(container(&jobset.metadata));
    rjobs
        .into_iter()
        .flatten()
        .filter(|(_, rjob)| wired.container_in(rjob).is_none())
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

/// Decision 19: the pods' host names are within what the implementation lives with, on
/// `metadata.name` (the only part of them a user chooses freely). For CREATE only: the name
/// cannot change afterwards, and an UPDATE of a JobSet made before the rule (a label, Kueue's
/// `suspend`) must stay possible.
pub fn host_name_error(plan: &MpiPlan) -> Option<FieldError> {
    let detail = host_name_too_long(plan)?;
    Some(FieldError::invalid(
        "metadata.name",
        BadValue::Str(plan.jobset_name.clone()),
        detail,
    ))
}

/// Decision 8: the hostfile fits a ConfigMap; reported on the pod count of `rjob` (the first
/// worker group's, or the launcher's when there is none).
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
    let (c, _) = plan.wired_container.container_in(launcher)?;
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

/// Whether the launcher's `dependsOn` has every group of `groups` with `status: Ready`.
fn waits_for_ready_groups(launcher: &ReplicatedJob, groups: &[String]) -> bool {
    groups.iter().all(|group| {
        launcher
            .depends_on
            .iter()
            .flatten()
            .any(|d| &d.name == group && d.status == "Ready")
    })
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
