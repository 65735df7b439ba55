//! The mutating route: a JobSet owned by a TrainJob gets the MPI wiring of its runtime.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;
use serde_json::Value;

use crate::api::TRAINER_GROUP;
use crate::mpi::enforce::enforce_mpi_policy;
use crate::mpi::plan::{MpiPlan, PlanError};
use crate::mpi::validate::unsupported_implementation_detail;
use crate::objects::ObjectSource;
use crate::objects::dir::from_value;

use super::Verdict;
use super::validate::runtime_kind;

/// `/mutate-jobset-x-k8s-io-v1alpha2-jobset` on CREATE.
pub(super) async fn jobset<S: ObjectSource>(
    req: &AdmissionRequest<DynamicObject>,
    object: &Value,
    objects: &S,
) -> Verdict {
    let metadata: ObjectMeta = match object.get("metadata").map(from_value).transpose() {
        Ok(m) => m.unwrap_or_default(),
        Err(e) => return Verdict::deny(format!("JobSet cannot be read: metadata.{e}")),
    };
    // TrainJob mode: the controller ownerReference is a trainer.kubeflow.org TrainJob.
    let Some(owner) = metadata.owner_references.iter().flatten().find(|r| {
        r.controller == Some(true)
            && r.kind == "TrainJob"
            && r.api_version.split('/').next() == Some(TRAINER_GROUP)
    }) else {
        return Verdict::allow();
    };
    let namespace = req
        .namespace
        .as_deref()
        .or(metadata.namespace.as_deref())
        .unwrap_or_default();
    let train_job_ref = format!("TrainJob \"{namespace}/{}\"", owner.name);
    let train_job = match objects.train_job(namespace, &owner.name).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Verdict::deny(format!(
                "{train_job_ref}, the controller owner of this JobSet, was not found; retry once it exists"
            ));
        }
        Err(e) => return Verdict::internal(format!("looking up {train_job_ref}: {e}")),
    };
    if train_job.uid() != owner.uid {
        return Verdict::deny(format!(
            "{train_job_ref} has uid {:?}, but this JobSet's controller ownerReference names uid {:?}",
            train_job.uid(),
            owner.uid
        ));
    }
    let kind = match runtime_kind(&train_job) {
        Ok(kind) => kind,
        Err(message) => return Verdict::deny(format!("{train_job_ref}: {message}")),
    };
    let runtime_name = &train_job.spec.runtime_ref.name;
    let runtime = match objects.runtime(kind, namespace, runtime_name).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return Verdict::deny(format!(
                "{train_job_ref} refers to {} {runtime_name:?}, which was not found",
                kind.as_str()
            ));
        }
        Err(e) => {
            return Verdict::internal(format!("looking up {} {runtime_name}: {e}", kind.as_str()));
        }
    };
    let plan = match MpiPlan::new(&train_job, &runtime) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Verdict::allow(),
        Err(PlanError::UnsupportedImplementation(value)) => {
            return Verdict::deny(format!(
                "{train_job_ref}: {}",
                unsupported_implementation_detail(kind, runtime_name, &value)
            ));
        }
    };
    match enforce_mpi_policy(&plan, object) {
        Ok(patch) => Verdict {
            patch,
            ..Verdict::default()
        },
        Err(e) => Verdict::deny(format!("JobSet cannot be patched: {e}")),
    }
}
