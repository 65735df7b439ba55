//! `render`: the Secret and ConfigMap the reconciler would create for each MPI TrainJob of a
//! [`Snapshot`], as multi-document YAML. Pure: keys come from the given generator.

use serde::Serialize;

use crate::admission::runtime_kind_of;
use crate::mpi::hostfile::hostfile_configmap;
use crate::mpi::plan::MpiPlan;
use crate::mpi::ssh_secret::{KeyError, SshKeyPair, ssh_secret};
use crate::mpi::validate::unsupported_implementation_detail;
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
    /// Multi-document YAML: Secret then ConfigMap per MPI TrainJob, in namespace/name order.
    pub yaml: String,
    /// One line per skipped TrainJob (runtime missing or unsupported).
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

/// Renders every MPI TrainJob of `snapshot`, generating one key pair per TrainJob with `keygen`.
///
/// # Errors
/// [`RenderError`] when keys cannot be generated or YAML cannot be written.
pub fn render(
    snapshot: &Snapshot,
    mut keygen: impl FnMut() -> Result<SshKeyPair, KeyError>,
) -> Result<Rendered, RenderError> {
    let mut rendered = Rendered::default();
    for train_job in snapshot.train_jobs() {
        let who = format!("TrainJob {}/{}", train_job.namespace(), train_job.name());
        let kind = match runtime_kind_of(train_job) {
            Ok(kind) => kind,
            Err(message) => {
                rendered.problems.push(format!("{who}: {message}"));
                continue;
            }
        };
        let runtime_name = &train_job.spec.runtime_ref.name;
        let Some(runtime) = snapshot.get_runtime(kind, train_job.namespace(), runtime_name) else {
            rendered.problems.push(format!(
                "{who}: {} {runtime_name:?} not found",
                kind.as_str()
            ));
            continue;
        };
        let plan = match MpiPlan::new(train_job, &runtime) {
            Ok(Some(plan)) => plan,
            Ok(None) => continue,
            Err(crate::mpi::plan::PlanError::UnsupportedImplementation(value)) => {
                let detail = unsupported_implementation_detail(kind, runtime_name, &value);
                rendered.problems.push(format!("{who}: {detail}"));
                continue;
            }
        };
        let configmap = match hostfile_configmap(train_job, &plan) {
            Ok(configmap) => configmap,
            Err(too_large) => {
                rendered.problems.push(format!("{who}: {too_large}"));
                continue;
            }
        };
        push_document(&mut rendered.yaml, &ssh_secret(train_job, &keygen()?))?;
        push_document(&mut rendered.yaml, &configmap)?;
    }
    Ok(rendered)
}
