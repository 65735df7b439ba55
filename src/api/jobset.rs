//! The parts of a JobSet (`jobset.x-k8s.io/v1alpha2`) the MPI policy reads: replicated jobs,
//! their counts, labels, dependencies and containers' resources, and the network settings. A
//! runtime's `spec.template` is a JobSet template; a JobSet-mode JobSet is read whole.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::resources::ResourceRequirements;

/// `apiVersion` of JobSet.
pub const JOBSET_API_VERSION: &str = "jobset.x-k8s.io/v1alpha2";

/// A JobSet, as far as JobSet mode reads it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSet {
    /// Standard object metadata (name, namespace, uid, labels, annotations, owners).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The JobSet spec.
    #[serde(default)]
    pub spec: JobSetSpec,
}

impl JobSet {
    /// The first replicatedJob named `name`, with its index.
    pub fn replicated_job(&self, name: &str) -> Option<(usize, &ReplicatedJob)> {
        self.spec
            .replicated_jobs
            .iter()
            .enumerate()
            .find(|(_, rjob)| rjob.name == name)
    }
}

/// `spec.template` of a runtime: a JobSet template.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSetTemplateSpec {
    /// The JobSet spec.
    #[serde(default)]
    pub spec: JobSetSpec,
}

/// A JobSet spec, as far as it is read.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSetSpec {
    /// Replicated jobs in template order.
    #[serde(default)]
    pub replicated_jobs: Vec<ReplicatedJob>,
    /// Pod networking (subdomain).
    #[serde(default)]
    pub network: Option<Network>,
}

impl JobSetSpec {
    /// `spec.network.subdomain` when set and not empty: the pods' host name suffix, which
    /// otherwise is the JobSet's name.
    pub fn subdomain(&self) -> Option<&str> {
        self.network
            .as_ref()
            .and_then(|n| n.subdomain.as_deref())
            .filter(|s| !s.is_empty())
    }
}

/// `spec.network`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Headless Service name; defaults to the JobSet name.
    #[serde(default)]
    pub subdomain: Option<String>,
    /// Whether pods get DNS host names (JobSet's default: true).
    #[serde(default, rename = "enableDNSHostnames")]
    pub enable_dns_hostnames: Option<bool>,
}

/// One replicated job.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    /// Name (`launcher`, `node`, initializers, ...).
    #[serde(default)]
    pub name: String,
    /// Job replicas; CRD default 1.
    #[serde(default)]
    pub replicas: Option<i32>,
    /// The replicatedJobs this one waits for.
    #[serde(default)]
    pub depends_on: Option<Vec<DependsOn>>,
    /// The Job template.
    #[serde(default)]
    pub template: JobTemplate,
}

/// One entry of a replicatedJob's `dependsOn`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DependsOn {
    /// The replicatedJob waited for.
    #[serde(default)]
    pub name: String,
    /// `Ready` or `Complete`.
    #[serde(default)]
    pub status: String,
}

/// A batch/v1 JobTemplateSpec, reduced.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobTemplate {
    /// Job template metadata (the ancestor label lives here).
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// The Job spec.
    #[serde(default)]
    pub spec: JobSpec,
}

/// Labels of a template.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// A batch/v1 JobSpec, reduced.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// Pods run in parallel; default 1.
    #[serde(default)]
    pub parallelism: Option<i32>,
    /// Pods that must succeed; default: parallelism.
    #[serde(default)]
    pub completions: Option<i32>,
    /// The pod template.
    #[serde(default)]
    pub template: PodTemplate,
}

/// A PodTemplateSpec, reduced.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// The pod spec.
    #[serde(default)]
    pub spec: PodSpec,
}

/// A PodSpec, reduced.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// Containers.
    #[serde(default)]
    pub containers: Vec<Container>,
}

/// A container, reduced.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    /// Container name.
    #[serde(default)]
    pub name: String,
    /// Resources (GPU count).
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
}

impl ReplicatedJob {
    /// The value of a label on the Job template, if set.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.template
            .metadata
            .labels
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    /// The pod template's containers.
    pub fn containers(&self) -> &[Container] {
        &self.template.spec.template.spec.containers
    }

    /// Replicas with the CRD default 1.
    pub fn replicas(&self) -> i32 {
        self.replicas.unwrap_or(1)
    }
}
