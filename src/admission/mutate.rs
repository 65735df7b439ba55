//! The mutating route: a JobSet owned by a TrainJob gets the MPI wiring of its runtime (TrainJob
//! mode); a JobSet labelled `mpi-webhook.io/implementation` gets the wiring its label and
//! annotations ask for (JobSet mode).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;
use serde_json::Value;

use crate::api::JobSet;
use crate::field_error::aggregate;
use crate::mpi::enforce::{PatchJson, enforce_fresh, enforce_mpi_policy};
use crate::mpi::jobset_mode::{self, Mode};
use crate::mpi::plan::{MpiPlan, PlanError};
use crate::objects::ObjectSource;
use crate::objects::dir::from_value;

use super::validate::runtime_kind;
use super::{Object, Verdict, projection};

/// `/mutate-jobset-x-k8s-io-v1alpha2-jobset` on CREATE. `None` when the JobSet was read as a
/// view and is not fresh, or is in JobSet mode (whose rules read more than the view holds): the
/// review is then read again by the general path.
pub(super) async fn jobset<S: ObjectSource>(
    req: &AdmissionRequest<DynamicObject>,
    object: &Object<'_>,
    objects: &S,
) -> Option<Verdict> {
    let jobset = match object {
        Object::JobSet(view) => {
            if jobset_mode::mode(&view.metadata) == Mode::JobSet {
                return None;
            }
            let plan = match plan(req, &view.metadata, objects).await {
                Ok(Some(plan)) => plan,
                Ok(None) => return Some(Verdict::allow()),
                Err(verdict) => return Some(verdict),
            };
            let patch = enforce_fresh(&plan, view)?;
            return Some(Verdict {
                patch: Some(patch),
                ..Verdict::default()
            });
        }
        Object::Parsed(value) => Cow::Borrowed(value),
        // Raw JSON always parses; were it not to, the JobSet would read as `null`: no patch.
        Object::Raw(raw) => Cow::Owned(
            projection::from_slice(&projection::JOBSET, raw.get().as_bytes())
                .unwrap_or(Value::Null),
        ),
    };
    let metadata: ObjectMeta = match jobset.get("metadata").map(from_value).transpose() {
        Ok(m) => m.unwrap_or_default(),
        Err(e) => {
            return Some(Verdict::deny(format!(
                "JobSet cannot be read: metadata.{e}"
            )));
        }
    };
    if jobset_mode::mode(&metadata) == Mode::JobSet {
        return Some(jobset_mode_verdict(&jobset));
    }
    Some(match plan(req, &metadata, objects).await {
        Ok(Some(plan)) => enforce(&plan, &jobset),
        Ok(None) => Verdict::allow(),
        Err(verdict) => verdict,
    })
}

/// JobSet mode: a JobSet breaking a rule of the mode is denied here too, with the validating
/// route's message, so that no pod starts half wired whatever the order of the webhooks.
fn jobset_mode_verdict(raw: &Value) -> Verdict {
    let jobset: JobSet = match from_value(raw) {
        Ok(jobset) => jobset,
        Err(e) => return Verdict::deny(format!("JobSet cannot be read: {e}")),
    };
    let checked = jobset_mode::check(&jobset, &raw.into());
    match (aggregate(&checked.errors), checked.plan) {
        (Some(message), _) => Verdict::deny(message),
        (None, Some(plan)) => enforce(&plan, raw),
        // Settings that parse always give a plan; were there none, nothing could be wired.
        (None, None) => Verdict::internal("JobSet mode: no plan and no error"),
    }
}

fn enforce(plan: &MpiPlan, jobset: &Value) -> Verdict {
    let operations = match enforce_mpi_policy(plan, jobset) {
        Ok(operations) => operations,
        Err(e) => return Verdict::deny(format!("JobSet cannot be patched: {e}")),
    };
    match PatchJson::from_operations(&operations) {
        Ok(patch) => Verdict {
            patch: Some(patch),
            ..Verdict::default()
        },
        Err(e) => Verdict::internal(format!("serializing the patch failed: {e}")),
    }
}

/// The MPI plan of the TrainJob that controls the JobSet with `metadata`: `Ok(None)` when no
/// TrainJob controls it or its runtime has no MPI policy, `Err` with the verdict when the
/// TrainJob or its runtime cannot be used.
async fn plan<S: ObjectSource>(
    req: &AdmissionRequest<DynamicObject>,
    metadata: &ObjectMeta,
    objects: &S,
) -> Result<Option<MpiPlan>, Verdict> {
    // TrainJob mode: the controller ownerReference is a trainer.kubeflow.org TrainJob.
    let Mode::TrainJob(owner) = jobset_mode::mode(metadata) else {
        return Ok(None);
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
            return Err(Verdict::deny(format!(
                "{train_job_ref}, the controller owner of this JobSet, was not found; retry once it exists"
            )));
        }
        Err(e) => {
            return Err(Verdict::internal(format!(
                "looking up {train_job_ref}: {e}"
            )));
        }
    };
    if train_job.uid() != owner.uid {
        return Err(Verdict::deny(format!(
            "{train_job_ref} has uid {:?}, but this JobSet's controller ownerReference names uid {:?}",
            train_job.uid(),
            owner.uid
        )));
    }
    let kind = runtime_kind(&train_job)
        .map_err(|message| Verdict::deny(format!("{train_job_ref}: {message}")))?;
    let runtime_name = &train_job.spec.runtime_ref.name;
    let runtime = match objects.runtime(kind, namespace, runtime_name).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return Err(Verdict::deny(format!(
                "{train_job_ref} refers to {} {runtime_name:?}, which was not found",
                kind.as_str()
            )));
        }
        Err(e) => {
            return Err(Verdict::internal(format!(
                "looking up {} {runtime_name}: {e}",
                kind.as_str()
            )));
        }
    };
    MpiPlan::new(&train_job, &runtime).map_err(|problem: PlanError| {
        Verdict::deny(format!(
            "{train_job_ref}: {}",
            problem.detail(kind, runtime_name)
        ))
    })
}
