//! The resources the fake server serves, by their REST names.

/// A resource the fake server serves.
#[derive(Debug)]
pub struct Kind {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name (the REST path segment).
    pub plural: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
}

impl Kind {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// TrainJobs.
pub const TRAINJOBS: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "trainjobs",
    kind: "TrainJob",
    namespaced: true,
};
/// TrainingRuntimes.
pub const TRAINING_RUNTIMES: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "trainingruntimes",
    kind: "TrainingRuntime",
    namespaced: true,
};
/// ClusterTrainingRuntimes.
pub const CLUSTER_RUNTIMES: &Kind = &Kind {
    group: "trainer.kubeflow.org",
    version: "v1alpha1",
    plural: "clustertrainingruntimes",
    kind: "ClusterTrainingRuntime",
    namespaced: false,
};
/// JobSets (JobSet mode).
pub const JOBSETS: &Kind = &Kind {
    group: "jobset.x-k8s.io",
    version: "v1alpha2",
    plural: "jobsets",
    kind: "JobSet",
    namespaced: true,
};
/// Secrets.
pub const SECRETS: &Kind = &Kind {
    group: "",
    version: "v1",
    plural: "secrets",
    kind: "Secret",
    namespaced: true,
};
/// ConfigMaps.
pub const CONFIGMAPS: &Kind = &Kind {
    group: "",
    version: "v1",
    plural: "configmaps",
    kind: "ConfigMap",
    namespaced: true,
};
/// NetworkPolicies (networking.k8s.io). Stored and served like any other object: the
/// fake enforces no traffic rules (that is the network plugin's job, not the API server's).
pub const NETWORK_POLICIES: &Kind = &Kind {
    group: "networking.k8s.io",
    version: "v1",
    plural: "networkpolicies",
    kind: "NetworkPolicy",
    namespaced: true,
};
/// Events (events.k8s.io).
pub const EVENTS: &Kind = &Kind {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    kind: "Event",
    namespaced: true,
};

/// Leases (`reconcile --leader-elect`).
pub const LEASES: &Kind = &Kind {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    kind: "Lease",
    namespaced: true,
};

/// Every resource of `src/api_calls.rs` for `reconcile`.
pub const KINDS: &[&Kind] = &[
    LEASES,
    TRAINJOBS,
    TRAINING_RUNTIMES,
    CLUSTER_RUNTIMES,
    JOBSETS,
    SECRETS,
    CONFIGMAPS,
    NETWORK_POLICIES,
    EVENTS,
];

/// The resource (plural) of `kind` in `group`, for owner references.
pub fn resource_of(group: &str, kind: &str) -> Option<&'static str> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.kind == kind)
        .map(|k| k.plural)
}
