//! The one read of an AdmissionReview: the body read once, its request into kube-core's
//! `AdmissionRequest` (the fields a route reads), the object and the old object into
//! `serde_json::Value`s (from their text, which the read of the review delimits), from which
//! each route reads the typed view it needs with [`object`]. Unknown fields are never lost.
//!
//! A body that is not an `admission.k8s.io/v1` AdmissionReview with a request is a
//! [`BadReview`] naming the field at fault; an object of the wrong shape is the route's denial,
//! naming the field within the object.

use std::borrow::Cow;

use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::{DynamicObject, GroupVersionKind, GroupVersionResource, TypeMeta};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::json_error::{self, TextError, Unreadable};

use super::{BadReview, REVIEW_API_VERSION, REVIEW_KIND};

/// A review's request: kube-core's `AdmissionRequest` with what the routes read of it, and the
/// object and the old object as JSON.
#[derive(Debug)]
pub struct Request {
    /// uid, kind, name, namespace and operation; the fields no route reads (resource, user
    /// info, ...) are checked to be there and left empty, and so are the objects, which are
    /// below, as JSON. What the response is built from (`AdmissionResponse::from`).
    pub request: AdmissionRequest<DynamicObject>,
    /// The object (`None` when absent or `null`).
    pub object: Option<Value>,
    /// The old object on UPDATE (`None` when absent or `null`).
    pub old_object: Option<Value>,
}

/// An AdmissionReview. `apiVersion` and `kind` are checked after the read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "O: Deserialize<'de>"))]
struct Review<'a, O> {
    #[serde(borrow, default)]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    request: Option<JsonObject<RequestFields<'a, O>>>,
    /// Never sent by the apiserver in a request.
    #[serde(default)]
    #[allow(dead_code)]
    response: Option<IgnoredAny>,
}

/// kube's `AdmissionRequest`, field for field: the members it requires are required here too;
/// those no route reads are checked to be there and skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "O: Deserialize<'de>"))]
#[allow(dead_code)]
struct RequestFields<'a, O> {
    #[serde(borrow)]
    uid: Cow<'a, str>,
    #[serde(borrow)]
    kind: Kind<'a>,
    resource: IgnoredAny,
    #[serde(default)]
    sub_resource: Option<IgnoredAny>,
    #[serde(default)]
    request_kind: Option<IgnoredAny>,
    #[serde(default)]
    request_resource: Option<IgnoredAny>,
    #[serde(default)]
    request_sub_resource: Option<IgnoredAny>,
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    operation: Operation,
    user_info: IgnoredAny,
    #[serde(default)]
    object: Option<O>,
    #[serde(default)]
    old_object: Option<O>,
    #[serde(default)]
    dry_run: Option<IgnoredAny>,
    #[serde(default)]
    options: Option<IgnoredAny>,
}

/// `request.kind`.
#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(borrow)]
    group: Cow<'a, str>,
    #[serde(borrow)]
    version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
}

/// A JSON object read as `T`, and nothing else: serde's derived structs would also read an
/// array, its elements taken as the fields in order.
struct JsonObject<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for JsonObject<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectVisitor<T> {
            type Value = JsonObject<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(JsonObject)
            }
        }
        deserializer.deserialize_map(ObjectVisitor(std::marker::PhantomData))
    }
}

/// An object as the read of a review takes it: a `Value` at once, or its text, parsed after.
trait Object<'a>: Deserialize<'a> {
    fn into_value(self) -> Result<Value, BadReview>;
}

impl Object<'_> for Value {
    fn into_value(self) -> Result<Value, BadReview> {
        Ok(self)
    }
}

impl<'a> Object<'a> for &'a RawValue {
    /// Valid JSON, read once already, nested less deeply than the review: it parses.
    fn into_value(self) -> Result<Value, BadReview> {
        serde_json::from_str(self.get()).map_err(|e| BadReview::NotJson(e.to_string()))
    }
}

/// Reads the request of an `admission.k8s.io/v1` AdmissionReview, in one pass.
///
/// # Errors
/// [`BadReview`] when the body is not JSON, not an object, not such a review, or has no request.
pub fn request(body: &[u8]) -> Result<Request, BadReview> {
    read::<Value>(body, |_| {})
}

/// [`request`], calling `on_uid` with the request's uid as soon as the review around the
/// objects is read, before the objects are parsed (the costly part of a large review): `serve`
/// answers a review whose deadline passes meanwhile with a denial naming that uid.
///
/// # Errors
/// As [`request`].
pub fn request_then(body: &[u8], on_uid: impl FnOnce(&str)) -> Result<Request, BadReview> {
    read::<&RawValue>(body, on_uid)
}

fn read<'a, O: Object<'a>>(
    body: &'a [u8],
    on_uid: impl FnOnce(&str),
) -> Result<Request, BadReview> {
    if !starts_an_object(body) {
        return Err(match serde_json::from_slice::<IgnoredAny>(body) {
            Ok(_) => BadReview::NotAnObject,
            Err(e) => BadReview::NotJson(e.to_string()),
        });
    }
    let Review::<O> {
        api_version,
        kind,
        request,
        ..
    } = json_error::read_text(body).map_err(|e| match e {
        TextError::Syntax(message) => BadReview::NotJson(message),
        TextError::Unreadable(e) => BadReview::Unreadable(e),
    })?;
    let api_version = api_version.as_deref().unwrap_or_default();
    let kind = kind.as_deref().unwrap_or_default();
    if (api_version, kind) != (REVIEW_API_VERSION, REVIEW_KIND) {
        return Err(BadReview::WrongKind {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        });
    }
    let Some(JsonObject(fields)) = request else {
        return Err(BadReview::NoRequest);
    };
    on_uid(&fields.uid);
    let object = fields.object.map(O::into_value).transpose()?;
    let old_object = fields.old_object.map(O::into_value).transpose()?;
    let request = AdmissionRequest {
        types: TypeMeta {
            api_version: REVIEW_API_VERSION.to_owned(),
            kind: REVIEW_KIND.to_owned(),
        },
        uid: fields.uid.into_owned(),
        kind: GroupVersionKind::gvk(&fields.kind.group, &fields.kind.version, &fields.kind.kind),
        resource: GroupVersionResource::gvr("", "", ""),
        sub_resource: None,
        request_kind: None,
        request_resource: None,
        request_sub_resource: None,
        name: fields.name.into_owned(),
        namespace: fields.namespace.map(Cow::into_owned),
        operation: fields.operation,
        user_info: Default::default(),
        object: None,
        old_object: None,
        dry_run: false,
        options: None,
    };
    Ok(Request {
        object,
        old_object,
        request,
    })
}

/// Whether the first non-blank byte opens a JSON object.
fn starts_an_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// Where the object sits in a review: what an error about the object as a whole names.
pub(crate) const OBJECT_FIELD: &str = "request.object";

/// Reads an object of the review as `T`.
///
/// # Errors
/// [`Unreadable`] naming the field within the object, or `request.object` for the object as a
/// whole (not a JSON object, a required member missing).
pub(crate) fn object<'a, T: Deserialize<'a>>(object: &'a Value) -> Result<T, Unreadable> {
    member(object, OBJECT_FIELD, "")
}

/// Reads `value`, which sits at `root` of the object and must be a JSON object, as `T`; a field
/// within it is named `prefix.field`.
///
/// # Errors
/// [`Unreadable`] naming the field.
pub(crate) fn member<'a, T: Deserialize<'a>>(
    value: &'a Value,
    root: &str,
    prefix: &str,
) -> Result<T, Unreadable> {
    if !value.is_object() {
        return Err(not_an_object(root, value));
    }
    json_error::read(value).map_err(|e| e.within(root, prefix))
}

/// The error for `value` at `root` where an object belongs.
pub(crate) fn not_an_object(root: &str, value: &Value) -> Unreadable {
    Unreadable {
        field: Some(root.to_owned()),
        message: format!(
            "invalid type: {}, expected a JSON object",
            json_error::type_name(value)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/samples/reviews");

    fn review(request: &str) -> String {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
        )
    }

    const MINIMAL: &str = r#"{"uid":"u","kind":{"group":"g","version":"v","kind":"K"},"resource":{"group":"g","version":"v","resource":"ks"},"operation":"CREATE","userInfo":{},"object":null}"#;

    #[test]
    fn the_shipped_sample_reviews_read() {
        for file in std::fs::read_dir(SAMPLES).expect("samples") {
            let path = file.expect("an entry").path();
            let body = std::fs::read(&path).expect("sample exists");
            let request = request(&body).expect("an AdmissionReview");
            assert_eq!(request.request.operation, Operation::Create, "{path:?}");
            assert!(request.object.is_some_and(|o| o.is_object()));
        }
    }

    #[test]
    fn a_minimal_request_reads_and_a_null_object_is_none() {
        let body = review(MINIMAL);
        let request = request(body.as_bytes()).expect("a minimal request");
        assert_eq!(request.request.uid, "u");
        assert_eq!(request.request.kind.kind, "K");
        assert!(request.object.is_none());
    }

    #[test]
    fn what_is_not_a_review_is_named() {
        let bad = |body: &str| match request(body.as_bytes()) {
            Ok(_) => panic!("{body} was read"),
            Err(bad) => bad.to_string(),
        };
        assert_eq!(
            bad(&review(&MINIMAL.replace(r#""userInfo":{},"#, ""))),
            "not an AdmissionReview: request: missing field `userInfo`"
        );
        assert_eq!(
            bad(&review(&MINIMAL.replace(r#""uid":"u""#, r#""uid":7"#))),
            "not an AdmissionReview: request.uid: invalid type: integer `7`, expected a string"
        );
        assert_eq!(
            bad(&review("[]")),
            "not an AdmissionReview: request: invalid type: sequence, expected a JSON object"
        );
        assert_eq!(bad("[1]"), "request body is not a JSON object");
        assert!(bad("{").starts_with("request body is not JSON: "));
    }

    #[test]
    fn an_object_is_read_naming_the_field_at_fault() {
        #[derive(Debug, Deserialize)]
        struct Spec {
            #[allow(dead_code)]
            replicas: i32,
        }
        #[derive(Debug, Deserialize)]
        struct Thing {
            #[allow(dead_code)]
            spec: Spec,
        }
        let error = |value: Value| object::<Thing>(&value).expect_err("unreadable").to_string();
        assert_eq!(
            error(serde_json::json!({"spec":{"replicas":"2"}})),
            r#"spec.replicas: invalid type: string "2", expected i32"#
        );
        assert_eq!(
            error(serde_json::json!({})),
            "request.object: missing field `spec`"
        );
        assert_eq!(
            error(serde_json::json!([1])),
            "request.object: invalid type: array, expected a JSON object"
        );
    }
}
