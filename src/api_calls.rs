//! The one list of Kubernetes API calls mpi-webhook makes: every kube API call in the code must be
//! listed here, and the RBAC in `manifests/base/rbac.yaml` grants exactly these verbs (checked by
//! `tests/manifests.rs`). It also lists the permissions an admission plugin checks on our writes
//! (`trainjobs/finalizers`), each with its reason: they are what the calls need to succeed.
//!
//! Pure data, no I/O. `serve` and `reconcile` run as two containers of one pod, so they share the
//! ServiceAccount `mpi-webhook`; the manifests still split the grants into one ClusterRole (and, for
//! own-namespace calls, one Role) per component so each can be read and reviewed on its own.

/// One resource a component talks to, and the verbs it uses on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    /// The subcommand that makes the call: `"serve"` or `"reconcile"`.
    pub component: &'static str,
    /// API group; `""` is the core group.
    pub group: &'static str,
    /// Plural resource name, as RBAC spells it.
    pub resource: &'static str,
    /// RBAC verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`).
    pub verbs: &'static [&'static str],
    /// `true` when the call only ever targets the pod's own namespace (granted by a Role there);
    /// `false` when it targets any namespace or a cluster-scoped resource (granted by a ClusterRole).
    pub namespaced_to_own_namespace: bool,
}

/// The `serve` subcommand: the admission webhook server.
pub const SERVE: &str = "serve";
/// The `reconcile` subcommand: the reconciler sidecar.
pub const RECONCILE: &str = "reconcile";

/// A watch-backed read (get, list, watch) from any namespace: what every object cache needs.
const fn read(component: &'static str, group: &'static str, resource: &'static str) -> ApiCall {
    ApiCall {
        component,
        group,
        resource,
        verbs: &["get", "list", "watch"],
        namespaced_to_own_namespace: false,
    }
}

/// Every Kubernetes API call the code makes.
pub const API_CALLS: &[ApiCall] = &[
    // serve: watch-backed caches of TrainJobs and runtimes, GET on a cache miss.
    read(SERVE, "trainer.kubeflow.org", "trainjobs"),
    read(SERVE, "trainer.kubeflow.org", "trainingruntimes"),
    read(SERVE, "trainer.kubeflow.org", "clustertrainingruntimes"),
    // reconcile: the controller's primary watch and the runtime lookups.
    read(RECONCILE, "trainer.kubeflow.org", "trainjobs"),
    read(RECONCILE, "trainer.kubeflow.org", "trainingruntimes"),
    read(RECONCILE, "trainer.kubeflow.org", "clustertrainingruntimes"),
    // reconcile, JobSet mode: the controller's watch of JobSets labelled
    // mpi-webhook.io/implementation (label-selected list/watch; GET by the controller).
    read(RECONCILE, "jobset.x-k8s.io", "jobsets"),
    // The Secret and ConfigMap are owned by the JobSet with blockOwnerDeletion, which the
    // OwnerReferencesPermissionEnforcement admission plugin allows only to who may update the
    // owner's finalizers. No request goes to this subresource.
    ApiCall {
        component: RECONCILE,
        group: "jobset.x-k8s.io",
        resource: "jobsets/finalizers",
        verbs: &["update"],
        namespaced_to_own_namespace: false,
    },
    // reconcile: the label-selected watch of every JobSet's Pods
    // (`jobset.sigs.k8s.io/replicatedjob-name`), read only, to turn a failed `mpi-preflight`
    // init container (JobSet mode) into a PreflightFailed Event on its JobSet, a failed launcher
    // container into a LauncherFailed Event on its JobSet or TrainJob, and a worker lost while
    // its JobSet ran it into a WorkerLost Event (the JobSet's `get` above tells a loss from
    // JobSet's own teardown). It needs the Pods' statuses, so not metadata only; no request
    // reads one Pod, so no `get`. RBAC cannot narrow by label: the grant is every Pod's.
    ApiCall {
        component: RECONCILE,
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
        namespaced_to_own_namespace: false,
    },
    // The SSH Secret: a create, and nothing else (Decision 22). Created once and never changed
    // (immutable): no update, patch or delete. Never read either, not even its metadata: RBAC
    // cannot narrow a read by label, so any read grant would be every Secret of the cluster. An
    // existing one (ours, Kubeflow Trainer's, a user's) is recognised by the create's
    // AlreadyExists and used as is.
    ApiCall {
        component: RECONCILE,
        group: "",
        resource: "secrets",
        verbs: &["create"],
        namespaced_to_own_namespace: false,
    },
    // The hostfile ConfigMap is server-side applied (PATCH with field manager `mpi-webhook`; an
    // apply that creates the object also needs `create`). Label-selected list/watch. A GET only
    // when Kubeflow Trainer's manager refused our apply: its ConfigMap carries none of our labels
    // (so it is not in the cache), and the Warning Event names the size of its hostfile.
    ApiCall {
        component: RECONCILE,
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch", "create", "patch"],
        namespaced_to_own_namespace: false,
    },
    // The per-job NetworkPolicy `<name>-mpi` (when on) is server-side applied like the
    // ConfigMap (PATCH with field manager `mpi-webhook`; `create` for the apply that creates it),
    // and its label-selected list/watch feeds drift repair. It is read only through that cache:
    // no request reads one, so no `get`. Never deleted: no `delete`.
    ApiCall {
        component: RECONCILE,
        group: "networking.k8s.io",
        resource: "networkpolicies",
        verbs: &["list", "watch", "create", "patch"],
        namespaced_to_own_namespace: false,
    },
    // No call is made on this subresource: the OwnerReferencesPermissionEnforcement admission
    // plugin (OpenShift, hardened clusters) requires `update` on `<owner>/finalizers` from whoever
    // creates or applies an object whose ownerReference sets `blockOwnerDeletion: true`, as the
    // Secret and the ConfigMap do for their TrainJob. Without it those writes are refused there.
    ApiCall {
        component: RECONCILE,
        group: "trainer.kubeflow.org",
        resource: "trainjobs/finalizers",
        verbs: &["update"],
        namespaced_to_own_namespace: false,
    },
    // Events on TrainJobs and JobSets (kube-runtime Recorder: CREATE, then PATCH to count a
    // repeated one; a PreflightFailed or LauncherFailed Event is only created, under a name of
    // its own).
    ApiCall {
        component: RECONCILE,
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        namespaced_to_own_namespace: false,
    },
    // Leader election (kube-lease-manager): the Lease `mpi-webhook-reconciler` in the pod's own
    // namespace; GET, CREATE when absent, and PATCH (apply / strategic merge) to take and renew.
    ApiCall {
        component: RECONCILE,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "patch"],
        namespaced_to_own_namespace: true,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_names_a_known_component_and_verbs() {
        for call in API_CALLS {
            assert!(
                call.component == SERVE || call.component == RECONCILE,
                "{call:?}"
            );
            assert!(!call.verbs.is_empty(), "{call:?}");
        }
    }

    #[test]
    fn no_resource_is_listed_twice_for_one_component() {
        for (i, a) in API_CALLS.iter().enumerate() {
            for b in &API_CALLS[i + 1..] {
                assert!(
                    (a.component, a.group, a.resource) != (b.component, b.group, b.resource),
                    "{a:?} and {b:?}"
                );
            }
        }
    }
}
