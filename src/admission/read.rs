//! The one read of an AdmissionReview: its bytes straight into borrowed, typed fields, the
//! object (and the old object) kept as the client's raw JSON text, which each route then reads
//! into its own types with [`object`]. No `serde_json::Value` of the review is built.
//!
//! A body that is not an `admission.k8s.io/v1` AdmissionReview with a request is a
//! [`BadReview`] naming the field at fault; an object of the wrong shape is the route's denial,
//! naming the field within the object.

use std::borrow::Cow;

use kube::core::admission::Operation;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::mpi::enforce::JsonType;

use super::{BadReview, REVIEW_API_VERSION, REVIEW_KIND};

/// The request of a review, as the routes read it, its object read as `O`: raw JSON for the
/// validating routes, which read it into their types, or the view the mutation reads, in the
/// same pass as the review.
#[derive(Debug)]
pub(crate) struct Request<'a, O = &'a RawValue> {
    /// Echoed in the response.
    pub uid: Cow<'a, str>,
    /// The kind of the object.
    pub kind: Kind<'a>,
    /// Object name (may be empty on CREATE with generateName).
    pub name: Cow<'a, str>,
    /// Namespace, for namespaced objects.
    pub namespace: Option<Cow<'a, str>>,
    /// CREATE, UPDATE, ...
    pub operation: Operation,
    /// The object (`None` when absent or `null`).
    pub object: Option<O>,
    /// The old object on UPDATE, as raw JSON.
    pub old_object: Option<&'a RawValue>,
}

/// `request.kind`.
#[derive(Debug, Deserialize)]
pub(crate) struct Kind<'a> {
    #[serde(borrow)]
    pub group: Cow<'a, str>,
    #[serde(borrow)]
    pub version: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
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

/// kube's `AdmissionRequest`, field for field: the members it requires are required here too,
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
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
    #[serde(default)]
    dry_run: Option<IgnoredAny>,
    #[serde(default)]
    options: Option<IgnoredAny>,
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

/// Reads the request of an `admission.k8s.io/v1` AdmissionReview, its object as `O`.
///
/// # Errors
/// [`BadReview`] when the body is not JSON, not an object, not such a review, or has no request.
pub(crate) fn request<'a, O: Deserialize<'a>>(body: &'a [u8]) -> Result<Request<'a, O>, BadReview> {
    let review: Review<'a, O> = match starts_an_object(body) {
        true => read_explained(body).map_err(|e| match &e.syntax {
            Some(full) => BadReview(format!("request body is not JSON: {full}")),
            None => BadReview(e.at("not an AdmissionReview", "not an AdmissionReview: ")),
        })?,
        false => {
            return Err(BadReview(
                match serde_json::from_slice::<IgnoredAny>(body) {
                    Ok(_) => "request body is not a JSON object".to_string(),
                    Err(e) => format!("request body is not JSON: {e}"),
                },
            ));
        }
    };
    let api_version = review.api_version.as_deref().unwrap_or_default();
    let kind = review.kind.as_deref().unwrap_or_default();
    if (api_version, kind) != (REVIEW_API_VERSION, REVIEW_KIND) {
        return Err(BadReview(format!(
            "expected apiVersion \"{REVIEW_API_VERSION}\" and kind \"{REVIEW_KIND}\", got {api_version:?} and {kind:?}"
        )));
    }
    let Some(JsonObject(r)) = review.request else {
        return Err(BadReview("AdmissionReview has no request".into()));
    };
    Ok(Request {
        uid: r.uid,
        kind: r.kind,
        name: r.name,
        namespace: r.namespace,
        operation: r.operation,
        object: r.object,
        old_object: r.old_object,
    })
}

/// Where the object sits in a review: what an error about the object as a whole names.
pub(crate) const OBJECT_FIELD: &str = "request.object";

/// Reads an object of the review (its raw JSON) as `T`.
///
/// # Errors
/// The field path within the object and serde's message; `request.object` for an object that
/// is not a JSON object.
pub(crate) fn object<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Result<T, String> {
    read_object(raw, OBJECT_FIELD, "")
}

/// Reads the member `name` of the object (its raw JSON), itself a JSON object, as `T`.
///
/// # Errors
/// The field path (`name.path`) and serde's message.
pub(crate) fn member<'a, T: Deserialize<'a>>(raw: &'a RawValue, name: &str) -> Result<T, String> {
    read_object(raw, name, &format!("{name}."))
}

fn read_object<'a, T: Deserialize<'a>>(
    raw: &'a RawValue,
    root: &str,
    prefix: &str,
) -> Result<T, String> {
    let text = raw.get();
    if !starts_an_object(text.as_bytes()) {
        return Err(not_an_object(root, JsonType::of_text(text).name()));
    }
    read_explained(text.as_bytes()).map_err(|e| e.at(root, prefix))
}

/// The error for a value at `root` of JSON type `found` where an object belongs.
pub(crate) fn not_an_object(root: &str, found: &str) -> String {
    format!("{root}: invalid type: {found}, expected a JSON object")
}

/// Reads `bytes` as `T`. A failure is read again, tracking the path, to explain it.
fn read_explained<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ReadError> {
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(value) => deserializer
            .end()
            .map(|()| value)
            .map_err(|e| ReadError::new(".".into(), e)),
        Err(error) => Err(ReadError::new(error.path().to_string(), error.into_inner())),
    }
}

/// Why [`read_explained`] failed: where, and serde_json's error.
struct ReadError {
    /// The path of the field at fault, `.` for the document as a whole.
    path: String,
    /// serde_json's message without the line and column (a review is one line).
    message: String,
    /// serde_json's whole message, when the text is not JSON to serde_json. Within a value read
    /// whole before (an object's raw JSON) that happens too: a struct read from an array that
    /// has more elements than the struct fields ("trailing characters"), nesting deeper than
    /// serde_json reads; those are named by their path like any other error.
    syntax: Option<String>,
}

impl ReadError {
    fn new(path: String, error: serde_json::Error) -> Self {
        let full = error.to_string();
        let position = format!(" at line {} column {}", error.line(), error.column());
        Self {
            path,
            message: full.strip_suffix(&position).unwrap_or(&full).to_owned(),
            syntax: (error.is_syntax() || error.is_eof()).then_some(full),
        }
    }

    /// The message, naming `root` for an error about the document as a whole and prefixing
    /// `prefix` to any other path.
    fn at(&self, root: &str, prefix: &str) -> String {
        match self.path.as_str() {
            "." => format!("{root}: {}", self.message),
            path => format!("{prefix}{path}: {}", self.message),
        }
    }
}

/// Whether the first non-blank byte opens a JSON object.
fn starts_an_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
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
    fn the_shipped_sample_reviews_read_borrowed() {
        for file in std::fs::read_dir(SAMPLES).expect("samples") {
            let path = file.expect("an entry").path();
            let body = std::fs::read(&path).expect("sample exists");
            let request = request::<&RawValue>(&body).expect("an AdmissionReview");
            assert!(matches!(request.uid, Cow::Borrowed(_)), "{path:?}");
            assert_eq!(request.operation, Operation::Create);
            assert!(request.object.is_some_and(|o| o.get().starts_with('{')));
        }
    }

    #[test]
    fn a_minimal_request_reads_and_a_null_object_is_none() {
        let body = review(MINIMAL);
        let request = request::<&RawValue>(body.as_bytes()).expect("a minimal request");
        assert_eq!(request.uid, "u");
        assert_eq!(request.kind.kind, "K");
        assert!(request.object.is_none());
    }

    #[test]
    fn what_is_not_a_review_is_named() {
        let bad = |body: &str| match request::<&RawValue>(body.as_bytes()) {
            Ok(_) => panic!("{body} was read"),
            Err(BadReview(message)) => message,
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
        let raw = |text: &str| RawValue::from_string(text.to_owned()).expect("JSON");
        let wrong = raw(r#"{"spec":{"replicas":"2"}}"#);
        assert_eq!(
            object::<Thing>(&wrong).expect_err("a string"),
            r#"spec.replicas: invalid type: string "2", expected i32"#
        );
        assert_eq!(
            object::<Thing>(&raw("{}")).expect_err("no spec"),
            "request.object: missing field `spec`"
        );
        assert_eq!(
            object::<Thing>(&raw("[1]")).expect_err("an array"),
            "request.object: invalid type: array, expected a JSON object"
        );
        // Found by the `validation` fuzz target: serde's derived structs also read an array,
        // and one longer than the struct's fields is a syntax error to serde_json; it is named
        // by its field like any other, as is nesting deeper than serde_json reads.
        assert_eq!(
            object::<Thing>(&raw(r#"{"spec":[1,2]}"#)).expect_err("too long"),
            "spec: trailing characters"
        );
        #[derive(Debug, Deserialize)]
        struct Deep {
            #[allow(dead_code)]
            env: serde_json::Value,
        }
        let deep = format!(r#"{{"env":{}1{}}}"#, "[".repeat(200), "]".repeat(200));
        let error = object::<Deep>(&raw(&deep)).expect_err("too deep");
        assert!(error.starts_with("env"), "{error}");
        assert_eq!(
            member::<Spec>(&raw(r#"{"replicas":true}"#), "metadata").expect_err("a boolean"),
            "metadata.replicas: invalid type: boolean `true`, expected i32"
        );
    }
}
