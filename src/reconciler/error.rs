//! Why a reconcile failed, and what each failure means for its Event, its metric label and
//! its next attempt.

use crate::mpi::objects_for::Problem;
use crate::mpi::ssh_secret::KeyError;
use crate::objects::LookupError;

/// Kubeflow Trainer's field manager: it applies the same hostfile ConfigMap on every reconcile
/// (with force), so forcing over it would make the two managers overwrite each other forever.
pub const TRAINER_MANAGER: &str = "trainer";

/// Event reason for a hostfile ConfigMap left to Kubeflow Trainer (see [`HostfileConflict`]).
const HOSTFILE_CONFLICT_REASON: &str = "HostfileConflict";

/// Why one reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime could not be looked up (API server error, not "not found").
    #[error("looking up the runtime: {0}")]
    RuntimeLookup(#[source] LookupError),
    /// No objects can be built: runtime missing, unsupported, or the hostfile too large.
    #[error("{0}")]
    Policy(#[source] Problem),
    /// Key generation failed.
    #[error("failed to build SSH Auth secret: {0}")]
    Keys(#[source] KeyError),
    /// Creating the Secret failed (other than "already exists").
    #[error("failed to create the SSH auth Secret: {0}")]
    CreateSecret(#[source] kube::Error),
    /// Server-side apply of the ConfigMap failed.
    #[error("failed to apply the hostfile ConfigMap: {0}")]
    ApplyConfigMap(#[source] kube::Error),
    /// Server-side apply of the NetworkPolicy failed.
    #[error("failed to apply the NetworkPolicy: {0}")]
    ApplyNetworkPolicy(#[source] kube::Error),
    /// Reading Kubeflow Trainer's ConfigMap after a conflict failed.
    #[error("failed to get the hostfile ConfigMap: {0}")]
    GetConfigMap(#[source] kube::Error),
    /// Kubeflow Trainer's manager holds fields of the ConfigMap with other values: left as is.
    #[error("{0}")]
    HostfileConflict(HostfileConflict),
    /// This replica stopped being the leader: the reconcile stopped before writing.
    #[error("not the leader")]
    NotLeader,
}

impl Error {
    /// A short fixed label for the `reconcile_errors_total` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::RuntimeLookup(_) => "runtime_lookup",
            Error::Policy(Problem::RuntimeNotFound { .. }) => "runtime_not_found",
            Error::Policy(_) => "policy",
            Error::Keys(_) => "keys",
            Error::CreateSecret(_) => "create_secret",
            Error::ApplyConfigMap(_) => "apply_configmap",
            Error::ApplyNetworkPolicy(_) => "apply_networkpolicy",
            Error::GetConfigMap(_) => "get_configmap",
            Error::HostfileConflict(_) => "hostfile_conflict",
            Error::NotLeader => "not_leader",
        }
    }

    /// Whether retrying soon cannot help, so the next attempt waits the longest delay: no
    /// objects can be built for this owner as it is (an unsupported or unusable runtime, a
    /// hostfile too large, a JobSet whose settings do not parse, which are fixed at creation),
    /// and a change to it or its runtime triggers a reconcile through the watches anyway. A
    /// missing runtime is not: it is often created right after its TrainJob. Nor is a conflict
    /// with Trainer fixed by retrying; it is retried at the longest delay, in case Trainer's
    /// text changes.
    pub fn retries_slowly(&self) -> bool {
        match self {
            Error::Policy(problem) => !matches!(problem, Problem::RuntimeNotFound { .. }),
            Error::HostfileConflict(_) => true,
            _ => false,
        }
    }

    /// The reason of the Warning Event published on the owner: `failed`, the owner kind's reason
    /// for objects that could not be built or written, unless the hostfile was left to Trainer.
    pub fn event_reason(&self, failed: &'static str) -> &'static str {
        match self {
            Error::HostfileConflict(_) => HOSTFILE_CONFLICT_REASON,
            _ => failed,
        }
    }
}

/// Kubeflow Trainer's field manager holds fields of the hostfile ConfigMap (normally
/// `.data.hostfile`) with values other than ours. Both are computed from the same TrainJob, so
/// this means Trainer's hostfile differs from ours (an implementation or version Trainer words
/// differently). Trainer re-applies its own on every reconcile, so mpi-webhook leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostfileConflict {
    /// The ConfigMap's name.
    pub configmap: String,
    /// The conflicting field paths, as the API server names them (`.data.hostfile`).
    pub fields: Vec<String>,
    /// Bytes of our `data.hostfile`.
    pub ours: usize,
    /// Bytes of the stored `data.hostfile` (0 when absent).
    pub theirs: usize,
}

impl std::fmt::Display for HostfileConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ConfigMap {}: Kubeflow Trainer's field manager \"{TRAINER_MANAGER}\" holds {} with \
             other values, left as is: our hostfile is {} bytes, Trainer's is {} bytes",
            self.configmap,
            self.fields.join(", "),
            self.ours,
            self.theirs
        )
    }
}
