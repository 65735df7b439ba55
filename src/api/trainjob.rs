//! The TrainJob view (`trainer.kubeflow.org/v1alpha1`, spec section A.1).

use super::resources::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::{RuntimeKind, TRAINER_GROUP};

/// A TrainJob, as far as the MPI policy reads it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainJob {
    /// Standard object metadata (name, namespace, uid are read).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The TrainJob spec.
    #[serde(default)]
    pub spec: TrainJobSpec,
}

/// `spec` of a TrainJob.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainJobSpec {
    /// Which runtime this TrainJob runs on.
    #[serde(default)]
    pub runtime_ref: RuntimeRef,
    /// Trainer overrides; `None` is valid (everything comes from the runtime).
    #[serde(default)]
    pub trainer: Option<Trainer>,
}

/// `spec.runtimeRef`; absent `apiGroup` / `kind` take the CRD defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeRef {
    /// Runtime name.
    #[serde(default)]
    pub name: String,
    /// API group; CRD default `trainer.kubeflow.org`.
    #[serde(default)]
    pub api_group: Option<String>,
    /// Kind; CRD default `ClusterTrainingRuntime`.
    #[serde(default)]
    pub kind: Option<String>,
}

impl RuntimeRef {
    /// The API group with its CRD default applied.
    pub fn api_group(&self) -> &str {
        self.api_group.as_deref().unwrap_or(TRAINER_GROUP)
    }

    /// The kind with its CRD default applied.
    pub fn kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("ClusterTrainingRuntime")
    }

    /// `schema.GroupKind.String()`: `Kind.group`, or `Kind` alone for the empty group.
    pub fn group_kind(&self) -> String {
        match self.api_group() {
            "" => self.kind().to_string(),
            group => format!("{}.{group}", self.kind()),
        }
    }

    /// The runtime kind this reference names.
    ///
    /// # Errors
    /// [`UnsupportedRuntime`] when it names neither runtime kind.
    pub fn runtime_kind(&self) -> Result<RuntimeKind, UnsupportedRuntime> {
        match (self.api_group(), self.kind()) {
            (TRAINER_GROUP, "TrainingRuntime") => Ok(RuntimeKind::TrainingRuntime),
            (TRAINER_GROUP, "ClusterTrainingRuntime") => Ok(RuntimeKind::ClusterTrainingRuntime),
            _ => Err(UnsupportedRuntime(self.group_kind())),
        }
    }
}

/// A runtimeRef naming neither runtime kind: upstream's `unsupported runtime: <Kind>.<group>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported runtime: {0}")]
pub struct UnsupportedRuntime(pub String);

/// `spec.trainer`, the fields MPI reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trainer {
    /// Number of nodes; `None` keeps the runtime's count.
    #[serde(default)]
    pub num_nodes: Option<i32>,
    /// Processes per node; overrides the runtime and the GPU count.
    #[serde(default)]
    pub num_proc_per_node: Option<i32>,
    /// Env vars for the trainer container (names are read).
    #[serde(default)]
    pub env: Option<Vec<EnvVarName>>,
    /// Resources per node (GPU count).
    #[serde(default)]
    pub resources_per_node: Option<ResourceRequirements>,
}

/// An env var entry; only its name matters to the policy.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EnvVarName {
    /// Variable name.
    #[serde(default)]
    pub name: String,
}
