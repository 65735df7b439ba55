//! JobSet mode's admission rules: what a JobSet-mode JobSet must look like on CREATE and the
//! warnings it gets. Built on [`super::jobset_mode`]'s settings, read once ([`Read`]), and on the
//! plan, the hostfile and TrainJob mode's env rule, above them all; the rules never read the
//! label or the annotations themselves.

use serde_json::{Value, json};

use crate::api::jobset::{JobSet, ReplicatedJob};
use crate::field_error::{BadValue, FieldError, go_quote};
use crate::mpi::hostfile::{check_hostfile_size, host_name_too_long};
use crate::mpi::plan::{MpiPlan, Options, WiredContainer};
use crate::mpi::validate::reserved_env_names_error;
use crate::mpi::{HOSTFILE_PATH, LAUNCHER, NODE, SSH_AUTH_VOLUME};
use crate::raw_json::RawJson;

use super::jobset_mode::settings::*;

fn replicated_job_field(index: usize, rest: &str) -> String {
    format!("spec.replicatedJobs[{index}]{rest}")
}

const CONTAINERS: &str = ".template.spec.template.spec.containers";

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
/// reserved-env error quotes; `options` complete the plan.
pub fn check(jobset: &JobSet, raw: &RawJson<'_>, options: &Options) -> Checked {
    let mut checked = Checked::default();
    let errors = &mut checked.errors;
    let launcher = jobset.replicated_job(LAUNCHER);
    let read = Read::new(&jobset.metadata, |container| {
        if wired_by_image(launcher, raw, container) {
            SshSetup::Image
        } else {
            SshSetup::Generated
        }
    });
    let settings = &read.settings;
    // The worker groups (Decision 20) found in the JobSet, in the groups' order; when the
    // annotation does not parse, `node` stands in for the checks of its pods (the settings
    // report the annotation).
    let groups = &settings.worker_groups;
    let groups_parse = !read.bad(WORKER_GROUPS_ANNOTATION);
    let found: Vec<(&str, Found<'_>)> = groups
        .iter()
        .map(|name| (name.as_str(), jobset.replicated_job(name)))
        .collect();
    let group_jobs: Vec<Found<'_>> = found.iter().map(|(_, rjob)| *rjob).collect();
    errors.extend(read.errors.iter().cloned());
    errors.extend(ssh_auth_mount_path_error(&read));
    if jobset.name().is_empty() {
        errors.push(FieldError::required(
            "metadata.name",
            "JobSet mode names the Secret, the ConfigMap and the host names after the JobSet: set a name (generateName alone is not enough)",
        ));
    }
    errors.extend(network_error(jobset));
    errors.extend(shape_errors(
        settings,
        launcher,
        groups_parse.then_some(&found[..]),
    ));
    errors.extend(container_errors(
        settings,
        std::iter::once(launcher).chain(group_jobs.iter().copied()),
    ));
    if read.errors.is_empty() {
        let plan = MpiPlan::from_settings(jobset, settings.clone(), options);
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
        && !waits_for_ready_groups(rjob, groups)
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
            checked.warnings.push(dependency_warning(i, groups, &after));
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
fn wired_by_image(launcher: Found<'_>, raw: &RawJson<'_>, container: Option<&str>) -> bool {
    let Some((i, rjob)) = launcher else {
        return false;
    };
    let wired = WiredContainer::for_jobset(container);
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

/// `ssh-auth-mount-path` means nothing under `generated`: the key is no longer mounted there
/// (an `ssh-setup` that does not parse says nothing of it).
fn ssh_auth_mount_path_error(read: &Read) -> Option<FieldError> {
    let path = read.settings.ssh_auth_mount_path_annotation.as_deref()?;
    let generated =
        read.settings.ssh_setup == SshSetup::Generated && !read.bad(SSH_SETUP_ANNOTATION);
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
    settings: &Settings,
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
    if let Some(text) = &settings.worker_groups_annotation {
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
    let node = groups.into_iter().flatten().find_map(|(_, rjob)| *rjob);
    if node.is_none() && !settings.run_launcher_as_node {
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
    settings: &Settings,
    rjobs: impl IntoIterator<Item = Found<'j>>,
) -> Vec<FieldError> {
    let wired = WiredContainer::for_jobset(settings.container.as_deref());
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
                    "JobSet mode wires the first container of the launcher's and every worker group's pod template",
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
