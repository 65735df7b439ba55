//! `kube::Resource` for the read-only views, so the cluster mode can list, watch and GET them
//! with `Api<TrainJob>` / `Api<TrainingRuntime>` and keep them in reflector stores.
//!
//! The views are `Deserialize` only: they can be read from the API server but never written
//! back (a partial struct would drop every field it does not model).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{DynamicResourceScope, NamespaceResourceScope, Resource};

use super::{JOBSET_GROUP, JobSet, RuntimeKind, TRAINER_GROUP, TrainJob, TrainingRuntime};

/// Version of the Kubeflow Trainer kinds.
const TRAINER_VERSION: &str = "v1alpha1";

impl Resource for TrainJob {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("TrainJob")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(TRAINER_GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(TRAINER_VERSION)
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("trainjobs")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// One struct serves both runtime kinds (they share their spec); the [`RuntimeKind`] is the
/// dynamic type that picks the kind, the plural and the scope
/// (`Api::namespaced_with` for TrainingRuntime, `Api::all_with` for ClusterTrainingRuntime).
impl Resource for TrainingRuntime {
    type DynamicType = RuntimeKind;
    type Scope = DynamicResourceScope;

    fn kind(kind: &RuntimeKind) -> Cow<'_, str> {
        Cow::Borrowed(kind.as_str())
    }

    fn group(_: &RuntimeKind) -> Cow<'_, str> {
        Cow::Borrowed(TRAINER_GROUP)
    }

    fn version(_: &RuntimeKind) -> Cow<'_, str> {
        Cow::Borrowed(TRAINER_VERSION)
    }

    fn plural(kind: &RuntimeKind) -> Cow<'_, str> {
        Cow::Borrowed(kind.resource())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// JobSet mode: the reconciler watches labelled JobSets with `Api<JobSet>`.
impl Resource for JobSet {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("JobSet")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(JOBSET_GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1alpha2")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("jobsets")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_match_the_trainer_crds() {
        assert_eq!(
            TrainJob::url_path(&(), Some("ns")),
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs"
        );
        assert_eq!(
            TrainingRuntime::url_path(&RuntimeKind::TrainingRuntime, Some("ns")),
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainingruntimes"
        );
        assert_eq!(
            TrainingRuntime::url_path(&RuntimeKind::ClusterTrainingRuntime, None),
            "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
        );
        assert_eq!(
            JobSet::url_path(&(), Some("ns")),
            "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets"
        );
    }
}
