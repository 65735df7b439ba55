//! The harness itself: the control plane authenticates, authorizes and serves CRDs as the
//! scenarios rely on.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use pretty_assertions::assert_eq;

use crate::control_plane::{self, NOBODY};

#[tokio::test]
async fn admin_works_in_a_namespace_of_its_own() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let ns = plane.namespace("harness").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(plane.admin(), &ns);
    // The apiserver's root CA publisher is not running: the namespace is empty.
    let listed = configmaps
        .list(&ListParams::default())
        .await
        .expect("admin lists");
    assert_eq!(listed.items.len(), 0);
}

#[tokio::test]
async fn a_user_without_a_role_is_forbidden_with_the_apiservers_words() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    let ns = plane.namespace("harness").await;
    let client = plane.client(NOBODY).expect("client");
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &ns);
    let err = configmaps
        .list(&ListParams::default())
        .await
        .expect_err("forbidden");
    let kube::Error::Api(status) = err else {
        panic!("not an API error: {err}");
    };
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        format!(
            "configmaps is forbidden: User \"envtest-nobody\" cannot list resource \
             \"configmaps\" in API group \"\" in the namespace \"{ns}\""
        )
    );
}

#[tokio::test]
async fn the_upstream_crds_are_established() {
    let Some(plane) = control_plane::shared().await else {
        return;
    };
    plane
        .apply_crds(&[
            "tests/fixtures/upstream/jobset/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
            "tests/fixtures/upstream/kubeflow-trainer/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
        ])
        .await;
}
