//! The fake API server's own tests: ownership, conflicts, force, removal, resourceVersion, and
//! the OwnerReferencesPermissionEnforcement check, against what the real API server does.

use hyper::StatusCode;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_apiserver::authz::{Attributes, Authorizer, owner_references_permission};
use crate::fake_apiserver::*;

fn key() -> Key {
    ("team".into(), "pi-mpi-hostfile".into())
}

fn owner() -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "pi",
           "uid": "uid-1", "controller": true, "blockOwnerDeletion": true})
}

fn configmap(hostfile: &str, labels: Option<Value>) -> Value {
    let mut metadata = json!({"name": "pi-mpi-hostfile", "namespace": "team",
                              "ownerReferences": [owner()]});
    if let Some(labels) = labels {
        metadata["labels"] = labels;
    }
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
           "data": {"hostfile": hostfile}})
}

fn ours(hostfile: &str) -> Value {
    configmap(
        hostfile,
        Some(json!({"app.kubernetes.io/managed-by": "mpi-webhook"})),
    )
}

fn rv(object: &Value) -> &str {
    str_at(object, "/metadata/resourceVersion").unwrap_or_default()
}

/// `(manager, operation, fieldsV1)` of each managedFields entry.
fn managers(object: &Value) -> Vec<(String, String, Value)> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["manager"].as_str().unwrap_or_default().to_string(),
                e["operation"].as_str().unwrap_or_default().to_string(),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

#[test]
fn apply_records_ownership_as_fields_v1() {
    let api = FakeApi::new();
    let (object, created) = api
        .apply(CONFIGMAPS, key(), ours("a\n"), "mpi-webhook", false)
        .expect("apply");
    assert!(created);
    assert_eq!(
        managers(&object),
        [(
            "mpi-webhook".into(),
            "Apply".into(),
            json!({"f:data": {"f:hostfile": {}},
                   "f:metadata": {"f:labels": {"f:app.kubernetes.io/managed-by": {}},
                                  "f:ownerReferences": {"k:{\"uid\":\"uid-1\"}": {
                                      ".": {}, "f:apiVersion": {}, "f:blockOwnerDeletion": {},
                                      "f:controller": {}, "f:kind": {}, "f:name": {},
                                      "f:uid": {}}}}})
        )]
    );
    assert_eq!(object["data"], json!({"hostfile": "a\n"}));
}

#[test]
fn same_values_are_shared_and_a_repeated_apply_keeps_the_resource_version() {
    let api = FakeApi::new();
    let (first, _) = api
        .apply(CONFIGMAPS, key(), configmap("a\n", None), "trainer", true)
        .expect("trainer");
    let (second, _) = api
        .apply(CONFIGMAPS, key(), ours("a\n"), "mpi-webhook", false)
        .expect("same text: no conflict");
    assert_ne!(rv(&first), rv(&second), "our label and ownership are new");
    let names: Vec<String> = managers(&second).into_iter().map(|m| m.0).collect();
    assert_eq!(names, ["trainer", "mpi-webhook"]);
    let (again, _) = api
        .apply(CONFIGMAPS, key(), configmap("a\n", None), "trainer", true)
        .expect("trainer again");
    let (ours_again, _) = api
        .apply(CONFIGMAPS, key(), ours("a\n"), "mpi-webhook", false)
        .expect("ours again");
    assert_eq!((rv(&again), rv(&ours_again)), (rv(&second), rv(&second)));
    assert_eq!(api.objects(CONFIGMAPS).len(), 1);
}

#[test]
fn a_different_value_conflicts_as_the_api_server_words_it() {
    let api = FakeApi::new();
    api.apply(CONFIGMAPS, key(), configmap("a\n", None), "trainer", true)
        .expect("trainer");
    let error = api
        .apply(CONFIGMAPS, key(), ours("b\n"), "mpi-webhook", false)
        .expect_err("conflict");
    assert_eq!(
        error.status(),
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
               "message": "Apply failed with 1 conflict: conflict with \"trainer\": .data.hostfile",
               "reason": "Conflict", "code": 409,
               "details": {"causes": [{"reason": "FieldManagerConflict",
                                       "message": "conflict with \"trainer\"",
                                       "field": ".data.hostfile"}]}})
    );
    let stored = api.get(CONFIGMAPS, &key()).expect("stored");
    assert_eq!(stored["data"]["hostfile"], "a\n");
}

#[test]
fn several_conflicts_are_grouped_by_manager_and_an_updater_is_named_with_its_version() {
    let api = FakeApi::new();
    api.apply(CONFIGMAPS, key(), ours("a\n"), "mpi-webhook", false)
        .expect("ours");
    api.merge_patch(
        CONFIGMAPS,
        key(),
        &json!({"data": {"hostfile": "edited\n"}}),
        "kubectl-edit",
    )
    .expect("edit");
    let mut other = ours("c\n");
    other["metadata"]["labels"]["app.kubernetes.io/managed-by"] = json!("me");
    let error = api
        .apply(CONFIGMAPS, key(), other, "other", false)
        .expect_err("conflicts");
    assert_eq!(
        error.message,
        "Apply failed with 2 conflicts: conflicts with \"kubectl-edit\" using v1:\n\
         - .data.hostfile\nconflicts with \"mpi-webhook\":\n\
         - .metadata.labels.app.kubernetes.io/managed-by"
    );
    assert_eq!(
        error.details.expect("details")["causes"][0]["message"],
        "conflict with \"kubectl-edit\" using v1"
    );
}

#[test]
fn force_takes_the_field_and_the_loser_keeps_the_rest() {
    let api = FakeApi::new();
    api.apply(CONFIGMAPS, key(), ours("a\n"), "mpi-webhook", false)
        .expect("ours");
    let edited = api
        .merge_patch(
            CONFIGMAPS,
            key(),
            &json!({"data": {"hostfile": "edited\n"}}),
            "kubectl-edit",
        )
        .expect("edit");
    assert_eq!(
        managers(&edited)[1],
        (
            "kubectl-edit".into(),
            "Update".into(),
            json!({"f:data": {"f:hostfile": {}}})
        )
    );
    let (repaired, _) = api
        .apply(CONFIGMAPS, key(), ours("a\n"), "mpi-webhook", true)
        .expect("forced");
    assert_eq!(repaired["data"]["hostfile"], "a\n");
    let names: Vec<String> = managers(&repaired).into_iter().map(|m| m.0).collect();
    assert_eq!(names, ["mpi-webhook"], "kubectl-edit owned nothing else");
}

#[test]
fn a_field_the_applier_stops_setting_is_removed_unless_another_manager_owns_it() {
    let api = FakeApi::new();
    let mut two = ours("a\n");
    two["data"]["extra"] = json!("x");
    two["metadata"]["labels"]["team"] = json!("blue");
    api.apply(CONFIGMAPS, key(), two, "mpi-webhook", false)
        .expect("two keys");
    let (one, _) = api
        .apply(CONFIGMAPS, key(), ours("a\n"), "mpi-webhook", false)
        .expect("one key");
    assert_eq!(one["data"], json!({"hostfile": "a\n"}));
    assert_eq!(
        one["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "mpi-webhook"})
    );

    // Shared with Trainer: our dropping it leaves it.
    api.apply(CONFIGMAPS, key(), configmap("a\n", None), "trainer", false)
        .expect("trainer shares the text");
    let mut bare = ours("a\n");
    bare.as_object_mut().expect("object").remove("data");
    let (left, _) = api
        .apply(CONFIGMAPS, key(), bare, "mpi-webhook", false)
        .expect("no data");
    assert_eq!(left["data"], json!({"hostfile": "a\n"}));
    // Nobody else owns the label: an empty labels map is gone too.
    let mut unlabelled = configmap("a\n", None);
    unlabelled.as_object_mut().expect("object").remove("data");
    let (gone, _) = api
        .apply(CONFIGMAPS, key(), unlabelled, "mpi-webhook", false)
        .expect("no label");
    assert_eq!(gone["metadata"].get("labels"), None);
}

#[test]
fn a_no_op_merge_patch_keeps_the_resource_version() {
    let api = FakeApi::new();
    let created = api
        .create(CONFIGMAPS, Some("team"), ours("a\n"), "mpi-webhook")
        .expect("create");
    let patched = api
        .merge_patch(
            CONFIGMAPS,
            key(),
            &json!({"data": {"hostfile": "a\n"}}),
            "kubectl-edit",
        )
        .expect("patch");
    assert_eq!(rv(&patched), rv(&created));
    assert_eq!(
        managers(&patched)
            .into_iter()
            .map(|m| (m.0, m.1))
            .collect::<Vec<_>>(),
        [("mpi-webhook".to_string(), "Update".to_string())]
    );
}

fn lease_key() -> Key {
    ("mpi-webhook".into(), "mpi-webhook-reconciler".into())
}

/// An apply of `holder` as kube-lease-manager sends it: no `metadata` at all.
fn lease_lock(holder: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                    "renewTime": "2026-01-01T00:00:00.000000Z"}})
}

#[test]
fn a_stale_resource_version_in_a_patch_or_apply_is_a_conflict() {
    let api = FakeApi::new();
    let created = api
        .create(
            LEASES,
            Some("mpi-webhook"),
            json!({"metadata": {"name": "mpi-webhook-reconciler"}, "spec": {}}),
            "kube-lease-manager-a",
        )
        .expect("create");
    let stale = rv(&created).to_string();
    let patched = api
        .merge_patch(
            LEASES,
            lease_key(),
            &json!({"metadata": {"resourceVersion": stale}, "spec": {"leaseDurationSeconds": 15}}),
            "kube-lease-manager-a",
        )
        .expect("a patch at the current resourceVersion");
    assert_ne!(rv(&patched), stale);
    let message = "Operation cannot be fulfilled on leases.coordination.k8s.io \
                   \"mpi-webhook-reconciler\": the object has been modified; please apply your \
                   changes to the latest version and try again";
    let error = api
        .merge_patch(
            LEASES,
            lease_key(),
            &json!({"metadata": {"resourceVersion": stale}, "spec": {"leaseDurationSeconds": 5}}),
            "kube-lease-manager-b",
        )
        .expect_err("refused");
    assert_eq!(
        (error.code, error.reason),
        (StatusCode::CONFLICT, "Conflict")
    );
    assert_eq!(error.message, message);
    let mut apply = lease_lock("b");
    apply["metadata"] = json!({"resourceVersion": stale});
    let error = api
        .apply(LEASES, lease_key(), apply, "kube-lease-manager-b", true)
        .expect_err("refused");
    assert_eq!(
        (error.code, error.message.as_str()),
        (StatusCode::CONFLICT, message)
    );
    assert_eq!(
        api.get(LEASES, &lease_key()).expect("the Lease")["spec"],
        json!({"leaseDurationSeconds": 15})
    );
}

/// The calls kube-lease-manager makes: lock by a nameless apply, a second applier conflicts on
/// holderIdentity, release by a merge patch of nulls, then the second applier locks.
#[test]
fn a_lease_is_locked_by_apply_and_released_by_a_patch_of_nulls() {
    let api = FakeApi::new();
    api.create(
        LEASES,
        Some("mpi-webhook"),
        json!({"metadata": {"name": "mpi-webhook-reconciler"}, "spec": {}}),
        "kube-lease-manager-a",
    )
    .expect("create");
    let (locked, created) = api
        .apply(
            LEASES,
            lease_key(),
            lease_lock("a"),
            "kube-lease-manager-a",
            false,
        )
        .expect("lock");
    assert!(!created);
    assert_eq!(
        str_at(&locked, "/metadata/name"),
        Some("mpi-webhook-reconciler")
    );
    assert_eq!(str_at(&locked, "/spec/holderIdentity"), Some("a"));
    let error = api
        .apply(
            LEASES,
            lease_key(),
            lease_lock("b"),
            "kube-lease-manager-b",
            false,
        )
        .expect_err("refused");
    assert_eq!(error.code, StatusCode::CONFLICT);
    assert!(
        error.message.contains(".spec.holderIdentity"),
        "{}",
        error.message
    );

    let released = api
        .merge_patch(
            LEASES,
            lease_key(),
            &json!({"spec": {"acquireTime": null, "renewTime": null, "holderIdentity": null,
                             "leaseDurationSeconds": null}}),
            "kube-lease-manager-a",
        )
        .expect("release");
    assert_eq!(released["spec"], json!({}));
    let (locked, _) = api
        .apply(
            LEASES,
            lease_key(),
            lease_lock("b"),
            "kube-lease-manager-b",
            false,
        )
        .expect("the released Lease is free");
    assert_eq!(str_at(&locked, "/spec/holderIdentity"), Some("b"));

    let mut renamed = lease_lock("b");
    renamed["metadata"] = json!({"name": "other"});
    let error = api
        .apply(LEASES, lease_key(), renamed, "kube-lease-manager-b", false)
        .expect_err("refused");
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            StatusCode::BAD_REQUEST,
            "the name of the object (other) does not match the name on the URL \
             (mpi-webhook-reconciler)"
        )
    );
}

fn create_attributes() -> Attributes<'static> {
    Attributes {
        verb: "create",
        group: "",
        resource: "configmaps",
        subresource: "",
        namespace: Some("team"),
        name: Some("pi-mpi-hostfile"),
    }
}

#[test]
fn the_shipped_rbac_grants_the_reconciler_its_calls_and_nothing_else() {
    let rbac = Authorizer::shipped();
    assert!(rbac.allows(&create_attributes()));
    let finalizers = Attributes {
        verb: "update",
        group: "trainer.kubeflow.org",
        resource: "trainjobs",
        subresource: "finalizers",
        ..create_attributes()
    };
    assert!(rbac.allows(&finalizers));
    let delete = Attributes {
        verb: "delete",
        ..create_attributes()
    };
    assert!(!rbac.allows(&delete));
    assert_eq!(
        Authorizer::forbidden(&delete).message,
        "configmaps \"pi-mpi-hostfile\" is forbidden: User \
         \"system:serviceaccount:mpi-webhook:mpi-webhook\" cannot delete resource \
         \"configmaps\" in API group \"\" in the namespace \"team\""
    );
}

#[test]
fn block_owner_deletion_needs_update_on_the_owners_finalizers() {
    let rbac = Authorizer::shipped();
    let check = |rbac: &Authorizer, new: &Value, old: Option<&Value>| {
        owner_references_permission(rbac, &create_attributes(), new, old, &resource_of)
    };
    assert!(check(&rbac, &ours("a\n"), None).is_ok());
    let without = Authorizer::shipped().without(|g| g.resource == "trainjobs/finalizers");
    let error = check(&without, &ours("a\n"), None).expect_err("refused");
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            StatusCode::FORBIDDEN,
            "configmaps \"pi-mpi-hostfile\" is forbidden: cannot set blockOwnerDeletion if an \
             ownerReference refers to a resource you can't set finalizers on: , <nil>"
        )
    );
    // Unchanged owner references (a re-apply) are not checked again.
    assert!(check(&without, &ours("b\n"), Some(&ours("a\n"))).is_ok());
    // Without blockOwnerDeletion nothing is needed on create.
    let mut plain = ours("a\n");
    plain["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = json!(false);
    assert!(check(&without, &plain, None).is_ok());
}

// ---------------------------------------------------------------------------------------------
// NetworkPolicies and garbage collection

fn train_job() -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "pi", "namespace": "team", "uid": "uid-1"}})
}

fn network_policy(owners: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "pi-mpi", "namespace": "team", "ownerReferences": owners,
                        "labels": {"app.kubernetes.io/managed-by": "mpi-webhook"}},
           "spec": {"podSelector": {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "pi"}},
                    "policyTypes": ["Ingress"]}})
}

fn policy_key() -> Key {
    ("team".into(), "pi-mpi".into())
}

#[test]
fn deleting_an_owner_collects_its_dependents_and_nothing_else() {
    let api = FakeApi::new();
    api.create(TRAINJOBS, None, train_job(), "kubectl")
        .expect("owner");
    api.apply(CONFIGMAPS, key(), ours("h\n"), "mpi-webhook", false)
        .expect("ConfigMap");
    api.apply(
        NETWORK_POLICIES,
        policy_key(),
        network_policy(json!([owner()])),
        "mpi-webhook",
        false,
    )
    .expect("NetworkPolicy");
    // Not a dependent: no owner reference.
    let mut unowned = network_policy(json!([]));
    unowned["metadata"]["name"] = json!("other");
    api.create(NETWORK_POLICIES, None, unowned, "kubectl")
        .expect("unowned");

    let collected = api
        .delete(TRAINJOBS, &("team".into(), "pi".into()))
        .expect("deleted");
    assert_eq!(
        collected,
        [("configmaps", key()), ("networkpolicies", policy_key())]
    );
    assert!(api.get(NETWORK_POLICIES, &policy_key()).is_err());
    assert!(api.get(CONFIGMAPS, &key()).is_err());
    assert_eq!(api.count(NETWORK_POLICIES), 1, "the unowned one stays");
    let error = api
        .delete(TRAINJOBS, &("team".into(), "pi".into()))
        .expect_err("gone");
    assert_eq!(error.status()["code"], 404);
}

#[test]
fn an_owner_of_the_same_name_but_another_uid_does_not_keep_a_dependent() {
    let api = FakeApi::new();
    let mut stale = owner();
    stale["uid"] = json!("uid-0");
    api.create(TRAINJOBS, None, train_job(), "kubectl")
        .expect("owner");
    api.create(
        NETWORK_POLICIES,
        None,
        network_policy(json!([stale])),
        "kubectl",
    )
    .expect("dependent of an owner long gone");
    // Any deletion runs the collector, which finds the dependent's owner absent.
    let mut keep = train_job();
    keep["metadata"]["name"] = json!("keep");
    keep["metadata"]["uid"] = json!("uid-keep");
    api.create(TRAINJOBS, None, keep, "kubectl").expect("keep");
    let collected = api
        .delete(TRAINJOBS, &("team".into(), "keep".into()))
        .expect("deleted");
    assert_eq!(collected, [("networkpolicies", policy_key())]);
}

#[test]
fn a_dependent_with_an_owner_left_only_loses_the_dangling_reference() {
    let api = FakeApi::new();
    api.create(TRAINJOBS, None, train_job(), "kubectl")
        .expect("owner");
    let mut second = train_job();
    second["metadata"]["name"] = json!("second");
    second["metadata"]["uid"] = json!("uid-2");
    api.create(TRAINJOBS, None, second, "kubectl")
        .expect("second owner");
    let second_ref = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                            "name": "second", "uid": "uid-2"});
    api.create(
        NETWORK_POLICIES,
        None,
        network_policy(json!([owner(), second_ref])),
        "kubectl",
    )
    .expect("two owners");
    let collected = api
        .delete(TRAINJOBS, &("team".into(), "pi".into()))
        .expect("deleted");
    assert_eq!(collected, Vec::<(&str, Key)>::new());
    let kept = api.get(NETWORK_POLICIES, &policy_key()).expect("kept");
    assert_eq!(kept["metadata"]["ownerReferences"], json!([second_ref]));
    // The collector's patch only removed a field: as on the API server, nobody owns it any
    // more and the collector, owning nothing, has no entry.
    let fields = serde_json::to_string(&kept["metadata"]["managedFields"]).expect("json");
    assert!(!fields.contains("uid-1"), "{fields}");
    assert!(fields.contains("uid-2"), "{fields}");
    assert!(!fields.contains(GC_MANAGER), "{fields}");
}

#[test]
fn the_shipped_rbac_lets_the_reconciler_apply_network_policies_but_never_delete_them() {
    let rbac = Authorizer::shipped();
    let on_policy = |verb| Attributes {
        verb,
        group: "networking.k8s.io",
        resource: "networkpolicies",
        subresource: "",
        namespace: Some("team"),
        name: Some("pi-mpi"),
    };
    for verb in ["get", "create", "patch"] {
        assert!(rbac.allows(&on_policy(verb)), "{verb}");
    }
    for verb in ["list", "watch"] {
        let all = Attributes {
            namespace: None,
            name: None,
            ..on_policy(verb)
        };
        assert!(rbac.allows(&all), "{verb} in every namespace");
    }
    for verb in ["update", "delete"] {
        assert!(!rbac.allows(&on_policy(verb)), "{verb}");
    }
}
