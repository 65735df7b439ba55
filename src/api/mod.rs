//! Typed, read-only views of the Kubeflow Trainer and JobSet objects mpi-webhook reads.
//!
//! Only the fields the MPI policy reads are modelled; every other field is ignored on input and
//! these types are never serialized back into a user's object (patches are computed on the raw
//! JSON, see [`crate::mpi::enforce`]). Absent fields take the CRD defaults through accessor methods.

pub mod jobset;
mod resource_impls;
pub mod resources;
pub mod runtime;
pub mod trainjob;

pub use jobset::{Container, JOBSET_API_VERSION, JobSet, JobSetSpec, ReplicatedJob};
pub use runtime::{MlPolicy, MpiPolicySource, RuntimeKind, TrainingRuntime};
pub use trainjob::{RuntimeRef, TrainJob, Trainer, UnsupportedRuntime};

/// `name()`, `namespace()` and `uid()` of the views, read from `metadata` the same way for each.
macro_rules! metadata_accessors {
    ($($view:ty),+) => {$(
        impl $view {
            /// `metadata.name`, empty when absent.
            pub fn name(&self) -> &str {
                self.metadata.name.as_deref().unwrap_or_default()
            }

            /// `metadata.namespace`, empty when absent (always, for a ClusterTrainingRuntime).
            pub fn namespace(&self) -> &str {
                self.metadata.namespace.as_deref().unwrap_or_default()
            }

            /// `metadata.uid`, empty when absent.
            pub fn uid(&self) -> &str {
                self.metadata.uid.as_deref().unwrap_or_default()
            }
        }
    )+};
}

metadata_accessors!(JobSet, TrainJob, TrainingRuntime);

/// API group of the Kubeflow Trainer kinds.
pub const TRAINER_GROUP: &str = "trainer.kubeflow.org";
/// `apiVersion` of the Kubeflow Trainer kinds.
pub const TRAINER_API_VERSION: &str = "trainer.kubeflow.org/v1alpha1";
/// API group of JobSet.
pub const JOBSET_GROUP: &str = "jobset.x-k8s.io";
