//! The validating routes: TrainJob against its runtime, the runtimes themselves, and JobSet-mode
//! JobSets.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use serde::Deserialize;

use crate::api::{JobSet, RuntimeKind, TRAINER_GROUP, TrainJob, TrainingRuntime};
use crate::field_error::{BadValue, FieldError, aggregate};
use crate::mpi::jobset_mode::{self, Mode};
use crate::mpi::validate::{trainer_support_warning, validate_runtime, validate_train_job};
use crate::objects::ObjectSource;
use crate::raw_json::RawJson;

use super::{Object, Verdict};

/// Label value marking a deprecated ClusterTrainingRuntime.
const SUPPORT_LABEL: &str = "trainer.kubeflow.org/support";
const DEPRECATION_POLICY_URL: &str = "https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy";

/// The runtime kind a TrainJob refers to, or upstream's `unsupported runtime: <Kind>.<group>`.
///
/// # Errors
/// The message for a runtimeRef that names neither runtime kind.
pub fn runtime_kind(train_job: &TrainJob) -> Result<RuntimeKind, String> {
    let runtime_ref = &train_job.spec.runtime_ref;
    match (runtime_ref.api_group(), runtime_ref.kind()) {
        (TRAINER_GROUP, "TrainingRuntime") => Ok(RuntimeKind::TrainingRuntime),
        (TRAINER_GROUP, "ClusterTrainingRuntime") => Ok(RuntimeKind::ClusterTrainingRuntime),
        _ => Err(format!("unsupported runtime: {}", runtime_ref.group_kind())),
    }
}

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
    req: &AdmissionRequest<DynamicObject>,
    object: &Object<'_>,
    objects: &S,
) -> Verdict {
    let train_job: TrainJob = match object.read() {
        Ok(t) => t,
        Err(e) => return Verdict::deny(format!("TrainJob cannot be read: {e}")),
    };
    let kind = match runtime_kind(&train_job) {
        Ok(kind) => kind,
        Err(message) => return Verdict::deny(message),
    };
    let namespace = req
        .namespace
        .as_deref()
        .unwrap_or_else(|| train_job.namespace());
    let name = &train_job.spec.runtime_ref.name;
    let raw = object.raw_json();
    let runtime = match objects.runtime(kind, namespace, name).await {
        Ok(Some(runtime)) => runtime,
        Ok(None) => {
            return Verdict::deny(
                aggregate(&[runtime_not_found(kind, name, &raw)]).unwrap_or_default(),
            );
        }
        Err(e) => {
            return Verdict::internal(format!(
                "looking up {} {namespace}/{name}: {e}",
                kind.as_str()
            ));
        }
    };
    let errors = validate_train_job(&train_job, &raw, &runtime, kind);
    Verdict {
        denial: aggregate(&errors),
        warnings: deprecation_warning(kind, &runtime)
            .into_iter()
            .chain(trainer_support_warning(&runtime))
            .collect(),
        ..Verdict::default()
    }
}

/// `/validate-trainer-kubeflow-org-v1alpha1-{cluster,}trainingruntime`.
pub(super) fn runtime(
    req: &AdmissionRequest<DynamicObject>,
    object: &Object<'_>,
    kind: RuntimeKind,
) -> Verdict {
    let runtime: TrainingRuntime = match object.read() {
        Ok(r) => r,
        Err(e) => return Verdict::deny(format!("{} cannot be read: {e}", kind.as_str())),
    };
    let errors = validate_runtime(
        &runtime,
        &object.raw_json(),
        kind,
        req.operation == Operation::Update,
    );
    Verdict {
        denial: aggregate(&errors),
        warnings: trainer_support_warning(&runtime).into_iter().collect(),
        ..Verdict::default()
    }
}

/// Of the old object, only what JobSet validation compares.
#[derive(Deserialize)]
struct OldMetadata {
    #[serde(default)]
    metadata: ObjectMeta,
}

/// `/validate-jobset-x-k8s-io-v1alpha2-jobset`: JobSet mode's rules on CREATE and UPDATE, the
/// label and annotations fixed after creation, and no label on a JobSet a TrainJob owns.
pub(super) fn jobset(
    req: &AdmissionRequest<DynamicObject>,
    object: &Object<'_>,
    old_object: Option<&Object<'_>>,
) -> Verdict {
    let jobset: JobSet = match object.read() {
        Ok(j) => j,
        Err(e) => return Verdict::deny(format!("JobSet cannot be read: {e}")),
    };
    let mut errors = Vec::new();
    if req.operation == Operation::Update {
        let Some(old) = old_object else {
            return Verdict::deny("request.oldObject is missing from this JobSet UPDATE review");
        };
        match old.read::<OldMetadata>() {
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
            let checked = jobset_mode::check(&jobset, &object.raw_json());
            errors.extend(checked.errors);
            warnings = checked.warnings;
        }
        Mode::Plain => {}
    }
    Verdict {
        denial: aggregate(&errors),
        warnings,
        ..Verdict::default()
    }
}
