//! `render`: the Secret, the ConfigMap and (when it is on) the NetworkPolicy the reconciler would
//! create for each MPI TrainJob and each JobSet-mode JobSet of a [`Snapshot`], as multi-document
//! YAML. Which owners get objects, and
//! what the ConfigMap holds, is decided by [`crate::mpi::objects_for`], as in the reconciler.
//! Pure: keys come from the given generator.

use serde::Serialize;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;

use crate::mpi::Owner;
use crate::mpi::objects_for::{
    Problem, Unresolved, hostfile_for, jobset_hostfile, jobset_network_policy, runtime_of,
    train_job_network_policy,
};
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
    /// A lookup failed (a snapshot's never does: it shares the reconciler's lookup code).
    #[error(transparent)]
    Lookup(#[from] crate::objects::LookupError),
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
/// pair per object with `keygen`. `network_policy_default` is the reconciler's
/// `--network-policy-default`: the NetworkPolicy of every TrainJob, and of every JobSet without
/// the annotation.
///
/// # Errors
/// [`RenderError`] when keys cannot be generated or YAML cannot be written.
pub fn render(
    snapshot: &Snapshot,
    network_policy_default: bool,
    mut keygen: impl FnMut() -> Result<SshKeyPair, KeyError>,
) -> Result<Rendered, RenderError> {
    let mut rendered = Rendered::default();
    for train_job in snapshot.train_jobs() {
        // A snapshot answers at once: its lookup's future is ready when first polled.
        let runtime =
            futures::executor::block_on(runtime_of(snapshot, train_job, train_job.namespace()));
        let configmap = match runtime {
            Ok(runtime) => hostfile_for(train_job, &runtime),
            Err(Unresolved::Problem(problem)) => Err(problem),
            Err(Unresolved::Lookup(error)) => return Err(error.into()),
        };
        let objects = configmap.map(|configmap| {
            configmap.map(|c| {
                (
                    c,
                    train_job_network_policy(train_job, network_policy_default),
                )
            })
        });
        push_objects(
            &mut rendered,
            Owner::from(&**train_job),
            objects,
            &mut keygen,
        )?;
    }
    for jobset in snapshot.jobsets() {
        let configmap = jobset_hostfile(jobset).and_then(|configmap| {
            let policy = jobset_network_policy(jobset, network_policy_default)?;
            Ok(configmap.map(|c| (c, policy)))
        });
        push_objects(
            &mut rendered,
            Owner::from(&**jobset),
            configmap,
            &mut keygen,
        )?;
    }
    Ok(rendered)
}

/// Adds `owner`'s Secret, its ConfigMap and its NetworkPolicy (when on) to the YAML; nothing
/// for an owner that gets no objects; for one that cannot have them, the problem, as
/// `<Kind> <namespace>/<name>: <problem>`.
fn push_objects(
    rendered: &mut Rendered,
    owner: Owner,
    objects: Result<Option<(ConfigMap, Option<NetworkPolicy>)>, Problem>,
    keygen: &mut impl FnMut() -> Result<SshKeyPair, KeyError>,
) -> Result<(), RenderError> {
    match objects {
        Ok(Some((configmap, policy))) => {
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
