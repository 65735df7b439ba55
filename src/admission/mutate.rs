//! The mutating route: a JobSet owned by a TrainJob gets the MPI wiring of its runtime (TrainJob
//! mode); a JobSet labelled `mpi-webhook.io/implementation` gets the wiring its label and
//! annotations ask for (JobSet mode).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Deserialize;
use serde_json::Value;

use crate::api::{JobSet, JobSetSpec};

use crate::field_error::aggregate;
use crate::mpi::enforce::enforce_mpi_policy;
use crate::mpi::hostfile::host_name_warning;
use crate::mpi::jobset_mode::{self, Mode};
use crate::mpi::jobset_rules;
use crate::mpi::objects_for::Problem;
use crate::mpi::plan::MpiPlan;
use crate::objects::{ObjectSource, Unresolved, runtime_of};
use crate::raw_json::RawJson;

use super::read::{self, Request};
use super::{InternalError, Options, Verdict};

/// `/mutate-jobset-x-k8s-io-v1alpha2-jobset` on CREATE, for the JobSet `object` of `req`.
pub(super) async fn jobset<S: ObjectSource>(
    req: &Request,
    object: &Value,
    objects: &S,
    options: &Options,
) -> Verdict {
    if !object.is_object() {
        let error = read::not_an_object(read::OBJECT_FIELD, object);
        return Verdict::deny(format!("JobSet cannot be read: {error}"));
    }
    let metadata: ObjectMeta = match object.get("metadata").filter(|m| !m.is_null()) {
        None => ObjectMeta::default(),
        Some(metadata) => match read::member(metadata, "metadata", "metadata.") {
            Ok(metadata) => metadata,
            Err(e) => return Verdict::deny(format!("JobSet cannot be read: {e}")),
        },
    };
    let mode = jobset_mode::mode(&metadata);
    let plan = match mode {
        Mode::Plain => Ok(None),
        Mode::JobSet => jobset_mode_plan(object, metadata.clone(), options).map(Some),
        Mode::TrainJob(owner) => train_job_plan(req, &metadata, owner, objects).await,
    };
    match plan {
        Ok(Some(plan)) => match enforce_mpi_policy(&plan, object) {
            Ok(patch) => Verdict::Allow {
                // Decision 19: JobSet mode denied it already; Trainer's JobSet is warned of.
                warnings: match mode {
                    Mode::TrainJob(_) => host_name_warning(&plan).into_iter().collect(),
                    Mode::JobSet | Mode::Plain => Vec::new(),
                },
                patch: Some(patch),
            },
            Err(e) => Verdict::deny(format!("JobSet cannot be patched: {e}")),
        },
        Ok(None) => Verdict::allow(),
        Err(verdict) => verdict,
    }
}

/// JobSet mode's plan. A JobSet breaking a rule of the mode is denied here too, with the
/// validating route's message, so that no pod starts half wired whatever the order of the
/// webhooks. The mode's rules read the JobSet typed, its spec from the same JSON (the metadata
/// already read), and quote it.
fn jobset_mode_plan(
    object: &Value,
    metadata: ObjectMeta,
    options: &Options,
) -> Result<MpiPlan, Verdict> {
    /// Of the JobSet, the spec: the metadata is read once, before the mode is known.
    #[derive(Deserialize)]
    struct Spec {
        #[serde(default)]
        spec: JobSetSpec,
    }
    let Spec { spec } =
        read::object(object).map_err(|e| Verdict::deny(format!("JobSet cannot be read: {e}")))?;
    let jobset = JobSet { metadata, spec };
    let mut checked = jobset_rules::check(&jobset, &RawJson::from(object), options);
    // Mutation is CREATE only: the validating route's CREATE rule.
    let host_names = checked
        .plan
        .as_ref()
        .and_then(jobset_rules::host_name_error);
    checked.errors.extend(host_names);
    match (aggregate(&checked.errors), checked.plan) {
        (Some(message), _) => Err(Verdict::deny(message)),
        (None, Some(plan)) => Ok(plan),
        // Settings that parse always give a plan; were there none, nothing could be wired.
        (None, None) => Err(Verdict::Internal(InternalError::NoPlan)),
    }
}

/// The MPI plan of the TrainJob that controls the JobSet with `metadata` (`owner`): `Ok(None)`
/// when its runtime has no MPI policy, `Err` with the verdict when the TrainJob or its runtime
/// cannot be used.
async fn train_job_plan<S: ObjectSource>(
    req: &Request,
    metadata: &ObjectMeta,
    owner: &OwnerReference,
    objects: &S,
) -> Result<Option<MpiPlan>, Verdict> {
    let namespace = req
        .request
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
        Err(error) => return Err(Verdict::Internal(InternalError::Lookup(error))),
    };
    if train_job.uid() != owner.uid {
        return Err(Verdict::deny(format!(
            "{train_job_ref} has uid {:?}, but this JobSet's controller ownerReference names uid {:?}",
            train_job.uid(),
            owner.uid
        )));
    }
    let runtime = runtime_of(objects, &train_job, namespace)
        .await
        .map_err(|e| match e {
            Unresolved::Problem(Problem::RuntimeNotFound { kind, name }) => Verdict::deny(format!(
                "{train_job_ref} refers to {} {name:?}, which was not found",
                kind.as_str()
            )),
            Unresolved::Problem(problem) => Verdict::deny(format!("{train_job_ref}: {problem}")),
            Unresolved::Lookup(error) => Verdict::Internal(InternalError::Lookup(error)),
        })?;
    runtime
        .plan(&train_job)
        .map_err(|problem| Verdict::deny(format!("{train_job_ref}: {problem}")))
}
