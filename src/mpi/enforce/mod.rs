//! The JobSet mutation (section C of docs/behaviour.md: what Trainer's controller puts into the
//! JobSet for MPI, and JobSet mode's defaults): the policy is applied to a `serde_json::Value`
//! copy of the JobSet's spec as the client sent it (nothing else of a JobSet is wired), and the
//! patch is `json_patch::diff` of the two, under `/spec`. The copy is the whole spec, never typed
//! structs, so a field this crate does not model is read as it is and kept: a rule can only
//! change what it writes.
//!
//! The edit is a few named steps, one per level of the JobSet ([`jobset`], [`replicated_job`],
//! [`pod_spec`], [`container`]), each a list of one-line rules on an [`edit::Obj`]:
//! `upsert` into a list (volumes and env by `name`, mounts by `mountPath`: an equal entry stays,
//! a different one is replaced in place, a missing one appended, a missing list or parent object
//! made), `set` for a field the policy owns, `fill` for a default that never replaces what the
//! user wrote. A value of the wrong JSON type where a rule writes is a [`MutationError`].
//!
//! Adding a JobSet-mode default touches up to three files: the value in `items.rs` (built once per
//! JobSet in [`Items`]), one rule in the step of its level here, and the setting it depends on:
//! an annotation read by `Read::new` (`jobset_mode/settings.rs`), or a flag, a field of
//! `plan::Options`; the plan keeps both whole and does not change (docs/development.md "Where a
//! change goes"). An env var of an implementation is a row in `implementation.rs` and the
//! reference's literal in `tests/policy/oracle.rs`. `tests/policy/oracle.rs` states the rules on its own, the golden
//! corpus (`tests/fixtures/golden/`) holds the JobSet every differential case makes, and
//! `tests/policy/enforce.rs` checks that a user's value at every path the policy writes survives
//! where the contract says so.

mod edit;
mod items;

use std::borrow::Cow;

use json_patch::{Patch, PatchOperation};
use serde::Serialize;
use serde_json::Value;

pub use edit::json_type;
use edit::{Obj, names};
use items::{EnvVar, HostfileVolume, Mount, SshAuthVolume};

use super::jobset_mode::ssh_setup::{self, SSH_SETUP_CONTAINER};
use super::plan::MpiPlan;
use super::{LAUNCHER, PREFLIGHT_CONTAINER};

/// The JobSet has a value of the wrong JSON type where the policy must write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: Invalid value: {found}: must be {expected}")]
pub struct MutationError {
    /// Dotted field path, e.g. `spec.replicatedJobs[1].template.spec.template.spec.volumes`.
    pub field: String,
    /// `"string"`, `"number"`, ... as Go names JSON types.
    pub found: &'static str,
    /// `an object` or `an array`.
    pub expected: &'static str,
}

/// JobSet's `startupPolicyOrder` that excludes `dependsOn`.
const IN_ORDER: &str = "InOrder";

/// The operations that give `jobset` the MPI wiring of `plan`: the diff between it and its
/// copy with the wiring. Empty when the JobSet already has it.
///
/// # Errors
/// [`MutationError`] when a location the policy writes holds a value of the wrong JSON type.
pub fn enforce_mpi_policy(plan: &MpiPlan, jobset: &Value) -> Result<Patch, MutationError> {
    // Only the spec is wired: the rest of the JobSet is neither copied nor compared, and the
    // diff of the whole JobSet is the spec's, under `/spec`.
    let Some(spec) = jobset.get("spec").filter(|s| s.is_object()) else {
        return Ok(Patch::default());
    };
    let mut edited = spec.clone();
    wire_spec(plan, &mut edited)?;
    let mut patch = json_patch::diff(spec, &edited);
    for operation in &mut patch.0 {
        under_spec(operation);
    }
    Ok(patch)
}

/// Moves an operation of the spec's diff to the same place in the JobSet (`json_patch::diff`
/// makes only adds, removes and replaces; the others are moved too, `from` included).
fn under_spec(operation: &mut PatchOperation) {
    match operation {
        PatchOperation::Add(o) => o.path.push_front("spec"),
        PatchOperation::Remove(o) => o.path.push_front("spec"),
        PatchOperation::Replace(o) => o.path.push_front("spec"),
        PatchOperation::Test(o) => o.path.push_front("spec"),
        PatchOperation::Move(o) => {
            o.path.push_front("spec");
            o.from.push_front("spec");
        }
        PatchOperation::Copy(o) => {
            o.path.push_front("spec");
            o.from.push_front("spec");
        }
    }
}

/// Gives `jobset` the MPI wiring of `plan`, in place.
///
/// # Errors
/// [`MutationError`] at the first location, in the order of the rules, where a rule must write
/// and a value of the wrong JSON type stands.
pub fn wire(plan: &MpiPlan, jobset: &mut Value) -> Result<(), MutationError> {
    // A JobSet without a spec object has nothing to wire (the validating routes say why).
    let Some(spec) = jobset.get_mut("spec").filter(|s| s.is_object()) else {
        return Ok(());
    };
    wire_spec(plan, spec)
}

/// Gives the JobSet's `spec` object the MPI wiring of `plan`, in place.
fn wire_spec(plan: &MpiPlan, spec: &mut Value) -> Result<(), MutationError> {
    self::jobset(plan, &Items::new(plan), Obj::new(spec, "spec".to_owned())?)
}

/// Which kind of replicatedJob the policy wires.
#[derive(Debug, Clone, Copy)]
enum Role {
    /// `launcher`, with whether JobSet lets it depend on the workers: every worker group is
    /// listed before it and the JobSet has no `startupPolicyOrder: InOrder`.
    Launcher { may_depend_on_node: bool },
    /// A worker group: `node`, or one `mpi-webhook.io/worker-groups` names (Decision 20).
    Node,
}

/// The JobSet's `spec`: the `launcher` and each worker group's replicatedJob.
fn jobset(plan: &MpiPlan, items: &Items, mut spec: Obj<'_>) -> Result<(), MutationError> {
    // JobSet lets a replicatedJob depend only on those listed before it, and on none under
    // `startupPolicyOrder: InOrder` (which already starts the launcher after Ready workers).
    let in_order = spec
        .get("startupPolicy")
        .and_then(|p| p.get("startupPolicyOrder"))
        .and_then(Value::as_str)
        == Some(IN_ORDER);
    // JobSet mode: the JobSet finishes with its launcher (the workers' sshd never completes).
    if let Some(d) = &items.defaults {
        success_policy(&mut spec, &d.success_policy)?;
    }
    let field = spec.at("replicatedJobs");
    let Some(rjobs) = spec.existing_list("replicatedJobs")? else {
        return Ok(());
    };
    // The worker groups listed so far: a dependsOn may name only those (all of them, or the
    // launcher would start before some group's sshd listens).
    let mut before = Vec::new();
    for (i, rjob) in rjobs.iter_mut().enumerate() {
        let name = rjob.get("name").and_then(Value::as_str).unwrap_or_default();
        let role = if name == LAUNCHER {
            let every_group = plan.worker_groups.iter().all(|g| before.contains(&g.name));
            Role::Launcher {
                may_depend_on_node: every_group && !in_order,
            }
        } else if plan.worker_group(name).is_some() {
            before.push(name.to_owned());
            Role::Node
        } else {
            continue;
        };
        // Not an object: not a replicatedJob the policy can recognise, left to JobSet's schema.
        if rjob.is_object() {
            replicated_job(plan, items, role, Obj::new(rjob, format!("{field}[{i}]"))?)?;
        }
    }
    Ok(())
}

/// JobSet mode's `successPolicy` when the JobSet has a `launcher`: `policy` when it has none;
/// when it has `operator: All` with no targets (what JobSet's own defaulting writes, so the two
/// cannot be told apart), the launcher as the one target. Any other policy is the user's.
fn success_policy(spec: &mut Obj<'_>, policy: &Value) -> Result<(), MutationError> {
    let has_launcher = spec
        .get("replicatedJobs")
        .and_then(Value::as_array)
        .is_some_and(|rjobs| names(rjobs, LAUNCHER));
    if !has_launcher {
        return Ok(());
    }
    let Some(current) = spec.get("successPolicy") else {
        spec.set("successPolicy", policy.clone());
        return Ok(());
    };
    let all_of_none = current.get("operator").and_then(Value::as_str) == Some(items::SUCCESS_ALL)
        && current
            .get("targetReplicatedJobs")
            .filter(|t| !t.is_null())
            .is_none_or(|t| t.as_array().is_some_and(Vec::is_empty));
    if let (true, Some(targets)) = (all_of_none, policy.get("targetReplicatedJobs")) {
        spec.path(&["successPolicy"])?
            .set("targetReplicatedJobs", targets.clone());
    }
    Ok(())
}

/// One replicatedJob: the worker count, the launcher's `dependsOn`, then its pod template.
fn replicated_job(
    plan: &MpiPlan,
    items: &Items,
    role: Role,
    mut rjob: Obj<'_>,
) -> Result<(), MutationError> {
    // C.1: the worker count, only when the TrainJob sets numNodes.
    if let (Role::Node, Some(count)) = (role, plan.node_count) {
        let mut spec = rjob.path(&["template", "spec"])?;
        spec.set("parallelism", count.into());
        spec.set("completions", count.into());
    }
    // JobSet mode: a failed launcher or worker fails its Job at once, so the JobSet's
    // failurePolicy acts on a lost worker (Decision 21).
    if let Some(d) = &items.defaults {
        rjob.path(&["template", "spec"])?
            .fill("backoffLimit", &d.backoff_limit);
    }
    // JobSet mode: the launcher waits for the workers' sshd, where JobSet allows it.
    if let (
        Role::Launcher {
            may_depend_on_node: true,
        },
        Some(d),
    ) = (role, &items.defaults)
    {
        rjob.fill("dependsOn", &d.depends_on);
    }
    pod_spec(
        plan,
        items,
        role,
        rjob.path(&["template", "spec", "template", "spec"])?,
    )
}

/// A pod template's spec: the volumes, the launcher's pre-flight, then each wired container.
fn pod_spec(
    plan: &MpiPlan,
    items: &Items,
    role: Role,
    mut pod: Obj<'_>,
) -> Result<(), MutationError> {
    let is_launcher = matches!(role, Role::Launcher { .. });
    // C.3: volumes, by name.
    pod.upsert("volumes", "name", &items.ssh_volume)?;
    if is_launcher {
        pod.upsert("volumes", "name", &items.hostfile_volume)?;
    }
    if let Some(g) = &items.generated {
        ssh_setup_step(plan, g, &mut pod)?;
    }
    // JobSet mode: the pre-flight runs first in the launcher pod (after the ssh setup, whose
    // files it does not need), unless the user has one, or a container of that name (a pod's
    // container names are unique across both lists).
    let preflight = items.defaults.as_ref().and_then(|d| d.preflight.as_ref());
    if let (true, Some(preflight)) = (is_launcher, preflight) {
        let after = items.generated.as_ref().map(|_| SSH_SETUP_CONTAINER);
        insert_init(&mut pod, PREFLIGHT_CONTAINER, || preflight.clone(), after)?;
    }
    // C.4 and C.5: on the wired containers only (in TrainJob mode those named `node`).
    let field = pod.at("containers");
    let Some(containers) = pod.existing_list("containers")? else {
        return Ok(());
    };
    for (c, entry) in containers.iter_mut().enumerate() {
        let name = entry.get("name").and_then(Value::as_str);
        if plan.wired_container.wires(c, name) {
            container(items, role, Obj::new(entry, format!("{field}[{c}]"))?)?;
        }
    }
    Ok(())
}

/// `generated`: the emptyDir in the pod, and the ssh setup first among its init containers, in
/// the wired container's image and as its user.
fn ssh_setup_step(plan: &MpiPlan, g: &Generated, pod: &mut Obj<'_>) -> Result<(), MutationError> {
    pod.upsert("volumes", "name", &g.runtime_volume)?;
    let wired = pod
        .get("containers")
        .and_then(Value::as_array)
        .and_then(|list| {
            list.iter()
                .enumerate()
                .find(|(c, entry)| {
                    plan.wired_container
                        .wires(*c, entry.get("name").and_then(Value::as_str))
                })
                .map(|(_, entry)| g.init_container.for_wired(entry))
        });
    match wired {
        Some(setup) => insert_init(pod, SSH_SETUP_CONTAINER, || setup, None),
        None => Ok(()),
    }
}

/// Inserts init container `container()`, named `name`, right after the one named `after` when
/// the pod has it, else first; nothing when the pod has a container or an init container of
/// that name already.
fn insert_init(
    pod: &mut Obj<'_>,
    name: &str,
    container: impl FnOnce() -> Value,
    after: Option<&str>,
) -> Result<(), MutationError> {
    let taken = pod
        .get("containers")
        .and_then(Value::as_array)
        .is_some_and(|c| names(c, name));
    if taken {
        return Ok(());
    }
    let init = pod.list("initContainers")?;
    if !names(init, name) {
        let at = after
            .and_then(|after| {
                init.iter()
                    .position(|c| c.get("name").and_then(Value::as_str) == Some(after))
            })
            .map_or(0, |p| p + 1);
        init.insert(at, container());
    }
    Ok(())
}

/// A wired container: mounts by mountPath, the launcher's env by name, JobSet mode's sshd.
fn container(items: &Items, role: Role, mut container: Obj<'_>) -> Result<(), MutationError> {
    match &items.generated {
        // `generated`: the setup's emptyDir and `/etc/passwd` from it, never the Secret.
        Some(g) => {
            for mount in &g.mounts {
                container.upsert("volumeMounts", "mountPath", mount)?;
            }
        }
        None => container.upsert("volumeMounts", "mountPath", &items.ssh_mount)?,
    }
    if let Role::Launcher { .. } = role {
        container.upsert("volumeMounts", "mountPath", &items.hostfile_mount)?;
        for var in &items.env {
            container.upsert("env", "name", var)?;
        }
        // JobSet mode: the launcher's last words survive in its status, and a launcher that is
        // not a worker sees no GPU of its node (unless it asks for GPUs of its own, which the
        // empty values would hide too).
        if let Some(d) = &items.defaults {
            container.fill("terminationMessagePolicy", &d.launcher_message_policy);
            if !requests_gpus(&container) {
                for var in d.hide_gpus_env.iter().flatten() {
                    container.add_missing("env", "name", var)?;
                }
            }
        }
    }
    // JobSet mode: the workers run sshd (under a script whose every end is a failure), unless
    // they run something of their own, and are ready once it listens.
    if let (Role::Node, Some(d)) = (role, &items.defaults) {
        if container.get("command").is_none() && container.get("args").is_none() {
            container.set("command", d.sshd_command.clone());
        }
        container.fill("readinessProbe", &d.readiness_probe);
    }
    Ok(())
}

/// Whether `container` requests or limits a GPU: a resource whose name contains `gpu`
/// (Decision 3's test), whatever the quantity. Its device plugin sets `NVIDIA_VISIBLE_DEVICES`,
/// which an empty value in the container's env would override.
fn requests_gpus(container: &Obj<'_>) -> bool {
    let names_gpu = |list: Option<&Value>| {
        list.and_then(Value::as_object)
            .is_some_and(|m| m.keys().any(|k| k.to_lowercase().contains("gpu")))
    };
    let resources = container.get("resources");
    names_gpu(resources.and_then(|r| r.get("requests")))
        || names_gpu(resources.and_then(|r| r.get("limits")))
}

/// The entries the policy writes, built once per JobSet.
struct Items {
    ssh_volume: Value,
    hostfile_volume: Value,
    ssh_mount: Value,
    hostfile_mount: Value,
    env: Vec<Value>,
    /// JobSet mode only: what it fills in where the user left it unset.
    defaults: Option<Defaults>,
    /// JobSet mode's `generated` ssh setup.
    generated: Option<Generated>,
}

/// What `generated` writes besides the init container (made per pod, from its wired container).
struct Generated {
    runtime_volume: Value,
    /// The wired containers' mounts, in place of the Secret's.
    mounts: [Value; 2],
    /// What the init container has in every pod.
    init_container: Cow<'static, ssh_setup::InitContainer>,
}

struct Defaults {
    sshd_command: Value,
    readiness_probe: Value,
    depends_on: Value,
    success_policy: Value,
    /// The launcher's and the worker groups' Job `backoffLimit` when they have none.
    backoff_limit: Value,
    /// The pre-flight init container, when the plan has an image for it.
    preflight: Option<Value>,
    /// The launcher container's `terminationMessagePolicy` when it has none.
    launcher_message_policy: Value,
    /// The launcher's GPU-hiding env, unless it runs as a node.
    hide_gpus_env: Option<[Value; 2]>,
}

/// `entry` as JSON: structs of strings and integers, which always serialize.
fn to_json(entry: &impl Serialize) -> Value {
    serde_json::to_value(entry).unwrap_or_default()
}

impl Items {
    fn new(plan: &MpiPlan) -> Self {
        let port = plan.ssh_port();
        let generated = plan.generated_ssh();
        Self {
            ssh_volume: if generated {
                ssh_setup::secret_volume(&plan.jobset_name)
            } else {
                to_json(&SshAuthVolume::new(plan))
            },
            hostfile_volume: to_json(&HostfileVolume::new(&plan.jobset_name)),
            ssh_mount: to_json(&Mount::ssh_auth(plan)),
            hostfile_mount: to_json(&Mount::hostfile()),
            env: plan
                .launcher_env()
                .map(|(name, value)| to_json(&EnvVar { name, value }))
                .collect(),
            defaults: plan.jobset_defaults.as_ref().map(|d| Defaults {
                sshd_command: if generated {
                    ssh_setup::sshd_command()
                } else {
                    items::sshd_command(port)
                },
                readiness_probe: items::sshd_readiness_probe(port),
                depends_on: items::depends_on_ready_groups(
                    plan.worker_groups.iter().map(|g| g.name.as_str()),
                ),
                success_policy: items::success_policy_launcher(),
                backoff_limit: items::backoff_limit(),
                preflight: plan.preflight_image().map(|image| {
                    let timeout = d.settings.preflight_timeout.as_deref();
                    items::preflight_container(image, port, timeout)
                }),
                launcher_message_policy: items::launcher_termination_message_policy(),
                hide_gpus_env: (!plan.run_launcher_as_node).then(items::hide_gpus_env),
            }),
            generated: generated.then(|| Generated {
                runtime_volume: ssh_setup::runtime_volume(),
                mounts: ssh_setup::container_mounts(),
                init_container: ssh_setup::InitContainer::for_port(port),
            }),
        }
    }
}
