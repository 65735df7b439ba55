//! The shipped RBAC (`manifests/base/rbac.yaml`) against the real apiserver's authorizer: what
//! the ServiceAccount `mpi-webhook` may do is what `src/api_calls.rs` lists, verb for verb, and
//! above all it can read no Secret (Decision 22). Asked with SubjectAccessReviews (as the
//! admin, for the ServiceAccount's user and groups) and, for Secrets, with requests made as it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams, WatchParams};
use kube::{Client, ResourceExt};
use mpi_webhook::api_calls::API_CALLS;
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::control_plane::{self, RECONCILER, User};
use crate::support::install;

/// Every verb RBAC knows for a resource.
const VERBS: [&str; 8] = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];
/// The namespace the shipped manifests install into, and the Lease the reconciler elects with.
const OWN_NAMESPACE: &str = "mpi-webhook";
const LEASE: &str = "mpi-webhook-reconciler";

/// Where a permission is asked for: a namespace (`None`: every namespace, or a cluster-scoped
/// resource) and an object's name.
#[derive(Clone, Copy)]
struct At<'a> {
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

const EVERYWHERE: At<'static> = At {
    namespace: None,
    name: None,
};

/// The authorizer's answer for `user` doing `verb` on `group`/`resource` (which may name a
/// subresource, `trainjobs/finalizers`) `at`.
async fn allowed(
    admin: &Client,
    user: User,
    verb: &str,
    group: &str,
    resource: &str,
    at: At<'_>,
) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_string())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.to_string()),
            groups: Some(user.groups.iter().map(|g| (*g).to_string()).collect()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource,
                namespace: at.namespace.map(String::from),
                name: at.name.map(String::from),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answered = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SubjectAccessReview {verb} {group}/{resource}: {e}"));
    answered.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn the_shipped_service_account_may_create_secrets_and_never_read_one() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    install(plane).await;
    let admin = plane.admin();
    let ns = plane.namespace("authorizer").await;
    let in_ns = At {
        namespace: Some(&ns),
        name: None,
    };
    let named = At {
        namespace: Some(&ns),
        name: Some("pi-mpi-ssh-auth"),
    };
    for at in [EVERYWHERE, in_ns, named] {
        for verb in ["get", "list", "watch"] {
            assert!(
                !allowed(&admin, RECONCILER, verb, "", "secrets", at).await,
                "{verb} secrets in {:?} named {:?} is allowed",
                at.namespace,
                at.name
            );
        }
    }
    assert!(allowed(&admin, RECONCILER, "create", "", "secrets", EVERYWHERE).await);
    assert!(allowed(&admin, RECONCILER, "create", "", "secrets", in_ns).await);

    // The same asked by requests made as the ServiceAccount: a Secret the admin made is
    // refused to it, listed or read; a create of its own is allowed.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    let theirs: Secret = serde_json::from_value(json!({
        "metadata": {"name": "registry-credentials"},
        "stringData": {"token": "not for mpi-webhook"}
    }))
    .expect("Secret");
    secrets
        .create(&PostParams::default(), &theirs)
        .await
        .expect("the admin creates a Secret");
    let client = plane.client(RECONCILER).expect("client");
    let as_reconciler: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let refused = |result: Result<(), kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{what}: {status:?}"),
        other => panic!("{what}: not refused: {other:?}"),
    };
    refused(
        as_reconciler.get("registry-credentials").await.map(drop),
        "get",
    );
    refused(
        as_reconciler.list(&ListParams::default()).await.map(drop),
        "list",
    );
    refused(
        Api::<Secret>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(drop),
        "list in every namespace",
    );
    refused(
        as_reconciler
            .watch(&WatchParams::default(), "0")
            .await
            .map(drop),
        "watch",
    );
    let ours: Secret = serde_json::from_value(json!({"metadata": {"name": "made-by-mpi-webhook"}}))
        .expect("Secret");
    let created = as_reconciler
        .create(&PostParams::default(), &ours)
        .await
        .expect("the ServiceAccount creates a Secret");
    assert_eq!(created.name_any(), "made-by-mpi-webhook");
}

/// Verb for verb, what the authorizer lets the ServiceAccount do on every resource
/// `src/api_calls.rs` names is what it lists there (serve's and reconcile's together: they share
/// the ServiceAccount), and nothing else.
#[tokio::test]
async fn the_authorizer_allows_exactly_the_verbs_of_api_calls() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    install(plane).await;
    let admin = plane.admin();
    let mut listed: BTreeMap<(&str, &str, bool), BTreeSet<&str>> = BTreeMap::new();
    for call in API_CALLS {
        listed
            .entry((call.group, call.resource, call.namespaced_to_own_namespace))
            .or_default()
            .extend(call.verbs.iter().copied());
    }
    let mut differences = Vec::new();
    for ((group, resource, own_namespace), verbs) in &listed {
        let at = if *own_namespace {
            At {
                namespace: Some(OWN_NAMESPACE),
                name: Some(LEASE),
            }
        } else {
            EVERYWHERE
        };
        for verb in VERBS {
            let allowed = allowed(&admin, RECONCILER, verb, group, resource, at).await;
            if allowed != verbs.contains(verb) {
                differences.push(format!(
                    "{verb} {group}/{resource}: authorizer {allowed}, api_calls {}",
                    !allowed
                ));
            }
        }
    }
    assert!(
        differences.is_empty(),
        "the shipped RBAC and src/api_calls.rs differ in the authorizer:\n{}",
        differences.join("\n")
    );
}
