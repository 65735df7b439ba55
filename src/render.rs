//! `render`: the Secret, the ConfigMap and (when it is on) the NetworkPolicy the reconciler would
//! create for each MPI TrainJob and each JobSet-mode JobSet of a [`Snapshot`], as multi-document
//! YAML. Which owners get objects, and what they hold, is [`crate::mpi::objects_for::desired`]'s
//! answer, as in the reconciler; the runtimes are the snapshot's, looked up at once. Pure: keys
//! come from the given generator.

use serde::Serialize;

use crate::mpi::Owner;
use crate::mpi::objects_for::{self, Desired, Owned, Problem, desired};
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
    Yaml(#[source] serde_saphyr::SerializeError),
}

/// The output of `render`.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Multi-document YAML: Secret, ConfigMap and NetworkPolicy (when on) per MPI TrainJob,
    /// then per JobSet-mode JobSet, each in namespace/name order.
    pub yaml: String,
    /// One line per skipped TrainJob (runtime missing or unsupported) or JobSet (settings that
    /// do not parse).
    pub problems: Vec<String>,
}

fn push_document(out: &mut String, object: &impl Serialize) -> Result<(), RenderError> {
    let yaml = serde_saphyr::to_string(object).map_err(RenderError::Yaml)?;
    out.push_str("---\n");
    out.push_str(&yaml);
    if !yaml.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}

/// Renders every MPI TrainJob, then every JobSet-mode JobSet, of `snapshot`, generating one key
/// pair per object with `keygen`. `options` are the reconciler's (`--network-policy-default`:
/// the NetworkPolicy of every TrainJob, and of every JobSet without the annotation).
///
/// # Errors
/// [`RenderError`] when keys cannot be generated or YAML cannot be written.
pub fn render(
    snapshot: &Snapshot,
    options: &objects_for::Options,
    mut keygen: impl FnMut() -> Result<SshKeyPair, KeyError>,
) -> Result<Rendered, RenderError> {
    let mut rendered = Rendered::default();
    for train_job in snapshot.train_jobs() {
        let objects = snapshot
            .runtime_of(train_job)
            .and_then(|runtime| desired(Owned::TrainJob(train_job, &runtime), options));
        push_objects(
            &mut rendered,
            Owner::from(&**train_job),
            objects,
            &mut keygen,
        )?;
    }
    for jobset in snapshot.jobsets() {
        let objects = desired(Owned::JobSet(jobset), options);
        push_objects(&mut rendered, Owner::from(&**jobset), objects, &mut keygen)?;
    }
    Ok(rendered)
}

/// Adds `owner`'s Secret, its ConfigMap and its NetworkPolicy (when on) to the YAML; nothing
/// for an owner that gets no objects; for one that cannot have them, the problem, as
/// `<Kind> <namespace>/<name>: <problem>`.
fn push_objects(
    rendered: &mut Rendered,
    owner: Owner,
    objects: Result<Option<Desired>, Problem>,
    keygen: &mut impl FnMut() -> Result<SshKeyPair, KeyError>,
) -> Result<(), RenderError> {
    match objects {
        Ok(Some(Desired {
            configmap,
            network_policy: policy,
        })) => {
            push_document(&mut rendered.yaml, &ssh_secret(owner, &keygen()?))?;
            push_document(&mut rendered.yaml, &configmap)?;
            match policy {
                Some(policy) => push_document(&mut rendered.yaml, &policy),
                None => Ok(()),
            }
        }
        Ok(None) => Ok(()),
        Err(problem) => {
            let Owner {
                kind,
                namespace,
                name,
                ..
            } = owner;
            rendered
                .problems
                .push(format!("{kind} {namespace}/{name}: {problem}"));
            Ok(())
        }
    }
}
