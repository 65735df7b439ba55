//! Admission rules (spec section B and Decisions 4, 6, 7, 8, 10): the TrainJob checked against
//! its runtime, and the runtimes themselves. Every message is byte for byte the upstream text.

use crate::api::{RuntimeKind, TrainJob, TrainingRuntime};
use crate::field_error::{BadValue, FieldError, go_quote};
use crate::raw_json::RawJson;

use super::hostfile::check_hostfile_size;
use super::implementation::{self, Implementation};
use super::plan::MpiPlan;
use super::{ANCESTOR_LABEL, ANCESTOR_TRAINER, LAUNCHER, NODE};

const RUN_LAUNCHER_AS_NODE_DETAIL: &str = "must have 1 when MPI trainingRuntime with enabled runLauncherAsNode does not have either launcher and node";

/// The admission warning for a runtime whose MPI implementation stock Kubeflow Trainer's
/// controller builds no JobSet for (Decision 16), the same text on the runtime routes and the
/// TrainJob route. `None` for Open MPI, a runtime without MPI, and an unsupported value (which is
/// denied instead).
pub fn trainer_support_warning(runtime: &TrainingRuntime) -> Option<String> {
    let name = runtime.mpi()?.mpi_implementation();
    let implementation = implementation::lookup(name)?;
    (!implementation.built_by_trainer).then(|| {
        format!(
            "spec.mlPolicy.mpi.mpiImplementation {}: Kubeflow Trainer's controller (through 8c0f5059) builds no JobSet for it, so a TrainJob on this runtime never starts; for {name}, use mpi-webhook's JobSet mode instead: a plain JobSet labelled mpi-webhook.io/implementation: {name} (README \"JobSet mode\")",
            go_quote(name)
        )
    })
}

/// Validates an MPI TrainJob against its runtime. `raw` is the TrainJob as the client sent it.
/// Returns no errors when the runtime has no MPI policy (MPI never warns).
pub fn validate_train_job(
    train_job: &TrainJob,
    raw: &RawJson<'_>,
    runtime: &TrainingRuntime,
    kind: RuntimeKind,
) -> Vec<FieldError> {
    let Some(mpi) = runtime.mpi() else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    let trainer = train_job.spec.trainer.as_ref();
    let num_nodes = trainer.and_then(|t| t.num_nodes);

    // B.1: runLauncherAsNode needs both a launcher and a node replicatedJob.
    if trainer.is_some() && num_nodes.unwrap_or(1) >= 2 && mpi.run_launcher_as_node() {
        let has = |name: &str| {
            runtime
                .spec
                .template
                .spec
                .replicated_jobs
                .iter()
                .any(|r| r.name == name)
        };
        if !has(LAUNCHER) || !has(NODE) {
            errors.push(FieldError::invalid(
                "spec.trainer.numNodes",
                BadValue::Int(i64::from(num_nodes.unwrap_or(1))),
                RUN_LAUNCHER_AS_NODE_DETAIL,
            ));
        }
    }

    let plan = match MpiPlan::new(train_job, runtime) {
        Ok(plan) => plan,
        Err(problem) => {
            errors.push(FieldError::invalid(
                "spec.runtimeRef",
                BadValue::Json(raw.at("/spec/runtimeRef")),
                problem.detail(kind, runtime.name()),
            ));
            return errors;
        }
    };
    let Some(plan) = plan else {
        return errors;
    };

    // B.2: env names the implementation injects are reserved (Decision 6).
    if trainer.is_some() {
        errors.extend(reserved_env_error(train_job, raw, plan.implementation));
    }

    // Decision 8: bounds upstream lacks.
    match num_nodes {
        Some(n) if n < 0 => errors.push(FieldError::invalid(
            "spec.trainer.numNodes",
            BadValue::Int(i64::from(n)),
            "must be greater than or equal to 0",
        )),
        _ => {
            if let Err(too_large) = check_hostfile_size(&plan) {
                errors.push(FieldError::invalid(
                    "spec.trainer.numNodes",
                    BadValue::Int(i64::from(num_nodes.unwrap_or(1))),
                    too_large.to_string(),
                ));
            }
        }
    }
    errors
}

fn reserved_env_error(
    train_job: &TrainJob,
    raw: &RawJson<'_>,
    implementation: &Implementation,
) -> Option<FieldError> {
    let env = train_job.spec.trainer.as_ref()?.env.as_ref()?;
    reserved_env_names_error(
        "spec.trainer.env".to_string(),
        || raw.at("/spec/trainer/env"),
        env.iter().map(|e| e.name.as_str()),
        implementation,
    )
}

/// The section-B reserved-env error (Decision 6) for the env list at `field` whose entries are
/// named `names`, or `None` when no name is reserved. `env_json` gives the list as the client
/// sent it (Decision 9), asked for only when there is an error.
pub fn reserved_env_names_error<'n>(
    field: String,
    env_json: impl FnOnce() -> serde_json::Value,
    names: impl IntoIterator<Item = &'n str>,
    implementation: &Implementation,
) -> Option<FieldError> {
    let mut reserved: Vec<&str> = names
        .into_iter()
        .filter(|name| implementation.reserves(name))
        .collect();
    if reserved.is_empty() {
        return None;
    }
    reserved.sort_unstable();
    reserved.dedup();
    Some(FieldError::invalid(
        field,
        BadValue::Json(env_json()),
        format!(
            "must not have reserved envs, invalid envs configured: [{}]",
            reserved.join(" ")
        ),
    ))
}

/// Validates a TrainingRuntime or ClusterTrainingRuntime: upstream's runtime webhook rules (the
/// ancestor rules, skipped on a TrainingRuntime UPDATE as upstream does) and the CRD-level MPI
/// rules repeated for clusters with older CRDs (Decisions 4, 7, 10).
pub fn validate_runtime(
    runtime: &TrainingRuntime,
    raw: &RawJson<'_>,
    kind: RuntimeKind,
    is_update: bool,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if !(is_update && kind == RuntimeKind::TrainingRuntime) {
        errors.extend(ancestor_errors(runtime, raw));
    }
    let Some(ml_policy) = runtime.spec.ml_policy.as_ref() else {
        return errors;
    };
    if ml_policy.sources_set() > 1 {
        errors.push(FieldError::invalid(
            "spec.mlPolicy",
            BadValue::Str("object".into()),
            "Only one of the policy can be configured",
        ));
    }
    if let Some(mpi) = ml_policy.mpi.as_ref() {
        if mpi.num_proc_per_node() < 1 {
            errors.push(FieldError::invalid(
                "spec.mlPolicy.mpi.numProcPerNode",
                BadValue::Int(i64::from(mpi.num_proc_per_node())),
                "NumProcPerNode in mpiPolicy must be >= 1",
            ));
        }
        if super::mounts_over_hostfile(mpi.ssh_auth_mount_path()) {
            errors.push(FieldError::invalid(
                "spec.mlPolicy.mpi.sshAuthMountPath",
                BadValue::Str(mpi.ssh_auth_mount_path().to_string()),
                super::SSH_MOUNT_ON_HOSTFILE_DETAIL,
            ));
        }
        if implementation::lookup(mpi.mpi_implementation()).is_none() {
            errors.push(FieldError::unsupported(
                "spec.mlPolicy.mpi.mpiImplementation",
                BadValue::Str(mpi.mpi_implementation().to_string()),
                &implementation::supported_names(),
            ));
        }
    }
    errors
}

/// The container a replicatedJob labelled with an ancestor must have.
fn required_container(ancestor: &str) -> Option<&'static str> {
    match ancestor {
        ANCESTOR_TRAINER => Some(NODE),
        "model-initializer" => Some("model-initializer"),
        "dataset-initializer" => Some("dataset-initializer"),
        _ => None,
    }
}

fn ancestor_errors(runtime: &TrainingRuntime, raw: &RawJson<'_>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (i, rjob) in runtime
        .spec
        .template
        .spec
        .replicated_jobs
        .iter()
        .enumerate()
    {
        let Some(ancestor) = rjob.label(ANCESTOR_LABEL) else {
            continue;
        };
        let Some(container) = required_container(ancestor) else {
            continue;
        };
        let path = format!("spec.template.spec.replicatedJobs[{i}]");
        if rjob.replicas() != 1 {
            errors.push(FieldError::invalid(
                format!("{path}.replicas"),
                BadValue::Int(i64::from(rjob.replicas())),
                "always must be 1",
            ));
        }
        if !rjob.containers().iter().any(|c| c.name == container) {
            errors.push(FieldError::invalid(
                format!("{path}.template.spec.template.spec.containers"),
                BadValue::Json(raw.at(&format!(
                    "/spec/template/spec/replicatedJobs/{i}/template/spec/template/spec/containers"
                ))),
                format!("must contain the required container for the ancestor: {ancestor}"),
            ));
        }
    }
    errors
}
