//! The fast read of an AdmissionReview: its bytes straight into kube's own request fields, the
//! object kept as borrowed raw JSON text for the route to read into the type it needs.
//!
//! No `serde_json::Value` is built, which is most of what a review used to cost (issue 6). The
//! read is exactly as strict as kube's `AdmissionReview` on every field it accepts, and stricter
//! in two ways (a duplicate member, a malformed `apiVersion`/`kind`): anything it does not
//! accept goes down the general path ([`super::review`] falls back to the projection parse),
//! which gives the same answer the `review` command gives, error message included.

use std::borrow::Cow;

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::{GroupVersionKind, GroupVersionResource, TypeMeta};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::REVIEW_API_VERSION;
use super::REVIEW_KIND;

/// An `admission.k8s.io/v1` AdmissionReview with a request.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review<'a> {
    #[serde(borrow)]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: Option<Request<'a>>,
    /// Never sent by the apiserver in a request; read only because kube's review type reads it.
    #[allow(dead_code)]
    response: Option<AdmissionResponse>,
}

/// kube's `AdmissionRequest`, field for field, with the objects borrowed as raw text.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    uid: String,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    request_resource: Option<GroupVersionResource>,
    #[serde(default)]
    request_sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    user_info: UserInfo,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    /// Read (as any JSON) and dropped: no route needs the old object.
    #[serde(borrow, default)]
    #[allow(dead_code)]
    old_object: Option<&'a RawValue>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    options: Option<RawExtension>,
}

/// The request of an `admission.k8s.io/v1` AdmissionReview and its object's raw JSON (`None`
/// when absent or `null`), or `None` when the body is anything else: malformed, another kind,
/// no request, or a shape this read does not accept.
pub(super) fn read(
    body: &[u8],
) -> Option<(
    AdmissionRequest<kube::core::DynamicObject>,
    Option<&RawValue>,
)> {
    let review: Review<'_> = serde_json::from_slice(body).ok()?;
    if (review.api_version.as_ref(), review.kind.as_ref()) != (REVIEW_API_VERSION, REVIEW_KIND) {
        return None;
    }
    let r = review.request?;
    let request = AdmissionRequest {
        types: TypeMeta {
            api_version: review.api_version.into_owned(),
            kind: review.kind.into_owned(),
        },
        uid: r.uid,
        kind: r.kind,
        resource: r.resource,
        sub_resource: r.sub_resource,
        request_kind: r.request_kind,
        request_resource: r.request_resource,
        request_sub_resource: r.request_sub_resource,
        name: r.name,
        namespace: r.namespace,
        operation: r.operation,
        user_info: r.user_info,
        object: None,
        old_object: None,
        dry_run: r.dry_run,
        options: r.options,
    };
    Some((request, r.object))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/samples/reviews");

    #[test]
    fn the_shipped_sample_reviews_take_the_fast_read() {
        for file in [
            "trainjob-create-allowed.json",
            "trainjob-create-denied-reserved-env.json",
            "jobset-create-owned-by-trainjob.json",
        ] {
            let body = std::fs::read(format!("{SAMPLES}/{file}")).expect("sample exists");
            let (request, object) = read(&body).expect(file);
            assert_eq!(request.types.api_version, REVIEW_API_VERSION);
            assert_eq!(request.operation, Operation::Create);
            assert!(object.is_some_and(|o| o.get().starts_with('{')), "{file}");
        }
    }

    #[test]
    fn what_the_fast_read_leaves_to_the_general_path() {
        let review = |request: &str| {
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
            )
        };
        let ok = r#"{"uid":"u","kind":{"group":"g","version":"v","kind":"K"},"resource":{"group":"g","version":"v","resource":"ks"},"operation":"CREATE","userInfo":{},"object":null}"#;
        let body = review(ok);
        let (request, object) = read(body.as_bytes()).expect("a minimal request");
        assert_eq!(request.uid, "u");
        assert!(object.is_none(), "a null object is no object");
        let duplicate = ok.replace(r#""uid":"u","#, r#""uid":"u","uid":"v","#);
        assert!(read(review(&duplicate).as_bytes()).is_none());
        let no_user = ok.replace(r#""userInfo":{},"#, "");
        assert!(read(review(&no_user).as_bytes()).is_none());
        assert!(
            read(br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#)
                .is_none()
        );
        assert!(read(b"not json").is_none());
    }
}
