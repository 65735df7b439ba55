//! The per-job NetworkPolicy: only the job's own pods may reach its pods, so on a
//! shared cluster no other pod can connect to the workers' sshd. Pure.
//!
//! The policy selects the job's pods by the label JobSet puts on every pod it creates,
//! `jobset.sigs.k8s.io/jobset-name`, and allows ingress to them only from pods carrying the
//! same label value, on every port. Only `Ingress` is listed in `policyTypes`, so egress stays
//! as it was. Enforcing it is the network plugin's job.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{JOBSET_NAME_LABEL, Owner, network_policy_name, owned_metadata};

/// The NetworkPolicy `<owner>-mpi`, owned by the TrainJob or JobSet like the Secret and the
/// ConfigMap. The JobSet's name is the owner's in both modes: a JobSet-mode JobSet is the owner,
/// and the JobSet Kubeflow Trainer builds for a TrainJob carries the TrainJob's name.
pub fn network_policy(owner: impl Into<Owner>) -> NetworkPolicy {
    let owner = owner.into();
    let own_pods = || LabelSelector {
        match_labels: Some(BTreeMap::from([(
            JOBSET_NAME_LABEL.to_string(),
            owner.name.clone(),
        )])),
        ..LabelSelector::default()
    };
    NetworkPolicy {
        metadata: owned_metadata(&owner, network_policy_name(&owner.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(own_pods()),
            policy_types: Some(vec!["Ingress".to_string()]),
            // One rule, no ports: every port, from the job's own pods only.
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    pod_selector: Some(own_pods()),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: None,
            }]),
            // No egress rules and no `Egress` policy type: egress is untouched.
            egress: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn owner(kind: &'static str, api_version: &'static str) -> Owner {
        Owner {
            api_version,
            kind,
            name: "pi".into(),
            namespace: "team".into(),
            uid: "uid-1".into(),
        }
    }

    #[test]
    fn the_policy_admits_only_the_jobs_own_pods_and_leaves_egress_alone() {
        let policy = network_policy(owner("JobSet", "jobset.x-k8s.io/v1alpha2"));
        assert_eq!(
            serde_json::to_value(&policy).expect("json"),
            json!({
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {
                    "name": "pi-mpi",
                    "namespace": "team",
                    "labels": {"app.kubernetes.io/managed-by": "mpi-webhook"},
                    "ownerReferences": [{
                        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "pi",
                        "uid": "uid-1", "controller": true, "blockOwnerDeletion": true
                    }]
                },
                "spec": {
                    "podSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pi"}},
                    "policyTypes": ["Ingress"],
                    "ingress": [{"from": [{"podSelector": {
                        "matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pi"}}}]}]
                }
            })
        );
    }

    #[test]
    fn a_trainjobs_policy_selects_the_jobset_trainer_builds_and_is_owned_by_the_trainjob() {
        let policy = network_policy(owner("TrainJob", "trainer.kubeflow.org/v1alpha1"));
        let value = serde_json::to_value(&policy).expect("json");
        assert_eq!(
            value["spec"]["podSelector"],
            json!({"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pi"}})
        );
        assert_eq!(
            value["metadata"]["ownerReferences"][0]["kind"],
            json!("TrainJob")
        );
    }
}
