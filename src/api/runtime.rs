//! The TrainingRuntime / ClusterTrainingRuntime view (spec sections A.2 and A.3).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use super::jobset::JobSetTemplateSpec;

/// Which of the two runtime kinds an object is (they share one spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuntimeKind {
    /// Namespaced `TrainingRuntime`.
    TrainingRuntime,
    /// Cluster-scoped `ClusterTrainingRuntime`.
    ClusterTrainingRuntime,
}

impl RuntimeKind {
    /// The Kubernetes kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::TrainingRuntime => "TrainingRuntime",
            RuntimeKind::ClusterTrainingRuntime => "ClusterTrainingRuntime",
        }
    }

    /// The plural resource name, as it appears in API errors.
    pub fn resource(self) -> &'static str {
        match self {
            RuntimeKind::TrainingRuntime => "trainingruntimes",
            RuntimeKind::ClusterTrainingRuntime => "clustertrainingruntimes",
        }
    }
}

/// A TrainingRuntime or ClusterTrainingRuntime.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingRuntime {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The runtime spec.
    #[serde(default)]
    pub spec: TrainingRuntimeSpec,
}

/// `spec` of a (Cluster)TrainingRuntime.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingRuntimeSpec {
    /// The ML policy; `None` means plain ML (no MPI).
    #[serde(default)]
    pub ml_policy: Option<MlPolicy>,
    /// The JobSet template the TrainJob's JobSet is built from.
    #[serde(default)]
    pub template: JobSetTemplateSpec,
}

/// `spec.mlPolicy`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MlPolicy {
    /// Default node count (doc-default 1).
    #[serde(default)]
    pub num_nodes: Option<i32>,
    /// The MPI policy source.
    #[serde(default)]
    pub mpi: Option<MpiPolicySource>,
    /// Other policy sources, only checked for presence (at most one policy may be set).
    #[serde(default)]
    pub torch: Option<Value>,
    /// See `torch`.
    #[serde(default)]
    pub jax: Option<Value>,
    /// See `torch`.
    #[serde(default)]
    pub xgboost: Option<Value>,
    /// See `torch`.
    #[serde(default)]
    pub flux: Option<Value>,
}

impl MlPolicy {
    /// How many policy sources are set (`null` counts as unset, as in Go).
    pub fn sources_set(&self) -> usize {
        let others = [&self.torch, &self.jax, &self.xgboost, &self.flux];
        usize::from(self.mpi.is_some())
            + others
                .iter()
                .filter(|v| matches!(v, Some(v) if !v.is_null()))
                .count()
    }
}

/// `spec.mlPolicy.mpi` (section A.3). Absent fields take their CRD defaults (Decision 2).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpiPolicySource {
    /// CRD default 1.
    #[serde(default)]
    pub num_proc_per_node: Option<i32>,
    /// CRD default `OpenMPI`.
    #[serde(default)]
    pub mpi_implementation: Option<String>,
    /// CRD default `/root/.ssh`.
    #[serde(default)]
    pub ssh_auth_mount_path: Option<String>,
    /// CRD default false.
    #[serde(default)]
    pub run_launcher_as_node: Option<bool>,
}

/// Where the SSH Secret is mounted unless a policy says otherwise (the CRD default of
/// `sshAuthMountPath`, and JobSet mode's default).
pub const DEFAULT_SSH_AUTH_MOUNT_PATH: &str = "/root/.ssh";

impl MpiPolicySource {
    /// numProcPerNode with its CRD default.
    pub fn num_proc_per_node(&self) -> i32 {
        self.num_proc_per_node.unwrap_or(1)
    }

    /// mpiImplementation with its CRD default.
    pub fn mpi_implementation(&self) -> &str {
        self.mpi_implementation.as_deref().unwrap_or("OpenMPI")
    }

    /// sshAuthMountPath with its CRD default.
    pub fn ssh_auth_mount_path(&self) -> &str {
        self.ssh_auth_mount_path
            .as_deref()
            .unwrap_or(DEFAULT_SSH_AUTH_MOUNT_PATH)
    }

    /// runLauncherAsNode with its CRD default.
    pub fn run_launcher_as_node(&self) -> bool {
        self.run_launcher_as_node.unwrap_or(false)
    }
}

impl TrainingRuntime {
    /// The MPI policy source, when the runtime has one.
    pub fn mpi(&self) -> Option<&MpiPolicySource> {
        self.spec.ml_policy.as_ref()?.mpi.as_ref()
    }
}
