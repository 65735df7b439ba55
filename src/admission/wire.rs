//! The fast read of an AdmissionReview: its bytes straight into kube's own request fields, the
//! object read as borrowed raw JSON text or straight into the view its route reads. Fields no
//! route reads (`requestKind`, `requestResource`, `options`, `oldObject`) are checked as kube
//! checks them and not kept.
//!
//! No `serde_json::Value` is built, which is most of what a review used to cost (issue 6). The
//! read is exactly as strict as kube's `AdmissionReview` on every field it accepts, and stricter
//! in two ways (a duplicate member, a malformed `apiVersion`/`kind`): anything it does not
//! accept goes down the general path ([`super::review`] falls back to the projection parse),
//! which gives the same answer the `review` command gives, error message included.

use std::borrow::Cow;

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::{GroupVersionKind, GroupVersionResource, TypeMeta};
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::REVIEW_API_VERSION;
use super::REVIEW_KIND;

/// An `admission.k8s.io/v1` AdmissionReview with a request whose object reads as `O` and old
/// object as `P`.
#[derive(Deserialize)]
#[serde(
    rename_all = "camelCase",
    bound(deserialize = "O: Deserialize<'de>, P: Deserialize<'de>")
)]
struct Review<'a, O, P> {
    #[serde(borrow)]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    request: Option<Request<'a, O, P>>,
    /// Never sent by the apiserver in a request; read only because kube's review type reads it.
    #[allow(dead_code)]
    response: Option<AdmissionResponse>,
}

/// kube's `AdmissionRequest`, field for field, with the object read as `O` and the old object
/// as `P` (`IgnoredAny` where the route does not read it).
#[derive(Deserialize)]
#[serde(
    rename_all = "camelCase",
    bound(deserialize = "O: Deserialize<'de>, P: Deserialize<'de>")
)]
struct Request<'a, O, P> {
    uid: String,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(borrow, default)]
    #[allow(dead_code)]
    request_kind: Option<KindCheck<'a>>,
    #[serde(borrow, default)]
    #[allow(dead_code)]
    request_resource: Option<ResourceCheck<'a>>,
    #[serde(default)]
    request_sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    user_info: UserInfo,
    #[serde(default)]
    object: Option<O>,
    #[serde(default)]
    old_object: Option<P>,
    #[serde(default)]
    dry_run: bool,
    /// Any JSON, as kube's `RawExtension` reads it; no route needs it.
    #[serde(default)]
    #[allow(dead_code)]
    options: Option<IgnoredAny>,
}

/// A `GroupVersionKind` no route reads: checked as kube reads it (three strings), not kept.
#[derive(Deserialize)]
#[allow(dead_code)]
struct KindCheck<'a> {
    #[serde(borrow)]
    group: Cow<'a, str>,
    #[serde(borrow)]
    version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
}

/// A `GroupVersionResource` no route reads: checked as kube reads it, not kept.
#[derive(Deserialize)]
#[allow(dead_code)]
struct ResourceCheck<'a> {
    #[serde(borrow)]
    group: Cow<'a, str>,
    #[serde(borrow)]
    version: Cow<'a, str>,
    #[serde(borrow)]
    resource: Cow<'a, str>,
    #[serde(borrow, default)]
    api_version: Cow<'a, str>,
}

/// The request of an `admission.k8s.io/v1` AdmissionReview, its object read as `O` (raw JSON,
/// or the view a route reads; `None` when absent or `null`) and its old object as `P`, or `None`
/// when the body is anything else: malformed, another kind, no request, or a shape this read
/// does not accept.
pub(super) fn read<'a, O: Deserialize<'a>, P: Deserialize<'a>>(
    body: &'a [u8],
) -> Option<(
    AdmissionRequest<kube::core::DynamicObject>,
    Option<O>,
    Option<P>,
)> {
    let review: Review<'a, O, P> = serde_json::from_slice(body).ok()?;
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
        request_kind: None,
        request_resource: None,
        request_sub_resource: r.request_sub_resource,
        name: r.name,
        namespace: r.namespace,
        operation: r.operation,
        user_info: r.user_info,
        object: None,
        old_object: None,
        dry_run: r.dry_run,
        options: None,
    };
    Some((request, r.object, r.old_object))
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;

    const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/samples/reviews");

    #[test]
    fn the_shipped_sample_reviews_take_the_fast_read() {
        for file in [
            "trainjob-create-allowed.json",
            "trainjob-create-denied-reserved-env.json",
            "jobset-create-owned-by-trainjob.json",
            "jobset-mode-create-openmpi.json",
            "jobset-mode-create-intel.json",
            "jobset-mode-create-mpich.json",
        ] {
            let body = std::fs::read(format!("{SAMPLES}/{file}")).expect("sample exists");
            let (request, object, _) = read::<&RawValue, IgnoredAny>(&body).expect(file);
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
        let (request, object, _) =
            read::<&RawValue, IgnoredAny>(body.as_bytes()).expect("a minimal request");
        assert_eq!(request.uid, "u");
        assert!(object.is_none(), "a null object is no object");
        let duplicate = ok.replace(r#""uid":"u","#, r#""uid":"u","uid":"v","#);
        assert!(read::<&RawValue, IgnoredAny>(review(&duplicate).as_bytes()).is_none());
        let no_user = ok.replace(r#""userInfo":{},"#, "");
        assert!(read::<&RawValue, IgnoredAny>(review(&no_user).as_bytes()).is_none());
        assert!(
            read::<&RawValue, IgnoredAny>(
                br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#
            )
            .is_none()
        );
        assert!(read::<&RawValue, IgnoredAny>(b"not json").is_none());
    }
}
