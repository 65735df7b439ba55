//! Which owners get the MPI objects (the SSH Secret, the hostfile ConfigMap and, when it is on,
//! the NetworkPolicy), and the objects they get: a TrainJob whose runtime has an MPI policy, a
//! JobSet in JobSet mode. [`desired`] is the one answer: the reconciler and `render` both ask
//! it, so they agree on which owners get objects and on every count and name. Pure: the
//! runtime is looked up before (`crate::objects::runtime_of`), and only the Secret's key pair,
//! the one randomness, is left to the caller.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use std::sync::Arc;

use crate::api::{JobSet, RuntimeKind, TrainJob, TrainingRuntime};
use crate::field_error::{FieldError, aggregate};

use super::hostfile::{HostfileTooLarge, hostfile_configmap};
use super::jobset_mode::{self, Mode, settings};
use super::network_policy::network_policy;
use super::plan::{self, MpiPlan, PlanError};

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

/// The runtime a TrainJob refers to: its kind and name.
///
/// # Errors
/// [`Problem::UnsupportedRuntime`] when `spec.runtimeRef` names neither runtime kind.
pub fn runtime_ref(train_job: &TrainJob) -> Result<(RuntimeKind, &str), Problem> {
    let kind = train_job.spec.runtime_ref.runtime_kind()?;
    Ok((kind, train_job.spec.runtime_ref.name.as_str()))
}

impl Resolved {
    /// The runtime of `kind` named `name` that a lookup `found`.
    ///
    /// # Errors
    /// [`Problem::RuntimeNotFound`] when it found none.
    pub fn found(
        kind: RuntimeKind,
        name: &str,
        found: Option<Arc<TrainingRuntime>>,
    ) -> Result<Self, Problem> {
        match found {
            Some(runtime) => Ok(Resolved { kind, runtime }),
            None => Err(Problem::RuntimeNotFound {
                kind,
                name: name.to_owned(),
            }),
        }
    }

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

/// What the reconciler's objects are configured with: plain data from the command line of
/// `reconcile` and `render` (`crate::cli::ObjectArgs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `--network-policy-default`: the NetworkPolicy of every MPI TrainJob (a TrainJob has no
    /// place of ours for an annotation), and of every JobSet-mode JobSet without
    /// `mpi-webhook.io/network-policy`.
    pub network_policy_default: bool,
}

/// An owner of MPI objects, with what its objects are made from.
#[derive(Debug, Clone, Copy)]
pub enum Owned<'o> {
    /// A TrainJob, on its runtime.
    TrainJob(&'o TrainJob, &'o Resolved),
    /// A JobSet (in JobSet mode or not).
    JobSet(&'o JobSet),
}

/// The objects one owner needs besides its Secret.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// The hostfile ConfigMap.
    pub configmap: ConfigMap,
    /// The NetworkPolicy, when isolation is on for this owner.
    pub network_policy: Option<NetworkPolicy>,
}

/// The objects `owner` needs besides its Secret, or `None` when it gets none: a TrainJob whose
/// runtime has no MPI policy, a JobSet not in JobSet mode (no label, or a TrainJob controls
/// it). A JobSet's NetworkPolicy is on when its `mpi-webhook.io/network-policy` says `true`, or
/// is absent and `options.network_policy_default` is `true`.
///
/// # Errors
/// [`Problem`] when the runtime's MPI policy cannot be used, the JobSet's settings do not parse,
/// or the hostfile would not fit.
pub fn desired(owner: Owned<'_>, options: &Options) -> Result<Option<Desired>, Problem> {
    match owner {
        Owned::TrainJob(train_job, runtime) => {
            let Some(plan) = runtime.plan(train_job)? else {
                return Ok(None);
            };
            Ok(Some(Desired {
                configmap: hostfile_configmap(train_job, &plan)?,
                network_policy: options
                    .network_policy_default
                    .then(|| network_policy(train_job)),
            }))
        }
        Owned::JobSet(jobset) => {
            if jobset_mode::mode(&jobset.metadata) != Mode::JobSet {
                return Ok(None);
            }
            let settings = settings(&jobset.metadata).map_err(Problem::JobSetSettings)?;
            let wanted = settings
                .network_policy
                .unwrap_or(options.network_policy_default);
            // The reconciler's plan: no pre-flight is its concern.
            let plan = MpiPlan::from_settings(jobset, settings, &plan::Options::default());
            Ok(Some(Desired {
                configmap: hostfile_configmap(jobset, &plan)?,
                network_policy: wanted.then(|| network_policy(jobset)),
            }))
        }
    }
}
