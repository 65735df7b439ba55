//! Which owners get the MPI objects (the SSH Secret, the hostfile ConfigMap and, when it is on,
//! the NetworkPolicy), and the ConfigMap they get: a TrainJob whose runtime has an MPI policy, a JobSet in JobSet mode. The
//! reconciler and `render` both decide here, so they agree on which owners get objects and on
//! every count and name.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use std::sync::Arc;

use crate::api::{JobSet, RuntimeKind, TrainJob, TrainingRuntime};
use crate::field_error::{FieldError, aggregate};
use crate::objects::{LookupError, ObjectSource};

use super::hostfile::{HostfileTooLarge, hostfile_configmap};
use super::jobset_mode::{self, Mode};
use super::network_policy::network_policy;
use super::plan::{MpiPlan, PlanError};

/// Why no objects can be built for a TrainJob. The display texts are what `render` reports and
/// what the reconciler's failure Events say.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    /// `spec.runtimeRef` names neither runtime kind (`unsupported runtime: <Kind>.<group>`).
    #[error(transparent)]
    UnsupportedRuntime(#[from] crate::api::UnsupportedRuntime),
    /// The referenced runtime does not exist.
    #[error("{} {name:?} not found", kind.as_str())]
    RuntimeNotFound {
        /// Its kind.
        kind: RuntimeKind,
        /// Its name.
        name: String,
    },
    /// The runtime's MPI policy cannot be used: an implementation that is not supported
    /// (Decisions 4 and 7), or the SSH Secret mounted where the hostfile is.
    #[error("{}", error.detail(*kind, name))]
    UnusableRuntime {
        /// The runtime's kind.
        kind: RuntimeKind,
        /// The runtime's name.
        name: String,
        /// What is wrong with its MPI policy.
        #[source]
        error: PlanError,
    },
    /// A JobSet-mode JobSet's label or annotations do not parse: every field error, shown
    /// aggregated as the API server shows several.
    #[error("{}", aggregate(.0).unwrap_or_default())]
    JobSetSettings(Vec<FieldError>),
    /// The hostfile would not fit a ConfigMap (Decision 8).
    #[error(transparent)]
    HostfileTooLarge(#[from] HostfileTooLarge),
}

/// A TrainJob's runtime, looked up once: what validation, mutation, the reconciler and
/// `render` all start from, so that they agree on which runtime a TrainJob runs on.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The runtime's kind.
    pub kind: RuntimeKind,
    /// The runtime.
    pub runtime: Arc<TrainingRuntime>,
}

/// Why a TrainJob's runtime is not at hand.
#[derive(Debug, thiserror::Error)]
pub enum Unresolved {
    /// `spec.runtimeRef` names neither runtime kind, or the runtime does not exist.
    #[error(transparent)]
    Problem(#[from] Problem),
    /// The lookup itself failed.
    #[error(transparent)]
    Lookup(#[from] LookupError),
}

/// The runtime `train_job` refers to, looked up in `objects` in `namespace` (ignored for a
/// ClusterTrainingRuntime).
///
/// # Errors
/// [`Unresolved`]: [`Problem::UnsupportedRuntime`], [`Problem::RuntimeNotFound`], or the
/// lookup's error.
pub async fn runtime_of<S: ObjectSource>(
    objects: &S,
    train_job: &TrainJob,
    namespace: &str,
) -> Result<Resolved, Unresolved> {
    let (kind, name) = runtime_ref(train_job)?;
    match objects.runtime(kind, namespace, name).await? {
        Some(runtime) => Ok(Resolved { kind, runtime }),
        None => Err(Problem::RuntimeNotFound {
            kind,
            name: name.to_owned(),
        }
        .into()),
    }
}

/// The runtime a TrainJob refers to: its kind and name.
///
/// # Errors
/// [`Problem::UnsupportedRuntime`] when `spec.runtimeRef` names neither runtime kind.
pub fn runtime_ref(train_job: &TrainJob) -> Result<(RuntimeKind, &str), Problem> {
    let kind = train_job.spec.runtime_ref.runtime_kind()?;
    Ok((kind, train_job.spec.runtime_ref.name.as_str()))
}

impl Resolved {
    /// The plan of `train_job` on this runtime, `None` when the runtime has no MPI policy.
    ///
    /// # Errors
    /// [`Problem::UnusableRuntime`] when its MPI policy cannot be used.
    pub fn plan(&self, train_job: &TrainJob) -> Result<Option<MpiPlan>, Problem> {
        MpiPlan::new(train_job, &self.runtime).map_err(|error| Problem::UnusableRuntime {
            kind: self.kind,
            name: train_job.spec.runtime_ref.name.clone(),
            error,
        })
    }
}

/// The hostfile ConfigMap of `train_job` on its runtime ([`runtime_of`]), or `None` when the
/// runtime has no MPI policy.
///
/// # Errors
/// [`Problem`] when its implementation is unsupported or the hostfile would not fit.
pub fn hostfile_for(
    train_job: &TrainJob,
    runtime: &Resolved,
) -> Result<Option<ConfigMap>, Problem> {
    let Some(plan) = runtime.plan(train_job)? else {
        return Ok(None);
    };
    Ok(Some(hostfile_configmap(train_job, &plan)?))
}

/// The hostfile ConfigMap of a JobSet-mode JobSet, owned by the JobSet, or `None` for a JobSet
/// not in JobSet mode (no label, or a TrainJob controls it).
///
/// # Errors
/// [`Problem`] when its settings do not parse or the hostfile would not fit.
pub fn jobset_hostfile(jobset: &JobSet) -> Result<Option<ConfigMap>, Problem> {
    if jobset_mode::mode(&jobset.metadata) != Mode::JobSet {
        return Ok(None);
    }
    let plan = MpiPlan::for_jobset(jobset).map_err(Problem::JobSetSettings)?;
    Ok(Some(hostfile_configmap(jobset, &plan)?))
}

/// The NetworkPolicy of a TrainJob that gets objects (its [`hostfile_for`] is `Some`), when
/// `enabled` (`--network-policy-default`: a TrainJob has no place of ours for an annotation).
pub fn train_job_network_policy(train_job: &TrainJob, enabled: bool) -> Option<NetworkPolicy> {
    enabled.then(|| network_policy(train_job))
}

/// The NetworkPolicy of a JobSet-mode JobSet, owned by the JobSet, when its annotation
/// `mpi-webhook.io/network-policy` says `true`, or is absent and `default` is `true`; `None`
/// for a JobSet not in JobSet mode.
///
/// # Errors
/// [`Problem::JobSetSettings`] when the annotation is neither `true` nor `false`.
pub fn jobset_network_policy(
    jobset: &JobSet,
    default: bool,
) -> Result<Option<NetworkPolicy>, Problem> {
    if jobset_mode::mode(&jobset.metadata) != Mode::JobSet {
        return Ok(None);
    }
    let wanted = jobset_mode::network_policy(&jobset.metadata)
        .map_err(|error| Problem::JobSetSettings(vec![*error]))?
        .unwrap_or(default);
    Ok(wanted.then(|| network_policy(jobset)))
}
