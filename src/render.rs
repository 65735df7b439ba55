//! `render`: the Secret and ConfigMap the reconciler would create for each MPI TrainJob and each
//! JobSet-mode JobSet of a [`Snapshot`], as multi-document YAML, and [`hostfile_for`] and
//! [`jobset_hostfile`], the decisions the reconciler shares. Pure: keys come from the given
//! generator.

use serde::Serialize;

use k8s_openapi::api::core::v1::ConfigMap;

use crate::admission::runtime_kind_of;
use crate::api::{JobSet, RuntimeKind, TrainJob, TrainingRuntime};
use crate::field_error::aggregate;
use crate::mpi::hostfile::{HostfileTooLarge, hostfile_configmap};
use crate::mpi::jobset_mode::{self, Mode};
use crate::mpi::plan::MpiPlan;
use crate::mpi::ssh_secret::{KeyError, SshKeyPair, ssh_secret};
use crate::objects::Snapshot;

/// Rendering failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// Key generation failed.
    #[error("failed to build SSH Auth secret: {0}")]
    Keys(#[from] KeyError),
    /// An object could not be written as YAML.
    #[error("failed to write YAML: {0}")]
    Yaml(String),
}

/// The output of `render`.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Multi-document YAML: Secret then ConfigMap per MPI TrainJob, then per JobSet-mode JobSet,
    /// each in namespace/name order.
    pub yaml: String,
    /// One line per skipped TrainJob (runtime missing or unsupported) or JobSet (settings that
    /// do not parse).
    pub problems: Vec<String>,
}

fn push_document(out: &mut String, object: &impl Serialize) -> Result<(), RenderError> {
    let yaml = serde_saphyr::to_string(object).map_err(|e| RenderError::Yaml(e.to_string()))?;
    out.push_str("---\n");
    out.push_str(&yaml);
    if !yaml.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}

/// Why no objects can be built for a TrainJob. The display texts are what `render` reports and
/// what the reconciler's failure Events say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// `spec.runtimeRef` names neither runtime kind (`unsupported runtime: <Kind>.<group>`).
    #[error("{0}")]
    UnsupportedRuntime(String),
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
    #[error("{0}")]
    UnusableRuntime(String),
    /// A JobSet-mode JobSet's label or annotations do not parse (the field errors, aggregated).
    #[error("{0}")]
    JobSetSettings(String),
    /// The hostfile would not fit a ConfigMap (Decision 8).
    #[error(transparent)]
    HostfileTooLarge(#[from] HostfileTooLarge),
}

/// The runtime a TrainJob refers to: its kind and name.
///
/// # Errors
/// [`Problem::UnsupportedRuntime`] when `spec.runtimeRef` names neither runtime kind.
pub fn runtime_ref(train_job: &TrainJob) -> Result<(RuntimeKind, &str), Problem> {
    let kind = runtime_kind_of(train_job).map_err(Problem::UnsupportedRuntime)?;
    Ok((kind, train_job.spec.runtime_ref.name.as_str()))
}

/// The hostfile ConfigMap of `train_job` on its runtime (found by [`runtime_ref`]), or `None`
/// when the runtime has no MPI policy. The reconciler and `render` both decide here, so they
/// agree on which TrainJobs get objects and on every count and name.
///
/// # Errors
/// [`Problem`] when the runtime is missing (`None`), its implementation is unsupported, or the
/// hostfile would not fit.
pub fn hostfile_for(
    train_job: &TrainJob,
    kind: RuntimeKind,
    runtime: Option<&TrainingRuntime>,
) -> Result<Option<ConfigMap>, Problem> {
    let runtime_name = &train_job.spec.runtime_ref.name;
    let Some(runtime) = runtime else {
        return Err(Problem::RuntimeNotFound {
            kind,
            name: runtime_name.clone(),
        });
    };
    let plan = match MpiPlan::new(train_job, runtime) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Ok(None),
        Err(problem) => {
            return Err(Problem::UnusableRuntime(problem.detail(kind, runtime_name)));
        }
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
    let plan = MpiPlan::for_jobset(jobset)
        .map_err(|errors| Problem::JobSetSettings(aggregate(&errors).unwrap_or_default()))?;
    Ok(Some(hostfile_configmap(jobset, &plan)?))
}

/// Renders every MPI TrainJob, then every JobSet-mode JobSet, of `snapshot`, generating one key
/// pair per object with `keygen`.
///
/// # Errors
/// [`RenderError`] when keys cannot be generated or YAML cannot be written.
pub fn render(
    snapshot: &Snapshot,
    mut keygen: impl FnMut() -> Result<SshKeyPair, KeyError>,
) -> Result<Rendered, RenderError> {
    let mut rendered = Rendered::default();
    for train_job in snapshot.train_jobs() {
        let configmap = runtime_ref(train_job).and_then(|(kind, name)| {
            let runtime = snapshot.get_runtime(kind, train_job.namespace(), name);
            hostfile_for(train_job, kind, runtime.as_deref())
        });
        let configmap = match configmap {
            Ok(Some(configmap)) => configmap,
            Ok(None) => continue,
            Err(problem) => {
                let who = format!("TrainJob {}/{}", train_job.namespace(), train_job.name());
                rendered.problems.push(format!("{who}: {problem}"));
                continue;
            }
        };
        push_document(&mut rendered.yaml, &ssh_secret(&**train_job, &keygen()?))?;
        push_document(&mut rendered.yaml, &configmap)?;
    }
    for jobset in snapshot.jobsets() {
        let configmap = match jobset_hostfile(jobset) {
            Ok(Some(configmap)) => configmap,
            Ok(None) => continue,
            Err(problem) => {
                let who = format!("JobSet {}/{}", jobset.namespace(), jobset.name());
                rendered.problems.push(format!("{who}: {problem}"));
                continue;
            }
        };
        push_document(&mut rendered.yaml, &ssh_secret(&**jobset, &keygen()?))?;
        push_document(&mut rendered.yaml, &configmap)?;
    }
    Ok(rendered)
}
