//! The validating routes: TrainJob against its runtime, the runtimes themselves, and JobSet-mode
//! JobSets.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::admission::Operation;
use serde::Deserialize;
use serde_json::Value;

use crate::api::{JobSet, RuntimeKind, TRAINER_GROUP, TrainJob, TrainingRuntime};
use crate::field_error::{BadValue, FieldError, aggregate};
use crate::mpi::hostfile::host_name_warning;
use crate::mpi::jobset_mode::{self, Mode};
use crate::mpi::jobset_rules;
use crate::mpi::objects_for::{Problem, Resolved};
use crate::mpi::plan::{MpiPlan, Options};
use crate::mpi::validate::{trainer_support_warning, validate_runtime, validate_train_job};
use crate::objects::{ObjectSource, Unresolved, runtime_of};
use crate::raw_json::RawJson;

use super::read::{self, Request};
use super::{InternalError, Verdict};

/// Label value marking a deprecated ClusterTrainingRuntime.
const SUPPORT_LABEL: &str = "trainer.kubeflow.org/support";
const DEPRECATION_POLICY_URL: &str = "https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy";

/// Upstream's "runtime missing" error, quirks kept (Decision 11): field `spec.RuntimeRef` for
/// ClusterTrainingRuntime, the API server's NotFound text, the camel-cased kind.
fn runtime_not_found(kind: RuntimeKind, name: &str, raw: &RawJson<'_>) -> FieldError {
    let (field, noun) = match kind {
        RuntimeKind::TrainingRuntime => ("spec.runtimeRef", "trainingRuntime"),
        RuntimeKind::ClusterTrainingRuntime => ("spec.RuntimeRef", "clusterTrainingRuntime"),
    };
    FieldError::invalid(
        field,
        BadValue::Json(raw.at("/spec/runtimeRef")),
        format!(
            "{}.{TRAINER_GROUP} \"{name}\" not found: specified {noun} must be created before the TrainJob is created",
            kind.resource()
        ),
    )
}

fn deprecation_warning(kind: RuntimeKind, runtime: &TrainingRuntime) -> Option<String> {
    let deprecated = runtime
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SUPPORT_LABEL))
        .is_some_and(|v| v == "deprecated");
    (kind == RuntimeKind::ClusterTrainingRuntime && deprecated).then(|| {
        format!(
            "Referenced ClusterTrainingRuntime \"{}\" is deprecated and will be removed in a future release of Kubeflow Trainer. See runtime deprecation policy: {DEPRECATION_POLICY_URL}",
            runtime.name()
        )
    })
}

/// `/validate-trainer-kubeflow-org-v1alpha1-trainjob`.
pub(super) async fn train_job<S: ObjectSource>(
    req: &Request,
    object: &Value,
    objects: &S,
) -> Verdict {
    let train_job: TrainJob = match read::object(object) {
        Ok(t) => t,
        Err(e) => return Verdict::deny(format!("TrainJob cannot be read: {e}")),
    };
    let namespace = req
        .request
        .namespace
        .as_deref()
        .unwrap_or_else(|| train_job.namespace());
    let raw = RawJson::from(object);
    let Resolved { kind, runtime } = match runtime_of(objects, &train_job, namespace).await {
        Ok(resolved) => resolved,
        Err(Unresolved::Problem(Problem::RuntimeNotFound { kind, name })) => {
            return Verdict::deny(
                aggregate(&[runtime_not_found(kind, &name, &raw)]).unwrap_or_default(),
            );
        }
        Err(Unresolved::Problem(problem)) => return Verdict::deny(problem.to_string()),
        Err(Unresolved::Lookup(error)) => return Verdict::Internal(InternalError::Lookup(error)),
    };
    let errors = validate_train_job(&train_job, &raw, &runtime, kind);
    // Decision 19: Trainer names the JobSet and its pods after the TrainJob; warned of before
    // anything is made (Trainer's values stay Trainer's, so never a denial).
    let host_names = MpiPlan::new(&train_job, &runtime)
        .ok()
        .flatten()
        .and_then(|plan| host_name_warning(&plan));
    Verdict::from_checks(
        aggregate(&errors),
        deprecation_warning(kind, &runtime)
            .into_iter()
            .chain(trainer_support_warning(&runtime))
            .chain(host_names)
            .collect(),
    )
}

/// `/validate-trainer-kubeflow-org-v1alpha1-{cluster,}trainingruntime`.
pub(super) fn runtime(req: &Request, object: &Value, kind: RuntimeKind) -> Verdict {
    let runtime: TrainingRuntime = match read::object(object) {
        Ok(r) => r,
        Err(e) => return Verdict::deny(format!("{} cannot be read: {e}", kind.as_str())),
    };
    let errors = validate_runtime(
        &runtime,
        &RawJson::from(object),
        kind,
        req.request.operation == Operation::Update,
    );
    Verdict::from_checks(
        aggregate(&errors),
        trainer_support_warning(&runtime).into_iter().collect(),
    )
}

/// A JobSet as JobSet mode's rules read it (both JobSet routes), or the denial naming the field
/// that cannot be read.
pub(super) fn read_jobset(object: &Value) -> Result<JobSet, Verdict> {
    read::object(object).map_err(|e| Verdict::deny(format!("JobSet cannot be read: {e}")))
}

/// Of the old object, only what JobSet validation compares.
#[derive(Deserialize)]
struct OldMetadata {
    #[serde(default)]
    metadata: ObjectMeta,
}

/// `/validate-jobset-x-k8s-io-v1alpha2-jobset`: JobSet mode's rules on CREATE and UPDATE, the
/// label and annotations fixed after creation, and no label on a JobSet a TrainJob owns.
pub(super) fn jobset(req: &Request, object: &Value, options: &Options) -> Verdict {
    let jobset = match read_jobset(object) {
        Ok(jobset) => jobset,
        Err(verdict) => return verdict,
    };
    let mut errors = Vec::new();
    if req.request.operation == Operation::Update {
        let Some(old) = &req.old_object else {
            return Verdict::deny("request.oldObject is missing from this JobSet UPDATE review");
        };
        match read::object::<OldMetadata>(old) {
            Ok(old) => errors.extend(jobset_mode::immutable_errors(
                &old.metadata,
                &jobset.metadata,
            )),
            Err(e) => return Verdict::deny(format!("the old JobSet cannot be read: {e}")),
        }
    }
    let mut warnings = Vec::new();
    match jobset_mode::mode(&jobset.metadata) {
        Mode::TrainJob(_) => errors.extend(jobset_mode::label_on_train_job_error(&jobset.metadata)),
        Mode::JobSet => {
            let checked = jobset_rules::check(&jobset, &RawJson::from(object), options);
            errors.extend(checked.errors);
            if req.request.operation == Operation::Create {
                errors.extend(
                    checked
                        .plan
                        .as_ref()
                        .and_then(jobset_rules::host_name_error),
                );
            }
            warnings = checked.warnings;
        }
        Mode::Plain => {}
    }
    Verdict::from_checks(aggregate(&errors), warnings)
}
